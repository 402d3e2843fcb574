//! Taking things away over the wire: `unbind` and `delete_exchange` (their
//! ACL, their replies, routing after them, and that a restart keeps them
//! gone), `close_connection` (an admin ends every connection of a CN, on
//! whichever shard they live; others may not), `purge_queue` (the ready
//! messages go, the owed stay, a restart keeps them gone; a backlog on disk
//! is refused whole), and `delete_queue`, judged by the ACL but not carried
//! out yet.

mod common;

use std::path::Path;

use common::*;

/// Stops `broker` cleanly and starts it again over the same data
/// directory, address and shard count.
fn restart(mut broker: TestBroker, data: &Path) -> TestBroker {
    let (addr, shards) = (broker.addr.clone(), broker.shards);
    broker.stop();
    TestBroker::start_durable_at(shards, data, &addr)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_a_backlog_on_disk_is_refused_whole() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_edited(1, data.path(), "127.0.0.1:0", "", |text| {
        text.replace(
            r#"mode = "memory""#,
            "mode = \"memory\"\nmemory_budget_mb = 1",
        )
    });
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    // About 3 MB of bodies under a 1 MiB budget: most go to disk only.
    const N: usize = 300;
    for window in (0..N).collect::<Vec<_>>().chunks(50) {
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
    let reply = ask(&mut receiver, "purge_queue receiver_1_queue").await;
    assert!(
        reply.starts_with("Error: purge_queue receiver_1_queue: ")
            && reply.contains("on disk only"),
        "{reply}"
    );
    // Nothing was removed: every message is still delivered, in order.
    let mut got = Vec::new();
    while got.len() < N {
        let batch = fetch(&mut receiver, "receiver_1_queue", 100).await;
        assert!(
            !batch.is_empty(),
            "only {} of {N} left after the refused purge",
            got.len()
        );
        for d in &batch {
            check(
                &mut receiver,
                &format!("ack {}", d.id),
                &format!("ACK_CONFIRMED {}", d.id),
            )
            .await;
        }
        got.extend(ids(&batch));
    }
    let expected: Vec<String> = (0..N).map(|i| format!("d-{i}")).collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_queue_is_judged_but_not_carried_out_yet() {
    let broker = TestBroker::start(1);
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut other = connect_as(&broker, "receiver_2").await;
    let reply = ask(&mut other, "delete_queue receiver_1_queue").await;
    assert_denied(&reply, "receiver", "delete_queue");
    check(
        &mut receiver,
        "delete_queue receiver_1_queue",
        "Error: delete_queue is not implemented yet",
    )
    .await;
    // Nothing was removed.
    check(
        &mut receiver,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
    )
    .await;
}
