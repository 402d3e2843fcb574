//! What one publish costs the shard that stores it, for the per-message
//! cost hunt: the message built from its line's parts, routed, checked
//! against the queue's dedup window, queued, and its record appended to
//! the queue's log (encoded, CRC'd), on a durable shard.
//!
//! The load generator's figures move with the host by far more than one
//! cut of this path saves (pairs spread over ±15% on a shared machine);
//! this times the shard's part of a publish alone, in one thread, so a
//! cut of a few percent shows. Commit rounds run between timed batches
//! (on the simulation's disk): they are the committer's work, not the
//! publish's, and keep the log's pending bytes and the queue's waiters
//! as small as in the broker.
//!
//!     cargo bench -p ciphermq-bench --bench publish

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_shard::{
    Clock, DedupHasher, Mesh, Message, Origin, PublishStatus, QueueSettings, Route, Shard,
};
use ciphermq_sim::committer::{Committer, Faults};
use ciphermq_sim::disk::SimDisk;
use ciphermq_sim::rng::Rng;
use ciphermq_sim::shard_on_disk::{
    declare_bound_queue, durable_shard, fresh_data_dir, store_with_direct_exchange,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Publishes between two commit rounds: about what one round of a
/// publisher with a window of 1,000 holds.
const ROUND: u64 = 512;
/// Publishes into one shard before a new one is made, so that memory stays
/// bounded however many iterations criterion asks for.
const PER_SHARD: u64 = 64 * 1024;

/// A 1 KiB envelope, as the load generator sends (base64 fields).
fn body(id: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","sender_client_id":"sender_1","receiver_client_id":"receiver_1","enc_session_key":"{}","nonce":"AAECAwQFBgcICQoL","ciphertext":"{}"}}"#,
        "k".repeat(108),
        "c".repeat(1024)
    )
}

/// One durable shard with a direct exchange `x` routing `k` to queue `q`,
/// owned by `receiver_1`, on the simulation's disk.
struct World {
    _dir: tempfile::TempDir,
    disk: SimDisk,
    shard: Shard,
    committer: Committer,
    mailbox: std::rc::Rc<ciphermq_shard::Mailbox>,
    conn: ciphermq_shard::ConnRef,
}

impl World {
    fn new() -> World {
        let (dir, data, disk) = fresh_data_dir();
        let store = store_with_direct_exchange("x");
        declare_bound_queue(&store, "q", "receiver_1", "x", "k");
        let settings = QueueSettings {
            dedup_hasher: DedupHasher::from_bytes([7; 16]),
            ..QueueSettings::default()
        };
        let endpoint = Mesh::build(1).pop().expect("one shard");
        let (clock, _manual) = Clock::manual(1_700_000_000_000);
        let mut shard = durable_shard(&data, 1 << 30, &settings, &store, endpoint.outbound, &clock);
        let (conn, mailbox) = shard.register_conn();
        World {
            _dir: dir,
            disk,
            shard,
            committer: Committer::default(),
            mailbox,
            conn,
        }
    }

    /// Commits what was appended and drops the answers.
    fn commit(&mut self) {
        let mut rng = Rng::new(1);
        while self.committer.has_work(&self.shard) {
            self.committer
                .step(&mut self.shard, &mut self.disk, &mut rng, Faults::NONE);
        }
        let mut events = std::collections::VecDeque::new();
        self.mailbox.drain_into(&mut events);
    }
}

/// Times `iters` publishes of new ids, commit rounds left out.
fn publish_new(iters: u64, ids: &[String], bodies: &[String]) -> Duration {
    let sender: Arc<str> = Arc::from("sender_1");
    let mut world = World::new();
    let mut timed = Duration::ZERO;
    let mut done = 0u64;
    while done < iters {
        if done > 0 && done.is_multiple_of(PER_SHARD) {
            world = World::new();
        }
        let batch = ROUND.min(iters - done);
        let started = Instant::now();
        for n in done..done + batch {
            let i = (n % PER_SHARD) as usize;
            let route = Route {
                exchange: "x",
                routing_key: "k",
                sent_at_ms: 1_700_000_000_000,
            };
            let msg = Message::published(&ids[i], &bodies[i], sender.clone(), route);
            let origin = Origin {
                conn: world.conn,
                seq: n,
            };
            let status = world
                .shard
                .publish(origin, "x", "k", "receiver_1", &msg, started);
            debug_assert!(matches!(status, PublishStatus::Pending { .. }));
            black_box(status);
        }
        timed += started.elapsed();
        world.commit();
        done += batch;
    }
    timed
}

fn publish(c: &mut Criterion) {
    // Ids and bodies made before timing: a publish's line arrives made.
    let ids: Vec<String> = (0..PER_SHARD).map(|n| format!("sender_1-{n:09}")).collect();
    let bodies: Vec<String> = ids.iter().map(|id| body(id)).collect();
    let mut g = c.benchmark_group("shard");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("publish_1k_durable", |b| {
        b.iter_custom(|iters| publish_new(iters, &ids, &bodies))
    });
    g.finish();
}

criterion_group!(benches, publish);
criterion_main!(benches);
