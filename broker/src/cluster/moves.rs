//! Moving an owner to another node, drain-first (DESIGN §10.1), run by the
//! coordinator threads of the two nodes through the `cluster_moves` row:
//!
//! 1. **Stop** (old node, row `requested`): commands and publishes about
//!    the owner wait ([`Residence::Moving`](super::Residence::Moving)); a
//!    barrier through every shard makes sure no publish routed before is
//!    still on its way; its queues freeze (no delivery, no publish), its
//!    connections are closed, and once their logs stand still the queues
//!    leave the shard whole, each log directory moved to
//!    `moving/<owner>@<epoch>/` with a manifest of the queues and their
//!    bindings.
//! 2. **Hand over**: those directories go into `cluster_handoff`, and the
//!    row becomes `exported`.
//! 3. **Take** (new node): it writes them under `queues/`, declares the
//!    queues and bindings, restores them as a restart would (ready and
//!    unacked messages in order with their delivery counts, dead-letter
//!    queues, the ids its dedup window remembers), and finishes the move:
//!    row `done` and placement at epoch + 1 in one transaction.
//! 4. **Clean up** (old node): once its snapshot shows the new placement,
//!    it deletes its copy; commands that waited are told where it went.
//!
//! With `cluster.storage = "shared"` the queues' logs stay where they are:
//! the old node stops the owner and lets its logs stand still but keeps
//! its queues (frozen), and hands over only the manifest; the new node
//! declares the queues and bindings, finishes the move, and then takes the
//! owner as after a takeover (fences the old node's copy and adopts it,
//! [`super::adoption`]); the old node lets its queues go, files left, once
//! its snapshot shows the new placement, and serves them again (thawed) if
//! the move is given up.
//!
//! Either side may give up, by a compare-and-set on the row, so that the
//! old node serving again and the new node finishing cannot both happen;
//! a node that restarts mid-move settles what it finds against the row
//! ([`Moves::recover`]). A message is acknowledged by exactly one of the
//! two nodes: the old one before its logs stood still, the new one after
//! the placement moved.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_cluster::{ClusterError, Coordinator, Move, MoveState, PgCoordinator, Placement};
use ciphermq_shard::log::recover_queue;
use ciphermq_shard::topology::{Actor, TopologyChange};
use ciphermq_shard::{shard_of, DedupHasher, MeshInjector};

use super::manifest::Manifest;
use super::ClusterNode;
use crate::runtime::context::Shared;

/// How long a move may take from its start on the old node to its finish
/// on the new one before the old node gives it up and serves the owner
/// again.
pub(crate) const MOVE_DEADLINE: Duration = Duration::from_secs(20);

/// How often the coordinator thread looks while a move is under way.
pub(crate) const MOVE_POLL: Duration = Duration::from_millis(20);

/// How long the old node waits for the owner's logs to stand still.
const QUIET_WAIT: Duration = Duration::from_secs(10);

/// How long a step run on a shard may take to answer.
const SHARD_WAIT: Duration = Duration::from_secs(10);

/// Bytes per row of `cluster_handoff`.
const PART_BYTES: usize = 4 << 20;

/// The first bytes of a hand-over.
const MAGIC: &[u8; 8] = b"CMQMOVE1";

/// A hand-over's manifest file, in the moving directory and first in the
/// archive.
pub(super) const MANIFEST: &str = "manifest.json";

/// What a node needs to hand owners over and take them.
#[derive(Clone)]
pub(crate) struct Handover {
    /// `storage.data_dir` when durable; moves need it.
    pub data_dir: Option<PathBuf>,
    /// The data directory's dedup hash key, for restoring queues.
    pub dedup_hasher: DedupHasher,
    /// `performance.dedup_window_secs` in milliseconds.
    pub window_ms: u64,
    /// Sends steps into the shards.
    pub injector: MeshInjector,
}

/// An owner this node stopped serving, waiting for the new node.
struct Outgoing {
    epoch: u64,
    deadline: Instant,
}

/// A move asked here by `move`, answered when it ends.
struct Watched {
    owner: String,
    epoch: u64,
    reply: tokio::sync::oneshot::Sender<Result<String, String>>,
    deadline: Instant,
}

/// The coordinator thread's moves in progress.
#[derive(Default)]
pub(crate) struct Moves {
    outgoing: HashMap<String, Outgoing>,
    watched: Vec<Watched>,
    /// Imports whose end got no answer, settled against the row: `true`
    /// when everything was taken (it may still finish), `false` when it is
    /// to be given up.
    unsettled: Vec<(Move, bool)>,
    /// Moves to this node asked for and not handed over yet, with when
    /// this node first saw each.
    expected: HashMap<(String, u64), Instant>,
    /// Placements of owners moved here on shared storage, for the
    /// coordinator thread to apply as it applies placements read
    /// ([`Moves::take_arrived`]): the old node's copy is fenced and adopted
    /// before the owner is served here.
    arrived: Vec<Placement>,
}

impl Moves {
    /// Whether a move of `owner` to or from this node is under way or not
    /// settled yet: its queues may be here while its placement is not.
    pub(crate) fn involves(&self, owner: &str) -> bool {
        self.outgoing.contains_key(owner)
            || self.unsettled.iter().any(|(m, _)| m.owner == owner)
            || self.expected.keys().any(|(o, _)| o == owner)
    }
}

/// Why a step of a move failed, for the log.
pub(super) type StepError = String;

