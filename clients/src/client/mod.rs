//! The typed async client (tokio): one mutual-TLS connection to a CipherMQ
//! broker, its commands as methods, publishing and consuming as typed objects.
//!
//! - [`Client`] (this file): connect, identity and role, the topology and key
//!   commands, `close`. Cheap to clone; every clone, [`Publisher`], [`Consumer`]
//!   and [`Delivery`] shares the one connection, which closes (with `quit`)
//!   when the last of them is dropped or [`Client::close`] is called.
//! - `driver`: the connection task that owns the socket. It writes commands in
//!   the order they are made and hands each reply to the command that sent it
//!   (replies come in command order) and each `Message:` line to the consumer of
//!   its queue, so a pushed delivery never passes for a reply. It writes to
//!   the socket itself and hands deliveries and pipelined replies over a
//!   read at a time; `batches` holds what it hands over and the buffers it
//!   reuses.
//! - [`publisher`]: [`Publisher`] (pipelining up to a window, retries of
//!   retryable NACKs, encryption for a receiver).
//! - [`consumer`]: [`Consumer`] (a `Stream` of [`Delivery`]s), [`ReceiverKey`].
//! - [`pins`]: receivers' public keys pinned on first use ([`KeyPins`],
//!   [`MemoryPins`], [`FilePins`]); `keys`: the cache in front of them.
//! - [`error`]: [`ConnectError`], [`RequestError`], [`PublishError`],
//!   [`ConsumerError`], [`DecryptError`], [`Disconnected`].
//! - [`config`]: [`ClientConfig`], [`RetryPolicy`].
//!
//! A connection that fails is not re-established: every command waiting and
//! every consumer gets [`RequestError::ConnectionLost`] with the reason, and the
//! application connects again, with [`Client::connect_with_retry`] to ride out
//! a broker restart (publishing the unacknowledged messages again is safe: the
//! broker deduplicates per sender and message id; what a consumer did not
//! acknowledge is redelivered). `ciphermq-sender` and `ciphermq-receiver` show
//! how.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use ciphermq_clients::{Client, ClientConfig, ExchangeKind, ReceiverKey, TlsClientOptions};
//! use futures_util::StreamExt;
//!
//! // A receiver: its route, its key, then its deliveries.
//! let tls = TlsClientOptions::for_cn("certs".as_ref(), "receiver_1");
//! let client = Client::connect(ClientConfig::new("127.0.0.1:5700", tls)).await?;
//! client.declare_exchange("ex", ExchangeKind::Direct).await?;
//! client.declare_queue("receiver_1_queue").await?;
//! client.bind("receiver_1_queue", "ex", "receiver_1").await?;
//! let key = ReceiverKey::from_file("receiver_1", "keys/receiver_1_private.key".as_ref())?;
//! client.register_public_key(&key.public_key()).await?;
//! let mut deliveries = client.consume("receiver_1_queue", 100).await?;
//! while let Some(delivery) = deliveries.next().await {
//!     let delivery = delivery?;
//!     let text = delivery.decrypt(&key)?;
//!     println!("{}", String::from_utf8_lossy(&text));
//!     delivery.ack().await?;
//! }
//! # Ok(()) }
//! ```

mod batches;
pub mod cluster;
pub mod config;
pub mod consumer;
mod driver;
pub mod error;
mod keys;
pub mod pins;
pub mod publisher;
mod reply;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

pub use ciphermq_proto::{ExchangeKind, NackReason};
pub use config::{ClientConfig, RetryPolicy, MAX_PUBLISH_WINDOW};
pub use consumer::{Consumer, Delivery, ReceiverKey, Settlement, Settler};
pub use error::{
    ConnectError, ConsumerError, DecryptError, Disconnected, Moved, PinStoreError, PublishError,
    RequestError,
};
pub use pins::{FilePins, KeyPins, MemoryPins};
pub use publisher::{Ack, PreparedPublish, PublishOutcomes, PublishPipeline, Publisher};

use crate::backoff::Backoff;
use crate::connection::Connection;
use crate::crypto::{self, PublicKey};
use driver::{Expect, Handle};
use keys::KeyBook;

