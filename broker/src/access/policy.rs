//! The reloadable part of the configuration: `[acl]` and `[rate_limit]`.
//!
//! `SIGHUP` builds a new [`Policy`] from a freshly validated config file and
//! swaps it in atomically; a bad file keeps the old one (the file reload,
//! which also swaps `[tls]`, is `crate::access::reload`). Connections compare
//! one version number per poll (an atomic load) and re-read their role when it
//! moved; a connection whose CN lost its role is closed. Each shard has a
//! watcher task that wakes its connections when the version moves, so idle
//! ones are closed promptly too.
//!
//! Bindings follow the ACL too: once [`PolicyStore::guard_bindings`] has
//! tied the store to the topology, every policy is installed there as its
//! binding rule (at start, and on each reload, in the order of the swaps),
//! which removes, saves and logs the bindings the new ACL makes unlawful and
//! judges every later bind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::task::Poll;

use atomic_waker::AtomicWaker;
use ciphermq_shard::topology::{Actor, Binding, BindingRule, QueueInfo};
use ciphermq_shard::TopologyStore;

use crate::access::acl::Acl;
use crate::access::forced_close::ConnectionClosures;
use crate::access::rate_limit::{ConnectionLimits, RateSettings};
use crate::config::Config;

/// One version of the reloadable settings.
#[derive(Debug)]
pub(crate) struct Policy {
    /// Roles and ownership.
    pub acl: Acl,
    /// Per-CN buckets; `None` when rate limiting is off.
    pub rate: Option<RateSettings>,
    /// `acl.require_sender_id`: a publish must name its sender
    /// (`sender_client_id`), so that receivers can always tell senders apart.
    pub require_sender_id: bool,
    /// Incremented on every reload.
    pub version: u64,
}

impl Policy {
    fn from_config(config: &Config, version: u64) -> Policy {
        let r = &config.rate_limit;
        Policy {
            acl: Acl::new(
                &config.acl.admin_cns,
                &config.acl.sender_cns,
                &config.acl.receiver_cns,
            )
            .with_monitors(&config.acl.monitor_cns),
            rate: r.enabled.then_some(RateSettings {
                global_rps: r.global_rps,
                global_burst: r.global_burst,
                publish_rps: r.publish_rps,
                publish_burst: r.publish_burst,
            }),
            require_sender_id: config.acl.require_sender_id,
            version,
        }
    }
}

/// A policy as the topology's binding rule: its ACL judges the bindings.
#[derive(Debug)]
struct PolicyRule(Arc<Policy>);

impl BindingRule for PolicyRule {
    fn check(&self, binding: &Binding<'_>) -> Result<(), String> {
        self.0.acl.judge_binding(binding).map_err(|d| d.reason)
    }

    fn confined_to(&self, queue: &QueueInfo) -> Option<Arc<str>> {
        self.0.acl.queue_owner(&queue.name).map(Arc::from)
    }
}

/// Makes `policy` the binding rule of `topology` and logs what that removed.
fn install(policy: &Arc<Policy>, topology: &TopologyStore) {
    let removed = topology.set_binding_rule(Arc::new(PolicyRule(policy.clone())));
    for r in &removed {
        let bound_by = match &r.bound_by {
            Some(Actor::Admin) => "an admin".to_owned(),
            Some(Actor::Receiver(cn)) => cn.to_string(),
            None => "unrecorded".to_owned(),
        };
        tracing::warn!(
            exchange = %r.exchange,
            queue = %r.queue,
            key = %r.key,
            bound_by = %bound_by,
            reason = %r.reason,
            policy_version = policy.version,
            "binding removed: the ACL no longer allows it"
        );
    }
    if !removed.is_empty() {
        tracing::warn!(
            removed = removed.len(),
            "bindings the ACL no longer allows were removed"
        );
    }
}

/// Connection caps as configured: unlimited while rate limiting is off.
fn caps(config: &Config) -> (u32, u32) {
    // Always enforced: `rate_limit.enabled` turns on the token buckets
    // only. An unbounded number of connections is not a default to ship.
    let r = &config.rate_limit;
    (r.max_connections_per_ip, r.max_connections_per_cn)
}

