//! One client connection as I/O: admitted by the handshake gate, handed to
//! the shard that owns its identity, then driven by its future (framing,
//! the line clock, in-order replies) in the task queues the shard serves
//! connections from. What its commands do is `session`.

pub(crate) mod connection;
pub(crate) mod handoff;
pub(crate) mod handshake_gate;
pub(crate) mod line_buffer;
pub(crate) mod line_clock;
pub(crate) mod replies;
pub(crate) mod serving;
