//! Topic patterns compiled into a trie that is run as an NFA.
//!
//! Every binding pattern is a path of the trie: a literal word, `*` or `#`
//! per edge, each run of wildcards normalised to its `*`s and at most one `#`
//! (`#.#` and `#.*.#.*` match what `#` and `*.*.#` match; see
//! [`TopicTrie::insert`]). A node is a pattern prefix; a node entered by a
//! `#` edge absorbs any further word (it has an implicit self-loop), and a
//! node with a `#` child also stands in that child (the `#` may match nothing).
//!
//! Matching a key walks its words once, keeping the set of nodes whose prefix
//! matches the words read so far. Each node enters the set at most once per
//! word (a per-thread stamp array says whether it is in already), so a key of
//! `w` words costs at most `w + 1` times the number of nodes, and in practice
//! the few nodes under the key's first words. A backtracking matcher instead
//! tries every way of splitting the key between the `#`s of a pattern, which
//! is exponential in their number.
//!
//! Per key: at most one hash lookup of each word, skipped when no node in the
//! set has a literal child (literal words are interned at bind time, so the
//! per-node lookups are of small integers), no allocation once
//! the thread's scratch buffers have grown to the largest exchange (about 20
//! bytes per node: a stamp and two set slots).

use std::cell::RefCell;
use std::collections::HashMap;

use crate::hashers::IntMap;

use super::Target;

/// A node's index in [`TopicTrie::nodes`].
type NodeId = usize;
/// An interned literal word's index.
type WordId = usize;

/// The binding patterns of one topic exchange.
#[derive(Debug, Clone, Default)]
pub(super) struct TopicTrie {
    /// `nodes[0]` is the root (the empty prefix) once anything is inserted.
    nodes: Vec<TopicNode>,
    /// Every literal word of every pattern, numbered. A key word missing here
    /// can only be matched by `*` and `#`.
    word_ids: HashMap<Box<str>, WordId>,
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

    /// Appends the targets of every pattern matching `key`, each matching
    /// node's once; returns the number of node visits (the matcher's work).
    pub(super) fn collect(&self, key: &str, out: &mut Vec<Target>) -> usize {
        if self.nodes.is_empty() {
            return 0;
        }
        with_scratch(|scratch| self.run(key, scratch, out))
    }

    fn run(&self, key: &str, scratch: &mut Scratch, out: &mut Vec<Target>) -> usize {
        let Scratch {
            seen,
            stamp,
            current,
            next,
        } = scratch;
        if seen.len() < self.nodes.len() {
            seen.resize(self.nodes.len(), 0);
        }
        *stamp = next_stamp(seen, *stamp);
        current.clear();
        self.enter(0, seen, *stamp, current);
        let mut visits = 0;
        for word in key.split('.') {
            if current.is_empty() {
                // No prefix matches any more: neither will a longer one.
                return visits;
            }
            // Looked up once, and only when a node has literal children
            // (`None` until then; `Some(None)`: no pattern has this word).
            let mut word_id: Option<Option<WordId>> = None;
            *stamp = next_stamp(seen, *stamp);
            let now = *stamp;
            next.clear();
            for &id in current.iter() {
                visits += 1;
                let node = &self.nodes[id];
                if node.absorbs {
                    self.enter(id, seen, now, next);
                }
                if !node.words.is_empty() {
                    let word_id = *word_id.get_or_insert_with(|| self.word_ids.get(word).copied());
                    if let Some(&child) = word_id.and_then(|w| node.words.get(&w)) {
                        self.enter(child, seen, now, next);
                    }
                }
                if let Some(child) = node.star {
                    self.enter(child, seen, now, next);
                }
            }
            std::mem::swap(current, next);
        }
        for &id in current.iter() {
            visits += 1;
            out.extend(self.nodes[id].targets.iter().cloned());
        }
        visits
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
}

/// The buffers of a match, kept per thread so that routing does not allocate.
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
    /// Each shard thread's match buffers; they grow to the largest exchange it routes on.
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
pub(super) mod tests {
    use std::sync::Arc;

    use super::*;

    fn t(q: &str) -> Target {
        Target {
            queue: Arc::from(q),
            shard: 0,
        }
    }

    /// The contract, written independently of the trie: whether `pattern`
    /// matches `key`, by dynamic programming over (pattern word, key word).
    pub(crate) fn reference_matches(pattern: &str, key: &str) -> bool {
        let p: Vec<&str> = pattern.split('.').collect();
        let k: Vec<&str> = key.split('.').collect();
        // m[i][j]: p[i..] matches k[j..].
        let mut m = vec![vec![false; k.len() + 1]; p.len() + 1];
        m[p.len()][k.len()] = true;
        for i in (0..p.len()).rev() {
            for j in (0..=k.len()).rev() {
                m[i][j] = match p[i] {
                    "#" => m[i + 1][j] || (j < k.len() && m[i][j + 1]),
                    "*" => j < k.len() && m[i + 1][j + 1],
                    w => j < k.len() && k[j] == w && m[i + 1][j + 1],
                };
            }
        }
        m[0][0]
    }

