//! The committer and the backlog reader, run synchronously over
//! [`SimDisk`], with faults where the seed puts them.
//!
//! A job's storage calls, and their order, are the ones the broker's
//! committer makes (`CommitJob::prepare_calls`, `write_calls`,
//! `finish_calls`: one list in the shard crate that both run): make the
//! directory, cut back what a failed job left, create the file with its
//! header, write the carried dedup ids and sync them, write the records
//! and sync them when anyone waits, then sync the directory of a file whose
//! name may not be durable. Around them this side does what the broker's
//! (`broker/src/storage/committer.rs`, `backlog_reader.rs`) do: report the
//! write, report the commit, delete what the job frees. Rounds are
//! pipelined two deep as there: a round is written before the previous
//! one's directory syncs and answers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ciphermq_shard::backlog::ReadJob;
use ciphermq_shard::log::segment::FILE_HEADER;
use ciphermq_shard::log::{Payload, StorageCall};
use ciphermq_shard::{CommitJob, JobIo, QueueRemoval, Shard};

use crate::disk::SimDisk;
use crate::rng::Rng;

/// How often each storage call fails, per thousand (0: never).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// A write, a sync, a create or a cut fails.
    pub io_per_mille: u64,
    /// A backlog read fails.
    pub read_per_mille: u64,
    /// Of the jobs whose I/O failed, those that failed for lack of space
    /// (`ENOSPC`): their fully acked segments go even if their dedup ids
    /// were not carried (`CommitJob::deletes_segments`).
    pub space_per_mille: u64,
}

impl Faults {
    /// No storage call fails.
    pub const NONE: Faults = Faults {
        io_per_mille: 0,
        read_per_mille: 0,
        space_per_mille: 0,
    };
}

/// A round written and not yet finished.
#[derive(Debug)]
pub struct WrittenRound {
    jobs: Vec<CommitJob>,
    written: Vec<JobIo>,
}

/// One shard's committer: at most one written round waits for its finish.
#[derive(Debug, Default)]
pub struct Committer {
    written: Option<WrittenRound>,
    removals: u64,
    /// Queues whose acked segments went without their dedup ids carried,
    /// for lack of space, since [`Committer::take_forgotten`] was last
    /// called.
    forgotten: Vec<Arc<str>>,
}

/// Fails a storage call `faults.io_per_mille` times in a thousand.
fn fault(rng: &mut Rng, faults: Faults, what: &str) -> std::io::Result<()> {
    if rng.chance(faults.io_per_mille) {
        return Err(std::io::Error::other(format!("simulated {what} failure")));
    }
    Ok(())
}

