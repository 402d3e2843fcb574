//! One client connection on the shard that owns its CN.
//!
//! The connection is a single hand-written future: each time it is polled it
//! applies shard events (completions, deliveries), reads and executes as many
//! pipelined commands as its budget and backpressure allow, renders the replies
//! that are ready, and writes them out. Nothing blocks and no `RefCell`
//! borrow outlives a synchronous step. The connection is the I/O shell of
//! a [`Session`], which holds everything commands need; command semantics
//! live in [`crate::session::commands`].

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ciphermq_shard::log_throttle::LogThrottle;
use ciphermq_shard::log_throttled;
use ciphermq_shard::{ConnEvent, Mailbox};
use glommio::net::TcpStream;
use glommio::timer::Timer;

use crate::access::acl::Role;
use crate::access::identity::CertId;
use crate::access::policy::Policy;
use crate::access::rate_limit::ConnectionSlot;
use crate::conn::line_buffer::{Line, LineBuffer};
use crate::runtime::context::ShardLocal;
use crate::session::{Revoked, Session};
use crate::tls::session::TlsSession;

/// Commands executed per poll before yielding to other connections.
const LINE_BUDGET: usize = 2048;
/// Commands between two checks whether glommio wants the shard back (a
/// finished commit waiting to release its ACKs, see committer.rs).
const PREEMPT_CHECK_EVERY: usize = 64;
/// Commands between two checks whether a commit write has finished
/// (`FinishedIo::wake_finished`) or a commit round has waited long enough
/// for the idle committer to take it (`Shard::commit_round_due`).
const ROUND_CHECK_EVERY: usize = 16;
/// Lines a poll executes before it looks for finished commit writes or a
/// due round: a shorter burst ends soon enough for glommio to notice the
/// one and the committer to take the other. Splitting short bursts cost a
/// window of 100 with a consumer a fifth more broker CPU per message (more,
/// smaller rounds) and about 4% of its throughput.
const LOOK_AFTER_LINES: usize = 128;
/// Rendered replies staged per encryption call.
const RENDER_CHUNK: usize = 128 * 1024;
/// Unsent ciphertext above which the connection stops executing commands.
const OUTPUT_HIGH_WATER: usize = 1024 * 1024;
/// Plaintext pulled from rustls per step.
const PLAINTEXT_CHUNK: usize = 64 * 1024;

/// Ends the running task queue's turn (glommio then runs the other queues
/// before coming back to it) and this task's poll: it is woken again.
fn yield_task_queue(cx: &mut Context<'_>) {
    let executor = glommio::executor();
    let yielding = std::pin::pin!(executor.yield_task_queue_now());
    // Its first poll marks the queue and wakes this task.
    let _ = yielding.poll(cx);
}

/// Who is on the other end, from the certificate.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// The client id: the certificate's Subject CN, or the name its URI SAN
    /// gives (`tls.identity`).
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
    /// The certificate's issuer and serial, to end the connection when a
    /// reloaded CRL revokes it; `None` for sessions made without one
    /// (tests).
    pub cert: Option<CertId>,
    /// The closings version read before the handshake took its TLS
    /// configuration: a closing or revocation since then is looked at when
    /// the session starts.
    pub closures_seen: u64,
}

/// A connection's state between polls: its [`Session`] and the I/O around it.
pub(crate) struct Connection {
    /// What commands execute against; nothing of I/O.
    pub(crate) session: Session,
    /// The socket.
    pub(crate) stream: TcpStream,
    /// The TLS session over `stream`.
    pub(crate) tls: TlsSession,
    /// Where the shard reports completions and push deliveries (and wakes
    /// this task).
    pub(crate) mailbox: Rc<Mailbox>,
    /// Request framing: whole lines out of the plaintext.
    pub(crate) lines: LineBuffer,
    /// Shard reports drained from `mailbox`, applied in order.
    pub(crate) events: VecDeque<ConnEvent>,
    /// The last whole command, for the idle and heartbeat timeouts.
    pub(crate) last_activity: Instant,
    /// Reading stopped because the pending replies hold
    /// `performance.max_pending_reply_bytes`: each stop is counted once.
    held_back: bool,
    /// This connection's share of `pending_reply_bytes`, as last reported.
    reported_reply_bytes: u64,
    timer: Option<Timer>,
    _slot: Option<ConnectionSlot>,
}

/// Why a connection ended, for the log.
#[derive(Debug)]
enum End {
    Clean,
    PeerClosed,
    Timeout,
    Shutdown,
    RoleRevoked,
    ClosedByAdmin,
    CertificateRevoked,
    Io(String),
    Tls(String),
}