    /// A trie of `patterns`, pattern `i` bound to queue `p<i>`.
    fn trie(patterns: &[String]) -> TopicTrie {
        let mut trie = TopicTrie::default();
        for (i, p) in patterns.iter().enumerate() {
            trie.insert(p, t(&format!("p{i}")));
        }
        trie
    }

    /// Indices of the patterns the trie matches, sorted, each once.
    fn matched(trie: &TopicTrie, key: &str) -> Vec<usize> {
        let mut out = Vec::new();
        trie.collect(key, &mut out);
        let mut got: Vec<usize> = out
            .iter()
            .map(|t| t.queue[1..].parse().expect("queue p<i>"))
            .collect();
        got.sort_unstable();
        let before = got.len();
        got.dedup();
        assert_eq!(before, got.len(), "a pattern matched twice for {key:?}");
        got
    }

    fn expected(patterns: &[String], key: &str) -> Vec<usize> {
        (0..patterns.len())
            .filter(|&i| reference_matches(&patterns[i], key))
            .collect()
    }

    /// Every sequence of 1..=`max_len` words from `alphabet`, dot-joined.
    pub(crate) fn all_keys(alphabet: &[&str], max_len: usize) -> Vec<String> {
        let mut level: Vec<Vec<&str>> = vec![Vec::new()];
        let mut all = Vec::new();
        for _ in 0..max_len {
            let mut longer = Vec::new();
            for prefix in &level {
                for w in alphabet {
                    let mut p = prefix.clone();
                    p.push(*w);
                    all.push(p.join("."));
                    longer.push(p);
                }
            }
            level = longer;
        }
        all
    }

    #[test]
    fn reference_matcher_agrees_with_the_protocol_examples() {
        for (p, k, want) in [
            ("a.*.c", "a.b.c", true),
            ("a.#", "a", true),
            ("#", "a.b", true),
            ("a.#.c", "a.c", true),
            ("a.#.c", "a.x.y.c", true),
            ("*.b.#", "z.b", true),
            ("a.*", "a.b.c", false),
            ("*", "a.b", false),
            ("#.#", "a", true),
            ("*.#", "", true),
            ("a..b", "a..b", true),
            ("a.*.b", "a..b", true),
            ("#.*", "a", true),
        ] {
            assert_eq!(reference_matches(p, k), want, "{p} vs {k:?}");
        }
    }

    /// Every pattern of up to 4 words over {a, b, empty, *, #} (`#` at the
    /// start, middle and end, `#.#`, `*.#`, `#.*`, empty words) against every
    /// key of up to 5 words over {a, b, empty}, all bound on one trie.
    #[test]
    fn matches_like_the_reference_exhaustively_on_small_patterns() {
        let patterns = all_keys(&["a", "b", "", "*", "#"], 4);
        let keys = all_keys(&["a", "b", ""], 5);
        let trie = trie(&patterns);
        for key in &keys {
            assert_eq!(matched(&trie, key), expected(&patterns, key), "key {key:?}");
        }
    }

    /// xorshift64*: deterministic and dependency-free.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }

        fn words(&mut self, alphabet: &[&str], max_len: usize) -> String {
            let len = 1 + self.below(max_len);
            let words: Vec<&str> = (0..len)
                .map(|_| alphabet[self.below(alphabet.len())])
                .collect();
            words.join(".")
        }
    }

