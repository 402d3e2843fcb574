//! Deliveries: dispatching a queue's ready messages to its consumers,
//! `consume` and `fetch` (a fetch that runs into messages on disk waits
//! for them), `ack` and `requeue`, and giving back what a closed
//! connection owed. Apart from the publish path: this is what a queue
//! does with what it holds, whoever put it there.

use std::sync::Arc;
use std::time::Instant;

use super::{GiveBack, Shard, WaitingFetch};
use crate::mailbox::{Completion, ConnEvent};
use crate::mesh::{Origin, ShardMsg};
use crate::placement::ConnRef;
use crate::queue::{Delivery, Entry};
use crate::topology::QueueInfo;
use crate::tracker::Outstanding;

/// Deliveries a connection's close gives back in its own step; the rest
/// (a connection may owe a prefetch on each of a thousand queues, millions
/// in all) are given back as chores, a slice at a time.
const GIVE_BACK_AT_CLOSE: usize = 1024;

/// Full consumers one publish wakes at most (`Shard::dispatch`).
const MAX_NUDGES: usize = 8;

impl Shard {
    /// Pushes what `queue` can deliver now, and dead-letters what it gave up on.
    pub(super) fn dispatch(&mut self, queue: &str, now: Instant) {
        if !self.budget_waiting.is_empty() {
            self.wake_budget_waiting();
        }
        let mut deliveries = std::mem::take(&mut self.deliveries);
        let mut dead = std::mem::take(&mut self.dead);
        if let Some(q) = self.queues.get_mut(queue) {
            q.dispatch(&self.settings, now, &mut deliveries, &mut dead);
            if let (Some(d), false) = (&mut self.durable, deliveries.is_empty()) {
                let log = d.log(q.name(), q.next_seq());
                let at = self.clock.unix_ms();
                for (_, delivery) in &deliveries {
                    log.append_delivered(delivery.seq, delivery.count, at);
                }
            }
            if deliveries.is_empty() {
                // Every consumer is full: wake them, so each reads the acks
                // its socket may hold before glommio's reactor sees them
                // (broker/src/conn/serving.rs). A few per publish: a queue with
                // thousands of full consumers must not cost thousands of
                // lookups a publish.
                for conn in q.full_consumers().take(MAX_NUDGES) {
                    if conn.shard == self.id {
                        if let Some(mailbox) = self.conns.get(&conn.id) {
                            mailbox.wake();
                        }
                    }
                }
            }
            // Only a consumer with room wants the next batch (a fetch asks
            // for itself): publishes into a backlog wake no reader.
            if q.disk_len() > 0 && !q.is_reading() && q.has_consumer_room() {
                let name = q.name().clone();
                self.want_read(&name);
            }
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

    pub(super) fn consume_local(
        &mut self,
        conn: ConnRef,
        queue: &str,
        prefetch: u32,
        now: Instant,
    ) {
        let prefetch = prefetch.min(self.settings.max_prefetch);
        let prefetch_bytes = self.settings.max_prefetch_bytes;
        if let Some(q) = self.queue_mut(queue) {
            q.add_consumer(conn, prefetch, prefetch_bytes);
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
        self.fetch_local(origin, &queue.name, max, now)
            .map(Completion::Fetched)
    }

    /// `None`: the fetch ran into messages on disk, so it waits for them
    /// to be read (answered by [`Shard::read_done`]): a fetch returns what
    /// a queue holds up to `max`, wherever the bodies are.
    pub(super) fn fetch_local(
        &mut self,
        origin: Origin,
        queue: &str,
        max: u32,
        now: Instant,
    ) -> Option<Vec<Delivery>> {
        self.fetch_more(origin, queue, max, Vec::new(), now)
    }

    /// [`Shard::fetch_local`] continued, `out` taken so far.
    pub(super) fn fetch_more(
        &mut self,
        origin: Origin,
        queue: &str,
        max: u32,
        mut out: Vec<Delivery>,
        now: Instant,
    ) -> Option<Vec<Delivery>> {
        let conn = origin.conn;
        let settings = self.settings.clone();
        let body_room = self.has_body_room();
        let mut dead = std::mem::take(&mut self.dead);
        if self.queue_mut(queue).is_some() {
            let Some(q) = self.queues.get_mut(queue) else {
                return Some(out);
            };
            let before = out.len();
            let want = max.min(settings.max_fetch) as usize;
            let bytes: usize = out.iter().map(|d| d.msg.body().len()).sum();
            let left = u32::try_from(want.saturating_sub(before)).unwrap_or(0);
            q.fetch_more(conn, left, bytes, &settings, now, &mut out, &mut dead);
            let bytes: usize = out.iter().map(|d| d.msg.body().len()).sum();
            if let (Some(d), false) = (&mut self.durable, out.len() == before) {
                let log = d.log(q.name(), q.next_seq());
                let at = self.clock.unix_ms();
                for delivery in &out[before..] {
                    log.append_delivered(delivery.seq, delivery.count, at);
                }
            }
            // Past the budget, a fetch that has some answers with them: its
            // own deliveries would keep the read it waits for from starting.
            if out.len() < want
                && bytes < settings.max_fetch_bytes
                && q.disk_len() > 0
                && (out.is_empty() || body_room)
            {
                let name = q.name().clone();
                if !dead.is_empty() {
                    self.dead_letter(queue, &mut dead, now);
                }
                self.dead = dead;
                self.waiting_fetches.push(WaitingFetch {
                    origin,
                    queue: name.clone(),
                    max,
                    got: out,
                });
                self.want_read(&name);
                return None;
            }
        }
        if !dead.is_empty() {
            self.dead_letter(queue, &mut dead, now);
        }
        self.dead = dead;
        Some(out)
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

    pub(super) fn ack_local(&mut self, conn: ConnRef, queue: &str, seq: u64, now: Instant) {
        let settings = self.settings.clone();
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let Some(key) = q.ack_keyed(seq, conn, now, &settings) else {
            return;
        };
        if let Some(d) = &mut self.durable {
            d.log(q.name(), q.next_seq())
                .append_ack(seq, self.clock.unix_ms(), Some(key));
        }
        self.dispatch(queue, now);
    }

    /// Acks many outstanding deliveries of `conn` (an `ack_batch`): each
    /// run of them from one local queue takes one queue lookup, one
    /// dispatch, and dedup lookups whose cache misses overlap.
    pub fn ack_many(&mut self, conn: ConnRef, owed: &[Outstanding], now: Instant) {
        let mut rest = owed;
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .take_while(|d| d.shard == first.shard && d.queue == first.queue)
                .count();
            let (batch, tail) = rest.split_at(run);
            rest = tail;
            if first.shard == self.id {
                self.ack_local_many(conn, &first.queue, batch, now);
            } else {
                for d in batch {
                    self.ack(conn, d, now);
                }
            }
        }
    }

    fn ack_local_many(&mut self, conn: ConnRef, queue: &str, batch: &[Outstanding], now: Instant) {
        let settings = self.settings.clone();
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let mut acked = std::mem::take(&mut self.acked);
        acked.clear();
        q.ack_many(
            batch.iter().map(|d| d.seq),
            conn,
            now,
            &settings,
            &mut acked,
        );
        if let (Some(d), false) = (&mut self.durable, acked.is_empty()) {
            let log = d.log(q.name(), q.next_seq());
            let at = self.clock.unix_ms();
            for &(seq, key) in &acked {
                log.append_ack(seq, at, Some(key));
            }
        }
        let any = !acked.is_empty();
        self.acked = acked;
        if any {
            self.dispatch(queue, now);
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

    pub(super) fn requeue_local(&mut self, conn: ConnRef, queue: &str, seq: u64, now: Instant) {
        let settings = self.settings.clone();
        let mut dead = std::mem::take(&mut self.dead);
        let requeued = self
            .queues
            .get_mut(queue)
            .is_some_and(|q| q.requeue(seq, conn, &settings, now, &mut dead));
        self.after_give_back(queue, requeued, dead, now);
    }

    /// Dead-letters what a give-back produced and dispatches the queue.
    pub(super) fn after_give_back(
        &mut self,
        queue: &str,
        changed: bool,
        mut dead: Vec<Entry>,
        now: Instant,
    ) {
        if !dead.is_empty() {
            self.dead_letter(queue, &mut dead, now);
        }
        self.dead = dead;
        if changed {
            self.dispatch(queue, now);
        }
    }

    /// Drops a closed connection's consumers and waiting fetches, and gives
    /// back what it owed: up to [`GIVE_BACK_AT_CLOSE`] deliveries now, the
    /// rest as chores.
    pub(super) fn conn_closed(&mut self, conn: ConnRef) {
        self.waiting_fetches.retain(|f| f.origin.conn != conn);
        let now = self.clock.now();
        let names: Vec<Arc<str>> = self.queues.keys().cloned().collect();
        let mut budget = GIVE_BACK_AT_CLOSE;
        for name in names {
            let Some(q) = self.queues.get_mut(&name) else {
                continue;
            };
            let mut seqs = Vec::new();
            q.remove_conn(conn, &mut seqs);
            if seqs.is_empty() {
                continue;
            }
            let mut owed = GiveBack {
                queue: name,
                conn,
                seqs,
                next: 0,
            };
            budget -= self.give_back_some(&mut owed, budget, now);
            if owed.next < owed.seqs.len() {
                self.chores.give_back.push_back(owed);
                self.chores.wake();
            }
        }
    }

    /// Gives back up to `budget` of what `owed` lists; returns how many it
    /// went through (a delivery settled or given back since is skipped).
    pub(super) fn give_back_some(
        &mut self,
        owed: &mut GiveBack,
        budget: usize,
        now: Instant,
    ) -> usize {
        let end = owed.seqs.len().min(owed.next + budget);
        let slice = &owed.seqs[owed.next..end];
        owed.next = end;
        if slice.is_empty() {
            return 0;
        }
        let settings = self.settings.clone();
        let mut dead = std::mem::take(&mut self.dead);
        let mut changed = false;
        if let Some(q) = self.queues.get_mut(&owed.queue) {
            for &seq in slice {
                changed |= q.requeue(seq, owed.conn, &settings, now, &mut dead);
            }
        }
        self.after_give_back(&owed.queue, changed, dead, now);
        slice.len()
    }
}
