//! Reading one queue's log at start-up (before the shards serve, so plain
//! blocking file I/O is fine here).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::log::dedup_file::{dedup_number, RecoveredDedupFile};
use crate::log::record::{decode, Decoded, Record};
use crate::log::segment_base;
use crate::message::{DedupHasher, DedupKey, Message, Route};
use crate::queue::CARRIED;

/// A segment found on disk.
#[derive(Debug, Clone)]
pub struct RecoveredSegment {
    /// First sequence number it may hold.
    pub base: u64,
    /// Its file.
    pub path: PathBuf,
    /// Its valid length in bytes (after truncating a torn tail).
    pub len: u64,
    /// Messages in it not yet acked.
    pub live: u64,
}

/// An unacked message and how often it was delivered.
#[derive(Debug)]
pub struct RecoveredMessage {
    /// Position in the queue.
    pub seq: u64,
    /// The message.
    pub msg: Arc<Message>,
    /// Deliveries before the restart.
    pub deliveries: u32,
}

/// What a queue's log held.
#[derive(Debug, Default)]
pub struct RecoveredQueue {
    /// Unacked messages in queue order.
    pub messages: Vec<RecoveredMessage>,
    /// The next sequence number to use.
    pub next_seq: u64,
    /// Segments in base order.
    pub segments: Vec<RecoveredSegment>,
    /// Acked ids with their ack time (Unix ms) and the sequence number whose
    /// segment holds that evidence (the message's own, or the segment of a
    /// carried dedup record): the dedup window outlives a restart.
    pub acked: Vec<(DedupKey, u64, u64)>,
    /// Damage found: file, offset and what was wrong. Never served.
    pub problems: Vec<String>,
    /// Dedup files (ids carried out of deleted segments), oldest first.
    pub dedup_files: Vec<RecoveredDedupFile>,
}

/// Reads every segment of the queue in `dir`. A torn tail of the last segment
/// is truncated (it was never acknowledged); corrupt records are reported and
/// skipped.
pub fn recover_queue(dir: &Path, hasher: &DedupHasher) -> io::Result<RecoveredQueue> {
    let mut bases: Vec<(u64, PathBuf)> = Vec::new();
    let mut dedup_files: Vec<(u64, PathBuf)> = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let is_log = name
            .to_str()
            .is_some_and(|n| segment_base(n).is_some() || dedup_number(n).is_some());
        // Files are read whole, and the log may write to this name again:
        // something that only looks like a log (a device, a directory) stops
        // the start instead of being read or written.
        if is_log && !fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
            return Err(io::Error::other(format!(
                "{}: not a regular file; move it out of the data directory",
                entry.path().display()
            )));
        }
        if let Some(base) = name.to_str().and_then(segment_base) {
            bases.push((base, entry.path()));
        } else if let Some(number) = name.to_str().and_then(dedup_number) {
            dedup_files.push((number, entry.path()));
        }
    }
    bases.sort();
    dedup_files.sort();
    let mut out = RecoveredQueue::default();
    let last_dedup = dedup_files.len().saturating_sub(1);
    for (index, (number, path)) in dedup_files.into_iter().enumerate() {
        let data = fs::read(&path)?;
        let mut offset = 0usize;
        let mut newest_ms = 0u64;
        while offset < data.len() {
            match decode(&data[offset..]) {
                Decoded::Record(Record::Dedup(entries), n) => {
                    for (key, at) in entries.iter() {
                        newest_ms = newest_ms.max(at);
                        out.acked.push((DedupKey(key), at, CARRIED));
                    }
                    offset += n;
                }
                Decoded::Record(_, n) | Decoded::Corrupt(n, _) => {
                    out.problems.push(format!(
                        "{}: offset {offset}: not a valid dedup record, skipped",
                        path.display()
                    ));
                    offset += n;
                }
                Decoded::Torn | Decoded::BadLength => {
                    out.problems.push(format!(
                        "{}: offset {offset}: torn tail of {} bytes dropped",
                        path.display(),
                        data.len() - offset
                    ));
                    if index == last_dedup {
                        truncate(&path, offset as u64)?;
                    }
                    break;
                }
            }
        }
        out.dedup_files.push(RecoveredDedupFile {
            number,
            path,
            len: offset as u64,
            newest_ms,
        });
    }
    let mut live: BTreeMap<u64, (Arc<Message>, u32, usize)> = BTreeMap::new();
    let mut senders: std::collections::HashMap<String, Arc<str>> = Default::default();
    let last = bases.len().saturating_sub(1);
    for (index, (base, path)) in bases.into_iter().enumerate() {
        let data = fs::read(&path)?;
        let mut offset = 0usize;
        let mut valid_len = data.len();
        while offset < data.len() {
            match decode(&data[offset..]) {
                Decoded::Record(record, n) => {
                    match record {
                        Record::Message {
                            seq,
                            sender,
                            message_id,
                            exchange,
                            routing_key,
                            sent_at_ms,
                            body,
                        } => {
                            let sender = senders
                                .entry(sender.to_owned())
                                .or_insert_with(|| Arc::from(sender))
                                .clone();
                            let route = Route {
                                exchange,
                                routing_key,
                                sent_at_ms,
                            };
                            let msg = Message::published(message_id, body, sender, route);
                            live.insert(seq, (msg, 0, index));
                            out.next_seq = out.next_seq.max(seq + 1);
                        }
                        Record::Ack { seq, acked_at_ms } => {
                            if let Some((msg, _, _)) = live.remove(&seq) {
                                out.acked.push((msg.dedup_key(hasher), acked_at_ms, seq));
                            }
                        }
                        Record::Dedup(entries) => {
                            out.acked
                                .extend(entries.iter().map(|(key, at)| (DedupKey(key), at, base)));
                        }
                        Record::Delivered { seq, count, .. } => {
                            if let Some(entry) = live.get_mut(&seq) {
                                entry.1 = entry.1.max(count);
                            }
                        }
                    }
                    offset += n;
                }
                Decoded::Corrupt(n, why) => {
                    out.problems.push(format!(
                        "{}: offset {offset}: corrupt record ({why}), skipped",
                        path.display()
                    ));
                    offset += n;
                }
                Decoded::Torn | Decoded::BadLength if index == last => {
                    out.problems.push(format!(
                        "{}: offset {offset}: torn tail of {} bytes truncated",
                        path.display(),
                        data.len() - offset
                    ));
                    valid_len = offset;
                    truncate(&path, offset as u64)?;
                    break;
                }
                Decoded::Torn | Decoded::BadLength => {
                    out.problems.push(format!(
                        "{}: offset {offset}: unreadable record length; the rest of this segment is skipped",
                        path.display()
                    ));
                    break;
                }
            }
        }
        out.segments.push(RecoveredSegment {
            base,
            path,
            len: valid_len as u64,
            live: 0,
        });
        out.next_seq = out.next_seq.max(base);
    }
    for (seq, (msg, deliveries, segment)) in live {
        out.segments[segment].live += 1;
        out.messages.push(RecoveredMessage {
            seq,
            msg,
            deliveries,
        });
    }
    Ok(out)
}

fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let file = fs::OpenOptions::new().write(true).open(path)?;
    file.set_len(len)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::{encode, DedupEntries};
    use crate::log::segment_path;

    fn msg(seq: u64, id: &str) -> Record<'_> {
        Record::Message {
            seq,
            sender: "s1",
            message_id: id,
            exchange: "e",
            routing_key: "k",
            sent_at_ms: 1,
            body: "{}",
        }
    }

    fn write(path: &Path, records: &[Record<'_>]) -> Vec<u8> {
        let mut buf = Vec::new();
        for r in records {
            encode(r, &mut buf);
        }
        fs::write(path, &buf).unwrap();
        buf
    }

    #[test]
    fn restores_unacked_in_order_with_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut carried = Vec::new();
        DedupEntries::pack(&[(99, 4)], &mut carried);
        write(
            &segment_path(dir.path(), 0),
            &[
                msg(0, "a"),
                msg(1, "b"),
                Record::Delivered {
                    seq: 1,
                    count: 2,
                    delivered_at_ms: 3,
                },
                Record::Ack {
                    seq: 0,
                    acked_at_ms: 5,
                },
            ],
        );
        write(
            &segment_path(dir.path(), 2),
            &[
                msg(2, "c"),
                Record::Delivered {
                    seq: 2,
                    count: 1,
                    delivered_at_ms: 3,
                },
                Record::Dedup(DedupEntries::new(&carried).unwrap()),
            ],
        );
        let q = recover_queue(dir.path(), &DedupHasher::random()).unwrap();
        let got: Vec<_> = q
            .messages
            .iter()
            .map(|m| (m.seq, m.msg.message_id().to_owned(), m.deliveries))
            .collect();
        assert_eq!(got, [(1, "b".into(), 2), (2, "c".into(), 1)]);
        assert_eq!(q.next_seq, 3);
        assert_eq!(q.acked.len(), 2);
        assert_eq!((q.acked[0].1, q.acked[0].2), (5, 0), "acked message 0");
        assert_eq!(
            q.acked[1],
            (DedupKey(99), 4, 2),
            "carried, held by segment 2"
        );
        assert_eq!(
            q.segments.iter().map(|s| s.live).collect::<Vec<_>>(),
            [1, 1]
        );
        assert!(q.problems.is_empty());
    }

    #[test]
    fn a_segment_that_is_not_a_regular_file_stops_recovery_unread() {
        let dir = tempfile::tempdir().unwrap();
        write(&segment_path(dir.path(), 0), &[msg(0, "a")]);
        // Reading this one whole would never end; writing to it would lose data.
        let odd = segment_path(dir.path(), 1);
        std::os::unix::fs::symlink("/dev/zero", &odd).unwrap();
        let err = recover_queue(dir.path(), &DedupHasher::random()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("not a regular file"), "{text}");
        assert!(text.contains(&odd.display().to_string()), "{text}");
    }

    #[test]
    fn truncates_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let buf = write(&path, &[msg(0, "a"), msg(1, "b")]);
        fs::write(&path, &buf[..buf.len() - 3]).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random()).unwrap();
        assert_eq!(q.messages.len(), 1);
        assert_eq!(q.problems.len(), 1);
        assert!(q.problems[0].contains("torn tail"));
        assert!(fs::metadata(&path).unwrap().len() < buf.len() as u64 - 3);
    }

    #[test]
    fn reports_a_flipped_bit_and_never_serves_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let mut buf = write(&path, &[msg(0, "a"), msg(1, "b"), msg(2, "c")]);
        let second = buf.len() / 2; // inside the second record
        buf[second] ^= 0x01;
        fs::write(&path, &buf).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random()).unwrap();
        let ids: Vec<_> = q
            .messages
            .iter()
            .map(|m| m.msg.message_id().to_owned())
            .collect();
        assert_eq!(ids, ["a", "c"]);
        assert_eq!(q.problems.len(), 1);
        assert!(q.problems[0].contains("offset") && q.problems[0].contains("corrupt"));
    }
}
