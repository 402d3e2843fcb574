//! Per-CN quotas on queues, exchanges and bindings (docs/PROTOCOL.md,
//! "Quotas"): a receiver that declares and binds without end meets its quotas
//! with an `Error: quota exceeded: …` naming the quota, while another client of
//! the same shard is served and routing through what it did bind still works.
//! Admins are not held to a receiver's quota, and the counts survive a restart
//! (they are rebuilt from the saved topology, not reset).

mod common;

use ciphermq_clients::connection::Connection;
use common::*;

const QUEUES: usize = 20;
const EXCHANGES: usize = 3;
const BINDINGS: usize = 3_000;

fn quotas() -> String {
    format!(
        "[performance]\nmax_queues_per_cn = {QUEUES}\nmax_exchanges_per_cn = {EXCHANGES}\n\
         max_bindings_per_cn = {BINDINGS}\n"
    )
}

fn quota_error(what: &str, limit: usize, key: &str) -> String {
    format!(
        "Error: quota exceeded: receiver_1 already has {limit} {what}, the most one client may \
         have (performance.{key})"
    )
}

/// Pipelines `bind receiver_1_queue ev receiver_1.k<i>` for `range` and
/// returns the replies in order.
async fn pipelined_binds(r: &mut Connection, range: std::ops::Range<usize>) -> Vec<String> {
    for i in range.clone() {
        r.queue_line(&format!("bind receiver_1_queue ev receiver_1.k{i}"));
    }
    flush_t(r).await;
    let mut replies = Vec::with_capacity(range.len());
    for _ in range {
        replies.push(line(r).await);
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_heavy_receiver_meets_its_quotas_and_the_shard_keeps_serving() {
    // One shard: the hostile receiver, its neighbour and the sender share it.
    let broker = TestBroker::start_with(1, &quotas());
    let mut r = connect_as(&broker, "receiver_1").await;
    for e in 0..EXCHANGES {
        check(
            &mut r,
            &format!("declare_exchange receiver_1_ex{e} topic"),
            &format!("OK declare_exchange receiver_1_ex{e}"),
        )
        .await;
    }
    check(
        &mut r,
        "declare_exchange receiver_1_one_too_many topic",
        &quota_error("exchanges", EXCHANGES, "max_exchanges_per_cn"),
    )
    .await;
    // An exchange it declared again is no new exchange.
    check(
        &mut r,
        "declare_exchange receiver_1_ex0 topic",
        "OK declare_exchange receiver_1_ex0",
    )
    .await;

    for q in 0..QUEUES {
        check(
            &mut r,
            &format!("declare_queue receiver_1_q{q}"),
            &format!("OK declare_queue receiver_1_q{q}"),
        )
        .await;
    }
    check(
        &mut r,
        "declare_queue receiver_1_queue",
        &quota_error("queues", QUEUES, "max_queues_per_cn"),
    )
    .await;
    // An admin may declare it for receiver_1 (admins are not limited) ...
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange ev topic",
        "OK declare_exchange ev",
    )
    .await;
    check(
        &mut admin,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;

    // ... and receiver_1 binds it as fast as it can, past its quota.
    let extra = 500;
    let replies = pipelined_binds(&mut r, 0..BINDINGS + extra).await;
    for (i, reply) in replies.iter().enumerate() {
        let expected = if i < BINDINGS {
            format!("OK bind receiver_1_queue ev receiver_1.k{i}")
        } else {
            quota_error("bindings", BINDINGS, "max_bindings_per_cn")
        };
        assert_eq!(reply, &expected, "reply to bind {i}");
    }
    // A binding it has is still an idempotent success.
    check(
        &mut r,
        "bind receiver_1_queue ev receiver_1.k0",
        "OK bind receiver_1_queue ev receiver_1.k0",
    )
    .await;

    // Its neighbour on the same shard is served, and is not limited by it.
    let mut neighbour = connect_as(&broker, "receiver_2").await;
    check(&mut neighbour, "heartbeat", "OK heartbeat").await;
    check(
        &mut neighbour,
        "declare_queue receiver_2_queue",
        "OK declare_queue receiver_2_queue",
    )
    .await;
    check(
        &mut neighbour,
        "bind receiver_2_queue ev receiver_2.k",
        "OK bind receiver_2_queue ev receiver_2.k",
    )
    .await;
    // An admin's binding of receiver_1's queue goes past receiver_1's quota.
    check(
        &mut admin,
        "bind receiver_1_queue ev receiver_1.by_admin",
        "OK bind receiver_1_queue ev receiver_1.by_admin",
    )
    .await;

    // What it did bind routes; what was refused does not.
    let mut sender = connect_as(&broker, "sender_1").await;
    let last = BINDINGS - 1;
    for (id, key) in [
        ("bound", format!("receiver_1.k{last}")),
        ("refused", format!("receiver_1.k{BINDINGS}")),
        ("admins", "receiver_1.by_admin".to_owned()),
    ] {
        let reply = ask(
            &mut sender,
            &format!("publish ev {key} {}", body(id, "receiver_1")),
        )
        .await;
        let expected = if id == "refused" {
            "NACK refused no_route".to_owned()
        } else {
            format!("ACK {id}")
        };
        assert_eq!(reply, expected, "publish with key {key}");
    }
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), vec!["bound", "admins"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_counts_are_rebuilt_from_the_saved_topology_at_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let limits = "[performance]\nmax_bindings_per_cn = 50\n";
    let mut broker = TestBroker::start_durable_with(1, data.path(), "127.0.0.1:0", limits);
    let mut r = connect_as(&broker, "receiver_1").await;
    check(
        &mut r,
        "declare_exchange ev topic",
        "OK declare_exchange ev",
    )
    .await;
    check(
        &mut r,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    let replies = pipelined_binds(&mut r, 0..50).await;
    assert!(
        replies.iter().all(|l| l.starts_with("OK bind")),
        "{replies:?}"
    );
    drop(r);
    broker.stop();
    drop(broker);

    // A new port: the old one may have gone to another test's broker by now.
    let broker = TestBroker::start_durable_with(1, data.path(), "127.0.0.1:0", limits);
    let mut r = connect_as(&broker, "receiver_1").await;
    check(
        &mut r,
        "bind receiver_1_queue ev receiver_1.after_restart",
        &quota_error("bindings", 50, "max_bindings_per_cn"),
    )
    .await;
    check(
        &mut r,
        "bind receiver_1_queue ev receiver_1.k49",
        "OK bind receiver_1_queue ev receiver_1.k49",
    )
    .await;
}
