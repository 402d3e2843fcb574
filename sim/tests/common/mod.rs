//! The durable one-shard world the simulation's regression tests share:
//! a shard over the simulated disk and committer, a direct exchange `x`
//! routing `k` to queue `q` (owner `r`), and one connection.

#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;
use std::time::Duration;

use ciphermq_shard::{
    Clock, Completion, ConnEvent, DedupHasher, Mesh, Message, Origin, PublishStatus, QueueSettings,
    Shard, TopologyChange, TopologyStore,
};
use ciphermq_sim::committer::{read_backlog, Committer, Faults};
use ciphermq_sim::disk::SimDisk;
use ciphermq_sim::rng::Rng;
use ciphermq_sim::shard_on_disk::{
    declare_bound_queue, durable_shard, fresh_data_dir, store_with_direct_exchange,
};

pub const NO_FAULTS: Faults = Faults::NONE;
pub const ALL_FAIL: Faults = Faults {
    io_per_mille: 1000,
    read_per_mille: 0,
    space_per_mille: 0,
};

pub fn change(store: &TopologyStore, change: TopologyChange) {
    ciphermq_sim::shard_on_disk::apply(store, change);
}

pub fn commit_all(
    committer: &mut Committer,
    shard: &mut Shard,
    disk: &mut SimDisk,
    faults: Faults,
) {
    let mut rng = Rng::new(1);
    while committer.has_work(shard) {
        committer.step(shard, disk, &mut rng, faults);
    }
}

/// One durable shard with exchange `x` routing `k` to queue `q` (owner
/// `r`), a message given up after its first delivery, a simulated disk and
/// committer, and one connection.
pub struct Fixture {
    pub _dir: tempfile::TempDir,
    pub data: std::path::PathBuf,
    pub disk: SimDisk,
    pub store: Arc<TopologyStore>,
    pub shard: Shard,
    pub clock: Clock,
    pub manual: Arc<ciphermq_shard::ManualClock>,
    pub committer: Committer,
    pub conn: ciphermq_shard::ConnRef,
    pub mailbox: std::rc::Rc<ciphermq_shard::Mailbox>,
    pub settings: QueueSettings,
}

impl Fixture {
    pub fn new() -> Fixture {
        let (dir, data, disk) = fresh_data_dir();
        let store = store_with_direct_exchange("x");
        let settings = QueueSettings {
            max_deliveries: 1,
            dedup_hasher: DedupHasher::from_bytes([7; 16]),
            ..QueueSettings::default()
        };
        let endpoint = Mesh::build(1).pop().expect("one shard");
        let (clock, manual) = Clock::manual(1_700_000_000_000);
        let mut shard = durable_shard(&data, 1 << 20, &settings, &store, endpoint.outbound, &clock);
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
    pub fn declare_q(&self) {
        declare_bound_queue(&self.store, "q", "r", "x", "k");
    }

    pub fn origin(&self, seq: u64) -> Origin {
        Origin {
            conn: self.conn,
            seq,
        }
    }

    pub fn commit_all(&mut self, faults: Faults) {
        commit_all(&mut self.committer, &mut self.shard, &mut self.disk, faults);
    }

    /// Publishes `id` to `q` and commits it; asserts it was ACKed.
    pub fn publish_stored(&mut self, id: &str, seq: u64) {
        self.publish(id, seq);
        self.commit_all(NO_FAULTS);
        let events = self.events();
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

    /// Publishes `id` to `q` as command `seq` of the connection; asserts
    /// the answer waits for a commit.
    pub fn publish(&mut self, id: &str, seq: u64) {
        let msg = Message::new(id, "{\"to\":\"r\"}", Arc::from("s"));
        let now = self.clock.now();
        let status = self
            .shard
            .publish(self.origin(seq), "x", "k", "r", &msg, now);
        assert!(
            matches!(status, PublishStatus::Pending { .. }),
            "{status:?}"
        );
    }

    /// One move of the committer (see [`Committer::step`]): takes and
    /// writes a round, finishing the one written before it.
    pub fn step(&mut self, faults: Faults) {
        let mut rng = Rng::new(1);
        self.committer
            .step(&mut self.shard, &mut self.disk, &mut rng, faults);
    }

    /// What the connection was told since the last look.
    pub fn events(&mut self) -> std::collections::VecDeque<ConnEvent> {
        let mut events = std::collections::VecDeque::new();
        self.mailbox.drain_into(&mut events);
        events
    }

    /// The publishes answered since the last call: (command seq, `ACK`).
    pub fn answers(&mut self) -> Vec<(u64, bool)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                ConnEvent::Completed {
                    seq,
                    completion: Completion::Enqueued(outcome),
                } => Some((seq, outcome.is_ok())),
                _ => None,
            })
            .collect()
    }

    /// How many messages a restart would find queued in `q`'s log.
    pub fn recovered_count(&self) -> u64 {
        let window_ms = self.settings.dedup_window.as_millis() as u64;
        let dir = ciphermq_shard::log::queue_dir(&self.data, "q");
        let recovered = ciphermq_shard::log::recover_queue_at(
            &dir,
            &self.settings.dedup_hasher,
            window_ms,
            &self.clock,
        )
        .expect("recovered");
        recovered.backlog.iter().map(|run| run.count).sum()
    }

    /// Fetches `q`'s one message and gives it back: past `max_deliveries`,
    /// it is dead-lettered (not committed yet).
    pub fn give_up_one(&mut self, seq: u64) {
        let held = self.fetch_one(seq);
        self.give_back(&held);
    }

    /// Fetches `q`'s one message (command `seq`) and holds it; a message
    /// waiting on disk (a recovered queue's) is read in first.
    pub fn fetch_one(&mut self, seq: u64) -> ciphermq_shard::Outstanding {
        let info = self.store.snapshot().queue("q").cloned().expect("q");
        let now = self.clock.now();
        let got = match self.shard.fetch(self.origin(seq), &info, 10, now) {
            Some(Completion::Fetched(got)) => got,
            None => {
                let mut rng = Rng::new(1);
                while read_backlog(&mut self.shard, &mut rng, NO_FAULTS, now) > 0 {}
                self.events()
                    .into_iter()
                    .find_map(|e| match e {
                        ConnEvent::Completed {
                            completion: Completion::Fetched(got),
                            ..
                        } => Some(got),
                        _ => None,
                    })
                    .expect("the fetch answered once its message was read")
            }
            Some(other) => panic!("fetch answered {other:?}"),
        };
        assert_eq!(got.len(), 1);
        let mut tracker = ciphermq_shard::DeliveryTracker::default();
        tracker.record(&got[0]);
        let mut owed = Vec::new();
        tracker.take(got[0].msg.message_id(), None, &mut owed);
        owed.pop().expect("the delivery is owed")
    }

    /// Gives a held delivery back (past `max_deliveries`: dead-lettered).
    pub fn give_back(&mut self, held: &ciphermq_shard::Outstanding) {
        let now = self.clock.now();
        self.shard.requeue(self.conn, held, now);
    }

    /// The sweep a second later.
    pub fn sweep_later(&mut self) {
        self.manual.advance(Duration::from_secs(1));
        let now = self.clock.now();
        self.shard.sweep(now);
    }
}
