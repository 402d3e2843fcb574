//! Kills during a segment's dedup carry: before a fully acked segment is
//! deleted, the ids acked in it within the dedup window are written to the
//! queue's dedup file, a bounded number each commit round, and the segment
//! goes only once they all are. A crash at any point of that must leave every
//! acked id refused as a duplicate, and every unacked message queued.

use std::collections::BTreeSet;
use std::path::Path;

use ciphermq_clients::connection::Connection;
use ciphermq_shard::durability::CARRY_PER_ROUND;
use ciphermq_shard::log::queue_dir;

use super::process::{drain_counting, BrokerProcess};
use super::{body, fetch, ids, next};

const QUEUE: &str = "receiver_1_queue";

/// Runs `cycles` cycles on `config` (durable, receiver_1's queue declared,
/// segments large enough to hold more ids than one round carries, data in
/// `data`), then checks the promise.
///
/// Each cycle publishes and acks until the log rolls past a segment, makes
/// those acks durable (a publish after them is `ACK`ed: one log, synced in
/// order), kills the broker at once, while that segment is still being
/// carried or was just deleted, and calls `after_kill` (a power cut, say).
/// After the last cycle every acked id is published again by its sender:
/// each must be answered `ACK` and none stored again, so the queue holds
/// the last cycle's unacked barrier only.
pub async fn acked_ids_refused_through_carry_crashes(
    config: &Path,
    data: &Path,
    cycles: usize,
    mut after_kill: impl FnMut(),
) {
    // Published and `ACK`ed, not acked by the consumer yet.
    let mut outstanding = BTreeSet::new();
    let mut consumed: Vec<String> = Vec::new();
    let mut killed_before_deletion = 0;
    // Each killed broker's warnings and errors, for a failure's message.
    let mut logs = String::new();
    for cycle in 0..cycles {
        let broker = BrokerProcess::start(config);
        let mut s = broker.connect("sender_1").await;
        let mut r = broker.connect("receiver_1").await;
        // What the last kill left: the barrier, redelivered.
        let left = fetch_all(&mut r).await;
        assert!(
            left.iter().all(|id| outstanding.contains(id)),
            "cycle {cycle}: redelivered {left:?}, but only {outstanding:?} was owed"
        );
        ack_all(&mut r, &left).await;
        for id in &left {
            outstanding.remove(id);
        }
        consumed.extend(left);
        // The segment the cycle's first batch went to: its file exists once
        // that batch is `ACK`ed (synced). Read before that, the directory may
        // still show only the last cycle's segment (a restarted log creates
        // its new one with its first write, here the barrier's ack, which
        // is written after its `ACK_CONFIRMED`), and this cycle's first
        // batch would look like a roll.
        let mut first_base = None;
        loop {
            let batch: Vec<String> = (consumed.len()..consumed.len() + 256)
                .map(|i| format!("carried-{i}"))
                .collect();
            publish_all(&mut s, &batch).await;
            assert_eq!(fetch_all(&mut r).await, batch, "cycle {cycle}");
            ack_all(&mut r, &batch).await;
            consumed.extend(batch);
            let newest = newest_segment_base(data);
            match first_base {
                None => first_base = Some(newest),
                Some(first) if newest > first => break,
                Some(_) => {}
            }
        }
        let first_base = first_base.expect("one batch at least");
        let rolled = newest_segment_base(data);
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
        logs.push_str(&format!("--- cycle {cycle}\n{}\n", broker.log_text()));
        broker.kill();
        if oldest_segment_base(data) <= first_base {
            killed_before_deletion += 1;
        }
        after_kill();
    }
    let broker = BrokerProcess::start(config);
    let mut s = broker.connect("sender_1").await;
    for batch in consumed.chunks(256) {
        publish_all(&mut s, batch).await;
    }
    let left = drain_counting(&broker).await;
    let stored_again = left.keys().filter(|id| !outstanding.contains(*id)).count();
    assert_eq!(
        stored_again, 0,
        "after {cycles} kills during carries, {stored_again} of {} acked ids published again were stored again; segments {:?}; the brokers' logs:\n{logs}--- last\n{}",
        consumed.len(),
        segment_bases(data),
        broker.log_text()
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
async fn fetch_all(r: &mut Connection) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let batch = ids(&fetch(r, QUEUE, 1000).await);
        if batch.is_empty() {
            return got;
        }
        got.extend(batch);
    }
}

/// Acks `ids` pipelined and expects `ACK_CONFIRMED` for each.
async fn ack_all(r: &mut Connection, ids: &[String]) {
    for id in ids {
        r.queue_line(&format!("ack {id} {QUEUE}"));
    }
    r.flush().await.unwrap();
    for id in ids {
        assert_eq!(next(r).await, format!("ACK_CONFIRMED {id}"));
    }
}

/// The bases of the queue's segment files, ascending (none before its first
/// message made its directory).
fn segment_bases(data: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(queue_dir(data, QUEUE)) else {
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

fn newest_segment_base(data: &Path) -> u64 {
    segment_bases(data).last().copied().unwrap_or(0)
}

fn oldest_segment_base(data: &Path) -> u64 {
    segment_bases(data).first().copied().unwrap_or(0)
}
