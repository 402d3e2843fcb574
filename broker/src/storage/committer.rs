//! The group committer of one shard: it takes the appends of a reactor turn
//! (one job per dirty queue log), writes each at its offset, `fdatasync`s,
//! syncs directories of new files, and only then releases the `ACK`s waiting
//! for them. The fsync cost is shared by every publish of a round.
//!
//! A job's write and its `fdatasync` run as one call on the shard's own
//! blocking-I/O thread (see [`persist`]); the committer runs in a task queue
//! of its own, sharing the shard fairly with the connections (they yield
//! when glommio asks, `connection.rs`, when a round has waited long enough
//! for the idle committer, `Durability::round_due`, and when a long burst
//! finds a commit write finished, `finished_io.rs`).
//!
//! The queue does not ask glommio for low latency (`Latency::Matters`): a
//! busy shard pays for every turn it ends early, and such a queue once let
//! the shard sleep through its completions (docs/DECISIONS.md, "The commit
//! queue does not ask glommio for low latency").
//!
//! Rounds are pipelined two deep: once a round's bytes are durable, its
//! directory syncs and answers run in their own task while the next round is
//! taken and written. Rounds still finish in order. Which jobs count as
//! failed after a failure (its successors on the same log lie past an
//! unknown end), and what the next job cuts back, is the queue log's
//! decision (`QueueLog`); this side only carries it out: files are cut back
//! before a job writes, new files are never created over existing ones, and
//! the directory is synced whenever a file may have been created.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_shard::durability::deleted_dir;
use ciphermq_shard::log::segment::{self, FILE_HEADER, FILE_HEADER_BYTES};
use ciphermq_shard::log::{unix_ms, LogBuf, LogFence, Payload, StorageCall};
use ciphermq_shard::{CommitJob, JobIo, QueueRemoval, Shard};
use futures_util::future::join_all;
use glommio::io::Directory;
use glommio::{GlommioError, Latency, Shares, Task};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::runtime::context::ShardLocal;
use crate::storage::file_deleter::{self, FileDeleter};
use crate::storage::log_file::LogFile;

type IoResult<T> = Result<T, GlommioError<()>>;

/// Starts the committer of this shard in its own task queue.
pub(crate) fn spawn(local: Rc<ShardLocal>, busy: Rc<Cell<usize>>) {
    let deleter = match FileDeleter::start(format!("shard-{}-delete", local.stats.shard)) {
        Ok(d) => Some(Rc::new(d)),
        Err(e) => {
            tracing::warn!(error = %e, "no thread for deleting acked segments; the committer deletes them itself");
            None
        }
    };
    let queue =
        glommio::executor().create_task_queue(Shares::default(), Latency::NotImportant, "commit");
    let stages = Stages {
        local: local.clone(),
        busy: busy.clone(),
        queue: Some(queue),
        deleter: deleter.clone(),
    };
    match glommio::spawn_local_into(run(stages), queue) {
        Ok(task) => {
            task.detach();
        }
        // Only an unknown queue fails, and it was just made: fall back to
        // the shard's default queue rather than run without a committer.
        Err(e) => {
            tracing::warn!(error = %e, "commit task queue unavailable; committing from the default queue");
            glommio::spawn_local(run(Stages {
                local,
                busy,
                queue: None,
                deleter,
            }))
            .detach();
        }
    }
}

/// What the committer's stages share.
#[derive(Clone)]
struct Stages {
    local: Rc<ShardLocal>,
    /// Rounds not finished yet, so shutdown can wait for them.
    busy: Rc<Cell<usize>>,
    /// The task queue every stage runs in, so the committer's share of the
    /// shard does not depend on how many connections the default queue holds.
    queue: Option<glommio::TaskQueueHandle>,
    /// Takes the files a round frees (`file_deleter.rs`).
    deleter: Option<Rc<FileDeleter>>,
}

impl Stages {
    fn spawn<T: 'static>(&self, f: impl std::future::Future<Output = T> + 'static) -> Task<T> {
        match self.queue {
            Some(q) => glommio::spawn_local_into(f, q)
                .unwrap_or_else(|_| unreachable!("the commit queue lives as long as the shard")),
            None => glommio::spawn_local(f),
        }
    }
}

