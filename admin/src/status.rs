//! The JSON of `/api/status` and its parts, and the readiness verdict that
//! `/ready`, the status and the metrics share. Everything here reads
//! snapshots: a shard's numbers, the topology, the connection counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ciphermq_pgbridge::BridgeStatus;
use ciphermq_shard::shard_of;
use serde::Serialize;

use crate::broker_view::Limits;
use crate::endpoint::AdminContext;
use ciphermq_stats::{BrokerStats, Lifecycle};

/// Whether the broker should receive traffic, and why not.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Readiness {
    /// Listeners bound, logs recovered, storage writing, not shutting down.
    pub(crate) ready: bool,
    /// Why it is not ready.
    pub(crate) reason: Option<String>,
    /// Problems that do not stop it serving (the metadata mirror).
    pub(crate) warnings: Vec<String>,
}

impl Readiness {
    /// `ok`, `degraded` (serving with warnings) or `not ready`.
    pub(crate) fn health(&self) -> &'static str {
        match (self.ready, self.warnings.is_empty()) {
            (true, true) => "ok",
            (true, false) => "degraded",
            (false, _) => "not ready",
        }
    }
}

/// Decides readiness from the lifecycle, the shards' last commit rounds and
/// the bridge's status.
pub(crate) fn readiness(stats: &BrokerStats, bridge: Option<&BridgeStatus>) -> Readiness {
    let reason = match stats.lifecycle() {
        Lifecycle::Starting => Some("starting: listeners not bound yet".to_owned()),
        Lifecycle::Stopping => Some("shutting down".to_owned()),
        Lifecycle::Serving => {
            let failing = stats.storage_errors();
            (!failing.is_empty()).then(|| {
                let shards: Vec<String> = failing
                    .iter()
                    .map(|(shard, e)| format!("shard {shard}: {e}"))
                    .collect();
                format!(
                    "storage failing (publishes answered NACK storage): {}",
                    shards.join("; ")
                )
            })
        }
    };
    let mut warnings = Vec::new();
    if let Some(disk) = stats.disk().filter(|d| d.low) {
        warnings.push(format!(
            "disk space low: {} MiB free, below storage.min_free_mb = {}; publishes are answered \
             NACK disk_full until {} MiB are free (consumers keep draining; acked segments are deleted)",
            disk.free_bytes >> 20,
            disk.min_free_bytes >> 20,
            disk.resume_at_bytes >> 20
        ));
    }
    if let Some(findings) = stats.findings() {
        warnings.extend(findings.warnings.iter().cloned());
    }
    // One queue's storage failure is its own: named here, never a reason
    // for the broker not to be ready.
    for (queue, why) in stats.failing_queues() {
        warnings.push(format!(
            "queue {queue}: log writes failing (its publishes are answered NACK storage): {why}"
        ));
    }
    if let Some(b) = bridge {
        if !b.connected {
            warnings.push(format!(
                "pgbridge: not connected to PostgreSQL ({}); metadata rows are delayed",
                b.last_error.as_deref().unwrap_or("no error recorded")
            ));
        }
        if b.missed_segments > 0 {
            warnings.push(format!(
                "pgbridge: {} log segments were deleted before the metadata mirror read them; \
                 their rows are missing from message_metadata (the broker log names them)",
                b.missed_segments
            ));
        }
    }
    Readiness {
        ready: reason.is_none(),
        reason,
        warnings,
    }
}

/// `server`: who and how this broker is.
#[derive(Debug, Serialize)]
pub(crate) struct ServerInfo {
    name: String,
    version: &'static str,
    uptime_secs: u64,
    health: &'static str,
    ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    shards: usize,
}

/// `counters`: every shard's counters summed.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Counters {
    pub(crate) publishes: u64,
    pub(crate) publish_nacks: u64,
    pub(crate) acks: u64,
    pub(crate) nacks: u64,
    pub(crate) deliveries: u64,
    pub(crate) connections_accepted: u64,
    pub(crate) connections_refused: u64,
    pub(crate) handshake_failures: u64,
    pub(crate) handshakes_refused: u64,
    pub(crate) fsyncs: u64,
    pub(crate) commit_rounds: u64,
    pub(crate) commit_failures: u64,
}

