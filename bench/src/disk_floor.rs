//! `ciphermq-bench disk-floor`: the publish→ACK latency that a perfect group
//! committer would get from this disk, with no broker, TLS or network in the
//! way. This is the floor under the broker's durable `ACK` tail at a fixed
//! rate.
//!
//! One thread paces appends at `--rate`. One committer thread takes
//! everything that is due and writes it at the end of one file, then calls
//! `fdatasync`, then counts every append of that round as acknowledged.
//! Latency runs from each append's scheduled time, so it includes the wait
//! for the round in flight, as a publish waits in the broker.
//!
//! With `--overwrite-mib` the rounds overwrite a file written with zeros
//! beforehand instead of growing one: the difference between the two is
//! what a log of pre-written, recycled segments would save its `fdatasync`s
//! (no new size or blocks to commit through the file system's journal).
//! Each run also reports the committer thread's CPU time per append, from
//! `/proc/thread-self/schedstat`.
//!
//! With `--depth <n>` there are `n` committer threads, so up to `n` rounds
//! are in flight together, acknowledged in the order they were taken: what
//! a broker that starts a new round while the last one syncs would get.
//!
//! The disk's tail drifts by several times between hours on a shared
//! virtual machine. Run this next to the broker's tail runs
//! (`run-compare.sh` does, in its `tail` section): a broker figure means
//! something only against the floor measured in the same hour.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::args::DiskFloorArgs;
use crate::report::Quantiles;
use crate::scenario::histogram;
use crate::timeline::{Latencies, Timeline};

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
struct FloorRun {
    run: usize,
    /// Appends acknowledged.
    appends: u64,
    /// From each append's scheduled time to the end of its round's
    /// `fdatasync`.
    publish_to_ack: Quantiles,
    /// Rounds: one write and one `fdatasync` each.
    syncs: u64,
    /// How long one round's write plus `fdatasync` took.
    sync: Quantiles,
    /// The committer thread's CPU time per append, µs (writes and
    /// `fdatasync`s, in the kernel mostly); `None` where the kernel does not
    /// report it.
    committer_cpu_us_per_append: Option<f64>,
    /// Worst latency per 100 ms, and the windows over 50 ms.
    timeline: Timeline,
}

/// The appends due and not yet taken by a committer.
#[derive(Default)]
struct Due {
    /// Scheduled times, µs on the run's clock.
    times: Vec<u64>,
    /// The pacer is done: the committers end once `times` is empty.
    closed: bool,
    /// Where the next round writes.
    offset: u64,
    /// The next round's number.
    next_round: u64,
}

/// Rounds acknowledged so far. They are acknowledged in the order they
/// were taken, as the broker answers them: a round whose `fdatasync`
/// returns before an earlier one's waits for it.
#[derive(Default)]
struct Finished {
    /// The number of the next round to acknowledge.
    next: u64,
    /// A committer failed: the others stop waiting for its round.
    failed: bool,
    latencies: Latencies,
}

/// What the pacer and the committers share.
#[derive(Default)]
struct Shared {
    due: Mutex<Due>,
    /// Signalled when appends are due, and at the end.
    ready: Condvar,
    finished: Mutex<Finished>,
    /// Signalled when a round is acknowledged.
    in_order: Condvar,
}

/// What the committers hand back at the end of a run.
struct Committed {
    latencies: Latencies,
    syncs: Histogram<u64>,
    /// The committer threads' CPU time over the run.
    cpu: Option<Duration>,
}

/// What one committer thread hands back.
struct CommitterRun {
    syncs: Histogram<u64>,
    cpu: Option<Duration>,
}

