//! The session's own state: its greeting, `quit`, what it owes when it
//! closes, and its role across a reload.

use super::*;

/// `HELLO ciphermq/1 <cn> <role>`.
#[test]
fn the_greeting_names_the_client_and_its_role() {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    for (cn, role) in [
        ("sender_1", "sender"),
        ("receiver_1_2", "receiver"),
        ("admin", "admin"),
    ] {
        let mut client = broker.client(cn);
        client.session.greet();
        assert_eq!(
            client.take_lines(),
            [format!("HELLO ciphermq/1 {cn} {role}")]
        );
    }
}

/// After `quit` the connection executes nothing more.
#[test]
fn quit_says_bye_and_marks_the_session_closing() {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    let mut client = broker.client("sender_1");
    assert_eq!(client.send(b"heartbeat"), ["OK heartbeat"]);
    assert!(!client.session.closing);
    assert_eq!(client.send(b"quit"), ["OK bye"]);
    assert!(client.session.closing);
}

/// What a session was delivered goes back to its queue when it closes.
#[test]
fn a_fetch_marks_the_session_as_one_to_requeue_on_close() {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    let mut admin = routed_admin(&broker);
    assert_eq!(
        admin.send(publish("ex", "receiver_1", "m-1").as_bytes()),
        ["ACK m-1"]
    );
    let mut r = broker.client("receiver_1");
    assert!(!r.session.consumed);
    r.send(b"fetch receiver_1_queue 1");
    assert!(r.session.consumed);
    assert_eq!(r.session.tracker.len(), 1);
    // Its close gives the delivery back, counted.
    drop(r);
    let m1 = body("m-1", "receiver_1");
    assert_eq!(
        admin.send(b"fetch receiver_1_queue 1"),
        [delivery("receiver_1_queue", 2, &m1), "OK fetch 1".into()]
    );
}

/// A reload that takes a CN's role away ends its sessions; others go on.
#[test]
fn a_reload_that_changes_the_role_ends_the_session() {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    let mut r1 = broker.client("receiver_1");
    let mut r2 = broker.client("receiver_2");
    assert!(r1.session.refresh_policy().is_ok() && r2.session.refresh_policy().is_ok());
    let text = config_text(Backing::Memory, &["receiver_2"], "");
    let config = Config::parse_unchecked(&text, std::path::Path::new("/")).expect("config");
    broker.local.shared.policy.reload(&config);
    assert_eq!(
        r1.session.refresh_policy(),
        Err(crate::session::Revoked::Role),
        "receiver_1 lost its role"
    );
    assert!(
        r2.session.refresh_policy().is_ok(),
        "receiver_2 kept its role"
    );
    assert_eq!(r2.send(b"heartbeat"), ["OK heartbeat"]);
}

/// What a command weighs, for the connection's per-turn budget: 1, or the
/// messages a `fetch`, `consume`, `ack_batch`, `publish_batch` or `resend`
/// may move in one step, so that a pipeline of large fetches cannot hold
/// the shard for all of them in one turn.
#[test]
fn a_command_weighs_the_messages_it_may_move() {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    let mut admin = routed_admin(&broker);
    for id in ["m-1", "m-2", "m-3"] {
        let publish = publish("ex", "receiver_1", id);
        assert_eq!(admin.session.execute(publish.as_bytes()), 1);
    }
    assert_eq!(admin.session.execute(b"heartbeat"), 1);
    admin.settle();
    let mut r = broker.client("receiver_1");
    assert_eq!(r.session.execute(b"fetch receiver_1_queue 5000"), 5000);
    assert_eq!(r.session.execute(b"fetch receiver_1_queue"), 1);
    assert_eq!(r.session.execute(b"ack_batch receiver_1_queue a b c"), 4);
    r.settle();
    // The three fetched are owed: resend gives back each.
    assert_eq!(r.session.execute(b"resend"), 3);
    assert_eq!(r.session.execute(b"consume receiver_1_queue 300"), 300);
    assert_eq!(r.session.execute(b"consume receiver_1_queue"), 1000);
    // Refused, so nothing moves.
    assert_eq!(r.session.execute(b"fetch receiver_2_queue 5000"), 1);
    assert_eq!(r.session.execute(b"consume receiver_2_queue 300"), 1);
    r.settle();
    r.take_lines();
}

/// An admin session of `broker`, after it has built the routed world.
fn routed_admin(broker: &Broker) -> Client {
    let mut admin = broker.client("admin");
    for step in &routed_world().steps {
        assert_eq!(admin.send(&step.line), step.replies);
    }
    admin
}

/// Counts its wake-ups.
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A consumer at its prefetch is woken, with nothing in its mailbox, by a
/// publish that has to wait for it: its connection then reads the acks its
/// socket may already hold instead of waiting for the reactor to notice.
#[test]
fn a_full_consumer_is_woken_by_a_publish_that_waits_for_it() {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    let mut admin = routed_admin(&broker);
    let mut r = broker.client("receiver_1");
    assert_eq!(
        r.send(b"consume receiver_1_queue 1"),
        ["OK consume receiver_1_queue"]
    );
    assert_eq!(
        admin.send(publish("ex", "receiver_1", "m-1").as_bytes()),
        ["ACK m-1"]
    );
    r.settle();
    let m1 = body("m-1", "receiver_1");
    assert_eq!(r.take_lines(), [delivery("receiver_1_queue", 1, &m1)]);

    let counter = Arc::new(CountingWaker(Default::default()));
    r.mailbox.register(&std::task::Waker::from(counter.clone()));
    assert_eq!(
        admin.send(publish("ex", "receiver_1", "m-2").as_bytes()),
        ["ACK m-2"]
    );
    assert_eq!(counter.0.load(std::sync::atomic::Ordering::Relaxed), 1);
    let mut events = VecDeque::new();
    r.mailbox.drain_into(&mut events);
    assert!(events.is_empty(), "a wake-up, not a delivery");

    // Its ack makes room, and m-2 follows.
    let m2 = body("m-2", "receiver_1");
    let lines = r.send(b"ack m-1 receiver_1_queue");
    assert!(
        lines.contains(&delivery("receiver_1_queue", 1, &m2)),
        "{lines:?}"
    );
}