impl Moves {
    /// Asks for a move and answers `reply` when it ends.
    pub(crate) fn request(
        &mut self,
        coordinator: &PgCoordinator,
        owner: &str,
        to_node: &str,
        lease: Duration,
        reply: tokio::sync::oneshot::Sender<Result<String, String>>,
    ) -> Result<(), ClusterError> {
        match coordinator.request_move(owner, to_node, lease) {
            Ok(m) => {
                tracing::info!(owner, from = %m.from_node, to = %m.to_node, epoch = m.epoch, "move asked for");
                self.watched.push(Watched {
                    owner: m.owner,
                    epoch: m.epoch,
                    reply,
                    deadline: Instant::now() + MOVE_DEADLINE + Duration::from_secs(5),
                });
                Ok(())
            }
            Err(e) => {
                let _ = reply.send(Err(e.to_string()));
                Err(e)
            }
        }
    }

    /// Placements of owners that a move on shared storage brought here
    /// since the last call: apply them as placements read (fencing and
    /// adopting the old node's copy first).
    pub(crate) fn take_arrived(&mut self) -> Vec<Placement> {
        std::mem::take(&mut self.arrived)
    }

    /// Whether a move this node takes part in is under way: the
    /// coordinator thread then looks every [`MOVE_POLL`] instead of its
    /// usual pace, so that a move keeps its owner waiting no longer than
    /// its work takes.
    pub(crate) fn busy(&self) -> bool {
        let now = Instant::now();
        self.expected
            .values()
            .any(|since| now.duration_since(*since) < MOVE_DEADLINE)
            || !self.outgoing.is_empty()
            || !self.watched.is_empty()
            || !self.unsettled.is_empty()
    }

    /// One tick: the moves this node has work in, the owners it is
    /// handing over, and the moves asked here.
    pub(crate) fn tick(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
    ) -> Result<(), ClusterError> {
        self.settle_outgoing(node, shared, coordinator, handover);
        self.settle_unsettled(node, shared, coordinator, handover);
        self.answer_watched(coordinator);
        let now = Instant::now();
        let mut expected = HashMap::new();
        for m in coordinator.pending_moves(node.node_id())? {
            if *m.to_node == **node.node_id() && m.state == MoveState::Requested {
                // Coming: look again soon, the hand-over may be ready (for
                // as long as a move may take: an old node that stopped
                // must not keep this one looking fast).
                let key = (m.owner.clone(), m.epoch);
                let since = self.expected.get(&key).copied().unwrap_or(now);
                expected.insert(key, since);
                continue;
            }
            if *m.from_node == **node.node_id() && m.state == MoveState::Requested {
                if self.outgoing.contains_key(&m.owner) {
                    continue;
                }
                self.export(node, shared, coordinator, handover, &m);
            } else if *m.to_node == **node.node_id() && m.state == MoveState::Exported {
                self.import(node, shared, coordinator, handover, &m);
            }
        }
        self.expected = expected;
        Ok(())
    }

    /// Stops serving `m.owner`, hands its queues over, and waits for the
    /// new node (steps 1 and 2).
    fn export(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
        m: &Move,
    ) {
        let started = Instant::now();
        let Some(data_dir) = &handover.data_dir else {
            tracing::error!(owner = %m.owner, "move refused: storage.mode = \"memory\" has no queue logs to hand over");
            let _ = coordinator.abort_move(&m.owner, m.epoch);
            return;
        };
        node.view().set_leaving(&m.owner, true);
        let dir = moving_dir(data_dir, &m.owner, m.epoch);
        let stopped = if node.shared_logs().is_some() {
            take_out(shared, handover, TakeOut::Freeze(&dir, m.epoch), &m.owner).map(|()| dir)
        } else {
            stop_and_detach(shared, handover, &dir, &m.owner, m.epoch)
        };
        match stopped {
            Ok(dir) => {
                let sent = pack(&dir).map_err(|e| format!("{}: {e}", dir.display()));
                let sent = sent.and_then(|archive| {
                    let parts: Vec<&[u8]> = archive.chunks(PART_BYTES).collect();
                    for (i, part) in parts.iter().enumerate() {
                        coordinator
                            .put_handoff(&m.owner, m.epoch, i as u32, part.to_vec())
                            .map_err(|e| e.to_string())?;
                    }
                    coordinator
                        .exported(&m.owner, m.epoch, parts.len() as u32)
                        .map_err(|e| e.to_string())?;
                    Ok(archive.len())
                });
                match sent {
                    Ok(bytes) => {
                        tracing::info!(owner = %m.owner, to = %m.to_node, bytes,
                            stopped_ms = started.elapsed().as_millis() as u64,
                            "owner handed over; waiting for the new node");
                        self.outgoing.insert(
                            m.owner.clone(),
                            Outgoing {
                                epoch: m.epoch,
                                deadline: Instant::now() + MOVE_DEADLINE,
                            },
                        );
                    }
                    Err(e) => {
                        tracing::error!(owner = %m.owner, error = %e, "move: hand-over failed; serving the owner here again");
                        self.give_up(node, shared, coordinator, handover, &m.owner, m.epoch);
                    }
                }
            }
            Err(e) => {
                tracing::error!(owner = %m.owner, error = %e, "move: could not stop the owner; serving it here again");
                self.give_up(node, shared, coordinator, handover, &m.owner, m.epoch);
            }
        }
    }

