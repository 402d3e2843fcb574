//! Owners get one node each, agreed by every node, and epochs only rise.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier};

use ciphermq_cluster::{ClusterError, Coordinator, PgCoordinator};
use common::TestSchema;

/// Three coordinators registered as node-1..node-3.
fn three_nodes(db: &TestSchema) -> Vec<Arc<PgCoordinator>> {
    (1..=3)
        .map(|i| {
            let node = db.coordinator();
            node.register(&format!("node-{i}"), &format!("127.0.0.1:570{i}"))
                .unwrap();
            Arc::new(node)
        })
        .collect()
}

#[test]
fn nodes_racing_to_place_an_owner_all_get_the_same_answer_and_one_row() {
    let db = TestSchema::new();
    let nodes = three_nodes(&db);
    const OWNERS: usize = 30;
    let start = Arc::new(Barrier::new(nodes.len()));
    let threads: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let node = node.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                (0..OWNERS)
                    .map(|o| {
                        start.wait();
                        node.place(&format!("owner-{o}"), &format!("node-{}", i + 1))
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let answers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for o in 0..OWNERS {
        let first = &answers[0][o];
        assert_eq!(first.owner, format!("owner-{o}"));
        assert_eq!(first.epoch, 1);
        assert_eq!(
            first.advertise,
            format!("127.0.0.1:570{}", &first.node_id["node-".len()..])
        );
        for node in &answers[1..] {
            assert_eq!(&node[o], first, "owner-{o}");
        }
        assert_eq!(nodes[2].locate(&first.owner).unwrap().as_ref(), Some(first));
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM {schema}.cluster_placements"),
        OWNERS as i64
    );
}

#[test]
fn locate_never_places_and_an_unknown_node_is_refused() {
    let db = TestSchema::new();
    let nodes = three_nodes(&db);
    assert_eq!(nodes[0].locate("alice").unwrap(), None);
    assert_eq!(
        nodes[0].place("alice", "node-9"),
        Err(ClusterError::UnknownNode {
            node_id: "node-9".to_owned()
        })
    );
    assert_eq!(nodes[0].locate("alice").unwrap(), None);
    let placed = nodes[1].place("alice", "node-2").unwrap();
    assert_eq!((placed.node_id.as_str(), placed.epoch), ("node-2", 1));
    // Placed already: the preferred node no longer matters.
    assert_eq!(nodes[0].place("alice", "node-1").unwrap(), placed);
    assert!(matches!(
        nodes[0].place("", "node-1"),
        Err(ClusterError::BadInput { what: "owner", .. })
    ));
}

#[test]
fn a_move_is_compare_and_set_on_the_epoch_and_epochs_only_rise() {
    let db = TestSchema::new();
    let nodes = three_nodes(&db);
    assert_eq!(
        nodes[0].move_owner("alice", "node-2", 1),
        Err(ClusterError::NotPlaced {
            owner: "alice".to_owned()
        })
    );
    let first = nodes[0].place("alice", "node-1").unwrap();
    let moved = nodes[0].move_owner("alice", "node-2", 1).unwrap();
    assert_eq!(
        (
            moved.node_id.as_str(),
            moved.advertise.as_str(),
            moved.epoch
        ),
        ("node-2", "127.0.0.1:5702", 2)
    );
    assert!(moved.version > first.version);
    assert_eq!(
        nodes[1].move_owner("alice", "node-3", 1),
        Err(ClusterError::StaleEpoch {
            owner: "alice".to_owned(),
            expected: 1,
            current: 2
        })
    );
    assert_eq!(
        nodes[1].move_owner("alice", "node-9", 2),
        Err(ClusterError::UnknownNode {
            node_id: "node-9".to_owned()
        })
    );

    // Three nodes race to move it, each expecting epoch 2: one wins.
    let start = Arc::new(Barrier::new(nodes.len()));
    let threads: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let node = node.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                node.move_owner("alice", &format!("node-{}", i + 1), 2)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "{results:?}");
    assert_eq!(won[0].epoch, 3);
    for lost in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(
                lost,
                ClusterError::StaleEpoch {
                    expected: 2,
                    current: 3,
                    ..
                }
            ),
            "{lost}"
        );
    }
    assert_eq!(nodes[2].locate("alice").unwrap().as_ref(), Some(won[0]));
    assert_eq!(
        db.scalar("SELECT count(*) FROM {schema}.cluster_placements"),
        1
    );
}

#[test]
fn polling_placement_changes_keeps_a_mirror_exact() {
    let db = TestSchema::new();
    let nodes = three_nodes(&db);
    let empty = nodes[0].placements_since(0).unwrap();
    assert_eq!((empty.placements.len(), empty.version), (0, 0));

    for owner in ["alice", "bob", "carol"] {
        nodes[1].place(owner, "node-2").unwrap();
    }
    let mut mirror = HashMap::new();
    let mut since = 0;
    let mut apply = |since: &mut u64| {
        let changes = nodes[0].placements_since(*since).unwrap();
        let versions: Vec<u64> = changes.placements.iter().map(|p| p.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        for p in &changes.placements {
            let previous = mirror.insert(p.owner.clone(), (p.node_id.clone(), p.epoch));
            assert!(previous.is_none_or(|(_, epoch)| epoch < p.epoch), "{p:?}");
        }
        assert!(changes.version >= *since);
        *since = changes.version;
        changes.placements.len()
    };
    assert_eq!(apply(&mut since), 3);
    assert_eq!(apply(&mut since), 0, "nothing new");

    nodes[2].move_owner("bob", "node-3", 1).unwrap();
    assert_eq!(apply(&mut since), 1);
    assert_eq!(mirror["bob"], ("node-3".to_owned(), 2));
    assert_eq!(mirror["alice"], ("node-2".to_owned(), 1));
    assert_eq!(mirror.len(), 3);
    assert!(matches!(
        nodes[0].placements_since(u64::MAX),
        Err(ClusterError::BadInput {
            what: "version",
            ..
        })
    ));
}
