//! A broker on its own threads in the test's process (`ciphermq_broker::start`),
//! shut down gracefully when dropped. `start` returns once the broker
//! listens, so a test connects at once: no wait at all.

use std::net::SocketAddr;
use std::path::Path;

use ciphermq_broker::{BrokerHandle, Config};

/// Routes the broker's logs to the test's output, once per test binary:
/// `RUST_LOG=ciphermq_broker=debug` shows them for a failing test.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A running in-process broker, stopped on drop (before the directory it
/// was given with [`RunningBroker::keeping`] is removed).
pub struct RunningBroker {
    handle: Option<BrokerHandle>,
    /// Its client address (the port it was given when configured with 0).
    pub addr: String,
    kept: Option<tempfile::TempDir>,
}

impl RunningBroker {
    /// Starts a broker on `config`, which must work.
    pub fn start(config: &Config) -> RunningBroker {
        let handle = ciphermq_broker::start(config).expect("broker starts");
        RunningBroker {
            addr: handle.local_addr().to_string(),
            handle: Some(handle),
            kept: None,
        }
    }

    /// Starts a broker on the config `text`, relative paths taken from
    /// `base`.
    pub fn start_text(text: &str, base: &Path) -> RunningBroker {
        let config = Config::from_toml_str(text, base).expect("test config");
        RunningBroker::start(&config)
    }

    /// Starts a broker on the config file `path`, named as the file its
    /// reloads read again.
    pub fn start_file(path: &Path) -> RunningBroker {
        let config = Config::load(path).expect("test config");
        let broker = RunningBroker::start(&config);
        broker.handle().reload_from(path.to_path_buf());
        broker
    }

    /// Owns `dir` (its data, say) from now on: removed once the broker
    /// stopped.
    pub fn keeping(mut self, dir: tempfile::TempDir) -> RunningBroker {
        self.kept = Some(dir);
        self
    }

    /// The running broker.
    pub fn handle(&self) -> &BrokerHandle {
        self.handle.as_ref().expect("running")
    }

    /// The admin endpoint's address, when the config enables it and the
    /// broker still runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.handle.as_ref()?.admin_addr()
    }

    /// Takes the broker's handle, for a test that stops the broker itself
    /// (through its stopper, to watch it drain): dropping this no longer
    /// stops it.
    pub fn take_handle(&mut self) -> BrokerHandle {
        self.handle.take().expect("running")
    }

    /// Stops the broker gracefully (blocks until its shards ended); nothing
    /// when it was stopped already.
    pub fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown();
        }
    }
}

impl Drop for RunningBroker {
    fn drop(&mut self) {
        self.stop();
        drop(self.kept.take());
    }
}
