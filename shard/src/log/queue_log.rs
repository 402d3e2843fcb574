//! The write side of one queue's log, without I/O.
//!
//! Appends are encoded into a pending buffer. The shard's committer takes one
//! [`CommitJob`] per dirty log per round (the appends of a reactor turn), writes
//! it at its offset, `fdatasync`s, and only then completes the job's waiters:
//! that is group commit. A log has at most one job being written, so its file
//! never has holes and recovery reads it front to back; the next job may be
//! written while the previous one is still being synced (the committer
//! pipelines rounds), and jobs finish in the order they were taken.
//!
//! A failed job leaves its file's end unknown. Every job taken after it
//! and not finished yet lies past that unknown end, so it fails too,
//! whatever its own I/O said; the jobs taken before it do not: their bytes
//! lie before it, and their own I/O decides. The next job cuts the files
//! back to where the failed job began and writes from there: no
//! acknowledged record ever lies after a hole, no message that was
//! answered `NACK` comes back after a restart, and no new file is made per
//! failure. What a failed job
//! carried that is not a message (acks, carried dedup entries) is queued
//! again; fully acked segments it was to delete are deleted all the same.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::dedup::file::{DedupFiles, DedupWrite, RecoveredDedupFile};
use crate::log::log_buf::LogBuf;
use crate::log::mirror::mirrored;
use crate::log::record::{encode, PackedSeqs, Record};
use crate::log::recovery::RecoveredSegment;
use crate::log::segment::{segment_path, FILE_HEADER_BYTES};
use crate::message::Message;

/// Upper bound of a pending buffer's initial size (one burst must not make
/// every later round allocate as much).
const MAX_PENDING_HINT: usize = 8 << 20;

/// One segment file.
#[derive(Debug)]
struct Segment {
    base: u64,
    path: PathBuf,
    /// Message records in it not yet acked.
    live: u64,
    /// The file exists on disk (created and its directory synced).
    created: bool,
}

/// How a commit job's I/O went, as far as the log must tell failures apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobIo {
    /// Every write and sync succeeded.
    Done,
    /// A write or sync failed for lack of space (`ENOSPC`, `EDQUOT`):
    /// deleting fully acked segments is what frees it, so they go even if
    /// the carry of their ids did not make it.
    OutOfSpace,
    /// Any other failure: segments waiting for the job's carry are kept.
    Failed,
}

impl JobIo {
    /// The I/O succeeded.
    pub fn is_done(self) -> bool {
        self == JobIo::Done
    }
}

/// Writes to make durable, then waiters to release.
#[derive(Debug)]
pub struct CommitJob {
    /// The queue.
    pub queue: Arc<str>,
    /// The queue's directory; `create_dir` asks to create and sync it first.
    pub dir: PathBuf,
    /// The directory does not exist yet.
    pub create_dir: bool,
    /// The log lives on shared storage: after the `fdatasync`, nothing of
    /// the job is acknowledged unless this still holds, and only the
    /// queue's own directory is ever made (see [`crate::log::placement`]).
    pub fence: Option<Arc<dyn crate::log::LogFence>>,
    /// The segment file to write.
    pub path: PathBuf,
    /// Its base sequence number.
    pub segment: u64,
    /// The file is new: create it (never over an existing file), write the
    /// file header, and sync the directory after the data.
    pub create: bool,
    /// Sync the directory after the data, so the file's name is durable
    /// before anything in it is acknowledged: a new file's (`create`), or
    /// the first job into a file recovery found and appends to. That name
    /// may never have been synced: a job that created the file can fail
    /// before its directory sync, and the cut that would then have synced
    /// it is lost when the queue moves away or the broker restarts first.
    pub sync_dir: bool,
    /// Files to cut back to a length before writing (after a failed job:
    /// their ends are unknown past it). The file at `path` may be among
    /// them, and may not exist yet if its creation failed.
    pub cuts: Vec<(PathBuf, u64)>,
    /// Where the bytes go.
    pub offset: u64,
    /// The encoded records (possibly empty when only waiters or deletions wait).
    pub bytes: LogBuf,
    /// Tickets to complete once the bytes are durable.
    pub waiters: Vec<u64>,
    /// Sequence numbers of messages whose records are in `bytes`: if the write
    /// fails they must not stay in the queue as if stored.
    pub message_seqs: Vec<u64>,
    /// Where each of those records starts in `bytes`: once durable, at
    /// `offset` plus this in the file.
    pub message_offsets: Vec<u32>,
    /// Acks in `bytes` (seq, Unix ms, dedup key): appended again if the
    /// job fails.
    pub acks: Vec<(u64, u64, Option<u128>)>,
    /// Purge records in `bytes` (upto, kept): appended again if the job
    /// fails.
    pub purges: Vec<(u64, Vec<u64>)>,
    /// Fully acked segments to delete after the write: (base, file).
    pub delete: Vec<(u64, PathBuf)>,
    /// `delete` waits for this job's carry of their acked ids: if the job
    /// fails, the segments are kept and the log deletes them with a later
    /// job, after the carry is written again, however many jobs fail first.
    /// They go whatever the write did only when space is short (the job
    /// failed for lack of space, or disk space is low, when no job waits):
    /// deleting acked segments is what frees it. See
    /// [`CommitJob::deletes_segments`].
    pub delete_after_carry: bool,
    /// Dedup entries carried out of `delete`: written and synced first.
    pub dedup_write: Option<DedupWrite>,
    /// Dedup files entirely past the window, to delete.
    pub dedup_delete: Vec<PathBuf>,
}

