//! Shared storage (`cluster.storage = "shared"`) under the faults of a whole
//! site, with real broker processes and the real PostgreSQL: PostgreSQL
//! restarted twenty times (every connection of the nodes terminated, as
//! other tests share the server) and then away from every node for a
//! minute, under a continuous pipelined load: no takeover, no placement
//! change; acknowledgements stop once the leases have run out and resume
//! when PostgreSQL is back; nothing acknowledged is lost.

mod common;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::blackhole::Blackhole;
use common::cluster::{cluster_state, every_node_beats_again, shared_process_node};
use common::pg::TestDb;
use common::process::BrokerProcess;
use common::{fetch, ids, next, setup_receiver};

/// The nodes' lease: a node silent for 3 s (lease and margin) is taken over.
const LEASE_SECS: u64 = 2;

/// The nodes' ids, in the order of their configs.
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

/// Whether `line` acknowledges `id`.
fn is_ack(id: &str, line: &str) -> bool {
    line.strip_prefix("ACK ") == Some(id)
}

/// Where receiver_1 lives as the node at `addr` sees it: (node id, address,
/// epoch).
async fn locate(addr: &str) -> Option<(String, String, u64)> {
    let opts = TlsClientOptions::for_cn(&common::pki().certs, "sender_1");
    let mut conn = tokio::time::timeout(common::TIMEOUT, Connection::connect(addr, &opts))
        .await
        .ok()?
        .ok()?;
    conn.queue_line("locate receiver_1");
    conn.flush().await.ok()?;
    let reply = tokio::time::timeout(common::TIMEOUT, conn.read_line())
        .await
        .ok()?
        .ok()??;
    let mut words = reply.split(' ');
    if words.next() != Some("OK") || words.next() != Some("locate") {
        return None;
    }
    let _owner = words.next()?;
    let node = words.next()?.to_owned();
    let at = words.next()?.to_owned();
    Some((node, at, words.next()?.parse().ok()?))
}

/// Fetches and acks receiver_1's queue on `conn` until it is empty: the ids
/// in delivery order.
async fn drain(conn: &mut Connection) -> Vec<String> {
    let mut all = Vec::new();
    loop {
        let batch = ids(&fetch(conn, "receiver_1_queue", 2000).await);
        if batch.is_empty() {
            return all;
        }
        for id in &batch {
            conn.queue_line(&format!("ack {id} receiver_1_queue"));
        }
        conn.flush().await.unwrap();
        for _ in &batch {
            assert!(next(conn).await.starts_with("ACK_CONFIRMED "));
        }
        all.extend(batch);
    }
}

/// Where a node keeps its data and how it reaches PostgreSQL, when not as
/// [`shared_process_node`] has it.
#[derive(Default)]
struct Placing<'a> {
    /// Its data directory.
    data: Option<&'a Path>,
    /// A relay to PostgreSQL.
    hole: Option<&'a Blackhole>,
    /// More lines of its `[storage]` section.
    storage: &'a str,
}

/// The config of node `id` (console logs on, so its log is kept) placed as
/// `placing` says.
fn node_config(db: &TestDb, id: &str, dir: &Path, shared: &Path, placing: Placing<'_>) -> PathBuf {
    let Placing {
        data,
        hole,
        storage,
    } = placing;
    let (config, default_data) = shared_process_node(db, id, dir, shared, LEASE_SECS);
    let mut text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("console = false", "console = true")
        .replace(
            common::TEST_MIN_FREE,
            &format!("{}\n{storage}", common::TEST_MIN_FREE),
        );
    if let Some(data) = data {
        text = text.replace(
            &format!("data_dir = \"{}\"", default_data.display()),
            &format!("data_dir = \"{}\"", data.display()),
        );
        assert!(text.contains(&data.display().to_string()), "{text}");
    }
    if let Some(hole) = hole {
        assert!(text.contains("port = 5432"), "{text}");
        text = text.replace("port = 5432", &format!("port = {}", hole.addr.port()));
    }
    std::fs::write(&config, text).unwrap();
    config
}

/// A broker process's log lines, as it keeps them.
type Log = Arc<Mutex<Vec<String>>>;

