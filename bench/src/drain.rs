//! `ciphermq-bench drain`: consumes a queue that was filled earlier (by a
//! publish-only run, possibly before a restart), acks every delivery, and
//! checks the ids: every message once, none missing. Prints the rate every
//! second, so the drain of a backlog on disk can be compared with one held
//! in memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_proto::Delivery;

use crate::args::DrainArgs;

/// Seen ids of one publisher: a bitmap over their sequence numbers.
#[derive(Default)]
struct Seen {
    bits: Vec<u64>,
    count: u64,
}

impl Seen {
    /// Marks `seq`; false when it was seen before.
    fn mark(&mut self, seq: u64) -> bool {
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        let fresh = self.bits[word] & (1 << bit) == 0;
        self.bits[word] |= 1 << bit;
        self.count += u64::from(fresh);
        fresh
    }

    /// Sequence numbers below the highest seen that were never seen.
    fn gaps(&self) -> u64 {
        let Some(last) = self.bits.iter().rposition(|w| *w != 0) else {
            return 0;
        };
        let top = last as u64 * 64 + (63 - u64::from(self.bits[last].leading_zeros()));
        top + 1 - self.count
    }
}

/// `p{publisher}s{seq}` at the end of a bench id.
fn publisher_and_seq(id: &str) -> Option<(u32, u64)> {
    let (head, seq) = id.rsplit_once('s')?;
    let (_, publisher) = head.rsplit_once('p')?;
    Some((publisher.parse().ok()?, seq.parse().ok()?))
}

/// Consumes `--queue` until `--expect` distinct messages arrived (or none
/// came for `--idle`), then reports.
pub async fn run(args: DrainArgs) -> Result<()> {
    let opts = TlsClientOptions::for_cn(&args.certs, &args.receiver);
    let mut conn = Connection::connect(&args.addr, &opts)
        .await
        .with_context(|| {
            format!(
                "connecting to CipherMQ at {} as {}",
                args.addr, args.receiver
            )
        })?;
    let reply = conn
        .request(&format!("consume {} {}", args.queue, args.prefetch))
        .await?;
    if !reply.starts_with("OK ") {
        bail!("consume {}: {reply}", args.queue);
    }
    let (mut rd, mut wr) = conn.into_split();
    let ack_suffix = format!(" {}\n", args.queue);
    let mut seen: HashMap<u32, Seen> = HashMap::new();
    let (mut delivered, mut duplicates, mut unparsed) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut last_report = (start, 0u64);
    let mut first_at = None;
    loop {
        let distinct: u64 = seen.values().map(|s| s.count).sum();
        if distinct >= args.expect {
            break;
        }
        let line = match tokio::time::timeout(args.idle, rd.read_line()).await {
            Ok(line) => line?.context("the broker closed the connection")?,
            Err(_) => break,
        };
        let Some(d) = Delivery::parse(&line) else {
            if line.starts_with("ACK_CONFIRMED ") {
                continue;
            }
            bail!("unexpected line: {line}");
        };
        first_at.get_or_insert_with(Instant::now);
        delivered += 1;
        match publisher_and_seq(d.message_id) {
            Some((p, s)) => {
                if !seen.entry(p).or_default().mark(s) {
                    duplicates += 1;
                }
            }
            None => unparsed += 1,
        }
        wr.queue_bytes(b"ack ");
        wr.queue_bytes(d.message_id.as_bytes());
        wr.queue_bytes(ack_suffix.as_bytes());
        if delivered % 256 == 0 {
            wr.flush().await?;
        }
        let now = Instant::now();
        if now.duration_since(last_report.0) >= Duration::from_secs(1) {
            let rate = (delivered - last_report.1) as f64
                / now.duration_since(last_report.0).as_secs_f64();
            println!(
                "t={:.0}s delivered={delivered} rate={rate:.0}/s",
                now.duration_since(start).as_secs_f64()
            );
            last_report = (now, delivered);
        }
    }
    wr.flush().await?;
    let took = first_at.map_or(Duration::ZERO, |t| t.elapsed());
    let distinct: u64 = seen.values().map(|s| s.count).sum();
    let missing = args.expect.saturating_sub(distinct);
    let gaps: u64 = seen.values().map(Seen::gaps).sum();
    println!(
        "drained: delivered={delivered} distinct={distinct} duplicates={duplicates} missing={missing} gaps={gaps} unparsed={unparsed} seconds={:.2} rate={:.0}/s",
        took.as_secs_f64(),
        delivered as f64 / took.as_secs_f64().max(1e-9)
    );
    if duplicates > 0 || missing > 0 || gaps > 0 {
        bail!("ids do not check: {duplicates} duplicated, {missing} missing, {gaps} gaps");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_and_gaps_counted() {
        assert_eq!(
            publisher_and_seq("rabcdef01p0003s0000000042"),
            Some((3, 42))
        );
        let mut s = Seen::default();
        assert!(s.mark(0) && s.mark(2) && !s.mark(2));
        assert_eq!((s.count, s.gaps()), (2, 1));
    }
}
