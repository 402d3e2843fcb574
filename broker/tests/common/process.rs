//! The broker as its own process ([`ciphermq_testkit::process`]) run from
//! this package's binary, connected to with the shared test PKI, and its
//! admin endpoint asked over mutual TLS. For tests whose promise spans
//! processes (crashes, locks, files).

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};

pub use ciphermq_testkit::process::Refused;

use super::{pki, TIMEOUT};

/// The broker binary of this package.
pub const BINARY: &str = env!("CARGO_BIN_EXE_ciphermq-broker");

/// A running broker process: [`ciphermq_testkit::BrokerProcess`] (its
/// fields and methods through `Deref`), with what needs the test PKI.
pub struct BrokerProcess(ciphermq_testkit::BrokerProcess);

impl Deref for BrokerProcess {
    type Target = ciphermq_testkit::BrokerProcess;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for BrokerProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl BrokerProcess {
    /// Starts the broker binary on `config`: the running broker once it
    /// prints its address, or how it ended when it exits first.
    pub fn spawn(config: &Path) -> Result<BrokerProcess, Refused> {
        BrokerProcess::spawn_with(config, |_| {})
    }

    /// [`BrokerProcess::spawn`], the command passed through `configure`
    /// first (environment variables, more arguments).
    pub fn spawn_with(
        config: &Path,
        configure: impl FnOnce(&mut Command),
    ) -> Result<BrokerProcess, Refused> {
        ciphermq_testkit::BrokerProcess::spawn_with(Path::new(BINARY), config, configure)
            .map(BrokerProcess)
    }

    /// Starts the broker on `config`, which must work.
    pub fn start(config: &Path) -> BrokerProcess {
        BrokerProcess(ciphermq_testkit::BrokerProcess::start(
            Path::new(BINARY),
            config,
        ))
    }

    /// Connects as `cn`. A cluster node whose lease ran out (a busy host
    /// can hold its heartbeats back past a short lease) closes connections
    /// without a greeting until it renews it: that is tried again, for
    /// [`TIMEOUT`] in all.
    pub async fn connect(&self, cn: &str) -> Connection {
        let opts = TlsClientOptions::for_cn(&pki().certs, cn);
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let tried = tokio::time::timeout_at(deadline, Connection::connect(&self.addr, &opts))
                .await
                .expect("connect in time");
            match tried {
                Ok(conn) => return conn,
                Err(ClientError::Closed) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("connect as {cn}: {e}"),
            }
        }
    }

    /// Stops it with SIGTERM (a graceful shutdown) and waits.
    pub fn stop(self) -> ExitStatus {
        self.0.stop()
    }

    /// Sends it `signal` (a name `kill` knows: `TERM`, `INT`, `HUP`).
    pub fn signal(&self, signal: &str) {
        self.0.signal(signal)
    }

