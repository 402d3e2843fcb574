//! The owners this node holds on shared storage (`cluster.storage =
//! "shared"`, DESIGN §10.3), and where their queues' logs go.
//!
//! Each owner this node holds has a live directory of its own tenure
//! (`ciphermq_cluster::shared_storage`), made by the coordinator thread
//! before the owner is served here. Every log of that owner's queues is
//! made inside it, guarded by a [`HeldFence`]: after each round's
//! `fdatasync` the committer asks it whether this node still holds the
//! owner (its lease holds, and its directory is the one it made) and
//! acknowledges nothing of the round otherwise.
//!
//! A queue whose owner this node does not hold (yet) gets a log that can
//! never be written ([`UNHELD`]): its publishes are answered `NACK storage`
//! rather than stored where no later holder would look.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use ciphermq_cluster::shared_storage::{EpochDir, LeaseGate, SharedStore};
use ciphermq_shard::log::{LogFence, LogPlacement, PlacedLog};
use ciphermq_shard::topology::TopologyStore;

/// The directory name a log of an owner not held here is placed under: it
/// never exists, so the committer cannot make the log's directory.
pub(crate) const UNHELD: &str = "not-held-by-this-node";

/// The shared directory and the owners this node holds in it.
#[derive(Debug)]
pub(crate) struct SharedLogs {
    store: SharedStore,
    /// This node's lease, renewed by the coordinator thread.
    gate: Arc<LeaseGate>,
    held: RwLock<HashMap<Arc<str>, Arc<HeldFence>>>,
}

impl SharedLogs {
    pub(crate) fn new(store: SharedStore, gate: Arc<LeaseGate>) -> SharedLogs {
        SharedLogs {
            store,
            gate,
            held: RwLock::new(HashMap::new()),
        }
    }

    /// The shared directory.
    pub(crate) fn store(&self) -> &SharedStore {
        &self.store
    }

    /// This node's lease, which every fence here checks.
    pub(crate) fn gate(&self) -> &Arc<LeaseGate> {
        &self.gate
    }

    /// From now on `owner`'s new logs go into `dir`.
    pub(crate) fn hold(&self, owner: &str, dir: EpochDir) {
        let fence = Arc::new(HeldFence {
            dir,
            gate: self.gate.clone(),
        });
        self.held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Arc::from(owner), fence);
    }

    /// `owner` is no longer held here.
    pub(crate) fn release(&self, owner: &str) {
        self.held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(owner);
    }

    /// The directory `owner` is held in here, if it is.
    pub(crate) fn held(&self, owner: &str) -> Option<EpochDir> {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(owner)
            .map(|f| f.dir.clone())
    }

    fn place_owned(&self, owner: &str, queue: &str) -> PlacedLog {
        let held = self
            .held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(owner)
            .cloned();
        match held {
            Some(fence) => PlacedLog {
                dir: fence.dir.queue_dir(queue),
                fence,
            },
            None => self.unheld(owner, queue),
        }
    }

    fn unheld(&self, owner: &str, queue: &str) -> PlacedLog {
        PlacedLog {
            dir: self.store.owner_dir(owner).join(UNHELD).join(queue),
            fence: Arc::new(Unheld),
        }
    }
}

/// What a shard asks where a new log goes.
#[derive(Debug)]
pub(crate) struct SharedLogPlacement {
    pub(crate) logs: Arc<SharedLogs>,
    pub(crate) topology: Arc<TopologyStore>,
}

impl LogPlacement for SharedLogPlacement {
    fn place(&self, queue: &str) -> Option<PlacedLog> {
        let topology = self.topology.snapshot();
        Some(match topology.queue(queue) {
            Some(info) => self.logs.place_owned(&info.owner, queue),
            None => self.logs.unheld("", queue),
        })
    }
}

/// The fence of an owner held here: its lease and its directory.
#[derive(Debug)]
pub(crate) struct HeldFence {
    dir: EpochDir,
    gate: Arc<LeaseGate>,
}

impl LogFence for HeldFence {
    fn holds(&self) -> bool {
        // The lease first: it costs no system call.
        if !self.gate.is_valid(Instant::now()) {
            return false;
        }
        match self.dir.still_in_place() {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(dir = %self.dir.path().display(), error = %e,
                    "cannot check that this node still holds an owner's shared directory; nothing is acknowledged");
                false
            }
        }
    }
}

/// The fence of a log whose owner this node does not hold: never passes.
#[derive(Debug)]
struct Unheld;

impl LogFence for Unheld {
    fn holds(&self) -> bool {
        false
    }
}
