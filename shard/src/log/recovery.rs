//! Reading one queue's log at start-up (before the shards serve, so plain
//! blocking file I/O is fine here).
//!
//! Every file is walked with [`segment::step`]: records are replayed, a torn
//! end is cut off, and damaged bytes are moved out: copied to a quarantine
//! file beside their file (synced), then replaced in place by a padding
//! frame of the same length (or cut off, at the end of the file), so the
//! next start and the metadata mirror read the file clean. Each damaged
//! range is returned as a [`Damage`] for the log, the metrics and `/ready`.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backlog::{DiskBacklog, Run};
use crate::dedup::file::RecoveredDedupFile;
use crate::dedup::{DedupHasher, DedupKey};
use crate::dedup::{IdSet, Tick};
use crate::log::record::{padding, Framing, Record, SYNC};
use crate::log::segment::{self, End, Step, FILE_HEADER};
use crate::message::Message;

/// A segment found on disk.
#[derive(Debug, Clone)]
pub struct RecoveredSegment {
    /// First sequence number it may hold.
    pub base: u64,
    /// Its file.
    pub path: PathBuf,
    /// Its valid length in bytes (after truncating a torn tail): where an
    /// append would go.
    pub len: u64,
    /// Messages in it not yet acked.
    pub live: u64,
    /// Written by this version (v2 frames): new records may follow. Files of
    /// earlier versions are read, never appended to.
    pub appendable: bool,
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
    /// The base of the segment holding its record.
    pub segment: u64,
    /// Where its record starts there.
    pub offset: u64,
}

/// Damaged bytes found in a log file, moved out of it and never served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The log file.
    pub file: PathBuf,
    /// Where the damaged range starts.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
    /// Frames that started in it (sync markers seen; at least one): the
    /// records lost, as near as can be told.
    pub records: u64,
    /// What was wrong at its start.
    pub why: &'static str,
    /// Where its bytes were saved, or why they could not be.
    pub quarantine: Result<PathBuf, String>,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: offset {}: {} damaged bytes (about {} records; {}) skipped, ",
            self.file.display(),
            self.offset,
            self.bytes,
            self.records,
            self.why
        )?;
        match &self.quarantine {
            Ok(path) => write!(f, "saved to {}", path.display()),
            Err(e) => write!(f, "not saved: {e}"),
        }
    }
}

/// What a queue's log held.
#[derive(Debug, Default)]
pub struct RecoveredQueue {
    /// Unacked messages in queue order, as runs of their segments: their
    /// bodies are not read (a restart costs per segment, not per message).
    pub backlog: Vec<Run>,
    /// Unacked messages a `purge_queue` took (its purge record is in the
    /// log, their ack records not yet): gone for consumers, to be read
    /// through and settled, as the purge had begun to.
    pub purged: Vec<Run>,
    /// Delivery counts of unacked messages delivered before, by seq.
    pub deliveries: Vec<(u64, u32)>,
    /// The ids to remember: every unacked message's (stored), and those
    /// acked within the dedup window.
    pub dedup: IdSet,
    /// The next sequence number to use.
    pub next_seq: u64,
    /// Segments in base order.
    pub segments: Vec<RecoveredSegment>,
    /// Acked ids within the window whose evidence is a segment, with their
    /// ack time (Unix ms) and a sequence number of that segment (the
    /// message's own, or the segment of a carried dedup record): carried to
    /// the dedup file when that segment goes. Those whose evidence is a
    /// dedup file are only in `dedup`.
    pub acked: Vec<(DedupKey, u64, u64)>,
    /// Damaged ranges found, each moved to a quarantine file.
    pub damage: Vec<Damage>,
    /// Torn ends cut off: (file, offset, bytes). A crash during a write
    /// leaves one; it was never acknowledged.
    pub torn: Vec<(PathBuf, u64, u64)>,
    /// Dedup files (ids carried out of deleted segments), oldest first.
    pub dedup_files: Vec<RecoveredDedupFile>,
}

impl RecoveredQueue {
    /// Unacked messages recovered.
    pub fn message_count(&self) -> u64 {
        self.backlog.iter().map(|r| r.count).sum()
    }

    /// Reads the unacked messages' bodies back from their segments, in
    /// queue order, with blocking I/O (tools and tests; the broker reads
    /// them lazily, through its shards' readers).
    pub fn read_back(&self) -> io::Result<Vec<RecoveredMessage>> {
        let mut reader = self.reader();
        let mut all = Vec::new();
        loop {
            let batch = reader.next_batch(usize::MAX, usize::MAX)?;
            if batch.is_empty() {
                return Ok(all);
            }
            all.extend(batch);
        }
    }

    /// Reads the unacked messages back a batch at a time, in queue order,
    /// with blocking I/O: a backlog bigger than memory can be carried
    /// elsewhere (a hand-back, an adoption) holding one batch at a time.
    pub fn reader(&self) -> BacklogReader<'_> {
        let mut backlog = DiskBacklog::default();
        for run in &self.backlog {
            backlog.push_run(run.clone(), []);
        }
        backlog.push_deliveries(self.deliveries.iter().copied());
        BacklogReader {
            queue: self,
            backlog,
            entries: std::collections::VecDeque::new(),
        }
    }
}

/// A recovered queue's backlog read back in batches
/// ([`RecoveredQueue::reader`]).
pub struct BacklogReader<'a> {
    queue: &'a RecoveredQueue,
    backlog: DiskBacklog,
    /// Decoded but not yet returned.
    entries: std::collections::VecDeque<crate::queue::Entry>,
}

