//! The message a publish stores: immutable, shared by every queue it was routed
//! to (fan-out copies share one allocation), across shards.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use siphasher::sip128::{Hasher128, SipHasher13};

/// One published message: its id, its exact JSON body, who sent it, and
/// where it was published (kept for the metadata mirror, which reads it back
/// from the log).
#[derive(Debug)]
pub struct Message {
    /// `message_id`, exchange, routing key and body, in one allocation.
    data: Box<str>,
    /// Length of the id prefix of `data`.
    id_len: u16,
    /// Length of the exchange after the id.
    exchange_len: u16,
    /// Length of the routing key after the exchange.
    key_len: u16,
    /// When the broker accepted it, in Unix milliseconds.
    sent_at_ms: u64,
    /// The publisher's CN: dedup is per sender.
    sender: Arc<str>,
}

/// Where a message was published, and when.
#[derive(Debug, Clone, Copy, Default)]
pub struct Route<'a> {
    /// The exchange it was published to.
    pub exchange: &'a str,
    /// Its routing key.
    pub routing_key: &'a str,
    /// When the broker accepted it, in Unix milliseconds.
    pub sent_at_ms: u64,
}

impl Message {
    /// Builds a message from its (validated) id and its JSON body, with no
    /// route (tests, and logs written before routes were recorded).
    pub fn new(message_id: &str, body: &str, sender: Arc<str>) -> Arc<Message> {
        Message::published(message_id, body, sender, Route::default())
    }

    /// Builds a message published through `route`. Ids, exchange names and
    /// routing keys are at most 255 bytes (the name rule), far below `u16`.
    pub fn published(
        message_id: &str,
        body: &str,
        sender: Arc<str>,
        route: Route<'_>,
    ) -> Arc<Message> {
        let len16 = |s: &str| u16::try_from(s.len()).unwrap_or(u16::MAX);
        let (id_len, exchange_len, key_len) = (
            len16(message_id),
            len16(route.exchange),
            len16(route.routing_key),
        );
        let mut data = String::with_capacity(
            usize::from(id_len) + usize::from(exchange_len) + usize::from(key_len) + body.len(),
        );
        data.push_str(&message_id[..usize::from(id_len)]);
        data.push_str(&route.exchange[..usize::from(exchange_len)]);
        data.push_str(&route.routing_key[..usize::from(key_len)]);
        data.push_str(body);
        Arc::new(Message {
            data: data.into_boxed_str(),
            id_len,
            exchange_len,
            key_len,
            sent_at_ms: route.sent_at_ms,
            sender,
        })
    }

    #[inline]
    fn body_start(&self) -> usize {
        usize::from(self.id_len) + usize::from(self.exchange_len) + usize::from(self.key_len)
    }

    /// The message id.
    #[inline]
    pub fn message_id(&self) -> &str {
        &self.data[..usize::from(self.id_len)]
    }

    /// The JSON body, byte-identical to what was published.
    #[inline]
    pub fn body(&self) -> &str {
        &self.data[self.body_start()..]
    }

    /// Where and when it was published.
    pub fn route(&self) -> Route<'_> {
        let id = usize::from(self.id_len);
        let exchange_end = id + usize::from(self.exchange_len);
        Route {
            exchange: &self.data[id..exchange_end],
            routing_key: &self.data[exchange_end..self.body_start()],
            sent_at_ms: self.sent_at_ms,
        }
    }

    /// The publisher's CN.
    #[inline]
    pub fn sender(&self) -> &Arc<str> {
        &self.sender
    }

    /// The dedup key of this message under `hasher`.
    pub fn dedup_key(&self, hasher: &DedupHasher) -> DedupKey {
        hasher.key(&self.sender, self.message_id())
    }
}

/// A 128-bit keyed hash of (sender CN, message id).
///
/// Queues remember 80 bits of it per id ([`crate::dedup`]); acked ids carried
/// out of deleted segments keep all 128 in the dedup file. Aligned to 8
/// bytes rather than a `u128`'s 16, so lists of keys with a time stay
/// small. The hash is keyed with a secret [`DedupHasher`], so no client can
/// craft a collision that would make another sender's message look like a
/// duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C, packed(8))]
pub struct DedupKey(pub u128);

/// The secret key of the dedup hash (SipHash-1-3, 128-bit output).
///
/// A durable broker keeps it in its data directory: dedup entries carried in
/// the log (for messages whose segments were deleted) must hash the same
/// after a restart.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DedupHasher {
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for DedupHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DedupHasher(<secret>)")
    }
}

impl Default for DedupHasher {
    /// A random key: fine while nothing is persisted.
    fn default() -> Self {
        DedupHasher::random()
    }
}

impl DedupHasher {
    /// A key from the process's random source.
    pub fn random() -> DedupHasher {
        let state = std::hash::RandomState::new();
        let mut a = state.build_hasher();
        a.write_u8(1);
        let mut b = state.build_hasher();
        b.write_u8(2);
        DedupHasher {
            k0: a.finish(),
            k1: b.finish(),
        }
    }

    /// The key as stored.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.k0.to_le_bytes());
        out[8..].copy_from_slice(&self.k1.to_le_bytes());
        out
    }

    /// A key read back from storage.
    pub fn from_bytes(bytes: [u8; 16]) -> DedupHasher {
        let (a, b) = bytes.split_at(8);
        let word = |s: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(s);
            u64::from_le_bytes(w)
        };
        DedupHasher {
            k0: word(a),
            k1: word(b),
        }
    }

    /// Hashes a sender and a message id.
    pub fn key(&self, sender: &str, message_id: &str) -> DedupKey {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(sender.as_bytes());
        h.write_u8(0xff);
        h.write(message_id.as_bytes());
        DedupKey(h.finish128().as_u128())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_id_and_body_apart() {
        let m = Message::new("m1", "{\"a\":1}", Arc::from("sender_1"));
        assert_eq!(m.message_id(), "m1");
        assert_eq!(m.body(), "{\"a\":1}");
        assert_eq!(&**m.sender(), "sender_1");
    }

    #[test]
    fn keeps_the_route_apart_from_id_and_body() {
        let route = Route {
            exchange: "ex",
            routing_key: "a.b",
            sent_at_ms: 42,
        };
        let m = Message::published("m1", "{}", Arc::from("s"), route);
        assert_eq!((m.message_id(), m.body()), ("m1", "{}"));
        let r = m.route();
        assert_eq!((r.exchange, r.routing_key, r.sent_at_ms), ("ex", "a.b", 42));
    }

    #[test]
    fn dedup_keys_separate_senders() {
        let h = DedupHasher::random();
        assert_eq!(h.key("s1", "m1"), h.key("s1", "m1"));
        assert_ne!(h.key("s1", "m1"), h.key("s2", "m1"));
        assert_ne!(h.key("s1", "m1x"), h.key("s1x", "m1"));
    }

    #[test]
    fn a_stored_dedup_key_hashes_the_same_and_another_does_not() {
        let h = DedupHasher::random();
        let back = DedupHasher::from_bytes(h.to_bytes());
        assert_eq!(h.key("s", "m"), back.key("s", "m"));
        assert_ne!(h.key("s", "m"), DedupHasher::random().key("s", "m"));
        assert!(!format!("{h:?}").contains(&h.k0.to_string()));
    }
}
