//! Declaring a node dead is a compare-and-set on the row a watcher saw
//! silent: it wins only while the node is exactly as seen, and then, in the
//! same transaction, every owner of the dead node goes to a fresh node at
//! epoch + 1, moves under way end, and the takeover is recorded.

mod common;

use std::time::{Duration, Instant};

use ciphermq_cluster::{ClusterError, Coordinator, HeartbeatWatch, PgCoordinator, Suspect};
use common::TestSchema;

const LEASE: Duration = Duration::from_secs(5);

/// Three nodes, a, b and c; node-a holds r1..r4.
fn three_nodes(db: &TestSchema) -> [PgCoordinator; 3] {
    let nodes = [db.coordinator(), db.coordinator(), db.coordinator()];
    for (i, node) in nodes.iter().enumerate() {
        let id = ["node-a", "node-b", "node-c"][i];
        node.register(id, &format!("127.0.0.1:570{i}")).unwrap();
    }
    for owner in ["r1", "r2", "r3", "r4"] {
        nodes[0].place(owner, "node-a").unwrap();
    }
    nodes
}

/// `node_id` as `watcher` sees it now, as a suspect (its silence aside).
fn seen(watcher: &PgCoordinator, node_id: &str) -> Suspect {
    let node = watcher
        .nodes()
        .unwrap()
        .into_iter()
        .find(|n| n.node_id == node_id)
        .expect("listed");
    Suspect {
        node_id: node.node_id,
        incarnation: node.incarnation,
        heartbeat_stamp: node.heartbeat_stamp,
        silent_for: LEASE,
    }
}

#[test]
fn a_dead_nodes_owners_go_round_robin_to_fresh_nodes_at_a_higher_epoch() {
    let db = TestSchema::new();
    let [a, b, c] = three_nodes(&db);
    let before = b.placements_since(0).unwrap().version;
    let suspect = seen(&b, "node-a");

    let takeover = b
        .declare_dead(&suspect, "node-b", "heartbeat unchanged for 6 s", LEASE)
        .unwrap();
    assert_eq!(
        (takeover.node_id.as_str(), takeover.incarnation),
        ("node-a", 1)
    );
    let homes: Vec<(&str, &str, u64)> = takeover
        .placements
        .iter()
        .map(|p| (p.owner.as_str(), p.node_id.as_str(), p.epoch))
        .collect();
    assert_eq!(
        homes,
        [
            ("r1", "node-b", 2),
            ("r2", "node-c", 2),
            ("r3", "node-b", 2),
            ("r4", "node-c", 2)
        ]
    );
    // Every node's mirror sees the changes, newer than before.
    let changes = c.placements_since(before).unwrap();
    assert_eq!(changes.placements, takeover.placements);
    // The dead node is no longer listed; the takeover is recorded.
    let ids: Vec<String> = c.nodes().unwrap().into_iter().map(|n| n.node_id).collect();
    assert_eq!(ids, ["node-b", "node-c"]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM {schema}.cluster_takeovers WHERE node_id = 'node-a' AND by_node = 'node-b' AND owners = 4 AND reason = 'heartbeat unchanged for 6 s'"),
        1
    );
    // The stale process can no longer heartbeat as itself... and a second
    // declaration of the same silence finds nothing to do.
    assert!(matches!(
        c.declare_dead(&suspect, "node-c", "late", LEASE),
        Err(ClusterError::StillAlive { .. })
    ));
    let recorded = c.recent_takeovers(10).unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        (
            recorded[0].node_id.as_str(),
            recorded[0].incarnation,
            recorded[0].by_node.as_str(),
            recorded[0].owners
        ),
        ("node-a", 1, "node-b", 4)
    );
    assert_eq!(recorded[0].reason, "heartbeat unchanged for 6 s");
    // A restart of node-a is a new incarnation, alive, holding nothing.
    let incarnation = a.register("node-a", "127.0.0.1:5700").unwrap();
    assert_eq!(incarnation, 2);
    assert_eq!(a.locate("r1").unwrap().unwrap().node_id, "node-b");
}

#[test]
fn a_node_that_beat_or_restarted_since_it_was_seen_is_not_declared_dead() {
    let db = TestSchema::new();
    let [a, b, _c] = three_nodes(&db);
    let suspect = seen(&b, "node-a");
    // The stored heartbeat has microsecond precision: wait for it to move.
    let stamp = suspect.heartbeat_stamp;
    loop {
        a.heartbeat("node-a", 1).unwrap();
        if seen(&b, "node-a").heartbeat_stamp != stamp {
            break;
        }
    }
    assert!(matches!(
        b.declare_dead(&suspect, "node-b", "test", LEASE),
        Err(ClusterError::StillAlive { ref node_id, incarnation: 1 }) if node_id == "node-a"
    ));
    let fresh = seen(&b, "node-a");
    a.register("node-a", "127.0.0.1:5700").unwrap();
    assert!(matches!(
        b.declare_dead(&fresh, "node-b", "test", LEASE),
        Err(ClusterError::StillAlive { .. })
    ));
    assert_eq!(b.locate("r1").unwrap().unwrap().epoch, 1, "nothing moved");
}