/// Open segment files a shard keeps at most: every queue written to holds
/// one, and a client that declares many queues must not run the process out
/// of descriptors. Past it the least recently written file is closed (and
/// opened again when next written). Each holds two descriptors where direct
/// writes work ([`LogFile`]): 1,024 a shard.
pub(crate) const MAX_OPEN_FILES: usize = 512;

/// Open segment files of this shard's queues, shared by the write and sync
/// stages (borrowed only between awaits).
#[derive(Default)]
struct Files {
    /// Each with the round it was last used in.
    open: HashMap<PathBuf, (Arc<LogFile>, u64)>,
    /// Counts uses, for "least recently used".
    clock: u64,
}

impl Files {
    /// The open file at `path`, marked as just used.
    fn get(&mut self, path: &Path) -> Option<Arc<LogFile>> {
        self.clock += 1;
        let (file, used) = self.open.get_mut(path)?;
        *used = self.clock;
        Some(file.clone())
    }

    /// Keeps `file` open for `path`, closing the least recently used one
    /// when [`MAX_OPEN_FILES`] are open (a scan, but only when a file is
    /// opened at the cap: opening costs a system call anyway).
    fn insert(&mut self, path: PathBuf, file: Arc<LogFile>) {
        if self.open.len() >= MAX_OPEN_FILES {
            let oldest = self
                .open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(p, _)| p.clone());
            if let Some(oldest) = oldest {
                self.open.remove(&oldest);
            }
        }
        self.clock += 1;
        self.open.insert(path, (file, self.clock));
    }

    /// Forgets (closes, once no job holds it) the file at `path`.
    fn close(&mut self, path: &Path) {
        self.open.remove(path);
    }
}

/// The files a job's calls have opened so far.
#[derive(Default)]
struct JobFiles {
    /// Its segment (opened by its prepare calls).
    segment: Option<Arc<LogFile>>,
    /// Its dedup file, when it carries ids.
    dedup: Option<Arc<LogFile>>,
}

/// Runs one storage call of `job` (`CommitJob::prepare_calls`,
/// `write_calls`, `finish_calls`) on the shard's blocking-I/O thread. A
/// segment's open takes its file from `files` when open already; the
/// records' write takes the job's bytes from `records` and puts them back,
/// for the shard to fill again.
async fn run_call(
    call: StorageCall<'_>,
    job: &CommitJob,
    files: &RefCell<Files>,
    opened: &mut JobFiles,
    records: &mut Option<LogBuf>,
    local: &ShardLocal,
) -> IoResult<()> {
    match call {
        StorageCall::MakeDir {
            dir,
            last_level_only,
        } => {
            let dir = dir.to_path_buf();
            blocking(move || {
                // 0700 whatever the umask, as every directory of the data
                // directory.
                if last_level_only {
                    make_last_level(&dir)?;
                } else {
                    ciphermq_datadir::create_dir_all(&dir)?;
                }
                sync_parent(&dir)
            })
            .await
        }
        StorageCall::Cut { path, len } => {
            files.borrow_mut().close(path);
            let path = path.to_path_buf();
            blocking(move || cut(&path, len)).await
        }
        StorageCall::SyncDir(dir) => {
            let dir = dir.to_path_buf();
            blocking(move || sync_dir(&dir)).await
        }
        StorageCall::Open { path, create } if path == job.path => {
            let cached = files.borrow_mut().get(path);
            let file = match cached {
                Some(file) => file,
                None => {
                    let file = open(path, create).await?;
                    files.borrow_mut().insert(path.to_path_buf(), file.clone());
                    file
                }
            };
            opened.segment = Some(file);
            Ok(())
        }
        StorageCall::Open { path, create } => {
            opened.dedup = Some(open(path, create).await?);
            Ok(())
        }
        StorageCall::Write {
            path,
            offset,
            payload: Payload::DedupIds,
            sync,
        } => {
            let (Some(file), Some(w)) = (&opened.dedup, &job.dedup_write) else {
                return Err(out_of_order(
                    path,
                    "carried ids written before their file's open",
                ));
            };
            // The bytes are shared with the write, not copied: they are
            // megabytes when a segment's deletion carried its ids.
            persist(file, SharedBytes(w.bytes.clone()), offset, sync, local).await?;
            Ok(())
        }
        StorageCall::Write {
            path,
            offset,
            payload: Payload::Records,
            sync,
        } => {
            let (Some(file), Some(bytes)) = (&opened.segment, records.take()) else {
                return Err(out_of_order(
                    path,
                    "records written before their file's open, or twice",
                ));
            };
            *records = Some(persist(file, bytes, offset, sync, local).await?);
            Ok(())
        }
    }
}

