//! A holder's own copy of an owner, and the check that makes it a fence.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::{SharedStorageError, Tenure};

/// A live directory `<owner hex>/e<epoch>-i<incarnation>/` as its holder
/// made it: the device and inode it had then.
///
/// Its name is not enough: a holder that was paused while another node
/// fenced it could make a directory of the same name again (every queue's
/// first write makes its directory). The identity tells the two apart.
#[derive(Debug, Clone)]
pub struct EpochDir {
    path: PathBuf,
    tenure: Tenure,
    identity: (u64, u64),
}

impl EpochDir {
    /// The directory at `path`, as it is now.
    pub(crate) fn opened(path: PathBuf, tenure: Tenure) -> Result<EpochDir, SharedStorageError> {
        let identity = identity(&path)?.ok_or_else(|| SharedStorageError::Io {
            action: "open the epoch directory",
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
            path: path.clone(),
        })?;
        Ok(EpochDir {
            path,
            tenure,
            identity,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whose it is.
    pub fn tenure(&self) -> Tenure {
        self.tenure
    }

    /// The log directory of `queue` inside it.
    pub fn queue_dir(&self, queue: &str) -> PathBuf {
        self.path.join(queue)
    }

    /// Whether no later holder has fenced it: the directory at its path is
    /// still the one it was made as. Call after a round's `fdatasync` and
    /// before its acknowledgements: a `false` (or an error) means nothing
    /// of the round may be acknowledged, since a later holder may already
    /// have recorded lengths that leave it out.
    pub fn still_in_place(&self) -> Result<bool, SharedStorageError> {
        Ok(identity(&self.path)? == Some(self.identity))
    }
}

/// The device and inode of the directory at `path`; `None` if nothing is
/// there (a symbolic link is not followed: it is not the directory made).
fn identity(path: &Path) -> Result<Option<(u64, u64)>, SharedStorageError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(Some((meta.dev(), meta.ino()))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SharedStorageError::io("check the epoch directory", path)(e)),
    }
}
