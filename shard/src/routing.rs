//! Matching a routing key against an exchange's bindings.
//!
//! Direct: a hash lookup. Fanout: every bound queue (kept deduplicated at
//! bind time, so routing is linear in the queues). Topic: a trie of
//! dot-separated words where `*` matches exactly one word and `#` zero or
//! more, matched by a DFA built lazily over it (see [`topic`]): a key whose
//! transitions are cached costs a lookup or two per word and the copy of one
//! precomputed target list; one that is not is matched by walking the trie as
//! an NFA, reading each word once and touching at most the trie's nodes per
//! word, never backtracking, so hostile patterns like `r.#.#.#…` or
//! `r.#.x.#.x…` cost at most their length per word, and the caches are capped
//! in memory. A queue matched by several patterns is kept once, in the order
//! of its first match (the trie's order: unspecified, but fixed for a given
//! set of bindings).

mod topic;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;

use crate::placement::ShardId;
use topic::TopicTrie;

/// A queue a message is routed to, with the shard that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Queue name.
    pub queue: Arc<str>,
    /// Owning shard.
    pub shard: ShardId,
    /// The receiver that owns the queue, when one does: the queue takes
    /// only envelopes naming that receiver, whatever binding led there
    /// (confinement: no sequence of topology commands can make a receiver's
    /// queue collect another receiver's messages). `None`: an admin's
    /// queue, which takes what its bindings route.
    pub confined_to: Option<Arc<str>>,
}

impl Target {
    /// Whether this queue may store an envelope naming `receiver`.
    #[inline]
    pub fn admits(&self, receiver: &str) -> bool {
        self.confined_to
            .as_deref()
            .is_none_or(|owner| owner == receiver)
    }
}

/// An exchange and its bindings, indexed for its kind.
#[derive(Debug, Clone)]
pub struct Exchange {
    kind: ExchangeKind,
    /// Every (binding key, target) in binding order, for status and rebuilds.
    bindings: Vec<(Box<str>, Target)>,
    /// The targets of each binding key, whatever the kind: the duplicate
    /// check of [`Exchange::bind`] (a lookup, not a scan of every binding,
    /// so binding n keys costs O(n) and not O(n²)), and a direct exchange's
    /// routing index.
    by_key: HashMap<Box<str>, Vec<Target>>,
    /// Fanout: each bound queue once, in the order of its first binding.
    fanout: Vec<Target>,
    /// Fanout: the queues in `fanout`, so that a queue bound under a second
    /// key is found without scanning the list.
    fanout_queues: HashSet<Arc<str>>,
    /// Topic: the binding keys as a trie.
    topic: TopicTrie,
}

impl Exchange {
    /// An exchange with no bindings.
    pub fn new(kind: ExchangeKind) -> Exchange {
        Exchange {
            kind,
            bindings: Vec::new(),
            by_key: HashMap::new(),
            fanout: Vec::new(),
            fanout_queues: HashSet::new(),
            topic: TopicTrie::default(),
        }
    }

    /// Its type.
    pub fn kind(&self) -> ExchangeKind {
        self.kind
    }

    /// Its bindings as (key, queue).
    pub fn bindings(&self) -> impl Iterator<Item = (&str, &Target)> {
        self.bindings.iter().map(|(k, t)| (&**k, t))
    }

    /// Adds a binding; returns false when it already existed (bind is idempotent).
    ///
    /// Costs a hash lookup plus a scan of the queues already bound under
    /// this very key, never of the exchange's other bindings.
    pub fn bind(&mut self, key: &str, target: Target) -> bool {
        let same_key = match self.by_key.get_mut(key) {
            Some(same_key) => same_key,
            None => self.by_key.entry(key.into()).or_default(),
        };
        if same_key.iter().any(|t| t.queue == target.queue) {
            return false;
        }
        same_key.push(target.clone());
        self.bindings.push((key.into(), target.clone()));
        match self.kind {
            ExchangeKind::Direct => {}
            ExchangeKind::Fanout => {
                if self.fanout_queues.insert(target.queue.clone()) {
                    self.fanout.push(target);
                }
            }
            ExchangeKind::Topic => self.topic.insert(key, target),
        }
        true
    }

    /// Appends the queues `key` routes to; each queue at most once.
    pub fn route(&self, key: &str, out: &mut Vec<Target>) {
        match self.kind {
            ExchangeKind::Direct => {
                // A direct key binds each queue at most once (`bind` refuses repeats).
                if let Some(targets) = self.by_key.get(key) {
                    out.extend(targets.iter().cloned());
                }
            }
            ExchangeKind::Fanout => out.extend(self.fanout.iter().cloned()),
            // Each queue once, even if several patterns match it.
            ExchangeKind::Topic => self.topic.collect(key, out),
        }
    }