/// Runs `--runs` runs and prints (and optionally writes) their figures.
pub fn run(args: &DiskFloorArgs) -> Result<()> {
    if args.rate == 0 || args.record_bytes == 0 || args.runs == 0 || args.depth == 0 {
        bail!("--rate, --record-bytes, --runs and --depth must be above zero");
    }
    if args.duration.is_zero() {
        bail!("--duration must be above zero");
    }
    fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating the directory {}", args.dir.display()))?;
    let mut runs = Vec::with_capacity(args.runs);
    for run in 1..=args.runs {
        let path = args
            .dir
            .join(format!("disk-floor-{}-{run}.log", std::process::id()));
        let outcome = one_run(args, &path);
        // The file goes whether the run worked or not.
        let _ = fs::remove_file(&path);
        let result =
            outcome.with_context(|| format!("disk-floor run {run} in {}", path.display()))?;
        let appends = result.latencies.histogram.len();
        let floor = FloorRun {
            run,
            appends,
            publish_to_ack: Quantiles::of(&result.latencies.histogram),
            syncs: result.syncs.len(),
            sync: Quantiles::of(&result.syncs),
            committer_cpu_us_per_append: result
                .cpu
                .map(|cpu| cpu.as_secs_f64() * 1e6 / appends.max(1) as f64),
            timeline: result.latencies.timeline(0),
        };
        println!(
            "floor {run}/{}: {} appends in {} rounds; publish→ACK p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2} ms; write+fdatasync p50 {:.2} p99 {:.2} max {:.2} ms; committer CPU {} µs/append; stalls: {}",
            args.runs,
            floor.appends,
            floor.syncs,
            floor.publish_to_ack.p50_ms,
            floor.publish_to_ack.p99_ms,
            floor.publish_to_ack.p999_ms,
            floor.publish_to_ack.max_ms,
            floor.sync.p50_ms,
            floor.sync.p99_ms,
            floor.sync.max_ms,
            floor
                .committer_cpu_us_per_append
                .map_or("-".to_owned(), |us| format!("{us:.2}")),
            floor.timeline.describe(),
        );
        runs.push(floor);
    }
    let medians = Quantiles::median(&runs.iter().map(|r| r.publish_to_ack).collect::<Vec<_>>());
    println!(
        "floor, medians of {} runs: publish→ACK p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2} ms",
        runs.len(),
        medians.p50_ms,
        medians.p99_ms,
        medians.p999_ms,
        medians.max_ms
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "dir": args.dir,
            "rate": args.rate,
            "record_bytes": args.record_bytes,
            "overwrite_mib": args.overwrite_mib,
            "depth": args.depth,
            "duration_secs": args.duration.as_secs_f64(),
            "runs": runs,
            "median": { "publish_to_ack": medians },
        });
        fs::write(path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One run: the pacer on this thread, `--depth` committers on their own.
fn one_run(args: &DiskFloorArgs, path: &Path) -> Result<Committed> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .context("creating the file")?;
    let wrap = match args.overwrite_mib {
        Some(mib) => Some(prewrite(&file, mib << 20, args.record_bytes)?),
        None => None,
    };
    let file = Arc::new(file);
    let shared = Arc::new(Shared::default());
    let start = Instant::now();
    let committers = (0..args.depth)
        .map(|i| {
            let (file, shared) = (file.clone(), shared.clone());
            let record_bytes = args.record_bytes;
            std::thread::Builder::new()
                .name(format!("disk-floor-commit-{i}"))
                .spawn(move || commit(&file, &shared, start, record_bytes, wrap))
                .context("starting a committer thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let total = (args.duration.as_secs_f64() * args.rate as f64).round() as u64;
    let interval_ns = 1e9 / args.rate as f64;
    for i in 0..total {
        let at = Duration::from_nanos((i as f64 * interval_ns) as u64);
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        shared
            .due
            .lock()
            .expect("a committer does not panic holding the lock")
            .times
            .push(at.as_micros() as u64);
        shared.ready.notify_one();
    }
    close(&shared);
    let mut syncs = histogram();
    let mut cpu = Some(Duration::ZERO);
    for committer in committers {
        let run = committer
            .join()
            .map_err(|_| anyhow::anyhow!("a committer thread panicked"))??;
        syncs
            .add(&run.syncs)
            .context("adding a committer's rounds")?;
        cpu = cpu.zip(run.cpu).map(|(a, b)| a + b);
    }
    let latencies = std::mem::take(
        &mut shared
            .finished
            .lock()
            .expect("every committer has ended")
            .latencies,
    );
    Ok(Committed {
        latencies,
        syncs,
        cpu,
    })
}

/// Tells every committer that no more appends come.
fn close(shared: &Shared) {
    shared
        .due
        .lock()
        .expect("a committer does not panic holding the lock")
        .closed = true;
    shared.ready.notify_all();
}

/// Fills `file` with `bytes` of zeros (whole records) and syncs it, for
/// overwriting; returns its length.
fn prewrite(file: &File, bytes: u64, record_bytes: usize) -> Result<u64> {
    let len = bytes / record_bytes as u64 * record_bytes as u64;
    if len == 0 {
        bail!("--overwrite-mib must hold at least one record");
    }
    let zeros = vec![0u8; 1 << 20];
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], offset)
            .context("writing the file to overwrite")?;
        offset += n as u64;
    }
    file.sync_all().context("syncing the file to overwrite")?;
    Ok(len)
}