    /// Gives up an outgoing move: the row is aborted (unless the new node
    /// finished first) and the owner's queues are served here again.
    fn give_up(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
        owner: &str,
        epoch: u64,
    ) {
        match coordinator.abort_move(owner, epoch) {
            Ok(MoveState::Done) => {
                // The new node has it: wait for the placement as usual.
                self.outgoing.insert(
                    owner.to_owned(),
                    Outgoing {
                        epoch,
                        deadline: Instant::now() + Duration::from_secs(3600),
                    },
                );
                return;
            }
            Ok(_) => {}
            Err(e) => {
                // Not known to be aborted: the new node may still finish.
                // Ask again at the next tick.
                tracing::warn!(owner, error = %e, "move: cannot abort it yet; trying again");
                self.outgoing.insert(
                    owner.to_owned(),
                    Outgoing {
                        epoch,
                        deadline: Instant::now(),
                    },
                );
                return;
            }
        }
        self.outgoing.remove(owner);
        if let Some(data_dir) = &handover.data_dir {
            let dir = moving_dir(data_dir, owner, epoch);
            if node.shared_logs().is_some() {
                // Its queues never left their shard (frozen, logs in place).
                thaw_owner(shared, handover, owner);
                let _ = remove_dir(&dir);
            } else if dir.exists() {
                if let Err(e) = readopt(shared, handover, data_dir, &dir) {
                    tracing::error!(owner, dir = %dir.display(), error = %e,
                        "move given up, but its queues could not be served here again; they stay in that directory and the next start tries again");
                    return;
                }
            } else {
                thaw_owner(shared, handover, owner);
            }
        }
        node.view().set_leaving(owner, false);
        tracing::info!(owner, "move given up; the owner is served here again");
    }

    /// Outgoing owners: finished (the snapshot shows them elsewhere at a
    /// higher epoch: delete the copy) or past their deadline (give up).
    fn settle_outgoing(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
    ) {
        let (_, placements) = node.view().current();
        let now = Instant::now();
        let owners: Vec<(String, u64, bool)> = self
            .outgoing
            .iter()
            .map(|(o, g)| (o.clone(), g.epoch, now >= g.deadline))
            .collect();
        for (owner, epoch, late) in owners {
            let moved = placements
                .home(&owner)
                .is_some_and(|h| h.epoch > epoch && *h.node_id != **node.node_id());
            if moved {
                if node.shared_logs().is_some() {
                    // The new node fenced the queues' logs and adopts them:
                    // the queues leave this node, their files stay.
                    if let Err(e) = stop_and_forget(shared, handover, &owner) {
                        tracing::error!(owner, error = %e, "moved owner's queues not let go yet; trying again");
                        continue;
                    }
                }
                self.outgoing.remove(&owner);
                if let Some(data_dir) = &handover.data_dir {
                    let dir = moving_dir(data_dir, &owner, epoch);
                    if let Err(e) = remove_dir(&dir) {
                        tracing::warn!(owner, dir = %dir.display(), error = %e, "moved owner's old copy not deleted; the next start deletes it");
                    }
                }
                node.view().set_leaving(&owner, false);
                tracing::info!(owner, "owner moved away; its copy here is deleted");
            } else if late {
                tracing::warn!(owner, "move: the new node did not finish in time");
                self.give_up(node, shared, coordinator, handover, &owner, epoch);
            } else if let Ok(Some(m)) = coordinator.move_of(&owner, epoch) {
                // The new node gave it up.
                if m.state == MoveState::Aborted {
                    self.give_up(node, shared, coordinator, handover, &owner, epoch);
                }
            }
        }
    }

    /// Takes `m.owner` from the hand-over and finishes the move (step 3).
    fn import(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
        m: &Move,
    ) {
        let started = Instant::now();
        let Some(data_dir) = &handover.data_dir else {
            tracing::error!(owner = %m.owner, "move refused: storage.mode = \"memory\" cannot take queue logs");
            let _ = coordinator.abort_move(&m.owner, m.epoch);
            return;
        };
        node.view().set_arriving(&m.owner, Some(m.epoch + 1));
        let on_shared = node.shared_logs().is_some();
        let taken = if on_shared {
            declare_handed(shared, coordinator, data_dir, m)
        } else {
            take(shared, coordinator, handover, data_dir, m)
        };
        let names = match taken {
            Ok(names) => names,
            Err(e) => {
                tracing::error!(owner = %m.owner, from = %m.from_node, error = %e, "move: cannot take the owner; giving the move up");
                match coordinator.abort_move(&m.owner, m.epoch) {
                    Ok(_) => drop_taken(shared, handover, data_dir, m),
                    Err(_) => self.unsettled.push((m.clone(), false)),
                }
                return;
            }
        };
        match coordinator.finish_move(&m.owner, m.epoch) {
            Ok(placement) => {
                tracing::info!(owner = %m.owner, from = %m.from_node, epoch = placement.epoch, queues = names.len(),
                    took_ms = started.elapsed().as_millis() as u64, "owner moved here");
                self.arrive(node, data_dir, m, placement);
            }
            Err(e @ (ClusterError::MoveEnded { .. } | ClusterError::StaleEpoch { .. })) => {
                tracing::warn!(owner = %m.owner, error = %e, "move ended elsewhere; dropping what was taken");
                drop_taken(shared, handover, data_dir, m);
            }
            Err(e) => {
                tracing::warn!(owner = %m.owner, error = %e, "move: finishing got no answer; settling it at the next tick");
                self.unsettled.push((m.clone(), true));
            }
        }
    }

    /// Move `m` to this node finished at `placement`: served here now, or,
    /// on shared storage, once the coordinator thread has fenced and
    /// adopted the old node's copy ([`Moves::take_arrived`]).
    fn arrive(&mut self, node: &ClusterNode, data_dir: &Path, m: &Move, placement: Placement) {
        let _ = remove_dir(&incoming_dir(data_dir, &m.owner, m.epoch));
        if node.shared_logs().is_some() {
            self.arrived.push(placement);
        } else {
            node.view().apply(std::slice::from_ref(&placement));
            node.view().set_arriving(&placement.owner, None);
        }
    }

