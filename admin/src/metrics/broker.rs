//! The broker as a whole: its name and version, readiness, uptime, the
//! process's own figures and its TLS material's expiry.

use ciphermq_stats::BrokerStats;

use super::{Exposition, Kind};
use crate::broker_view::TlsExpiries;
use crate::endpoint::AdminContext;

/// The broker's own families; `ready` is what `/ready` answers.
pub(super) fn broker_series(
    e: &mut Exposition,
    ctx: &AdminContext,
    stats: &BrokerStats,
    ready: bool,
) {
    e.family("ciphermq_info", Kind::Gauge, "Broker name and version.");
    e.sample_u64(
        "ciphermq_info",
        &[("name", &ctx.name), ("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    e.family(
        "ciphermq_ready",
        Kind::Gauge,
        "1 when /ready answers 200: listeners bound, logs recovered, storage writing.",
    );
    e.sample_u64("ciphermq_ready", &[], u64::from(ready));
    e.family(
        "ciphermq_uptime_seconds",
        Kind::Gauge,
        "Seconds since the broker started.",
    );
    e.sample("ciphermq_uptime_seconds", &[], stats.uptime().as_secs_f64());
    e.family("ciphermq_shards", Kind::Gauge, "Shards (pinned executors).");
    e.sample_u64("ciphermq_shards", &[], stats.shards().len() as u64);
    process_series(e, &crate::process::read());
    certificate_series(e, &ctx.broker.tls_expiries(), unix_seconds());
}

/// The process's own numbers (`process.rs`); a figure that could not be
/// read is left out.
fn process_series(e: &mut Exposition, p: &crate::process::ProcessStats) {
    let gauges: [(&str, Kind, &str, Option<f64>); 6] = [
        (
            "ciphermq_process_cpu_seconds_total",
            Kind::Counter,
            "User and system CPU time of the broker process.",
            p.cpu_seconds,
        ),
        (
            "ciphermq_process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory of the broker process.",
            p.resident_bytes.map(|b| b as f64),
        ),
        (
            "ciphermq_process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory of the broker process.",
            p.virtual_bytes.map(|b| b as f64),
        ),
        (
            "ciphermq_process_open_fds",
            Kind::Gauge,
            "Open file descriptors (connections, segment files, sockets).",
            p.open_fds.map(|n| n as f64),
        ),
        (
            "ciphermq_process_max_fds",
            Kind::Gauge,
            "The soft limit on open file descriptors.",
            p.max_fds.map(|n| n as f64),
        ),
        (
            "ciphermq_process_start_time_seconds",
            Kind::Gauge,
            "When the broker process started, in seconds since the Unix epoch.",
            p.start_time_seconds,
        ),
    ];
    for (name, kind, help, value) in gauges {
        if let Some(value) = value {
            e.family(name, kind, help);
            e.sample(name, &[], value);
        }
    }
}

/// Seconds until each TLS certificate in force expires (negative once it
/// has), and until the CRLs' next update.
fn certificate_series(e: &mut Exposition, expiries: &TlsExpiries, now: i64) {
    let certificates: Vec<_> = [("server", expiries.server), ("ca", expiries.ca)]
        .into_iter()
        .filter_map(|(name, t)| Some((name, t?)))
        .collect();
    if !certificates.is_empty() {
        let name = "ciphermq_tls_certificate_expiry_seconds";
        e.family(
            name,
            Kind::Gauge,
            "Seconds until a TLS certificate in force expires (reloaded on SIGHUP): certificate=\"server\" (tls.cert_path), \"ca\" (the earliest of tls.ca_cert_path).",
        );
        for (certificate, not_after) in certificates {
            e.sample(
                name,
                &[("certificate", certificate)],
                (not_after - now) as f64,
            );
        }
    }
    if let Some(next_update) = expiries.crl_next_update {
        let name = "ciphermq_tls_crl_next_update_seconds";
        e.family(
            name,
            Kind::Gauge,
            "Seconds until the earliest nextUpdate of the CRLs of tls.crl_path (negative: past due; the CRL still applies).",
        );
        e.sample(name, &[], (next_update - now) as f64);
    }
}

fn unix_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
