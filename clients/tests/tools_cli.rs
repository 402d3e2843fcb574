//! `ciphermq-sender` and `ciphermq-receiver` as a newcomer runs them, through
//! the real binaries and, where one is needed, a real broker in this process
//! over mutual TLS:
//! - a first connection that fails (a mistyped port) is one error naming the
//!   address, at once, instead of minutes of retries;
//! - `--wait-for-broker` waits for a broker that starts later, `--address`
//!   replaces the config's `server_address`, `--output-dir` its `output_dir`;
//! - the receiver's msg/s leaves out its wait for a first message and its
//!   `--idle-exit` wait after the last.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ciphermq_clients::pki::PkiOptions;
use ciphermq_clients::{
    Client, ClientConfig, ReceiverConfig, SenderConfig, TlsClientOptions, TlsConfig,
};
use ciphermq_testkit::{pki, BrokerConfig, RunningBroker};
use futures_util::future::join_all;

/// Longest any run of a tool may take: a guard against a hang, never a
/// measure of speed.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Certificates for `sender_1` and `receiver_1` (with its X25519 pair) in `dir`.
fn make_pki(dir: &Path) -> PkiOptions {
    pki::generate_with_receivers(dir, &["sender_1", "receiver_1"], &["receiver_1"])
}

/// A port nobody listens on: bound, then released.
fn unused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").port()
}

/// A broker on its own threads (in-memory storage), stopped on drop.
type Broker = RunningBroker;

/// Starts a broker on `address` (`127.0.0.1:0` for any port).
fn broker(certs: &Path, address: &str) -> Broker {
    let data = tempfile::tempdir().expect("tempdir");
    let text = BrokerConfig::new(certs, data.path())
        .address(address)
        .senders(&["sender_1"])
        .receivers(&["receiver_1"])
        .text();
    RunningBroker::start_text(&text, data.path()).keeping(data)
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

    /// Reads stderr until a line contains `text`; panics if the tool ends first.
    fn wait_for_stderr(&mut self, text: &str) {
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!("no stderr line with {text:?}; stderr: {:#?}", self.seen),
            }
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

#[test]
fn asked_to_wait_the_receiver_connects_to_a_broker_started_later_and_writes_where_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    let port = unused_port();
    let addr = format!("127.0.0.1:{port}");
    // The config names another address and another output directory: the
    // flags replace both.
    let config_output = dir.path().join("config-data");
    let config = receiver_json(&pki, dir.path(), "127.0.0.1:1", &config_output);
    let elsewhere = dir.path().join("elsewhere");
    let report = dir.path().join("report.json");
    let mut cmd = tool("receiver", &config);
    cmd.args([
        "--address",
        &addr,
        "--wait-for-broker",
        "600",
        "--idle-exit",
        "0.2",
    ])
    .arg("--output-dir")
    .arg(&elsewhere)
    .arg("--json")
    .arg(&report);
    let mut receiver = Running::start(cmd);

    // It found no broker and is waiting: start one there.
    receiver.wait_for_stderr("no broker yet; waiting for it");
    let broker = broker(&pki.out_dir, &addr);
    assert_eq!(broker.addr, addr);

    let (status, stdout, stderr) = receiver.finish();
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("stopped: Idle"), "{stdout}");
    let output = elsewhere.join("receiver_1_queue_received_messages.jsonl");
    assert!(output.is_file(), "{stdout}");
    assert!(!config_output.exists(), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("JSON report");
    assert_eq!(json["output"], serde_json::json!(output));
    assert_eq!(json["stop"], "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receivers_rate_leaves_out_its_idle_waits() {
    const N: usize = 200;
    const IDLE_EXIT_SECS: f64 = 2.0;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    let b = broker(&pki.out_dir, "127.0.0.1:0");
    let config = receiver_json(&pki, dir.path(), &b.addr, &dir.path().join("out"));
    let report = dir.path().join("report.json");
    let mut cmd = tool("receiver", &config);
    cmd.args(["--idle-exit", &IDLE_EXIT_SECS.to_string()])
        .arg("--json")
        .arg(&report);
    let receiver = Running::start(cmd);

    // Publish once the receiver's key is registered (its route exists then).
    let sender = Client::connect(ClientConfig::new(
        b.addr.clone(),
        TlsClientOptions::for_cn(&pki.out_dir, "sender_1"),
    ))
    .await
    .expect("connect as sender_1");
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        match sender.get_public_key("receiver_1").await {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => panic!("receiver_1's key never came: {other:?}"),
        }
    }
    let publisher = sender.publisher();
    let acks = join_all((0..N).map(|i| {
        let publisher = publisher.clone();
        async move {
            publisher
                .publish_to("receiver_1", "ex", "receiver_1", format!("m{i}").as_bytes())
                .await
        }
    }))
    .await;
    assert!(acks.iter().all(Result::is_ok), "{acks:?}");

    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || receiver.finish())
        .await
        .expect("join");
    assert!(status.success(), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("JSON report");
    let written = json["written"].as_u64().expect("written");
    let elapsed = json["elapsed_secs"].as_f64().expect("elapsed_secs");
    let active = json["active_secs"].as_f64().expect("active_secs");
    let rate = json["msgs_per_sec"].as_f64().expect("msgs_per_sec");
    assert_eq!(written, N as u64, "{stdout}");
    assert!(active > 0.0, "{json}");
    // The rate is over the span messages flowed, not the whole run...
    assert!(
        (rate - written as f64 / active).abs() < 1e-6 * rate,
        "{json}"
    );
    // ...which leaves out the --idle-exit wait after the last message (at
    // least IDLE_EXIT_SECS after the last delivery; the last write follows
    // that delivery within a batch), half of it with room to spare.
    assert!(elapsed - active >= IDLE_EXIT_SECS / 2.0, "{json}");
}
