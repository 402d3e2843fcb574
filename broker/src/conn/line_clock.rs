//! The time a connection's lines are stamped with.
//!
//! Every line needs the present moment (rate limits, the dedup window,
//! latency figures) and every publish the wall clock (its `sent_at_ms`).
//! Two clock reads a line were 2% of the broker's CPU at full rate, yet the
//! lines of one burst, executed back to back in one turn of the executor,
//! are a few microseconds apart. So within a burst the clock is read once
//! per [`LineClock::REUSE`] lines; outside one (a line executed on its own,
//! as tests do) every read is fresh.

use std::time::Instant;

use ciphermq_shard::log::unix_ms;

/// A moment, as both clocks tell it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LineTime {
    /// The monotonic clock.
    pub(crate) now: Instant,
    /// The wall clock, Unix milliseconds.
    pub(crate) unix_ms: u64,
}

impl LineTime {
    fn read() -> LineTime {
        LineTime {
            now: Instant::now(),
            unix_ms: unix_ms(),
        }
    }
}

/// Reads the clocks at most once per [`LineClock::REUSE`] lines of a burst.
#[derive(Debug, Default)]
pub(crate) struct LineClock {
    /// The time of the burst's last read, and how many lines it stamped.
    burst: Option<(LineTime, u32)>,
    /// Inside a burst: a read may be reused.
    in_burst: bool,
    /// The stamp of the line being executed (the last one handed out).
    current: Option<LineTime>,
}

impl LineClock {
    /// Lines stamped with one read. At a few microseconds a line, the
    /// last of them is stamped ~0.1 ms early: far finer than anything the
    /// time is used for (1/16 s dedup ticks, milliseconds on the wire).
    pub(crate) const REUSE: u32 = 32;

    /// A burst of lines starts (input arrived): the next read is fresh.
    pub(crate) fn start_burst(&mut self) {
        self.burst = None;
        self.in_burst = true;
    }

    /// The burst is over: time may pass before the next line.
    pub(crate) fn end_burst(&mut self) {
        self.burst = None;
        self.in_burst = false;
    }

    /// The time to stamp a line with, when it starts executing.
    pub(crate) fn line(&mut self) -> LineTime {
        let t = match &mut self.burst {
            Some((t, used)) if self.in_burst && *used < LineClock::REUSE => {
                *used += 1;
                *t
            }
            _ => {
                let t = LineTime::read();
                if self.in_burst {
                    self.burst = Some((t, 1));
                }
                t
            }
        };
        self.current = Some(t);
        t
    }

    /// The wall-clock stamp of the line being executed: what a publish
    /// records as its `sent_at_ms`.
    pub(crate) fn line_unix_ms(&self) -> u64 {
        self.current.map_or_else(unix_ms, |t| t.unix_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_burst_every_line_reads_the_clock() {
        let mut clock = LineClock::default();
        let a = clock.line();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = clock.line();
        assert!(b.now > a.now, "a fresh read");
        assert!(b.unix_ms >= a.unix_ms);
    }

    #[test]
    fn a_burst_reuses_one_read_for_a_bounded_number_of_lines() {
        let mut clock = LineClock::default();
        clock.start_burst();
        let first = clock.line();
        std::thread::sleep(std::time::Duration::from_millis(2));
        for _ in 1..LineClock::REUSE {
            assert_eq!(clock.line().now, first.now, "reused within the burst");
            assert_eq!(clock.line_unix_ms(), first.unix_ms, "the line's own stamp");
        }
        let next = clock.line();
        assert!(next.now > first.now, "read again after REUSE lines");
        // A new burst (input arrived after a wait) never reuses the old read.
        clock.start_burst();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(clock.line().now > next.now);
        clock.end_burst();
        let after = clock.line();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(clock.line().now > after.now, "fresh once the burst ended");
    }
}
