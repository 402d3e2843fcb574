//! Configuration compatibility: the reference CipherMQ's own `config.toml`
//! (tests/fixtures/reference-config.toml, copied verbatim from its
//! description) loads with one warning per legacy key, floats load where the
//! reference wrote them, typos stay errors; and the logs are written once,
//! to stderr without colour when it is not a terminal, to JSON files when
//! asked, never both into the systemd journal and files by default.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ciphermq_broker::config::{ConfigError, LEGACY_KEYS};
use ciphermq_broker::Config;

use common::pki;

const REFERENCE: &str = include_str!("fixtures/reference-config.toml");

/// The reference's placeholder for its AES key.
const AES_PLACEHOLDER: &str = "\"<base64 دقیقاً معادل ۳۲ بایت>\"";

/// A real key for it: base64 of 32 bytes.
const AES_KEY: &str = "\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"";

/// The legacy keys the reference config has.
const REFERENCE_LEGACY_KEYS: [&str; 10] = [
    "server.connection_type",
    "logging.info_file_path",
    "logging.debug_file_path",
    "logging.error_file_path",
    "logging.max_size_mb",
    "performance.heartbeat_timeout",
    "performance.idle_timeout_sec",
    "performance.cleanup_interval",
    "performance.consumer_cleanup_interval",
    "admin.allowed_cns",
];

/// The reference config with its certificate paths pointing at the test
/// PKI and its placeholder AES key replaced by a real one: nothing else.
fn reference_with_real_files() -> String {
    assert!(REFERENCE.contains(AES_PLACEHOLDER));
    REFERENCE
        .replace("/etc/ciphermq/certs", &pki().certs.display().to_string())
        .replace(AES_PLACEHOLDER, AES_KEY)
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse_unchecked(text, Path::new("/srv/ciphermq"))
}

#[test]
fn reference_config_loads_with_one_warning_per_legacy_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::from_toml_str(&reference_with_real_files(), dir.path())
        .unwrap_or_else(|e| panic!("the reference config is refused: {e}"));

    let keys: Vec<&str> = config.warnings().iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys.iter().copied().collect::<BTreeSet<_>>(),
        REFERENCE_LEGACY_KEYS.into_iter().collect::<BTreeSet<_>>(),
        "{:#?}",
        config.warnings()
    );
    assert_eq!(
        keys.len(),
        REFERENCE_LEGACY_KEYS.len(),
        "one each: {keys:?}"
    );
    for warning in config.warnings() {
        let text = warning.to_string();
        assert!(text.starts_with(&format!("{}: ", warning.key)), "{text}");
        assert!(
            ["renamed ", "replaced by ", "not needed", "not supported"]
                .iter()
                .any(|w| warning.message.starts_with(w)),
            "says what replaced it or that it is not needed: {text}"
        );
    }
    let said = |key: &str| {
        config
            .warnings()
            .iter()
            .find(|w| w.key == key)
            .map(|w| w.message.clone())
            .unwrap()
    };
    assert!(said("performance.idle_timeout_sec").contains("performance.idle_timeout_secs"));
    assert!(said("logging.max_size_mb").contains("logging.max_log_files"));
    assert!(said("performance.cleanup_interval").contains("performance.ack_wait_secs"));
    assert!(said("admin.allowed_cns").contains("acl.admin_cns"));

    // What the values became.
    let (p, r) = (&config.performance, &config.rate_limit);
    assert_eq!(p.idle_timeout_sec, 60);
    assert_eq!(p.heartbeat_timeout, 60);
    assert_eq!(p.max_queue_size, 10_000);
    assert_eq!((r.global_rps, r.global_burst), (100.0, 200));
    assert_eq!((r.publish_rps, r.publish_burst), (50.0, 100));
    assert_eq!(
        (r.max_connections_per_ip, r.max_connections_per_cn),
        (50, 20)
    );
    assert_eq!(config.logging.dir, dir.path().join("logs"));
    assert!(config.logging.json_files, "the reference wrote its files");
    assert_eq!(config.server.address, "0.0.0.0:5671");
    assert!(config.admin.enabled);
    assert_eq!(config.acl.admin_cns, ["ops-admin"]);
    assert_eq!(config.database.user, "ciphermq");

    // Every legacy key the reference has is in the broker's list.
    for key in REFERENCE_LEGACY_KEYS {
        assert!(
            LEGACY_KEYS
                .iter()
                .any(|l| format!("{}.{}", l.section, l.name) == key),
            "{key}"
        );
    }
}

