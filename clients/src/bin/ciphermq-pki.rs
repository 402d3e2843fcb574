//! `ciphermq-pki`: the certificates and keys a CipherMQ deployment needs (a thin
//! shell over [`ciphermq_clients::pki`]).
//!
//! `init` makes the CA, the server certificate and `aes.key`; `issue` and
//! `receiver` add clients; `list` shows what exists; `revoke` keeps the CA's
//! revocation list. Without a command it makes
//! what the demo needs (init plus five clients). Nothing that exists is replaced
//! unless `--force` (certificates) or `--force-ca` (the CA) says so.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use ciphermq_clients::pki::{self, PkiOptions, PkiReport};
use clap::{Args, Parser, Subcommand};

/// Clients issued by a run without a command and without `--client`/`--receiver`:
/// the demo set.
const DEMO_CLIENTS: [&str; 5] = ["admin", "sender_1", "sender_2", "receiver_1", "receiver_2"];

/// Receivers given X25519 key pairs in the demo set.
const DEMO_RECEIVERS: [&str; 2] = ["receiver_1", "receiver_2"];

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "ciphermq-pki",
    version,
    about = "Create and inspect the CipherMQ CA, server and client certificates, receivers' X25519 keys and the broker's AES key, and revoke certificates",
    long_about = "Create and inspect the CipherMQ CA, server and client certificates, receivers' X25519 keys and the broker's AES key.\n\n\
        Layout: certs/ (ca.crt, server.crt/.key, CN.crt/.key, aes.key), keys/ (CN_private.key, CN_public.key), \
        ca/ (ca.key alone, mode 0700, apart from the leaf keys).\n\n\
        Nothing that exists is replaced unless asked: --force re-issues certificates, --force-ca replaces the CA; \
        X25519 keys and aes.key are never overwritten.\n\n\
        Without a command: `init` plus the demo clients admin, sender_1, sender_2, receiver_1, receiver_2 \
        (receiver_1 and receiver_2 with X25519 keys), or the clients named by --client and --receiver; \
        whatever exists is kept, so it can be run again."
)]
struct Cli {
    /// Where the files go (every command).
    #[command(flatten)]
    dirs: Dirs,
    /// What to do; none: init plus the demo clients.
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a command: the init options and the clients to make.
    #[command(flatten, next_help_heading = "Without a command (init plus clients)")]
    demo: DemoArgs,
}

/// Directories and lifetime, accepted before or after the command.
#[derive(Debug, Args)]
struct Dirs {
    /// Directory of ca.crt, the server and client certificates and keys, and aes.key.
    #[arg(long, value_name = "DIR", default_value = "certs", global = true)]
    out: PathBuf,
    /// Directory of the receivers' X25519 key pairs.
    #[arg(long, value_name = "DIR", default_value = "keys", global = true)]
    keys: PathBuf,
    /// Directory of the CA's private key, apart from the leaf keys (default: ca beside --out
    /// when --out is named certs, else OUT-ca beside it).
    #[arg(long, value_name = "DIR", global = true)]
    ca_dir: Option<PathBuf>,
    /// Lifetime of the certificates issued, in days.
    #[arg(long, value_name = "DAYS", default_value_t = pki::DEFAULT_VALIDITY_DAYS,
          value_parser = clap::value_parser!(u32).range(1..), global = true)]
    days: u32,
}

/// The commands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Create the CA, the server certificate and aes.key; keep whatever exists.
    ///
    /// Run twice, it changes nothing. If the server certificate exists but lacks a
    /// --san name, it refuses; --force re-issues it with its old names plus the new
    /// ones (to drop a name, delete certs/server.crt and certs/server.key first).
    Init(InitArgs),
    /// Issue a client certificate for each CN, signed by the CA.
    ///
    /// A CN that has a certificate is refused unless --force. The CN is the identity
    /// the broker's ACL sees: [A-Za-z0-9_.:-]{1,255}, not ca, server or aes.
    Issue(IssueArgs),
    /// Issue a receiver: a client certificate plus an X25519 key pair for end-to-end
    /// encryption (keys/CN_private.key, keys/CN_public.key).
    ///
    /// Refused if both exist, unless --force (which re-issues the certificate; an
    /// existing key pair is always kept: delete both key files to make a new one).
    Receiver(IssueArgs),
    /// Show the CA, the server certificate (names, expiry), each client certificate
    /// (CN, expiry, X25519 keys) and anything wrong with them.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke client certificates: add them to certs/ca.crl, the CA's revocation
    /// list (the broker's tls.crl_path), re-signed; without a CN, renew the list
    /// (or write an empty one to start with).
    ///
    /// Then reload the broker (`systemctl reload ciphermq`, `ciphermq-admin reload`
    /// or SIGHUP): handshakes with a listed certificate fail, and its open sessions
    /// are closed. The certificate files stay where they are.
    Revoke(RevokeArgs),
}

/// Options of `revoke`.
#[derive(Debug, Args)]
struct RevokeArgs {
    /// Client CNs whose certificates (certs/CN.crt) to revoke.
    #[arg(value_name = "CN")]
    cns: Vec<String>,
    /// Days until the list's nextUpdate: renew it (`ciphermq-pki revoke`) before then.
    #[arg(long, value_name = "DAYS", default_value_t = pki::DEFAULT_CRL_DAYS,
          value_parser = clap::value_parser!(u32).range(1..))]
    next_update_days: u32,
}

