//! A move's row goes requested → exported → done, or aborted, and each
//! step is a compare-and-set: a finish and an abort racing never both win,
//! and the placement changes only with the finish.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use ciphermq_cluster::{ClusterError, Coordinator, MoveState, PgCoordinator};
use common::TestSchema;

const LEASE: Duration = Duration::from_secs(5);

fn two_nodes(db: &TestSchema) -> (PgCoordinator, PgCoordinator) {
    let a = db.coordinator();
    a.register("node-a", "127.0.0.1:5701").unwrap();
    let b = db.coordinator();
    b.register("node-b", "127.0.0.1:5702").unwrap();
    (a, b)
}

#[test]
fn a_move_hands_its_parts_over_and_finishes_with_the_placement() {
    let db = TestSchema::new();
    let (a, b) = two_nodes(&db);
    a.place("r1", "node-a").unwrap();

    let m = b.request_move("r1", "node-b", LEASE).unwrap();
    assert_eq!(
        (m.epoch, m.from_node.as_str(), m.to_node.as_str(), m.state),
        (1, "node-a", "node-b", MoveState::Requested)
    );
    // Only one move of an owner at a time, and never to where it is.
    assert!(matches!(
        a.request_move("r1", "node-b", LEASE),
        Err(ClusterError::MoveUnderWay { .. })
    ));
    assert_eq!(a.pending_moves("node-a").unwrap(), vec![m.clone()]);
    assert_eq!(b.pending_moves("node-b").unwrap(), vec![m.clone()]);

    // Parts in order; the one of a longer, earlier attempt is dropped.
    for (i, part) in [b"one".to_vec(), b"two".to_vec(), b"old".to_vec()]
        .into_iter()
        .enumerate()
    {
        a.put_handoff("r1", 1, i as u32, part).unwrap();
    }
    a.exported("r1", 1, 2).unwrap();
    assert!(a.pending_moves("node-a").unwrap().is_empty());
    assert_eq!(
        b.pending_moves("node-b").unwrap()[0].state,
        MoveState::Exported
    );
    assert_eq!(b.handoff("r1", 1, 0).unwrap(), Some(b"one".to_vec()));
    assert_eq!(b.handoff("r1", 1, 1).unwrap(), Some(b"two".to_vec()));
    assert_eq!(b.handoff("r1", 1, 2).unwrap(), None);

    let placed = b.finish_move("r1", 1).unwrap();
    assert_eq!((placed.node_id.as_str(), placed.epoch), ("node-b", 2));
    assert_eq!(b.handoff("r1", 1, 0).unwrap(), None, "data dropped");
    assert_eq!(a.move_of("r1", 1).unwrap().unwrap().state, MoveState::Done);
    // Too late to abort: the caller is told it is done.
    assert_eq!(a.abort_move("r1", 1).unwrap(), MoveState::Done);
    assert!(matches!(
        b.request_move("r1", "node-b", LEASE),
        Err(ClusterError::AlreadyThere { .. })
    ));
    // The next move leaves epoch 2.
    assert_eq!(a.request_move("r1", "node-a", LEASE).unwrap().epoch, 2);
}

#[test]
fn an_aborted_move_cannot_finish_and_can_be_asked_again() {
    let db = TestSchema::new();
    let (a, b) = two_nodes(&db);
    a.place("r1", "node-a").unwrap();
    b.request_move("r1", "node-b", LEASE).unwrap();
    assert_eq!(a.abort_move("r1", 1).unwrap(), MoveState::Aborted);
    assert!(matches!(
        a.exported("r1", 1, 0),
        Err(ClusterError::MoveEnded { ref state, .. }) if state == "aborted"
    ));
    assert!(matches!(
        b.finish_move("r1", 1),
        Err(ClusterError::MoveEnded { .. })
    ));
    assert_eq!(a.locate("r1").unwrap().unwrap().epoch, 1);
    // Asked again after the abort: the same epoch's row starts over.
    let again = b.request_move("r1", "node-b", LEASE).unwrap();
    assert_eq!((again.epoch, again.state), (1, MoveState::Requested));
}

#[test]
fn a_finish_and_an_abort_racing_never_both_win() {
    let db = TestSchema::new();
    let (a, b) = two_nodes(&db);
    let (a, b) = (Arc::new(a), Arc::new(b));
    for round in 0..20 {
        let owner = format!("r{round}");
        a.place(&owner, "node-a").unwrap();
        b.request_move(&owner, "node-b", LEASE).unwrap();
        a.exported(&owner, 1, 0).unwrap();
        let start = Arc::new(Barrier::new(2));
        let finish = {
            let (b, owner, start) = (b.clone(), owner.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                b.finish_move(&owner, 1)
            })
        };
        start.wait();
        let aborted = a.abort_move(&owner, 1).unwrap();
        let finished = finish.join().unwrap();
        let placed = a.locate(&owner).unwrap().unwrap();
        match aborted {
            MoveState::Done => {
                assert!(finished.is_ok());
                assert_eq!((placed.node_id.as_str(), placed.epoch), ("node-b", 2));
            }
            _ => {
                assert!(finished.is_err(), "{finished:?}");
                assert_eq!((placed.node_id.as_str(), placed.epoch), ("node-a", 1));
            }
        }
    }
}

#[test]
fn a_node_that_stopped_heartbeating_is_no_place_to_move_to() {
    let db = TestSchema::new();
    let (a, _b) = two_nodes(&db);
    a.place("r1", "node-a").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(matches!(
        a.request_move("r1", "node-b", Duration::from_millis(100)),
        Err(ClusterError::StaleNode { ref node_id, .. }) if node_id == "node-b"
    ));
    assert!(matches!(
        a.request_move("r1", "node-z", LEASE),
        Err(ClusterError::UnknownNode { .. })
    ));
}
