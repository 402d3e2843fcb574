//! docs/PROTOCOL.md and docs/ARCHITECTURE.md "Delivery guarantees": exchanges
//! route by type (direct = exact key, fanout = every bound queue, topic =
//! `*`/`#` patterns, one copy per queue however many of its bindings match),
//! with 1 and 2 shards; exchange declaration rules; bind and publish errors;
//! and fan-out copies that are settled independently.
//!
//! Routing is confined (docs/PROTOCOL.md, "Exchange ownership"): a queue a
//! receiver owns stores only envelopes sealed for that receiver, whatever
//! bindings lead there, and a message no lawful queue takes is `no_route`.
//! So one message is copied into queues of one receiver and into queues no
//! receiver owns (an admin's `audit`, placed by the admin's CN). With 2
//! shards, receiver_2's queues and the admin's live on different shards
//! (checked by [`spans_two_shards`]), so a publish crosses shards.

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

/// With 2+ shards, asserts that receiver_2's queues and the admin's queues
/// (placed by the admin's CN) live on different shards.
fn spans_two_shards(broker: &TestBroker) {
    if broker.shards > 1 {
        assert_ne!(
            broker.shard_of("receiver_2"),
            broker.shard_of("admin"),
            "receiver_2's queues and the admin's share a shard"
        );
    }
}

// ---------------------------------------------------------------------------
// direct
// ---------------------------------------------------------------------------

/// Direct routing by exact key: each receiver's key reaches its queue; a key
/// bound to several queues copies the message to each that may take it (the
/// receiver's queue and the admin's `audit`, on another shard with 2); an
/// envelope for receiver_1 under receiver_2's key is `no_route` and stores
/// nothing in receiver_2's queue.
async fn direct(shards: usize) {
    let broker = TestBroker::start(shards);
    spans_two_shards(&broker);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange d direct",
        "OK declare_exchange d",
    )
    .await;
    queue_bound(&mut admin, "receiver_1_queue", "d", &["receiver_1", "both"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "d", &["receiver_2", "both"]).await;
    queue_bound(&mut admin, "audit", "d", &["both"]).await;
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_2")).await;
    publish_for(&mut s, "d", "receiver_1", "receiver_1", "d-1", "ACK d-1").await;
    publish_for(&mut s, "d", "receiver_2", "receiver_2", "d-2", "ACK d-2").await;
    // One key, several queues: a copy in each queue that may hold it.
    publish_for(&mut s, "d", "both", "receiver_1", "d-3", "ACK d-3").await;
    publish_for(&mut s, "d", "both", "receiver_2", "d-4", "ACK d-4").await;
    // Confinement: receiver_2's key routes only to receiver_2's queue, which
    // takes no envelope for receiver_1.
    publish_for(
        &mut s,
        "d",
        "receiver_2",
        "receiver_1",
        "c-1",
        "NACK c-1 no_route",
    )
    .await;
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
        strings(&["d-2", "d-4"])
    );
    assert_eq!(drain(&mut admin, "audit").await, strings(&["d-3", "d-4"]));
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

/// A fanout exchange copies each message to every bound queue that may take
/// it, whatever the keys: two queues of receiver_2 and the admin's `audit`
/// (on another shard with 2) get receiver_2's messages; a message for
/// receiver_1 reaches `audit` only.
async fn fanout(shards: usize) {
    let broker = TestBroker::start(shards);
    spans_two_shards(&broker);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["receiver_2"]).await;
    queue_bound(&mut admin, "receiver_2_q2", "f", &["anything"]).await;
    queue_bound(&mut admin, "audit", "f", &["x", "y"]).await;
    check(
        &mut admin,
        "declare_queue receiver_2_unbound",
        "OK declare_queue receiver_2_unbound",
    )
    .await;
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_2")).await;
    publish_for(&mut s, "f", "receiver_2", "receiver_2", "f-1", "ACK f-1").await;
    publish_for(&mut s, "f", "unrelated.key", "receiver_2", "f-2", "ACK f-2").await;
    for q in ["receiver_2_queue", "receiver_2_q2", "audit"] {
        assert_eq!(drain(&mut admin, q).await, strings(&["f-1", "f-2"]), "{q}");
    }
    assert!(drain(&mut admin, "receiver_2_unbound").await.is_empty());
    // Confinement: receiver_2's queues take no copy of receiver_1's message.
    publish_for(&mut s, "f", "receiver_2", "receiver_1", "f-3", "ACK f-3").await;
    assert_eq!(drain(&mut admin, "audit").await, strings(&["f-3"]));
    for q in ["receiver_2_queue", "receiver_2_q2", "receiver_2_unbound"] {
        assert!(drain(&mut admin, q).await.is_empty(), "{q}");
    }
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

