//! Topic patterns compiled into a trie, matched by a DFA built lazily over it.
//!
//! Every binding pattern is a path of the trie: a literal word, `*` or `#`
//! per edge, each run of wildcards normalised to its `*`s and at most one `#`
//! (`#.#` and `#.*.#.*` match what `#` and `*.*.#` match; see
//! [`TopicTrie::insert`]). A node is a pattern prefix; a node entered by a
//! `#` edge absorbs any further word (it has an implicit self-loop), and a
//! node with a `#` child also stands in that child (the `#` may match nothing).
//!
//! **The NFA walk.** Matching a key reads its words once, keeping the set of
//! nodes whose prefix matches the words read so far. Each node enters the set
//! at most once per word (a per-thread stamp array says whether it is in
//! already), so a key of `w` words costs at most `w + 1` times the number of
//! nodes, and in practice the few nodes under the key's first words. A
//! backtracking matcher instead tries every way of splitting the key between
//! the `#`s of a pattern, which is exponential in their number.
//!
//! **The DFA** (the RE2 approach). The walk is linear, but it still does work
//! per live node per word: against hostile patterns that keep many `#` and `*`
//! nodes alive, that is hundreds of visits per key. Yet the set after a word
//! depends only on the set before and on which literal the word is: every
//! word that is no pattern's literal can only be matched by `*` and `#`, so
//! all of them lead to the same set. A set (sorted: canonical) is a DFA state;
//! its transitions are memoised per (state, interned literal) plus one "other
//! word" transition per state, and a state a key ended in keeps its targets,
//! deduplicated by queue. A key whose transitions are cached costs, per word,
//! one hash lookup of the word (skipped in states where no node has a literal
//! child) and one integer-keyed lookup, then one copy of a precomputed list:
//! no allocation and nothing proportional to the patterns.
//!
//! **Bounds.** A hostile client controls both the patterns and the keys, and
//! the states can be exponentially many (`#.a.*.*.*…`: which of the last
//! words were `a`), so every cache is capped ([`Limits`]: states and
//! approximate bytes). A state is built by one step of the walk, so a key
//! that misses costs the walk plus interning its sets. When a cache is full
//! it is cleared, if it has served [`Limits::keys_per_clear`] keys since it
//! was last cleared, and otherwise the key is finished by the walk from the
//! state reached: so building stays a small share of the keys matched, a key
//! never costs more than a constant times the walk, and memory never exceeds
//! the caps.
//!
//! **Where the cache lives.** An [`Exchange`](super::Exchange) sits in an
//! immutable topology snapshot that every shard thread shares, so it cannot
//! hold a `RefCell`, and locks are out of place on the per-message path. Each
//! shard thread matches on its own (one per core), so each keeps its own
//! caches, one per trie it has matched on, keyed by the trie's identity: a
//! number drawn on every insert (a clone shares it, having the same
//! patterns). Binding makes a new identity, and unbinding rebuilds the
//! exchange, so a changed binding set never meets a stale cache; caches of
//! dropped tries are swept, and one thread's caches together are capped too,
//! least recently used dropped first.

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::mem::size_of;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::hashers::IntMap;

use super::{dedup_queues, Target};

/// A node's index in [`TopicTrie::nodes`].
type NodeId = usize;
/// An interned literal word's index.
type WordId = usize;
/// A state's index in [`Dfa::states`].
type StateId = usize;

/// The binding patterns of one topic exchange.
#[derive(Debug, Clone, Default)]
pub(super) struct TopicTrie {
    /// `nodes[0]` is the root (the empty prefix) once anything is inserted.
    nodes: Vec<TopicNode>,
    /// Every literal word of every pattern, numbered. A key word missing here
    /// can only be matched by `*` and `#`.
    word_ids: HashMap<Box<str>, WordId>,
    /// Which cached DFAs belong to these patterns: `None` while there are
    /// none, a fresh one after every insert.
    identity: Option<Identity>,
}

