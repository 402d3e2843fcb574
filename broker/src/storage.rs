//! Opening the data directory at start-up, before any shard serves: the saved
//! topology, and every queue's log read back (torn tails truncated, damage
//! reported). Blocking file I/O is fine here; nothing is being served yet.

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use ciphermq_pgbridge::{FileKeyStore, MemoryKeyStore, PublicKeyStore};
use ciphermq_shard::log::{queue_dir, recover_queue};
use ciphermq_shard::{RecoveredQueue, TopologyStore};

use crate::config::{Config, DatabaseBackend, StorageMode};
use crate::server::StartError;

/// What the shards start from.
pub struct Storage {
    /// Topology, saved to `topology.json` when durable.
    pub topology: Arc<TopologyStore>,
    /// `(data_dir, segment_bytes)` when queues are durable.
    pub durable: Option<(PathBuf, u64)>,
    /// Recovered queues, indexed by owning shard.
    pub recovered: Vec<Vec<(Arc<str>, RecoveredQueue)>>,
    /// Receivers' public keys: sealed files in the data directory when
    /// durable, memory otherwise.
    pub keys: Arc<dyn PublicKeyStore>,
}

impl Storage {
    /// Opens (or creates) the data directory of `config` for `shards` shards.
    pub fn open(config: &Config, shards: usize) -> Result<Storage, StartError> {
        let mut recovered: Vec<Vec<(Arc<str>, RecoveredQueue)>> =
            (0..shards).map(|_| Vec::new()).collect();
        if config.database.backend == DatabaseBackend::Postgres {
            return Err(StartError::Storage(
                "database.backend = \"postgres\" is not available in this build yet; use \"embedded\"".into(),
            ));
        }
        if config.storage.mode == StorageMode::Memory {
            return Ok(Storage {
                topology: Arc::new(TopologyStore::new(shards)),
                durable: None,
                recovered,
                keys: Arc::new(MemoryKeyStore::new()),
            });
        }
        let data_dir = config.storage.data_dir.clone();
        let err = |what: &str, e: &dyn std::fmt::Display| {
            StartError::Storage(format!(
                "storage.data_dir {}: {what}: {e}",
                data_dir.display()
            ))
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
        let aes_key = match config
            .resolve_aes_key()
            .map_err(|e| StartError::Storage(e.to_string()))?
        {
            Some(key) => key,
            None => generated_aes_key(&data_dir)?,
        };
        let keys = FileKeyStore::open(&data_dir.join("keys"), &aes_key)
            .map_err(|e| StartError::Storage(e.to_string()))?;
        tracing::info!(keys = keys.len(), "public keys loaded");
        Ok(Storage {
            topology: Arc::new(topology),
            durable: Some((data_dir, config.storage.segment_bytes)),
            recovered,
            keys: Arc::new(keys),
        })
    }
}

/// Without `encryption.aes_key`, a key made on first start and kept in
/// `{data_dir}/aes.key` (mode 0600). It protects keys only as well as the
/// data directory is protected: configure a key kept elsewhere in production.
fn generated_aes_key(data_dir: &std::path::Path) -> Result<[u8; 32], StartError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("aes.key");
    let err = |e: &dyn std::fmt::Display| {
        StartError::Storage(format!("encryption: {}: {e}", path.display()))
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let bytes = b64.decode(text.trim()).map_err(|e| err(&e))?;
            return bytes
                .try_into()
                .map_err(|_| err(&"expected base64 of exactly 32 bytes"));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(&e)),
    }
    let mut key = [0u8; 32];
    getrandom(&mut key).map_err(|e| err(&e))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| err(&e))?;
    file.write_all(b64.encode(key).as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| err(&e))?;
    tracing::warn!(path = %path.display(), "no encryption.aes_key configured: generated one beside the data; set encryption.aes_key_file to a key kept elsewhere");
    Ok(key)
}

/// Fills `buf` from the kernel's random source.
fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}