    /// The work of matching `key` against this topic exchange's bindings
    /// when none of its DFA transitions is cached, in trie node visits of the
    /// NFA walk (0 for other kinds): what building the key's DFA states costs,
    /// and what a key costs once the cache is full. It is at most
    /// (words of `key` + 1) × the trie's nodes whatever the patterns; tests
    /// and benches use it to find hostile keys and to check that bound
    /// without timing anything.
    pub fn topic_match_cost(&self, key: &str) -> usize {
        match self.kind {
            ExchangeKind::Topic => self.topic.collect_nfa(key, &mut Vec::new()),
            ExchangeKind::Direct | ExchangeKind::Fanout => 0,
        }
    }
}

/// Matches up to this many are deduplicated pairwise; more are sorted.
const PAIRWISE_DEDUP_MAX: usize = 16;

/// Removes from `out[start..]` every target whose queue appeared earlier in
/// that range, keeping the first occurrences in order. Pairwise for the usual
/// handful of matches, O(n log n) beyond.
fn dedup_queues(out: &mut Vec<Target>, start: usize) {
    let found = out.len() - start;
    if found < 2 {
        return;
    }
    let mut keep = vec![true; found];
    if found <= PAIRWISE_DEDUP_MAX {
        let matched = &out[start..];
        for i in 1..found {
            keep[i] = !matched[..i].iter().any(|o| o.queue == matched[i].queue);
        }
    } else {
        // Stable by name, so within a run of one queue the first match leads.
        let matched = &out[start..];
        let mut order: Vec<usize> = (0..found).collect();
        order.sort_by(|&a, &b| matched[a].queue.cmp(&matched[b].queue));
        for pair in order.windows(2) {
            if matched[pair[0]].queue == matched[pair[1]].queue {
                keep[pair[1]] = false;
            }
        }
    }
    let mut kept = start;
    for (i, keep) in keep.into_iter().enumerate() {
        if keep {
            out.swap(kept, start + i);
            kept += 1;
        }
    }
    out.truncate(kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(q: &str) -> Target {
        Target {
            queue: Arc::from(q),
            shard: 0,
            confined_to: None,
        }
    }

    fn routed(ex: &Exchange, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        ex.route(key, &mut out);
        let mut names: Vec<String> = out.iter().map(|t| t.queue.to_string()).collect();
        names.sort();
        names
    }

    #[test]
    fn direct_matches_exact_keys() {
        let mut ex = Exchange::new(ExchangeKind::Direct);
        ex.bind("a", t("q1"));
        ex.bind("a", t("q2"));
        ex.bind("b", t("q3"));
        assert!(!ex.bind("a", t("q1")));
        assert_eq!(routed(&ex, "a"), ["q1", "q2"]);
        assert_eq!(routed(&ex, "b"), ["q3"]);
        assert!(routed(&ex, "c").is_empty());
    }

    #[test]
    fn fanout_ignores_keys_and_delivers_once_per_queue() {
        let mut ex = Exchange::new(ExchangeKind::Fanout);
        ex.bind("x", t("q1"));
        ex.bind("y", t("q1"));
        ex.bind("z", t("q2"));
        assert_eq!(routed(&ex, "anything"), ["q1", "q2"]);
    }

    #[test]
    fn topic_wildcards() {
        let mut ex = Exchange::new(ExchangeKind::Topic);
        ex.bind("a.*.c", t("star"));
        ex.bind("a.#", t("hash"));
        ex.bind("#", t("all"));
        ex.bind("a.b.c", t("exact"));
        ex.bind("*.b.#", t("mixed"));
        ex.bind("a.#.c", t("inner"));
        assert_eq!(
            routed(&ex, "a.b.c"),
            ["all", "exact", "hash", "inner", "mixed", "star"]
        );
        assert_eq!(routed(&ex, "a"), ["all", "hash"]);
        assert_eq!(routed(&ex, "a.x.y.c"), ["all", "hash", "inner"]);
        assert_eq!(routed(&ex, "z.b"), ["all", "mixed"]);
        assert_eq!(routed(&ex, "a.c"), ["all", "hash", "inner"]);
        assert_eq!(routed(&ex, "b"), ["all"]);
    }

    /// Exact and wildcard patterns together, several per queue, through
    /// `route` (exact map, trie and dedup): the queues are those of the
    /// patterns the reference matcher says match, each once.
    #[test]
    fn topic_route_matches_the_reference_with_shared_queues() {
        use topic::tests::{all_keys, reference_matches};

        let patterns = all_keys(&["a", "b", "", "*", "#"], 4);
        let mut ex = Exchange::new(ExchangeKind::Topic);
        // Pattern i goes to queue q<i % 7>: queues are matched several times.
        for (i, p) in patterns.iter().enumerate() {
            assert!(ex.bind(p, t(&format!("q{}", i % 7))));
        }
        for key in all_keys(&["a", "b", "", "c"], 5) {
            let mut want: Vec<String> = (0..patterns.len())
                .filter(|&i| reference_matches(&patterns[i], &key))
                .map(|i| format!("q{}", i % 7))
                .collect();
            want.sort();
            want.dedup();
            assert_eq!(routed(&ex, &key), want, "key {key:?}");
            let mut out = Vec::new();
            ex.route(&key, &mut out);
            assert_eq!(out.len(), want.len(), "each queue once for {key:?}");
        }
    }

    #[test]
    fn topic_match_cost_is_zero_off_topic_and_bounded_on_it() {
        let mut ex = Exchange::new(ExchangeKind::Direct);
        ex.bind("a.#", t("q"));
        assert_eq!(ex.topic_match_cost("a.b"), 0);
        let mut ex = Exchange::new(ExchangeKind::Topic);
        ex.bind(&format!("r{}", ".#.x".repeat(8)), t("q"));
        ex.bind("r.exact", t("q"));
        let key = format!("r{}", ".x".repeat(31));
        // 18 trie nodes (root, r, 8 × (#, x)), 32 words.
        assert!(ex.topic_match_cost(&key) <= 33 * 18);
        assert_eq!(routed(&ex, &key), ["q"]);
    }

    #[test]
    fn topic_dedups_a_queue_matched_twice() {
        let mut ex = Exchange::new(ExchangeKind::Topic);
        ex.bind("a.*", t("q"));
        ex.bind("a.#", t("q"));
        assert_eq!(routed(&ex, "a.b"), ["q"]);
    }

    #[test]
    fn route_appends_after_what_out_already_holds() {
        let mut ex = Exchange::new(ExchangeKind::Topic);
        ex.bind("a.*", t("q"));
        ex.bind("a.#", t("q"));
        let mut out = vec![t("q")];
        ex.route("a.b", &mut out);
        assert_eq!(
            out,
            [t("q"), t("q")],
            "dedup covers this route's matches only"
        );
    }

    /// Many patterns over few queues: first matches kept, in match order,
    /// on both sides of the pairwise/sorted threshold.
    #[test]
    fn dedup_keeps_first_matches_in_order() {
        for queues in [3, 40] {
            let mut out = vec![t("before")];
            for round in 0..3 {
                for q in (0..queues).rev() {
                    out.push(Target {
                        queue: Arc::from(format!("q{q}")),
                        shard: round,
                        confined_to: None,
                    });
                }
            }
            dedup_queues(&mut out, 1);
            let names: Vec<String> = out.iter().map(|t| t.queue.to_string()).collect();
            let mut expected = vec!["before".to_owned()];
            expected.extend((0..queues).rev().map(|q| format!("q{q}")));
            assert_eq!(names, expected, "{queues} queues");
            assert!(out[1..].iter().all(|t| t.shard == 0), "first round kept");
        }
    }

    #[test]
    fn fanout_keeps_bind_order_with_many_queues() {
        let mut ex = Exchange::new(ExchangeKind::Fanout);
        for round in ["a", "b"] {
            for q in 0..50 {
                ex.bind(round, t(&format!("q{q}")));
            }
        }
        let mut out = Vec::new();
        ex.route("any", &mut out);
        let names: Vec<String> = out.iter().map(|t| t.queue.to_string()).collect();
        let expected: Vec<String> = (0..50).map(|q| format!("q{q}")).collect();
        assert_eq!(names, expected);
        assert_eq!(ex.bindings().count(), 100);
    }

    /// 60,000 bindings of every kind to one exchange, each bound twice: the
    /// duplicate check is a lookup by key, so this is linear. It used to
    /// scan every earlier binding, about 1.8 × 10⁹ comparisons per kind (a
    /// unit test that did not finish), and so did rebuilding an exchange
    /// after a reload removed some of its bindings.
    #[test]
    fn binding_many_keys_to_one_exchange_is_linear() {
        const N: usize = 60_000;
        for kind in [
            ExchangeKind::Direct,
            ExchangeKind::Fanout,
            ExchangeKind::Topic,
        ] {
            let mut ex = Exchange::new(kind);
            for i in 0..N {
                assert!(ex.bind(&format!("r{}.k{i}", i % 7), t(&format!("q{}", i % 100))));
            }
            for i in (0..N).step_by(997) {
                assert!(!ex.bind(&format!("r{}.k{i}", i % 7), t(&format!("q{}", i % 100))));
            }
            assert_eq!(ex.bindings().count(), N, "{kind:?}");
            let expected = match kind {
                ExchangeKind::Fanout => 100,
                ExchangeKind::Direct | ExchangeKind::Topic => 1,
            };
            assert_eq!(routed(&ex, "r2.k59999").len(), expected, "{kind:?}");
        }
    }
}
