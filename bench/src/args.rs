//! Command-line options. Every option has a default that reproduces the figures
//! of `docs/BENCHMARKS.md`'s main table, so a bare `ciphermq-bench` is a
//! meaningful run against a local broker.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Load generator for CipherMQ, RabbitMQ and NATS JetStream: one scenario,
/// measured side by side.
#[derive(Parser, Debug, Clone)]
#[command(version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do instead of a load run.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The load run (the default command).
    #[command(flatten)]
    pub load: LoadArgs,
    /// Worker threads of the load generator's runtime. The default leaves the
    /// other core of a 2-core machine to the broker; the pacer of `--rate` runs
    /// on a thread of its own.
    #[arg(long, global = true, default_value_t = 1)]
    pub threads: usize,
}

/// Commands other than the load run.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Open many idle mTLS connections to a CipherMQ broker and hold them, to
    /// measure the broker's memory per connection.
    Idle(IdleArgs),
    /// Consume a queue filled earlier, ack everything, check every id came
    /// once, and report the drain rate.
    Drain(DrainArgs),
    /// Draw a run of a `--json` result as an SVG image: latency per second
    /// (p50, p99, the worst per 100 ms) above the broker's RSS and CPU.
    Plot(PlotArgs),
    /// Measure the floor under the durable publish→ACK latency on this disk:
    /// appends paced at a fixed rate, group-committed by one thread (a write
    /// and an `fdatasync` per round) with no broker in the way.
    DiskFloor(DiskFloorArgs),
}

/// Which broker a run drives.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetArg {
    /// CipherMQ over mutual TLS (`--addr`, `--certs`), one broker or a
    /// cluster.
    Ciphermq,
    /// RabbitMQ over AMQP 0-9-1 (`--amqp-url`): durable queues, persistent
    /// messages, publisher confirms, manual acks.
    Rabbitmq,
    /// NATS JetStream (`--nats-url`): file storage, acked publishes, explicit acks.
    Nats,
    /// All three, one after the other, `--runs` times each, with ratios.
    Compare,
}

/// Exchange type of the scenario (for NATS: the subject layout that matches it).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeArg {
    /// Exact routing key: each message goes to one queue.
    Direct,
    /// Every message goes to every queue.
    Fanout,
    /// Wildcard bindings (`receiver.*.qN.#`): each message goes to one queue.
    Topic,
}

impl ExchangeArg {
    /// The word used in protocol commands and names.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeArg::Direct => "direct",
            ExchangeArg::Fanout => "fanout",
            ExchangeArg::Topic => "topic",
        }
    }
}

/// How message bodies are made.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PayloadArg {
    /// One envelope (`EncryptedInputData` with random base64 fields) made
    /// before the run; only the id and the timestamp change per message.
    /// Measures the broker, not the client's crypto.
    PreEncrypted,
    /// Every message encrypted for the receiver (`ciphermq_clients::crypto`:
    /// sealed box + ChaCha20-Poly1305) and decrypted by the consumer before it
    /// counts. Measures the whole path. Keys from `--keys`.
    Live,
}

