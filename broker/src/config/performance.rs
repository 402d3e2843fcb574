//! `[performance]`: sizes, timeouts and delivery limits, the on-disk shape
//! they load from (one default derives from another key), and their checks.

use serde::Deserialize;

use super::{
    Config, ConfigError, LINE_OVERHEAD_BYTES, MAX_MESSAGE_BYTES_LIMIT, MIN_PENDING_REPLY_BYTES,
    MIN_REPLY_BYTES_PER_TURN,
};

/// `[performance]`: sizes, timeouts and delivery limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "RawPerformanceConfig")]
pub struct PerformanceConfig {
    /// Most messages one queue may hold (ready + unacked); a full queue answers
    /// `NACK <id> queue_full`. At least 1. Default 1 000 000.
    pub max_queue_size: usize,
    /// Most body bytes one queue may hold (ready + unacked), alongside
    /// `max_queue_size`: a publish that would pass it answers
    /// `NACK <id> queue_full`. 0 = no byte cap (the default).
    pub max_queue_bytes: u64,
    /// Largest message JSON accepted, in bytes; larger is `NACK <id> too_large`.
    /// At least 1, at most [`MAX_MESSAGE_BYTES_LIMIT`]. Default 1 MiB (1 048 576).
    pub max_message_bytes: usize,
    /// Longest request line, in bytes; longer is `Error: line too long`. Must be
    /// larger than `max_message_bytes`. Default `max_message_bytes` + 4096.
    pub max_line_bytes: usize,
    /// Seconds a client has to finish the TLS handshake. At least 1. Default 10.
    pub handshake_timeout_secs: u64,
    /// `idle_timeout_secs`: seconds without any command before a connection
    /// is closed; 0 = never. Default 300. (The field keeps the key's old
    /// name, `idle_timeout_sec`, which still loads with a warning.)
    pub idle_timeout_sec: u64,
    /// `heartbeat_timeout_secs`: seconds a receiver may stay silent (no
    /// command, heartbeat included) before it is disconnected; 0 = never.
    /// Default 60. (The field keeps the key's old name, `heartbeat_timeout`,
    /// which still loads with a warning.)
    pub heartbeat_timeout: u64,
    /// Seconds an acked message id is remembered per queue and sender for
    /// deduplication. Default 120.
    pub dedup_window_secs: u64,
    /// Seconds a delivery may stay unacked before it is redelivered; 0 = never
    /// (only a closed connection redelivers). Default 300.
    pub ack_wait_secs: u64,
    /// Deliveries (nacked ones included) before a message moves to `{queue}.dlq`.
    /// At least 1. Default 10.
    pub max_deliveries: u32,
    /// Unacked deliveries per consumer when `consume` names no prefetch.
    /// At least 1. Default 1000.
    pub default_prefetch: u32,
    /// Per connection, how many commands may await their reply before the broker
    /// stops reading from it (backpressure on pipelining clients). At least 1.
    /// Default 65 536.
    pub max_pending_replies: usize,
    /// Per connection, how many bytes its pending replies may hold (each
    /// reply's own size, the ids it names, and the bodies it keeps alive
    /// until it is written: a publish's, a fetch's, a push delivery's)
    /// before the broker stops reading from it, until the client reads
    /// some. One line more may pass it, by at most that line's worth
    /// (docs/PROTOCOL.md, "Memory per connection"). At least 65 536.
    /// Default 4 MiB (4 194 304).
    pub max_pending_reply_bytes: usize,
    /// Most elements one `publish_batch` may hold; a larger batch is
    /// `Error: publish_batch of more than <n> elements` and nothing of it
    /// is published, so one line cannot create a reply per byte. At least
    /// 1. Default 10 000.
    pub max_batch_elements: usize,
    /// TLS handshakes in progress at once, all clients together, before any
    /// certificate is seen; more are closed at once. Shared evenly by the
    /// shards (each admits its part, rounded up). At least 1. Default 1024.
    pub max_handshakes: u32,
    /// TLS handshakes in progress at once from one IP address (each shard
    /// admits its part, rounded up). At least 1. Default 64.
    pub max_handshakes_per_ip: u32,
    /// Most deliveries one `fetch` returns, whatever it asks. At least 1.
    /// Default 10 000.
    pub max_fetch: u32,
    /// Body bytes one `fetch` returns at most (one message at least, when
    /// there is one). At least 1. Default 16 MiB (16 777 216).
    pub max_fetch_bytes: usize,
    /// Most unacked deliveries per consumer, whatever its `consume` asks.
    /// At least 1. Default 10 000.
    pub max_prefetch: u32,
    /// Body bytes one consumer may hold unacked (one message at least,
    /// however large): a prefetch in bytes beside `max_prefetch`, so large
    /// bodies cannot fill memory at the pace of a count. At least 1.
    /// Default 16 MiB (16 777 216).
    pub max_prefetch_bytes: u64,
    /// Most deliveries one connection may hold unacked (fetched or
    /// consumed) before its `fetch`es are refused; a fetch is served up to
    /// the room left. `consume` is bounded by its prefetch instead. So a
    /// client fetching without acking cannot build a set whose every fetch,
    /// and whose give-back at close, costs the shard more and more. At
    /// least 1. Default 50 000.
    pub max_unacked_per_connection: usize,
    /// Queues one receiver CN may own; a `declare_queue` past it is
    /// `Error: quota exceeded: …`. Admins are not limited. At least 1.
    /// Default 1 000.
    pub max_queues_per_cn: usize,
    /// Exchanges one receiver CN may own (declare first). At least 1.
    /// Default 100.
    pub max_exchanges_per_cn: usize,
    /// Bindings one receiver CN may make. At least 1. Default 10 000.
    pub max_bindings_per_cn: usize,
    /// Reply bytes one connection renders before it yields its shard to the
    /// others (a fast reader of a large `fetch` cannot hold the core). At
    /// least 65 536. Default 1 MiB (1 048 576).
    pub max_reply_bytes_per_turn: usize,
}

