//! A shard's durable side: the logs of its queues, what waits for the next
//! group commit, and the publishes (tickets) to answer once it is done.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use ciphermq_proto::NackReason;
use hashbrown::hash_map::EntryRef;

use crate::dedup::DedupKey;
use crate::hashers::{NameMap, NameSet, NameState};
use crate::log::buffer_pool::BufferPool;
use crate::log::{
    queue_dir, unix_ms, CommitJob, JobIo, LogBuf, LogPlacement, MirrorWatermarks, QueueLog,
};
use crate::mesh::Origin;
use crate::pending::Resolver;
use crate::queue::{Queue, QueueSettings};

/// Acked ids a commit round carries to a log's dedup file, at most, before
/// that log's fully acked segments are deleted. A 64 MiB segment of 1 KiB
/// messages holds about 57,000: carried in one round they held the shard
/// for 1-2 ms; in rounds of this many each takes a tenth of a millisecond or
/// so, and the segments go a few rounds later.
pub const CARRY_PER_ROUND: usize = 4096;

/// A deleted queue's log directory, for the committer to move away.
///
/// The committer takes it with its next round, after every job of the
/// queue's log already taken has finished (so no write can create the
/// directory again), renames the directory to a name no queue can have
/// ([`deleted_dir`]), syncs `queues/`, and only then resolves `done`; what
/// the renamed directory holds is freed afterwards, off the shard. A start
/// removes such directories, so a crash at any point never serves the old
/// messages again.
#[derive(Debug)]
pub struct QueueRemoval {
    /// The deleted queue.
    pub queue: Arc<str>,
    /// Its log directory, `{data_dir}/queues/{queue}`.
    pub dir: PathBuf,
    /// Told once the directory is moved away durably (or why not).
    pub done: Resolver<Result<(), String>>,
    /// Where the directory goes instead of being freed: the queue of an
    /// owner moving to another node waits there, whole, until the move
    /// ends (`None`: a deleted queue's, freed).
    pub keep: Option<PathBuf>,
}

/// Marks a directory under `queues/` as a deleted queue's: `~` is no
/// character of a queue name, so no queue's directory can be named so.
pub const DELETED_MARK: &str = "~deleted-";

/// The name a deleted queue's directory `dir` is renamed to before it is
/// freed: beside it, `{queue}~deleted-{unix ms}-{n}`.
pub fn deleted_dir(dir: &std::path::Path, n: u64) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(format!("{DELETED_MARK}{}-{n}", unix_ms()));
    PathBuf::from(name)
}

/// Whether a directory entry under `queues/` is a deleted queue's log
/// directory (see [`deleted_dir`]), which recovery removes, never reads.
pub fn is_deleted_dir_name(name: &str) -> bool {
    name.contains(DELETED_MARK)
}

/// What to do when a ticket's commits are done.
#[derive(Debug)]
pub(crate) enum TicketKind {
    /// Answer a publish.
    Publish,
    /// Answer a `purge_queue` of `count` messages.
    Purge { count: u64 },
    /// Append the ack of a dead-lettered message to its source queue; if
    /// the dead-letter queue's commit failed, store `msg` there again.
    AckAfter {
        queue: Arc<str>,
        seq: u64,
        key: crate::DedupKey,
        msg: Arc<crate::message::Message>,
    },
    /// A deferred ack whose source queue left the shard (deleted, or its
    /// owner moved away) before it was due: nothing is owed to it.
    Dropped,
}

/// Something waiting for commits: a publish part, or a deferred ack.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub(crate) kind: TicketKind,
    pub(crate) origin: Origin,
    /// Commits still to come.
    pub(crate) remaining: u32,
    pub(crate) outcome: Result<(), NackReason>,
}

/// Free space on the data directory's filesystem, as a watcher thread last
/// saw it; every shard reads it (one relaxed load per publish).
#[derive(Debug, Default)]
pub struct DiskSpace {
    /// Below the configured minimum (with hysteresis): publishes are refused
    /// with `NACK disk_full` and spent segments are closed to be deleted.
    low: AtomicBool,
    /// Free bytes at the last look.
    free_bytes: AtomicU64,
}

impl DiskSpace {
    /// Space not known yet: treated as plenty.
    pub fn new() -> DiskSpace {
        DiskSpace::default()
    }

