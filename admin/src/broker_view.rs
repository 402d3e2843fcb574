//! What the endpoint reads from the broker besides the figures in
//! [`ciphermq_stats`]: who a client is and what it may see, the limits in
//! force, who is connected and the topology. The broker implements
//! [`BrokerView`] over its shared state, so this crate never reaches into
//! the broker's internals and the broker depends on it, not the reverse.

use std::net::IpAddr;
use std::sync::Arc;

use ciphermq_shard::topology::TopologyStore;
use rustls_pki_types::CertificateDer;
use serde::Serialize;

use ciphermq_stats::BrokerStats;

/// What a client may do on the endpoint, from the current ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `acl.admin_cns`: every route, including those that change the broker.
    Admin,
    /// `acl.monitor_cns`: every route that only reads.
    Monitor,
    /// Anyone else the CA signed: `/health` and `/ready` only.
    Public,
}

impl Access {
    /// Whether the routes that only read (`/metrics`, `/api/*`, the
    /// dashboard) are open to it.
    pub fn may_read(self) -> bool {
        matches!(self, Access::Admin | Access::Monitor)
    }
}

/// The broker as the endpoint sees it. Every call answers from a snapshot
/// or an atomic read, on the endpoint's thread; none waits for a shard.
pub trait BrokerView: Send + Sync + 'static {
    /// The identity a client certificate chain carries (by the broker's
    /// `tls.identity` in force now: its end-entity certificate's CN, or its
    /// URI SAN), or why it carries none; a certificate the CRLs in force
    /// (`tls.crl_path`) revoke carries none.
    fn identity(&self, certs: &[CertificateDer<'_>]) -> Result<String, String>;

    /// A number that moves with every reload that may change what
    /// [`BrokerView::identity`] answers for a certificate (`[tls]`: the
    /// identity rule, the CRLs): the endpoint judges an open connection's
    /// certificate again only when it moved, so a request costs one atomic
    /// load for it.
    fn judgement_version(&self) -> u64;

    /// What `identity` may do, under the ACL in force now (it is reloaded
    /// on `SIGHUP`).
    fn access(&self, identity: &str) -> Access;

    /// The TLS configuration new admin connections are accepted with (the
    /// one in force now: it is reloaded on `SIGHUP`).
    fn tls(&self) -> Arc<rustls::ServerConfig>;

    /// When the TLS material in force now expires.
    fn tls_expiries(&self) -> TlsExpiries;

    /// What the shards publish: counters, histograms, queue snapshots,
    /// lifecycle, storage state.
    fn stats(&self) -> &BrokerStats;

    /// Exchanges, queues, bindings and their owners.
    fn topology(&self) -> &TopologyStore;

    /// Every cap a client is held to, as in force now.
    fn limits(&self) -> Limits;

    /// Open broker connections, counted by client IP and by identity.
    fn open_connections(&self) -> ConnectionCounts;

    /// Reloads the reloadable settings from the broker's config file, as
    /// SIGHUP does; `Err` says why nothing changed.
    fn reload(&self) -> Result<(), String>;

    /// The node's cluster, when it is one's node (`cluster.enabled`).
    fn cluster(&self) -> Option<crate::cluster_status::ClusterStatus> {
        None
    }
}

/// When the broker's TLS material expires (Unix seconds), for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlsExpiries {
    /// The server certificate chain's earliest `notAfter` (`tls.cert_path`).
    pub server: Option<i64>,
    /// The earliest CA's `notAfter` (`tls.ca_cert_path`).
    pub ca: Option<i64>,
    /// The earliest `nextUpdate` of the CRLs (`tls.crl_path`), when set.
    pub crl_next_update: Option<i64>,
}

/// Open connections by client IP and by identity.
pub type ConnectionCounts = (Vec<(IpAddr, u32)>, Vec<(String, u32)>);

/// Every cap a client is held to, as in force now (`limits` in
/// `/api/status`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Limits {
    /// Queues one CN may own.
    pub max_queues_per_cn: usize,
    /// Exchanges one CN may own.
    pub max_exchanges_per_cn: usize,
    /// Bindings one CN may own.
    pub max_bindings_per_cn: usize,
    /// Messages one `fetch` may return.
    pub max_fetch: u32,
    /// Body bytes one `fetch` may return.
    pub max_fetch_bytes: usize,
    /// Largest `consume` prefetch.
    pub max_prefetch: u32,
    /// Body bytes one consumer may hold unacked (one message at least).
    pub max_prefetch_bytes: u64,
    /// Unacked deliveries a connection may hold before `fetch` is refused.
    pub max_unacked_per_connection: usize,
    /// Messages a queue may hold.
    pub max_queue_size: usize,
    /// 0: no byte cap.
    pub max_queue_bytes: u64,
    /// `storage.memory_budget_mb` in bytes: a hard cap in memory mode.
    pub memory_budget_bytes: u64,
    /// Reply bytes a connection writes per turn.
    pub max_reply_bytes_per_turn: usize,
    /// Replies a connection may have waiting.
    pub max_pending_replies: usize,
    /// Longest command line.
    pub max_line_bytes: usize,
    /// Largest message body.
    pub max_message_bytes: usize,
    /// TLS handshakes in progress at once, per shard.
    pub max_handshakes: u32,
    /// TLS handshakes in progress at once from one IP.
    pub max_handshakes_per_ip: u32,
    /// Open connections from one IP (0: no cap).
    pub max_connections_per_ip: u32,
    /// Open connections of one CN (0: no cap).
    pub max_connections_per_cn: u32,
    /// Words in a routing key or pattern.
    pub max_routing_key_words: usize,
    /// `#` wildcards in a topic pattern.
    pub max_pattern_hashes: usize,
}
