//! The holder's side of the lease: whether this node may still acknowledge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Until when this node's lease holds, on its own monotonic clock: read by
/// every commit round (one atomic load), renewed by the coordinator thread
/// after each heartbeat PostgreSQL accepted.
///
/// The lease runs from when the heartbeat was *sent*, not answered: a
/// watcher starts counting at the earliest when it reads the new stamp,
/// which is after the send, and declares this node dead only after a
/// lease plus a margin of silence. So while this gate says valid, no
/// other node has been given this node's owners (clocks that run at
/// about the same rate; the margin absorbs drift).
#[derive(Debug)]
pub struct LeaseGate {
    origin: Instant,
    /// Nanoseconds since `origin`; 0: never valid (not joined yet, or
    /// revoked).
    valid_until: AtomicU64,
}

impl Default for LeaseGate {
    fn default() -> Self {
        LeaseGate::new()
    }
}

impl LeaseGate {
    /// A gate that is not valid until renewed.
    pub fn new() -> LeaseGate {
        LeaseGate {
            origin: Instant::now(),
            valid_until: AtomicU64::new(0),
        }
    }

    /// A heartbeat sent at `sent_at` was accepted: the lease holds until
    /// `sent_at + lease`. Never moves the end back.
    pub fn renewed(&self, sent_at: Instant, lease: Duration) {
        let until = self.nanos(sent_at + lease);
        self.valid_until.fetch_max(until, Ordering::AcqRel);
    }

    /// The lease is lost for good (this node was declared dead, or fenced):
    /// nothing is acknowledged until a new registration renews it.
    pub fn revoke(&self) {
        self.valid_until.store(0, Ordering::Release);
    }

    /// Whether the lease still holds at `now`.
    pub fn is_valid(&self, now: Instant) -> bool {
        self.nanos(now) < self.valid_until.load(Ordering::Acquire)
    }

    /// How long the lease still holds after `now`.
    pub fn remaining(&self, now: Instant) -> Duration {
        Duration::from_nanos(
            self.valid_until
                .load(Ordering::Acquire)
                .saturating_sub(self.nanos(now)),
        )
    }

    fn nanos(&self, at: Instant) -> u64 {
        // 584 years of uptime fit.
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_from_renewal_until_the_lease_ends_and_never_after_a_revoke() {
        let gate = LeaseGate::new();
        let t0 = Instant::now();
        assert!(!gate.is_valid(t0), "not valid before the first heartbeat");
        gate.renewed(t0, Duration::from_secs(5));
        assert!(gate.is_valid(t0 + Duration::from_secs(4)));
        assert!(!gate.is_valid(t0 + Duration::from_secs(5)));
        // An older heartbeat answered late does not shorten it.
        gate.renewed(t0 - Duration::from_secs(1), Duration::from_secs(5));
        assert!(gate.is_valid(t0 + Duration::from_millis(4_500)));
        gate.revoke();
        assert!(!gate.is_valid(t0));
        assert_eq!(gate.remaining(t0), Duration::ZERO);
    }
}
