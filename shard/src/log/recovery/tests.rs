use super::*;
use crate::dedup::IdState;
use crate::log::crc;
use crate::log::record::{encode, DedupEntries, PackedSeqs};
use crate::log::segment_path;

fn msg(seq: u64, id: &str) -> Record<'_> {
    Record::Message {
        seq,
        sender: "s1",
        message_id: id,
        exchange: "e",
        routing_key: "k",
        sent_at_ms: 1,
        body: "{}",
    }
}

/// Writes a v2 file of `records`; returns its bytes and where each
/// record starts.
fn write(path: &Path, records: &[Record<'_>]) -> (Vec<u8>, Vec<usize>) {
    let mut buf = FILE_HEADER.to_vec();
    let mut starts = Vec::new();
    for r in records {
        starts.push(buf.len());
        encode(r, &mut buf);
    }
    fs::write(path, &buf).unwrap();
    (buf, starts)
}

/// Far longer than the tests' message times: every id is remembered.
const WINDOW: u64 = u64::MAX / 4;

fn ids(q: &RecoveredQueue) -> Vec<String> {
    q.read_back()
        .unwrap()
        .iter()
        .map(|m| m.msg.message_id().to_owned())
        .collect()
}

/// The unacked messages read back: (seq, id, deliveries).
fn restored(q: &RecoveredQueue) -> Vec<(u64, String, u32)> {
    q.read_back()
        .unwrap()
        .iter()
        .map(|m| (m.seq, m.msg.message_id().to_owned(), m.deliveries))
        .collect()
}

/// Sequence numbers of `runs`' messages.
fn seqs_of(runs: &[Run]) -> Vec<u64> {
    runs.iter()
        .flat_map(|r| (r.first_seq..=r.last_seq).filter(|s| !r.is_hole(*s)))
        .collect()
}

fn delivered(seq: u64) -> Record<'static> {
    Record::Delivered {
        seq,
        count: 1,
        delivered_at_ms: 2,
    }
}

fn acked(seq: u64, hasher: &DedupHasher, id: &str) -> Record<'static> {
    Record::Ack {
        seq,
        acked_at_ms: 5,
        key: Some(hasher.key("s1", id).0),
    }
}

/// A purge's record takes what it purged out of the backlog after a
/// restart, though their acks (the read-through's) never came: what the
/// purge kept (deliveries owed then) stays, unless a later purge took
/// it, and what came after it stays.
#[test]
fn a_purge_record_keeps_purged_messages_out_of_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let hasher = DedupHasher::random();
    let packed = |seqs: &[u64]| {
        let mut b = Vec::new();
        PackedSeqs::pack(seqs, &mut b);
        b
    };
    let (first_kept, second_kept) = (packed(&[2, 3]), packed(&[2, 7]));
    let ids = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    let mut first: Vec<Record<'_>> = (0..6).map(|s| msg(s, ids[s as usize])).collect();
    first.extend([
        delivered(2),
        delivered(3),
        acked(0, &hasher, "a"),
        Record::Purge {
            upto: 6,
            kept: PackedSeqs::new(&first_kept).unwrap(),
        },
        // The read-through settled 1 before the crash.
        acked(1, &hasher, "b"),
    ]);
    write(&segment_path(dir.path(), 0), &first);
    write(
        &segment_path(dir.path(), 6),
        &[
            msg(6, "g"),
            msg(7, "h"),
            delivered(7),
            // 3 was given back (nacked) by now, 2 is still owed.
            Record::Purge {
                upto: 8,
                kept: PackedSeqs::new(&second_kept).unwrap(),
            },
            msg(8, "i"),
        ],
    );
    let q = recover_queue(dir.path(), &hasher, WINDOW).unwrap();
    let got = restored(&q);
    assert_eq!(
        got,
        [(2, "c".into(), 1), (7, "h".into(), 1), (8, "i".into(), 0)]
    );
    assert_eq!(seqs_of(&q.purged), [3, 4, 5, 6], "purged, not settled yet");
    assert_eq!(q.purged.iter().map(|r| r.count).sum::<u64>(), 4);
    let live: Vec<u64> = q.segments.iter().map(|s| s.live).collect();
    assert_eq!(
        live,
        [4, 3],
        "purged messages hold their segments until settled"
    );
    assert!(q.deliveries.iter().all(|(seq, _)| [2, 7].contains(seq)));
    assert_eq!(q.next_seq, 9);
}

