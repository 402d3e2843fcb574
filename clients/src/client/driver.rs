//! The connection task: the one owner of a client's socket.
//!
//! Handles ([`Handle`], inside every `Client`, `Publisher`, `Consumer` and
//! `Delivery`) send it [`Op`]s over a channel. For each, in the order they
//! arrive, the task appends the command line to the next write and pushes a
//! [`Pending`] entry on a FIFO, in the same step, so the FIFO's order is the
//! order of the lines on the wire. The broker answers strictly in command order
//! (docs/PROTOCOL.md, "Replies"), so each reply line pops the FIFO's head and goes to its
//! command's oneshot. `Message:` lines are no reply: they go to the consumer of
//! their queue, whatever is pending, and so does a pushed `Error: queue <q>
//! deleted` for a queue consumed here (it ends that consumer, not the
//! connection). A line that comes with no command waiting is no reply either:
//! every consumer gets it as [`ConsumerError::Unsolicited`].
//!
//! One op may carry many lines with one reply channel ([`Op::Many`]): a
//! publish pipeline's publishes, or a settlement's `ack_batch`/`ack` lines.
//! Its FIFO entry answers that many replies before it is popped, so a burst
//! costs one op, one entry and one channel, not one of each per line.
//!
//! Deliveries are handed over in batches: those of one read (every line
//! already in the read buffer) go to their consumer as one `Vec`, so a burst
//! costs one channel message per consumer, not one per delivery. A batch is
//! handed over before any reply or error that came after it on the wire, so a
//! caller who sees a reply also finds every delivery read before it.
//!
//! Checks that keep the two sides in step: a publish's `ACK`/`NACK` must name the
//! publish at the head of the FIFO; a malformed delivery, or a head left
//! unanswered past the reply timeout ends the
//! connection ([`Disconnected`]), and every waiting command and consumer gets the
//! reason.
//!
//! The task writes to the socket itself, with no task between the commands and
//! the wire, and never waits on a write: each turn of its loop makes one
//! non-blocking step of sending what is queued, then reads what has come, then
//! takes new commands (also after every read, so a stream of deliveries cannot
//! hold back the acks). It takes no more commands while
//! [`WRITE_BACKLOG_BYTES`] wait to be written; they stay in its channel.
//!
//! The task sends `heartbeat` when nothing was written for the heartbeat
//! interval, and `quit` once every handle is gone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ciphermq_proto::Reply;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::client::error::{ConsumerError, Disconnected, RequestError};
use crate::connection::{Connection, ConnectionWriter};

pub(crate) use crate::client::batches::{PublishIds, RawDelivery, Spares};

/// What a command gets back: its reply line, or why none came.
pub(crate) type ReplyResult = Result<String, RequestError>;

/// What a consumer gets: the deliveries of one read, in order, or why its
/// stream ends (or, for [`ConsumerError::Unsolicited`], a line it should see).
pub(crate) type DeliveryBatch = Result<Vec<RawDelivery>, ConsumerError>;

/// Where a queue's deliveries go.
pub(crate) type DeliverySink = mpsc::UnboundedSender<DeliveryBatch>;

/// Bytes waiting to be written past which the task takes no more commands
/// (a broker that stops reading stops the client's writers too, instead of
/// the client buffering without bound).
pub(crate) const WRITE_BACKLOG_BYTES: usize = 1024 * 1024;

/// Where the replies of an [`Op::Many`] go, in order.
pub(crate) type ManySink = mpsc::UnboundedSender<ReplyBatch>;

/// Replies of [`Op::Many`]s, in order: those of one read that go to one
/// channel travel together (one channel message, not one a reply), or why no
/// more will come.
pub(crate) type ReplyBatch = Result<Vec<String>, RequestError>;

/// What a command's reply is checked against.
#[derive(Debug)]
pub(crate) enum Expect {
    /// Any one line.
    Line,
    /// `ACK <id>` or `NACK <id> <reason>` naming this id (or a refusal line).
    Publish(Arc<str>),
    /// `OK consume <q>` keeps the queue's sink; anything else removes it.
    Consume(String),
    /// The task's own `heartbeat`; its reply is dropped.
    Heartbeat,
    /// `quit`: `OK bye` ends the connection.
    Quit,
    /// Publishes of an [`Op::Many`]: each reply must name the oldest id left.
    Publishes(PublishIds),
    /// This many more lines of an [`Op::Many`], any replies.
    Lines(usize),
}

