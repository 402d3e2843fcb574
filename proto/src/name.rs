//! The name rule: queues, exchanges, client ids, message ids and routing keys
//! match `[A-Za-z0-9_.:-]{1,255}`; binding keys of topic exchanges may also hold
//! `*` and `#`.
//!
//! Routing keys and binding keys are also capped in words
//! ([`MAX_ROUTING_KEY_WORDS`]) and binding keys in `#` wildcards
//! ([`MAX_PATTERN_HASHES`]), so that routing one publish has a small fixed
//! worst case whatever the bindings. The checks live here because the broker
//! enforces them and clients check their own configuration against them.

use std::fmt;

/// Longest name the protocol accepts, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// What a queue's dead-letter queue adds to its name: `{queue}.dlq`.
pub const DEAD_LETTER_SUFFIX: &str = ".dlq";

/// Longest name `declare_queue` accepts, in bytes: a queue's dead-letter
/// queue, `{queue}.dlq`, must itself be a valid name (and a directory name
/// the filesystem takes), whatever name a client chose.
pub const MAX_QUEUE_NAME_LEN: usize = MAX_NAME_LEN - DEAD_LETTER_SUFFIX.len();

/// The queue that takes `queue`'s messages given up after `max_deliveries`:
/// `{queue}.dlq`, except for a queue that is itself a dead-letter queue (its
/// name ends in `.dlq`) or one named before the length rule whose
/// `{queue}.dlq` would be too long: such a queue keeps them, at its tail.
/// So no chain `….dlq.dlq` grows, and no derived name can fail a file
/// operation.
pub fn dead_letter_queue_of(queue: &str) -> std::borrow::Cow<'_, str> {
    if queue.ends_with(DEAD_LETTER_SUFFIX) || queue.len() > MAX_QUEUE_NAME_LEN {
        std::borrow::Cow::Borrowed(queue)
    } else {
        std::borrow::Cow::Owned(format!("{queue}{DEAD_LETTER_SUFFIX}"))
    }
}

/// Most dot-separated words a routing key (and a binding key, `#` aside) may
/// have.
///
/// Topic routing costs, per word of the key, one step for each binding state
/// still alive, so the cap bounds the work one publish can ask of a shard.
/// Without it the 255-byte name rule allows 128 words (`a.a.a…`); real keys
/// have a handful (`tenant.region.kind`), and 32 leaves ample room. A binding
/// key needing more words than this (each word but `#` consumes one) could
/// never match, so it is refused at bind rather than kept dead.
pub const MAX_ROUTING_KEY_WORDS: usize = 32;

/// Most `#` wildcards a binding key may hold, counting as one the `#`s of a
/// run of consecutive wildcards: `#.#.#` matches what `#` matches, and
/// `#.*.#.*` what `*.*.#` does (a run with `k` stars and some `#` matches any
/// `k` or more words), and the router stores them so.
///
/// Each `#` left is a matcher state that stays alive for the rest of the key
/// once reached, so the states one binding keeps alive, and with them the cost
/// of every publish on its exchange, grow with that count. Patterns with more
/// than two or three are rare in practice; 8 keeps them expressible while
/// bounding what one hostile binding can cost.
pub const MAX_PATTERN_HASHES: usize = 8;

/// Why a routing key or binding key is refused. `Display` is the text after
/// `Error: ` in the broker's reply to a `bind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingKeyError {
    /// It breaks the name rule (for a binding key: the name rule plus `*`, `#`).
    InvalidName,
    /// More than [`MAX_ROUTING_KEY_WORDS`] words (a binding key's `#` aside).
    TooManyWords,
    /// A binding key with more than [`MAX_PATTERN_HASHES`] `#` wildcards
    /// (those of one run of wildcards counting once).
    TooManyHashes,
}

impl fmt::Display for RoutingKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoutingKeyError::InvalidName => f.write_str("invalid routing key name"),
            RoutingKeyError::TooManyWords => {
                write!(f, "routing key has more than {MAX_ROUTING_KEY_WORDS} words")
            }
            RoutingKeyError::TooManyHashes => write!(
                f,
                "routing key has more than {MAX_PATTERN_HASHES} # wildcards (# separated only by * count once)"
            ),
        }
    }
}

impl std::error::Error for RoutingKeyError {}

