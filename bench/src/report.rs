//! Turning outcomes into results: rates, latency quantiles, medians over runs,
//! ratios between brokers, the printed table and the JSON file.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::args::{ExchangeArg, LoadArgs, PayloadArg};
use crate::broker_sampler::{BrokerSample, RssTrend};
use crate::placement::Stream;
use crate::scenario::Outcome;
use crate::timeline::Timeline;

/// Latency quantiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Quantiles {
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest value seen.
    pub max_ms: f64,
}

impl Quantiles {
    /// The quantiles of a histogram of microseconds (zeros when empty).
    pub fn of(h: &Histogram<u64>) -> Quantiles {
        if h.is_empty() {
            return Quantiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Quantiles {
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }

    /// Field by field median.
    pub fn median(all: &[Quantiles]) -> Quantiles {
        let m = |f: fn(&Quantiles) -> f64| median(all.iter().map(f).collect());
        Quantiles {
            p50_ms: m(|q| q.p50_ms),
            p90_ms: m(|q| q.p90_ms),
            p99_ms: m(|q| q.p99_ms),
            p999_ms: m(|q| q.p999_ms),
            max_ms: m(|q| q.max_ms),
        }
    }
}

/// Broker memory read from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Memory {
    /// Resident set size now, MiB.
    pub rss_mib: f64,
    /// Peak resident set size of the process so far, MiB.
    pub peak_rss_mib: f64,
}

impl Memory {
    /// Reads `VmRSS` and `VmHWM` of `pid`; `None` if the process is gone.
    pub fn of(pid: u32) -> Option<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |key: &str| -> Option<f64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line[key.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        };
        Some(Memory {
            rss_mib: kib("VmRSS:")? / 1024.0,
            peak_rss_mib: kib("VmHWM:")? / 1024.0,
        })
    }
}

/// CPU time the process `pid` has used so far (user + system, all its
/// threads), seconds; `None` if it is gone. `/proc` counts it in USER_HZ
/// ticks, 100 a second on Linux.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// One thread's scheduler figures, from a `schedstat` file of `/proc`:
/// nanoseconds on a CPU, and nanoseconds ready to run but waiting for one.
/// `None` when it cannot be read.
pub fn schedstat(path: impl AsRef<std::path::Path>) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut ns = text.split_whitespace().map(str::parse::<u64>);
    Some((ns.next()?.ok()?, ns.next()?.ok()?))
}

/// Time the threads of process `pid` have spent ready to run but waiting
/// for a CPU, summed, in seconds (each `/proc/<pid>/task/<tid>/schedstat`);
/// `None` if the process is gone or the kernel keeps no such figures. A
/// thread that ended in between is missed, which the broker's threads,
/// living as long as it does, never do.
pub fn cpu_wait_secs(pid: u32) -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        // A thread that ended since the listing has no file any more: it
        // is missed, not a reason to read nothing.
        if let Some((_, waited)) = task
            .ok()
            .and_then(|t| schedstat(t.path().join("schedstat")))
        {
            ns += waited;
        }
    }
    Some(ns as f64 / 1e9)
}

/// The scenario, as recorded with every result.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioInfo {
    /// Free text from `--label`.
    pub label: String,
    /// Publisher connections.
    pub publishers: usize,
    /// Consumer connections.
    pub consumers: usize,
    /// Queues.
    pub queues: usize,
    /// Exchange type.
    pub exchange: ExchangeArg,
    /// Body size, bytes.
    pub size_bytes: usize,
    /// How bodies were made.
    pub payload: PayloadArg,
    /// Publish window per publisher.
    pub window: usize,
    /// Prefetch per consumer.
    pub prefetch: u32,
    /// Fixed rate (msg/s), or none for as fast as the window allows.
    pub rate: Option<f64>,
    /// Time bound, seconds.
    pub duration_secs: Option<f64>,
    /// Message cap.
    pub total: Option<u64>,
}

impl ScenarioInfo {
    /// From the command line.
    pub fn new(args: &LoadArgs) -> ScenarioInfo {
        ScenarioInfo {
            label: args.label.clone(),
            publishers: args.publishers,
            consumers: args.consumers,
            queues: args.queues,
            exchange: args.exchange,
            size_bytes: args.size,
            payload: args.payload,
            window: args.window,
            prefetch: args.prefetch,
            rate: args.rate,
            duration_secs: args.duration.map(|d| d.as_secs_f64()),
            total: args.total(),
        }
    }
}

