//! Shared storage (`cluster.storage = "shared"`) under the faults of a whole
//! site, with real broker processes and the real PostgreSQL:
//!
//! - PostgreSQL restarted twenty times (every connection of the nodes
//!   terminated, as other tests share the server) and then away from every
//!   node for a minute, under a continuous pipelined load: no takeover, no
//!   placement change; acknowledgements stop once the leases have run out
//!   and resume when PostgreSQL is back; nothing acknowledged is lost.
//! - The power of the site cut (every node killed, unsynced data of a
//!   fault-injecting FUSE filesystem holding the shared directory and the
//!   data directories dropped) at several points of an adoption: nothing
//!   acknowledged is lost, nothing is delivered twice or out of order.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::blackhole::Blackhole;
use common::cluster::{cluster_state, every_node_beats_again, shared_process_node};
use common::pg::TestDb;
use common::process::{is_ack, publish_pipelined, BrokerProcess};
use common::{fetch, ids, next, setup_receiver};

/// The nodes' lease: a node silent for 3 s (lease and margin) is taken over.
const LEASE_SECS: u64 = 2;

/// The nodes' ids, in the order of their configs.
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

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

    /// The lines of every kept log that contain `words`, labelled.
    fn lines_with(&self, words: &str) -> Vec<String> {
        let logs = self.logs.lock().unwrap();
        logs.iter()
            .flat_map(|(label, log)| {
                log.lock()
                    .unwrap()
                    .iter()
                    .filter(|l| l.contains(words))
                    .map(|l| format!("{label}: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect()
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

/// New ids a continuous publisher sends a second at most: a steady load
/// whose backlog stays under `max_queue_size` however fast the build.
const RATE: f64 = 3000.0;

/// The id of a continuous publisher's `seq`-th message.
fn seq_id(prefix: &str, seq: u64) -> String {
    format!("{prefix}{seq:07}")
}

/// Publishes to receiver_1 at `addr` as `cn`, pipelined (`WINDOW` in
/// flight) and new ids at most `RATE` a second, until `stop` is set, noting every answer in `log`. A refused
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
    let start = Instant::now();
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
                if retry.is_empty() {
                    let due = start + Duration::from_secs_f64(next_new as f64 / RATE);
                    if Instant::now() < due {
                        if !in_flight.is_empty() {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                    }
                }
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

// ---------------------------------------------------------------------------
// Power cuts of the site during an adoption
// ---------------------------------------------------------------------------

/// Where an adoption is when the site's power is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutPoint {
    /// As soon as the killed holder's copy is seen fenced.
    Fenced,
    /// Once the heir's own copy holds half the bytes of the fenced one.
    Storing,
    /// As soon as the fenced copy is deleted.
    Deleted,
    /// Once the heir has acknowledged a publish of its own after the
    /// adoption.
    Served,
}

/// receiver_1's copies in the shared directory: name → bytes of its files.
fn copies(shared: &Path) -> BTreeMap<String, u64> {
    fn bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| match e.file_type() {
                        Ok(t) if t.is_dir() => bytes(&e.path()),
                        _ => e.metadata().map_or(0, |m| m.len()),
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    let owner_dir = shared.join(ciphermq_cluster::shared_storage::owner_dir_name(
        "receiver_1",
    ));
    let Ok(entries) = std::fs::read_dir(&owner_dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                bytes(&e.path()),
            )
        })
        .collect()
}

/// Waits, polling every millisecond, until receiver_1's copies reach
/// `point` (not [`CutPoint::Served`]) of the adoption of `old` (the killed
/// holder's live copy): the copies then.
async fn wait_for_point(shared: &Path, old: &str, point: CutPoint) -> BTreeMap<String, u64> {
    let fenced = format!("{old}.fenced");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = copies(shared);
        let heirs: u64 = now
            .iter()
            .filter(|(n, _)| !n.ends_with(".fenced") && n.as_str() > old)
            .map(|(_, b)| *b)
            .sum();
        let reached = match point {
            CutPoint::Fenced => now.contains_key(&fenced),
            CutPoint::Storing => match now.get(&fenced) {
                Some(b) => heirs * 2 >= *b,
                // Missed: cut all the same (the figures say so).
                None => !now.contains_key(old) && heirs > 0,
            },
            CutPoint::Deleted => !now.contains_key(&fenced) && !now.contains_key(old) && heirs > 0,
            CutPoint::Served => unreachable!("waited for by a publish"),
        };
        if reached {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the adoption never reached {point:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until receiver_1 is served: located by any running node, and a
/// publish of `probe` there acknowledged (refused or moved meanwhile while
/// its backlog is adopted). Returns the node's index and the epoch.
async fn served(nodes: &[Option<BrokerProcess>], probe: &str) -> (usize, u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        for node in nodes.iter().flatten() {
            let Some((id, addr, epoch)) = locate(&node.addr).await else {
                continue;
            };
            let answers = tokio::time::timeout(
                Duration::from_secs(30),
                publish_pipelined(&addr, "sender_1", &[probe.to_owned()], 1),
            )
            .await
            .unwrap_or_else(|_| panic!("{id} did not answer the publish of {probe} in 30 s"));
            match answers.first() {
                Some((_, line)) if is_ack(probe, line) => {
                    let i = NODES.iter().position(|n| *n == id).expect("a known node");
                    return (i, epoch);
                }
                Some((_, line)) => assert!(
                    line.contains(" storage")
                        || line.contains(" timeout")
                        || line.contains(" moved "),
                    "unexpected answer to {probe}: {line}"
                ),
                None => {}
            }
        }
        assert!(
            Instant::now() < deadline,
            "receiver_1 was not served again within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one trial of the power-cut test found.
struct Trial {
    point: CutPoint,
    acked: usize,
    delivered: usize,
    lost: Vec<String>,
    duplicates: u32,
    in_order: bool,
}

/// The shared directory and the three nodes' data directories live on a
/// fault-injecting FUSE filesystem that keeps unsynced data in memory
/// (1 MiB log segments, so a backlog spans several). Four trials: a
/// backlog is published to receiver_1's node and acknowledged; the node is
/// killed (SIGKILL); once another node has taken receiver_1 over and
/// reached a given point of adopting the killed node's copy (just fenced;
/// half stored in its own copy; the fenced copy just deleted; a publish of
/// its own acknowledged after the adoption), the whole site loses power:
/// every node is killed and whatever was not synced is dropped. The nodes
/// start again, receiver_1 is served again, and its queue is drained:
/// every acknowledged message of the trial is delivered once, in publish
/// order. One copy is left at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_of_the_shared_storage_during_an_adoption_loses_nothing_acknowledged() {
    const BACKLOG: usize = 30_000;
    const POINTS: [CutPoint; 4] = [
        CutPoint::Fenced,
        CutPoint::Storing,
        CutPoint::Deleted,
        CutPoint::Served,
    ];
    if ciphermq_faultfs::skip_requested() {
        println!("skipped: FUSE test ({}=1)", ciphermq_faultfs::SKIP_ENV);
        return;
    }
    let logs = KeptLogs::new("a_power_cut_of_the_shared_storage_during_an_adoption");
    let mount = tempfile::tempdir().unwrap();
    let fs = ciphermq_faultfs::FaultFs::mount(mount.path()).unwrap_or_else(|e| {
        panic!(
            "{e} (set {}=1 to skip this test)",
            ciphermq_faultfs::SKIP_ENV
        )
    });
    let db = TestDb::create().await;
    let shared = fs.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let dirs: Vec<tempfile::TempDir> = NODES.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let configs: Vec<PathBuf> = NODES
        .iter()
        .zip(&dirs)
        .map(|(id, dir)| {
            let data = fs.path().join(id);
            std::fs::create_dir(&data).unwrap();
            let placing = Placing {
                data: Some(&data),
                storage: "segment_bytes = 1048576",
                ..Placing::default()
            };
            node_config(&db, id, dir.path(), &shared, placing)
        })
        .collect();
    // The operator's directories are there to stay.
    fs.make_all_durable();
    let started = Instant::now();
    let start = |i: usize, generation: usize| {
        let node = BrokerProcess::start(&configs[i]);
        logs.keep(format!("{} (start {generation})", NODES[i]), &node);
        node
    };
    let mut nodes: Vec<Option<BrokerProcess>> = (0..3).map(|i| Some(start(i, 0))).collect();
    let mut r1 = nodes[0].as_ref().unwrap().connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    // After a power cut the owner's node declares its binding from the
    // catalogue.
    common::cluster::binding_catalogued(&db, "receiver_1").await;

    let mut trials = Vec::new();
    let mut acked = vec!["probe-start".to_owned()];
    let (mut home, _) = served(&nodes, &acked[0]).await;
    for (trial, point) in POINTS.into_iter().enumerate() {
        let batch: Vec<String> = (0..BACKLOG).map(|i| format!("t{trial}-{i:05}")).collect();
        let addr = nodes[home].as_ref().unwrap().addr.clone();
        let publishing = Instant::now();
        let answers = publish_pipelined(&addr, "sender_1", &batch, 200).await;
        let took = publishing.elapsed();
        assert!(
            answers.len() == batch.len() && answers.iter().all(|(id, line)| is_ack(id, line)),
            "trial {trial}: every publish of the backlog acknowledged: {:?}",
            answers.iter().find(|(id, line)| !is_ack(id, line))
        );
        acked.extend(batch);
        let held = copies(&shared);
        assert_eq!(held.len(), 1, "one copy before the kill: {held:?}");
        let old = held.keys().next().unwrap().clone();

        nodes[home].take().unwrap().kill();
        let killed = Instant::now();
        let at_cut = if point == CutPoint::Served {
            let probe = format!("heir-{trial}");
            served(&nodes, &probe).await;
            acked.push(probe);
            copies(&shared)
        } else {
            wait_for_point(&shared, &old, point).await
        };
        let reached = killed.elapsed();
        for node in &mut nodes {
            if let Some(node) = node.take() {
                node.kill();
            }
        }
        fs.power_cut();
        let after_cut = copies(&shared);
        eprintln!(
            "trial {trial}: {BACKLOG} published in {} ms ({:.0}/s on the FUSE mount); holder {} \
             killed; power cut at {point:?} {} ms later: copies {at_cut:?}, after the cut {after_cut:?}",
            took.as_millis(),
            BACKLOG as f64 / took.as_secs_f64(),
            NODES[home],
            reached.as_millis(),
        );

        let restarted = Instant::now();
        for (i, node) in nodes.iter_mut().enumerate() {
            *node = Some(start(i, trial + 1));
        }
        let probe = format!("probe-{trial}");
        let epoch;
        (home, epoch) = served(&nodes, &probe).await;
        let serving = restarted.elapsed();
        acked.push(probe);
        let mut r1 = nodes[home].as_ref().unwrap().connect("receiver_1").await;
        let delivered = drain(&mut r1).await;
        drop(r1);
        let mut times: HashMap<&str, u32> = HashMap::new();
        for id in &delivered {
            *times.entry(id.as_str()).or_default() += 1;
        }
        let lost: Vec<String> = acked
            .iter()
            .filter(|id| !times.contains_key(id.as_str()))
            .cloned()
            .collect();
        let result = Trial {
            point,
            acked: acked.len(),
            delivered: delivered.len(),
            duplicates: times.values().map(|n| n - 1).sum(),
            in_order: delivered == acked,
            lost,
        };
        eprintln!(
            "trial {trial}: served again on {} at epoch {epoch} {} ms after the restart began; \
             acknowledged {}, delivered {}, lost {}, duplicates {}, {}",
            NODES[home],
            serving.as_millis(),
            result.acked,
            result.delivered,
            result.lost.len(),
            result.duplicates,
            if result.in_order {
                "in publish order"
            } else {
                "NOT as published"
            }
        );
        trials.push(result);
        acked.clear();
    }

    let stats = fs.stats();
    for line in logs.lines_with("adopted from shared storage") {
        eprintln!("{line}");
    }
    eprintln!(
        "faultfs: {} power cuts, {} fsyncs, {} directory syncs; {} s in all",
        stats.power_cuts,
        stats.fsyncs,
        stats.fsyncdirs,
        started.elapsed().as_secs()
    );
    let failed: Vec<String> = trials
        .iter()
        .filter(|t| !t.lost.is_empty() || t.duplicates > 0 || !t.in_order)
        .map(|t| {
            format!(
                "cut at {:?}: {} of {} acknowledged lost (e.g. {:?}), {} duplicates, {} delivered",
                t.point,
                t.lost.len(),
                t.acked,
                &t.lost[..t.lost.len().min(3)],
                t.duplicates,
                t.delivered
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "every acknowledged message once, in publish order, after each cut: {failed:#?}"
    );
    let left = copies(&shared);
    assert_eq!(left.len(), 1, "copies left: {left:?}");
}
