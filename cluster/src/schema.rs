//! The cluster's tables, created if missing, in the configured schema.
//!
//! - `cluster_nodes`: one row per node id; `incarnation` rises on every
//!   registration; `heartbeat` is the server's clock at the last one.
//! - `cluster_placements`: owner → node and epoch; `version` is taken from
//!   the sequence `cluster_placement_version` on every change.
//! - `cluster_exchanges`: the exchange catalogue.
//! - `cluster_moves`: one row per move of an owner, keyed by the epoch it
//!   leaves: `requested` → `exported` (its data is in `cluster_handoff`) →
//!   `done` (the placement moved in the same transaction), or `aborted`.
//! - `cluster_handoff`: a move's data in parts, until the move ends.
//! - `cluster_takeovers`: one row per node declared dead: who declared
//!   it, when, why, and how many owners moved.
//! - `cluster_handbacks`, `cluster_handback_parts`: the backlog of an
//!   owner that a node lost while away (taken over), offered in parts to
//!   whichever node holds the owner now: `offered` → `done`.
//! - `cluster_owner_topology`: each owner's queues and bindings as its
//!   node last wrote them (an opaque document), so that a node taking the
//!   owner over can declare them again.
//!
//! Creation runs in one transaction under an advisory lock (keyed by the
//! schema name), because `CREATE ... IF NOT EXISTS` is not safe when
//! several nodes start at once against an empty database.

use tokio_postgres::Client;

/// Prefix of the advisory-lock keys (hashed with the schema name).
const LOCK_PREFIX: &str = "ciphermq.cluster.";

/// The tables, with `{schema}` to be replaced by the checked schema name.
const CREATE: &str = "
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.cluster_nodes (
    node_id text PRIMARY KEY,
    advertise text NOT NULL,
    incarnation bigint NOT NULL CHECK (incarnation >= 1),
    heartbeat timestamptz NOT NULL,
    state text NOT NULL CHECK (state IN ('alive', 'dead'))
);
CREATE SEQUENCE IF NOT EXISTS {schema}.cluster_placement_version;
CREATE TABLE IF NOT EXISTS {schema}.cluster_placements (
    owner text PRIMARY KEY,
    node_id text NOT NULL REFERENCES {schema}.cluster_nodes (node_id),
    epoch bigint NOT NULL CHECK (epoch >= 1),
    version bigint NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_moves (
    owner text NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 1),
    from_node text NOT NULL,
    to_node text NOT NULL,
    state text NOT NULL CHECK (state IN ('requested', 'exported', 'done', 'aborted')),
    changed timestamptz NOT NULL,
    PRIMARY KEY (owner, epoch)
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_handoff (
    owner text NOT NULL,
    epoch bigint NOT NULL,
    part integer NOT NULL CHECK (part >= 0),
    data bytea NOT NULL,
    PRIMARY KEY (owner, epoch, part)
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_takeovers (
    node_id text NOT NULL,
    incarnation bigint NOT NULL,
    by_node text NOT NULL,
    at timestamptz NOT NULL,
    owners integer NOT NULL,
    reason text NOT NULL,
    PRIMARY KEY (node_id, incarnation)
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_handbacks (
    owner text NOT NULL,
    from_node text NOT NULL,
    parts integer NOT NULL CHECK (parts >= 0),
    state text NOT NULL CHECK (state IN ('offered', 'done')),
    changed timestamptz NOT NULL,
    PRIMARY KEY (owner, from_node)
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_handback_parts (
    owner text NOT NULL,
    from_node text NOT NULL,
    part integer NOT NULL CHECK (part >= 0),
    data bytea NOT NULL,
    PRIMARY KEY (owner, from_node, part)
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_owner_topology (
    owner text PRIMARY KEY,
    epoch bigint NOT NULL CHECK (epoch >= 1),
    data bytea NOT NULL,
    updated timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS {schema}.cluster_exchanges (
    name text PRIMARY KEY,
    kind text NOT NULL,
    owner text NOT NULL,
    declared timestamptz NOT NULL
);
";

/// The advisory-lock key (hashed by the server with `hashtext`) that
/// serialises `what` in `schema`.
pub(crate) fn lock_key(schema: &str, what: &str) -> String {
    format!("{LOCK_PREFIX}{what}:{schema}")
}

/// Creates what is missing. `schema` must have passed
/// [`check_schema`](crate::PgCoordinatorConfig::check_schema).
pub(crate) async fn ensure(client: &mut Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[&lock_key(schema, "schema")],
    )
    .await?;
    tx.batch_execute(&CREATE.replace("{schema}", schema))
        .await?;
    tx.commit().await
}
