//! Exchanges, queues and bindings.
//!
//! Topology changes are rare, so they go through one writer (a mutex held only
//! for the change itself) that publishes a new immutable [`Topology`] snapshot.
//! Shards route against their cached snapshot and notice a new one with a
//! single atomic load per publish. The snapshot is published before the
//! declaring command is answered, so a publish sent after `OK bind …` sees
//! the binding on every shard.
//!
//! With `topology.json`, clients' changes go through [`TopologyStore::submit`]:
//! a saver thread applies them, writes the file (one fsync for everything
//! that queued up meanwhile), and only then publishes the snapshot and
//! answers, so no shard waits on the disk and nothing routes through a
//! binding a crash could forget.
//!
//! Each save keeps the version it replaces as `topology.json.prev`, so a
//! damaged or lost `topology.json` costs at most the last change, not every
//! queue: [`TopologyStore::open`] falls back to it and says so.

pub mod data_dir;

pub use data_dir::{DataDirLock, LockError, StorageWarning};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};

use ciphermq_proto::ExchangeKind;

use crate::pending::{Pending, Resolver};

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
    /// At start, neither `topology.json` nor its previous copy could be used:
    /// starting empty would silently drop every queue, so the start stops.
    #[error(
        "{}: {current}; {}: {previous}. Restore either file from a backup; or, to start \
         with an empty topology, move both out of the data directory (queue directories are \
         then adopted by the receiver CN that owns their name, and the start stops on any \
         other)",
        .path.display(),
        .prev_path.display()
    )]
    NoUsableCopy {
        /// `topology.json`.
        path: PathBuf,
        /// What is wrong with it.
        current: String,
        /// `topology.json.prev`.
        prev_path: PathBuf,
        /// What is wrong with that one.
        previous: String,
    },
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
    /// Jobs for the saver thread, once started.
    saver: OnceLock<crossbeam_channel::Sender<SaveJob>>,
    /// The data directory's lock, held for as long as anything may write
    /// there: the store outlives every shard, so the lock does too.
    lock: Option<DataDirLock>,
}

/// A change a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologyChange {
    /// `declare_queue`.
    DeclareQueue {
        /// Queue name.
        name: String,
        /// Its owner CN.
        owner: String,
    },
    /// `declare_exchange`.
    DeclareExchange {
        /// Exchange name.
        name: String,
        /// Its type.
        kind: ExchangeKind,
    },
    /// `bind`.
    Bind {
        /// Queue name.
        queue: String,
        /// Exchange name.
        exchange: String,
        /// Binding key.
        key: String,
    },
}

/// What a submitted change ends with.
pub type ChangeResult = Result<(), TopologyError>;

#[derive(Debug)]
struct SaveJob {
    change: TopologyChange,
    done: Resolver<ChangeResult>,
}

/// Changes the saver thread may have queued at once.
const SAVER_QUEUE: usize = 4096;