/// Options of `init`.
#[derive(Debug, Args)]
struct InitArgs {
    /// Extra name of the broker (DNS name or IP address) beyond localhost, 127.0.0.1 and ::1; repeatable.
    #[arg(long = "san", value_name = "HOST")]
    sans: Vec<String>,
    /// Re-issue the server certificate (and, without a command, the clients named)
    /// even if it exists: renewal, or new --san names (kept with the old ones).
    #[arg(long)]
    force: bool,
    /// Replace an existing CA (every certificate it issued stops being trusted).
    #[arg(long)]
    force_ca: bool,
}

/// Options of `issue` and `receiver`.
#[derive(Debug, Args)]
struct IssueArgs {
    /// Client CNs.
    #[arg(value_name = "CN", required = true)]
    cns: Vec<String>,
    /// Re-issue a certificate that exists (the old one stays valid until it expires).
    #[arg(long)]
    force: bool,
}

/// The options of a run without a command.
#[derive(Debug, Args)]
struct DemoArgs {
    /// As for `init`.
    #[command(flatten)]
    init: InitArgs,
    /// Without a command: issue a client certificate for this CN instead of the demo
    /// set; repeatable.
    #[arg(long = "client", value_name = "CN")]
    clients: Vec<String>,
    /// Without a command: issue a client certificate and an X25519 key pair for this
    /// CN instead of the demo set; repeatable.
    #[arg(long = "receiver", value_name = "CN")]
    receivers: Vec<String>,
}

impl DemoArgs {
    /// Whether any of these options was given.
    fn is_used(&self) -> bool {
        !self.init.sans.is_empty()
            || self.init.force
            || self.init.force_ca
            || !self.clients.is_empty()
            || !self.receivers.is_empty()
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the whole cause chain on one line, path included.
            eprintln!("ciphermq-pki: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command and prints its outcome.
fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.command.is_some() && cli.demo.is_used() {
        anyhow::bail!(
            "--san, --force, --force-ca, --client and --receiver before a command apply to a run without one; put them after the command (`ciphermq-pki init --san HOST`, `ciphermq-pki issue CN`)"
        );
    }
    let mut opts = PkiOptions::new(cli.dirs.out, cli.dirs.keys);
    opts.ca_dir = cli.dirs.ca_dir;
    opts.validity_days = cli.dirs.days;
    match cli.command {
        None => {
            let demo = cli.demo;
            let (mut clients, receivers) = if demo.clients.is_empty() && demo.receivers.is_empty() {
                (
                    DEMO_CLIENTS.map(String::from).to_vec(),
                    DEMO_RECEIVERS.map(String::from).to_vec(),
                )
            } else {
                (demo.clients, demo.receivers)
            };
            // Receivers connect with a certificate too.
            for receiver in &receivers {
                if !clients.contains(receiver) {
                    clients.push(receiver.clone());
                }
            }
            opts.client_cns = clients;
            opts.receiver_cns = receivers;
            init(opts, demo.init)
        }
        Some(Command::Init(args)) => init(opts, args),
        Some(Command::Issue(args)) => {
            opts.client_cns = args.cns;
            opts.force = args.force;
            let report = pki::issue(&opts).context("cannot issue")?;
            print_report(&report)
        }
        Some(Command::Receiver(args)) => {
            opts.receiver_cns = args.cns;
            opts.force = args.force;
            let report = pki::issue(&opts).context("cannot issue the receiver")?;
            print_report(&report)
        }
        Some(Command::Revoke(args)) => {
            let report = pki::revoke(&opts, &args.cns, args.next_update_days)
                .context("cannot write the revocation list")?;
            print(&report.to_string())?;
            if !report.added.is_empty() {
                eprintln!(
                    "ciphermq-pki: the broker applies it once tls.crl_path names {} and it reloads (systemctl reload ciphermq, ciphermq-admin reload, or SIGHUP)",
                    report.crl.path.display()
                );
            }
            Ok(())
        }
        Some(Command::List { json }) => {
            let inventory = pki::inventory(&opts).context("cannot list the PKI")?;
            for warning in &inventory.warnings {
                eprintln!("ciphermq-pki: warning: {warning}");
            }
            let text = if json {
                let mut text = serde_json::to_string_pretty(&inventory)?;
                text.push('\n');
                text
            } else {
                inventory.to_string()
            };
            print(&text)
        }
    }
}

/// `init` (also the first half of a run without a command).
fn init(mut opts: PkiOptions, args: InitArgs) -> anyhow::Result<()> {
    opts.server_sans = args.sans;
    opts.force = args.force;
    opts.force_ca = args.force_ca;
    let report = pki::generate(&opts).with_context(|| {
        format!(
            "cannot complete the PKI in {} and {}",
            opts.out_dir.display(),
            opts.keys_dir.display()
        )
    })?;
    print_report(&report)
}

/// The report on stdout, its warnings on stderr.
fn print_report(report: &PkiReport) -> anyhow::Result<()> {
    for warning in &report.warnings {
        eprintln!("ciphermq-pki: warning: {warning}");
    }
    print(&report.to_string())
}

/// Writes to stdout; a closed stdout (`| head`) is not a failure: the files are
/// written.
fn print(text: &str) -> anyhow::Result<()> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("writing the report"),
        _ => Ok(()),
    }
}
