//! One queue's state machine: FIFO ready messages, deliveries owed until acked,
//! competing consumers served round robin within their prefetch, per-sender
//! dedup, and dead-lettering after `max_deliveries`.
//!
//! No I/O and no clock: the caller passes `now`, and deliveries are appended to
//! a caller's buffer, so every rule here is unit-tested deterministically.
//!
//! Map: this file holds the [`Queue`] struct, its small public types, the
//! constructors (`new`, `metered`, `restore`) and the accessors; each file
//! under `queue/` is an `impl Queue` block for one concern:
//! - `dedup`: the ids it remembers, forgotten and carried.
//! - `enqueue`: messages coming in (publish, redelivered, dead letter).
//! - `disk`: messages on disk: placement, spill, backlog reads.
//! - `deliver`: dispatch, fetch, ack, requeue, redelivery, consumers.
//! - `purge`: `purge_queue` and its settling, a deleted queue's messages.
//! - `tests`: the unit tests.

mod dedup;
mod deliver;
mod disk;
mod enqueue;
mod purge;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backlog::DiskBacklog;
use crate::dedup::{DedupHasher, DedupKey};
use crate::dedup::{IdSet, Tick};
use crate::log::record::{message_record_bytes, Framing};
use crate::message::Message;
use crate::placement::{ConnRef, ShardId};

/// Limits every queue applies.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// Most messages held (ready + unacked); more are refused, never evicted.
    pub max_len: usize,
    /// Most body bytes held (ready + unacked), alongside `max_len`; a
    /// publish that would pass it is refused. 0: no byte cap.
    pub max_bytes: u64,
    /// Most body bytes all queues of one shard may hold together (their
    /// [`HeldBytes`]); a publish that would pass it is refused. `None`: no
    /// such cap (durable queues, whose bodies are also on disk).
    pub shard_bytes: Option<u64>,
    /// Body bytes the queues of one shard keep in memory before durable
    /// ones move theirs to disk only (their shard's part of the memory
    /// budget, durable mode). `None`: every body stays in memory.
    pub spill_bytes: Option<u64>,
    /// Deliveries (nacked ones included) before a message moves to `{queue}.dlq`.
    pub max_deliveries: u32,
    /// How long an acked id still counts as a duplicate for its sender.
    pub dedup_window: Duration,
    /// How long a delivery may stay unacked before it is redelivered; `None`: forever.
    pub ack_wait: Option<Duration>,
    /// The dedup hash key (kept in the data directory when durable).
    pub dedup_hasher: DedupHasher,
    /// Durable logs: acked ids are carried out of segments before these are
    /// deleted, so the dedup window survives restarts.
    pub carry_dedup: bool,
    /// Most deliveries one `fetch` returns, whatever it asks: a fetch is
    /// rendered into one reply, which must stay bounded.
    pub max_fetch: u32,
    /// Body bytes one `fetch` returns at most (it always returns at least
    /// one message when there is one): the same bound in bytes.
    pub max_fetch_bytes: usize,
    /// Most unacked deliveries one consumer may hold, whatever its
    /// `consume` asks.
    pub max_prefetch: u32,
    /// Body bytes one consumer may hold unacked (one message at least):
    /// its prefetch in bytes, so that large bodies read back from disk
    /// cannot fill memory at the pace of a prefetch counted in messages.
    pub max_prefetch_bytes: u64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_len: 1_000_000,
            max_bytes: 0,
            shard_bytes: None,
            spill_bytes: None,
            max_deliveries: 10,
            dedup_window: Duration::from_secs(120),
            ack_wait: None,
            dedup_hasher: DedupHasher::random(),
            carry_dedup: false,
            max_fetch: 10_000,
            max_fetch_bytes: 16 << 20,
            max_prefetch: 10_000,
            max_prefetch_bytes: 16 << 20,
        }
    }
}

/// One delivery of a message to a connection.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The queue it comes from.
    pub queue: Arc<str>,
    /// The queue's shard, where `ack` must go.
    pub shard: ShardId,
    /// The message's sequence number in that queue.
    pub seq: u64,
    /// 1 on first delivery, one more on each redelivery.
    pub count: u32,
    /// The message.
    pub msg: Arc<Message>,
}

