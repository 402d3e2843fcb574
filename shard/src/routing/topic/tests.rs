use std::sync::Arc;

use super::*;

fn t(q: &str) -> Target {
    Target {
        queue: Arc::from(q),
        shard: 0,
        confined_to: None,
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

/// What this thread's DFA for a trie holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DfaStats {
    pub(crate) states: usize,
    pub(crate) transitions: usize,
    pub(crate) bytes: usize,
    pub(crate) clears: usize,
    pub(crate) fallbacks: usize,
}

/// This thread's DFA for `trie`, if it has one.
pub(crate) fn dfa_stats(trie: &TopicTrie) -> Option<DfaStats> {
    let id = trie.identity.as_ref()?.id;
    DFAS.with_borrow(|cache| {
        cache.dfas.get(&id).map(|cached| DfaStats {
            states: cached.dfa.states.len(),
            transitions: cached.dfa.literal.len()
                + cached
                    .dfa
                    .states
                    .iter()
                    .filter(|s| s.other.is_some())
                    .count(),
            bytes: cached.dfa.bytes,
            clears: cached.dfa.clears,
            fallbacks: cached.dfa.fallbacks,
        })
    })
}

/// (caches, bytes) of this thread; checks the byte count against its parts.
fn thread_stats() -> (usize, usize) {
    DFAS.with_borrow(|cache| {
        let sum: usize = cache.dfas.values().map(|c| c.dfa.bytes).sum();
        assert_eq!(sum, cache.bytes, "thread byte count");
        (cache.dfas.len(), cache.bytes)
    })
}

/// Empties this thread's caches and sets its limits (tests run on
/// threads of their own).
fn set_limits(limits: Limits) {
    DFAS.with_borrow_mut(|cache| {
        *cache = DfaCache::new();
        cache.limits = limits;
    });
}

/// A trie of `patterns`, pattern `i` bound to queue `p<i>`.
fn trie(patterns: &[String]) -> TopicTrie {
    let mut trie = TopicTrie::default();
    for (i, p) in patterns.iter().enumerate() {
        trie.insert(p, t(&format!("p{i}")));
    }
    trie
}

/// The queues the DFA routes `key` to, in order, after checking that the
/// NFA walk gives exactly the same sequence.
fn routed(trie: &TopicTrie, key: &str) -> Vec<Arc<str>> {
    let mut dfa = Vec::new();
    trie.collect(key, &mut dfa);
    let mut nfa = Vec::new();
    trie.collect_nfa(key, &mut nfa);
    assert_eq!(dfa, nfa, "DFA and NFA differ on {key:?}");
    dfa.into_iter().map(|t| t.queue).collect()
}

/// Indices of the patterns the trie matches (DFA and NFA alike), sorted,
/// each once.
fn matched(trie: &TopicTrie, key: &str) -> Vec<usize> {
    let mut got: Vec<usize> = routed(trie, key)
        .iter()
        .map(|q| q[1..].parse().expect("queue p<i>"))
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
/// key of up to 5 words over {a, b, empty}, all bound on one trie; each
/// key twice, the second time from the cache.
#[test]
fn matches_like_the_reference_exhaustively_on_small_patterns() {
    let patterns = all_keys(&["a", "b", "", "*", "#"], 4);
    let keys = all_keys(&["a", "b", ""], 5);
    let trie = trie(&patterns);
    for _ in 0..2 {
        for key in &keys {
            assert_eq!(matched(&trie, key), expected(&patterns, key), "key {key:?}");
        }
    }
    // 780 patterns: sets of hundreds of nodes, so the cache fills up and
    // the walk finishes some keys.
    let stats = dfa_stats(&trie).expect("a DFA");
    assert!(stats.bytes <= Limits::DEFAULT.bytes, "{stats:?}");
}

/// xorshift64*: deterministic and dependency-free.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    pub(crate) fn words(&mut self, alphabet: &[&str], max_len: usize) -> String {
        let len = 1 + self.below(max_len);
        let words: Vec<&str> = (0..len)
            .map(|_| alphabet[self.below(alphabet.len())])
            .collect();
        words.join(".")
    }
}

/// Longer random patterns, heavy in `#` and `*`, over many tries of
/// various sizes, against longer random keys (some repeated, so that
/// both cached and fresh transitions are taken).
#[test]
fn matches_like_the_reference_on_random_patterns() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pattern_words = ["a", "b", "c", "", "*", "#", "#", "#"];
    let key_words = ["a", "b", "c", "", "d"];
    for round in 0..200 {
        let n = 1 + rng.below(40);
        let patterns: Vec<String> = (0..n).map(|_| rng.words(&pattern_words, 12)).collect();
        let trie = trie(&patterns);
        let keys: Vec<String> = (0..30).map(|_| rng.words(&key_words, 16)).collect();
        for _ in 0..60 {
            let key = &keys[rng.below(keys.len())];
            assert_eq!(
                matched(&trie, key),
                expected(&patterns, key),
                "round {round}, key {key:?}, patterns {patterns:?}"
            );
        }
    }
}

