//! The permission matrix (docs/ARCHITECTURE.md, "Identity and access"):
//! every command × role, one column per role, each cell with its exact reply.

use super::*;

/// The sender column: publishes, reads public keys, touches no queue.
fn sender_column() -> Vec<Case> {
    let s = "sender_1";
    vec![
        case("sender: declare_queue, without side effect")
            .denied(s, "declare_queue orders", DENY_SENDER_DECLARE_QUEUE)
            .denied(
                s,
                "declare_queue receiver_1_queue",
                DENY_SENDER_DECLARE_QUEUE,
            )
            .row(
                "admin",
                "bind orders ex orders",
                "Error: unknown queue orders",
            ),
        case("sender: bind, without side effect")
            .denied(s, "bind receiver_1_queue ex extra_key", DENY_SENDER_BIND)
            .row(s, publish("ex", "extra_key", "m-1"), "NACK m-1 no_route"),
        case("sender: declare_exchange, without side effect")
            .denied(
                s,
                "declare_exchange sx direct",
                DENY_SENDER_DECLARE_EXCHANGE,
            )
            .denied(s, "declare_exchange sx", DENY_SENDER_DECLARE_EXCHANGE)
            .row(
                "admin",
                "bind receiver_1_queue sx receiver_1",
                "Error: unknown exchange sx",
            ),
        case("sender: publish")
            .row(s, publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                "admin",
                "fetch receiver_1_queue 10",
                [
                    delivery("receiver_1_queue", 1, &body("m-1", "receiver_1")),
                    "OK fetch 1".into(),
                ],
            ),
        case("sender: publish_batch").rows(
            s,
            format!(
                "publish_batch ex receiver_1 [{},{}]",
                body("b-1", "receiver_1"),
                body("b-2", "receiver_1")
            ),
            ["ACK b-1", "ACK b-2"],
        ),
        case("sender: consume")
            .denied(s, "consume receiver_1_queue", DENY_SENDER_CONSUME)
            .denied(s, "consume receiver_1_queue 5", DENY_SENDER_CONSUME),
        case("sender: fetch, and receives nothing")
            .row("admin", publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .denied(s, "fetch receiver_1_queue", DENY_SENDER_FETCH)
            .denied(s, "fetch receiver_1_queue 10", DENY_SENDER_FETCH)
            .rows(
                "admin",
                "fetch receiver_1_queue 10",
                [
                    delivery("receiver_1_queue", 1, &body("m-1", "receiver_1")),
                    "OK fetch 1".into(),
                ],
            ),
        case("sender: nack")
            .denied(s, "nack m-1", DENY_SENDER_NACK)
            .denied(s, "nack m-1 receiver_1_queue", DENY_SENDER_NACK),
        case("sender: ack (allowed; it has no deliveries)")
            .row(s, "ack m-1", "Error: no outstanding delivery m-1")
            .row(
                s,
                "ack m-1 receiver_1_queue",
                "Error: no outstanding delivery m-1",
            ),
        case("sender: resend").row(s, "resend", "OK resend 0"),
        case("sender: quit").row(s, "quit", "OK bye"),
        case("sender: register_public_key, without side effect")
            .denied(
                s,
                format!("register_public_key {}", key(1)),
                DENY_SENDER_REGISTER,
            )
            .row(
                "admin",
                "get_public_key sender_1",
                "Error: no public key for sender_1",
            ),
        case("sender: get_public_key")
            .row(
                "receiver_1",
                format!("register_public_key {}", key(9)),
                "Public key registered",
            )
            .row(
                s,
                "get_public_key receiver_1",
                format!("PUBLIC_KEY receiver_1 {}", key(9)),
            ),
        case("sender: heartbeat").row(s, "heartbeat", "OK heartbeat"),
    ]
}

/// The receiver column: its own queues and keys, never a publish.
fn receiver_column() -> Vec<Case> {
    let r = "receiver_1";
    let m1 = body("m-1", "receiver_1");
    vec![
        case("receiver: declare_queue, own, idempotent")
            .row(
                r,
                "declare_queue receiver_1_queue",
                "OK declare_queue receiver_1_queue",
            )
            .row(
                r,
                "declare_queue receiver_1_orders",
                "OK declare_queue receiver_1_orders",
            )
            .row(
                r,
                "declare_queue receiver_1_orders",
                "OK declare_queue receiver_1_orders",
            ),
        case("receiver: declare_exchange")
            .row(r, "declare_exchange rx topic", "OK declare_exchange rx")
            .row(r, "declare_exchange rx2", "OK declare_exchange rx2"),
        case("receiver: bind own queue, own key, and it routes")
            .row(
                r,
                "bind receiver_1_queue ex receiver_1.x",
                "OK bind receiver_1_queue ex receiver_1.x",
            )
            .row("sender_1", publish("ex", "receiver_1.x", "m-1"), "ACK m-1")
            .rows(
                r,
                "fetch receiver_1_queue 10",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            ),
        case("receiver: publish is NACK access_denied and stores nothing")
            .row(
                r,
                publish("ex", "receiver_1", "r-1"),
                "NACK r-1 access_denied",
            )
            .row(
                r,
                publish("nowhere", "receiver_1", "r-2"),
                "NACK r-2 access_denied",
            )
            .row("admin", "fetch receiver_1_queue 10", "OK fetch 0"),
        case("receiver: publish_batch is NACK access_denied per element")
            .rows(
                r,
                format!(
                    "publish_batch ex receiver_1 [{},{}]",
                    body("rb-1", "receiver_1"),
                    body("rb-2", "receiver_1")
                ),
                ["NACK rb-1 access_denied", "NACK rb-2 access_denied"],
            )
            .row("admin", "fetch receiver_1_queue 10", "OK fetch 0"),
        case("receiver: consume own queue; deliveries follow the OK")
            .row("admin", publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                r,
                "consume receiver_1_queue",
                [
                    "OK consume receiver_1_queue".into(),
                    delivery("receiver_1_queue", 1, &m1),
                ],
            ),
        case("receiver: fetch own queue")
            .row(r, "fetch receiver_1_queue 5", "OK fetch 0")
            .row("admin", publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                r,
                "fetch receiver_1_queue 5",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            ),
        case("receiver: nack own delivery, redelivered with its count")
            .row("admin", publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                r,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            )
            .row(r, "nack m-1", "NACK_CONFIRMED m-1")
            .rows(
                r,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 2, &m1), "OK fetch 1".into()],
            )
            .row(r, "nack m-1 receiver_1_queue", "NACK_CONFIRMED m-1")
            .row(r, "nack m-1", "Error: no outstanding delivery m-1"),
        case("receiver: ack own deliveries")
            .row("admin", publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .row("admin", publish("ex", "receiver_1", "m-2"), "ACK m-2")
            .rows(
                r,
                "fetch receiver_1_queue 2",
                [
                    delivery("receiver_1_queue", 1, &m1),
                    delivery("receiver_1_queue", 1, &body("m-2", "receiver_1")),
                    "OK fetch 2".into(),
                ],
            )
            .row(r, "ack m-1", "ACK_CONFIRMED m-1")
            .row(r, "ack m-2 receiver_1_queue", "ACK_CONFIRMED m-2")
            .row(r, "ack m-1", "Error: no outstanding delivery m-1")
            .row(r, "fetch receiver_1_queue 2", "OK fetch 0"),
        case("receiver: resend")
            .row("admin", publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                r,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            )
            .row(r, "resend", "OK resend 1")
            .rows(
                r,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 2, &m1), "OK fetch 1".into()],
            ),
        case("receiver: quit").row(r, "quit", "OK bye"),
        case("receiver: register_public_key").row(
            r,
            format!("register_public_key {}", key(3)),
            "Public key registered",
        ),
        case("receiver: get_public_key")
            .row(
                r,
                format!("register_public_key {}", key(3)),
                "Public key registered",
            )
            .denied(r, "get_public_key receiver_1", DENY_RECEIVER_GET_KEY)
            .denied(r, "get_public_key receiver_2", DENY_RECEIVER_GET_KEY),
        case("receiver: heartbeat").row(r, "heartbeat", "OK heartbeat"),
    ]
}