/// Options of a load run.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Broker(s) to drive.
    #[arg(long, value_enum, default_value = "ciphermq")]
    pub target: TargetArg,
    /// CipherMQ broker address, or the seed addresses of a cluster,
    /// comma-separated (`127.0.0.1:5700,127.0.0.1:5701`): the first seed
    /// that answers `locate <receiver>` names the node the receiver's
    /// publishers and consumers connect to; a broker that is no cluster
    /// node is used as it is.
    #[arg(long, default_value = "127.0.0.1:5700", value_parser = parse_seeds)]
    pub addr: Seeds,
    /// Directory with ca.crt and the client certificates (`ciphermq-pki --out`).
    #[arg(long, default_value = "certs")]
    pub certs: PathBuf,
    /// RabbitMQ URL (loopback only).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
    /// NATS URL (loopback only).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Publisher connections.
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Consumer connections (spread round robin over the queues). 0: publish only,
    /// the messages stay queued (for memory measurements).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Queues. With `--exchange fanout` each message goes to every queue.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Exchange type.
    #[arg(long, value_enum, default_value = "direct")]
    pub exchange: ExchangeArg,
    /// CipherMQ sender CNs, used round robin by the publishers.
    #[arg(long, value_delimiter = ',', default_value = "sender_1,sender_2")]
    pub senders: Vec<String>,
    /// CipherMQ receiver CN owning the bench queues.
    #[arg(long, default_value = "receiver_1")]
    pub receiver: String,
    /// Size of each message body in bytes (the same bytes go to every broker).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// How bodies are made.
    #[arg(long, value_enum, default_value = "pre-encrypted")]
    pub payload: PayloadArg,
    /// Directory with the receiver's X25519 key pair (`ciphermq-pki --keys`),
    /// for `--payload live`.
    #[arg(long, default_value = "keys")]
    pub keys: PathBuf,
    /// Unacknowledged publishes per publisher (publish pipelining window).
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// Unacknowledged deliveries per consumer.
    #[arg(long, default_value_t = 1000)]
    pub prefetch: u32,
    /// CipherMQ consumers settle each delivery with its own `ack` line
    /// instead of `ack_batch` lines (what clients without it cost).
    #[arg(long)]
    pub single_acks: bool,
    /// CipherMQ publishers write each publish on its own instead of
    /// batching what the window allows into one write: what a client that
    /// flushes after every line costs the broker (a TLS record a message).
    #[arg(long)]
    pub flush_each: bool,
    /// Consumers start only once every publish is acknowledged, and
    /// consume msg/s is measured from their start to the last delivery: a
    /// consume-only figure, draining the backlog the publishers left. The
    /// publish → delivery latency then includes the time queued.
    #[arg(long)]
    pub consume_backlog: bool,
    /// CipherMQ: delete the bench queues after each run (RabbitMQ's are
    /// deleted and NATS's stream too), so that what a publish-only run left
    /// queued does not weigh on the next run.
    #[arg(long)]
    pub delete_queues: bool,
    /// Total messages to publish (over all publishers). Default 200,000 without
    /// `--duration`; with it, an optional upper bound.
    #[arg(long)]
    pub count: Option<u64>,
    /// Publish for this long instead of a fixed count: `30s`, `2m`, `500ms`.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Fixed total publish rate in msg/s. Send times are scheduled and latency is
    /// measured from the scheduled time, so a stalled broker cannot hide its
    /// stall (coordinated omission). Without it, publishers go as fast as the
    /// window allows and latency is measured from the actual send.
    #[arg(long)]
    pub rate: Option<f64>,
    /// With `--rate`: the pacer wakes at most once per this period and
    /// releases every message due by then, each still timed from its own
    /// scheduled send time. `0` (the default) wakes for every message. On a
    /// small machine the load generator shares with the broker, a wake per
    /// message costs CPU the broker then lacks (docs/BENCHMARKS.md).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub pace_tick: Duration,
    /// Runs per target; the summary shows medians.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Longest wait for the last deliveries after publishing ends.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// PID of the CipherMQ broker: its RSS and CPU are read every second of
    /// each CipherMQ run and after it.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// The first part of each run that does not count when judging whether
    /// broker RSS grows (caches and the dedup window fill up during it).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub warm_up: Duration,
    /// Label stored in the JSON (for example `in-memory, 2 shards`).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Messages published when neither `--count` nor `--duration` is given.
pub const DEFAULT_COUNT: u64 = 200_000;

impl LoadArgs {
    /// The cap on published messages: `--count`, or [`DEFAULT_COUNT`] when
    /// there is no `--duration` either; with `--rate` and `--duration`, also
    /// at most `rate × duration`.
    pub fn total(&self) -> Option<u64> {
        let by_rate = match (self.rate, self.duration) {
            (Some(rate), Some(d)) => Some((rate * d.as_secs_f64()).ceil().max(1.0) as u64),
            _ => None,
        };
        match (self.count, self.duration) {
            (Some(c), _) => Some(by_rate.map_or(c, |r| r.min(c))),
            (None, Some(_)) => by_rate,
            (None, None) => Some(DEFAULT_COUNT),
        }
    }

    /// Rejects combinations that cannot run.
    pub fn validate(&self) -> Result<()> {
        if self.publishers == 0 {
            bail!("--publishers must be at least 1");
        }
        if self.senders.is_empty() {
            bail!("--senders must name at least one sender CN");
        }
        if self.queues == 0 {
            bail!("--queues must be at least 1");
        }
        if self.window == 0 || self.window > u32::MAX as usize / 2 {
            bail!("--window must be between 1 and {}", u32::MAX / 2);
        }
        if self.prefetch == 0 {
            bail!("--prefetch must be at least 1");
        }
        if self.runs == 0 {
            bail!("--runs must be at least 1");
        }
        if self.consume_backlog && (self.consumers == 0 || self.rate.is_some()) {
            bail!("--consume-backlog needs at least one consumer and no --rate");
        }
        if self.count == Some(0) {
            bail!("--count must be at least 1");
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            bail!("--duration must be positive");
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                bail!("--rate must be a positive number of messages per second");
            }
        }
        let min = crate::payload::min_size(&self.receiver);
        if self.size < min {
            bail!("--size must be at least {min} bytes (the envelope's fixed fields)");
        }
        Ok(())
    }
}

