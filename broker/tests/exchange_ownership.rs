//! Exchanges have owners (docs/PROTOCOL.md, "Exchange ownership"): the receiver
//! that declares an exchange first owns it, and no receiver can get copies of
//! messages routed for another. Against a real broker over mutual TLS:
//!
//! - a receiver cannot eavesdrop on another's fanout exchange (or an admin's)
//!   by binding its own queue there: refused, and it gets no copy;
//! - declaring an existing exchange again transfers nothing;
//! - another receiver cannot squat an exchange name (pre-declare it with
//!   another type, or re-declare it) to break its owner;
//! - a topic pattern may only match keys its binder owns (longest CN);
//! - ownership survives a restart.

mod common;

use ciphermq_broker::{BrokerHandle, Config};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::*;

const FANOUT_DENIED: &str =
    "Access denied: receivers may only bind queues to fanout exchanges they own (role=receiver)";

/// Declares `q` and asserts the reply.
async fn declare_queue(conn: &mut Connection, q: &str) {
    check(
        conn,
        &format!("declare_queue {q}"),
        &format!("OK declare_queue {q}"),
    )
    .await;
}

/// Asserts `q` holds nothing for its owner (`fetch` as `conn`).
async fn assert_empty(conn: &mut Connection, q: &str) {
    let got = fetch(conn, q, 100).await;
    assert!(got.is_empty(), "{q} got copies: {:?}", ids(&got));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_cannot_bind_to_another_receivers_fanout_exchange_nor_get_its_copies() {
    let broker = TestBroker::start(2);
    let mut owner = connect_as(&broker, "receiver_1").await;
    let mut spy = connect_as(&broker, "receiver_2").await;
    check(
        &mut owner,
        "declare_exchange news fanout",
        "OK declare_exchange news",
    )
    .await;
    declare_queue(&mut owner, "receiver_1_queue").await;
    check(
        &mut owner,
        "bind receiver_1_queue news receiver_1",
        "OK bind receiver_1_queue news receiver_1",
    )
    .await;

    declare_queue(&mut spy, "receiver_2_queue").await;
    // Declaring it again is the idempotent no-op, and makes the spy no owner.
    check(
        &mut spy,
        "declare_exchange news fanout",
        "OK declare_exchange news",
    )
    .await;
    // With its own queue and its own key: refused all the same.
    check(
        &mut spy,
        "bind receiver_2_queue news receiver_2",
        FANOUT_DENIED,
    )
    .await;
    // Ownership is checked before existence, as the ACL is.
    check(
        &mut spy,
        "bind receiver_2_nope news receiver_2",
        FANOUT_DENIED,
    )
    .await;

    let mut s = connect_as(&broker, "sender_1").await;
    publish_expect(&mut s, "news", "receiver_1", "n-1", "ACK n-1").await;
    publish_expect(&mut s, "news", "receiver_2", "n-2", "ACK n-2").await;
    // Sealed for the spy, which the refused binds would have let in.
    publish_for(
        &mut s,
        "news",
        "receiver_2",
        "receiver_2",
        "n-3",
        "NACK n-3 no_route",
    )
    .await;
    assert_eq!(
        ids(&fetch(&mut owner, "receiver_1_queue", 10).await),
        ["n-1", "n-2"]
    );
    assert_empty(&mut spy, "receiver_2_queue").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_fanout_exchange_belongs_to_no_receiver() {
    let broker = TestBroker::start(1);
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_exchange broadcast fanout",
        "OK declare_exchange broadcast",
    )
    .await;
    let mut r = connect_as(&broker, "receiver_1").await;
    declare_queue(&mut r, "receiver_1_queue").await;
    // Re-declaring does not take it over.
    check(
        &mut r,
        "declare_exchange broadcast fanout",
        "OK declare_exchange broadcast",
    )
    .await;
    check(
        &mut r,
        "bind receiver_1_queue broadcast receiver_1",
        FANOUT_DENIED,
    )
    .await;
    let mut s = connect_as(&broker, "sender_1").await;
    publish_expect(&mut s, "broadcast", "k", "b-1", "NACK b-1 no_route").await;
    // The admin decides who listens.
    check(
        &mut admin,
        "bind receiver_1_queue broadcast x",
        "OK bind receiver_1_queue broadcast x",
    )
    .await;
    publish_expect(&mut s, "broadcast", "k", "b-2", "ACK b-2").await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 10).await), ["b-2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_receivers_exchange_name_cannot_be_squatted() {
    let broker = TestBroker::start(2);
    let mut squatter = connect_as(&broker, "receiver_2").await;
    // A name the longest-CN rule gives receiver_1: refused before it exists,
    // whatever the type.
    for kind in ["topic", "direct", "fanout"] {
        check(
            &mut squatter,
            &format!("declare_exchange receiver_1_events {kind}"),
            "Access denied: receivers may not declare exchanges named for another receiver (role=receiver)",
        )
        .await;
    }
    check(
        &mut squatter,
        "declare_exchange receiver_1_2.events topic",
        "Access denied: receivers may not declare exchanges named for another receiver (role=receiver)",
    )
    .await;

    // So its owner declares it as it wants, and it works.
    let mut owner = connect_as(&broker, "receiver_1").await;
    check(
        &mut owner,
        "declare_exchange receiver_1_events fanout",
        "OK declare_exchange receiver_1_events",
    )
    .await;
    declare_queue(&mut owner, "receiver_1_queue").await;
    check(
        &mut owner,
        "bind receiver_1_queue receiver_1_events receiver_1",
        "OK bind receiver_1_queue receiver_1_events receiver_1",
    )
    .await;

    // A shared name is first come: once the owner has it, another type is the
    // usual error and changes nothing.
    check(
        &mut owner,
        "declare_exchange alerts fanout",
        "OK declare_exchange alerts",
    )
    .await;
    check(
        &mut owner,
        "bind receiver_1_queue alerts receiver_1",
        "OK bind receiver_1_queue alerts receiver_1",
    )
    .await;
    check(
        &mut squatter,
        "declare_exchange alerts topic",
        "Error: exchange alerts exists with type fanout",
    )
    .await;
    check(
        &mut squatter,
        "declare_exchange alerts direct",
        "Error: exchange alerts exists with type fanout",
    )
    .await;
    // The owner's own declaration still succeeds (its client redeclares on
    // every connect) and its bindings still route.
    check(
        &mut owner,
        "declare_exchange alerts fanout",
        "OK declare_exchange alerts",
    )
    .await;
    let mut s = connect_as(&broker, "sender_2").await;
    publish_expect(&mut s, "receiver_1_events", "k", "e-1", "ACK e-1").await;
    publish_expect(&mut s, "alerts", "k", "a-1", "ACK a-1").await;
    assert_eq!(
        ids(&fetch(&mut owner, "receiver_1_queue", 10).await),
        ["e-1", "a-1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_topic_exchanges_stay_shared_with_own_keys() {
    let broker = TestBroker::start(2);
    let mut r1 = connect_as(&broker, "receiver_1").await;
    let mut r2 = connect_as(&broker, "receiver_2").await;
    // The default setup of the receiver tool: one direct `ex`, declared first
    // by receiver_1 and owned by it, still serves every receiver's own key.
    setup_receiver(&mut r1, "receiver_1").await;
    setup_receiver(&mut r2, "receiver_2").await;
    check(&mut r1, "declare_exchange t topic", "OK declare_exchange t").await;
    check(
        &mut r2,
        "bind receiver_2_queue t receiver_2.#",
        "OK bind receiver_2_queue t receiver_2.#",
    )
    .await;
    check_denied(&mut r2, "bind receiver_2_queue t receiver_1.#", "receiver").await;
    check_denied(&mut r2, "bind receiver_2_queue t #", "receiver").await;
    let mut s = connect_as(&broker, "sender_1").await;
    publish_for(&mut s, "ex", "receiver_2", "receiver_2", "d-2", "ACK d-2").await;
    publish_for(
        &mut s,
        "t",
        "receiver_2.a.b",
        "receiver_2",
        "t-2",
        "ACK t-2",
    )
    .await;
    publish_expect(&mut s, "t", "receiver_1.a", "t-1", "NACK t-1 no_route").await;
    assert_eq!(
        ids(&fetch(&mut r2, "receiver_2_queue", 10).await),
        ["d-2", "t-2"]
    );
    assert_empty(&mut r1, "receiver_1_queue").await;
}

/// A broker whose receivers are the test ones plus `receiver_1.eu`, a CN with
/// a dot (no certificate needed: only the ACL's key ownership matters).
fn start_with_dotted_cn(data: &std::path::Path) -> (BrokerHandle, String) {
    let text = config_text(&pki().certs, data, 1, "").replace(
        r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]"#,
        r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2", "receiver_1.eu"]"#,
    );
    assert!(text.contains("receiver_1.eu"));
    let config = Config::from_toml_str(&text, data).unwrap();
    let broker = ciphermq_broker::start(&config).unwrap();
    let addr = broker.local_addr().to_string();
    (broker, addr)
}

async fn connect_to(addr: &str, cn: &str) -> Connection {
    tokio::time::timeout(
        TIMEOUT,
        Connection::connect(addr, &TlsClientOptions::for_cn(&pki().certs, cn)),
    )
    .await
    .expect("connected in time")
    .expect("connected")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_pattern_may_not_match_a_longer_cns_keys() {
    let data = tempfile::tempdir().unwrap();
    let (broker, addr) = start_with_dotted_cn(data.path());
    let mut admin = connect_to(&addr, "admin").await;
    check(
        &mut admin,
        "declare_exchange t topic",
        "OK declare_exchange t",
    )
    .await;
    check(
        &mut admin,
        "declare_queue receiver_1.eu_queue",
        "OK declare_queue receiver_1.eu_queue",
    )
    .await;
    check(
        &mut admin,
        "bind receiver_1.eu_queue t receiver_1.eu.#",
        "OK bind receiver_1.eu_queue t receiver_1.eu.#",
    )
    .await;

    let mut r = connect_to(&addr, "receiver_1").await;
    declare_queue(&mut r, "receiver_1_queue").await;
    // `receiver_1.#` and `receiver_1.*` match `receiver_1.eu…`, which
    // belongs to `receiver_1.eu` (longest CN): refused, with the exact line.
    for pattern in [
        "receiver_1.#",
        "receiver_1.*",
        "receiver_1.*.#",
        "receiver_1.#.secret",
        "receiver_1.*.orders",
    ] {
        check(
            &mut r,
            &format!("bind receiver_1_queue t {pattern}"),
            "Access denied: receivers may only bind patterns that match only routing keys they own (role=receiver)",
        )
        .await;
    }
    // Nor can it name the longer CN's keys outright (nor, with the test CNs,
    // receiver_1_2's).
    for key in [
        "receiver_1.eu.#",
        "receiver_1.eu",
        "receiver_1_2.#",
        "receiver_1_2_x.*",
    ] {
        check_denied(
            &mut r,
            &format!("bind receiver_1_queue t {key}"),
            "receiver",
        )
        .await;
    }
    // Patterns that stay inside its own keys are fine.
    for pattern in [
        "receiver_1.orders.#",
        "receiver_1.orders.*",
        "receiver_1",
        "receiver_1_x.#",
    ] {
        check(
            &mut r,
            &format!("bind receiver_1_queue t {pattern}"),
            &format!("OK bind receiver_1_queue t {pattern}"),
        )
        .await;
    }
    let mut s = connect_to(&addr, "sender_1").await;
    publish_for(
        &mut s,
        "t",
        "receiver_1.eu.secret",
        "receiver_1.eu",
        "eu-1",
        "ACK eu-1",
    )
    .await;
    publish_expect(&mut s, "t", "receiver_1.orders.new", "own-1", "ACK own-1").await;
    assert_eq!(ids(&fetch(&mut r, "receiver_1_queue", 10).await), ["own-1"]);
    assert_eq!(
        ids(&fetch(&mut admin, "receiver_1.eu_queue", 10).await),
        ["eu-1"]
    );
    broker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_survives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start_durable_at(1, data.path(), "127.0.0.1:0");
    {
        let mut owner = connect_as(&broker, "receiver_1").await;
        check(
            &mut owner,
            "declare_exchange news fanout",
            "OK declare_exchange news",
        )
        .await;
        declare_queue(&mut owner, "receiver_1_queue").await;
        check(
            &mut owner,
            "bind receiver_1_queue news receiver_1",
            "OK bind receiver_1_queue news receiver_1",
        )
        .await;
    }
    broker.stop();
    // On a new port: only the data directory matters here.
    let broker = TestBroker::start_durable_at(1, data.path(), "127.0.0.1:0");
    let mut spy = connect_as(&broker, "receiver_2").await;
    declare_queue(&mut spy, "receiver_2_queue").await;
    check(
        &mut spy,
        "bind receiver_2_queue news receiver_2",
        FANOUT_DENIED,
    )
    .await;
    let mut owner = connect_as(&broker, "receiver_1").await;
    check(
        &mut owner,
        "bind receiver_1_queue news receiver_1.more",
        "OK bind receiver_1_queue news receiver_1.more",
    )
    .await;
    let mut s = connect_as(&broker, "sender_1").await;
    publish_expect(&mut s, "news", "k", "r-1", "ACK r-1").await;
    assert_eq!(
        ids(&fetch(&mut owner, "receiver_1_queue", 10).await),
        ["r-1"]
    );
    assert_empty(&mut spy, "receiver_2_queue").await;
}

/// The takeover found from outside: the first receiver to declare a shared
/// direct exchange owns it; it may not delete it (and declare it again as a
/// fanout over its own queue) while another receiver's queue is bound there,
/// and even through a fanout it owns, a receiver's queue stores only
/// envelopes naming that receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_owner_cannot_take_over_another_receivers_messages() {
    let broker = TestBroker::start(2);
    let mut first = connect_as(&broker, "receiver_1").await;
    let mut second = connect_as(&broker, "receiver_2").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    check(
        &mut first,
        "declare_exchange shared direct",
        "OK declare_exchange shared",
    )
    .await;
    check(
        &mut second,
        "declare_exchange shared direct",
        "OK declare_exchange shared",
    )
    .await;
    declare_queue(&mut second, "receiver_2_q").await;
    check(
        &mut second,
        "bind receiver_2_q shared receiver_2",
        "OK bind receiver_2_q shared receiver_2",
    )
    .await;

    // The owner may not delete what another receiver depends on...
    check(
        &mut first,
        "delete_exchange shared",
        "Access denied: receivers may not delete an exchange while queues of other owners are bound to it (role=receiver)",
    )
    .await;
    // ...nor retype it: it still exists, as a direct exchange.
    check(
        &mut first,
        "declare_exchange shared fanout",
        "Error: exchange shared exists with type direct",
    )
    .await;
    publish_for(
        &mut sender,
        "shared",
        "receiver_2",
        "receiver_2",
        "m-1",
        "ACK m-1",
    )
    .await;
    assert_eq!(ids(&fetch(&mut second, "receiver_2_q", 10).await), ["m-1"]);
    check(&mut second, "ack m-1 receiver_2_q", "ACK_CONFIRMED m-1").await;

    // Once the other owner's binding is gone, the owner may delete it.
    check(
        &mut second,
        "unbind receiver_2_q shared receiver_2",
        "OK unbind receiver_2_q shared receiver_2",
    )
    .await;
    check(
        &mut first,
        "delete_exchange shared",
        "OK delete_exchange shared",
    )
    .await;

    // Its own fanout routes everything to its own queue, but the queue takes
    // only receiver_1's envelopes: receiver_2's message finds no lawful
    // queue.
    check(
        &mut first,
        "declare_exchange shared fanout",
        "OK declare_exchange shared",
    )
    .await;
    declare_queue(&mut first, "receiver_1_q").await;
    check(
        &mut first,
        "bind receiver_1_q shared receiver_1",
        "OK bind receiver_1_q shared receiver_1",
    )
    .await;
    publish_for(
        &mut sender,
        "shared",
        "receiver_2",
        "receiver_2",
        "m-2",
        "NACK m-2 no_route",
    )
    .await;
    publish_for(
        &mut sender,
        "shared",
        "receiver_1",
        "receiver_1",
        "m-3",
        "ACK m-3",
    )
    .await;
    assert_eq!(ids(&fetch(&mut first, "receiver_1_q", 10).await), ["m-3"]);
}
