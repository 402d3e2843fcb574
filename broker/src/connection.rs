//! One client connection on the shard that owns its CN.
//!
//! The connection is a single hand-written future: each time it is polled it
//! applies shard events (completions, deliveries), reads and executes as many
//! pipelined commands as its budget and backpressure allow, renders the replies
//! that are ready, and writes them out. Nothing blocks and no `RefCell`
//! borrow outlives a synchronous step. Command semantics live in
//! [`crate::commands`].

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ciphermq_shard::{ConnEvent, ConnRef, DeliveryTracker, Mailbox};
use glommio::net::TcpStream;
use glommio::timer::Timer;

use crate::acl::Role;
use crate::context::ShardLocal;
use crate::line_buffer::{Line, LineBuffer};
use crate::policy::Policy;
use crate::rate_limit::ConnectionSlot;
use crate::replies::ReplyQueue;
use crate::tls_session::TlsSession;

/// Commands executed per poll before yielding to other connections.
const LINE_BUDGET: usize = 2048;
/// Commands between two checks whether glommio wants the shard back (a
/// finished commit waiting to release its ACKs, see committer.rs).
const PREEMPT_CHECK_EVERY: usize = 64;
/// Rendered replies staged per encryption call.
const RENDER_CHUNK: usize = 128 * 1024;
/// Unsent ciphertext above which the connection stops executing commands.
const OUTPUT_HIGH_WATER: usize = 1024 * 1024;
/// Plaintext pulled from rustls per step.
const PLAINTEXT_CHUNK: usize = 64 * 1024;

/// Who is on the other end, from the certificate.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The certificate's Subject CN: the client id.
    pub cn: Arc<str>,
    /// Its role under the ACL of `policy`.
    pub role: Role,
    /// Peer address.
    pub peer: SocketAddr,
    /// The policy snapshot `role` was decided under. The connection starts
    /// with this one, not with whatever is current when it is adopted: a
    /// reload between the handshake and the hand-off then shows up as a
    /// version change, and the role is judged again.
    pub policy: Arc<Policy>,
}

/// A connection's state between polls.
pub struct Connection {
    pub(crate) local: Rc<ShardLocal>,
    pub(crate) stream: TcpStream,
    pub(crate) tls: TlsSession,
    pub(crate) identity: Identity,
    pub(crate) conn: ConnRef,
    pub(crate) mailbox: Rc<Mailbox>,
    pub(crate) lines: LineBuffer,
    pub(crate) replies: ReplyQueue,
    pub(crate) tracker: DeliveryTracker,
    pub(crate) events: VecDeque<ConnEvent>,
    /// `quit` received: execute nothing more, close once replies are out.
    pub(crate) closing: bool,
    /// Ever consumed or fetched: its close must requeue on every shard.
    pub(crate) consumed: bool,
    pub(crate) last_activity: Instant,
    /// The ACL and rate limits this connection applies (refreshed on reload).
    pub(crate) policy: Arc<Policy>,
    timer: Option<Timer>,
    _slot: Option<ConnectionSlot>,
    /// Replies decided off the shard (key registrations, saved topology
    /// changes), with their slots.
    pub(crate) pending_replies: Vec<PendingReply>,
}

/// A reply line another thread is deciding.
pub(crate) struct PendingReply {
    /// Its reply slot.
    pub(crate) seq: u64,
    /// Resolves to the line.
    pub(crate) line: Pin<Box<dyn Future<Output = String>>>,
}

/// Why a connection ended, for the log.
#[derive(Debug)]
enum End {
    Clean,
    PeerClosed,
    Timeout,
    Shutdown,
    RoleRevoked,
    Io(String),
    Tls(String),
}

impl Connection {
    /// Registers a connection with its shard; call [`Connection::run`] next.
    pub fn new(
        local: Rc<ShardLocal>,
        stream: TcpStream,
        tls: TlsSession,
        identity: Identity,
        slot: Option<ConnectionSlot>,
    ) -> Connection {
        let (conn, mailbox) = local.shard.borrow_mut().register_conn();
        let settings = &local.shared.settings;
        let lines = LineBuffer::new(settings.max_line_bytes);
        let timeout = Connection::timeout_for(&local, identity.role);
        let policy = identity.policy.clone();
        Connection {
            lines,
            local,
            stream,
            tls,
            identity,
            conn,
            mailbox,
            replies: ReplyQueue::default(),
            tracker: DeliveryTracker::default(),
            events: VecDeque::new(),
            closing: false,
            consumed: false,
            last_activity: Instant::now(),
            policy,
            timer: timeout.map(Timer::new),
            _slot: slot,
            pending_replies: Vec::new(),
        }
    }

