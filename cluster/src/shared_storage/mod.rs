//! Storage every node reaches (`cluster.storage = "shared"`, DESIGN §10.3):
//! one directory per owner and tenure, so that a node that takes an owner
//! over can fence the old holder out of its data without asking it, and
//! read exactly what that holder may have acknowledged.
//!
//! Layout under `cluster.shared_dir`:
//!
//! ```text
//! <owner hex>/
//!     e<epoch>-i<incarnation>/           one holder's copy, live ([`EpochDir`])
//!         <queue>/…                      that owner's queue logs
//!     e<epoch>-i<incarnation>.fenced/    renamed by a later holder ([`FencedDir`])
//!         FENCED                         the lengths it may read up to
//! ```
//!
//! A *tenure* is (epoch, incarnation): the epoch is the placement's fencing
//! token, the incarnation tells apart two starts of one node holding the
//! same epoch (a restart within the lease). Numbers are zero-padded, so
//! names sort in tenure order.
//!
//! The protocol, in the order it must happen:
//! 1. A holder makes its own directory ([`SharedStore::create_epoch_dir`])
//!    and remembers its identity (device and inode).
//! 2. It writes through open files, `fdatasync`s, and only then checks
//!    [`EpochDir::still_in_place`] (and its lease, [`LeaseGate`]); it
//!    acknowledges the round only if both hold.
//! 3. A later holder renames every older live directory aside
//!    ([`SharedStore::fence_older`]): the old holder's path-based opens now
//!    fail, and its next check after a fsync fails, even if it made a
//!    directory of the same name again (another inode). Then it records
//!    each file's length, once: bytes the old holder wrote later were
//!    never acknowledged, and are never read.
//! 4. It copies what the lengths cover ([`FencedDir::stage_into`]),
//!    stores those messages as its own, and only when they are durable
//!    removes the fenced directory ([`FencedDir::remove`]). Killed in
//!    between, the next holder finds both that directory and the killed
//!    holder's own, and adopts them in tenure order.

mod epoch_dir;
mod fenced;
mod lease;

use std::fmt;
use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

pub use epoch_dir::EpochDir;
pub use fenced::{FencedDir, FENCED_FILE};
pub use lease::LeaseGate;

/// Suffix a fenced directory's name gets.
pub const FENCED_SUFFIX: &str = ".fenced";

/// Which holder of an owner a directory belongs to; ordered by epoch, then
/// incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tenure {
    /// The placement's epoch.
    pub epoch: u64,
    /// The holding node's incarnation (rises on every start).
    pub incarnation: u64,
}

impl Tenure {
    /// The directory name of this tenure's live copy.
    pub fn dir_name(&self) -> String {
        format!("e{:020}-i{:020}", self.epoch, self.incarnation)
    }

    /// The tenure a directory name (live or fenced) stands for, and
    /// whether it is fenced; `None` for any other name.
    pub fn parse(name: &str) -> Option<(Tenure, bool)> {
        let (live, fenced) = match name.strip_suffix(FENCED_SUFFIX) {
            Some(live) => (live, true),
            None => (name, false),
        };
        let (epoch, incarnation) = live.strip_prefix('e')?.split_once("-i")?;
        let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(epoch) || !digits(incarnation) {
            return None;
        }
        Some((
            Tenure {
                epoch: epoch.parse().ok()?,
                incarnation: incarnation.parse().ok()?,
            },
            fenced,
        ))
    }
}

impl fmt::Display for Tenure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} (incarnation {})", self.epoch, self.incarnation)
    }
}

/// Why a step on the shared directory failed; each names the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedStorageError {
    /// A file system call failed.
    #[error("cluster.shared_dir: {path}: cannot {action}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// A later holder's directory exists: this node's tenure is stale and
    /// it must not serve the owner.
    #[error("cluster.shared_dir: owner {owner}: {newer} holds it, above this node's {mine}; this node must not serve it")]
    Superseded {
        /// The owner.
        owner: String,
        /// This node's tenure.
        mine: Tenure,
        /// The later one found.
        newer: Tenure,
    },
    /// A fenced directory's `FENCED` record is unreadable.
    #[error("cluster.shared_dir: {path}: damaged record of a fenced directory: {why}")]
    BadRecord {
        /// The record.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

impl SharedStorageError {
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| SharedStorageError::Io {
            action,
            path,
            source,
        }
    }
}

/// The shared directory (`cluster.shared_dir`).
#[derive(Debug, Clone)]
pub struct SharedStore {
    root: PathBuf,
}

