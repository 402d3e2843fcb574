//! One transaction's worth of metadata, built from log records without I/O.
//!
//! Events of one message inside a batch coalesce: a `Message` followed by its
//! `Delivered` and `Ack` becomes one inserted row, and events for a message
//! mirrored by an earlier batch become one update row. A record that would
//! need a new row when the batch is full is not consumed, so the watermark
//! stops right before it and the next batch starts there.
//!
//! Times: logs written by earlier versions carry no times (0). A missing
//! delivery or ack time is NULL; a missing send time is the Unix epoch
//! (1970-01-01T00:00:00Z), because `sent_time` is NOT NULL and the segment
//! file's mtime would be a plausible-looking but wrong value. A time past
//! year 9999 (a damaged field) counts as missing, since PostgreSQL would
//! refuse the whole batch over it. NUL characters, which PostgreSQL text
//! cannot hold, become U+FFFD for the same reason.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ciphermq_shard::log::record::Record;

/// Latest time the mirror writes (9999-12-31T23:59:59.999Z); a later one is a
/// damaged field, and PostgreSQL would refuse the whole batch over it.
const MAX_TIME_MS: u64 = 253_402_300_799_999;

/// Where the mirror has read a queue's log up to: the segment (by base) and
/// the byte offset after the last record consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    /// The segment's base (its file name).
    pub(crate) base: u64,
    /// Bytes of it already mirrored.
    pub(crate) offset: u64,
}

/// A stretch of a queue's log deleted before the mirror read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Missed {
    /// The queue.
    pub(crate) queue: Arc<str>,
    /// Where the mirror was: records after it, up to `resume_base`, are lost.
    pub(crate) from: Position,
    /// The segment it continues with.
    pub(crate) resume_base: u64,
}

/// A full row, from a `Message` record (plus its events in the same batch).
#[derive(Debug, Clone, PartialEq)]
struct Inserted {
    message_id: String,
    client_id: String,
    exchange: String,
    routing_key: String,
    sent: SystemTime,
    delivered: Option<SystemTime>,
    acked: Option<SystemTime>,
}

/// What the batch writes for one `(queue, seq)`.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Insert(Inserted),
    /// Times for a row written by an earlier batch.
    Update {
        delivered: Option<SystemTime>,
        acked: Option<SystemTime>,
    },
}

/// Rows for `INSERT … SELECT * FROM unnest(…)`, one vector per column.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct InsertColumns {
    pub(crate) queue: Vec<String>,
    pub(crate) seq: Vec<i64>,
    pub(crate) message_id: Vec<String>,
    pub(crate) client_id: Vec<String>,
    pub(crate) exchange: Vec<String>,
    pub(crate) routing_key: Vec<String>,
    pub(crate) sent: Vec<SystemTime>,
    pub(crate) delivered: Vec<Option<SystemTime>>,
    pub(crate) acked: Vec<Option<SystemTime>>,
}

/// Rows for the `UPDATE … FROM unnest(…)` of events.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct UpdateColumns {
    pub(crate) queue: Vec<String>,
    pub(crate) seq: Vec<i64>,
    pub(crate) delivered: Vec<Option<SystemTime>>,
    pub(crate) acked: Vec<Option<SystemTime>>,
}

/// Rows for the watermark upsert.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct WatermarkColumns {
    pub(crate) queue: Vec<String>,
    pub(crate) base: Vec<i64>,
    pub(crate) offset: Vec<i64>,
}

/// A batch ready for its transaction, and what to apply once it commits.
#[derive(Debug)]
pub(crate) struct Columns {
    pub(crate) inserts: InsertColumns,
    pub(crate) updates: UpdateColumns,
    pub(crate) watermarks: WatermarkColumns,
    /// New positions of the queues this batch moved.
    pub(crate) positions: HashMap<Arc<str>, Position>,
    /// Stretches skipped because their segments were deleted.
    pub(crate) missed: Vec<Missed>,
    /// Metadata rows written (inserts plus updates).
    pub(crate) rows: u64,
    /// Per queue: one past the last message this batch inserts.
    pub(crate) next_seqs: HashMap<Arc<str>, u64>,
}