/// Options of `ciphermq-bench drain`.
#[derive(Args, Debug, Clone)]
pub struct DrainArgs {
    /// CipherMQ broker address.
    #[arg(long, default_value = "127.0.0.1:5700")]
    pub addr: String,
    /// Directory with ca.crt and the client certificates.
    #[arg(long, default_value = "certs")]
    pub certs: PathBuf,
    /// Receiver CN owning the queue.
    #[arg(long, default_value = "receiver_1")]
    pub receiver: String,
    /// The queue (a load run's first queue by default).
    #[arg(long, default_value = "receiver_1_bench_q0")]
    pub queue: String,
    /// Distinct messages to wait for.
    #[arg(long)]
    pub expect: u64,
    /// Unacknowledged deliveries at once.
    #[arg(long, default_value_t = 1000)]
    pub prefetch: u32,
    /// Give up when nothing arrives for this long.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub idle: Duration,
}

/// Options of `ciphermq-bench idle`.
#[derive(Args, Debug, Clone)]
pub struct IdleArgs {
    /// CipherMQ broker address.
    #[arg(long, default_value = "127.0.0.1:5700")]
    pub addr: String,
    /// Directory with ca.crt and the client certificates.
    #[arg(long, default_value = "certs")]
    pub certs: PathBuf,
    /// Connections to open.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 64)]
    pub parallel: usize,
    /// CNs to connect as, round robin (senders: no heartbeat deadline).
    #[arg(long, value_delimiter = ',', default_value = "sender_1,sender_2")]
    pub cns: Vec<String>,
    /// How long to hold the connections open once all are up.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub hold: Duration,
    /// PID of the broker: its RSS is read before and while the connections are held.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `ciphermq-bench plot`.
#[derive(Args, Debug, Clone)]
pub struct PlotArgs {
    /// A result written by `--json`.
    pub json: PathBuf,
    /// The SVG file to write.
    #[arg(long, short)]
    pub out: PathBuf,
    /// Which CipherMQ run of the file to draw (1-based).
    #[arg(long, default_value_t = 1)]
    pub run: usize,
}

/// `ciphermq-bench disk-floor`.
#[derive(Args, Debug, Clone)]
pub struct DiskFloorArgs {
    /// A directory on the disk to measure (the broker's data directory's
    /// disk); a scratch file is written there and removed.
    #[arg(long)]
    pub dir: PathBuf,
    /// Appends per second.
    #[arg(long, default_value_t = 5_000)]
    pub rate: u64,
    /// Bytes per append: about a 1 KiB body's log record.
    #[arg(long, default_value_t = 1_100)]
    pub record_bytes: usize,
    /// Length of each run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Runs, one after the other.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Overwrite a file of this many MiB, written with zeros and synced
    /// before the run, from its start (and from its start again once full),
    /// instead of appending: each `fdatasync` then has no new size or
    /// blocks to commit, as with a log of recycled, pre-written segments.
    #[arg(long)]
    pub overwrite_mib: Option<u64>,
    /// Rounds in flight at once, each on a thread of its own, acknowledged
    /// in order: with more than 1, an append that comes while a round is
    /// syncing starts its own round at once instead of waiting for it.
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The CipherMQ addresses of a load run's `--addr`, in the order they are
/// tried: one broker, or seeds of a cluster. Never empty, no item blank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeds(Vec<String>);

impl Seeds {
    /// Every address, in order.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Display for Seeds {
    /// As given, without the blanks: `a:1,b:2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// Why `--addr` is not a list of addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedsError {
    /// Nothing but commas and blanks.
    Empty,
    /// An empty item (`a,,b`, or a comma at either end), 1-based: a
    /// forgotten address is more likely than a wish to skip one.
    EmptyItem(usize),
    /// An item with a blank inside (`a:1 b:2`): addresses are separated
    /// by commas, and no address holds a blank.
    Blank(String),
}

impl fmt::Display for SeedsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeedsError::Empty => f.write_str("no address given: expected host:port[,host:port…]"),
            SeedsError::EmptyItem(n) => write!(
                f,
                "address {n} of the list is empty: expected host:port[,host:port…]"
            ),
            SeedsError::Blank(item) => {
                write!(f, "{item:?} holds a blank: separate addresses with commas")
            }
        }
    }
}

