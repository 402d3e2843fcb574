//! Consuming: [`Consumer`] is a stream of [`Delivery`]s from one queue;
//! each delivery is opened with a [`ReceiverKey`] and settled with
//! [`Delivery::ack`] / [`Delivery::nack`], or many at once with
//! [`Consumer::ack_many`].
//!
//! A delivery stays owed until it is acknowledged (DESIGN.md §4): the broker
//! redelivers it, with its count one higher, after a `nack`, when the connection
//! closes, or after `performance.ack_wait_secs`; past
//! `performance.max_deliveries` it goes to the queue's dead-letter queue
//! `{queue}.dlq`. Acknowledge only once the message is safe on your side.

use std::fmt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::mpsc;

use crate::client::driver::{Expect, Handle, RawDelivery};
use crate::client::error::{DecryptError, RequestError};
use crate::client::reply as expect_reply;
use crate::crypto::{self, EncryptedInputData, PublicKey, SecretKey};
use crate::key_file::{self, KeyFileError};

/// Longest `ack_batch` line [`Consumer::ack_many`] writes (the broker's lines
/// may be 1 MiB; a smaller line keeps other commands from waiting behind it).
const ACK_BATCH_BYTES: usize = 64 * 1024;

/// The deliveries of one queue, as a [`Stream`] (use `StreamExt::next` from
/// `futures` or `futures-util`). Made by [`Client::consume`](crate::Client::consume).
///
/// The stream yields `Err` once if the connection is lost, then ends; a new
/// client must consume again (the broker redelivers what was not acknowledged).
///
/// Dropping a consumer does not stop the broker's deliveries: `ciphermq/1` has
/// no command to cancel a consume. Deliveries that come after the drop are left
/// unacknowledged (at most `prefetch` of them) and are redelivered once the
/// connection closes; close the client to stop consuming.
///
/// ```no_run
/// # async fn example(client: ciphermq_clients::Client, key: ciphermq_clients::ReceiverKey) -> Result<(), Box<dyn std::error::Error>> {
/// use futures_util::StreamExt;
///
/// let mut consumer = client.consume("receiver_1_queue", 100).await?;
/// while let Some(delivery) = consumer.next().await {
///     let delivery = delivery?;
///     match delivery.decrypt(&key) {
///         Ok(plaintext) => {
///             println!("{}: {} bytes", delivery.id(), plaintext.len());
///             delivery.ack().await?;
///         }
///         // Redelivered, then dead-lettered after max_deliveries.
///         Err(_) => delivery.nack().await?,
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Consumer {
    /// The queue.
    queue: String,
    /// Deliveries from the connection task.
    rx: mpsc::UnboundedReceiver<Result<RawDelivery, RequestError>>,
    /// For acks.
    handle: Handle,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer over the sink the connection task fills.
    pub(crate) fn new(
        queue: String,
        rx: mpsc::UnboundedReceiver<Result<RawDelivery, RequestError>>,
        handle: Handle,
    ) -> Consumer {
        Consumer { queue, rx, handle }
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Acknowledges many deliveries with as few `ack_batch` lines as fit
    /// (one per queue and 64 KiB of ids); returns how many the broker settled.
    /// Ids it no longer owed us (acked already, or redelivered elsewhere after
    /// the connection that got them closed) are skipped by the broker, so the
    /// count may be lower than `deliveries.len()`.
    pub async fn ack_many(&self, deliveries: &[Delivery]) -> Result<u64, RequestError> {
        ack_many(&self.handle, deliveries).await
    }
}

impl Stream for Consumer {
    type Item = Result<Delivery, RequestError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.rx.poll_recv(cx).map(|item| {
            item.map(|r| {
                r.map(|raw| Delivery {
                    raw,
                    handle: this.handle.clone(),
                })
            })
        })
    }
}