/// One pattern prefix.
#[derive(Debug, Clone, Default)]
struct TopicNode {
    /// Children by literal word.
    words: IntMap<WordId, NodeId>,
    /// Child by `*`.
    star: Option<NodeId>,
    /// Child by `#`, whose own children are all literal (runs are normalised).
    hash: Option<NodeId>,
    /// Entered by a `#` edge: stays in the set whatever word comes next.
    absorbs: bool,
    /// The bindings whose whole pattern is this prefix.
    targets: Vec<Target>,
}

/// Names one set of patterns for the per-thread DFA caches.
#[derive(Debug, Clone)]
struct Identity {
    /// Unique per insert, never reused: the caches' key.
    id: u64,
    /// Held by the trie and its clones; a cache holds it weakly to learn when
    /// no trie with these patterns is left.
    alive: Arc<()>,
}

/// Where identities come from.
static NEXT_IDENTITY: AtomicU64 = AtomicU64::new(1);

impl Identity {
    fn fresh() -> Identity {
        Identity {
            id: NEXT_IDENTITY.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
        }
    }
}

impl TopicTrie {
    /// Number of nodes, the bound on the set a match keeps per word.
    #[cfg(test)]
    pub(super) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Adds `pattern` (dot-separated; whole words `*` and `#` are wildcards).
    ///
    /// Each run of consecutive wildcards is stored normalised: its `*`s, then
    /// one `#` if it had any. A run of `k` stars and at least one `#` matches
    /// exactly the sequences of `k` or more words, as `*`×k then `#` does, so
    /// `#.#`, `#.*.#` and `*.#` share nodes and a run costs one `#` state.
    ///
    /// The trie gets a new identity: no DFA cached for the old patterns is
    /// used for the new ones.
    pub(super) fn insert(&mut self, pattern: &str, target: Target) {
        if self.nodes.is_empty() {
            self.nodes.push(TopicNode::default());
        }
        let mut at: NodeId = 0;
        let (mut stars, mut hash) = (0usize, false);
        for word in pattern.split('.') {
            match word {
                "*" => stars += 1,
                "#" => hash = true,
                literal => {
                    at = self.wildcards(at, stars, hash);
                    (stars, hash) = (0, false);
                    let fresh = self.word_ids.len();
                    let id = *self.word_ids.entry(literal.into()).or_insert(fresh);
                    at = match self.nodes[at].words.get(&id) {
                        Some(&next) => next,
                        None => {
                            let next = self.push(false);
                            self.nodes[at].words.insert(id, next);
                            next
                        }
                    };
                }
            }
        }
        at = self.wildcards(at, stars, hash);
        self.nodes[at].targets.push(target);
        self.identity = Some(Identity::fresh());
    }

    /// The node after a run of `stars` `*` and, when `hash`, one `#`, from `at`.
    fn wildcards(&mut self, mut at: NodeId, stars: usize, hash: bool) -> NodeId {
        for _ in 0..stars {
            at = match self.nodes[at].star {
                Some(next) => next,
                None => {
                    let next = self.push(false);
                    self.nodes[at].star = Some(next);
                    next
                }
            };
        }
        if hash {
            at = match self.nodes[at].hash {
                Some(next) => next,
                None => {
                    let next = self.push(true);
                    self.nodes[at].hash = Some(next);
                    next
                }
            };
        }
        at
    }

    fn push(&mut self, absorbs: bool) -> NodeId {
        self.nodes.push(TopicNode {
            absorbs,
            ..TopicNode::default()
        });
        self.nodes.len() - 1
    }

