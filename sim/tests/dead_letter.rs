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
    match result.try_take() {
        Some(Ok(())) => {}
        other => panic!("topology change not applied: {other:?}"),
    }
}

fn commit_all(committer: &mut Committer, shard: &mut Shard, disk: &mut SimDisk, faults: Faults) {
    let mut rng = Rng::new(1);
    while committer.has_work(shard) {
        committer.step(shard, disk, &mut rng, faults);
    }
}

/// One durable shard with exchange `x` routing `k` to queue `q` (owner
/// `r`), a message given up after its first delivery, a simulated disk and
/// committer, and one connection.
struct Fixture {
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    disk: SimDisk,
    store: Arc<TopologyStore>,
    shard: Shard,
    clock: Clock,
    manual: Arc<ciphermq_shard::ManualClock>,
    committer: Committer,
    conn: ciphermq_shard::ConnRef,
    mailbox: std::rc::Rc<ciphermq_shard::Mailbox>,
    settings: QueueSettings,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().to_path_buf();
        std::fs::create_dir_all(data.join("queues")).expect("queues dir");
        let disk = SimDisk::new(&data).expect("disk");
        let store = Arc::new(TopologyStore::new(1));
        change(
            &store,
            TopologyChange::DeclareExchange {
                name: "x".into(),
                kind: ExchangeKind::Direct,
                owner: None,
            },
        );
        let settings = QueueSettings {
            max_deliveries: 1,
            dedup_hasher: DedupHasher::from_bytes([7; 16]),
            ..QueueSettings::default()
        };
        let endpoint = Mesh::build(1).pop().expect("one shard");
        let durable = Durability::new(data.clone(), 1 << 20, None, Arc::new(DiskSpace::new()));
        let mut shard = Shard::new(
            settings.clone(),
            store.clone(),
            endpoint.outbound,
            Some(durable),
        );
        let (clock, manual) = Clock::manual(1_700_000_000_000);
        shard.set_clock(clock.clone());
        let (conn, mailbox) = shard.register_conn();
        let fixture = Fixture {
            _dir: dir,
            data,
            disk,
            store,
            shard,
            clock,
            manual,
            committer: Committer::default(),
            conn,
            mailbox,
            settings,
        };
        fixture.declare_q();
        fixture
    }

    /// Declares `q` and binds it to `x` under `k`.
    fn declare_q(&self) {
        change(
            &self.store,
            TopologyChange::DeclareQueue {
                name: "q".into(),
                owner: "r".into(),
                by: None,
            },
        );
        change(
            &self.store,
            TopologyChange::Bind {
                queue: "q".into(),
                exchange: "x".into(),
                key: "k".into(),
                by: Some(Actor::Admin),
            },
        );
    }

    fn origin(&self, seq: u64) -> Origin {
        Origin {
            conn: self.conn,
            seq,
        }
    }

    fn commit_all(&mut self, faults: Faults) {
        commit_all(&mut self.committer, &mut self.shard, &mut self.disk, faults);
    }

    /// Publishes `id` to `q` and commits it; asserts it was ACKed.
    fn publish_stored(&mut self, id: &str, seq: u64) {
        let msg = Message::new(id, "{\"to\":\"r\"}", Arc::from("s"));
        let now = self.clock.now();
        let status = self
            .shard
            .publish(self.origin(seq), "x", "k", "r", msg, now);
        assert!(
            matches!(status, PublishStatus::Pending { .. }),
            "{status:?}"
        );
        self.commit_all(NO_FAULTS);
        let mut events = std::collections::VecDeque::new();
        self.mailbox.drain_into(&mut events);
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
    }

    /// Fetches `q`'s one message and gives it back: past `max_deliveries`,
    /// it is dead-lettered (not committed yet).
    fn give_up_one(&mut self, seq: u64) {
        let info = self.store.snapshot().queue("q").cloned().expect("q");
        let now = self.clock.now();
        let Some(Completion::Fetched(got)) = self.shard.fetch(self.origin(seq), &info, 10, now)
        else {
            panic!("fetch answered at once");
        };
        assert_eq!(got.len(), 1);
        let mut tracker = ciphermq_shard::DeliveryTracker::default();
        tracker.record(&got[0]);
        let mut owed = Vec::new();
        tracker.take(got[0].msg.message_id(), None, &mut owed);
        self.shard.requeue(self.conn, &owed[0], now);
    }

    /// The sweep a second later.
    fn sweep_later(&mut self) {
        self.manual.advance(Duration::from_secs(1));
        let now = self.clock.now();
        self.shard.sweep(now);
    }
}

