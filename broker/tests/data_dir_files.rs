//! What the broker makes in its data directory is its user's alone, and
//! what it finds there is never followed elsewhere (docs/PROTOCOL.md,
//! "Storage layout"), on the real binary:
//! - every file it creates is 0600 and every directory 0700, whatever the
//!   umask it runs under (run here under umask 000): logs, dedup and
//!   quarantine files, `topology.json`, keys, the lock;
//! - a symbolic link under a log file's name (a segment or a dedup file)
//!   stops the start naming it, and the file it points to is neither read
//!   nor changed.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use ciphermq_clients::connection::Connection;
use ciphermq_proto::Reply;
use ciphermq_shard::log::segment::{self, Step};
use ciphermq_shard::log::{queue_dir, segment_path};
use common::process::BrokerProcess;
use common::{body, check, config_text, next, pki, setup_receiver};

const QUEUE: &str = "receiver_1_queue";

/// A durable broker's config over `data` (4 KiB segments, so a few
/// messages make several), console logs on; returns its path.
fn setup(dir: &Path, data: &Path) -> PathBuf {
    let config = dir.join("broker.toml");
    let text = config_text(&pki().certs, data, 1, "")
        .replace(
            r#"mode = "memory""#,
            "mode = \"durable\"\nsegment_bytes = 4096",
        )
        .replace("console = false", "console = true\nlevel = \"warn\"");
    std::fs::write(&config, text).unwrap();
    config
}

/// The broker binary on `config`, its umask 000: every permission a file
/// or directory gets is the one the broker asked for.
fn start_with_open_umask(config: &Path) -> BrokerProcess {
    BrokerProcess::spawn_with(config, |command| {
        // SAFETY: umask(2) is async-signal-safe and touches nothing but the
        // child's file mode creation mask, between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
    })
    .unwrap_or_else(|r| panic!("the broker did not start: {r:?}"))
}

/// Fetches and acks everything in the queue; returns how many.
async fn drain_and_ack(r: &mut Connection) -> usize {
    let mut total = 0;
    loop {
        r.queue_line(&format!("fetch {QUEUE} 500"));
        r.flush().await.unwrap();
        let mut batch = Vec::new();
        loop {
            match Reply::parse(&next(r).await) {
                Reply::Message(d) => batch.push(d.message_id.to_owned()),
                Reply::Ok(_) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        if batch.is_empty() {
            return total;
        }
        for id in &batch {
            r.queue_line(&format!("ack {id} {QUEUE}"));
        }
        r.flush().await.unwrap();
        for id in &batch {
            assert_eq!(next(r).await, format!("ACK_CONFIRMED {id}"));
        }
        total += batch.len();
    }
}

/// Every entry under `dir` (not `dir` itself), links not followed.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(entries(&path));
        }
        out.push(path);
    }
    out
}

