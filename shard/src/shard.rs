//! One shard: the queues it owns, the mailboxes of the connections it serves,
//! and its end of the mesh.
//!
//! Every entry point is synchronous. What must happen on another shard is
//! buffered in the outbound mesh; the driver calls [`Shard::flush`] after each
//! piece of work.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ciphermq_proto::NackReason;

use crate::mailbox::{Completion, ConnEvent, Mailbox};
use crate::mesh::{MeshOutbound, Origin, ShardMsg};
use crate::message::Message;
use crate::placement::{ConnRef, ShardId};
use crate::queue::{Delivery, Entry, Queue, QueueFull, QueueSettings};
use crate::routing::Target;
use crate::topology::{QueueInfo, Topology, TopologyStore, TopologyView};
use crate::tracker::Outstanding;

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
    /// Registered consumers.
    pub consumers: usize,
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
    queues: HashMap<Arc<str>, Queue>,
    conns: HashMap<u64, Rc<Mailbox>>,
    next_conn: u64,
    out: MeshOutbound,
    targets: Vec<Target>,
    deliveries: Vec<(ConnRef, Delivery)>,
    dead: Vec<Entry>,
}

impl Shard {
    /// A shard with no queues and no connections.
    pub fn new(settings: QueueSettings, store: Arc<TopologyStore>, out: MeshOutbound) -> Shard {
        Shard {
            id: out.shard(),
            settings,
            topology: TopologyView::new(store),
            queues: HashMap::new(),
            conns: HashMap::new(),
            next_conn: 1,
            out,
            targets: Vec::new(),
            deliveries: Vec::new(),
            dead: Vec::new(),
        }
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

    /// Routes a validated message and stores it in every matching queue:
    /// local queues now, remote ones through the mesh.
    pub fn publish(
        &mut self,
        origin: Origin,
        exchange: &str,
        routing_key: &str,
        msg: Arc<Message>,
        now: Instant,
    ) -> PublishStatus {
        let mut targets = std::mem::take(&mut self.targets);
        targets.clear();
        let exists = self
            .topology
            .current()
            .route(exchange, routing_key, &mut targets);
        if !exists || targets.is_empty() {
            self.targets = targets;
            return PublishStatus::Done(Err(NackReason::NoRoute));
        }
        let mut local = Ok(());
        let mut remote = 0u32;
        // Group remote targets per shard: one message per shard.
        targets.sort_unstable_by_key(|t| t.shard);
        let mut i = 0;
        while i < targets.len() {
            let shard = targets[i].shard;
            let mut j = i;
            while j < targets.len() && targets[j].shard == shard {
                j += 1;
            }
            if shard == self.id {
                for t in &targets[i..j] {
                    local = merge_outcome(local, self.enqueue_local(&t.queue, msg.clone(), now));
                }
            } else {
                let queues = targets[i..j].iter().map(|t| t.queue.clone()).collect();
                self.out.send(
                    shard,
                    ShardMsg::Enqueue {
                        origin,
                        queues,
                        msg: msg.clone(),
                    },
                );
                remote += 1;
            }
            i = j;
        }
        self.targets = targets;
        if remote == 0 {
            PublishStatus::Done(local)
        } else {
            PublishStatus::Pending { local, remote }
        }
    }

    fn queue_mut(&mut self, name: &str) -> Option<&mut Queue> {
        if !self.queues.contains_key(name) {
            let info = self.topology.current().queue(name)?;
            if info.shard != self.id {
                return None;
            }
            let name = info.name.clone();
            self.queues.insert(name.clone(), Queue::new(name, self.id));
        }
        self.queues.get_mut(name)
    }

    fn enqueue_local(
        &mut self,
        queue: &str,
        msg: Arc<Message>,
        now: Instant,
    ) -> Result<(), NackReason> {
        let settings = self.settings.clone();
        let Some(q) = self.queue_mut(queue) else {
            return Err(NackReason::NoRoute);
        };
        match q.enqueue(msg, now, &settings) {
            Ok(_) => {
                self.dispatch(queue, now);
                Ok(())
            }
            Err(QueueFull) => Err(NackReason::QueueFull),
        }
    }

    /// Pushes what `queue` can deliver now, and dead-letters what it gave up on.
    fn dispatch(&mut self, queue: &str, now: Instant) {
        let mut deliveries = std::mem::take(&mut self.deliveries);
        let mut dead = std::mem::take(&mut self.dead);
        if let Some(q) = self.queues.get_mut(queue) {
            q.dispatch(&self.settings, now, &mut deliveries, &mut dead);
        }
        for (conn, delivery) in deliveries.drain(..) {
            self.route_delivery(conn, delivery);
        }
        self.deliveries = deliveries;
        if !dead.is_empty() {
            self.dead_letter(queue, &mut dead, now);
        }
        self.dead = dead;
    }

    fn route_delivery(&mut self, conn: ConnRef, delivery: Delivery) {
        if conn.shard != self.id {
            self.out
                .send(conn.shard, ShardMsg::Deliver { conn, delivery });
            return;
        }
        match self.conns.get(&conn.id) {
            Some(mailbox) => mailbox.push(ConnEvent::Delivery(delivery)),
            // Unregistering a connection drops its consumers first, so this
            // cannot happen; were it to, ack_wait or a restart redelivers.
            None => tracing::warn!(queue = %delivery.queue, "delivery for a closed connection"),
        }
    }

    /// Moves given-up messages to `{queue}.dlq` (same owner, same shard),
    /// declaring it on first use.
    fn dead_letter(&mut self, queue: &str, dead: &mut Vec<Entry>, now: Instant) {
        let Some(owner) = self
            .topology
            .current()
            .queue(queue)
            .map(|q| q.owner.clone())
        else {
            dead.clear();
            return;
        };
        let dlq_name = format!("{queue}.dlq");
        let info = self.topology.store().declare_queue(&dlq_name, &owner);
        let Some(dlq) = self.queue_mut(&info.name) else {
            // Placement moved (cannot happen within one run): keep them here.
            tracing::error!(queue, "dead-letter queue is not on the queue's shard");
            dead.clear();
            return;
        };
        for entry in dead.drain(..) {
            tracing::warn!(
                queue,
                message_id = entry.msg.message_id(),
                "dead-lettered after max deliveries"
            );
            dlq.enqueue_dead(entry.msg);
        }
        self.dispatch(&dlq_name, now);
    }

    /// Registers a consumer; `Some` when finished here, `None` when the queue's
    /// shard will report.
    pub fn consume(
        &mut self,
        origin: Origin,
        queue: &QueueInfo,
        prefetch: u32,
        now: Instant,
    ) -> Option<Completion> {
        if queue.shard != self.id {
            self.out.send(
                queue.shard,
                ShardMsg::Consume {
                    origin,
                    queue: queue.name.clone(),
                    prefetch,
                },
            );
            return None;
        }
        self.consume_local(origin.conn, &queue.name, prefetch, now);
        Some(Completion::Consumed)
    }

    fn consume_local(&mut self, conn: ConnRef, queue: &str, prefetch: u32, now: Instant) {
        if let Some(q) = self.queue_mut(queue) {
            q.add_consumer(conn, prefetch);
            self.dispatch(queue, now);
        }
    }

    /// Pulls deliveries; `Some` when finished here, `None` when remote.
    pub fn fetch(
        &mut self,
        origin: Origin,
        queue: &QueueInfo,
        max: u32,
        now: Instant,
    ) -> Option<Completion> {
        if queue.shard != self.id {
            self.out.send(
                queue.shard,
                ShardMsg::Fetch {
                    origin,
                    queue: queue.name.clone(),
                    max,
                },
            );
            return None;
        }
        Some(Completion::Fetched(self.fetch_local(
            origin.conn,
            &queue.name,
            max,
            now,
        )))
    }

    fn fetch_local(&mut self, conn: ConnRef, queue: &str, max: u32, now: Instant) -> Vec<Delivery> {
        let settings = self.settings.clone();
        let mut out = Vec::new();
        let mut dead = std::mem::take(&mut self.dead);
        if let Some(q) = self.queue_mut(queue) {
            q.fetch(conn, max, &settings, now, &mut out, &mut dead);
        }
        if !dead.is_empty() {
            self.dead_letter(queue, &mut dead, now);
        }
        self.dead = dead;
        out
    }

    /// Acks an outstanding delivery of `conn`.
    pub fn ack(&mut self, conn: ConnRef, d: &Outstanding, now: Instant) {
        if d.shard != self.id {
            self.out.send(
                d.shard,
                ShardMsg::Ack {
                    conn,
                    queue: d.queue.clone(),
                    seq: d.seq,
                },
            );
            return;
        }
        self.ack_local(conn, &d.queue, d.seq, now);
    }

    fn ack_local(&mut self, conn: ConnRef, queue: &str, seq: u64, now: Instant) {
        let settings = self.settings.clone();
        if let Some(q) = self.queues.get_mut(queue) {
            if q.ack(seq, conn, now, &settings) {
                self.dispatch(queue, now);
            }
        }
    }

    /// Gives an outstanding delivery of `conn` back for redelivery.
    pub fn requeue(&mut self, conn: ConnRef, d: &Outstanding, now: Instant) {
        if d.shard != self.id {
            self.out.send(
                d.shard,
                ShardMsg::Requeue {
                    conn,
                    queue: d.queue.clone(),
                    seq: d.seq,
                },
            );
            return;
        }
        self.requeue_local(conn, &d.queue, d.seq, now);
    }

    fn requeue_local(&mut self, conn: ConnRef, queue: &str, seq: u64, now: Instant) {
        let settings = self.settings.clone();
        let mut dead = std::mem::take(&mut self.dead);
        let requeued = self
            .queues
            .get_mut(queue)
            .is_some_and(|q| q.requeue(seq, conn, &settings, now, &mut dead));
        self.after_give_back(queue, requeued, dead, now);
    }

    /// Dead-letters what a give-back produced and dispatches the queue.
    fn after_give_back(&mut self, queue: &str, changed: bool, mut dead: Vec<Entry>, now: Instant) {
        if !dead.is_empty() {
            self.dead_letter(queue, &mut dead, now);
        }
        self.dead = dead;
        if changed {
            self.dispatch(queue, now);
        }
    }

    fn conn_closed(&mut self, conn: ConnRef) {
        let now = Instant::now();
        let settings = self.settings.clone();
        let names: Vec<Arc<str>> = self.queues.keys().cloned().collect();
        for name in names {
            let mut dead = std::mem::take(&mut self.dead);
            if let Some(q) = self.queues.get_mut(&name) {
                q.remove_conn(conn, &settings, now, &mut dead);
            }
            self.after_give_back(&name, true, dead, now);
        }
    }

    /// Redelivers deliveries unacked past `ack_wait`; call about once a second.
    pub fn sweep(&mut self, now: Instant) {
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
                for q in &queues {
                    outcome = merge_outcome(outcome, self.enqueue_local(q, msg.clone(), now));
                }
                self.complete(origin, Completion::Enqueued(outcome));
            }
            ShardMsg::Consume {
                origin,
                queue,
                prefetch,
            } => {
                self.consume_local(origin.conn, &queue, prefetch, now);
                self.complete(origin, Completion::Consumed);
            }
            ShardMsg::Fetch { origin, queue, max } => {
                let deliveries = self.fetch_local(origin.conn, &queue, max, now);
                self.complete(origin, Completion::Fetched(deliveries));
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
        }
    }

    /// Sends what the last piece of work buffered for other shards.
    pub fn flush(&mut self) {
        if self.out.has_pending() {
            self.out.flush();
        }
    }

    /// Counters of the queues this shard owns.
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        self.queues
            .values()
            .map(|q| QueueStats {
                name: q.name().clone(),
                ready: q.ready_len(),
                unacked: q.unacked_len(),
                consumers: q.consumer_count(),
            })
            .collect()
    }
}
