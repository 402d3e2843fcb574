//! The PostgreSQL backend: with `database.backend = "postgres"`, the broker
//! keeps receivers' public keys and mirrors message metadata in PostgreSQL.
//!
//! Map:
//! - [`postgres`]: the PostgreSQL bridge ([`PgBridge`]): a dedicated thread
//!   that keeps the key directory in `public_keys` and tails the broker's
//!   durable queue logs into `message_metadata`, committing a per-queue
//!   watermark with each batch.
//!
//! The key-store trait, the in-memory and embedded stores and the sealing
//! the `public_keys` rows share with the embedded store's files live in
//! `ciphermq-keystore`; this crate builds its key table on them.
//!
//! Invariants: nothing here blocks a shard (bounded channels, `try_send`,
//! answers through oneshots); no key is served before it is durable; no key
//! or message body is logged.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod postgres;

pub use postgres::{BridgeError, BridgeStatus, PgBridge, PgConfig, SslMode, UnknownSslMode};
