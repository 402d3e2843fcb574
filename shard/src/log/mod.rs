//! Durable per-queue logs: `{data_dir}/queues/{queue}/segment-{base}.log`.
//!
//! Map:
//! - [`record`]: the record format (sync marker, length, CRC-32C, kind,
//!   payload); [`crc`]: the CRC-32C itself.
//! - [`segment`]: log files on disk: the file header, walking a file record
//!   by record, damage told from a torn end, listing a queue's files.
//! - [`queue_log`]: the write side of one queue's log, without I/O: it encodes
//!   records into a pending buffer and hands [`CommitJob`]s to the shard's
//!   committer, which writes them (`pwrite` and `fdatasync` on its blocking-I/O
//!   thread) and reports back.
//! - [`storage_calls`]: the storage calls each job makes, and their order,
//!   which the broker's committer and the simulation both run.
//! - [`buffer_pool`]: written commit buffers handed back for later rounds;
//!   [`log_buf`]: a job's bytes, placed in memory as they will lie in the
//!   file, so a direct write needs no copy.
//! - The dedup files beside a queue's segments (ids acked within the
//!   window, carried out of segments before those are deleted) are
//!   [`crate::dedup::file`].
//! - [`placement`]: logs kept on shared storage instead, each with the
//!   fence checked before its `ACK`s.
//! - [`mirror`]: how the metadata mirror holds back segment deletion until it
//!   has read a segment.
//! - [`recovery`]: reading a queue's files at start-up: torn tails truncated,
//!   damaged bytes moved to quarantine files and reported with file and
//!   offset, never served; every record after them still read.
//!
//! Segments are deleted oldest first, once every message in them is acked: an
//! ack record can only refer to a message in its own or an older segment, so
//! deleting from the front never resurrects an acked message.

pub mod buffer_pool;
pub mod crc;
pub mod log_buf;
pub mod mirror;
pub mod placement;
pub mod queue_log;
pub mod record;
pub mod recovery;
pub mod segment;
pub mod storage_calls;

pub use log_buf::LogBuf;
pub use mirror::MirrorWatermarks;
pub use placement::{LogFence, LogPlacement, PlacedLog};
pub use queue_log::{CommitJob, JobIo, QueueLog};
pub use recovery::{recover_queue, recover_queue_at, Damage, RecoveredQueue};
pub use segment::{segment_base, segment_path};
pub use storage_calls::{Payload, StorageCall};

use std::path::{Path, PathBuf};

/// The directory of one queue's log.
pub fn queue_dir(data_dir: &Path, queue: &str) -> PathBuf {
    data_dir.join("queues").join(queue)
}

/// Milliseconds since the Unix epoch, for ack times.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
