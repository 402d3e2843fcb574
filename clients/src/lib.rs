//! The CipherMQ client library and the client-side tools.
//!
//! For applications, start with [`client`]: [`Client::connect`] opens one mutual-TLS
//! connection served by one task, [`Publisher`] publishes (pipelined, retried,
//! encrypted for a receiver whose key is pinned on first use) and [`Consumer`] is a
//! stream of [`Delivery`]s to decrypt and acknowledge. `default-features = false`
//! leaves out everything only the tools need.
//!
//! Modules:
//! - [`client`]: the typed async API (connection task, publisher, consumer,
//!   receiver key pins, typed errors).
//! - [`connection`]: the line level under it: mutual TLS, the `HELLO` greeting,
//!   buffered line I/O for pipelining, a reader/writer split. Broker tests speak
//!   raw `ciphermq/1` through it.
//! - [`crypto`]: hybrid end-to-end encryption (sealed-box session key,
//!   ChaCha20-Poly1305 body bound to its message id) and [`EncryptedInputData`];
//!   [`key_file`]: the X25519 key files `ciphermq-pki` writes; [`backoff`].
//!
//! With the `tools` feature (on by default; plain names here, as the modules
//! are absent without it):
//! - `pki`: the CA (its key apart from the leaf keys), the broker's server
//!   certificate, client certificates (the CN is the identity the broker's ACL
//!   sees), receivers' X25519 key pairs and the broker's AES key: made once, kept,
//!   listed; the `ciphermq-pki` binary is a thin shell over it.
//! - The sender: `sender::run_sender` (encryption stage and a pump over a
//!   [`Publisher`]), `message_source` (templates, files, stdin), `sender_config`.
//! - The receiver: `receiver::run_receiver` (setup, consume, batch, ack, on
//!   the typed [`client`]), its ordered parallel decryption stage
//!   (`opener`), `journal` (the output file and the dedup set), `receiver_config`.
//! - Shared plumbing: `client_config` (`tls`/`logging` sections, JSON loading),
//!   `logging`, `progress`.
//!
//! Invariants worth naming:
//! - Replies come in command order; nothing reorders or drops a line. The
//!   client's connection task hands each reply to the command that sent it and
//!   each `Message:` line to the consumer of its queue.
//! - Every name a client puts on a line is checked against the protocol's name
//!   rule first, so no argument can smuggle in a second command.
//! - A sender never encrypts for a receiver key that differs from the one it
//!   pinned, unless the application accepted the change.
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
pub mod client;
#[cfg(feature = "tools")]
pub mod client_config;
pub mod connection;
pub mod crypto;
#[cfg(feature = "tools")]
pub mod journal;
pub mod key_file;
#[cfg(feature = "tools")]
pub mod logging;
#[cfg(feature = "tools")]
pub mod message_source;
#[cfg(feature = "tools")]
mod opener;
#[cfg(feature = "tools")]
pub mod pki;
#[cfg(feature = "tools")]
pub mod progress;
#[cfg(feature = "tools")]
mod public_keys;
#[cfg(feature = "tools")]
pub mod receiver;
#[cfg(feature = "tools")]
pub mod receiver_config;
#[cfg(feature = "tools")]
mod reconnect;
#[cfg(feature = "tools")]
pub mod sender;
#[cfg(feature = "tools")]
pub mod sender_config;
#[cfg(feature = "tools")]
mod shutdown;
mod task_guard;

pub use client::{
    Ack, Client, ClientConfig, ConnectError, Consumer, ConsumerError, DecryptError, Delivery,
    Disconnected, ExchangeKind, FilePins, KeyPins, MemoryPins, NackReason, PinStoreError,
    PreparedPublish, PublishError, PublishOutcomes, PublishPipeline, Publisher, ReceiverKey,
    RequestError, RetryPolicy, Role, Settlement, Settler,
};
pub use connection::{
    ClientError, Connection, ConnectionReader, ConnectionWriter, Hello, RawTls, TlsClientOptions,
};
pub use crypto::{decrypt, encrypt, CryptoError, EncryptedInputData};

#[cfg(feature = "tools")]
pub use client_config::{ConfigError, LoggingConfig, TlsConfig};
#[cfg(feature = "tools")]
pub use pki::{generate, PkiError, PkiOptions, PkiReport};
#[cfg(feature = "tools")]
pub use receiver::{run_receiver, ReceiverLimits, ReceiverReport, ReceiverStats};
#[cfg(feature = "tools")]
pub use receiver_config::ReceiverConfig;
#[cfg(feature = "tools")]
pub use reconnect::FirstConnectError;
#[cfg(feature = "tools")]
pub use sender::{run_sender, SendJob, SenderReport, SenderStats};
#[cfg(feature = "tools")]
pub use sender_config::SenderConfig;
