//! `[tls]`: the broker's certificate files, where a client's identity
//! comes from, and the checks of both (the URI SAN prefix's rule included).

use std::path::PathBuf;

use serde::Deserialize;

use super::checks::check_non_empty_path;
use super::{Config, ConfigError};

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

impl Config {
    pub(super) fn validate_tls(&self) -> Result<(), ConfigError> {
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
