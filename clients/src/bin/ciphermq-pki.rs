//! `ciphermq-pki`: creates the certificates and keys a CipherMQ deployment needs (a
//! thin shell over [`ciphermq_clients::pki`]).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use ciphermq_clients::pki::{self, PkiOptions};
use clap::Parser;

/// Clients issued when neither `--client` nor `--receiver` is given: the demo set.
const DEMO_CLIENTS: [&str; 5] = ["admin", "sender_1", "sender_2", "receiver_1", "receiver_2"];

/// Receivers given X25519 key pairs in the demo set.
const DEMO_RECEIVERS: [&str; 2] = ["receiver_1", "receiver_2"];

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "ciphermq-pki",
    version,
    about = "Create the CipherMQ CA, server and client certificates, receivers' X25519 keys and the broker's AES key",
    long_about = "Create the CipherMQ CA, server and client certificates, receivers' X25519 keys and the broker's AES key.\n\n\
        An existing CA is reused unless --force-ca is given; existing X25519 keys and aes.key are never overwritten; \
        server and client certificates are re-issued on every run. With no --client and no --receiver, the demo set is \
        created: clients admin, sender_1, sender_2, receiver_1, receiver_2 and receivers receiver_1, receiver_2."
)]
struct Args {
    /// Directory for certificates, their keys and aes.key.
    #[arg(long, value_name = "DIR", default_value = "certs")]
    out: PathBuf,
    /// Directory for the receivers' X25519 key pairs.
    #[arg(long, value_name = "DIR", default_value = "keys")]
    keys: PathBuf,
    /// Extra name of the broker (DNS name or IP address) beyond localhost, 127.0.0.1 and ::1; repeatable.
    #[arg(long = "san", value_name = "HOST")]
    sans: Vec<String>,
    /// Issue a client certificate for this CN; repeatable.
    #[arg(long = "client", value_name = "CN")]
    clients: Vec<String>,
    /// Issue a client certificate and an X25519 key pair for this CN; repeatable.
    #[arg(long = "receiver", value_name = "CN")]
    receivers: Vec<String>,
    /// Replace an existing CA (certificates it issued stop being trusted).
    #[arg(long)]
    force_ca: bool,
    /// Lifetime of the server and client certificates, in days.
    #[arg(long, value_name = "DAYS", default_value_t = pki::DEFAULT_VALIDITY_DAYS,
          value_parser = clap::value_parser!(u32).range(1..))]
    days: u32,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the whole cause chain on one line, path included.
            eprintln!("ciphermq-pki: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Applies the demo defaults, generates, and prints the report.
fn run(args: Args) -> anyhow::Result<()> {
    let (mut clients, receivers) = if args.clients.is_empty() && args.receivers.is_empty() {
        (
            DEMO_CLIENTS.map(String::from).to_vec(),
            DEMO_RECEIVERS.map(String::from).to_vec(),
        )
    } else {
        (args.clients, args.receivers)
    };
    // Receivers connect with a certificate too.
    for receiver in &receivers {
        if !clients.contains(receiver) {
            clients.push(receiver.clone());
        }
    }
    let opts = PkiOptions {
        out_dir: args.out,
        keys_dir: args.keys,
        server_sans: args.sans,
        client_cns: clients,
        receiver_cns: receivers,
        force_ca: args.force_ca,
        validity_days: args.days,
    };
    let report = pki::generate(&opts).with_context(|| {
        format!(
            "cannot complete the PKI in {} and {}",
            opts.out_dir.display(),
            opts.keys_dir.display()
        )
    })?;
    // A closed stdout (`| head`) is not a failure: the files are written.
    match io::stdout().lock().write_all(report.to_string().as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("writing the report"),
        _ => Ok(()),
    }
}
