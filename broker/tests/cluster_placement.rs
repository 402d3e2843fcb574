//! A cluster of three real brokers on loopback, coordinated by the real
//! PostgreSQL: owners live on the node of their first command, every other
//! node redirects to it with the exact lines of the protocol, nothing is
//! stored on a node that does not hold the owner, and an exchange declared
//! on one node is usable on every node.

mod common;

use std::time::Duration;

use common::pg::TestDb;
use common::{ask, body, check, connect_as, expect, next_delivery, setup_receiver, TestBroker};

const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// A node of the cluster kept in `db`, with `shards` shards and its admin
/// endpoint.
fn node(db: &TestDb, node_id: &str, shards: usize) -> TestBroker {
    // The coordinator's link does not speak TLS yet, and a node refuses a
    // config that asks for it: this test pins the plaintext link.
    let extra = format!(
        "{}\n[cluster]\nenabled = true\nnode_id = \"{node_id}\"\nlease_secs = 5\n\
         [admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n",
        db.config_with_tls(AES_KEY, "disable", None)
    );
    TestBroker::start_with(shards, &extra)
}

/// `GET path` on `broker`'s admin endpoint as admin: the JSON body.
async fn admin_json(broker: &TestBroker, path: &str) -> serde_json::Value {
    let addr = broker.admin_addr().expect("admin endpoint");
    let reply = common::admin_http::request(addr, Some("admin"), "GET", path)
        .await
        .expect("admin request");
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    serde_json::from_str(&reply.body).expect("JSON")
}

