//! The admin endpoint's connection slots: who holds one, doing what, since
//! when, until when, and whom a newcomer displaces when the slots run out.
//!
//! Without this, anyone who can reach the admin port could take every slot
//! with sockets that never send a byte and lock monitoring out. So:
//!
//! - every connection has a deadline for its current [`Phase`] (handshake
//!   and first request headers, keep-alive wait, response);
//! - one client address holds at most `max_per_ip` slots; at that cap a
//!   newcomer replaces the address's oldest connection that has not finished
//!   a request, or is refused when there is none;
//! - at the global cap a newcomer replaces the connection most worth
//!   dropping: lowest phase first (a handshake, then an authenticated
//!   connection without a finished request, then an idle kept-alive one),
//!   from the address holding the most slots, idle longest. Connections
//!   answering a request are never replaced; only when every slot is busy
//!   is the newcomer refused.
//!
//! All of it lives behind one mutex that only the admin thread takes, for a
//! few microseconds and never across an `.await`. The table holds at most
//! `max_connections` entries; replacing scans it (at most
//! [`MAX_ADMIN_CONNECTIONS`](crate::config::MAX_ADMIN_CONNECTIONS)).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use ciphermq_shard::log_throttle::LogThrottle;

use crate::config::AdminConfig;

/// The endpoint's connection limits, from `[admin]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// `admin.max_connections`.
    pub max_connections: usize,
    /// `admin.max_connections_per_ip`.
    pub max_per_ip: usize,
    /// `admin.header_timeout_secs`: accept to first request headers.
    pub header_timeout: Duration,
    /// `admin.idle_timeout_secs`: end of a response to the next headers.
    pub idle_timeout: Duration,
    /// `admin.response_timeout_secs`: headers in to response handed over.
    pub response_timeout: Duration,
}

impl AdminLimits {
    /// The limits of a validated `[admin]` section. Zeros (an unvalidated
    /// config) become 1, so the endpoint never has no slot or no deadline.
    pub fn from_config(admin: &AdminConfig) -> AdminLimits {
        let secs = |s: u64| Duration::from_secs(s.max(1));
        let max_connections = (admin.max_connections.max(1)) as usize;
        AdminLimits {
            max_connections,
            max_per_ip: (admin.max_connections_per_ip.max(1) as usize).min(max_connections),
            header_timeout: secs(admin.header_timeout_secs),
            idle_timeout: secs(admin.idle_timeout_secs),
            response_timeout: secs(admin.response_timeout_secs),
        }
    }
}

/// What a connection is doing. The order is the order in which connections
/// are given up for a newcomer: the cheaper a phase is for a client to
/// reach, the earlier it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Accepted, TLS handshake not done: nobody knows who this is yet.
    Handshake,
    /// Authenticated, no request finished yet (a slowloris stays here).
    AwaitingRequest,
    /// Answered a request, waiting for the next one (keep-alive).
    KeptAlive,
    /// Request headers in, response not fully handed over: never replaced.
    Busy,
}

impl Phase {
    /// Label of `ciphermq_admin_connections_timed_out_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::Handshake => "handshake",
            Phase::AwaitingRequest => "headers",
            Phase::KeptAlive => "idle",
            Phase::Busy => "response",
        }
    }

    /// The config key whose deadline ran out in this phase, for logs.
    pub(crate) fn timeout_key(self) -> &'static str {
        match self {
            Phase::Handshake | Phase::AwaitingRequest => "admin.header_timeout_secs",
            Phase::KeptAlive => "admin.idle_timeout_secs",
            Phase::Busy => "admin.response_timeout_secs",
        }
    }

    const ALL: [Phase; 4] = [
        Phase::Handshake,
        Phase::AwaitingRequest,
        Phase::KeptAlive,
        Phase::Busy,
    ];
}

/// Which cap made room or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cap {
    /// `admin.max_connections_per_ip`.
    PerIp,
    /// `admin.max_connections`.
    Global,
}

impl Cap {
    /// Its config key: the `limit` label of the metrics, and in logs.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Cap::PerIp => "admin.max_connections_per_ip",
            Cap::Global => "admin.max_connections",
        }
    }
}

/// A connection closed to make room for a newcomer, for the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shed {
    /// The cap that was reached.
    pub(crate) cap: Cap,
    /// Who was closed.
    pub(crate) peer: SocketAddr,
    /// What it was doing.
    pub(crate) phase: Phase,
    /// For how long it had been in that phase.
    pub(crate) idle: Duration,
}