/// A job's calls out of the order `CommitJob`'s lists give: a bug, failed
/// as a job (its publishes answered `NACK storage`), not a panic.
fn out_of_order(path: &Path, what: &str) -> GlommioError<()> {
    GlommioError::IoError(std::io::Error::other(format!("{}: {what}", path.display())))
}

/// The segment file of `job`, after its prepare calls: its directory made,
/// what failed jobs left cut back, the file opened or created.
async fn prepare(
    files: &RefCell<Files>,
    job: &CommitJob,
    local: &ShardLocal,
) -> IoResult<Arc<LogFile>> {
    let mut opened = JobFiles::default();
    let mut no_records = None;
    for call in job.prepare_calls() {
        run_call(call, job, files, &mut opened, &mut no_records, local).await?;
    }
    opened
        .segment
        .ok_or_else(|| out_of_order(&job.path, "prepared without its file's open"))
}

/// Runs `f` on the shard's blocking-I/O thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> IoResult<T> {
    Ok(glommio::executor().spawn_blocking(f).await?)
}

/// Makes the log file at `path` hold exactly its first `len` bytes, creating
/// it if a failed job never did; a file cut to its header gets the header
/// again. The bytes past `len` are a failed job's: never acknowledged.
fn cut(path: &Path, len: u64) -> std::io::Result<()> {
    let file = segment::open_options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.set_len(len)?;
    if len == FILE_HEADER_BYTES {
        file.write_all_at(&FILE_HEADER, 0)?;
    }
    file.sync_data()
}

/// Makes `dir` (0700) inside a parent that must already exist.
fn make_last_level(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn sync_parent(dir: &Path) -> std::io::Result<()> {
    match dir.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Runs a job's write calls on `file`, its segment: its carried dedup ids
/// written and synced, then its records, synced when anyone waits. Gives
/// `bytes` back, for the shard to fill again.
async fn write(
    job: &CommitJob,
    files: &RefCell<Files>,
    file: Arc<LogFile>,
    bytes: LogBuf,
    local: &ShardLocal,
) -> IoResult<(Arc<LogFile>, LogBuf)> {
    let mut opened = JobFiles {
        segment: Some(file),
        dedup: None,
    };
    let len = bytes.len();
    let mut records = Some(bytes);
    for call in job.write_calls(len) {
        run_call(call, job, files, &mut opened, &mut records, local).await?;
    }
    let file = opened
        .segment
        .ok_or_else(|| out_of_order(&job.path, "written without its file"))?;
    Ok((file, records.unwrap_or_default()))
}

/// Opens a log or dedup file for writing, on the shard's blocking-I/O
/// thread. With `create` the file is new: it gets the file header, and it
/// is never created over an existing file. One found there (left by
/// something else: the broker names every file it makes) is moved aside to
/// `{name}.displaced-{unix ms}` and logged, never truncated. Never through
/// a symbolic link, and new files are 0600 whatever the umask
/// ([`segment::open_options`]).
async fn open(path: &Path, create: bool) -> IoResult<Arc<LogFile>> {
    let path = path.to_path_buf();
    let file = blocking(move || {
        if !create {
            let file = segment::open_options().write(true).open(&path)?;
            return Ok(LogFile::new(file, &path));
        }
        let new = || {
            segment::open_options()
                .write(true)
                .create_new(true)
                .open(&path)
        };
        let file = match new() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut aside = path.clone().into_os_string();
                aside.push(format!(".displaced-{}", unix_ms()));
                std::fs::rename(&path, &aside)?;
                tracing::error!(path = %path.display(), moved_to = %std::path::Path::new(&aside).display(), "a log file the broker was about to create already existed; moved it aside instead of overwriting it");
                new()?
            }
            other => other?,
        };
        file.write_all_at(&FILE_HEADER, 0)?;
        Ok(LogFile::new(file, &path))
    })
    .await?;
    Ok(Arc::new(file))
}

