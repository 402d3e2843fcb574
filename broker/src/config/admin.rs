//! `[admin]`: the section's type is [`ciphermq_admin::config::AdminConfig`]
//! (the endpoint's own crate); here are the broker's checks of it,
//! including that it does not take the client port.

use std::net::SocketAddr;

use super::checks::check_host_port;
use super::{AdminConfig, Config, ConfigError, MAX_ADMIN_CONNECTIONS, MAX_ADMIN_TIMEOUT_SECS};

/// `[admin]`: the address and the bounds of the connection limits.
pub(super) fn validate_admin(admin: &AdminConfig) -> Result<(), ConfigError> {
    check_host_port("admin.address", &admin.address)?;
    if let Some(probe) = &admin.probe_address {
        // No certificate is asked for there: loopback only.
        let loopback = probe
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        if !loopback {
            return Err(ConfigError::invalid(
                "admin.probe_address",
                format!("{probe:?} is not a loopback ip:port (e.g. \"127.0.0.1:9092\"): it serves plain HTTP without client certificates"),
            ));
        }
        if !admin.enabled {
            return Err(ConfigError::invalid(
                "admin.probe_address",
                "is served by the admin endpoint: set admin.enabled = true too",
            ));
        }
        // Port 0 (any free port) differs each time it is bound.
        if *probe == admin.address && !probe.ends_with(":0") {
            return Err(ConfigError::invalid(
                "admin.probe_address",
                format!("{probe:?} is admin.address too; give the probes a port of their own"),
            ));
        }
    }
    if !(1..=MAX_ADMIN_CONNECTIONS).contains(&admin.max_connections) {
        return Err(ConfigError::invalid(
            "admin.max_connections",
            format!(
                "{} is not between 1 and {MAX_ADMIN_CONNECTIONS}",
                admin.max_connections
            ),
        ));
    }
    if !(1..=admin.max_connections).contains(&admin.max_connections_per_ip) {
        return Err(ConfigError::invalid(
            "admin.max_connections_per_ip",
            format!(
                "{} is not between 1 and admin.max_connections ({})",
                admin.max_connections_per_ip, admin.max_connections
            ),
        ));
    }
    for (key, secs) in [
        ("admin.header_timeout_secs", admin.header_timeout_secs),
        ("admin.idle_timeout_secs", admin.idle_timeout_secs),
        ("admin.response_timeout_secs", admin.response_timeout_secs),
    ] {
        if !(1..=MAX_ADMIN_TIMEOUT_SECS).contains(&secs) {
            return Err(ConfigError::invalid(
                key,
                format!("{secs} is not between 1 and {MAX_ADMIN_TIMEOUT_SECS}"),
            ));
        }
    }
    let max_series = ciphermq_admin::config::MAX_QUEUE_SERIES;
    if !(1..=max_series).contains(&admin.max_queue_series) {
        return Err(ConfigError::invalid(
            "admin.max_queue_series",
            format!(
                "{} is not between 1 and {max_series}",
                admin.max_queue_series
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// With the admin endpoint on, `admin.address` must not be the client
    /// port `server.address`: both listeners would bind it, and the second
    /// bind would fail with a bare "address in use" blamed on one key only.
    /// Port 0 (any free port) is never a clash; an unspecified IP
    /// (`0.0.0.0`, `[::]`) clashes with any IP of the same family on that
    /// port. Public, so the start can check again after `--address`.
    pub fn validate_admin_address(&self) -> Result<(), ConfigError> {
        let (admin, server) = (&self.admin.address, &self.server.address);
        if !self.admin.enabled || admin.ends_with(":0") || server.ends_with(":0") {
            return Ok(());
        }
        let clash = admin == server
            || match (admin.parse::<SocketAddr>(), server.parse::<SocketAddr>()) {
                (Ok(a), Ok(s)) => {
                    a.port() == s.port()
                        && a.is_ipv4() == s.is_ipv4()
                        && (a.ip() == s.ip() || a.ip().is_unspecified() || s.ip().is_unspecified())
                }
                _ => false,
            };
        if clash {
            return Err(ConfigError::invalid(
                "admin.address",
                format!(
                    "{admin:?} clashes with server.address ({server:?}): the admin endpoint \
                     and the client port each need a port of their own; change one of them"
                ),
            ));
        }
        Ok(())
    }
}
