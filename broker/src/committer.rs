//! The group committer of one shard: it takes the appends of a reactor turn
//! (one job per dirty queue log), writes each at its offset with io_uring,
//! `fdatasync`s, syncs directories of new files, and only then releases the
//! `ACK`s waiting for them. While a round is on disk, new appends gather for
//! the next one, so the fsync cost is shared by every publish of a round.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::Poll;
use std::time::Instant;

use ciphermq_shard::log::dedup_file::DedupWrite;
use ciphermq_shard::CommitJob;
use futures_util::future::join_all;
use glommio::io::{BufferedFile, Directory, OpenOptions};

use crate::context::ShardLocal;
use crate::stats::ShardStats;

/// Open segment files of this shard's queues.
#[derive(Default)]
struct Files {
    open: HashMap<PathBuf, Rc<BufferedFile>>,
}

impl Files {
    /// The file of `job`, creating its directory and the file when new.
    async fn prepare(&mut self, job: &CommitJob) -> glommio::Result<Rc<BufferedFile>, ()> {
        if let Some(f) = self.open.get(&job.path) {
            return Ok(f.clone());
        }
        if job.create_dir {
            Directory::create(&job.dir).await?;
            if let Some(parent) = job.dir.parent() {
                Directory::open(parent).await?.sync().await?;
            }
        }
        let file = if job.create {
            BufferedFile::create(&job.path).await?
        } else {
            OpenOptions::new()
                .write(true)
                .buffered_open(&job.path)
                .await?
        };
        let file = Rc::new(file);
        self.open.insert(job.path.clone(), file.clone());
        Ok(file)
    }

    fn forget(&mut self, path: &Path) -> Option<Rc<BufferedFile>> {
        self.open.remove(path)
    }
}

/// Writes a job's bytes (moved in: io_uring owns the buffer while it works)
/// and makes them durable.
async fn write(
    file: &BufferedFile,
    job: &CommitJob,
    bytes: Vec<u8>,
    stats: &ShardStats,
) -> glommio::Result<(), ()> {
    let len = bytes.len();
    if len > 0 {
        let n = file.write_at(bytes, job.offset).await?;
        if n < len {
            // A short write means the device is full: the tail is not stored.
            return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "short write").into());
        }
    }
    // Only what someone waits for needs the fsync: a job of acks and delivery
    // counts alone may be lost in a crash (the messages are then redelivered,
    // never lost), and the next fsync of the file covers it anyway.
    if (len > 0 && !job.waiters.is_empty()) || job.create {
        let started = Instant::now();
        file.fdatasync().await?;
        stats.fsyncs.add(1);
        stats.fsync_latency.observe(started.elapsed());
    }
    if job.create {
        // The new file's name must survive a crash too.
        Directory::open(&job.dir).await?.sync().await?;
    }
    Ok(())
}

/// Appends carried dedup entries to their file and syncs them: they must be
/// on disk before the segments they come from are deleted.
async fn write_dedup(w: &DedupWrite, dir: &Path, stats: &ShardStats) -> glommio::Result<(), ()> {
    let file = if w.create {
        BufferedFile::create(&w.path).await?
    } else {
        OpenOptions::new()
            .write(true)
            .buffered_open(&w.path)
            .await?
    };
    let len = w.bytes.len();
    let n = file.write_at(w.bytes.clone(), w.offset).await?;
    if n < len {
        return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "short write").into());
    }
    let started = Instant::now();
    file.fdatasync().await?;
    stats.fsyncs.add(1);
    stats.fsync_latency.observe(started.elapsed());
    file.close().await?;
    if w.create {
        Directory::open(dir).await?.sync().await?;
    }
    Ok(())
}

/// Runs commit rounds for one shard until the executor ends. `busy` is set
/// while a round is on disk, so shutdown can wait for it.
pub async fn run(local: Rc<ShardLocal>, busy: Rc<Cell<bool>>) {
    let mut files = Files::default();
    let mut jobs: Vec<CommitJob> = Vec::new();
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
        busy.set(true);
        local.shard.borrow_mut().take_commit_jobs(&mut jobs);
        let mut prepared = Vec::with_capacity(jobs.len());
        for job in &jobs {
            prepared.push(files.prepare(job).await);
        }
        let payloads: Vec<Vec<u8>> = jobs
            .iter_mut()
            .map(|j| std::mem::take(&mut j.bytes))
            .collect();
        let stats = &local.stats;
        let outcomes = join_all(jobs.iter().zip(prepared).zip(payloads).map(
            |((job, file), bytes)| async move {
                if let Some(w) = &job.dedup_write {
                    write_dedup(w, &job.dir, stats).await?;
                }
                match file {
                    Ok(file) => write(&file, job, bytes, stats).await,
                    Err(e) => Err(e),
                }
            },
        ))
        .await;
        let mut deletions = Vec::new();
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
        for (job, outcome) in jobs.drain(..).zip(outcomes) {
            if outcome.is_err() {
                // Its segments stay on disk (recovery deletes them later).
                files.forget(&job.path);
            } else {
                deletions.extend(job.delete);
                deletions.extend(job.dedup_delete);
            }
        }
        for path in deletions {
            drop(files.forget(&path));
            if let Err(e) = glommio::io::remove(&path).await {
                tracing::warn!(path = %path.display(), error = %e, "could not delete an acked segment");
            }
        }
        busy.set(false);
    }
}