/// One delivery: a message from a queue, owed until acknowledged.
pub struct Delivery {
    /// The line's fields.
    raw: RawDelivery,
    /// For ack and nack.
    handle: Handle,
}

impl fmt::Debug for Delivery {
    /// Id, queue and count; never the body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.raw.id)
            .field("queue", &self.raw.queue)
            .field("delivery_count", &self.raw.count)
            .field("body_bytes", &self.raw.body.len())
            .finish()
    }
}

impl Delivery {
    /// The message id, as published.
    pub fn id(&self) -> &str {
        &self.raw.id
    }

    /// The queue it comes from.
    pub fn queue(&self) -> &str {
        &self.raw.queue
    }

    /// 1 on first delivery, one more on each redelivery (a `nack`, a closed
    /// connection, `ack_wait_secs` passing).
    pub fn delivery_count(&self) -> u32 {
        self.raw.count
    }

    /// Whether it was delivered before.
    pub fn redelivered(&self) -> bool {
        self.raw.count > 1
    }

    /// The body as published: the JSON of an [`EncryptedInputData`].
    pub fn body(&self) -> &str {
        &self.raw.body
    }

    /// The body parsed, without decrypting it.
    pub fn envelope(&self) -> Result<EncryptedInputData, DecryptError> {
        serde_json::from_str(&self.raw.body).map_err(DecryptError::Body)
    }

    /// Who published it, as the broker verified (`sender_client_id`; `None` if
    /// the sender did not say, which `acl.require_sender_id` can forbid).
    pub fn sender_id(&self) -> Option<String> {
        self.envelope().ok()?.sender_client_id
    }

    /// Opens the body with `key`: checks that it carries this delivery's id and is
    /// addressed to the key's owner, then decrypts it (which authenticates the
    /// ciphertext under that id).
    pub fn decrypt(&self, key: &ReceiverKey) -> Result<Vec<u8>, DecryptError> {
        let envelope = self.envelope()?;
        if envelope.message_id != self.raw.id {
            return Err(DecryptError::IdMismatch {
                delivery: self.raw.id.clone(),
                body: envelope.message_id,
            });
        }
        key.decrypt(&envelope)
    }

    /// Acknowledges it (`ack <id> <queue>`): the broker forgets it. Settles
    /// every delivery of this id from this queue to this connection.
    pub async fn ack(&self) -> Result<(), RequestError> {
        self.settle("ack", "ACK_CONFIRMED").await
    }

    /// Gives it back (`nack <id> <queue>`): the broker redelivers it, counting
    /// one more delivery, and moves it to `{queue}.dlq` past `max_deliveries`.
    pub async fn nack(&self) -> Result<(), RequestError> {
        self.settle("nack", "NACK_CONFIRMED").await
    }

    /// `ack` or `nack`, and its `*_CONFIRMED <id>` reply.
    async fn settle(&self, command: &str, confirmed: &str) -> Result<(), RequestError> {
        let line = format!("{command} {} {}", self.raw.id, self.raw.queue);
        let reply = self.handle.call(line.into(), Expect::Line).await?;
        match reply
            .strip_prefix(confirmed)
            .and_then(|r| r.strip_prefix(' '))
        {
            Some(id) if id == self.raw.id => Ok(()),
            _ => Err(expect_reply::refusal(reply)),
        }
    }
}