    /// How it ended, if it ends within `limit`.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.0.wait_timeout(limit)
    }

    /// Kills it with SIGKILL: no shutdown at all.
    pub fn kill(self) {
        self.0.kill()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    /// Everything it printed so far, one line each.
    pub fn log_text(&self) -> String {
        self.0.log_text()
    }

    /// Whether its log has a line containing every one of `words`.
    pub fn logged(&self, words: &[&str]) -> bool {
        self.0.logged(words)
    }

    /// `GET path` on its admin endpoint as `cn`: (status, body).
    pub async fn admin_get(&self, cn: &str, path: &str) -> (u16, String) {
        let admin = self.admin.as_deref().expect("admin endpoint enabled");
        admin_get(admin, cn, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// The value of the unlabelled sample `name` in `/metrics`.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (status, text) = self.admin_get("admin", "/metrics").await;
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The sum of the labelled samples of `name` (over shards, say) whose
    /// labels contain `labels` ("" for all).
    pub async fn metric_sum_of(&self, name: &str, labels: &str) -> u64 {
        let (status, text) = self.admin_get("admin", "/metrics").await;
        assert_eq!(status, 200, "{text}");
        text.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(l, _)| l.contains(labels))
            .filter_map(|(_, v)| v.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// The sum of every labelled sample of `name` (over shards, say).
    pub async fn metric_sum(&self, name: &str) -> u64 {
        self.metric_sum_of(name, "").await
    }
}

/// One HTTP/1.1 `GET` over mutual TLS as `cn`, read to the end: (status,
/// body).
pub async fn admin_get(addr: &str, cn: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr = addr.parse().map_err(std::io::Error::other)?;
    let reply = super::admin_http::request(addr, Some(cn), "GET", path).await?;
    Ok((reply.status, reply.body))
}

/// Whether `line` acknowledges `id`.
pub fn is_ack(id: &str, line: &str) -> bool {
    line.strip_prefix("ACK ") == Some(id)
}

/// Publishes `ids` to receiver_1's routing key as `cn`, pipelined (`window`
/// unanswered at most), until all are answered or the broker goes away.
/// Returns each answered id with its reply line, in order.
pub async fn publish_pipelined(
    addr: &str,
    cn: &str,
    ids: &[String],
    window: usize,
) -> Vec<(String, String)> {
    publish_pipelined_bodies(addr, cn, ids, window, |id| super::body(id, "receiver_1")).await
}

/// [`publish_pipelined`] with each id's envelope made by `body`.
pub async fn publish_pipelined_bodies(
    addr: &str,
    cn: &str,
    ids: &[String],
    window: usize,
    body: impl Fn(&str) -> String,
) -> Vec<(String, String)> {
    let opts = TlsClientOptions::for_cn(&pki().certs, cn);
    let Ok(conn) = Connection::connect(addr, &opts).await else {
        return Vec::new();
    };
    let (mut rd, mut wr) = conn.into_split();
    let mut answers = Vec::with_capacity(ids.len());
    let mut sent = 0usize;
    while answers.len() < ids.len() {
        while sent < ids.len() && sent - answers.len() < window {
            wr.queue_line(&format!("publish ex receiver_1 {}", body(&ids[sent])));
            sent += 1;
        }
        if wr.flush().await.is_err() {
            break;
        }
        match rd.read_line().await {
            Ok(Some(line)) => answers.push((ids[answers.len()].clone(), line.to_owned())),
            _ => break,
        }
    }
    answers
}

/// Pipelined load from two senders through `rounds` crashes: each round
/// publishes `per_round` new ids per sender (plus the ones not yet
/// acknowledged), lets the load run a pseudo-random 20–220 ms, then hands
/// the broker to `crash` (which must leave it dead, e.g. SIGKILL, a power
/// cut too) and starts it again on `config`. Returns the ids acknowledged
/// and the broker running after the last crash.
pub async fn load_through_crashes(
    config: &Path,
    rounds: usize,
    per_round: usize,
    mut crash: impl FnMut(BrokerProcess),
) -> (std::collections::BTreeSet<String>, BrokerProcess) {
    let mut broker = BrokerProcess::start(config);
    let mut acked = std::collections::BTreeSet::new();
    let mut unacked: std::collections::HashMap<&'static str, Vec<String>> = Default::default();
    let mut next_id = 0u64;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..rounds {
        let mut tasks = Vec::new();
        for cn in ["sender_1", "sender_2"] {
            // Retry what was never acknowledged, then new ids.
            let mut ids = unacked.remove(cn).unwrap_or_default();
            for _ in 0..per_round {
                ids.push(format!("{cn}-{next_id}"));
                next_id += 1;
            }
            let addr = broker.addr.clone();
            tasks.push((
                cn,
                ids.clone(),
                tokio::spawn(async move { publish_pipelined(&addr, cn, &ids, 200).await }),
            ));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(20 + seed % 200)).await;
        crash(broker);
        for (cn, all, task) in tasks {
            let answers = task.await.expect("publisher task");
            let done: std::collections::BTreeSet<&String> = answers
                .iter()
                .filter(|(id, line)| *line == format!("ACK {id}"))
                .map(|(id, _)| id)
                .collect();
            acked.extend(done.iter().map(|id| (*id).clone()));
            unacked.insert(
                cn,
                all.iter()
                    .filter(|id| !done.contains(id))
                    .cloned()
                    .collect(),
            );
        }
        eprintln!("crash {round}: {} acked so far", acked.len());
        broker = BrokerProcess::start(config);
    }
    (acked, broker)
}

/// Fetches and acks everything in receiver_1's queue: how often each id
/// was delivered.
pub async fn drain_counting(broker: &BrokerProcess) -> std::collections::HashMap<String, u32> {
    use ciphermq_proto::Reply;
    let mut r = broker.connect("receiver_1").await;
    let mut delivered = std::collections::HashMap::new();
    loop {
        r.queue_line("fetch receiver_1_queue 5000");
        r.flush().await.unwrap();
        let mut batch = Vec::new();
        loop {
            let line = super::next(&mut r).await;
            match Reply::parse(&line) {
                Reply::Message(d) => batch.push(d.message_id.to_owned()),
                Reply::Ok(_) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        if batch.is_empty() {
            return delivered;
        }
        for id in &batch {
            r.queue_line(&format!("ack {id} receiver_1_queue"));
            *delivered.entry(id.clone()).or_default() += 1;
        }
        r.flush().await.unwrap();
        for _ in &batch {
            assert!(super::next(&mut r).await.starts_with("ACK_CONFIRMED "));
        }
    }
}

/// Asserts that every id in `acked` was delivered, and prints the figures.
pub fn assert_none_lost(
    what: &str,
    acked: &std::collections::BTreeSet<String>,
    delivered: &std::collections::HashMap<String, u32>,
) {
    let lost: Vec<&String> = acked
        .iter()
        .filter(|id| !delivered.contains_key(*id))
        .collect();
    let duplicates: u32 = delivered.values().map(|n| n - 1).sum();
    println!(
        "{what}: acked {}, delivered {} distinct, lost {}, duplicates {duplicates}",
        acked.len(),
        delivered.len(),
        lost.len(),
    );
    assert!(
        acked.len() > 1000,
        "the load must be real: only {} acked",
        acked.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged but lost: {:?}",
        &lost[..lost.len().min(10)]
    );
}
