//! Durable backlogs larger than `storage.memory_budget_mb`: past its shard's
//! part of the budget a queue keeps its bodies in its log only and reads
//! them back ahead of its consumers. The budget holds (measured on the
//! broker's own meter, `/metrics`), and every acked publish is still served
//! exactly once, in order, across a restart, with nacks, acks,
//! dead-lettering and dedup interleaved.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ciphermq_clients::connection::Connection;
use common::*;

/// Body bytes of the ciphertext per message: about 10 KB a message, so a
/// few hundred messages are many times a 1 MiB budget.
const CIPHERTEXT_BYTES: usize = 10_000;

/// Most body bytes a shard may hold past its part of the budget: the
/// messages of commit rounds not durable yet (a pipelined window here) and
/// one read-ahead batch.
const SLACK: u64 = 3 << 20;

/// Its address is quoted differently from the server's, which a restart
/// replaces with the port the broker got. With the per-queue series
/// (`ciphermq_queue_on_disk` is read).
const ADMIN: &str = "\n[admin]\nenabled = true\naddress = '127.0.0.1:0'\nqueue_metrics = true\n";

fn envelope(id: &str, receiver: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"{}"}}"#,
        "QUFB".repeat(CIPHERTEXT_BYTES / 4)
    )
}

/// A durable broker over `data` with a 1 MiB budget (and `performance`
/// keys `perf`), with its admin endpoint.
fn start(shards: usize, data: &std::path::Path, addr: &str, perf: &str) -> TestBroker {
    let extra = format!("\n[performance]\n{perf}\n{ADMIN}");
    TestBroker::start_durable_edited(shards, data, addr, &extra, |text| {
        text.replace(
            r#"mode = "memory""#,
            "mode = \"memory\"\nmemory_budget_mb = 1",
        )
    })
}

/// Publishes `ids` with key `key` on `ex`, 64 in flight, asserting each `ACK`.
async fn publish_all(s: &mut Connection, key: &str, receiver: &str, ids: &[String]) {
    for window in ids.chunks(64) {
        for id in window {
            send(s, &format!("publish ex {key} {}", envelope(id, receiver))).await;
        }
        flush_t(s).await;
        for id in window {
            assert_eq!(line(s).await, format!("ACK {id}"));
        }
    }
}