/// One queue in `queues`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueEntry {
    pub(crate) name: String,
    pub(crate) owner: Option<String>,
    pub(crate) ready: usize,
    pub(crate) unacked: usize,
    /// Body bytes held, ready and unacked.
    pub(crate) bytes: u64,
    /// The part of `bytes` in memory (the rest is in the log only).
    pub(crate) memory_bytes: u64,
    /// Ready messages whose bodies are in the log only.
    pub(crate) on_disk: u64,
    /// Ids remembered for dedup: its messages', and those acked within
    /// the window.
    pub(crate) dedup_ids: usize,
    /// Heap bytes those ids take.
    pub(crate) dedup_bytes: u64,
    pub(crate) consumers: usize,
    pub(crate) shard: usize,
    /// Why its last log write failed, until one succeeds (`null`: none
    /// failed): its publishes are answered `NACK … storage` meanwhile.
    pub(crate) storage_error: Option<String>,
}

impl QueueEntry {
    /// `name` with nothing counted yet: a queue its shard has not reported.
    pub(crate) fn empty(name: &str, owner: Option<&str>, shard: usize) -> QueueEntry {
        QueueEntry {
            name: name.to_owned(),
            owner: owner.map(str::to_owned),
            ready: 0,
            unacked: 0,
            bytes: 0,
            memory_bytes: 0,
            on_disk: 0,
            dedup_ids: 0,
            dedup_bytes: 0,
            consumers: 0,
            shard,
            storage_error: None,
        }
    }
}

/// One exchange in `exchanges`.
#[derive(Debug, Serialize)]
struct ExchangeEntry {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    bindings: usize,
}

/// One binding in `bindings`.
#[derive(Debug, Serialize)]
struct BindingEntry {
    exchange: String,
    queue: String,
    routing_key: String,
}

/// `connections`: open connections counted by IP, by CN and by shard, all
/// from one snapshot of the broker's connection counts, so `total`, the sum
/// of `by_cn`, the sum of `by_ip` and the sum of `by_shard` are always the
/// same number (a dashboard showing them side by side never disagrees with
/// itself).
#[derive(Debug, Serialize)]
pub(crate) struct Connections {
    total: u64,
    by_ip: BTreeMap<String, u32>,
    by_cn: BTreeMap<String, u32>,
    /// Each CN's connections on the shard that serves them, `hash(CN) % N`
    /// (a connection moves to that shard after its handshake).
    by_shard: Vec<u64>,
}

impl Connections {
    /// The counts of one snapshot, `by_ip` and `by_cn`, over `shards`
    /// shards.
    fn from_counts(
        by_ip: Vec<(std::net::IpAddr, u32)>,
        by_cn: Vec<(String, u32)>,
        shards: usize,
    ) -> Connections {
        let mut by_shard = vec![0; shards];
        for (cn, n) in &by_cn {
            if let Some(count) = by_shard.get_mut(usize::from(shard_of(cn, shards))) {
                *count += u64::from(*n);
            }
        }
        Connections {
            total: by_cn.iter().map(|(_, n)| u64::from(*n)).sum(),
            by_ip: by_ip
                .into_iter()
                .map(|(ip, n)| (ip.to_string(), n))
                .collect(),
            by_cn: by_cn.into_iter().collect(),
            by_shard,
        }
    }
}

/// `storage`: where messages live and whether writes succeed.
#[derive(Debug, Serialize)]
struct StorageState {
    mode: &'static str,
    data_dir: Option<String>,
    healthy: bool,
    last_error: Option<String>,
    /// Free bytes on the data directory's filesystem (durable storage).
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_free_bytes: Option<u64>,
    /// `storage.min_free_mb` in bytes (durable storage).
    #[serde(skip_serializing_if = "Option::is_none")]
    min_free_bytes: Option<u64>,
    /// Publishes refused for lack of space.
    disk_low: bool,
    /// Log records and bytes moved to quarantine files at start.
    quarantined_records: u64,
    quarantined_bytes: u64,
}