/// `ack_batch` lines for `deliveries`, grouped by queue and split at
/// [`ACK_BATCH_BYTES`]; the sum of the counts settled.
pub(crate) async fn ack_many(
    handle: &Handle,
    deliveries: &[Delivery],
) -> Result<u64, RequestError> {
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut queues: Vec<&str> = deliveries.iter().map(|d| d.queue()).collect();
    queues.sort_unstable();
    queues.dedup();
    for queue in queues {
        let mut line = String::new();
        for d in deliveries.iter().filter(|d| d.queue() == queue) {
            if !line.is_empty() && line.len() + d.id().len() + 1 > ACK_BATCH_BYTES {
                lines.push((queue.to_owned(), std::mem::take(&mut line)));
            }
            if line.is_empty() {
                line.push_str("ack_batch ");
                line.push_str(queue);
            }
            line.push(' ');
            line.push_str(d.id());
        }
        if !line.is_empty() {
            lines.push((queue.to_owned(), line));
        }
    }
    // Pipelined: every line is submitted before the first reply is awaited.
    let mut submitted = Vec::with_capacity(lines.len());
    for (queue, line) in lines {
        submitted.push((queue, handle.submit(line.into(), Expect::Line)?));
    }
    let mut settled = 0u64;
    for (queue, reply) in submitted {
        let reply = handle.wait(reply).await?;
        let prefix = format!("OK ack_batch {queue} ");
        match reply.strip_prefix(&prefix).map(str::parse::<u64>) {
            Some(Ok(n)) => settled += n,
            _ => return Err(expect_reply::refusal(reply)),
        }
    }
    Ok(settled)
}

/// A receiver's X25519 private key and whose it is: opens what senders sealed
/// for that receiver. Never printed: its `Debug` shows the owner and the
/// public key only.
///
/// ```no_run
/// use ciphermq_clients::ReceiverKey;
///
/// // What `ciphermq-pki receiver receiver_1` wrote.
/// let key = ReceiverKey::from_file("receiver_1", "keys/receiver_1_private.key".as_ref())?;
/// println!("public key: {:?}", key.public_key());
/// # Ok::<(), ciphermq_clients::key_file::KeyFileError>(())
/// ```
#[derive(Clone)]
pub struct ReceiverKey {
    /// The receiver's client id (its certificate's CN).
    receiver_id: Arc<str>,
    /// Its private key.
    secret: SecretKey,
}

impl fmt::Debug for ReceiverKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiverKey")
            .field("receiver_id", &self.receiver_id)
            .field(
                "public_key",
                &crypto::public_key_to_base64(&self.secret.public_key()),
            )
            .finish_non_exhaustive()
    }
}

impl ReceiverKey {
    /// `secret` as `receiver_id`'s key.
    pub fn new(receiver_id: impl Into<String>, secret: SecretKey) -> ReceiverKey {
        ReceiverKey {
            receiver_id: Arc::from(receiver_id.into()),
            secret,
        }
    }

    /// Reads a private key file as `ciphermq-pki` writes it
    /// (`keys/<cn>_private.key`: standard base64 of 32 bytes).
    pub fn from_file(
        receiver_id: impl Into<String>,
        path: &Path,
    ) -> Result<ReceiverKey, KeyFileError> {
        Ok(ReceiverKey::new(
            receiver_id,
            key_file::read_secret_key(path)?,
        ))
    }

    /// A new random key for `receiver_id` (keep it: messages sealed for it open
    /// with nothing else).
    pub fn generate(receiver_id: impl Into<String>) -> ReceiverKey {
        ReceiverKey::new(receiver_id, crypto::generate_secret_key())
    }

    /// Whose key it is.
    pub fn receiver_id(&self) -> &str {
        &self.receiver_id
    }

    /// The public half, to register with
    /// [`Client::register_public_key`](crate::Client::register_public_key).
    pub fn public_key(&self) -> PublicKey {
        self.secret.public_key()
    }

    /// The private key.
    pub fn secret(&self) -> &SecretKey {
        &self.secret
    }

    /// Opens `envelope` if it is addressed to this key's owner.
    pub fn decrypt(&self, envelope: &EncryptedInputData) -> Result<Vec<u8>, DecryptError> {
        if envelope.receiver_client_id != *self.receiver_id {
            return Err(DecryptError::NotForUs {
                addressed: envelope.receiver_client_id.clone(),
                key_owner: self.receiver_id.to_string(),
            });
        }
        Ok(crypto::decrypt(&self.secret, envelope)?)
    }
}
