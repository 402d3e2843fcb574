//! The coordinator on PostgreSQL: every operation is one or two short
//! statements, and every placement change is serialised by an advisory lock
//! so that `version` order is commit order.

use std::time::Duration;

use tokio_postgres::{Client, Row};

use crate::config::PgCoordinatorConfig;
use crate::coordinator::{
    Coordinator, Exchange, Handback, Move, MoveState, NodeInfo, Placement, PlacementChanges,
    Takeover, TakeoverRecord,
};
use crate::error::ClusterError;
use crate::input;
use crate::schema::lock_key;
use crate::watch::Suspect;
use crate::worker::{LocalFuture, Worker};
use ciphermq_pgbridge::postgres::describe;

/// Takes the transaction-scoped lock whose key is `$1`.
const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext($1))";

const REGISTER: &str = "
INSERT INTO cluster_nodes (node_id, advertise, incarnation, heartbeat, state)
VALUES ($1, $2, 1, now(), 'alive')
ON CONFLICT (node_id) DO UPDATE SET
    advertise = EXCLUDED.advertise,
    incarnation = cluster_nodes.incarnation + 1,
    heartbeat = now(),
    state = 'alive'
RETURNING incarnation";

const HEARTBEAT: &str = "UPDATE cluster_nodes SET heartbeat = now() WHERE node_id = $1 AND incarnation = $2 AND state = 'alive'";

const INCARNATION: &str = "SELECT incarnation, state FROM cluster_nodes WHERE node_id = $1";

/// Live nodes by id in byte order, with heartbeat age in milliseconds on
/// the server's clock.
const NODES: &str = "
SELECT node_id, advertise, incarnation,
       GREATEST(0, floor(extract(epoch FROM now() - heartbeat) * 1000))::bigint,
       floor(extract(epoch FROM heartbeat) * 1000000)::bigint
FROM cluster_nodes WHERE state = 'alive' ORDER BY node_id COLLATE \"C\"";

/// Marks `$1` dead if it is still alive at incarnation `$2` with the
/// heartbeat `$3` (microseconds, as [`NODES`] reads it).
const MARK_DEAD: &str = "
UPDATE cluster_nodes SET state = 'dead'
WHERE node_id = $1 AND incarnation = $2 AND state = 'alive'
  AND floor(extract(epoch FROM heartbeat) * 1000000)::bigint = $3";

/// The other alive nodes that heartbeated within `$2` milliseconds, by id.
const FRESH_NODES: &str = "
SELECT node_id FROM cluster_nodes
WHERE node_id <> $1 AND state = 'alive' AND now() - heartbeat <= $2::bigint * interval '1 millisecond'
ORDER BY node_id COLLATE \"C\"";

/// The owners placed on `$1`, by name.
const OWNERS_OF: &str =
    "SELECT owner, epoch FROM cluster_placements WHERE node_id = $1 ORDER BY owner COLLATE \"C\"";

/// Aborts the moves under way from or to `$1`.
const ABORT_MOVES_OF: &str = "
UPDATE cluster_moves SET state = 'aborted', changed = now()
WHERE (from_node = $1 OR to_node = $1) AND state IN ('requested', 'exported')
RETURNING owner, epoch";

const PUT_HANDBACK_PART: &str = "
INSERT INTO cluster_handback_parts (owner, from_node, part, data) VALUES ($1, $2, $3, $4)
ON CONFLICT (owner, from_node, part) DO UPDATE SET data = EXCLUDED.data";

const OFFER_HANDBACK: &str = "
INSERT INTO cluster_handbacks (owner, from_node, parts, state, changed)
VALUES ($1, $2, $3, 'offered', now())
ON CONFLICT (owner, from_node) DO UPDATE SET parts = EXCLUDED.parts, state = 'offered', changed = now()";

const DROP_HANDBACK_PARTS_FROM: &str =
    "DELETE FROM cluster_handback_parts WHERE owner = $1 AND from_node = $2 AND part >= $3";

/// Offered backlogs of owners placed on `$1`.
const HANDBACKS_FOR: &str = "
SELECT h.owner, h.from_node, h.parts FROM cluster_handbacks h
JOIN cluster_placements p ON p.owner = h.owner
WHERE p.node_id = $1 AND h.state = 'offered'
ORDER BY h.owner COLLATE \"C\", h.from_node COLLATE \"C\"";

const HANDBACK_PART: &str =
    "SELECT data FROM cluster_handback_parts WHERE owner = $1 AND from_node = $2 AND part = $3";

const FINISH_HANDBACK: &str = "
UPDATE cluster_handbacks SET state = 'done', changed = now()
WHERE owner = $1 AND from_node = $2 AND state = 'offered'";

const HANDBACK_STATE: &str =
    "SELECT state FROM cluster_handbacks WHERE owner = $1 AND from_node = $2";

/// Stores `$1`'s topology `$3` from epoch `$2`, unless a higher epoch
/// stored one.
const PUT_OWNER_TOPOLOGY: &str = "
INSERT INTO cluster_owner_topology (owner, epoch, data, updated) VALUES ($1, $2, $3, now())
ON CONFLICT (owner) DO UPDATE SET epoch = EXCLUDED.epoch, data = EXCLUDED.data, updated = now()
WHERE cluster_owner_topology.epoch <= EXCLUDED.epoch";

