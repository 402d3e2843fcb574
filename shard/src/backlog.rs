//! Ready messages whose bodies are only in their queue's log: what lets a
//! backlog grow with the disk instead of the memory budget.
//!
//! A queue past its shard's part of `storage.memory_budget_mb` drops the
//! bodies of durable ready messages and keeps, per log segment, one [`Run`]:
//! the byte range of the segment holding them and the range of their
//! sequence numbers. Nothing is kept per message, so a backlog costs RAM per
//! segment, not per message (ids still inside the dedup window keep their
//! dedup entry, which the queue owns).
//!
//! Reading back is the shard's reader's (`ReadJob`s: one read in flight per
//! queue, about [`READ_BATCH_BYTES`] each, through io_uring); this side only
//! decodes what was read. Every frame is CRC-checked again: a damaged range
//! is skipped and reported, never served. Within a run every message record
//! whose sequence number is in range and not a hole (acked before a restart)
//! is a ready message: a run is cut from the FIFO of ready messages, whose
//! records lie in sequence order in their segment.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::log::record::{Framing, Record};
use crate::log::segment::{self, Step};
use crate::message::{Message, Route};
use crate::queue::Entry;

/// Bytes one read asks for (more only for a record that is larger).
pub const READ_BATCH_BYTES: usize = 1 << 20;

/// Loaded messages a queue keeps ahead of its consumers: below this a read
/// of the next batch is started.
pub const READAHEAD_MESSAGES: usize = 1024;

/// A read that is never needed: larger than any record plus its header.
const MAX_READ_BYTES: usize = crate::log::record::MAX_RECORD_BYTES + 64;

/// Consecutive ready messages of one segment, bodies on disk only.
#[derive(Debug, Clone)]
pub struct Run {
    /// The segment's base sequence number (its file name).
    pub segment: u64,
    /// How the segment's frames are laid out.
    pub framing: Framing,
    /// Where the next read starts: a frame boundary.
    pub offset: u64,
    /// One past the last byte of the run's last record.
    pub end: u64,
    /// Sequence numbers in the run: `first_seq..=last_seq`, minus `holes`.
    pub first_seq: u64,
    /// The last sequence number.
    pub last_seq: u64,
    /// Messages of the run not read back yet.
    pub count: u64,
    /// Their body bytes.
    pub bytes: u64,
    /// Sequence ranges (`start..end`, sorted, disjoint) acked before a
    /// restart: their records are skipped.
    pub holes: Vec<(u64, u64)>,
}

impl Run {
    /// Whether `seq` is not (any longer) one of the run's messages.
    pub fn is_hole(&self, seq: u64) -> bool {
        let i = self.holes.partition_point(|(_, end)| *end <= seq);
        self.holes.get(i).is_some_and(|(start, _)| *start <= seq)
    }

    /// Takes `seq` (one of its messages, acked) out of the run. Its body's
    /// length is not known without reading it: the run's bytes shrink by
    /// their mean, and what is left over is settled when the run is read.
    pub fn add_hole(&mut self, seq: u64) {
        if seq < self.first_seq || seq > self.last_seq || self.is_hole(seq) {
            return;
        }
        let i = self.holes.partition_point(|(_, end)| *end <= seq);
        let joins_before = i > 0 && self.holes[i - 1].1 == seq;
        let next = seq.saturating_add(1);
        let joins_after = self.holes.get(i).is_some_and(|(start, _)| *start == next);
        match (joins_before, joins_after) {
            (true, true) => {
                self.holes[i - 1].1 = self.holes[i].1;
                self.holes.remove(i);
            }
            (true, false) => self.holes[i - 1].1 = next,
            (false, true) => self.holes[i].0 = seq,
            (false, false) => self.holes.insert(i, (seq, next)),
        }
        if let Some(mean) = self.bytes.checked_div(self.count) {
            self.bytes -= mean;
            self.count -= 1;
        }
    }
}

