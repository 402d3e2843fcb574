//! The broker's memory and CPU, read once a second while a run goes: a
//! soak must show that RSS levels off after warm-up, which a reading after
//! the run cannot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report::{cpu_secs, Memory};

/// How often the broker is read.
const EVERY: Duration = Duration::from_secs(1);

/// One reading.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BrokerSample {
    /// Seconds since sampling began (just before the run connected).
    pub at_secs: f64,
    /// Resident set size, MiB.
    pub rss_mib: f64,
    /// CPU time used in the second before, all threads, in cores (1.0: one
    /// core busy for the whole second).
    pub cpu_cores: f64,
}

/// Whether RSS kept growing after warm-up.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RssTrend {
    /// Seconds of the run taken as warm-up (`--warm-up`).
    pub warm_up_secs: f64,
    /// RSS at the end of warm-up, MiB.
    pub after_warm_up_mib: f64,
    /// RSS at the last reading, MiB.
    pub end_mib: f64,
    /// Highest RSS after warm-up, MiB.
    pub max_mib: f64,
    /// Least-squares slope of RSS over the readings after warm-up, MiB per
    /// minute: near 0 when memory is bounded.
    pub slope_mib_per_min: f64,
}

impl RssTrend {
    /// The trend of `samples` after `warm_up`; `None` with fewer than two
    /// readings after it.
    pub fn of(samples: &[BrokerSample], warm_up: Duration) -> Option<RssTrend> {
        let w = warm_up.as_secs_f64();
        let after: Vec<&BrokerSample> = samples.iter().filter(|s| s.at_secs >= w).collect();
        if after.len() < 2 {
            return None;
        }
        let n = after.len() as f64;
        let mean_t = after.iter().map(|s| s.at_secs).sum::<f64>() / n;
        let mean_r = after.iter().map(|s| s.rss_mib).sum::<f64>() / n;
        let (mut num, mut den) = (0.0, 0.0);
        for s in &after {
            num += (s.at_secs - mean_t) * (s.rss_mib - mean_r);
            den += (s.at_secs - mean_t).powi(2);
        }
        Some(RssTrend {
            warm_up_secs: w,
            after_warm_up_mib: after[0].rss_mib,
            end_mib: after[after.len() - 1].rss_mib,
            max_mib: after.iter().map(|s| s.rss_mib).fold(0.0, f64::max),
            slope_mib_per_min: if den > 0.0 { num / den * 60.0 } else { 0.0 },
        })
    }
}

/// Reads the broker on a thread of its own until stopped.
pub struct BrokerSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<BrokerSample>>,
}

impl BrokerSampler {
    /// Starts reading `pid`.
    pub fn start(pid: u32) -> BrokerSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut samples = Vec::new();
            let mut last_cpu = cpu_secs(pid);
            let mut next = start + EVERY;
            while !flag.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(100)));
                    continue;
                }
                next += EVERY;
                let (Some(memory), Some(cpu)) = (Memory::of(pid), cpu_secs(pid)) else {
                    break; // the broker is gone
                };
                samples.push(BrokerSample {
                    at_secs: (now - start).as_secs_f64(),
                    rss_mib: memory.rss_mib,
                    cpu_cores: last_cpu.map_or(0.0, |c| (cpu - c) / EVERY.as_secs_f64()),
                });
                last_cpu = Some(cpu);
            }
            samples
        });
        BrokerSampler { stop, thread }
    }

    /// Stops reading and returns the readings.
    pub fn finish(self) -> Vec<BrokerSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64, rss: f64) -> BrokerSample {
        BrokerSample {
            at_secs: t,
            rss_mib: rss,
            cpu_cores: 0.0,
        }
    }

    #[test]
    fn growth_during_warm_up_is_not_a_trend_but_growth_after_it_is() {
        // 10 MiB a second for 30 s, then flat.
        let flat: Vec<BrokerSample> = (0..120)
            .map(|t| at(t as f64, 100.0 + 10.0 * (t.min(30)) as f64))
            .collect();
        let t = RssTrend::of(&flat, Duration::from_secs(30)).unwrap();
        assert_eq!(t.after_warm_up_mib, 400.0);
        assert_eq!(t.max_mib, 400.0);
        assert!(t.slope_mib_per_min.abs() < 1e-9);
        // 1 MiB a second throughout: 60 MiB a minute.
        let leak: Vec<BrokerSample> = (0..120).map(|t| at(t as f64, t as f64)).collect();
        let t = RssTrend::of(&leak, Duration::from_secs(30)).unwrap();
        assert!((t.slope_mib_per_min - 60.0).abs() < 1e-6);
        assert!(RssTrend::of(&leak, Duration::from_secs(119)).is_none());
    }
}
