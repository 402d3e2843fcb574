//! Typed broker configuration, loaded from `config.toml` (docs/ARCHITECTURE.md,
//! "Configuration").
//!
//! Loading happens in three steps, so that tests and the `SIGHUP` reload path can
//! pick what they need:
//!
//! 1. [`Config::parse_unchecked`]: TOML → typed structs (unknown keys and wrong
//!    types are errors naming the dotted key), relative paths resolved against the
//!    config file's directory, then [`Config::validate`] (pure semantic checks).
//! 2. [`Config::validate_files`]: the checks that touch the filesystem or the
//!    environment (TLS files exist, the AES key file decodes, …).
//! 3. [`Config::load`] / [`Config::from_toml_str`] do both.
//!
//! Every section is optional and every key has a default, so an empty file is a
//! valid configuration (given the default certificate files exist).
//!
//! Legacy keys load with a warning each ([`Config::warnings`], also logged by
//! [`Config::from_toml_str`] and again by [`crate::logging::init`]): the keys
//! of the reference CipherMQ's `config.toml` (`server.connection_type`,
//! `logging.info_file_path`, `performance.cleanup_interval`, …) and the old
//! spellings of renamed keys (`performance.idle_timeout_sec` is now
//! `idle_timeout_secs`). [`LEGACY_KEYS`] lists them with what became of each;
//! any other unknown key is still an error naming it. Unit suffixes are
//! `_secs`, `_ms`, `_us`, `_bytes` and `_mb` (MiB); a key without one counts
//! something (messages, connections, files).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use base64::Engine as _;
pub use ciphermq_admin::config::{AdminConfig, MAX_ADMIN_CONNECTIONS, MAX_ADMIN_TIMEOUT_SECS};
use serde::Deserialize;

/// Environment variable consulted for the AES key when neither
/// `encryption.aes_key` nor `encryption.aes_key_file` is set.
pub const ENV_AES_KEY: &str = "CIPHERMQ_AES_KEY";

/// The only end-to-end algorithm the clients speak (docs/ARCHITECTURE.md,
/// "End-to-end encryption"); the key exists so a future algorithm can be
/// introduced explicitly.
pub const ALGORITHM_X25519_CHACHA20_POLY1305: &str = "x25519_chacha20_poly1305";

/// Upper bound of `server.shards`: more executors than this is a typo, not a machine.
pub const MAX_SHARDS: usize = 1024;

/// Lower bound of `storage.segment_bytes`: one page, so a segment holds at least a
/// few small records.
pub const MIN_SEGMENT_BYTES: u64 = 4096;

/// Upper bound of `storage.segment_bytes`: recovery reads a segment whole, so
/// a segment must fit in memory comfortably (1 GiB).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// Upper bound of `storage.memory_budget_mb`: 1 PiB, far past any host, so
/// that the budget in bytes cannot overflow.
pub const MAX_MEMORY_BUDGET_MB: u64 = 1 << 30;

/// Upper bound of every duration in the config: ten years. A deadline is a
/// point in time computed from now, and one past what the clock can hold
/// would panic on first use; nothing sensible waits longer.
pub const MAX_DURATION_SECS: u64 = 10 * 365 * 24 * 3600;

/// Room for the command and its arguments around a message body: the default
/// `performance.max_line_bytes` is `max_message_bytes` plus this.
pub const LINE_OVERHEAD_BYTES: usize = 4096;

/// Upper bound of `performance.max_message_bytes`: the largest body whose
/// message record the queue log can still read back. A record longer than
/// [`MAX_RECORD_BYTES`](ciphermq_shard::log::record::MAX_RECORD_BYTES) is
/// taken for corruption on recovery, so accepting a larger body would store
/// a message that the next start reports as damage instead of serving.
///
/// A message record holds, besides the body: a header (length, CRC, kind;
/// counted as 16 bytes, more than it takes, so the format can grow a little
/// without lowering this bound), the sequence number and the time (8 bytes
/// each), and four fields (sender CN, message id, exchange, routing key),
/// each a 2-byte length and at most [`MAX_NAME_LEN`](ciphermq_proto::name::MAX_NAME_LEN)
/// (255) bytes.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = ciphermq_shard::log::record::MAX_RECORD_BYTES
    - 16
    - (8 + 8)
    - 4 * (2 + ciphermq_proto::name::MAX_NAME_LEN);

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
    fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
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

fn position_of(text: &str, span: Option<Range<usize>>) -> Option<Position> {
    let start = span?.start;
    let before = text.get(..start)?;
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..)?.chars().count() + 1;
    Some(Position { line, column })
}

// ---------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------

/// The whole broker configuration: one field per `config.toml` section.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`: where clients connect and how many shards serve them.
    pub server: ServerConfig,
    /// `[tls]`: the broker's certificate and the CA that signs client certificates.
    pub tls: TlsConfig,
    /// `[logging]`: log level, files and rotation.
    pub logging: LoggingConfig,
    /// `[database]`: where metadata and public keys are mirrored.
    pub database: DatabaseConfig,
    /// `[encryption]`: algorithm name and the AES key sealing public keys at rest.
    pub encryption: EncryptionConfig,
    /// `[performance]`: sizes, timeouts and delivery limits.
    pub performance: PerformanceConfig,
    /// `[storage]`: the durable queue logs.
    pub storage: StorageConfig,
    /// `[admin]`: the mTLS admin/metrics endpoint.
    pub admin: AdminConfig,
    /// `[rate_limit]`: per-CN token buckets and connection caps.
    pub rate_limit: RateLimitConfig,
    /// `[acl]`: which certificate CNs hold which role.
    pub acl: AclConfig,
    /// `[cluster]`: whether this broker is one node of several, and who it
    /// is among them.
    pub cluster: ClusterConfig,
    /// One per legacy key the file used; see [`Config::warnings`].
    #[serde(skip)]
    warnings: Vec<ConfigWarning>,
}

/// `[server]`: the client listener.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address for mutual-TLS clients, `host:port` (`[v6]:port` for IPv6;
    /// port 0 picks a free port). Default `127.0.0.1:5700`.
    pub address: String,
    /// Number of shards (one pinned executor each); 0 means one per CPU core.
    /// At most [`MAX_SHARDS`]. Default 0.
    pub shards: usize,
    /// Name of this broker in status output and logs, 1–255 printable characters.
    /// Default `ciphermq`.
    pub name: String,
    /// Seconds a stopping broker (SIGTERM, SIGINT) gives its connections to
    /// be answered and closed; past it the shards give up, what is still
    /// open is logged, and `ciphermq-broker` exits with status 3. Acks are
    /// sent only after `fdatasync`, so nothing acknowledged is lost by giving
    /// up. 0 = wait for as long as it takes. At most [`MAX_DURATION_SECS`].
    /// Default 30.
    pub shutdown_timeout_secs: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            address: "127.0.0.1:5700".to_owned(),
            shards: 0,
            name: "ciphermq".to_owned(),
            shutdown_timeout_secs: 30,
        }
    }
}

/// `[tls]`: PEM files for mutual TLS, and where a client's identity comes
/// from. Relative paths are resolved against the config file's directory;
/// the files must exist at load time. The whole section is reloaded on
/// `SIGHUP` (new handshakes use it; open connections keep their session).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The broker's certificate chain (PEM). Default `certs/server.crt`.
    pub cert_path: PathBuf,
    /// The broker's private key (PEM). Default `certs/server.key`.
    pub key_path: PathBuf,
    /// The CA that must have signed every client certificate (PEM).
    /// Default `certs/ca.crt`.
    pub ca_cert_path: PathBuf,
    /// Certificate revocation lists (PEM or DER), one per CA of
    /// `ca_cert_path`: a revoked client certificate fails the handshake, and
    /// a reload closes the connections of certificates it newly revokes.
    /// Default: none (no revocation checks).
    pub crl_path: Option<PathBuf>,
    /// Where a client's identity (its client id, the name the ACL lists)
    /// comes from. Default `"cn"`.
    pub identity: TlsIdentity,
    /// With `identity = "uri_san"`: the start every client's URI
    /// SubjectAltName must have; the rest is the identity. It must end with
    /// `/` or `:`. Default `"spiffe://ciphermq/"`.
    pub uri_san_prefix: String,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_path: PathBuf::from("certs/server.crt"),
            key_path: PathBuf::from("certs/server.key"),
            ca_cert_path: PathBuf::from("certs/ca.crt"),
            crl_path: None,
            identity: TlsIdentity::Cn,
            uri_san_prefix: DEFAULT_URI_SAN_PREFIX.to_owned(),
        }
    }
}

/// `tls.uri_san_prefix` when unset.
pub const DEFAULT_URI_SAN_PREFIX: &str = "spiffe://ciphermq/";

/// `tls.identity`: which part of a client certificate names the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsIdentity {
    /// The Subject Common Name (the default).
    #[default]
    Cn,
    /// The certificate's one URI SubjectAltName, `tls.uri_san_prefix`
    /// stripped (SPIFFE-style identities); the CN is then ignored.
    UriSan,
}

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

/// Where message metadata and public keys are kept (docs/ARCHITECTURE.md,
/// "Public keys and metadata").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatabaseBackend {
    /// Nothing but the data directory (the default).
    #[default]
    Embedded,
    /// Mirror metadata and keys into PostgreSQL through the pgbridge thread.
    Postgres,
}

impl DatabaseBackend {
    /// The config spelling, for status output.
    pub fn as_str(self) -> &'static str {
        match self {
            DatabaseBackend::Embedded => "embedded",
            DatabaseBackend::Postgres => "postgres",
        }
    }
}

/// `database.sslmode`: how the link to PostgreSQL is protected, as libpq
/// spells and means it (docs/PROTOCOL.md, "Postgres bridge").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatabaseSslMode {
    /// Plaintext.
    Disable,
    /// TLS if the server offers it, plaintext otherwise; certificate not
    /// checked. The default: a server without TLS keeps working.
    #[default]
    Prefer,
    /// TLS or nothing; the chain is checked against `ca_cert_path` when set.
    Require,
    /// TLS, chain checked against `ca_cert_path` (required), host name checked.
    VerifyFull,
}

impl DatabaseSslMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DatabaseSslMode::Disable => "disable",
            DatabaseSslMode::Prefer => "prefer",
            DatabaseSslMode::Require => "require",
            DatabaseSslMode::VerifyFull => "verify-full",
        }
    }
}

/// `[database]`: metadata backend; the connection keys matter only with
/// `backend = "postgres"`.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `embedded` or `postgres`. Default `embedded`.
    pub backend: DatabaseBackend,
    /// PostgreSQL host name or address. Default `127.0.0.1`.
    pub host: String,
    /// PostgreSQL port. Default 5432.
    pub port: u16,
    /// PostgreSQL user. Default `postgres`.
    pub user: String,
    /// PostgreSQL password, inline (prefer `password_file`). Default none.
    pub password: Option<String>,
    /// File whose content (trimmed) is the PostgreSQL password; relative to the
    /// config file. Not together with `password`. Default none.
    pub password_file: Option<PathBuf>,
    /// PostgreSQL database name. Default `ciphermq`.
    pub dbname: String,
    /// TLS to PostgreSQL: `disable`, `prefer`, `require` or `verify-full`.
    /// Default `prefer`.
    pub sslmode: DatabaseSslMode,
    /// PEM file of the CA that issued the server's certificate; relative to
    /// the config file. Required by `verify-full`; with `require` the chain
    /// is checked against it. Default none.
    pub ca_cert_path: Option<PathBuf>,
    /// Metadata rows written per batch, at least 1. Default 1000.
    pub batch_size: usize,
    /// Longest wait before a partial batch is flushed, in milliseconds, at least 1.
    /// Default 50.
    pub flush_interval_ms: u64,
    /// Log bytes kept only because the metadata mirror has not read them yet,
    /// in MiB. Past it, fully acked segments are deleted anyway and the mirror
    /// says loudly which rows it will miss. Default 1024.
    pub mirror_disk_budget_mb: u64,
    /// How long start-up keeps trying to reach PostgreSQL, in seconds, at
    /// least 1. Default 30.
    pub connect_timeout_secs: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            backend: DatabaseBackend::Embedded,
            host: "127.0.0.1".to_owned(),
            port: 5432,
            user: "postgres".to_owned(),
            password: None,
            password_file: None,
            dbname: "ciphermq".to_owned(),
            sslmode: DatabaseSslMode::Prefer,
            ca_cert_path: None,
            batch_size: 1000,
            flush_interval_ms: 50,
            mirror_disk_budget_mb: 1024,
            connect_timeout_secs: 30,
        }
    }
}

