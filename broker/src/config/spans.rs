//! Where each key is in the config text, so that an error the deserializer
//! finds in the translated table names the key as the file spells it and
//! points at it.

use std::fmt;
use std::ops::Range;

use serde::Deserialize;

use super::error::{one_line, position_of};
use super::legacy::Migration;
use super::ConfigError;

/// Turns a deserialization error into a [`ConfigError`] naming the dotted key
/// as the file spells it (the old name of a renamed key), at its position in
/// `text`.
pub(super) fn parse_error(
    text: &str,
    migration: &Migration,
    err: serde_path_to_error::Error<toml::de::Error>,
) -> ConfigError {
    let mut key = err.path().to_string();
    let message = one_line(err.into_inner().message());
    // serde_path_to_error reports "." when the failure is not inside any key.
    if key.is_empty() || key == "." {
        return ConfigError::Syntax { message, at: None };
    }
    if let Some((_, old)) = migration.renamed.iter().find(|(new, _)| *new == key) {
        key = old.clone();
    }
    let spans = KeySpans::of(text);
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let hint = rest
            .split_once("`, ")
            .map_or_else(String::new, |(_, hint)| hint.to_owned());
        let at = spans
            .key(&key)
            .and_then(|span| position_of(text, Some(span)));
        return ConfigError::UnknownKey { key, hint, at };
    }
    let at = spans
        .value(&key)
        .and_then(|span| position_of(text, Some(span)));
    ConfigError::BadValue { key, message, at }
}

/// Where each dotted key of a config text is (`acl.sender_cns[1]` for an
/// array element), so that errors found in the translated table point into
/// the file. Best effort: a text it cannot index gives no positions.
#[derive(Default)]
struct KeySpans(std::collections::HashMap<String, (Range<usize>, Range<usize>)>);

impl KeySpans {
    fn of(text: &str) -> KeySpans {
        let mut spans = KeySpans::default();
        if let Ok(SpannedNode::Table(entries)) = toml::from_str::<SpannedNode>(text) {
            spans.add_table("", entries);
        }
        spans
    }

    fn add_table(
        &mut self,
        prefix: &str,
        entries: Vec<(toml::Spanned<String>, toml::Spanned<SpannedNode>)>,
    ) {
        for (key, value) in entries {
            let path = if prefix.is_empty() {
                key.get_ref().clone()
            } else {
                format!("{prefix}.{}", key.get_ref())
            };
            let (key_span, value_span) = (key.span(), value.span());
            self.add(path, key_span, value_span, value.into_inner());
        }
    }

    fn add(&mut self, path: String, key: Range<usize>, value: Range<usize>, node: SpannedNode) {
        match node {
            SpannedNode::Leaf => {}
            SpannedNode::Table(entries) => self.add_table(&path, entries),
            SpannedNode::Array(items) => {
                for (i, item) in items.into_iter().enumerate() {
                    let span = item.span();
                    self.add(
                        format!("{path}[{i}]"),
                        span.clone(),
                        span,
                        item.into_inner(),
                    );
                }
            }
        }
        self.0.insert(path, (key, value));
    }

    fn key(&self, path: &str) -> Option<Range<usize>> {
        self.0.get(path).map(|(key, _)| key.clone())
    }

    fn value(&self, path: &str) -> Option<Range<usize>> {
        self.0.get(path).map(|(_, value)| value.clone())
    }
}

/// A TOML value reduced to its shape, with the spans of keys and values.
enum SpannedNode {
    Leaf,
    Table(Vec<(toml::Spanned<String>, toml::Spanned<SpannedNode>)>),
    Array(Vec<toml::Spanned<SpannedNode>>),
}

impl<'de> Deserialize<'de> for SpannedNode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> serde::de::Visitor<'de> for NodeVisitor {
            type Value = SpannedNode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any TOML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<SpannedNode, E> {
                Ok(SpannedNode::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<SpannedNode, E> {
                Ok(SpannedNode::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<SpannedNode, E> {
                Ok(SpannedNode::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<SpannedNode, E> {
                Ok(SpannedNode::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<SpannedNode, E> {
                Ok(SpannedNode::Leaf)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SpannedNode, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(SpannedNode::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SpannedNode, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(SpannedNode::Table(entries))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}