/// A request to the connection task.
#[derive(Debug)]
pub(crate) enum Op {
    /// One command line (without its newline) and where its reply goes.
    Command {
        /// The line; shared so a publisher can send it again on a retry.
        line: Arc<str>,
        /// How to check the reply.
        expect: Expect,
        /// The command's reply.
        reply: oneshot::Sender<ReplyResult>,
    },
    /// `consume <queue> <prefetch>`: the sink is registered as the line is
    /// written, before any delivery can come.
    Consume {
        /// The queue.
        queue: String,
        /// Most unacknowledged deliveries at once.
        prefetch: u32,
        /// Where its deliveries go.
        sink: DeliverySink,
        /// The `OK consume` reply.
        reply: oneshot::Sender<ReplyResult>,
    },
    /// Many command lines (each ending in `\n`) answered through one channel,
    /// one reply each, in order; `expect` is [`Expect::Publishes`] or
    /// [`Expect::Lines`] and counts the lines.
    Many {
        /// The lines (bytes: a publish body may be left to the broker's UTF-8
        /// check).
        lines: Vec<u8>,
        /// How to check the replies, and how many there are.
        expect: Expect,
        /// Where the replies go.
        replies: ManySink,
    },
}

/// Where a command's reply goes.
enum ReplyTo {
    /// A command's own oneshot.
    One(oneshot::Sender<ReplyResult>),
    /// One of many replies of an [`Op::Many`].
    Many(ManySink),
    /// The task's own commands: dropped.
    Own,
}

/// A command written and not answered yet.
struct Pending {
    /// How to check its reply.
    expect: Expect,
    /// Where the reply goes.
    reply: ReplyTo,
    /// When it was handed to the writer.
    sent_at: Instant,
}

/// The connection task's timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Longest wait for the oldest reply.
    pub(crate) reply_timeout: Duration,
    /// A heartbeat after this long without a write.
    pub(crate) heartbeat: Option<Duration>,
}

/// The handles' side: sends ops, learns why the connection ended.
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    /// Requests to the task.
    ops: mpsc::UnboundedSender<Op>,
    /// `Some` once the connection has ended.
    closed: watch::Receiver<Option<Arc<Disconnected>>>,
    /// Write buffers to build lines in, shared with the task.
    spares: Arc<Spares>,
}

impl Handle {
    /// Sends `line`, waits for its reply line.
    pub(crate) async fn call(&self, line: Arc<str>, expect: Expect) -> ReplyResult {
        let reply = self.submit(line, expect)?;
        self.wait(reply).await
    }

    /// Hands `line` to the task without waiting: commands submitted one after
    /// the other are written in that order (pipelining).
    pub(crate) fn submit(
        &self,
        line: Arc<str>,
        expect: Expect,
    ) -> Result<oneshot::Receiver<ReplyResult>, RequestError> {
        let (tx, rx) = oneshot::channel();
        self.ops
            .send(Op::Command {
                line,
                expect,
                reply: tx,
            })
            .map_err(|_| self.lost())?;
        Ok(rx)
    }

    /// Hands many lines to the task at once (see [`Op::Many`]); their replies
    /// go to `replies`, in order.
    pub(crate) fn submit_many(
        &self,
        lines: Vec<u8>,
        expect: Expect,
        replies: ManySink,
    ) -> Result<(), RequestError> {
        self.ops
            .send(Op::Many {
                lines,
                expect,
                replies,
            })
            .map_err(|_| self.lost())
    }

    /// An empty buffer to build an [`Op::Many`]'s lines in (see [`Spares`]).
    pub(crate) fn spare_buffer(&self) -> Vec<u8> {
        self.spares.take()
    }

    /// Waits for the reply of a submitted command.
    pub(crate) async fn wait(&self, reply: oneshot::Receiver<ReplyResult>) -> ReplyResult {
        reply.await.map_err(|_| self.lost())?
    }

