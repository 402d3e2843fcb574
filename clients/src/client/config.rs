//! [`ClientConfig`]: where the broker is, who we are, and the bounds of one
//! connection (publish window, retries, reply timeout, heartbeats, receiver key
//! pins).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::backoff::Backoff;
use crate::client::error::{ConnectError, PinStoreError};
use crate::client::pins::{FilePins, KeyPins, MemoryPins};
use crate::connection::TlsClientOptions;

/// Most publishes one connection keeps unanswered, at most (the broker stops
/// reading a connection that owes 65,536 replies).
pub const MAX_PUBLISH_WINDOW: usize = 65_536;

/// How a publish refused for a retryable reason (`rate_limited`, `queue_full`,
/// `disk_full`, `storage`, `timeout`) is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Publishes of one message in all, the first included (at least 1; 1 means
    /// never retry).
    pub max_attempts: u32,
    /// Delay before each retry: doubling from `backoff.base` up to `backoff.max`,
    /// each drawn from the upper half of its range (jitter).
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// `max_attempts` publishes in all, waiting from `base` doubling up to `max`
    /// between them.
    pub fn new(max_attempts: u32, base: Duration, max: Duration) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            backoff: Backoff::new(base, max),
        }
    }

    /// Publish once; a retryable NACK is returned as it is.
    pub fn never() -> RetryPolicy {
        RetryPolicy::new(1, Duration::ZERO, Duration::ZERO)
    }
}

impl Default for RetryPolicy {
    /// 6 attempts (5 retries), 100 ms doubling up to 10 s: rides out about 20 s of
    /// a full queue or disk, like the reference sender.
    fn default() -> Self {
        RetryPolicy::new(6, Duration::from_millis(100), Duration::from_secs(10))
    }
}

/// Where the TLS client configuration comes from.
#[derive(Clone)]
pub(crate) enum TlsSource {
    /// Files, loaded at each connect.
    Options(TlsClientOptions),
    /// A connector loaded once, for many connections.
    Connector {
        /// rustls configuration with our certificate.
        connector: TlsConnector,
        /// SNI and the name checked in the broker's certificate.
        server_name: ServerName<'static>,
    },
}

/// Everything [`Client::connect`](crate::Client::connect) needs. Built with
/// [`ClientConfig::new`] (or [`ClientConfig::from_files`]) and adjusted with the
/// builder methods; every bound is checked at connect.
///
/// ```
/// use std::time::Duration;
/// use ciphermq_clients::{ClientConfig, RetryPolicy, TlsClientOptions};
///
/// let tls = TlsClientOptions::for_cn("certs".as_ref(), "sender_1");
/// let config = ClientConfig::new("127.0.0.1:5700", tls)
///     .publish_window(256)
///     .retry(RetryPolicy::new(10, Duration::from_millis(50), Duration::from_secs(5)))
///     .reply_timeout(Duration::from_secs(20));
/// assert_eq!(config.address(), "127.0.0.1:5700");
/// ```
#[derive(Clone)]
pub struct ClientConfig {
    /// `host:port` of the broker.
    pub(crate) address: String,
    /// Our certificate and the CA we trust.
    pub(crate) tls: TlsSource,
    /// Publishes in flight at most on the connection.
    pub(crate) publish_window: usize,
    /// Retries of retryable NACKs.
    pub(crate) retry: RetryPolicy,
    /// Longest wait for the oldest reply before the connection is given up.
    pub(crate) reply_timeout: Duration,
    /// A `heartbeat` after this long without a command; `None`: never.
    pub(crate) heartbeat_interval: Option<Duration>,
    /// Receivers' keys pinned on first use.
    pub(crate) pins: Arc<dyn KeyPins>,
    /// How long a receiver's key fetched and checked is used before it is
    /// asked for (and checked against its pin) again.
    pub(crate) key_cache_ttl: Duration,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tls = match &self.tls {
            TlsSource::Options(o) => format!("{o:?}"),
            TlsSource::Connector { server_name, .. } => {
                format!("connector for {}", server_name.to_str())
            }
        };
        f.debug_struct("ClientConfig")
            .field("address", &self.address)
            .field("tls", &tls)
            .field("publish_window", &self.publish_window)
            .field("retry", &self.retry)
            .field("reply_timeout", &self.reply_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("pins", &self.pins)
            .field("key_cache_ttl", &self.key_cache_ttl)
            .finish()
    }
}

impl ClientConfig {
    /// A configuration for the broker at `address` (`host:port`) with the TLS
    /// files of `tls`, and the defaults: a publish window of 1,000, the default
    /// [`RetryPolicy`], a 30 s reply timeout, a heartbeat after 15 s without a
    /// command, receiver keys pinned in memory ([`MemoryPins`]) and re-checked
    /// every 5 minutes.
    pub fn new(address: impl Into<String>, tls: TlsClientOptions) -> ClientConfig {
        ClientConfig::with_source(address.into(), TlsSource::Options(tls))
    }

