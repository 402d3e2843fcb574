//! `ciphermq-broker`: loads the config, starts the shards, and stops cleanly on
//! SIGTERM or SIGINT, within `server.shutdown_timeout_secs`; with
//! `--check-config` it only checks the config.
//!
//! Exit statuses (docs/PROTOCOL.md, "Reload and shutdown"):
//! 0 stopped after a complete drain, or the config checked out;
//! 1 the broker did not start (io_uring, a port, the data directory, …);
//! 2 the config is invalid (and what `--check-config` refuses);
//! 3 the drain did not finish within `server.shutdown_timeout_secs`;
//! 4 a second SIGTERM/SIGINT ended the drain.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_broker::config::Config;
use ciphermq_broker::systemd::{self, Notifier};
use ciphermq_broker::Drain;
use clap::Parser;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The config does not load or would not start the broker.
const EXIT_CONFIG: u8 = 2;
/// The broker did not start.
const EXIT_START: u8 = 1;
/// The drain did not finish within `server.shutdown_timeout_secs`.
const EXIT_DRAIN_TIMEOUT: u8 = 3;
/// A second signal ended the drain.
const EXIT_FORCED: u8 = 4;

/// How much longer than `server.shutdown_timeout_secs` the process waits
/// for its shards to end once they gave up (they close what is left, the
/// admin endpoint and the Postgres bridge stop) before it exits regardless:
/// only a shard that no longer runs at all needs it.
const STOP_GRACE: Duration = Duration::from_secs(2);

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
    /// Check the config (values, TLS files and key, data directory) and
    /// exit: 0 with "config OK", 2 with the error. Binds no port and leaves
    /// the data directory's lock alone, so it can run beside the broker.
    #[arg(long)]
    check_config: bool,
}

/// What the main thread waits for.
enum Event {
    /// SIGTERM or SIGINT.
    Signal(i32),
    /// The shards ended (and the admin endpoint and bridge stopped).
    Stopped(Drain),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ciphermq-broker: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args.check_config {
        return check_config(&args.config, &config);
    }
    let guard = ciphermq_broker::logging::init(&config);
    let code = serve(&args, &config);
    // Flushes the JSON log files' writer: the last lines say why it ended.
    drop(guard);
    code
}

/// Why the configuration could not be had: the file's fault, or a
/// command-line override's (which the file is not to be blamed for).
#[derive(Debug)]
enum LoadError {
    /// The file is unreadable or invalid.
    File(PathBuf, ciphermq_broker::config::ConfigError),
    /// `--address` or `--shards` made a valid file's configuration invalid.
    Override(&'static str, String, ciphermq_broker::config::ConfigError),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::File(path, e) => write!(f, "{}: {e}", path.display()),
            LoadError::Override(flag, value, e) => {
                write!(
                    f,
                    "{flag} {value} (command line, overriding the config file): {e}"
                )
            }
        }
    }
}

/// The config file with the command line's overrides, each validated
/// again and blamed for what it breaks.
fn load(args: &Args) -> Result<Config, LoadError> {
    let mut config =
        Config::load(&args.config).map_err(|e| LoadError::File(args.config.clone(), e))?;
    if let Some(address) = &args.address {
        config.server.address = address.clone();
        config
            .validate()
            .map_err(|e| LoadError::Override("--address", address.clone(), e))?;
    }
    if let Some(shards) = args.shards {
        config.server.shards = shards;
        config
            .validate()
            .map_err(|e| LoadError::Override("--shards", shards.to_string(), e))?;
    }
    Ok(config)
}

