//! The sender's `config.json`: typed, with documented defaults and bounds; unknown
//! keys are errors.
//!
//! ```json
//! {
//!   "server_address": "127.0.0.1:5700",
//!   "tls": { "certificate_path": "certs/ca.crt", "client_cert_path": "certs/sender_1.crt",
//!            "client_key_path": "certs/sender_1.key", "check_hostname": true },
//!   "exchange_name": "ex",
//!   "routing_key": "{receiver_id}",
//!   "receivers": ["receiver_1"],
//!   "keys_dir": "keys",
//!   "message_count": 10,
//!   "content_template": { "text": "Message {seq} from {sender_id}", "sent_at": "{timestamp}" },
//!   "sender": { "max_inflight": 1000, "max_retries": 5, "ack_timeout_secs": 30 }
//! }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::client_config::{self, check_name, ConfigError, LoggingConfig, TlsConfig};

/// Most publishes a sender may keep unanswered. The broker stops reading a
/// connection with `performance.max_pending_replies` (default 65,536) replies owed.
pub const MAX_INFLIGHT_LIMIT: usize = 65_536;

/// The whole sender configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderConfig {
    /// The broker, `host:port` (default `127.0.0.1:5700`), or several seeds
    /// separated by commas (`a:5700,b:5700`): the first connection tries them
    /// in order and uses the first that answers; in a cluster any node will do.
    #[serde(default = "default_address")]
    pub server_address: String,
    /// Our certificate and the CA; our CN (announced by the broker's `HELLO`) is
    /// the `{sender_id}` of message ids.
    pub tls: TlsConfig,
    /// Exchange every message is published to (default `ex`, the exchange the
    /// reference receiver declares). The sender cannot declare it: receivers do.
    #[serde(default = "default_exchange")]
    pub exchange_name: String,
    /// Routing key per receiver; `{receiver_id}` is replaced by the receiver's id
    /// (default `{receiver_id}`, the key the reference receiver binds).
    #[serde(default = "default_routing_key")]
    pub routing_key: String,
    /// Receivers each message is encrypted for and sent to, one copy each
    /// (overridden by `--to`).
    #[serde(default)]
    pub receivers: Vec<String>,
    /// Cache of receivers' public keys, `<receiver_id>_public.key` (default `keys`,
    /// where `ciphermq-pki` writes them).
    #[serde(default = "default_keys_dir")]
    pub keys_dir: PathBuf,
    /// Receivers' public keys pinned on first use, one `<receiver_id> <base64>`
    /// line each (default `<keys_dir>/known_receivers`). A key the broker offers
    /// later that differs is refused; delete the receiver's line to accept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_receivers: Option<PathBuf>,
    /// Messages rendered from `content_template` when no other input is given
    /// (default 10); each goes to every receiver.
    #[serde(default = "default_message_count")]
    pub message_count: u64,
    /// The plaintext of each message: a string, or a JSON object (any fields) sent
    /// as compact JSON. `{sender_id}`, `{correlation_id}`, `{timestamp}` and `{seq}`
    /// are replaced in every string.
    #[serde(default = "default_template")]
    pub content_template: serde_json::Value,
    /// Pad every templated plaintext to at least this many bytes (default 0: none);
    /// for load tests of a given message size.
    #[serde(default)]
    pub pad_to_bytes: usize,
    /// Pipeline, retry and reconnect settings.
    #[serde(default)]
    pub sender: PipelineConfig,
    /// Log level and optional JSON log file.
    #[serde(default)]
    pub logging: LoggingConfig,
}

