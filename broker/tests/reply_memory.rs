//! A connection's memory is bounded in bytes (docs/PROTOCOL.md, "Memory per
//! connection"), against the broker binary: clients that never read their
//! replies, each pipelining the amplifying line found from outside (a
//! `publish_batch` of 400,000 invalid elements, which made one reply each),
//! grow the broker by at most 8 MB each: a batch holds at most
//! `performance.max_batch_elements`, and pending replies at most
//! `performance.max_pending_reply_bytes` (the reply queue's own tests,
//! `broker/src/conn/replies.rs`, check what it counts).

mod common;

use std::time::{Duration, Instant};

use common::hostile::{never_reading, rss};
use common::process::BrokerProcess;
use common::{config_text, pki};
use tokio::io::AsyncWriteExt;

/// Connections that never read.
const CONNECTIONS: usize = 8;

/// What each may hold in pending replies (the default).
const CAP: u64 = 4 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplifying_lines_from_clients_that_never_read_cost_the_broker_little() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let extra = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";
    std::fs::write(
        &config,
        config_text(&pki().certs, &dir.path().join("data"), 2, extra),
    )
    .unwrap();
    let broker = BrokerProcess::start(&config);

    // Every connection is open before the baseline is taken.
    let senders = ["sender_1", "sender_2", "sender_3", "sender_4"];
    let mut streams = Vec::new();
    for i in 0..CONNECTIONS {
        streams.push(never_reading(&broker.addr, senders[i % senders.len()]).await);
    }
    let received_before = broker.metric_sum("ciphermq_received_bytes_total").await;
    let before = rss(broker.pid());

    // The line found from outside: 400,000 invalid elements in 800 KB, one
    // `NACK - invalid` reply each (about 50 MB of replies per connection
    // before the cap). Now one `Error:` line answers it, so the broker
    // reads every byte these clients send and replies with a few dozen.
    let line = format!("publish_batch amp_x k [{}]\n", vec!["1"; 400_000].join(","));
    const LINES: usize = 12;
    let mut writers = Vec::new();
    for mut stream in streams {
        let line = line.clone();
        writers.push(tokio::spawn(async move {
            for _ in 0..LINES {
                stream.write_all(line.as_bytes()).await?;
            }
            stream.flush().await?;
            Ok::<_, std::io::Error>(stream)
        }));
    }
    let mut kept = Vec::new();
    for w in writers {
        let done = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .expect(
                "the broker reads every amplifying line (a cap of replies would block the writer)",
            );
        kept.push(done.unwrap().expect("written"));
    }
    // The fact: the broker has read it all (TLS adds a little per record).
    let sent = (CONNECTIONS * LINES * line.len()) as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let received = broker.metric_sum("ciphermq_received_bytes_total").await - received_before;
        if received >= sent {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the broker read {received} of {sent} bytes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grown = rss(broker.pid()).saturating_sub(before);
    assert!(
        grown <= CONNECTIONS as u64 * (8 << 20),
        "the broker grew by {} MB for {CONNECTIONS} connections that never read",
        grown >> 20
    );
    assert!(
        broker.metric_sum("ciphermq_pending_reply_bytes").await <= CONNECTIONS as u64 * CAP,
        "pending replies past the cap"
    );
    drop(kept);
}
