//! What a receiver owns (docs/ARCHITECTURE.md, "Identity and access"): queues
//! by name (prefixes, `.dlq`, the longest CN), routing keys and topic patterns,
//! exchanges it declared first; and authenticated senders (`sender_client_id`).

use super::*;

/// A receiver's own resources: prefixes, `.dlq`, the longest CN, routing
/// keys, and the ACL before existence.
#[test]
fn own_resources() {
    let r = "receiver_1";
    let mut prefixes = case("queues with its CN prefix, and their .dlq");
    for q in [
        "receiver_1_queue",
        "receiver_1_anything",
        "receiver_1_queue.dlq",
    ] {
        prefixes = prefixes
            .row(
                r,
                format!("declare_queue {q}"),
                format!("OK declare_queue {q}"),
            )
            .row(r, format!("consume {q}"), format!("OK consume {q}"))
            .row(r, format!("fetch {q} 1"), "OK fetch 0");
    }
    let mut not_own = case("names without the CN-underscore prefix")
        .row(
            "admin",
            "declare_queue receiver_1queue",
            "OK declare_queue receiver_1queue",
        )
        .row("admin", "declare_queue orders", "OK declare_queue orders");
    for q in [
        "receiver_1queue",
        "orders",
        "receiver_1",
        "queue_receiver_1",
    ] {
        not_own = not_own
            .denied(r, format!("declare_queue {q}"), DENY_OWN_QUEUES)
            .denied(r, format!("consume {q}"), DENY_OWN_QUEUES)
            .denied(r, format!("fetch {q}"), DENY_OWN_QUEUES);
    }
    let m2 = body("m-2", "receiver_2");
    let another = case("another receiver's queue")
        .row("admin", format!("publish ex receiver_2 {m2}"), "ACK m-2")
        .denied(r, "declare_queue receiver_2_queue", DENY_OWN_QUEUES)
        .denied(r, "consume receiver_2_queue", DENY_OWN_QUEUES)
        .denied(r, "consume receiver_2_queue 10", DENY_OWN_QUEUES)
        .denied(r, "fetch receiver_2_queue 10", DENY_OWN_QUEUES)
        .denied(r, "bind receiver_2_queue ex receiver_1", DENY_OWN_QUEUES)
        .denied(r, "nack m-2 receiver_2_queue", DENY_OWN_QUEUES)
        .rows(
            "receiver_2",
            "fetch receiver_2_queue 10",
            [delivery("receiver_2_queue", 1, &m2), "OK fetch 1".into()],
        );
    let m12 = body("m-12", "receiver_1_2");
    let longest = case("the longest receiver CN owns the name")
        .row(
            "admin",
            format!("publish ex receiver_1_2 {m12}"),
            "ACK m-12",
        )
        .denied(r, "declare_queue receiver_1_2_queue", DENY_OWN_QUEUES)
        .denied(r, "consume receiver_1_2_queue", DENY_OWN_QUEUES)
        .denied(r, "fetch receiver_1_2_queue", DENY_OWN_QUEUES)
        .denied(
            r,
            "bind receiver_1_2_queue ex receiver_1_2",
            DENY_OWN_QUEUES,
        )
        .denied(r, "declare_queue receiver_1_2_other", DENY_OWN_QUEUES)
        .row(
            "receiver_1_2",
            "declare_queue receiver_1_2_queue",
            "OK declare_queue receiver_1_2_queue",
        )
        .row(
            "receiver_1_2",
            "declare_queue receiver_1_2_other",
            "OK declare_queue receiver_1_2_other",
        )
        .row(
            "receiver_1_2",
            "bind receiver_1_2_other ex receiver_1_2",
            "OK bind receiver_1_2_other ex receiver_1_2",
        )
        .rows(
            "receiver_1_2",
            "consume receiver_1_2_queue",
            [
                "OK consume receiver_1_2_queue".into(),
                delivery("receiver_1_2_queue", 1, &m12),
            ],
        );
    let mut keys = case("routing keys it owns").row(
        "admin",
        "declare_exchange tx topic",
        "OK declare_exchange tx",
    );
    for k in [
        "receiver_1",
        "receiver_1.x",
        "receiver_1_x",
        "receiver_1.#",
        "receiver_1.*",
    ] {
        keys = keys.row(
            r,
            format!("bind receiver_1_queue tx {k}"),
            format!("OK bind receiver_1_queue tx {k}"),
        );
    }
    for (k, reason) in [
        ("receiver_1x", DENY_OWN_KEYS),
        ("#", DENY_OWN_PATTERNS),
        ("*", DENY_OWN_PATTERNS),
        ("receiver_2", DENY_OWN_KEYS),
        ("receiver_2.x", DENY_OWN_KEYS),
        ("receiver_1_2", DENY_OWN_KEYS),
        ("receiver_1_2.x", DENY_OWN_KEYS),
        ("x.receiver_1", DENY_OWN_KEYS),
        ("receiver_2.#", DENY_OWN_PATTERNS),
    ] {
        keys = keys.denied(r, format!("bind receiver_1_queue tx {k}"), reason);
    }
    // Own key, foreign queue: the queue is judged first.
    keys = keys.denied(r, "bind receiver_2_queue tx receiver_1", DENY_OWN_QUEUES);
    let existence = case("the ACL is checked before existence")
        .denied(r, "consume receiver_2_nope", DENY_OWN_QUEUES)
        .denied(r, "fetch receiver_2_nope", DENY_OWN_QUEUES)
        .denied(r, "bind receiver_2_nope ex receiver_1", DENY_OWN_QUEUES)
        .denied(
            r,
            "bind receiver_2_nope nowhere receiver_1",
            DENY_OWN_QUEUES,
        )
        .denied(r, "consume receiver_1_2_nope", DENY_OWN_QUEUES)
        .row(
            r,
            "consume receiver_1_nope",
            "Error: unknown queue receiver_1_nope",
        )
        .row(
            r,
            "fetch receiver_1_nope",
            "Error: unknown queue receiver_1_nope",
        )
        .row(
            r,
            "bind receiver_1_nope ex receiver_1",
            "Error: unknown queue receiver_1_nope",
        )
        .row(
            r,
            "bind receiver_1_queue nowhere receiver_1",
            "Error: unknown exchange nowhere",
        );
    Table::new()
        .world(acl_world())
        .run(vec![prefixes, not_own, another, longest, keys, existence]);
}

