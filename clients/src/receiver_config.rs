//! The receiver's `config.json`: typed, with documented defaults and bounds;
//! unknown keys are errors. `{cn}` in names and paths stands for the client id the
//! broker announces (our certificate's CN), so one file can serve any receiver.
//!
//! ```json
//! {
//!   "server_address": "127.0.0.1:5700",
//!   "tls": { "certificate_path": "certs/ca.crt", "client_cert_path": "certs/receiver_1.crt",
//!            "client_key_path": "certs/receiver_1.key" },
//!   "private_key_path": "keys/{cn}_private.key",
//!   "exchange_name": "ex", "exchange_type": "direct",
//!   "queue_name": "{cn}_queue", "routing_key": "{cn}",
//!   "prefetch": 1000, "output_dir": "data"
//! }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::client_config::{self, check_name, with_cn, ConfigError, LoggingConfig, TlsConfig};

/// The whole receiver configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverConfig {
    /// The broker, `host:port` (default `127.0.0.1:5700`), or several seeds
    /// separated by commas (`a:5700,b:5700`): the first connection tries them
    /// in order and uses the first that answers; in a cluster any node will do.
    #[serde(default = "default_address")]
    pub server_address: String,
    /// Our certificate and the CA.
    pub tls: TlsConfig,
    /// Our X25519 private key (default `keys/{cn}_private.key`, as `ciphermq-pki`
    /// writes it); its public key is registered with the broker at every connect.
    #[serde(default = "default_private_key_path")]
    pub private_key_path: PathBuf,
    /// Exchange to declare and bind to (default `ex`).
    #[serde(default = "default_exchange")]
    pub exchange_name: String,
    /// `direct`, `fanout` or `topic` (default `direct`). Declaring an existing
    /// exchange with another type is an error.
    #[serde(default = "default_exchange_type")]
    pub exchange_type: String,
    /// Queue to declare, bind and consume (default `{cn}_queue`; the ACL only lets
    /// a receiver use queues named `{cn}_queue` or starting with `{cn}_`).
    #[serde(default = "default_queue")]
    pub queue_name: String,
    /// Binding key (default `{cn}`, the sender's default routing key; the ACL
    /// allows `{cn}`, `{cn}.…` and `{cn}_…`).
    #[serde(default = "default_routing_key")]
    pub routing_key: String,
    /// Deliveries the broker may push before our acks (default 1000, at least 1).
    #[serde(default = "default_prefetch")]
    pub prefetch: u32,
    /// Directory of `<queue>_received_messages.jsonl` (default `data`).
    #[serde(default = "default_output_dir")]
    pub output_dir: PathBuf,
    /// Records written per fsync, at most (default 512, at least 1).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Milliseconds a decrypted message may wait for its batch to fill before
    /// the batch is written anyway (default 5). Acks wait for the write.
    #[serde(default = "default_batch_delay_ms")]
    pub batch_delay_ms: u64,
    /// Seconds between heartbeats (default 30; the broker closes receivers silent
    /// for `performance.heartbeat_timeout`, 60 by default). At least 1.
    #[serde(default = "default_heartbeat_secs")]
    pub heartbeat_secs: u64,
    /// First reconnect delay in milliseconds, doubled per failure (default 500).
    #[serde(default = "default_reconnect_backoff_ms")]
    pub reconnect_backoff_ms: u64,
    /// Longest reconnect delay in milliseconds (default 10,000).
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// Failed reconnection attempts in a row before giving up, once a first
    /// connection was made (default 0 = never: a receiver waits for its broker
    /// to come back).
    #[serde(default)]
    pub reconnect_attempts: u32,
    /// Seconds the first connection may keep failing (refused, unreachable)
    /// before the receiver gives up, for a broker that is still starting
    /// (default 0: fail at once, naming the address; `--wait-for-broker`).
    #[serde(default)]
    pub wait_for_broker_secs: u64,
    /// Log level and optional JSON log file.
    #[serde(default)]
    pub logging: LoggingConfig,
}

impl ReceiverConfig {
    /// A configuration with every default, for `tls`.
    pub fn new(server_address: impl Into<String>, tls: TlsConfig) -> ReceiverConfig {
        ReceiverConfig {
            server_address: server_address.into(),
            tls,
            private_key_path: default_private_key_path(),
            exchange_name: default_exchange(),
            exchange_type: default_exchange_type(),
            queue_name: default_queue(),
            routing_key: default_routing_key(),
            prefetch: default_prefetch(),
            output_dir: default_output_dir(),
            batch_size: default_batch_size(),
            batch_delay_ms: default_batch_delay_ms(),
            heartbeat_secs: default_heartbeat_secs(),
            reconnect_backoff_ms: default_reconnect_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
            reconnect_attempts: 0,
            wait_for_broker_secs: 0,
            logging: LoggingConfig::default(),
        }
    }

