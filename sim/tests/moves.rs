//! A queue whose owner moves to another node leaves its shard whole, and
//! nothing the shard still owed it follows it back when it returns.

mod common;

use std::sync::Arc;

use common::{Fixture, ALL_FAIL, NO_FAULTS};

/// Moves the owner `r`'s queues out of the fixture's shard (freeze, settle,
/// detach: their directories go under `away/`), then back, as a node that
/// hands them over and later adopts them again would: each directory
/// returns to its place and the queue is recovered from it.
fn move_away_and_back(f: &mut Fixture) -> Vec<Arc<str>> {
    let names = f.shard.owner_queues("r");
    f.shard.freeze(&names);
    f.commit_all(NO_FAULTS);
    assert!(f.shard.is_quiet(&names), "the owner's logs settled");
    let away = f.data.join("away");
    std::fs::create_dir_all(&away).expect("away dir");
    let keep_in = away.clone();
    let mut moved = f.shard.detach(&names, &|name| Some(keep_in.join(name)));
    f.commit_all(NO_FAULTS);
    for m in &mut moved {
        assert!(matches!(m.try_take(), Some(Ok(()))), "the directory moved");
    }
    for name in &names {
        assert!(!f.shard.holds_queue(name), "{name} left the shard");
        let home = ciphermq_shard::log::queue_dir(&f.data, name);
        // A queue that never stored anything has no directory to move,
        // and is not restored (the broker's adoption skips it too): it is
        // made anew when first used.
        let moved = away.join(&**name);
        if !moved.exists() {
            continue;
        }
        f.disk.rename_dir(&moved, &home).expect("back home");
        let recovered = ciphermq_shard::log::recover_queue_at(
            &home,
            &f.settings.dedup_hasher,
            f.settings.dedup_window.as_millis() as u64,
            &f.clock,
        )
        .expect("recovered");
        let now = f.clock.now();
        f.shard.restore_queue(name.clone(), recovered, now);
    }
    names
}

/// A message given up after its last delivery is stored in the dead-letter
/// queue before its source acks it. When that store fails, it is tried
/// again at the next sweep, and the source's ack after it. If the owner
/// moves away before that sweep, the retry must go with the queue's
/// leaving: the node the owner moved to delivers the message again from
/// the source's log (here it is acked there), and when the owner comes
/// back, a retry still held would store the acked message in the
/// dead-letter queue and ack its seq a second time, against a segment that
/// holds a newer message.
#[test]
fn a_dead_letter_owed_to_a_queue_that_moved_away_does_not_follow_it_back() {
    let mut f = Fixture::new();
    f.publish_stored("m-1", 1);
    f.give_up_one(2);
    // The dead-letter queue's commit fails: the store waits for a sweep.
    f.commit_all(ALL_FAIL);

    let names = move_away_and_back(&mut f);
    assert_eq!(names.len(), 2, "the queue and its dead-letter queue moved");

    // Where the owner was, m-1 was served again from `q`'s log and acked,
    // and m-2 was published.
    let held = f.fetch_one(3);
    let now = f.clock.now();
    f.shard.ack(f.conn, &held, now);
    f.publish_stored("m-2", 4);

    // The sweep that would have retried the dead letter, and its commit.
    f.sweep_later();
    f.commit_all(NO_FAULTS);

    let stats = f.shard.queue_stats();
    // A queue the shard does not hold (the dead-letter queue stored
    // nothing, so nothing restored it) holds nothing.
    let counts = |name: &str| {
        stats
            .iter()
            .find(|q| &*q.name == name)
            .map_or((0, 0), |q| (q.ready, q.unacked))
    };
    assert_eq!(counts("q"), (1, 0), "q holds m-2 alone");
    assert_eq!(
        counts("q.dlq"),
        (0, 0),
        "the acked m-1 was not dead-lettered again"
    );
    assert_eq!(f.recovered_count(), 1, "a restart finds m-2 in q");
}

/// Found by the simulation's owner moves (seed 128 of 200 at 2,000 steps,
/// `--moves`): a log counted as quiet while a job of it was written and not
/// finished. A move then took its queue off the shard before the job's
/// failed write or sync was known, and the job's end, finding no log,
/// answered its publishes as stored: an `ACK` for a message whose bytes
/// were never made durable, which a power cut then lost.
#[test]
fn a_publish_whose_write_failed_is_not_acked_when_its_queue_moves_away_meanwhile() {
    let mut f = Fixture::new();
    f.publish("m-1", 1);
    // The round is written, its write failed, and it is not finished.
    f.step(ALL_FAIL);
    let mut names = f.shard.owner_queues("r");
    names.sort();
    f.shard.freeze(&names);
    assert!(
        !f.shard.is_quiet(&names),
        "a log with a job written and not finished is not quiet"
    );
    // The move waits for quiet, as the cluster's does.
    let mut steps = 0;
    while !f.shard.is_quiet(&names) {
        f.step(NO_FAULTS);
        steps += 1;
        assert!(steps < 100, "the log never settled");
    }
    let keep = f.data.join("away");
    std::fs::create_dir_all(&keep).expect("away dir");
    let _moved = f.shard.detach(&names, &|name| Some(keep.join(name)));
    f.commit_all(NO_FAULTS);
    assert_eq!(
        f.answers(),
        vec![(1, false)],
        "m-1's write failed: NACK storage, move or no move"
    );
}
