//! Consuming: [`Consumer`] is a stream of [`Delivery`]s from one queue;
//! each delivery is opened with a [`ReceiverKey`] and settled with
//! [`Delivery::ack`] / [`Delivery::nack`], or many at once with
//! [`Consumer::ack_many`] or a [`Settler`] (by message id, pipelined: the
//! lines are written at once and the [`Settlement`] only waits for the
//! replies).
//!
//! A delivery stays owed until it is acknowledged: the broker
//! redelivers it, with its count one higher, after a `nack`, when the connection
//! closes, or after `performance.ack_wait_secs`; past
//! `performance.max_deliveries` it goes to the queue's dead-letter queue
//! `{queue}.dlq`. Acknowledge only once the message is safe on your side.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::mpsc;

use crate::client::driver::{DeliveryBatch, Expect, Handle, RawDelivery, ReplyBatch};
use crate::client::error::{ConsumerError, DecryptError, RequestError};
use crate::client::reply as expect_reply;
use crate::crypto::{self, EncryptedInputData, PublicKey, SecretKey};
use crate::key_file::{self, KeyFileError};

/// Longest `ack_batch` line [`Consumer::ack_many`] writes (the broker's lines
/// may be 1 MiB; a smaller line keeps other commands from waiting behind it).
const ACK_BATCH_BYTES: usize = 64 * 1024;