/// Topic patterns (`*` one word, `#` zero or more), one copy per queue
/// however many of its bindings match. The messages are receiver_2's; its
/// queues alternate with the admin's, so 2 shards split them. Then a
/// message for receiver_1 reaches only the admin's matching queues.
async fn topic(shards: usize) {
    let broker = TestBroker::start(shards);
    spans_two_shards(&broker);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange t topic",
        "OK declare_exchange t",
    )
    .await;
    // receiver_2's queues and the admin's, so 2 shards split them.
    let (qa, qb, qc, qd, qe, qf) = (
        "receiver_2_a",
        "audit_b",
        "receiver_2_c",
        "audit_d",
        "receiver_2_e",
        "audit_f",
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
        publish_for(&mut s, "t", key, "receiver_2", id, &format!("ACK {id}")).await;
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
    // Confinement: `a.b.c` matches qb, qc, qe and qf; receiver_1's message
    // goes to the admin's two only.
    publish_for(&mut s, "t", "a.b.c", "receiver_1", "c-1", "ACK c-1").await;
    for q in [qb, qf] {
        assert_eq!(drain(&mut admin, q).await, strings(&["c-1"]), "{q}");
    }
    for q in [qa, qc, qd, qe] {
        assert!(drain(&mut admin, q).await.is_empty(), "{q}");
    }
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
        // Sealed for each receiver in turn, so either queue could take it
        // if its pattern matched.
        for receiver in ["receiver_1", "receiver_2"] {
            let id = format!("{id}-{receiver}");
            let reply = format!("NACK {id} no_route");
            publish_for(&mut admin, "t", key, receiver, &id, &reply).await;
        }
    }
    assert!(drain(&mut admin, "receiver_1_queue").await.is_empty());
    assert!(drain(&mut admin, "receiver_2_queue").await.is_empty());
}

