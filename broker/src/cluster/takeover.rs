//! Owners taken over from a node declared dead (DESIGN §10.3,
//! `cluster.storage = "local"`): the node an owner is given to starts it
//! with empty queues, declared with their bindings from the owner
//! catalogue ([`super::catalogue`]); the backlog stays on the dead node's
//! disk.
//!
//! A takeover shows up here as a placement change like any other: the
//! owner is now on this node, at an epoch above 1, while this node's
//! snapshot had it elsewhere and this node has none of its queues (a move
//! brings the queues before the placement changes, so it is never taken
//! for a takeover). The queues are declared before the change is applied,
//! so no publish for the owner arrives here before its queues exist.

use ciphermq_cluster::{ClusterError, Coordinator, PgCoordinator, Placement};

use super::manifest::Manifest;
use super::ClusterNode;
use crate::runtime::context::Shared;

/// Declares here the queues and bindings of every owner `changes` hand to
/// this node from another; call before applying `changes`. Fails (and
/// `changes` must wait for the next tick) only when the catalogue cannot
/// be read.
pub(crate) fn adopt(
    node: &ClusterNode,
    shared: &Shared,
    coordinator: &PgCoordinator,
    changes: &[Placement],
) -> Result<(), ClusterError> {
    let me = &*node.node_id;
    let (_, placements) = node.view.current();
    for p in changes {
        if p.node_id != me || p.epoch < 2 {
            continue;
        }
        let before = placements.home(&p.owner);
        if before.is_some_and(|home| &*home.node_id == me || home.epoch >= p.epoch) {
            continue;
        }
        if shared
            .topology
            .snapshot()
            .queues()
            .any(|q| *q.owner == *p.owner)
        {
            continue;
        }
        let from = before.map_or_else(|| "no node".to_owned(), |home| home.node_id.to_string());
        let Some((epoch, data)) = coordinator.owner_topology(&p.owner)? else {
            tracing::warn!(owner = %p.owner, from_node = %from, epoch = p.epoch,
                "owner taken over by this node: the catalogue has no record of its queues; its receiver declares them again");
            continue;
        };
        let manifest: Manifest = match serde_json::from_slice(&data) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(owner = %p.owner, error = %e,
                    "owner taken over by this node: its record in cluster_owner_topology is unreadable; its receiver declares its queues again");
                continue;
            }
        };
        let policy = shared.policy.current();
        let checked = if manifest.owner == p.owner {
            manifest.foreign_queue(|queue| policy.acl.queue_owner(queue))
        } else {
            Err(format!("the record is of owner {}", manifest.owner))
        };
        if let Err(e) = checked {
            tracing::error!(owner = %p.owner, error = %e,
                "owner taken over by this node: its record in cluster_owner_topology is refused; nothing declared");
            continue;
        }
        match manifest.declare(shared) {
            Ok(()) => {
                tracing::warn!(owner = %p.owner, from_node = %from, epoch = p.epoch, recorded_at_epoch = epoch,
                queues = manifest.queues.len(),
                "owner taken over by this node: its queues and bindings are declared here, empty; its backlog stays on the old node's disk")
            }
            Err(e) => tracing::error!(owner = %p.owner, from_node = %from, error = %e,
                "owner taken over by this node: its queues could not all be declared"),
        }
    }
    Ok(())
}