    /// Appends the targets of every pattern matching `key`, each queue once,
    /// in the order of the matching nodes (fixed for a given set of
    /// patterns), through this thread's DFA cache for these patterns.
    pub(super) fn collect(&self, key: &str, out: &mut Vec<Target>) {
        let Some(identity) = &self.identity else {
            return;
        };
        let cached = DFAS.try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut cache) => {
                cache.route(self, identity, key, out);
                true
            }
            // Only if matching re-entered itself, or the thread is exiting.
            Err(_) => false,
        });
        if cached != Ok(true) {
            self.collect_nfa(key, out);
        }
    }

    /// [`Self::collect`] by the NFA walk alone, caching nothing; returns the
    /// node visits, the walk's work (at most (words + 1) × nodes). What a key
    /// costs when no transition it takes is cached.
    pub(super) fn collect_nfa(&self, key: &str, out: &mut Vec<Target>) -> usize {
        if self.nodes.is_empty() {
            return 0;
        }
        with_scratch(|scratch| self.walk_key(key, scratch, out))
    }

    /// [`Self::collect_nfa`] with the given buffers.
    fn walk_key(&self, key: &str, scratch: &mut Scratch, out: &mut Vec<Target>) -> usize {
        scratch.fit(self.nodes.len());
        let Scratch {
            seen,
            stamp,
            current,
            ..
        } = scratch;
        *stamp = next_stamp(seen, *stamp);
        current.clear();
        self.enter(0, seen, *stamp, current);
        self.walk(key.split('.'), scratch, out)
    }

    /// Runs the NFA over `words` from the set in `scratch.current` (fitted
    /// to this trie), then appends the targets of the final set as the DFA
    /// does: by node, each queue once. Returns the node visits.
    fn walk<'k>(
        &self,
        words: impl Iterator<Item = &'k str>,
        scratch: &mut Scratch,
        out: &mut Vec<Target>,
    ) -> usize {
        let Scratch {
            seen,
            stamp,
            current,
            next,
        } = scratch;
        let mut visits = 0;
        for word in words {
            if current.is_empty() {
                // No prefix matches any more: neither will a longer one.
                return visits;
            }
            // Looked up once, and only when a node has literal children
            // (`None` until then; `Some(None)`: no pattern has this word).
            let mut word_id: Option<Option<WordId>> = None;
            let lookup = || *word_id.get_or_insert_with(|| self.word_ids.get(word).copied());
            *stamp = next_stamp(seen, *stamp);
            next.clear();
            visits += self.step(current, lookup, seen, *stamp, next);
            std::mem::swap(current, next);
        }
        current.sort_unstable();
        visits += current.len();
        self.emit(current, out);
        visits
    }

    /// Puts in `next` (stamped `stamp`) the nodes after one word from the
    /// set `from`; `word` gives the word's id (`None`: no pattern has it as a
    /// literal) and is asked only if some node has literal children. Returns
    /// the nodes visited.
    #[inline]
    fn step(
        &self,
        from: &[NodeId],
        mut word: impl FnMut() -> Option<WordId>,
        seen: &mut [u32],
        stamp: u32,
        next: &mut Vec<NodeId>,
    ) -> usize {
        for &id in from {
            let node = &self.nodes[id];
            if node.absorbs {
                self.enter(id, seen, stamp, next);
            }
            if !node.words.is_empty() {
                if let Some(&child) = word().and_then(|w| node.words.get(&w)) {
                    self.enter(child, seen, stamp, next);
                }
            }
            if let Some(child) = node.star {
                self.enter(child, seen, stamp, next);
            }
        }
        from.len()
    }

    /// Puts `id` in `set` unless it is there for this word, and its `#` child
    /// with it (a `#` may match no word).
    #[inline]
    fn enter(&self, mut id: NodeId, seen: &mut [u32], stamp: u32, set: &mut Vec<NodeId>) {
        loop {
            if seen[id] == stamp {
                return;
            }
            seen[id] = stamp;
            set.push(id);
            match self.nodes[id].hash {
                Some(child) => id = child,
                None => return,
            }
        }
    }

    /// Appends the targets of `nodes`, in that order, each queue once.
    fn emit(&self, nodes: &[NodeId], out: &mut Vec<Target>) {
        let start = out.len();
        for &id in nodes {
            out.extend(self.nodes[id].targets.iter().cloned());
        }
        dedup_queues(out, start);
    }

    /// The sorted set of nodes matching the empty prefix: the root and its
    /// `#` child, into `scratch.next`.
    fn start_set(&self, scratch: &mut Scratch) {
        scratch.fit(self.nodes.len());
        let Scratch {
            seen, stamp, next, ..
        } = scratch;
        *stamp = next_stamp(seen, *stamp);
        next.clear();
        self.enter(0, seen, *stamp, next);
        next.sort_unstable();
    }

    /// The sorted set after one word (`word`: its id, `None` for a word no
    /// pattern has) from the set `from`, into `scratch.next`.
    fn step_set(&self, from: &[NodeId], word: Option<WordId>, scratch: &mut Scratch) {
        scratch.fit(self.nodes.len());
        let Scratch {
            seen, stamp, next, ..
        } = scratch;
        *stamp = next_stamp(seen, *stamp);
        next.clear();
        self.step(from, || word, seen, *stamp, next);
        next.sort_unstable();
    }
}

