//! The ids a queue remembers for dedup: every stored message's, on disk or
//! not, and every acked one's for the dedup window after its ack.
//!
//! A backlog of tens of millions of messages, or a window at full rate,
//! holds tens of millions of ids, so an id costs 12 bytes in a table kept
//! between 7/10 and 7/8 full (about 15 bytes each), not the 60 to 100 a
//! general-purpose map and an expiry queue cost:
//!
//! - An id is 80 bits of its 128-bit [`DedupKey`] (a keyed hash, so two
//!   different ids agree on them with probability 2^-80; with 2^25 ids
//!   remembered, one publish in about 3·10^16 could be taken for a
//!   retry), and 16 bits of state: stored, or the time its window ends.
//! - Each sub-table is a Robin Hood hash table (linear probing that keeps
//!   entries ordered by distance from home, so a miss stops early) and
//!   grows by a quarter at a time.
//! - Sub-tables are added one at a time as the set grows (linear hashing),
//!   so no rehash moves more than a few tens of thousands of ids: a shard
//!   never stalls on a resize.
//! - Expired ids are found by a sweep that visits a bounded number of slots
//!   per call; a lookup never trusts an entry whose window has ended, so
//!   sweeping is only about memory.

use std::time::{Duration, Instant};

use crate::dedup::DedupKey;

/// A moment, in 1/16 s since the process's first use of one: 4 bytes where
/// an `Instant` takes 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Tick(pub(crate) u32);

impl Tick {
    const PER_SEC: u128 = 16;

    pub(crate) fn origin() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    fn ticks(t: Instant) -> u128 {
        t.saturating_duration_since(Tick::origin()).as_nanos() * Tick::PER_SEC
    }

