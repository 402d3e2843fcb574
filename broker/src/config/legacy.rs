//! Legacy keys: the reference CipherMQ's keys and the old names of renamed
//! ones, each loaded with a warning ([`LEGACY_KEYS`]). Apart because they
//! are rewritten in the TOML table before the typed sections see it.

use std::path::Path;

use super::{ConfigError, ConfigWarning};

/// What became of a legacy key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LegacyFate {
    /// The same setting under a new name in the same section: the value
    /// moves there. Setting both names is an error.
    Renamed(&'static str),
    /// Not needed by this broker; the text says what does its job. The value
    /// is ignored.
    NotNeeded(&'static str),
    /// `server.connection_type`: `"tls"` is what the broker always does; any
    /// other value is an error.
    OnlyTls,
    /// One of the reference's per-level log file paths: this broker writes
    /// one JSON file per rotation under `logging.dir`, which is taken from
    /// the paths' directory when it is unset and they agree on one.
    LogFilePath,
}

/// A key the broker accepts only to say what replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegacyKey {
    /// Its section, e.g. `performance`.
    pub section: &'static str,
    /// Its name in the section, e.g. `idle_timeout_sec`.
    pub name: &'static str,
    /// What became of it.
    pub fate: LegacyFate,
}

const fn legacy(section: &'static str, name: &'static str, fate: LegacyFate) -> LegacyKey {
    LegacyKey {
        section,
        name,
        fate,
    }
}

/// Every legacy key: the keys of the reference CipherMQ's `config.toml` this
/// broker does not spell the same way, and the old names of renamed keys.
/// Each loads with one [`ConfigWarning`]; any other unknown key is an error.
pub const LEGACY_KEYS: &[LegacyKey] = &[
    legacy("server", "connection_type", LegacyFate::OnlyTls),
    legacy("logging", "info_file_path", LegacyFate::LogFilePath),
    legacy("logging", "debug_file_path", LegacyFate::LogFilePath),
    legacy("logging", "error_file_path", LegacyFate::LogFilePath),
    legacy(
        "logging",
        "max_size_mb",
        LegacyFate::NotNeeded(
            "not supported: JSON log files rotate by time (logging.rotation) and the newest \
             logging.max_log_files of them are kept",
        ),
    ),
    legacy(
        "performance",
        "heartbeat_timeout",
        LegacyFate::Renamed("heartbeat_timeout_secs"),
    ),
    legacy(
        "performance",
        "idle_timeout_sec",
        LegacyFate::Renamed("idle_timeout_secs"),
    ),
    legacy(
        "performance",
        "cleanup_interval",
        LegacyFate::NotNeeded(
            "not needed: a delivery left unacknowledged is redelivered after \
             performance.ack_wait_secs (and moved to {queue}.dlq after \
             performance.max_deliveries), never deleted",
        ),
    ),
    legacy(
        "performance",
        "consumer_cleanup_interval",
        LegacyFate::NotNeeded("not needed: a consumer is removed as soon as its connection closes"),
    ),
    legacy(
        "admin",
        "allowed_cns",
        LegacyFate::NotNeeded(
            "not needed (the reference did not use it either): the admin endpoint answers \
             the CNs of acl.admin_cns, and of acl.monitor_cns read-only",
        ),
    ),
];

/// What [`migrate_legacy_keys`] did to a config table.
#[derive(Debug, Default)]
pub(super) struct Migration {
    /// One per legacy key found.
    pub(super) warnings: Vec<ConfigWarning>,
    /// `(new dotted key, old dotted key)` for each renamed key found, so that
    /// an error about the value names the key the file has.
    pub(super) renamed: Vec<(String, String)>,
}