    /// Whether publishes are refused for lack of space.
    pub fn is_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// Free bytes at the last look.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes.load(Ordering::Relaxed)
    }

    /// Records a look: `free` bytes, and whether that is too little.
    /// Returns whether `low` changed.
    pub fn set(&self, free: u64, low: bool) -> bool {
        self.free_bytes.store(free, Ordering::Relaxed);
        self.low.swap(low, Ordering::Relaxed) != low
    }
}

/// How many times as long as the last round took to write a new round may
/// wait for the committer before connections end their turn for it
/// ([`Durability::round_due`]). Publishing alone with a window of 1,000,
/// 1.5 and 2 gained about a fifth, 0.5 and 1 a few percent, 3 nothing
/// (docs/DECISIONS.md, "A commit round is taken before the turn ends").
const ROUND_DUE_AFTER: u32 = 2;

/// Logs and commit bookkeeping of one shard (`storage.mode = "durable"`).
#[derive(Debug)]
pub struct Durability {
    data_dir: PathBuf,
    segment_bytes: u64,
    /// hashbrown's map for its `entry_ref`: an append finds its log by the
    /// borrowed name, with no clone of the name's `Arc` (an atomic add and
    /// subtract on a line other shards' topology snapshots share).
    logs: hashbrown::HashMap<Arc<str>, QueueLog, NameState>,
    dirty: Vec<Arc<str>>,
    committer: Option<Waker>,
    /// When an append woke the idle committer, which has not taken its
    /// round yet.
    committer_woken: Option<Instant>,
    /// How long the last round took to write and sync.
    last_write: Duration,
    /// Broker-assigned numbers: the one-multiplication hasher suffices.
    pub(crate) tickets: HashMap<u64, Ticket, crate::hashers::BuildIntHasher>,
    next_ticket: u64,
    /// Publishes answered as duplicates, by ticket: the queue and id key of
    /// each original. An original whose write then fails takes its
    /// duplicates' `ACK` with it ([`Durability::fail_duplicates`]). Empty
    /// unless a sender publishes an id again.
    pub(crate) duplicates: HashMap<u64, Vec<(Arc<str>, DedupKey)>, crate::hashers::BuildIntHasher>,
    /// With the Postgres bridge: segments wait for it before deletion.
    mirror: Option<Arc<MirrorWatermarks>>,
    /// Free space on the data directory's filesystem.
    disk: Arc<DiskSpace>,
    /// Deleted queues' directories waiting for the committer.
    removals: Vec<QueueRemoval>,
    /// Deleted queues whose removal has not finished: jobs of their logs
    /// still in flight finish as durable (there is nothing left to keep).
    retired: NameSet<Arc<str>>,
    /// Written commit buffers for later rounds.
    buffers: BufferPool,
    /// Ids carried out of segments about to be deleted, kept between rounds
    /// (at most [`CARRY_PER_ROUND`] entries).
    carried: Vec<(DedupKey, u64)>,
    /// Where logs kept outside the data directory live (a cluster on
    /// shared storage); `None`: every log is under `data_dir/queues`.
    placement: Option<Arc<dyn LogPlacement>>,
}

impl Durability {
    /// Logs under `data_dir/queues`, rolling segments at `segment_bytes`;
    /// with `mirror`, fully acked segments wait for the metadata mirror.
    /// `disk` is watched by someone else: while it is low, publishes are
    /// refused and spent segments closed so they can be deleted.
    pub fn new(
        data_dir: PathBuf,
        segment_bytes: u64,
        mirror: Option<Arc<MirrorWatermarks>>,
        disk: Arc<DiskSpace>,
    ) -> Durability {
        Durability {
            data_dir,
            segment_bytes,
            logs: hashbrown::HashMap::default(),
            dirty: Vec::new(),
            committer: None,
            committer_woken: None,
            last_write: Duration::ZERO,
            tickets: HashMap::default(),
            next_ticket: 1,
            duplicates: HashMap::default(),
            mirror,
            disk,
            removals: Vec::new(),
            retired: NameSet::default(),
            buffers: BufferPool::default(),
            carried: Vec::new(),
            placement: None,
        }
    }

    /// Asks `placement` where each new log lives (a cluster on shared
    /// storage). Such logs are left out of the metadata mirror, which reads
    /// the data directory only.
    pub fn set_placement(&mut self, placement: Arc<dyn LogPlacement>) {
        self.placement = Some(placement);
    }

