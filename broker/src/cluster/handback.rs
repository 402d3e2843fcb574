//! Giving back a backlog (DESIGN §10.3, `cluster.storage = "local"`): a
//! node that finds queues of an owner placed on another node (it was taken
//! over while this node was away, or this node joined with such data)
//! serves none of it and hands the backlog to the node holding the owner,
//! which stores it after what the owner's queues hold, deduplicated by
//! sender and id; then the giver deletes its copy.
//!
//! 1. **Give** (the node that lost the owner): the owner's queues leave the
//!    shard whole, as for a move, into `handback/<owner hex>/` with a
//!    manifest; the files go into `cluster_handback_parts` and the row of
//!    `cluster_handbacks` becomes `offered`.
//! 2. **Take** (the node holding the owner, whichever it is by then): it
//!    stages the files under `handback-in/`, recovers each queue from them
//!    as a restart would, and stores its messages, in order, into its own
//!    queue of that name ([`Shard::take_back`](ciphermq_shard::Shard::take_back));
//!    once the queue's log stands still, everything is on its disk, and
//!    the row becomes `done`.
//! 3. **Delete** (the giver): on seeing `done`, it deletes its copy.
//!
//! A crash anywhere repeats a step: a giver that restarts finds its
//! directory and offers it again (or deletes it if it was taken); a taker
//! that restarts takes the offer again, and what it had stored already is
//! found again as duplicates. Messages keep their delivery counts: the next
//! delivery counts on from those made on the old node, as after a restart.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_cluster::{ClusterError, Coordinator, Handback, PgCoordinator};
use ciphermq_shard::log::recover_queue;
use ciphermq_shard::shard_of;
use ciphermq_shard::topology::TopologyChange;

use super::manifest::Manifest;
use super::moves::{
    on_shard, owner_hex, pack, read_manifest, remove_dir, stage, stop_and_detach, stop_and_forget,
    unpack, Handover, Moves, StepError,
};
use super::{ClusterNode, Residence};
use crate::runtime::context::Shared;

/// Bytes per row of `cluster_handback_parts`.
const PART_BYTES: usize = 4 << 20;

/// Messages stored per step on the shard: a step is short, so the shard's
/// connections are not kept waiting.
const STEP_MESSAGES: usize = 512;

/// Most body bytes one step of [`store_backlog`] holds (past its first
/// message): what carrying a backlog costs in memory besides the budget.
const STEP_BYTES: usize = 4 << 20;

/// How long the taker waits for the owner's logs to stand still.
const QUIET_WAIT: Duration = Duration::from_secs(30);

/// `handback/<owner hex>`: a backlog given back, until taken.
fn give_dir(data_dir: &Path, owner: &str) -> PathBuf {
    data_dir.join("handback").join(owner_hex(owner))
}

/// `handback-in/<owner hex>@<from node hex>`: a backlog being taken.
fn take_dir(data_dir: &Path, owner: &str, from_node: &str) -> PathBuf {
    data_dir
        .join("handback-in")
        .join(format!("{}@{}", owner_hex(owner), owner_hex(from_node)))
}

/// The coordinator thread's backlogs given back and not taken yet.
#[derive(Default)]
pub(crate) struct Handbacks {
    /// Owners whose backlog is set aside under `handback/` and not offered
    /// yet (the offer failed: PostgreSQL away).
    unoffered: HashSet<String>,
    /// Owners whose backlog is offered, until taken.
    offered: HashSet<String>,
}

