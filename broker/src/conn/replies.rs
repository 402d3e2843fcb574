//! The reply reorder buffer: replies leave strictly in command order, even when
//! a publish finishes on another shard after later commands did.
//!
//! Each command takes one or more numbered slots (one per `publish_batch`
//! element); a slot is either ready or waiting for completions from shards.
//! Push deliveries join at the tail as ready slots, so they never overtake
//! the `OK consume` that started them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use ciphermq_proto::delivery::{format_u32, write_delivery};
use ciphermq_proto::reply::{write_ack, write_line, write_nack};
use ciphermq_proto::NackReason;
use ciphermq_shard::{Completion, Delivery, Message};
use ciphermq_stats as stats;

/// One reply (or group of lines) in the making.
#[derive(Debug)]
enum Slot {
    /// A finished line (without newline).
    Line(String),
    /// A publish: `ACK`/`NACK` once `waiting` shards reported.
    Publish {
        msg: Arc<Message>,
        outcome: Result<(), NackReason>,
        waiting: u32,
        /// When the broker began handling the publish's line, for the
        /// publish-to-ACK latency.
        accepted: Instant,
    },
    /// A refused publish whose message was never built.
    Nack {
        message_id: String,
        reason: NackReason,
    },
    /// `OK consume <q>` once the queue's shard registered the consumer.
    Consume { queue: Arc<str>, waiting: bool },
    /// Deliveries then `OK fetch <n>`, once the queue's shard answered.
    /// A large fetch is rendered over several calls: `rendered` says how
    /// many of its deliveries are out already.
    Fetch {
        deliveries: Option<Vec<Delivery>>,
        rendered: usize,
    },
    /// `OK purge_queue <q> <n>` once the queue's shard purged it and its
    /// records are durable.
    Purge {
        queue: Arc<str>,
        purged: Option<(u64, Result<(), NackReason>)>,
    },
    /// A push delivery.
    Delivery(Delivery),
    /// A line decided off the shard (a key registration waiting for its
    /// store); `None` until it is.
    Pending(Option<String>),
}

impl Slot {
    /// The memory this slot holds: its own size, the strings it owns, and
    /// the bodies it keeps alive until it is written (a publish's message,
    /// a fetch's or a push delivery's). A body shared with a queue is
    /// counted as well: it stays pinned as long as the reply waits.
    fn held_bytes(&self) -> usize {
        const SLOT: usize = std::mem::size_of::<Slot>();
        SLOT + match self {
            Slot::Line(line) | Slot::Pending(Some(line)) => line.capacity(),
            Slot::Publish { msg, .. } => message_bytes(msg),
            Slot::Nack { message_id, .. } => message_id.capacity(),
            Slot::Fetch {
                deliveries: Some(deliveries),
                ..
            } => deliveries
                .iter()
                .map(|d| std::mem::size_of::<Delivery>() + message_bytes(&d.msg))
                .sum(),
            Slot::Delivery(d) => message_bytes(&d.msg),
            Slot::Consume { .. }
            | Slot::Fetch { .. }
            | Slot::Purge { .. }
            | Slot::Pending(None) => 0,
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Slot::Publish { waiting, .. } => *waiting == 0,
            Slot::Consume { waiting, .. } => !waiting,
            Slot::Fetch { deliveries, .. } => deliveries.is_some(),
            Slot::Purge { purged, .. } => purged.is_some(),
            Slot::Pending(line) => line.is_some(),
            _ => true,
        }
    }
}

/// What a message held by a reply costs: its body and id, and the
/// message's own bookkeeping.
fn message_bytes(msg: &Message) -> usize {
    std::mem::size_of::<Message>() + msg.body().len() + msg.message_id().len()
}

/// Replies owed by one connection, in command order.
#[derive(Debug, Default)]
pub(crate) struct ReplyQueue {
    slots: VecDeque<Slot>,
    /// Sequence number of `slots[0]`.
    base: u64,
    /// Slots still waiting on another shard.
    waiting: usize,
    /// The sum of the slots' [`Slot::held_bytes`]: what the connection pins
    /// until its client reads (`performance.max_pending_reply_bytes`).
    held: usize,
}

