//! The data directory's own files, other than queue logs: how they are
//! replaced, what happens to one that turns out damaged, and the lock that
//! keeps a second broker out.
//!
//! The topology store, the embedded key store and the broker's secrets all
//! go through here, so each of those files gets the same guarantees: a crash
//! leaves either the old or the new content, never half of one; a secret is
//! never readable by others, not even while it is being written; and a
//! damaged file is set aside for a person to look at, never deleted.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use atomic_write_file::unix::OpenOptionsExt as _;

/// Mode of key material: readable by the broker's user only, from the moment
/// the file exists.
pub const SECRET_MODE: u32 = 0o600;

/// Mode of metadata that holds no secret (`topology.json`).
pub const PUBLIC_MODE: u32 = 0o644;

/// Replaces `path` with `contents`, or leaves it as it was: a temporary file
/// in the same directory, created with `mode` (so a secret is never
/// world-readable, even briefly), written, fsynced, renamed over `path`, and
/// the directory fsynced so the rename survives a power cut.
///
/// The mode of a file being replaced is not kept: `mode` is what the new one
/// gets (minus the umask), so a secret that was once left readable is
/// tightened on its next write.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let mut options = atomic_write_file::OpenOptions::new();
    options.mode(mode);
    options.preserve_mode(false);
    options.preserve_owner(false);
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    // Commit fsyncs the file, renames it over `path` and fsyncs the directory.
    // An error before the commit removes the temporary file when `file`
    // drops; one during the commit leaves it, so it is removed here (only
    // the holder of the data directory's lock writes these files, so no
    // other writer's temporary file can be taken for ours).
    file.commit().inspect_err(|_| remove_temporaries(path))
}

/// The file a temporary name was made for: `.{name}.XXXXXX` (six letters or
/// digits) is how [`write_atomic`] names the file it writes before the
/// rename. A crash can leave one behind; it never holds the only copy of
/// anything.
pub fn temporary_target(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix('.')?;
    let (target, suffix) = rest.rsplit_once('.')?;
    (!target.is_empty() && suffix.len() == 6 && suffix.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then_some(target)
}

/// Removes what [`write_atomic`] may have left of writes to `path`, best
/// effort: leftovers waste space, they are never read.
pub fn remove_temporaries(path: &Path) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent_dir(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        if file_name.to_str().and_then(temporary_target) == Some(name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Fsyncs the directory `dir`, so renames and removals in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Moves a damaged file out of the way, to `{path}.corrupt-{unix-ms}` in the
/// same directory (with a `-N` suffix should that name exist), and makes the
/// move durable. Returns the new path, for the warning that names it.
///
/// Damaged files are kept rather than deleted: they may still hold what a
/// person can recover, and they show what went wrong.
pub fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let stem = format!("{name}.corrupt-{}", unix_ms());
    let dir = parent_dir(path);
    let mut target = dir.join(&stem);
    let mut n = 1u32;
    while target.symlink_metadata().is_ok() {
        target = dir.join(format!("{stem}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &target)?;
    sync_dir(dir)?;
    Ok(target)
}

/// Something wrong with the data directory that the broker worked around at
/// start: it serves, but an operator should know (a file was set aside, an
/// older copy was used, a queue was adopted). Shown in the log at start and
/// meant for `/ready` and `/api/status`, so it is not lost in a log rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageWarning {
    /// The file or directory concerned.
    pub path: PathBuf,
    /// What happened and what it costs, for a person.
    pub message: String,
}

impl StorageWarning {
    /// A warning about `path`.
    pub fn new(path: impl Into<PathBuf>, message: impl Into<String>) -> StorageWarning {
        StorageWarning {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for StorageWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

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
            .mode(PUBLIC_MODE)
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
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_secret_is_written_0600_over_a_readable_file_and_no_temp_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aes.key");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"new", SECRET_MODE).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("aes.key")]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("f");
        assert!(write_atomic(&path, b"x", PUBLIC_MODE).is_err());
        let path = dir.path().join("f");
        write_atomic(&path, b"one", PUBLIC_MODE).unwrap();
        // A directory cannot be replaced by a file: the rename fails and
        // the temporary file is cleaned up.
        let blocked = dir.path().join("d");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("inside"), b"").unwrap();
        assert!(write_atomic(&blocked, b"two", PUBLIC_MODE).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn temporary_names_are_recognised() {
        assert_eq!(temporary_target(".r1.key.aB3dE9"), Some("r1.key"));
        assert_eq!(
            temporary_target(".topology.json.000000"),
            Some("topology.json")
        );
        assert_eq!(temporary_target("r1.key"), None);
        assert_eq!(temporary_target(".r1.key.tmp"), None);
        assert_eq!(temporary_target("..abcdef"), None);
    }

    #[test]
    fn moved_aside_files_never_overwrite_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        std::fs::write(&path, b"first").unwrap();
        let a = move_aside(&path).unwrap();
        std::fs::write(&path, b"second").unwrap();
        let b = move_aside(&path).unwrap();
        assert_ne!(a, b);
        assert!(!path.exists());
        assert_eq!(std::fs::read(&a).unwrap(), b"first");
        assert_eq!(std::fs::read(&b).unwrap(), b"second");
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("topology.json.corrupt-"), "{name}");
    }

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