/// A seq handed out whose message record is not on disk (its commit
/// failed, or a crash tore it off) but that a later record names (a purge
/// that reached past it, an ack or a delivery count of it) is never handed
/// out again: the next message would be taken by that purge, or acked by
/// that ack, at the next restart. Found by the simulation (seed 1864).
#[test]
fn seqs_a_record_names_are_never_handed_out_again() {
    let hasher = DedupHasher::random();
    let none = {
        let mut b = Vec::new();
        PackedSeqs::pack(&[], &mut b);
        b
    };
    let cases: [(&str, Record<'_>, u64); 3] = [
        (
            "a purge that reached past the lost message",
            Record::Purge {
                upto: 3,
                kept: PackedSeqs::new(&none).unwrap(),
            },
            3,
        ),
        ("an ack of the lost message", acked(2, &hasher, "c"), 3),
        ("a delivery count of the lost message", delivered(2), 3),
    ];
    for (what, record, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        // Messages 0 and 1 on disk; message 2's record was cut.
        write(
            &segment_path(dir.path(), 0),
            &[msg(0, "a"), msg(1, "b"), record],
        );
        let q = recover_queue(dir.path(), &hasher, WINDOW).unwrap();
        assert_eq!(q.next_seq, want, "{what}");
    }
}

#[test]
fn restores_unacked_in_order_with_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut carried = Vec::new();
    DedupEntries::pack(&[(99, 4)], &mut carried);
    write(
        &segment_path(dir.path(), 0),
        &[
            msg(0, "a"),
            msg(1, "b"),
            Record::Delivered {
                seq: 1,
                count: 2,
                delivered_at_ms: 3,
            },
            Record::Ack {
                seq: 0,
                acked_at_ms: 5,
                key: None,
            },
        ],
    );
    write(
        &segment_path(dir.path(), 2),
        &[
            msg(2, "c"),
            Record::Delivered {
                seq: 2,
                count: 1,
                delivered_at_ms: 3,
            },
            Record::Dedup(DedupEntries::new(&carried).unwrap()),
        ],
    );
    let hasher = DedupHasher::random();
    let mut q = recover_queue(dir.path(), &hasher, WINDOW).unwrap();
    let got = restored(&q);
    assert_eq!(got, [(1, "b".into(), 2), (2, "c".into(), 1)]);
    assert_eq!(q.next_seq, 3);
    q.acked.sort_unstable_by_key(|(_, _, holder)| *holder);
    assert_eq!(q.acked.len(), 2);
    assert_eq!(
        q.acked[0],
        (hasher.key("s1", "a"), 5, 0),
        "acked message 0: an earlier version's ack, with no key, found by its seq"
    );
    assert_eq!(
        q.acked[1],
        (DedupKey(99), 4, 2),
        "carried, held by segment 2"
    );
    let now = Instant::now();
    let state = |id: &str| q.dedup.state(hasher.key("s1", id), now);
    assert_eq!(state("a"), Some(IdState::Acked));
    assert_eq!(state("b"), Some(IdState::Stored));
    assert_eq!(state("c"), Some(IdState::Stored));
    assert_eq!(q.dedup.state(DedupKey(99), now), Some(IdState::Acked));
    assert_eq!(
        q.segments.iter().map(|s| s.live).collect::<Vec<_>>(),
        [1, 1]
    );
    assert!(q.damage.is_empty() && q.torn.is_empty());
}

#[test]
fn the_backlog_is_read_back_in_bounded_batches_in_order_with_counts() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let mut first: Vec<Record<'_>> = (0..6).map(|i| msg(i, &names[i as usize])).collect();
    first.push(Record::Delivered {
        seq: 4,
        count: 3,
        delivered_at_ms: 0,
    });
    write(&segment_path(dir.path(), 0), &first);
    let second: Vec<Record<'_>> = (6..10).map(|i| msg(i, &names[i as usize])).collect();
    write(&segment_path(dir.path(), 6), &second);
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    let batches = |max: usize, max_bytes: usize| {
        let mut reader = q.reader();
        let mut out = Vec::new();
        loop {
            let batch = reader.next_batch(max, max_bytes).unwrap();
            if batch.is_empty() {
                return out;
            }
            out.push(
                batch
                    .iter()
                    .map(|m| (m.msg.message_id().to_owned(), m.deliveries))
                    .collect::<Vec<_>>(),
            );
        }
    };
    let by_count = batches(4, usize::MAX);
    assert_eq!(
        by_count.iter().map(Vec::len).collect::<Vec<_>>(),
        [4, 4, 2],
        "at most 4 a batch, across segments"
    );
    let all: Vec<_> = by_count.into_iter().flatten().collect();
    let expected: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), if i == 4 { 3 } else { 0 }))
        .collect();
    assert_eq!(all, expected, "in order, each with its deliveries");
    // Bodies are 2 bytes: 3 bytes a batch holds one message, and a
    // batch smaller than its first message still holds that one.
    for max_bytes in [3, 1] {
        let by_bytes = batches(usize::MAX, max_bytes);
        assert_eq!(by_bytes.len(), 10);
        assert_eq!(by_bytes.into_iter().flatten().collect::<Vec<_>>(), expected);
    }
}

