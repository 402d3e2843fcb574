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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use ciphermq_proto::ExchangeKind;
use crossbeam_channel::RecvTimeoutError;

use crate::pending::{Pending, Resolver};

use crate::placement::{shard_of, ShardId};
use crate::quota::{Quotas, Resource, Usage};
use crate::routing::{Exchange, Target};

/// The persistent map every field of a [`Topology`] is kept in.
type PMap<K, V> = imbl::HashMap<K, V>;

/// Why a receiver's bind to a fanout exchange it does not own is refused: a
/// fanout exchange ignores the routing key, so such a binding would copy
/// every message sent through it, whoever it is for.
pub const FANOUT_NOT_OWNED: &str = "receivers may only bind queues to fanout exchanges they own";

/// Why a receiver may not delete an exchange it does not own.
pub const EXCHANGE_NOT_OWNED: &str = "receivers may only delete exchanges they own";

/// Why a receiver may not delete its own exchange while another owner's
/// queue is bound to it.
pub const EXCHANGE_HAS_OTHERS_BINDINGS: &str =
    "receivers may not delete an exchange while queues of other owners are bound to it";

/// Why a receiver may not delete a queue it does not own.
pub const QUEUE_NOT_OWNED: &str = "receivers may only delete queues they own";

/// Who asks for a topology change: what ownership allows depends on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Actor {
    /// An administrator (or the broker itself): may bind any queue to any
    /// exchange, and what it declares belongs to no receiver.
    Admin,
    /// A receiver, by CN: owns the exchanges it declares first, and may bind
    /// a queue to a fanout exchange only if it owns that exchange.
    Receiver(Arc<str>),
}

impl Actor {
    /// A receiver actor for `cn`.
    pub fn receiver(cn: &str) -> Actor {
        Actor::Receiver(Arc::from(cn))
    }
}

/// A binding as a [`BindingRule`] judges it: everything the topology knows
/// about it at the moment it is applied or re-judged.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The exchange's name.
    pub exchange: &'a str,
    /// Its type.
    pub kind: ExchangeKind,
    /// The receiver owning the exchange, if one does.
    pub exchange_owner: Option<&'a str>,
    /// The binding key (a topic pattern on a topic exchange).
    pub key: &'a str,
    /// The bound queue.
    pub queue: &'a QueueInfo,
    /// Who made it; `None` when that was not recorded (a binding saved by a
    /// build that did not record it).
    pub bound_by: Option<&'a Actor>,
}

