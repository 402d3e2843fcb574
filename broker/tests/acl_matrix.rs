//! The ACL (docs/ARCHITECTURE.md, "Identity and access") over real mTLS
//! connections: each role's column of the permission matrix walked on one
//! broker, the "own resources" rules of receivers (prefixes, `.dlq`, longest CN
//! wins, routing keys), ACL-before-existence, the public-key commands, fanout
//! binds that need ownership of the exchange, and authenticated senders
//! (`sender_client_id`, `acl.require_sender_id`).
//!
//! Every cell is pinned down reply by reply, without sockets, by the
//! session tables in `broker/src/session/tests/`; this suite is the outside
//! contract: the same rules hold for a client that only sees the wire, and
//! a denial leaves no trace another connection could observe.
//!
//! Denials must read exactly `Access denied: <reason> (role=<role>)`; a refused
//! publish is `NACK <id> access_denied`.

mod common;

use base64::Engine;
use ciphermq_clients::connection::Connection;
use common::*;

/// A 32-byte X25519-sized key filled with `byte`, in standard padded base64.
fn key_b64(byte: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([byte; 32])
}

/// A broker with exchange `ex` (direct) and the three receivers' queues, each
/// bound with its owner's CN as key; returns it with an admin connection.
async fn world() -> (TestBroker, Connection) {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    for cn in ["receiver_1", "receiver_2", "receiver_1_2"] {
        check(
            &mut admin,
            &format!("declare_queue {cn}_queue"),
            &format!("OK declare_queue {cn}_queue"),
        )
        .await;
        check(
            &mut admin,
            &format!("bind {cn}_queue ex {cn}"),
            &format!("OK bind {cn}_queue ex {cn}"),
        )
        .await;
    }
    (broker, admin)
}

/// Publishes `id` to `receiver_1_queue` as admin and asserts the ACK.
async fn stock(admin: &mut Connection, id: &str) {
    check(
        admin,
        &format!("publish ex receiver_1 {}", body(id, "receiver_1")),
        &format!("ACK {id}"),
    )
    .await;
}

/// Sends a `publish_batch` of `ids` (bodies for `receiver`, key `receiver`)
/// on `ex` and asserts one reply per element, `{word} {id}{reason}`, in order.
async fn batch_expect(
    conn: &mut Connection,
    receiver: &str,
    ids: &[&str],
    word: &str,
    reason: &str,
) {
    let bodies: Vec<String> = ids.iter().map(|id| body(id, receiver)).collect();
    send(
        conn,
        &format!("publish_batch ex {receiver} [{}]", bodies.join(",")),
    )
    .await;
    for id in ids {
        assert_eq!(line(conn).await, format!("{word} {id}{reason}"));
    }
}

// ---------------------------------------------------------------------------
// The permission matrix, one column per role
// ---------------------------------------------------------------------------

/// A sender publishes and reads public keys; everything it is denied leaves
/// nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_column() {
    let (broker, mut admin) = world().await;
    let mut s = connect_as(&broker, "sender_1").await;

    check_denied(&mut s, "declare_queue orders", "sender").await;
    check_denied(&mut s, "declare_queue receiver_1_queue", "sender").await;
    check(
        &mut admin,
        "bind orders ex orders",
        "Error: unknown queue orders",
    )
    .await;

    check_denied(&mut s, "bind receiver_1_queue ex extra_key", "sender").await;
    publish_expect(&mut s, "ex", "extra_key", "m-0", "NACK m-0 no_route").await;

    check_denied(&mut s, "declare_exchange sx direct", "sender").await;
    for cmd in [
        "unbind receiver_1_queue ex receiver_1",
        "purge_queue receiver_1_queue",
        "delete_queue receiver_1_queue",
        "delete_exchange ex",
        "close_connection receiver_1",
    ] {
        check_denied(&mut s, cmd, "sender").await;
    }
    check_denied(&mut s, "declare_exchange sx", "sender").await;
    check(
        &mut admin,
        "bind receiver_1_queue sx receiver_1",
        "Error: unknown exchange sx",
    )
    .await;

    publish_expect(&mut s, "ex", "receiver_1", "m-1", "ACK m-1").await;
    batch_expect(&mut s, "receiver_1", &["b-1", "b-2"], "ACK", "").await;
    for cmd in [
        "consume receiver_1_queue",
        "consume receiver_1_queue 5",
        "fetch receiver_1_queue",
        "fetch receiver_1_queue 10",
        "nack m-1",
        "nack m-1 receiver_1_queue",
    ] {
        check_denied(&mut s, cmd, "sender").await;
    }
    // The denied fetches took nothing: all three are there, in order.
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 10).await),
        ["m-1", "b-1", "b-2"]
    );

    // Allowed: the answer is about deliveries, not permissions.
    check(&mut s, "ack m-1", "Error: no outstanding delivery m-1").await;
    check(
        &mut s,
        "ack m-1 receiver_1_queue",
        "Error: no outstanding delivery m-1",
    )
    .await;
    check(&mut s, "resend", "OK resend 0").await;
    check(&mut s, "heartbeat", "OK heartbeat").await;

    check_denied(
        &mut s,
        &format!("register_public_key {}", key_b64(1)),
        "sender",
    )
    .await;
    check(
        &mut admin,
        "get_public_key sender_1",
        "Error: no public key for sender_1",
    )
    .await;
    let mut r = connect_as(&broker, "receiver_1").await;
    check(
        &mut r,
        &format!("register_public_key {}", key_b64(9)),
        "Public key registered",
    )
    .await;
    check(
        &mut s,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {}", key_b64(9)),
    )
    .await;

    check(&mut s, "quit", "OK bye").await;
    assert_closed(&mut s).await;
}

