//! Shared helpers: a PKI made once per test binary, a real broker on port 0,
//! and clients connected over real mutual TLS.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ciphermq_broker::BrokerHandle;
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_shard::shard_of;
use ciphermq_testkit::broker::init_logging;
use ciphermq_testkit::pki::TempPki;
use ciphermq_testkit::{BrokerConfig, RunningBroker};

pub mod admin_http;
pub mod blackhole;
pub mod ca;
pub mod carry;
pub mod cluster;
pub mod hostile;
pub mod process;

/// The disk watermark of test brokers ([`ciphermq_testkit::config`]).
pub const TEST_MIN_FREE: &str = ciphermq_testkit::config::TEST_MIN_FREE;

/// The drain bound of test brokers ([`ciphermq_testkit::config`]).
pub const TEST_SHUTDOWN_TIMEOUT: &str = ciphermq_testkit::config::TEST_SHUTDOWN_TIMEOUT;
pub use ciphermq_testkit::pg;

/// Every CN the test PKI issues a certificate for.
pub const CNS: &[&str] = &[
    "admin",
    "sender_1",
    "sender_2",
    "sender_3",
    "sender_4",
    "receiver_1",
    "receiver_2",
    "receiver_1_2",
    // More receivers for the cluster tests (not in the default ACL).
    "receiver_3",
    "receiver_4",
    "receiver_5",
    "receiver_6",
    "monitor_1",
    "stranger",
];

/// A PKI shared by the tests of one binary (certificates are slow to make).
pub struct Pki {
    _main: TempPki,
    _rogue: TempPki,
    pub certs: PathBuf,
    /// A second, unrelated CA with a `sender_1` certificate.
    pub rogue_certs: PathBuf,
}

pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let main = TempPki::new(CNS);
        let rogue = TempPki::new(&["sender_1"]);
        Pki {
            certs: main.certs.clone(),
            rogue_certs: rogue.certs.clone(),
            _main: main,
            _rogue: rogue,
        }
    })
}

/// A broker running on its own threads for one test.
pub struct TestBroker {
    broker: RunningBroker,
    pub addr: String,
    pub shards: usize,
}

/// The TOML of a test broker; `extra` is appended (whole sections).
pub fn config_text(certs: &Path, data: &Path, shards: usize, extra: &str) -> String {
    BrokerConfig::new(certs, data)
        .shards(shards)
        .short_shutdown()
        .admins(&["admin"])
        .senders(&["sender_1", "sender_2", "sender_3", "sender_4"])
        .receivers(&["receiver_1", "receiver_2", "receiver_1_2"])
        .monitors(&["monitor_1"])
        .extra(extra)
        .text()
}

impl TestBroker {
    fn running(broker: RunningBroker, shards: usize) -> TestBroker {
        TestBroker {
            addr: broker.addr.clone(),
            broker,
            shards,
        }
    }

    pub fn start(shards: usize) -> TestBroker {
        TestBroker::start_with(shards, "")
    }

    pub fn start_with(shards: usize, extra: &str) -> TestBroker {
        TestBroker::start_edited(shards, extra, |text| text)
    }

    /// [`TestBroker::start_with`], its config text passed through `edit`
    /// first (for keys of the sections the text already has).
    pub fn start_edited(
        shards: usize,
        extra: &str,
        edit: impl FnOnce(String) -> String,
    ) -> TestBroker {
        // Broker logs for a failing test: RUST_LOG=ciphermq_broker=debug.
        init_logging();
        let pki = pki();
        let data = tempfile::tempdir().expect("tempdir");
        let text = edit(config_text(&pki.certs, data.path(), shards, extra));
        let broker = RunningBroker::start_text(&text, data.path()).keeping(data);
        TestBroker::running(broker, shards)
    }

    /// A durable broker over the data directory `data`, listening on `addr`
    /// (`127.0.0.1:0` first; the address it got, to restart it in place).
    pub fn start_durable_at(shards: usize, data: &Path, addr: &str) -> TestBroker {
        TestBroker::start_durable_with(shards, data, addr, "")
    }

    /// [`TestBroker::start_durable_at`] with `extra` config sections.
    pub fn start_durable_with(shards: usize, data: &Path, addr: &str, extra: &str) -> TestBroker {
        TestBroker::start_durable_edited(shards, data, addr, extra, |text| text)
    }

