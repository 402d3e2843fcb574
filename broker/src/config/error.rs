//! What loading reports: [`ConfigError`] with the [`Position`] it points
//! at, and the [`ConfigWarning`] a legacy key leaves. Apart so that every
//! section's checks build their errors the same way.

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::PathBuf;

/// Everything that can go wrong while loading the configuration. Each variant
/// names the offending key (or file) and says what is wrong, so the broker can
/// print it verbatim and exit before binding anything.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file itself could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file we tried to read.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: io::Error,
    },
    /// The text is not valid TOML (or repeats a key).
    #[error("TOML syntax error{}: {message}", at_suffix(.at.as_ref()))]
    Syntax {
        /// The TOML parser's message.
        message: String,
        /// Where in the file, when known.
        at: Option<Position>,
    },
    /// A key (or section) that the broker does not know, usually a typo.
    #[error("unknown key {key}{}: {hint}", at_suffix(.at.as_ref()))]
    UnknownKey {
        /// Dotted path of the unknown key, e.g. `server.adress`.
        key: String,
        /// The keys allowed there, e.g. "expected `address`, `shards` or `name`".
        hint: String,
        /// Where in the file, when known.
        at: Option<Position>,
    },
    /// A known key whose value has the wrong type or is out of the type's range.
    #[error("{key}: {message}{}", at_suffix(.at.as_ref()))]
    BadValue {
        /// Dotted path of the key, e.g. `performance.max_queue_size`.
        key: String,
        /// What is wrong, e.g. `invalid type: string "x", expected usize`.
        message: String,
        /// Where in the file, when known.
        at: Option<Position>,
    },
    /// A well-typed value that breaks a semantic rule (bounds, formats, files).
    #[error("{key}: {reason}")]
    Invalid {
        /// Dotted path of the key, e.g. `server.address`.
        key: String,
        /// What is wrong and, where useful, how to fix it.
        reason: String,
    },
}

impl ConfigError {
    /// Shorthand for [`ConfigError::Invalid`].
    pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The dotted key this error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. }
            | ConfigError::BadValue { key, .. }
            | ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::Read { .. } | ConfigError::Syntax { .. } => None,
        }
    }
}

/// A 1-based line and column in the config text, so errors point at the spot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

fn at_suffix(at: Option<&Position>) -> String {
    match at {
        Some(p) => format!(" (at {p})"),
        None => String::new(),
    }
}

/// A key that loaded but that the operator should change: a key of the
/// reference CipherMQ that this broker does not need, or the old name of a
/// renamed key. One per such key in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// Dotted path of the key as the file spells it, e.g. `server.connection_type`.
    pub key: String,
    /// What replaced it, or why it is not needed, and what became of its value.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

pub(super) fn position_of(text: &str, span: Option<Range<usize>>) -> Option<Position> {
    let start = span?.start;
    let before = text.get(..start)?;
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..)?.chars().count() + 1;
    Some(Position { line, column })
}

/// One line per error: the broker prints it as a single log/stderr line.
pub(super) fn one_line(message: &str) -> String {
    message.trim_end().replace('\n', "; ")
}
