//! The coordinator thread: the node's only link to PostgreSQL. It joins the
//! cluster, then loops: sessions' requests as they come, and every
//! [`POLL`] a tick that heartbeats (every third of the lease), reads
//! placement changes newer than the last version seen and the moves this
//! node has work in (`moves`), and, every [`REFRESH`], the live nodes and
//! the exchange catalogue.
//!
//! It also writes each owner's queues and bindings to the owner catalogue
//! when they change (`catalogue`), and declares them for owners taken over
//! from a dead node before applying their placements (`takeover`), and,
//! every [`REFRESH`], gives back or takes backlogs of owners a node lost
//! while away (`handback`).
//!
//! The statements it runs do not depend on the publish rate: a tick is at
//! most six statements whatever the traffic, plus one per owner whose
//! queues or bindings changed, was taken over, or has a backlog to give
//! back or take (ticks come every 20 ms instead of [`POLL`] only while a
//! move is under way). A failed call is logged (at most once per outage)
//! and the snapshot kept; the next tick tries again.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ciphermq_cluster::{ClusterError, Coordinator, HeartbeatWatch, NodeInfo, PgCoordinator};
use ciphermq_proto::ExchangeKind;
use ciphermq_shard::topology::TopologyChange;
use crossbeam_channel::{Receiver, RecvTimeoutError};

use ciphermq_admin::cluster_status::MAX_TAKEOVER_ROWS;

use super::adoption::Adopter;
use super::catalogue::OwnerCatalogue;
use super::handback::Handbacks;
use super::moves::{Handover, Moves};
use super::{ClusterNode, ClusterStartError, Job};
use crate::access::acl::Role;
use crate::runtime::context::Shared;

/// How often placement changes are polled.
const POLL: Duration = Duration::from_millis(200);

/// How often the node list and the exchange catalogue are read again: an
/// exchange declared on one node is usable on every node within it.
const REFRESH: Duration = Duration::from_millis(500);

/// The recorded takeovers (for `/api/cluster`) are read every this many
/// refreshes (2 s).
const TAKEOVERS_EVERY: u32 = 4;

/// A gap between two ticks longer than this means the thread did not run
/// (the process was paused, or a call hung): what the heartbeat watch saw
/// before it no longer counts.
const TICK_GAP: Duration = Duration::from_secs(1);

/// Pause between connection attempts while joining.
const RETRY: Duration = Duration::from_millis(250);

/// The thread's state.
struct Link {
    node: Arc<ClusterNode>,
    shared: Weak<Shared>,
    coordinator: PgCoordinator,
    incarnation: u64,
    /// The highest placement version applied.
    version: u64,
    last_heartbeat: Instant,
    last_refresh: Instant,
    /// Whether the last call failed, so an outage is logged once.
    failing: bool,
    /// The exchanges the catalogue held at the last read: one that appears
    /// is declared here, one that disappears is deleted here.
    catalogue: HashSet<String>,
    /// Moves this node takes part in.
    moves: Moves,
    handover: Handover,
    /// What this node last wrote of its owners' queues and bindings.
    owners: OwnerCatalogue,
    /// Backlogs of owners this node lost, given back.
    handbacks: Handbacks,
    /// The other nodes' heartbeats, for declaring dead ones.
    watch: HeartbeatWatch,
    /// When the last tick started.
    last_tick: Instant,
    /// Refreshes since the recorded takeovers were last read.
    refreshes: u32,
    /// With `cluster.storage = "shared"`: fences and adopts the copies of
    /// owners placed here.
    adopter: Option<Adopter>,
}

