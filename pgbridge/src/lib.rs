//! Where the broker keeps receivers' public keys (and, with the Postgres
//! backend, mirrors message metadata).
//!
//! Map:
//! - [`keys`]: the [`PublicKeyStore`] trait the broker talks to, and the
//!   in-memory store. Lookups are always served from memory; a store's job is
//!   to make a registration durable before it is acknowledged.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod file_store;
pub mod keys;

pub use file_store::{FileKeyStore, OpenError};
pub use keys::{KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore};
