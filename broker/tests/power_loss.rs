//! Power loss, not only kill -9: the broker's data directory lives on a
//! fault-injecting FUSE filesystem (`faultfs/`) that keeps written but
//! unsynced data in memory and drops it on a simulated power cut, can fail
//! writes and fsyncs with EIO or ENOSPC, and flips bits in stored data.
//!
//! - Power cuts under pipelined load: every acknowledged id is delivered
//!   after the restarts.
//! - Power cuts while a fully acked segment's ids are carried to the dedup
//!   file: every acked id is still refused as a duplicate.
//! - Random bit flips: only the damaged records are lost, each is reported.
//! - EIO and ENOSPC at random points: `NACK storage`, no holes, and
//!   publishing works again without a restart.
//!
//! These tests need root and /dev/fuse (CI has both); they fail naming what
//! is missing, or print that they were skipped when `CIPHERMQ_SKIP_FUSE=1`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ciphermq_faultfs::{FaultErrno, FaultFs, FaultOps};
use ciphermq_proto::Reply;
use ciphermq_shard::log::record::Record;
use ciphermq_shard::log::segment::{self, Step, FILE_HEADER};
use ciphermq_shard::log::{queue_dir, segment_base};
use common::carry::acked_ids_refused_through_carry_crashes;
use common::process::{
    assert_none_lost, drain_counting, load_through_crashes, publish_pipelined, BrokerProcess,
};
use common::{config_text, next, pki, setup_receiver, TEST_MIN_FREE};

const QUEUE: &str = "receiver_1_queue";