#[test]
fn the_verbatim_reference_is_refused_only_for_its_placeholder_key() {
    // The reference's AES key is a placeholder, not base64: that is the one
    // error, and it names the key without echoing the secret.
    let e = parse(REFERENCE).unwrap_err();
    assert_eq!(e.key(), Some("encryption.aes_key"), "{e}");
    assert!(!e.to_string().contains("base64 دقیقاً"), "{e}");
    let c = parse(&REFERENCE.replace(AES_PLACEHOLDER, AES_KEY)).unwrap();
    assert_eq!(c.warnings().len(), REFERENCE_LEGACY_KEYS.len());
}

#[test]
fn a_float_burst_loads() {
    let c = parse("[rate_limit]\nglobal_burst = 200.0\npublish_burst = 1e2\n").unwrap();
    assert_eq!(c.rate_limit.global_burst, 200);
    assert_eq!(c.rate_limit.publish_burst, 100);
    assert!(c.warnings().is_empty());
    // Rates may have fractions.
    let c = parse("[rate_limit]\nglobal_rps = 0.25\npublish_rps = 12\n").unwrap();
    assert_eq!(c.rate_limit.global_rps, 0.25);
    assert_eq!(c.rate_limit.publish_rps, 12.0);
}

#[test]
fn a_fraction_in_a_whole_number_key_fails_naming_key_and_value() {
    for (key, value) in [
        ("global_burst", "200.5"),
        ("publish_burst", "0.1"),
        ("max_connections_per_ip", "50.75"),
    ] {
        let e = parse(&format!("[rate_limit]\n{key} = {value}\n")).unwrap_err();
        let dotted = format!("rate_limit.{key}");
        assert_eq!(e.key(), Some(dotted.as_str()), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{dotted}: {value} is not a whole number")),
            "{text}"
        );
        assert!(text.contains("line 2"), "{text}");
    }
}

#[test]
fn an_unknown_key_still_fails_naming_it() {
    for (text, key) in [
        (
            "[server]\nconnection_typ = \"tls\"\n",
            "server.connection_typ",
        ),
        (
            "[performance]\ncleanup_intervals = 5\n",
            "performance.cleanup_intervals",
        ),
        // A legacy key in a section where it never was.
        ("[storage]\nmax_size_mb = 5\n", "storage.max_size_mb"),
        // Next to legacy keys, and in a section of another crate.
        ("[admin]\nallowed_cns = []\nallowed = 1\n", "admin.allowed"),
        (
            "[logging]\ninfo_file_path = \"l/i.log\"\nwarn_file_path = \"l/w.log\"\n",
            "logging.warn_file_path",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert!(matches!(e, ConfigError::UnknownKey { .. }), "{text}: {e}");
        assert_eq!(e.key(), Some(key), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("unknown key {key} (at line ")),
            "{e}"
        );
    }
}

#[test]
fn an_old_suffix_loads_with_a_warning() {
    let c = parse("[performance]\nidle_timeout_sec = 45\n").unwrap();
    assert_eq!(c.performance.idle_timeout_sec, 45);
    assert_eq!(c.warnings().len(), 1);
    let w = &c.warnings()[0];
    assert_eq!(w.key, "performance.idle_timeout_sec");
    assert!(w.message.contains("performance.idle_timeout_secs"), "{w}");

    let c = parse("[performance]\nheartbeat_timeout = 9\n").unwrap();
    assert_eq!(c.performance.heartbeat_timeout, 9);
    assert_eq!(c.warnings()[0].key, "performance.heartbeat_timeout");

    // The new names load without one.
    let c = parse("[performance]\nidle_timeout_secs = 45\nheartbeat_timeout_secs = 9\n").unwrap();
    assert!(c.warnings().is_empty());
    assert_eq!(
        (
            c.performance.idle_timeout_sec,
            c.performance.heartbeat_timeout
        ),
        (45, 9)
    );
}