/// What `[performance]` looks like on disk: `max_line_bytes` is optional there
/// because its default depends on `max_message_bytes`, and two keys have the
/// `_secs` names their fields do not (yet) have.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawPerformanceConfig {
    max_queue_size: usize,
    max_queue_bytes: u64,
    max_message_bytes: usize,
    max_line_bytes: Option<usize>,
    handshake_timeout_secs: u64,
    idle_timeout_secs: u64,
    heartbeat_timeout_secs: u64,
    dedup_window_secs: u64,
    ack_wait_secs: u64,
    max_deliveries: u32,
    default_prefetch: u32,
    max_pending_replies: usize,
    max_pending_reply_bytes: usize,
    max_batch_elements: usize,
    max_handshakes: u32,
    max_handshakes_per_ip: u32,
    max_fetch: u32,
    max_fetch_bytes: usize,
    max_prefetch: u32,
    max_prefetch_bytes: u64,
    max_unacked_per_connection: usize,
    max_queues_per_cn: usize,
    max_exchanges_per_cn: usize,
    max_bindings_per_cn: usize,
    max_reply_bytes_per_turn: usize,
}

impl Default for RawPerformanceConfig {
    fn default() -> Self {
        let d = PerformanceConfig::default();
        RawPerformanceConfig {
            max_queue_size: d.max_queue_size,
            max_queue_bytes: d.max_queue_bytes,
            max_message_bytes: d.max_message_bytes,
            max_line_bytes: None,
            handshake_timeout_secs: d.handshake_timeout_secs,
            idle_timeout_secs: d.idle_timeout_sec,
            heartbeat_timeout_secs: d.heartbeat_timeout,
            dedup_window_secs: d.dedup_window_secs,
            ack_wait_secs: d.ack_wait_secs,
            max_deliveries: d.max_deliveries,
            default_prefetch: d.default_prefetch,
            max_pending_replies: d.max_pending_replies,
            max_pending_reply_bytes: d.max_pending_reply_bytes,
            max_batch_elements: d.max_batch_elements,
            max_handshakes: d.max_handshakes,
            max_handshakes_per_ip: d.max_handshakes_per_ip,
            max_fetch: d.max_fetch,
            max_fetch_bytes: d.max_fetch_bytes,
            max_prefetch: d.max_prefetch,
            max_prefetch_bytes: d.max_prefetch_bytes,
            max_unacked_per_connection: d.max_unacked_per_connection,
            max_queues_per_cn: d.max_queues_per_cn,
            max_exchanges_per_cn: d.max_exchanges_per_cn,
            max_bindings_per_cn: d.max_bindings_per_cn,
            max_reply_bytes_per_turn: d.max_reply_bytes_per_turn,
        }
    }
}

impl From<RawPerformanceConfig> for PerformanceConfig {
    fn from(raw: RawPerformanceConfig) -> Self {
        PerformanceConfig {
            max_queue_size: raw.max_queue_size,
            max_queue_bytes: raw.max_queue_bytes,
            max_message_bytes: raw.max_message_bytes,
            max_line_bytes: raw
                .max_line_bytes
                .unwrap_or_else(|| raw.max_message_bytes.saturating_add(LINE_OVERHEAD_BYTES)),
            handshake_timeout_secs: raw.handshake_timeout_secs,
            idle_timeout_sec: raw.idle_timeout_secs,
            heartbeat_timeout: raw.heartbeat_timeout_secs,
            dedup_window_secs: raw.dedup_window_secs,
            ack_wait_secs: raw.ack_wait_secs,
            max_deliveries: raw.max_deliveries,
            default_prefetch: raw.default_prefetch,
            max_pending_replies: raw.max_pending_replies,
            max_pending_reply_bytes: raw.max_pending_reply_bytes,
            max_batch_elements: raw.max_batch_elements,
            max_handshakes: raw.max_handshakes,
            max_handshakes_per_ip: raw.max_handshakes_per_ip,
            max_fetch: raw.max_fetch,
            max_fetch_bytes: raw.max_fetch_bytes,
            max_prefetch: raw.max_prefetch,
            max_prefetch_bytes: raw.max_prefetch_bytes,
            max_unacked_per_connection: raw.max_unacked_per_connection,
            max_queues_per_cn: raw.max_queues_per_cn,
            max_exchanges_per_cn: raw.max_exchanges_per_cn,
            max_bindings_per_cn: raw.max_bindings_per_cn,
            max_reply_bytes_per_turn: raw.max_reply_bytes_per_turn,
        }
    }
}

