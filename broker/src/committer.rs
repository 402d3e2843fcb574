//! The group committer of one shard: it takes the appends of a reactor turn
//! (one job per dirty queue log), writes each at its offset with io_uring,
//! `fdatasync`s, syncs directories of new files, and only then releases the
//! `ACK`s waiting for them. The fsync cost is shared by every publish of a
//! round.
//!
//! The bytes go through io_uring; the `fdatasync` runs on the shard's
//! blocking-I/O thread (see [`fdatasync`]).
//!
//! Rounds are pipelined two deep: once a round's bytes are written, its sync
//! runs in its own task while the next round is taken and written, so the
//! device is never idle waiting for the shard and the shard never waits for
//! the device to take more. Rounds still finish in order: a round's sync
//! starts only after the previous one ended, and a job whose file failed to
//! sync in the previous round fails too (its bytes may lie after a hole).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use ciphermq_shard::log::dedup_file::DedupWrite;
use ciphermq_shard::CommitJob;
use futures_util::future::join_all;
use glommio::io::{BufferedFile, Directory, OpenOptions};
use glommio::{GlommioError, Task};

use crate::context::ShardLocal;
use crate::stats::ShardStats;

type IoResult<T> = Result<T, GlommioError<()>>;

/// An open log file: written through io_uring, synced on the shard's
/// blocking-I/O thread through a second descriptor.
struct LogFile {
    file: BufferedFile,
    sync: Arc<std::fs::File>,
}

impl LogFile {
    fn new(file: BufferedFile) -> IoResult<LogFile> {
        let sync = Arc::new(crate::sys::duplicate_file(&file)?);
        Ok(LogFile { file, sync })
    }
}

/// Open segment files of this shard's queues, shared by the write and sync
/// stages (borrowed only between awaits).
#[derive(Default)]
struct Files {
    open: HashMap<PathBuf, Rc<LogFile>>,
}

/// The file of `job`, creating its directory and the file when new.
async fn prepare(files: &RefCell<Files>, job: &CommitJob) -> IoResult<Rc<LogFile>> {
    if let Some(f) = files.borrow().open.get(&job.path) {
        return Ok(f.clone());
    }
    if job.create_dir {
        Directory::create(&job.dir).await?;
        if let Some(parent) = job.dir.parent() {
            Directory::open(parent).await?.sync().await?;
        }
    }
    let file = Rc::new(LogFile::new(open(&job.path, job.create).await?)?);
    files
        .borrow_mut()
        .open
        .insert(job.path.clone(), file.clone());
    Ok(file)
}

/// Writes a job's bytes (moved in: io_uring owns the buffer while it works),
/// after its carried dedup entries.
async fn write(
    job: &CommitJob,
    file: &LogFile,
    bytes: Vec<u8>,
    stats: &ShardStats,
) -> IoResult<()> {
    if let Some(w) = &job.dedup_write {
        write_dedup(w, &job.dir, stats).await?;
    }
    if !bytes.is_empty() {
        write_all_at(&file.file, bytes, job.offset).await?;
    }
    Ok(())
}

/// Opens a log or dedup file for writing, creating it when `create`.
async fn open(path: &Path, create: bool) -> IoResult<BufferedFile> {
    if create {
        BufferedFile::create(path).await
    } else {
        OpenOptions::new().write(true).buffered_open(path).await
    }
}

/// Writes all of `bytes` at `offset` (moved in: io_uring owns the buffer
/// while it works).
async fn write_all_at(file: &BufferedFile, bytes: Vec<u8>, offset: u64) -> IoResult<()> {
    let len = bytes.len();
    if file.write_at(bytes, offset).await? < len {
        // A short write means the device is full: the tail is not stored.
        return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "short write").into());
    }
    Ok(())
}

/// Makes a written job durable (`len`: how many bytes it wrote).
async fn sync(job: &CommitJob, file: &LogFile, len: usize, stats: &ShardStats) -> IoResult<()> {
    // Only what someone waits for needs the fsync: a job of acks and delivery
    // counts alone may be lost in a crash (the messages are then redelivered,
    // never lost), and the next fsync of the file covers it anyway.
    if (len > 0 && !job.waiters.is_empty()) || job.create {
        fdatasync(&file.sync, stats).await?;
    }
    if job.create {
        // The new file's name must survive a crash too.
        Directory::open(&job.dir).await?.sync().await?;
    }
    Ok(())
}

/// `fdatasync` on the shard's blocking-I/O thread (`server.rs` gives each
/// shard one, unbound). io_uring has no asynchronous fsync: it hands the call
/// to a kernel worker bound to the shard's own core, where it waits behind
/// the busy shard; measured here, that took about twice as long as a thread
/// free to run on any core, and the shard waits for fsyncs before it ACKs.
async fn fdatasync(file: &Arc<std::fs::File>, stats: &ShardStats) -> IoResult<()> {
    let file = file.clone();
    let started = Instant::now();
    glommio::executor()
        .spawn_blocking(move || file.sync_data())
        .await?;
    stats.fsyncs.add(1);
    stats.fsync_latency.observe(started.elapsed());
    Ok(())
}

