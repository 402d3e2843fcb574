//! `purge_queue` on one queue: its ready messages dropped at once and
//! settled (ids remembered, ack records owed) a slice at a time, and the
//! messages of a deleted queue handed out to be freed. Apart because it
//! works on the whole queue, not one message.

use std::collections::VecDeque;
use std::time::Instant;

use super::{Entry, Queue, QueueSettings};
use crate::dedup::DedupKey;

impl Queue {
    /// `purge_queue`: removes every ready message (redeliveries included)
    /// and returns how many; unacked deliveries stay owed. None of them is
    /// settled here, so a purge costs the same for ten messages or ten
    /// million: those in memory move, a whole deque at a time, to the
    /// purged messages that [`Queue::settle_purged`] settles in slices;
    /// those whose bodies are on disk only leave the queue too, and are
    /// settled as a background read goes through them
    /// ([`Queue::purging_len`] counts what is left). Until settled, a
    /// message's id stays marked stored (so a publish of it again is a
    /// duplicate, as it is once acked).
    pub fn purge(&mut self, now: Instant) -> u64 {
        self.expire_dedup(now);
        let on_disk = std::mem::take(&mut self.disk);
        let mut count = on_disk.len();
        // Gone for `max_bytes` at once, though read through later.
        self.bytes = self.bytes.saturating_sub(on_disk.bytes());
        if self.purged_disk.is_empty() {
            // Carries a read in flight of its head with it.
            self.purged_disk = on_disk;
        } else {
            // A read in flight is the earlier purge's (it reads first).
            self.purged_disk.append(on_disk);
        }
        let requeued: VecDeque<Entry> = std::mem::take(&mut self.requeued).into_values().collect();
        let ready = std::mem::take(&mut self.ready);
        let tail = std::mem::take(&mut self.tail);
        for batch in [requeued, ready, tail] {
            if !batch.is_empty() {
                count += batch.len() as u64;
                self.purged_mem.push_back(batch);
            }
        }
        self.recharge();
        count
    }

    /// Settles up to `budget` of the messages a purge took out of memory,
    /// oldest purge first: each one's id is remembered as acked for the
    /// dedup window, its bytes leave the meter, and its sequence number and
    /// dedup key are pushed onto `settled` (for the log's ack records).
    /// Returns how many it settled.
    pub fn settle_purged(
        &mut self,
        budget: usize,
        now: Instant,
        settings: &QueueSettings,
        settled: &mut Vec<(u64, DedupKey)>,
    ) -> usize {
        let mut done = 0;
        while done < budget {
            let Some(batch) = self.purged_mem.front_mut() else {
                break;
            };
            let Some(entry) = batch.pop_front() else {
                self.purged_mem.pop_front();
                continue;
            };
            let key = entry.msg.dedup_key(&settings.dedup_hasher);
            if !entry.is_unwritten() {
                self.forget_keyed(entry.seq, key, now, settings);
            }
            self.release_bytes(&entry);
            settled.push((entry.seq, key));
            done += 1;
        }
        if self.purged_mem.front().is_some_and(VecDeque::is_empty) {
            self.purged_mem.pop_front();
        }
        done
    }

    /// Takes every message out of a queue being deleted, in batches, for
    /// the shard to drop a slice at a time (the meter is settled when the
    /// queue itself is dropped).
    pub fn take_messages(&mut self) -> Vec<VecDeque<Entry>> {
        let requeued: VecDeque<Entry> = std::mem::take(&mut self.requeued).into_values().collect();
        let mut out: Vec<VecDeque<Entry>> = std::mem::take(&mut self.purged_mem).into();
        out.extend([
            requeued,
            std::mem::take(&mut self.ready),
            std::mem::take(&mut self.tail),
        ]);
        out.retain(|b| !b.is_empty());
        out
    }
}