    /// Sends `consume`, registering `sink` for the queue's deliveries.
    pub(crate) async fn consume(
        &self,
        queue: String,
        prefetch: u32,
        sink: DeliverySink,
    ) -> ReplyResult {
        let (tx, rx) = oneshot::channel();
        self.ops
            .send(Op::Consume {
                queue,
                prefetch,
                sink,
                reply: tx,
            })
            .map_err(|_| self.lost())?;
        rx.await.map_err(|_| self.lost())?
    }

    /// The error of a command that could not be sent or answered.
    pub(crate) fn lost(&self) -> RequestError {
        RequestError::ConnectionLost(self.reason())
    }

    /// Why the connection ended (`ClosedByClient` if it has not, which only a
    /// task that vanished without saying could cause).
    fn reason(&self) -> Arc<Disconnected> {
        self.closed
            .borrow()
            .clone()
            .unwrap_or_else(|| Arc::new(Disconnected::ClosedByClient))
    }

    /// Whether the connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.borrow().is_some()
    }

    /// Completes when the connection ends, with the reason.
    pub(crate) async fn closed(&self) -> Arc<Disconnected> {
        let mut rx = self.closed.clone();
        let reason = match rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            Err(_) => None,
        };
        reason.unwrap_or_else(|| self.reason())
    }
}

/// Starts the task serving `conn`; it ends when the connection does.
pub(crate) fn spawn(conn: Connection, settings: Settings) -> Handle {
    let (ops_tx, ops_rx) = mpsc::unbounded_channel();
    let (closed_tx, closed_rx) = watch::channel(None);
    let spares = Arc::new(Spares::default());
    tokio::spawn(run(conn, ops_rx, closed_tx, settings, spares.clone()));
    Handle {
        ops: ops_tx,
        closed: closed_rx,
        spares,
    }
}

/// A consumer, with the deliveries read for it and not handed over yet.
struct Sink {
    /// Where its deliveries go.
    tx: DeliverySink,
    /// Deliveries of the current read, handed over by
    /// [`State::hand_over`].
    held: Vec<RawDelivery>,
}

impl Sink {
    /// A consumer with nothing held.
    fn new(tx: DeliverySink) -> Sink {
        Sink {
            tx,
            held: Vec::new(),
        }
    }
}

/// Replies of [`Op::Many`]s read and not handed over yet: those of one read
/// for one channel go as one message.
#[derive(Default)]
struct HeldReplies {
    /// The replies, in order.
    lines: Vec<String>,
    /// Where they go.
    to: Option<ManySink>,
}

impl HeldReplies {
    /// Holds a reply for `tx`; what is held for another channel goes first.
    fn hold(&mut self, tx: &ManySink, line: String) {
        match &self.to {
            Some(to) if to.same_channel(tx) => {}
            _ => {
                self.hand_over();
                self.to = Some(tx.clone());
            }
        }
        self.lines.push(line);
    }

    /// Hands the replies held over, in one channel message.
    fn hand_over(&mut self) {
        let Some(tx) = self.to.take() else {
            return;
        };
        if self.lines.is_empty() {
            return;
        }
        let room = self.lines.len();
        let batch = std::mem::replace(&mut self.lines, Vec::with_capacity(room));
        // A receiver that was dropped stopped waiting; the broker acted all
        // the same.
        let _ = tx.send(Ok(batch));
    }
}

/// The task's state besides the socket.
#[derive(Default)]
struct State {
    /// Commands written, oldest first.
    pending: VecDeque<Pending>,
    /// Live consumers by queue.
    sinks: HashMap<String, Sink>,
    /// Some sink holds deliveries.
    holding: bool,
    /// Replies of [`Op::Many`]s read and not handed over yet.
    held: HeldReplies,
    /// Queues whose orphaned deliveries were already logged.
    orphan_logged: HashSet<String>,
    /// `quit` was written: no more commands.
    quitting: bool,
    /// `OK bye` came.
    bye: bool,
    /// Where emptied write buffers go back to the handles.
    spares: Arc<Spares>,
}