impl Committer {
    /// The queues that lost acked dedup ids for lack of space since the
    /// last call: ids acked there until now may be stored again when
    /// published again, as the contract allows when the disk is full.
    pub fn take_forgotten(&mut self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.forgotten)
    }

    /// Whether a call to [`Committer::step`] would do anything.
    pub fn has_work(&self, shard: &Shard) -> bool {
        self.written.is_some() || shard.has_commit_work()
    }

    /// One move of the committer: finish the written round, or take,
    /// write and (pipelined) keep the next. Returns a line saying what it
    /// did, for the trace.
    pub fn step(
        &mut self,
        shard: &mut Shard,
        disk: &mut SimDisk,
        rng: &mut Rng,
        faults: Faults,
    ) -> Option<String> {
        if !shard.has_commit_work() || (self.written.is_some() && rng.chance(400)) {
            let round = self.written.take()?;
            let n = round.jobs.len();
            finish(round, shard, disk, rng, faults, &mut self.forgotten);
            return Some(format!("finished a round of {n} jobs"));
        }
        let mut jobs = Vec::new();
        let mut removals = Vec::new();
        shard.take_commit_jobs(&mut jobs);
        shard.take_removals(&mut removals);
        if !removals.is_empty() {
            if let Some(previous) = self.written.take() {
                finish(previous, shard, disk, rng, faults, &mut self.forgotten);
            }
            for removal in removals {
                self.remove_dir(removal, shard, disk, rng, faults);
            }
        }
        let n = jobs.len();
        let round = write_round(jobs, shard, disk, rng, faults);
        if let Some(previous) = self.written.take() {
            finish(previous, shard, disk, rng, faults, &mut self.forgotten);
        }
        self.written = Some(round);
        Some(format!("wrote a round of {n} jobs"))
    }

    /// Moves a deleted queue's directory aside durably, then frees it; a
    /// moving owner's queue goes whole to where its move keeps it
    /// (`QueueRemoval::keep`), and stays.
    fn remove_dir(
        &mut self,
        removal: QueueRemoval,
        shard: &mut Shard,
        disk: &mut SimDisk,
        rng: &mut Rng,
        faults: Faults,
    ) {
        self.removals += 1;
        let aside = removal.keep.clone().unwrap_or_else(|| {
            ciphermq_shard::durability::deleted_dir(&removal.dir, self.removals)
        });
        let result = (|| -> std::io::Result<Option<PathBuf>> {
            fault(rng, faults, "rename")?;
            match disk.rename_dir(&removal.dir, &aside) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            }
            fault(rng, faults, "directory sync")?;
            if let Some(parent) = removal.dir.parent() {
                disk.sync_dir(parent);
            }
            if removal.keep.is_some() {
                if let Some(parent) = aside.parent() {
                    disk.sync_dir(parent);
                }
                return Ok(None);
            }
            Ok(Some(aside))
        })();
        let result = match result {
            Ok(aside) => {
                if let Some(aside) = aside {
                    disk.remove_dir(&aside);
                }
                Ok(())
            }
            Err(e) => Err(format!("{}: {e}", removal.dir.display())),
        };
        shard.removal_done(&removal.queue);
        removal.done.resolve(result);
    }
}

/// Writes every job of a round and reports each write to the shard: each
/// job's prepare calls, jobs one after another, then their write calls
/// (`CommitJob::prepare_calls`, `write_calls`), as the broker makes them.
fn write_round(
    mut jobs: Vec<CommitJob>,
    shard: &mut Shard,
    disk: &mut SimDisk,
    rng: &mut Rng,
    faults: Faults,
) -> WrittenRound {
    let mut written = Vec::with_capacity(jobs.len());
    for job in &mut jobs {
        let bytes = std::mem::take(&mut job.bytes);
        let ok = job
            .prepare_calls()
            .chain(job.write_calls(bytes.len()))
            .try_for_each(|call| run_call(call, job, &bytes, disk, rng, faults))
            .is_ok();
        written.push(if ok {
            JobIo::Done
        } else if rng.chance(faults.space_per_mille) {
            JobIo::OutOfSpace
        } else {
            JobIo::Failed
        });
        shard.recycle_commit_buffer(bytes);
    }
    for (job, io) in jobs.iter().zip(&written) {
        shard.commit_written(job, io.is_done());
    }
    WrittenRound { jobs, written }
}

/// Makes one storage call of `job` on the simulated disk, failing it where
/// the seed says; `records` are the job's bytes.
fn run_call(
    call: StorageCall<'_>,
    job: &CommitJob,
    records: &[u8],
    disk: &mut SimDisk,
    rng: &mut Rng,
    faults: Faults,
) -> std::io::Result<()> {
    match call {
        StorageCall::MakeDir { dir, .. } => {
            fault(rng, faults, "mkdir")?;
            // Durable at once: the broker syncs the parent (see the
            // simplifications in `disk`).
            disk.create_dir(dir)
        }
        StorageCall::Cut { path, len } => {
            fault(rng, faults, "cut")?;
            disk.cut(path, len, &FILE_HEADER)
        }
        StorageCall::SyncDir(dir) => {
            fault(rng, faults, "directory sync")?;
            disk.sync_dir(dir);
            Ok(())
        }
        StorageCall::Open { path, create: true } => {
            fault(rng, faults, "create")?;
            create(disk, path)
        }
        StorageCall::Open {
            path,
            create: false,
        } => disk.open(path),
        StorageCall::Write {
            path,
            offset,
            payload,
            sync,
        } => {
            let bytes = match (payload, &job.dedup_write) {
                (Payload::Records, _) => records,
                (Payload::DedupIds, Some(w)) => &w.bytes[..],
                (Payload::DedupIds, None) => {
                    return Err(std::io::Error::other("carried ids written without any"))
                }
            };
            write_bytes(disk, path, offset, bytes, rng, faults)?;
            if sync {
                disk.sync(path, rng.chance(faults.io_per_mille))?;
            }
            Ok(())
        }
    }
}

