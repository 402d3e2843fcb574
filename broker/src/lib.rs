//! The CipherMQ broker: thread-per-core, mutual TLS, payloads it cannot read.
//!
//! Map (one folder per part of the broker; `ls broker/src` reads the same):
//! - [`config`]: the typed `config.toml`, validated before anything binds; a
//!   file per section, with its defaults and checks.
//! - [`logging`]: the console and JSON file sinks, chosen so each line is stored once.
//! - `runtime`: starting and stopping: [`start`] and the running broker's
//!   handle ([`BrokerHandle`]), one pinned glommio executor per shard, the
//!   shutdown drain ([`Drain`]), the settings and services a connection
//!   reaches, `ciphermq-broker --check-config` ([`preflight`]), systemd's
//!   notifications ([`systemd`]), and the crate's only `unsafe` code (`sys`).
//! - `tls`: `[tls]` loaded (rustls with required client certificates), the
//!   version in force (swapped by a reload), CRLs, and the hand-driven rustls
//!   session that can move between shards.
//! - `access`: who a certificate names, roles from CNs and the permission
//!   matrix, per-CN rate limits, the `[acl]`/`[rate_limit]` snapshot, the one
//!   reload path (`SIGHUP`, `POST /api/reload`), and connections closed from
//!   outside (an admin's `close_connection`, a reloaded CRL's revocations).
//! - `conn`: one connection as I/O: the handshake gate, the hand-off to the
//!   owner shard `fnv1a(identity) % N`, the connection's future, its input
//!   framing and clock, its in-order replies, and the task queues a shard
//!   serves connections from.
//! - `session`: a client's session without the socket, and what each command
//!   does in it; tested line by line against a real shard.
//! - `storage`: the data directory recovered at start-up, each shard's group
//!   committer (writes and `fdatasync` on a blocking-I/O thread, then
//!   `ACK`s), log files written around the page cache, backlog reads, file
//!   deletion off the shard, purge and deletion chores, `topology.json`, and
//!   the free-space watch.
//! - `liveness`: each shard's heartbeat and stall watch, and the thread that
//!   wakes a shard whose executor fell asleep with work still to run.
//! - `cluster`: a node of a cluster coordinated by PostgreSQL: placements,
//!   moves, takeover, shared storage.
//! - `admin_view`: what the admin endpoint (`ciphermq-admin`, on its own
//!   thread) reads of this broker; the figures each shard publishes without
//!   waiting are `ciphermq_stats`.
//!
//! Invariants: a shard's state is touched only by its own thread; nothing on a
//! shard blocks; replies leave in command order; a `RefCell` borrow never spans
//! an `.await`.

#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_code)]

pub(crate) mod access;
mod admin_view;
pub(crate) mod cluster;
pub mod config;
pub(crate) mod conn;
pub(crate) mod liveness;
pub mod logging;
pub(crate) mod runtime;
pub(crate) mod session;
pub(crate) mod storage;
pub(crate) mod tls;

pub use config::Config;
pub use runtime::server::{start, BrokerHandle, StartError};
pub use runtime::shutdown::Drain;
pub use runtime::{preflight, systemd};