// Hand-written so that `{:?}` of a config never prints the password.
impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("backend", &self.backend)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .field("ca_cert_path", &self.ca_cert_path)
            .field("batch_size", &self.batch_size)
            .field("flush_interval_ms", &self.flush_interval_ms)
            .field("mirror_disk_budget_mb", &self.mirror_disk_budget_mb)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .finish()
    }
}

/// `[encryption]`: the end-to-end algorithm name and the AES-256-GCM key that
/// seals stored public keys (docs/ARCHITECTURE.md, "Public keys and metadata").
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionConfig {
    /// End-to-end algorithm; must be `x25519_chacha20_poly1305` (the default).
    pub algorithm: String,
    /// AES-256 key, standard padded base64 of exactly 32 bytes. Takes precedence
    /// over `aes_key_file` and `CIPHERMQ_AES_KEY`. Default none.
    pub aes_key: Option<String>,
    /// File holding the base64 AES key (surrounding whitespace ignored); relative
    /// to the config file. Used when `aes_key` is unset. Default none.
    pub aes_key_file: Option<PathBuf>,
}

impl Default for EncryptionConfig {
    fn default() -> Self {
        EncryptionConfig {
            algorithm: ALGORITHM_X25519_CHACHA20_POLY1305.to_owned(),
            aes_key: None,
            aes_key_file: None,
        }
    }
}

// Hand-written so that `{:?}` of a config never prints the key.
impl fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptionConfig")
            .field("algorithm", &self.algorithm)
            .field("aes_key", &self.aes_key.as_ref().map(|_| "<redacted>"))
            .field("aes_key_file", &self.aes_key_file)
            .finish()
    }
}

/// The smallest `performance.max_reply_bytes_per_turn`.
pub const MIN_REPLY_BYTES_PER_TURN: usize = 64 * 1024;

/// The smallest `performance.max_pending_reply_bytes`.
pub const MIN_PENDING_REPLY_BYTES: usize = 64 * 1024;

/// `[performance]`: sizes, timeouts and delivery limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "RawPerformanceConfig")]
pub struct PerformanceConfig {
    /// Most messages one queue may hold (ready + unacked); a full queue answers
    /// `NACK <id> queue_full`. At least 1. Default 1 000 000.
    pub max_queue_size: usize,
    /// Most body bytes one queue may hold (ready + unacked), alongside
    /// `max_queue_size`: a publish that would pass it answers
    /// `NACK <id> queue_full`. 0 = no byte cap (the default).
    pub max_queue_bytes: u64,
    /// Largest message JSON accepted, in bytes; larger is `NACK <id> too_large`.
    /// At least 1, at most [`MAX_MESSAGE_BYTES_LIMIT`]. Default 1 MiB (1 048 576).
    pub max_message_bytes: usize,
    /// Longest request line, in bytes; longer is `Error: line too long`. Must be
    /// larger than `max_message_bytes`. Default `max_message_bytes` + 4096.
    pub max_line_bytes: usize,
    /// Seconds a client has to finish the TLS handshake. At least 1. Default 10.
    pub handshake_timeout_secs: u64,
    /// `idle_timeout_secs`: seconds without any command before a connection
    /// is closed; 0 = never. Default 300. (The field keeps the key's old
    /// name, `idle_timeout_sec`, which still loads with a warning.)
    pub idle_timeout_sec: u64,
    /// `heartbeat_timeout_secs`: seconds a receiver may stay silent (no
    /// command, heartbeat included) before it is disconnected; 0 = never.
    /// Default 60. (The field keeps the key's old name, `heartbeat_timeout`,
    /// which still loads with a warning.)
    pub heartbeat_timeout: u64,
    /// Seconds an acked message id is remembered per queue and sender for
    /// deduplication. Default 120.
    pub dedup_window_secs: u64,
    /// Seconds a delivery may stay unacked before it is redelivered; 0 = never
    /// (only a closed connection redelivers). Default 300.
    pub ack_wait_secs: u64,
    /// Deliveries (nacked ones included) before a message moves to `{queue}.dlq`.
    /// At least 1. Default 10.
    pub max_deliveries: u32,
    /// Unacked deliveries per consumer when `consume` names no prefetch.
    /// At least 1. Default 1000.
    pub default_prefetch: u32,
    /// Per connection, how many commands may await their reply before the broker
    /// stops reading from it (backpressure on pipelining clients). At least 1.
    /// Default 65 536.
    pub max_pending_replies: usize,
    /// Per connection, how many bytes its pending replies may hold (each
    /// reply's own size, the ids it names, and the bodies it keeps alive
    /// until it is written: a publish's, a fetch's, a push delivery's)
    /// before the broker stops reading from it, until the client reads
    /// some. One line more may pass it, by at most that line's worth
    /// (docs/PROTOCOL.md, "Memory per connection"). At least 65 536.
    /// Default 4 MiB (4 194 304).
    pub max_pending_reply_bytes: usize,
    /// Most elements one `publish_batch` may hold; a larger batch is
    /// `Error: publish_batch of more than <n> elements` and nothing of it
    /// is published, so one line cannot create a reply per byte. At least
    /// 1. Default 10 000.
    pub max_batch_elements: usize,
    /// TLS handshakes in progress at once, all clients together, before any
    /// certificate is seen; more are closed at once. Shared evenly by the
    /// shards (each admits its part, rounded up). At least 1. Default 1024.
    pub max_handshakes: u32,
    /// TLS handshakes in progress at once from one IP address (each shard
    /// admits its part, rounded up). At least 1. Default 64.
    pub max_handshakes_per_ip: u32,
    /// Most deliveries one `fetch` returns, whatever it asks. At least 1.
    /// Default 10 000.
    pub max_fetch: u32,
    /// Body bytes one `fetch` returns at most (one message at least, when
    /// there is one). At least 1. Default 16 MiB (16 777 216).
    pub max_fetch_bytes: usize,
    /// Most unacked deliveries per consumer, whatever its `consume` asks.
    /// At least 1. Default 10 000.
    pub max_prefetch: u32,
    /// Body bytes one consumer may hold unacked (one message at least,
    /// however large): a prefetch in bytes beside `max_prefetch`, so large
    /// bodies cannot fill memory at the pace of a count. At least 1.
    /// Default 16 MiB (16 777 216).
    pub max_prefetch_bytes: u64,
    /// Most deliveries one connection may hold unacked (fetched or
    /// consumed) before its `fetch`es are refused; a fetch is served up to
    /// the room left. `consume` is bounded by its prefetch instead. So a
    /// client fetching without acking cannot build a set whose every fetch,
    /// and whose give-back at close, costs the shard more and more. At
    /// least 1. Default 50 000.
    pub max_unacked_per_connection: usize,
    /// Queues one receiver CN may own; a `declare_queue` past it is
    /// `Error: quota exceeded: …`. Admins are not limited. At least 1.
    /// Default 1 000.
    pub max_queues_per_cn: usize,
    /// Exchanges one receiver CN may own (declare first). At least 1.
    /// Default 100.
    pub max_exchanges_per_cn: usize,
    /// Bindings one receiver CN may make. At least 1. Default 10 000.
    pub max_bindings_per_cn: usize,
    /// Reply bytes one connection renders before it yields its shard to the
    /// others (a fast reader of a large `fetch` cannot hold the core). At
    /// least 65 536. Default 1 MiB (1 048 576).
    pub max_reply_bytes_per_turn: usize,
}

/// What `[performance]` looks like on disk: `max_line_bytes` is optional there
/// because its default depends on `max_message_bytes`, and two keys have the
/// `_secs` names their fields do not (yet) have.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawPerformanceConfig {
    max_queue_size: usize,
    max_queue_bytes: u64,
    max_message_bytes: usize,
    max_line_bytes: Option<usize>,
    handshake_timeout_secs: u64,
    idle_timeout_secs: u64,
    heartbeat_timeout_secs: u64,
    dedup_window_secs: u64,
    ack_wait_secs: u64,
    max_deliveries: u32,
    default_prefetch: u32,
    max_pending_replies: usize,
    max_pending_reply_bytes: usize,
    max_batch_elements: usize,
    max_handshakes: u32,
    max_handshakes_per_ip: u32,
    max_fetch: u32,
    max_fetch_bytes: usize,
    max_prefetch: u32,
    max_prefetch_bytes: u64,
    max_unacked_per_connection: usize,
    max_queues_per_cn: usize,
    max_exchanges_per_cn: usize,
    max_bindings_per_cn: usize,
    max_reply_bytes_per_turn: usize,
}

impl Default for RawPerformanceConfig {
    fn default() -> Self {
        let d = PerformanceConfig::default();
        RawPerformanceConfig {
            max_queue_size: d.max_queue_size,
            max_queue_bytes: d.max_queue_bytes,
            max_message_bytes: d.max_message_bytes,
            max_line_bytes: None,
            handshake_timeout_secs: d.handshake_timeout_secs,
            idle_timeout_secs: d.idle_timeout_sec,
            heartbeat_timeout_secs: d.heartbeat_timeout,
            dedup_window_secs: d.dedup_window_secs,
            ack_wait_secs: d.ack_wait_secs,
            max_deliveries: d.max_deliveries,
            default_prefetch: d.default_prefetch,
            max_pending_replies: d.max_pending_replies,
            max_pending_reply_bytes: d.max_pending_reply_bytes,
            max_batch_elements: d.max_batch_elements,
            max_handshakes: d.max_handshakes,
            max_handshakes_per_ip: d.max_handshakes_per_ip,
            max_fetch: d.max_fetch,
            max_fetch_bytes: d.max_fetch_bytes,
            max_prefetch: d.max_prefetch,
            max_prefetch_bytes: d.max_prefetch_bytes,
            max_unacked_per_connection: d.max_unacked_per_connection,
            max_queues_per_cn: d.max_queues_per_cn,
            max_exchanges_per_cn: d.max_exchanges_per_cn,
            max_bindings_per_cn: d.max_bindings_per_cn,
            max_reply_bytes_per_turn: d.max_reply_bytes_per_turn,
        }
    }
}

impl From<RawPerformanceConfig> for PerformanceConfig {
    fn from(raw: RawPerformanceConfig) -> Self {
        PerformanceConfig {
            max_queue_size: raw.max_queue_size,
            max_queue_bytes: raw.max_queue_bytes,
            max_message_bytes: raw.max_message_bytes,
            max_line_bytes: raw
                .max_line_bytes
                .unwrap_or_else(|| raw.max_message_bytes.saturating_add(LINE_OVERHEAD_BYTES)),
            handshake_timeout_secs: raw.handshake_timeout_secs,
            idle_timeout_sec: raw.idle_timeout_secs,
            heartbeat_timeout: raw.heartbeat_timeout_secs,
            dedup_window_secs: raw.dedup_window_secs,
            ack_wait_secs: raw.ack_wait_secs,
            max_deliveries: raw.max_deliveries,
            default_prefetch: raw.default_prefetch,
            max_pending_replies: raw.max_pending_replies,
            max_pending_reply_bytes: raw.max_pending_reply_bytes,
            max_batch_elements: raw.max_batch_elements,
            max_handshakes: raw.max_handshakes,
            max_handshakes_per_ip: raw.max_handshakes_per_ip,
            max_fetch: raw.max_fetch,
            max_fetch_bytes: raw.max_fetch_bytes,
            max_prefetch: raw.max_prefetch,
            max_prefetch_bytes: raw.max_prefetch_bytes,
            max_unacked_per_connection: raw.max_unacked_per_connection,
            max_queues_per_cn: raw.max_queues_per_cn,
            max_exchanges_per_cn: raw.max_exchanges_per_cn,
            max_bindings_per_cn: raw.max_bindings_per_cn,
            max_reply_bytes_per_turn: raw.max_reply_bytes_per_turn,
        }
    }
}