/// Removes every legacy key from `table`, moving renamed keys' values to
/// their new names and turning the reference's log file paths into
/// `logging.dir`; one warning per key. Errors for values no translation can
/// keep (`connection_type = "tcp"`) and for a key set under both names.
pub(super) fn migrate_legacy_keys(table: &mut toml::Table) -> Result<Migration, ConfigError> {
    let mut migration = Migration::default();
    let log_files = legacy_log_files(table.get("logging").and_then(toml::Value::as_table))?;
    for legacy in LEGACY_KEYS {
        let Some(section) = table
            .get_mut(legacy.section)
            .and_then(toml::Value::as_table_mut)
        else {
            continue;
        };
        let Some(value) = section.remove(legacy.name) else {
            continue;
        };
        let key = format!("{}.{}", legacy.section, legacy.name);
        let message = match legacy.fate {
            LegacyFate::Renamed(new) => {
                let new_key = format!("{}.{new}", legacy.section);
                if section.contains_key(new) {
                    return Err(ConfigError::invalid(
                        key,
                        format!(
                            "is the old name of {new_key}, which is set too: keep only {new_key}"
                        ),
                    ));
                }
                section.insert(new.to_owned(), value);
                migration.renamed.push((new_key.clone(), key.clone()));
                format!("renamed {new_key} (same meaning, same unit); its value is used")
            }
            LegacyFate::NotNeeded(why) => {
                let cns = value.as_array().filter(|cns| !cns.is_empty());
                match cns {
                    // A list of CNs: say they were not given anything.
                    Some(cns) => format!(
                        "{why}; {} was not given access: add it to one of those",
                        toml::Value::Array(cns.clone())
                    ),
                    None => format!("{why}; the value is ignored"),
                }
            }
            LegacyFate::OnlyTls => match value.as_str() {
                Some(v) if v.eq_ignore_ascii_case("tls") => {
                    "not needed: the broker always speaks mutual TLS, with the files of [tls]"
                        .to_owned()
                }
                _ => {
                    return Err(ConfigError::invalid(
                        key,
                        format!(
                            "{value} is not supported: the broker only speaks mutual TLS; \
                             delete the key"
                        ),
                    ))
                }
            },
            LegacyFate::LogFilePath => log_files
                .as_ref()
                .map_or_else(String::new, |l| l.message.clone()),
        };
        migration.warnings.push(ConfigWarning { key, message });
    }
    if let (Some(files), Some(logging)) = (
        log_files,
        table.get_mut("logging").and_then(toml::Value::as_table_mut),
    ) {
        if let Some(dir) = files.dir {
            logging.insert("dir".to_owned(), toml::Value::String(dir));
        }
        if files.json_files {
            logging.insert("json_files".to_owned(), toml::Value::Boolean(true));
        }
    }
    Ok(migration)
}

/// What the reference's `logging.{info,debug,error}_file_path` become.
#[derive(Debug)]
struct LegacyLogFiles {
    /// `logging.dir` to set: the paths' one directory, when `dir` is unset.
    dir: Option<String>,
    /// Set `logging.json_files = true`: it is unset, and the reference always
    /// wrote its files.
    json_files: bool,
    /// The warning of each path key.
    message: String,
}

fn legacy_log_files(logging: Option<&toml::Table>) -> Result<Option<LegacyLogFiles>, ConfigError> {
    let Some(logging) = logging else {
        return Ok(None);
    };
    let mut dirs: Vec<String> = Vec::new();
    for legacy in LEGACY_KEYS {
        if legacy.section != "logging" || legacy.fate != LegacyFate::LogFilePath {
            continue;
        }
        let Some(value) = logging.get(legacy.name) else {
            continue;
        };
        let Some(path) = value.as_str().filter(|p| !p.is_empty()) else {
            return Err(ConfigError::invalid(
                format!("logging.{}", legacy.name),
                format!("{value} is not a file path (and the key is replaced by logging.dir)"),
            ));
        };
        let dir = Path::new(path)
            .parent()
            .map(|d| d.to_string_lossy().into_owned())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| ".".to_owned());
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    if dirs.is_empty() {
        return Ok(None);
    }
    let mut message = "replaced by logging.dir: one JSON file per rotation there \
                       (ciphermq.<date>.json.log) holds every level logging.level lets through; "
        .to_owned();
    let dir = if logging.contains_key("dir") {
        message.push_str("logging.dir is set, so the path is ignored");
        None
    } else if let [dir] = dirs.as_slice() {
        message.push_str(&format!("logging.dir = {:?} is taken from it", dir));
        Some(dir.clone())
    } else {
        message.push_str(&format!(
            "the paths name different directories ({}), so logging.dir keeps its default: set it",
            dirs.join(", ")
        ));
        None
    };
    let json_files = !logging.contains_key("json_files");
    if json_files {
        message.push_str(", and logging.json_files = true (the reference always wrote the files)");
    }
    Ok(Some(LegacyLogFiles {
        dir,
        json_files,
        message,
    }))
}
