//! The data directory survives its own faults, seen from outside: the broker
//! binary is started on real directories that were damaged by hand.
//!
//! - a second broker on a locked directory stops before binding, naming the
//!   lock file and the holder's pid;
//! - a damaged `topology.json` falls back to `topology.json.prev`, and the
//!   damaged file is kept;
//! - a damaged sealed key is set aside while the other keys are served;
//! - a queue directory missing from the topology is adopted by its owner, or
//!   stops the start when no receiver owns it; a dead-letter queue's
//!   directory (a crash before its declaration was saved) goes to the owner
//!   the topology records for its queue, an admin included;
//! - a damaged `aes.key` and an oversized `performance.max_message_bytes`
//!   stop the start with the key or file named.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use ciphermq_clients::connection::Connection;
use common::process::{BrokerProcess as Broker, Refused};
use common::{body, check, config_text, fetch, pki, setup_receiver, TIMEOUT};

/// A directory with a durable broker's config (`broker.toml`) over `data/`,
/// with console logs on so warnings can be read; `extra` is appended.
fn setup(extra: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("broker.toml");
    let text = config_text(&pki().certs, &data, 2, extra)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace("console = false", "console = true\nlevel = \"warn\"");
    std::fs::write(&config, text).unwrap();
    (dir, config, data)
}

fn start(config: &Path) -> Broker {
    Broker::start(config)
}

fn refused(config: &Path) -> Refused {
    match Broker::spawn(config) {
        Ok(b) => panic!("the broker started on {} but should not have", b.addr),
        Err(r) => {
            assert!(!r.status.success(), "{r:?}");
            r
        }
    }
}

/// The files in `dir` whose names start with `prefix`.
fn files_starting(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect()
}

async fn publish(sender: &mut Connection, ids: &[&str]) {
    for id in ids {
        check(
            sender,
            &format!("publish ex receiver_1 {}", body(id, "receiver_1")),
            &format!("ACK {id}"),
        )
        .await;
    }
}

