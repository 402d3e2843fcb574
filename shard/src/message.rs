//! The message a publish stores: immutable, shared by every queue it was routed
//! to (fan-out copies share one allocation), across shards.

use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, OnceLock};

/// One published message: its id, its exact JSON body, and who sent it.
#[derive(Debug)]
pub struct Message {
    /// `message_id` followed by the body, in one allocation.
    data: Box<str>,
    /// Length of the id prefix of `data`.
    id_len: usize,
    /// The publisher's CN: dedup is per sender.
    sender: Arc<str>,
}

impl Message {
    /// Builds a message from its (validated) id and its JSON body.
    pub fn new(message_id: &str, body: &str, sender: Arc<str>) -> Arc<Message> {
        let mut data = String::with_capacity(message_id.len() + body.len());
        data.push_str(message_id);
        data.push_str(body);
        Arc::new(Message {
            data: data.into_boxed_str(),
            id_len: message_id.len(),
            sender,
        })
    }

    /// The message id.
    #[inline]
    pub fn message_id(&self) -> &str {
        &self.data[..self.id_len]
    }

    /// The JSON body, byte-identical to what was published.
    #[inline]
    pub fn body(&self) -> &str {
        &self.data[self.id_len..]
    }

    /// The publisher's CN.
    #[inline]
    pub fn sender(&self) -> &Arc<str> {
        &self.sender
    }

    /// The dedup key of this message.
    pub fn dedup_key(&self) -> DedupKey {
        DedupKey::new(&self.sender, self.message_id())
    }
}

/// A 128-bit keyed hash of (sender CN, message id).
///
/// Dedup entries outlive their messages for `dedup_window_secs`, so they must
/// be small; the hash is keyed with process-random SipHash keys, so no client
/// can craft a collision that would make another sender's message look like
/// a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DedupKey(u128);

fn dedup_hashers() -> &'static (std::hash::RandomState, std::hash::RandomState) {
    static HASHERS: OnceLock<(std::hash::RandomState, std::hash::RandomState)> = OnceLock::new();
    HASHERS.get_or_init(|| (std::hash::RandomState::new(), std::hash::RandomState::new()))
}

impl DedupKey {
    /// Hashes a sender and a message id.
    pub fn new(sender: &str, message_id: &str) -> DedupKey {
        let (a, b) = dedup_hashers();
        let half = |state: &std::hash::RandomState| {
            let mut h = state.build_hasher();
            h.write(sender.as_bytes());
            h.write_u8(0xff);
            h.write(message_id.as_bytes());
            h.finish()
        };
        DedupKey((u128::from(half(a)) << 64) | u128::from(half(b)))
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
    fn dedup_keys_separate_senders() {
        assert_eq!(DedupKey::new("s1", "m1"), DedupKey::new("s1", "m1"));
        assert_ne!(DedupKey::new("s1", "m1"), DedupKey::new("s2", "m1"));
        assert_ne!(DedupKey::new("s1", "m1x"), DedupKey::new("s1x", "m1"));
    }
}
