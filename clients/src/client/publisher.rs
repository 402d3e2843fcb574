//! Publishing: [`Publisher`] sends encrypted messages, pipelined up to the
//! connection's window, retrying retryable NACKs with backoff, and encrypts for a
//! receiver itself with [`Publisher::publish_to`]. For the highest rate,
//! [`Publisher::pipeline`] splits publishing into a [`PublishPipeline`] that
//! queues and flushes publishes and a [`PublishOutcomes`] stream of their
//! outcomes in order: no future, no channel per message, no retries.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use ciphermq_proto::{NackReason, Reply};
use futures_core::Stream;
use tokio::sync::mpsc;

use crate::client::driver::{Expect, Handle, ManySink, PublishIds, ReplyBatch, ReplyResult};
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
                Reply::Nack { reason, .. } if reason.starts_with("moved ") => {
                    return Err(moved(&prepared.message_id, reason))
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

    /// A pipelined publishing path for the highest rate: a [`PublishPipeline`]
    /// that queues publishes and hands them to the connection in one write per
    /// [`flush`](PublishPipeline::flush), and a [`PublishOutcomes`] stream of
    /// their outcomes in the order they were pushed. The two halves may live on
    /// two tasks.
    ///
    /// Leaner than [`Publisher::publish`] (no future, channel or window slot
    /// per message) and plainer: nothing is retried (a retryable NACK is an
    /// outcome like any other) and the client's publish window does not apply;
    /// bound what is in flight yourself ([`PublishPipeline::pushed`] minus the
    /// outcomes read), well below the 65,536 replies a connection may owe.
    ///
    /// ```no_run
    /// # async fn example(client: ciphermq_clients::Client, envelopes: Vec<ciphermq_clients::EncryptedInputData>) -> Result<(), Box<dyn std::error::Error>> {
    /// use ciphermq_clients::Publisher;
    /// use futures_util::StreamExt;
    ///
    /// let (mut pipeline, mut outcomes) = client.publisher().pipeline();
    /// let n = envelopes.len();
    /// for envelope in &envelopes {
    ///     pipeline.push(&Publisher::prepare("ex", "receiver_1", envelope)?)?;
    /// }
    /// pipeline.flush()?;
    /// for _ in 0..n {
    ///     match outcomes.next().await {
    ///         Some(Ok(ack)) => println!("{} stored", ack.message_id),
    ///         Some(Err(e)) => eprintln!("{e}"),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn pipeline(&self) -> (PublishPipeline, PublishOutcomes) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            PublishPipeline {
                handle: self.client.inner.handle.clone(),
                lines: Vec::new(),
                ids: PublishIds::default(),
                route: None,
                replies: tx,
                pushed: 0,
            },
            PublishOutcomes {
                replies: rx,
                ready: Vec::new().into_iter(),
                ended: false,
            },
        )
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

/// The sending half of [`Publisher::pipeline`]: publishes are queued with
/// [`push`](PublishPipeline::push) or [`push_json`](PublishPipeline::push_json)
/// and handed to the connection, in one write, by
/// [`flush`](PublishPipeline::flush). Publishes still queued when it is
/// dropped are not sent.
pub struct PublishPipeline {
    /// The connection.
    handle: Handle,
    /// Queued publish lines, each ending in `\n`.
    lines: Vec<u8>,
    /// Their message ids, in order.
    ids: PublishIds,
    /// The exchange and routing key checked last: a run of publishes to one
    /// route checks the names once.
    route: Option<(String, String)>,
    /// Where the connection task sends the replies.
    replies: ManySink,
    /// Publishes flushed so far.
    pushed: u64,
}

impl fmt::Debug for PublishPipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishPipeline")
            .field("queued", &self.ids.len())
            .field("queued_bytes", &self.lines.len())
            .field("pushed", &self.pushed)
            .finish_non_exhaustive()
    }
}

impl PublishPipeline {
    /// Queues a publish [`Publisher::prepare`] rendered.
    pub fn push(&mut self, prepared: &PreparedPublish) -> Result<(), PublishError> {
        self.lines.extend_from_slice(prepared.line.as_bytes());
        self.lines.push(b'\n');
        self.ids.push(&prepared.message_id);
        Ok(())
    }

