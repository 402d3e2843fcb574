//! What a node asks of the cluster's coordinator, whatever stores it.

use std::time::Duration;

use crate::error::ClusterError;
use crate::watch::Suspect;

/// A live member of the cluster, as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's stable name (`cluster.node_id`).
    pub node_id: String,
    /// Where clients are redirected to reach it (`host:port`).
    pub advertise: String,
    /// Which start of the node this is: it rises on every registration, so
    /// a restarted node and a stale process with the same id are told apart.
    pub incarnation: u64,
    /// Time since its last heartbeat, measured on the coordinator's clock
    /// (not the caller's), so nodes with skewed clocks still agree.
    pub heartbeat_age: Duration,
    /// Its last heartbeat as stored (microseconds since the Unix epoch on
    /// the coordinator's clock). Failure detection only compares it: a
    /// watcher times how long it stays unchanged on its own clock
    /// ([`HeartbeatWatch`](crate::watch::HeartbeatWatch)).
    pub heartbeat_stamp: i64,
}

/// A node declared dead, as recorded ([`Coordinator::recent_takeovers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeoverRecord {
    /// The node declared dead.
    pub node_id: String,
    /// Its incarnation then.
    pub incarnation: u64,
    /// The node that declared it.
    pub by_node: String,
    /// How long ago, on the coordinator's clock.
    pub age: Duration,
    /// How many owners went to other nodes.
    pub owners: u32,
    /// Why, as the declaring node wrote it.
    pub reason: String,
}

/// A backlog offered back by a node that lost its owner while away
/// ([`Coordinator::offer_handback`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handback {
    /// The owner.
    pub owner: String,
    /// The node that held the backlog.
    pub from_node: String,
    /// How many parts it is in.
    pub parts: u32,
}

/// A node declared dead and where its owners went
/// ([`Coordinator::declare_dead`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    /// The node declared dead.
    pub node_id: String,
    /// Its incarnation then: a later registration of the same id is a
    /// new start, holding nothing.
    pub incarnation: u64,
    /// Each of its owners at its new node and epoch (one higher), by
    /// owner.
    pub placements: Vec<Placement>,
}

/// Where an owner lives: the answer to `locate` and the target of a
/// redirect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The receiver CN whose queues, bindings and dedup state move together.
    pub owner: String,
    /// The node that holds it.
    pub node_id: String,
    /// That node's advertised address, as registered now.
    pub advertise: String,
    /// The fencing token: 1 when first placed, +1 on every move, never
    /// lower. A node never accepts a placement with a lower epoch than one
    /// it has seen.
    pub epoch: u64,
    /// The change counter of this placement's last change: higher than that
    /// of every earlier change to any placement. It lets a node mirror all
    /// placements by polling only for newer ones.
    pub version: u64,
}

/// Placement changes newer than a version, for a node's in-memory mirror.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlacementChanges {
    /// The placements changed since the version asked for, by rising
    /// `version` (each owner once, in its current state).
    pub placements: Vec<Placement>,
    /// The version to ask from next time: the highest seen, or the one
    /// asked for when nothing changed.
    pub version: u64,
}

/// An exchange of the cluster-wide catalogue, so an exchange declared on one
/// node is usable on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// Its name.
    pub name: String,
    /// Its type as the broker names it (`direct`, `fanout`, `topic`); the
    /// coordinator only compares it.
    pub kind: String,
    /// The CN that declared it first, who alone may delete it.
    pub owner: String,
}

/// Where a move of an owner stands ([`Coordinator::request_move`] and
/// after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveState {
    /// Asked for: the owner's node is to stop serving it and export it.
    Requested,
    /// Its data is in the coordinator: the new node is to import it.
    Exported,
    /// The placement moved (epoch + 1): the old node deletes its copy.
    Done,
    /// Given up: the old node serves the owner again, the new one drops
    /// what it imported.
    Aborted,
}

impl MoveState {
    /// The word stored.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveState::Requested => "requested",
            MoveState::Exported => "exported",
            MoveState::Done => "done",
            MoveState::Aborted => "aborted",
        }
    }

    /// The state a stored word names.
    pub fn parse(word: &str) -> Option<MoveState> {
        Some(match word {
            "requested" => MoveState::Requested,
            "exported" => MoveState::Exported,
            "done" => MoveState::Done,
            "aborted" => MoveState::Aborted,
            _ => return None,
        })
    }
}

/// One move of an owner from the node holding it at `epoch` to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The owner moved.
    pub owner: String,
    /// The epoch it leaves (the new node gets `epoch + 1`).
    pub epoch: u64,
    /// The node it leaves.
    pub from_node: String,
    /// The node it goes to.
    pub to_node: String,
    /// Where the move stands.
    pub state: MoveState,
}