/// True for the characters a name may hold.
#[inline]
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
}

/// Whether `s` is a valid queue, exchange, client id, message id or routing key.
/// `.` and `..` are refused although the alphabet allows them: a queue's
/// name is a directory name in the data directory.
#[inline]
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_LEN && s.bytes().all(is_name_byte) && s != "." && s != ".."
}

/// Whether `s` is a valid binding key: a name that may also use the topic
/// wildcards `*` (one word) and `#` (zero or more words), within the word and
/// `#` caps. See [`check_routing_pattern`] for the reason of a refusal.
#[inline]
pub fn is_valid_routing_pattern(s: &str) -> bool {
    check_routing_pattern(s).is_ok()
}

/// Checks a binding key: the name rule plus `*` and `#`, at most
/// [`MAX_ROUTING_KEY_WORDS`] words besides `#`, and at most
/// [`MAX_PATTERN_HASHES`] `#`, those of one run of consecutive wildcards
/// (`#.#`, `#.*.#`) counting once.
///
/// Only a whole word `*` or `#` is a wildcard; `a#` is a literal word.
pub fn check_routing_pattern(s: &str) -> Result<(), RoutingKeyError> {
    if s.is_empty()
        || s.len() > MAX_NAME_LEN
        || !s.bytes().all(|b| is_name_byte(b) || b == b'*' || b == b'#')
    {
        return Err(RoutingKeyError::InvalidName);
    }
    let mut words = 0usize;
    let mut hashes = 0usize;
    // Whether the current run of wildcards already holds a `#`.
    let mut run_has_hash = false;
    for word in s.split('.') {
        match word {
            "#" => {
                if !run_has_hash {
                    hashes += 1;
                }
                run_has_hash = true;
            }
            "*" => words += 1,
            _ => {
                words += 1;
                run_has_hash = false;
            }
        }
    }
    if words > MAX_ROUTING_KEY_WORDS {
        Err(RoutingKeyError::TooManyWords)
    } else if hashes > MAX_PATTERN_HASHES {
        Err(RoutingKeyError::TooManyHashes)
    } else {
        Ok(())
    }
}

/// Whether `s` may be published with: a name of at most
/// [`MAX_ROUTING_KEY_WORDS`] words. A publish with any other key is
/// `NACK <id> invalid`.
#[inline]
pub fn is_valid_routing_key(s: &str) -> bool {
    check_routing_key(s).is_ok()
}

/// Checks a publish's routing key: the name rule and the word cap.
pub fn check_routing_key(s: &str) -> Result<(), RoutingKeyError> {
    if !is_valid_name(s) {
        Err(RoutingKeyError::InvalidName)
    } else if word_count(s) > MAX_ROUTING_KEY_WORDS {
        Err(RoutingKeyError::TooManyWords)
    } else {
        Ok(())
    }
}

