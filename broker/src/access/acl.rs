//! Roles and the permission matrix (docs/ARCHITECTURE.md, "Identity and access").
//!
//! A pure function of the configured CN lists: [`Acl::check`] never looks at
//! whether a queue exists, so a queue you may not touch is `Access denied`
//! whether or not it exists. The [`Acl`] is immutable; a `SIGHUP` reload builds a
//! new one from the new `[acl]` lists and swaps it in whole.
//!
//! What depends on the topology (who owns an exchange, and so who may bind a
//! queue to a fanout exchange or delete one) is decided where the change is
//! applied, by the topology store, together with [`Acl::judge_binding`],
//! which the broker installs there as its binding rule: it judges each bind
//! as it is applied and, after a reload, every binding already made.
//!
//! No receiver may get copies of messages routed for another: it binds only
//! its own queues, only with keys it owns, and a topic pattern only if every
//! key the pattern can match is its own by the longest-CN rule (with
//! receivers `r` and `r.eu`, `r` may bind `r.x.#` but not `r.#` or `r.*`).

use std::fmt;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::topology::{Actor, Binding, FANOUT_NOT_OWNED};
use fnv::FnvHashSet;

/// What a client may do, decided by its certificate CN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// Publishes messages and fetches receivers' public keys.
    Sender,
    /// Owns queues: declares, binds and consumes them, registers its public key.
    Receiver,
    /// May do everything, including the admin endpoint.
    Admin,
    /// Reads the admin endpoint's metrics and status, and nothing else: a
    /// scraper's certificate that cannot change the broker if it leaks. On
    /// the broker port it may only send `heartbeat` (and `quit`).
    Monitor,
    /// In no list: refused before the command loop; every command is denied.
    Unknown,
}

impl Role {
    /// The lowercase wire spelling used in `HELLO` and `Access denied` lines.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Sender => "sender",
            Role::Receiver => "receiver",
            Role::Admin => "admin",
            Role::Monitor => "monitor",
            Role::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A command as the ACL sees it: its kind plus the names that ownership rules
/// apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    /// `declare_queue <queue>`.
    DeclareQueue {
        /// The queue to declare.
        queue: &'a str,
    },
    /// `declare_exchange <e> [type]`.
    DeclareExchange {
        /// The exchange to declare.
        exchange: &'a str,
    },
    /// `delete_exchange <e>`; whether a receiver owns the exchange is the
    /// topology's to decide, where the deletion is applied.
    DeleteExchange {
        /// The exchange to delete.
        exchange: &'a str,
    },
    /// `bind <queue> <exchange> <routing_key>`.
    Bind {
        /// The queue to bind.
        queue: &'a str,
        /// The binding key (may hold `*`/`#` wildcards).
        routing_key: &'a str,
    },
    /// `unbind <queue> <exchange> <routing_key>`: as `bind`, own queue and
    /// own key for a receiver.
    Unbind {
        /// The bound queue.
        queue: &'a str,
        /// The binding key, as bound.
        routing_key: &'a str,
    },
    /// `purge_queue <queue>`.
    PurgeQueue {
        /// The queue to empty of ready messages.
        queue: &'a str,
    },
    /// `delete_queue <queue>`.
    DeleteQueue {
        /// The queue to delete.
        queue: &'a str,
    },
    /// `close_connection <cn>`: admins only.
    CloseConnection,
    /// `move <owner> <node>` (a cluster's owners): admins only.
    MoveOwner,
    /// `publish` and `publish_batch`.
    Publish,
    /// `consume <queue> [prefetch]`.
    Consume {
        /// The queue to consume from.
        queue: &'a str,
    },
    /// `fetch <queue> [max]`.
    Fetch {
        /// The queue to fetch from.
        queue: &'a str,
    },
    /// `nack <message_id> [queue]`.
    Nack {
        /// The queue named in the command, if any.
        queue: Option<&'a str>,
    },
    /// `ack <message_id> [queue]` (only ever touches the caller's own deliveries).
    Ack,
    /// `resend`.
    Resend,
    /// `quit`.
    Quit,
    /// `register_public_key <b64>` (always for the caller's own CN).
    RegisterPublicKey,
    /// `get_public_key <client_id>`.
    GetPublicKey,
    /// `heartbeat`.
    Heartbeat,
}