/// A stored message and how often it was delivered.
#[derive(Debug)]
pub struct Entry {
    /// Position in the queue, increasing.
    pub seq: u64,
    /// The message.
    pub msg: Arc<Message>,
    /// Deliveries so far.
    pub deliveries: u32,
    /// Where its record starts in segment `segment` of the queue's log,
    /// once durable; [`UNPLACED`] before (and in memory mode). Only a
    /// placed message may leave memory.
    pub offset: u32,
    /// The base of the log segment holding its record, once placed.
    pub segment: u64,
}

/// The offset of a message whose record is not durable yet.
pub const UNPLACED: u32 = u32::MAX;

/// The segment of a delivered message whose write failed (with
/// [`UNPLACED`]): still owed to its consumer, but stored nowhere, so
/// settling it must not make its id count as stored or acked for the dedup
/// window. Its publisher was answered `NACK storage`; its retry is stored
/// anew.
pub const UNWRITTEN: u64 = u64::MAX;

impl Entry {
    /// Whether its write failed after it was delivered ([`UNWRITTEN`]).
    pub fn is_unwritten(&self) -> bool {
        self.offset == UNPLACED && self.segment == UNWRITTEN
    }

    /// Adds it to a backlog on disk (its body stays in its log only);
    /// returns its body bytes.
    fn push_to(&self, disk: &mut DiskBacklog) -> u64 {
        let body = self.msg.body().len() as u64;
        let route = self.msg.route();
        let record = message_record_bytes(
            self.msg.sender(),
            self.msg.message_id(),
            route.exchange,
            route.routing_key,
            body,
        );
        disk.push(
            self.seq,
            self.segment,
            Framing::V2,
            u64::from(self.offset),
            record,
            body,
            self.deliveries,
        );
        body
    }

    /// A message not on disk yet.
    pub fn unplaced(seq: u64, msg: Arc<Message>, deliveries: u32) -> Entry {
        Entry {
            seq,
            msg,
            deliveries,
            offset: UNPLACED,
            segment: 0,
        }
    }
}

/// What an accepted publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored as a new message at this sequence number.
    Stored(u64),
    /// The same sender already stored this id here (still queued or acked within
    /// the dedup window): nothing new stored, and the publish is acknowledged.
    Duplicate,
}

/// The queue holds `max_len` messages, or the message would take it past
/// `max_bytes`, or its shard past `shard_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("queue full")]
pub struct QueueFull;

/// Bytes held by every queue of one shard together: the memory budget's
/// meter. Each queue adds and subtracts its own where it counts them, so
/// the sums are exact without a scan. Per shard, so never shared across
/// threads.
#[derive(Debug, Clone, Default)]
pub struct HeldBytes(Rc<Meter>);

#[derive(Debug, Default)]
struct Meter {
    /// Bodies in memory and the charge for ids on disk.
    total: Cell<u64>,
    /// Bodies in memory only (ready, and delivered but unacked).
    bodies: Cell<u64>,
}

impl HeldBytes {
    /// Bytes held now: bodies in memory and the ids of those on disk.
    pub fn get(&self) -> u64 {
        self.0.total.get()
    }

    /// Body bytes in memory now: what reading a backlog back adds to, so
    /// what decides whether a read fits the budget.
    pub fn bodies(&self) -> u64 {
        self.0.bodies.get()
    }

    /// Adds to the charge for ids (not bodies).
    fn add(&self, n: u64) {
        self.0.total.set(self.0.total.get().saturating_add(n));
    }

    fn sub(&self, n: u64) {
        debug_assert!(
            n <= self.0.total.get(),
            "the meter gives back more than it holds"
        );
        self.0.total.set(self.0.total.get().saturating_sub(n));
    }

    fn add_bodies(&self, n: u64) {
        self.add(n);
        self.0.bodies.set(self.0.bodies.get().saturating_add(n));
    }

