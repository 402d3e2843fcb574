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
mod tests;
