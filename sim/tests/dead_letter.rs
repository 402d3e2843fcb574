//! A dead-lettered message whose dead-letter commit fails stays served.
//!
//! Found by the simulation (seeds 74, 105, 140, … of 1,000 at 3,000 steps
//! each, before the fix): a message given up after its last delivery left
//! its source queue in memory at once, and when the dead-letter queue's
//! commit failed its copy there was dropped too, so no consumer could get
//! it again until a restart read it back from the source's log. Now the
//! failed dead-letter store is made again.

use std::sync::Arc;
use std::time::Duration;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::durability::DiskSpace;
use ciphermq_shard::topology::Actor;
use ciphermq_shard::{
    Clock, Completion, ConnEvent, DedupHasher, Durability, Mesh, Message, Origin, PublishStatus,
    QueueSettings, Shard, TopologyChange, TopologyStore,
};
use ciphermq_sim::committer::{Committer, Faults};
use ciphermq_sim::disk::SimDisk;
use ciphermq_sim::rng::Rng;

const NO_FAULTS: Faults = Faults {
    io_per_mille: 0,
    read_per_mille: 0,
};
const ALL_FAIL: Faults = Faults {
    io_per_mille: 1000,
    read_per_mille: 0,
};

fn change(store: &TopologyStore, change: TopologyChange) {
    let mut result = store.submit(change);
    assert!(
        matches!(result.try_take(), Some(Ok(()))),
        "topology change applied"
    );
}

fn commit_all(committer: &mut Committer, shard: &mut Shard, disk: &mut SimDisk, faults: Faults) {
    let mut rng = Rng::new(1);
    while committer.has_work(shard) {
        committer.step(shard, disk, &mut rng, faults);
    }
}

#[test]
fn a_failed_dead_letter_commit_leaves_the_message_in_the_dead_letter_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_path_buf();
    std::fs::create_dir_all(data.join("queues")).expect("queues dir");
    let mut disk = SimDisk::new(&data).expect("disk");
    let store = Arc::new(TopologyStore::new(1));
    change(
        &store,
        TopologyChange::DeclareExchange {
            name: "x".into(),
            kind: ExchangeKind::Direct,
            owner: None,
        },
    );
    change(
        &store,
        TopologyChange::DeclareQueue {
            name: "q".into(),
            owner: "r".into(),
            by: None,
        },
    );
    change(
        &store,
        TopologyChange::Bind {
            queue: "q".into(),
            exchange: "x".into(),
            key: "k".into(),
            by: Some(Actor::Admin),
        },
    );
    let settings = QueueSettings {
        max_deliveries: 1,
        dedup_hasher: DedupHasher::from_bytes([7; 16]),
        ..QueueSettings::default()
    };
    let endpoint = Mesh::build(1).pop().expect("one shard");
    let durable = Durability::new(data.clone(), 1 << 20, None, Arc::new(DiskSpace::new()));
    let mut shard = Shard::new(settings, store.clone(), endpoint.outbound, Some(durable));
    let (clock, manual) = Clock::manual(1_700_000_000_000);
    shard.set_clock(clock.clone());
    let mut committer = Committer::default();
    let (conn, mailbox) = shard.register_conn();
    let origin = |seq| Origin { conn, seq };

    // Published and stored.
    let msg = Message::new("m-1", "{\"to\":\"r\"}", Arc::from("s"));
    let status = shard.publish(origin(1), "x", "k", "r", msg, clock.now());
    assert!(
        matches!(status, PublishStatus::Pending { .. }),
        "{status:?}"
    );
    commit_all(&mut committer, &mut shard, &mut disk, NO_FAULTS);
    let mut events = std::collections::VecDeque::new();
    mailbox.drain_into(&mut events);
    assert!(
        events.iter().any(|e| matches!(
            e,
            ConnEvent::Completed {
                completion: Completion::Enqueued(Ok(())),
                ..
            }
        )),
        "publish ACKed: {events:?}"
    );

    // Delivered once, given back: past max_deliveries, dead-lettered.
    let info = store.snapshot().queue("q").cloned().expect("q");
    let Some(Completion::Fetched(got)) = shard.fetch(origin(2), &info, 10, clock.now()) else {
        panic!("fetch answered at once");
    };
    assert_eq!(got.len(), 1);
    let mut tracker = ciphermq_shard::DeliveryTracker::default();
    tracker.record(&got[0]);
    let mut owed = Vec::new();
    tracker.take("m-1", None, &mut owed);
    shard.requeue(conn, &owed[0], clock.now());

    // The dead-letter queue's commit fails; the next sweep stores the
    // message there again.
    commit_all(&mut committer, &mut shard, &mut disk, ALL_FAIL);
    manual.advance(Duration::from_secs(1));
    shard.sweep(clock.now());

    // The message is still served, from the dead-letter queue.
    let dlq = store
        .snapshot()
        .queue("q.dlq")
        .cloned()
        .expect("q.dlq declared");
    let Some(Completion::Fetched(got)) = shard.fetch(origin(3), &dlq, 10, clock.now()) else {
        panic!("fetch answered at once");
    };
    assert_eq!(
        got.iter().map(|d| d.msg.message_id()).collect::<Vec<_>>(),
        vec!["m-1"],
        "the dead-lettered message is in the dead-letter queue after its failed commit"
    );
    // And once the retried commit succeeds, the source's ack is written.
    commit_all(&mut committer, &mut shard, &mut disk, NO_FAULTS);
    let stats = shard.queue_stats();
    let source = stats.iter().find(|q| &*q.name == "q").expect("q stats");
    assert_eq!(
        (source.ready, source.unacked),
        (0, 0),
        "the source holds nothing"
    );
}
