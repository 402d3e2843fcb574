//! Nodes join with rising incarnations; a stale one is fenced out.

mod common;

use ciphermq_cluster::{ClusterError, Coordinator};
use common::TestSchema;

#[test]
fn registering_again_raises_the_incarnation_and_fences_the_old_one() {
    let db = TestSchema::new();
    let old = db.coordinator();
    let new = db.coordinator();
    let first = old.register("node-1", "127.0.0.1:5701").unwrap();
    old.heartbeat("node-1", first).unwrap();
    let second = new.register("node-1", "127.0.0.1:5711").unwrap();
    assert!(second > first, "{second} > {first}");
    new.heartbeat("node-1", second).unwrap();
    assert_eq!(
        old.heartbeat("node-1", first),
        Err(ClusterError::Fenced {
            node_id: "node-1".to_owned(),
            ours: first,
            current: second
        })
    );
    let nodes = old.nodes().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0].advertise.as_str(), nodes[0].incarnation),
        ("127.0.0.1:5711", second)
    );
    assert_eq!(
        old.heartbeat("node-7", 1),
        Err(ClusterError::UnknownNode {
            node_id: "node-7".to_owned()
        })
    );
}

#[test]
fn nodes_are_the_live_ones_sorted_by_id() {
    let db = TestSchema::new();
    let coordinator = db.coordinator();
    for (id, port) in [
        ("node-3", 5703),
        ("node-1", 5701),
        ("node-2", 5702),
        ("Node-0", 5700),
    ] {
        coordinator
            .register(id, &format!("127.0.0.1:{port}"))
            .unwrap();
    }
    db.execute("UPDATE {schema}.cluster_nodes SET state = 'dead' WHERE node_id = 'node-2'");
    let nodes = coordinator.nodes().unwrap();
    let ids: Vec<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, ["Node-0", "node-1", "node-3"]);
    for node in &nodes {
        assert_eq!(
            node.advertise,
            format!("127.0.0.1:570{}", &node.node_id[5..])
        );
        assert_eq!(node.incarnation, 1);
        // Measured by the server: just registered, so well under a minute.
        assert!(node.heartbeat_age.as_secs() < 60, "{node:?}");
    }
}

#[test]
fn bad_node_ids_and_addresses_are_typed_errors() {
    let db = TestSchema::new();
    let coordinator = db.coordinator();
    for (id, advertise, what) in [
        ("", "127.0.0.1:5701", "node id"),
        ("node 1", "127.0.0.1:5701", "node id"),
        ("node-1", "127.0.0.1", "advertise address"),
        ("node-1", "127.0.0.1:0", "advertise address"),
    ] {
        match coordinator.register(id, advertise) {
            Err(ClusterError::BadInput { what: got, .. }) => assert_eq!(got, what),
            other => panic!("{id:?} {advertise:?}: {other:?}"),
        }
    }
    assert!(matches!(
        coordinator.heartbeat("node-1", u64::MAX),
        Err(ClusterError::BadInput {
            what: "incarnation",
            ..
        })
    ));
    assert_eq!(coordinator.nodes().unwrap(), []);
}