/// How much one thread may cache: a hostile client chooses the patterns and
/// the keys, and the states a set of patterns has can be exponentially many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limits {
    /// States per cache (one cache per exchange and thread).
    states: usize,
    /// Approximate bytes per cache: node sets, transitions, target lists.
    bytes: usize,
    /// Keys a full cache must have served since it was last cleared before
    /// it is cleared again; until then, keys it cannot finish are finished by
    /// the NFA walk. Keeps building (a walk step plus interning a set) a
    /// small share of the work however keys are chosen.
    keys_per_clear: usize,
    /// Approximate bytes of all of one thread's caches together.
    thread_bytes: usize,
    /// Caches one thread keeps (exchanges it matches on).
    thread_caches: usize,
}

impl Limits {
    /// The limits shard threads run with: 1 MiB and 4,096 states per
    /// exchange, 16 MiB and 1,024 exchanges per thread.
    const DEFAULT: Limits = Limits {
        states: 4096,
        bytes: 1 << 20,
        keys_per_clear: 4096,
        thread_bytes: 16 << 20,
        thread_caches: 1024,
    };
}

/// Approximate bytes of one state besides its node set: the state, its
/// entry in [`Dfa::ids`] and the `Rc` header of its set.
const STATE_BYTES: usize =
    size_of::<DfaState>() + size_of::<(Rc<[NodeId]>, StateId)>() + 2 * size_of::<usize>() + 1;
/// Approximate bytes of one memoised literal transition.
const TRANSITION_BYTES: usize = size_of::<((StateId, WordId), StateId)>() + 1;

/// Approximate bytes of a state whose set has `nodes` nodes.
fn state_bytes(nodes: usize) -> usize {
    STATE_BYTES + nodes * size_of::<NodeId>()
}

/// A lazily built DFA over one trie, on one thread.
#[derive(Debug, Default)]
struct Dfa {
    /// Every state built since the last clear.
    states: Vec<DfaState>,
    /// Each state by its (sorted) node set.
    ids: HashMap<Rc<[NodeId]>, StateId>,
    /// Memoised transitions on literal words.
    literal: IntMap<(StateId, WordId), StateId>,
    /// The state of the empty prefix, once built.
    start: Option<StateId>,
    /// Approximate bytes held (the maps' spare capacity aside).
    bytes: usize,
    /// Keys matched since the last clear (or since creation).
    keys_since_clear: usize,
    /// Times the cache was full and cleared.
    clears: usize,
    /// Keys finished by the NFA walk because the cache was full.
    fallbacks: usize,
}

/// One set of trie nodes the walk can be in.
#[derive(Debug)]
struct DfaState {
    /// The nodes, sorted; empty for the dead state (nothing can match).
    nodes: Rc<[NodeId]>,
    /// Some node has literal children: if not, every word leads to `other`
    /// and the key's word is not even looked up.
    literals: bool,
    /// The transition on a word that is no child of these nodes' literals.
    other: Option<StateId>,
    /// The targets of the nodes, each queue once, once a key has ended here.
    targets: Option<Box<[Target]>>,
}