/// A read of one queue's segment, made by the shard's reader.
#[derive(Debug, Clone)]
pub struct ReadJob {
    /// The queue.
    pub queue: Arc<str>,
    /// The segment file.
    pub path: std::path::PathBuf,
    /// The segment's base (which run the bytes are for).
    pub segment: u64,
    /// Where to read.
    pub offset: u64,
    /// How many bytes to read.
    pub len: usize,
}

/// What one absorbed read did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Absorbed {
    /// Messages read back into memory.
    pub loaded: u64,
    /// Body bytes read back.
    pub loaded_bytes: u64,
    /// Damaged bytes skipped.
    pub damaged_bytes: u64,
    /// Messages given up: their records were damaged or missing when their
    /// run ended.
    pub lost: u64,
    /// Their body bytes.
    pub lost_bytes: u64,
}

/// A queue's ready messages on disk, oldest first.
#[derive(Debug, Default)]
pub struct DiskBacklog {
    runs: VecDeque<Run>,
    /// Messages in `runs`.
    len: u64,
    /// Their body bytes.
    bytes: u64,
    /// Delivery counts of messages on disk that were delivered before (a
    /// restart, or a spill after a redelivery): few, so kept apart.
    deliveries: HashMap<u64, u32, crate::hashers::BuildIntHasher>,
    /// A read is in flight.
    reading: bool,
    /// Bytes the next read must take at least: a record larger than a batch.
    need: usize,
    /// The sender of the last message read back, shared with the next.
    last_sender: Option<Arc<str>>,
}

impl DiskBacklog {
    /// Messages on disk.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no message is on disk.
    pub fn is_empty(&self) -> bool {
        self.len == 0 && self.runs.is_empty()
    }

    /// Their body bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Runs held (each a segment's range).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether a read is in flight.
    pub fn is_reading(&self) -> bool {
        self.reading
    }

