//! This broker as one node of a cluster (`[cluster] enabled = true`):
//! owners (a receiver with its queues, bindings and dedup state) live on
//! one node each, placed through the coordinator in PostgreSQL, and a
//! client that reaches the wrong node is told where to go.
//!
//! - [`ClusterNode`]: what sessions ask of the cluster. Where an owner
//!   lives is read from the placement snapshot ([`view`]) with one atomic
//!   load, so a publish never waits on PostgreSQL; only the first command
//!   for an owner no node holds yet waits for its placement.
//! - `link`: the coordinator thread. It registers the node, heartbeats,
//!   polls placement changes, nodes and the exchange catalogue into the
//!   snapshot and the topology, and runs the sessions' requests (place an
//!   owner, declare an exchange) one at a time.
//!
//! If PostgreSQL is unreachable the node keeps serving what its snapshot
//! says; placements do not change until it is back, and its return changes
//! nothing by itself (docs/CLUSTER.md).

mod adoption;
mod catalogue;
mod handback;
mod link;
mod manifest;
mod moves;
mod shared_logs;
mod takeover;
pub(crate) mod view;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use ciphermq_admin::cluster_status::{
    ClusterNodeRow, ClusterStatus, OwnerRow, TakeoverRow, MAX_OWNER_ROWS, MAX_TAKEOVER_ROWS,
};
use ciphermq_cluster::{ClusterError, PgCoordinatorConfig};
use ciphermq_proto::ExchangeKind;
use tokio::sync::oneshot;

use crate::config::{ClusterStorage, Config};
use crate::runtime::context::Shared;
use ciphermq_cluster::shared_storage::{LeaseGate, SharedStore};
pub(crate) use moves::Handover;
use shared_logs::SharedLogs;
pub(crate) use view::{PlacementView, Placements, Residence};

/// How long a session waits for the coordinator (a placement, an exchange
/// declaration) before it answers that the cluster is unavailable.
pub(crate) const COORDINATOR_WAIT: Duration = Duration::from_secs(5);

/// How long a command about an owner being moved away waits for the move
/// to end before it is answered that the owner is still moving. A move
/// gives up well before ([`moves::MOVE_DEADLINE`] is shorter).
pub(crate) const MOVE_WAIT: Duration = Duration::from_secs(30);

/// Why a cluster node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStartError {
    /// PostgreSQL could not be reached, or refused the cluster tables.
    #[error("{0} (cluster.enabled needs the PostgreSQL of [database])")]
    Coordinator(#[from] ClusterError),
    /// `cluster.advertise` is empty and the bound address is no place to
    /// send clients.
    #[error("cluster.advertise: empty, and the listener bound {0}, which clients elsewhere cannot reach: set advertise to the address clients use for this node")]
    NoAdvertise(String),
    /// `cluster.shared_dir` cannot be used.
    #[error("{0} (cluster.storage = \"shared\" needs a directory every node reaches, made by the operator)")]
    SharedStorage(String),
    /// The coordinator thread could not be started, or stopped at once.
    #[error("cluster coordinator thread: {0}")]
    Thread(String),
}

/// What the coordinator thread tells the rest of the broker, for the admin
/// endpoint and metrics.
#[derive(Debug, Default)]
pub(crate) struct LinkStatus {
    /// Its last call to PostgreSQL succeeded.
    pub connected: AtomicBool,
    /// Calls made to the coordinator, ever.
    pub calls: AtomicU64,
    /// Calls that failed, ever.
    pub failures: AtomicU64,
    /// Nodes this node declared dead, ever.
    pub takeovers: AtomicU64,
    /// The node's registration was taken over by another process (a
    /// heartbeat was fenced): this process no longer speaks for the node.
    pub fenced: AtomicBool,
    /// This start's incarnation (0 until registered).
    pub incarnation: AtomicU64,
}

