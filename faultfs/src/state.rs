//! The in-memory tree and its durability model (see the crate docs): every
//! file keeps its current bytes plus the durable bytes of the pages changed
//! since its last fsync, every directory its current and durable entries.
//!
//! Errors are raw errnos, turned into FUSE replies by `fs.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use crate::faults::{BitFlip, Faults, Rng, Stats};
use crate::Error;

/// The root directory's inode number (fixed by FUSE).
pub(crate) const ROOT: u64 = 1;
/// Unit of the undo log: an fsync costs the pages changed since the last one,
/// not the whole file.
const PAGE: u64 = 4096;
/// Files larger than this are refused (`EFBIG`): tests hold them in memory.
const MAX_FILE: u64 = 1 << 40;

pub(crate) type Res<T> = Result<T, i32>;

/// What an fsync makes durable beyond the synced object itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Only what was synced: a file's content by its fsync, a directory's
    /// entries by its own fsync. What POSIX promises, and the default.
    #[default]
    Strict,
    /// Any fsync or fsyncdir also commits every directory's entries, much like
    /// a journaling filesystem's commit: for checking that a program is
    /// correct on ext4 even where it is not strictly portable.
    Lenient,
}

/// A file's current bytes, plus the durable bytes of every page changed
/// since the last fsync (the undo log); the durable content is the current
/// one with those pages put back, cut or zero-extended to `durable_len`.
#[derive(Debug, Default)]
pub(crate) struct FileData {
    data: Vec<u8>,
    durable_len: u64,
    undo: BTreeMap<u64, Vec<u8>>,
}

impl FileData {
    pub(crate) fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Saves the durable bytes of the pages overlapping `start..end` that are
    /// not saved yet, before they change.
    fn save(&mut self, start: u64, end: u64) {
        let end = end.min(self.durable_len);
        if start >= end {
            return;
        }
        for page in start / PAGE..=(end - 1) / PAGE {
            if self.undo.contains_key(&page) {
                continue;
            }
            let s = page * PAGE;
            let e = (s + PAGE).min(self.durable_len);
            let have = e.min(self.len());
            let mut bytes = self
                .data
                .get(s as usize..have.max(s) as usize)
                .unwrap_or_default()
                .to_vec();
            bytes.resize((e - s) as usize, 0);
            self.undo.insert(page, bytes);
        }
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) {
        let end = offset + bytes.len() as u64;
        self.save(offset, end);
        if end > self.len() {
            self.data.resize(end as usize, 0);
        }
        self.data[offset as usize..end as usize].copy_from_slice(bytes);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len() {
            self.save(len, self.len());
        }
        self.data.resize(len as usize, 0);
    }

    fn zero(&mut self, start: u64, end: u64) {
        let end = end.min(self.len());
        if start < end {
            self.save(start, end);
            self.data[start as usize..end as usize].fill(0);
        }
    }

    fn sync(&mut self) {
        self.undo.clear();
        self.durable_len = self.len();
    }

    fn revert(&mut self) {
        self.data.resize(self.durable_len as usize, 0);
        for (page, bytes) in std::mem::take(&mut self.undo) {
            let s = (page * PAGE) as usize;
            self.data[s..s + bytes.len()].copy_from_slice(&bytes);
        }
    }

    pub(crate) fn read(&self, offset: u64, size: u32) -> &[u8] {
        let start = offset.min(self.len()) as usize;
        let end = offset.saturating_add(u64::from(size)).min(self.len()) as usize;
        &self.data[start..end]
    }

    /// Flips a bit in the current and the durable content, wherever the
    /// offset lies in them; false if it lies in neither.
    fn flip(&mut self, offset: u64, bit: u8) -> bool {
        let mask = 1u8 << bit;
        let mut hit = false;
        if let Some(b) = self.data.get_mut(offset as usize) {
            *b ^= mask;
            hit = true;
        }
        if offset < self.durable_len {
            // An unsaved durable page equals the current one: flipped above.
            if let Some(saved) = self.undo.get_mut(&(offset / PAGE)) {
                saved[(offset % PAGE) as usize] ^= mask;
                hit = true;
            }
        }
        hit
    }
}