impl TopologyStore {
    /// An empty topology for a broker of `shards` shards.
    pub fn new(shards: usize) -> TopologyStore {
        TopologyStore {
            shards: shards.max(1),
            persist: None,
            writer: Mutex::new(()),
            current: RwLock::new(Arc::new(Topology::default())),
            version: AtomicU64::new(0),
            saver: OnceLock::new(),
            lock: None,
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

    /// Opens the topology saved at `path` (empty if neither it nor its
    /// previous copy exists) and keeps saving there. Queue placement is
    /// recomputed for `shards`, so a changed shard count moves queues with
    /// their owners.
    ///
    /// A missing or damaged `topology.json` is not fatal while
    /// `topology.json.prev` is good: the store starts from that copy, restores
    /// `topology.json` from it, keeps the damaged file as
    /// `topology.json.corrupt-<unix-ms>`, and returns a warning saying so
    /// (also logged). When neither can be used the start stops with
    /// [`TopologyError::NoUsableCopy`], naming both files.
    pub fn open(
        path: PathBuf,
        shards: usize,
    ) -> Result<(TopologyStore, Vec<StorageWarning>), TopologyError> {
        let mut store = TopologyStore::new(shards);
        let shards = store.shards;
        let prev_path = prev_path(&path);
        let fatal =
            |p: &Path, e: std::io::Error| TopologyError::Storage(format!("{}: {e}", p.display()));
        let no_usable = |current: String, previous: String| TopologyError::NoUsableCopy {
            path: path.clone(),
            current,
            prev_path: prev_path.clone(),
            previous,
        };
        let mut warnings = Vec::new();
        // What a crash during a save may have left; never read.
        data_dir::remove_temporaries(&path);
        data_dir::remove_temporaries(&prev_path);
        let loaded = match load(&path, shards) {
            Ok(Some((t, _))) => Some(t),
            Ok(None) => match load(&prev_path, shards) {
                Ok(None) => None,
                Ok(Some((t, bytes))) => {
                    data_dir::write_atomic(&path, &bytes, data_dir::PUBLIC_MODE)
                        .map_err(|e| fatal(&path, e))?;
                    warnings.push(StorageWarning::new(
                        &path,
                        format!(
                            "was missing; started from {} and restored it from there (the last \
                             topology change saved before the file was lost may be missing: \
                             declare it again)",
                            prev_path.display()
                        ),
                    ));
                    Some(t)
                }
                Err(Load::Damaged(why)) => {
                    return Err(no_usable("missing".into(), format!("unusable: {why}")))
                }
                Err(Load::Io(e)) => return Err(fatal(&prev_path, e)),
            },
            Err(Load::Damaged(why)) => match load(&prev_path, shards) {
                Ok(Some((t, bytes))) => {
                    let aside = data_dir::move_aside(&path).map_err(|e| fatal(&path, e))?;
                    data_dir::write_atomic(&path, &bytes, data_dir::PUBLIC_MODE)
                        .map_err(|e| fatal(&path, e))?;
                    warnings.push(StorageWarning::new(
                        &path,
                        format!(
                            "unusable ({why}); kept as {} and started from {} (the last \
                             topology change saved before the damage may be missing: declare \
                             it again)",
                            aside.display(),
                            prev_path.display()
                        ),
                    ));
                    Some(t)
                }
                Ok(None) => return Err(no_usable(format!("unusable: {why}"), "missing".into())),
                Err(Load::Damaged(prev_why)) => {
                    return Err(no_usable(
                        format!("unusable: {why}"),
                        format!("unusable: {prev_why}"),
                    ))
                }
                Err(Load::Io(e)) => return Err(fatal(&prev_path, e)),
            },
            Err(Load::Io(e)) => return Err(fatal(&path, e)),
        };
        if let Some(t) = loaded {
            store.version.store(t.version, Ordering::Release);
            store.current = RwLock::new(Arc::new(t));
        }
        for w in &warnings {
            tracing::warn!(path = %w.path.display(), "{}", w.message);
        }
        store.persist = Some(path);
        Ok((store, warnings))
    }

    /// Keeps the data directory's lock for as long as this store lives. The
    /// store is the one piece of a broker's storage that every shard holds
    /// until the last one stops, so that is how long the directory stays
    /// locked.
    pub fn hold_lock(&mut self, lock: DataDirLock) {
        self.lock = Some(lock);
    }

    /// Starts the thread that saves clients' changes, when the topology is
    /// kept in a file. It ends when the store is dropped.
    pub fn start_saver(self: &Arc<Self>) -> std::io::Result<()> {
        if self.persist.is_none() || self.saver.get().is_some() {
            return Ok(());
        }
        let (tx, rx) = crossbeam_channel::bounded::<SaveJob>(SAVER_QUEUE);
        let store: Weak<TopologyStore> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ciphermq-topology".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let Some(store) = store.upgrade() else { return };
                    let mut jobs = vec![first];
                    jobs.extend(rx.try_iter());
                    store.apply_saved(jobs);
                }
            })?;
        let _ = self.saver.set(tx);
        Ok(())
    }

    /// Applies `change`. With a saver thread the result resolves once the
    /// change is on disk and visible to every shard (or was refused); without
    /// one it is applied at once. Never blocks on I/O.
    pub fn submit(&self, change: TopologyChange) -> Pending<ChangeResult> {
        let Some(saver) = self.saver.get() else {
            return Pending::ready(self.apply_now(&change));
        };
        let (pending, done) = crate::pending::pending();
        if let Err(e) = saver.try_send(SaveJob { change, done }) {
            let job = e.into_inner();
            job.done.resolve(Err(TopologyError::Storage(
                "topology writer busy or stopped; retry".into(),
            )));
        }
        pending
    }

    fn apply_now(&self, change: &TopologyChange) -> ChangeResult {
        match change {
            TopologyChange::DeclareQueue { name, owner } => {
                self.declare_queue(name, owner).map(|_| ())
            }
            TopologyChange::DeclareExchange { name, kind } => self.declare_exchange(name, *kind),
            TopologyChange::Bind {
                queue,
                exchange,
                key,
            } => self.bind(queue, exchange, key),
        }
    }

    /// The saver thread's step: apply a batch of changes to a copy, save it
    /// once, and only then publish it and answer.
    fn apply_saved(&self, jobs: Vec<SaveJob>) {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = (*self.snapshot()).clone();
        let mut results = Vec::with_capacity(jobs.len());
        let mut any = false;
        for job in &jobs {
            let outcome = apply_change(&mut next, &job.change, self.shards);
            any |= matches!(outcome, Ok(true));
            results.push(outcome);
        }
        if any {
            next.version += 1;
            let version = next.version;
            let saved = match &self.persist {
                Some(path) => save(path, &next)
                    .map_err(|e| TopologyError::Storage(format!("{}: {e}", path.display()))),
                None => Ok(()),
            };
            if let Err(e) = saved {
                // Nothing of this batch is published: every change in it
                // that would have changed something is refused.
                tracing::error!(error = %e, "topology not saved; changes refused");
                for (job, outcome) in jobs.into_iter().zip(results) {
                    job.done.resolve(match outcome {
                        Ok(true) => Err(e.clone()),
                        other => other.map(|_| ()),
                    });
                }
                return;
            }
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
            self.version.store(version, Ordering::Release);
        }
        for (job, outcome) in jobs.into_iter().zip(results) {
            job.done.resolve(outcome.map(|_| ()));
        }
    }

    /// Declares a queue owned by `owner` (idempotent); returns its placement.
    ///
    /// Saves synchronously on the calling thread: for the broker's own rare
    /// declares (dead-letter queues); clients' changes use [`Self::submit`].
    pub fn declare_queue(&self, name: &str, owner: &str) -> Result<QueueInfo, TopologyError> {
        let change = TopologyChange::DeclareQueue {
            name: name.to_owned(),
            owner: owner.to_owned(),
        };
        self.change(|t| {
            let changed = apply_change(t, &change, self.shards)?;
            let info = t
                .queues
                .get(name)
                .cloned()
                .ok_or_else(|| TopologyError::UnknownQueue(name.into()))?;
            Ok((info, changed))
        })
    }

    /// Declares an exchange; the same type again is a no-op, another is an error.
    pub fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<(), TopologyError> {
        let change = TopologyChange::DeclareExchange {
            name: name.to_owned(),
            kind,
        };
        self.change(|t| Ok(((), apply_change(t, &change, self.shards)?)))
    }

    /// Binds a queue to an exchange with a key (idempotent).
    pub fn bind(&self, queue: &str, exchange: &str, key: &str) -> Result<(), TopologyError> {
        let change = TopologyChange::Bind {
            queue: queue.to_owned(),
            exchange: exchange.to_owned(),
            key: key.to_owned(),
        };
        self.change(|t| Ok(((), apply_change(t, &change, self.shards)?)))
    }
}

