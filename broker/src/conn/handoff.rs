//! From an accepted socket to the shard that owns the client: the TLS
//! handshake (with the `[tls]` in force when it starts), identification by
//! certificate (`tls.identity`: the CN or the URI SAN; then the role and the
//! connection caps), and, when the owner `fnv1a(identity) % N` is another
//! shard, the hand-off of the socket and its TLS session to that shard,
//! which adopts it.
//!
//! Any shard may accept any client (the port is shared with `SO_REUSEPORT`),
//! but all connections of one CN must live on one shard (its rate-limit
//! buckets and mailboxes are single-threaded). This module is that step, and
//! the cross-thread channel it needs; the accept loop that decides whether a
//! handshake starts at all is in `runtime::shard`.

use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use ciphermq_shard::shard_of;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use glommio::net::TcpStream;
use rustls::ServerConnection;

use crate::access::acl::Role;
use crate::access::identity::{identify, PeerCertificate};
use crate::access::rate_limit::ConnectionSlot;
use crate::conn::connection::{Connection, Identity};
use crate::runtime::context::ShardLocal;
use crate::runtime::shutdown::ShutdownSignal;
use crate::runtime::sys;
use crate::tls::session::TlsSession;
use ciphermq_shard::log_throttle::LogThrottle;
use ciphermq_shard::log_throttled;

/// A connection on its way to the shard that owns its CN: the socket, its
/// TLS session with any bytes already read past the handshake, who the client
/// is, and its place under the connection caps.
pub(crate) struct Handoff {
    fd: OwnedFd,
    tls: ServerConnection,
    leftover: Vec<u8>,
    identity: Identity,
    slot: Option<ConnectionSlot>,
}

/// A channel into a shard plus the waker of the task draining it.
pub(crate) struct Doorbell<T> {
    tx: Sender<T>,
    waker: Arc<AtomicWaker>,
}

impl<T> Doorbell<T> {
    /// Sends `value` and wakes the receiving task; false when it is gone.
    fn send(&self, value: T) -> bool {
        let ok = self.tx.send(value).is_ok();
        self.waker.wake();
        ok
    }
}

/// Every shard's doorbell, indexed by shard: where a handshake sends the
/// connections other shards own.
pub(crate) type Doorbells = Arc<Vec<Doorbell<Handoff>>>;

/// The receiving end of one shard's doorbell, drained by [`adopt_handoffs`].
pub(crate) struct HandoffInbox {
    rx: Receiver<Handoff>,
    waker: Arc<AtomicWaker>,
}

/// One hand-off channel per shard: the doorbells every shard sends on, and
/// each shard's inbox (indexed by shard).
pub(crate) fn handoff_channels(shards: usize) -> (Doorbells, Vec<HandoffInbox>) {
    let channels: Vec<_> = (0..shards)
        .map(|_| crossbeam_channel::unbounded::<Handoff>())
        .collect();
    let wakers: Vec<_> = (0..shards).map(|_| Arc::new(AtomicWaker::new())).collect();
    let doorbells = Arc::new(
        channels
            .iter()
            .zip(&wakers)
            .map(|((tx, _), w)| Doorbell {
                tx: tx.clone(),
                waker: w.clone(),
            })
            .collect(),
    );
    let inboxes = channels
        .into_iter()
        .zip(wakers)
        .map(|((_, rx), waker)| HandoffInbox { rx, waker })
        .collect();
    (doorbells, inboxes)
}

/// Polls a channel fed from other threads without spinning.
fn poll_channel<T>(rx: &Receiver<T>, waker: &AtomicWaker, cx: &mut Context<'_>) -> Poll<Option<T>> {
    for attempt in 0..2 {
        match rx.try_recv() {
            Ok(v) => return Poll::Ready(Some(v)),
            Err(TryRecvError::Disconnected) => return Poll::Ready(None),
            Err(TryRecvError::Empty) if attempt == 0 => waker.register(cx.waker()),
            Err(TryRecvError::Empty) => {}
        }
    }
    Poll::Pending
}

/// Serves connections other shards handed over.
pub(crate) async fn adopt_handoffs(local: Rc<ShardLocal>, inbox: HandoffInbox) {
    let HandoffInbox { rx, waker } = inbox;
    while let Some(h) = std::future::poll_fn(|cx| poll_channel(&rx, &waker, cx)).await {
        let stream = sys::adopt(h.fd);
        let session = TlsSession::new(h.tls, &h.leftover);
        let role = h.identity.role;
        let conn = Connection::new(local.clone(), stream, session, h.identity, h.slot);
        local.serving.serve(role, conn.run());
    }
}