fn ids(got: &[common::Got]) -> Vec<&str> {
    got.iter().map(|g| g.id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_a_locked_data_dir_exits_naming_the_lock_and_its_holder() {
    let (_dir, config, data) = setup("");
    let first = start(&config);
    let second = refused(&config);
    let lock = std::fs::canonicalize(&data).unwrap().join("lock");
    assert!(
        second.stderr.contains(&*lock.to_string_lossy()),
        "the error names the lock file: {second:?}"
    );
    assert!(
        second.stderr.contains(&format!("pid {}", first.pid())),
        "the error names the holder's pid: {second:?}"
    );
    assert!(
        !second.stdout.contains("listening"),
        "the second broker bound nothing: {second:?}"
    );
    // The first one is untouched and still serves.
    let mut s = first.connect("sender_1").await;
    check(&mut s, "heartbeat", "OK heartbeat").await;
    // The lock dies with its holder, even by SIGKILL.
    first.kill();
    start(&config).kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_topology_falls_back_to_the_previous_copy() {
    let (_dir, config, data) = setup("");
    let broker = start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    // One more change, so the previous copy holds the binding above.
    check(
        &mut r,
        "declare_queue receiver_1_later",
        "OK declare_queue receiver_1_later",
    )
    .await;
    let mut s = broker.connect("sender_1").await;
    publish(&mut s, &["t1", "t2"]).await;
    broker.kill();

    let topology = data.join("topology.json");
    let garbage = b"{\"queues\": [{\"name\": \"receiver_1_q";
    std::fs::write(&topology, garbage).unwrap();
    let broker = start(&config);
    let log = broker.log_text();
    assert!(log.contains("topology.json.prev"), "warned: {log}");
    let mut r = broker.connect("receiver_1").await;
    // The queue, its messages and its binding are back.
    assert_eq!(
        ids(&fetch(&mut r, "receiver_1_queue", 10).await),
        ["t1", "t2"]
    );
    let mut s = broker.connect("sender_1").await;
    publish(&mut s, &["t3"]).await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 10).await), ["t3"]);
    // The damaged file is kept aside, as it was.
    let aside = files_starting(&data, "topology.json.corrupt-");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), garbage);
    broker.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_key_file_is_set_aside_and_the_other_keys_are_served() {
    let b64 = |byte: u8| base64::engine::general_purpose::STANDARD.encode([byte; 32]);
    let (_dir, config, data) = setup("");
    let broker = start(&config);
    for (cn, byte) in [("receiver_1", 1u8), ("receiver_2", 2u8)] {
        let mut r = broker.connect(cn).await;
        check(
            &mut r,
            &format!("register_public_key {}", b64(byte)),
            "Public key registered",
        )
        .await;
    }
    broker.kill();

    let keys = std::fs::canonicalize(data.join("keys")).unwrap();
    let damaged = keys.join("receiver_1.key");
    let mut sealed = std::fs::read(&damaged).unwrap();
    sealed[30] ^= 0x40;
    std::fs::write(&damaged, &sealed).unwrap();
    let broker = start(&config);
    let log = broker.log_text();
    assert!(log.contains(&*damaged.to_string_lossy()), "logged: {log}");
    let mut s = broker.connect("sender_1").await;
    check(
        &mut s,
        "get_public_key receiver_2",
        &format!("PUBLIC_KEY receiver_2 {}", b64(2)),
    )
    .await;
    check(
        &mut s,
        "get_public_key receiver_1",
        "Error: no public key for receiver_1",
    )
    .await;
    assert!(!damaged.exists());
    let aside = files_starting(&keys, "receiver_1.key.corrupt-");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), sealed);
    // The receiver registers again and is served.
    let mut r = broker.connect("receiver_1").await;
    check(
        &mut r,
        &format!("register_public_key {}", b64(3)),
        "Public key registered",
    )
    .await;
    check(
        &mut s,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {}", b64(3)),
    )
    .await;
    broker.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_directory_missing_from_the_topology_is_adopted_by_its_owner() {
    let (_dir, config, data) = setup("");
    let broker = start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let mut s = broker.connect("sender_1").await;
    publish(&mut s, &["o1", "o2"]).await;
    broker.kill();

    // The topology and its copy are lost; the queue's log is still there.
    std::fs::remove_file(data.join("topology.json")).unwrap();
    std::fs::remove_file(data.join("topology.json.prev")).unwrap();
    let broker = start(&config);
    let log = broker.log_text();
    assert!(log.contains("adopted"), "warned: {log}");
    let saved = std::fs::read_to_string(data.join("topology.json")).unwrap();
    assert!(saved.contains("\"receiver_1_queue\""), "{saved}");
    let mut r = broker.connect("receiver_1").await;
    // Declaring it again keeps what it holds.
    check(
        &mut r,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    assert_eq!(
        ids(&fetch(&mut r, "receiver_1_queue", 10).await),
        ["o1", "o2"]
    );
    broker.kill();
}

/// Removes queue `name` from the saved topology at `path`, as if the broker
/// had stopped before saving its declaration.
fn forget_queue(path: &Path, name: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut saved: serde_json::Value = serde_json::from_str(&text).unwrap();
    let queues = saved["queues"].as_array_mut().expect("a queue list");
    let before = queues.len();
    queues.retain(|q| q["name"] != name);
    assert!(queues.len() < before || !text.contains(name), "{text}");
    std::fs::write(path, serde_json::to_vec_pretty(&saved).unwrap()).unwrap();
}

/// Waits until `done` holds (the broker works on its own threads).
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_missing_from_the_topology_goes_to_its_queues_recorded_owner() {
    let (_dir, config, data) = setup("[performance]\nmax_deliveries = 1\n");
    let broker = start(&config);
    let mut admin = broker.connect("admin").await;
    // An admin's queue: no receiver's name, so only the topology knows
    // its owner.
    check(
        &mut admin,
        "declare_queue orders",
        "OK declare_queue orders",
    )
    .await;
    check(
        &mut admin,
        "declare_exchange shop",
        "OK declare_exchange shop",
    )
    .await;
    check(
        &mut admin,
        "bind orders shop orders",
        "OK bind orders shop orders",
    )
    .await;
    let mut s = broker.connect("sender_1").await;
    check(
        &mut s,
        &format!("publish shop orders {}", body("dl-1", "receiver_1")),
        "ACK dl-1",
    )
    .await;
    assert_eq!(ids(&fetch(&mut admin, "orders", 1).await), ["dl-1"]);
    // Its one delivery used up: it moves to orders.dlq, declared on the
    // shard at once and saved by the topology's own thread afterwards.
    check(&mut admin, "nack dl-1 orders", "NACK_CONFIRMED dl-1").await;
    let topology = data.join("topology.json");
    eventually("orders.dlq is saved in topology.json", || {
        std::fs::read_to_string(&topology).is_ok_and(|t| t.contains("\"orders.dlq\""))
    })
    .await;
    let dlq_dir = data.join("queues").join("orders.dlq");
    eventually("the dead letter is in orders.dlq's log", || {
        std::fs::read_dir(&dlq_dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("segment-")
                    && e.metadata().is_ok_and(|m| m.len() > 16)
            })
        })
    })
    .await;
    broker.kill();

    // What a crash before that save leaves: the directory, no entry.
    forget_queue(&topology, "orders.dlq");
    forget_queue(&data.join("topology.json.prev"), "orders.dlq");
    let broker = start(&config);
    let log = broker.log_text();
    assert!(
        log.contains("adopted") && log.contains("orders.dlq"),
        "warned: {log}"
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&topology).unwrap()).unwrap();
    let owners: Vec<(&str, &str)> = saved["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["name"].as_str().unwrap(), q["owner"].as_str().unwrap()))
        .collect();
    assert_eq!(owners, [("orders", "admin"), ("orders.dlq", "admin")]);
    // Its message is served again, as a first delivery.
    let mut admin = broker.connect("admin").await;
    let dead = fetch(&mut admin, "orders.dlq", 10).await;
    assert_eq!(
        dead.iter()
            .map(|g| (g.id.as_str(), g.count))
            .collect::<Vec<_>>(),
        [("dl-1", 1)]
    );
    check(&mut admin, "ack dl-1 orders.dlq", "ACK_CONFIRMED dl-1").await;
    broker.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_directory_no_receiver_owns_stops_the_start() {
    let (_dir, config, data) = setup("");
    start(&config).kill();
    let orphan = std::fs::canonicalize(&data)
        .unwrap()
        .join("queues")
        .join("nobody_queue");
    std::fs::create_dir(&orphan).unwrap();
    std::fs::write(orphan.join("segment-00000000000000000000.log"), b"").unwrap();
    let r = refused(&config);
    assert!(
        r.stderr.contains(&*orphan.to_string_lossy()) && r.stderr.contains("topology.json"),
        "names the directory and what is missing: {r:?}"
    );
    // Nothing was touched.
    assert!(orphan.join("segment-00000000000000000000.log").exists());
    // Once it is moved out of queues/, the broker starts.
    std::fs::rename(&orphan, data.join("nobody_queue.moved")).unwrap();
    start(&config).kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_aes_key_stops_the_start_naming_the_file() {
    let (_dir, config, data) = setup("");
    start(&config).kill();
    let aes = std::fs::canonicalize(data.join("aes.key")).unwrap();
    std::fs::write(&aes, "c2hvcnQ=\n").unwrap();
    let r = refused(&config);
    assert!(
        r.stderr.contains(&*aes.to_string_lossy()) && r.stderr.contains("encryption.aes_key"),
        "names the file and the setting: {r:?}"
    );
    assert_eq!(std::fs::read_to_string(&aes).unwrap(), "c2hvcnQ=\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_max_message_bytes_is_refused() {
    let limit = ciphermq_broker::config::MAX_MESSAGE_BYTES_LIMIT;
    let over = 64 * 1024 * 1024;
    assert!(over > limit);
    let (_dir, config, data) = setup(&format!("[performance]\nmax_message_bytes = {over}\n"));
    let r = refused(&config);
    assert!(
        r.stderr.contains("performance.max_message_bytes")
            && r.stderr.contains(&over.to_string())
            && r.stderr.contains(&limit.to_string()),
        "names the key, the value and the maximum: {r:?}"
    );
    assert!(!data.exists(), "refused before the data directory is made");
    // The maximum itself is accepted.
    let (_dir, config, _data) = setup(&format!("[performance]\nmax_message_bytes = {limit}\n"));
    start(&config).kill();
}
