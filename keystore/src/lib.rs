//! Where the broker keeps receivers' public keys, whatever the database
//! backend: the key-store trait every store implements, the in-memory store,
//! the embedded store (sealed files under `{data_dir}/keys`) and the sealing
//! shared by every durable store.
//!
//! Its own crate so that a broker without PostgreSQL links no PostgreSQL
//! client for its keys, and so that the PostgreSQL bridge
//! (`ciphermq-pgbridge`) builds its key table on the same trait and the same
//! sealing instead of owning them.
//!
//! Map:
//! - [`keys`]: the [`PublicKeyStore`] trait the broker talks to, and the
//!   in-memory store. Registration never blocks the caller (a shard): it
//!   returns a [`Registration`] that resolves once the key is durable.
//!   Lookups are always served from memory and see a key only once durable.
//! - [`file_store`]: the embedded store, sealed key files under
//!   `{data_dir}/keys`, written on its own writer thread.
//! - [`seal`]: AES-256-GCM sealing shared by both durable stores (these
//!   files and the PostgreSQL rows).
//!
//! Invariants: nothing here blocks a shard (bounded channels, `try_send`,
//! answers through oneshots); no key is served before it is durable; no key
//! is logged.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod file_store;
pub mod keys;
pub mod seal;

pub use file_store::{FileKeyStore, OpenError};
pub use keys::{
    register_and_wait, KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore, Registration,
    RegistrationResult,
};