/// `--check-config`: the warnings on stderr, the verdict on stdout.
fn check_config(path: &Path, config: &Config) -> ExitCode {
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    match ciphermq_broker::preflight::check(config) {
        Ok(warnings) => {
            for warning in warnings {
                eprintln!("warning: {warning}");
            }
            println!("config OK: {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ciphermq-broker: {}: {e}", path.display());
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// Runs the broker until it stops; the exit status.
fn serve(args: &Args, config: &Config) -> ExitCode {
    let broker = match ciphermq_broker::start(config) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "broker did not start");
            eprintln!("ciphermq-broker: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let stop = broker.stopper();
    let pulses = broker.pulses();
    broker.reload_from(args.config.clone());
    let reload = broker.file_reloader();
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ciphermq-broker: cannot install signal handlers: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    // Announced once SIGTERM is handled: whoever waits for this line may
    // signal the broker at once.
    let admin = broker
        .admin_addr()
        .map(|a| format!(", admin endpoint on {a}"))
        .unwrap_or_default();
    let listening = format!(
        "listening on {} with {} shard(s){admin}",
        broker.local_addr(),
        broker.shards()
    );
    println!("ciphermq-broker {listening}");
    let notifier = Notifier::from_env().map(Arc::new);
    if let Some(n) = &notifier {
        n.ready(&listening);
        if let Some(interval) = systemd::watchdog_interval_from_env() {
            match systemd::spawn_watchdog(n.clone(), interval, pulses.clone()) {
                Ok(_) => tracing::info!(
                    interval_ms = interval.as_millis() as u64,
                    "systemd watchdog: pinging while every shard runs"
                ),
                Err(e) => tracing::error!(error = %e, "cannot start the systemd watchdog thread"),
            }
        }
    }

    let (events, next) = mpsc::channel();
    let signalled = events.clone();
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if signal == SIGHUP {
                // A bad file keeps everything running as it is (logged);
                // only [tls], [acl] and [rate_limit] are applied, other
                // changes need a restart.
                let _ = reload();
                continue;
            }
            if signalled.send(Event::Signal(signal)).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        let drain = broker.join();
        let _ = events.send(Event::Stopped(drain));
    });

    let timeout = (config.server.shutdown_timeout_secs > 0)
        .then(|| Duration::from_secs(config.server.shutdown_timeout_secs));
    // Set by the first signal: when to stop waiting for the shards.
    let mut give_up_at: Option<Option<Instant>> = None;
    loop {
        let event = match give_up_at {
            Some(Some(at)) => match next.recv_timeout(at.saturating_duration_since(Instant::now()))
            {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(
                        timeout_secs = config.server.shutdown_timeout_secs,
                        still_open = %pulses.open_work(),
                        "the shards did not end after the drain deadline (server.shutdown_timeout_secs): \
                         exiting without them; nothing acknowledged is lost"
                    );
                    return ExitCode::from(EXIT_DRAIN_TIMEOUT);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return ExitCode::from(EXIT_START),
            },
            _ => match next.recv() {
                Ok(event) => event,
                Err(_) => return ExitCode::from(EXIT_START),
            },
        };
        match event {
            Event::Signal(signal) if give_up_at.is_none() => {
                tracing::info!(
                    signal,
                    timeout_secs = config.server.shutdown_timeout_secs,
                    "shutting down: no new connections; answering what was accepted (a second \
                     SIGTERM/SIGINT exits at once)"
                );
                stop();
                if let Some(n) = &notifier {
                    n.stopping(&draining_status(timeout));
                }
                give_up_at = Some(timeout.map(|t| Instant::now() + t + STOP_GRACE));
            }
            Event::Signal(signal) => {
                tracing::warn!(
                    signal,
                    still_open = %pulses.open_work(),
                    "second signal during the drain: exiting now; nothing acknowledged is lost \
                     (ACKs follow fsync), commands still unanswered were never acknowledged"
                );
                return ExitCode::from(EXIT_FORCED);
            }
            Event::Stopped(Drain::Finished) => {
                tracing::info!("stopped");
                return ExitCode::SUCCESS;
            }
            Event::Stopped(Drain::GaveUp) => {
                tracing::warn!(
                    timeout_secs = config.server.shutdown_timeout_secs,
                    "stopped before the drain finished (server.shutdown_timeout_secs passed; the \
                     shards logged what they closed): exit status {EXIT_DRAIN_TIMEOUT}"
                );
                return ExitCode::from(EXIT_DRAIN_TIMEOUT);
            }
        }
    }
}

/// The status line systemd shows while the broker drains.
fn draining_status(timeout: Option<Duration>) -> String {
    match timeout {
        Some(t) => format!(
            "draining: answering accepted commands, at most {} s",
            t.as_secs()
        ),
        None => "draining: answering accepted commands (no deadline)".to_owned(),
    }
}