impl Dfa {
    /// Matches `key` against `trie` (the trie this DFA was built for),
    /// appending its targets. Builds the states and transitions it lacks
    /// while the limits allow; otherwise the NFA walk finishes the key.
    fn run(&mut self, trie: &TopicTrie, key: &str, limits: &Limits, out: &mut Vec<Target>) {
        self.keys_since_clear += 1;
        let Some(mut at) = self.start(trie, limits) else {
            self.fallbacks += 1;
            trie.collect_nfa(key, out);
            return;
        };
        let mut words = key.split('.');
        while let Some(word) = words.next() {
            let state = &self.states[at];
            if state.nodes.is_empty() {
                return;
            }
            let word_id = if state.literals {
                trie.word_ids.get(word).copied()
            } else {
                None
            };
            let cached = match word_id {
                Some(w) => self.literal.get(&(at, w)).copied(),
                None => state.other,
            };
            at = match cached {
                Some(next) => next,
                None => match self.build(trie, at, word_id, limits) {
                    Some(next) => next,
                    None => {
                        self.fallbacks += 1;
                        let from = Rc::clone(&self.states[at].nodes);
                        with_scratch(|scratch| {
                            scratch.fit(trie.nodes.len());
                            scratch.current.clear();
                            scratch.current.extend_from_slice(&from);
                            trie.walk(std::iter::once(word).chain(words.by_ref()), scratch, out)
                        });
                        return;
                    }
                },
            };
        }
        self.finish(trie, at, limits, out);
    }

    /// The start state, built if need be; `None` if it does not fit.
    fn start(&mut self, trie: &TopicTrie, limits: &Limits) -> Option<StateId> {
        if let Some(start) = self.start {
            return Some(start);
        }
        let start = with_scratch(|scratch| {
            trie.start_set(scratch);
            let set = &scratch.next[..];
            if !self.fits(1, state_bytes(set.len()), limits) {
                if !self.may_clear(limits) || !Self::fits_empty(1, state_bytes(set.len()), limits) {
                    return None;
                }
                self.clear();
            }
            Some(self.intern(trie, set))
        })?;
        self.start = Some(start);
        Some(start)
    }

    /// The state after `word` (`None`: a word that is no child of the
    /// state's literals) from `from`, built and memoised; `None` when it
    /// does not fit and the cache may not be cleared (or would not hold it
    /// even empty). A clear keeps nothing but the two states of this step.
    fn build(
        &mut self,
        trie: &TopicTrie,
        from: StateId,
        word: Option<WordId>,
        limits: &Limits,
    ) -> Option<StateId> {
        let from_nodes = Rc::clone(&self.states[from].nodes);
        with_scratch(|scratch| {
            trie.step_set(&from_nodes, word, scratch);
            let set = &scratch.next[..];
            let transition = if word.is_some() { TRANSITION_BYTES } else { 0 };
            let mut from = from;
            let (states, bytes) = match self.ids.get(set) {
                Some(_) => (0, transition),
                None => (1, state_bytes(set.len()) + transition),
            };
            if !self.fits(states, bytes, limits) {
                let bytes = state_bytes(from_nodes.len()) + state_bytes(set.len()) + transition;
                if !self.may_clear(limits) || !Self::fits_empty(2, bytes, limits) {
                    return None;
                }
                self.clear();
                from = self.intern(trie, &from_nodes);
            }
            let to = self.intern(trie, set);
            match word {
                Some(w) => {
                    self.literal.insert((from, w), to);
                    self.bytes += TRANSITION_BYTES;
                }
                None => self.states[from].other = Some(to),
            }
            Some(to)
        })
    }

