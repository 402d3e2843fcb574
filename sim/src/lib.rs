//! A seeded, replayable simulation of the shard core: shards, their group
//! commit and their backlog reads over a simulated disk, driven by random
//! clients and a simulated clock, with invariants checked after every step.
//!
//! In the spirit of deterministic simulation testing: one seed fixes every
//! choice (the clients' actions, when time passes, which storage call fails,
//! where a power cut tears a file), so a failure prints its seed and
//! `ciphermq-sim --seed <seed>` replays it exactly.
//!
//! Map:
//! - [`rng`]: the seeded generator, the only source of chance.
//! - [`disk`]: real files with a record of what a power cut keeps.
//! - [`committer`]: the broker's commit rounds and backlog reads, run
//!   synchronously over the simulated disk, with faults.
//! - [`model`]: what the clients know, and the invariants.
//! - [`shard_on_disk`]: a durable shard over the simulated disk.
//! - [`world`]: one run: the shards, the clients, crashes and restarts.
//!
//! What is real: the shard crate entire (queues, routing, confinement,
//! dedup, the logs' encoding, rounds and failure handling, recovery). What
//! is simulated: the clock, the disk's durability, the committer (the
//! storage calls of each job are the broker's own list,
//! `ciphermq_shard::log::storage_calls`, made on the simulated disk; the
//! rounds around them follow `broker/src/storage/committer.rs`) and the
//! clients. The session layer (command lines, the ACL) is not driven
//! here; its own tests pin every reply.

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod committer;
pub mod disk;
pub mod model;
pub mod rng;
pub mod shard_on_disk;
pub mod world;

pub use world::{run, Failure, Options, Summary};