    /// Imports whose finish got no answer: the row says whether it counted.
    fn settle_unsettled(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
    ) {
        let Some(data_dir) = &handover.data_dir else {
            return;
        };
        let pending = std::mem::take(&mut self.unsettled);
        for (m, taken) in pending {
            if !taken {
                match coordinator.abort_move(&m.owner, m.epoch) {
                    Ok(MoveState::Done) => {
                        let _ = remove_dir(&incoming_dir(data_dir, &m.owner, m.epoch));
                    }
                    Ok(_) => drop_taken(shared, handover, data_dir, &m),
                    Err(_) => self.unsettled.push((m, false)),
                }
                continue;
            }
            let state = match coordinator.move_of(&m.owner, m.epoch) {
                Ok(found) => found.map(|f| f.state),
                Err(_) => {
                    self.unsettled.push((m, true));
                    continue;
                }
            };
            match state {
                Some(MoveState::Done) => match coordinator.locate(&m.owner) {
                    Ok(Some(p)) if p.epoch > m.epoch && *p.node_id == **node.node_id() => {
                        self.arrive(node, data_dir, &m, p);
                    }
                    Ok(_) => {
                        node.view().set_arriving(&m.owner, None);
                        let _ = remove_dir(&incoming_dir(data_dir, &m.owner, m.epoch));
                    }
                    Err(_) => self.unsettled.push((m, true)),
                },
                Some(MoveState::Exported) => match coordinator.finish_move(&m.owner, m.epoch) {
                    Ok(p) => self.arrive(node, data_dir, &m, p),
                    Err(_) => self.unsettled.push((m, true)),
                },
                _ => drop_taken(shared, handover, data_dir, &m),
            }
        }
    }

    /// Answers the moves asked here that ended.
    fn answer_watched(&mut self, coordinator: &PgCoordinator) {
        let now = Instant::now();
        let watched = std::mem::take(&mut self.watched);
        for w in watched {
            let state = coordinator.move_of(&w.owner, w.epoch).ok().flatten();
            let answer = match state.map(|m| m.state) {
                Some(MoveState::Done) => match coordinator.locate(&w.owner) {
                    Ok(Some(p)) => Some(Ok(format!(
                        "{} {} {} {}",
                        p.owner, p.node_id, p.advertise, p.epoch
                    ))),
                    _ => None,
                },
                Some(MoveState::Aborted) => Some(Err(format!(
                    "the move of owner {} was given up (the log of its nodes says why); it stays where it was",
                    w.owner
                ))),
                _ if now >= w.deadline => Some(Err(format!(
                    "the move of owner {} has not ended yet; see `ciphermq-admin nodes`",
                    w.owner
                ))),
                _ => None,
            };
            match answer {
                Some(a) => {
                    let _ = w.reply.send(a);
                }
                None => self.watched.push(w),
            }
        }
    }

    /// Settles what a restart finds of moves it was part of: an old copy
    /// whose move finished is deleted, one whose move did not is served
    /// again (the move is aborted first), and a half-taken copy is
    /// dropped unless its move finished.
    pub(crate) fn recover(
        &mut self,
        node: &Arc<ClusterNode>,
        shared: &Arc<Shared>,
        coordinator: &PgCoordinator,
        handover: &Handover,
    ) {
        let Some(data_dir) = &handover.data_dir else {
            return;
        };
        for (dir, manifest) in listed(&data_dir.join("moving")) {
            match coordinator.abort_move(&manifest.owner, manifest.epoch) {
                Ok(MoveState::Done) => {
                    let _ = remove_dir(&dir);
                    tracing::info!(owner = %manifest.owner, "deleted the copy of an owner moved away before the last stop");
                }
                Ok(_) => {
                    if let Err(e) = readopt(shared, handover, data_dir, &dir) {
                        tracing::error!(owner = %manifest.owner, dir = %dir.display(), error = %e,
                            "an owner whose move did not finish could not be served here again");
                    } else {
                        tracing::info!(owner = %manifest.owner, "an owner whose move did not finish before the last stop is served here again");
                    }
                }
                Err(e) => {
                    tracing::warn!(owner = %manifest.owner, error = %e, "cannot settle an interrupted move yet; its queues wait in {}", dir.display());
                    self.outgoing.insert(
                        manifest.owner.clone(),
                        Outgoing {
                            epoch: manifest.epoch,
                            deadline: Instant::now(),
                        },
                    );
                    node.view().set_leaving(&manifest.owner, true);
                }
            }
        }
        for (dir, manifest) in listed(&data_dir.join("incoming")) {
            let m = Move {
                owner: manifest.owner.clone(),
                epoch: manifest.epoch,
                from_node: String::new(),
                to_node: node.node_id().to_string(),
                state: MoveState::Exported,
            };
            match coordinator.abort_move(&m.owner, m.epoch) {
                Ok(MoveState::Done) => {
                    let _ = remove_dir(&dir);
                }
                Ok(_) => drop_taken(shared, handover, data_dir, &m),
                Err(_) => self.unsettled.push((m, false)),
            }
        }
    }
}

/// `moving/<owner>@<epoch>`: where an owner's queues wait while they are
/// handed over (the owner's name in hex: any CN makes a file name).
fn moving_dir(data_dir: &Path, owner: &str, epoch: u64) -> PathBuf {
    data_dir.join("moving").join(move_dir_name(owner, epoch))
}

