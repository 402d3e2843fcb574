//! Opening the data directory at start-up, before any shard serves: the
//! directory's lock, the saved topology, and every queue's log read back
//! (torn tails truncated, damage reported). Blocking file I/O is fine here;
//! nothing is being served yet.
//!
//! What can be worked around is, and is reported: a damaged `topology.json`
//! (its previous copy is used), a damaged sealed key (set aside; its receiver
//! registers again), a damaged `dedup.key` (a new one), a queue directory
//! `topology.json` forgot (adopted: a dead-letter queue by the owner of its
//! queue, any other by the receiver that owns its name). What cannot stops
//! the start with the file and what to do: the directory locked by another
//! broker, a damaged `aes.key`, a queue directory nobody owns.
//!
//! The file helpers are `ciphermq-datadir`'s; `topology.json` is
//! [`crate::storage::topology_file`]'s, and once the shards serve, only the topology
//! store's saver thread writes it.

pub(crate) mod backlog_reader;
pub(crate) mod chores;
pub(crate) mod committer;
pub(crate) mod disk_watch;
pub(crate) mod file_deleter;
pub(crate) mod finished_io;
pub(crate) mod log_file;
pub(crate) mod topology_file;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use ciphermq_datadir::{self as data_dir, DataDirLock, StorageWarning};
use ciphermq_keystore::{FileKeyStore, MemoryKeyStore, PublicKeyStore};
use ciphermq_pgbridge::{PgBridge, PgConfig, SslMode};
use ciphermq_shard::durability::is_deleted_dir_name;
use ciphermq_shard::log::{queue_dir, recover_queue, MirrorWatermarks};
use ciphermq_shard::{DedupHasher, RecoveredQueue, Topology, TopologyChange, TopologyStore};

use crate::access::acl::Acl;
use crate::config::{Config, DatabaseBackend, DatabaseSslMode, StorageMode};
use ciphermq_stats::StorageFindings;
use topology_file::TopologyFile;

/// Why the data directory (or the Postgres bridge behind it) could not be
/// opened: one message naming the file or setting to fix. Start-up reports it
/// as [`StartError::Storage`](crate::StartError::Storage).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StorageError(String);

/// What the shards start from.
pub(crate) struct Storage {
    /// Topology, saved to `topology.json` when durable (its sink then holds
    /// the data directory's lock, for as long as the store lives).
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
    /// What was wrong with the data directory and was worked around at start
    /// (a file set aside, an older copy used, a queue adopted), each already
    /// logged: for `/ready` and `/api/status`, so an operator sees it after
    /// the log has rolled over.
    pub warnings: Vec<StorageWarning>,
}

