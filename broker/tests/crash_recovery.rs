//! The broker process is killed with SIGKILL at random moments under
//! pipelined load, at least 10 times, and restarted on the same data
//! directory; publishers retry what was never acknowledged. Finally a consumer
//! drains the queue: every id that was ever `ACK`ed must be delivered.
//! Duplicates are allowed (counted and printed), losses are not.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_proto::Reply;
use common::{body, config_text, next, pki, setup_receiver};

const CRASHES: usize = 10;
const WINDOW: usize = 200;

struct Broker {
    child: Child,
    addr: String,
}

fn spawn(config: &std::path::Path) -> Broker {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ciphermq-broker"))
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the broker binary");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("broker prints its address");
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    Broker { child, addr }
}

async fn connect(addr: &str, cn: &str) -> Option<Connection> {
    let opts = TlsClientOptions::for_cn(&pki().certs, cn);
    Connection::connect(addr, &opts).await.ok()
}

/// Publishes `ids` pipelined (window `WINDOW`) until done or the broker dies;
/// returns the ids acknowledged.
async fn publish(addr: String, cn: &'static str, ids: Vec<String>) -> Vec<String> {
    let Some(conn) = connect(&addr, cn).await else {
        return Vec::new();
    };
    let (mut rd, mut wr) = conn.into_split();
    let mut acked = Vec::new();
    let mut sent = 0usize;
    let mut answered = 0usize;
    while answered < ids.len() {
        while sent < ids.len() && sent - answered < WINDOW {
            wr.queue_line(&format!(
                "publish ex receiver_1 {}",
                body(&ids[sent], "receiver_1")
            ));
            sent += 1;
        }
        if wr.flush().await.is_err() {
            break;
        }
        match rd.read_line().await {
            Ok(Some(line)) => {
                if let Reply::Ack(id) = Reply::parse(&line) {
                    assert_eq!(id, ids[answered], "replies in command order");
                    acked.push(id.to_owned());
                }
                answered += 1;
            }
            _ => break,
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_repeated_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, "")
        .replace(r#"mode = "memory""#, r#"mode = "durable""#)
        .replace("[storage]", "[storage]\nsegment_bytes = 65536");
    std::fs::write(&config, text).unwrap();

    let mut broker = spawn(&config);
    let mut r = connect(&broker.addr, "receiver_1").await.expect("receiver");
    setup_receiver(&mut r, "receiver_1").await;
    drop(r);

    let mut acked: BTreeSet<String> = BTreeSet::new();
    let mut unacked: HashMap<&'static str, Vec<String>> = HashMap::new();
    let mut next_id = 0u64;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..CRASHES {
        let mut tasks = Vec::new();
        for cn in ["sender_1", "sender_2"] {
            // Retry what was never acknowledged, then new ids.
            let mut ids = unacked.remove(cn).unwrap_or_default();
            for _ in 0..3000 {
                ids.push(format!("{cn}-{next_id}"));
                next_id += 1;
            }
            let addr = broker.addr.clone();
            let all = ids.clone();
            tasks.push((cn, all, tokio::spawn(publish(addr, cn, ids))));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(20 + seed % 200)).await;
        broker.child.kill().expect("SIGKILL the broker");
        broker.child.wait().expect("reap");
        for (cn, all, task) in tasks {
            let got = task.await.expect("publisher task");
            let done: BTreeSet<&String> = got.iter().collect();
            unacked.insert(
                cn,
                all.into_iter().filter(|id| !done.contains(id)).collect(),
            );
            acked.extend(got);
        }
        eprintln!("crash {round}: {} acked so far", acked.len());
        broker = spawn(&config);
    }

    // Drain everything.
    let mut r = connect(&broker.addr, "receiver_1")
        .await
        .expect("receiver after the crashes");
    let mut delivered: HashMap<String, u32> = HashMap::new();
    loop {
        r.queue_line("fetch receiver_1_queue 5000");
        r.flush().await.unwrap();
        let mut batch = Vec::new();
        loop {
            let line = next(&mut r).await;
            match Reply::parse(&line) {
                Reply::Message(d) => batch.push(d.message_id.to_owned()),
                Reply::Ok(_) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        if batch.is_empty() {
            break;
        }
        for id in &batch {
            r.queue_line(&format!("ack {id} receiver_1_queue"));
            *delivered.entry(id.clone()).or_default() += 1;
        }
        r.flush().await.unwrap();
        for _ in &batch {
            assert!(next(&mut r).await.starts_with("ACK_CONFIRMED "));
        }
    }
    let _ = broker.child.kill();
    let _ = broker.child.wait();

    let lost: Vec<&String> = acked
        .iter()
        .filter(|id| !delivered.contains_key(*id))
        .collect();
    let duplicates: u32 = delivered.values().map(|n| n - 1).sum();
    println!(
        "crash test: {CRASHES} SIGKILLs, acked {}, delivered {} distinct, lost {}, duplicates {}",
        acked.len(),
        delivered.len(),
        lost.len(),
        duplicates
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
