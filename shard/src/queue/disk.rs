//! A queue's messages on disk: where each one's record landed, moving
//! bodies out of memory past the budget (spill), reading backlogs back
//! and what a failed write undoes. Apart because it is what the log and
//! the memory budget ask of a queue; delivery sees only what is in memory.

use std::collections::VecDeque;
use std::time::Instant;

use super::{Queue, QueueSettings, UNPLACED, UNWRITTEN};
use crate::backlog::{Absorbed, DiskBacklog};
use crate::dedup::DedupKey;

impl Queue {
    /// Records where a durable commit put the records of `seqs`: segment
    /// `segment`, at `offset` plus each one's offset in the job. Messages
    /// delivered meanwhile are skipped (only ready ones leave memory).
    pub fn place(&mut self, segment: u64, offset: u64, seqs: &[u64], offsets: &[u32]) {
        let Some(&first) = seqs.first() else {
            return;
        };
        for part in [&mut self.ready, &mut self.tail] {
            let mut i = part.partition_point(|e| e.seq < first);
            for (seq, rel) in seqs.iter().zip(offsets) {
                while part.get(i).is_some_and(|e| e.seq < *seq) {
                    i += 1;
                }
                match part.get_mut(i) {
                    Some(e) if e.seq == *seq => {
                        e.segment = segment;
                        e.offset = u32::try_from(offset + u64::from(*rel)).unwrap_or(UNPLACED);
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
    }

    /// Moves bodies of durable ready messages out of memory, coldest first,
    /// until about `want` bytes are freed; returns the bytes freed. A queue
    /// that has messages on disk also moves every durable message published
    /// since (`want` 0 does only that): what is behind a backlog waits for
    /// it anyway. Their ids stay remembered as stored.
    ///
    /// `keep_head`: a queue with nothing on disk yet also keeps a read-ahead
    /// batch at its head (one with a backlog always does).
    pub fn spill(&mut self, want: u64, keep_head: bool) -> u64 {
        debug_assert!(
            !self.disk.is_empty() || self.tail.is_empty(),
            "messages in `tail` with nothing on disk"
        );
        let mut moved = Vec::new();
        let mut head = Vec::new();
        if !self.disk.is_empty() {
            while self.tail.front().is_some_and(|e| e.offset != UNPLACED) {
                moved.extend(self.tail.pop_front());
            }
            // The ids of a backlog fill the budget as it grows: what was
            // read back, or kept when it started, goes back to disk, but for
            // a read-ahead batch in front of the consumers.
            if want > 0 && !self.disk.is_reading() {
                let keep = crate::backlog::READAHEAD_MESSAGES.min(self.ready.len());
                let mut from = self.ready.len();
                let mut sum = 0u64;
                while from > keep && sum < want && self.ready[from - 1].offset != UNPLACED {
                    from -= 1;
                    sum += self.ready[from].msg.body().len() as u64;
                }
                head.extend(self.ready.drain(from..));
            }
        } else if want > 0 {
            // Placed messages come first: placing follows commits, in order.
            let placed = self.ready.partition_point(|e| e.offset != UNPLACED);
            let keep = if keep_head {
                crate::backlog::READAHEAD_MESSAGES.min(placed)
            } else {
                0
            };
            let mut from = placed;
            let mut sum = 0u64;
            while from > keep && sum < want {
                from -= 1;
                sum += self.ready[from].msg.body().len() as u64;
            }
            if from == placed {
                return 0;
            }
            let mut rest = self.ready.split_off(from);
            self.tail = rest.split_off(placed - from);
            moved.extend(rest);
        }
        let mut freed = 0;
        let mut front = DiskBacklog::default();
        for e in &head {
            freed += e.push_to(&mut front);
        }
        for e in &moved {
            freed += e.push_to(&mut self.disk);
        }
        if !front.is_empty() {
            self.disk.prepend(front);
        }
        debug_assert!(freed <= self.resident, "spilled more than was resident");
        self.resident = self.resident.saturating_sub(freed);
        self.held.sub_bodies(freed);
        self.recharge();
        freed
    }

    /// The next read of the backlog on disk, when one is due: messages are
    /// wanted (`demand`) and fewer than a batch are in memory ahead of them.
    /// (segment, offset, length); marks a read in flight.
    pub fn next_read(&mut self, demand: bool) -> Option<(u64, u64, usize)> {
        // A purge reads through whether anyone consumes or not, and first.
        if !self.purged_disk.is_empty() {
            return self.purged_disk.next_read();
        }
        if !demand || self.disk.is_empty() || self.ready.len() >= crate::backlog::READAHEAD_MESSAGES
        {
            return None;
        }
        self.disk.next_read()
    }

    /// A read of the backlog failed; the next [`Queue::next_read`] asks again.
    pub fn read_failed(&mut self) {
        self.disk.read_failed();
        self.purged_disk.read_failed();
    }

    /// Takes in what a read of the backlog returned (`asked` bytes were
    /// asked for at `offset` of `segment`). A read of purged messages
    /// settles them instead: each id is remembered as acked for the dedup
    /// window, and (sequence number, dedup key) is pushed onto `purged` for
    /// the log's ack records.
    #[allow(clippy::too_many_arguments)]
    pub fn absorb(
        &mut self,
        segment: u64,
        offset: u64,
        asked: usize,
        data: &[u8],
        now: Instant,
        settings: &QueueSettings,
        purged: &mut Vec<(u64, DedupKey)>,
    ) -> Absorbed {
        if self.purged_disk.is_reading() {
            let mut loaded = VecDeque::new();
            let done = self
                .purged_disk
                .absorb(segment, offset, asked, data, &mut loaded);
            // Their bytes left `bytes` at the purge.
            for entry in loaded {
                let key = entry.msg.dedup_key(&settings.dedup_hasher);
                self.forget_keyed(entry.seq, key, now, settings);
                purged.push((entry.seq, key));
            }
            self.recharge();
            return done;
        }
        let done = self
            .disk
            .absorb(segment, offset, asked, data, &mut self.ready);
        self.resident += done.loaded_bytes;
        self.held.add_bodies(done.loaded_bytes);
        self.bytes = self.bytes.saturating_sub(done.lost_bytes);
        if self.disk.is_empty() {
            self.ready.append(&mut self.tail);
        }
        self.recharge();
        done
    }

    /// Takes back the messages `seqs` whose records a failed commit could
    /// not make durable (their publishers were answered `NACK storage`).
    /// Those still waiting leave the queue; returns their seqs. One already
    /// delivered stays owed to its consumer until acked, but its id is
    /// forgotten: the publisher's retry is stored again instead of being
    /// answered `ACK` as a duplicate of a message that is not on disk.
    /// The forgotten ids' keys go to `keys`: publishes already answered as
    /// their duplicates must not be acknowledged either.
    pub fn discard_unwritten(
        &mut self,
        seqs: &[u64],
        settings: &QueueSettings,
        keys: &mut Vec<DedupKey>,
    ) -> Vec<u64> {
        let mut gone = Vec::new();
        for &seq in seqs {
            // `ready` and `tail` are in sequence order.
            let entry = match self.ready.binary_search_by_key(&seq, |e| e.seq) {
                Ok(i) => self.ready.remove(i),
                Err(_) => match self.tail.binary_search_by_key(&seq, |e| e.seq) {
                    Ok(i) => self.tail.remove(i),
                    Err(_) => self.requeued.remove(&seq),
                },
            };
            let key = match &entry {
                Some(e) => e.msg.dedup_key(&settings.dedup_hasher),
                None => match self.unacked.get_mut(&seq) {
                    Some(inflight) => {
                        // Owed to its consumer still; settling it later
                        // must not bring its id back.
                        inflight.entry.segment = UNWRITTEN;
                        inflight.entry.msg.dedup_key(&settings.dedup_hasher)
                    }
                    None => continue,
                },
            };
            self.dedup.remove_stored(key);
            keys.push(key);
            if let Some(entry) = entry {
                self.release_bytes(&entry);
                gone.push(seq);
            }
        }
        gone
    }
}
