//! The `config.toml` text of a test broker: loopback on port 0, the test
//! PKI's certificates, logs off, in-memory storage with a low disk
//! watermark, and the ACL a test names. One renderer, so that a setting
//! every test broker needs is changed in one place.

use std::path::{Path, PathBuf};

/// The disk watermark of test brokers: low, so a machine short of space
/// still runs the suite (the watermark's own tests set theirs).
pub const TEST_MIN_FREE: &str = "min_free_mb = 16";

/// The drain bound the broker's own tests give their brokers
/// (`server.shutdown_timeout_secs`): the bound shards had before it was a
/// setting, so a test that leaves a client that does not read still stops
/// in a few seconds.
pub const TEST_SHUTDOWN_TIMEOUT: &str = "shutdown_timeout_secs = 5";

/// The settings of a test broker that tests vary, rendered by
/// [`BrokerConfig::text`]. An empty ACL list is left out of the text.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// `server.address` (`127.0.0.1:0` unless set).
    pub address: String,
    /// `server.shards` (2 unless set).
    pub shards: usize,
    /// Where `server.crt`, `server.key` and `ca.crt` are.
    pub certs: PathBuf,
    /// `storage.data_dir`.
    pub data: PathBuf,
    /// Whether `server.shutdown_timeout_secs` is [`TEST_SHUTDOWN_TIMEOUT`]
    /// (off: the broker's default).
    pub short_shutdown: bool,
    /// `acl.admin_cns`.
    pub admin_cns: Vec<String>,
    /// `acl.sender_cns`.
    pub sender_cns: Vec<String>,
    /// `acl.receiver_cns`.
    pub receiver_cns: Vec<String>,
    /// `acl.monitor_cns`.
    pub monitor_cns: Vec<String>,
    /// Whole sections appended after `[acl]`.
    pub extra: String,
}

fn names(cns: &[&str]) -> Vec<String> {
    cns.iter().map(|s| s.to_string()).collect()
}

impl BrokerConfig {
    /// A broker of 2 shards on `127.0.0.1:0` with the certificates in
    /// `certs` and its data in `data`, nobody in its ACL yet.
    pub fn new(certs: &Path, data: &Path) -> BrokerConfig {
        BrokerConfig {
            address: "127.0.0.1:0".to_owned(),
            shards: 2,
            certs: certs.to_owned(),
            data: data.to_owned(),
            short_shutdown: false,
            admin_cns: Vec::new(),
            sender_cns: Vec::new(),
            receiver_cns: Vec::new(),
            monitor_cns: Vec::new(),
            extra: String::new(),
        }
    }

    /// Listens on `address` instead.
    pub fn address(mut self, address: &str) -> BrokerConfig {
        self.address = address.to_owned();
        self
    }

    /// Runs `shards` shards.
    pub fn shards(mut self, shards: usize) -> BrokerConfig {
        self.shards = shards;
        self
    }

    /// Bounds the drain at shutdown as [`TEST_SHUTDOWN_TIMEOUT`] says.
    pub fn short_shutdown(mut self) -> BrokerConfig {
        self.short_shutdown = true;
        self
    }

    /// `acl.admin_cns`.
    pub fn admins(mut self, cns: &[&str]) -> BrokerConfig {
        self.admin_cns = names(cns);
        self
    }

    /// `acl.sender_cns`.
    pub fn senders(mut self, cns: &[&str]) -> BrokerConfig {
        self.sender_cns = names(cns);
        self
    }

    /// `acl.receiver_cns`.
    pub fn receivers(mut self, cns: &[&str]) -> BrokerConfig {
        self.receiver_cns = names(cns);
        self
    }

    /// `acl.monitor_cns`.
    pub fn monitors(mut self, cns: &[&str]) -> BrokerConfig {
        self.monitor_cns = names(cns);
        self
    }

    /// Appends `sections` (whole TOML sections) after `[acl]`.
    pub fn extra(mut self, sections: &str) -> BrokerConfig {
        self.extra.push_str(sections);
        self
    }

    /// The config text.
    pub fn text(&self) -> String {
        let mut acl = String::new();
        for (key, cns) in [
            ("admin_cns", &self.admin_cns),
            ("sender_cns", &self.sender_cns),
            ("receiver_cns", &self.receiver_cns),
            ("monitor_cns", &self.monitor_cns),
        ] {
            if !cns.is_empty() {
                let list: Vec<String> = cns.iter().map(|cn| format!("\"{cn}\"")).collect();
                acl.push_str(&format!("{key} = [{}]\n", list.join(", ")));
            }
        }
        let shutdown = if self.short_shutdown {
            format!("{TEST_SHUTDOWN_TIMEOUT}\n")
        } else {
            String::new()
        };
        format!(
            r#"
[server]
address = "{address}"
shards = {shards}
{shutdown}
[tls]
cert_path = "{certs}/server.crt"
key_path = "{certs}/server.key"
ca_cert_path = "{certs}/ca.crt"

[logging]
console = false
json_files = false

[storage]
data_dir = "{data}"
mode = "memory"
{min_free}

[acl]
{acl}{extra}
"#,
            address = self.address,
            shards = self.shards,
            certs = self.certs.display(),
            data = self.data.display(),
            min_free = TEST_MIN_FREE,
            extra = self.extra,
        )
    }
}