/// A monitor (`acl.monitor_cns`) reads the admin endpoint; on the broker
/// port it may send heartbeats (and quit), and every other command is
/// refused, leaving nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_column() {
    let (broker, mut admin) = world().await;
    let mut m = connect_as(&broker, "monitor_1").await;
    assert_eq!(m.hello().role, "monitor");
    stock(&mut admin, "m-1").await;

    check(&mut m, "heartbeat", "OK heartbeat").await;
    for cmd in [
        "declare_queue monitor_1_queue",
        "declare_queue receiver_1_queue",
        "declare_exchange mx direct",
        "bind receiver_1_queue ex monitor_1",
        "unbind receiver_1_queue ex receiver_1",
        "purge_queue receiver_1_queue",
        "delete_queue receiver_1_queue",
        "delete_exchange ex",
        "close_connection receiver_1",
        "consume receiver_1_queue",
        "fetch receiver_1_queue 10",
        "ack m-1",
        "ack m-1 receiver_1_queue",
        "nack m-1 receiver_1_queue",
        "resend",
        "get_public_key receiver_1",
        &format!("register_public_key {}", key_b64(3)),
    ] {
        check_denied(&mut m, cmd, "monitor").await;
    }
    publish_expect(&mut m, "ex", "receiver_1", "m-2", "NACK m-2 access_denied").await;
    batch_expect(&mut m, "receiver_1", &["b-1"], "NACK", " access_denied").await;
    // Nothing was taken, stored or changed.
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 10).await),
        ["m-1"]
    );
    // The exchange and its binding are still there.
    publish_expect(&mut admin, "ex", "receiver_1", "m-3", "ACK m-3").await;
    check(
        &mut admin,
        "bind receiver_1_queue mx receiver_1",
        "Error: unknown exchange mx",
    )
    .await;
    check(
        &mut admin,
        "get_public_key monitor_1",
        "Error: no public key for monitor_1",
    )
    .await;

    check(&mut m, "quit", "OK bye").await;
    assert_closed(&mut m).await;
}

