//! Start-up and the shard executors: one pinned glommio executor per shard,
//! each accepting on the shared port (SO_REUSEPORT), finishing TLS handshakes,
//! and handing each connection to the shard that owns its CN.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use ciphermq_pgbridge::{BridgeStatus, PgBridge};
use ciphermq_shard::log::MirrorWatermarks;
use ciphermq_shard::{
    shard_of, Durability, Mesh, MeshInbound, QueueSettings, RecoveredQueue, Shard,
};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use futures_lite::future;
use glommio::net::{TcpListener, TcpStream};
use glommio::{LocalExecutorBuilder, Placement, PoolPlacement};
use rustls::ServerConnection;

use crate::acl::Role;
use crate::admin::{AdminContext, AdminError, AdminServer};
use crate::committer;
use crate::config::Config;
use crate::connection::{Connection, Identity};
use crate::context::{Settings, ShardLocal, Shared};
use crate::handshake_gate::HandshakeGate;
use crate::log_throttle::LogThrottle;
use crate::policy::PolicyStore;
use crate::rate_limit::ConnectionSlot;
use crate::stats::{BrokerStats, Lifecycle};
use crate::storage::Storage;
use crate::sys;
use crate::tls::{peer_common_name, server_config};
use crate::tls_session::TlsSession;
use ciphermq_shard::durability::DiskSpace;

/// Locked memory each executor asks for (io_uring registered buffers).
const IO_MEMORY: usize = 512 * 1024;

/// Why the broker did not start; says what to change.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// io_uring or locked memory unavailable.
    #[error("{0}")]
    IoUring(String),
    /// Certificates or keys unusable.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The listen address could not be bound.
    #[error("server.address: cannot listen on {address}: {reason}")]
    Bind {
        /// The configured address.
        address: String,
        /// The OS error.
        reason: String,
    },
    /// The data directory could not be opened or recovered.
    #[error("{0}")]
    Storage(String),
    /// An executor thread failed to start.
    #[error("shard {shard} failed to start: {reason}")]
    Shard {
        /// Which shard.
        shard: usize,
        /// Why.
        reason: String,
    },
    /// The admin endpoint could not start (names `admin.address`).
    #[error(transparent)]
    Admin(#[from] AdminError),
}

/// A connection on its way to the shard that owns its CN.
struct Handoff {
    fd: OwnedFd,
    tls: ServerConnection,
    leftover: Vec<u8>,
    identity: Identity,
    slot: Option<ConnectionSlot>,
}

/// A channel into a shard plus the waker of the task draining it.
struct Doorbell<T> {
    tx: Sender<T>,
    waker: Arc<AtomicWaker>,
}

impl<T> Doorbell<T> {
    fn send(&self, value: T) -> bool {
        let ok = self.tx.send(value).is_ok();
        self.waker.wake();
        ok
    }
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

/// Tells every shard to stop.
#[derive(Default)]
struct ShutdownSignal {
    stop: AtomicBool,
    wakers: Vec<Arc<AtomicWaker>>,
}

impl ShutdownSignal {
    fn trigger(&self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
    }

