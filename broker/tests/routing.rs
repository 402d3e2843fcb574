//! docs/PROTOCOL.md and docs/ARCHITECTURE.md "Delivery guarantees": exchanges
//! route by type (direct = exact key, fanout = every bound queue, topic =
//! `*`/`#` patterns, one copy per queue however many of its bindings match),
//! with 1 and 2 shards; exchange declaration rules; bind and publish errors;
//! and fan-out copies that are settled independently.
//!
//! Queues carry receivers' names so that, with 2 shards, they live on different
//! shards (receiver_1 and receiver_2/receiver_1_2 hash apart) and a publish
//! crosses shards.

mod common;

use ciphermq_clients::connection::Connection;
use common::*;

/// Declares queue `q` and binds it to `ex` with each key.
async fn queue_bound(admin: &mut Connection, q: &str, ex: &str, keys: &[&str]) {
    check(
        admin,
        &format!("declare_queue {q}"),
        &format!("OK declare_queue {q}"),
    )
    .await;
    for key in keys {
        check(
            admin,
            &format!("bind {q} {ex} {key}"),
            &format!("OK bind {q} {ex} {key}"),
        )
        .await;
    }
}

/// What each queue holds now (ids in order), fetched and then acked.
async fn drain(admin: &mut Connection, q: &str) -> Vec<String> {
    let got = fetch(admin, q, 1000).await;
    for g in &got {
        assert_eq!(g.queue, q);
        assert_eq!(g.count, 1, "{g:?}");
        check(
            admin,
            &format!("ack {} {q}", g.id),
            &format!("ACK_CONFIRMED {}", g.id),
        )
        .await;
    }
    ids(&got)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

// ---------------------------------------------------------------------------
// direct
// ---------------------------------------------------------------------------

async fn direct(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange d direct",
        "OK declare_exchange d",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "d", &["receiver_1", "both"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "d", &["receiver_2", "both"]).await;
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_2")).await;
    publish_expect(&mut s, "d", "receiver_1", "d-1", "ACK d-1").await;
    publish_expect(&mut s, "d", "receiver_2", "d-2", "ACK d-2").await;
    publish_expect(&mut s, "d", "both", "d-3", "ACK d-3").await;
    // Exact key only: no prefix, suffix, case or wildcard matching.
    for (i, key) in [
        "receiver_1.x",
        "receiver_",
        "RECEIVER_1",
        "receiver_1_queue",
        "bot",
        "both.x",
    ]
    .iter()
    .enumerate()
    {
        publish_expect(
            &mut s,
            "d",
            key,
            &format!("x-{i}"),
            &format!("NACK x-{i} no_route"),
        )
        .await;
    }
    assert_eq!(
        drain(&mut admin, "receiver_1_queue").await,
        strings(&["d-1", "d-3"])
    );
    assert_eq!(
        drain(&mut admin, "receiver_2_queue").await,
        strings(&["d-2", "d-3"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_exchange_routes_exact_key_only_one_shard() {
    direct(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_exchange_routes_exact_key_only_two_shards() {
    direct(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_exchange_type_is_direct() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange plain",
        "OK declare_exchange plain",
    )
    .await;
    check(
        &mut admin,
        "declare_exchange plain direct",
        "OK declare_exchange plain",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "plain", &["a.*"]).await;
    // `*` is no wildcard on a direct exchange.
    publish_expect(&mut admin, "plain", "a.b", "p-1", "NACK p-1 no_route").await;
    publish_expect(&mut admin, "plain", "a.*", "p-2", "NACK p-2 invalid").await;
}

// ---------------------------------------------------------------------------
// fanout
// ---------------------------------------------------------------------------

async fn fanout(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "f", &["receiver_1"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["anything"]).await;
    queue_bound(&mut admin, "receiver_1_2_queue", "f", &["x", "y"]).await;
    check(
        &mut admin,
        "declare_queue receiver_2_unbound",
        "OK declare_queue receiver_2_unbound",
    )
    .await;
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_1")).await;
    publish_expect(&mut s, "f", "receiver_1", "f-1", "ACK f-1").await;
    publish_expect(&mut s, "f", "unrelated.key", "f-2", "ACK f-2").await;
    for q in ["receiver_1_queue", "receiver_2_queue", "receiver_1_2_queue"] {
        assert_eq!(drain(&mut admin, q).await, strings(&["f-1", "f-2"]), "{q}");
    }
    assert!(drain(&mut admin, "receiver_2_unbound").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchange_copies_to_every_bound_queue_ignoring_key_one_shard() {
    fanout(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchange_copies_to_every_bound_queue_ignoring_key_two_shards() {
    fanout(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchange_without_bindings_is_no_route() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    publish_expect(&mut admin, "f", "k", "f-1", "NACK f-1 no_route").await;
}

// ---------------------------------------------------------------------------
// topic
// ---------------------------------------------------------------------------

async fn topic(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange t topic",
        "OK declare_exchange t",
    )
    .await;
    // Queue names owned by different receivers, so 2 shards split them.
    let (qa, qb, qc, qd, qe, qf) = (
        "receiver_1_a",
        "receiver_2_b",
        "receiver_1_2_c",
        "receiver_1_d",
        "receiver_2_e",
        "receiver_1_2_f",
    );
    queue_bound(&mut admin, qa, "t", &["a.*"]).await;
    queue_bound(&mut admin, qb, "t", &["a.#"]).await;
    queue_bound(&mut admin, qc, "t", &["*.b.*"]).await;
    queue_bound(&mut admin, qd, "t", &["x.#.z"]).await;
    // Two patterns that both match `a.b.c`: one copy only.
    queue_bound(&mut admin, qe, "t", &["a.*.c", "#.c"]).await;
    queue_bound(&mut admin, qf, "t", &["#"]).await;
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_2")).await;
    // (id, routing key); the comment lists the matching queues.
    let publishes = [
        ("t-1", "a.b"),     // qa (a.*), qb (a.#), qf
        ("t-2", "a"),       // qb (# = zero words), qf
        ("t-3", "a.b.c"),   // qb, qc (*.b.*), qe (both patterns, once), qf
        ("t-4", "q.b.r"),   // qc, qf
        ("t-5", "x.z"),     // qd (# = zero words), qf
        ("t-6", "x.y.w.z"), // qd (# = two words), qf
        ("t-7", "c"),       // qe (#.c), qf
        ("t-8", "a.b.c.d"), // qb, qf   (a.* is one word only, *.b.* three words)
        ("t-9", "b.a"),     // qf
    ];
    for (id, key) in publishes {
        publish_expect(&mut s, "t", key, id, &format!("ACK {id}")).await;
    }
    assert_eq!(drain(&mut admin, qa).await, strings(&["t-1"]), "a.*");
    assert_eq!(
        drain(&mut admin, qb).await,
        strings(&["t-1", "t-2", "t-3", "t-8"]),
        "a.#"
    );
    assert_eq!(
        drain(&mut admin, qc).await,
        strings(&["t-3", "t-4"]),
        "*.b.*"
    );
    assert_eq!(
        drain(&mut admin, qd).await,
        strings(&["t-5", "t-6"]),
        "x.#.z"
    );
    assert_eq!(
        drain(&mut admin, qe).await,
        strings(&["t-3", "t-7"]),
        "a.*.c + #.c"
    );
    assert_eq!(
        drain(&mut admin, qf).await,
        strings(&["t-1", "t-2", "t-3", "t-4", "t-5", "t-6", "t-7", "t-8", "t-9"]),
        "#"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchange_matches_star_and_hash_once_per_queue_one_shard() {
    topic(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchange_matches_star_and_hash_once_per_queue_two_shards() {
    topic(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchange_without_a_match_is_no_route_and_stores_nothing() {
    let broker = TestBroker::start(2);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange t topic",
        "OK declare_exchange t",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "t", &["a.*"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "t", &["*.b"]).await;
    for (id, key) in [
        ("n-1", "a"),
        ("n-2", "a.c.d"),
        ("n-3", "c.b.d"),
        ("n-4", "b"),
    ] {
        publish_expect(&mut admin, "t", key, id, &format!("NACK {id} no_route")).await;
    }
    assert!(drain(&mut admin, "receiver_1_queue").await.is_empty());
    assert!(drain(&mut admin, "receiver_2_queue").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_twice_still_delivers_one_copy() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange d direct",
        "OK declare_exchange d",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "d", &["k", "k"]).await;
    publish_expect(&mut admin, "d", "k", "once", "ACK once").await;
    assert_eq!(
        drain(&mut admin, "receiver_1_queue").await,
        strings(&["once"])
    );
}

// ---------------------------------------------------------------------------
// declare_exchange, bind and publish errors
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_exchange_is_idempotent_for_the_same_type_only() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    for kind in ["direct", "fanout", "topic"] {
        let ex = format!("e_{kind}");
        check(
            &mut admin,
            &format!("declare_exchange {ex} {kind}"),
            &format!("OK declare_exchange {ex}"),
        )
        .await;
        check(
            &mut admin,
            &format!("declare_exchange {ex} {kind}"),
            &format!("OK declare_exchange {ex}"),
        )
        .await;
        for other in ["direct", "fanout", "topic"]
            .into_iter()
            .filter(|o| *o != kind)
        {
            check_error(&mut admin, &format!("declare_exchange {ex} {other}")).await;
        }
    }
    // A bare declare means direct.
    check_error(&mut admin, "declare_exchange e_topic").await;
    check(
        &mut admin,
        "declare_exchange e_direct",
        "OK declare_exchange e_direct",
    )
    .await;
    // The failed re-declaration left the type alone: `e_topic` still matches patterns.
    queue_bound(&mut admin, "receiver_1_queue", "e_topic", &["a.*"]).await;
    publish_expect(&mut admin, "e_topic", "a.b", "k-1", "ACK k-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_exchange_from_another_connection_sees_the_same_exchange() {
    let broker = TestBroker::start(2);
    let mut r1 = connect_as(&broker, "receiver_1").await;
    let mut r2 = connect_as(&broker, "receiver_2").await;
    check(
        &mut r1,
        "declare_exchange shared topic",
        "OK declare_exchange shared",
    )
    .await;
    check(
        &mut r2,
        "declare_exchange shared topic",
        "OK declare_exchange shared",
    )
    .await;
    check_error(&mut r2, "declare_exchange shared fanout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_to_unknown_queue_or_exchange_is_an_error() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(&mut admin, "declare_exchange ex", "OK declare_exchange ex").await;
    check(
        &mut admin,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    check(
        &mut admin,
        "bind receiver_1_nope ex k",
        "Error: unknown queue receiver_1_nope",
    )
    .await;
    check(
        &mut admin,
        "bind receiver_1_queue nope k",
        "Error: unknown exchange nope",
    )
    .await;
    // Neither failure created anything.
    publish_expect(&mut admin, "nope", "k", "u-1", "NACK u-1 no_route").await;
    publish_expect(&mut admin, "ex", "k", "u-2", "NACK u-2 no_route").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_unknown_exchange_is_no_route() {
    let broker = TestBroker::start(2);
    let mut s = connect_as(&broker, "sender_1").await;
    publish_expect(&mut s, "nowhere", "receiver_1", "m-1", "NACK m-1 no_route").await;
    let batch = format!(
        "[{},{}]",
        body("b-1", "receiver_1"),
        body("b-2", "receiver_1")
    );
    send(&mut s, &format!("publish_batch nowhere receiver_1 {batch}")).await;
    assert_eq!(line(&mut s).await, "NACK b-1 no_route");
    assert_eq!(line(&mut s).await, "NACK b-2 no_route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_is_relayed_byte_identical_with_extra_fields() {
    let broker = TestBroker::start(2);
    let mut admin = connect_as(&broker, "admin").await;
    check(&mut admin, "declare_exchange ex", "OK declare_exchange ex").await;
    queue_bound(&mut admin, "receiver_2_queue", "ex", &["receiver_2"]).await;
    let b = r#"{ "message_id" : "x-1",  "receiver_client_id":"receiver_2","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy", "extra": {"nested": [1, 2.50, "sp ace", "é\u00e9"]}, "z":null }"#;
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_2")).await;
    check(&mut s, &format!("publish ex receiver_2 {b}"), "ACK x-1").await;
    let got = fetch(&mut admin, "receiver_2_queue", 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].id.as_str(), got[0].queue.as_str(), got[0].count),
        ("x-1", "receiver_2_queue", 1)
    );
    assert_eq!(got[0].body, b);
}

// ---------------------------------------------------------------------------
// fan-out copies are independent (§4)
// ---------------------------------------------------------------------------

async fn fanout_ack_independence(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "f", &["k"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["k"]).await;
    let mut s = connect_as(&broker, "sender_1").await;
    publish_expect(&mut s, "f", "k", "fan-1", "ACK fan-1").await;

    let mut r1 = connect_as(&broker, "receiver_1").await;
    let mut pushed = Vec::new();
    check_skipping(
        &mut r1,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
        &mut pushed,
    )
    .await;
    if pushed.is_empty() {
        pushed.push(next_delivery(&mut r1).await);
    }
    assert_eq!(
        (pushed[0].id.as_str(), pushed[0].queue.as_str()),
        ("fan-1", "receiver_1_queue")
    );
    check(&mut r1, "ack fan-1", "ACK_CONFIRMED fan-1").await;
    // Gone from receiver_1_queue for good...
    drop(r1);
    let mut r1 = connect_as(&broker, "receiver_1").await;
    assert!(
        fetch(&mut r1, "receiver_1_queue", 10).await.is_empty(),
        "acked copy came back"
    );
    // ...while receiver_2's copy is untouched: first delivery.
    let mut r2 = connect_as(&broker, "receiver_2").await;
    let got = fetch(&mut r2, "receiver_2_queue", 10).await;
    assert_eq!(got.len(), 1, "receiver_2's copy: {got:?}");
    assert_eq!(
        (got[0].id.as_str(), got[0].queue.as_str(), got[0].count),
        ("fan-1", "receiver_2_queue", 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_in_one_queue_leaves_the_fanout_copy_in_another_one_shard() {
    fanout_ack_independence(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_in_one_queue_leaves_the_fanout_copy_in_another_two_shards() {
    fanout_ack_independence(2).await;
}

async fn ack_with_queue(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "f", &["k"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["k"]).await;
    publish_expect(&mut admin, "f", "k", "fan-1", "ACK fan-1").await;
    // One connection holds both copies.
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 1).await),
        ["fan-1"]
    );
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_2_queue", 1).await),
        ["fan-1"]
    );
    check(
        &mut admin,
        "ack fan-1 receiver_1_queue",
        "ACK_CONFIRMED fan-1",
    )
    .await;
    check(
        &mut admin,
        "ack fan-1 receiver_1_queue",
        "Error: no outstanding delivery fan-1",
    )
    .await;
    // Closing returns only receiver_2's copy, as a redelivery.
    drop(admin);
    let mut admin = connect_as(&broker, "admin").await;
    assert!(fetch(&mut admin, "receiver_1_queue", 10).await.is_empty());
    let got = fetch(&mut admin, "receiver_2_queue", 10).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].id.as_str(), got[0].count), ("fan-1", 2));
    check(
        &mut admin,
        "ack fan-1 receiver_2_queue",
        "ACK_CONFIRMED fan-1",
    )
    .await;
    check(
        &mut admin,
        "ack fan-1",
        "Error: no outstanding delivery fan-1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_naming_a_queue_settles_only_that_queues_copy_one_shard() {
    ack_with_queue(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_naming_a_queue_settles_only_that_queues_copy_two_shards() {
    ack_with_queue(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_without_queue_settles_every_copy_of_the_id() {
    let broker = TestBroker::start(2);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "f", &["k"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["k"]).await;
    publish_expect(&mut admin, "f", "k", "fan-1", "ACK fan-1").await;
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 1).await),
        ["fan-1"]
    );
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_2_queue", 1).await),
        ["fan-1"]
    );
    check(&mut admin, "ack fan-1", "ACK_CONFIRMED fan-1").await;
    check(
        &mut admin,
        "ack fan-1 receiver_2_queue",
        "Error: no outstanding delivery fan-1",
    )
    .await;
    drop(admin);
    let mut admin = connect_as(&broker, "admin").await;
    assert!(fetch(&mut admin, "receiver_1_queue", 10).await.is_empty());
    assert!(fetch(&mut admin, "receiver_2_queue", 10).await.is_empty());
}
