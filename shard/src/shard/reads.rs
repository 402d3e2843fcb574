//! Reading backlogs back from disk: which queues want a read, the reader
//! task's jobs, and what a finished read brings (its messages
//! dispatched, waiting fetches answered, purged ones settled). Apart
//! because it is the reader task's side of the shard.

use std::sync::Arc;
use std::time::Instant;

use super::Shard;
use crate::backlog::ReadJob;
use crate::mailbox::Completion;

impl Shard {
    /// Notes that `queue` may want its backlog read back, and wakes the reader.
    pub(super) fn want_read(&mut self, queue: &Arc<str>) {
        if !self.to_read.iter().any(|q| q == queue) {
            self.to_read.push(queue.clone());
        }
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    /// Whether the reader has reads to make.
    pub fn has_read_work(&self) -> bool {
        !self.to_read.is_empty()
    }

    /// Registers the reader task, woken when a queue wants a read.
    pub fn register_reader(&mut self, waker: &std::task::Waker) {
        self.reader = Some(waker.clone());
    }

    /// Takes the reads due: at most one in flight per queue, for queues
    /// whose consumers (or waiting fetches) are about to run out of
    /// messages in memory.
    ///
    /// Past the shard's part of the memory budget in bodies (ready and
    /// delivered but unacked), a queue that holds bodies in memory waits
    /// for acks to free some: deliveries in flight count against the
    /// budget, so consumers that do not ack cannot pull a backlog into
    /// memory. A queue that holds none still reads one batch, so no queue
    /// starves while others fill the budget.
    pub fn take_read_jobs(&mut self, out: &mut Vec<ReadJob>) {
        let Some(d) = &self.durable else {
            self.to_read.clear();
            return;
        };
        let body_room = self.has_body_room();
        for name in self.to_read.drain(..) {
            let Some(q) = self.queues.get_mut(&name) else {
                continue;
            };
            let mut demand =
                q.has_consumer_room() || self.waiting_fetches.iter().any(|f| f.queue == name);
            if demand && !body_room && q.resident_bytes() > 0 && q.disk_len() > 0 {
                demand = false;
                if !self.budget_waiting.contains(&name) {
                    self.budget_waiting.push(name.clone());
                }
            }
            if let Some((segment, offset, len)) = q.next_read(demand) {
                out.push(ReadJob {
                    path: crate::log::segment_path(&d.dir_of(&name), segment),
                    queue: name,
                    segment,
                    offset,
                    len,
                });
            }
        }
    }

    /// A backlog read finished: its messages join the queue (or, on
    /// `Err`, the read is made again at the next sweep).
    pub fn read_done(&mut self, job: &ReadJob, result: Result<&[u8], String>, now: Instant) {
        let Some(q) = self.queues.get_mut(&job.queue) else {
            return;
        };
        // A read of a deleted queue's log, finished after a queue of the
        // same name was declared again: not this queue's.
        if !q.is_reading() {
            return;
        }
        let data = match result {
            Ok(data) => data,
            Err(e) => {
                tracing::warn!(queue = %job.queue, path = %job.path.display(), offset = job.offset, error = %e, "backlog read failed; tried again in a second");
                q.read_failed();
                self.backlog.errors += 1;
                self.read_retry.push(job.queue.clone());
                return;
            }
        };
        let mut purged = std::mem::take(&mut self.acked);
        purged.clear();
        let got = q.absorb(
            job.segment,
            job.offset,
            job.len,
            data,
            now,
            &self.settings,
            &mut purged,
        );
        if let (Some(d), false) = (&mut self.durable, purged.is_empty()) {
            let log = d.log(q.name(), q.next_seq());
            let at = self.clock.unix_ms();
            for &(seq, key) in &purged {
                log.append_ack(seq, at, Some(key));
            }
        }
        self.backlog.purged += purged.len() as u64;
        self.acked = purged;
        let b = &mut self.backlog;
        b.reads += 1;
        b.bytes += data.len() as u64;
        b.messages += got.loaded;
        b.damaged_bytes += got.damaged_bytes;
        b.lost += got.lost;
        let name = job.queue.clone();
        self.dispatch(&name, now);
        self.serve_waiting_fetches(&name, now);
        if self.queues.get(&name).is_some_and(|q| q.has_disk_work()) {
            self.want_read(&name);
        }
    }

    fn serve_waiting_fetches(&mut self, queue: &Arc<str>, now: Instant) {
        if !self.waiting_fetches.iter().any(|f| f.queue == *queue) {
            return;
        }
        let (mine, others) = std::mem::take(&mut self.waiting_fetches)
            .into_iter()
            .partition(|f| f.queue == *queue);
        self.waiting_fetches = others;
        for f in mine {
            if let Some(deliveries) = self.fetch_more(f.origin, &f.queue, f.max, f.got, now) {
                self.complete(f.origin, Completion::Fetched(deliveries));
            }
        }
    }
}
