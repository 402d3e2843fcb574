//! `ciphermq-admin`: the operator's tool for a running broker.
//!
//! It reads through the admin endpoint (`status`, `queues`, `connections`,
//! `exchanges`, the live web `dashboard`) and reloads the broker's config
//! through it too (`reload`, `POST /api/reload`); it changes queues,
//! bindings and connections through the broker port in `ciphermq/1`
//! (`purge`, `delete`, `unbind`, `close`). Both over mutual TLS with an
//! admin certificate (reading also works with a monitor's). `--config`
//! takes the addresses and the CA from the broker's own config file.

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ciphermq_admin::command_line::{ArgumentError, CommandLine};
use ciphermq_admin::dashboard_proxy::DashboardProxy;
use ciphermq_admin::remote::{host_of, AdminEndpoint, BrokerPort, Credentials, RemoteError};
use clap::{Parser, Subcommand};
use cli::broker_file::{
    BrokerFile, DEFAULT_BROKER, DEFAULT_CA, DEFAULT_CERT, DEFAULT_ENDPOINT, DEFAULT_KEY,
};
use hyper::Method;
use serde_json::Value;

/// The environment variable naming a default `--config` file, so a shell
/// or a host that always talks to one broker names its file once.
const CONFIG_VAR: &str = "CIPHERMQ_ADMIN_CONFIG";

