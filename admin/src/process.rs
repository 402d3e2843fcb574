//! The broker process as the kernel sees it, read from `/proc/self` at each
//! scrape (on the admin thread, never a shard): CPU time, resident and
//! virtual memory, open descriptors against their limit, and start time.
//!
//! Prometheus client libraries export these as `process_*`; here they keep
//! the `ciphermq_` prefix every series of the endpoint has.

use std::fs;

/// What one reading found; a field that could not be read is `None` and
/// its series is left out.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub(crate) cpu_seconds: Option<f64>,
    /// Resident memory, in bytes.
    pub(crate) resident_bytes: Option<u64>,
    /// Virtual memory, in bytes.
    pub(crate) virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub(crate) open_fds: Option<u64>,
    /// The soft limit on open file descriptors.
    pub(crate) max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub(crate) start_time_seconds: Option<f64>,
}

/// Reads this process's numbers.
pub(crate) fn read() -> ProcessStats {
    let ticks = clock_ticks_per_second() as f64;
    let page = page_size();
    let stat = fs::read_to_string("/proc/self/stat").ok();
    let fields = stat.as_deref().and_then(stat_fields);
    let field = |i: usize| fields.as_ref().and_then(|f| f.get(i)?.parse::<u64>().ok());
    let boot = fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| boot_time(&text));
    let ticks_ok = ticks > 0.0;
    ProcessStats {
        cpu_seconds: match (field(UTIME), field(STIME)) {
            (Some(u), Some(s)) if ticks_ok => Some((u + s) as f64 / ticks),
            _ => None,
        },
        resident_bytes: field(RSS_PAGES).map(|p| p.saturating_mul(page)),
        virtual_bytes: field(VSIZE),
        open_fds: fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as u64),
        max_fds: fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|text| soft_limit(&text, "Max open files")),
        start_time_seconds: match (boot, field(STARTTIME)) {
            (Some(boot), Some(start)) if ticks_ok => Some(boot as f64 + start as f64 / ticks),
            _ => None,
        },
    }
}

// Indexes into the fields after the command name of `/proc/self/stat`
// (field 3, `state`, is index 0; see proc(5)).
const UTIME: usize = 11;
const STIME: usize = 12;
const STARTTIME: usize = 19;
const VSIZE: usize = 20;
const RSS_PAGES: usize = 21;

/// The fields of `/proc/<pid>/stat` after `(comm)`, which may itself hold
/// spaces and parentheses: everything after its last `)`.
fn stat_fields(text: &str) -> Option<Vec<&str>> {
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// The `btime` line of `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of the `/proc/<pid>/limits` row `name` (`None` when
/// unlimited or missing).
fn soft_limit(text: &str, name: &str) -> Option<u64> {
    let row = text.lines().find(|l| l.starts_with(name))?;
    row[name.len()..].split_whitespace().next()?.parse().ok()
}

/// Clock ticks per second (`_SC_CLK_TCK`), the unit of `/proc` CPU times;
/// 0 if unknown.
fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).unwrap_or(0)
}

/// The memory page size (`_SC_PAGESIZE`), the unit of `/proc` RSS; 4096
/// if unknown.
fn page_size() -> u64 {
    // SAFETY: as above.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|n| *n > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_proc_formats() {
        let stat = "4242 (ciphermq (shard) 0) S 1 4242 4242 0 -1 4194560 1 0 0 0 \
                    150 50 0 0 20 0 9 0 12345 987654 321 18446744073709551615";
        let f = stat_fields(stat).unwrap();
        assert_eq!(f[0], "S");
        assert_eq!((f[UTIME], f[STIME]), ("150", "50"));
        assert_eq!(
            (f[STARTTIME], f[VSIZE], f[RSS_PAGES]),
            ("12345", "987654", "321")
        );
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1764000000\nprocesses 9\n"),
            Some(1_764_000_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n\
                      Max locked memory         unlimited            unlimited            bytes     \n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1_048_576));
        assert_eq!(soft_limit(limits, "Max locked memory"), None);
    }

    #[test]
    fn this_process_reads_sensibly() {
        let p = read();
        assert!(p.cpu_seconds.is_some_and(|s| s >= 0.0), "{p:?}");
        assert!(p.resident_bytes.is_some_and(|b| b > 1 << 20), "{p:?}");
        assert!(p.virtual_bytes >= p.resident_bytes, "{p:?}");
        assert!(p.open_fds.is_some_and(|n| n >= 3), "{p:?}");
        assert!(p.max_fds >= p.open_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = p.start_time_seconds.expect("start time");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0 * 365.0,
            "{started}"
        );
    }
}
