//! A client's session on its shard, without the socket: who it is, the policy
//! it is judged under, its place in the shard, the replies it owes (in
//! command order) and the deliveries it holds.
//!
//! [`Session::execute`] (in [`crate::session::commands`]) runs one request line
//! against the shard and leaves the reply in [`Session::replies`]; it never
//! touches a stream. The connection ([`crate::conn::connection`]) is the thin
//! shell around it: framing, TLS, the socket, timers and the shard's wake-ups.
//! Keeping command semantics apart from I/O lets them be tested line by line
//! against a real shard, with no TLS in the way.

mod commands;

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use ciphermq_shard::{ConnEvent, ConnRef, DeliveryTracker, Mailbox};

use crate::access::policy::Policy;
use crate::conn::connection::Identity;
use crate::conn::line_clock::LineClock;
use crate::conn::replies::ReplyQueue;
use crate::runtime::context::ShardLocal;

#[cfg(test)]
pub(crate) mod tests;

/// What executing commands needs, and nothing of I/O.
pub(crate) struct Session {
    /// The shard serving this client, and the services every shard shares.
    pub(crate) local: Rc<ShardLocal>,
    /// Who is on the other end, from the certificate.
    pub(crate) identity: Identity,
    /// The ACL and rate limits this session applies (refreshed on reload by
    /// [`Session::refresh_policy`]).
    pub(crate) policy: Arc<Policy>,
    /// This session's handle in the shard: origin of its commands, owner of
    /// its deliveries and consumers.
    pub(crate) conn: ConnRef,
    /// Replies owed, in command order (the reorder buffer).
    pub(crate) replies: ReplyQueue,
    /// Deliveries made to this session and not yet acked or nacked.
    pub(crate) tracker: DeliveryTracker,
    /// Replies decided off the shard (key registrations, saved topology
    /// changes), with their slots.
    pub(crate) pending_replies: Vec<PendingReply>,
    /// `quit` received: execute nothing more, close once replies are out.
    pub(crate) closing: bool,
    /// Ever consumed or fetched: its close must requeue on every shard.
    pub(crate) consumed: bool,
    /// Taken when it opened: an admin's `close_connection` ends the
    /// connections of a CN with tickets below its cutoff.
    ticket: u64,
    /// The closings version last looked at.
    seen_closures: u64,
    /// What the command executed last weighs, in messages it may move
    /// (see [`Session::execute`]).
    pub(crate) weight: usize,
    /// A command waiting for its owner to be placed in the cluster: no
    /// later command runs before it runs again.
    pub(crate) parked: Option<Parked>,
    /// The command running is a parked one's second run: an owner still
    /// unplaced is answered, not parked again.
    pub(crate) rerun: bool,
    /// Set by a command that must wait for this owner's placement.
    pub(crate) park_for: Option<String>,
    /// In a cluster, the owner the last publish found here, with the
    /// placement and ACL versions it was judged under.
    pub(crate) publish_home_cache: Option<(Box<str>, (u64, u64))>,
    /// The time lines are stamped with (read once per few lines of a burst).
    pub(crate) clock: LineClock,
}

/// A command line set aside until `ready` (its owner placed, or the wait
/// given up), then executed again.
pub(crate) struct Parked {
    /// The request line, without its newline.
    pub(crate) line: Box<[u8]>,
    /// Resolves when it may run again.
    pub(crate) ready: Pin<Box<dyn Future<Output = ()>>>,
}

/// Why a session must end at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revoked {
    /// A reloaded ACL gives its CN another role.
    Role,
    /// An admin closed its CN's connections (`close_connection`).
    Closed,
    /// A reloaded CRL revokes its certificate.
    Certificate,
}

/// A reply line another thread is deciding.
pub(crate) struct PendingReply {
    /// Its reply slot.
    pub(crate) seq: u64,
    /// Resolves to the line.
    pub(crate) line: Pin<Box<dyn Future<Output = String>>>,
}

impl Session {
    /// Registers a session of `identity` with its shard. Returns the mailbox
    /// through which the shard reports completions and push deliveries: the
    /// shell owns it (it wakes the task), and hands each event to
    /// [`Session::apply`].
    pub(crate) fn new(local: Rc<ShardLocal>, identity: Identity) -> (Session, Rc<Mailbox>) {
        let (conn, mailbox) = local.shard.borrow_mut().register_conn();
        let policy = identity.policy.clone();
        let closures = &local.shared.policy.closures;
        let ticket = closures.ticket();
        let seen_closures = identity.closures_seen;
        let session = Session {
            local,
            identity,
            policy,
            conn,
            replies: ReplyQueue::default(),
            tracker: DeliveryTracker::default(),
            pending_replies: Vec::new(),
            closing: false,
            consumed: false,
            ticket,
            seen_closures,
            weight: 1,
            parked: None,
            rerun: false,
            park_for: None,
            publish_home_cache: None,
            clock: LineClock::default(),
        };
        (session, mailbox)
    }

    /// Queues the greeting, `HELLO ciphermq/1 <client_id> <role>`: the first
    /// line every client reads.
    pub(crate) fn greet(&mut self) {
        let greeting = format!(
            "HELLO {} {} {}",
            ciphermq_proto::PROTOCOL,
            self.identity.cn,
            self.identity.role
        );
        self.replies.line(greeting);
    }

    /// Takes up the current policy if a reload replaced it, and looks at
    /// admins' closings if one happened; `Err` when the session must end.
    pub(crate) fn refresh_policy(&mut self) -> Result<(), Revoked> {
        let store = &self.local.shared.policy;
        let closures = store.closures.version();
        if closures != self.seen_closures {
            self.seen_closures = closures;
            if store.closures.must_close(&self.identity.cn, self.ticket) {
                return Err(Revoked::Closed);
            }
            let cert = self.identity.cert.as_ref();
            if cert.is_some_and(|cert| store.closures.is_revoked(cert)) {
                return Err(Revoked::Certificate);
            }
        }
        if store.version() == self.policy.version {
            return Ok(());
        }
        self.policy = store.current();
        if self.policy.acl.role_of(&self.identity.cn) == self.identity.role {
            Ok(())
        } else {
            Err(Revoked::Role)
        }
    }

    /// Applies one report of the shard: a command's completion fills its
    /// reply slot (fetched deliveries become owed), a push delivery joins
    /// the replies and becomes owed.
    #[inline]
    pub(crate) fn apply(&mut self, event: ConnEvent) {
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
            ConnEvent::QueueDeleted { queue, consumer } => {
                // Its deliveries are owed to no one any more: an ack of one
                // is answered as for any unknown delivery.
                self.tracker.forget_queue(&queue);
                if consumer {
                    self.replies.line(format!("Error: queue {queue} deleted"));
                }
            }
        }
    }

    /// Fills the reply slots whose off-shard work has finished, and runs a
    /// parked command again once it may; true when any was.
    pub(crate) fn poll_pending_replies(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        if let Some(parked) = self.parked.as_mut() {
            if parked.ready.as_mut().poll(cx).is_ready() {
                if let Some(parked) = self.parked.take() {
                    self.rerun = true;
                    self.execute(&parked.line);
                    self.rerun = false;
                    progress = true;
                }
            }
        }
        progress | self.poll_replies(cx)
    }

    fn poll_replies(&mut self, cx: &mut Context<'_>) -> bool {
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

    /// Forgets the session; every shard it consumed from requeues what it
    /// owed (in queue order) and drops its consumers.
    pub(crate) fn close(&mut self) {
        let conn = self.conn;
        let consumed = self.consumed;
        self.local
            .with_shard(|shard| shard.unregister_conn(conn, consumed));
    }
}