const OWNER_TOPOLOGY: &str = "SELECT epoch, data FROM cluster_owner_topology WHERE owner = $1";

const RECENT_TAKEOVERS: &str = "
SELECT node_id, incarnation, by_node,
       GREATEST(0, floor(extract(epoch FROM now() - at) * 1000))::bigint, owners, reason
FROM cluster_takeovers ORDER BY at DESC LIMIT $1";

const RECORD_TAKEOVER: &str = "
INSERT INTO cluster_takeovers (node_id, incarnation, by_node, at, owners, reason)
VALUES ($1, $2, $3, now(), $4, $5)";

/// Placements with their node's address; a `WHERE` clause follows.
const PLACEMENTS: &str = "
SELECT p.owner, p.node_id, n.advertise, p.epoch, p.version
FROM cluster_placements p JOIN cluster_nodes n ON n.node_id = p.node_id";

/// Places `$1` on `$2` if it has no node and `$2` is alive.
const INSERT_PLACEMENT: &str = "
INSERT INTO cluster_placements (owner, node_id, epoch, version)
SELECT $1, node_id, 1, nextval('cluster_placement_version')
FROM cluster_nodes WHERE node_id = $2 AND state = 'alive'
ON CONFLICT (owner) DO NOTHING";

/// Moves `$1` to `$2` if its epoch is `$3` and `$2` is alive.
const MOVE: &str = "
UPDATE cluster_placements p SET
    node_id = n.node_id,
    epoch = p.epoch + 1,
    version = nextval('cluster_placement_version')
FROM cluster_nodes n
WHERE p.owner = $1 AND p.epoch = $3 AND n.node_id = $2 AND n.state = 'alive'
RETURNING p.owner, p.node_id, n.advertise, p.epoch, p.version";

const EPOCH: &str = "SELECT epoch FROM cluster_placements WHERE owner = $1";

const DECLARE_EXCHANGE: &str = "
INSERT INTO cluster_exchanges (name, kind, owner, declared) VALUES ($1, $2, $3, now())
ON CONFLICT (name) DO NOTHING";

const EXCHANGE: &str = "SELECT name, kind, owner FROM cluster_exchanges WHERE name = $1";

const EXCHANGES: &str =
    "SELECT name, kind, owner FROM cluster_exchanges ORDER BY name COLLATE \"C\"";

const DELETE_EXCHANGE: &str = "DELETE FROM cluster_exchanges WHERE name = $1 AND owner = $2";

/// A move's columns; a `WHERE` clause follows.
const MOVES: &str = "SELECT owner, epoch, from_node, to_node, state FROM cluster_moves";

/// Records (or asks again, after an abort) the move of `$1` leaving epoch
/// `$2` from `$3` to `$4`.
const REQUEST_MOVE: &str = "
INSERT INTO cluster_moves (owner, epoch, from_node, to_node, state, changed)
VALUES ($1, $2, $3, $4, 'requested', now())
ON CONFLICT (owner, epoch) DO UPDATE SET
    from_node = EXCLUDED.from_node,
    to_node = EXCLUDED.to_node,
    state = 'requested',
    changed = now()
WHERE cluster_moves.state = 'aborted'";

const PUT_HANDOFF: &str = "
INSERT INTO cluster_handoff (owner, epoch, part, data) VALUES ($1, $2, $3, $4)
ON CONFLICT (owner, epoch, part) DO UPDATE SET data = EXCLUDED.data";

const HANDOFF: &str =
    "SELECT data FROM cluster_handoff WHERE owner = $1 AND epoch = $2 AND part = $3";

const DROP_HANDOFF: &str = "DELETE FROM cluster_handoff WHERE owner = $1 AND epoch = $2";

/// Moves the state of `$1`'s move leaving `$2` from `$4` to `$3`.
const SET_MOVE_STATE: &str = "
UPDATE cluster_moves SET state = $3, changed = now()
WHERE owner = $1 AND epoch = $2 AND state = $4";

/// How many times a declaration is retried when the row it lost to was
/// deleted before it could be read.
const DECLARE_ATTEMPTS: usize = 5;

/// The PostgreSQL [`Coordinator`]: a thread of its own with one connection
/// (reopened by the next call when it breaks), in the schema the config
/// names. Dropping it stops the thread.
pub struct PgCoordinator {
    worker: Worker,
    /// `host:port/dbname`, for errors.
    target: String,
    /// The advisory-lock key serialising placement changes in this schema.
    placement_lock: String,
}

impl std::fmt::Debug for PgCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCoordinator")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl PgCoordinator {
    /// Checks the schema name, starts the thread, connects (one attempt of
    /// at most `connect_timeout`) and creates the tables if missing.
    /// Fails with [`ClusterError::BadSchemaName`],
    /// [`ClusterError::Connect`] or [`ClusterError::Schema`].
    pub fn connect(config: PgCoordinatorConfig) -> Result<PgCoordinator, ClusterError> {
        let target = config.target();
        let placement_lock = lock_key(&config.schema, "placements");
        let worker = Worker::start(config)?;
        Ok(PgCoordinator {
            worker,
            target,
            placement_lock,
        })
    }

    /// Runs `f` on the worker; a driver error becomes a
    /// [`ClusterError::Query`] naming `action` and `table`.
    fn call<T, F>(&self, action: String, table: &'static str, f: F) -> Result<T, ClusterError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Client) -> LocalFuture<'c, Result<T, Failure>> + Send + 'static,
    {
        let target = self.target.clone();
        self.worker.call(move |client| {
            Box::pin(async move {
                f(client)
                    .await
                    .map_err(|failure| failure.into_error(target, action, table))
            })
        })
    }
}

