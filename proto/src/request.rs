//! Request lines: `command arg1 … argN`, the last argument of `publish` and
//! `publish_batch` being a JSON body that may contain spaces.
//!
//! [`Request::parse`] borrows from the line, so parsing a publish copies nothing.
//! It checks arity, numbers and the name rule; the publish body is left to
//! [`crate::message`] because its failures are answered per message id.

use std::fmt;

use crate::name::{
    check_routing_pattern, is_valid_name, RoutingKeyError, MAX_NAME_LEN, MAX_QUEUE_NAME_LEN,
};

/// How an exchange matches routing keys against binding keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExchangeKind {
    /// The binding key equals the routing key.
    Direct,
    /// Every bound queue, whatever the key.
    Fanout,
    /// Dot-separated words; `*` matches one word and `#` zero or more.
    Topic,
}

impl ExchangeKind {
    /// The lowercase protocol spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
        }
    }

    /// Parses the protocol spelling.
    pub fn parse(s: &str) -> Option<ExchangeKind> {
        match s {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            _ => None,
        }
    }
}

impl fmt::Display for ExchangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One parsed request line, borrowing from the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `declare_queue <q>`
    DeclareQueue {
        /// Queue name.
        queue: &'a str,
    },
    /// `declare_exchange <e> [direct|fanout|topic]`
    DeclareExchange {
        /// Exchange name.
        exchange: &'a str,
        /// Type; `direct` when omitted.
        kind: ExchangeKind,
    },
    /// `bind <q> <e> <key>`
    Bind {
        /// Queue name.
        queue: &'a str,
        /// Exchange name.
        exchange: &'a str,
        /// Binding key (wildcards allowed; they only mean something on topic exchanges).
        routing_key: &'a str,
    },
    /// `unbind <q> <e> <key>`
    Unbind {
        /// Queue name.
        queue: &'a str,
        /// Exchange name.
        exchange: &'a str,
        /// Binding key, as it was bound.
        routing_key: &'a str,
    },
    /// `purge_queue <q>`: drops the ready messages; unacked deliveries
    /// stay owed.
    PurgeQueue {
        /// Queue name.
        queue: &'a str,
    },
    /// `delete_queue <q>`: the queue, its messages and its bindings.
    DeleteQueue {
        /// Queue name.
        queue: &'a str,
    },
    /// `delete_exchange <e>`: the exchange and its bindings.
    DeleteExchange {
        /// Exchange name.
        exchange: &'a str,
    },
    /// `close_connection <cn>`: an admin closes every connection of a CN.
    CloseConnection {
        /// Whose connections.
        client_id: &'a str,
    },
    /// `publish <e> <key> <json>`: names are not checked here, see [`crate::message`].
    Publish {
        /// Exchange name, unchecked.
        exchange: &'a str,
        /// Routing key, unchecked.
        routing_key: &'a str,
        /// The JSON body, unchecked (may be empty when the line had none).
        body: &'a str,
    },
    /// `publish_batch <e> <key> <json array>`: names are not checked here.
    PublishBatch {
        /// Exchange name, unchecked.
        exchange: &'a str,
        /// Routing key, unchecked.
        routing_key: &'a str,
        /// The JSON array, unchecked.
        body: &'a str,
    },
    /// `consume <q> [prefetch]`
    Consume {
        /// Queue name.
        queue: &'a str,
        /// Most unacked deliveries at once; the broker's default when omitted.
        prefetch: Option<u32>,
    },
    /// `fetch <q> [max]`
    Fetch {
        /// Queue name.
        queue: &'a str,
        /// Most deliveries returned; 1 when omitted.
        max: Option<u32>,
    },
    /// `ack <message_id> [<q>]`
    Ack {
        /// The delivered message's id.
        message_id: &'a str,
        /// Limit the ack to deliveries from this queue.
        queue: Option<&'a str>,
    },
    /// `ack_batch <q> <message_id> [<message_id> …]`: settles many
    /// deliveries from one queue in one line; ids with no outstanding
    /// delivery are skipped (counted out of the reply).
    AckBatch {
        /// The queue the deliveries came from.
        queue: &'a str,
        /// The ids, space-separated, each checked against the name rule
        /// (iterate them with [`Request::batch_ids`]).
        ids: &'a str,
    },
    /// `nack <message_id> [<q>]`
    Nack {
        /// The delivered message's id.
        message_id: &'a str,
        /// Limit the nack to deliveries from this queue.
        queue: Option<&'a str>,
    },
    /// `resend`
    Resend,
    /// `register_public_key <b64>`
    RegisterPublicKey {
        /// The key as sent: standard padded base64 of 32 bytes (checked by the caller).
        key_b64: &'a str,
    },
    /// `get_public_key <client_id>`
    GetPublicKey {
        /// Whose key.
        client_id: &'a str,
    },
    /// `heartbeat`
    Heartbeat,
    /// `quit`
    Quit,
    /// `nodes`: the live nodes of the cluster.
    Nodes,
    /// `locate <owner>`: the node an owner lives on (placing it if it has
    /// none yet).
    Locate {
        /// The owner (a client id).
        owner: &'a str,
    },
    /// `move <owner> <node_id>`: moves an owner to another node of the
    /// cluster, drain-first (admins only); answered when the move ended.
    Move {
        /// The owner (a client id).
        owner: &'a str,
        /// The node it goes to.
        node: &'a str,
    },
    /// `publish_for <owner> <e> <key> <json>`: a publish that stores only
    /// into `owner`'s queues, for bindings that reach owners on several
    /// nodes.
    PublishFor {
        /// The owner whose queues alone may take it (checked here).
        owner: &'a str,
        /// Exchange name, unchecked.
        exchange: &'a str,
        /// Routing key, unchecked.
        routing_key: &'a str,
        /// The JSON body, unchecked.
        body: &'a str,
    },
}

