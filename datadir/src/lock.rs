//! The `{data_dir}/lock` flock that keeps a second broker out.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::write::FILE_MODE;

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another process holds the lock: a second broker on one directory
    /// would interleave writes to the same logs and topology.
    #[error(
        "{}: the data directory is in use by another broker ({}); stop that broker, or give \
         this one another storage.data_dir",
        .path.display(),
        holder_text(*.holder)
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The pid the holder wrote into the lock file, when readable.
        holder: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    #[error("{}: cannot lock the data directory: {source}", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// `pid N`, or `pid unknown` when the lock file held no pid.
fn holder_text(holder: Option<u32>) -> String {
    match holder {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_owned(),
    }
}

/// An exclusive `flock` on `{data_dir}/lock`, held while any holder of it in
/// this process lives. The OS releases it when the process ends, however it
/// ends (even `kill -9`), so a stale lock file never keeps a broker from
/// starting.
///
/// It keeps other processes out. Within one process the lock is shared: a
/// broker started again on the same directory after a stop (tests, an
/// application that embeds the broker) gets the lock its predecessor took,
/// since a stopped broker's state is not guaranteed to have been dropped
/// (its executors may leak detached tasks), and waiting for that would never
/// end.
#[derive(Debug)]
pub struct DataDirLock {
    /// Open for as long as a holder lives: closing it releases the lock.
    _file: Arc<File>,
    path: PathBuf,
}

/// The locks this process holds, by lock file path; an entry whose holders
/// are all gone is released and pruned.
static HELD: Mutex<Vec<(PathBuf, Weak<File>)>> = Mutex::new(Vec::new());

impl DataDirLock {
    /// The lock file's name inside the data directory.
    pub const FILE_NAME: &'static str = "lock";

    /// Takes the lock on `data_dir` without waiting (or shares the one this
    /// process holds), and writes this process's pid into the lock file so a
    /// second broker can name the holder.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, LockError> {
        let given = data_dir.join(Self::FILE_NAME);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| LockError::Io { path, source }
        };
        let path = std::fs::canonicalize(data_dir)
            .map_err(io(&given))?
            .join(Self::FILE_NAME);
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(_, file)| file.strong_count() > 0);
        if let Some(file) = held
            .iter()
            .find(|(p, _)| *p == path)
            .and_then(|(_, file)| file.upgrade())
        {
            return Ok(DataDirLock { _file: file, path });
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                return Err(LockError::Held { path, holder });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        // Only the holder writes the pid, so it is never overwritten by a
        // broker that then fails to start.
        file.set_len(0)
            .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .map_err(io(&path))?;
        let file = Arc::new(file);
        held.push((path.clone(), Arc::downgrade(&file)));
        Ok(DataDirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_process_is_refused_with_the_holder_named_until_the_holder_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(lock.path()).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // Another open file description stands for another process here: flock
        // excludes it exactly as it would another broker.
        let other = File::options()
            .read(true)
            .write(true)
            .open(lock.path())
            .unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        // This process shares what it holds.
        let shared = DataDirLock::acquire(dir.path()).unwrap();
        drop(lock);
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        // The last holder gone, the lock is free.
        drop(shared);
        other.try_lock().unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        match &err {
            LockError::Held { path, holder } => {
                assert_eq!(
                    path,
                    &std::fs::canonicalize(dir.path()).unwrap().join("lock")
                );
                assert_eq!(*holder, Some(std::process::id()));
            }
            other => panic!("{other}"),
        }
        let shown = err.to_string();
        assert!(
            shown.contains("lock") && shown.contains(&format!("pid {}", std::process::id())),
            "{shown}"
        );
        drop(other);
        DataDirLock::acquire(dir.path()).unwrap();
    }
}
