//! `/metrics`: the Prometheus text exposition format (version 0.0.4),
//! written by hand: names start with `ciphermq_`, counters end in `_total`,
//! latency histograms in `_seconds`, and per-shard series carry a
//! `shard="N"` label. Per-queue series (`queue` label, a name clients
//! choose) are exported only with `admin.queue_metrics`, for at most
//! `admin.max_queue_series` queues, so clients cannot grow a scraper's
//! cardinality without bound.

use std::fmt::Write;

use ciphermq_pgbridge::BridgeStatus;
use ciphermq_shard::shard::BacklogReads;

use crate::broker_view::TlsExpiries;
use crate::config::QueueSeries;
use crate::endpoint::AdminContext;
use crate::slots::{Cap, SlotStats};
use crate::status;
use ciphermq_stats::{HistogramSnapshot, ReasonCounters, ShardStats, ShardThread};

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

/// A per-shard counter family.
fn shard_counter(
    e: &mut Exposition,
    shards: &[std::sync::Arc<ShardStats>],
    name: &str,
    help: &str,
    get: impl Fn(&ShardStats) -> u64,
) {
    e.family(name, Kind::Counter, help);
    for s in shards {
        let shard = s.shard.to_string();
        e.sample_u64(name, &[("shard", &shard)], get(s));
    }
}

/// The process's own numbers (`process.rs`); a figure that could not be
/// read is left out.
fn process_series(e: &mut Exposition, p: &crate::process::ProcessStats) {
    let gauges: [(&str, Kind, &str, Option<f64>); 6] = [
        (
            "ciphermq_process_cpu_seconds_total",
            Kind::Counter,
            "User and system CPU time of the broker process.",
            p.cpu_seconds,
        ),
        (
            "ciphermq_process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory of the broker process.",
            p.resident_bytes.map(|b| b as f64),
        ),
        (
            "ciphermq_process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory of the broker process.",
            p.virtual_bytes.map(|b| b as f64),
        ),
        (
            "ciphermq_process_open_fds",
            Kind::Gauge,
            "Open file descriptors (connections, segment files, sockets).",
            p.open_fds.map(|n| n as f64),
        ),
        (
            "ciphermq_process_max_fds",
            Kind::Gauge,
            "The soft limit on open file descriptors.",
            p.max_fds.map(|n| n as f64),
        ),
        (
            "ciphermq_process_start_time_seconds",
            Kind::Gauge,
            "When the broker process started, in seconds since the Unix epoch.",
            p.start_time_seconds,
        ),
    ];
    for (name, kind, help, value) in gauges {
        if let Some(value) = value {
            e.family(name, kind, help);
            e.sample(name, &[], value);
        }
    }
}

/// Seconds until each TLS certificate in force expires (negative once it
/// has), and until the CRLs' next update.
fn certificate_series(e: &mut Exposition, expiries: &TlsExpiries, now: i64) {
    let certificates: Vec<_> = [("server", expiries.server), ("ca", expiries.ca)]
        .into_iter()
        .filter_map(|(name, t)| Some((name, t?)))
        .collect();
    if !certificates.is_empty() {
        let name = "ciphermq_tls_certificate_expiry_seconds";
        e.family(
            name,
            Kind::Gauge,
            "Seconds until a TLS certificate in force expires (reloaded on SIGHUP): certificate=\"server\" (tls.cert_path), \"ca\" (the earliest of tls.ca_cert_path).",
        );
        for (certificate, not_after) in certificates {
            e.sample(
                name,
                &[("certificate", certificate)],
                (not_after - now) as f64,
            );
        }
    }
    if let Some(next_update) = expiries.crl_next_update {
        let name = "ciphermq_tls_crl_next_update_seconds";
        e.family(
            name,
            Kind::Gauge,
            "Seconds until the earliest nextUpdate of the CRLs of tls.crl_path (negative: past due; the CRL still applies).",
        );
        e.sample(name, &[], (next_update - now) as f64);
    }
}

