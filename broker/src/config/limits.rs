//! The numeric bounds the checks enforce, and the room a request line
//! leaves around a body: apart from the sections because several share
//! them, and tests outside the crate read them.

/// Upper bound of `server.shards`: more executors than this is a typo, not a machine.
pub const MAX_SHARDS: usize = 1024;

/// Lower bound of `storage.segment_bytes`: one page, so a segment holds at least a
/// few small records.
pub const MIN_SEGMENT_BYTES: u64 = 4096;

/// Upper bound of `storage.segment_bytes`: recovery reads a segment whole, so
/// a segment must fit in memory comfortably (1 GiB).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// Upper bound of `storage.memory_budget_mb`: 1 PiB, far past any host, so
/// that the budget in bytes cannot overflow.
pub const MAX_MEMORY_BUDGET_MB: u64 = 1 << 30;

/// Upper bound of every duration in the config: ten years. A deadline is a
/// point in time computed from now, and one past what the clock can hold
/// would panic on first use; nothing sensible waits longer.
pub const MAX_DURATION_SECS: u64 = 10 * 365 * 24 * 3600;

/// Room for the command and its arguments around a message body: the default
/// `performance.max_line_bytes` is `max_message_bytes` plus this.
pub const LINE_OVERHEAD_BYTES: usize = 4096;

/// Upper bound of `performance.max_message_bytes`: the largest body whose
/// message record the queue log can still read back. A record longer than
/// [`MAX_RECORD_BYTES`](ciphermq_shard::log::record::MAX_RECORD_BYTES) is
/// taken for corruption on recovery, so accepting a larger body would store
/// a message that the next start reports as damage instead of serving.
///
/// A message record holds, besides the body: a header (length, CRC, kind;
/// counted as 16 bytes, more than it takes, so the format can grow a little
/// without lowering this bound), the sequence number and the time (8 bytes
/// each), and four fields (sender CN, message id, exchange, routing key),
/// each a 2-byte length and at most [`MAX_NAME_LEN`](ciphermq_proto::name::MAX_NAME_LEN)
/// (255) bytes.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = ciphermq_shard::log::record::MAX_RECORD_BYTES
    - 16
    - (8 + 8)
    - 4 * (2 + ciphermq_proto::name::MAX_NAME_LEN);

/// The smallest `performance.max_reply_bytes_per_turn`.
pub const MIN_REPLY_BYTES_PER_TURN: usize = 64 * 1024;

/// The smallest `performance.max_pending_reply_bytes`.
pub const MIN_PENDING_REPLY_BYTES: usize = 64 * 1024;
