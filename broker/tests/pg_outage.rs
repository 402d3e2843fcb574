//! A PostgreSQL outage never blocks publishing, and the metadata mirror
//! catches up afterwards without losing or duplicating a row: the bridge's
//! connections killed mid-load, then the server stopped and restarted.
//!
//! Stops the machine's PostgreSQL for a moment, so this binary holds one test.

mod common;

use std::time::Duration;

use ciphermq_broker::Config;
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::pg::{pg_ctl, TestDb};
use common::{body, config_text, expect, next, pki, setup_receiver};

const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const PHASE: usize = 15_000;

/// Starts PostgreSQL again however the test ends.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        pg_ctl("start");
    }
}

async fn publish(sender: &mut Connection, range: std::ops::Range<usize>) {
    for chunk_start in range.clone().step_by(500) {
        let end = (chunk_start + 500).min(range.end);
        for i in chunk_start..end {
            let id = format!("o-{i}");
            sender.queue_line(&format!(
                "publish ex receiver_1 {}",
                body(&id, "receiver_1")
            ));
        }
        sender.flush().await.expect("flush");
        for i in chunk_start..end {
            let reply = tokio::time::timeout(Duration::from_secs(20), next(sender))
                .await
                .unwrap_or_else(|_| panic!("publishing blocked at o-{i}"));
            assert_eq!(reply, format!("ACK o-{i}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_goes_on_through_an_outage_and_the_rows_catch_up() {
    let db = TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    let text = config_text(&pki().certs, data.path(), 2, &db.config(AES_KEY))
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    let config = Config::from_toml_str(&text, data.path()).expect("config");
    let broker = ciphermq_broker::start(&config).expect("broker starts");
    let opts = |cn| TlsClientOptions::for_cn(&pki().certs, cn);
    let addr = broker.local_addr().to_string();
    let mut receiver = Connection::connect(&addr, &opts("receiver_1"))
        .await
        .expect("connect");
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = Connection::connect(&addr, &opts("sender_1"))
        .await
        .expect("connect");

    // The receiver acks everything as it comes, through the whole outage.
    let total = 4 * PHASE;
    let consumer = tokio::spawn(async move {
        expect(
            &mut receiver,
            "consume receiver_1_queue 1000",
            "OK consume receiver_1_queue",
        )
        .await;
        let mut confirmed = 0;
        let mut unflushed = 0;
        while confirmed < total {
            let line = tokio::time::timeout(Duration::from_millis(50), next(&mut receiver)).await;
            let Ok(line) = line else {
                receiver.flush().await.expect("flush");
                unflushed = 0;
                continue;
            };
            if let Some(rest) = line.strip_prefix("Message: ") {
                let id = rest.split(' ').next().expect("id").to_owned();
                receiver.queue_line(&format!("ack {id} receiver_1_queue"));
                unflushed += 1;
                if unflushed >= 200 {
                    receiver.flush().await.expect("flush");
                    unflushed = 0;
                }
            } else {
                assert!(line.starts_with("ACK_CONFIRMED "), "{line}");
                confirmed += 1;
            }
        }
    });

    publish(&mut sender, 0..PHASE).await;
    let killed = db.terminate_backends().await;
    assert!(killed >= 1, "the bridge had a connection to kill");
    publish(&mut sender, PHASE..2 * PHASE).await;

    let restart = RestartOnDrop;
    pg_ctl("stop");
    publish(&mut sender, 2 * PHASE..3 * PHASE).await;
    // Every message of this phase is durable and none can be mirrored: the
    // lag in rows says so (the bridge measures it each tick).
    let during = wait_for_status(&broker, |s| s.lag_rows >= PHASE as u64).await;
    assert!(
        during.lag_rows >= PHASE as u64,
        "lag in rows during the outage: {during:?}"
    );
    drop(restart); // PostgreSQL starts again
    publish(&mut sender, 3 * PHASE..4 * PHASE).await;
    tokio::time::timeout(Duration::from_secs(120), consumer)
        .await
        .expect("every message consumed and acked")
        .expect("consumer");

    let acked = "SELECT count(*) FROM message_metadata WHERE acknowledged_time IS NOT NULL";
    let rows = db
        .wait_for(acked, total as i64, Duration::from_secs(180))
        .await;
    let status = broker.bridge_status().expect("bridge runs");
    assert_eq!(
        rows, total as i64,
        "acked rows after the outage; {status:?}"
    );
    let row = db
        .client()
        .await
        .query_one(
            "SELECT count(*), count(DISTINCT message_id) FROM message_metadata",
            &[],
        )
        .await
        .expect("query");
    let (all, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        (all, distinct),
        (total as i64, total as i64),
        "no row missing or duplicated"
    );
    assert!(
        !during.connected,
        "the bridge noticed the outage: {during:?}"
    );
    assert!(status.reconnects >= 1 && status.connected, "{status:?}");
    let after = wait_for_status(&broker, |s| s.lag_rows == 0).await;
    assert_eq!(after.lag_rows, 0, "caught up: {after:?}");
    broker.shutdown();
}

/// The bridge's status once `done` holds, or the last one after 30 s.
async fn wait_for_status(
    broker: &ciphermq_broker::BrokerHandle,
    done: impl Fn(&ciphermq_pgbridge::BridgeStatus) -> bool,
) -> ciphermq_pgbridge::BridgeStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = broker.bridge_status().expect("bridge runs");
        if done(&status) || std::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
