//! A small HTTP/1.1 client over TLS for the admin endpoint's tests: one
//! request per connection, with a client certificate or none, carrying
//! `X-CipherMQ-Request: 1` as `ciphermq-admin` does.

use std::net::SocketAddr;
use std::sync::Arc;

use ciphermq_clients::connection::TlsClientOptions;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{pki, TIMEOUT};

/// An HTTP response, read to the end of the connection.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The header lines, as sent.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Reply {
    /// The value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki().certs.join("ca.crt")).expect("ca.crt") {
        roots.add(cert.expect("CA certificate")).expect("add CA");
    }
    roots
}

/// A TLS client: with `cn`'s certificate, or with none.
fn connector(cn: Option<&str>) -> TlsConnector {
    match cn {
        Some(cn) => TlsClientOptions::for_cn(&pki().certs, cn)
            .connector()
            .expect("client TLS config"),
        None => {
            let config = ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots())
            .with_no_client_auth();
            TlsConnector::from(Arc::new(config))
        }
    }
}

/// Sends one HTTP/1.1 request with `Connection: close` and reads the whole
/// response, bounded by `TIMEOUT`.
pub async fn request(
    addr: SocketAddr,
    cn: Option<&str>,
    method: &str,
    path: &str,
) -> std::io::Result<Reply> {
    let connector = connector(cn);
    let exchange = async {
        let tcp = TcpStream::connect(addr).await?;
        let name =
            rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        let tls = connector.connect(name, tcp).await?;
        send_and_read(tls, method, path, "x").await
    };
    answer(exchange).await
}

/// One request over plain HTTP (the probe address), no TLS at all.
pub async fn plain_request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Reply> {
    plain_request_to(addr, method, path, "x").await
}

/// One request over plain HTTP with `Host: host`.
pub async fn plain_request_to(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
) -> std::io::Result<Reply> {
    answer(async { send_and_read(TcpStream::connect(addr).await?, method, path, host).await }).await
}

async fn send_and_read<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    mut io: S,
    method: &str,
    path: &str,
    host: &str,
) -> std::io::Result<Vec<u8>> {
    // With the header a request that changes the broker needs, as
    // `ciphermq-admin` sends it (GETs ignore it).
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nX-CipherMQ-Request: 1\r\n\r\n"
    );
    io.write_all(head.as_bytes()).await?;
    io.flush().await?;
    let mut raw = Vec::new();
    match io.read_to_end(&mut raw).await {
        Ok(_) => {}
        // A peer that closes without close_notify after a full answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(raw)
}

async fn answer(
    exchange: impl std::future::Future<Output = std::io::Result<Vec<u8>>>,
) -> std::io::Result<Reply> {
    let raw = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::other("no answer in time"))??;
    parse(&raw)
}

fn parse(raw: &[u8]) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let text = String::from_utf8(raw.to_vec()).map_err(|_| bad("not UTF-8"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty response"))?;
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| bad("no HTTP/1.1 status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Reply {
        status,
        headers,
        body: body.to_owned(),
    })
}