/// With receivers `receiver_1` and `receiver_1.eu`, a pattern of
/// `receiver_1` may not match the longer CN's keys: none of those it may
/// bind routes a `receiver_1.eu…` key to its queue, and its envelopes under
/// such a key are `no_route` (the longer CN's queue takes only its own).
#[test]
fn topic_patterns_may_not_match_a_longer_cns_keys() {
    const WITH_DOTTED: &[&str] = &["receiver_1", "receiver_2", "receiver_1_2", "receiver_1.eu"];
    let r = "receiver_1";
    let world = case("world")
        .row("admin", "declare_exchange t topic", "OK declare_exchange t")
        .row(
            "admin",
            "declare_queue receiver_1.eu_queue",
            "OK declare_queue receiver_1.eu_queue",
        )
        .row(
            "admin",
            "bind receiver_1.eu_queue t receiver_1.eu.#",
            "OK bind receiver_1.eu_queue t receiver_1.eu.#",
        )
        .row(
            r,
            "declare_queue receiver_1_queue",
            "OK declare_queue receiver_1_queue",
        );
    let mut c = case("patterns");
    for (k, reason) in [
        ("receiver_1.#", DENY_OWN_PATTERNS),
        ("receiver_1.*", DENY_OWN_PATTERNS),
        ("receiver_1.*.#", DENY_OWN_PATTERNS),
        ("receiver_1.#.secret", DENY_OWN_PATTERNS),
        ("receiver_1.*.orders", DENY_OWN_PATTERNS),
        ("receiver_1.eu.#", DENY_OWN_PATTERNS),
        ("receiver_1.eu", DENY_OWN_KEYS),
        ("receiver_1_2.#", DENY_OWN_PATTERNS),
        ("receiver_1_2_x.*", DENY_OWN_PATTERNS),
    ] {
        c = c.denied(r, format!("bind receiver_1_queue t {k}"), reason);
    }
    for k in [
        "receiver_1.orders.#",
        "receiver_1.orders.*",
        "receiver_1",
        "receiver_1_x.#",
    ] {
        c = c.row(
            r,
            format!("bind receiver_1_queue t {k}"),
            format!("OK bind receiver_1_queue t {k}"),
        );
    }
    let own = body("own-1", "receiver_1");
    let eu = body("eu-1", "receiver_1.eu");
    c = c
        .row(
            "sender_1",
            publish_for("t", "receiver_1.eu.secret", "receiver_1.eu", "eu-1"),
            "ACK eu-1",
        )
        // Sealed for receiver_1, it could only go to receiver_1's queue: no
        // pattern receiver_1 bound matches the longer CN's key.
        .row(
            "sender_1",
            publish("t", "receiver_1.eu.secret", "eu-2"),
            "NACK eu-2 no_route",
        )
        .row(
            "sender_1",
            publish("t", "receiver_1.orders.new", "own-1"),
            "ACK own-1",
        )
        .rows(
            r,
            "fetch receiver_1_queue 10",
            [delivery("receiver_1_queue", 1, &own), "OK fetch 1".into()],
        )
        .rows(
            "receiver_1.eu",
            "fetch receiver_1.eu_queue 10",
            [delivery("receiver_1.eu_queue", 1, &eu), "OK fetch 1".into()],
        );
    Table::new()
        .receivers(WITH_DOTTED)
        .world(world)
        .run(vec![c]);
}