impl Connection {
    /// Registers a connection with its shard; call [`Connection::run`] next.
    pub(crate) fn new(
        local: Rc<ShardLocal>,
        stream: TcpStream,
        tls: TlsSession,
        identity: Identity,
        slot: Option<ConnectionSlot>,
    ) -> Connection {
        let lines = LineBuffer::new(local.shared.settings.max_line_bytes);
        let timeout = Connection::timeout_for(&local, identity.role);
        let (session, mailbox) = Session::new(local, identity);
        Connection {
            session,
            stream,
            tls,
            mailbox,
            lines,
            events: VecDeque::new(),
            last_activity: Instant::now(),
            held_back: false,
            reported_reply_bytes: 0,
            timer: timeout.map(Timer::new),
            _slot: slot,
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
    pub(crate) async fn run(mut self) {
        // Anyone with a certificate can connect at will: one line a second
        // per shard and role (so a receiver and a sender connecting together
        // both show), the next one counting what was left out.
        thread_local! {
            static ACCEPTED: [LogThrottle; 5] =
                const { [const { LogThrottle::new(Duration::from_secs(1)) }; 5] };
        }
        let role = match self.session.identity.role {
            Role::Sender => 0,
            Role::Receiver => 1,
            Role::Admin => 2,
            Role::Monitor => 3,
            Role::Unknown => 4,
        };
        if let Some(admitted) = ACCEPTED.with(|t| t[role].admit(Instant::now())) {
            let id = &self.session.identity;
            let shard = self.session.local.shard.borrow().id();
            log_throttled!(info, Some(admitted), "connections of this role",
                { cn = %id.cn, peer = %id.peer, role = %id.role, shard, },
                "connection accepted");
        }
        self.session.greet();
        let end = std::future::poll_fn(|cx| {
            let polled = self.poll_run(cx);
            // Counted once a turn, not per socket call.
            let (read, written) = self.tls.take_traffic();
            let stats = &self.session.local.stats;
            stats.bytes_received.add(read);
            stats.bytes_sent.add(written);
            let held = self.session.replies.held_bytes() as u64;
            if held != self.reported_reply_bytes {
                stats
                    .pending_reply_bytes
                    .shift(self.reported_reply_bytes, held);
                self.reported_reply_bytes = held;
            }
            polled
        })
        .await;
        let stats = &self.session.local.stats;
        stats
            .pending_reply_bytes
            .shift(self.reported_reply_bytes, 0);
        self.reported_reply_bytes = 0;
        let (cn, peer) = (&self.session.identity.cn, self.session.identity.peer);
        match &end {
            End::Clean | End::PeerClosed => tracing::debug!(%cn, %peer, "connection closed"),
            End::Timeout => {
                tracing::info!(%cn, %peer, "connection closed: idle or heartbeat timeout")
            }
            End::Shutdown => tracing::debug!(%cn, %peer, "connection closed: broker shutting down"),
            End::RoleRevoked => {
                tracing::warn!(%cn, %peer, "connection closed: the reloaded ACL changed its role")
            }
            End::ClosedByAdmin => {
                tracing::info!(%cn, %peer, "connection closed: an admin closed this CN's connections")
            }
            End::CertificateRevoked => {
                let serial = self.session.identity.cert.as_ref().map(CertId::serial_hex);
                tracing::warn!(%cn, %peer, serial = serial.unwrap_or_default(), "connection closed: its certificate is revoked by the reloaded CRL (tls.crl_path)")
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
        self.session.close();
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = Connection::timeout_for(&self.session.local, self.session.identity.role)
        else {
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
        let settings = &self.session.local.shared.settings;
        let max_pending = (
            settings.max_pending_replies,
            settings.max_pending_reply_bytes,
        );
        let mut budget = LINE_BUDGET;
        // Output has its own budget: a fast reader of large fetches must not
        // keep the shard rendering for it alone.
        let mut render_budget = settings.max_reply_bytes_per_turn;
        match self.session.refresh_policy() {
            Ok(()) => {}
            Err(Revoked::Role) => return Poll::Ready(End::RoleRevoked),
            Err(Revoked::Closed) => return Poll::Ready(End::ClosedByAdmin),
            Err(Revoked::Certificate) => return Poll::Ready(End::CertificateRevoked),
        }
        loop {
            let mut progress = self.apply_events();
            progress |= self.session.poll_pending_replies(cx);
            if self.mailbox.is_closed() && !self.session.closing {
                // Shutdown: execute nothing more, but answer what was accepted.
                self.session.closing = true;
                progress = true;
            }

            // Input: execute buffered lines, then refill from rustls and the socket.
            // The line buffer is taken out so lines can be executed in place.
            let mut lines = std::mem::replace(&mut self.lines, LineBuffer::new(0));
            let before = budget;
            self.session.clock.start_burst();
            let input = self.pump_input(&mut lines, cx, &mut budget, max_pending);
            self.session.clock.end_burst();
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

            let drained = self.session.replies.is_empty()
                && self.tls.outgoing_len() == 0
                && !self.tls.tls.wants_write();
            if drained && self.session.closing {
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
        (max_pending, max_pending_bytes): (usize, usize),
    ) -> Result<bool, End> {
        let mut progress = false;
        // Replies the client does not read pin memory: past the byte cap,
        // no more is read until it drains (one line may pass the cap, by
        // that line's worth; docs/PROTOCOL.md, "Memory per connection").
        let held_back = self.session.replies.held_bytes() >= max_pending_bytes;
        if held_back && !self.held_back {
            self.session.local.stats.reply_holdbacks.add(1);
        }
        self.held_back = held_back;
        // A command decided off the shard (a declare being saved, a key
        // being stored) holds back the next ones: a pipelined publish after
        // `bind` must see the binding.
        while !self.session.closing
            && *budget > 0
            && self.session.pending_replies.is_empty()
            && self.session.parked.is_none()
            && self.session.replies.len() < max_pending
            && self.session.replies.held_bytes() < max_pending_bytes
            && self.tls.outgoing_len() < OUTPUT_HIGH_WATER
        {
            match lines.next_line() {
                Line::Complete(line) => {
                    let weight = self.session.execute(line);
                    *budget -= 1;
                    progress = true;
                    // A fetch of thousands is charged as thousands of
                    // commands (it ends the turn), and checks at once.
                    let heavy = weight > 1;
                    if heavy {
                        *budget = budget.saturating_sub(weight - 1);
                    }
                    if (heavy || budget.is_multiple_of(PREEMPT_CHECK_EVERY))
                        && glommio::executor().need_preempt()
                    {
                        // Yield now (the poll ends as if the budget were spent).
                        *budget = 0;
                    } else if budget.is_multiple_of(ROUND_CHECK_EVERY)
                        && LINE_BUDGET - *budget >= LOOK_AFTER_LINES
                        && ((matches!(self.session.identity.role, Role::Sender | Role::Admin)
                            && self
                                .session
                                .local
                                .finished_io
                                .wake_finished(self.session.conn.id))
                            || self.session.local.shard.borrow().commit_round_due())
                    {
                        // A round's sync finished, or the disk is idle and a
                        // round is due: end the whole task queue's turn, so
                        // the committer answers the finished round or takes
                        // the due one now, while this connection goes on.
                        yield_task_queue(cx);
                        *budget = 0;
                    }
                }
                Line::TooLong => {
                    self.session.replies.line("Error: line too long");
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
            // Sends what rustls encrypted, straight from its buffers while the
            // socket takes it; the rest waits in `outgoing` (which the
            // high-water mark counts).
            if !self.session.local.may_answer()
                && (self.tls.outgoing_len() > 0 || self.tls.holds_records())
            {
                return Err(
                    "this node's cluster lease ran out: answers not sent, connection closed"
                        .to_owned(),
                );
            }
            let flushed = self.tls.poll_flush(&mut self.stream, cx);
            if let Poll::Ready(Err(e)) = flushed {
                return Err(e.to_string());
            }
            if input_blocked && self.tls.outgoing_len() < OUTPUT_HIGH_WATER {
                progress = true;
            }
            // Records rustls holds while the socket is full are not in
            // `outgoing`, so the high-water mark does not see them: render
            // no more until they leave, or a client that never reads would
            // have every reply and delivery encrypted and kept.
            let socket_full = flushed.is_pending() && self.tls.holds_records();
            if self.tls.outgoing_len() >= OUTPUT_HIGH_WATER
                || socket_full
                || !self.session.replies.head_ready()
                || *render_budget == 0
            {
                return Ok(progress);
            }
            // One staging buffer per shard: rendering never spans an await.
            let mut staging = self.session.local.staging.borrow_mut();
            staging.clear();
            self.session
                .replies
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
            self.session.apply(event);
        }
        true
    }
}
