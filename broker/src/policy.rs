//! The reloadable part of the configuration: `[acl]` and `[rate_limit]`.
//!
//! `SIGHUP` builds a new [`Policy`] from a freshly validated config file and
//! swaps it in atomically; a bad file keeps the old one. Connections compare
//! one version number per poll (an atomic load) and re-read their role when it
//! moved; a connection whose CN lost its role is closed. Each shard has a
//! watcher task that wakes its connections when the version moves, so idle
//! ones are closed promptly too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::Poll;

use atomic_waker::AtomicWaker;

use crate::acl::Acl;
use crate::config::Config;
use crate::context::RateSettings;
use crate::rate_limit::ConnectionLimits;

/// One version of the reloadable settings.
#[derive(Debug)]
pub struct Policy {
    /// Roles and ownership.
    pub acl: Acl,
    /// Per-CN buckets; `None` when rate limiting is off.
    pub rate: Option<RateSettings>,
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
            ),
            rate: r.enabled.then_some(RateSettings {
                global_rps: r.global_rps,
                global_burst: r.global_burst,
                publish_rps: r.publish_rps,
                publish_burst: r.publish_burst,
            }),
            version,
        }
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
pub struct PolicyStore {
    current: RwLock<Arc<Policy>>,
    version: AtomicU64,
    /// Open connections by IP and CN, counted always, capped per policy.
    pub conn_limits: Arc<ConnectionLimits>,
    watchers: Vec<AtomicWaker>,
}

impl PolicyStore {
    /// The policy of `config`, with one watcher slot per shard.
    pub fn new(config: &Config, shards: usize) -> PolicyStore {
        let (per_ip, per_cn) = caps(config);
        PolicyStore {
            current: RwLock::new(Arc::new(Policy::from_config(config, 0))),
            version: AtomicU64::new(0),
            conn_limits: Arc::new(ConnectionLimits::new(per_ip, per_cn)),
            watchers: (0..shards).map(|_| AtomicWaker::new()).collect(),
        }
    }

    /// The current version (one atomic load).
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current policy.
    pub fn current(&self) -> Arc<Policy> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Swaps in the `[acl]` and `[rate_limit]` of a validated config.
    pub fn reload(&self, config: &Config) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let version = current.version + 1;
        *current = Arc::new(Policy::from_config(config, version));
        let (per_ip, per_cn) = caps(config);
        self.conn_limits.set_limits(per_ip, per_cn);
        self.version.store(version, Ordering::Release);
        drop(current);
        for w in &self.watchers {
            w.wake();
        }
    }

    /// Resolves when the version differs from `seen`.
    pub async fn changed(&self, shard: usize, seen: u64) -> u64 {
        std::future::poll_fn(|cx| {
            let v = self.version();
            if v != seen {
                return Poll::Ready(v);
            }
            self.watchers[shard].register(cx.waker());
            let v = self.version();
            if v != seen {
                Poll::Ready(v)
            } else {
                Poll::Pending
            }
        })
        .await
    }
}
