//! Where the sender's plaintexts come from: `count` messages rendered from the
//! config's `content_template`, given texts (`--message`), or one message per line
//! of a file or stdin.
//!
//! Template placeholders, replaced in every string of the template:
//! `{sender_id}` (our CN), `{correlation_id}` (`{run_id}.{seq}`, shared by the
//! copies of one message for several receivers), `{timestamp}` (RFC 3339 UTC with
//! milliseconds) and `{seq}` (1, 2, …). A string template is the message text
//! itself; an object or array template is sent as compact JSON. The values put in
//! are made of name characters and digits, so they never need JSON escaping.

use std::fmt::Write as _;
use std::io::{self, BufRead};

use time::OffsetDateTime;

/// The plaintexts to send.
pub enum Contents {
    /// `count` messages rendered from a template.
    Template {
        /// The `content_template` value (string, object or array).
        template: serde_json::Value,
        /// How many messages.
        count: u64,
        /// Pad each text to at least this many bytes (0: no padding); an object
        /// gets a `"pad"` field, anything else trailing spaces.
        pad_to: usize,
    },
    /// These texts, in order.
    Texts(Vec<String>),
    /// One message per line (without its `\n` or `\r\n`); empty lines are skipped.
    Lines(Box<dyn BufRead + Send>),
}

impl std::fmt::Debug for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Contents::Template { count, pad_to, .. } => f
                .debug_struct("Template")
                .field("count", count)
                .field("pad_to", pad_to)
                .finish_non_exhaustive(),
            Contents::Texts(texts) => f.debug_tuple("Texts").field(&texts.len()).finish(),
            Contents::Lines(_) => f.write_str("Lines"),
        }
    }
}

impl Contents {
    /// How many messages this yields, when known in advance.
    pub fn len_hint(&self) -> Option<u64> {
        match self {
            Contents::Template { count, .. } => Some(*count),
            Contents::Texts(texts) => Some(texts.len() as u64),
            Contents::Lines(_) => None,
        }
    }

    /// An iterator of `(seq, text)` for messages from `sender_id` in run `run_id`.
    pub fn messages(self, sender_id: &str, run_id: &str) -> ContentIter {
        let inner = match self {
            Contents::Template {
                template,
                count,
                pad_to,
            } => Inner::Template {
                template: Template::parse(&template),
                count,
                pad_to,
            },
            Contents::Texts(texts) => Inner::Texts(texts.into_iter()),
            Contents::Lines(reader) => Inner::Lines(reader),
        };
        ContentIter {
            inner,
            seq: 0,
            sender_id: sender_id.to_owned(),
            run_id: run_id.to_owned(),
        }
    }
}

/// `(seq, text)` pairs; see [`Contents::messages`].
pub struct ContentIter {
    /// The source.
    inner: Inner,
    /// The last sequence number handed out (the first message is 1).
    seq: u64,
    /// Our CN, for `{sender_id}`.
    sender_id: String,
    /// The run id, the first half of `{correlation_id}`.
    run_id: String,
}

impl std::fmt::Debug for ContentIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentIter")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// The source behind a [`ContentIter`].
enum Inner {
    /// A parsed template and how many messages to render.
    Template {
        template: Template,
        count: u64,
        pad_to: usize,
    },
    /// Given texts.
    Texts(std::vec::IntoIter<String>),
    /// A line reader.
    Lines(Box<dyn BufRead + Send>),
}

impl Iterator for ContentIter {
    type Item = io::Result<(u64, String)>;

    fn next(&mut self) -> Option<Self::Item> {
        let text = match &mut self.inner {
            Inner::Template {
                template,
                count,
                pad_to,
            } => {
                if self.seq >= *count {
                    return None;
                }
                let seq = self.seq + 1;
                let mut text = template.render(&Values {
                    sender_id: &self.sender_id,
                    run_id: &self.run_id,
                    seq,
                    timestamp: &rfc3339_now(),
                });
                pad(&mut text, *pad_to, template.is_object);
                text
            }
            Inner::Texts(texts) => texts.next()?,
            Inner::Lines(reader) => loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) => return None,
                    Ok(_) => {
                        let trimmed = line.trim_end_matches(['\n', '\r']);
                        if !trimmed.is_empty() {
                            line.truncate(trimmed.len());
                            break line;
                        }
                    }
                    Err(e) => return Some(Err(e)),
                }
            },
        };
        self.seq += 1;
        Some(Ok((self.seq, text)))
    }
}

/// The values of one message's placeholders.
struct Values<'a> {
    sender_id: &'a str,
    run_id: &'a str,
    seq: u64,
    timestamp: &'a str,
}

/// A placeholder in a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placeholder {
    SenderId,
    CorrelationId,
    Timestamp,
    Seq,
}

/// A template split once into literal text and placeholders, so rendering is one
/// pass with no searching.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    /// Literal text and placeholders, in order.
    parts: Vec<Part>,
    /// Whether the template is a JSON object (padding adds a field).
    is_object: bool,
}

