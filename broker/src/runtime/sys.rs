//! The crate's only `unsafe` code: moving a socket between executors, a
//! read that does not wait for glommio's reactor, a write straight from
//! rustls' buffers, two start-up probes of
//! the kernel, the process's CPU affinity mask (where shards are pinned), the free-space query of the disk watcher, the
//! write-permission query of `--check-config`, two `sysconf` values the
//! process metrics need, handing freed heap memory back to the kernel, and
//! interrupting a shard's thread asleep before its executor's first poll.
//!
//! glommio 0.9 streams cannot be sent between executors, so the accepting
//! shard duplicates the socket's file descriptor into an [`OwnedFd`] (which is
//! `Send` and closes itself if dropped on the way), drops its own stream (which
//! closes only the old number and its reactor registrations), and the owner
//! rebuilds a stream from the duplicate.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};

use glommio::net::TcpStream;

/// Duplicates the stream's socket; the stream can then be dropped.
pub(crate) fn duplicate(stream: &TcpStream) -> io::Result<OwnedFd> {
    // SAFETY: the descriptor belongs to `stream`, which is alive for the whole
    // borrow; `try_clone_to_owned` makes a new descriptor (F_DUPFD_CLOEXEC) that
    // we own.
    let borrowed = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    borrowed.try_clone_to_owned()
}

/// Rebuilds a stream on the current executor from a duplicated socket.
pub(crate) fn adopt(fd: OwnedFd) -> TcpStream {
    // SAFETY: `fd` is an open TCP socket we own exclusively (from `duplicate`);
    // ownership passes to the stream, which closes it on drop.
    unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) }
}

/// Reads what the socket holds now, without waiting; `None` when it holds
/// nothing (or the call was interrupted).
///
/// glommio 0.9 reads a socket itself only when no readiness poll of it is
/// outstanding, and learns that one completed only when its reactor runs:
/// once a preempt period while a shard is busy. A connection woken for
/// another reason (a full consumer, by the publishes waiting for it) reads
/// its peer's acks here instead of waiting for that. The outstanding poll
/// consumes nothing, so reading around it loses no bytes; it completes
/// later as a spurious wake-up.
pub(crate) fn try_recv(stream: &TcpStream, buf: &mut [u8]) -> Option<io::Result<usize>> {
    // SAFETY: the descriptor belongs to `stream`, alive for the call; `buf`
    // is valid for writes of `buf.len()` bytes; MSG_DONTWAIT never blocks.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    without_waiting(n)
}

/// Sends what the socket takes now of `bufs`, in order, without waiting;
/// `None` when it takes nothing (full, or the call was interrupted).
///
/// The session hands rustls' encrypted records to the kernel from rustls'
/// own buffers with it, instead of copying them into a buffer of its own
/// for glommio's `poll_write` first (which makes the same non-blocking
/// call). Only what the socket cannot take now is copied, to wait for
/// glommio's readiness poll.
pub(crate) fn try_send_vectored(
    stream: &TcpStream,
    bufs: &[io::IoSlice<'_>],
) -> Option<io::Result<usize>> {
    // SAFETY: an all-zero msghdr is valid (no address, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `iovec` on Unix (documented by std);
    // sendmsg only reads the slices.
    msg.msg_iov = bufs.as_ptr().cast_mut().cast();
    msg.msg_iovlen = bufs.len().min(MAX_IOV);
    // SAFETY: the descriptor belongs to `stream`, alive for the call; every
    // slice is valid for reads of its length for the call; MSG_DONTWAIT never
    // blocks and MSG_NOSIGNAL turns a closed peer into EPIPE, not a signal.
    let n = unsafe {
        libc::sendmsg(
            stream.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    without_waiting(n)
}

/// A non-blocking socket call's return value: `None` when it would have
/// had to wait (or was interrupted), else its count or its error.
fn without_waiting(n: isize) -> Option<io::Result<usize>> {
    if let Ok(n) = usize::try_from(n) {
        return Some(Ok(n));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => None,
        _ => Some(Err(e)),
    }
}

/// Slices one `sendmsg` takes at most (Linux's UIO_MAXIOV); rustls offers
/// fewer.
const MAX_IOV: usize = 1024;

/// Checks that this process may create an io_uring; the error says what to change.
pub(crate) fn probe_io_uring() -> Result<(), String> {
    // struct io_uring_params is 120 bytes; zeroed means "defaults".
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and writes `params`, which is large enough
    // and lives across the call; the returned descriptor is closed right away.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOSYS) => format!(
                "io_uring is not available ({err}): CipherMQ needs Linux 5.8 or newer with io_uring enabled"
            ),
            Some(libc::EPERM) | Some(libc::EACCES) => format!(
                "io_uring is blocked ({err}): allow the io_uring_setup/io_uring_enter/io_uring_register syscalls \
                 (for containers: a seccomp profile that permits io_uring, e.g. docker --security-opt seccomp=unconfined) \
                 and check /proc/sys/kernel/io_uring_disabled is 0"
            ),
            Some(libc::ENOMEM) => format!(
                "io_uring cannot lock memory ({err}): raise the locked-memory limit (ulimit -l, LimitMEMLOCK= in systemd, --ulimit memlock=-1 for docker)"
            ),
            _ => format!("io_uring_setup failed: {err}"),
        });
    }
    // SAFETY: `fd` was just returned to us by the kernel and is not used elsewhere.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    Ok(())
}

