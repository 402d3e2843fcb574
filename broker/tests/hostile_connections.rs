//! Hostile connections: a handshake flood (one address opens connections
//! and never starts TLS: past `performance.max_handshakes_per_ip` its new
//! connections are closed at once, before any TLS, while a client from
//! another address still gets its greeting promptly), and one certificate
//! opening connection after connection (capped whether or not the token
//! buckets of `[rate_limit]` are on).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::{pki, TestBroker, TIMEOUT};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

const CAP: usize = 4;

/// A TCP connection to `addr` from the local address `from`.
async fn tcp_from(from: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(addr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_flood_from_one_address_is_cut_before_tls_and_others_are_served() {
    let broker = TestBroker::start_with(
        1,
        &format!("\n[performance]\nmax_handshakes_per_ip = {CAP}\nmax_handshakes = 64\n"),
    );
    let addr: SocketAddr = broker.addr.parse().unwrap();
    // The flood: connections that never say a word.
    let mut flood = Vec::new();
    for _ in 0..CAP {
        flood.push(tcp_from("127.0.0.1", addr).await.unwrap());
    }
    // Give the broker time to accept them all.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // One more from that address is closed at once, well before the
    // handshake timeout (10 s).
    let started = Instant::now();
    let mut extra = tcp_from("127.0.0.1", addr).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(TIMEOUT, extra.read(&mut byte))
        .await
        .expect("closed, not left hanging");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed without a byte: {read:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // Another address is served while the flood holds its places.
    let tcp = tcp_from("127.0.0.2", addr).await.unwrap();
    let connector = TlsClientOptions::for_cn(&pki().certs, "sender_1")
        .connector()
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio::time::timeout(TIMEOUT, connector.connect(name, tcp))
        .await
        .expect("handshake in time")
        .expect("handshake");
    let mut hello = String::new();
    tokio::time::timeout(TIMEOUT, BufReader::new(tls).read_line(&mut hello))
        .await
        .expect("greeting in time")
        .unwrap();
    assert_eq!(hello.trim_end(), "HELLO ciphermq/1 sender_1 sender");

    // When the flood goes, its address is served again: once the broker has
    // seen the closes, which a busy host may delay, so retried until then.
    drop(flood);
    let opts = TlsClientOptions::for_cn(&pki().certs, "sender_2");
    let deadline = Instant::now() + TIMEOUT;
    let mut c = loop {
        match tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &opts)).await {
            Ok(Ok(c)) => break c,
            Ok(Err(e)) => assert!(
                Instant::now() < deadline,
                "127.0.0.1 still turned away after its flood closed: {e}"
            ),
            Err(_) => panic!("connect as sender_2: no HELLO within {TIMEOUT:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    common::check(&mut c, "heartbeat", "OK heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_cn_are_capped_by_default() {
    // [rate_limit] stays disabled: the caps hold anyway.
    let broker = TestBroker::start_with(1, "\n[rate_limit]\nmax_connections_per_cn = 2\n");
    let _first = common::connect_as(&broker, "sender_1").await;
    let _second = common::connect_as(&broker, "sender_1").await;
    let raw = ciphermq_clients::connection::Connection::connect_raw(
        &broker.addr,
        &TlsClientOptions::for_cn(&pki().certs, "sender_1"),
    )
    .await
    .expect("TLS succeeds; the refusal comes as a line");
    let mut lines = BufReader::new(raw);
    let mut line = String::new();
    tokio::time::timeout(TIMEOUT, lines.read_line(&mut line))
        .await
        .expect("an answer in time")
        .unwrap();
    assert_eq!(line.trim_end(), "Error: connection limit reached");
    // Another CN is not affected.
    let mut other = common::connect_as(&broker, "sender_2").await;
    common::check(&mut other, "heartbeat", "OK heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_of_everything_is_served_up_to_the_cap() {
    let broker = TestBroker::start_with(1, "\n[performance]\nmax_fetch = 10\n");
    let mut r = common::connect_as(&broker, "receiver_1").await;
    common::setup_receiver(&mut r, "receiver_1").await;
    let mut s = common::connect_as(&broker, "sender_1").await;
    for i in 0..25 {
        let id = format!("m{i}");
        common::publish_expect(&mut s, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
    }
    // The largest max there is: the reply still holds ten.
    let got = common::fetch(&mut r, "receiver_1_queue", u32::MAX).await;
    assert_eq!(
        common::ids(&got),
        (0..10).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    let got = common::fetch(&mut r, "receiver_1_queue", u32::MAX).await;
    assert_eq!(got.len(), 10, "the next ten");
}

/// A receiver that fetches and never acks is stopped at
/// `performance.max_unacked_per_connection`: the last fetch is served up to
/// the room left, the next is refused with a line saying why, other
/// connections fetch on, and closing the hoarder gives its deliveries back.
/// Over 2 shards (the queue may live on the other one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_acks_is_stopped_at_the_unacked_cap() {
    let broker = TestBroker::start_with(
        2,
        "\n[performance]\nmax_fetch = 30\nmax_unacked_per_connection = 100\n",
    );
    let mut hoarder = common::connect_as(&broker, "receiver_1").await;
    common::setup_receiver(&mut hoarder, "receiver_1").await;
    let mut s = common::connect_as(&broker, "sender_1").await;
    for i in 0..250 {
        let id = format!("m{i}");
        common::publish_expect(&mut s, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
    }
    let mut held = 0;
    for want in [30, 30, 30, 10] {
        let got = common::fetch(&mut hoarder, "receiver_1_queue", 30).await;
        assert_eq!(got.len(), want, "after {held}");
        held += got.len();
    }
    let reply = common::ask(&mut hoarder, "fetch receiver_1_queue 30").await;
    assert_eq!(
        reply,
        "Error: fetch: this connection holds 100 unacked deliveries, the most one may \
         (performance.max_unacked_per_connection); ack or nack some first"
    );
    // Another connection has room of its own.
    let mut other = common::connect_as(&broker, "receiver_1").await;
    let got = common::fetch(&mut other, "receiver_1_queue", 30).await;
    assert_eq!(common::ids(&got)[0], "m100");
    // The hoarder's 100 go back to the queue when it leaves.
    drop(hoarder);
    let mut back = Vec::new();
    for _ in 0..100 {
        let got = common::fetch(&mut other, "receiver_1_queue", 30).await;
        let ids = common::ids(&got);
        for id in &ids {
            common::check(
                &mut other,
                &format!("ack {id}"),
                &format!("ACK_CONFIRMED {id}"),
            )
            .await;
        }
        back.extend(got.into_iter().filter(|g| g.count == 2).map(|g| g.id));
        if back.len() == 100 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    back.sort_by_key(|id| id[1..].parse::<u32>().unwrap());
    assert_eq!(back, (0..100).map(|i| format!("m{i}")).collect::<Vec<_>>());
}

/// A receiver that closes owing more deliveries than one shard step gives
/// back (they go back a slice at a time, as chores): every one is
/// redelivered, once, oldest first, to a consumer that was waiting all
/// along. Over 2 shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_closing_with_thousands_owed_has_each_redelivered_in_order() {
    const N: usize = 3000;
    let broker = TestBroker::start_with(2, "");
    let mut hoarder = common::connect_as(&broker, "receiver_1").await;
    common::setup_receiver(&mut hoarder, "receiver_1").await;
    common::check(
        &mut hoarder,
        &format!("consume receiver_1_queue {N}"),
        "OK consume receiver_1_queue",
    )
    .await;
    let all: Vec<String> = (0..N).map(|i| format!("h{i}")).collect();
    let answers = common::process::publish_pipelined(&broker.addr, "sender_1", &all, 200).await;
    assert!(answers.iter().all(|(id, r)| *r == format!("ACK {id}")));
    for id in &all {
        let got = common::next_delivery(&mut hoarder).await;
        assert_eq!((&got.id, got.count), (id, 1));
    }
    // Waiting with room for all of them, and nothing to take yet.
    let mut waiting = common::connect_as(&broker, "receiver_1").await;
    common::check(
        &mut waiting,
        &format!("consume receiver_1_queue {N}"),
        "OK consume receiver_1_queue",
    )
    .await;
    common::assert_silent(&mut waiting, Duration::from_millis(200), "all are owed").await;
    drop(hoarder);
    for id in &all {
        let got = common::next_delivery(&mut waiting).await;
        assert_eq!((&got.id, got.count), (id, 2), "redelivered in order, once");
    }
    common::assert_silent(&mut waiting, Duration::from_millis(300), "each one once").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_line_never_keeps_its_connection_and_others_are_served() {
    let broker = TestBroker::start_with(1, "\n[performance]\nidle_timeout_sec = 2\n");
    let mut slow = common::connect_as(&broker, "sender_1").await;
    let started = Instant::now();
    // One byte at a time of a line that never ends.
    let closed = loop {
        slow.queue_bytes(b"h");
        if slow.flush().await.is_err() {
            break true;
        }
        match tokio::time::timeout(Duration::from_millis(300), slow.read_line()).await {
            Ok(Ok(None)) | Ok(Err(_)) => break true,
            Ok(Ok(Some(line))) => panic!("unexpected reply to half a line: {line}"),
            Err(_) => {}
        }
        // Meanwhile another client is served.
        let mut other = common::connect_as(&broker, "sender_2").await;
        common::check(&mut other, "heartbeat", "OK heartbeat").await;
        if started.elapsed() > Duration::from_secs(8) {
            break false;
        }
    };
    assert!(
        closed,
        "bytes of an unfinished line kept the connection past idle_timeout_sec"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_holds_only_its_prefetch() {
    use common::process::{publish_pipelined, BrokerProcess};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let admin = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";
    std::fs::write(
        &config,
        common::config_text(&pki().certs, &dir.path().join("data"), 1, admin),
    )
    .unwrap();
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    common::setup_receiver(&mut r, "receiver_1").await;
    // Consumes and then never reads a byte again.
    common::check(
        &mut r,
        "consume receiver_1_queue 100",
        "OK consume receiver_1_queue",
    )
    .await;
    let ids: Vec<String> = (0..20_000).map(|i| format!("m{i}")).collect();
    let answers = publish_pipelined(&broker.addr, "sender_1", &ids, 500).await;
    assert!(answers
        .iter()
        .all(|(id, line)| *line == format!("ACK {id}")));
    // Others are served meanwhile.
    let mut other = broker.connect("receiver_2").await;
    common::check(&mut other, "heartbeat", "OK heartbeat").await;
    // What waits for the silent consumer is its prefetch, not the backlog:
    // the rest stays ready in the queue (counts refresh about once a second).
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, body) = broker.admin_get("admin", "/api/queues").await;
        assert_eq!(status, 200, "{body}");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        let q = doc["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|q| q["name"] == "receiver_1_queue"))
            .cloned()
            .unwrap_or_default();
        if q["unacked"] == 100 && q["ready"] == 19_900 {
            break;
        }
        assert!(Instant::now() < deadline, "queue state: {q}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(r);
}
