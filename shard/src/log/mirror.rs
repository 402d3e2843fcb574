//! How the metadata mirror (the Postgres bridge) holds back segment deletion.
//!
//! The mirror reads each queue's log behind the shards. A fully acked segment
//! may only be deleted once the mirror has read it, so every queue has one
//! shared cell: the base of the segment the mirror is reading. Segments with a
//! smaller base are done with. The shard loads the cell (one atomic read) when
//! it considers deleting; the mirror stores it after each committed batch, or
//! `u64::MAX` to let go when its backlog passes the disk budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The placement epoch of the owner of a queue (0 outside a cluster): what
/// the mirror records with each row, so the rows of an owner that moved
/// say which stored copy they describe.
pub type QueueEpochs = dyn Fn(&str) -> u64 + Send + Sync;

/// Per-queue mirror positions, shared by the shards and the mirror.
#[derive(Default)]
pub struct MirrorWatermarks {
    cells: Mutex<HashMap<Arc<str>, Arc<AtomicU64>>>,
    /// Per queue: one past the last message durable in its log, so the
    /// mirror can tell its lag in rows.
    stored: Mutex<HashMap<Arc<str>, Arc<AtomicU64>>>,
    /// Queues deleted since the mirror last looked: it drops their rows and
    /// position before reading on, so a queue declared again under the same
    /// name is mirrored from its new log's start.
    deleted: Mutex<Vec<Arc<str>>>,
    /// Set once by a cluster node when it joins.
    epochs: OnceLock<Arc<QueueEpochs>>,
}

impl std::fmt::Debug for MirrorWatermarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorWatermarks")
            .field("queues", &self.cells.lock().map_or(0, |c| c.len()))
            .finish_non_exhaustive()
    }
}

/// The cell of `queue` in `cells`, created at 0 on first use.
fn cell_of(cells: &Mutex<HashMap<Arc<str>, Arc<AtomicU64>>>, queue: &str) -> Arc<AtomicU64> {
    let mut cells = cells.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(cell) = cells.get(queue) {
        return cell.clone();
    }
    let cell = Arc::new(AtomicU64::new(0));
    cells.insert(Arc::from(queue), cell.clone());
    cell
}

impl MirrorWatermarks {
    /// An empty registry: every queue starts held at 0 (nothing deletable)
    /// until the mirror reports on it.
    pub fn new() -> MirrorWatermarks {
        MirrorWatermarks::default()
    }

    /// Tells the mirror where to learn each queue's owner's placement epoch
    /// (a cluster node, once joined); a second call is ignored.
    pub fn set_epochs(&self, epochs: Arc<QueueEpochs>) {
        let _ = self.epochs.set(epochs);
    }

    /// The placement epoch of `queue`'s owner, 0 outside a cluster.
    pub fn epoch_of(&self, queue: &str) -> u64 {
        self.epochs.get().map_or(0, |epochs| epochs(queue))
    }

    /// The cell of `queue`, created at 0 on first use. Callers keep the `Arc`:
    /// the lock is taken once per queue, not per check.
    pub fn cell(&self, queue: &str) -> Arc<AtomicU64> {
        cell_of(&self.cells, queue)
    }

    /// The cell the shard owning `queue` advances as messages become
    /// durable (one past the last one's sequence number).
    pub fn stored_cell(&self, queue: &str) -> Arc<AtomicU64> {
        cell_of(&self.stored, queue)
    }

    /// Every queue with its count of messages stored so far (one past the
    /// last durable sequence number), for the mirror's lag.
    pub fn stored(&self) -> Vec<(Arc<str>, u64)> {
        let cells = self.stored.lock().unwrap_or_else(PoisonError::into_inner);
        cells
            .iter()
            .map(|(q, c)| (q.clone(), c.load(Ordering::Acquire)))
            .collect()
    }

    /// `delete_queue`: forgets `queue`'s cells and tells the mirror (see
    /// [`MirrorWatermarks::take_deleted`]). Called by the queue's shard
    /// once its log directory is moved out of the mirror's sight.
    pub fn queue_deleted(&self, queue: &Arc<str>) {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(queue);
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(queue);
        let mut deleted = self.deleted.lock().unwrap_or_else(PoisonError::into_inner);
        if !deleted.contains(queue) {
            deleted.push(queue.clone());
        }
    }

    /// The queues deleted since the last call, for the mirror to drop.
    pub fn take_deleted(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut *self.deleted.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records that the mirror is reading `queue`'s segment at `base`.
    pub fn set(&self, queue: &str, base: u64) {
        self.cell(queue).store(base, Ordering::Release);
    }

    /// Lets every queue delete whatever is fully acked (disk budget exceeded,
    /// or the mirror stopped).
    pub fn release_all(&self) {
        let cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        for cell in cells.values() {
            cell.store(u64::MAX, Ordering::Release);
        }
    }
}

/// A segment with base `base` may be deleted under `cell`.
pub(crate) fn mirrored(cell: &AtomicU64, base: u64) -> bool {
    base < cell.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_held_until_the_mirror_moves_past_a_segment() {
        let marks = MirrorWatermarks::new();
        let cell = marks.cell("q");
        assert!(!mirrored(&cell, 0));
        marks.set("q", 100);
        assert!(mirrored(&cell, 0) && mirrored(&cell, 99) && !mirrored(&cell, 100));
        marks.release_all();
        assert!(mirrored(&cell, u64::MAX - 1));
    }
}