impl Request<'_> {
    /// The command word, for logs and metrics.
    pub fn command(&self) -> &'static str {
        match self {
            Request::DeclareQueue { .. } => "declare_queue",
            Request::DeclareExchange { .. } => "declare_exchange",
            Request::Bind { .. } => "bind",
            Request::Unbind { .. } => "unbind",
            Request::PurgeQueue { .. } => "purge_queue",
            Request::DeleteQueue { .. } => "delete_queue",
            Request::DeleteExchange { .. } => "delete_exchange",
            Request::CloseConnection { .. } => "close_connection",
            Request::Publish { .. } => "publish",
            Request::PublishBatch { .. } => "publish_batch",
            Request::Consume { .. } => "consume",
            Request::Fetch { .. } => "fetch",
            Request::Ack { .. } => "ack",
            Request::AckBatch { .. } => "ack_batch",
            Request::Nack { .. } => "nack",
            Request::Resend => "resend",
            Request::RegisterPublicKey { .. } => "register_public_key",
            Request::GetPublicKey { .. } => "get_public_key",
            Request::Heartbeat => "heartbeat",
            Request::Quit => "quit",
            Request::Nodes => "nodes",
            Request::Locate { .. } => "locate",
            Request::Move { .. } => "move",
            Request::PublishFor { .. } => "publish_for",
        }
    }
}

/// Why a line is not a request; its `Display` is the text after `Error: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The first word is no command of `ciphermq/1`.
    #[error("unknown command {0}")]
    UnknownCommand(String),
    /// Wrong number of arguments; holds the usage line.
    #[error("usage: {0}")]
    Usage(&'static str),
    /// An argument breaks the name rule.
    #[error("invalid {what} name")]
    InvalidName {
        /// Which argument: "queue", "exchange", "message id", "client id".
        what: &'static str,
    },
    /// `declare_queue` of a name too long for its dead-letter queue
    /// (`{queue}.dlq`) to be a valid name.
    #[error("invalid queue name: at most {MAX_QUEUE_NAME_LEN} bytes, so that its dead-letter queue <queue>.dlq fits the {MAX_NAME_LEN}-byte name rule")]
    QueueNameTooLong,
    /// A binding key breaks the name rule or the word and `#` caps of
    /// [`crate::name`]; invalid characters read `invalid routing key name`.
    #[error("{0}")]
    RoutingKey(RoutingKeyError),
    /// A number argument is not a positive integer.
    #[error("invalid {what}: expected a positive integer")]
    InvalidNumber {
        /// Which argument.
        what: &'static str,
    },
    /// `declare_exchange` with a type other than direct, fanout or topic.
    #[error("unknown exchange type {0} (expected direct, fanout or topic)")]
    UnknownExchangeKind(String),
    /// A publish whose body cannot be read (no JSON at all).
    #[error("invalid message")]
    InvalidMessage,
}

