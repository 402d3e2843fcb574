//! The metadata mirror tails the queue logs into `message_metadata`: every
//! stored copy exactly once with its times, the watermark committed with the
//! rows, catching up after its connections are killed, and resuming from
//! the watermark after a restart.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use ciphermq_pgbridge::PgBridge;
use ciphermq_shard::log::{queue_dir, MirrorWatermarks};
use common::{sent_ms, wait_until, LogWriter, TestDb};

const AES: [u8; 32] = [7u8; 32];

/// Asserts `queue` has exactly the rows `0..n`, each once.
fn assert_every_row_once(db: &TestDb, queue: &str, n: i64) {
    let row = &db.query(
        "SELECT count(*), count(DISTINCT log_seq), coalesce(min(log_seq), -1), coalesce(max(log_seq), -1)
         FROM message_metadata WHERE queue = $1",
        &[&queue],
    )[0];
    let (count, distinct, min, max): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(
        (count, distinct, min, max),
        (n, n, 0, n - 1),
        "queue {queue}: rows (count, distinct, min, max)"
    );
}

fn count(db: &TestDb, filter: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM message_metadata WHERE {filter}"
    ))
}

fn watermark(db: &TestDb, queue: &str) -> Option<(i64, i64)> {
    db.query(
        "SELECT segment_base, byte_offset FROM ciphermq_mirror_watermark WHERE queue = $1",
        &[&queue],
    )
    .first()
    .map(|r| (r.get(0), r.get(1)))
}

fn ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// 20,000 messages over 2 queues and 4 segments each; half the deliveries
/// and acks are in the same tick as their message, the others arrive later.
#[test]
fn mirrors_every_message_once_with_its_times() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let marks = Arc::new(MirrorWatermarks::new());
    let queues = ["orders", "audit"];
    let mut writers: Vec<LogWriter> = queues
        .iter()
        .map(|q| LogWriter::new(data.path(), q))
        .collect();
    const PER_QUEUE: u64 = 10_000;
    const SEGMENT: u64 = 2_500;

    // Before start: the first half, even messages with their events.
    for w in &mut writers {
        for seq in 0..PER_QUEUE / 2 {
            if seq > 0 && seq % SEGMENT == 0 {
                w.roll(seq);
            }
            w.message(seq);
            if seq % 2 == 0 {
                w.delivered(seq, 1, sent_ms(seq) + 1_000)
                    .delivered(seq, 2, sent_ms(seq) + 5_000)
                    .ack(seq, sent_ms(seq) + 6_000);
            }
        }
        w.flush();
    }
    let config = ciphermq_pgbridge::PgConfig {
        batch_size: 1_000,
        ..db.config()
    };
    let bridge =
        PgBridge::start(config, AES, Some((data.path().to_owned(), marks.clone()))).unwrap();

    // While it runs: events for the odd first half, then the second half.
    for w in &mut writers {
        for seq in (1..PER_QUEUE / 2).step_by(2) {
            w.delivered(seq, 1, sent_ms(seq) + 1_000);
            if seq % 100 == 99 {
                w.flush();
            }
        }
        w.flush();
    }
    wait_until("the first half's deliveries are mirrored", || {
        count(&db, "delivered_time IS NOT NULL") == PER_QUEUE as i64
    });
    for w in &mut writers {
        for seq in (1..PER_QUEUE / 2).step_by(2) {
            w.ack(seq, sent_ms(seq) + 6_000);
        }
        for seq in PER_QUEUE / 2..PER_QUEUE {
            if seq % SEGMENT == 0 {
                w.roll(seq);
            }
            w.message(seq)
                .delivered(seq, 1, sent_ms(seq) + 1_000)
                .ack(seq, sent_ms(seq) + 6_000);
            if seq % 250 == 0 {
                w.flush();
            }
        }
        w.flush();
    }
    let total = 2 * PER_QUEUE as i64;
    wait_until("every message is mirrored and acked", || {
        count(&db, "acknowledged_time IS NOT NULL") == total
    });
    wait_until("the mirror reports it is caught up", || {
        let s = bridge.status();
        s.lag_bytes == 0 && s.lag_seconds == 0.0
    });

    for q in queues {
        assert_every_row_once(&db, q, PER_QUEUE as i64);
    }
    assert_eq!(count(&db, "true"), total);
    assert_eq!(
        count(
            &db,
            "NOT (sent_time <= delivered_time AND delivered_time <= acknowledged_time)"
        ),
        0,
        "sent <= delivered <= acknowledged everywhere"
    );
    // Exact values of one row: the first delivery wins, identity fields kept.
    let row = &db.query(
        "SELECT message_id, client_id, exchange_name, routing_key, sent_time, delivered_time, acknowledged_time
         FROM message_metadata WHERE queue = 'orders' AND log_seq = 42",
        &[],
    )[0];
    assert_eq!(row.get::<_, String>(0), "orders-42");
    assert_eq!(row.get::<_, String>(1), "sender_1");
    assert_eq!(row.get::<_, String>(2), "orders");
    assert_eq!(row.get::<_, String>(3), "eu.new");
    assert_eq!(ms(row.get(4)), sent_ms(42));
    assert_eq!(ms(row.get(5)), sent_ms(42) + 1_000, "the first delivery");
    assert_eq!(ms(row.get(6)), sent_ms(42) + 6_000);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT message_id) FROM message_metadata"),
        total
    );

    // The watermark is the end of the newest segment, and the broker may
    // delete every older, fully read segment.
    for (q, w) in queues.iter().zip(&writers) {
        let len = std::fs::metadata(w.path()).unwrap().len() as i64;
        assert_eq!(watermark(&db, q), Some((7_500, len)), "queue {q}");
        assert_eq!(marks.cell(q).load(Ordering::Acquire), 7_500, "queue {q}");
    }
    let status = bridge.status();
    assert!(status.connected);
    assert!(status.rows_written >= total as u64, "{status:?}");
    assert_eq!(status.missed_segments, 0);
    bridge.shutdown();
}