    /// An expiry at `t`, rounded up: never earlier than asked.
    pub(crate) fn until(t: Instant) -> Tick {
        let n = Tick::ticks(t).div_ceil(1_000_000_000);
        Tick(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// The present `t`, rounded down: nothing expires early.
    pub(crate) fn now(t: Instant) -> Tick {
        Tick(u32::try_from(Tick::ticks(t) / 1_000_000_000).unwrap_or(u32::MAX))
    }

    /// The expiry `window_ms` after `at_ms` (Unix ms), as a tick, given that
    /// `now` is `now_unix_ms`.
    pub(crate) fn after_unix_ms(
        at_ms: u64,
        window_ms: u64,
        now: Instant,
        now_unix_ms: u64,
    ) -> Tick {
        let left = at_ms.saturating_add(window_ms).saturating_sub(now_unix_ms);
        // Rounded up, and saturating: recovery may be handed any window.
        let ticks = u128::from(left)
            .saturating_mul(Tick::PER_SEC)
            .div_ceil(1000);
        let n = u128::from(Tick::until(now).0).saturating_add(ticks);
        Tick(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Time from `now` until this tick.
    pub(crate) fn left(self, now: Instant) -> Duration {
        let at = Tick::origin() + Duration::from_nanos((u64::from(self.0) * 1_000_000_000) / 16);
        at.saturating_duration_since(now)
    }
}

/// What a remembered id stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdState {
    /// Its message is in the queue (in memory or on disk).
    Stored,
    /// Its message was acked; the id is a duplicate until its window ends.
    Acked,
}

/// State value of a stored id; every other value is an expiry.
const STORED: u16 = u16::MAX;
/// Ids per sub-table, on average, before the set adds one.
const SPLIT_AT: usize = 1 << 15;
/// The most sub-tables: the 16 bits of an id that choose one.
const MAX_LEVEL: u32 = 16;
/// Slots a sweep visits per publish or ack, at most.
const SWEEP_STEP: usize = 4096;
/// The longest the set waits to find an expired id, when the window is
/// shorter than eight times this: a pass over millions of stored ids is
/// not worth making every few seconds.
const MIN_SWEEP_PERIOD: Duration = Duration::from_secs(10);
/// Expiries are kept at most this many units ahead (the unit is chosen
/// from the window), so 16 bits of state never wrap within a window.
const WINDOW_UNITS: u128 = 8192;

/// An id in a table; all zeros is an empty slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, packed(4))]
struct Slot {
    /// The low 64 bits of the key; never 0 in a full slot.
    hi: u64,
    /// The key's next 16 bits, then the state.
    lo: u32,
}

impl Slot {
    const EMPTY: Slot = Slot { hi: 0, lo: 0 };

    fn of(key: DedupKey, state: u16) -> Slot {
        let k = key.0;
        let hi = k as u64;
        Slot {
            hi: if hi == 0 { 1 } else { hi },
            lo: ((k >> 64) as u32 & 0xffff) << 16 | u32::from(state),
        }
    }

    fn is_empty(self) -> bool {
        self.hi == 0
    }

    fn same_id(self, other: Slot) -> bool {
        self.hi == other.hi && self.lo >> 16 == other.lo >> 16
    }

    /// The 16 bits that choose its sub-table.
    fn chooser(self) -> usize {
        (self.lo >> 16) as usize
    }

    fn state(self) -> u16 {
        self.lo as u16
    }
}

/// One sub-table: Robin Hood hashing over `slots`, home by multiply-shift
/// (any size works, so it can grow by a quarter).
#[derive(Debug, Default)]
struct Table {
    slots: Vec<Slot>,
    len: usize,
}

impl Table {
    fn with_room(n: usize) -> Table {
        let cap = if n == 0 { 0 } else { (n * 10 / 7).max(8) };
        Table {
            slots: vec![Slot::EMPTY; cap],
            len: 0,
        }
    }

    fn home(&self, hi: u64) -> usize {
        ((u128::from(hi) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// How far the entry in slot `i` is from its home.
    fn distance(&self, i: usize) -> usize {
        let home = self.home(self.slots[i].hi);
        if i >= home {
            i - home
        } else {
            i + self.slots.len() - home
        }
    }

    fn find(&self, probe: Slot) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(probe.hi);
        let mut d = 0;
        loop {
            let s = self.slots[i];
            if s.is_empty() || self.distance(i) < d {
                return None;
            }
            if s.same_id(probe) {
                return Some(i);
            }
            i = self.next(i);
            d += 1;
        }
    }

    /// Adds an id known to be absent.
    fn insert_new(&mut self, slot: Slot) {
        debug_assert!(self.find(slot).is_none(), "an id held twice");
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            let cap = self.slots.len();
            self.resize((cap + cap / 4).max(8));
        }
        let mut cur = slot;
        let mut i = self.home(cur.hi);
        let mut d = 0;
        loop {
            let s = self.slots[i];
            if s.is_empty() {
                self.slots[i] = cur;
                self.len += 1;
                debug_assert!(
                    self.len * 8 <= self.slots.len() * 7,
                    "a table past 7/8 full"
                );
                return;
            }
            let sd = self.distance(i);
            if sd < d {
                self.slots[i] = cur;
                cur = s;
                d = sd;
            }
            i = self.next(i);
            d += 1;
        }
    }

    /// Empties slot `i`, moving the entries after it back (no tombstones).
    fn remove_at(&mut self, i: usize) {
        let mut j = i;
        loop {
            let n = self.next(j);
            if self.slots[n].is_empty() || self.distance(n) == 0 {
                self.slots[j] = Slot::EMPTY;
                break;
            }
            self.slots[j] = self.slots[n];
            j = n;
        }
        self.len -= 1;
    }

    fn resize(&mut self, cap: usize) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::EMPTY; cap]);
        self.len = 0;
        for s in old {
            if !s.is_empty() {
                self.insert_new(s);
            }
        }
    }

    /// Gives memory back once most ids have gone; returns whether it did.
    fn shrink_if_sparse(&mut self) -> bool {
        let cap = self.slots.len();
        if self.len == 0 && cap > 0 {
            self.slots = Vec::new();
        } else if cap > 64 && self.len * 4 < cap {
            self.resize((self.len * 3 / 2).max(8));
        } else {
            return false;
        }
        true
    }
}

/// Where the sweep is, and how much it owes.
#[derive(Debug, Default)]
struct Sweep {
    table: usize,
    slot: usize,
    /// When it last took account of time passing.
    at: Option<Tick>,
    /// Slots it should visit to keep to its period.
    owed: usize,
}

/// The ids one queue remembers (see the module doc).
#[derive(Debug)]
pub struct IdSet {
    /// Sub-tables, `2^level + split` of them (linear hashing).
    tables: Vec<Table>,
    level: u32,
    split: usize,
    len: usize,
    /// Acked ids held, expired or not: the sweep rests while there are none.
    acked: usize,
    slots: usize,
    /// An expiry unit is 1/16 s shifted left by this.
    shift: u32,
    /// Ticks per full sweep.
    period: u32,
    sweep: Sweep,
}

impl Default for IdSet {
    fn default() -> IdSet {
        IdSet::new(Duration::from_secs(120))
    }
}

impl IdSet {
    /// An empty set for a queue whose dedup window is `window`.
    pub fn new(window: Duration) -> IdSet {
        let ticks = (window.as_nanos() * Tick::PER_SEC / 1_000_000_000).min(u128::from(u32::MAX));
        let mut shift = 0;
        while (ticks >> shift) > WINDOW_UNITS {
            shift += 1;
        }
        let period = (window / 8).max(MIN_SWEEP_PERIOD).as_nanos() * Tick::PER_SEC / 1_000_000_000;
        IdSet {
            tables: vec![Table::default()],
            level: 0,
            split: 0,
            len: 0,
            acked: 0,
            slots: 0,
            shift,
            period: u32::try_from(period).unwrap_or(u32::MAX).max(1),
            sweep: Sweep::default(),
        }
    }