/// The task: writes commands, reads and routes lines, keeps time.
async fn run(
    conn: Connection,
    mut ops: mpsc::UnboundedReceiver<Op>,
    closed: watch::Sender<Option<Arc<Disconnected>>>,
    settings: Settings,
    spares: Arc<Spares>,
) {
    let (mut reader, mut writer) = conn.into_split();
    let mut st = State {
        spares,
        ..State::default()
    };
    let mut last_write = Instant::now();
    // With nothing to time, the timer idles a day ahead (and fires harmlessly).
    const IDLE: Duration = Duration::from_secs(24 * 3600);
    let timer = tokio::time::sleep_until(Instant::now() + IDLE);
    tokio::pin!(timer);
    let reason = loop {
        let wake = match st.next_wake(&settings, last_write) {
            Some(wake) => wake,
            None if timer.deadline() > Instant::now() => timer.deadline(),
            None => Instant::now() + IDLE,
        };
        if timer.deadline() != wake {
            timer.as_mut().reset(wake);
        }
        let room = !st.quitting && writer.queued_bytes() < WRITE_BACKLOG_BYTES;
        tokio::select! {
            biased;
            // One step, never a wait: a socket that takes nothing leaves the
            // turn to the read.
            sent = writer.send_some(), if writer.has_unsent() => {
                if let Err(e) = sent {
                    break Disconnected::Transport(e);
                }
            },
            line = reader.read_line() => match line {
                Ok(Some(line)) => {
                    let mut failed = st.on_line(line).err();
                    // The lines already read (a burst of replies or
                    // deliveries) are handled without going back to the select.
                    while failed.is_none() && !st.bye {
                        match reader.buffered_line() {
                            Some(Ok(line)) => failed = st.on_line(line).err(),
                            Some(Err(e)) => failed = Some(Disconnected::Transport(e)),
                            None => break,
                        }
                    }
                    st.hand_over();
                    if let Some(reason) = failed {
                        break reason;
                    }
                    if st.bye {
                        break Disconnected::ClosedByClient;
                    }
                    // Commands that came meanwhile go out with the next write,
                    // however busy the read side is.
                    if room && st.take_ready(&mut ops, &mut writer, Instant::now()) {
                        last_write = Instant::now();
                    }
                }
                Ok(None) if st.quitting => break Disconnected::ClosedByClient,
                Ok(None) => break Disconnected::ClosedByBroker,
                Err(e) => break Disconnected::Transport(e),
            },
            op = ops.recv(), if room => {
                let now = Instant::now();
                match op {
                    Some(op) => {
                        st.take(op, &mut writer, now);
                        st.take_ready(&mut ops, &mut writer, now);
                    }
                    // Every handle is gone: say goodbye, wait for `OK bye`.
                    None => st.push_own("quit", Expect::Quit, &mut writer, now),
                }
                if writer.has_unsent() {
                    last_write = now;
                }
            },
            () = &mut timer => {
                let now = Instant::now();
                if st.pending.front().is_some_and(|p| now >= p.sent_at + settings.reply_timeout) {
                    break Disconnected::ReplyTimeout(settings.reply_timeout);
                }
                if let Some(every) = settings.heartbeat {
                    if !st.quitting && now >= last_write + every {
                        st.push_own("heartbeat", Expect::Heartbeat, &mut writer, now);
                        last_write = now;
                    }
                }
            }
        }
    };
    if !matches!(reason, Disconnected::ClosedByClient) {
        tracing::debug!(%reason, pending = st.pending.len(), "connection ended");
    }
    let reason = Arc::new(reason);
    // The reason first, so a handle whose op is refused from now on finds it.
    closed.send_replace(Some(reason.clone()));
    ops.close();
    let lost = || RequestError::ConnectionLost(reason.clone());
    // What was read goes out before the news.
    st.hand_over();
    for p in st.pending.drain(..) {
        match p.reply {
            ReplyTo::One(tx) => {
                let _ = tx.send(Err(lost()));
            }
            ReplyTo::Many(tx) => {
                let _ = tx.send(Err(lost()));
            }
            ReplyTo::Own => {}
        }
    }
    for (_, sink) in st.sinks.drain() {
        let _ = sink
            .tx
            .send(Err(ConsumerError::ConnectionLost(reason.clone())));
    }
    while let Ok(op) = ops.try_recv() {
        match op {
            Op::Command { reply, .. } | Op::Consume { reply, .. } => {
                let _ = reply.send(Err(lost()));
            }
            Op::Many { replies, .. } => {
                let _ = replies.send(Err(lost()));
            }
        }
    }
}