/// Killing the bridge's connections mid-stream loses and duplicates nothing.
#[test]
fn catches_up_after_its_connections_are_killed() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let marks = Arc::new(MirrorWatermarks::new());
    let mut w = LogWriter::new(data.path(), "q");
    let bridge = PgBridge::start(
        db.config(),
        AES,
        Some((data.path().to_owned(), marks.clone())),
    )
    .unwrap();
    const N: u64 = 6_000;
    let mut kills = 0;
    for seq in 0..N {
        if seq > 0 && seq % 2_000 == 0 {
            w.roll(seq);
        }
        w.message(seq).ack(seq, sent_ms(seq) + 10);
        if seq % 100 == 99 {
            w.flush();
            std::thread::sleep(Duration::from_millis(5));
        }
        if seq % 1_500 == 1_000 {
            wait_until("some rows before the kill", || count(&db, "true") > 0);
            let reconnects = bridge.status().reconnects;
            assert!(db.kill_other_connections() >= 1, "the bridge was connected");
            kills += 1;
            wait_until("the bridge reconnects", || {
                bridge.status().reconnects > reconnects
            });
        }
    }
    w.flush();
    assert_eq!(kills, 4);
    wait_until("every message is mirrored and acked", || {
        count(&db, "acknowledged_time IS NOT NULL") == N as i64
    });
    assert_every_row_once(&db, "q", N as i64);
    let status = bridge.status();
    assert!(status.reconnects >= 1, "{status:?}");
    let len = std::fs::metadata(w.path()).unwrap().len() as i64;
    wait_until("the watermark reaches the end", || {
        watermark(&db, "q") == Some((4_000, len))
    });
    assert_eq!(marks.cell("q").load(Ordering::Acquire), 4_000);
    bridge.shutdown();
}

/// A bridge stopped mid-stream, with a batch stuck on a lock, and started
/// again resumes from its committed watermark: it neither re-writes a row
/// (no update ever fires) nor misses one.
#[test]
fn resumes_from_the_watermark_after_a_restart() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let mut w = LogWriter::new(data.path(), "q");
    let logs = || Some((data.path().to_owned(), Arc::new(MirrorWatermarks::new())));
    let first = PgBridge::start(db.config(), AES, logs()).unwrap();
    // Every rewrite of a row (a replay's ON CONFLICT DO UPDATE) is recorded.
    db.execute(
        "CREATE TABLE rewrites (queue text, log_seq bigint);
         CREATE FUNCTION note_rewrite() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO rewrites VALUES (OLD.queue, OLD.log_seq); RETURN NEW; END $$;
         CREATE TRIGGER rewrites AFTER UPDATE ON message_metadata
           FOR EACH ROW EXECUTE FUNCTION note_rewrite();",
    );
    const N: u64 = 3_000;
    for seq in 0..1_000 {
        w.message(seq);
        if seq % 50 == 49 {
            w.flush();
        }
    }
    wait_until("the first 1000 rows", || count(&db, "true") == 1_000);

    // The next batch blocks on a lock, and the bridge stops meanwhile.
    db.execute("BEGIN; LOCK TABLE message_metadata IN SHARE MODE");
    for seq in 1_000..1_500 {
        w.message(seq);
    }
    w.flush();
    wait_until("the bridge's batch waits on the lock", || {
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ) >= 1
    });
    let stopping = std::time::Instant::now();
    first.shutdown();
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "shutdown is not held up by a stuck batch"
    );
    db.execute("COMMIT");

    let (base, offset) = watermark(&db, "q").expect("a watermark was committed");
    assert_eq!(count(&db, "true"), 1_000, "the stuck batch did not land");
    assert_eq!(base, 0);
    assert_eq!(
        TestDb::messages_before(&w.segment(0), offset as u64),
        1_000,
        "the watermark was committed with exactly the rows before it"
    );

    // While it is stopped the broker goes on, into a new segment too.
    for seq in 1_500..N {
        if seq == 2_000 {
            w.roll(seq);
        }
        w.message(seq);
    }
    w.flush();
    let second = PgBridge::start(db.config(), AES, logs()).unwrap();
    wait_until("every message is mirrored", || {
        count(&db, "true") == N as i64
    });
    assert_every_row_once(&db, "q", N as i64);
    assert_eq!(
        db.scalar("SELECT count(*) FROM rewrites"),
        0,
        "no row was written twice: the restart resumed at the watermark"
    );
    wait_until("the second bridge reports exactly the rest", || {
        second.status().rows_written == N - 1_000
    });
    second.shutdown();
}

