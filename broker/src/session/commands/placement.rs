//! The cluster's part of executing a command: which owner a command is
//! about, whether this node holds it, and what to answer when it does not
//! (`Error: moved …`, `NACK <id> moved …`) or when no node holds it yet (the
//! command waits, parked, until the coordinator placed it, then runs
//! again). Outside a cluster every owner is here and none of this costs
//! more than one branch.

use std::sync::Arc;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::topology::TopologyChange;

use crate::access::acl::Role;
use crate::cluster::{Residence, COORDINATOR_WAIT, MOVE_WAIT};

/// How often a command parked behind a move looks whether it ended.
const MOVE_LOOK: std::time::Duration = std::time::Duration::from_millis(5);
use crate::session::{Parked, Session};

/// What a publish may do about the owner its envelope names.
pub(super) enum PublishHome {
    /// Route it here.
    Here,
    /// Answered (moved, or no node could be given), or parked.
    Settled,
}

impl Session {
    /// The owner of `queue`: the receiver its name belongs to, else the
    /// owner recorded when it was declared, else (a queue not declared yet,
    /// no receiver's) the caller, who would own it.
    pub(super) fn queue_owner(&self, queue: &str) -> Arc<str> {
        if let Some(owner) = self.policy.acl.queue_owner(queue) {
            return Arc::from(owner);
        }
        let recorded = self
            .local
            .shard
            .borrow_mut()
            .topology()
            .queue(queue)
            .map(|q| q.owner.clone());
        recorded.unwrap_or_else(|| self.identity.cn.clone())
    }

    /// Whether the owner of `queue` is served here; otherwise answers
    /// `Error: moved …` (or parks the command until it is placed) and
    /// returns false. Always true outside a cluster.
    pub(super) fn queue_at_home(&mut self, queue: &str) -> bool {
        if self.local.shared.cluster.is_none() {
            return true;
        }
        let owner = self.queue_owner(queue);
        self.owner_at_home(&owner)
    }

    /// [`Session::queue_at_home`] for an owner named directly.
    pub(super) fn owner_at_home(&mut self, owner: &str) -> bool {
        match self.local.residence(owner) {
            Residence::Here => true,
            Residence::Elsewhere(tail) => {
                self.replies.line(format!("Error: moved {tail}"));
                false
            }
            Residence::Fenced => {
                self.replies.line(fenced_line(&self.local));
                false
            }
            Residence::Unplaced if self.rerun => {
                self.replies.line(format!(
                    "Error: cluster: no node could be given to owner {owner}: the cluster \
                     coordinator did not answer; retry"
                ));
                false
            }
            Residence::Moving if self.rerun => {
                self.replies.line(format!(
                    "Error: cluster: owner {owner} is still being moved to another node; retry"
                ));
                false
            }
            Residence::Unplaced | Residence::Moving => {
                self.park_for = Some(owner.to_owned());
                false
            }
        }
    }

