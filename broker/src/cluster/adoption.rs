//! Taking an owner over on shared storage (`cluster.storage = "shared"`,
//! DESIGN §10.3): whenever the placements put an owner on this node that
//! this process does not hold yet (a takeover, this node's own restart, a
//! brand-new owner), the coordinator thread
//!
//! 1. fences every older copy of the owner (renames it aside and records
//!    its lengths: from then on its old holder acknowledges nothing), and
//!    makes the directory of this node's tenure, which the owner's new
//!    logs go into ([`SharedLogs::hold`]);
//! 2. if an older copy was there, holds the owner's commands and publishes
//!    ([`Residence::Moving`](super::Residence::Moving)) and hands the
//!    copies to the adopter thread, so the backlog is served first, in
//!    order;
//!
//! and the adopter thread, off the shards' turns and off the coordinator
//! thread (whose heartbeats must go on), stores each copy's messages into
//! the owner's queues here, oldest tenure first, deduplicated by sender and
//! id, and deletes the copy only once they are durable; then the owner is
//! served. Killed at any point, the next holder finds the copies not yet
//! deleted and adopts them again, in order; what was stored twice is found
//! again as duplicates. Messages keep their delivery counts, and the
//! backlog passes through one bounded step at a time
//! ([`store_backlog`]), so one larger than memory is adopted too.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ciphermq_cluster::shared_storage::{FencedDir, SharedStorageError, Tenure};
use ciphermq_cluster::Placement;
use ciphermq_shard::durability::is_deleted_dir_name;
use ciphermq_shard::shard_of;

use super::handback::{declare_missing, store_backlog};
use super::manifest::{Manifest, QueueEntry};
use super::moves::{remove_dir, Handover, StepError};
use super::shared_logs::SharedLogs;
use super::ClusterNode;
use crate::runtime::context::Shared;

/// How long the adopter waits before trying a failed adoption again.
const RETRY: Duration = Duration::from_secs(1);

/// One owner's older copies, for the adopter thread.
struct Adoption {
    owner: String,
    tenure: Tenure,
    copies: Vec<FencedDir>,
}

/// The coordinator thread's end of the adopter thread.
pub(crate) struct Adopter {
    jobs: crossbeam_channel::Sender<Adoption>,
}

impl Adopter {
    /// Starts the adopter thread. `handover.data_dir` is where copies are
    /// staged.
    pub(crate) fn start(
        node: Arc<ClusterNode>,
        shared: Weak<Shared>,
        handover: Handover,
    ) -> std::io::Result<Adopter> {
        let (jobs, queue) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name("cluster-adopt".to_owned())
            .spawn(move || run(&node, &shared, &handover, &queue))?;
        Ok(Adopter { jobs })
    }

    /// Step 1 for every owner `changes` put on this node at an epoch this
    /// process does not hold it at: fences older copies, makes this tenure's
    /// directory and holds the owner in it; older copies go to the adopter
    /// thread, the owner's commands waiting meanwhile. Call before the
    /// changes are applied, so nothing is stored for the owner before.
    pub(crate) fn hold_placed(
        &self,
        node: &ClusterNode,
        logs: &SharedLogs,
        incarnation: u64,
        changes: &[Placement],
    ) {
        for p in changes {
            if *p.node_id != *node.node_id {
                if logs.held(&p.owner).is_some() {
                    // Its queues are let go by the hand-back tick, files left
                    // where they are; new logs of it are never written.
                    logs.release(&p.owner);
                }
                continue;
            }
            if logs
                .held(&p.owner)
                .is_some_and(|dir| dir.tenure().epoch == p.epoch)
            {
                continue;
            }
            let tenure = Tenure {
                epoch: p.epoch,
                incarnation,
            };
            match hold(logs, &p.owner, tenure) {
                Ok(copies) if copies.is_empty() => {}
                Ok(copies) => {
                    node.view.set_leaving(&p.owner, true);
                    tracing::warn!(owner = %p.owner, %tenure, copies = copies.len(),
                        "owner's shared storage taken over: older copies fenced; serving it once their backlog is stored here");
                    let _ = self.jobs.send(Adoption {
                        owner: p.owner.to_string(),
                        tenure,
                        copies,
                    });
                }
                Err(e @ SharedStorageError::Superseded { .. }) => {
                    tracing::warn!(owner = %p.owner, error = %e, "not taking an owner a later holder has");
                }
                Err(e) => {
                    tracing::error!(owner = %p.owner, %tenure, error = %e,
                        "cannot take over an owner's shared storage: its publishes are refused (NACK storage) until a later try succeeds");
                }
            }
        }
    }
}

/// Fences the older copies of `owner` and holds it in `tenure`'s
/// directory; returns the copies to adopt.
fn hold(
    logs: &SharedLogs,
    owner: &str,
    tenure: Tenure,
) -> Result<Vec<FencedDir>, SharedStorageError> {
    // A holder whose lease ran out may have been replaced already: it
    // fences and makes nothing (the model in cluster/tests/lease_model.rs
    // shows a stale heir losing acknowledged messages otherwise).
    if !logs.gate().is_valid(Instant::now()) {
        return Err(SharedStorageError::Io {
            action: "take the owner over",
            path: logs.store().owner_dir(owner),
            source: std::io::Error::other("this node's lease has run out"),
        });
    }
    let copies = logs.store().fence_older(owner, tenure)?;
    let dir = logs.store().create_or_reopen_epoch_dir(owner, tenure)?;
    logs.hold(owner, dir);
    Ok(copies)
}