/// Writes all of `bytes` at `offset` and, when `sync`, `fdatasync`s the
/// file, as one call on the shard's blocking-I/O thread (`server.rs` gives
/// each shard one, unbound); the shard awaits it without blocking, and a
/// busy connection may hand its end over early
/// ([`crate::storage::finished_io::FinishedIo`]). Gives
/// `bytes` back, for the shard to fill again (`log::buffer_pool`).
///
/// Not through io_uring: there both steps went to a kernel worker bound to
/// the shard's own core and waited for the busy shard to leave it
/// (docs/DECISIONS.md, "Commits stay on the blocking-I/O thread").
async fn persist<B: AsRef<[u8]> + Send + 'static>(
    file: &Arc<LogFile>,
    bytes: B,
    offset: u64,
    sync: bool,
    local: &ShardLocal,
) -> IoResult<B> {
    if bytes.as_ref().is_empty() && !sync {
        return Ok(bytes);
    }
    let file = file.clone();
    let handed = Instant::now();
    let (bytes, taken_up, synced) = local
        .finished_io
        .run(move || -> std::io::Result<(B, Duration, Option<Synced>)> {
            let taken_up = handed.elapsed();
            file.write_all_at(bytes.as_ref(), offset)?;
            if !sync {
                return Ok((bytes, taken_up, None));
            }
            let started = Instant::now();
            file.sync_data()?;
            let done = Instant::now();
            Ok((
                bytes,
                taken_up,
                Some(Synced {
                    took: done - started,
                    done,
                }),
            ))
        })
        .await?;
    let stats = &local.stats;
    stats.commit_handoff_latency.observe(taken_up);
    if let Some(synced) = synced {
        stats.fsyncs.add(1);
        stats.fsync_latency.observe(synced.took);
        stats.commit_wake_latency.observe(synced.done.elapsed());
    }
    Ok(bytes)
}

/// One `fdatasync` as the blocking-I/O thread saw it.
struct Synced {
    /// Its duration.
    took: Duration,
    /// When it returned, for how long the shard took to notice.
    done: Instant,
}

/// Bytes the job keeps and the write reads.
struct SharedBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A round whose bytes are durable (or failed to be), waiting for its
/// directory syncs and answers.
struct WrittenRound {
    /// When the round was taken.
    taken: Instant,
    jobs: Vec<CommitJob>,
    /// Per job: its file, its bytes written (and synced when awaited).
    written: Vec<IoResult<Arc<LogFile>>>,
}

/// Runs commit rounds for one shard until the executor ends (started by
/// [`spawn`]).
async fn run(stages: Stages) {
    let local = stages.local.clone();
    let busy = stages.busy.clone();
    let files = Rc::new(RefCell::new(Files::default()));
    let mut jobs: Vec<CommitJob> = Vec::new();
    let mut syncing: Option<Task<()>> = None;
    loop {
        local
            .work_for(Shard::has_commit_work, Shard::register_committer)
            .await;
        busy.set(busy.get() + 1);
        let taken = Instant::now();
        let mut removals = Vec::new();
        {
            // One borrow: a queue deleted before these jobs were taken has
            // none among them.
            let mut shard = local.shard.borrow_mut();
            shard.take_commit_jobs(&mut jobs);
            shard.take_removals(&mut removals);
        }
        if !removals.is_empty() {
            // Every job of a deleted queue's log was taken in an earlier
            // round: once that round is finished nothing writes there.
            if let Some(previous) = syncing.take() {
                previous.await;
            }
            remove_queue_dirs(&stages, &files, removals).await;
        }
        let round = write_round(&local, &files, std::mem::take(&mut jobs), taken).await;
        local
            .shard
            .borrow_mut()
            .commit_round_written(taken.elapsed());
        // Depth two: this round is finished after the previous one, and the
        // next round is taken only once that one is done.
        if let Some(previous) = syncing.take() {
            previous.await;
        }
        syncing = Some(stages.spawn(sync_round(stages.clone(), files.clone(), round)));
        if local.finished_io.take_looked() {
            // Noticed in the middle of a connection's burst: let the answers
            // out and the burst go on before the next round is taken, so
            // that round grows with the load as it would have (without
            // this, rounds shrink and their fixed cost takes the CPU a
            // loaded shard lacks).
            glommio::executor().yield_task_queue_now().await;
        }
    }
}

