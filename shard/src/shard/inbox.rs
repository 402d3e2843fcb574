//! Messages from other shards, each carried out as the local half of the
//! command that sent it, and the answers to commands (`complete`): into
//! the connection's mailbox when it is served here, over the mesh to its
//! shard when not. Apart because it is where the mesh comes in.

use std::time::Instant;

use super::{merge_outcome, Shard};
use crate::mailbox::{Completion, ConnEvent};
use crate::mesh::{Origin, ShardMsg};

impl Shard {
    pub(super) fn complete(&mut self, origin: Origin, completion: Completion) {
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
                    let stored = self.enqueue_local(q, &msg, now, origin, &mut ticket);
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
}
