//! A fresh PostgreSQL database per test on the machine's server
//! (127.0.0.1:5432, user postgres, trust auth), dropped afterwards.
//!
//! `CIPHERMQ_TEST_PG_SSLMODE` sets `database.sslmode` in the broker configs
//! made here, with `CIPHERMQ_TEST_PG_CA` (default [`DEFAULT_SERVER_CA`]) as
//! `database.ca_cert_path` for `require` and `verify-full`: scripts/test.sh
//! runs the Postgres tests once more with `verify-full`. The helpers' own
//! connections stay plaintext.
//!
//! A database per test, rather than one shared, keeps tests that run at
//! once from seeing each other's rows.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// The server every Postgres test uses.
pub const HOST: &str = "127.0.0.1";
/// Its port.
pub const PORT: u16 = 5432;

/// Where scripts/pg-tls.sh keeps the CA of the local server's certificate.
pub const DEFAULT_SERVER_CA: &str = "/var/lib/postgresql/ciphermq-tls/ca.crt";

/// `database.sslmode` and `ca_cert_path` from the environment (none set:
/// the broker's defaults).
pub fn tls_from_env() -> Option<(String, Option<PathBuf>)> {
    let mode = std::env::var("CIPHERMQ_TEST_PG_SSLMODE").ok()?;
    let ca = matches!(mode.as_str(), "require" | "verify-full").then(|| {
        let path = std::env::var_os("CIPHERMQ_TEST_PG_CA")
            .map_or_else(|| PathBuf::from(DEFAULT_SERVER_CA), PathBuf::from);
        assert!(
            path.is_file(),
            "no CA at {}: run scripts/pg-tls.sh on (scripts/test.sh does)",
            path.display()
        );
        path
    });
    Some((mode, ca))
}

/// A database made for one test; dropped (with its connections) on drop.
pub struct TestDb {
    /// Its name, `ciphermq_b_<random>`.
    pub name: String,
}

async fn connect_to(dbname: &str) -> Client {
    let url = format!("host={HOST} port={PORT} user=postgres dbname={dbname}");
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {HOST}:{PORT}/{dbname}: {e} (scripts/test.sh starts it)")
        });
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

impl TestDb {
    /// Creates `ciphermq_b_<random>`.
    pub async fn create() -> TestDb {
        let name = format!("ciphermq_b_{:016x}", rand::random::<u64>());
        connect_to("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        TestDb { name }
    }

    /// A client on this database.
    pub async fn client(&self) -> Client {
        connect_to(&self.name).await
    }

    /// The `[database]` (and `[encryption]`) sections of a broker using it,
    /// TLS as [`tls_from_env`] says.
    pub fn config(&self, aes_key_b64: &str) -> String {
        match tls_from_env() {
            Some((mode, ca)) => self.config_with_tls(aes_key_b64, &mode, ca.as_deref()),
            None => self.config_without_tls_keys(aes_key_b64),
        }
    }

    /// As [`TestDb::config`] with `sslmode` and `ca_cert_path` given.
    pub fn config_with_tls(&self, aes_key_b64: &str, sslmode: &str, ca: Option<&Path>) -> String {
        let mut text = self.config_without_tls_keys(aes_key_b64);
        let mut keys = format!("sslmode = \"{sslmode}\"\n");
        if let Some(ca) = ca {
            keys.push_str(&format!("ca_cert_path = {:?}\n", ca.display().to_string()));
        }
        let at = text.find("[encryption]").expect("the [encryption] section");
        text.insert_str(at, &keys);
        text
    }

    fn config_without_tls_keys(&self, aes_key_b64: &str) -> String {
        format!(
            "[database]\nbackend = \"postgres\"\nhost = \"{HOST}\"\nport = {PORT}\nuser = \"postgres\"\n\
             dbname = \"{}\"\nflush_interval_ms = 20\nconnect_timeout_secs = 10\n\
             [encryption]\naes_key = \"{aes_key_b64}\"\n",
            self.name
        )
    }

    /// Polls `query` (one bigint column, one row) until it returns `want`,
    /// up to `limit`; returns the last value seen.
    pub async fn wait_for(&self, query: &str, want: i64, limit: Duration) -> i64 {
        let deadline = tokio::time::Instant::now() + limit;
        let mut last = -1;
        loop {
            let client = tokio::time::timeout(Duration::from_secs(5), self.try_client()).await;
            if let Ok(Some(client)) = client {
                if let Ok(row) = client.query_one(query, &[]).await {
                    last = row.get::<_, i64>(0);
                    if last == want {
                        return last;
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn try_client(&self) -> Option<Client> {
        let url = format!("host={HOST} port={PORT} user=postgres dbname={}", self.name);
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.ok()?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Some(client)
    }

    /// Ends every other connection to this database (the broker's bridge).
    pub async fn terminate_backends(&self) -> i64 {
        let client = connect_to("postgres").await;
        let rows = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .await
            .expect("terminate backends");
        rows.len() as i64
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime: use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let url = format!("host={HOST} port={PORT} user=postgres dbname=postgres");
                if let Ok((client, connection)) = tokio_postgres::connect(&url, NoTls).await {
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// Runs `pg_ctlcluster` for the machine's cluster (`start` or `stop`).
pub fn pg_ctl(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .expect("a cluster under /etc/postgresql");
    let mut cmd = std::process::Command::new("pg_ctlcluster");
    cmd.arg("--skip-systemctl-redirect");
    if action == "stop" {
        cmd.args(["-m", "fast"]);
    }
    cmd.args([&version, "main", action]);
    let status = cmd.status().expect("run pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster {action}: {status}");
}