/// Moves deleted queues' log directories away (see [`QueueRemoval`]): each
/// is renamed to a name recovery removes and never reads, `queues/` is
/// synced, and only then is the deletion answered; the renamed directory is
/// freed afterwards, off the shard. A directory that was never made (a
/// queue that stored nothing) needs nothing.
async fn remove_queue_dirs(stages: &Stages, files: &RefCell<Files>, removals: Vec<QueueRemoval>) {
    for removal in removals {
        files
            .borrow_mut()
            .open
            .retain(|path, _| !path.starts_with(&removal.dir));
        let dir = removal.dir.clone();
        let keep = removal.keep.clone();
        let moved = blocking(move || {
            // A moving owner's queue goes whole to where its move keeps it;
            // a deleted one's aside, to be freed.
            let aside = keep
                .clone()
                .unwrap_or_else(|| deleted_dir(&dir, next_removal()));
            match std::fs::rename(&dir, &aside) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            }
            sync_parent(&dir)?;
            if keep.is_some() {
                sync_parent(&aside)?;
                return Ok(None);
            }
            Ok(Some(aside))
        })
        .await;
        let result = match moved {
            Ok(aside) => {
                if let Some(aside) = aside {
                    free_dir(stages, aside).await;
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(queue = %removal.queue, dir = %removal.dir.display(), error = %e, "deleted queue's log directory not moved away; the next start removes it");
                Err(format!("{}: {e}", removal.dir.display()))
            }
        };
        stages
            .local
            .with_shard(|shard| shard.removal_done(&removal.queue));
        removal.done.resolve(result);
    }
}

/// A number for each removal of this process, so two removals of one name
/// within a millisecond get two names.
fn next_removal() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Frees a deleted queue's renamed directory: its files go to the deleter
/// thread one by one (they may be large), the directory itself after them
/// on the blocking-I/O thread. Whatever is left (a crash, an error) is
/// removed by the next start.
async fn free_dir(stages: &Stages, dir: PathBuf) {
    let listed = {
        let dir = dir.clone();
        blocking(move || {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(&dir)? {
                files.push(entry?.path());
            }
            Ok(files)
        })
        .await
    };
    let mut inline = Vec::new();
    if let (Ok(paths), Some(deleter)) = (&listed, &stages.deleter) {
        for path in paths {
            if let Err(path) = deleter.delete(path.clone()) {
                inline.push(path);
            }
        }
        // The deleter takes the files in order; the directory goes once it
        // is empty, on the deleter too.
        if deleter.delete_dir(dir.clone()).is_ok() {
            if !inline.is_empty() {
                let _ = blocking(move || {
                    inline.iter().for_each(|p| file_deleter::remove(p));
                    Ok(())
                })
                .await;
            }
            return;
        }
    }
    let _ = blocking(move || {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not free a deleted queue's log directory; the next start removes it");
        }
        Ok(())
    })
    .await;
}