/// `pgbridge`: the Postgres bridge's own report.
#[derive(Debug, Serialize)]
struct BridgeState {
    connected: bool,
    rows_written: u64,
    lag_bytes: u64,
    lag_rows: u64,
    lag_seconds: f64,
    missed_segments: u64,
    reconnects: u64,
    last_error: Option<String>,
}

impl From<&BridgeStatus> for BridgeState {
    fn from(b: &BridgeStatus) -> Self {
        BridgeState {
            connected: b.connected,
            rows_written: b.rows_written,
            lag_bytes: b.lag_bytes,
            lag_rows: b.lag_rows,
            lag_seconds: b.lag_seconds,
            missed_segments: b.missed_segments,
            reconnects: b.reconnects,
            last_error: b.last_error.clone(),
        }
    }
}

/// One CN in `quota_usage`: what it holds against its quotas.
#[derive(Debug, Serialize)]
struct QuotaUsage {
    cn: String,
    queues: usize,
    exchanges: usize,
    bindings: usize,
}

/// The whole `/api/status` document.
#[derive(Debug, Serialize)]
struct Status {
    server: ServerInfo,
    counters: Counters,
    queues: Vec<QueueEntry>,
    exchanges: Vec<ExchangeEntry>,
    bindings: Vec<BindingEntry>,
    connections: Connections,
    limits: Limits,
    quota_usage: Vec<QuotaUsage>,
    storage: StorageState,
    pgbridge: Option<BridgeState>,
}

/// Every CN holding queues, exchanges or bindings, sorted by CN.
fn quota_usage(ctx: &AdminContext) -> Vec<QuotaUsage> {
    let topology = ctx.broker.topology().snapshot();
    let mut usage: Vec<QuotaUsage> = topology
        .usages()
        .map(|(cn, u)| QuotaUsage {
            cn: cn.to_owned(),
            queues: u.queues,
            exchanges: u.exchanges,
            bindings: u.bindings,
        })
        .collect();
    usage.sort_unstable_by(|a, b| a.cn.cmp(&b.cn));
    usage
}

/// Every shard's counters summed.
pub(crate) fn counters(ctx: &AdminContext) -> Counters {
    let mut c = Counters::default();
    for s in ctx.broker.stats().shards() {
        c.publishes += s.publishes.get();
        c.publish_nacks += s.publish_nacks.total();
        c.acks += s.acks.get();
        c.nacks += s.nacks.get();
        c.deliveries += s.deliveries.get();
        c.connections_accepted += s.connections_accepted.get();
        c.connections_refused += s.connections_refused.total();
        c.handshake_failures += s.handshake_failures.get();
        c.handshakes_refused += s.handshakes_refused.get();
        c.fsyncs += s.fsyncs.get();
        c.commit_rounds += s.commit_rounds.get();
        c.commit_failures += s.commit_failures.get();
    }
    c
}

/// Every queue, sorted by name: the topology's list (so a queue shows up
/// as soon as it is declared) with the counts its shard last published.
pub(crate) fn queues(ctx: &AdminContext) -> Vec<QueueEntry> {
    let mut all: BTreeMap<Arc<str>, QueueEntry> = BTreeMap::new();
    let topology = ctx.broker.topology().snapshot();
    for info in topology.queues() {
        all.insert(
            info.name.clone(),
            QueueEntry::empty(&info.name, Some(&*info.owner), info.shard as usize),
        );
    }
    for shard in ctx.broker.stats().shards() {
        for q in shard.queues().iter() {
            let entry = all
                .entry(q.name.clone())
                .or_insert_with(|| QueueEntry::empty(&q.name, None, shard.shard));
            entry.ready = q.ready;
            entry.unacked = q.unacked;
            entry.bytes = q.bytes;
            entry.memory_bytes = q.memory_bytes;
            entry.on_disk = q.on_disk;
            entry.dedup_ids = q.dedup_ids;
            entry.dedup_bytes = q.dedup_bytes;
            entry.consumers = q.consumers;
            entry.shard = shard.shard;
            entry.storage_error = q.storage_error.as_deref().map(str::to_owned);
        }
    }
    all.into_values().collect()
}