/// Applies one change to `t`; `Ok(true)` when it changed something.
fn apply_change(
    t: &mut Topology,
    change: &TopologyChange,
    shards: usize,
) -> Result<bool, TopologyError> {
    match change {
        TopologyChange::DeclareQueue { name, owner } => {
            if t.queues.contains_key(name.as_str()) {
                return Ok(false);
            }
            let info = QueueInfo {
                name: Arc::from(name.as_str()),
                owner: Arc::from(owner.as_str()),
                shard: shard_of(owner, shards),
            };
            t.queues.insert(info.name.clone(), info);
            Ok(true)
        }
        TopologyChange::DeclareExchange { name, kind } => match t.exchanges.get(name.as_str()) {
            Some(ex) if ex.kind() == *kind => Ok(false),
            Some(ex) => Err(TopologyError::KindMismatch {
                name: name.clone(),
                existing: ex.kind(),
            }),
            None => {
                t.exchanges
                    .insert(Arc::from(name.as_str()), Arc::new(Exchange::new(*kind)));
                Ok(true)
            }
        },
        TopologyChange::Bind {
            queue,
            exchange,
            key,
        } => {
            let info = t
                .queues
                .get(queue.as_str())
                .ok_or_else(|| TopologyError::UnknownQueue(queue.clone()))?
                .clone();
            let ex = t
                .exchanges
                .get_mut(exchange.as_str())
                .ok_or_else(|| TopologyError::UnknownExchange(exchange.clone()))?;
            let target = Target {
                queue: info.name,
                shard: info.shard,
            };
            if ex
                .bindings()
                .any(|(k, t)| k == key && t.queue == target.queue)
            {
                return Ok(false);
            }
            Arc::make_mut(ex).bind(key, target);
            Ok(true)
        }
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

/// `topology.json.prev`, beside `path`.
fn prev_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".prev");
    PathBuf::from(name)
}

