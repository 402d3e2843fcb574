//! Exchanges, queues and bindings.
//!
//! Topology changes are rare, so they go through one writer (a mutex held only
//! for the change itself) that publishes a new immutable [`Topology`] snapshot.
//! Shards route against their cached snapshot and notice a new one with a
//! single atomic load per publish. The snapshot is published before the
//! declaring command is answered, so a publish sent after `OK bind …` sees
//! the binding on every shard.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use ciphermq_proto::ExchangeKind;

use crate::placement::{shard_of, ShardId};
use crate::routing::{Exchange, Target};

/// Where a queue lives and who owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Queue name.
    pub name: Arc<str>,
    /// The CN whose shard holds the queue.
    pub owner: Arc<str>,
    /// `shard_of(owner)`.
    pub shard: ShardId,
}

/// An immutable view of the topology.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    version: u64,
    queues: HashMap<Arc<str>, QueueInfo>,
    exchanges: HashMap<Arc<str>, Arc<Exchange>>,
}

impl Topology {
    /// Bumped on every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A queue by name.
    pub fn queue(&self, name: &str) -> Option<&QueueInfo> {
        self.queues.get(name)
    }

    /// Every queue.
    pub fn queues(&self) -> impl Iterator<Item = &QueueInfo> {
        self.queues.values()
    }

    /// An exchange by name.
    pub fn exchange(&self, name: &str) -> Option<&Exchange> {
        self.exchanges.get(name).map(|e| &**e)
    }

    /// Every exchange with its name.
    pub fn exchanges(&self) -> impl Iterator<Item = (&str, &Exchange)> {
        self.exchanges.iter().map(|(n, e)| (&**n, &**e))
    }

    /// Appends the queues a publish to `exchange` with `key` reaches; false
    /// when the exchange does not exist.
    pub fn route(&self, exchange: &str, key: &str, out: &mut Vec<Target>) -> bool {
        match self.exchanges.get(exchange) {
            Some(ex) => {
                ex.route(key, out);
                true
            }
            None => false,
        }
    }
}

/// Why a topology change was refused; `Display` is the text after `Error: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// `declare_exchange` again with another type.
    #[error("exchange {name} exists with type {existing}")]
    KindMismatch {
        /// Exchange name.
        name: String,
        /// Its current type.
        existing: ExchangeKind,
    },
    /// `bind` to a queue that was never declared.
    #[error("unknown queue {0}")]
    UnknownQueue(String),
    /// `bind` to an exchange that was never declared.
    #[error("unknown exchange {0}")]
    UnknownExchange(String),
    /// `topology.json` could not be written or read.
    #[error("storage: {0}")]
    Storage(String),
}

/// The single writer of the topology, shared by every shard.
#[derive(Debug)]
pub struct TopologyStore {
    shards: usize,
    /// `topology.json`, rewritten atomically on every change; `None` in memory.
    persist: Option<PathBuf>,
    writer: Mutex<()>,
    current: RwLock<Arc<Topology>>,
    version: AtomicU64,
}

impl TopologyStore {
    /// An empty topology for a broker of `shards` shards.
    pub fn new(shards: usize) -> TopologyStore {
        TopologyStore {
            shards: shards.max(1),
            persist: None,
            writer: Mutex::new(()),
            current: RwLock::new(Arc::new(Topology::default())),
            version: AtomicU64::new(0),
        }
    }

