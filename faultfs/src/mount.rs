//! The handle a test holds: mounts the filesystem on a directory, serves it
//! from a background thread, exposes every control, and unmounts on drop so
//! that no test leaves a stale mount behind.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, MountOption, SessionACL};

use crate::faults::{BitFlip, FaultErrno, FaultOps, Stats, WriteBudget};
use crate::fs::{lock, FaultFilesystem};
use crate::state::{Durability, State};
use crate::Error;

/// The environment variable that turns FUSE tests into skips on machines
/// without FUSE (`CIPHERMQ_SKIP_FUSE=1`); unset, such tests must fail loudly.
pub const SKIP_ENV: &str = "CIPHERMQ_SKIP_FUSE";

/// True when [`SKIP_ENV`] is `1`: the one place tests ask whether a missing
/// FUSE is acceptable, so every suite skips (or fails) alike.
pub fn skip_requested() -> bool {
    std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1")
}

/// Whether this machine can mount the filesystem, and if not, why, in words
/// a test failure can show: the device, and root or the setuid helper.
pub fn check_fuse_available() -> Result<(), Error> {
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        return Err(Error::Unavailable(
            "/dev/fuse is missing: load the fuse kernel module (modprobe fuse) \
             or give the container the device"
                .into(),
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(dev) {
        return Err(Error::Unavailable(format!(
            "/dev/fuse cannot be opened: {e}"
        )));
    }
    if !is_root() && !helper_installed() {
        return Err(Error::Unavailable(
            "not running as root (needed to mount without a helper) and no fusermount3 \
             on PATH (install the fuse3 package)"
                .into(),
        ));
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn helper_installed() -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path)
        .any(|dir| dir.join("fusermount3").is_file() || dir.join("fusermount").is_file())
}

/// How to mount; the defaults are the strict model and no capacity limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MountOptions {
    /// What an fsync makes durable; see [`Durability`].
    pub durability: Durability,
    /// Bytes the files may hold in all; `None` for no limit. Can be changed
    /// later with [`FaultFs::set_capacity`].
    pub capacity: Option<u64>,
}

/// A mounted fault-injecting filesystem. Dropping it unmounts it (lazily if
/// a process still uses it).
///
/// The filesystem is served by a thread of this process: the process using
/// the files (the broker) should be another one. The mount is made with
/// mount(2) directly, without the `fusermount3` helper, so there is no
/// auto-unmount: if this process is killed outright (not a panic: drop runs
/// then), the mount is left behind as a dead entry whose accesses fail with
/// `ENOTCONN` (no hang) until `umount -l` on it.
#[derive(Debug)]
pub struct FaultFs {
    mountpoint: PathBuf,
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

impl FaultFs {
    /// Mounts an empty filesystem on `mountpoint` (an existing directory)
    /// with the default [`MountOptions`].
    pub fn mount(mountpoint: impl AsRef<Path>) -> Result<FaultFs, Error> {
        FaultFs::mount_with(mountpoint, MountOptions::default())
    }

    /// Mounts an empty filesystem on `mountpoint` with `options`. It is ready
    /// when this returns.
    pub fn mount_with(
        mountpoint: impl AsRef<Path>,
        options: MountOptions,
    ) -> Result<FaultFs, Error> {
        check_fuse_available()?;
        let given = mountpoint.as_ref();
        let mount_err = |source| Error::Mount {
            path: given.to_path_buf(),
            source,
        };
        let mountpoint = given.canonicalize().map_err(mount_err)?;
        let state = Arc::new(Mutex::new(State::new(options.durability, options.capacity)));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("ciphermq-faultfs".into()),
            MountOption::Subtype("faultfs".into()),
            MountOption::DefaultPermissions,
        ];
        // allow_other lets processes of other users in (permissions are still
        // checked); only root may ask for it without /etc/fuse.conf changes.
        config.acl = if is_root() {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        let fs = FaultFilesystem {
            state: state.clone(),
        };
        let session = fuser::spawn_mount(fs, &mountpoint, &config).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound && !helper_installed() {
                Error::Unavailable(format!(
                    "mount(2) was refused (no CAP_SYS_ADMIN?) and fusermount3 is not \
                     installed to fall back on: {e}"
                ))
            } else {
                mount_err(e)
            }
        })?;
        Ok(FaultFs {
            mountpoint,
            state,
            session: Some(session),
        })
    }

    /// The mount root (canonical), under which the broker's data directory goes.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Simulates losing power and rebooting: files revert to their durable
    /// content, directories to their durable entries (see the crate docs),
    /// and handles opened before are dead (`EIO`).
    ///
    /// Call it only after killing and reaping every process using the
    /// filesystem: a live process would see its files change under it. Once
    /// reaped, nothing of a process can land after the cut (the kernel does
    /// not let a process finish dying while the filesystem still serves one
    /// of its requests, and releases its handles on its own). A process left
    /// running by mistake cannot write into the new state either: its
    /// handles from before the cut fail with `EIO`.
    pub fn power_cut(&self) {
        self.state().power_cut();
    }

    /// Makes the current state durable, as if every file and directory had
    /// been fsynced: a baseline for a test, e.g. after creating the broker's
    /// data directory (which, made by a plain `mkdir` whose parent is never
    /// fsynced, would vanish at the first strict power cut).
    pub fn make_all_durable(&self) {
        self.state().sync_all();
    }

    /// Fails the `n`-th `WRITE` request from now (1 = the next) with `errno`,
    /// once. Replaces an earlier `fail_nth_write`.
    pub fn fail_nth_write(&self, n: u64, errno: FaultErrno) {
        self.state().faults.fail_nth_write(n, errno);
    }

    /// Fails the `n`-th file fsync from now (1 = the next) with `errno`, once;
    /// that file's unsynced changes are dropped. Replaces an earlier one.
    pub fn fail_nth_fsync(&self, n: u64, errno: FaultErrno) {
        self.state().faults.fail_nth_fsync(n, errno);
    }

    /// Lets `budget` more be written, then fails every write past it with
    /// `errno` until [`FaultFs::clear_faults`].
    pub fn fail_writes_after(&self, budget: WriteBudget, errno: FaultErrno) {
        self.state().faults.fail_writes_after(budget, errno);
    }

    /// Fails every write and fsync of a file in a directory named `name`
    /// (one queue's, say) with `errno`, until [`FaultFs::clear_faults`]:
    /// a fault of some files that the rest of the device does not share.
    pub fn fail_in_dir(&self, name: impl Into<std::ffi::OsString>, errno: FaultErrno) {
        self.state().faults.fail_in_dir(name.into(), errno);
    }

    /// Fails each request of kind `ops` with `probability` (0.0 to 1.0),
    /// drawn from a generator seeded with `seed`: the same requests in the
    /// same order fail the same way for the same seed.
    pub fn random_faults(&self, seed: u64, probability: f64, ops: FaultOps, errno: FaultErrno) {
        self.state().faults.random(seed, probability, ops, errno);
    }

    /// Disarms every fault rule (not the capacity).
    pub fn clear_faults(&self) {
        self.state().faults = Default::default();
    }

    /// Limits what the files may hold in all to `bytes` (`None`: no limit).
    /// Growth past it fails with `ENOSPC`; `statvfs` reports it.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state().capacity = bytes;
    }

    /// Bytes the files hold now, as counted against the capacity.
    pub fn used_bytes(&self) -> u64 {
        self.state().used()
    }

    /// Flips bit `bit` (0..=7) of the byte at `offset` of the file at `path`
    /// (relative to the mount root, or absolute under it), in its current
    /// and its durable content: silent corruption of stored data.
    pub fn flip_bit(&self, path: impl AsRef<Path>, offset: u64, bit: u8) -> Result<(), Error> {
        let mountpoint = self.mountpoint.as_path();
        self.state()
            .flip_bit(mountpoint, path.as_ref(), offset, bit)
    }

    /// Flips `count` distinct bits chosen with a generator seeded by `seed`,
    /// uniformly over the bytes of the regular files whose path (relative to
    /// the mount root) passes `filter`; returns them sorted, so a test can
    /// tell which records were damaged.
    pub fn flip_random_bits(
        &self,
        seed: u64,
        count: usize,
        filter: impl Fn(&Path) -> bool,
    ) -> Result<Vec<BitFlip>, Error> {
        self.state().flip_random_bits(seed, count, &filter)
    }

    /// The counters since mount.
    pub fn stats(&self) -> Stats {
        self.state().stats
    }

    /// Unmounts now and reports a failure (dropping the handle does the same
    /// but can only print it).
    pub fn unmount(mut self) -> Result<(), Error> {
        self.detach()
    }

    /// Unmounts. If a process still uses the filesystem the unmount is lazy:
    /// the mountpoint is free at once, and the serving thread ends when the
    /// last user lets go.
    fn detach(&mut self) -> Result<(), Error> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let unmount_err = |source| Error::Unmount {
            path: self.mountpoint.clone(),
            source,
        };
        let path = CString::new(self.mountpoint.as_os_str().as_bytes())
            .map_err(|e| unmount_err(std::io::Error::other(e)))?;
        let umount = |flags| {
            // SAFETY: `path` is a valid NUL-terminated string.
            if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        let mut lazy = false;
        if let Err(e) = umount(0) {
            match e.raw_os_error() {
                Some(libc::EBUSY) => {
                    if let Err(e) = umount(libc::MNT_DETACH) {
                        self.session = Some(session);
                        return Err(unmount_err(e));
                    }
                    lazy = true;
                }
                // Not mounted any more (someone unmounted it): nothing to do.
                Some(libc::EINVAL) => {}
                // Not root: fuser unmounts through fusermount when dropped.
                Some(libc::EPERM) => return Ok(()),
                _ => {
                    self.session = Some(session);
                    return Err(unmount_err(e));
                }
            }
        }
        if !lazy {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !session.guard.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if session.guard.is_finished() {
                // The session's own result says nothing more once unmounted.
                let _ = session.join();
            }
        }
        Ok(())
    }
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            eprintln!("ciphermq-faultfs: {e}");
        }
    }
}
