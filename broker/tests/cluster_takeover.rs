//! Taking an owner over from a dead node (`cluster.storage = "local"`),
//! against real brokers and the real PostgreSQL: every node writes its
//! owners' queues and bindings to the owner catalogue as they change; when
//! a node is declared dead, the node its owner goes to serves it at the
//! next epoch with its queues and bindings, empty; and the dead node, back,
//! serves none of it and gives its backlog back to the owner's new node,
//! which stores it after what it holds, deduplicated.

mod common;

use std::time::{Duration, Instant};

use ciphermq_cluster::{Coordinator, PgCoordinator, PgCoordinatorConfig, Suspect};
use common::cluster::{
    cluster_state, durable_node, every_node_beats_again, process_node, record_of,
};
use common::pg::TestDb;
use common::{body, check, connect_as, fetch, ids, line, send, setup_receiver};

/// The queue names and (queue, exchange, key) bindings of a record.
fn shape(record: &serde_json::Value) -> (Vec<String>, Vec<(String, String, String)>) {
    let mut queues = Vec::new();
    let mut bindings = Vec::new();
    for q in record["queues"].as_array().expect("queues") {
        let name = q["name"].as_str().unwrap().to_owned();
        for b in q["bindings"].as_array().unwrap() {
            bindings.push((
                name.clone(),
                b["exchange"].as_str().unwrap().to_owned(),
                b["key"].as_str().unwrap().to_owned(),
            ));
        }
        queues.push(name);
    }
    (queues, bindings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_owners_queues_and_bindings_reach_the_catalogue_as_they_change() {
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let a = durable_node(&db, "node-a", 2, dir.path());
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let (epoch, record) = record_of(&db, "receiver_1", |r| !shape(r).1.is_empty()).await;
    assert_eq!(epoch, 1);
    assert_eq!(record["owner"], "receiver_1");
    assert_eq!(
        shape(&record),
        (
            vec!["receiver_1_queue".to_owned()],
            vec![("receiver_1_queue".into(), "ex".into(), "receiver_1".into())]
        )
    );

    check(
        &mut r1,
        "unbind receiver_1_queue ex receiver_1",
        "OK unbind receiver_1_queue ex receiver_1",
    )
    .await;
    record_of(&db, "receiver_1", |r| {
        shape(r) == (vec!["receiver_1_queue".to_owned()], Vec::new())
    })
    .await;
    check(
        &mut r1,
        "delete_queue receiver_1_queue",
        "OK delete_queue receiver_1_queue",
    )
    .await;
    record_of(&db, "receiver_1", |r| shape(r) == (Vec::new(), Vec::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_declared_dead_is_served_by_its_new_node_and_its_old_node_back_gives_its_backlog_back(
) {
    use common::process::BrokerProcess;
    let db = TestDb::create().await;
    let dir_a = tempfile::tempdir().unwrap();
    let (config_a, data_a) = process_node(&db, "node-a", dir_a.path());
    let a = BrokerProcess::start(&config_a);
    let dir_b = tempfile::tempdir().unwrap();
    let b = common::TestBroker::start_durable_with(
        1,
        dir_b.path(),
        "127.0.0.1:0",
        &(common::cluster::sections(&db, "node-b")
            + "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n"),
    );

    // receiver_1 lives on node-a with a backlog of 50, the first of them
    // delivered once and given back.
    let mut r1 = a.connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut sender_a = a.connect("sender_1").await;
    for i in 0..50 {
        let id = format!("old{i:02}");
        check(
            &mut sender_a,
            &format!("publish ex receiver_1 {}", body(&id, "receiver_1")),
            &format!("ACK {id}"),
        )
        .await;
        if i == 0 {
            let got = fetch(&mut r1, "receiver_1_queue", 1).await;
            assert_eq!((ids(&got), got[0].count), (vec![id.clone()], 1));
            check(
                &mut r1,
                &format!("nack {id} receiver_1_queue"),
                &format!("NACK_CONFIRMED {id}"),
            )
            .await;
        }
    }
    record_of(&db, "receiver_1", |r| !shape(r).1.is_empty()).await;

    // node-a dies; the test declares it dead, as a watcher would.
    a.kill();
    drop((r1, sender_a));
    let coordinator = PgCoordinator::connect(PgCoordinatorConfig {
        dbname: db.name.clone(),
        ..PgCoordinatorConfig::default()
    })
    .expect("coordinator");
    let seen = coordinator
        .nodes()
        .unwrap()
        .into_iter()
        .find(|n| n.node_id == "node-a")
        .expect("node-a listed");
    let suspect = Suspect {
        node_id: seen.node_id,
        incarnation: seen.incarnation,
        heartbeat_stamp: seen.heartbeat_stamp,
        silent_for: Duration::from_secs(6),
    };
    let takeover = coordinator
        .declare_dead(
            &suspect,
            "test",
            "killed by the test",
            Duration::from_secs(5),
        )
        .expect("declared dead");
    assert_eq!(takeover.placements.len(), 1);
    assert_eq!(takeover.placements[0].node_id, "node-b");
    assert_eq!(takeover.placements[0].epoch, 2);

    // node-b serves receiver_1 at epoch 2, its queue and binding declared,
    // empty: the backlog stayed on node-a's disk.
    let mut r1_b = connect_as(&b, "receiver_1").await;
    let here = format!("OK locate receiver_1 node-b {} 2", b.addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        send(&mut r1_b, "locate receiver_1").await;
        if line(&mut r1_b).await == here {
            break;
        }
        assert!(Instant::now() < deadline, "node-b never took receiver_1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut sender_b = connect_as(&b, "sender_1").await;
    let fresh: Vec<String> = (0..10).map(|i| format!("new{i:02}")).collect();
    for id in &fresh {
        check(
            &mut sender_b,
            &format!("publish ex receiver_1 {}", body(id, "receiver_1")),
            &format!("ACK {id}"),
        )
        .await;
    }
    let got = fetch(&mut r1_b, "receiver_1_queue", 100).await;
    assert_eq!(ids(&got), fresh, "only what came after the takeover");

    // Operators see it: /api/cluster (and `ciphermq-admin nodes`) lists the
    // takeover, who declared it and why.
    let admin = b.admin_addr().expect("admin endpoint");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let doc: serde_json::Value = serde_json::from_str(
            &common::admin_http::request(admin, Some("admin"), "GET", "/api/cluster")
                .await
                .expect("/api/cluster")
                .body,
        )
        .expect("JSON");
        let recent = &doc["cluster"]["recent_takeovers"][0];
        if recent["node_id"] == "node-a" {
            assert_eq!(recent["by_node"], "test");
            assert_eq!(recent["owners"], 1);
            assert_eq!(recent["reason"], "killed by the test");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/api/cluster never listed the takeover: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // node-a comes back: it serves none of receiver_1 and sends everyone
    // to node-b at epoch 2.
    let a = BrokerProcess::start(&config_a);
    let there = format!("receiver_1 node-b {} 2", b.addr);
    let mut r1_a = a.connect("receiver_1").await;
    check(
        &mut r1_a,
        "consume receiver_1_queue 10",
        &format!("Error: moved {there}"),
    )
    .await;
    let mut sender_a = a.connect("sender_1").await;
    check(
        &mut sender_a,
        &format!("publish ex receiver_1 {}", body("late", "receiver_1")),
        &format!("NACK late moved {there}"),
    )
    .await;

    // node-a gives the backlog back: node-b stores it after what its queue
    // holds, in order, with its delivery counts, and node-a deletes its
    // copy.
    let old: Vec<String> = (0..50).map(|i| format!("old{i:02}")).collect();
    let mut handed = Vec::new();
    let mut counts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while handed.len() < old.len() {
        assert!(
            Instant::now() < deadline,
            "the backlog was not given back: {} of {} arrived",
            handed.len(),
            old.len()
        );
        let got = fetch(&mut r1_b, "receiver_1_queue", 100).await;
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        handed.extend(ids(&got));
        counts.extend(got.iter().map(|g| g.count));
    }
    assert_eq!(handed, old, "the old backlog, once each, in order");
    assert_eq!(
        counts.iter().position(|c| *c != 1),
        Some(0),
        "only old00 was delivered before: {counts:?}"
    );
    assert_eq!(counts[0], 2, "old00's count goes on from node-a's delivery");
    let gone =
        |p: &std::path::Path| !p.exists() || p.read_dir().map_or(true, |mut d| d.next().is_none());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(gone(&data_a.join("queues").join("receiver_1_queue")) && gone(&data_a.join("handback")))
    {
        assert!(Instant::now() < deadline, "node-a kept its copy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing more comes.
    assert!(fetch(&mut r1_b, "receiver_1_queue", 100).await.is_empty());
    drop(a);
}

/// Publishes `ids` for receiver_1 through `conn`, one at a time, asserting
/// each is acknowledged.
async fn publish_acked(conn: &mut ciphermq_clients::connection::Connection, ids: &[String]) {
    for id in ids {
        check(
            conn,
            &format!("publish ex receiver_1 {}", body(id, "receiver_1")),
            &format!("ACK {id}"),
        )
        .await;
    }
}

/// Automatic, storage local: the node holding receiver_1 is paused
/// (SIGSTOP) for 15 s. The other node declares it dead once its heartbeat
/// stood still for the lease plus the margin, and serves receiver_1 at
/// epoch 2; the paused node, resumed, finds it was declared dead, joins
/// again holding nothing, and gives its backlog back. Every acknowledged
/// message is delivered, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_is_taken_over_and_gives_its_backlog_back_when_it_resumes() {
    use common::process::BrokerProcess;
    let db = TestDb::create().await;
    let dir_a = tempfile::tempdir().unwrap();
    let (config_a, _data_a) = process_node(&db, "node-a", dir_a.path());
    let a = BrokerProcess::start(&config_a);
    let dir_b = tempfile::tempdir().unwrap();
    let b = durable_node(&db, "node-b", 1, dir_b.path());

    let mut r1 = a.connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut sender_a = a.connect("sender_1").await;
    let before: Vec<String> = (0..200).map(|i| format!("before{i:03}")).collect();
    publish_acked(&mut sender_a, &before).await;
    record_of(&db, "receiver_1", |r| !shape(r).1.is_empty()).await;

    a.signal("STOP");
    let paused = Instant::now();
    let mut r1_b = connect_as(&b, "receiver_1").await;
    let here = format!("OK locate receiver_1 node-b {} 2", b.addr);
    loop {
        send(&mut r1_b, "locate receiver_1").await;
        if line(&mut r1_b).await == here {
            break;
        }
        assert!(
            paused.elapsed() < Duration::from_secs(60),
            "node-b never took receiver_1 over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = paused.elapsed();
    let mut sender_b = connect_as(&b, "sender_1").await;
    let during: Vec<String> = (0..100).map(|i| format!("during{i:03}")).collect();
    publish_acked(&mut sender_b, &during).await;
    let first_ack = paused.elapsed();

    // Resumed after 15 s in all.
    while paused.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.signal("CONT");
    let resumed = Instant::now();
    let mut got: Vec<String> = Vec::new();
    while got.len() < before.len() + during.len() {
        assert!(
            resumed.elapsed() < Duration::from_secs(120),
            "only {} of {} acknowledged messages arrived",
            got.len(),
            before.len() + during.len()
        );
        let batch = fetch(&mut r1_b, "receiver_1_queue", 500).await;
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got.extend(ids(&batch));
    }
    let handed_back = resumed.elapsed();
    eprintln!(
        "paused node: taken over {} ms after the pause, first ack on node-b after {} ms; backlog on node-b {} ms after the resume",
        took.as_millis(),
        first_ack.as_millis(),
        handed_back.as_millis()
    );
    // What came after the takeover first, then the given-back backlog in
    // its order; nothing twice.
    let mut expected = during.clone();
    expected.extend(before.iter().cloned());
    assert_eq!(got, expected);
    assert!(fetch(&mut r1_b, "receiver_1_queue", 500).await.is_empty());

    // node-a serves none of receiver_1 any more.
    let mut r1_a = a.connect("receiver_1").await;
    check(
        &mut r1_a,
        "consume receiver_1_queue 10",
        &format!("Error: moved receiver_1 node-b {} 2", b.addr),
    )
    .await;
    drop(a);
}

/// `node_id`'s sections with its coordinator and bridge reaching
/// PostgreSQL through `hole`, and a 2 s lease.
fn through(db: &TestDb, node_id: &str, hole: Option<&common::blackhole::Blackhole>) -> String {
    let text = common::cluster::sections(db, node_id).replace("lease_secs = 5", "lease_secs = 2");
    match hole {
        Some(hole) => text.replace("port = 5432", &format!("port = {}", hole.addr.port())),
        None => text,
    }
}

/// Every message of receiver_1's queue on `conn`, fetched until `count`
/// came (waited for up to two minutes).
async fn fetch_until(
    conn: &mut ciphermq_clients::connection::Connection,
    count: usize,
) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while got.len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} messages arrived",
            got.len()
        );
        let batch = fetch(conn, "receiver_1_queue", 500).await;
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got.extend(ids(&batch));
    }
    got
}

/// PostgreSQL away from every node of three for a minute, many times the
/// lease and margin: nobody could heartbeat, and nobody declares
/// anybody dead, during the outage or after it. Publishing goes on
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_away_from_every_node_past_the_lease_makes_no_takeover() {
    use common::blackhole::Blackhole;
    use common::TestBroker;
    let db = TestDb::create().await;
    let hole = Blackhole::start().await;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<TestBroker> = ["node-a", "node-b", "node-c"]
        .iter()
        .zip(&dirs)
        .map(|(id, dir)| {
            TestBroker::start_durable_with(
                1,
                dir.path(),
                "127.0.0.1:0",
                &through(&db, id, Some(&hole)),
            )
        })
        .collect();
    let _reopen = hole.reopen_on_drop();
    let a = &nodes[0];
    let mut r1 = connect_as(a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut sender = connect_as(a, "sender_1").await;
    let mut acked: Vec<String> = (0..100).map(|i| format!("before{i:03}")).collect();
    publish_acked(&mut sender, &acked).await;
    every_node_beats_again(&db).await;
    let before = cluster_state(&db).await;
    assert_eq!(before.1, 0);

    hole.cut.store(true, std::sync::atomic::Ordering::Relaxed);
    let cut = Instant::now();
    let mut i = 0;
    while cut.elapsed() < Duration::from_secs(60) {
        let id = format!("cut{i:04}");
        publish_acked(&mut sender, std::slice::from_ref(&id)).await;
        acked.push(id);
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hole.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    every_node_beats_again(&db).await;
    assert_eq!(
        cluster_state(&db).await,
        before,
        "no takeover, no placement change"
    );
    // Silent past its heartbeat timeout (60 s), the receiver's first
    // connection was closed: it connects again.
    drop(r1);
    let mut r1 = connect_as(a, "receiver_1").await;
    let got = fetch_until(&mut r1, acked.len()).await;
    assert_eq!(got, acked);
}

/// One node of three cut off from PostgreSQL (its packets dropped): the
/// others declare it dead after the lease and margin and one serves its
/// owner. With storage local, the cut-off node cannot tell its own cut from
/// PostgreSQL's outage, so it goes on acknowledging for its owners; once
/// back, it finds it was declared dead and gives all of it back. Nothing
/// acknowledged, on either side, is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_postgres_alone_is_taken_over_and_nothing_acknowledged_is_lost() {
    use common::blackhole::Blackhole;
    use common::TestBroker;
    let db = TestDb::create().await;
    let hole = Blackhole::start().await;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = TestBroker::start_durable_with(
        1,
        dirs[0].path(),
        "127.0.0.1:0",
        &through(&db, "node-a", Some(&hole)),
    );
    let others = [
        TestBroker::start_durable_with(
            1,
            dirs[1].path(),
            "127.0.0.1:0",
            &through(&db, "node-b", None),
        ),
        TestBroker::start_durable_with(
            1,
            dirs[2].path(),
            "127.0.0.1:0",
            &through(&db, "node-c", None),
        ),
    ];
    let _reopen = hole.reopen_on_drop();
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut sender_a = connect_as(&a, "sender_1").await;
    let before: Vec<String> = (0..100).map(|i| format!("before{i:03}")).collect();
    publish_acked(&mut sender_a, &before).await;
    record_of(&db, "receiver_1", |r| !shape(r).1.is_empty()).await;

    hole.cut.store(true, std::sync::atomic::Ordering::Relaxed);
    let cut = Instant::now();
    let on_a: Vec<String> = (0..50).map(|i| format!("cut-a{i:03}")).collect();
    publish_acked(&mut sender_a, &on_a).await;
    let heir = loop {
        let (placements, _) = cluster_state(&db).await;
        let p = placements
            .iter()
            .find(|p| p.0 == "receiver_1")
            .unwrap()
            .clone();
        if p.2 == 2 {
            break p.1;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "nobody took receiver_1 over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = cut.elapsed();
    let heir_id = heir;
    let heir = if heir_id == "node-b" {
        &others[0]
    } else {
        &others[1]
    };
    let mut r1_heir = connect_as(heir, "receiver_1").await;
    let here = format!("OK locate receiver_1 {heir_id} {} 2", heir.addr);
    loop {
        let answer = common::ask(&mut r1_heir, "locate receiver_1").await;
        if answer == here {
            break;
        }
        assert!(cut.elapsed() < Duration::from_secs(60), "{answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut sender_heir = connect_as(heir, "sender_1").await;
    let on_heir: Vec<String> = (0..50).map(|i| format!("heir{i:03}")).collect();
    publish_acked(&mut sender_heir, &on_heir).await;

    hole.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    let restored = Instant::now();
    let got = fetch_until(&mut r1_heir, before.len() + on_a.len() + on_heir.len()).await;
    eprintln!(
        "cut-off node: taken over {} ms after the cut; its backlog on the new node {} ms after the link came back",
        took.as_millis(),
        restored.elapsed().as_millis()
    );
    let mut expected = on_heir.clone();
    expected.extend(before.iter().cloned());
    expected.extend(on_a.iter().cloned());
    assert_eq!(
        got, expected,
        "each acknowledged message once, the given-back ones in their order"
    );
    drop(a);
}