/// One piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Placeholder(Placeholder),
}

impl Template {
    /// A string is the text itself; anything else is its compact JSON.
    fn parse(value: &serde_json::Value) -> Template {
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        const NAMES: [(&str, Placeholder); 4] = [
            ("{sender_id}", Placeholder::SenderId),
            ("{correlation_id}", Placeholder::CorrelationId),
            ("{timestamp}", Placeholder::Timestamp),
            ("{seq}", Placeholder::Seq),
        ];
        let mut parts = Vec::new();
        let mut rest = text.as_str();
        let mut literal = String::new();
        while !rest.is_empty() {
            if let Some((name, p)) = NAMES.iter().find(|(name, _)| rest.starts_with(name)) {
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                }
                parts.push(Part::Placeholder(*p));
                rest = &rest[name.len()..];
            } else {
                let mut chars = rest.chars();
                if let Some(c) = chars.next() {
                    literal.push(c);
                }
                rest = chars.as_str();
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Template {
            parts,
            is_object: value.is_object(),
        }
    }

    /// The text with every placeholder replaced.
    fn render(&self, values: &Values<'_>) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Placeholder(Placeholder::SenderId) => out.push_str(values.sender_id),
                Part::Placeholder(Placeholder::CorrelationId) => {
                    let _ = write!(out, "{}", correlation_id(values.run_id, values.seq));
                }
                Part::Placeholder(Placeholder::Timestamp) => out.push_str(values.timestamp),
                Part::Placeholder(Placeholder::Seq) => {
                    let _ = write!(out, "{}", values.seq);
                }
            }
        }
        out
    }
}

/// The correlation id of message `seq` of a run: `{run_id}.{seq}`.
pub fn correlation_id(run_id: &str, seq: u64) -> String {
    format!("{run_id}.{seq}")
}

/// Pads `text` to at least `pad_to` bytes: a `"pad"` field of `x`s for a JSON
/// object, trailing spaces otherwise.
fn pad(text: &mut String, pad_to: usize, is_object: bool) {
    if text.len() >= pad_to {
        return;
    }
    if is_object && text.ends_with('}') {
        let empty = text == "{}";
        let overhead = if empty { 8 } else { 9 }; // `"pad":""` plus a comma
        let fill = pad_to.saturating_sub(text.len() + overhead);
        text.pop();
        if !empty {
            text.push(',');
        }
        text.push_str("\"pad\":\"");
        text.extend(std::iter::repeat_n('x', fill));
        text.push_str("\"}");
    } else {
        let fill = pad_to - text.len();
        text.extend(std::iter::repeat_n(' ', fill));
    }
}

/// Now as RFC 3339 UTC with milliseconds, e.g. `2026-06-08T07:03:00.123Z`.
pub fn rfc3339_now() -> String {
    let t = OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render_all(contents: Contents) -> Vec<(u64, String)> {
        contents
            .messages("sender_1", "r7")
            .collect::<io::Result<Vec<_>>>()
            .unwrap()
    }

    #[test]
    fn object_template_substitutes_inside_strings() {
        let got = render_all(Contents::Template {
            template: json!({"text": "hi {seq} from {sender_id}", "corr": "{correlation_id}", "at": "{timestamp}", "k": 1}),
            count: 2,
            pad_to: 0,
        });
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].0, 2);
        let v: serde_json::Value = serde_json::from_str(&got[1].1).unwrap();
        assert_eq!(v["text"], "hi 2 from sender_1");
        assert_eq!(v["corr"], "r7.2");
        assert_eq!(v["k"], 1);
        let at = v["at"].as_str().unwrap();
        assert_eq!(at.len(), 24, "{at}");
        assert!(at.ends_with('Z') && at.as_bytes()[10] == b'T');
    }

    #[test]
    fn string_template_is_the_text() {
        let got = render_all(Contents::Template {
            template: json!("n={seq} {unknown} ünïcode"),
            count: 1,
            pad_to: 0,
        });
        assert_eq!(got, [(1, "n=1 {unknown} ünïcode".to_owned())]);
    }

    #[test]
    fn padding_reaches_the_size() {
        for template in [json!({"a": "{seq}"}), json!({}), json!("text")] {
            let got = render_all(Contents::Template {
                template: template.clone(),
                count: 1,
                pad_to: 1024,
            });
            let text = &got[0].1;
            assert!(
                (1024..1030).contains(&text.len()),
                "{template}: {}",
                text.len()
            );
            if template.is_object() {
                let v: serde_json::Value = serde_json::from_str(text).unwrap();
                assert!(v["pad"].as_str().unwrap().len() > 1000);
            }
        }
    }

    #[test]
    fn lines_skip_empty_ones_and_strip_terminators() {
        let input = b"one\r\n\ntwo\nthree".to_vec();
        let got = render_all(Contents::Lines(Box::new(io::Cursor::new(input))));
        assert_eq!(
            got,
            [
                (1, "one".to_owned()),
                (2, "two".to_owned()),
                (3, "three".to_owned())
            ]
        );
    }
}