/// Writes every job of a round concurrently; each log may then hand out its
/// next job.
async fn write_round(
    local: &ShardLocal,
    files: &RefCell<Files>,
    mut jobs: Vec<CommitJob>,
    taken: Instant,
) -> WrittenRound {
    let mut prepared = Vec::with_capacity(jobs.len());
    for job in &jobs {
        prepared.push(prepare(files, job, local).await);
    }
    let payloads: Vec<LogBuf> = jobs
        .iter_mut()
        .map(|j| std::mem::take(&mut j.bytes))
        .collect();
    let outcomes = join_all(
        jobs.iter()
            .zip(prepared)
            .zip(payloads)
            .map(
                |((job, file), bytes)| async move { write(job, files, file?, bytes, local).await },
            ),
    )
    .await;
    let mut spent = Vec::with_capacity(outcomes.len());
    let written: Vec<IoResult<Arc<LogFile>>> = outcomes
        .into_iter()
        .map(|outcome| {
            outcome.map(|(file, bytes)| {
                spent.push(bytes);
                file
            })
        })
        .collect();
    local.with_shard(|shard| {
        for (job, outcome) in jobs.iter().zip(&written) {
            shard.commit_written(job, outcome.is_ok());
        }
        for bytes in spent {
            shard.recycle_commit_buffer(bytes);
        }
    });
    WrittenRound {
        taken,
        jobs,
        written,
    }
}

/// What the log must know of a job's I/O: a failure for lack of space frees
/// the segments its carry was holding (`CommitJob::deletes_segments`).
fn job_io(outcome: &IoResult<()>) -> JobIo {
    match outcome {
        Ok(()) => JobIo::Done,
        Err(e) if os_error(e).is_some_and(|code| matches!(code, libc::ENOSPC | libc::EDQUOT)) => {
            JobIo::OutOfSpace
        }
        Err(_) => JobIo::Failed,
    }
}

