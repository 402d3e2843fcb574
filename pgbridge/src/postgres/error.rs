//! Why the bridge could not start.

/// Why [`PgBridge::start`](super::PgBridge::start) failed. Each message names
/// the server (`host:port/dbname`) or the client id involved and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// No connection could be made within `connect_timeout`.
    #[error("cannot connect to PostgreSQL at {target}: {cause}")]
    Connect {
        /// `host:port/dbname`.
        target: String,
        /// The last attempt's error, and how long it kept trying.
        cause: String,
    },
    /// The schema could not be created or checked (the message names the
    /// server, the table and the cause).
    #[error("{0}")]
    Schema(String),
    /// A stored public key does not decrypt with `encryption.aes_key`. The
    /// bridge refuses to start rather than serve a garbage key.
    #[error("the public key of client {client_id:?} in table public_keys does not decrypt with encryption.aes_key: the aes_key is wrong (or the row was altered)")]
    WrongKey {
        /// The client whose key failed.
        client_id: String,
    },
    /// A stored public key row is not valid base64 of the expected sizes.
    #[error("the public key row of client {client_id:?} in table public_keys is malformed: {why}")]
    BadKeyRow {
        /// The client whose row is damaged.
        client_id: String,
        /// What is wrong with it.
        why: String,
    },
    /// Reading the stored keys or mirror watermarks failed.
    #[error("PostgreSQL at {target}: cannot read {what}: {cause}")]
    Load {
        /// `host:port/dbname`.
        target: String,
        /// The table.
        what: &'static str,
        /// The driver's error.
        cause: String,
    },
    /// `sslmode = verify-full` without a CA to verify against.
    #[error("database.ca_cert_path is required with database.sslmode = \"verify-full\": set it to the PEM file of the CA that issued the PostgreSQL server's certificate")]
    MissingCaCert,
    /// The CA file cannot be read or holds no usable certificate.
    #[error("database.ca_cert_path = {}: {why}", path.display())]
    CaCert {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The server's certificate was refused, or the server refused TLS
    /// while `sslmode` requires it: retrying cannot help, so start fails at
    /// once.
    #[error("cannot connect to PostgreSQL at {target}: {why}")]
    Tls {
        /// `host:port/dbname`.
        target: String,
        /// The server, what was refused, and what to do.
        why: String,
    },
    /// The bridge thread or its runtime could not be created.
    #[error("cannot start the pgbridge thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The bridge thread ended before reporting that it started.
    #[error("the pgbridge thread stopped during start-up (see the log)")]
    ThreadDied,
}