/// Why one call failed: the driver's error (made a [`ClusterError::Query`]
/// by [`PgCoordinator::call`]) or an answer already typed.
enum Failure {
    Driver(tokio_postgres::Error),
    Typed(ClusterError),
}

impl Failure {
    fn into_error(self, target: String, action: String, table: &'static str) -> ClusterError {
        match self {
            Failure::Driver(e) => ClusterError::Query {
                target,
                action,
                table,
                cause: describe(&e),
            },
            Failure::Typed(e) => e,
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        Failure::Driver(e)
    }
}

impl From<ClusterError> for Failure {
    fn from(e: ClusterError) -> Failure {
        Failure::Typed(e)
    }
}

/// Column `index` of `row`, or a [`ClusterError::BadRow`] naming `table`.
fn column<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r Row,
    index: usize,
    table: &'static str,
) -> Result<T, ClusterError> {
    row.try_get(index).map_err(|e| ClusterError::BadRow {
        table,
        why: format!("column {index}: {}", describe(&e)),
    })
}

/// A stored `bigint` that must not be negative.
fn unsigned(table: &'static str, key: &str, what: &str, value: i64) -> Result<u64, ClusterError> {
    u64::try_from(value).map_err(|_| ClusterError::BadRow {
        table,
        why: format!("{key:?} has {what} {value}"),
    })
}

/// A row of [`PLACEMENTS`] or [`MOVE`].
fn placement(row: &Row) -> Result<Placement, ClusterError> {
    const TABLE: &str = "cluster_placements";
    let owner: String = column(row, 0, TABLE)?;
    let epoch = unsigned(TABLE, &owner, "epoch", column(row, 3, TABLE)?)?;
    let version = unsigned(TABLE, &owner, "version", column(row, 4, TABLE)?)?;
    Ok(Placement {
        node_id: column(row, 1, TABLE)?,
        advertise: column(row, 2, TABLE)?,
        epoch,
        version,
        owner,
    })
}

/// A row of [`EXCHANGE`] or [`EXCHANGES`].
fn exchange(row: &Row) -> Result<Exchange, ClusterError> {
    const TABLE: &str = "cluster_exchanges";
    Ok(Exchange {
        name: column(row, 0, TABLE)?,
        kind: column(row, 1, TABLE)?,
        owner: column(row, 2, TABLE)?,
    })
}

/// A row of [`MOVES`].
fn move_row(row: &Row) -> Result<Move, ClusterError> {
    const TABLE: &str = "cluster_moves";
    let owner: String = column(row, 0, TABLE)?;
    let epoch = unsigned(TABLE, &owner, "epoch", column(row, 1, TABLE)?)?;
    let word: String = column(row, 4, TABLE)?;
    let state = MoveState::parse(&word).ok_or_else(|| ClusterError::BadRow {
        table: TABLE,
        why: format!("{owner:?} has state {word:?}"),
    })?;
    Ok(Move {
        from_node: column(row, 2, TABLE)?,
        to_node: column(row, 3, TABLE)?,
        owner,
        epoch,
        state,
    })
}

/// The move of `owner` leaving `epoch`, if recorded.
async fn find_move<C: tokio_postgres::GenericClient>(
    client: &C,
    owner: &str,
    epoch: i64,
) -> Result<Option<Move>, Failure> {
    let sql = format!("{MOVES} WHERE owner = $1 AND epoch = $2");
    match client.query_opt(&sql, &[&owner, &epoch]).await? {
        Some(row) => Ok(Some(move_row(&row)?)),
        None => Ok(None),
    }
}

/// [`ClusterError::MoveEnded`] for the move as it is stored now.
async fn move_ended(client: &Client, owner: String, epoch: i64) -> Failure {
    let state = match find_move(client, &owner, epoch).await {
        Ok(Some(m)) => m.state.as_str().to_owned(),
        Ok(None) => "missing".to_owned(),
        Err(e) => return e,
    };
    ClusterError::MoveEnded {
        owner,
        epoch: epoch as u64,
        state,
    }
    .into()
}

/// The placement of `owner`, if any.
async fn locate(client: &Client, owner: &str) -> Result<Option<Placement>, Failure> {
    let sql = format!("{PLACEMENTS} WHERE p.owner = $1");
    match client.query_opt(&sql, &[&owner]).await? {
        Some(row) => Ok(Some(placement(&row)?)),
        None => Ok(None),
    }
}

impl Coordinator for PgCoordinator {
    fn register(&self, node_id: &str, advertise: &str) -> Result<u64, ClusterError> {
        input::name("node id", node_id)?;
        input::advertise(advertise)?;
        let (node_id, advertise) = (node_id.to_owned(), advertise.to_owned());
        let action = format!("register node {node_id:?}");
        self.call(action, "cluster_nodes", move |client| {
            Box::pin(async move {
                let row = client.query_one(REGISTER, &[&node_id, &advertise]).await?;
                let incarnation = column(&row, 0, "cluster_nodes")?;
                Ok(unsigned(
                    "cluster_nodes",
                    &node_id,
                    "incarnation",
                    incarnation,
                )?)
            })
        })
    }

