//! No client-chosen name can make a file operation fail (docs/PROTOCOL.md,
//! "Queue names and dead letters"), against the broker binary on a durable
//! data directory:
//!
//! - `declare_queue` of a name too long for its dead-letter queue
//!   (`{queue}.dlq`) to fit the name rule is refused, naming the limit;
//! - the longest queue name accepted dead-letters into a 255-byte
//!   `{queue}.dlq`, which its owner can fetch, and the broker stays ready;
//! - a dead-letter queue keeps what is given up in it, at its tail, instead
//!   of growing a `….dlq.dlq` chain.

mod common;

use std::time::{Duration, Instant};

use ciphermq_clients::connection::Connection;
use common::process::BrokerProcess;
use common::{check, config_text, fetch, ids, pki, publish_expect};

/// A durable broker that gives a message up after its second delivery.
fn start(dir: &std::path::Path) -> BrokerProcess {
    let admin = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n\n[performance]\nmax_deliveries = 2\n";
    let text = config_text(&pki().certs, &dir.join("data"), 1, admin)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    let config = dir.join("broker.toml");
    std::fs::write(&config, text).unwrap();
    BrokerProcess::start(&config)
}

/// Fetches `id` from `queue` and nacks it, `times` times.
async fn give_up(r: &mut Connection, queue: &str, id: &str, times: u32) {
    for round in 1..=times {
        let got = fetch(r, queue, 1).await;
        assert_eq!(ids(&got), [id], "delivery {round} from {queue}");
        check(r, &format!("nack {id}"), &format!("NACK_CONFIRMED {id}")).await;
    }
}

/// Asserts `/ready` answers 200, waiting while storage settles.
async fn assert_ready(broker: &BrokerProcess) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = broker.admin_get("admin", "/ready").await;
        if status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "/ready: {status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_queue_names_dead_letter_without_failing_storage() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path());
    let mut r = broker.connect("receiver_1").await;
    let mut s = broker.connect("sender_1").await;

    let too_long = format!("receiver_1_{}", "a".repeat(255 - "receiver_1_".len()));
    assert_eq!(too_long.len(), 255);
    check(
        &mut r,
        &format!("declare_queue {too_long}"),
        "Error: invalid queue name: at most 251 bytes, so that its dead-letter queue <queue>.dlq fits the 255-byte name rule",
    )
    .await;

    let longest = &too_long[..251];
    check(
        &mut r,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    check(
        &mut r,
        &format!("declare_queue {longest}"),
        &format!("OK declare_queue {longest}"),
    )
    .await;
    check(
        &mut r,
        &format!("bind {longest} ex receiver_1"),
        &format!("OK bind {longest} ex receiver_1"),
    )
    .await;
    publish_expect(&mut s, "ex", "receiver_1", "long-1", "ACK long-1").await;
    give_up(&mut r, longest, "long-1", 2).await;
    let dlq = format!("{longest}.dlq");
    assert_eq!(dlq.len(), 255);
    assert_eq!(ids(&fetch(&mut r, &dlq, 10).await), ["long-1"]);
    check(&mut r, &format!("ack long-1 {dlq}"), "ACK_CONFIRMED long-1").await;
    assert_ready(&broker).await;

    // Given up in the dead-letter queue, it stays there, at the tail.
    publish_expect(&mut s, "ex", "receiver_1", "long-2", "ACK long-2").await;
    give_up(&mut r, longest, "long-2", 2).await;
    give_up(&mut r, &dlq, "long-2", 2).await;
    let again = fetch(&mut r, &dlq, 10).await;
    assert_eq!(ids(&again), ["long-2"]);
    assert_eq!(again[0].count, 1, "its deliveries count afresh there");
    assert_ready(&broker).await;
    assert!(
        !broker.logged(&["File name too long"]),
        "a derived name failed a file operation:\n{}",
        broker.log_text()
    );
}
