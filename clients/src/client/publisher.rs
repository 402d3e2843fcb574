//! Publishing: [`Publisher`] sends encrypted messages, pipelined up to the
//! connection's window, retrying retryable NACKs with backoff, and encrypts for a
//! receiver itself with [`Publisher::publish_to`].

use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ciphermq_proto::{NackReason, Reply};

use crate::client::driver::Expect;
use crate::client::error::{PublishError, RequestError};
use crate::client::{reply, Client};
use crate::crypto::{self, EncryptedInputData};

/// The broker's `ACK <id>`: the message is durable in every queue it was
/// routed to (fsynced, with the broker's default durable storage).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ack {
    /// The message id acknowledged.
    pub message_id: String,
    /// Publishes it took, the first included (more than 1 after retries).
    pub attempts: u32,
}

/// A publish checked and rendered, ready to send (and to send again): the
/// expensive parts of a publish (encryption aside) done ahead of the network,
/// on any thread. Made by [`Publisher::prepare`], sent by
/// [`Publisher::publish_prepared`].
#[derive(Clone)]
pub struct PreparedPublish {
    /// The message id the broker's reply must name.
    message_id: Arc<str>,
    /// `publish <exchange> <key> <json>`, without newline.
    line: Arc<str>,
}

impl fmt::Debug for PreparedPublish {
    /// The id and the size; never the body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedPublish")
            .field("message_id", &self.message_id)
            .field("line_bytes", &self.line.len())
            .finish()
    }
}

impl PreparedPublish {
    /// The message id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The `publish` line, without its newline.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn line(&self) -> &str {
        &self.line
    }
}