/// Confinement (docs/PROTOCOL.md, "Exchange ownership"): whatever binding
/// leads to receiver_2's queue (its own key on a direct exchange, a fanout,
/// its own pattern on a topic exchange), an envelope sealed for receiver_1
/// is `NACK <id> no_route` there, one batch element as much as a publish,
/// and receiver_2's queue stores nothing of it; receiver_2's own envelopes
/// still arrive. The sender lives on another shard than the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_for_another_receiver_is_no_route_and_stores_nothing() {
    let broker = TestBroker::start(2);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_queue receiver_2_queue",
        "OK declare_queue receiver_2_queue",
    )
    .await;
    for (ex, kind, key) in [
        ("d", "direct", "receiver_2"),
        ("f", "fanout", "k"),
        ("t", "topic", "receiver_2.#"),
    ] {
        check(
            &mut admin,
            &format!("declare_exchange {ex} {kind}"),
            &format!("OK declare_exchange {ex}"),
        )
        .await;
        check(
            &mut admin,
            &format!("bind receiver_2_queue {ex} {key}"),
            &format!("OK bind receiver_2_queue {ex} {key}"),
        )
        .await;
    }
    let mut s = connect_as(&broker, broker.sender_on_other_shard("receiver_2")).await;
    for (i, (ex, key)) in [
        ("d", "receiver_2"),
        ("f", "receiver_2"),
        ("t", "receiver_2.x"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("x-{i}");
        let nack = format!("NACK {id} no_route");
        publish_for(&mut s, ex, key, "receiver_1", &id, &nack).await;
    }
    let batch = format!(
        "[{},{}]",
        body("xb-1", "receiver_1"),
        body("ok-1", "receiver_2")
    );
    send(&mut s, &format!("publish_batch d receiver_2 {batch}")).await;
    assert_eq!(line(&mut s).await, "NACK xb-1 no_route");
    assert_eq!(line(&mut s).await, "ACK ok-1");
    publish_for(
        &mut s,
        "t",
        "receiver_2.y",
        "receiver_2",
        "ok-2",
        "ACK ok-2",
    )
    .await;
    assert_eq!(
        drain(&mut admin, "receiver_2_queue").await,
        strings(&["ok-1", "ok-2"])
    );
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

/// One message for receiver_2 fanned out to receiver_2's queue and the
/// admin's `audit` (another shard with 2): receiver_2 acks its copy, which
/// is gone for good, while the admin's copy is untouched.
async fn fanout_ack_independence(shards: usize) {
    let broker = TestBroker::start(shards);
    spans_two_shards(&broker);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["k"]).await;
    queue_bound(&mut admin, "audit", "f", &["k"]).await;
    let mut s = connect_as(&broker, "sender_1").await;
    publish_for(&mut s, "f", "k", "receiver_2", "fan-1", "ACK fan-1").await;

    let mut r2 = connect_as(&broker, "receiver_2").await;
    let mut pushed = Vec::new();
    check_skipping(
        &mut r2,
        "consume receiver_2_queue",
        "OK consume receiver_2_queue",
        &mut pushed,
    )
    .await;
    if pushed.is_empty() {
        pushed.push(next_delivery(&mut r2).await);
    }
    assert_eq!(
        (pushed[0].id.as_str(), pushed[0].queue.as_str()),
        ("fan-1", "receiver_2_queue")
    );
    check(&mut r2, "ack fan-1", "ACK_CONFIRMED fan-1").await;
    // Gone from receiver_2_queue for good...
    drop(r2);
    let mut r2 = connect_as(&broker, "receiver_2").await;
    assert!(
        fetch(&mut r2, "receiver_2_queue", 10).await.is_empty(),
        "acked copy came back"
    );
    // ...while the admin's copy is untouched: first delivery.
    let got = fetch(&mut admin, "audit", 10).await;
    assert_eq!(got.len(), 1, "the admin's copy: {got:?}");
    assert_eq!(
        (got[0].id.as_str(), got[0].queue.as_str(), got[0].count),
        ("fan-1", "audit", 1)
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

/// One connection (the admin's) holds two copies of one message for
/// receiver_2, from the admin's `audit` and receiver_2's queue (another
/// shard with 2): an ack naming `audit` settles that copy only, and closing
/// returns receiver_2's as a redelivery.
async fn ack_with_queue(shards: usize) {
    let broker = TestBroker::start(shards);
    spans_two_shards(&broker);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "audit", "f", &["k"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["k"]).await;
    publish_for(&mut admin, "f", "k", "receiver_2", "fan-1", "ACK fan-1").await;
    // One connection holds both copies.
    assert_eq!(ids(&fetch(&mut admin, "audit", 1).await), ["fan-1"]);
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_2_queue", 1).await),
        ["fan-1"]
    );
    check(&mut admin, "ack fan-1 audit", "ACK_CONFIRMED fan-1").await;
    check(
        &mut admin,
        "ack fan-1 audit",
        "Error: no outstanding delivery fan-1",
    )
    .await;
    // Closing returns only receiver_2's copy, as a redelivery.
    drop(admin);
    let mut admin = connect_as(&broker, "admin").await;
    assert!(fetch(&mut admin, "audit", 10).await.is_empty());
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

/// An ack without a queue settles the copies of the id in every queue the
/// connection holds it from (the admin's `audit` and receiver_2's queue, on
/// two shards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_without_queue_settles_every_copy_of_the_id() {
    let broker = TestBroker::start(2);
    spans_two_shards(&broker);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    queue_bound(&mut admin, "audit", "f", &["k"]).await;
    queue_bound(&mut admin, "receiver_2_queue", "f", &["k"]).await;
    publish_for(&mut admin, "f", "k", "receiver_2", "fan-1", "ACK fan-1").await;
    assert_eq!(ids(&fetch(&mut admin, "audit", 1).await), ["fan-1"]);
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
    assert!(fetch(&mut admin, "audit", 10).await.is_empty());
    assert!(fetch(&mut admin, "receiver_2_queue", 10).await.is_empty());
}
