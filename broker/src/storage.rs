//! Opening the data directory at start-up, before any shard serves: the saved
//! topology, and every queue's log read back (torn tails truncated, damage
//! reported). Blocking file I/O is fine here; nothing is being served yet.

use std::path::PathBuf;
use std::sync::Arc;

use ciphermq_shard::log::{queue_dir, recover_queue};
use ciphermq_shard::{RecoveredQueue, TopologyStore};

use crate::config::{Config, StorageMode};
use crate::server::StartError;

/// What the shards start from.
pub struct Storage {
    /// Topology, saved to `topology.json` when durable.
    pub topology: Arc<TopologyStore>,
    /// `(data_dir, segment_bytes)` when queues are durable.
    pub durable: Option<(PathBuf, u64)>,
    /// Recovered queues, indexed by owning shard.
    pub recovered: Vec<Vec<(Arc<str>, RecoveredQueue)>>,
}

impl Storage {
    /// Opens (or creates) the data directory of `config` for `shards` shards.
    pub fn open(config: &Config, shards: usize) -> Result<Storage, StartError> {
        let mut recovered: Vec<Vec<(Arc<str>, RecoveredQueue)>> =
            (0..shards).map(|_| Vec::new()).collect();
        if config.storage.mode == StorageMode::Memory {
            return Ok(Storage {
                topology: Arc::new(TopologyStore::new(shards)),
                durable: None,
                recovered,
            });
        }
        let data_dir = config.storage.data_dir.clone();
        let err = |what: &str, e: &dyn std::fmt::Display| {
            StartError::Storage(format!("{}: {what}: {e}", data_dir.display()))
        };
        std::fs::create_dir_all(data_dir.join("queues")).map_err(|e| err("cannot create", &e))?;
        // io_uring opens files relative to nothing: give it absolute paths.
        let data_dir = std::fs::canonicalize(&data_dir).map_err(|e| err("cannot resolve", &e))?;
        let topology = TopologyStore::open(data_dir.join("topology.json"), shards)
            .map_err(|e| err("topology", &e))?;
        let snapshot = topology.snapshot();
        let mut total = 0usize;
        for info in snapshot.queues() {
            let dir = queue_dir(&data_dir, &info.name);
            if !dir.exists() {
                continue;
            }
            let queue =
                recover_queue(&dir).map_err(|e| err(&format!("queue {}", info.name), &e))?;
            total += queue.messages.len();
            recovered[info.shard as usize].push((info.name.clone(), queue));
        }
        if let Ok(entries) = std::fs::read_dir(data_dir.join("queues")) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if snapshot.queue(&name).is_none() {
                    tracing::warn!(queue = %name, "queue log without a topology entry; left untouched");
                }
            }
        }
        tracing::info!(queues = snapshot.queues().count(), messages = total, data_dir = %data_dir.display(), "storage recovered");
        Ok(Storage {
            topology: Arc::new(topology),
            durable: Some((data_dir, config.storage.segment_bytes)),
            recovered,
        })
    }
}
