//! An older holder's copy, renamed aside, and what of it may be read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use super::{sync, SharedStorageError, Tenure};

/// The record inside a fenced directory: who fenced it and each file's
/// length at that moment.
pub const FENCED_FILE: &str = "FENCED";

const HEADER: &str = "ciphermq fenced v1";

/// `<owner hex>/e<epoch>-i<incarnation>.fenced/`: an older holder's copy.
/// Only the first [`FencedDir::lengths`] bytes of each file are ever read:
/// whatever its holder wrote after the rename was never acknowledged (its
/// check after the fsync failed), and may be torn.
#[derive(Debug, Clone)]
pub struct FencedDir {
    path: PathBuf,
    tenure: Tenure,
    /// Relative path of each file → its length when it was fenced.
    lengths: BTreeMap<PathBuf, u64>,
}

impl FencedDir {
    /// Reads the record of the fenced directory at `path`, or (the first
    /// holder to get here since the rename) writes it: every file's length
    /// now, durably, before anything of it is read.
    pub(crate) fn record(
        path: PathBuf,
        tenure: Tenure,
        by: Tenure,
    ) -> Result<FencedDir, SharedStorageError> {
        let record = path.join(FENCED_FILE);
        let lengths = match std::fs::read_to_string(&record) {
            Ok(text) => parse(&text).map_err(|why| SharedStorageError::BadRecord {
                path: record.clone(),
                why,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut lengths = BTreeMap::new();
                list(&path, Path::new(""), &mut lengths)?;
                let mut text = format!("{HEADER}\nby {}\n", by.dir_name());
                for (rel, len) in &lengths {
                    text.push_str(&format!("{len} {}\n", rel.display()));
                }
                ciphermq_datadir::write_atomic(
                    &record,
                    text.as_bytes(),
                    ciphermq_datadir::FILE_MODE,
                )
                .map_err(SharedStorageError::io("record the fenced lengths", &record))?;
                lengths
            }
            Err(e) => {
                return Err(SharedStorageError::io("read the fenced lengths", &record)(
                    e,
                ))
            }
        };
        Ok(FencedDir {
            path,
            tenure,
            lengths,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whose copy it was.
    pub fn tenure(&self) -> Tenure {
        self.tenure
    }

    /// Each file (relative to [`Self::path`]) and the bytes of it that
    /// may be read.
    pub fn lengths(&self) -> &BTreeMap<PathBuf, u64> {
        &self.lengths
    }

    /// The queues it holds: its top-level directories, sorted.
    pub fn queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = self
            .lengths
            .keys()
            .filter_map(|rel| {
                let mut parts = rel.components();
                let first = parts.next()?;
                parts.next()?;
                first.as_os_str().to_str().map(str::to_owned)
            })
            .collect();
        queues.dedup();
        queues
    }

    /// Copies what may be read into `staging` (made anew; each file cut at
    /// its recorded length), for recovery to read as it would a data
    /// directory of its own. Returns the bytes copied.
    pub fn stage_into(&self, staging: &Path) -> Result<u64, SharedStorageError> {
        match std::fs::remove_dir_all(staging) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SharedStorageError::io(
                    "clear the staging directory",
                    staging,
                )(e))
            }
        }
        let mut copied = 0;
        for (rel, len) in &self.lengths {
            let from = self.path.join(rel);
            let to = staging.join(rel);
            if let Some(parent) = to.parent() {
                ciphermq_datadir::create_dir_all(parent)
                    .map_err(SharedStorageError::io("create a staging directory", parent))?;
            }
            let source =
                File::open(&from).map_err(SharedStorageError::io("open a fenced file", &from))?;
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&to)
                .map_err(SharedStorageError::io("create a staged file", &to))?;
            let mut limited = source.take(*len);
            copied += std::io::copy(&mut limited, &mut out)
                .map_err(SharedStorageError::io("copy a fenced file", &from))?;
            out.flush()
                .map_err(SharedStorageError::io("write a staged file", &to))?;
        }
        Ok(copied)
    }

    /// Deletes it: call only once what it held is durable elsewhere.
    pub fn remove(self) -> Result<(), SharedStorageError> {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SharedStorageError::io("remove a fenced copy", &self.path)(
                    e,
                ))
            }
        }
        match self.path.parent() {
            Some(owner_dir) => sync(owner_dir),
            None => Ok(()),
        }
    }
}

/// Every regular file under `dir`/`rel`, with its length, except the
/// record itself.
fn list(
    dir: &Path,
    rel: &Path,
    out: &mut BTreeMap<PathBuf, u64>,
) -> Result<(), SharedStorageError> {
    let here = dir.join(rel);
    let entries = std::fs::read_dir(&here)
        .map_err(SharedStorageError::io("list a fenced directory", &here))?;
    for entry in entries {
        let entry = entry.map_err(SharedStorageError::io("list a fenced directory", &here))?;
        let name = entry.file_name();
        let child = rel.join(&name);
        if rel.as_os_str().is_empty() && name == FENCED_FILE {
            continue;
        }
        let meta = entry.metadata().map_err(SharedStorageError::io(
            "read a fenced file's length",
            &dir.join(&child),
        ))?;
        if meta.is_dir() {
            list(dir, &child, out)?;
        } else if meta.is_file() {
            out.insert(child, meta.len());
        }
    }
    Ok(())
}

fn parse(text: &str) -> Result<BTreeMap<PathBuf, u64>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!("the first line is not {HEADER:?}"));
    }
    match lines.next() {
        Some(by) if by.starts_with("by ") => {}
        _ => return Err("the second line does not name who fenced it".into()),
    }
    let mut lengths = BTreeMap::new();
    for (n, line) in lines.enumerate() {
        let (len, rel) = line
            .split_once(' ')
            .ok_or_else(|| format!("line {}: expected `<length> <path>`", n + 3))?;
        let len = len
            .parse()
            .map_err(|_| format!("line {}: {len:?} is not a length", n + 3))?;
        let rel = PathBuf::from(rel);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!(
                "line {}: {} leaves the directory",
                n + 3,
                rel.display()
            ));
        }
        lengths.insert(rel, len);
    }
    Ok(lengths)
}
