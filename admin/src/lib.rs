//! What the CipherMQ broker reports, and how operators read it.
//!
//! Map:
//! - The figures every shard publishes without waiting (relaxed counters,
//!   histograms, queue snapshots) and the broker's lifecycle are the
//!   `ciphermq-stats` crate's: the shards write them, this crate reads them.
//! - [`broker_view`]: what else the endpoint reads from the broker (identity,
//!   access, limits, connections, topology), as a trait the broker implements.
//! - [`config`]: the `[admin]` section of the broker's config.
//! - `endpoint`: the admin endpoint's thread, listeners and connections
//!   (HTTP/1.1 over mutual TLS, and plain-HTTP probes on loopback).
//! - `slots`: which connections may hold one of the endpoint's slots, and for
//!   how long (its log lines go through `ciphermq_shard::log_throttled!`).
//! - `routes`: who may see what; `peer`: who a connection's client is,
//!   judged again after each reload (a revoked certificate is refused at its
//!   next request); `same_origin`: no request from another web site changes
//!   the broker; `status`: the JSON; `metrics`: the Prometheus text;
//!   `process`: the process's own figures from `/proc`.
//! - [`dashboard`]: the web dashboard, one self-contained page served at
//!   `GET /`; [`dashboard_proxy`]: `ciphermq-admin dashboard`, which serves it
//!   on loopback for a browser without a client certificate.
//! - [`remote`]: the operator's connections to a running broker (the admin
//!   endpoint over HTTPS, the client port in `ciphermq/1`; each at one
//!   address or at the first reachable of several, a request sent to one
//!   never resent), used by the
//!   `ciphermq-admin` tool (`src/main.rs`, `src/cli/`); [`command_line`]: the
//!   `ciphermq/1` lines it sends, built only from arguments that pass the
//!   protocol's name rules, so no argument can end a command and start
//!   another.
//!
//! Invariants: nothing here runs on a shard or makes a shard wait; every
//! answer is built from snapshots and atomic reads.

#![warn(missing_docs, unreachable_pub)]

pub mod broker_view;
pub mod cluster_status;
pub mod command_line;
pub mod config;
pub mod dashboard;
pub mod dashboard_proxy;
mod endpoint;
mod metrics;
mod peer;
mod process;
pub mod remote;
mod routes;
mod same_origin;
mod slots;
mod status;
pub mod thread_sched;

pub use broker_view::{Access, BrokerView, Limits, TlsExpiries};
pub use config::AdminConfig;
pub use endpoint::{AdminContext, AdminError, AdminListener, AdminServer};
pub use same_origin::{CHANGE_HEADER, CHANGE_HEADER_VALUE};
pub use slots::AdminLimits;