/// Joins the cluster, reports on `ready`, then serves until [`Job::Stop`]
/// or until every sender is gone.
pub(super) fn run(
    node: Arc<ClusterNode>,
    shared: Weak<Shared>,
    handover: Handover,
    jobs: Receiver<Job>,
    ready: Sender<Result<(), ClusterStartError>>,
) {
    let mut link = match Link::join(node, shared, handover) {
        Ok(link) => link,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut next_tick = Instant::now() + POLL;
    loop {
        let wait = next_tick.saturating_duration_since(Instant::now());
        match jobs.recv_timeout(wait) {
            Ok(Job::Stop) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(job) => link.serve(job),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() >= next_tick {
            link.tick();
            let pace = if link.moves.busy() {
                super::moves::MOVE_POLL
            } else {
                POLL
            };
            next_tick = Instant::now() + pace;
        }
    }
    tracing::info!(node_id = %link.node.node_id, "cluster coordinator link stopped");
}

impl Link {
    /// Connects (retrying until `database.connect_timeout_secs`), registers
    /// and loads the snapshot; claims the owners whose queues this node's
    /// disk holds.
    fn join(
        node: Arc<ClusterNode>,
        shared: Weak<Shared>,
        handover: Handover,
    ) -> Result<Link, ClusterStartError> {
        let deadline = Instant::now() + node.connect_timeout;
        let coordinator = loop {
            match PgCoordinator::connect(node.coordinator.clone()) {
                Ok(c) => break c,
                Err(e @ ClusterError::Connect { .. }) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "cluster coordinator: retrying");
                    std::thread::sleep(RETRY);
                }
                Err(e) => return Err(e.into()),
            }
        };
        let advertise = node.advertise().unwrap_or_default().to_owned();
        let sent_at = Instant::now();
        let incarnation = coordinator.register(&node.node_id, &advertise)?;
        // A registration is this node's first heartbeat.
        node.lease_gate().renewed(sent_at, node.lease);
        let adopter = match (node.shared_logs(), &handover.data_dir) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(ClusterStartError::SharedStorage(
                    "cluster.storage = \"shared\" needs storage.mode = \"durable\"".to_owned(),
                ))
            }
            (Some(_), Some(data_dir)) => {
                // Staged copies of a run that ended are staged again.
                let _ = super::moves::remove_dir(&data_dir.join("adopt-in"));
                Some(
                    Adopter::start(node.clone(), shared.clone(), handover.clone())
                        .map_err(|e| ClusterStartError::Thread(e.to_string()))?,
                )
            }
        };
        node.status
            .incarnation
            .store(incarnation, Ordering::Relaxed);
        node.status.connected.store(true, Ordering::Relaxed);
        let (node_id, lease) = (node.node_id.clone(), node.lease);
        let now = Instant::now();
        let mut link = Link {
            node,
            shared,
            coordinator,
            incarnation,
            version: 0,
            last_heartbeat: now,
            last_refresh: now,
            failing: false,
            catalogue: HashSet::new(),
            moves: Moves::default(),
            handover,
            owners: OwnerCatalogue::default(),
            handbacks: Handbacks::default(),
            watch: HeartbeatWatch::new(&node_id, lease),
            last_tick: now,
            refreshes: 0,
            adopter,
        };
        let changes = link.coordinator.placements_since(0)?;
        // Owners given to this node while it was away, or before it could
        // declare their queues, are taken first.
        link.apply(&changes.placements)?;
        link.version = changes.version;
        let nodes = link.coordinator.nodes()?;
        let live = nodes.len();
        link.node.set_nodes(nodes);
        link.sync_exchanges()?;
        link.claim_local_owners();
        if let Some(shared) = link.shared.upgrade() {
            link.moves
                .recover(&link.node, &shared, &link.coordinator, &link.handover);
        }
        link.handbacks
            .recover(&link.node, &link.coordinator, &link.handover)?;
        tracing::info!(
            node_id = %link.node.node_id,
            advertise = %advertise,
            incarnation,
            placements = link.node.view.current().1.len(),
            nodes = live,
            "joined the cluster"
        );
        Ok(link)
    }

    /// Counts a call and logs the first failure of an outage (and its end).
    fn note<T>(&mut self, what: &str, result: Result<T, ClusterError>) -> Option<T> {
        let status = &self.node.status;
        status.calls.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(value) => {
                if self.failing {
                    tracing::info!(node_id = %self.node.node_id, "cluster coordinator reachable again");
                    self.failing = false;
                }
                status.connected.store(true, Ordering::Relaxed);
                Some(value)
            }
            Err(e) => {
                status.failures.fetch_add(1, Ordering::Relaxed);
                // A link that failed did not watch the others the whole time.
                self.watch.link_lost();
                if matches!(
                    e,
                    ClusterError::Connect { .. }
                        | ClusterError::Query { .. }
                        | ClusterError::NoAnswer { .. }
                ) {
                    status.connected.store(false, Ordering::Relaxed);
                }
                if !self.failing {
                    tracing::warn!(node_id = %self.node.node_id, error = %e,
                        "cluster coordinator: cannot {what}; serving the owners this node holds, placements unchanged until it is back");
                    self.failing = true;
                }
                None
            }
        }
    }

    fn serve(&mut self, job: Job) {
        match job {
            Job::Place { owner, reply } => {
                let placed = self.coordinator.place(&owner, &self.node.node_id);
                let answer = match &placed {
                    Ok(p) => match self.apply(std::slice::from_ref(p)) {
                        Ok(()) => {
                            if *p.node_id == *self.node.node_id && p.epoch == 1 {
                                tracing::info!(owner = %p.owner, node_id = %p.node_id, "owner placed on this node");
                            }
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                };
                self.note("place an owner", placed);
                let _ = reply.send(answer);
            }
            Job::DeclareExchange {
                name,
                kind,
                declarer,
                reply,
            } => {
                let declared = self
                    .coordinator
                    .declare_exchange(&name, kind.as_str(), &declarer);
                let answer = match &declared {
                    // Worded as on a broker of its own.
                    Err(ClusterError::ExchangeKindConflict {
                        name, stored_kind, ..
                    }) => Err(format!("exchange {name} exists with type {stored_kind}")),
                    other => other.clone().map_err(|e| e.to_string()),
                };
                self.note("declare an exchange", declared);
                let _ = reply.send(answer);
            }
            Job::DeleteExchange { name } => {
                let deleted = self.delete_from_catalogue(&name);
                self.note("delete an exchange from the catalogue", deleted);
            }
            Job::Move {
                owner,
                to_node,
                reply,
            } => {
                let asked =
                    self.moves
                        .request(&self.coordinator, &owner, &to_node, self.node.lease, reply);
                // A refusal (unknown node, a move under way) is the
                // asker's answer, not an outage.
                if let Err(
                    e @ (ClusterError::Connect { .. }
                    | ClusterError::Query { .. }
                    | ClusterError::NoAnswer { .. }),
                ) = asked
                {
                    self.note("ask for a move", Err::<(), _>(e));
                }
            }
            Job::Stop => {}
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_tick) > TICK_GAP {
            self.watch.link_lost();
        }
        self.last_tick = now;
        if now.duration_since(self.last_heartbeat) >= self.node.lease / 3 {
            let sent_at = Instant::now();
            let beat = self
                .coordinator
                .heartbeat(&self.node.node_id, self.incarnation);
            if beat.is_ok() {
                self.node.lease_gate().renewed(sent_at, self.node.lease);
            }
            if beat.is_err()
                && !matches!(
                    beat,
                    Err(ClusterError::Connect { .. }
                        | ClusterError::Query { .. }
                        | ClusterError::NoAnswer { .. })
                )
            {
                // Declared dead or fenced: the lease is gone for good.
                self.node.lease_gate().revoke();
            }
            if let Err(e @ ClusterError::Fenced { .. }) = &beat {
                if !self.node.status.fenced.swap(true, Ordering::Relaxed) {
                    self.node.view.fence();
                    tracing::error!(node_id = %self.node.node_id, error = %e,
                        "this node's id was registered by another process: this broker serves no owner any more; stop it, or give one of them another cluster.node_id");
                }
            }
            if let Err(e @ ClusterError::DeclaredDead { .. }) = &beat {
                // Paused or cut off past the lease: the owners went
                // elsewhere. Join again, holding none of them; the next
                // placement read says where they live, and their backlogs
                // here are given back.
                tracing::warn!(node_id = %self.node.node_id, error = %e,
                    "this node was declared dead while it was silent; joining the cluster again");
                let advertise = self.node.advertise().unwrap_or_default().to_owned();
                let sent_at = Instant::now();
                match self.coordinator.register(&self.node.node_id, &advertise) {
                    Ok(incarnation) => {
                        self.node.lease_gate().renewed(sent_at, self.node.lease);
                        self.incarnation = incarnation;
                        self.node
                            .status
                            .incarnation
                            .store(incarnation, Ordering::Relaxed);
                        self.last_heartbeat = now;
                        tracing::warn!(node_id = %self.node.node_id, incarnation, "joined the cluster again");
                    }
                    Err(e) => {
                        self.note("join the cluster again", Err::<(), _>(e));
                    }
                }
            }
            if self.note("record a heartbeat", beat).is_some() {
                self.last_heartbeat = now;
            }
        }
        let changes = self.coordinator.placements_since(self.version);
        if let Some(changes) = self.note("read placement changes", changes) {
            let applied = self.apply(&changes.placements);
            if self.note("take owners over", applied).is_some() {
                self.version = changes.version.max(self.version);
            }
        }
        if let Some(shared) = self.shared.upgrade() {
            // Counted only when it wrote: most ticks find nothing changed.
            let written = self
                .owners
                .write_changes(&self.node, &shared, &self.coordinator);
            if !matches!(written, Ok(0)) {
                self.note("record the owners' queues", written);
            }
            let moved = self
                .moves
                .tick(&self.node, &shared, &self.coordinator, &self.handover);
            self.note("read the moves", moved);
            // Moved here on shared storage: taken as any placement read
            // (the old node's copy fenced and adopted first). Not applied
            // now, they are when read.
            let arrived = self.moves.take_arrived();
            if !arrived.is_empty() {
                let applied = self.apply(&arrived);
                self.note("take owners moved here", applied);
            }
        }
        if now.duration_since(self.last_refresh) >= REFRESH {
            self.last_refresh = now;
            if let Some(shared) = self.shared.upgrade() {
                let given = self.handbacks.tick(
                    &self.node,
                    &shared,
                    &self.coordinator,
                    &self.handover,
                    &self.moves,
                );
                self.note("give back or take backlogs", given);
            }
            let nodes = self.coordinator.nodes();
            if let Some(nodes) = self.note("list the nodes", nodes) {
                self.declare_silent_dead(now, &nodes);
                self.node.set_nodes(nodes);
            }
            let synced = self.sync_exchanges();
            self.note("read the exchange catalogue", synced);
            // For operators only: every few refreshes.
            self.refreshes += 1;
            if self.refreshes >= TAKEOVERS_EVERY {
                self.refreshes = 0;
                let recorded = self.coordinator.recent_takeovers(MAX_TAKEOVER_ROWS as u32);
                if let Some(recorded) = self.note("read the recent takeovers", recorded) {
                    self.node.set_takeovers(recorded);
                }
            }
        }
    }

    /// Removes `name` from the catalogue, whoever declared it: the node's
    /// topology already judged the deletion.
    fn delete_from_catalogue(&mut self, name: &str) -> Result<(), ClusterError> {
        let stored = self.coordinator.exchanges()?;
        match stored.iter().find(|e| e.name == name) {
            Some(row) => match self.coordinator.delete_exchange(name, &row.owner) {
                Ok(()) | Err(ClusterError::NoSuchExchange { .. }) => Ok(()),
                Err(e) => Err(e),
            },
            None => Ok(()),
        }
    }

    /// Follows the catalogue: an exchange that appeared in it since the
    /// last read is declared here (owned by its declarer when that is a
    /// receiver) unless this node has it; one that disappeared is deleted
    /// here. Exchanges this node had before it joined, never catalogued,
    /// are left alone.
    fn sync_exchanges(&mut self) -> Result<(), ClusterError> {
        let catalogue = self.coordinator.exchanges()?;
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        let names: HashSet<String> = catalogue.iter().map(|e| e.name.clone()).collect();
        for gone in self.catalogue.difference(&names) {
            let change = TopologyChange::DeleteExchange {
                name: gone.clone(),
                by: ciphermq_shard::topology::Actor::Admin,
            };
            if let Err(e) = futures_lite::future::block_on(shared.topology.submit(change)) {
                tracing::debug!(exchange = %gone, error = %e, "cluster: exchange deleted elsewhere not deleted here");
            }
        }
        let known = std::mem::replace(&mut self.catalogue, names);
        let topology = shared.topology.snapshot();
        let policy = shared.policy.current();
        for exchange in catalogue {
            if known.contains(&exchange.name) || topology.exchange(&exchange.name).is_some() {
                continue;
            }
            let Some(kind) = ExchangeKind::parse(&exchange.kind) else {
                continue;
            };
            let owner = (policy.acl.role_of(&exchange.owner) == Role::Receiver)
                .then(|| exchange.owner.clone());
            let change = TopologyChange::DeclareExchange {
                name: exchange.name.clone(),
                kind,
                owner,
            };
            if let Err(e) = futures_lite::future::block_on(shared.topology.submit(change)) {
                tracing::warn!(exchange = %exchange.name, error = %e,
                    "cluster: exchange from the catalogue not declared on this node");
            }
        }
        Ok(())
    }

    /// Places here the owners of queues this node's disk holds that no node
    /// holds yet (a broker joining a cluster with data), and warns about
    /// those another node holds.
    fn claim_local_owners(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let topology = shared.topology.snapshot();
        let mut owners: Vec<String> = topology.queues().map(|q| q.owner.to_string()).collect();
        owners.sort_unstable();
        owners.dedup();
        for owner in owners {
            let placed = self.coordinator.place(&owner, &self.node.node_id);
            if let Some(p) = self.note("place an owner", placed) {
                if *p.node_id != *self.node.node_id {
                    tracing::warn!(owner = %owner, node_id = %p.node_id,
                        "this node's disk holds queues of an owner placed on another node: they are not served here, and their backlog is given back to that node");
                }
                let applied = self.apply(std::slice::from_ref(&p));
                self.note("take an owner over", applied);
            }
        }
    }

    /// Declares dead every node whose heartbeat this node has seen stand
    /// still for the lease plus a margin with its own link up the whole
    /// time; the coordinator gives their owners to live nodes in the same
    /// transaction, unless the node beat again or another node declared it
    /// first.
    fn declare_silent_dead(&mut self, now: Instant, nodes: &[NodeInfo]) {
        for suspect in self.watch.observe(now, nodes) {
            let reason = format!(
                "heartbeat unchanged for {} ms as seen by {} (lease {} s)",
                suspect.silent_for.as_millis(),
                self.node.node_id,
                self.node.lease.as_secs()
            );
            match self.coordinator.declare_dead(
                &suspect,
                &self.node.node_id,
                &reason,
                self.node.lease,
            ) {
                Ok(takeover) => {
                    self.node.status.takeovers.fetch_add(1, Ordering::Relaxed);
                    let owners: Vec<String> = takeover
                        .placements
                        .iter()
                        .map(|p| format!("{}→{}", p.owner, p.node_id))
                        .collect();
                    tracing::warn!(node_id = %takeover.node_id, incarnation = takeover.incarnation,
                        reason = %reason, owners = ?owners, "node declared dead; its owners go to live nodes");
                    let applied = self.apply(&takeover.placements);
                    self.note("take owners over", applied);
                    self.refreshes = TAKEOVERS_EVERY;
                }
                Err(ClusterError::StillAlive { .. }) => {
                    tracing::debug!(node_id = %suspect.node_id, "a silent node beat again or was declared dead first");
                }
                Err(e @ ClusterError::NoLiveNode { .. }) => {
                    tracing::warn!(node_id = %suspect.node_id, error = %e, "a silent node's owners wait for it");
                }
                Err(e) => {
                    self.note("declare a node dead", Err::<(), _>(e));
                }
            }
        }
    }

    /// Applies placements to the snapshot, after declaring the queues of
    /// owners taken over from a dead node (`takeover`): no publish for
    /// such an owner arrives here before its queues exist. Nothing is
    /// applied when the owner catalogue cannot be read.
    fn apply(&mut self, placements: &[ciphermq_cluster::Placement]) -> Result<(), ClusterError> {
        if let Some(shared) = self.shared.upgrade() {
            super::takeover::adopt(&self.node, &shared, &self.coordinator, placements)?;
        }
        if let (Some(adopter), Some(logs)) = (&self.adopter, self.node.shared_logs()) {
            adopter.hold_placed(&self.node, logs, self.incarnation, placements);
        }
        self.node.view.apply(placements);
        // An owner a move brought here is served from now on.
        let (_, now) = self.node.view.current();
        for p in placements {
            if *p.node_id == *self.node.node_id
                && now.is_arriving(&p.owner)
                && p.epoch >= now.stored_epoch(&p.owner)
            {
                self.node.view.set_arriving(&p.owner, None);
            }
        }
        Ok(())
    }
}
