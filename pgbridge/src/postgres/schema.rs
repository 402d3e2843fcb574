//! The tables the bridge owns, created if missing.
//!
//! Creation runs in one transaction under a transaction-scoped advisory lock,
//! so two brokers starting against an empty database at once do not race on
//! `CREATE TABLE IF NOT EXISTS` (which is not safe concurrently). The version
//! row lets a later, incompatible schema refuse an older broker instead of
//! being written to wrongly; tables created by something else with other
//! columns are reported, not written to.

use tokio_postgres::Client;

use super::error::BridgeError;
use super::link::describe;

/// The schema version this build writes and understands. Version 2 keys
/// the mirror's rows and positions by node (a cluster's nodes share the
/// database) and records each row's placement epoch; a version-1 database
/// is upgraded in place (its rows become node `''`, a broker on its own).
pub(crate) const SCHEMA_VERSION: i32 = 2;

/// Advisory lock key serialising schema creation ("cipherMQ" in ASCII).
const SCHEMA_LOCK: i64 = 0x6369_7068_6572_4d51;

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS ciphermq_schema_version (
    version integer NOT NULL
);
CREATE TABLE IF NOT EXISTS message_metadata (
    node text NOT NULL DEFAULT '',
    queue text NOT NULL,
    log_seq bigint NOT NULL,
    message_id text NOT NULL,
    client_id text NOT NULL,
    exchange_name text NOT NULL,
    routing_key text NOT NULL,
    sent_time timestamptz NOT NULL,
    delivered_time timestamptz,
    acknowledged_time timestamptz,
    epoch bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (node, queue, log_seq)
);
CREATE INDEX IF NOT EXISTS message_metadata_message_id ON message_metadata (message_id);
CREATE TABLE IF NOT EXISTS public_keys (
    client_id text PRIMARY KEY,
    public_key_ciphertext text NOT NULL,
    nonce text NOT NULL,
    tag text NOT NULL,
    updated_time timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS ciphermq_mirror_watermark (
    node text NOT NULL DEFAULT '',
    queue text NOT NULL,
    segment_base bigint NOT NULL,
    byte_offset bigint NOT NULL,
    updated_time timestamptz NOT NULL,
    PRIMARY KEY (node, queue)
);
";

/// Version 1 → 2: the node and epoch columns, and the keys with the node.
const UPGRADE_1_TO_2: &str = "
ALTER TABLE message_metadata ADD COLUMN IF NOT EXISTS node text NOT NULL DEFAULT '';
ALTER TABLE message_metadata ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE message_metadata DROP CONSTRAINT IF EXISTS message_metadata_pkey;
ALTER TABLE message_metadata ADD PRIMARY KEY (node, queue, log_seq);
ALTER TABLE ciphermq_mirror_watermark ADD COLUMN IF NOT EXISTS node text NOT NULL DEFAULT '';
ALTER TABLE ciphermq_mirror_watermark DROP CONSTRAINT IF EXISTS ciphermq_mirror_watermark_pkey;
ALTER TABLE ciphermq_mirror_watermark ADD PRIMARY KEY (node, queue);
UPDATE ciphermq_schema_version SET version = 2 WHERE version = 1;
";

/// The columns each table must have for the bridge's statements to work.
const EXPECTED: &[(&str, &[&str])] = &[
    (
        "message_metadata",
        &[
            "node",
            "queue",
            "log_seq",
            "message_id",
            "client_id",
            "exchange_name",
            "routing_key",
            "sent_time",
            "delivered_time",
            "acknowledged_time",
            "epoch",
        ],
    ),
    (
        "public_keys",
        &[
            "client_id",
            "public_key_ciphertext",
            "nonce",
            "tag",
            "updated_time",
        ],
    ),
    (
        "ciphermq_mirror_watermark",
        &[
            "node",
            "queue",
            "segment_base",
            "byte_offset",
            "updated_time",
        ],
    ),
];

/// What is wrong with the schema found.
#[derive(Debug, PartialEq, Eq)]
enum Problem {
    /// The stored version is newer than this build.
    TooNew(i32),
    /// A table lacks a column the bridge writes.
    MissingColumn(&'static str, &'static str),
}

/// Checks the found version and columns.
fn check(version: Option<i32>, columns: &[(String, String)]) -> Result<(), Problem> {
    if let Some(found) = version.filter(|v| *v > SCHEMA_VERSION) {
        return Err(Problem::TooNew(found));
    }
    for (table, wanted) in EXPECTED {
        for column in *wanted {
            if !columns.iter().any(|(t, c)| t == table && c == column) {
                return Err(Problem::MissingColumn(table, column));
            }
        }
    }
    Ok(())
}

/// Creates what is missing and checks what exists. `target` names the
/// server in errors.
pub(crate) async fn ensure(client: &mut Client, target: &str) -> Result<(), BridgeError> {
    let sql = |e: tokio_postgres::Error| {
        BridgeError::Schema(format!(
            "PostgreSQL at {target}: cannot create the CipherMQ tables: {}",
            describe(&e)
        ))
    };
    let tx = client.transaction().await.map_err(sql)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .await
        .map_err(sql)?;
    tx.batch_execute(CREATE).await.map_err(sql)?;
    let version: Option<i32> = tx
        .query_one("SELECT max(version) FROM ciphermq_schema_version", &[])
        .await
        .map_err(sql)?
        .try_get(0)
        .map_err(sql)?;
    if version == Some(1) {
        tx.batch_execute(UPGRADE_1_TO_2).await.map_err(sql)?;
        tracing::info!(%target, "CipherMQ schema upgraded from version 1 to 2 (the mirror's rows keyed by node, with their placement epoch)");
    }
    let version = if version == Some(1) { Some(2) } else { version };
    let tables: Vec<&str> = EXPECTED.iter().map(|(t, _)| *t).collect();
    let columns: Vec<(String, String)> = tx
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name::text = ANY($1::text[])",
            &[&tables],
        )
        .await
        .map_err(sql)?
        .iter()
        .filter_map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
        .collect();
    match check(version, &columns) {
        Ok(()) => {}
        Err(Problem::TooNew(found)) => {
            return Err(BridgeError::Schema(format!(
                "PostgreSQL at {target}: the CipherMQ schema is version {found}, newer than this broker understands (version {SCHEMA_VERSION}); upgrade the broker, or point it at another database"
            )))
        }
        Err(Problem::MissingColumn(table, column)) => {
            return Err(BridgeError::Schema(format!(
                "PostgreSQL at {target}: table {table} exists but has no column {column} (created by something else?); rename or drop it, or use another database"
            )))
        }
    }
    if version.is_none() {
        tx.execute(
            "INSERT INTO ciphermq_schema_version (version) VALUES ($1)",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(sql)?;
    }
    tx.commit().await.map_err(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_columns() -> Vec<(String, String)> {
        EXPECTED
            .iter()
            .flat_map(|(t, cs)| cs.iter().map(|c| (t.to_string(), c.to_string())))
            .collect()
    }

    #[test]
    fn accepts_this_version_or_none() {
        assert_eq!(check(None, &all_columns()), Ok(()));
        assert_eq!(check(Some(SCHEMA_VERSION), &all_columns()), Ok(()));
    }

    #[test]
    fn refuses_a_newer_version_and_foreign_tables() {
        assert_eq!(
            check(Some(SCHEMA_VERSION + 1), &all_columns()),
            Err(Problem::TooNew(SCHEMA_VERSION + 1))
        );
        let mut columns = all_columns();
        columns.retain(|(t, c)| !(t == "message_metadata" && c == "log_seq"));
        assert_eq!(
            check(None, &columns),
            Err(Problem::MissingColumn("message_metadata", "log_seq"))
        );
    }
}
