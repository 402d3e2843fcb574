//! `ciphermq-bench`: drives a running broker with N publishers and M consumers
//! over real mutual TLS and reports throughput and latency.
//!
//! Each publisher keeps at most `--window` publishes unacknowledged; replies
//! come in command order, so the oldest send time matches each `ACK`.
//! Consumers ack every delivery and read the send time carried in an extra
//! JSON field (the broker relays extra fields unchanged) for end-to-end latency.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_proto::Reply;
use clap::Parser;
use hdrhistogram::Histogram;
use tokio::sync::{mpsc, Semaphore};

/// Load generator for CipherMQ.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    /// Broker address.
    #[arg(long, default_value = "127.0.0.1:5700")]
    addr: String,
    /// Directory with ca.crt and the client certificates.
    #[arg(long, default_value = "certs")]
    certs: PathBuf,
    /// Publisher connections.
    #[arg(long, default_value_t = 1)]
    publishers: usize,
    /// Consumer connections.
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Sender CNs, used round robin by the publishers.
    #[arg(long, value_delimiter = ',', default_value = "sender_1,sender_2")]
    senders: Vec<String>,
    /// Receiver CN owning the bench queue.
    #[arg(long, default_value = "receiver_1")]
    receiver: String,
    /// Approximate size of each JSON body, in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Unacknowledged publishes per publisher.
    #[arg(long, default_value_t = 1000)]
    window: usize,
    /// Consumer prefetch.
    #[arg(long, default_value_t = 1000)]
    prefetch: u32,
    /// Total messages to publish.
    #[arg(long, default_value_t = 200_000)]
    count: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 µs .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn body(id: &str, receiver: &str, filler: &str, sent_us: u64) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"c2Vzc2lvbi1rZXk=","nonce":"bm9uY2Utbm9uY2U=","ciphertext":"{filler}","sent_us":{sent_us}}}"#
    )
}

