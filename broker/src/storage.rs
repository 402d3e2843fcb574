//! Opening the data directory at start-up, before any shard serves: the saved
//! topology, and every queue's log read back (torn tails truncated, damage
//! reported). Blocking file I/O is fine here; nothing is being served yet.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ciphermq_pgbridge::{FileKeyStore, MemoryKeyStore, PgBridge, PgConfig, PublicKeyStore};
use ciphermq_shard::log::{queue_dir, recover_queue, MirrorWatermarks};
use ciphermq_shard::{DedupHasher, RecoveredQueue, TopologyStore};

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
    /// Receivers' public keys: sealed rows in PostgreSQL with that backend,
    /// else sealed files in the data directory when durable, else memory.
    pub keys: Arc<dyn PublicKeyStore>,
    /// The Postgres bridge, with `database.backend = "postgres"`.
    pub bridge: Option<PgBridge>,
    /// What the bridge has read of each queue's log (durable + postgres).
    pub mirror: Option<Arc<MirrorWatermarks>>,
    /// The dedup hash key: from the data directory when durable.
    pub dedup_hasher: DedupHasher,
}

impl Storage {
    /// Opens (or creates) the data directory of `config` for `shards` shards.
    pub fn open(config: &Config, shards: usize) -> Result<Storage, StartError> {
        let mut recovered: Vec<Vec<(Arc<str>, RecoveredQueue)>> =
            (0..shards).map(|_| Vec::new()).collect();
        let postgres = config.database.backend == DatabaseBackend::Postgres;
        if config.storage.mode == StorageMode::Memory {
            let (keys, bridge): (Arc<dyn PublicKeyStore>, _) = if postgres {
                let aes_key = config
                    .resolve_aes_key()
                    .map_err(|e| StartError::Storage(e.to_string()))?
                    .ok_or_else(|| {
                        StartError::Storage(
                            "encryption.aes_key: required with database.backend = \"postgres\" \
                             and storage.mode = \"memory\" (there is no data directory to keep a \
                             generated key in)"
                                .into(),
                        )
                    })?;
                tracing::warn!("storage.mode = \"memory\": the Postgres bridge keeps public keys only; message metadata is mirrored from durable queue logs");
                let bridge = start_bridge(config, aes_key, None)?;
                (bridge.key_store(), Some(bridge))
            } else {
                (Arc::new(MemoryKeyStore::new()), None)
            };
            return Ok(Storage {
                topology: Arc::new(TopologyStore::new(shards)),
                durable: None,
                recovered,
                keys,
                bridge,
                mirror: None,
                dedup_hasher: DedupHasher::random(),
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
        let dedup_hasher = dedup_hasher(&data_dir)?;
        let snapshot = topology.snapshot();
        let mut total = 0usize;
        for info in snapshot.queues() {
            let dir = queue_dir(&data_dir, &info.name);
            if !dir.exists() {
                continue;
            }
            let queue = recover_queue(&dir, &dedup_hasher)
                .map_err(|e| err(&format!("queue {}", info.name), &e))?;
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
        let (keys, bridge, mirror): (Arc<dyn PublicKeyStore>, _, _) = if postgres {
            let mirror = Arc::new(MirrorWatermarks::new());
            let bridge = start_bridge(config, aes_key, Some((data_dir.clone(), mirror.clone())))?;
            (bridge.key_store(), Some(bridge), Some(mirror))
        } else {
            let keys = FileKeyStore::open(&data_dir.join("keys"), &aes_key)
                .map_err(|e| StartError::Storage(e.to_string()))?;
            (Arc::new(keys), None, None)
        };
        tracing::info!(keys = keys.len(), "public keys loaded");
        let topology = Arc::new(topology);
        topology
            .start_saver()
            .map_err(|e| err("cannot start the topology writer thread", &e))?;
        Ok(Storage {
            topology,
            durable: Some((data_dir, config.storage.segment_bytes)),
            recovered,
            keys,
            bridge,
            mirror,
            dedup_hasher,
        })
    }
}

/// Connects to PostgreSQL (retrying up to `database.connect_timeout_secs`),
/// creates the schema if missing, loads the keys and starts the bridge thread.
fn start_bridge(
    config: &Config,
    aes_key: [u8; 32],
    logs: Option<(PathBuf, Arc<MirrorWatermarks>)>,
) -> Result<PgBridge, StartError> {
    let d = &config.database;
    let password = config
        .resolve_db_password()
        .map_err(|e| StartError::Storage(e.to_string()))?;
    let pg = PgConfig {
        host: d.host.clone(),
        port: d.port,
        user: d.user.clone(),
        password,
        dbname: d.dbname.clone(),
        batch_size: d.batch_size,
        flush_interval: Duration::from_millis(d.flush_interval_ms),
        max_unmirrored_bytes: d.mirror_disk_budget_mb.saturating_mul(1 << 20),
        connect_timeout: Duration::from_secs(d.connect_timeout_secs),
    };
    let bridge = PgBridge::start(pg, aes_key, logs)
        .map_err(|e| StartError::Storage(format!("database: {e}")))?;
    tracing::info!(host = %d.host, port = d.port, dbname = %d.dbname, "Postgres bridge started");
    Ok(bridge)
}

/// Without `encryption.aes_key`, a key made on first start and kept in
/// `{data_dir}/aes.key` (mode 0600). It protects keys only as well as the
/// data directory is protected: configure a key kept elsewhere in production.
fn generated_aes_key(data_dir: &std::path::Path) -> Result<[u8; 32], StartError> {
    let (key, created) = data_dir_secret::<32>(&data_dir.join("aes.key"), "encryption")?;
    if created {
        tracing::warn!(path = %data_dir.join("aes.key").display(), "no encryption.aes_key configured: generated one beside the data; set encryption.aes_key_file to a key kept elsewhere");
    }
    Ok(key)
}

/// The dedup hash key, made on first start and kept in `{data_dir}/dedup.key`
/// (mode 0600): dedup entries carried in the logs must hash the same after a
/// restart, and clients must not know it.
fn dedup_hasher(data_dir: &std::path::Path) -> Result<DedupHasher, StartError> {
    let (key, _) = data_dir_secret::<16>(&data_dir.join("dedup.key"), "storage")?;
    Ok(DedupHasher::from_bytes(key))
}

/// Reads the base64 secret of `N` bytes at `path`, or makes a random one
/// there (created: `true`), written and synced before use.
fn data_dir_secret<const N: usize>(
    path: &std::path::Path,
    section: &str,
) -> Result<([u8; N], bool), StartError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: &dyn std::fmt::Display| {
        StartError::Storage(format!("{section}: {}: {e}", path.display()))
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let bytes = b64.decode(text.trim()).map_err(|e| err(&e))?;
            let key = bytes
                .try_into()
                .map_err(|_| err(&format!("expected base64 of exactly {N} bytes")))?;
            return Ok((key, false));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(&e)),
    }
    let mut key = [0u8; N];
    getrandom(&mut key).map_err(|e| err(&e))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| err(&e))?;
    file.write_all(b64.encode(key).as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| err(&e))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| err(&e))?;
    }
    Ok((key, true))
}

/// Fills `buf` from the kernel's random source.
fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}
