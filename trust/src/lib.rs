//! How CipherMQ's TLS clients trust a server they reach by an address its
//! certificate may not name: the client library and tools connecting to a
//! broker by IP, and the Postgres bridge under `sslmode = "require"` with a
//! CA (libpq's `verify-ca`). Both check the chain against their CA and
//! nothing else.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// Verifies a server's chain as its [`WebPkiServerVerifier`] does, but
/// accepts a certificate that is not valid for the name asked for. webpki
/// checks the chain before the name, so a name error means the chain was
/// good; every other error (an unknown CA, an expired or revoked
/// certificate, a bad signature) stands.
#[derive(Debug)]
pub struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ChainOnly {
    /// Wraps the verifier that knows the CA.
    pub fn new(chain: Arc<WebPkiServerVerifier>) -> ChainOnly {
        ChainOnly(chain)
    }
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