impl BacklogReader<'_> {
    /// The next messages, at most `max` of them and, past the first, of
    /// at most `max_bytes` of bodies (at least one unless the backlog is
    /// read through: then none), in queue order.
    pub fn next_batch(
        &mut self,
        max: usize,
        max_bytes: usize,
    ) -> io::Result<Vec<RecoveredMessage>> {
        let mut bytes: usize = self.entries.iter().map(|e| e.msg.body().len()).sum();
        while self.entries.len() < max.max(1) && bytes < max_bytes {
            let Some((segment, offset, len)) = self.backlog.next_read() else {
                break;
            };
            let path = self
                .queue
                .segments
                .iter()
                .find(|s| s.base == segment)
                .map(|s| s.path.clone())
                .ok_or_else(|| io::Error::other(format!("no segment {segment}")))?;
            let file = segment::open_options().read(true).open(&path)?;
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                match file.read_at(&mut buf[got..], offset + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            let before = self.entries.len();
            self.backlog
                .absorb(segment, offset, len, &buf[..got], &mut self.entries);
            bytes += self
                .entries
                .range(before..)
                .map(|e| e.msg.body().len())
                .sum::<usize>();
        }
        let mut take = 0;
        let mut taken_bytes = 0;
        for e in self.entries.iter().take(max) {
            if take > 0 && taken_bytes + e.msg.body().len() > max_bytes {
                break;
            }
            take += 1;
            taken_bytes += e.msg.body().len();
        }
        Ok(self
            .entries
            .drain(..take)
            .map(|e| RecoveredMessage {
                seq: e.seq,
                msg: e.msg,
                deliveries: e.deliveries,
                segment: e.segment,
                offset: u64::from(e.offset),
            })
            .collect())
    }
}

/// Unacked messages found so far, as runs, while a queue's files are read.
#[derive(Default)]
struct LiveRuns {
    runs: Vec<Run>,
    /// Runs were not found in sequence order (damaged logs): look up by scan.
    unsorted: bool,
    deliveries: HashMap<u64, u32>,
    /// Acks of an earlier version's logs, which carry no key: (seq, Unix ms
    /// of the ack), resolved once every segment is read.
    keyless_acks: Vec<(u64, u64)>,
    /// Purge records found: (upto, kept ascending).
    purges: Vec<(u64, Vec<u64>)>,
}

impl LiveRuns {
    fn push(&mut self, seq: u64, segment: u64, at: u64, len: u64, body: u64) {
        if let Some(last) = self.runs.last_mut() {
            if last.segment == segment && seq > last.last_seq && at >= last.end {
                if seq > last.last_seq + 1 {
                    last.holes.push((last.last_seq + 1, seq));
                }
                last.end = at + len;
                last.last_seq = seq;
                last.count += 1;
                last.bytes += body;
                return;
            }
            if seq <= last.last_seq {
                self.unsorted = true;
            }
        }
        self.runs.push(Run {
            segment,
            framing: Framing::V2,
            offset: at,
            end: at + len,
            first_seq: seq,
            last_seq: seq,
            count: 1,
            bytes: body,
            holes: Vec::new(),
        });
    }

    /// The run holding `seq` as a live message.
    fn find(&mut self, seq: u64) -> Option<&mut Run> {
        let i = if self.unsorted {
            self.runs
                .iter()
                .rposition(|r| r.first_seq <= seq && seq <= r.last_seq && !r.is_hole(seq))?
        } else {
            let i = self.runs.partition_point(|r| r.last_seq < seq);
            let r = self.runs.get(i)?;
            if seq < r.first_seq || r.is_hole(seq) {
                return None;
            }
            i
        };
        self.runs.get_mut(i)
    }

    fn holds(&mut self, seq: u64) -> bool {
        self.find(seq).is_some()
    }

    /// Acks `seq`; false when it is not a live message.
    fn ack(&mut self, seq: u64) -> bool {
        self.deliveries.remove(&seq);
        match self.find(seq) {
            Some(run) => {
                run.add_hole(seq);
                true
            }
            None => false,
        }
    }
}

/// How walking one file went.
struct Walked {
    /// Where its valid bytes end.
    len: u64,
    /// Its frames are v2.
    appendable: bool,
}

/// Bytes of a file recovery holds at once, unless one record is larger: a
/// window slides over the file, so a restart's memory does not grow with
/// segment size times cores.
const WALK_WINDOW: usize = 4 << 20;