/// The broker's say over which bindings may exist: its ACL, which can change
/// while the broker runs (a reload). Installed with
/// [`TopologyStore::set_binding_rule`], it is asked about every bind as it is
/// applied (so a bind checked under an ACL a reload has since replaced
/// cannot slip in) and, on installation, about every binding already there.
pub trait BindingRule: Send + Sync + fmt::Debug {
    /// `Err(reason)` when `binding` may not exist; the reason is worded for
    /// an `Access denied: <reason>` reply and for the log.
    fn check(&self, binding: &Binding<'_>) -> Result<(), String>;

    /// The receiver that owns `queue`, whose envelopes alone it may store
    /// (see [`Target::confined_to`]); `None` for a queue no receiver owns.
    fn confined_to(&self, queue: &QueueInfo) -> Option<Arc<str>>;
}

/// A binding a [`BindingRule`] refused when it was installed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedBinding {
    /// The exchange it was on.
    pub exchange: String,
    /// Its binding key.
    pub key: String,
    /// The queue it filled.
    pub queue: String,
    /// Who had made it, if that was recorded.
    pub bound_by: Option<Actor>,
    /// Why the rule refused it.
    pub reason: String,
}

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

    /// Records `name` as deleted with its log possibly still on disk, for
    /// loading a saved topology (the start then removes that log and clears
    /// the mark with [`TopologyChange::QueueRemoved`]). Bumps the version.
    pub fn mark_deleting(&mut self, name: &str) {
        if self.deleting.insert(Arc::from(name), ()).is_none() {
            self.version += 1;
        }
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

    /// Adds `delta` to what `cn` holds of `resource`.
    fn count(&mut self, cn: &Arc<str>, resource: Resource, delta: isize) {
        let mut usage = self.usage(cn);
        usage.add(resource, delta);
        if usage == Usage::default() {
            self.usage.remove(cn);
        } else {
            self.usage.insert(cn.clone(), usage);
        }
    }

    /// Refuses a receiver's change that would give `cn` one more of
    /// `resource` than its quota; admins and the broker are not limited.
    fn check_quota(
        &self,
        by: Option<&Actor>,
        cn: &str,
        resource: Resource,
    ) -> Result<(), TopologyError> {
        if !matches!(by, Some(Actor::Receiver(_))) {
            return Ok(());
        }
        let limit = self.quotas.limit(resource);
        if self.usage(cn).of(resource) >= limit {
            return Err(TopologyError::QuotaExceeded {
                cn: cn.to_owned(),
                resource,
                limit,
            });
        }
        Ok(())
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

    /// Applies `change` to this value; `Ok(true)` when it changed something
    /// (the version is then bumped). The same rules as a client's change:
    /// declares are idempotent (the first owner stays), a bind needs its
    /// queue and exchange.
    ///
    /// For building a topology before a store holds it: loading a saved one,
    /// adopting queue directories at start. Once a store holds it, changes go
    /// through the store, which publishes them.
    pub fn apply(&mut self, change: &TopologyChange) -> Result<bool, TopologyError> {
        let changed = self.apply_change(change)?;
        if changed {
            self.version += 1;
        }
        Ok(changed)
    }

    /// [`Self::apply`] without the version bump: a store bumps it once per
    /// published snapshot.
    fn apply_change(&mut self, change: &TopologyChange) -> Result<bool, TopologyError> {
        match change {
            TopologyChange::DeclareQueue { name, owner, by } => {
                if self.queues.contains_key(name.as_str()) {
                    return Ok(false);
                }
                if self.deleting.contains_key(name.as_str()) {
                    return Err(TopologyError::QueueBeingDeleted(name.clone()));
                }
                self.check_quota(by.as_ref(), owner, Resource::Queues)?;
                let info = QueueInfo {
                    name: Arc::from(name.as_str()),
                    owner: Arc::from(owner.as_str()),
                    shard: shard_of(owner, self.shards),
                };
                self.count(&info.owner, Resource::Queues, 1);
                self.queues.insert(info.name.clone(), info);
                Ok(true)
            }
            TopologyChange::DeclareExchange { name, kind, owner } => {
                match self.exchanges.get(name.as_str()) {
                    // Declaring again never transfers ownership.
                    Some(ex) if ex.kind() == *kind => Ok(false),
                    Some(ex) => Err(TopologyError::KindMismatch {
                        name: name.clone(),
                        existing: ex.kind(),
                    }),
                    None => {
                        let name: Arc<str> = Arc::from(name.as_str());
                        if let Some(owner) = owner {
                            let by = Actor::receiver(owner);
                            self.check_quota(Some(&by), owner, Resource::Exchanges)?;
                            let owner: Arc<str> = Arc::from(owner.as_str());
                            self.count(&owner, Resource::Exchanges, 1);
                            self.exchange_owners.insert(name.clone(), owner);
                        }
                        self.exchanges.insert(name, Arc::new(Exchange::new(*kind)));
                        Ok(true)
                    }
                }
            }
            TopologyChange::Bind {
                queue,
                exchange,
                key,
                by,
            } => self.bind(queue, exchange, key, by.as_ref()),
            TopologyChange::Unbind {
                queue,
                exchange,
                key,
            } => self.unbind(queue, exchange, key),
            TopologyChange::DeleteExchange { name, by } => {
                if !self.exchanges.contains_key(name.as_str()) {
                    return Err(TopologyError::UnknownExchange(name.clone()));
                }
                if let Actor::Receiver(cn) = by {
                    if self.exchange_owner(name) != Some(&**cn) {
                        return Err(TopologyError::Denied(EXCHANGE_NOT_OWNED.into()));
                    }
                    // Deleting it would take other owners' bindings with it,
                    // and declaring it again (of another type) would retype
                    // what they depend on.
                    if self.exchange_has_others_bindings(name, cn) {
                        return Err(TopologyError::Denied(EXCHANGE_HAS_OTHERS_BINDINGS.into()));
                    }
                }
                if let Some(ex) = self.exchanges.remove(name.as_str()) {
                    for (key, target) in ex.bindings() {
                        self.forget_binding(name, key, &target.queue);
                    }
                }
                if let Some(owner) = self.exchange_owners.remove(name.as_str()) {
                    self.count(&owner, Resource::Exchanges, -1);
                }
                Ok(true)
            }
            TopologyChange::DeleteQueue { name, by } => self.delete_queue(name, by),
            TopologyChange::QueueRemoved { name } => {
                Ok(self.deleting.remove(name.as_str()).is_some())
            }
        }
    }

    /// Whether a queue not owned by `cn` is bound to exchange `name`.
    fn exchange_has_others_bindings(&self, name: &str, cn: &str) -> bool {
        self.exchanges.get(name).is_some_and(|ex| {
            ex.bindings().any(|(_, target)| {
                self.queues
                    .get(&target.queue)
                    .is_some_and(|q| *q.owner != *cn)
            })
        })
    }

    /// `delete_queue`: ownership before existence is the ACL's; here a
    /// receiver may delete only a queue recorded as its own. The queue, its
    /// bindings on every exchange and their quota counts go; its name is
    /// recorded in `deleting` until its log is gone.
    fn delete_queue(&mut self, name: &str, by: &Actor) -> Result<bool, TopologyError> {
        let Some(info) = self.queues.get(name) else {
            return Err(TopologyError::UnknownQueue(name.to_owned()));
        };
        if let Actor::Receiver(cn) = by {
            if *info.owner != **cn {
                return Err(TopologyError::Denied(QUEUE_NOT_OWNED.into()));
            }
        }
        let mut bound: HashMap<Arc<str>, Vec<Box<str>>> = HashMap::new();
        for (exchange, ex) in &self.exchanges {
            for (key, target) in ex.bindings() {
                if &*target.queue == name {
                    bound
                        .entry(exchange.clone())
                        .or_default()
                        .push(Box::from(key));
                }
            }
        }
        for (exchange, keys) in bound {
            for key in &keys {
                self.forget_binding(&exchange, key, name);
            }
            if let Some(ex) = self.exchanges.get_mut(&exchange) {
                let mut rebuilt = Exchange::new(ex.kind());
                for (key, target) in ex.bindings() {
                    if &*target.queue != name {
                        rebuilt.bind(key, target.clone());
                    }
                }
                *ex = Arc::new(rebuilt);
            }
        }
        if let Some(info) = self.queues.remove(name) {
            self.count(&info.owner, Resource::Queues, -1);
            self.deleting.insert(info.name, ());
        }
        Ok(true)
    }

    /// `bind`: ownership of a fanout exchange is checked before whether the
    /// queue exists (ownership before existence, as the ACL does), then the
    /// installed rule, if any, has its say.
    fn bind(
        &mut self,
        queue: &str,
        exchange: &str,
        key: &str,
        by: Option<&Actor>,
    ) -> Result<bool, TopologyError> {
        if let (Some(Actor::Receiver(cn)), Some(ex)) = (by, self.exchanges.get(exchange)) {
            if ex.kind() == ExchangeKind::Fanout && self.exchange_owner(exchange) != Some(&**cn) {
                return Err(TopologyError::Denied(FANOUT_NOT_OWNED.into()));
            }
        }
        let info = self
            .queues
            .get(queue)
            .ok_or_else(|| TopologyError::UnknownQueue(queue.to_owned()))?;
        let ex = self
            .exchanges
            .get(exchange)
            .ok_or_else(|| TopologyError::UnknownExchange(exchange.to_owned()))?;
        if let (Some(rule), Some(_)) = (&self.rule, by) {
            let binding = Binding {
                exchange,
                kind: ex.kind(),
                exchange_owner: self.exchange_owners.get(exchange).map(|o| &**o),
                key,
                queue: info,
                bound_by: by,
            };
            rule.check(&binding).map_err(TopologyError::Denied)?;
        }
        let target = Target {
            queue: info.name.clone(),
            shard: info.shard,
            confined_to: self.rule.as_ref().and_then(|rule| rule.confined_to(info)),
        };
        let id = BindingId::new(exchange, key, queue);
        if self.binders.contains_key(&id) {
            return Ok(false);
        }
        if let Some(Actor::Receiver(cn)) = by {
            self.check_quota(by, cn, Resource::Bindings)?;
            self.count(cn, Resource::Bindings, 1);
        }
        self.binders.insert(id, by.cloned());
        if let Some(ex) = self.exchanges.get_mut(exchange) {
            Arc::make_mut(ex).bind(key, target);
        }
        Ok(true)
    }

    /// `unbind`: the exchange's routing index has no removal, so it is
    /// rebuilt without the binding (bounded by the binding quotas).
    fn unbind(&mut self, queue: &str, exchange: &str, key: &str) -> Result<bool, TopologyError> {
        if !self.exchanges.contains_key(exchange) {
            return Err(TopologyError::UnknownExchange(exchange.to_owned()));
        }
        if !self.queues.contains_key(queue) {
            return Err(TopologyError::UnknownQueue(queue.to_owned()));
        }
        if !self
            .binders
            .contains_key(&BindingId::new(exchange, key, queue))
        {
            return Ok(false);
        }
        self.forget_binding(exchange, key, queue);
        if let Some(ex) = self.exchanges.get_mut(exchange) {
            let mut rebuilt = Exchange::new(ex.kind());
            for (bound_key, target) in ex.bindings() {
                if !(bound_key == key && &*target.queue == queue) {
                    rebuilt.bind(bound_key, target.clone());
                }
            }
            *ex = Arc::new(rebuilt);
        }
        Ok(true)
    }

    /// Drops the record of a binding (and its count for whoever made it);
    /// the caller removes it from its exchange.
    fn forget_binding(&mut self, exchange: &str, key: &str, queue: &str) {
        if let Some(Some(Actor::Receiver(cn))) =
            self.binders.remove(&BindingId::new(exchange, key, queue))
        {
            self.count(&cn, Resource::Bindings, -1);
        }
    }

    /// Installs `rule` and removes every binding it refuses, returning them.
    fn install_rule(&mut self, rule: Arc<dyn BindingRule>) -> Vec<RemovedBinding> {
        let mut removed = Vec::new();
        for (name, ex) in &self.exchanges {
            let owner = self.exchange_owners.get(name).map(|o| &**o);
            for (key, target) in ex.bindings() {
                let Some(queue) = self.queues.get(&target.queue) else {
                    continue;
                };
                let bound_by = self
                    .binders
                    .get(&BindingId::new(name, key, &target.queue))
                    .and_then(Option::as_ref);
                let binding = Binding {
                    exchange: name,
                    kind: ex.kind(),
                    exchange_owner: owner,
                    key,
                    queue,
                    bound_by,
                };
                if let Err(reason) = rule.check(&binding) {
                    removed.push(RemovedBinding {
                        exchange: name.to_string(),
                        key: key.to_owned(),
                        queue: target.queue.to_string(),
                        bound_by: bound_by.cloned(),
                        reason,
                    });
                }
            }
        }
        // The routing index has no removal.
        let mut gone: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
        for r in &removed {
            self.forget_binding(&r.exchange, &r.key, &r.queue);
            gone.entry(&r.exchange)
                .or_default()
                .push((&r.key, &r.queue));
        }
        // Every exchange is rebuilt once, without those, keeping the others
        // in order, each target confined to its owner as the new rule says
        // (a reload may make a CN a receiver, or no longer one).
        let names: Vec<Arc<str>> = self.exchanges.keys().cloned().collect();
        for name in names {
            let pairs: HashSet<(&str, &str)> = gone
                .remove(&*name)
                .unwrap_or_default()
                .into_iter()
                .collect();
            if let Some(ex) = self.exchanges.get_mut(&name) {
                let mut rebuilt = Exchange::new(ex.kind());
                for (key, target) in ex.bindings() {
                    if pairs.contains(&(key, &*target.queue)) {
                        continue;
                    }
                    let confined_to = self
                        .queues
                        .get(&target.queue)
                        .and_then(|q| rule.confined_to(q));
                    rebuilt.bind(
                        key,
                        Target {
                            confined_to,
                            ..target.clone()
                        },
                    );
                }
                *ex = Arc::new(rebuilt);
            }
        }
        self.rule = Some(rule);
        removed
    }
}

/// Why a topology change was refused; `Display` is the text after `Error: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// `declare_exchange` again with another type.
    #[error("exchange {name} exists with type {existing}")]
    KindMismatch {
        /// Exchange name.
        name: String,
        /// Its current type.
        existing: ExchangeKind,
    },
    /// `bind` to a queue that was never declared.
    #[error("unknown queue {0}")]
    UnknownQueue(String),
    /// `bind` to an exchange that was never declared.
    #[error("unknown exchange {0}")]
    UnknownExchange(String),
    /// `declare_queue` of a name whose deleted queue's log is still being
    /// removed: declaring it now could bring the old messages back.
    #[error("queue {0} is being deleted; retry")]
    QueueBeingDeleted(String),
    /// A receiver's change would take its CN past a quota.
    #[error("quota exceeded: {cn} already has {limit} {resource}, the most one client may have ({key})", key = resource.config_key())]
    QuotaExceeded {
        /// The CN at its quota.
        cn: String,
        /// What it has too many of.
        resource: Resource,
        /// The quota.
        limit: usize,
    },
    /// An ownership rule, or the installed [`BindingRule`], refuses the
    /// change. The connection answers `Access denied: <reason> (role=…)`,
    /// not `Error: …`.
    #[error("access denied: {0}")]
    Denied(String),
    /// The change could not be saved (the sink failed, or the saver thread is
    /// busy or gone): it was not applied, and the client may retry.
    #[error("storage: {0}")]
    Storage(String),
}

