//! The scenario against CipherMQ over mutual TLS, on the client library
//! (`ciphermq_clients::Client`).
//!
//! Setup (as the receiver): `declare_exchange bench_<type> <type>`, queues
//! `<receiver>_bench_q<j>`, bound with `<receiver>.q<j>` (direct),
//! `<receiver>.*.q<j>.#` (topic) or `<receiver>` (fanout). Publishers use the
//! library's publish pipeline (`Publisher::pipeline`): publishes are queued up
//! to the window and flushed in one write, and their outcomes come back in
//! order, each matched with its send time. Consumers are the library's
//! `Consumer` streams; whatever deliveries have arrived are settled together
//! through a `Settler`: one `ack_batch` line (at most [`ACK_BATCH_IDS`] ids),
//! or with `--single-acks` one `ack` line each.
//!
//! Before that, the seeds of `--addr` are asked where the receiver lives
//! ([`placement`]): setup, publishers and consumers all connect to that
//! node, so a cluster run measures stores, not `moved` refusals.

use std::sync::Arc;

use anyhow::{Context, Result};
use ciphermq_clients::{
    Client, ClientConfig, Consumer, Delivery, ExchangeKind, PublishError, Settlement, Settler,
    TlsClientOptions,
};
use futures_lite::StreamExt as _;
use tokio::sync::mpsc;

use crate::args::{ExchangeArg, LoadArgs};
use crate::payload::{Body, Opener};
use crate::placement::{self, Answer, Stream};
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

async fn connect(args: &LoadArgs, address: &str, cn: &str) -> Result<Client> {
    let tls = TlsClientOptions::for_cn(&args.certs, cn);
    Client::connect(ClientConfig::new(address, tls))
        .await
        .with_context(|| format!("connecting to CipherMQ at {address} as {cn}"))
}

/// Asks `seed`, as the receiver, `locate <receiver>`.
async fn ask(args: &LoadArgs, seed: String) -> Answer {
    let tls = TlsClientOptions::for_cn(&args.certs, &args.receiver);
    let client = match Client::connect(ClientConfig::new(seed, tls)).await {
        Ok(client) => client,
        Err(e) => return Answer::Failed(format!("connecting as {}: {e}", args.receiver)),
    };
    let answer = Answer::of(client.locate(&args.receiver).await);
    let _ = client.close().await;
    answer
}

/// Where the receiver's stream goes: the node the first answering seed
/// names, or that seed when it is a broker on its own.
async fn locate(args: &LoadArgs) -> Result<Stream> {
    let stream =
        placement::place(&args.receiver, args.addr.as_slice(), |seed| ask(args, seed)).await?;
    Ok(stream)
}

/// Declares the exchange, the queues and the bindings.
async fn setup(args: &LoadArgs, address: &str, names: &Names) -> Result<()> {
    let client = connect(args, address, &args.receiver).await?;
    let kind = match args.exchange {
        ExchangeArg::Direct => ExchangeKind::Direct,
        ExchangeArg::Topic => ExchangeKind::Topic,
        ExchangeArg::Fanout => ExchangeKind::Fanout,
    };
    client
        .declare_exchange(&names.exchange, kind)
        .await
        .with_context(|| format!("declare_exchange {}", names.exchange))?;
    for (queue, binding) in names.queues.iter().zip(&names.bindings) {
        client
            .declare_queue(queue)
            .await
            .with_context(|| format!("declare_queue {queue}"))?;
        client
            .bind(queue, &names.exchange, binding)
            .await
            .with_context(|| format!("bind {queue} {} {binding}", names.exchange))?;
    }
    let _ = client.close().await;
    Ok(())
}

/// Deletes the bench queues, and with them what a run left queued.
async fn delete_queues(args: &LoadArgs, address: &str, names: &Names) -> Result<()> {
    let client = connect(args, address, &args.receiver).await?;
    for queue in &names.queues {
        client
            .delete_queue(queue)
            .await
            .with_context(|| format!("delete_queue {queue}"))?;
    }
    let _ = client.close().await;
    Ok(())
}

/// One run against CipherMQ, and where its receiver's stream went (also
/// printed on stderr).
pub async fn run(
    args: &LoadArgs,
    body: Arc<Body>,
    opener: Option<Opener>,
    title: &str,
) -> Result<(Outcome, Stream)> {
    let stream = locate(args).await?;
    eprintln!("{title}: {stream}");
    let names = Arc::new(Names::new(args));
    setup(args, &stream.address, &names).await?;
    let copies = match args.exchange {
        ExchangeArg::Fanout => args.queues as u64,
        _ => 1,
    };
    let names_for_delete = names.clone();
    let shared = Arc::new(args.clone());
    let address: Arc<str> = Arc::from(stream.address.as_str());
    let (pa, pn, pd) = (shared.clone(), names.clone(), address.clone());
    let (ca, cn, cd) = (shared, names, address);
    let outcome = scenario::execute(
        args,
        body,
        opener,
        copies,
        title,
        move |ctx| publisher(pa.clone(), pn.clone(), pd.clone(), ctx),
        move |ctx| consumer(ca.clone(), cn.clone(), cd.clone(), ctx),
    )
    .await?;
    if args.delete_queues {
        delete_queues(args, &stream.address, &names_for_delete).await?;
    }
    Ok((outcome, stream))
}

