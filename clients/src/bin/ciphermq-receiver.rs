//! `ciphermq-receiver`: consumes its queue, decrypts, writes each message once to
//! `data/<queue>_received_messages.jsonl` and acknowledges only what is on disk (a
//! thin shell over [`ciphermq_clients::receiver`]).

use std::io::{self, IsTerminal as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ciphermq_clients::client_config;
use ciphermq_clients::progress::{self, ProgressLine};
use ciphermq_clients::receiver::{run_receiver, ReceiverLimits, ReceiverStats};
use ciphermq_clients::receiver_config::ReceiverConfig;
use clap::Parser;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "ciphermq-receiver",
    version,
    about = "Receive, decrypt and durably store CipherMQ messages, exactly once",
    long_about = "Receive, decrypt and durably store CipherMQ messages, exactly once.\n\n\
        Registers this receiver's public key, declares exchange, queue and binding, consumes, and appends each \
        new message as a JSON line to <output_dir>/<queue>_received_messages.jsonl; a message is acknowledged only \
        after its line is fsynced, and an id already in the file is never written again. Runs until Ctrl+C \
        (in-flight work is finished first) or until --count / --until-total / --idle-exit says so."
)]
struct Args {
    /// Receiver configuration file (JSON); relative paths inside are relative to it.
    /// Default: config.json in the working directory, when there is one
    /// (clients/examples/receiver.json is the demo's).
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Stop after writing this many new messages.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop once the output file holds this many records.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    until_total: Option<u64>,
    /// Stop after this many seconds without a delivery.
    #[arg(long, value_name = "SECS")]
    idle_exit: Option<f64>,
    /// Broker address host:port, or several seeds separated by commas
    /// (a:5700,b:5700): the first connection tries them in order and uses the
    /// first that connects; in a cluster any node will do (replaces
    /// `server_address`).
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]")]
    address: Option<String>,
    /// Keep trying the first connection for up to this many seconds, for a
    /// broker that is still starting (replaces `wait_for_broker_secs`;
    /// default 0: a first connection that fails is an error at once).
    #[arg(long, value_name = "SECS")]
    wait_for_broker: Option<u64>,
    /// Write `<queue>_received_messages.jsonl` into this directory (replaces
    /// `output_dir`; relative to the working directory), e.g. to keep a
    /// script's run apart from the config's own output.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Deliveries granted before acks (replaces `prefetch`).
    #[arg(long, value_name = "N")]
    prefetch: Option<u32>,
    /// Also write the final report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Never draw the progress line (it is drawn only when stdout is a terminal).
    #[arg(long)]
    no_progress: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ciphermq-receiver: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Loads the config, applies the flags, runs, prints the report.
async fn run(args: Args) -> anyhow::Result<()> {
    let path = client_config::config_path(args.config, "receiver.json")?;
    let mut config = ReceiverConfig::load(&path)?;
    if let Some(a) = args.address {
        config.server_address = a;
    }
    if let Some(w) = args.wait_for_broker {
        config.wait_for_broker_secs = w;
    }
    if let Some(dir) = args.output_dir {
        config.output_dir = dir;
    }
    if let Some(p) = args.prefetch {
        config.prefetch = p;
    }
    config.validate()?;
    let idle_exit = match args.idle_exit {
        None => None,
        Some(secs) if secs.is_finite() && secs > 0.0 => Some(Duration::from_secs_f64(secs)),
        Some(secs) => anyhow::bail!("--idle-exit {secs}: expected a positive number of seconds"),
    };
    ciphermq_clients::logging::init(&config.logging)?;
    let limits = ReceiverLimits {
        max_messages: args.count,
        until_total: args.until_total,
        idle_exit,
    };
    let stats = Arc::new(ReceiverStats::default());
    let progress = (!args.no_progress && io::stdout().is_terminal()).then(|| {
        let stats = stats.clone();
        ProgressLine::start(move |elapsed| progress::receiver_line(&stats, elapsed))
    });
    let result = run_receiver(&config, limits, stats, interrupted()).await;
    if let Some(p) = progress {
        p.finish().await;
    }
    let report = result?;
    println!("{report}");
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "client_id": report.client_id,
            "queue": report.queue,
            "output": report.output,
            "received": report.received,
            "written": report.written,
            "duplicates": report.duplicates,
            "rejected": report.rejected,
            "acked": report.acked,
            "reconnects": report.reconnects,
            "total_records": report.total_records,
            "stop": format!("{:?}", report.stop).to_lowercase(),
            "elapsed_secs": report.elapsed.as_secs_f64(),
            "active_secs": report.active.as_secs_f64(),
            "msgs_per_sec": report.msgs_per_sec(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Completes on the first Ctrl+C (in-flight work is then drained); a second one
/// exits at once. Never completes if the signal cannot be watched.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
    {
        // Not on the progress line (which also erases the terminal's "^C").
        let _line = progress::LogLine::start();
        eprintln!(
            "interrupted: writing and acknowledging what is in flight (Ctrl+C again to quit now)"
        );
    }
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
}
