//! The broker binary speaks systemd's `Type=notify` protocol when run with
//! `$NOTIFY_SOCKET`: `READY=1` with the listening address once it serves,
//! `WATCHDOG=1` every half `$WATCHDOG_USEC` while its shards run, and
//! `STOPPING=1` when SIGTERM starts the drain. Here the test is the service
//! manager: it binds the datagram socket and reads what arrives.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::config_text;
use common::pki;
use common::process::BrokerProcess;

/// Notifications received until `until` says stop, or `limit` passes.
fn collect(
    socket: &UnixDatagram,
    limit: Duration,
    mut until: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !until(&got) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.recv(&mut buf) {
            Ok(n) => got.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => break,
        }
    }
    got
}

#[test]
fn ready_watchdog_and_stopping_reach_the_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        config_text(&pki().certs, &dir.path().join("data"), 2, ""),
    )
    .unwrap();
    let mut broker = BrokerProcess::spawn_with(&config, |cmd| {
        // A 400 ms watchdog: a ping every 200 ms.
        cmd.env("NOTIFY_SOCKET", &path)
            .env("WATCHDOG_USEC", "400000");
    })
    .unwrap_or_else(|r| panic!("broker refused to start: {r:?}"));

    let got = collect(&socket, Duration::from_secs(10), |got| {
        got.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3
    });
    let ready = got
        .first()
        .unwrap_or_else(|| panic!("no notification: {got:?}"));
    assert_eq!(
        ready,
        &format!(
            "READY=1\nSTATUS=listening on {} with 2 shard(s)",
            broker.addr
        ),
        "READY=1 comes first, with the address"
    );
    let pings = got.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(pings >= 3, "three watchdog pings within 10 s: {got:?}");

    broker.signal("TERM");
    let got = collect(&socket, Duration::from_secs(10), |got| {
        got.iter().any(|m| m.starts_with("STOPPING=1"))
    });
    let stopping = got
        .iter()
        .find(|m| m.starts_with("STOPPING=1\nSTATUS=draining"))
        .unwrap_or_else(|| panic!("no STOPPING=1: {got:?}"));
    assert!(stopping.contains("at most 5 s"), "{stopping}");
    let status = broker
        .wait_timeout(Duration::from_secs(10))
        .expect("the broker exits");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn without_notify_socket_nothing_is_sent_and_the_broker_runs_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        config_text(&pki().certs, &dir.path().join("data"), 1, ""),
    )
    .unwrap();
    // A watchdog without a socket: no thread, no error.
    let broker = BrokerProcess::spawn_with(&config, |cmd| {
        cmd.env("WATCHDOG_USEC", "400000");
    })
    .unwrap_or_else(|r| panic!("broker refused to start: {r:?}"));
    assert_eq!(broker.stop().code(), Some(0));
}