/// Where a store keeps its topology between runs (the broker's
/// `topology.json`). Called only on the store's saver thread, never on a
/// shard, with the whole topology each time: one successful save covers
/// every change before it.
///
/// The sink lives as long as the store, so a sink that holds a resource (the
/// data directory's lock) holds it for as long as anything may save.
/// Implemented for closures `Fn(&Topology) -> io::Result<()>`.
pub trait TopologySink: Send + Sync {
    /// Makes `topology` durable, replacing what was saved before; an error
    /// leaves the previous save in place.
    fn save(&self, topology: &Topology) -> std::io::Result<()>;
}

impl<F> TopologySink for F
where
    F: Fn(&Topology) -> std::io::Result<()> + Send + Sync,
{
    fn save(&self, topology: &Topology) -> std::io::Result<()> {
        self(topology)
    }
}

/// The single writer of the topology, shared by every shard.
pub struct TopologyStore {
    shards: usize,
    /// Where the topology is saved; `None` for a store in memory only.
    sink: Option<Box<dyn TopologySink>>,
    /// Held for in-memory changes only: never while the sink saves, so a
    /// shard declaring a dead-letter queue never waits on the disk.
    writer: Mutex<()>,
    current: RwLock<Arc<Topology>>,
    version: AtomicU64,
    /// The newest published version known to be saved by the sink: behind
    /// `version` while a change applied at once waits for its save.
    saved: AtomicU64,
    /// Jobs for the saver thread; set once, by [`Self::persisted`].
    saver: OnceLock<crossbeam_channel::Sender<SaveJob>>,
}

impl fmt::Debug for TopologyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopologyStore")
            .field("shards", &self.shards)
            .field("persisted", &self.sink.is_some())
            .field("version", &self.version())
            .field("saved", &self.saved.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

/// A change a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologyChange {
    /// `declare_queue`.
    DeclareQueue {
        /// Queue name.
        name: String,
        /// Its owner CN.
        owner: String,
        /// Who declares it: a receiver is held to its owner's queue quota;
        /// `None` is the broker itself (a dead-letter queue, a loaded or
        /// adopted queue).
        by: Option<Actor>,
    },
    /// `declare_exchange`.
    DeclareExchange {
        /// Exchange name.
        name: String,
        /// Its type.
        kind: ExchangeKind,
        /// The receiver CN that owns the exchange if this declaration creates
        /// it; `None` for an admin's (or a loaded one without an owner). An
        /// existing exchange keeps its owner.
        owner: Option<String>,
    },
    /// `bind`.
    Bind {
        /// Queue name.
        queue: String,
        /// Exchange name.
        exchange: String,
        /// Binding key.
        key: String,
        /// Who binds, recorded with the binding so that a later
        /// [`BindingRule`] can judge it; `None` only for a binding loaded
        /// from a file that did not record it.
        by: Option<Actor>,
    },
    /// `unbind`: removes one binding; removing one that is not there is
    /// no change (the queue and the exchange must exist).
    Unbind {
        /// Queue name.
        queue: String,
        /// Exchange name.
        exchange: String,
        /// Binding key.
        key: String,
    },
    /// `delete_exchange`: the exchange and its bindings. A receiver may
    /// delete only an exchange it owns.
    DeleteExchange {
        /// Exchange name.
        name: String,
        /// Who deletes it.
        by: Actor,
    },
    /// `delete_queue`: the queue and its bindings on every exchange. A
    /// receiver may delete only a queue it owns. The name stays recorded as
    /// being deleted (saved, refused to `declare_queue`) until
    /// [`TopologyChange::QueueRemoved`]: its log is removed after this change
    /// is saved, and a crash in between must not bring it back.
    DeleteQueue {
        /// Queue name.
        name: String,
        /// Who deletes it.
        by: Actor,
    },
    /// The broker removed a deleted queue's log: the name may be declared
    /// again, starting empty.
    QueueRemoved {
        /// Queue name.
        name: String,
    },
}

/// What a submitted change ends with.
pub type ChangeResult = Result<(), TopologyError>;

/// What the saver thread is asked to do.
#[derive(Debug)]
enum SaveJob {
    /// A client's change: apply, save, publish, then answer.
    Change {
        change: TopologyChange,
        done: Resolver<ChangeResult>,
    },
    /// Save what is already published (a change the broker applied at once).
    Save,
}

/// Changes the saver thread may have queued at once.
const SAVER_QUEUE: usize = 4096;

/// How long the saver waits before saving again after a failed save, at
/// first; doubled on each failure in a row, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(250);

/// The longest wait between retries of a failing save.
const RETRY_MAX: Duration = Duration::from_secs(30);

impl TopologyStore {
    /// An empty topology for a broker of `shards` shards, kept in memory
    /// only: every change is applied and answered at once.
    pub fn new(shards: usize) -> TopologyStore {
        TopologyStore::with(Topology::empty(shards), None)
    }

    fn with(loaded: Topology, sink: Option<Box<dyn TopologySink>>) -> TopologyStore {
        let version = loaded.version;
        TopologyStore {
            shards: loaded.shards,
            sink,
            writer: Mutex::new(()),
            current: RwLock::new(Arc::new(loaded)),
            version: AtomicU64::new(version),
            saved: AtomicU64::new(version),
            saver: OnceLock::new(),
        }
    }

    /// A store starting from `loaded` (what `sink` saved last, as the
    /// caller read it back) that saves every later change through `sink`,
    /// on a saver thread started here. The thread ends when the store is
    /// dropped; so does the sink, and whatever it holds.
    pub fn persisted(
        loaded: Topology,
        sink: impl TopologySink + 'static,
    ) -> std::io::Result<Arc<TopologyStore>> {
        let store = Arc::new(TopologyStore::with(loaded, Some(Box::new(sink))));
        let (tx, rx) = crossbeam_channel::bounded::<SaveJob>(SAVER_QUEUE);
        let weak: Weak<TopologyStore> = Arc::downgrade(&store);
        std::thread::Builder::new()
            .name("ciphermq-topology".into())
            .spawn(move || saver_loop(&weak, &rx))?;
        // Set once, here, before anyone else sees the store.
        let _ = store.saver.set(tx);
        Ok(store)
    }