/// The CPUs this process may run on (its affinity mask: `taskset`, a
/// container's cpuset), lowest first; every CPU the machine has when the
/// mask cannot be read. Shards are pinned to these, so a broker confined
/// to some CPUs stays on them, and two brokers on one host confined to
/// different CPUs do not share one.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bitmask owned here; sched_getaffinity
    // writes at most `size_of::<cpu_set_t>()` bytes into it, and CPU_ISSET
    // only reads it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let read =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    let cpus: Vec<usize> = if read == 0 {
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    } else {
        Vec::new()
    };
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    } else {
        cpus
    }
}

/// Raises the soft locked-memory limit to the hard one; returns the soft limit
/// now in force, in bytes (`u64::MAX` for unlimited).
pub(crate) fn raise_memlock_limit() -> u64 {
    raise_limit(libc::RLIMIT_MEMLOCK)
}

/// Raises the soft open-file limit to the hard one (connections and open
/// segments each hold a descriptor); returns the soft limit now in force.
pub(crate) fn raise_nofile_limit() -> u64 {
    raise_limit(libc::RLIMIT_NOFILE)
}

/// Raises the soft limit of `resource` to its hard limit; returns the soft
/// limit now in force (0 when it cannot be read).
fn raise_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct we pass.
    unsafe {
        if libc::getrlimit(resource, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(resource, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// Bytes an unprivileged writer may still use on the filesystem holding
/// `path` (`statvfs`: available blocks times the fragment size).
pub(crate) fn available_bytes(path: &std::path::Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is a NUL-terminated string alive across the call, and
    // `stat` is a properly sized buffer the kernel fills; it is read only
    // when the call succeeded.
    let stat = unsafe {
        if libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        stat.assume_init()
    };
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Whether this process may create and remove entries in the directory
/// `path`: write and search permission for its effective user and groups,
/// on a filesystem mounted read-write (`faccessat` with `AT_EACCESS`).
/// Nothing is created.
pub(crate) fn check_dir_writable(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: `c_path` is a NUL-terminated string alive across the call;
    // faccessat only reads it.
    let rc = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Hands the heap's free pages back to the kernel (glibc's `malloc_trim`).
///
/// Bodies moved out of memory past the budget are freed in the middle of
/// the heap, where glibc keeps them: without this, a backlog's memory would
/// be the bodies' peak plus its ids, not the budget.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The calling thread's id as the kernel numbers it (`/proc/self/task/<tid>`).
pub(crate) fn thread_id() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Interrupts the system call thread `tid` of this process waits in, if
/// any: it returns `EINTR`, through a signal (`SIGURG`) handled by doing
/// nothing. glommio takes an interrupted wait for I/O as a wake-up; this is
/// how a shard asleep before its executor's first poll, when no waker
/// exists yet, is woken (`nudge::await_first_word`).
pub(crate) fn interrupt_thread(tid: libc::pid_t) {
    extern "C" fn ignore(_: libc::c_int) {}
    static HANDLER: std::sync::Once = std::sync::Once::new();
    // SAFETY: installs a handler that does nothing, for a signal nothing
    // else in the process uses (its default is to be ignored, which would
    // interrupt nothing); without SA_RESTART, so a waiting call returns.
    HANDLER.call_once(|| unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGURG, &action, std::ptr::null_mut());
    });
    // SAFETY: a signal whose handler does nothing, to a thread of this very
    // process (a thread that has ended makes this fail with ESRCH, harmlessly).
    unsafe {
        libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGURG);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::pin::Pin;
    use std::sync::mpsc;
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use futures_lite::{AsyncRead, AsyncReadExt};

    use super::*;

    /// Listens on a free loopback port, tells the test's peer thread the
    /// address, and returns the one connection it makes.
    pub(crate) async fn accept_one(addr_tx: &mpsc::Sender<std::net::SocketAddr>) -> TcpStream {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        addr_tx
            .send(listener.local_addr().expect("address"))
            .expect("send");
        listener.accept().await.expect("accept")
    }

    /// Polls `try_recv` until it returns something (the peer's bytes travel
    /// through loopback on their own time).
    fn recv_soon(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(read) = try_recv(stream, buf) {
                return read;
            }
            assert!(Instant::now() < deadline, "the peer's bytes never came");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Bytes read around glommio's outstanding readiness poll arrive once
    /// and in order: what `try_recv` takes, glommio's next read does not see
    /// again, and what comes after reaches glommio's read as usual.
    #[test]
    fn reads_around_a_pending_poll_lose_and_repeat_nothing() {
        let (addr_tx, addr_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<&'static [u8]>();
        let peer = std::thread::spawn(move || {
            let addr: std::net::SocketAddr = addr_rx.recv().expect("the address");
            let mut socket = std::net::TcpStream::connect(addr).expect("connect");
            while let Ok(bytes) = go_rx.recv() {
                if bytes.is_empty() {
                    break;
                }
                socket.write_all(bytes).expect("write");
            }
            // Dropping the socket closes it.
        });
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let mut stream = accept_one(&addr_tx).await;
                let mut buf = [0u8; 64];
                assert!(try_recv(&stream, &mut buf).is_none(), "nothing sent yet");

                // glommio finds nothing and leaves a readiness poll outstanding.
                let mut cx = Context::from_waker(Waker::noop());
                assert!(matches!(
                    Pin::new(&mut stream).poll_read(&mut cx, &mut buf),
                    Poll::Pending
                ));
                go_tx.send(b"first").expect("go");
                let n = recv_soon(&stream, &mut buf).expect("recv");
                assert_eq!(&buf[..n], b"first");

                go_tx.send(b"second").expect("go");
                let mut got = Vec::new();
                while got.len() < b"second".len() {
                    let n = stream.read(&mut buf).await.expect("glommio's read");
                    assert!(n > 0, "closed early");
                    got.extend_from_slice(&buf[..n]);
                }
                assert_eq!(got, b"second");

                go_tx.send(b"").expect("close");
                assert_eq!(
                    recv_soon(&stream, &mut buf).expect("recv"),
                    0,
                    "end of stream"
                );
            })
            .expect("executor")
            .join()
            .expect("the test's executor");
        peer.join().expect("the peer");
    }

    /// `try_send_vectored` sends its slices in order, says `None` (does not
    /// block, takes nothing) once the socket is full, and reports a closed
    /// peer as an error rather than a signal; the peer reads exactly the
    /// bytes it reported sent.
    #[test]
    fn sends_slices_in_order_until_the_socket_is_full() {
        use std::io::Read;
        let (addr_tx, addr_rx) = mpsc::channel();
        let (full_tx, full_rx) = mpsc::channel::<usize>();
        let (closed_tx, closed_rx) = mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let addr: std::net::SocketAddr = addr_rx.recv().expect("the address");
            let mut socket = std::net::TcpStream::connect(addr).expect("connect");
            let len = full_rx.recv().expect("full");
            let mut got = vec![0u8; len];
            socket.read_exact(&mut got).expect("read");
            // Nothing past what was reported sent.
            socket
                .set_read_timeout(Some(Duration::from_millis(200)))
                .expect("timeout");
            let extra = socket.read(&mut [0u8; 1]);
            assert!(
                matches!(&extra, Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut),
                "more bytes than reported sent: {extra:?}"
            );
            drop(socket);
            closed_tx.send(()).expect("closed");
            got
        });
        let sent = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let stream = accept_one(&addr_tx).await;
                let mut sent = Vec::new();
                let first = [io::IoSlice::new(b"ab"), io::IoSlice::new(b"cd")];
                let n = try_send_vectored(&stream, &first)
                    .expect("room")
                    .expect("send");
                assert_eq!(n, 4);
                sent.extend_from_slice(b"abcd");
                // Distinct bytes per chunk, so a lost or repeated one shows.
                let mut full = false;
                for i in 0..100_000u32 {
                    let chunk = vec![(i % 251) as u8; 64 * 1024];
                    match try_send_vectored(&stream, &[io::IoSlice::new(&chunk)]) {
                        Some(sent_now) => {
                            let n = sent_now.expect("send");
                            sent.extend_from_slice(&chunk[..n]);
                        }
                        None => {
                            full = true;
                            break;
                        }
                    }
                }
                assert!(full, "the socket never filled");
                // The peer reads what was reported sent, then closes.
                full_tx.send(sent.len()).expect("go");
                closed_rx.recv().expect("the peer closed");
                // Sending to a closed peer: an error, eventually (the first
                // send after a close may still be taken).
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match try_send_vectored(&stream, &[io::IoSlice::new(b"x")]) {
                        Some(Err(_)) => break,
                        _ => {
                            assert!(Instant::now() < deadline, "no error after the peer closed");
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
                sent
            })
            .expect("executor")
            .join()
            .expect("the test's executor");
        let got = peer.join().expect("the peer");
        assert!(
            got == sent,
            "the peer read other bytes than were reported sent"
        );
    }
}