impl CommitJob {
    /// Whether the committer deletes `delete` once the job is finished:
    /// `durable` is what [`QueueLog::job_done`] answered. The one rule both
    /// the committer and the log follow, so a segment is never both kept for
    /// a later job and deleted.
    pub fn deletes_segments(&self, durable: bool, io: JobIo) -> bool {
        durable || !self.delete_after_carry || io == JobIo::OutOfSpace
    }
}

/// One queue's log.
#[derive(Debug)]
pub struct QueueLog {
    dir: PathBuf,
    dir_exists: bool,
    /// The active segment is a file recovery found: the next job syncs its
    /// directory (see [`CommitJob::sync_dir`]).
    name_unsure: bool,
    /// See [`CommitJob::fence`].
    fence: Option<Arc<dyn crate::log::LogFence>>,
    segment_bytes: u64,
    /// Oldest first; the last one is the active segment.
    segments: VecDeque<Segment>,
    /// Bytes of the active segment already handed to jobs.
    written: u64,
    /// Records appended since the last job, laid out for where they will
    /// be written (`written`).
    pending: LogBuf,
    /// Bytes of the largest recent job, to size the next pending buffer up
    /// front.
    pending_hint: usize,
    waiters: Vec<u64>,
    message_seqs: Vec<u64>,
    message_offsets: Vec<u32>,
    acks: Vec<(u64, u64, Option<u128>)>,
    purges: Vec<(u64, Vec<u64>)>,
    /// Files the next job cuts back before writing (see [`CommitJob::cuts`]).
    cuts: Vec<(PathBuf, u64)>,
    /// Per job taken and not finished, oldest first (jobs finish in the
    /// order taken): whether a failure already cut its bytes away, its own
    /// or an older job's (see the module doc). The newest is still being
    /// written while `writing`; the rest are being synced.
    doomed: VecDeque<bool>,
    /// A job is taken and its bytes are not yet written.
    writing: bool,
    /// With the metadata mirror: the segment it is reading. Older ones only
    /// may be deleted.
    mirror: Option<Arc<AtomicU64>>,
    /// With the metadata mirror: one past the last durable message.
    stored: Option<Arc<AtomicU64>>,
    /// Ids acked within the dedup window, carried out of deleted segments.
    dedup: DedupFiles,
    /// The clock and window of the current round, for the dedup files.
    now_ms: u64,
    window_ms: u64,
}

impl QueueLog {
    /// A log for a new queue; nothing is on disk until the first commit.
    pub fn new(dir: PathBuf, segment_bytes: u64, next_seq: u64) -> QueueLog {
        let mut log = QueueLog {
            dedup: DedupFiles::new(dir.clone(), segment_bytes),
            now_ms: 0,
            window_ms: u64::MAX,
            dir,
            dir_exists: false,
            name_unsure: false,
            fence: None,
            segment_bytes,
            segments: VecDeque::new(),
            written: FILE_HEADER_BYTES,
            pending: LogBuf::default(),
            pending_hint: 0,
            waiters: Vec::new(),
            message_seqs: Vec::new(),
            message_offsets: Vec::new(),
            acks: Vec::new(),
            purges: Vec::new(),
            cuts: Vec::new(),
            doomed: VecDeque::new(),
            writing: false,
            mirror: None,
            stored: None,
        };
        log.open_segment(next_seq);
        log
    }

    /// A log continuing what recovery found; new appends go to a new segment
    /// unless the newest one holds no message yet and is of this version.
    /// Its directory must exist: no job of it makes the directory, so a
    /// queue recovered from a missing one could never write. A queue that
    /// never stored anything has no directory and is not restored (a
    /// restart does not find it, an adoption skips it): it gets a new log
    /// when first used.
    pub fn recovered(
        dir: PathBuf,
        segment_bytes: u64,
        next_seq: u64,
        found: &[RecoveredSegment],
        dedup_files: &[RecoveredDedupFile],
    ) -> QueueLog {
        debug_assert!(dir.is_dir(), "a log recovered from a missing directory");
        let mut log = QueueLog::new(dir, segment_bytes, next_seq);
        log.dedup.adopt(dedup_files);
        log.dir_exists = true;
        log.segments.clear();
        for s in found {
            log.segments.push_back(Segment {
                base: s.base,
                path: s.path.clone(),
                live: s.live,
                created: true,
            });
        }
        match found.last() {
            Some(last) if last.base == next_seq && last.appendable => {
                log.written = last.len;
                log.name_unsure = true;
            }
            _ => log.open_segment(next_seq),
        }
        log
    }

    /// Keeps the log on shared storage, guarded by `fence` (see
    /// [`CommitJob::fence`]).
    pub fn set_fence(&mut self, fence: Arc<dyn crate::log::LogFence>) {
        self.fence = Some(fence);
    }

    /// Its directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Holds fully acked segments until the metadata mirror has read them.
    pub fn set_mirror(&mut self, cell: Arc<AtomicU64>) {
        self.mirror = Some(cell);
    }

    /// Tells the metadata mirror how far the log's messages are durable,
    /// starting from what is already there.
    pub fn track_stored(&mut self, cell: Arc<AtomicU64>, next_seq: u64) {
        cell.fetch_max(next_seq, Ordering::Release);
        self.stored = Some(cell);
    }

    fn open_segment(&mut self, base: u64) {
        let path = segment_path(&self.dir, base);
        self.segments.push_back(Segment {
            base,
            path,
            live: 0,
            created: false,
        });
        self.written = FILE_HEADER_BYTES;
    }

