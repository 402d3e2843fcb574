//! The error replies of the wire protocol (docs/PROTOCOL.md): framing, UTF-8,
//! unknown commands, arity, the name rule, and publish bodies.

use super::*;

/// Empty lines, `\r`, bad UTF-8 and unknown commands.
#[test]
fn framing_utf8_and_unknown_commands() {
    let a = "admin";
    let mut c = case("framing")
        .rows(a, "", Vec::<String>::new())
        .rows(a, "\r", Vec::<String>::new())
        .row(a, "heartbeat\r", "OK heartbeat")
        .row(a, "  heartbeat", "OK heartbeat");
    for bytes in [
        &b"\xff\xfe"[..],
        b"heartbeat\xff",
        b"\xc3",
        b"publish ex receiver_1 {\"message_id\":\"u-1\",\"receiver_client_id\":\"receiver_1\",\"enc_session_key\":\"a2V5\",\"nonce\":\"bm9uY2U=\",\"ciphertext\":\"\xff\"}",
    ] {
        c = c.row(a, bytes, "Error: invalid UTF-8 in request");
    }
    for (line, word) in [
        ("frobnicate", "frobnicate"),
        ("frobnicate a b c", "frobnicate"),
        ("hello", "hello"),
        ("publishx ex k {}", "publishx"),
        ("heartbeats", "heartbeats"),
        ("OK heartbeat", "OK"),
        ("HEARTBEAT", "HEARTBEAT"),
    ] {
        c = c.row(a, line, format!("Error: unknown command {word}"));
    }
    // An unknown command is echoed at most 64 characters long.
    c = c.row(
        a,
        "x".repeat(300),
        format!("Error: unknown command {}", "x".repeat(64)),
    );
    c = c.rows(a, "fetch receiver_1_queue 10", ["OK fetch 0"]);
    Table::new().world(routed_world()).run(vec![c]);
}

/// Every command with too few or too many arguments.
#[test]
fn wrong_arity_is_a_usage_error() {
    let a = "admin";
    let mut c = case("arity");
    for (line, usage) in [
        ("declare_queue", "declare_queue <queue>"),
        (
            "declare_queue receiver_1_a receiver_1_b",
            "declare_queue <queue>",
        ),
        (
            "declare_exchange",
            "declare_exchange <exchange> [direct|fanout|topic]",
        ),
        (
            "declare_exchange e2 direct extra",
            "declare_exchange <exchange> [direct|fanout|topic]",
        ),
        ("bind", "bind <queue> <exchange> <routing_key>"),
        (
            "bind receiver_1_queue",
            "bind <queue> <exchange> <routing_key>",
        ),
        (
            "bind receiver_1_queue ex",
            "bind <queue> <exchange> <routing_key>",
        ),
        (
            "bind receiver_1_queue ex k extra",
            "bind <queue> <exchange> <routing_key>",
        ),
        ("consume", "consume <queue> [prefetch]"),
        ("consume receiver_1_queue 1 2", "consume <queue> [prefetch]"),
        ("fetch", "fetch <queue> [max]"),
        ("fetch receiver_1_queue 1 2", "fetch <queue> [max]"),
        ("ack", "ack <message_id> [queue]"),
        ("ack m-1 receiver_1_queue extra", "ack <message_id> [queue]"),
        ("nack", "nack <message_id> [queue]"),
        (
            "nack m-1 receiver_1_queue extra",
            "nack <message_id> [queue]",
        ),
        ("resend now", "resend"),
        ("register_public_key", "register_public_key <base64>"),
        (
            "register_public_key AAAA AAAA",
            "register_public_key <base64>",
        ),
        ("get_public_key", "get_public_key <client_id>"),
        (
            "get_public_key receiver_1 receiver_2",
            "get_public_key <client_id>",
        ),
        ("heartbeat now", "heartbeat"),
        ("quit now", "quit"),
    ] {
        c = c.row(a, line, format!("Error: usage: {usage}"));
    }
    // A publish without a body has no message to answer for.
    for line in [
        "publish",
        "publish ex",
        "publish ex receiver_1",
        "publish_batch",
        "publish_batch ex",
        "publish_batch ex receiver_1",
    ] {
        c = c.row(a, line, "Error: invalid message");
    }
    // `quit now` did not close; `declare_exchange e2 direct extra` created nothing.
    c = c
        .row(
            a,
            "bind receiver_1_queue e2 k",
            "Error: unknown exchange e2",
        )
        .row(
            a,
            "bind receiver_1_a ex k",
            "Error: unknown queue receiver_1_a",
        );
    let rows = Table::new().world(routed_world()).run(vec![c]);
    assert!(rows > 30);
}

