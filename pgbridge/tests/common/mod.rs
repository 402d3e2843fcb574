//! Shared by the integration tests: a fresh PostgreSQL database per test
//! (dropped at the end, so tests run in parallel and touch nothing else), a
//! writer of queue log segments laid out as the broker lays them out, and
//! polling with generous timeouts instead of sleeps.
//!
//! `CIPHERMQ_TEST_PG_SSLMODE` (`disable`, `prefer`, `require`,
//! `verify-full`) sets the bridge's `sslmode` in every test's config, with
//! `CIPHERMQ_TEST_PG_CA` (default [`DEFAULT_SERVER_CA`]) as its CA for
//! `require` and `verify-full`: scripts/test.sh runs these tests once more
//! with `verify-full`. The helpers' own connections stay plaintext.

#![allow(dead_code, unreachable_pub)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ciphermq_pgbridge::{PgConfig, SslMode};
use ciphermq_shard::log::record::{encode, Record};
use ciphermq_shard::log::segment::{self, Step, FILE_HEADER};
use ciphermq_shard::log::{queue_dir, segment_path};
use tokio::runtime::Runtime;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

/// Where scripts/pg-tls.sh keeps the CA that issued the local server's
/// certificate.
pub const DEFAULT_SERVER_CA: &str = "/var/lib/postgresql/ciphermq-tls/ca.crt";

/// The CA of the local server's certificate (`CIPHERMQ_TEST_PG_CA`, else
/// [`DEFAULT_SERVER_CA`]); panics saying how to make it when missing.
pub fn server_ca() -> PathBuf {
    let path = std::env::var_os("CIPHERMQ_TEST_PG_CA")
        .map_or_else(|| PathBuf::from(DEFAULT_SERVER_CA), PathBuf::from);
    assert!(
        path.is_file(),
        "no CA at {}: run scripts/pg-tls.sh on (scripts/test.sh does) to turn TLS on at the \
         local PostgreSQL",
        path.display()
    );
    path
}

/// `sslmode` and CA for the bridge under test, from the environment.
pub fn tls_from_env() -> (SslMode, Option<PathBuf>) {
    let Ok(mode) = std::env::var("CIPHERMQ_TEST_PG_SSLMODE") else {
        return (SslMode::default(), None);
    };
    let mode: SslMode = mode
        .parse()
        .unwrap_or_else(|e| panic!("CIPHERMQ_TEST_PG_SSLMODE: {e}"));
    let ca = matches!(mode, SslMode::Require | SslMode::VerifyFull).then(server_ca);
    (mode, ca)
}

/// How long any condition may take before a test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Log lines on stderr when `RUST_LOG` is set (e.g. `RUST_LOG=debug`).
pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Polls `cond` until it holds; panics naming `what` after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A database of its own, dropped (with force) when this goes.
pub struct TestDb {
    pub name: String,
    rt: Runtime,
    client: Mutex<Option<Client>>,
}

async fn connect(dbname: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(5432)
        .user("postgres")
        .dbname(dbname)
        .connect(NoTls)
        .await?;
    tokio::spawn(connection);
    Ok(client)
}

impl TestDb {
    pub fn new() -> TestDb {
        logs();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let name = format!("ciphermq_t_{:016x}", rand::random::<u64>());
        rt.block_on(async {
            let admin = connect("postgres")
                .await
                .expect("PostgreSQL on 127.0.0.1:5432");
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
        });
        TestDb {
            name,
            rt,
            client: Mutex::new(None),
        }
    }