#[test]
fn a_segment_that_is_not_a_regular_file_stops_recovery_unread() {
    let dir = tempfile::tempdir().unwrap();
    write(&segment_path(dir.path(), 0), &[msg(0, "a")]);
    // Reading this one whole would never end; writing to it would lose data.
    let odd = segment_path(dir.path(), 1);
    std::os::unix::fs::symlink("/dev/zero", &odd).unwrap();
    let err = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap_err();
    let text = err.to_string();
    // A link, whatever it points to, is refused as one.
    assert!(text.contains("a symbolic link (to /dev/zero)"), "{text}");
    assert!(text.contains(&odd.display().to_string()), "{text}");
    // Anything else that is not a regular file.
    fs::remove_file(&odd).unwrap();
    fs::create_dir(&odd).unwrap();
    let err = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("not a regular file"), "{text}");
    assert!(text.contains(&odd.display().to_string()), "{text}");
}

#[test]
fn a_log_file_name_linked_elsewhere_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let queue = dir.path().join("q");
    fs::create_dir(&queue).unwrap();
    write(&segment_path(&queue, 0), &[msg(0, "a")]);
    // Bytes a recovery that followed the link would cut as a torn tail.
    let target = outside.path().join("notes");
    let notes = vec![0u8; 100];
    fs::write(&target, &notes).unwrap();
    for name in [
        "segment-00000000000000000001.log",
        "dedup-00000000000000000001.log",
    ] {
        let link = queue.join(name);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = recover_queue(&queue, &DedupHasher::random(), WINDOW).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
        assert_eq!(fs::read(&target).unwrap(), notes, "{name}");
        fs::remove_file(&link).unwrap();
    }
    // The queue's directory itself as a link.
    let linked = dir.path().join("linked");
    std::os::unix::fs::symlink(&queue, &linked).unwrap();
    let err = recover_queue(&linked, &DedupHasher::random(), WINDOW).unwrap_err();
    assert!(err.to_string().contains("a symbolic link"), "{err}");
    // And the opens themselves never follow one.
    let link = queue.join("segment-00000000000000000002.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = segment::open_options().write(true).open(&link).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
    assert_eq!(fs::read(&target).unwrap(), notes);
}

#[test]
fn quarantine_files_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let (mut buf, starts) = write(&path, &[msg(0, "a"), msg(1, "b")]);
    buf[starts[0] + 5] ^= 0x20;
    fs::write(&path, &buf).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    let kept = q.damage[0].quarantine.clone().unwrap();
    let mode = fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "{mode:o}");
}

#[test]
fn a_file_whose_deletion_was_under_way_is_deleted_unread() {
    let dir = tempfile::tempdir().unwrap();
    // Segment 0 was fully acked and half given back when the broker
    // died: its message's ack was in the half that is gone.
    let freed = segment::freeing_path(&segment_path(dir.path(), 0));
    let (buf, starts) = write(
        &freed,
        &[
            msg(0, "a"),
            Record::Ack {
                seq: 0,
                acked_at_ms: 5,
                key: None,
            },
        ],
    );
    fs::write(&freed, &buf[..starts[1]]).unwrap();
    write(&segment_path(dir.path(), 1), &[msg(1, "b")]);
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    assert_eq!(ids(&q), ["b"], "the acked message does not come back");
    assert!(!freed.exists());
    assert!(q.damage.is_empty() && q.torn.is_empty());
}

#[test]
fn truncates_a_torn_tail_and_appends_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let (buf, starts) = write(&path, &[msg(0, "a"), msg(1, "b")]);
    fs::write(&path, &buf[..buf.len() - 3]).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    assert_eq!(ids(&q), ["a"]);
    assert!(q.damage.is_empty(), "a torn tail is no damage");
    assert_eq!(
        q.torn,
        [(
            path.clone(),
            starts[1] as u64,
            (buf.len() - 3 - starts[1]) as u64
        )]
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), starts[1] as u64);
    assert_eq!(q.segments[0].len, starts[1] as u64);
}

