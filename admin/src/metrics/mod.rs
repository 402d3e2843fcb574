//! `/metrics`: the Prometheus text exposition format (version 0.0.4),
//! written by hand: names start with `ciphermq_`, counters end in `_total`,
//! latency histograms in `_seconds`, and per-shard series carry a
//! `shard="N"` label. Per-queue series (`queue` label, a name clients
//! choose) are exported only with `admin.queue_metrics`, for at most
//! `admin.max_queue_series` queues, so clients cannot grow a scraper's
//! cardinality without bound.

//!
//! Map: [`broker`] (identity, readiness, the process, TLS expiry),
//! [`shards`] (every per-shard family), [`storage`] (device health, damage
//! found at start, free space, backlog reads), [`queues`] (the memory
//! budget, per-queue series), [`bridge`] (the Postgres bridge), [`admin`]
//! (the admin endpoint's own connections).

mod admin;
mod bridge;
mod broker;
mod queues;
mod shards;
mod storage;
#[cfg(test)]
mod tests;

use std::fmt::Write;

use crate::config::QueueSeries;
use crate::endpoint::AdminContext;
use crate::slots::SlotStats;
use crate::status;
use ciphermq_stats::HistogramSnapshot;

/// A metric family's type, as the `# TYPE` line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Builds an exposition text. Writing into a `String` cannot fail, so the
/// `fmt::Result`s are dropped.
#[derive(Debug, Default)]
pub(crate) struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample line.
    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", format_value(value));
    }

    /// One integer sample line (counters, counts).
    pub(crate) fn sample_u64(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// A histogram's `_bucket` (cumulative, with `le`), `_sum` (seconds)
    /// and `_count` lines.
    pub(crate) fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0u64;
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = match h.bounds_us.get(i) {
                Some(&us) => format_value(us as f64 / 1e6),
                None => "+Inf".to_owned(),
            };
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", format_value(h.sum_us as f64 / 1e6));
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {cumulative}");
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (key, value) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            if !first {
                self.out.push(',');
            }
            first = false;
            let _ = write!(self.out, "{key}=\"{}\"", escape_label(value));
        }
        self.out.push('}');
    }

    /// The finished text.
    pub(crate) fn finish(self) -> String {
        self.out
    }
}

/// Label values escape `\`, `"` and newlines.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help text escapes `\` and newlines.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Numbers as Prometheus reads them (`+Inf`, `-Inf`, `NaN` spelled out).
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

/// The whole `/metrics` text; `admin` is the endpoint's own connections,
/// `queue_series` what to export per queue (`admin.queue_metrics`,
/// `admin.max_queue_series`).
pub(crate) fn render(ctx: &AdminContext, admin: &SlotStats, queue_series: QueueSeries) -> String {
    let mut e = Exposition::default();
    let stats = ctx.broker.stats();
    let bridge = ctx.bridge.as_ref().map(|b| b.status());
    let readiness = status::readiness(stats, bridge.as_ref());
    broker::broker_series(&mut e, ctx, stats, readiness.ready);
    shards::shard_series(&mut e, stats.shards());
    storage::storage_series(&mut e, stats);
    let queues = status::queues(ctx);
    queues::memory_series(&mut e, ctx, stats, &queues);
    storage::backlog_series(&mut e, stats.shards());
    queues::queue_series(&mut e, &queues, queue_series);
    if let Some(b) = &bridge {
        bridge::bridge_metrics(&mut e, b);
    }
    if let Some(cluster) = ctx.broker.cluster() {
        crate::cluster_status::metrics(&mut e, &cluster);
    }
    admin::admin_metrics(&mut e, admin);
    e.finish()
}
