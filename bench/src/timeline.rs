//! Latency as it happened over time: besides the histogram of a run, the
//! worst latency of the messages sent in each 100 ms window, so a stall (a
//! window whose worst message waited over 50 ms) shows when it happened and
//! how long it lasted, instead of vanishing into a percentile.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::scenario::histogram;

/// Width of a timeline window, µs.
pub const WINDOW_US: u64 = 100_000;

/// A window whose worst latency is above this is a stall, ms.
pub const STALL_MS: f64 = 50.0;

/// The latencies of one stream of messages (a publisher's acks, a
/// consumer's deliveries), merged over streams by [`Latencies::add`].
#[derive(Debug, Clone)]
pub struct Latencies {
    /// Every latency, µs.
    pub histogram: Histogram<u64>,
    /// Worst latency, µs, of the messages sent in window `i`
    /// (`[i * WINDOW_US, (i + 1) * WINDOW_US)` on the run's clock).
    worst: Vec<u32>,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            histogram: histogram(),
            worst: Vec::new(),
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
        Timeline {
            window_ms: WINDOW_US / 1000,
            worst_ms,
            stalls,
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
    }
}
