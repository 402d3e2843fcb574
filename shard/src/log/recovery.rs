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
use crate::clock::Clock;
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
    recover_queue_at(dir, hasher, window_ms, &Clock::System)
}

/// [`recover_queue`] with the dedup window judged at `clock`'s present
/// (a simulation's).
pub fn recover_queue_at(
    dir: &Path,
    hasher: &DedupHasher,
    window_ms: u64,
    clock: &Clock,
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
    let window = Window::new(window_ms, clock);
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
                // Every seq a record names was handed out, its message's
                // record on disk or not (a failed commit cuts that record,
                // not a later ack of its delivery): never handed out again.
                next_seq = next_seq.max(seq.saturating_add(1));
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
                next_seq = next_seq.max(seq.saturating_add(1));
                if live.holds(seq) {
                    let n = live.deliveries.entry(seq).or_insert(0);
                    *n = (*n).max(count);
                }
            }
            Event::Purge { upto, mut kept } => {
                // A purge takes every seq below `upto` not kept: one handed
                // out again would be taken by it at the next restart.
                next_seq = next_seq.max(upto);
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
    fn new(window_ms: u64, clock: &Clock) -> Window {
        Window {
            window_ms,
            now: clock.now(),
            now_ms: clock.unix_ms(),
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
mod tests;
