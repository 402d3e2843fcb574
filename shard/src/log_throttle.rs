//! At most one log line per interval for events a hostile client can cause
//! at will (failed handshakes, refused connections): the log must not become
//! the resource an attacker exhausts. Events in between are counted and the
//! next line says how many were left out.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A throttle owned by one thread (a shard): no atomics, no locks.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    last: Cell<Option<Instant>>,
    skipped: Cell<u64>,
}

impl LogThrottle {
    /// At most one line per `every`.
    pub const fn new(every: Duration) -> LogThrottle {
        LogThrottle {
            every,
            last: Cell::new(None),
            skipped: Cell::new(0),
        }
    }

    /// Whether to log this event now: `Some(n)` with the number of events
    /// left out since the last line, `None` to stay quiet.
    pub fn admit(&self, now: Instant) -> Option<u64> {
        if self
            .last
            .get()
            .is_some_and(|last| now.saturating_duration_since(last) < self.every)
        {
            self.skipped.set(self.skipped.get() + 1);
            return None;
        }
        self.last.set(Some(now));
        Some(self.skipped.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let t = LogThrottle::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(t.admit(t0), Some(0));
        for ms in 1..1000 {
            assert_eq!(t.admit(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(t.admit(t0 + Duration::from_secs(1)), Some(999));
        assert_eq!(t.admit(t0 + Duration::from_millis(1500)), None);
    }
}
