//! `recovery`: a queue directory of arbitrary files, as `recover_queue`
//! finds it at start-up.
//!
//! The input is cut into segment files and perhaps a dedup file (see
//! `ciphermq_fuzz::QueueFiles`: raw bytes, or frame bodies sealed with a
//! length and CRC that check), written to a scratch directory, and recovered
//! twice. Checked besides the absence of panics:
//! - recovery succeeds: the scratch directory is in memory (or at least on a
//!   working disk) and holds only regular files, so an error can only be a
//!   file recovery failed to make sense of;
//! - the second recovery, of the files the first one repaired, finds no new
//!   damage and no torn tail, and reads the same messages (with their
//!   delivery counts), the same purged messages still to settle, the same
//!   acked ids and the same segments and dedup files.
//!
//! "No new damage": a damaged range shorter than a frame header has no
//! padding frame to stand in its place, so it stays in the file and the next
//! start reports it again (see docs/FUZZING.md): as the same damage, or, when
//! the first recovery cut a torn tail right behind it, as damage or a torn
//! tail at the new end of the file, within its bytes. Every byte the second
//! recovery reports must lie in such a range.
//!
//! File lengths and the next sequence number are not compared: a file of an
//! earlier version that held nothing valid is cut to 0 bytes, and the next
//! start takes an empty file for a new one of this version (it writes the
//! file header), so both may differ with nothing read differently.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use ciphermq_fuzz::{QueueFiles, Scratch};
use ciphermq_shard::log::record::HEADER_BYTES;
use ciphermq_shard::log::{recover_queue, RecoveredQueue};
use ciphermq_shard::DedupHasher;
use libfuzzer_sys::fuzz_target;

/// One scratch directory per process, emptied for every input.
static SCRATCH: OnceLock<Scratch> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let files = QueueFiles::parse(data);
    let dir = SCRATCH.get_or_init(Scratch::new).fresh();
    files.write_to(dir).expect("write the input's files");
    // A fixed key: the two recoveries must hash acked ids alike.
    let hasher = DedupHasher::from_bytes([7; 16]);
    let first = match recover_queue(dir, &hasher, u64::MAX / 4) {
        Ok(q) => q,
        Err(e) => panic!("recovery failed: {e}"),
    };
    let second = match recover_queue(dir, &hasher, u64::MAX / 4) {
        Ok(q) => q,
        Err(e) => panic!("recovery of repaired files failed: {e}"),
    };
    for damage in &second.damage {
        assert!(
            left_short(&first, &damage.file, damage.offset, damage.bytes),
            "new damage after repair: {damage:?}\nfirst found: {:?}",
            first.damage
        );
    }
    for (file, offset, bytes) in &second.torn {
        assert!(
            left_short(&first, file, *offset, *bytes),
            "a torn tail after repair: {file:?} at {offset} ({bytes} bytes)\nfirst found: {:?}",
            first.damage
        );
    }
    assert_eq!(
        summary(&first),
        summary(&second),
        "the repair changed what is read"
    );
});

/// Whether `bytes` at `offset` of `file` lie in a damaged range that `first`
/// found and could not overwrite: one shorter than a frame header.
fn left_short(first: &RecoveredQueue, file: &Path, offset: u64, bytes: u64) -> bool {
    first.damage.iter().any(|d| {
        d.file == file
            && d.bytes < HEADER_BYTES as u64
            && d.offset <= offset
            && offset + bytes <= d.offset + d.bytes
    })
}

/// What a recovery read, in a comparable form.
fn summary(q: &RecoveredQueue) -> impl PartialEq + std::fmt::Debug {
    let messages: Vec<(u64, String, u32)> = q
        .read_back()
        .unwrap_or_default()
        .iter()
        .map(|m| (m.seq, m.msg.message_id().to_owned(), m.deliveries))
        .collect();
    let acked: Vec<(u128, u64, u64)> = q
        .acked
        .iter()
        .map(|(k, at, seq)| (k.0, *at, *seq))
        .collect();
    let purged: Vec<(u64, u64, u64, u64)> = q
        .purged
        .iter()
        .map(|r| (r.segment, r.first_seq, r.last_seq, r.count))
        .collect();
    let segments: Vec<(u64, u64)> = q.segments.iter().map(|s| (s.base, s.live)).collect();
    let dedup: Vec<(u64, u64)> = q
        .dedup_files
        .iter()
        .map(|d| (d.number, d.newest_ms))
        .collect();
    (messages, purged, acked, segments, dedup, q.dedup.len())
}