/// A receiver declares, binds, consumes and acknowledges on its own
/// resources and registers its own key; it never publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_column() {
    let broker = TestBroker::start(1);
    let mut r = connect_as(&broker, "receiver_1").await;
    let mut s = connect_as(&broker, "sender_1").await;

    for _ in 0..2 {
        // Idempotent.
        check(
            &mut r,
            "declare_queue receiver_1_queue",
            "OK declare_queue receiver_1_queue",
        )
        .await;
    }
    check(
        &mut r,
        "declare_exchange rx topic",
        "OK declare_exchange rx",
    )
    .await;
    check(&mut r, "declare_exchange ex", "OK declare_exchange ex").await;
    check(
        &mut r,
        "bind receiver_1_queue ex receiver_1",
        "OK bind receiver_1_queue ex receiver_1",
    )
    .await;

    // Its publishes are refused, even to an unknown exchange, and store nothing.
    check(
        &mut r,
        &format!("publish ex receiver_1 {}", body("r-1", "receiver_1")),
        "NACK r-1 access_denied",
    )
    .await;
    check(
        &mut r,
        &format!("publish nowhere receiver_1 {}", body("r-2", "receiver_1")),
        "NACK r-2 access_denied",
    )
    .await;
    batch_expect(
        &mut r,
        "receiver_1",
        &["rb-1", "rb-2"],
        "NACK",
        " access_denied",
    )
    .await;
    assert!(fetch(&mut r, "receiver_1_queue", 10).await.is_empty());

    // The binding routes; fetch, nack (both forms), ack (both forms), resend.
    publish_expect(&mut s, "ex", "receiver_1", "m-1", "ACK m-1").await;
    publish_expect(&mut s, "ex", "receiver_1", "m-2", "ACK m-2").await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 1).await), ["m-1"]);
    check(&mut r, "nack m-1", "NACK_CONFIRMED m-1").await;
    let again = fetch(&mut r, "receiver_1_queue", 1).await;
    assert_eq!((again[0].id.as_str(), again[0].count), ("m-1", 2));
    check(&mut r, "nack m-1 receiver_1_queue", "NACK_CONFIRMED m-1").await;
    assert_eq!(
        ids(&fetch(&mut r, "receiver_1_queue", 2).await),
        ["m-1", "m-2"]
    );
    check(&mut r, "ack m-1", "ACK_CONFIRMED m-1").await;
    check(&mut r, "resend", "OK resend 1").await;
    let again = fetch(&mut r, "receiver_1_queue", 1).await;
    assert_eq!((again[0].id.as_str(), again[0].count), ("m-2", 2));
    check(&mut r, "ack m-2 receiver_1_queue", "ACK_CONFIRMED m-2").await;

    // Push deliveries on a second connection of the same receiver.
    publish_expect(&mut s, "ex", "receiver_1", "m-3", "ACK m-3").await;
    let mut consumer = connect_as(&broker, "receiver_1").await;
    let mut pushed = Vec::new();
    check_skipping(
        &mut consumer,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
        &mut pushed,
    )
    .await;
    if pushed.is_empty() {
        pushed.push(next_delivery(&mut consumer).await);
    }
    assert_eq!(ids(&pushed), ["m-3"]);
    assert_eq!(pushed[0].queue, "receiver_1_queue");

    check(
        &mut r,
        &format!("register_public_key {}", key_b64(3)),
        "Public key registered",
    )
    .await;
    check_denied(&mut r, "get_public_key receiver_1", "receiver").await;
    check_denied(&mut r, "get_public_key receiver_2", "receiver").await;
    check(&mut r, "heartbeat", "OK heartbeat").await;
    check(&mut r, "quit", "OK bye").await;
    assert_closed(&mut r).await;
}

/// An admin may do everything, on every queue and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_column() {
    let (broker, mut a) = world().await;

    check(&mut a, "declare_queue orders", "OK declare_queue orders").await;
    check(
        &mut a,
        "declare_queue receiver_2_queue",
        "OK declare_queue receiver_2_queue",
    )
    .await;
    check(
        &mut a,
        "declare_exchange ax fanout",
        "OK declare_exchange ax",
    )
    .await;
    check(
        &mut a,
        "bind orders ex anything",
        "OK bind orders ex anything",
    )
    .await;
    check(
        &mut a,
        "declare_exchange tx topic",
        "OK declare_exchange tx",
    )
    .await;
    check(&mut a, "bind orders tx #", "OK bind orders tx #").await;
    check(
        &mut a,
        "bind receiver_2_queue tx #",
        "OK bind receiver_2_queue tx #",
    )
    .await;

    stock(&mut a, "m-1").await;
    batch_expect(&mut a, "receiver_2", &["b-1", "b-2"], "ACK", "").await;
    check(
        &mut a,
        &format!("publish ex receiver_1_2 {}", body("m-3", "receiver_1_2")),
        "ACK m-3",
    )
    .await;

    assert_eq!(ids(&fetch(&mut a, "receiver_1_queue", 1).await), ["m-1"]);
    check(&mut a, "nack m-1 receiver_1_queue", "NACK_CONFIRMED m-1").await;
    let again = fetch(&mut a, "receiver_1_queue", 1).await;
    assert_eq!((again[0].id.as_str(), again[0].count), ("m-1", 2));
    check(&mut a, "nack m-1", "NACK_CONFIRMED m-1").await;
    assert_eq!(ids(&fetch(&mut a, "receiver_1_queue", 1).await), ["m-1"]);
    check(&mut a, "ack m-1", "ACK_CONFIRMED m-1").await;
    check(&mut a, "resend", "OK resend 0").await;
    assert_eq!(ids(&fetch(&mut a, "receiver_1_2_queue", 10).await), ["m-3"]);

    let mut consumer = connect_as(&broker, "admin").await;
    let mut pushed = Vec::new();
    check_skipping(
        &mut consumer,
        "consume receiver_2_queue",
        "OK consume receiver_2_queue",
        &mut pushed,
    )
    .await;
    while pushed.len() < 2 {
        pushed.push(next_delivery(&mut consumer).await);
    }
    assert_eq!(ids(&pushed), ["b-1", "b-2"]);

    let mut r = connect_as(&broker, "receiver_2").await;
    check(
        &mut r,
        &format!("register_public_key {}", key_b64(6)),
        "Public key registered",
    )
    .await;
    check(
        &mut a,
        "get_public_key receiver_2",
        &format!("PUBLIC_KEY receiver_2 {}", key_b64(6)),
    )
    .await;
    check(
        &mut a,
        &format!("register_public_key {}", key_b64(5)),
        "Public key registered",
    )
    .await;
    check(
        &mut a,
        "get_public_key admin",
        &format!("PUBLIC_KEY admin {}", key_b64(5)),
    )
    .await;
    check(&mut a, "heartbeat", "OK heartbeat").await;
    check(&mut a, "quit", "OK bye").await;
    assert_closed(&mut a).await;
}