/// One run of one target.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// `ciphermq`, `rabbitmq` or `nats`.
    pub target: &'static str,
    /// 1-based run number.
    pub run: usize,
    /// Publishes sent.
    pub count: u64,
    /// Publishes acknowledged.
    pub acked: u64,
    /// Publishes refused.
    pub nacked: u64,
    /// Deliveries received and acknowledged.
    pub delivered: u64,
    /// Deliveries expected (acked × queues reached; 0 without consumers).
    pub expected_deliveries: u64,
    /// Deliveries left over from earlier runs (not counted).
    pub foreign_deliveries: u64,
    /// Live mode: deliveries that did not decrypt (should be 0).
    pub undecryptable: u64,
    /// From the first publish to the last acknowledgement, seconds.
    pub publish_secs: f64,
    /// From the first publish (with `--consume-backlog`: from the
    /// consumers' start) to the last delivery, seconds.
    pub consume_secs: f64,
    /// Acknowledged publishes per second.
    pub publish_msgs_per_sec: f64,
    /// Acknowledged body bytes per second, MB (10^6 bytes).
    pub publish_mb_per_sec: f64,
    /// Deliveries per second.
    pub consume_msgs_per_sec: f64,
    /// Delivered body bytes per second, MB.
    pub consume_mb_per_sec: f64,
    /// Publish → acknowledgement latency (from the scheduled time at a fixed rate).
    pub publish_to_ack: Quantiles,
    /// Publish → delivery latency (same origin).
    pub publish_to_delivery: Quantiles,
    /// From the same origin to the publisher handing the message to its
    /// connection: the load generator's own lateness (a full `--window`, or
    /// no core free), part of both latencies above (CipherMQ's publisher
    /// only).
    pub publish_send_lag: Option<Quantiles>,
    /// Worst publish → acknowledgement latency per 100 ms, and the stalls.
    pub ack_timeline: Timeline,
    /// Worst publish → delivery latency per 100 ms, and the stalls.
    pub delivery_timeline: Timeline,
    /// Broker memory after the run (CipherMQ with `--broker-pid`).
    pub broker_memory: Option<Memory>,
    /// Broker CPU time over the run (connect and drain included) per
    /// acknowledged publish, µs: its publish, delivery and ack together
    /// (CipherMQ with `--broker-pid`; 10 ms resolution of the total).
    pub broker_cpu_us_per_msg: Option<f64>,
    /// This load generator's own CPU time over the run per acknowledged
    /// publish, µs: its publishers and consumers, their client library
    /// and its bookkeeping, for every target (10 ms resolution). On a
    /// small machine it is taken from the broker's share.
    pub client_cpu_us_per_msg: Option<f64>,
    /// Seconds the broker's threads spent ready to run but waiting for a
    /// CPU, per second of the run (all threads summed; CipherMQ with
    /// `--broker-pid`): how much of the tail is the machine's cores being
    /// taken, by this load generator among others.
    pub broker_cpu_wait_per_sec: Option<f64>,
    /// The machine's 1-minute load average after the run: above the core
    /// count, something else competed for the CPU.
    pub load_average: Option<f64>,
    /// Broker RSS and CPU every second of the run (CipherMQ with
    /// `--broker-pid`).
    pub broker_timeline: Vec<BrokerSample>,
    /// Whether broker RSS grew after `--warm-up`.
    pub rss_trend: Option<RssTrend>,
    /// Where the receiver's stream connected (CipherMQ): the node a
    /// cluster's seeds located it on, or the broker of `--addr`.
    pub stream: Option<Stream>,
}