    fn sub_bodies(&self, n: u64) {
        self.sub(n);
        debug_assert!(
            n <= self.0.bodies.get(),
            "the meter gives back more body bytes than it holds"
        );
        self.0.bodies.set(self.0.bodies.get().saturating_sub(n));
    }
}

#[derive(Debug)]
struct Inflight {
    entry: Entry,
    conn: ConnRef,
    /// Redelivered when still unacked then (`ack_wait`).
    deadline: Option<Instant>,
}

#[derive(Debug)]
struct Consumer {
    conn: ConnRef,
    prefetch: u32,
    inflight: u32,
    /// Body bytes of the `inflight` deliveries.
    inflight_bytes: u64,
    /// Most of `inflight_bytes` before it waits for acks (it always takes
    /// one message when it holds none, however large).
    prefetch_bytes: u64,
}

impl Consumer {
    /// Whether it may take one more delivery.
    fn has_room(&self) -> bool {
        self.inflight < self.prefetch && self.inflight_bytes < self.prefetch_bytes
    }
}

/// An acked key whose only evidence is its message's log segment.
#[derive(Debug)]
struct Uncarried {
    seq: u64,
    key: DedupKey,
    until: Tick,
}

/// What one remembered id costs in memory, about (see [`crate::dedup`]):
/// the memory budget charges it for every message whose body is on disk.
pub const ID_BYTES: u64 = 16;

/// Stands for "already persisted outside the segments" in restored entries.
pub const CARRIED: u64 = u64::MAX;

/// One queue.
#[derive(Debug)]
pub struct Queue {
    name: Arc<str>,
    shard: ShardId,
    next_seq: u64,
    /// Body bytes of every message held (ready, requeued and unacked, on
    /// disk or not): what `max_bytes` caps.
    bytes: u64,
    /// The part of `bytes` held in memory: what the shard's meter counts.
    resident: u64,
    /// The shard's meter, which `resident` and `charged` are part of.
    held: HeldBytes,
    /// What the ids of its messages on disk are charged on the meter
    /// ([`ID_BYTES`] each): past the budget, a backlog's cost in memory.
    charged: u64,
    /// Ready messages in memory, oldest first: all of them while `disk` is
    /// empty, else those read back ahead of the consumers.
    ready: VecDeque<Entry>,
    /// Ready messages after `ready` whose bodies are only in the log.
    disk: DiskBacklog,
    /// Messages a `purge_queue` dropped while their bodies were on disk
    /// only: gone for consumers, their ids still marked stored. They are
    /// read through in the background, in order, each one's id then
    /// remembered as acked and its ack logged (see [`Queue::absorb`]).
    purged_disk: DiskBacklog,
    /// Why its last log write failed, until one succeeds: its own storage
    /// failure, reported for it alone.
    storage_error: Option<Arc<str>>,
    /// Messages a `purge_queue` dropped while they were in memory, in the
    /// batches it took them out in (whole deques, so a purge moves no
    /// message): gone for consumers, still on the meter and their ids still
    /// marked stored until [`Queue::settle_purged`] gets to them, a slice
    /// at a time, so that a purge of a million messages never holds the
    /// shard for the whole of them.
    purged_mem: VecDeque<VecDeque<Entry>>,
    /// Ready messages after `disk`, in memory: published since the queue
    /// started spilling, not durable yet or not spilled yet. Empty while
    /// `disk` is.
    tail: VecDeque<Entry>,
    /// Redeliveries, served before `ready`, oldest first.
    requeued: BTreeMap<u64, Entry>,
    unacked: HashMap<u64, Inflight, crate::hashers::BuildIntHasher>,
    consumers: Vec<Consumer>,
    next_consumer: usize,
    /// Connections a delivery was taken back from after `ack_wait`, until
    /// they close: they still count it outstanding, so a deletion must
    /// tell them too ([`Queue::holders`]), or an ack of it could reach the
    /// queue declared again under this name, and settle that queue's own
    /// message of the same seq.
    expired_holders: Vec<ConnRef>,
    /// Ids of the messages it holds and of those acked within the window.
    dedup: IdSet,
    /// With durable logs: acked keys whose only evidence is their message's
    /// log segment, in sequence order, until that segment is deleted and
    /// they are carried to the dedup file (each key once). Acks come nearly
    /// in order, so nearly every entry is pushed at the back.
    uncarried: VecDeque<Uncarried>,
    /// Delivery deadlines in delivery order (stale entries skipped lazily).
    deadlines: VecDeque<(Instant, u64)>,
    /// Its owner is moving to another node: it delivers nothing and takes
    /// nothing until the move ends ([`Queue::set_frozen`]).
    frozen: bool,
}