// ---------------------------------------------------------------------------
// A receiver's own resources
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_owns_queues_with_its_cn_prefix_and_their_dlq() {
    let broker = TestBroker::start(1);
    let mut r = connect_as(&broker, "receiver_1").await;
    for q in [
        "receiver_1_queue",
        "receiver_1_anything",
        "receiver_1_queue.dlq",
    ] {
        check(
            &mut r,
            &format!("declare_queue {q}"),
            &format!("OK declare_queue {q}"),
        )
        .await;
        let mut pushed = Vec::new();
        check_skipping(
            &mut r,
            &format!("consume {q}"),
            &format!("OK consume {q}"),
            &mut pushed,
        )
        .await;
        assert!(pushed.is_empty());
        assert!(fetch(&mut r, q, 1).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_does_not_own_names_without_the_cn_underscore_prefix() {
    let (broker, mut admin) = world().await;
    check(
        &mut admin,
        "declare_queue receiver_1queue",
        "OK declare_queue receiver_1queue",
    )
    .await;
    check(
        &mut admin,
        "declare_queue orders",
        "OK declare_queue orders",
    )
    .await;
    let mut r = connect_as(&broker, "receiver_1").await;
    for q in [
        "receiver_1queue",
        "orders",
        "receiver_1",
        "queue_receiver_1",
    ] {
        check_denied(&mut r, &format!("declare_queue {q}"), "receiver").await;
        check_denied(&mut r, &format!("consume {q}"), "receiver").await;
        check_denied(&mut r, &format!("fetch {q}"), "receiver").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_may_not_touch_another_receivers_queue() {
    let (broker, mut admin) = world().await;
    check(
        &mut admin,
        &format!("publish ex receiver_2 {}", body("m-2", "receiver_2")),
        "ACK m-2",
    )
    .await;
    let mut r = connect_as(&broker, "receiver_1").await;
    check_denied(&mut r, "declare_queue receiver_2_queue", "receiver").await;
    check_denied(&mut r, "consume receiver_2_queue", "receiver").await;
    check_denied(&mut r, "consume receiver_2_queue 10", "receiver").await;
    check_denied(&mut r, "fetch receiver_2_queue 10", "receiver").await;
    check_denied(&mut r, "bind receiver_2_queue ex receiver_1", "receiver").await;
    check_denied(&mut r, "nack m-2 receiver_2_queue", "receiver").await;
    // Nothing was delivered to the intruder, the owner still gets it.
    assert_silent(
        &mut r,
        std::time::Duration::from_millis(200),
        "denied consume delivers nothing",
    )
    .await;
    let mut owner = connect_as(&broker, "receiver_2").await;
    let got = fetch(&mut owner, "receiver_2_queue", 10).await;
    assert_eq!((ids(&got), got[0].count), (vec!["m-2".to_owned()], 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_receiver_cn_owns_the_queue() {
    let (broker, mut admin) = world().await;
    check(
        &mut admin,
        &format!("publish ex receiver_1_2 {}", body("m-12", "receiver_1_2")),
        "ACK m-12",
    )
    .await;
    let mut r1 = connect_as(&broker, "receiver_1").await;
    check_denied(&mut r1, "declare_queue receiver_1_2_queue", "receiver").await;
    check_denied(&mut r1, "consume receiver_1_2_queue", "receiver").await;
    check_denied(&mut r1, "fetch receiver_1_2_queue", "receiver").await;
    check_denied(
        &mut r1,
        "bind receiver_1_2_queue ex receiver_1_2",
        "receiver",
    )
    .await;
    check_denied(&mut r1, "declare_queue receiver_1_2_other", "receiver").await;
    let mut r12 = connect_as(&broker, "receiver_1_2").await;
    check(
        &mut r12,
        "declare_queue receiver_1_2_queue",
        "OK declare_queue receiver_1_2_queue",
    )
    .await;
    check(
        &mut r12,
        "declare_queue receiver_1_2_other",
        "OK declare_queue receiver_1_2_other",
    )
    .await;
    check(
        &mut r12,
        "bind receiver_1_2_other ex receiver_1_2",
        "OK bind receiver_1_2_other ex receiver_1_2",
    )
    .await;
    let mut pushed = Vec::new();
    check_skipping(
        &mut r12,
        "consume receiver_1_2_queue",
        "OK consume receiver_1_2_queue",
        &mut pushed,
    )
    .await;
    if pushed.is_empty() {
        pushed.push(next_delivery(&mut r12).await);
    }
    assert_eq!(ids(&pushed), ["m-12"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_binds_only_keys_it_owns() {
    let (broker, mut admin) = world().await;
    check(
        &mut admin,
        "declare_exchange tx topic",
        "OK declare_exchange tx",
    )
    .await;
    let mut r = connect_as(&broker, "receiver_1").await;
    for key in [
        "receiver_1",
        "receiver_1.x",
        "receiver_1_x",
        "receiver_1.#",
        "receiver_1.*",
    ] {
        check(
            &mut r,
            &format!("bind receiver_1_queue tx {key}"),
            &format!("OK bind receiver_1_queue tx {key}"),
        )
        .await;
    }
    for key in [
        "receiver_1x",
        "#",
        "*",
        "receiver_2",
        "receiver_2.x",
        "receiver_1_2",
        "receiver_1_2.x",
        "x.receiver_1",
    ] {
        check_denied(
            &mut r,
            &format!("bind receiver_1_queue tx {key}"),
            "receiver",
        )
        .await;
    }
    // Own key, foreign queue: still denied.
    check_denied(&mut r, "bind receiver_2_queue tx receiver_1", "receiver").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_is_checked_before_existence() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(&mut admin, "declare_exchange ex", "OK declare_exchange ex").await;
    let mut r = connect_as(&broker, "receiver_1").await;
    // Foreign and absent: denied, not "unknown queue".
    check_denied(&mut r, "consume receiver_2_queue", "receiver").await;
    check_denied(&mut r, "fetch receiver_2_queue", "receiver").await;
    check_denied(&mut r, "bind receiver_2_queue ex receiver_1", "receiver").await;
    check_denied(
        &mut r,
        "bind receiver_2_queue nowhere receiver_1",
        "receiver",
    )
    .await;
    check_denied(&mut r, "consume receiver_1_2_queue", "receiver").await;
    // Own and absent: the existence error.
    check(
        &mut r,
        "consume receiver_1_nope",
        "Error: unknown queue receiver_1_nope",
    )
    .await;
    check(
        &mut r,
        "fetch receiver_1_nope",
        "Error: unknown queue receiver_1_nope",
    )
    .await;
    check(
        &mut r,
        "bind receiver_1_nope ex receiver_1",
        "Error: unknown queue receiver_1_nope",
    )
    .await;
}

// ---------------------------------------------------------------------------
// Public keys
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_key_round_trip_and_rotation() {
    let broker = TestBroker::start(1);
    let mut r = connect_as(&broker, "receiver_1").await;
    let mut s = connect_as(&broker, "sender_1").await;
    check(
        &mut s,
        "get_public_key receiver_1",
        "Error: no public key for receiver_1",
    )
    .await;
    check(
        &mut r,
        &format!("register_public_key {}", key_b64(0xfb)),
        "Public key registered",
    )
    .await;
    check(
        &mut s,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {}", key_b64(0xfb)),
    )
    .await;
    // Registration is for the caller's own CN only.
    check(
        &mut s,
        "get_public_key receiver_2",
        "Error: no public key for receiver_2",
    )
    .await;
    // A new key replaces the old one.
    check(
        &mut r,
        &format!("register_public_key {}", key_b64(0x11)),
        "Public key registered",
    )
    .await;
    check(
        &mut s,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {}", key_b64(0x11)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_public_key_of_unknown_client_is_an_error() {
    let broker = TestBroker::start(1);
    let mut s = connect_as(&broker, "sender_1").await;
    check(
        &mut s,
        "get_public_key nobody",
        "Error: no public key for nobody",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_public_keys_are_errors_and_keep_the_old_key() {
    let broker = TestBroker::start(1);
    let mut r = connect_as(&broker, "receiver_1").await;
    check(
        &mut r,
        &format!("register_public_key {}", key_b64(0xfb)),
        "Public key registered",
    )
    .await;
    let std = base64::engine::general_purpose::STANDARD;
    let bad = [
        "not-base64!!".to_owned(),
        std.encode([1u8; 31]),
        std.encode([1u8; 33]),
        std.encode([1u8; 64]),
        // Unpadded and URL-safe encodings of 32 bytes: not standard padded base64.
        base64::engine::general_purpose::STANDARD_NO_PAD.encode([1u8; 32]),
        base64::engine::general_purpose::URL_SAFE.encode([0xfb; 32]),
    ];
    for key in &bad {
        check_error(&mut r, &format!("register_public_key {key}")).await;
    }
    let mut s = connect_as(&broker, "sender_1").await;
    check(
        &mut s,
        "get_public_key receiver_1",
        &format!("PUBLIC_KEY receiver_1 {}", key_b64(0xfb)),
    )
    .await;
}

// ---------------------------------------------------------------------------
// Exchange ownership (more in exchange_ownership.rs)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_may_bind_a_fanout_exchange_only_if_it_owns_it() {
    let (broker, mut admin) = world().await;
    check(
        &mut admin,
        "declare_exchange af fanout",
        "OK declare_exchange af",
    )
    .await;
    let mut r1 = connect_as(&broker, "receiver_1").await;
    let mut r2 = connect_as(&broker, "receiver_2").await;
    check(
        &mut r1,
        "declare_exchange rf fanout",
        "OK declare_exchange rf",
    )
    .await;
    check(
        &mut r1,
        "bind receiver_1_queue rf receiver_1",
        "OK bind receiver_1_queue rf receiver_1",
    )
    .await;
    let denied =
        "Access denied: receivers may only bind queues to fanout exchanges they own (role=receiver)";
    // Another receiver's fanout exchange, and an admin's: own queue and own
    // key are not enough.
    check(&mut r2, "bind receiver_2_queue rf receiver_2", denied).await;
    check(&mut r1, "bind receiver_1_queue af receiver_1", denied).await;
    // The admin column: any queue, any fanout exchange.
    check(
        &mut admin,
        "bind receiver_2_queue af anything",
        "OK bind receiver_2_queue af anything",
    )
    .await;
    check(
        &mut admin,
        "bind receiver_1_2_queue rf anything",
        "OK bind receiver_1_2_queue rf anything",
    )
    .await;
    // The refused bind routes nothing to receiver_2: not even an envelope
    // sealed for receiver_2, which its queue would take.
    let mut s = connect_as(&broker, "sender_1").await;
    publish_expect(&mut s, "rf", "receiver_1", "f-1", "ACK f-1").await;
    publish_for(
        &mut s,
        "rf",
        "receiver_1",
        "receiver_2",
        "f-2",
        "NACK f-2 no_route",
    )
    .await;
    assert_eq!(ids(&fetch(&mut r1, "receiver_1_queue", 10).await), ["f-1"]);
    assert!(fetch(&mut r2, "receiver_2_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_may_not_declare_an_exchange_named_for_another_receiver() {
    let broker = TestBroker::start(1);
    let mut r = connect_as(&broker, "receiver_1").await;
    for name in [
        "receiver_2",
        "receiver_2_fan",
        "receiver_2.x",
        "receiver_1_2_fan",
    ] {
        check(
            &mut r,
            &format!("declare_exchange {name} fanout"),
            "Access denied: receivers may not declare exchanges named for another receiver (role=receiver)",
        )
        .await;
    }
    // Its own names and shared ones are fine; an admin may use any.
    check(
        &mut r,
        "declare_exchange receiver_1_fan fanout",
        "OK declare_exchange receiver_1_fan",
    )
    .await;
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange receiver_2_fan fanout",
        "OK declare_exchange receiver_2_fan",
    )
    .await;
}

// ---------------------------------------------------------------------------
// Authenticated senders
// ---------------------------------------------------------------------------

/// `body(id, receiver)` naming its sender (`sender_client_id`).
fn signed_body(id: &str, receiver: &str, sender: &str) -> String {
    let plain = body(id, receiver);
    let open = plain.strip_suffix('}').expect("a JSON object");
    format!(r#"{open},"sender_client_id":"{sender}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_sender_client_id_is_nacked_access_denied_and_stores_nothing() {
    let (broker, mut admin) = world().await;
    let mut s = connect_as(&broker, "sender_1").await;
    // sender_1 posing as sender_2, alone and in a batch.
    let forged = signed_body("f-1", "receiver_1", "sender_2");
    check(
        &mut s,
        &format!("publish ex receiver_1 {forged}"),
        "NACK f-1 access_denied",
    )
    .await;
    let batch = format!(
        "[{},{}]",
        signed_body("fb-1", "receiver_1", "sender_2"),
        signed_body("fb-2", "receiver_1", "sender_1")
    );
    send(&mut s, &format!("publish_batch ex receiver_1 {batch}")).await;
    assert_eq!(line(&mut s).await, "NACK fb-1 access_denied");
    assert_eq!(line(&mut s).await, "ACK fb-2");
    // Its own name is accepted, and relayed byte for byte.
    let own = signed_body("o-1", "receiver_1", "sender_1");
    check(&mut s, &format!("publish ex receiver_1 {own}"), "ACK o-1").await;
    // An admin that names a sender must name itself too.
    check(
        &mut admin,
        &format!(
            "publish ex receiver_1 {}",
            signed_body("a-1", "receiver_1", "sender_1")
        ),
        "NACK a-1 access_denied",
    )
    .await;
    check(
        &mut admin,
        &format!(
            "publish ex receiver_1 {}",
            signed_body("a-2", "receiver_1", "admin")
        ),
        "ACK a-2",
    )
    .await;
    // Not a string: invalid.
    let odd = body("n-1", "receiver_1").replace(r#""nonce""#, r#""sender_client_id":7,"nonce""#);
    check(
        &mut s,
        &format!("publish ex receiver_1 {odd}"),
        "NACK n-1 invalid",
    )
    .await;
    let got = fetch(&mut admin, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["fb-2", "o-1", "a-2"]);
    assert_eq!(got[1].body, own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_sender_id_a_publish_without_one_is_nacked_invalid() {
    let broker = TestBroker::start_with(1, "require_sender_id = true");
    let mut admin = connect_as(&broker, "admin").await;
    setup_receiver(&mut admin, "receiver_1").await;
    let mut s = connect_as(&broker, "sender_1").await;
    check(
        &mut s,
        &format!("publish ex receiver_1 {}", body("m-1", "receiver_1")),
        "NACK m-1 invalid",
    )
    .await;
    let batch = format!(
        "[{},{}]",
        body("mb-1", "receiver_1"),
        signed_body("mb-2", "receiver_1", "sender_1")
    );
    send(&mut s, &format!("publish_batch ex receiver_1 {batch}")).await;
    assert_eq!(line(&mut s).await, "NACK mb-1 invalid");
    assert_eq!(line(&mut s).await, "ACK mb-2");
    // A forged one is still a permission matter.
    check(
        &mut s,
        &format!(
            "publish ex receiver_1 {}",
            signed_body("m-2", "receiver_1", "sender_2")
        ),
        "NACK m-2 access_denied",
    )
    .await;
    // `null` names nobody.
    let null =
        body("m-3", "receiver_1").replace(r#""nonce""#, r#""sender_client_id":null,"nonce""#);
    check(
        &mut s,
        &format!("publish ex receiver_1 {null}"),
        "NACK m-3 invalid",
    )
    .await;
    check(
        &mut s,
        &format!(
            "publish ex receiver_1 {}",
            signed_body("m-4", "receiver_1", "sender_1")
        ),
        "ACK m-4",
    )
    .await;
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 10).await),
        ["mb-2", "m-4"]
    );
}
