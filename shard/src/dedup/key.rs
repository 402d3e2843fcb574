//! The dedup key of a message: a keyed 128-bit hash of its sender and its
//! id, and the secret that keys it.

use std::hash::{BuildHasher, Hasher};

use siphasher::sip128::{Hasher128, SipHasher13};

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
