//! Persistence: the sink a store saves through, and its saver thread,
//! which saves changes in batches and retries a failed save.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;

use super::{ChangeResult, Topology, TopologyChange, TopologyError, TopologyStore};
use crate::pending::Resolver;

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

/// What the saver thread is asked to do.
#[derive(Debug)]
pub(super) enum SaveJob {
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
            // What was just saved is no published version: whatever the
            // saved mark says (a rule installed meanwhile may have advanced
            // it), the current one is not on disk, and is saved next.
            self.saved.fetch_min(base, Ordering::AcqRel);
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
