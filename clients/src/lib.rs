//! The CipherMQ client library and the client-side tools.
//!
//! Modules:
//! - [`pki`]: the CA (its key apart from the leaf keys), the broker's server
//!   certificate, client certificates (the CN is the identity the broker's ACL
//!   sees), receivers' X25519 key pairs and the broker's AES key: made once, kept,
//!   listed; the `ciphermq-pki` binary is a thin shell over it.
//! - [`connection`]: the client side of a `ciphermq/1` connection: mutual TLS,
//!   the `HELLO` greeting, buffered line I/O for pipelining, and a reader/writer split
//!   so one task can write commands while another reads replies.
//! - [`crypto`]: hybrid end-to-end encryption (sealed-box session key,
//!   ChaCha20-Poly1305 body bound to its message id) and [`EncryptedInputData`];
//!   [`key_file`]: the X25519 key files `ciphermq-pki` writes.
//! - The sender: [`sender::run_sender`] (encryption stage and pipelined publish
//!   pump), its bookkeeping [`outbox`] (pure: replies, retries, timeouts),
//!   [`message_source`] (templates, files, stdin), [`sender_config`].
//! - The receiver: [`receiver::run_receiver`] (setup, consume, batch, ack), its
//!   ordered parallel decryption stage (`opener`), [`journal`] (the output file
//!   and the dedup set), [`receiver_config`].
//! - Shared plumbing: [`client_config`] (`tls`/`logging` sections, JSON loading),
//!   [`backoff`], [`logging`], [`progress`].
//!
//! Invariants worth naming:
//! - Nothing is sent until a `flush`: queueing is free, so batching is the default.
//! - Replies come in command order; the library never reorders or drops a line.
//! - The PKI never replaces a CA or a certificate without being told to, and never
//!   an X25519 key pair or the AES key; private keys are born with mode 0600 and
//!   written atomically, the CA key in its own 0700 directory.
//! - The receiver acknowledges a message only once its record is fsynced, and never
//!   writes a message twice: a message is its sender (`sender_client_id`, which
//!   the sender always sets and the broker verifies) and its id. The sender counts
//!   a message acknowledged only on the broker's `ACK`.
//! - Nothing logs a message body, a session key or a private key.
//!
//! Broker tests, the load generator and the reference clients all build on this
//! crate, so it stays small and allocation-light on the data path.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod backoff;
pub mod client_config;
pub mod connection;
pub mod crypto;
pub mod journal;
pub mod key_file;
mod line_writer;
pub mod logging;
pub mod message_source;
mod opener;
pub mod outbox;
pub mod pki;
pub mod progress;
mod public_keys;
pub mod receiver;
pub mod receiver_config;
mod reconnect;
pub mod sender;
pub mod sender_config;
mod shutdown;

pub use client_config::{ConfigError, LoggingConfig, TlsConfig};
pub use connection::{
    ClientError, Connection, ConnectionReader, ConnectionWriter, Hello, RawTls, TlsClientOptions,
};
pub use crypto::{decrypt, encrypt, CryptoError, EncryptedInputData};
pub use pki::{generate, PkiError, PkiOptions, PkiReport};
pub use receiver::{run_receiver, ReceiverLimits, ReceiverReport, ReceiverStats};
pub use receiver_config::ReceiverConfig;
pub use sender::{run_sender, SendJob, SenderReport, SenderStats};
pub use sender_config::SenderConfig;
