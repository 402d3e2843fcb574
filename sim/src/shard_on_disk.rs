//! A durable shard whose logs live under a data directory of the simulated
//! disk: what every simulated start makes, in the shard simulation, its
//! regression tests and the session-level simulation alike.

use std::path::Path;
use std::sync::Arc;

use ciphermq_shard::durability::DiskSpace;
use ciphermq_shard::mesh::MeshOutbound;
use ciphermq_shard::{Clock, Durability, QueueSettings, Shard, TopologyStore};

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
