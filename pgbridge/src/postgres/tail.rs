//! Reading the queues' logs behind the broker, into a [`Batch`].
//!
//! The broker appends to `{data_dir}/queues/{queue}/segment-{base:020}.log`
//! while this reads, and deletes whole old segments. The file format, the
//! record walk and the rule of which segments are finished are the shard
//! crate's (`ciphermq_shard::log::segment`), shared with recovery. Each
//! queue's listing is taken *before* reading, so a segment that is not the
//! newest in it is complete: its end is final. At the end of the newest
//! segment an incomplete record is a write in progress: reading stops there
//! and resumes on the next tick. Reads are chunked ([`CHUNK_BYTES`]) and grow
//! only while a record or a damaged range is not decided, so memory stays
//! small.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ciphermq_shard::log::segment::{self, End, Layout, Step, FILE_HEADER};
use ciphermq_shard::log::segment_path;

use super::batch::{Batch, Position};

/// Most bytes read from a segment at a time (more only for one larger
/// record).
pub(crate) const CHUNK_BYTES: usize = 4 << 20;
/// The first read of a segment: a batch usually needs far less than a full
/// chunk, and the rest would be read again for the next batch.
const FIRST_CHUNK_BYTES: usize = 256 << 10;

/// A file or directory that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub(crate) struct TailError {
    /// The file or directory.
    pub(crate) path: PathBuf,
    /// The OS error.
    pub(crate) source: io::Error,
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> TailError + '_ {
    move |source| TailError {
        path: path.to_owned(),
        source,
    }
}

/// The queue names under `{data_dir}/queues` (none if it does not exist yet).
pub(crate) fn list_queues(data_dir: &Path) -> Result<Vec<String>, TailError> {
    let dir = data_dir.join("queues");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(at(&dir)(e)),
    };
    let mut queues = Vec::new();
    for entry in entries {
        let entry = entry.map_err(at(&dir))?;
        if !entry.file_type().map_err(at(&dir))?.is_dir() {
            continue;
        }
        if let Ok(name) = entry.file_name().into_string() {
            // A deleted queue's directory, on its way out: never mirrored.
            if !ciphermq_shard::durability::is_deleted_dir_name(&name) {
                queues.push(name);
            }
        }
    }
    queues.sort();
    Ok(queues)
}

/// The segment bases in a queue's directory, oldest first.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>, TailError> {
    let listing = segment::list(dir).map_err(at(dir))?;
    Ok(listing.bases().collect())
}

/// Stalls already logged (queue, segment, offset), so a damaged tail is
/// reported once rather than on every tick.
#[derive(Debug, Default)]
pub(crate) struct Reported(HashSet<(Arc<str>, u64, u64)>);

impl Reported {
    /// `true` the first time `(queue, base, offset)` is seen.
    fn first(&mut self, queue: &Arc<str>, base: u64, offset: u64) -> bool {
        self.0.insert((queue.clone(), base, offset))
    }
}

/// How reading one queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueEnd {
    /// Everything readable is in the batch.
    CaughtUp,
    /// The batch filled first.
    BatchFull,
}

/// How reading one segment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegmentEnd {
    /// The batch is full.
    Full,
    /// The newest segment: everything written so far is consumed.
    Tail,
    /// An older segment, finished: go on with the next one.
    Done,
}

/// The next segment base after `base` in `bases`.
fn next_base(bases: &[u64], base: u64) -> Option<u64> {
    bases.iter().copied().find(|b| *b > base)
}

