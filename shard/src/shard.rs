//! One shard: the queues it owns, the mailboxes of the connections it serves,
//! and its end of the mesh.
//!
//! Every entry point is synchronous. What must happen on another shard is
//! buffered in the outbound mesh; the driver calls [`Shard::flush`] after each
//! piece of work.
//!
//! Map: this file holds the [`Shard`] struct, its small public types, `new`
//! and the accessors; each file under `shard/` is an `impl Shard` block
//! for one concern:
//! - `publish`: routing a publish and storing it in this shard's queues.
//! - `deliver`: dispatch to consumers, `consume`, `fetch`, `ack`,
//!   `requeue`, and giving back what a closed connection owed.
//! - `dead_letter`: moving given-up messages to their `{queue}.dlq`.
//! - `commit`: the committer's jobs and what a finished one releases.
//! - `budget`: the memory budget (bodies moved to disk, reads that wait).
//! - `reads`: reading backlogs back from disk, and fetches that wait.
//! - `chores`: work too large for one step, done a slice at a time.
//! - `lifecycle`: restore, connections, purge, delete, the sweep.
//! - `inbox`: messages from other shards, and answers to commands.
//! - `moving`, `take_back`: an owner leaving the node, or taken back.

mod budget;
mod chores;
mod commit;
mod dead_letter;
mod deliver;
mod inbox;
mod lifecycle;
mod moving;
mod publish;
mod reads;
mod take_back;

pub use take_back::TakenBack;

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ciphermq_proto::NackReason;

use crate::clock::Clock;
use crate::dedup::DedupKey;
use crate::durability::Durability;
use crate::hashers::{NameMap, NameSet};
use crate::mailbox::Mailbox;
use crate::mesh::{MeshOutbound, Origin};
use crate::message::Message;
use crate::placement::{ConnRef, ShardId};
use crate::queue::{Delivery, Entry, HeldBytes, Queue, QueueSettings};
use crate::routing::Target;
use crate::topology::{Topology, TopologyStore, TopologyView};

/// Where a publish stands right after [`Shard::publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStatus {
    /// Finished: `ACK` on `Ok`, `NACK <reason>` on `Err`.
    Done(Result<(), NackReason>),
    /// `remote` shards still have to report
    /// ([`Completion::Enqueued`](crate::mailbox::Completion::Enqueued) events,
    /// one per shard); `local` is the outcome of the queues on this shard.
    Pending {
        /// Outcome of the local part.
        local: Result<(), NackReason>,
        /// Reports still to come.
        remote: u32,
    },
}

/// A queue's counters, for status pages.
#[derive(Debug, Clone)]
pub struct QueueStats {
    /// Queue name.
    pub name: Arc<str>,
    /// Messages waiting.
    pub ready: usize,
    /// Deliveries not yet acked.
    pub unacked: usize,
    /// Body bytes of the ready and unacked messages (what
    /// `performance.max_queue_bytes` caps).
    pub bytes: u64,
    /// Registered consumers.
    pub consumers: usize,
    /// Ready messages whose bodies are only on disk (past the memory budget).
    pub on_disk: u64,
    /// The part of `bytes` held in memory.
    pub memory_bytes: u64,
    /// Ids it remembers for dedup (its messages', and those acked within
    /// the window).
    pub dedup_ids: usize,
    /// Heap bytes those ids take.
    pub dedup_bytes: u64,
    /// Why its last log write failed, until one succeeds.
    pub storage_error: Option<Arc<str>>,
}

/// How reading backlogs back from disk went on one shard, since it started.
#[derive(Debug, Clone, Copy, Default)]
pub struct BacklogReads {
    /// Reads made.
    pub reads: u64,
    /// Bytes they returned.
    pub bytes: u64,
    /// Messages read back into memory.
    pub messages: u64,
    /// Reads that failed (tried again a second later).
    pub errors: u64,
    /// Damaged bytes skipped (never served).
    pub damaged_bytes: u64,
    /// Messages not found where their run said (damaged or missing).
    pub lost: u64,
    /// Bodies moved out of memory.
    pub spilled_bytes: u64,
    /// Purged messages settled by reading them through (their bodies were
    /// on disk only when `purge_queue` dropped them).
    pub purged: u64,
}

