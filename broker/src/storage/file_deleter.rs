//! Deletes the files a commit round frees (fully acked segments, dedup files
//! past the window) on a thread of their own, off the commit path.
//!
//! Unlinking a 64 MiB segment takes ext4 20-40 ms on the benchmark machine.
//! Done by the committer, that time was added to every publish waiting for
//! the next rounds: the shard's blocking-I/O thread that writes and
//! `fdatasync`s the logs was busy unlinking, and the round pipeline waited
//! for the deletion before taking the next round. Nothing waits for a
//! deletion (a crash before it leaves a fully acked file that recovery
//! deletes again), so the committer only hands the paths over.
//!
//! Even off the commit path, a plain unlink hurt every publish: ext4
//! (mounted with `discard` here) frees a file's extents, and discards them,
//! in the journal commit that the next `fdatasync` of any log waits for, so
//! the round that met a deletion took 15-50 ms (publish→ACK p99 27-57 ms at
//! 100,000 msg/s, against 10-11 ms with nothing deleted). The thread
//! therefore renames the file out of the log (`*.freeing`, which recovery
//! deletes and never reads), makes the rename durable, and shrinks it
//! [`STEP_BYTES`] at a time before unlinking it: each commit then carries at
//! most one step (p99 7-10 ms; docs/benchmarks-journal.md "Latency under load").
//!
//! File names are never reused within a run (segments are named by their
//! first sequence number, dedup files by a counter), so a deletion that
//! runs late cannot remove a newer file of the same name.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ciphermq_shard::log::segment::{self, freeing_path};

use crossbeam_channel::{Sender, TrySendError};

/// Paths waiting for the deleter at most. A 64 MiB segment per path, so the
/// queue only fills if the disk stops answering; the committer then deletes
/// inline (see [`FileDeleter::delete`]).
pub(crate) const MAX_QUEUED: usize = 4096;

/// Bytes a deletion gives back to the filesystem at a time.
pub(crate) const STEP_BYTES: u64 = 4 << 20;

/// Pause after each step, so that steps spread over several journal
/// commits. A 64 MiB segment takes 16 steps, under 0.1 s: the thread keeps
/// up with a shard writing 600 MB/s.
const STEP_PAUSE: Duration = Duration::from_millis(2);

/// What the deleter thread is handed.
#[derive(Debug)]
enum Job {
    /// A file, freed a step at a time.
    File(PathBuf),
    /// A deleted queue's directory, removed once the files handed over
    /// before it are gone (whatever is still in it goes too).
    Dir(PathBuf),
}

/// The sending side of one shard's deleter thread; the thread ends when this
/// is dropped.
#[derive(Debug)]
pub(crate) struct FileDeleter {
    tx: Sender<Job>,
}

impl FileDeleter {
    /// Starts the deleter thread `name`.
    pub(crate) fn start(name: String) -> std::io::Result<FileDeleter> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(MAX_QUEUED);
        std::thread::Builder::new()
            .name(name)
            .stack_size(256 * 1024)
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::File(path) => free(&path),
                        Job::Dir(path) => remove_dir(&path),
                    }
                }
            })?;
        Ok(FileDeleter { tx })
    }

    /// Hands `path` to the deleter thread. Returns it back when the thread
    /// is gone or [`MAX_QUEUED`] paths wait already: the caller deletes it
    /// itself then, off the shard thread.
    pub(crate) fn delete(&self, path: PathBuf) -> Result<(), PathBuf> {
        match self.tx.try_send(Job::File(path)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => Err(job.into_path()),
        }
    }

    /// Hands a deleted queue's directory to the deleter thread, to be
    /// removed after the files handed over before it. Returns it back as
    /// [`FileDeleter::delete`] does.
    pub(crate) fn delete_dir(&self, path: PathBuf) -> Result<(), PathBuf> {
        match self.tx.try_send(Job::Dir(path)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => Err(job.into_path()),
        }
    }
}

impl Job {
    fn into_path(self) -> PathBuf {
        match self {
            Job::File(path) | Job::Dir(path) => path,
        }
    }
}

/// Removes a deleted queue's directory and whatever is still in it, logging
/// a failure (the next start removes what is left).
fn remove_dir(path: &Path) {
    let result = match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => std::fs::remove_dir_all(path),
        other => other,
    };
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a deleted queue's log directory; it is removed at the next restart");
        }
    }
}

/// Deletes `path` a step at a time under its `.freeing` name (see the
/// module doc); if it cannot be renamed or the rename made durable, deletes
/// it at once.
fn free(path: &Path) {
    let freeing = freeing_path(path);
    match std::fs::rename(path, &freeing) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(_) => return remove(path),
    }
    // A crash must never leave a shortened file under a log name.
    let durable = freeing
        .parent()
        .is_some_and(|dir| File::open(dir).and_then(|d| d.sync_all()).is_ok());
    if durable {
        // Never through a link: only the file itself is shrunk.
        if let Ok(file) = segment::open_options().write(true).open(&freeing) {
            let mut len = file.metadata().map_or(0, |m| m.len());
            while len > STEP_BYTES {
                len -= STEP_BYTES;
                if file.set_len(len).is_err() {
                    break;
                }
                std::thread::sleep(STEP_PAUSE);
            }
        }
    }
    remove(&freeing);
}

/// Deletes `path` at once, logging a failure (a file already gone is not
/// one).
pub(crate) fn remove(path: &std::path::Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not delete a fully acked log file; it is deleted at the next restart");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn handed_over_files_are_deleted_by_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let deleter = FileDeleter::start("test-delete".into()).unwrap();
        let paths: Vec<PathBuf> = (0..10)
            .map(|i| ciphermq_shard::log::segment::segment_path(dir.path(), i))
            .collect();
        for p in &paths {
            // Some larger than a step, so they shrink before they go.
            std::fs::File::create(p)
                .unwrap()
                .set_len(STEP_BYTES * 3 + 1)
                .unwrap();
            deleter.delete(p.clone()).unwrap();
        }
        // A path that is gone already is no error.
        deleter.delete(dir.path().join("never-made")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let left = || std::fs::read_dir(dir.path()).unwrap().count();
        while left() > 0 {
            assert!(Instant::now() < deadline, "files still there");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(paths.iter().all(|p| !freeing_path(p).exists()));
    }
}
