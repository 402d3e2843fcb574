//! A dead-lettered message whose dead-letter commit fails stays served.
//!
//! Found by the simulation (seeds 74, 105, 140, … of 1,000 at 3,000 steps
//! each, before the fix): a message given up after its last delivery left
//! its source queue in memory at once, and when the dead-letter queue's
//! commit failed its copy there was dropped too, so no consumer could get
//! it again until a restart read it back from the source's log. Now the
//! failed dead-letter store is made again.

mod common;

use ciphermq_shard::topology::Actor;
use ciphermq_shard::{Completion, TopologyChange};

use common::{change, Fixture, ALL_FAIL, NO_FAULTS};

#[test]
fn a_failed_dead_letter_commit_leaves_the_message_in_the_dead_letter_queue() {
    let mut f = Fixture::new();
    // Published and stored; delivered once, given back: past
    // max_deliveries, dead-lettered.
    f.publish_stored("m-1", 1);
    f.give_up_one(2);

    // The dead-letter queue's commit fails; the next sweep stores the
    // message there again.
    f.commit_all(ALL_FAIL);
    f.sweep_later();

    // The message is still served, from the dead-letter queue.
    let dlq = f
        .store
        .snapshot()
        .queue("q.dlq")
        .cloned()
        .expect("q.dlq declared");
    let now = f.clock.now();
    let Some(Completion::Fetched(got)) = f.shard.fetch(f.origin(3), &dlq, 10, now) else {
        panic!("fetch answered at once");
    };
    assert_eq!(
        got.iter().map(|d| d.msg.message_id()).collect::<Vec<_>>(),
        vec!["m-1"],
        "the dead-lettered message is in the dead-letter queue after its failed commit"
    );
    // And once the retried commit succeeds, the source's ack is written.
    f.commit_all(NO_FAULTS);
    let stats = f.shard.queue_stats();
    let source = stats.iter().find(|q| &*q.name == "q").expect("q stats");
    assert_eq!(
        (source.ready, source.unacked),
        (0, 0),
        "the source holds nothing"
    );
}

/// Found by a debug assertion in the simulation (seeds 138 and 171 on two
/// shards): the ack a dead-lettering owed its source queue was appended,
/// by name, to a queue declared again under that name after the source was
/// deleted. There it acked a message of the new queue's own (the same seq),
/// which a restart then lost, though its publish was ACKed.
#[test]
fn an_ack_owed_to_a_deleted_queue_does_not_reach_one_declared_again() {
    let mut f = Fixture::new();
    f.publish_stored("m-1", 1);
    f.give_up_one(2);
    // Its dead-letter commit fails: the ack stays owed to `q`.
    f.commit_all(ALL_FAIL);

    // `q` is deleted and declared again; a new message goes in.
    let info = f.store.snapshot().queue("q").cloned().expect("q");
    change(
        &f.store,
        TopologyChange::DeleteQueue {
            name: "q".into(),
            by: Actor::receiver("r"),
        },
    );
    let (mut removed, done) = ciphermq_shard::pending::pending();
    f.shard.delete_queue(&info, done);
    f.commit_all(NO_FAULTS);
    assert!(
        matches!(removed.try_take(), Some(Ok(()))),
        "the delete is done"
    );
    change(&f.store, TopologyChange::QueueRemoved { name: "q".into() });
    f.declare_q();
    f.publish_stored("m-2", 3);

    // The sweep that would store the dead letter again, and its commit.
    f.sweep_later();
    f.commit_all(NO_FAULTS);

    // After a restart, the new queue still holds its ACKed message.
    assert_eq!(f.recovered_count(), 1, "m-2 is still queued");
}
