//! `ciphermq-admin`: the operator's tool for a running broker.
//!
//! It reads through the admin endpoint (`status`, `queues`, `connections`,
//! `exchanges`, `reload`, and the live web `dashboard`) and changes things
//! through the broker port in `ciphermq/1` (`purge`, `delete`, `unbind`,
//! `close`), in both cases over mutual TLS with an admin certificate
//! (reading also works with a monitor's).

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ciphermq_admin::dashboard_proxy::DashboardProxy;
use ciphermq_admin::remote::{host_of, AdminEndpoint, BrokerPort, Credentials};
use clap::{Parser, Subcommand};
use hyper::Method;
use serde_json::Value;

/// Operate a CipherMQ broker: its admin endpoint and its client port.
#[derive(Debug, Parser)]
#[command(name = "ciphermq-admin", version)]
struct Cli {
    /// The admin endpoint, `host:port` (the broker's `admin.address`).
    #[arg(long, default_value = "127.0.0.1:9091", global = true)]
    endpoint: String,
    /// The broker's client port, `host:port` (`server.address`), for the
    /// commands that change things.
    #[arg(long, default_value = "127.0.0.1:5700", global = true)]
    broker: String,
    /// The name the broker's certificate carries; default: the host of the
    /// address connected to.
    #[arg(long, global = true)]
    server_name: Option<String>,
    /// The CA that signed the broker's certificate.
    #[arg(long, default_value = "certs/ca.crt", global = true)]
    ca: PathBuf,
    /// An admin client certificate (`acl.admin_cns`); one of
    /// `acl.monitor_cns` may read but not change anything.
    #[arg(long, default_value = "certs/admin.crt", global = true)]
    cert: PathBuf,
    /// Its private key.
    #[arg(long, default_value = "certs/admin.key", global = true)]
    key: PathBuf,
    /// Print the endpoint's JSON (or the broker's reply as JSON) instead of
    /// tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Health, readiness and warnings, counters, storage, the mirror.
    Status,
    /// Every queue: owner, shard, ready, unacked, consumers, bytes.
    Queues,
    /// Open connections by CN and by IP.
    Connections,
    /// Exchanges and their bindings.
    Exchanges,
    /// Drop a queue's ready messages (unacked deliveries stay owed).
    Purge {
        /// The queue.
        queue: String,
    },
    /// Delete a queue (its messages and bindings) or an exchange (its
    /// bindings).
    Delete {
        #[command(subcommand)]
        what: Deletable,
    },
    /// Remove one binding.
    Unbind {
        /// The bound queue.
        queue: String,
        /// The exchange.
        exchange: String,
        /// The binding key, as bound.
        routing_key: String,
    },
    /// Close every connection a CN has open.
    Close {
        /// The client's CN.
        client_id: String,
    },
    /// Reload `[acl]`, `[rate_limit]` and `[tls]` (certificate, key, CA
    /// bundle, CRL) from the broker's config file, as SIGHUP does.
    Reload,
    /// Serve the live web dashboard on a loopback address for a browser.
    Dashboard {
        /// Where the browser connects: a loopback `ip:port`.
        #[arg(long, default_value = "127.0.0.1:9095")]
        listen: SocketAddr,
    },
}