async fn publisher(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    address: Arc<str>,
    mut ctx: PublisherCtx,
) -> Result<PublisherReport> {
    let cn = &args.senders[ctx.index % args.senders.len()];
    let client = connect(&args, &address, cn).await?;
    let (mut pipeline, mut outcomes) = client.publisher().pipeline();
    let (stamps_tx, mut stamps_rx) = mpsc::unbounded_channel::<u64>();
    let mut acks = ctx.acks();
    let reader = tokio::spawn(async move {
        while let Some(stamp) = stamps_rx.recv().await {
            match outcomes
                .next()
                .await
                .context("the broker closed a publisher connection")?
            {
                Ok(_) => acks.record(stamp, true),
                Err(PublishError::Nack { .. } | PublishError::UnknownNack { .. }) => {
                    acks.record(stamp, false)
                }
                Err(e) => return Err(anyhow::Error::new(e).context("publishing")),
            }
        }
        anyhow::Ok(acks.finish())
    });

    let mut json = Vec::with_capacity(args.size + 64);
    let mut seq = 0u64;
    let (body, index) = (ctx.body.clone(), ctx.index);
    let mut emit = |pipeline: &mut ciphermq_clients::PublishPipeline, stamp: u64| {
        let key = &names.keys[(seq % names.keys.len() as u64) as usize];
        json.clear();
        body.write(&mut json, index, seq, stamp)?;
        seq += 1;
        let id = crate::payload::id_of(&json).context("a message body without an id")?;
        // The broker checks the body's UTF-8; it is not scanned here too.
        pipeline.push_json_bytes(&names.exchange, key, id, &json)?;
        anyhow::Ok(())
    };
    let mut batch: Vec<u64> = Vec::new();
    let sent = async {
        while let Some(slot) = ctx.source.next().await {
            let stamp = ctx.admit(slot).await?;
            emit(&mut pipeline, stamp)?;
            let _ = stamps_tx.send(stamp);
            batch.push(stamp);
            while !args.flush_each && pipeline.queued_bytes() < FLUSH_BYTES {
                if ctx.try_admit().is_none() {
                    break;
                }
                let Some(slot) = ctx.source.try_next() else {
                    ctx.window.add_permits(1);
                    break;
                };
                let stamp = ctx.stamp(slot);
                emit(&mut pipeline, stamp)?;
                let _ = stamps_tx.send(stamp);
                batch.push(stamp);
            }
            pipeline.flush()?;
            ctx.handed_over(&batch);
            batch.clear();
            // The connection task writes the batch: let it run now, so a
            // batch leaves as soon as it is made, not once the window is
            // spent.
            tokio::task::yield_now().await;
        }
        anyhow::Ok(())
    }
    .await;
    drop(stamps_tx);
    // The reader's error (a refused publish, a closed connection) explains a
    // writer's "window closed", so it comes first.
    let mut report = reader.await.context("publisher reader panicked")??;
    sent?;
    report.send_lag = Some(ctx.take_send_lag());
    drop(pipeline);
    let _ = client.close().await;
    Ok(report)
}

/// Most ids in one `ack_batch` line (about 30 KiB of the bench's ids).
const ACK_BATCH_IDS: usize = 1000;

/// Settles `batch`: one `ack_batch` line per [`ACK_BATCH_IDS`] ids, or one
/// `ack` line per delivery; the settlements go to the task that checks them.
fn settle(
    settler: &Settler,
    single: bool,
    batch: &mut Vec<Delivery>,
    check: &mpsc::UnboundedSender<Settlement>,
) -> Result<()> {
    for chunk in batch.chunks(ACK_BATCH_IDS) {
        let ids = chunk.iter().map(Delivery::id);
        let settlement = if single {
            settler.ack_each(ids)?
        } else {
            settler.ack_ids(ids)?
        };
        let _ = check.send(settlement);
    }
    batch.clear();
    Ok(())
}

async fn consumer(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    address: Arc<str>,
    mut ctx: ConsumerCtx,
) -> Result<Latencies> {
    let queue = names.queues[ctx.queue].clone();
    let client = connect(&args, &address, &args.receiver).await?;
    let mut deliveries: Consumer = client
        .consume(&queue, args.prefetch)
        .await
        .with_context(|| format!("consume {queue} {}", args.prefetch))?;
    let settler = deliveries.settler();
    // Replies to the acks are checked in order on their own task, so reading
    // deliveries never waits for them.
    let (check_tx, mut check_rx) = mpsc::unbounded_channel::<Settlement>();
    let checker = tokio::spawn(async move {
        while let Some(settlement) = check_rx.recv().await {
            settlement.await.context("acknowledging deliveries")?;
        }
        anyhow::Ok(())
    });
    ctx.subscribed();
    let mut stop = ctx.stop.clone();
    let mut batch: Vec<Delivery> = Vec::with_capacity(ACK_BATCH_IDS);
    loop {
        let item = tokio::select! {
            biased;
            item = deliveries.next() => item.context("the broker closed a consumer connection")?,
            _ = ConsumerCtx::stopped(&mut stop) => break,
        };
        let d = item.context("consuming")?;
        ctx.delivered(d.body().as_bytes());
        batch.push(d);
        // Whatever else has arrived is acknowledged with it.
        while let Some(item) = deliveries.next_ready() {
            let d = item.context("consuming")?;
            ctx.delivered(d.body().as_bytes());
            batch.push(d);
        }
        settle(&settler, args.single_acks, &mut batch, &check_tx)?;
    }
    drop(check_tx);
    checker.await.context("consumer acker panicked")??;
    drop(deliveries);
    let _ = client.close().await;
    Ok(ctx.latency)
}
