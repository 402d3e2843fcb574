//! The broker's stall watch: a shard held off its core for a while (here
//! the whole process, stopped with SIGSTOP and continued) is counted in
//! `ciphermq_shard_stalls_total` and logged with how late the turn came and
//! the step the shard began last. The nudge thread (`nudge.rs`) runs beside
//! the shards, and its count is exported for each of them.

mod common;

use std::time::{Duration, Instant};

use common::process::BrokerProcess;
use common::{config_text, pki};

/// `ciphermq_shard_stalls_total`, summed over shards.
async fn stalls(broker: &BrokerProcess) -> f64 {
    let (status, text) = broker.admin_get("admin", "/metrics").await;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| l.starts_with("ciphermq_shard_stalls_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn signal(broker: &BrokerProcess, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(broker.pid()).unwrap();
    // SAFETY: kill(2) on the broker child this test started; no memory is
    // shared with it.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal the broker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_held_off_its_core_is_counted_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let admin = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, admin)
        .replace("console = false", "console = true\nlevel = \"warn\"");
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);

    // A loaded test machine may hold a debug build up for 20 ms on its
    // own; only the stall of the stop below is asserted (by its length).
    let before = stalls(&broker).await;
    signal(&broker, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(300));
    signal(&broker, libc::SIGCONT);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = stalls(&broker).await;
        if n > before && broker.logged(&["shard loop stalled", "late_ms", "last_step"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "300 ms off the CPU went unnoticed: {n} stalls counted; log:\n{}",
            broker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late: Vec<u64> = broker
        .log_text()
        .lines()
        .filter(|l| l.contains("shard loop stalled"))
        .filter_map(|l| {
            let at = l.find("late_ms=")? + "late_ms=".len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        late.iter().any(|ms| *ms >= 250),
        "the stall logged is not the 300 ms one: {late:?}"
    );
    // The nudge thread's count is there for every shard. (A stopped process
    // is no sleeping shard, and its nudge thread was stopped with it.)
    let (_, text) = broker.admin_get("admin", "/metrics").await;
    for shard in 0..2 {
        let series = format!("ciphermq_shard_nudges_total{{shard=\"{shard}\"}}");
        assert!(text.contains(&series), "{series} missing:\n{text}");
    }
    // The thread that wakes a shard asleep with work runnable is running:
    // without it only the benchmarks would show the executor's long
    // sleeps (nudge.rs).
    let threads = thread_names(broker.pid());
    assert_eq!(
        threads.iter().filter(|n| *n == "shard-nudge").count(),
        1,
        "one nudge thread expected among {threads:?}"
    );
}

/// `ciphermq_shard_cpu_starved_total`, summed over shards.
async fn cpu_starved(broker: &BrokerProcess) -> f64 {
    let (status, text) = broker.admin_get("admin", "/metrics").await;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| l.starts_with("ciphermq_shard_cpu_starved_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Puts every thread of `pid` under `policy` (`SCHED_IDLE`: it runs only
/// when nothing else wants the CPU; `SCHED_OTHER`: back to normal).
fn set_policy(pid: u32, policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the broker's threads") {
        let tid: libc::pid_t = task.unwrap().file_name().to_string_lossy().parse().unwrap();
        // SAFETY: sched_setscheduler on a thread of the broker child this
        // test started, with a valid parameter block.
        let done = unsafe { libc::sched_setscheduler(tid, policy, &param) };
        assert_eq!(
            done,
            0,
            "sched_setscheduler({tid}): {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Busy-loop processes (`yes`), killed when dropped.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start(n: usize) -> Hogs {
        Hogs(
            (0..n)
                .map(|_| {
                    std::process::Command::new("yes")
                        .stdout(std::process::Stdio::null())
                        .spawn()
                        .expect("start yes")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}

/// An idle broker on a machine whose cores other processes keep busy (here
/// a `yes` per core, with the broker's threads under `SCHED_IDLE` so that
/// they surely wait) gets its turns late: that is the host's contention,
/// counted in `ciphermq_shard_cpu_starved_total` and logged at info, never
/// counted or logged as a stall of the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_a_busy_host_delays_are_not_called_stalls() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    let admin = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";
    let text = config_text(&pki().certs, &dir.path().join("data"), 2, admin)
        .replace("console = false", "console = true\nlevel = \"info\"");
    std::fs::write(&config, text).unwrap();
    let broker = BrokerProcess::start(&config);
    // A busy test host may have made the start itself stall: only what
    // happens from here on counts.
    let stall_lines = |b: &BrokerProcess| b.log_text().matches("shard loop stalled").count();
    let (stalls_before, starved_before) = (stalls(&broker).await, cpu_starved(&broker).await);
    let stall_lines_before = stall_lines(&broker);

    set_policy(broker.pid(), libc::SCHED_IDLE);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs = Hogs::start(cores);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !broker.logged(&["shard loop waited for a CPU", "waited_ms"]) {
        assert!(
            Instant::now() < deadline,
            "no turn was seen waiting for a CPU behind {cores} busy loops; log:\n{}",
            broker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(hogs);
    set_policy(broker.pid(), libc::SCHED_OTHER);

    assert!(
        cpu_starved(&broker).await > starved_before,
        "the late turns are counted in ciphermq_shard_cpu_starved_total"
    );
    let stalls_after = stalls(&broker).await;
    assert_eq!(
        stalls_after,
        stalls_before,
        "turns the host delayed were counted as stalls; log:\n{}",
        broker.log_text()
    );
    assert_eq!(
        stall_lines(&broker),
        stall_lines_before,
        "turns the host delayed were logged as stalls:\n{}",
        broker.log_text()
    );
}

/// The names of a process's threads, from `/proc`.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the broker's threads are listed in /proc")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .collect()
}
