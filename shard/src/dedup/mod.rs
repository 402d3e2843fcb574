//! Deduplication: a queue refuses a publish whose id the same sender used
//! while the message is stored or within the dedup window after its ack.
//!
//! Map:
//! - [`key`]: what is remembered of an id, a keyed 128-bit hash of sender
//!   and id ([`DedupKey`]), and the secret that keys it ([`DedupHasher`]),
//!   kept in the data directory so carried ids hash the same after a restart.
//! - [`id_set`]: the ids one queue remembers ([`IdSet`]), about 15 bytes
//!   each, expiring at the end of their window.
//! - [`file`]: ids acked within the window whose segments are deleted,
//!   carried into dedup files beside the queue's log (the carry itself is
//!   `Queue::carry_dedup`, written by the queue's next commit job), and read
//!   back at recovery, which rebuilds every set (`log::recovery`).

pub mod file;
pub mod id_set;
pub mod key;

pub(crate) use id_set::Tick;
pub use id_set::{IdSet, IdState};
pub use key::{DedupHasher, DedupKey};

/// The instant the dedup window's ticks count from (a simulated clock
/// starts there, so its expiries round the same way in every run).
pub(crate) fn tick_origin() -> std::time::Instant {
    Tick::origin()
}
