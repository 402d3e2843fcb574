//! The broker process is killed with SIGKILL at random moments under
//! pipelined load, 10 times, and restarted on the same data directory;
//! publishers retry what was never acknowledged. Finally a consumer drains
//! the queue: every id that was ever `ACK`ed must be delivered. Duplicates
//! are allowed (counted and printed), losses are not. (`power_loss.rs` does
//! the same with the page cache dropped at each crash.) A second test kills
//! it while a fully acked segment's ids are being carried to the dedup file,
//! and checks that every acked id stays refused as a duplicate.

mod common;

use std::path::{Path, PathBuf};

use ciphermq_clients::connection::Connection;
use ciphermq_shard::log::queue_dir;
use common::process::{assert_none_lost, drain_counting, load_through_crashes, BrokerProcess};
use common::{body, config_text, fetch, ids, next, pki, setup_receiver};

const CRASHES: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_repeated_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = durable_with_queue(dir.path(), 2, 65536).await;
    let (acked, broker) = load_through_crashes(&config, CRASHES, 3000, BrokerProcess::kill).await;
    let delivered = drain_counting(&broker).await;
    assert_none_lost(
        &format!("crash test: {CRASHES} SIGKILLs"),
        &acked,
        &delivered,
    );
}

/// Ids acked within the dedup window must stay refused through a SIGKILL at
/// any point of the carry that precedes a segment's deletion (their ids
/// written to the dedup file a bounded number a round, the segment deleted
/// only once they all are), and an unacked message must survive it.
///
/// Each cycle publishes and acks until the log rolls past a segment holding
/// more ids than one round carries, makes those acks durable (a publish after
/// them is `ACK`ed: one log, synced in order), and kills the broker at once,
/// while that segment is still being carried or just deleted. After the last
/// cycle every acked id is published again by its sender: each must be
/// answered `ACK` and none stored again, so the queue holds the last barrier
/// only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_ids_stay_deduplicated_through_sigkill_during_a_segment_carry() {
    use std::collections::BTreeSet;

    use ciphermq_shard::durability::CARRY_PER_ROUND;

    const CYCLES: usize = 4;
    let queue = "receiver_1_queue";
    let dir = tempfile::tempdir().unwrap();
    let config = durable_with_queue(dir.path(), 1, 8 << 20).await;
    let data = dir.path().join("data");
    // Published and `ACK`ed, not acked by the consumer yet.
    let mut outstanding = BTreeSet::new();
    let mut consumed: Vec<String> = Vec::new();
    let mut killed_before_deletion = 0;
    for cycle in 0..CYCLES {
        let broker = BrokerProcess::start(&config);
        let mut s = broker.connect("sender_1").await;
        let mut r = broker.connect("receiver_1").await;
        // What the last kill left: the barrier, redelivered.
        let left = fetch_all(&mut r, queue).await;
        assert!(
            left.iter().all(|id| outstanding.contains(id)),
            "cycle {cycle}: redelivered {left:?}, but only {outstanding:?} was owed"
        );
        ack_all(&mut r, queue, &left).await;
        for id in &left {
            outstanding.remove(id);
        }
        consumed.extend(left);
        let first_base = newest_segment_base(&data, queue);
        loop {
            let batch: Vec<String> = (consumed.len()..consumed.len() + 256)
                .map(|i| format!("carried-{i}"))
                .collect();
            publish_all(&mut s, &batch).await;
            assert_eq!(fetch_all(&mut r, queue).await, batch, "cycle {cycle}");
            ack_all(&mut r, queue, &batch).await;
            consumed.extend(batch);
            if newest_segment_base(&data, queue) > first_base {
                break;
            }
        }
        let rolled = newest_segment_base(&data, queue);
        assert!(
            rolled - first_base > CARRY_PER_ROUND as u64,
            "the acked segment holds {} ids, more than a round carries",
            rolled - first_base
        );
        // Its ack records precede this message in the log, so they are
        // durable once it is.
        let barrier = format!("barrier-{cycle}");
        publish_all(&mut s, std::slice::from_ref(&barrier)).await;
        outstanding.insert(barrier);
        broker.kill();
        if oldest_segment_base(&data, queue) <= first_base {
            killed_before_deletion += 1;
        }
    }
    let broker = BrokerProcess::start(&config);
    let mut s = broker.connect("sender_1").await;
    for batch in consumed.chunks(256) {
        publish_all(&mut s, batch).await;
    }
    let left = drain_counting(&broker).await;
    let stored_again = left.keys().filter(|id| !outstanding.contains(*id)).count();
    assert_eq!(
        stored_again, 0,
        "after {CYCLES} kills during carries, {stored_again} acked ids published again were stored again"
    );
    assert_eq!(
        left.keys().cloned().collect::<BTreeSet<_>>(),
        outstanding,
        "the unacked barrier was lost"
    );
    // A round carries only after commits, and a kill follows the segment's
    // last ack by two or three of them: far fewer than its ids need.
    assert!(
        killed_before_deletion > 0,
        "every kill came after the acked segment was deleted: no carry was interrupted"
    );
}

/// Writes `dir/broker.toml` (durable, `data` under `dir`, rolling segments at
/// `segment_bytes`) and sets up receiver_1's queue with it: the config's path.
async fn durable_with_queue(dir: &Path, shards: usize, segment_bytes: u64) -> PathBuf {
    let config = dir.join("broker.toml");
    let text = config_text(&pki().certs, &dir.join("data"), shards, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace(
            "[storage]",
            &format!("[storage]\nsegment_bytes = {segment_bytes}"),
        );
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    assert!(broker.stop().success());
    config
}

/// Publishes `ids` pipelined and expects `ACK` for each, in order.
async fn publish_all(s: &mut Connection, ids: &[String]) {
    for id in ids {
        s.queue_line(&format!("publish ex receiver_1 {}", body(id, "receiver_1")));
    }
    s.flush().await.unwrap();
    for id in ids {
        assert_eq!(next(s).await, format!("ACK {id}"));
    }
}

/// Fetches until the queue has nothing more to give: the ids in order.
async fn fetch_all(r: &mut Connection, queue: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let batch = ids(&fetch(r, queue, 1000).await);
        if batch.is_empty() {
            return got;
        }
        got.extend(batch);
    }
}

/// Acks `ids` pipelined and expects `ACK_CONFIRMED` for each.
async fn ack_all(r: &mut Connection, queue: &str, ids: &[String]) {
    for id in ids {
        r.queue_line(&format!("ack {id} {queue}"));
    }
    r.flush().await.unwrap();
    for id in ids {
        assert_eq!(next(r).await, format!("ACK_CONFIRMED {id}"));
    }
}

/// The bases of the queue's segment files, ascending (none before its first
/// message made its directory).
fn segment_bases(data: &Path, queue: &str) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(queue_dir(data, queue)) else {
        return Vec::new();
    };
    let mut bases: Vec<u64> = entries
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_prefix("segment-")?
                .strip_suffix(".log")?
                .parse()
                .ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

fn newest_segment_base(data: &Path, queue: &str) -> u64 {
    segment_bases(data, queue).last().copied().unwrap_or(0)
}

fn oldest_segment_base(data: &Path, queue: &str) -> u64 {
    segment_bases(data, queue).first().copied().unwrap_or(0)
}
