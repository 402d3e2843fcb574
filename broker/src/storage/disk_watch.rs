//! Watches free space on the data directory's filesystem, so a full disk is a
//! state the broker enters early and leaves by itself (docs/PROTOCOL.md,
//! "Storage layout", disk space).
//!
//! Below `storage.min_free_mb` the shards refuse new publishes with
//! `NACK <id> disk_full`, while consumers keep consuming and acking, and
//! spent segments are closed so they can be deleted: the space kept in
//! reserve is what lets acks be written and segments go. Publishing resumes
//! once free space is back above the minimum plus a margin ([`resume_at`]),
//! so the state does not flap at the threshold.
//!
//! The watcher is one thread looking every [`PERIOD`] (`statvfs` is a cheap
//! call, but a blocking one: it never runs on a shard). Shards read its
//! verdict with one relaxed load per publish.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ciphermq_shard::durability::DiskSpace;

use crate::runtime::sys::available_bytes;

/// How often free space is looked at. At a few hundred MB/s of publishes
/// this lets a few tens of MB go by between looks: the minimum must be
/// larger than that (the default is 256 MiB).
pub(crate) const PERIOD: Duration = Duration::from_millis(100);

/// Free bytes at which publishing resumes after a low state: the minimum
/// plus an eighth of it, at least 1 MiB and at most 64 MiB.
pub(crate) fn resume_at(min_free: u64) -> u64 {
    min_free.saturating_add((min_free / 8).clamp(1 << 20, 64 << 20))
}

/// The verdict for `free` bytes given the previous one.
fn is_low(free: u64, min_free: u64, was_low: bool) -> bool {
    if was_low {
        free < resume_at(min_free)
    } else {
        free < min_free
    }
}

/// Looks once (so a broker starting on a full disk refuses publishes from
/// its first one), then keeps looking on a thread of its own until `space`
/// is dropped. `min_free` 0 turns the watermark off.
pub(crate) fn spawn(
    data_dir: PathBuf,
    min_free: u64,
    space: &Arc<DiskSpace>,
) -> std::io::Result<()> {
    if min_free == 0 {
        return Ok(());
    }
    look(&data_dir, min_free, space);
    let space: Weak<DiskSpace> = Arc::downgrade(space);
    std::thread::Builder::new()
        .name("disk-watch".into())
        .spawn(move || {
            while let Some(space) = space.upgrade() {
                look(&data_dir, min_free, &space);
                drop(space);
                std::thread::sleep(PERIOD);
            }
        })?;
    Ok(())
}

/// One look: records free space and logs a change of state.
fn look(data_dir: &Path, min_free: u64, space: &DiskSpace) {
    let free = match available_bytes(data_dir) {
        Ok(free) => free,
        Err(e) => {
            tracing::warn!(data_dir = %data_dir.display(), error = %e, "cannot read free disk space; keeping the last verdict");
            return;
        }
    };
    let low = is_low(free, min_free, space.is_low());
    if space.set(free, low) {
        let mib = |b: u64| b >> 20;
        if low {
            tracing::error!(data_dir = %data_dir.display(), free_mib = mib(free), min_free_mib = mib(min_free), resume_mib = mib(resume_at(min_free)), "disk space low: publishes are answered NACK disk_full until enough is free again; consumers keep draining, acked segments are deleted");
        } else {
            tracing::warn!(data_dir = %data_dir.display(), free_mib = mib(free), "disk space back above the minimum: publishing resumes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_below_the_minimum_until_above_the_margin() {
        let min = 256 << 20;
        assert!(!is_low(min, min, false));
        assert!(is_low(min - 1, min, false));
        assert!(is_low(min + 1, min, true), "inside the margin: still low");
        assert!(!is_low(resume_at(min), min, true));
        assert_eq!(resume_at(min), min + (32 << 20));
        assert_eq!(resume_at(4 << 20), (4 << 20) + (1 << 20), "at least 1 MiB");
        assert_eq!(resume_at(4 << 30), (4 << 30) + (64 << 20), "at most 64 MiB");
    }

    #[test]
    fn looks_at_the_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let space = Arc::new(DiskSpace::new());
        spawn(dir.path().to_owned(), u64::MAX / 2, &space).unwrap();
        assert!(space.is_low(), "no disk has that much free");
        assert!(space.free_bytes() > 0);
        let plenty = Arc::new(DiskSpace::new());
        spawn(dir.path().to_owned(), 1, &plenty).unwrap();
        assert!(!plenty.is_low());
    }
}