/// The deliveries of one queue, as a [`Stream`] (use `StreamExt::next` from
/// `futures` or `futures-util`). Made by [`Client::consume`](crate::Client::consume).
///
/// The stream yields `Err` once if the connection is lost
/// ([`ConsumerError::ConnectionLost`]) or the queue is deleted
/// ([`ConsumerError::QueueDeleted`]), then ends; after a lost connection a new
/// client must consume again (the broker redelivers what was not
/// acknowledged). A line the broker pushes that is no delivery
/// ([`ConsumerError::Unsolicited`]) does not end it.
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
    /// Deliveries from the connection task, a batch per read.
    rx: mpsc::UnboundedReceiver<DeliveryBatch>,
    /// The rest of the batch received last, yielded one by one before the
    /// channel is read again.
    ready: std::vec::IntoIter<RawDelivery>,
    /// For acks; shared with every delivery.
    handle: Arc<Handle>,
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
        rx: mpsc::UnboundedReceiver<DeliveryBatch>,
        handle: Handle,
    ) -> Consumer {
        Consumer {
            queue,
            rx,
            ready: Vec::new().into_iter(),
            handle: Arc::new(handle),
        }
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

    /// A handle that settles this queue's deliveries by message id without
    /// borrowing the consumer (keep reading the stream while acks are in
    /// flight, or settle from another task).
    pub fn settler(&self) -> Settler {
        Settler {
            queue: Arc::from(self.queue.as_str()),
            handle: (*self.handle).clone(),
        }
    }

    /// The next item if one has already arrived, without waiting: `None` when
    /// nothing is waiting (or the stream has ended). For collecting a burst of
    /// deliveries to settle together.
    ///
    /// ```no_run
    /// # async fn example(mut consumer: ciphermq_clients::Consumer) -> Result<(), Box<dyn std::error::Error>> {
    /// use futures_util::StreamExt;
    ///
    /// while let Some(first) = consumer.next().await {
    ///     let mut burst = vec![first?];
    ///     while let Some(more) = consumer.next_ready() {
    ///         burst.push(more?);
    ///     }
    ///     // ... store the burst, then settle it with one line:
    ///     consumer.ack_many(&burst).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn next_ready(&mut self) -> Option<Result<Delivery, ConsumerError>> {
        loop {
            if let Some(raw) = self.ready.next() {
                return Some(Ok(self.wrap(raw)));
            }
            match self.rx.try_recv().ok()? {
                Ok(batch) => self.ready = batch.into_iter(),
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// A delivery of the connection task's, with a handle to settle it.
    fn wrap(&self, raw: RawDelivery) -> Delivery {
        Delivery {
            raw,
            handle: self.handle.clone(),
        }
    }
}

impl Stream for Consumer {
    type Item = Result<Delivery, ConsumerError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(raw) = this.ready.next() {
                return Poll::Ready(Some(Ok(this.wrap(raw))));
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(batch))) => this.ready = batch.into_iter(),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Settles deliveries of one queue by message id (see
/// [`Consumer::settler`]). Cheap to clone; shares the consumer's connection.
///
/// Each method checks the ids, writes its lines at once (in order with every
/// other command of the client) and returns a [`Settlement`] that waits for
/// the replies: many settlements can be in flight while the consumer keeps
/// reading. Settle an id only once it is safe on your side.
///
/// ```no_run
/// # async fn example(mut consumer: ciphermq_clients::Consumer) -> Result<(), Box<dyn std::error::Error>> {
/// use futures_util::StreamExt;
///
/// let settler = consumer.settler();
/// let mut ids = Vec::new();
/// while let Some(delivery) = consumer.next().await {
///     let delivery = delivery?;
///     // ... store it ...
///     ids.push(delivery.id().to_owned());
///     if ids.len() == 100 {
///         // One `ack_batch` line; its reply is awaited on another task.
///         let settlement = settler.ack_ids(ids.drain(..))?;
///         tokio::spawn(async move {
///             if let Err(e) = settlement.await {
///                 eprintln!("acks failed: {e}");
///             }
///         });
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Settler {
    /// The queue.
    queue: Arc<str>,
    /// The connection.
    handle: Handle,
}

impl fmt::Debug for Settler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settler")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Settler {
    /// The queue whose deliveries it settles.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Acknowledges `ids` with `ack_batch <queue> <id> …` lines (as few as fit
    /// in 64 KiB each). The [`Settlement`] resolves to how many deliveries the
    /// broker settled: each id settles every delivery of it to this
    /// connection, and ids it no longer owes us are skipped. Nothing is sent
    /// when an id breaks the name rule ([`RequestError::InvalidName`]); no ids,
    /// nothing sent, and the settlement resolves to 0.
    pub fn ack_ids<I, S>(&self, ids: I) -> Result<Settlement, RequestError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (lines, count) = ack_batch_lines(&self.queue, ids)?;
        let expect = SettleKind::Batch(format!("OK ack_batch {} ", self.queue));
        self.submit(lines, count, expect)
    }

    /// Acknowledges `ids` with one `ack <id> <queue>` line each, written
    /// together; the [`Settlement`] resolves to how many the broker confirmed
    /// (`ACK_CONFIRMED`). An id it no longer owes us (`Error: no outstanding
    /// delivery <id>`) is not counted; any other refusal fails the settlement.
    /// [`Settler::ack_ids`] settles the same with far fewer lines.
    pub fn ack_each<I, S>(&self, ids: I) -> Result<Settlement, RequestError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (lines, count) = single_lines("ack", &self.queue, ids)?;
        self.submit(lines, count, SettleKind::Each("ACK_CONFIRMED "))
    }

    /// Gives `ids` back with one `nack <id> <queue>` line each: the broker
    /// redelivers them, counting one more delivery, and moves them to
    /// `{queue}.dlq` past `max_deliveries`. Resolves to how many it confirmed
    /// (`NACK_CONFIRMED`), as [`Settler::ack_each`] counts.
    pub fn nack_each<I, S>(&self, ids: I) -> Result<Settlement, RequestError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (lines, count) = single_lines("nack", &self.queue, ids)?;
        self.submit(lines, count, SettleKind::Each("NACK_CONFIRMED "))
    }

    /// Hands `count` lines to the connection task.
    fn submit(
        &self,
        lines: String,
        count: usize,
        kind: SettleKind,
    ) -> Result<Settlement, RequestError> {
        let (tx, rx) = mpsc::unbounded_channel();
        if count > 0 {
            self.handle
                .submit_many(lines.into_bytes(), Expect::Lines(count), tx)?;
        }
        Ok(Settlement {
            replies: rx,
            ready: Vec::new().into_iter(),
            left: count,
            kind,
            settled: 0,
            handle: self.handle.clone(),
        })
    }
}

