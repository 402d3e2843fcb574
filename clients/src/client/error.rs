//! The client's errors, one enum per kind of operation: connecting
//! ([`ConnectError`]), any command ([`RequestError`]), publishing
//! ([`PublishError`]), a consumer's stream ([`ConsumerError`]), opening a
//! delivery ([`DecryptError`]), and why a connection ended ([`Disconnected`]).
//!
//! Refusals keep the broker's words: `Access denied: …` becomes
//! [`RequestError::Denied`] and `Error: …` [`RequestError::Broker`] with the text,
//! and `NACK <id> <reason>` becomes [`PublishError::Nack`] with a typed
//! [`NackReason`].

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ciphermq_proto::NackReason;

use crate::connection::ClientError;
use crate::crypto::{self, CryptoError, PublicKey};

/// Why [`Client::connect`](crate::Client::connect) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The configuration is unusable (a bound is out of range); the text says
    /// which setting and why.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// Loading the TLS files, the TCP connection, the TLS handshake (a broker
    /// that rejects our certificate shows up here) or reading the greeting
    /// failed.
    #[error(transparent)]
    Transport(ClientError),
    /// The broker does not know our certificate's CN: its greeting was
    /// `Access denied: …`; the text after `Access denied: `.
    #[error("access denied by the broker: {0}")]
    Denied(String),
    /// The broker answered its greeting with `Error: …` (for example
    /// `connection limit reached`: retry later); the text after `Error: `.
    #[error("the broker refused the connection: {0}")]
    Refused(String),
    /// A cluster client was given no seed address.
    #[error("no seed address given: name at least one node of the cluster")]
    NoSeeds,
}

impl ConnectError {
    /// Whether trying again later may succeed: the broker was unreachable,
    /// closed the connection, or is at its connection limit. Bad files, a
    /// rejected certificate or an unknown CN are not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            ConnectError::Transport(e) => matches!(
                e,
                ClientError::Connect { .. } | ClientError::Io(_) | ClientError::Closed
            ),
            ConnectError::Refused(text) => text.contains("connection limit"),
            ConnectError::Config(_) | ConnectError::Denied(_) | ConnectError::NoSeeds => false,
        }
    }
}

impl From<ClientError> for ConnectError {
    /// A refusal in place of the greeting is sorted into [`ConnectError::Denied`]
    /// or [`ConnectError::Refused`]; everything else is a transport failure.
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Refused(line) => {
                if let Some(text) = line.strip_prefix("Access denied: ") {
                    ConnectError::Denied(text.to_owned())
                } else if let Some(text) = line.strip_prefix("Error: ") {
                    ConnectError::Refused(text.to_owned())
                } else {
                    ConnectError::Refused(line)
                }
            }
            other => ConnectError::Transport(other),
        }
    }
}

/// Why a connection ended; shared by every command and consumer it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Disconnected {
    /// [`Client::close`](crate::Client::close) was called, or every handle on
    /// the client was dropped.
    #[error("the client closed the connection")]
    ClosedByClient,
    /// The broker closed the connection (it shut down, an admin ran
    /// `close_connection`, or it found us idle).
    #[error("the broker closed the connection")]
    ClosedByBroker,
    /// Reading or writing the TLS stream failed.
    #[error(transparent)]
    Transport(ClientError),
    /// The oldest command waited longer than the reply timeout: replies come in
    /// order, so nothing behind it could be answered either.
    #[error("no reply within {} s", .0.as_secs_f64())]
    ReplyTimeout(Duration),
    /// The broker sent something the protocol does not allow here (a reply with
    /// no command waiting, an `ACK` for another message than the oldest publish
    /// in flight, a malformed delivery).
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// Why a command failed. Refusals carry the broker's text.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// `Access denied: <reason> (role=<role>)`: the text after `Access denied: `.
    /// The ACL is checked before existence, so a resource one may not touch is
    /// denied whether or not it exists.
    #[error("access denied: {0}")]
    Denied(String),
    /// `Error: <reason>`: the text after `Error: ` (for example
    /// `unknown exchange ex`, `no outstanding delivery m1`).
    #[error("the broker refused: {0}")]
    Broker(String),
    /// `Rate limited`: the per-CN command bucket is empty; try again later.
    #[error("rate limited by the broker")]
    RateLimited,
    /// A reply that does not answer this command the way the protocol says.
    #[error("unexpected reply {0:?}")]
    Unexpected(String),
    /// A name breaks the protocol's name rule (`[A-Za-z0-9_.:-]{1,255}`; routing
    /// keys at most 32 words, binding keys may hold `*` and `#`). Nothing was sent.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// Which argument: `queue`, `exchange`, `routing key`, …
        what: &'static str,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// This connection already has a live [`Consumer`](crate::Consumer) on the
    /// queue.
    #[error("already consuming {0} on this connection")]
    AlreadyConsuming(String),
    /// [`Client::request`](crate::Client::request) was given a command whose
    /// replies are not one line, or one the client manages itself.
    #[error("{0}")]
    Unsupported(String),
    /// The connection ended before the reply came (or before the command could
    /// be sent).
    #[error("connection lost: {0}")]
    ConnectionLost(Arc<Disconnected>),
    /// In a cluster, the node the command had to go to could not be
    /// connected to.
    #[error("cannot connect to the node: {0}")]
    Connect(Arc<ConnectError>),
}