/// The answer to a newcomer.
#[derive(Debug)]
pub(crate) enum Admission {
    /// It has a slot (maybe taken from `shed`).
    Admitted {
        /// Frees the slot when dropped.
        ticket: Ticket,
        /// The connection it replaced, if any.
        shed: Option<Shed>,
    },
    /// No slot: close it at once.
    Refused(Cap),
}

/// Events a hostile client can cause at will; each kind is logged at most
/// once a second (with the count left out).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LogKind {
    /// A newcomer refused.
    Refused,
    /// A connection closed for a newcomer.
    Shed,
    /// A deadline ran out.
    TimedOut,
    /// A TLS handshake failed.
    Handshake,
}

/// Counters and gauges for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlotStats {
    /// Connections open now.
    pub(crate) open: u64,
    /// `admin.max_connections`.
    pub(crate) max_connections: u64,
    /// Connections given a slot.
    pub(crate) accepted: u64,
    /// Newcomers refused, per cap: `[per_ip, global]`.
    pub(crate) refused: [u64; 2],
    /// Connections closed for a newcomer, per cap: `[per_ip, global]`.
    pub(crate) shed: [u64; 2],
    /// Connections closed at a deadline, per [`Phase`] in order.
    pub(crate) timed_out: [u64; 4],
}

impl SlotStats {
    /// `(label, count)` of the timeouts.
    pub(crate) fn timeouts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Phase::ALL
            .iter()
            .zip(self.timed_out)
            .map(|(p, n)| (p.label(), n))
    }
}

fn cap_index(cap: Cap) -> usize {
    match cap {
        Cap::PerIp => 0,
        Cap::Global => 1,
    }
}

/// What the per-address cap counts: an IPv4 address (IPv4-mapped IPv6
/// included) or an IPv6 /64, the block one host usually gets.
fn address_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

struct Entry {
    peer: SocketAddr,
    group: IpAddr,
    phase: Phase,
    /// When it entered `phase`.
    since: Instant,
    /// When it is closed unless its phase moves on.
    deadline: Instant,
    /// Requests started: a response's end only counts for the request it
    /// answers.
    requests: u64,
    /// Tells its task that it was closed for a newcomer.
    shed: Option<oneshot::Sender<()>>,
}

struct Inner {
    next_id: u64,
    open: HashMap<u64, Entry>,
    per_group: HashMap<IpAddr, usize>,
    stats: SlotStats,
    logs: [LogThrottle; 4],
}

impl Inner {
    /// The connection to give up for a newcomer: among those of `group`
    /// (any when `None`) in a phase up to `max_phase`, the lowest phase,
    /// then from the address holding the most slots, then idle longest.
    fn victim(&self, group: Option<IpAddr>, max_phase: Phase) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, e)| e.phase <= max_phase && group.is_none_or(|g| e.group == g))
            .min_by_key(|(id, e)| {
                let held = self.per_group.get(&e.group).copied().unwrap_or(0);
                (e.phase, Reverse(held), e.since, **id)
            })
            .map(|(id, _)| *id)
    }

    /// Takes `id` out of the table; its task learns it when `notify`.
    fn remove(&mut self, id: u64, notify: bool) -> Option<Entry> {
        let mut entry = self.open.remove(&id)?;
        if let Some(n) = self.per_group.get_mut(&entry.group) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_group.remove(&entry.group);
            }
        }
        if let (true, Some(tx)) = (notify, entry.shed.take()) {
            let _ = tx.send(());
        }
        Some(entry)
    }

    fn shed(&mut self, id: u64, cap: Cap, now: Instant) -> Option<Shed> {
        let entry = self.remove(id, true)?;
        self.stats.shed[cap_index(cap)] += 1;
        Some(Shed {
            cap,
            peer: entry.peer,
            phase: entry.phase,
            idle: now.saturating_duration_since(entry.since),
        })
    }
}

/// The slot table of one admin endpoint.
pub(crate) struct Slots {
    limits: AdminLimits,
    inner: Mutex<Inner>,
}