/// Appends carried dedup entries to their file and syncs them: they must be
/// on disk before the segments they come from are deleted.
async fn write_dedup(w: &DedupWrite, dir: &Path, stats: &ShardStats) -> IoResult<()> {
    let file = open(&w.path, w.create).await?;
    write_all_at(&file, w.bytes.clone(), w.offset).await?;
    fdatasync(&Arc::new(crate::sys::duplicate_file(&file)?), stats).await?;
    file.close().await?;
    if w.create {
        Directory::open(dir).await?.sync().await?;
    }
    Ok(())
}

/// A round whose bytes are written (or failed to be), waiting for its sync.
struct WrittenRound {
    jobs: Vec<CommitJob>,
    /// Per job: its file and how many bytes went to it.
    written: Vec<IoResult<(Rc<LogFile>, usize)>>,
}

/// Runs commit rounds for one shard until the executor ends. `busy` counts
/// rounds not finished yet, so shutdown can wait for them.
pub async fn run(local: Rc<ShardLocal>, busy: Rc<Cell<usize>>) {
    let files = Rc::new(RefCell::new(Files::default()));
    let mut jobs: Vec<CommitJob> = Vec::new();
    let mut syncing: Option<Task<Vec<PathBuf>>> = None;
    loop {
        std::future::poll_fn(|cx| {
            let mut shard = local.shard.borrow_mut();
            if shard.has_commit_work() {
                Poll::Ready(())
            } else {
                shard.register_committer(cx.waker());
                Poll::Pending
            }
        })
        .await;
        busy.set(busy.get() + 1);
        local.shard.borrow_mut().take_commit_jobs(&mut jobs);
        let round = write_round(&local, &files, std::mem::take(&mut jobs)).await;
        // Depth two: this round's sync waits for the previous one, and the
        // next round is taken only once that one is done.
        let failed_before = match syncing.take() {
            Some(previous) => previous.await,
            None => Vec::new(),
        };
        syncing = Some(glommio::spawn_local(sync_round(
            local.clone(),
            files.clone(),
            round,
            failed_before,
            busy.clone(),
        )));
    }
}

/// Writes every job of a round concurrently; each log may then hand out its
/// next job.
async fn write_round(
    local: &ShardLocal,
    files: &RefCell<Files>,
    mut jobs: Vec<CommitJob>,
) -> WrittenRound {
    let mut prepared = Vec::with_capacity(jobs.len());
    for job in &jobs {
        prepared.push(prepare(files, job).await);
    }
    let payloads: Vec<Vec<u8>> = jobs
        .iter_mut()
        .map(|j| std::mem::take(&mut j.bytes))
        .collect();
    let stats = &local.stats;
    let written = join_all(jobs.iter().zip(prepared).zip(payloads).map(
        |((job, file), bytes)| async move {
            let file = file?;
            let len = bytes.len();
            write(job, &file, bytes, stats).await?;
            Ok((file, len))
        },
    ))
    .await;
    local.with_shard(|shard| {
        for (job, outcome) in jobs.iter().zip(&written) {
            shard.commit_written(job, outcome.is_ok());
        }
    });
    WrittenRound { jobs, written }
}

/// Syncs a written round, then answers its waiters and deletes what its
/// jobs free. Returns the files that failed, for the next round.
async fn sync_round(
    local: Rc<ShardLocal>,
    files: Rc<RefCell<Files>>,
    round: WrittenRound,
    failed_before: Vec<PathBuf>,
    busy: Rc<Cell<usize>>,
) -> Vec<PathBuf> {
    let WrittenRound { jobs, written } = round;
    let stats = &local.stats;
    let failed_before = &failed_before;
    let outcomes: Vec<IoResult<()>> =
        join_all(jobs.iter().zip(written).map(|(job, file)| async move {
            let (file, len) = file?;
            if failed_before.contains(&job.path) {
                return Err(std::io::Error::other(
                    "an earlier write to this segment failed to sync",
                )
                .into());
            }
            sync(job, &file, len, stats).await
        }))
        .await;
    local.with_shard(|shard| {
        for (job, outcome) in jobs.iter().zip(&outcomes) {
            if let Err(e) = outcome {
                tracing::error!(queue = %job.queue, path = %job.path.display(), error = %e, "log write failed; publishes answered NACK storage");
            }
            shard.commit_done(job, outcome.is_ok());
        }
    });
    // `/ready` reports a failing round until a later one succeeds.
    let failure = jobs.iter().zip(&outcomes).find_map(|(job, outcome)| {
        let e = outcome.as_ref().err()?;
        Some(format!("queue {}: {}: {e}", job.queue, job.path.display()))
    });
    local.stats.commit_round(failure);
    let mut failed = Vec::new();
    let mut deletions = Vec::new();
    for (job, outcome) in jobs.into_iter().zip(outcomes) {
        if outcome.is_err() {
            // Its segments stay on disk (recovery deletes them later).
            files.borrow_mut().open.remove(&job.path);
            failed.push(job.path);
        } else {
            deletions.extend(job.delete);
            deletions.extend(job.dedup_delete);
        }
    }
    for path in deletions {
        drop(files.borrow_mut().open.remove(&path));
        if let Err(e) = glommio::io::remove(&path).await {
            tracing::warn!(path = %path.display(), error = %e, "could not delete an acked segment");
        }
    }
    busy.set(busy.get() - 1);
    failed
}