    /// Appends a message whose record of `record_len` bytes starts at
    /// `offset` of segment `segment`; it must follow everything held.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        seq: u64,
        segment: u64,
        framing: Framing,
        offset: u64,
        record_len: u64,
        body_len: u64,
        deliveries: u32,
    ) {
        if deliveries > 0 {
            self.deliveries.insert(seq, deliveries);
        }
        self.len += 1;
        self.bytes += body_len;
        if let Some(last) = self.runs.back_mut() {
            if last.segment == segment && offset >= last.end && seq > last.last_seq {
                last.end = offset + record_len;
                if seq > last.last_seq + 1 {
                    last.holes.push((last.last_seq + 1, seq));
                }
                last.last_seq = seq;
                last.count += 1;
                last.bytes += body_len;
                return;
            }
        }
        self.runs.push_back(Run {
            segment,
            framing,
            offset,
            end: offset + record_len,
            first_seq: seq,
            last_seq: seq,
            count: 1,
            bytes: body_len,
            holes: Vec::new(),
        });
    }

    /// Adopts a run rebuilt by recovery (after every run held).
    pub fn push_run(&mut self, run: Run, deliveries: impl IntoIterator<Item = (u64, u32)>) {
        self.len += run.count;
        self.bytes += run.bytes;
        self.deliveries.extend(deliveries);
        self.runs.push_back(run);
    }

    /// Puts `front`'s messages, which all come before this backlog's, at
    /// its head: bodies read back and then moved out again when the budget
    /// needs room. Not while a read is in flight (the read is of the head).
    pub fn prepend(&mut self, mut front: DiskBacklog) {
        debug_assert!(!self.reading);
        front.runs.extend(self.runs.drain(..));
        front.deliveries.extend(self.deliveries.drain());
        self.runs = front.runs;
        self.deliveries = front.deliveries;
        self.len += front.len;
        self.bytes += front.bytes;
    }

    /// Puts `back`'s messages, which all come after this backlog's, at its
    /// end (a purge whose backlog joins one still being read through). The
    /// read in flight, if any, is of this backlog's head, so it stays valid.
    pub fn append(&mut self, mut back: DiskBacklog) {
        debug_assert!(!back.reading);
        self.len += back.len;
        self.bytes += back.bytes;
        self.runs.append(&mut back.runs);
        self.deliveries.extend(back.deliveries.drain());
    }

    /// Adopts delivery counts of messages held (before a restart).
    pub fn push_deliveries(&mut self, deliveries: impl IntoIterator<Item = (u64, u32)>) {
        self.deliveries.extend(deliveries);
    }

    /// The next read to make, unless one is in flight: (segment, offset,
    /// length). Marks a read in flight.
    pub fn next_read(&mut self) -> Option<(u64, u64, usize)> {
        if self.reading {
            return None;
        }
        let run = self.runs.front()?;
        let left = usize::try_from(run.end - run.offset).unwrap_or(usize::MAX);
        let len = left.min(READ_BATCH_BYTES.max(self.need));
        self.reading = true;
        Some((run.segment, run.offset, len))
    }

    /// A read failed: the next one asks again.
    pub fn read_failed(&mut self) {
        self.reading = false;
    }

    /// Decodes `data`, read at `offset` of `segment` (`asked` bytes were
    /// asked for), into entries appended to `out`, oldest first.
    pub fn absorb(
        &mut self,
        segment: u64,
        offset: u64,
        asked: usize,
        data: &[u8],
        out: &mut VecDeque<Entry>,
    ) -> Absorbed {
        self.reading = false;
        let mut done = Absorbed::default();
        let Some(run) = self.runs.front_mut() else {
            return done;
        };
        if run.segment != segment || run.offset != offset {
            // Not the read this run asked for (cannot happen: one in flight).
            return done;
        }
        let limit = data
            .len()
            .min(usize::try_from(run.end - run.offset).unwrap_or(usize::MAX));
        let data = &data[..limit];
        // The file ends before the run does: what is missing is lost.
        let short = data.len() < asked;
        let at_end = short || run.offset + data.len() as u64 >= run.end;
        let mut pos = 0usize;
        loop {
            match segment::step(data, pos, run.framing, at_end) {
                Step::Record(record, n) => {
                    if let Record::Message {
                        seq,
                        sender,
                        message_id,
                        exchange,
                        routing_key,
                        sent_at_ms,
                        body,
                    } = record
                    {
                        if seq >= run.first_seq && seq <= run.last_seq && !run.is_hole(seq) {
                            let sender = match &self.last_sender {
                                Some(s) if **s == *sender => s.clone(),
                                _ => {
                                    let s: Arc<str> = Arc::from(sender);
                                    self.last_sender = Some(s.clone());
                                    s
                                }
                            };
                            let route = Route {
                                exchange,
                                routing_key,
                                sent_at_ms,
                            };
                            let msg = Message::published(message_id, body, sender, route);
                            let body_len = body.len() as u64;
                            out.push_back(Entry {
                                seq,
                                msg,
                                deliveries: self.deliveries.remove(&seq).unwrap_or(0),
                                segment,
                                offset: u32::try_from(run.offset + pos as u64).unwrap_or(u32::MAX),
                            });
                            debug_assert!(run.count > 0, "a run read back past its count");
                            run.count = run.count.saturating_sub(1);
                            run.bytes = run.bytes.saturating_sub(body_len);
                            self.len = self.len.saturating_sub(1);
                            self.bytes = self.bytes.saturating_sub(body_len);
                            done.loaded += 1;
                            done.loaded_bytes += body_len;
                        }
                    }
                    pos += n;
                }
                Step::Damaged { len, why } => {
                    tracing::error!(
                        segment,
                        offset = run.offset + pos as u64,
                        bytes = len,
                        why,
                        "damaged bytes in a backlog read skipped, never served"
                    );
                    done.damaged_bytes += len as u64;
                    pos += len;
                }
                Step::End(_) => {
                    if pos < data.len() {
                        done.damaged_bytes += (data.len() - pos) as u64;
                    }
                    pos = data.len();
                    break;
                }
                Step::NeedMore => break,
            }
        }
        if pos == 0 && !at_end {
            // One record larger than the read: ask for it whole next time.
            self.need = if self.need >= MAX_READ_BYTES {
                MAX_READ_BYTES
            } else {
                (asked.max(READ_BATCH_BYTES) * 2).min(MAX_READ_BYTES)
            };
            if asked >= MAX_READ_BYTES {
                // Nothing decodable in the largest read: damage to the end.
                pos = data.len();
                done.damaged_bytes += data.len() as u64;
            }
        } else {
            self.need = 0;
        }
        run.offset += pos as u64;
        // A run whose every message is read back is done, though bytes of
        // messages acked before a restart may follow in its segment: the
        // messages after it must not wait for those to be read.
        if run.count == 0 || run.offset >= run.end || (short && pos >= data.len()) {
            if run.count > 0 {
                tracing::error!(
                    segment,
                    messages = run.count,
                    "backlog messages not found in their segment (damaged or missing); not served"
                );
            }
            debug_assert!(self.len >= run.count, "a run holds more than its backlog");
            done.lost = run.count;
            done.lost_bytes = run.bytes;
            self.len = self.len.saturating_sub(run.count);
            self.bytes = self.bytes.saturating_sub(run.bytes);
            let (first, last) = (run.first_seq, run.last_seq);
            if !self.deliveries.is_empty() {
                self.deliveries.retain(|seq, _| *seq < first || *seq > last);
            }
            self.runs.pop_front();
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::encode;

    fn record(seq: u64, id: &str, out: &mut Vec<u8>) -> (u64, u64) {
        let start = out.len() as u64;
        encode(
            &Record::Message {
                seq,
                sender: "s",
                message_id: id,
                exchange: "e",
                routing_key: "k",
                sent_at_ms: 1,
                body: "{\"a\":1}",
            },
            out,
        );
        (start, out.len() as u64 - start)
    }

    fn ack(seq: u64, out: &mut Vec<u8>) {
        encode(
            &Record::Ack {
                seq,
                acked_at_ms: 2,
                key: None,
            },
            out,
        );
    }

    /// Reads `file` for `backlog` in reads of `batch` bytes until it is empty.
    fn drain(backlog: &mut DiskBacklog, file: &[u8], batch: usize) -> (Vec<u64>, Absorbed) {
        let mut out = VecDeque::new();
        let mut total = Absorbed::default();
        let mut guard = 0;
        while let Some((segment, offset, len)) = backlog.next_read() {
            let len = len.min(batch.max(backlog.need));
            let from = offset as usize;
            let to = (from + len).min(file.len());
            let got = backlog.absorb(segment, offset, len, &file[from..to], &mut out);
            total.loaded += got.loaded;
            total.lost += got.lost;
            total.damaged_bytes += got.damaged_bytes;
            guard += 1;
            assert!(guard < 10_000, "reads make progress");
        }
        (out.iter().map(|e| e.seq).collect(), total)
    }

    #[test]
    fn reads_back_in_order_skipping_other_records_in_small_reads() {
        let mut file = vec![0u8; 16];
        let mut backlog = DiskBacklog::default();
        for seq in 0..50u64 {
            let (at, len) = record(seq, &format!("m{seq}"), &mut file);
            ack(seq + 1000, &mut file);
            backlog.push(
                seq,
                0,
                Framing::V2,
                at,
                len,
                7,
                if seq == 3 { 2 } else { 0 },
            );
        }
        assert_eq!(
            (backlog.len(), backlog.bytes(), backlog.runs()),
            (50, 350, 1)
        );
        let mut out = VecDeque::new();
        let (segment, offset, len) = backlog.next_read().unwrap();
        assert!(backlog.next_read().is_none(), "one read in flight");
        let got = backlog.absorb(segment, offset, len, &file[offset as usize..], &mut out);
        assert_eq!(got.loaded, 50);
        assert_eq!(out[3].deliveries, 2, "a count kept apart comes back");
        assert!(backlog.is_empty());
        // The same in reads of 100 bytes: frames cut by a read wait for the next.
        let mut backlog = DiskBacklog::default();
        let mut at = 16;
        for seq in 0..50u64 {
            let len =
                crate::log::record::message_record_bytes("s", &format!("m{seq}"), "e", "k", 7);
            backlog.push(seq, 0, Framing::V2, at, len, 7, 0);
            at += len + 29;
        }
        let (seqs, total) = drain(&mut backlog, &file, 100);
        assert_eq!(seqs, (0..50).collect::<Vec<_>>());
        assert_eq!((total.lost, total.damaged_bytes), (0, 0));
    }

    /// A run rebuilt after a restart whose last messages were acked before
    /// it (holes to its end) is done once its live messages are read: what
    /// follows it is not held up behind bytes of acked messages.
    #[test]
    fn a_run_ends_with_its_last_live_message() {
        let mut file = vec![0u8; 16];
        let mut ends = Vec::new();
        for seq in 0..200u64 {
            record(seq, &format!("m{seq}"), &mut file);
            ends.push(file.len() as u64);
        }
        let mut run = Run {
            segment: 0,
            framing: Framing::V2,
            offset: 16,
            end: file.len() as u64,
            first_seq: 0,
            last_seq: 199,
            count: 200,
            bytes: 1400,
            holes: Vec::new(),
        };
        for seq in 2..200 {
            run.add_hole(seq);
        }
        let mut backlog = DiskBacklog::default();
        backlog.push_run(run, []);
        let mut out = VecDeque::new();
        let (segment, offset, _) = backlog.next_read().unwrap();
        // A read of the first 10 records only.
        let data = &file[16..ends[9] as usize];
        backlog.absorb(segment, offset, data.len(), data, &mut out);
        assert_eq!(out.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1]);
        assert!(backlog.is_empty(), "nothing left to read: {backlog:?}");
        assert_eq!(backlog.bytes(), 0);
    }

    #[test]
    fn a_damaged_record_costs_only_itself_and_is_reported() {
        let mut file = vec![0u8; 16];
        let mut backlog = DiskBacklog::default();
        let mut starts = Vec::new();
        for seq in 0..10u64 {
            let (at, len) = record(seq, "id", &mut file);
            starts.push(at);
            backlog.push(seq, 0, Framing::V2, at, len, 7, 0);
        }
        file[starts[4] as usize + 20] ^= 0x10;
        let (seqs, total) = drain(&mut backlog, &file, 64);
        assert_eq!(seqs, [0, 1, 2, 3, 5, 6, 7, 8, 9]);
        assert_eq!(total.lost, 1);
        assert!(total.damaged_bytes > 0);
        assert!(backlog.is_empty() && backlog.bytes() == 0);
    }

    #[test]
    fn holes_are_skipped_and_a_file_cut_short_ends_its_run() {
        let mut file = vec![0u8; 16];
        let mut backlog = DiskBacklog::default();
        for seq in 0..10u64 {
            let (at, len) = record(seq, "id", &mut file);
            if seq % 3 != 1 {
                backlog.push(seq, 0, Framing::V2, at, len, 7, 0);
            }
        }
        assert_eq!(backlog.runs(), 1, "one run, with holes");
        let cut = file.len() - 10;
        let (seqs, total) = drain(&mut backlog, &file[..cut], 1 << 20);
        assert_eq!(seqs, [0, 2, 3, 5, 6, 8]);
        assert_eq!(total.lost, 1, "the cut record");
        assert!(backlog.is_empty());
    }

    #[test]
    fn a_record_larger_than_a_read_is_read_whole() {
        let mut file = vec![0u8; 16];
        let body = format!("\"{}\"", "x".repeat(3 * READ_BATCH_BYTES));
        let at = file.len() as u64;
        encode(
            &Record::Message {
                seq: 0,
                sender: "s",
                message_id: "big",
                exchange: "",
                routing_key: "",
                sent_at_ms: 0,
                body: &body,
            },
            &mut file,
        );
        let mut backlog = DiskBacklog::default();
        backlog.push(
            0,
            0,
            Framing::V2,
            at,
            file.len() as u64 - at,
            body.len() as u64,
            0,
        );
        let (seqs, total) = drain(&mut backlog, &file, READ_BATCH_BYTES);
        assert_eq!((seqs, total.lost), (vec![0], 0));
    }
}
