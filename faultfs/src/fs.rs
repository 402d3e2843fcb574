//! FUSE glue: turns kernel requests into `State` calls and their results into
//! replies. No caching anywhere: zero TTLs and direct I/O, so what a process
//! sees after a power cut is what `State` holds.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::state::{Body, Inode, Res, State};

/// Attributes and entries expire at once: a power cut must be visible to the
/// very next `stat` or path lookup.
const TTL: Duration = Duration::ZERO;
/// Reads and writes bypass the page cache: no stale pages after a power cut,
/// and every `write(2)` reaches the filesystem before it returns.
const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_DIRECT_IO;
/// Block size reported by `stat` and `statvfs`.
const BLOCK: u64 = 4096;
/// Capacity reported while none is set (1 TiB).
const UNLIMITED: u64 = 1 << 40;
/// Inode count reported by `statvfs`.
const MAX_INODES: u64 = 1 << 24;

/// The filesystem as fuser sees it: a view of the shared state.
pub(crate) struct FaultFilesystem {
    pub(crate) state: Arc<Mutex<State>>,
}

/// Locks the state; a panic in another holder leaves it usable (each
/// operation leaves it consistent before anything can panic).
pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn attr(ino: u64, inode: &Inode) -> FileAttr {
    let (kind, size, nlink) = match &inode.body {
        Body::File(f) => (FileType::RegularFile, f.len(), inode.links),
        Body::Dir(_) => (FileType::Directory, BLOCK, 2),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: inode.atime,
        mtime: inode.mtime,
        ctime: inode.ctime,
        crtime: inode.crtime,
        kind,
        perm: inode.perm,
        nlink,
        uid: inode.uid,
        gid: inode.gid,
        rdev: 0,
        blksize: BLOCK as u32,
        flags: 0,
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

fn empty(reply: ReplyEmpty, result: Res<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl FaultFilesystem {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Replies with the entry of a just looked-up or made inode.
    fn entry(st: &State, ino: Res<u64>, reply: ReplyEntry) {
        match ino.and_then(|ino| Ok(attr(ino, st.get(ino)?))) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn make(&self, req: &Request, parent: INodeNo, name: &OsStr, dir: bool, mode: u32) -> Res<u64> {
        let perm = (mode & 0o7777) as u16;
        self.lock()
            .make(parent.0, name, dir, perm, (req.uid(), req.gid()))
    }
}

impl Filesystem for FaultFilesystem {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock();
        let ino = st.lookup(parent.0, name);
        Self::entry(&st, ino, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.lock().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().get(ino.0) {
            Ok(inode) => reply.attr(&TTL, &attr(ino.0, inode)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock();
        let result = (|| -> Res<FileAttr> {
            if let Some(size) = size {
                st.set_size(ino.0, fh.map(|f| f.0), size)?;
            }
            let inode = st.get_mut(ino.0)?;
            if let Some(mode) = mode {
                inode.perm = (mode & 0o7777) as u16;
            }
            if let Some(uid) = uid {
                inode.uid = uid;
            }
            if let Some(gid) = gid {
                inode.gid = gid;
            }
            if let Some(t) = atime {
                inode.atime = time(t);
            }
            if let Some(t) = mtime {
                inode.mtime = time(t);
            }
            inode.ctime = ctime.unwrap_or_else(SystemTime::now);
            Ok(attr(ino.0, inode))
        })();
        match result {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let ino = self.make(req, parent, name, false, mode & !umask);
        Self::entry(&self.lock(), ino, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let ino = self.make(req, parent, name, true, mode & !umask);
        Self::entry(&self.lock(), ino, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.lock().remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.lock().remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let result = self
            .lock()
            .rename((parent.0, name), (newparent.0, newname), noreplace);
        empty(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), OPEN_FLAGS),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self.make(req, parent, name, false, mode & !umask);
        let mut st = self.lock();
        let result = made.and_then(|ino| Ok((attr(ino, st.get(ino)?), st.open(ino)?)));
        match result {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), FileHandle(fh), OPEN_FLAGS),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock().read(fh.0, offset, size) {
            Ok(data) => reply.data(data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock().write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.lock().fsync(fh.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let st = self.lock();
        let dir = match st.dir(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [(ino.0, "."), (dir.parent, "..")];
        let dots = dots
            .iter()
            .map(|&(i, n)| (i, FileType::Directory, OsStr::new(n)));
        let children = dir.entries.iter().map(|(name, &child)| {
            let kind = match st.get(child).map(|i| &i.body) {
                Ok(Body::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            (child, kind, name.as_os_str())
        });
        for (i, (child, kind, name)) in dots.chain(children).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.lock().fsyncdir(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.lock();
        let capacity = st.capacity.unwrap_or(UNLIMITED);
        let free = capacity.saturating_sub(st.used()) / BLOCK;
        let files_free = MAX_INODES.saturating_sub(st.inode_count());
        reply.statfs(
            capacity / BLOCK,
            free,
            free,
            MAX_INODES,
            files_free,
            BLOCK as u32,
            255,
            BLOCK as u32,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.lock().fallocate(fh.0, offset, length, mode));
    }
}
