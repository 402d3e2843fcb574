//! The single writer: applies changes to a copy of the topology and
//! publishes it as the snapshot every shard routes against.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};

use ciphermq_proto::ExchangeKind;

use super::saver::SaveJob;
use super::{
    Actor, BindingRule, ChangeResult, QueueInfo, RemovedBinding, Topology, TopologyChange,
    TopologyError, TopologySink,
};
use crate::pending::Pending;
use crate::quota::Quotas;

/// The single writer of the topology, shared by every shard.
pub struct TopologyStore {
    shards: usize,
    /// Where the topology is saved; `None` for a store in memory only.
    pub(super) sink: Option<Box<dyn TopologySink>>,
    /// Held for in-memory changes only: never while the sink saves, so a
    /// shard declaring a dead-letter queue never waits on the disk.
    writer: Mutex<()>,
    current: RwLock<Arc<Topology>>,
    version: AtomicU64,
    /// The newest published version known to be saved by the sink: behind
    /// `version` while a change applied at once waits for its save.
    pub(super) saved: AtomicU64,
    /// Jobs for the saver thread; set once, by [`Self::persisted`].
    pub(super) saver: OnceLock<crossbeam_channel::Sender<SaveJob>>,
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

impl TopologyStore {
    /// An empty topology for a broker of `shards` shards, kept in memory
    /// only: every change is applied and answered at once.
    pub fn new(shards: usize) -> TopologyStore {
        TopologyStore::with(Topology::empty(shards), None)
    }

    pub(super) fn with(loaded: Topology, sink: Option<Box<dyn TopologySink>>) -> TopologyStore {
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

    pub(super) fn lock_writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `next` the current snapshot. Call with the writer lock held.
    pub(super) fn publish(&self, next: Topology) {
        let version = next.version;
        debug_assert!(
            version > self.version(),
            "a published version not above the last"
        );
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
            by: None,
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

    /// Declares an exchange as an admin (owned by no receiver); the same
    /// type again is a no-op, another is an error. Applied at once and saved
    /// afterwards, like [`Self::declare_queue`].
    pub fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<(), TopologyError> {
        self.apply_now(&TopologyChange::DeclareExchange {
            name: name.to_owned(),
            kind,
            owner: None,
        })
    }

    /// Binds a queue to an exchange with a key, as an admin (idempotent).
    /// Applied at once and saved afterwards, like [`Self::declare_queue`].
    pub fn bind(&self, queue: &str, exchange: &str, key: &str) -> Result<(), TopologyError> {
        self.apply_now(&TopologyChange::Bind {
            queue: queue.to_owned(),
            exchange: exchange.to_owned(),
            key: key.to_owned(),
            by: Some(Actor::Admin),
        })
    }

    /// Holds receivers' changes to `quotas` from now on. What a CN already
    /// holds beyond them stays (nothing is removed); it only cannot grow.
    /// The broker calls it at start, after loading the topology.
    pub fn set_quotas(&self, quotas: Quotas) {
        let _writer = self.lock_writer();
        let mut next = (*self.snapshot()).clone();
        next.quotas = quotas;
        // A new version, so a batch the saver built meanwhile is applied
        // again under these quotas before it is published; quotas are not
        // saved, so nothing needs writing.
        let before = next.version;
        next.version += 1;
        let version = next.version;
        self.publish(next);
        let _ = self
            .saved
            .compare_exchange(before, version, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Makes `rule` the judge of bindings from now on, and removes every
    /// binding it refuses; returns those, for the caller to log. The broker
    /// calls it at start and on every reload of its ACL.
    ///
    /// Applied and visible at once (a change queued for the saver thread is
    /// judged by the new rule when it is applied), and saved afterwards, like
    /// [`Self::declare_queue`]: a crash before that save brings the removed
    /// bindings back until the rule is installed again at the next start.
    pub fn set_binding_rule(&self, rule: Arc<dyn BindingRule>) -> Vec<RemovedBinding> {
        let _writer = self.lock_writer();
        let mut next = (*self.snapshot()).clone();
        let before = next.version;
        let removed = next.install_rule(rule);
        // Always a new version, so that a batch the saver built under the old
        // rule is applied again under this one before it is published.
        next.version += 1;
        let version = next.version;
        self.publish(next);
        if removed.is_empty() {
            // The rule is not saved: when nothing else changed, what is saved
            // is as current as it was, and nothing is written.
            let _ =
                self.saved
                    .compare_exchange(before, version, Ordering::AcqRel, Ordering::Acquire);
        } else {
            self.request_save();
        }
        removed
    }
}