impl Default for PerformanceConfig {
    fn default() -> Self {
        let max_message_bytes = 1_048_576;
        PerformanceConfig {
            max_queue_size: 1_000_000,
            max_queue_bytes: 0,
            max_message_bytes,
            max_line_bytes: max_message_bytes + LINE_OVERHEAD_BYTES,
            handshake_timeout_secs: 10,
            idle_timeout_sec: 300,
            heartbeat_timeout: 60,
            dedup_window_secs: 120,
            ack_wait_secs: 300,
            max_deliveries: 10,
            default_prefetch: 1000,
            max_pending_replies: 65_536,
            max_pending_reply_bytes: 4 << 20,
            max_batch_elements: 10_000,
            max_handshakes: 1024,
            max_handshakes_per_ip: 64,
            max_fetch: 10_000,
            max_fetch_bytes: 16 << 20,
            max_prefetch: 10_000,
            max_prefetch_bytes: 16 << 20,
            max_unacked_per_connection: 50_000,
            max_queues_per_cn: 1_000,
            max_exchanges_per_cn: 100,
            max_bindings_per_cn: 10_000,
            max_reply_bytes_per_turn: 1 << 20,
        }
    }
}

/// Whether queue logs reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageMode {
    /// Append-only logs with group commit; `ACK` only once fsynced (the default).
    #[default]
    Durable,
    /// Queues in memory only: everything is lost on restart. For tests and benches.
    Memory,
}

impl StorageMode {
    /// The config spelling, for status output.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageMode::Durable => "durable",
            StorageMode::Memory => "memory",
        }
    }
}

/// `[storage]`: the per-queue logs (docs/ARCHITECTURE.md, "Storage").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Directory of queue logs, topology and keys (relative to the config file).
    /// Default `data`.
    pub data_dir: PathBuf,
    /// `durable` or `memory`. Default `durable`.
    pub mode: StorageMode,
    /// Size at which a queue log rolls to a new segment, in bytes; at least
    /// [`MIN_SEGMENT_BYTES`]. Default 64 MiB (67 108 864).
    pub segment_bytes: u64,
    /// Extra microseconds a shard may wait to gather more appends into one
    /// `fdatasync`; 0 = sync at the end of each reactor turn. Default 0.
    pub max_commit_delay_us: u64,
    /// Free space, in MiB, below which publishes are refused with
    /// `NACK <id> disk_full` (consumers keep draining, acked segments are
    /// deleted); publishing resumes above it plus an eighth (1–64 MiB).
    /// 0 turns the watermark off. Default 256.
    pub min_free_mb: u64,
    /// MiB of message bodies all queued messages together may hold in RAM,
    /// shared evenly by the shards. In `memory` mode it is a hard cap:
    /// a publish past its shard's share is `NACK <id> queue_full`. In
    /// `durable` mode bodies are, for now, all kept in RAM as well and the
    /// budget is only reported. At least 1, at most
    /// [`MAX_MEMORY_BUDGET_MB`]. Default 256.
    pub memory_budget_mb: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from("data"),
            mode: StorageMode::Durable,
            segment_bytes: 64 * 1024 * 1024,
            max_commit_delay_us: 0,
            min_free_mb: 256,
            memory_budget_mb: 256,
        }
    }
}

/// `cluster.storage`: where an owner's queue data lives, which decides what
/// a failover can take over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterStorage {
    /// Each node's own `storage.data_dir` (the default).
    #[default]
    Local,
    /// A directory every node reaches (`cluster.shared_dir`).
    Shared,
}

impl ClusterStorage {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterStorage::Local => "local",
            ClusterStorage::Shared => "shared",
        }
    }
}

/// `[cluster]`: one node of several brokers serving as one, coordinated
/// through the PostgreSQL of `[database]` (docs/CLUSTER.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Whether this broker is a cluster node. Default false: a broker on
    /// its own, which answers `nodes` and `locate` with an error.
    pub enabled: bool,
    /// The node's name, unique in the cluster and the same across restarts
    /// (owners are placed on it by name). Default `node-1`.
    pub node_id: String,
    /// `host:port` clients are redirected to for this node. Empty (the
    /// default): the address the listener bound, which must then be a
    /// specific address, not `0.0.0.0` or `[::]`.
    pub advertise: String,
    /// Seconds of heartbeat silence after which a node may lose its owners,
    /// 1 to 3600; the node heartbeats every third of it. Default 5.
    pub lease_secs: u64,
    /// `local` or `shared`. Default `local`.
    pub storage: ClusterStorage,
    /// With `storage = "shared"`: the directory every node reaches.
    /// Default empty.
    pub shared_dir: PathBuf,
    /// The PostgreSQL schema holding the cluster's tables (created if
    /// missing): one per cluster, so several can share a database.
    /// Lowercase letters, digits and `_`. Default `ciphermq_cluster`.
    pub schema: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            node_id: "node-1".to_owned(),
            advertise: String::new(),
            lease_secs: 5,
            storage: ClusterStorage::Local,
            shared_dir: PathBuf::new(),
            schema: "ciphermq_cluster".to_owned(),
        }
    }
}

