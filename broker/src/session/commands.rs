//! What each `ciphermq/1` command does in a [`Session`]: ACL first, then the
//! limits, then the shard. Replies go into the session's reorder buffer, so a
//! command finishing on another shard never reorders them. No I/O here: the
//! connection feeds lines in and writes the replies out.

use std::time::{Duration, Instant};

use base64::Engine;
use ciphermq_proto::message::{
    inspect_batch_at_most, inspect_message, BatchError, MessageError, MessageInfo,
};
use ciphermq_proto::{is_valid_name, NackReason, Request};
use ciphermq_shard::topology::Actor;
use ciphermq_shard::{
    ChangeResult, Message, Origin, PublishStatus, QueueInfo, Route, TopologyChange, TopologyError,
};

mod placement;

use crate::access::acl::{Op, Role};
use crate::session::{PendingReply, Session};
use ciphermq_shard::log_throttle::LogThrottle;
use ciphermq_shard::log_throttled;
use placement::PublishHome;

// What a client can make the broker log at will is logged at most once a
// second per shard and kind (denials: 20 a second, so a few in a row show
// whole); the next line counts what was left out. Only refusals and
// topology changes: publishes, acks and deliveries log nothing.
thread_local! {
    /// `Access denied` answers (ACL, ownership, a forged sender).
    static DENIED: LogThrottle = const { LogThrottle::with_burst(Duration::from_secs(1), DENIALS_PER_SECOND) };
    /// Saved topology changes, one throttle per [`topology_command`] kind,
    /// so a receiver's setup (declare_exchange, declare_queue, bind) shows
    /// whole.
    /// Publish bodies refused by the envelope check, with the field at fault.
    static INVALID: LogThrottle = const { LogThrottle::with_burst(Duration::from_secs(1), DENIALS_PER_SECOND) };
    static CHANGED: [LogThrottle; 6] =
        const { [const { LogThrottle::new(Duration::from_secs(1)) }; 6] };
}

/// `Access denied` lines a shard logs per second before it summarises.
pub(crate) const DENIALS_PER_SECOND: u32 = 20;

/// The command name of a topology change, and its index in `CHANGED`.
fn topology_command(change: &TopologyChange) -> (&'static str, usize) {
    match change {
        TopologyChange::DeclareQueue { .. } => ("declare_queue", 0),
        TopologyChange::DeclareExchange { .. } => ("declare_exchange", 1),
        TopologyChange::Bind { .. } => ("bind", 2),
        TopologyChange::Unbind { .. } => ("unbind", 3),
        TopologyChange::DeleteExchange { .. } => ("delete_exchange", 4),
        TopologyChange::DeleteQueue { .. } => ("delete_queue", 5),
        TopologyChange::QueueRemoved { .. } => ("delete_queue", 5),
    }
}

impl Session {
    /// Executes one request line (without its newline) and returns what it
    /// weighs: 1, or for a command that may move many messages in one shard
    /// step (`fetch`, `consume`, `ack_batch`, `publish_batch`, `resend`) how many. The
    /// connection charges its per-turn budget with it, so a pipeline of
    /// large fetches yields between them instead of holding the shard for
    /// all of them.
    pub(crate) fn execute(&mut self, line: &[u8]) -> usize {
        self.weight = 1;
        self.execute_line(line);
        self.weight
    }

