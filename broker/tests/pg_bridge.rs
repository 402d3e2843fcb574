//! `database.backend = "postgres"` against the machine's real PostgreSQL:
//! every stored message becomes one metadata row with its times, public keys
//! live in sealed rows and survive restarts, and a wrong key fails at start,
//! and so does a server certificate `database.ca_cert_path` did not sign.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ciphermq_broker::{BrokerHandle, Config};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::pg::TestDb;
use common::{body, config_text, expect, next, pki, setup_receiver};

const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const OTHER_AES_KEY: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

/// The admin endpoint, read when a test stalls to say where.
const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

/// ACKs the publisher of the running test has read (for a stall's report).
static PUBLISHER_ACKED: AtomicUsize = AtomicUsize::new(0);

fn durable_config(data: &Path, shards: usize, db: &TestDb, aes_key: &str) -> Config {
    let extra = format!("{}{ADMIN}", db.config(aes_key));
    let text = config_text(&pki().certs, data, shards, &extra)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    Config::from_toml_str(&text, data).expect("config")
}

fn start(data: &Path, shards: usize, db: &TestDb) -> BrokerHandle {
    ciphermq_broker::start(&durable_config(data, shards, db, AES_KEY)).expect("broker starts")
}

async fn connect(broker: &BrokerHandle, cn: &str) -> Connection {
    let opts = TlsClientOptions::for_cn(&pki().certs, cn);
    Connection::connect(&broker.local_addr().to_string(), &opts)
        .await
        .expect("connect")
}

/// Publishes ids `{prefix}-{i}` for `range`, `window` in flight; every reply
/// must be an ACK.
pub async fn publish_range(
    sender: &mut Connection,
    prefix: &str,
    range: std::ops::Range<usize>,
    window: usize,
) {
    let mut next_id = range.start;
    while next_id < range.end {
        let end = (next_id + window).min(range.end);
        for i in next_id..end {
            let id = format!("{prefix}-{i}");
            sender.queue_line(&format!(
                "publish ex receiver_1 {}",
                body(&id, "receiver_1")
            ));
        }
        sender.flush().await.expect("flush");
        for i in next_id..end {
            assert_eq!(next(sender).await, format!("ACK {prefix}-{i}"));
            PUBLISHER_ACKED.fetch_add(1, Ordering::Relaxed);
        }
        next_id = end;
    }
}

/// Consumes and acks `count` messages from `receiver_1_queue`; a stall
/// reports what `broker`'s admin endpoint says.
async fn consume_and_ack(broker: &BrokerHandle, receiver: &mut Connection, count: usize) {
    expect(
        receiver,
        "consume receiver_1_queue 1000",
        "OK consume receiver_1_queue",
    )
    .await;
    let (mut delivered, mut confirmed) = (0, 0);
    while confirmed < count {
        let Ok(line) = tokio::time::timeout(Duration::from_secs(20), next(receiver)).await else {
            panic!(
                "stalled at {delivered} delivered, {confirmed} acked, {} ACKs read by the publisher; the broker says:\n{}",
                PUBLISHER_ACKED.load(Ordering::Relaxed),
                stall_report(broker).await
            );
        };
        if let Some(rest) = line.strip_prefix("Message: ") {
            let id = rest.split(' ').next().expect("id");
            receiver.queue_line(&format!("ack {id} receiver_1_queue"));
            delivered += 1;
            if delivered % 200 == 0 || delivered == count {
                receiver.flush().await.expect("flush");
            }
        } else {
            assert!(line.starts_with("ACK_CONFIRMED "), "{line}");
            confirmed += 1;
        }
    }
}

/// The broker's counters, queues and stall figures, for a stall's report.
async fn stall_report(broker: &BrokerHandle) -> String {
    let Some(admin) = broker.admin_addr() else {
        return "(no admin endpoint)".to_owned();
    };
    let mut report = String::new();
    for path in ["/api/status", "/metrics"] {
        match common::admin_http::request(admin, Some("admin"), "GET", path).await {
            Ok(reply) if path == "/metrics" => report.extend(
                reply
                    .body
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .filter(|l| {
                        [
                            "stalls",
                            "loop_lag",
                            "commit_round",
                            "publishes",
                            "deliveries",
                            "acks",
                            "queued",
                        ]
                        .iter()
                        .any(|k| l.contains(k))
                    })
                    .map(|l| format!("{l}\n")),
            ),
            Ok(reply) => report.push_str(&format!("{}\n", reply.body)),
            Err(e) => report.push_str(&format!("GET {path}: {e}\n")),
        }
    }
    report
}

