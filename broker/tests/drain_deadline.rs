//! Stopping the broker binary with SIGTERM/SIGINT, bounded by
//! `server.shutdown_timeout_secs`:
//!
//! - an idle broker, even with clients connected, drains and exits 0 at once;
//! - a consumer that never reads what it is owed keeps the drain from
//!   finishing (its deliveries cannot be written): with a 1 s deadline the
//!   broker logs what is open and exits 3 within a few seconds, and a restart
//!   on the same data directory still has every acknowledged message;
//! - a second signal during the drain exits 4 at once.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ciphermq_clients::connection::Connection;
use common::process::BrokerProcess;
use common::{check, config_text, line, pki, send, setup_receiver};

/// Messages queued for the consumer that does not read.
const MESSAGES: usize = 24;

/// Base64 characters in each message's ciphertext: the deliveries owed add
/// up to far more than the socket buffers on both ends hold.
const CIPHERTEXT: usize = 900_000;

/// A durable broker's config with console logs, draining for at most
/// `timeout_secs`.
fn setup(timeout_secs: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace("console = false", "console = true\nlevel = \"info\"")
        .replace(
            common::TEST_SHUTDOWN_TIMEOUT,
            &format!("shutdown_timeout_secs = {timeout_secs}"),
        );
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

fn big_body(id: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"{}"}}"#,
        "A".repeat(CIPHERTEXT)
    )
}

/// Queues [`MESSAGES`] large messages (each acknowledged) for receiver_1,
/// whose connection then consumes them and never reads: the returned
/// connections must stay open.
async fn stuck_consumer(broker: &BrokerProcess) -> (Connection, Connection) {
    let mut receiver = broker.connect("receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = broker.connect("sender_1").await;
    for i in 0..MESSAGES {
        let id = format!("m{i}");
        check(
            &mut sender,
            &format!("publish ex receiver_1 {}", big_body(&id)),
            &format!("ACK {id}"),
        )
        .await;
    }
    // Its reply comes before any delivery: once read, the consumer is
    // registered and every message is owed to it (reading one line takes
    // far less than the socket buffers hold, never the deliveries).
    check(
        &mut receiver,
        &format!("consume receiver_1_queue {MESSAGES}"),
        "OK consume receiver_1_queue",
    )
    .await;
    (receiver, sender)
}

/// Ids of every message in receiver_1's queue, fetched and acked.
async fn drain_queue(broker: &BrokerProcess) -> Vec<String> {
    let mut receiver = broker.connect("receiver_1").await;
    let mut ids = Vec::new();
    loop {
        send(&mut receiver, "fetch receiver_1_queue 4").await;
        let mut batch = Vec::new();
        loop {
            let l = line(&mut receiver).await;
            if l.starts_with("Message: ") {
                batch.push(common::delivery_of(&l).id);
            } else {
                assert_eq!(l, format!("OK fetch {}", batch.len()));
                break;
            }
        }
        if batch.is_empty() {
            ids.sort_by_key(|id: &String| id[1..].parse::<usize>().unwrap());
            return ids;
        }
        for id in &batch {
            check(
                &mut receiver,
                &format!("ack {id} receiver_1_queue"),
                &format!("ACK_CONFIRMED {id}"),
            )
            .await;
        }
        ids.extend(batch);
    }
}

fn wait(broker: &mut BrokerProcess, limit: Duration) -> std::process::ExitStatus {
    broker.wait_timeout(limit).unwrap_or_else(|| {
        panic!(
            "the broker did not exit within {limit:?}:\n{}",
            broker.log_text()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_broker_with_clients_connected_exits_0_at_once() {
    let (_dir, config) = setup(30);
    let mut broker = BrokerProcess::start(&config);
    let _receiver = broker.connect("receiver_1").await;
    let _sender = broker.connect("sender_1").await;
    let asked = Instant::now();
    broker.signal("TERM");
    let status = wait(&mut broker, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", broker.log_text());
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "took {:?}",
        asked.elapsed()
    );
    assert!(broker.logged(&["stopped"]), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_is_cut_off_at_the_deadline_with_status_3() {
    let (_dir, config) = setup(1);
    let mut broker = BrokerProcess::start(&config);
    let stuck = stuck_consumer(&broker).await;
    let asked = Instant::now();
    broker.signal("TERM");
    let status = wait(&mut broker, Duration::from_secs(10));
    let took = asked.elapsed();
    let log = broker.log_text();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        took >= Duration::from_secs(1),
        "exited before the deadline: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}:\n{log}");
    assert!(
        broker.logged(&["drain deadline passed", "connections=1"]),
        "the shard names what it closed:\n{log}"
    );
    drop(stuck);

    // Every acknowledged message is still there.
    let broker = BrokerProcess::start(&config);
    let ids = drain_queue(&broker).await;
    let want: Vec<String> = (0..MESSAGES).map(|i| format!("m{i}")).collect();
    assert_eq!(ids, want);
    assert_eq!(broker.stop().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_the_drain_exits_4_at_once() {
    let (_dir, config) = setup(120);
    let mut broker = BrokerProcess::start(&config);
    let _stuck = stuck_consumer(&broker).await;
    broker.signal("TERM");
    assert!(
        broker.wait_timeout(Duration::from_millis(1500)).is_none(),
        "the drain waits for the consumer:\n{}",
        broker.log_text()
    );
    let asked = Instant::now();
    broker.signal("INT");
    let status = wait(&mut broker, Duration::from_secs(5));
    assert_eq!(status.code(), Some(4), "{}", broker.log_text());
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "took {:?}",
        asked.elapsed()
    );
    assert!(
        broker.logged(&["second signal during the drain", "1 connection(s)"]),
        "{}",
        broker.log_text()
    );
}
