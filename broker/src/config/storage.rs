//! `[storage]`: where and how the queue logs are kept, and the checks.

use std::path::PathBuf;

use serde::Deserialize;

use super::checks::check_non_empty_path;
use super::{Config, ConfigError, MAX_MEMORY_BUDGET_MB, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES};

/// Whether queue logs reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageMode {
    /// Append-only logs with group commit; `ACK` only once fsynced (the default).
    #[default]
    Durable,
    /// Queues in memory only: everything is lost on restart. For tests and benches.
    Memory,
}

impl StorageMode {
    /// The config spelling, for status output.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageMode::Durable => "durable",
            StorageMode::Memory => "memory",
        }
    }
}

/// `[storage]`: the per-queue logs (docs/ARCHITECTURE.md, "Storage").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Directory of queue logs, topology and keys (relative to the config file).
    /// Default `data`.
    pub data_dir: PathBuf,
    /// `durable` or `memory`. Default `durable`.
    pub mode: StorageMode,
    /// Size at which a queue log rolls to a new segment, in bytes; at least
    /// [`MIN_SEGMENT_BYTES`]. Default 64 MiB (67 108 864).
    pub segment_bytes: u64,
    /// Extra microseconds a shard may wait to gather more appends into one
    /// `fdatasync`; 0 = sync at the end of each reactor turn. Default 0.
    pub max_commit_delay_us: u64,
    /// Free space, in MiB, below which publishes are refused with
    /// `NACK <id> disk_full` (consumers keep draining, acked segments are
    /// deleted); publishing resumes above it plus an eighth (1–64 MiB).
    /// 0 turns the watermark off. Default 256.
    pub min_free_mb: u64,
    /// MiB of message bodies all queued messages together may hold in RAM,
    /// shared evenly by the shards. In `memory` mode it is a hard cap:
    /// a publish past its shard's share is `NACK <id> queue_full`. In
    /// `durable` mode bodies are, for now, all kept in RAM as well and the
    /// budget is only reported. At least 1, at most
    /// [`MAX_MEMORY_BUDGET_MB`]. Default 256.
    pub memory_budget_mb: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from("data"),
            mode: StorageMode::Durable,
            segment_bytes: 64 * 1024 * 1024,
            max_commit_delay_us: 0,
            min_free_mb: 256,
            memory_budget_mb: 256,
        }
    }
}

impl Config {
    pub(super) fn validate_storage(&self) -> Result<(), ConfigError> {
        let s = &self.storage;
        check_non_empty_path("storage.data_dir", &s.data_dir)?;
        self.validate_durations()?;
        if s.segment_bytes > MAX_SEGMENT_BYTES {
            return Err(ConfigError::invalid(
                "storage.segment_bytes",
                format!(
                    "must be at most {MAX_SEGMENT_BYTES} (1 GiB; got {}): recovery reads a \
                     segment whole",
                    s.segment_bytes
                ),
            ));
        }
        if s.segment_bytes < MIN_SEGMENT_BYTES {
            return Err(ConfigError::invalid(
                "storage.segment_bytes",
                format!(
                    "must be at least {MIN_SEGMENT_BYTES} (got {})",
                    s.segment_bytes
                ),
            ));
        }
        if !(1..=MAX_MEMORY_BUDGET_MB).contains(&s.memory_budget_mb) {
            return Err(ConfigError::invalid(
                "storage.memory_budget_mb",
                format!(
                    "must be from 1 to {MAX_MEMORY_BUDGET_MB} MiB (got {})",
                    s.memory_budget_mb
                ),
            ));
        }
        Ok(())
    }
}