    /// The pending buffer, sized on its first append for the largest of the
    /// recent rounds and half as much again. Grown by doubling instead, it
    /// copied each round's bytes once more and mapped fresh pages for it;
    /// sized for exactly the last round, it still did so for most rounds,
    /// because round sizes follow the `fdatasync` times before them, which
    /// vary widely. Its first append lays it out for the file offset it
    /// will be written at, so the committer need not copy it for a direct
    /// write (`log_buf`).
    fn pending(&mut self) -> &mut Vec<u8> {
        if self.pending.capacity() == 0 {
            let room = self.pending_room();
            self.pending.reserve(room);
        }
        if self.pending.is_empty() {
            self.pending.lay_out_for(self.written);
        }
        self.pending.appender()
    }

    /// What the next pending buffer is sized for.
    fn pending_room(&self) -> usize {
        (self.pending_hint + self.pending_hint / 2).min(MAX_PENDING_HINT)
    }

    /// The room a pending buffer should have, when this log has none yet:
    /// its shard may hand it a written one (`BufferPool`) before it appends.
    pub fn buffer_wanted(&self) -> Option<usize> {
        (self.pending.capacity() == 0).then(|| self.pending_room())
    }

    /// Takes `buf` (empty) as the pending buffer, when it has none.
    pub fn use_buffer(&mut self, buf: Vec<u8>) {
        debug_assert!(buf.is_empty());
        if self.pending.capacity() == 0 {
            self.pending = LogBuf::from_vec(buf);
        }
    }

    /// Appends a stored message.
    pub fn append_message(&mut self, seq: u64, msg: &Message) {
        // A log made just after its first message took its number starts one
        // too high: a segment's base must not exceed the messages it holds,
        // or acks would not find it and it would never be deleted.
        if let Some(active) = self.segments.back_mut() {
            if seq < active.base
                && !active.created
                && self.written == FILE_HEADER_BYTES
                && self.pending.is_empty()
            {
                active.base = seq;
                active.path = segment_path(&self.dir, seq);
            }
        }
        debug_assert!(
            self.segments.back().is_none_or(|s| s.base <= seq),
            "a message below its segment's base"
        );
        debug_assert!(
            self.message_seqs.last().is_none_or(|&last| last < seq),
            "messages appended out of sequence order"
        );
        let route = msg.route();
        let at = self.pending.len();
        encode(
            &Record::Message {
                seq,
                sender: msg.sender(),
                message_id: msg.message_id(),
                exchange: route.exchange,
                routing_key: route.routing_key,
                sent_at_ms: route.sent_at_ms,
                body: msg.body(),
            },
            self.pending(),
        );
        if let Some(active) = self.segments.back_mut() {
            active.live += 1;
        }
        self.message_seqs.push(seq);
        self.message_offsets
            .push(u32::try_from(at).unwrap_or(crate::queue::UNPLACED));
    }

    /// The segment holding `seq`: the last one whose base is <= seq.
    fn segment_of(&mut self, seq: u64) -> Option<&mut Segment> {
        self.segments.iter_mut().rev().find(|s| s.base <= seq)
    }

    /// Appends an ack (or a dead-lettering) of `seq`, with the acked id's
    /// dedup key when known.
    pub fn append_ack(&mut self, seq: u64, acked_at_ms: u64, key: Option<crate::DedupKey>) {
        let key = key.map(|k| k.0);
        encode(
            &Record::Ack {
                seq,
                acked_at_ms,
                key,
            },
            self.pending(),
        );
        self.acks.push((seq, acked_at_ms, key));
        if let Some(segment) = self.segment_of(seq) {
            debug_assert!(segment.live > 0, "an ack in a segment with no live message");
            segment.live = segment.live.saturating_sub(1);
        }
    }

    /// Appends a purge of every message below `upto` not acked and not in
    /// `kept` (ascending: the deliveries still owed), so a restart does not
    /// bring back what the purge's read-through has not settled yet.
    pub fn append_purge(&mut self, upto: u64, kept: Vec<u64>) {
        encode_purge(upto, &kept, self.pending());
        self.purges.push((upto, kept));
    }

    /// `seq`'s message left the queue without an ack: its record was in a
    /// failed job and is cut from the file, so its segment stops holding it.
    pub fn forget_message(&mut self, seq: u64) {
        if let Some(segment) = self.segment_of(seq) {
            debug_assert!(segment.live > 0, "a message forgotten in an empty segment");
            segment.live = segment.live.saturating_sub(1);
        }
    }

    /// Appends the delivery count of `seq` and when it was delivered, so a
    /// restart keeps counting and the metadata mirror learns the time.
    pub fn append_delivered(&mut self, seq: u64, count: u32, delivered_at_ms: u64) {
        encode(
            &Record::Delivered {
                seq,
                count,
                delivered_at_ms,
            },
            self.pending(),
        );
    }

    /// When the next job would delete segments: the first sequence number
    /// that survives them (the ids acked within the dedup window whose
    /// evidence lies below it must be carried first). `None` while a job is
    /// being written or nothing is deletable.
    pub fn deletion_bound(&self) -> Option<u64> {
        if self.writing {
            return None;
        }
        let n = self.deletable();
        (n > 0)
            .then(|| self.segments.get(n).map(|s| s.base))
            .flatten()
    }

    /// Makes room for `entries` dedup entries more, about to be carried over
    /// the next rounds ([`QueueLog::append_dedup`]).
    pub fn reserve_dedup(&mut self, entries: usize) {
        self.dedup.reserve(entries);
    }

    /// Queues dedup entries carried out of segments about to be deleted; the
    /// job that deletes them writes and syncs these first.
    pub fn append_dedup(&mut self, entries: &[(crate::DedupKey, u64)]) {
        self.dedup.append(entries);
    }

    /// Sets the clock for this round's dedup-file upkeep; true when a dedup
    /// file is past the window and a round should delete it.
    pub fn note_time(&mut self, now_ms: u64, window_ms: u64) -> bool {
        self.now_ms = now_ms;
        self.window_ms = window_ms;
        self.dedup.has_expired(now_ms, window_ms)
    }