/// Names outside `[A-Za-z0-9_.:-]{1,255}`, `.` and `..`, and bad counts.
#[test]
fn names_breaking_the_name_rule() {
    let a = "admin";
    let long = "q".repeat(256);
    let mut c = case("names");
    for (line, error) in [
        ("declare_queue bad/name".to_owned(), "invalid queue name"),
        (format!("declare_queue {long}"), "invalid queue name"),
        ("declare_queue é".to_owned(), "invalid queue name"),
        ("declare_queue q*".to_owned(), "invalid queue name"),
        ("declare_queue q#".to_owned(), "invalid queue name"),
        ("declare_queue q,1".to_owned(), "invalid queue name"),
        // A queue's name is a directory name.
        ("declare_queue .".to_owned(), "invalid queue name"),
        ("declare_queue ..".to_owned(), "invalid queue name"),
        ("declare_exchange .".to_owned(), "invalid exchange name"),
        (
            "declare_exchange .. topic".to_owned(),
            "invalid exchange name",
        ),
        ("declare_exchange e/x".to_owned(), "invalid exchange name"),
        (
            "declare_exchange e# topic".to_owned(),
            "invalid exchange name",
        ),
        (
            "declare_exchange e sideways".to_owned(),
            "unknown exchange type sideways (expected direct, fanout or topic)",
        ),
        ("bind bad/q ex k".to_owned(), "invalid queue name"),
        ("bind .. ex k".to_owned(), "invalid queue name"),
        (
            "bind receiver_1_queue e/x k".to_owned(),
            "invalid exchange name",
        ),
        (
            "bind receiver_1_queue . k".to_owned(),
            "invalid exchange name",
        ),
        (
            "bind receiver_1_queue ex k/1".to_owned(),
            "invalid routing key name",
        ),
        ("consume bad/q".to_owned(), "invalid queue name"),
        ("consume ..".to_owned(), "invalid queue name"),
        ("fetch bad/q".to_owned(), "invalid queue name"),
        ("fetch .".to_owned(), "invalid queue name"),
        ("ack m/1".to_owned(), "invalid message id name"),
        ("ack ..".to_owned(), "invalid message id name"),
        ("ack m-1 bad/q".to_owned(), "invalid queue name"),
        ("nack m/1".to_owned(), "invalid message id name"),
        ("nack m-1 .".to_owned(), "invalid queue name"),
        ("get_public_key a/b".to_owned(), "invalid client id name"),
        ("get_public_key ..".to_owned(), "invalid client id name"),
        (format!("get_public_key {long}"), "invalid client id name"),
        // Counts are positive 32-bit integers.
        (
            "consume receiver_1_queue abc".to_owned(),
            "invalid prefetch: expected a positive integer",
        ),
        (
            "consume receiver_1_queue -1".to_owned(),
            "invalid prefetch: expected a positive integer",
        ),
        (
            "consume receiver_1_queue 0".to_owned(),
            "invalid prefetch: expected a positive integer",
        ),
        (
            "fetch receiver_1_queue x".to_owned(),
            "invalid max: expected a positive integer",
        ),
        (
            "fetch receiver_1_queue 1.5".to_owned(),
            "invalid max: expected a positive integer",
        ),
        (
            "fetch receiver_1_queue -3".to_owned(),
            "invalid max: expected a positive integer",
        ),
        (
            "fetch receiver_1_queue 0".to_owned(),
            "invalid max: expected a positive integer",
        ),
        (
            "fetch receiver_1_queue 4294967296".to_owned(),
            "invalid max: expected a positive integer",
        ),
    ] {
        c = c.row(a, line, format!("Error: {error}"));
    }
    // None of them declared anything; the whole alphabet and 251 bytes do
    // (a queue name leaves room for its dead-letter queue's `.dlq`).
    let max = "q".repeat(251);
    c = c
        .row(a, "bind q ex k", "Error: unknown queue q")
        .row(a, "declare_queue a.b:c-d_E9", "OK declare_queue a.b:c-d_E9")
        .row(
            a,
            format!("declare_queue {max}"),
            format!("OK declare_queue {max}"),
        )
        .row(
            a,
            format!("declare_queue {}", "q".repeat(252)),
            "Error: invalid queue name: at most 251 bytes, so that its dead-letter queue <queue>.dlq fits the 255-byte name rule",
        );
    // A publish to a bad name is a NACK of its message.
    for (exchange, key, id) in [
        ("e/x", "receiver_1", "n-1"),
        ("ex", "k/1", "n-2"),
        ("ex", "receiver_1.*", "n-3"),
        (".", "receiver_1", "n-4"),
        ("..", "receiver_1", "n-5"),
    ] {
        c = c.row(a, publish(exchange, key, id), format!("NACK {id} invalid"));
    }
    c = c.row(a, "fetch receiver_1_queue 10", "OK fetch 0");
    Table::new().world(routed_world()).run(vec![c]);
}

