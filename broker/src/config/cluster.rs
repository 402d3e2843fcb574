//! `[cluster]`: this broker as one node of several, and the checks, which
//! also read `[database]`, `[server]` and `[storage]` (a cluster needs
//! PostgreSQL, an address to send clients to, and, with shared storage,
//! durable queues).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::checks::check_host_port;
use super::{Config, ConfigError, DatabaseBackend, DatabaseSslMode, StorageMode};

/// `cluster.storage`: where an owner's queue data lives, which decides what
/// a failover can take over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterStorage {
    /// Each node's own `storage.data_dir` (the default).
    #[default]
    Local,
    /// A directory every node reaches (`cluster.shared_dir`).
    Shared,
}

impl ClusterStorage {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterStorage::Local => "local",
            ClusterStorage::Shared => "shared",
        }
    }
}

/// `[cluster]`: one node of several brokers serving as one, coordinated
/// through the PostgreSQL of `[database]` (docs/CLUSTER.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Whether this broker is a cluster node. Default false: a broker on
    /// its own, which answers `nodes` and `locate` with an error.
    pub enabled: bool,
    /// The node's name, unique in the cluster and the same across restarts
    /// (owners are placed on it by name). Default `node-1`.
    pub node_id: String,
    /// `host:port` clients are redirected to for this node. Empty (the
    /// default): the address the listener bound, which must then be a
    /// specific address, not `0.0.0.0` or `[::]`.
    pub advertise: String,
    /// Seconds of heartbeat silence after which a node may lose its owners,
    /// 1 to 3600; the node heartbeats every third of it. Default 5.
    pub lease_secs: u64,
    /// `local` or `shared`. Default `local`.
    pub storage: ClusterStorage,
    /// With `storage = "shared"`: the directory every node reaches.
    /// Default empty.
    pub shared_dir: PathBuf,
    /// The PostgreSQL schema holding the cluster's tables (created if
    /// missing): one per cluster, so several can share a database.
    /// Lowercase letters, digits and `_`. Default `ciphermq_cluster`.
    pub schema: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            node_id: "node-1".to_owned(),
            advertise: String::new(),
            lease_secs: 5,
            storage: ClusterStorage::Local,
            shared_dir: PathBuf::new(),
            schema: "ciphermq_cluster".to_owned(),
        }
    }
}

impl Config {
    pub(super) fn validate_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if !c.enabled {
            return Ok(());
        }
        if self.database.backend != DatabaseBackend::Postgres {
            return Err(ConfigError::invalid(
                "cluster.enabled",
                "a cluster is coordinated through PostgreSQL: set [database] backend = \"postgres\" \
                 (and its connection keys), or cluster.enabled = false",
            ));
        }
        if matches!(
            self.database.sslmode,
            DatabaseSslMode::Require | DatabaseSslMode::VerifyFull
        ) {
            return Err(ConfigError::invalid(
                "database.sslmode",
                format!(
                    "\"{}\" with cluster.enabled: the cluster coordinator's link to PostgreSQL \
                     does not speak TLS in this version, and is never downgraded silently; use \
                     sslmode = \"disable\" or \"prefer\" on a trusted network, or run the \
                     broker on its own",
                    self.database.sslmode.as_str()
                ),
            ));
        }
        if !ciphermq_proto::is_valid_name(&c.node_id) {
            return Err(ConfigError::invalid(
                "cluster.node_id",
                format!(
                    "{:?} is not a node id: 1 to 255 of A-Z a-z 0-9 _ . : -",
                    c.node_id
                ),
            ));
        }
        let listens_everywhere = self
            .server
            .address
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_unspecified());
        if c.advertise.is_empty() && listens_everywhere {
            return Err(ConfigError::invalid(
                "cluster.advertise",
                format!(
                    "required: server.address {} listens on every address, which is no \
                     address to send clients to; set advertise to this node's address as \
                     clients reach it (e.g. \"10.0.0.1:5700\")",
                    self.server.address
                ),
            ));
        }
        if !c.advertise.is_empty() {
            check_host_port("cluster.advertise", &c.advertise)?;
            let port = c.advertise.rsplit_once(':').map(|(_, port)| port);
            if port.and_then(|p| p.parse::<u16>().ok()) == Some(0) {
                return Err(ConfigError::invalid(
                    "cluster.advertise",
                    "port 0 is no address a client can be sent to; name the port clients \
                     connect to, or leave advertise empty to use the bound address",
                ));
            }
        }
        if !(1..=3600).contains(&c.lease_secs) {
            return Err(ConfigError::invalid(
                "cluster.lease_secs",
                format!("must be from 1 to 3600 (got {})", c.lease_secs),
            ));
        }
        if let Err(e) = (ciphermq_cluster::PgCoordinatorConfig {
            schema: c.schema.clone(),
            ..ciphermq_cluster::PgCoordinatorConfig::default()
        })
        .check_schema()
        {
            return Err(ConfigError::invalid("cluster.schema", e.to_string()));
        }
        match c.storage {
            ClusterStorage::Local => {
                if !c.shared_dir.as_os_str().is_empty() {
                    return Err(ConfigError::invalid(
                        "cluster.shared_dir",
                        "set, but cluster.storage = \"local\" does not use it; remove it or \
                         set storage = \"shared\"",
                    ));
                }
            }
            ClusterStorage::Shared => {
                if c.shared_dir.as_os_str().is_empty() {
                    return Err(ConfigError::invalid(
                        "cluster.shared_dir",
                        "empty, but cluster.storage = \"shared\" keeps every owner's queues \
                         there: set it to a directory every node reaches",
                    ));
                }
                if self.storage.mode != StorageMode::Durable {
                    return Err(ConfigError::invalid(
                        "cluster.storage",
                        "\"shared\" keeps queues on disk: it needs storage.mode = \"durable\"",
                    ));
                }
            }
        }
        Ok(())
    }
}
