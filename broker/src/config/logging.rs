//! `[logging]`: level, sinks and rotation as configured, and their checks.
//! What the broker does with them is [`crate::logging`].

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::checks::check_non_empty_path;
use super::{Config, ConfigError};

/// How often log files are rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogRotation {
    /// A new file every hour.
    Hourly,
    /// A new file every day (the default).
    #[default]
    Daily,
    /// One file forever (rotate externally, e.g. with logrotate).
    Never,
}

impl LogRotation {
    /// The config spelling, for status output.
    pub fn as_str(self) -> &'static str {
        match self {
            LogRotation::Hourly => "hourly",
            LogRotation::Daily => "daily",
            LogRotation::Never => "never",
        }
    }
}

/// `logging.console`: whether readable log lines go to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Console {
    /// `"auto"` (the default): on, except when stderr is the systemd journal
    /// and `json_files` is on, so that the journal and the files do not both
    /// store every line (see [`crate::logging`]).
    #[default]
    Auto,
    /// `true`: always on, next to the JSON files if they are on too.
    On,
    /// `false`: never.
    Off,
}

impl Console {
    /// The config spelling, for status output.
    pub fn as_str(self) -> &'static str {
        match self {
            Console::Auto => "auto",
            Console::On => "true",
            Console::Off => "false",
        }
    }
}

impl<'de> Deserialize<'de> for Console {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ConsoleVisitor;
        impl serde::de::Visitor<'_> for ConsoleVisitor {
            type Value = Console;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"true, false or "auto""#)
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<Console, E> {
                Ok(if on { Console::On } else { Console::Off })
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Console, E> {
                if value == "auto" {
                    Ok(Console::Auto)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(value), &self))
                }
            }
        }
        deserializer.deserialize_any(ConsoleVisitor)
    }
}

/// `[logging]`: tracing output (docs/PROTOCOL.md, "Logging"). Which sinks are
/// on by default, and why, is in [`crate::logging`]: with the defaults every
/// line is written once, to stderr.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// Level (`trace`, `debug`, `info`, `warn`, `error`, `off`) or a tracing filter
    /// directive such as `info,ciphermq_shard=debug`. `RUST_LOG` overrides it.
    /// Default `info`.
    pub level: String,
    /// JSON file rotation: `hourly`, `daily` or `never`. Default `daily`.
    pub rotation: LogRotation,
    /// Directory of the JSON log files (relative to the config file).
    /// Default `logs`.
    pub dir: PathBuf,
    /// Readable lines on stderr (no ANSI colour unless stderr is a terminal):
    /// `true`, `false` or `"auto"`. Default `"auto"`.
    pub console: Console,
    /// Write JSON log files, `ciphermq.<date>.json.log`, under `dir`.
    /// Default false.
    pub json_files: bool,
    /// Most JSON log files kept in `dir`, the current one included: starting
    /// a file (at start-up and at each rotation) deletes the oldest beyond
    /// it. 0 = keep them all. Default 14 (two weeks of daily files).
    pub max_log_files: usize,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: "info".to_owned(),
            rotation: LogRotation::Daily,
            dir: PathBuf::from("logs"),
            console: Console::Auto,
            json_files: false,
            max_log_files: 14,
        }
    }
}

impl Config {
    pub(super) fn validate_logging(&self) -> Result<(), ConfigError> {
        let level = self.logging.level.trim();
        let is_level = ["trace", "debug", "info", "warn", "error", "off"]
            .iter()
            .any(|l| l.eq_ignore_ascii_case(level));
        let is_directive = !level.is_empty()
            && (level.contains('=') || level.contains(','))
            && !level.chars().any(char::is_whitespace);
        if !is_level && !is_directive {
            return Err(ConfigError::invalid(
                "logging.level",
                format!(
                    "{:?} is neither a level (trace, debug, info, warn, error, off) nor a \
                     filter directive such as \"info,ciphermq_shard=debug\"",
                    self.logging.level
                ),
            ));
        }
        check_non_empty_path("logging.dir", &self.logging.dir)
    }
}
