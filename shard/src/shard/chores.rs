//! Chores: work a command started that is too large for one shard step
//! (purged messages to settle, deleted queues' messages to drop,
//! deliveries closed connections owed), done a slice at a time by a task
//! of their own. Apart so that no command holds the shard for all of it.

use std::time::Instant;

use super::{ChoreProgress, Shard};

/// Ack records a purge's settling may have waiting for a commit before it
/// waits too: a little over one slice of them (about 40 bytes each).
const SETTLE_PENDING_BYTES: usize = 64 << 10;

impl Shard {
    /// Whether purges wait to be settled, deleted queues' messages to be
    /// dropped, or closed connections' deliveries to be given back.
    pub fn has_chores(&self) -> bool {
        !self.chores.settle.is_empty()
            || !self.chores.drop.is_empty()
            || !self.chores.give_back.is_empty()
    }

    /// Registers the task doing the chores, woken when there are some.
    pub fn register_chores(&mut self, waker: &std::task::Waker) {
        self.chores.waker = Some(waker.clone());
    }

    /// Does up to `budget` messages' worth of chores: gives back what
    /// closed connections owed, drops messages of deleted queues, then
    /// settles purged ones (ids remembered as acked
    /// for the dedup window, bytes off the meter, ack records logged, at
    /// the pace of the commits). The caller yields between calls, so that
    /// a purge or a deletion of a million messages never holds the shard
    /// for the whole of them.
    pub fn do_chores(&mut self, budget: usize, now: Instant) -> ChoreProgress {
        let mut done = 0;
        while done < budget {
            let Some(mut owed) = self.chores.give_back.pop_front() else {
                break;
            };
            done += self.give_back_some(&mut owed, budget - done, now);
            if owed.next < owed.seqs.len() {
                self.chores.give_back.push_front(owed);
            }
        }
        while done < budget {
            let Some(batch) = self.chores.drop.last_mut() else {
                break;
            };
            let n = (budget - done).min(batch.len());
            batch.drain(..n);
            done += n;
            if batch.is_empty() {
                self.chores.drop.pop();
            }
        }
        while done < budget {
            let Some(name) = self.chores.settle.first() else {
                break;
            };
            let Some(q) = self.queues.get_mut(name) else {
                self.chores.settle.remove(0);
                continue;
            };
            if let Some(d) = &self.durable {
                if d.pending_bytes(name) >= SETTLE_PENDING_BYTES {
                    return match done {
                        0 => ChoreProgress::WaitingForCommit,
                        n => ChoreProgress::Done(n),
                    };
                }
            }
            let mut settled = std::mem::take(&mut self.acked);
            settled.clear();
            done += q.settle_purged(budget - done, now, &self.settings, &mut settled);
            if let (Some(d), false) = (&mut self.durable, settled.is_empty()) {
                let log = d.log(q.name(), q.next_seq());
                let at = self.clock.unix_ms();
                for &(seq, key) in &settled {
                    log.append_ack(seq, at, Some(key));
                }
            }
            self.acked = settled;
            if !q.has_purged_in_memory() {
                self.chores.settle.remove(0);
            }
        }
        ChoreProgress::Done(done)
    }
}
