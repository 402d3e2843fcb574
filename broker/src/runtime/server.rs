//! Starting the broker, and the handle that holds it while it runs.
//!
//! [`start`] does everything that can fail before a client is served: io_uring
//! and resource limits, TLS, the data directory ([`crate::storage`]), the
//! shared state, the port probe and the admin endpoint; then it starts one
//! pinned glommio executor per shard (what each runs is `runtime::shard`) and
//! waits until every shard listens. [`BrokerHandle`] stops the broker again
//! (the signal and the shards' drain are in `shutdown`), so start and stop
//! are read side by side here, and a failed start says what to change
//! ([`StartError`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ciphermq_pgbridge::{BridgeStatus, PgBridge};
use ciphermq_shard::durability::DiskSpace;
use ciphermq_shard::{Mesh, QueueSettings};
use glommio::{LocalExecutorBuilder, Placement, PoolPlacement};

use ciphermq_admin::{AdminContext, AdminError, AdminServer};

use crate::access::policy::PolicyStore;
use crate::access::reload::ReloadError;
use crate::admin_view::AdminView;
use crate::config::Config;
use crate::conn::handoff::handoff_channels;
use crate::liveness::pulse::Pulses;
use crate::runtime::context::{Settings, Shared};
use crate::runtime::shard::{run_shard, ShardStart};
use crate::runtime::shutdown::{Drain, ShutdownSignal};
use crate::runtime::sys;
use crate::storage::{Storage, StorageError};
use crate::tls::material::TlsMaterial;
use crate::tls::store::TlsStore;
use ciphermq_stats::{BrokerStats, Lifecycle};

/// How long a task queue runs before glommio looks at finished I/O again
/// (default 100 ms). It bounds two waits on a busy shard: between a finished
/// `fdatasync` and its answers (the committer's queue does not ask for low
/// latency, `committer.rs` says why), and, for a consumer woken by nothing
/// else, between its acks reaching the socket and the deliveries they make
/// room for (`serving.rs`). Connections yield when it is reached
/// (`connection.rs`). Shorter periods either brought back long sleeps or
/// made soaks at half the peak worse; longer ones cost a pipelined
/// publisher's rate (docs/DECISIONS.md, "The preempt timer is 3 ms").
pub(crate) const PREEMPT_TIMER: std::time::Duration = std::time::Duration::from_millis(3);

/// Locked memory each executor asks for (io_uring registered buffers).
const IO_MEMORY: usize = 512 * 1024;

/// Why the broker did not start; says what to change.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration breaks a rule only visible once the command line
    /// has overridden it (`--address` equal to `admin.address`).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// io_uring or locked memory unavailable.
    #[error("{0}")]
    IoUring(String),
    /// Certificates or keys unusable.
    #[error(transparent)]
    Tls(#[from] crate::tls::material::TlsError),
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
    /// The node could not join its cluster.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterStartError),
}

impl From<StorageError> for StartError {
    fn from(e: StorageError) -> StartError {
        StartError::Storage(e.to_string())
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

    /// Where `/health` and `/ready` are served over plain HTTP, when
    /// `admin.probe_address` is set.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(AdminServer::probe_addr)
    }

    /// Stops accepting, closes connections and waits for the shards to end
    /// (at most `server.shutdown_timeout_secs`, then they give up).
    pub fn shutdown(self) -> Drain {
        self.shared.stats.set_lifecycle(Lifecycle::Stopping);
        self.shutdown.trigger();
        self.join()
    }

    /// Waits for the shards to end (after a shutdown from elsewhere), then
    /// stops the Postgres bridge. Says whether every shard finished its
    /// drain, or some gave up at `server.shutdown_timeout_secs`.
    pub fn join(self) -> Drain {
        for t in self.threads {
            if let Err(e) = t.join() {
                tracing::error!(error = %e, "shard ended with an error");
            }
        }
        let drain = if self.shared.pulses.any_gave_up() {
            Drain::GaveUp
        } else {
            Drain::Finished
        };
        self.shared.stats.set_lifecycle(Lifecycle::Stopping);
        if let Some(admin) = self.admin {
            admin.shutdown();
        }
        if let Some(cluster) = &self.shared.cluster {
            cluster.stop();
        }
        // The admin thread is gone, so this is the last handle (were it not,
        // dropping the last one would stop the bridge the same way).
        if let Some(bridge) = self.bridge.and_then(Arc::into_inner) {
            bridge.shutdown();
        }
        drain
    }

    /// Each shard's heartbeat and what its drain waits for, readable from
    /// any thread (the systemd watchdog, the shutdown's log).
    pub fn pulses(&self) -> Arc<Pulses> {
        self.shared.pulses.clone()
    }

    /// The Postgres bridge's state (connection, rows written, lag), if it runs.
    pub fn bridge_status(&self) -> Option<BridgeStatus> {
        self.bridge.as_deref().map(PgBridge::status)
    }