    /// Where a publish for the envelope's `receiver` (or, for `publish_for`,
    /// the named owner) may be stored. Only receivers are placed by a
    /// publish: an envelope naming anyone else can only reach queues no
    /// receiver owns, which are routed here.
    pub(super) fn publish_home(
        &mut self,
        owner: &str,
        message_id: &str,
        named: bool,
        in_batch: bool,
    ) -> PublishHome {
        let Some(cluster) = &self.local.shared.cluster else {
            return PublishHome::Here;
        };
        // A publisher usually writes to one owner: the last owner found
        // here, under the same placements and ACL, is here still.
        let versions = (cluster.view().version(), self.policy.version);
        if let Some((cached, at)) = &self.publish_home_cache {
            if *at == versions && **cached == *owner {
                return PublishHome::Here;
            }
        }
        let residence = self.local.residence(owner);
        let here = match residence {
            Residence::Here => true,
            Residence::Fenced => {
                // A fenced node stores nothing, whoever the message is for.
                self.replies
                    .nack(message_id, ciphermq_proto::NackReason::Storage);
                return PublishHome::Settled;
            }
            // Only receivers are placed by a publish: an envelope naming
            // anyone else can only reach queues no receiver owns, routed
            // here.
            _ => !named && self.policy.acl.role_of(owner) != Role::Receiver,
        };
        if here {
            self.publish_home_cache = Some((Box::from(owner), versions));
            return PublishHome::Here;
        }
        match residence {
            Residence::Here | Residence::Fenced => PublishHome::Here,
            Residence::Elsewhere(tail) => {
                self.replies.line(format!("NACK {message_id} moved {tail}"));
                PublishHome::Settled
            }
            Residence::Unplaced if in_batch => {
                // A batch is not parked for one element: the owner is placed
                // (here, unless another node wins) for the publishes after
                // it, and this element is routed here, where none of its
                // queues can be yet (docs/CLUSTER.md).
                drop(cluster.place(owner));
                PublishHome::Here
            }
            Residence::Unplaced | Residence::Moving if self.rerun => {
                self.replies
                    .nack(message_id, ciphermq_proto::NackReason::Timeout);
                PublishHome::Settled
            }
            Residence::Moving if in_batch => {
                // A batch is not parked for one element: the owner is back
                // (here or elsewhere) within a move, and this element may
                // be sent again then, with its id.
                self.replies
                    .nack(message_id, ciphermq_proto::NackReason::Timeout);
                PublishHome::Settled
            }
            Residence::Unplaced | Residence::Moving => {
                self.park_for = Some(owner.to_owned());
                PublishHome::Settled
            }
        }
    }

    /// Parks the command on `line` until the coordinator placed `owner`
    /// (or [`COORDINATOR_WAIT`] passed), or, for an owner being moved
    /// away, until its move ended (or [`MOVE_WAIT`] passed); it then runs
    /// again, from the start.
    pub(super) fn park(&mut self, line: &[u8], owner: &str) {
        let Some(cluster) = self.local.shared.cluster.clone() else {
            return;
        };
        let ready: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> =
            if self.local.residence(owner) == Residence::Moving {
                let owner = owner.to_owned();
                Box::pin(async move {
                    let moved = async {
                        // Moves are rare and short: a parked command looks
                        // again every few milliseconds, one atomic load.
                        let mut seen = 0;
                        loop {
                            let version = cluster.view().version();
                            if version != seen {
                                seen = version;
                                let (_, placements) = cluster.view().current();
                                if placements.residence(&owner, cluster.node_id())
                                    != Residence::Moving
                                {
                                    return;
                                }
                            }
                            glommio::timer::sleep(MOVE_LOOK).await;
                        }
                    };
                    futures_lite::future::or(moved, glommio::timer::sleep(MOVE_WAIT)).await;
                })
            } else {
                let answer = cluster.place(owner);
                Box::pin(async move {
                    let placed = async {
                        let _ = answer.await;
                    };
                    futures_lite::future::or(placed, glommio::timer::sleep(COORDINATOR_WAIT)).await;
                })
            };
        self.parked = Some(Parked {
            line: line.into(),
            ready,
        });
    }

    /// `nodes`: the live nodes, from the snapshot.
    pub(super) fn nodes(&mut self) {
        let line = match &self.local.shared.cluster {
            Some(cluster) => cluster.view().current().1.nodes_line().to_owned(),
            None => NOT_A_CLUSTER.to_owned(),
        };
        self.replies.line(line);
    }

