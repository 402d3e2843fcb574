//! `[database]`: the metadata backend and the PostgreSQL connection, its
//! checks, and the password read from wherever it is set.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::checks::check_non_empty_path;
use super::{Config, ConfigError};

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

impl Config {
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

    pub(super) fn validate_database(&self) -> Result<(), ConfigError> {
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
}
