//! Real files under a temporary directory, with a record of what a power
//! cut would keep.
//!
//! Every write lands in the file at once (recovery reads real files), and
//! the disk remembers, per file, how much of it a sync made durable and
//! whether its name is durable (its directory synced since it was made).
//! [`SimDisk::crash`] then does what a power cut may: bytes past the
//! durable length are kept, torn at any point, or garbled; a file whose
//! name was never synced may vanish; a rename not yet synced may be undone.
//!
//! A failed `fdatasync` is modelled as Linux reports it: the pages it
//! failed on are marked clean, so a later successful sync does not make
//! them durable. What was written since the last good sync stays a hole a
//! crash may garble or zero, after any later sync, until the file is cut
//! back below it (bytes written after the failure sync normally).
//!
//! What is simplified: directories are durable once made (the committer
//! syncs each new one's parent before writing in it), and deleting a file
//! is durable at once (a deleted segment holds only acked records, and a
//! deleted dedup file only expired ids, so either may come back harmlessly;
//! this model does not bring them back).

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::rng::Rng;

/// What a power cut would keep of one file.
#[derive(Debug, Clone)]
struct FileState {
    /// Bytes a sync made durable (but for `holes`).
    durable_len: u64,
    /// Ranges a failed sync lost: never durable, whatever later syncs do,
    /// until a cut removes them.
    holes: Vec<(u64, u64)>,
    /// The file's name is durable (its directory was synced since it was
    /// made).
    named: bool,
}

/// The simulated storage: real files, and what a crash would leave.
#[derive(Debug)]
pub struct SimDisk {
    files: BTreeMap<PathBuf, FileState>,
    /// Renames whose directory is not synced yet: (from, to).
    renames: Vec<(PathBuf, PathBuf)>,
}

impl SimDisk {
    /// A disk whose every existing file under `root` counts as durable.
    pub fn new(root: &Path) -> io::Result<SimDisk> {
        let mut disk = SimDisk {
            files: BTreeMap::new(),
            renames: Vec::new(),
        };
        disk.settle(root)?;
        Ok(disk)
    }