    /// Ids held (some may be acked ids whose window ended, not swept yet).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes its tables take.
    pub fn heap_bytes(&self) -> u64 {
        (self.slots * std::mem::size_of::<Slot>()
            + self.tables.capacity() * std::mem::size_of::<Table>()) as u64
    }

    fn table_of(&self, slot: Slot) -> usize {
        let c = slot.chooser();
        let t = c & ((1 << self.level) - 1);
        if t < self.split {
            c & ((1 << (self.level + 1)) - 1)
        } else {
            t
        }
    }

    fn unit_now(&self, now: Instant) -> u16 {
        (Tick::now(now).0 >> self.shift) as u16
    }

    fn encode(&self, until: Tick) -> u16 {
        // Rounded up: an id is never forgotten early.
        let u = until.0.div_ceil(1 << self.shift) as u16;
        if u == STORED {
            0
        } else {
            u
        }
    }

    /// Whether a state is an expiry that `now` has reached.
    fn expired(state: u16, now: u16) -> bool {
        state != STORED && now.wrapping_sub(state) < 0x8000
    }

    /// What `key` is remembered as at `now`, if anything.
    pub fn state(&self, key: DedupKey, now: Instant) -> Option<IdState> {
        let probe = Slot::of(key, 0);
        let t = &self.tables[self.table_of(probe)];
        let s = t.slots[t.find(probe)?];
        match s.state() {
            STORED => Some(IdState::Stored),
            state if IdSet::expired(state, self.unit_now(now)) => None,
            _ => Some(IdState::Acked),
        }
    }

    /// Starts loading the slot where `key`'s lookup begins: a caller with
    /// many keys at hand (an `ack_batch`) prefetches them all first, so
    /// their cache misses, the cost of a large set, overlap.
    pub fn prefetch(&self, key: DedupKey) {
        let probe = Slot::of(key, 0);
        let t = &self.tables[self.table_of(probe)];
        if let Some(slot) = t.slots.get(t.home(probe.hi)) {
            crate::cache_hint::prefetch(slot);
        }
    }

    /// Remembers `key` as stored unless it is remembered already (stored,
    /// or acked and inside its window); returns whether it was new.
    pub fn store_new(&mut self, key: DedupKey, now: Instant) -> bool {
        let probe = Slot::of(key, STORED);
        let ti = self.table_of(probe);
        if let Some(i) = self.tables[ti].find(probe) {
            let state = self.tables[ti].slots[i].state();
            if !IdSet::expired(state, self.unit_now(now)) {
                return false;
            }
            self.tables[ti].slots[i] = probe;
            self.acked -= 1;
            return true;
        }
        self.add(ti, probe);
        true
    }

