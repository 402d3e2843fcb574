//! Request/reply over a reply queue, encrypted end to end both ways.
//!
//! Against the demo broker (README: "Demo"), from the repository root:
//!
//! ```sh
//! cargo run --example request_reply -- "hello" "how are you"
//! ```
//!
//! (`cargo run -p ciphermq-client-examples --example request_reply` names the
//! package; it builds the client library alone, no broker, no tools.)
//!
//! The broker's roles split publishing (sender CNs) from consuming (receiver
//! CNs), so each side holds two connections:
//!
//! - the requester publishes requests as `sender_1` to `receiver_1` and reads
//!   replies as `receiver_2` from its queue `receiver_2_replies`;
//! - the responder reads requests as `receiver_1` from `receiver_1_rpc` and
//!   publishes each reply as `sender_2` to the receiver the request names.
//!
//! `reply_to` and the correlation id travel inside the encrypted request, so the
//! broker can neither read nor redirect them; the responder learns who asked
//! from `sender_client_id`, which the broker verifies. The responder
//! acknowledges a request only once its reply is acknowledged, under an id made
//! from the request's, so a request redelivered after a crash is answered again
//! and the broker drops the duplicate reply.
//!
//! Environment: `CIPHERMQ_ADDR` (127.0.0.1:5700), `CIPHERMQ_CERTS` (certs),
//! `CIPHERMQ_KEYS` (keys).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ciphermq_clients::{Client, ClientConfig, ExchangeKind, ReceiverKey, TlsClientOptions};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The exchange of both directions (direct: the key picks the queue).
const EXCHANGE: &str = "ex";

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut questions: Vec<String> = std::env::args().skip(1).collect();
    if questions.is_empty() {
        questions = vec!["hello".into(), "request/reply over CipherMQ".into()];
    }
    let env = Env::from_env();

    // Both consumers first: their routes and keys must exist before anyone
    // publishes to them.
    let responder_in = env
        .receiver("receiver_1", "receiver_1_rpc", "receiver_1.rpc")
        .await?;
    let requester_in = env
        .receiver("receiver_2", "receiver_2_replies", "receiver_2.replies")
        .await?;
    let responder_out = env.connect("sender_2").await?;
    let requester_out = env.connect("sender_1").await?;

    tokio::spawn(async move {
        if let Err(e) = respond(responder_in, responder_out).await {
            eprintln!("responder stopped: {e}");
        }
    });
    let waiting: Waiting = Arc::new(Mutex::new(HashMap::new()));
    tokio::spawn(collect_replies(requester_in, waiting.clone()));

    let publisher = requester_out.publisher();
    for question in questions {
        let correlation_id = format!("{:016x}", rand::random::<u64>());
        let (tx, rx) = oneshot::channel();
        waiting.lock().unwrap().insert(correlation_id.clone(), tx);
        let request = json!({
            "correlation_id": correlation_id,
            "reply_to": "receiver_2",
            "reply_key": "receiver_2.replies",
            "body": question,
        });
        publisher
            .publish_to(
                "receiver_1",
                EXCHANGE,
                "receiver_1.rpc",
                request.to_string().as_bytes(),
            )
            .await?;
        let answer = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .map_err(|_| "no reply within 10 s (is another consumer on the queues?)")??;
        println!("{question:?} -> {answer:?}");
    }
    requester_out.close().await?;
    Ok(())
}

/// Replies awaited, by correlation id.
type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<String>>>>;

/// The responder: answers each request with its body in upper case.
async fn respond(input: Receiver, output: Client) -> Result<(), Error> {
    let publisher = output.publisher();
    let mut requests = input.client.consume(&input.queue, 16).await?;
    while let Some(delivery) = requests.next().await {
        let delivery = delivery?;
        let request: Value = match delivery
            .decrypt(&input.key)
            .ok()
            .and_then(|p| serde_json::from_slice(&p).ok())
        {
            Some(v) => v,
            None => {
                // Not a request of ours: acknowledged and dropped, never looped.
                eprintln!("responder: {} is not a request; dropped", delivery.id());
                delivery.ack().await?;
                continue;
            }
        };
        let field = |name: &str| request[name].as_str().unwrap_or_default().to_owned();
        let reply = json!({
            "correlation_id": field("correlation_id"),
            "body": field("body").to_uppercase(),
            "answered_for": delivery.sender_id(),
        });
        // The reply's id follows from the request's: answering a redelivered
        // request again is deduplicated by the broker.
        let reply_id = format!("{}-re", delivery.id());
        publisher
            .publish_to_with_id(
                &reply_id,
                &field("reply_to"),
                EXCHANGE,
                &field("reply_key"),
                reply.to_string().as_bytes(),
            )
            .await?;
        delivery.ack().await?;
    }
    Ok(())
}

/// The requester's reply reader: hands each reply to whoever waits for it.
async fn collect_replies(input: Receiver, waiting: Waiting) {
    let Ok(mut replies) = input.client.consume(&input.queue, 16).await else {
        return;
    };
    while let Some(Ok(delivery)) = replies.next().await {
        let reply: Option<Value> = delivery
            .decrypt(&input.key)
            .ok()
            .and_then(|p| serde_json::from_slice(&p).ok());
        if let Some(reply) = reply {
            let id = reply["correlation_id"].as_str().unwrap_or_default();
            if let Some(tx) = waiting.lock().unwrap().remove(id) {
                let _ = tx.send(reply["body"].as_str().unwrap_or_default().to_owned());
            }
        }
        // Late, unknown or unreadable replies are settled too.
        let _ = delivery.ack().await;
    }
}

/// A receiver's connection, its queue and its key.
struct Receiver {
    client: Client,
    queue: String,
    key: ReceiverKey,
}

/// Where the broker and the files are.
struct Env {
    addr: String,
    certs: PathBuf,
    keys: PathBuf,
}

impl Env {
    fn from_env() -> Env {
        let repo = |name: &str, default: &str| {
            std::env::var_os(name)
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    // This package is `clients/examples`.
                    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("../..")
                        .join(default)
                })
        };
        Env {
            addr: std::env::var("CIPHERMQ_ADDR").unwrap_or_else(|_| "127.0.0.1:5700".into()),
            certs: repo("CIPHERMQ_CERTS", "certs"),
            keys: repo("CIPHERMQ_KEYS", "keys"),
        }
    }

    async fn connect(&self, cn: &str) -> Result<Client, Error> {
        let tls = TlsClientOptions::for_cn(&self.certs, cn);
        Ok(Client::connect(ClientConfig::new(self.addr.clone(), tls)).await?)
    }

    /// Connects as receiver `cn`, declares `queue` bound to `key`, registers
    /// its public key.
    async fn receiver(&self, cn: &str, queue: &str, key: &str) -> Result<Receiver, Error> {
        let client = self.connect(cn).await?;
        client
            .declare_exchange(EXCHANGE, ExchangeKind::Direct)
            .await?;
        client.declare_queue(queue).await?;
        client.bind(queue, EXCHANGE, key).await?;
        let secret = ReceiverKey::from_file(cn, &self.keys.join(format!("{cn}_private.key")))?;
        client.register_public_key(&secret.public_key()).await?;
        Ok(Receiver {
            client,
            queue: queue.to_owned(),
            key: secret,
        })
    }
}
