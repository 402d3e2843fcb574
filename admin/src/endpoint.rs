//! The admin endpoint: HTTP/1.1 (hyper) over mutual TLS on `admin.address`.
//!
//! It runs on one dedicated OS thread with a tokio current-thread runtime,
//! never on a shard: slow or hostile admin clients cost that thread only.
//! It reads what the shards publish ([`ciphermq_stats`], and through
//! [`BrokerView`] the topology snapshot and the connection counts; the
//! bridge's status) and never sends a
//! shard anything, so no shard ever waits for it.
//!
//! This file starts and stops the thread and serves connections;
//! `slots` decides which connections may hold one of the endpoint's slots
//! and for how long (`[admin]` limits: deadlines, per-address and global
//! caps, replacing idle connections for newcomers); `routes` decides who may
//! see what, `status` builds the JSON, `metrics` the Prometheus text.
//! With `admin.probe_address` a second, plain-HTTP loopback listener serves
//! the same routes as for a client without a certificate (`/health` and
//! `/ready` only), under slots of its own.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ciphermq_pgbridge::PgBridge;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

use crate::broker_view::BrokerView;
use crate::config::AdminConfig;
use crate::peer::Peer;
use crate::routes;
use crate::slots::{AdminLimits, Admission, LogKind, Phase, Slots, Ticket};
use ciphermq_shard::log_throttled;

/// A connection is asked to close after this long, so keep-alive clients
/// that keep asking cannot hold a slot forever.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);
/// Largest request head (and read buffer) a connection may use.
const MAX_BUF_BYTES: usize = 64 * 1024;

/// Why the admin endpoint did not start; names the config key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// `admin.address` or `admin.probe_address` could not be bound (in
    /// use, not a local address …).
    #[error("{key}: cannot listen on {address}: {reason}")]
    Bind {
        /// The config key of the address.
        key: &'static str,
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
    /// Identity, access, TLS, figures, topology, limits, connections.
    pub broker: Arc<dyn BrokerView>,
    /// `server.name`.
    pub name: String,
    /// `storage.mode`, as configured.
    pub storage_mode: &'static str,
    /// `storage.data_dir` when queues are durable.
    pub data_dir: Option<String>,
    /// The Postgres bridge, when `database.backend = "postgres"`.
    pub bridge: Option<Arc<PgBridge>>,
    /// What `/metrics` exports per queue (`admin.queue_metrics`,
    /// `admin.max_queue_series`): [`crate::AdminConfig::queue_series`].
    pub queue_series: crate::config::QueueSeries,
}

/// The bound admin socket and the `[admin]` limits it will be served with:
/// what [`AdminServer::bind`] hands to [`AdminServer::start`], so the port is
/// taken early and the limits cannot be forgotten in between.
#[derive(Debug)]
pub struct AdminListener {
    listener: std::net::TcpListener,
    /// `admin.probe_address`'s plain-HTTP socket, when configured.
    probe: Option<std::net::TcpListener>,
    limits: AdminLimits,
}

impl AdminListener {
    /// The address it listens on (the real port when 0 was configured).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The limits it will be served with.
    pub fn limits(&self) -> AdminLimits {
        self.limits
    }
}

/// The running admin endpoint. Dropping it stops the thread like
/// [`AdminServer::shutdown`].
pub struct AdminServer {
    addr: SocketAddr,
    probe_addr: Option<SocketAddr>,
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
    /// Binds `admin.address` now, so that a taken port fails the broker's
    /// start before any shard serves; the listener keeps the section's
    /// connection limits for [`AdminServer::start`].
    pub fn bind(admin: &AdminConfig) -> Result<AdminListener, AdminError> {
        let probe = match &admin.probe_address {
            Some(address) => Some(listen("admin.probe_address", address)?),
            None => None,
        };
        Ok(AdminListener {
            listener: listen("admin.address", &admin.address)?,
            probe,
            limits: AdminLimits::from_config(admin),
        })
    }

