//! A fault-injecting, in-memory FUSE filesystem for crash and storage-fault
//! tests: a test mounts it on a temporary directory, runs the real broker
//! with its data directory inside, kills the broker, calls
//! [`FaultFs::power_cut`], restarts it and checks what survived.
//!
//! # Map
//! - `mount`: [`FaultFs`], the handle a test holds: mounting, unmounting on
//!   drop, and every control (power cut, faults, capacity, bit flips,
//!   counters).
//! - `state`: the in-memory tree and the durability model below.
//! - `faults`: the fault rules (n-th write or fsync, write budget, seeded
//!   random faults) and the counters.
//! - `fs`: the FUSE glue: kernel requests to `state` calls.
//!
//! # Durability model
//! Each regular file has *current* content (what reads return) and *durable*
//! content (what survives a power cut). Each directory has *current* entries
//! and *durable* entries.
//! - `write`, `truncate` and `fallocate` change only current content.
//! - `fsync`/`fdatasync` of a file makes its current content and size durable.
//!   It does not make the file's name durable.
//! - `create`, `mkdir`, `rename`, `unlink` and `rmdir` change only current
//!   entries. `fsync` of a directory (`fsyncdir`) makes that directory's
//!   current entries durable: all of them, and only that directory's. A rename
//!   between two directories is therefore durable in each directory on its own:
//!   syncing only the target leaves the name in both after a power cut (the
//!   same file, twice).
//! - [`FaultFs::power_cut`] reverts every file to its durable content and every
//!   directory to its durable entries. Only what is reachable from the root
//!   through durable entries remains: a file created in a directory that was
//!   never fsynced afterwards disappears, an unsynced rename is undone, an
//!   unsynced unlink comes back. File handles opened before the cut are dead
//!   afterwards: every operation through them fails with `EIO`.
//! - Metadata other than sizes and names (mode, owner, times) is not modelled:
//!   it survives a power cut as it is.
//! - [`Durability::Lenient`] instead makes every `fsync` and `fsyncdir` commit
//!   the whole namespace (every directory), which is roughly what a journaling
//!   filesystem such as ext4 does in practice. [`Durability::Strict`] is the
//!   default.
//!
//! # Faults
//! - An injected write fault fails the whole `WRITE` request and changes
//!   nothing. One request is one `write(2)` call of at most the kernel's
//!   `max_write` (1 MiB by default); a larger call is split, so it can fail
//!   part-way with a short write.
//! - An injected fsync fault reverts that file to its durable content at once
//!   (its unsynced changes are dropped, as a kernel may drop dirty pages after
//!   a failed writeback): the next read sees the old data. The file may get
//!   shorter under an open descriptor: write at explicit offsets (or cut the
//!   file back) afterwards, as `O_APPEND` may use the kernel's stale size.
//! - With a capacity set, a write, truncate or fallocate that would grow the
//!   files held (current sizes of linked or open files) past it fails with
//!   `ENOSPC`; `statvfs` reports the capacity and what is left of it.
//! - Bit flips change stored content in place, current and durable alike, so
//!   they survive power cuts; nothing reports them to the reader.
//!
//! Files are opened in direct-I/O mode and attributes and entries are not
//! cached by the kernel, so every read and `stat` after a power cut sees the
//! reverted state (the kernel therefore refuses shared memory maps of them).

#![warn(missing_docs)]

use std::path::PathBuf;

mod faults;
mod fs;
mod mount;
mod state;

pub use faults::{BitFlip, FaultErrno, FaultOps, Stats, WriteBudget};
pub use mount::{check_fuse_available, skip_requested, FaultFs, MountOptions, SKIP_ENV};
pub use state::Durability;

/// What can go wrong when driving the filesystem from a test; each variant
/// names the cause so a failing test says why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// FUSE cannot be mounted on this machine; the text says what is missing.
    #[error("FUSE is unavailable: {0}")]
    Unavailable(String),
    /// The mount itself failed.
    #[error("mounting a FUSE filesystem on {path}: {source}")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// The error from the kernel or from fuser.
        source: std::io::Error,
    },
    /// The unmount failed; the filesystem may still be mounted.
    #[error("unmounting {path}: {source}")]
    Unmount {
        /// The mountpoint.
        path: PathBuf,
        /// The error from umount2(2).
        source: std::io::Error,
    },
    /// No file or directory has this path (relative to the mount root).
    #[error("{0}: no such file in the fault-injecting filesystem")]
    NotFound(PathBuf),
    /// The path names a directory where a regular file is needed.
    #[error("{0}: not a regular file")]
    NotAFile(PathBuf),
    /// The offset is past the end of both the current and the durable content.
    #[error("{path}: offset {offset} is past the end of its stored content")]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// The offset asked for.
        offset: u64,
    },
    /// A byte has bits 0 to 7 only.
    #[error("bit {0} does not exist in a byte (0..=7)")]
    BadBit(u8),
    /// Fewer bits are stored in the matching files than were asked to flip.
    #[error("{requested} bit flips requested but the matching files hold only {available} bits")]
    NotEnoughData {
        /// Flips asked for.
        requested: usize,
        /// Bits held by the files that passed the filter.
        available: u64,
    },
}
