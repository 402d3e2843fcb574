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
//! File names are never reused within a run (segments are named by their
//! first sequence number, dedup files by a counter), so a deletion that
//! runs late cannot remove a newer file of the same name.

use std::path::PathBuf;

use crossbeam_channel::{Sender, TrySendError};

/// Paths waiting for the deleter at most. A 64 MiB segment per path, so the
/// queue only fills if the disk stops answering; the committer then deletes
/// inline (see [`FileDeleter::delete`]).
pub const MAX_QUEUED: usize = 4096;

/// The sending side of one shard's deleter thread; the thread ends when this
/// is dropped.
#[derive(Debug)]
pub struct FileDeleter {
    tx: Sender<PathBuf>,
}

impl FileDeleter {
    /// Starts the deleter thread `name`.
    pub fn start(name: String) -> std::io::Result<FileDeleter> {
        let (tx, rx) = crossbeam_channel::bounded::<PathBuf>(MAX_QUEUED);
        std::thread::Builder::new()
            .name(name)
            .stack_size(256 * 1024)
            .spawn(move || {
                for path in rx {
                    remove(&path);
                }
            })?;
        Ok(FileDeleter { tx })
    }

    /// Hands `path` to the deleter thread. Returns it back when the thread
    /// is gone or [`MAX_QUEUED`] paths wait already: the caller deletes it
    /// itself then, off the shard thread.
    pub fn delete(&self, path: PathBuf) -> Result<(), PathBuf> {
        match self.tx.try_send(path) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(path) | TrySendError::Disconnected(path)) => Err(path),
        }
    }
}

/// Deletes `path`, logging a failure (a file already gone is not one).
pub fn remove(path: &std::path::Path) {
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
        let paths: Vec<PathBuf> = (0..10).map(|i| dir.path().join(format!("f{i}"))).collect();
        for p in &paths {
            std::fs::write(p, b"x").unwrap();
            deleter.delete(p.clone()).unwrap();
        }
        // A path that is gone already is no error.
        deleter.delete(dir.path().join("never-made")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while paths.iter().any(|p| p.exists()) {
            assert!(Instant::now() < deadline, "files still there");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