/// One request a session hands the coordinator thread.
pub(crate) enum Job {
    /// Place `owner` here unless a node holds it; answered once the
    /// snapshot has the placement.
    Place {
        owner: String,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// Declare an exchange in the cluster's catalogue; answers the stored
    /// row (the first declaration's).
    DeclareExchange {
        name: String,
        kind: ExchangeKind,
        declarer: String,
        reply: oneshot::Sender<Result<ciphermq_cluster::Exchange, String>>,
    },
    /// Remove an exchange from the catalogue (this node deleted it; the
    /// others follow when it is gone from there).
    DeleteExchange { name: String },
    /// Move an owner to another node; answered with the tail of
    /// `OK move` once the move is done.
    Move {
        owner: String,
        to_node: String,
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// End the thread.
    Stop,
}

/// This node's part in the cluster, shared by every shard.
pub(crate) struct ClusterNode {
    node_id: Arc<str>,
    advertise: OnceLock<Arc<str>>,
    view: PlacementView,
    status: LinkStatus,
    jobs: crossbeam_channel::Sender<Job>,
    receiver: Mutex<Option<crossbeam_channel::Receiver<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The live nodes as last read, for the admin endpoint.
    nodes: Mutex<Vec<ciphermq_cluster::NodeInfo>>,
    /// The last takeovers recorded, as last read, for the admin endpoint.
    takeovers: Mutex<Vec<ciphermq_cluster::TakeoverRecord>>,
    coordinator: PgCoordinatorConfig,
    lease: Duration,
    connect_timeout: Duration,
    /// This node's lease as its own clock sees it: renewed by each
    /// heartbeat PostgreSQL accepts; consulted before `ACK`s on shared
    /// storage.
    lease_gate: Arc<LeaseGate>,
    /// With `cluster.storage = "shared"`: the shared directory and the
    /// owners held in it; or why the directory cannot be used.
    shared_logs: Option<Result<Arc<SharedLogs>, String>>,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("node_id", &self.node_id)
            .field("advertise", &self.advertise.get())
            .finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// The node `config` describes, when `cluster.enabled`; not yet linked
    /// to the coordinator (see [`ClusterNode::start`]).
    pub(crate) fn from_config(config: &Config) -> Option<Arc<ClusterNode>> {
        let c = &config.cluster;
        if !c.enabled {
            return None;
        }
        let d = &config.database;
        let coordinator = PgCoordinatorConfig {
            host: d.host.clone(),
            port: d.port,
            user: d.user.clone(),
            password: config.resolve_db_password().ok().flatten(),
            dbname: d.dbname.clone(),
            schema: c.schema.clone(),
            connect_timeout: Duration::from_secs(d.connect_timeout_secs.clamp(1, 10)),
        };
        // Bounded: a session waits at most COORDINATOR_WAIT for an answer,
        // and a full queue is answered as the coordinator being busy.
        let (jobs, receiver) = crossbeam_channel::bounded(4096);
        let advertise = OnceLock::new();
        if !c.advertise.is_empty() {
            let _ = advertise.set(Arc::from(c.advertise.as_str()));
        }
        let lease_gate = Arc::new(LeaseGate::new());
        let shared_logs = match c.storage {
            ClusterStorage::Local => None,
            ClusterStorage::Shared => Some(
                SharedStore::open(&c.shared_dir)
                    .map(|store| Arc::new(SharedLogs::new(store, lease_gate.clone())))
                    .map_err(|e| e.to_string()),
            ),
        };
        Some(Arc::new(ClusterNode {
            node_id: Arc::from(c.node_id.as_str()),
            advertise,
            view: PlacementView::default(),
            status: LinkStatus::default(),
            jobs,
            receiver: Mutex::new(Some(receiver)),
            thread: Mutex::new(None),
            nodes: Mutex::new(Vec::new()),
            takeovers: Mutex::new(Vec::new()),
            coordinator,
            lease: Duration::from_secs(c.lease_secs),
            connect_timeout: Duration::from_secs(d.connect_timeout_secs),
            lease_gate,
            shared_logs,
        }))
    }

    /// Where each shard's new logs go, with `cluster.storage = "shared"`
    /// (`None`: in the data directory, as on one host).
    pub(crate) fn log_placement(
        &self,
        topology: &Arc<ciphermq_shard::topology::TopologyStore>,
    ) -> Option<Arc<dyn ciphermq_shard::log::LogPlacement>> {
        let Some(Ok(logs)) = &self.shared_logs else {
            return None;
        };
        Some(Arc::new(shared_logs::SharedLogPlacement {
            logs: logs.clone(),
            topology: topology.clone(),
        }))
    }

    /// The shared directory's owners, with `cluster.storage = "shared"`.
    pub(crate) fn shared_logs(&self) -> Option<&Arc<SharedLogs>> {
        match &self.shared_logs {
            Some(Ok(logs)) => Some(logs),
            _ => None,
        }
    }

    /// This node's lease, as its own clock sees it.
    pub(crate) fn lease_gate(&self) -> &Arc<LeaseGate> {
        &self.lease_gate
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> &Arc<str> {
        &self.node_id
    }

    /// Where clients are sent for this node (known once started).
    pub(crate) fn advertise(&self) -> Option<&str> {
        self.advertise.get().map(|a| &**a)
    }

    /// The placement snapshot.
    pub(crate) fn view(&self) -> &PlacementView {
        &self.view
    }

    /// Joins the cluster: connects to PostgreSQL (trying for
    /// `database.connect_timeout_secs`), registers this node at its
    /// advertised address (`bound` when `cluster.advertise` is empty),
    /// loads the placements and starts the coordinator thread. Returns once
    /// the snapshot is loaded, so no owner this node holds is answered as
    /// unplaced.
    pub(crate) fn start(
        self: &Arc<Self>,
        bound: std::net::SocketAddr,
        shared: &Arc<Shared>,
        handover: Handover,
    ) -> Result<(), ClusterStartError> {
        if let Some(Err(e)) = &self.shared_logs {
            return Err(ClusterStartError::SharedStorage(e.clone()));
        }
        if self.advertise.get().is_none() {
            if bound.ip().is_unspecified() {
                return Err(ClusterStartError::NoAdvertise(bound.to_string()));
            }
            let _ = self.advertise.set(Arc::from(bound.to_string()));
        }
        let receiver = self
            .receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| ClusterStartError::Thread("started twice".to_owned()))?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let node = self.clone();
        let shared = Arc::downgrade(shared);
        let handle = std::thread::Builder::new()
            .name("cluster-link".to_owned())
            .spawn(move || link::run(node, shared, handover, receiver, ready_tx))
            .map_err(|e| ClusterStartError::Thread(e.to_string()))?;
        *self.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.stop();
                Err(e)
            }
            Err(_) => {
                self.stop();
                Err(ClusterStartError::Thread("ended before joining".to_owned()))
            }
        }
    }

