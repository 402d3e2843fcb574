//! The protocol and the delivery guarantees (docs/PROTOCOL.md,
//! docs/ARCHITECTURE.md "Delivery guarantees") from the consumer's side: push
//! consume with prefetch, competing consumers, redelivery (closed connection,
//! `nack`, `resend`) with delivery counts, pull `fetch`, per-sender-per-queue
//! dedup, dead-lettering after `max_deliveries`, full queues, and consumers on
//! another shard than their queue.

mod common;

use std::time::Duration;

use ciphermq_clients::connection::Connection;
use common::*;

/// How long "nothing more arrives" is watched.
const QUIET: Duration = Duration::from_millis(400);

/// A receiver_1 connection with `ex`, `receiver_1_queue` and the binding.
async fn receiver(broker: &TestBroker) -> Connection {
    let mut r = connect_as(broker, "receiver_1").await;
    check(
        &mut r,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    check(
        &mut r,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    check(
        &mut r,
        "bind receiver_1_queue ex receiver_1",
        "OK bind receiver_1_queue ex receiver_1",
    )
    .await;
    r
}

/// A sender on another shard than receiver_1 (when there are 2 shards).
async fn sender(broker: &TestBroker) -> Connection {
    connect_as(broker, broker.sender_on_other_shard("receiver_1")).await
}

/// Publishes each id to `receiver_1_queue`, asserting the ACKs.
async fn publish_ids(s: &mut Connection, ids: &[&str]) {
    for id in ids {
        publish_expect(s, "ex", "receiver_1", id, &format!("ACK {id}")).await;
    }
}

/// Reads deliveries until `pushed` holds `n` (any other line fails).
async fn collect(conn: &mut Connection, pushed: &mut Vec<Got>, n: usize) {
    while pushed.len() < n {
        pushed.push(next_delivery(conn).await);
    }
}

/// `consume <q> [prefetch]`, returning deliveries that came with the reply.
async fn consume(conn: &mut Connection, q: &str, prefetch: Option<u32>) -> Vec<Got> {
    let cmd = match prefetch {
        Some(p) => format!("consume {q} {p}"),
        None => format!("consume {q}"),
    };
    let mut pushed = Vec::new();
    check_skipping(conn, &cmd, &format!("OK consume {q}"), &mut pushed).await;
    pushed
}

fn id_count(g: &Got) -> (&str, u32) {
    (g.id.as_str(), g.count)
}

// ---------------------------------------------------------------------------
// prefetch
// ---------------------------------------------------------------------------

async fn prefetch(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m0", "m1", "m2", "m3", "m4"]).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", Some(2)).await;
    collect(&mut r, &mut pushed, 2).await;
    assert_silent(&mut r, QUIET, "prefetch 2 reached").await;
    assert_eq!(ids(&pushed), ["m0", "m1"]);
    // Each ack makes room for exactly one more.
    check_skipping(&mut r, "ack m0", "ACK_CONFIRMED m0", &mut pushed).await;
    collect(&mut r, &mut pushed, 3).await;
    assert_silent(&mut r, QUIET, "prefetch 2 reached again").await;
    assert_eq!(ids(&pushed), ["m0", "m1", "m2"]);
    check_skipping(&mut r, "ack m1", "ACK_CONFIRMED m1", &mut pushed).await;
    check_skipping(&mut r, "ack m2", "ACK_CONFIRMED m2", &mut pushed).await;
    collect(&mut r, &mut pushed, 5).await;
    assert_eq!(ids(&pushed), ["m0", "m1", "m2", "m3", "m4"]);
    assert!(pushed
        .iter()
        .all(|g| g.count == 1 && g.queue == "receiver_1_queue"));
    // Messages published while the consumer is at its limit wait as well.
    publish_ids(&mut s, &["n0", "n1", "n2"]).await;
    assert_silent(&mut r, QUIET, "m3 and m4 still unacked").await;
    check_skipping(&mut r, "ack m3", "ACK_CONFIRMED m3", &mut pushed).await;
    collect(&mut r, &mut pushed, 6).await;
    assert_silent(&mut r, QUIET, "prefetch 2 reached with new messages").await;
    assert_eq!(pushed[5].id, "n0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_unacked_push_deliveries_one_shard() {
    prefetch(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_unacked_push_deliveries_two_shards() {
    prefetch(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_without_prefetch_pushes_everything_in_order() {
    let broker = TestBroker::start(2);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    let names: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    publish_ids(&mut s, &refs[..25]).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", None).await;
    publish_ids(&mut s, &refs[25..]).await;
    collect(&mut r, &mut pushed, 50).await;
    assert_eq!(ids(&pushed), names);
    assert_silent(&mut r, QUIET, "all 50 delivered once").await;
}

// ---------------------------------------------------------------------------
// competing consumers
// ---------------------------------------------------------------------------

async fn round_robin(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut c1 = receiver(&broker).await;
    let mut c2 = connect_as(&broker, "receiver_1").await;
    let mut p1 = consume(&mut c1, "receiver_1_queue", Some(100)).await;
    let mut p2 = consume(&mut c2, "receiver_1_queue", Some(100)).await;
    let mut s = sender(&broker).await;
    let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    publish_ids(&mut s, &refs).await;
    collect(&mut c1, &mut p1, 5).await;
    collect(&mut c2, &mut p2, 5).await;
    assert_silent(&mut c1, QUIET, "c1 got its half").await;
    assert_silent(&mut c2, Duration::from_millis(50), "c2 got its half").await;
    let evens: Vec<String> = (0..10).step_by(2).map(|i| format!("m{i}")).collect();
    let odds: Vec<String> = (1..10).step_by(2).map(|i| format!("m{i}")).collect();
    let (a, b) = (ids(&p1), ids(&p2));
    assert!(
        (a == evens && b == odds) || (a == odds && b == evens),
        "not round robin / not FIFO per consumer: c1 {a:?}, c2 {b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_consumers_share_a_queue_round_robin_one_shard() {
    round_robin(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_consumers_share_a_queue_round_robin_two_shards() {
    round_robin(2).await;
}

// ---------------------------------------------------------------------------
// redelivery
// ---------------------------------------------------------------------------

async fn redelivery_on_close(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r1 = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m1", "m2"]).await;
    let mut p1 = consume(&mut r1, "receiver_1_queue", Some(10)).await;
    collect(&mut r1, &mut p1, 2).await;
    assert_eq!(
        p1.iter().map(id_count).collect::<Vec<_>>(),
        [("m1", 1), ("m2", 1)]
    );
    // A second consumer gets nothing while r1 holds both.
    let mut r2 = connect_as(&broker, "receiver_1").await;
    let mut p2 = consume(&mut r2, "receiver_1_queue", Some(10)).await;
    assert_silent(&mut r2, QUIET, "both messages owed to r1").await;
    drop(r1);
    collect(&mut r2, &mut p2, 2).await;
    assert_eq!(
        p2.iter().map(id_count).collect::<Vec<_>>(),
        [("m1", 2), ("m2", 2)]
    );
    check_skipping(&mut r2, "ack m1", "ACK_CONFIRMED m1", &mut p2).await;
    check_skipping(&mut r2, "ack m2", "ACK_CONFIRMED m2", &mut p2).await;
    assert_eq!(p2.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_return_with_count_2_when_consumer_disconnects_one_shard() {
    redelivery_on_close(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_return_with_count_2_when_consumer_disconnects_two_shards() {
    redelivery_on_close(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_delivery_returns_after_quit() {
    let broker = TestBroker::start(2);
    let mut r1 = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m1"]).await;
    assert_eq!(
        fetch(&mut r1, "receiver_1_queue", 1)
            .await
            .iter()
            .map(id_count)
            .collect::<Vec<_>>(),
        [("m1", 1)]
    );
    check(&mut r1, "quit", "OK bye").await;
    assert_closed(&mut r1).await;
    let mut r2 = connect_as(&broker, "receiver_1").await;
    // The requeue may trail the close by a moment; poll briefly.
    let mut got = Vec::new();
    for _ in 0..50 {
        got = fetch(&mut r2, "receiver_1_queue", 10).await;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got.iter().map(id_count).collect::<Vec<_>>(), [("m1", 2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_delivery_is_not_redelivered_after_close() {
    let broker = TestBroker::start(2);
    let mut r1 = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m1", "m2"]).await;
    let mut p1 = consume(&mut r1, "receiver_1_queue", Some(10)).await;
    collect(&mut r1, &mut p1, 2).await;
    check_skipping(&mut r1, "ack m1", "ACK_CONFIRMED m1", &mut p1).await;
    drop(r1);
    let mut r2 = connect_as(&broker, "receiver_1").await;
    let mut p2 = consume(&mut r2, "receiver_1_queue", Some(10)).await;
    collect(&mut r2, &mut p2, 1).await;
    assert_silent(&mut r2, QUIET, "only the unacked m2 comes back").await;
    assert_eq!(p2.iter().map(id_count).collect::<Vec<_>>(), [("m2", 2)]);
}

async fn nack_redelivers(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m1", "m2"]).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", Some(1)).await;
    collect(&mut r, &mut pushed, 1).await;
    assert_eq!(id_count(&pushed[0]), ("m1", 1));
    check_skipping(&mut r, "nack m1", "NACK_CONFIRMED m1", &mut pushed).await;
    collect(&mut r, &mut pushed, 2).await;
    // Requeued in place: m1 again (before m2), one more in its count.
    assert_eq!(id_count(&pushed[1]), ("m1", 2));
    check_skipping(
        &mut r,
        "nack m1 receiver_1_queue",
        "NACK_CONFIRMED m1",
        &mut pushed,
    )
    .await;
    collect(&mut r, &mut pushed, 3).await;
    assert_eq!(id_count(&pushed[2]), ("m1", 3));
    assert_eq!(pushed[2].body, body("m1", "receiver_1"));
    check_skipping(&mut r, "ack m1", "ACK_CONFIRMED m1", &mut pushed).await;
    collect(&mut r, &mut pushed, 4).await;
    assert_eq!(id_count(&pushed[3]), ("m2", 1));
    check_skipping(&mut r, "ack m2", "ACK_CONFIRMED m2", &mut pushed).await;
    check_skipping(
        &mut r,
        "nack m2",
        "Error: no outstanding delivery m2",
        &mut pushed,
    )
    .await;
    check_skipping(
        &mut r,
        "nack nothing",
        "Error: no outstanding delivery nothing",
        &mut pushed,
    )
    .await;
    assert_eq!(pushed.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_confirms_and_redelivers_with_count_plus_one_one_shard() {
    nack_redelivers(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_confirms_and_redelivers_with_count_plus_one_two_shards() {
    nack_redelivers(2).await;
}

async fn resend(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    check(&mut r, "resend", "OK resend 0").await;
    let names = ["m1", "m2", "m3", "m4", "m5", "m6"];
    publish_ids(&mut s, &names).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", Some(10)).await;
    collect(&mut r, &mut pushed, 6).await;
    check_skipping(&mut r, "resend", "OK resend 6", &mut pushed).await;
    collect(&mut r, &mut pushed, 12).await;
    let expected: Vec<(&str, u32)> = names
        .iter()
        .map(|n| (*n, 1))
        .chain(names.iter().map(|n| (*n, 2)))
        .collect();
    // Resent once each, count 2, and still FIFO for this consumer.
    assert_eq!(pushed.iter().map(id_count).collect::<Vec<_>>(), expected);
    assert_silent(&mut r, QUIET, "each owed delivery resent once").await;
    for n in names {
        check_skipping(
            &mut r,
            &format!("ack {n}"),
            &format!("ACK_CONFIRMED {n}"),
            &mut pushed,
        )
        .await;
    }
    check_skipping(&mut r, "resend", "OK resend 0", &mut pushed).await;
    assert_eq!(pushed.len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_redelivers_unacked_push_deliveries_one_shard() {
    resend(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_redelivers_unacked_push_deliveries_two_shards() {
    resend(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_returns_fetched_deliveries() {
    let broker = TestBroker::start(2);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m1", "m2", "m3"]).await;
    assert_eq!(
        ids(&fetch(&mut r, "receiver_1_queue", 2).await),
        ["m1", "m2"]
    );
    check(&mut r, "resend", "OK resend 2").await;
    let again = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(
        again.iter().map(id_count).collect::<Vec<_>>(),
        [("m1", 2), ("m2", 2), ("m3", 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_push_delivery_is_redelivered_after_ack_wait_secs() {
    let broker = TestBroker::start_with(1, "[performance]\nack_wait_secs = 1\n");
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["w1"]).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", None).await;
    collect(&mut r, &mut pushed, 1).await;
    assert_eq!(id_count(&pushed[0]), ("w1", 1));
    // Not acked: after about a second it comes again, one more in its count.
    let again = tokio::time::timeout(Duration::from_secs(5), r.read_line())
        .await
        .expect("redelivered within 5 s of a 1 s ack_wait_secs")
        .expect("read")
        .expect("a line");
    assert_eq!(id_count(&delivery_of(&again)), ("w1", 2));
    check(&mut r, "ack w1", "ACK_CONFIRMED w1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_fetched_delivery_is_redelivered_after_ack_wait_secs() {
    let broker = TestBroker::start_with(2, "[performance]\nack_wait_secs = 1\n");
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["w1"]).await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 1).await), ["w1"]);
    assert!(fetch(&mut r, "receiver_1_queue", 1).await.is_empty());
    let mut other = connect_as(&broker, "receiver_1").await;
    let mut got = Vec::new();
    for _ in 0..50 {
        got = fetch(&mut other, "receiver_1_queue", 1).await;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        got.iter().map(id_count).collect::<Vec<_>>(),
        [("w1", 2)],
        "redelivered within 5 s"
    );
}

// ---------------------------------------------------------------------------
// fetch
// ---------------------------------------------------------------------------

async fn fetch_pulls(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r = receiver(&broker).await;
    assert!(
        fetch(&mut r, "receiver_1_queue", 3).await.is_empty(),
        "OK fetch 0 on an empty queue"
    );
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["m0", "m1", "m2", "m3", "m4"]).await;
    let first = fetch(&mut r, "receiver_1_queue", 3).await;
    assert_eq!(ids(&first), ["m0", "m1", "m2"]);
    assert!(first
        .iter()
        .all(|g| g.count == 1 && g.queue == "receiver_1_queue"));
    assert_eq!(first[0].body, body("m0", "receiver_1"));
    assert_eq!(
        ids(&fetch(&mut r, "receiver_1_queue", 3).await),
        ["m3", "m4"]
    );
    // Fetched but unacked messages are not handed out again.
    assert!(fetch(&mut r, "receiver_1_queue", 3).await.is_empty());
    // Without a max, one.
    publish_ids(&mut s, &["m5", "m6"]).await;
    send(&mut r, "fetch receiver_1_queue").await;
    assert_eq!(next_delivery(&mut r).await.id, "m5");
    assert_eq!(line(&mut r).await, "OK fetch 1");
    for id in ["m0", "m1", "m2", "m3", "m4", "m5"] {
        check(&mut r, &format!("ack {id}"), &format!("ACK_CONFIRMED {id}")).await;
    }
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 3).await), ["m6"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_returns_up_to_max_then_ok_fetch_n_one_shard() {
    fetch_pulls(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_returns_up_to_max_then_ok_fetch_n_two_shards() {
    fetch_pulls(2).await;
}

// ---------------------------------------------------------------------------
// dedup (per sender, per queue)
// ---------------------------------------------------------------------------

async fn dedup_same_sender(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["d-1", "d-1", "d-1"]).await;
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["d-1"]);
    // Still unacked: a retry stores nothing.
    publish_ids(&mut s, &["d-1"]).await;
    assert!(fetch(&mut r, "receiver_1_queue", 10).await.is_empty());
    // Acked within the window: a retry still stores nothing.
    check(&mut r, "ack d-1", "ACK_CONFIRMED d-1").await;
    publish_ids(&mut s, &["d-1"]).await;
    assert!(fetch(&mut r, "receiver_1_queue", 10).await.is_empty());
    drop(r);
    let mut r = connect_as(&broker, "receiver_1").await;
    assert!(fetch(&mut r, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_sender_republishing_an_id_is_acked_without_a_second_copy_one_shard() {
    dedup_same_sender(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_sender_republishing_an_id_is_acked_without_a_second_copy_two_shards() {
    dedup_same_sender(2).await;
}

async fn dedup_other_sender(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut r = receiver(&broker).await;
    // With 2 shards, sender_1 and sender_2 live on different shards.
    let mut s1 = connect_as(&broker, "sender_1").await;
    let mut s2 = connect_as(&broker, "sender_2").await;
    publish_ids(&mut s1, &["same"]).await;
    publish_ids(&mut s2, &["same"]).await;
    publish_ids(&mut s1, &["same"]).await;
    publish_ids(&mut s2, &["same"]).await;
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["same", "same"], "one copy per sender");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sender_with_the_same_id_stores_a_second_copy_one_shard() {
    dedup_other_sender(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sender_with_the_same_id_stores_a_second_copy_two_shards() {
    dedup_other_sender(2).await;
}

/// One message for receiver_2, already stored in `receiver_2_queue`, is
/// published again on a fanout that also reaches the admin's `audit`: a
/// duplicate for the first queue, new to the second, which gets its copy.
/// The two queues live on different shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_is_per_queue() {
    let broker = TestBroker::start(2);
    assert_ne!(
        broker.shard_of("receiver_2"),
        broker.shard_of("admin"),
        "receiver_2_queue and the admin's audit share a shard"
    );
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    check(
        &mut admin,
        "declare_exchange f fanout",
        "OK declare_exchange f",
    )
    .await;
    for q in ["receiver_2_queue", "audit"] {
        check(
            &mut admin,
            &format!("declare_queue {q}"),
            &format!("OK declare_queue {q}"),
        )
        .await;
        check(
            &mut admin,
            &format!("bind {q} f k"),
            &format!("OK bind {q} f k"),
        )
        .await;
    }
    check(
        &mut admin,
        "bind receiver_2_queue ex receiver_2",
        "OK bind receiver_2_queue ex receiver_2",
    )
    .await;
    let mut s = connect_as(&broker, "sender_1").await;
    publish_for(&mut s, "ex", "receiver_2", "receiver_2", "p-1", "ACK p-1").await;
    // Already in receiver_2_queue, new to audit.
    publish_for(&mut s, "f", "k", "receiver_2", "p-1", "ACK p-1").await;
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_2_queue", 10).await),
        ["p-1"]
    );
    assert_eq!(ids(&fetch(&mut admin, "audit", 10).await), ["p-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_ids_within_one_batch_store_one_copy() {
    let broker = TestBroker::start(1);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    let batch = format!(
        "[{},{},{}]",
        body("b-1", "receiver_1"),
        body("b-1", "receiver_1"),
        body("b-2", "receiver_1")
    );
    send(&mut s, &format!("publish_batch ex receiver_1 {batch}")).await;
    for expected in ["ACK b-1", "ACK b-1", "ACK b-2"] {
        assert_eq!(line(&mut s).await, expected);
    }
    assert_eq!(
        ids(&fetch(&mut r, "receiver_1_queue", 10).await),
        ["b-1", "b-2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_id_may_be_stored_again_after_the_dedup_window() {
    let broker = TestBroker::start_with(1, "[performance]\ndedup_window_secs = 1\n");
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["w-1"]).await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 10).await), ["w-1"]);
    check(&mut r, "ack w-1", "ACK_CONFIRMED w-1").await;
    publish_ids(&mut s, &["w-1"]).await;
    assert!(
        fetch(&mut r, "receiver_1_queue", 10).await.is_empty(),
        "inside the window"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    publish_ids(&mut s, &["w-1"]).await;
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(
        got.iter().map(id_count).collect::<Vec<_>>(),
        [("w-1", 1)],
        "after the window"
    );
}

// ---------------------------------------------------------------------------
// dead letters
// ---------------------------------------------------------------------------

const TWO_DELIVERIES: &str = "[performance]\nmax_deliveries = 2\n";

async fn dead_letter_push(shards: usize) {
    let broker = TestBroker::start_with(shards, TWO_DELIVERIES);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["dl-1"]).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", None).await;
    collect(&mut r, &mut pushed, 1).await;
    check_skipping(&mut r, "nack dl-1", "NACK_CONFIRMED dl-1", &mut pushed).await;
    collect(&mut r, &mut pushed, 2).await;
    assert_eq!(
        pushed.iter().map(id_count).collect::<Vec<_>>(),
        [("dl-1", 1), ("dl-1", 2)]
    );
    check_skipping(&mut r, "nack dl-1", "NACK_CONFIRMED dl-1", &mut pushed).await;
    assert_silent(&mut r, QUIET, "no third delivery from receiver_1_queue").await;
    assert_eq!(pushed.len(), 2);
    // The owner consumes the dead-letter queue (created on first use).
    let mut dead = consume(&mut r, "receiver_1_queue.dlq", None).await;
    collect(&mut r, &mut dead, 1).await;
    let d = &dead[0];
    assert_eq!(
        (d.id.as_str(), d.queue.as_str(), d.count),
        ("dl-1", "receiver_1_queue.dlq", 1)
    );
    assert_eq!(d.body, body("dl-1", "receiver_1"));
    check(
        &mut r,
        "ack dl-1 receiver_1_queue.dlq",
        "ACK_CONFIRMED dl-1",
    )
    .await;
    assert!(fetch(&mut r, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_nacked_max_deliveries_times_moves_to_dlq_one_shard() {
    dead_letter_push(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_nacked_max_deliveries_times_moves_to_dlq_two_shards() {
    dead_letter_push(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_message_nacked_max_deliveries_times_is_in_the_dlq() {
    let broker = TestBroker::start_with(1, TWO_DELIVERIES);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["dl-1"]).await;
    for round in 1..=2 {
        let got = fetch(&mut r, "receiver_1_queue", 1).await;
        assert_eq!(
            got.iter().map(id_count).collect::<Vec<_>>(),
            [("dl-1", round)]
        );
        check(&mut r, "nack dl-1", "NACK_CONFIRMED dl-1").await;
    }
    // Its deliveries are used up: it now lives in the DLQ, where its owner finds
    // it without touching the original queue first.
    let dead = fetch(&mut r, "receiver_1_queue.dlq", 10).await;
    assert_eq!(dead.iter().map(id_count).collect::<Vec<_>>(), [("dl-1", 1)]);
    assert_eq!(dead[0].queue, "receiver_1_queue.dlq");
    assert!(fetch(&mut r, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_to_closed_connections_count_toward_max_deliveries() {
    let broker = TestBroker::start_with(2, TWO_DELIVERIES);
    let mut setup = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["dl-1"]).await;
    assert_eq!(
        fetch(&mut setup, "receiver_1_queue", 1)
            .await
            .iter()
            .map(id_count)
            .collect::<Vec<_>>(),
        [("dl-1", 1)]
    );
    drop(setup);
    let mut r = connect_as(&broker, "receiver_1").await;
    let mut got = Vec::new();
    for _ in 0..50 {
        got = fetch(&mut r, "receiver_1_queue", 1).await;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got.iter().map(id_count).collect::<Vec<_>>(), [("dl-1", 2)]);
    drop(r);
    // Two deliveries, both lost with their connections: dead-lettered.
    let mut owner = connect_as(&broker, "receiver_1").await;
    let mut dead = consume(&mut owner, "receiver_1_queue.dlq", None).await;
    collect(&mut owner, &mut dead, 1).await;
    assert_eq!(
        (dead[0].id.as_str(), dead[0].queue.as_str(), dead[0].count),
        ("dl-1", "receiver_1_queue.dlq", 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_belongs_to_the_queue_owner() {
    let broker = TestBroker::start_with(2, TWO_DELIVERIES);
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["dl-1"]).await;
    let mut pushed = consume(&mut r, "receiver_1_queue", None).await;
    collect(&mut r, &mut pushed, 1).await;
    check_skipping(&mut r, "nack dl-1", "NACK_CONFIRMED dl-1", &mut pushed).await;
    collect(&mut r, &mut pushed, 2).await;
    check_skipping(&mut r, "nack dl-1", "NACK_CONFIRMED dl-1", &mut pushed).await;
    let mut other = connect_as(&broker, "receiver_2").await;
    check_denied(&mut other, "consume receiver_1_queue.dlq", "receiver").await;
    check_denied(&mut other, "fetch receiver_1_queue.dlq", "receiver").await;
    // An admin (on another shard than receiver_2, maybe not receiver_1's) may.
    let mut admin = connect_as(&broker, "admin").await;
    let dead = fetch(&mut admin, "receiver_1_queue.dlq", 10).await;
    assert_eq!(dead.iter().map(id_count).collect::<Vec<_>>(), [("dl-1", 1)]);
}

// ---------------------------------------------------------------------------
// full queues
// ---------------------------------------------------------------------------

async fn queue_full(shards: usize) {
    let broker = TestBroker::start_with(shards, "[performance]\nmax_queue_size = 3\n");
    let mut r = receiver(&broker).await;
    let mut s = sender(&broker).await;
    publish_ids(&mut s, &["q1", "q2", "q3"]).await;
    publish_expect(&mut s, "ex", "receiver_1", "q4", "NACK q4 queue_full").await;
    // Nothing was evicted.
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["q1", "q2", "q3"]);
    publish_expect(&mut s, "ex", "receiver_1", "q4", "NACK q4 queue_full").await;
    // Room again after an ack: the refused id is accepted on retry.
    check(&mut r, "ack q1", "ACK_CONFIRMED q1").await;
    publish_expect(&mut s, "ex", "receiver_1", "q4", "ACK q4").await;
    publish_expect(&mut s, "ex", "receiver_1", "q5", "NACK q5 queue_full").await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 10).await), ["q4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_refuses_publishes_with_queue_full_one_shard() {
    queue_full(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_refuses_publishes_with_queue_full_two_shards() {
    queue_full(2).await;
}

// ---------------------------------------------------------------------------
// a consumer on another shard than its queue
// ---------------------------------------------------------------------------

/// A receiver CN whose queues live on another shard than admin's connection.
fn receiver_away_from_admin(broker: &TestBroker) -> &'static str {
    ["receiver_1", "receiver_2", "receiver_1_2"]
        .into_iter()
        .find(|cn| broker.shard_of(cn) != broker.shard_of("admin"))
        .expect("some receiver lives on another shard than admin")
}

/// Declares `{cn}_queue`, bound to `ex` with key `cn`, as admin.
async fn admin_world(broker: &TestBroker, cn: &str) -> Connection {
    let mut admin = connect_as(broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
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
    admin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_consumes_a_queue_on_another_shard() {
    let broker = TestBroker::start(2);
    let cn = receiver_away_from_admin(&broker);
    let q = format!("{cn}_queue");
    let mut admin = admin_world(&broker, cn).await;
    let mut s = connect_as(&broker, "sender_1").await;
    let mut pushed = consume(&mut admin, &q, Some(2)).await;
    for id in ["x1", "x2", "x3"] {
        check(
            &mut s,
            &format!("publish ex {cn} {}", body(id, cn)),
            &format!("ACK {id}"),
        )
        .await;
    }
    collect(&mut admin, &mut pushed, 2).await;
    assert_silent(&mut admin, QUIET, "prefetch 2 across shards").await;
    assert_eq!(
        pushed.iter().map(id_count).collect::<Vec<_>>(),
        [("x1", 1), ("x2", 1)]
    );
    assert!(pushed.iter().all(|g| g.queue == q));
    check_skipping(&mut admin, "ack x1", "ACK_CONFIRMED x1", &mut pushed).await;
    collect(&mut admin, &mut pushed, 3).await;
    assert_eq!(id_count(&pushed[2]), ("x3", 1));
    check_skipping(
        &mut admin,
        &format!("nack x2 {q}"),
        "NACK_CONFIRMED x2",
        &mut pushed,
    )
    .await;
    collect(&mut admin, &mut pushed, 4).await;
    assert_eq!(id_count(&pushed[3]), ("x2", 2));
    // Closing the cross-shard consumer returns what it owed to the owner.
    drop(admin);
    let mut owner = connect_as(&broker, cn).await;
    let mut back = consume(&mut owner, &q, None).await;
    collect(&mut owner, &mut back, 2).await;
    let mut got = back.iter().map(id_count).collect::<Vec<_>>();
    got.sort();
    assert_eq!(got, [("x2", 3), ("x3", 2)]);
    assert_silent(&mut owner, QUIET, "x1 was acked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_fetches_a_queue_on_another_shard() {
    let broker = TestBroker::start(2);
    let cn = receiver_away_from_admin(&broker);
    let q = format!("{cn}_queue");
    let mut admin = admin_world(&broker, cn).await;
    assert!(fetch(&mut admin, &q, 3).await.is_empty());
    for id in ["y1", "y2", "y3", "y4"] {
        check(
            &mut admin,
            &format!("publish ex {cn} {}", body(id, cn)),
            &format!("ACK {id}"),
        )
        .await;
    }
    assert_eq!(ids(&fetch(&mut admin, &q, 3).await), ["y1", "y2", "y3"]);
    check(&mut admin, "ack y1", "ACK_CONFIRMED y1").await;
    check(&mut admin, "resend", "OK resend 2").await;
    let again = fetch(&mut admin, &q, 10).await;
    assert_eq!(
        again.iter().map(id_count).collect::<Vec<_>>(),
        [("y2", 2), ("y3", 2), ("y4", 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_on_two_shards_compete_for_one_queue() {
    let broker = TestBroker::start(2);
    let cn = receiver_away_from_admin(&broker);
    let q = format!("{cn}_queue");
    let mut admin = admin_world(&broker, cn).await;
    let mut owner = connect_as(&broker, cn).await;
    let mut pa = consume(&mut admin, &q, Some(100)).await;
    let mut po = consume(&mut owner, &q, Some(100)).await;
    let mut s = connect_as(&broker, "sender_1").await;
    for i in 0..8 {
        let id = format!("z{i}");
        check(
            &mut s,
            &format!("publish ex {cn} {}", body(&id, cn)),
            &format!("ACK {id}"),
        )
        .await;
    }
    collect(&mut admin, &mut pa, 4).await;
    collect(&mut owner, &mut po, 4).await;
    assert_silent(&mut admin, QUIET, "admin got its half").await;
    assert_silent(&mut owner, Duration::from_millis(50), "owner got its half").await;
    let mut all: Vec<String> = ids(&pa).into_iter().chain(ids(&po)).collect();
    all.sort();
    assert_eq!(all, (0..8).map(|i| format!("z{i}")).collect::<Vec<_>>());
    for p in [&pa, &po] {
        let n: Vec<u32> = p.iter().map(|g| g.id[1..].parse().unwrap()).collect();
        assert!(
            n.windows(2).all(|w| w[0] < w[1]),
            "FIFO per consumer: {n:?}"
        );
    }
}