    /// `locate <owner>`: where it lives, placing it here if no node holds
    /// it.
    pub(super) fn locate(&mut self, owner: &str) {
        let Some(cluster) = self.local.shared.cluster.clone() else {
            self.replies.line(NOT_A_CLUSTER);
            return;
        };
        match self.local.residence(owner) {
            Residence::Elsewhere(tail) => {
                self.replies.line(format!("OK locate {tail}"));
            }
            Residence::Fenced => {
                self.replies.line(fenced_line(&self.local));
            }
            Residence::Here => {
                let (_, placements) = cluster.view().current();
                let epoch = placements.home(owner).map_or(0, |h| h.epoch);
                let line = format!(
                    "OK locate {owner} {} {} {epoch}",
                    cluster.node_id(),
                    cluster.advertise().unwrap_or_default()
                );
                self.replies.line(line);
            }
            Residence::Unplaced | Residence::Moving => {
                self.owner_at_home(owner);
            }
        }
    }

    /// `move <owner> <node_id>`: asks the coordinator for the move and
    /// answers `OK move <owner> <node_id> <host:port> <epoch>` once it is
    /// done, or why it was refused or given up.
    pub(super) fn move_owner(&mut self, owner: &str, node: &str) {
        let Some(cluster) = self.local.shared.cluster.clone() else {
            self.replies.line(NOT_A_CLUSTER);
            return;
        };
        tracing::info!(admin = %self.identity.cn, owner, node, "move");
        let answer = cluster.move_owner(owner, node);
        let owner = owner.to_owned();
        self.reply_later(async move {
            let timeout = async {
                glommio::timer::sleep(MOVE_WAIT + COORDINATOR_WAIT).await;
                None
            };
            match futures_lite::future::or(async { answer.await.ok() }, timeout).await {
                Some(Ok(tail)) => format!("OK move {tail}"),
                Some(Err(e)) => format!("Error: cluster: {e}"),
                None => format!(
                    "Error: cluster: the move of owner {owner} did not end in time; see ciphermq-admin nodes"
                ),
            }
        });
    }

    /// `declare_exchange` in a cluster: the catalogue in PostgreSQL decides
    /// (the first declaration wins, another type is refused), then this
    /// node's topology takes it, owned by its first declarer when that is a
    /// receiver; the other nodes take it from the catalogue within a second.
    pub(super) fn declare_exchange_in_cluster(&mut self, exchange: &str, kind: ExchangeKind) {
        let Some(cluster) = self.local.shared.cluster.clone() else {
            return;
        };
        let answer = cluster.declare_exchange(exchange, kind, &self.identity.cn);
        let topology = self.local.shared.topology.clone();
        let policy = self.policy.clone();
        let role = self.identity.role;
        let name = exchange.to_owned();
        self.reply_later(async move {
            let timeout = async {
                glommio::timer::sleep(COORDINATOR_WAIT).await;
                None
            };
            let stored = futures_lite::future::or(async { answer.await.ok() }, timeout).await;
            let stored = match stored {
                None => {
                    return format!(
                        "Error: cluster: exchange {name} not declared: the cluster coordinator \
                         did not answer; retry"
                    )
                }
                Some(Err(e)) => return format!("Error: {e}"),
                Some(Ok(stored)) => stored,
            };
            let owner =
                (policy.acl.role_of(&stored.owner) == Role::Receiver).then_some(stored.owner);
            let change = TopologyChange::DeclareExchange {
                name: name.clone(),
                kind,
                owner,
            };
            match topology.submit(change).await {
                Ok(()) => format!("OK declare_exchange {name}"),
                Err(ciphermq_shard::TopologyError::Denied(reason)) => {
                    format!("Access denied: {reason} (role={role})")
                }
                Err(e) => format!("Error: {e}"),
            }
        });
    }
}

/// The answer to `nodes` and `locate` on a broker that is no cluster node.
const NOT_A_CLUSTER: &str = "Error: this broker is not a cluster node (cluster.enabled = false)";

/// The answer of a fenced node to every command about an owner.
fn fenced_line(local: &crate::runtime::context::ShardLocal) -> String {
    let node = local
        .shared
        .cluster
        .as_ref()
        .map_or("?", |c| &**c.node_id());
    format!(
        "Error: cluster: node {node} was registered again by another process and serves no \
         owner here any more; connect to another node"
    )
}