/// A `fetch` that ran into messages on disk: answered once they are read
/// (or it has `max`), with what it took so far.
#[derive(Debug)]
struct WaitingFetch {
    origin: Origin,
    queue: Arc<str>,
    max: u32,
    got: Vec<Delivery>,
}

/// Work a command started that is too large for one shard step, done a
/// slice at a time between other tasks' turns ([`Shard::do_chores`]).
#[derive(Debug, Default)]
struct Chores {
    /// Queues holding purged messages in memory still to settle.
    settle: Vec<Arc<str>>,
    /// Messages of deleted queues, still to drop (each one a body to free).
    drop: Vec<VecDeque<Entry>>,
    /// Deliveries closed connections still owe, to give back for redelivery.
    give_back: VecDeque<GiveBack>,
    /// The task doing them, woken when there are some.
    waker: Option<std::task::Waker>,
}

impl Chores {
    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// The deliveries a closed connection still owes in one queue, given back a
/// slice at a time from `next` on.
#[derive(Debug)]
struct GiveBack {
    queue: Arc<str>,
    conn: ConnRef,
    /// In order, so that redeliveries keep the queue's order.
    seqs: Vec<u64>,
    next: usize,
}

/// What one call of [`Shard::do_chores`] got through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoreProgress {
    /// This many messages settled or freed (0: nothing left to do).
    Done(usize),
    /// Work is left, but the ack records of the last slice are not taken by
    /// a commit yet: settling waits for the committer, so that a large
    /// purge adds at most a slice to each commit round, and the publishes
    /// committed beside it are not held behind megabytes of ack records.
    WaitingForCommit,
}

/// Merges two outcomes of one publish: any refusal wins, the first one kept.
#[inline]
pub fn merge_outcome(
    a: Result<(), NackReason>,
    b: Result<(), NackReason>,
) -> Result<(), NackReason> {
    a.and(b)
}

/// One shard's state.
#[derive(Debug)]
pub struct Shard {
    id: ShardId,
    settings: QueueSettings,
    topology: TopologyView,
    queues: NameMap<Arc<str>, Queue>,
    /// Body bytes all of `queues` hold: what `settings.shard_bytes` caps.
    held: HeldBytes,
    conns: HashMap<u64, Rc<Mailbox>, crate::hashers::BuildIntHasher>,
    next_conn: u64,
    out: MeshOutbound,
    targets: Vec<Target>,
    deliveries: Vec<(ConnRef, Delivery)>,
    dead: Vec<Entry>,
    /// Scratch for [`Shard::ack_many`]: the batch's acked seqs and keys.
    acked: Vec<(u64, DedupKey)>,
    /// Logs and group commit; `None` for in-memory queues.
    durable: Option<Durability>,
    /// Queues that may want a read of their backlog, checked when the
    /// reader takes its jobs.
    to_read: Vec<Arc<str>>,
    /// Queues whose read failed, asked again at the next sweep.
    read_retry: Vec<Arc<str>>,
    /// Queues whose read waits for the memory budget: asked again when a
    /// settled delivery frees some (and at the next sweep).
    budget_waiting: Vec<Arc<str>>,
    /// The reader task, woken when a queue wants a read.
    reader: Option<std::task::Waker>,
    waiting_fetches: Vec<WaitingFetch>,
    /// Purges to settle and deleted queues' messages to drop.
    chores: Chores,
    backlog: BacklogReads,
    /// Messages moved to a dead-letter queue since start.
    dead_lettered: u64,
    last_spill_search: Option<Instant>,
    /// Queues of owners being moved to another node (see `moving`): not
    /// created again by a publish or a consume while they are.
    frozen: NameSet<Arc<str>>,
    /// Where the shard reads the time it is not handed.
    clock: Clock,
    /// Dead letters whose dead-letter commit failed: (source queue, seq
    /// there, message), stored again at the next sweep.
    dead_retry: Vec<(Arc<str>, u64, Arc<Message>)>,
}

