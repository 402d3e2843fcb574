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
//!
//! Files (one concept each; every public item is re-exported here, so paths
//! are `config::X` whatever file holds `X`):
//! - `load`: the three steps above, and the bound on every duration key.
//! - `server`, `tls`, `logging`, `database`, `encryption`, `performance`,
//!   `storage`, `cluster`: one section each, its type, defaults and checks.
//! - `access`: `[rate_limit]` and `[acl]`; `admin`: the checks of `[admin]`,
//!   whose type is the admin crate's [`AdminConfig`].
//! - `limits`: the numeric bounds the checks enforce.
//! - `legacy`: [`LEGACY_KEYS`] and their translation.
//! - `error`: [`ConfigError`], [`ConfigWarning`], [`Position`].
//! - `checks`: value checks shared by sections; `spans`: where each key is
//!   in the text, so that errors point at it.

mod access;
mod admin;
mod checks;
mod cluster;
mod database;
mod encryption;
mod error;
mod legacy;
mod limits;
mod load;
mod logging;
mod performance;
mod server;
mod spans;
mod storage;
mod tls;

use serde::Deserialize;

pub use access::{AclConfig, RateLimitConfig};
pub use ciphermq_admin::config::{AdminConfig, MAX_ADMIN_CONNECTIONS, MAX_ADMIN_TIMEOUT_SECS};
pub use cluster::{ClusterConfig, ClusterStorage};
pub use database::{DatabaseBackend, DatabaseConfig, DatabaseSslMode};
pub use encryption::{EncryptionConfig, ALGORITHM_X25519_CHACHA20_POLY1305, ENV_AES_KEY};
pub use error::{ConfigError, ConfigWarning, Position};
pub use legacy::{LegacyFate, LegacyKey, LEGACY_KEYS};
pub use limits::{
    LINE_OVERHEAD_BYTES, MAX_DURATION_SECS, MAX_MEMORY_BUDGET_MB, MAX_MESSAGE_BYTES_LIMIT,
    MAX_SEGMENT_BYTES, MAX_SHARDS, MIN_PENDING_REPLY_BYTES, MIN_REPLY_BYTES_PER_TURN,
    MIN_SEGMENT_BYTES,
};
pub use logging::{Console, LogRotation, LoggingConfig};
pub use performance::PerformanceConfig;
pub use server::ServerConfig;
pub use storage::{StorageConfig, StorageMode};
pub use tls::{TlsConfig, TlsIdentity, DEFAULT_URI_SAN_PREFIX};

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

#[cfg(test)]
mod tests;
