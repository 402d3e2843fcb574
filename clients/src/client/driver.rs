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
//! Checks that keep the two sides in step: a publish's `ACK`/`NACK` must name the
//! publish at the head of the FIFO; a malformed delivery, or a head left
//! unanswered past the reply timeout ends the
//! connection ([`Disconnected`]), and every waiting command and consumer gets the
//! reason. Writes go through the `line_writer` task, so the reader never stops
//! to write.
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
use crate::connection::Connection;
use crate::line_writer;

/// What a command gets back: its reply line, or why none came.
pub(crate) type ReplyResult = Result<String, RequestError>;

/// Where a queue's deliveries go.
pub(crate) type DeliverySink = mpsc::UnboundedSender<Result<RawDelivery, ConsumerError>>;

/// Where the replies of an [`Op::Many`] go, in order.
pub(crate) type ManySink = mpsc::UnboundedSender<ReplyResult>;

/// A `Message:` line, kept whole: its fields are ranges of it (no copy of the
/// body per delivery).
#[derive(Debug)]
pub(crate) struct RawDelivery {
    /// `Message: <id> <queue> <count> <body>`.
    line: String,
    /// Where the id is in `line`.
    id: (usize, usize),
    /// Where the queue is in `line`.
    queue: (usize, usize),
    /// Where the body starts in `line`.
    body: usize,
    /// 1 on first delivery, one more on each redelivery.
    pub(crate) count: u32,
}

impl RawDelivery {
    /// Parses a `Message:` line; `None` if it is malformed.
    pub(crate) fn parse(line: String) -> Option<RawDelivery> {
        let d = ciphermq_proto::Delivery::parse(&line)?;
        let base = line.as_ptr() as usize;
        let at = |s: &str| s.as_ptr() as usize - base;
        let id = (at(d.message_id), at(d.message_id) + d.message_id.len());
        let queue = (at(d.queue), at(d.queue) + d.queue.len());
        let body = at(d.body);
        let count = d.delivery_count;
        Some(RawDelivery {
            line,
            id,
            queue,
            body,
            count,
        })
    }

    /// The message id.
    pub(crate) fn id(&self) -> &str {
        &self.line[self.id.0..self.id.1]
    }

    /// The queue it comes from.
    pub(crate) fn queue(&self) -> &str {
        &self.line[self.queue.0..self.queue.1]
    }

    /// The published JSON, unchanged.
    pub(crate) fn body(&self) -> &str {
        &self.line[self.body..]
    }
}

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
    Publishes(VecDeque<Box<str>>),
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
        /// The lines.
        lines: String,
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
        lines: String,
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
    tokio::spawn(run(conn, ops_rx, closed_tx, settings));
    Handle {
        ops: ops_tx,
        closed: closed_rx,
    }
}

/// The task's state besides the socket.
#[derive(Default)]
struct State {
    /// Commands written, oldest first.
    pending: VecDeque<Pending>,
    /// Live consumers by queue.
    sinks: HashMap<String, DeliverySink>,
    /// Queues whose orphaned deliveries were already logged.
    orphan_logged: HashSet<String>,
    /// `quit` was written: no more commands.
    quitting: bool,
    /// `OK bye` came.
    bye: bool,
}

