//! A publish answered as a duplicate is `ACK`ed only if its original is
//! stored.
//!
//! Found by the session-level simulation (`broker/src/session/tests/
//! seeded.rs`, seed 225 of 1,000): a sender published an id again while
//! the first publish's commit was in flight. The second was a duplicate
//! and waited for the queue's next commit; the first one's write failed
//! (`NACK storage`, the message dropped), the next commit succeeded, and
//! the duplicate was answered `ACK`: acknowledged, and stored nowhere.

mod common;

use common::{Fixture, ALL_FAIL, NO_FAULTS};

#[test]
fn a_duplicate_of_a_publish_whose_write_failed_is_not_acked() {
    let mut f = Fixture::new();
    // The first publish's round is taken and its write fails; the round
    // is not finished yet, so the id still counts as stored.
    f.publish("m-1", 1);
    f.step(ALL_FAIL);
    assert!(
        f.answers().is_empty(),
        "nothing answered before the round ends"
    );
    // The same id again: a duplicate of a message not yet durable.
    f.publish("m-1", 2);
    // The next round writes fine and finishes the failed one; then that
    // round finishes too.
    f.step(NO_FAULTS);
    f.step(NO_FAULTS);
    f.commit_all(NO_FAULTS);
    let answers = f.answers();
    assert_eq!(
        answers,
        vec![(1, false), (2, false)],
        "both publishes are refused: the message is stored nowhere"
    );
    assert_eq!(f.recovered_count(), 0, "nothing of m-1 is on disk");

    // Published again after the refusal, it is stored and acknowledged.
    f.publish("m-1", 3);
    f.commit_all(NO_FAULTS);
    assert_eq!(f.answers(), vec![(3, true)]);
    assert_eq!(f.recovered_count(), 1, "m-1 is stored once");
}

/// Found by the shard simulation (seed 853 of 2,000 on two shards, once
/// publishes again while in flight joined its mix): a message delivered
/// before its write failed stays owed to its consumer, and its id was
/// forgotten so that the publisher's retry is stored anew. But settling
/// that delivery (here: giving it up past `max_deliveries`, so it went to
/// the dead-letter queue) made the id count as acked again, and the retry
/// was answered `ACK` as a duplicate, with nothing stored in the queue.
#[test]
fn a_retry_after_a_failed_write_is_stored_even_once_the_delivered_copy_is_settled() {
    let mut f = Fixture::new();
    f.publish("m-1", 1);
    // Delivered before its commit, then its write fails.
    let held = f.fetch_one(2);
    f.step(ALL_FAIL);
    f.commit_all(NO_FAULTS);
    assert_eq!(f.answers(), vec![(1, false)], "the publish is refused");
    // The consumer gives it back: past max_deliveries, dead-lettered.
    f.give_back(&held);
    f.commit_all(NO_FAULTS);

    // The publisher retries: acknowledged, and stored in the queue.
    f.publish("m-1", 3);
    f.commit_all(NO_FAULTS);
    assert_eq!(f.answers(), vec![(3, true)]);
    assert_eq!(
        f.recovered_count(),
        1,
        "the ACKed retry is on disk in its queue"
    );
}
