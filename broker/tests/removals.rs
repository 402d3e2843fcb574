//! Taking things away over the wire: `unbind` and `delete_exchange` (their
//! ACL, their replies, routing after them, and that a restart keeps them
//! gone), `close_connection` (an admin ends every connection of a CN, on
//! whichever shard they live; others may not), `purge_queue` (the ready
//! messages go, the owed stay, a restart keeps them gone; a backlog on disk
//! goes too; a large one is settled after its reply), and `delete_queue` (owner or admin; its bindings go, its
//! consumers are told, on one shard or across two; publishes racing it are
//! all answered; a graceful restart, a SIGKILL right after the reply, or a
//! crash in the middle of it never brings it or its messages back, and a
//! queue declared again starts empty).

mod common;

use std::path::Path;

use common::*;

/// Stops `broker` cleanly and starts it again over the same data
/// directory and shard count, on a new port (the old one may have gone to
/// another test's broker by then).
fn restart(mut broker: TestBroker, data: &Path) -> TestBroker {
    let shards = broker.shards;
    broker.stop();
    TestBroker::start_durable_at(shards, data, "127.0.0.1:0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbind_stops_routing_is_owner_only_and_survives_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_at(2, data.path(), "127.0.0.1:0");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(&mut sender, "ex", "receiver_1", "before", "ACK before").await;

    // Another receiver's queue, or another's key: the ACL, before existence.
    let mut other = connect_as(&broker, "receiver_2").await;
    let reply = ask(&mut other, "unbind receiver_1_queue ex receiver_1").await;
    assert_denied(&reply, "receiver", "unbind of another's queue");
    let reply = ask(&mut receiver, "unbind receiver_1_queue ex receiver_2").await;
    assert_denied(&reply, "receiver", "unbind with another's key");
    let reply = ask(&mut sender, "unbind receiver_1_queue ex receiver_1").await;
    assert_eq!(
        reply,
        "Access denied: senders may not unbind queues (role=sender)"
    );
    check(
        &mut receiver,
        "unbind receiver_1_queue nowhere receiver_1",
        "Error: unknown exchange nowhere",
    )
    .await;

    check(
        &mut receiver,
        "unbind receiver_1_queue ex receiver_1",
        "OK unbind receiver_1_queue ex receiver_1",
    )
    .await;
    publish_expect(
        &mut sender,
        "ex",
        "receiver_1",
        "after",
        "NACK after no_route",
    )
    .await;
    // Idempotent: the binding is already gone.
    check(
        &mut receiver,
        "unbind receiver_1_queue ex receiver_1",
        "OK unbind receiver_1_queue ex receiver_1",
    )
    .await;
    // The message published before it is still there.
    let got = fetch(&mut receiver, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["before"]);
    check(&mut receiver, "ack before", "ACK_CONFIRMED before").await;

    drop((receiver, other, sender));
    let broker = restart(broker, data.path());
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(
        &mut sender,
        "ex",
        "receiver_1",
        "restarted",
        "NACK restarted no_route",
    )
    .await;
    // It can be bound again.
    let mut receiver = connect_as(&broker, "receiver_1").await;
    check(
        &mut receiver,
        "bind receiver_1_queue ex receiver_1",
        "OK bind receiver_1_queue ex receiver_1",
    )
    .await;
    publish_expect(&mut sender, "ex", "receiver_1", "again", "ACK again").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_exchange_is_for_its_owner_or_an_admin_and_survives_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_at(1, data.path(), "127.0.0.1:0");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    check(
        &mut receiver,
        "declare_exchange receiver_1_events fanout",
        "OK declare_exchange receiver_1_events",
    )
    .await;
    check(
        &mut receiver,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    check(
        &mut receiver,
        "bind receiver_1_queue receiver_1_events receiver_1",
        "OK bind receiver_1_queue receiver_1_events receiver_1",
    )
    .await;
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(&mut sender, "receiver_1_events", "x", "m1", "ACK m1").await;

    let mut other = connect_as(&broker, "receiver_2").await;
    assert_eq!(
        ask(&mut other, "delete_exchange receiver_1_events").await,
        "Access denied: receivers may only delete exchanges they own (role=receiver)"
    );
    assert_eq!(
        ask(&mut sender, "delete_exchange receiver_1_events").await,
        "Access denied: senders may not delete exchanges (role=sender)"
    );
    check(
        &mut receiver,
        "delete_exchange receiver_1_events",
        "OK delete_exchange receiver_1_events",
    )
    .await;
    publish_expect(
        &mut sender,
        "receiver_1_events",
        "x",
        "m2",
        "NACK m2 no_route",
    )
    .await;
    check(
        &mut receiver,
        "delete_exchange receiver_1_events",
        "Error: unknown exchange receiver_1_events",
    )
    .await;
    // An admin may delete any exchange, e.g. one nobody owns.
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange shared",
        "OK declare_exchange shared",
    )
    .await;
    check(
        &mut admin,
        "delete_exchange shared",
        "OK delete_exchange shared",
    )
    .await;
    // The queue and its message are untouched.
    let got = fetch(&mut receiver, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["m1"]);

    drop((receiver, other, sender, admin));
    let broker = restart(broker, data.path());
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(
        &mut sender,
        "receiver_1_events",
        "x",
        "m3",
        "NACK m3 no_route",
    )
    .await;
    // The name is free again: its next declaration owns it anew.
    let mut receiver = connect_as(&broker, "receiver_1").await;
    check(
        &mut receiver,
        "declare_exchange receiver_1_events direct",
        "OK declare_exchange receiver_1_events",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_connection_ends_every_connection_of_a_cn_and_only_admins_may() {
    let broker = TestBroker::start(2);
    let mut first = connect_as(&broker, "sender_1").await;
    let mut second = connect_as(&broker, "sender_1").await;
    let mut bystander = connect_as(&broker, "sender_2").await;
    // The admin may live on another shard than sender_1's connections.
    let mut admin = connect_as(&broker, "admin").await;

    let mut receiver = connect_as(&broker, "receiver_1").await;
    assert_eq!(
        ask(&mut receiver, "close_connection sender_1").await,
        "Access denied: only admins may close connections (role=receiver)"
    );
    assert_eq!(
        ask(&mut first, "close_connection sender_2").await,
        "Access denied: only admins may close connections (role=sender)"
    );
    check(&mut first, "heartbeat", "OK heartbeat").await;

    check(
        &mut admin,
        "close_connection sender_1",
        "OK close_connection sender_1 2",
    )
    .await;
    // Idle connections too: they are woken to end.
    assert_closed(&mut first).await;
    assert_closed(&mut second).await;
    check(&mut bystander, "heartbeat", "OK heartbeat").await;
    check(
        &mut admin,
        "close_connection nobody",
        "OK close_connection nobody 0",
    )
    .await;

    // The CN may connect again; the closing was for the connections open then.
    let mut again = connect_as(&broker, "sender_1").await;
    check(&mut again, "heartbeat", "OK heartbeat").await;
    check(&mut admin, "heartbeat", "OK heartbeat").await;
}

/// A 10 kB envelope, so a few hundred of them pass a 1 MiB memory budget.
fn big_body(id: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"{}"}}"#,
        "QUFB".repeat(2_500)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_drops_the_ready_keeps_the_owed_and_survives_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    // Two shards: the admin's purge may travel to the queue's shard.
    let broker = TestBroker::start_durable_at(2, data.path(), "127.0.0.1:0");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    for i in 0..6 {
        let id = format!("p-{i}");
        publish_expect(&mut sender, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
    }
    // Two are owed to the receiver when the purge comes.
    let owed = fetch(&mut receiver, "receiver_1_queue", 2).await;
    assert_eq!(ids(&owed), ["p-0", "p-1"]);

    let reply = ask(
        &mut connect_as(&broker, "receiver_2").await,
        "purge_queue receiver_1_queue",
    )
    .await;
    assert_denied(&reply, "receiver", "purge of another's queue");
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "purge_queue receiver_1_queue",
        "OK purge_queue receiver_1_queue 4",
    )
    .await;
    check(
        &mut admin,
        "purge_queue receiver_1_queue",
        "OK purge_queue receiver_1_queue 0",
    )
    .await;
    check(
        &mut admin,
        "purge_queue nowhere",
        "Error: unknown queue nowhere",
    )
    .await;
    assert!(fetch(&mut receiver, "receiver_1_queue", 10)
        .await
        .is_empty());
    // A purged message's retry within the dedup window is not stored again.
    publish_expect(&mut sender, "ex", "receiver_1", "p-3", "ACK p-3").await;
    assert!(fetch(&mut receiver, "receiver_1_queue", 10)
        .await
        .is_empty());
    // New messages flow as before.
    publish_expect(&mut sender, "ex", "receiver_1", "p-new", "ACK p-new").await;
    assert_eq!(
        ids(&fetch(&mut receiver, "receiver_1_queue", 10).await),
        ["p-new"]
    );
    check(&mut receiver, "ack p-new", "ACK_CONFIRMED p-new").await;
    // The owed deliveries are still the receiver's to settle; one is acked.
    check(&mut receiver, "ack p-0", "ACK_CONFIRMED p-0").await;

    // After a clean restart only the delivery never acked comes back.
    drop((receiver, sender, admin));
    let broker = restart(broker, data.path());
    let mut receiver = connect_as(&broker, "receiver_1").await;
    assert_eq!(
        ids(&fetch(&mut receiver, "receiver_1_queue", 10).await),
        ["p-1"]
    );
}

/// A purge answers before it settles what it took from memory: that is
/// done after the reply, a slice at a time between the shard's other work.
/// Each purged id is then remembered as acked for the dedup window, and
/// forgotten past it (a publish of it is then a new message): it would stay
/// a duplicate for ever if the settling never ran. In memory and durable
/// mode, over 2 shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_purge_in_memory_is_settled_after_its_reply() {
    const N: usize = 5000;
    for durable in [false, true] {
        let data = tempfile::tempdir().expect("tempdir");
        let extra = "[performance]\ndedup_window_secs = 1\n";
        let broker = if durable {
            TestBroker::start_durable_with(2, data.path(), "127.0.0.1:0", extra)
        } else {
            TestBroker::start_with(2, extra)
        };
        let mut receiver = connect_as(&broker, "receiver_1").await;
        setup_receiver(&mut receiver, "receiver_1").await;
        let all: Vec<String> = (0..N).map(|i| format!("l-{i}")).collect();
        let answers = process::publish_pipelined(&broker.addr, "sender_1", &all, 200).await;
        assert!(answers
            .iter()
            .all(|(id, reply)| *reply == format!("ACK {id}")));
        assert_eq!(answers.len(), N);
        let mut admin = connect_as(&broker, "admin").await;
        check(
            &mut admin,
            "purge_queue receiver_1_queue",
            &format!("OK purge_queue receiver_1_queue {N}"),
        )
        .await;
        let mut sender = connect_as(&broker, "sender_1").await;
        // Within the window (settled or not yet): a duplicate.
        publish_expect(&mut sender, "ex", "receiver_1", "l-17", "ACK l-17").await;
        assert!(fetch(&mut receiver, "receiver_1_queue", 10)
            .await
            .is_empty());
        // Past it: settled, then forgotten, so stored as a new message.
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        let last = &all[N - 1];
        publish_expect(
            &mut sender,
            "ex",
            "receiver_1",
            last,
            &format!("ACK {last}"),
        )
        .await;
        assert_eq!(
            ids(&fetch(&mut receiver, "receiver_1_queue", 10).await),
            std::slice::from_ref(last),
            "durable: {durable}"
        );
    }
}

