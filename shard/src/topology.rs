//! Exchanges, queues and bindings.
//!
//! Topology changes are rare, so they go through one writer (a mutex held only
//! for the in-memory change itself, never across I/O) that publishes a new
//! immutable [`Topology`] snapshot. Shards route against their cached
//! snapshot and notice a new one with a single atomic load per publish. The
//! snapshot is published before the declaring command is answered, so a
//! publish sent after `OK bind …` sees the binding on every shard.
//!
//! This module does no file I/O. Where the topology is kept between runs is
//! the broker's business: it loads a [`Topology`] (built with
//! [`Topology::apply`]) and hands [`TopologyStore::persisted`] a
//! [`TopologySink`] that writes a whole topology. The store runs a saver
//! thread that calls it:
//!
//! - clients' changes go through [`TopologyStore::submit`]: the saver applies
//!   them to a copy, has the sink save it (one save for everything that
//!   queued up meanwhile), and only then publishes the snapshot and answers,
//!   so no shard waits on the disk and nothing routes through a binding a
//!   crash could forget;
//! - the broker's own declarations ([`TopologyStore::declare_queue`]: a
//!   dead-letter queue declared on a shard) are applied and published at
//!   once, so the caller can use them in the same call, and the saver is only
//!   asked to save (never waited for). Until that save, a crash forgets the
//!   declaration; the broker's start-up adopts what it left on disk.
//!
//! Every save writes the whole topology, so one successful save covers every
//! change before it: a save request lost to a full queue, or a failed save
//! (retried with backoff), is made good by the next one.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use ciphermq_proto::ExchangeKind;
use crossbeam_channel::RecvTimeoutError;

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

/// An immutable view of the topology once a store publishes it; a plain
/// value while it is being built (loaded from a file, queues adopted).
#[derive(Debug, Clone)]
pub struct Topology {
    version: u64,
    /// Queues are placed over this many shards.
    shards: usize,
    queues: HashMap<Arc<str>, QueueInfo>,
    exchanges: HashMap<Arc<str>, Arc<Exchange>>,
}

impl Topology {
    /// Nothing declared yet, for a broker of `shards` shards: where loading a
    /// saved topology starts. Placement is computed from each owner when a
    /// queue is added, so a changed shard count between runs moves queues
    /// with their owners.
    pub fn empty(shards: usize) -> Topology {
        Topology {
            version: 0,
            shards: shards.max(1),
            queues: HashMap::new(),
            exchanges: HashMap::new(),
        }
    }

