//! What the broker's log says about what clients do, read from the real
//! binary's stderr: each `Access denied` of a few in a row gets its line
//! (a flood is summarised: the throttle's own tests in
//! `ciphermq_shard::log_throttle`), a refused publish body's line names the
//! field at fault (the reply stays `NACK <id> invalid` / `Error: invalid
//! message`), and a line with nothing left out says nothing about skipping
//! (no "not logged since the last line", no `skipped=0`).

mod common;

use std::time::{Duration, Instant};

use common::process::BrokerProcess;
use common::{check_denied, config_text, pki};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_of_a_few_denials_is_logged_and_no_line_mentions_nothing_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let text = config_text(&pki().certs, &dir.path().join("data"), 1, "")
        .replace("console = false", "console = true\nlevel = \"info\"");
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);

    let mut s = broker.connect("sender_1").await;
    let mut r = broker.connect("receiver_1").await;
    for queue in ["a", "b", "c"] {
        check_denied(&mut s, &format!("declare_queue {queue}"), "sender").await;
    }
    // The reply is the protocol's; the log says which field is wrong.
    common::check(
        &mut s,
        r#"publish ex receiver_1 {"message_id":"m1","nonce":"n"}"#,
        "NACK m1 invalid",
    )
    .await;
    common::check(
        &mut s,
        "publish ex receiver_1 {\"message_id\":",
        "Error: invalid message",
    )
    .await;
    common::check(
        &mut r,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;

    let denied = |b: &BrokerProcess| {
        b.log_text()
            .lines()
            .filter(|l| l.contains("access denied") && l.contains("declare_queue"))
            .count()
    };
    // The lines reach stderr a little after the replies.
    let deadline = Instant::now() + Duration::from_secs(30);
    let explained = |b: &BrokerProcess| {
        b.logged(&[
            "publish refused: invalid message",
            r#"field "receiver_client_id" is missing"#,
        ]) && b.logged(&["publish refused: invalid message: not JSON"])
    };
    while denied(&broker) < 3 || !broker.logged(&["OK declare_exchange ex"]) || !explained(&broker)
    {
        assert!(
            Instant::now() < deadline,
            "three denials in a row, {} logged:\n{}",
            denied(&broker),
            broker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = broker.log_text();
    for l in log.lines().filter(|l| {
        l.contains("connection accepted") || l.contains("access denied") || l.contains("OK declare")
    }) {
        assert!(
            !l.contains("skipped") && !l.contains("not logged since"),
            "a line with nothing left out speaks of skipping: {l}"
        );
    }
    assert!(
        broker.logged(&["connection accepted", "cn=receiver_1"]),
        "{log}"
    );
}