    /// Remembers `key` as stored, whatever it was.
    pub fn store(&mut self, key: DedupKey) {
        self.set(Slot::of(key, STORED));
    }

    /// Remembers `key` as acked until `until` (replacing a stored state).
    pub(crate) fn ack(&mut self, key: DedupKey, until: Tick) {
        let state = self.encode(until);
        self.set(Slot::of(key, state));
    }

    /// Like [`IdSet::ack`], unless `key` is remembered as stored: a message
    /// that holds it outranks an older ack.
    pub(crate) fn ack_unless_stored(&mut self, key: DedupKey, until: Tick) {
        let state = self.encode(until);
        let slot = Slot::of(key, state);
        let ti = self.table_of(slot);
        match self.tables[ti].find(slot) {
            Some(i) if self.tables[ti].slots[i].state() == STORED => {}
            _ => self.set(slot),
        }
    }

    fn set(&mut self, slot: Slot) {
        let ti = self.table_of(slot);
        match self.tables[ti].find(slot) {
            Some(i) => {
                let was = self.tables[ti].slots[i].state();
                self.tables[ti].slots[i] = slot;
                match (was == STORED, slot.state() == STORED) {
                    (true, false) => self.acked += 1,
                    (false, true) => self.acked -= 1,
                    _ => {}
                }
            }
            None => self.add(ti, slot),
        }
    }

    fn add(&mut self, ti: usize, slot: Slot) {
        let before = self.tables[ti].slots.len();
        self.tables[ti].insert_new(slot);
        self.slots = self.slots + self.tables[ti].slots.len() - before;
        self.len += 1;
        if slot.state() != STORED {
            self.acked += 1;
        }
        if self.len > SPLIT_AT * self.tables.len() && self.level < MAX_LEVEL {
            self.split_one();
        }
        debug_assert!(self.acked <= self.len, "more acked ids than ids");
    }

    /// Forgets `key`; returns what it was remembered as (expired or not).
    pub fn remove(&mut self, key: DedupKey) -> Option<IdState> {
        let probe = Slot::of(key, 0);
        let ti = self.table_of(probe);
        let i = self.tables[ti].find(probe)?;
        let state = self.tables[ti].slots[i].state();
        self.remove_slot(ti, i);
        Some(if state == STORED {
            IdState::Stored
        } else {
            IdState::Acked
        })
    }

    /// Forgets `key` if it is remembered as stored.
    pub fn remove_stored(&mut self, key: DedupKey) {
        let probe = Slot::of(key, 0);
        let ti = self.table_of(probe);
        if let Some(i) = self.tables[ti].find(probe) {
            if self.tables[ti].slots[i].state() == STORED {
                self.remove_slot(ti, i);
            }
        }
    }

    fn remove_slot(&mut self, ti: usize, i: usize) {
        if self.tables[ti].slots[i].state() != STORED {
            self.acked -= 1;
        }
        let table = &mut self.tables[ti];
        table.remove_at(i);
        self.len -= 1;
        let before = table.slots.len();
        if table.shrink_if_sparse() {
            self.slots = self.slots - before + table.slots.len();
            if self.sweep.table == ti {
                // Ids keep their order (homes are by multiply-shift), so the
                // sweep keeps its place, scaled; an id it misses waits a pass.
                let cap = self.tables[ti].slots.len();
                self.sweep.slot = (self.sweep.slot * cap).checked_div(before).unwrap_or(0);
            }
        }
    }