/// The samples of metric `name` (label set → value).
async fn metric(admin: SocketAddr, name: &str) -> Vec<(String, u64)> {
    let reply = admin_http::request(admin, Some("admin"), "GET", "/metrics")
        .await
        .expect("metrics");
    reply
        .body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| {
            let (labels, value) = l[name.len()..].rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Waits (bounded) until every shard's in-memory bodies are within its
/// part plus `SLACK` and `queue` has at least `min_on_disk` messages on
/// disk; returns (largest shard figure, messages on disk).
async fn settle(admin: SocketAddr, shards: u64, queue: &str, min_on_disk: u64) -> (u64, u64) {
    let part = (1u64 << 20) / shards;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let memory = metric(admin, "ciphermq_shard_memory_bytes").await;
        let worst = memory.iter().map(|(_, v)| *v).max().unwrap_or(0);
        let on_disk = metric(admin, "ciphermq_queue_on_disk")
            .await
            .into_iter()
            .find(|(labels, _)| labels.contains(&format!("queue=\"{queue}\"")))
            .map_or(0, |(_, v)| v);
        if worst <= part + SLACK && on_disk >= min_on_disk && !memory.is_empty() {
            return (worst, on_disk);
        }
        assert!(
            Instant::now() < deadline,
            "budget not held: shards hold {memory:?} bytes in memory (part {part}), {on_disk} of {queue} on disk"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn receiver_with_queue(broker: &TestBroker, cn: &str, queue: &str) -> Connection {
    let mut r = connect_as(broker, cn).await;
    check(
        &mut r,
        &format!("declare_queue {queue}"),
        &format!("OK declare_queue {queue}"),
    )
    .await;
    check(
        &mut r,
        &format!("bind {queue} ex {cn}"),
        &format!("OK bind {queue} ex {cn}"),
    )
    .await;
    r
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Fetches until `queue` is empty, acking each delivery; returns (id, count).
async fn drain(r: &mut Connection, queue: &str) -> Vec<(String, u32)> {
    let mut all = Vec::new();
    loop {
        let got = fetch(r, queue, 100).await;
        if got.is_empty() {
            return all;
        }
        for g in &got {
            check(
                r,
                &format!("ack {} {queue}", g.id),
                &format!("ACK_CONFIRMED {}", g.id),
            )
            .await;
            all.push((g.id.clone(), g.count));
        }
    }
}

/// A 1-shard broker over `data` (with `performance` keys `perf`), `ex`
/// declared, `receiver_1_queue` bound to it, and connections of its
/// receiver and of `sender_1`.
struct OneQueue {
    broker: TestBroker,
    admin: SocketAddr,
    r: Connection,
    s: Connection,
}

const QUEUE: &str = "receiver_1_queue";

async fn one_queue(data: &std::path::Path, perf: &str) -> OneQueue {
    let broker = start(1, data, "127.0.0.1:0", perf);
    let admin = broker.admin_addr().expect("admin endpoint");
    let mut a = connect_as(&broker, "admin").await;
    check(&mut a, "declare_exchange ex", "OK declare_exchange ex").await;
    let r = receiver_with_queue(&broker, "receiver_1", QUEUE).await;
    let s = connect_as(&broker, "sender_1").await;
    OneQueue {
        broker,
        admin,
        r,
        s,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_many_times_the_budget_is_served_in_order_across_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let OneQueue {
        mut broker,
        admin,
        mut r,
        mut s,
    } = one_queue(data.path(), "").await;
    let queue = QUEUE;

    // 1,500 messages of about 10 KB: 15 times the budget.
    let all = ids("m", 1500);
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    let (memory, on_disk) = settle(admin, 1, queue, 1000).await;
    eprintln!("after publishing: {memory} bytes in memory, {on_disk} messages on disk");

    // The head is read back for a fetch; nacked ones come back first.
    let first = fetch(&mut r, queue, 10).await;
    assert_eq!(
        first.iter().map(|g| g.id.clone()).collect::<Vec<_>>(),
        all[..10].to_vec()
    );
    for g in &first[..5] {
        check(
            &mut r,
            &format!("ack {} {queue}", g.id),
            &format!("ACK_CONFIRMED {}", g.id),
        )
        .await;
    }
    for g in &first[5..] {
        check(
            &mut r,
            &format!("nack {} {queue}", g.id),
            &format!("NACK_CONFIRMED {}", g.id),
        )
        .await;
    }
    // A retry of a message now on disk, inside the dedup window, stores
    // nothing new.
    publish_all(&mut s, "receiver_1", "receiver_1", &all[700..701]).await;
    let again = fetch(&mut r, queue, 7).await;
    let got: Vec<(String, u32)> = again.iter().map(|g| (g.id.clone(), g.count)).collect();
    let mut want: Vec<(String, u32)> = all[5..10].iter().map(|id| (id.clone(), 2)).collect();
    want.extend(all[10..12].iter().map(|id| (id.clone(), 1)));
    assert_eq!(got, want, "redeliveries first, then the backlog in order");
    for g in &again[..3] {
        check(
            &mut r,
            &format!("ack {} {queue}", g.id),
            &format!("ACK_CONFIRMED {}", g.id),
        )
        .await;
    }
    // The other four stay unacked across the restart.
    drop(r);
    drop(s);
    broker.stop();

    // A new port: the old one may have gone to another test's broker by now.
    let broker = start(1, data.path(), "127.0.0.1:0", "");
    let admin = broker.admin_addr().expect("admin endpoint");
    let (memory, on_disk) = settle(admin, 1, queue, 1000).await;
    eprintln!("after the restart: {memory} bytes in memory, {on_disk} messages on disk");
    let mut r = connect_as(&broker, "receiver_1").await;
    let got = drain(&mut r, queue).await;
    // Acked: m-0..m-4, m-5..m-7. Unacked at the stop: m-8, m-9 (delivered
    // twice), m-10, m-11 (once); then the rest, never delivered.
    let mut want: Vec<(String, u32)> = vec![
        ("m-8".into(), 3),
        ("m-9".into(), 3),
        ("m-10".into(), 2),
        ("m-11".into(), 2),
    ];
    want.extend(all[12..].iter().map(|id| (id.clone(), 1)));
    let got_ids: Vec<&String> = got.iter().map(|(id, _)| id).collect();
    let want_ids: Vec<&String> = want.iter().map(|(id, _)| id).collect();
    assert_eq!(got_ids.len(), want_ids.len(), "0 lost, 0 duplicated");
    assert_eq!(got_ids, want_ids, "in order");
    assert_eq!(got, want, "delivery counts carried across the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_holds_with_many_queues_over_two_shards() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = start(2, data.path(), "127.0.0.1:0", "");
    let admin = broker.admin_addr().expect("admin endpoint");
    let mut a = connect_as(&broker, "admin").await;
    check(&mut a, "declare_exchange ex", "OK declare_exchange ex").await;
    // Queues of two receivers on different shards, four each.
    let owners = ["receiver_1", "receiver_2", "receiver_1_2"];
    let first = owners[0];
    let other = *owners
        .iter()
        .find(|cn| broker.shard_of(cn) != broker.shard_of(first))
        .expect("a receiver on the other shard");
    let mut queues = Vec::new();
    let mut conns = Vec::new();
    for cn in [first, other] {
        let mut r = connect_as(&broker, cn).await;
        for i in 0..4 {
            let q = format!("{cn}_q{i}");
            check(
                &mut r,
                &format!("declare_queue {q}"),
                &format!("OK declare_queue {q}"),
            )
            .await;
            check(
                &mut r,
                &format!("bind {q} ex {cn}"),
                &format!("OK bind {q} ex {cn}"),
            )
            .await;
            queues.push((q, conns.len()));
        }
        conns.push(r);
    }
    // 200 publishes of 10 KB to each receiver, each stored in its four
    // queues: 16 MB held, 16 times the budget.
    let all = ids("f", 200);
    let mut s = connect_as(&broker, "sender_1").await;
    publish_all(&mut s, first, first, &all).await;
    publish_all(&mut s, other, other, &all).await;
    settle(admin, 2, &queues[0].0, 100).await;
    settle(admin, 2, &queues[4].0, 100).await;
    for (q, owner) in &queues {
        let got = drain(&mut conns[*owner], q).await;
        let got: Vec<String> = got.into_iter().map(|(id, _)| id).collect();
        assert_eq!(got, all, "{q}: every message once, in order");
    }
    // Everything acked: the meters are back to nothing.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let memory = metric(admin, "ciphermq_shard_memory_bytes").await;
        if memory.len() == 2 && memory.iter().all(|(_, v)| *v == 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bodies left on the meters: {memory:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_read_back_from_disk_are_dead_lettered_after_max_deliveries() {
    let data = tempfile::tempdir().expect("tempdir");
    let OneQueue {
        broker: _broker,
        admin,
        mut r,
        mut s,
    } = one_queue(data.path(), "max_deliveries = 2").await;
    let queue = QUEUE;
    let all = ids("d", 600);
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    settle(admin, 1, queue, 400).await;
    // d-0 is read back, nacked twice: it moves to the dead-letter queue.
    for _ in 0..2 {
        let got = fetch(&mut r, queue, 1).await;
        assert_eq!(got[0].id, "d-0");
        check(&mut r, &format!("nack d-0 {queue}"), "NACK_CONFIRMED d-0").await;
    }
    let rest = drain(&mut r, queue).await;
    let rest: Vec<String> = rest.into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        rest,
        all[1..].to_vec(),
        "the backlog, in order, without d-0"
    );
    let dead = fetch(&mut r, &format!("{queue}.dlq"), 10).await;
    assert_eq!(
        dead.iter()
            .map(|g| (g.id.as_str(), g.count))
            .collect::<Vec<_>>(),
        [("d-0", 1)]
    );
}

/// Dedup (docs/ARCHITECTURE.md, "Delivery guarantees"): an id is a duplicate
/// while its message is still queued, however long ago it was published; the
/// window only covers acked ones. A body on disk does not change that, nor does
/// a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_on_disk_stays_a_duplicate_past_the_window_and_across_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let perf = "dedup_window_secs = 1";
    let OneQueue {
        mut broker,
        admin,
        r,
        mut s,
    } = one_queue(data.path(), perf).await;
    let all = ids("w", 400);
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    settle(admin, 1, QUEUE, 250).await;
    // Past the window: every retry, on disk or in memory, stores nothing.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    drop(r);
    drop(s);
    broker.stop();

    let broker = start(1, data.path(), "127.0.0.1:0", perf);
    let mut s = connect_as(&broker, "sender_1").await;
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    let mut r = connect_as(&broker, "receiver_1").await;
    let got: Vec<String> = drain(&mut r, QUEUE)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        got.len(),
        all.len(),
        "each message once: 0 lost, 0 duplicated"
    );
    assert_eq!(got, all, "in order");
    // Once acked and past the window, an id may be stored again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    publish_all(&mut s, "receiver_1", "receiver_1", &all[..1]).await;
    let again = fetch(&mut r, QUEUE, 10).await;
    assert_eq!(
        again.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["w-0"]
    );
}

/// The sum over shards of metric `name`.
async fn total(admin: SocketAddr, name: &str) -> u64 {
    metric(admin, name).await.iter().map(|(_, v)| v).sum()
}

/// `purge_queue` of a backlog mostly on disk: the reply counts every ready
/// message, deliveries still owed stay owed, new publishes are served at
/// once, and the purged messages on disk are read through in the
/// background and settled: their acks are logged (a restart brings none
/// back) and their ids age out of the dedup window like acked ones (left
/// marked stored, a later publish with one of them would be taken for a
/// retry and dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_backlog_on_disk_is_gone_for_good_and_its_ids_age_out() {
    let data = tempfile::tempdir().expect("tempdir");
    let perf = "dedup_window_secs = 1";
    let OneQueue {
        mut broker,
        admin,
        mut r,
        mut s,
    } = one_queue(data.path(), perf).await;
    let all = ids("p", 1000);
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    settle(admin, 1, QUEUE, 700).await;
    let held = fetch(&mut r, QUEUE, 3).await;
    assert_eq!(
        held.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["p-0", "p-1", "p-2"]
    );
    // No consumer: nothing more is read back before the purge.
    let on_disk = total(admin, "ciphermq_queue_on_disk").await;
    assert!(on_disk >= 500, "{on_disk} on disk");

    check(
        &mut r,
        &format!("purge_queue {QUEUE}"),
        &format!("OK purge_queue {QUEUE} 997"),
    )
    .await;
    // Published after the purge: served at once, whatever is still being
    // read through.
    let fresh = ids("n", 2);
    publish_all(&mut s, "receiver_1", "receiver_1", &fresh).await;
    let got = fetch(&mut r, QUEUE, 10).await;
    assert_eq!(
        got.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["n-0", "n-1"]
    );
    for g in &got {
        check(
            &mut r,
            &format!("ack {} {QUEUE}", g.id),
            &format!("ACK_CONFIRMED {}", g.id),
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let settled = total(admin, "ciphermq_backlog_purged_messages_total").await;
        if settled == on_disk {
            break;
        }
        assert!(settled < on_disk, "{settled} settled of {on_disk} on disk");
        assert!(
            Instant::now() < deadline,
            "the purge read through {settled} of {on_disk} messages on disk"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the window, an id purged on disk is stored again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    publish_all(&mut s, "receiver_1", "receiver_1", &all[900..901]).await;
    let again = fetch(&mut r, QUEUE, 10).await;
    assert_eq!(
        again.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["p-900"]
    );
    check(&mut r, &format!("ack p-900 {QUEUE}"), "ACK_CONFIRMED p-900").await;
    drop(r);
    drop(s);
    broker.stop();

    // Only the deliveries owed at the purge come back.
    let broker = start(1, data.path(), "127.0.0.1:0", perf);
    let mut r = connect_as(&broker, "receiver_1").await;
    let got = drain(&mut r, QUEUE).await;
    let want: Vec<(String, u32)> = all[..3].iter().map(|id| (id.clone(), 2)).collect();
    assert!(
        got.len() == want.len(),
        "nothing purged comes back: {} messages after the restart, the first {:?}",
        got.len(),
        &got[..got.len().min(6)]
    );
    assert_eq!(got, want, "the deliveries owed at the purge, once more");
}

/// SIGKILL right after `OK purge_queue` of a backlog on disk, while its
/// read-through has settled few of the purged messages: the purge's record
/// keeps the rest gone after the restart, which goes on reading them
/// through: their ids then age out of the dedup window like acked ones.
/// Over 2 shards, twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_a_backlog_on_disk_survives_a_kill() {
    purge_then_kill(3000, "\nmemory_budget_mb = 1").await;
}

/// The same with every message in memory (50 MB under the default budget):
/// the reply does not wait for the purged messages' ack records, which the
/// shard logs as it settles them in slices after it; a kill right after
/// `OK` brings none of them back all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_in_memory_survives_a_kill_before_it_is_settled() {
    purge_then_kill(5000, "").await;
}

/// Publishes `count` messages (10 KB each) over 2 shards with `storage`
/// appended to `[storage]`, holds 3 deliveries, purges, kills, and checks
/// what comes back (twice).
async fn purge_then_kill(count: usize, storage: &str) {
    use common::process::BrokerProcess;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("broker.toml");
    let perf = "\n[performance]\ndedup_window_secs = 1\n";
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, perf).replace(
        r#"mode = "memory""#,
        &format!("mode = \"durable\"{storage}"),
    );
    std::fs::write(&config, text).expect("config");
    let all = ids("k", count);
    let broker = BrokerProcess::start(&config);
    let mut a = broker.connect("admin").await;
    check(&mut a, "declare_exchange ex", "OK declare_exchange ex").await;
    let mut r = broker.connect("receiver_1").await;
    let declare = format!("declare_queue {QUEUE}");
    check(&mut r, &declare, &format!("OK declare_queue {QUEUE}")).await;
    let bind = format!("bind {QUEUE} ex receiver_1");
    check(&mut r, &bind, &format!("OK bind {QUEUE} ex receiver_1")).await;
    let mut s = broker.connect("sender_1").await;
    publish_all(&mut s, "receiver_1", "receiver_1", &all).await;
    let held = fetch(&mut r, QUEUE, 3).await;
    assert_eq!(held.len(), 3);
    check(
        &mut r,
        &format!("purge_queue {QUEUE}"),
        &format!("OK purge_queue {QUEUE} {}", count - 3),
    )
    .await;
    broker.kill();

    // The deliveries owed at the purge come back, nothing purged does.
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    let got = drain(&mut r, QUEUE).await;
    assert!(
        got.len() == 3,
        "nothing purged comes back after a kill: {} messages, the first {:?}",
        got.len(),
        &got[..got.len().min(6)]
    );
    let want: Vec<(String, u32)> = all[..3].iter().map(|id| (id.clone(), 2)).collect();
    assert_eq!(got, want, "the deliveries owed at the purge, once more");
    // The read-through the kill stopped goes on after the restart: past
    // the window, a purged id is stored again, not taken for a retry.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut s = broker.connect("sender_1").await;
    publish_all(&mut s, "receiver_1", "receiver_1", &all[count - 1..]).await;
    let again = fetch(&mut r, QUEUE, 10).await;
    let last = &all[count - 1];
    assert_eq!(
        again.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        [last.as_str()],
        "a purged id, settled after the restart, is a new message"
    );
    check(
        &mut r,
        &format!("ack {last} {QUEUE}"),
        &format!("ACK_CONFIRMED {last}"),
    )
    .await;
    // What it settled stays settled through another kill. (A publish's
    // `ACK` after the ack's line means its commit, and so the ack's, is
    // durable.)
    publish_all(&mut s, "receiver_1", "receiver_1", &["last".to_owned()]).await;
    broker.kill();
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    let left = fetch(&mut r, QUEUE, 100).await;
    assert_eq!(
        left.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["last"]
    );
    assert!(broker.stop().success());
}
