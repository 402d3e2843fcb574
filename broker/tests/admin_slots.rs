//! The admin endpoint keeps serving monitoring while hostile clients hold
//! connections (`[admin]` connection limits): 200 idle sockets that never
//! send a byte do not lock `/metrics` and `/ready` out, a slowloris client
//! (one byte a second) and an idle kept-alive connection are closed at their
//! deadlines, and one address cannot hold more than its share of slots.
//!
//! Several client addresses are simulated with source addresses in
//! 127.0.0.0/8 (all loopback on Linux). Timing bounds are generous (the
//! shared `TIMEOUT`, 10 s) and only ever upper bounds.

mod common;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ciphermq_clients::connection::TlsClientOptions;
use ciphermq_testkit::RunningBroker;
use common::admin_http::{request, Reply};
use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;

/// A broker with the admin endpoint on a free port.
struct AdminBroker {
    _broker: RunningBroker,
    admin: SocketAddr,
}

impl AdminBroker {
    /// With `limits` (keys of `[admin]`) besides `enabled` and `address`.
    fn start(limits: &str) -> AdminBroker {
        let data = tempfile::tempdir().expect("tempdir");
        let admin = format!("\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n{limits}\n");
        let text = config_text(&pki().certs, data.path(), 1, &admin);
        let broker = RunningBroker::start_text(&text, data.path()).keeping(data);
        let admin = broker.admin_addr().expect("admin endpoint enabled");
        AdminBroker {
            _broker: broker,
            admin,
        }
    }

    /// `GET path` as `cn` from 127.0.0.1, on a new connection, bounded by
    /// `TIMEOUT`; panics when there is no answer.
    async fn get(&self, cn: &str, path: &str) -> Reply {
        let started = Instant::now();
        let reply = request(self.admin, Some(cn), "GET", path)
            .await
            .unwrap_or_else(|e| panic!("GET {path} as {cn}: {e}"));
        assert!(started.elapsed() <= TIMEOUT, "GET {path} took too long");
        reply
    }

    /// The admin endpoint's metrics text.
    async fn metrics(&self) -> String {
        let reply = self.get("admin", "/metrics").await;
        assert_eq!(reply.status, 200, "/metrics: {}", reply.body);
        reply.body
    }

    /// Scrapes `/metrics` until `done` holds, for up to `TIMEOUT`.
    async fn metrics_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let text = self.metrics().await;
            if done(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "{what} never held:\n{text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The value of the sample of `name` whose labels contain `labels` (all
/// samples summed when several match).
fn sample(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name && series.contains(labels))
                .then(|| value.parse::<f64>().expect("numeric sample"))
        })
        .sum()
}

fn loopback(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// A TCP connection to `to` from `source` (a loopback address other than
/// 127.0.0.1 stands for another client host).
async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    tokio::time::timeout(TIMEOUT, socket.connect(to))
        .await
        .map_err(|_| io::Error::other("TCP connect timed out"))?
}

/// A mutual-TLS connection as `cn` from `source`.
async fn tls_from(source: Ipv4Addr, to: SocketAddr, cn: &str) -> io::Result<TlsStream<TcpStream>> {
    let tcp = connect_from(source, to).await?;
    let options = TlsClientOptions::for_cn(&pki().certs, cn);
    let connector = options.connector().map_err(io::Error::other)?;
    let name = options.server_name().map_err(io::Error::other)?;
    tokio::time::timeout(TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| io::Error::other("TLS handshake timed out"))?
}

/// `GET path` on a kept-alive connection; reads exactly one response and
/// returns its status.
async fn get_kept_alive<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    path: &str,
) -> io::Result<u16> {
    let exchange = async {
        let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.flush().await?;
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed mid-response",
                ));
            }
            raw.push(byte[0]);
            if raw.len() > 16 * 1024 {
                return Err(io::Error::other("response head too long"));
            }
        }
        let head = String::from_utf8_lossy(&raw).into_owned();
        let status = head
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no status line in {head:?}")))?;
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("no content-length in {head:?}")))?;
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await?;
        Ok(status)
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::other("no answer in time"))?
}

/// How a dripping client ended.
#[derive(Debug)]
struct Dripped {
    /// Bytes it got to send before the server closed.
    sent: usize,
    /// What the server sent back (nothing useful, for a client that never
    /// finished a request).
    received: Vec<u8>,
}

