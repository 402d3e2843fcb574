//! Placement: a connection is served, and a queue lives, on shard
//! `fnv1a(CN) % N`, so a receiver and its own queues share a shard.

/// Index of a shard (one per core).
pub type ShardId = u16;

/// FNV-1a, 64 bit: stable across runs and builds, which placement needs.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The shard that owns connections of `cn` and queues owned by `cn`.
pub fn shard_of(cn: &str, shards: usize) -> ShardId {
    (fnv1a(cn.as_bytes()) % shards.max(1) as u64) as ShardId
}

/// A connection anywhere in the broker: its shard and its id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnRef {
    /// The shard serving the connection.
    pub shard: ShardId,
    /// Unique on that shard for the life of the process.
    pub id: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn placement_is_stable_and_in_range() {
        for n in 1..8 {
            let s = shard_of("receiver_1", n);
            assert!((s as usize) < n);
            assert_eq!(s, shard_of("receiver_1", n));
        }
        assert_eq!(shard_of("anything", 1), 0);
    }
}