    fn is_triggered(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    async fn wait(&self, shard: usize) {
        std::future::poll_fn(|cx| {
            if self.stop.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.wakers[shard].register(cx.waker());
            if self.stop.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// A running broker.
pub struct BrokerHandle {
    addr: SocketAddr,
    shards: usize,
    shared: Arc<Shared>,
    shutdown: Arc<ShutdownSignal>,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    /// The Postgres bridge; stopped after the shards, so it reads their last
    /// commits. Shared with the admin endpoint, which reads its status.
    bridge: Option<Arc<PgBridge>>,
    /// The admin endpoint, with `admin.enabled`.
    admin: Option<AdminServer>,
}

impl BrokerHandle {
    /// The address clients connect to (the real port when 0 was configured).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many shards serve.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The admin endpoint's address (the real port when 0 was configured),
    /// when `admin.enabled`.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::local_addr)
    }

    /// Stops accepting, closes connections and waits for the shards to end.
    pub fn shutdown(self) {
        self.shared.stats.set_lifecycle(Lifecycle::Stopping);
        self.shutdown.trigger();
        self.join();
    }

    /// Waits for the shards to end (after a shutdown from elsewhere), then
    /// stops the Postgres bridge.
    pub fn join(self) {
        for t in self.threads {
            if let Err(e) = t.join() {
                tracing::error!(error = %e, "shard ended with an error");
            }
        }
        self.shared.stats.set_lifecycle(Lifecycle::Stopping);
        if let Some(admin) = self.admin {
            admin.shutdown();
        }
        // The admin thread is gone, so this is the last handle (were it not,
        // dropping the last one would stop the bridge the same way).
        if let Some(bridge) = self.bridge.and_then(Arc::into_inner) {
            bridge.shutdown();
        }
    }

    /// The Postgres bridge's state (connection, rows written, lag), if it runs.
    pub fn bridge_status(&self) -> Option<BridgeStatus> {
        self.bridge.as_deref().map(PgBridge::status)
    }

    /// A function that applies the `[acl]` and `[rate_limit]` of a validated
    /// config to the running broker (SIGHUP): atomically, and connections whose
    /// CN lost its role are closed.
    pub fn reloader(&self) -> impl Fn(&Config) + Send + Sync + 'static {
        let shared = self.shared.clone();
        move |config| shared.policy.reload(config)
    }

    /// A function that stops the broker from another thread (signal handlers).
    pub fn stopper(&self) -> impl Fn() + Send + Sync + 'static {
        let signal = self.shutdown.clone();
        let shared = self.shared.clone();
        move || {
            shared.stats.set_lifecycle(Lifecycle::Stopping);
            signal.trigger()
        }
    }
}

/// Starts the broker described by a validated `config`.
pub fn start(config: &Config) -> Result<BrokerHandle, StartError> {
    sys::probe_io_uring().map_err(StartError::IoUring)?;
    let memlock = sys::raise_memlock_limit();
    // Every connection and every open segment holds a descriptor.
    let files = sys::raise_nofile_limit();
    tracing::debug!(files, "open-file limit");
    let shards = match config.server.shards {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n,
    };
    if memlock != u64::MAX && (memlock as usize) < IO_MEMORY * (shards + 1) {
        tracing::warn!(
            memlock,
            "low locked-memory limit; raise `ulimit -l` if shards fail to start"
        );
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let tls = server_config(
        &config.tls.cert_path,
        &config.tls.key_path,
        &config.tls.ca_cert_path,
    )?;
    let storage = Storage::open(config, shards)?;
    let shared = Arc::new(Shared {
        settings: Settings::from_config(config),
        policy: PolicyStore::new(config, shards),
        keys: storage.keys.clone(),
        tls,
        topology: storage.topology.clone(),
        shards,
        stats: BrokerStats::new(shards, config.admin.enabled),
    });
    // Bindings follow the ACL: those it does not allow go now, and on reload.
    shared.policy.guard_bindings(&shared.topology);
    let disk = Arc::new(DiskSpace::new());
    if let Some((data_dir, _)) = &storage.durable {
        let min_free = config.storage.min_free_mb.saturating_mul(1 << 20);
        crate::disk_watch::spawn(data_dir.clone(), min_free, &disk).map_err(|e| {
            StartError::Storage(format!("cannot start the disk space watcher thread: {e}"))
        })?;
        if min_free > 0 {
            shared.stats.watch_disk(disk.clone(), min_free);
        }
        shared.stats.set_findings(storage.findings());
    }
    let mut recovered = storage.recovered;
    let queue_settings = QueueSettings {
        max_len: config.performance.max_queue_size,
        max_deliveries: config.performance.max_deliveries,
        dedup_window: Duration::from_secs(config.performance.dedup_window_secs),
        ack_wait: (config.performance.ack_wait_secs > 0)
            .then(|| Duration::from_secs(config.performance.ack_wait_secs)),
        dedup_hasher: storage.dedup_hasher,
        carry_dedup: storage.durable.is_some(),
        max_fetch: config.performance.max_fetch,
        max_fetch_bytes: config.performance.max_fetch_bytes,
        max_prefetch: config.performance.max_prefetch,
    };

    let mut mesh = Mesh::build(shards);
    let handoff_channels: Vec<_> = (0..shards)
        .map(|_| crossbeam_channel::unbounded::<Handoff>())
        .collect();
    let handoff_wakers: Vec<_> = (0..shards).map(|_| Arc::new(AtomicWaker::new())).collect();
    let doorbells: Arc<Vec<Doorbell<Handoff>>> = Arc::new(
        handoff_channels
            .iter()
            .zip(&handoff_wakers)
            .map(|((tx, _), w)| Doorbell {
                tx: tx.clone(),
                waker: w.clone(),
            })
            .collect(),
    );
    let shutdown = Arc::new(ShutdownSignal {
        stop: AtomicBool::new(false),
        wakers: (0..shards).map(|_| Arc::new(AtomicWaker::new())).collect(),
    });

    // The shards listen with SO_REUSEPORT, which would let a second broker
    // on the same port silently take half the connections: make sure the
    // port is free first (a plain bind fails while anyone listens on it).
    probe_port(&config.server.address)?;
    // Bound before any shard serves, so a taken admin port fails the start.
    let admin_listener = if config.admin.enabled {
        Some(AdminServer::bind(&config.admin.address)?)
    } else {
        None
    };
    let mut address = config.server.address.clone();
    let mut threads = Vec::with_capacity(shards);
    let mut bound: Option<SocketAddr> = None;
    // Shard 0 binds first so that port 0 resolves to one port all shards share.
    let mut endpoints: Vec<_> = mesh.drain(..).map(Some).collect();
    let mut handoff_rx: Vec<_> = handoff_channels
        .into_iter()
        .map(|(_, rx)| Some(rx))
        .collect();
    for shard in 0..shards {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let endpoint = endpoints[shard].take().ok_or_else(|| StartError::Shard {
            shard,
            reason: "mesh endpoint missing".into(),
        })?;
        let rx = handoff_rx[shard].take().ok_or_else(|| StartError::Shard {
            shard,
            reason: "hand-off channel missing".into(),
        })?;
        let ctx = ShardStart {
            shard,
            address: address.clone(),
            shared: shared.clone(),
            queue_settings: queue_settings.clone(),
            endpoint,
            handoff_rx: rx,
            handoff_waker: handoff_wakers[shard].clone(),
            doorbells: doorbells.clone(),
            shutdown: shutdown.clone(),
            durable: storage.durable.clone(),
            mirror: storage.mirror.clone(),
            disk: disk.clone(),
            recovered: std::mem::take(&mut recovered[shard]),
        };
        let handle = LocalExecutorBuilder::new(Placement::Fixed(shard % cores))
            .name(&format!("shard-{shard}"))
            .io_memory(IO_MEMORY)
            // The thread that writes and fdatasyncs the logs (committer.rs):
            // free to run on any core while the shard keeps its own.
            .blocking_thread_pool_placement(PoolPlacement::Unbound(1))
            .spawn(move || run_shard(ctx, ready_tx))
            .map_err(|e| StartError::Shard {
                shard,
                reason: e.to_string(),
            })?;
        match ready_rx.recv() {
            Ok(Ok(addr)) => {
                if bound.is_none() {
                    bound = Some(addr);
                    address = addr.to_string();
                }
            }
            Ok(Err(reason)) => {
                shutdown.trigger();
                return Err(StartError::Bind {
                    address: config.server.address.clone(),
                    reason,
                });
            }
            Err(_) => {
                shutdown.trigger();
                let reason = match handle.join() {
                    Err(e) => e.to_string(),
                    Ok(()) => "stopped before it was ready".into(),
                };
                return Err(StartError::Shard { shard, reason });
            }
        }
        threads.push(handle);
    }
    let addr = bound.ok_or_else(|| StartError::Shard {
        shard: 0,
        reason: "no shard bound".into(),
    })?;
    tracing::info!(%addr, shards, "CipherMQ broker listening");
    let bridge = storage.bridge.map(Arc::new);
    let admin = match admin_listener {
        None => None,
        Some(listener) => {
            let context = AdminContext {
                shared: shared.clone(),
                name: config.server.name.clone(),
                storage_mode: config.storage.mode.as_str(),
                data_dir: storage
                    .durable
                    .as_ref()
                    .map(|(dir, _)| dir.display().to_string()),
                bridge: bridge.clone(),
            };
            match AdminServer::start(listener, context) {
                Ok(admin) => Some(admin),
                Err(e) => {
                    shutdown.trigger();
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e.into());
                }
            }
        }
    };
    shared.stats.set_lifecycle(Lifecycle::Serving);
    Ok(BrokerHandle {
        addr,
        shards,
        shared,
        shutdown,
        threads,
        bridge,
        admin,
    })
}

/// Fails when another process already listens on `address` (port 0 is always
/// free). A plain test bind would also fail on the TIME_WAIT leftovers of a
/// broker that just stopped, so this asks the port itself: a connection that
/// is accepted means a listener is there.
fn probe_port(address: &str) -> Result<(), StartError> {
    let bind_err = |reason: String| StartError::Bind {
        address: address.to_owned(),
        reason,
    };
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(address)
        .map_err(|e| bind_err(e.to_string()))?
        .collect();
    let Some(mut addr) = addrs.first().copied() else {
        return Err(bind_err("resolves to no address".into()));
    };
    if addr.port() == 0 {
        return Ok(());
    }
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        Ok(_) => Err(bind_err(
            "another process is already listening there".into(),
        )),
        Err(_) => Ok(()),
    }
}

/// What one shard's executor starts with.
struct ShardStart {
    shard: usize,
    address: String,
    shared: Arc<Shared>,
    queue_settings: QueueSettings,
    endpoint: ciphermq_shard::MeshEndpoint,
    handoff_rx: Receiver<Handoff>,
    handoff_waker: Arc<AtomicWaker>,
    doorbells: Arc<Vec<Doorbell<Handoff>>>,
    shutdown: Arc<ShutdownSignal>,
    /// `Some(data_dir, segment_bytes)` for durable queues.
    durable: Option<(PathBuf, u64)>,
    /// With the Postgres bridge: what it has read of each log.
    mirror: Option<Arc<MirrorWatermarks>>,
    /// Free space on the data directory's filesystem, as last looked at.
    disk: Arc<DiskSpace>,
    /// This shard's queues as their logs left them.
    recovered: Vec<(Arc<str>, RecoveredQueue)>,
}

async fn run_shard(ctx: ShardStart, ready: std::sync::mpsc::Sender<Result<SocketAddr, String>>) {
    let listener = match TcpListener::bind(ctx.address.as_str()) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    let ciphermq_shard::MeshEndpoint { outbound, inbound } = ctx.endpoint;
    let durable = ctx
        .durable
        .map(|(dir, segment)| Durability::new(dir, segment, ctx.mirror, ctx.disk));
    let is_durable = durable.is_some();
    let mut state = Shard::new(
        ctx.queue_settings,
        ctx.shared.topology.clone(),
        outbound,
        durable,
    );
    let now = Instant::now();
    for (name, queue) in ctx.recovered {
        state.restore_queue(name, queue, now);
    }
    let stats = ctx.shared.stats.shard(ctx.shard).clone();
    crate::stats::enter(stats.clone());
    let local = Rc::new(ShardLocal {
        shard: RefCell::new(state),
        limiters: RefCell::new((0, HashMap::new())),
        staging: RefCell::new(Vec::new()),
        shared: ctx.shared.clone(),
        stats,
    });
    glommio::spawn_local(drain_mesh(local.clone(), inbound)).detach();
    glommio::spawn_local(adopt_handoffs(
        local.clone(),
        ctx.handoff_rx,
        ctx.handoff_waker,
    ))
    .detach();
    glommio::spawn_local(watch_policy(local.clone(), ctx.shard)).detach();
    glommio::spawn_local(sweep_deliveries(local.clone())).detach();
    let committing = Rc::new(Cell::new(0usize));
    if is_durable {
        committer::spawn(local.clone(), committing.clone());
    }
    let _ = ready.send(Ok(addr));

    let shard = ctx.shard;
    // Handshakes in progress: the shard must not end under them, or their
    // sockets would never be closed (closing needs the running reactor).
    let handshaking = Rc::new(Cell::new(0usize));
    let performance = &ctx.shared.settings;
    let gate = HandshakeGate::new(
        performance.max_handshakes,
        performance.max_handshakes_per_ip,
        ctx.shared.shards,
    );
    let turned_away = LogThrottle::new(Duration::from_secs(1));
    let accept_loop = async {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    // Before any TLS: a flood of handshakes holds a bounded
                    // number of sockets and sessions.
                    let peer = stream.peer_addr().map(|a| a.ip());
                    let place = match peer.as_ref().map(|ip| gate.admit(*ip)) {
                        Ok(Ok(place)) => place,
                        Ok(Err(refusal)) => {
                            local.stats.handshakes_refused.add(1);
                            if let Some(skipped) = turned_away.admit(Instant::now()) {
                                tracing::warn!(peer = ?peer, ?refusal, skipped, "connection closed before its handshake: too many handshakes in progress (performance.max_handshakes / max_handshakes_per_ip)");
                            }
                            drop(stream);
                            continue;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "accepted a connection already gone");
                            continue;
                        }
                    };
                    let guard = (InFlight::enter(&handshaking), place);
                    let task = handshake(
                        local.clone(),
                        stream,
                        ctx.doorbells.clone(),
                        ctx.shutdown.clone(),
                    );
                    glommio::spawn_local(async move {
                        task.await;
                        drop(guard);
                    })
                    .detach();
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "accept failed");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    };
    future::or(accept_loop, ctx.shutdown.wait(shard)).await;
    drop(listener);
    for mailbox in local.shard.borrow().mailboxes() {
        mailbox.close();
    }
    // Connections answer what they accepted (their publishes wait for the
    // last commit rounds), say goodbye, and go; then the shard ends.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let busy = committing.get() > 0 || handshaking.get() > 0 || {
            let shard = local.shard.borrow();
            shard.has_commit_work() || shard.mailboxes().next().is_some()
        };
        if !busy {
            break;
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
}

