//! A shard's cached snapshot, refreshed when the store's version moves.

use std::sync::Arc;

use super::{Topology, TopologyStore};

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