/// The admin column: everything, on anyone's resources.
fn admin_column() -> Vec<Case> {
    let a = "admin";
    let m1 = body("m-1", "receiver_1");
    vec![
        case("admin: declare_queue, any")
            .row(a, "declare_queue orders", "OK declare_queue orders")
            .row(
                a,
                "declare_queue receiver_2_queue",
                "OK declare_queue receiver_2_queue",
            ),
        case("admin: declare_exchange").row(
            a,
            "declare_exchange ax fanout",
            "OK declare_exchange ax",
        ),
        case("admin: bind any queue with any key")
            .row(a, "declare_queue orders", "OK declare_queue orders")
            .row(a, "bind orders ex anything", "OK bind orders ex anything")
            .row(
                a,
                "bind receiver_2_queue ex receiver_1",
                "OK bind receiver_2_queue ex receiver_1",
            )
            .row(a, "declare_exchange tx topic", "OK declare_exchange tx")
            .row(
                a,
                "bind receiver_2_queue tx #",
                "OK bind receiver_2_queue tx #",
            ),
        case("admin: publish")
            .row(a, publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                a,
                "fetch receiver_1_queue 10",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            ),
        case("admin: publish_batch").rows(
            a,
            format!(
                "publish_batch ex receiver_2 [{},{}]",
                body("b-1", "receiver_2"),
                body("b-2", "receiver_2")
            ),
            ["ACK b-1", "ACK b-2"],
        ),
        case("admin: consume any queue")
            .row(
                a,
                format!("publish ex receiver_2 {}", body("m-2", "receiver_2")),
                "ACK m-2",
            )
            .rows(
                a,
                "consume receiver_2_queue",
                [
                    "OK consume receiver_2_queue".into(),
                    delivery("receiver_2_queue", 1, &body("m-2", "receiver_2")),
                ],
            ),
        case("admin: fetch any queue")
            .row(
                a,
                format!("publish ex receiver_1_2 {}", body("m-3", "receiver_1_2")),
                "ACK m-3",
            )
            .rows(
                a,
                "fetch receiver_1_2_queue 10",
                [
                    delivery("receiver_1_2_queue", 1, &body("m-3", "receiver_1_2")),
                    "OK fetch 1".into(),
                ],
            ),
        case("admin: nack")
            .row(a, publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                a,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            )
            .row(a, "nack m-1 receiver_1_queue", "NACK_CONFIRMED m-1")
            .rows(
                a,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 2, &m1), "OK fetch 1".into()],
            )
            .row(a, "nack m-1", "NACK_CONFIRMED m-1"),
        case("admin: ack")
            .row(a, publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .rows(
                a,
                "fetch receiver_1_queue 1",
                [delivery("receiver_1_queue", 1, &m1), "OK fetch 1".into()],
            )
            .row(a, "ack m-1", "ACK_CONFIRMED m-1"),
        case("admin: resend").row(a, "resend", "OK resend 0"),
        case("admin: quit").row(a, "quit", "OK bye"),
        case("admin: register_public_key, for itself")
            .row(
                a,
                format!("register_public_key {}", key(5)),
                "Public key registered",
            )
            .row(
                a,
                "get_public_key admin",
                format!("PUBLIC_KEY admin {}", key(5)),
            ),
        case("admin: get_public_key")
            .row(
                "receiver_2",
                format!("register_public_key {}", key(6)),
                "Public key registered",
            )
            .row(
                a,
                "get_public_key receiver_2",
                format!("PUBLIC_KEY receiver_2 {}", key(6)),
            ),
        case("admin: heartbeat").row(a, "heartbeat", "OK heartbeat"),
    ]
}

