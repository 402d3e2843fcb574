//! Mutual TLS: one loaded version of `[tls]` ([`TlsMaterial`]): the rustls
//! server configuration (client certificates required, signed by
//! `tls.ca_cert_path`, checked against `tls.crl_path` when set), the rule
//! that reads a client's identity from its certificate, what the CRLs
//! revoke, and when it all expires. Built at start and by every reload
//! ([`crate::tls::store`] swaps it in); nothing here runs per connection.

use std::path::Path;
use std::sync::Arc;

use ciphermq_admin::TlsExpiries;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use x509_parser::certificate::X509Certificate;

use crate::access::identity::IdentityRule;
use crate::config::TlsConfig;
use crate::tls::crl::Revocations;

/// Why the TLS configuration could not be built; names the file and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read, holds nothing usable, or does not fit the
    /// others (a key that is not the certificate's, a CRL of another CA).
    #[error("{key}: cannot load {path}: {reason}")]
    Load {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the material for another reason.
    #[error("TLS setup failed: {0}")]
    Rustls(String),
}

/// One version of `[tls]`, ready to serve handshakes.
#[derive(Debug)]
pub(crate) struct TlsMaterial {
    /// What handshakes run with (broker and admin endpoint).
    pub server: Arc<ServerConfig>,
    /// How a verified certificate names its client.
    pub identity: IdentityRule,
    /// What `tls.crl_path` revokes (empty without one).
    pub revoked: Arc<Revocations>,
    /// When the server certificate, the earliest CA and the CRLs expire,
    /// for `/metrics`.
    pub expiries: TlsExpiries,
}

impl TlsMaterial {
    /// Material around an existing server configuration: the CN rule, no
    /// CRL, no expiries (tests that never handshake).
    #[cfg(test)]
    pub(crate) fn from_server_config(server: Arc<ServerConfig>) -> TlsMaterial {
        TlsMaterial {
            server,
            identity: IdentityRule::Cn,
            revoked: Arc::default(),
            expiries: TlsExpiries::default(),
        }
    }
}

fn load_certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::Load {
        key,
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

/// Parses every certificate of a file (`key`, `path` name it in errors).
fn parse_all<'a>(
    key: &'static str,
    path: &Path,
    ders: &'a [CertificateDer<'_>],
) -> Result<Vec<X509Certificate<'a>>, TlsError> {
    ders.iter()
        .map(|der| {
            x509_parser::parse_x509_certificate(der.as_ref())
                .map(|(_, cert)| cert)
                .map_err(|e| TlsError::Load {
                    key,
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })
        })
        .collect()
}

/// When the first of `certs` to expire does (Unix seconds).
fn earliest_not_after(certs: &[X509Certificate<'_>]) -> Option<i64> {
    certs
        .iter()
        .map(|c| c.validity().not_after.timestamp())
        .min()
}

/// Loads `[tls]`: TLS 1.2 and 1.3, a client certificate required and
/// verified against the CAs (and the CRLs, when configured). Every file is
/// read and checked here, so a reload either gets all of it or fails
/// naming the file at fault.
pub(crate) fn load(tls: &TlsConfig) -> Result<TlsMaterial, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = load_certs("tls.cert_path", &tls.cert_path)?;
    let server_not_after = earliest_not_after(&parse_all("tls.cert_path", &tls.cert_path, &chain)?);
    let private_key = PrivateKeyDer::from_pem_file(&tls.key_path).map_err(|e| TlsError::Load {
        key: "tls.key_path",
        path: tls.key_path.display().to_string(),
        reason: e.to_string(),
    })?;
    let ca_ders = load_certs("tls.ca_cert_path", &tls.ca_cert_path)?;
    let cas = parse_all("tls.ca_cert_path", &tls.ca_cert_path, &ca_ders)?;
    let mut roots = RootCertStore::empty();
    for ca_cert in &ca_ders {
        roots.add(ca_cert.clone()).map_err(|e| TlsError::Load {
            key: "tls.ca_cert_path",
            path: tls.ca_cert_path.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    let crls = tls
        .crl_path
        .as_deref()
        .map(|path| crate::tls::crl::load(path, &cas))
        .transpose()?;
    let mut verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let (revoked, crl_next_update) = match crls {
        Some(crls) => {
            // The client's own certificate against its issuer's CRL; a status
            // that cannot be told (no CRL of its issuer) fails the handshake
            // (rustls's default), an expired CRL still applies (idem).
            verifier = verifier
                .with_crls(crls.ders)
                .only_check_end_entity_revocation();
            (crls.revoked, crls.next_update)
        }
        None => (Revocations::default(), None),
    };
    let verifier = verifier.build().map_err(|e| match (&tls.crl_path, e) {
        (Some(path), rustls::server::VerifierBuilderError::InvalidCrl(e)) => TlsError::Load {
            key: "tls.crl_path",
            path: path.display().to_string(),
            reason: format!("rustls cannot use it: {e:?}"),
        },
        (_, e) => TlsError::Rustls(e.to_string()),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, private_key)
        .map_err(|e| TlsError::Load {
            key: "tls.key_path",
            path: tls.key_path.display().to_string(),
            reason: format!(
                "unusable with the certificate of tls.cert_path ({}): {e}",
                tls.cert_path.display()
            ),
        })?;
    // No resumption: every connection proves its identity with its
    // certificate. TLS 1.3 tickets are not sent, and TLS 1.2 session ids are
    // not cached (a resumed 1.2 session would skip the certificate's checks,
    // its expiry and revocation included).
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(TlsMaterial {
        server: Arc::new(config),
        identity: IdentityRule::from_config(tls),
        revoked: Arc::new(revoked),
        expiries: TlsExpiries {
            server: server_not_after,
            ca: earliest_not_after(&cas),
            crl_next_update,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciphermq_clients::pki::{self, PkiOptions};

    #[test]
    fn no_session_is_ever_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
        pki::generate(&opts).unwrap();
        let certs = dir.path().join("certs");
        let config = load(&crate::config::TlsConfig {
            cert_path: certs.join("server.crt"),
            key_path: certs.join("server.key"),
            ca_cert_path: certs.join("ca.crt"),
            ..Default::default()
        })
        .unwrap()
        .server;
        assert_eq!(config.send_tls13_tickets, 0, "no TLS 1.3 tickets");
        assert!(
            !config.session_storage.can_cache(),
            "no TLS 1.2 session ids kept for resumption"
        );
        assert!(!config.ticketer.enabled(), "no TLS 1.2 tickets");
    }
}