    /// Serves `listener` (from [`AdminServer::bind`]) on a new thread.
    pub fn start(
        listener: AdminListener,
        context: AdminContext,
    ) -> Result<AdminServer, AdminError> {
        let addr = listener
            .listener
            .local_addr()
            .map_err(|e| AdminError::Thread(e.to_string()))?;
        let probe_addr = match &listener.probe {
            Some(probe) => Some(
                probe
                    .local_addr()
                    .map_err(|e| AdminError::Thread(e.to_string()))?,
            ),
            None => None,
        };
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
        if let Some(probe) = probe_addr {
            tracing::info!(%probe, "health and readiness probes served over plain HTTP");
        }
        Ok(AdminServer {
            addr,
            probe_addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the real port when 0 was configured).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `/health` and `/ready` are served over plain HTTP, when
    /// `admin.probe_address` is set (the real port when 0 was configured).
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probe_addr
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

/// Accepts until told to stop. Every connection needs a slot (see
/// `slots`): a newcomer may take the slot of an idle one, or is closed at
/// once (never left hanging) when none can be given up.
async fn serve(
    listener: AdminListener,
    context: Arc<AdminContext>,
    mut stop: oneshot::Receiver<()>,
) {
    let AdminListener {
        listener,
        probe,
        limits,
    } = listener;
    let tokio_listener = |l| match TcpListener::from_std(l) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!(error = %e, "admin endpoint cannot use its socket; not serving");
            None
        }
    };
    let Some(listener) = tokio_listener(listener) else {
        return;
    };
    let probe = probe.and_then(tokio_listener);
    let endpoint = Arc::new(Endpoint {
        context: context.clone(),
        slots: Arc::new(Slots::new(limits)),
    });
    // Probes get slots of their own: they all come from loopback, and
    // must not compete with certificate holders for its per-address share.
    let probe_endpoint = Arc::new(Endpoint {
        context,
        slots: Arc::new(Slots::new(limits)),
    });
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Taken afresh for each connection, so a reloaded
                    // certificate applies to the next handshake.
                    let acceptor = TlsAcceptor::from(endpoint.context.broker.tls());
                    admit(stream, peer, Some(&acceptor), &endpoint)
                }
                Err(e) => accept_failed(e).await,
            },
            accepted = accept_probe(probe.as_ref()) => match accepted {
                Ok((stream, peer)) => admit(stream, peer, None, &probe_endpoint),
                Err(e) => accept_failed(e).await,
            },
        }
    }
}

/// Binds one of the endpoint's addresses, non-blocking; errors name `key`.
fn listen(key: &'static str, address: &str) -> Result<std::net::TcpListener, AdminError> {
    let err = |e: std::io::Error| AdminError::Bind {
        key,
        address: address.to_owned(),
        reason: e.to_string(),
    };
    let listener = std::net::TcpListener::bind(address).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

/// The next connection to the probe address; never, without one.
async fn accept_probe(probe: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match probe {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Logs a failed accept and pauses, so a persistent failure (out of
/// descriptors) does not spin the thread.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "admin endpoint: accept failed");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// What every connection task shares.
struct Endpoint {
    context: Arc<AdminContext>,
    slots: Arc<Slots>,
}

/// Gives `stream` a slot and its own task, or closes it at once. Without an
/// `acceptor` it is a probe connection: plain HTTP, no certificate.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: Option<&TlsAcceptor>,
    endpoint: &Arc<Endpoint>,
) {
    let now = Instant::now();
    let slots = &endpoint.slots;
    match slots.admit(peer, now) {
        Admission::Refused(cap) => {
            // A reset, not a FIN: the client learns at once, and the closed
            // socket does not linger in TIME_WAIT.
            let _ = stream.set_zero_linger();
            drop(stream);
            log_throttled!(warn, slots.log_gate(LogKind::Refused, now), "refusals",
                { %peer, limit = cap.key(), },
                "admin endpoint: connection refused: the limit is reached and every \
                 connection it counts is answering a request or has finished one");
        }
        Admission::Admitted { ticket, shed } => {
            if let Some(shed) = shed {
                log_throttled!(warn, slots.log_gate(LogKind::Shed, now), "sheds",
                    {
                        %peer,
                        closed = %shed.peer,
                        closed_phase = shed.phase.label(),
                        closed_after_secs = shed.idle.as_secs(),
                        limit = shed.cap.key(),
                    },
                    "admin endpoint: connection limit reached; closed the connection \
                     most worth dropping to serve a new one");
            }
            tokio::spawn(connection(
                stream,
                peer,
                acceptor.cloned(),
                endpoint.clone(),
                ticket,
            ));
        }
    }
}

/// Why a connection was stopped from outside its HTTP exchange.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// Its slot went to a newcomer.
    Shed,
    /// The deadline of this phase ran out.
    TimedOut(Phase),
}

/// Watches one connection's slot: fires when a newcomer took it or when the
/// deadline of the connection's current phase passes. The deadline is read
/// from the table at every poll, so it follows the phase changes that the
/// HTTP service makes while the connection future is polled.
struct Watch {
    slots: Arc<Slots>,
    ticket: Ticket,
    sleep: Pin<Box<Sleep>>,
}

impl Watch {
    fn new(slots: Arc<Slots>, ticket: Ticket) -> Watch {
        let first = slots
            .deadline(ticket.id())
            .map_or_else(Instant::now, |(_, deadline)| deadline);
        Watch {
            slots,
            ticket,
            sleep: Box::pin(tokio::time::sleep_until(first.into())),
        }
    }

    fn poll_stop(&mut self, cx: &mut Context<'_>) -> Poll<Stop> {
        if Pin::new(self.ticket.shed_signal()).poll(cx).is_ready() {
            return Poll::Ready(Stop::Shed);
        }
        let Some((phase, deadline)) = self.slots.deadline(self.ticket.id()) else {
            return Poll::Ready(Stop::Shed);
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Stop::TimedOut(phase)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Runs `work` until it ends or the watch fires.
    async fn run<F: Future>(&mut self, work: F) -> Result<F::Output, Stop> {
        let mut work = pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            self.poll_stop(cx).map(Err)
        })
        .await
    }

    /// Counts and logs (rate-limited) why the connection is closed.
    fn report(&self, stop: Stop, peer: SocketAddr) {
        match stop {
            // Logged when the newcomer was admitted.
            Stop::Shed => {}
            Stop::TimedOut(phase) => {
                self.slots.timed_out(phase);
                log_throttled!(info, self.slots.log_gate(LogKind::TimedOut, Instant::now()), "closes",
                    { %peer, phase = phase.label(), limit = phase.timeout_key(), },
                    "admin endpoint: connection closed at its deadline");
            }
        }
    }
}

/// One admin connection: the TLS handshake (a client certificate signed by
/// the broker's CA is required), then HTTP/1.1 requests answered for its CN,
/// each phase under its deadline and the whole while under the watch of
/// its slot. Without an `acceptor`, a probe connection: plain HTTP,
/// answered as for no certificate.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: Option<TlsAcceptor>,
    endpoint: Arc<Endpoint>,
    ticket: Ticket,
) {
    let _ = stream.set_nodelay(true);
    let slots = endpoint.slots.clone();
    let mut watch = Watch::new(slots.clone(), ticket);
    let Some(acceptor) = acceptor else {
        slots.authenticated(watch.ticket.id(), Instant::now());
        return serve_http(stream, None, peer, endpoint, watch).await;
    };
    let tls = match watch.run(acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            log_throttled!(info, slots.log_gate(LogKind::Handshake, Instant::now()), "failures",
                { %peer, error = %e, },
                "admin endpoint: TLS handshake failed");
            return;
        }
        Err(stop) => return watch.report(stop, peer),
    };
    slots.authenticated(watch.ticket.id(), Instant::now());
    let Some(certs) = tls.get_ref().1.peer_certificates() else {
        tracing::warn!(%peer, "admin endpoint: no client certificate; closed");
        return;
    };
    let certs = certs.iter().map(|c| c.clone().into_owned()).collect();
    let client = Peer::judge(&*endpoint.context.broker, certs);
    if let Err(reason) = client.identity(&*endpoint.context.broker) {
        tracing::warn!(%peer, %reason, "admin endpoint: no identity in the client certificate; closed");
        return;
    }
    serve_http(tls, Some(client), peer, endpoint, watch).await;
}

