//! Where the bridge connects and how it paces the metadata mirror.

use std::path::PathBuf;
use std::time::Duration;

use super::tls::{driver_mode, SslMode};

/// Connection and pacing settings of the PostgreSQL bridge (`[database]`).
#[derive(Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// Role to log in as.
    pub user: String,
    /// Password, when the server asks for one. Never printed.
    pub password: Option<String>,
    /// Database holding the CipherMQ tables.
    pub dbname: String,
    /// Whether the link uses TLS and what it checks of the server's
    /// certificate (libpq's meanings). Default [`SslMode::Prefer`].
    pub sslmode: SslMode,
    /// PEM file of the CA(s) the server's certificate must chain to:
    /// required by [`SslMode::VerifyFull`]; with [`SslMode::Require`] the
    /// chain (not the host name) is checked when it is given.
    pub ca_cert_path: Option<PathBuf>,
    /// Most metadata rows written per transaction (values below 1 count as
    /// 1). It bounds the bridge's memory: it never holds more than one batch.
    pub batch_size: usize,
    /// The cluster node whose stored copies the mirror's rows describe
    /// (`cluster.node_id`); empty for a broker on its own. Rows and
    /// positions are kept per node, so two nodes holding copies of one
    /// queue name (an owner that moved) never mix theirs.
    pub node: String,
    /// How often the tailer looks for new log records and commits a partial
    /// batch: the usual delay between a publish and its row (values below
    /// 10 ms count as 10 ms).
    pub flush_interval: Duration,
    /// Disk budget, in bytes: log bytes the mirror has not read yet that the
    /// broker keeps for it. Past it, fully acked segments are deleted anyway
    /// and the rows in them will be missing from `message_metadata`.
    pub max_unmirrored_bytes: u64,
    /// How long [`PgBridge::start`](super::PgBridge::start) keeps retrying
    /// the first connection before giving up.
    pub connect_timeout: Duration,
    /// How often keys registered by other brokers on the same database are
    /// read into memory; `None` (the default): never, the broker is the
    /// only writer. A cluster's nodes share one `public_keys` table.
    pub key_refresh: Option<Duration>,
}

impl Default for PgConfig {
    /// `postgres@127.0.0.1:5432/ciphermq`, `sslmode` prefer, 1000 rows a batch, every 200 ms,
    /// 1 GiB of disk budget, 30 s to connect at start.
    fn default() -> PgConfig {
        PgConfig {
            host: "127.0.0.1".to_owned(),
            port: 5432,
            user: "postgres".to_owned(),
            password: None,
            dbname: "ciphermq".to_owned(),
            sslmode: SslMode::default(),
            ca_cert_path: None,
            batch_size: 1000,
            node: String::new(),
            flush_interval: Duration::from_millis(200),
            max_unmirrored_bytes: 1 << 30,
            connect_timeout: Duration::from_secs(30),
            key_refresh: None,
        }
    }
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .field("ca_cert_path", &self.ca_cert_path)
            .field("batch_size", &self.batch_size)
            .field("node", &self.node)
            .field("flush_interval", &self.flush_interval)
            .field("max_unmirrored_bytes", &self.max_unmirrored_bytes)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl PgConfig {
    /// `host:port/dbname`, for messages a person reads.
    pub(crate) fn target(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.dbname)
    }

    /// The batch size actually used.
    pub(crate) fn rows_per_batch(&self) -> usize {
        self.batch_size.max(1)
    }

    /// The tick actually used.
    pub(crate) fn tick(&self) -> Duration {
        self.flush_interval.max(Duration::from_millis(10))
    }

    /// The driver's settings for one connection attempt of at most `timeout`.
    pub(crate) fn driver(&self, timeout: Duration) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name("ciphermq-pgbridge")
            .ssl_mode(driver_mode(self))
            .connect_timeout(timeout)
            // A silently dead server is noticed within about a minute, not
            // after the kernel's two-hour default.
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if let Some(password) = &self.password {
            config.password(password.as_bytes());
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let config = PgConfig {
            password: Some("hunter2".to_owned()),
            ..PgConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<hidden>"), "{shown}");
        assert_eq!(config.target(), "127.0.0.1:5432/ciphermq");
    }

    #[test]
    fn degenerate_pacing_is_clamped() {
        let config = PgConfig {
            batch_size: 0,
            node: String::new(),
            flush_interval: Duration::ZERO,
            ..PgConfig::default()
        };
        assert_eq!(config.rows_per_batch(), 1);
        assert_eq!(config.tick(), Duration::from_millis(10));
    }
}
