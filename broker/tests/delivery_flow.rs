//! Sender → broker → receiver over real mTLS, with 1 and 2 shards: pipelining,
//! in-order replies, push and pull delivery, acks, redelivery and dedup.

mod common;

use ciphermq_proto::{Delivery, Reply};
use common::{body, expect, next, setup_receiver, TestBroker};

async fn full_flow(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut receiver = broker.connect("receiver_1").await;
    assert_eq!(receiver.hello().role, "receiver");
    setup_receiver(&mut receiver, "receiver_1").await;
    let sender_cn = broker.sender_on_other_shard("receiver_1");
    let mut sender = broker.connect(sender_cn).await;
    let b = body("m-1", "receiver_1");
    expect(
        &mut sender,
        &format!("publish ex receiver_1 {b}"),
        "ACK m-1",
    )
    .await;
    expect(
        &mut receiver,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
    )
    .await;
    let line = next(&mut receiver).await;
    let d = Delivery::parse(&line).expect("a delivery");
    assert_eq!(
        (d.message_id, d.queue, d.delivery_count, d.body),
        ("m-1", "receiver_1_queue", 1, b.as_str())
    );
    expect(&mut receiver, "ack m-1", "ACK_CONFIRMED m-1").await;
    expect(
        &mut receiver,
        "ack m-1",
        "Error: no outstanding delivery m-1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_to_receiver_with_one_shard() {
    full_flow(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_to_receiver_across_shards() {
    let broker = TestBroker::start(2);
    assert_ne!(
        broker.shard_of(broker.sender_on_other_shard("receiver_1")),
        broker.shard_of("receiver_1")
    );
    drop(broker);
    full_flow(2).await;
}

async fn pipelined(shards: usize) {
    const N: usize = 10_000;
    let broker = TestBroker::start(shards);
    let mut receiver = broker.connect("receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let sender = broker
        .connect(broker.sender_on_other_shard("receiver_1"))
        .await;
    let (mut rd, mut wr) = sender.into_split();
    let writer = tokio::spawn(async move {
        for i in 0..N {
            // Every 100th publish goes nowhere, so NACKs interleave with ACKs.
            let key = if i % 100 == 99 {
                "nobody"
            } else {
                "receiver_1"
            };
            wr.queue_line(&format!(
                "publish ex {key} {}",
                body(&format!("p-{i}"), "receiver_1")
            ));
            if i % 500 == 0 {
                wr.queue_line("heartbeat");
            }
            if i % 1000 == 999 {
                wr.flush().await.expect("flush");
            }
        }
        wr.flush().await.expect("flush");
        wr
    });
    for i in 0..N {
        let line = rd.read_line().await.unwrap().unwrap();
        let expected = if i % 100 == 99 {
            format!("NACK p-{i} no_route")
        } else {
            format!("ACK p-{i}")
        };
        assert_eq!(line, expected, "reply {i} out of order");
        if i % 500 == 0 {
            assert_eq!(rd.read_line().await.unwrap().unwrap(), "OK heartbeat");
        }
    }
    let _wr = writer.await.unwrap();
    // Everything routed arrives, in publish order.
    receiver.queue_line("fetch receiver_1_queue 20000");
    receiver.flush().await.unwrap();
    let mut expected = (0..N).filter(|i| i % 100 != 99);
    loop {
        let line = next(&mut receiver).await;
        match Reply::parse(&line) {
            Reply::Message(d) => {
                assert_eq!(d.message_id, format!("p-{}", expected.next().unwrap()))
            }
            Reply::Ok(rest) => {
                assert_eq!(rest, format!("fetch {}", N - N / 100));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(expected.next().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pipelined_publishes_reply_in_order_one_shard() {
    pipelined(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pipelined_publishes_reply_in_order_across_shards() {
    pipelined(2).await;
}

/// A consumer whose deliveries fill the broker's output past its high-water
/// mark (16 KiB bodies, prefetch 200 ≈ 3 MiB) must still have its acks read
/// once the output drained: input resumes without any new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_are_read_after_a_large_burst_of_deliveries() {
    const N: usize = 200;
    let broker = TestBroker::start(1);
    let mut receiver = broker.connect("receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = broker.connect("sender_1").await;
    let pad = "A".repeat(16 * 1024);
    for i in 0..N {
        let body = body(&format!("big-{i}"), "receiver_1").replace("Y2lwaGVy", &pad);
        sender.queue_line(&format!("publish ex receiver_1 {body}"));
    }
    sender.flush().await.unwrap();
    for i in 0..N {
        assert_eq!(next(&mut sender).await, format!("ACK big-{i}"));
    }
    expect(
        &mut receiver,
        "consume receiver_1_queue 200",
        "OK consume receiver_1_queue",
    )
    .await;
    for i in 0..N {
        let line = next(&mut receiver).await;
        assert!(
            line.starts_with(&format!("Message: big-{i} ")),
            "delivery {i}"
        );
    }
    // Only now, with every delivery written out, the acks arrive.
    for i in 0..N {
        receiver.queue_line(&format!("ack big-{i}"));
    }
    receiver.flush().await.unwrap();
    for i in 0..N {
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), next(&mut receiver))
            .await
            .expect("the broker reads the acks");
        assert_eq!(line, format!("ACK_CONFIRMED big-{i}"));
    }
}

/// `ack_batch` settles many deliveries in one line and counts them: ids
/// not outstanding (unknown, repeated, or from another queue) are skipped,
/// and a line with a bad id settles nothing. What it settled is not
/// redelivered; what it skipped is.
async fn ack_batch_settles_many(shards: usize) {
    let broker = TestBroker::start(shards);
    let mut receiver = broker.connect("receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = broker
        .connect(broker.sender_on_other_shard("receiver_1"))
        .await;
    for i in 0..5 {
        let b = body(&format!("m-{i}"), "receiver_1");
        expect(
            &mut sender,
            &format!("publish ex receiver_1 {b}"),
            &format!("ACK m-{i}"),
        )
        .await;
    }
    expect(
        &mut receiver,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
    )
    .await;
    for i in 0..5 {
        let line = next(&mut receiver).await;
        assert!(
            line.starts_with(&format!("Message: m-{i} receiver_1_queue 1 ")),
            "{line}"
        );
    }
    let bad = next_reply(&mut receiver, "ack_batch receiver_1_queue m-0 b@d").await;
    assert!(bad.starts_with("Error: "), "{bad}");
    expect(
        &mut receiver,
        "ack_batch other_queue m-0 m-1",
        "OK ack_batch other_queue 0",
    )
    .await;
    expect(
        &mut receiver,
        "ack_batch receiver_1_queue m-0 m-1 nope m-1  m-3",
        "OK ack_batch receiver_1_queue 3",
    )
    .await;
    expect(
        &mut receiver,
        "ack m-1",
        "Error: no outstanding delivery m-1",
    )
    .await;
    // The connection goes: only m-2 and m-4 come back.
    drop(receiver);
    let mut receiver = broker.connect("receiver_1").await;
    expect(
        &mut receiver,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
    )
    .await;
    for id in ["m-2", "m-4"] {
        let line = next(&mut receiver).await;
        assert!(
            line.starts_with(&format!("Message: {id} receiver_1_queue 2 ")),
            "{line}"
        );
    }
    expect(
        &mut receiver,
        "ack_batch receiver_1_queue m-2 m-4",
        "OK ack_batch receiver_1_queue 2",
    )
    .await;
    expect(&mut receiver, "heartbeat", "OK heartbeat").await;
}

async fn next_reply(conn: &mut ciphermq_clients::connection::Connection, line: &str) -> String {
    conn.queue_line(line);
    conn.flush().await.unwrap();
    next(conn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_batch_settles_many_with_one_shard() {
    ack_batch_settles_many(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_batch_settles_many_across_shards() {
    ack_batch_settles_many(2).await;
}
