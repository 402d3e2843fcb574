//! The sender's bookkeeping of publishes, without I/O or a clock of its own: what is
//! ready to send, what waits for a retry, and what awaits its reply.
//!
//! Replies come strictly in command order (docs/PROTOCOL.md, "Replies"), so the reply
//! at the head of the stream always belongs to the oldest publish in flight; an
//! `ACK`/`NACK` naming another id means the two sides disagree and the connection
//! must be replaced. A retriable `NACK` (`rate_limited`, `queue_full`, `storage`,
//! `timeout`) or a publish left without reply past the ACK timeout costs one attempt
//! and waits an exponential backoff; past `max_retries` the message fails. A lost
//! connection puts every publish in flight back at the head of the queue without
//! costing an attempt: re-publishing is safe because the broker deduplicates per
//! sender and message id.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use ciphermq_proto::{NackReason, Reply};

use crate::backoff::Backoff;

/// One encrypted message, ready to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Its message id, matched against the `ACK`/`NACK` that settles it.
    pub message_id: String,
    /// The whole `publish <exchange> <key> <json>\n` line, newline included, kept
    /// for re-publishing.
    pub line: String,
    /// Publishes of it that were refused with a retriable reason or timed out.
    pub attempts: u32,
    /// Whether it was written to a connection at least once (for the `sent` count).
    pub sent: bool,
}

impl Outgoing {
    /// A message never sent.
    pub fn new(message_id: String, line: String) -> Outgoing {
        Outgoing {
            message_id,
            line,
            attempts: 0,
            sent: false,
        }
    }
}

/// What a reply or a timeout did to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// `ACK`: durable at the broker.
    Acked {
        /// The message id.
        message_id: String,
    },
    /// Refused or unanswered for a reason worth retrying; scheduled again.
    Retrying {
        /// The message id.
        message_id: String,
        /// The NACK reason, or `ack timeout`.
        reason: String,
        /// Failed attempts so far (1 for the first retry).
        attempt: u32,
        /// How long it waits before the next publish.
        delay: Duration,
    },
    /// Given up: a permanent refusal, or retries exhausted.
    Failed {
        /// The message id.
        message_id: String,
        /// Why, for the log and the report.
        reason: String,
    },
    /// A line that answers no publish (a push delivery): nothing changed.
    Ignored,
}

/// The reply stream no longer matches the commands sent: replace the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Desync {
    /// A reply arrived with nothing in flight.
    #[error("unexpected reply with no publish in flight: {0:?}")]
    Unsolicited(String),
    /// The reply names another message than the oldest one in flight.
    #[error("reply for {got:?} while {expected:?} was the oldest publish in flight")]
    Mismatch {
        /// The oldest message in flight.
        expected: String,
        /// The id in the reply.
        got: String,
    },
}

/// Ready, waiting and in-flight publishes.
#[derive(Debug)]
pub struct Outbox {
    /// Publishes to send now, oldest first.
    ready: VecDeque<Outgoing>,
    /// Publishes waiting for their retry time; the `u64` keeps equal times apart
    /// in arrival order.
    waiting: BTreeMap<(Instant, u64), Outgoing>,
    /// Next tiebreaker for `waiting`.
    waiting_seq: u64,
    /// Publishes written and not yet answered, in command order, with the time
    /// they were written.
    inflight: VecDeque<(Outgoing, Instant)>,
    /// Failed attempts allowed before a message fails.
    max_retries: u32,
    /// Delay before a retry.
    backoff: Backoff,
}

impl Outbox {
    /// An empty outbox.
    pub fn new(max_retries: u32, backoff: Backoff) -> Outbox {
        Outbox {
            ready: VecDeque::new(),
            waiting: BTreeMap::new(),
            waiting_seq: 0,
            inflight: VecDeque::new(),
            max_retries,
            backoff,
        }
    }

    /// Adds a new message behind the ready ones.
    pub fn push(&mut self, msg: Outgoing) {
        self.ready.push_back(msg);
    }