/// Reads up to `want` more bytes of `file` at `offset` onto the end of `buf`.
fn read_more(file: &fs::File, offset: u64, want: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    let start = buf.len();
    buf.resize(start + want, 0);
    let mut got = 0;
    while got < want {
        match file.read_at(&mut buf[start + got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(start + got);
    Ok(())
}

/// Whether the sync marker occurs anywhere in `file` from `offset` on, read
/// a window at a time (a marker may straddle two windows).
fn sync_marker_after(file: &fs::File, offset: u64, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut at = offset;
    loop {
        buf.clear();
        read_more(file, at, WALK_WINDOW, buf)?;
        if memchr::memmem::find(buf, &SYNC).is_some() {
            return Ok(true);
        }
        if buf.len() < WALK_WINDOW {
            return Ok(false);
        }
        at += (buf.len() - (SYNC.len() - 1)) as u64;
    }
}

/// Walks the file at `path`, handing each record to `visit`, repairing it
/// as it goes (torn end cut, damage quarantined) and noting what it found in
/// `out`.
///
/// `buf` is reused from file to file: a fresh buffer per segment cost
/// more in page faults than reading the bytes into it.
fn walk_file(
    path: &Path,
    out: &mut RecoveredQueue,
    buf: &mut Vec<u8>,
    mut visit: impl FnMut(Record<'_>, u64, usize),
) -> io::Result<Walked> {
    let file = segment::open_options().read(true).open(path)?;
    let file_len = file.metadata()?.len();
    buf.clear();
    read_more(&file, 0, WALK_WINDOW, buf)?;
    let mut layout = segment::layout(buf);
    if layout.framing == Framing::V1 && (buf.len() as u64) < file_len {
        // v1 or a damaged v2 header: told by a sync marker anywhere in it.
        let mut scratch = Vec::new();
        if sync_marker_after(
            &file,
            buf.len() as u64 - (SYNC.len() as u64 - 1),
            &mut scratch,
        )? {
            layout.framing = Framing::V2;
            layout.header_damaged = true;
        }
    }
    let mut file_len = file_len;
    if layout.framing == Framing::V2 && (layout.header_damaged || buf.len() < FILE_HEADER.len()) {
        if layout.header_damaged {
            // A file may be shorter than its header (found by fuzzing).
            let header = buf[..FILE_HEADER.len().min(buf.len())].to_vec();
            let damage = quarantine(path, 0, &header, "damaged file header");
            out.damage.push(damage);
        }
        // A header cut short by a crash, or damaged: write it whole.
        let file = segment::open_options().write(true).open(path)?;
        file.write_all_at(&FILE_HEADER, 0)?;
        file.sync_data()?;
        if buf.len() < FILE_HEADER.len() {
            buf.clear();
            buf.extend_from_slice(&FILE_HEADER);
            file_len = FILE_HEADER.len() as u64;
        }
    }
    let mut pos: u64 = match layout.framing {
        Framing::V2 => FILE_HEADER.len() as u64,
        Framing::V1 => 0,
    };
    // `buf` holds the file's bytes from `window` on.
    let mut window = 0u64;
    loop {
        let at_eof = window + buf.len() as u64 >= file_len;
        let rel = (pos - window) as usize;
        let step = if rel >= buf.len() && !at_eof {
            // The window ends exactly at a frame's end.
            Step::NeedMore
        } else {
            segment::step(buf, rel, layout.framing, at_eof)
        };
        match step {
            Step::Record(record, n) => {
                visit(record, pos, n);
                pos += n as u64;
            }
            Step::Damaged { len, why } => {
                let damage = quarantine(path, pos, &buf[rel..rel + len], why);
                // Replaced by padding, the range reads clean from now on.
                if let Some(pad) = padding(layout.framing, len) {
                    let file = segment::open_options().write(true).open(path)?;
                    file.write_all_at(&pad, pos)?;
                    file.sync_data()?;
                }
                out.damage.push(damage);
                pos += len as u64;
            }
            Step::End(end) => {
                match end {
                    End::Clean => {}
                    End::Torn { len } => {
                        tracing::warn!(file = %path.display(), offset = pos, bytes = len, "torn tail truncated (a write cut short by a crash; never acknowledged)");
                        out.torn.push((path.to_owned(), pos, len as u64));
                        truncate(path, pos)?;
                    }
                    End::Damaged { why, .. } => {
                        let damage = quarantine(path, pos, &buf[rel..], why);
                        out.damage.push(damage);
                        truncate(path, pos)?;
                    }
                }
                return Ok(Walked {
                    len: pos,
                    appendable: layout.framing == Framing::V2,
                });
            }
            Step::NeedMore if at_eof => {
                return Err(io::Error::other(format!(
                    "{}: offset {pos}: could not be decided with the whole file read",
                    path.display()
                )))
            }
            // The window ends inside a frame (or a damaged range): slide it
            // to `pos`, and widen it when one frame fills it.
            Step::NeedMore => {
                let rel = rel.min(buf.len());
                buf.drain(..rel);
                window = pos;
                let more = if rel == 0 {
                    buf.len().max(WALK_WINDOW / 4)
                } else {
                    WALK_WINDOW.saturating_sub(buf.len()).max(WALK_WINDOW / 4)
                };
                let end = window + buf.len() as u64;
                read_more(&file, end, more, buf)?;
                if window + buf.len() as u64 == end {
                    // The file is shorter than it was: take the end as it is.
                    file_len = end;
                }
            }
        }
    }
}

/// Copies damaged `bytes` found at `offset` of `file` to their quarantine
/// file (synced, with its directory) and logs them.
fn quarantine(file: &Path, offset: u64, bytes: &[u8], why: &'static str) -> Damage {
    let target = segment::quarantine_path(file, offset);
    let saved = write_synced(&target, bytes).map(|()| target);
    let records = (memchr::memmem::find_iter(bytes, &SYNC).count() as u64).max(1);
    let damage = Damage {
        file: file.to_owned(),
        offset,
        bytes: bytes.len() as u64,
        records,
        why,
        quarantine: saved.map_err(|e| e.to_string()),
    };
    tracing::error!(file = %file.display(), offset, bytes = bytes.len(), why, "{damage}");
    damage
}

/// Writes `bytes` as the file `path` (0600, never through a link; one a
/// previous start left for the same range is replaced) and syncs it and its
/// directory.
fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = segment::open_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    io::Write::write_all(&mut file, bytes)?;
    file.sync_all()?;
    match path.parent() {
        Some(dir) => fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Reads every file of the queue in `dir`: replays the records, truncates
/// torn ends, quarantines damage (see the module doc).
/// `window_ms` is the dedup window: ids acked longer ago are not
/// remembered; every unacked message's id is (its body stays on disk,
/// unread).
pub fn recover_queue(
    dir: &Path,
    hasher: &DedupHasher,
    window_ms: u64,
) -> io::Result<RecoveredQueue> {
    let listing = segment::list(dir)?;
    // Files whose deletion a crash interrupted hold acked records only.
    for path in &listing.freeing {
        match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let mut out = RecoveredQueue {
        dedup: IdSet::new(Duration::from_millis(window_ms)),
        ..RecoveredQueue::default()
    };
    let mut buf = Vec::new();
    let window = Window::new(window_ms);
    for (number, path) in listing.dedup_files {
        let mut newest_ms = 0u64;
        let mut dedup = std::mem::take(&mut out.dedup);
        let walked = walk_file(&path, &mut out, &mut buf, |record, _, _| {
            if let Record::Dedup(entries) = record {
                for (key, at) in entries.iter() {
                    newest_ms = newest_ms.max(at);
                    if let Some(until) = window.until(at) {
                        dedup.ack(DedupKey(key), until);
                    }
                }
            }
        });
        out.dedup = dedup;
        let walked = walked?;
        out.dedup_files.push(RecoveredDedupFile {
            number,
            path,
            len: walked.len,
            newest_ms,
        });
    }
    let mut live = LiveRuns::default();
    // Segments are read and checked on every core, a chunk at a time (each
    // file's events kept until its turn), and replayed in order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let mut bufs: Vec<Vec<u8>> = (0..threads).map(|_| Vec::new()).collect();
    bufs[0] = buf;
    for chunk in listing.segments.chunks(threads) {
        let scans: Vec<(io::Result<FileScan>, Vec<u8>)> = if chunk.len() == 1 {
            let mut b = std::mem::take(&mut bufs[0]);
            let scan = scan_segment(chunk[0].0, &chunk[0].1, hasher, &mut b);
            vec![(scan, b)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = chunk
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|((base, path), b)| {
                        let mut b = std::mem::take(b);
                        scope.spawn(move || {
                            let scan = scan_segment(*base, path, hasher, &mut b);
                            (scan, b)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            (
                                Err(io::Error::other("a recovery thread panicked")),
                                Vec::new(),
                            )
                        })
                    })
                    .collect()
            })
        };
        let mut scanned = Vec::with_capacity(scans.len());
        for (i, (scan, b)) in scans.into_iter().enumerate() {
            bufs[i] = b;
            scanned.push(scan);
        }
        for scan in scanned {
            let scan = scan?;
            replay(scan, &window, &mut live, &mut out);
        }
    }
    let keyless = std::mem::take(&mut live.keyless_acks);
    resolve_keyless_acks(keyless, hasher, &window, &mut out, &mut bufs[0])?;
    // A file of an earlier version is never appended to: when the newest one
    // would take the next message, skip one sequence number so the next
    // segment gets a name of its own.
    if out
        .segments
        .last()
        .is_some_and(|s| !s.appendable && s.base == out.next_seq)
    {
        out.next_seq += 1;
    }
    out.purged = take_purged(&mut live);
    live.runs.retain(|r| r.count > 0);
    for run in live.runs.iter().chain(&out.purged) {
        let i = out.segments.partition_point(|s| s.base < run.segment);
        if let Some(segment) = out.segments.get_mut(i) {
            segment.live += run.count;
        }
    }
    out.deliveries = live.deliveries.into_iter().collect();
    out.deliveries.sort_unstable();
    out.backlog = live.runs;
    Ok(out)
}

/// Applies the purge records found (see [`Record::Purge`]) once every
/// segment is replayed, since acks of purged messages follow their purge:
/// a message still unacked that some purge took (below its `upto`, not
/// among its `kept`) moves from the backlog to the returned runs.
fn take_purged(live: &mut LiveRuns) -> Vec<Run> {
    let purges = std::mem::take(&mut live.purges);
    let Some(upto) = purges.iter().map(|(upto, _)| *upto).max() else {
        return Vec::new();
    };
    // A message below `upto` escaped every purge that reached it only if
    // each one kept it; the purges up to `upto` are among them, so such a
    // message is among their kept.
    let escaped = |seq: u64| {
        purges
            .iter()
            .filter(|(u, _)| *u > seq)
            .all(|(_, kept)| kept.binary_search(&seq).is_ok())
    };
    let mut exempt: Vec<u64> = purges
        .iter()
        .filter(|(u, _)| *u == upto)
        .flat_map(|(_, kept)| kept.iter().copied())
        .filter(|&seq| escaped(seq))
        .collect();
    exempt.sort_unstable();
    exempt.dedup();
    let mut purged = Vec::new();
    for run in &mut live.runs {
        if run.count == 0 || run.first_seq >= upto {
            continue;
        }
        let last = run.last_seq.min(upto - 1);
        let kept: Vec<u64> = exempt
            .iter()
            .copied()
            .filter(|&seq| run.first_seq <= seq && seq <= last && !run.is_hole(seq))
            .collect();
        // The purged part: the run up to `last`, less what was kept.
        let mut taken = run.clone();
        taken.last_seq = last;
        taken.holes = merged_holes(&run.holes, kept.iter().map(|&s| (s, s + 1)), last + 1);
        taken.count = live_count(taken.first_seq, taken.last_seq, &taken.holes);
        if taken.count == 0 {
            continue;
        }
        let share = u128::from(run.bytes) * u128::from(taken.count) / u128::from(run.count);
        taken.bytes = u64::try_from(share).unwrap_or(run.bytes).min(run.bytes);
        // What stays: the run less the purged part.
        let mut gaps = Vec::with_capacity(kept.len() + 1);
        let mut from = run.first_seq;
        for &seq in kept.iter().chain(std::iter::once(&(last + 1))) {
            if from < seq {
                gaps.push((from, seq));
            }
            from = seq + 1;
        }
        run.holes = merged_holes(&run.holes, gaps.into_iter(), u64::MAX);
        // Saturating: a damaged log may hold the same seq twice.
        run.count = run.count.saturating_sub(taken.count);
        run.bytes = run.bytes.saturating_sub(taken.bytes);
        purged.push(taken);
    }
    live.deliveries
        .retain(|seq, _| *seq >= upto || exempt.binary_search(seq).is_ok());
    purged
}

/// `holes` and `extra` (half-open ranges) merged, sorted and disjoint,
/// cut at `below`.
fn merged_holes(
    holes: &[(u64, u64)],
    extra: impl Iterator<Item = (u64, u64)>,
    below: u64,
) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = holes.iter().copied().chain(extra).collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (start, end) in all {
        let end = end.min(below);
        if start >= end {
            continue;
        }
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// Sequence numbers in `first..=last` outside `holes`.
fn live_count(first: u64, last: u64, holes: &[(u64, u64)]) -> u64 {
    let span = last - first + 1;
    let holed: u64 = holes
        .iter()
        .map(|&(start, end)| end.min(last + 1).saturating_sub(start.max(first)))
        .sum();
    span.saturating_sub(holed)
}

/// What one segment holds, read on a worker thread: its records, less
/// bodies, in file order.
struct FileScan {
    base: u64,
    path: PathBuf,
    walked: Walked,
    /// Damage and torn ends found (only those fields are used).
    findings: RecoveredQueue,
    events: Vec<Event>,
}

/// One record of a segment, as replay needs it.
enum Event {
    Message {
        seq: u64,
        at: u64,
        len: u64,
        body: u64,
        key: DedupKey,
    },
    Ack {
        seq: u64,
        at_ms: u64,
        key: Option<u128>,
    },
    Dedup(Vec<(u128, u64)>),
    Delivered {
        seq: u64,
        count: u32,
    },
    Purge {
        upto: u64,
        kept: Vec<u64>,
    },
}

/// Walks (and repairs) one segment, keeping its records as events.
fn scan_segment(
    base: u64,
    path: &Path,
    hasher: &DedupHasher,
    buf: &mut Vec<u8>,
) -> io::Result<FileScan> {
    let mut findings = RecoveredQueue::default();
    let mut events = Vec::new();
    let walked = walk_file(path, &mut findings, buf, |record, at, len| match record {
        Record::Message {
            seq,
            sender,
            message_id,
            body,
            ..
        } => {
            events.push(Event::Message {
                seq,
                at,
                len: len as u64,
                body: body.len() as u64,
                key: hasher.key(sender, message_id),
            });
        }
        Record::Ack {
            seq,
            acked_at_ms,
            key,
        } => events.push(Event::Ack {
            seq,
            at_ms: acked_at_ms,
            key,
        }),
        Record::Dedup(entries) => events.push(Event::Dedup(entries.iter().collect())),
        Record::Delivered { seq, count, .. } => events.push(Event::Delivered { seq, count }),
        Record::Purge { upto, kept } => events.push(Event::Purge {
            upto,
            kept: kept.iter().collect(),
        }),
        Record::Padding => {}
    })?;
    Ok(FileScan {
        base,
        path: path.to_owned(),
        walked,
        findings,
        events,
    })
}

/// Applies one segment's events, in order, to what recovery found so far.
fn replay(scan: FileScan, window: &Window, live: &mut LiveRuns, out: &mut RecoveredQueue) {
    let FileScan {
        base,
        path,
        walked,
        mut findings,
        events,
    } = scan;
    out.damage.append(&mut findings.damage);
    out.torn.append(&mut findings.torn);
    let mut next_seq = out.next_seq;
    let first_run = live.runs.len();
    for event in events {
        match event {
            Event::Message {
                seq,
                at,
                len,
                body,
                key,
            } => {
                out.dedup.store(key);
                live.push(seq, base, at, len, body);
                // Saturating: a record may claim seq u64::MAX (found by fuzzing).
                next_seq = next_seq.max(seq.saturating_add(1));
            }
            Event::Ack { seq, at_ms, key } => {
                if live.ack(seq) {
                    match key {
                        Some(key) => window.acked(DedupKey(key), at_ms, seq, out),
                        None => live.keyless_acks.push((seq, at_ms)),
                    }
                }
            }
            Event::Dedup(entries) => {
                for (key, at) in entries {
                    if let Some(until) = window.until(at) {
                        out.dedup.ack_unless_stored(DedupKey(key), until);
                        out.acked.push((DedupKey(key), at, base));
                    }
                }
            }
            Event::Delivered { seq, count } => {
                if live.holds(seq) {
                    let n = live.deliveries.entry(seq).or_insert(0);
                    *n = (*n).max(count);
                }
            }
            Event::Purge { upto, mut kept } => {
                kept.sort_unstable();
                live.purges.push((upto, kept));
            }
        }
    }
    let framing = if walked.appendable {
        Framing::V2
    } else {
        Framing::V1
    };
    for run in &mut live.runs[first_run..] {
        run.framing = framing;
    }
    out.next_seq = next_seq.max(base);
    out.segments.push(RecoveredSegment {
        base,
        path,
        len: walked.len,
        live: 0,
        appendable: walked.appendable,
    });
}

/// The dedup window as recovery applies it: when an ack made at a given
/// Unix ms stops counting.
struct Window {
    window_ms: u64,
    now: Instant,
    now_ms: u64,
}

impl Window {
    fn new(window_ms: u64) -> Window {
        Window {
            window_ms,
            now: Instant::now(),
            now_ms: crate::log::unix_ms(),
        }
    }

    /// When an ack at `at_ms` leaves the window; `None` if it has.
    fn until(&self, at_ms: u64) -> Option<Tick> {
        (at_ms.saturating_add(self.window_ms) > self.now_ms)
            .then(|| Tick::after_unix_ms(at_ms, self.window_ms, self.now, self.now_ms))
    }

    /// The message `seq` holding `key` was acked at `at_ms`.
    fn acked(&self, key: DedupKey, at_ms: u64, seq: u64, out: &mut RecoveredQueue) {
        match self.until(at_ms) {
            Some(until) => {
                out.dedup.ack(key, until);
                out.acked.push((key, at_ms, seq));
            }
            None => {
                out.dedup.remove(key);
            }
        }
    }
}

/// Finds the keys of messages acked by an earlier version's ack records
/// (which carry none) by reading those messages' segments again; only logs
/// written before acks carried keys pay for it.
fn resolve_keyless_acks(
    mut acks: Vec<(u64, u64)>,
    hasher: &DedupHasher,
    window: &Window,
    out: &mut RecoveredQueue,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    if acks.is_empty() {
        return Ok(());
    }
    acks.sort_unstable();
    let mut found = Vec::new();
    let mut scratch = RecoveredQueue::default();
    for (i, segment) in out.segments.iter().enumerate() {
        let end = out.segments.get(i + 1).map_or(u64::MAX, |s| s.base);
        let from = acks.partition_point(|(seq, _)| *seq < segment.base);
        let to = acks.partition_point(|(seq, _)| *seq < end);
        let mine = &acks[from..to];
        if mine.is_empty() {
            continue;
        }
        walk_file(&segment.path, &mut scratch, buf, |record, _, _| {
            if let Record::Message {
                seq,
                sender,
                message_id,
                ..
            } = record
            {
                if let Ok(j) = mine.binary_search_by_key(&seq, |(s, _)| *s) {
                    found.push((hasher.key(sender, message_id), mine[j].1, seq));
                }
            }
        })?;
    }
    for (key, at_ms, seq) in found {
        window.acked(key, at_ms, seq, out);
    }
    Ok(())
}

fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let file = segment::open_options().write(true).open(path)?;
    file.set_len(len)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::IdState;
    use crate::log::crc;
    use crate::log::record::{encode, DedupEntries, PackedSeqs};
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

    /// Writes a v2 file of `records`; returns its bytes and where each
    /// record starts.
    fn write(path: &Path, records: &[Record<'_>]) -> (Vec<u8>, Vec<usize>) {
        let mut buf = FILE_HEADER.to_vec();
        let mut starts = Vec::new();
        for r in records {
            starts.push(buf.len());
            encode(r, &mut buf);
        }
        fs::write(path, &buf).unwrap();
        (buf, starts)
    }

    /// Far longer than the tests' message times: every id is remembered.
    const WINDOW: u64 = u64::MAX / 4;

    fn ids(q: &RecoveredQueue) -> Vec<String> {
        q.read_back()
            .unwrap()
            .iter()
            .map(|m| m.msg.message_id().to_owned())
            .collect()
    }

    /// The unacked messages read back: (seq, id, deliveries).
    fn restored(q: &RecoveredQueue) -> Vec<(u64, String, u32)> {
        q.read_back()
            .unwrap()
            .iter()
            .map(|m| (m.seq, m.msg.message_id().to_owned(), m.deliveries))
            .collect()
    }

    /// Sequence numbers of `runs`' messages.
    fn seqs_of(runs: &[Run]) -> Vec<u64> {
        runs.iter()
            .flat_map(|r| (r.first_seq..=r.last_seq).filter(|s| !r.is_hole(*s)))
            .collect()
    }

    fn delivered(seq: u64) -> Record<'static> {
        Record::Delivered {
            seq,
            count: 1,
            delivered_at_ms: 2,
        }
    }

    fn acked(seq: u64, hasher: &DedupHasher, id: &str) -> Record<'static> {
        Record::Ack {
            seq,
            acked_at_ms: 5,
            key: Some(hasher.key("s1", id).0),
        }
    }

    /// A purge's record takes what it purged out of the backlog after a
    /// restart, though their acks (the read-through's) never came: what the
    /// purge kept (deliveries owed then) stays, unless a later purge took
    /// it, and what came after it stays.
    #[test]
    fn a_purge_record_keeps_purged_messages_out_of_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let hasher = DedupHasher::random();
        let packed = |seqs: &[u64]| {
            let mut b = Vec::new();
            PackedSeqs::pack(seqs, &mut b);
            b
        };
        let (first_kept, second_kept) = (packed(&[2, 3]), packed(&[2, 7]));
        let ids = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        let mut first: Vec<Record<'_>> = (0..6).map(|s| msg(s, ids[s as usize])).collect();
        first.extend([
            delivered(2),
            delivered(3),
            acked(0, &hasher, "a"),
            Record::Purge {
                upto: 6,
                kept: PackedSeqs::new(&first_kept).unwrap(),
            },
            // The read-through settled 1 before the crash.
            acked(1, &hasher, "b"),
        ]);
        write(&segment_path(dir.path(), 0), &first);
        write(
            &segment_path(dir.path(), 6),
            &[
                msg(6, "g"),
                msg(7, "h"),
                delivered(7),
                // 3 was given back (nacked) by now, 2 is still owed.
                Record::Purge {
                    upto: 8,
                    kept: PackedSeqs::new(&second_kept).unwrap(),
                },
                msg(8, "i"),
            ],
        );
        let q = recover_queue(dir.path(), &hasher, WINDOW).unwrap();
        let got = restored(&q);
        assert_eq!(
            got,
            [(2, "c".into(), 1), (7, "h".into(), 1), (8, "i".into(), 0)]
        );
        assert_eq!(seqs_of(&q.purged), [3, 4, 5, 6], "purged, not settled yet");
        assert_eq!(q.purged.iter().map(|r| r.count).sum::<u64>(), 4);
        let live: Vec<u64> = q.segments.iter().map(|s| s.live).collect();
        assert_eq!(
            live,
            [4, 3],
            "purged messages hold their segments until settled"
        );
        assert!(q.deliveries.iter().all(|(seq, _)| [2, 7].contains(seq)));
        assert_eq!(q.next_seq, 9);
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
                    key: None,
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
        let hasher = DedupHasher::random();
        let mut q = recover_queue(dir.path(), &hasher, WINDOW).unwrap();
        let got = restored(&q);
        assert_eq!(got, [(1, "b".into(), 2), (2, "c".into(), 1)]);
        assert_eq!(q.next_seq, 3);
        q.acked.sort_unstable_by_key(|(_, _, holder)| *holder);
        assert_eq!(q.acked.len(), 2);
        assert_eq!(
            q.acked[0],
            (hasher.key("s1", "a"), 5, 0),
            "acked message 0: an earlier version's ack, with no key, found by its seq"
        );
        assert_eq!(
            q.acked[1],
            (DedupKey(99), 4, 2),
            "carried, held by segment 2"
        );
        let now = Instant::now();
        let state = |id: &str| q.dedup.state(hasher.key("s1", id), now);
        assert_eq!(state("a"), Some(IdState::Acked));
        assert_eq!(state("b"), Some(IdState::Stored));
        assert_eq!(state("c"), Some(IdState::Stored));
        assert_eq!(q.dedup.state(DedupKey(99), now), Some(IdState::Acked));
        assert_eq!(
            q.segments.iter().map(|s| s.live).collect::<Vec<_>>(),
            [1, 1]
        );
        assert!(q.damage.is_empty() && q.torn.is_empty());
    }

    #[test]
    fn the_backlog_is_read_back_in_bounded_batches_in_order_with_counts() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        let mut first: Vec<Record<'_>> = (0..6).map(|i| msg(i, &names[i as usize])).collect();
        first.push(Record::Delivered {
            seq: 4,
            count: 3,
            delivered_at_ms: 0,
        });
        write(&segment_path(dir.path(), 0), &first);
        let second: Vec<Record<'_>> = (6..10).map(|i| msg(i, &names[i as usize])).collect();
        write(&segment_path(dir.path(), 6), &second);
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        let batches = |max: usize, max_bytes: usize| {
            let mut reader = q.reader();
            let mut out = Vec::new();
            loop {
                let batch = reader.next_batch(max, max_bytes).unwrap();
                if batch.is_empty() {
                    return out;
                }
                out.push(
                    batch
                        .iter()
                        .map(|m| (m.msg.message_id().to_owned(), m.deliveries))
                        .collect::<Vec<_>>(),
                );
            }
        };
        let by_count = batches(4, usize::MAX);
        assert_eq!(
            by_count.iter().map(Vec::len).collect::<Vec<_>>(),
            [4, 4, 2],
            "at most 4 a batch, across segments"
        );
        let all: Vec<_> = by_count.into_iter().flatten().collect();
        let expected: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), if i == 4 { 3 } else { 0 }))
            .collect();
        assert_eq!(all, expected, "in order, each with its deliveries");
        // Bodies are 2 bytes: 3 bytes a batch holds one message, and a
        // batch smaller than its first message still holds that one.
        for max_bytes in [3, 1] {
            let by_bytes = batches(usize::MAX, max_bytes);
            assert_eq!(by_bytes.len(), 10);
            assert_eq!(by_bytes.into_iter().flatten().collect::<Vec<_>>(), expected);
        }
    }

    #[test]
    fn a_segment_that_is_not_a_regular_file_stops_recovery_unread() {
        let dir = tempfile::tempdir().unwrap();
        write(&segment_path(dir.path(), 0), &[msg(0, "a")]);
        // Reading this one whole would never end; writing to it would lose data.
        let odd = segment_path(dir.path(), 1);
        std::os::unix::fs::symlink("/dev/zero", &odd).unwrap();
        let err = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap_err();
        let text = err.to_string();
        // A link, whatever it points to, is refused as one.
        assert!(text.contains("a symbolic link (to /dev/zero)"), "{text}");
        assert!(text.contains(&odd.display().to_string()), "{text}");
        // Anything else that is not a regular file.
        fs::remove_file(&odd).unwrap();
        fs::create_dir(&odd).unwrap();
        let err = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("not a regular file"), "{text}");
        assert!(text.contains(&odd.display().to_string()), "{text}");
    }

    #[test]
    fn a_log_file_name_linked_elsewhere_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let queue = dir.path().join("q");
        fs::create_dir(&queue).unwrap();
        write(&segment_path(&queue, 0), &[msg(0, "a")]);
        // Bytes a recovery that followed the link would cut as a torn tail.
        let target = outside.path().join("notes");
        let notes = vec![0u8; 100];
        fs::write(&target, &notes).unwrap();
        for name in [
            "segment-00000000000000000001.log",
            "dedup-00000000000000000001.log",
        ] {
            let link = queue.join(name);
            std::os::unix::fs::symlink(&target, &link).unwrap();
            let err = recover_queue(&queue, &DedupHasher::random(), WINDOW).unwrap_err();
            assert!(err.to_string().contains("a symbolic link"), "{err}");
            assert_eq!(fs::read(&target).unwrap(), notes, "{name}");
            fs::remove_file(&link).unwrap();
        }
        // The queue's directory itself as a link.
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&queue, &linked).unwrap();
        let err = recover_queue(&linked, &DedupHasher::random(), WINDOW).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
        // And the opens themselves never follow one.
        let link = queue.join("segment-00000000000000000002.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = segment::open_options().write(true).open(&link).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        assert_eq!(fs::read(&target).unwrap(), notes);
    }

    #[test]
    fn quarantine_files_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let (mut buf, starts) = write(&path, &[msg(0, "a"), msg(1, "b")]);
        buf[starts[0] + 5] ^= 0x20;
        fs::write(&path, &buf).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        let kept = q.damage[0].quarantine.clone().unwrap();
        let mode = fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }

    #[test]
    fn a_file_whose_deletion_was_under_way_is_deleted_unread() {
        let dir = tempfile::tempdir().unwrap();
        // Segment 0 was fully acked and half given back when the broker
        // died: its message's ack was in the half that is gone.
        let freed = segment::freeing_path(&segment_path(dir.path(), 0));
        let (buf, starts) = write(
            &freed,
            &[
                msg(0, "a"),
                Record::Ack {
                    seq: 0,
                    acked_at_ms: 5,
                    key: None,
                },
            ],
        );
        fs::write(&freed, &buf[..starts[1]]).unwrap();
        write(&segment_path(dir.path(), 1), &[msg(1, "b")]);
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        assert_eq!(ids(&q), ["b"], "the acked message does not come back");
        assert!(!freed.exists());
        assert!(q.damage.is_empty() && q.torn.is_empty());
    }

    #[test]
    fn truncates_a_torn_tail_and_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let (buf, starts) = write(&path, &[msg(0, "a"), msg(1, "b")]);
        fs::write(&path, &buf[..buf.len() - 3]).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        assert_eq!(ids(&q), ["a"]);
        assert!(q.damage.is_empty(), "a torn tail is no damage");
        assert_eq!(
            q.torn,
            [(
                path.clone(),
                starts[1] as u64,
                (buf.len() - 3 - starts[1]) as u64
            )]
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), starts[1] as u64);
        assert_eq!(q.segments[0].len, starts[1] as u64);
    }

    #[test]
    fn records_and_damage_across_read_windows_are_found_as_in_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let body = format!("\"{}\"", "x".repeat(3000));
        let names: Vec<String> = (0..4000).map(|i| format!("m{i}")).collect();
        let records: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, id)| Record::Message {
                seq: i as u64,
                sender: "s1",
                message_id: id,
                exchange: "e",
                routing_key: "k",
                sent_at_ms: 1,
                body: &body,
            })
            .collect();
        let (mut buf, starts) = write(&path, &records);
        assert!(buf.len() > 2 * WALK_WINDOW + WALK_WINDOW / 2);
        // Damage in the records that straddle the first two window ends
        // (a length byte, so the walk must look past the window to resync),
        // and a torn tail.
        let straddling = |edge: usize| starts.iter().rposition(|s| *s < edge).unwrap();
        let hit = [straddling(WALK_WINDOW), straddling(2 * WALK_WINDOW)];
        for i in hit {
            buf[starts[i] + 5] ^= 0x40;
        }
        buf.truncate(buf.len() - 100);
        fs::write(&path, &buf).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        let want: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| !hit.contains(i) && *i != names.len() - 1)
            .map(|(_, id)| id.clone())
            .collect();
        assert_eq!(ids(&q), want);
        let damaged: Vec<_> = q.damage.iter().map(|d| (d.offset, d.bytes)).collect();
        let expect: Vec<_> = hit
            .iter()
            .map(|&i| (starts[i] as u64, (starts[i + 1] - starts[i]) as u64))
            .collect();
        assert_eq!(damaged, expect);
        assert_eq!(q.torn.len(), 1, "the cut last record");
        assert_eq!(q.torn[0].1, starts[names.len() - 1] as u64);
        assert_eq!(q.next_seq, names.len() as u64 - 1);
    }

    #[test]
    fn a_damaged_length_costs_one_record_whose_bytes_are_quarantined() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        let records: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, id)| msg(i as u64, id))
            .collect();
        let (mut buf, starts) = write(&path, &records);
        // One byte of the 4th record's length field.
        buf[starts[3] + 5] ^= 0x40;
        fs::write(&path, &buf).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        assert_eq!(
            ids(&q),
            ["m0", "m1", "m2", "m4", "m5", "m6", "m7", "m8", "m9"]
        );
        assert_eq!(q.damage.len(), 1);
        let d = &q.damage[0];
        assert_eq!(
            (d.offset, d.bytes, d.records),
            (starts[3] as u64, (starts[4] - starts[3]) as u64, 1)
        );
        let saved = d.quarantine.clone().unwrap();
        assert_eq!(fs::read(&saved).unwrap(), &buf[starts[3]..starts[4]]);
        assert!(d.to_string().contains(&path.display().to_string()));
        // Moved out: the next start reads the file clean, nothing lost more.
        let again = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        assert!(again.damage.is_empty(), "{:?}", again.damage);
        assert_eq!(ids(&again), ids(&q));
        assert_eq!(fs::metadata(&path).unwrap().len(), buf.len() as u64);
    }

    #[test]
    fn damage_at_the_end_is_quarantined_not_taken_for_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        let (mut buf, starts) = write(&path, &[msg(0, "a"), msg(1, "b")]);
        let last = buf.len() - 2;
        buf[last] ^= 0x01;
        fs::write(&path, &buf).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        assert_eq!(ids(&q), ["a"]);
        assert_eq!(q.damage.len(), 1);
        assert!(q.torn.is_empty());
        assert_eq!(q.damage[0].offset, starts[1] as u64);
        assert_eq!(fs::metadata(&path).unwrap().len(), starts[1] as u64);
    }

    #[test]
    fn damage_in_a_dedup_file_costs_only_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = crate::dedup::file::dedup_path(dir.path(), 0);
        let mut one = Vec::new();
        DedupEntries::pack(&[(1, 10)], &mut one);
        let mut two = Vec::new();
        DedupEntries::pack(&[(2, 20)], &mut two);
        let (mut buf, starts) = write(
            &path,
            &[
                Record::Dedup(DedupEntries::new(&one).unwrap()),
                Record::Dedup(DedupEntries::new(&two).unwrap()),
            ],
        );
        buf[starts[0] + 14] ^= 0x01;
        fs::write(&path, &buf).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        let now = Instant::now();
        assert_eq!(q.dedup.state(DedupKey(2), now), Some(IdState::Acked));
        assert_eq!(
            q.dedup.state(DedupKey(1), now),
            None,
            "its record was damaged"
        );
        assert!(q.acked.is_empty(), "a dedup file's ids need no carrying");
        assert_eq!(q.damage.len(), 1);
    }

    #[test]
    fn a_newest_segment_of_an_earlier_version_is_never_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        // A v1 segment with an ack only, named for the next message.
        let path = segment_path(dir.path(), 5);
        let mut v2 = Vec::new();
        encode(
            &Record::Ack {
                seq: 1,
                acked_at_ms: 2,
                key: None,
            },
            &mut v2,
        );
        let body = &v2[12..];
        let mut v1 = (body.len() as u32).to_le_bytes().to_vec();
        v1.extend_from_slice(&crc::crc32c(body).to_le_bytes());
        v1.extend_from_slice(body);
        fs::write(&path, &v1).unwrap();
        let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
        assert!(!q.segments[0].appendable);
        assert_eq!(q.next_seq, 6, "the next segment needs a name of its own");
        assert!(q.damage.is_empty());
    }
}
