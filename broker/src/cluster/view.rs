//! The placement snapshot: where every owner lives, as this node last heard
//! from the coordinator. The coordinator link writes it; shards read it with
//! one atomic load (and the lock only after a change), so routing a publish
//! never waits on PostgreSQL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use ciphermq_cluster::{NodeInfo, Placement};

/// Where one owner lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Home {
    /// The node holding it.
    pub node_id: Arc<str>,
    /// That node's address for clients.
    pub advertise: Arc<str>,
    /// The placement's fencing token (never lower than one seen before).
    pub epoch: u64,
}

impl Home {
    fn of(placement: &Placement) -> Home {
        Home {
            node_id: Arc::from(placement.node_id.as_str()),
            advertise: Arc::from(placement.advertise.as_str()),
            epoch: placement.epoch,
        }
    }
}

/// What a command about `owner` should do on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Residence {
    /// The owner lives here: serve it.
    Here,
    /// It lives on another node: `<owner> <node_id> <host:port> <epoch>`,
    /// the tail of a `moved` reply.
    Elsewhere(String),
    /// No node holds it yet (as far as this node has heard).
    Unplaced,
    /// It lives here but is being moved to another node: commands about
    /// it wait for the move to end (then they are told where it went, or
    /// served here again if the move was given up).
    Moving,
    /// This node was fenced (another process registered its node id): it
    /// serves no owner any more.
    Fenced,
}

/// One immutable state of the snapshot. The owners are a persistent map:
/// a change copies it in O(1) and inserts in O(log n), so placing many
/// owners one by one does not copy the whole map each time.
#[derive(Debug, Default)]
pub(crate) struct Placements {
    owners: imbl::HashMap<Arc<str>, Home>,
    /// Owners held here that are being moved away.
    leaving: imbl::HashSet<Arc<str>>,
    /// Owners being moved here, with the epoch they will have: their
    /// queues are on this node's disk before the placement says so.
    arriving: imbl::HashMap<Arc<str>, u64>,
    /// This node no longer speaks for its node id.
    fenced: bool,
    /// The `nodes` reply, rendered when the node list changes.
    nodes_line: String,
}

impl Placements {
    /// Where `owner` lives, judged from `node_id`'s point of view.
    pub(crate) fn residence(&self, owner: &str, node_id: &str) -> Residence {
        if self.fenced {
            return Residence::Fenced;
        }
        match self.owners.get(owner) {
            None => Residence::Unplaced,
            Some(home) if &*home.node_id == node_id => {
                if !self.leaving.is_empty() && self.leaving.contains(owner) {
                    Residence::Moving
                } else {
                    Residence::Here
                }
            }
            Some(home) => Residence::Elsewhere(format!(
                "{owner} {} {} {}",
                home.node_id, home.advertise, home.epoch
            )),
        }
    }

    /// The owner's home, if it has one.
    pub(crate) fn home(&self, owner: &str) -> Option<&Home> {
        self.owners.get(owner)
    }

    /// The epoch of the copy of `owner` this node stores: the one a move
    /// to this node will give it while it arrives, else its placement's.
    pub(crate) fn stored_epoch(&self, owner: &str) -> u64 {
        match self.arriving.get(owner) {
            Some(epoch) => *epoch,
            None => self.owners.get(owner).map_or(0, |home| home.epoch),
        }
    }

    /// Whether a move is bringing `owner` here (its queues may be here
    /// before its placement says so).
    pub(crate) fn is_arriving(&self, owner: &str) -> bool {
        self.arriving.contains_key(owner)
    }

    /// `OK nodes <node_id>@<host:port> …`, live nodes by id.
    pub(crate) fn nodes_line(&self) -> &str {
        &self.nodes_line
    }

    /// How many owners each node holds, by node id.
    pub(crate) fn owners_per_node(&self) -> HashMap<Arc<str>, usize> {
        let mut counts = HashMap::new();
        for home in self.owners.values() {
            *counts.entry(home.node_id.clone()).or_default() += 1;
        }
        counts
    }

    /// Every placed owner with its home, in no order.
    pub(crate) fn owners(&self) -> impl Iterator<Item = (&Arc<str>, &Home)> {
        self.owners.iter()
    }

    /// How many owners are placed.
    pub(crate) fn len(&self) -> usize {
        self.owners.len()
    }
}

/// The snapshot and its version (bumped on every change).
#[derive(Debug)]
pub(crate) struct PlacementView {
    version: AtomicU64,
    current: RwLock<Arc<Placements>>,
}

impl Default for PlacementView {
    fn default() -> Self {
        PlacementView {
            version: AtomicU64::new(1),
            current: RwLock::new(Arc::new(Placements {
                owners: imbl::HashMap::new(),
                leaving: imbl::HashSet::new(),
                arriving: imbl::HashMap::new(),
                fenced: false,
                nodes_line: "OK nodes".to_owned(),
            })),
        }
    }
}

impl PlacementView {
    /// The version of the current snapshot: compare before taking it.
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current snapshot and its version.
    pub(crate) fn current(&self) -> (u64, Arc<Placements>) {
        let guard = self.current.read().unwrap_or_else(PoisonError::into_inner);
        (self.version(), guard.clone())
    }

