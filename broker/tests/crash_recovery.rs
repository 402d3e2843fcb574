//! The broker process is killed with SIGKILL at random moments under
//! pipelined load, 10 times, and restarted on the same data directory;
//! publishers retry what was never acknowledged. Finally a consumer drains
//! the queue: every id that was ever `ACK`ed must be delivered. Duplicates
//! are allowed (counted and printed), losses are not. (`power_loss.rs` does
//! the same with the page cache dropped at each crash.)

mod common;

use common::process::{assert_none_lost, drain_counting, load_through_crashes, BrokerProcess};
use common::{config_text, pki, setup_receiver};

const CRASHES: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_repeated_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace("[storage]", "[storage]\nsegment_bytes = 65536");
    std::fs::write(&config, text).unwrap();
    {
        let broker = BrokerProcess::start(&config);
        let mut r = broker.connect("receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        assert!(broker.stop().success());
    }
    let (acked, broker) = load_through_crashes(&config, CRASHES, 3000, BrokerProcess::kill).await;
    let delivered = drain_counting(&broker).await;
    assert_none_lost(
        &format!("crash test: {CRASHES} SIGKILLs"),
        &acked,
        &delivered,
    );
}
