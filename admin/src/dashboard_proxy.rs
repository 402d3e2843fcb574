//! `ciphermq-admin dashboard`: the dashboard for a browser that holds no
//! client certificate. It serves the page on a loopback address over plain
//! HTTP and forwards the page's reads to the admin endpoint over mutual TLS
//! with the operator's certificate.
//!
//! Whoever reaches the loopback port reads what that certificate may read,
//! so the proxy listens on loopback only, answers `GET` only, forwards only
//! the read-only routes the page polls, and refuses requests whose `Host`
//! is not its own loopback address (a web page cannot reach it through DNS
//! rebinding).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE, HOST};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

use crate::dashboard;

/// The admin endpoint's routes the page reads; nothing else is forwarded.
const FORWARDED: &[&str] = &[
    "/api/status",
    "/api/queues",
    "/api/connections",
    "/metrics",
    "/health",
    "/ready",
];

/// How long one forwarded read may take, connection and handshake included.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer forwarded (a `/metrics` text of many queues stays far
/// below it).
const MAX_UPSTREAM_BYTES: usize = 64 << 20;

/// Why the proxy cannot start; each names the file or address at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// `--listen` is not a loopback address.
    #[error("--listen {0}: not a loopback address; the dashboard proxy serves the admin endpoint's data without asking who is reading, so it listens on 127.0.0.1 or [::1] only")]
    NotLoopback(SocketAddr),
    /// The listen address could not be bound.
    #[error("--listen {address}: cannot listen: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A certificate or key file could not be read or holds no usable PEM.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and key do not make a client identity (a key that
    /// does not match its certificate, an unsupported key type).
    #[error("client certificate {cert} with key {key}: {reason}")]
    Identity {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
        /// What rustls said.
        reason: String,
    },
    /// The endpoint's name is not a DNS name or IP address.
    #[error("--server-name {0:?}: not a DNS name or IP address")]
    ServerName(String),
}

/// Where and how to reach the admin endpoint.
#[derive(Debug, Clone)]
pub struct Upstream {
    address: String,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
}

impl Upstream {
    /// The endpoint at `address` (`host:port`), whose certificate must name
    /// `server_name` and be signed by the CA in `ca`; the proxy presents
    /// `cert` and `key` (an admin or monitor certificate).
    pub fn from_files(
        address: &str,
        server_name: &str,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<Upstream, ProxyError> {
        let mut roots = rustls::RootCertStore::empty();
        for ca_cert in read_certs(ca)? {
            roots.add(ca_cert).map_err(|e| ProxyError::Pem {
                path: ca.display().to_string(),
                reason: format!("not a usable CA certificate: {e}"),
            })?;
        }
        let chain = read_certs(cert)?;
        let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| ProxyError::Pem {
            path: key.display().to_string(),
            reason: format!("no private key read: {e}"),
        })?;
        let tls = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private_key)
            .map_err(|e| ProxyError::Identity {
                cert: cert.display().to_string(),
                key: key.display().to_string(),
                reason: e.to_string(),
            })?;
        let server_name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| ProxyError::ServerName(server_name.to_owned()))?;
        Ok(Upstream {
            address: address.to_owned(),
            server_name,
            tls: Arc::new(tls),
        })
    }
}

/// Every certificate in the PEM file at `path`, at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ProxyError> {
    let err = |reason: String| ProxyError::Pem {
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(format!("cannot read: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(err("holds no certificate".to_owned()));
    }
    Ok(certs)
}

/// A bound proxy, serving once [`DashboardProxy::serve`] runs.
#[derive(Debug)]
pub struct DashboardProxy {
    listener: TcpListener,
    local: SocketAddr,
    upstream: Arc<Upstream>,
}

impl DashboardProxy {
    /// Binds `listen` (loopback only; port 0 picks a free one).
    pub async fn bind(
        listen: SocketAddr,
        upstream: Upstream,
    ) -> Result<DashboardProxy, ProxyError> {
        if !listen.ip().is_loopback() {
            return Err(ProxyError::NotLoopback(listen));
        }
        let bind_err = |source| ProxyError::Bind {
            address: listen,
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        Ok(DashboardProxy {
            listener,
            local,
            upstream: Arc::new(upstream),
        })
    }

    /// The address it listens on (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves until the task is dropped; one task per browser connection.
    pub async fn serve(self) {
        let local = self.local;
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: pause, do not spin.
                    tracing::warn!(error = %e, "dashboard proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let upstream = self.upstream.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let upstream = upstream.clone();
                    async move { Ok::<_, Infallible>(answer(&request, local, &upstream).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

/// The answer to one browser request.
async fn answer(
    request: &Request<Incoming>,
    local: SocketAddr,
    upstream: &Upstream,
) -> Response<Full<Bytes>> {
    if !own_host(request.headers().get(HOST), local) {
        return plain(
            StatusCode::FORBIDDEN,
            "this proxy answers only requests addressed to its own loopback address\n",
        );
    }
    let path = request.uri().path();
    let known = path == "/" || path == "/dashboard" || FORWARDED.contains(&path);
    if !known {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::GET {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return response;
    }
    if path == "/" || path == "/dashboard" {
        return dashboard::page_response();
    }
    match tokio::time::timeout(UPSTREAM_TIMEOUT, fetch(upstream, path)).await {
        Ok(Ok(response)) => response,
        Ok(Err(reason)) => plain(
            StatusCode::BAD_GATEWAY,
            &format!("admin endpoint {}: {reason}\n", upstream.address),
        ),
        Err(_) => plain(
            StatusCode::GATEWAY_TIMEOUT,
            &format!(
                "admin endpoint {}: no answer within {} s\n",
                upstream.address,
                UPSTREAM_TIMEOUT.as_secs()
            ),
        ),
    }
}

/// Whether `host` names this proxy's own loopback address and port.
fn own_host(host: Option<&HeaderValue>, local: SocketAddr) -> bool {
    let Some(host) = host.and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let port = local.port();
    [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ]
    .iter()
    .any(|own| own.eq_ignore_ascii_case(host))
}

/// `GET path` on the admin endpoint, over a connection of its own.
async fn fetch(upstream: &Upstream, path: &str) -> Result<Response<Full<Bytes>>, String> {
    let tcp = TcpStream::connect(&upstream.address)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let tls = TlsConnector::from(upstream.tls.clone())
        .connect(upstream.server_name.clone(), tcp)
        .await
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header(HOST, &upstream.address)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let content_type = response.headers().get(CONTENT_TYPE).cloned();
    let body = Limited::new(response.into_body(), MAX_UPSTREAM_BYTES)
        .collect()
        .await
        .map_err(|e| format!("answer not read: {e}"))?
        .to_bytes();
    let mut forwarded = Response::new(Full::new(body));
    *forwarded.status_mut() = status;
    if let Some(content_type) = content_type {
        forwarded.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    forwarded
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(forwarded)
}

/// A short plain-text answer.
fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_its_own_loopback_host_is_served() {
        let local: SocketAddr = "127.0.0.1:9095".parse().unwrap();
        let host = |h: &str| HeaderValue::from_str(h).unwrap();
        assert!(own_host(Some(&host("127.0.0.1:9095")), local));
        assert!(own_host(Some(&host("LOCALHOST:9095")), local));
        assert!(own_host(Some(&host("[::1]:9095")), local));
        assert!(!own_host(Some(&host("evil.example:9095")), local));
        assert!(!own_host(Some(&host("127.0.0.1:9096")), local));
        assert!(!own_host(Some(&host("127.0.0.1")), local));
        assert!(!own_host(None, local));
    }
}
