//! Mutual TLS: the `[tls]` material, the version in force, CRLs, and the
//! rustls session a connection carries between shards.

pub(crate) mod crl;
pub(crate) mod material;
pub(crate) mod session;
pub(crate) mod store;