impl Queue {
    /// An empty queue named `name` on `shard`, counted on a meter of its
    /// own, with the default dedup window.
    pub fn new(name: Arc<str>, shard: ShardId) -> Queue {
        let window = QueueSettings::default().dedup_window;
        Queue::metered(name, shard, HeldBytes::default(), window)
    }

    /// An empty queue named `name` on `shard` whose bodies count on `held`
    /// (its shard's meter), remembering acked ids for `dedup_window`.
    pub fn metered(
        name: Arc<str>,
        shard: ShardId,
        held: HeldBytes,
        dedup_window: Duration,
    ) -> Queue {
        Queue {
            name,
            shard,
            next_seq: 0,
            bytes: 0,
            resident: 0,
            held,
            charged: 0,
            ready: VecDeque::new(),
            disk: DiskBacklog::default(),
            purged_disk: DiskBacklog::default(),
            storage_error: None,
            frozen: false,
            purged_mem: VecDeque::new(),
            tail: VecDeque::new(),
            requeued: BTreeMap::new(),
            unacked: HashMap::default(),
            consumers: Vec::new(),
            expired_holders: Vec::new(),
            next_consumer: 0,
            dedup: IdSet::new(dedup_window),
            uncarried: VecDeque::new(),
            deadlines: VecDeque::new(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Why its last log write failed, `None` once one succeeded.
    pub fn storage_error(&self) -> Option<&Arc<str>> {
        self.storage_error.as_ref()
    }

    /// Records how its last log write went (`None`: it succeeded); returns
    /// whether that changes what is recorded.
    pub fn set_storage_error(&mut self, error: Option<Arc<str>>) -> bool {
        let changed = self.storage_error.is_some() != error.is_some();
        self.storage_error = error;
        changed
    }

    /// Stops (or restarts) deliveries and fetches: while its owner moves to
    /// another node, its log must stop changing so that it can be handed
    /// over as it stands.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    /// Whether it is frozen for a move (it then takes no publish).
    #[inline]
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Messages waiting for delivery.
    pub fn ready_len(&self) -> usize {
        self.ready.len() + self.requeued.len() + self.disk.len() as usize + self.tail.len()
    }

    /// Ready messages whose bodies are only on disk.
    pub fn disk_len(&self) -> u64 {
        self.disk.len()
    }

    /// Purged messages on disk not read through yet: their ids are still
    /// marked stored, and a restart now would bring them back.
    pub fn purging_len(&self) -> u64 {
        self.purged_disk.len()
    }

    /// Whether purged messages in memory wait for [`Queue::settle_purged`].
    pub fn has_purged_in_memory(&self) -> bool {
        !self.purged_mem.is_empty()
    }

    /// Whether the backlog, or a purge of it, has reads to make.
    pub fn has_disk_work(&self) -> bool {
        !self.disk.is_empty() || !self.purged_disk.is_empty()
    }

    /// Body bytes held in memory (the part of [`Queue::bytes`] on the
    /// shard's meter).
    pub fn resident_bytes(&self) -> u64 {
        self.resident
    }

    /// Deliveries not yet acked.
    pub fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    /// Sequence numbers of the deliveries not yet acked, ascending: what a
    /// purge keeps.
    pub fn unacked_seqs(&self) -> Vec<u64> {
        let mut seqs: Vec<u64> = self.unacked.keys().copied().collect();
        seqs.sort_unstable();
        seqs
    }

    /// Body bytes of the messages held, ready and unacked.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Accounts for a message leaving the queue (acked, dead-lettered,
    /// discarded).
    fn release_bytes(&mut self, entry: &Entry) {
        let n = entry.msg.body().len() as u64;
        debug_assert!(n <= self.resident, "a released body was not resident");
        self.bytes = self.bytes.saturating_sub(n);
        self.resident = self.resident.saturating_sub(n);
        self.held.sub_bodies(n);
    }

    /// Brings the meter's charge for ids on disk up to date.
    fn recharge(&mut self) {
        let charge = (self.disk.len() + self.purged_disk.len()) * ID_BYTES;
        if charge > self.charged {
            self.held.add(charge - self.charged);
        } else {
            self.held.sub(self.charged - charge);
        }
        self.charged = charge;
    }

    /// Accounts for a message joining the queue.
    fn hold_bytes(&mut self, msg: &Message) {
        let n = msg.body().len() as u64;
        self.bytes += n;
        self.resident += n;
        self.held.add_bodies(n);
    }

    /// Ids remembered for dedup (stored, or acked within the window): what
    /// the dedup window costs in memory.
    pub fn remembered_ids(&self) -> usize {
        self.dedup.len()
    }

    /// Heap bytes the remembered ids take.
    pub fn dedup_bytes(&self) -> u64 {
        self.dedup.heap_bytes()
    }

    /// Registered consumers.
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// Whether a read of the backlog is in flight.
    pub fn is_reading(&self) -> bool {
        self.disk.is_reading() || self.purged_disk.is_reading()
    }

    /// Whether anyone could take a message now: a consumer with room.
    pub fn has_consumer_room(&self) -> bool {
        self.consumers.iter().any(Consumer::has_room)
    }

    /// The consumers whose prefetch is used up, while messages wait for
    /// them (their acks are what frees the queue), starting with the one
    /// next in turn.
    pub fn full_consumers(&self) -> impl Iterator<Item = ConnRef> + '_ {
        let n = if self.ready_len() == 0 {
            0
        } else {
            self.consumers.len()
        };
        (0..n)
            .map(move |i| &self.consumers[(self.next_consumer + i) % n])
            .filter(|c| !c.has_room())
            .map(|c| c.conn)
    }

    /// The sequence number the next stored message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Rebuilds a queue from its log: unacked messages in order, on disk
    /// (read back as consumers want them), those a purge took and had not
    /// settled (`purged`: read through at once), and the ids recovery found
    /// (`dedup`: every unacked message's, and those acked within the
    /// window). `evidence` lists the acked ids whose only evidence is a
    /// segment (key, Unix ms of the ack, a seq of that segment), to carry
    /// to the dedup file when it is deleted.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        name: Arc<str>,
        shard: ShardId,
        held: HeldBytes,
        next_seq: u64,
        backlog: DiskBacklog,
        purged: DiskBacklog,
        dedup: IdSet,
        evidence: &[(DedupKey, u64, u64)],
        settings: &QueueSettings,
        now: Instant,
        now_unix_ms: u64,
    ) -> Queue {
        let mut q = Queue::metered(name, shard, held, settings.dedup_window);
        q.next_seq = next_seq;
        q.bytes = backlog.bytes();
        q.disk = backlog;
        q.purged_disk = purged;
        q.recharge();
        q.dedup = dedup;
        if settings.carry_dedup {
            let window_ms = settings.dedup_window.as_millis() as u64;
            for &(key, at, holder) in evidence {
                if holder != CARRIED && at.saturating_add(window_ms) > now_unix_ms {
                    let until = Tick::after_unix_ms(at, window_ms, now, now_unix_ms);
                    q.note_uncarried(holder, key, until);
                }
            }
        }
        q
    }
}

/// A queue that goes (deleted, or its shard stopping) takes its bodies off
/// its shard's meter.
impl Drop for Queue {
    fn drop(&mut self) {
        self.held.sub_bodies(self.resident);
        self.held.sub(self.charged);
    }
}

#[cfg(test)]
mod tests;
