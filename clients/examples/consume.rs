//! Consumes, decrypts and hands each message to a handler; acknowledges what
//! the handler took, gives back what it refused.
//!
//! Against the demo broker (README: "Demo"), from the repository root:
//!
//! ```sh
//! cargo run --example consume -- 100   # stop after 100 messages
//! ```
//!
//! (`cargo run -p ciphermq-client-examples --example consume` names the
//! package; it builds the client library alone, no broker, no tools.)
//!
//! It connects as `receiver_1`, declares its route (exchange `ex`, queue
//! `receiver_1_queue` bound with key `receiver_1`), registers its public key
//! from `keys/receiver_1_private.key`, and consumes. A message that does not
//! open with our key is nacked: the broker redelivers it and, after
//! `max_deliveries`, moves it to `receiver_1_queue.dlq`. Stop `ciphermq-receiver`
//! first, or the two share the queue's messages.
//!
//! Environment: `CIPHERMQ_ADDR` (127.0.0.1:5700), `CIPHERMQ_CERTS` (certs),
//! `CIPHERMQ_KEYS` (keys), `CIPHERMQ_RECEIVER` (receiver_1).

use std::path::PathBuf;

use ciphermq_clients::{
    Client, ClientConfig, Delivery, ExchangeKind, ReceiverKey, TlsClientOptions,
};
use futures_util::StreamExt;

/// What the application does with a message. An error gives it back to the
/// broker, to be redelivered.
fn handle(delivery: &Delivery, plaintext: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(plaintext).map_err(|_| "not UTF-8".to_owned())?;
    println!(
        "{} (from {}, delivery {}): {text}",
        delivery.id(),
        delivery.sender_id().as_deref().unwrap_or("?"),
        delivery.delivery_count()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit: Option<u64> = std::env::args().nth(1).map(|n| n.parse()).transpose()?;
    let me = env_or("CIPHERMQ_RECEIVER", "receiver_1");
    let certs = repo_path("CIPHERMQ_CERTS", "certs");
    let keys = repo_path("CIPHERMQ_KEYS", "keys");
    let queue = format!("{me}_queue");

    let key = ReceiverKey::from_file(&me, &keys.join(format!("{me}_private.key")))?;
    let config = ClientConfig::new(
        env_or("CIPHERMQ_ADDR", "127.0.0.1:5700"),
        TlsClientOptions::for_cn(&certs, &me),
    );
    let client = Client::connect(config).await?;
    client.declare_exchange("ex", ExchangeKind::Direct).await?;
    client.declare_queue(&queue).await?;
    client.bind(&queue, "ex", &me).await?;
    // After the route exists, so a sender that finds the key never meets no_route.
    client.register_public_key(&key.public_key()).await?;
    let mut deliveries = client.consume(&queue, 100).await?;
    println!(
        "consuming {queue} as {}; Ctrl+C to stop",
        client.client_id()
    );

    let mut handled = 0u64;
    loop {
        let delivery = tokio::select! {
            d = deliveries.next() => match d {
                Some(d) => d?,
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
        };
        let outcome = delivery
            .decrypt(&key)
            .map_err(|e| e.to_string())
            .and_then(|plaintext| handle(&delivery, &plaintext));
        match outcome {
            Ok(()) => {
                delivery.ack().await?;
                handled += 1;
            }
            Err(why) => {
                eprintln!("{}: {why}; giving it back", delivery.id());
                delivery.nack().await?;
            }
        }
        if limit.is_some_and(|n| handled >= n) {
            break;
        }
    }
    println!("handled {handled} messages");
    // Deliveries not acknowledged are redelivered to the next consumer.
    client.close().await?;
    Ok(())
}

/// An environment variable, or a default.
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// An environment variable, or `default` at the repository root (this
/// package is `clients/examples`).
fn repo_path(name: &str, default: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(default)
        })
}