/// `[admin]`: the address and the bounds of the connection limits.
fn validate_admin(admin: &AdminConfig) -> Result<(), ConfigError> {
    check_host_port("admin.address", &admin.address)?;
    if let Some(probe) = &admin.probe_address {
        // No certificate is asked for there: loopback only.
        let loopback = probe
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        if !loopback {
            return Err(ConfigError::invalid(
                "admin.probe_address",
                format!("{probe:?} is not a loopback ip:port (e.g. \"127.0.0.1:9092\"): it serves plain HTTP without client certificates"),
            ));
        }
        if !admin.enabled {
            return Err(ConfigError::invalid(
                "admin.probe_address",
                "is served by the admin endpoint: set admin.enabled = true too",
            ));
        }
        // Port 0 (any free port) differs each time it is bound.
        if *probe == admin.address && !probe.ends_with(":0") {
            return Err(ConfigError::invalid(
                "admin.probe_address",
                format!("{probe:?} is admin.address too; give the probes a port of their own"),
            ));
        }
    }
    if !(1..=MAX_ADMIN_CONNECTIONS).contains(&admin.max_connections) {
        return Err(ConfigError::invalid(
            "admin.max_connections",
            format!(
                "{} is not between 1 and {MAX_ADMIN_CONNECTIONS}",
                admin.max_connections
            ),
        ));
    }
    if !(1..=admin.max_connections).contains(&admin.max_connections_per_ip) {
        return Err(ConfigError::invalid(
            "admin.max_connections_per_ip",
            format!(
                "{} is not between 1 and admin.max_connections ({})",
                admin.max_connections_per_ip, admin.max_connections
            ),
        ));
    }
    for (key, secs) in [
        ("admin.header_timeout_secs", admin.header_timeout_secs),
        ("admin.idle_timeout_secs", admin.idle_timeout_secs),
        ("admin.response_timeout_secs", admin.response_timeout_secs),
    ] {
        if !(1..=MAX_ADMIN_TIMEOUT_SECS).contains(&secs) {
            return Err(ConfigError::invalid(
                key,
                format!("{secs} is not between 1 and {MAX_ADMIN_TIMEOUT_SECS}"),
            ));
        }
    }
    let max_series = ciphermq_admin::config::MAX_QUEUE_SERIES;
    if !(1..=max_series).contains(&admin.max_queue_series) {
        return Err(ConfigError::invalid(
            "admin.max_queue_series",
            format!(
                "{} is not between 1 and {max_series}",
                admin.max_queue_series
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// With the admin endpoint on, `admin.address` must not be the client
    /// port `server.address`: both listeners would bind it, and the second
    /// bind would fail with a bare "address in use" blamed on one key only.
    /// Port 0 (any free port) is never a clash; an unspecified IP
    /// (`0.0.0.0`, `[::]`) clashes with any IP of the same family on that
    /// port. Public, so the start can check again after `--address`.
    pub fn validate_admin_address(&self) -> Result<(), ConfigError> {
        let (admin, server) = (&self.admin.address, &self.server.address);
        if !self.admin.enabled || admin.ends_with(":0") || server.ends_with(":0") {
            return Ok(());
        }
        let clash = admin == server
            || match (admin.parse::<SocketAddr>(), server.parse::<SocketAddr>()) {
                (Ok(a), Ok(s)) => {
                    a.port() == s.port()
                        && a.is_ipv4() == s.is_ipv4()
                        && (a.ip() == s.ip() || a.ip().is_unspecified() || s.ip().is_unspecified())
                }
                _ => false,
            };
        if clash {
            return Err(ConfigError::invalid(
                "admin.address",
                format!(
                    "{admin:?} clashes with server.address ({server:?}): the admin endpoint \
                     and the client port each need a port of their own; change one of them"
                ),
            ));
        }
        Ok(())
    }
}

/// `[rate_limit]`: per-CN token buckets and connection caps (docs/ARCHITECTURE.md,
/// "Identity and access").
/// Reloaded on `SIGHUP`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Apply the token buckets below. Default false. (The connection caps
    /// apply either way.)
    pub enabled: bool,
    /// Commands per second per CN, any command (refill rate), > 0; a
    /// fraction is fine (`0.5` is one command every two seconds).
    /// Default 10 000.
    pub global_rps: f64,
    /// Commands a CN may send in a burst above `global_rps`, at least 1.
    /// A float with no fraction (`200.0`, as the reference wrote it) is
    /// taken as that whole number. Default 20 000.
    #[serde(deserialize_with = "whole_u32")]
    pub global_burst: u32,
    /// Publishes per second per CN (each also takes a global token), > 0;
    /// a fraction is fine. Default 10 000.
    pub publish_rps: f64,
    /// Publishes a CN may send in a burst above `publish_rps`, at least 1;
    /// a float with no fraction is accepted. Default 20 000.
    #[serde(deserialize_with = "whole_u32")]
    pub publish_burst: u32,
    /// Open connections per client IP address, at least 1, always enforced;
    /// a float with no fraction is accepted. Default 1000.
    #[serde(deserialize_with = "whole_u32")]
    pub max_connections_per_ip: u32,
    /// Open connections per certificate CN, at least 1, always enforced;
    /// a float with no fraction is accepted. Default 100.
    #[serde(deserialize_with = "whole_u32")]
    pub max_connections_per_cn: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            enabled: false,
            global_rps: 10_000.0,
            global_burst: 20_000,
            publish_rps: 10_000.0,
            publish_burst: 20_000,
            max_connections_per_ip: 1000,
            max_connections_per_cn: 100,
        }
    }
}

/// `[acl]`: role membership by certificate CN (docs/ARCHITECTURE.md, "Identity
/// and access"). A CN in several lists gets the first role of admin, sender,
/// receiver, monitor. Reloaded on `SIGHUP`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AclConfig {
    /// CNs with every permission. Default empty.
    pub admin_cns: Vec<String>,
    /// CNs that may publish and fetch public keys. Default empty.
    pub sender_cns: Vec<String>,
    /// CNs that may declare, bind and consume their own queues. Default empty.
    pub receiver_cns: Vec<String>,
    /// CNs that may read the admin endpoint (`/metrics`, `/api/*`) and do
    /// nothing else: give scrapers and dashboards these, not admin
    /// certificates. On the broker port they may only send heartbeats.
    /// Default empty.
    pub monitor_cns: Vec<String>,
    /// Whether every publish must name its sender in the body
    /// (`sender_client_id`, checked against the publisher's CN): without it a
    /// receiver cannot tell two senders' messages apart by more than their
    /// id. A publish without one is then `NACK <id> invalid`. Default false:
    /// a body that names its sender is checked either way.
    pub require_sender_id: bool,
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

impl Config {
    /// Reads, parses and fully validates the config file at `path`; relative
    /// paths inside it are resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base_dir = path.parent().unwrap_or_else(|| Path::new(""));
        Config::from_toml_str(&text, base_dir)
    }

    /// Parses and fully validates config text, including the filesystem checks;
    /// relative paths are resolved against `base_dir`. Logs each of
    /// [`Config::warnings`] with `tracing::warn!` (at start-up no subscriber
    /// is installed yet, so [`crate::logging::init`] logs them again).
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let config = Config::parse_unchecked(text, base_dir)?;
        config.validate_files()?;
        config.log_warnings();
        Ok(config)
    }

    /// Parses config text, resolves relative paths against `base_dir` and runs
    /// the semantic checks of [`Config::validate`], without touching the
    /// filesystem or the environment (see [`Config::validate_files`]).
    /// Legacy keys are translated or dropped ([`LEGACY_KEYS`]), each leaving
    /// one of [`Config::warnings`]; nothing is logged.
    pub fn parse_unchecked(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|err| ConfigError::Syntax {
            message: one_line(err.message()),
            at: position_of(text, err.span()),
        })?;
        let migration = migrate_legacy_keys(&mut table)?;
        // The translated table goes back through the text deserializer, whose
        // messages name types the way the file spells them; positions in
        // errors come from the original text.
        let translated = toml::to_string(&table).map_err(|err| ConfigError::Syntax {
            message: one_line(&err.to_string()),
            at: None,
        })?;
        let deserializer = toml::Deserializer::new(&translated);
        let mut config: Config = serde_path_to_error::deserialize(deserializer)
            .map_err(|err| parse_error(text, &migration, err))?;
        config.warnings = migration.warnings;
        config.resolve_paths(base_dir);
        config.validate()?;
        Ok(config)
    }

    /// One warning per legacy key the file used, in the order of
    /// [`LEGACY_KEYS`]: what replaced the key, or why it is not needed, and
    /// what became of its value. Empty for a current config.
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.warnings
    }

    /// Logs each of [`Config::warnings`] with `tracing::warn!`.
    pub fn log_warnings(&self) {
        for warning in &self.warnings {
            tracing::warn!(key = %warning.key, "config: {warning}");
        }
    }

    /// Joins every relative file path onto `base_dir`, so paths in the file mean
    /// "next to the config file" whatever the working directory. Empty paths stay
    /// empty so that validation reports them.
    fn resolve_paths(&mut self, base_dir: &Path) {
        let resolve = |p: &mut PathBuf| {
            if !p.as_os_str().is_empty() && p.is_relative() {
                *p = base_dir.join(&*p);
            }
        };
        resolve(&mut self.tls.cert_path);
        resolve(&mut self.tls.key_path);
        resolve(&mut self.tls.ca_cert_path);
        if let Some(p) = self.tls.crl_path.as_mut() {
            resolve(p);
        }
        resolve(&mut self.logging.dir);
        resolve(&mut self.storage.data_dir);
        if let Some(p) = self.database.password_file.as_mut() {
            resolve(p);
        }
        if let Some(p) = self.database.ca_cert_path.as_mut() {
            resolve(p);
        }
        if let Some(p) = self.encryption.aes_key_file.as_mut() {
            resolve(p);
        }
    }

    /// Semantic checks that need nothing but the parsed values: bounds, address
    /// formats, CN syntax, the inline AES key. Returns the first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_tls()?;
        self.validate_logging()?;
        self.validate_database()?;
        self.validate_encryption()?;
        self.validate_performance()?;
        self.validate_storage()?;
        validate_admin(&self.admin)?;
        self.validate_admin_address()?;
        self.validate_rate_limit()?;
        self.validate_acl()?;
        self.validate_cluster()
    }

    /// Checks that touch the filesystem and environment: the TLS files exist, the
    /// Postgres password file exists, and the AES key (from whichever source is
    /// used) decodes to 32 bytes.
    pub fn validate_files(&self) -> Result<(), ConfigError> {
        const PKI_HINT: &str = " (create the certificates with ciphermq-pki)";
        check_file("tls.cert_path", &self.tls.cert_path, PKI_HINT)?;
        check_file("tls.key_path", &self.tls.key_path, PKI_HINT)?;
        check_file("tls.ca_cert_path", &self.tls.ca_cert_path, PKI_HINT)?;
        if let Some(crl) = &self.tls.crl_path {
            check_file("tls.crl_path", crl, " (your CA publishes it)")?;
        }
        if self.database.backend == DatabaseBackend::Postgres {
            if let Some(p) = &self.database.password_file {
                check_file("database.password_file", p, "")?;
            }
            if let Some(p) = &self.database.ca_cert_path {
                check_file("database.ca_cert_path", p, "")?;
            }
        }
        self.resolve_aes_key().map(|_| ())
    }

    /// The PostgreSQL password: `database.password`, or the trimmed content
    /// of `database.password_file`, or none (trust or peer authentication).
    pub fn resolve_db_password(&self) -> Result<Option<String>, ConfigError> {
        let d = &self.database;
        if let Some(p) = &d.password {
            return Ok(Some(p.clone()));
        }
        let Some(path) = &d.password_file else {
            return Ok(None);
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(text.trim().to_owned())),
            Err(e) => Err(ConfigError::invalid(
                "database.password_file",
                format!("cannot read {}: {e}", path.display()),
            )),
        }
    }

    /// The AES-256 key sealing stored public keys, from the first source that is
    /// set: `encryption.aes_key`, `encryption.aes_key_file`, then the
    /// `CIPHERMQ_AES_KEY` environment variable. `None` when none is set.
    pub fn resolve_aes_key(&self) -> Result<Option<[u8; 32]>, ConfigError> {
        // A value that is not UTF-8 becomes replacement characters, which then
        // fail to decode as base64: reported only if the variable is the source.
        let env = std::env::var_os(ENV_AES_KEY);
        let env = env.as_deref().map(|v| v.to_string_lossy());
        self.encryption.resolve_aes_key_with_env(env.as_deref())
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        check_host_port("server.address", &s.address)?;
        if s.shards > MAX_SHARDS {
            return Err(ConfigError::invalid(
                "server.shards",
                format!("{} is more than {MAX_SHARDS} (0 = one per core)", s.shards),
            ));
        }
        if s.shutdown_timeout_secs > MAX_DURATION_SECS {
            return Err(ConfigError::invalid(
                "server.shutdown_timeout_secs",
                format!(
                    "{} is more than ten years; set 0 to wait for the drain however long it takes",
                    s.shutdown_timeout_secs
                ),
            ));
        }
        if s.name.is_empty() || s.name.len() > 255 || s.name.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                "server.name",
                "must be 1 to 255 bytes without control characters",
            ));
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        for (key, path) in [
            ("tls.cert_path", &self.tls.cert_path),
            ("tls.key_path", &self.tls.key_path),
            ("tls.ca_cert_path", &self.tls.ca_cert_path),
        ] {
            check_non_empty_path(key, path)?;
        }
        if let Some(crl) = &self.tls.crl_path {
            check_non_empty_path("tls.crl_path", crl)?;
        }
        check_uri_san_prefix(&self.tls.uri_san_prefix)
    }

    fn validate_logging(&self) -> Result<(), ConfigError> {
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

    fn validate_database(&self) -> Result<(), ConfigError> {
        let d = &self.database;
        if d.batch_size == 0 {
            return Err(ConfigError::invalid(
                "database.batch_size",
                "must be at least 1",
            ));
        }
        if d.flush_interval_ms == 0 {
            return Err(ConfigError::invalid(
                "database.flush_interval_ms",
                "must be at least 1",
            ));
        }
        if d.connect_timeout_secs == 0 {
            return Err(ConfigError::invalid(
                "database.connect_timeout_secs",
                "must be at least 1",
            ));
        }
        if d.backend != DatabaseBackend::Postgres {
            return Ok(());
        }
        for (key, value) in [
            ("database.host", &d.host),
            ("database.user", &d.user),
            ("database.dbname", &d.dbname),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::invalid(
                    key,
                    "must not be empty with backend = \"postgres\"",
                ));
            }
        }
        if d.port == 0 {
            return Err(ConfigError::invalid("database.port", "must not be 0"));
        }
        if d.password.is_some() && d.password_file.is_some() {
            return Err(ConfigError::invalid(
                "database.password",
                "set either database.password or database.password_file, not both",
            ));
        }
        if let Some(p) = &d.password_file {
            check_non_empty_path("database.password_file", p)?;
        }
        match (d.sslmode, &d.ca_cert_path) {
            (DatabaseSslMode::VerifyFull, None) => {
                return Err(ConfigError::invalid(
                    "database.ca_cert_path",
                    "required with database.sslmode = \"verify-full\": the PEM file of the CA \
                     that issued the PostgreSQL server's certificate",
                ))
            }
            (DatabaseSslMode::Disable | DatabaseSslMode::Prefer, Some(_)) => {
                return Err(ConfigError::invalid(
                    "database.ca_cert_path",
                    format!(
                        "set, but database.sslmode = \"{}\" never checks the server's \
                         certificate; use sslmode = \"verify-full\" (or \"require\"), or \
                         remove ca_cert_path",
                        d.sslmode.as_str()
                    ),
                ))
            }
            (_, Some(p)) => check_non_empty_path("database.ca_cert_path", p)?,
            _ => {}
        }
        Ok(())
    }

    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if !c.enabled {
            return Ok(());
        }
        if self.database.backend != DatabaseBackend::Postgres {
            return Err(ConfigError::invalid(
                "cluster.enabled",
                "a cluster is coordinated through PostgreSQL: set [database] backend = \"postgres\" \
                 (and its connection keys), or cluster.enabled = false",
            ));
        }
        if matches!(
            self.database.sslmode,
            DatabaseSslMode::Require | DatabaseSslMode::VerifyFull
        ) {
            return Err(ConfigError::invalid(
                "database.sslmode",
                format!(
                    "\"{}\" with cluster.enabled: the cluster coordinator's link to PostgreSQL \
                     does not speak TLS in this version, and is never downgraded silently; use \
                     sslmode = \"disable\" or \"prefer\" on a trusted network, or run the \
                     broker on its own",
                    self.database.sslmode.as_str()
                ),
            ));
        }
        if !ciphermq_proto::is_valid_name(&c.node_id) {
            return Err(ConfigError::invalid(
                "cluster.node_id",
                format!(
                    "{:?} is not a node id: 1 to 255 of A-Z a-z 0-9 _ . : -",
                    c.node_id
                ),
            ));
        }
        let listens_everywhere = self
            .server
            .address
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_unspecified());
        if c.advertise.is_empty() && listens_everywhere {
            return Err(ConfigError::invalid(
                "cluster.advertise",
                format!(
                    "required: server.address {} listens on every address, which is no \
                     address to send clients to; set advertise to this node's address as \
                     clients reach it (e.g. \"10.0.0.1:5700\")",
                    self.server.address
                ),
            ));
        }
        if !c.advertise.is_empty() {
            check_host_port("cluster.advertise", &c.advertise)?;
            let port = c.advertise.rsplit_once(':').map(|(_, port)| port);
            if port.and_then(|p| p.parse::<u16>().ok()) == Some(0) {
                return Err(ConfigError::invalid(
                    "cluster.advertise",
                    "port 0 is no address a client can be sent to; name the port clients \
                     connect to, or leave advertise empty to use the bound address",
                ));
            }
        }
        if !(1..=3600).contains(&c.lease_secs) {
            return Err(ConfigError::invalid(
                "cluster.lease_secs",
                format!("must be from 1 to 3600 (got {})", c.lease_secs),
            ));
        }
        if let Err(e) = (ciphermq_cluster::PgCoordinatorConfig {
            schema: c.schema.clone(),
            ..ciphermq_cluster::PgCoordinatorConfig::default()
        })
        .check_schema()
        {
            return Err(ConfigError::invalid("cluster.schema", e.to_string()));
        }
        match c.storage {
            ClusterStorage::Local => {
                if !c.shared_dir.as_os_str().is_empty() {
                    return Err(ConfigError::invalid(
                        "cluster.shared_dir",
                        "set, but cluster.storage = \"local\" does not use it; remove it or \
                         set storage = \"shared\"",
                    ));
                }
            }
            ClusterStorage::Shared => {
                if c.shared_dir.as_os_str().is_empty() {
                    return Err(ConfigError::invalid(
                        "cluster.shared_dir",
                        "empty, but cluster.storage = \"shared\" keeps every owner's queues \
                         there: set it to a directory every node reaches",
                    ));
                }
                if self.storage.mode != StorageMode::Durable {
                    return Err(ConfigError::invalid(
                        "cluster.storage",
                        "\"shared\" keeps queues on disk: it needs storage.mode = \"durable\"",
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_encryption(&self) -> Result<(), ConfigError> {
        let e = &self.encryption;
        if e.algorithm != ALGORITHM_X25519_CHACHA20_POLY1305 {
            return Err(ConfigError::invalid(
                "encryption.algorithm",
                format!(
                    "{:?} is not supported (the only algorithm is \"{ALGORITHM_X25519_CHACHA20_POLY1305}\")",
                    e.algorithm
                ),
            ));
        }
        if let Some(key) = &e.aes_key {
            decode_aes_key("encryption.aes_key", key)?;
        }
        if let Some(p) = &e.aes_key_file {
            check_non_empty_path("encryption.aes_key_file", p)?;
        }
        Ok(())
    }

    fn validate_performance(&self) -> Result<(), ConfigError> {
        let p = &self.performance;
        let at_least_one: [(&str, u64); 17] = [
            ("performance.max_queues_per_cn", p.max_queues_per_cn as u64),
            (
                "performance.max_exchanges_per_cn",
                p.max_exchanges_per_cn as u64,
            ),
            (
                "performance.max_bindings_per_cn",
                p.max_bindings_per_cn as u64,
            ),
            ("performance.max_fetch", u64::from(p.max_fetch)),
            ("performance.max_fetch_bytes", p.max_fetch_bytes as u64),
            ("performance.max_prefetch", u64::from(p.max_prefetch)),
            ("performance.max_prefetch_bytes", p.max_prefetch_bytes),
            (
                "performance.max_unacked_per_connection",
                p.max_unacked_per_connection as u64,
            ),
            ("performance.max_handshakes", u64::from(p.max_handshakes)),
            (
                "performance.max_handshakes_per_ip",
                u64::from(p.max_handshakes_per_ip),
            ),
            ("performance.max_queue_size", p.max_queue_size as u64),
            ("performance.max_message_bytes", p.max_message_bytes as u64),
            (
                "performance.handshake_timeout_secs",
                p.handshake_timeout_secs,
            ),
            ("performance.max_deliveries", u64::from(p.max_deliveries)),
            (
                "performance.default_prefetch",
                u64::from(p.default_prefetch),
            ),
            (
                "performance.max_pending_replies",
                p.max_pending_replies as u64,
            ),
            (
                "performance.max_batch_elements",
                p.max_batch_elements as u64,
            ),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if p.max_message_bytes > MAX_MESSAGE_BYTES_LIMIT {
            return Err(ConfigError::invalid(
                "performance.max_message_bytes",
                format!(
                    "{} is more than {MAX_MESSAGE_BYTES_LIMIT}, the largest body a queue log \
                     record can hold ({} MiB less the record's header and routing fields)",
                    p.max_message_bytes,
                    ciphermq_shard::log::record::MAX_RECORD_BYTES >> 20
                ),
            ));
        }
        if p.max_pending_reply_bytes < MIN_PENDING_REPLY_BYTES {
            return Err(ConfigError::invalid(
                "performance.max_pending_reply_bytes",
                format!("must be at least {MIN_PENDING_REPLY_BYTES}"),
            ));
        }
        if p.max_reply_bytes_per_turn < MIN_REPLY_BYTES_PER_TURN {
            return Err(ConfigError::invalid(
                "performance.max_reply_bytes_per_turn",
                format!(
                    "{} is less than {MIN_REPLY_BYTES_PER_TURN}: a connection would yield \
                     its shard after every few replies",
                    p.max_reply_bytes_per_turn
                ),
            ));
        }
        if p.max_line_bytes <= p.max_message_bytes {
            return Err(ConfigError::invalid(
                "performance.max_line_bytes",
                format!(
                    "must be larger than performance.max_message_bytes ({} <= {}; leave it \
                     unset for max_message_bytes + {LINE_OVERHEAD_BYTES})",
                    p.max_line_bytes, p.max_message_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Every duration within [`MAX_DURATION_SECS`], in its own unit.
    fn validate_durations(&self) -> Result<(), ConfigError> {
        let (p, d, s) = (&self.performance, &self.database, &self.storage);
        for (key, value, unit_per_sec) in [
            (
                "performance.handshake_timeout_secs",
                p.handshake_timeout_secs,
                1,
            ),
            ("performance.idle_timeout_secs", p.idle_timeout_sec, 1),
            ("performance.heartbeat_timeout_secs", p.heartbeat_timeout, 1),
            ("performance.dedup_window_secs", p.dedup_window_secs, 1),
            ("performance.ack_wait_secs", p.ack_wait_secs, 1),
            ("database.connect_timeout_secs", d.connect_timeout_secs, 1),
            ("database.flush_interval_ms", d.flush_interval_ms, 1_000),
            (
                "storage.max_commit_delay_us",
                s.max_commit_delay_us,
                1_000_000,
            ),
        ] {
            if value / unit_per_sec > MAX_DURATION_SECS {
                return Err(ConfigError::invalid(
                    key,
                    format!("{value} is more than ten years; nothing sensible waits that long"),
                ));
            }
        }
        Ok(())
    }

    fn validate_storage(&self) -> Result<(), ConfigError> {
        let s = &self.storage;
        check_non_empty_path("storage.data_dir", &s.data_dir)?;
        self.validate_durations()?;
        if s.segment_bytes > MAX_SEGMENT_BYTES {
            return Err(ConfigError::invalid(
                "storage.segment_bytes",
                format!(
                    "must be at most {MAX_SEGMENT_BYTES} (1 GiB; got {}): recovery reads a \
                     segment whole",
                    s.segment_bytes
                ),
            ));
        }
        if s.segment_bytes < MIN_SEGMENT_BYTES {
            return Err(ConfigError::invalid(
                "storage.segment_bytes",
                format!(
                    "must be at least {MIN_SEGMENT_BYTES} (got {})",
                    s.segment_bytes
                ),
            ));
        }
        if !(1..=MAX_MEMORY_BUDGET_MB).contains(&s.memory_budget_mb) {
            return Err(ConfigError::invalid(
                "storage.memory_budget_mb",
                format!(
                    "must be from 1 to {MAX_MEMORY_BUDGET_MB} MiB (got {})",
                    s.memory_budget_mb
                ),
            ));
        }
        Ok(())
    }

    fn validate_rate_limit(&self) -> Result<(), ConfigError> {
        let r = &self.rate_limit;
        for (key, rps) in [
            ("rate_limit.global_rps", r.global_rps),
            ("rate_limit.publish_rps", r.publish_rps),
        ] {
            if !(rps.is_finite() && rps > 0.0) {
                return Err(ConfigError::invalid(
                    key,
                    format!("must be a positive number (got {rps})"),
                ));
            }
        }
        for (key, value) in [
            ("rate_limit.global_burst", r.global_burst),
            ("rate_limit.publish_burst", r.publish_burst),
            (
                "rate_limit.max_connections_per_ip",
                r.max_connections_per_ip,
            ),
            (
                "rate_limit.max_connections_per_cn",
                r.max_connections_per_cn,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        Ok(())
    }

    fn validate_acl(&self) -> Result<(), ConfigError> {
        for (list, cns) in [
            ("acl.admin_cns", &self.acl.admin_cns),
            ("acl.sender_cns", &self.acl.sender_cns),
            ("acl.receiver_cns", &self.acl.receiver_cns),
            ("acl.monitor_cns", &self.acl.monitor_cns),
        ] {
            for (i, cn) in cns.iter().enumerate() {
                // The wire protocol's name rule: a CN names queues and keys.
                if !ciphermq_proto::is_valid_name(cn) {
                    return Err(ConfigError::invalid(
                        format!("{list}[{i}]"),
                        format!(
                            "{cn:?} is not a valid CN (must match [A-Za-z0-9_.:-]{{1,255}}, and not be \".\" or \"..\")"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Legacy keys
// ---------------------------------------------------------------------------

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
struct Migration {
    /// One per legacy key found.
    warnings: Vec<ConfigWarning>,
    /// `(new dotted key, old dotted key)` for each renamed key found, so that
    /// an error about the value names the key the file has.
    renamed: Vec<(String, String)>,
}

/// Removes every legacy key from `table`, moving renamed keys' values to
/// their new names and turning the reference's log file paths into
/// `logging.dir`; one warning per key. Errors for values no translation can
/// keep (`connection_type = "tcp"`) and for a key set under both names.
fn migrate_legacy_keys(table: &mut toml::Table) -> Result<Migration, ConfigError> {
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

impl EncryptionConfig {
    /// [`Config::resolve_aes_key`] with the environment variable's value passed in,
    /// so it can be tested without touching the process environment.
    fn resolve_aes_key_with_env(&self, env: Option<&str>) -> Result<Option<[u8; 32]>, ConfigError> {
        if let Some(key) = &self.aes_key {
            return decode_aes_key("encryption.aes_key", key).map(Some);
        }
        if let Some(path) = &self.aes_key_file {
            let text = std::fs::read_to_string(path).map_err(|err| {
                ConfigError::invalid(
                    "encryption.aes_key_file",
                    format!("cannot read {}: {err}", path.display()),
                )
            })?;
            return decode_aes_key("encryption.aes_key_file", &text)
                .map_err(|_| {
                    ConfigError::invalid(
                        "encryption.aes_key_file",
                        format!("{} must hold base64 of exactly 32 bytes", path.display()),
                    )
                })
                .map(Some);
        }
        match env.map(str::trim) {
            Some(value) if !value.is_empty() => decode_aes_key(&env_key(), value).map(Some),
            _ => Ok(None),
        }
    }
}

fn env_key() -> String {
    format!("{ENV_AES_KEY} (environment)")
}

/// Decodes standard padded base64 into exactly 32 bytes. The error never echoes
/// the input: it is a secret.
fn decode_aes_key(key: &str, value: &str) -> Result<[u8; 32], ConfigError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| {
            ConfigError::invalid(
                key,
                "must be base64 of exactly 32 bytes (it is not standard padded base64)",
            )
        })?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        ConfigError::invalid(
            key,
            format!(
                "must be base64 of exactly 32 bytes (it decodes to {} bytes)",
                bytes.len()
            ),
        )
    })
}

/// `tls.uri_san_prefix`: a URI's start (a scheme, then anything) ending
/// where a name begins, at `/` or `:`, so that `spiffe://ciphermq` cannot
/// also match `spiffe://ciphermq-other/...`. Checked whatever
/// `tls.identity` is, so switching it on later cannot fail on this.
fn check_uri_san_prefix(prefix: &str) -> Result<(), ConfigError> {
    let key = "tls.uri_san_prefix";
    if prefix.is_empty() || prefix.len() > 1024 {
        return Err(ConfigError::invalid(key, "must be 1 to 1024 bytes"));
    }
    if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::invalid(
            key,
            format!("{prefix:?} must be printable ASCII without spaces"),
        ));
    }
    let scheme = prefix.split(':').next().unwrap_or_default();
    let has_scheme = prefix.contains(':')
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !has_scheme {
        return Err(ConfigError::invalid(
            key,
            format!("{prefix:?} must start with a URI scheme, e.g. \"{DEFAULT_URI_SAN_PREFIX}\""),
        ));
    }
    if !prefix.ends_with(['/', ':']) {
        return Err(ConfigError::invalid(
            key,
            format!("{prefix:?} must end with '/' or ':', where the client id begins"),
        ));
    }
    Ok(())
}

/// Accepts `ip:port`, `[ipv6]:port` and `hostname:port` (port 0 allowed).
fn check_host_port(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let ok = value.rsplit_once(':').is_some_and(|(host, port)| {
        port.parse::<u16>().is_ok()
            && !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            format!("{value:?} is not host:port (e.g. \"127.0.0.1:5700\" or \"[::1]:5700\")"),
        ))
    }
}

fn check_non_empty_path(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        Err(ConfigError::invalid(key, "must not be empty"))
    } else {
        Ok(())
    }
}

/// Checks that `path` is an existing regular file; `hint` (e.g. how to create
/// it) is appended when it does not exist.
fn check_file(key: &str, path: &Path, hint: &str) -> Result<(), ConfigError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(ConfigError::invalid(
            key,
            format!("{} is not a regular file", path.display()),
        )),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(ConfigError::invalid(
            key,
            format!("file {} does not exist{hint}", path.display()),
        )),
        Err(err) => Err(ConfigError::invalid(
            key,
            format!("cannot access {}: {err}", path.display()),
        )),
    }
}

/// One line per error: the broker prints it as a single log/stderr line.
fn one_line(message: &str) -> String {
    message.trim_end().replace('\n', "; ")
}

/// Turns a deserialization error into a [`ConfigError`] naming the dotted key
/// as the file spells it (the old name of a renamed key), at its position in
/// `text`.
fn parse_error(
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

/// A whole number for a `u32` key. Besides integers it takes a float with no
/// fraction (`200.0`, as the reference CipherMQ wrote its bursts); a float
/// with one is an error naming the value.
fn whole_u32<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    struct WholeVisitor;
    impl serde::de::Visitor<'_> for WholeVisitor {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a whole number from 0 to {}", u32::MAX)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u32, E> {
            u32::try_from(v)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<u32, E> {
            if v.is_finite() && v.fract() != 0.0 {
                return Err(E::custom(format_args!(
                    "{v} is not a whole number (it counts commands or connections; write {} or {})",
                    v.floor(),
                    v.ceil()
                )));
            }
            if !(0.0..=f64::from(u32::MAX)).contains(&v) {
                return Err(E::invalid_value(serde::de::Unexpected::Float(v), &self));
            }
            // Whole and in range: the conversion is exact.
            Ok(v as u32)
        }
    }
    deserializer.deserialize_any(WholeVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const B64_32: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_unchecked(text, Path::new("/etc/ciphermq"))
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("expected an error for {text:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_file_gives_defaults_with_resolved_paths() {
        let c = parse("").unwrap();
        let mut want = Config::default();
        want.tls.cert_path = PathBuf::from("/etc/ciphermq/certs/server.crt");
        want.tls.key_path = PathBuf::from("/etc/ciphermq/certs/server.key");
        want.tls.ca_cert_path = PathBuf::from("/etc/ciphermq/certs/ca.crt");
        want.logging.dir = PathBuf::from("/etc/ciphermq/logs");
        want.storage.data_dir = PathBuf::from("/etc/ciphermq/data");
        assert_eq!(c, want);
    }

    #[test]
    fn default_values() {
        let c = Config::default();
        assert_eq!(c.server.address, "127.0.0.1:5700");
        assert_eq!(c.server.shards, 0);
        assert_eq!(c.server.name, "ciphermq");
        assert_eq!(c.server.shutdown_timeout_secs, 30);
        assert_eq!(c.tls.cert_path, PathBuf::from("certs/server.crt"));
        assert_eq!(c.logging.level, "info");
        assert_eq!(c.logging.rotation, LogRotation::Daily);
        assert_eq!(c.logging.console, Console::Auto);
        assert!(!c.logging.json_files);
        assert_eq!(c.logging.max_log_files, 14);
        assert_eq!(c.database.backend, DatabaseBackend::Embedded);
        assert_eq!(c.database.port, 5432);
        assert_eq!(c.database.batch_size, 1000);
        assert_eq!(c.database.flush_interval_ms, 50);
        assert_eq!(c.encryption.algorithm, "x25519_chacha20_poly1305");
        assert_eq!(c.encryption.aes_key, None);
        assert_eq!(c.performance.max_queue_size, 1_000_000);
        assert_eq!(c.performance.max_message_bytes, 1_048_576);
        assert_eq!(c.performance.max_line_bytes, 1_048_576 + 4096);
        assert_eq!(c.performance.handshake_timeout_secs, 10);
        assert_eq!(c.performance.idle_timeout_sec, 300);
        assert_eq!(c.performance.heartbeat_timeout, 60);
        assert_eq!(c.performance.dedup_window_secs, 120);
        assert_eq!(c.performance.ack_wait_secs, 300);
        assert_eq!(c.performance.max_deliveries, 10);
        assert_eq!(c.performance.default_prefetch, 1000);
        assert_eq!(c.performance.max_pending_replies, 65_536);
        assert_eq!(c.performance.max_handshakes, 1024);
        assert_eq!(c.performance.max_handshakes_per_ip, 64);
        assert_eq!(c.storage.mode, StorageMode::Durable);
        assert_eq!(c.storage.segment_bytes, 67_108_864);
        assert_eq!(c.storage.max_commit_delay_us, 0);
        assert_eq!(c.storage.min_free_mb, 256);
        assert!(!c.admin.enabled);
        assert_eq!(c.admin.address, "127.0.0.1:9091");
        assert_eq!(c.admin.max_connections, 64);
        assert_eq!(c.admin.max_connections_per_ip, 8);
        assert_eq!(c.admin.header_timeout_secs, 5);
        assert_eq!(c.admin.idle_timeout_secs, 10);
        assert_eq!(c.admin.response_timeout_secs, 10);
        assert!(!c.admin.queue_metrics);
        assert_eq!(c.admin.max_queue_series, 100);
        assert!(!c.rate_limit.enabled);
        assert_eq!(c.rate_limit.global_rps, 10_000.0);
        assert_eq!(c.rate_limit.global_burst, 20_000);
        assert_eq!(c.rate_limit.max_connections_per_ip, 1000);
        assert_eq!(c.rate_limit.max_connections_per_cn, 100);
        assert!(c.acl.admin_cns.is_empty());
        c.validate().unwrap();
    }

    #[test]
    fn unknown_key_names_the_dotted_key() {
        let e = err("[server]\nadress = \"127.0.0.1:1\"\n");
        assert!(e.starts_with("unknown key server.adress"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("address"), "{e}");
        let e = err("[servre]\n");
        assert!(e.starts_with("unknown key servre"), "{e}");
        let e = err("[performance]\nmax_line_byte = 5\n");
        assert!(
            e.starts_with("unknown key performance.max_line_byte"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_names_the_dotted_key() {
        let e = err("[performance]\nmax_queue_size = \"x\"\n");
        assert!(
            e.starts_with(
                r#"performance.max_queue_size: invalid type: string "x", expected usize"#
            ),
            "{e}"
        );
        let e = err("[database]\nport = 70000\n");
        assert!(e.starts_with("database.port: invalid value"), "{e}");
        let e = err("[logging]\nrotation = \"weekly\"\n");
        assert!(
            e.starts_with("logging.rotation: unknown variant `weekly`"),
            "{e}"
        );
        let e = err("[acl]\nsender_cns = [\"a\", 3]\n");
        assert!(e.starts_with("acl.sender_cns[1]: invalid type"), "{e}");
    }

    #[test]
    fn admin_address_may_not_be_the_server_address() {
        for (server, admin) in [
            ("127.0.0.1:5700", "127.0.0.1:5700"),
            ("localhost:9091", "localhost:9091"),
            ("0.0.0.0:9091", "127.0.0.1:9091"),
            ("127.0.0.1:9091", "0.0.0.0:9091"),
            ("[::1]:9091", "[::]:9091"),
        ] {
            let text = format!(
                "[server]\naddress = \"{server}\"\n[admin]\nenabled = true\naddress = \"{admin}\"\n"
            );
            let e = err(&text);
            assert!(
                e.starts_with("admin.address: ")
                    && e.contains("server.address")
                    && e.contains(admin)
                    && e.contains("a port of their own"),
                "{e}"
            );
        }
        for (server, admin, enabled) in [
            // Off: nothing binds admin.address.
            ("127.0.0.1:9091", "127.0.0.1:9091", false),
            // Port 0 is a different free port each time.
            ("127.0.0.1:0", "127.0.0.1:0", true),
            // Other IPs, other ports, other families.
            ("127.0.0.1:9091", "127.0.0.2:9091", true),
            ("127.0.0.1:5700", "127.0.0.1:9091", true),
            ("0.0.0.0:9091", "[::1]:9091", true),
        ] {
            let text = format!(
                "[server]\naddress = \"{server}\"\n[admin]\nenabled = {enabled}\naddress = \"{admin}\"\n"
            );
            assert!(parse(&text).is_ok(), "{text}");
        }
        // The start checks again after `--address` overrode server.address.
        let mut c = parse("[admin]\nenabled = true\n").unwrap();
        c.server.address = c.admin.address.clone();
        let e = c.validate_admin_address().unwrap_err();
        assert_eq!(e.key(), Some("admin.address"), "{e}");
    }

    #[test]
    fn syntax_error_is_reported_with_position() {
        let e = parse("[server\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { at: Some(_), .. }), "{e}");
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn cluster_settings_are_checked_only_when_enabled_and_say_what_to_change() {
        let pg = "[database]\nbackend = \"postgres\"\nsslmode = \"disable\"\n";
        // Off: nothing in [cluster] is looked at beyond its types.
        let c = parse("[cluster]\nnode_id = \"bad id\"").unwrap();
        assert!(!c.cluster.enabled);
        let c = parse(&format!(
            "{pg}[cluster]\nenabled = true\nnode_id = \"node-2\"\nadvertise = \"10.0.0.2:5700\""
        ))
        .unwrap();
        assert_eq!(c.cluster.node_id, "node-2");
        assert_eq!(c.cluster.lease_secs, 5);
        assert_eq!(c.cluster.schema, "ciphermq_cluster");
        let e = err("[cluster]\nenabled = true");
        assert!(
            e.starts_with("cluster.enabled:") && e.contains("backend = \"postgres\""),
            "{e}"
        );
        for (keys, key, why) in [
            ("node_id = \"a b\"", "cluster.node_id:", "is not a node id"),
            ("node_id = \"\"", "cluster.node_id:", "is not a node id"),
            (
                "advertise = \"nowhere\"",
                "cluster.advertise:",
                "is not host:port",
            ),
            ("advertise = \"10.0.0.1:0\"", "cluster.advertise:", "port 0"),
            ("lease_secs = 0", "cluster.lease_secs:", "from 1 to 3600"),
            ("lease_secs = 3601", "cluster.lease_secs:", "from 1 to 3600"),
            ("schema = \"Bad-Name\"", "cluster.schema:", "lowercase"),
            (
                "shared_dir = \"/mnt/x\"",
                "cluster.shared_dir:",
                "does not use it",
            ),
            ("storage = \"shared\"", "cluster.shared_dir:", "empty"),
        ] {
            let e = err(&format!("{pg}[cluster]\nenabled = true\n{keys}"));
            assert!(e.starts_with(key) && e.contains(why), "{keys}: {e}");
        }
        let e = err(&format!(
            "[server]\naddress = \"0.0.0.0:5700\"\n{pg}[cluster]\nenabled = true"
        ));
        assert!(
            e.starts_with("cluster.advertise: required") && e.contains("0.0.0.0:5700"),
            "{e}"
        );
        assert!(parse(&format!(
            "[server]\naddress = \"0.0.0.0:5700\"\n{pg}[cluster]\nenabled = true\nadvertise = \"10.0.0.1:5700\""
        ))
        .is_ok());
        let shared = parse(&format!(
            "{pg}[cluster]\nenabled = true\nstorage = \"shared\"\nshared_dir = \"/mnt/x\""
        ))
        .unwrap();
        assert_eq!(shared.cluster.storage, ClusterStorage::Shared);
        let e = err(&format!(
            "[storage]\nmode = \"memory\"\n{pg}[cluster]\nenabled = true\nstorage = \"shared\"\nshared_dir = \"/mnt/x\""
        ));
        assert!(
            e.starts_with("cluster.storage:") && e.contains("durable"),
            "{e}"
        );
        let e = err("[cluster]\nstorage = \"nfs\"");
        assert!(e.starts_with("cluster.storage:"), "{e}");
        let e = err(
            "[database]\nbackend = \"postgres\"\nsslmode = \"require\"\n[cluster]\nenabled = true",
        );
        assert!(
            e.starts_with("database.sslmode:") && e.contains("does not speak TLS"),
            "{e}"
        );
    }

    #[test]
    fn semantic_errors_name_the_key() {
        let e = err("[server]\naddress = \"x\"\n");
        assert!(
            e.starts_with(r#"server.address: "x" is not host:port"#),
            "{e}"
        );
        assert!(parse("[server]\naddress = \"[::1]:0\"").is_ok());
        assert!(parse("[server]\naddress = \"localhost:5700\"").is_ok());
        assert!(parse("[server]\naddress = \"localhost:70000\"").is_err());
        assert!(err("[server]\nshards = 1025").starts_with("server.shards:"));
        assert!(parse("[server]\nshutdown_timeout_secs = 0").is_ok());
        let e = err("[server]\nshutdown_timeout_secs = 999999999999");
        assert!(
            e.starts_with("server.shutdown_timeout_secs: 999999999999 is more than ten years"),
            "{e}"
        );
        let e = err("[server]\nshutdown_timeout_secs = -1");
        assert!(e.starts_with("server.shutdown_timeout_secs: "), "{e}");
        let e = err("[server]\nshutdown_timeout_secs = \"30s\"");
        assert!(e.starts_with("server.shutdown_timeout_secs: "), "{e}");
        assert!(err("[admin]\naddress = \"nope\"").starts_with("admin.address:"));
        for (probe, why) in [
            ("0.0.0.0:9092", "is not a loopback"),
            ("10.0.0.1:9092", "is not a loopback"),
            ("localhost:9092", "is not a loopback"),
            ("127.0.0.1:9091", "is admin.address too"),
        ] {
            let e = err(&format!(
                "[admin]\nenabled = true\nprobe_address = \"{probe}\""
            ));
            assert!(
                e.starts_with("admin.probe_address:") && e.contains(why),
                "{e}"
            );
        }
        let e = err("[admin]\nprobe_address = \"127.0.0.1:9092\"");
        assert!(e.contains("admin.enabled = true"), "{e}");
        let c = parse("[admin]\nenabled = true\nprobe_address = \"[::1]:9092\"").unwrap();
        assert_eq!(c.admin.probe_address.as_deref(), Some("[::1]:9092"));
        for (bad, key) in [
            ("max_connections = 0", "admin.max_connections:"),
            ("max_connections = 4097", "admin.max_connections:"),
            (
                "max_connections_per_ip = 0",
                "admin.max_connections_per_ip:",
            ),
            (
                "max_connections = 4\nmax_connections_per_ip = 5",
                "admin.max_connections_per_ip:",
            ),
            ("header_timeout_secs = 0", "admin.header_timeout_secs:"),
            ("idle_timeout_secs = 3601", "admin.idle_timeout_secs:"),
            ("response_timeout_secs = 0", "admin.response_timeout_secs:"),
            ("max_queue_series = 0", "admin.max_queue_series:"),
            ("max_queue_series = 10001", "admin.max_queue_series:"),
        ] {
            let e = err(&format!("[admin]\n{bad}"));
            assert!(e.starts_with(key), "{bad}: {e}");
        }
        assert!(parse("[admin]\nmax_connections = 4096\nmax_connections_per_ip = 4096").is_ok());
        assert_eq!(
            err("[admin]\nqueue_metrics = true\nmax_queue_series = 0"),
            "admin.max_queue_series: 0 is not between 1 and 10000"
        );
        for max in [1, 10_000] {
            let c = parse(&format!(
                "[admin]\nqueue_metrics = true\nmax_queue_series = {max}"
            ))
            .unwrap();
            assert_eq!(
                c.admin.queue_series(),
                ciphermq_admin::config::QueueSeries { enabled: true, max }
            );
        }
        assert!(err("[admin]\nqueue_metrics = 1").starts_with("admin.queue_metrics: invalid type"));
        assert_eq!(
            err("[rate_limit]\nglobal_burst = 0"),
            "rate_limit.global_burst: must be at least 1"
        );
        assert!(err("[rate_limit]\npublish_rps = 0.0").starts_with("rate_limit.publish_rps:"));
        assert!(err("[performance]\nmax_deliveries = 0").starts_with("performance.max_deliveries:"));
        assert!(err("[performance]\nmax_pending_replies = 0")
            .starts_with("performance.max_pending_replies:"));
        assert!(err("[storage]\nsegment_bytes = 4095").starts_with("storage.segment_bytes:"));
        assert!(err("[storage]\nsegment_bytes = 1073741825").starts_with("storage.segment_bytes:"));
        // Durations a deadline could not hold are refused, not a panic later.
        for key in [
            "[performance]\nack_wait_secs = 9223372036854775807",
            "[performance]\nidle_timeout_sec = 9223372036854775807",
            "[database]\nflush_interval_ms = 9223372036854775807",
        ] {
            assert!(err(key).contains("more than ten years"), "{key}");
        }
        assert!(err("[encryption]\nalgorithm = \"aes\"").starts_with("encryption.algorithm:"));
        assert!(err("[logging]\nlevel = \"loud\"").starts_with("logging.level:"));
        assert!(parse("[logging]\nlevel = \"info,ciphermq_shard=debug\"").is_ok());
        assert!(parse("[logging]\nlevel = \"DEBUG\"").is_ok());
    }

    #[test]
    fn legacy_keys_translate_with_one_warning_each() {
        let c = parse(
            "[server]\nconnection_type = \"tls\"\n\
             [performance]\nidle_timeout_sec = 7\nheartbeat_timeout = 8\ncleanup_interval = 3000\n",
        )
        .unwrap();
        assert_eq!(c.performance.idle_timeout_sec, 7);
        assert_eq!(c.performance.heartbeat_timeout, 8);
        let keys: Vec<&str> = c.warnings().iter().map(|w| w.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "server.connection_type",
                "performance.heartbeat_timeout",
                "performance.idle_timeout_sec",
                "performance.cleanup_interval"
            ]
        );
        assert!(c.warnings()[2]
            .to_string()
            .starts_with("performance.idle_timeout_sec: renamed performance.idle_timeout_secs"));
        // The current names load silently.
        let c =
            parse("[performance]\nidle_timeout_secs = 7\nheartbeat_timeout_secs = 8\n").unwrap();
        assert!(c.warnings().is_empty());
        assert_eq!(c.performance.idle_timeout_sec, 7);
        // Both names at once is ambiguous.
        let e = err("[performance]\nidle_timeout_sec = 7\nidle_timeout_secs = 8\n");
        assert!(
            e.starts_with(
                "performance.idle_timeout_sec: is the old name of performance.idle_timeout_secs"
            ),
            "{e}"
        );
        // Only "tls" is what the broker does.
        let e = err("[server]\nconnection_type = \"tcp\"\n");
        assert!(
            e.starts_with("server.connection_type: \"tcp\" is not supported"),
            "{e}"
        );
        // A legacy key in another section is just unknown.
        let e = err("[server]\nmax_size_mb = 50\n");
        assert!(e.starts_with("unknown key server.max_size_mb"), "{e}");
    }

    #[test]
    fn errors_after_a_translation_name_the_key_as_written_and_where() {
        // A bad value under an old name is reported under that name.
        let e = err("[performance]\nidle_timeout_sec = \"x\"\n");
        assert!(
            e.starts_with("performance.idle_timeout_sec: invalid type: string \"x\", expected u64 (at line 2, column 20)"),
            "{e}"
        );
        // Positions stay those of the file, legacy keys or not.
        let e = err("[server]\nconnection_type = \"tls\"\n\n[acl]\nsender_cns = [\"a\", 3]\n");
        assert!(e.starts_with("acl.sender_cns[1]: invalid type"), "{e}");
        assert!(e.ends_with("(at line 5, column 20)"), "{e}");
        let e = err("[logging]\nmax_size_mb = 1\nconsole = \"yes\"\n");
        assert!(
            e.starts_with(
                r#"logging.console: invalid value: string "yes", expected true, false or "auto""#
            ),
            "{e}"
        );
        assert!(e.ends_with("(at line 3, column 11)"), "{e}");
        let e = err("[performance]\ncleanup_interval = 1\n max_queue_sise = 1\n");
        assert!(
            e.starts_with("unknown key performance.max_queue_sise (at line 3, column 2)"),
            "{e}"
        );
    }

    #[test]
    fn reference_log_file_paths_become_logging_dir() {
        let text =
            "[logging]\ninfo_file_path = \"var/info.log\"\nerror_file_path = \"var/error.log\"\n";
        let c = parse(text).unwrap();
        assert_eq!(c.logging.dir, PathBuf::from("/etc/ciphermq/var"));
        assert!(c.logging.json_files);
        assert_eq!(c.warnings().len(), 2);
        assert!(c.warnings()[0]
            .message
            .contains("logging.dir = \"var\" is taken from it"));
        // An explicit dir or json_files wins; different directories are not guessed.
        let c = parse("[logging]\ninfo_file_path = \"a/i.log\"\ndir = \"b\"\njson_files = false\n")
            .unwrap();
        assert_eq!(c.logging.dir, PathBuf::from("/etc/ciphermq/b"));
        assert!(!c.logging.json_files);
        let c = parse("[logging]\ninfo_file_path = \"a/i.log\"\ndebug_file_path = \"d.log\"\n")
            .unwrap();
        assert_eq!(c.logging.dir, PathBuf::from("/etc/ciphermq/logs"));
        assert!(
            c.warnings()[0]
                .message
                .contains("different directories (a, .)"),
            "{:?}",
            c.warnings()
        );
        let e = err("[logging]\ninfo_file_path = 3\n");
        assert!(
            e.starts_with("logging.info_file_path: 3 is not a file path"),
            "{e}"
        );
    }

    #[test]
    fn console_is_true_false_or_auto() {
        for (text, want) in [
            ("", Console::Auto),
            ("console = \"auto\"", Console::Auto),
            ("console = true", Console::On),
            ("console = false", Console::Off),
        ] {
            assert_eq!(
                parse(&format!("[logging]\n{text}"))
                    .unwrap()
                    .logging
                    .console,
                want
            );
        }
        assert!(err("[logging]\nconsole = 1").starts_with("logging.console: invalid type"));
    }

    #[test]
    fn bursts_take_whole_floats_and_rates_take_fractions() {
        let c = parse("[rate_limit]\nglobal_burst = 200.0\npublish_burst = 7\nglobal_rps = 0.5\npublish_rps = 3\nmax_connections_per_ip = 5e1\n").unwrap();
        assert_eq!(c.rate_limit.global_burst, 200);
        assert_eq!(c.rate_limit.publish_burst, 7);
        assert_eq!(c.rate_limit.global_rps, 0.5);
        assert_eq!(c.rate_limit.publish_rps, 3.0);
        assert_eq!(c.rate_limit.max_connections_per_ip, 50);
        let e = err("[rate_limit]\nglobal_burst = 200.5\n");
        assert!(
            e.starts_with("rate_limit.global_burst: 200.5 is not a whole number"),
            "{e}"
        );
        for bad in ["-1", "-1.0", "4294967296", "4294967296.0", "inf", "nan"] {
            let e = err(&format!("[rate_limit]\nmax_connections_per_cn = {bad}\n"));
            assert!(
                e.starts_with("rate_limit.max_connections_per_cn: invalid value"),
                "{bad}: {e}"
            );
        }
        assert!(err("[rate_limit]\npublish_burst = \"5\"")
            .starts_with("rate_limit.publish_burst: invalid type"));
    }

    #[test]
    fn max_message_bytes_is_capped_by_the_log_record_size() {
        // The arithmetic of the doc comment, spelled out.
        assert_eq!(
            MAX_MESSAGE_BYTES_LIMIT,
            64 * 1024 * 1024 - 16 - 16 - 4 * 257
        );
        let at_limit = format!("[performance]\nmax_message_bytes = {MAX_MESSAGE_BYTES_LIMIT}\n");
        let c = parse(&at_limit).unwrap();
        assert_eq!(c.performance.max_message_bytes, MAX_MESSAGE_BYTES_LIMIT);
        let over = MAX_MESSAGE_BYTES_LIMIT + 1;
        let e = err(&format!("[performance]\nmax_message_bytes = {over}\n"));
        assert!(
            e.starts_with(&format!(
                "performance.max_message_bytes: {over} is more than {MAX_MESSAGE_BYTES_LIMIT}"
            )),
            "{e}"
        );
    }

    #[test]
    fn max_line_bytes_is_derived_and_checked() {
        let c = parse("[performance]\nmax_message_bytes = 1000\n").unwrap();
        assert_eq!(c.performance.max_line_bytes, 1000 + 4096);
        let c = parse("[performance]\nmax_message_bytes = 1000\nmax_line_bytes = 1001\n").unwrap();
        assert_eq!(c.performance.max_line_bytes, 1001);
        let e = err("[performance]\nmax_line_bytes = 1048576\n");
        assert!(
            e.starts_with(
                "performance.max_line_bytes: must be larger than performance.max_message_bytes"
            ),
            "{e}"
        );
    }

    #[test]
    fn postgres_rules() {
        let e = err("[database]\nbackend = \"postgres\"\nhost = \"\"\n");
        assert!(e.starts_with("database.host: must not be empty"), "{e}");
        let e =
            err("[database]\nbackend = \"postgres\"\npassword = \"a\"\npassword_file = \"p\"\n");
        assert!(e.starts_with("database.password:"), "{e}");
        // Embedded ignores the connection keys.
        assert!(parse("[database]\nhost = \"\"\n").is_ok());
        let c = parse("[database]\nbackend = \"postgres\"\npassword_file = \"pw\"\n").unwrap();
        assert_eq!(
            c.database.password_file,
            Some(PathBuf::from("/etc/ciphermq/pw"))
        );
    }

    #[test]
    fn postgres_tls_rules() {
        assert_eq!(parse("").unwrap().database.sslmode, DatabaseSslMode::Prefer);
        let e = err("[database]\nsslmode = \"verify-ca\"\n");
        assert!(
            e.starts_with("database.sslmode: unknown variant `verify-ca`"),
            "{e}"
        );
        let e = err("[database]\nbackend = \"postgres\"\nsslmode = \"verify-full\"\n");
        assert!(
            e.starts_with(
                "database.ca_cert_path: required with database.sslmode = \"verify-full\""
            ),
            "{e}"
        );
        let e = err("[database]\nbackend = \"postgres\"\nca_cert_path = \"pg-ca.crt\"\n");
        assert!(
            e.starts_with("database.ca_cert_path: set, but database.sslmode = \"prefer\""),
            "{e}"
        );
        let e =
            err("[database]\nbackend = \"postgres\"\nsslmode = \"require\"\nca_cert_path = \"\"\n");
        assert!(
            e.starts_with("database.ca_cert_path: must not be empty"),
            "{e}"
        );
        let c = parse(
            "[database]\nbackend = \"postgres\"\nsslmode = \"verify-full\"\nca_cert_path = \"pg-ca.crt\"\n",
        )
        .unwrap();
        assert_eq!(c.database.sslmode, DatabaseSslMode::VerifyFull);
        assert_eq!(
            c.database.ca_cert_path,
            Some(PathBuf::from("/etc/ciphermq/pg-ca.crt"))
        );
        // Embedded ignores them, like the other connection keys.
        assert!(parse("[database]\nsslmode = \"verify-full\"\n").is_ok());
    }

    #[test]
    fn secrets_are_not_in_debug_output() {
        let c = parse(&format!(
            "[encryption]\naes_key = \"{B64_32}\"\n[database]\npassword = \"hunter2\"\n"
        ))
        .unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains(B64_32) && !dbg.contains("hunter2"), "{dbg}");
        assert!(dbg.contains("<redacted>"));
    }

    #[test]
    fn require_sender_id_is_a_boolean_defaulting_to_false() {
        assert!(!parse("").unwrap().acl.require_sender_id);
        assert!(
            parse("[acl]\nrequire_sender_id = true\n")
                .unwrap()
                .acl
                .require_sender_id
        );
        let e = err("[acl]\nrequire_sender_id = \"yes\"\n");
        assert!(e.starts_with("acl.require_sender_id: invalid type"), "{e}");
    }

    #[test]
    fn acl_cns_are_checked() {
        let c = parse("[acl]\nadmin_cns = [\"admin\"]\nsender_cns = [\"sender-1.x:y\"]\n").unwrap();
        assert_eq!(c.acl.admin_cns, vec!["admin".to_owned()]);
        let e = err("[acl]\nreceiver_cns = [\"ok\", \"bad cn\"]\n");
        assert!(
            e.starts_with("acl.receiver_cns[1]: \"bad cn\" is not a valid CN"),
            "{e}"
        );
        assert!(err("[acl]\nadmin_cns = [\"\"]").starts_with("acl.admin_cns[0]:"));
        // The same rule as the wire protocol's names: no CN can be `.` or
        // `..`, which no certificate could then use as a queue's owner.
        for dots in [".", ".."] {
            let e = err(&format!("[acl]\nsender_cns = [\"{dots}\"]\n"));
            assert!(
                e.starts_with(&format!("acl.sender_cns[0]: \"{dots}\" is not a valid CN")),
                "{e}"
            );
        }
        assert!(parse("[acl]\nsender_cns = [\"a..b\"]\n").is_ok());
    }

    #[test]
    fn aes_key_validation() {
        let c = parse(&format!("[encryption]\naes_key = \"{B64_32}\"\n")).unwrap();
        let key = c
            .encryption
            .resolve_aes_key_with_env(None)
            .unwrap()
            .unwrap();
        assert_eq!(key[31], 31);

        let short = "AAECAwQFBgcICQoLDA0ODw=="; // 16 bytes
        let e = err(&format!("[encryption]\naes_key = \"{short}\"\n"));
        assert_eq!(
            e,
            "encryption.aes_key: must be base64 of exactly 32 bytes (it decodes to 16 bytes)"
        );
        let e = err("[encryption]\naes_key = \"not base64!\"\n");
        assert!(
            e.starts_with("encryption.aes_key: must be base64 of exactly 32 bytes"),
            "{e}"
        );
        // Unpadded base64 is refused: standard padded alphabet everywhere.
        let unpadded = B64_32.trim_end_matches('=');
        assert!(parse(&format!("[encryption]\naes_key = \"{unpadded}\"\n")).is_err());
    }

    #[test]
    fn aes_key_sources_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("aes.key");
        std::fs::write(&file, format!("{B64_32}\n")).unwrap();
        let other = "//////////////////////////////////////////8="; // 32 x 0xff

        let mut e = EncryptionConfig::default();
        assert_eq!(e.resolve_aes_key_with_env(None).unwrap(), None);
        assert_eq!(e.resolve_aes_key_with_env(Some("  ")).unwrap(), None);
        assert_eq!(
            e.resolve_aes_key_with_env(Some(other)).unwrap(),
            Some([0xff; 32])
        );
        let bad = e.resolve_aes_key_with_env(Some("AAAA")).unwrap_err();
        assert!(bad
            .to_string()
            .starts_with("CIPHERMQ_AES_KEY (environment): must be base64"));

        e.aes_key_file = Some(file.clone());
        let from_file = e.resolve_aes_key_with_env(Some(other)).unwrap().unwrap();
        assert_eq!(from_file[1], 1);

        e.aes_key = Some(other.to_owned());
        assert_eq!(e.resolve_aes_key_with_env(None).unwrap(), Some([0xff; 32]));

        e.aes_key = None;
        std::fs::write(&file, "short").unwrap();
        let bad = e.resolve_aes_key_with_env(None).unwrap_err().to_string();
        assert!(bad.starts_with("encryption.aes_key_file: "), "{bad}");
        assert!(!bad.contains("short"), "{bad}");

        e.aes_key_file = Some(dir.path().join("missing.key"));
        let bad = e.resolve_aes_key_with_env(None).unwrap_err().to_string();
        assert!(
            bad.starts_with("encryption.aes_key_file: cannot read"),
            "{bad}"
        );
    }

    #[test]
    fn relative_paths_resolve_against_base_dir() {
        let text = "[tls]\ncert_path = \"a/b.crt\"\nkey_path = \"/abs/k.key\"\n\
                    [storage]\ndata_dir = \"../d\"\n[encryption]\naes_key_file = \"k\"\n";
        let c = Config::parse_unchecked(text, Path::new("/srv/mq")).unwrap();
        assert_eq!(c.tls.cert_path, PathBuf::from("/srv/mq/a/b.crt"));
        assert_eq!(c.tls.key_path, PathBuf::from("/abs/k.key"));
        assert_eq!(c.tls.ca_cert_path, PathBuf::from("/srv/mq/certs/ca.crt"));
        assert_eq!(c.storage.data_dir, PathBuf::from("/srv/mq/../d"));
        assert_eq!(c.encryption.aes_key_file, Some(PathBuf::from("/srv/mq/k")));
        // An empty base (config file named without a directory) keeps paths relative.
        let c = Config::parse_unchecked("", Path::new("")).unwrap();
        assert_eq!(c.tls.cert_path, PathBuf::from("certs/server.crt"));
    }

    #[test]
    fn tls_identity_and_crl_keys() {
        let c = parse("").unwrap();
        assert_eq!(c.tls.identity, TlsIdentity::Cn);
        assert_eq!(c.tls.uri_san_prefix, DEFAULT_URI_SAN_PREFIX);
        assert_eq!(c.tls.crl_path, None);

        let text = "[tls]\nidentity = \"uri_san\"\nuri_san_prefix = \"urn:mq:\"\n\
                    crl_path = \"certs/ca.crl\"\n";
        let c = Config::parse_unchecked(text, Path::new("/srv/mq")).unwrap();
        assert_eq!(c.tls.identity, TlsIdentity::UriSan);
        assert_eq!(c.tls.uri_san_prefix, "urn:mq:");
        assert_eq!(c.tls.crl_path, Some(PathBuf::from("/srv/mq/certs/ca.crl")));

        let e = err("[tls]\nidentity = \"san\"\n");
        assert!(e.contains("tls.identity"), "{e}");
        for (prefix, why) in [
            ("", "must be 1 to 1024 bytes"),
            ("spiffe://ciphermq", "must end with '/' or ':'"),
            ("//ciphermq/", "must start with a URI scheme"),
            ("spiffe://cipher mq/", "printable ASCII"),
        ] {
            let e = err(&format!("[tls]\nuri_san_prefix = {prefix:?}\n"));
            assert!(e.starts_with("tls.uri_san_prefix: "), "{e}");
            assert!(e.contains(why), "{prefix:?}: {e}");
        }
        let e = err("[tls]\ncrl_path = \"\"\n");
        assert!(e.starts_with("tls.crl_path: must not be empty"), "{e}");
    }

    #[test]
    fn missing_crl_file_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).unwrap();
        for f in ["server.crt", "server.key", "ca.crt"] {
            std::fs::write(certs.join(f), "").unwrap();
        }
        let e = Config::from_toml_str("[tls]\ncrl_path = \"certs/ca.crl\"\n", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tls.crl_path: file "), "{e}");
    }

    #[test]
    fn missing_tls_file_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let e = Config::from_toml_str("", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tls.cert_path: file "), "{e}");
        assert!(e.contains("certs/server.crt does not exist"), "{e}");

        std::fs::create_dir(dir.path().join("certs")).unwrap();
        for f in ["server.crt", "server.key"] {
            std::fs::write(dir.path().join("certs").join(f), "x").unwrap();
        }
        let e = Config::from_toml_str("", dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tls.ca_cert_path: file "), "{e}");

        std::fs::write(dir.path().join("certs/ca.crt"), "x").unwrap();
        let key = format!("[encryption]\naes_key = \"{B64_32}\"\n");
        Config::from_toml_str(&key, dir.path()).unwrap();
    }

    #[test]
    fn load_reads_the_file_and_resolves_against_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("certs")).unwrap();
        for f in ["server.crt", "server.key", "ca.crt"] {
            std::fs::write(dir.path().join("certs").join(f), "x").unwrap();
        }
        let path = dir.path().join("broker.toml");
        std::fs::write(&path, format!("[encryption]\naes_key = \"{B64_32}\"\n")).unwrap();
        let c = Config::load(&path).unwrap();
        assert_eq!(c.tls.ca_cert_path, dir.path().join("certs/ca.crt"));

        let e = Config::load(&dir.path().join("nope.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(e.to_string().starts_with("cannot read config file "), "{e}");
    }

    #[test]
    fn repo_example_config_parses_with_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let base = Path::new("/repo");
        let c = Config::parse_unchecked(&text, base).unwrap();

        // The example documents the defaults: apart from the demo ACL and
        // the AES key ciphermq-pki writes, it must parse to exactly what an
        // empty file gives.
        let mut want = Config::parse_unchecked("", base).unwrap();
        want.encryption.aes_key_file = Some(base.join("certs/aes.key"));
        want.acl.admin_cns = vec!["admin".to_owned()];
        want.acl.sender_cns = vec!["sender_1".to_owned(), "sender_2".to_owned()];
        want.acl.receiver_cns = vec!["receiver_1".to_owned(), "receiver_2".to_owned()];
        assert_eq!(c, want);

        // And it spells out every key (the derived max_line_bytes included).
        let table: toml::Table = text.parse().unwrap();
        for (section, keys) in [
            ("server", 4),
            ("tls", 5),
            ("logging", 6),
            ("database", 10),
            ("encryption", 2),
            ("performance", 25),
            ("storage", 6),
            ("admin", 9),
            ("rate_limit", 7),
            ("acl", 5),
            ("cluster", 7),
        ] {
            let t = table.get(section).and_then(|v| v.as_table());
            assert_eq!(t.map(|t| t.len()), Some(keys), "section [{section}]");
        }
    }
}
