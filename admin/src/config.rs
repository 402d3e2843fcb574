//! `[admin]`: the endpoint's section of the broker's `config.toml`. The
//! broker's config loader reads and validates it with the rest of the file;
//! the endpoint turns it into [`crate::AdminLimits`] and its listeners.

use serde::Deserialize;

/// Upper bound of `admin.max_connections`: the endpoint serves a few
/// dashboards and scrapers, and a full slot table is scanned on each accept.
pub const MAX_ADMIN_CONNECTIONS: u32 = 4096;

/// Upper bound of the `admin.*_timeout_secs` keys: they exist to drop idle
/// and slow clients promptly, and an hour is no longer prompt.
pub const MAX_ADMIN_TIMEOUT_SECS: u64 = 3600;

/// Upper bound of `admin.max_queue_series`: every exported queue costs each
/// scraper seven series, and past ten thousand queues a per-queue view is no
/// longer something a dashboard or an alert can use.
pub const MAX_QUEUE_SERIES: usize = 10_000;

/// `[admin]`: the HTTP/1.1-over-mTLS admin endpoint (docs/PROTOCOL.md,
/// "Admin endpoint"). Its connection limits keep monitoring served while
/// hostile clients hold connections (idle sockets, slowloris, one address
/// taking every slot).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Start the admin endpoint. Default false.
    pub enabled: bool,
    /// Its listen address, `host:port`. Default `127.0.0.1:9091`.
    pub address: String,
    /// Admin connections open at once, 1 to [`MAX_ADMIN_CONNECTIONS`]. When
    /// all are taken a newcomer replaces the connection most worth dropping
    /// (still in its handshake, then without a finished request, then idle
    /// longest); it is refused only while every connection is answering a
    /// request. Default 64.
    pub max_connections: u32,
    /// Admin connections open at once from one client address (an IPv6 /64
    /// counts as one), 1 to `max_connections`, so one address cannot take
    /// every slot. At the cap a newcomer replaces that address's oldest
    /// connection without a finished request, else it is refused. Default 8.
    pub max_connections_per_ip: u32,
    /// Seconds from accept within which the TLS handshake and the first
    /// request's headers must be done, else the connection is closed (idle
    /// sockets, slowloris), 1 to [`MAX_ADMIN_TIMEOUT_SECS`]. Default 5.
    pub header_timeout_secs: u64,
    /// Seconds a kept-alive connection has, after a response, until the next
    /// request's headers are complete, 1 to [`MAX_ADMIN_TIMEOUT_SECS`].
    /// Default 10.
    pub idle_timeout_secs: u64,
    /// Seconds to produce a response and hand all of it to the connection
    /// once the request's headers are in, 1 to [`MAX_ADMIN_TIMEOUT_SECS`]
    /// (a client that then does not read it is closed at the idle timeout).
    /// Default 10.
    pub response_timeout_secs: u64,
    /// A loopback `ip:port` that also serves `/health` and `/ready` over
    /// plain HTTP, without client certificates, for liveness and readiness
    /// probes that cannot present one. Every other path is 404 there.
    /// Default none.
    pub probe_address: Option<String>,
    /// Export the per-queue series of `/metrics` (`ciphermq_queue_ready`,
    /// `_unacked`, `_bytes`, …, labels `queue` and `shard`). Queue names are
    /// chosen by clients, so each declared queue would otherwise be seven
    /// more series in every scraper's storage: a client declaring many
    /// queues must not be able to blow up their cardinality unless the
    /// operator asks for it. The per-shard sums are exported either way.
    /// Default false.
    pub queue_metrics: bool,
    /// With `queue_metrics`, the most queues exported, 1 to
    /// [`MAX_QUEUE_SERIES`]: those with the most messages (ready and
    /// unacked; ties by name), so the series a scraper stores stay bounded
    /// however many queues clients declare, and the ones left out are the
    /// least likely to matter (`ciphermq_queue_series_dropped` counts them).
    /// Default 100.
    pub max_queue_series: usize,
}

/// What `/metrics` exports per queue: `admin.queue_metrics` and
/// `admin.max_queue_series`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSeries {
    /// Export per-queue series at all.
    pub enabled: bool,
    /// At most this many queues get series (the deepest).
    pub max: usize,
}

impl Default for QueueSeries {
    fn default() -> Self {
        AdminConfig::default().queue_series()
    }
}

impl AdminConfig {
    /// The per-queue series settings, as `/metrics` reads them.
    pub fn queue_series(&self) -> QueueSeries {
        QueueSeries {
            enabled: self.queue_metrics,
            max: self.max_queue_series,
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: false,
            address: "127.0.0.1:9091".to_owned(),
            max_connections: 64,
            max_connections_per_ip: 8,
            header_timeout_secs: 5,
            idle_timeout_secs: 10,
            response_timeout_secs: 10,
            probe_address: None,
            queue_metrics: false,
            max_queue_series: 100,
        }
    }
}