/// Finishes the TLS handshake, identifies the client and sends the connection
/// to its owner shard (or serves it here, when this shard owns it).
pub(crate) async fn handshake(
    local: Rc<ShardLocal>,
    mut stream: TcpStream,
    doorbells: Doorbells,
    shutdown: Arc<ShutdownSignal>,
) {
    let peer = match stream.peer_addr() {
        Ok(p) => p,
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    let shared = local.shared.clone();
    // The closings version before the TLS configuration: a CRL reloaded
    // after this line either verifies this handshake or is looked at when
    // the session starts (`reload.rs`).
    let closures_seen = shared.policy.closures.version();
    let (server_config, identity_rule) = local.tls();
    let tls = match ServerConnection::new(server_config) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot create a TLS session");
            return;
        }
    };
    let mut session = TlsSession::new(tls, &[]);
    let timeout = shared.settings.handshake_timeout;
    let done = glommio::timer::timeout(timeout, async {
        session
            .handshake(&mut stream)
            .await
            .map_err(|e| glommio::GlommioError::IoError(std::io::Error::other(e.to_string())))
    })
    .await;
    if let Err(e) = done {
        local.stats.handshake_failures.add(1);
        // Anyone can fail handshakes at will: one line a second per shard.
        thread_local! {
            static FAILED_HANDSHAKES: LogThrottle = const { LogThrottle::new(Duration::from_secs(1)) };
        }
        log_throttled!(info, FAILED_HANDSHAKES.with(|t| t.admit(Instant::now())), "failures",
            { %peer, error = %e, },
            "TLS handshake failed");
        return;
    }
    if shutdown.is_triggered() {
        // Accepted while the broker stops: say goodbye at the TLS level so
        // the client reconnects, rather than handing it to a shard that is
        // ending.
        session.tls.send_close_notify();
        let _ = glommio::timer::timeout(Duration::from_secs(1), async {
            std::future::poll_fn(|cx| session.poll_flush(&mut stream, cx))
                .await
                .map_err(glommio::GlommioError::from)
        })
        .await;
        return;
    }
    let peer_cert = match identify(
        session.tls.peer_certificates().unwrap_or_default(),
        &identity_rule,
    ) {
        Ok(peer_cert) => peer_cert,
        Err(e) => {
            local
                .stats
                .connections_refused
                .add(ciphermq_stats::REFUSED_UNKNOWN_CLIENT);
            log_throttled!(warn, REFUSED.with(|t| t.admit(Instant::now())), "refusals",
                { %peer, reason = %e, },
                "refused: no identity in the client certificate");
            refuse(&mut stream, &mut session, &format!("Access denied: {e}")).await;
            return;
        }
    };
    let PeerCertificate { identity: cn, cert } = peer_cert;
    // One snapshot decides the role and travels with the connection.
    let policy = shared.policy.current();
    let role = policy.acl.role_of(&cn);
    if role == Role::Unknown {
        local
            .stats
            .connections_refused
            .add(ciphermq_stats::REFUSED_UNKNOWN_CLIENT);
        // Anyone our CA signed can be refused at will: one line a second.
        log_throttled!(warn, REFUSED.with(|t| t.admit(Instant::now())), "refusals",
            { %peer, %cn, },
            "refused: unknown client, its identity is in no [acl] list");
        refuse(
            &mut stream,
            &mut session,
            "Access denied: unknown client (role=unknown)",
        )
        .await;
        return;
    }
    let slot = match shared.policy.conn_limits.try_acquire(peer.ip(), &cn) {
        Ok(slot) => Some(slot),
        Err(e) => {
            local
                .stats
                .connections_refused
                .add(ciphermq_stats::REFUSED_CONNECTION_LIMIT);
            log_throttled!(warn, REFUSED.with(|t| t.admit(Instant::now())), "refusals",
                { %peer, %cn, reason = %e, },
                "refused: connection limit");
            refuse(&mut stream, &mut session, "Error: connection limit reached").await;
            return;
        }
    };
    local.stats.connections_accepted.add(1);
    let identity = Identity {
        cn: Arc::from(cn.as_str()),
        role,
        peer,
        policy,
        cert: Some(cert),
        closures_seen,
    };
    let owner = shard_of(&cn, shared.shards) as usize;
    let here = local.shard.borrow().id() as usize;
    if owner == here {
        let role = identity.role;
        let conn = Connection::new(local.clone(), stream, session, identity, slot);
        local.serving.serve(role, conn.run());
        return;
    }
    let fd = match sys::duplicate(&stream) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(%peer, error = %e, "cannot hand the connection over");
            return;
        }
    };
    drop(stream);
    let (tls, leftover) = session.into_parts();
    doorbells[owner].send(Handoff {
        fd,
        tls,
        leftover,
        identity,
        slot,
    });
}

thread_local! {
    /// Refused connections (unknown CN, connection caps), one line a second
    /// per shard.
    static REFUSED: LogThrottle = const { LogThrottle::new(Duration::from_secs(1)) };
}

/// Tells a refused client why in one line, then closes its TLS session
/// (waiting at most a second for the bytes to leave).
async fn refuse(stream: &mut TcpStream, session: &mut TlsSession, line: &str) {
    let mut bytes = line.as_bytes().to_vec();
    bytes.push(b'\n');
    if session.write_plaintext(&bytes).is_ok() {
        session.tls.send_close_notify();
        let _ = glommio::timer::timeout(Duration::from_secs(1), async {
            std::future::poll_fn(|cx| session.poll_flush(stream, cx))
                .await
                .map_err(glommio::GlommioError::from)
        })
        .await;
    }
}