fn unix_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A per-shard counter family with a `reason` label from a fixed set
/// (every reason is shown, zeros included, so a rate over it is defined).
fn shard_reason_counter(
    e: &mut Exposition,
    shards: &[std::sync::Arc<ShardStats>],
    name: &str,
    help: &str,
    get: impl Fn(&ShardStats) -> &ReasonCounters,
) {
    e.family(name, Kind::Counter, help);
    for s in shards {
        let shard = s.shard.to_string();
        for (reason, n) in get(s).by_reason() {
            e.sample_u64(name, &[("shard", &shard), ("reason", reason)], n);
        }
    }
}

/// A per-shard histogram family.
fn shard_histogram(
    e: &mut Exposition,
    shards: &[std::sync::Arc<ShardStats>],
    name: &str,
    help: &str,
    get: impl Fn(&ShardStats) -> HistogramSnapshot,
) {
    e.family(name, Kind::Histogram, help);
    for s in shards {
        let shard = s.shard.to_string();
        e.histogram(name, &[("shard", &shard)], &get(s));
    }
}

/// Each shard thread's time on a CPU and time ready but waiting for one
/// (`thread_sched.rs`); a thread not known yet, or whose figures cannot be
/// read, is left out.
fn shard_thread_series(e: &mut Exposition, shards: &[std::sync::Arc<ShardStats>]) {
    let read: Vec<_> = shards
        .iter()
        .flat_map(|s| ShardThread::ALL.map(|t| (s, t)))
        .filter_map(|(s, t)| {
            Some((
                s.shard.to_string(),
                t,
                crate::thread_sched::read(s.thread(t)?)?,
            ))
        })
        .collect();
    for (name, help, get) in [
        (
            "ciphermq_shard_thread_cpu_seconds_total",
            "Time a shard's thread ran on a CPU: its executor, or its blocking-I/O thread (log writes and fdatasyncs).",
            (|t| t.on_cpu_ns) as fn(&crate::thread_sched::ThreadSched) -> u64,
        ),
        (
            "ciphermq_shard_thread_cpu_wait_seconds_total",
            "Time a shard's thread was ready to run but waited for a CPU: other work on its cores, not the broker's own steps.",
            |t| t.waiting_ns,
        ),
    ] {
        e.family(name, Kind::Counter, help);
        for (shard, thread, sched) in &read {
            e.sample(
                name,
                &[("shard", shard), ("thread", thread.label())],
                get(sched) as f64 / 1e9,
            );
        }
    }
}

/// A per-queue gauge: name, help, and how to read it from a queue entry.
type QueueGauge = (&'static str, &'static str, fn(&status::QueueEntry) -> u64);

/// Messages a queue holds, ready and unacked: what ranks queues for
/// per-queue series.
fn depth(q: &status::QueueEntry) -> u64 {
    (q.ready as u64).saturating_add(q.unacked as u64)
}

/// The queues that get per-queue series when at most `max` may: the `max`
/// with the most messages (ready and unacked), ties to the name that sorts
/// first, so the same figures always choose the same queues. Returned in
/// name order (the order of `queues`, which `status::queues` sorts), so a
/// scrape lists them as it always has.
fn deepest(queues: &[status::QueueEntry], max: usize) -> Vec<&status::QueueEntry> {
    let mut chosen: Vec<&status::QueueEntry> = queues.iter().collect();
    if chosen.len() > max {
        if max == 0 {
            return Vec::new();
        }
        // Linear, however many queues there are; then only `max` to sort.
        chosen.select_nth_unstable_by(max - 1, |a, b| {
            depth(b).cmp(&depth(a)).then_with(|| a.name.cmp(&b.name))
        });
        chosen.truncate(max);
    }
    chosen.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    chosen
}

