//! A connection's outstanding deliveries, keyed by message id, so that
//! `ack <id> [<q>]` and `nack <id> [<q>]` find what they refer to and `resend`
//! and a closing connection find everything.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::dedup::DedupHasher;
use crate::hashers::BuildIntHasher;
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

/// A message id as the tracker keys it: its 128-bit keyed hash (the dedup
/// hash, with no sender: an ack names the id alone) under the tracker's own
/// secret key. Two ids share one with probability 2^-128, and nobody
/// without the key can choose ids that collide (publishers choose ids, and
/// a consumer's tracker may hold a whole queue). Comparing two reads no
/// message: an ack's lookup touches the map alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IdKey(u128);

impl IdKey {
    fn of(ids: &DedupHasher, id: &str) -> IdKey {
        IdKey(ids.key("", id).0)
    }
}

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: its low half is as good as any.
        state.write_u64(self.0 as u64);
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
    /// Keyed by message id, as a keyed hash ([`IdKey`]): ids are chosen by
    /// publishers and a `fetch` may put a whole queue here, so with an
    /// unkeyed hash a publisher could choose colliding ids and slow every
    /// consumer of its messages down.
    by_id: HashMap<IdKey, Slots, BuildIntHasher>,
    /// The secret key of `by_id`'s keys, this tracker's own (random by
    /// default).
    ids: DedupHasher,
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
        // One hash of the id, and one probe: the common case is a new id.
        match self.by_id.entry(IdKey::of(&self.ids, d.msg.message_id())) {
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
        let Some((key, slots)) = self.by_id.remove_entry(&IdKey::of(&self.ids, id)) else {
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
    use crate::message::Message;

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

    #[test]
    fn many_ids_each_find_their_own_delivery() {
        let mut t = DeliveryTracker::default();
        for n in 0..10_000u64 {
            t.record(&delivery(&format!("id-{n}"), "qa", n));
        }
        let mut out = Vec::new();
        for n in (0..10_000u64).rev() {
            assert_eq!(t.take(&format!("id-{n}"), None, &mut out), 1, "{n}");
            assert_eq!(out.pop().map(|o| o.seq), Some(n));
        }
        assert!(t.is_empty());
        // Each tracker has its own secret key.
        let (a, b) = (DedupHasher::random(), DedupHasher::random());
        assert_ne!(IdKey::of(&a, "id-1"), IdKey::of(&b, "id-1"));
    }
}