#[derive(Debug, Subcommand)]
enum Deletable {
    /// A queue.
    Queue {
        /// Its name.
        name: String,
    },
    /// An exchange.
    Exchange {
        /// Its name.
        name: String,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ciphermq-admin: cannot start its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ciphermq-admin: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let credentials =
        Credentials::from_files(&cli.ca, &cli.cert, &cli.key).map_err(|e| e.to_string())?;
    let name_for = |address: &str| {
        cli.server_name
            .clone()
            .unwrap_or_else(|| host_of(address).to_owned())
    };
    let endpoint = || {
        AdminEndpoint::new(&cli.endpoint, &name_for(&cli.endpoint), credentials.clone())
            .map_err(|e| e.to_string())
    };
    let broker = || {
        BrokerPort::new(&cli.broker, &name_for(&cli.broker), credentials.clone())
            .map_err(|e| e.to_string())
    };
    match cli.command {
        Command::Status => show(&endpoint()?, "/api/status", cli.json, cli::status).await,
        Command::Queues => show(&endpoint()?, "/api/queues", cli.json, cli::queues).await,
        Command::Connections => {
            show(&endpoint()?, "/api/connections", cli.json, cli::connections).await
        }
        Command::Exchanges => show(&endpoint()?, "/api/status", cli.json, cli::exchanges).await,
        Command::Purge { queue } => {
            change(&broker()?, &format!("purge_queue {queue}"), cli.json).await
        }
        Command::Delete {
            what: Deletable::Queue { name },
        } => change(&broker()?, &format!("delete_queue {name}"), cli.json).await,
        Command::Delete {
            what: Deletable::Exchange { name },
        } => change(&broker()?, &format!("delete_exchange {name}"), cli.json).await,
        Command::Unbind {
            queue,
            exchange,
            routing_key,
        } => {
            let line = format!("unbind {queue} {exchange} {routing_key}");
            change(&broker()?, &line, cli.json).await
        }
        Command::Close { client_id } => {
            change(
                &broker()?,
                &format!("close_connection {client_id}"),
                cli.json,
            )
            .await
        }
        Command::Reload => reload(&endpoint()?, cli.json).await,
        Command::Dashboard { listen } => {
            let endpoint = endpoint()?;
            let address = endpoint.address().to_owned();
            let proxy = DashboardProxy::bind(listen, endpoint)
                .await
                .map_err(|e| e.to_string())?;
            eprintln!(
                "dashboard: http://{}/ (reading {address} as {}; Ctrl-C stops)",
                proxy.local_addr(),
                cli.cert.display()
            );
            tokio::select! {
                () = proxy.serve() => Ok(()),
                _ = tokio::signal::ctrl_c() => Ok(()),
            }
        }
    }
}

/// `GET path` on the endpoint, printed as JSON or through `render`.
async fn show(
    endpoint: &AdminEndpoint,
    path: &str,
    json: bool,
    render: fn(&Value) -> String,
) -> Result<(), String> {
    let doc = get_json(endpoint, Method::GET, path).await?;
    if json {
        out(&format!("{doc:#}\n"))
    } else {
        out(&render(&doc))
    }
}

/// Writes a report to stdout. A reader that stopped reading (`| head`,
/// `| grep -q`) is not a failure: the command has done its work.
fn out(text: &str) -> Result<(), String> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write to stdout: {e}"))
        }
        _ => Ok(()),
    }
}

/// `method path` on the endpoint, whose answer must be a 2xx JSON document.
async fn get_json(endpoint: &AdminEndpoint, method: Method, path: &str) -> Result<Value, String> {
    let response = endpoint.request(method.clone(), path).await?;
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let doc: Value = serde_json::from_slice(&body).map_err(|_| {
        format!(
            "{method} {path}: HTTP {status}, not JSON: {}",
            String::from_utf8_lossy(&body).trim()
        )
    })?;
    if !status.is_success() {
        let why = doc["error"]
            .as_str()
            .map_or_else(|| doc.to_string(), str::to_owned);
        let hint = if status == hyper::StatusCode::FORBIDDEN {
            " (is the certificate's CN in acl.admin_cns, or acl.monitor_cns for reading?)"
        } else {
            ""
        };
        return Err(format!("{method} {path}: HTTP {status}: {why}{hint}"));
    }
    Ok(doc)
}

/// Sends one `ciphermq/1` command; the broker's `OK …` reply is success,
/// anything else (an `Error:` or `Access denied:` line) a failure.
async fn change(broker: &BrokerPort, line: &str, json: bool) -> Result<(), String> {
    let reply = broker.command(line).await?;
    let ok = reply.starts_with("OK ");
    if json {
        let doc = serde_json::json!({ "command": line, "ok": ok, "reply": reply });
        out(&format!("{doc}\n"))?;
    } else if ok {
        out(&format!("{reply}\n"))?;
    }
    if ok {
        Ok(())
    } else {
        Err(reply)
    }
}

/// `POST /api/reload`.
async fn reload(endpoint: &AdminEndpoint, json: bool) -> Result<(), String> {
    let doc = get_json(endpoint, Method::POST, "/api/reload").await?;
    if json {
        out(&format!("{doc:#}\n"))
    } else {
        out(&format!(
            "{}\n",
            doc["status"].as_str().unwrap_or("reloaded")
        ))
    }
}