/// `delete_queue`: the broker moves the queue's log directory away and tells
/// the mirror, which drops the queue's rows and position; a queue made again
/// under the name is mirrored from its new log's start. A queue whose
/// directory went while no bridge ran is dropped at the next start.
#[test]
fn a_deleted_queue_is_dropped_and_its_name_mirrored_afresh() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let marks = Arc::new(MirrorWatermarks::new());
    let bridge = PgBridge::start(
        db.config(),
        AES,
        Some((data.path().to_owned(), marks.clone())),
    )
    .unwrap();
    let mut gone = LogWriter::new(data.path(), "gone");
    let mut kept = LogWriter::new(data.path(), "kept");
    for seq in 0..100 {
        gone.message(seq);
        kept.message(seq);
    }
    gone.flush();
    kept.flush();
    wait_until("both queues' rows", || count(&db, "true") == 200);
    assert!(watermark(&db, "gone").is_some());

    // What the broker does: the directory moved aside, then the mirror told.
    let dir = queue_dir(data.path(), "gone");
    std::fs::rename(&dir, data.path().join("queues").join("gone~deleted-1-0")).unwrap();
    marks.queue_deleted(&Arc::from("gone"));
    wait_until("the deleted queue's rows are dropped", || {
        count(&db, "queue = 'gone'") == 0 && watermark(&db, "gone").is_none()
    });
    assert_eq!(count(&db, "queue = 'kept'"), 100);

    // Declared again: a new log, from sequence 0.
    let mut again = LogWriter::new(data.path(), "gone");
    for seq in 0..10 {
        again.message(seq);
    }
    again.flush();
    wait_until("the new queue's rows", || {
        count(&db, "queue = 'gone'") == 10
    });
    assert_every_row_once(&db, "gone", 10);
    assert!(
        bridge.status().last_error.is_none(),
        "{:?}",
        bridge.status().last_error
    );
    bridge.shutdown();

    // Deleted while no bridge ran (its deletion never reached the database).
    std::fs::remove_dir_all(queue_dir(data.path(), "kept")).unwrap();
    let bridge = PgBridge::start(
        db.config(),
        AES,
        Some((data.path().to_owned(), Arc::new(MirrorWatermarks::new()))),
    )
    .unwrap();
    wait_until("a queue gone while stopped is dropped", || {
        count(&db, "queue = 'kept'") == 0 && watermark(&db, "kept").is_none()
    });
    assert_eq!(count(&db, "queue = 'gone'"), 10);
    bridge.shutdown();
}

/// New rows go in with `COPY`, which fails on a row that exists; a batch
/// whose rows are partly there already (its watermark lost, as when a commit
/// succeeded but its answer did not arrive) is written again as upserts.
#[test]
fn a_replayed_batch_is_written_again_as_upserts() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let mut w = LogWriter::new(data.path(), "q");
    let logs = || Some((data.path().to_owned(), Arc::new(MirrorWatermarks::new())));
    let first = PgBridge::start(db.config(), AES, logs()).unwrap();
    for seq in 0..1_000 {
        w.message(seq);
    }
    w.flush();
    wait_until("the first 1000 rows", || count(&db, "true") == 1_000);
    first.shutdown();

    db.execute("DELETE FROM ciphermq_mirror_watermark");
    for seq in 1_000..1_500 {
        w.message(seq);
    }
    w.flush();
    let second = PgBridge::start(db.config(), AES, logs()).unwrap();
    wait_until("the replayed and the new rows", || {
        count(&db, "true") == 1_500
    });
    assert_every_row_once(&db, "q", 1_500);
    assert!(
        second.status().last_error.is_none(),
        "the replay is not an error: {:?}",
        second.status().last_error
    );
    second.shutdown();
}

/// A queue never seen before, in a log that starts after segments were
/// already deleted, is mirrored from its oldest existing segment.
#[test]
fn a_new_queue_is_mirrored_from_its_oldest_segment() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let marks = Arc::new(MirrorWatermarks::new());
    let bridge = PgBridge::start(
        db.config(),
        AES,
        Some((data.path().to_owned(), marks.clone())),
    )
    .unwrap();
    let mut w = LogWriter::new(data.path(), "late");
    w.roll(500);
    for seq in 500..600 {
        w.message(seq);
    }
    w.flush();
    wait_until("the late queue's rows", || {
        count(&db, "queue = 'late'") == 100
    });
    assert_eq!(
        db.scalar("SELECT min(log_seq) FROM message_metadata WHERE queue = 'late'"),
        500
    );
    assert_eq!(bridge.status().missed_segments, 0);
    bridge.shutdown();
}
