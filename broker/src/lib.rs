//! The CipherMQ broker: thread-per-core, mutual TLS, payloads it cannot read.
//!
//! Map:
//! - [`config`]: the typed `config.toml`, validated before anything binds.
//! - [`logging`]: the console and JSON file sinks, chosen so each line is stored once.
//! - [`acl`]: roles from certificate CNs and the permission matrix.
//! - [`rate_limit`]: per-CN token buckets and open-connection caps.
//! - [`policy`]: the `[acl]` and `[rate_limit]` snapshot `SIGHUP` reloads.
//! - [`reload`]: the one reload path (`SIGHUP`, `POST /api/reload`): `[tls]`,
//!   `[acl]` and `[rate_limit]`, all or nothing.
//! - [`closures`]: connections ended from outside: `close_connection` (an
//!   admin ending a CN's connections) and a reloaded CRL's revocations.
//! - [`tls`], [`tls_store`], [`crl`], [`identity`]: `[tls]` loaded (rustls
//!   with required client certificates, CRLs), the version in force (swapped
//!   by a reload, read once per handshake), and who a certificate names
//!   (its CN or its URI SAN).
//! - [`tls_session`]: the hand-driven rustls session that can move between
//!   shards.
//! - [`sys`]: the only `unsafe` code (fd hand-off, io_uring and memlock probes).
//! - [`server`]: start-up ([`start`], [`StartError`]) and the running
//!   broker's handle ([`BrokerHandle`]).
//! - `shard_runtime`: one shard's pinned glommio executor: its accept loop
//!   (behind the handshake gate) and background tasks.
//! - `handoff`: TLS handshake, identification (CN or URI SAN), and hand-off
//!   to the owner shard `fnv1a(identity) % N`, which adopts the connection.
//! - `shutdown`: the signal that stops every shard, and a shard's final drain
//!   (bounded by `server.shutdown_timeout_secs`, see [`Drain`]).
//! - [`pulse`]: each shard's heartbeat and what its drain still waits for,
//!   readable from any thread.
//! - [`stall_watch`], [`nudge`]: each shard's watch of its own loop (lag,
//!   stalls, the heartbeat), and the thread that wakes a shard whose executor
//!   fell asleep with work still to run.
//! - [`systemd`]: `sd_notify` by hand (readiness, stopping, the watchdog
//!   that pings only while every shard beats).
//! - [`preflight`]: `ciphermq-broker --check-config`, the start-up checks
//!   that need neither a port nor the data directory's lock.
//! - [`connection`], [`line_buffer`], [`replies`]: one connection's future
//!   (the I/O shell), its input framing, and its in-order replies.
//! - `session`, `commands`: a client's session without the socket, and what
//!   each command does in it; tested line by line against a real shard.
//! - [`context`]: settings and services a connection reaches.
//! - [`storage`], [`committer`]: the data directory recovered at start-up, and
//!   each shard's group committer (writes and `fdatasync` on a blocking-I/O
//!   thread, then `ACK`s).
//! - [`backlog_reader`]: each shard's reads of queued bodies kept on disk
//!   only (past the memory budget), ahead of the consumers.
//! - [`chores`]: what a purge or a deletion leaves to settle and free, done
//!   in slices between the shard's other tasks.
//! - [`topology_file`]: `topology.json` and its `.prev` copy, loaded at start
//!   and written by the topology store's saver thread (never on a shard);
//!   the other files of the data directory go through `ciphermq-datadir`.
//! - `admin_view`: what the admin endpoint (`ciphermq-admin`, on its own
//!   thread) reads of this broker; the figures each shard publishes without
//!   waiting are `ciphermq_admin::stats`.
//!
//! Invariants: a shard's state is touched only by its own thread; nothing on a
//! shard blocks; replies leave in command order; a `RefCell` borrow never spans
//! an `.await`.

#![warn(missing_docs, unreachable_pub)]

pub mod acl;
mod admin_view;
pub mod backlog_reader;
pub mod chores;
pub mod closures;
pub mod cluster;
mod commands;
pub mod committer;
pub mod config;
pub mod connection;
pub mod context;
pub mod crl;
pub mod disk_watch;
pub mod file_deleter;
mod handoff;
pub mod handshake_gate;
pub mod identity;
pub mod line_buffer;
mod line_clock;
pub mod log_file;
pub mod logging;
pub mod nudge;
pub mod policy;
pub mod preflight;
pub mod pulse;
pub mod rate_limit;
pub mod reload;
pub mod replies;
pub mod server;
pub mod serving;
mod session;
mod shard_runtime;
mod shutdown;
pub mod stall_watch;
pub mod storage;
pub mod sys;
pub mod systemd;
pub mod tls;
pub mod tls_session;
pub mod tls_store;
pub mod topology_file;

pub use config::Config;
pub use server::{start, BrokerHandle, StartError};
pub use shutdown::Drain;
