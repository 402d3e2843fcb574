//! The broker process is killed with SIGKILL at random moments under
//! pipelined load, 10 times, and restarted on the same data directory;
//! publishers retry what was never acknowledged. Finally a consumer drains
//! the queue: every id that was ever `ACK`ed must be delivered. Duplicates
//! are allowed (counted and printed), losses are not. (`power_loss.rs` does
//! the same with the page cache dropped at each crash.) A second test kills
//! it while a fully acked segment's ids are being carried to the dedup file,
//! and checks that every acked id stays refused as a duplicate.

mod common;

use std::path::{Path, PathBuf};

use common::carry::acked_ids_refused_through_carry_crashes;
use common::process::{assert_none_lost, drain_counting, load_through_crashes, BrokerProcess};
use common::{config_text, pki, setup_receiver};

const CRASHES: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_repeated_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = durable_with_queue(dir.path(), 2, 65536).await;
    let (acked, broker) = load_through_crashes(&config, CRASHES, 3000, BrokerProcess::kill).await;
    let delivered = drain_counting(&broker).await;
    assert_none_lost(
        &format!("crash test: {CRASHES} SIGKILLs"),
        &acked,
        &delivered,
    );
}

/// Ids acked within the dedup window stay refused, and an unacked message
/// stays queued, through SIGKILLs while a fully acked segment's ids are
/// being carried to the dedup file (`common/carry.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_ids_stay_deduplicated_through_sigkill_during_a_segment_carry() {
    let dir = tempfile::tempdir().unwrap();
    let config = durable_with_queue(dir.path(), 1, 8 << 20).await;
    acked_ids_refused_through_carry_crashes(&config, &dir.path().join("data"), 4, || {}).await;
}

/// Writes `dir/broker.toml` (durable, `data` under `dir`, rolling segments at
/// `segment_bytes`) and sets up receiver_1's queue with it: the config's path.
async fn durable_with_queue(dir: &Path, shards: usize, segment_bytes: u64) -> PathBuf {
    let config = dir.join("broker.toml");
    // Warnings and errors kept (`BrokerProcess::log_text`) for failures.
    let text = config_text(&pki().certs, &dir.join("data"), shards, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace("console = false", "console = true\nlevel = \"warn\"")
        .replace(
            "[storage]",
            &format!("[storage]\nsegment_bytes = {segment_bytes}"),
        );
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    assert!(broker.stop().success());
    config
}