/// The whole `/metrics` text; `admin` is the endpoint's own connections,
/// `queue_series` what to export per queue (`admin.queue_metrics`,
/// `admin.max_queue_series`).
pub(crate) fn render(ctx: &AdminContext, admin: &SlotStats, queue_series: QueueSeries) -> String {
    let mut e = Exposition::default();
    let stats = ctx.broker.stats();
    let shards = stats.shards();
    let bridge = ctx.bridge.as_ref().map(|b| b.status());
    let readiness = status::readiness(stats, bridge.as_ref());

    e.family("ciphermq_info", Kind::Gauge, "Broker name and version.");
    e.sample_u64(
        "ciphermq_info",
        &[("name", &ctx.name), ("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    e.family(
        "ciphermq_ready",
        Kind::Gauge,
        "1 when /ready answers 200: listeners bound, logs recovered, storage writing.",
    );
    e.sample_u64("ciphermq_ready", &[], u64::from(readiness.ready));
    e.family(
        "ciphermq_uptime_seconds",
        Kind::Gauge,
        "Seconds since the broker started.",
    );
    e.sample("ciphermq_uptime_seconds", &[], stats.uptime().as_secs_f64());
    e.family("ciphermq_shards", Kind::Gauge, "Shards (pinned executors).");
    e.sample_u64("ciphermq_shards", &[], shards.len() as u64);
    process_series(&mut e, &crate::process::read());
    certificate_series(&mut e, &ctx.broker.tls_expiries(), unix_seconds());

    shard_counter(
        &mut e,
        shards,
        "ciphermq_publishes_total",
        "Publishes answered ACK (durable in every target queue).",
        |s| s.publishes.get(),
    );
    shard_reason_counter(
        &mut e,
        shards,
        "ciphermq_publish_nacks_total",
        "Publishes answered NACK, by the reason the NACK gives.",
        |s| &s.publish_nacks,
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_received_bytes_total",
        "TLS bytes read from client connections after their handshake.",
        |s| s.bytes_received.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_sent_bytes_total",
        "TLS bytes written to client connections after their handshake.",
        |s| s.bytes_sent.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_rate_limited_total",
        "Commands answered Rate limited by the per-CN command bucket (limited publishes are ciphermq_publish_nacks_total{reason=\"rate_limited\"}).",
        |s| s.rate_limited.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_dead_lettered_total",
        "Messages moved to a dead-letter queue ({queue}.dlq) after performance.max_deliveries (refreshed every second).",
        |s| s.dead_lettered(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_acks_total",
        "Deliveries settled by a consumer's ack.",
        |s| s.acks.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_nacks_total",
        "Deliveries requeued by a consumer's nack.",
        |s| s.nacks.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_deliveries_total",
        "Deliveries written to consumers (push and fetch, redeliveries included).",
        |s| s.deliveries.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_connections_accepted_total",
        "Client connections that passed the handshake and the ACL.",
        |s| s.connections_accepted.get(),
    );
    shard_reason_counter(
        &mut e,
        shards,
        "ciphermq_connections_refused_total",
        "Client connections refused after the handshake: unknown_client (CN in no ACL list), connection_limit (per-IP or per-CN cap).",
        |s| &s.connections_refused,
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_tls_handshake_failures_total",
        "Client TLS handshakes that failed or timed out.",
        |s| s.handshake_failures.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_handshakes_refused_total",
        "Connections closed before their handshake: too many handshakes in progress (performance.max_handshakes, max_handshakes_per_ip).",
        |s| s.handshakes_refused.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_fsyncs_total",
        "fdatasync calls on queue logs.",
        |s| s.fsyncs.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_commit_rounds_total",
        "Group-commit rounds.",
        |s| s.commit_rounds.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_commit_failures_total",
        "Group-commit rounds with a failed log write (publishes answered NACK storage).",
        |s| s.commit_failures.get(),
    );
    shard_histogram(
        &mut e,
        shards,
        "ciphermq_publish_ack_seconds",
        "Time from the broker taking up a publish's line to writing its ACK.",
        |s| s.publish_ack_latency.snapshot(),
    );
    shard_histogram(
        &mut e,
        shards,
        "ciphermq_fsync_seconds",
        "Duration of each fdatasync of a queue log.",
        |s| s.fsync_latency.snapshot(),
    );
    shard_histogram(
        &mut e,
        shards,
        "ciphermq_commit_round_seconds",
        "From taking a group-commit round to releasing its answers (writes, fdatasync, directory syncs).",
        |s| s.commit_round_latency.snapshot(),
    );
    shard_histogram(
        &mut e,
        shards,
        "ciphermq_commit_wake_seconds",
        "From a queue log's fdatasync returning to the shard's committer running again: the shard's delay in noticing durable bytes.",
        |s| s.commit_wake_latency.snapshot(),
    );
    shard_histogram(
        &mut e,
        shards,
        "ciphermq_commit_handoff_seconds",
        "From a shard handing a queue log's write to its blocking-I/O thread to that thread starting it: its wake-up, and the writes of other logs queued ahead in the same round.",
        |s| s.commit_handoff_latency.snapshot(),
    );
    shard_histogram(
        &mut e,
        shards,
        "ciphermq_shard_loop_lag_seconds",
        "How late a shard's loop gives a turn asked for every 5 ms: time the thread was held by other work.",
        |s| s.loop_lag.snapshot(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_shard_stalls_total",
        "Shard loop turns that came 20 ms late or more with the shard's thread not waiting for a CPU most of that time (a long step, a blocking call); each is logged with the shard step begun last.",
        |s| s.stalls.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_shard_cpu_starved_total",
        "Shard loop turns that came 20 ms late or more because the shard's thread waited, ready to run, for a CPU most of that time: the host was busy, not the broker.",
        |s| s.cpu_starved.get(),
    );
    shard_counter(
        &mut e,
        shards,
        "ciphermq_reply_holdbacks_total",
        "Times a connection stopped being read because its pending replies held performance.max_pending_reply_bytes (a client not reading what it asked for).",
        |s| s.reply_holdbacks.get(),
    );
    e.family(
        "ciphermq_pending_reply_bytes",
        Kind::Gauge,
        "Bytes the shard's connections hold in replies their clients have not read yet (ids, and the bodies a reply keeps alive); each connection at most performance.max_pending_reply_bytes plus one line's worth.",
    );
    for s in shards {
        let shard = s.shard.to_string();
        e.sample_u64(
            "ciphermq_pending_reply_bytes",
            &[("shard", &shard)],
            s.pending_reply_bytes.get(),
        );
    }
    shard_thread_series(&mut e, shards);
    shard_counter(
        &mut e,
        shards,
        "ciphermq_shard_nudges_total",
        "Times a shard's loop went 10 ms without a turn with its thread asleep, and another thread woke it (its executor can fall asleep with work still to run).",
        |s| s.nudges.get(),
    );

    e.family(
        "ciphermq_connections",
        Kind::Gauge,
        "Open client connections per shard (refreshed every second).",
    );
    for s in shards {
        let shard = s.shard.to_string();
        e.sample_u64(
            "ciphermq_connections",
            &[("shard", &shard)],
            s.open_connections(),
        );
    }
    e.family(
        "ciphermq_storage_healthy",
        Kind::Gauge,
        "1 while no shard's last commit round found the device failing (full, read-only, I/O errors); one queue's own failure is counted in ciphermq_queues_storage_failing instead.",
    );
    e.sample_u64(
        "ciphermq_storage_healthy",
        &[],
        u64::from(stats.storage_errors().is_empty()),
    );
    e.family(
        "ciphermq_queues_storage_failing",
        Kind::Gauge,
        "Queues whose last log write failed for a reason of their own (a name, a permission); /api/queues says why.",
    );
    e.sample_u64(
        "ciphermq_queues_storage_failing",
        &[],
        stats.failing_queues().len() as u64,
    );
    let findings = stats.findings().cloned().unwrap_or_default();
    for (name, help, value) in [
        (
            "ciphermq_storage_quarantined_records_total",
            "Log records found damaged at start and moved to quarantine files (never served).",
            findings.quarantined_records,
        ),
        (
            "ciphermq_storage_quarantined_bytes_total",
            "Bytes of damaged log data moved to quarantine files at start.",
            findings.quarantined_bytes,
        ),
        (
            "ciphermq_storage_torn_tail_bytes_total",
            "Bytes of torn log ends (writes cut short by a crash, never acknowledged) cut at start.",
            findings.torn_bytes,
        ),
    ] {
        e.family(name, Kind::Counter, help);
        e.sample_u64(name, &[], value);
    }
    if let Some(disk) = stats.disk() {
        e.family(
            "ciphermq_disk_free_bytes",
            Kind::Gauge,
            "Free bytes on the data directory's filesystem (looked at every 100 ms).",
        );
        e.sample_u64("ciphermq_disk_free_bytes", &[], disk.free_bytes);
        e.family(
            "ciphermq_disk_min_free_bytes",
            Kind::Gauge,
            "storage.min_free_mb in bytes: below it publishes are answered NACK disk_full.",
        );
        e.sample_u64("ciphermq_disk_min_free_bytes", &[], disk.min_free_bytes);
        e.family(
            "ciphermq_disk_low",
            Kind::Gauge,
            "1 while free space is below the minimum and publishes are refused.",
        );
        e.sample_u64("ciphermq_disk_low", &[], u64::from(disk.low));
    }

    let queues = status::queues(ctx);
    let gauges: [QueueGauge; 8] = [
        (
            "ciphermq_queue_ready",
            "Messages waiting in a queue.",
            |q| q.ready as u64,
        ),
        (
            "ciphermq_queue_unacked",
            "Deliveries of a queue not yet acked.",
            |q| q.unacked as u64,
        ),
        (
            "ciphermq_queue_bytes",
            "Body bytes a queue holds, ready and unacked (performance.max_queue_bytes caps them).",
            |q| q.bytes,
        ),
        (
            "ciphermq_queue_memory_bytes",
            "The part of a queue's body bytes held in memory (past storage.memory_budget_mb the rest is read back from its log).",
            |q| q.memory_bytes,
        ),
        (
            "ciphermq_queue_on_disk",
            "Ready messages of a queue whose bodies are in its log only.",
            |q| q.on_disk,
        ),
        (
            "ciphermq_queue_dedup_ids",
            "Ids a queue remembers for dedup: its messages', and those acked within performance.dedup_window_secs.",
            |q| q.dedup_ids as u64,
        ),
        (
            "ciphermq_queue_consumers",
            "Consumers registered on a queue.",
            |q| q.consumers as u64,
        ),
        (
            "ciphermq_queue_storage_failing",
            "1 while a queue's last log write failed (its publishes are answered NACK storage).",
            |q| u64::from(q.storage_error.is_some()),
        ),
    ];
    e.family(
        "ciphermq_memory_budget_bytes",
        Kind::Gauge,
        "storage.memory_budget_mb in bytes: the bodies all queues may hold in memory (a hard cap in memory mode).",
    );
    e.sample_u64(
        "ciphermq_memory_budget_bytes",
        &[],
        ctx.broker.limits().memory_budget_bytes,
    );
    type ShardSum = (&'static str, &'static str, fn(&status::QueueEntry) -> u64);
    let shard_sums: [ShardSum; 3] = [
        (
            "ciphermq_shard_queued_bytes",
            "Body bytes all queues of a shard hold, ready and unacked.",
            |q| q.bytes,
        ),
        (
            "ciphermq_shard_memory_bytes",
            "Body bytes a shard's queues hold in memory: with 16 bytes for each message on disk (its remembered id), what its part of storage.memory_budget_mb bounds.",
            |q| q.memory_bytes,
        ),
        (
            "ciphermq_shard_dedup_bytes",
            "Heap bytes of the ids a shard's queues remember for dedup (about 15 per id).",
            |q| q.dedup_bytes,
        ),
    ];
    for (name, help, get) in shard_sums {
        e.family(name, Kind::Gauge, help);
        let mut per_shard = vec![0u64; stats.shards().len()];
        for q in &queues {
            if let Some(sum) = per_shard.get_mut(q.shard) {
                *sum += get(q);
            }
        }
        for (shard, bytes) in per_shard.iter().enumerate() {
            let shard = shard.to_string();
            e.sample_u64(name, &[("shard", &shard)], *bytes);
        }
    }
    type BacklogCounter = (&'static str, &'static str, fn(&BacklogReads) -> u64);
    let backlog: [BacklogCounter; 6] = [
        (
            "ciphermq_backlog_reads_total",
            "Reads of queued bodies kept on disk only.",
            |b| b.reads,
        ),
        (
            "ciphermq_backlog_read_bytes_total",
            "Bytes those reads returned.",
            |b| b.bytes,
        ),
        (
            "ciphermq_backlog_read_errors_total",
            "Backlog reads that failed (made again a second later).",
            |b| b.errors,
        ),
        (
            "ciphermq_backlog_lost_messages_total",
            "Messages on disk whose records were damaged or missing when read back: never served.",
            |b| b.lost,
        ),
        (
            "ciphermq_backlog_spilled_bytes_total",
            "Body bytes moved out of memory past storage.memory_budget_mb.",
            |b| b.spilled_bytes,
        ),
        (
            "ciphermq_backlog_purged_messages_total",
            "Purged messages settled by reading their records back (purge_queue of a backlog on disk).",
            |b| b.purged,
        ),
    ];
    let reads: Vec<BacklogReads> = ctx
        .broker
        .stats()
        .shards()
        .iter()
        .map(|s| s.backlog_reads())
        .collect();
    for (name, help, get) in backlog {
        e.family(name, Kind::Counter, help);
        for (shard, b) in reads.iter().enumerate() {
            let shard = shard.to_string();
            e.sample_u64(name, &[("shard", &shard)], get(b));
        }
    }
    e.family(
        "ciphermq_queues",
        Kind::Gauge,
        "Queues the broker has (declared, or still reported by a shard), whether or not they get per-queue series.",
    );
    e.sample_u64("ciphermq_queues", &[], queues.len() as u64);
    // Per-queue series only when asked for, and for the deepest queues only:
    // queue names are the clients' choice, series are every scraper's cost.
    let exported = if queue_series.enabled {
        deepest(&queues, queue_series.max)
    } else {
        Vec::new()
    };
    e.family(
        "ciphermq_queue_series_dropped",
        Kind::Gauge,
        "Queues left out of the per-queue series (ciphermq_queue_*) past admin.max_queue_series: those with the fewest ready and unacked messages. Always 0 while admin.queue_metrics is off, when no queue has series (ciphermq_queues counts them).",
    );
    let dropped = if queue_series.enabled {
        queues.len() - exported.len()
    } else {
        0
    };
    e.sample_u64("ciphermq_queue_series_dropped", &[], dropped as u64);
    if queue_series.enabled {
        for (name, help, get) in gauges {
            e.family(name, Kind::Gauge, help);
            for q in &exported {
                let shard = q.shard.to_string();
                e.sample_u64(name, &[("queue", &q.name), ("shard", &shard)], get(q));
            }
        }
    }

    if let Some(b) = &bridge {
        bridge_metrics(&mut e, b);
    }
    if let Some(cluster) = ctx.broker.cluster() {
        crate::cluster_status::metrics(&mut e, &cluster);
    }
    admin_metrics(&mut e, admin);
    e.finish()
}

/// The admin endpoint's own connections: how full its slots are and whom
/// its limits turned away (`[admin]` connection limits).
fn admin_metrics(e: &mut Exposition, s: &SlotStats) {
    e.family(
        "ciphermq_admin_connections",
        Kind::Gauge,
        "Open admin endpoint connections (this scrape's included).",
    );
    e.sample_u64("ciphermq_admin_connections", &[], s.open);
    e.family(
        "ciphermq_admin_max_connections",
        Kind::Gauge,
        "admin.max_connections: admin connections open at once.",
    );
    e.sample_u64("ciphermq_admin_max_connections", &[], s.max_connections);
    e.family(
        "ciphermq_admin_connections_accepted_total",
        Kind::Counter,
        "Admin connections given a slot.",
    );
    e.sample_u64("ciphermq_admin_connections_accepted_total", &[], s.accepted);
    e.family(
        "ciphermq_admin_connections_refused_total",
        Kind::Counter,
        "Admin connections closed at accept: the limit was reached and no connection it counts could be given up.",
    );
    for (i, cap) in [Cap::PerIp, Cap::Global].into_iter().enumerate() {
        e.sample_u64(
            "ciphermq_admin_connections_refused_total",
            &[("limit", cap.key())],
            s.refused[i],
        );
    }
    e.family(
        "ciphermq_admin_connections_shed_total",
        Kind::Counter,
        "Admin connections (in their handshake, without a finished request, or idle) closed to serve a newcomer.",
    );
    for (i, cap) in [Cap::PerIp, Cap::Global].into_iter().enumerate() {
        e.sample_u64(
            "ciphermq_admin_connections_shed_total",
            &[("limit", cap.key())],
            s.shed[i],
        );
    }
    e.family(
        "ciphermq_admin_connections_timed_out_total",
        Kind::Counter,
        "Admin connections closed at a deadline, by phase: handshake and headers (admin.header_timeout_secs), idle (admin.idle_timeout_secs), response (admin.response_timeout_secs).",
    );
    for (phase, n) in s.timeouts() {
        e.sample_u64(
            "ciphermq_admin_connections_timed_out_total",
            &[("phase", phase)],
            n,
        );
    }
}

/// The Postgres bridge's gauges and counters.
fn bridge_metrics(e: &mut Exposition, b: &BridgeStatus) {
    e.family(
        "ciphermq_pgbridge_connected",
        Kind::Gauge,
        "1 while every connection the Postgres bridge needs is up.",
    );
    e.sample_u64("ciphermq_pgbridge_connected", &[], u64::from(b.connected));
    e.family(
        "ciphermq_pgbridge_rows_written_total",
        Kind::Counter,
        "Metadata rows written in committed transactions.",
    );
    e.sample_u64("ciphermq_pgbridge_rows_written_total", &[], b.rows_written);
    e.family(
        "ciphermq_pgbridge_lag_bytes",
        Kind::Gauge,
        "Log bytes past the metadata mirror's committed watermark.",
    );
    e.sample_u64("ciphermq_pgbridge_lag_bytes", &[], b.lag_bytes);
    e.family(
        "ciphermq_pgbridge_lag_rows",
        Kind::Gauge,
        "Messages durable in the queue logs whose metadata rows are not committed yet.",
    );
    e.sample_u64("ciphermq_pgbridge_lag_rows", &[], b.lag_rows);
    e.family(
        "ciphermq_pgbridge_lag_seconds",
        Kind::Gauge,
        "Seconds since the mirror last caught up with every log (0 when caught up).",
    );
    e.sample("ciphermq_pgbridge_lag_seconds", &[], b.lag_seconds);
    e.family(
        "ciphermq_pgbridge_missed_segments_total",
        Kind::Counter,
        "Log segments deleted before the mirror read them (their rows are missing).",
    );
    e.sample_u64(
        "ciphermq_pgbridge_missed_segments_total",
        &[],
        b.missed_segments,
    );
    e.family(
        "ciphermq_pgbridge_reconnects_total",
        Kind::Counter,
        "Postgres connections re-established after a loss.",
    );
    e.sample_u64("ciphermq_pgbridge_reconnects_total", &[], b.reconnects);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut e = Exposition::default();
        e.family("ciphermq_x_total", Kind::Counter, "Line one\nline \\two.");
        e.sample_u64("ciphermq_x_total", &[("shard", "0")], 7);
        e.sample_u64("ciphermq_x_total", &[("queue", "a\"b\\c\nd")], 1);
        e.family("ciphermq_y", Kind::Gauge, "Y.");
        e.sample("ciphermq_y", &[], 0.25);
        e.sample("ciphermq_y", &[], f64::NAN);
        e.sample("ciphermq_y", &[], f64::INFINITY);
        assert_eq!(
            e.finish(),
            "# HELP ciphermq_x_total Line one\\nline \\\\two.\n\
             # TYPE ciphermq_x_total counter\n\
             ciphermq_x_total{shard=\"0\"} 7\n\
             ciphermq_x_total{queue=\"a\\\"b\\\\c\\nd\"} 1\n\
             # HELP ciphermq_y Y.\n\
             # TYPE ciphermq_y gauge\n\
             ciphermq_y 0.25\n\
             ciphermq_y NaN\n\
             ciphermq_y +Inf\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_in_seconds() {
        let h = HistogramSnapshot {
            bounds_us: &[100, 2_500, 1_000_000],
            counts: vec![1, 0, 2, 1],
            sum_us: 1_502_600,
        };
        let mut e = Exposition::default();
        e.family("ciphermq_fsync_seconds", Kind::Histogram, "Fsyncs.");
        e.histogram("ciphermq_fsync_seconds", &[("shard", "1")], &h);
        assert_eq!(
            e.finish(),
            "# HELP ciphermq_fsync_seconds Fsyncs.\n\
             # TYPE ciphermq_fsync_seconds histogram\n\
             ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"0.0001\"} 1\n\
             ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"0.0025\"} 1\n\
             ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"1\"} 3\n\
             ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"+Inf\"} 4\n\
             ciphermq_fsync_seconds_sum{shard=\"1\"} 1.5026\n\
             ciphermq_fsync_seconds_count{shard=\"1\"} 4\n"
        );
    }

    #[test]
    fn publish_ack_buckets_run_from_50_us_to_10_s() {
        let stats = ShardStats::new(0);
        stats.publish_ack_latency.observe_us(420);
        let mut e = Exposition::default();
        e.histogram(
            "ciphermq_publish_ack_seconds",
            &[("shard", "0")],
            &stats.publish_ack_latency.snapshot(),
        );
        let text = e.finish();
        let buckets: Vec<&str> = text.lines().filter(|l| l.contains("_bucket{")).collect();
        assert_eq!(
            buckets.len(),
            ciphermq_stats::PUBLISH_ACK_BOUNDS_US.len() + 1
        );
        assert_eq!(
            buckets[..4],
            [
                "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.00005\"} 0",
                "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.0001\"} 0",
                "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.00025\"} 0",
                "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.0005\"} 1",
            ]
        );
        assert!(text.contains("ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"10\"} 1\n"));
        assert!(text.contains("ciphermq_publish_ack_seconds_sum{shard=\"0\"} 0.00042\n"));
    }

    fn queue(name: &str, ready: usize, unacked: usize) -> status::QueueEntry {
        status::QueueEntry {
            name: name.to_owned(),
            owner: None,
            ready,
            unacked,
            bytes: 0,
            memory_bytes: 0,
            on_disk: 0,
            dedup_ids: 0,
            dedup_bytes: 0,
            consumers: 0,
            shard: 0,
            storage_error: None,
        }
    }

    fn names(chosen: &[&status::QueueEntry]) -> Vec<String> {
        chosen.iter().map(|q| q.name.clone()).collect()
    }

    #[test]
    fn per_queue_series_go_to_the_deepest_queues_ties_by_name() {
        // Sorted by name, as `status::queues` gives them.
        let queues = [
            queue("a", 1, 0),
            queue("b", 0, 7),
            queue("c", 3, 2),
            queue("d", 5, 0),
            queue("e", 0, 0),
            queue("f", 9, 0),
        ];
        // Depths: a 1, b 7, c 5, d 5, e 0, f 9. The three deepest are f, b
        // and one of c and d (5 each): c, whose name sorts first.
        assert_eq!(names(&deepest(&queues, 3)), ["b", "c", "f"]);
        assert_eq!(names(&deepest(&queues, 2)), ["b", "f"]);
        assert_eq!(names(&deepest(&queues, 4)), ["b", "c", "d", "f"]);
        assert_eq!(names(&deepest(&queues, 1)), ["f"]);
        assert!(deepest(&queues, 0).is_empty());
        // Not capped: every queue, in name order.
        assert_eq!(names(&deepest(&queues, 6)), ["a", "b", "c", "d", "e", "f"]);
        assert_eq!(names(&deepest(&queues, 100)).len(), 6);
        // The choice does not depend on the order the queues come in.
        let mut reversed = queues.clone();
        reversed.reverse();
        assert_eq!(names(&deepest(&reversed, 3)), ["b", "c", "f"]);
        // All equal: the first names.
        let level: Vec<_> = ["q3", "q1", "q2", "q0"]
            .iter()
            .map(|n| queue(n, 4, 4))
            .collect();
        assert_eq!(names(&deepest(&level, 2)), ["q0", "q1"]);
    }

    #[test]
    fn queue_depth_does_not_overflow() {
        assert_eq!(depth(&queue("x", usize::MAX, usize::MAX)), u64::MAX);
    }

    #[test]
    fn every_bucket_bound_prints_as_a_plain_decimal() {
        for &us in ciphermq_stats::FSYNC_BOUNDS_US
            .iter()
            .chain(ciphermq_stats::PUBLISH_ACK_BOUNDS_US)
            .chain(ciphermq_stats::COMMIT_ROUND_BOUNDS_US)
            .chain(ciphermq_stats::LOOP_LAG_BOUNDS_US)
        {
            let text = format_value(us as f64 / 1e6);
            assert!(
                !text.contains('e') && text.parse::<f64>().is_ok(),
                "{us} µs printed as {text}"
            );
        }
    }
}
