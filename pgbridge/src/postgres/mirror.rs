//! The metadata mirror: each tick, read the queues' logs from the committed
//! watermark, and write one batch of rows plus the new watermarks in ONE
//! transaction. The watermark and the rows commit together, so after an
//! outage or a crash the mirror resumes exactly where it stopped. New rows
//! go in with binary `COPY` (a fraction of the server's CPU per row of an
//! upsert, which matters when PostgreSQL shares the broker's cores); if some
//! already exist (a batch replayed after a commit whose answer was lost, a
//! database kept across a wiped data directory), the batch is written again
//! as upserts that only fill missing times. Nothing but the current batch is
//! held in memory: the logs are the buffer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ciphermq_shard::log::{queue_dir, MirrorWatermarks};
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement, Transaction};

use super::batch::{raise, Batch, Columns, Position};
use super::budget::{Budget, Decision};
use super::config::PgConfig;
use super::link::{describe, Link};
use super::status::StatusCell;
use super::tail::{list_queues, queue_lag, read_queue, QueueEnd, Reported};

/// Longest one batch transaction may take before the connection is dropped
/// and the batch retried on a new one.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the last flush at shutdown may take.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

const INSERT: &str = "
INSERT INTO message_metadata (node, queue, log_seq, message_id, client_id, exchange_name, routing_key, sent_time, delivered_time, acknowledged_time, epoch)
SELECT $10, * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::timestamptz[], $9::timestamptz[], $11::bigint[])
ON CONFLICT (node, queue, log_seq) DO UPDATE SET
    delivered_time = COALESCE(message_metadata.delivered_time, EXCLUDED.delivered_time),
    acknowledged_time = COALESCE(message_metadata.acknowledged_time, EXCLUDED.acknowledged_time)";

const COPY: &str = "COPY message_metadata (node, queue, log_seq, message_id, client_id, exchange_name, routing_key, sent_time, delivered_time, acknowledged_time, epoch) FROM STDIN (FORMAT binary)";

/// Column types of [`COPY`], in order.
const COPY_TYPES: [Type; 11] = [
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
    Type::INT8,
];

const UPDATE: &str = "
UPDATE message_metadata m SET
    delivered_time = COALESCE(m.delivered_time, u.d),
    acknowledged_time = COALESCE(m.acknowledged_time, u.a)
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::timestamptz[]) AS u(queue, seq, d, a)
WHERE m.node = $5 AND m.queue = u.queue AND m.log_seq = u.seq";

const WATERMARK: &str = "
INSERT INTO ciphermq_mirror_watermark (node, queue, segment_base, byte_offset, updated_time)
SELECT $4, w.queue, w.base, w.off, now() FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS w(queue, base, off)
ON CONFLICT (node, queue) DO UPDATE SET
    segment_base = EXCLUDED.segment_base,
    byte_offset = EXCLUDED.byte_offset,
    updated_time = EXCLUDED.updated_time";

/// Drops what the mirror holds of deleted queues on this node (`$2`): their
/// rows and positions, in one transaction. A queue declared again under the
/// same name then starts over at sequence 0 and segment 0 without meeting
/// the old rows; another node's copy of a queue of that name (an owner
/// moved there) keeps its rows.
const DROP_QUEUES: &str = "
WITH gone AS (DELETE FROM message_metadata WHERE node = $2 AND queue = ANY($1::text[]))
DELETE FROM ciphermq_mirror_watermark WHERE node = $2 AND queue = ANY($1::text[])";

/// The batch statements, prepared once per connection.
struct Statements {
    insert: Statement,
    update: Statement,
    watermark: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
        Ok(Statements {
            insert: client.prepare(INSERT).await?,
            update: client.prepare(UPDATE).await?,
            watermark: client.prepare(WATERMARK).await?,
        })
    }
}

