//! A log file as the committer appends to it: the block-aligned middle of
//! each large write goes around the page cache (`O_DIRECT`), the unaligned
//! ends and small writes through it.
//!
//! A buffered write copies every byte into the page cache, and `fdatasync`
//! then writes the pages out. On a virtual machine whose memory the host
//! backs lazily, each fresh page-cache page also costs the host a fault:
//! there the kernel's copy was the broker's largest single cost when
//! publishing (44% of its CPU at 16 KiB bodies, 30% at 1 KiB;
//! docs/DECISIONS.md). A direct write hands the device the broker's own
//! (reused) buffer instead: paired, a third more publishes a second at
//! 16 KiB and 8% more with a consumer at 1 KiB; publishing 1 KiB alone
//! into pages the host already backs, about even.
//!
//! Direct writes must start and end on a block boundary, from block-aligned
//! memory. A commit job starts where the last one ended, mid-block, so the
//! bytes up to the first boundary and after the last one are written
//! through the page cache as before (at most two pages a job), and the
//! aligned middle is written directly: from the job's own memory, which the
//! shard lays out so that the middle starts on an aligned address
//! (`ciphermq_shard::log::log_buf`), or, where it is not, copied into a
//! reused aligned buffer first. The file's bytes are the same either way;
//! nothing is padded.
//! The `fdatasync` that follows covers both (it is per file, not per
//! descriptor). Where the file system refuses `O_DIRECT` (tmpfs, some FUSE
//! file systems) or the first direct write is refused, every write goes
//! through the page cache, as it always did.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The alignment of a direct write's offset, length and memory: the block
/// the shard lays a job's bytes out by, so a laid-out middle needs no copy.
const ALIGN: usize = ciphermq_shard::log::log_buf::BLOCK;
/// Bytes copied and written directly per call, at most: the aligned buffer
/// each blocking-I/O thread keeps (a round is rarely larger).
const CHUNK: usize = 1 << 20;
/// The smallest aligned middle written directly. A direct write waits for
/// the device inside the write, where a buffered one leaves it all to the
/// `fdatasync` after: for a small job that is latency for no copy worth
/// saving (a window of 100 with a consumer, jobs of about 130 KB, lost 6%
/// to direct writes), while the copies direct writes save are the large
/// jobs' of a fast publisher.
const DIRECT_MIN: usize = 256 << 10;

