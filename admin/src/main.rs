//! `ciphermq-admin`: the operator's tool for a running broker.
//!
//! It reads through the admin endpoint (`status`, `queues`, `connections`,
//! `exchanges`, the live web `dashboard`) and reloads the broker's config
//! through it too (`reload`, `POST /api/reload`); it changes queues,
//! bindings and connections, and moves owners between cluster nodes,
//! through the broker port in `ciphermq/1` (`purge`, `delete`, `unbind`,
//! `close`, `move`; `drain` reads `/api/cluster` and sends a `move` per
//! owner). Both over mutual TLS with an admin certificate (reading also
//! works with a monitor's). `--config` takes the addresses and the CA from
//! the broker's own config file. `--endpoint` and `--broker` may list
//! several addresses (a cluster's nodes): each request goes to the first
//! that can be reached, and a request that reached one is never resent.

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ciphermq_admin::command_line::{check_node_id, ArgumentError, CommandLine};
use ciphermq_admin::dashboard_proxy::DashboardProxy;
use ciphermq_admin::remote::{Addresses, AdminEndpoint, BrokerPort, Credentials, RemoteError};
use clap::{Parser, Subcommand};
use cli::broker_file::{
    BrokerFile, DEFAULT_BROKER, DEFAULT_CA, DEFAULT_CERT, DEFAULT_ENDPOINT, DEFAULT_KEY,
};
use cli::moves::Drain;
use hyper::Method;
use serde_json::Value;

/// The environment variable naming a default `--config` file, so a shell
/// or a host that always talks to one broker names its file once.
const CONFIG_VAR: &str = "CIPHERMQ_ADMIN_CONFIG";