/// `incoming/<owner>@<epoch>`: a hand-over being taken.
fn incoming_dir(data_dir: &Path, owner: &str, epoch: u64) -> PathBuf {
    data_dir.join("incoming").join(move_dir_name(owner, epoch))
}

/// `owner` in lowercase hex: a file name whatever the CN holds (named as
/// on shared storage).
pub(super) use ciphermq_cluster::shared_storage::owner_dir_name as owner_hex;

fn move_dir_name(owner: &str, epoch: u64) -> String {
    let mut name = owner_hex(owner);
    name.push('@');
    name.push_str(&epoch.to_string());
    name
}

/// The move directories under `parent` with their manifests (one without
/// a readable manifest is removed: it never got past its first step).
fn listed(parent: &Path) -> Vec<(PathBuf, Manifest)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return found;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        match read_manifest(&dir) {
            Ok(m) => found.push((dir, m)),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "removing a move directory without a manifest");
                let _ = remove_dir(&dir);
            }
        }
    }
    found
}

pub(super) fn read_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `bytes` to `path` durably (file and directory entry).
pub(super) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    ciphermq_datadir::sync_dir(ciphermq_datadir::parent_dir(path))
}

pub(super) fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    ciphermq_datadir::sync_dir(ciphermq_datadir::parent_dir(dir))
}

/// Runs `step` on shard `shard` and waits for its answer.
pub(super) fn on_shard<T: Send + 'static>(
    handover: &Handover,
    shard: usize,
    step: impl FnOnce(&mut ciphermq_shard::Shard, Instant) -> T + Send + 'static,
) -> Result<T, StepError> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let sent = handover
        .injector
        .run(shard as ciphermq_shard::ShardId, move |s, now| {
            let _ = tx.send(step(s, now));
        });
    if !sent {
        return Err(format!("shard {shard} has stopped"));
    }
    rx.recv_timeout(SHARD_WAIT).map_err(|_| {
        format!(
            "shard {shard} did not answer within {} s",
            SHARD_WAIT.as_secs()
        )
    })
}

/// Step 1 on the old node: waits out publishes already routed, freezes the
/// owner's queues, closes its connections, and moves the queues out of
/// their shard whole into the moving directory (with the manifest).
/// Returns that directory.
pub(super) fn stop_and_detach(
    shared: &Arc<Shared>,
    handover: &Handover,
    dir: &Path,
    owner: &str,
    epoch: u64,
) -> Result<PathBuf, StepError> {
    take_out(shared, handover, TakeOut::Into(dir, epoch), owner)?;
    Ok(dir.to_path_buf())
}

/// As [`stop_and_detach`], but the queues' files stay where they are: the
/// owner's logs are on shared storage, which the node now holding it has
/// fenced and reads.
pub(super) fn stop_and_forget(
    shared: &Arc<Shared>,
    handover: &Handover,
    owner: &str,
) -> Result<(), StepError> {
    take_out(shared, handover, TakeOut::Forget, owner)
}

