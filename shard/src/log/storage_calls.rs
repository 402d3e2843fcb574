//! The storage calls a [`CommitJob`] makes, and their order: the one
//! account of it. The broker's committer runs them on real files
//! (`broker/src/storage/committer.rs`) and the seeded simulation on its
//! simulated disk, with faults between any two; so the order the
//! simulation checks against power cuts is the order the broker follows.
//!
//! A job goes through three phases, each a list of calls:
//! 1. [`CommitJob::prepare_calls`], jobs one after another in the round's
//!    order: the queue's directory made, what failed jobs left cut back,
//!    the segment file opened (created, with its header, when new).
//! 2. [`CommitJob::write_calls`], the round's jobs side by side: the dedup
//!    ids carried out of deleted segments written and synced, then the
//!    records, synced when anyone waits for them.
//! 3. [`CommitJob::finish_calls`], after the round's writes: the directory
//!    of a file whose name may not be durable synced, before anything in it
//!    is acknowledged.
//!
//! A call that fails ends its job: the rest of its calls are not made, and
//! the log cuts the file back with a later job (see [`CommitJob::cuts`]).

use std::path::Path;

use super::queue_log::CommitJob;

/// Which bytes a [`StorageCall::Write`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// The job's [`crate::dedup::file::DedupWrite::bytes`], to the dedup
    /// file opened just before.
    DedupIds,
    /// The job's [`CommitJob::bytes`], to its segment file (opened in the
    /// prepare phase).
    Records,
}

/// One storage call of a commit job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageCall<'a> {
    /// Make the queue's directory (0700), then sync its parent. With
    /// `last_level_only` (shared storage) only the queue's own level is
    /// made: a node fenced out of its owner's directory must not make that
    /// directory again.
    MakeDir {
        /// The queue's directory.
        dir: &'a Path,
        /// Make no missing parent.
        last_level_only: bool,
    },
    /// Make the file hold exactly its first `len` bytes (creating it if a
    /// failed job never did; a file cut to its header gets the header
    /// again), and sync it. What lay past `len` was a failed job's, never
    /// acknowledged.
    Cut {
        /// The file.
        path: &'a Path,
        /// Its length afterwards.
        len: u64,
    },
    /// Sync a directory: the names in it become durable.
    SyncDir(&'a Path),
    /// Open a file for writing. With `create` it is new: never made over an
    /// existing file (one found there is moved aside), and it gets the file
    /// header; without, it must exist.
    Open {
        /// The file.
        path: &'a Path,
        /// Create it.
        create: bool,
    },
    /// Write a payload at `offset` of the file last opened for it, then
    /// `fdatasync` the file when `sync`.
    Write {
        /// The file.
        path: &'a Path,
        /// Where the bytes go.
        offset: u64,
        /// Which bytes.
        payload: Payload,
        /// `fdatasync` after the write.
        sync: bool,
    },
}

impl CommitJob {
    /// The calls before the job's writes (phase 1 of the module doc).
    pub fn prepare_calls(&self) -> impl Iterator<Item = StorageCall<'_>> + '_ {
        let make_dir = self.create_dir.then_some(StorageCall::MakeDir {
            dir: &self.dir,
            last_level_only: self.fence.is_some(),
        });
        let cuts = self
            .cuts
            .iter()
            .map(|(path, len)| StorageCall::Cut { path, len: *len });
        // A cut may have made its file anew.
        let cuts_synced = (!self.cuts.is_empty()).then_some(StorageCall::SyncDir(&self.dir));
        // A cut made the file already, header and all.
        let cut_here = self.cuts.iter().any(|(p, _)| *p == self.path);
        let open = StorageCall::Open {
            path: &self.path,
            create: self.create && !cut_here,
        };
        make_dir
            .into_iter()
            .chain(cuts)
            .chain(cuts_synced)
            .chain(std::iter::once(open))
    }