    /// `delete_queue`: forgets `queue`'s log (nothing more is appended to
    /// it) and hands its directory to the committer ([`QueueRemoval`]),
    /// which resolves `done`. Returns the tickets that waited for a commit
    /// of the log not taken yet, for the caller to release as a finished
    /// job of a deleted queue's is (see [`Durability::job_done`]).
    pub(crate) fn retire(
        &mut self,
        queue: &Arc<str>,
        done: Resolver<Result<(), String>>,
    ) -> Vec<u64> {
        let waiters = self
            .logs
            .remove(queue)
            .map(|mut log| log.take_waiters())
            .unwrap_or_default();
        self.dirty.retain(|q| q != queue);
        self.retired.insert(queue.clone());
        self.removals.push(QueueRemoval {
            queue: queue.clone(),
            dir: self.dir_of(queue),
            done,
            keep: None,
        });
        if let Some(waker) = self.committer.take() {
            waker.wake();
        }
        waiters
    }

    /// Whether `queue`'s log files stand still (see
    /// [`QueueLog::is_quiet`]); a queue with no log is.
    pub(crate) fn is_quiet(&self, queue: &str) -> bool {
        self.logs.get(queue).is_none_or(QueueLog::is_quiet)
    }

    /// A quiet queue's log leaves the shard whole: nothing more is
    /// appended, and the committer moves its directory to `keep` (see
    /// [`QueueRemoval::keep`]).
    pub(crate) fn detach(
        &mut self,
        queue: &Arc<str>,
        keep: PathBuf,
        done: Resolver<Result<(), String>>,
    ) -> Vec<u64> {
        let waiters = self.retire(queue, done);
        if let Some(removal) = self.removals.last_mut() {
            removal.keep = Some(keep);
        }
        waiters
    }

    /// A quiet queue's log leaves the shard and its files stay as they are:
    /// they are on shared storage, and the node now holding the owner
    /// reads them. Returns the tickets that waited (none, when quiet).
    pub(crate) fn forget(&mut self, queue: &Arc<str>) -> Vec<u64> {
        self.dirty.retain(|q| q != queue);
        self.logs
            .remove(queue)
            .map(|mut log| log.take_waiters())
            .unwrap_or_default()
    }

    /// Takes the removals due (see [`QueueRemoval`]).
    pub(crate) fn take_removals(&mut self, out: &mut Vec<QueueRemoval>) {
        out.append(&mut self.removals);
    }

    /// A removal finished: the queue's jobs are all done, and its directory
    /// is out of the metadata mirror's sight, which is told now (told
    /// earlier, it could read the directory again before it moved).
    pub(crate) fn removal_done(&mut self, queue: &Arc<str>) {
        self.retired.remove(queue);
        if let Some(mirror) = &self.mirror {
            mirror.queue_deleted(queue);
        }
    }

    /// Whether publishes must be refused for lack of disk space.
    pub(crate) fn disk_low(&self) -> bool {
        self.disk.is_low()
    }

    /// Adopts a log rebuilt by recovery.
    /// `next_seq`: the queue's next sequence number (what is stored so far).
    pub(crate) fn insert_log(&mut self, queue: Arc<str>, mut log: QueueLog, next_seq: u64) {
        if let Some(mirror) = &self.mirror {
            log.set_mirror(mirror.cell(&queue));
            log.track_stored(mirror.stored_cell(&queue), next_seq);
        }
        self.logs.insert(queue, log);
    }

    /// The directory of `queue`'s log.
    pub(crate) fn dir_of(&self, queue: &str) -> PathBuf {
        match self.logs.get(queue) {
            Some(log) => log.dir().to_path_buf(),
            None => queue_dir(&self.data_dir, queue),
        }
    }

    /// The segment size.
    pub(crate) fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Bytes appended to `queue`'s log that no commit job has taken yet.
    pub(crate) fn pending_bytes(&self, queue: &str) -> usize {
        self.logs.get(queue).map_or(0, QueueLog::pending_bytes)
    }

    /// The log of `queue`, created empty on first use.
    pub(crate) fn log(&mut self, queue: &Arc<str>, next_seq: u64) -> &mut QueueLog {
        if !self.dirty.iter().any(|q| q == queue) {
            self.dirty.push(queue.clone());
        }
        if let Some(waker) = self.committer.take() {
            waker.wake();
            self.committer_woken = Some(Instant::now());
        }
        // Called per append: a lookup by the borrowed name, and the name's
        // `Arc` cloned and the path built only for a new log.
        let log = match self.logs.entry_ref(queue) {
            EntryRef::Occupied(log) => log.into_mut(),
            // The key is the name the entry was looked up by: it cannot
            // differ (the one way `insert_with_key` panics).
            EntryRef::Vacant(vacant) => vacant.insert_with_key(
                queue.clone(),
                new_log(
                    &self.data_dir,
                    self.segment_bytes,
                    self.mirror.as_ref(),
                    self.placement.as_deref(),
                    queue,
                    next_seq,
                ),
            ),
        };
        // The first append of a round: a written buffer, if one fits.
        if let Some(room) = log.buffer_wanted() {
            if let Some(buf) = self.buffers.take(room) {
                log.use_buffer(buf);
            }
        }
        log
    }

