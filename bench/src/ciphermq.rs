//! The scenario against CipherMQ over mutual TLS.
//!
//! Setup (as the receiver): `declare_exchange bench_<type> <type>`, queues
//! `<receiver>_bench_q<j>`, bound with `<receiver>.q<j>` (direct),
//! `<receiver>.*.q<j>.#` (topic) or `<receiver>` (fanout). Publishers pipeline
//! `publish` lines up to the window; replies come in command order, so each
//! `ACK` matches the oldest outstanding publish. Consumers `consume` with the
//! prefetch and `ack <id> <queue>` every delivery.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_proto::{Delivery, Reply};
use tokio::sync::mpsc;

use crate::args::{ExchangeArg, LoadArgs};
use crate::payload::{Body, Opener};
use crate::scenario::{self, ConsumerCtx, Outcome, PublisherCtx, PublisherReport, FLUSH_BYTES};
use crate::timeline::Latencies;

/// Names of the bench's exchange, queues and keys for one scenario.
#[derive(Debug, Clone)]
struct Names {
    /// `bench_<type>`.
    exchange: String,
    /// `<receiver>_bench_q<j>`.
    queues: Vec<String>,
    /// Binding key of each queue.
    bindings: Vec<String>,
    /// Routing key that reaches each queue (fanout: any key reaches all).
    keys: Vec<String>,
}

impl Names {
    fn new(args: &LoadArgs) -> Names {
        let r = &args.receiver;
        let queues = (0..args.queues)
            .map(|j| format!("{r}_bench_q{j}"))
            .collect();
        let (bindings, keys) = (0..args.queues)
            .map(|j| match args.exchange {
                ExchangeArg::Direct => (format!("{r}.q{j}"), format!("{r}.q{j}")),
                ExchangeArg::Topic => (format!("{r}.*.q{j}.#"), format!("{r}.bench.q{j}.x")),
                ExchangeArg::Fanout => (r.clone(), r.clone()),
            })
            .unzip();
        Names {
            exchange: format!("bench_{}", args.exchange.as_str()),
            queues,
            bindings,
            keys,
        }
    }
}

async fn connect(args: &LoadArgs, cn: &str) -> Result<Connection> {
    let opts = TlsClientOptions::for_cn(&args.certs, cn);
    Connection::connect(&args.addr, &opts)
        .await
        .with_context(|| format!("connecting to CipherMQ at {} as {cn}", args.addr))
}

async fn expect_ok(conn: &mut Connection, line: &str) -> Result<()> {
    let reply = conn.request(line).await?;
    if !reply.starts_with("OK ") {
        bail!("{line}: {reply}");
    }
    Ok(())
}

/// Declares the exchange, the queues and the bindings.
async fn setup(args: &LoadArgs, names: &Names) -> Result<()> {
    let mut conn = connect(args, &args.receiver).await?;
    expect_ok(
        &mut conn,
        &format!(
            "declare_exchange {} {}",
            names.exchange,
            args.exchange.as_str()
        ),
    )
    .await?;
    for (queue, binding) in names.queues.iter().zip(&names.bindings) {
        expect_ok(&mut conn, &format!("declare_queue {queue}")).await?;
        expect_ok(
            &mut conn,
            &format!("bind {queue} {} {binding}", names.exchange),
        )
        .await?;
    }
    let _ = conn.request("quit").await;
    Ok(())
}

/// One run against CipherMQ.
pub async fn run(
    args: &LoadArgs,
    body: Arc<Body>,
    opener: Option<Opener>,
    title: &str,
) -> Result<Outcome> {
    let names = Arc::new(Names::new(args));
    setup(args, &names).await?;
    let copies = match args.exchange {
        ExchangeArg::Fanout => args.queues as u64,
        _ => 1,
    };
    let shared = Arc::new(args.clone());
    let (pa, pn, ca, cn) = (shared.clone(), names.clone(), shared, names);
    scenario::execute(
        args,
        body,
        opener,
        copies,
        title,
        move |ctx| publisher(pa.clone(), pn.clone(), ctx),
        move |ctx| consumer(ca.clone(), cn.clone(), ctx),
    )
    .await
}