impl Storage {
    /// Opens (or creates) the data directory of `config` for `shards` shards.
    pub(crate) fn open(config: &Config, shards: usize) -> Result<Storage, StorageError> {
        let mut recovered: Vec<Vec<(Arc<str>, RecoveredQueue)>> =
            (0..shards).map(|_| Vec::new()).collect();
        let postgres = config.database.backend == DatabaseBackend::Postgres;
        if config.storage.mode == StorageMode::Memory {
            let (keys, bridge): (Arc<dyn PublicKeyStore>, _) = if postgres {
                let aes_key = config
                    .resolve_aes_key()
                    .map_err(|e| StorageError(e.to_string()))?
                    .ok_or_else(|| {
                        StorageError(
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
                warnings: Vec::new(),
            });
        }
        let data_dir = config.storage.data_dir.clone();
        let err = |what: &str, e: &dyn std::fmt::Display| {
            StorageError(format!(
                "storage.data_dir {}: {what}: {e}",
                data_dir.display()
            ))
        };
        // For the broker's user alone (0700), whatever the umask.
        data_dir::create_dir_all(&data_dir.join("queues")).map_err(|e| err("cannot create", &e))?;
        // io_uring opens files relative to nothing: give it absolute paths.
        let data_dir = std::fs::canonicalize(&data_dir).map_err(|e| err("cannot resolve", &e))?;
        // The directories just made must survive a power cut with what is
        // written in them: sync each one's entry in its parent.
        data_dir::sync_dir(data_dir::parent_dir(&data_dir))
            .and_then(|()| data_dir::sync_dir(&data_dir))
            .map_err(|e| err("cannot sync", &e))?;
        // Before anything in the directory is read or written.
        let lock = DataDirLock::acquire(&data_dir)
            .map_err(|e| StorageError(format!("storage.data_dir: {e}")))?;
        let topology_path = data_dir.join(topology_file::FILE_NAME);
        let (mut loaded, mut warnings) =
            topology_file::load(&topology_path, shards).map_err(|e| err("topology", &e))?;
        let dedup_hasher = dedup_hasher(&data_dir, &mut warnings)?;
        let removed = remove_deleted_queues(&data_dir, &mut loaded)?;
        if adopt_orphan_queues(config, &data_dir, &mut loaded, &mut warnings)? || removed {
            // Saved before anything is served: the next start finds them
            // listed.
            topology_file::save(&topology_path, &loaded).map_err(|e| {
                StorageError(format!(
                    "storage.data_dir: topology: {}: {e}",
                    topology_path.display()
                ))
            })?;
        }
        // The store lives until the last shard has stopped, and its sink
        // with it: so does the lock.
        let topology = TopologyStore::persisted(loaded, TopologyFile::new(topology_path, lock))
            .map_err(|e| err("cannot start the topology writer thread", &e))?;
        let snapshot = topology.snapshot();
        let mut total = 0u64;
        let window_ms = config.performance.dedup_window_secs.saturating_mul(1000);
        for info in snapshot.queues() {
            let dir = queue_dir(&data_dir, &info.name);
            if !dir.exists() {
                continue;
            }
            let queue = recover_queue(&dir, &dedup_hasher, window_ms)
                .map_err(|e| err(&format!("queue {}", info.name), &e))?;
            total += queue.message_count();
            recovered[info.shard as usize].push((info.name.clone(), queue));
        }
        tracing::info!(queues = snapshot.queues().count(), messages = total, data_dir = %data_dir.display(), "storage recovered");
        let aes_key = match config
            .resolve_aes_key()
            .map_err(|e| StorageError(e.to_string()))?
        {
            Some(key) => key,
            None => generated_aes_key(&data_dir)?,
        };
        let (keys, bridge, mirror): (Arc<dyn PublicKeyStore>, _, _) = if postgres {
            let mirror = Arc::new(MirrorWatermarks::new());
            let bridge = start_bridge(config, aes_key, Some((data_dir.clone(), mirror.clone())))?;
            (bridge.key_store(), Some(bridge), Some(mirror))
        } else {
            let (keys, key_warnings) = FileKeyStore::open(&data_dir.join("keys"), &aes_key)
                .map_err(|e| StorageError(e.to_string()))?;
            warnings.extend(key_warnings);
            (Arc::new(keys), None, None)
        };
        tracing::info!(keys = keys.len(), "public keys loaded");
        Ok(Storage {
            topology,
            durable: Some((data_dir, config.storage.segment_bytes)),
            recovered,
            keys,
            bridge,
            mirror,
            dedup_hasher,
            warnings,
        })
    }
}

/// Finishes what `delete_queue` left: every directory a deletion moved
/// aside (`{queue}~deleted-…`) is removed, and so is the directory of every
/// queue `topology.json` records as deleted (a crash before its log was
/// moved away), before anything could adopt or read it; those records are
/// then cleared in `topology` (the caller saves it). Returns whether any
/// record was cleared.
fn remove_deleted_queues(data_dir: &Path, topology: &mut Topology) -> Result<bool, StorageError> {
    let queues = data_dir.join("queues");
    let io_err = |path: &Path, e: std::io::Error| {
        StorageError(format!("storage.data_dir: {}: {e}", path.display()))
    };
    let remove = |path: &Path| match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, e)),
    };
    let mut removed_any = false;
    for entry in std::fs::read_dir(&queues).map_err(|e| io_err(&queues, e))? {
        let entry = entry.map_err(|e| io_err(&queues, e))?;
        let name = entry.file_name();
        if name.to_str().is_some_and(is_deleted_dir_name) {
            let path = entry.path();
            remove(&path)?;
            tracing::info!(path = %path.display(), "removed the log directory of a deleted queue");
            removed_any = true;
        }
    }
    let deleting: Vec<String> = topology.deleting().into_iter().map(str::to_owned).collect();
    for name in &deleting {
        let dir = queue_dir(data_dir, name);
        if dir.exists() {
            remove(&dir)?;
            tracing::info!(queue = %name, path = %dir.display(), "removed the log directory of a queue deleted before the last stop");
            removed_any = true;
        }
    }
    if removed_any {
        data_dir::sync_dir(&queues).map_err(|e| io_err(&queues, e))?;
    }
    for name in &deleting {
        topology
            .apply(&TopologyChange::QueueRemoved { name: name.clone() })
            .map_err(|e| StorageError(format!("storage.data_dir: topology: {e}")))?;
    }
    Ok(!deleting.is_empty())
}