/// A directory: names as a process sees them now, and as a power cut
/// leaves them.
#[derive(Debug, Default)]
pub(crate) struct Dir {
    pub(crate) entries: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
    /// For `..`: the directory that currently holds this one.
    pub(crate) parent: u64,
}

#[derive(Debug)]
pub(crate) enum Body {
    File(FileData),
    Dir(Dir),
}

/// One file or directory, with the attributes `stat` shows and the counts
/// that decide when it can be forgotten.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) body: Body,
    pub(crate) perm: u16,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) atime: SystemTime,
    pub(crate) mtime: SystemTime,
    pub(crate) ctime: SystemTime,
    pub(crate) crtime: SystemTime,
    /// Current directory entries naming it.
    pub(crate) links: u32,
    /// Durable directory entries naming it: it may come back on a power cut.
    durable_links: u32,
    /// Open handles.
    open: u32,
    /// References the kernel holds (FUSE lookup count).
    lookups: u64,
}

impl Inode {
    fn new(body: Body, perm: u16, uid: u32, gid: u32) -> Inode {
        let now = SystemTime::now();
        Inode {
            body,
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            links: 0,
            durable_links: 0,
            open: 0,
            lookups: 0,
        }
    }

    fn file_mut(&mut self) -> Res<&mut FileData> {
        match &mut self.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    fn touch(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

/// The whole filesystem: shared (behind a mutex) by the FUSE thread and the
/// test's handle.
#[derive(Debug)]
pub(crate) struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    /// Open file handles and their inode; emptied by a power cut.
    handles: HashMap<u64, u64>,
    next_fh: u64,
    pub(crate) durability: Durability,
    pub(crate) capacity: Option<u64>,
    pub(crate) faults: Faults,
    pub(crate) stats: Stats,
}

impl State {
    pub(crate) fn new(durability: Durability, capacity: Option<u64>) -> State {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut root = Inode::new(
            Body::Dir(Dir {
                parent: ROOT,
                ..Dir::default()
            }),
            0o755,
            uid,
            gid,
        );
        root.links = 1;
        root.durable_links = 1;
        State {
            inodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            durability,
            capacity,
            faults: Faults::default(),
            stats: Stats::default(),
        }
    }

    pub(crate) fn get(&self, ino: u64) -> Res<&Inode> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    pub(crate) fn get_mut(&mut self, ino: u64) -> Res<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    pub(crate) fn dir(&self, ino: u64) -> Res<&Dir> {
        match &self.get(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Res<&mut Dir> {
        match &mut self.get_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.inodes.get(&ino).map(|i| &i.body), Some(Body::Dir(_)))
    }

    /// A live handle's inode. Handles opened before a power cut belong to a
    /// machine that no longer exists: `EIO`.
    fn handle(&self, fh: u64) -> Res<u64> {
        self.handles.get(&fh).copied().ok_or(libc::EIO)
    }

    pub(crate) fn lookup(&mut self, parent: u64, name: &OsStr) -> Res<u64> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(libc::ENOENT)?;
        self.get_mut(ino)?.lookups += 1;
        Ok(ino)
    }

    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.lookups = inode.lookups.saturating_sub(n);
            self.collect(ino);
        }
    }

    /// Makes a file or directory named `name` in `parent`; the kernel holds
    /// one reference to it, as after a lookup.
    pub(crate) fn make(
        &mut self,
        parent: u64,
        name: &OsStr,
        dir: bool,
        perm: u16,
        owner: (u32, u32),
    ) -> Res<u64> {
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let body = if dir {
            Body::Dir(Dir {
                parent,
                ..Dir::default()
            })
        } else {
            Body::File(FileData::default())
        };
        let ino = self.next_ino;
        self.next_ino += 1;
        let mut inode = Inode::new(body, perm, owner.0, owner.1);
        inode.links = 1;
        inode.lookups = 1;
        self.inodes.insert(ino, inode);
        self.dir_mut(parent)?.entries.insert(name.to_owned(), ino);
        self.get_mut(parent)?.touch();
        Ok(ino)
    }

