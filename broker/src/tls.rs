//! Mutual TLS: the rustls server configuration (client certificates required,
//! signed by `tls.ca_cert_path`) and the client identity read from the
//! certificate's Subject CN.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// Why the TLS configuration could not be built; names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{key}: cannot load {path}: {reason}")]
    Load {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the material (e.g. the key does not match the certificate).
    #[error("TLS setup failed: {0}")]
    Rustls(String),
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

/// When the first certificate of the PEM file at `path` to expire does
/// (Unix seconds): for the server certificate, its chain's; for the CA
/// bundle, the earliest CA's. `key` names the config key in errors.
pub fn earliest_expiry(key: &'static str, path: &Path) -> Result<i64, TlsError> {
    let err = |reason: String| TlsError::Load {
        key,
        path: path.display().to_string(),
        reason,
    };
    load_certs(key, path)?
        .iter()
        .map(|der| {
            x509_parser::parse_x509_certificate(der.as_ref())
                .map(|(_, cert)| cert.validity().not_after.timestamp())
                .map_err(|e| err(e.to_string()))
        })
        .try_fold(i64::MAX, |earliest, t| Ok(earliest.min(t?)))
}

/// Builds the server configuration: TLS 1.2 and 1.3, client certificate
/// required and verified against the CA.
pub fn server_config(cert: &Path, key: &Path, ca: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = load_certs("tls.cert_path", cert)?;
    let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Load {
        key: "tls.key_path",
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut roots = RootCertStore::empty();
    for ca_cert in load_certs("tls.ca_cert_path", ca)? {
        roots.add(ca_cert).map_err(|e| TlsError::Load {
            key: "tls.ca_cert_path",
            path: ca.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, private_key)
        .map_err(|e| TlsError::Rustls(format!("tls.cert_path / tls.key_path: {e}")))?;
    // No resumption: every connection proves its identity with its
    // certificate. TLS 1.3 tickets are not sent, and TLS 1.2 session ids are
    // not cached (a resumed 1.2 session would skip the certificate's checks,
    // its expiry included).
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// The Subject CN of the client's end-entity certificate.
pub fn peer_common_name(certs: &[CertificateDer<'_>]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
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
        let config = server_config(
            &certs.join("server.crt"),
            &certs.join("server.key"),
            &certs.join("ca.crt"),
        )
        .unwrap();
        assert_eq!(config.send_tls13_tickets, 0, "no TLS 1.3 tickets");
        assert!(
            !config.session_storage.can_cache(),
            "no TLS 1.2 session ids kept for resumption"
        );
        assert!(!config.ticketer.enabled(), "no TLS 1.2 tickets");
    }
}