/// Asks `cmd` until the reply is `want` (the nodes' snapshots catch up
/// with the coordinator within a second), failing after 20 s.
async fn ask_until(conn: &mut ciphermq_clients::connection::Connection, cmd: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = ask(conn, cmd).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{cmd}: still {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_live_where_they_first_connected_and_other_nodes_redirect_there() {
    let db = TestDb::create().await;
    let a = node(&db, "node-a", 1);
    let b = node(&db, "node-b", 2);
    let c = node(&db, "node-c", 1);
    let all = format!(
        "OK nodes node-a@{} node-b@{} node-c@{}",
        a.addr, b.addr, c.addr
    );

    // Every node lists every live node, sorted by id, whoever asks.
    for (broker, cn) in [(&a, "sender_1"), (&b, "receiver_2"), (&c, "admin")] {
        let mut conn = connect_as(broker, cn).await;
        ask_until(&mut conn, "nodes", &all).await;
    }

    // receiver_1 starts on node-a, receiver_2 on node-b: their first
    // commands place them there (epoch 1).
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut r2 = connect_as(&b, "receiver_2").await;
    setup_receiver(&mut r2, "receiver_2").await;
    let at_a = format!("receiver_1 node-a {} 1", a.addr);
    let at_b = format!("receiver_2 node-b {} 1", b.addr);

    // Any node says where they are.
    let mut sender_c = connect_as(&c, "sender_1").await;
    check(
        &mut sender_c,
        "locate receiver_1",
        &format!("OK locate {at_a}"),
    )
    .await;
    check(
        &mut sender_c,
        "locate receiver_2",
        &format!("OK locate {at_b}"),
    )
    .await;
    check(&mut r1, "locate receiver_1", &format!("OK locate {at_a}")).await;

    // A receiver on the wrong node is sent to its own, whatever it asks
    // about its resources.
    let mut r1_on_b = connect_as(&b, "receiver_1").await;
    let moved = format!("Error: moved {at_a}");
    for cmd in [
        "declare_queue receiver_1_queue",
        "declare_queue receiver_1_other",
        "bind receiver_1_queue ex receiver_1",
        "unbind receiver_1_queue ex receiver_1",
        "consume receiver_1_queue",
        "fetch receiver_1_queue 5",
        "purge_queue receiver_1_queue",
        "delete_queue receiver_1_queue",
        "nack some-id receiver_1_queue",
    ] {
        check(&mut r1_on_b, cmd, &moved).await;
    }
    // The ACL still comes first: another receiver's queue is denied, not
    // redirected.
    let denied = ask(&mut r1_on_b, "consume receiver_2_queue").await;
    assert!(denied.starts_with("Access denied"), "{denied}");

    // A publish for an owner on another node is refused with its place and
    // stores nothing; the same id sent to the right node is stored once.
    let nack = format!("NACK m1 moved {at_a}");
    check(
        &mut sender_c,
        &format!("publish ex receiver_1 {}", body("m1", "receiver_1")),
        &nack,
    )
    .await;
    let mut sender_b = connect_as(&b, "sender_1").await;
    check(
        &mut sender_b,
        &format!("publish ex receiver_1 {}", body("m1", "receiver_1")),
        &nack,
    )
    .await;
    let mut sender_a = connect_as(&a, "sender_1").await;
    check(
        &mut sender_a,
        &format!("publish ex receiver_1 {}", body("m1", "receiver_1")),
        "ACK m1",
    )
    .await;
    check(
        &mut sender_a,
        &format!("publish ex receiver_1 {}", body("m1", "receiver_1")),
        "ACK m1",
    )
    .await;
    check(
        &mut r1,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
    )
    .await;
    let got = next_delivery(&mut r1).await;
    assert_eq!(
        (got.id.as_str(), got.queue.as_str(), got.count),
        ("m1", "receiver_1_queue", 1)
    );
    check(&mut r1, "ack m1", "ACK_CONFIRMED m1").await;
    check(
        &mut r1,
        "purge_queue receiver_1_queue",
        "OK purge_queue receiver_1_queue 0",
    )
    .await;

    // A batch: each element is judged by its own envelope.
    let batch = format!(
        "publish_batch ex receiver_2 [{},{}]",
        body("b1", "receiver_2"),
        body("b2", "receiver_1")
    );
    check(&mut sender_b, &batch, "ACK b1").await;
    let second = common::next(&mut sender_b).await;
    assert_eq!(second, format!("NACK b2 moved {at_a}"));

    // publish_for stores only into the named owner's queues, on its node.
    let for_r2 = format!(
        "publish_for receiver_2 ex receiver_2 {}",
        body("f1", "receiver_2")
    );
    check(&mut sender_a, &for_r2, &format!("NACK f1 moved {at_b}")).await;
    check(&mut sender_b, &for_r2, "ACK f1").await;
    let fetched = common::fetch(&mut r2, "receiver_2_queue", 10).await;
    assert_eq!(common::ids(&fetched), ["b1", "f1"]);

    // An owner no node holds yet is placed by `locate`, on the node asked.
    check(
        &mut sender_c,
        "locate receiver_1_2",
        &format!("OK locate receiver_1_2 node-c {} 1", c.addr),
    )
    .await;
    let mut r12_on_a = connect_as(&a, "receiver_1_2").await;
    check(
        &mut r12_on_a,
        "declare_queue receiver_1_2_queue",
        &format!("Error: moved receiver_1_2 node-c {} 1", c.addr),
    )
    .await;

    // A public key registered on one node is served by every node.
    let key = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";
    check(
        &mut r1,
        &format!("register_public_key {key}"),
        "Public key registered",
    )
    .await;
    ask_until(
        &mut sender_c,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {key}"),
    )
    .await;

    // An exchange declared on one node exists on every node: its type is
    // the catalogue's, and a node that never saw it binds to it.
    let mut admin_a = connect_as(&a, "admin").await;
    check(
        &mut admin_a,
        "declare_exchange events topic",
        "OK declare_exchange events",
    )
    .await;
    let mut admin_c = connect_as(&c, "admin").await;
    check(
        &mut admin_c,
        "declare_exchange events direct",
        "Error: exchange events exists with type topic",
    )
    .await;
    ask_until(
        &mut r2,
        "bind receiver_2_queue events receiver_2.#",
        "OK bind receiver_2_queue events receiver_2.#",
    )
    .await;
    check(
        &mut sender_b,
        &format!("publish events receiver_2.x {}", body("e1", "receiver_2")),
        "ACK e1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_on_its_own_says_it_is_no_cluster_node() {
    let broker = TestBroker::start(1);
    let mut conn = connect_as(&broker, "sender_1").await;
    let not = "Error: this broker is not a cluster node (cluster.enabled = false)";
    check(&mut conn, "nodes", not).await;
    check(&mut conn, "locate receiver_1", not).await;
    // publish_for is a publish for one owner's queues: on one broker, every
    // owner is here.
    let mut r1 = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut admin = connect_as(&broker, "admin").await;
    expect(&mut admin, "declare_queue audit", "OK declare_queue audit").await;
    expect(
        &mut admin,
        "bind audit ex receiver_1",
        "OK bind audit ex receiver_1",
    )
    .await;
    check(
        &mut conn,
        &format!(
            "publish_for receiver_1 ex receiver_1 {}",
            body("p1", "receiver_1")
        ),
        "ACK p1",
    )
    .await;
    check(&mut admin, "purge_queue audit", "OK purge_queue audit 0").await;
    check(
        &mut r1,
        "purge_queue receiver_1_queue",
        "OK purge_queue receiver_1_queue 1",
    )
    .await;
    check(
        &mut conn,
        &format!(
            "publish_for admin ex receiver_1 {}",
            body("p2", "receiver_1")
        ),
        "ACK p2",
    )
    .await;
    check(
        &mut r1,
        "purge_queue receiver_1_queue",
        "OK purge_queue receiver_1_queue 0",
    )
    .await;
    check(&mut admin, "purge_queue audit", "OK purge_queue audit 1").await;
    check(
        &mut conn,
        &format!(
            "publish_for receiver_2 ex receiver_1 {}",
            body("p3", "receiver_1")
        ),
        "NACK p3 no_route",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_shows_the_nodes_and_where_each_owner_lives() {
    let db = TestDb::create().await;
    let a = node(&db, "node-a", 1);
    let b = node(&db, "node-b", 1);
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut r2 = connect_as(&b, "receiver_2").await;
    setup_receiver(&mut r2, "receiver_2").await;

    // node-b learns both nodes and both owners within a second or so.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let doc = loop {
        let doc = admin_json(&b, "/api/cluster").await;
        let c = &doc["cluster"];
        if c["nodes"].as_array().map(Vec::len) == Some(2) && c["owners_total"] == 2 {
            break doc;
        }
        assert!(tokio::time::Instant::now() < deadline, "{doc}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(doc["enabled"], true);
    let c = &doc["cluster"];
    assert_eq!(c["node_id"], "node-b");
    assert_eq!(c["advertise"], b.addr.as_str());
    assert_eq!(c["coordinator_connected"], true);
    assert_eq!(c["fenced"], false);
    assert_eq!(c["incarnation"], 1);
    let nodes: Vec<(String, String, u64, bool)> = c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap().to_owned(),
                n["advertise"].as_str().unwrap().to_owned(),
                n["owners"].as_u64().unwrap(),
                n["this_node"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [
            ("node-a".to_owned(), a.addr.clone(), 1, false),
            ("node-b".to_owned(), b.addr.clone(), 1, true)
        ]
    );
    let owners = c["owners"].to_string();
    assert_eq!(
        owners,
        r#"[{"epoch":1,"node_id":"node-a","owner":"receiver_1"},{"epoch":1,"node_id":"node-b","owner":"receiver_2"}]"#
    );

    // The same in /metrics.
    let addr = b.admin_addr().unwrap();
    let metrics = common::admin_http::request(addr, Some("admin"), "GET", "/metrics")
        .await
        .unwrap()
        .body;
    for line in [
        "ciphermq_cluster_nodes 2",
        "ciphermq_cluster_owners{node=\"node-a\"} 1",
        "ciphermq_cluster_owners{node=\"node-b\"} 1",
        "ciphermq_cluster_coordinator_connected 1",
        "ciphermq_cluster_fenced 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ciphermq_cluster_coordinator_calls_total ")),
        "{metrics}"
    );

    // A broker on its own says it is none.
    let lone = TestBroker::start_with(1, "[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n");
    assert_eq!(
        admin_json(&lone, "/api/cluster").await,
        serde_json::json!({"enabled": false})
    );
}

/// `ciphermq_cluster_coordinator_calls_total` of `broker`'s /metrics.
async fn coordinator_calls(broker: &TestBroker) -> u64 {
    let addr = broker.admin_addr().expect("admin endpoint");
    let body = common::admin_http::request(addr, Some("admin"), "GET", "/metrics")
        .await
        .expect("metrics")
        .body;
    body.lines()
        .find_map(|l| l.strip_prefix("ciphermq_cluster_coordinator_calls_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the coordinator call counter")
}

/// The calls a node makes to PostgreSQL do not grow with the publish rate:
/// a publish costs none, so calls per second idle and under a full
/// pipelined load are the poll's, whatever the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_calls_per_second_do_not_grow_with_the_publish_rate() {
    let db = TestDb::create().await;
    let a = node(&db, "node-a", 1);
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;

    // Idle: at least 2 s of calls.
    let (calls0, t0) = (coordinator_calls(&a).await, std::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (calls1, t1) = (coordinator_calls(&a).await, std::time::Instant::now());
    let idle_rate = (calls1 - calls0) as f64 / (t1 - t0).as_secs_f64();

    // Under load: pipelined publishes for at least 2 s.
    let mut s = connect_as(&a, "sender_1").await;
    let mut published = 0u64;
    while t1.elapsed() < Duration::from_secs(2) {
        for i in 0..500 {
            common::send(
                &mut s,
                &format!(
                    "publish ex receiver_1 {}",
                    body(&format!("m{published}-{i}"), "receiver_1")
                ),
            )
            .await;
        }
        for i in 0..500 {
            assert_eq!(common::line(&mut s).await, format!("ACK m{published}-{i}"));
        }
        published += 500;
        check(
            &mut r1,
            "purge_queue receiver_1_queue",
            "OK purge_queue receiver_1_queue 500",
        )
        .await;
    }
    let (calls2, t2) = (coordinator_calls(&a).await, std::time::Instant::now());
    let busy_rate = (calls2 - calls1) as f64 / (t2 - t1).as_secs_f64();
    println!(
        "coordinator calls: {idle_rate:.1}/s idle, {busy_rate:.1}/s while {published} messages were published ({:.0}/s)",
        published as f64 / (t2 - t1).as_secs_f64()
    );
    assert!(published >= 500);
    // The poll's pace, not the publishes': every 200 ms two reads
    // (placements, moves), every 500 ms three more (nodes, exchanges,
    // backlogs given back), a heartbeat every lease/3: about 17/s whatever
    // the load, where one
    // call per publish would be thousands a second. (A ceiling, not a comparison with the idle rate:
    // a busy host slows ticks, never adds to them.)
    assert!(
        busy_rate <= 21.0,
        "{busy_rate} calls/s under load ({idle_rate} idle)"
    );
    assert!(idle_rate <= 21.0, "{idle_rate} calls/s idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_deleted_on_one_node_goes_from_every_node() {
    let db = TestDb::create().await;
    let a = node(&db, "node-a", 1);
    let b = node(&db, "node-b", 1);
    let mut admin_a = connect_as(&a, "admin").await;
    check(
        &mut admin_a,
        "declare_exchange events topic",
        "OK declare_exchange events",
    )
    .await;
    let mut r2 = connect_as(&b, "receiver_2").await;
    expect(
        &mut r2,
        "declare_queue receiver_2_queue",
        "OK declare_queue receiver_2_queue",
    )
    .await;
    ask_until(
        &mut r2,
        "bind receiver_2_queue events receiver_2.#",
        "OK bind receiver_2_queue events receiver_2.#",
    )
    .await;
    let mut s = connect_as(&b, "sender_1").await;
    let publish = |id: &str| format!("publish events receiver_2.x {}", body(id, "receiver_2"));
    check(&mut s, &publish("e1"), "ACK e1").await;

    // Deleted on node-a (which holds no binding on it): node-b drops it,
    // its bindings with it, and does not bring it back.
    check(
        &mut admin_a,
        "delete_exchange events",
        "OK delete_exchange events",
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        n += 1;
        let id = format!("e{n}x");
        let reply = ask(&mut s, &publish(&id)).await;
        if reply == format!("NACK {id} no_route") {
            break;
        }
        assert_eq!(reply, format!("ACK {id}"));
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-b still routes through events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Gone for good on both nodes: another type may take the name.
    let mut admin_b = connect_as(&b, "admin").await;
    check(
        &mut admin_b,
        "declare_exchange events direct",
        "OK declare_exchange events",
    )
    .await;
    check(
        &mut admin_a,
        "declare_exchange events topic",
        "Error: exchange events exists with type direct",
    )
    .await;
}