    fn execute_line(&mut self, line: &[u8]) {
        let Ok(line) = std::str::from_utf8(line) else {
            self.replies.line("Error: invalid UTF-8 in request");
            return;
        };
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            return;
        }
        let request = match Request::parse(line) {
            Ok(r) => r,
            Err(e) => {
                self.replies.line(format!("Error: {e}"));
                return;
            }
        };
        let now = self.clock.line().now;
        self.dispatch(request, now);
        if let Some(owner) = self.park_for.take() {
            self.park(line.as_bytes(), &owner);
        }
    }

    fn dispatch(&mut self, request: Request<'_>, now: Instant) {
        match request {
            Request::Publish {
                exchange,
                routing_key,
                body,
            } => {
                self.publish(exchange, routing_key, body, None, now);
            }
            Request::PublishFor {
                owner,
                exchange,
                routing_key,
                body,
            } => {
                self.publish(exchange, routing_key, body, Some(owner), now);
            }
            Request::PublishBatch {
                exchange,
                routing_key,
                body,
            } => {
                self.publish_batch(exchange, routing_key, body, now);
            }
            other => {
                if !self
                    .local
                    .allow(&self.policy, &self.identity.cn, now, false)
                {
                    self.local.stats.rate_limited.add(1);
                    self.replies.line("Rate limited");
                    return;
                }
                self.command(other, now);
            }
        }
    }

    fn deny(&mut self, reason: &str) {
        let line = format!("Access denied: {reason} (role={})", self.identity.role);
        self.replies.line(line);
    }

    fn check(&mut self, op: Op<'_>) -> bool {
        match self
            .policy
            .acl
            .check(self.identity.role, &self.identity.cn, op)
        {
            Ok(()) => true,
            Err(denied) => {
                let id = &self.identity;
                log_throttled!(info, DENIED.with(|t| t.admit(Instant::now())), "denials",
                    { cn = %id.cn, peer = %id.peer, role = %id.role, command = op.name(), reason = %denied.reason, },
                    "access denied");
                self.deny(&denied.reason);
                false
            }
        }
    }

    fn command(&mut self, request: Request<'_>, now: Instant) {
        match request {
            Request::DeclareQueue { queue } => {
                if !self.check(Op::DeclareQueue { queue }) || !self.queue_at_home(queue) {
                    return;
                }
                let owner = self.policy.acl.queue_owner(queue).map(str::to_owned);
                let owner = owner.unwrap_or_else(|| self.identity.cn.to_string());
                let change = TopologyChange::DeclareQueue {
                    name: queue.to_owned(),
                    owner,
                    by: Some(self.actor()),
                };
                self.change_topology(change, format!("OK declare_queue {queue}"));
            }
            Request::DeclareExchange { exchange, kind } => {
                if !self.check(Op::DeclareExchange { exchange }) {
                    return;
                }
                if self.local.shared.cluster.is_some() {
                    self.declare_exchange_in_cluster(exchange, kind);
                    return;
                }
                // The first receiver to declare it owns it; an admin's
                // belongs to no receiver. Applied by the topology's writer,
                // so of two racing declarations exactly one creates it.
                let owner =
                    (self.identity.role == Role::Receiver).then(|| self.identity.cn.to_string());
                let change = TopologyChange::DeclareExchange {
                    name: exchange.to_owned(),
                    kind,
                    owner,
                };
                self.change_topology(change, format!("OK declare_exchange {exchange}"));
            }
            Request::Bind {
                queue,
                exchange,
                routing_key,
            } => {
                if !self.check(Op::Bind { queue, routing_key }) || !self.queue_at_home(queue) {
                    return;
                }
                let change = TopologyChange::Bind {
                    queue: queue.to_owned(),
                    exchange: exchange.to_owned(),
                    key: routing_key.to_owned(),
                    by: Some(self.actor()),
                };
                self.change_topology(change, format!("OK bind {queue} {exchange} {routing_key}"));
            }
            Request::Unbind {
                queue,
                exchange,
                routing_key,
            } => {
                if !self.check(Op::Unbind { queue, routing_key }) || !self.queue_at_home(queue) {
                    return;
                }
                let change = TopologyChange::Unbind {
                    queue: queue.to_owned(),
                    exchange: exchange.to_owned(),
                    key: routing_key.to_owned(),
                };
                self.change_topology(
                    change,
                    format!("OK unbind {queue} {exchange} {routing_key}"),
                );
            }
            Request::DeleteExchange { exchange } => {
                if !self.check(Op::DeleteExchange { exchange }) {
                    return;
                }
                // Whether a receiver owns it is decided where it is applied.
                let change = TopologyChange::DeleteExchange {
                    name: exchange.to_owned(),
                    by: self.actor(),
                };
                // In a cluster, once deleted here it leaves the catalogue,
                // and every node follows.
                let cluster = self.local.shared.cluster.clone();
                let name = exchange.to_owned();
                self.change_topology_then(
                    change,
                    format!("OK delete_exchange {exchange}"),
                    move || {
                        if let Some(cluster) = cluster {
                            cluster.exchange_deleted(&name);
                        }
                    },
                );
            }
            Request::PurgeQueue { queue } => {
                if self.check(Op::PurgeQueue { queue }) && self.queue_at_home(queue) {
                    self.purge(queue, now);
                }
            }
            Request::DeleteQueue { queue } => {
                if self.check(Op::DeleteQueue { queue }) && self.queue_at_home(queue) {
                    self.delete_queue(queue);
                }
            }
            Request::CloseConnection { client_id } => {
                if self.check(Op::CloseConnection) {
                    self.close_connections_of(client_id);
                }
            }
            Request::Consume { queue, prefetch } => {
                if !self.check(Op::Consume { queue }) || !self.queue_at_home(queue) {
                    return;
                }
                let prefetch = prefetch.unwrap_or(self.local.shared.settings.default_prefetch);
                // It may start that many deliveries at once.
                self.weight = prefetch as usize;
                self.consume(queue, prefetch, now);
            }
            Request::Fetch { queue, max } => {
                if !self.check(Op::Fetch { queue }) || !self.queue_at_home(queue) {
                    return;
                }
                let held = self.tracker.len();
                let cap = self.local.shared.settings.max_unacked_per_connection;
                let Some(room) = cap.checked_sub(held).filter(|&room| room > 0) else {
                    self.replies.line(format!(
                        "Error: fetch: this connection holds {held} unacked deliveries, the most \
                         one may (performance.max_unacked_per_connection); ack or nack some first"
                    ));
                    return;
                };
                let max = max
                    .unwrap_or(1)
                    .min(u32::try_from(room).unwrap_or(u32::MAX));
                self.weight = max as usize;
                self.fetch(queue, max, now);
            }
            Request::Ack { message_id, queue } => {
                if self.check(Op::Ack) {
                    self.settle(message_id, queue, true, now);
                }
            }
            Request::AckBatch { queue, ids } => {
                if self.check(Op::Ack) {
                    self.settle_batch(queue, ids, now);
                }
            }
            Request::Nack { message_id, queue } => {
                let home = |s: &mut Session| queue.is_none_or(|q| s.queue_at_home(q));
                if self.check(Op::Nack { queue }) && home(self) {
                    self.settle(message_id, queue, false, now);
                }
            }
            Request::Resend => {
                if !self.check(Op::Resend) {
                    return;
                }
                let mut owed = Vec::new();
                self.tracker.take_all(&mut owed);
                // Requeue in queue order so redeliveries stay FIFO.
                owed.sort_unstable_by(|a, b| (&a.queue, a.seq).cmp(&(&b.queue, b.seq)));
                self.weight = owed.len().max(1);
                let conn = self.conn;
                self.local.with_shard(|shard| {
                    for d in &owed {
                        shard.requeue(conn, d, now);
                    }
                });
                self.replies.line(format!("OK resend {}", owed.len()));
            }
            Request::RegisterPublicKey { key_b64 } => {
                if self.check(Op::RegisterPublicKey) {
                    self.register_key(key_b64);
                }
            }
            Request::GetPublicKey { client_id } => {
                if !self.check(Op::GetPublicKey) {
                    return;
                }
                let line = match self.local.shared.keys.get(client_id) {
                    Some(key) => format!(
                        "PUBLIC_KEY {client_id} {}",
                        base64::engine::general_purpose::STANDARD.encode(key)
                    ),
                    None => format!("Error: no public key for {client_id}"),
                };
                self.replies.line(line);
            }
            Request::Heartbeat => {
                if self.check(Op::Heartbeat) {
                    self.replies.line("OK heartbeat");
                }
            }
            Request::Quit => {
                if self.check(Op::Quit) {
                    self.replies.line("OK bye");
                    self.closing = true;
                }
            }
            // Open to every role: they say where things are, nothing more.
            Request::Nodes => self.nodes(),
            Request::Locate { owner } => self.locate(owner),
            Request::Move { owner, node } => {
                if self.check(Op::MoveOwner) {
                    self.move_owner(owner, node);
                }
            }
            Request::Publish { .. } | Request::PublishBatch { .. } | Request::PublishFor { .. } => {
                unreachable_publish(self);
            }
        }
    }

    /// The queue a consume or fetch reads, and the origin of its reply; `None`
    /// (after answering) when the queue does not exist.
    fn reading(&mut self, queue: &str) -> Option<(QueueInfo, Origin)> {
        let info = self
            .local
            .shard
            .borrow_mut()
            .topology()
            .queue(queue)
            .cloned();
        let Some(info) = info else {
            self.replies.line(format!("Error: unknown queue {queue}"));
            return None;
        };
        // Its close must now requeue what it owes on every shard.
        self.consumed = true;
        let origin = Origin {
            conn: self.conn,
            seq: self.replies.next_seq(),
        };
        Some((info, origin))
    }

    fn consume(&mut self, queue: &str, prefetch: u32, now: Instant) {
        let Some((info, origin)) = self.reading(queue) else {
            return;
        };
        let done = self
            .local
            .with_shard(|shard| shard.consume(origin, &info, prefetch, now));
        self.replies.consume(info.name, done.is_none());
    }

    /// `purge_queue`: answered `OK purge_queue <q> <n>` once the queue's
    /// shard dropped its ready messages and the commit round holding its
    /// purge record (one for them all) is done; each message's ack record
    /// follows as the shard settles it.
    fn purge(&mut self, queue: &str, now: Instant) {
        let info = self
            .local
            .shard
            .borrow_mut()
            .topology()
            .queue(queue)
            .cloned();
        let Some(info) = info else {
            self.replies.line(format!("Error: unknown queue {queue}"));
            return;
        };
        let origin = Origin {
            conn: self.conn,
            seq: self.replies.next_seq(),
        };
        let done = self
            .local
            .with_shard(|shard| shard.purge(origin, &info, now));
        let purged = match done {
            Some(ciphermq_shard::Completion::Purged { count, durable }) => Some((count, durable)),
            _ => None,
        };
        tracing::info!(cn = %self.identity.cn, queue, purged = purged.as_ref().map(|p| p.0), "purge_queue");
        self.replies.purge(info.name, purged);
    }

    /// `delete_queue`: answered `OK delete_queue <q>` once the deletion is
    /// durable, in three steps, each after the one before is done:
    ///
    /// 1. the topology without the queue and its bindings is saved, with
    ///    the queue's name recorded as being deleted (nothing routes to it
    ///    from then on, and a start after a crash removes its log instead
    ///    of adopting it);
    /// 2. its shard drops it (its consumers are told) and has its log
    ///    directory moved away durably;
    /// 3. the record is cleared (saved), so the name may be declared again,
    ///    starting empty.
    ///
    /// A failure in step 2 answers an error and keeps the record: the queue
    /// stays deleted, and the next start removes its directory.
    fn delete_queue(&mut self, queue: &str) {
        let info = self
            .local
            .shard
            .borrow_mut()
            .topology()
            .queue(queue)
            .cloned();
        let Some(info) = info else {
            self.replies.line(format!("Error: unknown queue {queue}"));
            return;
        };
        let store = self.local.shared.topology.clone();
        let deleted = store.submit(TopologyChange::DeleteQueue {
            name: queue.to_owned(),
            by: self.actor(),
        });
        let local = self.local.clone();
        let (cn, role, peer) = (
            self.identity.cn.clone(),
            self.identity.role,
            self.identity.peer,
        );
        self.reply_later(async move {
            let name = info.name.clone();
            match deleted.await {
                Ok(()) => {}
                Err(TopologyError::Denied(reason)) => {
                    log_throttled!(info, DENIED.with(|t| t.admit(Instant::now())), "denials",
                        { %cn, %peer, %role, command = "delete_queue", %reason, },
                        "access denied");
                    return format!("Access denied: {reason} (role={role})");
                }
                Err(e) => return format!("Error: {e}"),
            }
            let (removed, done) = ciphermq_shard::pending::pending();
            local.with_shard(|shard| shard.delete_queue(&info, done));
            match removed.await {
                Ok(()) => {}
                Err(e) => {
                    tracing::error!(%cn, queue = %name, error = %e, "delete_queue: the queue is deleted, but its log directory was not moved away; the next start removes it");
                    return format!("Error: delete_queue {name}: storage: {e}");
                }
            }
            let cleared = store
                .submit(TopologyChange::QueueRemoved {
                    name: name.to_string(),
                })
                .await;
            if let Err(e) = cleared {
                // Deleted for good all the same: only declaring the name
                // again waits for the next start.
                tracing::error!(queue = %name, error = %e, "delete_queue: the deletion record was not cleared; the name can be declared again after a restart");
            }
            log_throttled!(info, CHANGED.with(|t| t[5].admit(Instant::now())), "delete_queue lines",
                { %cn, %peer, %role, command = "delete_queue", },
                "OK delete_queue {name}");
            format!("OK delete_queue {name}")
        });
    }

    fn fetch(&mut self, queue: &str, max: u32, now: Instant) {
        let Some((info, origin)) = self.reading(queue) else {
            return;
        };
        let done = self
            .local
            .with_shard(|shard| shard.fetch(origin, &info, max, now));
        match done {
            Some(ciphermq_shard::Completion::Fetched(deliveries)) => {
                for d in &deliveries {
                    self.tracker.record(d);
                }
                self.replies.fetch(Some(deliveries));
            }
            _ => {
                self.replies.fetch(None);
            }
        }
    }

    /// `ack` (settle = true) or `nack` (requeue) of outstanding deliveries.
    fn settle(&mut self, message_id: &str, queue: Option<&str>, ack: bool, now: Instant) {
        let mut owed = Vec::new();
        if self.tracker.take(message_id, queue, &mut owed) == 0 {
            self.replies
                .line(format!("Error: no outstanding delivery {message_id}"));
            return;
        }
        let conn = self.conn;
        self.local.with_shard(|shard| {
            for d in &owed {
                if ack {
                    shard.ack(conn, d, now);
                } else {
                    shard.requeue(conn, d, now);
                }
            }
        });
        self.local.stats.settled(ack, owed.len());
        let word = if ack {
            "ACK_CONFIRMED"
        } else {
            "NACK_CONFIRMED"
        };
        self.replies.line(format!("{word} {message_id}"));
    }

    /// `ack_batch`: acks this connection's outstanding deliveries of `ids`
    /// from `queue` in one shard step and answers how many were settled;
    /// ids with none outstanding are skipped (a redelivered message acked
    /// late, a duplicate id in the batch).
    fn settle_batch(&mut self, queue: &str, ids: &str, now: Instant) {
        let mut owed = Vec::new();
        for id in Request::batch_ids(ids) {
            self.tracker.take(id, Some(queue), &mut owed);
            self.weight += 1;
        }
        if !owed.is_empty() {
            let conn = self.conn;
            self.local
                .with_shard(|shard| shard.ack_many(conn, &owed, now));
            self.local.stats.settled(true, owed.len());
        }
        self.replies
            .line(format!("OK ack_batch {queue} {}", owed.len()));
    }

    /// `close_connection <cn>`: every connection `cn` has open ends at its
    /// next turn (this one too, after this reply, when `cn` is the
    /// caller's own CN); the reply counts them.
    fn close_connections_of(&mut self, cn: &str) {
        let closed = self.local.shared.policy.close_connections_of(cn);
        tracing::info!(admin = %self.identity.cn, client_id = cn, connections = closed, "close_connection");
        self.replies
            .line(format!("OK close_connection {cn} {closed}"));
    }

    /// Who this session is to the topology's ownership rules.
    fn actor(&self) -> Actor {
        match self.identity.role {
            Role::Admin => Actor::Admin,
            // Senders and unknown clients never get this far (the ACL); were
            // one to, it would get no more than a receiver of its CN.
            Role::Receiver | Role::Sender | Role::Monitor | Role::Unknown => {
                Actor::Receiver(self.identity.cn.clone())
            }
        }
    }

    /// Submits a topology change; `ok` is the reply once it is saved (at
    /// once in memory mode, else when the saver thread has it on disk). An
    /// ownership refusal, decided where the change is applied, is answered
    /// like the ACL's.
    fn change_topology(&mut self, change: TopologyChange, ok: String) {
        self.change_topology_then(change, ok, || {});
    }

    /// [`Session::change_topology`], running `then` once the change is
    /// applied (not when it is refused).
    fn change_topology_then(
        &mut self,
        change: TopologyChange,
        ok: String,
        then: impl FnOnce() + 'static,
    ) {
        let (command, kind) = topology_command(&change);
        let mut pending = self.local.shared.topology.submit(change);
        let (cn, role, peer) = (
            self.identity.cn.clone(),
            self.identity.role,
            self.identity.peer,
        );
        let line = move |result: ChangeResult| match result {
            Ok(()) => {
                then();
                // The reply names what changed: `OK bind <q> <e> <key>`.
                log_throttled!(info, CHANGED.with(|t| t[kind].admit(Instant::now())), "lines of this command",
                    { %cn, %peer, %role, command, },
                    "{ok}");
                ok
            }
            Err(TopologyError::Denied(reason)) => {
                log_throttled!(info, DENIED.with(|t| t.admit(Instant::now())), "denials",
                    { %cn, %peer, %role, command, %reason, },
                    "access denied");
                format!("Access denied: {reason} (role={role})")
            }
            Err(e @ TopologyError::QuotaExceeded { .. }) => {
                // A client at its quota may keep asking: one line a second.
                thread_local! {
                    static OVER_QUOTA: LogThrottle = const { LogThrottle::new(Duration::from_secs(1)) };
                }
                log_throttled!(warn, OVER_QUOTA.with(|t| t.admit(Instant::now())), "refusals",
                    { %cn, %peer, command, error = %e, },
                    "refused");
                format!("Error: {e}")
            }
            Err(e) => format!("Error: {e}"),
        };
        match pending.try_take() {
            Some(result) => {
                self.replies.line(line(result));
            }
            None => self.reply_later(async move { line(pending.await) }),
        }
    }

    /// Takes a reply slot that `line` fills once it resolves.
    fn reply_later(&mut self, line: impl std::future::Future<Output = String> + 'static) {
        let seq = self.replies.pending();
        self.pending_replies.push(PendingReply {
            seq,
            line: Box::pin(line),
        });
    }

    fn register_key(&mut self, key_b64: &str) {
        let decoded = base64::engine::general_purpose::STANDARD.decode(key_b64);
        let key: [u8; 32] = match decoded.ok().and_then(|k| k.try_into().ok()) {
            Some(k) => k,
            None => {
                self.replies
                    .line("Error: invalid public key: expected standard base64 of 32 bytes");
                return;
            }
        };
        // The store writes off the shard; the reply waits in its slot.
        let registration = self.local.shared.keys.register(&self.identity.cn, key);
        let cn = self.identity.cn.clone();
        self.reply_later(async move {
            match registration.await {
                Ok(Ok(previous)) => {
                    match previous {
                        Some(p) if p != key => tracing::info!(client_id = %cn, "public key rotated"),
                        Some(_) => {}
                        None => tracing::info!(client_id = %cn, "public key registered"),
                    }
                    "Public key registered".to_owned()
                }
                Ok(Err(e)) => {
                    tracing::error!(client_id = %cn, error = %e, "public key not stored");
                    format!("Error: {e}")
                }
                Err(_) => {
                    tracing::error!(client_id = %cn, "public key not stored: the key store stopped");
                    "Error: key store unavailable".to_owned()
                }
            }
        });
    }

    /// Checks everything but routing; `Err` is the reply.
    fn admit(
        &mut self,
        exchange: &str,
        routing_key: &str,
        info: &MessageInfo<'_>,
        body: &str,
        now: Instant,
    ) -> Result<(), NackReason> {
        // The matrix's publish row (senders and admins), without the
        // denial line a command gets: a refused publish is a `NACK`.
        if self
            .policy
            .acl
            .check(self.identity.role, &self.identity.cn, Op::Publish)
            .is_err()
        {
            return Err(NackReason::AccessDenied);
        }
        // Authenticated senders (docs/PROTOCOL.md, "Authenticated senders"):
        // a body that names its sender names the publisher, so receivers may
        // trust it to tell senders apart.
        match info.sender_client_id.as_deref() {
            Some(claimed) if claimed != &*self.identity.cn => {
                let id = &self.identity;
                log_throttled!(info, DENIED.with(|t| t.admit(now)), "denials",
                    { cn = %id.cn, peer = %id.peer, claimed, message_id = %info.message_id, },
                    "publish refused: sender_client_id is not the publisher's CN");
                return Err(NackReason::AccessDenied);
            }
            None if self.policy.require_sender_id => return Err(NackReason::Invalid),
            _ => {}
        }
        if !self.local.allow(&self.policy, &self.identity.cn, now, true) {
            return Err(NackReason::RateLimited);
        }
        if !is_valid_name(exchange) || !ciphermq_proto::name::is_valid_routing_key(routing_key) {
            return Err(NackReason::Invalid);
        }
        if body.len() > self.local.shared.settings.max_message_bytes {
            return Err(NackReason::TooLarge);
        }
        Ok(())
    }

    /// Says in the log which field of a refused publish body is wrong: the
    /// reply lines are the protocol's (`Error: invalid message`, `NACK <id>
    /// invalid`) and name none. Throttled, and the body parsed again only
    /// for a line that is logged.
    fn log_refused_body(&self, body: &str, now: Instant) {
        let id = &self.identity;
        log_throttled!(info, INVALID.with(|t| t.admit(now)), "refused bodies",
            { cn = %id.cn, peer = %id.peer, },
            "publish refused: invalid message: {}", ciphermq_proto::message::explain_refusal(body));
    }

    fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        body: &str,
        owner: Option<&str>,
        now: Instant,
    ) {
        let info = match inspect_message(body) {
            Ok(info) => info,
            Err(MessageError::Unreadable) => {
                self.log_refused_body(body, now);
                self.replies.line("Error: invalid message");
                return;
            }
            Err(MessageError::Invalid { message_id }) => {
                self.log_refused_body(body, now);
                self.replies.nack(&message_id, NackReason::Invalid);
                return;
            }
        };
        self.publish_one(exchange, routing_key, &info, body, owner, false, now);
    }

    /// One message of a `publish`, `publish_for` (`owner`: only that
    /// owner's queues) or `publish_batch` (`in_batch`).
    #[allow(clippy::too_many_arguments)]
    fn publish_one(
        &mut self,
        exchange: &str,
        routing_key: &str,
        info: &MessageInfo<'_>,
        body: &str,
        owner: Option<&str>,
        in_batch: bool,
        now: Instant,
    ) {
        let message_id: &str = &info.message_id;
        if let Err(reason) = self.admit(exchange, routing_key, info, body, now) {
            self.replies.nack(message_id, reason);
            return;
        }
        let home_owner = owner.unwrap_or(&info.receiver_client_id);
        if let PublishHome::Settled =
            self.publish_home(home_owner, message_id, owner.is_some(), in_batch)
        {
            return;
        }
        let route = Route {
            exchange,
            routing_key,
            // The line's own stamp, read with `now` (one clock read for
            // a few lines of a burst: crate::conn::line_clock).
            sent_at_ms: self.clock.line_unix_ms(),
        };
        let msg = Message::published(message_id, body, self.identity.cn.clone(), route);
        let origin = Origin {
            conn: self.conn,
            seq: self.replies.next_seq(),
        };
        let receiver: &str = &info.receiver_client_id;
        let status = self.local.with_shard(|shard| match owner {
            None => shard.publish(origin, exchange, routing_key, receiver, &msg, now),
            Some(owner) => {
                shard.publish_for(origin, exchange, routing_key, receiver, owner, &msg, now)
            }
        });
        match status {
            PublishStatus::Done(outcome) => self.replies.publish(msg, outcome, 0, now),
            PublishStatus::Pending { local, remote } => {
                self.replies.publish(msg, local, remote, now)
            }
        };
    }

    fn publish_batch(&mut self, exchange: &str, routing_key: &str, body: &str, now: Instant) {
        let max = self.local.shared.settings.max_batch_elements;
        let elements = match inspect_batch_at_most(body, max) {
            Ok(elements) => elements,
            Err(BatchError::NotAnArray) => {
                let id = &self.identity;
                log_throttled!(info, INVALID.with(|t| t.admit(now)), "refused bodies",
                    { cn = %id.cn, peer = %id.peer, },
                    "publish_batch refused: invalid message: the body is not a JSON array");
                self.replies.line("Error: invalid message");
                return;
            }
            Err(BatchError::TooMany) => {
                self.replies.line(format!(
                    "Error: publish_batch of more than {max} elements (performance.max_batch_elements)"
                ));
                return;
            }
        };
        if elements.is_empty() {
            self.replies.line("OK publish_batch 0");
            return;
        }
        self.weight = elements.len();
        for element in elements {
            let text = element.get();
            match inspect_message(text) {
                Ok(info) => self.publish_one(exchange, routing_key, &info, text, None, true, now),
                Err(MessageError::Unreadable) => {
                    self.log_refused_body(text, now);
                    self.replies.nack("-", NackReason::Invalid);
                }
                Err(MessageError::Invalid { message_id }) => {
                    self.log_refused_body(text, now);
                    self.replies.nack(&message_id, NackReason::Invalid);
                }
            }
        }
    }
}

/// Publishes are dispatched before `command`; keep the match total without a panic.
fn unreachable_publish(session: &mut Session) {
    session
        .replies
        .line("Error: internal: publish routed to the command path");
}
