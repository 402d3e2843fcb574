//! What the sender's and the receiver's `config.json` share: the `tls` and
//! `logging` sections, loading with errors that name the offending key, and path
//! resolution.
//!
//! Relative paths in a config file are resolved against the directory of that file
//! (as the broker does with `config.toml`), so a client runs the same from any
//! working directory.

use std::io;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::connection::TlsClientOptions;

/// Why a client configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
    /// The JSON is malformed, a key is unknown or a value has the wrong type.
    #[error("{}: `{key}`: {error}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Dotted path of the key (`.` for the document itself).
        key: String,
        /// What serde said.
        error: serde_json::Error,
    },
    /// A value is out of range or inconsistent with another.
    #[error("config key `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the key.
        key: &'static str,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// Logging could not be set up (the log file cannot be opened, or a global
    /// subscriber is already installed).
    #[error("cannot set up logging: {0}")]
    Logging(String),
    /// No `--config` was given and there is no [`DEFAULT_CONFIG`] in the
    /// working directory.
    #[error(
        "no config file: pass --config PATH (no --config was given and there is no \
         {DEFAULT_CONFIG} here). From the repository root, --config clients/examples/{example} \
         is the demo's; clients/README.md describes every key"
    )]
    NoConfig {
        /// The example file for this tool in `clients/examples/`.
        example: &'static str,
    },
}

/// The config file a tool reads when `--config` is not given, from the
/// working directory.
pub const DEFAULT_CONFIG: &str = "config.json";

/// The config file a tool reads: `given` (its `--config`), else
/// [`DEFAULT_CONFIG`] when the working directory has one, else
/// [`ConfigError::NoConfig`] naming `example`, the tool's file in
/// `clients/examples/`.
pub fn config_path(given: Option<PathBuf>, example: &'static str) -> Result<PathBuf, ConfigError> {
    match given {
        Some(path) => Ok(path),
        None if Path::new(DEFAULT_CONFIG).exists() => Ok(PathBuf::from(DEFAULT_CONFIG)),
        None => Err(ConfigError::NoConfig { example }),
    }
}

/// The `tls` section: the client's identity and the CA it trusts. Field names follow
/// the original reference clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The CA certificate that signed the broker's certificate (`certs/ca.crt`).
    pub certificate_path: PathBuf,
    /// This client's certificate; its Common Name is the identity the broker sees.
    pub client_cert_path: PathBuf,
    /// This client's private key (PEM).
    pub client_key_path: PathBuf,
    /// Name sent in SNI and checked against the broker's certificate (default
    /// `localhost`, which `ciphermq-pki` always puts in the server certificate).
    #[serde(default = "default_server_name")]
    pub server_name: String,
    /// Check that the broker's certificate is valid for `server_name` (default
    /// true). When false the chain is still verified against the CA.
    #[serde(default = "default_true")]
    pub check_hostname: bool,
}

impl TlsConfig {
    /// The files `ciphermq-pki` writes for `cn` in `certs_dir`.
    pub fn for_cn(certs_dir: &Path, cn: &str) -> TlsConfig {
        TlsConfig {
            certificate_path: certs_dir.join("ca.crt"),
            client_cert_path: certs_dir.join(format!("{cn}.crt")),
            client_key_path: certs_dir.join(format!("{cn}.key")),
            server_name: default_server_name(),
            check_hostname: true,
        }
    }

    /// The connection library's form of this section.
    pub fn options(&self) -> TlsClientOptions {
        TlsClientOptions {
            ca_cert: self.certificate_path.clone(),
            cert: self.client_cert_path.clone(),
            key: self.client_key_path.clone(),
            server_name: self.server_name.clone(),
            check_hostname: self.check_hostname,
        }
    }

    /// Makes the three paths relative to `base` when they are relative.
    pub(crate) fn resolve_paths(&mut self, base: &Path) {
        resolve(base, &mut self.certificate_path);
        resolve(base, &mut self.client_cert_path);
        resolve(base, &mut self.client_key_path);
    }
}

/// The `logging` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// `trace`, `debug`, `info`, `warn`, `error`, or a filter directive such as
    /// `info,ciphermq_clients=debug` (default `info`). `RUST_LOG` overrides it.
    pub level: String,
    /// Also write JSON logs (one object per line) to this file, appending; none by
    /// default. Logs never contain message bodies or keys.
    pub file: Option<PathBuf>,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: "info".to_owned(),
            file: None,
        }
    }
}

impl LoggingConfig {
    /// Makes `file` relative to `base` when it is relative.
    pub(crate) fn resolve_paths(&mut self, base: &Path) {
        if let Some(file) = &mut self.file {
            resolve(base, file);
        }
    }
}

/// Reads and parses a JSON config file; errors name the key (`sender.max_inflight`)
/// and the file.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Io {
        path: path.to_owned(),
        error,
    })?;
    parse_json(&text, path)
}

/// Parses config text; `path` only names the source in errors.
pub fn parse_json<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        key: err.path().to_string(),
        error: err.into_inner(),
    })?;
    de.end().map_err(|error| ConfigError::Parse {
        path: path.to_owned(),
        key: ".".to_owned(),
        error,
    })?;
    Ok(value)
}