/// Which commands go where, at the end of `--help`.
const WHERE_COMMANDS_GO: &str = "\
Where each command goes (both over mutual TLS, with --cert and --key):
  the admin endpoint (--endpoint, the broker's admin.address):
      status, queues, connections, exchanges, reload, dashboard
    The broker serves it only with `[admin] enabled = true` in its config file
    (off by default), from its start: a reload does not start it.
  the broker port (--broker, the broker's server.address), in ciphermq/1:
      purge, delete, unbind, close

--config (or CIPHERMQ_ADMIN_CONFIG) names the broker's config.toml, from which
the addresses and the CA are read; flags given explicitly win over it.";

/// Operate a CipherMQ broker: read it (and reload its config) through its
/// admin endpoint, change queues, bindings and connections through its
/// client port.
#[derive(Debug, Parser)]
#[command(name = "ciphermq-admin", version, after_help = WHERE_COMMANDS_GO)]
struct Cli {
    /// The broker's config file (its config.toml), read for `admin.address`
    /// (--endpoint), `server.address` (--broker) and `tls.ca_cert_path`
    /// (--ca); --cert and --key then default to certs/admin.crt and
    /// certs/admin.key beside it. Relative paths are resolved against its
    /// directory, as the broker resolves them; other keys are ignored.
    /// Default: the CIPHERMQ_ADMIN_CONFIG environment variable, when set
    /// and not empty.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The admin endpoint, `host:port` (the broker's `admin.address`), for
    /// status, queues, connections, exchanges, reload and dashboard.
    /// Default: admin.address of --config, else 127.0.0.1:9091.
    #[arg(long, global = true, value_name = "HOST:PORT")]
    endpoint: Option<String>,
    /// The broker's client port, `host:port` (`server.address`), for purge,
    /// delete, unbind and close. Default: server.address of --config, else
    /// 127.0.0.1:5700.
    #[arg(long, global = true, value_name = "HOST:PORT")]
    broker: Option<String>,
    /// The name the broker's certificate carries; default: the host of the
    /// address connected to.
    #[arg(long, global = true)]
    server_name: Option<String>,
    /// The CA that signed the broker's certificate. Default:
    /// tls.ca_cert_path of --config, else certs/ca.crt.
    #[arg(long, global = true, value_name = "PATH")]
    ca: Option<PathBuf>,
    /// An admin client certificate (`acl.admin_cns`); one of
    /// `acl.monitor_cns` may read but not change anything. Default:
    /// certs/admin.crt (beside the --config file, with one).
    #[arg(long, global = true, value_name = "PATH")]
    cert: Option<PathBuf>,
    /// Its private key. Default: certs/admin.key (beside the --config file,
    /// with one).
    #[arg(long, global = true, value_name = "PATH")]
    key: Option<PathBuf>,
    /// Print the endpoint's JSON (or the broker's reply as JSON) instead of
    /// tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Health, readiness and warnings, counters, storage, the mirror (admin
    /// endpoint).
    ///
    /// Reads `GET /api/status` from the admin endpoint (--endpoint).
    Status,
    /// Every queue: owner, shard, ready, unacked, consumers, bytes (admin
    /// endpoint).
    ///
    /// Reads `GET /api/queues` from the admin endpoint (--endpoint).
    Queues,
    /// Open connections by CN and by IP (admin endpoint).
    ///
    /// Reads `GET /api/connections` from the admin endpoint (--endpoint).
    Connections,
    /// The cluster's live nodes: address, heartbeat age, owners (admin
    /// endpoint of any node).
    ///
    /// Reads `GET /api/cluster` from the admin endpoint (--endpoint).
    Nodes,
    /// Exchanges and their bindings (admin endpoint).
    ///
    /// Reads `GET /api/status` from the admin endpoint (--endpoint).
    Exchanges,
    /// Drop a queue's ready messages; unacked deliveries stay owed (broker
    /// port).
    ///
    /// Sends `purge_queue <queue>` to the broker port (--broker).
    Purge {
        /// The queue.
        queue: String,
    },
    /// Delete a queue with its messages and bindings, or an exchange with
    /// its bindings (broker port).
    ///
    /// Sends `delete_queue` or `delete_exchange` to the broker port
    /// (--broker).
    Delete {
        #[command(subcommand)]
        what: Deletable,
    },
    /// Remove one binding (broker port).
    ///
    /// Sends `unbind <queue> <exchange> <routing_key>` to the broker port
    /// (--broker).
    Unbind {
        /// The bound queue.
        queue: String,
        /// The exchange.
        exchange: String,
        /// The binding key, as bound.
        routing_key: String,
    },
    /// Close every connection a CN has open (broker port).
    ///
    /// Sends `close_connection <client_id>` to the broker port (--broker).
    Close {
        /// The client's CN.
        client_id: String,
    },
    /// Reload `[acl]`, `[rate_limit]` and `[tls]` from the broker's config
    /// file, as SIGHUP does (admin endpoint).
    ///
    /// Sends `POST /api/reload` to the admin endpoint (--endpoint), admin
    /// certificates only. The broker re-reads the file it was started from
    /// (not the --config given here); `[admin]` and `[server]` changes need
    /// a restart.
    Reload,
    /// Serve the live web dashboard on a loopback address for a browser
    /// (admin endpoint).
    ///
    /// The page polls the admin endpoint (--endpoint) through this process,
    /// which holds the certificate.
    Dashboard {
        /// Where the browser connects: a loopback `ip:port`.
        #[arg(long, default_value = "127.0.0.1:9095")]
        listen: SocketAddr,
    },
}

#[derive(Debug, Subcommand)]
enum Deletable {
    /// A queue (`delete_queue`, broker port).
    Queue {
        /// Its name.
        name: String,
    },
    /// An exchange (`delete_exchange`, broker port).
    Exchange {
        /// Its name.
        name: String,
    },
}

/// Exit status of a refused argument, as clap's own usage errors: nothing
/// was read, connected or sent.
const EXIT_BAD_ARGUMENT: u8 = 2;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    // Before any file is read or any connection made: an argument that
    // would break its protocol line stops the tool here.
    let plan = match cli.command.plan() {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("ciphermq-admin: {e}; nothing was sent");
            return ExitCode::from(EXIT_BAD_ARGUMENT);
        }
    };
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
    match runtime.block_on(run(&cli, plan)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ciphermq-admin: {message}");
            ExitCode::FAILURE
        }
    }
}