/// The current policy, shared by every shard.
pub(crate) struct PolicyStore {
    current: RwLock<Arc<Policy>>,
    version: AtomicU64,
    /// Open connections by IP and CN, counted always, capped per policy.
    pub conn_limits: Arc<ConnectionLimits>,
    /// Connections an admin closed (`close_connection`).
    pub closures: ConnectionClosures,
    watchers: Vec<AtomicWaker>,
    /// The topology whose bindings follow the ACL, once
    /// [`Self::guard_bindings`] was called (weak: the topology's lifetime is
    /// the broker's, not the policy's).
    topology: OnceLock<Weak<TopologyStore>>,
    /// Held while a policy is installed in the topology, so installations
    /// happen one at a time and the last one is of the newest policy; never
    /// the policy's own lock, which shards read while connecting.
    installing: Mutex<()>,
}

impl PolicyStore {
    /// The policy of `config`, with one watcher slot per shard.
    pub(crate) fn new(config: &Config, shards: usize) -> PolicyStore {
        let (per_ip, per_cn) = caps(config);
        PolicyStore {
            current: RwLock::new(Arc::new(Policy::from_config(config, 0))),
            version: AtomicU64::new(0),
            conn_limits: Arc::new(ConnectionLimits::new(per_ip, per_cn)),
            closures: ConnectionClosures::default(),
            watchers: (0..shards).map(|_| AtomicWaker::new()).collect(),
            topology: OnceLock::new(),
            installing: Mutex::new(()),
        }
    }

    /// Makes `topology`'s bindings follow the ACL from now on: the current
    /// policy is installed as its binding rule at once (removing, saving and
    /// logging the bindings it does not allow: the config may have changed
    /// since they were made), and every reload installs the new one. Called
    /// once, at start; later calls change nothing.
    pub(crate) fn guard_bindings(&self, topology: &Arc<TopologyStore>) {
        if self.topology.set(Arc::downgrade(topology)).is_ok() {
            self.install_current();
        }
    }

    /// Installs the current policy in the guarded topology, if any. The
    /// policy is read under the installation lock: of two reloads racing,
    /// the last to install installs the newest policy.
    fn install_current(&self) {
        let Some(topology) = self.topology.get().and_then(Weak::upgrade) else {
            return;
        };
        let _one_at_a_time = self
            .installing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        install(&self.current(), &topology);
    }

    /// The current version (one atomic load).
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current policy.
    pub(crate) fn current(&self) -> Arc<Policy> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Swaps in the `[acl]` and `[rate_limit]` of a validated config; with
    /// [`Self::guard_bindings`] called, the bindings the new ACL does not
    /// allow are removed (and logged) before this returns.
    pub(crate) fn reload(&self, config: &Config) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let version = current.version + 1;
        *current = Arc::new(Policy::from_config(config, version));
        let (per_ip, per_cn) = caps(config);
        self.conn_limits.set_limits(per_ip, per_cn);
        self.version.store(version, Ordering::Release);
        drop(current);
        self.install_current();
        for w in &self.watchers {
            w.wake();
        }
    }

    /// Makes `revoked` (a reloaded CRL) the certificates open connections
    /// may not hold. When it revokes one the previous set did not, the
    /// connections holding one end at their next turn (idle ones too), and
    /// this returns true.
    pub(crate) fn revoke_certificates(&self, revoked: Arc<crate::tls::crl::Revocations>) -> bool {
        let newly = self.closures.revoke(revoked);
        if newly {
            for w in &self.watchers {
                w.wake();
            }
        }
        newly
    }

    /// Ends every connection `cn` has open now (on every shard), and says
    /// how many that is.
    pub(crate) fn close_connections_of(&self, cn: &str) -> u32 {
        let open = self
            .conn_limits
            .snapshot()
            .1
            .into_iter()
            .find_map(|(c, n)| (c == cn).then_some(n))
            .unwrap_or(0);
        self.closures.close_all_of(cn);
        for w in &self.watchers {
            w.wake();
        }
        open
    }

    /// Moves with every reload and every `close_connection`: what the shard
    /// watchers wait on.
    fn generation(&self) -> u64 {
        self.version().wrapping_add(self.closures.version())
    }

    /// Resolves when the generation (reloads and closings) differs from
    /// `seen`; pass 0 first.
    pub(crate) async fn changed(&self, shard: usize, seen: u64) -> u64 {
        std::future::poll_fn(|cx| {
            let v = self.generation();
            if v != seen {
                return Poll::Ready(v);
            }
            self.watchers[shard].register(cx.waker());
            let v = self.generation();
            if v != seen {
                Poll::Ready(v)
            } else {
                Poll::Pending
            }
        })
        .await
    }
}
