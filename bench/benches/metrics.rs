//! What a metric update costs on the hot path: CipherMQ's own per-shard
//! counter and histogram (one writer thread, a relaxed load and store, no
//! locked instruction), against the `prometheus-client` crate's counter
//! (an atomic add), its histogram (a lock per observation) and a labelled
//! family lookup (a read lock and a hash lookup per update), as a publish
//! would pay them: one counter and one latency observation per message.
//! The numbers decide docs/PROTOCOL.md's "why the exposition is written by
//! hand".
//!
//! Run: `cargo bench -p ciphermq-bench --bench metrics`

use std::hint::black_box;

use ciphermq_stats::{Counter, Histogram, PUBLISH_ACK_BOUNDS_US};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter as PcCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram as PcHistogram;

/// The label set a per-shard series carries.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabel {
    shard: u32,
}

fn bounds_seconds() -> Vec<f64> {
    PUBLISH_ACK_BOUNDS_US
        .iter()
        .map(|&us| us as f64 / 1e6)
        .collect()
}

fn updates(c: &mut Criterion) {
    let mut group = c.benchmark_group("metric_update");
    group.throughput(Throughput::Elements(1));

    let counter = Counter::default();
    let histogram = Histogram::new(PUBLISH_ACK_BOUNDS_US);
    group.bench_function("ciphermq_counter_and_histogram", |b| {
        let mut us = 0u64;
        b.iter(|| {
            us = (us + 37) % 3_000;
            counter.add(1);
            histogram.observe_us(black_box(us));
        })
    });

    let pc_counter = PcCounter::<u64>::default();
    let pc_histogram = PcHistogram::new(bounds_seconds());
    group.bench_function("prometheus_client_counter_and_histogram", |b| {
        let mut us = 0u64;
        b.iter(|| {
            us = (us + 37) % 3_000;
            pc_counter.inc();
            pc_histogram.observe(black_box(us) as f64 / 1e6);
        })
    });

    let counters = Family::<ShardLabel, PcCounter<u64>>::default();
    let histograms = Family::<ShardLabel, PcHistogram>::new_with_constructor(|| {
        PcHistogram::new(bounds_seconds())
    });
    let label = ShardLabel { shard: 3 };
    group.bench_function("prometheus_client_family_by_shard", |b| {
        let mut us = 0u64;
        b.iter(|| {
            us = (us + 37) % 3_000;
            counters.get_or_create(black_box(&label)).inc();
            histograms
                .get_or_create(black_box(&label))
                .observe(black_box(us) as f64 / 1e6);
        })
    });
    group.finish();
}

criterion_group!(benches, updates);
criterion_main!(benches);