/// The committed position of every queue the mirror of `node` has written
/// for.
pub(crate) async fn load_watermarks(
    client: &Client,
    node: &str,
) -> Result<HashMap<Arc<str>, Position>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT queue, segment_base, byte_offset FROM ciphermq_mirror_watermark WHERE node = $1",
            &[&node],
        )
        .await?;
    let mut positions = HashMap::with_capacity(rows.len());
    for row in rows {
        let queue: String = row.try_get(0)?;
        let base: i64 = row.try_get(1)?;
        let offset: i64 = row.try_get(2)?;
        match (u64::try_from(base), u64::try_from(offset)) {
            (Ok(base), Ok(offset)) => {
                positions.insert(Arc::from(queue), Position { base, offset });
            }
            _ => {
                tracing::warn!(%queue, base, offset, "negative mirror watermark ignored; the queue is mirrored from its oldest segment")
            }
        }
    }
    Ok(positions)
}

/// How a batch's new rows go in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inserts {
    /// Binary `COPY`: fails on a row that exists already.
    Copy,
    /// `INSERT … ON CONFLICT` filling missing times.
    Upsert,
}

/// Writes one batch in one transaction: with `COPY`, or again with upserts
/// if some of its rows exist already.
async fn transact(
    client: &mut Client,
    st: &Statements,
    cols: &Columns,
    at: &Where,
) -> Result<(), tokio_postgres::Error> {
    match transact_with(client, st, cols, at, Inserts::Copy).await {
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            tracing::info!("rows of a metadata batch exist already (a replayed batch); writing it again as upserts");
            transact_with(client, st, cols, at, Inserts::Upsert).await
        }
        other => other,
    }
}

/// Which copy a batch's rows describe: the node that stores it, and its
/// owner's placement epoch per inserted row.
struct Where {
    node: String,
    epochs: Vec<i64>,
}

async fn transact_with(
    client: &mut Client,
    st: &Statements,
    cols: &Columns,
    at: &Where,
    inserts: Inserts,
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let i = &cols.inserts;
    if !i.seq.is_empty() {
        match inserts {
            Inserts::Copy => copy_rows(&tx, i, at).await?,
            Inserts::Upsert => {
                tx.execute(
                    &st.insert,
                    &[
                        &i.queue,
                        &i.seq,
                        &i.message_id,
                        &i.client_id,
                        &i.exchange,
                        &i.routing_key,
                        &i.sent,
                        &i.delivered,
                        &i.acked,
                        &at.node,
                        &at.epochs,
                    ],
                )
                .await?;
            }
        }
    }
    let u = &cols.updates;
    if !u.seq.is_empty() {
        tx.execute(
            &st.update,
            &[&u.queue, &u.seq, &u.delivered, &u.acked, &at.node],
        )
        .await?;
    }
    let w = &cols.watermarks;
    if !w.queue.is_empty() {
        tx.execute(&st.watermark, &[&w.queue, &w.base, &w.offset, &at.node])
            .await?;
    }
    tx.commit().await
}

/// Streams the new rows with binary `COPY`.
async fn copy_rows(
    tx: &Transaction<'_>,
    i: &super::batch::InsertColumns,
    at: &Where,
) -> Result<(), tokio_postgres::Error> {
    let sink = tx.copy_in(COPY).await?;
    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &COPY_TYPES));
    for n in 0..i.seq.len() {
        let row: [&(dyn ToSql + Sync); 11] = [
            &at.node,
            &i.queue[n],
            &i.seq[n],
            &i.message_id[n],
            &i.client_id[n],
            &i.exchange[n],
            &i.routing_key[n],
            &i.sent[n],
            &i.delivered[n],
            &i.acked[n],
            &at.epochs[n],
        ];
        writer.as_mut().write(&row).await?;
    }
    writer.finish().await?;
    Ok(())
}

/// Where the logs are and who else needs to know the mirror's progress.
pub(crate) struct LogSource {
    /// The broker's data directory (`{data_dir}/queues/…`).
    pub(crate) data_dir: PathBuf,
    /// Holds acked segments for the mirror, shared with the shards.
    pub(crate) watermarks: Arc<MirrorWatermarks>,
}