    /// A function that applies the `[tls]`, `[acl]` and `[rate_limit]` of a
    /// validated config to the running broker, as SIGHUP does with the file
    /// (see [`crate::access::reload`]): all or nothing, the outcome logged.
    /// Connections whose CN lost its role, or whose certificate a new CRL
    /// revokes, are closed.
    pub fn reloader(&self) -> impl Fn(&Config) -> Result<(), ReloadError> + Send + Sync + 'static {
        let shared = self.shared.clone();
        move |config| shared.reload(config, std::path::Path::new("(config in memory)"))
    }

    /// Names the config file that SIGHUP and `POST /api/reload` read
    /// `[tls]`, `[acl]` and `[rate_limit]` from again.
    pub fn reload_from(&self, path: std::path::PathBuf) {
        self.shared.set_config_file(path);
    }

    /// A function that reloads the config file named by
    /// [`Self::reload_from`] (SIGHUP); it logs the outcome.
    pub fn file_reloader(&self) -> impl Fn() -> Result<(), ReloadError> + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.reload_file()
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
    // Checked at load too; again here for `--address`, which comes after.
    config.validate_admin_address()?;
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
    // Shard i runs on the i-th CPU this process may use (wrapping), not on
    // CPU i: under `taskset` or a container's cpuset the two differ.
    let cpus = sys::allowed_cpus();
    let tls = crate::tls::material::load(&config.tls)?;
    let storage = Storage::open(config, shards)?;
    let shared = shared_state(config, shards, &storage, tls);
    let queue_settings = queue_settings(config, &storage, shards);
    let disk = Arc::new(DiskSpace::new());
    if let Some((data_dir, _)) = &storage.durable {
        let min_free = config.storage.min_free_mb.saturating_mul(1 << 20);
        crate::storage::disk_watch::spawn(data_dir.clone(), min_free, &disk).map_err(|e| {
            StartError::Storage(format!("cannot start the disk space watcher thread: {e}"))
        })?;
        if min_free > 0 {
            shared.stats.watch_disk(
                disk.clone(),
                min_free,
                crate::storage::disk_watch::resume_at(min_free),
            );
        }
        shared.stats.set_findings(storage.findings());
    }
    let mut recovered = storage.recovered;

    let mut mesh = Mesh::build(shards);
    let injector = mesh
        .first()
        .map(|endpoint| endpoint.outbound.injector())
        .ok_or_else(|| StartError::Shard {
            shard: 0,
            reason: "no mesh endpoint".into(),
        })?;
    let handover_dir = storage.durable.as_ref().map(|(dir, _)| dir.clone());
    let mirror = storage.mirror.clone();
    let dedup_hasher = storage.dedup_hasher;
    let (doorbells, inboxes) = handoff_channels(shards);
    let shutdown = Arc::new(ShutdownSignal::new(shards));

    // The shards listen with SO_REUSEPORT, which would let a second broker
    // on the same port silently take half the connections: make sure the
    // port is free first (a plain bind fails while anyone listens on it).
    probe_port(&config.server.address)?;
    // Bound before any shard serves, so a taken admin port fails the start.
    let admin_listener = if config.admin.enabled {
        Some(AdminServer::bind(&config.admin)?)
    } else {
        None
    };
    let mut address = config.server.address.clone();
    let mut threads = Vec::with_capacity(shards);
    let mut bound: Option<SocketAddr> = None;
    // Shard 0 binds first so that port 0 resolves to one port all shards share.
    let mut endpoints: Vec<_> = mesh.drain(..).map(Some).collect();
    let mut inboxes: Vec<_> = inboxes.into_iter().map(Some).collect();
    for shard in 0..shards {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let endpoint = endpoints[shard].take().ok_or_else(|| StartError::Shard {
            shard,
            reason: "mesh endpoint missing".into(),
        })?;
        let handoffs = inboxes[shard].take().ok_or_else(|| StartError::Shard {
            shard,
            reason: "hand-off channel missing".into(),
        })?;
        let ctx = ShardStart {
            shard,
            address: address.clone(),
            shared: shared.clone(),
            queue_settings: queue_settings.clone(),
            endpoint,
            handoffs,
            doorbells: doorbells.clone(),
            shutdown: shutdown.clone(),
            durable: storage.durable.clone(),
            mirror: storage.mirror.clone(),
            disk: disk.clone(),
            recovered: std::mem::take(&mut recovered[shard]),
        };
        let first_poll = crate::liveness::nudge::FirstPoll::default();
        let marked = first_poll.clone();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpus[shard % cpus.len()]))
            .name(&format!("shard-{shard}"))
            .io_memory(IO_MEMORY)
            // Turns short enough that a finished commit is answered soon:
            // see PREEMPT_TIMER.
            .preempt_timer(PREEMPT_TIMER)
            // The thread that writes and fdatasyncs the logs (committer.rs):
            // free to run on any core while the shard keeps its own.
            .blocking_thread_pool_placement(PoolPlacement::Unbound(1))
            .spawn(move || marked.mark(run_shard(ctx, ready_tx)))
            .map_err(|e| StartError::Shard {
                shard,
                reason: e.to_string(),
            })?;
        // A shard that fell asleep before its first poll is woken here.
        // `run_shard` answers within that first poll (it awaits nothing
        // before `ready`), so no park can come between the mark and the
        // word: signals are needed only before it.
        let thread = handle.thread().name().unwrap_or_default().to_owned();
        match crate::liveness::nudge::await_first_word(&ready_rx, &thread, &first_poll) {
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
    // Every shard runs: from here on one that falls asleep with work still
    // to run is woken from outside (nudge.rs).
    if let Err(e) = crate::liveness::nudge::spawn(&shared.pulses, shared.stats.shards().to_vec()) {
        tracing::warn!(error = %e, "no thread for waking sleeping shards; a shard may sleep up to a second with work waiting");
    }
    if let Some(cluster) = &shared.cluster {
        let handover = crate::cluster::Handover {
            data_dir: handover_dir,
            dedup_hasher,
            window_ms: config.performance.dedup_window_secs.saturating_mul(1000),
            injector,
        };
        if let Some(mirror) = &mirror {
            // The mirror's rows say which copy they describe: this node's,
            // at the owner's placement epoch.
            let (cluster, topology) = (cluster.clone(), shared.topology.clone());
            mirror.set_epochs(Arc::new(move |queue: &str| {
                let owner = topology.snapshot().queue(queue).map(|q| q.owner.clone());
                owner.map_or(0, |owner| cluster.view().current().1.stored_epoch(&owner))
            }));
        }
        if let Err(e) = cluster.start(addr, &shared, handover) {
            shutdown.trigger();
            for t in threads {
                let _ = t.join();
            }
            return Err(e.into());
        }
    }
    tracing::info!(%addr, shards, "CipherMQ broker listening");
    let bridge = storage.bridge.map(Arc::new);
    let admin = match admin_listener {
        None => None,
        Some(listener) => {
            let context = AdminContext {
                broker: Arc::new(AdminView::new(shared.clone())),
                name: config.server.name.clone(),
                storage_mode: config.storage.mode.as_str(),
                data_dir: storage
                    .durable
                    .as_ref()
                    .map(|(dir, _)| dir.display().to_string()),
                bridge: bridge.clone(),
                queue_series: config.admin.queue_series(),
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

/// What every shard shares, wired as serving needs it: the ACL guards the
/// topology's bindings (those it does not allow go now, and on reload) and
/// receivers' declares and binds are held to their quotas. One function for
/// start-up and for the command tests, so both run on the same wiring.
pub(crate) fn shared_state(
    config: &Config,
    shards: usize,
    storage: &Storage,
    tls: TlsMaterial,
) -> Arc<Shared> {
    let policy = PolicyStore::new(config, shards);
    policy.revoke_certificates(tls.revoked.clone());
    let shared = Arc::new(Shared {
        settings: Settings::from_config(config),
        policy,
        keys: storage.keys.clone(),
        tls: TlsStore::new(tls),
        topology: storage.topology.clone(),
        shards,
        stats: BrokerStats::new(shards, config.admin.enabled),
        config_file: OnceLock::new(),
        reloading: Mutex::new(()),
        pulses: Arc::new(Pulses::new(shards)),
        cluster: crate::cluster::ClusterNode::from_config(config),
    });
    // Bindings follow the ACL: those it does not allow go now, and on reload.
    shared.policy.guard_bindings(&shared.topology);
    // Receivers' declares and binds are held to their quotas from here on.
    shared.topology.set_quotas(shared.settings.quotas);
    shared
}

/// The limits every queue is created with (`performance`), and the dedup
/// key of `storage`; deduplication carries over restarts only when queues
/// are durable. In memory mode each of the `shards` holds at most its part
/// of `storage.memory_budget_mb` of bodies.
pub(crate) fn queue_settings(config: &Config, storage: &Storage, shards: usize) -> QueueSettings {
    let p = &config.performance;
    let budget = config.storage.memory_budget_mb.saturating_mul(1 << 20);
    QueueSettings {
        max_len: p.max_queue_size,
        max_bytes: p.max_queue_bytes,
        shard_bytes: storage
            .durable
            .is_none()
            .then(|| budget.div_ceil(shards.max(1) as u64)),
        spill_bytes: storage
            .durable
            .is_some()
            .then(|| budget.div_ceil(shards.max(1) as u64)),
        max_deliveries: p.max_deliveries,
        dedup_window: Duration::from_secs(p.dedup_window_secs),
        ack_wait: (p.ack_wait_secs > 0).then(|| Duration::from_secs(p.ack_wait_secs)),
        dedup_hasher: storage.dedup_hasher,
        carry_dedup: storage.durable.is_some(),
        max_fetch: p.max_fetch,
        max_fetch_bytes: p.max_fetch_bytes,
        max_prefetch: p.max_prefetch,
        max_prefetch_bytes: p.max_prefetch_bytes,
    }
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
