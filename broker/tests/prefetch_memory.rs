//! Deliveries in flight are bounded in bytes (docs/PROTOCOL.md, "Memory per
//! connection"), against the broker binary: a `consume` with the largest
//! prefetch from a connection that never reads, over 512 KiB bodies.
//!
//! - Its prefetch is also counted in bytes (`performance.max_prefetch_bytes`):
//!   it takes bodies up to that, whatever its prefetch in messages.
//! - With that cap lifted, the memory budget still bounds it: bodies read
//!   back from a backlog on disk count against `storage.memory_budget_mb`
//!   while unacked, so the consumer cannot pull the backlog into memory. A
//!   queue that holds nothing in memory is still served, one batch at a
//!   time, and the backlog is served in full once the hostile consumer goes.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use ciphermq_clients::connection::Connection;
use common::hostile::{never_reading, rss};
use common::process::BrokerProcess;
use common::{check, config_text, fetch, flush_t, line, pki, send};
use tokio::io::AsyncWriteExt;

/// Base64 characters of each envelope's ciphertext: bodies of about 512 KiB.
const CIPHERTEXT_BYTES: usize = 512 << 10;

const Q1: &str = "receiver_1_queue";
const Q2: &str = "receiver_2_queue";

fn envelope(id: &str, receiver: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"{}"}}"#,
        "QUFB".repeat(CIPHERTEXT_BYTES / 4)
    )
}

