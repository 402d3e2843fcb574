//! Logs kept outside this node's data directory: on storage every node of
//! a cluster reaches (`cluster.storage = "shared"`), one directory per
//! owner and tenure. Such a log carries a fence the committer consults
//! after each `fdatasync` and before any `ACK`: a later holder of the
//! owner may have taken the storage over meanwhile, and then nothing of
//! the round may be acknowledged.

use std::path::PathBuf;
use std::sync::Arc;

/// Decides where a queue's log lives when it is not under
/// `{data_dir}/queues`; asked once per log, when the shard makes it.
pub trait LogPlacement: Send + Sync + std::fmt::Debug {
    /// `queue`'s log directory and its fence; `None`: the data directory's
    /// own (`{data_dir}/queues/{queue}`, no fence).
    fn place(&self, queue: &str) -> Option<PlacedLog>;
}

/// A log directory elsewhere and what guards it.
#[derive(Clone, Debug)]
pub struct PlacedLog {
    /// The queue's log directory. Its parent must exist: the committer makes
    /// only this last level, so a fenced holder never makes its owner's
    /// directory again.
    pub dir: PathBuf,
    /// Consulted after each round's `fdatasync`.
    pub fence: Arc<dyn LogFence>,
}

/// Whether this node may still acknowledge what it wrote to a log.
pub trait LogFence: Send + Sync + std::fmt::Debug {
    /// `true` while this node holds the log's owner: its lease holds and
    /// nobody has fenced its directory. Blocking (it may stat shared
    /// storage): call it off the shard's thread.
    fn holds(&self) -> bool;
}
