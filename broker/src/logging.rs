//! The broker's logs (docs/PROTOCOL.md, "Logging"): readable lines on stderr
//! (the console) and JSON files under `logging.dir`, rotated by
//! `logging.rotation`, the newest `logging.max_log_files` kept. Level:
//! `RUST_LOG`, else `logging.level`.
//!
//! Every line is stored once. Which sinks are on ([`Sinks::choose`]):
//!
//! - JSON files: when `logging.json_files = true` (default false).
//! - Console: `logging.console = true` or `false` is obeyed. `"auto"` (the
//!   default) is on, except when stderr is the systemd journal and the JSON
//!   files are on: the files are then the one copy, and a single line on
//!   stderr says where the logs went. Stderr is the journal when
//!   `JOURNAL_STREAM` names its device and inode, as systemd sets it.
//! - The console has ANSI colours only when stderr is a terminal and
//!   `NO_COLOR` is unset, and no timestamps in the journal (which stamps
//!   every line itself).
//!
//! So the default config logs to stderr only. [`init`] logs one `info` line
//! naming the active sinks, then the config's [`warnings`](Config::warnings).

use std::io::{self, IsTerminal as _};
use std::os::fd::AsFd as _;
use std::os::unix::fs::MetadataExt as _;

use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::{Config, Console, LogRotation, LoggingConfig};

/// Start of every JSON log file's name: `ciphermq.<date>.json.log`.
pub const JSON_FILE_PREFIX: &str = "ciphermq";

/// End of every JSON log file's name.
pub const JSON_FILE_SUFFIX: &str = "json.log";

/// Where stderr leads, as far as logging cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stderr {
    /// A terminal: a person reads it, colours help.
    pub terminal: bool,
    /// The systemd journal, which stores every line (and stamps its time).
    pub journal: bool,
    /// `NO_COLOR` is set to something: no colours even on a terminal.
    pub no_color: bool,
}

impl Stderr {
    /// Looks at this process's stderr and environment.
    pub fn detect() -> Stderr {
        let journal = std::env::var_os("JOURNAL_STREAM").is_some_and(|value| {
            let stderr = std::io::stderr().as_fd().try_clone_to_owned();
            let meta = stderr.and_then(|fd| std::fs::File::from(fd).metadata());
            meta.is_ok_and(|m| names_stream(&value.to_string_lossy(), m.dev(), m.ino()))
        });
        Stderr {
            terminal: std::io::stderr().is_terminal(),
            journal,
            no_color: std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
        }
    }
}

/// Whether `JOURNAL_STREAM`'s value (`<device>:<inode>`, decimal) names the
/// stream with that device and inode. systemd sets it for the stdout and
/// stderr it connects to the journal; a child whose stderr was redirected
/// inherits a value that no longer matches.
pub fn names_stream(journal_stream: &str, dev: u64, ino: u64) -> bool {
    journal_stream
        .trim()
        .split_once(':')
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        == Some((dev, ino))
}

/// The sinks a `[logging]` section turns on, given where stderr leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sinks {
    /// Readable lines on stderr.
    pub console: bool,
    /// ANSI colours on the console.
    pub ansi: bool,
    /// Timestamps on the console lines.
    pub console_time: bool,
    /// JSON files under `logging.dir`.
    pub json_files: bool,
    /// The console is off by the `"auto"` rule (journal and files): stderr
    /// then gets one line saying where the logs are.
    pub console_left_to_files: bool,
}

impl Sinks {
    /// Applies the rules of the module documentation.
    pub fn choose(logging: &LoggingConfig, stderr: Stderr) -> Sinks {
        let json_files = logging.json_files;
        let console_left_to_files =
            logging.console == Console::Auto && json_files && stderr.journal;
        let console = match logging.console {
            Console::On => true,
            Console::Off => false,
            Console::Auto => !console_left_to_files,
        };
        Sinks {
            console,
            ansi: console && stderr.terminal && !stderr.no_color,
            console_time: !stderr.journal,
            json_files,
            console_left_to_files,
        }
    }

