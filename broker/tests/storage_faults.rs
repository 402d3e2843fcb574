//! Storage faults, met as an operator meets them, on the real broker binary and
//! real files (docs/PROTOCOL.md, "Storage layout"): a damaged byte costs only
//! its record (the rest is served, the damage is quarantined and reported); a
//! full disk refuses publishes early and is left by itself once consumers free
//! space; a real ENOSPC answers `NACK storage` without making files in a loop
//! or leaving a hole, and is recovered from without a restart; a purge it
//! keeps from being written says so, and is written once there is room.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ciphermq_clients::connection::Connection;
use ciphermq_proto::Reply;
use ciphermq_shard::log::segment::{self, Step};
use ciphermq_shard::log::{queue_dir, segment_path};
use common::process::BrokerProcess;
use common::{body, config_text, next, pki, setup_receiver, TEST_MIN_FREE};

const QUEUE: &str = "receiver_1_queue";

/// A broker directory: `broker.toml` over `data/`, durable, admin endpoint
/// on, console logs on; `storage` lines go into `[storage]`.
fn setup(dir: &Path, data: &Path, storage: &str) -> PathBuf {
    let config = dir.join("broker.toml");
    let admin = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";
    let text = config_text(&pki().certs, data, 1, admin)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace(
            TEST_MIN_FREE,
            if storage.is_empty() {
                TEST_MIN_FREE
            } else {
                storage
            },
        )
        .replace("console = false", "console = true\nlevel = \"warn\"");
    std::fs::write(&config, text).unwrap();
    config
}

/// Publishes `ids` one at a time; returns each reply line.
async fn publish_each(s: &mut Connection, ids: &[String]) -> Vec<String> {
    let mut replies = Vec::new();
    for id in ids {
        s.queue_line(&format!("publish ex receiver_1 {}", body(id, "receiver_1")));
        s.flush().await.unwrap();
        replies.push(next(s).await);
    }
    replies
}

/// Publishes `ids` pipelined, `window` at a time; returns each reply line.
async fn publish_pipelined(s: &mut Connection, ids: &[String], window: usize) -> Vec<String> {
    let mut replies = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(window) {
        for id in chunk {
            s.queue_line(&format!("publish ex receiver_1 {}", body(id, "receiver_1")));
        }
        s.flush().await.unwrap();
        for _ in chunk {
            replies.push(next(s).await);
        }
    }
    replies
}

/// Fetches and acks everything in the queue; returns the ids in order.
async fn drain_and_ack(r: &mut Connection) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        r.queue_line(&format!("fetch {QUEUE} 500"));
        r.flush().await.unwrap();
        let mut batch = Vec::new();
        loop {
            let line = next(r).await;
            match Reply::parse(&line) {
                Reply::Message(d) => batch.push(d.message_id.to_owned()),
                Reply::Ok(_) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        if batch.is_empty() {
            return got;
        }
        for id in &batch {
            r.queue_line(&format!("ack {id} {QUEUE}"));
        }
        r.flush().await.unwrap();
        for id in &batch {
            assert_eq!(next(r).await, format!("ACK_CONFIRMED {id}"));
        }
        got.extend(batch);
    }
}

/// Fetches everything without acking: the ids in order.
async fn fetch_all(r: &mut Connection) -> Vec<String> {
    fetch_up_to(r, 100_000).await
}

