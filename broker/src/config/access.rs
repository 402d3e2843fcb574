//! `[rate_limit]` and `[acl]`: how often and what each client may do (both
//! reloaded on `SIGHUP`), and their checks.

use std::fmt;

use serde::Deserialize;

use super::{Config, ConfigError};

/// `[rate_limit]`: per-CN token buckets and connection caps (docs/ARCHITECTURE.md,
/// "Identity and access").
/// Reloaded on `SIGHUP`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Apply the token buckets below. Default false. (The connection caps
    /// apply either way.)
    pub enabled: bool,
    /// Commands per second per CN, any command (refill rate), > 0; a
    /// fraction is fine (`0.5` is one command every two seconds).
    /// Default 10 000.
    pub global_rps: f64,
    /// Commands a CN may send in a burst above `global_rps`, at least 1.
    /// A float with no fraction (`200.0`, as the reference wrote it) is
    /// taken as that whole number. Default 20 000.
    #[serde(deserialize_with = "whole_u32")]
    pub global_burst: u32,
    /// Publishes per second per CN (each also takes a global token), > 0;
    /// a fraction is fine. Default 10 000.
    pub publish_rps: f64,
    /// Publishes a CN may send in a burst above `publish_rps`, at least 1;
    /// a float with no fraction is accepted. Default 20 000.
    #[serde(deserialize_with = "whole_u32")]
    pub publish_burst: u32,
    /// Open connections per client IP address, at least 1, always enforced;
    /// a float with no fraction is accepted. Default 1000.
    #[serde(deserialize_with = "whole_u32")]
    pub max_connections_per_ip: u32,
    /// Open connections per certificate CN, at least 1, always enforced;
    /// a float with no fraction is accepted. Default 100.
    #[serde(deserialize_with = "whole_u32")]
    pub max_connections_per_cn: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            enabled: false,
            global_rps: 10_000.0,
            global_burst: 20_000,
            publish_rps: 10_000.0,
            publish_burst: 20_000,
            max_connections_per_ip: 1000,
            max_connections_per_cn: 100,
        }
    }
}

/// `[acl]`: role membership by certificate CN (docs/ARCHITECTURE.md, "Identity
/// and access"). A CN in several lists gets the first role of admin, sender,
/// receiver, monitor. Reloaded on `SIGHUP`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AclConfig {
    /// CNs with every permission. Default empty.
    pub admin_cns: Vec<String>,
    /// CNs that may publish and fetch public keys. Default empty.
    pub sender_cns: Vec<String>,
    /// CNs that may declare, bind and consume their own queues. Default empty.
    pub receiver_cns: Vec<String>,
    /// CNs that may read the admin endpoint (`/metrics`, `/api/*`) and do
    /// nothing else: give scrapers and dashboards these, not admin
    /// certificates. On the broker port they may only send heartbeats.
    /// Default empty.
    pub monitor_cns: Vec<String>,
    /// Whether every publish must name its sender in the body
    /// (`sender_client_id`, checked against the publisher's CN): without it a
    /// receiver cannot tell two senders' messages apart by more than their
    /// id. A publish without one is then `NACK <id> invalid`. Default false:
    /// a body that names its sender is checked either way.
    pub require_sender_id: bool,
}

impl Config {
    pub(super) fn validate_rate_limit(&self) -> Result<(), ConfigError> {
        let r = &self.rate_limit;
        for (key, rps) in [
            ("rate_limit.global_rps", r.global_rps),
            ("rate_limit.publish_rps", r.publish_rps),
        ] {
            if !(rps.is_finite() && rps > 0.0) {
                return Err(ConfigError::invalid(
                    key,
                    format!("must be a positive number (got {rps})"),
                ));
            }
        }
        for (key, value) in [
            ("rate_limit.global_burst", r.global_burst),
            ("rate_limit.publish_burst", r.publish_burst),
            (
                "rate_limit.max_connections_per_ip",
                r.max_connections_per_ip,
            ),
            (
                "rate_limit.max_connections_per_cn",
                r.max_connections_per_cn,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        Ok(())
    }

    pub(super) fn validate_acl(&self) -> Result<(), ConfigError> {
        for (list, cns) in [
            ("acl.admin_cns", &self.acl.admin_cns),
            ("acl.sender_cns", &self.acl.sender_cns),
            ("acl.receiver_cns", &self.acl.receiver_cns),
            ("acl.monitor_cns", &self.acl.monitor_cns),
        ] {
            for (i, cn) in cns.iter().enumerate() {
                // The wire protocol's name rule: a CN names queues and keys.
                if !ciphermq_proto::is_valid_name(cn) {
                    return Err(ConfigError::invalid(
                        format!("{list}[{i}]"),
                        format!(
                            "{cn:?} is not a valid CN (must match [A-Za-z0-9_.:-]{{1,255}}, and not be \".\" or \"..\")"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A whole number for a `u32` key. Besides integers it takes a float with no
/// fraction (`200.0`, as the reference CipherMQ wrote its bursts); a float
/// with one is an error naming the value.
fn whole_u32<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    struct WholeVisitor;
    impl serde::de::Visitor<'_> for WholeVisitor {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a whole number from 0 to {}", u32::MAX)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u32, E> {
            u32::try_from(v)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<u32, E> {
            if v.is_finite() && v.fract() != 0.0 {
                return Err(E::custom(format_args!(
                    "{v} is not a whole number (it counts commands or connections; write {} or {})",
                    v.floor(),
                    v.ceil()
                )));
            }
            if !(0.0..=f64::from(u32::MAX)).contains(&v) {
                return Err(E::invalid_value(serde::de::Unexpected::Float(v), &self));
            }
            // Whole and in range: the conversion is exact.
            Ok(v as u32)
        }
    }
    deserializer.deserialize_any(WholeVisitor)
}
