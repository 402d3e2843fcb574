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
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, HOST};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::dashboard;
use crate::remote::AdminEndpoint;

/// The admin endpoint's routes the page reads; nothing else is forwarded.
const FORWARDED: &[&str] = &[
    "/api/status",
    "/api/queues",
    "/api/connections",
    "/api/cluster",
    "/metrics",
    "/health",
    "/ready",
];

/// Why the proxy cannot start; each names the address at fault.
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
}

/// A bound proxy, serving once [`DashboardProxy::serve`] runs.
#[derive(Debug)]
pub struct DashboardProxy {
    listener: TcpListener,
    local: SocketAddr,
    upstream: Arc<AdminEndpoint>,
}

impl DashboardProxy {
    /// Binds `listen` (loopback only; port 0 picks a free one).
    pub async fn bind(
        listen: SocketAddr,
        upstream: AdminEndpoint,
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
    upstream: &AdminEndpoint,
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
    match upstream.request(Method::GET, path).await {
        Ok(response) => response,
        Err(reason) => plain(StatusCode::BAD_GATEWAY, &format!("{reason}\n")),
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