/// Waits (bounded) until the mirror has `n` rows with an ack time.
async fn wait_until_all_acked(db: &TestDb, n: usize) {
    let complete = "SELECT count(*) FROM message_metadata WHERE acknowledged_time IS NOT NULL";
    let rows = db
        .wait_for(complete, n as i64, Duration::from_secs(120))
        .await;
    assert_eq!(rows, n as i64, "rows with an ack time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_and_ack_becomes_one_row_with_its_times() {
    const N: usize = 100_000;
    let db = TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    let broker = start(data.path(), 2, &db);
    let mut receiver = connect(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect(&broker, "sender_1").await;
    let publishing = tokio::spawn(async move {
        publish_range(&mut sender, "m", 0..N, 1000).await;
        sender
    });
    consume_and_ack(&broker, &mut receiver, N).await;
    let _sender = publishing.await.expect("publisher");

    wait_until_all_acked(&db, N).await;
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT message_id), \
                    count(*) FILTER (WHERE sent_time <= delivered_time \
                                       AND delivered_time <= acknowledged_time), \
                    count(*) FILTER (WHERE client_id = 'sender_1' AND exchange_name = 'ex' \
                                       AND routing_key = 'receiver_1' \
                                       AND queue = 'receiver_1_queue'), \
                    count(*) FILTER (WHERE sent_time > now() + interval '1 minute' \
                                        OR sent_time < now() - interval '1 hour') \
             FROM message_metadata",
            &[],
        )
        .await
        .expect("query");
    let counts: Vec<i64> = (0..5).map(|i| row.get(i)).collect();
    assert_eq!(
        counts,
        vec![N as i64, N as i64, N as i64, N as i64, 0],
        "[rows, distinct ids, ordered times, right columns, absurd times]"
    );
    let status = broker.bridge_status().expect("bridge runs");
    assert!(status.rows_written >= N as u64, "{status:?}");
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_on_disk_across_a_restart_is_mirrored_row_for_row() {
    // About 3 MB of bodies under a 1 MiB budget: most of them are in the
    // logs only, and after the restart all of them are.
    const N: usize = 20_000;
    let db = TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    let config = |data: &Path| {
        let text = config_text(&pki().certs, data, 1, &db.config(AES_KEY)).replace(
            r#"mode = "memory""#,
            "mode = \"durable\"\nmemory_budget_mb = 1",
        );
        Config::from_toml_str(&text, data).expect("config")
    };
    let broker = ciphermq_broker::start(&config(data.path())).expect("broker starts");
    let mut receiver = connect(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect(&broker, "sender_1").await;
    publish_range(&mut sender, "b", 0..N, 500).await;
    drop((receiver, sender));
    broker.shutdown();

    let broker = ciphermq_broker::start(&config(data.path())).expect("broker restarts");
    let mut receiver = connect(&broker, "receiver_1").await;
    consume_and_ack(&broker, &mut receiver, N).await;
    wait_until_all_acked(&db, N).await;
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT message_id), \
                    count(*) FILTER (WHERE sent_time <= delivered_time \
                                       AND delivered_time <= acknowledged_time) \
             FROM message_metadata",
            &[],
        )
        .await
        .expect("query");
    let counts: Vec<i64> = (0..3).map(|i| row.get(i)).collect();
    assert_eq!(
        counts,
        vec![N as i64, N as i64, N as i64],
        "[rows, distinct ids, ordered times]"
    );
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_keys_are_sealed_rows_that_survive_a_restart() {
    let db = TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let broker = start(data.path(), 1, &db);
    let mut receiver = connect(&broker, "receiver_1").await;
    expect(
        &mut receiver,
        &format!("register_public_key {key}"),
        "Public key registered",
    )
    .await;
    let row = db
        .client()
        .await
        .query_one(
            "SELECT public_key_ciphertext, nonce, tag FROM public_keys WHERE client_id = 'receiver_1'",
            &[],
        )
        .await
        .expect("the key's row is committed before the reply");
    let (ciphertext, nonce, tag): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    assert_ne!(ciphertext, key, "stored sealed, not in the clear");
    assert!(!nonce.is_empty() && !tag.is_empty());
    drop(receiver);
    broker.shutdown();

    // A new broker (fresh data directory: the keys come from Postgres).
    let data2 = tempfile::tempdir().expect("tempdir");
    let broker = start(data2.path(), 2, &db);
    let mut sender = connect(&broker, "sender_1").await;
    expect(
        &mut sender,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {key}"),
    )
    .await;
    drop(sender);
    broker.shutdown();

    let data3 = tempfile::tempdir().expect("tempdir");
    let err = match ciphermq_broker::start(&durable_config(data3.path(), 1, &db, OTHER_AES_KEY)) {
        Ok(_) => panic!("a wrong aes_key must fail at start"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("receiver_1") && err.contains("aes_key"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_fails_start_with_its_address() {
    let db = TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    let text = config_text(&pki().certs, data.path(), 1, &db.config(AES_KEY))
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace("port = 5432", "port = 1")
        .replace("connect_timeout_secs = 10", "connect_timeout_secs = 1");
    let config = Config::from_toml_str(&text, data.path()).expect("config");
    let err = match ciphermq_broker::start(&config) {
        Ok(_) => panic!("no database, no start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_the_configured_ca_did_not_sign_fails_start_naming_both() {
    let db = TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    // The broker's own test CA: a real CA, but not the PostgreSQL server's.
    let wrong_ca = pki().certs.join("ca.crt");
    let extra = db.config_with_tls(AES_KEY, "verify-full", Some(&wrong_ca));
    let text = config_text(&pki().certs, data.path(), 1, &extra)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    let config = Config::from_toml_str(&text, data.path()).expect("config");
    let err = match ciphermq_broker::start(&config) {
        Ok(_) => panic!("an untrusted server, no start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("PostgreSQL server 127.0.0.1:5432"), "{err}");
    assert!(
        err.contains(&format!(
            "is not signed by database.ca_cert_path = {}",
            wrong_ca.display()
        )),
        "{err}"
    );
}