/// The mirror task's state.
pub(crate) struct Mirror {
    config: PgConfig,
    logs: LogSource,
    status: Arc<StatusCell>,
    link: Link,
    /// Statements of the connection with the given generation.
    prepared: Option<(u64, Statements)>,
    /// Committed positions, as in `ciphermq_mirror_watermark`.
    positions: HashMap<Arc<str>, Position>,
    /// Per queue: one past the last message whose row is committed (known
    /// once a batch inserted one, or a tick caught up).
    mirrored_next: HashMap<Arc<str>, u64>,
    budget: Budget,
    reported: Reported,
    /// Which queue a tick starts with, so one busy queue cannot starve others.
    rotation: usize,
    /// When a tick last read every log to its end and committed it.
    caught_up_at: Instant,
    /// Deleted queues whose rows and position are still to be dropped
    /// (reported by the shards, or found at connecting: a position whose
    /// queue directory is gone).
    gone: Vec<Arc<str>>,
}

impl Mirror {
    /// A mirror resuming from `positions` (loaded at start), holding the
    /// broker's segments accordingly.
    pub(crate) fn new(
        config: PgConfig,
        logs: LogSource,
        status: Arc<StatusCell>,
        link: Link,
        positions: HashMap<Arc<str>, Position>,
    ) -> Mirror {
        for (queue, position) in &positions {
            logs.watermarks.set(queue, position.base);
        }
        Mirror {
            budget: Budget::new(config.max_unmirrored_bytes),
            config,
            logs,
            status,
            link,
            prepared: None,
            positions,
            mirrored_next: HashMap::new(),
            reported: Reported::default(),
            rotation: 0,
            caught_up_at: Instant::now(),
            gone: Vec::new(),
        }
    }

    /// Notes every queue deleted since the last look.
    fn note_deleted(&mut self) {
        for queue in self.logs.watermarks.take_deleted() {
            if !self.gone.contains(&queue) {
                self.gone.push(queue);
            }
        }
    }

    /// Notes every committed position whose queue's log directory is gone:
    /// a queue deleted while its deletion could not reach the database (the
    /// broker stopped first). Checked on connecting, before any read.
    fn note_vanished(&mut self) {
        for queue in self.positions.keys() {
            if !self.gone.contains(queue) && !queue_dir(&self.logs.data_dir, queue).exists() {
                self.gone.push(queue.clone());
            }
        }
    }

