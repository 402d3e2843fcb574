//! Nodes of a cluster kept in a test database: their config sections, a
//! durable node in this process, and the files of one to run as a process
//! of its own (to kill it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::pg::TestDb;
use super::TestBroker;

/// The `[encryption]` key every node of a test cluster shares.
pub const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// The `[database]` and `[cluster]` sections of node `node_id` (lease 5 s).
pub fn sections(db: &TestDb, node_id: &str) -> String {
    format!(
        "{}\n[cluster]\nenabled = true\nnode_id = \"{node_id}\"\nlease_secs = 5\n",
        db.config_with_tls(AES_KEY, "disable", None)
    )
}

/// A durable node of the cluster kept in `db`, over the data directory
/// `data`.
pub fn durable_node(db: &TestDb, node_id: &str, shards: usize, data: &Path) -> TestBroker {
    TestBroker::start_durable_with(shards, data, "127.0.0.1:0", &sections(db, node_id))
}

/// A durable node of 2 shards to run as its own process: its config file
/// under `dir`, and its data directory.
pub fn process_node(db: &TestDb, node_id: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    let config = dir.join("broker.toml");
    let text = super::config_text(&super::pki().certs, &data, 2, &sections(db, node_id))
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    std::fs::write(&config, text).unwrap();
    (config, data)
}

/// A durable node of 2 shards to run as its own process, keeping its
/// owners' queues in `shared_dir` (`cluster.storage = "shared"`) with a
/// lease of `lease_secs`: its config file under `dir`, and its data
/// directory.
pub fn shared_process_node(
    db: &TestDb,
    node_id: &str,
    dir: &Path,
    shared_dir: &Path,
    lease_secs: u64,
) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    let config = dir.join("broker.toml");
    let sections = format!(
        "{}storage = \"shared\"\nshared_dir = \"{}\"\n",
        sections(db, node_id).replace("lease_secs = 5", &format!("lease_secs = {lease_secs}")),
        shared_dir.display()
    );
    let text = super::config_text(&super::pki().certs, &data, 2, &sections)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    std::fs::write(&config, text).unwrap();
    (config, data)
}

/// Every placement as (owner, node, epoch, version), and the takeovers
/// recorded.
pub async fn cluster_state(db: &TestDb) -> (Vec<(String, String, i64, i64)>, i64) {
    let client = db.client().await;
    let placements = client
        .query(
            "SELECT owner, node_id, epoch, version FROM ciphermq_cluster.cluster_placements ORDER BY owner",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let takeovers: i64 = client
        .query_one(
            "SELECT count(*) FROM ciphermq_cluster.cluster_takeovers",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    (placements, takeovers)
}

/// Waits until every node has heartbeated after this moment, twice.
pub async fn every_node_beats_again(db: &TestDb) {
    let client = db.client().await;
    for _ in 0..2 {
        let since: std::time::SystemTime =
            client.query_one("SELECT now()", &[]).await.unwrap().get(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let stale: i64 = client
                .query_one(
                    "SELECT count(*) FROM ciphermq_cluster.cluster_nodes WHERE heartbeat <= $1",
                    &[&since],
                )
                .await
                .unwrap()
                .get(0);
            if stale == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "a node never heartbeated again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The owner catalogue's record of `owner`, as (epoch, JSON), once it
/// satisfies `done` (waited for up to a minute).
pub async fn record_of(
    db: &TestDb,
    owner: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> (i64, serde_json::Value) {
    let client = db.client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        let row = client
            .query_opt(
                "SELECT epoch, data FROM ciphermq_cluster.cluster_owner_topology WHERE owner = $1",
                &[&owner],
            )
            .await
            .ok()
            .flatten();
        if let Some(row) = row {
            let epoch: i64 = row.get(0);
            let data: Vec<u8> = row.get(1);
            let json: serde_json::Value = serde_json::from_slice(&data).expect("a JSON record");
            if done(&json) {
                return (epoch, json);
            }
            last = Some(json);
        }
        assert!(
            Instant::now() < deadline,
            "the catalogue's record of {owner} never became as expected: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes `live-<n>` for receiver_1 one at a time until `stop`, from
/// `start` on; on `NACK <id> moved … <host:port> …` it goes to that node and
/// sends the same id again. Returns the acked ids in order, and the
/// longest time between two acks.
pub async fn publish_following(
    start: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<String>, std::time::Duration) {
    let opts =
        ciphermq_clients::connection::TlsClientOptions::for_cn(&super::pki().certs, "sender_1");
    let mut conn = ciphermq_clients::connection::Connection::connect(&start, &opts)
        .await
        .expect("connect");
    let mut acked = Vec::new();
    let mut longest = std::time::Duration::ZERO;
    let mut last = std::time::Instant::now();
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let id = format!("live-{n:06}");
        let reply = super::ask(
            &mut conn,
            &format!("publish ex receiver_1 {}", super::body(&id, "receiver_1")),
        )
        .await;
        if reply == format!("ACK {id}") {
            acked.push(id);
            longest = longest.max(last.elapsed());
            last = std::time::Instant::now();
            n += 1;
        } else if let Some(tail) = reply.strip_prefix(&format!("NACK {id} moved ")) {
            let addr = tail.split(' ').nth(2).expect("address in the redirect");
            conn = ciphermq_clients::connection::Connection::connect(addr, &opts)
                .await
                .expect("connect to the new node");
        } else {
            panic!("publish {id}: {reply}");
        }
    }
    (acked, longest)
}

/// Waits until the owner catalogue records a binding of `owner`'s queue:
/// a node taking the owner over declares its queues and bindings from it
/// (one made in the last tick before its node dies is missing there, and
/// its receiver makes it again: docs/CLUSTER.md).
pub async fn binding_catalogued(db: &TestDb, owner: &str) {
    record_of(db, owner, |r| {
        r["queues"][0]["bindings"]
            .as_array()
            .is_some_and(|b| !b.is_empty())
    })
    .await;
}