    /// Longer random patterns, heavy in `#` and `*`, over many tries of
    /// various sizes, against longer random keys.
    #[test]
    fn matches_like_the_reference_on_random_patterns() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let pattern_words = ["a", "b", "c", "", "*", "#", "#", "#"];
        let key_words = ["a", "b", "c", "", "d"];
        for round in 0..200 {
            let n = 1 + rng.below(40);
            let patterns: Vec<String> = (0..n).map(|_| rng.words(&pattern_words, 12)).collect();
            let trie = trie(&patterns);
            for _ in 0..50 {
                let key = rng.words(&key_words, 16);
                assert_eq!(
                    matched(&trie, &key),
                    expected(&patterns, &key),
                    "round {round}, key {key:?}, patterns {patterns:?}"
                );
            }
        }
    }

    /// The same binding pattern twice, or `#.#` next to `#`, shares a node:
    /// both targets come out, each once; so do wildcard runs with the same
    /// stars and some `#`, in any order.
    #[test]
    fn normalised_runs_share_a_node() {
        let patterns: Vec<String> = ["a.#", "a.#.#", "a.#.#.#", "a.#"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let hashes = trie(&patterns);
        assert_eq!(hashes.node_count(), 3, "root, a, a.#");
        assert_eq!(matched(&hashes, "a.x.y"), [0, 1, 2, 3]);
        assert_eq!(matched(&hashes, "a"), [0, 1, 2, 3]);
        assert!(matched(&hashes, "b").is_empty());

        let patterns: Vec<String> = ["a.*.*.#.b", "a.#.*.#.*.b", "a.*.#.*.b", "a.#.*.*.b"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let runs = trie(&patterns);
        assert_eq!(runs.node_count(), 6, "root, a, a.*, a.*.*, a.*.*.#, …b");
        assert_eq!(matched(&runs, "a.x.y.b"), [0, 1, 2, 3]);
        assert_eq!(matched(&runs, "a.x.y.z.b"), [0, 1, 2, 3]);
        assert!(matched(&runs, "a.x.b").is_empty());
    }

    /// The visits of one match are bounded by (words + 1) × nodes, so they
    /// grow linearly with the key, where a backtracking matcher's grow like
    /// the binomial (words + `#`s choose `#`s): this is the test that fails
    /// on an exponential matcher without relying on time.
    #[test]
    fn work_is_linear_in_the_key_for_hostile_patterns() {
        let bombs = [
            // The reported bomb: 14 `#` in a row (one `#` once collapsed).
            format!("receiver_1{}", ".#".repeat(14)),
            // `#` kept apart by words the key repeats: not collapsible.
            format!("receiver_1{}.#", ".#.x".repeat(7)),
            format!("receiver_1{}.#", ".#.*".repeat(7)),
            format!("receiver_1.*{}", ".#.*".repeat(7)),
            format!("#{}", ".x.#".repeat(7)),
        ];
        for bomb in &bombs {
            let trie = trie(std::slice::from_ref(bomb));
            // One node per word of the pattern at most, wildcard runs normalised.
            assert!(trie.node_count() <= bomb.split('.').count() + 1);
            for words in [15, 31, 63, 127] {
                let key = format!("receiver_1{}", ".x".repeat(words - 1));
                let mut out = Vec::new();
                let visits = trie.collect(&key, &mut out);
                let bound = (words + 1) * trie.node_count();
                assert!(
                    visits <= bound,
                    "{bomb} vs {words} words: {visits} visits > {bound}"
                );
                assert!(
                    out.len() <= 1,
                    "one binding comes out once, got {}",
                    out.len()
                );
                assert_eq!(
                    out.len() == 1,
                    reference_matches(bomb, &key),
                    "{bomb} vs {key}"
                );
            }
        }
    }

    /// Many hostile patterns on one trie: the set a match keeps is bounded by
    /// the nodes, and a key under no pattern's first word stops at once.
    #[test]
    fn many_hostile_patterns_stay_bounded_and_misses_stop_early() {
        let mut patterns = Vec::new();
        for tenant in 0..100 {
            patterns.push(format!("t{tenant}{}", ".#.x".repeat(8)));
            patterns.push(format!("t{tenant}.*.#.*"));
            patterns.push(format!("t{tenant}{}", ".#".repeat(20)));
        }
        let trie = trie(&patterns);
        let key = format!("t7{}", ".x".repeat(31));
        let mut out = Vec::new();
        let visits = trie.collect(&key, &mut out);
        assert!(visits <= 33 * trie.node_count());
        // Only t7's patterns are alive: at most its ~20 nodes per word.
        assert!(visits <= 33 * 20, "{visits} visits");
        assert_eq!(out.len(), 3);
        let mut out = Vec::new();
        assert_eq!(trie.collect("nobody.x.x.x.x", &mut out), 1, "root only");
        assert!(out.is_empty());
    }

    #[test]
    fn stamps_survive_wrapping() {
        let patterns = vec!["a.#.b".to_owned(), "a.*".to_owned()];
        let trie = trie(&patterns);
        let mut scratch = Scratch {
            stamp: u32::MAX - 3,
            ..Scratch::default()
        };
        for _ in 0..8 {
            let mut out = Vec::new();
            trie.run("a.b.b", &mut scratch, &mut out);
            assert_eq!(out.len(), 1, "a.#.b only");
        }
        assert!(scratch.stamp < 100, "wrapped: {}", scratch.stamp);
    }

    #[test]
    fn nested_use_of_the_scratch_gets_fresh_buffers() {
        let patterns = vec!["a.#".to_owned()];
        let trie = trie(&patterns);
        let inner = with_scratch(|_| {
            let mut out = Vec::new();
            trie.collect("a.b", &mut out);
            out.len()
        });
        assert_eq!(inner, 1);
    }
}
