//! Exchanges, queues and bindings.
//!
//! Topology changes are rare, so they go through one writer (a mutex held only
//! for the in-memory change itself, never across I/O) that publishes a new
//! immutable [`Topology`] snapshot. Shards route against their cached
//! snapshot and notice a new one with a single atomic load per publish. The
//! snapshot is published before the declaring command is answered, so a
//! publish sent after `OK bind …` sees the binding on every shard.
//!
//! This module does no file I/O. Where the topology is kept between runs is
//! the broker's business: it loads a [`Topology`] (built with
//! [`Topology::apply`]) and hands [`TopologyStore::persisted`] a
//! [`TopologySink`] that writes a whole topology. The store runs a saver
//! thread that calls it:
//!
//! - clients' changes go through [`TopologyStore::submit`]: the saver applies
//!   them to a copy, has the sink save it (one save for everything that
//!   queued up meanwhile), and only then publishes the snapshot and answers,
//!   so no shard waits on the disk and nothing routes through a binding a
//!   crash could forget;
//! - the broker's own declarations ([`TopologyStore::declare_queue`]: a
//!   dead-letter queue declared on a shard) are applied and published at
//!   once, so the caller can use them in the same call, and the saver is only
//!   asked to save (never waited for). Until that save, a crash forgets the
//!   declaration; the broker's start-up adopts what it left on disk.
//!
//! Every save writes the whole topology, so one successful save covers every
//! change before it: a save request lost to a full queue, or a failed save
//! (retried with backoff), is made good by the next one.
//!
//! Ownership (docs/PROTOCOL.md) lives here too, so that it is decided where the
//! change is applied, never against a snapshot that may be stale by then:
//! the receiver that declares an exchange first owns it (an [`Actor::Admin`]
//! declaration, or one loaded without an owner, belongs to no receiver), a
//! receiver may bind a queue to a fanout exchange only if it owns it, and a
//! binding remembers who made it. The broker's ACL, which this crate does not
//! know, joins in as a [`BindingRule`]: installed with
//! [`TopologyStore::set_binding_rule`], it judges every bind as it is applied
//! and, on installation, every binding already there (a reload removes the
//! bindings its new ACL makes unlawful).
//!
//! Quotas are decided here for the same reason: what each receiver CN holds
//! is counted as changes are applied ([`crate::quota`]), and a receiver's
//! change past its quota is refused by the single writer, so racing declares
//! on several shards cannot both slip under it.
//!
//! The maps of a [`Topology`] are persistent (structure-sharing) maps: each
//! change copies the snapshot it starts from, and with these that copy is
//! O(1) and an insert O(log n), where plain maps made every change cost the
//! size of the whole topology (100,000 binds were quadratic).
//!
//! Map: this file holds the [`Topology`] snapshot that shards route
//! against (its struct, [`QueueInfo`], `empty`, the accessors and
//! `route`); each file under `topology/` holds one concern:
//! - `ownership`: who asks for a change ([`Actor`]), the ownership
//!   refusals, and the broker's [`BindingRule`].
//! - `change`: [`TopologyChange`], [`TopologyError`], and applying a change
//!   to a [`Topology`]: queues, exchanges and quota counts.
//! - `bindings`: bind, unbind, and installing a [`BindingRule`].
//! - `store`: [`TopologyStore`], the single writer that publishes snapshots.
//! - `saver`: [`TopologySink`] and the store's saver thread.
//! - `view`: [`TopologyView`], a shard's cached snapshot.
//! - `tests`: the unit tests.

mod bindings;
mod change;
mod ownership;
mod saver;
mod store;
mod view;

pub use change::{ChangeResult, TopologyChange, TopologyError};
pub use ownership::{
    Actor, Binding, BindingRule, RemovedBinding, EXCHANGE_HAS_OTHERS_BINDINGS, EXCHANGE_NOT_OWNED,
    FANOUT_NOT_OWNED, QUEUE_NOT_OWNED,
};
pub use saver::TopologySink;
pub use store::TopologyStore;
pub use view::TopologyView;

use std::sync::Arc;

use crate::placement::ShardId;
use crate::quota::{Quotas, Usage};
use crate::routing::{Exchange, Target};

/// The persistent map every field of a [`Topology`] is kept in.
type PMap<K, V> = imbl::HashMap<K, V>;

/// Identifies one binding: (exchange, key, queue).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BindingId {
    exchange: Arc<str>,
    key: Box<str>,
    queue: Arc<str>,
}

impl BindingId {
    fn new(exchange: &str, key: &str, queue: &str) -> BindingId {
        BindingId {
            exchange: Arc::from(exchange),
            key: Box::from(key),
            queue: Arc::from(queue),
        }
    }
}