thread_local! {
    /// The aligned buffer of this thread's direct writes, kept: a buffer
    /// made per write would be fresh memory each time, the very cost
    /// direct writes avoid.
    static ALIGNED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// Bytes this thread copied for direct writes, for the tests.
    static COPIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A log or dedup file open for the committer's appends.
#[derive(Debug)]
pub(crate) struct LogFile {
    /// Through the page cache: the unaligned ends, syncs, and everything
    /// when direct writes are not possible.
    file: File,
    /// The same file opened with `O_DIRECT`, where the file system allows.
    direct: Option<File>,
    /// Direct writes still work (cleared by the first refusal).
    direct_ok: AtomicBool,
}

impl LogFile {
    /// Wraps `file`, which is open at `path`, opening `path` a second time
    /// with `O_DIRECT` where the file system allows it. The second
    /// descriptor is kept only if it is the same file (never through a
    /// symbolic link: `O_NOFOLLOW`).
    pub(crate) fn new(file: File, path: &Path) -> LogFile {
        let direct = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECT)
            .open(path)
            .ok()
            .filter(|d| same_file(&file, d));
        LogFile {
            file,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
        }
    }

    /// A file written through the page cache only.
    #[cfg(test)]
    pub(crate) fn buffered(file: File) -> LogFile {
        LogFile {
            file,
            direct: None,
            direct_ok: AtomicBool::new(false),
        }
    }

    /// Whether its aligned middles are written directly (so far).
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some() && self.direct_ok.load(Ordering::Relaxed)
    }

    /// Writes all of `bytes` at `offset` (see the module doc).
    pub(crate) fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let direct = match &self.direct {
            Some(d) if self.direct_ok.load(Ordering::Relaxed) => d,
            _ => return self.file.write_all_at(bytes, offset),
        };
        let (head, middle) = aligned_middle(offset, bytes.len());
        if middle < DIRECT_MIN {
            return self.file.write_all_at(bytes, offset);
        }
        self.file.write_all_at(&bytes[..head], offset)?;
        let end = head + middle;
        if bytes[head..].as_ptr().align_offset(ALIGN) == 0 {
            self.write_direct(direct, &bytes[head..end], offset + head as u64)?;
        } else {
            self.copy_direct(direct, &bytes[head..end], offset + head as u64)?;
        }
        self.file.write_all_at(&bytes[end..], offset + end as u64)
    }

    /// Writes `middle` (whole blocks, at an aligned `offset`, from aligned
    /// memory) directly; where the file system refuses, through the page
    /// cache, from then on.
    fn write_direct(&self, direct: &File, middle: &[u8], offset: u64) -> io::Result<()> {
        match direct.write_all_at(middle, offset) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.refused(&e);
                self.file.write_all_at(middle, offset)
            }
            other => other,
        }
    }

    /// Writes `middle` (whole blocks, at an aligned `offset`) directly,
    /// through this thread's aligned buffer, a chunk at a time.
    fn copy_direct(&self, direct: &File, middle: &[u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        ALIGNED.with(|cell| -> io::Result<()> {
            let mut buf = cell.borrow_mut();
            if buf.len() < CHUNK + ALIGN {
                buf.resize(CHUNK + ALIGN, 0);
            }
            let skip = buf.as_ptr().align_offset(ALIGN);
            let aligned = &mut buf[skip..skip + CHUNK];
            while done < middle.len() {
                let n = (middle.len() - done).min(CHUNK);
                aligned[..n].copy_from_slice(&middle[done..done + n]);
                #[cfg(test)]
                COPIED.with(|c| c.set(c.get() + n));
                match direct.write_all_at(&aligned[..n], offset + done as u64) {
                    // Nothing of it was written: the file system takes no
                    // direct writes after all. The rest goes buffered.
                    Err(e) if done == 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                        self.refused(&e);
                        return self.file.write_all_at(middle, offset);
                    }
                    other => other?,
                }
                done += n;
            }
            Ok(())
        })
    }

    fn refused(&self, e: &io::Error) {
        self.direct_ok.store(false, Ordering::Relaxed);
        tracing::info!(error = %e, "direct writes refused; log writes go through the page cache");
    }

    /// `fdatasync`: makes every byte written durable, by either descriptor.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