/// Gives every queue directory that `topology.json` does not list back to
/// its owner, in `topology` (the caller saves it), so its messages are
/// recovered rather than overwritten by a later `declare_queue` of the same
/// name. Returns whether it adopted any.
///
/// The owner of a dead-letter queue `{q}.dlq` is the owner `topology.json`
/// records for `{q}`: the broker declares it with exactly that owner, and saves
/// the declaration after the first message is moved there, so a crash in
/// between leaves this directory (whoever owns `{q}`, a receiver or an admin).
/// Any other directory goes to the receiver CN that owns its name (as the ACL
/// decides it, docs/ARCHITECTURE.md, "Identity and access"); a directory
/// neither rule gives an owner stops the start, naming every such directory,
/// since guessing an owner would hand its messages to the wrong client.
fn adopt_orphan_queues(
    config: &Config,
    data_dir: &Path,
    topology: &mut Topology,
    warnings: &mut Vec<StorageWarning>,
) -> Result<bool, StorageError> {
    let queues = data_dir.join("queues");
    let io_err = |path: &Path, e: std::io::Error| {
        StorageError(format!("storage.data_dir: {}: {e}", path.display()))
    };
    let acl = Acl::new(&[], &[], &config.acl.receiver_cns);
    let mut adopt = Vec::new();
    let mut unowned = Vec::new();
    for entry in std::fs::read_dir(&queues).map_err(|e| io_err(&queues, e))? {
        let entry = entry.map_err(|e| io_err(&queues, e))?;
        let path = entry.path();
        let name = entry.file_name();
        if name
            .to_str()
            .is_some_and(|name| topology.queue(name).is_some())
        {
            continue;
        }
        let is_dir = entry.file_type().map_err(|e| io_err(&path, e))?.is_dir();
        if !is_dir {
            tracing::warn!(path = %path.display(), "not a queue directory; left untouched");
            continue;
        }
        let owner = name.to_str().filter(|n| is_queue_name(n)).and_then(|n| {
            let owner = match dead_letter_base(topology, n) {
                Some(base) => Owner::DeadLetterOf {
                    base: base.name.to_string(),
                    owner: base.owner.to_string(),
                },
                None => Owner::Receiver(acl.queue_owner(n)?.to_owned()),
            };
            Some((n.to_owned(), owner))
        });
        match owner {
            Some(queue) => adopt.push((path, queue)),
            None => unowned.push(path),
        }
    }
    if !unowned.is_empty() {
        unowned.sort();
        let list: Vec<String> = unowned.iter().map(|p| p.display().to_string()).collect();
        return Err(StorageError(format!(
            "storage.data_dir: {}: queue director{} with no entry in topology.json, and no \
             receiver in acl.receiver_cns owns {}: the messages there would be lost to a later \
             declare_queue. Restore topology.json (or topology.json.prev) from a backup, add the \
             owning receiver CN to acl.receiver_cns, or move the director{} out of {}",
            list.join(", "),
            if list.len() == 1 { "y" } else { "ies" },
            if list.len() == 1 {
                "its name"
            } else {
                "their names"
            },
            if list.len() == 1 { "y" } else { "ies" },
            queues.display()
        )));
    }
    adopt.sort();
    let adopted = !adopt.is_empty();
    for (path, (name, owner)) in adopt {
        let (owner, message) = match owner {
            Owner::Receiver(owner) => {
                let message = format!(
                    "queue directory with no entry in topology.json: adopted as queue {name} of \
                     receiver {owner}, so its messages are served again; its bindings were not \
                     saved, so bind it again"
                );
                (owner, message)
            }
            Owner::DeadLetterOf { base, owner } => {
                let message = format!(
                    "dead-letter queue directory with no entry in topology.json (the broker \
                     stopped before saving its declaration): adopted as queue {name} of {owner}, \
                     the owner of {base}, so its messages are served again"
                );
                (owner, message)
            }
        };
        topology
            .apply(&TopologyChange::DeclareQueue {
                name: name.clone(),
                owner: owner.clone(),
                by: None,
            })
            .map_err(|e| StorageError(format!("storage.data_dir: topology: {e}")))?;
        let warning = StorageWarning::new(&path, message);
        tracing::warn!(path = %path.display(), queue = %name, owner = %owner, "{}", warning.message);
        warnings.push(warning);
    }
    Ok(adopted)
}