impl SharedStore {
    /// The store at `root`, which must exist and be a directory (made by
    /// the operator: it is a mount every node shares, never made here).
    pub fn open(root: &Path) -> Result<SharedStore, SharedStorageError> {
        let root = std::fs::canonicalize(root)
            .map_err(SharedStorageError::io("resolve the shared directory", root))?;
        let meta = std::fs::metadata(&root)
            .map_err(SharedStorageError::io("read the shared directory", &root))?;
        if !meta.is_dir() {
            return Err(SharedStorageError::Io {
                action: "use the shared directory",
                path: root,
                source: io::Error::other("not a directory"),
            });
        }
        Ok(SharedStore { root })
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<owner hex>`: every copy of `owner`, whatever its name's bytes.
    pub fn owner_dir(&self, owner: &str) -> PathBuf {
        self.root.join(owner_dir_name(owner))
    }

    /// Makes `mine`'s live directory for `owner` (never over an existing
    /// one) and records its identity. Refused when a later tenure's
    /// directory, live or fenced, exists: this node would serve a stale
    /// copy.
    pub fn create_epoch_dir(
        &self,
        owner: &str,
        mine: Tenure,
    ) -> Result<EpochDir, SharedStorageError> {
        let owner_dir = self.owner_dir(owner);
        ciphermq_datadir::create_dir_all(&owner_dir).map_err(SharedStorageError::io(
            "create the owner's directory",
            &owner_dir,
        ))?;
        if let Some((newer, _)) = self.tenures(owner)?.into_iter().find(|(t, _)| *t > mine) {
            return Err(SharedStorageError::Superseded {
                owner: owner.to_owned(),
                mine,
                newer,
            });
        }
        let path = owner_dir.join(mine.dir_name());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(SharedStorageError::io("create the epoch directory", &path))?;
        sync(&owner_dir)?;
        sync(&self.root)?;
        EpochDir::opened(path, mine)
    }

    /// As [`Self::create_epoch_dir`], but takes `mine`'s directory as it
    /// is when this same holder made it before (an earlier try of the same
    /// process: incarnations are never reused).
    pub fn create_or_reopen_epoch_dir(
        &self,
        owner: &str,
        mine: Tenure,
    ) -> Result<EpochDir, SharedStorageError> {
        match self.create_epoch_dir(owner, mine) {
            Err(SharedStorageError::Io { source, .. })
                if source.kind() == io::ErrorKind::AlreadyExists =>
            {
                EpochDir::opened(self.owner_dir(owner).join(mine.dir_name()), mine)
            }
            other => other,
        }
    }

    /// Every directory of `owner` this store holds: its tenure and whether
    /// it is fenced, in tenure order. Other names are left alone.
    pub fn tenures(&self, owner: &str) -> Result<Vec<(Tenure, bool)>, SharedStorageError> {
        let owner_dir = self.owner_dir(owner);
        let entries = match std::fs::read_dir(&owner_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(SharedStorageError::io(
                    "list the owner's directory",
                    &owner_dir,
                )(e))
            }
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(SharedStorageError::io(
                "list the owner's directory",
                &owner_dir,
            ))?;
            if let Some(t) = entry.file_name().to_str().and_then(Tenure::parse) {
                found.push(t);
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// Fences every copy of `owner` older than `mine` and returns them all
    /// (fenced now or by an earlier holder), in tenure order, each with the
    /// lengths it may be read up to. Refused when a later tenure exists.
    pub fn fence_older(
        &self,
        owner: &str,
        mine: Tenure,
    ) -> Result<Vec<FencedDir>, SharedStorageError> {
        let owner_dir = self.owner_dir(owner);
        let mut fenced = Vec::new();
        let mut renamed = false;
        for (tenure, is_fenced) in self.tenures(owner)? {
            if tenure > mine {
                return Err(SharedStorageError::Superseded {
                    owner: owner.to_owned(),
                    mine,
                    newer: tenure,
                });
            }
            if tenure == mine {
                continue;
            }
            let live = owner_dir.join(tenure.dir_name());
            let aside = owner_dir.join(format!("{}{FENCED_SUFFIX}", tenure.dir_name()));
            if !is_fenced {
                match std::fs::rename(&live, &aside) {
                    Ok(()) => renamed = true,
                    // Fenced meanwhile by another holder: it is adopted
                    // all the same. Gone altogether (adopted and deleted
                    // by a holder that was in place): nothing to read.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        if !aside.is_dir() {
                            continue;
                        }
                    }
                    Err(e) => return Err(SharedStorageError::io("fence an older copy", &live)(e)),
                }
            }
            fenced.push((tenure, aside));
        }
        if renamed {
            // The renames must outlive a power cut before any length is
            // trusted: a holder that came back would write on otherwise.
            sync(&owner_dir)?;
        }
        fenced
            .into_iter()
            .map(|(tenure, path)| FencedDir::record(path, tenure, mine))
            .collect()
    }
}

/// `owner` in lowercase hex: a directory name whatever bytes the CN holds
/// (also how a node names an owner's directories in its data directory).
pub fn owner_dir_name(owner: &str) -> String {
    use std::fmt::Write as _;
    let mut name = String::with_capacity(owner.len() * 2);
    for b in owner.bytes() {
        let _ = write!(name, "{b:02x}");
    }
    name
}

/// `fsync`s a directory, so the names in it survive a power cut.
pub(crate) fn sync(dir: &Path) -> Result<(), SharedStorageError> {
    ciphermq_datadir::sync_dir(dir).map_err(SharedStorageError::io("sync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_in_tenure_order_and_parse_back() {
        let a = Tenure {
            epoch: 2,
            incarnation: 9,
        };
        let b = Tenure {
            epoch: 10,
            incarnation: 1,
        };
        assert!(a.dir_name() < b.dir_name());
        assert_eq!(Tenure::parse(&a.dir_name()), Some((a, false)));
        let fenced = format!("{}{FENCED_SUFFIX}", b.dir_name());
        assert_eq!(Tenure::parse(&fenced), Some((b, true)));
        for bad in [
            "e1-i2",
            "x",
            "e00000000000000000001-i0000000000000000000x",
            "",
        ] {
            assert_eq!(Tenure::parse(bad), None, "{bad}");
        }
    }
}
