//! `ciphermq-sender` and `ciphermq-receiver` as a newcomer runs them, through
//! the real binaries: a first connection that fails (a mistyped port) is one
//! error naming the address, at once, instead of minutes of retries.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ciphermq_clients::pki::{self, PkiOptions};
use ciphermq_clients::{ReceiverConfig, SenderConfig, TlsConfig};

/// Longest any run of a tool may take: a guard against a hang, never a
/// measure of speed.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Certificates for `sender_1` and `receiver_1` (with its X25519 pair) in `dir`.
fn make_pki(dir: &Path) -> PkiOptions {
    let mut opts = PkiOptions::new(dir.join("certs"), dir.join("keys"));
    opts.client_cns = vec!["sender_1".into(), "receiver_1".into()];
    opts.receiver_cns = vec!["receiver_1".into()];
    pki::generate(&opts).expect("generate PKI");
    opts
}

/// A port nobody listens on: bound, then released.
fn unused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").port()
}

/// A receiver config file for `receiver_1` at `address`, writing to `output`.
fn receiver_json(pki: &PkiOptions, dir: &Path, address: &str, output: &Path) -> PathBuf {
    let mut config = ReceiverConfig::new(address, TlsConfig::for_cn(&pki.out_dir, "receiver_1"));
    config.private_key_path = pki.keys_dir.join("{cn}_private.key");
    config.output_dir = output.to_owned();
    config.reconnect_backoff_ms = 50;
    config.max_backoff_ms = 200;
    let path = dir.join("receiver.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).expect("write config");
    path
}

/// A sender config file for `sender_1` to `receiver_1` at `address`.
fn sender_json(pki: &PkiOptions, dir: &Path, address: &str) -> PathBuf {
    let mut config = SenderConfig::new(address, TlsConfig::for_cn(&pki.out_dir, "sender_1"));
    config.receivers = vec!["receiver_1".into()];
    config.keys_dir = dir.join("sender-keys");
    let path = dir.join("sender.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).expect("write config");
    path
}

/// A tool's command line, without a progress line.
fn tool(name: &str, config: &Path) -> Command {
    let exe = match name {
        "sender" => env!("CARGO_BIN_EXE_ciphermq-sender"),
        _ => env!("CARGO_BIN_EXE_ciphermq-receiver"),
    };
    let mut cmd = Command::new(exe);
    cmd.arg("--config").arg(config).arg("--no-progress");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A running tool whose stderr lines arrive on a channel as they are written.
struct Running {
    child: Child,
    stderr: mpsc::Receiver<String>,
    /// Every stderr line read so far.
    seen: Vec<String>,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd.spawn().expect("start the tool");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Running {
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for the tool to exit (killed and failed past [`HANG_GUARD`]);
    /// its status, stdout and whole stderr.
    fn finish(mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + HANG_GUARD;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the tool") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "the tool still runs after {HANG_GUARD:?}; stderr: {:#?}",
                    self.seen
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut stdout).expect("read stdout");
        }
        // The reader thread ends at EOF, which follows the exit.
        self.seen.extend(self.stderr.iter());
        (status, stdout, self.seen.join("\n"))
    }
}

#[test]
fn a_first_connection_that_fails_is_one_error_naming_the_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    // A mistyped port: nothing listens there.
    let addr = format!("127.0.0.1:{}", unused_port());
    let configs = [
        ("sender", sender_json(&pki, dir.path(), "127.0.0.1:5700")),
        (
            "receiver",
            receiver_json(&pki, dir.path(), "127.0.0.1:5700", &dir.path().join("out")),
        ),
    ];
    for (name, config) in configs {
        let mut cmd = tool(name, &config);
        cmd.args(["--address", &addr]);
        let (status, _, stderr) = Running::start(cmd).finish();
        assert_eq!(status.code(), Some(2), "{name}: {stderr}");
        let expected = format!("ciphermq-{name}: cannot connect to the broker at {addr}: ");
        assert!(stderr.starts_with(&expected), "{name}: {stderr}");
        // One error, printed once: no retries logged, no cause repeated.
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert_eq!(stderr.matches(&addr).count(), 1, "{name}: {stderr}");
        assert_eq!(stderr.matches("refused").count(), 1, "{name}: {stderr}");
        assert!(stderr.contains("--wait-for-broker"), "{name}: {stderr}");
    }
}