    /// The number of shards queues are placed over.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The current version; compare with a cached snapshot's.
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether something published is not saved yet (a change applied at
    /// once whose save is still to come, or failed). Always false in memory.
    pub fn unsaved(&self) -> bool {
        self.sink.is_some() && self.saved.load(Ordering::Acquire) < self.version()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Topology> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn lock_writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `next` the current snapshot. Call with the writer lock held.
    fn publish(&self, next: Topology) {
        let version = next.version;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        self.version.store(version, Ordering::Release);
    }

    /// Applies `change` to a copy of the topology and publishes it at once if
    /// it changed anything; a persisted store's saver is then asked to save
    /// it, without waiting.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Topology) -> Result<(T, bool), TopologyError>,
    ) -> Result<T, TopologyError> {
        let _writer = self.lock_writer();
        let mut next = (*self.snapshot()).clone();
        let (value, changed) = change(&mut next)?;
        if changed {
            next.version += 1;
            self.publish(next);
            self.request_save();
        }
        Ok(value)
    }

    /// Asks the saver to save what is published. Never blocks: when its queue
    /// is full, the save that queue is waiting for covers this change too
    /// (every save writes the whole topology), and a failed save is retried.
    fn request_save(&self) {
        if let Some(saver) = self.saver.get() {
            let _ = saver.try_send(SaveJob::Save);
        }
    }

    /// Applies `change`. In a persisted store the result resolves once the
    /// change is saved and visible to every shard (or was refused); in
    /// memory it is applied at once. Never blocks on I/O.
    pub fn submit(&self, change: TopologyChange) -> Pending<ChangeResult> {
        let Some(saver) = self.saver.get() else {
            return Pending::ready(self.apply_now(&change));
        };
        let (pending, done) = crate::pending::pending();
        if let Err(e) = saver.try_send(SaveJob::Change { change, done }) {
            if let SaveJob::Change { done, .. } = e.into_inner() {
                done.resolve(Err(TopologyError::Storage(
                    "topology writer busy or stopped; retry".into(),
                )));
            }
        }
        pending
    }

    fn apply_now(&self, change: &TopologyChange) -> ChangeResult {
        self.change(|t| Ok(((), t.apply_change(change)?)))
    }

    /// The saver thread's step: apply a batch of clients' changes to a copy,
    /// save it once (also when only a change applied at once awaits its
    /// save), and only then publish and answer. Returns false when the save
    /// failed.
    ///
    /// The writer lock is held to build the copy and to publish it, never
    /// while the sink saves. Should the broker apply a change at once in
    /// between (a dead-letter queue), the batch is applied again on top of
    /// it before publishing, so neither is lost; what was saved then lacks
    /// that change, which stays unsaved and is saved next.
    fn save_batch(&self, jobs: Vec<SaveJob>) -> bool {
        let Some(sink) = &self.sink else {
            return true;
        };
        let changes: Vec<(TopologyChange, Resolver<ChangeResult>)> = jobs
            .into_iter()
            .filter_map(|job| match job {
                SaveJob::Change { change, done } => Some((change, done)),
                SaveJob::Save => None,
            })
            .collect();
        let (base, next, results, any) = {
            let _writer = self.lock_writer();
            let base = self.snapshot();
            let mut next = (*base).clone();
            let results: Vec<Result<bool, TopologyError>> = changes
                .iter()
                .map(|(change, _)| next.apply_change(change))
                .collect();
            let any = results.iter().any(|r| matches!(r, Ok(true)));
            if any {
                next.version += 1;
            }
            (base.version, next, results, any)
        };
        if !any && !self.unsaved() {
            answer(changes, results);
            return true;
        }
        if let Err(e) = sink.save(&next) {
            let e = TopologyError::Storage(e.to_string());
            // Nothing of this batch is published: every change in it that
            // would have changed something is refused.
            tracing::error!(error = %e, "topology not saved; changes refused");
            for ((_, done), outcome) in changes.into_iter().zip(results) {
                done.resolve(match outcome {
                    Ok(true) => Err(e.clone()),
                    other => other.map(|_| ()),
                });
            }
            return false;
        }
        let _writer = self.lock_writer();
        let current = self.snapshot();
        if current.version == base {
            let version = next.version;
            if any {
                self.publish(next);
            }
            self.saved.fetch_max(version, Ordering::AcqRel);
            answer(changes, results);
        } else {
            // What was just saved is no published version: whatever the
            // saved mark says (a rule installed meanwhile may have advanced
            // it), the current one is not on disk, and is saved next.
            self.saved.fetch_min(base, Ordering::AcqRel);
            let mut rebased = (*current).clone();
            let results: Vec<Result<bool, TopologyError>> = changes
                .iter()
                .map(|(change, _)| rebased.apply_change(change))
                .collect();
            if results.iter().any(|r| matches!(r, Ok(true))) {
                rebased.version += 1;
                self.publish(rebased);
            }
            answer(changes, results);
        }
        true
    }

    /// Declares a queue owned by `owner` (idempotent); returns its placement.
    ///
    /// Applied and visible at once, so the caller can use the queue in the
    /// same call; a persisted store saves it on its saver thread afterwards,
    /// and this never waits for that (no file I/O on the caller's thread).
    /// Until the save, a crash forgets the declaration. For the broker's own
    /// rare declares (dead-letter queues); clients' changes use
    /// [`Self::submit`], which answers only once saved.
    pub fn declare_queue(&self, name: &str, owner: &str) -> Result<QueueInfo, TopologyError> {
        let change = TopologyChange::DeclareQueue {
            name: name.to_owned(),
            owner: owner.to_owned(),
            by: None,
        };
        self.change(|t| {
            let changed = t.apply_change(&change)?;
            let info = t
                .queues
                .get(name)
                .cloned()
                .ok_or_else(|| TopologyError::UnknownQueue(name.into()))?;
            Ok((info, changed))
        })
    }

    /// Declares an exchange as an admin (owned by no receiver); the same
    /// type again is a no-op, another is an error. Applied at once and saved
    /// afterwards, like [`Self::declare_queue`].
    pub fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<(), TopologyError> {
        self.apply_now(&TopologyChange::DeclareExchange {
            name: name.to_owned(),
            kind,
            owner: None,
        })
    }

    /// Binds a queue to an exchange with a key, as an admin (idempotent).
    /// Applied at once and saved afterwards, like [`Self::declare_queue`].
    pub fn bind(&self, queue: &str, exchange: &str, key: &str) -> Result<(), TopologyError> {
        self.apply_now(&TopologyChange::Bind {
            queue: queue.to_owned(),
            exchange: exchange.to_owned(),
            key: key.to_owned(),
            by: Some(Actor::Admin),
        })
    }

    /// Holds receivers' changes to `quotas` from now on. What a CN already
    /// holds beyond them stays (nothing is removed); it only cannot grow.
    /// The broker calls it at start, after loading the topology.
    pub fn set_quotas(&self, quotas: Quotas) {
        let _writer = self.lock_writer();
        let mut next = (*self.snapshot()).clone();
        next.quotas = quotas;
        // A new version, so a batch the saver built meanwhile is applied
        // again under these quotas before it is published; quotas are not
        // saved, so nothing needs writing.
        let before = next.version;
        next.version += 1;
        let version = next.version;
        self.publish(next);
        let _ = self
            .saved
            .compare_exchange(before, version, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Makes `rule` the judge of bindings from now on, and removes every
    /// binding it refuses; returns those, for the caller to log. The broker
    /// calls it at start and on every reload of its ACL.
    ///
    /// Applied and visible at once (a change queued for the saver thread is
    /// judged by the new rule when it is applied), and saved afterwards, like
    /// [`Self::declare_queue`]: a crash before that save brings the removed
    /// bindings back until the rule is installed again at the next start.
    pub fn set_binding_rule(&self, rule: Arc<dyn BindingRule>) -> Vec<RemovedBinding> {
        let _writer = self.lock_writer();
        let mut next = (*self.snapshot()).clone();
        let before = next.version;
        let removed = next.install_rule(rule);
        // Always a new version, so that a batch the saver built under the old
        // rule is applied again under this one before it is published.
        next.version += 1;
        let version = next.version;
        self.publish(next);
        if removed.is_empty() {
            // The rule is not saved: when nothing else changed, what is saved
            // is as current as it was, and nothing is written.
            let _ =
                self.saved
                    .compare_exchange(before, version, Ordering::AcqRel, Ordering::Acquire);
        } else {
            self.request_save();
        }
        removed
    }
}

/// Resolves each change with its outcome.
fn answer(
    changes: Vec<(TopologyChange, Resolver<ChangeResult>)>,
    results: Vec<Result<bool, TopologyError>>,
) {
    for ((_, done), outcome) in changes.into_iter().zip(results) {
        done.resolve(outcome.map(|_| ()));
    }
}

/// The saver thread: waits for jobs and saves them in batches; while
/// something published is unsaved it saves without waiting for a job, or,
/// after a failed save, once a growing pause has passed. Ends when the store
/// is gone.
fn saver_loop(store: &Weak<TopologyStore>, rx: &crossbeam_channel::Receiver<SaveJob>) {
    let mut retry: Option<Duration> = None;
    loop {
        // The store is not held while waiting, so dropping it ends the thread.
        let unsaved = match store.upgrade() {
            Some(store) => store.unsaved(),
            None => return,
        };
        let first = if unsaved {
            match rx.recv_timeout(retry.unwrap_or(Duration::ZERO)) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        };
        let Some(store) = store.upgrade() else { return };
        let mut jobs: Vec<SaveJob> = first.into_iter().collect();
        jobs.extend(rx.try_iter());
        retry = if store.save_batch(jobs) {
            None
        } else {
            Some(retry.map_or(RETRY_FIRST, |r| (r * 2).min(RETRY_MAX)))
        };
    }
}

/// A shard's cached snapshot, refreshed when the store's version moves.
#[derive(Debug)]
pub struct TopologyView {
    store: Arc<TopologyStore>,
    snapshot: Arc<Topology>,
}

impl TopologyView {
    /// A view on `store`.
    pub fn new(store: Arc<TopologyStore>) -> TopologyView {
        let snapshot = store.snapshot();
        TopologyView { store, snapshot }
    }

    /// The latest snapshot (one atomic load when nothing changed).
    #[inline]
    pub fn current(&mut self) -> &Arc<Topology> {
        if self.store.version() != self.snapshot.version {
            self.snapshot = self.store.snapshot();
        }
        &self.snapshot
    }

    /// The store, for changes.
    pub fn store(&self) -> &Arc<TopologyStore> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    #[test]
    fn declares_are_idempotent_and_placed_by_owner() {
        let store = TopologyStore::new(4);
        let a = store
            .declare_queue("receiver_1_queue", "receiver_1")
            .unwrap();
        let b = store.declare_queue("receiver_1_queue", "admin").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.shard, shard_of("receiver_1", 4));
        assert_eq!(store.version(), 1);
        assert!(!store.unsaved(), "a store in memory has nothing to save");
    }

    fn wait<T>(mut p: Pending<T>) -> T {
        for _ in 0..2000 {
            if let Some(v) = p.try_take() {
                return v;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the saver never answered");
    }

    /// Waits until `done` holds, for at most ten seconds.
    fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn queue(name: &str, owner: &str) -> TopologyChange {
        TopologyChange::DeclareQueue {
            name: name.into(),
            owner: owner.into(),
            by: None,
        }
    }

    fn queue_names(t: &Topology) -> Vec<String> {
        let mut names: Vec<String> = t.queues().map(|q| q.name.to_string()).collect();
        names.sort();
        names
    }

    /// A sink that records what it saved and on which thread; it fails
    /// while `fail` is above zero (counting down), and waits while `gate`
    /// is closed.
    #[derive(Default)]
    struct Recorder {
        saved: Mutex<Vec<(Vec<String>, std::thread::ThreadId)>>,
        fail: AtomicUsize,
        gate: Mutex<bool>,
        opened: std::sync::Condvar,
        calls: AtomicUsize,
        /// The binding keys of the last save.
        keys: Mutex<Vec<String>>,
    }

    impl Recorder {
        fn close(&self) {
            *self.gate.lock().unwrap() = true;
        }

        fn open(&self) {
            *self.gate.lock().unwrap() = false;
            self.opened.notify_all();
        }

        fn last(&self) -> Option<Vec<String>> {
            self.saved.lock().unwrap().last().map(|(q, _)| q.clone())
        }
    }

    /// A persisted store over a [`Recorder`], starting from `loaded`.
    fn recorded(loaded: Topology) -> (Arc<TopologyStore>, Arc<Recorder>) {
        let rec = Arc::new(Recorder::default());
        let sink = rec.clone();
        let store = TopologyStore::persisted(loaded, move |t: &Topology| -> std::io::Result<()> {
            sink.calls.fetch_add(1, Ordering::SeqCst);
            let mut closed = sink.gate.lock().unwrap();
            while *closed {
                closed = sink.opened.wait(closed).unwrap();
            }
            drop(closed);
            if sink
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(std::io::Error::other("disk on fire"));
            }
            sink.saved
                .lock()
                .unwrap()
                .push((queue_names(t), std::thread::current().id()));
            *sink.keys.lock().unwrap() = t
                .exchanges()
                .flat_map(|(_, ex)| ex.bindings().map(|(k, _)| k.to_owned()))
                .collect();
            Ok(())
        })
        .unwrap();
        (store, rec)
    }

    #[test]
    fn submitted_changes_are_saved_off_the_caller_then_visible() {
        let (store, rec) = recorded(Topology::empty(1));
        let ex = TopologyChange::DeclareExchange {
            name: "ex".into(),
            kind: ExchangeKind::Direct,
            owner: None,
        };
        let bind = TopologyChange::Bind {
            queue: "q".into(),
            exchange: "ex".into(),
            key: "k".into(),
            by: Some(Actor::Admin),
        };
        let (a, b, c) = (
            store.submit(queue("q", "r")),
            store.submit(ex),
            store.submit(bind),
        );
        assert_eq!((wait(a), wait(b), wait(c)), (Ok(()), Ok(()), Ok(())));
        let mut out = Vec::new();
        assert!(store.snapshot().route("ex", "k", &mut out) && out.len() == 1);
        let saved = rec.saved.lock().unwrap().clone();
        assert_eq!(saved.last().unwrap().0, ["q"]);
        assert!(saved
            .iter()
            .all(|(_, thread)| *thread != std::thread::current().id()));
        assert!(!store.unsaved());
        let unknown = TopologyChange::Bind {
            queue: "nope".into(),
            exchange: "ex".into(),
            key: "k".into(),
            by: Some(Actor::Admin),
        };
        assert_eq!(
            wait(store.submit(unknown)),
            Err(TopologyError::UnknownQueue("nope".into()))
        );
    }

    #[test]
    fn a_change_is_not_visible_before_it_is_saved() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.close();
        let mut pending = store.submit(queue("q", "r"));
        eventually("the saver is saving", || {
            rec.calls.load(Ordering::SeqCst) == 1
        });
        assert!(pending.try_take().is_none(), "answered before saved");
        assert!(
            store.snapshot().queue("q").is_none(),
            "visible before saved"
        );
        rec.open();
        assert_eq!(wait(pending), Ok(()));
        assert!(store.snapshot().queue("q").is_some());
    }

    #[test]
    fn a_failed_save_refuses_the_batch_and_publishes_nothing() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.fail.store(1, Ordering::SeqCst);
        let err = wait(store.submit(queue("q", "r"))).unwrap_err();
        assert_eq!(err, TopologyError::Storage("disk on fire".into()));
        assert!(store.snapshot().queue("q").is_none());
        assert!(!store.unsaved(), "nothing published is unsaved");
        // The disk is back: the same change is saved and answered.
        assert_eq!(wait(store.submit(queue("q", "r"))), Ok(()));
        assert_eq!(rec.last().unwrap(), ["q"]);
    }

    #[test]
    fn a_declare_applies_at_once_and_is_saved_later_by_the_saver() {
        let mut loaded = Topology::empty(2);
        loaded.apply(&queue("q", "r")).unwrap();
        let (store, rec) = recorded(loaded);
        let info = store.declare_queue("q.dlq", "r").unwrap();
        assert_eq!(info.shard, shard_of("r", 2));
        assert!(store.snapshot().queue("q.dlq").is_some());
        eventually("the declare is saved", || {
            rec.last().is_some_and(|q| q == ["q", "q.dlq"])
        });
        let saved = rec.saved.lock().unwrap().clone();
        assert!(saved
            .iter()
            .all(|(_, thread)| *thread != std::thread::current().id()));
        eventually("nothing is left unsaved", || !store.unsaved());
    }

    #[test]
    fn a_declare_never_waits_for_a_save_in_progress_and_neither_is_lost() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.close();
        let client = store.submit(queue("client_q", "r"));
        eventually("the saver is saving", || {
            rec.calls.load(Ordering::SeqCst) == 1
        });
        // The sink is stuck mid-save: a declare still returns at once and is
        // visible, since it takes no lock the save holds.
        let started = Instant::now();
        store.declare_queue("q.dlq", "r").unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(store.snapshot().queue("q.dlq").is_some());
        assert!(store.unsaved());
        rec.open();
        assert_eq!(wait(client), Ok(()));
        // Both are published, and a later save holds both.
        assert_eq!(queue_names(&store.snapshot()), ["client_q", "q.dlq"]);
        eventually("both are saved", || {
            rec.last().is_some_and(|q| q == ["client_q", "q.dlq"])
        });
        eventually("nothing is left unsaved", || !store.unsaved());
    }

