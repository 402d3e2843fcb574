//! One shard: the queues it owns, the mailboxes of the connections it serves,
//! and its end of the mesh.
//!
//! Every entry point is synchronous. What must happen on another shard is
//! buffered in the outbound mesh; the driver calls [`Shard::flush`] after each
//! piece of work.

mod budget;
mod chores;
mod commit;
mod dead_letter;
mod deliver;
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
use crate::durability::{Durability, QueueRemoval};
use crate::hashers::{NameMap, NameSet};
use crate::log::{QueueLog, RecoveredQueue};
use crate::mailbox::{Completion, ConnEvent, Mailbox};
use crate::mesh::{MeshOutbound, Origin, ShardMsg};
use crate::message::Message;
use crate::pending::Resolver;
use crate::placement::{ConnRef, ShardId};
use crate::queue::{Delivery, Entry, HeldBytes, Queue, QueueSettings};
use crate::routing::Target;
use crate::topology::{QueueInfo, Topology, TopologyStore, TopologyView};

/// Where a publish stands right after [`Shard::publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStatus {
    /// Finished: `ACK` on `Ok`, `NACK <reason>` on `Err`.
    Done(Result<(), NackReason>),
    /// `remote` shards still have to report ([`Completion::Enqueued`] events,
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

    /// Rebuilds a queue this shard owns from its recovered log.
    pub fn restore_queue(&mut self, name: Arc<str>, recovered: RecoveredQueue, now: Instant) {
        let mut backlog = crate::backlog::DiskBacklog::default();
        for run in recovered.backlog {
            backlog.push_run(run, []);
        }
        backlog.push_deliveries(recovered.deliveries.iter().copied());
        let mut purged = crate::backlog::DiskBacklog::default();
        for run in recovered.purged {
            purged.push_run(run, []);
        }
        let queue = Queue::restore(
            name.clone(),
            self.id,
            self.held.clone(),
            recovered.next_seq,
            backlog,
            purged,
            recovered.dedup,
            &recovered.acked,
            &self.settings,
            now,
            self.clock.unix_ms(),
        );
        let purging = queue.purging_len();
        tracing::info!(queue = %name, ready = queue.ready_len(), purging, "queue recovered");
        if let Some(d) = &mut self.durable {
            let log = QueueLog::recovered(
                d.dir_of(&name),
                d.segment_bytes(),
                recovered.next_seq,
                &recovered.segments,
                &recovered.dedup_files,
            );
            d.insert_log(name.clone(), log, recovered.next_seq);
        }
        self.queues.insert(name.clone(), queue);
        if purging > 0 {
            // The purge's read-through goes on where it stopped.
            self.want_read(&name);
        }
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

    /// Registers a connection served by this shard.
    pub fn register_conn(&mut self) -> (ConnRef, Rc<Mailbox>) {
        let id = self.next_conn;
        self.next_conn += 1;
        let mailbox = Rc::new(Mailbox::default());
        self.conns.insert(id, mailbox.clone());
        (ConnRef { shard: self.id, id }, mailbox)
    }

    /// Every connection mailbox, e.g. to close them on shutdown.
    pub fn mailboxes(&self) -> impl Iterator<Item = &Rc<Mailbox>> {
        self.conns.values()
    }

    /// Forgets a closed connection. When it ever consumed or fetched, every
    /// shard requeues what it owed and drops its consumers.
    pub fn unregister_conn(&mut self, conn: ConnRef, consumed: bool) {
        self.conns.remove(&conn.id);
        if consumed {
            for shard in 0..self.out.shards() as ShardId {
                if shard == self.id {
                    self.conn_closed(conn);
                } else {
                    self.out.send(shard, ShardMsg::ConnClosed { conn });
                }
            }
        }
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

    /// `purge_queue`: drops the queue's ready messages; `Some` when finished
    /// here, `None` when its shard will report.
    pub fn purge(&mut self, origin: Origin, queue: &QueueInfo, now: Instant) -> Option<Completion> {
        if queue.shard != self.id {
            self.out.send(
                queue.shard,
                ShardMsg::Purge {
                    origin,
                    queue: queue.name.clone(),
                },
            );
            return None;
        }
        self.purge_local(origin, &queue.name, now)
            .map(|count| Completion::Purged {
                count,
                durable: Ok(()),
            })
    }

    /// Purges a local queue. One purge record stands for every message it
    /// dropped (see [`crate::log::record::Record::Purge`]); their ack
    /// records follow as the purge settles: those in memory through the
    /// chores ([`Shard::do_chores`]), those on disk as the reader goes
    /// through them ([`Shard::read_done`]). Returns the count when done at
    /// once (nothing purged, or memory mode), `None` when the answer waits
    /// for the commit of the purge record (a restart after the answer never
    /// brings the purged messages back).
    fn purge_local(&mut self, origin: Origin, queue: &str, now: Instant) -> Option<u64> {
        // Declared but never used here yet: nothing to purge.
        if self.queue_mut(queue).is_none() {
            return Some(0);
        }
        let Some(q) = self.queues.get_mut(queue) else {
            return Some(0);
        };
        let count = q.purge(now);
        let read_through = q.purging_len() > 0 && !q.is_reading();
        let settle = q.has_purged_in_memory();
        let name = q.name().clone();
        let mut waits = false;
        if let (Some(d), true) = (&mut self.durable, count > 0) {
            // One record stands for every message purged, in memory or on
            // disk: the reply waits for it alone, and the ack records of
            // each (the dedup window's, the mirror's) follow as the purge
            // settles. A restart before then settles the rest by reading
            // them through.
            let id = d.new_purge_ticket(origin, count);
            let log = d.log(q.name(), q.next_seq());
            log.append_purge(q.next_seq(), q.unacked_seqs());
            log.add_waiter(id);
            waits = true;
        }
        if settle {
            if !self.chores.settle.contains(&name) {
                self.chores.settle.push(name.clone());
            }
            self.chores.wake();
        }
        if read_through {
            self.want_read(&name);
        }
        (!waits).then_some(count)
    }

    /// `delete_queue`, once the topology without `queue` is saved (so
    /// nothing routes to it or declares it again): its shard drops it, tells
    /// its consumers, and moves its log away; `done` resolves then.
    pub fn delete_queue(&mut self, queue: &QueueInfo, done: Resolver<Result<(), String>>) {
        if queue.shard != self.id {
            self.out.send(
                queue.shard,
                ShardMsg::DeleteQueue {
                    queue: queue.name.clone(),
                    done,
                },
            );
            return;
        }
        self.delete_local(&queue.name, done);
    }

    /// Drops a local queue: its ready messages and unacked deliveries go
    /// (its bytes leave the shard's meter), waiting fetches are answered with
    /// what they have, every consumer is told and every connection holding
    /// its deliveries forgets them, and its log goes to the committer.
    fn delete_local(&mut self, name: &Arc<str>, done: Resolver<Result<(), String>>) {
        if let Some(mut q) = self.queues.remove(name) {
            let (mine, others) = std::mem::take(&mut self.waiting_fetches)
                .into_iter()
                .partition(|f| f.queue == *name);
            self.waiting_fetches = others;
            let fetches: Vec<WaitingFetch> = mine;
            for f in fetches {
                self.complete(f.origin, Completion::Fetched(f.got));
            }
            for (conn, consumer) in q.holders() {
                self.tell_deleted(conn, name, consumer);
            }
            tracing::info!(queue = %name, ready = q.ready_len(), "queue deleted");
            // Its messages are freed a slice at a time; the rest of it
            // (and its bytes on the meter) goes now.
            let messages = q.take_messages();
            if !messages.is_empty() {
                self.chores.drop.extend(messages);
                self.chores.wake();
            }
        }
        self.chores.settle.retain(|q| q != name);
        self.to_read.retain(|q| q != name);
        self.read_retry.retain(|q| q != name);
        self.budget_waiting.retain(|q| q != name);
        match &mut self.durable {
            Some(d) => {
                // What waited for a commit of the log is answered as stored,
                // as it was, into a queue that is now gone (as when its job
                // was in flight: [`Durability::job_done`]).
                let waiters = d.retire(name, done);
                self.release_waiters(&waiters, true);
            }
            None => done.resolve(Ok(())),
        }
    }

    fn tell_deleted(&mut self, conn: ConnRef, queue: &Arc<str>, consumer: bool) {
        if conn.shard != self.id {
            self.out.send(
                conn.shard,
                ShardMsg::QueueDeleted {
                    conn,
                    queue: queue.clone(),
                    consumer,
                },
            );
            return;
        }
        if let Some(mailbox) = self.conns.get(&conn.id) {
            mailbox.push(ConnEvent::QueueDeleted {
                queue: queue.clone(),
                consumer,
            });
        }
    }

    /// Takes the deleted queues' directories due for removal (see
    /// [`QueueRemoval`]): the committer moves each away once the jobs it
    /// took before are done.
    pub fn take_removals(&mut self, out: &mut Vec<QueueRemoval>) {
        if let Some(d) = &mut self.durable {
            d.take_removals(out);
        }
    }

    /// The committer finished removing `queue`'s directory (moved it away,
    /// or failed to: the next start removes it).
    pub fn removal_done(&mut self, queue: &Arc<str>) {
        if let Some(d) = &mut self.durable {
            d.removal_done(queue);
        }
    }

    /// Redelivers deliveries unacked past `ack_wait`, and lets the committer
    /// delete segments the metadata mirror has caught up with; call about once
    /// a second.
    pub fn sweep(&mut self, now: Instant) {
        if let Some(d) = &mut self.durable {
            d.housekeeping(
                self.settings.dedup_window.as_millis() as u64,
                self.clock.unix_ms(),
            );
        }
        for name in std::mem::take(&mut self.read_retry) {
            self.want_read(&name);
        }
        for (source, seq, msg) in std::mem::take(&mut self.dead_retry) {
            self.store_dead_letter(&source, seq, msg);
        }
        self.wake_budget_waiting();
        // A restart brings bodies back into memory with no commit to follow.
        self.keep_budget();
        for q in self.queues.values_mut() {
            q.sweep_dedup(now);
        }
        if self.settings.ack_wait.is_none() {
            return;
        }
        let settings = self.settings.clone();
        let names: Vec<Arc<str>> = self.queues.keys().cloned().collect();
        for name in names {
            let mut dead = std::mem::take(&mut self.dead);
            let expired = self
                .queues
                .get_mut(&name)
                .map_or(0, |q| q.expire_deliveries(now, &settings, &mut dead));
            if expired > 0 {
                tracing::debug!(queue = %name, expired, "redelivering after ack_wait");
            }
            self.after_give_back(&name, expired > 0, dead, now);
        }
    }

    fn complete(&mut self, origin: Origin, completion: Completion) {
        if origin.conn.shard != self.id {
            self.out
                .send(origin.conn.shard, ShardMsg::Done { origin, completion });
            return;
        }
        if let Some(mailbox) = self.conns.get(&origin.conn.id) {
            mailbox.push(ConnEvent::Completed {
                seq: origin.seq,
                completion,
            });
        }
    }

    /// Handles one message from another shard.
    pub fn handle(&mut self, msg: ShardMsg, now: Instant) {
        match msg {
            ShardMsg::Enqueue {
                origin,
                queues,
                msg,
            } => {
                let mut outcome = Ok(());
                let mut ticket = None;
                for q in &queues {
                    let stored = self.enqueue_local(q, msg.clone(), now, origin, &mut ticket);
                    outcome = merge_outcome(outcome, stored);
                }
                match ticket.and_then(|id| self.durable.as_mut()?.tickets.get_mut(&id)) {
                    // Answered after the group commit, refusals included.
                    Some(t) => t.outcome = merge_outcome(t.outcome, outcome),
                    None => self.complete(origin, Completion::Enqueued(outcome)),
                }
            }
            ShardMsg::Consume {
                origin,
                queue,
                prefetch,
            } => {
                self.consume_local(origin.conn, &queue, prefetch, now);
                self.complete(origin, Completion::Consumed);
            }
            ShardMsg::Purge { origin, queue } => {
                if let Some(count) = self.purge_local(origin, &queue, now) {
                    let durable = Ok(());
                    self.complete(origin, Completion::Purged { count, durable });
                }
            }
            ShardMsg::Fetch { origin, queue, max } => {
                if let Some(deliveries) = self.fetch_local(origin, &queue, max, now) {
                    self.complete(origin, Completion::Fetched(deliveries));
                }
            }
            ShardMsg::Done { origin, completion } => {
                if let Some(mailbox) = self.conns.get(&origin.conn.id) {
                    mailbox.push(ConnEvent::Completed {
                        seq: origin.seq,
                        completion,
                    });
                }
            }
            ShardMsg::Deliver { conn, delivery } => {
                // A closed connection's deliveries are requeued by its ConnClosed.
                if let Some(mailbox) = self.conns.get(&conn.id) {
                    mailbox.push(ConnEvent::Delivery(delivery));
                }
            }
            ShardMsg::Ack { conn, queue, seq } => self.ack_local(conn, &queue, seq, now),
            ShardMsg::Requeue { conn, queue, seq } => self.requeue_local(conn, &queue, seq, now),
            ShardMsg::ConnClosed { conn } => self.conn_closed(conn),
            ShardMsg::DeleteQueue { queue, done } => self.delete_local(&queue, done),
            ShardMsg::Run(task) => (task.0)(self, now),
            ShardMsg::Barrier { done } => {
                let _ = done.send(self.id);
            }
            ShardMsg::QueueDeleted {
                conn,
                queue,
                consumer,
            } => {
                if let Some(mailbox) = self.conns.get(&conn.id) {
                    mailbox.push(ConnEvent::QueueDeleted { queue, consumer });
                }
            }
        }
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