/// Why a saved topology could not be loaded.
enum Load {
    /// The file could not be read (permissions, I/O): not something to work
    /// around by starting from another copy.
    Io(std::io::Error),
    /// The file was read but is not a topology this broker wrote.
    Damaged(String),
}

/// Reads and validates the topology at `path`: `None` when there is no file,
/// else the topology with the bytes it came from.
fn load(path: &Path, shards: usize) -> Result<Option<(Topology, Vec<u8>)>, Load> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Load::Io(e)),
    };
    let saved: SavedTopology = serde_json::from_slice(&bytes)
        .map_err(|e| Load::Damaged(format!("not a saved topology: {e}")))?;
    let t = validate(saved, shards).map_err(Load::Damaged)?;
    Ok(Some((t, bytes)))
}

/// Whether `name` can be a queue's directory under `queues/`: one plain path
/// component, so a damaged file cannot point recovery outside the data
/// directory.
fn is_queue_dir_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Builds the topology a saved file describes, refusing what the broker
/// never writes (a name that is not a plain file name, an empty owner, a
/// name twice, an unknown exchange type).
fn validate(saved: SavedTopology, shards: usize) -> Result<Topology, String> {
    let mut t = Topology {
        version: 1,
        ..Topology::default()
    };
    for q in saved.queues {
        if !is_queue_dir_name(&q.name) {
            return Err(format!("queue name {:?} is not a valid name", q.name));
        }
        if q.owner.is_empty() {
            return Err(format!("queue {} has no owner", q.name));
        }
        let info = QueueInfo {
            name: Arc::from(q.name.as_str()),
            owner: Arc::from(q.owner.as_str()),
            shard: shard_of(&q.owner, shards),
        };
        if t.queues.insert(info.name.clone(), info).is_some() {
            return Err(format!("queue {} is listed twice", q.name));
        }
    }
    for e in saved.exchanges {
        if e.name.is_empty() {
            return Err("an exchange has an empty name".into());
        }
        let kind = ExchangeKind::parse(&e.kind)
            .ok_or_else(|| format!("exchange {} has unknown type {}", e.name, e.kind))?;
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
        if t.exchanges
            .insert(Arc::from(e.name.as_str()), Arc::new(ex))
            .is_some()
        {
            return Err(format!("exchange {} is listed twice", e.name));
        }
    }
    Ok(t)
}