impl RunResult {
    /// Rates and quantiles of one outcome.
    pub fn new(target: &'static str, run: usize, size: usize, o: &Outcome) -> RunResult {
        let secs = |end_us: u64| end_us.saturating_sub(o.t0_us) as f64 / 1e6;
        let publish_secs = secs(o.last_ack_us);
        let consume_secs = o.last_delivery_us.saturating_sub(o.consume_t0_us) as f64 / 1e6;
        let per_sec = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let publish = per_sec(o.acked, publish_secs);
        let consume = per_sec(o.delivered, consume_secs);
        RunResult {
            target,
            run,
            count: o.sent,
            acked: o.acked,
            nacked: o.nacked,
            delivered: o.delivered,
            expected_deliveries: o.expected,
            foreign_deliveries: o.foreign,
            undecryptable: o.undecryptable,
            publish_secs,
            consume_secs,
            publish_msgs_per_sec: publish,
            publish_mb_per_sec: publish * size as f64 / 1e6,
            consume_msgs_per_sec: consume,
            consume_mb_per_sec: consume * size as f64 / 1e6,
            publish_to_ack: Quantiles::of(&o.ack_latency.histogram),
            publish_to_delivery: Quantiles::of(&o.e2e_latency.histogram),
            publish_send_lag: (!o.send_lag.is_empty()).then(|| Quantiles::of(&o.send_lag)),
            ack_timeline: o.ack_latency.timeline(o.t0_us),
            delivery_timeline: o.e2e_latency.timeline(o.t0_us),
            broker_memory: None,
            broker_cpu_us_per_msg: None,
            client_cpu_us_per_msg: None,
            broker_cpu_wait_per_sec: None,
            load_average: load_average(),
            broker_timeline: Vec::new(),
            rss_trend: None,
            stream: None,
        }
    }

    /// One line for the terminal.
    pub fn line(&self, runs: usize) -> String {
        format!(
            "{:<8} run {}/{}: publish {} msg/s ({:.1} MB/s), consume {} msg/s; ack p50 {} p99 {} ms; e2e p50 {} p99 {} ms{}{}",
            self.target,
            self.run,
            runs,
            thousands(self.publish_msgs_per_sec),
            self.publish_mb_per_sec,
            thousands(self.consume_msgs_per_sec),
            ms(self.publish_to_ack.p50_ms),
            ms(self.publish_to_ack.p99_ms),
            ms(self.publish_to_delivery.p50_ms),
            ms(self.publish_to_delivery.p99_ms),
            if self.nacked > 0
                || self.delivered < self.expected_deliveries
                || self.undecryptable > 0
            {
                format!(
                    " [nacked {}, delivered {} of {}, undecryptable {}]",
                    self.nacked, self.delivered, self.expected_deliveries, self.undecryptable
                )
            } else {
                String::new()
            },
            self.broker_memory
                .map(|m| format!("; broker RSS {:.0} MiB", m.rss_mib))
                .unwrap_or_default()
                + &self
                    .broker_cpu_us_per_msg
                    .map(|us| format!(", CPU {us:.1} µs/msg"))
                    .unwrap_or_default()
                + &self
                    .client_cpu_us_per_msg
                    .map(|us| format!(", client CPU {us:.1} µs/msg"))
                    .unwrap_or_default()
                + &self
                    .broker_cpu_wait_per_sec
                    .map(|w| format!(", waited for a CPU {w:.2} s/s"))
                    .unwrap_or_default(),
        ) + &self
            .publish_send_lag
            .map(|q| format!("; sent late p99 {} ms", ms(q.p99_ms)))
            .unwrap_or_default()
            + &self
                .load_average
                .map(|l| format!("; load {l:.1}"))
                .unwrap_or_default()
            + &self
                .rss_trend
                .map(|t| {
                    format!(
                        "; RSS after warm-up {:.0} → {:.0} MiB ({:+.2} MiB/min)",
                        t.after_warm_up_mib, t.end_mib, t.slope_mib_per_min
                    )
                })
                .unwrap_or_default()
            + &self.stall_note()
    }

    /// "; stalls: …" when a 100 ms window's worst latency was over 50 ms.
    fn stall_note(&self) -> String {
        let (a, d) = (&self.ack_timeline, &self.delivery_timeline);
        if a.stalls.is_empty() && d.stalls.is_empty() {
            return String::new();
        }
        format!("; STALLS ack: {}, delivery: {}", a.describe(), d.describe())
    }
}

/// Medians of one target's runs.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Runs summarised.
    pub runs: usize,
    /// Median publish rate, msg/s.
    pub publish_msgs_per_sec: f64,
    /// Median publish rate, MB/s.
    pub publish_mb_per_sec: f64,
    /// Median consume rate, msg/s.
    pub consume_msgs_per_sec: f64,
    /// Median consume rate, MB/s.
    pub consume_mb_per_sec: f64,
    /// Field-by-field medians of publish → acknowledgement latency.
    pub publish_to_ack: Quantiles,
    /// Field-by-field medians of publish → delivery latency.
    pub publish_to_delivery: Quantiles,
    /// Median broker RSS after a run, MiB (when measured).
    pub broker_rss_mib: Option<f64>,
    /// Median broker CPU per acknowledged publish, µs (when measured).
    pub broker_cpu_us_per_msg: Option<f64>,
    /// Median CPU of this load generator per acknowledged publish, µs.
    pub client_cpu_us_per_msg: Option<f64>,
    /// Whether every run had every publish acknowledged and every delivery received.
    pub complete: bool,
}

