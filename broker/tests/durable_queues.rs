//! Nothing acknowledged is lost: queues, their unacked messages (in order, with
//! delivery counts), topology and dedup survive restarts, shard-count changes
//! and damaged log files.

mod common;

use std::path::Path;

use ciphermq_broker::{BrokerHandle, Config};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_proto::Reply;
use ciphermq_shard::log::{queue_dir, segment_path};
use common::{body, config_text, expect, next, pki, setup_receiver};

fn start(data: &Path, shards: usize) -> BrokerHandle {
    let text = config_text(&pki().certs, data, shards, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    let config = Config::from_toml_str(&text, data).expect("config");
    ciphermq_broker::start(&config).expect("broker starts")
}

/// [`start`] with 1 shard and segments rolled at `segment_bytes`.
fn start_with_segments(data: &Path, segment_bytes: u64) -> BrokerHandle {
    let text = config_text(&pki().certs, data, 1, "").replace(
        r#"mode = "memory""#,
        &format!("mode = \"durable\"\nsegment_bytes = {segment_bytes}"),
    );
    let config = Config::from_toml_str(&text, data).expect("config");
    ciphermq_broker::start(&config).expect("broker starts")
}

async fn connect(broker: &BrokerHandle, cn: &str) -> Connection {
    let opts = TlsClientOptions::for_cn(&pki().certs, cn);
    Connection::connect(&broker.local_addr().to_string(), &opts)
        .await
        .expect("connect")
}

/// Fetches everything: (id, delivery count) in order.
async fn drain(conn: &mut Connection, queue: &str) -> Vec<(String, u32)> {
    let mut got = Vec::new();
    loop {
        conn.queue_line(&format!("fetch {queue} 1000"));
        conn.flush().await.unwrap();
        let before = got.len();
        loop {
            let line = next(conn).await;
            match Reply::parse(&line) {
                Reply::Message(d) => got.push((d.message_id.to_owned(), d.delivery_count)),
                Reply::Ok(_) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        if got.len() == before {
            return got;
        }
    }
}

/// Fetches everything: the ids in order.
async fn drain_ids(conn: &mut Connection, queue: &str) -> Vec<String> {
    drain(conn, queue)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// A broker on `data` with receiver_1's queue set up and `ids` published by
/// `sender`, stopped again.
async fn stored_and_stopped(data: &Path, shards: usize, sender: &str, ids: &[&str]) {
    let broker = start(data, shards);
    let mut r = connect(&broker, "receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let mut s = connect(&broker, sender).await;
    publish(&mut s, ids).await;
    broker.shutdown();
}

async fn publish(sender: &mut Connection, ids: &[&str]) {
    for id in ids {
        expect(
            sender,
            &format!("publish ex receiver_1 {}", body(id, "receiver_1")),
            &format!("ACK {id}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_survive_a_restart_in_order_with_counts() {
    let data = tempfile::tempdir().unwrap();
    {
        let broker = start(data.path(), 2);
        let mut r = connect(&broker, "receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let mut s = connect(&broker, "sender_1").await;
        publish(&mut s, &["m1", "m2", "m3", "m4"]).await;
        // m1 delivered and acked; m2 delivered twice (nacked once), never acked.
        r.queue_line("fetch receiver_1_queue 2");
        r.flush().await.unwrap();
        assert!(next(&mut r)
            .await
            .starts_with("Message: m1 receiver_1_queue 1 "));
        assert!(next(&mut r)
            .await
            .starts_with("Message: m2 receiver_1_queue 1 "));
        assert_eq!(next(&mut r).await, "OK fetch 2");
        expect(&mut r, "ack m1", "ACK_CONFIRMED m1").await;
        expect(&mut r, "nack m2", "NACK_CONFIRMED m2").await;
        r.queue_line("fetch receiver_1_queue 1");
        r.flush().await.unwrap();
        assert!(next(&mut r)
            .await
            .starts_with("Message: m2 receiver_1_queue 2 "));
        assert_eq!(next(&mut r).await, "OK fetch 1");
        broker.shutdown();
    }
    let broker = start(data.path(), 2);
    let mut r = connect(&broker, "receiver_1").await;
    let got = drain(&mut r, "receiver_1_queue").await;
    assert_eq!(got, [("m2".into(), 3), ("m3".into(), 1), ("m4".into(), 1)]);
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_and_messages_follow_a_shard_count_change() {
    let data = tempfile::tempdir().unwrap();
    stored_and_stopped(data.path(), 2, "sender_2", &["a1", "a2"]).await;
    {
        let broker = start(data.path(), 1);
        let mut s = connect(&broker, "sender_2").await;
        // The binding survived: routing still works.
        publish(&mut s, &["a3"]).await;
        broker.shutdown();
    }
    let broker = start(data.path(), 2);
    let mut s = connect(&broker, "sender_1").await;
    publish(&mut s, &["a4"]).await;
    let mut r = connect(&broker, "receiver_1").await;
    let got = drain_ids(&mut r, "receiver_1_queue").await;
    assert_eq!(got, ["a1", "a2", "a3", "a4"]);
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_holds_across_a_restart() {
    let data = tempfile::tempdir().unwrap();
    {
        let broker = start(data.path(), 1);
        let mut r = connect(&broker, "receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let mut s = connect(&broker, "sender_1").await;
        publish(&mut s, &["d1", "d2"]).await;
        // d2 is consumed and acked before the restart.
        r.queue_line("fetch receiver_1_queue 2");
        r.flush().await.unwrap();
        next(&mut r).await;
        next(&mut r).await;
        next(&mut r).await;
        expect(&mut r, "ack d2", "ACK_CONFIRMED d2").await;
        expect(&mut r, "nack d1", "NACK_CONFIRMED d1").await;
        broker.shutdown();
    }
    let broker = start(data.path(), 1);
    let mut s = connect(&broker, "sender_1").await;
    // Retries of a stored id and of a recently acked id store nothing new.
    publish(&mut s, &["d1", "d2", "d3"]).await;
    let mut r = connect(&broker, "receiver_1").await;
    let got = drain_ids(&mut r, "receiver_1_queue").await;
    assert_eq!(got, ["d1", "d3"]);
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_holds_across_a_restart_after_the_acked_segments_are_deleted() {
    let data = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..100).map(|i| format!("seg-{i}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    {
        let broker = start_with_segments(data.path(), 4096);
        let mut r = connect(&broker, "receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let mut s = connect(&broker, "sender_1").await;
        publish(&mut s, &id_refs).await;
        let files = segments(data.path(), "receiver_1_queue");
        assert!(files.len() > 3, "several segments: {files:?}");
        let got = drain(&mut r, "receiver_1_queue").await;
        assert_eq!(got.len(), ids.len());
        for id in &ids {
            expect(&mut r, &format!("ack {id}"), &format!("ACK_CONFIRMED {id}")).await;
        }
        // One more publish (seq 100), left unacked. Every segment before
        // the one holding it holds only acked messages and must go; the
        // one holding it stays, and so does any after it (ack and delivery
        // records may fill it and roll the log on).
        publish(&mut s, &["seg-last"]).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let bases: Vec<u64> = segments(data.path(), "receiver_1_queue")
                .iter()
                .map(|p| segment_base(p))
                .collect();
            let holding_last = bases.iter().copied().filter(|b| *b <= 100).max();
            if bases.iter().all(|b| Some(*b) >= holding_last) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "acked segments deleted: {bases:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(
            files_named(data.path(), "receiver_1_queue", "dedup-").len(),
            1,
            "the acked ids were carried to a dedup file"
        );
        broker.shutdown();
    }
    let broker = start_with_segments(data.path(), 4096);
    let mut s = connect(&broker, "sender_1").await;
    // Every retry is still within the window: acknowledged, nothing stored.
    publish(&mut s, &id_refs).await;
    let mut r = connect(&broker, "receiver_1").await;
    let got = drain_ids(&mut r, "receiver_1_queue").await;
    assert_eq!(got, ["seg-last"]);
    broker.shutdown();
}

/// A segment holding more acked ids than one commit round carries is
/// deleted only after all of them reach the dedup file: after a restart
/// every one of them is still refused as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_holds_across_a_restart_after_a_segment_carried_over_several_rounds() {
    let data = tempfile::tempdir().unwrap();
    let queue = "receiver_1_queue";
    let mut ids: Vec<String> = Vec::new();
    {
        let broker = start_with_segments(data.path(), 2 << 20);
        let mut r = connect(&broker, "receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let mut s = connect(&broker, "sender_1").await;
        // Published and acked a batch at a time until the log rolls: the
        // first segment then holds only acked messages.
        loop {
            let batch: Vec<String> = (ids.len()..ids.len() + 256)
                .map(|i| format!("carry-{i}"))
                .collect();
            for id in &batch {
                s.queue_line(&format!("publish ex receiver_1 {}", body(id, "receiver_1")));
            }
            s.flush().await.unwrap();
            for id in &batch {
                assert_eq!(next(&mut s).await, format!("ACK {id}"));
            }
            let got = drain_ids(&mut r, queue).await;
            assert_eq!(got, batch);
            for id in &batch {
                r.queue_line(&format!("ack {id}"));
            }
            r.flush().await.unwrap();
            for id in &batch {
                assert_eq!(next(&mut r).await, format!("ACK_CONFIRMED {id}"));
            }
            ids.extend(batch);
            if segments(data.path(), queue).len() >= 2 {
                break;
            }
        }
        let second = segment_base(&segments(data.path(), queue)[1]);
        assert!(
            second > ciphermq_shard::durability::CARRY_PER_ROUND as u64,
            "the first segment holds {second} ids, more than a round carries"
        );
        // One more, left unacked, so the log has something to commit.
        publish(&mut s, &["carry-last"]).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while segment_base(&segments(data.path(), queue)[0]) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the acked segment was never deleted"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        broker.shutdown();
    }
    let broker = start_with_segments(data.path(), 2 << 20);
    let mut s = connect(&broker, "sender_1").await;
    // Every retry, including those of the segment deleted, is acknowledged
    // and not stored again.
    for batch in ids.chunks(256) {
        for id in batch {
            s.queue_line(&format!("publish ex receiver_1 {}", body(id, "receiver_1")));
        }
        s.flush().await.unwrap();
        for id in batch {
            assert_eq!(next(&mut s).await, format!("ACK {id}"));
        }
    }
    let mut r = connect(&broker, "receiver_1").await;
    assert_eq!(drain_ids(&mut r, queue).await, ["carry-last"]);
    broker.shutdown();
}

fn segments(data: &Path, queue: &str) -> Vec<std::path::PathBuf> {
    files_named(data, queue, "segment-")
}

/// The first sequence number a segment file holds, from its name.
fn segment_base(path: &Path) -> u64 {
    let name = path.file_name().unwrap().to_string_lossy();
    name["segment-".len()..name.len() - ".log".len()]
        .parse()
        .unwrap()
}

fn files_named(data: &Path, queue: &str, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(queue_dir(data, queue))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "log")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_logs_are_reported_and_never_served() {
    let data = tempfile::tempdir().unwrap();
    stored_and_stopped(data.path(), 1, "sender_1", &["x1", "x2", "x3"]).await;
    let files = segments(data.path(), "receiver_1_queue");
    let last = files.last().expect("a segment");
    let mut bytes = std::fs::read(last).unwrap();
    // Flip a bit inside the body of x2 (the second record).
    let second = bytes
        .windows(4)
        .position(|w| w == b"\"x2\"")
        .expect("x2 on disk");
    bytes[second + 1] ^= 0x01;
    // And a torn tail: half a record header.
    bytes.extend_from_slice(&[0x20, 0, 0]);
    std::fs::write(last, &bytes).unwrap();

    let broker = start(data.path(), 1);
    let mut r = connect(&broker, "receiver_1").await;
    let got = drain_ids(&mut r, "receiver_1_queue").await;
    assert_eq!(
        got,
        ["x1", "x3"],
        "the corrupt record is skipped, never served"
    );
    // The torn tail was truncated, so new appends go to a readable log.
    let mut s = connect(&broker, "sender_1").await;
    publish(&mut s, &["x4"]).await;
    broker.shutdown();
    let broker = start(data.path(), 1);
    let mut r = connect(&broker, "receiver_1").await;
    let got = drain_ids(&mut r, "receiver_1_queue").await;
    assert_eq!(got, ["x1", "x3", "x4"]);
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_keys_survive_a_restart_sealed_on_disk() {
    let data = tempfile::tempdir().unwrap();
    let key = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";
    {
        let broker = start(data.path(), 2);
        let mut r = connect(&broker, "receiver_2").await;
        expect(
            &mut r,
            &format!("register_public_key {key}"),
            "Public key registered",
        )
        .await;
        broker.shutdown();
    }
    let file = std::fs::read(data.path().join("keys").join("receiver_2.key")).unwrap();
    let raw: Vec<u8> = (1..=32).collect();
    assert!(
        !file.windows(32).any(|w| w == raw.as_slice()),
        "sealed, not in clear"
    );
    let broker = start(data.path(), 1);
    let mut s = connect(&broker, "sender_1").await;
    expect(
        &mut s,
        "get_public_key receiver_2",
        &format!("PUBLIC_KEY receiver_2 {key}"),
    )
    .await;
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_aes_key_fails_the_start_clearly() {
    let data = tempfile::tempdir().unwrap();
    {
        let broker = start(data.path(), 1);
        let mut r = connect(&broker, "receiver_1").await;
        expect(
            &mut r,
            "register_public_key AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",
            "Public key registered",
        )
        .await;
        broker.shutdown();
    }
    let text = config_text(&pki().certs, data.path(), 1, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        + "\n[encryption]\naes_key = \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"\n";
    let config = Config::from_toml_str(&text, data.path()).expect("config");
    let err = ciphermq_broker::start(&config)
        .err()
        .expect("a wrong key must not start");
    let text = err.to_string();
    assert!(
        text.contains("receiver_1.key") && text.contains("aes_key"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_what_was_accepted_and_keeps_it() {
    let data = tempfile::tempdir().unwrap();
    let broker = start(data.path(), 2);
    let mut r = connect(&broker, "receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let s = connect(&broker, "sender_1").await;
    let (mut rd, mut wr) = s.into_split();
    for i in 0..2000 {
        wr.queue_line(&format!(
            "publish ex receiver_1 {}",
            body(&format!("g{i}"), "receiver_1")
        ));
    }
    wr.flush().await.unwrap();
    // Stop while the pipeline is in flight.
    tokio::task::spawn_blocking(move || broker.shutdown())
        .await
        .unwrap();
    let mut acked = Vec::new();
    while let Ok(Some(line)) = rd.read_line().await {
        match Reply::parse(&line) {
            Reply::Ack(id) => acked.push(id.to_owned()),
            other => panic!("every answered publish is acknowledged, got {other:?}"),
        }
    }
    let broker = start(data.path(), 2);
    let mut r = connect(&broker, "receiver_1").await;
    let stored = drain_ids(&mut r, "receiver_1_queue").await;
    assert!(stored.len() >= acked.len());
    assert_eq!(
        &stored[..acked.len()],
        &acked[..],
        "every ACKed message is kept, in order"
    );
    broker.shutdown();
}

/// A file standing where the log is about to create a segment (left by
/// something else: the broker names every file it makes) is moved aside,
/// never truncated or written over, and the log goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_in_the_way_of_a_new_segment_is_moved_aside_never_overwritten() {
    let data = tempfile::tempdir().unwrap();
    stored_and_stopped(data.path(), 1, "sender_1", &["d1"]).await;
    let broker = start(data.path(), 1);
    // After a restart new appends go to a new segment based at the next
    // sequence number, 1, created at the first append. (Made after
    // recovery, which would read it.)
    let dir = queue_dir(data.path(), "receiver_1_queue");
    let in_the_way = segment_path(&dir, 1);
    std::fs::write(&in_the_way, b"someone else's bytes").unwrap();
    let mut s = connect(&broker, "sender_1").await;
    publish(&mut s, &["d2"]).await;
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".displaced-"))
        .collect();
    assert_eq!(aside.len(), 1, "moved aside: {aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), b"someone else's bytes");
    broker.shutdown();
    let broker = start(data.path(), 1);
    let mut r = connect(&broker, "receiver_1").await;
    assert_eq!(drain_ids(&mut r, "receiver_1_queue").await, ["d1", "d2"]);
    broker.shutdown();
}