/// Where a queue lives and who owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Queue name.
    pub name: Arc<str>,
    /// The CN whose shard holds the queue.
    pub owner: Arc<str>,
    /// `shard_of(owner)`.
    pub shard: ShardId,
}

/// An immutable view of the topology once a store publishes it; a plain
/// value while it is being built (loaded from a file, queues adopted).
#[derive(Debug, Clone)]
pub struct Topology {
    version: u64,
    /// Queues are placed over this many shards.
    shards: usize,
    queues: PMap<Arc<str>, QueueInfo>,
    exchanges: PMap<Arc<str>, Arc<Exchange>>,
    /// The receiver owning each exchange that one owns.
    exchange_owners: PMap<Arc<str>, Arc<str>>,
    /// Every binding, with who made it where that is recorded: a repeated
    /// bind is found with one lookup, not a scan of the exchange.
    binders: PMap<BindingId, Option<Actor>>,
    /// What each receiver CN holds, for its quotas; a CN holding nothing
    /// has no entry.
    usage: PMap<Arc<str>, Usage>,
    /// Queues deleted whose logs may still be on disk: saved with the
    /// topology, so that a start after a crash removes such a log instead of
    /// adopting it, and refused to `declare_queue` until the log is gone, so
    /// a queue declared again never starts from the old messages.
    deleting: PMap<Arc<str>, ()>,
    /// Caps on a receiver's changes (none until installed).
    quotas: Quotas,
    /// The broker's rule over bindings, once installed.
    rule: Option<Arc<dyn BindingRule>>,
}

impl Topology {
    /// Nothing declared yet, for a broker of `shards` shards: where loading a
    /// saved topology starts. Placement is computed from each owner when a
    /// queue is added, so a changed shard count between runs moves queues
    /// with their owners.
    pub fn empty(shards: usize) -> Topology {
        Topology {
            version: 0,
            shards: shards.max(1),
            queues: PMap::new(),
            exchanges: PMap::new(),
            exchange_owners: PMap::new(),
            binders: PMap::new(),
            usage: PMap::new(),
            deleting: PMap::new(),
            quotas: Quotas::UNLIMITED,
            rule: None,
        }
    }

    /// Bumped on every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The number of shards queues are placed over.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// A queue by name.
    pub fn queue(&self, name: &str) -> Option<&QueueInfo> {
        self.queues.get(name)
    }

    /// Every queue.
    pub fn queues(&self) -> impl Iterator<Item = &QueueInfo> {
        self.queues.values()
    }

    /// Queues deleted whose logs may still be on disk (see
    /// [`TopologyChange::DeleteQueue`]), sorted by name.
    pub fn deleting(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.deleting.keys().map(|n| &**n).collect();
        names.sort_unstable();
        names
    }

    /// Whether `name` was deleted and its log may still be on disk.
    pub fn is_deleting(&self, name: &str) -> bool {
        self.deleting.contains_key(name)
    }

    /// An exchange by name.
    pub fn exchange(&self, name: &str) -> Option<&Exchange> {
        self.exchanges.get(name).map(|e| &**e)
    }

    /// Every exchange with its name.
    pub fn exchanges(&self) -> impl Iterator<Item = (&str, &Exchange)> {
        self.exchanges.iter().map(|(n, e)| (&**n, &**e))
    }

    /// The receiver that owns an exchange: the one that declared it first.
    /// `None` for an exchange an admin declared, one loaded without a
    /// recorded owner, or one that does not exist.
    pub fn exchange_owner(&self, name: &str) -> Option<&str> {
        self.exchange_owners.get(name).map(|o| &**o)
    }

    /// Who made the binding of `queue` to `exchange` with `key`; `None` when
    /// that is not recorded (or there is no such binding).
    pub fn binder(&self, exchange: &str, key: &str, queue: &str) -> Option<&Actor> {
        self.binders
            .get(&BindingId::new(exchange, key, queue))
            .and_then(Option::as_ref)
    }

    /// What `cn` holds, counted against its quotas.
    pub fn usage(&self, cn: &str) -> Usage {
        self.usage.get(cn).copied().unwrap_or_default()
    }

    /// Every CN that holds something, with what it holds.
    pub fn usages(&self) -> impl Iterator<Item = (&str, Usage)> {
        self.usage.iter().map(|(cn, u)| (&**cn, *u))
    }

    /// The quotas receivers' changes are held to.
    pub fn quotas(&self) -> Quotas {
        self.quotas
    }

    /// Appends the queues a publish to `exchange` with `key` reaches; false
    /// when the exchange does not exist.
    pub fn route(&self, exchange: &str, key: &str, out: &mut Vec<Target>) -> bool {
        match self.exchanges.get(exchange) {
            Some(ex) => {
                ex.route(key, out);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests;
