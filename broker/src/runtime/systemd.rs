//! systemd's notification protocol (`sd_notify(3)`), by hand.
//!
//! Why: the shipped unit (`packaging/systemd/ciphermq.service`) is
//! `Type=notify`. systemd then counts the broker as started only once it
//! listens (`READY=1`), so units ordered after it find the port open and a
//! broker that fails during recovery fails its `systemctl start`; it shows
//! a drain as "deactivating" (`STOPPING=1`); and with `WatchdogSec=` it
//! restarts a broker that stopped running (`WATCHDOG=1`). The watchdog ping
//! is sent from a thread of its own only while every shard's heartbeat is
//! fresh ([`crate::liveness::pulse`], renewed by each shard's stall watch), so a
//! wedged shard (a loop that never yields, a blocking call that never
//! returns) stops the pings and gets the broker restarted, while a live
//! broker that merely idles keeps them going.
//!
//! Why no crate: the protocol is one datagram per message, `KEY=value`
//! lines, sent to the `AF_UNIX` socket named by `$NOTIFY_SOCKET` (a path, or
//! `@name` for the abstract namespace); a few lines of std cover it, with
//! no `unsafe` and no C library. Outside systemd `$NOTIFY_SOCKET` is unset
//! and [`Notifier::from_env`] gives `None`: nothing is sent.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::liveness::pulse::Pulses;

/// The environment variable naming the notification socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The environment variable holding the watchdog timeout, in microseconds.
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";

/// The environment variable naming the process the watchdog is meant for
/// (when set and not ours, a parent's watchdog leaked into our environment).
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Sends notifications to the service manager.
#[derive(Debug)]
pub struct Notifier {
    /// An unbound datagram socket of our own.
    socket: UnixDatagram,
    /// `$NOTIFY_SOCKET`, as an address.
    target: SocketAddr,
}

impl Notifier {
    /// A notifier for `$NOTIFY_SOCKET`, or `None` when it is unset (not run
    /// by systemd, or `Type=` is not `notify`). A value that cannot be used
    /// is logged and treated as unset: notifications are a courtesy, never a
    /// reason not to serve.
    pub fn from_env() -> Option<Notifier> {
        let value = std::env::var_os(NOTIFY_SOCKET)?;
        match Notifier::new(&value) {
            Ok(notifier) => Some(notifier),
            Err(e) => {
                tracing::warn!(socket = ?value, error = %e, "NOTIFY_SOCKET is unusable: no systemd notifications");
                None
            }
        }
    }

    /// A notifier for the socket `name`: a filesystem path, or `@name` for
    /// the abstract namespace (as systemd writes it).
    pub fn new(name: &OsStr) -> io::Result<Notifier> {
        Ok(Notifier {
            socket: UnixDatagram::unbound()?,
            target: socket_addr(name)?,
        })
    }

    /// Sends `state`: newline-separated `KEY=value` assignments.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let sent = self.socket.send_to_addr(state.as_bytes(), &self.target)?;
        if sent != state.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the notification was cut short",
            ));
        }
        Ok(())
    }

    /// [`Notifier::notify`], a failure logged rather than returned.
    pub fn send(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            tracing::warn!(error = %e, state, "systemd notification not sent");
        }
    }

    /// `READY=1`: the broker listens; `status` is shown by `systemctl status`.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// `STOPPING=1`: the drain began.
    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    /// `STATUS=`: a line for `systemctl status`.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// `WATCHDOG=1`: the broker is alive.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }
}

/// A status line cannot hold a newline (it would start a new assignment).
fn one_line(status: &str) -> String {
    status.replace('\n', " ")
}

/// The address of `$NOTIFY_SOCKET`'s value: `@name` is `name` in the
/// abstract namespace, anything else a filesystem path.
pub fn socket_addr(name: &OsStr) -> io::Result<SocketAddr> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty name"));
    }
    if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt as _;
        return SocketAddr::from_abstract_name(abstract_name);
    }
    SocketAddr::from_pathname(Path::new(name))
}