    /// Bridge settings for this database: quick ticks, small batches, TLS
    /// as [`tls_from_env`] says.
    pub fn config(&self) -> PgConfig {
        let (sslmode, ca_cert_path) = tls_from_env();
        PgConfig {
            dbname: self.name.clone(),
            sslmode,
            ca_cert_path,
            batch_size: 500,
            flush_interval: Duration::from_millis(20),
            connect_timeout: Duration::from_secs(10),
            ..PgConfig::default()
        }
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Runs `sql` on this database (reconnecting if the test killed us).
    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        let mut slot = self.client.lock().unwrap();
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            *slot = Some(self.rt.block_on(connect(&self.name)).unwrap());
        }
        let client = slot.as_ref().unwrap();
        self.rt
            .block_on(client.query(sql, params))
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    /// Runs one or more statements (simple protocol, no parameters).
    pub fn execute(&self, sql: &str) {
        let mut slot = self.client.lock().unwrap();
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            *slot = Some(self.rt.block_on(connect(&self.name)).unwrap());
        }
        let client = slot.as_ref().unwrap();
        self.rt
            .block_on(client.batch_execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    /// The first column of the first row as an i64.
    pub fn scalar(&self, sql: &str) -> i64 {
        self.query(sql, &[])[0].get(0)
    }

    /// Runs `sql` on the `postgres` database (for ALTER DATABASE etc.).
    pub fn admin(&self, sql: &str) {
        self.rt.block_on(async {
            let admin = connect("postgres").await.unwrap();
            admin.batch_execute(sql).await.unwrap();
        });
    }

    /// Message records in `path` before byte `offset`.
    pub fn messages_before(path: &Path, offset: u64) -> u64 {
        let data = fs::read(path).unwrap();
        let layout = segment::layout(&data);
        let mut at = layout.start;
        let mut n = 0;
        while at < offset as usize {
            match segment::step(&data, at, layout.framing, true) {
                Step::Record(record, len) => {
                    n += matches!(record, Record::Message { .. }) as u64;
                    at += len;
                }
                other => panic!("{}: offset {at}: {other:?}", path.display()),
            }
        }
        assert_eq!(at as u64, offset, "the watermark is at a record boundary");
        n
    }

    /// Kills every connection to this database but the test's own.
    pub fn kill_other_connections(&self) -> i64 {
        let rows = self.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        );
        rows[0].get(0)
    }

    /// Refuses (or allows again) new connections to this database, and
    /// kills the existing ones: the database is "down" for the bridge.
    pub fn set_reachable(&self, reachable: bool) {
        self.admin(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS {reachable}",
            self.name
        ));
        if !reachable {
            *self.client.lock().unwrap() = None;
            self.admin(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}'",
                self.name
            ));
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        *self.client.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let name = self.name.clone();
        let _ = self.rt.block_on(async move {
            let admin = connect("postgres").await?;
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
        });
    }
}

/// Sent time of message `seq` in these tests (Unix ms).
pub fn sent_ms(seq: u64) -> u64 {
    1_700_000_000_000 + seq * 10
}

/// Appends records to one queue's log the way the broker does: whole
/// records per write, segments named by their first sequence number.
pub struct LogWriter {
    queue: String,
    dir: PathBuf,
    base: u64,
    pending: Vec<u8>,
}

impl LogWriter {
    pub fn new(data_dir: &Path, queue: &str) -> LogWriter {
        let dir = queue_dir(data_dir, queue);
        fs::create_dir_all(&dir).unwrap();
        LogWriter {
            queue: queue.to_owned(),
            dir,
            base: 0,
            pending: Vec::new(),
        }
    }

    /// The message id of `seq` in this queue.
    pub fn id(&self, seq: u64) -> String {
        format!("{}-{seq}", self.queue)
    }

    pub fn message(&mut self, seq: u64) -> &mut Self {
        let id = self.id(seq);
        encode(
            &Record::Message {
                seq,
                sender: "sender_1",
                message_id: &id,
                exchange: "orders",
                routing_key: "eu.new",
                sent_at_ms: sent_ms(seq),
                body: "{\"opaque\": \"ciphertext\"}",
            },
            &mut self.pending,
        );
        self
    }

    pub fn delivered(&mut self, seq: u64, count: u32, at_ms: u64) -> &mut Self {
        encode(
            &Record::Delivered {
                seq,
                count,
                delivered_at_ms: at_ms,
            },
            &mut self.pending,
        );
        self
    }

    pub fn ack(&mut self, seq: u64, at_ms: u64) -> &mut Self {
        encode(
            &Record::Ack {
                seq,
                acked_at_ms: at_ms,
                key: Some(u128::from(seq)),
            },
            &mut self.pending,
        );
        self
    }

    /// Writes what is pending to the active segment in one write (a new
    /// segment starts with the file header).
    pub fn flush(&mut self) {
        let path = self.path();
        let new = !path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        if new {
            file.write_all(&FILE_HEADER).unwrap();
        }
        file.write_all(&self.pending).unwrap();
        self.pending.clear();
    }

    /// Starts a new segment at `base` (after flushing the current one).
    pub fn roll(&mut self, base: u64) {
        self.flush();
        self.base = base;
        self.flush();
    }

    pub fn path(&self) -> PathBuf {
        segment_path(&self.dir, self.base)
    }

    pub fn segment(&self, base: u64) -> PathBuf {
        segment_path(&self.dir, base)
    }

    pub fn base(&self) -> u64 {
        self.base
    }
}