/// Metadata rows and queue positions collected for one transaction.
#[derive(Debug)]
pub(crate) struct Batch {
    limit: usize,
    entries: HashMap<(Arc<str>, u64), Entry>,
    positions: HashMap<Arc<str>, Position>,
    missed: Vec<Missed>,
}

/// A time from the log (Unix ms, 0 = not recorded by older versions).
pub(crate) fn time_of(ms: u64) -> Option<SystemTime> {
    (ms != 0 && ms <= MAX_TIME_MS).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

/// Text PostgreSQL accepts: a NUL byte would make it refuse the whole batch,
/// and the mirror would retry it forever.
fn text(s: &str) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s.to_owned()
    }
}

/// A `bigint` for a position; real positions are far below the limit.
fn bigint(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Batch {
    /// An empty batch of at most `limit` rows (at least 1).
    pub(crate) fn new(limit: usize) -> Batch {
        Batch {
            limit: limit.max(1),
            entries: HashMap::new(),
            positions: HashMap::new(),
            missed: Vec::new(),
        }
    }

    /// No more records needing a new row fit.
    pub(crate) fn is_full(&self) -> bool {
        self.entries.len() >= self.limit
    }

    /// Nothing to write: no row and no position moved.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.positions.is_empty()
    }

    /// Metadata rows so far.
    #[cfg(test)]
    pub(crate) fn rows(&self) -> usize {
        self.entries.len()
    }

    /// Takes `record` from `queue`'s log. `false` when it needs a new row and
    /// the batch is full: it is not consumed and must be read again.
    pub(crate) fn add(&mut self, queue: &Arc<str>, record: &Record<'_>) -> bool {
        let seq = match *record {
            Record::Message { seq, .. }
            | Record::Ack { seq, .. }
            | Record::Delivered { seq, .. } => seq,
            // Bookkeeping records (dedup carry-over) hold no message metadata.
            _ => return true,
        };
        if i64::try_from(seq).is_err() {
            tracing::warn!(%queue, seq, "log record with a sequence number beyond bigint; not mirrored");
            return true;
        }
        let key = (queue.clone(), seq);
        let full = self.is_full();
        match *record {
            Record::Message {
                sender,
                message_id,
                exchange,
                routing_key,
                sent_at_ms,
                ..
            } => {
                let existing = self.entries.get(&key);
                if existing.is_none() && full {
                    return false;
                }
                // Events seen first (only possible for a replayed or damaged
                // log) are kept.
                let (delivered, acked) = match existing {
                    Some(Entry::Insert(row)) => (row.delivered, row.acked),
                    Some(Entry::Update { delivered, acked }) => (*delivered, *acked),
                    None => (None, None),
                };
                let row = Inserted {
                    message_id: text(message_id),
                    client_id: text(sender),
                    exchange: text(exchange),
                    routing_key: text(routing_key),
                    sent: time_of(sent_at_ms).unwrap_or(UNIX_EPOCH),
                    delivered,
                    acked,
                };
                self.entries.insert(key, Entry::Insert(row));
                true
            }
            Record::Delivered {
                delivered_at_ms, ..
            } => self.event(key, full, time_of(delivered_at_ms), None),
            Record::Ack { acked_at_ms, .. } => self.event(key, full, None, time_of(acked_at_ms)),
            _ => true,
        }
    }

    /// Folds a delivery or ack time into the row of `key`; the first time
    /// seen wins (the first delivery, the ack).
    fn event(
        &mut self,
        key: (Arc<str>, u64),
        full: bool,
        delivered: Option<SystemTime>,
        acked: Option<SystemTime>,
    ) -> bool {
        if delivered.is_none() && acked.is_none() {
            // Nothing to record (a time older versions did not write).
            return true;
        }
        let (d, a) = match self.entries.get_mut(&key) {
            Some(Entry::Insert(row)) => (&mut row.delivered, &mut row.acked),
            Some(Entry::Update { delivered, acked }) => (delivered, acked),
            None if full => return false,
            None => {
                self.entries.insert(key, Entry::Update { delivered, acked });
                return true;
            }
        };
        if d.is_none() {
            *d = delivered;
        }
        if a.is_none() {
            *a = acked;
        }
        true
    }

    /// `queue` has been consumed up to `position`.
    pub(crate) fn advance(&mut self, queue: &Arc<str>, position: Position) {
        self.positions.insert(queue.clone(), position);
    }

    /// `queue`'s log lost a stretch; the mirror continues at `resume_base`.
    pub(crate) fn miss(&mut self, queue: &Arc<str>, from: Position, resume_base: u64) {
        self.missed.push(Missed {
            queue: queue.clone(),
            from,
            resume_base,
        });
        self.advance(
            queue,
            Position {
                base: resume_base,
                offset: 0,
            },
        );
    }

    /// The batch as statement parameters, rows in `(queue, seq)` order.
    pub(crate) fn into_columns(self) -> Columns {
        let mut entries: Vec<_> = self.entries.into_iter().collect();
        entries.sort_by(|(a, _), (b, _)| a.cmp(b));
        let rows = entries.len() as u64;
        let mut inserts = InsertColumns::default();
        let mut updates = UpdateColumns::default();
        let mut next_seqs: HashMap<Arc<str>, u64> = HashMap::new();
        for ((queue, seq), entry) in entries {
            match entry {
                Entry::Insert(row) => {
                    raise(&mut next_seqs, queue.clone(), seq + 1);
                    inserts.queue.push(text(&queue));
                    inserts.seq.push(bigint(seq));
                    inserts.message_id.push(row.message_id);
                    inserts.client_id.push(row.client_id);
                    inserts.exchange.push(row.exchange);
                    inserts.routing_key.push(row.routing_key);
                    inserts.sent.push(row.sent);
                    inserts.delivered.push(row.delivered);
                    inserts.acked.push(row.acked);
                }
                Entry::Update { delivered, acked } => {
                    updates.queue.push(text(&queue));
                    updates.seq.push(bigint(seq));
                    updates.delivered.push(delivered);
                    updates.acked.push(acked);
                }
            }
        }
        let mut watermarks = WatermarkColumns::default();
        for (queue, position) in &self.positions {
            watermarks.queue.push(text(queue));
            watermarks.base.push(bigint(position.base));
            watermarks.offset.push(bigint(position.offset));
        }
        Columns {
            inserts,
            updates,
            watermarks,
            positions: self.positions,
            missed: self.missed,
            rows,
            next_seqs,
        }
    }
}

