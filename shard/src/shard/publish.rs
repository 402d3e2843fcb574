//! The publish path: routing a message through the topology snapshot,
//! storing it in this shard's queues that match (the append joining the
//! next group commit) and sending it to the shards that own the others.
//! Apart because it is the hot path of every publish, and it touches the
//! delivery side only through the dispatch a stored message ends with.

use std::sync::Arc;
use std::time::Instant;

use ciphermq_proto::NackReason;

use super::{merge_outcome, PublishStatus, Shard};
use crate::durability::Durability;
use crate::mesh::{Origin, ShardMsg};
use crate::message::Message;
use crate::queue::{Enqueued, QueueFull};

impl Shard {
    /// Routes a validated message for `receiver` (its envelope's
    /// `receiver_client_id`) and stores it in every matching queue that may
    /// hold it: local queues now, remote ones through the mesh. A queue a
    /// receiver owns takes only that receiver's envelopes, whatever bound it
    /// (DESIGN's confinement); a message no lawful queue takes is `no_route`.
    pub fn publish(
        &mut self,
        origin: Origin,
        exchange: &str,
        routing_key: &str,
        receiver: &str,
        msg: &Arc<Message>,
        now: Instant,
    ) -> PublishStatus {
        self.publish_scoped(origin, exchange, routing_key, receiver, None, msg, now)
    }

    /// [`Shard::publish`] into the queues of one owner only (`publish_for`
    /// in a cluster: bindings that reach owners on several nodes are
    /// served one owner at a time, each on its node); no such queue
    /// matching is `no_route`.
    #[allow(clippy::too_many_arguments)]
    pub fn publish_for(
        &mut self,
        origin: Origin,
        exchange: &str,
        routing_key: &str,
        receiver: &str,
        owner: &str,
        msg: &Arc<Message>,
        now: Instant,
    ) -> PublishStatus {
        self.publish_scoped(
            origin,
            exchange,
            routing_key,
            receiver,
            Some(owner),
            msg,
            now,
        )
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn publish_scoped(
        &mut self,
        origin: Origin,
        exchange: &str,
        routing_key: &str,
        receiver: &str,
        owner: Option<&str>,
        msg: &Arc<Message>,
        now: Instant,
    ) -> PublishStatus {
        let mut targets = std::mem::take(&mut self.targets);
        targets.clear();
        let topology = self.topology.current();
        let exists = topology.route(exchange, routing_key, &mut targets);
        targets.retain(|t| t.admits(receiver));
        if let Some(owner) = owner {
            targets.retain(|t| topology.queue(&t.queue).is_some_and(|q| &*q.owner == owner));
        }
        if !exists || targets.is_empty() {
            self.targets = targets;
            return PublishStatus::Done(Err(NackReason::NoRoute));
        }
        let mut local = Ok(());
        let mut remote = 0u32;
        let mut ticket = None;
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
                    let stored = self.enqueue_local(&t.queue, msg, now, origin, &mut ticket);
                    local = merge_outcome(local, stored);
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
        if ticket.is_some() {
            // The local queues answer after their group commit.
            remote += 1;
        }
        if remote == 0 {
            PublishStatus::Done(local)
        } else {
            PublishStatus::Pending { local, remote }
        }
    }

    /// Stores `msg` in a local queue. With logs, the append joins the next
    /// group commit and `ticket` (created on first use) waits for it. The
    /// message is borrowed: the queue's entry takes the one reference it
    /// keeps, and no other is made and dropped on the way (each an atomic
    /// add or subtract).
    pub(super) fn enqueue_local(
        &mut self,
        queue: &str,
        msg: &Arc<Message>,
        now: Instant,
        origin: Origin,
        ticket: &mut Option<u64>,
    ) -> Result<(), NackReason> {
        if self.durable.as_ref().is_some_and(Durability::disk_low) {
            return Err(NackReason::DiskFull);
        }
        // One hash of the name per publish to a queue this shard already
        // holds (queue names are SipHashed: clients choose them).
        let q = match self.queues.get_mut(queue) {
            Some(q) => q,
            None => {
                self.queue_mut(queue).ok_or(NackReason::NoRoute)?;
                self.queues.get_mut(queue).ok_or(NackReason::NoRoute)?
            }
        };
        if q.is_frozen() {
            // Its owner is moving away: a publish that reaches it was routed
            // before the move stopped routing to it (cannot happen once the
            // move's barrier passed); it is refused, never lost.
            return Err(NackReason::Timeout);
        }
        let enqueued = match q.enqueue(msg.clone(), now, &self.settings) {
            Ok(e) => e,
            Err(QueueFull) => return Err(NackReason::QueueFull),
        };
        if let Some(d) = &mut self.durable {
            let next = q.next_seq();
            let id = *ticket.get_or_insert_with(|| d.new_ticket(origin));
            let log = d.log(q.name(), next);
            if let Enqueued::Stored(seq) = enqueued {
                log.append_message(seq, msg);
            }
            // A duplicate waits too: its original may not be on disk yet,
            // and if its write fails the duplicate is refused with it.
            log.add_waiter(id);
            if let Some(t) = d.tickets.get_mut(&id) {
                t.remaining += 1;
            }
            if enqueued == Enqueued::Duplicate {
                let key = msg.dedup_key(&self.settings.dedup_hasher);
                d.note_duplicate(id, q.name(), key);
            }
        }
        if matches!(enqueued, Enqueued::Stored(_)) {
            self.dispatch(queue, now);
        }
        Ok(())
    }
}