    /// Appends the targets of state `at`, computing and keeping its list the
    /// first time (if it fits).
    fn finish(&mut self, trie: &TopicTrie, at: StateId, limits: &Limits, out: &mut Vec<Target>) {
        let state = &self.states[at];
        if let Some(targets) = &state.targets {
            out.extend(targets.iter().cloned());
            return;
        }
        let start = out.len();
        trie.emit(&state.nodes, out);
        let bytes = (out.len() - start) * size_of::<Target>();
        if self.bytes + bytes <= limits.bytes {
            self.bytes += bytes;
            self.states[at].targets = Some(out[start..].into());
        }
    }

    /// Whether `states` more states and `bytes` more bytes fit.
    fn fits(&self, states: usize, bytes: usize, limits: &Limits) -> bool {
        self.states.len() + states <= limits.states && self.bytes + bytes <= limits.bytes
    }

    /// Whether they would fit in an empty cache.
    fn fits_empty(states: usize, bytes: usize, limits: &Limits) -> bool {
        states <= limits.states && bytes <= limits.bytes
    }

    /// Whether a full cache has served enough keys to be cleared.
    fn may_clear(&self, limits: &Limits) -> bool {
        self.keys_since_clear >= limits.keys_per_clear
    }

    /// Forgets every state (freeing their memory).
    fn clear(&mut self) {
        self.states = Vec::new();
        self.ids = HashMap::new();
        self.literal = IntMap::default();
        self.start = None;
        self.bytes = 0;
        self.keys_since_clear = 0;
        self.clears += 1;
    }

    /// The state of the sorted set `nodes`, added if new (the caller has
    /// checked that it fits).
    fn intern(&mut self, trie: &TopicTrie, nodes: &[NodeId]) -> StateId {
        if let Some(&id) = self.ids.get(nodes) {
            return id;
        }
        let id = self.states.len();
        let nodes: Rc<[NodeId]> = Rc::from(nodes);
        self.states.push(DfaState {
            literals: nodes.iter().any(|&n| !trie.nodes[n].words.is_empty()),
            nodes: Rc::clone(&nodes),
            other: None,
            targets: None,
        });
        self.bytes += state_bytes(nodes.len());
        self.ids.insert(nodes, id);
        id
    }
}

/// One thread's DFAs, one per trie identity it has matched on.
#[derive(Debug)]
struct DfaCache {
    /// By [`Identity::id`].
    dfas: IntMap<u64, CachedDfa>,
    /// Approximate bytes of all of them.
    bytes: usize,
    /// Counts matches, to find the least recently used cache.
    clock: u64,
    /// Dropped tries' caches are swept when there are more caches than this.
    sweep_at: usize,
    /// The limits in force (the default, but for tests).
    limits: Limits,
}

/// A DFA and what the thread knows of its trie.
#[derive(Debug)]
struct CachedDfa {
    /// Dead once no trie with its patterns is left.
    alive: Weak<()>,
    /// [`DfaCache::clock`] at its last match.
    last_used: u64,
    dfa: Dfa,
}

impl DfaCache {
    const fn new() -> DfaCache {
        DfaCache {
            dfas: HashMap::with_hasher(std::hash::BuildHasherDefault::new()),
            bytes: 0,
            clock: 0,
            sweep_at: 16,
            limits: Limits::DEFAULT,
        }
    }