impl RequestError {
    /// A failed connection to a cluster's node.
    pub fn from_connect(e: ConnectError) -> RequestError {
        RequestError::Connect(Arc::new(e))
    }
}

impl RequestError {
    /// The reason a connection ended, when that is what failed this command.
    pub fn disconnected(&self) -> Option<&Disconnected> {
        match self {
            RequestError::ConnectionLost(reason) => Some(reason),
            _ => None,
        }
    }
}

/// What a [`Consumer`](crate::Consumer) yields instead of a delivery.
///
/// [`QueueDeleted`](ConsumerError::QueueDeleted) and
/// [`ConnectionLost`](ConsumerError::ConnectionLost) end the stream (it yields
/// `None` next); after [`Unsolicited`](ConsumerError::Unsolicited) it goes on.
///
/// ```no_run
/// # async fn example(mut consumer: ciphermq_clients::Consumer) {
/// use ciphermq_clients::ConsumerError;
/// use futures_util::StreamExt;
///
/// while let Some(item) = consumer.next().await {
///     match item {
///         Ok(delivery) => { /* decrypt, store, ack */ }
///         Err(ConsumerError::QueueDeleted(queue)) => {
///             eprintln!("{queue} was deleted; nothing more will come from it");
///         }
///         Err(ConsumerError::Unsolicited(line)) => eprintln!("the broker said: {line}"),
///         Err(e) => eprintln!("{e}"), // the connection is gone: connect again
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The broker pushed `Error: queue <q> deleted`: the queue consumed was
    /// deleted (by its owner or an admin). Nothing more comes from it; the
    /// deliveries not acknowledged are gone with it. The connection stays up
    /// for everything else.
    #[error("queue {0} was deleted")]
    QueueDeleted(String),
    /// The broker sent a line that is neither a delivery nor the reply to a
    /// command (no command was waiting), at most 200 characters of it. Every
    /// consumer of the connection gets it; the stream goes on.
    #[error("the broker pushed an unexpected line: {0}")]
    Unsolicited(String),
    /// The connection ended; a new client must consume again (the broker
    /// redelivers what was not acknowledged).
    #[error("connection lost: {0}")]
    ConnectionLost(Arc<Disconnected>),
}

impl ConsumerError {
    /// The reason a connection ended, when that is what ended the stream.
    pub fn disconnected(&self) -> Option<&Disconnected> {
        match self {
            ConsumerError::ConnectionLost(reason) => Some(reason),
            _ => None,
        }
    }

    /// Whether the stream ends after this item.
    pub fn ends_stream(&self) -> bool {
        !matches!(self, ConsumerError::Unsolicited(_))
    }
}