/// The same, with caches so small that they overflow all the time:
/// cleared when they have served a few keys, the walk finishing keys
/// otherwise, and the thread's caches evicted. Results never change, and
/// nothing outgrows its limit.
#[test]
fn matches_like_the_nfa_when_caches_overflow() {
    let limits = Limits {
        states: 6,
        bytes: 2048,
        keys_per_clear: 3,
        thread_bytes: 6000,
        thread_caches: 4,
    };
    set_limits(limits);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let pattern_words = ["a", "b", "c", "", "*", "#", "#", "#"];
    let key_words = ["a", "b", "c", "", "d"];
    let (mut clears, mut fallbacks) = (0, 0);
    let mut tries = Vec::new();
    for _ in 0..12 {
        let n = 1 + rng.below(40);
        let patterns: Vec<String> = (0..n).map(|_| rng.words(&pattern_words, 12)).collect();
        tries.push((trie(&patterns), patterns));
    }
    for round in 0..3000 {
        // Several exchanges in turn, more than the thread keeps.
        let (trie, patterns) = &tries[rng.below(tries.len())];
        let key = rng.words(&key_words, 16);
        assert_eq!(
            matched(trie, &key),
            expected(patterns, &key),
            "round {round}, key {key:?}"
        );
        let stats = dfa_stats(trie).expect("the DFA just used");
        assert!(stats.states <= limits.states, "{stats:?}");
        assert!(stats.bytes <= limits.bytes, "{stats:?}");
        let (caches, bytes) = thread_stats();
        assert!(caches <= limits.thread_caches, "{caches} caches");
        assert!(bytes <= limits.thread_bytes + limits.bytes, "{bytes} bytes");
        if round % 100 == 99 {
            for (trie, _) in &tries {
                if let Some(s) = dfa_stats(trie) {
                    clears += s.clears;
                    fallbacks += s.fallbacks;
                }
            }
        }
    }
    assert!(
        clears > 0 && fallbacks > 0,
        "{clears} clears, {fallbacks} fallbacks"
    );
    set_limits(Limits::DEFAULT);
}

/// `#.a` then `*`×14 has a DFA state for every pattern of `a` among the
/// last 15 words (2^15): random keys fill the cache, which stays within
/// its limits, is cleared now and then, and still matches exactly.
#[test]
fn exponential_patterns_stay_within_the_limits() {
    let limits = Limits::DEFAULT;
    set_limits(limits);
    let patterns = vec![
        format!("#.a{}", ".*".repeat(14)),
        format!("#.b{}", ".*".repeat(13)),
        "#.a.b.#".to_owned(),
    ];
    let trie = trie(&patterns);
    let mut rng = Rng(42);
    for i in 0..20_000 {
        let key = (0..32)
            .map(|_| if rng.below(2) == 0 { "a" } else { "b" })
            .collect::<Vec<_>>()
            .join(".");
        if i % 16 == 0 {
            assert_eq!(matched(&trie, &key), expected(&patterns, &key), "{key}");
        } else {
            trie.collect(&key, &mut Vec::new());
        }
        let stats = dfa_stats(&trie).expect("a DFA");
        assert!(stats.states <= limits.states && stats.bytes <= limits.bytes);
    }
    let stats = dfa_stats(&trie).expect("a DFA");
    assert!(stats.clears > 0, "{stats:?}");
    assert!(stats.fallbacks > 0, "{stats:?}");
}

