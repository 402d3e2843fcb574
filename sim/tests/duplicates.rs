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