    /// Splits the next sub-table in turn into itself and a new one.
    fn split_one(&mut self) {
        let from = self.split;
        let old = std::mem::take(&mut self.tables[from]);
        let half = old.len / 2 + old.len / 8;
        self.tables[from] = Table::with_room(half);
        self.tables.push(Table::with_room(half));
        self.split += 1;
        if self.split == 1 << self.level {
            self.level += 1;
            self.split = 0;
        }
        // Linear hashing: 2^level tables, plus those split in this round.
        debug_assert_eq!(self.tables.len(), (1 << self.level) + self.split);
        self.slots -= old.slots.len();
        for s in old.slots {
            if !s.is_empty() {
                let ti = self.table_of(s);
                self.tables[ti].insert_new(s);
            }
        }
        self.slots +=
            self.tables[from].slots.len() + self.tables.last().map_or(0, |t| t.slots.len());
        // The sweep's place may have moved; starting that table over is
        // harmless.
        if self.sweep.table == from {
            self.sweep.slot = 0;
        }
    }

    /// Forgets some acked ids whose window has ended: a publish's or an
    /// ack's share of a sweep that passes every slot once per period.
    pub fn expire(&mut self, now: Instant) {
        self.account(now);
        let step = self.sweep.owed.min(SWEEP_STEP);
        self.sweep_slots(now, step);
    }

    /// Like [`IdSet::expire`], for a queue that sees neither publishes nor
    /// acks: visits at least a 256th of the slots, so a pass takes at most
    /// 256 calls (the shard makes one a second) whatever the set's size.
    pub fn sweep(&mut self, now: Instant) {
        self.account(now);
        let step = self.sweep.owed.max(self.slots / 256).max(SWEEP_STEP);
        self.sweep_slots(now, step);
    }

    /// Forgets every acked id whose window has ended (tests and tools):
    /// whole passes until one finds nothing (a table that shrinks during a
    /// pass may hide an id from it).
    pub fn expire_all(&mut self, now: Instant) {
        loop {
            let before = self.len;
            self.sweep = Sweep::default();
            let slots = self.slots;
            self.sweep_slots(now, slots);
            if self.len == before {
                return;
            }
        }
    }

    fn account(&mut self, now: Instant) {
        let t = Tick::now(now);
        let at = *self.sweep.at.get_or_insert(t);
        if t > at {
            let elapsed = (t.0 - at.0) as usize;
            let owed = self.slots.saturating_mul(elapsed) / self.period as usize;
            self.sweep.owed = self.sweep.owed.saturating_add(owed).min(self.slots);
            self.sweep.at = Some(t);
        }
    }