fn sent_us(body: &str) -> Option<u64> {
    let start = body.rfind("\"sent_us\":")? + "\"sent_us\":".len();
    let digits: String = body[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

async fn connect(args: &Args, cn: &str) -> Result<Connection> {
    let opts = TlsClientOptions::for_cn(&args.certs, cn);
    Connection::connect(&args.addr, &opts)
        .await
        .with_context(|| format!("connecting to {} as {cn}", args.addr))
}

async fn expect_ok(conn: &mut Connection, line: &str) -> Result<()> {
    let reply = conn.request(line).await?;
    if !reply.starts_with("OK ") {
        bail!("{line}: {reply}");
    }
    Ok(())
}

struct PublisherReport {
    acked: u64,
    nacked: u64,
    latency: Histogram<u64>,
}

async fn publisher(
    args: Args,
    index: usize,
    count: u64,
    start: Instant,
) -> Result<PublisherReport> {
    let cn = args.senders[index % args.senders.len()].clone();
    let conn = connect(&args, &cn).await?;
    let (mut rd, mut wr) = conn.into_split();
    let window = Arc::new(Semaphore::new(args.window));
    let (times_tx, mut times_rx) = mpsc::unbounded_channel::<Instant>();
    let filler = "A".repeat(args.size.saturating_sub(190).max(1));
    let key = args.receiver.clone();
    let receiver = args.receiver.clone();
    let writer_window = window.clone();
    let writer = tokio::spawn(async move {
        let mut sent = 0u64;
        while sent < count {
            let permit = writer_window.acquire().await.context("window closed")?;
            permit.forget();
            let mut batch = 1 + writer_window.available_permits() as u64;
            batch = batch.min(count - sent);
            if batch > 1 {
                let extra = writer_window
                    .acquire_many((batch - 1) as u32)
                    .await
                    .context("window closed")?;
                extra.forget();
            }
            for _ in 0..batch {
                let now = Instant::now();
                let id = format!("b{index}-{sent}");
                let us = now.duration_since(start).as_micros() as u64;
                wr.queue_line(&format!(
                    "publish bench {key} {}",
                    body(&id, &receiver, &filler, us)
                ));
                let _ = times_tx.send(now);
                sent += 1;
            }
            wr.flush().await?;
        }
        anyhow::Ok(wr)
    });
    let mut report = PublisherReport {
        acked: 0,
        nacked: 0,
        latency: histogram(),
    };
    for _ in 0..count {
        let line = rd.read_line().await?.context("broker closed a publisher")?;
        let sent = times_rx.recv().await.context("send times ended early")?;
        let _ = report
            .latency
            .record(sent.elapsed().as_micros().max(1) as u64);
        match Reply::parse(&line) {
            Reply::Ack(_) => report.acked += 1,
            Reply::Nack { .. } => report.nacked += 1,
            other => bail!("unexpected reply to publish: {other:?}"),
        }
        window.add_permits(1);
    }
    writer.await??;
    Ok(report)
}

async fn consumer(
    args: Args,
    queue: String,
    received: Arc<AtomicU64>,
    total: u64,
    start: Instant,
) -> Result<Histogram<u64>> {
    let mut conn = connect(&args, &args.receiver).await?;
    expect_ok(&mut conn, &format!("consume {queue} {}", args.prefetch)).await?;
    let (mut rd, mut wr) = conn.into_split();
    let (ack_tx, mut ack_rx) = mpsc::unbounded_channel::<String>();
    let acker = tokio::spawn(async move {
        while let Some(first) = ack_rx.recv().await {
            wr.queue_line(&first);
            while let Ok(more) = ack_rx.try_recv() {
                wr.queue_line(&more);
            }
            wr.flush().await?;
        }
        anyhow::Ok(())
    });
    let mut latency = histogram();
    while received.load(Ordering::Relaxed) < total {
        let line = match tokio::time::timeout(Duration::from_millis(200), rd.read_line()).await {
            Ok(line) => line?.context("broker closed a consumer")?,
            Err(_) => continue,
        };
        match Reply::parse(&line) {
            Reply::Message(d) => {
                if let Some(us) = sent_us(d.body) {
                    let now = start.elapsed().as_micros() as u64;
                    let _ = latency.record(now.saturating_sub(us).max(1));
                }
                let _ = ack_tx.send(format!("ack {} {}", d.message_id, d.queue));
                received.fetch_add(1, Ordering::Relaxed);
            }
            Reply::AckConfirmed(_) => {}
            other => bail!("unexpected line for a consumer: {other:?}"),
        }
    }
    drop(ack_tx);
    acker.await??;
    Ok(latency)
}

fn quantiles(h: &Histogram<u64>) -> serde_json::Value {
    let ms = |us: u64| us as f64 / 1000.0;
    serde_json::json!({
        "p50_ms": ms(h.value_at_quantile(0.50)),
        "p90_ms": ms(h.value_at_quantile(0.90)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "p999_ms": ms(h.value_at_quantile(0.999)),
        "max_ms": ms(h.max()),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.senders.is_empty() || args.publishers == 0 {
        bail!("--publishers and --senders must not be empty");
    }
    let queue = format!("{}_bench", args.receiver);
    let mut setup = connect(&args, &args.receiver).await?;
    expect_ok(&mut setup, "declare_exchange bench direct").await?;
    expect_ok(&mut setup, &format!("declare_queue {queue}")).await?;
    expect_ok(&mut setup, &format!("bind {queue} bench {}", args.receiver)).await?;

    let start = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let consumers: Vec<_> = (0..args.consumers)
        .map(|_| {
            tokio::spawn(consumer(
                args.clone(),
                queue.clone(),
                received.clone(),
                args.count,
                start,
            ))
        })
        .collect();
    let per = args.count / args.publishers as u64;
    let publishers: Vec<_> = (0..args.publishers)
        .map(|i| {
            let n = if i == 0 {
                args.count - per * (args.publishers as u64 - 1)
            } else {
                per
            };
            tokio::spawn(publisher(args.clone(), i, n, start))
        })
        .collect();

    let mut publish_latency = histogram();
    let (mut acked, mut nacked) = (0, 0);
    for p in publishers {
        let r = p.await??;
        acked += r.acked;
        nacked += r.nacked;
        publish_latency.add(&r.latency)?;
    }
    let publish_secs = start.elapsed().as_secs_f64();
    let mut e2e = histogram();
    if args.consumers > 0 {
        for c in consumers {
            e2e.add(&c.await??)?;
        }
    }
    let total_secs = start.elapsed().as_secs_f64();
    let delivered = received.load(Ordering::Relaxed);
    let result = serde_json::json!({
        "addr": args.addr,
        "publishers": args.publishers,
        "consumers": args.consumers,
        "size_bytes": args.size,
        "window": args.window,
        "count": args.count,
        "acked": acked,
        "nacked": nacked,
        "delivered": delivered,
        "publish_msgs_per_sec": acked as f64 / publish_secs,
        "publish_mb_per_sec": acked as f64 * args.size as f64 / publish_secs / 1e6,
        "consume_msgs_per_sec": delivered as f64 / total_secs,
        "publish_to_ack": quantiles(&publish_latency),
        "publish_to_delivery": quantiles(&e2e),
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