    /// The job's writes (phase 2 of the module doc); `records_len` is the
    /// length of [`CommitJob::bytes`] (committers take the bytes out of the
    /// job to write them).
    pub fn write_calls(&self, records_len: usize) -> impl Iterator<Item = StorageCall<'_>> + '_ {
        // Carried dedup ids must be on disk before the segments they come
        // from are deleted, so they are synced whatever else the job does.
        let dedup = self.dedup_write.iter().flat_map(|w| {
            let cut = w.cut.then_some(StorageCall::Cut {
                path: &w.path,
                len: w.offset,
            });
            let open = StorageCall::Open {
                path: &w.path,
                create: w.create && !w.cut,
            };
            let write = StorageCall::Write {
                path: &w.path,
                offset: w.offset,
                payload: Payload::DedupIds,
                sync: true,
            };
            let named = (w.create || w.cut).then_some(StorageCall::SyncDir(&self.dir));
            cut.into_iter().chain([open, write]).chain(named)
        });
        let sync = self.syncs_records(records_len);
        let records = (records_len > 0 || sync).then_some(StorageCall::Write {
            path: &self.path,
            offset: self.offset,
            payload: Payload::Records,
            sync,
        });
        dedup.chain(records)
    }

    /// The calls after the round's writes and before any answer (phase 3
    /// of the module doc).
    pub fn finish_calls(&self) -> impl Iterator<Item = StorageCall<'_>> + '_ {
        // The new (or recovered) file's name must survive a crash too.
        let name = StorageCall::SyncDir(&self.dir);
        self.sync_dir.then_some(name).into_iter()
    }

    /// Whether the records' write is followed by an `fdatasync`. What
    /// someone waits for, and every message, needs it: a message stored
    /// with nobody waiting (a dead letter, a backlog handed back or
    /// adopted) is the only copy once its old place lets it go. A job of
    /// acks and delivery counts alone may be lost in a crash (the messages
    /// are then redelivered, never lost), and the next sync of the file
    /// covers it anyway. A new file is synced before its name is.
    fn syncs_records(&self, records_len: usize) -> bool {
        (records_len > 0 && (!self.waiters.is_empty() || !self.message_seqs.is_empty()))
            || self.create
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::dedup::file::DedupWrite;

    fn job() -> CommitJob {
        CommitJob {
            queue: Arc::from("q"),
            dir: PathBuf::from("/d/q"),
            create_dir: false,
            fence: None,
            path: PathBuf::from("/d/q/segment-0.log"),
            segment: 0,
            create: false,
            sync_dir: false,
            cuts: Vec::new(),
            offset: 100,
            bytes: crate::log::LogBuf::default(),
            waiters: vec![1],
            message_seqs: vec![0],
            message_offsets: vec![0],
            acks: Vec::new(),
            purges: Vec::new(),
            delete: Vec::new(),
            delete_after_carry: false,
            dedup_write: None,
            dedup_delete: Vec::new(),
        }
    }

    /// Dedup ids carried into a new file at offset 8; `cut`: its last
    /// write failed.
    fn carry(cut: bool) -> DedupWrite {
        DedupWrite {
            path: PathBuf::from("/d/q/dedup-0.ids"),
            create: true,
            cut,
            offset: 8,
            bytes: Arc::new(vec![1, 2, 3]),
        }
    }

    fn path(s: &str) -> &Path {
        Path::new(s)
    }

    /// The write of `job()`'s records at their offset.
    fn records_write(sync: bool) -> StorageCall<'static> {
        StorageCall::Write {
            path: path("/d/q/segment-0.log"),
            offset: 100,
            payload: Payload::Records,
            sync,
        }
    }

    #[test]
    fn an_append_to_an_open_file_is_one_synced_write() {
        let job = job();
        assert_eq!(
            job.prepare_calls().collect::<Vec<_>>(),
            [StorageCall::Open {
                path: path("/d/q/segment-0.log"),
                create: false
            }]
        );
        assert_eq!(
            job.write_calls(10).collect::<Vec<_>>(),
            [records_write(true)]
        );
        assert_eq!(job.finish_calls().count(), 0);
    }

