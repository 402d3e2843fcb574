//! What a connection needs besides its socket: settings and services shared by
//! every shard ([`Shared`]), and the state of the shard serving it ([`ShardLocal`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::Location;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ciphermq_keystore::PublicKeyStore;
use ciphermq_shard::{Quotas, Shard, TopologyStore};

use crate::access::identity::IdentityRule;
use crate::access::policy::{Policy, PolicyStore};
use crate::access::rate_limit::CnLimiter;
use crate::cluster::{ClusterNode, Placements, Residence};
use crate::config::Config;
use crate::conn::serving::Serving;
use crate::liveness::pulse::Pulses;
use crate::storage::finished_io::FinishedIo;
use crate::tls::material::TlsMaterial;
use crate::tls::store::TlsStore;
use ciphermq_stats::{BrokerStats, ShardStats};

/// Connection-level settings taken from the config.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `performance.max_line_bytes`.
    pub max_line_bytes: usize,
    /// `performance.max_message_bytes`.
    pub max_message_bytes: usize,
    /// `performance.default_prefetch`.
    pub default_prefetch: u32,
    /// `performance.max_pending_replies`.
    pub max_pending_replies: usize,
    /// `performance.max_pending_reply_bytes`.
    pub max_pending_reply_bytes: usize,
    /// `performance.max_batch_elements`.
    pub max_batch_elements: usize,
    /// `performance.handshake_timeout_secs`.
    pub handshake_timeout: Duration,
    /// `performance.max_handshakes`: in progress at once, whole broker.
    pub max_handshakes: u32,
    /// `performance.max_handshakes_per_ip`: in progress at once, one address.
    pub max_handshakes_per_ip: u32,
    /// `performance.idle_timeout_sec`; `None` = never.
    pub idle_timeout: Option<Duration>,
    /// `performance.heartbeat_timeout` (receivers); `None` = never.
    pub heartbeat_timeout: Option<Duration>,
    /// `performance.max_reply_bytes_per_turn`: rendered before a connection
    /// yields its shard.
    pub max_reply_bytes_per_turn: usize,
    /// `performance.max_{queues,exchanges,bindings}_per_cn`.
    pub quotas: Quotas,
    /// `performance.max_fetch`, for the admin status (queues apply it).
    pub max_fetch: u32,
    /// `performance.max_fetch_bytes`, likewise.
    pub max_fetch_bytes: usize,
    /// `performance.max_prefetch`, likewise.
    pub max_prefetch: u32,
    /// `performance.max_prefetch_bytes`, likewise.
    pub max_prefetch_bytes: u64,
    /// `performance.max_unacked_per_connection`: what a connection may hold
    /// through `fetch` (its sessions apply it).
    pub max_unacked_per_connection: usize,
    /// `performance.max_queue_size`, likewise.
    pub max_queue_size: usize,
    /// `performance.max_queue_bytes` (0: none), likewise.
    pub max_queue_bytes: u64,
    /// `storage.memory_budget_mb`, in bytes, for the admin status (the
    /// queues of each shard apply their part in memory mode).
    pub memory_budget_bytes: u64,
    /// `server.shutdown_timeout_secs`: how long a stopping shard drains
    /// before it gives up; `None` = as long as it takes.
    pub shutdown_timeout: Option<Duration>,
}

fn secs(n: u64) -> Option<Duration> {
    (n > 0).then(|| Duration::from_secs(n))
}

impl Settings {
    /// Derives the settings from a validated config.
    pub(crate) fn from_config(config: &Config) -> Settings {
        let p = &config.performance;
        Settings {
            max_line_bytes: p.max_line_bytes,
            max_message_bytes: p.max_message_bytes,
            default_prefetch: p.default_prefetch,
            max_pending_replies: p.max_pending_replies,
            max_pending_reply_bytes: p.max_pending_reply_bytes,
            max_batch_elements: p.max_batch_elements,
            handshake_timeout: Duration::from_secs(p.handshake_timeout_secs.max(1)),
            max_handshakes: p.max_handshakes,
            max_handshakes_per_ip: p.max_handshakes_per_ip,
            idle_timeout: secs(p.idle_timeout_sec),
            heartbeat_timeout: secs(p.heartbeat_timeout),
            max_reply_bytes_per_turn: p.max_reply_bytes_per_turn,
            quotas: Quotas {
                queues_per_cn: p.max_queues_per_cn,
                exchanges_per_cn: p.max_exchanges_per_cn,
                bindings_per_cn: p.max_bindings_per_cn,
            },
            max_fetch: p.max_fetch,
            max_fetch_bytes: p.max_fetch_bytes,
            max_prefetch: p.max_prefetch,
            max_prefetch_bytes: p.max_prefetch_bytes,
            max_unacked_per_connection: p.max_unacked_per_connection,
            max_queue_size: p.max_queue_size,
            max_queue_bytes: p.max_queue_bytes,
            memory_budget_bytes: config.storage.memory_budget_mb.saturating_mul(1 << 20),
            shutdown_timeout: secs(config.server.shutdown_timeout_secs),
        }
    }
}

