//! Publishes end-to-end encrypted messages to receivers that live on
//! different nodes of a cluster, knowing only seed addresses: the cluster
//! client sends each message to the node holding its receiver, following
//! the brokers' redirects (at most 3 per message, same message id, so a
//! redirect never stores a message twice).
//!
//! Against the cluster demo (README: "Run a cluster"), from the repository
//! root:
//!
//! ```sh
//! CIPHERMQ_SEEDS=127.0.0.1:5711 cargo run --example cluster_publish -- 10
//! ```
//!
//! Environment: `CIPHERMQ_SEEDS` (comma-separated; 127.0.0.1:5700),
//! `CIPHERMQ_CERTS` (certs), `CIPHERMQ_KEYS` (keys), `CIPHERMQ_SENDER`
//! (sender_1), `CIPHERMQ_RECEIVERS` (comma-separated; receiver_1,receiver_2),
//! `CIPHERMQ_INTERVAL_MS` (a pause after each round of messages; 0), so
//! that traffic still flows while an operator moves a receiver.
//! Each receiver must have registered its key on its node once.

use std::path::PathBuf;

use ciphermq_clients::client::cluster::ClusterClient;
use ciphermq_clients::{ClientConfig, PublishError, TlsClientOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 10,
    };
    let list = |name: &str, default: &str| -> Vec<String> {
        std::env::var(name)
            .unwrap_or_else(|_| default.to_owned())
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let seeds = list("CIPHERMQ_SEEDS", "127.0.0.1:5700");
    let receivers = list("CIPHERMQ_RECEIVERS", "receiver_1,receiver_2");
    let sender = std::env::var("CIPHERMQ_SENDER").unwrap_or_else(|_| "sender_1".to_owned());
    let certs = repo_path("CIPHERMQ_CERTS", "certs");
    let keys = repo_path("CIPHERMQ_KEYS", "keys");
    let interval = std::time::Duration::from_millis(match std::env::var("CIPHERMQ_INTERVAL_MS") {
        Ok(ms) => ms.parse()?,
        Err(_) => 0,
    });

    let config = ClientConfig::new(&seeds[0], TlsClientOptions::for_cn(&certs, &sender))
        .known_receivers_file(keys.join("known_receivers"))?;
    let cluster = ClusterClient::connect(config, seeds).await?;
    for n in 0..count {
        for receiver in &receivers {
            let text = format!("message {n} for {receiver}");
            let mut waited = 0;
            let ack = loop {
                match cluster
                    .publish_to(receiver, "ex", receiver, text.as_bytes())
                    .await
                {
                    // A key registered on another node reaches this one
                    // within a second.
                    Err(PublishError::NoPublicKey { .. }) if waited < 100 => {
                        waited += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                    other => break other?,
                }
            };
            println!("{receiver}: {} stored", ack.message_id);
        }
        if !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
    }
    // What the redirects taught the client.
    for receiver in &receivers {
        if let Some(home) = cluster.cached_home(receiver) {
            println!(
                "{receiver} lives on {} at {} (epoch {})",
                home.node_id, home.address, home.epoch
            );
        }
    }
    println!("{} redirects followed", cluster.redirects());
    Ok(())
}

/// A path from the environment, else `default` under the repository root
/// (two levels above this package), so it runs from anywhere.
fn repo_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(default)
    })
}
