//! The shard's part of taking back an owner's backlog from a node that lost
//! the owner while it was away (a takeover in a cluster whose storage is
//! local to each node): each message is stored in its queue here as a
//! publish would store it, after what the queue holds, deduplicated by
//! sender and id (a message its sender published again here after the
//! takeover is not stored twice), written to the queue's log and
//! delivered in turn. The caller learns that everything is on disk by
//! asking [`Shard::is_quiet`].

use std::time::Instant;

use ciphermq_proto::NackReason;

use super::Shard;
use crate::durability::Durability;
use crate::log::recovery::RecoveredMessage;
use crate::queue::{Enqueued, QueueFull};

/// What [`Shard::take_back`] did with a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TakenBack {
    /// Messages stored.
    pub stored: u64,
    /// Messages the queue already had (same sender and id).
    pub duplicates: u64,
    /// Whether the shard's bodies in memory are under its part of the
    /// memory budget after the batch: when not, the caller lets the batch
    /// reach the disk ([`Shard::is_quiet`]) before sending the next, so a
    /// backlog bigger than memory is carried through the budget.
    pub room: bool,
}

impl Shard {
    /// Stores `msgs` in queue `name`, in order, each keeping the
    /// deliveries it had in its old log. Fails, with what was done
    /// before, when the queue is not on this shard or is frozen
    /// ([`NackReason::NoRoute`], [`NackReason::Timeout`]), is full, or the
    /// disk is low: the caller retries later, and what was stored is then
    /// found again as duplicates.
    pub fn take_back(
        &mut self,
        name: &str,
        msgs: &[RecoveredMessage],
        now: Instant,
    ) -> Result<TakenBack, (NackReason, TakenBack)> {
        let mut done = TakenBack::default();
        let outcome = self.store_taken_back(name, msgs, now, &mut done);
        if done.stored > 0 {
            self.dispatch(name, now);
        }
        done.room = self.has_body_room();
        outcome.map(|()| done).map_err(|reason| (reason, done))
    }

    fn store_taken_back(
        &mut self,
        name: &str,
        msgs: &[RecoveredMessage],
        now: Instant,
        done: &mut TakenBack,
    ) -> Result<(), NackReason> {
        if !self.queues.contains_key(name) {
            self.queue_mut(name).ok_or(NackReason::NoRoute)?;
        }
        let q = self.queues.get_mut(name).ok_or(NackReason::NoRoute)?;
        if q.is_frozen() {
            return Err(NackReason::Timeout);
        }
        for m in msgs {
            if self.durable.as_ref().is_some_and(Durability::disk_low) {
                return Err(NackReason::DiskFull);
            }
            match q.enqueue_delivered(m.msg.clone(), m.deliveries, now, &self.settings) {
                Ok(Enqueued::Stored(seq)) => {
                    if let Some(d) = &mut self.durable {
                        let log = d.log(q.name(), q.next_seq());
                        log.append_message(seq, &m.msg);
                        if m.deliveries > 0 {
                            // When it was delivered is not carried: a
                            // restart here counts on from `deliveries`.
                            log.append_delivered(seq, m.deliveries, 0);
                        }
                    }
                    done.stored += 1;
                }
                Ok(Enqueued::Duplicate) => done.duplicates += 1,
                Err(QueueFull) => return Err(NackReason::QueueFull),
            }
        }
        Ok(())
    }
}