/// `purge_queue` of a backlog mostly on disk, over 2 shards, from the
/// owner's and the admin's connections: every ready message goes at once
/// (those on disk are settled by a read in the background; see
/// `backlog_on_disk.rs` for the restart), and what is published after it is
/// delivered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_takes_a_backlog_on_disk_too() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_edited(2, data.path(), "127.0.0.1:0", "", |text| {
        text.replace(
            r#"mode = "memory""#,
            "mode = \"memory\"\nmemory_budget_mb = 1",
        )
    });
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    let mut admin = connect_as(&broker, "admin").await;
    // About 3 MB of bodies under a 1 MiB budget: most go to disk only.
    const N: usize = 300;
    let publish = |from: usize, to: usize| (from..to).collect::<Vec<_>>();
    for window in publish(0, N).chunks(50) {
        for i in window {
            send(
                &mut sender,
                &format!("publish ex receiver_1 {}", big_body(&format!("d-{i}"))),
            )
            .await;
        }
        flush_t(&mut sender).await;
        for i in window {
            assert_eq!(line(&mut sender).await, format!("ACK d-{i}"));
        }
    }
    check(
        &mut receiver,
        "purge_queue receiver_1_queue",
        &format!("OK purge_queue receiver_1_queue {N}"),
    )
    .await;
    // Nothing left to purge, while the purged backlog may still be read
    // through; nothing to fetch.
    check(
        &mut admin,
        "purge_queue receiver_1_queue",
        "OK purge_queue receiver_1_queue 0",
    )
    .await;
    assert!(fetch(&mut receiver, "receiver_1_queue", 100)
        .await
        .is_empty());
    // Published after the purge: delivered at once.
    check(
        &mut sender,
        &format!("publish ex receiver_1 {}", big_body("after")),
        "ACK after",
    )
    .await;
    assert_eq!(
        ids(&fetch(&mut receiver, "receiver_1_queue", 100).await),
        ["after"]
    );
}