// ---------------------------------------------------------------------------
// The real binary's logs
// ---------------------------------------------------------------------------

/// How long the broker may take to start or stop.
const PATIENCE: Duration = Duration::from_secs(60);

/// A config file in `dir` for a one-shard in-memory broker on a free port,
/// with `logging` appended.
fn broker_config(dir: &Path, logging: &str) -> PathBuf {
    let certs = pki().certs.display().to_string();
    let text = format!(
        r#"[server]
address = "127.0.0.1:0"
shards = 1

[tls]
cert_path = "{certs}/server.crt"
key_path = "{certs}/server.key"
ca_cert_path = "{certs}/ca.crt"

[storage]
data_dir = "data"
mode = "memory"
min_free_mb = 16

{logging}
"#
    );
    let path = dir.join("broker.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// What a broker run printed.
struct Run {
    status: ExitStatus,
    stdout: String,
    /// Its stderr, when piped.
    stderr: String,
}

/// Runs the broker binary on `config` until it listens, then stops it with
/// SIGTERM. Its stderr goes to `stderr_file` if given, else to a pipe; never
/// a terminal. The environment has no RUST_LOG, NO_COLOR or JOURNAL_STREAM
/// but what `env` sets.
fn run_broker(config: &Path, env: &[(&str, String)], stderr_file: Option<std::fs::File>) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ciphermq-broker"));
    cmd.arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    for (name, value) in env {
        cmd.env(name, value);
    }
    match stderr_file {
        Some(file) => cmd.stderr(Stdio::from(file)),
        None => cmd.stderr(Stdio::piped()),
    };
    let mut child = cmd.spawn().expect("start the broker binary");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("ciphermq-broker listening on ") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let stderr = child.stderr.take().map(|mut pipe| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    });
    // The broker prints its address once its signal handlers are installed
    // (main.rs), so SIGTERM may follow the line at once.
    let listening = rx.recv_timeout(PATIENCE).is_ok();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the broker did not stop within {PATIENCE:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        status,
        stdout: reader.join().unwrap(),
        stderr: stderr.map(|t| t.join().unwrap()).unwrap_or_default(),
    };
    assert!(
        listening,
        "the broker did not start: {:?}\n{}\n{}",
        run.status, run.stdout, run.stderr
    );
    run
}

/// The JSON log files in `dir`, sorted by name.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    files.retain(|p| p.to_string_lossy().ends_with(".json.log"));
    files.sort();
    files
}

/// The `message` of every JSON log line in `dir`.
fn json_messages(dir: &Path) -> Vec<String> {
    let mut messages = Vec::new();
    for file in json_files(dir) {
        for line in std::fs::read_to_string(&file).unwrap().lines() {
            let event: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let message = event["fields"]["message"].as_str().unwrap_or_default();
            messages.push(message.to_owned());
        }
    }
    messages
}

#[test]
fn default_logs_go_to_stderr_once_without_colour() {
    let dir = tempfile::tempdir().unwrap();
    let config = broker_config(dir.path(), "");
    let run = run_broker(&config, &[], None);
    assert!(run.status.success(), "{:?}", run.status);

    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains(" INFO ")
            && l.contains("logging to stderr (plain text) only; JSON files off")),
        "{}",
        run.stderr
    );
    assert!(
        lines.iter().any(|l| l.ends_with("stopped")),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains('\x1b'),
        "ANSI escapes on a pipe: {:?}",
        run.stderr
    );
    // Each line once, and none on stdout (which carries the address line).
    for line in &lines {
        assert_eq!(lines.iter().filter(|l| *l == line).count(), 1, "{line}");
    }
    assert!(!run.stdout.contains(" INFO "), "{}", run.stdout);
    assert!(json_files(&dir.path().join("logs")).is_empty());
}