/// The OS error number under a glommio error, if it carries one.
fn os_error(e: &GlommioError<()>) -> Option<i32> {
    match e {
        GlommioError::IoError(e) => e.raw_os_error(),
        GlommioError::EnhancedIoError { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// Whether a failed write says the device is failing for every queue on
/// it (full, over quota, read-only, or failing I/O), rather than one
/// queue's own file or name.
fn is_device_failure(e: &GlommioError<()>) -> bool {
    matches!(
        os_error(e),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EIO) | None
    )
}

/// After the round's bytes are durable and before anything is answered:
/// every job on shared storage that someone waits for fails unless its
/// fence still holds (this node's lease, and its owner's directory not
/// taken over; see `cluster/shared_logs.rs`). Each distinct fence is
/// checked once, in one call off the shard; a round with no such job (on a
/// node with local storage, every round) costs nothing more.
async fn check_fences(jobs: &[CommitJob], mut io: Vec<IoResult<()>>) -> Vec<IoResult<()>> {
    let mut fences: Vec<Arc<dyn LogFence>> = Vec::new();
    for (job, outcome) in jobs.iter().zip(&io) {
        if let (Some(fence), Ok(())) = (&job.fence, outcome) {
            if !job.waiters.is_empty() && !fences.iter().any(|f| Arc::ptr_eq(f, fence)) {
                fences.push(fence.clone());
            }
        }
    }
    if fences.is_empty() {
        return io;
    }
    let checked = fences.clone();
    let held = blocking(move || Ok(checked.iter().map(|f| f.holds()).collect::<Vec<bool>>()))
        .await
        .unwrap_or_else(|_| vec![false; fences.len()]);
    for (job, outcome) in jobs.iter().zip(io.iter_mut()) {
        let Some(fence) = &job.fence else { continue };
        if job.waiters.is_empty() || outcome.is_err() {
            continue;
        }
        let holds = fences
            .iter()
            .position(|f| Arc::ptr_eq(f, fence))
            .is_some_and(|i| held[i]);
        if !holds {
            // ESTALE: not a failing device (`/ready` stays up), this
            // node's hold on the owner's storage went stale.
            *outcome = Err(GlommioError::IoError(std::io::Error::from_raw_os_error(
                libc::ESTALE,
            )));
        }
    }
    io
}

/// Finishes a written round: syncs the directories of new files, then answers
/// its waiters and deletes what its jobs free.
async fn sync_round(stages: Stages, files: Rc<RefCell<Files>>, round: WrittenRound) {
    let local = &stages.local;
    let WrittenRound {
        taken,
        jobs,
        written,
    } = round;
    let files_ref: &RefCell<Files> = &files;
    let io: Vec<IoResult<()>> = join_all(jobs.iter().zip(written).map(|(job, file)| async move {
        file?;
        for call in job.finish_calls() {
            match call {
                // Through io_uring, beside the next round's writes on the
                // blocking-I/O thread.
                StorageCall::SyncDir(dir) => Directory::open(dir).await?.sync().await?,
                other => {
                    let mut none = None;
                    run_call(
                        other,
                        job,
                        files_ref,
                        &mut JobFiles::default(),
                        &mut none,
                        local,
                    )
                    .await?
                }
            }
        }
        Ok(())
    }))
    .await;
    let io = check_fences(&jobs, io).await;
    // The log decides what counts as durable: a job written after a failed
    // one of its queue fails too, whatever its own I/O said. Each queue's
    // failure is its own (`/api/queues`), until a write of it succeeds.
    let outcomes: Vec<JobIo> = io.iter().map(job_io).collect();
    let durable: Vec<bool> = local.with_shard(|shard| {
        jobs.iter()
            .zip(&io)
            .zip(&outcomes)
            .map(|((job, outcome), &job_io)| {
                let durable = shard.commit_done(job, job_io);
                match outcome {
                    Err(e) => {
                        tracing::error!(queue = %job.queue, path = %job.path.display(), error = %e, "log write failed; publishes answered NACK storage, the file is cut back and written again");
                        let why = format!("{}: {e}", job.path.display());
                        shard.note_storage(&job.queue, Some(&why));
                    }
                    Ok(()) if durable => shard.note_storage(&job.queue, None),
                    Ok(()) => {}
                }
                durable
            })
            .collect()
    });
    // `/ready` reports a failing device (full, read-only, failing I/O)
    // until a later round succeeds; one queue's own trouble (a name, a
    // permission) is that queue's, reported for it alone.
    let failure = jobs.iter().zip(&io).find_map(|(job, outcome)| {
        let e = outcome.as_ref().err()?;
        let msg = format!("queue {}: {}: {e}", job.queue, job.path.display());
        Some((msg, is_device_failure(e)))
    });
    local.stats.commit_round(failure);
    if !jobs.is_empty() {
        local.stats.commit_round_latency.observe(taken.elapsed());
    }
    // Fully acked segments go whatever the write did when no carry of their
    // ids waits, or when space ran out (deleting them is what frees it;
    // QueueLog::give_back says why it is safe).
    let mut deletions = Vec::new();
    for ((job, durable), job_io) in jobs.into_iter().zip(durable).zip(outcomes) {
        if !durable {
            // Reopened (and cut back) by the next job.
            files.borrow_mut().close(&job.path);
        }
        // Segments whose acked ids this job was to carry wait for a later
        // job when it failed other than for space (the log kept them): see
        // `CommitJob::delete_after_carry`.
        if job.deletes_segments(durable, job_io) {
            deletions.extend(job.delete.into_iter().map(|(_, path)| path));
        }
        deletions.extend(job.dedup_delete);
    }
    // Handed to the deleter: nothing waits for a deletion.
    let mut inline = Vec::new();
    for path in deletions {
        files.borrow_mut().close(&path);
        match &stages.deleter {
            Some(deleter) => {
                if let Err(path) = deleter.delete(path) {
                    inline.push(path);
                }
            }
            None => inline.push(path),
        }
    }
    if !inline.is_empty() {
        let _ = blocking(move || {
            inline.iter().for_each(|p| file_deleter::remove(p));
            Ok(())
        })
        .await;
    }
    stages.busy.set(stages.busy.get() - 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_files_are_capped_closing_the_least_recently_used() {
        let mut files = Files::default();
        let null = || Arc::new(LogFile::buffered(File::open("/dev/null").unwrap()));
        for i in 0..MAX_OPEN_FILES {
            files.insert(PathBuf::from(format!("/q/{i}")), null());
        }
        // The first one is used again: the second is now the oldest.
        assert!(files.get(Path::new("/q/0")).is_some());
        files.insert(PathBuf::from("/q/new"), null());
        assert_eq!(files.open.len(), MAX_OPEN_FILES);
        assert!(files.get(Path::new("/q/1")).is_none(), "closed");
        assert!(files.get(Path::new("/q/0")).is_some());
        assert!(files.get(Path::new("/q/new")).is_some());
    }
}