/// The task: reads and routes lines, writes commands, keeps time.
async fn run(
    conn: Connection,
    mut ops: mpsc::UnboundedReceiver<Op>,
    closed: watch::Sender<Option<Arc<Disconnected>>>,
    settings: Settings,
) {
    let (mut reader, writer) = conn.into_split();
    let (lines, mut writer_task) = line_writer::spawn(writer);
    let mut st = State::default();
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
        tokio::select! {
            biased;
            line = reader.read_line() => match line {
                Ok(Some(line)) => {
                    if let Err(reason) = st.on_line(line) {
                        break reason;
                    }
                    // The lines already read (a burst of replies or
                    // deliveries) are handled without going back to the select.
                    let mut failed = None;
                    while !st.bye {
                        match reader.buffered_line() {
                            Some(Ok(line)) => {
                                if let Err(reason) = st.on_line(line) {
                                    failed = Some(reason);
                                    break;
                                }
                            }
                            Some(Err(e)) => {
                                failed = Some(Disconnected::Transport(e));
                                break;
                            }
                            None => break,
                        }
                    }
                    if let Some(reason) = failed {
                        break reason;
                    }
                    if st.bye {
                        break Disconnected::ClosedByClient;
                    }
                }
                Ok(None) if st.quitting => break Disconnected::ClosedByClient,
                Ok(None) => break Disconnected::ClosedByBroker,
                Err(e) => break Disconnected::Transport(e),
            },
            result = writer_task.handle() => break match result {
                Ok(Err(e)) => Disconnected::Transport(e),
                _ => Disconnected::Protocol("the connection's writer stopped".to_owned()),
            },
            op = ops.recv(), if !st.quitting => {
                let now = Instant::now();
                let mut batch = String::new();
                match op {
                    Some(op) => {
                        st.take(op, &mut batch, now);
                        while !st.quitting {
                            match ops.try_recv() {
                                Ok(op) => st.take(op, &mut batch, now),
                                Err(_) => break,
                            }
                        }
                    }
                    // Every handle is gone: say goodbye, wait for `OK bye`.
                    None => st.push_own("quit", Expect::Quit, &mut batch, now),
                }
                if !batch.is_empty() {
                    last_write = now;
                    // A writer that stopped is noticed by its branch above.
                    let _ = lines.send(batch);
                }
            },
            () = &mut timer => {
                let now = Instant::now();
                if st.pending.front().is_some_and(|p| now >= p.sent_at + settings.reply_timeout) {
                    break Disconnected::ReplyTimeout(settings.reply_timeout);
                }
                if let Some(every) = settings.heartbeat {
                    if !st.quitting && now >= last_write + every {
                        let mut batch = String::new();
                        st.push_own("heartbeat", Expect::Heartbeat, &mut batch, now);
                        last_write = now;
                        let _ = lines.send(batch);
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
        let _ = sink.send(Err(ConsumerError::ConnectionLost(reason.clone())));
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

    /// Appends an op's line to `batch` and records what it waits for.
    fn take(&mut self, op: Op, batch: &mut String, now: Instant) {
        match op {
            Op::Command {
                line,
                expect,
                reply,
            } => {
                if matches!(expect, Expect::Quit) {
                    self.quitting = true;
                }
                batch.push_str(&line);
                batch.push('\n');
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
                if batch.is_empty() {
                    // The first lines of a write move in; no copy.
                    *batch = lines;
                } else {
                    batch.push_str(&lines);
                }
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
                if self.sinks.get(&queue).is_some_and(|s| !s.is_closed()) {
                    let _ = reply.send(Err(RequestError::AlreadyConsuming(queue)));
                    return;
                }
                batch.push_str("consume ");
                batch.push_str(&queue);
                batch.push(' ');
                batch.push_str(&prefetch.to_string());
                batch.push('\n');
                self.sinks.insert(queue.clone(), sink);
                self.orphan_logged.remove(&queue);
                self.pending.push_back(Pending {
                    expect: Expect::Consume(queue),
                    reply: ReplyTo::One(reply),
                    sent_at: now,
                });
            }
        }
    }

    /// Appends one of the task's own commands.
    fn push_own(&mut self, line: &str, expect: Expect, batch: &mut String, now: Instant) {
        if matches!(expect, Expect::Quit) {
            self.quitting = true;
        }
        batch.push_str(line);
        batch.push('\n');
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
            if let Some(sink) = self.sinks.remove(queue) {
                // The consume is over; the connection goes on.
                let _ = sink.send(Err(ConsumerError::QueueDeleted(queue.to_owned())));
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
                check_publish_reply(&line, &id)?;
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
                let _ = tx.send(Ok(line));
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
                let _ = tx.send(Ok(line));
            }
            ReplyTo::Many(tx) => {
                let _ = tx.send(Ok(line));
            }
            ReplyTo::Own => {}
        }
        Ok(())
    }

    /// A line with no command waiting: no reply, so a push this library does
    /// not know. Every consumer gets it; the connection goes on.
    fn on_unsolicited(&mut self, line: String) -> Result<(), Disconnected> {
        let line = shorten(&line);
        tracing::warn!(line = %line, "the broker sent a line with no command waiting");
        for sink in self.sinks.values() {
            let _ = sink.send(Err(ConsumerError::Unsolicited(line.clone())));
        }
        Ok(())
    }

    /// Hands a `Message:` line to its queue's consumer.
    fn on_delivery(&mut self, line: String) -> Result<(), Disconnected> {
        let len = line.len();
        let Some(raw) = RawDelivery::parse(line) else {
            // Never the line itself: it may carry a body.
            return Err(Disconnected::Protocol(format!(
                "a malformed delivery line ({len} bytes)"
            )));
        };
        let raw = match self.sinks.get(raw.queue()) {
            Some(sink) => match sink.send(Ok(raw)) {
                Ok(()) => return Ok(()),
                // The consumer was dropped: the delivery comes back.
                Err(mpsc::error::SendError(Ok(raw))) => raw,
                Err(_) => return Ok(()),
            },
            None => raw,
        };
        if self.orphan_logged.insert(raw.queue().to_owned()) {
            tracing::warn!(
                queue = raw.queue(),
                message_id = raw.id(),
                "a delivery came for a queue with no live consumer on this connection \
                 (ciphermq/1 has no way to cancel a consume); it stays unacknowledged \
                 until this connection closes or the broker's ack_wait_secs passes"
            );
        }
        Ok(())
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

    fn sink() -> (
        DeliverySink,
        mpsc::UnboundedReceiver<Result<RawDelivery, ConsumerError>>,
    ) {
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
        st.sinks.insert("q1".into(), tx);
        let (other, mut other_rx) = sink();
        st.sinks.insert("q2".into(), other);
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
        assert!(matches!(other_rx.recv().await, Some(Ok(d)) if d.id() == "m1"));
        // The same words for a queue not consumed here are a reply.
        st.on_line("Error: queue q9 deleted".into()).unwrap();
        assert_eq!(reply.await.unwrap().unwrap(), "Error: queue q9 deleted");
    }

    #[tokio::test]
    async fn a_line_with_no_command_waiting_goes_to_every_consumer() {
        let mut st = State::default();
        let (tx, mut rx) = sink();
        st.sinks.insert("q1".into(), tx);
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
        assert!(matches!(rx.recv().await, Some(Ok(d)) if d.id() == "m1"));
        // With no consumer it is only logged.
        let mut st = State::default();
        st.on_line("OK what".into()).unwrap();
    }

    #[tokio::test]
    async fn many_lines_share_one_entry_and_publish_replies_must_match_in_order() {
        let mut st = State::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        st.pending.push_back(Pending {
            expect: Expect::Publishes(["a".into(), "b".into()].into()),
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
        let mut got = Vec::new();
        while let Ok(r) = rx.try_recv() {
            got.push(r.unwrap());
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
            expect: Expect::Publishes(["a".into()].into()),
            reply: ReplyTo::Many(tx),
            sent_at: Instant::now(),
        });
        assert!(matches!(
            st.on_line("ACK z".into()),
            Err(Disconnected::Protocol(_))
        ));
    }
}
