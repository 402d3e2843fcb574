//! Logging for the client binaries: readable lines on stderr (never on the
//! progress line: see [`crate::progress`]), and optionally JSON lines appended
//! to a file (the reference clients' `logging` section).
//!
//! Bodies, keys and secrets are never logged anywhere in this crate; message ids,
//! queue names and counts are.

use std::fs::OpenOptions;
use std::io::{self, IsTerminal as _, Write};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{fmt, EnvFilter, Layer as _};

use crate::client_config::{ConfigError, LoggingConfig};
use crate::progress::LogLine;

/// The console log writer: stderr, with the progress line erased before each
/// log line and drawn again after it, so the two never share a line.
struct Console;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Console {
    type Writer = ConsoleLine;

    fn make_writer(&'a self) -> ConsoleLine {
        ConsoleLine {
            stderr: io::stderr(),
            _progress: LogLine::start(),
        }
    }
}

/// One log line on its way to stderr (the fmt layer writes each event through
/// a writer of its own).
struct ConsoleLine {
    /// Where log lines go.
    stderr: io::Stderr,
    /// The progress line, erased while this lives.
    _progress: LogLine,
}

impl Write for ConsoleLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stderr.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stderr.flush()
    }
}

/// Installs the global subscriber: `RUST_LOG` if set, else `config.level`; stderr
/// always, plus the JSON file if configured (its directory is created).
pub fn init(config: &LoggingConfig) -> Result<(), ConfigError> {
    let filter = || {
        EnvFilter::try_from_default_env()
            .or_else(|_| EnvFilter::try_new(&config.level))
            .map_err(|e| ConfigError::Invalid {
                key: "logging.level",
                reason: format!("{:?} is not a level or filter: {e}", config.level),
            })
    };
    let console = fmt::layer()
        .with_writer(Console)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(filter()?);
    let file = match &config.file {
        None => None,
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    ConfigError::Logging(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    ConfigError::Logging(format!("cannot open {}: {e}", path.display()))
                })?;
            Some(fmt::layer().json().with_writer(file).with_filter(filter()?))
        }
    };
    tracing_subscriber::registry()
        .with(console)
        .with(file)
        .try_init()
        .map_err(|e| ConfigError::Logging(e.to_string()))
}
