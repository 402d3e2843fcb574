//! The time a shard reads: the system's, or one a simulation sets.
//!
//! Everything in this crate that needs "now" either takes it as an argument
//! or asks the shard's [`Clock`]; nothing else reads the system clock on
//! the data path. A simulation gives the shard a [`ManualClock`] and moves
//! it forward itself, so a run is a function of its seed alone (dedup
//! windows, `ack_wait` redeliveries, ack times in the log).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a shard reads the time.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system's monotonic clock and wall clock.
    #[default]
    System,
    /// A clock that moves only when told to.
    Manual(Arc<ManualClock>),
}

impl Clock {
    /// A new manual clock starting at `unix_ms`, and the clock reading it.
    pub fn manual(unix_ms: u64) -> (Clock, Arc<ManualClock>) {
        let manual = Arc::new(ManualClock::new(unix_ms));
        (Clock::Manual(manual.clone()), manual)
    }

    /// The monotonic present.
    #[inline]
    pub fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Manual(m) => m.now(),
        }
    }

    /// Milliseconds since the Unix epoch (ack and delivery times in the log).
    #[inline]
    pub fn unix_ms(&self) -> u64 {
        match self {
            Clock::System => crate::log::unix_ms(),
            Clock::Manual(m) => m.unix_ms(),
        }
    }
}

/// A clock for simulations: starts at a given wall time and moves only by
/// [`ManualClock::advance`].
///
/// Its monotonic time starts at the origin the dedup window's ticks count
/// from, so expiries round the same way in every run of a seed.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    origin_unix_ms: u64,
    elapsed_ns: AtomicU64,
}

impl ManualClock {
    /// A clock reading `unix_ms` now.
    pub fn new(unix_ms: u64) -> ManualClock {
        ManualClock {
            origin: crate::dedup::tick_origin(),
            origin_unix_ms: unix_ms,
            elapsed_ns: AtomicU64::new(0),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Time since the clock started.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_ns.load(Ordering::Relaxed))
    }

    /// The monotonic present.
    pub fn now(&self) -> Instant {
        self.origin + self.elapsed()
    }

    /// The wall clock's present, in Unix ms.
    pub fn unix_ms(&self) -> u64 {
        self.origin_unix_ms + self.elapsed().as_millis() as u64
    }
}
