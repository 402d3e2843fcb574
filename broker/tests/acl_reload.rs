//! SIGHUP semantics: a reloaded `[acl]` applies atomically to running
//! connections; a CN that lost its role is disconnected, and new connections
//! follow the new lists. Bindings follow it too: those the new ACL does not
//! allow (their receiver lost its role, or a pattern now matches a longer
//! CN's keys) are removed and the removal saved; so are those a start under
//! a changed config finds. Confinement follows it as well: a queue whose
//! receiver lost its role takes what its bindings route, and stores only
//! that receiver's envelopes again once it is a receiver again.

mod common;

use std::time::Duration;

use ciphermq_broker::Config;
use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use common::{config_text, expect, pki};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cn_that_loses_its_role_is_disconnected_and_refused() {
    let data = tempfile::tempdir().unwrap();
    let text = config_text(&pki().certs, data.path(), 2, "");
    let config = Config::from_toml_str(&text, data.path()).unwrap();
    let broker = ciphermq_broker::start(&config).unwrap();
    let addr = broker.local_addr().to_string();
    let opts = |cn: &str| TlsClientOptions::for_cn(&pki().certs, cn);

    let mut kept = Connection::connect(&addr, &opts("receiver_1"))
        .await
        .unwrap();
    let mut dropped = Connection::connect(&addr, &opts("receiver_2"))
        .await
        .unwrap();
    expect(&mut dropped, "heartbeat", "OK heartbeat").await;

    let reloaded = text.replace(
        r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]"#,
        r#"receiver_cns = ["receiver_1", "receiver_1_2"]"#,
    );
    assert_ne!(reloaded, text, "the test must really change the ACL");
    let new_config = Config::from_toml_str(&reloaded, data.path()).unwrap();
    broker.reloader()(&new_config).expect("reload");

    // The idle connection of the removed CN is closed without sending anything.
    let end = tokio::time::timeout(Duration::from_secs(5), dropped.read_line()).await;
    match end.expect("closed promptly") {
        Ok(None) | Err(_) => {}
        Ok(Some(line)) => panic!("expected the connection to close, got {line:?}"),
    }
    // The other receiver keeps working.
    expect(&mut kept, "heartbeat", "OK heartbeat").await;
    // And the removed CN is now an unknown client.
    match Connection::connect(&addr, &opts("receiver_2")).await {
        Err(ClientError::Refused(line)) => {
            assert_eq!(line, "Access denied: unknown client (role=unknown)")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    broker.shutdown();
}

/// The test config over `data`, durable, with `receiver_cns` as given.
fn durable_config(data: &std::path::Path, receivers: &str) -> Config {
    let text = config_text(&pki().certs, data, 2, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace(
            r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]"#,
            &format!("receiver_cns = {receivers}"),
        );
    assert!(text.contains(receivers) && text.contains(r#"mode = "durable""#));
    Config::from_toml_str(&text, data).unwrap()
}

/// The receivers envelopes are sealed for: a receiver's queue stores only
/// its own.
const R1: &str = "receiver_1";
const R2: &str = "receiver_2";

const ALL: &str = r#"["receiver_1", "receiver_2", "receiver_1_2"]"#;
const WITHOUT_2: &str = r#"["receiver_1", "receiver_1_2"]"#;

async fn connect(addr: &str, cn: &str) -> Connection {
    Connection::connect(addr, &TlsClientOptions::for_cn(&pki().certs, cn))
        .await
        .unwrap()
}

/// Publishes `id`, sealed for `receiver`, to `exchange` with `key` as
/// `conn`, asserting the reply.
async fn publish(
    conn: &mut Connection,
    exchange: &str,
    key: &str,
    receiver: &str,
    id: &str,
    reply: &str,
) {
    let line = format!("publish {exchange} {key} {}", common::body(id, receiver));
    expect(conn, &line, reply).await;
}

/// Waits until `topology.json` in `data` satisfies `done`.
async fn saved_topology(data: &std::path::Path, what: &str, done: impl Fn(&str) -> bool) {
    let path = data.join("topology.json");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if done(&text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "topology.json never {what}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_receivers_role_drops_its_bindings_and_saves_that() {
    let data = tempfile::tempdir().unwrap();
    let broker = ciphermq_broker::start(&durable_config(data.path(), ALL)).unwrap();
    let addr = broker.local_addr().to_string();
    let mut admin = connect(&addr, "admin").await;
    expect(
        &mut admin,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    let mut r2 = connect(&addr, "receiver_2").await;
    let mut r1 = connect(&addr, "receiver_1").await;
    common::setup_receiver(&mut r1, "receiver_1").await;
    common::setup_receiver(&mut r2, "receiver_2").await;
    expect(
        &mut r2,
        "declare_exchange receiver_2_fan fanout",
        "OK declare_exchange receiver_2_fan",
    )
    .await;
    expect(
        &mut r2,
        "bind receiver_2_queue receiver_2_fan receiver_2",
        "OK bind receiver_2_queue receiver_2_fan receiver_2",
    )
    .await;
    // An admin's binding of the same queue is the admin's decision.
    expect(
        &mut admin,
        "bind receiver_2_queue ex ops",
        "OK bind receiver_2_queue ex ops",
    )
    .await;
    publish(&mut admin, "ex", "receiver_2", R2, "before", "ACK before").await;

    let reloaded = durable_config(data.path(), WITHOUT_2);
    broker.reloader()(&reloaded).expect("reload");

    // receiver_2's own bindings are gone: nothing routes through them.
    publish(
        &mut admin,
        "ex",
        "receiver_2",
        R2,
        "d-1",
        "NACK d-1 no_route",
    )
    .await;
    publish(
        &mut admin,
        "receiver_2_fan",
        "k",
        R2,
        "f-1",
        "NACK f-1 no_route",
    )
    .await;
    // The admin's binding and receiver_1's stay.
    publish(&mut admin, "ex", "ops", R2, "o-1", "ACK o-1").await;
    publish(&mut admin, "ex", "receiver_1", R1, "r-1", "ACK r-1").await;
    // receiver_2_queue is no receiver's now: it takes what its binding
    // routes, receiver_1's envelope too.
    publish(&mut admin, "ex", "ops", R1, "o-r1", "ACK o-r1").await;
    // The removal is saved, not only applied.
    saved_topology(data.path(), "lost receiver_2's bindings", |t| {
        t.contains(r#""key": "ops""#) && !t.contains(r#""key": "receiver_2""#)
    })
    .await;
    broker.shutdown();

    // Back with receiver_2 in the ACL, the bindings do not come back.
    let broker = ciphermq_broker::start(&durable_config(data.path(), ALL)).unwrap();
    let addr = broker.local_addr().to_string();
    let mut admin = connect(&addr, "admin").await;
    publish(
        &mut admin,
        "ex",
        "receiver_2",
        R2,
        "d-2",
        "NACK d-2 no_route",
    )
    .await;
    publish(&mut admin, "ex", "ops", R2, "o-2", "ACK o-2").await;
    // receiver_2's again: its queue takes only receiver_2's envelopes.
    publish(
        &mut admin,
        "ex",
        "ops",
        R1,
        "o-r1-2",
        "NACK o-r1-2 no_route",
    )
    .await;
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_a_longer_cn_drops_patterns_matching_its_keys() {
    let data = tempfile::tempdir().unwrap();
    let text = config_text(&pki().certs, data.path(), 1, "");
    let config = Config::from_toml_str(&text, data.path()).unwrap();
    let broker = ciphermq_broker::start(&config).unwrap();
    let addr = broker.local_addr().to_string();
    let mut r1 = connect(&addr, "receiver_1").await;
    expect(&mut r1, "declare_exchange t topic", "OK declare_exchange t").await;
    expect(
        &mut r1,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    for pattern in ["receiver_1.#", "receiver_1.orders.#"] {
        expect(
            &mut r1,
            &format!("bind receiver_1_queue t {pattern}"),
            &format!("OK bind receiver_1_queue t {pattern}"),
        )
        .await;
    }
    let reloaded = text.replace(
        r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]"#,
        r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2", "receiver_1.eu"]"#,
    );
    assert_ne!(reloaded, text);
    broker.reloader()(&Config::from_toml_str(&reloaded, data.path()).unwrap()).expect("reload");

    // `receiver_1.#` now matches receiver_1.eu's keys: removed. The narrower
    // pattern stays.
    let mut admin = connect(&addr, "admin").await;
    // receiver_1's envelopes: only the removed binding could have taken them.
    publish(
        &mut admin,
        "t",
        "receiver_1.eu.x",
        R1,
        "eu-1",
        "NACK eu-1 no_route",
    )
    .await;
    publish(
        &mut admin,
        "t",
        "receiver_1.misc",
        R1,
        "m-1",
        "NACK m-1 no_route",
    )
    .await;
    publish(
        &mut admin,
        "t",
        "receiver_1.orders.new",
        R1,
        "o-1",
        "ACK o-1",
    )
    .await;
    // And it cannot be bound again.
    expect(
        &mut r1,
        "bind receiver_1_queue t receiver_1.#",
        "Access denied: receivers may only bind patterns that match only routing keys they own (role=receiver)",
    )
    .await;
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_under_a_new_acl_drops_the_bindings_it_no_longer_allows() {
    let data = tempfile::tempdir().unwrap();
    let broker = ciphermq_broker::start(&durable_config(data.path(), ALL)).unwrap();
    let addr = broker.local_addr().to_string();
    let mut r2 = connect(&addr, "receiver_2").await;
    common::setup_receiver(&mut r2, "receiver_2").await;
    drop(r2);
    broker.shutdown();

    // The config changed while the broker was down.
    let broker = ciphermq_broker::start(&durable_config(data.path(), WITHOUT_2)).unwrap();
    let addr = broker.local_addr().to_string();
    let mut admin = connect(&addr, "admin").await;
    publish(
        &mut admin,
        "ex",
        "receiver_2",
        R2,
        "d-1",
        "NACK d-1 no_route",
    )
    .await;
    saved_topology(data.path(), "lost receiver_2's binding", |t| {
        t.contains("receiver_2_queue") && !t.contains(r#""key": "receiver_2""#)
    })
    .await;
    broker.shutdown();
}
