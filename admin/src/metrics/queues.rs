//! The queues: the memory budget and what each shard's queues hold, how
//! many queues there are, and (with `admin.queue_metrics`) per-queue
//! series for the deepest of them.

use ciphermq_stats::BrokerStats;

use super::{Exposition, Kind};
use crate::config::QueueSeries;
use crate::endpoint::AdminContext;
use crate::status;

/// A per-queue gauge: name, help, and how to read it from a queue entry.
type QueueGauge = (&'static str, &'static str, fn(&status::QueueEntry) -> u64);

/// The per-queue gauges.
fn queue_gauges() -> [QueueGauge; 8] {
    [
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
    ]
}

/// Messages a queue holds, ready and unacked: what ranks queues for
/// per-queue series.
pub(super) fn depth(q: &status::QueueEntry) -> u64 {
    (q.ready as u64).saturating_add(q.unacked as u64)
}

/// The queues that get per-queue series when at most `max` may: the `max`
/// with the most messages (ready and unacked), ties to the name that sorts
/// first, so the same figures always choose the same queues. Returned in
/// name order (the order of `queues`, which `status::queues` sorts), so a
/// scrape lists them as it always has.
pub(super) fn deepest(queues: &[status::QueueEntry], max: usize) -> Vec<&status::QueueEntry> {
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

/// The memory budget, and per shard what its queues hold.
pub(super) fn memory_series(
    e: &mut Exposition,
    ctx: &AdminContext,
    stats: &BrokerStats,
    queues: &[status::QueueEntry],
) {
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
        for q in queues {
            if let Some(sum) = per_shard.get_mut(q.shard) {
                *sum += get(q);
            }
        }
        for (shard, bytes) in per_shard.iter().enumerate() {
            let shard = shard.to_string();
            e.sample_u64(name, &[("shard", &shard)], *bytes);
        }
    }
}

/// How many queues there are, and the per-queue series `queue_series`
/// asks for.
pub(super) fn queue_series(
    e: &mut Exposition,
    queues: &[status::QueueEntry],
    queue_series: QueueSeries,
) {
    e.family(
        "ciphermq_queues",
        Kind::Gauge,
        "Queues the broker has (declared, or still reported by a shard), whether or not they get per-queue series.",
    );
    e.sample_u64("ciphermq_queues", &[], queues.len() as u64);
    // Per-queue series only when asked for, and for the deepest queues only:
    // queue names are the clients' choice, series are every scraper's cost.
    let exported = if queue_series.enabled {
        deepest(queues, queue_series.max)
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
        for (name, help, get) in queue_gauges() {
            e.family(name, Kind::Gauge, help);
            for q in &exported {
                let shard = q.shard.to_string();
                e.sample_u64(name, &[("queue", &q.name), ("shard", &shard)], get(q));
            }
        }
    }
}