    /// The number of shards queues are placed over.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The current version; compare with a cached snapshot's.
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Topology> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Applies `change` to a copy of the topology and publishes it if it
    /// changed anything.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Topology) -> Result<(T, bool), TopologyError>,
    ) -> Result<T, TopologyError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = (*self.snapshot()).clone();
        let (value, changed) = change(&mut next)?;
        if changed {
            next.version += 1;
            let version = next.version;
            let saved = match &self.persist {
                // Rare and small: written in place, before anyone sees it.
                Some(path) => save(path, &next)
                    .map_err(|e| TopologyError::Storage(format!("{}: {e}", path.display()))),
                None => Ok(()),
            };
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
            self.version.store(version, Ordering::Release);
            saved?;
        }
        Ok(value)
    }

    /// Opens the topology saved at `path` (empty if the file does not exist)
    /// and keeps saving there. Queue placement is recomputed for `shards`, so
    /// a changed shard count moves queues with their owners.
    pub fn open(path: PathBuf, shards: usize) -> Result<TopologyStore, TopologyError> {
        let mut store = TopologyStore::new(shards);
        let shards = store.shards;
        match std::fs::read(&path) {
            Ok(bytes) => {
                let saved: SavedTopology = serde_json::from_slice(&bytes).map_err(|e| {
                    TopologyError::Storage(format!("{}: unreadable: {e}", path.display()))
                })?;
                let mut t = Topology {
                    version: 1,
                    ..Topology::default()
                };
                for q in saved.queues {
                    let info = QueueInfo {
                        name: Arc::from(q.name.as_str()),
                        owner: Arc::from(q.owner.as_str()),
                        shard: shard_of(&q.owner, shards),
                    };
                    t.queues.insert(info.name.clone(), info);
                }
                for e in saved.exchanges {
                    let kind = ExchangeKind::parse(&e.kind).ok_or_else(|| {
                        TopologyError::Storage(format!(
                            "{}: exchange {} has unknown type {}",
                            path.display(),
                            e.name,
                            e.kind
                        ))
                    })?;
                    let mut ex = Exchange::new(kind);
                    for b in e.bindings {
                        if let Some(info) = t.queues.get(b.queue.as_str()) {
                            ex.bind(
                                &b.key,
                                Target {
                                    queue: info.name.clone(),
                                    shard: info.shard,
                                },
                            );
                        }
                    }
                    t.exchanges.insert(Arc::from(e.name.as_str()), Arc::new(ex));
                }
                store.version.store(1, Ordering::Release);
                store.current = RwLock::new(Arc::new(t));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(TopologyError::Storage(format!("{}: {e}", path.display()))),
        }
        store.persist = Some(path);
        Ok(store)
    }

    /// Declares a queue owned by `owner` (idempotent); returns its placement.
    pub fn declare_queue(&self, name: &str, owner: &str) -> Result<QueueInfo, TopologyError> {
        let shards = self.shards;
        self.change(|t| {
            if let Some(existing) = t.queues.get(name) {
                return Ok((existing.clone(), false));
            }
            let info = QueueInfo {
                name: Arc::from(name),
                owner: Arc::from(owner),
                shard: shard_of(owner, shards),
            };
            t.queues.insert(info.name.clone(), info.clone());
            Ok((info, true))
        })
    }

    /// Declares an exchange; the same type again is a no-op, another is an error.
    pub fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<(), TopologyError> {
        self.change(|t| match t.exchanges.get(name) {
            Some(ex) if ex.kind() == kind => Ok(((), false)),
            Some(ex) => Err(TopologyError::KindMismatch {
                name: name.into(),
                existing: ex.kind(),
            }),
            None => {
                t.exchanges
                    .insert(Arc::from(name), Arc::new(Exchange::new(kind)));
                Ok(((), true))
            }
        })
    }

    /// Binds a queue to an exchange with a key (idempotent).
    pub fn bind(&self, queue: &str, exchange: &str, key: &str) -> Result<(), TopologyError> {
        self.change(|t| {
            let info = t
                .queues
                .get(queue)
                .ok_or_else(|| TopologyError::UnknownQueue(queue.into()))?
                .clone();
            let ex = t
                .exchanges
                .get_mut(exchange)
                .ok_or_else(|| TopologyError::UnknownExchange(exchange.into()))?;
            let target = Target {
                queue: info.name,
                shard: info.shard,
            };
            if ex
                .bindings()
                .any(|(k, t)| k == key && t.queue == target.queue)
            {
                return Ok(((), false));
            }
            Arc::make_mut(ex).bind(key, target);
            Ok(((), true))
        })
    }
}

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