/// The logs of every broker process a test started, killed ones included:
/// if the test fails they are written to a file (and their warnings and
/// errors printed), so a failure comes with what the brokers said.
struct KeptLogs {
    test: &'static str,
    logs: Mutex<Vec<(String, Log)>>,
}

impl KeptLogs {
    fn new(test: &'static str) -> KeptLogs {
        KeptLogs {
            test,
            logs: Mutex::new(Vec::new()),
        }
    }

    /// Keeps the log of `broker`, labelled `label`.
    fn keep(&self, label: String, broker: &BrokerProcess) {
        self.logs.lock().unwrap().push((label, broker.log.clone()));
    }
}

impl Drop for KeptLogs {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}.log", self.test));
        let mut text = String::new();
        let logs = self.logs.lock().unwrap();
        for (label, log) in logs.iter() {
            for line in log.lock().unwrap().iter() {
                text.push_str(&format!("{label}: {line}\n"));
                if line.contains(" WARN ") || line.contains(" ERROR ") {
                    eprintln!("{label}: {line}");
                }
            }
        }
        let _ = std::fs::write(&path, text);
        eprintln!("the brokers' logs: {}", path.display());
    }
}

// ---------------------------------------------------------------------------
// PostgreSQL restarted twenty times, then away for a minute
// ---------------------------------------------------------------------------

/// Publishes in flight on one connection of a continuous publisher.
const WINDOW: usize = 16;

/// What one continuous publisher saw.
#[derive(Default)]
struct Published {
    /// Every ACK, in the order read: (sequence number, when it was read,
    /// whether that id had been sent before and refused or left unanswered).
    acks: Vec<(u64, Instant, bool)>,
    /// Every refusal (`NACK <id> storage`), when read.
    refused: Vec<Instant>,
    /// Every connection that ended, or could not be opened, with publishes
    /// unanswered.
    broken: Vec<Instant>,
}

impl Published {
    /// ACKs read in `[from, to)`.
    fn acks_between(&self, from: Instant, to: Instant) -> usize {
        self.acks
            .iter()
            .filter(|(_, at, _)| *at >= from && *at < to)
            .count()
    }

    /// Refusals and broken connections in `[from, to)`.
    fn refused_between(&self, from: Instant, to: Instant) -> usize {
        self.refused
            .iter()
            .chain(&self.broken)
            .filter(|at| **at >= from && **at < to)
            .count()
    }
}

/// The id of a continuous publisher's `seq`-th message.
fn seq_id(prefix: &str, seq: u64) -> String {
    format!("{prefix}{seq:07}")
}