impl Summary {
    /// Medians of `runs` (all of one target).
    pub fn of(runs: &[&RunResult]) -> Summary {
        let m = |f: fn(&RunResult) -> f64| median(runs.iter().map(|r| f(r)).collect());
        let rss: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.broker_memory.map(|m| m.rss_mib))
            .collect();
        let measured = |f: fn(&RunResult) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(|r| f(r)).collect();
            (!v.is_empty()).then(|| median(v))
        };
        Summary {
            runs: runs.len(),
            publish_msgs_per_sec: m(|r| r.publish_msgs_per_sec),
            publish_mb_per_sec: m(|r| r.publish_mb_per_sec),
            consume_msgs_per_sec: m(|r| r.consume_msgs_per_sec),
            consume_mb_per_sec: m(|r| r.consume_mb_per_sec),
            publish_to_ack: Quantiles::median(
                &runs.iter().map(|r| r.publish_to_ack).collect::<Vec<_>>(),
            ),
            publish_to_delivery: Quantiles::median(
                &runs
                    .iter()
                    .map(|r| r.publish_to_delivery)
                    .collect::<Vec<_>>(),
            ),
            broker_rss_mib: (!rss.is_empty()).then(|| median(rss)),
            broker_cpu_us_per_msg: measured(|r| r.broker_cpu_us_per_msg),
            client_cpu_us_per_msg: measured(|r| r.client_cpu_us_per_msg),
            complete: runs.iter().all(|r| {
                r.nacked == 0 && r.delivered >= r.expected_deliveries && r.undecryptable == 0
            }),
        }
    }
}

/// CipherMQ's medians divided by another broker's.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// Publish msg/s ratio (higher: CipherMQ faster).
    pub publish: f64,
    /// Consume msg/s ratio (higher: CipherMQ faster).
    pub consume: f64,
    /// Publish → ack p99 ratio (lower: CipherMQ faster).
    pub ack_p99: f64,
    /// Publish → delivery p99 ratio (lower: CipherMQ faster).
    pub e2e_p99: f64,
}

impl Ratio {
    fn of(c: &Summary, other: &Summary) -> Ratio {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        Ratio {
            publish: div(c.publish_msgs_per_sec, other.publish_msgs_per_sec),
            consume: div(c.consume_msgs_per_sec, other.consume_msgs_per_sec),
            ack_p99: div(c.publish_to_ack.p99_ms, other.publish_to_ack.p99_ms),
            e2e_p99: div(
                c.publish_to_delivery.p99_ms,
                other.publish_to_delivery.p99_ms,
            ),
        }
    }
}

/// Everything one invocation measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The scenario.
    pub scenario: ScenarioInfo,
    /// The command line that reproduces it.
    pub command: String,
    /// Every run, in the order they ran.
    pub runs: Vec<RunResult>,
    /// Medians per target.
    pub summary: BTreeMap<&'static str, Summary>,
    /// `ciphermq_vs_rabbitmq`, `ciphermq_vs_nats` when both sides ran.
    pub ratios: BTreeMap<String, Ratio>,
}

impl Report {
    /// Summaries and ratios of `runs`.
    pub fn new(args: &LoadArgs, command: String, runs: Vec<RunResult>) -> Report {
        let mut summary = BTreeMap::new();
        for target in ["ciphermq", "rabbitmq", "nats"] {
            let mine: Vec<&RunResult> = runs.iter().filter(|r| r.target == target).collect();
            if !mine.is_empty() {
                summary.insert(target, Summary::of(&mine));
            }
        }
        let mut ratios = BTreeMap::new();
        if let Some(c) = summary.get("ciphermq") {
            for other in ["rabbitmq", "nats"] {
                if let Some(o) = summary.get(other) {
                    ratios.insert(format!("ciphermq_vs_{other}"), Ratio::of(c, o));
                }
            }
        }
        Report {
            scenario: ScenarioInfo::new(args),
            command,
            runs,
            summary,
            ratios,
        }
    }