/// The saved form of the topology.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedTopology {
    queues: Vec<SavedQueue>,
    exchanges: Vec<SavedExchange>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedQueue {
    name: String,
    owner: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedExchange {
    name: String,
    kind: String,
    bindings: Vec<SavedBinding>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedBinding {
    queue: String,
    key: String,
}

/// Writes `t` to `path` atomically: temp file, fsync, rename, directory fsync.
fn save(path: &Path, t: &Topology) -> std::io::Result<()> {
    use std::io::Write;
    let mut queues: Vec<SavedQueue> = t
        .queues
        .values()
        .map(|q| SavedQueue {
            name: q.name.to_string(),
            owner: q.owner.to_string(),
        })
        .collect();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    let mut exchanges: Vec<SavedExchange> = t
        .exchanges
        .iter()
        .map(|(name, ex)| SavedExchange {
            name: name.to_string(),
            kind: ex.kind().as_str().to_owned(),
            bindings: ex
                .bindings()
                .map(|(k, t)| SavedBinding {
                    queue: t.queue.to_string(),
                    key: k.to_owned(),
                })
                .collect(),
        })
        .collect();
    exchanges.sort_by(|a, b| a.name.cmp(&b.name));
    let bytes = serde_json::to_vec_pretty(&SavedTopology { queues, exchanges })
        .map_err(std::io::Error::other)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(".topology.json.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declares_are_idempotent_and_placed_by_owner() {
        let store = TopologyStore::new(4);
        let a = store
            .declare_queue("receiver_1_queue", "receiver_1")
            .unwrap();
        let b = store.declare_queue("receiver_1_queue", "admin").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.shard, shard_of("receiver_1", 4));
        assert_eq!(store.version(), 1);
    }

    #[test]
    fn survives_a_reopen_with_another_shard_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        {
            let store = TopologyStore::open(path.clone(), 2).unwrap();
            store
                .declare_queue("receiver_1_queue", "receiver_1")
                .unwrap();
            store.declare_exchange("ex", ExchangeKind::Topic).unwrap();
            store
                .bind("receiver_1_queue", "ex", "receiver_1.#")
                .unwrap();
        }
        let store = TopologyStore::open(path, 3).unwrap();
        let t = store.snapshot();
        assert_eq!(
            t.queue("receiver_1_queue").unwrap().shard,
            shard_of("receiver_1", 3)
        );
        let mut out = Vec::new();
        assert!(t.route("ex", "receiver_1.a.b", &mut out));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shard, shard_of("receiver_1", 3));
    }

    #[test]
    fn exchange_kind_conflicts_are_errors() {
        let store = TopologyStore::new(1);
        store.declare_exchange("ex", ExchangeKind::Topic).unwrap();
        store.declare_exchange("ex", ExchangeKind::Topic).unwrap();
        assert_eq!(
            store
                .declare_exchange("ex", ExchangeKind::Direct)
                .unwrap_err()
                .to_string(),
            "exchange ex exists with type topic"
        );
    }

    #[test]
    fn bind_needs_queue_and_exchange_and_is_seen_by_views() {
        let store = Arc::new(TopologyStore::new(2));
        let mut view = TopologyView::new(store.clone());
        assert_eq!(
            store.bind("q", "ex", "k"),
            Err(TopologyError::UnknownQueue("q".into()))
        );
        store.declare_queue("q", "receiver_1").unwrap();
        assert_eq!(
            store.bind("q", "ex", "k"),
            Err(TopologyError::UnknownExchange("ex".into()))
        );
        store.declare_exchange("ex", ExchangeKind::Direct).unwrap();
        store.bind("q", "ex", "k").unwrap();
        let mut out = Vec::new();
        assert!(view.current().route("ex", "k", &mut out));
        assert_eq!(&*out[0].queue, "q");
        assert!(!view.current().route("nope", "k", &mut out));
    }
}
