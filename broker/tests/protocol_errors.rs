//! docs/PROTOCOL.md: every error reply of the wire protocol, and the framing rules
//! (line limit, UTF-8, empty lines, `\r\n`, `quit`), checked over real mTLS. A
//! bad line never costs the connection, and garbage on one connection never
//! disturbs another.

mod common;

use std::time::Duration;

use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::*;
use tokio::io::AsyncWriteExt;

/// Exchange `ex` (direct) with `receiver_1_queue` bound by key `receiver_1`.
async fn routed(broker: &TestBroker) -> Connection {
    let mut admin = connect_as(broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    check(
        &mut admin,
        "declare_queue receiver_1_queue",
        "OK declare_queue receiver_1_queue",
    )
    .await;
    check(
        &mut admin,
        "bind receiver_1_queue ex receiver_1",
        "OK bind receiver_1_queue ex receiver_1",
    )
    .await;
    admin
}

/// A valid body of exactly `len` bytes (padding the ciphertext).
fn body_of_len(id: &str, len: usize) -> String {
    let head = format!(
        r#"{{"message_id":"{id}","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":""#
    );
    let tail = r#""}"#;
    let pad = len
        .checked_sub(head.len() + tail.len())
        .expect("len too small");
    let b = format!("{head}{}{tail}", "A".repeat(pad));
    assert_eq!(b.len(), len);
    b
}

/// The connection still answers in order.
async fn usable(conn: &mut Connection) {
    check(conn, "heartbeat", "OK heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_command_is_an_error() {
    let broker = TestBroker::start(1);
    let mut c = connect_as(&broker, "admin").await;
    for cmd in [
        "frobnicate",
        "frobnicate a b c",
        "hello",
        "publishx ex k {}",
        "heartbeats",
        "OK heartbeat",
    ] {
        check_error(&mut c, cmd).await;
    }
    usable(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_arity_is_an_error_for_every_command() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    for cmd in [
        "declare_queue",
        "declare_queue receiver_1_a receiver_1_b",
        "declare_exchange",
        "declare_exchange e2 direct extra",
        "bind",
        "bind receiver_1_queue",
        "bind receiver_1_queue ex",
        "bind receiver_1_queue ex k extra",
        "consume",
        "consume receiver_1_queue 1 2",
        "fetch",
        "fetch receiver_1_queue 1 2",
        "ack",
        "ack m-1 receiver_1_queue extra",
        "nack",
        "nack m-1 receiver_1_queue extra",
        "resend now",
        "register_public_key",
        "register_public_key AAAA AAAA",
        "get_public_key",
        "get_public_key receiver_1 receiver_2",
        "heartbeat now",
        "quit now",
        "publish",
        "publish ex",
        "publish ex receiver_1",
        "publish_batch",
        "publish_batch ex",
        "publish_batch ex receiver_1",
    ] {
        check_error(&mut c, cmd).await;
    }
    // `quit now` did not close; `declare_exchange e2 direct extra` created nothing.
    usable(&mut c).await;
    check(
        &mut c,
        "bind receiver_1_queue e2 k",
        "Error: unknown exchange e2",
    )
    .await;
    check(
        &mut c,
        "bind receiver_1_a ex k",
        "Error: unknown queue receiver_1_a",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_breaking_the_name_rule_are_errors() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    let long = "q".repeat(256);
    for cmd in [
        "declare_queue bad/name".to_owned(),
        format!("declare_queue {long}"),
        "declare_queue é".to_owned(),
        "declare_queue q*".to_owned(),
        "declare_queue q#".to_owned(),
        "declare_queue q,1".to_owned(),
        "declare_exchange e/x".to_owned(),
        "declare_exchange e# topic".to_owned(),
        "declare_exchange e sideways".to_owned(),
        "bind bad/q ex k".to_owned(),
        "bind receiver_1_queue e/x k".to_owned(),
        "bind receiver_1_queue ex k/1".to_owned(),
        "consume bad/q".to_owned(),
        "fetch bad/q".to_owned(),
        "ack m/1".to_owned(),
        "ack m-1 bad/q".to_owned(),
        "nack m/1".to_owned(),
        "nack m-1 bad/q".to_owned(),
        "get_public_key a/b".to_owned(),
        format!("get_public_key {long}"),
        // Counts must be positive integers.
        "consume receiver_1_queue abc".to_owned(),
        "consume receiver_1_queue -1".to_owned(),
        "fetch receiver_1_queue x".to_owned(),
        "fetch receiver_1_queue 1.5".to_owned(),
        "fetch receiver_1_queue -3".to_owned(),
    ] {
        check_error(&mut c, &cmd).await;
    }
    // None of them declared anything.
    check(&mut c, "bind q ex k", "Error: unknown queue q").await;
    // The whole alphabet, and 255 characters, are fine.
    check(
        &mut c,
        "declare_queue a.b:c-d_E9",
        "OK declare_queue a.b:c-d_E9",
    )
    .await;
    // A queue name leaves room for its dead-letter queue's `.dlq`.
    let max = "q".repeat(251);
    check(
        &mut c,
        &format!("declare_queue {max}"),
        &format!("OK declare_queue {max}"),
    )
    .await;
    check(
        &mut c,
        &format!("declare_queue {}", "q".repeat(252)),
        "Error: invalid queue name: at most 251 bytes, so that its dead-letter queue <queue>.dlq fits the 255-byte name rule",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_bad_exchange_or_key_name_is_nack_invalid() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    check(
        &mut c,
        &format!("publish e/x receiver_1 {}", body("n-1", "receiver_1")),
        "NACK n-1 invalid",
    )
    .await;
    check(
        &mut c,
        &format!("publish ex k/1 {}", body("n-2", "receiver_1")),
        "NACK n-2 invalid",
    )
    .await;
    check(
        &mut c,
        &format!("publish ex receiver_1.* {}", body("n-3", "receiver_1")),
        "NACK n-3 invalid",
    )
    .await;
    assert!(fetch(&mut c, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_non_json_body_is_invalid_message() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    for b in [
        "not json",
        "{",
        r#"{"message_id":"x-1","#,
        "[1, 2]",
        "\"just a string\"",
        "42",
        r#"{"message_id":"x-2"} trailing"#,
    ] {
        check(
            &mut c,
            &format!("publish ex receiver_1 {b}"),
            "Error: invalid message",
        )
        .await;
    }
    assert!(fetch(&mut c, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_without_a_readable_message_id_is_invalid_message() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    let rest = r#""receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy""#;
    let long = "m".repeat(256);
    for id_part in [
        String::new(),
        r#""message_id":42,"#.to_owned(),
        r#""message_id":null,"#.to_owned(),
        r#""message_id":"","#.to_owned(),
        r#""message_id":"a b","#.to_owned(),
        r#""message_id":"a/b","#.to_owned(),
        format!(r#""message_id":"{long}","#),
    ] {
        check(
            &mut c,
            &format!("publish ex receiver_1 {{{id_part}{rest}}}"),
            "Error: invalid message",
        )
        .await;
    }
    assert!(fetch(&mut c, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_id_but_missing_or_mistyped_fields_is_nack_invalid() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    let fields = [
        ("receiver_client_id", r#""receiver_1""#),
        ("enc_session_key", r#""a2V5""#),
        ("nonce", r#""bm9uY2U=""#),
        ("ciphertext", r#""Y2lwaGVy""#),
    ];
    for (i, (missing, _)) in fields.iter().enumerate() {
        let id = format!("miss-{i}");
        let others: Vec<String> = fields
            .iter()
            .filter(|(n, _)| n != missing)
            .map(|(n, v)| format!(r#""{n}":{v}"#))
            .collect();
        let b = format!(r#"{{"message_id":"{id}",{}}}"#, others.join(","));
        check(
            &mut c,
            &format!("publish ex receiver_1 {b}"),
            &format!("NACK {id} invalid"),
        )
        .await;
    }
    for (i, (field, _)) in fields.iter().enumerate() {
        let id = format!("type-{i}");
        let parts: Vec<String> = fields
            .iter()
            .map(|(n, v)| {
                if n == field {
                    format!(r#""{n}":5"#)
                } else {
                    format!(r#""{n}":{v}"#)
                }
            })
            .collect();
        let b = format!(r#"{{"message_id":"{id}",{}}}"#, parts.join(","));
        check(
            &mut c,
            &format!("publish ex receiver_1 {b}"),
            &format!("NACK {id} invalid"),
        )
        .await;
    }
    check(
        &mut c,
        r#"publish ex receiver_1 {"message_id":"only-id"}"#,
        "NACK only-id invalid",
    )
    .await;
    assert!(fetch(&mut c, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_over_max_message_bytes_is_nack_too_large() {
    let broker = TestBroker::start_with(1, "[performance]\nmax_message_bytes = 1000\n");
    let mut c = routed(&broker).await;
    check(
        &mut c,
        &format!("publish ex receiver_1 {}", body_of_len("fits", 1000)),
        "ACK fits",
    )
    .await;
    check(
        &mut c,
        &format!("publish ex receiver_1 {}", body_of_len("over", 1001)),
        "NACK over too_large",
    )
    .await;
    // Still within max_line_bytes (1000 + 4096): a NACK, not a line error.
    check(
        &mut c,
        &format!("publish ex receiver_1 {}", body_of_len("big", 4000)),
        "NACK big too_large",
    )
    .await;
    let got = fetch(&mut c, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["fits"]);
    assert_eq!(got[0].body, body_of_len("fits", 1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_limit_is_max_message_bytes_plus_4096() {
    let broker = TestBroker::start_with(1, "[performance]\nmax_message_bytes = 1000\n");
    let mut c = routed(&broker).await;
    let prefix = "publish ex receiver_1 ";
    let at_limit = format!("{prefix}{}", body_of_len("at", 5096 - prefix.len()));
    assert_eq!(at_limit.len(), 5096);
    check(&mut c, &at_limit, "NACK at too_large").await;
    // Longer lines are refused however they arrive (these fit one TLS record).
    for len in [5097, 8000, 12_000] {
        let over = format!("{prefix}{}", body_of_len("over", len - prefix.len()));
        assert_eq!(over.len(), len);
        check(&mut c, &over, "Error: line too long").await;
        usable(&mut c).await;
    }
    assert_eq!(
        ids(&fetch(&mut c, "receiver_1_queue", 10).await),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_just_over_the_default_limit_is_line_too_long() {
    // Default: max_message_bytes 1 MiB, max_line_bytes 1 MiB + 4 KiB.
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    let prefix = "publish ex receiver_1 ";
    let limit = 1024 * 1024 + 4096;
    let at_limit = format!("{prefix}{}", body_of_len("at", limit - prefix.len()));
    check(&mut c, &at_limit, "NACK at too_large").await;
    for extra in [1, 100, 3000] {
        let over = format!(
            "{prefix}{}",
            body_of_len("over", limit + extra - prefix.len())
        );
        check(&mut c, &over, "Error: line too long").await;
        usable(&mut c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_batch_unparseable_array_is_one_invalid_message() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    let valid = body("v-1", "receiver_1");
    for arr in [
        "[{".to_owned(),
        "not json".to_owned(),
        format!("[{valid},"),
        format!("[{valid}] trailing"),
        valid.clone(),
    ] {
        // Exactly one line for the whole batch: the next reply is the heartbeat's.
        c.queue_line(&format!("publish_batch ex receiver_1 {arr}"));
        c.queue_line("heartbeat");
        flush_t(&mut c).await;
        assert_eq!(
            line(&mut c).await,
            "Error: invalid message",
            "batch {}",
            shorten(&arr)
        );
        assert_eq!(
            line(&mut c).await,
            "OK heartbeat",
            "batch {}",
            shorten(&arr)
        );
    }
    assert!(fetch(&mut c, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_batch_element_without_id_is_nack_dash_invalid() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    let no_id = r#"{"receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}"#;
    check(
        &mut c,
        &format!("publish_batch ex receiver_1 [{no_id}]"),
        "NACK - invalid",
    )
    .await;
    check(&mut c, "publish_batch ex receiver_1 [7]", "NACK - invalid").await;
    usable(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_batch_empty_array_is_ok_zero() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    check(
        &mut c,
        "publish_batch ex receiver_1 []",
        "OK publish_batch 0",
    )
    .await;
    check(
        &mut c,
        "publish_batch ex receiver_1 [ ]",
        "OK publish_batch 0",
    )
    .await;
    usable(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_batch_mixed_elements_get_one_reply_each_in_order() {
    let broker = TestBroker::start(2);
    let mut admin = routed(&broker).await;
    let mut c = connect_as(&broker, broker.sender_on_other_shard("receiver_1")).await;
    let elements = [
        body("a", "receiver_1"),
        r#"{"receiver_client_id":"receiver_1"}"#.to_owned(),
        r#"{"message_id":"b","nonce":"bm9uY2U="}"#.to_owned(),
        "7".to_owned(),
        body("c", "receiver_1"),
        r#"{"message_id":"d e","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}"#.to_owned(),
        "null".to_owned(),
        body("e", "receiver_1"),
    ];
    c.queue_line(&format!(
        "publish_batch ex receiver_1 [{}]",
        elements.join(", ")
    ));
    c.queue_line("heartbeat");
    flush_t(&mut c).await;
    for expected in [
        "ACK a",
        "NACK - invalid",
        "NACK b invalid",
        "NACK - invalid",
        "ACK c",
        "NACK - invalid",
        "NACK - invalid",
        "ACK e",
        "OK heartbeat",
    ] {
        assert_eq!(line(&mut c).await, expected);
    }
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 10).await),
        ["a", "c", "e"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mib_line_is_line_too_long_and_connection_stays_usable() {
    let broker = TestBroker::start(1);
    let mut admin = routed(&broker).await;
    let mut c = connect_as(&broker, "sender_1").await;
    let huge = format!(
        "publish ex receiver_1 {}",
        body_of_len("huge", 2 * 1024 * 1024)
    );
    check(&mut c, &huge, "Error: line too long").await;
    usable(&mut c).await;
    // Pipelined around another over-long line (no spaces at all this time).
    c.queue_line("heartbeat");
    c.queue_line(&"z".repeat(2 * 1024 * 1024));
    c.queue_line("resend");
    flush_t(&mut c).await;
    assert_eq!(line(&mut c).await, "OK heartbeat");
    assert_eq!(line(&mut c).await, "Error: line too long");
    assert_eq!(line(&mut c).await, "OK resend 0");
    // The over-long publish stored nothing.
    publish_expect(&mut c, "ex", "receiver_1", "small", "ACK small").await;
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1_queue", 10).await),
        ["small"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_is_an_error_and_connection_stays_usable() {
    let broker = TestBroker::start(1);
    let mut c = routed(&broker).await;
    for bytes in [
        &b"\xff\xfe\n"[..],
        b"heartbeat\xff\n",
        b"\xc3\n",
        b"publish ex receiver_1 {\"message_id\":\"u-1\",\"receiver_client_id\":\"receiver_1\",\"enc_session_key\":\"a2V5\",\"nonce\":\"bm9uY2U=\",\"ciphertext\":\"\xff\"}\n",
    ] {
        c.queue_bytes(bytes);
        flush_t(&mut c).await;
        let got = line(&mut c).await;
        assert!(got.starts_with("Error: "), "reply to {bytes:?}: {got:?}");
        usable(&mut c).await;
    }
    assert!(fetch(&mut c, "receiver_1_queue", 10).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lines_are_ignored() {
    let broker = TestBroker::start(1);
    let mut c = connect_as(&broker, "sender_1").await;
    c.queue_bytes(b"\n\nheartbeat\n");
    flush_t(&mut c).await;
    assert_eq!(line(&mut c).await, "OK heartbeat");
    c.queue_bytes(b"\n\r\n\n\n");
    c.queue_line("resend");
    flush_t(&mut c).await;
    // Nothing was answered for the empty lines: the next reply is the resend's.
    assert_eq!(line(&mut c).await, "OK resend 0");
    c.queue_bytes(b"\n\n\n");
    flush_t(&mut c).await;
    assert_silent(
        &mut c,
        Duration::from_millis(300),
        "empty lines get no reply",
    )
    .await;
    usable(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crlf_line_endings_are_accepted() {
    let broker = TestBroker::start(1);
    let mut c = connect_as(&broker, "admin").await;
    let b = body("crlf-1", "receiver_1");
    c.queue_bytes(b"heartbeat\r\n");
    c.queue_bytes(b"declare_exchange ex direct\r\n");
    c.queue_bytes(b"declare_queue receiver_1_crlf\r\n");
    c.queue_bytes(b"bind receiver_1_crlf ex k\r\n");
    c.queue_bytes(format!("publish ex k {b}\r\n").as_bytes());
    c.queue_bytes(b"fetch receiver_1_crlf 5\r\n");
    flush_t(&mut c).await;
    for expected in [
        "OK heartbeat",
        "OK declare_exchange ex",
        "OK declare_queue receiver_1_crlf",
        "OK bind receiver_1_crlf ex k",
        "ACK crlf-1",
    ] {
        assert_eq!(line(&mut c).await, expected);
    }
    let d = delivery_of(&line(&mut c).await);
    assert_eq!(
        (d.id.as_str(), d.queue.as_str(), d.count, d.body.as_str()),
        ("crlf-1", "receiver_1_crlf", 1, b.as_str())
    );
    assert_eq!(line(&mut c).await, "OK fetch 1");
    c.queue_bytes(b"ack crlf-1\r\n");
    flush_t(&mut c).await;
    assert_eq!(line(&mut c).await, "ACK_CONFIRMED crlf-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_says_bye_then_closes() {
    let broker = TestBroker::start(1);
    let mut c = connect_as(&broker, "sender_1").await;
    check(&mut c, "quit", "OK bye").await;
    assert_closed(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_pipelined_after_quit_are_not_answered() {
    let broker = TestBroker::start(1);
    let mut c = connect_as(&broker, "admin").await;
    c.queue_line("heartbeat");
    c.queue_line("quit");
    c.queue_line("heartbeat");
    c.queue_line("declare_exchange after_quit");
    flush_t(&mut c).await;
    assert_eq!(line(&mut c).await, "OK heartbeat");
    assert_eq!(line(&mut c).await, "OK bye");
    assert_closed(&mut c).await;
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_queue orders",
        "OK declare_queue orders",
    )
    .await;
    check(
        &mut admin,
        "bind orders after_quit k",
        "Error: unknown exchange after_quit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_follow_command_order_through_errors() {
    let broker = TestBroker::start(2);
    let _admin = routed(&broker).await;
    let mut c = connect_as(&broker, broker.sender_on_other_shard("receiver_1")).await;
    let mut expected = Vec::new();
    for i in 0..300 {
        match i % 6 {
            0 => {
                c.queue_line(&format!(
                    "publish ex receiver_1 {}",
                    body(&format!("o-{i}"), "receiver_1")
                ));
                expected.push(format!("ACK o-{i}"));
            }
            1 => {
                c.queue_line("frobnicate");
                expected.push("Error:".to_owned());
            }
            2 => {
                c.queue_line(&format!(
                    "publish ex nobody {}",
                    body(&format!("o-{i}"), "receiver_1")
                ));
                expected.push(format!("NACK o-{i} no_route"));
            }
            3 => {
                c.queue_line("publish ex receiver_1 not-json");
                expected.push("Error: invalid message".to_owned());
            }
            4 => {
                c.queue_line("consume receiver_1_queue");
                expected.push("Access denied:".to_owned());
            }
            _ => {
                c.queue_line("heartbeat");
                expected.push("OK heartbeat".to_owned());
            }
        }
    }
    flush_t(&mut c).await;
    for (i, e) in expected.iter().enumerate() {
        let got = line(&mut c).await;
        if e.ends_with(':') {
            assert!(
                got.starts_with(e.as_str()),
                "reply {i}: expected {e}…, got {got:?}"
            );
        } else {
            assert_eq!(&got, e, "reply {i}");
        }
    }
}

/// xorshift64*: deterministic garbage without extra dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_one_connection_never_breaks_another() {
    let broker = TestBroker::start(2);
    let _admin = routed(&broker).await;
    // The bystander exchanges heartbeats the whole time.
    let mut bystander = connect_as(&broker, "sender_1").await;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let heartbeats = tokio::spawn(async move {
        let mut n = 0u32;
        let mut stopping = false;
        loop {
            check(&mut bystander, "heartbeat", "OK heartbeat").await;
            n += 1;
            // Remember the stop: under load it can come before the 50th beat.
            stopping = stopping || stop_rx.try_recv().is_ok();
            if stopping && n >= 50 {
                return (n, bystander);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });

    // 1. Random bytes (NULs, control bytes, invalid UTF-8) inside TLS.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut g = connect_as(&broker, "sender_2").await;
    for round in 0..40 {
        let n = 1 + (rng.next() % 4096) as usize;
        let mut chunk = rng.bytes(n);
        if round % 3 == 0 {
            chunk.extend_from_slice(b"\0\0\0 \0publish\0ex\0k\0{\0}");
        }
        g.queue_bytes(&chunk);
        flush_t(&mut g).await;
    }
    // 2. Very long tokens: under the line limit, and over it.
    g.queue_bytes(b"\n");
    g.queue_bytes(&vec![b'A'; 512 * 1024]);
    g.queue_bytes(b"\n");
    g.queue_bytes(
        format!(
            "publish {} {} {}\n",
            "e".repeat(300_000),
            "k".repeat(300_000),
            "{".repeat(300_000)
        )
        .as_bytes(),
    );
    g.queue_bytes(&vec![0u8; 1536 * 1024]);
    g.queue_bytes(b"\n");
    g.queue_bytes(&b" ".repeat(10_000));
    g.queue_bytes(b"\n\r\r\r\n");
    // 3. The sentinel: every line before it was answered with an error.
    g.queue_bytes(b"\nget_public_key sentinel_zz\n");
    flush_t(&mut g).await;
    let mut errors = 0;
    loop {
        let l = line(&mut g).await;
        if l == "Error: no public key for sentinel_zz" {
            break;
        }
        assert!(
            l.starts_with("Error: "),
            "garbage answered with {:?}",
            shorten(&l)
        );
        errors += 1;
    }
    assert!(errors >= 4, "only {errors} error lines for the garbage");
    usable(&mut g).await;

    // 4. Not TLS at all, and a TLS connection cut mid-line.
    let mut tcp = tokio::net::TcpStream::connect(&broker.addr)
        .await
        .expect("tcp");
    let _ = tcp.write_all(&rng.bytes(64 * 1024)).await;
    drop(tcp);
    let opts = TlsClientOptions::for_cn(&pki().certs, "sender_3");
    let mut raw = tokio::time::timeout(TIMEOUT, Connection::connect_raw(&broker.addr, &opts))
        .await
        .expect("handshake finishes")
        .expect("handshake");
    let _ = raw
        .write_all(b"publish ex receiver_1 {\"message_id\":\"cut")
        .await;
    let _ = raw.flush().await;
    drop(raw);

    stop_tx.send(()).expect("bystander still running");
    let (n, mut bystander) = tokio::time::timeout(Duration::from_secs(60), heartbeats)
        .await
        .expect("bystander finished")
        .expect("bystander task did not panic");
    assert!(n >= 50);
    usable(&mut bystander).await;
    usable(&mut connect_as(&broker, "sender_4").await).await;
}