    /// A job's bytes are written: keeps the buffer for a later round.
    pub(crate) fn buffer_written(&mut self, buf: LogBuf) {
        self.buffers.give(buf.into_vec());
    }

    /// Marks dirty the logs with deletions due: acked segments the mirror
    /// has read since they were held, dedup files past the window. Call
    /// about once a second.
    pub(crate) fn housekeeping(&mut self, window_ms: u64, now_ms: u64) {
        self.buffers.tidy();
        let mut woke = false;
        let reclaim = self.disk.is_low();
        for (queue, log) in self.logs.iter_mut() {
            log.note_time(now_ms, window_ms);
            if (log.is_dirty() || (reclaim && log.is_spent())) && !self.dirty.contains(queue) {
                self.dirty.push(queue.clone());
                woke = true;
            }
        }
        if woke {
            if let Some(waker) = self.committer.take() {
                waker.wake();
            }
        }
    }

    /// Starts a ticket for `origin`.
    pub(crate) fn new_ticket(&mut self, origin: Origin) -> u64 {
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(
            id,
            Ticket {
                kind: TicketKind::Publish,
                origin,
                remaining: 0,
                outcome: Ok(()),
            },
        );
        id
    }

    /// A ticket that answers a purge of `count` messages once the one
    /// commit holding its records is done.
    pub(crate) fn new_purge_ticket(&mut self, origin: Origin, count: u64) -> u64 {
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(
            id,
            Ticket {
                kind: TicketKind::Purge { count },
                origin,
                remaining: 1,
                outcome: Ok(()),
            },
        );
        id
    }

    /// Deferred acks owed to `queue` are dropped: it left the shard, and a
    /// queue declared again under its name must not take them (an ack of a
    /// seq it never stored would count against one of its own messages'
    /// segments, which could then be deleted with that message unacked).
    /// Walks every ticket: only on a queue's delete or move.
    pub(crate) fn drop_deferred_acks(&mut self, queue: &str) {
        for ticket in self.tickets.values_mut() {
            if matches!(&ticket.kind, TicketKind::AckAfter { queue: q, .. } if **q == *queue) {
                ticket.kind = TicketKind::Dropped;
            }
        }
    }

    /// A ticket that appends the ack of `seq` to `queue` once the one commit
    /// it waits for is done.
    pub(crate) fn new_deferred_ack(
        &mut self,
        queue: Arc<str>,
        seq: u64,
        key: crate::DedupKey,
        msg: Arc<crate::message::Message>,
    ) -> u64 {
        let id = self.next_ticket;
        self.next_ticket += 1;
        let origin = Origin {
            conn: crate::placement::ConnRef { shard: 0, id: 0 },
            seq: 0,
        };
        let kind = TicketKind::AckAfter {
            queue,
            seq,
            key,
            msg,
        };
        self.tickets.insert(
            id,
            Ticket {
                kind,
                origin,
                remaining: 1,
                outcome: Ok(()),
            },
        );
        id
    }

    /// Whether a commit round has work.
    pub fn has_work(&self) -> bool {
        !self.dirty.is_empty() || !self.removals.is_empty()
    }

    /// Whether the round an append woke the idle committer for has waited
    /// [`ROUND_DUE_AFTER`] times as long as the last round took to write.
    ///
    /// The committer runs in a task queue of its own, so it takes a round
    /// only once the connections' queue ends its turn: a pipelined publisher
    /// whose whole window arrived at once has it executed first (a few
    /// milliseconds), and the disk idles meanwhile. Taken early, part of the
    /// window is written and synced while the rest is executed, and its
    /// ACKs free the publisher's window sooner. Much earlier makes rounds
    /// too small to pay for their `fdatasync`.
    pub fn round_due(&self) -> bool {
        self.committer_woken
            .is_some_and(|woken| woken.elapsed() >= self.last_write * ROUND_DUE_AFTER)
    }

