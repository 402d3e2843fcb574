//! What can go wrong when talking to the coordinator.

/// Why a coordinator call failed. Each message names the server
/// (`host:port/dbname`), node, owner, exchange or table involved, and what
/// to do where something can be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// No connection could be made (wrong address, server down, login
    /// refused). The next call tries again.
    #[error("cluster coordinator: cannot connect to PostgreSQL at {target}: {cause}")]
    Connect {
        /// `host:port/dbname`.
        target: String,
        /// The driver's error and its causes.
        cause: String,
    },
    /// The cluster tables could not be created or checked.
    #[error("cluster coordinator: PostgreSQL at {target}: cannot create the cluster tables in schema {schema}: {cause}")]
    Schema {
        /// `host:port/dbname`.
        target: String,
        /// The configured schema.
        schema: String,
        /// The driver's error.
        cause: String,
    },
    /// A statement failed (the connection broke, or the server refused it).
    #[error(
        "cluster coordinator: PostgreSQL at {target}: cannot {action} (table {table}): {cause}"
    )]
    Query {
        /// `host:port/dbname`.
        target: String,
        /// What was being done, e.g. `place owner "alice"`.
        action: String,
        /// The table it touched.
        table: &'static str,
        /// The driver's error.
        cause: String,
    },
    /// The configured schema name is not one we put into SQL.
    #[error("cluster schema name {name:?} is not usable: {why}")]
    BadSchemaName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A node id, owner, exchange name or kind, address or number given by
    /// the caller is not valid; nothing was sent.
    #[error("{what} {value:?} is not valid: {why}")]
    BadInput {
        /// Which argument (`node id`, `owner`, `advertise`, ...).
        what: &'static str,
        /// The value given (a number is shown in decimal).
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The node is not registered, or not alive, in table `cluster_nodes`.
    #[error("node {node_id:?} is not a live node in table cluster_nodes: register it first")]
    UnknownNode {
        /// The node asked for.
        node_id: String,
    },
    /// The node id was registered again since this incarnation: another
    /// process now acts as this node, and this one must stop.
    #[error("node {node_id:?} was registered again (incarnation {current} in table cluster_nodes, this process holds {ours}): another process uses this node id")]
    Fenced {
        /// The node.
        node_id: String,
        /// The incarnation the caller holds.
        ours: u64,
        /// The incarnation stored.
        current: u64,
    },
    /// The owner has no placement in table `cluster_placements`.
    #[error("owner {owner:?} has no placement in table cluster_placements")]
    NotPlaced {
        /// The owner.
        owner: String,
    },
    /// A move's expected epoch is not the current one: someone moved the
    /// owner first. Locate it again before retrying.
    #[error("owner {owner:?} is at epoch {current} in table cluster_placements, not {expected}: it was moved meanwhile; locate it again")]
    StaleEpoch {
        /// The owner.
        owner: String,
        /// The epoch the caller expected.
        expected: u64,
        /// The epoch stored.
        current: u64,
    },
    /// The exchange exists with another kind; the first declaration stands.
    #[error("exchange {name:?} is declared as {stored_kind} (by {stored_owner:?}) in table cluster_exchanges, not {requested_kind}")]
    ExchangeKindConflict {
        /// The exchange.
        name: String,
        /// The kind stored.
        stored_kind: String,
        /// The kind asked for.
        requested_kind: String,
        /// Who declared it.
        stored_owner: String,
    },
    /// No such exchange in table `cluster_exchanges`.
    #[error("exchange {name:?} is not in table cluster_exchanges")]
    NoSuchExchange {
        /// The exchange.
        name: String,
    },
    /// Only the exchange's owner may delete it.
    #[error("exchange {name:?} belongs to {stored_owner:?}, not {owner:?}")]
    NotExchangeOwner {
        /// The exchange.
        name: String,
        /// Who asked.
        owner: String,
        /// Who declared it.
        stored_owner: String,
    },
    /// A stored row holds a value this build cannot represent (e.g. a
    /// negative epoch written by something else).
    #[error("a row of table {table} is out of range: {why}")]
    BadRow {
        /// The table.
        table: &'static str,
        /// What is wrong, with the row's key.
        why: String,
    },
    /// A declaration kept losing to concurrent deletions of the same name.
    #[error("exchange {name:?} was deleted by others each time it was declared; try again")]
    Contended {
        /// The exchange.
        name: String,
    },
    /// The owner is already being moved (a move row of its current epoch
    /// is neither finished nor aborted).
    #[error("owner {owner:?} is being moved to node {to_node:?} (table cluster_moves, epoch {epoch}); wait for that move to end")]
    MoveUnderWay {
        /// The owner.
        owner: String,
        /// Where the move under way goes.
        to_node: String,
        /// The epoch it leaves.
        epoch: u64,
    },
    /// The node a move names has not heartbeated within a lease: it may
    /// have stopped.
    #[error("node {node_id:?} has not heartbeated for {age_ms} ms (more than a lease): it is no place to move an owner to now")]
    StaleNode {
        /// The node.
        node_id: String,
        /// Its heartbeat's age on the coordinator's clock.
        age_ms: u64,
    },
    /// The owner already lives on the node a move names.
    #[error("owner {owner:?} already lives on node {node_id:?}")]
    AlreadyThere {
        /// The owner.
        owner: String,
        /// Its node.
        node_id: String,
    },
    /// The move is no longer in the state the call needs: the other side
    /// aborted or finished it first (the row's state is given).
    #[error("the move of owner {owner:?} from epoch {epoch} is {state} in table cluster_moves")]
    MoveEnded {
        /// The owner.
        owner: String,
        /// The epoch the move leaves.
        epoch: u64,
        /// The stored state (`aborted`, `done`, or `missing`).
        state: String,
    },
    /// This node was declared dead by another (its heartbeat stood still for
    /// longer than the lease: it was paused, or cut off from PostgreSQL),
    /// and its owners went to other nodes. It must join again (a new
    /// incarnation) before it heartbeats.
    #[error("node {node_id:?} (incarnation {incarnation}) was declared dead by another node while it was silent; its owners went to other nodes")]
    DeclaredDead {
        /// The node.
        node_id: String,
        /// The incarnation declared dead.
        incarnation: u64,
    },
    /// A takeover found the node's row changed since it was seen silent:
    /// it heartbeated again, restarted, or was declared dead by another
    /// node first. Nothing changed.
    #[error("node {node_id:?} is not as it was seen silent (incarnation {incarnation}): it heartbeated, restarted or was taken over since; nothing changed")]
    StillAlive {
        /// The node.
        node_id: String,
        /// The incarnation seen silent.
        incarnation: u64,
    },
    /// A takeover found no other node that heartbeated recently enough to
    /// take the dead node's owners. Nothing changed.
    #[error("no node but {node_id:?} has heartbeated recently: nobody can take its owners now")]
    NoLiveNode {
        /// The node that would have been declared dead.
        node_id: String,
    },
    /// The coordinator's thread could not be started.
    #[error("cannot start the cluster coordinator thread: {0}")]
    Thread(String),
    /// The coordinator's thread has stopped; no call can be answered.
    #[error("the cluster coordinator thread has stopped")]
    Stopped,
    /// PostgreSQL did not answer a call in time (a server that hangs, or a
    /// network that drops packets); the connection is dropped and the next
    /// call opens a new one.
    #[error("cluster coordinator: PostgreSQL at {target} did not answer within {secs} s; the connection was dropped and the next call opens a new one")]
    NoAnswer {
        /// `host:port/dbname`.
        target: String,
        /// The wait, in seconds.
        secs: u64,
    },
}
