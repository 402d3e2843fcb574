//! The data directory: whether the device is writing, what recovery
//! found damaged, free space, and the reads of backlogs kept on disk.

use std::sync::Arc;

use ciphermq_shard::shard::BacklogReads;
use ciphermq_stats::{BrokerStats, ShardStats};

use super::{Exposition, Kind};

/// Storage health, the damage found at start, and free space.
pub(super) fn storage_series(e: &mut Exposition, stats: &BrokerStats) {
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
}

/// Per shard: reads of queued bodies kept on disk only.
pub(super) fn backlog_series(e: &mut Exposition, shards: &[Arc<ShardStats>]) {
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
    let reads: Vec<BacklogReads> = shards.iter().map(|s| s.backlog_reads()).collect();
    for (name, help, get) in backlog {
        e.family(name, Kind::Counter, help);
        for (shard, b) in reads.iter().enumerate() {
            let shard = shard.to_string();
            e.sample_u64(name, &[("shard", &shard)], get(b));
        }
    }
}