/// Exchanges have owners: fanout binds need ownership, re-declaring takes
/// nothing over, names of another receiver are refused.
#[test]
fn exchange_ownership() {
    let (r1, r2) = ("receiver_1", "receiver_2");
    let fanout = case("binding to a fanout exchange needs its ownership")
        .row(
            "admin",
            "declare_exchange af fanout",
            "OK declare_exchange af",
        )
        .row(r1, "declare_exchange rf fanout", "OK declare_exchange rf")
        .row(
            r1,
            "bind receiver_1_queue rf receiver_1",
            "OK bind receiver_1_queue rf receiver_1",
        )
        .denied(r2, "bind receiver_2_queue rf receiver_2", DENY_FANOUT)
        .denied(r1, "bind receiver_1_queue af receiver_1", DENY_FANOUT)
        // Ownership is judged before existence, as the ACL is.
        .denied(r2, "bind receiver_2_nope rf receiver_2", DENY_FANOUT)
        .row(
            "admin",
            "bind receiver_2_queue af anything",
            "OK bind receiver_2_queue af anything",
        )
        .row(
            "admin",
            "bind receiver_1_2_queue rf anything",
            "OK bind receiver_1_2_queue rf anything",
        )
        .row("sender_1", publish("rf", "receiver_1", "f-1"), "ACK f-1")
        .rows(
            r1,
            "fetch receiver_1_queue 10",
            [
                delivery("receiver_1_queue", 1, &body("f-1", "receiver_1")),
                "OK fetch 1".into(),
            ],
        )
        .row(r2, "fetch receiver_2_queue 10", "OK fetch 0");
    let redeclare = case("declaring it again transfers nothing")
        .row(
            r1,
            "declare_exchange news fanout",
            "OK declare_exchange news",
        )
        .row(
            r2,
            "declare_exchange news fanout",
            "OK declare_exchange news",
        )
        .denied(r2, "bind receiver_2_queue news receiver_2", DENY_FANOUT)
        .row(
            "admin",
            "declare_exchange broadcast fanout",
            "OK declare_exchange broadcast",
        )
        .row(
            r1,
            "declare_exchange broadcast fanout",
            "OK declare_exchange broadcast",
        )
        .denied(
            r1,
            "bind receiver_1_queue broadcast receiver_1",
            DENY_FANOUT,
        );
    let mut names = case("exchange names of another receiver");
    for name in [
        "receiver_2",
        "receiver_2_fan",
        "receiver_2.x",
        "receiver_1_2_fan",
    ] {
        names = names.denied(
            r1,
            format!("declare_exchange {name} fanout"),
            DENY_EXCHANGE_NAME,
        );
    }
    names = names
        .denied(
            r2,
            "declare_exchange receiver_1_2.events topic",
            DENY_EXCHANGE_NAME,
        )
        .row(
            r1,
            "declare_exchange receiver_1_fan fanout",
            "OK declare_exchange receiver_1_fan",
        )
        .row(
            "admin",
            "declare_exchange receiver_2_fan fanout",
            "OK declare_exchange receiver_2_fan",
        );
    let squat = case("a shared name is first come")
        .row(
            r1,
            "declare_exchange alerts fanout",
            "OK declare_exchange alerts",
        )
        .row(
            r2,
            "declare_exchange alerts topic",
            "Error: exchange alerts exists with type fanout",
        )
        .row(
            r2,
            "declare_exchange alerts direct",
            "Error: exchange alerts exists with type fanout",
        )
        .row(
            r1,
            "declare_exchange alerts fanout",
            "OK declare_exchange alerts",
        );
    Table::new()
        .world(acl_world())
        .run(vec![fanout, redeclare, names, squat]);
}

