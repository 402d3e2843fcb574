//! Shared by the integration tests: a schema of its own per test in the
//! local PostgreSQL's `test` database (created if missing), dropped at the
//! end, so tests run in parallel and touch nothing else; and coordinators
//! ("nodes") on it.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ciphermq_cluster::{PgCoordinator, PgCoordinatorConfig};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, NoTls};

/// The database every test schema lives in.
pub const DATABASE: &str = "test";

/// A schema of its own, dropped (with everything in it) when this goes.
pub struct TestSchema {
    pub name: String,
    rt: Runtime,
    client: Client,
}

/// A connection to `dbname` on the local server.
async fn connect(dbname: &str) -> Client {
    let (client, connection) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(5432)
        .user("postgres")
        .dbname(dbname)
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth), database {dbname}: {e}"
            )
        });
    tokio::spawn(connection);
    client
}

impl TestSchema {
    /// A fresh, unused schema name; the coordinator creates the schema.
    pub fn new() -> TestSchema {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "cmq_cluster_t_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let admin = connect("postgres").await;
            let exists = admin
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE])
                .await
                .unwrap()
                .is_some();
            if !exists {
                // Another test may create it at the same moment: connecting
                // below is what must succeed.
                let _ = admin
                    .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
                    .await;
            }
            connect(DATABASE).await
        });
        TestSchema { name, rt, client }
    }

    /// Coordinator settings for this schema.
    pub fn config(&self) -> PgCoordinatorConfig {
        PgCoordinatorConfig {
            dbname: DATABASE.to_owned(),
            schema: self.name.clone(),
            ..PgCoordinatorConfig::default()
        }
    }

    /// A coordinator ("a node's link") on this schema.
    pub fn coordinator(&self) -> PgCoordinator {
        PgCoordinator::connect(self.config()).expect("coordinator connects")
    }

    /// The first column of the first row of `sql` (run in this schema) as
    /// an i64.
    pub fn scalar(&self, sql: &str) -> i64 {
        let sql = sql.replace("{schema}", &self.name);
        self.rt
            .block_on(self.client.query_one(&sql, &[]))
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .get(0)
    }

    /// Runs statements in this schema (`{schema}` is replaced by its name).
    pub fn execute(&self, sql: &str) {
        let sql = sql.replace("{schema}", &self.name);
        self.rt
            .block_on(self.client.batch_execute(&sql))
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        if let Err(e) = self.rt.block_on(self.client.batch_execute(&sql)) {
            eprintln!("{sql}: {e}");
        }
    }
}