/// Which commands go where, at the end of `--help`.
const WHERE_COMMANDS_GO: &str = "\
Where each command goes (both over mutual TLS, with --cert and --key):
  the admin endpoint (--endpoint, the broker's admin.address):
      status, queues, connections, nodes, exchanges, reload, dashboard
    The broker serves it only with `[admin] enabled = true` in its config file
    (off by default), from its start: a reload does not start it.
  the broker port (--broker, the broker's server.address), in ciphermq/1:
      purge, delete, unbind, close, move
  both: drain (reads /api/cluster, then sends one `move` per owner)

--endpoint and --broker take one HOST:PORT or several separated by commas, such
as the nodes of a cluster (--broker 10.0.0.1:5700,10.0.0.2:5700). Each request
goes to the first that accepts the connection (TCP and TLS handshake); one
that cannot be reached is skipped. A request that reached a node is never sent
to another, even when it failed there: a move or a purge runs at most once.

--config (or CIPHERMQ_ADMIN_CONFIG) names the broker's config.toml, from which
the addresses and the CA are read; flags given explicitly win over it.";

/// Operate a CipherMQ broker: read it (and reload its config) through its
/// admin endpoint, change queues, bindings and connections, and move owners
/// between cluster nodes, through its client port.
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
    /// status, queues, connections, nodes, exchanges, reload, dashboard and
    /// drain; or several, separated by commas (the nodes of a cluster), of
    /// which each request goes to the first that can be reached (the
    /// dashboard keeps the first that answered at its start).
    /// Default: admin.address of --config, else 127.0.0.1:9091.
    #[arg(long, global = true, value_name = "HOST:PORT[,...]")]
    endpoint: Option<Addresses>,
    /// The broker's client port, `host:port` (`server.address`), for purge,
    /// delete, unbind, close, move and drain; or several, separated by
    /// commas, of which each command goes to the first that can be reached,
    /// and only to it. Default: server.address of --config, else
    /// 127.0.0.1:5700.
    #[arg(long, global = true, value_name = "HOST:PORT[,...]")]
    broker: Option<Addresses>,
    /// The name the broker's certificate carries, at every address;
    /// default: the host of the address connected to.
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
    /// Move an owner, with its queues and messages, to another cluster node
    /// (broker port of any node).
    ///
    /// Sends `move <owner> <node_id>` to the broker port (--broker) and
    /// waits up to 60 s for the broker's answer, which comes once the move
    /// has ended (or was given up: the owner then stays where it was).
    /// Prints `moved <owner> to <node_id> (<host:port>), epoch <n>`.
    Move {
        /// The owner: a receiver's CN, or the CN that declared an admin
        /// queue (`ciphermq-admin nodes --json` lists where each lives).
        owner: String,
        /// The live node to move it to (`ciphermq-admin nodes`).
        node_id: String,
    },
    /// Move every owner off a cluster node, to the other live nodes in turn
    /// (admin endpoint and broker port).
    ///
    /// Reads `GET /api/cluster` from the admin endpoint (--endpoint) for the
    /// node's owners and the live nodes, then sends one `move <owner>
    /// <node>` at a time to the broker port (--broker), round robin over
    /// the other live nodes in node-id order; reads the list again until
    /// none of the node's owners is left to try. A failed move is reported
    /// and the drain goes on (it stops if the broker port stops answering);
    /// the exit status is non-zero if any failed. Prints a line per owner
    /// moved and `drained <node_id>: <n> owners moved`.
    Drain {
        /// The live node to empty.
        node_id: String,
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
    /// `move` on the broker port, its success said in words.
    Move(CommandLine),
    /// `drain` of this node.
    Drain(String),
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
            Command::Move { owner, node_id } => {
                Plan::Move(CommandLine::move_owner(owner, node_id)?)
            }
            Command::Drain { node_id } => {
                check_node_id(node_id)?;
                Plan::Drain(node_id.clone())
            }
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
        Plan::Change(line) => change(&target, &line, json, str::to_owned).await,
        Plan::Move(line) => change(&target, &line, json, cli::moves::moved).await,
        Plan::Drain(node) => drain(&target, &node, json).await,
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
    endpoint: Option<Addresses>,
    /// `--broker`, when given.
    broker: Option<Addresses>,
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

    /// The admin endpoint: `--endpoint`'s addresses, else the file's one.
    fn endpoint(&self) -> Result<AdminEndpoint, String> {
        let addresses = match (&self.endpoint, &self.file) {
            (Some(addresses), _) => addresses.clone(),
            (None, Some(file)) => Addresses::one(&file.endpoint().map_err(|e| e.to_string())?),
            (None, None) => Addresses::one(DEFAULT_ENDPOINT),
        };
        AdminEndpoint::any_of(
            &addresses,
            self.server_name.as_deref(),
            self.credentials.clone(),
        )
        .map_err(|e| e.to_string())
    }

    /// The broker port: `--broker`'s addresses, else the file's one.
    fn broker(&self) -> Result<BrokerPort, String> {
        let addresses = match (&self.broker, &self.file) {
            (Some(addresses), _) => addresses.clone(),
            (None, Some(file)) => Addresses::one(&file.broker().map_err(|e| e.to_string())?),
            (None, None) => Addresses::one(DEFAULT_BROKER),
        };
        BrokerPort::any_of(
            &addresses,
            self.server_name.as_deref(),
            self.credentials.clone(),
        )
        .map_err(|e| e.to_string())
    }

    /// `e` from the admin endpoint, with what to do when nothing listened
    /// (at any of its addresses).
    fn endpoint_failed(&self, e: &RemoteError) -> String {
        if !e.is_refused() {
            return e.to_string();
        }
        let file = self.file.as_ref().filter(|_| self.endpoint.is_none());
        format!("{e}\n{}", cli::hints::endpoint_refused(file))
    }

    /// `e` from the broker port, with what to do when nothing listened (at
    /// any of its addresses).
    fn broker_failed(&self, e: &RemoteError) -> String {
        if !e.is_refused() {
            return e.to_string();
        }
        let file = self.file.as_ref().filter(|_| self.broker.is_none());
        format!("{e}\n{}", cli::hints::broker_refused(file))
    }
}

/// Serves the dashboard until Ctrl-C, reading the first endpoint address
/// that answers `/health` at the start, so the page shows one node
/// throughout; says at once when none can be reached (the page would only
/// show the error), and serves anyway, from every address in turn: the
/// broker may come up later.
async fn dashboard(target: &Target, listen: SocketAddr) -> Result<(), String> {
    let endpoint = target.endpoint()?;
    let endpoint = match endpoint.reachable("/health").await {
        Ok(reached) => reached,
        Err(e) => {
            eprintln!("ciphermq-admin: warning: {}", target.endpoint_failed(&e));
            endpoint
        }
    };
    let address = endpoint.address().to_owned();
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

/// Sends one `ciphermq/1` command; the broker's `OK …` reply is success
/// (printed through `render`), anything else (an `Error:` or `Access
/// denied:` line) a failure.
async fn change(
    target: &Target,
    line: &CommandLine,
    json: bool,
    render: fn(&str) -> String,
) -> Result<(), String> {
    let broker = target.broker()?;
    let reply = send(target, &broker, line).await.map_err(|e| e.message)?;
    let ok = reply.starts_with("OK ");
    if json {
        let doc = serde_json::json!({ "command": line.as_str(), "ok": ok, "reply": reply });
        out(&format!("{doc}\n"))?;
    } else if ok {
        out(&format!("{}\n", render(&reply)))?;
    }
    if ok {
        Ok(())
    } else {
        Err(reply)
    }
}

/// A command that got no reply line: why, and whether the broker is gone
/// (nothing listens, it did not answer in time, or none of its addresses
/// could be reached), so that a drain stops rather than wait for it once
/// per owner.
struct NoReply {
    /// What failed, with the hint for a refused connection.
    message: String,
    /// Nothing listens, or no answer came in time.
    gone: bool,
}

/// Sends `line` and returns the broker's reply line, waiting as long as
/// the line's reply may take; `Err` when none came, saying why.
async fn send(target: &Target, broker: &BrokerPort, line: &CommandLine) -> Result<String, NoReply> {
    broker
        .command_within(line.as_str(), line.reply_within())
        .await
        .map_err(|e| {
            let mut message = target.broker_failed(&e);
            if e.is_timeout() && line.as_str().starts_with("move ") {
                message.push_str(
                    " (the move may still end: `ciphermq-admin nodes --json` shows where the \
                     owner lives)",
                );
            }
            NoReply {
                message,
                gone: e.is_refused() || e.is_timeout() || e.is_unreached(),
            }
        })
}

/// Moves every owner off `node`: reads `/api/cluster`, moves the owners
/// it lists there one at a time, and reads again until none is left to
/// try or a pass moved none. Prints a line per owner moved and a summary;
/// `Err` if any move failed or an owner was left.
async fn drain(target: &Target, node: &str, json: bool) -> Result<(), String> {
    let broker = target.broker()?;
    let mut drain = Drain::new(node);
    let passes = drain_passes(target, &broker, &mut drain, json).await;
    if passes.is_err() && !drain.started() {
        // Refused before any move (not a live node, nowhere to go, the
        // endpoint unreachable): no summary of nothing.
        return passes;
    }
    if json {
        let doc = serde_json::json!({
            "drained": drain.node(),
            "moved": drain.moved_count(),
            "failed": drain.failures(),
        });
        out(&format!("{doc}\n"))?;
    } else {
        out(&format!("{}\n", drain.summary()))?;
    }
    passes?;
    drain.outcome().map_err(|e| e.to_string())
}

/// The passes of a drain: each reads `/api/cluster` and tries the owners
/// it lists on the node that were not tried yet. Stops when a read lists
/// none, when a pass moved none (after one more read, to tell a failed
/// move from one whose reply was lost), or when the broker is gone (the
/// moves left would only wait for it in turn).
async fn drain_passes(
    target: &Target,
    broker: &BrokerPort,
    drain: &mut Drain,
    json: bool,
) -> Result<(), String> {
    loop {
        let doc = get_json(target, Method::GET, "/api/cluster").await?;
        let moves = drain.pass(&doc).map_err(|e| e.to_string())?;
        if moves.is_empty() {
            return Ok(());
        }
        let mut moved = 0usize;
        for m in moves {
            let line = match CommandLine::move_owner(&m.owner, &m.to) {
                Ok(line) => line,
                Err(e) => {
                    eprintln!("ciphermq-admin: {} not moved to {}: {e}", m.owner, m.to);
                    drain.failed(&m.owner);
                    continue;
                }
            };
            let reply = match send(target, broker, &line).await {
                Ok(reply) => reply,
                Err(NoReply { message, gone }) => {
                    drain.failed(&m.owner);
                    if gone {
                        return Err(format!("{line}: no reply: {message}; the drain stopped"));
                    }
                    if json {
                        let doc = serde_json::json!({
                            "command": line.as_str(), "ok": false, "reply": null, "error": message,
                        });
                        out(&format!("{doc}\n"))?;
                    } else {
                        eprintln!("ciphermq-admin: {line}: no reply: {message}");
                    }
                    continue;
                }
            };
            let ok = reply.starts_with("OK ");
            if json {
                let doc = serde_json::json!({ "command": line.as_str(), "ok": ok, "reply": reply });
                out(&format!("{doc}\n"))?;
            }
            if ok {
                moved += 1;
                drain.moved();
                if !json {
                    out(&format!("{}\n", cli::moves::moved(&reply)))?;
                }
            } else {
                drain.failed(&m.owner);
                if !json {
                    eprintln!("ciphermq-admin: {line}: {reply}");
                }
            }
        }
        if moved == 0 {
            if let Ok(doc) = get_json(target, Method::GET, "/api/cluster").await {
                drain.look(&doc);
            }
            return Ok(());
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The plan of `ciphermq-admin <args>`, or the refusal of its arguments.
    fn plan(args: &[&str]) -> Result<Plan, ArgumentError> {
        let cli =
            Cli::try_parse_from(std::iter::once("ciphermq-admin").chain(args.iter().copied()))
                .expect("clap accepts the arguments");
        cli.command.plan()
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(
            help.contains("move") && help.contains("drain") && help.contains("close, move"),
            "{help}"
        );
    }

    #[test]
    fn move_sends_one_checked_line_and_waits_for_the_moves_end() {
        match plan(&["move", "receiver_1", "node-b"]) {
            Ok(Plan::Move(line)) => {
                assert_eq!(line.as_str(), "move receiver_1 node-b");
                assert_eq!(
                    line.reply_within(),
                    ciphermq_admin::command_line::MOVE_TIMEOUT
                );
            }
            _ => panic!("not a move"),
        }
        // Global flags may follow it, as with every subcommand.
        assert!(matches!(
            plan(&["move", "receiver_1", "node-b", "--json"]),
            Ok(Plan::Move(_))
        ));
        let e = plan(&["move", "receiver_1 node-a", "node-b"])
            .err()
            .unwrap();
        assert_eq!(e.what, "owner");
        let e = plan(&["move", "receiver_1", "node-b\nclose_connection admin"])
            .err()
            .unwrap();
        assert_eq!(e.what, "node id");
        // Both arguments are required.
        let missing = Cli::try_parse_from(["ciphermq-admin", "move", "receiver_1"]).unwrap_err();
        assert_eq!(
            missing.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn endpoint_and_broker_take_a_list_checked_before_anything_is_sent() {
        let cli = Cli::try_parse_from([
            "ciphermq-admin",
            "--broker",
            "127.0.0.1:5700, 127.0.0.1:5701",
            "close",
            "sender_1",
            "--endpoint",
            "127.0.0.1:9091",
        ])
        .unwrap();
        let broker = cli.broker.unwrap();
        assert_eq!(broker.as_slice(), ["127.0.0.1:5700", "127.0.0.1:5701"]);
        assert_eq!(cli.endpoint.unwrap().as_slice(), ["127.0.0.1:9091"]);
        for (flag, bad, why) in [
            ("--broker", "", "no address given"),
            (
                "--broker",
                "127.0.0.1:5700,,127.0.0.1:5701",
                "address 2 of 3 is empty",
            ),
            ("--endpoint", "127.0.0.1:9091,", "address 2 of 2 is empty"),
            ("--endpoint", " , ", "address 1 of 2 is empty"),
            (
                "--broker",
                "127.0.0.1:5700 127.0.0.1:5701",
                "holds whitespace",
            ),
        ] {
            let e = Cli::try_parse_from(["ciphermq-admin", flag, bad, "status"]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
            let message = e.to_string();
            assert!(
                message.contains(flag) && message.contains(why),
                "{bad:?}: {message}"
            );
        }
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("several separated by commas"), "{help}");
    }

    #[test]
    fn drain_checks_its_node_id_before_reading_anything() {
        match plan(&["drain", "node-a"]) {
            Ok(Plan::Drain(node)) => assert_eq!(node, "node-a"),
            _ => panic!("not a drain"),
        }
        for bad in ["", "node a", "node-a\nmove r node-b", ".."] {
            let e = plan(&["drain", bad]).err().unwrap();
            assert_eq!(e.what, "node id", "{bad:?}");
        }
        let missing = Cli::try_parse_from(["ciphermq-admin", "drain"]).unwrap_err();
        assert_eq!(
            missing.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }
}
