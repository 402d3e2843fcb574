//! The `ciphermq/1` wire format, shared by the broker, the clients and the bench.
//!
//! Map:
//! - [`name`]: the name rule for queues, exchanges, client ids, message ids and
//!   routing keys.
//! - [`request`]: one request line parsed into a borrowed [`Request`], without copies.
//! - [`message`]: the `EncryptedInputData` body check that a publish needs (its id,
//!   its five required fields), again without copies.
//! - [`reply`]: the reply lines the broker writes, and their parser for clients.
//! - [`delivery`]: `Message: <id> <queue> <count> <json>` lines, both ways.
//!
//! Everything here is pure: no I/O, no clock, no allocation on the hot paths
//! beyond what the caller's output buffer needs.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod delivery;
mod envelope_scan;
pub mod message;
pub mod name;
pub mod redirect;
pub mod reply;
pub mod request;

pub use delivery::Delivery;
pub use message::{
    inspect_batch, inspect_batch_at_most, inspect_message, inspect_message_by_parser, BatchElement,
    BatchError, MessageError, MessageInfo,
};
pub use name::{is_valid_name, is_valid_routing_pattern};
pub use redirect::Redirect;
pub use reply::{NackReason, Reply};
pub use request::{ExchangeKind, ParseError, Request};

/// The protocol name and version sent in the `HELLO` greeting.
pub const PROTOCOL: &str = "ciphermq/1";