const USAGE_DECLARE_QUEUE: &str = "declare_queue <queue>";
const USAGE_DECLARE_EXCHANGE: &str = "declare_exchange <exchange> [direct|fanout|topic]";
const USAGE_BIND: &str = "bind <queue> <exchange> <routing_key>";
const USAGE_UNBIND: &str = "unbind <queue> <exchange> <routing_key>";
const USAGE_PURGE_QUEUE: &str = "purge_queue <queue>";
const USAGE_DELETE_QUEUE: &str = "delete_queue <queue>";
const USAGE_DELETE_EXCHANGE: &str = "delete_exchange <exchange>";
const USAGE_CLOSE_CONNECTION: &str = "close_connection <client_id>";
const USAGE_CONSUME: &str = "consume <queue> [prefetch]";
const USAGE_FETCH: &str = "fetch <queue> [max]";
const USAGE_ACK: &str = "ack <message_id> [queue]";
const USAGE_NACK: &str = "nack <message_id> [queue]";
const USAGE_ACK_BATCH: &str = "ack_batch <queue> <message_id> [message_id ...]";
const USAGE_RESEND: &str = "resend";
const USAGE_REGISTER: &str = "register_public_key <base64>";
const USAGE_GET_KEY: &str = "get_public_key <client_id>";
const USAGE_HEARTBEAT: &str = "heartbeat";
const USAGE_QUIT: &str = "quit";
const USAGE_NODES: &str = "nodes";
const USAGE_LOCATE: &str = "locate <owner>";
const USAGE_MOVE: &str = "move <owner> <node_id>";
const USAGE_PUBLISH_FOR: &str = "publish_for <owner> <exchange> <routing_key> <json>";

/// Splits off the next argument at a single space (several spaces count as one).
fn next_arg(rest: &str) -> (&str, &str) {
    let rest = rest.trim_start_matches(' ');
    match rest.find(' ') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    }
}

/// Splits the remainder into at most `N` arguments; `Err` when more follow.
fn args<'a, const N: usize>(
    mut rest: &'a str,
    usage: &'static str,
) -> Result<[&'a str; N], ParseError> {
    let mut out = [""; N];
    for slot in out.iter_mut() {
        let (arg, tail) = next_arg(rest);
        *slot = arg;
        rest = tail;
    }
    if rest.trim_matches(' ').is_empty() {
        Ok(out)
    } else {
        Err(ParseError::Usage(usage))
    }
}

fn name<'a>(s: &'a str, what: &'static str, usage: &'static str) -> Result<&'a str, ParseError> {
    if s.is_empty() {
        Err(ParseError::Usage(usage))
    } else if is_valid_name(s) {
        Ok(s)
    } else {
        Err(ParseError::InvalidName { what })
    }
}

fn optional_name<'a>(s: &'a str, what: &'static str) -> Result<Option<&'a str>, ParseError> {
    if s.is_empty() {
        Ok(None)
    } else if is_valid_name(s) {
        Ok(Some(s))
    } else {
        Err(ParseError::InvalidName { what })
    }
}

fn optional_count(s: &str, what: &'static str) -> Result<Option<u32>, ParseError> {
    if s.is_empty() {
        return Ok(None);
    }
    match s.parse::<u32>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(ParseError::InvalidNumber { what }),
    }
}

