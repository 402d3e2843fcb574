//! The CipherMQ client library and the client-side tools.
//!
//! Modules:
//! - [`pki`]: generates the CA, the broker's server certificate, client certificates
//!   (the CN is the identity the broker's ACL sees), receivers' X25519 key pairs and
//!   the broker's AES key; the `ciphermq-pki` binary is a thin shell over it.
//! - [`connection`]: the client side of a `ciphermq/1` connection: mutual TLS,
//!   the `HELLO` greeting, buffered line I/O for pipelining, and a reader/writer split
//!   so one task can write commands while another reads replies.
//! - Later: hybrid end-to-end encryption (`encryption`) and the sender and receiver
//!   clients built on it.
//!
//! Invariants worth naming:
//! - Nothing is sent until a `flush`: queueing is free, so batching is the default.
//! - Replies come in command order; the library never reorders or drops a line.
//! - The PKI never overwrites a CA, an X25519 key pair or the AES key without being
//!   told to; private keys are born with mode 0600 and written atomically.
//!
//! Broker tests, the load generator and the reference clients all build on this
//! crate, so it stays small and allocation-light on the data path.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod connection;
pub mod pki;

pub use connection::{
    ClientError, Connection, ConnectionReader, ConnectionWriter, Hello, RawTls, TlsClientOptions,
};
pub use pki::{generate, PkiError, PkiOptions, PkiReport};