    /// Completes `ticket` at the next commit (after everything appended so far).
    pub fn add_waiter(&mut self, ticket: u64) {
        self.waiters.push(ticket);
    }

    /// The tickets waiting for a job not taken yet, given up: the log is
    /// being removed with its queue, and no job of it will be taken again.
    pub fn take_waiters(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.waiters)
    }

    fn deletable(&self) -> usize {
        // Oldest first, never the active segment, never one the mirror has
        // not read yet.
        self.segments
            .iter()
            .take(self.segments.len().saturating_sub(1))
            .take_while(|s| s.live == 0 && self.mirror.as_ref().is_none_or(|m| mirrored(m, s.base)))
            .count()
    }

    /// How many of the first `deletable` segments lie wholly below
    /// `carried_below` (each one's end is the next one's base; the last
    /// segment is never deletable, so every deletable one has a next).
    fn deletable_below(&self, deletable: usize, carried_below: u64) -> usize {
        (0..deletable)
            .take_while(|&i| {
                self.segments
                    .get(i + 1)
                    .is_some_and(|next| next.base <= carried_below)
            })
            .count()
    }

    /// Bytes appended and not yet handed to a job.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Whether its files stand still: no job being written or written and
    /// not finished, nothing appended and waiting for one, nobody waiting
    /// for a commit. Spent segments not deleted yet do not count: a copy of
    /// the directory taken now holds everything acknowledged, and those
    /// segments are only read as already acked.
    ///
    /// A job written and not finished counts: until it is, nobody knows
    /// whether its write or sync failed, and a queue that left the shard
    /// meanwhile would have its publishes answered without its log to say
    /// (`Durability::job_done`). The simulation's owner moves found that
    /// (`sim/tests/moves.rs`).
    pub fn is_quiet(&self) -> bool {
        self.doomed.is_empty()
            && self.pending.is_empty()
            && self.waiters.is_empty()
            && !self.dedup.has_pending()
    }

    /// Whether there is something to commit, even if a job is being written.
    pub fn is_dirty_or_waiting(&self) -> bool {
        !self.pending.is_empty()
            || !self.waiters.is_empty()
            || self.deletable() > 0
            || self.dedup.has_pending()
            || self.dedup.has_expired(self.now_ms, self.window_ms)
    }

    /// Whether a commit round has anything to do here.
    pub fn is_dirty(&self) -> bool {
        !self.writing && self.is_dirty_or_waiting()
    }

    /// Whether the active segment holds records but no message waiting for
    /// an ack, so rolling past it lets it be deleted (done when disk space
    /// runs low: see [`QueueLog::take_job`]).
    pub fn is_spent(&self) -> bool {
        self.segments
            .back()
            .is_some_and(|s| s.created && s.live == 0 && self.written > FILE_HEADER_BYTES)
    }

    /// Takes the next job; `next_seq` is the queue's next sequence number, the
    /// base of a new segment if this one is full. `reclaim`: disk space is
    /// low, so a spent active segment is closed too, to be deleted.
    /// `carried_below`: every id acked within the dedup window below this
    /// sequence number is carried to the dedup file (see
    /// [`QueueLog::deletion_bound`]); only segments wholly below it are
    /// deleted, the rest in a later job, once their ids are carried too.
    pub fn take_job(
        &mut self,
        queue: &Arc<str>,
        next_seq: u64,
        reclaim: bool,
        carried_below: u64,
    ) -> Option<CommitJob> {
        if reclaim && self.is_spent() && self.pending.is_empty() {
            if let Some(base) = self.segments.back().map(|s| s.base) {
                if base < next_seq {
                    self.open_segment(next_seq);
                }
            }
        }
        if !self.is_dirty() {
            return None;
        }
        let deletable = self.deletable();
        let deleting = self.deletable_below(deletable, carried_below);
        // While a deletion waits for the rest of its ids, the ids carried so
        // far stay pending: they are written and synced once, by the job
        // that deletes the segments (before it does), not once per round
        // with a sync each.
        let held = deleting == 0 && deletable > 0;
        let popped: Vec<Segment> = (0..deleting)
            .filter_map(|_| self.segments.pop_front())
            .collect();
        let delete: Vec<(u64, PathBuf)> = popped
            .into_iter()
            .filter(|s| s.created)
            .map(|s| (s.base, s.path))
            .collect();
        let (dedup_write, dedup_delete) = self.dedup.take(self.now_ms, self.window_ms, !held);
        let active = self.segments.back_mut()?;
        let job = CommitJob {
            queue: queue.clone(),
            dir: self.dir.clone(),
            create_dir: !self.dir_exists,
            fence: self.fence.clone(),
            path: active.path.clone(),
            segment: active.base,
            create: !active.created,
            sync_dir: !active.created || std::mem::take(&mut self.name_unsure),
            cuts: std::mem::take(&mut self.cuts),
            offset: self.written,
            bytes: std::mem::take(&mut self.pending),
            waiters: std::mem::take(&mut self.waiters),
            message_seqs: std::mem::take(&mut self.message_seqs),
            message_offsets: std::mem::take(&mut self.message_offsets),
            acks: std::mem::take(&mut self.acks),
            purges: std::mem::take(&mut self.purges),
            delete_after_carry: !reclaim && dedup_write.is_some() && !delete.is_empty(),
            delete,
            dedup_write,
            dedup_delete,
        };
        active.created = true;
        self.dir_exists = true;
        // The largest recent round: a larger one takes over at once, and a
        // smaller one lowers it by a sixteenth.
        self.pending_hint = job
            .bytes
            .len()
            .max(self.pending_hint - self.pending_hint / 16)
            .min(MAX_PENDING_HINT);
        self.written += job.bytes.len() as u64;
        if self.written >= self.segment_bytes && active.base < next_seq {
            self.open_segment(next_seq);
        }
        self.writing = true;
        self.doomed.push_back(false);
        Some(job)
    }

    /// The job taken last is written (`ok`) or failed to be; the next job may
    /// be taken while this one is synced. Its dedup entries, written and
    /// synced before its records, are done either way. A failure here cuts
    /// away this job alone: nothing was taken after it, and the jobs before
    /// it, still being synced, lie before it.
    pub fn job_written(&mut self, job: &CommitJob, ok: bool) {
        debug_assert!(self.writing, "a job written that was not taken");
        self.writing = false;
        if let Some(write) = &job.dedup_write {
            self.dedup.done(write, ok);
        }
        if !ok {
            if let Some(doomed @ false) = self.doomed.back_mut() {
                *doomed = true;
                self.cut_back(job);
            }
        }
    }

    /// The oldest job not finished yet is done. Returns whether its records
    /// are durable: its I/O succeeded (`io`), and no failure cut them away
    /// since it was taken (an older job's: its bytes then lie past an
    /// unknown end). A failure found here cuts away every job taken after
    /// this one, too.
    pub fn job_done(&mut self, job: &CommitJob, io: JobIo) -> bool {
        debug_assert!(
            self.doomed.len() > usize::from(self.writing),
            "a job done that was not written"
        );
        let doomed = self.doomed.pop_front().unwrap_or(false);
        if !doomed && io.is_done() {
            if let (Some(cell), Some(last)) = (&self.stored, job.message_seqs.last()) {
                cell.fetch_max(last + 1, Ordering::Release);
            }
            return true;
        }
        if !doomed {
            self.cut_back(job);
            self.doomed.iter_mut().for_each(|d| *d = true);
        }
        self.give_back(job, io);
        false
    }

    /// After `job` failed and no earlier failure cut it away (see the module
    /// doc): cuts its file back to where the job began and every newer
    /// segment back to its header. The jobs taken after it are the
    /// caller's to doom.
    fn cut_back(&mut self, job: &CommitJob) {
        // The job's own cuts may not have been made: make them again.
        for (path, len) in &job.cuts {
            self.add_cut(path, *len);
        }
        self.add_cut(&job.path, job.offset);
        // Segments opened after the job was taken hold only jobs taken
        // after it. (If the job's own segment is not listed, a doomed job
        // took it for deletion: every listed one is newer.)
        let newer_from = self
            .segments
            .iter()
            .position(|s| s.path == job.path)
            .map_or(0, |i| i + 1);
        let mut cut_to_header = Vec::new();
        for segment in self.segments.iter().skip(newer_from) {
            if segment.created {
                cut_to_header.push(segment.path.clone());
            }
        }
        for path in cut_to_header {
            self.add_cut(&path, FILE_HEADER_BYTES);
        }
        let active_is_jobs = self.segments.back().is_some_and(|s| s.path == job.path);
        self.written = if active_is_jobs {
            job.offset
        } else {
            FILE_HEADER_BYTES
        };
        // The directory's creation may be what failed.
        if job.create_dir {
            self.dir_exists = false;
        }
    }

    /// Asks the next job to cut `path` back to `len`; a file already to be
    /// cut keeps the shorter length (cuts are made in order, and a longer
    /// one after a shorter one would leave zeros where records go).
    fn add_cut(&mut self, path: &std::path::Path, len: u64) {
        match self.cuts.iter_mut().find(|(p, _)| p == path) {
            Some((_, cut)) => *cut = (*cut).min(len),
            None => self.cuts.push((path.to_owned(), len)),
        }
    }

    /// Queues again the acks of a failed job, once, when it finishes (their
    /// position among records is free). Its messages are the shard's to
    /// discard ([`QueueLog::forget_message`]). The segments it was to delete
    /// are kept for a later job when their deletion waited for the job's
    /// carry of their acked ids ([`CommitJob::delete_after_carry`]): deleted
    /// before the carry is on disk, a crash would forget ids still inside
    /// the dedup window. When the job failed for lack of space they go all
    /// the same (every message in them is acked, in memory, and deleting
    /// them is what frees space; the carry goes out with the next job).
    fn give_back(&mut self, job: &CommitJob, io: JobIo) {
        if !job.deletes_segments(false, io) {
            // The oldest segments, in base order, ahead of those left.
            for (base, path) in job.delete.iter().rev() {
                self.segments.push_front(Segment {
                    base: *base,
                    path: path.clone(),
                    live: 0,
                    created: true,
                });
            }
        }
        for &(seq, at, key) in &job.acks {
            encode(
                &Record::Ack {
                    seq,
                    acked_at_ms: at,
                    key,
                },
                self.pending(),
            );
            self.acks.push((seq, at, key));
        }
        for (upto, kept) in &job.purges {
            encode_purge(*upto, kept, self.pending());
            self.purges.push((*upto, kept.clone()));
        }
    }
}