impl Op<'_> {
    /// The wire command name, for logs and metrics labels.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::DeclareQueue { .. } => "declare_queue",
            Op::DeclareExchange { .. } => "declare_exchange",
            Op::DeleteExchange { .. } => "delete_exchange",
            Op::Bind { .. } => "bind",
            Op::Unbind { .. } => "unbind",
            Op::PurgeQueue { .. } => "purge_queue",
            Op::DeleteQueue { .. } => "delete_queue",
            Op::CloseConnection => "close_connection",
            Op::MoveOwner => "move",
            Op::Publish => "publish",
            Op::Consume { .. } => "consume",
            Op::Fetch { .. } => "fetch",
            Op::Nack { .. } => "nack",
            Op::Ack => "ack",
            Op::Resend => "resend",
            Op::Quit => "quit",
            Op::RegisterPublicKey => "register_public_key",
            Op::GetPublicKey => "get_public_key",
            Op::Heartbeat => "heartbeat",
        }
    }
}

/// Why a command was refused; the connection answers
/// `Access denied: <reason> (role=<role>)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub(crate) struct Denied {
    /// Short human reason, e.g. "receivers may only use their own queues".
    pub reason: String,
}

impl Denied {
    fn new(reason: &str) -> Result<(), Denied> {
        Err(Denied {
            reason: reason.to_owned(),
        })
    }
}

/// The role lists and ownership rules, built once per (re)load of `[acl]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Acl {
    /// CNs with the admin role (checked first).
    admins: FnvHashSet<String>,
    /// CNs with the sender role (checked second).
    senders: FnvHashSet<String>,
    /// CNs with the receiver role (checked third).
    receivers: FnvHashSet<String>,
    /// CNs with the monitor role (checked last: a CN listed elsewhere too
    /// keeps that role).
    monitors: FnvHashSet<String>,
    /// The receiver CNs, deduplicated and sorted longest first, so the first
    /// prefix match in a scan is the longest one (the owner).
    receivers_longest_first: Vec<String>,
}

impl Acl {
    /// Builds the ACL from the `[acl]` lists (taken as slices so this module does
    /// not depend on the config types).
    pub(crate) fn new(admin: &[String], sender: &[String], receiver: &[String]) -> Acl {
        let set = |cns: &[String]| cns.iter().cloned().collect::<FnvHashSet<String>>();
        let receivers = set(receiver);
        let mut receivers_longest_first: Vec<String> = receivers.iter().cloned().collect();
        // Longest first; ties broken by name so the order is deterministic.
        receivers_longest_first.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        Acl {
            admins: set(admin),
            senders: set(sender),
            receivers,
            monitors: FnvHashSet::default(),
            receivers_longest_first,
        }
    }

    /// The same ACL with `monitor` as its monitor CNs (`acl.monitor_cns`).
    pub(crate) fn with_monitors(mut self, monitor: &[String]) -> Acl {
        self.monitors = monitor.iter().cloned().collect();
        self
    }

    /// The role of a certificate CN: admin if listed there, else sender, else
    /// receiver, else monitor, else unknown.
    pub(crate) fn role_of(&self, cn: &str) -> Role {
        if self.admins.contains(cn) {
            Role::Admin
        } else if self.senders.contains(cn) {
            Role::Sender
        } else if self.receivers.contains(cn) {
            Role::Receiver
        } else if self.monitors.contains(cn) {
            Role::Monitor
        } else {
            Role::Unknown
        }
    }

    /// The receiver CN that owns a queue name: the name is `{cn}_queue` or starts
    /// with `{cn}_` (so `{queue}.dlq` follows its queue). When several receiver
    /// CNs match, the longest one owns it.
    pub(crate) fn queue_owner(&self, queue: &str) -> Option<&str> {
        self.longest_receiver_matching(|cn| {
            // `{cn}_queue` is a special case of the `{cn}_` prefix.
            queue
                .strip_prefix(cn)
                .is_some_and(|rest| rest.starts_with('_'))
        })
    }

