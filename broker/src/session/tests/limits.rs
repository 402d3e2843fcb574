//! Every command has a bounded cost (docs/PROTOCOL.md, "Quotas"): per-CN quotas, rate
//! limits, public-key sizes and the fetch cap, each answered, never a stall.

use super::*;

/// `performance.max_*_per_cn`: answered `Error: quota exceeded: …`, for
/// receivers only, and what was refused routes nothing.
#[test]
fn per_cn_quotas() {
    let r = "receiver_1";
    let bound = body("bound", "receiver_1");
    let admins = body("admins", "receiver_1");
    let c = case("queues, exchanges and bindings")
        .row(
            r,
            "declare_exchange receiver_1_ex0 topic",
            "OK declare_exchange receiver_1_ex0",
        )
        .row(
            r,
            "declare_exchange receiver_1_ex1 topic",
            "OK declare_exchange receiver_1_ex1",
        )
        .row(
            r,
            "declare_exchange receiver_1_ex2 topic",
            quota("exchanges", 2, "max_exchanges_per_cn"),
        )
        // An exchange it declared again is no new exchange.
        .row(
            r,
            "declare_exchange receiver_1_ex0 topic",
            "OK declare_exchange receiver_1_ex0",
        )
        .row(
            r,
            "declare_queue receiver_1_q0",
            "OK declare_queue receiver_1_q0",
        )
        .row(
            r,
            "declare_queue receiver_1_q1",
            "OK declare_queue receiver_1_q1",
        )
        .row(
            r,
            "declare_queue receiver_1_queue",
            quota("queues", 2, "max_queues_per_cn"),
        )
        .row(
            r,
            "declare_queue receiver_1_q0",
            "OK declare_queue receiver_1_q0",
        )
        // Admins are not held to a receiver's quota.
        .row(
            "admin",
            "declare_exchange ev topic",
            "OK declare_exchange ev",
        )
        .row(
            "admin",
            "declare_queue receiver_1_queue",
            "OK declare_queue receiver_1_queue",
        )
        .row(
            r,
            "bind receiver_1_queue ev receiver_1.k0",
            "OK bind receiver_1_queue ev receiver_1.k0",
        )
        .row(
            r,
            "bind receiver_1_queue ev receiver_1.k1",
            "OK bind receiver_1_queue ev receiver_1.k1",
        )
        .row(
            r,
            "bind receiver_1_queue ev receiver_1.k2",
            quota("bindings", 2, "max_bindings_per_cn"),
        )
        .row(
            r,
            "bind receiver_1_queue ev receiver_1.k0",
            "OK bind receiver_1_queue ev receiver_1.k0",
        )
        // Another receiver is not limited by it.
        .row(
            "receiver_2",
            "declare_queue receiver_2_queue",
            "OK declare_queue receiver_2_queue",
        )
        .row(
            "receiver_2",
            "bind receiver_2_queue ev receiver_2.k",
            "OK bind receiver_2_queue ev receiver_2.k",
        )
        .row(
            "admin",
            "bind receiver_1_queue ev receiver_1.by_admin",
            "OK bind receiver_1_queue ev receiver_1.by_admin",
        )
        // What was bound routes; what was refused does not.
        .row(
            "sender_1",
            publish("ev", "receiver_1.k1", "bound"),
            "ACK bound",
        )
        .row(
            "sender_1",
            publish("ev", "receiver_1.k2", "refused"),
            "NACK refused no_route",
        )
        .row(
            "sender_1",
            publish("ev", "receiver_1.by_admin", "admins"),
            "ACK admins",
        )
        .rows(
            r,
            "fetch receiver_1_queue 10",
            [
                delivery("receiver_1_queue", 1, &bound),
                delivery("receiver_1_queue", 1, &admins),
                "OK fetch 2".into(),
            ],
        );
    Table::new()
        .extra(
            "[performance]\nmax_queues_per_cn = 2\nmax_exchanges_per_cn = 2\n\
             max_bindings_per_cn = 2\n",
        )
        .run(vec![c]);
}

/// A limited command is answered, never dropped.
#[test]
fn rate_limits_are_answered() {
    let c = case("buckets of three commands and one publish")
        .row("sender_1", "heartbeat", "OK heartbeat")
        .row("sender_1", "heartbeat", "OK heartbeat")
        .row("sender_1", publish("ex", "receiver_1", "m-1"), "ACK m-1")
        .row("sender_1", "heartbeat", "Rate limited")
        .row(
            "sender_1",
            publish("ex", "receiver_1", "m-2"),
            "NACK m-2 rate_limited",
        )
        // The permission comes first.
        .row(
            "receiver_1",
            publish("ex", "receiver_1", "r-1"),
            "NACK r-1 access_denied",
        )
        // Another CN has its own buckets.
        .row("sender_2", "heartbeat", "OK heartbeat");
    Table::new()
        .extra(
            "[rate_limit]\nenabled = true\nglobal_rps = 0.001\nglobal_burst = 3\n\
             publish_rps = 0.001\npublish_burst = 1\n",
        )
        .world(routed_world())
        .run(vec![c]);
}