    /// The next message to write at `now`: due retries first (they are older),
    /// then ready ones. The caller writes its line and calls [`Outbox::mark_sent`].
    pub fn next_to_send(&mut self, now: Instant) -> Option<Outgoing> {
        if let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 <= now {
                return Some(entry.remove());
            }
        }
        self.ready.pop_front()
    }

    /// Records that `msg` was written at `now`; true on its first publish.
    pub fn mark_sent(&mut self, mut msg: Outgoing, now: Instant) -> bool {
        let first = !msg.sent;
        msg.sent = true;
        self.inflight.push_back((msg, now));
        first
    }

    /// Applies one line read from the connection to the oldest publish in flight.
    pub fn on_reply(&mut self, line: &str, now: Instant) -> Result<Settled, Desync> {
        let reply = Reply::parse(line);
        if matches!(reply, Reply::Message(_)) {
            return Ok(Settled::Ignored);
        }
        let Some((msg, at)) = self.inflight.pop_front() else {
            return Err(Desync::Unsolicited(line.to_owned()));
        };
        let named = match &reply {
            Reply::Ack(id) => Some(*id),
            Reply::Nack { message_id, .. } => Some(*message_id),
            _ => None,
        };
        if let Some(id) = named {
            if id != msg.message_id {
                let expected = msg.message_id.clone();
                self.inflight.push_front((msg, at));
                return Err(Desync::Mismatch {
                    expected,
                    got: id.to_owned(),
                });
            }
        }
        Ok(match reply {
            Reply::Ack(_) => Settled::Acked {
                message_id: msg.message_id,
            },
            Reply::Nack { reason, .. } => match NackReason::parse(reason) {
                Some(r) if r.is_retriable() => self.retry_or_fail(msg, r.as_str(), now),
                _ => Settled::Failed {
                    message_id: msg.message_id,
                    reason: format!("refused by the broker: {reason}"),
                },
            },
            // Not a publish reply (`Error: line too long`, `Access denied`, …): the
            // broker answered this publish with a permanent refusal.
            _ => Settled::Failed {
                message_id: msg.message_id,
                reason: format!("refused by the broker: {line}"),
            },
        })
    }

    /// Whether the oldest publish in flight has waited `ack_timeout` or more.
    pub fn timed_out(&self, now: Instant, ack_timeout: Duration) -> bool {
        self.inflight
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= ack_timeout)
    }

    /// The connection is gone (or stuck): every publish in flight goes back. Those
    /// that waited `ack_timeout` or more cost an attempt; the others return to the
    /// head of the ready queue in their order.
    pub fn connection_lost(&mut self, now: Instant, ack_timeout: Duration) -> Vec<Settled> {
        let mut settled = Vec::new();
        let mut back = Vec::new();
        for (msg, at) in std::mem::take(&mut self.inflight) {
            if now.saturating_duration_since(at) >= ack_timeout {
                settled.push(self.retry_or_fail(msg, "ack timeout", now));
            } else {
                back.push(msg);
            }
        }
        for msg in back.into_iter().rev() {
            self.ready.push_front(msg);
        }
        settled
    }

    /// When the next waiting retry is due.
    pub fn next_retry_at(&self) -> Option<Instant> {
        self.waiting.first_key_value().map(|((at, _), _)| *at)
    }

    /// When the oldest publish in flight was written.
    pub fn oldest_inflight_at(&self) -> Option<Instant> {
        self.inflight.front().map(|(_, at)| *at)
    }

    /// Publishes awaiting their reply.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Messages not in flight: ready or waiting for a retry.
    pub fn queued(&self) -> usize {
        self.ready.len() + self.waiting.len()
    }

    /// Nothing ready, waiting or in flight.
    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty() && self.ready.is_empty() && self.waiting.is_empty()
    }

    /// Drops every message not in flight (on shutdown); returns how many.
    pub fn abandon_queued(&mut self) -> usize {
        let n = self.queued();
        self.ready.clear();
        self.waiting.clear();
        n
    }

    /// Counts a failed attempt: schedules a retry, or fails past `max_retries`.
    fn retry_or_fail(&mut self, mut msg: Outgoing, reason: &str, now: Instant) -> Settled {
        msg.attempts += 1;
        if msg.attempts > self.max_retries {
            return Settled::Failed {
                message_id: msg.message_id,
                reason: format!("{reason}; gave up after {} retries", self.max_retries),
            };
        }
        let delay = self.backoff.delay(msg.attempts);
        let settled = Settled::Retrying {
            message_id: msg.message_id.clone(),
            reason: reason.to_owned(),
            attempt: msg.attempts,
            delay,
        };
        self.waiting.insert((now + delay, self.waiting_seq), msg);
        self.waiting_seq += 1;
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(max_retries: u32) -> Outbox {
        Outbox::new(
            max_retries,
            Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        )
    }

    fn msg(id: &str) -> Outgoing {
        Outgoing::new(
            id.to_owned(),
            format!("publish ex k {{\"message_id\":\"{id}\"}}\n"),
        )
    }

    /// Sends everything sendable at `now`; returns the ids in order.
    fn send_all(o: &mut Outbox, now: Instant) -> Vec<String> {
        let mut ids = Vec::new();
        while let Some(m) = o.next_to_send(now) {
            ids.push(m.message_id.clone());
            o.mark_sent(m, now);
        }
        ids
    }

    #[test]
    fn acks_settle_in_order() {
        let t = Instant::now();
        let mut o = outbox(3);
        o.push(msg("a"));
        o.push(msg("b"));
        assert_eq!(send_all(&mut o, t), ["a", "b"]);
        assert_eq!(o.inflight(), 2);
        assert_eq!(
            o.on_reply("ACK a", t),
            Ok(Settled::Acked {
                message_id: "a".into()
            })
        );
        assert_eq!(o.on_reply("Message: x q 1 {}", t), Ok(Settled::Ignored));
        assert!(matches!(
            o.on_reply("ACK a", t),
            Err(Desync::Mismatch { .. })
        ));
    }

    #[test]
    fn unsolicited_reply_is_a_desync() {
        let mut o = outbox(3);
        assert!(matches!(
            o.on_reply("ACK a", Instant::now()),
            Err(Desync::Unsolicited(_))
        ));
    }

    #[test]
    fn retriable_nack_waits_then_fails_after_max_retries() {
        let t = Instant::now();
        let mut o = outbox(2);
        o.push(msg("a"));
        let mut now = t;
        for attempt in 1..=2 {
            assert_eq!(send_all(&mut o, now), ["a"]);
            match o.on_reply("NACK a queue_full", now).unwrap() {
                Settled::Retrying {
                    attempt: got,
                    delay,
                    ..
                } => {
                    assert_eq!(got, attempt);
                    // Not due before its delay.
                    assert!(o.next_to_send(now).is_none() || delay.is_zero());
                    now += delay;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(send_all(&mut o, now), ["a"]);
        assert!(matches!(
            o.on_reply("NACK a queue_full", now).unwrap(),
            Settled::Failed { .. }
        ));
        assert!(o.is_empty());
    }

    #[test]
    fn permanent_refusals_fail_at_once() {
        let t = Instant::now();
        let mut o = outbox(5);
        for id in ["a", "b", "c"] {
            o.push(msg(id));
        }
        send_all(&mut o, t);
        assert!(matches!(
            o.on_reply("NACK a no_route", t).unwrap(),
            Settled::Failed { .. }
        ));
        assert!(matches!(
            o.on_reply("NACK b some_new_reason", t).unwrap(),
            Settled::Failed { .. }
        ));
        assert!(matches!(
            o.on_reply("Error: line too long", t).unwrap(),
            Settled::Failed { .. }
        ));
        assert!(o.is_empty());
    }

    #[test]
    fn connection_loss_requeues_in_order_without_cost() {
        let t = Instant::now();
        let mut o = outbox(0);
        for id in ["a", "b", "c"] {
            o.push(msg(id));
        }
        let first = o.next_to_send(t).unwrap();
        assert!(o.mark_sent(first, t));
        let second = o.next_to_send(t).unwrap();
        o.mark_sent(second, t);
        assert!(o.connection_lost(t, Duration::from_secs(10)).is_empty());
        assert_eq!(o.inflight(), 0);
        let again = o.next_to_send(t).unwrap();
        assert_eq!(again.message_id, "a");
        // A re-publish is not a first publish.
        assert!(!o.mark_sent(again, t));
        assert_eq!(send_all(&mut o, t), ["b", "c"]);
    }

    #[test]
    fn timeouts_cost_an_attempt() {
        let t = Instant::now();
        let timeout = Duration::from_secs(5);
        let mut o = outbox(1);
        o.push(msg("old"));
        send_all(&mut o, t);
        o.push(msg("new"));
        send_all(&mut o, t + Duration::from_secs(4));
        let later = t + timeout;
        assert!(o.timed_out(later, timeout));
        let settled = o.connection_lost(later, timeout);
        assert!(
            matches!(&settled[..], [Settled::Retrying { message_id, attempt: 1, .. }] if message_id == "old")
        );
        // "new" is ready at once; "old" waits for its backoff.
        assert_eq!(send_all(&mut o, later), ["new"]);
        let due = o.next_retry_at().unwrap();
        assert_eq!(send_all(&mut o, due), ["old"]);
        // A second timeout exceeds max_retries = 1.
        let settled = o.connection_lost(due + timeout, timeout);
        assert_eq!(settled.len(), 2);
        assert!(settled
            .iter()
            .all(|s| matches!(s, Settled::Failed { .. } | Settled::Retrying { .. })));
        assert!(settled
            .iter()
            .any(|s| matches!(s, Settled::Failed { message_id, .. } if message_id == "old")));
    }
}