impl ReplyQueue {
    /// Slots not yet written (ready or not).
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Bytes the slots not yet written hold (see [`Slot::held_bytes`]).
    pub(crate) fn held_bytes(&self) -> usize {
        self.held
    }

    /// Whether every reply was written.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slots waiting for another shard.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether the head slot can be written.
    pub(crate) fn head_ready(&self) -> bool {
        self.slots.front().is_some_and(Slot::is_ready)
    }

    /// The sequence number the next slot will get.
    pub(crate) fn next_seq(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    fn push(&mut self, slot: Slot) -> u64 {
        let seq = self.next_seq();
        if !slot.is_ready() {
            self.waiting += 1;
        }
        self.held += slot.held_bytes();
        self.slots.push_back(slot);
        seq
    }

    /// A finished line.
    pub(crate) fn line(&mut self, line: impl Into<String>) -> u64 {
        self.push(Slot::Line(line.into()))
    }

    /// A publish refused before a message was built.
    pub(crate) fn nack(&mut self, message_id: &str, reason: NackReason) -> u64 {
        self.push(Slot::Nack {
            message_id: message_id.to_owned(),
            reason,
        })
    }

    /// A publish accepted at `accepted`: `local` is the outcome so far,
    /// `waiting` the shards still to report.
    pub(crate) fn publish(
        &mut self,
        msg: Arc<Message>,
        local: Result<(), NackReason>,
        waiting: u32,
        accepted: Instant,
    ) -> u64 {
        self.push(Slot::Publish {
            msg,
            outcome: local,
            waiting,
            accepted,
        })
    }

    /// A consume, finished or waiting for the queue's shard.
    pub(crate) fn consume(&mut self, queue: Arc<str>, waiting: bool) -> u64 {
        self.push(Slot::Consume { queue, waiting })
    }

    /// A fetch, finished (`Some`) or waiting for the queue's shard.
    pub(crate) fn fetch(&mut self, deliveries: Option<Vec<Delivery>>) -> u64 {
        self.push(Slot::Fetch {
            deliveries,
            rendered: 0,
        })
    }

    /// A purge, finished (`Some`) or waiting for the queue's shard.
    pub(crate) fn purge(
        &mut self,
        queue: Arc<str>,
        purged: Option<(u64, Result<(), NackReason>)>,
    ) -> u64 {
        self.push(Slot::Purge { queue, purged })
    }

    /// A line to be decided later with [`ReplyQueue::fill`].
    pub(crate) fn pending(&mut self) -> u64 {
        self.push(Slot::Pending(None))
    }

    /// Decides the line of a [`ReplyQueue::pending`] slot.
    pub(crate) fn fill(&mut self, seq: u64, line: String) {
        let Some(index) = seq.checked_sub(self.base) else {
            return;
        };
        if let Some(slot @ Slot::Pending(None)) = self.slots.get_mut(index as usize) {
            self.held -= slot.held_bytes();
            *slot = Slot::Pending(Some(line));
            self.held += slot.held_bytes();
            self.waiting -= 1;
        }
    }

    /// A push delivery.
    pub(crate) fn delivery(&mut self, delivery: Delivery) {
        self.push(Slot::Delivery(delivery));
    }

    /// Applies a shard's report to slot `seq`; returns the fetched deliveries
    /// so the connection can track them.
    pub(crate) fn complete(&mut self, seq: u64, completion: Completion) -> Option<&[Delivery]> {
        let index = seq.checked_sub(self.base)? as usize;
        let slot = self.slots.get_mut(index)?;
        let was_ready = slot.is_ready();
        let held_before = slot.held_bytes();
        match (slot, completion) {
            (
                Slot::Publish {
                    outcome, waiting, ..
                },
                Completion::Enqueued(result),
            ) => {
                *outcome = outcome.and(result);
                *waiting = waiting.saturating_sub(1);
            }
            (Slot::Consume { waiting, .. }, Completion::Consumed) => *waiting = false,
            (Slot::Fetch { deliveries, .. }, Completion::Fetched(got)) => *deliveries = Some(got),
            (Slot::Purge { purged, .. }, Completion::Purged { count, durable }) => {
                *purged = Some((count, durable))
            }
            _ => return None,
        }
        let slot = &self.slots[index];
        self.held = self.held - held_before + slot.held_bytes();
        if !was_ready && slot.is_ready() {
            self.waiting -= 1;
        }
        match slot {
            Slot::Fetch {
                deliveries: Some(d),
                ..
            } => Some(d),
            _ => None,
        }
    }

    /// Writes ready slots from the head into `out` until one is not ready or
    /// `out` reaches `limit` bytes (a fetch may stop between its deliveries
    /// and go on at the next call, so one reply never needs more than about
    /// `limit` bytes of buffer). Returns how many slots were written whole.
    pub(crate) fn render(&mut self, out: &mut Vec<u8>, limit: usize) -> usize {
        let mut written = 0;
        let mut clock = stats::LazyClock::default();
        while out.len() < limit && self.head_ready() {
            if let Some(Slot::Fetch {
                deliveries: Some(deliveries),
                rendered,
            }) = self.slots.front_mut()
            {
                while *rendered < deliveries.len() && out.len() < limit {
                    write_delivery_line(out, &deliveries[*rendered]);
                    *rendered += 1;
                }
                if *rendered < deliveries.len() {
                    break;
                }
            }
            let Some(slot) = self.slots.pop_front() else {
                break;
            };
            self.held -= slot.held_bytes();
            self.base += 1;
            written += 1;
            match &slot {
                Slot::Publish {
                    outcome, accepted, ..
                } => stats::publish_answered(*accepted, outcome, &mut clock),
                Slot::Nack { reason, .. } => stats::publish_nacked(*reason),
                _ => {}
            }
            match slot {
                Slot::Line(line) => write_line(out, &[&line]),
                Slot::Publish {
                    msg,
                    outcome: Ok(()),
                    ..
                } => write_ack(out, msg.message_id()),
                Slot::Publish {
                    msg,
                    outcome: Err(reason),
                    ..
                } => write_nack(out, msg.message_id(), reason),
                Slot::Nack { message_id, reason } => write_nack(out, &message_id, reason),
                Slot::Consume { queue, .. } => write_line(out, &["OK consume ", &queue]),
                Slot::Fetch { deliveries, .. } => {
                    // Its deliveries are out (above); the count ends it.
                    let deliveries = deliveries.unwrap_or_default();
                    let mut digits = [0u8; 10];
                    out.extend_from_slice(b"OK fetch ");
                    out.extend_from_slice(format_u32(deliveries.len() as u32, &mut digits));
                    out.push(b'\n');
                }
                Slot::Purge { queue, purged } => {
                    let line = match purged {
                        Some((n, Ok(()))) => format!("OK purge_queue {queue} {n}"),
                        Some((n, Err(reason))) => format!(
                            "Error: purge_queue {queue}: {n} messages purged, but writing that to the log failed ({}); the broker writes it again, and until then a restart may bring them back",
                            reason.as_str()
                        ),
                        None => format!("Error: purge_queue {queue}: no answer"),
                    };
                    write_line(out, &[&line]);
                }
                Slot::Delivery(d) => write_delivery_line(out, &d),
                Slot::Pending(line) => write_line(out, &[line.as_deref().unwrap_or_default()]),
            }
        }
        written
    }
}

fn write_delivery_line(out: &mut Vec<u8>, d: &Delivery) {
    stats::delivered(1);
    write_delivery(
        out,
        d.msg.message_id(),
        &d.queue,
        d.count,
        d.msg.body().as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str) -> Arc<Message> {
        Message::new(id, "{}", Arc::from("s"))
    }

    #[test]
    fn replies_leave_in_command_order() {
        let mut q = ReplyQueue::default();
        let a = q.publish(msg("a"), Ok(()), 1, Instant::now());
        q.publish(msg("b"), Ok(()), 0, Instant::now());
        q.line("OK heartbeat");
        let mut out = Vec::new();
        assert_eq!(q.render(&mut out, usize::MAX), 0, "head still waits");
        assert_eq!(q.waiting(), 1);
        q.complete(a, Completion::Enqueued(Err(NackReason::QueueFull)));
        assert_eq!(q.render(&mut out, usize::MAX), 3);
        assert_eq!(out, b"NACK a queue_full\nACK b\nOK heartbeat\n");
        assert!(q.is_empty());
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn fetch_renders_deliveries_then_count() {
        let mut q = ReplyQueue::default();
        let seq = q.fetch(None);
        let d = Delivery {
            queue: Arc::from("q"),
            shard: 0,
            seq: 0,
            count: 1,
            msg: msg("m"),
        };
        assert!(q.complete(seq, Completion::Fetched(vec![d])).is_some());
        let mut out = Vec::new();
        q.render(&mut out, usize::MAX);
        assert_eq!(out, b"Message: m q 1 {}\nOK fetch 1\n");
    }

    /// What the reply queue pins is counted from push to render: a
    /// publish's body while its `ACK` waits, a fetch's bodies once they
    /// arrive, and nothing once everything is written.
    #[test]
    fn held_bytes_follow_what_the_replies_keep_alive() {
        let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(100_000));
        let big = Message::new("big", &body, Arc::from("s"));
        let mut q = ReplyQueue::default();
        assert_eq!(q.held_bytes(), 0);
        let waiting = q.publish(big.clone(), Ok(()), 1, Instant::now());
        assert!(q.held_bytes() >= 100_000, "{}", q.held_bytes());
        let after_publish = q.held_bytes();
        q.nack("-", NackReason::Invalid);
        let nack = q.held_bytes() - after_publish;
        assert!(nack < 128, "an invalid element's reply costs {nack} bytes");
        let fetch = q.fetch(None);
        let before_fetch = q.held_bytes();
        let d = Delivery {
            queue: Arc::from("q"),
            shard: 0,
            seq: 0,
            count: 1,
            msg: big,
        };
        q.complete(fetch, Completion::Fetched(vec![d]));
        assert!(q.held_bytes() >= before_fetch + 100_000);
        q.complete(waiting, Completion::Enqueued(Ok(())));
        let mut out = Vec::new();
        q.render(&mut out, usize::MAX);
        assert!(q.is_empty());
        assert_eq!(q.held_bytes(), 0, "all written, nothing held");
    }

    #[test]
    fn a_large_fetch_is_rendered_a_bounded_piece_at_a_time() {
        let mut q = ReplyQueue::default();
        let deliveries: Vec<Delivery> = (0..100)
            .map(|i| Delivery {
                queue: Arc::from("q"),
                shard: 0,
                seq: i,
                count: 1,
                msg: msg(&format!("m{i:02}")),
            })
            .collect();
        q.fetch(Some(deliveries));
        q.line("OK heartbeat");
        let line_len = b"Message: m00 q 1 {}\n".len();
        let (mut all, mut calls) = (Vec::new(), 0);
        while !q.is_empty() {
            let mut out = Vec::new();
            q.render(&mut out, 10 * line_len);
            // One delivery past the limit at most, never the whole fetch.
            assert!(out.len() <= 11 * line_len + b"OK fetch 100\nOK heartbeat\n".len());
            all.extend_from_slice(&out);
            calls += 1;
        }
        // Ten calls of ten deliveries, then the count and the next reply.
        assert_eq!(calls, 11);
        let text = String::from_utf8(all).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 102);
        assert_eq!(lines[0], "Message: m00 q 1 {}");
        assert_eq!(lines[99], "Message: m99 q 1 {}");
        assert_eq!(lines[100], "OK fetch 100");
        assert_eq!(lines[101], "OK heartbeat");
    }

    #[test]
    fn stale_completions_are_ignored() {
        let mut q = ReplyQueue::default();
        q.line("x");
        let mut out = Vec::new();
        q.render(&mut out, usize::MAX);
        assert!(q.complete(0, Completion::Consumed).is_none());
        assert!(q.complete(99, Completion::Consumed).is_none());
    }

    #[test]
    fn a_pending_line_holds_back_later_replies_until_filled() {
        let mut q = ReplyQueue::default();
        let key = q.pending();
        q.line("OK heartbeat");
        let mut out = Vec::new();
        assert_eq!(q.render(&mut out, usize::MAX), 0);
        assert_eq!(q.waiting(), 1);
        q.fill(key, "Public key registered".into());
        q.fill(key, "filled twice".into());
        assert_eq!(q.render(&mut out, usize::MAX), 2);
        assert_eq!(out, b"Public key registered\nOK heartbeat\n");
        assert_eq!(q.waiting(), 0);
    }
}
