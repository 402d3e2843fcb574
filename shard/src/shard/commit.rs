//! Group commit, the shard's side of it: the committer task's jobs, what
//! a finished job releases (publishes, purges, and the acks that waited
//! for a dead-letter queue's commit) and what a failed one undoes. Apart
//! because it is driven by the committer's results, not by commands.

use std::collections::hash_map::Entry as MapEntry;
use std::sync::Arc;

use ciphermq_proto::NackReason;

use super::Shard;
use crate::durability::{Durability, TicketKind};
use crate::log::LogBuf;
use crate::log::{CommitJob, JobIo};
use crate::mailbox::Completion;
use crate::queue::Queue;

impl Shard {
    /// Whether the committer has work.
    pub fn has_commit_work(&self) -> bool {
        self.durable.as_ref().is_some_and(Durability::has_work)
    }

    /// Whether a commit round has waited long enough for the idle
    /// committer that a connection should end its turn to let it run
    /// ([`Durability::round_due`]).
    pub fn commit_round_due(&self) -> bool {
        self.durable.as_ref().is_some_and(Durability::round_due)
    }

    /// How long the last round took to write and sync, for
    /// [`Shard::commit_round_due`].
    pub fn commit_round_written(&mut self, took: std::time::Duration) {
        if let Some(d) = &mut self.durable {
            d.round_written(took);
        }
    }

    /// Registers the committer task, woken by the next append.
    pub fn register_committer(&mut self, waker: &std::task::Waker) {
        if let Some(d) = &mut self.durable {
            d.register_committer(waker);
        }
    }

    /// Takes this round's commit jobs: one per dirty log.
    pub fn take_commit_jobs(&mut self, out: &mut Vec<CommitJob>) {
        if let Some(d) = &mut self.durable {
            d.take_jobs(
                &mut self.queues,
                &self.settings,
                self.clock.now(),
                self.clock.unix_ms(),
                out,
            );
        }
    }

    /// A commit job's bytes are written (`ok`) or failed to be; its log may
    /// hand out the next job while this one is synced. Call before
    /// [`Shard::commit_done`] of the same job.
    pub fn commit_written(&mut self, job: &CommitJob, ok: bool) {
        if let Some(d) = &mut self.durable {
            d.job_written(job, ok);
        }
    }

    /// Hands back a written job's buffer, for a later round's bytes
    /// ([`crate::log::buffer_pool`]).
    pub fn recycle_commit_buffer(&mut self, buf: LogBuf) {
        if let Some(d) = &mut self.durable {
            d.buffer_written(buf);
        }
    }

    /// Records how a log write of `queue` went: `Some(why)` it failed, and
    /// that queue's storage fails until a later write of it succeeds.
    /// Reported for that queue alone (`/api/queues`, metrics, log).
    pub fn note_storage(&mut self, queue: &str, error: Option<&str>) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let failed = error.is_some();
        if q.set_storage_error(error.map(Arc::from)) && !failed {
            tracing::info!(queue, "log writes of the queue succeed again");
        }
    }

    /// A commit job finished, its I/O as `io` says. Releases what
    /// waited for it (`NACK storage` when it failed) and returns whether its
    /// records are durable: not when an earlier job of its log failed after
    /// it was taken (its bytes lie past an unknown end, and are cut off).
    pub fn commit_done(&mut self, job: &CommitJob, io: JobIo) -> bool {
        let Some(d) = &mut self.durable else {
            return false;
        };
        let ok = d.job_done(job, io);
        if !ok {
            if let Some(q) = self.queues.get_mut(&*job.queue) {
                let mut keys = Vec::new();
                let gone = q.discard_unwritten(&job.message_seqs, &self.settings, &mut keys);
                d.forget_messages(&job.queue, &gone);
                d.fail_duplicates(&job.queue, &keys);
            }
        } else if let Some(q) = self.queues.get_mut(&*job.queue) {
            q.place(
                job.segment,
                job.offset,
                &job.message_seqs,
                &job.message_offsets,
            );
            if self.settings.spill_bytes.is_some() && q.disk_len() > 0 {
                self.backlog.spilled_bytes += q.spill(0, false);
            }
        }
        if ok {
            self.keep_budget();
        }
        self.release_waiters(&job.waiters, ok);
        ok
    }

    /// Counts a commit (durable: `ok`) against each of `waiters`' tickets,
    /// and carries out those that have all theirs.
    pub(super) fn release_waiters(&mut self, waiters: &[u64], ok: bool) {
        let Some(d) = &mut self.durable else {
            return;
        };
        let mut finished = Vec::new();
        for id in waiters {
            if let MapEntry::Occupied(mut e) = d.tickets.entry(*id) {
                let t = e.get_mut();
                debug_assert!(t.remaining > 0, "a ticket with no commit left to wait for");
                t.remaining = t.remaining.saturating_sub(1);
                if !ok {
                    t.outcome = Err(NackReason::Storage);
                }
                if t.remaining == 0 {
                    finished.push(e.remove());
                    if !d.duplicates.is_empty() {
                        d.duplicates.remove(id);
                    }
                }
            }
        }
        for t in finished {
            match t.kind {
                TicketKind::Publish => self.complete(t.origin, Completion::Enqueued(t.outcome)),
                TicketKind::Purge { count } => {
                    let durable = t.outcome;
                    self.complete(t.origin, Completion::Purged { count, durable });
                }
                TicketKind::AckAfter {
                    queue, seq, key, ..
                } if t.outcome.is_ok() => self.log_ack(&queue, seq, key),
                // The dead-letter queue's commit failed and its copy is
                // gone; the source forgot the message when it gave up on
                // it. Stored there again at the next sweep (not at once: a
                // failing disk would have the committer retry in a loop),
                // or it would be served by neither queue until a restart
                // read it back from the source's log.
                TicketKind::AckAfter {
                    queue, seq, msg, ..
                } => {
                    self.dead_retry.push((queue, seq, msg));
                }
                TicketKind::Dropped => {}
            }
        }
    }

    fn log_ack(&mut self, queue: &Arc<str>, seq: u64, key: crate::DedupKey) {
        // A queue deleted meanwhile has no log to settle it in, and must
        // not get one (it would make its directory again).
        let Some(next) = self.queues.get(&**queue).map(Queue::next_seq) else {
            return;
        };
        if let Some(d) = &mut self.durable {
            d.log(queue, next)
                .append_ack(seq, self.clock.unix_ms(), Some(key));
        }
    }
}