/// Publishes on a [`Client`]'s connection. Cheap to clone; clones share the
/// connection's publish window.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use ciphermq_clients::{Client, ClientConfig, TlsClientOptions};
///
/// let tls = TlsClientOptions::for_cn("certs".as_ref(), "sender_1");
/// let client = Client::connect(ClientConfig::new("127.0.0.1:5700", tls)).await?;
/// let publisher = client.publisher();
/// // Fetches receiver_1's public key (pinned on first use), encrypts, publishes,
/// // retries a full queue, returns once the broker has it on disk.
/// let ack = publisher
///     .publish_to("receiver_1", "ex", "receiver_1", b"hello")
///     .await?;
/// println!("{} acknowledged", ack.message_id);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    /// The connection and its window.
    client: Client,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("client_id", &self.client.client_id())
            .field("window", &self.window())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Publisher {
    /// A publisher on `client`.
    pub(crate) fn new(client: Client) -> Publisher {
        Publisher { client }
    }

    /// The client it publishes on.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The publish window: publishes awaiting their reply at most.
    pub fn window(&self) -> usize {
        self.client.inner.window_size
    }

    /// Publishes holding a window slot now (sent and unanswered, or waiting to
    /// retry).
    pub fn in_flight(&self) -> usize {
        self.window() - self.client.inner.window.available_permits()
    }

    /// Retries made on this connection so far (every publisher of the client).
    pub fn retries(&self) -> u64 {
        self.client.inner.retries.load(Relaxed)
    }

    /// Checks the names and renders the publish line of `envelope` for
    /// `exchange` and `routing_key`; nothing is sent.
    pub fn prepare(
        exchange: &str,
        routing_key: &str,
        envelope: &EncryptedInputData,
    ) -> Result<PreparedPublish, PublishError> {
        reply::check_name("exchange", exchange)?;
        reply::check_key(routing_key)?;
        if !ciphermq_proto::is_valid_name(&envelope.message_id) {
            return Err(PublishError::InvalidMessageId(envelope.message_id.clone()));
        }
        let json = serde_json::to_string(envelope).map_err(|e| {
            // Only a map key that is not a string could fail; `extra` has string keys.
            RequestError::Unexpected(format!("cannot serialise the message: {e}"))
        })?;
        let mut line = String::with_capacity(json.len() + exchange.len() + routing_key.len() + 10);
        line.push_str("publish ");
        line.push_str(exchange);
        line.push(' ');
        line.push_str(routing_key);
        line.push(' ');
        line.push_str(&json);
        Ok(PreparedPublish {
            message_id: Arc::from(envelope.message_id.as_str()),
            line: Arc::from(line),
        })
    }

    /// Publishes an encrypted message (see [`crypto::encrypt`]) to `exchange`
    /// with `routing_key`, and returns once the broker acknowledged it.
    ///
    /// Waits for a slot when the window is full. A retryable NACK
    /// (`rate_limited`, `queue_full`, `disk_full`, `storage`, `timeout`) is
    /// retried after a backoff, keeping the slot, up to the client's
    /// [`RetryPolicy`](crate::RetryPolicy); the others fail at once with
    /// [`PublishError::Nack`]. Many publishes awaited together are pipelined.
    ///
    /// Cancel safety: dropping the future after the line was written leaves the
    /// publish to the broker (it may still be stored); publishing the same id
    /// again is deduplicated.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        envelope: &EncryptedInputData,
    ) -> Result<Ack, PublishError> {
        let prepared = Publisher::prepare(exchange, routing_key, envelope)?;
        self.publish_prepared(&prepared).await
    }

    /// Publishes what [`Publisher::prepare`] rendered; see [`Publisher::publish`].
    pub async fn publish_prepared(&self, prepared: &PreparedPublish) -> Result<Ack, PublishError> {
        let inner = &self.client.inner;
        let handle = &inner.handle;
        // The semaphore is never closed; a closed one could only mean the
        // client is going away.
        let _slot = inner.window.acquire().await.map_err(|_| handle.lost())?;
        let policy = inner.retry;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let line = handle
                .call(
                    prepared.line.clone(),
                    Expect::Publish(prepared.message_id.clone()),
                )
                .await?;
            let retryable = match Reply::parse(&line) {
                Reply::Ack(_) => {
                    return Ok(Ack {
                        message_id: prepared.message_id.to_string(),
                        attempts,
                    })
                }
                Reply::Nack { reason, .. } => match NackReason::parse(reason) {
                    Some(reason) if reason.is_retriable() && attempts < policy.max_attempts => {
                        reason.as_str()
                    }
                    Some(reason) => {
                        return Err(PublishError::Nack {
                            message_id: prepared.message_id.to_string(),
                            reason,
                            attempts,
                        })
                    }
                    None => {
                        return Err(PublishError::UnknownNack {
                            message_id: prepared.message_id.to_string(),
                            reason: reason.to_owned(),
                        })
                    }
                },
                // Publishes are answered `NACK … rate_limited`; a plain
                // `Rate limited` is retried the same way.
                Reply::RateLimited if attempts < policy.max_attempts => "rate limited",
                _ => return Err(PublishError::Request(reply::refusal(line))),
            };
            inner.retries.fetch_add(1, Relaxed);
            let delay = policy.backoff.delay(attempts);
            tracing::debug!(
                message_id = %prepared.message_id,
                reason = retryable,
                attempt = attempts,
                delay_ms = delay.as_millis() as u64,
                "publish refused for now; will retry"
            );
            // A connection lost meanwhile fails the publish now, not after the wait.
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = handle.closed() => return Err(handle.lost().into()),
            }
        }
    }

    /// Encrypts `plaintext` for `receiver` and publishes it (see
    /// [`Publisher::publish`]) under a fresh message id
    /// `{our_id}-{run}.{seq}-{receiver}` (`run`: random per client).
    ///
    /// The receiver's public key comes from the broker and is pinned on first
    /// use: a different key later fails with [`PublishError::KeyChanged`] and
    /// nothing is sent, until [`Client::accept_key`] or
    /// [`Client::accept_key_rotation`]. The body names us as its sender
    /// (`sender_client_id`), which the broker verifies.
    ///
    /// Encryption (two X25519 multiplications) runs on the calling task; for a
    /// high rate, encrypt on worker threads and use [`Publisher::prepare`].
    pub async fn publish_to(
        &self,
        receiver: &str,
        exchange: &str,
        routing_key: &str,
        plaintext: &[u8],
    ) -> Result<Ack, PublishError> {
        let message_id = self.client.next_message_id(receiver);
        self.publish_to_with_id(&message_id, receiver, exchange, routing_key, plaintext)
            .await
    }

    /// [`Publisher::publish_to`] under a message id of your own (the name rule
    /// applies). The broker deduplicates per sender and id, so publishing an id
    /// again (after a lost connection, or a crash) stores it once.
    pub async fn publish_to_with_id(
        &self,
        message_id: &str,
        receiver: &str,
        exchange: &str,
        routing_key: &str,
        plaintext: &[u8],
    ) -> Result<Ack, PublishError> {
        if !ciphermq_proto::is_valid_name(message_id) {
            return Err(PublishError::InvalidMessageId(message_id.to_owned()));
        }
        reply::check_name("exchange", exchange)?;
        reply::check_key(routing_key)?;
        let key = self.client.receiver_key(receiver).await?;
        let mut envelope = crypto::encrypt(&key, message_id, receiver, plaintext)?;
        envelope.sender_client_id = Some(self.client.client_id().to_owned());
        self.publish(exchange, routing_key, &envelope).await
    }
}