/// Reads `queue`'s new records (in `dir`) from `start` into `batch`, moving
/// the queue's position in the batch. `start` is the committed position, or
/// `None` for a queue never mirrored (its oldest segment, offset 0).
pub(crate) fn read_queue(
    dir: &Path,
    queue: &Arc<str>,
    start: Option<Position>,
    batch: &mut Batch,
    reported: &mut Reported,
) -> Result<QueueEnd, TailError> {
    let listing = segment::list(dir).map_err(at(dir))?;
    let bases: Vec<u64> = listing.bases().collect();
    let Some(&oldest) = bases.first() else {
        return Ok(QueueEnd::CaughtUp);
    };
    let mut pos = match start {
        None => Position {
            base: oldest,
            offset: 0,
        },
        Some(p) if bases.binary_search(&p.base).is_ok() => p,
        Some(p) => {
            // Deleted while the mirror had let go (disk budget). Segments are
            // deleted oldest first, so continue with the next one; if every
            // segment is older, the queue's log started over.
            let resume = next_base(&bases, p.base).unwrap_or(oldest);
            batch.miss(queue, p, resume);
            Position {
                base: resume,
                offset: 0,
            }
        }
    };
    loop {
        let path = segment_path(dir, pos.base);
        // Only the newest segment of the listing may still be written.
        let is_newest = !listing.is_complete(pos.base);
        // Never through a symbolic link, as every open of a log file: one
        // planted under a segment's name fails with `ELOOP`.
        let mut file = match segment::open_options().read(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Deleted since the listing: the same as a missing watermark.
                let Some(resume) = next_base(&bases, pos.base) else {
                    return Ok(QueueEnd::CaughtUp);
                };
                batch.miss(queue, pos, resume);
                pos = Position {
                    base: resume,
                    offset: 0,
                };
                continue;
            }
            Err(e) => return Err(at(&path)(e)),
        };
        let (end, offset) = read_segment(&mut file, &path, queue, pos, is_newest, batch, reported)
            .map_err(at(&path))?;
        if offset != pos.offset {
            pos.offset = offset;
            batch.advance(queue, pos);
        }
        match end {
            SegmentEnd::Full => return Ok(QueueEnd::BatchFull),
            SegmentEnd::Tail => return Ok(QueueEnd::CaughtUp),
            SegmentEnd::Done => {
                let Some(next) = next_base(&bases, pos.base) else {
                    return Ok(QueueEnd::CaughtUp);
                };
                pos = Position {
                    base: next,
                    offset: 0,
                };
                batch.advance(queue, pos);
            }
        }
    }
}

/// How the file at hand lays out its records, from its first bytes.
fn layout_of(file: &mut File) -> io::Result<Layout> {
    let mut head = Vec::with_capacity(FILE_HEADER.len());
    file.seek(SeekFrom::Start(0))?;
    (&mut *file)
        .take(FILE_HEADER.len() as u64)
        .read_to_end(&mut head)?;
    if head.len() == FILE_HEADER.len() && head != FILE_HEADER {
        // An earlier version's file, or a damaged header: decided on more.
        head.clear();
        file.seek(SeekFrom::Start(0))?;
        (&mut *file)
            .take(FIRST_CHUNK_BYTES as u64)
            .read_to_end(&mut head)?;
    }
    Ok(segment::layout(&head))
}