    /// How long a round took to write and sync.
    pub fn round_written(&mut self, took: Duration) {
        self.last_write = took;
    }

    /// Registers the committer task, woken by the next append.
    pub fn register_committer(&mut self, waker: &Waker) {
        self.committer = Some(waker.clone());
    }

    /// Takes one job per dirty log. Before a job deletes segments, the ids
    /// acked within the dedup window whose evidence they hold are carried
    /// into the active segment (the same job writes and syncs them first).
    pub(crate) fn take_jobs(
        &mut self,
        queues: &mut NameMap<Arc<str>, Queue>,
        settings: &QueueSettings,
        now: Instant,
        now_ms: u64,
        out: &mut Vec<CommitJob>,
    ) {
        self.committer_woken = None;
        let mut still_dirty = Vec::new();
        let mut carried = std::mem::take(&mut self.carried);
        let window_ms = settings.dedup_window.as_millis() as u64;
        let reclaim = self.disk.is_low();
        for queue in std::mem::take(&mut self.dirty) {
            let Some(log) = self.logs.get_mut(&queue) else {
                continue;
            };
            let mut carried_below = u64::MAX;
            if let (Some(bound), Some(q)) = (log.deletion_bound(), queues.get_mut(&queue)) {
                // Room for the whole carry at once (a no-op after its first
                // round): its bytes stay pending until the deletion's job.
                log.reserve_dedup(q.uncarried_below(bound));
                carried.clear();
                carried_below =
                    q.carry_dedup(bound, CARRY_PER_ROUND, now, now_ms, settings, &mut carried);
                log.append_dedup(&carried);
            }
            log.note_time(now_ms, window_ms);
            let next_seq = queues.get(&queue).map_or(0, Queue::next_seq);
            match log.take_job(&queue, next_seq, reclaim, carried_below) {
                Some(job) => out.push(job),
                // A job of this log is still being written: next round.
                None if log.is_dirty_or_waiting() => still_dirty.push(queue),
                None => {}
            }
        }
        self.dirty = still_dirty;
        carried.clear();
        self.carried = carried;
    }

    /// Records that a job's bytes are written (or failed to be): its log
    /// may hand out its next job while this one is synced.
    pub(crate) fn job_written(&mut self, job: &CommitJob, ok: bool) {
        if let Some(log) = self.logs.get_mut(&job.queue) {
            log.job_written(job, ok);
            if log.is_dirty() && !self.dirty.contains(&job.queue) {
                self.dirty.push(job.queue.clone());
            }
        }
    }

    /// Records the end of a job (the caller releases its tickets); returns
    /// whether its records are durable (see [`QueueLog::job_done`]).
    pub(crate) fn job_done(&mut self, job: &CommitJob, io: JobIo) -> bool {
        let Some(log) = self.logs.get_mut(&job.queue) else {
            // A deleted queue's: what waited for it is answered as stored,
            // as it was, into a queue that is now gone.
            return self.retired.contains(&job.queue);
        };
        let ok = log.job_done(job, io);
        if log.is_dirty() && !self.dirty.contains(&job.queue) {
            self.dirty.push(job.queue.clone());
        }
        ok
    }

    /// Messages of a failed job that left their queue: their segments stop
    /// holding them.
    /// Publish `ticket` was a duplicate of the message with `key` in
    /// `queue`, which may not be durable yet: it waits for the queue's next
    /// commit, which does not write that message.
    pub(crate) fn note_duplicate(&mut self, ticket: u64, queue: &Arc<str>, key: DedupKey) {
        self.duplicates
            .entry(ticket)
            .or_default()
            .push((queue.clone(), key));
    }

    /// The writes of the messages with `keys` in `queue` failed: the
    /// publishes answered as their duplicates are answered `NACK storage`
    /// too, or they would be acknowledged for a message stored nowhere.
    /// A walk over the few duplicates waiting, on a failure only.
    pub(crate) fn fail_duplicates(&mut self, queue: &str, keys: &[DedupKey]) {
        if self.duplicates.is_empty() || keys.is_empty() {
            return;
        }
        for (ticket, originals) in &self.duplicates {
            let failed = originals
                .iter()
                .any(|(q, key)| **q == *queue && keys.contains(key));
            if failed {
                if let Some(t) = self.tickets.get_mut(ticket) {
                    t.outcome = Err(NackReason::Storage);
                }
            }
        }
    }

