//! What `/api/cluster`, the cluster series of `/metrics` and
//! `ciphermq-admin nodes` show of a node's cluster: the node itself, its
//! link to the coordinator, the live nodes and where every owner lives.

use serde::Serialize;

use crate::metrics::{Exposition, Kind};

/// A cluster node's view of its cluster, as the broker hands it over
/// ([`crate::broker_view::BrokerView::cluster`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterStatus {
    /// This node's `cluster.node_id`.
    pub node_id: String,
    /// Where clients are sent for it.
    pub advertise: String,
    /// This start's registration number (rises on every start).
    pub incarnation: u64,
    /// The coordinator's last call to PostgreSQL succeeded.
    pub coordinator_connected: bool,
    /// Another process registered this node id since: this one no longer
    /// speaks for it.
    pub fenced: bool,
    /// Calls made to the coordinator since start: they do not grow with
    /// the message rate.
    pub coordinator_calls: u64,
    /// Of those, the ones that failed.
    pub coordinator_failures: u64,
    /// Nodes this node declared dead (their owners given to others).
    pub takeovers: u64,
    /// The live nodes, by id.
    pub nodes: Vec<ClusterNodeRow>,
    /// The last nodes declared dead, newest first (at most
    /// [`MAX_TAKEOVER_ROWS`]).
    pub recent_takeovers: Vec<TakeoverRow>,
    /// Owners placed in the cluster.
    pub owners_total: usize,
    /// Where each owner lives, by owner (at most [`MAX_OWNER_ROWS`]).
    pub owners: Vec<OwnerRow>,
}

/// The most owners `/api/cluster` lists one by one.
pub const MAX_OWNER_ROWS: usize = 10_000;

/// The most takeovers `/api/cluster` lists.
pub const MAX_TAKEOVER_ROWS: usize = 10;

/// One node declared dead.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TakeoverRow {
    /// The node declared dead.
    pub node_id: String,
    /// The node that declared it.
    pub by_node: String,
    /// Milliseconds ago, on the coordinator's clock, when last read.
    pub age_ms: u64,
    /// Owners that went to other nodes.
    pub owners: u32,
    /// Why, as the declaring node wrote it.
    pub reason: String,
}

/// One live node.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterNodeRow {
    /// Its id.
    pub node_id: String,
    /// Its client address.
    pub advertise: String,
    /// Milliseconds since its last heartbeat, on the coordinator's clock,
    /// when last read.
    pub heartbeat_age_ms: u64,
    /// Owners placed on it.
    pub owners: usize,
    /// It is the node answering.
    pub this_node: bool,
}

/// Where one owner lives.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OwnerRow {
    /// The owner (a receiver CN, or the CN that declared an admin queue).
    pub owner: String,
    /// The node holding it.
    pub node_id: String,
    /// Its placement's fencing epoch.
    pub epoch: u64,
}

/// The cluster series of `/metrics`.
pub(crate) fn metrics(e: &mut Exposition, c: &ClusterStatus) {
    e.family(
        "ciphermq_cluster_nodes",
        Kind::Gauge,
        "Live nodes of the cluster, as this node last read them.",
    );
    e.sample_u64("ciphermq_cluster_nodes", &[], c.nodes.len() as u64);
    e.family(
        "ciphermq_cluster_owners",
        Kind::Gauge,
        "Owners placed on each live node, as this node knows the placements.",
    );
    for n in &c.nodes {
        e.sample_u64(
            "ciphermq_cluster_owners",
            &[("node", &n.node_id)],
            n.owners as u64,
        );
    }
    e.family(
        "ciphermq_cluster_coordinator_connected",
        Kind::Gauge,
        "1 while the coordinator's last call to PostgreSQL succeeded.",
    );
    e.sample_u64(
        "ciphermq_cluster_coordinator_connected",
        &[],
        u64::from(c.coordinator_connected),
    );
    e.family(
        "ciphermq_cluster_fenced",
        Kind::Gauge,
        "1 once another process registered this node id: this one no longer speaks for it.",
    );
    e.sample_u64("ciphermq_cluster_fenced", &[], u64::from(c.fenced));
    e.family(
        "ciphermq_cluster_coordinator_calls_total",
        Kind::Counter,
        "Calls this node made to the coordinator (they do not grow with the message rate).",
    );
    e.sample_u64(
        "ciphermq_cluster_coordinator_calls_total",
        &[],
        c.coordinator_calls,
    );
    e.family(
        "ciphermq_cluster_coordinator_failures_total",
        Kind::Counter,
        "Calls to the coordinator that failed.",
    );
    e.sample_u64(
        "ciphermq_cluster_coordinator_failures_total",
        &[],
        c.coordinator_failures,
    );
    e.family(
        "ciphermq_cluster_takeovers_total",
        Kind::Counter,
        "Nodes this node declared dead after their heartbeat stood still for the lease plus a margin; their owners went to live nodes.",
    );
    e.sample_u64("ciphermq_cluster_takeovers_total", &[], c.takeovers);
}