    /// Loads `path`, resolves relative paths against its directory, validates.
    pub fn load(path: &Path) -> Result<ReceiverConfig, ConfigError> {
        let mut config: ReceiverConfig = client_config::load_json(path)?;
        config.resolve_paths(&client_config::base_dir(path));
        config.validate()?;
        Ok(config)
    }

    /// Makes every relative path relative to `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        self.tls.resolve_paths(base);
        self.logging.resolve_paths(base);
        client_config::resolve(base, &mut self.private_key_path);
        client_config::resolve(base, &mut self.output_dir);
    }

    /// Checks bounds and names (with a placeholder CN; the real one is checked at
    /// connect).
    pub fn validate(&self) -> Result<(), ConfigError> {
        client_config::seed_addresses(&self.server_address)?;
        self.names("cn").map(|_| ())?;
        if !matches!(self.exchange_type.as_str(), "direct" | "fanout" | "topic") {
            return Err(ConfigError::Invalid {
                key: "exchange_type",
                reason: format!("{:?}: expected direct, fanout or topic", self.exchange_type),
            });
        }
        let positive = [
            ("prefetch", u64::from(self.prefetch)),
            ("batch_size", self.batch_size as u64),
            ("heartbeat_secs", self.heartbeat_secs),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(ConfigError::Invalid {
                    key,
                    reason: "must be at least 1".to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Queue name and routing key for `cn`, checked against the name rule
    /// (routing keys may hold `*` and `#` for topic exchanges).
    pub fn names(&self, cn: &str) -> Result<(String, String), ConfigError> {
        let queue = with_cn(&self.queue_name, cn);
        check_name("queue_name", &queue)?;
        check_name("exchange_name", &self.exchange_name)?;
        let key = with_cn(&self.routing_key, cn);
        if !ciphermq_proto::is_valid_routing_pattern(&key) {
            return Err(ConfigError::Invalid {
                key: "routing_key",
                reason: format!("{key:?} is not a valid routing key"),
            });
        }
        Ok((queue, key))
    }

    /// The private key file for `cn`.
    pub fn private_key_for(&self, cn: &str) -> PathBuf {
        PathBuf::from(with_cn(&self.private_key_path.to_string_lossy(), cn))
    }

    /// The output file for `queue`.
    pub fn output_file(&self, queue: &str) -> PathBuf {
        self.output_dir
            .join(format!("{queue}_received_messages.jsonl"))
    }

    /// The reconnect backoff.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.reconnect_backoff_ms),
            Duration::from_millis(self.max_backoff_ms),
        )
    }
}

fn default_address() -> String {
    "127.0.0.1:5700".to_owned()
}

fn default_private_key_path() -> PathBuf {
    PathBuf::from("keys/{cn}_private.key")
}

fn default_exchange() -> String {
    "ex".to_owned()
}

fn default_exchange_type() -> String {
    "direct".to_owned()
}

fn default_queue() -> String {
    "{cn}_queue".to_owned()
}

fn default_routing_key() -> String {
    "{cn}".to_owned()
}

fn default_prefetch() -> u32 {
    1000
}

fn default_output_dir() -> PathBuf {
    PathBuf::from("data")
}

fn default_batch_size() -> usize {
    512
}

fn default_batch_delay_ms() -> u64 {
    5
}

fn default_heartbeat_secs() -> u64 {
    30
}

fn default_reconnect_backoff_ms() -> u64 {
    500
}

fn default_max_backoff_ms() -> u64 {
    10_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_config::parse_json;

    const MINIMAL: &str = r#"{"tls":{"certificate_path":"c/ca.crt","client_cert_path":"c/r.crt","client_key_path":"c/r.key"}}"#;

    #[test]
    fn defaults_follow_the_cn() {
        let mut c: ReceiverConfig = parse_json(MINIMAL, Path::new("r.json")).unwrap();
        c.resolve_paths(Path::new("/b"));
        c.validate().unwrap();
        let (queue, key) = c.names("receiver_1").unwrap();
        assert_eq!(queue, "receiver_1_queue");
        assert_eq!(key, "receiver_1");
        assert_eq!(
            c.private_key_for("receiver_1"),
            Path::new("/b/keys/receiver_1_private.key")
        );
        assert_eq!(
            c.output_file(&queue),
            Path::new("/b/data/receiver_1_queue_received_messages.jsonl")
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut c: ReceiverConfig = parse_json(MINIMAL, Path::new("r.json")).unwrap();
        c.exchange_type = "headers".into();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("exchange_type"));
        c.exchange_type = "topic".into();
        c.prefetch = 0;
        assert!(c.validate().unwrap_err().to_string().contains("prefetch"));
        c.prefetch = 1;
        c.queue_name = "a queue".into();
        assert!(c.validate().unwrap_err().to_string().contains("queue_name"));
    }

    #[test]
    fn the_shipped_example_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/receiver.json");
        let c = ReceiverConfig::load(&path).unwrap();
        assert_eq!(c.names("receiver_1").unwrap().0, "receiver_1_queue");
    }
}
