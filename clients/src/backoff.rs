//! Exponential backoff with jitter, for publish retries and reconnects.
//!
//! Delays double from `base` up to `max`; each is drawn uniformly from its upper
//! half, so many clients that failed together do not retry in lock step.

use std::time::Duration;

use rand::Rng as _;

/// Exponential backoff parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (before jitter).
    pub base: Duration,
    /// Longest delay, however many attempts failed.
    pub max: Duration,
}

impl Backoff {
    /// Backoff from `base` up to `max` (`max` is raised to `base` if smaller).
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max: max.max(base),
        }
    }

    /// The ceiling of the delay after `failures` consecutive failures (1 for the
    /// first): `base * 2^(failures-1)`, capped at `max`.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// A delay drawn from `[ceiling/2, ceiling]`.
    pub fn delay(&self, failures: u32) -> Duration {
        let ceiling = self.ceiling(failures);
        let half = ceiling / 2;
        let spread = (ceiling - half).as_micros() as u64;
        half + Duration::from_micros(rand::thread_rng().gen_range(0..=spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.ceiling(1), Duration::from_millis(100));
        assert_eq!(b.ceiling(2), Duration::from_millis(200));
        assert_eq!(b.ceiling(4), Duration::from_millis(800));
        assert_eq!(b.ceiling(5), Duration::from_secs(1));
        assert_eq!(b.ceiling(1000), Duration::from_secs(1));
        for n in 1..10 {
            let d = b.delay(n);
            assert!(d <= b.ceiling(n) && d >= b.ceiling(n) / 2, "{n}: {d:?}");
        }
    }

    #[test]
    fn zero_base_is_no_wait() {
        let b = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(b.delay(3), Duration::ZERO);
    }
}