/// Open connections by IP, CN and shard, from one snapshot. The shards'
/// own counts ([`ciphermq_stats::ShardStats::open_connections`]) are not
/// used here: each is refreshed once a second by its shard, at its own
/// moment, so beside the live total they could show a connection twice or
/// not at all.
pub(crate) fn connections(ctx: &AdminContext) -> Connections {
    let (by_ip, by_cn) = ctx.broker.open_connections();
    Connections::from_counts(by_ip, by_cn, ctx.broker.stats().shards().len())
}

/// Exchanges (sorted by name) and their bindings (sorted by exchange,
/// queue, key) from the current topology snapshot.
fn topology(ctx: &AdminContext) -> (Vec<ExchangeEntry>, Vec<BindingEntry>) {
    let topology = ctx.broker.topology().snapshot();
    let mut exchanges = Vec::new();
    let mut bindings = Vec::new();
    for (name, exchange) in topology.exchanges() {
        let mut count = 0;
        for (key, target) in exchange.bindings() {
            count += 1;
            bindings.push(BindingEntry {
                exchange: name.to_owned(),
                queue: target.queue.to_string(),
                routing_key: key.to_owned(),
            });
        }
        exchanges.push(ExchangeEntry {
            name: name.to_owned(),
            kind: exchange.kind().as_str(),
            bindings: count,
        });
    }
    exchanges.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    bindings.sort_unstable_by(|a, b| {
        (&a.exchange, &a.queue, &a.routing_key).cmp(&(&b.exchange, &b.queue, &b.routing_key))
    });
    (exchanges, bindings)
}

/// The `/api/status` document.
pub(crate) fn status(ctx: &AdminContext) -> serde_json::Value {
    let bridge = ctx.bridge.as_ref().map(|b| b.status());
    let stats = ctx.broker.stats();
    let readiness = readiness(stats, bridge.as_ref());
    let storage_errors = stats.storage_errors();
    let disk = stats.disk();
    let findings = stats.findings();
    let (exchanges, bindings) = topology(ctx);
    let status = Status {
        server: ServerInfo {
            name: ctx.name.clone(),
            version: env!("CARGO_PKG_VERSION"),
            uptime_secs: stats.uptime().as_secs(),
            health: readiness.health(),
            ready: readiness.ready,
            reason: readiness.reason,
            warnings: readiness.warnings,
            shards: stats.shards().len(),
        },
        counters: counters(ctx),
        queues: queues(ctx),
        exchanges,
        bindings,
        connections: connections(ctx),
        limits: ctx.broker.limits(),
        quota_usage: quota_usage(ctx),
        storage: StorageState {
            mode: ctx.storage_mode,
            data_dir: ctx.data_dir.clone(),
            healthy: storage_errors.is_empty(),
            last_error: storage_errors
                .first()
                .map(|(shard, e)| format!("shard {shard}: {e}")),
            disk_free_bytes: disk.map(|d| d.free_bytes),
            min_free_bytes: disk.map(|d| d.min_free_bytes),
            disk_low: disk.is_some_and(|d| d.low),
            quarantined_records: findings.map_or(0, |f| f.quarantined_records),
            quarantined_bytes: findings.map_or(0, |f| f.quarantined_bytes),
        },
        pgbridge: bridge.as_ref().map(BridgeState::from),
    };
    to_value(&status)
}

/// `/api/queues`: `{"queues": [...]}`.
pub(crate) fn queues_document(ctx: &AdminContext) -> serde_json::Value {
    let mut doc = HashMap::new();
    doc.insert("queues", to_value(&queues(ctx)));
    to_value(&doc)
}

