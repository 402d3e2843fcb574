//! `storage.memory_budget_mb` in memory mode: a hard cap on the bodies all
//! queues hold, each shard its even part, shared by that shard's queues.
//! Past it a publish is `NACK <id> queue_full` (never a stall, never an
//! eviction); an ack makes room again; the other shard's part is untouched.

mod common;

use ciphermq_clients::connection::Connection;
use common::*;

/// Body bytes per message: five fit in a shard's part of a 1 MiB budget
/// over 2 shards (512 KiB), a sixth does not.
const CIPHERTEXT_BYTES: usize = 100_000;

/// An envelope for `receiver` whose ciphertext is `CIPHERTEXT_BYTES` of
/// valid base64.
fn big_body(id: &str, receiver: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"{}"}}"#,
        "QUFB".repeat(CIPHERTEXT_BYTES / 4)
    )
}

/// Publishes `id` for `receiver` (routing key = the receiver's CN) and
/// returns the reply.
async fn publish(s: &mut Connection, receiver: &str, id: &str) -> String {
    ask(
        s,
        &format!("publish ex {receiver} {}", big_body(id, receiver)),
    )
    .await
}

/// Declares `queue` as `owner` and binds it to `ex` with `key`.
async fn queue_bound(owner: &mut Connection, queue: &str, key: &str) {
    check(
        owner,
        &format!("declare_queue {queue}"),
        &format!("OK declare_queue {queue}"),
    )
    .await;
    check(
        owner,
        &format!("bind {queue} ex {key}"),
        &format!("OK bind {queue} ex {key}"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_past_its_part_of_the_memory_budget_refuses_publishes_until_acks_free_room() {
    let broker = TestBroker::start_edited(2, "", |text| {
        text.replace(
            r#"mode = "memory""#,
            "mode = \"memory\"\nmemory_budget_mb = 1",
        )
    });
    // Two receivers on different shards.
    let cns = ["receiver_1", "receiver_2", "receiver_1_2"];
    let first = cns[0];
    let other = *cns
        .iter()
        .find(|cn| broker.shard_of(cn) != broker.shard_of(first))
        .expect("a receiver on the other shard");

    let mut admin = connect_as(&broker, "admin").await;
    check(&mut admin, "declare_exchange ex", "OK declare_exchange ex").await;
    let mut r1 = connect_as(&broker, first).await;
    queue_bound(&mut r1, &format!("{first}_queue"), first).await;
    // A second queue of the same receiver lives on the same shard.
    let side_key = format!("{first}.side");
    queue_bound(&mut r1, &format!("{first}_side"), &side_key).await;
    let mut r2 = connect_as(&broker, other).await;
    queue_bound(&mut r2, &format!("{other}_queue"), other).await;

    let mut s = connect_as(&broker, "sender_1").await;
    let body_len = big_body("m-0", first).len() as u64;
    let part = (1u64 << 20) / 2;
    let fit = part / body_len;
    assert!(fit >= 2, "the test needs room for two bodies per shard");
    for i in 0..fit {
        assert_eq!(
            publish(&mut s, first, &format!("m-{i}")).await,
            format!("ACK m-{i}")
        );
    }
    assert_eq!(
        publish(&mut s, first, "over").await,
        "NACK over queue_full",
        "{fit} bodies of {body_len} bytes fill the shard's {part} bytes"
    );
    // The shard's part is shared by its queues: the other queue is full too.
    let side = ask(
        &mut s,
        &format!("publish ex {side_key} {}", big_body("side-0", first)),
    )
    .await;
    assert_eq!(side, "NACK side-0 queue_full");
    // The other shard has its own part.
    assert_eq!(publish(&mut s, other, "o-0").await, "ACK o-0");

    // A delivery still holds its body; its ack frees it.
    let got = fetch(&mut r1, &format!("{first}_queue"), 1).await;
    assert_eq!(ids(&got), ["m-0"]);
    assert_eq!(publish(&mut s, first, "over").await, "NACK over queue_full");
    check(&mut r1, "ack m-0", "ACK_CONFIRMED m-0").await;
    assert_eq!(publish(&mut s, first, "over").await, "ACK over");

    // Nothing was evicted: every accepted message is served, in order.
    let mut want: Vec<String> = (1..fit).map(|i| format!("m-{i}")).collect();
    want.push("over".to_owned());
    let got = fetch(&mut r1, &format!("{first}_queue"), 100).await;
    assert_eq!(ids(&got), want);
}
