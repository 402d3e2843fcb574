//! The broker as a process: start-up and its checks, one pinned executor
//! per shard, what a connection reaches of the shared state, shutdown,
//! systemd's notifications, and the crate's only `unsafe` code.

pub(crate) mod context;
pub mod preflight;
pub(crate) mod server;
pub(crate) mod shard;
pub(crate) mod shutdown;
pub(crate) mod sys;
pub mod systemd;
