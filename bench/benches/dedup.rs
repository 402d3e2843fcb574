//! What a queue's dedup set costs a message as the set grows: one new id
//! stored (a publish) and one old id removed (its window over), with the set
//! held at a steady size. At full rate a 120 s window holds millions of ids,
//! far more than the caches, so each of the two is a random memory access;
//! the sizes below are a set that fits in the caches, the set of a 10 s
//! run at full rate, and a full window at full rate. The second variant
//! prefetches each step's two slots one step ahead: what hiding the misses
//! would save, with nothing else competing for memory.
//!
//! Run: `cargo bench -p ciphermq-bench --bench dedup`

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use ciphermq_shard::dedup::{IdSet, IdState};
use ciphermq_shard::DedupKey;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Ids held: about 1.5 MB, 15 MB and 240 MB of table.
const SIZES: [usize; 3] = [100_000, 1_000_000, 16_000_000];

/// The `n`th key of a stream of distinct keys spread like keyed hashes.
fn key(n: u64) -> DedupKey {
    // SplitMix64 on both halves: distinct inputs, scattered outputs.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let lo = mix(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let hi = mix(lo ^ 0x5851_f42d_4c95_7f2d);
    DedupKey(u128::from(hi) << 64 | u128::from(lo))
}

/// A set held at a steady size by a stream of ids: each step stores the
/// next id (a publish) and removes the oldest (its window over).
struct Stream {
    set: IdSet,
    held: VecDeque<DedupKey>,
    next: u64,
}

impl Stream {
    fn holding(size: usize) -> Stream {
        // A window far longer than the run: nothing expires on its own.
        let mut s = Stream {
            set: IdSet::new(Duration::from_secs(24 * 3600)),
            held: VecDeque::with_capacity(size + 1),
            next: 0,
        };
        for _ in 0..size {
            let k = s.take_key();
            s.set.store(k);
            s.held.push_back(k);
        }
        s
    }

    fn take_key(&mut self) -> DedupKey {
        self.next += 1;
        key(self.next - 1)
    }

    fn step(&mut self, now: Instant) -> (bool, Option<IdState>) {
        let k = self.take_key();
        let new = self.set.store_new(black_box(k), now);
        self.held.push_back(k);
        let old = self.held.pop_front().expect("the set is never empty");
        (new, self.set.remove(black_box(old)))
    }

    /// Starts loading the two slots the step after the coming one touches
    /// first: a whole step (two misses) ahead. Issued right before their
    /// own step, the prefetches save much less.
    fn prefetch_step_after_next(&self) {
        self.set.prefetch(key(self.next + 1));
        if let Some(second_oldest) = self.held.get(1) {
            self.set.prefetch(*second_oldest);
        }
    }
}

fn dedup(c: &mut Criterion) {
    let mut g = c.benchmark_group("dedup");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(5));
    let now = Instant::now();
    for size in SIZES {
        let mut stream = Stream::holding(size);
        g.bench_with_input(
            BenchmarkId::new("store_new_then_remove_oldest", size),
            &size,
            |b, _| b.iter(|| stream.step(now)),
        );
        g.bench_with_input(
            BenchmarkId::new("same_with_next_step_prefetched", size),
            &size,
            |b, _| {
                b.iter(|| {
                    stream.prefetch_step_after_next();
                    stream.step(now)
                })
            },
        );
        assert_eq!(stream.set.len(), size);
    }
    g.finish();
}

criterion_group!(benches, dedup);
criterion_main!(benches);