    /// The receiver CN that owns a routing (binding) key: the key equals `{cn}` or
    /// starts with `{cn}.` or `{cn}_`. When several match, the longest owns it.
    pub(crate) fn routing_key_owner(&self, key: &str) -> Option<&str> {
        self.longest_receiver_matching(|cn| {
            key.strip_prefix(cn)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '_']))
        })
    }

    /// Whether `cn` may bind `key`: a plain key must be one `cn` owns
    /// ([`Acl::routing_key_owner`]); a topic pattern (a word that is `*` or
    /// `#`) must match only keys `cn` owns. The pattern rule is applied
    /// whatever the exchange's type, since the ACL is checked before the
    /// exchange is looked at (on a direct exchange `*` and `#` match only
    /// themselves, which publishes cannot use).
    ///
    /// The cost is bounded: words of the pattern times words of each longer
    /// receiver CN that starts with `cn`, both at most 128.
    pub(crate) fn binding_key_owned(&self, cn: &str, key: &str) -> bool {
        let words: Vec<&str> = key.split('.').collect();
        let Some(first_wildcard) = words.iter().position(|w| is_wildcard(w)) else {
            return self.routing_key_owner(key) == Some(cn);
        };
        if first_wildcard == 0 {
            return false;
        }
        // Every key the pattern matches starts with its literal words.
        let literal_len = words[..first_wildcard]
            .iter()
            .map(|w| w.len() + 1)
            .sum::<usize>()
            - 1;
        if !is_owned_form(cn, &key[..literal_len]) {
            return false;
        }
        // Such a key is `cn`'s unless a longer receiver CN claims it, and
        // only one that starts with `cn` and a separator can.
        self.receivers_longest_first
            .iter()
            .filter(|longer| longer.len() > cn.len() && is_owned_form(cn, longer))
            .all(|longer| !may_match_owned_by(&words, longer))
    }

    fn longest_receiver_matching(&self, mut matches: impl FnMut(&str) -> bool) -> Option<&str> {
        self.receivers_longest_first
            .iter()
            .map(String::as_str)
            .find(|cn| matches(cn))
    }

    /// Decides whether `cn`, holding `role`, may perform `op`. Pure: it never
    /// asks whether a queue exists.
    pub(crate) fn check(&self, role: Role, cn: &str, op: Op<'_>) -> Result<(), Denied> {
        match role {
            Role::Unknown => Denied::new("unknown client"),
            Role::Admin => Ok(()),
            Role::Sender => check_sender(op),
            Role::Receiver => self.check_receiver(cn, op),
            Role::Monitor => match op {
                Op::Heartbeat | Op::Quit => Ok(()),
                _ => Denied::new("monitors may only send heartbeats"),
            },
        }
    }

    fn check_receiver(&self, cn: &str, op: Op<'_>) -> Result<(), Denied> {
        match op {
            Op::DeclareQueue { queue }
            | Op::Consume { queue }
            | Op::Fetch { queue }
            | Op::Nack { queue: Some(queue) }
            | Op::PurgeQueue { queue }
            | Op::DeleteQueue { queue } => self.own_queue(cn, queue),
            Op::Bind { queue, routing_key } | Op::Unbind { queue, routing_key } => {
                self.own_queue(cn, queue)?;
                self.own_binding_key(cn, routing_key)
            }
            Op::DeclareExchange { exchange } => match self.routing_key_owner(exchange) {
                Some(owner) if owner != cn => {
                    Denied::new("receivers may not declare exchanges named for another receiver")
                }
                _ => Ok(()),
            },
            Op::Publish => Denied::new("receivers may not publish"),
            Op::CloseConnection => Denied::new("only admins may close connections"),
            Op::MoveOwner => Denied::new("only admins may move owners"),
            Op::GetPublicKey => Denied::new("receivers may not get public keys"),
            Op::DeleteExchange { .. }
            | Op::Nack { queue: None }
            | Op::Ack
            | Op::Resend
            | Op::Quit
            | Op::RegisterPublicKey
            | Op::Heartbeat => Ok(()),
        }
    }

    fn own_queue(&self, cn: &str, queue: &str) -> Result<(), Denied> {
        if self.queue_owner(queue) == Some(cn) {
            Ok(())
        } else {
            Denied::new("receivers may only use their own queues")
        }
    }

    fn own_binding_key(&self, cn: &str, key: &str) -> Result<(), Denied> {
        if self.binding_key_owned(cn, key) {
            Ok(())
        } else if key.split('.').any(is_wildcard) {
            Denied::new("receivers may only bind patterns that match only routing keys they own")
        } else {
            Denied::new("receivers may only bind routing keys they own")
        }
    }

    /// Whether `binding` may exist under this ACL: the broker's binding rule,
    /// asked when a bind is applied and, after a reload, about every binding.
    ///
    /// An admin's binding always may. A receiver's may while that CN still
    /// holds the receiver role (or has become an admin) and could make it
    /// now: its own queue, a key it owns, and a fanout exchange only if it
    /// owns that. A binding whose maker was not recorded (saved by an earlier
    /// build) is judged as made by the receiver owning its queue's name,
    /// the only receiver that could have made it; when no receiver owns the
    /// queue, only admins read it, and it may.
    pub(crate) fn judge_binding(&self, b: &Binding<'_>) -> Result<(), Denied> {
        let binder: &str = match b.bound_by {
            Some(Actor::Admin) => return Ok(()),
            Some(Actor::Receiver(cn)) => match self.role_of(cn) {
                Role::Admin => return Ok(()),
                Role::Receiver => cn,
                Role::Sender | Role::Monitor | Role::Unknown => {
                    return Err(Denied {
                        reason: format!("{cn}, who made it, is no longer a receiver"),
                    })
                }
            },
            None => match self.queue_owner(&b.queue.name) {
                Some(owner) => owner,
                None => return Ok(()),
            },
        };
        self.own_queue(binder, &b.queue.name)?;
        self.own_binding_key(binder, b.key)?;
        if b.kind == ExchangeKind::Fanout && b.exchange_owner != Some(binder) {
            return Denied::new(FANOUT_NOT_OWNED);
        }
        Ok(())
    }
}