    /// The JSON written by `--json`. With a single run, that run's fields are
    /// also at the top level (`acked`, `delivered`, `publish_msgs_per_sec`, …),
    /// which is what `scripts/demo.sh` reads.
    pub fn to_json(&self) -> serde_json::Result<serde_json::Value> {
        let mut value = serde_json::to_value(self)?;
        if let ([only], Some(obj)) = (self.runs.as_slice(), value.as_object_mut()) {
            if let serde_json::Value::Object(fields) = serde_json::to_value(only)? {
                for (k, v) in fields {
                    obj.entry(k).or_insert(v);
                }
            }
        }
        Ok(value)
    }

    /// The summary table and ratios, for the terminal.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let s = &self.scenario;
        out.push_str(&format!(
            "\n{} publisher(s), {} consumer(s), {} queue(s), {}, {} B bodies, window {}, prefetch {}, {}{}\n",
            s.publishers,
            s.consumers,
            s.queues,
            s.exchange.as_str(),
            s.size_bytes,
            s.window,
            s.prefetch,
            match s.rate {
                Some(r) => format!("fixed rate {} msg/s", thousands(r)),
                None => "max rate".to_owned(),
            },
            if s.label.is_empty() {
                String::new()
            } else {
                format!(" [{}]", s.label)
            },
        ));
        out.push_str(&format!(
            "{:<9} {:>4} {:>12} {:>8} {:>12} {:>22} {:>22} {:>8}\n",
            "target",
            "runs",
            "publish/s",
            "MB/s",
            "consume/s",
            "ack p50/p99/p99.9 ms",
            "e2e p50/p99/p99.9 ms",
            "RSS MiB"
        ));
        for (target, m) in &self.summary {
            let q = |q: &Quantiles| format!("{}/{}/{}", ms(q.p50_ms), ms(q.p99_ms), ms(q.p999_ms));
            out.push_str(&format!(
                "{:<9} {:>4} {:>12} {:>8.1} {:>12} {:>22} {:>22} {:>8}{}\n",
                target,
                m.runs,
                thousands(m.publish_msgs_per_sec),
                m.publish_mb_per_sec,
                thousands(m.consume_msgs_per_sec),
                q(&m.publish_to_ack),
                q(&m.publish_to_delivery),
                m.broker_rss_mib
                    .map(|r| format!("{r:.0}"))
                    .unwrap_or_else(|| "-".into()),
                if m.complete { "" } else { "  (incomplete)" },
            ));
        }
        for (name, r) in &self.ratios {
            out.push_str(&format!(
                "{name}: publish {:.2}x, consume {:.2}x, ack p99 {:.2}x, e2e p99 {:.2}x (latency: lower is better)\n",
                r.publish, r.consume, r.ack_p99, r.e2e_p99
            ));
        }
        out
    }
}

/// The 1-minute load average from `/proc/loadavg`.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The median (mean of the middle two for an even count); 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `123456.7` → `123,457`.
pub fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds with precision that suits their size.
fn ms(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1234.0), "1,234");
        assert_eq!(thousands(17_700.2), "17,700");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn cpu_wait_grows_when_threads_outnumber_the_cores() {
        let me = std::process::id();
        let before = cpu_wait_secs(me).expect("this kernel keeps schedstat");
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        // Twice as many spinning threads as cores, for 300 ms: half of them
        // wait at any moment, so together they wait about 300 ms per core.
        // They are still alive when the process is read.
        let go = std::sync::Arc::new(std::sync::Barrier::new(2 * cores + 1));
        let spinners: Vec<_> = (0..2 * cores)
            .map(|_| {
                let go = go.clone();
                std::thread::spawn(move || {
                    let started = std::time::Instant::now();
                    while started.elapsed() < std::time::Duration::from_millis(300) {
                        std::hint::spin_loop();
                    }
                    go.wait();
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(400));
        let after = cpu_wait_secs(me).expect("still readable");
        go.wait();
        spinners.into_iter().for_each(|t| t.join().unwrap());
        assert!(after - before >= 0.05, "waited {:.3} s", after - before);
        assert_eq!(cpu_wait_secs(u32::MAX), None);
    }

    #[test]
    fn quantiles_come_out_in_milliseconds() {
        let mut h = crate::scenario::histogram();
        for us in 1..=1000 {
            h.record(us * 10).unwrap();
        }
        let q = Quantiles::of(&h);
        assert!((q.p50_ms - 5.0).abs() < 0.01, "{q:?}");
        assert!((q.max_ms - 10.0).abs() < 0.01, "{q:?}");
        assert_eq!(Quantiles::of(&crate::scenario::histogram()).p99_ms, 0.0);
    }
}