/// Counts a task as running until dropped.
struct InFlight(Rc<Cell<usize>>);

impl InFlight {
    fn enter(count: &Rc<Cell<usize>>) -> InFlight {
        count.set(count.get() + 1);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Wakes every connection of this shard when the policy is reloaded, so those
/// whose role changed close even when idle.
async fn watch_policy(local: Rc<ShardLocal>, shard: usize) {
    let mut seen = local.shared.policy.version();
    loop {
        seen = local.shared.policy.changed(shard, seen).await;
        for mailbox in local.shard.borrow().mailboxes() {
            mailbox.wake();
        }
    }
}

/// Redelivers deliveries unacked past `performance.ack_wait_secs`.
async fn sweep_deliveries(local: Rc<ShardLocal>) {
    loop {
        glommio::timer::sleep(Duration::from_secs(1)).await;
        local.with_shard(|shard| shard.sweep(Instant::now()));
        if local.shared.stats.collects() {
            local.stats.refresh(&local.shard.borrow());
        }
    }
}

/// Applies batches from other shards.
async fn drain_mesh(local: Rc<ShardLocal>, inbound: MeshInbound) {
    while let Some(batch) = std::future::poll_fn(|cx| inbound.poll_recv(cx)).await {
        let now = Instant::now();
        local.with_shard(|shard| {
            for msg in batch {
                shard.handle(msg, now);
            }
        });
    }
}

/// Serves connections other shards handed over.
async fn adopt_handoffs(local: Rc<ShardLocal>, rx: Receiver<Handoff>, waker: Arc<AtomicWaker>) {
    while let Some(h) = std::future::poll_fn(|cx| poll_channel(&rx, &waker, cx)).await {
        let stream = sys::adopt(h.fd);
        let session = TlsSession::new(h.tls, &h.leftover);
        let conn = Connection::new(local.clone(), stream, session, h.identity, h.slot);
        glommio::spawn_local(conn.run()).detach();
    }
}

/// Finishes the TLS handshake, identifies the client and sends the connection
/// to its owner shard.
async fn handshake(
    local: Rc<ShardLocal>,
    mut stream: TcpStream,
    doorbells: Arc<Vec<Doorbell<Handoff>>>,
    shutdown: Arc<ShutdownSignal>,
) {
    let peer = match stream.peer_addr() {
        Ok(p) => p,
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    let shared = local.shared.clone();
    let tls = match ServerConnection::new(shared.tls.clone()) {
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
        if let Some(skipped) = FAILED_HANDSHAKES.with(|t| t.admit(Instant::now())) {
            tracing::info!(%peer, error = %e, skipped, "TLS handshake failed (skipped: failures not logged since the last line)");
        }
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
    let cn = session.tls.peer_certificates().and_then(peer_common_name);
    // One snapshot decides the role and travels with the connection.
    let policy = shared.policy.current();
    let role = cn
        .as_deref()
        .map(|cn| policy.acl.role_of(cn))
        .unwrap_or(Role::Unknown);
    let Some(cn) = cn.filter(|_| role != Role::Unknown) else {
        local.stats.connections_refused.add(1);
        tracing::warn!(%peer, "refused: unknown client");
        refuse(
            &mut stream,
            &mut session,
            "Access denied: unknown client (role=unknown)",
        )
        .await;
        return;
    };
    let slot = match shared.policy.conn_limits.try_acquire(peer.ip(), &cn) {
        Ok(slot) => Some(slot),
        Err(e) => {
            local.stats.connections_refused.add(1);
            tracing::warn!(%peer, %cn, reason = %e, "refused: connection limit");
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
    };
    let owner = shard_of(&cn, shared.shards) as usize;
    let here = local.shard.borrow().id() as usize;
    if owner == here {
        Connection::new(local, stream, session, identity, slot)
            .run()
            .await;
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
