//! An owner's queues and their bindings as one value: what a move hands
//! over next to the logs, and what the owner catalogue in PostgreSQL keeps
//! for every owner, so that another node can declare the owner's queues
//! and bindings again when it takes the owner over.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::topology::{Actor, Topology, TopologyChange};
use serde::{Deserialize, Serialize};

use crate::runtime::context::Shared;

/// An owner's queues, each with the bindings that lead to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) owner: String,
    /// The placement's epoch this describes.
    pub(crate) epoch: u64,
    pub(crate) queues: Vec<QueueEntry>,
}

/// One queue of a [`Manifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QueueEntry {
    pub(crate) name: String,
    pub(crate) bindings: Vec<BindingEntry>,
}

/// A binding to a queue, with what is needed to declare its exchange where
/// it is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BindingEntry {
    pub(crate) exchange: String,
    pub(crate) kind: String,
    pub(crate) exchange_owner: Option<String>,
    pub(crate) key: String,
    pub(crate) bound_by: Option<BoundBy>,
}

/// Who made a binding (the topology's [`Actor`], as stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum BoundBy {
    Admin,
    Receiver(String),
}

impl BoundBy {
    /// The topology's actor.
    pub(crate) fn actor(&self) -> Actor {
        match self {
            BoundBy::Admin => Actor::Admin,
            BoundBy::Receiver(cn) => Actor::receiver(cn),
        }
    }
}

/// Every binding of `topology`, by the queue it leads to: one pass over
/// the exchanges, however many queues are described afterwards.
fn bindings_by_queue(topology: &Topology) -> HashMap<&str, Vec<BindingEntry>> {
    let mut by_queue: HashMap<&str, Vec<BindingEntry>> = HashMap::new();
    for (exchange, ex) in topology.exchanges() {
        for (key, target) in ex.bindings() {
            by_queue
                .entry(&target.queue)
                .or_default()
                .push(BindingEntry {
                    exchange: exchange.to_owned(),
                    kind: ex.kind().as_str().to_owned(),
                    exchange_owner: topology.exchange_owner(exchange).map(str::to_owned),
                    key: key.to_owned(),
                    bound_by: topology
                        .binder(exchange, key, &target.queue)
                        .map(|a| match a {
                            Actor::Admin => BoundBy::Admin,
                            Actor::Receiver(cn) => BoundBy::Receiver(cn.to_string()),
                        }),
                });
        }
    }
    by_queue
}

impl Manifest {
    /// `owner`'s queues `names` at `epoch`, with their bindings.
    pub(crate) fn of(topology: &Topology, owner: &str, epoch: u64, names: &[Arc<str>]) -> Manifest {
        let mut bindings = bindings_by_queue(topology);
        Manifest {
            owner: owner.to_owned(),
            epoch,
            queues: names
                .iter()
                .map(|name| QueueEntry {
                    name: name.to_string(),
                    bindings: bindings.remove(&**name).unwrap_or_default(),
                })
                .collect(),
        }
    }

    /// Every owner `epoch_of` names an epoch for (the owners this node
    /// holds), with all its queues (none, for an owner that has none).
    /// Queues and bindings come in name order, so an unchanged owner gives
    /// the same value again.
    pub(crate) fn all(
        topology: &Topology,
        epoch_of: impl Fn(&str) -> Option<u64>,
    ) -> BTreeMap<String, Manifest> {
        let mut bindings = bindings_by_queue(topology);
        let mut owners: BTreeMap<String, Manifest> = BTreeMap::new();
        for q in topology.queues() {
            let Some(epoch) = epoch_of(&q.owner) else {
                continue;
            };
            let mut queue_bindings = bindings.remove(&*q.name).unwrap_or_default();
            queue_bindings.sort_by(|a, b| (&a.exchange, &a.key).cmp(&(&b.exchange, &b.key)));
            owners
                .entry(q.owner.to_string())
                .or_insert_with(|| Manifest {
                    owner: q.owner.to_string(),
                    epoch,
                    queues: Vec::new(),
                })
                .queues
                .push(QueueEntry {
                    name: q.name.to_string(),
                    bindings: queue_bindings,
                });
        }
        for manifest in owners.values_mut() {
            manifest.queues.sort_by(|a, b| a.name.cmp(&b.name));
        }
        owners
    }

    /// Declares the queues and bindings here (an exchange missing here is
    /// declared first, as its catalogue row says). A queue that cannot be
    /// declared fails the whole; a binding that cannot be made is logged.
    pub(crate) fn declare(&self, shared: &Shared) -> Result<(), String> {
        let submit =
            |change: TopologyChange| futures_lite::future::block_on(shared.topology.submit(change));
        for q in &self.queues {
            submit(TopologyChange::DeclareQueue {
                name: q.name.clone(),
                owner: self.owner.clone(),
                by: None,
            })
            .map_err(|e| format!("queue {}: {e}", q.name))?;
        }
        for q in &self.queues {
            for b in &q.bindings {
                if shared.topology.snapshot().exchange(&b.exchange).is_none() {
                    if let Some(kind) = ExchangeKind::parse(&b.kind) {
                        let _ = submit(TopologyChange::DeclareExchange {
                            name: b.exchange.clone(),
                            kind,
                            owner: b.exchange_owner.clone(),
                        });
                    }
                }
                if let Err(e) = submit(TopologyChange::Bind {
                    queue: q.name.clone(),
                    exchange: b.exchange.clone(),
                    key: b.key.clone(),
                    by: b.bound_by.as_ref().map(BoundBy::actor),
                }) {
                    tracing::warn!(queue = %q.name, exchange = %b.exchange, key = %b.key, error = %e,
                        "a binding of an owner taken here was not made again");
                }
            }
        }
        Ok(())
    }

    /// A queue listed here that the ACL gives to another receiver: a
    /// hand-over or a record naming one is refused whole. A queue whose
    /// name names no receiver (an admin's) keeps its recorded owner.
    pub(crate) fn foreign_queue<'a>(
        &self,
        owner_of: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<(), String> {
        for q in &self.queues {
            if let Some(named) = owner_of(&q.name) {
                if named != self.owner {
                    return Err(format!(
                        "owner {} lists queue {}, which belongs to {named}",
                        self.owner, q.name
                    ));
                }
            }
        }
        Ok(())
    }
}
