//! What the simulated clients know, and the invariants judged against it.
//!
//! The model is the clients' side of the contract: what they published and
//! how each publish was answered, what they were delivered and what they
//! acked, which queues they purged or deleted. The shard is never asked
//! what it holds; every check compares what a client saw with what the
//! contract promises.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// The invariants, by the name a failure reports.
pub mod invariant {
    /// Every message whose publish was ACKed is delivered (and acked) at
    /// least once from every queue it was routed to, across any crash,
    /// unless that queue was purged or deleted meanwhile.
    pub const ACKED_NOT_LOST: &str = "acked-not-lost";
    /// A message every publish of which was answered `NACK` is not stored:
    /// once a crash has emptied the broker's memory, it is never delivered
    /// (its records were cut back, or never written).
    pub const NACKED_NOT_STORED: &str = "nacked-not-stored";
    /// A consumer sees a queue's first deliveries in the queue's order, and
    /// a publisher's messages keep their order in each queue.
    pub const FIFO: &str = "fifo";
    /// A message published again under its id while the queue still holds
    /// it, or within the dedup window of its ack, is not stored twice.
    pub const DEDUP_WINDOW: &str = "dedup-window";
    /// A queue a receiver owns delivers only envelopes addressed to that
    /// receiver, and only messages routed to it; nothing appears that no
    /// one published; a deleted queue's messages never come back.
    pub const CONFINEMENT: &str = "confinement";
    /// The bodies a shard holds in memory stay within its budget (plus
    /// what consumers hold unacked), whatever the backlog.
    pub const MEMORY_BUDGET: &str = "memory-budget";
}

/// A broken invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which one ([`invariant`]).
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

fn violation(invariant: &'static str, detail: String) -> Violation {
    Violation { invariant, detail }
}

/// One queue the message was routed to, and what happened to it there.
#[derive(Debug, Clone, Default)]
pub struct Copy {
    /// The queue's incarnation when the message was published (a queue
    /// deleted and declared again is a new one).
    pub incarnation: u32,
    /// Copies the contract allows the queue to store (1, plus one per
    /// publish again that the dedup window does not cover).
    pub allowed: u32,
    /// Sequence numbers delivered from the queue itself.
    pub seqs: BTreeSet<u64>,
    /// When a consumer first acked it, in simulated ms. The first, not the
    /// latest: an ack of a delivery that `ack_wait` had already taken back
    /// (and redelivered) does nothing, so only the first surely counts, and
    /// a window judged from it is never longer than the broker's.
    pub acked_at: Option<u64>,
    /// Purged or deleted meanwhile: not judged for loss, nor for dedup.
    pub exempt: bool,
    /// Acked before a full disk made the queue delete acked segments
    /// without carrying their dedup ids: a publish again may be stored.
    pub forgotten: bool,
    /// Highest delivery count seen: near the limit it may have gone to the
    /// dead-letter queue, whose ack the clients cannot see.
    pub max_count: u32,
}

/// One message id of one publisher.
#[derive(Debug, Clone)]
pub struct MsgModel {
    /// The id.
    pub id: String,
    /// The receiver its envelope names.
    pub to: &'static str,
    /// The exchange and routing key.
    pub exchange: &'static str,
    /// Routing key.
    pub key: &'static str,
    /// Publishing connection and its counter (publish order).
    pub conn: u64,
    /// Position in that connection's publishes.
    pub n: u64,
    /// Publishes of it so far.
    pub attempts: u32,
    /// Publishes still unanswered.
    pub in_flight: u32,
    /// Some publish of it was ACKed.
    pub acked: bool,
    /// Model time ([`Model::now`]) of its first publish.
    pub first_sent: u64,
    /// Model time of the last answer to a publish of it.
    pub answered_at: u64,
    /// Judged by [`invariant::NACKED_NOT_STORED`] since the last crash:
    /// see [`Model::crashed`].
    pub refused: bool,
    /// A crash came while its refused bytes might still be on disk: the
    /// restart may have served it again, so it is never judged.
    pub may_return: bool,
    /// Every queue it routes to (by index), with its copies.
    pub copies: BTreeMap<usize, Copy>,
}