/// Raises `queue`'s entry to at least `next`.
pub(crate) fn raise(map: &mut HashMap<Arc<str>, u64>, queue: Arc<str>, next: u64) {
    let known = map.entry(queue).or_default();
    *known = (*known).max(next);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64, sent: u64) -> Record<'static> {
        Record::Message {
            seq,
            sender: "sender_1",
            message_id: "m",
            exchange: "ex",
            routing_key: "rk",
            sent_at_ms: sent,
            body: "{}",
        }
    }

    fn delivered(seq: u64, at: u64) -> Record<'static> {
        Record::Delivered {
            seq,
            count: 1,
            delivered_at_ms: at,
        }
    }

    fn ack(seq: u64, at: u64) -> Record<'static> {
        Record::Ack {
            seq,
            acked_at_ms: at,
            key: None,
        }
    }

    fn ms(t: u64) -> Option<SystemTime> {
        time_of(t)
    }

    #[test]
    fn a_message_and_its_events_in_one_batch_are_one_row() {
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(10);
        assert!(batch.add(&q, &message(1, 1000)));
        assert!(batch.add(&q, &delivered(1, 2000)));
        assert!(batch.add(&q, &delivered(1, 3000)));
        assert!(batch.add(&q, &ack(1, 4000)));
        let cols = batch.into_columns();
        assert_eq!(cols.rows, 1);
        assert_eq!(cols.inserts.seq, [1]);
        assert_eq!(
            cols.inserts.sent,
            [UNIX_EPOCH + Duration::from_millis(1000)]
        );
        assert_eq!(
            cols.inserts.delivered,
            [ms(2000)],
            "the first delivery wins"
        );
        assert_eq!(cols.inserts.acked, [ms(4000)]);
        assert!(cols.updates.seq.is_empty());
    }

    #[test]
    fn events_for_earlier_batches_become_one_update_each() {
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(10);
        assert!(batch.add(&q, &delivered(5, 2000)));
        assert!(batch.add(&q, &ack(5, 3000)));
        assert!(batch.add(&q, &ack(6, 3500)));
        let cols = batch.into_columns();
        assert_eq!(cols.rows, 2);
        assert!(cols.inserts.seq.is_empty());
        assert_eq!(cols.updates.seq, [5, 6]);
        assert_eq!(cols.updates.delivered, [ms(2000), None]);
        assert_eq!(cols.updates.acked, [ms(3000), ms(3500)]);
    }

    #[test]
    fn a_full_batch_refuses_new_rows_but_takes_their_events() {
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(2);
        assert!(batch.add(&q, &message(1, 1)));
        assert!(batch.add(&q, &message(2, 1)));
        assert!(batch.is_full());
        assert!(!batch.add(&q, &message(3, 1)), "a third row does not fit");
        assert!(!batch.add(&q, &ack(0, 9)), "nor an update of an older row");
        assert!(batch.add(&q, &ack(2, 9)), "but row 2's ack folds into it");
        let cols = batch.into_columns();
        assert_eq!(cols.rows, 2);
        assert_eq!(cols.inserts.acked, [None, ms(9)]);
    }

    #[test]
    fn unknown_times_are_null_and_an_unknown_send_time_is_the_epoch() {
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(1);
        assert!(batch.add(&q, &message(1, 0)));
        assert!(batch.add(&q, &delivered(1, 0)));
        assert!(
            batch.add(&q, &ack(1, u64::MAX)),
            "a damaged time is unknown"
        );
        assert!(
            batch.add(&q, &delivered(7, 0)),
            "nothing to write needs no row"
        );
        let cols = batch.into_columns();
        assert_eq!(cols.inserts.sent, [UNIX_EPOCH]);
        assert_eq!(cols.inserts.delivered, [None]);
        assert_eq!(cols.inserts.acked, [None]);
        assert_eq!(cols.rows, 1);
    }

    #[test]
    fn queues_are_kept_apart_and_text_is_made_storable() {
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let mut batch = Batch::new(10);
        let nul = Record::Message {
            seq: 1,
            sender: "s\0",
            message_id: "m",
            exchange: "",
            routing_key: "",
            sent_at_ms: 5,
            body: "",
        };
        assert!(batch.add(&b, &nul));
        assert!(batch.add(&a, &message(1, 5)));
        assert!(
            batch.add(&a, &message(u64::MAX, 5)),
            "consumed, not mirrored"
        );
        batch.advance(
            &a,
            Position {
                base: 0,
                offset: 40,
            },
        );
        let cols = batch.into_columns();
        assert_eq!(cols.inserts.queue, ["a", "b"]);
        assert_eq!(cols.inserts.client_id, ["sender_1", "s\u{FFFD}"]);
        assert_eq!(cols.watermarks.queue, ["a"]);
        assert_eq!(cols.watermarks.offset, [40]);
    }

    #[test]
    fn a_miss_moves_the_position_to_the_next_segment() {
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(10);
        assert!(batch.is_empty());
        batch.miss(
            &q,
            Position {
                base: 0,
                offset: 10,
            },
            200,
        );
        assert!(!batch.is_empty());
        let cols = batch.into_columns();
        assert_eq!(
            cols.positions[&q],
            Position {
                base: 200,
                offset: 0
            }
        );
        assert_eq!(cols.missed.len(), 1);
        assert_eq!(cols.rows, 0);
    }
}
