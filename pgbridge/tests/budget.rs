//! The disk budget: while the database is unreachable and the backlog grows
//! past `max_unmirrored_bytes`, the mirror lets the broker delete acked
//! segments (`release_all`), then reports exactly what it missed and holds
//! segments precisely again once caught up.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ciphermq_pgbridge::{PgBridge, PgConfig};
use ciphermq_shard::log::MirrorWatermarks;
use common::{wait_until, LogWriter, TestDb};

const AES: [u8; 32] = [7u8; 32];

#[test]
fn over_budget_it_lets_go_and_reports_the_segments_it_missed() {
    let db = TestDb::new();
    let data = tempfile::tempdir().unwrap();
    let marks = Arc::new(MirrorWatermarks::new());
    let mut w = LogWriter::new(data.path(), "q");
    for seq in 0..100 {
        w.message(seq);
    }
    w.flush();
    let config = PgConfig {
        max_unmirrored_bytes: 1_000,
        ..db.config()
    };
    let bridge =
        PgBridge::start(config, AES, Some((data.path().to_owned(), marks.clone()))).unwrap();
    let cell = marks.cell("q");
    wait_until("segment 0 is mirrored", || {
        db.scalar("SELECT count(*) FROM message_metadata") == 100
    });
    assert_eq!(
        cell.load(Ordering::Acquire),
        0,
        "held at the segment it reads"
    );

    // The database goes away; the broker keeps appending past the budget.
    db.set_reachable(false);
    wait_until("the bridge notices", || !bridge.status().connected);
    w.roll(100);
    for seq in 100..200 {
        w.message(seq);
    }
    w.roll(200);
    for seq in 200..210 {
        w.message(seq);
    }
    w.flush();
    wait_until("the mirror lets go", || {
        cell.load(Ordering::Acquire) == u64::MAX
    });
    let status = bridge.status();
    assert!(status.lag_bytes > 1_000, "{status:?}");
    assert!(status.lag_seconds > 0.0, "{status:?}");
    // The broker deletes the acked segments it may now delete.
    std::fs::remove_file(w.segment(0)).unwrap();
    std::fs::remove_file(w.segment(100)).unwrap();

    db.set_reachable(true);
    wait_until("the rest is mirrored", || {
        db.scalar("SELECT count(*) FROM message_metadata WHERE log_seq >= 200") == 10
    });
    assert_eq!(
        db.scalar("SELECT count(*) FROM message_metadata WHERE log_seq BETWEEN 100 AND 199"),
        0,
        "segment 100 was deleted before the mirror read it"
    );
    wait_until("holds are precise again", || {
        cell.load(Ordering::Acquire) == 200
    });
    let status = bridge.status();
    assert_eq!(status.missed_segments, 1, "{status:?}");
    assert!(status.reconnects >= 1, "{status:?}");
    wait_until("caught up", || bridge.status().lag_bytes == 0);
    bridge.shutdown();
}

#[test]
fn within_budget_an_outage_keeps_every_segment_held() {
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
    let cell = marks.cell("q");
    for seq in 0..50 {
        w.message(seq);
    }
    w.flush();
    wait_until("segment 0 is mirrored", || {
        db.scalar("SELECT count(*) FROM message_metadata") == 50
    });
    db.set_reachable(false);
    wait_until("the bridge notices", || !bridge.status().connected);
    w.roll(50);
    for seq in 50..100 {
        w.message(seq);
    }
    w.flush();
    wait_until("the backlog is measured", || bridge.status().lag_bytes > 0);
    assert_eq!(
        cell.load(Ordering::Acquire),
        0,
        "segment 0 stays held: the mirror has not finished it"
    );
    db.set_reachable(true);
    wait_until("caught up", || {
        db.scalar("SELECT count(*) FROM message_metadata") == 100
    });
    wait_until("the hold moves on", || cell.load(Ordering::Acquire) == 50);
    assert_eq!(bridge.status().missed_segments, 0);
    bridge.shutdown();
}
