//! The cluster under faults, with the real PostgreSQL and real brokers: a
//! node killed with SIGKILL under load and restarted keeps its owners (same
//! node, same epoch, no placement change) and loses nothing it acknowledged;
//! the coordinator's PostgreSQL connections cut twenty times under load change
//! no placement and refuse no publish.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::blackhole::Blackhole;
use common::pg::TestDb;
use common::process::{assert_none_lost, drain_counting, load_through_crashes, BrokerProcess};
use common::{ask, body, config_text, connect_as, pki, setup_receiver, TestBroker};

const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// The `[database]`, `[encryption]` and `[cluster]` sections of a node.
fn cluster_sections(db: &TestDb, node_id: &str) -> String {
    format!(
        "{}\n[cluster]\nenabled = true\nnode_id = \"{node_id}\"\nlease_secs = 5\n",
        db.config_with_tls(AES_KEY, "disable", None)
    )
}

/// owner → (node_id, epoch, version) of every placement.
async fn placements(db: &TestDb) -> Vec<(String, String, i64, i64)> {
    let client = db.client().await;
    client
        .query(
            "SELECT owner, node_id, epoch, version FROM ciphermq_cluster.cluster_placements \
             ORDER BY owner",
            &[],
        )
        .await
        .expect("read placements")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_and_restarted_keeps_its_owners_and_every_acked_message() {
    const CRASHES: usize = 5;
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let config = durable_node(dir.path(), &db, "node-a").await;
    // A second node, which must keep sending receiver_1's publishers to
    // node-a through every crash.
    let b = TestBroker::start_with(1, &cluster_sections(&db, "node-b"));
    let before = placements(&db).await;
    assert_eq!(
        before
            .iter()
            .map(|p| (p.0.as_str(), p.1.as_str(), p.2))
            .collect::<Vec<_>>(),
        [("receiver_1", "node-a", 1)]
    );

    let (acked, broker) = load_through_crashes(&config, CRASHES, 3000, BrokerProcess::kill).await;

    // No placement changed: same node, same epoch, same version.
    assert_eq!(placements(&db).await, before);
    let mut sender_b = connect_as(&b, "sender_1").await;
    let reply = ask(
        &mut sender_b,
        &format!("publish ex receiver_1 {}", body("late", "receiver_1")),
    )
    .await;
    assert!(
        reply.starts_with("NACK late moved receiver_1 node-a ") && reply.ends_with(" 1"),
        "{reply}"
    );
    let delivered = drain_counting(&broker).await;
    assert_none_lost(
        &format!("cluster node: {CRASHES} SIGKILLs"),
        &acked,
        &delivered,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_the_coordinators_postgres_connections_changes_no_placement_and_refuses_no_publish()
{
    const CUTS: usize = 20;
    let db = TestDb::create().await;
    let a = TestBroker::start_with(1, &cluster_sections(&db, "node-a"));
    let b = TestBroker::start_with(1, &cluster_sections(&db, "node-b"));
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut r2 = connect_as(&b, "receiver_2").await;
    setup_receiver(&mut r2, "receiver_2").await;
    let before = placements(&db).await;
    assert_eq!(before.len(), 2);

    // A publisher on each node, to the owner that node holds, the whole
    // time the connections are being cut.
    let stop = Arc::new(AtomicBool::new(false));
    let mut publishers = Vec::new();
    for (broker, receiver) in [(&a, "receiver_1"), (&b, "receiver_2")] {
        let addr = broker.addr.clone();
        let stop = stop.clone();
        publishers.push(tokio::spawn(async move {
            publish_until(&addr, receiver, stop).await
        }));
    }

    // Meanwhile the coordinators' connections are cut, each time once the
    // nodes have connected again.
    let admin = db.client().await;
    let mut cut = 0;
    while cut < CUTS {
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND application_name LIKE 'ciphermq-cluster %'",
                &[&db.name],
            )
            .await
            .expect("terminate");
        if !rows.is_empty() {
            cut += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    stop.store(true, Ordering::Relaxed);
    for publisher in publishers {
        let (sent, acked, refused) = publisher.await.expect("publisher");
        println!("{sent} published while the connections were cut, {acked} acked");
        assert_eq!(refused, Vec::<String>::new(), "no publish may be refused");
        assert_eq!(acked, sent);
        assert!(sent > 0);
    }
    assert_eq!(placements(&db).await, before, "no placement changed");
    // Both nodes still redirect exactly as before.
    let mut s = connect_as(&a, "sender_2").await;
    let reply = ask(
        &mut s,
        &format!("publish ex receiver_2 {}", body("x", "receiver_2")),
    )
    .await;
    assert_eq!(
        reply,
        format!("NACK x moved receiver_2 node-b {} 1", b.addr)
    );
}

/// Publishes to `receiver` pipelined (200 in flight) as sender_1 until
/// `stop` is set: how many were sent, how many acked, and every other
/// reply.
async fn publish_until(
    addr: &str,
    receiver: &str,
    stop: Arc<AtomicBool>,
) -> (usize, usize, Vec<String>) {
    let opts = ciphermq_clients::connection::TlsClientOptions::for_cn(&pki().certs, "sender_1");
    let conn = ciphermq_clients::connection::Connection::connect(addr, &opts)
        .await
        .expect("connect");
    let (mut rd, mut wr) = conn.into_split();
    let (mut sent, mut answered, mut acked) = (0, 0, 0);
    let mut refused = Vec::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping && answered == sent {
            return (sent, acked, refused);
        }
        while !stopping && sent - answered < 200 {
            wr.queue_line(&format!(
                "publish ex {receiver} {}",
                body(&format!("{receiver}-{sent}"), receiver)
            ));
            sent += 1;
        }
        wr.flush().await.expect("flush");
        let line = tokio::time::timeout(common::TIMEOUT, rd.read_line())
            .await
            .expect("a reply in time")
            .expect("read")
            .expect("a reply before EOF")
            .to_owned();
        if line == format!("ACK {receiver}-{answered}") {
            acked += 1;
        } else {
            refused.push(line);
        }
        answered += 1;
    }
}

/// Writes `dir/broker.toml` (a durable node of the cluster in `db`) and
/// places receiver_1 on it with its queue: the config's path.
async fn durable_node(dir: &Path, db: &TestDb, node_id: &str) -> PathBuf {
    let config = dir.join("broker.toml");
    let text = config_text(
        &pki().certs,
        &dir.join("data"),
        1,
        &cluster_sections(db, node_id),
    )
    .replace(r#"mode = "memory""#, r#"mode = "durable""#)
    .replace("console = false", "console = true\nlevel = \"warn\"");
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    assert!(broker.stop().success());
    config
}

/// A second process registered under the same node id takes the node over:
/// the first one's next heartbeat is refused, and from then on it stores
/// nothing and serves no owner, so two processes never serve one owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_id_another_process_registers_stops_serving() {
    let db = TestDb::create().await;
    let sections =
        |node_id: &str| cluster_sections(&db, node_id).replace("lease_secs = 5", "lease_secs = 3");
    let old = TestBroker::start_with(1, &sections("node-a"));
    let mut r1 = connect_as(&old, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let mut s = connect_as(&old, "sender_1").await;
    assert_eq!(
        ask(
            &mut s,
            &format!("publish ex receiver_1 {}", body("m1", "receiver_1"))
        )
        .await,
        "ACK m1"
    );

    let new = TestBroker::start_with(1, &sections("node-a"));
    let fenced = "Error: cluster: node node-a was registered again by another process and \
                  serves no owner here any more; connect to another node";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let reply = ask(&mut r1, "declare_queue receiver_1_queue").await;
        if reply == fenced {
            break;
        }
        assert_eq!(reply, "OK declare_queue receiver_1_queue");
        assert!(tokio::time::Instant::now() < deadline, "never fenced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        ask(
            &mut s,
            &format!("publish ex receiver_1 {}", body("m2", "receiver_1"))
        )
        .await,
        "NACK m2 storage"
    );
    assert_eq!(ask(&mut r1, "locate receiver_1").await, fenced);

    // The new process serves receiver_1 (same node, same epoch: its data
    // directory is its own, so the old queue is not there).
    let mut r1_new = connect_as(&new, "receiver_1").await;
    setup_receiver(&mut r1_new, "receiver_1").await;
    let mut s_new = connect_as(&new, "sender_1").await;
    assert_eq!(
        ask(
            &mut s_new,
            &format!("publish ex receiver_1 {}", body("m3", "receiver_1"))
        )
        .await,
        "ACK m3"
    );
    assert_eq!(
        ask(&mut s_new, "locate receiver_1").await,
        format!("OK locate receiver_1 node-a {} 1", new.addr)
    );
}

/// Seconds since `node_id`'s last heartbeat, on the server's clock.
async fn heartbeat_age(db: &TestDb, node_id: &str) -> f64 {
    db.client()
        .await
        .query_one(
            "SELECT extract(epoch FROM now() - heartbeat)::float8 \
             FROM ciphermq_cluster.cluster_nodes WHERE node_id = $1",
            &[&node_id],
        )
        .await
        .expect("heartbeat age")
        .get(0)
}

/// A node paused (SIGSTOP) for longer than its lease, then resumed: with no
/// failover yet nothing moves, and it serves its owners again with
/// nothing acknowledged lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_lease_resumes_its_owners_and_keeps_every_acked_message() {
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let config = durable_node(dir.path(), &db, "node-a").await;
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("lease_secs = 5", "lease_secs = 2");
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);
    let before = placements(&db).await;

    let ids: Vec<String> = (0..2000).map(|i| format!("before-{i}")).collect();
    let answers = common::process::publish_pipelined(&broker.addr, "sender_1", &ids, 200).await;
    let mut acked: std::collections::BTreeSet<String> = answers
        .iter()
        .filter(|(id, line)| *line == format!("ACK {id}"))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(acked.len(), ids.len());

    // Paused until its heartbeat is older than the lease (a fact read from
    // PostgreSQL), then resumed.
    broker.signal("STOP");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while heartbeat_age(&db, "node-a").await <= 3.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the heartbeat never aged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.signal("CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while heartbeat_age(&db, "node-a").await > 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never heartbeat again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(placements(&db).await, before, "no placement changed");

    let ids: Vec<String> = (0..2000).map(|i| format!("after-{i}")).collect();
    let answers = common::process::publish_pipelined(&broker.addr, "sender_1", &ids, 200).await;
    let after: Vec<&String> = answers
        .iter()
        .filter(|(id, line)| *line == format!("ACK {id}"))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(after.len(), ids.len());
    acked.extend(after.into_iter().cloned());
    let delivered = drain_counting(&broker).await;
    assert_none_lost("cluster node: paused past its lease", &acked, &delivered);
}

/// One gauge or counter of `broker`'s /metrics.
async fn metric(broker: &TestBroker, name: &str) -> Option<f64> {
    let addr = broker.admin_addr().expect("admin endpoint");
    let body = common::admin_http::request(addr, Some("admin"), "GET", "/metrics")
        .await
        .ok()?
        .body;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// A node cut off from PostgreSQL (packets dropped, nothing closed) keeps
/// serving the owners it holds at full rate; what needs the coordinator is
/// answered, within a bound, that it must be retried; once the network is
/// back, the node reconnects by itself and nothing has moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_postgres_keeps_serving_and_recovers_by_itself() {
    let db = TestDb::create().await;
    let hole = Blackhole::start().await;
    let sections = cluster_sections(&db, "node-a")
        .replace("port = 5432", &format!("port = {}", hole.addr.port()))
        + "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";
    let a = TestBroker::start_with(1, &sections);
    let mut r1 = connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    let before = placements(&db).await;

    hole.cut.store(true, Ordering::Relaxed);
    // Publishing never waits on PostgreSQL.
    let ids: Vec<String> = (0..2000).map(|i| format!("cut-{i}")).collect();
    let answers = common::process::publish_pipelined(&a.addr, "sender_1", &ids, 200).await;
    let acked = answers
        .iter()
        .filter(|(id, line)| *line == format!("ACK {id}"))
        .count();
    assert_eq!(
        acked,
        ids.len(),
        "{:?}",
        answers.iter().find(|(id, l)| *l != format!("ACK {id}"))
    );
    // Placing a new owner needs the coordinator: a bounded wait, then why.
    let mut s = connect_as(&a, "sender_2").await;
    assert_eq!(
        ask(&mut s, "locate receiver_2").await,
        "Error: cluster: no node could be given to owner receiver_2: the cluster coordinator did \
         not answer; retry"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric(&a, "ciphermq_cluster_coordinator_connected").await != Some(0.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the link never noticed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    hole.cut.store(false, Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric(&a, "ciphermq_cluster_coordinator_connected").await != Some(1.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the link never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        ask(&mut s, "locate receiver_2").await,
        format!("OK locate receiver_2 node-a {} 1", a.addr)
    );
    let after = placements(&db).await;
    assert_eq!(
        after.iter().find(|p| p.0 == "receiver_1"),
        before.iter().find(|p| p.0 == "receiver_1"),
        "receiver_1 did not move"
    );
    check_all_delivered(&mut r1, &ids).await;
}

/// Fetches `receiver_1_queue` until every id of `ids` came, once each.
async fn check_all_delivered(r1: &mut ciphermq_clients::connection::Connection, ids: &[String]) {
    let mut got = std::collections::BTreeSet::new();
    while got.len() < ids.len() {
        let batch = common::fetch(r1, "receiver_1_queue", 1000).await;
        assert!(
            !batch.is_empty(),
            "only {} of {} delivered",
            got.len(),
            ids.len()
        );
        for d in batch {
            assert!(got.insert(d.id.clone()), "{} delivered twice", d.id);
            assert_eq!(
                ask(r1, &format!("ack {}", d.id)).await,
                format!("ACK_CONFIRMED {}", d.id)
            );
        }
    }
}