fn same_file(a: &File, b: &File) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// For `len` bytes at `offset`: how many come before the first block
/// boundary, and how many whole blocks follow it (in bytes).
fn aligned_middle(offset: u64, len: usize) -> (usize, usize) {
    let into = (offset % ALIGN as u64) as usize;
    let head = if into == 0 { 0 } else { ALIGN - into };
    if head >= len {
        return (len, 0);
    }
    let middle = (len - head) / ALIGN * ALIGN;
    (head, middle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciphermq_shard::log::log_buf::{LogBuf, LAID_OUT_MIN};

    /// Whether the file system of `path` lets it be opened for direct writes.
    fn takes_direct(path: &Path) -> bool {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .is_ok()
    }

    #[test]
    fn the_middle_is_whole_blocks_between_the_unaligned_ends() {
        assert_eq!(aligned_middle(0, 10_000), (0, 8192));
        assert_eq!(aligned_middle(100, 10_000), (3996, 4096));
        assert_eq!(aligned_middle(4096, 4096), (0, 4096));
        assert_eq!(aligned_middle(100, 3000), (3000, 0), "within one block");
        assert_eq!(aligned_middle(4000, 4200), (96, 4096));
        assert_eq!(aligned_middle(4000, 4100), (96, 0));
    }

    /// `bytes` as the shard hands them over: laid out for `offset`
    /// (`laid_out`), or wherever the allocator put them.
    fn job_bytes(bytes: &[u8], offset: u64, laid_out: bool) -> LogBuf {
        let mut buf = LogBuf::default();
        buf.reserve(bytes.len().max(LAID_OUT_MIN));
        if laid_out {
            buf.lay_out_for(offset);
        } else {
            // A lead that puts the file's blocks on unaligned addresses.
            buf.lay_out_for(offset + 8);
        }
        buf.appender().extend_from_slice(bytes);
        buf
    }

    /// Appends of every size, each starting where the last ended, leave
    /// the file holding exactly the bytes written, and on this file system
    /// (the test directory's: a real disk) the middles of [`DIRECT_MIN`]
    /// or more went direct: from the job's memory where the shard laid it
    /// out for its offset, through the aligned buffer where not.
    #[test]
    fn appends_of_any_size_leave_exactly_the_bytes_written() {
        let dir = std::env::temp_dir().join(format!("log-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("seg.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let log = LogFile::new(file, &path);
        let direct_here = log.is_direct();
        // Where the file system takes O_DIRECT (the test directory is on a
        // real disk here), the direct path is the one tested.
        let takes_direct = takes_direct(&path);
        assert_eq!(
            direct_here, takes_direct,
            "direct writes used where possible"
        );
        let mut expected = Vec::new();
        let mut seed = 7u64;
        let (mut copied, mut direct_in_place) = (0, 0);
        for round in 0..300 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Sizes from a few bytes to past a chunk, so every case occurs.
            let len = match round % 5 {
                0 => (seed >> 40) as usize % 100,
                1 => (seed >> 40) as usize % 9000,
                2 => 4096,
                3 => (seed >> 40) as usize % 300_000,
                _ => CHUNK + (seed >> 40) as usize % 10_000,
            };
            let bytes: Vec<u8> = (0..len).map(|i| (i as u64 ^ seed) as u8).collect();
            let offset = expected.len() as u64;
            let laid_out = (seed >> 20).is_multiple_of(2);
            let job = job_bytes(&bytes, offset, laid_out);
            let before = COPIED.with(|c| c.get());
            log.write_all_at(&job, offset).unwrap();
            let now_copied = COPIED.with(|c| c.get()) - before;
            let middle = aligned_middle(offset, len).1;
            if direct_here && middle >= DIRECT_MIN {
                if laid_out {
                    assert_eq!(now_copied, 0, "laid out: written from its own memory");
                    direct_in_place += 1;
                } else {
                    assert_eq!(now_copied, middle, "not laid out: the middle copied");
                    copied += 1;
                }
            } else {
                assert_eq!(now_copied, 0, "nothing written directly, nothing copied");
            }
            expected.extend_from_slice(&bytes);
        }
        log.sync_data().unwrap();
        assert_eq!(log.is_direct(), direct_here, "no direct write was refused");
        if direct_here {
            assert!(
                copied > 10 && direct_in_place > 10,
                "{copied} / {direct_in_place}"
            );
        }
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "the file holds exactly the bytes written");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_written_buffered_only_holds_the_same() {
        let dir = std::env::temp_dir().join(format!("log-file-b-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("seg.log");
        let file = std::fs::File::create(&path).unwrap();
        let log = LogFile::buffered(file);
        assert!(!log.is_direct());
        log.write_all_at(&[1u8; 10_000], 0).unwrap();
        log.write_all_at(&[2u8; 5], 10_000).unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 10_005);
        assert!(got[..10_000].iter().all(|&b| b == 1) && got[10_000..] == [2u8; 5]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What was synced survives a power cut, whichever path its bytes took,
    /// and what was not is not taken for synced: on the fault-injecting
    /// file system, which keeps only what an `fdatasync` covered.
    #[test]
    fn synced_appends_survive_a_power_cut_and_unsynced_ones_do_not() {
        use ciphermq_faultfs::{skip_requested, FaultFs};
        if skip_requested() {
            return;
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let fs = FaultFs::mount(dir.path()).expect("mount the fault-injecting file system");
        let path = fs.path().join("seg.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .unwrap();
        let log = LogFile::new(file, &path);
        std::fs::File::open(fs.path()).unwrap().sync_all().unwrap();
        let mut synced = Vec::new();
        for (i, len) in [100usize, 10_000, 4096, 300_000, 7, 400_000]
            .into_iter()
            .enumerate()
        {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let offset = synced.len() as u64;
            log.write_all_at(&job_bytes(&bytes, offset, i % 2 == 1), offset)
                .unwrap();
            synced.extend_from_slice(&bytes);
        }
        log.sync_data().unwrap();
        // Rounds written and never synced, large enough to go direct, from
        // the job's memory and copied: no ACK would have left for them.
        for laid_out in [true, false] {
            let offset = (synced.len() + usize::from(!laid_out) * (DIRECT_MIN + 50_000)) as u64;
            let unsynced = job_bytes(&vec![0xee; DIRECT_MIN + 50_000], offset, laid_out);
            log.write_all_at(&unsynced, offset).unwrap();
        }
        let takes_direct = takes_direct(&path);
        assert_eq!(
            log.is_direct(),
            takes_direct,
            "the direct path is the one tested"
        );
        drop(log);
        fs.power_cut();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), synced.len(), "the unsynced round is gone");
        assert!(got == synced, "every synced byte is there");
    }
}