    fn heartbeat(&self, node_id: &str, incarnation: u64) -> Result<(), ClusterError> {
        input::name("node id", node_id)?;
        let ours = input::bigint("incarnation", incarnation)?;
        let node_id = node_id.to_owned();
        let action = format!("record the heartbeat of node {node_id:?}");
        self.call(action, "cluster_nodes", move |client| {
            Box::pin(async move {
                if client.execute(HEARTBEAT, &[&node_id, &ours]).await? == 1 {
                    return Ok(());
                }
                let Some(row) = client.query_opt(INCARNATION, &[&node_id]).await? else {
                    return Err(ClusterError::UnknownNode { node_id }.into());
                };
                let current = column(&row, 0, "cluster_nodes")?;
                let current = unsigned("cluster_nodes", &node_id, "incarnation", current)?;
                let state: String = column(&row, 1, "cluster_nodes")?;
                if current == incarnation && state == "dead" {
                    return Err(ClusterError::DeclaredDead {
                        node_id,
                        incarnation,
                    }
                    .into());
                }
                if current > incarnation {
                    Err(ClusterError::Fenced {
                        node_id,
                        ours: incarnation,
                        current,
                    }
                    .into())
                } else {
                    // Changed between the two statements, or never issued.
                    Err(ClusterError::BadInput {
                        what: "incarnation",
                        value: incarnation.to_string(),
                        why: "it is not the node's current incarnation",
                    }
                    .into())
                }
            })
        })
    }

    fn nodes(&self) -> Result<Vec<NodeInfo>, ClusterError> {
        self.call(
            "list the live nodes".to_owned(),
            "cluster_nodes",
            |client| {
                Box::pin(async move {
                    const TABLE: &str = "cluster_nodes";
                    let mut nodes = Vec::new();
                    for row in client.query(NODES, &[]).await? {
                        let node_id: String = column(&row, 0, TABLE)?;
                        let incarnation =
                            unsigned(TABLE, &node_id, "incarnation", column(&row, 2, TABLE)?)?;
                        let age_ms =
                            unsigned(TABLE, &node_id, "heartbeat age", column(&row, 3, TABLE)?)?;
                        nodes.push(NodeInfo {
                            advertise: column(&row, 1, TABLE)?,
                            incarnation,
                            heartbeat_age: Duration::from_millis(age_ms),
                            heartbeat_stamp: column(&row, 4, TABLE)?,
                            node_id,
                        });
                    }
                    Ok(nodes)
                })
            },
        )
    }