/// The `sender` section: how hard the sender pushes and how it recovers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Publishes written and not yet answered, at most (default 1000, 1 to
    /// 65,536). Larger hides more latency; the broker's reply order makes any
    /// window safe.
    pub max_inflight: usize,
    /// Extra publishes of a message after a retriable NACK (`rate_limited`,
    /// `queue_full`, `storage`, `timeout`) or an ACK timeout (default 5).
    pub max_retries: u32,
    /// Seconds a publish may wait for its reply before the connection is deemed
    /// stuck, replaced, and the publish retried (default 30, at least 1).
    pub ack_timeout_secs: u64,
    /// First retry delay in milliseconds, doubled per failure (default 100).
    pub retry_backoff_ms: u64,
    /// Longest retry or reconnect delay in milliseconds (default 10,000).
    pub max_backoff_ms: u64,
    /// Failed reconnection attempts in a row before giving up, once a first
    /// connection was made (default 20; 0 = never give up).
    pub reconnect_attempts: u32,
    /// Seconds the first connection may keep failing (refused, unreachable)
    /// before the sender gives up, for a broker that is still starting
    /// (default 0: fail at once, naming the address; `--wait-for-broker`).
    pub wait_for_broker_secs: u64,
    /// Seconds to wait for a receiver's public key to be registered before
    /// falling back to the cached key file (default 10; 0 = ask once).
    pub key_wait_secs: u64,
    /// Threads encrypting in parallel (default 0 = one per CPU core).
    pub encrypt_workers: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            max_inflight: 1000,
            max_retries: 5,
            ack_timeout_secs: 30,
            retry_backoff_ms: 100,
            max_backoff_ms: 10_000,
            reconnect_attempts: 20,
            wait_for_broker_secs: 0,
            key_wait_secs: 10,
            encrypt_workers: 0,
        }
    }
}

impl PipelineConfig {
    /// The ACK timeout as a duration.
    pub fn ack_timeout(&self) -> Duration {
        Duration::from_secs(self.ack_timeout_secs)
    }

    /// The retry and reconnect backoff.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.retry_backoff_ms),
            Duration::from_millis(self.max_backoff_ms),
        )
    }

    /// `encrypt_workers`, with 0 meaning one per core.
    pub fn workers(&self) -> usize {
        match self.encrypt_workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl SenderConfig {
    /// A configuration with every default, for `tls` (used by tests and tools that
    /// build a config in code).
    pub fn new(server_address: impl Into<String>, tls: TlsConfig) -> SenderConfig {
        SenderConfig {
            server_address: server_address.into(),
            tls,
            exchange_name: default_exchange(),
            routing_key: default_routing_key(),
            receivers: Vec::new(),
            keys_dir: default_keys_dir(),
            known_receivers: None,
            message_count: default_message_count(),
            content_template: default_template(),
            pad_to_bytes: 0,
            sender: PipelineConfig::default(),
            logging: LoggingConfig::default(),
        }
    }

    /// Loads `path`, resolves relative paths against its directory, validates.
    pub fn load(path: &Path) -> Result<SenderConfig, ConfigError> {
        let mut config: SenderConfig = client_config::load_json(path)?;
        config.resolve_paths(&client_config::base_dir(path));
        config.validate()?;
        Ok(config)
    }

    /// Makes every relative path relative to `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        self.tls.resolve_paths(base);
        self.logging.resolve_paths(base);
        client_config::resolve(base, &mut self.keys_dir);
        if let Some(path) = &mut self.known_receivers {
            client_config::resolve(base, path);
        }
    }

    /// The pin file: `known_receivers`, else `<keys_dir>/known_receivers`.
    pub fn known_receivers_path(&self) -> PathBuf {
        self.known_receivers
            .clone()
            .unwrap_or_else(|| self.keys_dir.join("known_receivers"))
    }

    /// Checks bounds and names; call again after changing fields from flags.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = &self.sender;
        if !(1..=MAX_INFLIGHT_LIMIT).contains(&p.max_inflight) {
            return Err(ConfigError::Invalid {
                key: "sender.max_inflight",
                reason: format!(
                    "{} is out of range 1..={MAX_INFLIGHT_LIMIT}",
                    p.max_inflight
                ),
            });
        }
        if p.ack_timeout_secs == 0 {
            return Err(ConfigError::Invalid {
                key: "sender.ack_timeout_secs",
                reason: "must be at least 1".to_owned(),
            });
        }
        client_config::seed_addresses(&self.server_address)?;
        check_name("exchange_name", &self.exchange_name)?;
        if self.receivers.is_empty() {
            return Err(ConfigError::Invalid {
                key: "receivers",
                reason: "name at least one receiver (or pass --to)".to_owned(),
            });
        }
        for receiver in &self.receivers {
            check_name("receivers", receiver)?;
            check_name("routing_key", &self.routing_key_for(receiver))?;
        }
        if !(self.content_template.is_string()
            || self.content_template.is_object()
            || self.content_template.is_array())
        {
            return Err(ConfigError::Invalid {
                key: "content_template",
                reason: "must be a string, an object or an array".to_owned(),
            });
        }
        if self.pad_to_bytes > 16 * 1024 * 1024 {
            return Err(ConfigError::Invalid {
                key: "pad_to_bytes",
                reason: "at most 16 MiB (the broker refuses bodies over max_message_bytes anyway)"
                    .to_owned(),
            });
        }
        Ok(())
    }

    /// The routing key of `receiver`'s copies.
    pub fn routing_key_for(&self, receiver: &str) -> String {
        self.routing_key.replace("{receiver_id}", receiver)
    }
}