/// The directory relative paths in `config_path` are resolved against.
pub fn base_dir(config_path: &Path) -> PathBuf {
    match config_path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Joins a relative, non-empty path onto `base`, folding `dir/..` pairs so logs
/// and reports show `../../data/x` rather than `clients/examples/../../data/x`
/// (lexically: symlinks are not followed).
pub(crate) fn resolve(base: &Path, path: &mut PathBuf) {
    if !path.as_os_str().is_empty() && path.is_relative() {
        *path = normalize(&base.join(&*path));
    }
}

/// Removes `.` components and each `name/..` pair, keeping leading `..`s.
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            Component::ParentDir if matches!(out.last(), Some(Component::RootDir)) => {}
            other => out.push(other),
        }
    }
    if out.is_empty() {
        PathBuf::from(".")
    } else {
        out.iter().collect()
    }
}

/// The seeds in `server_address` (or `--address`): one `host:port`, or several
/// separated by commas (`a:5700,b:5700`), spaces around each allowed. The first
/// connection of a run tries them in order. An empty value, or an empty item in
/// a list (`a:5700,,b:5700`, a trailing comma), is an error naming the value.
pub(crate) fn seed_addresses(value: &str) -> Result<Vec<String>, ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::Invalid {
            key: "server_address",
            reason: "must be host:port".to_owned(),
        });
    }
    let seeds: Vec<String> = value.split(',').map(|s| s.trim().to_owned()).collect();
    if seeds.iter().any(String::is_empty) {
        return Err(ConfigError::Invalid {
            key: "server_address",
            reason: format!(
                "{value:?} has an empty address: use host:port, or several separated by commas"
            ),
        });
    }
    Ok(seeds)
}

/// Replaces `{cn}` in a configured name or path with the client id the broker
/// announced.
pub(crate) fn with_cn(template: &str, cn: &str) -> String {
    template.replace("{cn}", cn)
}

/// Fails with [`ConfigError::Invalid`] unless `name` follows the protocol's name
/// rule (`[A-Za-z0-9_.:-]{1,255}`).
pub(crate) fn check_name(key: &'static str, name: &str) -> Result<(), ConfigError> {
    if ciphermq_proto::is_valid_name(name) {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key,
            reason: format!("{name:?} is not a valid name: use 1 to 255 of A-Z a-z 0-9 _ . : -"),
        })
    }
}

fn default_server_name() -> String {
    "localhost".to_owned()
}

fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[allow(dead_code)]
        tls: TlsConfig,
    }

    #[test]
    fn errors_name_the_key() {
        let text = r#"{"tls":{"certificate_path":"a","client_cert_path":"b","client_key_path":"c","check_hostname":"yes"}}"#;
        let err = parse_json::<Doc>(text, Path::new("x.json")).unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("tls.check_hostname"), "{shown}");
        let text = r#"{"tls":{"certificate_path":"a","client_cert_path":"b","client_key_path":"c","typo":1}}"#;
        let shown = parse_json::<Doc>(text, Path::new("x.json"))
            .unwrap_err()
            .to_string();
        assert!(shown.contains("typo"), "{shown}");
    }

    #[test]
    fn seeds_are_one_or_several_addresses() {
        assert_eq!(
            seed_addresses("127.0.0.1:5700").unwrap(),
            ["127.0.0.1:5700"]
        );
        assert_eq!(seed_addresses(" b:1 ").unwrap(), ["b:1"]);
        assert_eq!(seed_addresses("a:1,b:2").unwrap(), ["a:1", "b:2"]);
        assert_eq!(
            seed_addresses(" a:1 ,  b:2,c:3 ").unwrap(),
            ["a:1", "b:2", "c:3"]
        );
        for bad in ["a:1,,b:2", "a:1,", ",a:1", "a:1, ,b:2"] {
            let shown = seed_addresses(bad).unwrap_err().to_string();
            assert!(shown.contains("server_address"), "{shown}");
            assert!(shown.contains(&format!("{bad:?}")), "{shown}");
        }
        for empty in ["", "   "] {
            let shown = seed_addresses(empty).unwrap_err().to_string();
            assert_eq!(shown, "config key `server_address`: must be host:port");
        }
    }

    #[test]
    fn tls_defaults_and_paths() {
        let text = r#"{"tls":{"certificate_path":"certs/ca.crt","client_cert_path":"/abs/s.crt","client_key_path":"s.key"}}"#;
        let mut doc: Doc = parse_json(text, Path::new("x.json")).unwrap();
        assert_eq!(doc.tls.server_name, "localhost");
        assert!(doc.tls.check_hostname);
        doc.tls.resolve_paths(Path::new("/etc/cmq"));
        assert_eq!(doc.tls.certificate_path, Path::new("/etc/cmq/certs/ca.crt"));
        assert_eq!(doc.tls.client_cert_path, Path::new("/abs/s.crt"));
        assert_eq!(base_dir(Path::new("sender.json")), Path::new("."));
        let mut p = PathBuf::from("../../certs/ca.crt");
        resolve(Path::new("clients/examples"), &mut p);
        assert_eq!(p, Path::new("certs/ca.crt"));
        let mut p = PathBuf::from("../../../x");
        resolve(Path::new("./a/b"), &mut p);
        assert_eq!(p, Path::new("../x"));
        let mut p = PathBuf::from("../..");
        resolve(Path::new("a/b"), &mut p);
        assert_eq!(p, Path::new("."));
        assert_eq!(base_dir(Path::new("a/b.json")), Path::new("a"));
    }
}