/// Who an orphan queue directory goes to.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    /// The queue's name says which receiver owns it.
    Receiver(String),
    /// A dead-letter queue of `base`, which `topology.json` lists.
    DeadLetterOf {
        /// The queue it takes the dead letters of.
        base: String,
        /// Its owner, as recorded.
        owner: String,
    },
}

/// For `{q}.dlq` (or `{q}.dlq.dlq`, the dead letters of a dead-letter
/// queue), the queue `q` as `topology` records it, if it does.
fn dead_letter_base<'t>(
    topology: &'t Topology,
    name: &str,
) -> Option<&'t ciphermq_shard::QueueInfo> {
    let mut base = name.strip_suffix(".dlq")?;
    loop {
        if let Some(info) = topology.queue(base) {
            return Some(info);
        }
        base = base.strip_suffix(".dlq")?;
    }
}

/// Whether a directory under `queues/` is named like a queue the broker
/// makes: a protocol name, or one followed by `.dlq`.
fn is_queue_name(name: &str) -> bool {
    let base = name.strip_suffix(".dlq").unwrap_or(name);
    ciphermq_proto::is_valid_name(base) && name != "." && name != ".."
}

impl Storage {
    /// What the start found wrong and worked around, for the admin endpoint:
    /// the warnings above, plus every damaged log range moved to quarantine
    /// (each already logged with its file and offset) and the torn ends cut.
    pub(crate) fn findings(&self) -> StorageFindings {
        let mut findings = StorageFindings {
            warnings: self.warnings.iter().map(ToString::to_string).collect(),
            ..StorageFindings::default()
        };
        for (_, queue) in self.recovered.iter().flatten() {
            for damage in &queue.damage {
                findings.quarantined_records += damage.records;
                findings.quarantined_bytes += damage.bytes;
                findings.warnings.push(damage.to_string());
            }
            findings.torn_bytes += queue.torn.iter().map(|(_, _, len)| len).sum::<u64>();
        }
        findings
    }
}

/// Connects to PostgreSQL (retrying up to `database.connect_timeout_secs`),
/// creates the schema if missing, loads the keys and starts the bridge thread.
fn start_bridge(
    config: &Config,
    aes_key: [u8; 32],
    logs: Option<(PathBuf, Arc<MirrorWatermarks>)>,
) -> Result<PgBridge, StorageError> {
    let d = &config.database;
    let password = config
        .resolve_db_password()
        .map_err(|e| StorageError(e.to_string()))?;
    let pg = PgConfig {
        host: d.host.clone(),
        port: d.port,
        user: d.user.clone(),
        password,
        dbname: d.dbname.clone(),
        sslmode: match d.sslmode {
            DatabaseSslMode::Disable => SslMode::Disable,
            DatabaseSslMode::Prefer => SslMode::Prefer,
            DatabaseSslMode::Require => SslMode::Require,
            DatabaseSslMode::VerifyFull => SslMode::VerifyFull,
        },
        ca_cert_path: d.ca_cert_path.clone(),
        batch_size: d.batch_size,
        node: if config.cluster.enabled {
            config.cluster.node_id.clone()
        } else {
            String::new()
        },
        flush_interval: Duration::from_millis(d.flush_interval_ms),
        max_unmirrored_bytes: d.mirror_disk_budget_mb.saturating_mul(1 << 20),
        connect_timeout: Duration::from_secs(d.connect_timeout_secs),
        // A cluster's nodes share the database: a key registered on one is
        // usable on every node within this.
        key_refresh: config.cluster.enabled.then_some(Duration::from_millis(500)),
    };
    let bridge =
        PgBridge::start(pg, aes_key, logs).map_err(|e| StorageError(format!("database: {e}")))?;
    tracing::info!(host = %d.host, port = d.port, dbname = %d.dbname, sslmode = d.sslmode.as_str(), "Postgres bridge started");
    Ok(bridge)
}