fn default_address() -> String {
    "127.0.0.1:5700".to_owned()
}

fn default_exchange() -> String {
    "ex".to_owned()
}

fn default_routing_key() -> String {
    "{receiver_id}".to_owned()
}

fn default_keys_dir() -> PathBuf {
    PathBuf::from("keys")
}

fn default_message_count() -> u64 {
    10
}

fn default_template() -> serde_json::Value {
    serde_json::json!({
        "text": "Message {seq} from {sender_id}",
        "correlation_id": "{correlation_id}",
        "sent_at": "{timestamp}",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_config::parse_json;

    const MINIMAL: &str = r#"{"tls":{"certificate_path":"c/ca.crt","client_cert_path":"c/s.crt","client_key_path":"c/s.key"},"receivers":["receiver_1"]}"#;

    #[test]
    fn minimal_config_takes_defaults() {
        let mut c: SenderConfig = parse_json(MINIMAL, Path::new("s.json")).unwrap();
        c.resolve_paths(Path::new("/base"));
        c.validate().unwrap();
        assert_eq!(c.server_address, "127.0.0.1:5700");
        assert_eq!(c.exchange_name, "ex");
        assert_eq!(c.routing_key_for("receiver_1"), "receiver_1");
        assert_eq!(c.keys_dir, Path::new("/base/keys"));
        assert_eq!(c.sender, PipelineConfig::default());
        assert_eq!(c.tls.certificate_path, Path::new("/base/c/ca.crt"));
    }

    #[test]
    fn bounds_are_checked() {
        let mut c: SenderConfig = parse_json(MINIMAL, Path::new("s.json")).unwrap();
        c.sender.max_inflight = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("sender.max_inflight"));
        c.sender.max_inflight = 10;
        c.receivers = vec!["bad name".into()];
        assert!(c.validate().unwrap_err().to_string().contains("receivers"));
        c.receivers.clear();
        assert!(c.validate().is_err());
        c.receivers = vec!["r".into()];
        c.routing_key = "{receiver_id} x".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("routing_key"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = MINIMAL.replace(
            "\"receivers\"",
            "\"sender\":{\"max_infligt\":3},\"receivers\"",
        );
        let err = parse_json::<SenderConfig>(&text, Path::new("s.json")).unwrap_err();
        assert!(err.to_string().contains("max_infligt"), "{err}");
    }

    #[test]
    fn the_shipped_example_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sender.json");
        let c = SenderConfig::load(&path).unwrap();
        assert_eq!(c.receivers, ["receiver_1"]);
    }
}