fn no_args(rest: &str, usage: &'static str) -> Result<(), ParseError> {
    if rest.trim_matches(' ').is_empty() {
        Ok(())
    } else {
        Err(ParseError::Usage(usage))
    }
}

/// Splits `<e> <key> <body>` of a publish; the body keeps its spaces.
fn publish_parts(rest: &str) -> Result<(&str, &str, &str), ParseError> {
    let (exchange, rest) = next_arg(rest);
    let (routing_key, body) = next_arg(rest);
    let body = body.trim_matches(' ');
    if body.is_empty() {
        return Err(ParseError::InvalidMessage);
    }
    Ok((exchange, routing_key, body))
}

impl<'a> Request<'a> {
    /// The ids of an [`Request::AckBatch`], in order.
    pub fn batch_ids(ids: &'a str) -> impl Iterator<Item = &'a str> {
        ids.split(' ').filter(|id| !id.is_empty())
    }

    /// Parses one line (without its `\n`; a trailing `\r` is ignored).
    pub fn parse(line: &'a str) -> Result<Request<'a>, ParseError> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let (command, rest) = next_arg(line);
        Ok(match command {
            "publish" => {
                let (exchange, routing_key, body) = publish_parts(rest)?;
                Request::Publish {
                    exchange,
                    routing_key,
                    body,
                }
            }
            "publish_batch" => {
                let (exchange, routing_key, body) = publish_parts(rest)?;
                Request::PublishBatch {
                    exchange,
                    routing_key,
                    body,
                }
            }
            "ack" | "nack" => {
                let usage = if command == "ack" {
                    USAGE_ACK
                } else {
                    USAGE_NACK
                };
                let [id, queue] = args::<2>(rest, usage)?;
                let message_id = name(id, "message id", usage)?;
                let queue = optional_name(queue, "queue")?;
                if command == "ack" {
                    Request::Ack { message_id, queue }
                } else {
                    Request::Nack { message_id, queue }
                }
            }
            "ack_batch" => {
                let (queue, ids) = next_arg(rest);
                let queue = name(queue, "queue", USAGE_ACK_BATCH)?;
                let ids = ids.trim_matches(' ');
                if ids.is_empty() {
                    return Err(ParseError::Usage(USAGE_ACK_BATCH));
                }
                for id in Request::batch_ids(ids) {
                    name(id, "message id", USAGE_ACK_BATCH)?;
                }
                Request::AckBatch { queue, ids }
            }
            "heartbeat" => {
                no_args(rest, USAGE_HEARTBEAT)?;
                Request::Heartbeat
            }
            "publish_for" => {
                let (owner, rest) = next_arg(rest);
                let owner = name(owner, "client id", USAGE_PUBLISH_FOR)?;
                let (exchange, routing_key, body) = publish_parts(rest)?;
                Request::PublishFor {
                    owner,
                    exchange,
                    routing_key,
                    body,
                }
            }
            "nodes" => {
                no_args(rest, USAGE_NODES)?;
                Request::Nodes
            }
            "locate" => {
                let [owner] = args::<1>(rest, USAGE_LOCATE)?;
                Request::Locate {
                    owner: name(owner, "client id", USAGE_LOCATE)?,
                }
            }
            "move" => {
                let [owner, node] = args::<2>(rest, USAGE_MOVE)?;
                Request::Move {
                    owner: name(owner, "client id", USAGE_MOVE)?,
                    node: name(node, "node id", USAGE_MOVE)?,
                }
            }
            "consume" => {
                let [queue, prefetch] = args::<2>(rest, USAGE_CONSUME)?;
                Request::Consume {
                    queue: name(queue, "queue", USAGE_CONSUME)?,
                    prefetch: optional_count(prefetch, "prefetch")?,
                }
            }
            "fetch" => {
                let [queue, max] = args::<2>(rest, USAGE_FETCH)?;
                Request::Fetch {
                    queue: name(queue, "queue", USAGE_FETCH)?,
                    max: optional_count(max, "max")?,
                }
            }
            "declare_queue" => {
                let [queue] = args::<1>(rest, USAGE_DECLARE_QUEUE)?;
                let queue = name(queue, "queue", USAGE_DECLARE_QUEUE)?;
                if queue.len() > MAX_QUEUE_NAME_LEN {
                    return Err(ParseError::QueueNameTooLong);
                }
                Request::DeclareQueue { queue }
            }
            "declare_exchange" => {
                let [exchange, kind] = args::<2>(rest, USAGE_DECLARE_EXCHANGE)?;
                let exchange = name(exchange, "exchange", USAGE_DECLARE_EXCHANGE)?;
                let kind = if kind.is_empty() {
                    ExchangeKind::Direct
                } else {
                    ExchangeKind::parse(kind)
                        .ok_or_else(|| ParseError::UnknownExchangeKind(kind.to_owned()))?
                };
                Request::DeclareExchange { exchange, kind }
            }
            "bind" => {
                let [queue, exchange, key] = args::<3>(rest, USAGE_BIND)?;
                let queue = name(queue, "queue", USAGE_BIND)?;
                let exchange = name(exchange, "exchange", USAGE_BIND)?;
                if key.is_empty() {
                    return Err(ParseError::Usage(USAGE_BIND));
                }
                check_routing_pattern(key).map_err(ParseError::RoutingKey)?;
                Request::Bind {
                    queue,
                    exchange,
                    routing_key: key,
                }
            }
            "unbind" => {
                let [queue, exchange, key] = args::<3>(rest, USAGE_UNBIND)?;
                let queue = name(queue, "queue", USAGE_UNBIND)?;
                let exchange = name(exchange, "exchange", USAGE_UNBIND)?;
                if key.is_empty() {
                    return Err(ParseError::Usage(USAGE_UNBIND));
                }
                check_routing_pattern(key).map_err(ParseError::RoutingKey)?;
                Request::Unbind {
                    queue,
                    exchange,
                    routing_key: key,
                }
            }
            "purge_queue" => {
                let [queue] = args::<1>(rest, USAGE_PURGE_QUEUE)?;
                Request::PurgeQueue {
                    queue: name(queue, "queue", USAGE_PURGE_QUEUE)?,
                }
            }
            "delete_queue" => {
                let [queue] = args::<1>(rest, USAGE_DELETE_QUEUE)?;
                Request::DeleteQueue {
                    queue: name(queue, "queue", USAGE_DELETE_QUEUE)?,
                }
            }
            "delete_exchange" => {
                let [exchange] = args::<1>(rest, USAGE_DELETE_EXCHANGE)?;
                Request::DeleteExchange {
                    exchange: name(exchange, "exchange", USAGE_DELETE_EXCHANGE)?,
                }
            }
            "close_connection" => {
                let [client] = args::<1>(rest, USAGE_CLOSE_CONNECTION)?;
                Request::CloseConnection {
                    client_id: name(client, "client id", USAGE_CLOSE_CONNECTION)?,
                }
            }
            "resend" => {
                no_args(rest, USAGE_RESEND)?;
                Request::Resend
            }
            "register_public_key" => {
                let [key] = args::<1>(rest, USAGE_REGISTER)?;
                if key.is_empty() {
                    return Err(ParseError::Usage(USAGE_REGISTER));
                }
                Request::RegisterPublicKey { key_b64: key }
            }
            "get_public_key" => {
                let [client] = args::<1>(rest, USAGE_GET_KEY)?;
                Request::GetPublicKey {
                    client_id: name(client, "client id", USAGE_GET_KEY)?,
                }
            }
            "quit" => {
                no_args(rest, USAGE_QUIT)?;
                Request::Quit
            }
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(ParseError::UnknownCommand(shown));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        assert_eq!(
            Request::parse("declare_queue q1"),
            Ok(Request::DeclareQueue { queue: "q1" })
        );
        assert_eq!(
            Request::parse("declare_exchange ex"),
            Ok(Request::DeclareExchange {
                exchange: "ex",
                kind: ExchangeKind::Direct
            })
        );
        assert_eq!(
            Request::parse("declare_exchange ex topic"),
            Ok(Request::DeclareExchange {
                exchange: "ex",
                kind: ExchangeKind::Topic
            })
        );
        assert_eq!(
            Request::parse("bind q ex a.*.#"),
            Ok(Request::Bind {
                queue: "q",
                exchange: "ex",
                routing_key: "a.*.#"
            })
        );
        assert_eq!(
            Request::parse("unbind q ex a.*.#"),
            Ok(Request::Unbind {
                queue: "q",
                exchange: "ex",
                routing_key: "a.*.#"
            })
        );
        assert_eq!(
            Request::parse("purge_queue q"),
            Ok(Request::PurgeQueue { queue: "q" })
        );
        assert_eq!(
            Request::parse("delete_queue q"),
            Ok(Request::DeleteQueue { queue: "q" })
        );
        assert_eq!(
            Request::parse("delete_exchange ex"),
            Ok(Request::DeleteExchange { exchange: "ex" })
        );
        assert_eq!(
            Request::parse("close_connection sender_1"),
            Ok(Request::CloseConnection {
                client_id: "sender_1"
            })
        );
        for bad in [
            "unbind q ex",
            "purge_queue",
            "delete_queue a b",
            "delete_exchange",
            "close_connection",
        ] {
            assert!(
                matches!(Request::parse(bad), Err(ParseError::Usage(_))),
                "{bad}"
            );
        }
        assert_eq!(
            Request::parse("publish ex k {\"a\": 1, \"b\": \"x y\"}"),
            Ok(Request::Publish {
                exchange: "ex",
                routing_key: "k",
                body: "{\"a\": 1, \"b\": \"x y\"}"
            })
        );
        assert_eq!(
            Request::parse("publish_batch ex k [1, 2]"),
            Ok(Request::PublishBatch {
                exchange: "ex",
                routing_key: "k",
                body: "[1, 2]"
            })
        );
        assert_eq!(
            Request::parse("consume q"),
            Ok(Request::Consume {
                queue: "q",
                prefetch: None
            })
        );
        assert_eq!(
            Request::parse("consume q 5"),
            Ok(Request::Consume {
                queue: "q",
                prefetch: Some(5)
            })
        );
        assert_eq!(
            Request::parse("fetch q 3"),
            Ok(Request::Fetch {
                queue: "q",
                max: Some(3)
            })
        );
        assert_eq!(
            Request::parse("ack m1"),
            Ok(Request::Ack {
                message_id: "m1",
                queue: None
            })
        );
        assert_eq!(
            Request::parse("ack m1 q"),
            Ok(Request::Ack {
                message_id: "m1",
                queue: Some("q")
            })
        );
        let Ok(Request::AckBatch { queue, ids }) = Request::parse("ack_batch q m1  m2 m3 ") else {
            panic!("ack_batch parses");
        };
        assert_eq!(queue, "q");
        assert_eq!(
            Request::batch_ids(ids).collect::<Vec<_>>(),
            ["m1", "m2", "m3"]
        );
        assert_eq!(
            Request::parse("ack_batch q"),
            Err(ParseError::Usage(USAGE_ACK_BATCH))
        );
        assert_eq!(
            Request::parse("ack_batch"),
            Err(ParseError::Usage(USAGE_ACK_BATCH))
        );
        assert_eq!(
            Request::parse("ack_batch q m1 b@d"),
            Err(ParseError::InvalidName { what: "message id" })
        );
        assert_eq!(
            Request::parse("nack m1 q"),
            Ok(Request::Nack {
                message_id: "m1",
                queue: Some("q")
            })
        );
        assert_eq!(Request::parse("resend"), Ok(Request::Resend));
        assert_eq!(
            Request::parse("register_public_key AAAA="),
            Ok(Request::RegisterPublicKey { key_b64: "AAAA=" })
        );
        assert_eq!(
            Request::parse("get_public_key receiver_1"),
            Ok(Request::GetPublicKey {
                client_id: "receiver_1"
            })
        );
        assert_eq!(Request::parse("heartbeat"), Ok(Request::Heartbeat));
        assert_eq!(Request::parse("quit\r"), Ok(Request::Quit));
        assert_eq!(Request::parse("nodes"), Ok(Request::Nodes));
        assert_eq!(
            Request::parse("locate receiver_1"),
            Ok(Request::Locate {
                owner: "receiver_1"
            })
        );
        assert_eq!(
            Request::parse("move receiver_1 node-2"),
            Ok(Request::Move {
                owner: "receiver_1",
                node: "node-2"
            })
        );
        assert_eq!(
            Request::parse(r#"publish_for receiver_1 ex receiver_1 {"a": 1}"#),
            Ok(Request::PublishFor {
                owner: "receiver_1",
                exchange: "ex",
                routing_key: "receiver_1",
                body: r#"{"a": 1}"#,
            })
        );
        assert_eq!(Request::parse("nodes x"), Err(ParseError::Usage("nodes")));
        assert_eq!(
            Request::parse("locate"),
            Err(ParseError::Usage("locate <owner>"))
        );
        assert_eq!(
            Request::parse("locate a b"),
            Err(ParseError::Usage("locate <owner>"))
        );
        assert_eq!(
            Request::parse("publish_for bad/name ex k {}"),
            Err(ParseError::InvalidName { what: "client id" })
        );
        assert_eq!(
            Request::parse("publish_for r ex k"),
            Err(ParseError::InvalidMessage)
        );
    }

    #[test]
    fn rejects_bad_arity_names_and_numbers() {
        assert_eq!(
            Request::parse("declare_queue"),
            Err(ParseError::Usage(USAGE_DECLARE_QUEUE))
        );
        assert_eq!(
            Request::parse("declare_queue a b"),
            Err(ParseError::Usage(USAGE_DECLARE_QUEUE))
        );
        assert_eq!(
            Request::parse("declare_queue a/b"),
            Err(ParseError::InvalidName { what: "queue" })
        );
        assert_eq!(
            Request::parse("consume q 0"),
            Err(ParseError::InvalidNumber { what: "prefetch" })
        );
        assert_eq!(
            Request::parse("fetch q -1"),
            Err(ParseError::InvalidNumber { what: "max" })
        );
        assert_eq!(
            Request::parse("declare_exchange e weird"),
            Err(ParseError::UnknownExchangeKind("weird".into()))
        );
        assert_eq!(
            Request::parse("publish ex k"),
            Err(ParseError::InvalidMessage)
        );
        assert_eq!(
            Request::parse("frobnicate"),
            Err(ParseError::UnknownCommand("frobnicate".into()))
        );
        assert_eq!(
            Request::parse("heartbeat now"),
            Err(ParseError::Usage(USAGE_HEARTBEAT))
        );
    }

    #[test]
    fn bind_refuses_keys_over_the_routing_caps() {
        let err = |line: &str| Request::parse(line).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(
            err("bind q ex a/b"),
            Err("invalid routing key name".to_owned())
        );
        let words = format!("bind q ex r{}", ".w".repeat(32));
        assert_eq!(
            err(&words),
            Err("routing key has more than 32 words".to_owned())
        );
        let hashes = format!("bind q ex r{}", ".#.w".repeat(9));
        assert_eq!(
            err(&hashes),
            Err(
                "routing key has more than 8 # wildcards (# separated only by * count once)"
                    .to_owned()
            )
        );
        // A run of `#` is one wildcard: the old topic bomb binds (as `r.#`).
        let run = format!("bind q ex r{}", ".#".repeat(14));
        assert!(matches!(Request::parse(&run), Ok(Request::Bind { .. })));
    }

    #[test]
    fn error_texts_are_actionable() {
        assert_eq!(
            ParseError::UnknownCommand("x".into()).to_string(),
            "unknown command x"
        );
        assert_eq!(
            ParseError::Usage(USAGE_BIND).to_string(),
            "usage: bind <queue> <exchange> <routing_key>"
        );
    }
}