    /// Queues `publish <exchange> <routing_key> <json>`, where `json` is an
    /// encrypted message rendered ahead (the JSON of an
    /// [`EncryptedInputData`], one line) whose `message_id` is `message_id`.
    /// The names are checked and the JSON must hold no line break; nothing is
    /// queued otherwise. A body whose id is not `message_id` makes the broker
    /// answer for another id than the one expected, which ends the connection
    /// ([`Disconnected::Protocol`](crate::Disconnected::Protocol)).
    pub fn push_json(
        &mut self,
        exchange: &str,
        routing_key: &str,
        message_id: &str,
        json: &str,
    ) -> Result<(), PublishError> {
        self.push_json_bytes(exchange, routing_key, message_id, json.as_bytes())
    }

    /// [`PublishPipeline::push_json`] for JSON rendered into a byte buffer
    /// (a load generator patching a template), checked as there except for
    /// UTF-8: the broker checks every line, so a body that is not UTF-8 is not
    /// scanned twice; it is refused on its own (its outcome is
    /// `Err(PublishError::Request)`, `invalid UTF-8 in request`) and the
    /// pipeline goes on.
    pub fn push_json_bytes(
        &mut self,
        exchange: &str,
        routing_key: &str,
        message_id: &str,
        json: &[u8],
    ) -> Result<(), PublishError> {
        let known = matches!(&self.route, Some((e, k)) if e == exchange && k == routing_key);
        if !known {
            reply::check_name("exchange", exchange)?;
            reply::check_key(routing_key)?;
            self.route = Some((exchange.to_owned(), routing_key.to_owned()));
        }
        if !ciphermq_proto::is_valid_name(message_id) {
            return Err(PublishError::InvalidMessageId(message_id.to_owned()));
        }
        if memchr::memchr2(b'\n', b'\r', json).is_some() {
            return Err(PublishError::Request(RequestError::Unsupported(
                "a message's JSON is one line: no \\n or \\r".to_owned(),
            )));
        }
        self.lines
            .reserve(json.len() + exchange.len() + routing_key.len() + 11);
        self.lines.extend_from_slice(b"publish ");
        self.lines.extend_from_slice(exchange.as_bytes());
        self.lines.push(b' ');
        self.lines.extend_from_slice(routing_key.as_bytes());
        self.lines.push(b' ');
        self.lines.extend_from_slice(json);
        self.lines.push(b'\n');
        self.ids.push(message_id);
        Ok(())
    }

    /// Publishes queued and not flushed yet.
    pub fn queued(&self) -> usize {
        self.ids.len()
    }

    /// Bytes queued and not flushed yet (flush well before megabytes pile up:
    /// the first publishes wait for the last).
    pub fn queued_bytes(&self) -> usize {
        self.lines.len()
    }

    /// Publishes handed to the connection so far.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Hands what is queued to the connection, in one write, without waiting
    /// for it to be written. Fails only when the connection has ended (the
    /// queued publishes are then dropped).
    pub fn flush(&mut self) -> Result<(), RequestError> {
        if self.ids.is_empty() {
            return Ok(());
        }
        let n = self.ids.len() as u64;
        // The lines go out in a buffer the connection emptied before (no
        // allocation a flush); the ids' room is sized on this flush.
        let next_lines = self.handle.spare_buffer();
        let lines = std::mem::replace(&mut self.lines, next_lines);
        let next_ids = PublishIds::with_capacity(self.ids.len(), self.ids.text_len());
        let ids = std::mem::replace(&mut self.ids, next_ids);
        self.handle
            .submit_many(lines, Expect::Publishes(ids), self.replies.clone())?;
        self.pushed += n;
        Ok(())
    }
}

/// The outcomes of a [`PublishPipeline`]'s publishes, one per publish in the
/// order they were pushed: `Ok(Ack)` (stored), `Err(PublishError::Nack)` or
/// `UnknownNack` (refused, not retried), `Err(PublishError::Request)` (a
/// refusal such as `Error: invalid message`). A lost connection is one
/// `Err` whose [`PublishError::is_connection_lost`] is true, the publishes
/// then unanswered have no outcome, and the stream ends; it also ends once
/// the pipeline is dropped and every outcome was read.
pub struct PublishOutcomes {
    /// The replies, in order, a batch per read.
    replies: mpsc::UnboundedReceiver<ReplyBatch>,
    /// The rest of the batch received last, read before the channel.
    ready: std::vec::IntoIter<String>,
    /// A lost connection was reported.
    ended: bool,
}

