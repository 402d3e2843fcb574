//! Latency as it happened over time: besides the histogram of a run, the
//! worst latency of the messages sent in each 100 ms window, so a stall (a
//! window whose worst message waited over 50 ms) shows when it happened and
//! how long it lasted, instead of vanishing into a percentile; and the
//! median and p99 of each second, so a long run (a soak) shows whether its
//! latency drifts.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::scenario::histogram;

/// Width of a timeline window, µs.
pub const WINDOW_US: u64 = 100_000;

/// A window whose worst latency is above this is a stall, ms.
pub const STALL_MS: f64 = 50.0;

/// Width of a window of the per-second percentiles, µs.
const SECOND_US: u64 = 1_000_000;

/// A histogram for one second of one stream: one significant figure (a
/// percentile within 10%, plenty for a plot) keeps it near 2 KB, so a
/// 10-minute soak holds its seconds in about a megabyte per stream.
fn second_histogram() -> Histogram<u32> {
    Histogram::new_with_bounds(1, 600_000_000, 1).expect("valid histogram bounds")
}

/// The latencies of one stream of messages (a publisher's acks, a
/// consumer's deliveries), merged over streams by [`Latencies::add`].
#[derive(Debug, Clone)]
pub struct Latencies {
    /// Every latency, µs.
    pub histogram: Histogram<u64>,
    /// Worst latency, µs, of the messages sent in window `i`
    /// (`[i * WINDOW_US, (i + 1) * WINDOW_US)` on the run's clock).
    worst: Vec<u32>,
    /// Latencies, µs, of the messages sent in second `i` of the run's clock.
    seconds: Vec<Histogram<u32>>,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            histogram: histogram(),
            worst: Vec::new(),
            seconds: Vec::new(),
        }
    }
}

impl Latencies {
    /// A message sent (or due) at `sent_us` on the run's clock finished at
    /// `now_us`.
    pub fn record(&mut self, sent_us: u64, now_us: u64) {
        let took = now_us.saturating_sub(sent_us).max(1);
        let _ = self.histogram.record(took);
        let i = (sent_us / WINDOW_US) as usize;
        if i >= self.worst.len() {
            self.worst.resize(i + 1, 0);
        }
        let w = &mut self.worst[i];
        *w = (*w).max(took.min(u32::MAX as u64) as u32);
        let s = (sent_us / SECOND_US) as usize;
        if s >= self.seconds.len() {
            self.seconds.resize_with(s + 1, second_histogram);
        }
        let _ = self.seconds[s].record(took);
    }

    /// Adds another stream's latencies.
    pub fn add(&mut self, other: &Latencies) -> anyhow::Result<()> {
        self.histogram.add(&other.histogram)?;
        if other.worst.len() > self.worst.len() {
            self.worst.resize(other.worst.len(), 0);
        }
        for (w, o) in self.worst.iter_mut().zip(&other.worst) {
            *w = (*w).max(*o);
        }
        if other.seconds.len() > self.seconds.len() {
            self.seconds
                .resize_with(other.seconds.len(), second_histogram);
        }
        for (s, o) in self.seconds.iter_mut().zip(&other.seconds) {
            s.add(o)?;
        }
        Ok(())
    }