impl Slots {
    /// An empty table with `limits`.
    pub(crate) fn new(limits: AdminLimits) -> Slots {
        let every = Duration::from_secs(1);
        Slots {
            limits,
            inner: Mutex::new(Inner {
                next_id: 0,
                open: HashMap::with_capacity(limits.max_connections),
                per_group: HashMap::new(),
                stats: SlotStats {
                    max_connections: limits.max_connections as u64,
                    ..SlotStats::default()
                },
                logs: [
                    LogThrottle::new(every),
                    LogThrottle::new(every),
                    LogThrottle::new(every),
                    LogThrottle::new(every),
                ],
            }),
        }
    }

    /// The table; a panic elsewhere while it was held leaves nothing half
    /// done that matters here, so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection from `peer` accepted at `now`, in
    /// [`Phase::Handshake`] with the header deadline; see the module doc.
    pub(crate) fn admit(self: &Arc<Self>, peer: SocketAddr, now: Instant) -> Admission {
        let group = address_group(peer.ip());
        let mut inner = self.lock();
        let mut shed = None;
        if inner.per_group.get(&group).copied().unwrap_or(0) >= self.limits.max_per_ip {
            match inner.victim(Some(group), Phase::AwaitingRequest) {
                Some(id) => shed = inner.shed(id, Cap::PerIp, now),
                None => {
                    inner.stats.refused[cap_index(Cap::PerIp)] += 1;
                    return Admission::Refused(Cap::PerIp);
                }
            }
        }
        if inner.open.len() >= self.limits.max_connections {
            match inner.victim(None, Phase::KeptAlive) {
                Some(id) => shed = inner.shed(id, Cap::Global, now),
                None => {
                    inner.stats.refused[cap_index(Cap::Global)] += 1;
                    return Admission::Refused(Cap::Global);
                }
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let (tx, rx) = oneshot::channel();
        inner.open.insert(
            id,
            Entry {
                peer,
                group,
                phase: Phase::Handshake,
                since: now,
                deadline: now + self.limits.header_timeout,
                requests: 0,
                shed: Some(tx),
            },
        );
        *inner.per_group.entry(group).or_insert(0) += 1;
        inner.stats.accepted += 1;
        Admission::Admitted {
            ticket: Ticket {
                id,
                slots: self.clone(),
                shed: rx,
            },
            shed,
        }
    }

    /// `id`'s TLS handshake is done: it waits for its first request, still
    /// under the deadline set at accept.
    pub(crate) fn authenticated(&self, id: u64, now: Instant) {
        if let Some(e) = self.lock().open.get_mut(&id) {
            e.phase = Phase::AwaitingRequest;
            e.since = now;
        }
    }

    /// `id` has a request's headers: it has the response timeout to answer.
    /// Returns the request's number, for [`Slots::response_done`].
    pub(crate) fn request_started(&self, id: u64, now: Instant) -> u64 {
        let mut inner = self.lock();
        let Some(e) = inner.open.get_mut(&id) else {
            return 0;
        };
        e.requests += 1;
        e.phase = Phase::Busy;
        e.since = now;
        e.deadline = now + self.limits.response_timeout;
        e.requests
    }

    /// The response to request `request` of `id` was handed over whole: it
    /// may wait the idle timeout for the next request.
    pub(crate) fn response_done(&self, id: u64, request: u64, now: Instant) {
        if let Some(e) = self.lock().open.get_mut(&id) {
            if e.phase == Phase::Busy && e.requests == request {
                e.phase = Phase::KeptAlive;
                e.since = now;
                e.deadline = now + self.limits.idle_timeout;
            }
        }
    }

    /// `id`'s phase and deadline; `None` once it lost its slot.
    pub(crate) fn deadline(&self, id: u64) -> Option<(Phase, Instant)> {
        self.lock().open.get(&id).map(|e| (e.phase, e.deadline))
    }

    /// Counts a connection closed at its deadline in `phase`.
    pub(crate) fn timed_out(&self, phase: Phase) {
        self.lock().stats.timed_out[phase as usize] += 1;
    }

    /// Whether to log an event of `kind` now: `Some(events left out since
    /// the last line)`, or `None` to stay quiet.
    pub(crate) fn log_gate(&self, kind: LogKind, now: Instant) -> Option<u64> {
        let i = kind as usize;
        self.lock().logs[i].admit(now)
    }

    /// The numbers for `/metrics`.
    pub(crate) fn stats(&self) -> SlotStats {
        let inner = self.lock();
        SlotStats {
            open: inner.open.len() as u64,
            ..inner.stats
        }
    }

    fn release(&self, id: u64) {
        self.lock().remove(id, false);
    }
}

/// A connection's claim on its slot: frees it when dropped, and tells the
/// connection when it was closed for a newcomer.
#[derive(Debug)]
pub(crate) struct Ticket {
    id: u64,
    slots: Arc<Slots>,
    shed: oneshot::Receiver<()>,
}

impl Ticket {
    /// The connection's id in the table.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Resolves when the connection lost its slot to a newcomer (or the
    /// table forgot it).
    pub(crate) fn shed_signal(&mut self) -> &mut oneshot::Receiver<()> {
        &mut self.shed
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.slots.release(self.id);
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_ip: usize) -> AdminLimits {
        AdminLimits {
            max_connections: max,
            max_per_ip: per_ip,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(10),
        }
    }

    fn peer(ip: &str, port: u16) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), port)
    }

    fn admitted(a: Admission) -> (Ticket, Option<Shed>) {
        match a {
            Admission::Admitted { ticket, shed } => (ticket, shed),
            Admission::Refused(cap) => panic!("refused by {cap:?}"),
        }
    }

    fn is_shed(t: &mut Ticket) -> bool {
        t.shed_signal().try_recv().is_ok()
    }

    #[test]
    fn a_full_table_gives_up_the_oldest_handshake_first() {
        let slots = Arc::new(Slots::new(limits(3, 3)));
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let (mut kept, _) = admitted(slots.admit(peer("10.0.0.1", 1), at(0)));
        slots.authenticated(kept.id(), at(0));
        let n = slots.request_started(kept.id(), at(0));
        slots.response_done(kept.id(), n, at(0));
        let (mut old, _) = admitted(slots.admit(peer("10.0.0.2", 1), at(1)));
        let (mut young, _) = admitted(slots.admit(peer("10.0.0.3", 1), at(2)));
        let (_new, shed) = admitted(slots.admit(peer("10.0.0.4", 1), at(3)));
        let shed = shed.expect("room was made");
        assert_eq!(shed.cap, Cap::Global);
        assert_eq!(shed.peer, peer("10.0.0.2", 1));
        assert_eq!(shed.phase, Phase::Handshake);
        assert!(is_shed(&mut old));
        assert!(!is_shed(&mut young) && !is_shed(&mut kept));
        assert_eq!(slots.deadline(old.id()), None);
        let stats = slots.stats();
        assert_eq!((stats.open, stats.accepted, stats.shed), (3, 4, [0, 1]));
    }

    #[test]
    fn the_address_holding_most_slots_gives_up_first() {
        let slots = Arc::new(Slots::new(limits(3, 3)));
        let t0 = Instant::now();
        let (mut lone, _) = admitted(slots.admit(peer("10.0.0.1", 1), t0));
        let (mut a, _) = admitted(slots.admit(peer("10.0.0.2", 1), t0 + Duration::from_secs(1)));
        let (_b, _) = admitted(slots.admit(peer("10.0.0.2", 2), t0 + Duration::from_secs(2)));
        let (_c, shed) = admitted(slots.admit(peer("10.0.0.3", 1), t0 + Duration::from_secs(3)));
        assert_eq!(shed.map(|s| s.peer), Some(peer("10.0.0.2", 1)));
        assert!(is_shed(&mut a) && !is_shed(&mut lone));
    }

    #[test]
    fn busy_connections_are_kept_and_the_newcomer_refused() {
        let slots = Arc::new(Slots::new(limits(2, 2)));
        let now = Instant::now();
        let mut held = Vec::new();
        for port in 1..=2 {
            let (t, _) = admitted(slots.admit(peer("10.0.0.1", port), now));
            slots.authenticated(t.id(), now);
            slots.request_started(t.id(), now);
            held.push(t);
        }
        assert!(matches!(
            slots.admit(peer("10.0.0.9", 1), now),
            Admission::Refused(Cap::Global)
        ));
        // A response's end frees the connection for replacement.
        slots.response_done(held[0].id(), 1, now);
        let (_t, shed) = admitted(slots.admit(peer("10.0.0.9", 1), now));
        assert_eq!(
            shed.map(|s| (s.phase, s.peer)),
            Some((Phase::KeptAlive, peer("10.0.0.1", 1)))
        );
        assert_eq!(slots.stats().refused, [0, 1]);
    }

    #[test]
    fn the_per_ip_cap_replaces_unproven_connections_and_refuses_otherwise() {
        let slots = Arc::new(Slots::new(limits(10, 2)));
        let now = Instant::now();
        let (mut idle, _) = admitted(slots.admit(peer("10.0.0.1", 1), now));
        let (served, _) = admitted(slots.admit(peer("10.0.0.1", 2), now));
        slots.authenticated(served.id(), now);
        let n = slots.request_started(served.id(), now);
        slots.response_done(served.id(), n, now);
        // The idle handshake goes for a newcomer from the same address.
        let (fresh, shed) = admitted(slots.admit(peer("10.0.0.1", 3), now));
        assert_eq!(shed.map(|s| s.cap), Some(Cap::PerIp));
        assert!(is_shed(&mut idle));
        // Once every connection of the address has served a request, it is full.
        slots.authenticated(fresh.id(), now);
        let n = slots.request_started(fresh.id(), now);
        slots.response_done(fresh.id(), n, now);
        assert!(matches!(
            slots.admit(peer("10.0.0.1", 4), now),
            Admission::Refused(Cap::PerIp)
        ));
        // Other addresses are not affected.
        let (_other, shed) = admitted(slots.admit(peer("10.0.0.2", 1), now));
        assert!(shed.is_none());
        assert_eq!(slots.stats().refused, [1, 0]);
        assert_eq!(slots.stats().shed, [1, 0]);
    }

    #[test]
    fn dropping_a_ticket_frees_its_slot_and_address_count() {
        let slots = Arc::new(Slots::new(limits(1, 1)));
        let now = Instant::now();
        let (t, _) = admitted(slots.admit(peer("::1", 1), now));
        drop(t);
        assert_eq!(slots.stats().open, 0);
        let (_t, shed) = admitted(slots.admit(peer("::1", 2), now));
        assert!(shed.is_none());
    }

    #[test]
    fn deadlines_follow_the_phase() {
        let slots = Arc::new(Slots::new(limits(4, 4)));
        let t0 = Instant::now();
        let (t, _) = admitted(slots.admit(peer("10.0.0.1", 1), t0));
        let id = t.id();
        assert_eq!(
            slots.deadline(id),
            Some((Phase::Handshake, t0 + Duration::from_secs(5)))
        );
        // The handshake does not restart the header deadline.
        slots.authenticated(id, t0 + Duration::from_secs(1));
        assert_eq!(
            slots.deadline(id),
            Some((Phase::AwaitingRequest, t0 + Duration::from_secs(5)))
        );
        let t1 = t0 + Duration::from_secs(2);
        let n = slots.request_started(id, t1);
        assert_eq!(
            slots.deadline(id),
            Some((Phase::Busy, t1 + Duration::from_secs(10)))
        );
        // A stale response end (of an earlier request) changes nothing.
        slots.response_done(id, n - 1, t1);
        assert_eq!(slots.deadline(id).map(|d| d.0), Some(Phase::Busy));
        slots.response_done(id, n, t1);
        assert_eq!(
            slots.deadline(id),
            Some((Phase::KeptAlive, t1 + Duration::from_secs(10)))
        );
    }

    #[test]
    fn ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(
            address_group("2001:db8:1:2:aaaa::1".parse().unwrap()),
            "2001:db8:1:2::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            address_group("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        let slots = Arc::new(Slots::new(limits(10, 1)));
        let now = Instant::now();
        let (t, _) = admitted(slots.admit(peer("2001:db8:1:2::1", 1), now));
        slots.authenticated(t.id(), now);
        slots.request_started(t.id(), now);
        assert!(matches!(
            slots.admit(peer("2001:db8:1:2::ffff", 1), now),
            Admission::Refused(Cap::PerIp)
        ));
    }

    #[test]
    fn limits_from_config_never_have_zeros() {
        let mut c = AdminConfig::default();
        let l = AdminLimits::from_config(&c);
        assert_eq!((l.max_connections, l.max_per_ip), (64, 8));
        assert_eq!(l.header_timeout, Duration::from_secs(5));
        c.max_connections = 0;
        c.max_connections_per_ip = 0;
        c.header_timeout_secs = 0;
        let l = AdminLimits::from_config(&c);
        assert_eq!((l.max_connections, l.max_per_ip), (1, 1));
        assert_eq!(l.header_timeout, Duration::from_secs(1));
    }
}
