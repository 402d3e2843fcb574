//! The same scenario against NATS JetStream (async-nats): a stream
//! `CIPHERMQ_BENCH` on subjects `cmqbench.>` with file storage (deleted and
//! re-created before each run, deleted after), acknowledged publishes with the
//! same window, and one durable pull consumer per queue with explicit acks.
//!
//! Queues map to consumers: direct publishes to `cmqbench.q<j>` and consumer
//! `q<j>` filters on it; topic publishes to `cmqbench.bench.q<j>.x` and
//! filters with `cmqbench.*.q<j>.>`; fanout publishes to `cmqbench.all` and
//! every consumer sees every message (interest retention). Direct and topic
//! use work-queue retention, the closest match to a queue.
//!
//! Each publisher and consumer is its own NATS connection (plain TCP: no TLS).
//! The server's default file store syncs to disk every two minutes, not before
//! each publish ack; see docs/BENCHMARKS.md.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::stream::{Config as StreamConfig, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use futures_lite::StreamExt;
use tokio::sync::mpsc;

use crate::args::{ExchangeArg, LoadArgs};
use crate::payload::{Body, Opener};
use crate::scenario::{self, ConsumerCtx, Outcome, PublisherCtx, PublisherReport};
use crate::timeline::Latencies;

/// The bench's stream.
const STREAM: &str = "CIPHERMQ_BENCH";

/// Subjects: where each queue's messages are published, and each consumer's filter.
#[derive(Debug, Clone)]
struct Names {
    /// Subject that reaches each queue.
    subjects: Vec<String>,
    /// Filter of each queue's consumer (empty: the whole stream).
    filters: Vec<String>,
}

impl Names {
    fn new(args: &LoadArgs) -> Names {
        let (subjects, filters) = (0..args.queues)
            .map(|j| match args.exchange {
                ExchangeArg::Direct => (format!("cmqbench.q{j}"), format!("cmqbench.q{j}")),
                ExchangeArg::Topic => (
                    format!("cmqbench.bench.q{j}.x"),
                    format!("cmqbench.*.q{j}.>"),
                ),
                ExchangeArg::Fanout => ("cmqbench.all".to_owned(), String::new()),
            })
            .unzip();
        Names { subjects, filters }
    }
}

async fn context(args: &LoadArgs) -> Result<Context> {
    let client = async_nats::connect(args.nats_url.as_str())
        .await
        .with_context(|| format!("connecting to NATS at {}", args.nats_url))?;
    // Let our window, not the client's default of 5,000, bound acks in flight.
    Ok(jetstream::ContextBuilder::new()
        .max_ack_inflight(args.window.max(1))
        .build(client))
}

/// Re-creates the stream and one durable consumer per queue.
async fn setup(args: &LoadArgs, names: &Names) -> Result<()> {
    let js = context(args).await?;
    let _ = js.delete_stream(STREAM).await;
    let retention = match args.exchange {
        ExchangeArg::Fanout => RetentionPolicy::Interest,
        _ => RetentionPolicy::WorkQueue,
    };
    let stream = js
        .create_stream(StreamConfig {
            name: STREAM.to_owned(),
            subjects: vec!["cmqbench.>".to_owned()],
            storage: StorageType::File,
            retention,
            ..Default::default()
        })
        .await
        .context("creating the JetStream stream (is JetStream enabled?)")?;
    for (j, filter) in names.filters.iter().enumerate() {
        let sharing = (0..args.consumers)
            .filter(|c| c % args.queues == j)
            .count()
            .max(1);
        stream
            .create_consumer(pull::Config {
                durable_name: Some(format!("q{j}")),
                filter_subject: filter.clone(),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: i64::from(args.prefetch) * sharing as i64,
                ..Default::default()
            })
            .await
            .with_context(|| format!("creating JetStream consumer q{j}"))?;
    }
    Ok(())
}

/// One run against NATS JetStream. Without consumers the stream is kept (for
/// memory figures); otherwise it is deleted.
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
    let (pa, pn, ca) = (shared.clone(), names, shared);
    let outcome = scenario::execute(
        args,
        body,
        opener,
        copies,
        title,
        move |ctx| publisher(pa.clone(), pn.clone(), ctx),
        move |ctx| consumer(ca.clone(), ctx),
    )
    .await;
    if args.consumers > 0 {
        context(args).await?.delete_stream(STREAM).await?;
    }
    outcome
}

async fn publisher(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    mut ctx: PublisherCtx,
) -> Result<PublisherReport> {
    let js = context(&args).await?;
    let (acks_tx, mut acks_rx) = mpsc::unbounded_channel::<(u64, PublishAckFuture)>();
    let mut acks = ctx.acks();
    let reader = tokio::spawn(async move {
        while let Some((stamp, ack)) = acks_rx.recv().await {
            acks.record(stamp, ack.await.is_ok());
        }
        anyhow::Ok(acks.finish())
    });
    let mut seq = 0u64;
    let sent = async {
        while let Some(slot) = ctx.source.next().await {
            let stamp = ctx.admit(slot).await?;
            let mut body = Vec::with_capacity(ctx.body.len());
            ctx.body.write(&mut body, ctx.index, seq, stamp)?;
            let subject = names.subjects[(seq % names.subjects.len() as u64) as usize].clone();
            let ack = js.publish(subject, Bytes::from(body)).await?;
            let _ = acks_tx.send((stamp, ack));
            seq += 1;
        }
        anyhow::Ok(())
    }
    .await;
    drop(acks_tx);
    let report = reader.await.context("publish ack reader panicked")??;
    sent?;
    Ok(report)
}

async fn consumer(args: Arc<LoadArgs>, mut ctx: ConsumerCtx) -> Result<Latencies> {
    let js = context(&args).await?;
    let stream = js.get_stream(STREAM).await?;
    let consumer: PullConsumer = stream
        .get_consumer(&format!("q{}", ctx.queue))
        .await
        .map_err(|e| anyhow::anyhow!("JetStream consumer q{}: {e}", ctx.queue))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(args.prefetch as usize)
        .messages()
        .await?;
    ctx.subscribed();
    let mut stop = ctx.stop.clone();
    loop {
        let message = tokio::select! {
            biased;
            m = messages.next() => match m {
                Some(m) => m.map_err(|e| anyhow::anyhow!("JetStream consumer: {e}"))?,
                None => break,
            },
            _ = ConsumerCtx::stopped(&mut stop) => break,
        };
        ctx.delivered(&message.payload);
        message
            .ack()
            .await
            .map_err(|e| anyhow::anyhow!("JetStream ack: {e}"))?;
    }
    Ok(ctx.latency)
}
