//! The data layer of a CipherMQ cluster: what several brokers must agree on
//! to serve as one, kept in a coordinator (PostgreSQL) instead of a
//! consensus protocol of our own.
//!
//! Map:
//! - [`coordinator`]: the [`Coordinator`] trait (what a node asks of the
//!   coordinator) and the records it answers with. A second backend (etcd)
//!   would implement the same trait.
//! - [`postgres`]: [`PgCoordinator`], the PostgreSQL implementation: one
//!   thread with its own connection, blocking calls answered from it.
//! - `worker`: that thread: the connection, reconnecting, one call at a
//!   time.
//! - `schema`: the tables, created if missing, in the schema the config
//!   names.
//! - [`config`]: where to connect and which schema to use.
//! - `input`: the checks every name and address passes before any SQL.
//! - [`error`]: [`ClusterError`], one variant per thing that can go wrong.
//! - [`shared_storage`]: `cluster.storage = "shared"`: one directory per
//!   owner and tenure on storage every node reaches, fenced by renaming.
//! - [`watch`]: failure detection: which nodes' heartbeats stood still
//!   for a lease plus a margin on the watcher's own clock, with its link
//!   up the whole time.
//!
//! Invariants:
//! - An owner has at most one placement; placing one is a single insert
//!   that only one node can win, so every node gets the same answer.
//! - A placement's epoch starts at 1 and only ever rises (by one per move,
//!   compare-and-set on the epoch the mover saw).
//! - A node's incarnation rises on every registration; a heartbeat from an
//!   older incarnation is refused (fencing).
//! - Every placement change takes a new, higher `version`, and changes
//!   become visible in `version` order, so a node can mirror placements by
//!   asking only for what is newer than the last version it saw.
//!
//! - A move is a row of `cluster_moves` that goes `requested` →
//!   `exported` → `done` (the placement changes in that same transaction)
//!   or `aborted`; either end is a compare-and-set, so an old node that
//!   gives up and a new node that finishes cannot both win.
//!
//! - A node is declared dead only by a compare-and-set on the row a
//!   watcher saw silent; its owners move to fresh nodes at epoch + 1 in
//!   that same transaction.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod config;
pub mod coordinator;
pub mod error;
mod input;
pub mod postgres;
mod schema;
pub mod shared_storage;
pub mod watch;
mod worker;

pub use config::PgCoordinatorConfig;
pub use coordinator::{
    Coordinator, Exchange, Handback, Move, MoveState, NodeInfo, Placement, PlacementChanges,
    Takeover, TakeoverRecord,
};
pub use error::ClusterError;
pub use postgres::PgCoordinator;
pub use watch::{HeartbeatWatch, Suspect};