/// Sends `bytes` one a second and waits for the server to close the
/// connection; panics if it does not within `TIMEOUT`.
async fn drip<S: AsyncRead + AsyncWrite + Unpin>(stream: S, bytes: &[u8]) -> Dripped {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut received = Vec::new();
    let mut sent = 0;
    let run = async {
        let mut buf = [0u8; 1024];
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                read = rd.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => received.extend_from_slice(&buf[..n]),
                },
                _ = tick.tick() => {
                    let Some(&b) = bytes.get(sent) else { continue };
                    if wr.write_all(&[b]).await.is_err() || wr.flush().await.is_err() {
                        return;
                    }
                    sent += 1;
                }
            }
        }
    };
    tokio::time::timeout(TIMEOUT, run)
        .await
        .expect("the server did not close a connection that sends one byte a second");
    Dripped { sent, received }
}

#[tokio::test]
async fn monitoring_is_served_while_200_idle_connections_are_open() {
    // Header deadline far away: only the slot policy can keep monitoring
    // served here, not idle sockets timing out.
    let broker = AdminBroker::start("header_timeout_secs = 60");
    // 200 sockets from 25 addresses (8 each, the per-address cap),
    // 127.0.0.1 included, which the monitoring below also uses.
    // (A socket the server closes before connect() returns counts as one an
    // attacker could not keep: only those that got through are counted.)
    let mut idle = Vec::with_capacity(200);
    for i in 0..200u16 {
        let source = loopback(1 + (i % 25) as u8);
        match connect_from(source, broker.admin).await {
            Ok(stream) => idle.push(stream),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("idle connection {i} from {source}: {e}"),
        }
    }
    let opened = idle.len() as f64;

    // Monitoring answers, again and again.
    for round in 0..3 {
        let ready = broker.get("sender_1", "/ready").await;
        assert_eq!(ready.status, 200, "round {round}: /ready {}", ready.body);
        broker.metrics().await;
    }
    // Once the broker accepted all 200 (and our scrapes), the slots stayed
    // within the cap by closing idle connections, not by refusing anyone and
    // not by timeouts.
    let text = broker
        .metrics_until("all idle connections accepted", |t| {
            sample(t, "ciphermq_admin_connections_accepted_total", "") > opened
        })
        .await;
    let max = sample(&text, "ciphermq_admin_max_connections", "");
    assert_eq!(max, 64.0, "default admin.max_connections");
    let open = sample(&text, "ciphermq_admin_connections", "");
    assert!(open <= max, "{open} connections open, cap {max}");
    // 200 idle sockets for 64 slots: at least 136 had to make room.
    assert_eq!(opened, 200.0, "no idle connection is refused");
    let shed = sample(&text, "ciphermq_admin_connections_shed_total", "");
    assert!(
        shed >= opened - max,
        "{shed} connections closed for newcomers:\n{text}"
    );
    assert_eq!(
        sample(&text, "ciphermq_admin_connections_refused_total", ""),
        0.0,
        "idle connections are replaced, newcomers never refused:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ciphermq_admin_connections_timed_out_total",
            r#"phase="handshake""#
        ),
        0.0
    );
    // The server closed idle sockets; some are gone by now.
    let mut closed = 0;
    for stream in &idle {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.peek(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert!(closed > 0, "no idle connection was closed");
    drop(idle);
}

#[tokio::test]
async fn a_slowloris_client_is_dropped_at_the_header_deadline() {
    let broker = AdminBroker::start("header_timeout_secs = 2");
    // Over TLS with a valid certificate: request headers, a byte a second.
    let headers = b"GET /health HTTP/1.1\r\nHost: x\r\nUser-Agent: slowloris\r\n\r\n";
    let tls = tls_from(loopback(5), broker.admin, "sender_1")
        .await
        .expect("TLS connection");
    // Plain TCP: a TLS record header announcing 512 bytes, then a byte a
    // second of it; the handshake never completes.
    let mut hello = vec![0x16, 0x03, 0x01, 0x02, 0x00];
    hello.resize(5 + 512, 0);
    let tcp = connect_from(loopback(6), broker.admin)
        .await
        .expect("TCP connection");

    let started = Instant::now();
    let (http, tls_level) = tokio::join!(drip(tls, headers), drip(tcp, &hello));
    let elapsed = started.elapsed();
    assert!(elapsed <= TIMEOUT, "dropped after {elapsed:?}");
    assert!(
        http.sent < headers.len(),
        "the whole request went out before the drop: {http:?}"
    );
    assert!(
        !String::from_utf8_lossy(&http.received).contains("HTTP/1.1 200"),
        "a slowloris request was answered: {http:?}"
    );
    assert!(tls_level.sent < hello.len(), "{tls_level:?}");

    let text = broker
        .metrics_until("both timeouts counted", |t| {
            sample(
                t,
                "ciphermq_admin_connections_timed_out_total",
                r#"phase="headers""#,
            ) >= 1.0
                && sample(
                    t,
                    "ciphermq_admin_connections_timed_out_total",
                    r#"phase="handshake""#,
                ) >= 1.0
        })
        .await;
    assert_eq!(
        sample(&text, "ciphermq_admin_connections_refused_total", ""),
        0.0
    );
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let broker = AdminBroker::start("idle_timeout_secs = 1");
    let mut tls = tls_from(loopback(7), broker.admin, "sender_1")
        .await
        .expect("TLS connection");
    // Kept alive: two requests on one connection.
    for _ in 0..2 {
        assert_eq!(get_kept_alive(&mut tls, "/health").await.expect("GET"), 200);
    }
    // Then silence: the server closes it.
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(TIMEOUT, async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "an idle kept-alive connection stayed open");
    broker
        .metrics_until("the idle timeout counted", |t| {
            sample(
                t,
                "ciphermq_admin_connections_timed_out_total",
                r#"phase="idle""#,
            ) >= 1.0
        })
        .await;
}

#[tokio::test]
async fn one_address_cannot_hold_more_than_its_share_of_slots() {
    let broker = AdminBroker::start("max_connections_per_ip = 2\nidle_timeout_secs = 60");
    let busy_host = loopback(3);
    // An idle socket from the address is replaced by a working client's
    // connection, rather than locking that address out.
    let idle = connect_from(busy_host, broker.admin)
        .await
        .expect("idle connection");
    let mut kept = Vec::new();
    for _ in 0..2 {
        let mut tls = tls_from(busy_host, broker.admin, "sender_1")
            .await
            .expect("TLS connection within the cap");
        assert_eq!(get_kept_alive(&mut tls, "/health").await.expect("GET"), 200);
        kept.push(tls);
    }
    // The address now holds two connections that each answered a request:
    // a third is refused (a reset before the handshake completes).
    let third = match tls_from(busy_host, broker.admin, "sender_1").await {
        Err(e) => e,
        Ok(mut tls) => match get_kept_alive(&mut tls, "/health").await {
            Ok(status) => panic!("a connection past the per-address cap was served: {status}"),
            Err(e) => e,
        },
    };
    assert_ne!(
        third.to_string(),
        "no answer in time",
        "refused, not left hanging"
    );

    // The refusal is visible in the metrics, scraped from another address.
    let text = broker
        .metrics_until("the per-address refusal counted", |t| {
            sample(
                t,
                "ciphermq_admin_connections_refused_total",
                r#"limit="admin.max_connections_per_ip""#,
            ) >= 1.0
        })
        .await;
    assert_eq!(
        sample(
            &text,
            "ciphermq_admin_connections_shed_total",
            r#"limit="admin.max_connections_per_ip""#
        ),
        1.0,
        "the idle socket made room:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ciphermq_admin_connections_refused_total",
            r#"limit="admin.max_connections""#
        ),
        0.0
    );
    // The idle socket is the one that was closed.
    let mut byte = [0u8; 1];
    let peeked = tokio::time::timeout(TIMEOUT, idle.peek(&mut byte)).await;
    assert!(
        matches!(peeked, Ok(Ok(0) | Err(_))),
        "the idle socket is still open: {peeked:?}"
    );

    // The address's working connections still answer, and other addresses
    // are served.
    for tls in &mut kept {
        assert_eq!(get_kept_alive(tls, "/health").await.expect("GET"), 200);
    }
    let mut other = tls_from(loopback(4), broker.admin, "sender_1")
        .await
        .expect("another address");
    assert_eq!(
        get_kept_alive(&mut other, "/ready").await.expect("GET"),
        200
    );
}