/// What the clients know, and the checks.
#[derive(Debug, Default)]
pub struct Model {
    /// Messages, by index.
    pub msgs: Vec<MsgModel>,
    /// Index of a message id.
    pub by_id: HashMap<String, usize>,
    /// Per queue index: current incarnation.
    pub incarnation: Vec<u32>,
    /// Per (connection, queue, incarnation, fetched): the last
    /// first-delivery's sequence number. Push deliveries and fetches are
    /// two consumers: a fetch waiting for a backlog read takes older
    /// messages while newer ones are pushed.
    first_seen: HashMap<(u64, usize, u32, bool), u64>,
    /// Per (queue, incarnation, publishing connection): n → seq of
    /// messages published once and ACKed.
    order: HashMap<(usize, u32, u64), BTreeMap<u64, u64>>,
    /// Publishes and answers so far: the model's clock of events.
    now: u64,
}

impl Model {
    /// A model of `queues` queues.
    pub fn new(queues: usize) -> Model {
        Model {
            incarnation: vec![0; queues],
            ..Model::default()
        }
    }

    /// A first publish of a new message routed to `targets`.
    #[allow(clippy::too_many_arguments)]
    pub fn published(
        &mut self,
        id: String,
        to: &'static str,
        exchange: &'static str,
        key: &'static str,
        conn: u64,
        n: u64,
        targets: &[usize],
    ) -> usize {
        let copies = targets
            .iter()
            .map(|&q| {
                (
                    q,
                    Copy {
                        incarnation: self.incarnation[q],
                        allowed: 1,
                        ..Copy::default()
                    },
                )
            })
            .collect();
        let index = self.msgs.len();
        self.now += 1;
        self.by_id.insert(id.clone(), index);
        self.msgs.push(MsgModel {
            id,
            to,
            exchange,
            key,
            conn,
            n,
            attempts: 1,
            in_flight: 1,
            acked: false,
            first_sent: self.now,
            answered_at: 0,
            refused: false,
            may_return: false,
            copies,
        });
        index
    }

    /// A publish again of message `m` (same id, same route) at `now_ms`:
    /// each queue may store one more copy unless its dedup window surely
    /// covers the id (the message is still held, or was acked well within
    /// the window).
    pub fn published_again(
        &mut self,
        m: usize,
        now_ms: u64,
        window: Duration,
        max_deliveries: u32,
    ) {
        let margin = 2_000;
        let window_ms = window.as_millis() as u64;
        let msg = &mut self.msgs[m];
        msg.attempts += 1;
        msg.in_flight += 1;
        msg.refused = false;
        let acked = msg.acked;
        for copy in msg.copies.values_mut() {
            let covered = acked
                && !copy.exempt
                && !copy.forgotten
                && copy.max_count + 1 < max_deliveries
                && match copy.acked_at {
                    None => true,
                    Some(at) => now_ms + margin < at + window_ms,
                };
            if !covered {
                copy.allowed += 1;
            }
        }
    }

    /// A publish of `m` was answered.
    pub fn answered(&mut self, m: usize, acked: bool) {
        self.now += 1;
        let msg = &mut self.msgs[m];
        msg.in_flight -= 1;
        msg.acked |= acked;
        msg.answered_at = self.now;
    }

    /// The broker crashed: what it held only in memory is gone. A message
    /// is judged refused from now on (it must never be delivered again)
    /// when every publish of it was answered `NACK`, it was routed to one
    /// queue and never delivered, and a message first published to that
    /// queue after its last `NACK` was `ACK`ed before the crash. That
    /// `ACK` came from a commit taken after the failure was known, so the
    /// failed bytes were cut back durably before it. Without such an
    /// `ACK`, a failed write that reached the disk after all may be served
    /// once more (docs/PROTOCOL.md, "Failed writes"), and from then on the
    /// message is never judged. A message delivered before its commit
    /// failed stays owed to its consumer and may be dead-lettered from
    /// there; one routed to several queues is answered `NACK` when any copy
    /// failed, the others stored: neither is judged.
    pub fn crashed(&mut self) {
        self.memory_lost(None);
    }

