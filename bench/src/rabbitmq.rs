//! The same scenario against RabbitMQ (AMQP 0-9-1 via lapin): a durable
//! exchange `ciphermq_bench_<type>`, durable queues `ciphermq_bench_q<j>`
//! (purged before each run, deleted after), persistent messages (delivery mode
//! 2), publisher confirms with the same window, `basic.qos` equal to the
//! prefetch, and a manual `basic.ack` per delivery.
//!
//! Each publisher and each consumer is its own AMQP connection with one
//! channel, as each CipherMQ publisher and consumer is its own TLS connection.
//! RabbitMQ is reached over plain TCP (no TLS listener is configured on this
//! machine), which favours RabbitMQ.

use std::sync::Arc;

use anyhow::{Context, Result};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    PublisherConfirm,
};
use tokio::sync::mpsc;

use crate::args::{ExchangeArg, LoadArgs};
use crate::payload::{Body, Opener};
use crate::scenario::{self, ConsumerCtx, Outcome, PublisherCtx, PublisherReport};
use crate::timeline::Latencies;

/// Names of the bench's exchange, queues and keys.
#[derive(Debug, Clone)]
struct Names {
    /// `ciphermq_bench_<type>`.
    exchange: String,
    /// `ciphermq_bench_q<j>`.
    queues: Vec<String>,
    /// Binding key of each queue.
    bindings: Vec<String>,
    /// Routing key that reaches each queue.
    keys: Vec<String>,
}

impl Names {
    fn new(args: &LoadArgs) -> Names {
        let (bindings, keys) = (0..args.queues)
            .map(|j| match args.exchange {
                ExchangeArg::Direct => (format!("bench.q{j}"), format!("bench.q{j}")),
                ExchangeArg::Topic => (format!("bench.*.q{j}.#"), format!("bench.x.q{j}.y")),
                ExchangeArg::Fanout => ("bench".to_owned(), "bench".to_owned()),
            })
            .unzip();
        Names {
            exchange: format!("ciphermq_bench_{}", args.exchange.as_str()),
            queues: (0..args.queues)
                .map(|j| format!("ciphermq_bench_q{j}"))
                .collect(),
            bindings,
            keys,
        }
    }
}

async fn channel(args: &LoadArgs) -> Result<(Connection, Channel)> {
    let conn = Connection::connect(&args.amqp_url, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to RabbitMQ at {}", args.amqp_url))?;
    let channel = conn.create_channel().await?;
    Ok((conn, channel))
}

/// Declares the durable exchange and queues, purges leftovers, binds.
async fn setup(args: &LoadArgs, names: &Names) -> Result<()> {
    let (conn, ch) = channel(args).await?;
    let kind = match args.exchange {
        ExchangeArg::Direct => ExchangeKind::Direct,
        ExchangeArg::Fanout => ExchangeKind::Fanout,
        ExchangeArg::Topic => ExchangeKind::Topic,
    };
    let durable_exchange = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(
        names.exchange.as_str().into(),
        kind,
        durable_exchange,
        FieldTable::default(),
    )
    .await
    .context("declaring the RabbitMQ exchange")?;
    for (queue, binding) in names.queues.iter().zip(&names.bindings) {
        ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("declaring RabbitMQ queue {queue}"))?;
        ch.queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        ch.queue_bind(
            queue.as_str().into(),
            names.exchange.as_str().into(),
            binding.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    }
    let _ = conn.close(200, "setup done".into()).await;
    Ok(())
}

/// Deletes the bench queues (their messages are on disk otherwise).
async fn teardown(args: &LoadArgs, names: &Names) -> Result<()> {
    let (conn, ch) = channel(args).await?;
    for queue in &names.queues {
        ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    let _ = conn.close(200, "teardown done".into()).await;
    Ok(())
}

/// One run against RabbitMQ. Without consumers the queues are kept (for
/// memory figures); otherwise they are deleted.
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
    let (pa, pn, ca, cn) = (shared.clone(), names.clone(), shared, names.clone());
    let outcome = scenario::execute(
        args,
        body,
        opener,
        copies,
        title,
        move |ctx| publisher(pa.clone(), pn.clone(), ctx),
        move |ctx| consumer(ca.clone(), cn.clone(), ctx),
    )
    .await;
    if args.consumers > 0 {
        teardown(args, &names).await?;
    }
    outcome
}

async fn publisher(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    mut ctx: PublisherCtx,
) -> Result<PublisherReport> {
    let (conn, ch) = channel(&args).await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let (confirms_tx, mut confirms_rx) = mpsc::unbounded_channel::<(u64, PublisherConfirm)>();
    let mut acks = ctx.acks();
    let reader = tokio::spawn(async move {
        while let Some((stamp, confirm)) = confirms_rx.recv().await {
            let ok = matches!(confirm.await?, Confirmation::Ack(None));
            acks.record(stamp, ok);
        }
        anyhow::Ok(acks.finish())
    });
    let persistent = BasicProperties::default().with_delivery_mode(2);
    let mut body = Vec::with_capacity(args.size);
    let mut seq = 0u64;
    let sent = async {
        while let Some(slot) = ctx.source.next().await {
            let stamp = ctx.admit(slot).await?;
            body.clear();
            ctx.body.write(&mut body, ctx.index, seq, stamp)?;
            let key = &names.keys[(seq % names.keys.len() as u64) as usize];
            let confirm = ch
                .basic_publish(
                    names.exchange.as_str().into(),
                    key.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    persistent.clone(),
                )
                .await?;
            let _ = confirms_tx.send((stamp, confirm));
            seq += 1;
        }
        anyhow::Ok(())
    }
    .await;
    drop(confirms_tx);
    let report = reader.await.context("confirm reader panicked")??;
    sent?;
    let _ = conn.close(200, "done".into()).await;
    Ok(report)
}

async fn consumer(
    args: Arc<LoadArgs>,
    names: Arc<Names>,
    mut ctx: ConsumerCtx,
) -> Result<Latencies> {
    let (conn, ch) = channel(&args).await?;
    let prefetch = u16::try_from(args.prefetch).unwrap_or(u16::MAX);
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut deliveries = ch
        .basic_consume(
            names.queues[ctx.queue].as_str().into(),
            format!("bench-{}", ctx.index).as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    ctx.subscribed();
    let mut stop = ctx.stop.clone();
    loop {
        let delivery = tokio::select! {
            biased;
            d = deliveries.next() => match d {
                Some(d) => d?,
                None => break,
            },
            _ = ConsumerCtx::stopped(&mut stop) => break,
        };
        ctx.delivered(&delivery.data);
        delivery.ack(BasicAckOptions::default()).await?;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(ctx.latency)
}
