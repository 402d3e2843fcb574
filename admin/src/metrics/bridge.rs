//! The Postgres bridge, when the broker runs one.

use ciphermq_pgbridge::BridgeStatus;

use super::{Exposition, Kind};

/// The Postgres bridge's gauges and counters.
pub(super) fn bridge_metrics(e: &mut Exposition, b: &BridgeStatus) {
    e.family(
        "ciphermq_pgbridge_connected",
        Kind::Gauge,
        "1 while every connection the Postgres bridge needs is up.",
    );
    e.sample_u64("ciphermq_pgbridge_connected", &[], u64::from(b.connected));
    e.family(
        "ciphermq_pgbridge_rows_written_total",
        Kind::Counter,
        "Metadata rows written in committed transactions.",
    );
    e.sample_u64("ciphermq_pgbridge_rows_written_total", &[], b.rows_written);
    e.family(
        "ciphermq_pgbridge_lag_bytes",
        Kind::Gauge,
        "Log bytes past the metadata mirror's committed watermark.",
    );
    e.sample_u64("ciphermq_pgbridge_lag_bytes", &[], b.lag_bytes);
    e.family(
        "ciphermq_pgbridge_lag_rows",
        Kind::Gauge,
        "Messages durable in the queue logs whose metadata rows are not committed yet.",
    );
    e.sample_u64("ciphermq_pgbridge_lag_rows", &[], b.lag_rows);
    e.family(
        "ciphermq_pgbridge_lag_seconds",
        Kind::Gauge,
        "Seconds since the mirror last caught up with every log (0 when caught up).",
    );
    e.sample("ciphermq_pgbridge_lag_seconds", &[], b.lag_seconds);
    e.family(
        "ciphermq_pgbridge_missed_segments_total",
        Kind::Counter,
        "Log segments deleted before the mirror read them (their rows are missing).",
    );
    e.sample_u64(
        "ciphermq_pgbridge_missed_segments_total",
        &[],
        b.missed_segments,
    );
    e.family(
        "ciphermq_pgbridge_reconnects_total",
        Kind::Counter,
        "Postgres connections re-established after a loss.",
    );
    e.sample_u64("ciphermq_pgbridge_reconnects_total", &[], b.reconnects);
}