/// What [`take_out`] does with an owner's queues once their logs stand
/// still.
enum TakeOut<'a> {
    /// They leave the shard into this directory, with a manifest of this
    /// epoch.
    Into(&'a Path, u64),
    /// They leave the shard, their files where they are.
    Forget,
    /// They stay in the shard, frozen, their files where they are; the
    /// manifest of this epoch goes into the directory (a move on shared
    /// storage, which the old node may still give up).
    Freeze(&'a Path, u64),
}

/// Stops serving `owner` here and, once its queues' logs stand still,
/// does with its queues what `how` says.
fn take_out(
    shared: &Arc<Shared>,
    handover: &Handover,
    how: TakeOut<'_>,
    owner: &str,
) -> Result<(), StepError> {
    let shards = handover.injector.shards();
    let home = shard_of(owner, shards) as usize;
    // Every shard has seen the owner leave once it handled the barrier
    // step; what it routed before is in the home shard's inbox ahead of
    // its barrier.
    let (tx, rx) = crossbeam_channel::bounded(shards);
    for shard in 0..shards {
        let done = tx.clone();
        let sent = handover
            .injector
            .run(shard as ciphermq_shard::ShardId, move |s, _| {
                s.barrier(home as ciphermq_shard::ShardId, done);
            });
        if !sent {
            return Err(format!("shard {shard} has stopped"));
        }
    }
    for _ in 0..shards {
        rx.recv_timeout(SHARD_WAIT)
            .map_err(|_| "a shard did not pass the move's barrier in time".to_owned())?;
    }
    let owned = owner.to_owned();
    let names = on_shard(handover, home, move |s, _| {
        let names = s.owner_queues(&owned);
        s.freeze(&names);
        names
    })?;
    // A receiver's connections end here (their unacked deliveries come
    // again from the new node); an admin owning queues is not cut off,
    // least of all the connection that asked for the move.
    if shared.policy.current().acl.role_of(owner) == crate::access::acl::Role::Receiver {
        shared.policy.close_connections_of(owner);
    }
    let keep_in = match how {
        TakeOut::Into(dir, epoch) | TakeOut::Freeze(dir, epoch) => {
            let manifest = Manifest::of(&shared.topology.snapshot(), owner, epoch, &names);
            let dir = dir.to_path_buf();
            remove_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            ciphermq_datadir::create_dir_all(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let text = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
            write_durably(&dir.join(MANIFEST), &text)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            Some(dir)
        }
        TakeOut::Forget => None,
    };
    let detach = !matches!(how, TakeOut::Freeze(..));
    // Once its logs stand still, the queues leave the shard.
    let deadline = Instant::now() + QUIET_WAIT;
    let pendings = loop {
        let step_names = names.clone();
        let keep_in = keep_in.clone();
        let detached = on_shard(handover, home, move |s, _| {
            if !s.is_quiet(&step_names) {
                return None;
            }
            if !detach {
                return Some(Vec::new());
            }
            Some(s.detach(&step_names, &|name: &str| {
                keep_in.as_ref().map(|dir| dir.join(name))
            }))
        })?;
        if let Some(pendings) = detached {
            break pendings;
        }
        if Instant::now() >= deadline {
            let names = names.clone();
            let _ = on_shard(handover, home, move |s, now| s.thaw(&names, now));
            return Err(format!(
                "its queues' logs did not stand still within {} s",
                QUIET_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    if !detach {
        return Ok(());
    }
    for (name, moved) in names.iter().zip(pendings) {
        if let Err(e) = futures_lite::future::block_on(moved) {
            return Err(format!("queue {name}: log directory not moved aside: {e}"));
        }
    }
    for name in &names {
        let change = TopologyChange::DeleteQueue {
            name: name.to_string(),
            by: Actor::Admin,
        };
        let _ = futures_lite::future::block_on(shared.topology.submit(change));
        let removed = TopologyChange::QueueRemoved {
            name: name.to_string(),
        };
        let _ = futures_lite::future::block_on(shared.topology.submit(removed));
    }
    Ok(())
}

/// The owner's queues and their bindings, from the topology.
/// The hand-over of a moving directory: [`MAGIC`], then each file as
/// (u32 path length, path, u64 length, bytes), the manifest first, and a
/// zero path length at the end.
pub(super) fn pack(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    let mut add = |path: &str, bytes: &[u8]| {
        out.extend_from_slice(&(path.len() as u32).to_be_bytes());
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    add(MANIFEST, &std::fs::read(dir.join(MANIFEST))?);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let queue = entry.file_name().to_string_lossy().into_owned();
        for file in std::fs::read_dir(entry.path())? {
            let file = file?;
            if !file.file_type()?.is_file() {
                continue;
            }
            let name = file.file_name().to_string_lossy().into_owned();
            add(&format!("{queue}/{name}"), &std::fs::read(file.path())?);
        }
    }
    out.extend_from_slice(&0u32.to_be_bytes());
    Ok(out)
}

/// One file of a hand-over: its queue, its name, its bytes.
pub(super) type HandedFile<'a> = (String, String, &'a [u8]);

/// The files of a hand-over, checked: each path is `manifest.json` or
/// `<queue>/<file>` with a queue the manifest lists and a plain file name.
pub(super) fn unpack(archive: &[u8]) -> Result<(Manifest, Vec<HandedFile<'_>>), String> {
    let bad = |why: &str| format!("hand-over is damaged: {why}");
    let rest = archive
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| bad("no header"))?;
    let mut at = rest;
    let mut manifest: Option<Manifest> = None;
    let mut files = Vec::new();
    loop {
        let (len, tail) = at
            .split_first_chunk::<4>()
            .ok_or_else(|| bad("truncated"))?;
        let len = u32::from_be_bytes(*len) as usize;
        if len == 0 {
            break;
        }
        if tail.len() < len {
            return Err(bad("truncated path"));
        }
        let (path, tail) = tail.split_at(len);
        let path = std::str::from_utf8(path).map_err(|_| bad("path not UTF-8"))?;
        let (size, tail) = tail
            .split_first_chunk::<8>()
            .ok_or_else(|| bad("truncated"))?;
        let size = usize::try_from(u64::from_be_bytes(*size)).map_err(|_| bad("size"))?;
        if tail.len() < size {
            return Err(bad("truncated file"));
        }
        let (bytes, tail) = tail.split_at(size);
        at = tail;
        if path == MANIFEST {
            manifest = Some(serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?);
            continue;
        }
        let (queue, file) = path.split_once('/').ok_or_else(|| bad("path"))?;
        let plain = |s: &str| {
            !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
        };
        if !plain(queue) || !plain(file) {
            return Err(bad(&format!("path {path:?}")));
        }
        files.push((queue.to_owned(), file.to_owned(), bytes));
    }
    let manifest = manifest.ok_or_else(|| bad("no manifest"))?;
    for (queue, _, _) in &files {
        if !manifest.queues.iter().any(|q| q.name == *queue) {
            return Err(bad(&format!("queue {queue:?} is not in its manifest")));
        }
    }
    for q in &manifest.queues {
        if !ciphermq_proto::name::is_valid_name(&q.name) {
            return Err(bad(&format!("queue name {:?}", q.name)));
        }
    }
    Ok((manifest, files))
}

/// Step 3 on the new node: reads the hand-over, writes its queues under
/// `queues/` and serves them (not yet to clients: the placement is still
/// the old node's). Returns the queue names.
fn take(
    shared: &Arc<Shared>,
    coordinator: &PgCoordinator,
    handover: &Handover,
    data_dir: &Path,
    m: &Move,
) -> Result<Vec<String>, StepError> {
    let archive = handed_over(coordinator, m)?;
    let (manifest, files) = unpack(&archive)?;
    check_handed(shared, data_dir, &manifest, m)?;
    // From here on a failure drops what was taken (the manifest says what).
    let incoming = incoming_dir(data_dir, &m.owner, m.epoch);
    stage(&incoming, &manifest, &files)?;
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    // Into `queues/`, then served: a restart from here on finds them listed
    // in the topology, and settles them against the row.
    for q in &manifest.queues {
        let staged = incoming.join(&q.name);
        let target = ciphermq_shard::log::queue_dir(data_dir, &q.name);
        std::fs::rename(&staged, &target).map_err(|e| io(&target, e))?;
    }
    let queues = data_dir.join("queues");
    ciphermq_datadir::sync_dir(&queues).map_err(|e| io(&queues, e))?;
    serve(shared, handover, data_dir, &manifest)?;
    Ok(manifest.queues.iter().map(|q| q.name.clone()).collect())
}

/// Step 3 on the new node of a move on shared storage: the hand-over holds
/// only the manifest; its queues and bindings are declared here, empty
/// (their logs are the old node's copy, fenced and adopted once the move
/// has finished). Returns the queue names.
fn declare_handed(
    shared: &Arc<Shared>,
    coordinator: &PgCoordinator,
    data_dir: &Path,
    m: &Move,
) -> Result<Vec<String>, StepError> {
    let archive = handed_over(coordinator, m)?;
    let (manifest, files) = unpack(&archive)?;
    if !files.is_empty() {
        return Err("a hand-over on shared storage carries queue files".to_owned());
    }
    check_handed(shared, data_dir, &manifest, m)?;
    // The manifest is kept where a failure (or a restart) finds what to
    // drop.
    stage(&incoming_dir(data_dir, &m.owner, m.epoch), &manifest, &[])?;
    manifest.declare(shared)?;
    Ok(manifest.queues.iter().map(|q| q.name.clone()).collect())
}

/// The hand-over of move `m`, its parts read from PostgreSQL.
fn handed_over(coordinator: &PgCoordinator, m: &Move) -> Result<Vec<u8>, StepError> {
    let mut archive = Vec::new();
    for part in 0u32.. {
        match coordinator
            .handoff(&m.owner, m.epoch, part)
            .map_err(|e| e.to_string())?
        {
            Some(bytes) => archive.extend_from_slice(&bytes),
            None => break,
        }
    }
    Ok(archive)
}

/// Refuses a hand-over of another move, one listing another owner's
/// queues, or one whose queues exist here already.
fn check_handed(
    shared: &Shared,
    data_dir: &Path,
    manifest: &Manifest,
    m: &Move,
) -> Result<(), StepError> {
    if manifest.owner != m.owner || manifest.epoch != m.epoch {
        return Err("hand-over is of another move".to_owned());
    }
    let policy = shared.policy.current();
    manifest.foreign_queue(|queue| policy.acl.queue_owner(queue))?;
    for q in &manifest.queues {
        let target = ciphermq_shard::log::queue_dir(data_dir, &q.name);
        if target.exists() || shared.topology.snapshot().queue(&q.name).is_some() {
            return Err(format!(
                "queue {} exists on this node already ({}): delete it before moving its owner here",
                q.name,
                target.display()
            ));
        }
    }
    Ok(())
}

/// Writes an unpacked hand-over under `dir` (emptied first), durably: its
/// manifest, then a directory per queue with that queue's files.
pub(super) fn stage(
    dir: &Path,
    manifest: &Manifest,
    files: &[HandedFile<'_>],
) -> Result<(), StepError> {
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    remove_dir(dir).map_err(|e| io(dir, e))?;
    ciphermq_datadir::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let text = serde_json::to_vec(manifest).map_err(|e| e.to_string())?;
    write_durably(&dir.join(MANIFEST), &text).map_err(|e| io(dir, e))?;
    for q in &manifest.queues {
        let queue = dir.join(&q.name);
        ciphermq_datadir::create_dir_all(&queue).map_err(|e| io(&queue, e))?;
    }
    for (queue, file, bytes) in files {
        let path = dir.join(queue).join(file);
        write_durably(&path, bytes).map_err(|e| io(&path, e))?;
    }
    Ok(())
}

/// Serves again, here, the queues of a moving directory whose move was
/// given up: back under `queues/`, declared, restored.
fn readopt(
    shared: &Arc<Shared>,
    handover: &Handover,
    data_dir: &Path,
    dir: &Path,
) -> Result<(), StepError> {
    let manifest = read_manifest(dir)?;
    for q in &manifest.queues {
        let from = dir.join(&q.name);
        let target = ciphermq_shard::log::queue_dir(data_dir, &q.name);
        if from.exists() {
            std::fs::rename(&from, &target).map_err(|e| format!("{}: {e}", target.display()))?;
        }
    }
    let queues = data_dir.join("queues");
    ciphermq_datadir::sync_dir(&queues).map_err(|e| format!("{}: {e}", queues.display()))?;
    serve(shared, handover, data_dir, &manifest)?;
    remove_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(())
}

/// Declares the manifest's queues and bindings here and restores the
/// queues from their directories under `queues/`.
fn serve(
    shared: &Arc<Shared>,
    handover: &Handover,
    data_dir: &Path,
    manifest: &Manifest,
) -> Result<(), StepError> {
    manifest.declare(shared)?;
    let shards = handover.injector.shards();
    let home = shard_of(&manifest.owner, shards) as usize;
    for q in &manifest.queues {
        let dir = ciphermq_shard::log::queue_dir(data_dir, &q.name);
        if !dir.exists() {
            continue;
        }
        let recovered = recover_queue(&dir, &handover.dedup_hasher, handover.window_ms)
            .map_err(|e| format!("queue {}: {}: {e}", q.name, dir.display()))?;
        let name: Arc<str> = Arc::from(q.name.as_str());
        on_shard(handover, home, move |s, now| {
            // A queue a restart already recovered (its move stopped before
            // its directory left) is served as it is.
            if !s.holds_queue(&name) {
                s.restore_queue(name.clone(), recovered, now);
            }
            s.thaw(&[name], now);
        })?;
    }
    Ok(())
}

/// Serves again the owner's queues still frozen in their shard (a move
/// given up before they left it).
fn thaw_owner(shared: &Arc<Shared>, handover: &Handover, owner: &str) {
    let _ = shared;
    let home = shard_of(owner, handover.injector.shards()) as usize;
    let owner = owner.to_owned();
    let _ = on_shard(handover, home, move |s, now| {
        let names = s.owner_queues(&owner);
        s.thaw(&names, now);
    });
}

/// Drops what a new node took for a move that did not finish: the queues
/// leave the topology and the shard, their directories go, as a
/// `delete_queue` would.
fn drop_taken(shared: &Arc<Shared>, handover: &Handover, data_dir: &Path, m: &Move) {
    if let Some(cluster) = &shared.cluster {
        cluster.view().set_arriving(&m.owner, None);
    }
    let incoming = incoming_dir(data_dir, &m.owner, m.epoch);
    let Ok(manifest) = read_manifest(&incoming) else {
        let _ = remove_dir(&incoming);
        return;
    };
    let submit =
        |change: TopologyChange| futures_lite::future::block_on(shared.topology.submit(change));
    for q in &manifest.queues {
        let Some(info) = shared.topology.snapshot().queue(&q.name).cloned() else {
            // Never declared here: only its directory, if it got that far.
            let _ = remove_dir(&ciphermq_shard::log::queue_dir(data_dir, &q.name));
            continue;
        };
        if submit(TopologyChange::DeleteQueue {
            name: q.name.clone(),
            by: Actor::Admin,
        })
        .is_err()
        {
            continue;
        }
        let removed = on_shard(handover, info.shard as usize, move |s, _| {
            let (removed, done) = ciphermq_shard::pending::pending();
            s.delete_queue(&info, done);
            removed
        });
        if let Ok(removed) = removed {
            if futures_lite::future::block_on(removed).is_ok() {
                let _ = submit(TopologyChange::QueueRemoved {
                    name: q.name.clone(),
                });
            }
        }
    }
    let _ = remove_dir(&incoming);
    tracing::info!(owner = %m.owner, "dropped what was taken for a move that did not finish");
}

#[cfg(test)]
mod tests {
    use super::super::manifest::QueueEntry;
    use super::*;

    fn manifest(owner: &str, queues: &[&str]) -> Manifest {
        Manifest {
            owner: owner.to_owned(),
            epoch: 1,
            queues: queues
                .iter()
                .map(|name| QueueEntry {
                    name: (*name).to_owned(),
                    bindings: Vec::new(),
                })
                .collect(),
        }
    }

    /// The ACL's rule, for two receivers.
    fn owner_of(queue: &str) -> Option<&'static str> {
        ["receiver_1", "receiver_2"]
            .into_iter()
            .find(|cn| queue.strip_prefix(cn).is_some_and(|r| r.starts_with('_')))
    }

    #[test]
    fn a_hand_over_may_list_only_the_owners_queues() {
        let own = manifest("receiver_1", &["receiver_1_queue", "receiver_1_queue.dlq"]);
        assert_eq!(own.foreign_queue(owner_of), Ok(()));
        // An admin's queue names no receiver: its recorded owner stands.
        assert_eq!(
            manifest("admin", &["audit"]).foreign_queue(owner_of),
            Ok(())
        );
        let stolen = manifest("receiver_1", &["receiver_1_queue", "receiver_2_queue"]);
        let e = stolen.foreign_queue(owner_of).unwrap_err();
        assert!(
            e.contains("receiver_2_queue") && e.contains("belongs to receiver_2"),
            "{e}"
        );
    }

    #[test]
    fn a_damaged_hand_over_is_refused_never_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest("receiver_1", &["receiver_1_queue"]);
        std::fs::write(dir.path().join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        std::fs::create_dir(dir.path().join("receiver_1_queue")).unwrap();
        std::fs::write(
            dir.path().join("receiver_1_queue").join("0.log"),
            b"records",
        )
        .unwrap();
        let archive = pack(dir.path()).unwrap();
        let (back, files) = unpack(&archive).unwrap();
        assert_eq!(back.owner, "receiver_1");
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0].0.as_str(), files[0].1.as_str(), files[0].2),
            ("receiver_1_queue", "0.log", &b"records"[..])
        );
        // Every truncation is an error, not a panic or a short read.
        for cut in 0..archive.len() {
            assert!(unpack(&archive[..cut]).is_err(), "cut at {cut}");
        }
        // A path leaving its queue directory, or a queue not in the
        // manifest, is refused.
        for path in ["receiver_1_queue/../x", "../x/y", "receiver_2_queue/0.log"] {
            let mut bad = MAGIC.to_vec();
            let mut add = |p: &str, b: &[u8]| {
                bad.extend_from_slice(&(p.len() as u32).to_be_bytes());
                bad.extend_from_slice(p.as_bytes());
                bad.extend_from_slice(&(b.len() as u64).to_be_bytes());
                bad.extend_from_slice(b);
            };
            add(MANIFEST, &serde_json::to_vec(&m).unwrap());
            add(path, b"x");
            bad.extend_from_slice(&0u32.to_be_bytes());
            assert!(unpack(&bad).is_err(), "{path}");
        }
    }
}