    pub(crate) fn forget_messages(&mut self, queue: &str, seqs: &[u64]) {
        if let Some(log) = self.logs.get_mut(queue) {
            for seq in seqs {
                log.forget_message(*seq);
            }
        }
    }
}

/// An empty log for `queue`: in its placement's directory when a move
/// placed it, else under the data directory, mirrored when one is. Apart
/// from [`Durability::log`] so that the map's entry holds the only borrow.
fn new_log(
    data_dir: &Path,
    segment_bytes: u64,
    mirror: Option<&Arc<MirrorWatermarks>>,
    placement: Option<&dyn LogPlacement>,
    queue: &str,
    next_seq: u64,
) -> QueueLog {
    if let Some(placed) = placement.and_then(|p| p.place(queue)) {
        let mut log = QueueLog::new(placed.dir, segment_bytes, next_seq);
        log.set_fence(placed.fence);
        return log;
    }
    let mut log = QueueLog::new(queue_dir(data_dir, queue), segment_bytes, next_seq);
    if let Some(mirror) = mirror {
        log.set_mirror(mirror.cell(queue));
        // Nothing of a new log is durable yet.
        log.track_stored(mirror.stored_cell(queue), 0);
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::{Decoded, Framing, Record};
    use crate::Message;

    /// Appends `n` messages of 1 KiB from `seq`.
    fn append(d: &mut Durability, queue: &Arc<str>, seq: &mut u64, n: u64) {
        let msg = Message::new("m", &"x".repeat(1024), Arc::from("s"));
        for _ in 0..n {
            d.log(queue, *seq).append_message(*seq, &msg);
            *seq += 1;
        }
    }

    /// Logs that never roll (1 GiB segments), and the queue name to use.
    fn one_segment_log() -> (Durability, Arc<str>) {
        let d = Durability::new(
            PathBuf::from("/nonexistent"),
            1 << 30,
            None,
            Arc::new(DiskSpace::new()),
        );
        (d, Arc::from("q"))
    }

    /// Takes the round's job and finishes it as the committer does,
    /// handing its buffer back; returns the buffer's capacity.
    fn commit(d: &mut Durability) -> usize {
        let mut jobs = Vec::new();
        let settings = QueueSettings::default();
        d.take_jobs(
            &mut NameMap::default(),
            &settings,
            Instant::now(),
            unix_ms(),
            &mut jobs,
        );
        let mut job = jobs.pop().expect("a job");
        let bytes = std::mem::take(&mut job.bytes);
        let capacity = bytes.capacity();
        d.job_written(&job, true);
        d.buffer_written(bytes);
        assert!(d.job_done(&job, JobIo::Done));
        capacity
    }

    /// Takes one round's job of `queues`' only log and finishes it as the
    /// committer does; returns it with the dedup entries it carried.
    fn carry_round(
        d: &mut Durability,
        queues: &mut NameMap<Arc<str>, Queue>,
        settings: &QueueSettings,
        now: Instant,
    ) -> (CommitJob, usize) {
        let (job, carried) = take_carry(d, queues, settings, now);
        d.job_written(&job, true);
        assert!(d.job_done(&job, JobIo::Done));
        (job, carried)
    }

    /// The next job, not finished yet, and how many ids it carries.
    fn take_carry(
        d: &mut Durability,
        queues: &mut NameMap<Arc<str>, Queue>,
        settings: &QueueSettings,
        now: Instant,
    ) -> (CommitJob, usize) {
        let mut jobs = Vec::new();
        d.take_jobs(queues, settings, now, unix_ms(), &mut jobs);
        let job = jobs.pop().expect("a job");
        let mut carried = 0;
        let mut bytes: &[u8] = job.dedup_write.as_ref().map_or(&[], |w| &w.bytes);
        while !bytes.is_empty() {
            match crate::log::record::decode(Framing::V2, bytes) {
                Decoded::Record(Record::Dedup(entries), len) => {
                    carried += entries.len();
                    bytes = &bytes[len..];
                }
                other => panic!("not a dedup record: {other:?}"),
            }
        }
        (job, carried)
    }

    /// The bases of the segments `job` deletes.
    fn deleted_bases(job: &CommitJob) -> Vec<u64> {
        job.delete.iter().map(|(base, _)| *base).collect()
    }

    /// Settings that carry acked ids out of deleted segments.
    fn carrying() -> QueueSettings {
        QueueSettings {
            max_len: usize::MAX,
            dedup_window: std::time::Duration::from_secs(60),
            carry_dedup: true,
            ..QueueSettings::default()
        }
    }

    /// A log whose segment 0 holds `n` messages, every one acked; the
    /// round that rolled past it is committed.
    fn acked_segment(
        n: u64,
        settings: &QueueSettings,
        now: Instant,
    ) -> (Durability, NameMap<Arc<str>, Queue>, Arc<str>) {
        // Any segment size below the first round's bytes: that round rolls
        // the log, so all n messages lie in segment 0.
        let mut d = Durability::new(
            PathBuf::from("/nonexistent"),
            4096,
            None,
            Arc::new(DiskSpace::new()),
        );
        let name: Arc<str> = Arc::from("q");
        let mut q = Queue::new(name.clone(), 0);
        for seq in 0..n {
            let msg = Message::new(&format!("m{seq}"), "{}", Arc::from("s"));
            d.log(&name, seq).append_message(seq, &msg);
            q.enqueue(msg, now, settings).expect("stored");
        }
        let mut queues: NameMap<_, _> = [(name.clone(), q)].into_iter().collect();
        let (job, _) = carry_round(&mut d, &mut queues, settings, now);
        assert!(job.delete.is_empty());

        let q = queues.get_mut(&name).unwrap();
        let conn = crate::placement::ConnRef { shard: 0, id: 1 };
        let mut acked = 0;
        loop {
            let mut out = Vec::new();
            q.fetch(conn, 1000, settings, now, &mut out, &mut Vec::new());
            if out.is_empty() {
                break;
            }
            for delivery in out {
                let key = q.ack_keyed(delivery.seq, conn, now, settings);
                assert!(key.is_some());
                d.log(&name, n).append_ack(delivery.seq, unix_ms(), key);
                acked += 1;
            }
        }
        assert_eq!(acked, n);
        (d, queues, name)
    }

    /// A segment holding more acked ids than a round carries is deleted only
    /// once every one of them is carried, a round's worth at a time, so no
    /// round holds the shard for the whole segment and no id is lost; they
    /// are written (and synced) once, by the job that deletes it.
    #[test]
    fn a_segments_ids_are_carried_over_rounds_before_it_is_deleted() {
        let settings = carrying();
        let now = Instant::now();
        let n = 2 * CARRY_PER_ROUND as u64 + 10;
        let (mut d, mut queues, _) = acked_segment(n, &settings, now);
        let mut rounds = 0;
        let carried = loop {
            let (job, carried) = carry_round(&mut d, &mut queues, &settings, now);
            rounds += 1;
            if !job.delete.is_empty() {
                assert_eq!(
                    job.delete.iter().map(|(base, _)| *base).collect::<Vec<_>>(),
                    [0]
                );
                break carried;
            }
            assert_eq!(
                carried, 0,
                "ids written in round {rounds}, before the deletion"
            );
            assert!(rounds <= n as usize, "the segment is never deleted");
        };
        assert_eq!(
            carried as u64, n,
            "every acked id written with the job that deletes its segment"
        );
        assert_eq!(rounds as u64, n.div_ceil(CARRY_PER_ROUND as u64));
    }

    /// When the job that carries a segment's acked ids fails, the segment
    /// is not deleted with it (a crash would then forget ids inside the
    /// window): later jobs write the ids again, however many of them fail,
    /// and the segment goes with the first whose carry is durable. Found by
    /// the simulation (seed 2906).
    #[test]
    fn a_failed_carry_keeps_its_segments_until_a_carry_is_written() {
        let settings = carrying();
        let now = Instant::now();
        // Enough for the first round to roll past segment 0.
        let n = 200;
        let (mut d, mut queues, _) = acked_segment(n, &settings, now);
        let failed = first_deleting_job(&mut d, &mut queues, &settings, now);
        assert_eq!(failed.delete.len(), 1, "segment 0 is due");
        assert!(failed.dedup_write.is_some(), "with its ids");
        assert!(
            failed.delete_after_carry,
            "its deletion waits for the carry"
        );
        d.job_written(&failed, false);
        assert!(!d.job_done(&failed, JobIo::Failed));
        assert!(!failed.deletes_segments(false, JobIo::Failed), "kept");

        // Failing again and again does not wear the rule out.
        for _ in 0..3 {
            let (job, carried) = take_carry(&mut d, &mut queues, &settings, now);
            assert_eq!(deleted_bases(&job), [0], "taken again by the next job");
            assert_eq!(carried as u64, n, "which writes every id again first");
            assert!(job.delete_after_carry, "and waits for its carry again");
            d.job_written(&job, false);
            assert!(!d.job_done(&job, JobIo::Failed));
            assert!(!job.deletes_segments(false, JobIo::Failed), "kept");
        }

        let (job, carried) = carry_round(&mut d, &mut queues, &settings, now);
        assert_eq!(deleted_bases(&job), [0], "deleted once a carry is durable");
        assert_eq!(carried as u64, n);
        assert!(job.deletes_segments(true, JobIo::Done));
        let mut jobs = Vec::new();
        d.take_jobs(&mut queues, &settings, now, unix_ms(), &mut jobs);
        assert!(jobs.iter().all(|j| j.delete.is_empty()), "and only once");
    }

    /// A carry that failed for lack of space does not hold its segments:
    /// deleting fully acked segments is what frees space. The ids still go
    /// out with the next job.
    #[test]
    fn a_carry_failed_for_lack_of_space_lets_its_segments_go() {
        let settings = carrying();
        let now = Instant::now();
        let n = 200;
        let (mut d, mut queues, _) = acked_segment(n, &settings, now);
        let full = first_deleting_job(&mut d, &mut queues, &settings, now);
        assert!(full.delete_after_carry);
        d.job_written(&full, false);
        assert!(!d.job_done(&full, JobIo::OutOfSpace));
        assert!(
            full.deletes_segments(false, JobIo::OutOfSpace),
            "the committer deletes them"
        );

        let (next, carried) = carry_round(&mut d, &mut queues, &settings, now);
        assert!(next.delete.is_empty(), "the log did not keep them");
        assert_eq!(carried as u64, n, "their ids are written all the same");
    }

    /// Finishes jobs until one deletes a segment, and returns that one.
    fn first_deleting_job(
        d: &mut Durability,
        queues: &mut NameMap<Arc<str>, Queue>,
        settings: &QueueSettings,
        now: Instant,
    ) -> CommitJob {
        loop {
            let mut jobs = Vec::new();
            d.take_jobs(queues, settings, now, unix_ms(), &mut jobs);
            let job = jobs.pop().expect("a job");
            if !job.delete.is_empty() {
                return job;
            }
            d.job_written(&job, true);
            assert!(d.job_done(&job, JobIo::Done));
        }
    }

    /// A round is due for the idle committer only once an append woke it
    /// and it has waited as long as the rule asks; taking it ends that.
    #[test]
    fn a_round_is_due_once_it_waited_for_the_woken_committer() {
        let (mut d, queue) = one_segment_log();
        let mut seq = 0;
        let waker = std::task::Waker::noop();

        // No committer waiting: appends make no round due.
        append(&mut d, &queue, &mut seq, 10);
        assert!(!d.round_due());
        commit(&mut d);

        // Woken by an append after a round that took no time: due at once.
        d.register_committer(waker);
        append(&mut d, &queue, &mut seq, 1);
        assert!(d.round_due());
        commit(&mut d);
        assert!(!d.round_due(), "a taken round is no longer due");

        // After a round that took an hour, a new one waits its turn.
        d.round_written(Duration::from_secs(3600));
        d.register_committer(waker);
        append(&mut d, &queue, &mut seq, 100);
        assert!(!d.round_due());
    }

    /// A written round's buffer carries the next round's bytes, so their
    /// pages are not mapped and zeroed again; after a quiet second the
    /// shard keeps no buffer.
    #[test]
    fn a_written_buffer_carries_a_later_round() {
        let (mut d, queue) = one_segment_log();
        let mut seq = 0;
        // The first round has no size to go by; the second is sized for it.
        append(&mut d, &queue, &mut seq, 1000);
        let first = commit(&mut d);
        append(&mut d, &queue, &mut seq, 1000);
        let written = commit(&mut d);
        assert_eq!(
            d.buffers.bytes(),
            first + written,
            "written buffers are kept"
        );
        append(&mut d, &queue, &mut seq, 1);
        assert_eq!(d.buffers.bytes(), first, "the next round took one");
        append(&mut d, &queue, &mut seq, 999);
        assert_eq!(commit(&mut d), written, "and filled it without growing it");

        d.housekeeping(120_000, unix_ms());
        assert_eq!(
            d.buffers.bytes(),
            first + written,
            "in use since the last housekeeping"
        );
        d.housekeeping(120_000, unix_ms());
        assert_eq!(d.buffers.bytes(), 0, "kept through a quiet second");
    }
}