fn run(
    node: &ClusterNode,
    shared: &Weak<Shared>,
    handover: &Handover,
    queue: &crossbeam_channel::Receiver<Adoption>,
) {
    let Some(logs) = node.shared_logs() else {
        return;
    };
    while let Ok(mut adoption) = queue.recv() {
        loop {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let started = Instant::now();
            match adopt(&shared, handover, logs, &mut adoption) {
                Ok(stored) => {
                    node.view.set_leaving(&adoption.owner, false);
                    tracing::warn!(owner = %adoption.owner, tenure = %adoption.tenure, stored,
                        took_ms = started.elapsed().as_millis() as u64,
                        "owner's backlog adopted from shared storage; serving it");
                    break;
                }
                Err(Adopt::NotHeld) => {
                    tracing::warn!(owner = %adoption.owner, tenure = %adoption.tenure,
                        "this node no longer holds an owner it was adopting: the copies are left to its new holder");
                    node.view.set_leaving(&adoption.owner, false);
                    break;
                }
                Err(Adopt::Failed(e)) => {
                    tracing::error!(owner = %adoption.owner, tenure = %adoption.tenure, error = %e,
                        "cannot adopt an owner's backlog from shared storage; trying again");
                    std::thread::sleep(RETRY);
                    // Copies made meanwhile (a stale holder's) are fenced
                    // and adopted too.
                    match logs.store().fence_older(&adoption.owner, adoption.tenure) {
                        Ok(copies) => adoption.copies = copies,
                        Err(e) => tracing::error!(owner = %adoption.owner, error = %e,
                            "cannot list the owner's copies on shared storage"),
                    }
                }
            }
        }
    }
}

/// Why an adoption stopped.
enum Adopt {
    /// This node no longer holds the owner: its lease ran out, or a later
    /// holder fenced its directory. It must delete nothing.
    NotHeld,
    /// Something failed; tried again.
    Failed(StepError),
}

impl From<StepError> for Adopt {
    fn from(e: StepError) -> Adopt {
        Adopt::Failed(e)
    }
}

/// Stores every copy's messages here, oldest first, and deletes each copy
/// once they are durable; returns how many were stored.
///
/// A copy is deleted only while this node still holds the owner (its lease
/// holds and its own directory is the one it made), checked after the
/// messages are durable in that directory: a later holder that fenced it
/// meanwhile recorded lengths covering them. A holder that lost the owner
/// before making its directory was refused it (a later tenure existed) or
/// made one the later holder fences when it looks again. A copy already
/// gone was deleted by such a holder after the same check: what it held is
/// in that holder's directory, fenced and adopted in turn.
fn adopt(
    shared: &Shared,
    handover: &Handover,
    logs: &SharedLogs,
    adoption: &mut Adoption,
) -> Result<u64, Adopt> {
    let data_dir = handover
        .data_dir
        .clone()
        .ok_or_else(|| Adopt::Failed("shared storage needs durable storage here".to_owned()))?;
    let Some(mine) = logs
        .held(&adoption.owner)
        .filter(|dir| dir.tenure() == adoption.tenure)
    else {
        return Err(Adopt::NotHeld);
    };
    let home = shard_of(&adoption.owner, handover.injector.shards()) as usize;
    let policy = shared.policy.current();
    let mut stored = 0;
    while let Some(copy) = adoption.copies.first() {
        if !copy.path().exists() {
            adoption.copies.remove(0);
            continue;
        }
        let staging = staging_dir(&data_dir, &adoption.owner, copy.tenure());
        let bytes = copy.stage_into(&staging).map_err(|e| e.to_string())?;
        let manifest = Manifest {
            owner: adoption.owner.clone(),
            epoch: copy.tenure().epoch,
            queues: copy
                .queues()
                .into_iter()
                .filter(|q| !is_deleted_dir_name(q))
                .map(|name| QueueEntry {
                    name,
                    bindings: Vec::new(),
                })
                .collect(),
        };
        manifest.foreign_queue(|queue| policy.acl.queue_owner(queue))?;
        declare_missing(shared, &manifest)?;
        for q in &manifest.queues {
            let taken = store_backlog(handover, home, &q.name, &staging.join(&q.name))?;
            stored += taken.stored;
        }
        let still_held = logs.gate().is_valid(Instant::now())
            && mine.still_in_place().map_err(|e| e.to_string())?;
        if !still_held {
            return Err(Adopt::NotHeld);
        }
        tracing::info!(owner = %adoption.owner, from = %copy.tenure(), bytes, queues = manifest.queues.len(),
            "older copy of an owner stored here; deleting it from shared storage");
        let done = adoption.copies.remove(0);
        done.remove().map_err(|e| e.to_string())?;
        let _ = remove_dir(&staging);
    }
    Ok(stored)
}

/// `adopt-in/<owner hex>/<tenure>` in this node's data directory: a fenced
/// copy cut at its recorded lengths, for recovery to read.
fn staging_dir(data_dir: &std::path::Path, owner: &str, tenure: Tenure) -> PathBuf {
    data_dir
        .join("adopt-in")
        .join(super::moves::owner_hex(owner))
        .join(tenure.dir_name())
}