    /// Applies placements heard from the coordinator. A placement whose
    /// epoch is lower than the one held is ignored: epochs only rise.
    /// Returns how many changed.
    pub(crate) fn apply(&self, placements: &[Placement]) -> usize {
        self.update(|state| {
            let mut changed = 0;
            for p in placements {
                let stale = state
                    .owners
                    .get(p.owner.as_str())
                    .is_some_and(|held| held.epoch > p.epoch);
                let home = Home::of(p);
                if !stale && state.owners.get(p.owner.as_str()) != Some(&home) {
                    state.owners.insert(Arc::from(p.owner.as_str()), home);
                    changed += 1;
                }
            }
            changed
        })
    }

    /// Marks `owner` as being moved away (`true`), or no longer (`false`):
    /// while it is, commands about it wait ([`Residence::Moving`]).
    pub(crate) fn set_leaving(&self, owner: &str, leaving: bool) {
        self.update(|state| {
            if leaving {
                usize::from(state.leaving.insert(Arc::from(owner)).is_none())
            } else {
                usize::from(state.leaving.remove(owner).is_some())
            }
        });
    }

    /// Marks `owner` as arriving here at `epoch` (`None`: no longer).
    pub(crate) fn set_arriving(&self, owner: &str, epoch: Option<u64>) {
        self.update(|state| match epoch {
            Some(e) => usize::from(state.arriving.insert(Arc::from(owner), e) != Some(e)),
            None => usize::from(state.arriving.remove(owner).is_some()),
        });
    }

    /// Marks this node fenced: from now on it serves no owner.
    pub(crate) fn fence(&self) {
        self.update(|state| usize::from(!std::mem::replace(&mut state.fenced, true)));
    }

    /// Replaces the live node list (for `nodes`); a node's new address also
    /// becomes its owners' address.
    pub(crate) fn set_nodes(&self, nodes: &[NodeInfo]) -> bool {
        let mut line = String::from("OK nodes");
        for n in nodes {
            line.push(' ');
            line.push_str(&n.node_id);
            line.push('@');
            line.push_str(&n.advertise);
        }
        self.update(|state| {
            let mut changed = state.nodes_line != line;
            for (_, home) in state.owners.iter_mut() {
                let moved = nodes
                    .iter()
                    .find(|n| *n.node_id == *home.node_id)
                    .filter(|n| *n.advertise != *home.advertise);
                if let Some(n) = moved {
                    home.advertise = Arc::from(n.advertise.as_str());
                    changed = true;
                }
            }
            state.nodes_line = line;
            usize::from(changed)
        }) > 0
    }

    /// Runs `change` on a copy of the state and publishes the copy when it
    /// reports a change. Only the coordinator link writes, so copies never
    /// race.
    fn update(&self, change: impl FnOnce(&mut Placements) -> usize) -> usize {
        let mut guard = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = Placements {
            owners: guard.owners.clone(),
            leaving: guard.leaving.clone(),
            arriving: guard.arriving.clone(),
            fenced: guard.fenced,
            nodes_line: guard.nodes_line.clone(),
        };
        let changed = change(&mut next);
        if changed > 0 {
            *guard = Arc::new(next);
            self.version.fetch_add(1, Ordering::Release);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(owner: &str, node: &str, epoch: u64) -> Placement {
        Placement {
            owner: owner.to_owned(),
            node_id: node.to_owned(),
            advertise: format!("{node}.example:5700"),
            epoch,
            version: epoch,
        }
    }

    #[test]
    fn residence_names_the_node_and_epoch_of_a_remote_owner() {
        let view = PlacementView::default();
        view.apply(&[placed("r1", "a", 1), placed("r2", "b", 3)]);
        let (_, p) = view.current();
        assert_eq!(p.residence("r1", "a"), Residence::Here);
        assert_eq!(
            p.residence("r2", "a"),
            Residence::Elsewhere("r2 b b.example:5700 3".to_owned())
        );
        assert_eq!(p.residence("r3", "a"), Residence::Unplaced);
        view.fence();
        let (_, p) = view.current();
        assert_eq!(p.residence("r1", "a"), Residence::Fenced);
        assert_eq!(p.residence("r3", "a"), Residence::Fenced);
    }

    #[test]
    fn a_lower_epoch_never_replaces_a_higher_one() {
        let view = PlacementView::default();
        view.apply(&[placed("r1", "b", 2)]);
        let before = view.version();
        assert_eq!(view.apply(&[placed("r1", "a", 1)]), 0);
        assert_eq!(view.version(), before, "nothing changed, no new version");
        let (_, p) = view.current();
        assert_eq!(p.home("r1").map(|h| h.epoch), Some(2));
        assert_eq!(view.apply(&[placed("r1", "c", 3)]), 1);
        assert!(view.version() > before);
    }

    #[test]
    fn the_nodes_line_lists_nodes_in_the_given_order_and_follows_new_addresses() {
        let view = PlacementView::default();
        view.apply(&[placed("r1", "a", 1)]);
        let node = |id: &str, addr: &str| NodeInfo {
            node_id: id.to_owned(),
            advertise: addr.to_owned(),
            incarnation: 1,
            heartbeat_age: std::time::Duration::ZERO,
            heartbeat_stamp: 0,
        };
        assert!(view.set_nodes(&[node("a", "127.0.0.1:1"), node("b", "127.0.0.1:2")]));
        let (_, p) = view.current();
        assert_eq!(p.nodes_line(), "OK nodes a@127.0.0.1:1 b@127.0.0.1:2");
        assert_eq!(
            p.home("r1").map(|h| h.advertise.to_string()),
            Some("127.0.0.1:1".to_owned())
        );
        assert!(!view.set_nodes(&[node("a", "127.0.0.1:1"), node("b", "127.0.0.1:2")]));
    }
}
