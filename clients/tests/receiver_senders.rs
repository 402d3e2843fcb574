//! The reference receiver tells senders apart: it deduplicates by
//! (`sender_client_id`, `message_id`), so a sender that publishes junk under
//! another sender's id first cannot get the real message dropped as a
//! duplicate, while redeliveries of either are still recognised, across a
//! restart too.
//!
//! The receiver runs as a library call against a scripted broker over mutual
//! TLS that answers the setup, pushes the given deliveries after `OK consume`
//! and confirms acks the way the broker does (`ack <id> <q>` settles every
//! outstanding delivery of that id).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ciphermq_clients::crypto::{self, generate_secret_key, PublicKey};
use ciphermq_clients::key_file;
use ciphermq_clients::receiver::{run_receiver, ReceiverLimits, ReceiverStats, StopReason};
use ciphermq_clients::receiver_config::ReceiverConfig;
use ciphermq_clients::TlsConfig;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use ciphermq_testkit::pki::generate as make_pki;
use common::server_config;

const QUEUE: &str = "receiver_1_queue";

/// Every line the scripted broker read, in order, across connections.
type Seen = Arc<Mutex<Vec<String>>>;

/// A broker that serves one receiver: the setup replies, then `deliveries`
/// (`Message: …` lines) after `OK consume`, then acks as the broker answers
/// them. Each connection pushes the deliveries again, counted as redeliveries.
async fn scripted_broker(certs: &Path, deliveries: Vec<(String, String)>) -> (SocketAddr, Seen) {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(certs)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        let mut round = 0u32;
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            round += 1;
            let Ok(tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let mut stream = BufReader::new(tls);
            let _ = stream
                .write_all(b"HELLO ciphermq/1 receiver_1 receiver\n")
                .await;
            let _ = stream.flush().await;
            // Outstanding deliveries by id (one per copy).
            let mut outstanding: Vec<String> = Vec::new();
            let mut line = String::new();
            loop {
                line.clear();
                match stream.read_line(&mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let request = line.trim_end().to_owned();
                log.lock().unwrap().push(request.clone());
                let words: Vec<&str> = request.split(' ').collect();
                let reply = match words.as_slice() {
                    ["declare_exchange", e, ..] => format!("OK declare_exchange {e}\n"),
                    ["declare_queue", q] => format!("OK declare_queue {q}\n"),
                    ["bind", q, e, k] => format!("OK bind {q} {e} {k}\n"),
                    ["register_public_key", _] => "Public key registered\n".to_owned(),
                    ["consume", q, _] => {
                        let mut out = format!("OK consume {q}\n");
                        for (id, body) in &deliveries {
                            out.push_str(&format!("Message: {id} {QUEUE} {round} {body}\n"));
                            outstanding.push(id.clone());
                        }
                        out
                    }
                    ["ack", id, _] | ["nack", id, _] => {
                        let before = outstanding.len();
                        outstanding.retain(|o| o != id);
                        if outstanding.len() == before {
                            format!("Error: no outstanding delivery {id}\n")
                        } else if words[0] == "ack" {
                            format!("ACK_CONFIRMED {id}\n")
                        } else {
                            format!("NACK_CONFIRMED {id}\n")
                        }
                    }
                    ["ack_batch", q, ids @ ..] => {
                        // Like the broker: every outstanding copy of each id.
                        let before = outstanding.len();
                        outstanding.retain(|o| !ids.contains(&o.as_str()));
                        format!("OK ack_batch {q} {}\n", before - outstanding.len())
                    }
                    ["heartbeat"] => "OK heartbeat\n".to_owned(),
                    ["quit"] => {
                        let _ = stream.write_all(b"OK bye\n").await;
                        let _ = stream.shutdown().await;
                        break;
                    }
                    _ => format!("Error: unknown command {}\n", words[0]),
                };
                if stream.write_all(reply.as_bytes()).await.is_err()
                    || stream.flush().await.is_err()
                {
                    break;
                }
            }
        }
    });
    (addr, seen)
}

/// A delivery body for `receiver_1` from `sender` (none when `None`).
fn body(key: &PublicKey, id: &str, sender: Option<&str>, text: &str) -> String {
    let mut msg = crypto::encrypt(key, id, "receiver_1", text.as_bytes()).unwrap();
    msg.sender_client_id = sender.map(str::to_owned);
    serde_json::to_string(&msg).unwrap()
}

/// The output file's records as (sender, id, content).
fn records(path: &Path) -> Vec<(Option<String>, String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                v["sender_client_id"].as_str().map(str::to_owned),
                v["message_id"].as_str().unwrap().to_owned(),
                v["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_senders_messages_with_one_id_are_both_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), &["receiver_1"]);
    let keys = dir.path().join("x25519");
    let secret = generate_secret_key();
    key_file::write_secret_key(&key_file::private_key_path(&keys, "receiver_1"), &secret).unwrap();
    let public = secret.public_key();

    // sender_2 got its junk in first, under sender_1's (predictable) id.
    let id = "sender_1-run.1-receiver_1";
    let deliveries = vec![
        (
            id.to_owned(),
            body(&public, id, Some("sender_2"), "junk from sender_2"),
        ),
        (
            id.to_owned(),
            body(&public, id, Some("sender_1"), "the real message"),
        ),
        (
            "legacy-1".to_owned(),
            body(&public, "legacy-1", None, "from a sender that names none"),
        ),
    ];
    let (addr, seen) = scripted_broker(&pki.out_dir, deliveries).await;

    let mut config = ReceiverConfig::new(
        addr.to_string(),
        TlsConfig::for_cn(&pki.out_dir, "receiver_1"),
    );
    config.private_key_path = keys.join("{cn}_private.key");
    config.output_dir = dir.path().join("data");
    config.reconnect_backoff_ms = 50;
    let run = |limits| {
        let config = config.clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(60),
                run_receiver(
                    &config,
                    limits,
                    Arc::new(ReceiverStats::default()),
                    std::future::pending(),
                ),
            )
            .await
            .expect("the receiver finished in time")
            .expect("the receiver succeeded")
        }
    };

    let report = run(ReceiverLimits {
        until_total: Some(3),
        ..Default::default()
    })
    .await;
    assert_eq!(report.stop, StopReason::Total, "{report}");
    assert_eq!(
        (report.written, report.duplicates, report.rejected),
        (3, 0, 0),
        "{report}"
    );
    let mut got = records(&report.output);
    got.sort();
    assert_eq!(
        got,
        [
            (
                None,
                "legacy-1".into(),
                "from a sender that names none".into()
            ),
            (
                Some("sender_1".into()),
                id.into(),
                "the real message".into()
            ),
            (
                Some("sender_2".into()),
                id.into(),
                "junk from sender_2".into()
            ),
        ]
    );
    let prefix = format!("ack_batch {QUEUE} ");
    let acked: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix))
        .flat_map(|ids| ids.split(' ').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert!(
        acked.iter().any(|a| a == id) && acked.iter().any(|a| a == "legacy-1"),
        "{acked:?}"
    );

    // Restarted, the receiver gets all three again: each is recognised by its
    // sender and id, acknowledged, and not written twice.
    let report = run(ReceiverLimits {
        idle_exit: Some(Duration::from_millis(700)),
        ..Default::default()
    })
    .await;
    assert_eq!(report.stop, StopReason::Idle, "{report}");
    assert_eq!((report.written, report.duplicates), (0, 3), "{report}");
    assert_eq!(report.total_records, 3);
    assert_eq!(records(&report.output).len(), 3);
}
