//! The reference clients against a real broker over mutual TLS: the sender
//! encrypts and publishes, the receiver decrypts, writes each message exactly once
//! and acknowledges only what is on disk, even when it is killed mid-run and
//! restarted; a message that cannot be decrypted is nacked, never written, and
//! ends in the dead-letter queue.
//!
//! The clients run as library calls (`run_sender`, `run_receiver`) on this test's
//! runtime; the test PKI has no X25519 keys, so each test makes the receiver's.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ciphermq_clients::crypto::{self, generate_secret_key};
use ciphermq_clients::key_file;
use ciphermq_clients::message_source::Contents;
use ciphermq_clients::receiver::{
    run_receiver, ReceiverLimits, ReceiverReport, ReceiverStats, StopReason,
};
use ciphermq_clients::receiver_config::ReceiverConfig;
use ciphermq_clients::sender::{run_sender, SendJob, SenderReport, SenderStats};
use ciphermq_clients::sender_config::SenderConfig;
use ciphermq_clients::TlsConfig;
use common::{check, connect_as, fetch, pki, TestBroker};

/// Longest a whole client run may take before the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// A receiver's key pair on disk and its output directory.
struct ReceiverFiles {
    _dir: tempfile::TempDir,
    keys: PathBuf,
    data: PathBuf,
}

/// Makes `cn`'s X25519 key pair (the test PKI has none) in a fresh directory.
fn receiver_files(cn: &str) -> ReceiverFiles {
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = dir.path().join("keys");
    let secret = generate_secret_key();
    key_file::write_secret_key(&key_file::private_key_path(&keys, cn), &secret)
        .expect("write private key");
    key_file::write_public_key(&key_file::public_key_path(&keys, cn), &secret.public_key())
        .expect("write public key");
    let data = dir.path().join("data");
    ReceiverFiles {
        _dir: dir,
        keys,
        data,
    }
}

fn receiver_config(broker: &TestBroker, files: &ReceiverFiles) -> ReceiverConfig {
    let mut c = ReceiverConfig::new(
        broker.addr.clone(),
        TlsConfig::for_cn(&pki().certs, "receiver_1"),
    );
    c.private_key_path = files.keys.join("{cn}_private.key");
    c.output_dir = files.data.clone();
    c.prefetch = 200;
    c.batch_size = 64;
    c.reconnect_backoff_ms = 50;
    c.max_backoff_ms = 500;
    c.reconnect_attempts = 20;
    c
}

/// A sender of `sender_1` to `receiver_1`; `cache` is its public-key cache.
fn sender_config(broker: &TestBroker, cache: &Path) -> SenderConfig {
    let mut c = SenderConfig::new(
        broker.addr.clone(),
        TlsConfig::for_cn(&pki().certs, "sender_1"),
    );
    c.receivers = vec!["receiver_1".into()];
    c.keys_dir = cache.to_owned();
    c.content_template = serde_json::json!("hello {seq} from {sender_id}");
    c.sender.max_inflight = 256;
    c.sender.key_wait_secs = 30;
    c.sender.reconnect_attempts = 5;
    c
}

/// `count` messages from the config's template, in run `run_id` (random if `None`).
fn job(config: &SenderConfig, count: u64, run_id: Option<String>) -> SendJob {
    SendJob {
        contents: Contents::Template {
            template: config.content_template.clone(),
            count,
            pad_to: 0,
        },
        run_id,
    }
}

/// Runs the sender to completion (bounded).
async fn send(config: &SenderConfig, job: SendJob) -> SenderReport {
    let stats = Arc::new(SenderStats::default());
    tokio::time::timeout(
        RUN_LIMIT,
        run_sender(config, job, stats, std::future::pending()),
    )
    .await
    .expect("sender finished in time")
    .expect("sender succeeded")
}

/// Runs a receiver on its own task until `limits` stop it.
fn spawn_receiver(
    config: ReceiverConfig,
    limits: ReceiverLimits,
    stats: Arc<ReceiverStats>,
) -> tokio::task::JoinHandle<ReceiverReport> {
    tokio::spawn(async move {
        tokio::time::timeout(
            RUN_LIMIT,
            run_receiver(&config, limits, stats, std::future::pending()),
        )
        .await
        .expect("receiver finished in time")
        .expect("receiver succeeded")
    })
}

/// Parses the output file: (message_id, content) per line, asserting each line is
/// a complete record.
fn records(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).expect("read output file");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "output ends mid-line"
    );
    text.lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
            assert!(v["timestamp"].as_u64().is_some(), "no timestamp in {line}");
            (
                v["message_id"].as_str().expect("message_id").to_owned(),
                v["content"].as_str().expect("content").to_owned(),
            )
        })
        .collect()
}