    /// The timeline from the window holding `t0_us` on.
    pub fn timeline(&self, t0_us: u64) -> Timeline {
        let first = (t0_us / WINDOW_US) as usize;
        let worst_ms: Vec<f64> = self
            .worst
            .iter()
            .skip(first)
            .map(|us| (*us as f64 / 10.0).round() / 100.0)
            .collect();
        let stalls = worst_ms
            .iter()
            .enumerate()
            .filter(|(_, ms)| **ms > STALL_MS)
            .map(|(i, ms)| Stall {
                at_secs: i as f64 * WINDOW_US as f64 / 1e6,
                worst_ms: *ms,
            })
            .collect();
        // Seconds on the run's clock, from the one holding t0; a second with
        // nothing sent in it shows 0.
        let quantile = |q: f64| -> Vec<f64> {
            self.seconds
                .iter()
                .skip((t0_us / SECOND_US) as usize)
                .map(|h| {
                    if h.is_empty() {
                        0.0
                    } else {
                        (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0
                    }
                })
                .collect()
        };
        Timeline {
            window_ms: WINDOW_US / 1000,
            worst_ms,
            stalls,
            p50_ms_per_sec: quantile(0.5),
            p99_ms_per_sec: quantile(0.99),
        }
    }
}

/// Worst latency per window of a run, from its first publish on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// Width of a window.
    pub window_ms: u64,
    /// Worst latency of the messages sent in each window, ms (0: none sent
    /// or finished).
    pub worst_ms: Vec<f64>,
    /// The windows over [`STALL_MS`].
    pub stalls: Vec<Stall>,
    /// Median latency of the messages sent in each second of the run's
    /// clock (starting with the one holding the first publish), ms, to
    /// within 10%.
    pub p50_ms_per_sec: Vec<f64>,
    /// The same seconds' p99, ms.
    pub p99_ms_per_sec: Vec<f64>,
}

/// A window whose worst message waited over [`STALL_MS`].
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    /// When the window starts, seconds after the first publish.
    pub at_secs: f64,
    /// The worst latency in it.
    pub worst_ms: f64,
}

impl Timeline {
    /// "none", or how many windows stalled and the worst of them.
    pub fn describe(&self) -> String {
        // The first of the worst.
        match self
            .stalls
            .iter()
            .reduce(|a, b| if b.worst_ms > a.worst_ms { b } else { a })
        {
            None => "none".into(),
            Some(worst) => format!(
                "{} window(s) over {STALL_MS} ms, worst {:.1} ms at {:.1} s",
                self.stalls.len(),
                worst.worst_ms,
                worst.at_secs
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_found_in_the_window_it_was_sent_in() {
        let mut a = Latencies::default();
        // t0 at 1 s; one message per 10 ms for 2 s, all fast but those sent
        // 0.5-0.7 s after t0, which wait 80 ms.
        for k in 0..200u64 {
            let sent = 1_000_000 + k * 10_000;
            let took = if (50..70).contains(&k) { 80_000 } else { 500 };
            a.record(sent, sent + took);
        }
        let mut b = Latencies::default();
        b.record(1_000_000 + 1_500_000, 1_000_000 + 1_500_000 + 60_000);
        a.add(&b).unwrap();
        let t = a.timeline(1_000_000);
        assert_eq!(t.worst_ms.len(), 20);
        assert_eq!(t.worst_ms[0], 0.5);
        let at: Vec<f64> = t.stalls.iter().map(|s| s.at_secs).collect();
        assert_eq!(at, [0.5, 0.6, 1.5]);
        assert_eq!(t.stalls[0].worst_ms, 80.0);
        assert!(
            t.describe()
                .starts_with("3 window(s) over 50 ms, worst 80.0 ms at 0.5 s"),
            "{}",
            t.describe()
        );
        assert_eq!(a.histogram.len(), 201);
        // Second 0 of the timeline (1-2 s on the clock): 20 of its 100
        // messages waited 80 ms; second 1: one of 101 waited 60 ms.
        assert_eq!(t.p50_ms_per_sec.len(), 2);
        assert!(
            (t.p50_ms_per_sec[0] - 0.5).abs() < 0.06,
            "{:?}",
            t.p50_ms_per_sec
        );
        assert!(
            (t.p99_ms_per_sec[0] - 80.0).abs() < 8.0,
            "{:?}",
            t.p99_ms_per_sec
        );
        assert!(
            (t.p99_ms_per_sec[1] - 0.5).abs() < 0.06,
            "{:?}",
            t.p99_ms_per_sec
        );
    }
}
