//! Failover on shared storage (`cluster.storage = "shared"`), against real
//! broker processes, the real PostgreSQL and a shared directory on the
//! local disk standing in for storage every node reaches: the node holding
//! an owner is killed (SIGKILL) or paused (SIGSTOP) under a pipelined load;
//! a surviving node takes the owner over, fences the dead node's copy,
//! adopts its backlog in order and acknowledges again; nothing
//! acknowledged is lost, and a paused node that wakes up acknowledges
//! nothing more.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ciphermq_clients::connection::{Connection, TlsClientOptions};
use common::cluster::shared_process_node;
use common::pg::TestDb;
use common::process::{is_ack, publish_pipelined, BrokerProcess};
use common::{fetch, ids, next, setup_receiver};

/// Lease of these nodes: takeovers come about 3 s after a node stops.
const LEASE_SECS: u64 = 2;

/// Three nodes sharing one PostgreSQL database and one shared directory.
struct Cluster {
    configs: Vec<PathBuf>,
    nodes: Vec<Option<BrokerProcess>>,
    _dirs: Vec<tempfile::TempDir>,
    shared: tempfile::TempDir,
}

impl Cluster {
    fn start(db: &TestDb) -> Cluster {
        Cluster::start_first(db, 3)
    }

    /// Three nodes' configs, the first `running` of them started.
    fn start_first(db: &TestDb, running: usize) -> Cluster {
        let shared = tempfile::tempdir().unwrap();
        let mut configs = Vec::new();
        let mut dirs = Vec::new();
        for id in ["node-a", "node-b", "node-c"] {
            let dir = tempfile::tempdir().unwrap();
            let (config, _) = shared_process_node(db, id, dir.path(), shared.path(), LEASE_SECS);
            configs.push(config);
            dirs.push(dir);
        }
        let nodes = configs
            .iter()
            .enumerate()
            .map(|(i, c)| (i < running).then(|| BrokerProcess::start(c)))
            .collect();
        Cluster {
            configs,
            nodes,
            _dirs: dirs,
            shared,
        }
    }

    /// [`Cluster::start`], with receiver_1's queue declared and bound on
    /// the first node and recorded in the owner catalogue (where an heir
    /// finds its binding).
    async fn serving_receiver_1(db: &TestDb) -> Cluster {
        let cluster = Cluster::start(db);
        let mut r1 = cluster.node(0).connect("receiver_1").await;
        setup_receiver(&mut r1, "receiver_1").await;
        drop(r1);
        common::cluster::binding_catalogued(db, "receiver_1").await;
        cluster
    }

    fn node(&self, i: usize) -> &BrokerProcess {
        self.nodes[i].as_ref().expect("node running")
    }

    fn index_of(&self, node_id: &str) -> usize {
        ["node-a", "node-b", "node-c"]
            .iter()
            .position(|n| *n == node_id)
            .unwrap_or_else(|| panic!("unknown node {node_id}"))
    }

    /// Where receiver_1 lives, as node `asked` sees it: (node index, epoch).
    /// None while it cannot say: a node whose lease ran out (a busy host
    /// can delay its heartbeats past a 2 s lease) closes its connections
    /// without a word until it renews it (`may_answer`).
    async fn locate(&self, asked: usize) -> Option<(usize, u64)> {
        let opts = TlsClientOptions::for_cn(&common::pki().certs, "sender_1");
        let mut conn = Connection::connect(&self.node(asked).addr, &opts)
            .await
            .ok()?;
        conn.queue_line("locate receiver_1");
        conn.flush().await.ok()?;
        let reply = conn.read_line().await.ok()??;
        let mut words = reply.split(' ');
        if words.next() != Some("OK") || words.next() != Some("locate") {
            return None;
        }
        let _owner = words.next()?;
        let node = self.index_of(words.next()?);
        let _addr = words.next()?;
        Some((node, words.next()?.parse().ok()?))
    }
}

/// Publishes `ids` to `node` until each is acknowledged there (answers
/// `NACK … storage` or `timeout` while the owner's backlog is adopted, and
/// `moved` while the node has not heard of the takeover, are retried);
/// returns when the first ACK came.
async fn publish_until_acked(node: &BrokerProcess, ids: &[String]) -> Instant {
    publish_until_acked_at(&node.addr, ids).await
}

/// [`publish_until_acked`] to the node at `addr`.
async fn publish_until_acked_at(addr: &str, ids: &[String]) -> Instant {
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left: Vec<String> = ids.to_vec();
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} publishes never acknowledged on {addr}",
            left.len(),
        );
        let answers = publish_pipelined(addr, "sender_1", &left, 100).await;
        let acked: BTreeSet<&String> = answers
            .iter()
            .filter(|(id, line)| is_ack(id, line))
            .map(|(id, _)| id)
            .collect();
        if !acked.is_empty() && first.is_none() {
            first = Some(Instant::now());
        }
        for (id, line) in &answers {
            assert!(
                is_ack(id, line)
                    || line.contains(" storage")
                    || line.contains(" timeout")
                    // This node has not heard of the takeover yet.
                    || line.contains(" moved "),
                "unexpected answer to {id}: {line}"
            );
        }
        left.retain(|id| !acked.contains(id));
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    first.unwrap_or_else(Instant::now)
}

/// Fetches and acks receiver_1's queue on `conn` until it is empty:
/// the ids in delivery order.
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

