//! The owner catalogue: every owner's queues and bindings, as the node
//! holding it last saw them, kept in PostgreSQL (`cluster_owner_topology`)
//! so that the node taking an owner over from a dead one can declare them
//! again ([`super::takeover`]).
//!
//! The coordinator link writes it behind the topology: on a tick after the
//! topology or the placements changed, each owner this node holds whose
//! queues or bindings differ from what was last written is written again,
//! tagged with its epoch (a node that lost the owner cannot overwrite its
//! new node's record). A change made in the last tick before a node dies
//! may therefore be missing from the record; docs/CLUSTER.md says so.

use std::collections::BTreeMap;

use ciphermq_cluster::{ClusterError, Coordinator, PgCoordinator};

use super::manifest::Manifest;
use super::ClusterNode;
use crate::runtime::context::Shared;

/// What this node last wrote, and for which state of the topology and the
/// placements.
#[derive(Default)]
pub(crate) struct OwnerCatalogue {
    /// (topology version, placement view version) of the last complete
    /// write; `None` until one succeeded.
    written_at: Option<(u64, u64)>,
    /// Each owner held here as last written.
    written: BTreeMap<String, Manifest>,
}

impl OwnerCatalogue {
    /// Writes what changed since the last call, and says how many owners
    /// it wrote; nothing when neither the topology nor the placements
    /// changed (one comparison per tick).
    pub(crate) fn write_changes(
        &mut self,
        node: &ClusterNode,
        shared: &Shared,
        coordinator: &PgCoordinator,
    ) -> Result<usize, ClusterError> {
        let topology = shared.topology.snapshot();
        let (view_version, placements) = node.view.current();
        let at = (topology.version(), view_version);
        if self.written_at == Some(at) {
            return Ok(0);
        }
        let me = &*node.node_id;
        let here = |owner: &str| {
            placements
                .home(owner)
                .filter(|home| &*home.node_id == me)
                .map(|home| home.epoch)
        };
        let mut now = Manifest::all(&topology, here);
        // An owner held here whose last queue went is written as empty.
        for owner in self.written.keys() {
            if let (false, Some(epoch)) = (now.contains_key(owner), here(owner)) {
                now.insert(
                    owner.clone(),
                    Manifest {
                        owner: owner.clone(),
                        epoch,
                        queues: Vec::new(),
                    },
                );
            }
        }
        let mut wrote = 0;
        for (owner, manifest) in &now {
            if self.written.get(owner) == Some(manifest) {
                continue;
            }
            wrote += 1;
            let data = serde_json::to_vec(manifest).map_err(|_| ClusterError::BadInput {
                what: "owner topology",
                value: owner.clone(),
                why: "cannot be encoded as JSON",
            })?;
            coordinator.put_owner_topology(owner, manifest.epoch, data)?;
            self.written.insert(owner.clone(), manifest.clone());
        }
        // Owners no longer held here are no longer this node's to write.
        self.written.retain(|owner, _| here(owner).is_some());
        self.written_at = Some(at);
        Ok(wrote)
    }
}