#[test]
fn records_and_damage_across_read_windows_are_found_as_in_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let body = format!("\"{}\"", "x".repeat(3000));
    let names: Vec<String> = (0..4000).map(|i| format!("m{i}")).collect();
    let records: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, id)| Record::Message {
            seq: i as u64,
            sender: "s1",
            message_id: id,
            exchange: "e",
            routing_key: "k",
            sent_at_ms: 1,
            body: &body,
        })
        .collect();
    let (mut buf, starts) = write(&path, &records);
    assert!(buf.len() > 2 * WALK_WINDOW + WALK_WINDOW / 2);
    // Damage in the records that straddle the first two window ends
    // (a length byte, so the walk must look past the window to resync),
    // and a torn tail.
    let straddling = |edge: usize| starts.iter().rposition(|s| *s < edge).unwrap();
    let hit = [straddling(WALK_WINDOW), straddling(2 * WALK_WINDOW)];
    for i in hit {
        buf[starts[i] + 5] ^= 0x40;
    }
    buf.truncate(buf.len() - 100);
    fs::write(&path, &buf).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    let want: Vec<String> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| !hit.contains(i) && *i != names.len() - 1)
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(ids(&q), want);
    let damaged: Vec<_> = q.damage.iter().map(|d| (d.offset, d.bytes)).collect();
    let expect: Vec<_> = hit
        .iter()
        .map(|&i| (starts[i] as u64, (starts[i + 1] - starts[i]) as u64))
        .collect();
    assert_eq!(damaged, expect);
    assert_eq!(q.torn.len(), 1, "the cut last record");
    assert_eq!(q.torn[0].1, starts[names.len() - 1] as u64);
    assert_eq!(q.next_seq, names.len() as u64 - 1);
}

#[test]
fn a_damaged_length_costs_one_record_whose_bytes_are_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let records: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, id)| msg(i as u64, id))
        .collect();
    let (mut buf, starts) = write(&path, &records);
    // One byte of the 4th record's length field.
    buf[starts[3] + 5] ^= 0x40;
    fs::write(&path, &buf).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    assert_eq!(
        ids(&q),
        ["m0", "m1", "m2", "m4", "m5", "m6", "m7", "m8", "m9"]
    );
    assert_eq!(q.damage.len(), 1);
    let d = &q.damage[0];
    assert_eq!(
        (d.offset, d.bytes, d.records),
        (starts[3] as u64, (starts[4] - starts[3]) as u64, 1)
    );
    let saved = d.quarantine.clone().unwrap();
    assert_eq!(fs::read(&saved).unwrap(), &buf[starts[3]..starts[4]]);
    assert!(d.to_string().contains(&path.display().to_string()));
    // Moved out: the next start reads the file clean, nothing lost more.
    let again = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    assert!(again.damage.is_empty(), "{:?}", again.damage);
    assert_eq!(ids(&again), ids(&q));
    assert_eq!(fs::metadata(&path).unwrap().len(), buf.len() as u64);
}

#[test]
fn damage_at_the_end_is_quarantined_not_taken_for_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = segment_path(dir.path(), 0);
    let (mut buf, starts) = write(&path, &[msg(0, "a"), msg(1, "b")]);
    let last = buf.len() - 2;
    buf[last] ^= 0x01;
    fs::write(&path, &buf).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    assert_eq!(ids(&q), ["a"]);
    assert_eq!(q.damage.len(), 1);
    assert!(q.torn.is_empty());
    assert_eq!(q.damage[0].offset, starts[1] as u64);
    assert_eq!(fs::metadata(&path).unwrap().len(), starts[1] as u64);
}

#[test]
fn damage_in_a_dedup_file_costs_only_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = crate::dedup::file::dedup_path(dir.path(), 0);
    let mut one = Vec::new();
    DedupEntries::pack(&[(1, 10)], &mut one);
    let mut two = Vec::new();
    DedupEntries::pack(&[(2, 20)], &mut two);
    let (mut buf, starts) = write(
        &path,
        &[
            Record::Dedup(DedupEntries::new(&one).unwrap()),
            Record::Dedup(DedupEntries::new(&two).unwrap()),
        ],
    );
    buf[starts[0] + 14] ^= 0x01;
    fs::write(&path, &buf).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    let now = Instant::now();
    assert_eq!(q.dedup.state(DedupKey(2), now), Some(IdState::Acked));
    assert_eq!(
        q.dedup.state(DedupKey(1), now),
        None,
        "its record was damaged"
    );
    assert!(q.acked.is_empty(), "a dedup file's ids need no carrying");
    assert_eq!(q.damage.len(), 1);
}

#[test]
fn a_newest_segment_of_an_earlier_version_is_never_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    // A v1 segment with an ack only, named for the next message.
    let path = segment_path(dir.path(), 5);
    let mut v2 = Vec::new();
    encode(
        &Record::Ack {
            seq: 1,
            acked_at_ms: 2,
            key: None,
        },
        &mut v2,
    );
    let body = &v2[12..];
    let mut v1 = (body.len() as u32).to_le_bytes().to_vec();
    v1.extend_from_slice(&crc::crc32c(body).to_le_bytes());
    v1.extend_from_slice(body);
    fs::write(&path, &v1).unwrap();
    let q = recover_queue(dir.path(), &DedupHasher::random(), WINDOW).unwrap();
    assert!(!q.segments[0].appendable);
    assert_eq!(q.next_seq, 6, "the next segment needs a name of its own");
    assert!(q.damage.is_empty());
}