impl Handbacks {
    /// At join: settles what a restart finds under `handback/` (deleted if
    /// taken, offered again if not) and `handback-in/` (dropped: the offer
    /// is taken again from the coordinator).
    pub(crate) fn recover(
        &mut self,
        node: &ClusterNode,
        coordinator: &PgCoordinator,
        handover: &Handover,
    ) -> Result<(), ClusterError> {
        let Some(data_dir) = &handover.data_dir else {
            return Ok(());
        };
        let _ = remove_dir(&data_dir.join("handback-in"));
        let Ok(entries) = std::fs::read_dir(data_dir.join("handback")) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let manifest = match read_manifest(&dir) {
                Ok(m) => m,
                Err(e) => {
                    // It never got past its first step: the queues it
                    // names were still in the shard's directories.
                    tracing::warn!(dir = %dir.display(), error = %e, "a backlog to give back without a manifest is left where it is");
                    continue;
                }
            };
            match coordinator.handback_taken(&manifest.owner, &node.node_id)? {
                Some(true) => {
                    if let Err(e) = remove_dir(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot delete a backlog given back");
                    }
                }
                Some(false) => {
                    self.offered.insert(manifest.owner.clone());
                }
                None => {
                    self.unoffered.insert(manifest.owner.clone());
                }
            }
        }
        Ok(())
    }

    /// One tick: gives back the backlogs of owners this node holds queues
    /// of but that live elsewhere, deletes the copies that were taken, and
    /// takes the backlogs offered to this node.
    pub(crate) fn tick(
        &mut self,
        node: &ClusterNode,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
        moves: &Moves,
    ) -> Result<(), ClusterError> {
        let Some(data_dir) = &handover.data_dir else {
            return Ok(());
        };
        if node.shared_logs().is_some() {
            // On shared storage the backlog is not this node's to give: the
            // node holding the owner fenced this node's copy and adopts it.
            for owner in lost_owners(node, shared, moves) {
                match stop_and_forget(shared, handover, &owner) {
                    Ok(()) => tracing::warn!(owner = %owner,
                        "this node no longer holds an owner kept on shared storage: its queues leave this node, their files are the new holder's"),
                    Err(e) => tracing::error!(owner = %owner, error = %e,
                        "cannot let go of an owner that lives on another node; trying again"),
                }
            }
            return Ok(());
        }
        for owner in lost_owners(node, shared, moves) {
            let dir = give_dir(data_dir, &owner);
            match stop_and_detach(shared, handover, &dir, &owner, 0) {
                Ok(_) => {
                    tracing::warn!(owner = %owner,
                        "this node holds queues of an owner that lives on another node (taken over while this node was away): their backlog is given back to it");
                    self.unoffered.insert(owner);
                }
                Err(e) => tracing::error!(owner = %owner, error = %e,
                    "cannot set aside the backlog of an owner that lives on another node; trying again"),
            }
        }
        let unoffered: Vec<String> = self.unoffered.iter().cloned().collect();
        for owner in unoffered {
            match offer(node, coordinator, &give_dir(data_dir, &owner), &owner) {
                Ok(bytes) => {
                    tracing::info!(owner = %owner, bytes, "backlog offered to the owner's node");
                    self.unoffered.remove(&owner);
                    self.offered.insert(owner);
                }
                Err(e) => {
                    tracing::warn!(owner = %owner, error = %e, "cannot offer a backlog to give back; trying again")
                }
            }
        }
        let offered: Vec<String> = self.offered.iter().cloned().collect();
        for owner in offered {
            if coordinator.handback_taken(&owner, &node.node_id)? == Some(true) {
                let dir = give_dir(data_dir, &owner);
                match remove_dir(&dir) {
                    Ok(()) => {
                        tracing::info!(owner = %owner, "backlog given back was taken; this node's copy is deleted");
                        self.offered.remove(&owner);
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot delete a backlog given back");
                    }
                }
            }
        }
        let (_, placements) = node.view.current();
        for h in coordinator.handbacks_for(&node.node_id)? {
            // Taken only where this node's snapshot agrees the owner lives:
            // an owner moving away meanwhile leaves the offer to its new
            // node, never a queue of it declared here again.
            if placements.residence(&h.owner, &node.node_id) != Residence::Here {
                continue;
            }
            let started = Instant::now();
            match take(shared, coordinator, handover, data_dir, &h) {
                Ok(taken) => {
                    coordinator.finish_handback(&h.owner, &h.from_node)?;
                    let _ = remove_dir(&take_dir(data_dir, &h.owner, &h.from_node));
                    tracing::info!(owner = %h.owner, from_node = %h.from_node, stored = taken.stored,
                        duplicates = taken.duplicates, took_ms = started.elapsed().as_millis() as u64,
                        "backlog given back by another node taken: stored after what the owner's queues hold");
                }
                Err(e) => {
                    tracing::error!(owner = %h.owner, from_node = %h.from_node, error = %e,
                        "cannot take a backlog given back; trying again");
                }
            }
        }
        Ok(())
    }
}

/// Owners whose queues this node holds while they live on another node,
/// and that no move here is about.
fn lost_owners(node: &ClusterNode, shared: &Shared, moves: &Moves) -> Vec<String> {
    let (_, placements) = node.view.current();
    let mut owners: Vec<String> = shared
        .topology
        .snapshot()
        .queues()
        .map(|q| q.owner.to_string())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    owners.retain(|owner| {
        matches!(
            placements.residence(owner, &node.node_id),
            Residence::Elsewhere(_)
        ) && !placements.is_arriving(owner)
            && !moves.involves(owner)
    });
    owners
}