/// Public keys must be 32 bytes of standard base64; a fetch is capped at
/// `performance.max_fetch`.
#[test]
fn keys_and_fetches_are_bounded() {
    let r = "receiver_1";
    let std = base64::engine::general_purpose::STANDARD;
    let mut c = case("public keys").row(
        r,
        format!("register_public_key {}", key(0xfb)),
        "Public key registered",
    );
    for bad in [
        "not-base64!!".to_owned(),
        std.encode([1u8; 31]),
        std.encode([1u8; 33]),
        std.encode([1u8; 64]),
        base64::engine::general_purpose::STANDARD_NO_PAD.encode([1u8; 32]),
        base64::engine::general_purpose::URL_SAFE.encode([0xfb; 32]),
    ] {
        c = c.row(
            r,
            format!("register_public_key {bad}"),
            "Error: invalid public key: expected standard base64 of 32 bytes",
        );
    }
    c = c
        .row(
            "sender_1",
            "get_public_key receiver_1",
            format!("PUBLIC_KEY receiver_1 {}", key(0xfb)),
        )
        .row(
            "sender_1",
            "get_public_key nobody",
            "Error: no public key for nobody",
        )
        // A new key replaces the old one.
        .row(
            r,
            format!("register_public_key {}", key(0x11)),
            "Public key registered",
        )
        .row(
            "sender_1",
            "get_public_key receiver_1",
            format!("PUBLIC_KEY receiver_1 {}", key(0x11)),
        );
    // `performance.max_fetch = 3`: the largest max there is gets three.
    let mut fetch = case("oversized fetch");
    for i in 0..5 {
        let id = format!("m{i}");
        fetch = fetch.row(
            "sender_1",
            publish("ex", "receiver_1", &id),
            format!("ACK {id}"),
        );
    }
    let lines = |ids: std::ops::Range<usize>| {
        let mut lines: Vec<String> = ids
            .map(|i| delivery("receiver_1_queue", 1, &body(&format!("m{i}"), "receiver_1")))
            .collect();
        lines.push(format!("OK fetch {}", lines.len()));
        lines
    };
    fetch = fetch
        .rows(
            r,
            format!("fetch receiver_1_queue {}", u32::MAX),
            lines(0..3),
        )
        .rows(r, "fetch receiver_1_queue 3", lines(3..5))
        .row(r, "fetch receiver_1_queue 3", "OK fetch 0");
    Table::new()
        .extra("[performance]\nmax_fetch = 3\n")
        .world(routed_world())
        .run(vec![c, fetch]);
}

/// `performance.max_unacked_per_connection`: a fetch is served up to the
/// room the connection has left, refused with none, and served again once
/// an ack makes room.
#[test]
fn fetches_stop_at_the_connections_unacked_cap() {
    let r = "receiver_1";
    let mut c = case("unacked cap");
    for i in 0..6 {
        let id = format!("m{i}");
        c = c.row("sender_1", publish("ex", r, &id), format!("ACK {id}"));
    }
    let lines = |ids: std::ops::Range<usize>| {
        let mut lines: Vec<String> = ids
            .map(|i| delivery("receiver_1_queue", 1, &body(&format!("m{i}"), r)))
            .collect();
        lines.push(format!("OK fetch {}", lines.len()));
        lines
    };
    let refused = "Error: fetch: this connection holds 3 unacked deliveries, the most one may \
                   (performance.max_unacked_per_connection); ack or nack some first";
    c = c
        .rows(r, "fetch receiver_1_queue 2", lines(0..2))
        .rows(r, "fetch receiver_1_queue 10", lines(2..3))
        .row(r, "fetch receiver_1_queue 10", refused)
        .row(r, "ack m0", "ACK_CONFIRMED m0")
        .rows(r, "fetch receiver_1_queue 10", lines(3..4))
        .row(r, "fetch receiver_1_queue", refused)
        // Another connection has a cap of its own.
        .rows("admin", "fetch receiver_1_queue 10", lines(4..6));
    Table::new()
        .extra("[performance]\nmax_unacked_per_connection = 3\n")
        .world(routed_world())
        .run(vec![c]);
}

/// `performance.max_queue_bytes` caps the bodies a queue holds, ready and
/// unacked, alongside the count cap: a publish past it is
/// `NACK <id> queue_full`, and an ack makes room again.
#[test]
fn a_queue_past_its_byte_cap_refuses_publishes_until_acks_free_room() {
    let r = "receiver_1";
    let s = "sender_1";
    let one = body("m0", "receiver_1").len();
    let c = case("two bodies fit, a third does not")
        .row(s, publish("ex", "receiver_1", "m0"), "ACK m0")
        .row(s, publish("ex", "receiver_1", "m1"), "ACK m1")
        .row(s, publish("ex", "receiver_1", "m2"), "NACK m2 queue_full")
        .rows(
            r,
            "fetch receiver_1_queue 1",
            [
                delivery("receiver_1_queue", 1, &body("m0", "receiver_1")),
                "OK fetch 1".into(),
            ],
        )
        // A delivery still holds its bytes until it is acked.
        .row(s, publish("ex", "receiver_1", "m2"), "NACK m2 queue_full")
        .row(r, "ack m0", "ACK_CONFIRMED m0")
        .row(s, publish("ex", "receiver_1", "m2"), "ACK m2")
        .rows(
            s,
            format!(
                "publish_batch ex receiver_1 [{},{}]",
                body("b0", "receiver_1"),
                body("b1", "receiver_1")
            ),
            ["NACK b0 queue_full", "NACK b1 queue_full"],
        );
    Table::new()
        .extra(&format!(
            "[performance]\nmax_queue_size = 100\nmax_queue_bytes = {}\n",
            2 * one
        ))
        .world(routed_world())
        .run(vec![c]);
}