/// Writes `t` to `path` atomically (see [`data_dir::write_atomic`]), first
/// keeping the version it replaces as `topology.json.prev`.
///
/// The previous version is kept by a hard link, so it costs no copy: it is
/// the file this store last wrote durably (or validated at open). The link
/// is renamed into place before the new file is, and the directory fsync
/// that makes the new file durable covers both renames; whatever a crash
/// keeps, both names hold a good topology.
fn save(path: &Path, t: &Topology) -> std::io::Result<()> {
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
    keep_previous(path)?;
    data_dir::write_atomic(path, &bytes, data_dir::PUBLIC_MODE)
}

/// Makes `topology.json.prev` the current `topology.json` (if there is one):
/// a hard link under a temporary name, renamed over the old `.prev`. Where
/// the file system has no hard links, a copy written atomically instead.
fn keep_previous(path: &Path) -> std::io::Result<()> {
    let prev = prev_path(path);
    let dir = data_dir::parent_dir(path);
    let tmp = dir.join(".topology.json.prev.tmp");
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match std::fs::hard_link(path, &tmp) {
        Ok(()) => std::fs::rename(&tmp, &prev),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => match std::fs::read(path) {
            Ok(bytes) => data_dir::write_atomic(&prev, &bytes, data_dir::PUBLIC_MODE),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        },
    }
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

    fn wait<T>(mut p: Pending<T>) -> T {
        for _ in 0..2000 {
            if let Some(v) = p.try_take() {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("the saver never answered");
    }

    #[test]
    fn submitted_changes_are_saved_off_the_caller_then_visible() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        let store = Arc::new(TopologyStore::open(path.clone(), 1).unwrap().0);
        store.start_saver().unwrap();
        let q = TopologyChange::DeclareQueue {
            name: "q".into(),
            owner: "r".into(),
        };
        let ex = TopologyChange::DeclareExchange {
            name: "ex".into(),
            kind: ExchangeKind::Direct,
        };
        let bind = TopologyChange::Bind {
            queue: "q".into(),
            exchange: "ex".into(),
            key: "k".into(),
        };
        let (a, b, c) = (store.submit(q), store.submit(ex), store.submit(bind));
        assert_eq!((wait(a), wait(b), wait(c)), (Ok(()), Ok(()), Ok(())));
        let mut out = Vec::new();
        assert!(store.snapshot().route("ex", "k", &mut out) && out.len() == 1);
        let saved = std::fs::read_to_string(&path).unwrap();
        assert!(
            saved.contains("\"q\"") && saved.contains("\"k\""),
            "{saved}"
        );
        let unknown = TopologyChange::Bind {
            queue: "nope".into(),
            exchange: "ex".into(),
            key: "k".into(),
        };
        assert_eq!(
            wait(store.submit(unknown)),
            Err(TopologyError::UnknownQueue("nope".into()))
        );
    }

    #[test]
    fn survives_a_reopen_with_another_shard_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        {
            let store = TopologyStore::open(path.clone(), 2).unwrap().0;
            store
                .declare_queue("receiver_1_queue", "receiver_1")
                .unwrap();
            store.declare_exchange("ex", ExchangeKind::Topic).unwrap();
            store
                .bind("receiver_1_queue", "ex", "receiver_1.#")
                .unwrap();
        }
        let (store, warnings) = TopologyStore::open(path, 3).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
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

    /// A store at `dir/topology.json` with two saves: queue `q1`, then `q2`.
    fn two_saves(dir: &Path) -> PathBuf {
        let path = dir.join("topology.json");
        let (store, _) = TopologyStore::open(path.clone(), 1).unwrap();
        store.declare_queue("q1", "r").unwrap();
        store.declare_queue("q2", "r").unwrap();
        path
    }

    fn queue_names(store: &TopologyStore) -> Vec<String> {
        let mut names: Vec<String> = store
            .snapshot()
            .queues()
            .map(|q| q.name.to_string())
            .collect();
        names.sort();
        names
    }

    fn corrupt_copies(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("topology.json.corrupt-"))
            .collect()
    }

    #[test]
    fn each_save_keeps_the_version_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let current = std::fs::read_to_string(&path).unwrap();
        let prev = std::fs::read_to_string(prev_path(&path)).unwrap();
        assert!(current.contains("\"q2\""), "{current}");
        assert!(
            prev.contains("\"q1\"") && !prev.contains("\"q2\""),
            "{prev}"
        );
        // No temporary name is left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["topology.json", "topology.json.prev"]);
    }

    #[test]
    fn a_damaged_file_falls_back_to_the_previous_copy_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        std::fs::write(&path, b"{\"queues\": [{\"name\": \"q1\"").unwrap();
        let (store, warnings) = TopologyStore::open(path.clone(), 1).unwrap();
        assert_eq!(queue_names(&store), ["q1"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].path, path);
        assert!(
            warnings[0].message.contains("topology.json.prev"),
            "{}",
            warnings[0]
        );
        let aside = corrupt_copies(dir.path());
        assert_eq!(aside.len(), 1);
        assert!(warnings[0].message.contains(&*aside[0].to_string_lossy()));
        assert_eq!(
            std::fs::read(&aside[0]).unwrap(),
            b"{\"queues\": [{\"name\": \"q1\""
        );
        // topology.json is good again: the next open has nothing to say.
        drop(store);
        let (store, warnings) = TopologyStore::open(path, 1).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(queue_names(&store), ["q1"]);
    }

    #[test]
    fn a_missing_file_is_restored_from_the_previous_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        std::fs::remove_file(&path).unwrap();
        let (store, warnings) = TopologyStore::open(path.clone(), 1).unwrap();
        assert_eq!(queue_names(&store), ["q1"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].message.contains("missing"), "{}", warnings[0]);
        assert!(path.exists());
    }

    #[test]
    fn a_name_that_would_leave_the_queues_directory_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let bad = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"q2\"", "\"..\"");
        std::fs::write(&path, bad).unwrap();
        let (store, warnings) = TopologyStore::open(path, 1).unwrap();
        assert_eq!(queue_names(&store), ["q1"]);
        assert!(
            warnings[0].message.contains("not a valid name"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn with_no_usable_copy_the_start_stops_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        std::fs::write(&path, b"garbage").unwrap();
        std::fs::write(prev_path(&path), b"{}").unwrap();
        let err = TopologyStore::open(path.clone(), 1).unwrap_err();
        assert!(matches!(err, TopologyError::NoUsableCopy { .. }), "{err:?}");
        let shown = err.to_string();
        assert!(
            shown.contains(&*path.to_string_lossy())
                && shown.contains(&*prev_path(&path).to_string_lossy())
                && shown.contains("Restore"),
            "{shown}"
        );
        // Nothing was moved or rewritten.
        assert_eq!(std::fs::read(&path).unwrap(), b"garbage");
        assert!(corrupt_copies(dir.path()).is_empty());
        // A missing file and a damaged copy stop the start too.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            TopologyStore::open(path, 1),
            Err(TopologyError::NoUsableCopy { .. })
        ));
    }

    #[test]
    fn nothing_saved_is_an_empty_topology_without_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let (store, warnings) = TopologyStore::open(dir.path().join("topology.json"), 1).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(store.snapshot().queues().count(), 0);
    }
}