/// Creates a log or dedup file with its header; one found in the way is
/// moved aside, never written over (as the broker does).
fn create(disk: &mut SimDisk, path: &Path) -> std::io::Result<()> {
    match disk.create(path, &FILE_HEADER) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mut aside = path.as_os_str().to_owned();
            aside.push(".displaced");
            std::fs::rename(path, &aside)?;
            disk.create(path, &FILE_HEADER)
        }
        other => other,
    }
}

/// A write that may fail part way, leaving a prefix of `bytes` behind.
fn write_bytes(
    disk: &mut SimDisk,
    path: &Path,
    offset: u64,
    bytes: &[u8],
    rng: &mut Rng,
    faults: Faults,
) -> std::io::Result<()> {
    if rng.chance(faults.io_per_mille) {
        let part = rng.below(bytes.len() as u64 + 1) as usize;
        let _ = disk.write(path, offset, &bytes[..part]);
        return Err(std::io::Error::other("simulated write failure"));
    }
    disk.write(path, offset, bytes)
}

/// Syncs the directories of new files, reports every job's commit, and
/// deletes what the jobs free; notes in `forgotten` the queues whose acked
/// segments went without a durable carry of their dedup ids.
fn finish(
    round: WrittenRound,
    shard: &mut Shard,
    disk: &mut SimDisk,
    rng: &mut Rng,
    faults: Faults,
    forgotten: &mut Vec<Arc<str>>,
) {
    let WrittenRound { jobs, written } = round;
    for (job, mut io) in jobs.into_iter().zip(written) {
        if io.is_done()
            && job
                .finish_calls()
                .try_for_each(|call| run_call(call, &job, &[], disk, rng, faults))
                .is_err()
        {
            io = JobIo::Failed;
        }
        let durable = shard.commit_done(&job, io);
        match io {
            JobIo::Done if durable => shard.note_storage(&job.queue, None),
            JobIo::Done => {}
            JobIo::Failed => shard.note_storage(&job.queue, Some("simulated I/O failure")),
            JobIo::OutOfSpace => shard.note_storage(&job.queue, Some("simulated full disk")),
        }
        // What the contract allows a full disk to cost, judged apart from
        // the rule that carries it out (`CommitJob::deletes_segments`).
        if io == JobIo::OutOfSpace && !durable && job.delete_after_carry && !job.delete.is_empty() {
            forgotten.push(job.queue.clone());
        }
        if job.deletes_segments(durable, io) {
            for (_, path) in &job.delete {
                disk.remove(path);
            }
        }
        for path in &job.dedup_delete {
            disk.remove(path);
        }
    }
}

/// Reads the backlog the shard asks for, failing `faults.read_per_mille`
/// reads in a thousand.
pub fn read_backlog(
    shard: &mut Shard,
    rng: &mut Rng,
    faults: Faults,
    now: std::time::Instant,
) -> usize {
    let mut jobs: Vec<ReadJob> = Vec::new();
    shard.take_read_jobs(&mut jobs);
    let n = jobs.len();
    for job in jobs {
        if rng.chance(faults.read_per_mille) {
            shard.read_done(&job, Err("simulated read failure".to_string()), now);
            continue;
        }
        match read(&job.path, job.offset, job.len) {
            Ok(data) => shard.read_done(&job, Ok(&data), now),
            Err(e) => shard.read_done(&job, Err(e.to_string()), now),
        }
    }
    n
}

/// Up to `len` bytes of `path` from `offset` (fewer at its end).
fn read(path: &Path, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}