/// A fault filesystem mounted on a fresh directory and a broker config
/// whose data directory is inside it; `None` when the run asked to skip.
struct Rig {
    fs: FaultFs,
    config: PathBuf,
    data: PathBuf,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn rig(storage: &str, admin: bool) -> Option<Rig> {
    if ciphermq_faultfs::skip_requested() {
        println!("skipped: FUSE test ({}=1)", ciphermq_faultfs::SKIP_ENV);
        return None;
    }
    let mount = tempfile::tempdir().unwrap();
    let fs = FaultFs::mount(mount.path()).unwrap_or_else(|e| {
        panic!(
            "{e} (set {}=1 to skip these tests)",
            ciphermq_faultfs::SKIP_ENV
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let data = fs.path().join("data");
    let extra = if admin {
        "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    let text = config_text(&pki().certs, &data, 1, extra)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace(TEST_MIN_FREE, &format!("{TEST_MIN_FREE}\n{storage}"));
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, text).unwrap();
    Some(Rig {
        fs,
        config,
        data,
        _dirs: (mount, dir),
    })
}

/// Starts the broker once to declare receiver_1's queue, and stops it.
async fn declare_queue(config: &Path) {
    let broker = BrokerProcess::start(config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    drop(r);
    assert!(broker.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_under_pipelined_load_lose_nothing_acknowledged() {
    let Some(rig) = rig("segment_bytes = 65536", false) else {
        return;
    };
    declare_queue(&rig.config).await;
    // Everything so far was made durable by the broker itself: a first cut
    // loses nothing of the set-up.
    rig.fs.power_cut();
    let fs = &rig.fs;
    let (acked, broker) = load_through_crashes(&rig.config, 5, 5000, |broker| {
        broker.kill();
        fs.power_cut();
    })
    .await;
    let delivered = drain_counting(&broker).await;
    print_sync_stats(&rig.fs);
    assert_none_lost(
        "power-loss test: 5 SIGKILLs + power cuts",
        &acked,
        &delivered,
    );
}

/// The dedup carry under power loss: the ids carried from a fully acked
/// segment must be on disk, synced, before the segment's deletion can be.
/// A kill and a power cut while the segment is being carried (or just after
/// its deletion), 3 times: every id acked before is still refused as a
/// duplicate, and the unacked barrier is still queued (`common/carry.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_during_a_segment_carry_keep_every_acked_id_refused() {
    let Some(rig) = rig("segment_bytes = 8388608", false) else {
        return;
    };
    declare_queue(&rig.config).await;
    rig.fs.power_cut();
    acked_ids_refused_through_carry_crashes(&rig.config, &rig.data, 3, || rig.fs.power_cut()).await;
    print_sync_stats(&rig.fs);
}

/// What the filesystem saw: power cuts, file and directory syncs.
fn print_sync_stats(fs: &FaultFs) {
    let stats = fs.stats();
    println!(
        "faultfs: {} power cuts, {} fsyncs, {} directory syncs",
        stats.power_cuts, stats.fsyncs, stats.fsyncdirs
    );
}

/// The message id in each record of a v2 log file, by where the record
/// starts and ends.
fn records_of(path: &Path) -> Vec<(usize, usize, String)> {
    let data = std::fs::read(path).unwrap();
    let layout = segment::layout(&data);
    let mut pos = layout.start;
    let mut out = Vec::new();
    while let Step::Record(record, n) = segment::step(&data, pos, layout.framing, true) {
        if let Record::Message { message_id, .. } = record {
            out.push((pos, pos + n, message_id.to_owned()));
        }
        pos += n;
    }
    out
}

/// The queue's segment files, oldest first.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(queue_dir(data, QUEUE))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(segment_base)
                .is_some()
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bit_flips_lose_only_the_damaged_records_and_report_each() {
    let Some(rig) = rig("segment_bytes = 16384", true) else {
        return;
    };
    declare_queue(&rig.config).await;
    let ids: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
    {
        let broker = BrokerProcess::start(&rig.config);
        let answers = publish_pipelined(&broker.addr, "sender_1", &ids, 50).await;
        assert!(answers
            .iter()
            .all(|(id, line)| *line == format!("ACK {id}")));
        assert!(broker.stop().success());
    }
    // Where every record lies, then the flips.
    let files = segments(&rig.data);
    assert!(files.len() > 1, "several segments: {files:?}");
    let layout: BTreeMap<PathBuf, Vec<(usize, usize, String)>> =
        files.iter().map(|f| (f.clone(), records_of(f))).collect();
    let flips = rig
        .fs
        .flip_random_bits(0x5eed, 8, |p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(segment_base)
                .is_some()
        })
        .expect("flip bits");
    let mut lost = BTreeSet::new();
    let mut damaged = BTreeSet::new();
    for flip in &flips {
        let file = rig.fs.path().join(&flip.path);
        let at = flip.offset as usize;
        if at < FILE_HEADER.len() {
            damaged.insert((file, 0));
            continue;
        }
        let records = &layout[&file];
        let (start, _, id) = records
            .iter()
            .find(|(s, e, _)| (*s..*e).contains(&at))
            .expect("every byte past the header is in a record");
        lost.insert(id.clone());
        damaged.insert((file, *start));
    }
    println!("flipped {flips:?}: lost {lost:?}");

    let broker = BrokerProcess::start(&rig.config);
    let mut r = broker.connect("receiver_1").await;
    r.queue_line(&format!("fetch {QUEUE} 1000"));
    r.flush().await.unwrap();
    let mut got = Vec::new();
    loop {
        match Reply::parse(&next(&mut r).await) {
            Reply::Message(d) => got.push(d.message_id.to_owned()),
            Reply::Ok(_) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let expected: Vec<String> = ids
        .iter()
        .filter(|id| !lost.contains(*id))
        .cloned()
        .collect();
    assert_eq!(got, expected, "exactly the damaged records are missing");
    assert_eq!(
        broker
            .metric("ciphermq_storage_quarantined_records_total")
            .await,
        Some(damaged.len() as f64),
        "each damaged record reported"
    );
    for (file, offset) in &damaged {
        assert!(
            segment::quarantine_path(file, *offset as u64).exists(),
            "quarantined: {} at {offset}",
            file.display()
        );
    }
}

/// Publishes `ids` on one connection, pipelined; every answer must be
/// `ACK` or `NACK storage`. Returns (acked, refused).
async fn publish_under_faults(
    broker: &BrokerProcess,
    ids: &[String],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let answers = publish_pipelined(&broker.addr, "sender_1", ids, 100).await;
    assert_eq!(answers.len(), ids.len(), "every publish answered");
    let (mut acked, mut refused) = (BTreeSet::new(), BTreeSet::new());
    for (id, line) in answers {
        if line == format!("ACK {id}") {
            acked.insert(id);
        } else {
            assert_eq!(line, format!("NACK {id} storage"));
            refused.insert(id);
        }
    }
    (acked, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_eio_and_enospc_are_nacked_leave_no_hole_and_need_no_restart() {
    let Some(rig) = rig("", true) else {
        return;
    };
    declare_queue(&rig.config).await;
    let broker = BrokerProcess::start(&rig.config);
    let (mut acked, mut refused) = (BTreeSet::new(), BTreeSet::new());
    for (phase, errno) in [(0, FaultErrno::Eio), (1, FaultErrno::Enospc)] {
        rig.fs
            .random_faults(7 + phase, 0.05, FaultOps::WritesAndFsyncs, errno);
        let ids: Vec<String> = (0..3000).map(|i| format!("p{phase}-{i}")).collect();
        let (a, r) = publish_under_faults(&broker, &ids).await;
        assert!(!r.is_empty(), "phase {phase}: faults were injected");
        acked.extend(a);
        refused.extend(r);
        // The faults end; the same broker stores again, no restart.
        rig.fs.clear_faults();
        let ids: Vec<String> = (0..200).map(|i| format!("q{phase}-{i}")).collect();
        let (a, r) = publish_under_faults(&broker, &ids).await;
        assert!(
            r.is_empty(),
            "phase {phase}: refused after the faults ended: {r:?}"
        );
        acked.extend(a);
        let (status, ready) = broker.admin_get("receiver_1", "/ready").await;
        assert_eq!(status, 200, "{ready}");
    }
    println!(
        "faultfs: {} faults injected; {} acked, {} refused",
        rig.fs.stats().injected_faults,
        acked.len(),
        refused.len()
    );
    broker.kill();
    rig.fs.power_cut();

    let broker = BrokerProcess::start(&rig.config);
    let delivered = drain_counting(&broker).await;
    assert_none_lost("injected EIO/ENOSPC + power cut", &acked, &delivered);
    let back: Vec<&String> = refused
        .iter()
        .filter(|id| delivered.contains_key(*id))
        .collect();
    assert!(back.is_empty(), "refused but delivered: {back:?}");
    assert_eq!(
        broker
            .metric("ciphermq_storage_quarantined_records_total")
            .await,
        Some(0.0),
        "failed writes were cut back: no damage, no hole"
    );
}

/// `queue`'s `storage_error` in `/api/queues` (`null` as "").
async fn storage_error_of(broker: &BrokerProcess, queue: &str) -> String {
    let (status, body) = broker.admin_get("admin", "/api/queues").await;
    assert_eq!(status, 200, "{body}");
    let queues: serde_json::Value = serde_json::from_str(&body).unwrap();
    let q = queues["queues"]
        .as_array()
        .and_then(|all| all.iter().find(|q| q["name"] == queue))
        .unwrap_or_else(|| panic!("{queue} in /api/queues: {body}"));
    q["storage_error"].as_str().unwrap_or_default().to_owned()
}

/// Polls (bounded) until `queue`'s `storage_error` satisfies `done`.
async fn wait_for_storage_error(
    broker: &BrokerProcess,
    queue: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let e = storage_error_of(broker, queue).await;
        if done(&e) {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{queue}: storage_error stayed {e:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// One publish of an envelope for `receiver` (key `receiver`): the reply.
async fn publish_one(
    s: &mut ciphermq_clients::connection::Connection,
    receiver: &str,
    id: &str,
) -> String {
    common::ask(
        s,
        &format!("publish ex {receiver} {}", common::body(id, receiver)),
    )
    .await
}

/// One queue's storage failure is its own (docs/PROTOCOL.md, "Storage
/// faults"): writes of receiver_2's queue fail with `EACCES`, a fault of
/// its files that the rest of the device does not share. Its publishes are
/// answered `NACK storage` and `/api/queues` says why; receiver_1's queue
/// goes on storing, and the broker stays ready (with a warning naming the
/// queue). Once the fault goes, the queue stores again and the report
/// clears, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_queues_storage_failure_is_reported_for_it_and_the_broker_stays_ready() {
    let Some(rig) = rig("", true) else {
        return;
    };
    let broker = BrokerProcess::start(&rig.config);
    for cn in ["receiver_1", "receiver_2"] {
        let mut r = broker.connect(cn).await;
        setup_receiver(&mut r, cn).await;
    }
    let mut s = broker.connect("sender_1").await;
    assert_eq!(
        publish_one(&mut s, "receiver_2", "before").await,
        "ACK before"
    );

    rig.fs.fail_in_dir("receiver_2_queue", FaultErrno::Eacces);
    assert_eq!(
        publish_one(&mut s, "receiver_2", "refused").await,
        "NACK refused storage"
    );
    assert_eq!(
        publish_one(&mut s, "receiver_1", "stored").await,
        "ACK stored"
    );
    let why = wait_for_storage_error(&broker, "receiver_2_queue", |e| !e.is_empty()).await;
    assert!(why.contains("segment-") && why.contains("denied"), "{why}");
    assert_eq!(storage_error_of(&broker, "receiver_1_queue").await, "");
    let (status, ready) = broker.admin_get("receiver_1", "/ready").await;
    assert_eq!(
        status, 200,
        "one queue's failure is not the broker's: {ready}"
    );
    assert!(
        ready.contains("queue receiver_2_queue: log writes failing"),
        "{ready}"
    );
    assert_eq!(
        broker.metric("ciphermq_queues_storage_failing").await,
        Some(1.0)
    );
    assert_eq!(broker.metric("ciphermq_storage_healthy").await, Some(1.0));

    rig.fs.clear_faults();
    assert_eq!(
        publish_one(&mut s, "receiver_2", "refused").await,
        "ACK refused",
        "the retry of a refused message is stored"
    );
    wait_for_storage_error(&broker, "receiver_2_queue", str::is_empty).await;
    let (status, ready) = broker.admin_get("receiver_1", "/ready").await;
    assert_eq!(status, 200, "{ready}");
    assert!(!ready.contains("log writes failing"), "{ready}");
    assert_eq!(
        broker.metric("ciphermq_queues_storage_failing").await,
        Some(0.0)
    );
    let mut r2 = broker.connect("receiver_2").await;
    let got = common::fetch(&mut r2, "receiver_2_queue", 10).await;
    assert_eq!(common::ids(&got), ["before", "refused"]);
    assert!(broker.stop().success());
}
