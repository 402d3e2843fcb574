//! Connecting: the schema is created once however many nodes start, and a
//! coordinator that cannot connect says where and why.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use ciphermq_cluster::{ClusterError, Coordinator, PgCoordinator, PgCoordinatorConfig};
use common::TestSchema;

#[test]
fn nodes_starting_at_once_create_the_schema_once_and_again_is_harmless() {
    let db = TestSchema::new();
    let start = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let config = db.config();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                PgCoordinator::connect(config)
            })
        })
        .collect();
    let nodes: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().unwrap().expect("connects"))
        .collect();
    nodes[0].register("node-1", "127.0.0.1:5701").unwrap();
    nodes[1].place("alice", "node-1").unwrap();
    drop(nodes);
    // Once more on the existing tables: nothing lost.
    let again = db.coordinator();
    assert_eq!(again.nodes().unwrap().len(), 1);
    assert_eq!(again.locate("alice").unwrap().unwrap().epoch, 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM information_schema.tables WHERE table_schema = '{schema}'"),
        9,
        "cluster_nodes, cluster_placements, cluster_exchanges, cluster_moves, cluster_handoff, cluster_takeovers, cluster_owner_topology, cluster_handbacks, cluster_handback_parts"
    );
}

#[test]
fn a_wrong_port_is_a_connect_error_naming_the_server() {
    let db = TestSchema::new();
    // Bind and drop a listener: a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = PgCoordinatorConfig {
        port,
        connect_timeout: Duration::from_secs(5),
        ..db.config()
    };
    match PgCoordinator::connect(config) {
        Err(ClusterError::Connect { target, cause }) => {
            assert_eq!(target, format!("127.0.0.1:{port}/test"));
            assert!(!cause.is_empty());
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[test]
fn a_schema_name_that_is_not_a_plain_identifier_is_refused() {
    let config = PgCoordinatorConfig {
        schema: "x; DROP SCHEMA public".to_owned(),
        ..PgCoordinatorConfig::default()
    };
    assert!(matches!(
        PgCoordinator::connect(config),
        Err(ClusterError::BadSchemaName { .. })
    ));
}

#[test]
fn a_broken_connection_is_reopened_by_the_next_call() {
    let db = TestSchema::new();
    let coordinator = db.coordinator();
    coordinator.register("node-1", "127.0.0.1:5701").unwrap();
    let mine = format!(
        "FROM pg_stat_activity WHERE application_name = '{}'",
        db.config().application_name()
    );
    let old_pid = db.scalar(&format!("SELECT min(pid)::bigint {mine}"));
    // Waits (up to 10 s) for the backend to be gone.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) {mine}"
        )),
        1
    );
    // The call that finds the connection broken may fail (typed, naming the
    // table); the next one reconnects.
    let mut failures = Vec::new();
    let nodes = loop {
        match coordinator.nodes() {
            Ok(nodes) => break nodes,
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        ClusterError::Query {
                            table: "cluster_nodes",
                            ..
                        }
                    ),
                    "{e}"
                );
                failures.push(e);
                assert!(failures.len() < 3, "never reconnected: {failures:?}");
            }
        }
    };
    assert_eq!(nodes.len(), 1);
    let new_pid = db.scalar(&format!("SELECT min(pid)::bigint {mine}"));
    assert_ne!(new_pid, old_pid, "a new connection");
}
