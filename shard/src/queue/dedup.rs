//! The ids a queue remembers for dedup: forgetting them when their
//! message settles (acked ids stay for the window), and carrying the ids
//! acked within the window past the segments that held them. Apart
//! because it is the queue's side of [`crate::dedup`], not of delivery.

use std::time::Instant;

use super::{Entry, Queue, QueueSettings, Uncarried};
use crate::dedup::{DedupKey, Tick};

impl Queue {
    /// Forgets some ids whose dedup window has passed: publishes and acks
    /// each pay a bounded share of a sweep (see
    /// [`IdSet::expire`](crate::dedup::IdSet::expire)).
    pub fn expire_dedup(&mut self, now: Instant) {
        self.dedup.expire(now);
    }

    /// The shard's once-a-second share of the sweep, for queues that see
    /// neither publishes nor acks.
    pub fn sweep_dedup(&mut self, now: Instant) {
        self.dedup.sweep(now);
    }

    /// Forgets every id whose window has passed, at once (tests).
    pub fn expire_all_dedup(&mut self, now: Instant) {
        self.dedup.expire_all(now);
    }

    pub(super) fn forget(&mut self, entry: &Entry, now: Instant, settings: &QueueSettings) {
        if entry.is_unwritten() {
            // Its id was forgotten when its write failed, and stays so.
            return;
        }
        let key = entry.msg.dedup_key(&settings.dedup_hasher);
        self.forget_keyed(entry.seq, key, now, settings);
    }

    /// [`Queue::forget`] with the message's dedup key already computed.
    pub(super) fn forget_keyed(
        &mut self,
        seq: u64,
        key: DedupKey,
        now: Instant,
        settings: &QueueSettings,
    ) {
        let until = Tick::until(now + settings.dedup_window);
        self.dedup.ack(key, until);
        if settings.carry_dedup {
            self.note_uncarried(seq, key, until);
        }
    }

    pub(super) fn note_uncarried(&mut self, seq: u64, key: DedupKey, until: Tick) {
        let entry = Uncarried { seq, key, until };
        match self.uncarried.back() {
            Some(last) if last.seq > seq => {
                let at = self.uncarried.partition_point(|u| u.seq < seq);
                self.uncarried.insert(at, entry);
            }
            _ => self.uncarried.push_back(entry),
        }
    }

    /// How many acked ids are still to be carried out of the log segments
    /// below sequence number `below` (an upper bound on what carrying them
    /// all hands out: expired ones are dropped).
    pub fn uncarried_below(&self, below: u64) -> usize {
        self.uncarried.partition_point(|u| u.seq < below)
    }

    /// Takes the ids acked within the dedup window whose evidence is in log
    /// segments below sequence number `below` (about to be deleted), as
    /// (key, Unix ms of the ack), for the caller to write to the dedup file:
    /// at most `budget` of them, so that a segment of tens of thousands of
    /// ids is carried over several commit rounds instead of holding the
    /// shard for milliseconds in one. Returns the sequence number below
    /// which every such id is now carried: `below` once all are, and only
    /// segments wholly below it may go. Each key is handed out once; cost is
    /// in the keys taken.
    pub fn carry_dedup(
        &mut self,
        below: u64,
        budget: usize,
        now: Instant,
        now_unix_ms: u64,
        settings: &QueueSettings,
        out: &mut Vec<(DedupKey, u64)>,
    ) -> u64 {
        let window_ms = settings.dedup_window.as_millis() as u64;
        // The present tick is read once, and milliseconds are taken without
        // 128-bit division.
        let now_tick = Tick::now(now);
        let mut taken = 0;
        while taken < budget && self.uncarried.front().is_some_and(|u| u.seq < below) {
            let Some(Uncarried { key, until, .. }) = self.uncarried.pop_front() else {
                break;
            };
            taken += 1;
            // Expired ones are dropped. A live one is still the key's newest
            // ack: while it lasts the key is refused, so it cannot be stored
            // and acked again.
            if until > now_tick {
                let left = until.left(now);
                let left_ms = left.as_secs() * 1000 + u64::from(left.subsec_millis());
                out.push((key, (now_unix_ms + left_ms).saturating_sub(window_ms)));
            }
        }
        match self.uncarried.front() {
            Some(u) if u.seq < below => u.seq,
            _ => below,
        }
    }
}
