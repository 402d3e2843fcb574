//! `ciphermq-broker`: loads the config, starts the shards, and stops cleanly on
//! SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use ciphermq_broker::config::Config;
use clap::Parser;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// CipherMQ broker: mutual-TLS identities, end-to-end encrypted payloads.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Path of the configuration file.
    #[arg(short, long, default_value = "config.toml")]
    config: PathBuf,
    /// Override `server.address` (host:port).
    #[arg(long)]
    address: Option<String>,
    /// Override `server.shards` (0 = one per core).
    #[arg(long)]
    shards: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ciphermq-broker: {}: {e}", args.config.display());
            return ExitCode::from(2);
        }
    };
    if let Some(address) = args.address {
        config.server.address = address;
    }
    if let Some(shards) = args.shards {
        config.server.shards = shards;
    }
    let _guard = ciphermq_broker::logging::init(&config);
    let broker = match ciphermq_broker::start(&config) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "broker did not start");
            eprintln!("ciphermq-broker: {e}");
            return ExitCode::from(1);
        }
    };
    let stop = broker.stopper();
    broker.reload_from(args.config.clone());
    let reload = broker.file_reloader();
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ciphermq-broker: cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    // Announced once SIGTERM is handled: whoever waits for this line may
    // signal the broker at once.
    let admin = broker
        .admin_addr()
        .map(|a| format!(", admin endpoint on {a}"))
        .unwrap_or_default();
    println!(
        "ciphermq-broker listening on {} with {} shard(s){admin}",
        broker.local_addr(),
        broker.shards()
    );
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if signal == SIGHUP {
                // A bad file keeps everything running as it is (logged);
                // only [tls], [acl] and [rate_limit] are applied, other
                // changes need a restart.
                let _ = reload();
                continue;
            }
            tracing::info!(signal, "shutting down");
            stop();
            break;
        }
    });
    broker.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