/// A CN in no list is refused before the command loop; were one to get a
/// session, it could still do nothing.
fn unknown_column() -> Vec<Case> {
    let u = "stranger";
    let deny = "unknown client";
    vec![case("unknown CN: every command is denied")
        .denied(u, "heartbeat", deny)
        .denied(u, "declare_queue stranger_queue", deny)
        .denied(u, "declare_exchange sx", deny)
        .denied(u, "bind receiver_1_queue ex receiver_1", deny)
        .denied(u, "consume receiver_1_queue", deny)
        .denied(u, "fetch receiver_1_queue", deny)
        .denied(u, "ack m-1", deny)
        .denied(u, "nack m-1", deny)
        .denied(u, "resend", deny)
        .denied(u, "quit", deny)
        .denied(u, format!("register_public_key {}", key(1)), deny)
        .denied(u, "get_public_key receiver_1", deny)
        .row(
            u,
            publish("ex", "receiver_1", "u-1"),
            "NACK u-1 access_denied",
        )]
}

/// Every command × role of the permission matrix, on memory storage as the
/// socket suites run.
#[test]
fn permission_matrix() {
    let mut cases = sender_column();
    cases.extend(receiver_column());
    cases.extend(admin_column());
    cases.extend(unknown_column());
    let rows = Table::new().world(acl_world()).run(cases);
    assert!(rows >= 100, "{rows} rows");
}

/// The same matrix with a data directory: every declare, bind and key
/// registration is answered by another thread, and the reply still comes
/// in its place.
#[test]
fn permission_matrix_with_replies_decided_off_the_shard() {
    let mut cases = sender_column();
    cases.extend(receiver_column());
    cases.extend(admin_column());
    Table::new()
        .backing(Backing::DataDir)
        .world(acl_world())
        .run(cases);
}