    /// Stops the coordinator thread (the node stays registered: a restart
    /// within `cluster.lease_secs` keeps its owners).
    pub(crate) fn stop(&self) {
        let _ = self.jobs.try_send(Job::Stop);
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }

    /// Asks for `owner` to be placed (here unless a node holds it); the
    /// answer comes once the snapshot has it.
    pub(crate) fn place(&self, owner: &str) -> oneshot::Receiver<Result<(), String>> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Place {
            owner: owner.to_owned(),
            reply,
        };
        self.send(job);
        answer
    }

    /// Declares an exchange in the catalogue; answers the stored row.
    pub(crate) fn declare_exchange(
        &self,
        name: &str,
        kind: ExchangeKind,
        declarer: &str,
    ) -> oneshot::Receiver<Result<ciphermq_cluster::Exchange, String>> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::DeclareExchange {
            name: name.to_owned(),
            kind,
            declarer: declarer.to_owned(),
            reply,
        });
        answer
    }

    /// Asks for `owner` to move to `to_node`; the answer comes once the
    /// move ended (`<owner> <node_id> <host:port> <epoch>`), or why not.
    pub(crate) fn move_owner(
        &self,
        owner: &str,
        to_node: &str,
    ) -> oneshot::Receiver<Result<String, String>> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Move {
            owner: owner.to_owned(),
            to_node: to_node.to_owned(),
            reply,
        });
        answer
    }

    /// Records the live nodes as last read (the link does).
    fn set_takeovers(&self, takeovers: Vec<ciphermq_cluster::TakeoverRecord>) {
        *self
            .takeovers
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = takeovers;
    }

    fn set_nodes(&self, nodes: Vec<ciphermq_cluster::NodeInfo>) {
        self.view.set_nodes(&nodes);
        *self.nodes.lock().unwrap_or_else(PoisonError::into_inner) = nodes;
    }

    /// What the admin endpoint shows of the cluster (`/api/cluster`,
    /// `/metrics`, `ciphermq-admin nodes`).
    pub(crate) fn admin_status(&self) -> ClusterStatus {
        use std::sync::atomic::Ordering::Relaxed;
        let (_, placements) = self.view.current();
        let per_node = placements.owners_per_node();
        let nodes = self
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|n| ClusterNodeRow {
                node_id: n.node_id.clone(),
                advertise: n.advertise.clone(),
                heartbeat_age_ms: u64::try_from(n.heartbeat_age.as_millis()).unwrap_or(u64::MAX),
                owners: per_node.get(n.node_id.as_str()).copied().unwrap_or(0),
                this_node: *n.node_id == *self.node_id,
            })
            .collect();
        let mut owners: Vec<OwnerRow> = placements
            .owners()
            .take(MAX_OWNER_ROWS)
            .map(|(owner, home)| OwnerRow {
                owner: owner.to_string(),
                node_id: home.node_id.to_string(),
                epoch: home.epoch,
            })
            .collect();
        owners.sort_unstable_by(|a, b| a.owner.cmp(&b.owner));
        ClusterStatus {
            node_id: self.node_id.to_string(),
            advertise: self.advertise().unwrap_or_default().to_owned(),
            incarnation: self.status.incarnation.load(Relaxed),
            coordinator_connected: self.status.connected.load(Relaxed),
            fenced: self.status.fenced.load(Relaxed),
            coordinator_calls: self.status.calls.load(Relaxed),
            coordinator_failures: self.status.failures.load(Relaxed),
            takeovers: self.status.takeovers.load(Relaxed),
            nodes,
            recent_takeovers: self
                .takeovers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .take(MAX_TAKEOVER_ROWS)
                .map(|t| TakeoverRow {
                    node_id: t.node_id.clone(),
                    by_node: t.by_node.clone(),
                    age_ms: u64::try_from(t.age.as_millis()).unwrap_or(u64::MAX),
                    owners: t.owners,
                    reason: t.reason.clone(),
                })
                .collect(),
            owners_total: placements.len(),
            owners,
        }
    }

    /// Removes a deleted exchange from the catalogue, so every node drops
    /// it (fire and forget: a failure is logged).
    pub(crate) fn exchange_deleted(&self, name: &str) {
        self.send(Job::DeleteExchange {
            name: name.to_owned(),
        });
    }

    /// Hands a job to the thread; one that cannot be queued is dropped,
    /// which its asker sees as the coordinator being unavailable.
    fn send(&self, job: Job) {
        if self.jobs.try_send(job).is_err() {
            tracing::warn!("cluster coordinator busy: a request was refused");
        }
    }
}