/// The body size of every message here (ids are all 6 bytes long).
fn body_len() -> u64 {
    envelope("m-0000", "receiver_1").len() as u64
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

/// A 1-shard durable broker with per-queue metrics, `storage` appended to
/// `[storage]` and `performance` as its `[performance]` section.
fn write_config(dir: &Path, storage: &str, performance: &str) -> std::path::PathBuf {
    let config = dir.join("broker.toml");
    let extra = format!(
        "\n[performance]\n{performance}\n\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\nqueue_metrics = true\n"
    );
    let text = config_text(&pki().certs, &dir.join("data"), 1, &extra).replace(
        r#"mode = "memory""#,
        &format!("mode = \"durable\"\n{storage}"),
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// `ex` declared, and `{cn}_queue` bound to it with key `cn` for each of `cns`.
async fn topology(broker: &BrokerProcess, cns: &[&str]) {
    let mut a = broker.connect("admin").await;
    check(&mut a, "declare_exchange ex", "OK declare_exchange ex").await;
    for cn in cns {
        let mut r = broker.connect(cn).await;
        let q = format!("{cn}_queue");
        check(
            &mut r,
            &format!("declare_queue {q}"),
            &format!("OK declare_queue {q}"),
        )
        .await;
        check(
            &mut r,
            &format!("bind {q} ex {cn}"),
            &format!("OK bind {q} ex {cn}"),
        )
        .await;
    }
}

/// Publishes `ids` for `receiver` (key `receiver`), 8 in flight, asserting each `ACK`.
async fn publish_all(s: &mut Connection, receiver: &str, ids: &[String]) {
    for window in ids.chunks(8) {
        for id in window {
            send(
                s,
                &format!("publish ex {receiver} {}", envelope(id, receiver)),
            )
            .await;
        }
        flush_t(s).await;
        for id in window {
            assert_eq!(line(s).await, format!("ACK {id}"));
        }
    }
}

/// `ciphermq_queue_<what>` of `queue`.
async fn queue_metric(broker: &BrokerProcess, what: &str, queue: &str) -> u64 {
    broker
        .metric_sum_of(
            &format!("ciphermq_queue_{what}"),
            &format!("queue=\"{queue}\""),
        )
        .await
}

/// Polls (bounded) until `done` holds of `queue`'s (unacked, bodies in
/// memory); returns them.
async fn wait_for(
    broker: &BrokerProcess,
    queue: &str,
    what: &str,
    done: impl Fn(u64, u64) -> bool,
) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let unacked = queue_metric(broker, "unacked", queue).await;
        let memory = queue_metric(broker, "memory_bytes", queue).await;
        if done(unacked, memory) {
            return (unacked, memory);
        }
        assert!(
            Instant::now() < deadline,
            "{queue}: waited for {what}; {unacked} unacked, {memory} bytes in memory"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection of receiver_1 that sends `consume {Q1} 10000` and never
/// reads a byte after its greeting.
async fn consume_never_reading(
    broker: &BrokerProcess,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut hostile = never_reading(&broker.addr, "receiver_1").await;
    hostile
        .write_all(format!("consume {Q1} 10000\n").as_bytes())
        .await
        .unwrap();
    hostile.flush().await.unwrap();
    hostile
}

/// Fetches `queue` until empty, acking as it goes; returns the ids in order.
async fn drain(r: &mut Connection, queue: &str) -> Vec<String> {
    let mut all = Vec::new();
    loop {
        let got = fetch(r, queue, 16).await;
        if got.is_empty() {
            return all;
        }
        for g in &got {
            send(r, &format!("ack {} {queue}", g.id)).await;
        }
        flush_t(r).await;
        for g in got {
            assert_eq!(line(r).await, format!("ACK_CONFIRMED {}", g.id));
            all.push(g.id);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_holds_at_most_its_prefetch_in_bytes() {
    const CAP: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", &format!("max_prefetch_bytes = {CAP}"));
    let broker = BrokerProcess::start(&config);
    topology(&broker, &["receiver_1"]).await;
    // 24 MB, all in memory (under the default budget of 256 MB).
    let all = ids("m", 48);
    let mut s = broker.connect("sender_1").await;
    publish_all(&mut s, "receiver_1", &all).await;
    queue_metric(&broker, "unacked", Q1).await;
    let before = rss(broker.pid());

    let hostile = consume_never_reading(&broker).await;
    // The consume is served in one go: whatever it takes shows at once.
    let (unacked, _) = wait_for(&broker, Q1, "the consume", |u, _| u > 0).await;
    let expected = CAP.div_ceil(body_len());
    assert_eq!(
        unacked,
        expected,
        "a prefetch of 10,000 holds {CAP} bytes of {}-byte bodies at most (the last one passes it)",
        body_len()
    );
    // Its bodies were in memory already; what it costs besides is output
    // waiting for its socket, which the connection bounds (about 1 MiB,
    // and one line more).
    let grown = rss(broker.pid()).saturating_sub(before);
    assert!(
        grown <= 6 << 20,
        "the broker grew by {} MB for deliveries a consumer never reads",
        grown >> 20
    );

    // A consumer that reads and acks is served the rest, in order.
    let mut r = broker.connect("receiver_1").await;
    let rest = drain(&mut r, Q1).await;
    assert_eq!(rest, all[expected as usize..]);
    assert_eq!(queue_metric(&broker, "unacked", Q1).await, expected);
    drop(hostile);
    assert!(broker.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_cannot_pull_a_disk_backlog_past_the_memory_budget() {
    const BUDGET: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    // The byte prefetch lifted: the budget alone holds.
    let config = write_config(
        dir.path(),
        &format!("memory_budget_mb = {}", BUDGET >> 20),
        "max_prefetch_bytes = 1073741824",
    );
    let broker = BrokerProcess::start(&config);
    topology(&broker, &["receiver_1", "receiver_2"]).await;
    let backlog = ids("m", 160);
    let other = ids("o", 10);
    let mut s = broker.connect("sender_1").await;
    publish_all(&mut s, "receiver_2", &other).await;
    publish_all(&mut s, "receiver_1", &backlog).await;
    // A restart leaves every body on disk (80 MB, five times the budget).
    drop(s);
    assert!(broker.stop().success());
    let broker = BrokerProcess::start(&config);
    queue_metric(&broker, "unacked", Q1).await;
    let before = rss(broker.pid());

    let hostile = consume_never_reading(&broker).await;
    // The fact: its deliveries fill the budget (reads stop there).
    wait_for(&broker, Q1, "the budget to fill", |_, m| m >= BUDGET).await;
    // One read of about 1 MiB may have been in flight as it filled.
    let most = BUDGET + (1 << 20) + body_len();
    for _ in 0..5 {
        let unacked = queue_metric(&broker, "unacked", Q1).await;
        let memory = queue_metric(&broker, "memory_bytes", Q1).await;
        assert!(
            memory <= most && unacked * body_len() <= most,
            "{unacked} deliveries in flight, {memory} bytes in memory: past the budget of {BUDGET}"
        );
    }
    // Besides the bodies: output waiting for its socket (about 1 MiB and a
    // line), and the heap's holes where 1 MiB read buffers were freed
    // between bodies still held (18-21 MB in all was seen; 64 MB before
    // deliveries in flight counted against the budget).
    let grown = rss(broker.pid()).saturating_sub(before);
    assert!(
        grown <= BUDGET + (12 << 20),
        "the broker grew by {} MB for a consumer that never reads (budget {} MB)",
        grown >> 20,
        BUDGET >> 20
    );

    // Another queue, nothing of it in memory, is served all the same.
    let mut r2 = broker.connect("receiver_2").await;
    assert_eq!(drain(&mut r2, Q2).await, other);

    // Once the hostile consumer goes, the whole backlog is served, in order.
    drop(hostile);
    wait_for(&broker, Q1, "the deliveries given back", |u, _| u == 0).await;
    let mut r1 = broker.connect("receiver_1").await;
    assert_eq!(drain(&mut r1, Q1).await, backlog);
    assert!(broker.stop().success());
}
