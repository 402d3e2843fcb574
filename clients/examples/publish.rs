//! Publishes end-to-end encrypted messages to a receiver, pipelined.
//!
//! Against the demo broker (README: "Demo"), from the repository root:
//!
//! ```sh
//! cargo run --example publish -- 100   # or: cargo run -p ciphermq-client-examples --example publish -- 100
//! ```
//!
//! It builds the client library alone (`default-features = false`: no
//! broker, no tools), in the `ciphermq-client-examples` package beside it.
//!
//! It connects as `sender_1`, fetches `receiver_1`'s public key (pinned on first
//! use in `keys/known_receivers`), and publishes the messages concurrently:
//! the client pipelines them, at most its window at a time, and each future ends
//! with the broker's `ACK` (the message is on disk there). Run the `consume`
//! example (or `ciphermq-receiver`) to read them; the receiver must have
//! registered its key once before.
//!
//! Environment: `CIPHERMQ_ADDR` (127.0.0.1:5700), `CIPHERMQ_CERTS` (certs),
//! `CIPHERMQ_KEYS` (keys), `CIPHERMQ_SENDER` (sender_1), `CIPHERMQ_RECEIVER`
//! (receiver_1).

use std::path::PathBuf;
use std::time::Instant;

use ciphermq_clients::{Client, ClientConfig, PublishError, TlsClientOptions};
use futures_util::stream::{FuturesUnordered, StreamExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 10,
    };
    let sender = env_or("CIPHERMQ_SENDER", "sender_1");
    let receiver = env_or("CIPHERMQ_RECEIVER", "receiver_1");
    let certs = repo_path("CIPHERMQ_CERTS", "certs");
    let keys = repo_path("CIPHERMQ_KEYS", "keys");

    let config = ClientConfig::new(
        env_or("CIPHERMQ_ADDR", "127.0.0.1:5700"),
        TlsClientOptions::for_cn(&certs, &sender),
    )
    .publish_window(256)
    .known_receivers_file(keys.join("known_receivers"))?;
    let client = Client::connect(config).await?;
    println!("connected as {} ({})", client.client_id(), client.role());

    let publisher = client.publisher();
    let started = Instant::now();
    let mut pending: FuturesUnordered<_> = (1..=count)
        .map(|i| {
            let publisher = publisher.clone();
            let receiver = receiver.clone();
            async move {
                let text = format!("hello #{i} from the publish example");
                // Exchange `ex`, routing key = the receiver's id: the route the
                // reference receiver (and the consume example) declares.
                publisher
                    .publish_to(&receiver, "ex", &receiver, text.as_bytes())
                    .await
            }
        })
        .collect();
    let mut acked = 0;
    while let Some(result) = pending.next().await {
        match result {
            Ok(_ack) => acked += 1,
            Err(e @ PublishError::KeyChanged { .. }) => {
                // Never encrypt for a key we cannot vouch for.
                eprintln!("{e}");
                eprintln!("(after checking with the receiver: client.accept_key_rotation)");
                return Err(e.into());
            }
            Err(e) => eprintln!("failed: {e}"),
        }
    }
    println!(
        "{acked} of {count} acknowledged in {:.2} s ({} retries)",
        started.elapsed().as_secs_f64(),
        publisher.retries()
    );
    client.close().await?;
    Ok(())
}

/// An environment variable, or a default.
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// An environment variable, or `default` at the repository root (where
/// `ciphermq-pki` writes `certs/` and `keys/`; this package is
/// `clients/examples`).
fn repo_path(name: &str, default: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(default)
        })
}