impl std::error::Error for SeedsError {}

/// Parses `--addr`: addresses separated by commas, blanks around each
/// ignored (`a:1, b:2`), none empty.
pub fn parse_seeds(s: &str) -> Result<Seeds, SeedsError> {
    if s.trim().is_empty() {
        return Err(SeedsError::Empty);
    }
    let mut seeds = Vec::new();
    for (i, item) in s.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            return Err(SeedsError::EmptyItem(i + 1));
        }
        if item.contains(char::is_whitespace) {
            return Err(SeedsError::Blank(item.to_owned()));
        }
        seeds.push(item.to_owned());
    }
    Ok(Seeds(seeds))
}

/// Parses `250ms`, `30s`, `2m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 250us, 500ms, 30s, 2m"))?;
    let secs = match unit {
        "us" | "µs" => value / 1e6,
        "ms" => value / 1000.0,
        "s" => value,
        "m" | "min" => value * 60.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?}: use us, ms, s or m"
            ))
        }
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_and_without_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("3h").is_err());
    }

    #[test]
    fn the_bare_command_line_is_a_valid_load_run() {
        let cli = Cli::try_parse_from(["ciphermq-bench"]).unwrap();
        assert!(cli.command.is_none());
        cli.load.validate().unwrap();
    }

    #[test]
    fn one_address_is_one_seed_and_the_default_is_unchanged() {
        let one = |s: &str| parse_seeds(s).map(|s| s.as_slice().to_vec());
        assert_eq!(one("127.0.0.1:5700"), Ok(vec!["127.0.0.1:5700".to_owned()]));
        assert_eq!(one("localhost:5917"), Ok(vec!["localhost:5917".to_owned()]));
        assert_eq!(one(" [::1]:5700 "), Ok(vec!["[::1]:5700".to_owned()]));
        let cli = Cli::try_parse_from(["ciphermq-bench"]).unwrap();
        assert_eq!(cli.load.addr.as_slice(), ["127.0.0.1:5700"]);
        assert_eq!(cli.load.addr.to_string(), "127.0.0.1:5700");
    }

    #[test]
    fn several_addresses_keep_their_order_without_blanks() {
        let seeds = parse_seeds("127.0.0.1:5700, 127.0.0.1:5701 ,\t10.0.0.3:5700").unwrap();
        assert_eq!(
            seeds.as_slice(),
            ["127.0.0.1:5700", "127.0.0.1:5701", "10.0.0.3:5700"]
        );
        assert_eq!(
            seeds.to_string(),
            "127.0.0.1:5700,127.0.0.1:5701,10.0.0.3:5700"
        );
        let cli =
            Cli::try_parse_from(["ciphermq-bench", "--addr", "127.0.0.1:5700,127.0.0.1:5701"])
                .unwrap();
        assert_eq!(cli.load.addr.as_slice().len(), 2);
    }

    #[test]
    fn empty_items_and_blanks_inside_are_refused() {
        assert_eq!(parse_seeds(""), Err(SeedsError::Empty));
        assert_eq!(parse_seeds("  "), Err(SeedsError::Empty));
        assert_eq!(parse_seeds("a:1,,b:2"), Err(SeedsError::EmptyItem(2)));
        assert_eq!(parse_seeds("a:1,"), Err(SeedsError::EmptyItem(2)));
        assert_eq!(parse_seeds(",a:1"), Err(SeedsError::EmptyItem(1)));
        assert_eq!(parse_seeds("a:1, ,b:2"), Err(SeedsError::EmptyItem(2)));
        assert_eq!(parse_seeds(","), Err(SeedsError::EmptyItem(1)));
        assert_eq!(
            parse_seeds("a:1 b:2"),
            Err(SeedsError::Blank("a:1 b:2".to_owned()))
        );
        // Clap says which option and why, instead of a connection failing later.
        let err = Cli::try_parse_from(["ciphermq-bench", "--addr", "a:1,,b:2"]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("--addr") && text.contains("address 2"),
            "{text}"
        );
    }

    #[test]
    fn idle_is_a_subcommand() {
        let cli = Cli::try_parse_from(["ciphermq-bench", "idle", "--connections", "10"]).unwrap();
        match cli.command {
            Some(Command::Idle(a)) => assert_eq!(a.connections, 10),
            other => panic!("{other:?}"),
        }
    }
}