    /// [`TestBroker::start_durable_with`], its config text passed through
    /// `edit` first (for keys of the sections the text already has).
    pub fn start_durable_edited(
        shards: usize,
        data: &Path,
        addr: &str,
        extra: &str,
        edit: impl FnOnce(String) -> String,
    ) -> TestBroker {
        init_logging();
        let text = edit(config_text(&pki().certs, data, shards, extra))
            .replace(r#"mode = "memory""#, r#"mode = "durable""#)
            .replace(
                r#"address = "127.0.0.1:0""#,
                &format!(r#"address = "{addr}""#),
            );
        TestBroker::running(RunningBroker::start_text(&text, data), shards)
    }

    /// A broker started from the config file `path` (`shards` as the file
    /// says), named as the file reloads read again.
    pub fn start_from_file(path: &Path, shards: usize) -> TestBroker {
        init_logging();
        TestBroker::running(RunningBroker::start_file(path), shards)
    }

    /// The running broker.
    pub fn handle(&self) -> &BrokerHandle {
        self.broker.handle()
    }

    /// The admin endpoint's address, when the config enables it.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.broker.admin_addr()
    }

    /// Stops the broker gracefully (blocks until its shards ended).
    pub fn stop(&mut self) {
        self.broker.stop();
    }

    /// Connects as `cn` and checks the greeting.
    pub async fn connect(&self, cn: &str) -> Connection {
        let opts = TlsClientOptions::for_cn(&pki().certs, cn);
        Connection::connect(&self.addr, &opts)
            .await
            .unwrap_or_else(|e| panic!("connect as {cn}: {e}"))
    }

    /// The shard serving `cn`.
    pub fn shard_of(&self, cn: &str) -> usize {
        shard_of(cn, self.shards) as usize
    }

    /// A sender CN served by a different shard than `cn` (2+ shards), or any.
    pub fn sender_on_other_shard(&self, cn: &str) -> &'static str {
        ["sender_1", "sender_2", "sender_3", "sender_4"]
            .into_iter()
            .find(|s| self.shards < 2 || self.shard_of(s) != self.shard_of(cn))
            .expect("some sender lives on another shard")
    }
}

/// A valid `EncryptedInputData` body.
pub fn body(id: &str, receiver: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}}"#
    )
}

/// Sends one line and asserts the reply.
pub async fn expect(conn: &mut Connection, line: &str, reply: &str) {
    let got = conn
        .request(line)
        .await
        .unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(got, reply, "reply to {line:?}");
}

/// Reads one line, failing on EOF.
pub async fn next(conn: &mut Connection) -> String {
    conn.read_line()
        .await
        .expect("read")
        .expect("a line before EOF")
}

/// Declares `direct` exchange `ex`, `{cn}_queue`, and binds it with key `{cn}`.
pub async fn setup_receiver(conn: &mut Connection, cn: &str) {
    expect(conn, "declare_exchange ex direct", "OK declare_exchange ex").await;
    expect(
        conn,
        &format!("declare_queue {cn}_queue"),
        &format!("OK declare_queue {cn}_queue"),
    )
    .await;
    expect(
        conn,
        &format!("bind {cn}_queue ex {cn}"),
        &format!("OK bind {cn}_queue ex {cn}"),
    )
    .await;
}

// ---------------------------------------------------------------------------
// Bounded helpers: every read and write below gives up after `TIMEOUT`, so a
// broker that hangs fails the test instead of stalling CI.
// ---------------------------------------------------------------------------

/// How long any single read, write or connect may take.
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connects as `cn` (bounded) and checks the greeting.
pub async fn connect_as(broker: &TestBroker, cn: &str) -> Connection {
    tokio::time::timeout(TIMEOUT, broker.connect(cn))
        .await
        .unwrap_or_else(|_| panic!("connect as {cn}: no HELLO within {TIMEOUT:?}"))
}

/// Flushes what is queued, bounded.
pub async fn flush_t(conn: &mut Connection) {
    tokio::time::timeout(TIMEOUT, conn.flush())
        .await
        .expect("flush timed out")
        .expect("flush");
}

/// Queues `line` and flushes it, bounded.
pub async fn send(conn: &mut Connection, line: &str) {
    conn.queue_line(line);
    flush_t(conn).await;
}

/// Reads one line or EOF (`None`), bounded; panics on timeout or I/O error.
pub async fn read_opt(conn: &mut Connection) -> Option<String> {
    tokio::time::timeout(TIMEOUT, conn.read_line())
        .await
        .unwrap_or_else(|_| panic!("no line within {TIMEOUT:?}"))
        .expect("read a line")
}

/// Reads one line, bounded; panics on EOF, timeout or error.
pub async fn line(conn: &mut Connection) -> String {
    read_opt(conn).await.expect("a line before EOF")
}

/// Sends `cmd` and returns the next line, bounded.
pub async fn ask(conn: &mut Connection, cmd: &str) -> String {
    send(conn, cmd).await;
    line(conn).await
}

/// Sends `cmd` and asserts that the next line is exactly `reply`, bounded.
pub async fn check(conn: &mut Connection, cmd: &str, reply: &str) {
    let got = ask(conn, cmd).await;
    assert_eq!(got, reply, "reply to {}", shorten(cmd));
}

/// At most 200 characters of `s`, for assertion messages.
pub fn shorten(s: &str) -> String {
    if s.len() <= 200 {
        s.to_owned()
    } else {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &s[..end], s.len())
    }
}

/// Asserts that nothing arrives within `wait`.
pub async fn assert_silent(conn: &mut Connection, wait: std::time::Duration, why: &str) {
    if let Ok(got) = tokio::time::timeout(wait, conn.read_line()).await {
        panic!("expected nothing ({why}), got {got:?}");
    }
}

