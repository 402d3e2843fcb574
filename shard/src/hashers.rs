//! Hash functions for maps whose keys no client chooses.
//!
//! std's default, SipHash-1-3 with a random key, resists collision flooding
//! but costs tens of nanoseconds per lookup, and the delivery path does
//! several lookups per message. Numbers the broker assigns itself (queue
//! sequence numbers, connection ids) do not need that protection: a client
//! cannot pick them, so it cannot make them collide. They get [`IntHasher`],
//! one multiplication. (Dedup keys, already the output of a keyed hash, live
//! in a table of their own: [`crate::dedup`].)
//!
//! Maps keyed by bytes a client chooses keep a keyed hash: queue names the
//! std hasher; a delivery tracker's message ids the dedup hash under a key
//! of its own, taken once per id, which then stands for the id
//! (`crate::tracker`).
//!
//! The maps a shard walks in order to decide things (its queues and their
//! logs) hash names with [`NameState`]: std's keyed hash, except on a
//! thread a simulation has asked for a fixed key, so that the order of a
//! walk, and everything it decides, replays from the simulation's seed.

use std::cell::Cell;
use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// The 64-bit golden-ratio constant (odd, so multiplying by it is a bijection).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Hashes broker-assigned integers with one multiplication.
///
/// The product's low bits are a bijection of the key's low bits, so
/// consecutive keys land in distinct buckets; its high bits (which the std map
/// uses as a tag inside a bucket group) depend on every bit of the key.
#[derive(Debug, Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    /// Byte strings are folded eight bytes at a time; only integer keys are
    /// expected here.
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(GOLDEN);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Builds [`IntHasher`]s.
pub type BuildIntHasher = BuildHasherDefault<IntHasher>;
/// A map keyed by broker-assigned integers.
pub type IntMap<K, V> = HashMap<K, V, BuildIntHasher>;

thread_local! {
    static FIXED_NAME_KEY: Cell<bool> = const { Cell::new(false) };
}

/// Builds the hashers of maps keyed by queue names: a random key per map
/// (std's `RandomState`), or on a simulation's thread a fixed one (see
/// [`fix_name_hashing_for_simulation`]).
#[derive(Debug, Clone)]
pub enum NameState {
    /// std's keyed SipHash, a random key per map.
    Random(RandomState),
    /// SipHash under a fixed key: the same iteration order in every run.
    Fixed,
}

impl Default for NameState {
    fn default() -> NameState {
        if FIXED_NAME_KEY.with(Cell::get) {
            NameState::Fixed
        } else {
            NameState::Random(RandomState::new())
        }
    }
}

impl BuildHasher for NameState {
    type Hasher = DefaultHasher;

    #[inline]
    fn build_hasher(&self) -> DefaultHasher {
        match self {
            NameState::Random(state) => state.build_hasher(),
            NameState::Fixed => DefaultHasher::new(),
        }
    }
}

/// A map keyed by queue names.
pub type NameMap<K, V> = HashMap<K, V, NameState>;
/// A set of queue names.
pub type NameSet<K> = HashSet<K, NameState>;

/// Makes every name map created later on this thread hash under a fixed
/// key, so a simulation's runs replay exactly. Only for simulations: a
/// fixed key lets whoever names queues choose colliding names.
pub fn fix_name_hashing_for_simulation() {
    FIXED_NAME_KEY.with(|fixed| fixed.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_integers_fill_distinct_buckets_and_tags() {
        let build = BuildIntHasher::default();
        let hashes: Vec<u64> = (0..4096u64).map(|n| build.hash_one(n)).collect();
        let buckets: HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
        assert_eq!(buckets.len(), 4096, "low bits are a bijection");
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(
            tags.len() > 100,
            "high bits vary: {} distinct tags",
            tags.len()
        );
    }

    #[test]
    fn maps_work_with_the_int_hasher() {
        let mut ints: IntMap<u64, u64> = IntMap::default();
        for n in 0..10_000 {
            ints.insert(n * 3, n);
        }
        assert_eq!(ints.get(&2_997), Some(&999));
        assert_eq!(ints.get(&2_998), None);
    }

    #[test]
    fn byte_strings_still_hash_by_content() {
        let build = BuildIntHasher::default();
        assert_eq!(build.hash_one("abcdefghij"), build.hash_one("abcdefghij"));
        assert_ne!(build.hash_one("abcdefghij"), build.hash_one("abcdefghik"));
        assert_ne!(build.hash_one("a"), build.hash_one("a\0"));
    }
}
