//! `ciphermq-bench`: one scenario, run against CipherMQ (mutual TLS), RabbitMQ
//! (durable queues, persistent messages, publisher confirms) and NATS
//! JetStream (file storage), so every figure is quoted next to its peers.
//!
//! Map:
//! - [`args`]: the command line; every default is the documented scenario.
//! - [`payload`]: one envelope per run; only the id and the timestamp change.
//! - [`scenario`]: the clock, the fixed-rate pacer, windows, counters and the
//!   order of a run (subscribe, publish, drain, stop), shared by all targets.
//! - [`ciphermq`], [`rabbitmq`], [`nats`]: a publisher and a consumer per broker.
//! - [`placement`]: which node of a cluster (from the seeds of `--addr`)
//!   a receiver's stream connects to.
//! - [`progress`]: the progress bar on a terminal.
//! - [`report`]: rates, quantiles, medians over runs, ratios, table and JSON.
//! - [`timeline`]: the worst latency per 100 ms of a run, its stalls, and
//!   the median and p99 of each second.
//! - [`broker_sampler`]: broker RSS and CPU every second of a run, and
//!   whether RSS grows after warm-up.
//! - [`plot`]: the `plot` subcommand (a run's timelines as an SVG image).
//! - [`idle`]: the `idle` subcommand (memory per idle connection).
//! - [`drain`]: the `drain` subcommand (consume a filled queue, check ids).
//! - [`disk_floor`]: the `disk-floor` subcommand (the disk's own durable
//!   latency at a fixed rate, the floor under the broker's `ACK` tail).
//! - `summarize_check` (tests only): `bench/summarize.py` run on JSON this
//!   crate writes, so its tables stay true to the report's fields.
//!
//! Invariants: every broker gets byte-identical bodies and the same window and
//! prefetch; latency is measured from the scheduled send time when `--rate` is
//! given (coordinated-omission safe), from the actual send otherwise; the bench
//! only ever talks to the addresses it is given (loopback by default) and,
//! in a CipherMQ cluster, to the nodes they name for `locate`.

#![forbid(unsafe_code)]

mod args;
mod broker_sampler;
mod ciphermq;
mod disk_floor;
mod drain;
mod idle;
mod nats;
mod payload;
mod placement;
mod plot;
mod progress;
mod rabbitmq;
mod report;
mod scenario;
#[cfg(test)]
mod summarize_check;
mod timeline;

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;

use crate::args::{Cli, Command, LoadArgs, PayloadArg, TargetArg};
use crate::broker_sampler::{BrokerSampler, RssTrend};
use crate::payload::{Body, Live, Opener, Template};
use crate::report::{Memory, Report, RunResult};

fn main() -> Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads.max(1))
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Some(Command::Idle(idle)) => idle::run(idle).await,
            Some(Command::Drain(drain)) => drain::run(drain).await,
            Some(Command::Plot(plot)) => plot::run(&plot),
            Some(Command::DiskFloor(floor)) => disk_floor::run(&floor),
            None => load(cli.load).await,
        }
    })
}

/// The targets of `--target`, in the order they run within each round.
fn targets(arg: TargetArg) -> &'static [TargetArg] {
    match arg {
        TargetArg::Compare => &[TargetArg::Ciphermq, TargetArg::Rabbitmq, TargetArg::Nats],
        TargetArg::Ciphermq => &[TargetArg::Ciphermq],
        TargetArg::Rabbitmq => &[TargetArg::Rabbitmq],
        TargetArg::Nats => &[TargetArg::Nats],
    }
}

fn name(target: TargetArg) -> &'static str {
    match target {
        TargetArg::Ciphermq => "ciphermq",
        TargetArg::Rabbitmq => "rabbitmq",
        TargetArg::Nats => "nats",
        TargetArg::Compare => "compare",
    }
}

/// Runs every target `--runs` times, interleaved (c, r, n, c, r, n, …) so that
/// slow drift on a shared machine spreads over all of them.
async fn load(args: LoadArgs) -> Result<()> {
    args.validate()?;
    let mut results = Vec::new();
    for run in 1..=args.runs {
        for &target in targets(args.target) {
            let run_id = rand::random::<u32>();
            let (body, opener) = match args.payload {
                PayloadArg::PreEncrypted => (
                    Body::PreEncrypted(Template::new(args.size, &args.receiver, run_id)),
                    None,
                ),
                PayloadArg::Live => (
                    Body::Live(Live::new(args.size, &args.receiver, run_id, &args.keys)?),
                    Some(Opener::new(&args.receiver, &args.keys)?),
                ),
            };
            let body = Arc::new(body);
            let title = format!("{} {run}/{}", name(target), args.runs);
            let own_cpu_before = report::cpu_secs(std::process::id());
            let cpu_before = (target == TargetArg::Ciphermq)
                .then(|| args.broker_pid.and_then(report::cpu_secs))
                .flatten();
            let wait_before = (target == TargetArg::Ciphermq)
                .then(|| args.broker_pid.and_then(report::cpu_wait_secs))
                .flatten()
                .map(|w| (w, std::time::Instant::now()));
            let sampler = args
                .broker_pid
                .filter(|_| target == TargetArg::Ciphermq)
                .map(BrokerSampler::start);
            let (outcome, stream) = match target {
                TargetArg::Ciphermq => ciphermq::run(&args, body, opener, &title)
                    .await
                    .map(|(outcome, stream)| (outcome, Some(stream))),
                TargetArg::Rabbitmq => rabbitmq::run(&args, body, opener, &title)
                    .await
                    .map(|outcome| (outcome, None)),
                TargetArg::Nats => nats::run(&args, body, opener, &title)
                    .await
                    .map(|outcome| (outcome, None)),
                TargetArg::Compare => unreachable!("expanded by targets()"),
            }
            .with_context(|| format!("{} run {run}", name(target)))?;
            let mut result = RunResult::new(name(target), run, args.size, &outcome);
            result.stream = stream;
            if let (Some(a), Some(b)) = (own_cpu_before, report::cpu_secs(std::process::id())) {
                if outcome.acked > 0 {
                    result.client_cpu_us_per_msg = Some((b - a) * 1e6 / outcome.acked as f64);
                }
            }
            if let Some(sampler) = sampler {
                result.broker_timeline = sampler.finish();
                result.rss_trend = RssTrend::of(&result.broker_timeline, args.warm_up);
            }
            if target == TargetArg::Ciphermq {
                result.broker_memory = args.broker_pid.and_then(Memory::of);
                let cpu_after = args.broker_pid.and_then(report::cpu_secs);
                let wait_after = args.broker_pid.and_then(report::cpu_wait_secs);
                if let (Some((a, since)), Some(b)) = (wait_before, wait_after) {
                    let secs = since.elapsed().as_secs_f64();
                    if secs > 0.0 {
                        result.broker_cpu_wait_per_sec = Some((b - a).max(0.0) / secs);
                    }
                }
                if let (Some(a), Some(b)) = (cpu_before, cpu_after) {
                    if outcome.acked > 0 {
                        result.broker_cpu_us_per_msg = Some((b - a) * 1e6 / outcome.acked as f64);
                    }
                }
            }
            println!("{}", result.line(args.runs));
            results.push(result);
        }
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = Report::new(&args, command, results);
    println!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report.to_json()?)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