/// The file names in `dir` that end with `suffix`.
fn named(dir: &Path, suffix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_umask_000_every_file_and_directory_is_the_brokers_users_alone() {
    let dir = tempfile::tempdir().unwrap();
    // Made by the broker, like everything in it.
    let data = dir.path().join("data");
    let config = setup(dir.path(), &data);
    let queue = queue_dir(&data, QUEUE);
    {
        let broker = start_with_open_umask(&config);
        let mut r = broker.connect("receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        check(
            &mut r,
            &format!("register_public_key {key}"),
            "Public key registered",
        )
        .await;
        let mut s = broker.connect("sender_1").await;
        for i in 0..40 {
            let id = format!("m{i}");
            check(
                &mut s,
                &format!("publish ex receiver_1 {}", body(&id, "receiver_1")),
                &format!("ACK {id}"),
            )
            .await;
        }
        assert_eq!(drain_and_ack(&mut r).await, 40);
        // A few more, unacked: the fully acked segments before them go,
        // their ids carried to a dedup file.
        for id in ["last0", "last1", "last2"] {
            check(
                &mut s,
                &format!("publish ex receiver_1 {}", body(id, "receiver_1")),
                &format!("ACK {id}"),
            )
            .await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while named(&queue, ".log")
            .iter()
            .all(|n| !n.starts_with("dedup-"))
        {
            assert!(Instant::now() < deadline, "no dedup file made");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(broker.stop().success());
    }
    // Damage a record followed by another, so the next start quarantines it.
    let (file, bytes, first) = named(&queue, ".log")
        .into_iter()
        .filter(|n| n.starts_with("segment-"))
        .find_map(|name| {
            let path = queue.join(name);
            let bytes = std::fs::read(&path).unwrap();
            let layout = segment::layout(&bytes);
            let Step::Record(_, n) = segment::step(&bytes, layout.start, layout.framing, true)
            else {
                return None;
            };
            let next = segment::step(&bytes, layout.start + n, layout.framing, true);
            matches!(next, Step::Record(..)).then_some((path, bytes, layout.start))
        })
        .expect("a segment of two records or more");
    let mut damaged = bytes;
    damaged[first + 5] ^= 0x20;
    std::fs::write(&file, &damaged).unwrap();

    let broker = start_with_open_umask(&config);
    let mut r = broker.connect("receiver_1").await;
    check(&mut r, "heartbeat", "OK heartbeat").await;
    assert_eq!(
        named(&queue, ".quarantined").len(),
        1,
        "the damage was quarantined"
    );

    let found = entries(&data);
    let mut loose = Vec::new();
    for path in std::iter::once(data.clone()).chain(found.iter().cloned()) {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            loose.push(format!("{:o} {}", mode, path.display()));
        }
    }
    assert!(loose.is_empty(), "readable by others: {loose:#?}");
    // The files this was about are among those looked at.
    let names: Vec<String> = found
        .iter()
        .map(|p| p.strip_prefix(&data).unwrap().display().to_string())
        .collect();
    for expected in [
        "lock",
        "topology.json",
        "topology.json.prev",
        "dedup.key",
        "aes.key",
        "keys",
        "keys/receiver_1.key",
        "keys/aes_key.check",
        "queues",
        "queues/receiver_1_queue",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not in {names:#?}"
        );
    }
    for (prefix, suffix) in [
        ("segment-", ".log"),
        ("dedup-", ".log"),
        ("segment-", ".quarantined"),
    ] {
        assert!(
            named(&queue, suffix).iter().any(|n| n.starts_with(prefix)),
            "no {prefix}…{suffix} in {names:#?}"
        );
    }
    drop(r);
    assert!(broker.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_named_like_a_log_file_is_refused_and_its_target_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = setup(dir.path(), &data);
    let queue = queue_dir(&data, QUEUE);
    {
        let broker = BrokerProcess::start(&config);
        let mut r = broker.connect("receiver_1").await;
        setup_receiver(&mut r, "receiver_1").await;
        let mut s = broker.connect("sender_1").await;
        check(
            &mut s,
            &format!("publish ex receiver_1 {}", body("kept", "receiver_1")),
            "ACK kept",
        )
        .await;
        assert!(broker.stop().success());
    }
    // A file of the broker's user outside the data directory: not a log,
    // so a recovery that followed the link would cut or pad it.
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let target = outside.join("precious.txt");
    let precious = b"an operator's notes, nothing like a log\n".repeat(40);
    std::fs::write(&target, &precious).unwrap();
    let before = std::fs::metadata(&target).unwrap();

    for name in [
        segment_path(&queue, 1_000)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        "dedup-00000000000000000001.log".to_owned(),
    ] {
        let link = queue.join(&name);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let refused = match BrokerProcess::spawn(&config) {
            Ok(_) => panic!("{name}: the broker started over a symlinked log file"),
            Err(refused) => refused,
        };
        assert!(!refused.status.success());
        let said = format!("{}\n{}", refused.stdout, refused.stderr);
        assert!(
            said.contains(&link.display().to_string())
                && said.contains("a symbolic link")
                && said.contains(&target.display().to_string()),
            "{name}: {said}"
        );
        // Neither read into the log nor written: its bytes and its times
        // are what they were, and nothing was made beside either.
        assert_eq!(std::fs::read(&target).unwrap(), precious, "{name}");
        let after = std::fs::metadata(&target).unwrap();
        assert_eq!(after.mtime_nsec(), before.mtime_nsec(), "{name}");
        assert_eq!(after.len(), before.len(), "{name}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "{name}");
        assert!(named(&queue, ".quarantined").is_empty(), "{name}");
        std::fs::remove_file(&link).unwrap();
    }

    // The link gone, the queue is served as it was.
    let broker = BrokerProcess::start(&config);
    let mut r = broker.connect("receiver_1").await;
    r.queue_line(&format!("fetch {QUEUE} 10"));
    r.flush().await.unwrap();
    let line = next(&mut r).await;
    assert!(
        matches!(Reply::parse(&line), Reply::Message(d) if d.message_id == "kept"),
        "{line}"
    );
    drop(r);
    assert!(broker.stop().success());
}
