//! Dead-lettering: messages a queue gave up on after their last delivery
//! move to its `{queue}.dlq`, declared on first use; with logs, the
//! source's ack waits for the dead-letter queue's commit, and a message
//! whose commit there failed is stored again at the next sweep. Apart
//! because it reaches across queues and into the topology, where a
//! delivery stays within its queue.

use std::sync::Arc;
use std::time::Instant;

use super::Shard;
use crate::message::Message;
use crate::queue::Entry;

impl Shard {
    /// Moves given-up messages to `{queue}.dlq` (same owner, same shard),
    /// declaring it on first use; a dead-letter queue keeps its own at its
    /// tail ([`ciphermq_proto::name::dead_letter_queue_of`]).
    ///
    /// The declaration does no I/O here: it is applied to the in-memory
    /// topology at once (so the messages go in within this call) and the
    /// topology's saver thread saves it afterwards. A crash before that save
    /// leaves `queues/{queue}.dlq/` on disk with no topology entry; the
    /// broker's start-up adopts such a directory with the owner the topology
    /// records for `{queue}`, so its messages are served again.
    pub(super) fn dead_letter(&mut self, queue: &str, dead: &mut Vec<Entry>, now: Instant) {
        let Some(owner) = self
            .topology
            .current()
            .queue(queue)
            .map(|q| q.owner.clone())
        else {
            dead.clear();
            return;
        };
        let dlq_name = ciphermq_proto::name::dead_letter_queue_of(queue).into_owned();
        let info = match self.topology.store().declare_queue(&dlq_name, &owner) {
            Ok(info) => info,
            // A queue declare is never refused; were it to be, no ack is
            // written for these messages, so their queue's log keeps them
            // and a restart serves them again.
            Err(e) => {
                tracing::error!(queue = %dlq_name, error = %e, "dead-letter queue not declared");
                dead.clear();
                return;
            }
        };
        let Some(dlq) = self.queue_mut(&info.name) else {
            // Placement moved (cannot happen within one run): keep them here.
            tracing::error!(queue, "dead-letter queue is not on the queue's shard");
            dead.clear();
            return;
        };
        let dlq_name_arc = dlq.name().clone();
        let source: Option<Arc<str>> = self.queues.get_key_value(queue).map(|(k, _)| k.clone());
        for entry in dead.drain(..) {
            tracing::warn!(
                queue,
                message_id = entry.msg.message_id(),
                "dead-lettered after max deliveries"
            );
            if !self.enqueue_dead(&dlq_name_arc, source.as_ref(), entry.seq, entry.msg) {
                break;
            }
            self.dead_lettered += 1;
        }
        self.dispatch(&dlq_name, now);
    }

    /// Stores a given-up message of `source` (its `seq` there) in the
    /// dead-letter queue `dlq`; with logs, the source's ack waits for the
    /// dead-letter queue's commit. False if `dlq` is not here.
    fn enqueue_dead(
        &mut self,
        dlq: &Arc<str>,
        source: Option<&Arc<str>>,
        seq: u64,
        msg: Arc<Message>,
    ) -> bool {
        let Some(q) = self.queues.get_mut(dlq) else {
            return false;
        };
        let dead_seq = q.enqueue_dead(msg.clone());
        let next = q.next_seq();
        if let (Some(d), Some(source)) = (&mut self.durable, source) {
            // The source forgets the message only once the dead-letter
            // queue has it on disk: a crash in between keeps it in both.
            let key = msg.dedup_key(&self.settings.dedup_hasher);
            let log_msg = msg.clone();
            let id = d.new_deferred_ack(source.clone(), seq, key, msg);
            let log = d.log(dlq, next);
            log.append_message(dead_seq, &log_msg);
            log.add_waiter(id);
        }
        true
    }

    /// A dead-lettered message whose dead-letter commit failed: stored in
    /// the dead-letter queue again (its source still has it on disk,
    /// unacked, so a crash meanwhile loses nothing). Dropped if the source
    /// queue is gone (deleted: nothing is owed).
    pub(super) fn store_dead_letter(&mut self, source: &Arc<str>, seq: u64, msg: Arc<Message>) {
        if !self.queues.contains_key(source) {
            return;
        }
        let dlq_name = ciphermq_proto::name::dead_letter_queue_of(source).into_owned();
        let Some(dlq) = self.queue_mut(&dlq_name).map(|q| q.name().clone()) else {
            return;
        };
        let now = self.clock.now();
        if self.enqueue_dead(&dlq, Some(source), seq, msg) {
            self.dispatch(&dlq_name, now);
        }
    }
}