/// Waits until a node other than `dead` holds receiver_1 above `epoch`,
/// as node `asked` sees it.
async fn new_home(cluster: &Cluster, asked: usize, dead: usize, epoch: u64) -> (usize, u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((node, e)) = cluster.locate(asked).await {
            if node != dead && e > epoch {
                return (node, e);
            }
        }
        assert!(
            Instant::now() < deadline,
            "receiver_1 never left its dead node"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ten times: the node holding receiver_1 is killed (SIGKILL) in the
/// middle of a pipelined load; a surviving node takes receiver_1 over,
/// adopts its backlog from the shared directory and acknowledges its
/// publishes again; the killed node starts again and joins, holding
/// nothing. At the end every acknowledged message is delivered, in the
/// order it was published, and the shared directory holds only the last
/// holder's copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_owners_node_ten_times_under_load_loses_nothing_acknowledged() {
    let db = TestDb::create().await;
    let mut cluster = Cluster::serving_receiver_1(&db).await;
    let (mut home, mut epoch) = cluster.locate(0).await.expect("receiver_1 placed");
    assert_eq!(home, 0);

    let mut acked: BTreeSet<String> = BTreeSet::new();
    let mut retry: Vec<String> = Vec::new();
    let mut failovers = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for trial in 0..10u32 {
        // Unanswered ids of the last trial first, then new ones.
        let mut batch = std::mem::take(&mut retry);
        batch.extend((0..10_000).map(|i| format!("t{trial:02}-{i:05}")));
        let addr = cluster.node(home).addr.clone();
        let sent = batch.clone();
        let load =
            tokio::spawn(async move { publish_pipelined(&addr, "sender_1", &sent, 16).await });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(100 + seed % 300)).await;
        cluster.nodes[home].take().expect("running").kill();
        let killed = Instant::now();
        let answers = load.await.unwrap();
        let done: BTreeSet<&String> = answers
            .iter()
            .filter(|(id, line)| is_ack(id, line))
            .map(|(id, _)| id)
            .collect();
        acked.extend(done.iter().map(|id| (*id).clone()));
        retry = batch.into_iter().filter(|id| !done.contains(id)).collect();

        let asked = (home + 1) % 3;
        let (heir, heir_epoch) = new_home(&cluster, asked, home, epoch).await;
        // The first id never answered (or a new one) to the heir alone,
        // until it is acknowledged: that ends the failover. The rest
        // after it, so the publish order is kept (a pipeline retried past
        // a refusal would store later ids first).
        let probe = if retry.is_empty() {
            format!("t{trial:02}-99999")
        } else {
            retry.remove(0)
        };
        let first_ack = publish_until_acked(cluster.node(heir), std::slice::from_ref(&probe)).await;
        acked.insert(probe);
        publish_until_acked(cluster.node(heir), &retry).await;
        let took = first_ack - killed;
        eprintln!(
            "trial {trial}: node {home} killed after {} acked in all; node {heir} acknowledges at epoch {heir_epoch} after {} ms",
            acked.len(),
            took.as_millis()
        );
        failovers.push(took);
        acked.extend(retry.drain(..));
        cluster.nodes[home] = Some(BrokerProcess::start(&cluster.configs[home]));
        (home, epoch) = (heir, heir_epoch);
    }
    let mut r1 = cluster.node(home).connect("receiver_1").await;
    let delivered = drain(&mut r1).await;
    let mut times: HashMap<&String, u32> = HashMap::new();
    for id in &delivered {
        *times.entry(id).or_default() += 1;
    }
    let lost: Vec<&String> = acked.iter().filter(|id| !times.contains_key(id)).collect();
    failovers.sort();
    eprintln!(
        "acked {}, delivered {} ({} distinct), lost {}; failover median {} ms, max {} ms",
        acked.len(),
        delivered.len(),
        times.len(),
        lost.len(),
        failovers[failovers.len() / 2].as_millis(),
        failovers[failovers.len() - 1].as_millis()
    );
    assert!(
        acked.len() > 10_000,
        "the load must be real: {} acked",
        acked.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged but lost: {:?}",
        &lost[..lost.len().min(10)]
    );
    // In publish order: each id's first delivery comes after every
    // earlier id's (ids sort in the order they were published).
    let mut seen = BTreeSet::new();
    let firsts: Vec<&String> = delivered.iter().filter(|id| seen.insert(*id)).collect();
    if let Some(i) = firsts.windows(2).position(|w| w[0] > w[1]) {
        panic!(
            "the backlog was not delivered in publish order: {:?}",
            &firsts[i.saturating_sub(3)..(i + 4).min(firsts.len())]
        );
    }
    for failover in &failovers {
        assert!(
            *failover < Duration::from_secs(10),
            "a surviving node acknowledged only after {failover:?}"
        );
    }
    // Only the last holder's copy is left.
    let owner_dir = std::fs::read_dir(cluster.shared.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let copies: Vec<String> = std::fs::read_dir(&owner_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(copies.len(), 1, "copies left: {copies:?}");
}

/// Every answer a pipelined publisher got, with when it was read.
type Answers = Vec<(String, String, Instant)>;

/// Publishes `ids` pipelined (`window` in flight) to `addr` as sender_1,
/// noting when each answer was read, until every id is answered, the first
/// refusal (then only what is in flight is still read), or the connection
/// ends. `answered` counts the answers as they come.
async fn publish_noting_times(
    addr: String,
    ids: Vec<String>,
    window: usize,
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Answers {
    let opts = TlsClientOptions::for_cn(&common::pki().certs, "sender_1");
    let Ok(conn) = Connection::connect(&addr, &opts).await else {
        return Vec::new();
    };
    let (mut rd, mut wr) = conn.into_split();
    let mut answers: Answers = Vec::new();
    let mut sent = 0;
    let mut refused = false;
    while answers.len() < sent || (!refused && sent < ids.len()) {
        while !refused && sent < ids.len() && sent - answers.len() < window {
            wr.queue_line(&format!(
                "publish ex receiver_1 {}",
                common::body(&ids[sent], "receiver_1")
            ));
            sent += 1;
        }
        if wr.flush().await.is_err() {
            break;
        }
        match rd.read_line().await {
            Ok(Some(line)) => {
                let id = ids[answers.len()].clone();
                refused |= !is_ack(&id, &line);
                answers.push((id, line.to_owned(), Instant::now()));
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            _ => break,
        }
    }
    answers
}

/// The node holding receiver_1 is paused (SIGSTOP) for 15 s in the middle
/// of a pipelined load. Another node takes receiver_1 over and
/// acknowledges its publishes; no ACK comes from the paused node once the
/// takeover is seen (its lease ran out before it: whatever it had
/// written when it was paused is answered `NACK … storage` when it
/// wakes); woken, it redirects publishes to the new holder; nothing
/// acknowledged is lost, and the backlog comes in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_acknowledges_nothing_once_taken_over_and_loses_nothing() {
    let db = TestDb::create().await;
    let cluster = Cluster::serving_receiver_1(&db).await;

    let ids: Vec<String> = (0..200_000).map(|i| format!("p{i:06}")).collect();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = tokio::spawn(publish_noting_times(
        cluster.node(0).addr.clone(),
        ids.clone(),
        16,
        answered.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(std::sync::atomic::Ordering::Relaxed) < 1000 {
        assert!(Instant::now() < deadline, "the load never got going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.node(0).signal("STOP");
    let paused = Instant::now();
    let (heir, epoch) = new_home(&cluster, 1, 0, 1).await;
    let seen = Instant::now();
    let probe = "q000000".to_owned();
    let first_ack = publish_until_acked(cluster.node(heir), std::slice::from_ref(&probe)).await;

    while paused.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.node(0).signal("CONT");
    let resumed = Instant::now();
    // Woken, it sends publishes for receiver_1 to the new holder.
    let moved = format!(
        " moved receiver_1 {} ",
        ["node-a", "node-b", "node-c"][heir]
    );
    let redirected = loop {
        let answers = publish_pipelined(
            &cluster.node(0).addr,
            "sender_1",
            &["q000001".to_owned()],
            1,
        )
        .await;
        if answers
            .first()
            .is_some_and(|(_, line)| line.contains(&moved))
        {
            break resumed.elapsed();
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(60),
            "the woken node never redirected: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let answers = load.await.unwrap();
    let late: Vec<&(String, String, Instant)> = answers
        .iter()
        .filter(|(id, line, at)| is_ack(id, line) && *at >= seen)
        .collect();
    let acked_a: Vec<&String> = answers
        .iter()
        .filter(|(id, line, _)| is_ack(id, line))
        .map(|(id, _, _)| id)
        .collect();
    let refused: Vec<&String> = answers
        .iter()
        .filter(|(id, line, _)| !is_ack(id, line))
        .map(|(_, line, _)| line)
        .collect();
    eprintln!(
        "paused node: {} acked before the pause, {} answered after it wakes ({:?}…); takeover seen {} ms after the pause, first ACK on node {heir} (epoch {epoch}) after {} ms; woken node redirects {} ms after SIGCONT",
        acked_a.len(),
        refused.len(),
        refused.first(),
        (seen - paused).as_millis(),
        (first_ack - paused).as_millis(),
        redirected.as_millis()
    );
    assert!(
        late.is_empty(),
        "the paused node acknowledged {} publishes after the takeover, e.g. {:?}",
        late.len(),
        late.first()
    );
    for line in &refused {
        assert!(
            line.contains(" storage") || line.contains(" moved ") || line.contains(" timeout"),
            "unexpected answer from the woken node: {line}"
        );
    }

    // Everything sent and not acknowledged (at most a window past the
    // answers) goes to the new holder, in order.
    let rest: Vec<String> = ids[acked_a.len()..answers.len() + 16].to_vec();
    publish_until_acked(cluster.node(heir), &rest).await;
    let mut expected: Vec<String> = acked_a.iter().map(|id| (*id).clone()).collect();
    expected.extend(rest);
    let mut r1 = cluster.node(heir).connect("receiver_1").await;
    let delivered = drain(&mut r1).await;
    let mut seen_ids = BTreeSet::new();
    let firsts: Vec<String> = delivered
        .iter()
        .filter(|id| seen_ids.insert((*id).clone()))
        .cloned()
        .collect();
    let lost: Vec<&String> = expected
        .iter()
        .chain([&probe])
        .filter(|id| !seen_ids.contains(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged but lost: {:?}",
        &lost[..lost.len().min(10)]
    );
    // In publish order: what the paused node acknowledged, then the rest as
    // sent again; the probe after what was acknowledged (ids the paused
    // node wrote but never acknowledged may come before it or after it).
    let at = firsts.iter().position(|id| *id == probe).unwrap();
    assert!(
        at >= acked_a.len(),
        "the probe came before acknowledged messages"
    );
    let others: Vec<&String> = firsts.iter().filter(|id| **id != probe).collect();
    let expected: Vec<&String> = expected.iter().collect();
    assert!(others == expected, "delivered out of publish order");
}

/// The names of receiver_1's copies in the shared directory.
fn copies(shared: &std::path::Path) -> Vec<String> {
    let Some(owner_dir) = std::fs::read_dir(shared)
        .ok()
        .and_then(|mut d| d.next())
        .and_then(Result::ok)
    else {
        return Vec::new();
    };
    let mut names: Vec<String> = std::fs::read_dir(owner_dir.path())
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The node holding receiver_1 with a large backlog is killed; the node
/// that takes it over (the only other one running) is killed too, in the
/// middle of adopting the backlog (the fenced copy is still there, half
/// stored in its own). A third node, started then, takes receiver_1 over
/// and adopts both copies, oldest first: every acknowledged message is
/// delivered once, in publish order, and only its copy is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_heir_killed_mid_adoption_leaves_both_copies_to_the_next_in_order() {
    let db = TestDb::create().await;
    let mut cluster = Cluster::start_first(&db, 2);
    let mut r1 = cluster.node(0).connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    let ids: Vec<String> = (0..200_000).map(|i| format!("m{i:06}")).collect();
    // On a busy host node-a's lease can run out under this load: it then
    // refuses or closes the connection, and the ids left unanswered may or
    // may not be stored. What was acknowledged is what must come back.
    let answers = publish_pipelined(&cluster.node(0).addr, "sender_1", &ids, 200).await;
    let acked: Vec<&String> = answers
        .iter()
        .filter(|(id, line)| is_ack(id, line))
        .map(|(id, _)| id)
        .collect();
    assert!(!acked.is_empty(), "nothing acknowledged before the kill");

    cluster.nodes[0].take().expect("running").kill();
    // node-b, the only node left, fences node-a's copy and makes its own:
    // it is killed as soon as both are seen.
    let deadline = Instant::now() + Duration::from_secs(60);
    let adopting = loop {
        let names = copies(cluster.shared.path());
        let fenced = names.iter().any(|n| n.ends_with(".fenced"));
        let own = names
            .iter()
            .any(|n| n.starts_with("e00000000000000000002-"));
        if fenced && own {
            break names;
        }
        assert!(
            Instant::now() < deadline,
            "node-b never took receiver_1 over: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    cluster.nodes[1].take().expect("running").kill();
    let left = copies(cluster.shared.path());
    eprintln!("copies when the heir was killed: {adopting:?}; after: {left:?}");
    assert!(
        left.iter().any(|n| n.starts_with("e00000000000000000001-")),
        "the heir finished adopting before it was killed (make the backlog larger): {left:?}"
    );

    // Its console log says how long the adoption took.
    let text = std::fs::read_to_string(&cluster.configs[2]).unwrap();
    std::fs::write(
        &cluster.configs[2],
        text.replace("console = false", "console = true"),
    )
    .unwrap();
    cluster.nodes[2] = Some(BrokerProcess::start(&cluster.configs[2]));
    let (home, epoch) = new_home(&cluster, 2, 1, 2).await;
    assert_eq!(home, 2);
    let probe = "z000000".to_owned();
    publish_until_acked(cluster.node(home), std::slice::from_ref(&probe)).await;
    let mut r1 = cluster.node(home).connect("receiver_1").await;
    let delivered = drain(&mut r1).await;
    eprintln!(
        "third node at epoch {epoch}: {} delivered, {} of {} acknowledged before the kill",
        delivered.len(),
        acked.len(),
        ids.len()
    );
    for line in cluster.node(2).log_text().lines() {
        if line.contains("adopted from shared storage") {
            eprintln!("{line}");
        }
    }
    let got: BTreeSet<&String> = delivered.iter().collect();
    let lost: Vec<&&String> = acked.iter().filter(|id| !got.contains(**id)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged but lost, the first {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(got.contains(&probe), "the probe acknowledged but lost");
    // Ids sort in publish order (the probe last): each delivered once, in order.
    if let Some(i) = delivered.windows(2).position(|w| w[0] >= w[1]) {
        panic!(
            "delivered twice or out of publish order: {:?}",
            &delivered[i.saturating_sub(2)..(i + 3).min(delivered.len())]
        );
    }
    let last = copies(cluster.shared.path());
    assert_eq!(last.len(), 1, "copies left: {last:?}");
    assert!(last[0].starts_with(&format!("e{epoch:020}-")), "{last:?}");
}

/// Node `node_id`'s sections on shared storage in `shared`, lease 2 s,
/// reaching PostgreSQL through `hole` if given.
fn shared_sections(
    db: &TestDb,
    node_id: &str,
    shared: &std::path::Path,
    hole: Option<&common::blackhole::Blackhole>,
) -> String {
    let text = format!(
        "{}storage = \"shared\"\nshared_dir = \"{}\"\n",
        common::cluster::sections(db, node_id).replace("lease_secs = 5", "lease_secs = 2"),
        shared.display()
    );
    match hole {
        Some(hole) => text.replace("port = 5432", &format!("port = {}", hole.addr.port())),
        None => text,
    }
}

/// The owner's node is cut off from PostgreSQL alone (its coordinator's
/// connection blackholed) while it keeps serving a pipelined load: it
/// cannot renew its lease, so it stops acknowledging before the others
/// declare it dead. Every ACK it sent came before the takeover PostgreSQL
/// recorded (one clock: this host's); the new node acknowledges; once
/// the link is back the old node lets go of the owner; nothing
/// acknowledged is lost, and the backlog comes in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_postgres_alone_stops_acknowledging_before_it_is_taken_over() {
    use common::blackhole::Blackhole;
    use common::TestBroker;
    let db = TestDb::create().await;
    let hole = Blackhole::start().await;
    let shared = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = TestBroker::start_durable_with(
        1,
        dirs[0].path(),
        "127.0.0.1:0",
        &shared_sections(&db, "node-a", shared.path(), Some(&hole)),
    );
    let others = [
        TestBroker::start_durable_with(
            1,
            dirs[1].path(),
            "127.0.0.1:0",
            &shared_sections(&db, "node-b", shared.path(), None),
        ),
        TestBroker::start_durable_with(
            1,
            dirs[2].path(),
            "127.0.0.1:0",
            &shared_sections(&db, "node-c", shared.path(), None),
        ),
    ];
    let _reopen = hole.reopen_on_drop();
    let mut r1 = common::connect_as(&a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    common::cluster::binding_catalogued(&db, "receiver_1").await;

    let ids: Vec<String> = (0..1_000_000).map(|i| format!("c{i:07}")).collect();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (clock_instant, clock_system) = (Instant::now(), std::time::SystemTime::now());
    let load = tokio::spawn(publish_noting_times(
        a.addr.clone(),
        ids.clone(),
        16,
        answered.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(std::sync::atomic::Ordering::Relaxed) < 1000 {
        assert!(Instant::now() < deadline, "the load never got going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    hole.cut.store(true, std::sync::atomic::Ordering::Relaxed);
    let cut = Instant::now();

    let client = db.client().await;
    let (heir_id, declared_at) = loop {
        let row = client
            .query_opt(
                "SELECT p.node_id, t.at FROM ciphermq_cluster.cluster_placements p, ciphermq_cluster.cluster_takeovers t \
                 WHERE p.owner = 'receiver_1' AND p.epoch = 2 AND t.node_id = 'node-a'",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            break (
                row.get::<_, String>(0),
                row.get::<_, std::time::SystemTime>(1),
            );
        }
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "nobody took receiver_1 over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let heir = if heir_id == "node-b" {
        &others[0]
    } else {
        &others[1]
    };
    let probe = "d0000000".to_owned();
    let mut first_ack = None;
    while first_ack.is_none() {
        let answers =
            publish_pipelined(&heir.addr, "sender_1", std::slice::from_ref(&probe), 1).await;
        if answers.first().is_some_and(|(id, line)| is_ack(id, line)) {
            first_ack = Some(cut.elapsed());
        } else {
            assert!(
                cut.elapsed() < Duration::from_secs(60),
                "the new node never acknowledged: {answers:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let answers = load.await.unwrap();
    let acked_a: Vec<&(String, String, Instant)> = answers
        .iter()
        .filter(|(id, line, _)| is_ack(id, line))
        .collect();
    let last_ack = acked_a
        .last()
        .map(|(_, _, at)| clock_system + (*at - clock_instant))
        .unwrap();
    let margin = declared_at
        .duration_since(last_ack)
        .unwrap_or_else(|e| panic!("node-a acknowledged {:?} after the takeover", e.duration()));
    eprintln!(
        "cut-off node: {} acked, the last {} ms before PostgreSQL recorded the takeover; takeover recorded {} ms after the cut; first ACK on {heir_id} {} ms after the cut",
        acked_a.len(),
        margin.as_millis(),
        (declared_at.duration_since(clock_system + (cut - clock_instant)).unwrap_or_default()).as_millis(),
        first_ack.unwrap().as_millis()
    );
    for (_, line, _) in answers.iter().skip(acked_a.len()) {
        assert!(
            line.contains(" storage") || line.contains(" moved "),
            "unexpected answer: {line}"
        );
    }
    // What it never acknowledged goes to the new node, in order.
    let rest: Vec<String> = ids[acked_a.len()..answers.len() + 16].to_vec();
    publish_until_acked_at(&heir.addr, &rest).await;
    hole.cut.store(false, std::sync::atomic::Ordering::Relaxed);

    let mut r1 = common::connect_as(heir, "receiver_1").await;
    let delivered = drain(&mut r1).await;
    let mut seen = BTreeSet::new();
    let firsts: Vec<String> = delivered
        .iter()
        .filter(|id| seen.insert((*id).clone()))
        .cloned()
        .collect();
    let mut expected: Vec<String> = acked_a.iter().map(|(id, _, _)| id.clone()).collect();
    expected.extend(rest);
    let lost: Vec<&String> = expected
        .iter()
        .chain([&probe])
        .filter(|id| !seen.contains(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged but lost: {:?}",
        &lost[..lost.len().min(10)]
    );
    let others_in_order: Vec<&String> = firsts.iter().filter(|id| **id != probe).collect();
    let expected: Vec<&String> = expected.iter().collect();
    assert!(
        others_in_order == expected,
        "delivered out of publish order"
    );
    drop(a);
}

/// The node holding receiver_1 is killed (SIGKILL) and started again well
/// within its lease (5 s here): nobody takes receiver_1 over, and the node,
/// back under a new incarnation, fences its own previous copy and adopts
/// it: every acknowledged message is served again, in order, and only the
/// new copy is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_within_its_lease_adopts_its_own_copy() {
    let db = TestDb::create().await;
    let shared = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let configs: Vec<PathBuf> = ["node-a", "node-b"]
        .iter()
        .zip(&dirs)
        .map(|(id, dir)| shared_process_node(&db, id, dir.path(), shared.path(), 5).0)
        .collect();
    let a = BrokerProcess::start(&configs[0]);
    let _b = BrokerProcess::start(&configs[1]);
    let mut r1 = a.connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    let ids: Vec<String> = (0..20_000).map(|i| format!("r{i:05}")).collect();
    let answers = publish_pipelined(&a.addr, "sender_1", &ids, 64).await;
    assert!(
        answers.len() == ids.len() && answers.iter().all(|(id, line)| is_ack(id, line)),
        "every publish acknowledged before the kill ({} of {} answered)",
        answers.len(),
        ids.len()
    );

    a.kill();
    let a = BrokerProcess::start(&configs[0]);
    let probe = "s00000".to_owned();
    publish_until_acked(&a, std::slice::from_ref(&probe)).await;
    let client = db.client().await;
    let (node, epoch): (String, i64) = {
        let row = client
            .query_one(
                "SELECT node_id, epoch FROM ciphermq_cluster.cluster_placements WHERE owner = 'receiver_1'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (node.as_str(), epoch),
        ("node-a", 1),
        "no takeover within the lease"
    );
    let mut r1 = a.connect("receiver_1").await;
    let delivered = drain(&mut r1).await;
    let mut expected = ids;
    expected.push(probe);
    assert!(
        delivered == expected,
        "every acknowledged message once, in publish order"
    );
    let left = copies(shared.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0].starts_with("e00000000000000000001-") && !left[0].ends_with(".fenced"),
        "{left:?}"
    );
}

/// PostgreSQL away from all three nodes for 8 s, past the lease and its
/// margin: no node can renew its lease, so none acknowledges for long
/// (with shared storage that is the price of fencing), and none declares
/// another dead, during the outage or after it. Once it is back, the same
/// node acknowledges again, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_away_from_every_node_makes_no_takeover_and_loses_nothing() {
    use common::blackhole::Blackhole;
    use common::cluster::{cluster_state, every_node_beats_again};
    use common::TestBroker;
    let db = TestDb::create().await;
    let hole = Blackhole::start().await;
    let shared = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<TestBroker> = ["node-a", "node-b", "node-c"]
        .iter()
        .zip(&dirs)
        .map(|(id, dir)| {
            TestBroker::start_durable_with(
                1,
                dir.path(),
                "127.0.0.1:0",
                &shared_sections(&db, id, shared.path(), Some(&hole)),
            )
        })
        .collect();
    let _reopen = hole.reopen_on_drop();
    let a = &nodes[0];
    let mut r1 = common::connect_as(a, "receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    let mut acked: Vec<String> = (0..100).map(|i| format!("before{i:03}")).collect();
    publish_until_acked_at(&a.addr, &acked).await;
    every_node_beats_again(&db).await;
    let before = cluster_state(&db).await;
    assert_eq!(before.1, 0);

    hole.cut.store(true, std::sync::atomic::Ordering::Relaxed);
    let cut = Instant::now();
    let (mut during, mut refused) = (0, 0);
    let mut i = 0;
    while cut.elapsed() < Duration::from_secs(8) {
        let id = format!("cut{i:04}");
        let answers = publish_pipelined(&a.addr, "sender_1", std::slice::from_ref(&id), 1).await;
        match answers.first() {
            Some((_, line)) if is_ack(&id, line) => {
                acked.push(id);
                during += 1;
                i += 1;
            }
            // Refused, or the connection closed with the answer: sent
            // again, with its id.
            _ => refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hole.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    every_node_beats_again(&db).await;
    assert_eq!(
        cluster_state(&db).await,
        before,
        "no takeover, no placement change"
    );
    let after: Vec<String> = (i..i + 100).map(|i| format!("cut{i:04}")).collect();
    publish_until_acked_at(&a.addr, &after).await;
    acked.extend(after);
    eprintln!("PostgreSQL away 8 s: {during} acknowledged during the outage, {refused} tries refused or unanswered; no takeover");
    assert!(
        refused > 0,
        "a node without its lease must stop acknowledging"
    );
    let mut r1 = common::connect_as(a, "receiver_1").await;
    let delivered = drain(&mut r1).await;
    assert!(
        delivered == acked,
        "every acknowledged message once, in publish order"
    );
}

/// Fetches one message on `conn`, asserts it is `id` delivered for the
/// `count`th time, and gives it back (`nack`).
async fn deliver_and_give_back(conn: &mut Connection, id: &str, count: u32) {
    let got = fetch(conn, "receiver_1_queue", 1).await;
    assert_eq!(
        got.iter()
            .map(|g| (g.id.as_str(), g.count))
            .collect::<Vec<_>>(),
        [(id, count)],
        "delivery {count} of {id}"
    );
    conn.queue_line(&format!("nack {id} receiver_1_queue"));
    conn.flush().await.unwrap();
    assert_eq!(next(conn).await, format!("NACK_CONFIRMED {id}"));
}

/// receiver_1's first message is delivered twice on its node and given
/// back each time; the node is killed. The heir delivers it a third time:
/// the backlog is adopted with its delivery counts, not as new messages
/// (so `max_deliveries` still counts every delivery). Given back again and
/// the heir killed too, the last node delivers it a fourth time: the heir
/// had written the counts it adopted into its own log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_carry_over_through_takeovers() {
    let db = TestDb::create().await;
    let mut cluster = Cluster::serving_receiver_1(&db).await;
    let mut r1 = cluster.node(0).connect("receiver_1").await;
    publish_until_acked(cluster.node(0), &["c0".to_owned(), "c1".to_owned()]).await;
    for count in 1..=2 {
        deliver_and_give_back(&mut r1, "c0", count).await;
    }
    drop(r1);
    // The deliveries' records reach the disk with the log's next round.
    publish_until_acked(cluster.node(0), &["c2".to_owned()]).await;
    cluster.nodes[0].take().expect("running").kill();

    let (heir, epoch) = new_home(&cluster, 1, 0, 1).await;
    publish_until_acked(cluster.node(heir), &["c3".to_owned()]).await;
    let mut r1 = cluster.node(heir).connect("receiver_1").await;
    deliver_and_give_back(&mut r1, "c0", 3).await;
    drop(r1);
    publish_until_acked(cluster.node(heir), &["c4".to_owned()]).await;
    cluster.nodes[heir].take().expect("running").kill();

    let last = 3 - heir;
    let (home, _) = new_home(&cluster, last, heir, epoch).await;
    assert_eq!(home, last, "the only node left");
    publish_until_acked(cluster.node(home), &["c5".to_owned()]).await;
    let mut r1 = cluster.node(home).connect("receiver_1").await;
    let got = fetch(&mut r1, "receiver_1_queue", 10).await;
    assert_eq!(
        got.iter()
            .map(|g| (g.id.as_str(), g.count))
            .collect::<Vec<_>>(),
        [
            ("c0", 4),
            ("c1", 1),
            ("c2", 1),
            ("c3", 1),
            ("c4", 1),
            ("c5", 1)
        ],
        "in order, each counting on from its deliveries before"
    );
}

/// An adoption carries a backlog ten times the memory budget: the heir
/// holds a step of it at a time, never the backlog (its resident memory
/// grows by far less than the backlog's size), and delivers all of it in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_a_backlog_ten_times_the_memory_budget_stays_within_memory() {
    use common::hostile::{peak_rss, rss};
    use common::process::publish_pipelined_bodies;
    const BUDGET_MB: u64 = 8;
    const MESSAGES: usize = 800;
    const CIPHERTEXT_BYTES: usize = 100_000;
    let backlog = (MESSAGES * CIPHERTEXT_BYTES) as u64;
    let db = TestDb::create().await;
    let mut cluster = Cluster::start_first(&db, 0);
    for (i, config) in cluster.configs.iter().enumerate() {
        let text = std::fs::read_to_string(config).unwrap();
        std::fs::write(
            config,
            text.replace(
                r#"mode = "durable""#,
                &format!("mode = \"durable\"\nmemory_budget_mb = {BUDGET_MB}"),
            ),
        )
        .unwrap();
        if i < 2 {
            cluster.nodes[i] = Some(BrokerProcess::start(config));
        }
    }
    let mut r1 = cluster.node(0).connect("receiver_1").await;
    setup_receiver(&mut r1, "receiver_1").await;
    drop(r1);
    common::cluster::binding_catalogued(&db, "receiver_1").await;
    let ciphertext = "QUFB".repeat(CIPHERTEXT_BYTES / 4);
    let big = |id: &str| {
        format!(
            r#"{{"message_id":"{id}","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"{ciphertext}"}}"#
        )
    };
    let ids: Vec<String> = (0..MESSAGES).map(|i| format!("big{i:04}")).collect();
    let answers = publish_pipelined_bodies(&cluster.node(0).addr, "sender_1", &ids, 20, big).await;
    assert!(
        answers.len() == ids.len() && answers.iter().all(|(id, line)| is_ack(id, line)),
        "every publish acknowledged before the kill"
    );

    let heir_pid = cluster.node(1).pid();
    let before = rss(heir_pid);
    cluster.nodes[0].take().expect("running").kill();
    let (home, _) = new_home(&cluster, 1, 0, 1).await;
    assert_eq!(home, 1, "the only node left");
    // Acknowledged once the backlog is adopted.
    publish_until_acked(cluster.node(1), &["probe".to_owned()]).await;
    let peak = peak_rss(heir_pid);
    let grew = peak.saturating_sub(before);
    eprintln!(
        "adopting {} MB with a {BUDGET_MB} MiB budget: resident {} MB before, peak {} MB (+{} MB)",
        backlog / 1_000_000,
        before / 1_000_000,
        peak / 1_000_000,
        grew / 1_000_000
    );
    assert!(
        grew < backlog / 2,
        "the heir's peak resident memory grew by {grew} bytes adopting a backlog of {backlog}"
    );
    let mut r1 = cluster.node(1).connect("receiver_1").await;
    let delivered = drain(&mut r1).await;
    let mut expected = ids;
    expected.push("probe".to_owned());
    assert!(
        delivered == expected,
        "every acknowledged message once, in publish order ({} delivered)",
        delivered.len()
    );
}

/// `move receiver_1 <node>` on shared storage, with 100,000 messages
/// queued (the first delivered once and given back) and a publisher
/// publishing throughout, following redirects: the old node stops and
/// lets its logs stand still, the new node fences them and adopts them
/// before it serves the owner. Then moved again, to the third node. Every
/// acknowledged message is delivered once, in publish order, counts kept,
/// and only the last holder's copy is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_moves_on_shared_storage_under_load_losing_and_reordering_nothing() {
    use common::cluster::publish_following;
    const QUEUED: usize = 100_000;
    let db = TestDb::create().await;
    let cluster = Cluster::serving_receiver_1(&db).await;
    let mut r1 = cluster.node(0).connect("receiver_1").await;
    let queued: Vec<String> = (0..QUEUED).map(|i| format!("q{i:06}")).collect();
    publish_until_acked(cluster.node(0), &queued).await;
    deliver_and_give_back(&mut r1, &queued[0], 1).await;
    drop(r1);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = tokio::spawn(publish_following(
        cluster.node(0).addr.clone(),
        stop.clone(),
    ));
    let mut admin = cluster.node(0).connect("admin").await;
    let mut took = Vec::new();
    for (to, epoch) in [(1, 2), (2, 3)] {
        let started = Instant::now();
        let reply = tokio::time::timeout(
            Duration::from_secs(60),
            admin.request(&format!(
                "move receiver_1 {}",
                ["node-a", "node-b", "node-c"][to]
            )),
        )
        .await
        .expect("move answered")
        .expect("move reply");
        took.push(started.elapsed());
        assert_eq!(
            reply,
            format!(
                "OK move receiver_1 {} {} {epoch}",
                ["node-a", "node-b", "node-c"][to],
                cluster.node(to).addr
            )
        );
        // The new holder acknowledges once it has adopted the backlog.
        publish_until_acked(cluster.node(to), &[format!("after-move-{epoch}")]).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, longest_gap) = live.await.expect("publisher");
    assert!(!acked.is_empty());

    let mut r1 = cluster.node(2).connect("receiver_1").await;
    let first = fetch(&mut r1, "receiver_1_queue", 1).await;
    assert_eq!(
        first
            .iter()
            .map(|g| (g.id.as_str(), g.count))
            .collect::<Vec<_>>(),
        [(queued[0].as_str(), 2)],
        "the message given back comes first, its count kept through both moves"
    );
    r1.queue_line(&format!("ack {} receiver_1_queue", queued[0]));
    r1.flush().await.unwrap();
    assert!(next(&mut r1).await.starts_with("ACK_CONFIRMED "));
    let delivered = drain(&mut r1).await;
    let queued_rest: BTreeSet<&String> = queued[1..].iter().collect();
    let probes: BTreeSet<String> = ["after-move-2", "after-move-3"].map(String::from).into();
    // The queued backlog first, in order; the live publisher's and the
    // probes after it, each in its own order.
    assert!(
        delivered[..QUEUED - 1].iter().eq(queued[1..].iter()),
        "the queued backlog in publish order"
    );
    let rest: Vec<&String> = delivered[QUEUED - 1..].iter().collect();
    let live_got: Vec<&String> = rest
        .iter()
        .copied()
        .filter(|id| !probes.contains(*id))
        .collect();
    assert!(
        live_got.iter().copied().eq(acked.iter()),
        "the live publisher's {} acknowledged messages once each, in order (got {})",
        acked.len(),
        live_got.len()
    );
    assert_eq!(
        rest.len(),
        acked.len() + probes.len(),
        "and the two probes, once each"
    );
    assert!(rest.iter().all(|id| !queued_rest.contains(*id)));
    let left = copies(cluster.shared.path());
    assert_eq!(left.len(), 1, "copies left: {left:?}");
    assert!(left[0].starts_with("e00000000000000000003-"), "{left:?}");
    eprintln!(
        "moved {QUEUED} queued on shared storage in {took:?}; the live publisher's longest wait between two acks: {longest_gap:?} ({} live messages)",
        acked.len()
    );
}

/// A move on shared storage the new node cannot take (a log directory of
/// the queue's name is on its disk already) is given up: the owner stays
/// on its node at its epoch, its queues are served there again with every
/// message, its copy is never fenced, and publishing goes on there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_on_shared_storage_the_new_node_cannot_take_is_given_up_and_nothing_is_lost() {
    let db = TestDb::create().await;
    let cluster = Cluster::serving_receiver_1(&db).await;
    let sent: Vec<String> = (0..500).map(|i| format!("k{i:04}")).collect();
    publish_until_acked(cluster.node(0), &sent).await;
    let before = copies(cluster.shared.path());

    std::fs::create_dir_all(
        cluster._dirs[1]
            .path()
            .join("data")
            .join("queues")
            .join("receiver_1_queue"),
    )
    .unwrap();
    let mut admin = cluster.node(1).connect("admin").await;
    let reply = admin.request("move receiver_1 node-b").await.unwrap();
    assert_eq!(
        reply,
        "Error: cluster: the move of owner receiver_1 was given up (the log of its nodes says why); it stays where it was"
    );
    assert_eq!(
        cluster.locate(1).await,
        Some((0, 1)),
        "still node-a's, epoch 1"
    );
    assert_eq!(
        copies(cluster.shared.path()),
        before,
        "its copy never fenced"
    );
    publish_until_acked(cluster.node(0), &["again".to_owned()]).await;
    let mut r1 = cluster.node(0).connect("receiver_1").await;
    let mut expected = sent;
    expected.push("again".to_owned());
    assert_eq!(drain(&mut r1).await, expected);
}

/// A move on shared storage with either node killed (SIGKILL) in the
/// middle of it and started again: the old node once it has begun setting
/// the owner aside; the new node once it has begun taking it; the new node
/// as soon as the move is answered (adopting the old copy). The move
/// either finishes or is given up, and after it the owner is served by
/// exactly one node with every queued message, once, in order, and one
/// copy left on the shared storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn either_node_killed_in_the_middle_of_a_move_on_shared_storage_loses_nothing() {
    const QUEUED: usize = 50_000;
    for (killed, mark) in [(0, Some("moving")), (1, Some("incoming")), (1, None)] {
        let db = TestDb::create().await;
        let mut cluster = Cluster::serving_receiver_1(&db).await;
        let queued: Vec<String> = (0..QUEUED).map(|i| format!("q{i:06}")).collect();
        publish_until_acked(cluster.node(0), &queued).await;

        let mut admin = cluster.node(2).connect("admin").await;
        admin.queue_line("move receiver_1 node-b");
        admin.flush().await.unwrap();
        if let Some(mark) = mark {
            let seen = cluster._dirs[killed].path().join("data").join(mark);
            let deadline = Instant::now() + Duration::from_secs(30);
            while seen.read_dir().map_or(0, |d| d.count()) == 0 {
                assert!(
                    Instant::now() < deadline,
                    "{} never appeared",
                    seen.display()
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let restart = |cluster: &mut Cluster| {
            cluster.nodes[killed].take().expect("running").kill();
            cluster.nodes[killed] = Some(BrokerProcess::start(&cluster.configs[killed]));
        };
        if mark.is_some() {
            restart(&mut cluster);
        }
        let reply = tokio::time::timeout(Duration::from_secs(60), next(&mut admin))
            .await
            .expect("the move is answered");
        if mark.is_none() {
            restart(&mut cluster);
        }
        assert!(
            reply.starts_with("OK move receiver_1 node-b ")
                || reply.starts_with("Error: cluster: the move of owner receiver_1 "),
            "{reply}"
        );

        // Wherever it ended, the owner is served there with everything.
        let deadline = Instant::now() + Duration::from_secs(60);
        let (home, epoch) = loop {
            let (home, epoch) = cluster.locate(2).await.expect("receiver_1 placed");
            let probe = vec![format!("probe-{epoch}")];
            let answers = publish_pipelined(&cluster.node(home).addr, "sender_1", &probe, 1).await;
            if answers.first().is_some_and(|(id, line)| is_ack(id, line)) {
                break (home, epoch);
            }
            assert!(
                Instant::now() < deadline,
                "receiver_1 never served again: {answers:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut r1 = cluster.node(home).connect("receiver_1").await;
        let delivered = drain(&mut r1).await;
        eprintln!(
            "node {killed} killed once {}: {reply}; served by node {home} at epoch {epoch}, {} delivered",
            mark.map_or("the move was answered".to_owned(), |m| format!("{m}/ appeared")),
            delivered.len()
        );
        assert!(
            delivered.len() > QUEUED && delivered[..QUEUED].iter().eq(queued.iter()),
            "every queued message once, in order ({} delivered)",
            delivered.len()
        );
        // Then the probe acknowledged (and any earlier one left unanswered
        // by a node that stopped: stored or not, never twice).
        let probes = &delivered[QUEUED..];
        assert!(probes.contains(&format!("probe-{epoch}")), "{probes:?}");
        let distinct: BTreeSet<&String> = probes.iter().collect();
        assert!(
            distinct.len() == probes.len() && probes.iter().all(|p| p.starts_with("probe-")),
            "{probes:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = copies(cluster.shared.path());
            if left.len() == 1 && left[0].starts_with(&format!("e{epoch:020}-")) {
                break;
            }
            assert!(Instant::now() < deadline, "copies left: {left:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
