//! The connection task: the one owner of a client's socket.
//!
//! Handles ([`Handle`], inside every `Client`, `Publisher`, `Consumer` and
//! `Delivery`) send it [`Op`]s over a channel. For each, in the order they
//! arrive, the task appends the command line to the next write and pushes a
//! [`Pending`] entry on a FIFO, in the same step, so the FIFO's order is the
//! order of the lines on the wire. The broker answers strictly in command order
//! (DESIGN.md §3), so each reply line pops the FIFO's head and goes to its
//! command's oneshot. `Message:` lines are no reply: they go to the consumer of
//! their queue, whatever is pending.
//!
//! Checks that keep the two sides in step: a publish's `ACK`/`NACK` must name the
//! publish at the head of the FIFO; a reply with nothing pending, a malformed
//! delivery, or a head left unanswered past the reply timeout ends the
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

use crate::client::error::{Disconnected, RequestError};
use crate::connection::Connection;
use crate::line_writer;

/// What a command gets back: its reply line, or why none came.
pub(crate) type ReplyResult = Result<String, RequestError>;

/// Where a queue's deliveries go.
pub(crate) type DeliverySink = mpsc::UnboundedSender<Result<RawDelivery, RequestError>>;

/// A `Message:` line, owned.
#[derive(Debug)]
pub(crate) struct RawDelivery {
    /// The message id.
    pub(crate) id: String,
    /// The queue it comes from.
    pub(crate) queue: String,
    /// 1 on first delivery, one more on each redelivery.
    pub(crate) count: u32,
    /// The published JSON, unchanged.
    pub(crate) body: String,
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
}

/// A command written and not answered yet.
struct Pending {
    /// How to check its reply.
    expect: Expect,
    /// Where the reply goes (`None` for the task's own commands).
    reply: Option<oneshot::Sender<ReplyResult>>,
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
        if let Some(tx) = p.reply {
            let _ = tx.send(Err(lost()));
        }
    }
    for (_, sink) in st.sinks.drain() {
        let _ = sink.send(Err(lost()));
    }
    while let Ok(op) = ops.try_recv() {
        let (Op::Command { reply, .. } | Op::Consume { reply, .. }) = op;
        let _ = reply.send(Err(lost()));
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
                    reply: Some(reply),
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
                    reply: Some(reply),
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
            reply: None,
            sent_at: now,
        });
    }

    /// Routes one line read from the broker.
    fn on_line(&mut self, line: String) -> Result<(), Disconnected> {
        if line.starts_with("Message: ") {
            return self.on_delivery(&line);
        }
        if let Some(queue) = deleted_queue(&line) {
            // Pushed, not a reply: no command is answered so.
            if let Some(sink) = self.sinks.remove(queue) {
                let _ = sink.send(Err(RequestError::QueueDeleted(queue.to_owned())));
            }
            return Ok(());
        }
        let Some(p) = self.pending.pop_front() else {
            return Err(Disconnected::Protocol(format!(
                "a reply with no command waiting: {}",
                shorten(&line)
            )));
        };
        match &p.expect {
            Expect::Publish(id) => match Reply::parse(&line) {
                Reply::Ack(got)
                | Reply::Nack {
                    message_id: got, ..
                } if got != &**id => {
                    return Err(Disconnected::Protocol(format!(
                        "{} while {id} was the oldest publish in flight",
                        shorten(&line)
                    )));
                }
                _ => {}
            },
            Expect::Consume(queue) => {
                let ok = matches!(Reply::parse(&line), Reply::Ok(rest)
                    if rest.strip_prefix("consume ") == Some(queue.as_str()));
                if !ok {
                    self.sinks.remove(queue);
                }
            }
            Expect::Quit => self.bye = line == "OK bye",
            Expect::Line | Expect::Heartbeat => {}
        }
        if let Some(tx) = p.reply {
            // A caller that stopped waiting (its future was dropped) loses
            // only its own reply.
            let _ = tx.send(Ok(line));
        }
        Ok(())
    }

    /// Hands a `Message:` line to its queue's consumer.
    fn on_delivery(&mut self, line: &str) -> Result<(), Disconnected> {
        let Some(d) = ciphermq_proto::Delivery::parse(line) else {
            // Never the line itself: it may carry a body.
            return Err(Disconnected::Protocol(format!(
                "a malformed delivery line ({} bytes)",
                line.len()
            )));
        };
        let raw = RawDelivery {
            id: d.message_id.to_owned(),
            queue: d.queue.to_owned(),
            count: d.delivery_count,
            body: d.body.to_owned(),
        };
        let delivered = match self.sinks.get(d.queue) {
            Some(sink) => sink.send(Ok(raw)).is_ok(),
            None => false,
        };
        if !delivered && self.orphan_logged.insert(d.queue.to_owned()) {
            tracing::warn!(
                queue = d.queue,
                message_id = d.message_id,
                "a delivery came for a queue with no live consumer on this connection \
                 (ciphermq/1 has no way to cancel a consume); it stays unacknowledged \
                 until this connection closes or the broker's ack_wait_secs passes"
            );
        }
        Ok(())
    }
}

/// The queue of a pushed `Error: queue <q> deleted` line (the broker tells
/// a queue's consumers so when it is deleted; no command is answered with
/// it), or `None`.
fn deleted_queue(line: &str) -> Option<&str> {
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