impl State {
    /// The next time the timer must fire: the oldest command's reply timeout,
    /// or the next heartbeat.
    fn next_wake(&self, settings: &Settings, last_write: Instant) -> Option<Instant> {
        let timeout = self
            .pending
            .front()
            .map(|p| p.sent_at + settings.reply_timeout);
        let heartbeat = settings
            .heartbeat
            .filter(|_| !self.quitting)
            .map(|every| last_write + every);
        match (timeout, heartbeat) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes the ops already waiting, up to the write backlog (none once
    /// `quit` is written); whether it took any.
    fn take_ready(
        &mut self,
        ops: &mut mpsc::UnboundedReceiver<Op>,
        out: &mut ConnectionWriter,
        now: Instant,
    ) -> bool {
        let mut took = false;
        while !self.quitting && out.queued_bytes() < WRITE_BACKLOG_BYTES {
            match ops.try_recv() {
                Ok(op) => {
                    self.take(op, out, now);
                    took = true;
                }
                Err(_) => break,
            }
        }
        took
    }

    /// Queues an op's lines for writing and records what they wait for.
    fn take(&mut self, op: Op, out: &mut ConnectionWriter, now: Instant) {
        match op {
            Op::Command {
                line,
                expect,
                reply,
            } => {
                if matches!(expect, Expect::Quit) {
                    self.quitting = true;
                }
                out.queue_line(&line);
                self.pending.push_back(Pending {
                    expect,
                    reply: ReplyTo::One(reply),
                    sent_at: now,
                });
            }
            Op::Many {
                lines,
                expect,
                replies,
            } => {
                let empty = match &expect {
                    Expect::Publishes(ids) => ids.is_empty(),
                    Expect::Lines(n) => *n == 0,
                    _ => false,
                };
                if empty || self.quitting {
                    return;
                }
                self.spares.give(out.queue_owned(lines));
                self.pending.push_back(Pending {
                    expect,
                    reply: ReplyTo::Many(replies),
                    sent_at: now,
                });
            }
            Op::Consume {
                queue,
                prefetch,
                sink,
                reply,
            } => {
                if self.sinks.get(&queue).is_some_and(|s| !s.tx.is_closed()) {
                    let _ = reply.send(Err(RequestError::AlreadyConsuming(queue)));
                    return;
                }
                out.queue_line(&format!("consume {queue} {prefetch}"));
                self.sinks.insert(queue.clone(), Sink::new(sink));
                self.orphan_logged.remove(&queue);
                self.pending.push_back(Pending {
                    expect: Expect::Consume(queue),
                    reply: ReplyTo::One(reply),
                    sent_at: now,
                });
            }
        }
    }

    /// Queues one of the task's own commands.
    fn push_own(&mut self, line: &str, expect: Expect, out: &mut ConnectionWriter, now: Instant) {
        if matches!(expect, Expect::Quit) {
            self.quitting = true;
        }
        out.queue_line(line);
        self.pending.push_back(Pending {
            expect,
            reply: ReplyTo::Own,
            sent_at: now,
        });
    }

    /// Routes one line read from the broker.
    fn on_line(&mut self, line: String) -> Result<(), Disconnected> {
        if line.starts_with("Message: ") {
            return self.on_delivery(line);
        }
        if let Some(queue) = deleted_queue(&line) {
            if self.sinks.contains_key(queue) {
                // What came before it first.
                self.hand_over();
                if let Some(sink) = self.sinks.remove(queue) {
                    // The consume is over; the connection goes on.
                    let _ = sink
                        .tx
                        .send(Err(ConsumerError::QueueDeleted(queue.to_owned())));
                }
                return Ok(());
            }
        }
        let Some(head) = self.pending.front_mut() else {
            return self.on_unsolicited(line);
        };
        // Entries of many replies answer one line at a time.
        let done = match &mut head.expect {
            Expect::Publishes(ids) => {
                let Some(id) = ids.pop_front() else {
                    return Err(Disconnected::Protocol("an empty publish pipeline".into()));
                };
                check_publish_reply(&line, id)?;
                ids.is_empty()
            }
            Expect::Lines(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            _ => true,
        };
        if !done {
            if let ReplyTo::Many(tx) = &head.reply {
                self.held.hold(tx, line);
            }
            return Ok(());
        }
        let Some(p) = self.pending.pop_front() else {
            return self.on_unsolicited(line);
        };
        match &p.expect {
            Expect::Publish(id) => check_publish_reply(&line, id)?,
            Expect::Consume(queue) => {
                let ok = matches!(Reply::parse(&line), Reply::Ok(rest)
                    if rest.strip_prefix("consume ") == Some(queue.as_str()));
                if !ok {
                    self.sinks.remove(queue);
                }
            }
            Expect::Quit => self.bye = line == "OK bye",
            Expect::Line | Expect::Heartbeat | Expect::Publishes(_) | Expect::Lines(_) => {}
        }
        // A caller that stopped waiting (its future was dropped) loses only
        // its own reply.
        match p.reply {
            ReplyTo::One(tx) => {
                // A caller who sees this reply finds every delivery and reply
                // read before it.
                self.hand_over();
                let _ = tx.send(Ok(line));
            }
            ReplyTo::Many(tx) => self.held.hold(&tx, line),
            ReplyTo::Own => {}
        }
        Ok(())
    }

    /// A line with no command waiting: no reply, so a push this library does
    /// not know. Every consumer gets it; the connection goes on.
    fn on_unsolicited(&mut self, line: String) -> Result<(), Disconnected> {
        let line = shorten(&line);
        tracing::warn!(line = %line, "the broker sent a line with no command waiting");
        self.hand_over();
        for sink in self.sinks.values() {
            let _ = sink.tx.send(Err(ConsumerError::Unsolicited(line.clone())));
        }
        Ok(())
    }

    /// Holds a `Message:` line for its queue's consumer, to go with the rest
    /// of the read ([`State::hand_over`]).
    fn on_delivery(&mut self, line: String) -> Result<(), Disconnected> {
        let len = line.len();
        let Some(raw) = RawDelivery::parse(line) else {
            // Never the line itself: it may carry a body.
            return Err(Disconnected::Protocol(format!(
                "a malformed delivery line ({len} bytes)"
            )));
        };
        // One consumer per connection is the usual case: no hashing then.
        let sink = if self.sinks.len() == 1 {
            self.sinks
                .iter_mut()
                .next()
                .filter(|(queue, _)| queue.as_str() == raw.queue())
                .map(|(_, sink)| sink)
        } else {
            self.sinks.get_mut(raw.queue())
        };
        match sink {
            Some(sink) if !sink.tx.is_closed() => {
                sink.held.push(raw);
                self.holding = true;
            }
            _ => self.orphaned(&raw),
        }
        Ok(())
    }

    /// Hands every consumer the deliveries held for it, one batch each, then
    /// the replies held (see [`HeldReplies`]).
    fn hand_over(&mut self) {
        if std::mem::take(&mut self.holding) {
            self.hand_over_deliveries();
        }
        self.held.hand_over();
    }

    /// Hands every consumer the deliveries held for it, one batch each.
    fn hand_over_deliveries(&mut self) {
        let mut lost = Vec::new();
        for sink in self.sinks.values_mut() {
            if sink.held.is_empty() {
                continue;
            }
            // The next read likely brings as many: room for them at once.
            let room = sink.held.len();
            let batch = std::mem::replace(&mut sink.held, Vec::with_capacity(room));
            // The consumer was dropped: the deliveries come back.
            if let Err(mpsc::error::SendError(Ok(mut batch))) = sink.tx.send(Ok(batch)) {
                lost.extend(batch.pop());
            }
        }
        for raw in lost {
            self.orphaned(&raw);
        }
    }

    /// A delivery for a queue with no live consumer here: logged once a queue.
    fn orphaned(&mut self, raw: &RawDelivery) {
        if self.orphan_logged.insert(raw.queue().to_owned()) {
            tracing::warn!(
                queue = raw.queue(),
                message_id = raw.id(),
                "a delivery came for a queue with no live consumer on this connection \
                 (ciphermq/1 has no way to cancel a consume); it stays unacknowledged \
                 until this connection closes or the broker's ack_wait_secs passes"
            );
        }
    }
}

/// A publish's `ACK`/`NACK` must name the oldest publish in flight.
fn check_publish_reply(line: &str, id: &str) -> Result<(), Disconnected> {
    match Reply::parse(line) {
        Reply::Ack(got)
        | Reply::Nack {
            message_id: got, ..
        } if got != id => Err(Disconnected::Protocol(format!(
            "{} while {id} was the oldest publish in flight",
            shorten(line)
        ))),
        _ => Ok(()),
    }
}

/// The queue of a pushed `Error: queue <q> deleted` (the broker's word to the
/// consumers of a queue that was deleted).
pub(crate) fn deleted_queue(line: &str) -> Option<&str> {
    let queue = line
        .strip_prefix("Error: queue ")?
        .strip_suffix(" deleted")?;
    ciphermq_proto::is_valid_name(queue).then_some(queue)
}

/// At most 200 characters of a reply line, for errors.
fn shorten(line: &str) -> String {
    if line.len() <= 200 {
        return line.to_owned();
    }
    let mut end = 200;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &line[..end], line.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> (DeliverySink, mpsc::UnboundedReceiver<DeliveryBatch>) {
        mpsc::unbounded_channel()
    }

    fn pending(st: &mut State, expect: Expect) -> oneshot::Receiver<ReplyResult> {
        let (tx, rx) = oneshot::channel();
        st.pending.push_back(Pending {
            expect,
            reply: ReplyTo::One(tx),
            sent_at: Instant::now(),
        });
        rx
    }

    #[test]
    fn deleted_queue_lines_are_recognised() {
        assert_eq!(deleted_queue("Error: queue q1 deleted"), Some("q1"));
        assert_eq!(
            deleted_queue("Error: queue receiver_1_queue.dlq deleted"),
            Some("receiver_1_queue.dlq")
        );
        assert_eq!(deleted_queue("Error: queue  deleted"), None);
        assert_eq!(deleted_queue("Error: queue a b deleted"), None);
        assert_eq!(deleted_queue("Error: unknown queue q1"), None);
        assert_eq!(deleted_queue("Error: queue q1 deleted!"), None);
    }

    #[test]
    fn a_delivery_line_is_kept_whole_and_read_by_ranges() {
        let raw = RawDelivery::parse("Message: m-1 q.a 3 {\"x\": \"a b\"}".to_owned()).unwrap();
        assert_eq!(
            (raw.id(), raw.queue(), raw.count, raw.body()),
            ("m-1", "q.a", 3, "{\"x\": \"a b\"}")
        );
        assert!(RawDelivery::parse("Message: m-1 q.a".to_owned()).is_none());
        assert!(RawDelivery::parse("Message: m-1 q.a x {}".to_owned()).is_none());
    }

    #[tokio::test]
    async fn a_pushed_queue_deletion_ends_that_consumer_and_answers_no_command() {
        let mut st = State::default();
        let (tx, mut rx) = sink();
        st.sinks.insert("q1".into(), Sink::new(tx));
        let (other, mut other_rx) = sink();
        st.sinks.insert("q2".into(), Sink::new(other));
        let mut reply = pending(&mut st, Expect::Line);
        st.on_line("Error: queue q1 deleted".into()).unwrap();
        // Not the pending command's reply.
        assert!(reply.try_recv().is_err());
        assert_eq!(st.pending.len(), 1);
        match rx.recv().await {
            Some(Err(ConsumerError::QueueDeleted(q))) => assert_eq!(q, "q1"),
            other => panic!("expected QueueDeleted, got {other:?}"),
        }
        // The stream ends; the other consumer goes on.
        assert!(rx.recv().await.is_none());
        st.on_line("Message: m1 q2 1 {}".into()).unwrap();
        st.hand_over();
        assert!(matches!(other_rx.recv().await, Some(Ok(b)) if b.len() == 1 && b[0].id() == "m1"));
        // The same words for a queue not consumed here are a reply.
        st.on_line("Error: queue q9 deleted".into()).unwrap();
        assert_eq!(reply.await.unwrap().unwrap(), "Error: queue q9 deleted");
    }

    #[tokio::test]
    async fn a_line_with_no_command_waiting_goes_to_every_consumer() {
        let mut st = State::default();
        let (tx, mut rx) = sink();
        st.sinks.insert("q1".into(), Sink::new(tx));
        st.on_line("Error: the broker is restarting".into())
            .unwrap();
        match rx.recv().await {
            Some(Err(ConsumerError::Unsolicited(line))) => {
                assert_eq!(line, "Error: the broker is restarting")
            }
            other => panic!("expected Unsolicited, got {other:?}"),
        }
        // The stream goes on.
        st.on_line("Message: m1 q1 1 {}".into()).unwrap();
        st.hand_over();
        assert!(matches!(rx.recv().await, Some(Ok(b)) if b.len() == 1 && b[0].id() == "m1"));
        // With no consumer it is only logged.
        let mut st = State::default();
        st.on_line("OK what".into()).unwrap();
    }

    #[tokio::test]
    async fn many_lines_share_one_entry_and_publish_replies_must_match_in_order() {
        let mut st = State::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        st.pending.push_back(Pending {
            expect: Expect::Publishes(["a", "b"].into_iter().collect()),
            reply: ReplyTo::Many(tx.clone()),
            sent_at: Instant::now(),
        });
        st.pending.push_back(Pending {
            expect: Expect::Lines(2),
            reply: ReplyTo::Many(tx),
            sent_at: Instant::now(),
        });
        st.on_line("ACK a".into()).unwrap();
        assert_eq!(st.pending.len(), 2);
        st.on_line("NACK b queue_full".into()).unwrap();
        assert_eq!(st.pending.len(), 1);
        st.on_line("OK ack_batch q 2".into()).unwrap();
        st.on_line("ACK_CONFIRMED x".into()).unwrap();
        assert!(st.pending.is_empty());
        st.hand_over();
        let mut got = Vec::new();
        while let Ok(r) = rx.try_recv() {
            got.extend(r.unwrap());
        }
        assert_eq!(
            got,
            [
                "ACK a",
                "NACK b queue_full",
                "OK ack_batch q 2",
                "ACK_CONFIRMED x"
            ]
        );

        let (tx, _rx) = mpsc::unbounded_channel();
        st.pending.push_back(Pending {
            expect: Expect::Publishes(["a"].into_iter().collect()),
            reply: ReplyTo::Many(tx),
            sent_at: Instant::now(),
        });
        assert!(matches!(
            st.on_line("ACK z".into()),
            Err(Disconnected::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn the_deliveries_of_one_read_go_as_one_batch_before_any_later_reply() {
        let mut st = State::default();
        let (tx, mut rx) = sink();
        st.sinks.insert("q1".into(), Sink::new(tx));
        let mut reply = pending(&mut st, Expect::Line);
        st.on_line("Message: m1 q1 1 {}".into()).unwrap();
        st.on_line("Message: m2 q1 2 {}".into()).unwrap();
        // Held for the rest of the read.
        assert!(rx.try_recv().is_err());
        // A reply hands them over first.
        st.on_line("OK purge_queue q9 0".into()).unwrap();
        assert_eq!(reply.try_recv().unwrap().unwrap(), "OK purge_queue q9 0");
        match rx.try_recv() {
            Ok(Ok(batch)) => {
                let ids: Vec<(&str, u32)> = batch.iter().map(|d| (d.id(), d.count)).collect();
                assert_eq!(ids, [("m1", 1), ("m2", 2)]);
            }
            other => panic!("expected one batch, got {other:?}"),
        }
        st.on_line("Message: m3 q1 1 {}".into()).unwrap();
        st.hand_over();
        assert!(matches!(rx.try_recv(), Ok(Ok(b)) if b.len() == 1 && b[0].id() == "m3"));
        // Nothing is sent for a read without deliveries.
        st.hand_over();
        assert!(rx.try_recv().is_err());
    }
}
