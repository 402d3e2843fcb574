//! A durable shard whose logs live under a data directory of the simulated
//! disk: what every simulated start makes, in the shard simulation, its
//! regression tests and the session-level simulation alike.

use std::path::Path;
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::durability::DiskSpace;
use ciphermq_shard::mesh::MeshOutbound;
use ciphermq_shard::topology::Actor;
use ciphermq_shard::{Clock, Durability, QueueSettings, Shard, TopologyChange, TopologyStore};

use crate::disk::SimDisk;

/// A shard with logs under `data/queues`, rolling segments at
/// `segment_bytes`, reading the time from `clock`; its disk is never low
/// (full disks are simulated as failed writes, see
/// [`crate::committer::Faults`]).
pub fn durable_shard(
    data: &Path,
    segment_bytes: u64,
    settings: &QueueSettings,
    store: &Arc<TopologyStore>,
    outbound: MeshOutbound,
    clock: &Clock,
) -> Shard {
    let durable = Durability::new(
        data.to_path_buf(),
        segment_bytes,
        None,
        Arc::new(DiskSpace::new()),
    );
    let mut shard = Shard::new(settings.clone(), store.clone(), outbound, Some(durable));
    shard.set_clock(clock.clone());
    shard
}

/// A fresh data directory with its `queues/` made, and the simulated disk
/// over it: where a fixture's shard (the regression tests, the publish
/// bench) keeps its logs. The directory goes when the `TempDir` is dropped.
pub fn fresh_data_dir() -> (tempfile::TempDir, std::path::PathBuf, SimDisk) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let data = dir.path().to_path_buf();
    std::fs::create_dir_all(data.join("queues")).expect("the data directory's queues/");
    let disk = SimDisk::new(&data).expect("the simulated disk over the data directory");
    (dir, data, disk)
}

/// Applies `change` to `store`, panicking when it is refused: for fixtures
/// (the regression tests, the publish bench), whose topology is fixed.
pub fn apply(store: &TopologyStore, change: TopologyChange) {
    let mut result = store.submit(change);
    match result.try_take() {
        Some(Ok(())) => {}
        other => panic!("topology change not applied: {other:?}"),
    }
}

/// A one-shard topology store with the direct exchange `exchange`.
pub fn store_with_direct_exchange(exchange: &str) -> Arc<TopologyStore> {
    let store = Arc::new(TopologyStore::new(1));
    apply(
        &store,
        TopologyChange::DeclareExchange {
            name: exchange.into(),
            kind: ExchangeKind::Direct,
            owner: None,
        },
    );
    store
}

/// Declares queue `queue` of `owner` and binds it to `exchange` under `key`.
pub fn declare_bound_queue(
    store: &TopologyStore,
    queue: &str,
    owner: &str,
    exchange: &str,
    key: &str,
) {
    apply(
        store,
        TopologyChange::DeclareQueue {
            name: queue.into(),
            owner: owner.into(),
            by: None,
        },
    );
    apply(
        store,
        TopologyChange::Bind {
            queue: queue.into(),
            exchange: exchange.into(),
            key: key.into(),
            by: Some(Actor::Admin),
        },
    );
}
