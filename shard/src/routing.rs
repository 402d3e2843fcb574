//! Matching a routing key against an exchange's bindings.
//!
//! Direct: a hash lookup. Fanout: every bound queue (kept deduplicated at
//! bind time). Topic: a trie of dot-separated words where `*` matches exactly
//! one word and `#` zero or more, so matching costs the key's length, not the
//! number of bindings; a queue matched by several patterns is kept once, in
//! the order of its first match.

use std::collections::HashMap;
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;

use crate::placement::ShardId;

/// A queue a message is routed to, with the shard that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Queue name.
    pub queue: Arc<str>,
    /// Owning shard.
    pub shard: ShardId,
}

/// An exchange and its bindings, indexed for its kind.
#[derive(Debug, Clone)]
pub struct Exchange {
    kind: ExchangeKind,
    /// Every (binding key, target), for status and rebuilds.
    bindings: Vec<(Box<str>, Target)>,
    /// Direct: the targets of each binding key.
    direct: HashMap<Box<str>, Vec<Target>>,
    /// Fanout: each bound queue once, in the order of its first binding.
    fanout: Vec<Target>,
    /// Topic: the binding patterns as a trie.
    topic: TopicNode,
}

impl Exchange {
    /// An exchange with no bindings.
    pub fn new(kind: ExchangeKind) -> Exchange {
        Exchange {
            kind,
            bindings: Vec::new(),
            direct: HashMap::new(),
            fanout: Vec::new(),
            topic: TopicNode::default(),
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
    pub fn bind(&mut self, key: &str, target: Target) -> bool {
        if self
            .bindings
            .iter()
            .any(|(k, t)| &**k == key && t.queue == target.queue)
        {
            return false;
        }
        self.bindings.push((key.into(), target.clone()));
        match self.kind {
            ExchangeKind::Direct => self.direct.entry(key.into()).or_default().push(target),
            ExchangeKind::Fanout => {
                if !self.fanout.iter().any(|t| t.queue == target.queue) {
                    self.fanout.push(target);
                }
            }
            ExchangeKind::Topic => self.topic.insert(key.split('.'), target),
        }
        true
    }

    /// Appends the queues `key` routes to; each queue at most once.
    pub fn route(&self, key: &str, out: &mut Vec<Target>) {
        match self.kind {
            ExchangeKind::Direct => {
                // A direct key binds each queue at most once (`bind` refuses repeats).
                if let Some(targets) = self.direct.get(key) {
                    out.extend(targets.iter().cloned());
                }
            }
            ExchangeKind::Fanout => out.extend(self.fanout.iter().cloned()),
            ExchangeKind::Topic => {
                let start = out.len();
                let words: Vec<&str> = key.split('.').collect();
                self.topic.collect(&words, out);
                // Several patterns may match one queue: deliver once.
                dedup_queues(out, start);
            }
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

/// A node of the topic trie.
#[derive(Debug, Clone, Default)]
struct TopicNode {
    words: HashMap<Box<str>, TopicNode>,
    star: Option<Box<TopicNode>>,
    hash: Option<Box<TopicNode>>,
    targets: Vec<Target>,
}

impl TopicNode {
    fn insert<'a>(&mut self, mut words: impl Iterator<Item = &'a str>, target: Target) {
        match words.next() {
            None => self.targets.push(target),
            Some("*") => self
                .star
                .get_or_insert_with(Default::default)
                .insert(words, target),
            Some("#") => self
                .hash
                .get_or_insert_with(Default::default)
                .insert(words, target),
            Some(w) => self
                .words
                .entry(w.into())
                .or_default()
                .insert(words, target),
        }
    }

    fn collect(&self, words: &[&str], out: &mut Vec<Target>) {
        if let Some(hash) = &self.hash {
            // `#` swallows zero or more words.
            for skip in 0..=words.len() {
                hash.collect(&words[skip..], out);
            }
        }
        match words.split_first() {
            None => out.extend(self.targets.iter().cloned()),
            Some((first, rest)) => {
                if let Some(node) = self.words.get(*first) {
                    node.collect(rest, out);
                }
                if let Some(star) = &self.star {
                    star.collect(rest, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(q: &str) -> Target {
        Target {
            queue: Arc::from(q),
            shard: 0,
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
}