    /// What queues `queues` held in memory is gone (all queues: `None`),
    /// their state to be read back from disk, as after a crash: an owner's
    /// queues leaving for a move do the same (see [`Model::crashed`]).
    pub fn memory_lost(&mut self, queues: Option<&[usize]>) {
        let mut cut_back: HashMap<(usize, u32), u64> = HashMap::new();
        for msg in self.msgs.iter().filter(|m| m.acked) {
            for (&q, copy) in &msg.copies {
                let latest = cut_back.entry((q, copy.incarnation)).or_default();
                *latest = (*latest).max(msg.first_sent);
            }
        }
        for msg in &mut self.msgs {
            let mut copies = msg.copies.iter();
            let only = match (copies.next(), copies.next()) {
                (Some((&q, copy)), None) => Some((q, copy)),
                _ => None,
            };
            let Some((q, copy)) = only else { continue };
            if queues.is_some_and(|lost| !lost.contains(&q)) {
                continue;
            }
            msg.refused = false;
            if msg.in_flight > 0 || msg.acked || !copy.seqs.is_empty() || msg.may_return {
                continue;
            }
            let was_cut = cut_back
                .get(&(q, copy.incarnation))
                .is_some_and(|&sent| sent > msg.answered_at);
            msg.refused = was_cut;
            msg.may_return = !was_cut;
        }
    }

    /// Queue `q` was purged: what it held is not judged any more.
    pub fn purged(&mut self, q: usize) {
        let incarnation = self.incarnation[q];
        for msg in &mut self.msgs {
            if let Some(copy) = msg.copies.get_mut(&q) {
                if copy.incarnation == incarnation {
                    copy.exempt = true;
                }
            }
        }
    }

    /// Queue `q` deleted acked segments without carrying their dedup ids
    /// (its disk was full): every id acked there so far may be forgotten.
    pub fn dedup_forgotten(&mut self, q: usize) {
        let incarnation = self.incarnation[q];
        for msg in &mut self.msgs {
            if let Some(copy) = msg.copies.get_mut(&q) {
                if copy.incarnation == incarnation && copy.acked_at.is_some() {
                    copy.forgotten = true;
                }
            }
        }
    }

    /// Queue `q` was deleted (its deletion answered, or a restart
    /// finished it): a new declaration is a new queue.
    pub fn deleted(&mut self, q: usize) {
        self.purged(q);
        self.incarnation[q] += 1;
    }