    fn place(&self, owner: &str, preferred_node: &str) -> Result<Placement, ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", preferred_node)?;
        let (owner, node_id) = (owner.to_owned(), preferred_node.to_owned());
        let lock = self.placement_lock.clone();
        let action = format!("place owner {owner:?}");
        self.call(action, "cluster_placements", move |client| {
            Box::pin(async move {
                if let Some(found) = locate(client, &owner).await? {
                    return Ok(found);
                }
                let tx = client.transaction().await?;
                tx.execute(LOCK, &[&lock]).await?;
                tx.execute(INSERT_PLACEMENT, &[&owner, &node_id]).await?;
                tx.commit().await?;
                // Ours, or the winner's: a new statement sees either.
                match locate(client, &owner).await? {
                    Some(found) => Ok(found),
                    None => Err(ClusterError::UnknownNode { node_id }.into()),
                }
            })
        })
    }

    fn locate(&self, owner: &str) -> Result<Option<Placement>, ClusterError> {
        input::name("owner", owner)?;
        let owner = owner.to_owned();
        let action = format!("locate owner {owner:?}");
        self.call(action, "cluster_placements", move |client| {
            Box::pin(async move { locate(client, &owner).await })
        })
    }

    fn placements_since(&self, version: u64) -> Result<PlacementChanges, ClusterError> {
        let since = input::bigint("version", version)?;
        let action = format!("read placement changes after version {version}");
        self.call(action, "cluster_placements", move |client| {
            Box::pin(async move {
                let sql = format!("{PLACEMENTS} WHERE p.version > $1 ORDER BY p.version");
                let mut changes = PlacementChanges {
                    placements: Vec::new(),
                    version,
                };
                for row in client.query(&sql, &[&since]).await? {
                    let found = placement(&row)?;
                    changes.version = changes.version.max(found.version);
                    changes.placements.push(found);
                }
                Ok(changes)
            })
        })
    }

    fn move_owner(
        &self,
        owner: &str,
        to_node: &str,
        expected_epoch: u64,
    ) -> Result<Placement, ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", to_node)?;
        let expected = input::bigint("expected epoch", expected_epoch)?;
        let (owner, node_id) = (owner.to_owned(), to_node.to_owned());
        let lock = self.placement_lock.clone();
        let action = format!("move owner {owner:?} to node {node_id:?}");
        self.call(action, "cluster_placements", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(LOCK, &[&lock]).await?;
                let moved = tx.query_opt(MOVE, &[&owner, &node_id, &expected]).await?;
                tx.commit().await?;
                if let Some(row) = moved {
                    return Ok(placement(&row)?);
                }
                let Some(row) = client.query_opt(EPOCH, &[&owner]).await? else {
                    return Err(ClusterError::NotPlaced { owner }.into());
                };
                let current = unsigned(
                    "cluster_placements",
                    &owner,
                    "epoch",
                    column(&row, 0, "cluster_placements")?,
                )?;
                if current != expected_epoch {
                    Err(ClusterError::StaleEpoch {
                        owner,
                        expected: expected_epoch,
                        current,
                    }
                    .into())
                } else {
                    Err(ClusterError::UnknownNode { node_id }.into())
                }
            })
        })
    }

    fn request_move(
        &self,
        owner: &str,
        to_node: &str,
        fresh_within: Duration,
    ) -> Result<Move, ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", to_node)?;
        let (owner, to_node) = (owner.to_owned(), to_node.to_owned());
        let fresh_ms = i64::try_from(fresh_within.as_millis()).unwrap_or(i64::MAX);
        let lock = self.placement_lock.clone();
        let action = format!("ask for owner {owner:?} to move to node {to_node:?}");
        self.call(action, "cluster_moves", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(LOCK, &[&lock]).await?;
                let sql = format!("{PLACEMENTS} WHERE p.owner = $1");
                let Some(row) = tx.query_opt(&sql, &[&owner]).await? else {
                    return Err(ClusterError::NotPlaced { owner }.into());
                };
                let at = placement(&row)?;
                if at.node_id == to_node {
                    return Err(ClusterError::AlreadyThere {
                        owner,
                        node_id: to_node,
                    }
                    .into());
                }
                let alive = tx
                    .query_opt(
                        "SELECT GREATEST(0, floor(extract(epoch FROM now() - heartbeat) * 1000))::bigint \
                         FROM cluster_nodes WHERE node_id = $1 AND state = 'alive'",
                        &[&to_node],
                    )
                    .await?;
                let Some(alive) = alive else {
                    return Err(ClusterError::UnknownNode { node_id: to_node }.into());
                };
                let age_ms: i64 = column(&alive, 0, "cluster_nodes")?;
                if age_ms > fresh_ms {
                    return Err(ClusterError::StaleNode {
                        node_id: to_node,
                        age_ms: age_ms as u64,
                    }
                    .into());
                }
                let epoch = input::bigint("epoch", at.epoch)?;
                let recorded = tx
                    .execute(REQUEST_MOVE, &[&owner, &epoch, &at.node_id, &to_node])
                    .await?;
                if recorded == 0 {
                    let under_way = find_move(&tx, &owner, epoch).await?;
                    return Err(ClusterError::MoveUnderWay {
                        owner,
                        to_node: under_way.map(|m| m.to_node).unwrap_or_default(),
                        epoch: at.epoch,
                    }
                    .into());
                }
                tx.commit().await?;
                Ok(Move {
                    owner,
                    epoch: at.epoch,
                    from_node: at.node_id,
                    to_node,
                    state: MoveState::Requested,
                })
            })
        })
    }

    fn pending_moves(&self, node_id: &str) -> Result<Vec<Move>, ClusterError> {
        input::name("node id", node_id)?;
        let node_id = node_id.to_owned();
        let action = format!("read the moves of node {node_id:?}");
        self.call(action, "cluster_moves", move |client| {
            Box::pin(async move {
                let sql = format!(
                    "{MOVES} WHERE (from_node = $1 AND state = 'requested') \
                     OR (to_node = $1 AND state IN ('requested', 'exported')) ORDER BY changed"
                );
                let rows = client.query(&sql, &[&node_id]).await?;
                Ok(rows.iter().map(move_row).collect::<Result<Vec<_>, _>>()?)
            })
        })
    }

    fn move_of(&self, owner: &str, epoch: u64) -> Result<Option<Move>, ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let owner = owner.to_owned();
        let action = format!("read the move of owner {owner:?}");
        self.call(action, "cluster_moves", move |client| {
            Box::pin(async move { find_move(client, &owner, epoch).await })
        })
    }

    fn put_handoff(
        &self,
        owner: &str,
        epoch: u64,
        part: u32,
        data: Vec<u8>,
    ) -> Result<(), ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let part = i32::try_from(part).map_err(|_| ClusterError::BadInput {
            what: "part",
            value: part.to_string(),
            why: "above 2^31 - 1",
        })?;
        let owner = owner.to_owned();
        let action = format!("store part {part} of the move of owner {owner:?}");
        self.call(action, "cluster_handoff", move |client| {
            Box::pin(async move {
                client
                    .execute(PUT_HANDOFF, &[&owner, &epoch, &part, &data])
                    .await?;
                Ok(())
            })
        })
    }

    fn exported(&self, owner: &str, epoch: u64, parts: u32) -> Result<(), ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let parts = i32::try_from(parts).unwrap_or(i32::MAX);
        let owner = owner.to_owned();
        let action = format!("mark the move of owner {owner:?} exported");
        self.call(action, "cluster_moves", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                // Parts of an earlier, longer attempt are not this one's.
                tx.execute(
                    "DELETE FROM cluster_handoff WHERE owner = $1 AND epoch = $2 AND part >= $3",
                    &[&owner, &epoch, &parts],
                )
                .await?;
                let changed = tx
                    .execute(SET_MOVE_STATE, &[&owner, &epoch, &"exported", &"requested"])
                    .await?;
                if changed == 0 {
                    drop(tx);
                    return Err(move_ended(client, owner, epoch).await);
                }
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn handoff(&self, owner: &str, epoch: u64, part: u32) -> Result<Option<Vec<u8>>, ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let part = i32::try_from(part).unwrap_or(i32::MAX);
        let owner = owner.to_owned();
        let action = format!("read part {part} of the move of owner {owner:?}");
        self.call(action, "cluster_handoff", move |client| {
            Box::pin(async move {
                match client.query_opt(HANDOFF, &[&owner, &epoch, &part]).await? {
                    Some(row) => Ok(Some(column(&row, 0, "cluster_handoff")?)),
                    None => Ok(None),
                }
            })
        })
    }

    fn finish_move(&self, owner: &str, epoch: u64) -> Result<Placement, ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let owner = owner.to_owned();
        let lock = self.placement_lock.clone();
        let action = format!("finish the move of owner {owner:?}");
        self.call(action, "cluster_moves", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(LOCK, &[&lock]).await?;
                let Some(m) = find_move(&tx, &owner, epoch).await? else {
                    drop(tx);
                    return Err(move_ended(client, owner, epoch).await);
                };
                let changed = tx
                    .execute(SET_MOVE_STATE, &[&owner, &epoch, &"done", &"exported"])
                    .await?;
                if changed == 0 {
                    drop(tx);
                    return Err(move_ended(client, owner, epoch).await);
                }
                let Some(row) = tx.query_opt(MOVE, &[&owner, &m.to_node, &epoch]).await? else {
                    // The placement is not at the move's epoch any more, or
                    // its node died: nothing changes.
                    return Err(ClusterError::StaleEpoch {
                        owner,
                        expected: m.epoch,
                        current: 0,
                    }
                    .into());
                };
                let moved = placement(&row)?;
                tx.execute(DROP_HANDOFF, &[&owner, &epoch]).await?;
                tx.commit().await?;
                Ok(moved)
            })
        })
    }

    fn abort_move(&self, owner: &str, epoch: u64) -> Result<MoveState, ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let owner = owner.to_owned();
        let lock = self.placement_lock.clone();
        let action = format!("abort the move of owner {owner:?}");
        self.call(action, "cluster_moves", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(LOCK, &[&lock]).await?;
                let Some(m) = find_move(&tx, &owner, epoch).await? else {
                    return Ok(MoveState::Aborted);
                };
                if matches!(m.state, MoveState::Requested | MoveState::Exported) {
                    tx.execute(
                        SET_MOVE_STATE,
                        &[&owner, &epoch, &"aborted", &m.state.as_str()],
                    )
                    .await?;
                }
                tx.execute(DROP_HANDOFF, &[&owner, &epoch]).await?;
                tx.commit().await?;
                Ok(match m.state {
                    MoveState::Done => MoveState::Done,
                    _ => MoveState::Aborted,
                })
            })
        })
    }

    fn declare_exchange(
        &self,
        name: &str,
        kind: &str,
        owner: &str,
    ) -> Result<Exchange, ClusterError> {
        input::name("exchange name", name)?;
        input::name("exchange kind", kind)?;
        input::name("owner", owner)?;
        let (name, kind, owner) = (name.to_owned(), kind.to_owned(), owner.to_owned());
        let action = format!("declare exchange {name:?}");
        self.call(action, "cluster_exchanges", move |client| {
            Box::pin(async move {
                for _ in 0..DECLARE_ATTEMPTS {
                    client
                        .execute(DECLARE_EXCHANGE, &[&name, &kind, &owner])
                        .await?;
                    // Ours, or the first declaration's; gone only if it was
                    // deleted meanwhile, and then we try again.
                    let Some(row) = client.query_opt(EXCHANGE, &[&name]).await? else {
                        continue;
                    };
                    let stored = exchange(&row)?;
                    if stored.kind != kind {
                        return Err(ClusterError::ExchangeKindConflict {
                            name: stored.name,
                            stored_kind: stored.kind,
                            requested_kind: kind,
                            stored_owner: stored.owner,
                        }
                        .into());
                    }
                    return Ok(stored);
                }
                Err(ClusterError::Contended { name }.into())
            })
        })
    }

    fn exchanges(&self) -> Result<Vec<Exchange>, ClusterError> {
        self.call(
            "list the exchanges".to_owned(),
            "cluster_exchanges",
            |client| {
                Box::pin(async move {
                    let rows = client.query(EXCHANGES, &[]).await?;
                    Ok(rows.iter().map(exchange).collect::<Result<Vec<_>, _>>()?)
                })
            },
        )
    }

    fn delete_exchange(&self, name: &str, owner: &str) -> Result<(), ClusterError> {
        input::name("exchange name", name)?;
        input::name("owner", owner)?;
        let (name, owner) = (name.to_owned(), owner.to_owned());
        let action = format!("delete exchange {name:?}");
        self.call(action, "cluster_exchanges", move |client| {
            Box::pin(async move {
                if client.execute(DELETE_EXCHANGE, &[&name, &owner]).await? == 1 {
                    return Ok(());
                }
                match client.query_opt(EXCHANGE, &[&name]).await? {
                    None => Err(ClusterError::NoSuchExchange { name }.into()),
                    Some(row) => Err(ClusterError::NotExchangeOwner {
                        name,
                        owner,
                        stored_owner: exchange(&row)?.owner,
                    }
                    .into()),
                }
            })
        })
    }

    fn put_handback_part(
        &self,
        owner: &str,
        from_node: &str,
        part: u32,
        data: Vec<u8>,
    ) -> Result<(), ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", from_node)?;
        let part = i32::try_from(part).map_err(|_| ClusterError::BadInput {
            what: "part",
            value: part.to_string(),
            why: "too large",
        })?;
        let (owner, from_node) = (owner.to_owned(), from_node.to_owned());
        let action =
            format!("store a part of the backlog of owner {owner:?} from node {from_node:?}");
        self.call(action, "cluster_handback_parts", move |client| {
            Box::pin(async move {
                client
                    .execute(PUT_HANDBACK_PART, &[&owner, &from_node, &part, &data])
                    .await?;
                Ok(())
            })
        })
    }

    fn offer_handback(&self, owner: &str, from_node: &str, parts: u32) -> Result<(), ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", from_node)?;
        let parts = i32::try_from(parts).map_err(|_| ClusterError::BadInput {
            what: "parts",
            value: parts.to_string(),
            why: "too large",
        })?;
        let (owner, from_node) = (owner.to_owned(), from_node.to_owned());
        let action = format!("offer the backlog of owner {owner:?} from node {from_node:?}");
        self.call(action, "cluster_handbacks", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(DROP_HANDBACK_PARTS_FROM, &[&owner, &from_node, &parts])
                    .await?;
                tx.execute(OFFER_HANDBACK, &[&owner, &from_node, &parts])
                    .await?;
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn handbacks_for(&self, node_id: &str) -> Result<Vec<Handback>, ClusterError> {
        input::name("node id", node_id)?;
        let node_id = node_id.to_owned();
        let action = format!("read the backlogs offered to node {node_id:?}");
        self.call(action, "cluster_handbacks", move |client| {
            Box::pin(async move {
                const TABLE: &str = "cluster_handbacks";
                let mut found = Vec::new();
                for row in client.query(HANDBACKS_FOR, &[&node_id]).await? {
                    let owner: String = column(&row, 0, TABLE)?;
                    let parts: i32 = column(&row, 2, TABLE)?;
                    let parts = unsigned(TABLE, &owner, "parts", i64::from(parts))? as u32;
                    found.push(Handback {
                        from_node: column(&row, 1, TABLE)?,
                        owner,
                        parts,
                    });
                }
                Ok(found)
            })
        })
    }

    fn handback_part(
        &self,
        owner: &str,
        from_node: &str,
        part: u32,
    ) -> Result<Option<Vec<u8>>, ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", from_node)?;
        let part = i32::try_from(part).unwrap_or(i32::MAX);
        let (owner, from_node) = (owner.to_owned(), from_node.to_owned());
        let action =
            format!("read a part of the backlog of owner {owner:?} from node {from_node:?}");
        self.call(action, "cluster_handback_parts", move |client| {
            Box::pin(async move {
                let row = client
                    .query_opt(HANDBACK_PART, &[&owner, &from_node, &part])
                    .await?;
                match row {
                    Some(row) => Ok(Some(column(&row, 0, "cluster_handback_parts")?)),
                    None => Ok(None),
                }
            })
        })
    }

    fn finish_handback(&self, owner: &str, from_node: &str) -> Result<(), ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", from_node)?;
        let (owner, from_node) = (owner.to_owned(), from_node.to_owned());
        let action =
            format!("finish taking the backlog of owner {owner:?} from node {from_node:?}");
        self.call(action, "cluster_handbacks", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(FINISH_HANDBACK, &[&owner, &from_node]).await?;
                tx.execute(DROP_HANDBACK_PARTS_FROM, &[&owner, &from_node, &0i32])
                    .await?;
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn handback_taken(&self, owner: &str, from_node: &str) -> Result<Option<bool>, ClusterError> {
        input::name("owner", owner)?;
        input::name("node id", from_node)?;
        let (owner, from_node) = (owner.to_owned(), from_node.to_owned());
        let action =
            format!("read the state of the backlog of owner {owner:?} from node {from_node:?}");
        self.call(action, "cluster_handbacks", move |client| {
            Box::pin(async move {
                let row = client
                    .query_opt(HANDBACK_STATE, &[&owner, &from_node])
                    .await?;
                match row {
                    Some(row) => {
                        let state: String = column(&row, 0, "cluster_handbacks")?;
                        Ok(Some(state == "done"))
                    }
                    None => Ok(None),
                }
            })
        })
    }

    fn put_owner_topology(
        &self,
        owner: &str,
        epoch: u64,
        data: Vec<u8>,
    ) -> Result<bool, ClusterError> {
        input::name("owner", owner)?;
        let epoch = input::bigint("epoch", epoch)?;
        let owner = owner.to_owned();
        let action = format!("record the queues of owner {owner:?}");
        self.call(action, "cluster_owner_topology", move |client| {
            Box::pin(async move {
                let stored = client
                    .execute(PUT_OWNER_TOPOLOGY, &[&owner, &epoch, &data])
                    .await?;
                Ok(stored == 1)
            })
        })
    }

    fn owner_topology(&self, owner: &str) -> Result<Option<(u64, Vec<u8>)>, ClusterError> {
        input::name("owner", owner)?;
        let owner = owner.to_owned();
        let action = format!("read the queues of owner {owner:?}");
        self.call(action, "cluster_owner_topology", move |client| {
            Box::pin(async move {
                const TABLE: &str = "cluster_owner_topology";
                let Some(row) = client.query_opt(OWNER_TOPOLOGY, &[&owner]).await? else {
                    return Ok(None);
                };
                let epoch = unsigned(TABLE, &owner, "epoch", column(&row, 0, TABLE)?)?;
                Ok(Some((epoch, column(&row, 1, TABLE)?)))
            })
        })
    }

    fn recent_takeovers(&self, limit: u32) -> Result<Vec<TakeoverRecord>, ClusterError> {
        let limit = i64::from(limit);
        self.call(
            "read the recent takeovers".to_owned(),
            "cluster_takeovers",
            move |client| {
                Box::pin(async move {
                    const TABLE: &str = "cluster_takeovers";
                    let mut found = Vec::new();
                    for row in client.query(RECENT_TAKEOVERS, &[&limit]).await? {
                        let node_id: String = column(&row, 0, TABLE)?;
                        let incarnation =
                            unsigned(TABLE, &node_id, "incarnation", column(&row, 1, TABLE)?)?;
                        let age_ms = unsigned(TABLE, &node_id, "age", column(&row, 3, TABLE)?)?;
                        let owners: i32 = column(&row, 4, TABLE)?;
                        found.push(TakeoverRecord {
                            incarnation,
                            by_node: column(&row, 2, TABLE)?,
                            age: Duration::from_millis(age_ms),
                            owners: u32::try_from(owners).unwrap_or(0),
                            reason: column(&row, 5, TABLE)?,
                            node_id,
                        });
                    }
                    Ok(found)
                })
            },
        )
    }

    fn declare_dead(
        &self,
        suspect: &Suspect,
        by_node: &str,
        reason: &str,
        fresh_within: Duration,
    ) -> Result<Takeover, ClusterError> {
        input::name("node id", &suspect.node_id)?;
        input::name("node id", by_node)?;
        let incarnation = input::bigint("incarnation", suspect.incarnation)?;
        let (node_id, by_node, reason) = (
            suspect.node_id.clone(),
            by_node.to_owned(),
            reason.to_owned(),
        );
        let stamp = suspect.heartbeat_stamp;
        let fresh_ms = i64::try_from(fresh_within.as_millis()).unwrap_or(i64::MAX);
        let lock = self.placement_lock.clone();
        let action = format!("declare node {node_id:?} dead");
        self.call(action, "cluster_nodes", move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                tx.execute(LOCK, &[&lock]).await?;
                let marked = tx
                    .execute(MARK_DEAD, &[&node_id, &incarnation, &stamp])
                    .await?;
                if marked == 0 {
                    return Err(ClusterError::StillAlive {
                        node_id,
                        incarnation: incarnation as u64,
                    }
                    .into());
                }
                let heirs: Vec<String> = tx
                    .query(FRESH_NODES, &[&node_id, &fresh_ms])
                    .await?
                    .iter()
                    .map(|row| column(row, 0, "cluster_nodes"))
                    .collect::<Result<_, _>>()?;
                if heirs.is_empty() {
                    return Err(ClusterError::NoLiveNode { node_id }.into());
                }
                for row in tx.query(ABORT_MOVES_OF, &[&node_id]).await? {
                    let owner: String = column(&row, 0, "cluster_moves")?;
                    let epoch: i64 = column(&row, 1, "cluster_moves")?;
                    tx.execute(DROP_HANDOFF, &[&owner, &epoch]).await?;
                }
                let owners = tx.query(OWNERS_OF, &[&node_id]).await?;
                let mut placements = Vec::with_capacity(owners.len());
                for (i, row) in owners.iter().enumerate() {
                    let owner: String = column(row, 0, "cluster_placements")?;
                    let epoch: i64 = column(row, 1, "cluster_placements")?;
                    let heir = &heirs[i % heirs.len()];
                    let Some(moved) = tx.query_opt(MOVE, &[&owner, heir, &epoch]).await? else {
                        // Under the lock, with the heir alive, this cannot
                        // happen; refuse rather than half-move.
                        return Err(ClusterError::StaleEpoch {
                            owner,
                            expected: epoch as u64,
                            current: 0,
                        }
                        .into());
                    };
                    placements.push(placement(&moved)?);
                }
                let count = i32::try_from(placements.len()).unwrap_or(i32::MAX);
                tx.execute(
                    RECORD_TAKEOVER,
                    &[&node_id, &incarnation, &by_node, &count, &reason],
                )
                .await?;
                tx.commit().await?;
                Ok(Takeover {
                    node_id,
                    incarnation: incarnation as u64,
                    placements,
                })
            })
        })
    }
}