/// How a settlement's replies count.
#[derive(Debug)]
enum SettleKind {
    /// `OK ack_batch <queue> <n>`: the prefix up to `<n>`.
    Batch(String),
    /// `ACK_CONFIRMED <id>` or `NACK_CONFIRMED <id>`: the prefix up to `<id>`.
    Each(&'static str),
}

/// The replies owed to the lines a [`Settler`] wrote: a future of how many
/// deliveries the broker settled. The lines are already on their way;
/// dropping a settlement only stops waiting for the replies (the broker
/// settles all the same).
#[must_use = "the lines are sent already; await the settlement to learn the broker's count and errors"]
pub struct Settlement {
    /// The replies, in order, a batch per read.
    replies: mpsc::UnboundedReceiver<ReplyBatch>,
    /// The rest of the batch received last.
    ready: std::vec::IntoIter<String>,
    /// Replies still owed.
    left: usize,
    /// How to read them.
    kind: SettleKind,
    /// Settled so far.
    settled: u64,
    /// For the reason a connection ended.
    handle: Handle,
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("replies_owed", &self.left)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl Settlement {
    /// Replies still owed.
    pub fn replies_owed(&self) -> usize {
        self.left
    }

    /// Reads one reply.
    fn on_reply(&mut self, line: String) -> Result<(), RequestError> {
        match &self.kind {
            SettleKind::Batch(prefix) => {
                match line.strip_prefix(prefix.as_str()).map(str::parse::<u64>) {
                    Some(Ok(n)) => self.settled += n,
                    _ => return Err(expect_reply::refusal(line)),
                }
            }
            SettleKind::Each(prefix) => {
                if line.starts_with(prefix) {
                    self.settled += 1;
                } else if !line.starts_with("Error: no outstanding delivery ") {
                    return Err(expect_reply::refusal(line));
                }
            }
        }
        Ok(())
    }
}

impl Future for Settlement {
    type Output = Result<u64, RequestError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        while this.left > 0 {
            if let Some(line) = this.ready.next() {
                this.left -= 1;
                if let Err(e) = this.on_reply(line) {
                    this.left = 0;
                    return Poll::Ready(Err(e));
                }
                continue;
            }
            match this.replies.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(batch))) => this.ready = batch.into_iter(),
                Poll::Ready(Some(Err(e))) => {
                    this.left = 0;
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(None) => {
                    this.left = 0;
                    return Poll::Ready(Err(this.handle.lost()));
                }
            }
        }
        Poll::Ready(Ok(this.settled))
    }
}

/// `ack_batch <queue> <id> …` lines for `ids`, split at [`ACK_BATCH_BYTES`],
/// each ending in `\n`; and how many.
fn ack_batch_lines<I, S>(queue: &str, ids: I) -> Result<(String, usize), RequestError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = String::new();
    let mut open = 0usize;
    let mut lines = 0usize;
    for id in ids {
        let id = id.as_ref();
        expect_reply::check_name("message id", id)?;
        if open > 0 && open + 1 + id.len() > ACK_BATCH_BYTES {
            out.push('\n');
            open = 0;
        }
        if open == 0 {
            let start = out.len();
            out.push_str("ack_batch ");
            out.push_str(queue);
            open = out.len() - start;
            lines += 1;
        }
        out.push(' ');
        out.push_str(id);
        open += 1 + id.len();
    }
    if open > 0 {
        out.push('\n');
    }
    Ok((out, lines))
}

/// `<command> <id> <queue>` for each id, each ending in `\n`; and how many.
fn single_lines<I, S>(command: &str, queue: &str, ids: I) -> Result<(String, usize), RequestError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = String::new();
    let mut lines = 0usize;
    for id in ids {
        let id = id.as_ref();
        expect_reply::check_name("message id", id)?;
        out.push_str(command);
        out.push(' ');
        out.push_str(id);
        out.push(' ');
        out.push_str(queue);
        out.push('\n');
        lines += 1;
    }
    Ok((out, lines))
}