    /// Matches `key` with the DFA of `trie` (of identity `identity`),
    /// creating it if need be, then keeps this thread's caches within limits.
    fn route(&mut self, trie: &TopicTrie, identity: &Identity, key: &str, out: &mut Vec<Target>) {
        self.clock += 1;
        let limits = self.limits;
        let mut created = false;
        let entry = match self.dfas.entry(identity.id) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                created = true;
                entry.insert(CachedDfa {
                    alive: Arc::downgrade(&identity.alive),
                    last_used: 0,
                    dfa: Dfa::default(),
                })
            }
        };
        entry.last_used = self.clock;
        let before = entry.dfa.bytes;
        entry.dfa.run(trie, key, &limits, out);
        self.bytes = self.bytes.saturating_sub(before) + entry.dfa.bytes;
        if created && self.dfas.len() > self.sweep_at {
            self.sweep(identity.id);
        }
        if self.bytes > limits.thread_bytes || self.dfas.len() > limits.thread_caches {
            self.evict(identity.id);
        }
    }

    /// Drops the caches of tries no longer alive (but `keep`'s).
    fn sweep(&mut self, keep: u64) {
        let bytes = &mut self.bytes;
        self.dfas.retain(|&id, cached| {
            let alive = id == keep || cached.alive.strong_count() > 0;
            if !alive {
                *bytes = bytes.saturating_sub(cached.dfa.bytes);
            }
            alive
        });
        self.sweep_at = (2 * self.dfas.len()).max(16);
    }

    /// Drops dead caches, then the least recently used ones (never `keep`'s)
    /// until the thread's caches are within three quarters of their limits,
    /// so that this does not run again at once.
    fn evict(&mut self, keep: u64) {
        self.sweep(keep);
        let limits = self.limits;
        let (bytes, count) = (limits.thread_bytes / 4 * 3, limits.thread_caches / 4 * 3);
        if self.bytes <= bytes && self.dfas.len() <= count {
            return;
        }
        let mut by_age: Vec<(u64, u64)> = self
            .dfas
            .iter()
            .filter(|(&id, _)| id != keep)
            .map(|(&id, cached)| (cached.last_used, id))
            .collect();
        by_age.sort_unstable();
        for (_, id) in by_age {
            if self.bytes <= bytes && self.dfas.len() <= count {
                break;
            }
            if let Some(cached) = self.dfas.remove(&id) {
                self.bytes = self.bytes.saturating_sub(cached.dfa.bytes);
            }
        }
        self.sweep_at = (2 * self.dfas.len()).max(16);
    }
}

thread_local! {
    /// Each shard thread's DFAs, one per exchange it routes on.
    static DFAS: RefCell<DfaCache> = const { RefCell::new(DfaCache::new()) };
}

/// The buffers of a walk, kept per thread so that routing does not allocate.
#[derive(Debug, Default)]
struct Scratch {
    /// Per node: the stamp of the last word it entered the set for.
    seen: Vec<u32>,
    /// The stamp of the last word processed; every stamp in `seen` is at most this.
    stamp: u32,
    /// The nodes matching the words read so far.
    current: Vec<NodeId>,
    /// The set being built for the next word.
    next: Vec<NodeId>,
}

impl Scratch {
    const EMPTY: Scratch = Scratch {
        seen: Vec::new(),
        stamp: 0,
        current: Vec::new(),
        next: Vec::new(),
    };

    /// Grows `seen` to cover a trie of `nodes` nodes.
    fn fit(&mut self, nodes: usize) {
        if self.seen.len() < nodes {
            self.seen.resize(nodes, 0);
        }
    }
}

/// A stamp no node carries yet; when the counter wraps, every node is reset.
#[inline]
fn next_stamp(seen: &mut [u32], stamp: u32) -> u32 {
    match stamp.checked_add(1) {
        Some(s) => s,
        None => {
            seen.fill(0);
            1
        }
    }
}

thread_local! {
    /// Each shard thread's walk buffers; they grow to the largest exchange it routes on.
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::EMPTY) };
}

/// Runs `f` with this thread's scratch buffers (fresh ones if they are in use
/// or the thread is exiting, so this never panics).
fn with_scratch<R>(mut f: impl FnMut(&mut Scratch) -> R) -> R {
    let shared = SCRATCH.try_with(|cell| cell.try_borrow_mut().ok().map(|mut s| f(&mut s)));
    match shared {
        Ok(Some(result)) => result,
        _ => f(&mut Scratch::default()),
    }
}

#[cfg(test)]
pub(super) mod tests;
