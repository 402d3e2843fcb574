//! `ciphermq-bench idle`: opens many mTLS connections that do nothing after the
//! greeting, holds them, and reports the broker's memory per connection.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use tokio::sync::Semaphore;

use crate::args::IdleArgs;
use crate::report::Memory;

/// Opens `--connections` connections, `--parallel` handshakes at a time.
pub async fn run(args: IdleArgs) -> Result<()> {
    if args.cns.is_empty() || args.connections == 0 || args.parallel == 0 {
        bail!("--cns, --connections and --parallel must not be empty or zero");
    }
    let mut tls = Vec::new();
    for cn in &args.cns {
        let opts = TlsClientOptions::for_cn(&args.certs, cn);
        tls.push(Arc::new((opts.connector()?, opts.server_name()?)));
    }
    let before = args.broker_pid.and_then(Memory::of);
    let start = Instant::now();
    let gate = Arc::new(Semaphore::new(args.parallel));
    let mut tasks = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let permit = gate.clone().acquire_owned().await?;
        let tls = tls[i % tls.len()].clone();
        let addr = args.addr.clone();
        tasks.push(tokio::spawn(async move {
            let conn = Connection::connect_with(&addr, &tls.0, tls.1.clone()).await;
            drop(permit);
            conn
        }));
    }
    let mut conns = Vec::with_capacity(args.connections);
    for (i, t) in tasks.into_iter().enumerate() {
        conns.push(
            t.await?
                .with_context(|| format!("opening idle connection {i} (raise `ulimit -n`?)"))?,
        );
    }
    let connect_secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} connections open after {connect_secs:.1} s; holding for {:?}",
        conns.len(),
        args.hold
    );
    tokio::time::sleep(args.hold).await;
    let during = args.broker_pid.and_then(Memory::of);
    drop(conns);

    let per_conn_kib = match (before, during) {
        (Some(b), Some(d)) => Some((d.rss_mib - b.rss_mib) * 1024.0 / args.connections as f64),
        _ => None,
    };
    let result = serde_json::json!({
        "connections": args.connections,
        "connect_secs": connect_secs,
        "handshakes_per_sec": args.connections as f64 / connect_secs,
        "broker_before": before,
        "broker_with_connections": during,
        "broker_kib_per_connection": per_conn_kib,
    });
    println!(
        "{} idle mTLS connections: {:.0} handshakes/s{}",
        args.connections,
        args.connections as f64 / connect_secs,
        match (before, during, per_conn_kib) {
            (Some(b), Some(d), Some(k)) => format!(
                "; broker RSS {:.1} MiB before, {:.1} MiB with them: {k:.1} KiB per connection",
                b.rss_mib, d.rss_mib
            ),
            _ => String::new(),
        }
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
