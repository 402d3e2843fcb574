//! The publish body check: an `EncryptedInputData` object must have the five
//! string fields `message_id`, `receiver_client_id`, `enc_session_key`, `nonce`
//! and `ciphertext`; extra fields are kept and relayed unchanged.
//!
//! One optional field is read too: `sender_client_id`, the publisher's claim
//! of who it is. The broker checks it against the publisher's certificate CN,
//! so a receiver can tell senders apart (and deduplicate per sender) knowing
//! that no sender could name another; when present it must be a string (a
//! `null` counts as absent).
//!
//! The broker cannot read payloads and does not try: it only needs the id (for
//! `ACK`, dedup and deliveries) and the assurance that the body is well formed.
//! The check borrows from the body and allocates nothing unless the id itself
//! is written with JSON escapes.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::name::is_valid_name;

/// What the broker learns from a well-formed body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageInfo<'a> {
    /// The message id, valid under the name rule.
    pub message_id: Cow<'a, str>,
    /// `sender_client_id`, when the body names its sender; the broker
    /// refuses a publish whose claim is not the publisher's CN.
    pub sender_client_id: Option<Cow<'a, str>>,
    /// `receiver_client_id`: the receiver the payload is sealed for. A
    /// queue a receiver owns stores only envelopes naming that receiver.
    pub receiver_client_id: Cow<'a, str>,
}

/// Why a body is refused. The two cases get different replies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Not JSON, not an object, or no readable id: `Error: invalid message`
    /// (or `NACK - invalid` inside a batch).
    #[error("invalid message")]
    Unreadable,
    /// The id is readable but a required field is missing or not a string,
    /// or `sender_client_id` is there and not a string: `NACK <id> invalid`.
    #[error("message {message_id} lacks a required string field")]
    Invalid {
        /// The readable id.
        message_id: String,
    },
}

/// Whether a field was present as a JSON string; never copies the string.
#[derive(Default)]
struct IsString(bool);

impl<'de> Deserialize<'de> for IsString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AnyVisitor::<false>(PhantomData))
            .map(|f| IsString(matches!(f, Field::Str(_))))
    }
}

/// A field value: a string (kept only for the id) or anything else.
enum Field<'a> {
    Str(Cow<'a, str>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Field<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AnyVisitor::<true>(PhantomData))
    }
}

/// Accepts any JSON value; keeps string contents only when `KEEP` is set.
struct AnyVisitor<'a, const KEEP: bool>(PhantomData<&'a ()>);

impl<'de: 'a, 'a, const KEEP: bool> Visitor<'de> for AnyVisitor<'a, KEEP> {
    type Value = Field<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Field::Str(if KEEP {
            Cow::Borrowed(v)
        } else {
            Cow::Borrowed("")
        }))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Field::Str(if KEEP {
            Cow::Owned(v.to_owned())
        } else {
            Cow::Borrowed("")
        }))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }
}

/// The fields the broker looks at; serde skips (but still validates) the rest.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    message_id: Option<Field<'a>>,
    #[serde(borrow, default)]
    receiver_client_id: Option<Field<'a>>,
    #[serde(default)]
    enc_session_key: IsString,
    #[serde(default)]
    nonce: IsString,
    #[serde(default)]
    ciphertext: IsString,
    /// `null` deserializes as `None`, like a missing field.
    #[serde(borrow, default)]
    sender_client_id: Option<Field<'a>>,
}

/// Checks one publish body and returns its id. An envelope of plain
/// strings (what clients send) is read without the JSON parser
/// ([`crate::envelope_scan`]); anything else is parsed. Both give the same
/// answer ([`inspect_message_by_parser`] is the reference).
pub fn inspect_message(body: &str) -> Result<MessageInfo<'_>, MessageError> {
    let Some(fields) = crate::envelope_scan::scan(body) else {
        return inspect_message_by_parser(body);
    };
    let message_id = match fields.message_id {
        Some(id) if is_valid_name(id) => id,
        _ => return Err(MessageError::Unreadable),
    };
    match fields.receiver_client_id {
        Some(receiver) if fields.enc_session_key && fields.nonce && fields.ciphertext => {
            Ok(MessageInfo {
                message_id: Cow::Borrowed(message_id),
                sender_client_id: fields.sender_client_id.map(Cow::Borrowed),
                receiver_client_id: Cow::Borrowed(receiver),
            })
        }
        _ => Err(MessageError::Invalid {
            message_id: message_id.to_owned(),
        }),
    }
}