/// `/api/connections`: `{"connections": {...}}`.
pub(crate) fn connections_document(ctx: &AdminContext) -> serde_json::Value {
    let mut doc = HashMap::new();
    doc.insert("connections", to_value(&connections(ctx)));
    to_value(&doc)
}

/// Serializes plain data (maps with string keys, numbers, strings), which
/// cannot fail; a failure would be reported in the document itself.
fn to_value<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value)
        .unwrap_or_else(|e| serde_json::json!({ "error": format!("cannot serialize: {e}") }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_figures_add_up_to_the_total() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let by_cn = vec![
            ("admin".to_owned(), 1),
            ("receiver_1".to_owned(), 2),
            ("sender_1".to_owned(), 3),
            ("sender_2".to_owned(), 1),
        ];
        let by_ip = vec![(ip("10.0.0.1"), 4), (ip("::1"), 3)];
        for shards in [1, 2, 3, 8] {
            let c = Connections::from_counts(by_ip.clone(), by_cn.clone(), shards);
            assert_eq!(c.total, 7);
            assert_eq!(c.by_shard.len(), shards);
            assert_eq!(c.by_shard.iter().sum::<u64>(), c.total, "{c:?}");
            assert_eq!(
                c.by_ip.values().map(|n| u64::from(*n)).sum::<u64>(),
                c.total
            );
            for (cn, n) in &by_cn {
                assert!(
                    c.by_shard[usize::from(shard_of(cn, shards))] >= u64::from(*n),
                    "{cn} counted on its own shard: {c:?}"
                );
            }
        }
        let doc = to_value(&Connections::from_counts(by_ip, by_cn, 2));
        let shard_sum: u64 = doc["by_shard"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(doc["total"], shard_sum);

        let none = Connections::from_counts(Vec::new(), Vec::new(), 2);
        assert_eq!((none.total, none.by_shard), (0, vec![0, 0]));
    }

    #[test]
    fn ready_only_while_serving_with_every_shard_writing() {
        let stats = BrokerStats::new(2, true);
        let r = readiness(&stats, None);
        assert!(!r.ready);
        assert_eq!(
            r.reason.as_deref(),
            Some("starting: listeners not bound yet")
        );

        stats.set_lifecycle(Lifecycle::Serving);
        assert_eq!(
            readiness(&stats, None),
            Readiness {
                ready: true,
                reason: None,
                warnings: vec![]
            }
        );

        stats.shard(1).commit_round(Some((
            "queue q: /d/q/segment-0.log: No space left on device".into(),
            true,
        )));
        let r = readiness(&stats, None);
        assert!(!r.ready);
        assert_eq!(r.health(), "not ready");
        assert_eq!(
            r.reason.as_deref(),
            Some(
                "storage failing (publishes answered NACK storage): \
                 shard 1: queue q: /d/q/segment-0.log: No space left on device"
            )
        );
        stats.shard(1).commit_round(None);
        assert!(readiness(&stats, None).ready);

        stats.set_lifecycle(Lifecycle::Stopping);
        assert_eq!(
            readiness(&stats, None).reason.as_deref(),
            Some("shutting down")
        );
    }

    #[test]
    fn a_struggling_mirror_degrades_without_unreadying() {
        let stats = BrokerStats::new(1, true);
        stats.set_lifecycle(Lifecycle::Serving);
        let bridge = BridgeStatus {
            connected: false,
            missed_segments: 2,
            last_error: Some("connection refused".into()),
            ..BridgeStatus::default()
        };
        let r = readiness(&stats, Some(&bridge));
        assert!(r.ready);
        assert_eq!(r.health(), "degraded");
        assert_eq!(r.warnings.len(), 2);
        assert!(
            r.warnings[0].contains("connection refused"),
            "{:?}",
            r.warnings
        );
        assert!(r.warnings[1].contains("2 log segments"), "{:?}", r.warnings);
    }
}
