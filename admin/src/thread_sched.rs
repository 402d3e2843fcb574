//! How a shard's threads fared with the kernel's scheduler, read from
//! `/proc/self/task/<tid>/schedstat` at each scrape (on the admin thread):
//! time on a CPU, and time ready to run but waiting for one.
//!
//! The second is what tells a slow broker from a starved one. When the
//! clients, or anything else, share the shard's cores, a publish waits for
//! the shard's turn on a CPU, and no histogram of the broker's own steps
//! shows it. On a 2-core machine at half its peak rate, the shard thread
//! waited for a CPU about a third of the time it was ready to run
//! (docs/benchmarks-journal.md).

use std::fs;
use std::os::unix::fs::FileExt as _;

/// One thread's totals since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadSched {
    /// Time on a CPU, in nanoseconds.
    pub(crate) on_cpu_ns: u64,
    /// Time ready to run but waiting for a CPU, in nanoseconds.
    pub(crate) waiting_ns: u64,
}

/// Reads thread `tid` of this process; `None` when it is gone or the
/// kernel keeps no such figures.
pub(crate) fn read(tid: i32) -> Option<ThreadSched> {
    parse(&fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?)
}

/// The calling thread's own figures, kept open so that each read is one
/// `pread` of a procfs file (no disk, nothing to wait for): the stall watch
/// reads it every turn, on the shard's thread, to tell a turn the shard
/// held from one the host did not give it.
#[derive(Debug)]
pub struct OwnSchedstat {
    file: fs::File,
}

impl OwnSchedstat {
    /// Opens the calling thread's figures; `None` where the kernel keeps
    /// none.
    pub fn open() -> Option<OwnSchedstat> {
        let file = fs::File::open("/proc/thread-self/schedstat").ok()?;
        Some(OwnSchedstat { file })
    }

    /// Nanoseconds the thread has waited, ready to run, for a CPU, since it
    /// started.
    pub fn waiting_ns(&self) -> Option<u64> {
        let mut text = [0u8; 96];
        let n = self.file.read_at(&mut text, 0).ok()?;
        parse(std::str::from_utf8(&text[..n]).ok()?).map(|s| s.waiting_ns)
    }
}

/// `schedstat` is three numbers: time on a CPU (ns), time waiting on a run
/// queue (ns), and time slices run.
fn parse(text: &str) -> Option<ThreadSched> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some(ThreadSched {
        on_cpu_ns: fields.next()?.ok()?,
        waiting_ns: fields.next()?.ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_numbers_and_refuses_anything_else() {
        assert_eq!(
            parse("5942170941 3153484921 61398\n"),
            Some(ThreadSched {
                on_cpu_ns: 5_942_170_941,
                waiting_ns: 3_153_484_921,
            })
        );
        assert_eq!(parse(""), None);
        assert_eq!(parse("12\n"), None);
        assert_eq!(parse("12 x 3\n"), None);
    }

    #[test]
    fn this_thread_s_time_on_a_cpu_grows_as_it_spins() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let before = read(tid).expect("this kernel keeps schedstat");
        // However busy the machine, spinning adds CPU time; give up after
        // 10 s of wall time if the figure never moves.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut now = before;
        while now.on_cpu_ns < before.on_cpu_ns + 10_000_000 {
            assert!(std::time::Instant::now() < deadline, "{before:?} → {now:?}");
            std::hint::spin_loop();
            now = read(tid).expect("still readable");
        }
        assert!(now.waiting_ns >= before.waiting_ns, "{before:?} → {now:?}");
        assert_eq!(read(-1), None);
    }

    #[test]
    fn the_open_file_reads_this_thread_s_figures_again_and_again() {
        let own = OwnSchedstat::open().expect("this kernel keeps schedstat");
        let first = own.waiting_ns().expect("readable");
        let second = own.waiting_ns().expect("readable again");
        assert!(second >= first, "{first} → {second}");
        // The figures of the thread that opened it, read from another one.
        let from_elsewhere = std::thread::scope(|s| s.spawn(|| own.waiting_ns()).join());
        assert!(from_elsewhere.expect("joined").expect("readable") >= second);
    }
}
