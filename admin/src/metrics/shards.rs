//! Per-shard series: every family carries a `shard="N"` label.

use std::sync::Arc;

use ciphermq_stats::{HistogramSnapshot, ReasonCounters, ShardStats, ShardThread};

use super::{Exposition, Kind};

/// How a per-shard family reads one shard's stats.
enum Read {
    /// A counter.
    Counter(fn(&ShardStats) -> u64),
    /// A counter with a `reason` label from a fixed set: every reason is
    /// shown, zeros included, so a rate over it is defined.
    Reasons(fn(&ShardStats) -> &ReasonCounters),
    /// A latency histogram.
    Histogram(fn(&ShardStats) -> HistogramSnapshot),
    /// A gauge.
    Gauge(fn(&ShardStats) -> u64),
}

/// Every per-shard family but the threads' ([`thread_series`]), in the
/// order `/metrics` gives them: name, help, how to read it.
fn families() -> [(&'static str, &'static str, Read); 28] {
    [
        (
            "ciphermq_publishes_total",
            "Publishes answered ACK (durable in every target queue).",
            Read::Counter(|s| s.publishes.get()),
        ),
        (
            "ciphermq_publish_nacks_total",
            "Publishes answered NACK, by the reason the NACK gives.",
            Read::Reasons(|s| &s.publish_nacks),
        ),
        (
            "ciphermq_received_bytes_total",
            "TLS bytes read from client connections after their handshake.",
            Read::Counter(|s| s.bytes_received.get()),
        ),
        (
            "ciphermq_sent_bytes_total",
            "TLS bytes written to client connections after their handshake.",
            Read::Counter(|s| s.bytes_sent.get()),
        ),
        (
            "ciphermq_rate_limited_total",
            "Commands answered Rate limited by the per-CN command bucket (limited publishes are ciphermq_publish_nacks_total{reason=\"rate_limited\"}).",
            Read::Counter(|s| s.rate_limited.get()),
        ),
        (
            "ciphermq_dead_lettered_total",
            "Messages moved to a dead-letter queue ({queue}.dlq) after performance.max_deliveries (refreshed every second).",
            Read::Counter(|s| s.dead_lettered()),
        ),
        (
            "ciphermq_acks_total",
            "Deliveries settled by a consumer's ack.",
            Read::Counter(|s| s.acks.get()),
        ),
        (
            "ciphermq_nacks_total",
            "Deliveries requeued by a consumer's nack.",
            Read::Counter(|s| s.nacks.get()),
        ),
        (
            "ciphermq_deliveries_total",
            "Deliveries written to consumers (push and fetch, redeliveries included).",
            Read::Counter(|s| s.deliveries.get()),
        ),
        (
            "ciphermq_connections_accepted_total",
            "Client connections that passed the handshake and the ACL.",
            Read::Counter(|s| s.connections_accepted.get()),
        ),
        (
            "ciphermq_connections_refused_total",
            "Client connections refused after the handshake: unknown_client (CN in no ACL list), connection_limit (per-IP or per-CN cap).",
            Read::Reasons(|s| &s.connections_refused),
        ),
        (
            "ciphermq_tls_handshake_failures_total",
            "Client TLS handshakes that failed or timed out.",
            Read::Counter(|s| s.handshake_failures.get()),
        ),
        (
            "ciphermq_handshakes_refused_total",
            "Connections closed before their handshake: too many handshakes in progress (performance.max_handshakes, max_handshakes_per_ip).",
            Read::Counter(|s| s.handshakes_refused.get()),
        ),
        (
            "ciphermq_fsyncs_total",
            "fdatasync calls on queue logs.",
            Read::Counter(|s| s.fsyncs.get()),
        ),
        (
            "ciphermq_commit_rounds_total",
            "Group-commit rounds.",
            Read::Counter(|s| s.commit_rounds.get()),
        ),
        (
            "ciphermq_commit_failures_total",
            "Group-commit rounds with a failed log write (publishes answered NACK storage).",
            Read::Counter(|s| s.commit_failures.get()),
        ),
        (
            "ciphermq_publish_ack_seconds",
            "Time from the broker taking up a publish's line to writing its ACK.",
            Read::Histogram(|s| s.publish_ack_latency.snapshot()),
        ),
        (
            "ciphermq_fsync_seconds",
            "Duration of each fdatasync of a queue log.",
            Read::Histogram(|s| s.fsync_latency.snapshot()),
        ),
        (
            "ciphermq_commit_round_seconds",
            "From taking a group-commit round to releasing its answers (writes, fdatasync, directory syncs).",
            Read::Histogram(|s| s.commit_round_latency.snapshot()),
        ),
        (
            "ciphermq_commit_wake_seconds",
            "From a queue log's fdatasync returning to the shard's committer running again: the shard's delay in noticing durable bytes.",
            Read::Histogram(|s| s.commit_wake_latency.snapshot()),
        ),
        (
            "ciphermq_commit_handoff_seconds",
            "From a shard handing a queue log's write to its blocking-I/O thread to that thread starting it: its wake-up, and the writes of other logs queued ahead in the same round.",
            Read::Histogram(|s| s.commit_handoff_latency.snapshot()),
        ),
        (
            "ciphermq_shard_loop_lag_seconds",
            "How late a shard's loop gives a turn asked for every 5 ms: time the thread was held by other work.",
            Read::Histogram(|s| s.loop_lag.snapshot()),
        ),
        (
            "ciphermq_shard_stalls_total",
            "Shard loop turns that came 20 ms late or more with the shard's thread not waiting for a CPU most of that time (a long step, a blocking call); each is logged with the shard step begun last.",
            Read::Counter(|s| s.stalls.get()),
        ),
        (
            "ciphermq_shard_cpu_starved_total",
            "Shard loop turns that came 20 ms late or more because the shard's thread waited, ready to run, for a CPU most of that time: the host was busy, not the broker.",
            Read::Counter(|s| s.cpu_starved.get()),
        ),
        (
            "ciphermq_reply_holdbacks_total",
            "Times a connection stopped being read because its pending replies held performance.max_pending_reply_bytes (a client not reading what it asked for).",
            Read::Counter(|s| s.reply_holdbacks.get()),
        ),
        (
            "ciphermq_pending_reply_bytes",
            "Bytes the shard's connections hold in replies their clients have not read yet (ids, and the bodies a reply keeps alive); each connection at most performance.max_pending_reply_bytes plus one line's worth.",
            Read::Gauge(|s| s.pending_reply_bytes.get()),
        ),
        (
            "ciphermq_shard_nudges_total",
            "Times a shard's loop went 10 ms without a turn with its thread asleep, and another thread woke it (its executor can fall asleep with work still to run).",
            Read::Counter(|s| s.nudges.get()),
        ),
        (
            "ciphermq_connections",
            "Open client connections per shard (refreshed every second).",
            Read::Gauge(|s| s.open_connections()),
        ),
    ]
}

/// The per-shard families of `/metrics`.
pub(super) fn shard_series(e: &mut Exposition, shards: &[Arc<ShardStats>]) {
    for (name, help, read) in families() {
        let kind = match read {
            Read::Counter(_) | Read::Reasons(_) => Kind::Counter,
            Read::Histogram(_) => Kind::Histogram,
            Read::Gauge(_) => Kind::Gauge,
        };
        e.family(name, kind, help);
        for s in shards {
            let shard = s.shard.to_string();
            match read {
                Read::Counter(get) | Read::Gauge(get) => {
                    e.sample_u64(name, &[("shard", &shard)], get(s));
                }
                Read::Reasons(get) => {
                    for (reason, n) in get(s).by_reason() {
                        e.sample_u64(name, &[("shard", &shard), ("reason", reason)], n);
                    }
                }
                Read::Histogram(get) => e.histogram(name, &[("shard", &shard)], &get(s)),
            }
        }
    }
    thread_series(e, shards);
}

/// Each shard thread's time on a CPU and time ready but waiting for one
/// (`thread_sched.rs`); a thread not known yet, or whose figures cannot be
/// read, is left out.
fn thread_series(e: &mut Exposition, shards: &[Arc<ShardStats>]) {
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
