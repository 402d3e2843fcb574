//! `[server]`: the client listener, and its checks.

use serde::Deserialize;

use super::checks::check_host_port;
use super::{Config, ConfigError, MAX_DURATION_SECS, MAX_SHARDS};

/// `[server]`: the client listener.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address for mutual-TLS clients, `host:port` (`[v6]:port` for IPv6;
    /// port 0 picks a free port). Default `127.0.0.1:5700`.
    pub address: String,
    /// Number of shards (one pinned executor each); 0 means one per CPU core.
    /// At most [`MAX_SHARDS`]. Default 0.
    pub shards: usize,
    /// Name of this broker in status output and logs, 1–255 printable characters.
    /// Default `ciphermq`.
    pub name: String,
    /// Seconds a stopping broker (SIGTERM, SIGINT) gives its connections to
    /// be answered and closed; past it the shards give up, what is still
    /// open is logged, and `ciphermq-broker` exits with status 3. Acks are
    /// sent only after `fdatasync`, so nothing acknowledged is lost by giving
    /// up. 0 = wait for as long as it takes. At most [`MAX_DURATION_SECS`].
    /// Default 30.
    pub shutdown_timeout_secs: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            address: "127.0.0.1:5700".to_owned(),
            shards: 0,
            name: "ciphermq".to_owned(),
            shutdown_timeout_secs: 30,
        }
    }
}

impl Config {
    pub(super) fn validate_server(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        check_host_port("server.address", &s.address)?;
        if s.shards > MAX_SHARDS {
            return Err(ConfigError::invalid(
                "server.shards",
                format!("{} is more than {MAX_SHARDS} (0 = one per core)", s.shards),
            ));
        }
        if s.shutdown_timeout_secs > MAX_DURATION_SECS {
            return Err(ConfigError::invalid(
                "server.shutdown_timeout_secs",
                format!(
                    "{} is more than ten years; set 0 to wait for the drain however long it takes",
                    s.shutdown_timeout_secs
                ),
            ));
        }
        if s.name.is_empty() || s.name.len() > 255 || s.name.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                "server.name",
                "must be 1 to 255 bytes without control characters",
            ));
        }
        Ok(())
    }
}