/// Publishes to receiver_1 at `addr` as `cn`, pipelined (`WINDOW` in
/// flight), until `stop` is set, noting every answer in `log`. A refused
/// publish (`NACK … storage`) or a connection that ends stops new ones;
/// what is in flight is still read. Then, 20 ms later (on a new connection
/// if it ended), every id not yet acknowledged is sent again, in order,
/// one at a time until one is acknowledged, then pipelined again. Any other
/// answer (`moved`: a takeover) fails the test.
async fn publish_continuously(
    addr: String,
    cn: &'static str,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Published>>,
) {
    let opts = TlsClientOptions::for_cn(&common::pki().certs, cn);
    let mut next_new = 0u64;
    // Sent before, refused or unanswered: sent again first, in order.
    let mut unacked: BTreeSet<u64> = BTreeSet::new();
    let mut careful = false;
    let mut conn = None;
    while !stop.load(Ordering::Relaxed) {
        let (rd, wr) = match &mut conn {
            Some(split) => split,
            None => {
                match tokio::time::timeout(common::TIMEOUT, Connection::connect(&addr, &opts)).await
                {
                    Ok(Ok(c)) => conn.insert(c.into_split()),
                    _ => {
                        log.lock().unwrap().broken.push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
        };
        let mut retry: VecDeque<u64> = unacked.iter().copied().collect();
        let mut in_flight: VecDeque<u64> = VecDeque::new();
        let (mut trouble, mut alive) = (false, true);
        loop {
            let window = if careful { 1 } else { WINDOW };
            while !trouble && !stop.load(Ordering::Relaxed) && in_flight.len() < window {
                let seq = retry.pop_front().unwrap_or_else(|| {
                    next_new += 1;
                    next_new - 1
                });
                wr.queue_line(&format!(
                    "publish ex receiver_1 {}",
                    common::body(&seq_id(prefix, seq), "receiver_1")
                ));
                in_flight.push_back(seq);
            }
            if in_flight.is_empty() {
                break;
            }
            if wr.flush().await.is_err() {
                alive = false;
                break;
            }
            let line = match tokio::time::timeout(common::TIMEOUT, rd.read_line()).await {
                Ok(Ok(Some(line))) => line,
                _ => {
                    alive = false;
                    break;
                }
            };
            let at = Instant::now();
            let seq = in_flight.pop_front().expect("an answer to something sent");
            let id = seq_id(prefix, seq);
            if is_ack(&id, &line) {
                let retried = unacked.remove(&seq);
                log.lock().unwrap().acks.push((seq, at, retried));
                careful = false;
            } else {
                assert!(
                    line == format!("NACK {id} storage") || line == format!("NACK {id} timeout"),
                    "{cn}: unexpected answer to {id}: {line}"
                );
                log.lock().unwrap().refused.push(at);
                unacked.insert(seq);
                trouble = true;
                careful = true;
            }
        }
        if !in_flight.is_empty() {
            log.lock().unwrap().broken.push(Instant::now());
            unacked.extend(in_flight);
            careful = true;
        }
        // What was taken from `retry` and never sent is still in `unacked`.
        if !alive {
            conn = None;
        }
        if trouble || !alive {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits until every publisher in `logs` has an ACK read after `since`;
/// returns when the first of the last publisher's came.
async fn every_publisher_acked_after(logs: &[Arc<Mutex<Published>>], since: Instant) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let firsts: Vec<Option<Instant>> = logs
            .iter()
            .map(|log| {
                log.lock()
                    .unwrap()
                    .acks
                    .iter()
                    .map(|(_, at, _)| *at)
                    .find(|at| *at > since)
            })
            .collect();
        if firsts.iter().all(Option::is_some) {
            return firsts.into_iter().flatten().max().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "a publisher got no ACK for 60 s after {:?} ago",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Terminates every connection of the nodes to the test database, as a
/// restart of PostgreSQL would (the test's own connection aside): how many
/// were the cluster coordinators'.
async fn terminate_nodes_connections(admin: &tokio_postgres::Client, db: &TestDb) -> usize {
    let rows = admin
        .query(
            "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db.name],
        )
        .await
        .expect("terminate the nodes' connections");
    rows.iter()
        .filter(|r| {
            r.get::<_, Option<String>>(0)
                .is_some_and(|n| n.starts_with("ciphermq-cluster "))
                && r.get::<_, bool>(1)
        })
        .count()
}

/// Waits until at least `n` coordinator connections are open on the test
/// database.
async fn coordinators_connected(admin: &tokio_postgres::Client, db: &TestDb, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = $1 AND application_name LIKE 'ciphermq-cluster %'",
                &[&db.name],
            )
            .await
            .unwrap()
            .get(0);
        if open >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {open} coordinator connections came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three nodes on shared storage (lease 2 s) reaching PostgreSQL through a
/// relay, and two publishers pipelining to receiver_1 on its node the whole
/// time:
///
/// 1. PostgreSQL is "restarted" twenty times: every connection of the
///    nodes is terminated, and the next restart comes once every node has
///    heartbeated again twice and both publishers were acknowledged again.
///    No takeover, no placement or epoch change, and no publish is refused.
/// 2. PostgreSQL is then away from every node for 60 s (the relay drops
///    everything): no takeover during the outage or after it; no ACK is
///    read later than the lease plus 1 s after the cut (no node can renew
///    its lease), and the same node acknowledges again once PostgreSQL is
///    back.
///
/// Then receiver_1's queue is drained: every acknowledged id is delivered
/// once, and the ids each publisher got acknowledged on their first try
/// come in the order they were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_twenty_times_then_away_a_minute_makes_no_takeover_and_loses_nothing() {
    const RESTARTS: usize = 20;
    const OUTAGE: Duration = Duration::from_secs(60);
    let logs = KeptLogs::new("postgres_restarted_twenty_times_then_away_a_minute");
    let db = TestDb::create().await;
    let hole = Blackhole::start().await;
    let shared = tempfile::tempdir().unwrap();
    let dirs: Vec<tempfile::TempDir> = NODES.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<BrokerProcess> = NODES
        .iter()
        .zip(&dirs)
        .map(|(id, dir)| {
            let placing = Placing {
                hole: Some(&hole),
                ..Placing::default()
            };
            let config = node_config(&db, id, dir.path(), shared.path(), placing);
            let node = BrokerProcess::start(&config);
            logs.keep((*id).to_owned(), &node);
            node
        })
        .collect();
    let _reopen = hole.reopen_on_drop();
    let mut r1 = nodes[0].connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    let (home, home_addr, _) = locate(&nodes[0].addr).await.expect("receiver_1 placed");
    assert_eq!(
        (home.as_str(), home_addr.as_str()),
        ("node-a", nodes[0].addr.as_str())
    );
    every_node_beats_again(&db).await;
    let before = cluster_state(&db).await;
    assert_eq!(before.1, 0, "no takeover yet");

    let stop = Arc::new(AtomicBool::new(false));
    let published: Vec<Arc<Mutex<Published>>> = (0..2).map(|_| Arc::default()).collect();
    let publishers: Vec<_> = [("sender_1", "s1-"), ("sender_2", "s2-")]
        .into_iter()
        .zip(&published)
        .map(|((cn, prefix), log)| {
            tokio::spawn(publish_continuously(
                home_addr.clone(),
                cn,
                prefix,
                stop.clone(),
                log.clone(),
            ))
        })
        .collect();
    let started = Instant::now();
    every_publisher_acked_after(&published, started).await;

    // 1. Twenty restarts.
    let admin = db.client().await;
    let restarts_began = Instant::now();
    let mut coordinators_cut = Vec::new();
    for restart in 0..RESTARTS {
        coordinators_connected(&admin, &db, NODES.len() as i64).await;
        let cut = terminate_nodes_connections(&admin, &db).await;
        let at = Instant::now();
        assert!(
            cut >= NODES.len(),
            "restart {restart}: only {cut} coordinator connections were cut"
        );
        coordinators_cut.push(cut);
        every_node_beats_again(&db).await;
        every_publisher_acked_after(&published, at).await;
        assert_eq!(
            cluster_state(&db).await,
            before,
            "restart {restart}: no takeover, no placement change"
        );
    }
    let restarts_ended = Instant::now();

    // 2. PostgreSQL away from every node for a minute.
    hole.cut.store(true, Ordering::Relaxed);
    let cut = Instant::now();
    let mut checks = 0;
    while cut.elapsed() < OUTAGE {
        assert_eq!(
            cluster_state(&db).await,
            before,
            "no takeover during the outage ({:?} in)",
            cut.elapsed()
        );
        checks += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    hole.cut.store(false, Ordering::Relaxed);
    let back = Instant::now();
    let resumed = every_publisher_acked_after(&published, back).await;
    every_node_beats_again(&db).await;
    assert_eq!(
        cluster_state(&db).await,
        before,
        "no takeover once PostgreSQL is back"
    );
    // More load after the outage, then the publishers stop.
    every_publisher_acked_after(&published, Instant::now()).await;
    stop.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.await.expect("a publisher failed");
    }
    let ended = Instant::now();

    let late_limit = cut + Duration::from_secs(LEASE_SECS + 1);
    let mut late = Vec::new();
    let (mut during_a, mut refused_a, mut during_b) = (0, 0, 0);
    let (mut nacked_b, mut broken_b) = (0, 0);
    let (mut last_ack, mut first_refusal) = (None, None);
    for (i, log) in published.iter().enumerate() {
        let log = log.lock().unwrap();
        during_a += log.acks_between(restarts_began, restarts_ended);
        refused_a += log.refused_between(started, restarts_ended);
        during_b += log.acks_between(cut, back);
        let outage = |at: &&Instant| **at >= cut && **at < back;
        nacked_b += log.refused.iter().filter(outage).count();
        broken_b += log.broken.iter().filter(outage).count();
        let last = log.acks.iter().map(|(_, at, _)| at).filter(outage).max();
        last_ack = last_ack.max(last.map(|at| *at - cut));
        let first = log.refused.iter().chain(&log.broken).filter(outage).min();
        first_refusal = match (first_refusal, first.map(|at| *at - cut)) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
        late.extend(
            log.acks
                .iter()
                .filter(|(_, at, _)| *at > late_limit && *at < back)
                .map(|(seq, at, _)| (i, *seq, *at - cut)),
        );
    }
    let refused_b = nacked_b + broken_b;
    let ms = |d: Option<Duration>| d.map_or(-1, |d| d.as_millis() as i64);
    eprintln!(
        "PostgreSQL restarted {RESTARTS} times ({coordinators_cut:?} coordinator connections cut): \
         {during_a} acknowledged meanwhile, {refused_a} refused or unanswered; no takeover"
    );
    eprintln!(
        "PostgreSQL away {} s: {during_b} acknowledged during the outage, the last read {} ms after \
         the cut (lease {LEASE_SECS} s); first refusal {} ms after the cut; then {nacked_b} tries \
         refused (NACK storage) and {broken_b} connections ended or not opened with publishes \
         unanswered; takeovers and placements checked {checks} times, unchanged",
        OUTAGE.as_secs(),
        ms(last_ack),
        ms(first_refusal),
    );
    eprintln!(
        "both publishers acknowledged again {} ms after PostgreSQL was back; no takeover",
        (resumed - back).as_millis()
    );
    assert_eq!(
        refused_a, 0,
        "a restart of PostgreSQL must refuse no publish (the lease outlives it)"
    );
    assert!(
        late.is_empty(),
        "{} ACKs read more than {LEASE_SECS} s + 1 s after PostgreSQL went away, e.g. (publisher, \
         seq, after the cut) {:?}",
        late.len(),
        &late[..late.len().min(5)]
    );
    assert!(
        refused_b > 0,
        "a node without its lease must stop acknowledging"
    );

    // Every acknowledged id is delivered, once; first-try ACKs in order.
    let mut r1 = nodes[0].connect("receiver_1").await;
    let delivered = drain(&mut r1).await;
    let mut times: HashMap<&str, u32> = HashMap::new();
    for id in &delivered {
        *times.entry(id.as_str()).or_default() += 1;
    }
    let mut acked_in_all = 0;
    for (log, prefix) in published.iter().zip(["s1-", "s2-"]) {
        let log = log.lock().unwrap();
        acked_in_all += log.acks.len();
        let lost: Vec<String> = log
            .acks
            .iter()
            .map(|(seq, _, _)| seq_id(prefix, *seq))
            .filter(|id| !times.contains_key(id.as_str()))
            .collect();
        assert!(
            lost.is_empty(),
            "{} acknowledged but lost, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        );
        let first_try: BTreeSet<String> = log
            .acks
            .iter()
            .filter(|(_, _, retried)| !retried)
            .map(|(seq, _, _)| seq_id(prefix, *seq))
            .collect();
        let order: Vec<&String> = delivered
            .iter()
            .filter(|id| first_try.contains(*id))
            .collect();
        if let Some(i) = order.windows(2).position(|w| w[0] >= w[1]) {
            panic!(
                "{prefix}: delivered out of publish order: {:?}",
                &order[i.saturating_sub(3)..(i + 4).min(order.len())]
            );
        }
    }
    let duplicates: u32 = times.values().map(|n| n - 1).sum();
    eprintln!(
        "acknowledged {acked_in_all}, delivered {} ({} distinct, {duplicates} duplicates), lost 0; \
         {} s in all",
        delivered.len(),
        times.len(),
        (ended - started).as_secs()
    );
    assert_eq!(duplicates, 0, "deduplicated by sender and id: once each");
    assert_eq!(
        cluster_state(&db).await,
        before,
        "no takeover at the end either"
    );
}