/// A body naming its sender must name the publisher.
#[test]
fn sender_client_id_must_be_the_publishers_cn() {
    let s = "sender_1";
    let own = signed("o-1", "receiver_1", "sender_1");
    let fb2 = signed("fb-2", "receiver_1", "sender_1");
    let a2 = signed("a-2", "receiver_1", "admin");
    let odd = body("n-1", "receiver_1").replace(r#""nonce""#, r#""sender_client_id":7,"nonce""#);
    let c = case("forged, own, and mistyped sender ids")
        .row(
            s,
            format!(
                "publish ex receiver_1 {}",
                signed("f-1", "receiver_1", "sender_2")
            ),
            "NACK f-1 access_denied",
        )
        .rows(
            s,
            format!(
                "publish_batch ex receiver_1 [{},{fb2}]",
                signed("fb-1", "receiver_1", "sender_2")
            ),
            ["NACK fb-1 access_denied", "ACK fb-2"],
        )
        .row(s, format!("publish ex receiver_1 {own}"), "ACK o-1")
        .row(
            "admin",
            format!(
                "publish ex receiver_1 {}",
                signed("a-1", "receiver_1", "sender_1")
            ),
            "NACK a-1 access_denied",
        )
        .row("admin", format!("publish ex receiver_1 {a2}"), "ACK a-2")
        .row(
            s,
            format!("publish ex receiver_1 {odd}"),
            "NACK n-1 invalid",
        )
        .rows(
            "admin",
            "fetch receiver_1_queue 10",
            [
                delivery("receiver_1_queue", 1, &fb2),
                delivery("receiver_1_queue", 1, &own),
                delivery("receiver_1_queue", 1, &a2),
                "OK fetch 3".into(),
            ],
        );
    Table::new().world(acl_world()).run(vec![c]);
}

/// `acl.require_sender_id`: a body without a sender is invalid.
#[test]
fn with_require_sender_id_a_publish_must_name_its_sender() {
    let s = "sender_1";
    let mb2 = signed("mb-2", "receiver_1", "sender_1");
    let m4 = signed("m-4", "receiver_1", "sender_1");
    let null =
        body("m-3", "receiver_1").replace(r#""nonce""#, r#""sender_client_id":null,"nonce""#);
    let c = case("require_sender_id")
        .row(s, publish("ex", "receiver_1", "m-1"), "NACK m-1 invalid")
        .rows(
            s,
            format!(
                "publish_batch ex receiver_1 [{},{mb2}]",
                body("mb-1", "receiver_1")
            ),
            ["NACK mb-1 invalid", "ACK mb-2"],
        )
        .row(
            s,
            format!(
                "publish ex receiver_1 {}",
                signed("m-2", "receiver_1", "sender_2")
            ),
            "NACK m-2 access_denied",
        )
        .row(
            s,
            format!("publish ex receiver_1 {null}"),
            "NACK m-3 invalid",
        )
        .row(s, format!("publish ex receiver_1 {m4}"), "ACK m-4")
        .rows(
            "admin",
            "fetch receiver_1_queue 10",
            [
                delivery("receiver_1_queue", 1, &mb2),
                delivery("receiver_1_queue", 1, &m4),
                "OK fetch 2".into(),
            ],
        );
    Table::new()
        .extra("require_sender_id = true")
        .world(acl_world())
        .run(vec![c]);
}