/// Stores the directory's archive in parts and offers it; its size.
fn offer(
    node: &ClusterNode,
    coordinator: &PgCoordinator,
    dir: &Path,
    owner: &str,
) -> Result<usize, StepError> {
    let archive = pack(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let parts: Vec<&[u8]> = archive.chunks(PART_BYTES).collect();
    for (i, part) in parts.iter().enumerate() {
        coordinator
            .put_handback_part(owner, &node.node_id, i as u32, part.to_vec())
            .map_err(|e| e.to_string())?;
    }
    coordinator
        .offer_handback(owner, &node.node_id, parts.len() as u32)
        .map_err(|e| e.to_string())?;
    Ok(archive.len())
}

/// What a take stored.
#[derive(Default)]
pub(super) struct Taken {
    pub(super) stored: u64,
    pub(super) duplicates: u64,
}

/// Takes one offered backlog: stages it, and stores each queue's messages
/// in order into the queue of that name here (declared if missing), until
/// its log stands still.
fn take(
    shared: &Arc<Shared>,
    coordinator: &PgCoordinator,
    handover: &Handover,
    data_dir: &Path,
    h: &Handback,
) -> Result<Taken, StepError> {
    let mut archive = Vec::new();
    for part in 0..h.parts {
        match coordinator
            .handback_part(&h.owner, &h.from_node, part)
            .map_err(|e| e.to_string())?
        {
            Some(bytes) => archive.extend_from_slice(&bytes),
            None => return Err(format!("part {part} of {} is missing", h.parts)),
        }
    }
    let (manifest, files) = unpack(&archive)?;
    if manifest.owner != h.owner {
        return Err(format!(
            "the backlog offered is of owner {}",
            manifest.owner
        ));
    }
    let policy = shared.policy.current();
    manifest.foreign_queue(|queue| policy.acl.queue_owner(queue))?;
    let staging = take_dir(data_dir, &h.owner, &h.from_node);
    stage(&staging, &manifest, &files)?;
    declare_missing(shared, &manifest)?;
    let home = shard_of(&h.owner, handover.injector.shards()) as usize;
    let mut taken = Taken::default();
    for q in &manifest.queues {
        let done = store_backlog(handover, home, &q.name, &staging.join(&q.name))?;
        taken.stored += done.stored;
        taken.duplicates += done.duplicates;
    }
    Ok(taken)
}

/// Recovers the queue log staged at `dir` as a restart would, and stores
/// its messages in order into queue `name` on shard `home` (after what it
/// holds, deduplicated, with their delivery counts), a step at a time:
/// only one step's bodies are in memory here, and when the shard's part of
/// the memory budget is full the step waits until what it holds is on disk
/// (and out of memory), so a backlog bigger than memory is carried through
/// the budget. Returns once the queue's log stands still, so everything
/// stored is on disk.
pub(super) fn store_backlog(
    handover: &Handover,
    home: usize,
    name: &str,
    dir: &Path,
) -> Result<Taken, StepError> {
    let mut taken = Taken::default();
    let recovered = recover_queue(dir, &handover.dedup_hasher, handover.window_ms)
        .map_err(|e| format!("queue {name}: {}: {e}", dir.display()))?;
    let mut reader = recovered.reader();
    let queue_name: Arc<str> = Arc::from(name);
    loop {
        let step = reader
            .next_batch(STEP_MESSAGES, STEP_BYTES)
            .map_err(|e| format!("queue {name}: {}: {e}", dir.display()))?;
        if step.is_empty() {
            break;
        }
        let queue = queue_name.clone();
        let done = on_shard(handover, home, move |s, now| {
            s.take_back(&queue, &step, now)
        })?
        .map_err(|(reason, _)| format!("queue {name}: refused ({})", reason.as_str()))?;
        taken.stored += done.stored;
        taken.duplicates += done.duplicates;
        if !done.room {
            wait_quiet(handover, home, &queue_name)?;
        }
    }
    wait_quiet(handover, home, &queue_name)?;
    Ok(taken)
}

/// Waits until queue `name`'s log on shard `home` stands still: what was
/// stored is on disk.
fn wait_quiet(handover: &Handover, home: usize, name: &Arc<str>) -> Result<(), StepError> {
    let deadline = Instant::now() + QUIET_WAIT;
    loop {
        let names = vec![name.clone()];
        if on_shard(handover, home, move |s, _| s.is_quiet(&names))? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "queue {name}: its log did not stand still within {} s",
                QUIET_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Declares the queues of `manifest` this node does not have (their
/// receiver deleted them after the takeover, or never had them declared
/// here): a backlog is never dropped for want of its queue. Bindings are
/// not made again: the owner's bindings here are what its receiver made.
pub(super) fn declare_missing(shared: &Shared, manifest: &Manifest) -> Result<(), StepError> {
    for q in &manifest.queues {
        if shared.topology.snapshot().queue(&q.name).is_some() {
            continue;
        }
        futures_lite::future::block_on(shared.topology.submit(TopologyChange::DeclareQueue {
            name: q.name.clone(),
            owner: manifest.owner.clone(),
            by: None,
        }))
        .map_err(|e| format!("queue {}: {e}", q.name))?;
    }
    Ok(())
}