/// The commands that take things away, every role: senders are refused
/// each; a receiver unbinds its own queues with its own keys and deletes
/// the exchanges it owns and purges its own queues; only admins close
/// connections; a receiver deletes its own queues, an admin any.
/// Each row is checked for its effect too (routing after it).
#[test]
fn matrix_of_the_removals() {
    let (s, r, a) = ("sender_1", "receiver_1", "admin");
    let cases = vec![
        case("removals: senders are refused, nothing changes")
            .denied(
                s,
                "unbind receiver_1_queue ex receiver_1",
                "senders may not unbind queues",
            )
            .denied(
                s,
                "purge_queue receiver_1_queue",
                "senders may not purge queues",
            )
            .denied(
                s,
                "delete_queue receiver_1_queue",
                "senders may not delete queues",
            )
            .denied(s, "delete_exchange ex", "senders may not delete exchanges")
            .denied(
                s,
                "close_connection receiver_1",
                "only admins may close connections",
            )
            .row(s, publish("ex", "receiver_1", "m-1"), "ACK m-1"),
        case("removals: a receiver's own binding")
            .denied(r, "unbind receiver_2_queue ex receiver_2", DENY_OWN_QUEUES)
            .denied(r, "unbind receiver_1_queue ex receiver_2", DENY_OWN_KEYS)
            .row(
                r,
                "unbind receiver_1_queue ex receiver_1",
                "OK unbind receiver_1_queue ex receiver_1",
            )
            .row(s, publish("ex", "receiver_1", "m-1"), "NACK m-1 no_route")
            .row(
                s,
                publish_for("ex", "receiver_2", "receiver_2", "m-2"),
                "ACK m-2",
            ),
        case("removals: exchanges only by their owner")
            .row(
                r,
                "declare_exchange receiver_1_x direct",
                "OK declare_exchange receiver_1_x",
            )
            .denied(
                "receiver_2",
                "delete_exchange receiver_1_x",
                "receivers may only delete exchanges they own",
            )
            .denied(
                r,
                "delete_exchange ex",
                "receivers may only delete exchanges they own",
            )
            .row(
                r,
                "delete_exchange receiver_1_x",
                "OK delete_exchange receiver_1_x",
            )
            .row(
                r,
                "delete_exchange receiver_1_x",
                "Error: unknown exchange receiver_1_x",
            ),
        case("removals: admins")
            .row(
                a,
                "unbind receiver_2_queue ex receiver_2",
                "OK unbind receiver_2_queue ex receiver_2",
            )
            .row(
                s,
                publish_for("ex", "receiver_2", "receiver_2", "m-1"),
                "NACK m-1 no_route",
            )
            .row(a, "close_connection nobody", "OK close_connection nobody 0")
            .row(a, "delete_exchange ex", "OK delete_exchange ex")
            .row(s, publish("ex", "receiver_1", "m-2"), "NACK m-2 no_route"),
        case("removals: purge is for the queue's owner or an admin")
            .denied(r, "purge_queue receiver_2_queue", DENY_OWN_QUEUES)
            .row(s, publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .row(
                r,
                "purge_queue receiver_1_queue",
                "OK purge_queue receiver_1_queue 1",
            )
            .rows(a, "fetch receiver_1_queue 10", ["OK fetch 0"])
            .row(
                a,
                "purge_queue receiver_2_queue",
                "OK purge_queue receiver_2_queue 0",
            ),
        case("removals: delete_queue is for the queue's owner or an admin")
            .denied(r, "delete_queue receiver_2_queue", DENY_OWN_QUEUES)
            .denied(r, "delete_queue receiver_2_nowhere", DENY_OWN_QUEUES)
            .row(s, publish("ex", "receiver_1", "m-1"), "ACK m-1")
            .row(
                r,
                "delete_queue receiver_1_queue",
                "OK delete_queue receiver_1_queue",
            )
            .row(s, publish("ex", "receiver_1", "m-2"), "NACK m-2 no_route")
            .row(
                r,
                "delete_queue receiver_1_queue",
                "Error: unknown queue receiver_1_queue",
            )
            .row(
                r,
                "fetch receiver_1_queue 10",
                "Error: unknown queue receiver_1_queue",
            )
            .row(
                a,
                "delete_queue receiver_2_queue",
                "OK delete_queue receiver_2_queue",
            )
            .row(
                s,
                publish_for("ex", "receiver_2", "receiver_2", "m-3"),
                "NACK m-3 no_route",
            )
            .row(
                r,
                "declare_queue receiver_1_queue",
                "OK declare_queue receiver_1_queue",
            )
            .rows(r, "fetch receiver_1_queue 10", ["OK fetch 0"]),
    ];
    Table::new().world(acl_world()).run(cases);
}