    fn timeout_for(local: &ShardLocal, role: Role) -> Option<Duration> {
        let s = &local.shared.settings;
        let heartbeat = if role == Role::Receiver {
            s.heartbeat_timeout
        } else {
            None
        };
        match (s.idle_timeout, heartbeat) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Greets the client and serves it until it quits, fails or times out.
    pub async fn run(mut self) {
        let greeting = format!(
            "HELLO {} {} {}",
            ciphermq_proto::PROTOCOL,
            self.identity.cn,
            self.identity.role
        );
        self.replies.line(greeting);
        let end = std::future::poll_fn(|cx| self.poll_run(cx)).await;
        let (cn, peer) = (&self.identity.cn, self.identity.peer);
        match &end {
            End::Clean | End::PeerClosed => tracing::debug!(%cn, %peer, "connection closed"),
            End::Timeout => {
                tracing::info!(%cn, %peer, "connection closed: idle or heartbeat timeout")
            }
            End::Shutdown => tracing::debug!(%cn, %peer, "connection closed: broker shutting down"),
            End::RoleRevoked => {
                tracing::warn!(%cn, %peer, "connection closed: the reloaded ACL changed its role")
            }
            End::Io(e) => tracing::info!(%cn, %peer, error = %e, "connection closed: I/O error"),
            End::Tls(e) => tracing::info!(%cn, %peer, error = %e, "connection closed: TLS error"),
        }
        if !matches!(end, End::Io(_) | End::PeerClosed) {
            self.tls.tls.send_close_notify();
            let stream = &mut self.stream;
            let tls = &mut self.tls;
            let flush = std::future::poll_fn(|cx| tls.poll_flush(stream, cx));
            let _ = glommio::timer::timeout(Duration::from_secs(1), async {
                flush.await.map_err(glommio::GlommioError::from)
            })
            .await;
        }
        self.close();
    }

    /// Forgets the connection; every shard it consumed from requeues what it
    /// owed (in queue order) and drops its consumers.
    fn close(&mut self) {
        let conn = self.conn;
        let consumed = self.consumed;
        self.local
            .with_shard(|shard| shard.unregister_conn(conn, consumed));
    }

    /// Fills the reply slots whose off-shard work has finished.
    fn poll_pending_replies(&mut self, cx: &mut Context<'_>) -> bool {
        let before = self.pending_replies.len();
        let replies = &mut self.replies;
        self.pending_replies
            .retain_mut(|pending| match pending.line.as_mut().poll(cx) {
                Poll::Ready(line) => {
                    replies.fill(pending.seq, line);
                    false
                }
                Poll::Pending => true,
            });
        self.pending_replies.len() != before
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = Connection::timeout_for(&self.local, self.identity.role) else {
            return false;
        };
        let Some(timer) = self.timer.as_mut() else {
            return false;
        };
        if Pin::new(&mut *timer).poll(cx).is_pending() {
            return false;
        }
        let idle = self.last_activity.elapsed();
        if idle >= limit {
            return true;
        }
        timer.reset(limit - idle);
        // Register the re-armed timer.
        let _ = Pin::new(timer).poll(cx);
        false
    }

    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<End> {
        self.mailbox.register(cx.waker());
        let max_pending = self.local.shared.settings.max_pending_replies;
        let mut budget = LINE_BUDGET;
        // Output has its own budget: a fast reader of large fetches must not
        // keep the shard rendering for it alone.
        let mut render_budget = self.local.shared.settings.max_reply_bytes_per_turn;
        if self.local.shared.policy.version() != self.policy.version {
            self.policy = self.local.shared.policy.current();
            if self.policy.acl.role_of(&self.identity.cn) != self.identity.role {
                return Poll::Ready(End::RoleRevoked);
            }
        }
        loop {
            let mut progress = self.apply_events();
            progress |= self.poll_pending_replies(cx);
            if self.mailbox.is_closed() && !self.closing {
                // Shutdown: execute nothing more, but answer what was accepted.
                self.closing = true;
                progress = true;
            }

            // Input: execute buffered lines, then refill from rustls and the socket.
            // The line buffer is taken out so lines can be executed in place.
            let mut lines = std::mem::replace(&mut self.lines, LineBuffer::new(0));
            let before = budget;
            let input = self.pump_input(&mut lines, cx, &mut budget, max_pending);
            self.lines = lines;
            // Only whole lines count as activity (one clock read per batch):
            // a client dribbling bytes of a line that never ends is idle.
            if budget < before {
                self.last_activity = Instant::now();
            }
            match input {
                Ok(moved) => progress |= moved,
                Err(end) => return Poll::Ready(end),
            }

            // Output.
            match self.poll_write(cx, &mut render_budget) {
                Ok(wrote) => progress |= wrote,
                Err(e) => return Poll::Ready(End::Io(e)),
            }

            let drained = self.replies.is_empty()
                && self.tls.outgoing_len() == 0
                && !self.tls.tls.wants_write();
            if drained && self.closing {
                return Poll::Ready(if self.mailbox.is_closed() {
                    End::Shutdown
                } else {
                    End::Clean
                });
            }
            if drained && self.tls.eof && !self.tls.has_incoming() && budget > 0 {
                // Whatever is left is a partial line the peer never finished.
                return Poll::Ready(End::PeerClosed);
            }
            if self.poll_timer(cx) {
                return Poll::Ready(End::Timeout);
            }
            if budget == 0 || render_budget == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if !progress {
                // Parking idle: keep no large buffers while waiting.
                self.lines.release_idle();
                self.tls.release_idle();
                return Poll::Pending;
            }
        }
    }

    /// Executes buffered lines and refills the buffer from rustls and the
    /// socket, within the budget and the backpressure limits.
    fn pump_input(
        &mut self,
        lines: &mut LineBuffer,
        cx: &mut Context<'_>,
        budget: &mut usize,
        max_pending: usize,
    ) -> Result<bool, End> {
        let mut progress = false;
        // A command decided off the shard (a declare being saved, a key
        // being stored) holds back the next ones: a pipelined publish after
        // `bind` must see the binding.
        while !self.closing
            && *budget > 0
            && self.pending_replies.is_empty()
            && self.replies.len() < max_pending
            && self.tls.outgoing_len() < OUTPUT_HIGH_WATER
        {
            match lines.next_line() {
                Line::Complete(line) => {
                    self.execute(line);
                    *budget -= 1;
                    progress = true;
                    if budget.is_multiple_of(PREEMPT_CHECK_EVERY)
                        && glommio::executor().need_preempt()
                    {
                        // Yield now (the poll ends as if the budget were spent).
                        *budget = 0;
                    }
                }
                Line::TooLong => {
                    self.replies.line("Error: line too long");
                    *budget -= 1;
                    progress = true;
                }
                Line::Incomplete => {
                    if !lines.wants_input() {
                        break;
                    }
                    let spare = lines.spare(self.tls.plaintext_ready().min(PLAINTEXT_CHUNK));
                    let n = self.tls.read_plaintext(spare);
                    lines.commit(n);
                    if n > 0 {
                        progress = true;
                        continue;
                    }
                    if self.tls.has_incoming() {
                        match self.tls.process_incoming() {
                            Ok(true) => {
                                progress = true;
                                continue;
                            }
                            Ok(false) => break,
                            Err(e) => {
                                let _ = self.poll_write(cx, &mut RENDER_CHUNK.clone());
                                return Err(End::Tls(e.to_string()));
                            }
                        }
                    }
                    if self.tls.eof {
                        break;
                    }
                    match self.tls.poll_read_socket(&mut self.stream, cx) {
                        Poll::Ready(Ok(_)) => {
                            progress = true;
                            continue;
                        }
                        Poll::Ready(Err(e)) => return Err(End::Io(e.to_string())),
                        Poll::Pending => break,
                    }
                }
            }
        }
        Ok(progress)
    }

    /// Renders ready replies (at most `render_budget` bytes, which it
    /// spends), encrypts them and writes to the socket. Returns whether
    /// anything moved.
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        render_budget: &mut usize,
    ) -> Result<bool, String> {
        // Input waits while output is above the high-water mark, without
        // registering for the socket; draining below it must count as progress,
        // or nothing would wake the connection to read again.
        let input_blocked = self.tls.outgoing_len() >= OUTPUT_HIGH_WATER;
        let mut progress = false;
        loop {
            // Moves everything rustls encrypted into `outgoing`, then to the socket.
            if let Poll::Ready(Err(e)) = self.tls.poll_flush(&mut self.stream, cx) {
                return Err(e.to_string());
            }
            if input_blocked && self.tls.outgoing_len() < OUTPUT_HIGH_WATER {
                progress = true;
            }
            if self.tls.outgoing_len() >= OUTPUT_HIGH_WATER
                || !self.replies.head_ready()
                || *render_budget == 0
            {
                return Ok(progress);
            }
            // One staging buffer per shard: rendering never spans an await.
            let mut staging = self.local.staging.borrow_mut();
            staging.clear();
            self.replies
                .render(&mut staging, RENDER_CHUNK.min(*render_budget));
            *render_budget = render_budget.saturating_sub(staging.len());
            self.tls
                .write_plaintext(&staging)
                .map_err(|e| e.to_string())?;
            progress = true;
        }
    }

    /// Applies completions and deliveries from the shard.
    fn apply_events(&mut self) -> bool {
        self.mailbox.drain_into(&mut self.events);
        if self.events.is_empty() {
            return false;
        }
        while let Some(event) = self.events.pop_front() {
            match event {
                ConnEvent::Completed { seq, completion } => {
                    if let Some(fetched) = self.replies.complete(seq, completion) {
                        for d in fetched {
                            self.tracker.record(d);
                        }
                    }
                }
                ConnEvent::Delivery(delivery) => {
                    self.tracker.record(&delivery);
                    self.replies.delivery(delivery);
                }
            }
        }
        true
    }
}