/// The coordinator's operations, independent of what stores them.
///
/// Calls block until the coordinator answers: they are made from a node's
/// coordinator thread, never from a shard, so the ACK path never waits on
/// the coordinator. Every failure is a [`ClusterError`] naming the node,
/// owner or table involved; bad input is an error, never a panic.
pub trait Coordinator: Send + Sync {
    /// Joins (or rejoins) the cluster: records `node_id` at `advertise`,
    /// alive, heartbeat now, with an incarnation higher than any earlier
    /// registration of the same id, and returns that incarnation. The
    /// caller's later heartbeats carry it.
    fn register(&self, node_id: &str, advertise: &str) -> Result<u64, ClusterError>;

    /// Refreshes the node's heartbeat. Fails with [`ClusterError::Fenced`]
    /// when the node id was registered again since (another process took
    /// it): the caller must stop acting as that node; and with
    /// [`ClusterError::DeclaredDead`] when another node declared it dead
    /// meanwhile: the caller holds no owner any more and must register
    /// again.
    fn heartbeat(&self, node_id: &str, incarnation: u64) -> Result<(), ClusterError>;

    /// The live nodes, sorted by node id (byte order), for the `nodes`
    /// command.
    fn nodes(&self) -> Result<Vec<NodeInfo>, ClusterError>;

    /// Where `owner` lives, placing it on `preferred_node` (epoch 1) when it
    /// has no node yet. Concurrent callers, on any nodes, all get the same
    /// answer: only one insert can win. A `preferred_node` that is not a
    /// live registered node fails with [`ClusterError::UnknownNode`].
    fn place(&self, owner: &str, preferred_node: &str) -> Result<Placement, ClusterError>;

    /// Where `owner` lives, or `None` if it has no node yet; never places.
    fn locate(&self, owner: &str) -> Result<Option<Placement>, ClusterError>;

    /// Placements changed after `version` (0: all of them), cheap enough to
    /// poll: a node keeps owner → (node, epoch) in memory and applies these.
    fn placements_since(&self, version: u64) -> Result<PlacementChanges, ClusterError>;

    /// Moves `owner` to `to_node` if its epoch is still `expected_epoch`
    /// (compare-and-set), with epoch `expected_epoch + 1`. Only the
    /// placement changes here; handing its data over is the caller's.
    /// Fails with [`ClusterError::StaleEpoch`] when someone moved it first,
    /// [`ClusterError::NotPlaced`] or [`ClusterError::UnknownNode`].
    fn move_owner(
        &self,
        owner: &str,
        to_node: &str,
        expected_epoch: u64,
    ) -> Result<Placement, ClusterError>;

    /// Asks for `owner` to move to `to_node`: records a move of its current
    /// epoch in state [`MoveState::Requested`] (a move of that epoch that
    /// was aborted is asked again). `to_node` must have heartbeated within
    /// `fresh_within` (a lease): a node that stopped is no place to move
    /// to. Fails with [`ClusterError::NotPlaced`],
    /// [`ClusterError::AlreadyThere`], [`ClusterError::UnknownNode`] (not
    /// a live node), [`ClusterError::StaleNode`] or
    /// [`ClusterError::MoveUnderWay`].
    fn request_move(
        &self,
        owner: &str,
        to_node: &str,
        fresh_within: Duration,
    ) -> Result<Move, ClusterError>;

    /// The moves `node_id` has work in, or soon will: those leaving it
    /// still [`MoveState::Requested`], and those coming to it
    /// [`MoveState::Requested`] or [`MoveState::Exported`]. One
    /// statement, cheap enough to poll.
    fn pending_moves(&self, node_id: &str) -> Result<Vec<Move>, ClusterError>;

    /// The move of `owner` leaving `epoch`, if one was recorded.
    fn move_of(&self, owner: &str, epoch: u64) -> Result<Option<Move>, ClusterError>;

    /// Stores part `part` (from 0) of a requested move's data.
    fn put_handoff(
        &self,
        owner: &str,
        epoch: u64,
        part: u32,
        data: Vec<u8>,
    ) -> Result<(), ClusterError>;

    /// Marks a requested move [`MoveState::Exported`] once its `parts`
    /// parts are stored; fails with [`ClusterError::MoveEnded`] when it
    /// was aborted meanwhile.
    fn exported(&self, owner: &str, epoch: u64, parts: u32) -> Result<(), ClusterError>;

    /// Part `part` of an exported move's data (`None` past the last).
    fn handoff(&self, owner: &str, epoch: u64, part: u32) -> Result<Option<Vec<u8>>, ClusterError>;