/// Asserts the file holds each of the `count` messages of `run_id` exactly once,
/// each with its own plaintext.
fn assert_exactly_once(path: &Path, run_id: &str, count: u64) {
    let got = records(path);
    assert_eq!(got.len() as u64, count, "lines in {}", path.display());
    let ids: HashSet<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids.len(), got.len(), "a message was written twice");
    for seq in 1..=count {
        let id = format!("sender_1-{run_id}.{seq}-receiver_1");
        assert!(ids.contains(id.as_str()), "{id} missing");
    }
    for (id, content) in &got {
        let seq = id
            .trim_start_matches(&format!("sender_1-{run_id}."))
            .trim_end_matches("-receiver_1");
        assert_eq!(
            content,
            &format!("hello {seq} from sender_1"),
            "content of {id}"
        );
    }
}

/// Asserts the broker holds nothing more for receiver_1 (every delivery acked).
async fn assert_queue_drained(broker: &TestBroker) {
    let mut conn = connect_as(broker, "receiver_1").await;
    let left = fetch(&mut conn, "receiver_1_queue", 100).await;
    assert!(
        left.is_empty(),
        "{} messages left unacked in receiver_1_queue",
        left.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_decrypted_written_and_acked_exactly_once() {
    const N: u64 = 2000;
    let broker = TestBroker::start(2);
    let files = receiver_files("receiver_1");
    let stats = Arc::new(ReceiverStats::default());
    let limits = ReceiverLimits {
        until_total: Some(N),
        ..Default::default()
    };
    let receiver = spawn_receiver(receiver_config(&broker, &files), limits, stats.clone());

    // The sender waits for the receiver's key, then caches it.
    let cache = tempfile::tempdir().expect("tempdir");
    let config = sender_config(&broker, cache.path());
    let sent = send(&config, job(&config, N, None)).await;
    assert_eq!(
        (sent.sent, sent.acked, sent.failed, sent.unsent),
        (N, N, 0, 0),
        "{sent}"
    );
    let cached = key_file::read_public_key(&key_file::public_key_path(cache.path(), "receiver_1"))
        .expect("cached key");
    let real = key_file::read_secret_key(&key_file::private_key_path(&files.keys, "receiver_1"))
        .expect("key");
    assert_eq!(cached, real.public_key());

    let report = receiver.await.expect("receiver task");
    assert_eq!(report.stop, StopReason::Total);
    assert_eq!(
        (report.written, report.rejected, report.total_records),
        (N, 0, N),
        "{report}"
    );
    assert_eq!(
        report.acked, N,
        "every written message acknowledged: {report}"
    );
    assert_eq!(
        report.output,
        files.data.join("receiver_1_queue_received_messages.jsonl")
    );
    assert_exactly_once(&report.output, &sent.run_id, N);
    assert_queue_drained(&broker).await;

    // Sending the same run again is deduplicated by the broker (within its window)
    // or by the receiver: the file does not grow.
    let again = send(&config, job(&config, 10, Some(sent.run_id.clone()))).await;
    assert_eq!((again.acked, again.failed), (10, 0), "{again}");
    let limits = ReceiverLimits {
        idle_exit: Some(Duration::from_millis(1500)),
        ..Default::default()
    };
    let report = spawn_receiver(
        receiver_config(&broker, &files),
        limits,
        Arc::new(ReceiverStats::default()),
    )
    .await
    .expect("receiver task");
    assert_eq!(report.written, 0, "{report}");
    assert_exactly_once(&report.output, &sent.run_id, N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_killed_mid_run_and_restarted_still_writes_each_message_once() {
    const N: u64 = 3000;
    let broker = TestBroker::start(2);
    let files = receiver_files("receiver_1");
    let first_stats = Arc::new(ReceiverStats::default());
    let first = spawn_receiver(
        receiver_config(&broker, &files),
        ReceiverLimits::default(),
        first_stats.clone(),
    );

    let cache = tempfile::tempdir().expect("tempdir");
    let mut config = sender_config(&broker, cache.path());
    config.sender.max_inflight = 64; // a slower stream, so the kill lands mid-run
    let sender = tokio::spawn(async move { send(&config, job(&config, N, None)).await });

    // Kill the first receiver once it has written part of the stream.
    let deadline = tokio::time::Instant::now() + RUN_LIMIT;
    while first_stats.written.load(Relaxed) < N / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first receiver wrote nothing"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    let written_before = first_stats.written.load(Relaxed);
    assert!(
        written_before < N,
        "the kill came too late to test anything"
    );

    let second_stats = Arc::new(ReceiverStats::default());
    let limits = ReceiverLimits {
        until_total: Some(N),
        ..Default::default()
    };
    let second = spawn_receiver(
        receiver_config(&broker, &files),
        limits,
        second_stats.clone(),
    );
    let sent = sender.await.expect("sender task");
    assert_eq!((sent.acked, sent.failed), (N, 0), "{sent}");
    let report = second.await.expect("receiver task");
    eprintln!("first receiver wrote {written_before} before the kill; the restarted one: {report}");
    assert_eq!(report.stop, StopReason::Total, "{report}");
    assert_eq!(report.total_records, N);
    assert_eq!(
        written_before + report.written,
        N,
        "first wrote {written_before}, second {report}"
    );
    assert_exactly_once(&report.output, &sent.run_id, N);
    assert_queue_drained(&broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecryptable_message_is_nacked_never_written_and_dead_lettered() {
    let broker = TestBroker::start(1);
    let files = receiver_files("receiver_1");
    let stats = Arc::new(ReceiverStats::default());
    let limits = ReceiverLimits {
        until_total: Some(2),
        ..Default::default()
    };
    let receiver = spawn_receiver(receiver_config(&broker, &files), limits, stats.clone());

    // Wait for the receiver's key, then publish by hand: one message sealed for a
    // stranger's key, one relabelled under another id, one good one.
    let mut sender = connect_as(&broker, "sender_1").await;
    let key = loop {
        let reply = common::ask(&mut sender, "get_public_key receiver_1").await;
        if let Some(b64) = reply.strip_prefix("PUBLIC_KEY receiver_1 ") {
            break crypto::public_key_from_base64(b64).expect("key");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stranger = generate_secret_key().public_key();
    let bad =
        crypto::encrypt(&stranger, "bad-1", "receiver_1", b"for someone else").expect("encrypt");
    let mut relabelled = crypto::encrypt(&key, "orig-1", "receiver_1", b"moved").expect("encrypt");
    relabelled.message_id = "moved-1".into();
    let good = crypto::encrypt(&key, "good-1", "receiver_1", b"fine").expect("encrypt");
    let good2 = crypto::encrypt(&key, "good-2", "receiver_1", b"also fine").expect("encrypt");
    for (msg, id) in [
        (&bad, "bad-1"),
        (&relabelled, "moved-1"),
        (&good, "good-1"),
        (&good2, "good-2"),
    ] {
        let line = format!(
            "publish ex receiver_1 {}",
            serde_json::to_string(msg).expect("json")
        );
        check(&mut sender, &line, &format!("ACK {id}")).await;
    }

    let report = receiver.await.expect("receiver task");
    assert_eq!(report.written, 2, "{report}");
    assert!(
        report.rejected >= 2,
        "both bad messages rejected at least once: {report}"
    );
    let ids: Vec<String> = records(&report.output)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["good-1", "good-2"]);

    // The bad ones keep coming back to a receiver and being nacked until the
    // broker dead-letters them (max_deliveries, default 10).
    let files2 = files;
    let limits = ReceiverLimits {
        idle_exit: Some(Duration::from_millis(1500)),
        ..Default::default()
    };
    let again = spawn_receiver(
        receiver_config(&broker, &files2),
        limits,
        Arc::new(ReceiverStats::default()),
    )
    .await
    .expect("receiver task");
    assert_eq!(again.written, 0, "{again}");
    let mut conn = connect_as(&broker, "receiver_1").await;
    let dead = fetch(&mut conn, "receiver_1_queue.dlq", 10).await;
    let mut dead_ids: Vec<String> = dead.iter().map(|d| d.id.clone()).collect();
    dead_ids.sort();
    assert_eq!(dead_ids, ["bad-1", "moved-1"]);
    assert_eq!(records(&again.output).len(), 2, "nothing bad was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_run_loses_and_duplicates_nothing() {
    const N: u64 = 3000;
    let data = tempfile::tempdir().expect("tempdir");
    let mut broker = TestBroker::start_durable_at(2, data.path(), "127.0.0.1:0");
    let addr = broker.addr.clone();
    let files = receiver_files("receiver_1");
    let stats = Arc::new(ReceiverStats::default());
    let limits = ReceiverLimits {
        until_total: Some(N),
        ..Default::default()
    };
    let receiver = spawn_receiver(receiver_config(&broker, &files), limits, stats.clone());
    let cache = tempfile::tempdir().expect("tempdir");
    let mut config = sender_config(&broker, cache.path());
    config.sender.max_inflight = 64;
    config.sender.reconnect_attempts = 50;
    let sender = tokio::spawn(async move { send(&config, job(&config, N, None)).await });

    let deadline = tokio::time::Instant::now() + RUN_LIMIT;
    while stats.written.load(Relaxed) < N / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the receiver wrote nothing"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Stop the broker mid-stream and bring it back on the same address and data.
    let data_dir = data.path().to_owned();
    let broker = tokio::task::spawn_blocking(move || {
        broker.stop();
        TestBroker::start_durable_at(2, &data_dir, &addr)
    })
    .await
    .expect("restart");
    let written_before = stats.written.load(Relaxed);
    assert!(
        written_before < N,
        "the restart came too late to test anything"
    );

    let sent = sender.await.expect("sender task");
    assert_eq!((sent.acked, sent.failed), (N, 0), "{sent}");
    let report = receiver.await.expect("receiver task");
    eprintln!("{written_before} written before the restart; {report}");
    assert_eq!(report.total_records, N);
    assert_exactly_once(&report.output, &sent.run_id, N);
    assert_queue_drained(&broker).await;
}