/// Without `encryption.aes_key`, a key made on first start and kept in
/// `{data_dir}/aes.key` (mode 0600). It protects keys only as well as the
/// data directory is protected: configure a key kept elsewhere in production.
///
/// A damaged `aes.key` stops the start: the keys sealed under it cannot be
/// read without it, and making a new one would orphan them silently. So
/// does a missing one while sealed keys exist.
fn generated_aes_key(data_dir: &Path) -> Result<[u8; 32], StorageError> {
    let path = data_dir.join("aes.key");
    let keys_dir = data_dir.join("keys");
    const CONFIGURE: &str = "set encryption.aes_key (or encryption.aes_key_file, or \
                             CIPHERMQ_AES_KEY) to the key it held";
    match read_secret::<32>(&path) {
        Ok(Some(key)) => return Ok(key),
        Ok(None) => {}
        Err(SecretError::Io(e)) => {
            return Err(StorageError(format!("encryption: {}: {e}", path.display())))
        }
        Err(SecretError::Malformed(why)) => {
            return Err(StorageError(format!(
                "encryption: {}: not a usable AES key ({why}; it must hold the standard base64 \
                 of exactly 32 bytes). The public keys sealed in {} cannot be read without it: \
                 restore this file from a backup, or {CONFIGURE}. To give those keys up instead, \
                 move aes.key and keys/ out of the data directory; a new key is then made and \
                 receivers register again.",
                path.display(),
                keys_dir.display()
            )))
        }
    }
    if holds_sealed_keys(&keys_dir) {
        return Err(StorageError(format!(
            "encryption: {} is missing, but {} holds public keys sealed under it: restore it \
             from a backup, or {CONFIGURE}. To give those keys up instead, move keys/ out of the \
             data directory; receivers then register again.",
            path.display(),
            keys_dir.display()
        )));
    }
    let key = new_secret::<32>(&path)
        .map_err(|e| StorageError(format!("encryption: {}: {e}", path.display())))?;
    tracing::warn!(path = %path.display(), "no encryption.aes_key configured: generated one beside the data; set encryption.aes_key_file to a key kept elsewhere");
    Ok(key)
}

/// Whether `keys_dir` holds anything sealed under an AES key: a key file or
/// the store's check file.
fn holds_sealed_keys(keys_dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(keys_dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name == ciphermq_keystore::file_store::CHECK_FILE
            || (name.ends_with(".key") && !name.starts_with('.'))
    })
}

/// The dedup hash key, made on first start and kept in `{data_dir}/dedup.key`
/// (mode 0600): dedup entries carried in the logs must hash the same after a
/// restart, and clients must not know it.
///
/// A damaged one is moved aside and replaced rather than stopping the start:
/// all it costs is the dedup of retries across this restart, which the
/// warning says.
fn dedup_hasher(
    data_dir: &Path,
    warnings: &mut Vec<StorageWarning>,
) -> Result<DedupHasher, StorageError> {
    let path = data_dir.join("dedup.key");
    let fail =
        |e: &dyn std::fmt::Display| StorageError(format!("storage: {}: {e}", path.display()));
    const WEAKENED: &str = "dedup across this restart is weakened: a retry of a message acked \
                            before the restart may be stored again";
    let warning = match read_secret::<16>(&path) {
        Ok(Some(key)) => return Ok(DedupHasher::from_bytes(key)),
        Err(SecretError::Io(e)) => return Err(fail(&e)),
        Ok(None) => {
            let queues = std::fs::read_dir(data_dir.join("queues"))
                .map(|mut entries| entries.next().is_some())
                .unwrap_or(false);
            // On a fresh directory there is nothing to weaken.
            queues.then(|| format!("was missing; made a new one, so {WEAKENED}"))
        }
        Err(SecretError::Malformed(why)) => {
            let aside = data_dir::move_aside(&path).map_err(|e| fail(&e))?;
            Some(format!(
                "unusable ({why}); kept as {} and replaced by a new key, so {WEAKENED}",
                aside.display()
            ))
        }
    };
    let key = new_secret::<16>(&path).map_err(|e| fail(&e))?;
    if let Some(message) = warning {
        tracing::warn!(path = %path.display(), "{message}");
        warnings.push(StorageWarning::new(&path, message));
    }
    Ok(DedupHasher::from_bytes(key))
}