impl Default for PerformanceConfig {
    fn default() -> Self {
        let max_message_bytes = 1_048_576;
        PerformanceConfig {
            max_queue_size: 1_000_000,
            max_queue_bytes: 0,
            max_message_bytes,
            max_line_bytes: max_message_bytes + LINE_OVERHEAD_BYTES,
            handshake_timeout_secs: 10,
            idle_timeout_sec: 300,
            heartbeat_timeout: 60,
            dedup_window_secs: 120,
            ack_wait_secs: 300,
            max_deliveries: 10,
            default_prefetch: 1000,
            max_pending_replies: 65_536,
            max_pending_reply_bytes: 4 << 20,
            max_batch_elements: 10_000,
            max_handshakes: 1024,
            max_handshakes_per_ip: 64,
            max_fetch: 10_000,
            max_fetch_bytes: 16 << 20,
            max_prefetch: 10_000,
            max_prefetch_bytes: 16 << 20,
            max_unacked_per_connection: 50_000,
            max_queues_per_cn: 1_000,
            max_exchanges_per_cn: 100,
            max_bindings_per_cn: 10_000,
            max_reply_bytes_per_turn: 1 << 20,
        }
    }
}

impl Config {
    pub(super) fn validate_performance(&self) -> Result<(), ConfigError> {
        let p = &self.performance;
        let at_least_one: [(&str, u64); 17] = [
            ("performance.max_queues_per_cn", p.max_queues_per_cn as u64),
            (
                "performance.max_exchanges_per_cn",
                p.max_exchanges_per_cn as u64,
            ),
            (
                "performance.max_bindings_per_cn",
                p.max_bindings_per_cn as u64,
            ),
            ("performance.max_fetch", u64::from(p.max_fetch)),
            ("performance.max_fetch_bytes", p.max_fetch_bytes as u64),
            ("performance.max_prefetch", u64::from(p.max_prefetch)),
            ("performance.max_prefetch_bytes", p.max_prefetch_bytes),
            (
                "performance.max_unacked_per_connection",
                p.max_unacked_per_connection as u64,
            ),
            ("performance.max_handshakes", u64::from(p.max_handshakes)),
            (
                "performance.max_handshakes_per_ip",
                u64::from(p.max_handshakes_per_ip),
            ),
            ("performance.max_queue_size", p.max_queue_size as u64),
            ("performance.max_message_bytes", p.max_message_bytes as u64),
            (
                "performance.handshake_timeout_secs",
                p.handshake_timeout_secs,
            ),
            ("performance.max_deliveries", u64::from(p.max_deliveries)),
            (
                "performance.default_prefetch",
                u64::from(p.default_prefetch),
            ),
            (
                "performance.max_pending_replies",
                p.max_pending_replies as u64,
            ),
            (
                "performance.max_batch_elements",
                p.max_batch_elements as u64,
            ),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if p.max_message_bytes > MAX_MESSAGE_BYTES_LIMIT {
            return Err(ConfigError::invalid(
                "performance.max_message_bytes",
                format!(
                    "{} is more than {MAX_MESSAGE_BYTES_LIMIT}, the largest body a queue log \
                     record can hold ({} MiB less the record's header and routing fields)",
                    p.max_message_bytes,
                    ciphermq_shard::log::record::MAX_RECORD_BYTES >> 20
                ),
            ));
        }
        if p.max_pending_reply_bytes < MIN_PENDING_REPLY_BYTES {
            return Err(ConfigError::invalid(
                "performance.max_pending_reply_bytes",
                format!("must be at least {MIN_PENDING_REPLY_BYTES}"),
            ));
        }
        if p.max_reply_bytes_per_turn < MIN_REPLY_BYTES_PER_TURN {
            return Err(ConfigError::invalid(
                "performance.max_reply_bytes_per_turn",
                format!(
                    "{} is less than {MIN_REPLY_BYTES_PER_TURN}: a connection would yield \
                     its shard after every few replies",
                    p.max_reply_bytes_per_turn
                ),
            ));
        }
        if p.max_line_bytes <= p.max_message_bytes {
            return Err(ConfigError::invalid(
                "performance.max_line_bytes",
                format!(
                    "must be larger than performance.max_message_bytes ({} <= {}; leave it \
                     unset for max_message_bytes + {LINE_OVERHEAD_BYTES})",
                    p.max_line_bytes, p.max_message_bytes
                ),
            ));
        }
        Ok(())
    }
}
