//! The admin endpoint's own connections.

use super::{Exposition, Kind};
use crate::slots::{Cap, SlotStats};

/// The admin endpoint's own connections: how full its slots are and whom
/// its limits turned away (`[admin]` connection limits).
pub(super) fn admin_metrics(e: &mut Exposition, s: &SlotStats) {
    e.family(
        "ciphermq_admin_connections",
        Kind::Gauge,
        "Open admin endpoint connections (this scrape's included).",
    );
    e.sample_u64("ciphermq_admin_connections", &[], s.open);
    e.family(
        "ciphermq_admin_max_connections",
        Kind::Gauge,
        "admin.max_connections: admin connections open at once.",
    );
    e.sample_u64("ciphermq_admin_max_connections", &[], s.max_connections);
    e.family(
        "ciphermq_admin_connections_accepted_total",
        Kind::Counter,
        "Admin connections given a slot.",
    );
    e.sample_u64("ciphermq_admin_connections_accepted_total", &[], s.accepted);
    e.family(
        "ciphermq_admin_connections_refused_total",
        Kind::Counter,
        "Admin connections closed at accept: the limit was reached and no connection it counts could be given up.",
    );
    for (i, cap) in [Cap::PerIp, Cap::Global].into_iter().enumerate() {
        e.sample_u64(
            "ciphermq_admin_connections_refused_total",
            &[("limit", cap.key())],
            s.refused[i],
        );
    }
    e.family(
        "ciphermq_admin_connections_shed_total",
        Kind::Counter,
        "Admin connections (in their handshake, without a finished request, or idle) closed to serve a newcomer.",
    );
    for (i, cap) in [Cap::PerIp, Cap::Global].into_iter().enumerate() {
        e.sample_u64(
            "ciphermq_admin_connections_shed_total",
            &[("limit", cap.key())],
            s.shed[i],
        );
    }
    e.family(
        "ciphermq_admin_connections_timed_out_total",
        Kind::Counter,
        "Admin connections closed at a deadline, by phase: handshake and headers (admin.header_timeout_secs), idle (admin.idle_timeout_secs), response (admin.response_timeout_secs).",
    );
    for (phase, n) in s.timeouts() {
        e.sample_u64(
            "ciphermq_admin_connections_timed_out_total",
            &[("phase", phase)],
            n,
        );
    }
}
