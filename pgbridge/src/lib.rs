//! Where the broker keeps receivers' public keys and, with the PostgreSQL
//! backend, mirrors message metadata.
//!
//! Map:
//! - [`keys`]: the [`PublicKeyStore`] trait the broker talks to, and the
//!   in-memory store. Registration never blocks the caller (a shard): it
//!   returns a [`Registration`] that resolves once the key is durable.
//!   Lookups are always served from memory and see a key only once durable.
//! - [`file_store`]: the embedded store, sealed key files under
//!   `{data_dir}/keys`, written on its own writer thread.
//! - [`postgres`]: the PostgreSQL bridge ([`PgBridge`]): a dedicated thread
//!   that keeps the key directory in `public_keys` and tails the broker's
//!   durable queue logs into `message_metadata`, committing a per-queue
//!   watermark with each batch.
//! - `seal`: AES-256-GCM sealing shared by both durable stores.
//!
//! Invariants: nothing here blocks a shard (bounded channels, `try_send`,
//! answers through oneshots); no key is served before it is durable; no key
//! or message body is logged.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod file_store;
pub mod keys;
pub mod postgres;
mod seal;

pub use file_store::{FileKeyStore, OpenError};
pub use keys::{
    register_and_wait, KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore, Registration,
    RegistrationResult,
};
pub use postgres::{BridgeError, BridgeStatus, PgBridge, PgConfig, SslMode, UnknownSslMode};