    #[test]
    fn a_message_stored_with_nobody_waiting_is_synced_all_the_same() {
        // A backlog handed back or adopted: its only copy once its old
        // place lets it go.
        let mut job = job();
        job.waiters.clear();
        assert_eq!(
            job.write_calls(10).collect::<Vec<_>>(),
            [records_write(true)]
        );
    }

    #[test]
    fn a_new_queue_makes_its_directory_then_its_file_and_syncs_the_name_last() {
        let mut job = job();
        job.create_dir = true;
        job.create = true;
        job.sync_dir = true;
        assert_eq!(
            job.prepare_calls().collect::<Vec<_>>(),
            [
                StorageCall::MakeDir {
                    dir: path("/d/q"),
                    last_level_only: false
                },
                StorageCall::Open {
                    path: path("/d/q/segment-0.log"),
                    create: true
                }
            ]
        );
        // A new file is synced even with no bytes and nobody waiting.
        job.waiters.clear();
        job.message_seqs.clear();
        assert_eq!(
            job.write_calls(0).collect::<Vec<_>>(),
            [records_write(true)]
        );
        assert_eq!(
            job.finish_calls().collect::<Vec<_>>(),
            [StorageCall::SyncDir(path("/d/q"))]
        );
    }

    #[test]
    fn cuts_come_before_the_open_and_a_cut_file_is_not_created_again() {
        let mut job = job();
        job.create = true;
        job.cuts = vec![
            (PathBuf::from("/d/q/segment-0.log"), 8),
            (PathBuf::from("/d/q/segment-9.log"), 40),
        ];
        assert_eq!(
            job.prepare_calls().collect::<Vec<_>>(),
            [
                StorageCall::Cut {
                    path: path("/d/q/segment-0.log"),
                    len: 8
                },
                StorageCall::Cut {
                    path: path("/d/q/segment-9.log"),
                    len: 40
                },
                StorageCall::SyncDir(path("/d/q")),
                StorageCall::Open {
                    path: path("/d/q/segment-0.log"),
                    create: false
                }
            ]
        );
    }

    #[test]
    fn carried_ids_are_written_and_synced_before_the_records() {
        let mut job = job();
        job.dedup_write = Some(carry(false));
        // Acks alone, nobody waiting: the records are not synced.
        job.waiters.clear();
        job.message_seqs.clear();
        assert_eq!(
            job.write_calls(30).collect::<Vec<_>>(),
            [
                StorageCall::Open {
                    path: path("/d/q/dedup-0.ids"),
                    create: true
                },
                StorageCall::Write {
                    path: path("/d/q/dedup-0.ids"),
                    offset: 8,
                    payload: Payload::DedupIds,
                    sync: true
                },
                StorageCall::SyncDir(path("/d/q")),
                records_write(false)
            ]
        );
        // Nothing to write and nothing to sync: no records call at all.
        assert_eq!(job.write_calls(0).count(), 3);
    }

    #[test]
    fn a_dedup_file_whose_write_failed_is_cut_back_not_created() {
        let mut job = job();
        job.dedup_write = Some(carry(true));
        assert_eq!(
            job.write_calls(0).collect::<Vec<_>>(),
            [
                StorageCall::Cut {
                    path: path("/d/q/dedup-0.ids"),
                    len: 8
                },
                StorageCall::Open {
                    path: path("/d/q/dedup-0.ids"),
                    create: false
                },
                StorageCall::Write {
                    path: path("/d/q/dedup-0.ids"),
                    offset: 8,
                    payload: Payload::DedupIds,
                    sync: true
                },
                StorageCall::SyncDir(path("/d/q")),
            ]
        );
    }
}