fn encode_purge(upto: u64, kept: &[u64], out: &mut Vec<u8>) {
    let mut packed = Vec::with_capacity(kept.len() * 8);
    PackedSeqs::pack(kept, &mut packed);
    let kept = PackedSeqs::new(&packed).unwrap_or_else(|| unreachable!("whole u64s"));
    encode(&Record::Purge { upto, kept }, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str) -> Arc<Message> {
        Message::new(id, "{}", Arc::from("s"))
    }

    /// Writes and syncs `job`.
    fn finish(log: &mut QueueLog, job: &CommitJob) {
        log.job_written(job, true);
        assert!(log.job_done(job, JobIo::Done));
    }

    fn take(log: &mut QueueLog, next_seq: u64) -> CommitJob {
        log.take_job(&Arc::from("q"), next_seq, false, u64::MAX)
            .unwrap()
    }

    const H: u64 = FILE_HEADER_BYTES;

    /// A log whose first job (message 0) is finished and whose second
    /// (message 1) is taken: the two jobs.
    fn second_taken(log: &mut QueueLog) -> (CommitJob, CommitJob) {
        log.append_message(0, &msg("a"));
        let first = take(log, 1);
        finish(log, &first);
        log.append_message(1, &msg("b"));
        let second = take(log, 2);
        (first, second)
    }

    #[test]
    fn the_first_job_into_a_recovered_segment_syncs_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let found = [RecoveredSegment {
            base: 5,
            path: dir.path().join("segment-00000000000000000005.log"),
            len: H,
            live: 0,
            appendable: true,
        }];
        let mut log = QueueLog::recovered(dir.path().to_path_buf(), 1 << 20, 5, &found, &[]);
        log.append_message(5, &msg("a"));
        log.add_waiter(1);
        let job = take(&mut log, 6);
        assert!(!job.create, "the file exists");
        assert!(job.sync_dir, "its name may never have been synced");
        finish(&mut log, &job);
        log.append_message(6, &msg("b"));
        let job = take(&mut log, 7);
        assert!(!job.create && !job.sync_dir, "once is enough");
    }

    #[test]
    fn a_log_is_not_quiet_while_a_job_is_written_and_not_finished() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        log.append_message(0, &msg("a"));
        log.add_waiter(1);
        let job = take(&mut log, 1);
        assert!(!log.is_quiet(), "being written");
        log.job_written(&job, false);
        assert!(!log.is_quiet(), "written, its failure not reported yet");
        assert!(!log.job_done(&job, JobIo::Failed));
        assert!(log.is_quiet());
    }

    /// A round large enough to be written directly is laid out for where
    /// it goes: the committer can hand its blocks to the device without
    /// copying them (`log_buf`). Round after round, each at a new offset.
    #[test]
    fn a_large_rounds_bytes_lie_in_memory_as_in_the_file() {
        use crate::log::log_buf::BLOCK;
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 30, 0);
        let body = "x".repeat(1000 + 7);
        let mut seq = 0;
        let mut laid_out = 0;
        for round in 0..6 {
            for _ in 0..300 + round * 37 {
                log.append_message(
                    seq,
                    &Message::new(&format!("m{seq}"), &body, Arc::from("s")),
                );
                seq += 1;
            }
            let job = take(&mut log, seq);
            let at = job.bytes.as_ptr() as usize;
            // The first round sizes the buffer for the next ones.
            if round > 0 {
                assert_eq!(at % BLOCK, job.offset as usize % BLOCK, "round {round}");
                laid_out += 1;
            }
            finish(&mut log, &job);
        }
        assert_eq!(laid_out, 5);
    }

    #[test]
    fn jobs_carry_appends_waiters_and_offsets() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        assert!(!log.is_dirty());
        log.append_message(0, &msg("a"));
        log.add_waiter(7);
        let job = take(&mut log, 1);
        assert!(job.create && job.create_dir && job.cuts.is_empty());
        assert_eq!(
            (job.offset, job.waiters.clone(), job.message_seqs.clone()),
            (H, vec![7], vec![0])
        );
        assert!(
            log.take_job(&Arc::from("q"), 1, false, u64::MAX).is_none(),
            "one job being written per log"
        );
        log.append_message(1, &msg("b"));
        log.job_written(&job, true);
        // The next job is written while the first one is synced.
        let second = take(&mut log, 2);
        assert!(!second.create && !second.create_dir);
        assert_eq!(second.offset, H + job.bytes.len() as u64);
        assert!(log.job_done(&job, JobIo::Done));
        log.job_written(&second, true);
        assert!(log.job_done(&second, JobIo::Done));
        assert!(!log.is_dirty());
    }

    #[test]
    fn a_failed_sync_fails_later_jobs_and_the_file_is_cut_back_not_replaced() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        log.append_message(0, &msg("a"));
        let first = take(&mut log, 1);
        finish(&mut log, &first);
        log.append_message(1, &msg("b"));
        log.append_ack(0, 9, None);
        log.append_purge(2, vec![1]);
        let second = take(&mut log, 2);
        log.job_written(&second, true);
        log.append_message(2, &msg("c"));
        let third = take(&mut log, 3);
        log.job_written(&third, true);
        // The second's sync fails: the third lies after it, whatever its I/O.
        assert!(!log.job_done(&second, JobIo::Failed));
        assert!(
            !log.job_done(&third, JobIo::Done),
            "written past an unknown end"
        );
        log.forget_message(1);
        log.forget_message(2);
        log.append_message(3, &msg("d"));
        let retry = take(&mut log, 4);
        assert_eq!(retry.path, first.path, "the same file, no new one");
        assert_eq!(retry.cuts, vec![(first.path.clone(), second.offset)]);
        assert_eq!(retry.offset, second.offset);
        assert_eq!(retry.acks, vec![(0, 9, None)], "the ack goes out again");
        assert_eq!(retry.purges, vec![(2, vec![1])], "and the purge");
        let mut records = Vec::new();
        let mut pos = 0;
        while let crate::log::segment::Step::Record(record, n) =
            crate::log::segment::step(&retry.bytes, pos, crate::log::record::Framing::V2, true)
        {
            records.push(format!("{record:?}"));
            pos += n;
        }
        assert_eq!(records.len(), 3, "the ack, the purge and d: {records:?}");
        assert!(records[1].starts_with("Purge { upto: 2"), "{records:?}");
        finish(&mut log, &retry);
        assert_eq!(log.segments[0].live, 1, "only d is held");
    }

    /// The committer writes a round while the one before it is synced, so a
    /// job may fail to be written while the job before it is still being
    /// synced. That one lies before the failure: its own I/O decides, and
    /// the cut keeps it. (It was once answered `NACK storage` while its
    /// records stayed on disk, to come back after a restart.)
    #[test]
    fn a_failed_write_spares_the_job_before_it_still_being_synced() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        log.append_message(0, &msg("a"));
        let first = take(&mut log, 1);
        log.job_written(&first, true);
        log.append_message(1, &msg("b"));
        let second = take(&mut log, 2);
        log.job_written(&second, false);
        assert!(
            log.job_done(&first, JobIo::Done),
            "written and synced before the failure, and kept by its cut"
        );
        assert!(!log.job_done(&second, JobIo::Failed));
        log.forget_message(1);
        log.append_message(2, &msg("c"));
        let retry = take(&mut log, 3);
        assert_eq!(retry.cuts, vec![(first.path.clone(), second.offset)]);
        assert_eq!(retry.offset, second.offset);
        finish(&mut log, &retry);
    }

    /// The reverse: the job before fails in its finish (its directory's
    /// sync) after the next one failed to be written. The cut goes back to
    /// the older job, and the job taken meanwhile, written at the first
    /// cut, is cut away too.
    #[test]
    fn an_older_failure_found_later_cuts_back_further() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        let (first, second) = second_taken(&mut log);
        log.job_written(&second, true);
        log.append_message(2, &msg("c"));
        let third = take(&mut log, 3);
        log.job_written(&third, false);
        log.append_message(3, &msg("d"));
        let fourth = take(&mut log, 4);
        assert_eq!(fourth.cuts, vec![(first.path.clone(), third.offset)]);
        log.job_written(&fourth, true);
        assert!(!log.job_done(&second, JobIo::Failed));
        assert!(!log.job_done(&third, JobIo::Failed));
        assert!(
            !log.job_done(&fourth, JobIo::Done),
            "written past the older failure"
        );
        for seq in 1..=3 {
            log.forget_message(seq);
        }
        log.append_message(4, &msg("e"));
        let retry = take(&mut log, 5);
        assert_eq!(retry.cuts, vec![(first.path.clone(), second.offset)]);
        assert_eq!(retry.offset, second.offset);
    }

    #[test]
    fn a_job_whose_cuts_failed_makes_them_again_shortest_first() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        let (first, second) = second_taken(&mut log);
        log.job_written(&second, false);
        assert!(!log.job_done(&second, JobIo::Failed));
        log.forget_message(1);
        log.append_message(2, &msg("c"));
        let retry = take(&mut log, 3);
        assert_eq!(retry.cuts, vec![(first.path.clone(), second.offset)]);
        // The cut itself fails: the next job cuts again, to the same length.
        log.job_written(&retry, false);
        assert!(!log.job_done(&retry, JobIo::Failed));
        log.forget_message(2);
        log.append_message(3, &msg("d"));
        let again = take(&mut log, 4);
        assert_eq!(again.cuts, vec![(first.path.clone(), second.offset)]);
        assert_eq!(again.offset, second.offset);
    }

    #[test]
    fn a_failed_write_that_created_a_file_is_retried_into_it() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        log.append_message(0, &msg("a"));
        let first = take(&mut log, 1);
        log.job_written(&first, false);
        assert!(!log.job_done(&first, JobIo::Failed));
        log.forget_message(0);
        log.append_message(1, &msg("b"));
        let retry = take(&mut log, 2);
        assert!(retry.create_dir, "the directory may be what failed");
        assert_eq!(retry.cuts, vec![(first.path.clone(), H)]);
        assert_eq!((retry.path, retry.offset), (first.path, H));
    }

    #[test]
    fn a_failure_after_a_roll_empties_the_newer_segment() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 10, 0);
        log.append_message(0, &msg("a"));
        let first = take(&mut log, 1);
        log.job_written(&first, true);
        log.append_message(1, &msg("b"));
        let second = take(&mut log, 2);
        assert!(second.create, "rolled");
        log.job_written(&second, true);
        assert!(!log.job_done(&first, JobIo::Failed));
        assert!(!log.job_done(&second, JobIo::Done));
        log.forget_message(0);
        log.forget_message(1);
        log.append_message(2, &msg("c"));
        let retry = take(&mut log, 3);
        assert_eq!(
            retry.cuts,
            vec![(first.path.clone(), H), (second.path.clone(), H)]
        );
        assert!(retry.create && retry.offset == H);
        assert!(retry.path.ends_with("segment-00000000000000000002.log"));
        // Both emptied segments hold nothing now: deleted after the cuts.
        assert_eq!(
            retry.delete,
            vec![(0, first.path.clone()), (1, second.path.clone())]
        );
    }

    #[test]
    fn a_failed_job_does_not_hold_back_its_deletions() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 10, 0);
        log.append_message(0, &msg("a"));
        let job = take(&mut log, 1);
        finish(&mut log, &job);
        log.append_message(1, &msg("b"));
        let job = take(&mut log, 2);
        finish(&mut log, &job);
        log.append_ack(0, 1, None);
        let deleting = take(&mut log, 2);
        assert_eq!(deleting.delete.len(), 1);
        log.job_written(&deleting, false);
        assert!(!log.job_done(&deleting, JobIo::Failed));
        assert!(
            log.segments.iter().all(|s| s.base != 0),
            "the spent segment is not listed again"
        );
        let again = take(&mut log, 2);
        assert!(again.delete.is_empty());
        assert_eq!(again.acks, vec![(0, 1, None)], "its ack is written again");
    }

    #[test]
    fn a_log_made_after_its_first_message_took_its_number_starts_at_it() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 1);
        log.append_message(0, &msg("a"));
        let job = take(&mut log, 1);
        assert!(job.path.ends_with("segment-00000000000000000000.log"));
    }

    #[test]
    fn full_segments_roll_and_are_deleted_once_acked() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 10, 0);
        log.append_message(0, &msg("a"));
        let job = take(&mut log, 1);
        finish(&mut log, &job);
        log.append_message(1, &msg("b"));
        let job = take(&mut log, 2);
        assert!(job.create, "second segment");
        assert!(job.path.ends_with("segment-00000000000000000001.log"));
        finish(&mut log, &job);
        log.append_ack(0, 1, None);
        let job = take(&mut log, 2);
        assert_eq!(
            job.delete,
            vec![(0, PathBuf::from("/d/q/segment-00000000000000000000.log"))]
        );
    }

    #[test]
    fn acked_segments_wait_for_their_ids_to_be_carried() {
        // Three segments of one message each (0, 1, 2), the first two acked.
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 10, 0);
        for seq in 0..3 {
            log.append_message(seq, &msg("m"));
            let job = take(&mut log, seq + 1);
            finish(&mut log, &job);
        }
        log.append_ack(0, 1, None);
        log.append_ack(1, 1, None);
        assert_eq!(log.deletion_bound(), Some(2));
        let path = |base| PathBuf::from(format!("/d/q/segment-{base:020}.log"));
        // Nothing below 1 carried yet: the acks are written, nothing goes,
        // and the ids carried so far wait for the job that deletes.
        log.append_dedup(&[(crate::DedupKey(7), 1)]);
        let job = log.take_job(&Arc::from("q"), 3, false, 0).unwrap();
        assert!(job.delete.is_empty() && job.dedup_write.is_none());
        finish(&mut log, &job);
        assert!(log.is_dirty(), "the deletions are still owed");
        // Carried below 1: only the first segment lies wholly below, and
        // its ids are written first.
        let job = log.take_job(&Arc::from("q"), 3, false, 1).unwrap();
        assert_eq!(job.delete, vec![(0, path(0))]);
        assert!(job.dedup_write.is_some());
        finish(&mut log, &job);
        let job = log.take_job(&Arc::from("q"), 3, false, 2).unwrap();
        assert_eq!(job.delete, vec![(1, path(1))]);
        finish(&mut log, &job);
        assert!(!log.is_dirty());
    }

    #[test]
    fn low_disk_closes_a_spent_active_segment_so_it_can_go() {
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 20, 0);
        log.append_message(0, &msg("a"));
        let job = take(&mut log, 1);
        finish(&mut log, &job);
        log.append_ack(0, 1, None);
        let job = take(&mut log, 1);
        finish(&mut log, &job);
        assert!(log.is_spent() && !log.is_dirty());
        assert!(log.take_job(&Arc::from("q"), 1, false, u64::MAX).is_none());
        let job = log.take_job(&Arc::from("q"), 1, true, u64::MAX).unwrap();
        assert_eq!(
            job.delete,
            vec![(0, PathBuf::from("/d/q/segment-00000000000000000000.log"))]
        );
        assert!(job.create && job.path.ends_with("segment-00000000000000000001.log"));
    }

    #[test]
    fn the_mirror_holds_acked_segments_until_it_has_read_them() {
        let cell = Arc::new(AtomicU64::new(0));
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 10, 0);
        log.set_mirror(cell.clone());
        log.append_message(0, &msg("a"));
        let job = take(&mut log, 1);
        finish(&mut log, &job);
        log.append_message(1, &msg("b"));
        let job = take(&mut log, 2);
        finish(&mut log, &job);
        log.append_ack(0, 1, None);
        let job = take(&mut log, 2);
        assert!(job.delete.is_empty(), "the mirror has not read segment 0");
        finish(&mut log, &job);
        assert!(!log.is_dirty());
        assert_eq!(log.deletion_bound(), None);
        cell.store(1, std::sync::atomic::Ordering::Release);
        assert!(log.is_dirty());
        assert_eq!(log.deletion_bound(), Some(1));
        let job = take(&mut log, 2);
        assert_eq!(job.delete.len(), 1);
    }

    /// A round up to half as large again as the largest recent one is
    /// encoded without the pending buffer growing (each growth copies the
    /// round so far), and a run of small rounds lets the size come down.
    #[test]
    fn the_pending_buffer_fits_a_round_larger_than_the_last() {
        let body = "x".repeat(1000);
        let message = Message::new("m", &body, Arc::from("s"));
        let mut log = QueueLog::new(PathBuf::from("/d/q"), 1 << 30, 0);
        let mut seq = 0;
        let mut round = |log: &mut QueueLog, messages: u64| {
            let mut capacities = Vec::new();
            for _ in 0..messages {
                log.append_message(seq, &message);
                capacities.push(log.pending.capacity());
                seq += 1;
            }
            let job = take(log, seq);
            finish(log, &job);
            capacities
        };
        round(&mut log, 100);
        round(&mut log, 10);
        let larger = round(&mut log, 140);
        assert!(
            larger.iter().all(|c| *c == larger[0]),
            "the buffer grew during a round 1.4x the largest recent one: {:?}",
            larger.first().zip(larger.last())
        );
        let before = log.pending_hint;
        for _ in 0..100 {
            round(&mut log, 1);
        }
        assert!(
            log.pending_hint < before / 10,
            "the size hint never came down"
        );
    }
}