/// Answers HTTP/1.1 requests on `io` for `client` (`None`: a probe
/// connection) until the client closes, the connection is too old, or its
/// watch fires. Each request asks `client` who it is now: a certificate that
/// a reload revoked (or left without an identity) gets a 403 and the
/// connection closes after it.
async fn serve_http<S>(
    io: S,
    client: Option<Peer>,
    peer: SocketAddr,
    endpoint: Arc<Endpoint>,
    mut watch: Watch,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let id = watch.ticket.id();
    let service_endpoint = endpoint;
    let service = service_fn(move |request: Request<Incoming>| {
        let Endpoint { context, slots } = &*service_endpoint;
        let number = slots.request_started(id, Instant::now());
        let path = request.uri().path();
        let response = match client.as_ref().map(|c| c.identity(&*context.broker)) {
            Some(Err(reason)) => {
                tracing::warn!(%peer, %path, %reason, "admin endpoint: the client certificate no longer names a client since a reload; refused, closing the connection");
                routes::no_identity(&reason)
            }
            judged => {
                let cn = judged.and_then(Result::ok);
                routes::respond(
                    context,
                    slots,
                    cn.as_deref(),
                    peer,
                    request.method(),
                    path,
                    request.headers(),
                )
            }
        };
        let response = response.map(|body| Answer {
            body,
            done: Some((slots.clone(), id, number)),
        });
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let mut builder = http1::Builder::new();
    // The deadlines are the watch's: hyper's own header timer would also
    // cut kept-alive connections at the header timeout.
    builder
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(MAX_BUF_BYTES);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = pin!(conn);
    let mut too_old = pin!(tokio::time::sleep(MAX_CONNECTION_AGE));
    let mut closing = false;
    let ended = poll_fn(|cx| {
        if !closing && too_old.as_mut().poll(cx).is_ready() {
            // Ends after the response in progress, if any (its deadline
            // still applies).
            conn.as_mut().graceful_shutdown();
            closing = true;
        }
        if let Poll::Ready(done) = conn.as_mut().poll(cx) {
            return Poll::Ready(Ok(done));
        }
        watch.poll_stop(cx).map(Err)
    })
    .await;
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "admin connection ended with an error"),
        Err(stop) => watch.report(stop, peer),
    }
}

/// A response body that tells the slot table when hyper has taken all of it,
/// so the connection moves from answering to waiting for the next request.
struct Answer {
    body: http_body_util::Full<Bytes>,
    /// The table, the connection and the request this answers.
    done: Option<(Arc<Slots>, u64, u64)>,
}

impl Answer {
    fn finish(&mut self) {
        if let Some((slots, id, request)) = self.done.take() {
            slots.response_done(id, request, Instant::now());
        }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.finish();
    }
}
