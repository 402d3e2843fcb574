//! Whether each shard is alive and moving: its heartbeat, the watch of its
//! own loop, and the nudge that wakes an executor asleep with work to run.

pub(crate) mod nudge;
pub(crate) mod pulse;
pub(crate) mod stall_watch;