/// Dot-separated words of `s`: one more than its dots (`a..b` has three).
#[inline]
fn word_count(s: &str) -> usize {
    s.bytes().filter(|&b| b == b'.').count() + 1
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dead_letter_queue_name_always_fits() {
        let longest = "q".repeat(MAX_QUEUE_NAME_LEN);
        let dlq = dead_letter_queue_of(&longest);
        assert_eq!(dlq.len(), MAX_NAME_LEN);
        assert!(is_valid_name(&dlq));
        // A dead-letter queue keeps its own; so does an over-long old name.
        assert_eq!(dead_letter_queue_of(&dlq), dlq);
        assert_eq!(dead_letter_queue_of("q.dlq"), "q.dlq");
        let old = "q".repeat(MAX_QUEUE_NAME_LEN + 1);
        assert_eq!(dead_letter_queue_of(&old), old);
        assert_eq!(dead_letter_queue_of("orders"), "orders.dlq");
    }

    use super::*;

    #[test]
    fn refuses_names_that_would_leave_a_directory() {
        assert!(!is_valid_name("."));
        assert!(!is_valid_name(".."));
        assert!(is_valid_name("..."));
        assert!(is_valid_name(".a"));
    }

    #[test]
    fn accepts_the_name_alphabet() {
        assert!(is_valid_name("receiver_1_queue"));
        assert!(is_valid_name("a.b:c-d_E9"));
        assert!(is_valid_name(&"x".repeat(255)));
    }

    #[test]
    fn rejects_empty_long_and_foreign_characters() {
        assert!(!is_valid_name(""));
        assert!(!is_valid_name(&"x".repeat(256)));
        assert!(!is_valid_name("a b"));
        assert!(!is_valid_name("a/b"));
        assert!(!is_valid_name("é"));
        assert!(!is_valid_name("a*"));
    }

    #[test]
    fn patterns_allow_wildcards() {
        assert!(is_valid_routing_pattern("receiver_1.#"));
        assert!(is_valid_routing_pattern("*.x.*"));
        assert!(!is_valid_routing_pattern("a b"));
        assert!(!is_valid_routing_pattern(""));
    }

    /// `n` words `w` joined by dots, after `head`.
    fn key(head: &str, w: &str, n: usize) -> String {
        let mut k = head.to_owned();
        for _ in 0..n {
            k.push('.');
            k.push_str(w);
        }
        k
    }

    #[test]
    fn routing_keys_are_capped_in_words() {
        // `r` plus 31 words: 32 in all.
        assert!(is_valid_routing_key(&key("r", "a", 31)));
        assert_eq!(
            check_routing_key(&key("r", "a", 32)),
            Err(RoutingKeyError::TooManyWords)
        );
        // Empty words count: `r` and 32 empty words.
        assert_eq!(
            check_routing_key(&format!("r{}", ".".repeat(32))),
            Err(RoutingKeyError::TooManyWords)
        );
        assert!(is_valid_routing_key(&format!("r{}", ".".repeat(31))));
        assert_eq!(check_routing_key("a*"), Err(RoutingKeyError::InvalidName));
        assert_eq!(check_routing_key(""), Err(RoutingKeyError::InvalidName));
        assert!(!is_valid_routing_key(".."));
    }

    #[test]
    fn patterns_are_capped_in_words_but_hash_does_not_count() {
        assert!(is_valid_routing_pattern(&key("r", "*", 31)));
        assert_eq!(
            check_routing_pattern(&key("r", "*", 32)),
            Err(RoutingKeyError::TooManyWords)
        );
        // 32 words plus 8 `#` between them is fine: `#` may match nothing.
        let mut p = key("r", "a", 23);
        for _ in 0..8 {
            p.push_str(".#.a");
        }
        assert_eq!(check_routing_pattern(&p), Ok(()), "{p}");
    }

    #[test]
    fn patterns_are_capped_in_hashes_after_collapsing_runs() {
        // A run of `#` is one: the topic bomb `r.#.#.#…` is a plain `r.#`.
        assert!(is_valid_routing_pattern(&key("r", "#", 100)));
        assert!(is_valid_routing_pattern("#.#.#"));
        let spaced = |n: usize| {
            let mut p = "r".to_owned();
            for _ in 0..n {
                p.push_str(".#.x");
            }
            p
        };
        assert!(is_valid_routing_pattern(&spaced(MAX_PATTERN_HASHES)));
        assert_eq!(
            check_routing_pattern(&spaced(MAX_PATTERN_HASHES + 1)),
            Err(RoutingKeyError::TooManyHashes)
        );
        // Only `*` between them: one run, one `#` (it means `*`×9 then `#`).
        let starred = format!("r{}", ".#.*".repeat(MAX_PATTERN_HASHES + 1));
        assert!(is_valid_routing_pattern(&starred));
        // A literal word between them keeps them apart.
        let mixed = format!("r{}", ".#.*.x".repeat(MAX_PATTERN_HASHES + 1));
        assert_eq!(
            check_routing_pattern(&mixed),
            Err(RoutingKeyError::TooManyHashes)
        );
        // Only a whole word is a wildcard.
        assert!(is_valid_routing_pattern(&key("r", "a#", 20)));
    }

    #[test]
    fn refusals_read_as_reasons() {
        assert_eq!(
            RoutingKeyError::InvalidName.to_string(),
            "invalid routing key name"
        );
        assert_eq!(
            RoutingKeyError::TooManyWords.to_string(),
            "routing key has more than 32 words"
        );
        assert_eq!(
            RoutingKeyError::TooManyHashes.to_string(),
            "routing key has more than 8 # wildcards (# separated only by * count once)"
        );
    }
}