    /// Removes the entry `name` from `parent` (`rmdir` when `dir`).
    pub(crate) fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Res<()> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(libc::ENOENT)?;
        match (&self.get(ino)?.body, dir) {
            (Body::Dir(_), false) => return Err(libc::EISDIR),
            (Body::File(_), true) => return Err(libc::ENOTDIR),
            (Body::Dir(d), true) if !d.entries.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.dir_mut(parent)?.entries.remove(name);
        self.get_mut(parent)?.touch();
        self.unlink_inode(ino);
        Ok(())
    }

    fn unlink_inode(&mut self, ino: u64) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.links = inode.links.saturating_sub(1);
            inode.ctime = SystemTime::now();
        }
        self.collect(ino);
    }

    pub(crate) fn rename(
        &mut self,
        from: (u64, &OsStr),
        to: (u64, &OsStr),
        noreplace: bool,
    ) -> Res<()> {
        let ino = *self.dir(from.0)?.entries.get(from.1).ok_or(libc::ENOENT)?;
        if to.1.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        let target = self.dir(to.0)?.entries.get(to.1).copied();
        if let Some(target) = target {
            if noreplace {
                return Err(libc::EEXIST);
            }
            if target == ino {
                return Ok(());
            }
            match (self.is_dir(ino), &self.get(target)?.body) {
                (false, Body::Dir(_)) => return Err(libc::EISDIR),
                (true, Body::File(_)) => return Err(libc::ENOTDIR),
                (true, Body::Dir(d)) if !d.entries.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        self.dir_mut(from.0)?.entries.remove(from.1);
        self.dir_mut(to.0)?.entries.insert(to.1.to_owned(), ino);
        if let Ok(d) = self.dir_mut(ino) {
            d.parent = to.0;
        }
        self.get_mut(from.0)?.touch();
        self.get_mut(to.0)?.touch();
        self.get_mut(ino)?.ctime = SystemTime::now();
        if let Some(target) = target {
            self.unlink_inode(target);
        }
        Ok(())
    }

    pub(crate) fn open(&mut self, ino: u64) -> Res<u64> {
        self.get_mut(ino)?.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        Ok(fh)
    }

    pub(crate) fn release(&mut self, fh: u64) {
        if let Some(ino) = self.handles.remove(&fh) {
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.open = inode.open.saturating_sub(1);
            }
            self.collect(ino);
        }
    }

    pub(crate) fn read(&mut self, fh: u64, offset: u64, size: u32) -> Res<&[u8]> {
        let ino = self.handle(fh)?;
        let inode = self.get_mut(ino)?;
        inode.atime = SystemTime::now();
        Ok(inode.file_mut()?.read(offset, size))
    }

    /// One `WRITE` request: counted, then failed whole by a fault rule or the
    /// capacity, or applied whole.
    pub(crate) fn write(&mut self, fh: u64, offset: u64, data: &[u8]) -> Res<u32> {
        let ino = self.handle(fh)?;
        self.stats.writes += 1;
        let len = data.len() as u64;
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE);
        let end = end.ok_or(libc::EFBIG)?;
        let size = self.get_mut(ino)?.file_mut()?.len();
        if let Some(errno) = self.in_faulty_dir(ino) {
            self.stats.injected_faults += 1;
            return Err(errno);
        }
        if let Some(errno) = self.faults.on_write(len) {
            self.stats.injected_faults += 1;
            return Err(errno);
        }
        self.reserve(end.saturating_sub(size))?;
        let inode = self.get_mut(ino)?;
        inode.file_mut()?.write(offset, data);
        inode.touch();
        self.stats.bytes_written += len;
        Ok(data.len() as u32)
    }

    /// `ENOSPC` if growing the files held by `more` bytes would pass the
    /// capacity.
    fn reserve(&mut self, more: u64) -> Res<()> {
        if let Some(capacity) = self.capacity {
            if more > 0 && self.used().saturating_add(more) > capacity {
                self.stats.capacity_rejections += 1;
                return Err(libc::ENOSPC);
            }
        }
        Ok(())
    }

    /// Bytes held: current sizes of the files still linked or open (an
    /// unlinked, closed file frees its space even before the unlink is
    /// durable).
    pub(crate) fn used(&self) -> u64 {
        self.inodes
            .values()
            .filter(|i| i.links > 0 || i.open > 0)
            .map(|i| match &i.body {
                Body::File(f) => f.len(),
                Body::Dir(_) => 0,
            })
            .sum()
    }

    pub(crate) fn inode_count(&self) -> u64 {
        self.inodes.len() as u64
    }

    /// Truncates or extends (with zeros) a file; `fh` when through a handle.
    pub(crate) fn set_size(&mut self, ino: u64, fh: Option<u64>, size: u64) -> Res<()> {
        if let Some(fh) = fh {
            self.handle(fh)?;
        }
        if size > MAX_FILE {
            return Err(libc::EFBIG);
        }
        let old = self.get_mut(ino)?.file_mut()?.len();
        self.reserve(size.saturating_sub(old))?;
        let inode = self.get_mut(ino)?;
        inode.file_mut()?.set_len(size);
        inode.touch();
        Ok(())
    }

    /// `fallocate(2)`: plain allocation (extends the size), `KEEP_SIZE`
    /// (checks space only: there are no blocks to reserve), `PUNCH_HOLE` and
    /// `ZERO_RANGE` (write zeros). Other modes: `EOPNOTSUPP`.
    pub(crate) fn fallocate(&mut self, fh: u64, offset: u64, len: u64, mode: i32) -> Res<()> {
        let ino = self.handle(fh)?;
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE);
        let end = end.ok_or(libc::EFBIG)?;
        let size = self.get_mut(ino)?.file_mut()?.len();
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if mode
            & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE)
            != 0
        {
            return Err(libc::EOPNOTSUPP);
        }
        self.reserve(end.saturating_sub(size))?;
        let inode = self.get_mut(ino)?;
        let file = inode.file_mut()?;
        if zero {
            file.zero(offset, end);
        }
        if !keep && end > size {
            file.set_len(end);
        }
        inode.touch();
        Ok(())
    }

    /// A file's fsync/fdatasync through handle `fh`.
    pub(crate) fn fsync(&mut self, fh: u64) -> Res<()> {
        let ino = self.handle(fh)?;
        self.stats.fsyncs += 1;
        let failed = self.in_faulty_dir(ino).or(self.faults.on_fsync());
        let file = self.inodes.get_mut(&ino).ok_or(libc::ENOENT)?.file_mut()?;
        if let Some(errno) = failed {
            file.revert();
            self.stats.injected_faults += 1;
            return Err(errno);
        }
        file.sync();
        if self.durability == Durability::Lenient {
            self.commit_all();
        }
        Ok(())
    }

    /// The errno of [`Faults::fail_in_dir`] when file `ino` is in a
    /// directory of that name (a scan: only while that rule is armed).
    fn in_faulty_dir(&self, ino: u64) -> Option<i32> {
        let (name, errno) = self.faults.in_dir()?;
        let named = |dir: u64, parent: u64| {
            self.dir(parent)
                .is_ok_and(|p| p.entries.get(name) == Some(&dir))
        };
        self.inodes
            .iter()
            .any(|(&dir, i)| match &i.body {
                Body::Dir(d) => d.entries.values().any(|&c| c == ino) && named(dir, d.parent),
                _ => false,
            })
            .then_some(errno)
    }

    /// A directory's fsync: its current entries become durable.
    pub(crate) fn fsyncdir(&mut self, ino: u64) -> Res<()> {
        self.stats.fsyncdirs += 1;
        self.dir(ino)?;
        if self.durability == Durability::Lenient {
            self.commit_all();
        } else {
            self.commit(ino);
        }
        Ok(())
    }

    /// Makes everything durable, as if every file and directory had been
    /// fsynced.
    pub(crate) fn sync_all(&mut self) {
        for inode in self.inodes.values_mut() {
            if let Body::File(f) = &mut inode.body {
                f.sync();
            }
        }
        self.commit_all();
    }

    fn commit_all(&mut self) {
        let dirs: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| matches!(i.body, Body::Dir(_)))
            .map(|(&ino, _)| ino)
            .collect();
        for ino in dirs {
            self.commit(ino);
        }
    }

    fn commit(&mut self, ino: u64) {
        let Ok(dir) = self.dir_mut(ino) else { return };
        let old = std::mem::replace(&mut dir.durable, dir.entries.clone());
        let new: Vec<u64> = dir.durable.values().copied().collect();
        for child in new {
            if let Some(i) = self.inodes.get_mut(&child) {
                i.durable_links += 1;
            }
        }
        for child in old.into_values() {
            if let Some(i) = self.inodes.get_mut(&child) {
                i.durable_links = i.durable_links.saturating_sub(1);
            }
            self.collect(child);
        }
    }

    /// Frees `ino` once nothing can reach it any more: no current or durable
    /// name, no open handle, no kernel reference. A freed directory's durable
    /// entries no longer count for its children.
    fn collect(&mut self, ino: u64) {
        let mut work = vec![ino];
        while let Some(ino) = work.pop() {
            let Some(i) = self.inodes.get(&ino) else {
                continue;
            };
            if ino == ROOT || i.links > 0 || i.durable_links > 0 || i.open > 0 || i.lookups > 0 {
                continue;
            }
            if let Some(Inode {
                body: Body::Dir(d), ..
            }) = self.inodes.remove(&ino)
            {
                for child in d.durable.into_values() {
                    if let Some(c) = self.inodes.get_mut(&child) {
                        c.durable_links = c.durable_links.saturating_sub(1);
                    }
                    work.push(child);
                }
            }
        }
    }

    /// The power cut: see the crate docs.
    pub(crate) fn power_cut(&mut self) {
        self.stats.power_cuts += 1;
        self.handles.clear();
        let mut parent_of = HashMap::from([(ROOT, ROOT)]);
        let mut stack = vec![ROOT];
        while let Some(d) = stack.pop() {
            let Ok(dir) = self.dir(d) else { continue };
            let children: Vec<u64> = dir.durable.values().copied().collect();
            for child in children {
                if !parent_of.contains_key(&child) && self.inodes.contains_key(&child) {
                    parent_of.insert(child, d);
                    if self.is_dir(child) {
                        stack.push(child);
                    }
                }
            }
        }
        self.inodes.retain(|ino, _| parent_of.contains_key(ino));
        for (ino, inode) in &mut self.inodes {
            inode.links = 0;
            inode.durable_links = 0;
            inode.open = 0;
            match &mut inode.body {
                Body::File(f) => f.revert(),
                Body::Dir(d) => {
                    d.entries = d.durable.clone();
                    d.parent = parent_of.get(ino).copied().unwrap_or(ROOT);
                }
            }
        }
        let named: Vec<u64> = self
            .inodes
            .values()
            .filter_map(|i| match &i.body {
                Body::Dir(d) => Some(d.entries.values().copied()),
                Body::File(_) => None,
            })
            .flatten()
            .collect();
        for ino in named.into_iter().chain([ROOT]) {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.links += 1;
                i.durable_links += 1;
            }
        }
    }

    /// The inode at `path` (relative to the root, or absolute under
    /// `mountpoint`) in the current namespace.
    fn resolve(&self, mountpoint: &Path, path: &Path) -> Result<u64, Error> {
        let rel = path.strip_prefix(mountpoint).unwrap_or(path);
        let mut ino = ROOT;
        for part in rel.components() {
            match part {
                Component::Normal(name) => {
                    let dir = self.dir(ino).map_err(|_| Error::NotFound(rel.into()))?;
                    ino = *dir
                        .entries
                        .get(name)
                        .ok_or_else(|| Error::NotFound(rel.into()))?;
                }
                Component::CurDir | Component::RootDir => {}
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(Error::NotFound(rel.into()))
                }
            }
        }
        Ok(ino)
    }

    pub(crate) fn flip_bit(
        &mut self,
        mountpoint: &Path,
        path: &Path,
        offset: u64,
        bit: u8,
    ) -> Result<(), Error> {
        if bit > 7 {
            return Err(Error::BadBit(bit));
        }
        let rel = path.strip_prefix(mountpoint).unwrap_or(path).to_path_buf();
        let ino = self.resolve(mountpoint, path)?;
        let Some(Body::File(file)) = self.inodes.get_mut(&ino).map(|i| &mut i.body) else {
            return Err(Error::NotAFile(rel));
        };
        if file.flip(offset, bit) {
            Ok(())
        } else {
            Err(Error::OutOfRange { path: rel, offset })
        }
    }

    /// Regular files in the current namespace, by path, in path order (so
    /// seeded choices among them are reproducible).
    fn files(&self) -> Vec<(PathBuf, u64)> {
        let mut out = Vec::new();
        let mut seen = HashSet::from([ROOT]);
        let mut stack = vec![(PathBuf::new(), ROOT)];
        while let Some((path, ino)) = stack.pop() {
            let Ok(dir) = self.dir(ino) else { continue };
            for (name, &child) in &dir.entries {
                if !seen.insert(child) {
                    continue;
                }
                match self.inodes.get(&child).map(|i| &i.body) {
                    Some(Body::File(_)) => out.push((path.join(name), child)),
                    Some(Body::Dir(_)) => stack.push((path.join(name), child)),
                    None => {}
                }
            }
        }
        out.sort();
        out
    }

    pub(crate) fn flip_random_bits(
        &mut self,
        seed: u64,
        count: usize,
        filter: &dyn Fn(&Path) -> bool,
    ) -> Result<Vec<BitFlip>, Error> {
        let files: Vec<(PathBuf, u64, u64)> = self
            .files()
            .into_iter()
            .filter(|(path, _)| filter(path))
            .filter_map(|(path, ino)| match &self.inodes.get(&ino)?.body {
                Body::File(f) if f.len() > 0 => Some((path, ino, f.len())),
                _ => None,
            })
            .collect();
        let bits: u64 = files.iter().map(|(_, _, len)| len * 8).sum();
        if (count as u64) > bits {
            return Err(Error::NotEnoughData {
                requested: count,
                available: bits,
            });
        }
        let mut rng = Rng::new(seed);
        let mut chosen = HashSet::new();
        while chosen.len() < count {
            chosen.insert(rng.below(bits));
        }
        let mut chosen: Vec<u64> = chosen.into_iter().collect();
        chosen.sort_unstable();
        let mut flips = Vec::with_capacity(count);
        let (mut file, mut base) = (0, 0);
        for pick in chosen {
            while pick >= base + files[file].2 * 8 {
                base += files[file].2 * 8;
                file += 1;
            }
            let (path, ino, _) = &files[file];
            let (offset, bit) = ((pick - base) / 8, ((pick - base) % 8) as u8);
            if let Some(Inode {
                body: Body::File(f),
                ..
            }) = self.inodes.get_mut(ino)
            {
                f.flip(offset, bit);
            }
            flips.push(BitFlip {
                path: path.clone(),
                offset,
                bit,
            });
        }
        Ok(flips)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: &FileData) -> Vec<u8> {
        f.read(0, u32::MAX).to_vec()
    }

    #[test]
    fn revert_restores_the_synced_content_and_size() {
        let mut f = FileData::default();
        f.write(0, &[1; 10_000]);
        f.sync();
        f.write(5000, &[2; 6000]);
        f.set_len(3000);
        f.write(4000, &[3; 10]);
        f.revert();
        assert_eq!(bytes(&f), vec![1; 10_000]);
    }

    #[test]
    fn flip_reaches_durable_bytes_of_changed_pages() {
        let mut f = FileData::default();
        f.write(0, &[0; 100]);
        f.sync();
        f.write(0, &[9; 10]);
        assert!(f.flip(50, 0));
        assert!(f.flip(5, 1));
        f.revert();
        assert_eq!(f.read(50, 1), [1]);
        assert_eq!(f.read(5, 1), [2]);
        assert!(!f.flip(100, 0));
    }

    #[test]
    fn power_cut_restores_the_durable_namespace() {
        let mut s = State::new(Durability::Strict, None);
        let owner = (0, 0);
        let a = s.make(ROOT, OsStr::new("a"), false, 0o644, owner).unwrap();
        s.fsyncdir(ROOT).unwrap();
        s.make(ROOT, OsStr::new("b"), false, 0o644, owner).unwrap();
        s.rename((ROOT, OsStr::new("a")), (ROOT, OsStr::new("c")), false)
            .unwrap();
        s.power_cut();
        let names: Vec<_> = s.dir(ROOT).unwrap().entries.keys().cloned().collect();
        assert_eq!(names, ["a"]);
        assert_eq!(s.dir(ROOT).unwrap().entries[OsStr::new("a")], a);
        assert_eq!(s.get(a).unwrap().links, 1);
    }
}