/// Reads one segment from `start` until its end, a stall, or a full batch;
/// returns how it ended and the offset after the last record consumed.
fn read_segment(
    file: &mut File,
    path: &Path,
    queue: &Arc<str>,
    start: Position,
    is_newest: bool,
    batch: &mut Batch,
    reported: &mut Reported,
) -> io::Result<(SegmentEnd, u64)> {
    let layout = layout_of(file)?;
    let mut offset = start.offset.max(layout.start as u64);
    let mut want = FIRST_CHUNK_BYTES;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        file.seek(SeekFrom::Start(offset))?;
        (&mut *file).take(want as u64).read_to_end(&mut buf)?;
        // A short read is the end of the file (as of now).
        let at_eof = buf.len() < want;
        let mut i = 0;
        let end = loop {
            match segment::step(&buf, i, layout.framing, at_eof) {
                Step::Record(record, n) => {
                    if !batch.add(queue, &record) {
                        break Some(SegmentEnd::Full);
                    }
                    i += n;
                }
                Step::Damaged { len, why } => {
                    tracing::error!(file = %path.display(), offset = offset + i as u64, bytes = len, why, "damaged log bytes skipped by the metadata mirror; if they held a message, that row is missing");
                    i += len;
                }
                Step::NeedMore | Step::End(End::Clean) if !at_eof => break None,
                Step::NeedMore | Step::End(End::Clean) => {
                    break Some(if is_newest {
                        SegmentEnd::Tail
                    } else {
                        SegmentEnd::Done
                    })
                }
                // The newest segment's end may be a write in progress.
                Step::End(End::Torn { .. }) if is_newest => break Some(SegmentEnd::Tail),
                Step::End(End::Damaged { why, .. }) if is_newest => {
                    if reported.first(queue, start.base, offset + i as u64) {
                        tracing::warn!(file = %path.display(), offset = offset + i as u64, why, "bytes at the end of the active segment do not check; the metadata mirror waits for the broker to move past them");
                    }
                    break Some(SegmentEnd::Tail);
                }
                Step::End(End::Torn { len }) => {
                    // A write that failed before the broker moved on.
                    tracing::warn!(file = %path.display(), offset = offset + i as u64, bytes = len, "incomplete record at the end of a finished segment skipped by the metadata mirror");
                    break Some(SegmentEnd::Done);
                }
                Step::End(End::Damaged { len, why }) => {
                    tracing::error!(file = %path.display(), offset = offset + i as u64, bytes = len, why, "damaged bytes at the end of a finished segment skipped by the metadata mirror; if they held messages, those rows are missing");
                    break Some(SegmentEnd::Done);
                }
            }
        };
        offset += i as u64;
        match end {
            Some(end) => return Ok((end, offset)),
            // Undecided: read on from the last decided byte, in a larger
            // chunk when nothing in this one could be decided.
            None => {
                want = if i == 0 {
                    want.saturating_mul(2)
                } else {
                    want.max(CHUNK_BYTES.min(want * 2))
                };
            }
        }
    }
}

/// A queue's backlog for the disk budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueLag {
    /// Bytes in segment files past the position.
    pub(crate) bytes: u64,
    /// The segment base the broker must keep from (the position's, or the
    /// oldest segment for a queue never mirrored); `None` without segments.
    pub(crate) hold: Option<u64>,
}