#[test]
fn under_the_journal_with_json_files_each_line_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // Older files than max_log_files keeps.
    for day in 1..=3 {
        std::fs::write(logs.join(format!("ciphermq.2020-01-0{day}.json.log")), "").unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = broker_config(
        dir.path(),
        "[logging]\njson_files = true\nmax_log_files = 2\n",
    );
    // Stderr is a file that JOURNAL_STREAM names, as systemd does.
    let stderr_path = dir.path().join("stderr.txt");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let journal = format!("{}:{}", meta.dev(), meta.ino());
    let run = run_broker(&config, &[("JOURNAL_STREAM", journal)], Some(stderr));
    assert!(run.status.success(), "{:?}", run.status);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();

    let messages = json_messages(&logs);
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("logging to JSON files in") && m.contains("systemd journal")),
        "{messages:?}"
    );
    assert_eq!(messages.iter().filter(|m| *m == "stopped").count(), 1);
    // Nothing the files hold went to the journal as well.
    for message in &messages {
        assert!(
            !stderr.contains(message.as_str()),
            "twice: {message}\n{stderr}"
        );
    }
    assert!(!stderr.contains(" INFO "), "{stderr}");
    // The journal is told, once, where the logs are.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("logs go to JSON files in"), "{stderr}");

    // max_log_files = 2: the newest old file and the current one.
    let left = json_files(&logs);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left[0].ends_with("ciphermq.2020-01-03.json.log"),
        "{left:?}"
    );

    // Without JSON files the console is the one copy, without timestamps
    // (the journal adds its own).
    let config = broker_config(dir.path(), "");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let journal = format!("{}:{}", meta.dev(), meta.ino());
    let before = json_messages(&logs).len();
    run_broker(&config, &[("JOURNAL_STREAM", journal)], Some(stderr));
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    let info = stderr
        .lines()
        .find(|l| l.contains("logging to stderr"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        info.starts_with(" INFO ") || info.starts_with("INFO "),
        "{info}"
    );
    assert!(info.contains("no timestamps"), "{info}");
    assert_eq!(json_messages(&logs).len(), before);
}

#[test]
fn a_journal_stream_that_is_not_stderr_is_ignored() {
    // A child of a systemd service inherits JOURNAL_STREAM with its stderr
    // redirected elsewhere: that stderr is not the journal.
    let dir = tempfile::tempdir().unwrap();
    let config = broker_config(dir.path(), "[logging]\njson_files = true\n");
    let run = run_broker(&config, &[("JOURNAL_STREAM", "1:1".to_owned())], None);
    assert!(
        run.stderr
            .contains("logging to stderr (plain text) and to JSON files in"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_reference_config_runs_the_broker_and_logs_its_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let text = reference_with_real_files()
        .replace("\"0.0.0.0:5671\"", "\"127.0.0.1:0\"")
        .replace("\"127.0.0.1:9091\"", "\"127.0.0.1:0\"");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, text).unwrap();
    let run = run_broker(&config, &[], None);
    assert!(run.status.success(), "{:?}\n{}", run.status, run.stderr);
    // Log lines only (each starts with its timestamp): nothing else was
    // said about the new log directory.
    for line in run.stderr.lines() {
        assert!(line.starts_with("20"), "{line}\n{}", run.stderr);
    }
    for key in REFERENCE_LEGACY_KEYS {
        let warned = run
            .stderr
            .lines()
            .filter(|l| l.contains(" WARN ") && l.contains(&format!("config: {key}: ")))
            .count();
        assert_eq!(warned, 1, "{key}:\n{}", run.stderr);
    }
    // Its log file paths named logs/: the JSON files are there, with the
    // same warnings.
    let messages = json_messages(&dir.path().join("logs"));
    for key in REFERENCE_LEGACY_KEYS {
        let prefix = format!("config: {key}: ");
        assert_eq!(
            messages.iter().filter(|m| m.starts_with(&prefix)).count(),
            1,
            "{key}: {messages:?}"
        );
    }
}