/// This thread's CPU time so far (`/proc/thread-self/schedstat`, in ns).
fn thread_cpu() -> Option<Duration> {
    let (on_cpu, _) = crate::report::schedstat("/proc/thread-self/schedstat")?;
    Some(Duration::from_nanos(on_cpu))
}

/// A committer: one write and one `fdatasync` per round, every round taking
/// all that is due, and acknowledged once every earlier round is. With
/// `wrap` (the length of a pre-written file) rounds write from the start
/// again once the next would not fit. Several committers keep that many
/// rounds in flight (`--depth`).
fn commit(
    file: &File,
    shared: &Shared,
    start: Instant,
    record_bytes: usize,
    wrap: Option<u64>,
) -> Result<CommitterRun> {
    let outcome = commit_rounds(file, shared, start, record_bytes, wrap);
    if outcome.is_err() {
        // The others must not wait for a round that will never finish.
        shared
            .finished
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .failed = true;
        shared.in_order.notify_all();
    }
    outcome
}

fn commit_rounds(
    file: &File,
    shared: &Shared,
    start: Instant,
    record_bytes: usize,
    wrap: Option<u64>,
) -> Result<CommitterRun> {
    let cpu_before = thread_cpu();
    let mut syncs = histogram();
    let mut round: Vec<u64> = Vec::new();
    let mut bytes: Vec<u8> = Vec::new();
    loop {
        let (number, offset, len) = {
            let mut due = shared
                .due
                .lock()
                .expect("the pacer does not panic holding the lock");
            while due.times.is_empty() && !due.closed {
                due = shared
                    .ready
                    .wait(due)
                    .expect("the pacer does not panic holding the lock");
            }
            if due.times.is_empty() {
                break;
            }
            std::mem::swap(&mut round, &mut due.times);
            // Overwriting, a round never outgrows the file: what does not
            // fit stays due for the next round (a committer kept off the
            // CPU on a busy host may find thousands due at once).
            if let Some(end) = wrap {
                let fits = ((end / record_bytes as u64) as usize).max(1);
                if round.len() > fits {
                    due.times.extend(round.drain(fits..));
                }
            }
            let len = round.len() * record_bytes;
            if wrap.is_some_and(|end| due.offset + len as u64 > end) {
                due.offset = 0;
            }
            let offset = due.offset;
            due.offset += len as u64;
            due.next_round += 1;
            (due.next_round - 1, offset, len)
        };
        if bytes.len() < len {
            bytes.resize(len, b'x');
        }
        let began = Instant::now();
        file.write_all_at(&bytes[..len], offset)
            .context("writing a round")?;
        file.sync_data().context("fdatasync")?;
        let _ = syncs.record((began.elapsed().as_micros() as u64).max(1));
        let mut finished = shared
            .finished
            .lock()
            .expect("a committer does not panic holding the lock");
        while finished.next != number {
            if finished.failed {
                bail!("another committer failed");
            }
            finished = shared
                .in_order
                .wait(finished)
                .expect("a committer does not panic holding the lock");
        }
        let done = start.elapsed().as_micros() as u64;
        for at in round.drain(..) {
            finished.latencies.record(at, done);
        }
        finished.next += 1;
        shared.in_order.notify_all();
    }
    let cpu = thread_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    Ok(CommitterRun { syncs, cpu })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_paced_append_is_committed_and_the_file_removed() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("floor.json");
        let args = DiskFloorArgs {
            dir: dir.path().join("disk"),
            rate: 2_000,
            record_bytes: 100,
            duration: Duration::from_millis(250),
            runs: 2,
            overwrite_mib: None,
            depth: 1,
            json: Some(json.clone()),
        };
        run(&args).unwrap();
        let report: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
        let runs = report["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2);
        for r in runs {
            assert_eq!(r["appends"], 500);
            let syncs = r["syncs"].as_u64().unwrap();
            assert!((1..=500).contains(&syncs), "{syncs} rounds");
        }
        assert_eq!(
            fs::read_dir(&args.dir).unwrap().count(),
            0,
            "scratch files left behind"
        );
    }

    #[test]
    fn overwriting_commits_every_append_without_growing_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("scratch.log");
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
            .unwrap();
        // 1 MiB of 1,000-byte records holds 1,048 of them: 3,000 appends
        // wrap around it twice.
        let len = prewrite(&f, 1 << 20, 1_000).unwrap();
        assert_eq!(len, 1_048_000);
        let shared = Arc::new(Shared::default());
        let committer = {
            let shared = shared.clone();
            std::thread::spawn(move || commit(&f, &shared, Instant::now(), 1_000, Some(len)))
        };
        for batch in 0..30u64 {
            shared
                .due
                .lock()
                .unwrap()
                .times
                .extend((0..100).map(|i| batch * 100 + i));
            shared.ready.notify_one();
            std::thread::sleep(Duration::from_millis(1));
        }
        close(&shared);
        let committed = committer.join().unwrap().unwrap();
        let acked = shared.finished.lock().unwrap().latencies.histogram.len();
        assert_eq!(acked, 3_000);
        assert_eq!(fs::metadata(&file).unwrap().len(), len, "the file grew");
        assert!(committed.cpu.is_some(), "no CPU time read");
    }

    #[test]
    fn rounds_in_flight_together_all_finish_and_leave_no_hole() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("scratch.log");
        let f = Arc::new(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&file)
                .unwrap(),
        );
        let shared = Arc::new(Shared::default());
        let committers: Vec<_> = (0..3)
            .map(|_| {
                let (f, shared) = (f.clone(), shared.clone());
                std::thread::spawn(move || commit(&f, &shared, Instant::now(), 100, None))
            })
            .collect();
        // Two appends every 200 µs: a round is often taken while others
        // are still syncing.
        for batch in 0..200u64 {
            shared
                .due
                .lock()
                .unwrap()
                .times
                .extend([batch * 2, batch * 2 + 1]);
            shared.ready.notify_one();
            std::thread::sleep(Duration::from_micros(200));
        }
        close(&shared);
        let rounds: u64 = committers
            .into_iter()
            .map(|c| c.join().unwrap().unwrap().syncs.len())
            .sum();
        let finished = shared.finished.lock().unwrap();
        assert_eq!(finished.latencies.histogram.len(), 400);
        assert_eq!(finished.next, rounds, "every round acknowledged, once");
        assert_eq!(shared.due.lock().unwrap().next_round, rounds);
        // Rounds wrote disjoint, adjacent ranges: the file is exactly the
        // appends, with no hole and nothing written twice.
        assert_eq!(fs::metadata(&file).unwrap().len(), 400 * 100);
        let bytes = fs::read(&file).unwrap();
        assert!(bytes.iter().all(|b| *b == b'x'), "a hole in the file");
    }

    #[test]
    fn a_zero_rate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let args = DiskFloorArgs {
            dir: dir.path().to_path_buf(),
            rate: 0,
            record_bytes: 100,
            duration: Duration::from_millis(10),
            runs: 1,
            overwrite_mib: None,
            depth: 1,
            json: None,
        };
        assert!(run(&args).unwrap_err().to_string().contains("--rate"));
    }
}