/// `delete_queue` on 1 and 2 shards (on two, the queue of `owner` lives on
/// another shard than the deleting admin's connection): the ACL, the
/// consumer told, its connection kept, routing gone, pipelined replies in
/// order, and a queue declared again under the name starting empty.
async fn delete_queue_over(shards: usize, owner: &str, other: &str) {
    let q = format!("{owner}_queue");
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_at(shards, data.path(), "127.0.0.1:0");
    if shards > 1 {
        assert_ne!(
            broker.shard_of("admin"),
            broker.shard_of(owner),
            "the admin's connection lives on another shard than the queue"
        );
    }
    let mut receiver = connect_as(&broker, owner).await;
    setup_receiver(&mut receiver, owner).await;
    let mut consumer = connect_as(&broker, owner).await;
    check(
        &mut consumer,
        &format!("consume {q} 1"),
        &format!("OK consume {q}"),
    )
    .await;
    let mut sender = connect_as(&broker, "sender_1").await;
    for id in ["d-0", "d-1", "d-2"] {
        publish_for(&mut sender, "ex", owner, owner, id, &format!("ACK {id}")).await;
    }
    // Prefetch 1: one delivery is owed to the consumer, two wait ready.
    assert_eq!(next_delivery(&mut consumer).await.id, "d-0");

    // The ACL comes first: senders and other receivers, whether or not the
    // queue exists.
    assert_eq!(
        ask(&mut sender, &format!("delete_queue {q}")).await,
        "Access denied: senders may not delete queues (role=sender)"
    );
    let mut stranger = connect_as(&broker, other).await;
    let reply = ask(&mut stranger, &format!("delete_queue {q}")).await;
    assert_denied(&reply, "receiver", "delete_queue of another's queue");
    let reply = ask(&mut stranger, &format!("delete_queue {owner}_nowhere")).await;
    assert_denied(
        &reply,
        "receiver",
        "delete_queue of another's unknown queue",
    );
    check(
        &mut receiver,
        &format!("delete_queue {owner}_nowhere"),
        &format!("Error: unknown queue {owner}_nowhere"),
    )
    .await;

    // The admin deletes it, pipelined between other commands: replies stay
    // in command order.
    let mut admin = connect_as(&broker, "admin").await;
    admin.queue_line("heartbeat");
    admin.queue_line(&format!("delete_queue {q}"));
    admin.queue_line(&format!("delete_queue {q}"));
    admin.queue_line("heartbeat");
    flush_t(&mut admin).await;
    assert_eq!(line(&mut admin).await, "OK heartbeat");
    assert_eq!(line(&mut admin).await, format!("OK delete_queue {q}"));
    assert_eq!(line(&mut admin).await, format!("Error: unknown queue {q}"));
    assert_eq!(line(&mut admin).await, "OK heartbeat");

    // The consumer is told, and its connection stays open; what it was owed
    // is owed no more.
    assert_eq!(
        line(&mut consumer).await,
        format!("Error: queue {q} deleted")
    );
    check(
        &mut consumer,
        "ack d-0",
        "Error: no outstanding delivery d-0",
    )
    .await;
    check(&mut consumer, "heartbeat", "OK heartbeat").await;
    check(
        &mut consumer,
        &format!("consume {q}"),
        &format!("Error: unknown queue {q}"),
    )
    .await;
    // Its binding went with it.
    publish_for(&mut sender, "ex", owner, owner, "d-3", "NACK d-3 no_route").await;
    check(
        &mut receiver,
        &format!("bind {q} ex {owner}"),
        &format!("Error: unknown queue {q}"),
    )
    .await;

    // Declared again, by its owner this time: empty, and its own again.
    check(
        &mut receiver,
        &format!("declare_queue {q}"),
        &format!("OK declare_queue {q}"),
    )
    .await;
    assert!(fetch(&mut receiver, &q, 10).await.is_empty());
    check(
        &mut receiver,
        &format!("bind {q} ex {owner}"),
        &format!("OK bind {q} ex {owner}"),
    )
    .await;
    publish_for(&mut sender, "ex", owner, owner, "d-new", "ACK d-new").await;
    assert_eq!(ids(&fetch(&mut receiver, &q, 10).await), ["d-new"]);
    check(&mut receiver, "ack d-new", "ACK_CONFIRMED d-new").await;
    // Its owner may delete it too; nobody is left to tell.
    check(
        &mut receiver,
        &format!("delete_queue {q}"),
        &format!("OK delete_queue {q}"),
    )
    .await;
    assert_silent(
        &mut consumer,
        std::time::Duration::from_millis(200),
        "no longer a consumer of it",
    )
    .await;
    // Nothing of it is left on disk once its files are freed.
    let look = || -> Vec<String> {
        std::fs::read_dir(data.path().join("queues"))
            .expect("queues/")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&q))
            .collect()
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let left = look();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still under queues/: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_queue_on_one_shard() {
    delete_queue_over(1, "receiver_1", "receiver_2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_queue_across_shards() {
    delete_queue_over(2, "receiver_2", "receiver_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_stays_deleted_after_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_at(2, data.path(), "127.0.0.1:0");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    for i in 0..5 {
        let id = format!("old-{i}");
        publish_expect(&mut sender, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
    }
    check(
        &mut receiver,
        "delete_queue receiver_1_queue",
        "OK delete_queue receiver_1_queue",
    )
    .await;

    drop((receiver, sender));
    let broker = restart(broker, data.path());
    let mut receiver = connect_as(&broker, "receiver_1").await;
    check(
        &mut receiver,
        "consume receiver_1_queue",
        "Error: unknown queue receiver_1_queue",
    )
    .await;
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(&mut sender, "ex", "receiver_1", "x", "NACK x no_route").await;
    // Declared again after the restart: none of the old messages.
    setup_receiver(&mut receiver, "receiver_1").await;
    assert!(fetch(&mut receiver, "receiver_1_queue", 10)
        .await
        .is_empty());
    publish_expect(&mut sender, "ex", "receiver_1", "new", "ACK new").await;
    assert_eq!(
        ids(&fetch(&mut receiver, "receiver_1_queue", 10).await),
        ["new"]
    );
}

/// SIGKILL right after `OK delete_queue`: the queue does not come back,
/// neither from `topology.json` nor from its log directory, and a queue
/// declared again under its name never serves its old messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_stays_deleted_after_a_kill() {
    use common::process::BrokerProcess;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    std::fs::write(&config, text).unwrap();
    for round in 0..3 {
        let broker = BrokerProcess::start(&config);
        let mut receiver = broker.connect("receiver_1").await;
        if round == 0 {
            setup_receiver(&mut receiver, "receiver_1").await;
        } else {
            // Whatever the kill left, the old messages are not served.
            check(
                &mut receiver,
                "consume receiver_1_queue",
                "Error: unknown queue receiver_1_queue",
            )
            .await;
            setup_receiver(&mut receiver, "receiver_1").await;
            assert!(
                fetch(&mut receiver, "receiver_1_queue", 100)
                    .await
                    .is_empty(),
                "round {round}: a queue declared again starts empty"
            );
        }
        let mut sender = broker.connect("sender_1").await;
        for i in 0..20 {
            let id = format!("r{round}-{i}");
            publish_expect(&mut sender, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
        }
        // A consumer holds some of them when the queue goes.
        let mut consumer = broker.connect("receiver_1").await;
        check(
            &mut consumer,
            "consume receiver_1_queue 5",
            "OK consume receiver_1_queue",
        )
        .await;
        assert_eq!(next_delivery(&mut consumer).await.id, format!("r{round}-0"));
        let mut admin = broker.connect("admin").await;
        check(
            &mut admin,
            "delete_queue receiver_1_queue",
            "OK delete_queue receiver_1_queue",
        )
        .await;
        broker.kill();
    }
    let broker = BrokerProcess::start(&config);
    let mut receiver = broker.connect("receiver_1").await;
    check(
        &mut receiver,
        "fetch receiver_1_queue",
        "Error: unknown queue receiver_1_queue",
    )
    .await;
    let topology = std::fs::read_to_string(dir.path().join("data/topology.json")).unwrap();
    assert!(
        !topology.contains("receiver_1_queue"),
        "neither declared nor being deleted: {topology}"
    );
    let queues: Vec<String> = std::fs::read_dir(dir.path().join("data/queues"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        queues.iter().all(|n| !n.starts_with("receiver_1_queue")),
        "{queues:?}"
    );
    assert!(broker.stop().success());
}

/// A start after a crash between saving the deletion and moving the log
/// away (the topology records the queue as being deleted, its directory is
/// still there) removes the directory rather than adopting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_finishes_a_deletion_a_crash_interrupted() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_at(1, data.path(), "127.0.0.1:0");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    for i in 0..5 {
        let id = format!("kept-{i}");
        publish_expect(&mut sender, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
    }
    drop((receiver, sender));
    let shards = broker.shards;
    let mut broker = broker;
    broker.stop();
    // What the crash left: the deletion saved, the directory not moved yet,
    // and a directory of an earlier deletion not yet freed.
    let queues = data.path().join("queues");
    let aside = queues.join("other~deleted-1-0");
    std::fs::create_dir(&aside).unwrap();
    std::fs::write(aside.join("segment-00000000000000000000.log"), b"x").unwrap();
    let path = data.path().join("topology.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut saved: serde_json::Value = serde_json::from_str(&text).unwrap();
    let listed = saved["queues"].as_array_mut().unwrap();
    listed.retain(|q| q["name"] != "receiver_1_queue");
    for ex in saved["exchanges"].as_array_mut().unwrap() {
        ex["bindings"] = serde_json::json!([]);
    }
    saved["deleting"] = serde_json::json!(["receiver_1_queue"]);
    std::fs::write(&path, serde_json::to_vec_pretty(&saved).unwrap()).unwrap();
    assert!(queues.join("receiver_1_queue").is_dir());

    let broker = TestBroker::start_durable_at(shards, data.path(), "127.0.0.1:0");
    assert!(
        !queues.join("receiver_1_queue").exists(),
        "removed, not adopted"
    );
    assert!(!aside.exists(), "an interrupted removal is finished");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    check(
        &mut receiver,
        "consume receiver_1_queue",
        "Error: unknown queue receiver_1_queue",
    )
    .await;
    check(
        &mut receiver,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    assert!(fetch(&mut receiver, "receiver_1_queue", 10)
        .await
        .is_empty());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("deleting"), "the record is cleared: {text}");
}

/// Publishes streaming into a queue while it is deleted are every one
/// answered: `ACK` (stored before the deletion, into a queue now gone) or,
/// once nothing routes there, `NACK <id> no_route`. None is left waiting
/// for a commit of the deleted queue's log, on one shard or across two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_racing_a_delete_queue_are_all_answered() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for shards in [1, 2] {
        let data = tempfile::tempdir().expect("tempdir");
        let broker = TestBroker::start_durable_at(shards, data.path(), "127.0.0.1:0");
        let mut receiver = connect_as(&broker, "receiver_1").await;
        setup_receiver(&mut receiver, "receiver_1").await;
        let mut sender = connect_as(&broker, "sender_1").await;
        let deleted = Arc::new(AtomicBool::new(false));
        let seen = deleted.clone();
        let publisher = tokio::spawn(async move {
            let (mut acked, mut unrouted) = (0u32, 0u32);
            let mut n = 0u32;
            // Windows of 100 until some were refused after the deletion.
            while !(seen.load(Ordering::Acquire) && unrouted > 0) {
                let ids: Vec<String> = (n..n + 100).map(|i| format!("m{i}")).collect();
                n += 100;
                for id in &ids {
                    sender.queue_line(&format!("publish ex receiver_1 {}", body(id, "receiver_1")));
                }
                flush_t(&mut sender).await;
                for id in &ids {
                    let reply = line(&mut sender).await;
                    if reply == format!("ACK {id}") {
                        acked += 1;
                    } else {
                        assert_eq!(reply, format!("NACK {id} no_route"), "shards={shards}");
                        unrouted += 1;
                    }
                }
                assert!(n < 1_000_000, "the deletion never took effect");
            }
            (acked, unrouted)
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        check(
            &mut receiver,
            "delete_queue receiver_1_queue",
            "OK delete_queue receiver_1_queue",
        )
        .await;
        deleted.store(true, Ordering::Release);
        let (acked, unrouted) = publisher.await.expect("publisher");
        assert!(
            acked > 0 && unrouted > 0,
            "{acked} acked, {unrouted} refused"
        );
    }
}