/// Asserts that the broker closes the connection (EOF or a TLS/IO error)
/// without sending another line, bounded.
pub async fn assert_closed(conn: &mut Connection) {
    match tokio::time::timeout(TIMEOUT, conn.read_line()).await {
        Err(_) => panic!("connection still open after {TIMEOUT:?}"),
        Ok(Ok(Some(l))) => panic!("expected EOF, got line {l:?}"),
        Ok(Ok(None)) | Ok(Err(_)) => {}
    }
}

/// Asserts `reply` is `Access denied: <reason> (role=<role>)` with a reason.
pub fn assert_denied(reply: &str, role: &str, what: &str) {
    let suffix = format!(" (role={role})");
    let reason = reply
        .strip_prefix("Access denied: ")
        .and_then(|r| r.strip_suffix(&suffix))
        .unwrap_or_else(|| {
            panic!("{what}: expected `Access denied: <reason>{suffix}`, got {reply:?}")
        });
    assert!(
        !reason.trim().is_empty(),
        "{what}: empty reason in {reply:?}"
    );
}

/// Sends `cmd` and asserts an `Access denied … (role=<role>)` reply.
pub async fn check_denied(conn: &mut Connection, cmd: &str, role: &str) {
    let got = ask(conn, cmd).await;
    assert_denied(&got, role, cmd);
}

/// Sends `cmd` and asserts a reply starting with `Error: `.
pub async fn check_error(conn: &mut Connection, cmd: &str) -> String {
    let got = ask(conn, cmd).await;
    assert!(
        got.starts_with("Error: ") && got.len() > "Error: ".len(),
        "reply to {}: expected `Error: …`, got {got:?}",
        shorten(cmd)
    );
    got
}

/// A delivery line, owned: (message_id, queue, delivery_count, body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    pub id: String,
    pub queue: String,
    pub count: u32,
    pub body: String,
}

/// Parses a `Message: …` line; panics on anything else.
pub fn delivery_of(line: &str) -> Got {
    let d = ciphermq_proto::Delivery::parse(line)
        .unwrap_or_else(|| panic!("expected a delivery, got {line:?}"));
    Got {
        id: d.message_id.to_owned(),
        queue: d.queue.to_owned(),
        count: d.delivery_count,
        body: d.body.to_owned(),
    }
}

/// Reads the next delivery (bounded); panics on any other line.
pub async fn next_delivery(conn: &mut Connection) -> Got {
    let l = line(conn).await;
    delivery_of(&l)
}

/// Reads lines until a non-delivery line arrives; push deliveries read on the
/// way are appended to `pushed`. Returns the reply line.
pub async fn reply_skipping(conn: &mut Connection, pushed: &mut Vec<Got>) -> String {
    loop {
        let l = line(conn).await;
        if l.starts_with("Message: ") {
            pushed.push(delivery_of(&l));
        } else {
            return l;
        }
    }
}

/// Sends `cmd`, asserts its reply (deliveries in between are collected).
pub async fn check_skipping(conn: &mut Connection, cmd: &str, reply: &str, pushed: &mut Vec<Got>) {
    send(conn, cmd).await;
    let got = reply_skipping(conn, pushed).await;
    assert_eq!(got, reply, "reply to {}", shorten(cmd));
}

/// `fetch <queue> <max>`: the deliveries, after asserting `OK fetch <n>` with
/// n equal to their number.
pub async fn fetch(conn: &mut Connection, queue: &str, max: u32) -> Vec<Got> {
    send(conn, &format!("fetch {queue} {max}")).await;
    let mut got = Vec::new();
    loop {
        let l = line(conn).await;
        if l.starts_with("Message: ") {
            got.push(delivery_of(&l));
        } else {
            assert_eq!(
                l,
                format!("OK fetch {}", got.len()),
                "end of fetch {queue} {max}"
            );
            return got;
        }
    }
}

/// Ids of deliveries, in order.
pub fn ids(got: &[Got]) -> Vec<String> {
    got.iter().map(|g| g.id.clone()).collect()
}

/// Publishes an envelope sealed for `receiver` under routing key `key` and
/// asserts the reply (a receiver's queue stores only its own envelopes).
pub async fn publish_for(
    conn: &mut Connection,
    exchange: &str,
    key: &str,
    receiver: &str,
    id: &str,
    reply: &str,
) {
    check(
        conn,
        &format!("publish {exchange} {key} {}", body(id, receiver)),
        reply,
    )
    .await;
}

/// Publishes `body(id, "receiver_1")` on `exchange` with `key`, asserting
/// `reply`: only `receiver_1`'s queues and queues no receiver owns take it.
pub async fn publish_expect(
    conn: &mut Connection,
    exchange: &str,
    key: &str,
    id: &str,
    reply: &str,
) {
    check(
        conn,
        &format!("publish {exchange} {key} {}", body(id, "receiver_1")),
        reply,
    )
    .await;
}