/// A topic wildcard word.
fn is_wildcard(word: &str) -> bool {
    word == "*" || word == "#"
}

/// Whether `name` is `cn`'s by the prefix rule of routing keys: `cn` itself,
/// or `cn` followed by `.` or `_`.
fn is_owned_form(cn: &str, name: &str) -> bool {
    name.strip_prefix(cn)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '_']))
}

/// Whether the topic pattern `pattern` (its words) matches some key that
/// `owner`'s prefix rule claims: `owner` itself, `owner.…` or `owner_…`.
fn may_match_owned_by(pattern: &[&str], owner: &str) -> bool {
    let prefix: Vec<&str> = owner.split('.').collect();
    // `owner` or `owner.…`: the key's words start with owner's words.
    // `owner_…`: they start with owner's words but the last, which the key's
    // word only has to begin with (followed by `_`).
    matches_some_key_starting(pattern, &prefix, None)
        || matches_some_key_starting(
            pattern,
            &prefix,
            Some(&format!("{}_", prefix[prefix.len() - 1])),
        )
}

/// Whether `pattern` matches some key whose words begin with `prefix`
/// (any words may follow). With `last_starts_with`, the key's word in the
/// place of `prefix`'s last word need only begin with that text.
///
/// Dynamic programming over (pattern word, prefix word): `reach[i][j]` says
/// whether `pattern[i..]` can match a key whose words begin with
/// `prefix[j..]`; linear in the product of the two lengths, whatever the
/// number of `#`.
fn matches_some_key_starting(
    pattern: &[&str],
    prefix: &[&str],
    last_starts_with: Option<&str>,
) -> bool {
    let (n, m) = (pattern.len(), prefix.len());
    let fits = |word: &str, j: usize| match last_starts_with {
        Some(start) if j + 1 == m => word.starts_with(start),
        _ => word == prefix[j],
    };
    // Row i + 1 while row i is computed.
    let mut next = vec![false; m + 1];
    let mut row = vec![false; m + 1];
    // Past the pattern's end, only an exhausted prefix is matched.
    next[m] = true;
    for i in (0..n).rev() {
        row[m] = true;
        for j in (0..m).rev() {
            row[j] = match pattern[i] {
                // Matches no word (the rest of the pattern goes on at j) or
                // the prefix word j, staying available for more.
                "#" => next[j] || row[j + 1],
                "*" => next[j + 1],
                word => fits(word, j) && next[j + 1],
            };
        }
        std::mem::swap(&mut row, &mut next);
    }
    next[0]
}