#[test]
fn without_a_fresh_heir_nothing_changes() {
    let db = TestSchema::new();
    let [_a, b, _c] = three_nodes(&db);
    let suspect = seen(&b, "node-a");
    // Every other node's heartbeat is older than the freshness asked.
    db.execute("UPDATE {schema}.cluster_nodes SET heartbeat = heartbeat - interval '1 minute' WHERE node_id <> 'node-a'");
    assert!(matches!(
        b.declare_dead(&suspect, "node-b", "test", LEASE),
        Err(ClusterError::NoLiveNode { ref node_id }) if node_id == "node-a"
    ));
    assert_eq!(b.nodes().unwrap().len(), 3, "node-a is still alive");
    assert_eq!(b.locate("r2").unwrap().unwrap().node_id, "node-a");
}

#[test]
fn moves_from_or_to_the_dead_node_are_aborted_with_their_data() {
    let db = TestSchema::new();
    let [a, b, _c] = three_nodes(&db);
    a.place("r9", "node-b").unwrap();
    // r1 was leaving node-a for node-b, r9 leaving node-b for node-a.
    b.request_move("r1", "node-b", LEASE).unwrap();
    a.put_handoff("r1", 1, 0, b"part".to_vec()).unwrap();
    a.exported("r1", 1, 1).unwrap();
    b.request_move("r9", "node-a", LEASE).unwrap();

    b.declare_dead(&seen(&b, "node-a"), "node-b", "test", LEASE)
        .unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM {schema}.cluster_moves WHERE state = 'aborted'"),
        2
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM {schema}.cluster_handoff"),
        0
    );
    // The move's new node cannot finish it any more.
    assert!(matches!(
        b.finish_move("r1", 1),
        Err(ClusterError::MoveEnded { .. })
    ));
    assert_eq!(b.locate("r9").unwrap().unwrap().node_id, "node-b");
}

#[test]
fn a_watcher_over_the_real_coordinator_suspects_only_the_silent_node() {
    let db = TestSchema::new();
    let [a, b, c] = three_nodes(&db);
    let mut watch = HeartbeatWatch::new("node-b", Duration::from_millis(300));
    let silence = watch.silence();
    let started = Instant::now();
    // node-a and node-b go on beating; node-c has stopped.
    loop {
        a.heartbeat("node-a", 1).unwrap();
        b.heartbeat("node-b", 1).unwrap();
        let suspects = watch.observe(Instant::now(), &b.nodes().unwrap());
        if let Some(s) = suspects.first() {
            assert_eq!(suspects.len(), 1, "{suspects:?}");
            assert_eq!(s.node_id, "node-c");
            assert!(started.elapsed() >= silence);
            b.declare_dead(s, "node-b", "test", Duration::from_secs(5))
                .unwrap();
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node-c never suspected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
}

#[test]
fn an_owners_topology_is_kept_by_epoch_so_a_node_that_lost_it_cannot_overwrite_it() {
    let db = TestSchema::new();
    let [a, b, _c] = three_nodes(&db);
    assert_eq!(b.owner_topology("r1").unwrap(), None);
    assert!(a.put_owner_topology("r1", 1, b"at 1".to_vec()).unwrap());
    assert!(a
        .put_owner_topology("r1", 1, b"at 1, later".to_vec())
        .unwrap());
    assert!(b.put_owner_topology("r1", 2, b"at 2".to_vec()).unwrap());
    // node-a, still at epoch 1, writes late: refused.
    assert!(!a.put_owner_topology("r1", 1, b"stale".to_vec()).unwrap());
    assert_eq!(b.owner_topology("r1").unwrap(), Some((2, b"at 2".to_vec())));
}

#[test]
fn a_backlog_given_back_is_offered_to_whoever_holds_the_owner_until_taken() {
    let db = TestSchema::new();
    let [a, b, c] = three_nodes(&db);
    b.declare_dead(&seen(&b, "node-a"), "node-b", "test", LEASE)
        .unwrap();
    // node-a is back: it gives r1's backlog (held by node-b now) back.
    a.register("node-a", "127.0.0.1:5700").unwrap();
    assert_eq!(a.handback_taken("r1", "node-a").unwrap(), None);
    for (i, part) in [b"one".to_vec(), b"two".to_vec(), b"old".to_vec()]
        .into_iter()
        .enumerate()
    {
        a.put_handback_part("r1", "node-a", i as u32, part).unwrap();
    }
    a.offer_handback("r1", "node-a", 2).unwrap();
    assert_eq!(a.handback_taken("r1", "node-a").unwrap(), Some(false));
    let offered = b.handbacks_for("node-b").unwrap();
    assert_eq!(offered.len(), 1);
    assert_eq!(
        (
            offered[0].owner.as_str(),
            offered[0].from_node.as_str(),
            offered[0].parts
        ),
        ("r1", "node-a", 2)
    );
    assert!(
        c.handbacks_for("node-c").unwrap().is_empty(),
        "r1 is not on node-c"
    );
    assert_eq!(
        b.handback_part("r1", "node-a", 1).unwrap(),
        Some(b"two".to_vec())
    );
    assert_eq!(
        b.handback_part("r1", "node-a", 2).unwrap(),
        None,
        "the extra part was dropped"
    );
    b.finish_handback("r1", "node-a").unwrap();
    assert_eq!(a.handback_taken("r1", "node-a").unwrap(), Some(true));
    assert!(b.handbacks_for("node-b").unwrap().is_empty());
    assert_eq!(
        db.scalar("SELECT count(*) FROM {schema}.cluster_handback_parts"),
        0
    );
}