/// The backlog of the queue in `dir` at `position` (stats only the segments
/// at or past it).
pub(crate) fn queue_lag(dir: &Path, position: Option<Position>) -> Result<QueueLag, TailError> {
    let bases = list_segments(dir)?;
    let mut bytes = 0u64;
    for &base in &bases {
        if position.is_some_and(|p| base < p.base) {
            continue;
        }
        let path = segment_path(dir, base);
        let len = match fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(at(&path)(e)),
        };
        // The file header is no backlog.
        let from = match position {
            Some(p) if p.base == base => p.offset,
            _ => 0,
        };
        bytes += len.saturating_sub(from.max(FILE_HEADER.len() as u64));
    }
    Ok(QueueLag {
        bytes,
        hold: position.map(|p| p.base).or(bases.first().copied()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciphermq_shard::log::record::{encode, Record};
    use std::io::Write;

    /// Where a segment's first record starts.
    const H: u64 = FILE_HEADER.len() as u64;

    fn message(seq: u64) -> Record<'static> {
        Record::Message {
            seq,
            sender: "s",
            message_id: "m",
            exchange: "e",
            routing_key: "k",
            sent_at_ms: 1_000 + seq,
            body: "{\"x\": 1}",
        }
    }

    fn bytes(records: &[Record<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            encode(r, &mut out);
        }
        out
    }

    /// Appends `data` to a segment, starting a new file with its header.
    fn append(dir: &Path, base: u64, data: &[u8]) {
        fs::create_dir_all(dir).unwrap();
        let path = segment_path(dir, base);
        let new = !path.exists();
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        if new {
            file.write_all(&FILE_HEADER).unwrap();
        }
        file.write_all(data).unwrap();
    }

    fn read(dir: &Path, start: Option<Position>, limit: usize) -> (QueueEnd, Batch) {
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(limit);
        let end = read_queue(dir, &q, start, &mut batch, &mut Reported::default()).unwrap();
        (end, batch)
    }

    fn position(batch: Batch) -> Option<Position> {
        batch.into_columns().positions.get("q").copied()
    }

    #[test]
    fn reads_across_segments_and_stops_at_a_torn_tail() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let first = bytes(&[message(0), message(1)]);
        append(&dir, 0, &first);
        let second = bytes(&[message(2)]);
        let half = bytes(&[message(3)]);
        append(&dir, 2, &second);
        append(&dir, 2, &half[..half.len() / 2]);

        let (end, batch) = read(&dir, None, 100);
        assert_eq!(end, QueueEnd::CaughtUp);
        assert_eq!(batch.rows(), 3);
        let pos = position(batch).unwrap();
        assert_eq!(
            pos,
            Position {
                base: 2,
                offset: H + second.len() as u64
            }
        );

        // The writer finishes the record: the next read picks it up.
        append(&dir, 2, &half[half.len() / 2..]);
        let (_, batch) = read(&dir, Some(pos), 100);
        let cols = batch.into_columns();
        assert_eq!(cols.inserts.seq, [3]);
        assert_eq!(
            cols.positions["q"].offset,
            H + (second.len() + half.len()) as u64
        );
    }

    #[test]
    fn a_full_batch_stops_before_the_record_it_could_not_take() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let one = bytes(&[message(0)]);
        append(&dir, 0, &bytes(&[message(0), message(1), message(2)]));
        let (end, batch) = read(&dir, None, 1);
        assert_eq!(end, QueueEnd::BatchFull);
        let pos = position(batch).unwrap();
        assert_eq!(
            pos,
            Position {
                base: 0,
                offset: H + one.len() as u64
            }
        );
        let (end, batch) = read(&dir, Some(pos), 5);
        assert_eq!(end, QueueEnd::CaughtUp);
        assert_eq!(batch.into_columns().inserts.seq, [1, 2]);
    }

    #[test]
    fn a_corrupt_record_is_skipped_once_later_bytes_exist() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let mut data = bytes(&[message(0), message(1)]);
        let first_len = bytes(&[message(0)]).len();
        data[first_len + 12] ^= 0xff; // inside record 1's payload
        append(&dir, 0, &data);
        // At the very end of the active segment it may still be in flight.
        let (_, batch) = read(&dir, None, 10);
        let cols = batch.into_columns();
        assert_eq!(cols.inserts.seq, [0]);
        assert_eq!(cols.positions["q"].offset, H + first_len as u64);
        // Once a later record exists, it is skipped.
        append(&dir, 0, &bytes(&[message(2)]));
        let (_, batch) = read(&dir, None, 10);
        let cols = batch.into_columns();
        assert_eq!(cols.inserts.seq, [0, 2]);
    }

    #[test]
    fn a_torn_or_unreadable_older_segment_is_left_for_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let mut first = bytes(&[message(0)]);
        first.extend_from_slice(&[0, 0, 0, 0, 1, 2, 3, 4, 5, 6]); // length 0
        append(&dir, 0, &first);
        let torn = bytes(&[message(1)]);
        append(&dir, 1, &torn[..5]);
        append(&dir, 2, &bytes(&[message(2)]));
        let (end, batch) = read(&dir, None, 10);
        assert_eq!(end, QueueEnd::CaughtUp);
        let cols = batch.into_columns();
        assert_eq!(cols.inserts.seq, [0, 2]);
        assert_eq!(cols.positions["q"].base, 2);
    }

    #[test]
    fn bad_length_in_the_active_segment_waits_for_a_newer_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let mut data = bytes(&[message(0)]);
        let good = H + data.len() as u64;
        data.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 9, 9]);
        append(&dir, 0, &data);
        let (_, batch) = read(&dir, None, 10);
        let pos = position(batch).unwrap();
        assert_eq!(
            pos,
            Position {
                base: 0,
                offset: good
            }
        );
        append(&dir, 1, &bytes(&[message(1)]));
        let (_, batch) = read(&dir, Some(pos), 10);
        assert_eq!(batch.into_columns().inserts.seq, [1]);
    }

    #[test]
    fn a_segment_name_that_is_a_symbolic_link_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let elsewhere = tmp.path().join("elsewhere");
        append(&elsewhere, 0, &bytes(&[message(0)]));
        fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(segment_path(&elsewhere, 0), segment_path(&dir, 0)).unwrap();
        let q: Arc<str> = Arc::from("q");
        let mut batch = Batch::new(10);
        let err = read_queue(&dir, &q, None, &mut batch, &mut Reported::default())
            .expect_err("a link is refused");
        assert!(format!("{err:?}").contains("segment-"), "{err:?}");
        assert_eq!(batch.rows(), 0);
    }

    #[test]
    fn a_deleted_watermark_segment_is_a_miss_and_reading_goes_on() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        append(&dir, 5, &bytes(&[message(5)]));
        let (_, batch) = read(
            &dir,
            Some(Position {
                base: 0,
                offset: 30,
            }),
            10,
        );
        let cols = batch.into_columns();
        assert_eq!(cols.missed.len(), 1);
        assert_eq!(
            cols.missed[0].from,
            Position {
                base: 0,
                offset: 30
            }
        );
        assert_eq!(cols.missed[0].resume_base, 5);
        assert_eq!(cols.inserts.seq, [5]);
    }

    #[test]
    fn a_record_larger_than_a_chunk_is_read_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let body = "x".repeat(CHUNK_BYTES + 1000);
        let big = Record::Message {
            seq: 0,
            sender: "s",
            message_id: "big",
            exchange: "e",
            routing_key: "k",
            sent_at_ms: 1,
            body: &body,
        };
        // Starts mid-chunk so it is torn at the first chunk's end.
        append(&dir, 0, &bytes(&[message(7), big, message(8)]));
        let (end, batch) = read(&dir, None, 10);
        assert_eq!(end, QueueEnd::CaughtUp);
        assert_eq!(batch.into_columns().inserts.seq, [0, 7, 8]);
    }

    #[test]
    fn a_segment_larger_than_several_chunks_is_read_to_its_end() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        let records: Vec<Record<'_>> = (0..100_000).map(message).collect();
        let data = bytes(&records);
        assert!(data.len() > CHUNK_BYTES);
        append(&dir, 0, &data);
        let (end, batch) = read(&dir, None, 200_000);
        assert_eq!(end, QueueEnd::CaughtUp);
        let cols = batch.into_columns();
        assert_eq!(cols.rows, 100_000);
        assert_eq!(cols.positions["q"].offset, H + data.len() as u64);
    }

    #[test]
    fn lag_counts_bytes_past_the_position() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("q");
        append(&dir, 0, &[0u8; 100]);
        append(&dir, 10, &[0u8; 50]);
        let all = queue_lag(&dir, None).unwrap();
        assert_eq!(
            all,
            QueueLag {
                bytes: 150,
                hold: Some(0)
            }
        );
        let part = queue_lag(
            &dir,
            Some(Position {
                base: 0,
                offset: H + 40,
            }),
        )
        .unwrap();
        assert_eq!(part.bytes, 110);
        let later = queue_lag(
            &dir,
            Some(Position {
                base: 10,
                offset: H + 50,
            }),
        )
        .unwrap();
        assert_eq!(
            later,
            QueueLag {
                bytes: 0,
                hold: Some(10)
            }
        );
        assert_eq!(
            queue_lag(&tmp.path().join("none"), None).unwrap().hold,
            None
        );
    }

    #[test]
    fn queues_are_the_directories_under_queues() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(list_queues(tmp.path()).unwrap().is_empty());
        fs::create_dir_all(tmp.path().join("queues/b")).unwrap();
        fs::create_dir_all(tmp.path().join("queues/a")).unwrap();
        fs::write(tmp.path().join("queues/stray.txt"), b"").unwrap();
        assert_eq!(list_queues(tmp.path()).unwrap(), ["a", "b"]);
    }
}