/// Shared by every shard: read-only or internally synchronized.
pub(crate) struct Shared {
    /// Connection settings.
    pub settings: Settings,
    /// `[acl]` and `[rate_limit]`, reloadable.
    pub policy: PolicyStore,
    /// Public keys.
    pub keys: Arc<dyn PublicKeyStore>,
    /// `[tls]` in force: server configuration, identity rule, CRLs
    /// (reloadable; a handshake takes it through [`ShardLocal::tls`]).
    pub tls: TlsStore,
    /// Topology writer.
    pub topology: Arc<TopologyStore>,
    /// Number of shards.
    pub shards: usize,
    /// What the shards publish for the admin endpoint.
    pub stats: BrokerStats,
    /// The config file reloads read, once the binary names it.
    pub(crate) config_file: OnceLock<PathBuf>,
    /// Held while a reload applies (`reload.rs`).
    pub(crate) reloading: Mutex<()>,
    /// Each shard's heartbeat and, once stopping, what its drain waits for:
    /// read by the systemd watchdog and `ciphermq-broker`'s shutdown.
    pub pulses: Arc<Pulses>,
    /// This broker's part in a cluster, with `cluster.enabled`.
    pub cluster: Option<Arc<ClusterNode>>,
}

/// One shard's state, owned by its executor thread.
pub(crate) struct ShardLocal {
    /// Queues, mailboxes, mesh.
    pub shard: RefCell<Shard>,
    /// Per-CN token buckets: all connections of a CN live on this shard.
    /// Rebuilt (full) when the policy version moves.
    pub limiters: RefCell<(u64, HashMap<Arc<str>, CnLimiter>)>,
    /// Cross-shard services and settings.
    pub shared: Arc<Shared>,
    /// This shard's counters (written only by this thread).
    pub stats: Arc<ShardStats>,
    /// Rendered replies on their way into rustls, shared by the shard's
    /// connections (used only inside one synchronous step).
    pub staging: RefCell<Vec<u8>>,
    /// Where the last [`ShardLocal::with_shard`] was called from, named by
    /// the stall watch (`stall_watch.rs`) when a turn comes late.
    last_step: Cell<Option<&'static Location<'static>>>,
    /// The task queues connections are served from (`serving.rs`).
    pub serving: Serving,
    /// The `[tls]` this shard's handshakes last used, and its version.
    tls: RefCell<(u64, Arc<TlsMaterial>)>,
    /// The cluster's placement snapshot this shard last read, and its
    /// version (empty outside a cluster).
    placements: RefCell<(u64, Arc<Placements>)>,
    /// With `cluster.storage = "shared"`: this node's lease, without which
    /// no answer leaves (see [`ShardLocal::may_answer`]).
    ack_gate: Option<Arc<ciphermq_cluster::shared_storage::LeaseGate>>,
    /// Commit writes finished on the blocking-I/O thread, for connections
    /// to notice between lines (`storage/finished_io.rs`).
    pub finished_io: FinishedIo,
}

