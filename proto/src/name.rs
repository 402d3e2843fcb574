//! The name rule: queues, exchanges, client ids, message ids and routing keys
//! match `[A-Za-z0-9_.:-]{1,255}`; binding keys of topic exchanges may also hold
//! `*` and `#`.

/// Longest name the protocol accepts, in bytes.
pub const MAX_NAME_LEN: usize = 255;

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
/// wildcards `*` (one word) and `#` (zero or more words).
#[inline]
pub fn is_valid_routing_pattern(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes().all(|b| is_name_byte(b) || b == b'*' || b == b'#')
}

#[cfg(test)]
mod tests {
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
}