    /// Bumped on every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The number of shards queues are placed over.
    pub fn shards(&self) -> usize {
        self.shards
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

    /// Applies `change` to this value; `Ok(true)` when it changed something
    /// (the version is then bumped). The same rules as a client's change:
    /// declares are idempotent (the first owner stays), a bind needs its
    /// queue and exchange.
    ///
    /// For building a topology before a store holds it: loading a saved one,
    /// adopting queue directories at start. Once a store holds it, changes go
    /// through the store, which publishes them.
    pub fn apply(&mut self, change: &TopologyChange) -> Result<bool, TopologyError> {
        let changed = self.apply_change(change)?;
        if changed {
            self.version += 1;
        }
        Ok(changed)
    }

    /// [`Self::apply`] without the version bump: a store bumps it once per
    /// published snapshot.
    fn apply_change(&mut self, change: &TopologyChange) -> Result<bool, TopologyError> {
        match change {
            TopologyChange::DeclareQueue { name, owner } => {
                if self.queues.contains_key(name.as_str()) {
                    return Ok(false);
                }
                let info = QueueInfo {
                    name: Arc::from(name.as_str()),
                    owner: Arc::from(owner.as_str()),
                    shard: shard_of(owner, self.shards),
                };
                self.queues.insert(info.name.clone(), info);
                Ok(true)
            }
            TopologyChange::DeclareExchange { name, kind } => {
                match self.exchanges.get(name.as_str()) {
                    Some(ex) if ex.kind() == *kind => Ok(false),
                    Some(ex) => Err(TopologyError::KindMismatch {
                        name: name.clone(),
                        existing: ex.kind(),
                    }),
                    None => {
                        self.exchanges
                            .insert(Arc::from(name.as_str()), Arc::new(Exchange::new(*kind)));
                        Ok(true)
                    }
                }
            }
            TopologyChange::Bind {
                queue,
                exchange,
                key,
            } => {
                let info = self
                    .queues
                    .get(queue.as_str())
                    .ok_or_else(|| TopologyError::UnknownQueue(queue.clone()))?
                    .clone();
                let ex = self
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
    /// The change could not be saved (the sink failed, or the saver thread is
    /// busy or gone): it was not applied, and the client may retry.
    #[error("storage: {0}")]
    Storage(String),
}

/// Where a store keeps its topology between runs (the broker's
/// `topology.json`). Called only on the store's saver thread, never on a
/// shard, with the whole topology each time: one successful save covers
/// every change before it.
///
/// The sink lives as long as the store, so a sink that holds a resource (the
/// data directory's lock) holds it for as long as anything may save.
/// Implemented for closures `Fn(&Topology) -> io::Result<()>`.
pub trait TopologySink: Send + Sync {
    /// Makes `topology` durable, replacing what was saved before; an error
    /// leaves the previous save in place.
    fn save(&self, topology: &Topology) -> std::io::Result<()>;
}

impl<F> TopologySink for F
where
    F: Fn(&Topology) -> std::io::Result<()> + Send + Sync,
{
    fn save(&self, topology: &Topology) -> std::io::Result<()> {
        self(topology)
    }
}

/// The single writer of the topology, shared by every shard.
pub struct TopologyStore {
    shards: usize,
    /// Where the topology is saved; `None` for a store in memory only.
    sink: Option<Box<dyn TopologySink>>,
    /// Held for in-memory changes only: never while the sink saves, so a
    /// shard declaring a dead-letter queue never waits on the disk.
    writer: Mutex<()>,
    current: RwLock<Arc<Topology>>,
    version: AtomicU64,
    /// The newest published version known to be saved by the sink: behind
    /// `version` while a change applied at once waits for its save.
    saved: AtomicU64,
    /// Jobs for the saver thread; set once, by [`Self::persisted`].
    saver: OnceLock<crossbeam_channel::Sender<SaveJob>>,
}

impl fmt::Debug for TopologyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopologyStore")
            .field("shards", &self.shards)
            .field("persisted", &self.sink.is_some())
            .field("version", &self.version())
            .field("saved", &self.saved.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
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

/// What the saver thread is asked to do.
#[derive(Debug)]
enum SaveJob {
    /// A client's change: apply, save, publish, then answer.
    Change {
        change: TopologyChange,
        done: Resolver<ChangeResult>,
    },
    /// Save what is already published (a change the broker applied at once).
    Save,
}

/// Changes the saver thread may have queued at once.
const SAVER_QUEUE: usize = 4096;

/// How long the saver waits before saving again after a failed save, at
/// first; doubled on each failure in a row, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(250);

/// The longest wait between retries of a failing save.
const RETRY_MAX: Duration = Duration::from_secs(30);

impl TopologyStore {
    /// An empty topology for a broker of `shards` shards, kept in memory
    /// only: every change is applied and answered at once.
    pub fn new(shards: usize) -> TopologyStore {
        TopologyStore::with(Topology::empty(shards), None)
    }

    fn with(loaded: Topology, sink: Option<Box<dyn TopologySink>>) -> TopologyStore {
        let version = loaded.version;
        TopologyStore {
            shards: loaded.shards,
            sink,
            writer: Mutex::new(()),
            current: RwLock::new(Arc::new(loaded)),
            version: AtomicU64::new(version),
            saved: AtomicU64::new(version),
            saver: OnceLock::new(),
        }
    }

    /// A store starting from `loaded` (what `sink` saved last, as the
    /// caller read it back) that saves every later change through `sink`,
    /// on a saver thread started here. The thread ends when the store is
    /// dropped; so does the sink, and whatever it holds.
    pub fn persisted(
        loaded: Topology,
        sink: impl TopologySink + 'static,
    ) -> std::io::Result<Arc<TopologyStore>> {
        let store = Arc::new(TopologyStore::with(loaded, Some(Box::new(sink))));
        let (tx, rx) = crossbeam_channel::bounded::<SaveJob>(SAVER_QUEUE);
        let weak: Weak<TopologyStore> = Arc::downgrade(&store);
        std::thread::Builder::new()
            .name("ciphermq-topology".into())
            .spawn(move || saver_loop(&weak, &rx))?;
        // Set once, here, before anyone else sees the store.
        let _ = store.saver.set(tx);
        Ok(store)
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

    /// Whether something published is not saved yet (a change applied at
    /// once whose save is still to come, or failed). Always false in memory.
    pub fn unsaved(&self) -> bool {
        self.sink.is_some() && self.saved.load(Ordering::Acquire) < self.version()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Topology> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn lock_writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `next` the current snapshot. Call with the writer lock held.
    fn publish(&self, next: Topology) {
        let version = next.version;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        self.version.store(version, Ordering::Release);
    }

    /// Applies `change` to a copy of the topology and publishes it at once if
    /// it changed anything; a persisted store's saver is then asked to save
    /// it, without waiting.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Topology) -> Result<(T, bool), TopologyError>,
    ) -> Result<T, TopologyError> {
        let _writer = self.lock_writer();
        let mut next = (*self.snapshot()).clone();
        let (value, changed) = change(&mut next)?;
        if changed {
            next.version += 1;
            self.publish(next);
            self.request_save();
        }
        Ok(value)
    }

    /// Asks the saver to save what is published. Never blocks: when its queue
    /// is full, the save that queue is waiting for covers this change too
    /// (every save writes the whole topology), and a failed save is retried.
    fn request_save(&self) {
        if let Some(saver) = self.saver.get() {
            let _ = saver.try_send(SaveJob::Save);
        }
    }

    /// Applies `change`. In a persisted store the result resolves once the
    /// change is saved and visible to every shard (or was refused); in
    /// memory it is applied at once. Never blocks on I/O.
    pub fn submit(&self, change: TopologyChange) -> Pending<ChangeResult> {
        let Some(saver) = self.saver.get() else {
            return Pending::ready(self.apply_now(&change));
        };
        let (pending, done) = crate::pending::pending();
        if let Err(e) = saver.try_send(SaveJob::Change { change, done }) {
            if let SaveJob::Change { done, .. } = e.into_inner() {
                done.resolve(Err(TopologyError::Storage(
                    "topology writer busy or stopped; retry".into(),
                )));
            }
        }
        pending
    }

    fn apply_now(&self, change: &TopologyChange) -> ChangeResult {
        self.change(|t| Ok(((), t.apply_change(change)?)))
    }

    /// The saver thread's step: apply a batch of clients' changes to a copy,
    /// save it once (also when only a change applied at once awaits its
    /// save), and only then publish and answer. Returns false when the save
    /// failed.
    ///
    /// The writer lock is held to build the copy and to publish it, never
    /// while the sink saves. Should the broker apply a change at once in
    /// between (a dead-letter queue), the batch is applied again on top of
    /// it before publishing, so neither is lost; what was saved then lacks
    /// that change, which stays unsaved and is saved next.
    fn save_batch(&self, jobs: Vec<SaveJob>) -> bool {
        let Some(sink) = &self.sink else {
            return true;
        };
        let changes: Vec<(TopologyChange, Resolver<ChangeResult>)> = jobs
            .into_iter()
            .filter_map(|job| match job {
                SaveJob::Change { change, done } => Some((change, done)),
                SaveJob::Save => None,
            })
            .collect();
        let (base, next, results, any) = {
            let _writer = self.lock_writer();
            let base = self.snapshot();
            let mut next = (*base).clone();
            let results: Vec<Result<bool, TopologyError>> = changes
                .iter()
                .map(|(change, _)| next.apply_change(change))
                .collect();
            let any = results.iter().any(|r| matches!(r, Ok(true)));
            if any {
                next.version += 1;
            }
            (base.version, next, results, any)
        };
        if !any && !self.unsaved() {
            answer(changes, results);
            return true;
        }
        if let Err(e) = sink.save(&next) {
            let e = TopologyError::Storage(e.to_string());
            // Nothing of this batch is published: every change in it that
            // would have changed something is refused.
            tracing::error!(error = %e, "topology not saved; changes refused");
            for ((_, done), outcome) in changes.into_iter().zip(results) {
                done.resolve(match outcome {
                    Ok(true) => Err(e.clone()),
                    other => other.map(|_| ()),
                });
            }
            return false;
        }
        let _writer = self.lock_writer();
        let current = self.snapshot();
        if current.version == base {
            let version = next.version;
            if any {
                self.publish(next);
            }
            self.saved.fetch_max(version, Ordering::AcqRel);
            answer(changes, results);
        } else {
            let mut rebased = (*current).clone();
            let results: Vec<Result<bool, TopologyError>> = changes
                .iter()
                .map(|(change, _)| rebased.apply_change(change))
                .collect();
            if results.iter().any(|r| matches!(r, Ok(true))) {
                rebased.version += 1;
                self.publish(rebased);
            }
            answer(changes, results);
        }
        true
    }

    /// Declares a queue owned by `owner` (idempotent); returns its placement.
    ///
    /// Applied and visible at once, so the caller can use the queue in the
    /// same call; a persisted store saves it on its saver thread afterwards,
    /// and this never waits for that (no file I/O on the caller's thread).
    /// Until the save, a crash forgets the declaration. For the broker's own
    /// rare declares (dead-letter queues); clients' changes use
    /// [`Self::submit`], which answers only once saved.
    pub fn declare_queue(&self, name: &str, owner: &str) -> Result<QueueInfo, TopologyError> {
        let change = TopologyChange::DeclareQueue {
            name: name.to_owned(),
            owner: owner.to_owned(),
        };
        self.change(|t| {
            let changed = t.apply_change(&change)?;
            let info = t
                .queues
                .get(name)
                .cloned()
                .ok_or_else(|| TopologyError::UnknownQueue(name.into()))?;
            Ok((info, changed))
        })
    }

    /// Declares an exchange; the same type again is a no-op, another is an
    /// error. Applied at once and saved afterwards, like
    /// [`Self::declare_queue`].
    pub fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<(), TopologyError> {
        self.apply_now(&TopologyChange::DeclareExchange {
            name: name.to_owned(),
            kind,
        })
    }

    /// Binds a queue to an exchange with a key (idempotent). Applied at once
    /// and saved afterwards, like [`Self::declare_queue`].
    pub fn bind(&self, queue: &str, exchange: &str, key: &str) -> Result<(), TopologyError> {
        self.apply_now(&TopologyChange::Bind {
            queue: queue.to_owned(),
            exchange: exchange.to_owned(),
            key: key.to_owned(),
        })
    }
}

/// Resolves each change with its outcome.
fn answer(
    changes: Vec<(TopologyChange, Resolver<ChangeResult>)>,
    results: Vec<Result<bool, TopologyError>>,
) {
    for ((_, done), outcome) in changes.into_iter().zip(results) {
        done.resolve(outcome.map(|_| ()));
    }
}

/// The saver thread: waits for jobs and saves them in batches; while
/// something published is unsaved it saves without waiting for a job, or,
/// after a failed save, once a growing pause has passed. Ends when the store
/// is gone.
fn saver_loop(store: &Weak<TopologyStore>, rx: &crossbeam_channel::Receiver<SaveJob>) {
    let mut retry: Option<Duration> = None;
    loop {
        // The store is not held while waiting, so dropping it ends the thread.
        let unsaved = match store.upgrade() {
            Some(store) => store.unsaved(),
            None => return,
        };
        let first = if unsaved {
            match rx.recv_timeout(retry.unwrap_or(Duration::ZERO)) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        };
        let Some(store) = store.upgrade() else { return };
        let mut jobs: Vec<SaveJob> = first.into_iter().collect();
        jobs.extend(rx.try_iter());
        retry = if store.save_batch(jobs) {
            None
        } else {
            Some(retry.map_or(RETRY_FIRST, |r| (r * 2).min(RETRY_MAX)))
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

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
        assert!(!store.unsaved(), "a store in memory has nothing to save");
    }

    fn wait<T>(mut p: Pending<T>) -> T {
        for _ in 0..2000 {
            if let Some(v) = p.try_take() {
                return v;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the saver never answered");
    }

    /// Waits until `done` holds, for at most ten seconds.
    fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn queue(name: &str, owner: &str) -> TopologyChange {
        TopologyChange::DeclareQueue {
            name: name.into(),
            owner: owner.into(),
        }
    }

    fn queue_names(t: &Topology) -> Vec<String> {
        let mut names: Vec<String> = t.queues().map(|q| q.name.to_string()).collect();
        names.sort();
        names
    }

    /// A sink that records what it saved and on which thread; it fails
    /// while `fail` is above zero (counting down), and waits while `gate`
    /// is closed.
    #[derive(Default)]
    struct Recorder {
        saved: Mutex<Vec<(Vec<String>, std::thread::ThreadId)>>,
        fail: AtomicUsize,
        gate: Mutex<bool>,
        opened: std::sync::Condvar,
        calls: AtomicUsize,
    }

    impl Recorder {
        fn close(&self) {
            *self.gate.lock().unwrap() = true;
        }

        fn open(&self) {
            *self.gate.lock().unwrap() = false;
            self.opened.notify_all();
        }

        fn last(&self) -> Option<Vec<String>> {
            self.saved.lock().unwrap().last().map(|(q, _)| q.clone())
        }
    }

    /// A persisted store over a [`Recorder`], starting from `loaded`.
    fn recorded(loaded: Topology) -> (Arc<TopologyStore>, Arc<Recorder>) {
        let rec = Arc::new(Recorder::default());
        let sink = rec.clone();
        let store = TopologyStore::persisted(loaded, move |t: &Topology| -> std::io::Result<()> {
            sink.calls.fetch_add(1, Ordering::SeqCst);
            let mut closed = sink.gate.lock().unwrap();
            while *closed {
                closed = sink.opened.wait(closed).unwrap();
            }
            drop(closed);
            if sink
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(std::io::Error::other("disk on fire"));
            }
            sink.saved
                .lock()
                .unwrap()
                .push((queue_names(t), std::thread::current().id()));
            Ok(())
        })
        .unwrap();
        (store, rec)
    }

    #[test]
    fn submitted_changes_are_saved_off_the_caller_then_visible() {
        let (store, rec) = recorded(Topology::empty(1));
        let ex = TopologyChange::DeclareExchange {
            name: "ex".into(),
            kind: ExchangeKind::Direct,
        };
        let bind = TopologyChange::Bind {
            queue: "q".into(),
            exchange: "ex".into(),
            key: "k".into(),
        };
        let (a, b, c) = (
            store.submit(queue("q", "r")),
            store.submit(ex),
            store.submit(bind),
        );
        assert_eq!((wait(a), wait(b), wait(c)), (Ok(()), Ok(()), Ok(())));
        let mut out = Vec::new();
        assert!(store.snapshot().route("ex", "k", &mut out) && out.len() == 1);
        let saved = rec.saved.lock().unwrap().clone();
        assert_eq!(saved.last().unwrap().0, ["q"]);
        assert!(saved
            .iter()
            .all(|(_, thread)| *thread != std::thread::current().id()));
        assert!(!store.unsaved());
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
    fn a_change_is_not_visible_before_it_is_saved() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.close();
        let mut pending = store.submit(queue("q", "r"));
        eventually("the saver is saving", || {
            rec.calls.load(Ordering::SeqCst) == 1
        });
        assert!(pending.try_take().is_none(), "answered before saved");
        assert!(
            store.snapshot().queue("q").is_none(),
            "visible before saved"
        );
        rec.open();
        assert_eq!(wait(pending), Ok(()));
        assert!(store.snapshot().queue("q").is_some());
    }

    #[test]
    fn a_failed_save_refuses_the_batch_and_publishes_nothing() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.fail.store(1, Ordering::SeqCst);
        let err = wait(store.submit(queue("q", "r"))).unwrap_err();
        assert_eq!(err, TopologyError::Storage("disk on fire".into()));
        assert!(store.snapshot().queue("q").is_none());
        assert!(!store.unsaved(), "nothing published is unsaved");
        // The disk is back: the same change is saved and answered.
        assert_eq!(wait(store.submit(queue("q", "r"))), Ok(()));
        assert_eq!(rec.last().unwrap(), ["q"]);
    }

    #[test]
    fn a_declare_applies_at_once_and_is_saved_later_by_the_saver() {
        let mut loaded = Topology::empty(2);
        loaded.apply(&queue("q", "r")).unwrap();
        let (store, rec) = recorded(loaded);
        let info = store.declare_queue("q.dlq", "r").unwrap();
        assert_eq!(info.shard, shard_of("r", 2));
        assert!(store.snapshot().queue("q.dlq").is_some());
        eventually("the declare is saved", || {
            rec.last().is_some_and(|q| q == ["q", "q.dlq"])
        });
        let saved = rec.saved.lock().unwrap().clone();
        assert!(saved
            .iter()
            .all(|(_, thread)| *thread != std::thread::current().id()));
        eventually("nothing is left unsaved", || !store.unsaved());
    }

    #[test]
    fn a_declare_never_waits_for_a_save_in_progress_and_neither_is_lost() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.close();
        let client = store.submit(queue("client_q", "r"));
        eventually("the saver is saving", || {
            rec.calls.load(Ordering::SeqCst) == 1
        });
        // The sink is stuck mid-save: a declare still returns at once and is
        // visible, since it takes no lock the save holds.
        let started = Instant::now();
        store.declare_queue("q.dlq", "r").unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(store.snapshot().queue("q.dlq").is_some());
        assert!(store.unsaved());
        rec.open();
        assert_eq!(wait(client), Ok(()));
        // Both are published, and a later save holds both.
        assert_eq!(queue_names(&store.snapshot()), ["client_q", "q.dlq"]);
        eventually("both are saved", || {
            rec.last().is_some_and(|q| q == ["client_q", "q.dlq"])
        });
        eventually("nothing is left unsaved", || !store.unsaved());
    }

    #[test]
    fn a_failed_save_of_a_declare_is_retried() {
        let (store, rec) = recorded(Topology::empty(1));
        rec.fail.store(2, Ordering::SeqCst);
        store.declare_queue("q.dlq", "r").unwrap();
        eventually("the declare is saved after two failures", || {
            rec.last().is_some_and(|q| q == ["q.dlq"])
        });
        assert!(rec.calls.load(Ordering::SeqCst) >= 3);
        eventually("nothing is left unsaved", || !store.unsaved());
    }

    #[test]
    fn the_saver_ends_with_the_store_and_drops_the_sink() {
        struct Held(Arc<AtomicUsize>);
        impl Drop for Held {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let held = Held(dropped.clone());
        let store = TopologyStore::persisted(
            Topology::empty(1),
            move |_: &Topology| -> std::io::Result<()> {
                let _held = &held;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(wait(store.submit(queue("q", "r"))), Ok(()));
        drop(store);
        eventually("the sink is dropped", || {
            dropped.load(Ordering::SeqCst) == 1
        });
    }

    #[test]
    fn a_loaded_topology_is_placed_for_its_shard_count() {
        let mut t = Topology::empty(3);
        assert!(t.apply(&queue("receiver_1_queue", "receiver_1")).unwrap());
        assert!(!t.apply(&queue("receiver_1_queue", "admin")).unwrap());
        t.apply(&TopologyChange::DeclareExchange {
            name: "ex".into(),
            kind: ExchangeKind::Topic,
        })
        .unwrap();
        t.apply(&TopologyChange::Bind {
            queue: "receiver_1_queue".into(),
            exchange: "ex".into(),
            key: "receiver_1.#".into(),
        })
        .unwrap();
        assert_eq!(t.version(), 3);
        let store =
            TopologyStore::persisted(t, |_: &Topology| -> std::io::Result<()> { Ok(()) }).unwrap();
        assert_eq!(store.shards(), 3);
        assert!(!store.unsaved(), "what was loaded is saved");
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