impl ShardLocal {
    /// The state of a shard around `shard`, as its executor starts it:
    /// no rate-limit buckets yet, an empty staging buffer.
    pub(crate) fn new(shard: Shard, shared: Arc<Shared>, stats: Arc<ShardStats>) -> ShardLocal {
        let tls = RefCell::new(shared.tls.current());
        let placements = match &shared.cluster {
            Some(cluster) => cluster.view().current(),
            None => (0, Arc::default()),
        };
        let ack_gate = shared
            .cluster
            .as_ref()
            .filter(|c| c.shared_logs().is_some())
            .map(|c| c.lease_gate().clone());
        ShardLocal {
            ack_gate,
            tls,
            placements: RefCell::new(placements),
            shard: RefCell::new(shard),
            limiters: RefCell::new((0, HashMap::new())),
            shared,
            stats,
            staging: RefCell::new(Vec::new()),
            last_step: Cell::new(None),
            serving: Serving::default(),
            finished_io: FinishedIo::default(),
        }
    }

    /// Whether answers may still be sent: always, except on shared storage
    /// once this node's lease ran out. Its `ACK`s were decided while the
    /// lease held (`committer.rs` checks after each fsync), but one that
    /// leaves now could reach its client after another node took the owner
    /// over, as if two holders acknowledged at once: a connection with
    /// output waiting is closed instead, and its client retries (the
    /// message ids make a retry of a stored message a duplicate).
    pub(crate) fn may_answer(&self) -> bool {
        self.ack_gate
            .as_ref()
            .is_none_or(|gate| gate.is_valid(std::time::Instant::now()))
    }

    /// What a handshake starting now needs of the `[tls]` in force: the
    /// server configuration and the identity rule. One atomic load, and the
    /// store's lock only after a reload.
    pub(crate) fn tls(&self) -> (Arc<rustls::ServerConfig>, IdentityRule) {
        let version = self.shared.tls.version();
        let mut cached = self.tls.borrow_mut();
        if cached.0 != version {
            *cached = self.shared.tls.current();
        }
        (cached.1.server.clone(), cached.1.identity.clone())
    }

    /// Where `owner` lives, from this node's point of view: always here
    /// outside a cluster. One atomic load, and the snapshot's lock only
    /// after a placement changed.
    #[inline]
    pub(crate) fn residence(&self, owner: &str) -> Residence {
        let Some(cluster) = &self.shared.cluster else {
            return Residence::Here;
        };
        let version = cluster.view().version();
        let mut cached = self.placements.borrow_mut();
        if cached.0 != version {
            *cached = cluster.view().current();
        }
        cached.1.residence(owner, cluster.node_id())
    }

    /// Waits until `has_work(shard)`, registering the calling task with
    /// `register` to be woken while it has none: how the shard's background
    /// tasks (committer, backlog reader, chores) sleep until it wants them.
    pub(crate) async fn work_for(
        &self,
        has_work: impl Fn(&Shard) -> bool,
        register: impl Fn(&mut Shard, &std::task::Waker),
    ) {
        std::future::poll_fn(|cx| {
            let mut shard = self.shard.borrow_mut();
            if has_work(&shard) {
                std::task::Poll::Ready(())
            } else {
                register(&mut shard, cx.waker());
                std::task::Poll::Pending
            }
        })
        .await
    }

    /// The caller of the last [`ShardLocal::with_shard`].
    pub(crate) fn last_step(&self) -> Option<&'static Location<'static>> {
        self.last_step.get()
    }

    /// Runs `f` on the shard and sends what it buffered for other shards.
    /// Never call across an `.await`. Notes the caller for the stall watch
    /// (a store, no clock read).
    #[inline]
    #[track_caller]
    pub(crate) fn with_shard<T>(&self, f: impl FnOnce(&mut Shard) -> T) -> T {
        self.last_step.set(Some(Location::caller()));
        let mut shard = self.shard.borrow_mut();
        let value = f(&mut shard);
        shard.flush();
        value
    }

    /// Takes a token for `cn` under `policy`; false when it is rate limited.
    pub(crate) fn allow(
        &self,
        policy: &Policy,
        cn: &Arc<str>,
        now: Instant,
        is_publish: bool,
    ) -> bool {
        let Some(r) = policy.rate else {
            return true;
        };
        let mut guard = self.limiters.borrow_mut();
        let (version, limiters) = &mut *guard;
        if *version != policy.version {
            *version = policy.version;
            limiters.clear();
        }
        let limiter = limiters.entry(cn.clone()).or_insert_with(|| {
            CnLimiter::new(r.global_rps, r.global_burst, r.publish_rps, r.publish_burst)
        });
        limiter.check(now, is_publish)
    }
}
