//! Queues and connections coming and going: a queue restored from its
//! log, connections registered and forgotten, `purge_queue`,
//! `delete_queue` and the removal of a deleted queue's directory, and
//! the sweep made about once a second. Apart from the data path: these
//! run once per queue, connection or second, not once per message.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::{Shard, WaitingFetch};
use crate::durability::QueueRemoval;
use crate::log::{QueueLog, RecoveredQueue};
use crate::mailbox::{Completion, ConnEvent, Mailbox};
use crate::mesh::{Origin, ShardMsg};
use crate::pending::Resolver;
use crate::placement::{ConnRef, ShardId};
use crate::queue::Queue;
use crate::topology::QueueInfo;

impl Shard {
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

    /// Registers a connection served by this shard.
    pub fn register_conn(&mut self) -> (ConnRef, Rc<Mailbox>) {
        let id = self.next_conn;
        self.next_conn += 1;
        let mailbox = Rc::new(Mailbox::default());
        self.conns.insert(id, mailbox.clone());
        (ConnRef { shard: self.id, id }, mailbox)
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
    pub(super) fn purge_local(&mut self, origin: Origin, queue: &str, now: Instant) -> Option<u64> {
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
    pub(super) fn delete_local(&mut self, name: &Arc<str>, done: Resolver<Result<(), String>>) {
        self.take_off(name, |shard, q| {
            for (conn, consumer) in q.holders() {
                shard.tell_deleted(conn, name, consumer);
            }
            tracing::info!(queue = %name, ready = q.ready_len(), "queue deleted");
        });
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

    /// Takes queue `name` off the shard (deleted, or leaving the node):
    /// `leaving` sees it first; its waiting fetches are answered with what
    /// they have, its messages are freed a slice at a time (the rest of it,
    /// and its bytes on the meter, go now), and nothing queued for it
    /// (settles, reads, retries, acks a dead-lettering still owes it) stays
    /// to be done to a queue declared again under its name. Its log is the
    /// caller's.
    pub(super) fn take_off(&mut self, name: &Arc<str>, leaving: impl FnOnce(&mut Self, &Queue)) {
        if let Some(mut q) = self.queues.remove(name) {
            let (mine, others) = std::mem::take(&mut self.waiting_fetches)
                .into_iter()
                .partition(|f| f.queue == *name);
            self.waiting_fetches = others;
            let fetches: Vec<WaitingFetch> = mine;
            for f in fetches {
                self.complete(f.origin, Completion::Fetched(f.got));
            }
            leaving(self, &q);
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
        self.dead_retry.retain(|(q, ..)| q != name);
        if let Some(d) = &mut self.durable {
            d.drop_deferred_acks(name);
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
}
