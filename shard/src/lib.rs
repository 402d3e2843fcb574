//! Per-core broker state, free of sockets and TLS so it can be tested alone.
//!
//! Map:
//! - [`placement`]: which shard owns a connection or a queue (FNV-1a of a CN).
//! - [`clock`]: where a shard reads the time (the system's, or a
//!   simulation's).
//! - [`message`]: the immutable, shared message a publish stores.
//! - [`topology`]: exchanges, queues and bindings; one writer at a time, and a
//!   read-mostly snapshot every shard routes against without locking. Saving
//!   it is the broker's: a [`TopologySink`] called on the store's saver
//!   thread, never on a shard.
//! - [`quota`]: per-CN caps on queues, exchanges and bindings, counted by the
//!   topology.
//! - [`routing`]: direct, fanout and topic matching inside a snapshot.
//! - [`log`]: durable per-queue segment logs: record format, write side, recovery.
//! - [`log_throttle`]: at most one log line per interval for events a client
//!   can cause at will.
//! - [`durability`]: a shard's logs, group-commit rounds and waiting publishes.
//! - [`backlog`]: ready messages whose bodies are only in the log (past the
//!   memory budget), and decoding them when they are read back.
//! - [`dedup`]: deduplication in one place: the key of an id, the ids a
//!   queue remembers (stored, or acked within the window, about 15 bytes
//!   each), and the dedup files that carry acked ids past their segments.
//! - [`queue`]: one queue's state machine: ready messages, unacked deliveries,
//!   competing consumers, dedup, dead-lettering.
//! - [`mailbox`]: how a shard hands replies and deliveries to a connection task.
//! - [`tracker`]: a connection's outstanding deliveries, for `ack`/`nack`/`resend`.
//! - [`mesh`]: the crossbeam channels and wakers between shards.
//! - [`pending`]: a value decided on another thread (a saved topology change)
//!   that a connection awaits.
//! - [`shard`]: one shard's state tying these together.
//!
//! Invariants: a shard owns its queues outright (no locks on the data path);
//! everything another shard needs travels as a [`mesh::ShardMsg`]; nothing here
//! blocks or awaits, so a `RefCell` borrow of a [`shard::Shard`] never spans an
//! `.await` in the shell that drives it. The crate opens no sockets and keeps
//! no metadata files (the topology and the data directory's own files are
//! the broker's, over `ciphermq-datadir`); the only files it touches are the
//! queue logs, read back and repaired by [`log`]'s recovery before any shard
//! serves.

// One use, a prefetch hint (`cache_hint`), which cannot affect memory safety.
#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod backlog;
mod cache_hint;
pub mod clock;
pub mod dedup;
pub mod durability;
pub mod hashers;
pub mod log;
pub mod log_throttle;
pub mod mailbox;
pub mod mesh;
pub mod message;
pub mod pending;
pub mod placement;
pub mod queue;
pub mod quota;
pub mod routing;
pub mod shard;
pub mod topology;
pub mod tracker;

pub use clock::{Clock, ManualClock};
pub use dedup::{DedupHasher, DedupKey};
pub use durability::{Durability, QueueRemoval};
pub use log::{CommitJob, JobIo, RecoveredQueue};
pub use mailbox::{Completion, ConnEvent, Mailbox};
pub use mesh::{
    Mesh, MeshEndpoint, MeshInbound, MeshInjector, MeshOutbound, Origin, ShardMsg, ShardTask,
};
pub use message::{Message, Route};
pub use placement::{shard_of, ConnRef, ShardId};
pub use queue::{Delivery, QueueSettings};
pub use quota::{Quotas, Resource, Usage};
pub use shard::{ChoreProgress, PublishStatus, QueueStats, Shard, TakenBack};
pub use topology::{
    ChangeResult, QueueInfo, Topology, TopologyChange, TopologyError, TopologySink, TopologyStore,
    TopologyView,
};
pub use tracker::{DeliveryTracker, Outstanding};