impl fmt::Debug for PublishOutcomes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishOutcomes")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl PublishOutcomes {
    /// The next outcome if one has arrived, without waiting.
    pub fn next_ready(&mut self) -> Option<Result<Ack, PublishError>> {
        if self.ended {
            return None;
        }
        loop {
            if let Some(line) = self.ready.next() {
                return Some(self.outcome(Ok(line)));
            }
            match self.replies.try_recv().ok()? {
                Ok(batch) => self.ready = batch.into_iter(),
                Err(e) => return Some(self.outcome(Err(e))),
            }
        }
    }

    /// One reply as an outcome.
    fn outcome(&mut self, reply: ReplyResult) -> Result<Ack, PublishError> {
        let mut line = match reply {
            Ok(line) => line,
            Err(e) => {
                self.ended = true;
                return Err(e.into());
            }
        };
        if line.starts_with("ACK ") {
            line.drain(..4);
            return Ok(Ack {
                message_id: line,
                attempts: 1,
            });
        }
        match Reply::parse(&line) {
            Reply::Nack { message_id, reason } => match NackReason::parse(reason) {
                Some(reason) => Err(PublishError::Nack {
                    message_id: message_id.to_owned(),
                    reason,
                    attempts: 1,
                }),
                None => Err(PublishError::UnknownNack {
                    message_id: message_id.to_owned(),
                    reason: reason.to_owned(),
                }),
            },
            _ => Err(PublishError::Request(reply::refusal(line))),
        }
    }
}

impl Stream for PublishOutcomes {
    type Item = Result<Ack, PublishError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            if let Some(line) = this.ready.next() {
                return Poll::Ready(Some(this.outcome(Ok(line))));
            }
            match this.replies.poll_recv(cx) {
                Poll::Ready(Some(Ok(batch))) => this.ready = batch.into_iter(),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(this.outcome(Err(e)))),
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The error of a `NACK <id> moved …` (its reason given).
fn moved(message_id: &str, reason: &str) -> PublishError {
    match ciphermq_proto::Redirect::parse(reason) {
        Some(r) => PublishError::Moved(Box::new(super::error::Moved {
            message_id: message_id.to_owned(),
            owner: r.owner.to_owned(),
            node_id: r.node_id.to_owned(),
            address: r.address.to_owned(),
            epoch: r.epoch,
        })),
        None => PublishError::UnknownNack {
            message_id: message_id.to_owned(),
            reason: reason.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::error::Disconnected;

    #[test]
    fn pipeline_outcomes_are_typed_in_order_and_end_after_a_lost_connection() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut outcomes = PublishOutcomes {
            replies: rx,
            ready: Vec::new().into_iter(),
            ended: false,
        };
        // Replies come in batches (those of one read); outcomes one by one.
        for batch in [
            &["ACK m1", "NACK m2 queue_full"][..],
            &["NACK m3 something_new", "Error: invalid message"],
        ] {
            tx.send(Ok(batch.iter().map(|l| l.to_string()).collect()))
                .unwrap();
        }
        tx.send(Err(RequestError::ConnectionLost(Arc::new(
            Disconnected::ClosedByBroker,
        ))))
        .unwrap();
        tx.send(Ok(vec!["ACK m9".to_owned()])).unwrap();
        assert!(
            matches!(outcomes.next_ready(), Some(Ok(a)) if a.message_id == "m1" && a.attempts == 1)
        );
        assert!(matches!(
            outcomes.next_ready(),
            Some(Err(PublishError::Nack { message_id, reason: NackReason::QueueFull, attempts: 1 })) if message_id == "m2"
        ));
        assert!(matches!(
            outcomes.next_ready(),
            Some(Err(PublishError::UnknownNack { reason, .. })) if reason == "something_new"
        ));
        assert!(matches!(
            outcomes.next_ready(),
            Some(Err(PublishError::Request(RequestError::Broker(t)))) if t == "invalid message"
        ));
        assert!(matches!(outcomes.next_ready(), Some(Err(e)) if e.is_connection_lost()));
        assert!(outcomes.next_ready().is_none());
    }
}