/// [`inspect_message`] by the JSON parser alone, whatever the body: the
/// reference its fast path is checked against (tests and fuzzing).
pub fn inspect_message_by_parser(body: &str) -> Result<MessageInfo<'_>, MessageError> {
    let envelope: Envelope<'_> =
        serde_json::from_str(body).map_err(|_| MessageError::Unreadable)?;
    let message_id = match envelope.message_id {
        Some(Field::Str(id)) if is_valid_name(&id) => id,
        _ => return Err(MessageError::Unreadable),
    };
    let receiver_client_id = match envelope.receiver_client_id {
        Some(Field::Str(receiver)) => Some(receiver),
        _ => None,
    };
    let complete = envelope.enc_session_key.0 && envelope.nonce.0 && envelope.ciphertext.0;
    let sender_client_id = match envelope.sender_client_id {
        None => Some(None),
        Some(Field::Str(sender)) => Some(Some(sender)),
        Some(Field::Other) => None,
    };
    match (sender_client_id, receiver_client_id) {
        (Some(sender_client_id), Some(receiver_client_id)) if complete => Ok(MessageInfo {
            message_id,
            sender_client_id,
            receiver_client_id,
        }),
        _ => Err(MessageError::Invalid {
            message_id: message_id.into_owned(),
        }),
    }
}

/// Why [`inspect_message`] refused `body`, in words a person can act on
/// (which field, what is wrong with it). Only for the refusal path: it
/// parses the body again, into a tree, so the check itself stays cheap.
/// The reply lines stay as the protocol has them (`Error: invalid message`,
/// `NACK <id> invalid`); this goes to the broker's log.
pub fn explain_refusal(body: &str) -> String {
    let value: serde_json::Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return format!("not JSON: {e}"),
    };
    let Some(object) = value.as_object() else {
        return "not a JSON object".to_owned();
    };
    let duplicate = |field: &str| {
        // A tree keeps one of two equal keys; the check refuses both.
        let quoted = format!("\"{field}\"");
        body.matches(quoted.as_str()).count() > 1
    };
    match object.get("message_id") {
        None => return "field \"message_id\" is missing".to_owned(),
        Some(serde_json::Value::String(id)) if !is_valid_name(id) => {
            return "field \"message_id\" is not a valid name (1-255 characters of A-Z a-z 0-9 _ . : -, not . or ..)".to_owned()
        }
        Some(serde_json::Value::String(_)) => {}
        Some(_) => return "field \"message_id\" is not a string".to_owned(),
    }
    for field in ["message_id", "sender_client_id"] {
        if duplicate(field) {
            return format!("field \"{field}\" appears more than once");
        }
    }
    for field in [
        "receiver_client_id",
        "enc_session_key",
        "nonce",
        "ciphertext",
    ] {
        match object.get(field) {
            None => return format!("field \"{field}\" is missing"),
            Some(serde_json::Value::String(_)) => {}
            Some(_) => return format!("field \"{field}\" is not a string"),
        }
    }
    match object.get("sender_client_id") {
        None | Some(serde_json::Value::Null | serde_json::Value::String(_)) => {}
        Some(_) => return "field \"sender_client_id\" is not a string (or null)".to_owned(),
    }
    "refused by the body check".to_owned()
}

/// One element of a `publish_batch` array: its exact text, to be checked with
/// [`inspect_message`] and stored byte for byte.
pub type BatchElement<'a> = &'a RawValue;

/// Splits a `publish_batch` body into its elements; `None` when the body is not
/// a JSON array.
pub fn inspect_batch(body: &str) -> Option<Vec<BatchElement<'_>>> {
    serde_json::from_str::<Vec<&RawValue>>(body).ok()
}

/// Why [`inspect_batch_at_most`] refused a `publish_batch` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchError {
    /// Not a JSON array.
    NotAnArray,
    /// More elements than allowed; reading stopped at the first one too many.
    TooMany,
}

