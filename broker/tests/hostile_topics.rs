//! Every command has a bounded cost (docs/PROTOCOL.md, "Routing key limits"):
//! topic bindings built to make routing explode (many `#`, kept apart or in a
//! run) are either refused at bind or routed promptly, while another client of
//! the same shard is served; bindings over the word or `#` caps get an
//! `Error: …` with the reason, and a publish whose key has more words than the
//! cap is `NACK <id> invalid`.
//!
//! With a backtracking matcher, the first test stalls the shard for far longer
//! than the helpers' 10 s timeouts (a 32-word key against `receiver_1` and a
//! run of `#` tries every way of splitting the key between the `#`s), so it
//! fails there without any timing threshold of its own.

mod common;

use ciphermq_clients::connection::Connection;
use ciphermq_proto::name::{MAX_PATTERN_HASHES, MAX_ROUTING_KEY_WORDS};
use common::*;

/// `receiver_1` with topic exchange `bombs` and its queue `receiver_1_queue`.
async fn receiver_with_topic_exchange(broker: &TestBroker) -> Connection {
    let mut r = connect_as(broker, "receiver_1").await;
    check(
        &mut r,
        "declare_exchange bombs topic",
        "OK declare_exchange bombs",
    )
    .await;
    check(
        &mut r,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    r
}

/// `receiver_1` followed by `words` more words `w`.
fn key_of(words: usize, w: &str) -> String {
    format!("receiver_1{}", format!(".{w}").repeat(words))
}

/// The reported bomb (a long run of `#`), `#` kept apart by `*` only (one run
/// of wildcards, stored as `*`s and one `#`), and `#` kept apart by a word, at
/// the cap: all bind. Then a sender pipelines publishes of a key of the
/// longest accepted length that every pattern matches, and another client of
/// the same shard asks for a heartbeat meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_bomb_is_routed_promptly_and_the_shard_keeps_serving() {
    // One shard: the receiver, both senders and the queue share it.
    let broker = TestBroker::start(1);
    let mut r = receiver_with_topic_exchange(&broker).await;
    let spaced = ".#.x".repeat(MAX_PATTERN_HASHES - 1);
    let starred = ".#.*".repeat(MAX_PATTERN_HASHES - 1);
    let patterns = [
        key_of(100, "#"),
        format!("receiver_1{spaced}.#"),
        format!("receiver_1{starred}.#"),
    ];
    for p in &patterns {
        check(
            &mut r,
            &format!("bind receiver_1_queue bombs {p}"),
            &format!("OK bind receiver_1_queue bombs {p}"),
        )
        .await;
    }

    let mut sender = connect_as(&broker, "sender_1").await;
    let mut other = connect_as(&broker, "sender_2").await;
    let key = key_of(MAX_ROUTING_KEY_WORDS - 1, "x");
    const PUBLISHES: usize = 20;
    for i in 0..PUBLISHES {
        let id = format!("bomb-{i}");
        sender.queue_line(&format!("publish bombs {key} {}", body(&id, "receiver_1")));
    }
    flush_t(&mut sender).await;
    // Served while (or after) the shard routes the bombs, within the timeout.
    check(&mut other, "heartbeat", "OK heartbeat").await;
    for i in 0..PUBLISHES {
        assert_eq!(line(&mut sender).await, format!("ACK bomb-{i}"));
    }
    check(&mut other, "heartbeat", "OK heartbeat").await;

    // Three matching bindings of one queue: one copy of each message.
    let got = fetch(&mut r, "receiver_1_queue", 100).await;
    let want: Vec<String> = (0..PUBLISHES).map(|i| format!("bomb-{i}")).collect();
    assert_eq!(ids(&got), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_over_the_caps_are_refused_with_their_reason() {
    let broker = TestBroker::start(1);
    let mut r = receiver_with_topic_exchange(&broker).await;
    let too_many_hashes = format!("receiver_1{}", ".#.x".repeat(MAX_PATTERN_HASHES + 1));
    check(
        &mut r,
        &format!("bind receiver_1_queue bombs {too_many_hashes}"),
        &format!(
            "Error: routing key has more than {MAX_PATTERN_HASHES} # wildcards (# separated only by * count once)"
        ),
    )
    .await;
    let too_many_words = key_of(MAX_ROUTING_KEY_WORDS, "*");
    check(
        &mut r,
        &format!("bind receiver_1_queue bombs {too_many_words}"),
        &format!("Error: routing key has more than {MAX_ROUTING_KEY_WORDS} words"),
    )
    .await;
    // Invalid characters keep their reply.
    check(
        &mut r,
        "bind receiver_1_queue bombs receiver_1.a/b",
        "Error: invalid routing key name",
    )
    .await;
    // The connection stays usable, and the refused bindings route nothing.
    check(&mut r, "heartbeat", "OK heartbeat").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    let would_match = key_of(MAX_PATTERN_HASHES + 1, "x");
    publish_expect(
        &mut sender,
        "bombs",
        &would_match,
        "refused-1",
        "NACK refused-1 no_route",
    )
    .await;
    // At the caps, the same shapes bind.
    let at_cap = format!("receiver_1{}", ".#.x".repeat(MAX_PATTERN_HASHES));
    check(
        &mut r,
        &format!("bind receiver_1_queue bombs {at_cap}"),
        &format!("OK bind receiver_1_queue bombs {at_cap}"),
    )
    .await;
    publish_expect(&mut sender, "bombs", &would_match, "ok-1", "ACK ok-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_the_word_cap_is_nack_invalid() {
    let broker = TestBroker::start(1);
    let mut r = receiver_with_topic_exchange(&broker).await;
    check(
        &mut r,
        "bind receiver_1_queue bombs receiver_1.#",
        "OK bind receiver_1_queue bombs receiver_1.#",
    )
    .await;
    setup_receiver(&mut r, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    let longest = key_of(MAX_ROUTING_KEY_WORDS - 1, "x");
    let too_long = key_of(MAX_ROUTING_KEY_WORDS, "x");
    publish_expect(&mut sender, "bombs", &longest, "fits", "ACK fits").await;
    // Whatever the exchange type, before routing.
    for ex in ["bombs", "ex"] {
        publish_expect(
            &mut sender,
            ex,
            &too_long,
            &format!("long-{ex}"),
            &format!("NACK long-{ex} invalid"),
        )
        .await;
    }
    // Empty words count too.
    let dots = format!("receiver_1{}", ".".repeat(MAX_ROUTING_KEY_WORDS));
    publish_expect(&mut sender, "bombs", &dots, "dots", "NACK dots invalid").await;
    // publish_batch: one NACK per element.
    send(
        &mut sender,
        &format!(
            "publish_batch bombs {too_long} [{},{}]",
            body("b-1", "receiver_1"),
            body("b-2", "receiver_1")
        ),
    )
    .await;
    assert_eq!(line(&mut sender).await, "NACK b-1 invalid");
    assert_eq!(line(&mut sender).await, "NACK b-2 invalid");
    // Only the message that fitted was stored.
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["fits"]);
}