/// Why a secret file could not be used.
enum SecretError {
    /// It could not be read.
    Io(std::io::Error),
    /// It was read, but does not hold the base64 of the expected length.
    Malformed(String),
}

/// Reads the base64 secret of `N` bytes at `path`; `None` when there is no
/// file.
fn read_secret<const N: usize>(path: &Path) -> Result<Option<[u8; N]>, SecretError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SecretError::Io(e)),
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim_ascii())
        .map_err(|e| SecretError::Malformed(format!("not base64: {e}")))?;
    let len = bytes.len();
    bytes
        .try_into()
        .map(Some)
        .map_err(|_| SecretError::Malformed(format!("holds {len} bytes, expected {N}")))
}

/// Makes a random secret of `N` bytes and writes it to `path` in base64,
/// atomically and readable by this user only, before it is used.
fn new_secret<const N: usize>(path: &Path) -> std::io::Result<[u8; N]> {
    let mut key = [0u8; N];
    getrandom(&mut key)?;
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    data_dir::write_atomic(path, text.as_bytes(), data_dir::SECRET_MODE)?;
    Ok(key)
}

/// Fills `buf` from the kernel's random source.
fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_dead_letter_queue_belongs_to_the_recorded_owner_of_its_queue() {
        let mut t = Topology::empty(2);
        t.apply(&TopologyChange::DeclareQueue {
            name: "orders".into(),
            owner: "admin".into(),
            by: None,
        })
        .unwrap();
        let owner = |name: &str| dead_letter_base(&t, name).map(|q| q.owner.to_string());
        assert_eq!(owner("orders.dlq").as_deref(), Some("admin"));
        // The dead letters of a dead-letter queue, both unsaved.
        assert_eq!(owner("orders.dlq.dlq").as_deref(), Some("admin"));
        // Not a dead-letter queue, or one of a queue nobody recorded.
        assert_eq!(owner("orders"), None);
        assert_eq!(owner("other.dlq"), None);
        assert_eq!(owner(".dlq"), None);
    }

    #[test]
    fn secrets_are_made_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut warnings = Vec::new();
        let first = dedup_hasher(dir.path(), &mut warnings).unwrap();
        let key = generated_aes_key(dir.path()).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(mode(&dir.path().join("dedup.key")), 0o600);
        assert_eq!(mode(&dir.path().join("aes.key")), 0o600);
        assert_eq!(generated_aes_key(dir.path()).unwrap(), key);
        let again = dedup_hasher(dir.path(), &mut warnings).unwrap();
        assert!(first == again, "the same dedup key after a restart");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_damaged_dedup_key_is_kept_aside_and_replaced_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dedup.key");
        std::fs::write(&path, "not base64!").unwrap();
        let mut warnings = Vec::new();
        dedup_hasher(dir.path(), &mut warnings).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].path, path);
        assert!(
            warnings[0]
                .message
                .contains("dedup across this restart is weakened"),
            "{}",
            warnings[0]
        );
        assert!(matches!(read_secret::<16>(&path), Ok(Some(_))));
        assert_eq!(mode(&path), 0o600);
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("dedup.key.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(&aside[0])).unwrap(),
            "not base64!"
        );
    }

    #[test]
    fn a_damaged_aes_key_stops_the_start_and_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aes.key");
        std::fs::write(&path, "AAAA\n").unwrap();
        let err = generated_aes_key(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&*path.to_string_lossy())
                && err.contains("holds 3 bytes, expected 32")
                && err.contains("restore this file"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "AAAA\n");
    }

    #[test]
    fn a_missing_aes_key_is_not_replaced_while_keys_are_sealed_under_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("keys")).unwrap();
        std::fs::write(dir.path().join("keys").join("receiver_1.key"), [0u8; 60]).unwrap();
        let err = generated_aes_key(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is missing") && err.contains("keys"), "{err}");
        assert!(!dir.path().join("aes.key").exists());
    }
}