#[test]
fn a_failed_dead_letter_commit_leaves_the_message_in_the_dead_letter_queue() {
    let mut f = Fixture::new();
    // Published and stored; delivered once, given back: past
    // max_deliveries, dead-lettered.
    f.publish_stored("m-1", 1);
    f.give_up_one(2);

    // The dead-letter queue's commit fails; the next sweep stores the
    // message there again.
    f.commit_all(ALL_FAIL);
    f.sweep_later();

    // The message is still served, from the dead-letter queue.
    let dlq = f
        .store
        .snapshot()
        .queue("q.dlq")
        .cloned()
        .expect("q.dlq declared");
    let now = f.clock.now();
    let Some(Completion::Fetched(got)) = f.shard.fetch(f.origin(3), &dlq, 10, now) else {
        panic!("fetch answered at once");
    };
    assert_eq!(
        got.iter().map(|d| d.msg.message_id()).collect::<Vec<_>>(),
        vec!["m-1"],
        "the dead-lettered message is in the dead-letter queue after its failed commit"
    );
    // And once the retried commit succeeds, the source's ack is written.
    f.commit_all(NO_FAULTS);
    let stats = f.shard.queue_stats();
    let source = stats.iter().find(|q| &*q.name == "q").expect("q stats");
    assert_eq!(
        (source.ready, source.unacked),
        (0, 0),
        "the source holds nothing"
    );
}

/// Found by a debug assertion in the simulation (seeds 138 and 171 on two
/// shards): the ack a dead-lettering owed its source queue was appended,
/// by name, to a queue declared again under that name after the source was
/// deleted. There it acked a message of the new queue's own (the same seq),
/// which a restart then lost, though its publish was ACKed.
#[test]
fn an_ack_owed_to_a_deleted_queue_does_not_reach_one_declared_again() {
    let mut f = Fixture::new();
    f.publish_stored("m-1", 1);
    f.give_up_one(2);
    // Its dead-letter commit fails: the ack stays owed to `q`.
    f.commit_all(ALL_FAIL);

    // `q` is deleted and declared again; a new message goes in.
    let info = f.store.snapshot().queue("q").cloned().expect("q");
    change(
        &f.store,
        TopologyChange::DeleteQueue {
            name: "q".into(),
            by: Actor::receiver("r"),
        },
    );
    let (mut removed, done) = ciphermq_shard::pending::pending();
    f.shard.delete_queue(&info, done);
    f.commit_all(NO_FAULTS);
    assert!(
        matches!(removed.try_take(), Some(Ok(()))),
        "the delete is done"
    );
    change(&f.store, TopologyChange::QueueRemoved { name: "q".into() });
    f.declare_q();
    f.publish_stored("m-2", 3);

    // The sweep that would store the dead letter again, and its commit.
    f.sweep_later();
    f.commit_all(NO_FAULTS);

    // After a restart, the new queue still holds its ACKed message.
    let window_ms = f.settings.dedup_window.as_millis() as u64;
    let dir = ciphermq_shard::log::queue_dir(&f.data, "q");
    let recovered =
        ciphermq_shard::log::recover_queue_at(&dir, &f.settings.dedup_hasher, window_ms, &f.clock)
            .expect("recovered");
    let queued: u64 = recovered.backlog.iter().map(|run| run.count).sum();
    assert_eq!(queued, 1, "m-2 is still queued: {:?}", recovered.backlog);
}
