//! The PostgreSQL coordinator's thread: it owns the connection, runs one
//! call at a time on a tokio current-thread runtime, and reconnects when a
//! call finds the connection gone. Callers block on the answer, so they
//! need no runtime of their own.

use std::future::Future;
use std::pin::Pin;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls};

use ciphermq_pgbridge::postgres::describe;

use crate::config::PgCoordinatorConfig;
use crate::error::ClusterError;
use crate::schema;

/// Longest one call (connecting included) may take: a server that hangs,
/// or a network that silently drops packets, fails the call instead of
/// holding the thread, and so every later call, for good.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A future borrowing the connection, run on the worker thread.
pub(crate) type LocalFuture<'c, T> = Pin<Box<dyn Future<Output = T> + 'c>>;

/// One call: given the session, it runs and sends its own answer.
type Job = Box<dyn for<'c> FnOnce(&'c mut Session) -> LocalFuture<'c, ()> + Send>;

/// Pins `f`'s type to the higher-ranked signature a [`Job`] needs.
fn job<F>(f: F) -> Job
where
    F: for<'c> FnOnce(&'c mut Session) -> LocalFuture<'c, ()> + Send + 'static,
{
    Box::new(f)
}

/// The connection and what is needed to reopen it.
pub(crate) struct Session {
    config: PgCoordinatorConfig,
    client: Option<Client>,
}

impl Session {
    /// The open connection, opening one (one attempt) if there is none or
    /// the last one broke.
    async fn client(&mut self) -> Result<&mut Client, ClusterError> {
        let client = match self.client.take() {
            Some(client) if !client.is_closed() => client,
            _ => open(&self.config).await?,
        };
        Ok(self.client.insert(client))
    }
}

/// One connection attempt; the connection's I/O runs as a task of the
/// worker's runtime.
async fn open(config: &PgCoordinatorConfig) -> Result<Client, ClusterError> {
    let (client, connection) =
        config
            .driver()
            .connect(NoTls)
            .await
            .map_err(|e| ClusterError::Connect {
                target: config.target(),
                cause: describe(&e),
            })?;
    let target = config.target();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(%target, "cluster coordinator connection lost: {}", describe(&e));
        }
    });
    Ok(client)
}

/// The running thread, and the queue of calls to it.
pub(crate) struct Worker {
    /// `None` once shutting down: dropping it ends the thread's loop.
    jobs: Option<mpsc::UnboundedSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread, connects and creates the schema; returns once
    /// that has succeeded, or with its error.
    pub(crate) fn start(config: PgCoordinatorConfig) -> Result<Worker, ClusterError> {
        config.check_schema()?;
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("cluster-pg".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(ClusterError::Thread(e.to_string())));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut session = Session {
                        config,
                        client: None,
                    };
                    let schema = session.config.schema.clone();
                    let target = session.config.target();
                    let started = match session.client().await {
                        Ok(client) => schema::ensure(client, &schema).await.map_err(|e| {
                            ClusterError::Schema {
                                target,
                                schema,
                                cause: describe(&e),
                            }
                        }),
                        Err(e) => Err(e),
                    };
                    let ok = started.is_ok();
                    let _ = ready_tx.send(started);
                    if !ok {
                        return;
                    }
                    while let Some(job) = queue.recv().await {
                        job(&mut session).await;
                    }
                });
            })
            .map_err(|e| ClusterError::Thread(e.to_string()))?;
        let mut worker = Worker {
            jobs: Some(jobs),
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(worker),
            Ok(Err(e)) => {
                worker.stop();
                Err(e)
            }
            Err(_) => {
                worker.stop();
                Err(ClusterError::Stopped)
            }
        }
    }

    /// Runs `f` with the connection on the worker thread and waits for its
    /// answer. A connection that cannot be (re)opened is `f`'s error too.
    pub(crate) fn call<T, F>(&self, f: F) -> Result<T, ClusterError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Client) -> LocalFuture<'c, Result<T, ClusterError>>
            + Send
            + 'static,
    {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let run = job(move |session: &mut Session| {
            Box::pin(async move {
                let attempt = tokio::time::timeout(CALL_TIMEOUT, async {
                    match session.client().await {
                        Ok(client) => f(client).await,
                        Err(e) => Err(e),
                    }
                })
                .await;
                let result = attempt.unwrap_or_else(|_| {
                    // A connection that stopped answering is not trusted
                    // again: the next call opens a new one.
                    session.client = None;
                    Err(ClusterError::NoAnswer {
                        target: session.config.target(),
                        secs: CALL_TIMEOUT.as_secs(),
                    })
                });
                let _ = answer.send(result);
            })
        });
        self.jobs
            .as_ref()
            .ok_or(ClusterError::Stopped)?
            .send(run)
            .map_err(|_| ClusterError::Stopped)?;
        answered.recv().map_err(|_| ClusterError::Stopped)?
    }

    /// Ends the thread (after the call in progress) and joins it.
    fn stop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the cluster coordinator thread panicked");
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}