impl From<ConsumerError> for RequestError {
    /// For code that handles every failure of a connection as a
    /// [`RequestError`]: a lost connection stays
    /// [`RequestError::ConnectionLost`]; the other two become
    /// [`RequestError::Broker`] with the broker's words.
    fn from(e: ConsumerError) -> Self {
        match e {
            ConsumerError::ConnectionLost(reason) => RequestError::ConnectionLost(reason),
            ConsumerError::QueueDeleted(queue) => {
                RequestError::Broker(format!("queue {queue} deleted"))
            }
            ConsumerError::Unsolicited(line) => RequestError::Broker(line),
        }
    }
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// `NACK <id> <reason>`: refused for a reason not worth retrying
    /// (`no_route`, `invalid`, `too_large`, `access_denied`), or a retryable one
    /// (`rate_limited`, `queue_full`, `disk_full`, `storage`, `timeout`) that
    /// lasted past the retry policy.
    #[error("the broker refused {message_id}: {reason} (after {attempts} attempt(s))")]
    Nack {
        /// The message.
        message_id: String,
        /// The reason word.
        reason: NackReason,
        /// Publishes made, the first included.
        attempts: u32,
    },
    /// `NACK <id> moved <owner> <node_id> <host:port> <epoch>`: in a
    /// cluster, the receiver lives on another node; nothing was stored.
    /// [`ClusterClient`](crate::client::cluster::ClusterClient) follows it.
    #[error("{} not stored: owner {} lives on node {} at {} (epoch {})", .0.message_id, .0.owner, .0.node_id, .0.address, .0.epoch)]
    Moved(Box<Moved>),
    /// `NACK <id> <word>` with a reason this library does not know (a newer
    /// broker); not retried.
    #[error("the broker refused {message_id}: {reason}")]
    UnknownNack {
        /// The message.
        message_id: String,
        /// The reason word as sent.
        reason: String,
    },
    /// The broker offers a public key for `receiver` other than the one pinned
    /// on first use. Either the receiver rotated its key, or someone (the broker
    /// included) substitutes a key to read what is sent to it. Nothing was sent;
    /// check with the receiver, then call
    /// [`Client::accept_key`](crate::Client::accept_key) (or
    /// [`accept_key_rotation`](crate::Client::accept_key_rotation)).
    #[error(
        "the public key of receiver {receiver} changed: pinned {}, the broker offers {}; \
         nothing was sent (if {receiver} rotated its key, accept the new one explicitly)",
        fingerprint(.pinned),
        fingerprint(.offered)
    )]
    KeyChanged {
        /// The receiver.
        receiver: String,
        /// The key pinned on first use.
        pinned: PublicKey,
        /// The key the broker offers now.
        offered: PublicKey,
    },
    /// The broker has no public key for the receiver (it has not connected and
    /// registered one yet) and none is pinned for it: try again later.
    #[error("no public key for receiver {receiver}: it has not registered one with the broker, and none is pinned")]
    NoPublicKey {
        /// The receiver.
        receiver: String,
    },
    /// The broker's answer to `get_public_key` is not a usable key.
    #[error("the broker's public key for {receiver} is unusable: {error}")]
    BadKey {
        /// The receiver.
        receiver: String,
        /// What is wrong with it.
        error: CryptoError,
    },
    /// Encrypting failed (a plaintext beyond what ChaCha20-Poly1305 takes).
    #[error("cannot encrypt: {0}")]
    Crypto(CryptoError),
    /// The message id would break the name rule (a generated id longer than 255
    /// bytes: shorten the CNs, or give ids yourself).
    #[error("invalid message id {0:?}: ids follow the name rule [A-Za-z0-9_.:-]{{1,255}}")]
    InvalidMessageId(String),
    /// The pin store could not be read or written.
    #[error(transparent)]
    PinStore(#[from] PinStoreError),
    /// Sending the publish failed: a name broke the name rule, the broker
    /// answered `Access denied`/`Error:` (for example `invalid message`), or the
    /// connection was lost (re-publishing is safe: the broker deduplicates per
    /// sender and message id).
    #[error(transparent)]
    Request(#[from] RequestError),
}

/// Where a `NACK <id> moved …` sends a publish ([`PublishError::Moved`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The message.
    pub message_id: String,
    /// The owner the publish was for.
    pub owner: String,
    /// The node holding it.
    pub node_id: String,
    /// That node's address.
    pub address: String,
    /// The placement's epoch.
    pub epoch: u64,
}

// The cause is part of the message, not its `source()`: a report that prints
// the chain (`{:#}`) would print it twice.
impl From<CryptoError> for PublishError {
    fn from(e: CryptoError) -> Self {
        PublishError::Crypto(e)
    }
}

impl PublishError {
    /// The NACK reason, when the broker refused the message with a known one.
    pub fn nack_reason(&self) -> Option<NackReason> {
        match self {
            PublishError::Nack { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// Whether the connection was lost with the publish unanswered: publish it
    /// again on a new connection.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, PublishError::Request(RequestError::ConnectionLost(_)))
    }
}

/// Why a pin store could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PinStoreError {
    /// The pin file could not be read or written.
    #[error("cannot access the pin file {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: Arc<std::io::Error>,
    },
    /// A line of the pin file is not `<receiver_id> <base64 public key>`.
    #[error("{}:{line}: {reason} (expected `<receiver_id> <base64 of 32 bytes>`)", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A custom store failed; its own words.
    #[error("key pin store: {0}")]
    Other(String),
}

/// Why a delivery could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecryptError {
    /// The body is not an encrypted message (`EncryptedInputData`).
    #[error("the body is not an encrypted message: {0}")]
    Body(serde_json::Error),
    /// The body's `message_id` is not the delivery's: a body moved under
    /// another id.
    #[error("the body's message id {body:?} is not the delivery's {delivery:?}")]
    IdMismatch {
        /// The id on the `Message:` line.
        delivery: String,
        /// The id inside the body.
        body: String,
    },
    /// The body is addressed to another receiver than the key's owner.
    #[error("the message is for {addressed}, not {key_owner}")]
    NotForUs {
        /// `receiver_client_id` of the body.
        addressed: String,
        /// Whose key was used.
        key_owner: String,
    },
    /// The session key does not open with this key, or the ciphertext does not
    /// authenticate under its message id.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
}

/// A short, printable identity of a public key: its base64 form. Public keys are
/// not secret, and 44 characters compare easily by eye.
pub(crate) fn fingerprint(key: &PublicKey) -> Fingerprint<'_> {
    Fingerprint(key)
}

/// [`fingerprint`]'s display.
pub(crate) struct Fingerprint<'a>(&'a PublicKey);

impl fmt::Display for Fingerprint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crypto::public_key_to_base64(self.0))
    }
}