    #[test]
    fn a_failed_save_of_a_declare_is_retried() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.fail.store(2, Ordering::SeqCst);
        store.declare_queue("q.dlq", "r").unwrap();
        eventually("the declare is saved after two failures", || {
            rec.last().is_some_and(|q| q == ["q.dlq"])
        });
        assert!(rec.calls.load(Ordering::SeqCst) >= 3);
        eventually("nothing is left unsaved", || !store.unsaved());
    }

    #[test]
    fn the_saver_ends_with_the_store_and_drops_the_sink() {
        struct Held(Arc<AtomicUsize>);
        impl Drop for Held {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let held = Held(dropped.clone());
        let store = TopologyStore::persisted(
            Topology::empty(1),
            move |_: &Topology| -> std::io::Result<()> {
                let _held = &held;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(wait(store.submit(queue("q", "r"))), Ok(()));
        drop(store);
        eventually("the sink is dropped", || {
            dropped.load(Ordering::SeqCst) == 1
        });
    }

    #[test]
    fn a_loaded_topology_is_placed_for_its_shard_count() {
        let mut t = Topology::empty(3);
        assert!(t.apply(&queue("receiver_1_queue", "receiver_1")).unwrap());
        assert!(!t.apply(&queue("receiver_1_queue", "admin")).unwrap());
        t.apply(&TopologyChange::DeclareExchange {
            name: "ex".into(),
            kind: ExchangeKind::Topic,
            owner: None,
        })
        .unwrap();
        t.apply(&TopologyChange::Bind {
            queue: "receiver_1_queue".into(),
            exchange: "ex".into(),
            key: "receiver_1.#".into(),
            by: None,
        })
        .unwrap();
        assert_eq!(t.version(), 3);
        let store =
            TopologyStore::persisted(t, |_: &Topology| -> std::io::Result<()> { Ok(()) }).unwrap();
        assert_eq!(store.shards(), 3);
        assert!(!store.unsaved(), "what was loaded is saved");
        let t = store.snapshot();
        assert_eq!(
            t.queue("receiver_1_queue").unwrap().shard,
            shard_of("receiver_1", 3)
        );
        let mut out = Vec::new();
        assert!(t.route("ex", "receiver_1.a.b", &mut out));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shard, shard_of("receiver_1", 3));
    }

    #[test]
    fn exchange_kind_conflicts_are_errors() {
        let store = TopologyStore::new(1);
        store.declare_exchange("ex", ExchangeKind::Topic).unwrap();
        store.declare_exchange("ex", ExchangeKind::Topic).unwrap();
        assert_eq!(
            store
                .declare_exchange("ex", ExchangeKind::Direct)
                .unwrap_err()
                .to_string(),
            "exchange ex exists with type topic"
        );
    }

    #[test]
    fn bind_needs_queue_and_exchange_and_is_seen_by_views() {
        let store = Arc::new(TopologyStore::new(2));
        let mut view = TopologyView::new(store.clone());
        assert_eq!(
            store.bind("q", "ex", "k"),
            Err(TopologyError::UnknownQueue("q".into()))
        );
        store.declare_queue("q", "receiver_1").unwrap();
        assert_eq!(
            store.bind("q", "ex", "k"),
            Err(TopologyError::UnknownExchange("ex".into()))
        );
        store.declare_exchange("ex", ExchangeKind::Direct).unwrap();
        store.bind("q", "ex", "k").unwrap();
        let mut out = Vec::new();
        assert!(view.current().route("ex", "k", &mut out));
        assert_eq!(&*out[0].queue, "q");
        assert!(!view.current().route("nope", "k", &mut out));
    }

    fn exchange(name: &str, kind: ExchangeKind, owner: Option<&str>) -> TopologyChange {
        TopologyChange::DeclareExchange {
            name: name.into(),
            kind,
            owner: owner.map(str::to_owned),
        }
    }

    fn bind(queue: &str, exchange: &str, key: &str, by: Option<Actor>) -> TopologyChange {
        TopologyChange::Bind {
            queue: queue.into(),
            exchange: exchange.into(),
            key: key.into(),
            by,
        }
    }

    fn routed(t: &Topology, exchange: &str, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        t.route(exchange, key, &mut out);
        let mut names: Vec<String> = out.iter().map(|t| t.queue.to_string()).collect();
        names.sort();
        names
    }

    #[test]
    fn the_first_declarer_owns_an_exchange_and_keeps_it() {
        let mut t = Topology::empty(1);
        assert!(t
            .apply(&exchange("r1_fan", ExchangeKind::Fanout, Some("r1")))
            .unwrap());
        // The same type again is a no-op for anyone, and transfers nothing.
        assert!(!t
            .apply(&exchange("r1_fan", ExchangeKind::Fanout, Some("r2")))
            .unwrap());
        assert!(!t
            .apply(&exchange("r1_fan", ExchangeKind::Fanout, None))
            .unwrap());
        assert_eq!(t.exchange_owner("r1_fan"), Some("r1"));
        // Another type is refused, and leaves owner and type alone.
        assert_eq!(
            t.apply(&exchange("r1_fan", ExchangeKind::Topic, Some("r2")))
                .unwrap_err()
                .to_string(),
            "exchange r1_fan exists with type fanout"
        );
        assert_eq!(t.exchange("r1_fan").unwrap().kind(), ExchangeKind::Fanout);
        assert_eq!(t.exchange_owner("r1_fan"), Some("r1"));
        // An admin's exchange belongs to no receiver, even when one declares it after.
        t.apply(&exchange("shared", ExchangeKind::Direct, None))
            .unwrap();
        t.apply(&exchange("shared", ExchangeKind::Direct, Some("r1")))
            .unwrap();
        assert_eq!(t.exchange_owner("shared"), None);
        assert_eq!(t.exchange_owner("nope"), None);
    }

    #[test]
    fn only_the_owner_binds_a_fanout_exchange() {
        let mut t = Topology::empty(1);
        t.apply(&queue("r1_queue", "r1")).unwrap();
        t.apply(&queue("r2_queue", "r2")).unwrap();
        t.apply(&exchange("fan", ExchangeKind::Fanout, Some("r1")))
            .unwrap();
        t.apply(&exchange("admin_fan", ExchangeKind::Fanout, None))
            .unwrap();
        t.apply(&exchange("direct", ExchangeKind::Direct, Some("r1")))
            .unwrap();
        let denied = Err(TopologyError::Denied(FANOUT_NOT_OWNED.into()));
        assert_eq!(
            t.apply(&bind("r2_queue", "fan", "r2", Some(Actor::receiver("r2")))),
            denied
        );
        // Ownership is checked before the queue's existence.
        assert_eq!(
            t.apply(&bind("r2_nope", "fan", "r2", Some(Actor::receiver("r2")))),
            denied
        );
        assert_eq!(
            t.apply(&bind(
                "r1_queue",
                "admin_fan",
                "r1",
                Some(Actor::receiver("r1"))
            )),
            denied
        );
        assert_eq!(
            t.apply(&bind("r1_queue", "fan", "r1", Some(Actor::receiver("r1")))),
            Ok(true)
        );
        // Another receiver's direct exchange takes its keys, as before.
        assert_eq!(
            t.apply(&bind(
                "r2_queue",
                "direct",
                "r2",
                Some(Actor::receiver("r2"))
            )),
            Ok(true)
        );
        // An admin binds anything.
        assert_eq!(
            t.apply(&bind("r2_queue", "admin_fan", "x", Some(Actor::Admin))),
            Ok(true)
        );
        assert_eq!(routed(&t, "fan", "anything"), ["r1_queue"]);
        assert_eq!(
            t.binder("fan", "r1", "r1_queue"),
            Some(&Actor::receiver("r1"))
        );
        assert_eq!(t.binder("admin_fan", "x", "r2_queue"), Some(&Actor::Admin));
        assert_eq!(t.binder("fan", "r2", "r2_queue"), None);
    }

    #[test]
    fn only_the_owner_deletes_an_exchange_and_its_bindings_go_too() {
        let mut t = Topology::empty(1);
        t.apply(&queue("r1_queue", "r1")).unwrap();
        t.apply(&exchange("fan", ExchangeKind::Fanout, Some("r1")))
            .unwrap();
        t.apply(&bind("r1_queue", "fan", "k", Some(Actor::receiver("r1"))))
            .unwrap();
        let delete = |by: Actor| TopologyChange::DeleteExchange {
            name: "fan".into(),
            by,
        };
        assert_eq!(
            t.apply(&delete(Actor::receiver("r2"))),
            Err(TopologyError::Denied(EXCHANGE_NOT_OWNED.into()))
        );
        assert_eq!(t.apply(&delete(Actor::receiver("r1"))), Ok(true));
        assert!(t.exchange("fan").is_none());
        assert_eq!(t.exchange_owner("fan"), None);
        assert_eq!(t.binder("fan", "k", "r1_queue"), None);
        assert_eq!(
            t.apply(&delete(Actor::Admin)),
            Err(TopologyError::UnknownExchange("fan".into()))
        );
        // Declared again by someone else, it is theirs, with no binding left.
        t.apply(&exchange("fan", ExchangeKind::Fanout, Some("r2")))
            .unwrap();
        assert_eq!(t.exchange_owner("fan"), Some("r2"));
        assert!(routed(&t, "fan", "k").is_empty());
    }

    #[test]
    fn a_deleted_queue_takes_its_bindings_and_counts_and_blocks_its_name_until_removed() {
        let mut t = Topology::empty(2);
        t.quotas = quota_of(10);
        let by_r1 = |name: &str| TopologyChange::DeclareQueue {
            name: name.into(),
            owner: "r1".into(),
            by: Some(Actor::receiver("r1")),
        };
        t.apply(&by_r1("r1_queue")).unwrap();
        t.apply(&by_r1("r1_other")).unwrap();
        t.apply(&exchange("ev", ExchangeKind::Topic, None)).unwrap();
        t.apply(&exchange("own", ExchangeKind::Fanout, Some("r1")))
            .unwrap();
        let r1 = || Some(Actor::receiver("r1"));
        t.apply(&bind("r1_queue", "ev", "r1.a", r1())).unwrap();
        t.apply(&bind("r1_other", "ev", "r1.a", r1())).unwrap();
        t.apply(&bind("r1_queue", "own", "x", r1())).unwrap();
        t.apply(&bind("r1_queue", "ev", "r1.admin", Some(Actor::Admin)))
            .unwrap();
        assert_eq!(t.usage("r1").queues, 2);
        assert_eq!(t.usage("r1").bindings, 3);

        let delete = |name: &str, by: Actor| TopologyChange::DeleteQueue {
            name: name.into(),
            by,
        };
        assert_eq!(
            t.apply(&delete("r1_queue", Actor::receiver("r2"))),
            Err(TopologyError::Denied(QUEUE_NOT_OWNED.into()))
        );
        assert_eq!(
            t.apply(&delete("r1_queue", Actor::receiver("r1"))),
            Ok(true)
        );
        assert!(t.queue("r1_queue").is_none());
        assert!(t.is_deleting("r1_queue"));
        assert_eq!(t.deleting(), ["r1_queue"]);
        // Every binding of it went, on every exchange; the others stay.
        assert_eq!(routed(&t, "ev", "r1.a"), vec!["r1_other"]);
        assert!(routed(&t, "ev", "r1.admin").is_empty());
        assert!(routed(&t, "own", "x").is_empty());
        assert_eq!(t.binder("ev", "r1.a", "r1_queue"), None);
        assert_eq!(t.usage("r1").queues, 1);
        assert_eq!(t.usage("r1").bindings, 1);
        assert_eq!(
            t.apply(&delete("r1_queue", Actor::Admin)),
            Err(TopologyError::UnknownQueue("r1_queue".into()))
        );
        // Until its log is gone, nobody declares the name, the broker neither.
        assert_eq!(
            t.apply(&by_r1("r1_queue")),
            Err(TopologyError::QueueBeingDeleted("r1_queue".into()))
        );
        assert_eq!(
            t.apply(&queue("r1_queue", "r1")),
            Err(TopologyError::QueueBeingDeleted("r1_queue".into()))
        );
        let removed = TopologyChange::QueueRemoved {
            name: "r1_queue".into(),
        };
        assert_eq!(t.apply(&removed), Ok(true));
        assert_eq!(t.apply(&removed), Ok(false));
        assert!(t.deleting().is_empty());
        assert_eq!(t.apply(&by_r1("r1_queue")), Ok(true));
        assert!(routed(&t, "ev", "r1.admin").is_empty(), "declared bare");
        // An admin deletes any queue.
        assert_eq!(t.apply(&delete("r1_other", Actor::Admin)), Ok(true));
        assert!(routed(&t, "ev", "r1.a").is_empty());
    }

    fn quota_of(limit: usize) -> Quotas {
        Quotas {
            queues_per_cn: limit,
            exchanges_per_cn: limit,
            bindings_per_cn: limit,
        }
    }

    fn exceeded(cn: &str, resource: Resource, limit: usize) -> Result<bool, TopologyError> {
        Err(TopologyError::QuotaExceeded {
            cn: cn.into(),
            resource,
            limit,
        })
    }

    #[test]
    fn a_receiver_is_held_to_its_queue_quota_but_admins_and_the_broker_are_not() {
        let mut t = Topology::empty(2);
        t.quotas = quota_of(2);
        let by_r1 = |name: &str| TopologyChange::DeclareQueue {
            name: name.into(),
            owner: "r1".into(),
            by: Some(Actor::receiver("r1")),
        };
        assert_eq!(t.apply(&by_r1("r1_a")), Ok(true));
        assert_eq!(t.apply(&by_r1("r1_b")), Ok(true));
        assert_eq!(t.apply(&by_r1("r1_c")), exceeded("r1", Resource::Queues, 2));
        // Declaring one it has is still an idempotent success at the quota.
        assert_eq!(t.apply(&by_r1("r1_a")), Ok(false));
        // An admin's queue for r1, and the broker's (a dead-letter queue),
        // are made, and counted.
        let by_admin = TopologyChange::DeclareQueue {
            name: "r1_admin".into(),
            owner: "r1".into(),
            by: Some(Actor::Admin),
        };
        assert_eq!(t.apply(&by_admin), Ok(true));
        assert_eq!(t.apply(&queue("r1_a.dlq", "r1")), Ok(true));
        assert_eq!(t.usage("r1").queues, 4);
        // Another CN has its own quota.
        let by_r2 = TopologyChange::DeclareQueue {
            name: "r2_a".into(),
            owner: "r2".into(),
            by: Some(Actor::receiver("r2")),
        };
        assert_eq!(t.apply(&by_r2), Ok(true));
    }

    #[test]
    fn a_receiver_is_held_to_its_exchange_quota() {
        let mut t = Topology::empty(1);
        t.quotas = quota_of(1);
        assert_eq!(
            t.apply(&exchange("e1", ExchangeKind::Topic, Some("r1"))),
            Ok(true)
        );
        assert_eq!(
            t.apply(&exchange("e2", ExchangeKind::Topic, Some("r1"))),
            exceeded("r1", Resource::Exchanges, 1)
        );
        assert!(t.exchange("e2").is_none());
        // Admins' exchanges belong to nobody and count for nobody.
        assert_eq!(
            t.apply(&exchange("e3", ExchangeKind::Topic, None)),
            Ok(true)
        );
        // Deleting its exchange gives the receiver room again.
        let delete = TopologyChange::DeleteExchange {
            name: "e1".into(),
            by: Actor::receiver("r1"),
        };
        assert_eq!(t.apply(&delete), Ok(true));
        assert_eq!(t.usage("r1"), Usage::default());
        assert_eq!(
            t.apply(&exchange("e2", ExchangeKind::Topic, Some("r1"))),
            Ok(true)
        );
    }

    #[test]
    fn a_receiver_is_held_to_its_binding_quota_and_deletes_give_it_back() {
        let mut t = Topology::empty(1);
        t.quotas = quota_of(3);
        t.apply(&queue("r1_queue", "r1")).unwrap();
        t.apply(&exchange("ev", ExchangeKind::Topic, None)).unwrap();
        t.apply(&exchange("own", ExchangeKind::Fanout, Some("r1")))
            .unwrap();
        let r1 = || Some(Actor::receiver("r1"));
        for key in ["r1.a", "r1.b"] {
            assert_eq!(t.apply(&bind("r1_queue", "ev", key, r1())), Ok(true));
        }
        assert_eq!(t.apply(&bind("r1_queue", "own", "x", r1())), Ok(true));
        assert_eq!(
            t.apply(&bind("r1_queue", "ev", "r1.c", r1())),
            exceeded("r1", Resource::Bindings, 3)
        );
        assert!(routed(&t, "ev", "r1.c").is_empty());
        // A binding it has is found by one lookup, and is no new binding.
        assert_eq!(t.apply(&bind("r1_queue", "ev", "r1.a", r1())), Ok(false));
        // An admin's binding of r1's queue is not r1's.
        assert_eq!(
            t.apply(&bind("r1_queue", "ev", "r1.admin", Some(Actor::Admin))),
            Ok(true)
        );
        assert_eq!(t.usage("r1").bindings, 3);
        // The exchange it owned goes, and its binding with it.
        let delete = TopologyChange::DeleteExchange {
            name: "own".into(),
            by: Actor::receiver("r1"),
        };
        assert_eq!(t.apply(&delete), Ok(true));
        assert_eq!(t.usage("r1").bindings, 2);
        assert_eq!(t.apply(&bind("r1_queue", "ev", "r1.c", r1())), Ok(true));
        assert_eq!(routed(&t, "ev", "r1.c"), vec!["r1_queue"]);
    }

    #[test]
    fn bindings_a_rule_removes_are_no_longer_counted() {
        let mut t = Topology::empty(1);
        t.apply(&queue("bad_queue", "bad")).unwrap();
        t.apply(&exchange("ev", ExchangeKind::Direct, None))
            .unwrap();
        t.apply(&bind(
            "bad_queue",
            "ev",
            "bad",
            Some(Actor::receiver("bad")),
        ))
        .unwrap();
        assert_eq!(t.usage("bad").bindings, 1);
        let removed = t.install_rule(Arc::new(Ban("bad")));
        assert_eq!(removed.len(), 1);
        assert_eq!(t.usage("bad").bindings, 0);
        assert_eq!(t.binder("ev", "bad", "bad_queue"), None);
    }

    #[test]
    fn quotas_set_on_a_store_hold_its_clients_and_are_reported() {
        let store = TopologyStore::new(1);
        store.set_quotas(quota_of(1));
        assert_eq!(store.snapshot().quotas(), quota_of(1));
        let declare = |name: &str| TopologyChange::DeclareQueue {
            name: name.into(),
            owner: "r1".into(),
            by: Some(Actor::receiver("r1")),
        };
        assert_eq!(wait(store.submit(declare("r1_a"))), Ok(()));
        assert!(matches!(
            wait(store.submit(declare("r1_b"))),
            Err(TopologyError::QuotaExceeded { .. })
        ));
        let usages: Vec<(String, Usage)> = store
            .snapshot()
            .usages()
            .map(|(cn, u)| (cn.to_owned(), u))
            .collect();
        assert_eq!(
            usages,
            vec![(
                "r1".to_owned(),
                Usage {
                    queues: 1,
                    exchanges: 0,
                    bindings: 0
                }
            )]
        );
    }

    #[test]
    fn a_large_topology_takes_changes_without_copying_itself_each_time() {
        // 30,000 bindings by 300 receivers over 300 exchanges: with maps
        // copied whole on every change this was quadratic (3 minutes in a
        // debug build, and 10,000 binds took 9 s); with persistent maps it
        // is linear (100,000 binds: 9 s in a debug build).
        let store = TopologyStore::new(2);
        for e in 0..300 {
            store
                .declare_exchange(&format!("ex{e}"), ExchangeKind::Direct)
                .unwrap();
        }
        for r in 0..300 {
            let cn = format!("r{r}");
            store.declare_queue(&format!("{cn}_queue"), &cn).unwrap();
            for k in 0..100 {
                let change = bind(
                    &format!("{cn}_queue"),
                    &format!("ex{}", (r + k) % 300),
                    &format!("{cn}.k{k}"),
                    Some(Actor::receiver(&cn)),
                );
                assert_eq!(wait(store.submit(change)), Ok(()));
            }
        }
        let t = store.snapshot();
        assert_eq!(t.usage("r299").bindings, 100);
        assert_eq!(routed(&t, "ex42", "r42.k0"), vec!["r42_queue"]);
    }

    /// Refuses bindings to queues of `banned`'s, and keys starting with `x`.
    #[derive(Debug)]
    struct Ban(&'static str);

    impl BindingRule for Ban {
        fn check(&self, b: &Binding<'_>) -> Result<(), String> {
            if &*b.queue.owner == self.0 {
                return Err(format!("{} is banned", self.0));
            }
            if b.key.starts_with('x') && b.bound_by != Some(&Actor::Admin) {
                return Err("x keys".into());
            }
            Ok(())
        }

        fn confined_to(&self, _: &QueueInfo) -> Option<Arc<str>> {
            None
        }
    }

    #[test]
    fn an_installed_rule_removes_what_it_refuses_and_judges_later_binds() {
        let mut loaded = Topology::empty(1);
        loaded.apply(&queue("r1_queue", "r1")).unwrap();
        loaded.apply(&queue("r2_queue", "r2")).unwrap();
        loaded
            .apply(&exchange("ex", ExchangeKind::Direct, None))
            .unwrap();
        for (q, key, by) in [
            ("r1_queue", "r1", Some(Actor::receiver("r1"))),
            ("r2_queue", "r2", Some(Actor::receiver("r2"))),
            ("r1_queue", "x1", None),
            ("r1_queue", "x2", Some(Actor::Admin)),
        ] {
            loaded.apply(&bind(q, "ex", key, by)).unwrap();
        }
        let (store, rec) = recorded(loaded);
        let before = store.version();
        let mut removed = store.set_binding_rule(Arc::new(Ban("r2")));
        removed.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            removed,
            [
                RemovedBinding {
                    exchange: "ex".into(),
                    key: "r2".into(),
                    queue: "r2_queue".into(),
                    bound_by: Some(Actor::receiver("r2")),
                    reason: "r2 is banned".into(),
                },
                RemovedBinding {
                    exchange: "ex".into(),
                    key: "x1".into(),
                    queue: "r1_queue".into(),
                    bound_by: None,
                    reason: "x keys".into(),
                },
            ]
        );
        let t = store.snapshot();
        assert!(t.version() > before);
        assert_eq!(routed(&t, "ex", "r1"), ["r1_queue"]);
        assert!(routed(&t, "ex", "r2").is_empty() && routed(&t, "ex", "x1").is_empty());
        assert_eq!(routed(&t, "ex", "x2"), ["r1_queue"]);
        assert_eq!(t.binder("ex", "r2", "r2_queue"), None);
        eventually("the removal is saved", || !store.unsaved());
        assert!(rec.calls.load(Ordering::SeqCst) >= 1);
        // Later binds go through the rule, submitted or applied at once.
        assert_eq!(
            wait(store.submit(bind("r2_queue", "ex", "r2", Some(Actor::receiver("r2"))))),
            Err(TopologyError::Denied("r2 is banned".into()))
        );
        assert_eq!(
            wait(store.submit(bind("r1_queue", "ex", "x3", Some(Actor::receiver("r1"))))),
            Err(TopologyError::Denied("x keys".into()))
        );
        assert_eq!(store.bind("r1_queue", "ex", "x3"), Ok(()));
        // A new rule replaces the old one.
        assert!(store.set_binding_rule(Arc::new(Ban("r3"))).is_empty());
        assert_eq!(
            wait(store.submit(bind("r2_queue", "ex", "r2", Some(Actor::receiver("r2"))))),
            Ok(())
        );
    }

    #[test]
    fn a_batch_built_before_a_rule_is_judged_by_it() {
        let mut loaded = Topology::empty(1);
        loaded.apply(&queue("r2_queue", "r2")).unwrap();
        loaded
            .apply(&exchange("ex", ExchangeKind::Direct, None))
            .unwrap();
        let (store, rec) = recorded(loaded);
        rec.close();
        let pending = store.submit(bind("r2_queue", "ex", "r2", Some(Actor::receiver("r2"))));
        eventually("the saver is saving", || {
            rec.calls.load(Ordering::SeqCst) == 1
        });
        // The rule arrives while the bind is being saved: it is not published.
        assert!(store.set_binding_rule(Arc::new(Ban("r2"))).is_empty());
        rec.open();
        assert_eq!(
            wait(pending),
            Err(TopologyError::Denied("r2 is banned".into()))
        );
        assert!(routed(&store.snapshot(), "ex", "r2").is_empty());
        // The refused bind was written with its batch; it is saved over.
        eventually("nothing is left unsaved", || !store.unsaved());
        assert!(rec.keys.lock().unwrap().is_empty());
    }
}