    fn sweep_slots(&mut self, now: Instant, mut budget: usize) {
        if self.acked == 0 {
            self.sweep.owed = 0;
            return;
        }
        let unit = self.unit_now(now);
        self.sweep.owed = self.sweep.owed.saturating_sub(budget);
        let mut passed_tables = 0;
        while budget > 0 && passed_tables <= self.tables.len() {
            let ti = self.sweep.table.min(self.tables.len() - 1);
            let i = self.sweep.slot;
            if i >= self.tables[ti].slots.len() {
                self.sweep.table = (ti + 1) % self.tables.len();
                self.sweep.slot = 0;
                passed_tables += 1;
                continue;
            }
            budget -= 1;
            let s = self.tables[ti].slots[i];
            if !s.is_empty() && IdSet::expired(s.state(), unit) {
                // What moves back into `i` is looked at next.
                self.remove_slot(ti, i);
            } else {
                self.sweep.slot += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> DedupKey {
        // Spread like a hash: every bit of the key depends on n.
        let a = u128::from(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n.rotate_left(29));
        let b = u128::from((n ^ 0xdead_beef).wrapping_mul(0xc2b2_ae3d_27d4_eb4f));
        DedupKey(a << 64 | b)
    }

    #[test]
    fn stored_ids_are_duplicates_until_removed() {
        let now = Instant::now();
        let mut set = IdSet::new(Duration::from_secs(120));
        for n in 0..100_000 {
            assert!(set.store_new(key(n), now), "{n} is new");
        }
        assert_eq!(set.len(), 100_000);
        assert!(set.tables.len() > 1, "the set split its tables");
        for n in 0..100_000 {
            assert_eq!(set.state(key(n), now), Some(IdState::Stored));
            assert!(!set.store_new(key(n), now), "{n} is a duplicate");
        }
        for n in 100_000..200_000 {
            assert_eq!(set.state(key(n), now), None);
        }
        for n in (0..100_000).step_by(2) {
            assert_eq!(set.remove(key(n)), Some(IdState::Stored));
        }
        for n in 0..100_000 {
            let want = (n % 2 == 1).then_some(IdState::Stored);
            assert_eq!(set.state(key(n), now), want, "{n}");
        }
        assert_eq!(set.len(), 50_000);
    }

    #[test]
    fn an_acked_id_is_a_duplicate_for_its_window_and_then_not() {
        let t0 = Instant::now();
        let window = Duration::from_secs(2);
        let mut set = IdSet::new(window);
        assert!(set.store_new(key(1), t0));
        set.ack(key(1), Tick::until(t0 + window));
        assert_eq!(set.state(key(1), t0), Some(IdState::Acked));
        assert!(!set.store_new(key(1), t0 + window - Duration::from_millis(100)));
        let later = t0 + window + Duration::from_millis(100);
        assert_eq!(set.state(key(1), later), None, "past its window");
        assert!(set.store_new(key(1), later), "stored again");
        assert_eq!(set.state(key(1), later), Some(IdState::Stored));
    }

    #[test]
    fn sweeps_forget_expired_ids_and_give_memory_back() {
        let t0 = Instant::now();
        let window = Duration::from_secs(1);
        let mut set = IdSet::new(window);
        for n in 0..200_000 {
            set.store(key(n));
        }
        let full = set.heap_bytes();
        assert!(full < 200_000 * 18, "about 15 bytes an id, took {full}");
        for n in 0..200_000 {
            set.ack(key(n), Tick::until(t0 + window));
        }
        set.store(key(7_000_000));
        // One call a second for the shard: a pass in at most 256 calls.
        let mut t = t0 + window;
        for _ in 0..300 {
            t += Duration::from_secs(1);
            set.sweep(t);
        }
        assert_eq!(set.len(), 1, "only the stored id is left");
        assert_eq!(set.state(key(7_000_000), t), Some(IdState::Stored));
        assert!(
            set.heap_bytes() < full / 8,
            "tables shrank to {}",
            set.heap_bytes()
        );
    }

    #[test]
    fn publishes_and_acks_sweep_a_little_each() {
        let t0 = Instant::now();
        let window = Duration::from_secs(8);
        let mut set = IdSet::new(window);
        for n in 0..50_000 {
            set.store(key(n));
            set.ack(key(n), Tick::until(t0 + window));
        }
        let mut t = t0 + window;
        let mut n = 1_000_000;
        // Publishes for a few sweep periods past the window.
        while t < t0 + window + MIN_SWEEP_PERIOD * 5 {
            t += Duration::from_millis(10);
            set.expire(t);
            assert!(set.store_new(key(n), t));
            n += 1;
        }
        assert_eq!(
            set.len(),
            (n - 1_000_000) as usize,
            "the acked ids are gone"
        );
    }

    #[test]
    fn long_windows_keep_their_expiry_exact_enough() {
        let t0 = Instant::now();
        let window = Duration::from_secs(24 * 3600);
        let mut set = IdSet::new(window);
        set.store(key(1));
        set.ack(key(1), Tick::until(t0 + window));
        assert_eq!(
            set.state(key(1), t0 + window - Duration::from_secs(60)),
            Some(IdState::Acked)
        );
        let unit = Duration::from_nanos((1u64 << set.shift) * 1_000_000_000 / 16);
        assert_eq!(
            set.state(key(1), t0 + window + unit + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn removing_from_the_middle_of_a_cluster_keeps_every_other_id_findable() {
        let now = Instant::now();
        let mut set = IdSet::new(Duration::from_secs(60));
        for n in 0..20_000 {
            set.store(key(n));
        }
        for n in (0..20_000).filter(|n| n % 3 == 0) {
            set.remove_stored(key(n));
        }
        for n in 0..20_000 {
            assert_eq!(set.state(key(n), now).is_some(), n % 3 != 0, "{n}");
        }
    }
}