/// [`inspect_batch`] holding at most `max` elements: a batch of more is
/// refused as soon as its element `max + 1` is seen, so a line of a million
/// `1,` costs neither a million replies nor a million-entry list first.
pub fn inspect_batch_at_most(body: &str, max: usize) -> Result<Vec<BatchElement<'_>>, BatchError> {
    /// Collects up to `max` elements; past that it stops and says so in
    /// `too_many` (the parser then reports the unread rest as an error).
    struct AtMost<'f> {
        max: usize,
        too_many: &'f std::cell::Cell<bool>,
    }
    impl<'de> Visitor<'de> for AtMost<'_> {
        type Value = Vec<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut elements = Vec::new();
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                if elements.len() == self.max {
                    self.too_many.set(true);
                    return Err(de::Error::custom("too many elements"));
                }
                elements.push(element);
            }
            Ok(elements)
        }
    }
    let too_many = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(body);
    let elements = de.deserialize_seq(AtMost {
        max,
        too_many: &too_many,
    });
    match elements {
        _ if too_many.get() => Err(BatchError::TooMany),
        Ok(elements) => de
            .end()
            .map(|()| elements)
            .map_err(|_| BatchError::NotAnArray),
        Err(_) => Err(BatchError::NotAnArray),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"message_id":"sender_1-42-receiver_1","receiver_client_id":"receiver_1","enc_session_key":"AAAA","nonce":"BBBB","ciphertext":"CCCC","extra":{"x":[1,2]}}"#;

    #[test]
    fn accepts_a_complete_body_and_borrows_the_id() {
        let info = inspect_message(GOOD).unwrap();
        assert_eq!(info.message_id, "sender_1-42-receiver_1");
        assert!(matches!(info.message_id, Cow::Borrowed(_)));
        assert_eq!(info.sender_client_id, None);
    }

    const FIVE: &str = r#""message_id":"m1","receiver_client_id":"r","enc_session_key":"k","nonce":"n","ciphertext":"c""#;

    #[test]
    fn reads_the_sender_id_when_there_is_one() {
        let body = format!(r#"{{{FIVE},"sender_client_id":"sender_1"}}"#);
        let info = inspect_message(&body).unwrap();
        assert_eq!(info.sender_client_id.as_deref(), Some("sender_1"));
        assert!(matches!(info.sender_client_id, Some(Cow::Borrowed(_))));
        // Escapes are decoded: the CN is compared with what a receiver reads.
        let body = format!(r#"{{"sender_client_id":"s\u0031",{FIVE}}}"#);
        let info = inspect_message(&body).unwrap();
        assert_eq!(info.sender_client_id.as_deref(), Some("s1"));
        // `null` is no claim.
        let body = format!(r#"{{{FIVE},"sender_client_id":null}}"#);
        let info = inspect_message(&body).unwrap();
        assert_eq!(info.sender_client_id, None);
    }

    #[test]
    fn a_sender_id_that_is_not_a_string_is_invalid() {
        for value in ["7", "true", r#"["sender_1"]"#, r#"{"cn":"sender_1"}"#] {
            assert_eq!(
                inspect_message(&format!(r#"{{{FIVE},"sender_client_id":{value}}}"#)),
                Err(MessageError::Invalid {
                    message_id: "m1".into()
                }),
                "{value}"
            );
        }
    }

    #[test]
    fn a_sender_id_given_twice_is_unreadable() {
        // A receiver might read either one: no body may be ambiguous about it.
        let body = format!(r#"{{{FIVE},"sender_client_id":"a","sender_client_id":"b"}}"#);
        assert_eq!(inspect_message(&body), Err(MessageError::Unreadable));
    }

    #[test]
    fn a_refusal_is_explained_by_its_field() {
        let cases = [
            ("not json", "not JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"nonce":"x"}"#, r#"field "message_id" is missing"#),
            (
                r#"{"message_id":7}"#,
                r#"field "message_id" is not a string"#,
            ),
            (
                r#"{"message_id":"a b"}"#,
                r#"field "message_id" is not a valid name"#,
            ),
            (
                r#"{"message_id":"a","message_id":"b"}"#,
                r#"field "message_id" appears more than once"#,
            ),
            (
                r#"{"message_id":"m1","nonce":"n"}"#,
                r#"field "receiver_client_id" is missing"#,
            ),
        ];
        for (body, why) in cases {
            assert!(inspect_message(body).is_err(), "{body}");
            let told = explain_refusal(body);
            assert!(told.starts_with(why), "{body}: {told}");
        }
        let body = format!(r#"{{{FIVE},"sender_client_id":7}}"#);
        assert!(explain_refusal(&body).starts_with(r#"field "sender_client_id" is not a string"#));
        let body = FIVE.replace(r#""nonce":"n""#, r#""nonce":1"#);
        assert_eq!(
            explain_refusal(&format!("{{{body}}}")),
            r#"field "nonce" is not a string"#
        );
    }

    #[test]
    fn a_batch_is_refused_at_its_first_element_too_many() {
        let count = |body: &str, max| inspect_batch_at_most(body, max).map(|e| e.len());
        assert_eq!(count("[1,2,3]", 3), Ok(3));
        assert_eq!(count("[1,2,3]", 2), Err(BatchError::TooMany));
        // Refused before the damaged tail is even read.
        assert_eq!(count("[1,2,3,", 2), Err(BatchError::TooMany));
        assert_eq!(count("[]", 0), Ok(0));
        assert_eq!(count("{}", 5), Err(BatchError::NotAnArray));
        assert_eq!(count("[1] x", 5), Err(BatchError::NotAnArray));
        assert_eq!(count("[1,", 5), Err(BatchError::NotAnArray));
        let same: Vec<&str> = inspect_batch_at_most(r#"[{"a":1}, "x"]"#, 5)
            .unwrap()
            .iter()
            .map(|e| e.get())
            .collect();
        assert_eq!(same, [r#"{"a":1}"#, r#""x""#]);
    }

    #[test]
    fn unreadable_without_json_or_id() {
        assert_eq!(inspect_message("not json"), Err(MessageError::Unreadable));
        assert_eq!(inspect_message("[1]"), Err(MessageError::Unreadable));
        assert_eq!(
            inspect_message(r#"{"nonce":"x"}"#),
            Err(MessageError::Unreadable)
        );
        assert_eq!(
            inspect_message(r#"{"message_id":7}"#),
            Err(MessageError::Unreadable)
        );
        assert_eq!(
            inspect_message(r#"{"message_id":"a b"}"#),
            Err(MessageError::Unreadable)
        );
        assert_eq!(
            inspect_message(r#"{"message_id":""}"#),
            Err(MessageError::Unreadable)
        );
        assert_eq!(
            inspect_message(r#"{"message_id":"a","message_id":"b"}"#),
            Err(MessageError::Unreadable)
        );
    }

    #[test]
    fn invalid_with_id_but_missing_fields() {
        assert_eq!(
            inspect_message(r#"{"message_id":"m1","nonce":"x"}"#),
            Err(MessageError::Invalid {
                message_id: "m1".into()
            })
        );
        let wrong_type = r#"{"message_id":"m1","receiver_client_id":"r","enc_session_key":"k","nonce":1,"ciphertext":"c"}"#;
        assert_eq!(
            inspect_message(wrong_type),
            Err(MessageError::Invalid {
                message_id: "m1".into()
            })
        );
    }

    #[test]
    fn escaped_id_is_decoded() {
        let body = r#"{"message_id":"m\u0031","receiver_client_id":"r","enc_session_key":"k","nonce":"n","ciphertext":"c"}"#;
        assert_eq!(inspect_message(body).unwrap().message_id, "m1");
    }

    #[test]
    fn batch_elements_keep_their_exact_text() {
        let body = format!("[{GOOD}, {{\"x\": 1}} ]");
        let elements = inspect_batch(&body).unwrap();
        assert_eq!(elements.len(), 2);
        assert_eq!(elements[0].get(), GOOD);
        assert_eq!(elements[1].get(), "{\"x\": 1}");
        assert!(inspect_batch("{}").is_none());
        assert_eq!(inspect_batch("[]").unwrap().len(), 0);
    }

    /// The fast path answers as the parser does: every body made from a few
    /// envelopes by replacing, inserting or deleting one byte (with bytes
    /// that matter to JSON), and by cutting it short.
    #[test]
    fn the_fast_path_answers_as_the_parser_does() {
        let bases = [
            r#"{"message_id":"m-1","receiver_client_id":"r","enc_session_key":"a2V5","nonce":"bm9u","ciphertext":"Y2lwaGVy"}"#,
            r#" {"ciphertext":"QUFB","sender_client_id":"s","nonce":"n","message_id":"id","enc_session_key":"k","receiver_client_id":"r","extra":"x"} "#,
            r#"{"message_id":"é","receiver_client_id":"r","enc_session_key":"k","nonce":"n","ciphertext":"c","sender_client_id":null}"#,
        ];
        let alphabet = [
            "\"", "\\", "{", "}", ":", ",", " ", "\n", "\u{1}", "\u{7f}", "a", "1", "é", "[", "]",
            "n",
        ];
        let mut checked = 0;
        for base in bases {
            let chars: Vec<(usize, char)> = base.char_indices().collect();
            let mut bodies = vec![base.to_owned()];
            for &(i, c) in &chars {
                let (head, tail) = (&base[..i], &base[i + c.len_utf8()..]);
                bodies.push(format!("{head}{tail}"));
                bodies.push(base[..i].to_owned());
                for a in alphabet {
                    bodies.push(format!("{head}{a}{tail}"));
                    bodies.push(format!("{head}{a}{c}{tail}"));
                }
            }
            for body in &bodies {
                assert_eq!(
                    inspect_message(body),
                    inspect_message_by_parser(body),
                    "{body:?}"
                );
                checked += 1;
            }
        }
        assert!(checked > 3000);
    }
}