    /// Finishes an exported move in one transaction: the move becomes
    /// [`MoveState::Done`], the placement goes to its new node at epoch
    /// `epoch + 1`, and its data leaves the coordinator. Fails with
    /// [`ClusterError::MoveEnded`] when it was aborted first.
    fn finish_move(&self, owner: &str, epoch: u64) -> Result<Placement, ClusterError>;

    /// Aborts a move not finished yet and drops its data. Returns the
    /// state it ends in: [`MoveState::Aborted`], or [`MoveState::Done`]
    /// when it was finished first (the caller then acts on that).
    fn abort_move(&self, owner: &str, epoch: u64) -> Result<MoveState, ClusterError>;

    /// Declares an exchange cluster-wide. The first declaration wins and is
    /// returned; a later one of the same kind gets that stored row (whoever
    /// declared it), one of another kind fails with
    /// [`ClusterError::ExchangeKindConflict`].
    fn declare_exchange(
        &self,
        name: &str,
        kind: &str,
        owner: &str,
    ) -> Result<Exchange, ClusterError>;

    /// Every declared exchange, sorted by name.
    fn exchanges(&self) -> Result<Vec<Exchange>, ClusterError>;

    /// Deletes an exchange, if `owner` is the one who declared it.
    fn delete_exchange(&self, name: &str, owner: &str) -> Result<(), ClusterError>;

    /// Stores part `part` (from 0) of the backlog `from_node` gives back
    /// for `owner`.
    fn put_handback_part(
        &self,
        owner: &str,
        from_node: &str,
        part: u32,
        data: Vec<u8>,
    ) -> Result<(), ClusterError>;

    /// Offers the backlog of `owner` stored in `parts` parts to whichever
    /// node holds the owner (parts beyond are dropped; an earlier offer,
    /// done or not, is replaced).
    fn offer_handback(&self, owner: &str, from_node: &str, parts: u32) -> Result<(), ClusterError>;

    /// The backlogs offered to `node_id` (for owners placed on it), not
    /// taken yet. One statement, cheap enough to poll.
    fn handbacks_for(&self, node_id: &str) -> Result<Vec<Handback>, ClusterError>;

    /// Part `part` of an offered backlog (`None` past the last).
    fn handback_part(
        &self,
        owner: &str,
        from_node: &str,
        part: u32,
    ) -> Result<Option<Vec<u8>>, ClusterError>;

    /// Marks an offered backlog taken (every message of it is on the taker's
    /// disk) and drops its parts; the node that offered it then deletes
    /// its copy.
    fn finish_handback(&self, owner: &str, from_node: &str) -> Result<(), ClusterError>;

    /// Whether the backlog `from_node` offered for `owner` was taken
    /// (`Some(true)`), is still offered (`Some(false)`), or was never
    /// offered (`None`).
    fn handback_taken(&self, owner: &str, from_node: &str) -> Result<Option<bool>, ClusterError>;

    /// Records `owner`'s queues and bindings (`data`, opaque here) as its
    /// node at `epoch` sees them. A write from an epoch lower than the one
    /// stored is ignored (a node that lost the owner cannot overwrite its
    /// new node's record); returns whether it was stored.
    fn put_owner_topology(
        &self,
        owner: &str,
        epoch: u64,
        data: Vec<u8>,
    ) -> Result<bool, ClusterError>;

    /// `owner`'s queues and bindings as last recorded, with the epoch of
    /// the node that recorded them; `None` if never recorded.
    fn owner_topology(&self, owner: &str) -> Result<Option<(u64, Vec<u8>)>, ClusterError>;

    /// The last `limit` nodes declared dead, newest first.
    fn recent_takeovers(&self, limit: u32) -> Result<Vec<TakeoverRecord>, ClusterError>;

    /// Declares `suspect` dead, in one transaction, if its row is still
    /// exactly as the watcher saw it (same incarnation, same heartbeat,
    /// alive): marks it dead, gives each of its owners to one of the other
    /// nodes that heartbeated within `fresh_within` (round robin by node
    /// id, owners by name), at epoch + 1, aborts their moves under way,
    /// and records the takeover with `by_node` and `reason`. Fails with
    /// [`ClusterError::StillAlive`] when the row changed (the node beat
    /// again, restarted, or someone declared it first), and with
    /// [`ClusterError::NoLiveNode`] when no other node is fresh enough to
    /// take its owners (nothing changes then).
    fn declare_dead(
        &self,
        suspect: &Suspect,
        by_node: &str,
        reason: &str,
        fresh_within: Duration,
    ) -> Result<Takeover, ClusterError>;
}