    /// Drops the rows and positions of deleted queues before anything more
    /// is read; `Err` (kept for the next tick) when the database refused.
    async fn drop_deleted(&mut self, limit: Duration) -> Result<(), String> {
        self.note_deleted();
        if self.gone.is_empty() {
            return Ok(());
        }
        let Some(conn) = self.link.conn() else {
            return Err("not connected".to_owned());
        };
        let names: Vec<&str> = self.gone.iter().map(|q| &**q).collect();
        let node = &self.config.node;
        match timeout(limit, conn.client.execute(DROP_QUEUES, &[&names, node])).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(describe(&e)),
            Err(_) => {
                return Err(format!(
                    "dropping deleted queues took longer than {limit:?}"
                ))
            }
        }
        let released = self.budget.released();
        for queue in std::mem::take(&mut self.gone) {
            tracing::info!(%queue, "deleted queue dropped from the metadata mirror");
            self.positions.remove(&queue);
            self.mirrored_next.remove(&queue);
            // A queue of that name made later holds its segments from its
            // start again (or not at all while the budget is exceeded).
            self.logs
                .watermarks
                .set(&queue, if released { u64::MAX } else { 0 });
        }
        Ok(())
    }

    /// Runs until `stop` turns true (or its sender goes), then makes one
    /// last bounded flush.
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut next_tick = Instant::now();
        while !*stop.borrow() {
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = self.link.event() => {}
                () = sleep_until(next_tick) => {
                    // A batch stuck on the database must not hold up shutdown.
                    let more = tokio::select! {
                        biased;
                        _ = stop.changed() => None,
                        more = self.tick(TRANSACTION_TIMEOUT) => Some(more),
                    };
                    let Some(more) = more else {
                        // Abandoned mid-batch: drop the connection so the
                        // server rolls the transaction back; the next start
                        // resumes from the last committed watermark.
                        self.link.fail("shutting down during a batch".to_owned());
                        break;
                    };
                    next_tick = Instant::now() + if more { Duration::ZERO } else { self.config.tick() };
                    if more {
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
        if self.link.conn().is_none() {
            return;
        }
        if timeout(FINAL_FLUSH, self.tick(FINAL_FLUSH)).await.is_err() {
            tracing::warn!("the metadata mirror's last flush did not finish in time; the next start resumes from the last committed watermark");
        }
    }

    /// One round: read and commit a batch when connected, then measure the
    /// backlog and apply the disk budget. `true` when the batch was full
    /// (more is waiting: tick again at once).
    async fn tick(&mut self, limit: Duration) -> bool {
        let mut more = false;
        let mut caught_up = false;
        // Durable before the read starts: a read to the end covers them.
        let stored = self.logs.watermarks.stored();
        if self.ready(limit).await {
            if let Err(why) = self.drop_deleted(limit).await {
                self.link.fail(why);
                self.measure(false, &stored);
                return false;
            }
            let mut batch = Batch::new(self.config.rows_per_batch());
            let (all_read, full) = self.read(&mut batch);
            if batch.is_empty() {
                caught_up = all_read;
            } else {
                match self.write(batch, limit).await {
                    Ok(()) => {
                        caught_up = all_read;
                        more = full;
                    }
                    Err(why) => self.link.fail(why),
                }
            }
        }
        self.measure(caught_up, &stored);
        more
    }

    /// Connected with prepared statements and fresh positions.
    async fn ready(&mut self, limit: Duration) -> bool {
        let generation = self.link.generation();
        if matches!(&self.prepared, Some((g, _)) if *g == generation) && self.link.conn().is_some()
        {
            return true;
        }
        let Some(conn) = self.link.conn() else {
            return false;
        };
        let setup = async {
            let statements = Statements::prepare(&conn.client).await?;
            let positions = load_watermarks(&conn.client, &self.config.node).await?;
            Ok::<_, tokio_postgres::Error>((statements, positions))
        };
        match timeout(limit, setup).await {
            Ok(Ok((statements, positions))) => {
                self.prepared = Some((generation, statements));
                // The database is the truth: a batch whose commit answer was
                // lost may have landed.
                self.positions = positions;
                self.note_vanished();
                if !self.budget.released() {
                    for (queue, position) in &self.positions {
                        self.logs.watermarks.set(queue, position.base);
                    }
                }
                true
            }
            Ok(Err(e)) => {
                self.link.fail(describe(&e));
                false
            }
            Err(_) => {
                self.link
                    .fail(format!("preparing statements took longer than {limit:?}"));
                false
            }
        }
    }

    /// Fills `batch` from the logs; returns (every log read to its end, the
    /// batch filled up).
    fn read(&mut self, batch: &mut Batch) -> (bool, bool) {
        let queues = match list_queues(&self.logs.data_dir) {
            Ok(queues) => queues,
            Err(e) => {
                tracing::error!(error = %e, "cannot list queues for the metadata mirror");
                self.status.error(e.to_string());
                return (false, false);
            }
        };
        if queues.is_empty() {
            return (true, false);
        }
        let first = self.rotation % queues.len();
        self.rotation = self.rotation.wrapping_add(1);
        let mut all_read = true;
        for k in 0..queues.len() {
            if batch.is_full() {
                return (false, true);
            }
            let name = &queues[(first + k) % queues.len()];
            let (queue, start) = match self.positions.get_key_value(name.as_str()) {
                Some((queue, position)) => (queue.clone(), Some(*position)),
                None => (Arc::from(name.as_str()), None),
            };
            let dir = queue_dir(&self.logs.data_dir, name);
            match read_queue(&dir, &queue, start, batch, &mut self.reported) {
                Ok(QueueEnd::CaughtUp) => {}
                Ok(QueueEnd::BatchFull) => return (false, true),
                Err(e) => {
                    tracing::error!(%queue, error = %e, "the metadata mirror cannot read a queue log; retrying next tick");
                    self.status.error(e.to_string());
                    all_read = false;
                }
            }
        }
        (all_read, false)
    }

    /// Commits `batch`, then moves the positions and holds.
    async fn write(&mut self, batch: Batch, limit: Duration) -> Result<(), String> {
        let cols = batch.into_columns();
        let Some((_, statements)) = &self.prepared else {
            return Err("statements not prepared".to_owned());
        };
        let Some(conn) = self.link.conn() else {
            return Err("not connected".to_owned());
        };
        // One look per queue per batch: a batch holds few queues.
        let mut epochs: HashMap<&str, i64> = HashMap::new();
        let at = Where {
            node: self.config.node.clone(),
            epochs: cols
                .inserts
                .queue
                .iter()
                .map(|q| {
                    *epochs.entry(q.as_str()).or_insert_with(|| {
                        i64::try_from(self.logs.watermarks.epoch_of(q)).unwrap_or(i64::MAX)
                    })
                })
                .collect(),
        };
        match timeout(limit, transact(&mut conn.client, statements, &cols, &at)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(describe(&e)),
            Err(_) => return Err(format!("a metadata batch took longer than {limit:?}")),
        }
        for missed in &cols.missed {
            tracing::error!(
                queue = %missed.queue,
                from_segment = missed.from.base,
                from_offset = missed.from.offset,
                resume_segment = missed.resume_base,
                "log segments were deleted before the metadata mirror read them: rows for messages of queue {} stored after segment {} offset {} and before segment {} are missing from message_metadata",
                missed.queue, missed.from.base, missed.from.offset, missed.resume_base,
            );
        }
        let released = self.budget.released();
        for (queue, next) in cols.next_seqs {
            raise(&mut self.mirrored_next, queue, next);
        }
        for (queue, position) in cols.positions {
            if !released {
                self.logs.watermarks.set(&queue, position.base);
            }
            self.positions.insert(queue, position);
        }
        self.status.committed(cols.rows, cols.missed.len() as u64);
        Ok(())
    }

    /// Measures the backlog, reports it, and applies the disk budget.
    /// `stored`: each queue's durable messages as of the tick's start.
    fn measure(&mut self, caught_up: bool, stored: &[(Arc<str>, u64)]) {
        if caught_up {
            self.caught_up_at = Instant::now();
            for (queue, next) in stored {
                raise(&mut self.mirrored_next, queue.clone(), *next);
            }
        }
        let lag_rows = stored
            .iter()
            .map(|(queue, next)| {
                let mirrored = self
                    .mirrored_next
                    .get(queue)
                    .copied()
                    .or_else(|| self.positions.get(queue).map(|p| p.base));
                next.saturating_sub(mirrored.unwrap_or(0))
            })
            .sum();
        let lag_seconds = if caught_up {
            0.0
        } else {
            self.caught_up_at.elapsed().as_secs_f64()
        };
        let queues = list_queues(&self.logs.data_dir).unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot list queues to measure the mirror's backlog");
            Vec::new()
        });
        let mut lag_bytes = 0u64;
        let mut holds = Vec::with_capacity(queues.len());
        for name in &queues {
            let position = self.positions.get(name.as_str()).copied();
            match queue_lag(&queue_dir(&self.logs.data_dir, name), position) {
                Ok(lag) => {
                    lag_bytes = lag_bytes.saturating_add(lag.bytes);
                    if let Some(base) = lag.hold {
                        holds.push((name, base));
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %name, error = %e, "cannot measure a queue's mirror backlog")
                }
            }
        }
        self.status.lag(lag_bytes, lag_rows, lag_seconds);
        match self.budget.decide(lag_bytes) {
            Decision::Hold => {}
            Decision::Release { newly } => {
                if newly {
                    tracing::warn!(
                        lag_bytes,
                        budget_bytes = self.config.max_unmirrored_bytes,
                        "the metadata mirror is {lag_bytes} bytes behind the queue logs, over its disk budget of {} bytes: fully acked segments are now deleted without waiting for it, and rows in segments deleted before it reads them will be missing from message_metadata",
                        self.config.max_unmirrored_bytes,
                    );
                }
                self.logs.watermarks.release_all();
            }
            Decision::Restore => {
                tracing::info!(lag_bytes, "the metadata mirror is back within its disk budget; acked segments wait for it again");
                for (queue, base) in holds {
                    self.logs.watermarks.set(queue, base);
                }
            }
        }
    }
}