    /// A delivery to connection `conn` (`fetched`: answering a fetch, else
    /// pushed to its consumer) from queue `q` (`dlq`: from its dead-letter
    /// queue) of message `id` with `seq` and `count`; `owner` is the
    /// queue's owner.
    #[allow(clippy::too_many_arguments)]
    pub fn delivered(
        &mut self,
        conn: u64,
        fetched: bool,
        q: usize,
        dlq: bool,
        owner: &str,
        id: &str,
        seq: u64,
        count: u32,
    ) -> Result<usize, Violation> {
        let Some(&m) = self.by_id.get(id) else {
            return Err(violation(
                invariant::CONFINEMENT,
                format!("delivered message {id} that no client published"),
            ));
        };
        let incarnation = self.incarnation[q];
        let msg = &mut self.msgs[m];
        if msg.refused {
            return Err(violation(
                invariant::NACKED_NOT_STORED,
                format!(
                    "queue {q} delivered {id} after a crash, though each of its {} publishes was answered NACK",
                    msg.attempts
                ),
            ));
        }
        if msg.to != owner {
            return Err(violation(
                invariant::CONFINEMENT,
                format!(
                    "queue {q} of {owner} delivered {id}, addressed to {}",
                    msg.to
                ),
            ));
        }
        let Some(copy) = msg.copies.get_mut(&q) else {
            return Err(violation(
                invariant::CONFINEMENT,
                format!("queue {q} delivered {id}, which was never routed to it"),
            ));
        };
        // A dead-letter queue outlives its source's deletion: it may hold
        // messages of any earlier incarnation.
        if copy.incarnation != incarnation && !dlq {
            return Err(violation(
                invariant::CONFINEMENT,
                format!(
                    "queue {q} (incarnation {incarnation}) delivered {id} of its deleted incarnation {}",
                    copy.incarnation
                ),
            ));
        }
        copy.max_count = copy.max_count.max(count);
        if dlq {
            return Ok(m);
        }
        copy.seqs.insert(seq);
        if copy.seqs.len() as u32 > copy.allowed && !copy.exempt {
            return Err(violation(
                invariant::DEDUP_WINDOW,
                format!(
                    "{id} stored {} times in queue {q} (seqs {:?}), {} allowed after {} publishes",
                    copy.seqs.len(),
                    copy.seqs,
                    copy.allowed,
                    msg.attempts
                ),
            ));
        }
        if count == 1 {
            if let Some(&last) = self.first_seen.get(&(conn, q, incarnation, fetched)) {
                if seq <= last {
                    return Err(violation(
                        invariant::FIFO,
                        format!(
                            "connection {conn} got {id} (seq {seq}, fetched: {fetched}) from queue {q} first after seq {last}"
                        ),
                    ));
                }
            }
            self.first_seen.insert((conn, q, incarnation, fetched), seq);
        }
        if msg.attempts == 1 && msg.acked && copy.seqs.len() == 1 {
            let order = self.order.entry((q, incarnation, msg.conn)).or_default();
            order.insert(msg.n, seq);
            let before = order.range(..msg.n).next_back();
            let after = order.range(msg.n + 1..).next();
            if before.is_some_and(|(_, &s)| s >= seq) || after.is_some_and(|(_, &s)| s <= seq) {
                return Err(violation(
                    invariant::FIFO,
                    format!(
                        "publisher {}'s message {} has seq {seq} in queue {q}, out of its publish order (before: {before:?}, after: {after:?})",
                        msg.conn, msg.n
                    ),
                ));
            }
        }
        Ok(m)
    }

    /// A consumer acked message `m` from queue `q` at `now_ms`.
    pub fn acked(&mut self, m: usize, q: usize, now_ms: u64) {
        if let Some(copy) = self.msgs[m].copies.get_mut(&q) {
            copy.acked_at.get_or_insert(now_ms);
        }
    }

    /// A restart: every connection is new.
    pub fn restarted(&mut self) {
        self.first_seen.clear();
    }

    /// Queue `q` came back from a move: recovered from its directory as a
    /// restart recovers it, so its seqs go on from what its log still
    /// records (from 0 when every segment had been acked and deleted).
    /// Orders are compared from here on, as after a restart; the
    /// publishers' connections, unlike a restart's, lived through it.
    pub fn queue_moved(&mut self, q: usize) {
        self.first_seen.retain(|&(_, oq, _, _), _| oq != q);
        self.order.retain(|&(oq, _, _), _| oq != q);
    }

    /// After the final drain: every ACKed publish was consumed from every
    /// queue it was routed to that was not purged or deleted since.
    pub fn check_nothing_lost(&self, queue_names: &[String]) -> Result<(), Violation> {
        for msg in &self.msgs {
            if !msg.acked {
                continue;
            }
            for (&q, copy) in &msg.copies {
                let gone = copy.exempt || copy.incarnation != self.incarnation[q];
                if !gone && copy.acked_at.is_none() {
                    return Err(violation(
                        invariant::ACKED_NOT_LOST,
                        format!(
                            "{} (publish ACKed, {} publishes) never reached a consumer of {} after the final drain (delivered seqs {:?})",
                            msg.id, msg.attempts, queue_names[q], copy.seqs
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
