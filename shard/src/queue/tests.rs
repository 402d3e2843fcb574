use super::*;
use crate::backlog::READAHEAD_MESSAGES;

fn msg(id: &str, sender: &str) -> Arc<Message> {
    Message::new(id, "{}", Arc::from(sender))
}

fn conn(id: u64) -> ConnRef {
    ConnRef { shard: 0, id }
}

fn settings() -> QueueSettings {
    QueueSettings {
        max_len: 3,
        max_deliveries: 2,
        dedup_window: Duration::from_secs(10),
        ack_wait: None,
        dedup_hasher: DedupHasher::random(),
        carry_dedup: true,
        ..QueueSettings::default()
    }
}

#[test]
fn a_fetch_is_bounded_in_count_and_bytes_whatever_it_asks() {
    let s = QueueSettings {
        max_len: 100,
        max_fetch: 5,
        max_fetch_bytes: 10,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    for i in 0..20 {
        q.enqueue(msg(&format!("m{i}"), "s"), now, &s).unwrap();
    }
    let mut out = Vec::new();
    q.fetch(conn(1), u32::MAX, &s, now, &mut out, &mut Vec::new());
    // Bodies are "{}": 2 bytes each, so the byte bound (10) stops it at 5.
    assert_eq!(out.len(), 5);
    let big = QueueSettings {
        max_fetch: 1000,
        max_fetch_bytes: 3,
        ..s.clone()
    };
    out.clear();
    q.fetch(conn(1), u32::MAX, &big, now, &mut out, &mut Vec::new());
    assert_eq!(out.len(), 2, "at least one message, then the byte bound");
}

fn ids(out: &[(ConnRef, Delivery)]) -> Vec<(u64, String, u32)> {
    out.iter()
        .map(|(c, d)| (c.id, d.msg.message_id().to_owned(), d.count))
        .collect()
}

#[test]
fn full_queue_refuses_and_never_evicts() {
    let s = settings();
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    for i in 0..3 {
        assert_eq!(
            q.enqueue(msg(&format!("m{i}"), "s"), now, &s),
            Ok(Enqueued::Stored(i))
        );
    }
    assert_eq!(q.enqueue(msg("m3", "s"), now, &s), Err(QueueFull));
    assert_eq!(q.ready_len(), 3);
}

/// `max_bytes` counts the bodies of every message held, ready or
/// unacked, and frees them on every way out: ack, dead letter, discard.
#[test]
fn the_byte_cap_counts_ready_and_unacked_bodies_and_frees_them_on_the_way_out() {
    let s = QueueSettings {
        max_len: 100,
        // Bodies are "{}": 2 bytes each, so 3 fit.
        max_bytes: 6,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    for id in ["a", "b", "c"] {
        q.enqueue(msg(id, "s"), now, &s).unwrap();
    }
    assert_eq!(q.bytes(), 6);
    assert_eq!(q.enqueue(msg("d", "s"), now, &s), Err(QueueFull));
    // A delivery still holds its bytes; its ack frees them.
    let (mut out, mut dead) = (Vec::new(), Vec::new());
    q.fetch(conn(1), 1, &s, now, &mut out, &mut dead);
    assert_eq!(q.enqueue(msg("d", "s"), now, &s), Err(QueueFull));
    assert!(q.ack(0, conn(1), now, &s));
    assert_eq!(q.bytes(), 4);
    assert_eq!(q.enqueue(msg("d", "s"), now, &s), Ok(Enqueued::Stored(3)));
    // Dead-lettered after max_deliveries (2): nacked twice, then gone.
    for _ in 0..2 {
        out.clear();
        q.fetch(conn(1), 1, &s, now, &mut out, &mut dead);
        assert!(q.requeue(out[0].seq, conn(1), &s, now, &mut dead));
    }
    assert_eq!(dead.len(), 1);
    assert_eq!(q.bytes(), 4);
    // A message whose write failed leaves and frees its bytes.
    assert_eq!(q.discard_unwritten(&[3], &s, &mut Vec::new()), [3]);
    assert_eq!(q.bytes(), 2);
    // A dead letter is never refused, even past the cap.
    let mut dlq = Queue::new(Arc::from("q.dlq"), 0);
    for _ in 0..4 {
        dlq.enqueue_dead(msg("x", "s"));
    }
    assert_eq!(dlq.bytes(), 8);
    // Without a cap (0) only the count is checked.
    let unbounded = QueueSettings { max_bytes: 0, ..s };
    for i in 0..10 {
        q.enqueue(msg(&format!("u{i}"), "s"), now, &unbounded)
            .unwrap();
    }
    assert_eq!(q.bytes(), 22);
}

/// `shard_bytes` caps the bodies of all queues on one meter together:
/// one queue's backlog refuses another's publishes until an ack frees
/// room; dead letters count but are never refused.
#[test]
fn queues_on_one_meter_share_the_shard_byte_cap() {
    let s = QueueSettings {
        max_len: 100,
        // Bodies are "{}": 2 bytes each, so 3 fit on the shard.
        shard_bytes: Some(6),
        ..settings()
    };
    let now = Instant::now();
    let held = HeldBytes::default();
    let mut a = Queue::metered(Arc::from("a"), 0, held.clone(), s.dedup_window);
    let mut b = Queue::metered(Arc::from("b"), 0, held.clone(), s.dedup_window);
    a.enqueue(msg("a1", "s"), now, &s).unwrap();
    a.enqueue(msg("a2", "s"), now, &s).unwrap();
    b.enqueue(msg("b1", "s"), now, &s).unwrap();
    assert_eq!(held.get(), 6);
    assert_eq!(b.enqueue(msg("b2", "s"), now, &s), Err(QueueFull));
    assert_eq!(a.enqueue(msg("a3", "s"), now, &s), Err(QueueFull));
    let mut out = Vec::new();
    a.fetch(conn(1), 1, &s, now, &mut out, &mut Vec::new());
    assert!(a.ack(out[0].seq, conn(1), now, &s));
    assert_eq!(held.get(), 4);
    assert_eq!(b.enqueue(msg("b2", "s"), now, &s), Ok(Enqueued::Stored(1)));
    let mut dlq = Queue::metered(Arc::from("a.dlq"), 0, held.clone(), s.dedup_window);
    dlq.enqueue_dead(msg("x", "s"));
    assert_eq!(held.get(), 8, "a dead letter is taken past the cap");
    // A restored queue's messages are on disk: counted in its bytes,
    // and on the meter only for their ids until read back.
    let mut backlog = DiskBacklog::default();
    backlog.push(0, 0, Framing::V2, 16, 60, 2, 0);
    let restored = Queue::restore(
        Arc::from("c"),
        0,
        held.clone(),
        1,
        backlog,
        DiskBacklog::default(),
        IdSet::new(s.dedup_window),
        &[],
        &s,
        now,
        0,
    );
    assert_eq!((restored.bytes(), held.get()), (2, 8 + ID_BYTES));
    // A queue that goes takes its bodies off the meter.
    drop(restored);
    drop(a);
    assert_eq!(held.get(), 6);
}

#[test]
fn an_unwritten_message_leaves_or_loses_its_id_so_a_retry_is_stored() {
    let s = QueueSettings {
        max_len: 10,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    for id in ["a", "b", "c"] {
        q.enqueue(msg(id, "s"), now, &s).unwrap();
    }
    // "a" was delivered before its write failed; "b" waits; "c" was fine.
    let mut out = Vec::new();
    q.fetch(conn(1), 1, &s, now, &mut out, &mut Vec::new());
    assert_eq!(
        q.discard_unwritten(&[0, 1], &s, &mut Vec::new()),
        [1],
        "only b leaves"
    );
    assert_eq!(q.ready_len(), 1);
    assert_eq!(q.unacked_len(), 1, "a stays owed to its consumer");
    // Both retries are stored again, not answered as duplicates.
    assert_eq!(q.enqueue(msg("a", "s"), now, &s), Ok(Enqueued::Stored(3)));
    assert_eq!(q.enqueue(msg("b", "s"), now, &s), Ok(Enqueued::Stored(4)));
    assert_eq!(q.enqueue(msg("c", "s"), now, &s), Ok(Enqueued::Duplicate));
}

#[test]
fn dedup_is_per_sender_and_outlives_the_ack_for_the_window() {
    let s = settings();
    let t0 = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    assert_eq!(q.enqueue(msg("m1", "s1"), t0, &s), Ok(Enqueued::Stored(0)));
    assert_eq!(q.enqueue(msg("m1", "s1"), t0, &s), Ok(Enqueued::Duplicate));
    assert_eq!(q.enqueue(msg("m1", "s2"), t0, &s), Ok(Enqueued::Stored(1)));
    let mut out = Vec::new();
    q.fetch(conn(1), 1, &s, t0, &mut out, &mut Vec::new());
    assert!(q.ack(out[0].seq, conn(1), t0, &s));
    assert_eq!(
        q.enqueue(msg("m1", "s1"), t0 + Duration::from_secs(5), &s),
        Ok(Enqueued::Duplicate)
    );
    assert_eq!(
        q.enqueue(msg("m1", "s1"), t0 + Duration::from_secs(11), &s),
        Ok(Enqueued::Stored(2))
    );
}

#[test]
fn ack_many_settles_only_the_connections_deliveries_once_each_and_keeps_their_ids() {
    let s = QueueSettings {
        max_len: 10,
        ..settings()
    };
    let t0 = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    for id in ["a", "b", "c", "d"] {
        assert!(matches!(
            q.enqueue(msg(id, "s"), t0, &s),
            Ok(Enqueued::Stored(_))
        ));
    }
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    q.fetch(conn(1), 3, &s, t0, &mut mine, &mut Vec::new());
    q.fetch(conn(2), 1, &s, t0, &mut theirs, &mut Vec::new());
    let seqs = [mine[0].seq, mine[2].seq, mine[0].seq, theirs[0].seq, 99];
    let mut acked = vec![(7, DedupKey(7))];
    q.ack_many(seqs.into_iter(), conn(1), t0, &s, &mut acked);
    // What was there stays; each of conn 1's two acked ids comes once,
    // with the key the log's ack record needs.
    let key = |m: &Arc<Message>| m.dedup_key(&s.dedup_hasher);
    assert_eq!(
        acked,
        [
            (7, DedupKey(7)),
            (mine[0].seq, key(&mine[0].msg)),
            (mine[2].seq, key(&mine[2].msg)),
        ]
    );
    assert_eq!(q.unacked_len(), 2, "conn 1's unacked one and conn 2's stay");
    assert!(!q.ack(mine[0].seq, conn(1), t0, &s), "settled already");
    assert!(
        q.ack(theirs[0].seq, conn(2), t0, &s),
        "not conn 1's to settle"
    );
    // Acked ids are still duplicates within the window, then free again.
    let again = msg(mine[0].msg.message_id(), "s");
    assert_eq!(q.enqueue(again.clone(), t0, &s), Ok(Enqueued::Duplicate));
    assert!(matches!(
        q.enqueue(again, t0 + Duration::from_secs(11), &s),
        Ok(Enqueued::Stored(_))
    ));
}

#[test]
fn acked_deliveries_do_not_keep_their_deadlines() {
    let s = QueueSettings {
        max_len: 1000,
        ack_wait: Some(Duration::from_secs(300)),
        ..settings()
    };
    let mut q = Queue::new(Arc::from("q"), 0);
    let t0 = Instant::now();
    for i in 0..1000 {
        q.enqueue(msg(&format!("m{i}"), "s1"), t0, &s).unwrap();
    }
    let mut out = Vec::new();
    q.fetch(conn(1), 1000, &s, t0, &mut out, &mut Vec::new());
    assert_eq!(q.deadlines_held(), 1000);
    // One stays unacked in the middle: only it and those after it stay.
    for d in out.iter().filter(|d| d.seq != 500) {
        assert!(q.ack(d.seq, conn(1), t0, &s));
    }
    assert_eq!(q.deadlines_held(), 500, "deadlines from the unacked one on");
    // It is still redelivered when its deadline passes.
    let late = t0 + Duration::from_secs(301);
    assert_eq!(q.expire_deliveries(late, &s, &mut Vec::new()), 1);
    assert_eq!(q.deadlines_held(), 0);
}

/// Found by the simulation (seed 1758 of 2,000 at 3,000 steps): a delivery
/// taken back after `ack_wait` left its connection out of the holders a
/// deletion tells, so the connection kept it outstanding; acked after the
/// queue was declared again, it settled the new queue's message of the same
/// seq, which nobody had acked.
#[test]
fn a_connection_whose_delivery_expired_is_told_of_the_deletion_until_it_closes() {
    let s = QueueSettings {
        ack_wait: Some(Duration::from_secs(20)),
        ..settings()
    };
    let mut q = Queue::new(Arc::from("q"), 0);
    let t0 = Instant::now();
    q.enqueue(msg("m", "s1"), t0, &s).unwrap();
    let mut out = Vec::new();
    q.fetch(conn(1), 1, &s, t0, &mut out, &mut Vec::new());
    assert_eq!(q.holders(), vec![(conn(1), false)]);
    let late = t0 + Duration::from_secs(21);
    assert_eq!(q.expire_deliveries(late, &s, &mut Vec::new()), 1);
    assert_eq!(
        q.holders(),
        vec![(conn(1), false)],
        "it still counts the delivery outstanding"
    );
    q.remove_conn(conn(1), &mut Vec::new());
    assert!(q.holders().is_empty(), "closed: nobody to tell");
}

/// The queue's messages, in order, encoded as one segment (with its
/// file header): (bytes, offset of each record).
fn segment_of(q: &Queue) -> (Vec<u8>, Vec<u32>) {
    let mut bytes = crate::log::segment::FILE_HEADER.to_vec();
    let mut offsets = Vec::new();
    for e in &q.ready {
        offsets.push(bytes.len() as u32);
        let route = e.msg.route();
        crate::log::record::encode(
            &crate::log::record::Record::Message {
                seq: e.seq,
                sender: e.msg.sender(),
                message_id: e.msg.message_id(),
                exchange: route.exchange,
                routing_key: route.routing_key,
                sent_at_ms: route.sent_at_ms,
                body: e.msg.body(),
            },
            &mut bytes,
        );
    }
    (bytes, offsets)
}

fn read_back(q: &mut Queue, segment: &[u8]) {
    let read = q.next_read(true).expect("a read is due");
    absorb_read(
        q,
        segment,
        read,
        Instant::now(),
        &settings(),
        &mut Vec::new(),
    );
}

/// Hands `q` what the read `(segment base, offset, length)` of `segment`
/// returns.
fn absorb_read(
    q: &mut Queue,
    segment: &[u8],
    (seg, offset, len): (u64, u64, usize),
    now: Instant,
    s: &QueueSettings,
    purged: &mut Vec<(u64, DedupKey)>,
) {
    let end = (offset as usize + len).min(segment.len());
    q.absorb(
        seg,
        offset,
        len,
        &segment[offset as usize..end],
        now,
        s,
        purged,
    );
}

/// A purge takes the backlog on disk too, even with a read of it in
/// flight (that read then settles purged messages), and a second purge
/// joins the first's read-through; each purged id is settled once, in
/// order, and then stored again only past the window.
#[test]
fn a_purge_reads_its_backlog_through_and_settles_each_id_once() {
    let s = QueueSettings {
        max_len: 10_000,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    let body = format!("\"{}\"", "b".repeat(1000));
    for i in 0..3000 {
        let m = Message::new(&format!("m{i}"), &body, Arc::from("s1"));
        q.enqueue(m, now, &s).unwrap();
    }
    let (segment, offsets) = segment_of(&q);
    let seqs: Vec<u64> = (0..3000).collect();
    q.place(0, 0, &seqs, &offsets);
    assert!(q.spill(u64::MAX, false) > 0);
    // A read in flight when the purge comes.
    let read = q.next_read(true).expect("a read is due");
    let mut purged = Vec::new();
    assert_eq!(q.purge(now), 3000);
    assert!(!q.has_purged_in_memory(), "every body was on disk");
    assert_eq!((q.ready_len(), q.purging_len()), (0, 3000));
    assert!(q.is_reading());
    // Published after the purge: ready at once, not behind it.
    let fresh = Message::new("fresh", &body, Arc::from("s1"));
    q.enqueue(fresh, now, &s).unwrap();
    assert_eq!(q.ready_len(), 1);
    absorb_read(&mut q, &segment, read, now, &s, &mut purged);
    let first = purged.len();
    assert!(first > 0 && first < 3000, "{first}");
    // A second purge: the fresh message now, nothing new on disk.
    let mut second = Vec::new();
    assert_eq!(q.purge(now), 1);
    assert_eq!(q.settle_purged(usize::MAX, now, &s, &mut second), 1);
    assert_eq!(second.len(), 1);
    while q.purging_len() > 0 {
        let read = q.next_read(false).expect("a purge reads without demand");
        absorb_read(&mut q, &segment, read, now, &s, &mut purged);
    }
    assert!(!q.has_disk_work() && !q.is_reading());
    let got: Vec<u64> = purged.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(got, seqs, "each purged message settled once, in order");
    assert_eq!((q.ready_len(), q.bytes(), q.resident_bytes()), (0, 0, 0));
    // Settled as acked: a retry within the window stores nothing; past
    // it, the id is stored again.
    let retry = Message::new("m7", &body, Arc::from("s1"));
    q.enqueue(retry, now, &s).unwrap();
    assert_eq!(q.ready_len(), 0, "a retry within the window");
    let later = now + s.dedup_window + Duration::from_secs(1);
    q.expire_all_dedup(later);
    let retry = Message::new("m7", &body, Arc::from("s1"));
    q.enqueue(retry, later, &s).unwrap();
    assert_eq!(q.ready_len(), 1, "stored again past the window");
}

/// A purge of messages in memory takes them all out of the queue at
/// once, but settles none: that is done in slices of a given size, in
/// order, each id once, the bytes leaving the meter as they go. Ids
/// not settled yet are duplicates still, and new publishes are ready at
/// once.
#[test]
fn a_purge_in_memory_is_settled_in_slices() {
    let s = QueueSettings {
        max_len: 10_000,
        ..settings()
    };
    let now = Instant::now();
    let held = HeldBytes::default();
    let mut q = Queue::metered(Arc::from("q"), 0, held.clone(), s.dedup_window);
    let body = format!("\"{}\"", "b".repeat(100));
    for i in 0..5000 {
        let m = Message::new(&format!("m{i}"), &body, Arc::from("s1"));
        q.enqueue(m, now, &s).unwrap();
    }
    let full = q.bytes();
    assert_eq!(held.get(), full);
    assert_eq!(q.purge(now), 5000);
    assert_eq!(q.ready_len(), 0, "gone for consumers at once");
    assert!(q.has_purged_in_memory());
    assert_eq!(q.bytes(), full, "nothing settled yet");
    // Not settled yet: publishing one of them again is a duplicate.
    q.enqueue(Message::new("m4999", &body, Arc::from("s1")), now, &s)
        .unwrap();
    assert_eq!(q.ready_len(), 0, "a purged id not settled yet");
    q.enqueue(Message::new("fresh", &body, Arc::from("s1")), now, &s)
        .unwrap();
    assert_eq!(q.ready_len(), 1, "a new message is ready at once");
    let mut settled = Vec::new();
    let mut slices = 0;
    while q.has_purged_in_memory() {
        let n = q.settle_purged(2048, now, &s, &mut settled);
        assert!(n <= 2048);
        slices += 1;
    }
    assert_eq!(slices, 3);
    let seqs: Vec<u64> = settled.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..5000).collect::<Vec<u64>>(), "each once, in order");
    let fresh = body.len() as u64;
    assert_eq!(
        (q.bytes(), held.get()),
        (fresh, fresh),
        "only the new one held"
    );
    // Settled as acked: still a duplicate within the window.
    q.enqueue(Message::new("m7", &body, Arc::from("s1")), now, &s)
        .unwrap();
    assert_eq!(q.ready_len(), 1);
    assert_eq!(q.settle_purged(2048, now, &s, &mut settled), 0);
}

#[test]
fn bodies_read_back_go_to_disk_again_but_for_a_read_ahead_batch() {
    let s = QueueSettings {
        max_len: 10_000,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    let body = format!("\"{}\"", "b".repeat(1000));
    let ids: Vec<String> = (0..3000).map(|i| format!("m{i}")).collect();
    for id in &ids {
        let m = Message::new(id, &body, Arc::from("s1"));
        q.enqueue(m, now, &s).unwrap();
    }
    let (segment, offsets) = segment_of(&q);
    let seqs: Vec<u64> = (0..3000).collect();
    q.place(0, 0, &seqs, &offsets);
    assert!(q.spill(u64::MAX, false) > 0);
    assert_eq!((q.ready.len(), q.disk_len()), (0, 3000));
    // Two reads of about 1 MiB each: some 2,000 bodies back in memory.
    read_back(&mut q, &segment);
    read_back(&mut q, &segment);
    let in_memory = q.ready.len();
    assert!(
        in_memory > READAHEAD_MESSAGES && q.disk_len() > 0,
        "{in_memory}"
    );
    let resident = q.resident_bytes();
    let freed = q.spill(u64::MAX, true);
    assert_eq!(
        q.ready.len(),
        READAHEAD_MESSAGES,
        "a read-ahead batch stays"
    );
    assert_eq!(q.resident_bytes(), resident - freed);
    assert_eq!(q.disk_len(), 3000 - READAHEAD_MESSAGES as u64);
    // With nothing on disk yet, keeping the head keeps the same batch.
    let mut fresh = Queue::new(Arc::from("f"), 0);
    for id in &ids {
        fresh
            .enqueue(Message::new(id, &body, Arc::from("s1")), now, &s)
            .unwrap();
    }
    fresh.place(0, 0, &seqs, &offsets);
    assert!(fresh.spill(u64::MAX, true) > 0);
    assert_eq!(
        (fresh.ready.len(), fresh.disk_len()),
        (READAHEAD_MESSAGES, 3000 - READAHEAD_MESSAGES as u64)
    );
    // Consumed and read back again, everything comes in order, once.
    let mut got: Vec<String> = Vec::new();
    loop {
        got.extend(q.ready.drain(..).map(|e| e.msg.message_id().to_owned()));
        if q.disk_len() == 0 {
            break;
        }
        read_back(&mut q, &segment);
    }
    assert_eq!(got, ids);
}

#[test]
fn a_queue_only_consumed_from_ages_its_acked_ids_out() {
    let s = QueueSettings {
        max_len: 100,
        ..settings()
    };
    let mut q = Queue::new(Arc::from("q"), 0);
    let t0 = Instant::now();
    for i in 0..100 {
        q.enqueue(msg(&format!("m{i}"), "s1"), t0, &s).unwrap();
    }
    let mut out = Vec::new();
    q.fetch(conn(1), 100, &s, t0, &mut out, &mut Vec::new());
    for d in &out[..99] {
        assert!(q.ack(d.seq, conn(1), t0, &s));
    }
    assert_eq!(q.remembered_ids(), 100);
    // No publish comes: the last ack, past the window, and the shard's
    // sweeps forget the rest.
    let mut later = t0 + s.dedup_window + Duration::from_secs(1);
    assert!(q.ack(out[99].seq, conn(1), later, &s));
    for _ in 0..5 {
        later += Duration::from_secs(1);
        q.sweep_dedup(later);
    }
    assert_eq!(q.remembered_ids(), 1, "only the id acked last");
    q.expire_all_dedup(later + s.dedup_window + Duration::from_secs(1));
    assert_eq!(q.remembered_ids(), 0);
}

/// A queue with room for 100 messages holding `ids` (from sender
/// "s1"), all delivered to connection 1, unacked.
fn delivered(ids: &[&str]) -> (QueueSettings, Instant, Queue, Vec<Delivery>) {
    let s = QueueSettings {
        max_len: 100,
        ..settings()
    };
    let t0 = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    for id in ids {
        q.enqueue(msg(id, "s1"), t0, &s).unwrap();
    }
    let mut out = Vec::new();
    q.fetch(conn(1), ids.len() as u32, &s, t0, &mut out, &mut Vec::new());
    assert_eq!(out.len(), ids.len());
    (s, t0, q, out)
}

#[test]
fn acked_ids_below_a_deleted_segment_are_carried_once_and_survive_a_restore() {
    let (s, t0, mut q, out) = delivered(&["a", "b", "c"]);
    for d in &out {
        assert!(q.ack(d.seq, conn(1), t0, &s));
    }
    // Segments below seq 2 go: a and b are carried.
    let mut carried = Vec::new();
    assert_eq!(
        q.carry_dedup(2, usize::MAX, t0, 1_000_000, &s, &mut carried),
        2
    );
    assert_eq!(carried.len(), 2);
    // Expiries are kept in 1/16 s, rounded up: the ack time comes back
    // at most 62.5 ms late (the id is remembered that much longer).
    assert!(
        carried
            .iter()
            .all(|(_, at)| (1_000_000..=1_000_063).contains(at)),
        "{carried:?}"
    );
    carried.clear();
    q.carry_dedup(2, usize::MAX, t0, 1_000_000, &s, &mut carried);
    assert!(carried.is_empty(), "each key is carried once");
    // Past the window nothing is carried.
    let later = t0 + Duration::from_secs(11);
    q.carry_dedup(9, usize::MAX, later, 1_011_000, &s, &mut carried);
    assert!(carried.is_empty());

    // A restart within the window: a carried id is still a duplicate.
    let mut ids = IdSet::new(s.dedup_window);
    ids.ack(
        s.dedup_hasher.key("s1", "a"),
        Tick::after_unix_ms(1_000_000, 10_000, t0, 1_004_000),
    );
    let mut r = Queue::restore(
        Arc::from("q"),
        0,
        HeldBytes::default(),
        3,
        DiskBacklog::default(),
        DiskBacklog::default(),
        ids,
        &[],
        &s,
        t0,
        1_004_000,
    );
    assert_eq!(r.enqueue(msg("a", "s1"), t0, &s), Ok(Enqueued::Duplicate));
    assert_eq!(r.enqueue(msg("b", "s1"), t0, &s), Ok(Enqueued::Stored(3)));
}

#[test]
fn acks_out_of_order_are_carried_by_the_segment_holding_their_message() {
    let (s, t0, mut q, out) = delivered(&["a", "b", "c", "d"]);
    for i in [3, 0, 2, 1] {
        assert!(q.ack(out[i].seq, conn(1), t0, &s));
    }
    let key = |id: &str| s.dedup_hasher.key("s1", id);
    let mut carried = Vec::new();
    q.carry_dedup(2, usize::MAX, t0, 1_000_000, &s, &mut carried);
    let keys: Vec<_> = carried.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, [key("a"), key("b")]);
    carried.clear();
    q.carry_dedup(4, usize::MAX, t0, 1_000_000, &s, &mut carried);
    let keys: Vec<_> = carried.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, [key("c"), key("d")]);
}

#[test]
fn a_carry_takes_at_most_its_budget_and_says_how_far_it_got() {
    let (s, t0, mut q, out) = delivered(&["a", "b", "c", "d", "e"]);
    for d in &out {
        assert!(q.ack(d.seq, conn(1), t0, &s));
    }
    let key = |id: &str| s.dedup_hasher.key("s1", id);
    let mut carried = Vec::new();
    let mut take = |budget| {
        carried.clear();
        let upto = q.carry_dedup(4, budget, t0, 1_000_000, &s, &mut carried);
        let keys: Vec<_> = carried.iter().map(|(k, _)| *k).collect();
        (upto, keys)
    };
    // Below 4 only 2 and 3 remain after the first round: the answer
    // is the first sequence number still uncarried.
    assert_eq!(take(2), (2, vec![key("a"), key("b")]));
    assert_eq!(take(2), (4, vec![key("c"), key("d")]));
    assert_eq!(take(2), (4, vec![]), "nothing left below 4");
    assert_eq!(take(0), (4, vec![]));
}

/// A queue with room for 100 messages and two consumers: connection 1
/// at prefetch 1, connection 2 at prefetch 2.
fn two_consumers() -> (QueueSettings, Instant, Queue) {
    let s = QueueSettings {
        max_len: 100,
        ..settings()
    };
    let mut q = Queue::new(Arc::from("q"), 0);
    q.add_consumer(conn(1), 1, u64::MAX);
    q.add_consumer(conn(2), 2, u64::MAX);
    (s, Instant::now(), q)
}

#[test]
fn consumers_compete_round_robin_within_prefetch() {
    let (s, now, mut q) = two_consumers();
    for i in 0..5 {
        q.enqueue(msg(&format!("m{i}"), "s"), now, &s).unwrap();
    }
    let mut out = Vec::new();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(
        ids(&out),
        [
            (1, "m0".into(), 1),
            (2, "m1".into(), 1),
            (2, "m2".into(), 1)
        ]
    );
    assert!(q.ack(out[0].1.seq, conn(1), now, &s));
    assert!(
        !q.ack(out[1].1.seq, conn(1), now, &s),
        "only the receiving connection acks"
    );
    out.clear();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(ids(&out), [(1, "m3".into(), 1)]);
}

#[test]
fn a_consumer_holds_at_most_its_prefetch_in_bytes_and_always_one_message() {
    let s = QueueSettings {
        max_len: 100,
        ..settings()
    };
    let now = Instant::now();
    let body = |n: usize| format!("{{\"b\":\"{}\"}}", "x".repeat(n));
    let mut q = Queue::new(Arc::from("q"), 0);
    // 2,500 bytes at most, 1,000 messages by count.
    q.add_consumer(conn(1), 1_000, 2_500);
    for i in 0..6 {
        let m = Message::new(&format!("m{i}"), &body(1_000), Arc::from("s"));
        q.enqueue(m, now, &s).unwrap();
    }
    let mut out = Vec::new();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(
        out.len(),
        3,
        "1,0xx + 1,0xx stays under 2,500; the third passes it"
    );
    assert!(!q.has_consumer_room());
    assert_eq!(q.full_consumers().map(|c| c.id).collect::<Vec<_>>(), [1]);
    assert!(q.ack(out[0].1.seq, conn(1), now, &s));
    assert!(q.has_consumer_room(), "an ack frees its bytes");
    out.clear();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(ids(&out), [(1, "m3".into(), 1)]);

    // A body larger than the cap still goes, alone.
    let mut q = Queue::new(Arc::from("big"), 0);
    q.add_consumer(conn(1), 1_000, 100);
    for i in 0..2 {
        let m = Message::new(&format!("b{i}"), &body(1_000), Arc::from("s"));
        q.enqueue(m, now, &s).unwrap();
    }
    out.clear();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(ids(&out), [(1, "b0".into(), 1)]);
    let mut dead = Vec::new();
    assert!(q.requeue(out[0].1.seq, conn(1), &s, now, &mut dead));
    out.clear();
    q.dispatch(&s, now, &mut out, &mut dead);
    assert_eq!(
        ids(&out),
        [(1, "b0".into(), 2)],
        "a nack frees its bytes too"
    );
}

#[test]
fn full_consumers_are_named_only_while_messages_wait_for_them() {
    let (s, now, mut q) = two_consumers();
    let full = |q: &Queue| q.full_consumers().map(|c| c.id).collect::<Vec<_>>();
    q.enqueue(msg("m0", "s"), now, &s).unwrap();
    let mut out = Vec::new();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert!(full(&q).is_empty(), "consumer 1 is full, but nothing waits");
    for i in 1..4 {
        q.enqueue(msg(&format!("m{i}"), "s"), now, &s).unwrap();
    }
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(full(&q), [1, 2], "m3 waits for both");
    assert!(q.ack(out[0].1.seq, conn(1), now, &s));
    assert_eq!(full(&q), [2], "consumer 1 has room again");
}

#[test]
fn closed_connection_requeues_in_order_with_counts() {
    let s = QueueSettings {
        max_len: 100,
        max_deliveries: 10,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    q.add_consumer(conn(1), 10, u64::MAX);
    for i in 0..3 {
        q.enqueue(msg(&format!("m{i}"), "s"), now, &s).unwrap();
    }
    let mut out = Vec::new();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(out.len(), 3);
    let mut owed = Vec::new();
    q.remove_conn(conn(1), &mut owed);
    assert_eq!(owed, [0, 1, 2]);
    for &seq in owed.iter().rev() {
        assert!(q.requeue(seq, conn(1), &s, now, &mut Vec::new()));
    }
    assert_eq!(q.unacked_len(), 0);
    q.add_consumer(conn(2), 10, u64::MAX);
    out.clear();
    q.dispatch(&s, now, &mut out, &mut Vec::new());
    assert_eq!(
        ids(&out),
        [
            (2, "m0".into(), 2),
            (2, "m1".into(), 2),
            (2, "m2".into(), 2)
        ]
    );
}

#[test]
fn unacked_past_ack_wait_is_redelivered() {
    let s = QueueSettings {
        max_len: 100,
        max_deliveries: 10,
        ack_wait: Some(Duration::from_secs(5)),
        ..settings()
    };
    let t0 = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    q.enqueue(msg("m0", "s"), t0, &s).unwrap();
    q.enqueue(msg("m1", "s"), t0, &s).unwrap();
    let mut out = Vec::new();
    q.fetch(conn(1), 2, &s, t0, &mut out, &mut Vec::new());
    assert!(q.ack(out[1].seq, conn(1), t0, &s));
    assert_eq!(
        q.expire_deliveries(t0 + Duration::from_secs(4), &s, &mut Vec::new()),
        0
    );
    assert_eq!(
        q.expire_deliveries(t0 + Duration::from_secs(5), &s, &mut Vec::new()),
        1
    );
    let mut again = Vec::new();
    q.fetch(conn(2), 5, &s, t0, &mut again, &mut Vec::new());
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].msg.message_id(), again[0].count), ("m0", 2));
}

#[test]
fn dead_letters_after_max_deliveries() {
    let s = QueueSettings {
        max_len: 100,
        max_deliveries: 2,
        ..settings()
    };
    let now = Instant::now();
    let mut q = Queue::new(Arc::from("q"), 0);
    q.enqueue(msg("m0", "s"), now, &s).unwrap();
    let mut dead = Vec::new();
    for round in 1..=2 {
        let mut out = Vec::new();
        q.fetch(conn(1), 1, &s, now, &mut out, &mut dead);
        assert_eq!(out[0].count, round);
        assert!(q.requeue(out[0].seq, conn(1), &s, now, &mut dead));
    }
    // The second give-back reached max_deliveries: dead-lettered at once.
    assert_eq!(dead.len(), 1);
    let mut out = Vec::new();
    q.fetch(conn(1), 1, &s, now, &mut out, &mut dead);
    assert!(out.is_empty());
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].msg.message_id(), "m0");
    assert_eq!(q.ready_len(), 0);
}
