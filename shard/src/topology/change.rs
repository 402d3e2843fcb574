//! Changes to a topology: what a client may ask for, why it is refused,
//! and applying it to a [`Topology`] (queues, exchanges, quota counts).

use std::collections::HashMap;
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;

#[cfg(doc)]
use super::BindingRule;
use super::{
    Actor, QueueInfo, Topology, EXCHANGE_HAS_OTHERS_BINDINGS, EXCHANGE_NOT_OWNED, QUEUE_NOT_OWNED,
};
use crate::placement::shard_of;
use crate::quota::{Resource, Usage};
use crate::routing::Exchange;

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

/// What a submitted change ends with.
pub type ChangeResult = Result<(), TopologyError>;

impl Topology {
    /// Records `name` as deleted with its log possibly still on disk, for
    /// loading a saved topology (the start then removes that log and clears
    /// the mark with [`TopologyChange::QueueRemoved`]). Bumps the version.
    pub fn mark_deleting(&mut self, name: &str) {
        if self.deleting.insert(Arc::from(name), ()).is_none() {
            self.version += 1;
        }
    }

    /// Adds `delta` to what `cn` holds of `resource`.
    pub(super) fn count(&mut self, cn: &Arc<str>, resource: Resource, delta: isize) {
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
    pub(super) fn check_quota(
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
    pub(super) fn apply_change(&mut self, change: &TopologyChange) -> Result<bool, TopologyError> {
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
}
