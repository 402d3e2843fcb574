//! At most a few log lines per interval for events a hostile client can
//! cause at will (failed handshakes, refused connections, access denied):
//! the log must not become the resource an attacker exhausts. Events in
//! between are counted, and the next line says how many were left out;
//! a line with nothing left out says nothing about it ([`log_throttled!`]).

use std::cell::Cell;
use std::time::{Duration, Instant};

#[doc(hidden)]
pub use tracing as __tracing;

/// A throttle owned by one thread (a shard): no atomics, no locks.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    /// Lines admitted per interval: a short run of events (three denials
    /// in a row) is logged whole, a flood is summarised.
    burst: u32,
    /// When the current interval began.
    since: Cell<Option<Instant>>,
    /// Lines admitted in the current interval.
    admitted: Cell<u32>,
    skipped: Cell<u64>,
}

impl LogThrottle {
    /// At most one line per `every`.
    pub const fn new(every: Duration) -> LogThrottle {
        LogThrottle::with_burst(every, 1)
    }

    /// At most `burst` lines per `every` (at least one).
    pub const fn with_burst(every: Duration, burst: u32) -> LogThrottle {
        LogThrottle {
            every,
            burst: if burst == 0 { 1 } else { burst },
            since: Cell::new(None),
            admitted: Cell::new(0),
            skipped: Cell::new(0),
        }
    }

    /// Whether to log this event now: `Some(n)` with the number of events
    /// left out since the last line, `None` to stay quiet.
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let current = self
            .since
            .get()
            .is_some_and(|since| now.saturating_duration_since(since) < self.every);
        if !current {
            self.since.set(Some(now));
            self.admitted.set(0);
        }
        if self.admitted.get() >= self.burst {
            self.skipped.set(self.skipped.get() + 1);
            return None;
        }
        self.admitted.set(self.admitted.get() + 1);
        Some(self.skipped.replace(0))
    }
}

/// Logs one line of a throttled event, if `admit` (a
/// [`LogThrottle::admit`] answer) lets it: with nothing left out since the
/// last line, the line is the message and fields as given; otherwise it
/// also has a `skipped` field and says how many `what` were left out.
/// Fields go in braces, each followed by a comma:
///
/// ```
/// # use std::time::{Duration, Instant};
/// # use ciphermq_shard::{log_throttle::LogThrottle, log_throttled};
/// let denied = LogThrottle::new(Duration::from_secs(1));
/// let cn = "sender_1";
/// log_throttled!(info, denied.admit(Instant::now()), "denials", { %cn, }, "access denied");
/// ```
#[macro_export]
macro_rules! log_throttled {
    ($level:ident, $admit:expr, $what:literal, { $($field:tt)* }, $($message:tt)+) => {
        match $admit {
            None => {}
            Some(0) => $crate::log_throttle::__tracing::$level!($($field)* $($message)+),
            Some(skipped) => $crate::log_throttle::__tracing::$level!(
                $($field)* skipped,
                "{} ({} {} not logged since the last line)",
                format_args!($($message)+),
                skipped,
                $what
            ),
        }
    };
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

    /// What a plain-text subscriber writes while `log` runs, line by line.
    fn lines_of(log: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_line_speaks_of_skipping_only_when_something_was_skipped() {
        let peer = "10.0.0.1:4000";
        let ok = "OK bind q ex k";
        let lines = lines_of(|| {
            log_throttled!(warn, Some(0), "refusals", { %peer, limit = "max", }, "refused");
            log_throttled!(warn, Some(7), "refusals", { %peer, limit = "max", }, "refused");
            log_throttled!(info, None, "refusals", {}, "never written");
            log_throttled!(info, Some(0), "lines", {}, "{ok}");
            log_throttled!(info, Some(1), "lines", {}, "{ok}");
        });
        assert_eq!(
            lines,
            [
                r#" WARN ciphermq_shard::log_throttle::tests: refused peer=10.0.0.1:4000 limit="max""#,
                r#" WARN ciphermq_shard::log_throttle::tests: refused (7 refusals not logged since the last line) peer=10.0.0.1:4000 limit="max" skipped=7"#,
                " INFO ciphermq_shard::log_throttle::tests: OK bind q ex k",
                " INFO ciphermq_shard::log_throttle::tests: OK bind q ex k (1 lines not logged since the last line) skipped=1",
            ]
        );
    }

    #[test]
    fn a_burst_is_logged_whole_and_a_flood_summarised() {
        let t = LogThrottle::with_burst(Duration::from_secs(1), 3);
        let t0 = Instant::now();
        for ms in 0..3 {
            assert_eq!(t.admit(t0 + Duration::from_millis(ms)), Some(0));
        }
        for ms in 3..100 {
            assert_eq!(t.admit(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(t.admit(t0 + Duration::from_secs(1)), Some(97));
        assert_eq!(t.admit(t0 + Duration::from_millis(1001)), Some(0));
    }
}