/// One delivery: a message from a queue, owed until acknowledged.
pub struct Delivery {
    /// The line's fields.
    raw: RawDelivery,
    /// For ack and nack.
    handle: Arc<Handle>,
}

impl fmt::Debug for Delivery {
    /// Id, queue and count; never the body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.raw.id())
            .field("queue", &self.raw.queue())
            .field("delivery_count", &self.raw.count)
            .field("body_bytes", &self.raw.body().len())
            .finish()
    }
}

impl Delivery {
    /// The message id, as published.
    pub fn id(&self) -> &str {
        self.raw.id()
    }

    /// The queue it comes from.
    pub fn queue(&self) -> &str {
        self.raw.queue()
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
        self.raw.body()
    }

    /// The body parsed, without decrypting it.
    pub fn envelope(&self) -> Result<EncryptedInputData, DecryptError> {
        serde_json::from_str(self.raw.body()).map_err(DecryptError::Body)
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
        if envelope.message_id != self.raw.id() {
            return Err(DecryptError::IdMismatch {
                delivery: self.raw.id().to_owned(),
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
        let line = format!("{command} {} {}", self.raw.id(), self.raw.queue());
        let reply = self.handle.call(line.into(), Expect::Line).await?;
        match reply
            .strip_prefix(confirmed)
            .and_then(|r| r.strip_prefix(' '))
        {
            Some(id) if id == self.raw.id() => Ok(()),
            _ => Err(expect_reply::refusal(reply)),
        }
    }
}

/// `ack_batch` lines for `deliveries`, grouped by queue and split at
/// [`ACK_BATCH_BYTES`], all written before the first reply is awaited; the
/// sum of the counts settled.
pub(crate) async fn ack_many(
    handle: &Handle,
    deliveries: &[Delivery],
) -> Result<u64, RequestError> {
    let mut queues: Vec<&str> = deliveries.iter().map(|d| d.queue()).collect();
    queues.sort_unstable();
    queues.dedup();
    let mut settlements = Vec::with_capacity(queues.len());
    for queue in queues {
        let settler = Settler {
            queue: Arc::from(queue),
            handle: handle.clone(),
        };
        let ids = deliveries
            .iter()
            .filter(|d| d.queue() == queue)
            .map(|d| d.id());
        settlements.push(settler.ack_ids(ids)?);
    }
    let mut settled = 0u64;
    for settlement in settlements {
        settled += settlement.await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_become_batch_lines_split_at_the_line_cap() {
        assert_eq!(
            ack_batch_lines("q1", ["a", "c"]).unwrap(),
            ("ack_batch q1 a c\n".to_owned(), 1)
        );
        assert_eq!(
            ack_batch_lines("q", Vec::<String>::new()).unwrap(),
            (String::new(), 0)
        );
        let id = "x".repeat(200);
        let many: Vec<&str> = (0..400).map(|_| id.as_str()).collect();
        let (text, count) = ack_batch_lines("q", &many).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() > 1);
        assert_eq!(lines.len(), count);
        assert!(lines
            .iter()
            .all(|l| l.len() <= ACK_BATCH_BYTES && l.starts_with("ack_batch q ")));
        let ids: usize = lines.iter().map(|l| l.split(' ').count() - 2).sum();
        assert_eq!(ids, 400);
        // An id that breaks the name rule sends nothing.
        assert!(matches!(
            ack_batch_lines("q", ["a", "b c"]),
            Err(RequestError::InvalidName { .. })
        ));
    }

    #[test]
    fn single_settles_are_one_line_each() {
        assert_eq!(
            single_lines("nack", "q", ["a", "b"]).unwrap(),
            ("nack a q\nnack b q\n".to_owned(), 2)
        );
        assert!(single_lines("ack", "q", ["a\nquit"]).is_err());
    }
}