    /// One sentence naming the active sinks, for the start-up `info` line.
    pub fn describe(&self, logging: &LoggingConfig) -> String {
        let console = format!(
            "stderr ({}{})",
            if self.ansi { "colour" } else { "plain text" },
            if self.console_time {
                ""
            } else {
                ", no timestamps: the journal adds them"
            }
        );
        let retention = match (logging.rotation, logging.max_log_files) {
            (LogRotation::Never, _) => "never rotated".to_owned(),
            (rotation, 0) => format!("{} rotation, all files kept", rotation.as_str()),
            (rotation, n) => format!("{} rotation, newest {n} files kept", rotation.as_str()),
        };
        let files = format!("JSON files in {} ({retention})", logging.dir.display());
        match (self.console, self.json_files) {
            (true, true) => format!("logging to {console} and to {files}"),
            (true, false) => format!("logging to {console} only; JSON files off"),
            (false, true) if self.console_left_to_files => format!(
                "logging to {files} only: stderr is the systemd journal \
                 (set logging.console = true to log to both)"
            ),
            (false, true) => format!("logging to {files} only; console off"),
            (false, false) => "logging nowhere: console and JSON files are off".to_owned(),
        }
    }
}

/// The JSON files' appender: `ciphermq.<date>.json.log` under `logging.dir`
/// (created if missing), rotated by `logging.rotation`. Building it, and
/// every rotation after, deletes the oldest files beyond
/// `logging.max_log_files` (the new file included; 0 keeps all).
pub fn json_appender(logging: &LoggingConfig) -> io::Result<RollingFileAppender> {
    let rotation = match logging.rotation {
        LogRotation::Hourly => Rotation::HOURLY,
        LogRotation::Daily => Rotation::DAILY,
        LogRotation::Never => Rotation::NEVER,
    };
    // The appender looks for old files before it creates the directory.
    std::fs::create_dir_all(&logging.dir)?;
    RollingFileAppender::builder()
        .rotation(rotation)
        .filename_prefix(JSON_FILE_PREFIX)
        .filename_suffix(JSON_FILE_SUFFIX)
        .max_log_files(logging.max_log_files)
        .build(&logging.dir)
        .map_err(io::Error::other)
}

