//! TLS to PostgreSQL: `database.sslmode` as libpq spells it, on rustls (ring
//! provider) under tokio-postgres through `tokio-postgres-rustls`.
//!
//! | mode | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` | if the server accepts it, else plaintext | not checked |
//! | `require` | always | chain checked against `ca_cert_path` when given (no host name check); else not checked |
//! | `verify-full` | always | chain checked against `ca_cert_path` (required) and the host name |
//!
//! A refused certificate, or a server that refuses TLS when it is required,
//! is reported as an [`OpenError`] that retrying cannot cure, so start-up
//! fails at once with a message naming the server and `ca_cert_path`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use ciphermq_trust::ChainOnly;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::PgConfig;
use super::error::BridgeError;
use super::link::describe;

/// How the link to PostgreSQL is protected (`database.sslmode`; libpq's
/// names and meanings, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Plaintext: metadata, the password exchange and the key rows travel
    /// in the clear. Only for a server on the same host.
    Disable,
    /// TLS when the server offers it, plaintext otherwise, certificate not
    /// checked: protects against a passive listener only. The default, so a
    /// server without TLS keeps working as before.
    #[default]
    Prefer,
    /// TLS or no connection. The certificate chain is checked against
    /// `ca_cert_path` when one is given (libpq's `verify-ca`), not at all
    /// otherwise.
    Require,
    /// TLS, the certificate chain checked against `ca_cert_path` and the
    /// certificate checked to name the host connected to: the only mode that
    /// stops a machine in the middle.
    VerifyFull,
}

