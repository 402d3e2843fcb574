//! Shared test helpers: a tiny mTLS server that speaks just enough `ciphermq/1`
//! (greeting, echo, `quit`) to exercise the client connection. The PKI the tests
//! make comes from the workspace's test kit (`ciphermq_testkit::pki`).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A CN the echo server refuses like the broker refuses an unknown client.
pub const REFUSED_CN: &str = "intruder";

/// What the echo server answers a refused client.
pub const REFUSAL: &str = "Access denied: unknown client (role=unknown)";

/// The Common Name of a DER certificate.
pub fn common_name(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("parse certificate");
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .expect("certificate has a CN")
        .as_str()
        .expect("CN is a string")
        .to_owned();
    cn
}

/// A rustls server config like the broker's: `server.crt`, client certificates
/// required and verified against `ca.crt`.
pub fn server_config(certs: &Path) -> ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(certs.join("ca.crt")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let chain = CertificateDer::pem_file_iter(certs.join("server.crt"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(certs.join("server.key")).unwrap();
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap()
}

/// Starts the echo server on 127.0.0.1:0 and returns its address. Per connection:
/// `HELLO ciphermq/1 <cn> sender` (or [`REFUSAL`] and close for [`REFUSED_CN`]), then
/// every line is echoed back as received (terminator included) until `quit`, which
/// is answered `OK bye` before a clean close.
pub async fn start_echo_server(certs: &Path) -> SocketAddr {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(certs)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // Handshake failures (wrong CA, no certificate) are what some tests
                // provoke: just drop the connection.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let cn = {
                    let (_, session) = tls.get_ref();
                    let certs = session.peer_certificates().expect("client certificate");
                    common_name(&certs[0])
                };
                let mut stream = BufReader::new(tls);
                if cn == REFUSED_CN {
                    let _ = stream.write_all(format!("{REFUSAL}\n").as_bytes()).await;
                    let _ = stream.shutdown().await;
                    return;
                }
                let hello = format!("HELLO ciphermq/1 {cn} sender\n");
                if stream.write_all(hello.as_bytes()).await.is_err()
                    || stream.flush().await.is_err()
                {
                    return;
                }
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match stream.read_until(b'\n', &mut line).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    if line == b"quit\n" {
                        let _ = stream.write_all(b"OK bye\n").await;
                        let _ = stream.shutdown().await;
                        return;
                    }
                    if stream.write_all(&line).await.is_err() {
                        return;
                    }
                    // tokio-rustls may hold encrypted bytes back (cooperative
                    // yielding): flush whenever no more input is buffered.
                    if stream.buffer().is_empty() && stream.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}