impl Shard {
    /// A shard with no queues and no connections; `durable` holds the logs
    /// (`None`: queues live in memory only).
    pub fn new(
        settings: QueueSettings,
        store: Arc<TopologyStore>,
        out: MeshOutbound,
        durable: Option<Durability>,
    ) -> Shard {
        Shard {
            id: out.shard(),
            settings,
            topology: TopologyView::new(store),
            queues: NameMap::default(),
            held: HeldBytes::default(),
            conns: HashMap::default(),
            next_conn: 1,
            out,
            targets: Vec::new(),
            deliveries: Vec::new(),
            dead: Vec::new(),
            acked: Vec::new(),
            durable,
            to_read: Vec::new(),
            read_retry: Vec::new(),
            budget_waiting: Vec::new(),
            reader: None,
            waiting_fetches: Vec::new(),
            chores: Chores::default(),
            backlog: BacklogReads::default(),
            dead_lettered: 0,
            last_spill_search: None,
            frozen: NameSet::default(),
            clock: Clock::System,
            dead_retry: Vec::new(),
        }
    }

    /// Makes the shard read the time from `clock` (a simulation's) wherever
    /// it is not handed it.
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// The clock the shard reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// How reading backlogs back went.
    pub fn backlog_reads(&self) -> BacklogReads {
        self.backlog
    }

    /// Messages this shard moved to a dead-letter queue since it started.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered
    }

    /// This shard's index.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// How many shards the broker runs.
    pub fn shards(&self) -> usize {
        self.out.shards()
    }

    /// The latest topology snapshot.
    pub fn topology(&mut self) -> &Arc<Topology> {
        self.topology.current()
    }

    /// The topology writer, for declares and binds.
    pub fn topology_store(&self) -> &Arc<TopologyStore> {
        self.topology.store()
    }

    /// Every connection mailbox, e.g. to close them on shutdown.
    pub fn mailboxes(&self) -> impl Iterator<Item = &Rc<Mailbox>> {
        self.conns.values()
    }

    fn queue_mut(&mut self, name: &str) -> Option<&mut Queue> {
        if !self.queues.contains_key(name) {
            if self.frozen.contains(name) {
                return None;
            }
            let info = self.topology.current().queue(name)?;
            if info.shard != self.id {
                return None;
            }
            let name = info.name.clone();
            let queue = Queue::metered(
                name.clone(),
                self.id,
                self.held.clone(),
                self.settings.dedup_window,
            );
            self.queues.insert(name, queue);
        }
        self.queues.get_mut(name)
    }

    /// Sends what the last piece of work buffered for other shards.
    pub fn flush(&mut self) {
        if self.out.has_pending() {
            self.out.flush();
        }
    }

    /// Body bytes this shard's queues hold in memory.
    pub fn resident_bytes(&self) -> u64 {
        self.queues.values().map(Queue::resident_bytes).sum()
    }

    /// What the memory budget counts on this shard: bodies in memory, and
    /// [`crate::queue::ID_BYTES`] for each message whose body is on disk.
    pub fn held_bytes(&self) -> u64 {
        self.held.get()
    }

    /// Counters of the queues this shard owns.
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        self.queues
            .values()
            .map(|q| QueueStats {
                name: q.name().clone(),
                ready: q.ready_len(),
                unacked: q.unacked_len(),
                bytes: q.bytes(),
                consumers: q.consumer_count(),
                on_disk: q.disk_len(),
                memory_bytes: q.resident_bytes(),
                dedup_ids: q.remembered_ids(),
                dedup_bytes: q.dedup_bytes(),
                storage_error: q.storage_error().cloned(),
            })
            .collect()
    }
}
