//! `ciphermq-sender`: encrypts messages end to end for their receivers and
//! publishes them through a pipelined, retrying connection (a thin shell over
//! [`ciphermq_clients::sender`]).

use std::fs::File;
use std::io::{self, BufReader, IsTerminal as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use ciphermq_clients::client_config;
use ciphermq_clients::message_source::Contents;
use ciphermq_clients::progress::{self, ProgressLine};
use ciphermq_clients::sender::{run_sender, SendJob, SenderReport, SenderStats};
use ciphermq_clients::sender_config::SenderConfig;
use clap::Parser;

/// Command-line arguments; each override replaces the config key it names.
#[derive(Debug, Parser)]
#[command(
    name = "ciphermq-sender",
    version,
    about = "Encrypt messages end to end and publish them to a CipherMQ broker",
    long_about = "Encrypt messages end to end and publish them to a CipherMQ broker.\n\n\
        Input, in order of precedence: --message TEXT (one message), --file PATH (one message per line; \
        \"-\" reads stdin), else --count (or message_count) messages rendered from the config's content_template. \
        Each message is encrypted separately for every receiver (--to, or the config's receivers) and published to \
        exchange_name with routing key routing_key ({receiver_id} by default). Exit status 0 when every message \
        was acknowledged, 1 when some failed or were left unsent, 2 on errors."
)]
struct Args {
    /// Sender configuration file (JSON); relative paths inside are relative to it.
    /// Default: config.json in the working directory, when there is one
    /// (clients/examples/sender.json is the demo's).
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Receiver to send to; repeatable; replaces the config's `receivers`.
    #[arg(long = "to", value_name = "RECEIVER_ID")]
    to: Vec<String>,
    /// Send this one message.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["file", "count"])]
    message: Option<String>,
    /// Send one message per line of this file; "-" reads stdin.
    #[arg(long, value_name = "PATH", conflicts_with = "count")]
    file: Option<PathBuf>,
    /// Messages to render from `content_template` (replaces `message_count`).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Broker address host:port, or several seeds separated by commas
    /// (a:5700,b:5700): the first connection tries them in order and uses the
    /// first that connects; in a cluster any node will do (replaces
    /// `server_address`).
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]")]
    address: Option<String>,
    /// Keep trying the first connection for up to this many seconds, for a
    /// broker that is still starting (replaces `sender.wait_for_broker_secs`;
    /// default 0: a first connection that fails is an error at once).
    #[arg(long, value_name = "SECS")]
    wait_for_broker: Option<u64>,
    /// Exchange to publish to (replaces `exchange_name`).
    #[arg(long, value_name = "NAME")]
    exchange: Option<String>,
    /// Routing key; `{receiver_id}` is replaced per receiver (replaces `routing_key`).
    #[arg(long, value_name = "KEY")]
    routing_key: Option<String>,
    /// Publishes awaiting their ACK, at most (replaces `sender.max_inflight`).
    #[arg(long, value_name = "N")]
    max_inflight: Option<usize>,
    /// Pad templated plaintexts to at least this many bytes (replaces `pad_to_bytes`).
    #[arg(long, value_name = "BYTES")]
    pad_to: Option<usize>,
    /// Run id inside message ids (default: random); reuse one to resume a run without duplicates.
    #[arg(long, value_name = "ID")]
    run_id: Option<String>,
    /// Also write the final report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Never draw the progress bar (it is drawn only when stdout is a terminal).
    #[arg(long)]
    no_progress: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(report) if report.failed == 0 && report.unsent == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(err) => {
            eprintln!("ciphermq-sender: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Loads the config, applies the flags, runs, prints the report.
async fn run(args: Args) -> anyhow::Result<SenderReport> {
    let path = client_config::config_path(args.config, "sender.json")?;
    let mut config = SenderConfig::load(&path)?;
    if !args.to.is_empty() {
        config.receivers = args.to.clone();
    }
    if let Some(a) = args.address {
        config.server_address = a;
    }
    if let Some(w) = args.wait_for_broker {
        config.sender.wait_for_broker_secs = w;
    }
    if let Some(e) = args.exchange {
        config.exchange_name = e;
    }
    if let Some(k) = args.routing_key {
        config.routing_key = k;
    }
    if let Some(n) = args.max_inflight {
        config.sender.max_inflight = n;
    }
    if let Some(p) = args.pad_to {
        config.pad_to_bytes = p;
    }
    config.validate()?;
    ciphermq_clients::logging::init(&config.logging)?;

    let contents = if let Some(text) = args.message {
        Contents::Texts(vec![text])
    } else if let Some(path) = &args.file {
        if path.as_os_str() == "-" {
            Contents::Lines(Box::new(BufReader::new(io::stdin())))
        } else {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            Contents::Lines(Box::new(BufReader::new(file)))
        }
    } else {
        Contents::Template {
            template: config.content_template.clone(),
            count: args.count.unwrap_or(config.message_count),
            pad_to: config.pad_to_bytes,
        }
    };

    let stats = Arc::new(SenderStats::default());
    let progress = (!args.no_progress && io::stdout().is_terminal()).then(|| {
        let stats = stats.clone();
        ProgressLine::start(move |elapsed| progress::sender_line(&stats, elapsed))
    });
    let job = SendJob {
        contents,
        run_id: args.run_id,
    };
    let result = run_sender(&config, job, stats, interrupted()).await;
    if let Some(p) = progress {
        p.finish().await;
    }
    let report = result?;
    println!("{report}");
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "sender_id": report.sender_id,
            "run_id": report.run_id,
            "receivers": config.receivers,
            "sent": report.sent,
            "acked": report.acked,
            "failed": report.failed,
            "unsent": report.unsent,
            "retries": report.retries,
            "reconnects": report.reconnects,
            "elapsed_secs": report.elapsed.as_secs_f64(),
            "msgs_per_sec": report.msgs_per_sec(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(report)
}

/// Completes on the first Ctrl+C (in-flight publishes are then awaited); a second
/// one exits at once. Never completes if the signal cannot be watched.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
    {
        // Not on the progress line (which also erases the terminal's "^C").
        let _line = progress::LogLine::start();
        eprintln!("interrupted: waiting for the replies to publishes in flight (Ctrl+C again to quit now)");
    }
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
}