    /// Forgets the model and takes what is on disk under `root` as durable
    /// (after a crash and the recovery that follows it).
    pub fn settle(&mut self, root: &Path) -> io::Result<()> {
        self.files.clear();
        self.renames.clear();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let path = entry.path();
                let meta = entry.metadata()?;
                if meta.is_dir() {
                    stack.push(path);
                } else {
                    self.files.insert(
                        path,
                        FileState {
                            durable_len: meta.len(),
                            holes: Vec::new(),
                            named: true,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Makes `dir` and its missing parents.
    pub fn create_dir(&mut self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    /// Creates `path` (never over an existing file) holding `header`.
    pub fn create(&mut self, path: &Path, header: &[u8]) -> io::Result<()> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        file.write_all_at(header, 0)?;
        self.files.insert(
            path.to_path_buf(),
            FileState {
                durable_len: 0,
                holes: Vec::new(),
                named: false,
            },
        );
        Ok(())
    }

    /// Opens an existing file for writing: fails as the broker's open does
    /// when it is not there.
    pub fn open(&mut self, path: &Path) -> io::Result<()> {
        OpenOptions::new().write(true).open(path).map(drop)
    }

    /// Writes `bytes` at `offset` of an existing file.
    pub fn write(&mut self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let file = OpenOptions::new().write(true).open(path)?;
        file.write_all_at(bytes, offset)?;
        self.files.entry(path.to_path_buf()).or_insert(FileState {
            durable_len: 0,
            holes: Vec::new(),
            named: true,
        });
        Ok(())
    }

    /// `fdatasync` of `path`; with `fail`, it fails as a device error does
    /// (what it covered is lost to later syncs).
    pub fn sync(&mut self, path: &Path, fail: bool) -> io::Result<()> {
        let len = fs::metadata(path)?.len();
        let state = self.files.entry(path.to_path_buf()).or_insert(FileState {
            durable_len: 0,
            holes: Vec::new(),
            named: true,
        });
        if fail {
            if len > state.durable_len {
                state.holes.push((state.durable_len, len));
            }
            return Err(io::Error::other("simulated fdatasync failure"));
        }
        state.durable_len = len;
        Ok(())
    }

    /// Syncs directory `dir`: the names in it, and renames into or out of
    /// it, become durable.
    pub fn sync_dir(&mut self, dir: &Path) {
        for (path, state) in self.files.iter_mut() {
            if path.parent() == Some(dir) {
                state.named = true;
            }
        }
        self.renames
            .retain(|(from, to)| from.parent() != Some(dir) && to.parent() != Some(dir));
    }

    /// Cuts `path` back to `len` (creating it if it does not exist), puts
    /// `header` back if `len` is its length, and syncs it.
    pub fn cut(&mut self, path: &Path, len: u64, header: &[u8]) -> io::Result<()> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        file.set_len(len)?;
        if len == header.len() as u64 {
            file.write_all_at(header, 0)?;
        }
        let state = self.files.entry(path.to_path_buf()).or_insert(FileState {
            durable_len: 0,
            holes: Vec::new(),
            named: false,
        });
        state.durable_len = len;
        // What a failed sync lost past `len` is gone with the cut; a file
        // cut to its header has that header written again.
        if len == header.len() as u64 {
            state.holes.clear();
        }
        state.holes.retain_mut(|(start, end)| {
            *end = (*end).min(len);
            *start < *end
        });
        Ok(())
    }

    /// Deletes `path` (durably, see the module doc).
    pub fn remove(&mut self, path: &Path) {
        let _ = fs::remove_file(path);
        self.files.remove(path);
    }

    /// Renames directory `from` to `to`; durable once their parent is synced.
    pub fn rename_dir(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)?;
        let moved: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| p.starts_with(from))
            .cloned()
            .collect();
        for path in moved {
            if let (Some(state), Ok(rest)) = (self.files.remove(&path), path.strip_prefix(from)) {
                self.files.insert(to.join(rest), state);
            }
        }
        self.renames.push((from.to_path_buf(), to.to_path_buf()));
        Ok(())
    }

    /// Removes directory `dir` and everything in it.
    pub fn remove_dir(&mut self, dir: &Path) {
        let _ = fs::remove_dir_all(dir);
        self.files.retain(|p, _| !p.starts_with(dir));
    }

    /// A power cut: what was not made durable is kept, torn or garbled
    /// (see the module doc). Returns a line per file it changed.
    pub fn crash(&mut self, rng: &mut Rng) -> io::Result<Vec<String>> {
        let mut changed = Vec::new();
        // Renames not synced may be undone, newest first.
        for (from, to) in std::mem::take(&mut self.renames).into_iter().rev() {
            if rng.chance(500) && to.exists() && !from.exists() {
                fs::rename(&to, &from)?;
                changed.push(format!("rename undone: {}", to.display()));
            }
        }
        for (path, state) in std::mem::take(&mut self.files) {
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if !state.named && rng.chance(500) {
                fs::remove_file(&path)?;
                changed.push(format!("unnamed file gone: {}", path.display()));
                continue;
            }
            let durable = state.durable_len;
            let len = meta.len();
            let file = OpenOptions::new().write(true).open(&path)?;
            for &(start, end) in &state.holes {
                let end = end.min(len);
                if start >= end || rng.chance(500) {
                    continue;
                }
                // The lost pages: what the disk held before (zeros).
                file.write_all_at(&vec![0u8; (end - start) as usize], start)?;
                changed.push(format!(
                    "{}: bytes {start}..{end} a failed sync lost are zeros",
                    path.display()
                ));
            }
            if len <= durable {
                continue;
            }
            let kept = rng.between(durable, len);
            if kept < len {
                file.set_len(kept)?;
            }
            if kept > durable && rng.chance(300) {
                let at = rng.between(durable, kept - 1);
                let byte = (rng.next_u64() & 0xff) as u8;
                file.write_all_at(&[byte], at)?;
                changed.push(format!(
                    "{}: {len} bytes, {durable} durable, kept {kept}, byte {at} garbled",
                    path.display()
                ));
            } else if kept < len {
                changed.push(format!(
                    "{}: {len} bytes, {durable} durable, kept {kept}",
                    path.display()
                ));
            }
        }
        Ok(changed)
    }
}