/// What a subcommand does, its arguments checked.
enum Plan {
    /// `GET path` on the admin endpoint, printed through the function.
    Show(&'static str, fn(&Value) -> String),
    /// One command on the broker port.
    Change(CommandLine),
    /// `POST /api/reload`.
    Reload,
    /// The dashboard, served on this address.
    Dashboard(SocketAddr),
}

impl Command {
    /// What the subcommand does; `Err` names an argument that cannot go into
    /// a protocol line (see `ciphermq_admin::command_line`).
    fn plan(&self) -> Result<Plan, ArgumentError> {
        Ok(match self {
            Command::Status => Plan::Show("/api/status", cli::status),
            Command::Queues => Plan::Show("/api/queues", cli::queues),
            Command::Connections => Plan::Show("/api/connections", cli::connections),
            Command::Exchanges => Plan::Show("/api/status", cli::exchanges),
            Command::Nodes => Plan::Show("/api/cluster", cli::nodes),
            Command::Purge { queue } => Plan::Change(CommandLine::purge_queue(queue)?),
            Command::Delete {
                what: Deletable::Queue { name },
            } => Plan::Change(CommandLine::delete_queue(name)?),
            Command::Delete {
                what: Deletable::Exchange { name },
            } => Plan::Change(CommandLine::delete_exchange(name)?),
            Command::Unbind {
                queue,
                exchange,
                routing_key,
            } => Plan::Change(CommandLine::unbind(queue, exchange, routing_key)?),
            Command::Close { client_id } => Plan::Change(CommandLine::close_connection(client_id)?),
            Command::Reload => Plan::Reload,
            Command::Dashboard { listen } => Plan::Dashboard(*listen),
        })
    }
}

async fn run(cli: &Cli, plan: Plan) -> Result<(), String> {
    let target = Target::new(cli)?;
    let json = cli.json;
    match plan {
        Plan::Show(path, render) => show(&target, path, json, render).await,
        Plan::Change(line) => change(&target, &line, json).await,
        Plan::Reload => reload(&target, json).await,
        Plan::Dashboard(listen) => dashboard(&target, listen).await,
    }
}

/// Where the tool connects and as whom: the flags given, else the
/// `--config` file, else the defaults; and where each address came from,
/// for the hint a refused connection gets.
struct Target {
    /// The `--config` file, when one is named.
    file: Option<BrokerFile>,
    /// `--endpoint`, when given.
    endpoint: Option<String>,
    /// `--broker`, when given.
    broker: Option<String>,
    /// `--server-name`, when given.
    server_name: Option<String>,
    /// The certificate file presented, for messages.
    cert: PathBuf,
    /// The certificate, its key and the CA.
    credentials: Credentials,
}

impl Target {
    /// Reads the `--config` file, if any, and the certificates.
    fn new(cli: &Cli) -> Result<Target, String> {
        let named = cli.config.clone().or_else(|| {
            std::env::var_os(CONFIG_VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let file = match &named {
            Some(path) => Some(BrokerFile::read(path).map_err(|e| e.to_string())?),
            None => None,
        };
        let pick = |flag: &Option<PathBuf>, from_file: fn(&BrokerFile) -> &PathBuf, default| {
            flag.clone()
                .or_else(|| file.as_ref().map(|f| from_file(f).clone()))
                .unwrap_or_else(|| PathBuf::from(default))
        };
        let ca = pick(&cli.ca, |f| &f.ca, DEFAULT_CA);
        let cert = pick(&cli.cert, |f| &f.cert, DEFAULT_CERT);
        let key = pick(&cli.key, |f| &f.key, DEFAULT_KEY);
        let credentials = Credentials::from_files(&ca, &cert, &key).map_err(|e| match &file {
            Some(f) => format!(
                "{e} (with --config {}: --ca defaults to its tls.ca_cert_path, --cert and --key \
                 to certs/admin.crt and certs/admin.key beside it; the flags override them)",
                f.path.display()
            ),
            None => e.to_string(),
        })?;
        Ok(Target {
            file,
            endpoint: cli.endpoint.clone(),
            broker: cli.broker.clone(),
            server_name: cli.server_name.clone(),
            cert,
            credentials,
        })
    }

    /// The name the broker's certificate must carry at `address`.
    fn name_for(&self, address: &str) -> String {
        self.server_name
            .clone()
            .unwrap_or_else(|| host_of(address).to_owned())
    }

    /// The admin endpoint.
    fn endpoint(&self) -> Result<AdminEndpoint, String> {
        let address = match (&self.endpoint, &self.file) {
            (Some(address), _) => address.clone(),
            (None, Some(file)) => file.endpoint().map_err(|e| e.to_string())?,
            (None, None) => DEFAULT_ENDPOINT.to_owned(),
        };
        AdminEndpoint::new(&address, &self.name_for(&address), self.credentials.clone())
            .map_err(|e| e.to_string())
    }

    /// The broker port.
    fn broker(&self) -> Result<BrokerPort, String> {
        let address = match (&self.broker, &self.file) {
            (Some(address), _) => address.clone(),
            (None, Some(file)) => file.broker().map_err(|e| e.to_string())?,
            (None, None) => DEFAULT_BROKER.to_owned(),
        };
        BrokerPort::new(&address, &self.name_for(&address), self.credentials.clone())
            .map_err(|e| e.to_string())
    }

    /// `e` from the admin endpoint, with what to do when nothing listened.
    fn endpoint_failed(&self, e: &RemoteError) -> String {
        if !e.is_refused() {
            return e.to_string();
        }
        let file = self.file.as_ref().filter(|_| self.endpoint.is_none());
        format!("{e}\n{}", cli::hints::endpoint_refused(file))
    }

    /// `e` from the broker port, with what to do when nothing listened.
    fn broker_failed(&self, e: &RemoteError) -> String {
        if !e.is_refused() {
            return e.to_string();
        }
        let file = self.file.as_ref().filter(|_| self.broker.is_none());
        format!("{e}\n{}", cli::hints::broker_refused(file))
    }
}

/// Serves the dashboard until Ctrl-C; says at once when the endpoint cannot
/// be reached (the page would only show the error), and serves anyway: the
/// broker may come up later.
async fn dashboard(target: &Target, listen: SocketAddr) -> Result<(), String> {
    let endpoint = target.endpoint()?;
    let address = endpoint.address().to_owned();
    if let Err(e) = endpoint.request(Method::GET, "/health").await {
        eprintln!("ciphermq-admin: warning: {}", target.endpoint_failed(&e));
    }
    let proxy = DashboardProxy::bind(listen, endpoint)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "dashboard: http://{}/ (reading {address} as {}; Ctrl-C stops)",
        proxy.local_addr(),
        target.cert.display()
    );
    tokio::select! {
        () = proxy.serve() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// `GET path` on the endpoint, printed as JSON or through `render`.
async fn show(
    target: &Target,
    path: &str,
    json: bool,
    render: fn(&Value) -> String,
) -> Result<(), String> {
    let doc = get_json(target, Method::GET, path).await?;
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
async fn get_json(target: &Target, method: Method, path: &str) -> Result<Value, String> {
    let response = target
        .endpoint()?
        .request(method.clone(), path)
        .await
        .map_err(|e| target.endpoint_failed(&e))?;
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
async fn change(target: &Target, line: &CommandLine, json: bool) -> Result<(), String> {
    let reply = target
        .broker()?
        .command(line.as_str())
        .await
        .map_err(|e| target.broker_failed(&e))?;
    let ok = reply.starts_with("OK ");
    if json {
        let doc = serde_json::json!({ "command": line.as_str(), "ok": ok, "reply": reply });
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
async fn reload(target: &Target, json: bool) -> Result<(), String> {
    let doc = get_json(target, Method::POST, "/api/reload").await?;
    if json {
        out(&format!("{doc:#}\n"))
    } else {
        out(&format!(
            "{}\n",
            doc["status"].as_str().unwrap_or("reloaded")
        ))
    }
}