    /// [`ClientConfig::new`] from the three PEM files: the CA that signed the
    /// broker's certificate, our certificate (its CN is our identity) and our
    /// private key; the broker's certificate must be valid for `localhost`
    /// (change it with [`TlsClientOptions`] and [`ClientConfig::new`]).
    pub fn from_files(
        address: impl Into<String>,
        ca_cert: impl Into<PathBuf>,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> ClientConfig {
        ClientConfig::new(
            address,
            TlsClientOptions {
                ca_cert: ca_cert.into(),
                cert: cert.into(),
                key: key.into(),
                server_name: "localhost".to_owned(),
                check_hostname: true,
            },
        )
    }

    /// [`ClientConfig::new`] with a connector loaded once
    /// ([`TlsClientOptions::connector`]), for a process that opens many
    /// connections or reconnects often.
    pub fn with_connector(
        address: impl Into<String>,
        connector: TlsConnector,
        server_name: ServerName<'static>,
    ) -> ClientConfig {
        ClientConfig::with_source(
            address.into(),
            TlsSource::Connector {
                connector,
                server_name,
            },
        )
    }

    /// The same settings for the broker at `address`: another node of a
    /// cluster.
    pub fn for_address(&self, address: impl Into<String>) -> ClientConfig {
        ClientConfig {
            address: address.into(),
            ..self.clone()
        }
    }

    /// The defaults around a TLS source.
    fn with_source(address: String, tls: TlsSource) -> ClientConfig {
        ClientConfig {
            address,
            tls,
            publish_window: 1000,
            retry: RetryPolicy::default(),
            reply_timeout: Duration::from_secs(30),
            heartbeat_interval: Some(Duration::from_secs(15)),
            pins: Arc::new(MemoryPins::new()),
            key_cache_ttl: Duration::from_secs(300),
        }
    }

    /// Publishes awaiting their reply at most (1 to [`MAX_PUBLISH_WINDOW`];
    /// default 1,000). A publish past it waits for a free slot, so a fast
    /// producer is held back by the broker's pace.
    pub fn publish_window(mut self, publishes: usize) -> ClientConfig {
        self.publish_window = publishes;
        self
    }

    /// Retries of retryable NACKs (default: [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> ClientConfig {
        self.retry = policy;
        self
    }

    /// Longest wait for the reply to the oldest command (default 30 s, more
    /// than zero). Replies come in order, so a command left unanswered this long
    /// ends the connection: every command waiting fails with
    /// [`Disconnected::ReplyTimeout`](crate::Disconnected::ReplyTimeout).
    pub fn reply_timeout(mut self, timeout: Duration) -> ClientConfig {
        self.reply_timeout = timeout;
        self
    }

    /// Send `heartbeat` after this long without a command (default 15 s; `None`:
    /// never). The broker closes a receiver silent past
    /// `performance.heartbeat_timeout_secs` (60 s by default) and any client
    /// past `idle_timeout_secs` (300 s).
    pub fn heartbeat_interval(mut self, interval: Option<Duration>) -> ClientConfig {
        self.heartbeat_interval = interval;
        self
    }

    /// Where receivers' public keys are pinned (default: in memory, for the
    /// life of the client). Clones of the store share pins, so one store may
    /// serve several clients.
    pub fn key_pins(mut self, pins: Arc<dyn KeyPins>) -> ClientConfig {
        self.pins = pins;
        self
    }

    /// Pins receivers' keys in the file at `path` (`known_receivers`, one
    /// `<receiver_id> <base64 key>` line each, created when first needed), so
    /// pins outlive the process; see [`FilePins`].
    pub fn known_receivers_file(
        self,
        path: impl AsRef<Path>,
    ) -> Result<ClientConfig, PinStoreError> {
        let pins = FilePins::open(path.as_ref())?;
        Ok(self.key_pins(Arc::new(pins)))
    }

    /// How long a receiver's key, once fetched and found equal to its pin, is
    /// used before the broker is asked again (default 5 minutes). Asking again
    /// is what notices a key that changed; zero asks before every
    /// [`Publisher::publish_to`](crate::Publisher::publish_to).
    pub fn key_cache_ttl(mut self, ttl: Duration) -> ClientConfig {
        self.key_cache_ttl = ttl;
        self
    }

    /// The broker's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Checks every bound; the error names the setting.
    pub(crate) fn validate(&self) -> Result<(), ConnectError> {
        if !(1..=MAX_PUBLISH_WINDOW).contains(&self.publish_window) {
            return Err(ConnectError::Config(format!(
                "publish_window {} is outside 1..={MAX_PUBLISH_WINDOW}",
                self.publish_window
            )));
        }
        if self.retry.max_attempts == 0 {
            return Err(ConnectError::Config(
                "retry.max_attempts must be at least 1 (1: no retries)".to_owned(),
            ));
        }
        if self.reply_timeout.is_zero() {
            return Err(ConnectError::Config(
                "reply_timeout must be more than zero".to_owned(),
            ));
        }
        if self.heartbeat_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConnectError::Config(
                "heartbeat_interval must be more than zero (None turns heartbeats off)".to_owned(),
            ));
        }
        Ok(())
    }

    /// The connector and server name, loading the files when given files.
    pub(crate) fn connector(&self) -> Result<(TlsConnector, ServerName<'static>), ConnectError> {
        match &self.tls {
            TlsSource::Options(o) => Ok((
                o.connector().map_err(ConnectError::Transport)?,
                o.server_name().map_err(ConnectError::Transport)?,
            )),
            TlsSource::Connector {
                connector,
                server_name,
            } => Ok((connector.clone(), server_name.clone())),
        }
    }
}