/// Installs the global subscriber for `config.logging`, logs the sinks chosen
/// and then the config's warnings. Keep the guard until exit: dropping it
/// flushes the JSON files. A JSON directory that cannot be written is said on
/// stderr, and the broker logs as if `json_files` were off.
pub fn init(config: &Config) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    let logging = &config.logging;
    let stderr = Stderr::detect();
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&logging.level));
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();
    let mut guard = None;
    let mut sinks = Sinks::choose(logging, stderr);
    if sinks.json_files {
        match json_appender(logging) {
            Ok(appender) => {
                let (writer, g) = tracing_appender::non_blocking(appender);
                guard = Some(g);
                layers.push(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .with_ansi(false)
                        .with_writer(writer)
                        .with_filter(filter())
                        .boxed(),
                );
            }
            Err(e) => {
                eprintln!(
                    "ciphermq-broker: logging.dir: cannot write logs to {}: {e}",
                    logging.dir.display()
                );
                let without_files = LoggingConfig {
                    json_files: false,
                    ..logging.clone()
                };
                sinks = Sinks::choose(&without_files, stderr);
            }
        }
    }
    if sinks.console {
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(sinks.ansi);
        layers.push(if sinks.console_time {
            layer.with_filter(filter()).boxed()
        } else {
            layer.without_time().with_filter(filter()).boxed()
        });
    }
    if let Err(e) = tracing_subscriber::registry().with(layers).try_init() {
        eprintln!("ciphermq-broker: logging not set up: {e}");
    }
    let active = sinks.describe(logging);
    if sinks.console_left_to_files {
        eprintln!(
            "ciphermq-broker: logs go to JSON files in {} (console off while stderr is the \
             systemd journal and logging.json_files is on)",
            logging.dir.display()
        );
    }
    tracing::info!(
        console = sinks.console,
        json_files = sinks.json_files,
        "{active}"
    );
    config.log_warnings();
    guard
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logging(console: Console, json_files: bool) -> LoggingConfig {
        LoggingConfig {
            console,
            json_files,
            ..LoggingConfig::default()
        }
    }

    const PIPE: Stderr = Stderr {
        terminal: false,
        journal: false,
        no_color: false,
    };
    const TERMINAL: Stderr = Stderr {
        terminal: true,
        ..PIPE
    };
    const JOURNAL: Stderr = Stderr {
        journal: true,
        ..PIPE
    };

    #[test]
    fn default_config_logs_once_to_stderr() {
        for stderr in [PIPE, TERMINAL, JOURNAL] {
            let s = Sinks::choose(&LoggingConfig::default(), stderr);
            assert!(s.console && !s.json_files, "{stderr:?}: {s:?}");
        }
    }

    #[test]
    fn journal_with_files_leaves_the_console_off_unless_asked() {
        let s = Sinks::choose(&logging(Console::Auto, true), JOURNAL);
        assert!(!s.console && s.json_files && s.console_left_to_files);
        assert!(s
            .describe(&LoggingConfig::default())
            .contains("systemd journal"));
        // Elsewhere both are on: a terminal or a pipe is not a second store.
        for stderr in [PIPE, TERMINAL] {
            let s = Sinks::choose(&logging(Console::Auto, true), stderr);
            assert!(s.console && s.json_files, "{stderr:?}");
        }
        // An explicit choice wins.
        let s = Sinks::choose(&logging(Console::On, true), JOURNAL);
        assert!(s.console && s.json_files && !s.console_left_to_files);
        let s = Sinks::choose(&logging(Console::Off, false), TERMINAL);
        assert!(!s.console && !s.json_files);
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let auto = LoggingConfig::default();
        assert!(Sinks::choose(&auto, TERMINAL).ansi);
        assert!(!Sinks::choose(&auto, PIPE).ansi);
        assert!(!Sinks::choose(&auto, JOURNAL).ansi);
        let no_color = Stderr {
            no_color: true,
            ..TERMINAL
        };
        assert!(!Sinks::choose(&auto, no_color).ansi);
        // The journal stamps lines itself.
        assert!(!Sinks::choose(&auto, JOURNAL).console_time);
        assert!(Sinks::choose(&auto, PIPE).console_time);
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(names_stream("64769:123456", 64769, 123_456));
        assert!(names_stream("64769:123456\n", 64769, 123_456));
        assert!(!names_stream("64769:123457", 64769, 123_456));
        assert!(!names_stream("1", 1, 1));
        assert!(!names_stream("", 0, 0));
        assert!(!names_stream("a:b", 0, 0));
    }

    #[test]
    fn old_files_beyond_max_log_files_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "ciphermq.2020-01-01.json.log",
            "ciphermq.2020-01-02.json.log",
            "ciphermq.2020-01-03.json.log",
            "ciphermq.2020-01-04.json.log",
        ];
        for name in names {
            std::fs::write(dir.path().join(name), "{}\n").unwrap();
            // Files are ordered by creation time: keep them apart.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::write(dir.path().join("other.log"), "not ours").unwrap();
        let config = LoggingConfig {
            dir: dir.path().to_path_buf(),
            json_files: true,
            max_log_files: 2,
            ..LoggingConfig::default()
        };
        drop(json_appender(&config).unwrap());
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // The newest old file and the one just started; others' files stay.
        assert_eq!(left.len(), 3, "{left:?}");
        assert_eq!(left[0], names[3]);
        assert!(
            left[1].starts_with("ciphermq.") && left[1].ends_with(".json.log"),
            "{left:?}"
        );
        assert_eq!(left[2], "other.log");

        // 0 keeps every file.
        let config = LoggingConfig {
            max_log_files: 0,
            ..config
        };
        for name in names {
            std::fs::write(dir.path().join(name), "{}\n").unwrap();
        }
        drop(json_appender(&config).unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 6);
    }
}