/// Fetches up to `max` ready messages (left unacked) and returns their ids.
async fn fetch_up_to(r: &mut Connection, max: usize) -> Vec<String> {
    r.queue_line(&format!("fetch {QUEUE} {max}"));
    r.flush().await.unwrap();
    let mut got = Vec::new();
    loop {
        match Reply::parse(&next(r).await) {
            Reply::Message(d) => got.push(d.message_id.to_owned()),
            Reply::Ok(_) => return got,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Where each record of a log file starts.
fn record_starts(path: &Path) -> Vec<usize> {
    let data = std::fs::read(path).unwrap();
    let layout = segment::layout(&data);
    let mut pos = layout.start;
    let mut starts = Vec::new();
    while let Step::Record(_, n) = segment::step(&data, pos, layout.framing, true) {
        starts.push(pos);
        pos += n;
    }
    starts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_damaged_byte_costs_only_its_record_which_is_quarantined_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = setup(dir.path(), &data, "");
    let ids: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    {
        let broker = BrokerProcess::start(&config);
        let mut r = broker.connect("receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let mut s = broker.connect("sender_1").await;
        let replies = publish_each(&mut s, &ids).await;
        let acks: Vec<String> = ids.iter().map(|id| format!("ACK {id}")).collect();
        assert_eq!(replies, acks);
        assert!(broker.stop().success());
    }
    // One byte of the 4th record's length field.
    let segment = segment_path(&queue_dir(&data, QUEUE), 0);
    let starts = record_starts(&segment);
    assert_eq!(starts.len(), 10, "one record per message");
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[starts[3] + 5] ^= 0x20;
    std::fs::write(&segment, &bytes).unwrap();

    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    let got = fetch_all(&mut r).await;
    let mut expected = ids.clone();
    expected.remove(3);
    assert_eq!(got, expected, "only the damaged record is lost");
    // Its bytes are kept beside the segment.
    let kept = segment::quarantine_path(&segment, starts[3] as u64);
    assert_eq!(
        std::fs::read(&kept).expect("quarantine file"),
        &bytes[starts[3]..starts[4]]
    );
    // Logged with file and offset, counted, and shown in /ready.
    assert!(broker.logged(&[
        &segment.display().to_string(),
        &format!("offset {}", starts[3])
    ]));
    assert_eq!(
        broker
            .metric("ciphermq_storage_quarantined_records_total")
            .await,
        Some(1.0)
    );
    assert_eq!(
        broker
            .metric("ciphermq_storage_quarantined_bytes_total")
            .await,
        Some((starts[4] - starts[3]) as f64)
    );
    let (status, ready) = broker.admin_get("receiver_1", "/ready").await;
    assert_eq!(status, 200, "damage found at start does not stop serving");
    assert!(
        ready.contains("warnings") && ready.contains("damaged"),
        "{ready}"
    );
    let (_, status_doc) = broker.admin_get("admin", "/api/status").await;
    assert!(
        status_doc.contains("\"quarantined_records\":1"),
        "{status_doc}"
    );
    drop(r);
    assert!(broker.stop().success());

    // The damage was moved out: the next start finds none, serves the same.
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    assert_eq!(fetch_all(&mut r).await, expected);
    assert_eq!(
        broker
            .metric("ciphermq_storage_quarantined_records_total")
            .await,
        Some(0.0)
    );
}

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted on drop:
/// a real filesystem that really fills up.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mib: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount(8)");
        assert!(
            status.success(),
            "mounting a {mib} MiB tmpfs failed ({status}): these tests need root (CI runs as root)"
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Log files in the queue's directory.
fn log_files(data: &Path) -> usize {
    std::fs::read_dir(queue_dir(data, QUEUE))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Publishes new ids one by one until one is `ACK`ed, for up to `within`.
async fn publish_until_acked(s: &mut Connection, prefix: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut n = 0;
    loop {
        let id = format!("{prefix}-{n}");
        n += 1;
        let reply = publish_each(s, std::slice::from_ref(&id)).await.remove(0);
        if reply == format!("ACK {id}") {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "publishing did not resume within {within:?}: last reply {reply}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes new ids in pipelined batches of 100 until `wanted` were
/// refused; every refusal must be `NACK <id> <reason>`. Returns the ids
/// acknowledged, in order, and the first one refused.
async fn publish_until_refused(
    s: &mut Connection,
    reason: &str,
    wanted: usize,
) -> (Vec<String>, String) {
    let (mut acked, mut refused) = (Vec::new(), Vec::new());
    let mut n = 0;
    while refused.len() < wanted {
        let ids: Vec<String> = (n..n + 100).map(|i| format!("a{i}")).collect();
        n += 100;
        for (id, reply) in ids.iter().zip(publish_pipelined(s, &ids, 100).await) {
            if reply == format!("ACK {id}") {
                acked.push(id.clone());
            } else {
                assert_eq!(reply, format!("NACK {id} {reason}"));
                refused.push(id.clone());
            }
        }
        assert!(n < 100_000, "8 MiB never filled");
    }
    (acked, refused.swap_remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_publishes_early_and_is_left_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(8);
    let data = disk.path().join("data");
    let config = setup(dir.path(), &data, "min_free_mb = 2\nsegment_bytes = 262144");
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let mut s = broker.connect("sender_1").await;
    // Publish until refused; every refusal is disk_full (refused early),
    // never storage (failed).
    let (acked, _) = publish_until_refused(&mut s, "disk_full", 50).await;
    assert!(
        acked.len() > 1000,
        "{} stored before the disk ran low",
        acked.len()
    );
    let (status, ready) = broker.admin_get("receiver_1", "/ready").await;
    assert_eq!(status, 200, "consumers must still be served: {ready}");
    assert!(ready.contains("disk space low"), "{ready}");
    assert_eq!(broker.metric("ciphermq_disk_low").await, Some(1.0));
    assert!(broker.logged(&["disk space low"]));
    let files_when_full = log_files(&data);

    // Consumers drain; acked segments go; publishing resumes by itself.
    assert_eq!(drain_and_ack(&mut r).await, acked, "nothing lost, in order");
    let resumed = publish_until_acked(&mut s, "b", Duration::from_secs(20)).await;
    assert_eq!(broker.metric("ciphermq_disk_low").await, Some(0.0));
    assert!(
        log_files(&data) <= files_when_full,
        "no files made while refusing"
    );
    drop((r, s));
    assert!(broker.stop().success());

    // A restart serves exactly what is unacked: the message after resuming.
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    assert_eq!(fetch_all(&mut r).await, [resumed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_enospc_is_nacked_storage_with_no_file_loop_and_no_hole() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(8);
    let data = disk.path().join("data");
    // The watermark off: the disk really fills up under the broker.
    let config = setup(dir.path(), &data, "min_free_mb = 0\nsegment_bytes = 262144");
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let mut s = broker.connect("sender_1").await;
    let (acked, retried) = publish_until_refused(&mut s, "storage", 400).await;
    let files = log_files(&data);
    assert!(files < 50, "{files} files after 400 failed publishes");
    let (status, _) = broker.admin_get("receiver_1", "/ready").await;
    assert_eq!(status, 503, "failing writes are reported");

    // Draining frees space: acks are written, segments deleted, and
    // publishing works again without a restart.
    assert_eq!(
        drain_and_ack(&mut r).await,
        acked,
        "every ACKed id, in order"
    );
    let resumed = publish_until_acked(&mut s, "b", Duration::from_secs(20)).await;
    // The retry of a refused message is stored, not taken for a duplicate.
    let ok = publish_each(&mut s, &[retried.clone(), "c1".to_owned()]).await;
    assert_eq!(ok, [format!("ACK {retried}"), "ACK c1".to_owned()]);
    let (status, ready) = broker.admin_get("receiver_1", "/ready").await;
    assert_eq!(status, 200, "{ready}");
    drop((r, s));
    broker.kill();

    // No acknowledged record lies after a hole: all three come back after
    // a crash, and nothing refused does.
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    assert_eq!(
        fetch_all(&mut r).await,
        [resumed.as_str(), retried.as_str(), "c1"]
    );
    // Recovery found no damage: the failed writes were cut back.
    assert_eq!(
        broker
            .metric("ciphermq_storage_quarantined_records_total")
            .await,
        Some(0.0)
    );
}

/// Fills the filesystem at `dir` with one file, until it is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![7u8; 64 << 10];
    while file.write_all(&chunk).is_ok() {}
    while file.write_all(&chunk[..512]).is_ok() {}
    let _ = file.sync_all();
    path
}

/// `purge_queue` whose record cannot be written (a real ENOSPC): the
/// answer says the purge is not durable yet instead of `OK`; the record goes
/// out with the queue's next commit once there is room, and from then on a
/// crash does not bring the purged messages back (and does bring back the
/// deliveries that were owed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_that_cannot_be_written_says_so_and_is_written_later() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(8);
    let data = disk.path().join("data");
    let config = setup(dir.path(), &data, "min_free_mb = 0");
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let mut s = broker.connect("sender_1").await;
    let ids: Vec<String> = (0..1300).map(|i| format!("p{i}")).collect();
    for (id, reply) in ids.iter().zip(publish_pipelined(&mut s, &ids, 100).await) {
        assert_eq!(reply, format!("ACK {id}"));
    }
    // 1,000 deliveries owed at the purge make its record 8 KB (8 bytes
    // each): more than the slack a filled disk leaves in a log's last page.
    let owed = fetch_up_to(&mut r, 1000).await;
    assert_eq!(owed, ids[..1000]);
    let filler = fill(disk.path());
    r.queue_line(&format!("purge_queue {QUEUE}"));
    r.flush().await.unwrap();
    let reply = next(&mut r).await;
    assert!(
        reply.starts_with(&format!(
            "Error: purge_queue {QUEUE}: 300 messages purged, but writing that to the log failed (storage)"
        )),
        "{reply}"
    );
    assert!(fetch_all(&mut r).await.is_empty(), "purged all the same");

    // Room again: the next publish's commit carries the purge's records
    // (a queue's commits are made in order).
    std::fs::remove_file(filler).unwrap();
    let resumed = publish_until_acked(&mut s, "after", Duration::from_secs(20)).await;
    drop((r, s));
    broker.kill();
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    let mut expected = owed;
    expected.push(resumed);
    assert_eq!(
        fetch_all(&mut r).await,
        expected,
        "owed ones and the new one"
    );
}
