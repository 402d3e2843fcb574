//! Loading: read, parse (legacy keys translated first), resolve relative
//! paths, then check, every section in turn ([`Config::validate`]) and the
//! files and the environment ([`Config::validate_files`]). Each section's
//! own checks are in its file.

use std::path::{Path, PathBuf};

use super::admin::validate_admin;
use super::checks::check_file;
use super::error::{one_line, position_of};
use super::legacy::migrate_legacy_keys;
use super::spans::parse_error;
use super::{Config, ConfigError, ConfigWarning, DatabaseBackend, MAX_DURATION_SECS};

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
    /// Legacy keys are translated or dropped ([`LEGACY_KEYS`](super::LEGACY_KEYS)), each leaving
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
    /// [`LEGACY_KEYS`](super::LEGACY_KEYS): what replaced the key, or why it is not needed, and
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

    /// Every duration within [`MAX_DURATION_SECS`], in its own unit.
    pub(super) fn validate_durations(&self) -> Result<(), ConfigError> {
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
}
