//! The admin endpoint (DESIGN.md §8): HTTP/1.1 (hyper) over mutual TLS on
//! `admin.address`.
//!
//! It runs on one dedicated OS thread with a tokio current-thread runtime,
//! never on a shard: slow or hostile admin clients cost that thread only.
//! It reads what the shards publish ([`crate::stats`], the topology
//! snapshot, the connection counts, the bridge's status) and never sends a
//! shard anything, so no shard ever waits for it.
//!
//! Layout: this file starts and stops the thread and serves connections;
//! `routes` decides who may see what, `status` builds the JSON, `metrics`
//! the Prometheus text.

mod metrics;
mod routes;
mod status;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ciphermq_pgbridge::PgBridge;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::context::Shared;
use crate::tls::peer_common_name;

/// Admin connections served at once; more are closed at accept. The
/// endpoint serves a dashboard and a scraper, not a crowd.
const MAX_CONNECTIONS: usize = 64;
/// Longest wait for a request's headers (also bounds an idle keep-alive).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is asked to close after this long, so keep-alive clients
/// cannot hold the connection slots forever.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// Why the admin endpoint did not start; names the config key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// `admin.address` could not be bound (in use, not a local address …).
    #[error("admin.address: cannot listen on {address}: {reason}")]
    Bind {
        /// The configured address.
        address: String,
        /// The OS error.
        reason: String,
    },
    /// The runtime or the thread could not be created.
    #[error("admin endpoint: cannot start its thread: {0}")]
    Thread(String),
}

/// What the routes read: everything is shared with the shards read-only or
/// through snapshots.
pub struct AdminContext {
    /// Settings, policy (admin CNs), topology, connection counts, stats, TLS.
    pub shared: Arc<Shared>,
    /// `server.name`.
    pub name: String,
    /// `storage.mode`, as configured.
    pub storage_mode: &'static str,
    /// `storage.data_dir` when queues are durable.
    pub data_dir: Option<String>,
    /// The Postgres bridge, when `database.backend = "postgres"`.
    pub bridge: Option<Arc<PgBridge>>,
}

/// The running admin endpoint. Dropping it stops the thread like
/// [`AdminServer::shutdown`].
pub struct AdminServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// Binds `address` now, so that a taken port fails the broker's start
    /// before any shard serves.
    pub fn bind(address: &str) -> Result<std::net::TcpListener, AdminError> {
        let err = |e: std::io::Error| AdminError::Bind {
            address: address.to_owned(),
            reason: e.to_string(),
        };
        let listener = std::net::TcpListener::bind(address).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        Ok(listener)
    }

    /// Serves `listener` (from [`AdminServer::bind`]) on a new thread.
    pub fn start(
        listener: std::net::TcpListener,
        context: AdminContext,
    ) -> Result<AdminServer, AdminError> {
        let addr = listener
            .local_addr()
            .map_err(|e| AdminError::Thread(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| AdminError::Thread(e.to_string()))?;
        let (stop, stopped) = oneshot::channel();
        let context = Arc::new(context);
        let thread = std::thread::Builder::new()
            .name("admin".into())
            .spawn(move || {
                runtime.block_on(serve(listener, context, stopped));
                // Dropping the runtime cancels the connections still open.
                drop(runtime);
            })
            .map_err(|e| AdminError::Thread(e.to_string()))?;
        tracing::info!(%addr, "admin endpoint listening");
        Ok(AdminServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the real port when 0 was configured).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, drops open admin connections and joins the thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the admin thread panicked");
            }
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Accepts until told to stop.
async fn serve(
    listener: std::net::TcpListener,
    context: Arc<AdminContext>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "admin endpoint cannot use its socket; not serving");
            return;
        }
    };
    let acceptor = TlsAcceptor::from(context.shared.tls.clone());
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "admin endpoint: too many connections; closed");
                        continue;
                    };
                    tokio::spawn(connection(stream, peer, acceptor.clone(), context.clone(), permit));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "admin endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// One admin connection: the TLS handshake (a client certificate signed by
/// the broker's CA is required), then HTTP/1.1 requests answered for its CN.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    context: Arc<AdminContext>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let handshake = context.shared.settings.handshake_timeout;
    let tls = match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "admin endpoint: TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "admin endpoint: TLS handshake timed out");
            return;
        }
    };
    let Some(cn) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(peer_common_name)
    else {
        tracing::warn!(%peer, "admin endpoint: client certificate without a CN; closed");
        return;
    };
    let service = service_fn(move |request: Request<Incoming>| {
        let response = routes::respond(&context, &cn, peer, request.method(), request.uri().path());
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(%peer, error = %e, "admin connection ended with an error");
            }
        }
        _ = tokio::time::sleep(MAX_CONNECTION_AGE) => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(HEADER_TIMEOUT, conn).await;
        }
    }
}
