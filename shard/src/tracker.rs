//! A connection's outstanding deliveries, keyed by message id, so that
//! `ack <id> [<q>]` and `nack <id> [<q>]` find what they refer to and `resend`
//! and a closing connection find everything.

use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::message::Message;
use crate::placement::ShardId;
use crate::queue::Delivery;

/// Where an outstanding delivery must be acked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outstanding {
    /// The queue it came from.
    pub queue: Arc<str>,
    /// That queue's shard.
    pub shard: ShardId,
    /// The message's position in that queue.
    pub seq: u64,
}

/// Hashes and compares as the message id, without copying it.
#[derive(Debug)]
struct IdKey(Arc<Message>);

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.message_id().hash(state)
    }
}

impl PartialEq for IdKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.message_id() == other.0.message_id()
    }
}

impl Eq for IdKey {}

impl Borrow<str> for IdKey {
    fn borrow(&self) -> &str {
        self.0.message_id()
    }
}

/// The deliveries of one id (almost always one).
#[derive(Debug)]
enum Slots {
    One(Outstanding),
    Many(Vec<Outstanding>),
}

/// Every unacked delivery made to one connection.
#[derive(Debug, Default)]
pub struct DeliveryTracker {
    /// Keyed by message id. Ids are chosen by publishers and a `fetch` may
    /// put a whole queue here, so this map keeps std's keyed SipHash: with an
    /// unkeyed hash a publisher could choose colliding ids and slow every
    /// consumer of its messages down.
    by_id: HashMap<IdKey, Slots>,
    /// Deliveries in `by_id`, counting each slot.
    len: usize,
}

impl DeliveryTracker {
    /// Deliveries outstanding.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records a delivery written to the connection.
    pub fn record(&mut self, d: &Delivery) {
        let entry = Outstanding {
            queue: d.queue.clone(),
            shard: d.shard,
            seq: d.seq,
        };
        self.len += 1;
        // One hash of the id: the common case is a new id, which needs the key
        // (an `Arc` clone) anyway.
        match self.by_id.entry(IdKey(d.msg.clone())) {
            Entry::Vacant(slot) => {
                slot.insert(Slots::One(entry));
            }
            Entry::Occupied(mut slot) => {
                let slots = slot.get_mut();
                match slots {
                    Slots::Many(v) => v.push(entry),
                    Slots::One(first) => {
                        let first = first.clone();
                        *slots = Slots::Many(vec![first, entry]);
                    }
                }
            }
        }
    }

    /// Removes the deliveries of `id` (from `queue` only, when given) into `out`;
    /// returns how many.
    pub fn take(&mut self, id: &str, queue: Option<&str>, out: &mut Vec<Outstanding>) -> usize {
        // One hash of the id: the common case (the id's only delivery, from
        // the named queue) leaves nothing to put back.
        let Some((key, slots)) = self.by_id.remove_entry(id) else {
            return 0;
        };
        let before = out.len();
        match slots {
            Slots::One(o) if queue.is_none_or(|q| *o.queue == *q) => out.push(o),
            Slots::One(o) => {
                self.by_id.insert(key, Slots::One(o));
            }
            Slots::Many(mut v) => {
                let mut i = 0;
                while i < v.len() {
                    if queue.is_none_or(|q| *v[i].queue == *q) {
                        out.push(v.remove(i));
                    } else {
                        i += 1;
                    }
                }
                if !v.is_empty() {
                    self.by_id.insert(key, Slots::Many(v));
                }
            }
        }
        let taken = out.len() - before;
        self.len -= taken;
        taken
    }

    /// Forgets every outstanding delivery from `queue` (deleted); returns
    /// how many.
    pub fn forget_queue(&mut self, queue: &str) -> usize {
        let before = self.len;
        let mut removed = 0;
        self.by_id.retain(|_, slots| match slots {
            Slots::One(o) => {
                let keep = *o.queue != *queue;
                if !keep {
                    removed += 1;
                }
                keep
            }
            Slots::Many(v) => {
                let n = v.len();
                v.retain(|o| *o.queue != *queue);
                removed += n - v.len();
                !v.is_empty()
            }
        });
        self.len = before - removed;
        removed
    }

    /// Removes every outstanding delivery into `out`.
    pub fn take_all(&mut self, out: &mut Vec<Outstanding>) {
        for (_, slots) in self.by_id.drain() {
            match slots {
                Slots::One(o) => out.push(o),
                Slots::Many(v) => out.extend(v),
            }
        }
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(id: &str, queue: &str, seq: u64) -> Delivery {
        Delivery {
            queue: Arc::from(queue),
            shard: 0,
            seq,
            count: 1,
            msg: Message::new(id, "{}", Arc::from("s")),
        }
    }

    #[test]
    fn takes_by_id_and_queue() {
        let mut t = DeliveryTracker::default();
        t.record(&delivery("m1", "qa", 1));
        t.record(&delivery("m1", "qb", 7));
        t.record(&delivery("m2", "qa", 2));
        assert_eq!(t.len(), 3);
        let mut out = Vec::new();
        assert_eq!(t.take("m1", Some("qb"), &mut out), 1);
        assert_eq!(out[0].seq, 7);
        assert_eq!(t.take("m1", Some("qb"), &mut out), 0);
        assert_eq!(t.take("m3", None, &mut out), 0);
        // An id's only delivery, asked for from another queue, stays.
        assert_eq!(t.take("m2", Some("qb"), &mut out), 0);
        assert_eq!(t.len(), 2);
        assert_eq!(t.take("m1", None, &mut out), 1);
        assert_eq!(t.len(), 1);
        out.clear();
        t.take_all(&mut out);
        assert_eq!(out.len(), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn one_id_from_many_queues_is_kept_per_queue() {
        let mut t = DeliveryTracker::default();
        for (i, q) in ["qa", "qb", "qc", "qa"].into_iter().enumerate() {
            t.record(&delivery("m1", q, i as u64));
        }
        assert_eq!(t.len(), 4);
        let mut out = Vec::new();
        assert_eq!(t.take("m1", Some("qa"), &mut out), 2);
        assert_eq!(out.iter().map(|o| o.seq).collect::<Vec<_>>(), [0, 3]);
        assert_eq!(t.take("m1", None, &mut out), 2);
        assert!(t.is_empty());
        assert_eq!(t.take("m1", None, &mut out), 0);
    }
}
