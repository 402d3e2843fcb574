//! The common case of the publish body check, without a JSON parser: an
//! object whose keys and values are all plain strings (no escapes), each
//! field the broker reads at most once. A base64 ciphertext is found by a
//! SIMD search for the next `"` or `\` and checked for control characters
//! in one vectorised pass, instead of being walked byte by byte.
//!
//! Anything else (escapes, numbers, `null`, nested values, a repeated
//! field, bad syntax) is not decided here: [`scan`] answers `None` and the
//! full parser decides, so the answer is always the parser's.

/// The fields of an envelope found by [`scan`], borrowed from the body.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Fields<'a> {
    /// `message_id`, not yet checked against the name rule.
    pub(crate) message_id: Option<&'a str>,
    /// `receiver_client_id`: whom the payload is sealed for.
    pub(crate) receiver_client_id: Option<&'a str>,
    /// `sender_client_id`, the publisher's claim, when present.
    pub(crate) sender_client_id: Option<&'a str>,
    /// The three encrypted parts, present as strings (their contents are
    /// the receiver's business).
    pub(crate) enc_session_key: bool,
    /// See `enc_session_key`.
    pub(crate) nonce: bool,
    /// See `enc_session_key`.
    pub(crate) ciphertext: bool,
}

/// The envelope's fields when `body` is an object of plain strings, each
/// read field once; `None` when the full parser must decide.
pub(crate) fn scan(body: &str) -> Option<Fields<'_>> {
    let bytes = body.as_bytes();
    let mut fields = Fields::default();
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_ws(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return (skip_ws(bytes, at + 1) == bytes.len()).then_some(fields);
    }
    loop {
        let (key, after) = string_at(body, at)?;
        at = skip_ws(bytes, after);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_ws(bytes, at + 1);
        let (value, after) = string_at(body, at)?;
        let seen = match key {
            "message_id" => fields.message_id.replace(value).is_some(),
            "receiver_client_id" => fields.receiver_client_id.replace(value).is_some(),
            "sender_client_id" => fields.sender_client_id.replace(value).is_some(),
            "enc_session_key" => std::mem::replace(&mut fields.enc_session_key, true),
            "nonce" => std::mem::replace(&mut fields.nonce, true),
            "ciphertext" => std::mem::replace(&mut fields.ciphertext, true),
            _ => false,
        };
        if seen {
            return None;
        }
        at = skip_ws(bytes, after);
        match bytes.get(at) {
            Some(b',') => at = skip_ws(bytes, at + 1),
            Some(b'}') => return (skip_ws(bytes, at + 1) == bytes.len()).then_some(fields),
            _ => return None,
        }
    }
}

/// The plain string starting with the `"` at `at`, and the index after its
/// closing `"`; `None` unless there is one, with no escape and no control
/// character in it.
fn string_at(body: &str, at: usize) -> Option<(&str, usize)> {
    let bytes = body.as_bytes();
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let rest = bytes.get(start..)?;
    let len = memchr::memchr2(b'"', b'\\', rest)?;
    if rest[len] != b'"' {
        return None;
    }
    // The smallest byte, in one pass the compiler vectorises: JSON allows
    // no control character (below 0x20) raw in a string.
    if rest[..len].iter().fold(u8::MAX, |low, &b| low.min(b)) < 0x20 {
        return None;
    }
    // Both ends are ASCII quotes, so these are character boundaries.
    Some((body.get(start..start + len)?, start + len + 1))
}

/// The first index at or after `at` that is not JSON whitespace.
fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_object_of_plain_strings() {
        let body = r#" { "message_id" : "m1", "x":"y","receiver_client_id":"r","enc_session_key":"k","nonce":"n","ciphertext":"c" } "#;
        assert_eq!(
            scan(body),
            Some(Fields {
                message_id: Some("m1"),
                receiver_client_id: Some("r"),
                sender_client_id: None,
                enc_session_key: true,
                nonce: true,
                ciphertext: true,
            })
        );
        assert_eq!(scan("{}"), Some(Fields::default()));
    }

    #[test]
    fn leaves_everything_else_to_the_parser() {
        for body in [
            "",
            "[]",
            "{",
            r#"{"a":"b""#,
            r#"{"a":"b",}"#,
            r#"{"a":"b"} x"#,
            r#"{"a":1}"#,
            r#"{"a":null}"#,
            r#"{"a":{"b":"c"}}"#,
            r#"{"a":"b\"c"}"#,
            r#"{"a\u0062":"c"}"#,
            "{\"a\":\"b\u{1}c\"}",
            "{\"a\":\"b\tc\"}",
            r#"{"message_id":"a","message_id":"b"}"#,
            r#"{"nonce":"a","nonce":"b"}"#,
            r#"{"a" "b"}"#,
            r#"{a:"b"}"#,
        ] {
            assert_eq!(scan(body), None, "{body:?}");
        }
    }

    #[test]
    fn a_repeated_field_the_broker_does_not_read_is_fine() {
        assert_eq!(scan(r#"{"x":"1","x":"2"}"#), Some(Fields::default()));
    }

    #[test]
    fn multibyte_text_is_kept_whole() {
        let got = scan(r#"{"message_id":"é€😀","ciphertext":"ü"}"#).unwrap();
        assert_eq!(got.message_id, Some("é€😀"));
        assert!(got.ciphertext);
    }
}