async fn publisher(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    mut ctx: PublisherCtx,
) -> Result<PublisherReport> {
    let cn = &args.senders[ctx.index % args.senders.len()];
    let (mut rd, mut wr) = connect(&args, cn).await?.into_split();
    let (stamps_tx, mut stamps_rx) = mpsc::unbounded_channel::<u64>();
    let mut acks = ctx.acks();
    let reader = tokio::spawn(async move {
        while let Some(stamp) = stamps_rx.recv().await {
            let line = rd
                .read_line()
                .await?
                .context("the broker closed a publisher connection")?;
            match Reply::parse(&line) {
                Reply::Ack(_) => acks.record(stamp, true),
                Reply::Nack { .. } => acks.record(stamp, false),
                other => bail!("unexpected reply to publish: {other:?}"),
            }
        }
        anyhow::Ok(acks.finish())
    });

    let prefixes: Vec<Vec<u8>> = names
        .keys
        .iter()
        .map(|key| format!("publish {} {key} ", names.exchange).into_bytes())
        .collect();
    let mut line = Vec::with_capacity(args.size + 128);
    let mut seq = 0u64;
    let (body, index) = (ctx.body.clone(), ctx.index);
    let mut emit = |wr: &mut ciphermq_clients::ConnectionWriter, stamp: u64| {
        line.clear();
        line.extend_from_slice(&prefixes[(seq % prefixes.len() as u64) as usize]);
        body.write(&mut line, index, seq, stamp)?;
        line.push(b'\n');
        wr.queue_bytes(&line);
        seq += 1;
        anyhow::Ok(line.len())
    };
    let sent = async {
        while let Some(slot) = ctx.source.next().await {
            let stamp = ctx.admit(slot).await?;
            let mut queued = emit(&mut wr, stamp)?;
            let _ = stamps_tx.send(stamp);
            while queued < FLUSH_BYTES {
                if ctx.try_admit().is_none() {
                    break;
                }
                let Some(slot) = ctx.source.try_next() else {
                    ctx.window.add_permits(1);
                    break;
                };
                let stamp = ctx.stamp(slot);
                queued += emit(&mut wr, stamp)?;
                let _ = stamps_tx.send(stamp);
            }
            wr.flush().await?;
        }
        anyhow::Ok(())
    }
    .await;
    drop(stamps_tx);
    // The reader's error (a refused publish, a closed connection) explains a
    // writer's "window closed", so it comes first.
    let report = reader.await.context("publisher reader panicked")??;
    sent?;
    let _ = wr.shutdown().await;
    Ok(report)
}

/// Most ids in one `ack_batch` line (about 30 KiB of the bench's ids).
const ACK_BATCH_IDS: usize = 1000;

/// A consumer's acks as lines: one `ack_batch` line for whatever is waiting
/// (at most [`ACK_BATCH_IDS`] ids a line), or one `ack` line per delivery.
struct AckLines {
    queue: String,
    single: bool,
    /// Ids in the open `ack_batch` line.
    ids: usize,
}

impl AckLines {
    fn push(&mut self, wr: &mut ciphermq_clients::ConnectionWriter, id: &str) {
        if self.single {
            for part in [
                b"ack ".as_slice(),
                id.as_bytes(),
                b" ",
                self.queue.as_bytes(),
                b"\n",
            ] {
                wr.queue_bytes(part);
            }
            return;
        }
        if self.ids == ACK_BATCH_IDS {
            self.end(wr);
        }
        if self.ids == 0 {
            wr.queue_bytes(b"ack_batch ");
            wr.queue_bytes(self.queue.as_bytes());
        }
        wr.queue_bytes(b" ");
        wr.queue_bytes(id.as_bytes());
        self.ids += 1;
    }

    /// Ends the open `ack_batch` line, if any.
    fn end(&mut self, wr: &mut ciphermq_clients::ConnectionWriter) {
        if self.ids > 0 {
            wr.queue_bytes(b"\n");
            self.ids = 0;
        }
    }
}

async fn consumer(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    mut ctx: ConsumerCtx,
) -> Result<Latencies> {
    let queue = names.queues[ctx.queue].clone();
    let mut conn = connect(&args, &args.receiver).await?;
    expect_ok(&mut conn, &format!("consume {queue} {}", args.prefetch)).await?;
    let (mut rd, mut wr) = conn.into_split();
    let (ack_tx, mut ack_rx) = mpsc::unbounded_channel::<String>();
    let mut lines = AckLines {
        queue,
        single: args.single_acks,
        ids: 0,
    };
    let acker = tokio::spawn(async move {
        while let Some(first) = ack_rx.recv().await {
            lines.push(&mut wr, &first);
            while let Ok(more) = ack_rx.try_recv() {
                lines.push(&mut wr, &more);
            }
            lines.end(&mut wr);
            wr.flush().await?;
        }
        anyhow::Ok(())
    });
    ctx.subscribed();
    let mut stop = ctx.stop.clone();
    loop {
        let line = tokio::select! {
            biased;
            line = rd.read_line() => line?.context("the broker closed a consumer connection")?,
            _ = ConsumerCtx::stopped(&mut stop) => break,
        };
        if let Some(d) = Delivery::parse(&line) {
            ctx.delivered(d.body.as_bytes());
            let _ = ack_tx.send(d.message_id.to_owned());
        } else if !line.starts_with("ACK_CONFIRMED ") && !line.starts_with("OK ack_batch ") {
            bail!("unexpected line for a consumer: {line}");
        }
    }
    drop(ack_tx);
    acker.await.context("consumer acker panicked")??;
    Ok(ctx.latency)
}
