//! Messages coming into a queue: a publish (deduplicated by sender and
//! id, refused past the queue's caps), one delivered before a restart or
//! a move, and a dead letter. Apart because it is the only way in.

use std::sync::Arc;
use std::time::Instant;

use super::{Enqueued, Entry, Queue, QueueFull, QueueSettings};
use crate::message::Message;

impl Queue {
    /// Stores a published message unless it is a duplicate or the queue is full.
    pub fn enqueue(
        &mut self,
        msg: Arc<Message>,
        now: Instant,
        settings: &QueueSettings,
    ) -> Result<Enqueued, QueueFull> {
        self.enqueue_delivered(msg, 0, now, settings)
    }

    /// [`enqueue`](Self::enqueue) for a message carried over from another
    /// log (a hand-back, an adoption) that was delivered `deliveries` times
    /// there: its next delivery counts on from them, and `max_deliveries`
    /// counts them too.
    pub fn enqueue_delivered(
        &mut self,
        msg: Arc<Message>,
        deliveries: u32,
        now: Instant,
        settings: &QueueSettings,
    ) -> Result<Enqueued, QueueFull> {
        self.expire_dedup(now);
        let key = msg.dedup_key(&settings.dedup_hasher);
        // One probe on the way in; a refusal takes the id back out.
        if !self.dedup.store_new(key, now) {
            return Ok(Enqueued::Duplicate);
        }
        let body = msg.body().len() as u64;
        if self.ready_len() + self.unacked.len() >= settings.max_len
            || (settings.max_bytes > 0 && self.bytes.saturating_add(body) > settings.max_bytes)
            || settings
                .shard_bytes
                .is_some_and(|cap| self.held.get().saturating_add(body) > cap)
        {
            self.dedup.remove(key);
            return Err(QueueFull);
        }
        Ok(Enqueued::Stored(self.push(msg, deliveries)))
    }

    /// Stores a dead-lettered message: no dedup and no length or byte
    /// limit, because dropping it would lose an acknowledged message.
    pub fn enqueue_dead(&mut self, msg: Arc<Message>) -> u64 {
        self.push(msg, 0)
    }

    fn push(&mut self, msg: Arc<Message>, deliveries: u32) -> u64 {
        let seq = self.next_seq;
        debug_assert!(
            self.tail
                .back()
                .or(self.ready.back())
                .is_none_or(|e| e.seq < seq),
            "a sequence number not above the newest ready message's"
        );
        self.next_seq += 1;
        self.hold_bytes(&msg);
        let entry = Entry::unplaced(seq, msg, deliveries);
        if self.disk.is_empty() {
            self.ready.push_back(entry);
        } else {
            self.tail.push_back(entry);
        }
        seq
    }
}