/// The role the broker gave our certificate's CN (its `HELLO`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// `acl.sender_cns`: publishes, reads receivers' public keys.
    Sender,
    /// `acl.receiver_cns`: declares and consumes its own queues, registers its key.
    Receiver,
    /// `acl.admin_cns`: everything.
    Admin,
    /// `acl.monitor_cns`: heartbeats only on this port (and the admin endpoint).
    Monitor,
    /// A role this library does not know (a newer broker).
    Other(String),
}

impl Role {
    /// Parses the greeting's word.
    pub fn parse(word: &str) -> Role {
        match word {
            "sender" => Role::Sender,
            "receiver" => Role::Receiver,
            "admin" => Role::Admin,
            "monitor" => Role::Monitor,
            other => Role::Other(other.to_owned()),
        }
    }

    /// The greeting's word.
    pub fn as_str(&self) -> &str {
        match self {
            Role::Sender => "sender",
            Role::Receiver => "receiver",
            Role::Admin => "admin",
            Role::Monitor => "monitor",
            Role::Other(word) => word,
        }
    }

    /// Whether the ACL lets this role publish.
    pub fn can_publish(&self) -> bool {
        matches!(self, Role::Sender | Role::Admin)
    }

    /// Whether the ACL lets this role consume (its own queues, for a receiver).
    pub fn can_consume(&self) -> bool {
        matches!(self, Role::Receiver | Role::Admin)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A connection to a CipherMQ broker; see the [module documentation](self).
#[derive(Clone)]
pub struct Client {
    /// Shared by every clone, publisher, consumer and delivery.
    inner: Arc<Inner>,
}

/// What the clones of a client share.
struct Inner {
    /// The connection task.
    handle: Handle,
    /// Our CN, as the broker's greeting said.
    client_id: String,
    /// Our role.
    role: Role,
    /// Publish window slots.
    window: Semaphore,
    /// The window's size.
    window_size: usize,
    /// Retries of retryable NACKs.
    retry: RetryPolicy,
    /// Retries made so far.
    retries: AtomicU64,
    /// Receivers' keys: pins and cache.
    keys: KeyBook,
    /// Random per client: the `{run}` of generated message ids.
    run_id: String,
    /// The `{seq}` of the next generated message id.
    seq: AtomicU64,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("client_id", &self.inner.client_id)
            .field("role", &self.inner.role)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects (TCP, mutual TLS, the broker's `HELLO`) and starts the task that
    /// serves the connection. Must be called within a tokio runtime. Gives up
    /// after 10 s without a greeting.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), ciphermq_clients::ConnectError> {
    /// use ciphermq_clients::{Client, ClientConfig};
    ///
    /// let config = ClientConfig::from_files(
    ///     "127.0.0.1:5700",
    ///     "certs/ca.crt",
    ///     "certs/sender_1.crt",
    ///     "certs/sender_1.key",
    /// );
    /// let client = Client::connect(config).await?;
    /// println!("connected as {} ({})", client.client_id(), client.role());
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: ClientConfig) -> Result<Client, ConnectError> {
        config.validate()?;
        let (connector, server_name) = config.connector()?;
        let conn = Connection::connect_with(&config.address, &connector, server_name).await?;
        let hello = conn.hello().clone();
        let handle = driver::spawn(
            conn,
            driver::Settings {
                reply_timeout: config.reply_timeout,
                heartbeat: config.heartbeat_interval,
            },
        );
        Ok(Client {
            inner: Arc::new(Inner {
                handle,
                role: Role::parse(&hello.role),
                client_id: hello.client_id,
                window: Semaphore::new(config.publish_window),
                window_size: config.publish_window,
                retry: config.retry,
                retries: AtomicU64::new(0),
                keys: KeyBook::new(config.pins, config.key_cache_ttl),
                run_id: format!("{:08x}", rand::random::<u32>()),
                seq: AtomicU64::new(1),
            }),
        })
    }

    /// [`Client::connect`], trying again after transient failures (the
    /// broker unreachable or restarting, a connection closed during the
    /// handshake, the broker's connection limit; see
    /// [`ConnectError::is_transient`]) with `backoff` between attempts, up to
    /// `max_attempts` failures in a row (0: never give up). Other failures
    /// (unreadable files, a rejected certificate, an unknown CN, a bad
    /// configuration) return at once, as does the last failure once the
    /// attempts are spent. Each failure that will be retried is logged at warn.
    ///
    /// The future may be dropped at any time (in a `select!` with a shutdown
    /// signal, for example): nothing is left running.
    ///
    /// A supervisor that keeps a consumer alive across broker restarts
    /// reconnects with it when the stream ends or [`Client::closed`]
    /// resolves, and sets up its queue and consumer again (what was not
    /// acknowledged is redelivered); `ciphermq-receiver` works this way.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ciphermq_clients::backoff::Backoff;
    /// use ciphermq_clients::{Client, ClientConfig, TlsClientOptions};
    /// use futures_util::StreamExt;
    ///
    /// let tls = TlsClientOptions::for_cn("certs".as_ref(), "receiver_1");
    /// let config = ClientConfig::new("127.0.0.1:5700", tls);
    /// let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    /// loop {
    ///     let client = Client::connect_with_retry(config.clone(), backoff, 0).await?;
    ///     client.declare_queue("receiver_1_queue").await?;
    ///     let mut deliveries = client.consume("receiver_1_queue", 100).await?;
    ///     while let Some(Ok(delivery)) = deliveries.next().await {
    ///         // ... store it ...
    ///         delivery.ack().await?;
    ///     }
    ///     // The connection ended (or the queue was deleted): connect again.
    /// }
    /// # }
    /// ```
    pub async fn connect_with_retry(
        config: ClientConfig,
        backoff: Backoff,
        max_attempts: u32,
    ) -> Result<Client, ConnectError> {
        let mut failures = 0u32;
        loop {
            let error = match Client::connect(config.clone()).await {
                Ok(client) => return Ok(client),
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) => e,
            };
            failures = failures.saturating_add(1);
            if max_attempts != 0 && failures >= max_attempts {
                return Err(error);
            }
            let delay = backoff.delay(failures);
            tracing::warn!(
                addr = %config.address(),
                %error,
                retry_in_ms = delay.as_millis() as u64,
                "cannot connect to the broker"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// Our identity: the CN of our certificate, as the broker read it.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// Our role in the broker's ACL.
    pub fn role(&self) -> &Role {
        &self.inner.role
    }

    /// A publisher on this connection.
    pub fn publisher(&self) -> Publisher {
        Publisher::new(self.clone())
    }

    /// Starts consuming `queue` with at most `prefetch` deliveries unacknowledged
    /// at once (at least 1; the broker caps it at `performance.max_prefetch`).
    /// One consumer per queue and connection.
    pub async fn consume(&self, queue: &str, prefetch: u32) -> Result<Consumer, RequestError> {
        reply::check_name("queue", queue)?;
        if prefetch == 0 {
            return Err(RequestError::InvalidName {
                what: "prefetch",
                name: "0".to_owned(),
                reason: "prefetch must be at least 1".to_owned(),
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let line = self
            .inner
            .handle
            .consume(queue.to_owned(), prefetch, tx)
            .await?;
        reply::ok_exact(line, &format!("consume {queue}"))?;
        Ok(Consumer::new(
            queue.to_owned(),
            rx,
            self.inner.handle.clone(),
        ))
    }

    /// `declare_queue <queue>` (idempotent). Receivers may declare `{cn}_queue`
    /// and `{cn}_…` only.
    pub async fn declare_queue(&self, queue: &str) -> Result<(), RequestError> {
        reply::check_name("queue", queue)?;
        self.simple(
            format!("declare_queue {queue}"),
            &format!("declare_queue {queue}"),
        )
        .await
    }

    /// `declare_exchange <exchange> <kind>`: the same kind again is a no-op,
    /// another kind an error.
    pub async fn declare_exchange(
        &self,
        exchange: &str,
        kind: ExchangeKind,
    ) -> Result<(), RequestError> {
        reply::check_name("exchange", exchange)?;
        self.simple(
            format!("declare_exchange {exchange} {kind}"),
            &format!("declare_exchange {exchange}"),
        )
        .await
    }

    /// `bind <queue> <exchange> <binding_key>`; topic binding keys may use `*`
    /// (one word) and `#` (zero or more).
    pub async fn bind(
        &self,
        queue: &str,
        exchange: &str,
        binding_key: &str,
    ) -> Result<(), RequestError> {
        reply::check_name("queue", queue)?;
        reply::check_name("exchange", exchange)?;
        reply::check_pattern(binding_key)?;
        let args = format!("{queue} {exchange} {binding_key}");
        self.simple(format!("bind {args}"), &format!("bind {args}"))
            .await
    }

    /// `unbind <queue> <exchange> <binding_key>` (idempotent: no such binding is
    /// fine).
    pub async fn unbind(
        &self,
        queue: &str,
        exchange: &str,
        binding_key: &str,
    ) -> Result<(), RequestError> {
        reply::check_name("queue", queue)?;
        reply::check_name("exchange", exchange)?;
        reply::check_pattern(binding_key)?;
        let args = format!("{queue} {exchange} {binding_key}");
        self.simple(format!("unbind {args}"), &format!("unbind {args}"))
            .await
    }

    /// `delete_exchange <exchange>`: it and its bindings go; queues stay.
    pub async fn delete_exchange(&self, exchange: &str) -> Result<(), RequestError> {
        reply::check_name("exchange", exchange)?;
        self.simple(
            format!("delete_exchange {exchange}"),
            &format!("delete_exchange {exchange}"),
        )
        .await
    }

    /// `delete_queue <queue>`: the queue, its messages and its bindings go,
    /// durably; its consumers (on any connection) see their stream end with
    /// [`ConsumerError::QueueDeleted`](crate::ConsumerError::QueueDeleted). The name may be declared again, and
    /// starts empty.
    pub async fn delete_queue(&self, queue: &str) -> Result<(), RequestError> {
        reply::check_name("queue", queue)?;
        self.simple(
            format!("delete_queue {queue}"),
            &format!("delete_queue {queue}"),
        )
        .await
    }

    /// `purge_queue <queue>`: drops its ready messages and returns how many;
    /// deliveries not acknowledged yet stay owed.
    pub async fn purge_queue(&self, queue: &str) -> Result<u64, RequestError> {
        reply::check_name("queue", queue)?;
        let line = self.call(format!("purge_queue {queue}")).await?;
        reply::ok_count(line, &format!("purge_queue {queue}"))
    }

    /// `close_connection <client_id>` (admins): ends every connection of that CN;
    /// returns how many.
    pub async fn close_connection(&self, client_id: &str) -> Result<u64, RequestError> {
        reply::check_name("client id", client_id)?;
        let line = self.call(format!("close_connection {client_id}")).await?;
        reply::ok_count(line, &format!("close_connection {client_id}"))
    }

    /// `register_public_key`: the X25519 key senders encrypt for us with
    /// (receivers, for their own CN; a new key replaces the old one).
    pub async fn register_public_key(&self, key: &PublicKey) -> Result<(), RequestError> {
        let line = self
            .call(format!(
                "register_public_key {}",
                crypto::public_key_to_base64(key)
            ))
            .await?;
        if line == "Public key registered" {
            Ok(())
        } else {
            Err(reply::refusal(line))
        }
    }

    /// `get_public_key <client_id>` as the broker answers it, unchecked against
    /// any pin (`None`: it has none). To encrypt, use [`Client::receiver_key`].
    pub async fn get_public_key(&self, client_id: &str) -> Result<Option<PublicKey>, RequestError> {
        match keys::fetch(&self.inner.handle, client_id).await {
            Ok(key) => Ok(key),
            Err(PublishError::Request(e)) => Err(e),
            Err(PublishError::BadKey { receiver, error }) => Err(RequestError::Unexpected(
                format!("an unusable public key for {receiver}: {error}"),
            )),
            Err(other) => Err(RequestError::Unexpected(other.to_string())),
        }
    }

    /// The key [`Publisher::publish_to`] would encrypt for `receiver` with: the
    /// broker's, checked against the key pinned for it (pinned now if none
    /// was), cached for the configured time. A different key is
    /// [`PublishError::KeyChanged`], logged at warn.
    pub async fn receiver_key(&self, receiver: &str) -> Result<PublicKey, PublishError> {
        self.inner.keys.key_for(&self.inner.handle, receiver).await
    }

    /// Accepts the key the broker offers for `receiver` now, whatever was
    /// pinned, and returns it. For a rotation confirmed with the receiver; to
    /// accept exactly the key a [`PublishError::KeyChanged`] showed (and not
    /// one substituted since), use [`Client::accept_key`].
    pub async fn accept_key_rotation(&self, receiver: &str) -> Result<PublicKey, PublishError> {
        self.inner
            .keys
            .accept_rotation(&self.inner.handle, receiver)
            .await
    }

    /// Pins `key` for `receiver`, replacing any pin (a key obtained out of band,
    /// or the `offered` key of a [`PublishError::KeyChanged`] once confirmed).
    pub fn accept_key(&self, receiver: &str, key: &PublicKey) -> Result<(), PublishError> {
        reply::check_name("client id", receiver)?;
        self.inner.keys.accept(receiver, key)
    }

    /// `heartbeat`. The client sends its own when idle (see
    /// [`ClientConfig::heartbeat_interval`]); this one waits for the broker's
    /// answer, so it also measures a round trip.
    pub async fn heartbeat(&self) -> Result<(), RequestError> {
        self.simple("heartbeat".to_owned(), "heartbeat").await
    }

    /// Sends one raw command line and returns its reply line (never a pushed
    /// `Message:` line: those go to consumers). For commands without a method.
    /// Refused without sending: lines with a newline, and `consume`, `fetch`,
    /// `publish_batch` (not one reply line, or managed by the client) and `quit`
    /// (use [`Client::close`]).
    pub async fn request(&self, line: &str) -> Result<String, RequestError> {
        if line.contains(['\n', '\r']) {
            return Err(RequestError::Unsupported(
                "a request is one line: no \\n or \\r".to_owned(),
            ));
        }
        let command = line.split(' ').next().unwrap_or("");
        if matches!(command, "consume" | "fetch" | "publish_batch" | "quit") {
            return Err(RequestError::Unsupported(format!(
                "{command} is not supported by Client::request (use the client's methods)"
            )));
        }
        self.call(line.to_owned()).await
    }

    /// Sends `quit` and waits for `OK bye`; then every clone, publisher,
    /// consumer and delivery of this client fails with
    /// [`Disconnected::ClosedByClient`]. Commands already sent are answered
    /// first.
    pub async fn close(&self) -> Result<(), RequestError> {
        match self.inner.handle.call("quit".into(), Expect::Quit).await {
            Ok(line) if line == "OK bye" => Ok(()),
            Ok(line) => Err(reply::refusal(line)),
            Err(RequestError::ConnectionLost(reason))
                if matches!(*reason, Disconnected::ClosedByClient) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.inner.handle.is_closed()
    }

    /// Completes when the connection ends, with the reason (for a supervisor
    /// that reconnects).
    pub async fn closed(&self) -> Arc<Disconnected> {
        self.inner.handle.closed().await
    }

    /// A command whose success reply is exactly `OK <ok>`.
    async fn simple(&self, line: String, ok: &str) -> Result<(), RequestError> {
        let reply = self.call(line).await?;
        reply::ok_exact(reply, ok)
    }

    /// One command, one reply line.
    async fn call(&self, line: String) -> Result<String, RequestError> {
        self.inner.handle.call(line.into(), Expect::Line).await
    }

    /// `{client_id}-{run}.{seq}-{receiver}`.
    pub(crate) fn next_message_id(&self, receiver: &str) -> String {
        let seq = self.inner.seq.fetch_add(1, Relaxed);
        format!(
            "{}-{}.{seq}-{receiver}",
            self.inner.client_id, self.inner.run_id
        )
    }
}
