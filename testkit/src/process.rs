//! The broker as its own process: the real binary, started on a config file,
//! ready once it prints the address it listens on (a fact, never a guessed
//! delay), stopped with a signal or killed. For tests whose promise spans
//! processes (crashes, locks, files, signals).
//!
//! The binary's path is the caller's: `env!("CARGO_BIN_EXE_ciphermq-broker")`
//! exists only in the broker package's own tests.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a broker may take to start (recovery of a large log included).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running broker process, killed when dropped.
pub struct BrokerProcess {
    child: Child,
    /// Its client address.
    pub addr: String,
    /// Its admin endpoint, when enabled.
    pub admin: Option<String>,
    /// Its stdout lines (console logs when enabled), read on.
    pub log: Arc<Mutex<Vec<String>>>,
}

/// A broker that exited before listening: what a test of a refused start
/// looks at.
#[derive(Debug)]
pub struct Refused {
    /// How it ended.
    pub status: ExitStatus,
    /// What it printed.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

impl BrokerProcess {
    /// Starts the broker binary `binary` on `config`: the running broker
    /// once it prints its address, or how it ended when it exits first.
    pub fn spawn(binary: &Path, config: &Path) -> Result<BrokerProcess, Refused> {
        BrokerProcess::spawn_with(binary, config, |_| {})
    }

    /// [`BrokerProcess::spawn`], the command passed through `configure`
    /// first (environment variables, more arguments).
    pub fn spawn_with(
        binary: &Path,
        config: &Path,
        configure: impl FnOnce(&mut Command),
    ) -> Result<BrokerProcess, Refused> {
        let mut command = Command::new(binary);
        command
            .arg("--config")
            .arg(config)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        configure(&mut command);
        let mut child = command.spawn().expect("start the broker binary");
        let (tx, rx) = mpsc::channel::<String>();
        let stdout = child.stdout.take().expect("stdout");
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            let mut listening = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines(&kept).push(line.clone());
                if !listening {
                    listening = line.starts_with("ciphermq-broker listening on ");
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        });
        // Console logs are on stderr: kept with stdout's lines.
        let stderr = child.stderr.take().expect("stderr");
        let kept = log.clone();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                text.push_str(&line);
                text.push('\n');
                lines(&kept).push(line);
            }
            text
        });
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let Some(rest) = line.strip_prefix("ciphermq-broker listening on ") else {
                        continue;
                    };
                    let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                    let admin = rest
                        .split_once("admin endpoint on ")
                        .map(|(_, a)| a.trim().to_owned());
                    return Ok(BrokerProcess {
                        child,
                        addr,
                        admin,
                        log,
                    });
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().expect("reap the broker");
                    let stdout = lines(&log).join("\n");
                    return Err(Refused {
                        status,
                        stdout,
                        stderr: stderr.join().unwrap_or_default(),
                    });
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the broker neither listened nor exited within {START_TIMEOUT:?}");
                }
            }
        }
    }

    /// Starts the broker binary `binary` on `config`, which must work.
    pub fn start(binary: &Path, config: &Path) -> BrokerProcess {
        BrokerProcess::spawn(binary, config)
            .unwrap_or_else(|r| panic!("broker refused to start: {r:?}"))
    }

    /// Stops it with SIGTERM (a graceful shutdown) and waits.
    pub fn stop(mut self) -> ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the broker") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the broker did not stop within {START_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends it `signal` (a name `kill` knows: `TERM`, `INT`, `HUP`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// How it ended, if it ends within `limit`.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the broker") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills it with SIGKILL: no shutdown at all.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it printed so far, one line each.
    pub fn log_text(&self) -> String {
        lines(&self.log).join("\n")
    }

    /// Whether its log has a line containing every one of `words`.
    pub fn logged(&self, words: &[&str]) -> bool {
        lines(&self.log)
            .iter()
            .any(|l| words.iter().all(|w| l.contains(w)))
    }
}

/// The lines kept so far. A reader thread that panicked holding the lock
/// left whole lines behind, so they are read all the same.
fn lines(log: &Mutex<Vec<String>>) -> MutexGuard<'_, Vec<String>> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
