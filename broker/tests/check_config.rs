//! `ciphermq-broker --check-config`, run as the binary:
//!
//! - a good config prints each legacy-key warning and `config OK: <path>`
//!   and exits 0, binding no port (its ports are taken by someone else here)
//!   and leaving the data directory's lock alone (a broker holds it);
//! - a bad config exits 2 naming the key or the file: a missing certificate,
//!   a key that does not match the certificate, a data directory that is a
//!   file, an invalid `server.shutdown_timeout_secs`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::config_text;
use common::pki;
use common::process::BrokerProcess;

/// A config file `broker.toml` over `data/` in a new directory; `edit`
/// changes its text.
fn setup(extra: &str, edit: impl FnOnce(String) -> String) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let text = config_text(&pki().certs, &data, 1, extra)
        .replace(r#"mode = "memory""#, r#"mode = "durable""#);
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, edit(text)).unwrap();
    (dir, config)
}

fn check_config(config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ciphermq-broker"))
        .arg("--check-config")
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the broker binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the check, which must fail with status 2; its stderr.
fn refused(config: &Path) -> String {
    let out = check_config(config);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        !text(&out.stdout).contains("config OK"),
        "a refused config is not OK: {out:?}"
    );
    stderr
}

#[test]
fn a_good_config_is_ok_with_its_warnings_and_binds_nothing() {
    // Ports someone else holds: a start would fail on either.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (dir, config) = setup(
        &format!(
            "[performance]\nidle_timeout_sec = 300\n\n[admin]\nenabled = true\naddress = \"{}\"\n",
            taken_admin.local_addr().unwrap()
        ),
        |t| {
            t.replace(
                r#"address = "127.0.0.1:0""#,
                &format!(r#"address = "{}""#, taken.local_addr().unwrap()),
            )
        },
    );
    let out = check_config(&config);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout.trim(), format!("config OK: {}", config.display()));
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("performance.idle_timeout_sec"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning for the legacy key:\n{stderr}"
    );
    assert!(
        warnings[0].starts_with("warning: performance.idle_timeout_sec: "),
        "{stderr}"
    );
    // The data directory is checked, not made: start-up makes it.
    assert!(!dir.path().join("data").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_runs_beside_the_broker_that_holds_the_data_dir() {
    let (dir, config) = setup("", |t| t);
    let broker = BrokerProcess::start(&config);
    let lock = dir.path().join("data/lock");
    let before = std::fs::read_to_string(&lock).unwrap();
    let out = check_config(&config);
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).starts_with("config OK: "), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        before,
        "the lock file is the running broker's"
    );
    // And the broker still serves.
    let _sender = broker.connect("sender_1").await;
    assert!(broker.stop().success());
}

#[test]
fn a_missing_certificate_is_named() {
    let (dir, config) = setup("", |t| t);
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    for f in ["server.key", "ca.crt"] {
        std::fs::copy(pki().certs.join(f), certs.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &pki().certs.display().to_string(),
        &certs.display().to_string(),
    );
    std::fs::write(&config, text).unwrap();
    let stderr = refused(&config);
    assert!(
        stderr.contains("tls.cert_path: file ") && stderr.contains("server.crt does not exist"),
        "{stderr}"
    );
}

#[test]
fn a_key_that_does_not_match_the_certificate_is_refused() {
    // The rogue PKI's server key, beside our server certificate.
    let rogue_key = pki().rogue_certs.join("server.key");
    let (_dir, config) = setup("", |t| {
        t.replace(
            &format!("key_path = \"{}/server.key\"", pki().certs.display()),
            &format!("key_path = \"{}\"", rogue_key.display()),
        )
    });
    let stderr = refused(&config);
    assert!(stderr.contains("tls.key_path"), "{stderr}");
}

#[test]
fn a_data_dir_that_is_a_file_is_refused() {
    let (dir, config) = setup("", |t| t);
    std::fs::write(dir.path().join("data"), "not a directory").unwrap();
    let stderr = refused(&config);
    assert!(
        stderr.contains("storage.data_dir: ") && stderr.contains("is not a directory"),
        "{stderr}"
    );
}

#[test]
fn a_bad_shutdown_timeout_is_refused_naming_the_key() {
    for value in ["-1", "\"30s\"", "999999999999"] {
        let (_dir, config) = setup("", |t| {
            t.replace(
                common::TEST_SHUTDOWN_TIMEOUT,
                &format!("shutdown_timeout_secs = {value}"),
            )
        });
        let stderr = refused(&config);
        assert!(
            stderr.contains("server.shutdown_timeout_secs"),
            "{value}: {stderr}"
        );
    }
}

/// A bad `--address` or `--shards` on a good file is blamed on the flag,
/// not on the file.
#[test]
fn a_bad_override_names_the_flag_not_the_file() {
    let (_dir, config) = setup("", |t| t);
    for (flag, value) in [("--address", "127.0.0.1:notaport"), ("--shards", "5000")] {
        let out = Command::new(env!("CARGO_BIN_EXE_ciphermq-broker"))
            .arg("--check-config")
            .arg("--config")
            .arg(&config)
            .arg(flag)
            .arg(value)
            .env_remove("RUST_LOG")
            .output()
            .expect("run the broker binary");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {out:?}");
        assert!(
            stderr.contains(&format!("{flag} {value} (command line")),
            "{flag} {value} is not named: {stderr}"
        );
        assert!(
            !stderr.contains(&config.display().to_string()),
            "the valid file is blamed for {flag} {value}: {stderr}"
        );
    }
}