/// How often to ping the watchdog, from `$WATCHDOG_USEC` and
/// `$WATCHDOG_PID` (see [`watchdog_interval`]).
pub fn watchdog_interval_from_env() -> Option<Duration> {
    let usec = std::env::var(WATCHDOG_USEC).ok();
    let pid = std::env::var(WATCHDOG_PID).ok();
    watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// Half the watchdog timeout `usec` (microseconds), as `sd_watchdog_enabled`
/// advises; `None` when there is no watchdog: `usec` unset, not a positive
/// number, or `pid` set and not `me` (the watchdog of another process).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(me) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Starts the thread that sends `WATCHDOG=1` every `interval` while every
/// running shard has beaten within the last `interval`. When one has not,
/// it logs the shard (once per stall) and withholds the ping: if the shard
/// stays silent, systemd's `WatchdogSec=` runs out and it restarts the
/// broker (`Restart=on-failure` in the shipped unit).
pub fn spawn_watchdog(
    notifier: Arc<Notifier>,
    interval: Duration,
    pulses: Arc<Pulses>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("systemd-watchdog".into())
        .spawn(move || {
            let mut withheld = false;
            loop {
                match pulses.stalled(interval) {
                    None => {
                        if withheld {
                            tracing::info!("every shard runs again: systemd watchdog pings resume");
                            withheld = false;
                        }
                        notifier.watchdog();
                    }
                    Some((shard, silent)) => {
                        if !withheld {
                            tracing::error!(
                                shard,
                                silent_ms = silent.as_millis() as u64,
                                "shard has not run for longer than half the systemd watchdog timeout: \
                                 withholding WATCHDOG=1, so systemd restarts the broker if it stays stuck"
                            );
                            withheld = true;
                        }
                    }
                }
                std::thread::sleep(interval);
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::linux::net::SocketAddrExt as _;

    fn receive(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn notifies_a_socket_named_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::new(path.as_os_str()).unwrap();
        notifier.ready("listening on 127.0.0.1:5700\n(2 shards)");
        assert_eq!(
            receive(&socket),
            "READY=1\nSTATUS=listening on 127.0.0.1:5700 (2 shards)"
        );
        notifier.watchdog();
        assert_eq!(receive(&socket), "WATCHDOG=1");
        notifier.stopping("draining");
        assert_eq!(receive(&socket), "STOPPING=1\nSTATUS=draining");
    }

    #[test]
    fn notifies_an_abstract_socket_named_with_an_at_sign() {
        let name = format!(
            "ciphermq-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier::new(OsStr::new(&format!("@{name}"))).unwrap();
        notifier.status("hello");
        assert_eq!(receive(&socket), "STATUS=hello");
    }

    #[test]
    fn an_unusable_socket_name_is_an_error_and_sending_to_nobody_fails_quietly() {
        assert!(Notifier::new(OsStr::new("")).is_err());
        let dir = tempfile::tempdir().unwrap();
        let notifier = Notifier::new(dir.path().join("nobody").as_os_str()).unwrap();
        assert!(notifier.notify("READY=1").is_err());
        notifier.ready("logged, not returned");
    }

    #[test]
    fn the_watchdog_interval_is_half_the_timeout_and_only_for_this_process() {
        let half = Some(Duration::from_secs(15));
        assert_eq!(watchdog_interval(Some("30000000"), None, 7), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
    }

    #[test]
    fn the_watchdog_pings_while_every_shard_beats_and_withholds_when_one_stops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        let notifier = Arc::new(Notifier::new(path.as_os_str()).unwrap());
        let pulses = Arc::new(Pulses::new(2));
        let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (p, b) = (pulses.clone(), beating.clone());
        std::thread::spawn(move || loop {
            p.beat(0);
            if b.load(std::sync::atomic::Ordering::Relaxed) {
                p.beat(1);
            }
            std::thread::sleep(Duration::from_millis(2));
        });
        spawn_watchdog(notifier, Duration::from_millis(40), pulses).unwrap();
        assert_eq!(receive(&socket), "WATCHDOG=1");
        assert_eq!(receive(&socket), "WATCHDOG=1");
        beating.store(false, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(150));
        // Drop what was sent before the shard fell silent.
        socket.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        while socket.recv(&mut buf).is_ok() {}
        socket.set_nonblocking(false).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(
            socket.recv(&mut buf).is_err(),
            "no ping while shard 1 is silent"
        );
    }
}
