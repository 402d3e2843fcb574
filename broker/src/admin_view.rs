//! The broker as its admin endpoint (`ciphermq-admin`) sees it: identity
//! from the client certificate (by `tls.identity`, refused when the CRLs in
//! force revoke it), the TLS configuration
//! in force (reloaded), access from the ACL in force, the limits
//! and the open connections, all read from [`Shared`] without waiting for
//! a shard.

use std::sync::Arc;

use ciphermq_admin::broker_view::ConnectionCounts;
use ciphermq_admin::cluster_status::ClusterStatus;
use ciphermq_admin::{Access, BrokerView, Limits, TlsExpiries};
use ciphermq_shard::topology::TopologyStore;
use ciphermq_stats::BrokerStats;
use rustls_pki_types::CertificateDer;

use crate::access::acl::Role;
use crate::access::identity::identify;
use crate::cluster::ClusterNode;
use crate::runtime::context::Shared;

/// [`BrokerView`] over the state every shard shares.
pub(crate) struct AdminView {
    shared: Arc<Shared>,
}

impl AdminView {
    /// A view of `shared`.
    pub(crate) fn new(shared: Arc<Shared>) -> AdminView {
        AdminView { shared }
    }
}

impl BrokerView for AdminView {
    fn identity(&self, certs: &[CertificateDer<'_>]) -> Result<String, String> {
        let tls = self.shared.tls.current().1;
        let peer = identify(certs, &tls.identity).map_err(|e| e.to_string())?;
        if tls.revoked.contains(&peer.cert) {
            return Err(format!(
                "the client certificate (serial {}) is revoked by tls.crl_path",
                peer.cert.serial_hex()
            ));
        }
        Ok(peer.identity)
    }

    fn judgement_version(&self) -> u64 {
        // Every reload replaces the TLS material, the identity rule and the
        // CRLs with it.
        self.shared.tls.version()
    }

    fn access(&self, identity: &str) -> Access {
        match self.shared.policy.current().acl.role_of(identity) {
            Role::Admin => Access::Admin,
            Role::Monitor => Access::Monitor,
            Role::Sender | Role::Receiver | Role::Unknown => Access::Public,
        }
    }

    fn tls(&self) -> Arc<rustls::ServerConfig> {
        self.shared.tls.current().1.server.clone()
    }

    fn tls_expiries(&self) -> TlsExpiries {
        self.shared.tls.current().1.expiries
    }

    fn stats(&self) -> &BrokerStats {
        &self.shared.stats
    }

    fn topology(&self) -> &TopologyStore {
        &self.shared.topology
    }

    fn limits(&self) -> Limits {
        let s = &self.shared.settings;
        let (per_ip, per_cn) = self.shared.policy.conn_limits.limits();
        Limits {
            max_queues_per_cn: s.quotas.queues_per_cn,
            max_exchanges_per_cn: s.quotas.exchanges_per_cn,
            max_bindings_per_cn: s.quotas.bindings_per_cn,
            max_fetch: s.max_fetch,
            max_fetch_bytes: s.max_fetch_bytes,
            max_prefetch: s.max_prefetch,
            max_prefetch_bytes: s.max_prefetch_bytes,
            max_unacked_per_connection: s.max_unacked_per_connection,
            max_queue_size: s.max_queue_size,
            max_queue_bytes: s.max_queue_bytes,
            memory_budget_bytes: s.memory_budget_bytes,
            max_reply_bytes_per_turn: s.max_reply_bytes_per_turn,
            max_pending_replies: s.max_pending_replies,
            max_line_bytes: s.max_line_bytes,
            max_message_bytes: s.max_message_bytes,
            max_handshakes: s.max_handshakes,
            max_handshakes_per_ip: s.max_handshakes_per_ip,
            max_connections_per_ip: per_ip,
            max_connections_per_cn: per_cn,
            max_routing_key_words: ciphermq_proto::name::MAX_ROUTING_KEY_WORDS,
            max_pattern_hashes: ciphermq_proto::name::MAX_PATTERN_HASHES,
        }
    }

    fn open_connections(&self) -> ConnectionCounts {
        self.shared.policy.conn_limits.snapshot()
    }

    fn reload(&self) -> Result<(), String> {
        self.shared.reload_file().map_err(|e| e.to_string())
    }

    fn cluster(&self) -> Option<ClusterStatus> {
        self.shared
            .cluster
            .as_deref()
            .map(ClusterNode::admin_status)
    }
}
