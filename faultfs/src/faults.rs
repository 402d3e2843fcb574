//! Fault rules and counters: decides, per write or fsync request, whether it
//! fails and with which errno, deterministically for a given sequence of
//! requests.

use std::path::PathBuf;

/// The errors a storage fault can surface as; the broker must answer each
/// (`EIO`: the device failed, `ENOSPC`: it is full, `EACCES`: one file's
/// own trouble, which the rest of the device does not share).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultErrno {
    /// `EIO`.
    Eio,
    /// `ENOSPC`.
    Enospc,
    /// `EACCES`.
    Eacces,
}

impl FaultErrno {
    /// The raw errno, to compare with `io::Error::raw_os_error` in tests.
    pub fn raw(self) -> i32 {
        match self {
            FaultErrno::Eio => libc::EIO,
            FaultErrno::Enospc => libc::ENOSPC,
            FaultErrno::Eacces => libc::EACCES,
        }
    }
}

/// How much more may be written before [`FaultFs::fail_writes_after`]
/// starts failing writes: a device that fills up or dies part-way through.
///
/// [`FaultFs::fail_writes_after`]: crate::FaultFs::fail_writes_after
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBudget {
    /// This many more bytes succeed; a write that would go past fails whole.
    Bytes(u64),
    /// This many more write requests succeed; all later ones fail.
    Writes(u64),
}

/// Which requests seeded random faults may hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOps {
    /// Only `WRITE` requests.
    Writes,
    /// Only file `fsync`/`fdatasync` requests.
    Fsyncs,
    /// Both.
    WritesAndFsyncs,
}

impl FaultOps {
    fn writes(self) -> bool {
        matches!(self, FaultOps::Writes | FaultOps::WritesAndFsyncs)
    }
    fn fsyncs(self) -> bool {
        matches!(self, FaultOps::Fsyncs | FaultOps::WritesAndFsyncs)
    }
}

/// One flipped bit, so a test can tell exactly which stored records were
/// damaged and must be reported lost (and which must not).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BitFlip {
    /// The file, relative to the mount root.
    pub path: PathBuf,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bit in that byte, 0 (least significant) to 7.
    pub bit: u8,
}

/// Counters since mount, so a test can check that its load actually reached
/// the filesystem and that the faults it armed actually fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `WRITE` requests, failed ones included.
    pub writes: u64,
    /// Bytes of successful writes.
    pub bytes_written: u64,
    /// File `fsync`/`fdatasync` requests, failed ones included.
    pub fsyncs: u64,
    /// Directory fsyncs.
    pub fsyncdirs: u64,
    /// Requests failed by an armed fault rule.
    pub injected_faults: u64,
    /// Requests failed with `ENOSPC` because of the capacity limit.
    pub capacity_rejections: u64,
    /// Power cuts so far.
    pub power_cuts: u64,
}

/// A small seeded generator (SplitMix64): enough for reproducible fault
/// placement, and no dependency.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`); the modulo bias is negligible here.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn chance(&mut self, probability: f64) -> bool {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit < probability
    }
}

#[derive(Debug)]
struct Countdown {
    left: u64,
    errno: FaultErrno,
}

impl Countdown {
    /// Counts one request; true on the n-th.
    fn tick(&mut self) -> bool {
        self.left = self.left.saturating_sub(1);
        self.left == 0
    }
}

#[derive(Debug)]
struct Budget {
    budget: WriteBudget,
    spent: u64,
    errno: FaultErrno,
}

#[derive(Debug)]
struct Random {
    rng: Rng,
    probability: f64,
    ops: FaultOps,
    errno: FaultErrno,
}

/// The armed rules. Every rule sees every request it applies to, whether or
/// not another rule fails it, so each rule's timing is independent of the
/// others (and random faults stay reproducible).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    nth_write: Option<Countdown>,
    nth_fsync: Option<Countdown>,
    budget: Option<Budget>,
    random: Option<Random>,
    /// Every write and fsync of a file in a directory of this name fails.
    in_dir: Option<(std::ffi::OsString, FaultErrno)>,
}

impl Faults {
    pub(crate) fn fail_nth_write(&mut self, n: u64, errno: FaultErrno) {
        self.nth_write = Some(Countdown {
            left: n.max(1),
            errno,
        });
    }

    pub(crate) fn fail_nth_fsync(&mut self, n: u64, errno: FaultErrno) {
        self.nth_fsync = Some(Countdown {
            left: n.max(1),
            errno,
        });
    }

    pub(crate) fn fail_writes_after(&mut self, budget: WriteBudget, errno: FaultErrno) {
        self.budget = Some(Budget {
            budget,
            spent: 0,
            errno,
        });
    }

    pub(crate) fn fail_in_dir(&mut self, name: std::ffi::OsString, errno: FaultErrno) {
        self.in_dir = Some((name, errno));
    }

    /// The directory name whose files' writes and fsyncs fail, and how.
    pub(crate) fn in_dir(&self) -> Option<(&std::ffi::OsStr, i32)> {
        self.in_dir
            .as_ref()
            .map(|(name, errno)| (name.as_os_str(), errno.raw()))
    }

    pub(crate) fn random(&mut self, seed: u64, probability: f64, ops: FaultOps, errno: FaultErrno) {
        self.random = Some(Random {
            rng: Rng::new(seed),
            probability,
            ops,
            errno,
        });
    }

    /// Decides the fate of a `WRITE` of `len` bytes: the errno to fail it
    /// with, or `None` to let it through.
    pub(crate) fn on_write(&mut self, len: u64) -> Option<i32> {
        let mut failed = None;
        if let Some(c) = &mut self.nth_write {
            if c.tick() {
                failed = Some(c.errno);
                self.nth_write = None;
            }
        }
        if let Some(r) = &mut self.random {
            if r.ops.writes() && r.rng.chance(r.probability) {
                failed = failed.or(Some(r.errno));
            }
        }
        if let Some(b) = &mut self.budget {
            let over = match b.budget {
                WriteBudget::Bytes(limit) => b.spent.saturating_add(len) > limit,
                WriteBudget::Writes(limit) => b.spent >= limit,
            };
            if over {
                failed = failed.or(Some(b.errno));
            } else if failed.is_none() {
                b.spent += match b.budget {
                    WriteBudget::Bytes(_) => len,
                    WriteBudget::Writes(_) => 1,
                };
            }
        }
        failed.map(FaultErrno::raw)
    }

    /// Decides the fate of a file fsync, as [`Faults::on_write`] does.
    pub(crate) fn on_fsync(&mut self) -> Option<i32> {
        let mut failed = None;
        if let Some(c) = &mut self.nth_fsync {
            if c.tick() {
                failed = Some(c.errno);
                self.nth_fsync = None;
            }
        }
        if let Some(r) = &mut self.random {
            if r.ops.fsyncs() && r.rng.chance(r.probability) {
                failed = failed.or(Some(r.errno));
            }
        }
        failed.map(FaultErrno::raw)
    }
}
