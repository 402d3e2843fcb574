//! Queue directories that the `recovery` fuzz target (fuzz/, docs/FUZZING.md)
//! found recovery mishandling or reporting oddly, each minimised and kept
//! here with what recovery must do with it.

use std::fs;
use std::path::Path;

use ciphermq_shard::dedup::file::dedup_path;
use ciphermq_shard::log::record::{encode, Record};
use ciphermq_shard::log::segment::FILE_HEADER;
use ciphermq_shard::log::{recover_queue, segment_path, RecoveredQueue};
use ciphermq_shard::DedupHasher;

fn recover(dir: &Path) -> RecoveredQueue {
    recover_queue(dir, &DedupHasher::from_bytes([7; 16]), u64::MAX / 4).expect("recovery")
}

fn ids(q: &RecoveredQueue) -> Vec<(u64, String)> {
    q.read_back()
        .expect("read back")
        .iter()
        .map(|m| (m.seq, m.msg.message_id().to_owned()))
        .collect()
}

/// A message frame as the broker writes it.
fn message(seq: u64, id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode(
        &Record::Message {
            seq,
            sender: "s1",
            message_id: id,
            exchange: "e",
            routing_key: "k",
            sent_at_ms: 1,
            body: "{}",
        },
        &mut out,
    );
    out
}

/// Fuzz crash: a file shorter than the file header but holding a sync marker
/// (so taken for v2 frames behind a damaged header) made recovery slice the
/// header past the end of the file and panic, stopping the broker's start.
#[test]
fn a_file_shorter_than_its_header_with_a_sync_marker_is_repaired() {
    for bytes in [
        &b"\xff\x43\x4d\xfe"[..],
        b"\x01\xff\x43\x4d\xfe",
        b"CipherMQ\xff\x43\x4d\xfe\x00",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 0);
        fs::write(&path, bytes).unwrap();
        let q = recover(dir.path());
        assert!(q.message_count() == 0 && q.torn.is_empty());
        assert_eq!(q.damage.len(), 1, "{bytes:?}: {:?}", q.damage);
        let d = &q.damage[0];
        assert_eq!((d.offset, d.bytes), (0, bytes.len() as u64));
        assert_eq!(d.why, "damaged file header");
        assert_eq!(fs::read(d.quarantine.as_ref().unwrap()).unwrap(), bytes);
        // The header is written whole: a new, empty segment of this version.
        assert_eq!(fs::read(&path).unwrap(), FILE_HEADER);
        assert!(q.segments[0].appendable);
        let again = recover(dir.path());
        assert!(again.damage.is_empty() && again.torn.is_empty());
    }
}

/// Fuzz finding: a damaged range shorter than a frame header (here 2 bytes
/// between the file header and a record) has no padding frame to stand in
/// its place, so it stays in the file and every start reports it again. It
/// must cost nothing more: the record after it is read each time, and no
/// other damage appears.
#[test]
fn damage_too_short_to_pad_is_reported_again_and_costs_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let data = [&FILE_HEADER[..], b"\x73\x01", &message(0, "a")].concat();
    fs::write(&path, &data).unwrap();
    let first = recover(dir.path());
    assert_eq!(ids(&first), [(0, "a".to_owned())]);
    let short: Vec<_> = first.damage.iter().map(|d| (d.offset, d.bytes)).collect();
    assert_eq!(short, [(16, 2)]);
    let second = recover(dir.path());
    assert_eq!(second.damage, first.damage);
    assert_eq!(ids(&second), ids(&first));
    assert_eq!(fs::read(&path).unwrap(), data, "the file is left as it was");
}

/// Fuzz finding (minimised): a short damaged range right before a torn tail.
/// The first start reports the range and cuts the tail; what is left of the
/// range is then at the end of the file, and the next starts report and cut
/// it (a sync marker in it can make that take two starts), never a byte
/// outside it. After that the file is clean and just its header.
#[test]
fn short_damage_before_a_torn_tail_is_cut_in_later_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dedup_path(dir.path(), 67);
    let tail = b"\x73\xff\x43\x4d\xfe\x00\x26\x00\xff\x43\x4d\xfe\x00\x72";
    fs::write(&path, [&FILE_HEADER[..], tail].concat()).unwrap();
    let first = recover(dir.path());
    let damage: Vec<_> = first.damage.iter().map(|d| (d.offset, d.bytes)).collect();
    assert_eq!(damage, [(16, 8)]);
    assert_eq!(first.torn, [(path.clone(), 24, 6)]);
    let mut starts = 1;
    loop {
        let q = recover(dir.path());
        assert!(q.acked.is_empty());
        if q.damage.is_empty() && q.torn.is_empty() {
            break;
        }
        let reported = q
            .damage
            .iter()
            .map(|d| (d.offset, d.bytes))
            .chain(q.torn.iter().map(|(_, offset, bytes)| (*offset, *bytes)));
        for (offset, bytes) in reported {
            assert!(
                offset >= 16 && offset + bytes <= 24,
                "start {starts}: {offset}+{bytes} outside the first damage"
            );
        }
        starts += 1;
        assert!(starts <= 3, "still reporting after {starts} starts");
    }
    assert_eq!(fs::read(&path).unwrap(), FILE_HEADER);
}

/// Fuzz finding: a file of an earlier version (no header, no sync marker)
/// with nothing valid in it is quarantined and cut to 0 bytes; the next
/// start takes the empty file for a new one of this version and writes its
/// header. Neither start reads anything, and the second finds no damage.
#[test]
fn an_earlier_version_file_with_nothing_valid_is_emptied_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let garbage = b"\x05\x00\x00\x00not a frame at all, and no marker";
    fs::write(&path, garbage).unwrap();
    let first = recover(dir.path());
    assert_eq!(first.message_count(), 0);
    assert_eq!(first.damage.len(), 1);
    assert_eq!(first.damage[0].bytes, garbage.len() as u64);
    assert_eq!(fs::metadata(&path).unwrap().len(), 0);
    assert!(!first.segments[0].appendable);
    let second = recover(dir.path());
    assert_eq!(second.message_count(), 0);
    assert!(second.damage.is_empty() && second.torn.is_empty());
    assert_eq!(fs::read(&path).unwrap(), FILE_HEADER);
}

/// Fuzz crash (minimised): a valid message record with seq `u64::MAX` made
/// the next sequence number overflow (a panic where overflow is checked, a
/// wrap to 0 elsewhere). The message is read, and the next number stops at
/// the top.
#[test]
fn a_message_with_the_largest_seq_does_not_overflow_the_next_seq() {
    let dir = tempfile::tempdir().unwrap();
    let data = [&FILE_HEADER[..], &message(u64::MAX, "m")].concat();
    fs::write(segment_path(dir.path(), 125), data).unwrap();
    let q = recover(dir.path());
    assert_eq!(ids(&q), [(u64::MAX, "m".to_owned())]);
    assert_eq!(q.next_seq, u64::MAX);
    assert!(q.damage.is_empty() && q.torn.is_empty());
}