impl SslMode {
    /// Every mode, as spelled in the config.
    pub const NAMES: [&'static str; 4] = ["disable", "prefer", "require", "verify-full"];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What the driver does before the TLS handshake.
    fn driver(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A spelling of `sslmode` that is none of [`SslMode::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an sslmode (one of disable, prefer, require, verify-full)")]
pub struct UnknownSslMode(pub String);

impl FromStr for SslMode {
    type Err = UnknownSslMode;

    fn from_str(s: &str) -> Result<SslMode, UnknownSslMode> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(UnknownSslMode(other.to_owned())),
        }
    }
}

/// The driver's mode for `config`: libpq ignores `sslmode` on a Unix
/// socket (the server never offers TLS there), and so does the bridge.
pub(crate) fn driver_mode(config: &PgConfig) -> tokio_postgres::config::SslMode {
    if config.host.starts_with('/') {
        tokio_postgres::config::SslMode::Disable
    } else {
        config.sslmode.driver()
    }
}

/// The TLS side of every connection the bridge makes, built once at start
/// (the CA file is read then). Cheap to clone.
#[derive(Clone)]
pub(crate) struct PgTls {
    connector: MakeRustlsConnect,
    /// Whether the certificate chain is checked (`require` with a CA,
    /// `verify-full`).
    chain_checked: bool,
}

impl PgTls {
    /// Reads `ca_cert_path` if the mode uses it; fails naming the key.
    pub(crate) fn new(config: &PgConfig) -> Result<PgTls, BridgeError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier: Arc<dyn ServerCertVerifier> = match (config.sslmode, &config.ca_cert_path) {
            (SslMode::VerifyFull, None) => return Err(BridgeError::MissingCaCert),
            (SslMode::VerifyFull, Some(path)) => load_roots(path, &provider)?,
            (SslMode::Require, Some(path)) => {
                Arc::new(ChainOnly::new(load_roots(path, &provider)?))
            }
            _ => Arc::new(AnyCertificate(provider.clone())),
        };
        let chain_checked = matches!(
            (config.sslmode, &config.ca_cert_path),
            (SslMode::VerifyFull, _) | (SslMode::Require, Some(_))
        );
        let tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| BridgeError::Tls {
                target: config.target(),
                why: format!("cannot set up TLS: {e}"),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(PgTls {
            connector: MakeRustlsConnect::new(tls),
            chain_checked,
        })
    }

    /// What `tokio_postgres::Config::connect` takes.
    pub(crate) fn connector(&self) -> MakeRustlsConnect {
        self.connector.clone()
    }

    /// Whether a TLS session proves who the server is (chain checked).
    pub(crate) fn chain_checked(&self) -> bool {
        self.chain_checked
    }
}

/// The CA certificates of `path` as a verifier of chain and host name.
fn load_roots(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, BridgeError> {
    let bad = |why: String| BridgeError::CaCert {
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(pem_error(&e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(pem_error(&e)))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".to_owned()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| bad(e.to_string()))
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => format!("cannot read it: {io}"),
        other => format!("not a PEM file: {other}"),
    }
}

/// `prefer`, and `require` without a CA: any certificate is taken (as by
/// libpq), but the handshake's signatures are still checked, so the
/// session key is the server's own.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Why one connection attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenError {
    /// One line for a person: the server, the cause, and what to do.
    pub(crate) why: String,
    /// Retrying cannot help until a certificate or the config changes (a
    /// refused certificate, TLS refused while required).
    pub(crate) permanent: bool,
}

impl OpenError {
    /// A failure worth retrying (server down, network, timeout).
    pub(crate) fn transient(why: String) -> OpenError {
        OpenError {
            why,
            permanent: false,
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

/// The driver's error as an [`OpenError`]: TLS refusals in words a person
/// can act on, everything else as the driver says it.
pub(crate) fn explain(err: &tokio_postgres::Error, config: &PgConfig) -> OpenError {
    let server = format!("{}:{}", config.host, config.port);
    let ca = || show(config.ca_cert_path.as_deref());
    if let Some(tls) = rustls_error(err) {
        let why = match tls {
            rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature,
            ) => format!(
                "the certificate of PostgreSQL server {server} is not signed by \
                 database.ca_cert_path = {} ({tls}): give database.ca_cert_path the CA \
                 that issued the server's certificate (the server's ssl_cert_file), or check \
                 that database.host names the intended server",
                ca()
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "the certificate of PostgreSQL server {server} does not name {:?} \
                 (database.sslmode = \"verify-full\" checks it; {tls}): set database.host to a \
                 name or address the certificate lists, or re-issue the server's certificate \
                 with it",
                config.host
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => format!(
                "the certificate of PostgreSQL server {server} is outside its validity \
                 period ({tls}): renew the server's certificate (or check this host's clock)"
            ),
            rustls::Error::InvalidCertificate(_) => format!(
                "the certificate of PostgreSQL server {server} was refused under \
                 database.sslmode = \"{}\" with database.ca_cert_path = {}: {tls}",
                config.sslmode,
                ca()
            ),
            _ => format!("the TLS handshake with PostgreSQL server {server} failed: {tls}"),
        };
        return OpenError {
            why,
            permanent: true,
        };
    }
    let text = describe(err);
    if text.contains("server does not support TLS") {
        return OpenError {
            why: format!(
                "PostgreSQL server {server} does not accept TLS, and database.sslmode = \"{}\" \
                 requires it: turn TLS on at the server (ssl = on, ssl_cert_file, ssl_key_file), \
                 or lower database.sslmode",
                config.sslmode
            ),
            permanent: true,
        };
    }
    OpenError::transient(text)
}

/// The rustls error behind a failed handshake, if that is what failed
/// (the connector reports it as an `io::Error` wrapping it).
fn rustls_error(err: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(tls);
            }
        }
        cause = e.source();
    }
    None
}

/// Whether `host` is this machine (a Unix socket, a loopback address or
/// `localhost`): an unverified link to it crosses no network.
pub(crate) fn is_local(host: &str) -> bool {
    host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `path` for messages: the file a person should look at.
pub(crate) fn show(path: Option<&Path>) -> String {
    path.map_or_else(|| "(not set)".to_owned(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn modes_round_trip_their_config_spelling() {
        for name in SslMode::NAMES {
            assert_eq!(name.parse::<SslMode>().unwrap().as_str(), name);
        }
        let e = "verify-ca".parse::<SslMode>().unwrap_err();
        assert!(e.to_string().contains("\"verify-ca\""), "{e}");
        assert_eq!(SslMode::default(), SslMode::Prefer);
    }

    #[test]
    fn verify_full_needs_a_ca() {
        let config = PgConfig {
            sslmode: SslMode::VerifyFull,
            ..PgConfig::default()
        };
        let e = PgTls::new(&config).err().expect("refused");
        assert!(e.to_string().starts_with("database.ca_cert_path"), "{e}");
    }

    #[test]
    fn an_unreadable_ca_names_the_key_and_the_file() {
        let config = PgConfig {
            sslmode: SslMode::Require,
            ca_cert_path: Some(PathBuf::from("/nonexistent/pg-ca.pem")),
            ..PgConfig::default()
        };
        let e = PgTls::new(&config).err().expect("refused").to_string();
        assert!(
            e.starts_with("database.ca_cert_path = /nonexistent/pg-ca.pem: cannot read it"),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let config = PgConfig {
            sslmode: SslMode::VerifyFull,
            ca_cert_path: Some(path),
            ..PgConfig::default()
        };
        let e = PgTls::new(&config).err().expect("refused").to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }

    #[test]
    fn unverified_modes_build_without_a_ca() {
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require] {
            let config = PgConfig {
                sslmode: mode,
                ..PgConfig::default()
            };
            let tls = PgTls::new(&config).unwrap();
            assert!(!tls.chain_checked(), "{mode}");
        }
    }

    #[test]
    fn unix_sockets_never_ask_for_tls() {
        let config = PgConfig {
            host: "/var/run/postgresql".to_owned(),
            sslmode: SslMode::Require,
            ..PgConfig::default()
        };
        assert_eq!(
            driver_mode(&config),
            tokio_postgres::config::SslMode::Disable
        );
    }

    #[test]
    fn local_hosts() {
        for host in ["127.0.0.1", "::1", "localhost", "/run/postgresql"] {
            assert!(is_local(host), "{host}");
        }
        for host in ["db.internal", "10.0.0.5", "127.0.0.1.example"] {
            assert!(!is_local(host), "{host}");
        }
    }
}
