//! The one reload path (`SIGHUP`, `POST /api/reload`, and
//! [`crate::BrokerHandle::reloader`] for a config in memory): `[tls]`,
//! `[acl]` and `[rate_limit]` together, all or nothing.
//!
//! Everything is read and checked first: the config file, then every file
//! of `[tls]` (certificate, key, CA bundle, CRLs). Any failure refuses the
//! whole reload, logged at error naming the file, and the running
//! configuration stays, ACL included: a half-applied reload would leave an
//! operator unsure which file is in force. Then, in this order:
//! 1. the new TLS configuration: handshakes that start from now on use it
//!    (and the admin endpoint's next connection); open sessions keep theirs;
//! 2. the new ACL and rate limits ([`crate::access::policy`]);
//! 3. when the CRLs revoke a certificate they did not before, the open
//!    connections holding one end at their next turn ([`crate::access::forced_close`]).
//!
//! A handshake reads the closings version before the TLS configuration
//! (`handoff`), so a connection is either verified against the new CRL or
//! looks at the revocations when it starts: none slips between the two.

use std::path::{Path, PathBuf};
use std::sync::PoisonError;

use crate::config::{Config, ConfigError};
use crate::runtime::context::Shared;
use crate::tls::material::TlsError;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The broker was started from a config in memory, not from a file.
    #[error("the broker was not started from a config file, so there is nothing to reload from")]
    NoFile,
    /// The file could not be read or is not a valid config.
    #[error("{}: {error}; keeping the running ACL, rate limits and TLS configuration", path.display())]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        error: ConfigError,
    },
    /// A file of `[tls]` cannot be used (unreadable, a key that is not the
    /// certificate's, a bad CA bundle or CRL).
    #[error("{}: [tls]: {error}; keeping the running ACL, rate limits and TLS configuration", path.display())]
    Tls {
        /// The config file (the error names the `[tls]` file).
        path: PathBuf,
        /// What is wrong.
        error: TlsError,
    },
}

impl Shared {
    /// Names the config file that [`Shared::reload_file`] reads (once; the
    /// binary calls it with its `--config`).
    pub(crate) fn set_config_file(&self, path: PathBuf) {
        let _ = self.config_file.set(path);
    }

    /// Reads the config file again and applies its `[tls]`, `[acl]` and
    /// `[rate_limit]`; other sections need a restart. A bad file, or a bad
    /// file of `[tls]`, changes nothing. Logs the outcome either way.
    pub(crate) fn reload_file(&self) -> Result<(), ReloadError> {
        let path = self.config_file.get().ok_or(ReloadError::NoFile)?;
        let config = Config::load(path).map_err(|error| {
            refused(ReloadError::Invalid {
                path: path.clone(),
                error,
            })
        })?;
        self.reload(&config, path)
    }

    /// Applies the `[tls]`, `[acl]` and `[rate_limit]` of a validated
    /// `config` (read from `source`, named in messages), or nothing when a
    /// file of `[tls]` cannot be used. Logs the outcome either way.
    pub(crate) fn reload(&self, config: &Config, source: &Path) -> Result<(), ReloadError> {
        // Two reloads at once (a SIGHUP during a POST) apply one after the
        // other, so TLS, policy and revocations all come from the last.
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let material = crate::tls::material::load(&config.tls).map_err(|error| {
            refused(ReloadError::Tls {
                path: source.to_path_buf(),
                error,
            })
        })?;
        let revoked = material.revoked.clone();
        self.tls.replace(material);
        self.policy.reload(config);
        let newly_revoked = self.policy.revoke_certificates(revoked.clone());
        tracing::info!(
            path = %source.display(),
            revoked_certificates = revoked.len(),
            newly_revoked,
            "reloaded [tls], [acl] and [rate_limit]"
        );
        Ok(())
    }
}

/// Logs a refused reload and passes the error on.
fn refused(error: ReloadError) -> ReloadError {
    tracing::error!(error = %error, "reload refused");
    error
}