/// Publish failures: unreadable bodies, missing fields, no route, too
/// large, and batches.
#[test]
fn publish_bodies() {
    let a = "admin";
    let mut c = case("publish");
    for b in [
        "not json",
        "{",
        r#"{"message_id":"x-1","#,
        "[1, 2]",
        "\"just a string\"",
        "42",
        r#"{"message_id":"x-2"} trailing"#,
    ] {
        c = c.row(
            a,
            format!("publish ex receiver_1 {b}"),
            "Error: invalid message",
        );
    }
    let rest = r#""receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy""#;
    let long = "m".repeat(256);
    for id_part in [
        String::new(),
        r#""message_id":42,"#.to_owned(),
        r#""message_id":null,"#.to_owned(),
        r#""message_id":"","#.to_owned(),
        r#""message_id":"a b","#.to_owned(),
        r#""message_id":"a/b","#.to_owned(),
        r#""message_id":"..","#.to_owned(),
        format!(r#""message_id":"{long}","#),
    ] {
        c = c.row(
            a,
            format!("publish ex receiver_1 {{{id_part}{rest}}}"),
            "Error: invalid message",
        );
    }
    let fields = [
        ("receiver_client_id", r#""receiver_1""#),
        ("enc_session_key", r#""a2V5""#),
        ("nonce", r#""bm9uY2U=""#),
        ("ciphertext", r#""Y2lwaGVy""#),
    ];
    for (i, (missing, _)) in fields.iter().enumerate() {
        let others: Vec<String> = fields
            .iter()
            .filter(|(n, _)| n != missing)
            .map(|(n, v)| format!(r#""{n}":{v}"#))
            .collect();
        c = c.row(
            a,
            format!(
                r#"publish ex receiver_1 {{"message_id":"miss-{i}",{}}}"#,
                others.join(",")
            ),
            format!("NACK miss-{i} invalid"),
        );
    }
    c = c
        .row(
            a,
            r#"publish ex receiver_1 {"message_id":"only-id"}"#,
            "NACK only-id invalid",
        )
        .row(a, publish("ex", "nobody", "o-1"), "NACK o-1 no_route")
        .row(
            a,
            publish("nowhere", "receiver_1", "o-2"),
            "NACK o-2 no_route",
        )
        .row(
            a,
            format!("publish ex receiver_1 {}", body_of_len("fits", 1000)),
            "ACK fits",
        )
        .row(
            a,
            format!("publish ex receiver_1 {}", body_of_len("over", 1001)),
            "NACK over too_large",
        )
        // A retry of a stored id stores nothing new and is acknowledged.
        .row(
            a,
            format!("publish ex receiver_1 {}", body_of_len("fits", 1000)),
            "ACK fits",
        );
    // Batches.
    let valid = body("v-1", "receiver_1");
    for arr in [
        "[{".to_owned(),
        "not json".to_owned(),
        format!("[{valid},"),
        format!("[{valid}] trailing"),
        valid.clone(),
    ] {
        c = c.row(
            a,
            format!("publish_batch ex receiver_1 {arr}"),
            "Error: invalid message",
        );
    }
    let no_id = r#"{"receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}"#;
    c = c
        .row(
            a,
            format!("publish_batch ex receiver_1 [{no_id}]"),
            "NACK - invalid",
        )
        .row(a, "publish_batch ex receiver_1 [7]", "NACK - invalid")
        .row(a, "publish_batch ex receiver_1 []", "OK publish_batch 0")
        .row(a, "publish_batch ex receiver_1 [ ]", "OK publish_batch 0")
        .rows(
            a,
            format!(
                "publish_batch ex receiver_1 [{}, {}, {}, 7, {}, null]",
                body("a", "receiver_1"),
                r#"{"receiver_client_id":"receiver_1"}"#,
                r#"{"message_id":"b","nonce":"bm9uY2U="}"#,
                body("c", "receiver_1"),
            ),
            [
                "ACK a",
                "NACK - invalid",
                "NACK b invalid",
                "NACK - invalid",
                "ACK c",
                "NACK - invalid",
            ],
        )
        .rows(
            a,
            "fetch receiver_1_queue 10",
            [
                delivery("receiver_1_queue", 1, &body_of_len("fits", 1000)),
                delivery("receiver_1_queue", 1, &body("a", "receiver_1")),
                delivery("receiver_1_queue", 1, &body("c", "receiver_1")),
                "OK fetch 3".into(),
            ],
        );
    Table::new()
        .extra("[performance]\nmax_message_bytes = 1000\n")
        .world(routed_world())
        .run(vec![c]);
}
