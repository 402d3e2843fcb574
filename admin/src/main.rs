//! `ciphermq-admin`: the operator's tool for a running broker.
//!
//! `ciphermq-admin dashboard` serves the web dashboard on a loopback
//! address, reading the admin endpoint over mutual TLS with an admin or
//! monitor certificate, so a browser without one can open it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ciphermq_admin::dashboard_proxy::{DashboardProxy, Upstream};
use clap::{Parser, Subcommand};

/// Operate a CipherMQ broker through its admin endpoint.
#[derive(Debug, Parser)]
#[command(name = "ciphermq-admin", version)]
struct Cli {
    /// The admin endpoint, `host:port` (the broker's `admin.address`).
    #[arg(long, default_value = "127.0.0.1:9091", global = true)]
    endpoint: String,
    /// The name the endpoint's certificate carries; default: the host of
    /// `--endpoint`.
    #[arg(long, global = true)]
    server_name: Option<String>,
    /// The CA that signed the broker's certificate.
    #[arg(long, default_value = "certs/ca.crt", global = true)]
    ca: PathBuf,
    /// An admin or monitor client certificate (`acl.admin_cns`,
    /// `acl.monitor_cns`).
    #[arg(long, default_value = "certs/admin.crt", global = true)]
    cert: PathBuf,
    /// Its private key.
    #[arg(long, default_value = "certs/admin.key", global = true)]
    key: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the live web dashboard on a loopback address for a browser.
    Dashboard {
        /// Where the browser connects: a loopback `ip:port`.
        #[arg(long, default_value = "127.0.0.1:9095")]
        listen: SocketAddr,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ciphermq-admin: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let server_name = match &cli.server_name {
        Some(name) => name.clone(),
        None => endpoint_host(&cli.endpoint)?,
    };
    let upstream = Upstream::from_files(&cli.endpoint, &server_name, &cli.ca, &cli.cert, &cli.key)
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    match cli.command {
        Command::Dashboard { listen } => runtime.block_on(async {
            let proxy = DashboardProxy::bind(listen, upstream)
                .await
                .map_err(|e| e.to_string())?;
            eprintln!(
                "dashboard: http://{}/ (reading {} as {}; Ctrl-C stops)",
                proxy.local_addr(),
                cli.endpoint,
                cli.cert.display()
            );
            tokio::select! {
                () = proxy.serve() => Ok(()),
                _ = tokio::signal::ctrl_c() => Ok(()),
            }
        }),
    }
}

/// The host part of `host:port` (without the brackets of an IPv6 address).
fn endpoint_host(endpoint: &str) -> Result<String, String> {
    let (host, _port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| format!("--endpoint {endpoint:?}: expected host:port"))?;
    Ok(host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned())
}