fn check_sender(op: Op<'_>) -> Result<(), Denied> {
    match op {
        Op::DeclareQueue { .. } => Denied::new("senders may not declare queues"),
        Op::DeclareExchange { .. } => Denied::new("senders may not declare exchanges"),
        Op::DeleteExchange { .. } => Denied::new("senders may not delete exchanges"),
        Op::Bind { .. } => Denied::new("senders may not bind queues"),
        Op::Unbind { .. } => Denied::new("senders may not unbind queues"),
        Op::PurgeQueue { .. } => Denied::new("senders may not purge queues"),
        Op::DeleteQueue { .. } => Denied::new("senders may not delete queues"),
        Op::CloseConnection => Denied::new("only admins may close connections"),
        Op::MoveOwner => Denied::new("only admins may move owners"),
        Op::Consume { .. } => Denied::new("senders may not consume"),
        Op::Fetch { .. } => Denied::new("senders may not fetch"),
        Op::Nack { .. } => Denied::new("senders may not nack"),
        Op::RegisterPublicKey => Denied::new("senders may not register public keys"),
        Op::Publish | Op::GetPublicKey | Op::Ack | Op::Resend | Op::Quit | Op::Heartbeat => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn acl() -> Acl {
        Acl::new(
            &strings(&["admin"]),
            &strings(&["sender_1", "sender_2"]),
            &strings(&["receiver_1", "receiver_2", "receiver_1_2"]),
        )
    }

    /// Every op, with queue/key arguments owned by `receiver_1`.
    fn own_ops() -> Vec<Op<'static>> {
        vec![
            Op::DeclareQueue {
                queue: "receiver_1_queue",
            },
            Op::DeclareExchange { exchange: "ex" },
            Op::Bind {
                queue: "receiver_1_queue",
                routing_key: "receiver_1",
            },
            Op::Publish,
            Op::Consume {
                queue: "receiver_1_queue",
            },
            Op::Fetch {
                queue: "receiver_1_queue",
            },
            Op::Nack {
                queue: Some("receiver_1_queue"),
            },
            Op::Nack { queue: None },
            Op::Ack,
            Op::Resend,
            Op::Quit,
            Op::RegisterPublicKey,
            Op::GetPublicKey,
            Op::Heartbeat,
            Op::Unbind {
                queue: "receiver_1_queue",
                routing_key: "receiver_1",
            },
            Op::PurgeQueue {
                queue: "receiver_1_queue",
            },
            Op::DeleteQueue {
                queue: "receiver_1_queue",
            },
            Op::CloseConnection,
        ]
    }

    #[test]
    fn removals_need_ownership_and_closing_needs_an_admin() {
        let a = acl();
        for op in [
            Op::Unbind {
                queue: "receiver_2_queue",
                routing_key: "receiver_2",
            },
            Op::Unbind {
                queue: "receiver_1_queue",
                routing_key: "receiver_2",
            },
            Op::PurgeQueue {
                queue: "receiver_2_queue",
            },
            Op::DeleteQueue {
                queue: "receiver_1_2_queue",
            },
            Op::CloseConnection,
        ] {
            assert!(!allowed(&a, Role::Receiver, "receiver_1", op), "{op:?}");
            assert!(allowed(&a, Role::Admin, "admin", op), "{op:?}");
        }
        let e = a
            .check(Role::Receiver, "receiver_1", Op::CloseConnection)
            .unwrap_err();
        assert_eq!(e.reason, "only admins may close connections");
    }

    fn allowed(a: &Acl, role: Role, cn: &str, op: Op<'_>) -> bool {
        a.check(role, cn, op).is_ok()
    }

    #[test]
    fn roles_and_display() {
        let a = Acl::new(
            &strings(&["boss"]),
            &strings(&["s", "boss"]),
            &strings(&["r", "s", "boss"]),
        );
        assert_eq!(a.role_of("boss"), Role::Admin);
        assert_eq!(a.role_of("s"), Role::Sender);
        assert_eq!(a.role_of("r"), Role::Receiver);
        assert_eq!(a.role_of("R"), Role::Unknown);
        assert_eq!(a.role_of(""), Role::Unknown);
        let shown: Vec<String> = [
            Role::Sender,
            Role::Receiver,
            Role::Admin,
            Role::Monitor,
            Role::Unknown,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(shown, ["sender", "receiver", "admin", "monitor", "unknown"]);
    }

    #[test]
    fn sender_column() {
        let a = acl();
        let expected = [
            ("declare_queue", false),
            ("declare_exchange", false),
            ("bind", false),
            ("publish", true),
            ("consume", false),
            ("fetch", false),
            ("nack", false),
            ("nack", false),
            ("ack", true),
            ("resend", true),
            ("quit", true),
            ("register_public_key", false),
            ("get_public_key", true),
            ("heartbeat", true),
            ("unbind", false),
            ("purge_queue", false),
            ("delete_queue", false),
            ("close_connection", false),
        ];
        for (op, (name, ok)) in own_ops().into_iter().zip(expected) {
            assert_eq!(op.name(), name);
            assert_eq!(allowed(&a, Role::Sender, "sender_1", op), ok, "{op:?}");
        }
        let e = a
            .check(Role::Sender, "sender_1", Op::DeclareQueue { queue: "q" })
            .unwrap_err();
        assert_eq!(e.reason, "senders may not declare queues");
    }

    #[test]
    fn receiver_column_on_own_resources() {
        let a = acl();
        let expected = [
            true, true, true, false, true, true, true, true, true, true, true, true, false, true,
            true, true, true, false,
        ];
        for (op, ok) in own_ops().into_iter().zip(expected) {
            assert_eq!(allowed(&a, Role::Receiver, "receiver_1", op), ok, "{op:?}");
        }
        assert_eq!(
            a.check(Role::Receiver, "receiver_1", Op::Publish)
                .unwrap_err()
                .to_string(),
            "receivers may not publish"
        );
    }

    #[test]
    fn receiver_denied_on_foreign_resources() {
        let a = acl();
        let q = "receiver_2_queue";
        for op in [
            Op::DeclareQueue { queue: q },
            Op::Consume { queue: q },
            Op::Fetch { queue: q },
            Op::Nack { queue: Some(q) },
            Op::Bind {
                queue: q,
                routing_key: "receiver_1",
            },
            Op::DeclareQueue { queue: "orders" },
        ] {
            let e = a.check(Role::Receiver, "receiver_1", op).unwrap_err();
            assert_eq!(
                e.reason, "receivers may only use their own queues",
                "{op:?}"
            );
        }
        // Own queue, foreign routing key.
        let e = a
            .check(
                Role::Receiver,
                "receiver_1",
                Op::Bind {
                    queue: "receiver_1_queue",
                    routing_key: "receiver_2",
                },
            )
            .unwrap_err();
        assert_eq!(e.reason, "receivers may only bind routing keys they own");
    }

    #[test]
    fn receiver_role_without_configured_cn_owns_nothing() {
        let a = acl();
        let op = Op::Consume {
            queue: "ghost_queue",
        };
        assert!(!allowed(&a, Role::Receiver, "ghost", op));
    }

    #[test]
    fn admin_column_allows_everything() {
        let a = acl();
        for op in own_ops() {
            assert!(allowed(&a, Role::Admin, "admin", op), "{op:?}");
        }
        let foreign = [
            Op::DeclareQueue { queue: "anything" },
            Op::Bind {
                queue: "receiver_2_queue",
                routing_key: "#",
            },
            Op::Consume {
                queue: "receiver_2_queue",
            },
            Op::Fetch { queue: "x" },
            Op::Nack { queue: Some("x") },
        ];
        for op in foreign {
            assert!(allowed(&a, Role::Admin, "admin", op), "{op:?}");
        }
    }

    #[test]
    fn monitors_may_only_send_heartbeats_and_quit() {
        let a = Acl::new(&strings(&["boss"]), &strings(&["s"]), &strings(&["r"]))
            .with_monitors(&strings(&["m", "boss", "s", "r"]));
        assert_eq!(a.role_of("m"), Role::Monitor);
        // Listed elsewhere too, a CN keeps that role.
        assert_eq!(a.role_of("boss"), Role::Admin);
        assert_eq!(a.role_of("s"), Role::Sender);
        assert_eq!(a.role_of("r"), Role::Receiver);
        for op in own_ops() {
            let verdict = a.check(Role::Monitor, "m", op);
            match op {
                Op::Heartbeat | Op::Quit => assert!(verdict.is_ok(), "{op:?}"),
                _ => assert_eq!(
                    verdict.unwrap_err().reason,
                    "monitors may only send heartbeats",
                    "{op:?}"
                ),
            }
        }
    }

    #[test]
    fn unknown_role_is_denied_everything() {
        let a = acl();
        for op in own_ops() {
            let e = a.check(Role::Unknown, "receiver_1", op).unwrap_err();
            assert_eq!(e.reason, "unknown client");
        }
    }

    #[test]
    fn queue_ownership_longest_cn_wins() {
        let a = acl();
        assert_eq!(a.queue_owner("receiver_1_queue"), Some("receiver_1"));
        assert_eq!(a.queue_owner("receiver_1_queue.dlq"), Some("receiver_1"));
        assert_eq!(a.queue_owner("receiver_1_other"), Some("receiver_1"));
        assert_eq!(a.queue_owner("receiver_1_2_queue"), Some("receiver_1_2"));
        assert_eq!(
            a.queue_owner("receiver_1_2_queue.dlq"),
            Some("receiver_1_2")
        );
        assert_eq!(a.queue_owner("receiver_1"), None);
        assert_eq!(a.queue_owner("receiver_1queue"), None);
        assert_eq!(a.queue_owner("orders"), None);
        assert_eq!(a.queue_owner(""), None);

        let op = Op::Consume {
            queue: "receiver_1_2_queue",
        };
        assert!(!allowed(&a, Role::Receiver, "receiver_1", op));
        assert!(allowed(&a, Role::Receiver, "receiver_1_2", op));
    }

    #[test]
    fn queue_ownership_needs_the_underscore() {
        let a = Acl::new(&[], &[], &strings(&["receiver_1"]));
        assert_eq!(a.queue_owner("receiver_10_queue"), None);
        let op = Op::DeclareQueue {
            queue: "receiver_10_queue",
        };
        assert!(!allowed(&a, Role::Receiver, "receiver_1", op));
        // Without receiver_1_2 configured, receiver_1 owns receiver_1_2_queue.
        assert_eq!(a.queue_owner("receiver_1_2_queue"), Some("receiver_1"));
    }

    #[test]
    fn routing_key_ownership() {
        let a = Acl::new(&[], &[], &strings(&["receiver_1"]));
        assert_eq!(a.routing_key_owner("receiver_1"), Some("receiver_1"));
        assert_eq!(a.routing_key_owner("receiver_1.x"), Some("receiver_1"));
        assert_eq!(a.routing_key_owner("receiver_1_x"), Some("receiver_1"));
        assert_eq!(a.routing_key_owner("receiver_1.#"), Some("receiver_1"));
        assert_eq!(a.routing_key_owner("receiver_1x"), None);
        assert_eq!(a.routing_key_owner("#"), None);
        assert_eq!(a.routing_key_owner("*.receiver_1"), None);
        assert_eq!(a.routing_key_owner(""), None);

        let bind = |key| Op::Bind {
            queue: "receiver_1_queue",
            routing_key: key,
        };
        for key in ["receiver_1", "receiver_1.x", "receiver_1_x", "receiver_1.#"] {
            assert!(
                allowed(&a, Role::Receiver, "receiver_1", bind(key)),
                "{key}"
            );
        }
        for key in ["receiver_1x", "#", "*"] {
            assert!(
                !allowed(&a, Role::Receiver, "receiver_1", bind(key)),
                "{key}"
            );
        }
    }

    #[test]
    fn routing_key_longest_cn_wins() {
        let a = acl();
        assert_eq!(a.routing_key_owner("receiver_1_2"), Some("receiver_1_2"));
        assert_eq!(a.routing_key_owner("receiver_1_2.x"), Some("receiver_1_2"));
        assert_eq!(a.routing_key_owner("receiver_1_3"), Some("receiver_1"));
        let op = Op::Bind {
            queue: "receiver_1_queue",
            routing_key: "receiver_1_2.#",
        };
        assert!(!allowed(&a, Role::Receiver, "receiver_1", op));
    }

    #[test]
    fn duplicate_cns_are_harmless() {
        let a = Acl::new(&[], &[], &strings(&["r", "r", "r_x"]));
        assert_eq!(a.queue_owner("r_x_queue"), Some("r_x"));
        assert_eq!(a.queue_owner("r_queue"), Some("r"));
    }

    #[test]
    fn delete_exchange_column() {
        let a = acl();
        let op = Op::DeleteExchange { exchange: "ex" };
        assert_eq!(op.name(), "delete_exchange");
        assert_eq!(
            a.check(Role::Sender, "sender_1", op).unwrap_err().reason,
            "senders may not delete exchanges"
        );
        // Ownership is the topology's to check where the deletion applies.
        assert!(allowed(&a, Role::Receiver, "receiver_1", op));
        assert!(allowed(&a, Role::Admin, "admin", op));
    }

    #[test]
    fn receivers_may_not_declare_exchanges_named_for_another_receiver() {
        let a = acl();
        let declare = |exchange| Op::DeclareExchange { exchange };
        for name in [
            "ex",
            "alerts",
            "receiver_1",
            "receiver_1.events",
            "receiver_1_fan",
        ] {
            assert!(
                allowed(&a, Role::Receiver, "receiver_1", declare(name)),
                "{name}"
            );
        }
        for name in ["receiver_2", "receiver_2_fan", "receiver_1_2.events"] {
            let e = a
                .check(Role::Receiver, "receiver_1", declare(name))
                .unwrap_err();
            assert_eq!(
                e.reason, "receivers may not declare exchanges named for another receiver",
                "{name}"
            );
            assert!(allowed(&a, Role::Admin, "admin", declare(name)), "{name}");
        }
        assert!(allowed(
            &a,
            Role::Receiver,
            "receiver_1_2",
            declare("receiver_1_2_fan")
        ));
    }

    #[test]
    fn a_pattern_may_match_only_the_binders_keys() {
        // `r.eu` owns `r.eu` and `r.eu.…` (longest CN), though `r.` prefixes them.
        let a = Acl::new(&[], &[], &strings(&["r", "r.eu", "r_x", "q"]));
        let owned = |cn: &str, key: &str| a.binding_key_owned(cn, key);
        for key in [
            "r", "r.a", "r.a.#", "r.a.*", "r.a.*.#", "r_y.#", "r.eux.#", "r_.*",
        ] {
            assert!(owned("r", key), "r may bind {key}");
        }
        for key in [
            "r.#", "r.*", "r.*.x", "r.#.x", "r.*.#", "r.eu", "r.eu.#", "r_x.#", "r_x", "r_x_y.*",
            "#", "*", "*.r", "#.r", "q.#", "rr.#", "",
        ] {
            assert!(!owned("r", key), "r may not bind {key}");
        }
        for key in ["r.eu", "r.eu.#", "r.eu.*", "r.eu_1.#", "r.eu.#.x"] {
            assert!(owned("r.eu", key), "r.eu may bind {key}");
        }
        assert!(!owned("r.eu", "r.#"));
        assert!(owned("r_x", "r_x.#"));
        assert!(!owned("r_x", "r.#"));
        // The ACL gives the reason for a pattern.
        let e = a
            .check(
                Role::Receiver,
                "r",
                Op::Bind {
                    queue: "r_queue",
                    routing_key: "r.#",
                },
            )
            .unwrap_err();
        assert_eq!(
            e.reason,
            "receivers may only bind patterns that match only routing keys they own"
        );
    }

    #[test]
    fn patterns_with_the_test_cns() {
        let a = acl();
        for key in [
            "receiver_1.#",
            "receiver_1.*",
            "receiver_1_x.#",
            "receiver_1_2x.*",
        ] {
            assert!(a.binding_key_owned("receiver_1", key), "{key}");
        }
        for key in ["receiver_1_2.#", "receiver_1_2_x.*", "receiver_1_2", "#"] {
            assert!(!a.binding_key_owned("receiver_1", key), "{key}");
        }
        assert!(a.binding_key_owned("receiver_1_2", "receiver_1_2.#"));
    }

    #[test]
    fn a_pattern_check_is_bounded() {
        let receivers: Vec<String> = (1..=64)
            .map(|n| format!("r{}", ".a".repeat(n)))
            .chain(["r".to_owned()])
            .collect();
        let a = Acl::new(&[], &[], &receivers);
        let pattern = format!("r{}", ".#".repeat(127));
        assert_eq!(pattern.len(), 255);
        let started = std::time::Instant::now();
        assert!(!a.binding_key_owned("r", &pattern));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    fn info(name: &str, owner: &str) -> ciphermq_shard::QueueInfo {
        ciphermq_shard::QueueInfo {
            name: name.into(),
            owner: owner.into(),
            shard: 0,
        }
    }

    fn binding<'a>(
        queue: &'a ciphermq_shard::QueueInfo,
        kind: ExchangeKind,
        exchange_owner: Option<&'a str>,
        key: &'a str,
        bound_by: Option<&'a Actor>,
    ) -> Binding<'a> {
        Binding {
            exchange: "e",
            kind,
            exchange_owner,
            key,
            queue,
            bound_by,
        }
    }

    #[test]
    fn judging_bindings() {
        let a = acl();
        let q1 = info("receiver_1_queue", "receiver_1");
        let orders = info("orders", "admin");
        let r1 = Actor::receiver("receiver_1");
        let r2 = Actor::receiver("receiver_2");
        let gone = Actor::receiver("ghost");
        let lawful = [
            binding(&q1, ExchangeKind::Direct, None, "receiver_1", Some(&r1)),
            binding(
                &q1,
                ExchangeKind::Fanout,
                Some("receiver_1"),
                "receiver_1",
                Some(&r1),
            ),
            binding(&q1, ExchangeKind::Fanout, None, "x", Some(&Actor::Admin)),
            binding(&q1, ExchangeKind::Topic, None, "#", Some(&Actor::Admin)),
            binding(&q1, ExchangeKind::Direct, None, "receiver_1", None),
            binding(&orders, ExchangeKind::Fanout, None, "anything", None),
        ];
        for b in &lawful {
            assert_eq!(a.judge_binding(b), Ok(()), "{b:?}");
        }
        let unlawful = [
            (
                binding(
                    &q1,
                    ExchangeKind::Fanout,
                    Some("receiver_2"),
                    "receiver_1",
                    Some(&r1),
                ),
                FANOUT_NOT_OWNED,
            ),
            (
                binding(&q1, ExchangeKind::Fanout, None, "receiver_1", None),
                FANOUT_NOT_OWNED,
            ),
            (
                binding(&q1, ExchangeKind::Direct, None, "receiver_1", Some(&r2)),
                "receivers may only use their own queues",
            ),
            (
                binding(&q1, ExchangeKind::Topic, None, "receiver_2.#", None),
                "receivers may only bind patterns that match only routing keys they own",
            ),
            (
                binding(&q1, ExchangeKind::Direct, None, "receiver_1", Some(&gone)),
                "ghost, who made it, is no longer a receiver",
            ),
        ];
        for (b, why) in &unlawful {
            assert_eq!(a.judge_binding(b).unwrap_err().reason, *why, "{b:?}");
        }
        // A binder who became an admin keeps its bindings.
        let promoted = Acl::new(&strings(&["receiver_1"]), &[], &strings(&["receiver_2"]));
        let b = binding(&q1, ExchangeKind::Fanout, None, "x", Some(&r1));
        assert_eq!(promoted.judge_binding(&b), Ok(()));
    }
}