/// A key whose transitions are all cached changes nothing in the cache:
/// no state, transition or target list is built (nor allocated).
#[test]
fn a_cached_key_builds_nothing() {
    set_limits(Limits::DEFAULT);
    let patterns: Vec<String> = ["a.#", "a.*.c", "#.c", "a.b.c", "x.#.y"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let trie = trie(&patterns);
    assert_eq!(dfa_stats(&trie), None, "built on first use");
    for key in ["a.b.c", "a.zzz.c", "q.r.s", "x.1.2.y"] {
        let first = matched(&trie, key);
        let warm = dfa_stats(&trie).expect("a DFA");
        assert_eq!(matched(&trie, key), first);
        assert_eq!(dfa_stats(&trie), Some(warm), "{key}");
    }
    // Words no pattern has share one transition per state.
    matched(&trie, "q.r.s");
    let warm = dfa_stats(&trie);
    assert!(matched(&trie, "qq.rr.ss").is_empty());
    assert_eq!(dfa_stats(&trie), warm);
}

/// Inserting gives the trie a new identity: its next match builds a new
/// DFA that sees the new pattern, while a clone taken before (an older
/// topology snapshot) keeps its own; a dropped trie's cache is swept.
#[test]
fn inserting_invalidates_the_cache() {
    set_limits(Limits::DEFAULT);
    let mut trie = TopicTrie::default();
    trie.insert("a.*", t("star"));
    assert_eq!(routed(&trie, "a.b"), [Arc::from("star")]);
    assert!(routed(&trie, "a.b.c").is_empty());
    let before = trie.clone();
    trie.insert("a.#", t("hash"));
    trie.insert("a.*", t("star2"));
    assert_eq!(
        routed(&trie, "a.b"),
        [Arc::from("star"), Arc::from("star2"), Arc::from("hash")]
    );
    assert_eq!(routed(&trie, "a.b.c"), [Arc::from("hash")]);
    assert_eq!(routed(&before, "a.b"), [Arc::from("star")]);
    assert!(routed(&before, "a.b.c").is_empty());
    assert_eq!(thread_stats().0, 2);
    drop(before);
    // Enough new tries to trigger a sweep: the dropped ones go.
    let mut keep = Vec::new();
    for i in 0..40 {
        let mut other = TopicTrie::default();
        other.insert(&format!("t{i}.#"), t("q"));
        assert_eq!(routed(&other, &format!("t{i}.x")).len(), 1);
        if i % 2 == 0 {
            keep.push(other);
        }
    }
    let (caches, _) = thread_stats();
    assert!(caches <= 2 * (keep.len() + 1), "{caches} caches");
    assert!(dfa_stats(&trie).is_some());
}

/// Random binds between matches: after each, the results are those of
/// the reference on the patterns bound so far.
#[test]
fn random_binds_between_matches_agree_with_the_reference() {
    set_limits(Limits::DEFAULT);
    let mut rng = Rng(7);
    let pattern_words = ["a", "b", "*", "#"];
    let key_words = ["a", "b", "c"];
    let mut patterns = Vec::new();
    let mut trie = TopicTrie::default();
    for _ in 0..60 {
        let p = rng.words(&pattern_words, 6);
        trie.insert(&p, t(&format!("p{}", patterns.len())));
        patterns.push(p);
        for _ in 0..20 {
            let key = rng.words(&key_words, 8);
            assert_eq!(matched(&trie, &key), expected(&patterns, &key), "{key}");
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

/// The visits of one walk are bounded by (words + 1) × nodes, so they
/// grow linearly with the key, where a backtracking matcher's grow like
/// the binomial (words + `#`s choose `#`s): this is the test that fails
/// on an exponential matcher without relying on time. The DFA builds at
/// most one state per word from those walks.
#[test]
fn work_is_linear_in_the_key_for_hostile_patterns() {
    set_limits(Limits::DEFAULT);
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
            let visits = trie.collect_nfa(&key, &mut out);
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
            assert_eq!(routed(&trie, &key).len(), out.len());
            let stats = dfa_stats(&trie).expect("a DFA");
            assert!(stats.states <= 128 + 1, "{bomb}: {stats:?}");
        }
    }
}

/// Many hostile patterns on one trie: the set a walk keeps is bounded by
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
    let visits = trie.collect_nfa(&key, &mut out);
    assert!(visits <= 33 * trie.node_count());
    // Only t7's patterns are alive: at most its ~20 nodes per word.
    assert!(visits <= 33 * 20, "{visits} visits");
    assert_eq!(out.len(), 3);
    assert_eq!(routed(&trie, &key).len(), 3);
    let mut out = Vec::new();
    assert_eq!(trie.collect_nfa("nobody.x.x.x.x", &mut out), 1, "root only");
    assert!(out.is_empty());
    assert!(routed(&trie, "nobody.x.x.x.x").is_empty());
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
        trie.walk_key("a.b.b", &mut scratch, &mut out);
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
        trie.collect_nfa("a.b", &mut out);
        out.len()
    });
    assert_eq!(inner, 2);
}

/// Matching while this thread's caches are in use falls back to the walk.
#[test]
fn nested_use_of_the_caches_falls_back_to_the_walk() {
    let patterns = vec!["a.#".to_owned(), "#.b".to_owned()];
    let trie = trie(&patterns);
    let inner = DFAS.with_borrow_mut(|_| {
        let mut out = Vec::new();
        trie.collect("a.b", &mut out);
        out.len()
    });
    assert_eq!(inner, 2);
    assert_eq!(dfa_stats(&trie), None, "nothing cached");
}
