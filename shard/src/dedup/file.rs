//! Dedup entries carried out of deleted segments, in their own files.
//!
//! When fully acked segments are deleted, the ids acked within the dedup
//! window whose messages were in them must outlive them, or a retry after a
//! restart would store a second copy. They are appended (once each) to
//! `{queue_dir}/dedup-{n:020}.log`, in the segment record format (dedup
//! records only), written and synced before the segments go. A file is
//! deleted once every entry in it is past the window; a new file starts every
//! quarter window, so none lives much longer than the window.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dedup::DedupKey;
use crate::log::record::{encode_dedup, DEDUP_ENTRY_BYTES, HEADER_BYTES};
use crate::log::segment::FILE_HEADER_BYTES;

/// A dedup file found by recovery.
#[derive(Debug, Clone)]
pub struct RecoveredDedupFile {
    /// Its number in the name.
    pub number: u64,
    /// The file.
    pub path: PathBuf,
    /// Its valid length.
    pub len: u64,
    /// The newest ack time in it (Unix ms).
    pub newest_ms: u64,
}

/// The dedup file of `number` in `dir`.
pub fn dedup_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("dedup-{number:020}.log"))
}

/// The number of a dedup file name, if it is one.
pub fn dedup_number(file_name: &str) -> Option<u64> {
    file_name
        .strip_prefix("dedup-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// Bytes to append to a dedup file, as part of a commit job.
#[derive(Debug)]
pub struct DedupWrite {
    /// The file.
    pub path: PathBuf,
    /// It is new: create it (never over an existing file), write the file
    /// header, and sync the directory.
    pub create: bool,
    /// The last write to it failed: cut it back to `offset` first (it may
    /// not even exist), then sync the directory too.
    pub cut: bool,
    /// Where the bytes go.
    pub offset: u64,
    /// Encoded dedup records, shared with the write: a deleted segment's
    /// carry is megabytes, and the job keeps them to send again if the
    /// write fails.
    pub bytes: Arc<Vec<u8>>,
}

#[derive(Debug)]
struct DedupFile {
    path: PathBuf,
    len: u64,
    newest_ms: u64,
    opened_ms: u64,
    created: bool,
}

/// One queue's dedup files, without I/O.
#[derive(Debug)]
pub(crate) struct DedupFiles {
    dir: PathBuf,
    roll_bytes: u64,
    /// Oldest first; the last one takes new entries.
    files: VecDeque<DedupFile>,
    pending: Vec<u8>,
    pending_newest_ms: u64,
    /// Files of an earlier run: new entries go to a new file.
    adopted: bool,
    /// The last write failed: the next cuts the file back first (no holes,
    /// and no new file per failure).
    cut: bool,
    /// The number the next new file takes: never one a file had before,
    /// even one just expired, whose deletion the same job carries out
    /// after its write (reusing it deleted the new file's entries).
    next_number: u64,
}

impl DedupFiles {
    pub(crate) fn new(dir: PathBuf, roll_bytes: u64) -> DedupFiles {
        DedupFiles {
            dir,
            roll_bytes,
            files: VecDeque::new(),
            pending: Vec::new(),
            pending_newest_ms: 0,
            adopted: false,
            cut: false,
            next_number: 0,
        }
    }

    /// Continues from the files recovery found (new entries go to a new file).
    pub(crate) fn adopt(&mut self, found: &[RecoveredDedupFile]) {
        for f in found {
            self.next_number = self.next_number.max(f.number + 1);
            self.files.push_back(DedupFile {
                path: f.path.clone(),
                len: f.len,
                newest_ms: f.newest_ms,
                opened_ms: 0,
                created: true,
            });
        }
        self.adopted = true;
    }

    pub(crate) fn append(&mut self, entries: &[(DedupKey, u64)]) {
        // Chunks well below the record size limit, each packed straight
        // into `pending` (room for a whole carry is made by `reserve`).
        const PER_RECORD: usize = 1 << 16;
        for chunk in entries.chunks(PER_RECORD) {
            encode_dedup(chunk.iter().map(|(k, at)| (k.0, *at)), &mut self.pending);
            let newest = chunk.iter().map(|(_, at)| *at).max().unwrap_or(0);
            self.pending_newest_ms = self.pending_newest_ms.max(newest);
        }
    }

    /// Makes room in the pending bytes for `entries` more, appended over
    /// several rounds: grown a round at a time instead, a segment's carry
    /// copied its bytes and faulted fresh pages in at each doubling.
    pub(crate) fn reserve(&mut self, entries: usize) {
        // A record per round, and rounds take thousands of entries each:
        // one header per 1,024 entries is room to spare.
        self.pending
            .reserve(entries * DEDUP_ENTRY_BYTES + (entries / 1024 + 1) * HEADER_BYTES);
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether some file is entirely past the window.
    pub(crate) fn has_expired(&self, now_ms: u64, window_ms: u64) -> bool {
        self.files
            .iter()
            .any(|f| f.newest_ms.saturating_add(window_ms) < now_ms)
    }

    /// The write of what is pending (if anything, and if `write_pending`:
    /// else it stays pending for a later job), and the files to delete.
    pub(crate) fn take(
        &mut self,
        now_ms: u64,
        window_ms: u64,
        write_pending: bool,
    ) -> (Option<DedupWrite>, Vec<PathBuf>) {
        let writing = write_pending && !self.pending.is_empty();
        let mut delete = Vec::new();
        // The last file takes what is pending, now or in a later job (a held
        // carry, a failed write to be cut back there): expired or not, it
        // stays until then.
        let keep_last = !self.pending.is_empty() && !self.adopted;
        let n = self.files.len();
        let mut kept = VecDeque::with_capacity(n);
        for (i, f) in std::mem::take(&mut self.files).into_iter().enumerate() {
            let last = i + 1 == n;
            let expired = f.newest_ms.saturating_add(window_ms) < now_ms;
            if expired && !(last && keep_last) {
                if f.created {
                    delete.push(f.path);
                }
            } else {
                kept.push_back(f);
            }
        }
        self.files = kept;
        if !writing {
            return (None, delete);
        }
        let roll = self.adopted
            || (!self.cut
                && self.files.back().is_none_or(|f| {
                    f.len >= self.roll_bytes || now_ms.saturating_sub(f.opened_ms) > window_ms / 4
                }));
        if roll {
            let number = self.next_number;
            self.next_number += 1;
            self.files.push_back(DedupFile {
                path: dedup_path(&self.dir, number),
                len: FILE_HEADER_BYTES,
                newest_ms: 0,
                opened_ms: now_ms,
                created: false,
            });
            self.adopted = false;
            self.cut = false;
        }
        let Some(file) = self.files.back_mut() else {
            return (None, delete);
        };
        let bytes = Arc::new(std::mem::take(&mut self.pending));
        let write = DedupWrite {
            path: file.path.clone(),
            create: !file.created,
            cut: std::mem::take(&mut self.cut),
            offset: file.len,
            bytes,
        };
        file.created = true;
        file.len += write.bytes.len() as u64;
        file.newest_ms = file.newest_ms.max(self.pending_newest_ms);
        self.pending_newest_ms = 0;
        (Some(write), delete)
    }

    /// The job carrying `write` ended. A failed write is taken back: the
    /// file is cut back to where it began, and its entries go out again with
    /// the next write.
    pub(crate) fn done(&mut self, write: &DedupWrite, ok: bool) {
        if ok {
            return;
        }
        if let Some(file) = self.files.iter_mut().find(|f| f.path == write.path) {
            file.len = write.offset;
            self.cut = true;
        }
        let mut pending = write.bytes.to_vec();
        pending.append(&mut self.pending);
        self.pending = pending;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An adopted file whose entries have all expired is deleted by the
    /// same job that writes the new entries: the new file must not take its
    /// number (the write would displace it and the deletion then remove the
    /// new entries: a restart forgot a whole segment's acked ids).
    #[test]
    fn a_new_file_never_takes_the_number_of_one_being_deleted() {
        let mut files = DedupFiles::new(PathBuf::from("/d/q"), 1 << 20);
        files.adopt(&[RecoveredDedupFile {
            number: 0,
            path: dedup_path(Path::new("/d/q"), 0),
            len: FILE_HEADER_BYTES,
            newest_ms: 0,
        }]);
        files.append(&[(DedupKey(7), 1_000_000)]);
        let (write, delete) = files.take(1_000_000, 120_000, true);
        let write = write.expect("the pending entries are written");
        assert_eq!(
            delete,
            [dedup_path(Path::new("/d/q"), 0)],
            "the expired file goes"
        );
        assert!(write.create);
        assert_ne!(write.path, delete[0], "the new entries go to a new number");
        assert_eq!(write.path, dedup_path(Path::new("/d/q"), 1));
    }

    #[test]
    fn a_reserved_carry_is_appended_over_rounds_without_growing_again() {
        let mut d = DedupFiles::new(PathBuf::from("/q"), 1 << 20);
        d.reserve(10_000);
        let capacity = d.pending.capacity();
        for round in 0..10u64 {
            let entries: Vec<_> = (0..1_000u64)
                .map(|i| (DedupKey(u128::from(round * 1_000 + i)), 1_000))
                .collect();
            d.append(&entries);
        }
        assert_eq!(
            d.pending.len(),
            10_000 * DEDUP_ENTRY_BYTES + 10 * HEADER_BYTES
        );
        assert_eq!(
            d.pending.capacity(),
            capacity,
            "grown after the reservation"
        );
    }

    #[test]
    fn entries_go_to_files_that_roll_and_expire_after_the_window() {
        let mut d = DedupFiles::new(PathBuf::from("/q"), 1 << 20);
        d.append(&[(DedupKey(1), 1_000)]);
        let (w, del) = d.take(1_000, 40_000, true);
        let w = w.unwrap();
        assert!(w.create && w.offset == FILE_HEADER_BYTES && del.is_empty());
        assert!(w.path.ends_with("dedup-00000000000000000000.log"));
        d.append(&[(DedupKey(2), 2_000)]);
        let (w2, _) = d.take(2_000, 40_000, true);
        let w2 = w2.unwrap();
        assert!(
            !w2.create && w2.offset == FILE_HEADER_BYTES + w.bytes.len() as u64,
            "same file"
        );
        // A quarter window later a new file starts.
        d.append(&[(DedupKey(3), 12_000)]);
        let (w3, _) = d.take(12_001, 40_000, true);
        assert!(w3.unwrap().path.ends_with("dedup-00000000000000000001.log"));
        // The first file goes once its newest entry (2,000) is past the window.
        assert!(!d.has_expired(42_000, 40_000));
        assert!(d.has_expired(42_001, 40_000));
        let (none, del) = d.take(42_001, 40_000, true);
        assert!(none.is_none());
        assert_eq!(
            del,
            vec![PathBuf::from("/q/dedup-00000000000000000000.log")]
        );
    }

    #[test]
    fn a_failed_write_held_past_the_window_is_still_retried_in_its_file() {
        let mut d = DedupFiles::new(PathBuf::from("/q"), 1 << 20);
        d.append(&[(DedupKey(1), 1_000)]);
        let (w, _) = d.take(1_000, 40_000, true);
        let w = w.unwrap();
        d.done(&w, false);
        // A carry holds the retry until its window has passed: the file it
        // must be cut back in stays.
        let (none, del) = d.take(50_000, 40_000, false);
        assert!(none.is_none() && del.is_empty(), "{del:?}");
        let (again, _) = d.take(50_001, 40_000, true);
        let again = again.expect("the entries go out again");
        assert_eq!(again.path, w.path);
        assert!(again.cut && again.offset == w.offset);
    }

    #[test]
    fn a_failed_write_is_cut_back_and_retried_in_the_same_file() {
        let mut d = DedupFiles::new(PathBuf::from("/q"), 1 << 20);
        d.append(&[(DedupKey(1), 1_000)]);
        let (w, _) = d.take(1_000, 40_000, true);
        let w = w.unwrap();
        d.done(&w, false);
        assert!(d.has_pending(), "the entries go out again");
        let (again, _) = d.take(1_001, 40_000, true);
        let again = again.unwrap();
        assert_eq!(again.path, w.path, "no new file per failure");
        assert!(again.cut && again.offset == w.offset && again.bytes == w.bytes);
        d.done(&again, true);
        d.append(&[(DedupKey(2), 1_002)]);
        let (next, _) = d.take(1_002, 40_000, true);
        let next = next.unwrap();
        assert!(!next.cut && next.offset == w.offset + w.bytes.len() as u64);
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(dedup_number("dedup-00000000000000000042.log"), Some(42));
        assert_eq!(dedup_number("segment-00000000000000000042.log"), None);
    }
}
