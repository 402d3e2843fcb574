//! How many TLS handshakes a shard runs at once, in all and per client IP,
//! decided when a connection is accepted, before any byte of TLS: a flood of
//! connections that never finish their handshake (or finish it slowly, up to
//! `performance.handshake_timeout_secs`) holds a bounded number of sockets,
//! tasks and TLS states, and leaves room for everyone else.
//!
//! Each shard keeps its own counts (no lock between shards): the configured
//! caps are split evenly by the shard count, rounded up. The kernel spreads
//! accepted connections over the shards' listeners, so the caps hold for
//! the broker as a whole up to that rounding.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;

/// Why a connection was turned away before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The shard's share of `performance.max_handshakes` is in use.
    Total,
    /// The shard's share of `performance.max_handshakes_per_ip` is in use by
    /// this address.
    PerIp,
}

/// One shard's handshakes in progress.
#[derive(Debug)]
pub(crate) struct HandshakeGate {
    total_cap: u32,
    per_ip_cap: u32,
    counts: Rc<RefCell<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    per_ip: HashMap<IpAddr, u32>,
}

/// A handshake's place at the gate, given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    ip: IpAddr,
    counts: Rc<RefCell<Counts>>,
}

impl HandshakeGate {
    /// A shard's share of `total` and `per_ip` with `shards` shards.
    pub(crate) fn new(total: u32, per_ip: u32, shards: usize) -> HandshakeGate {
        let shards = u32::try_from(shards.max(1)).unwrap_or(u32::MAX);
        HandshakeGate {
            total_cap: total.div_ceil(shards).max(1),
            per_ip_cap: per_ip.div_ceil(shards).max(1),
            counts: Rc::default(),
        }
    }

    /// Admits one more handshake from `ip`, or says which cap is reached.
    pub(crate) fn admit(&self, ip: IpAddr) -> Result<Admitted, Refusal> {
        let mut counts = self.counts.borrow_mut();
        if counts.total >= self.total_cap {
            return Err(Refusal::Total);
        }
        let from_ip = counts.per_ip.entry(ip).or_default();
        if *from_ip >= self.per_ip_cap {
            return Err(Refusal::PerIp);
        }
        *from_ip += 1;
        counts.total += 1;
        Ok(Admitted {
            ip,
            counts: self.counts.clone(),
        })
    }

    /// Handshakes in progress on this shard.
    #[cfg(test)]
    pub(crate) fn in_progress(&self) -> u32 {
        self.counts.borrow().total
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.counts.borrow_mut();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_in_all_and_per_ip_and_places_come_back() {
        let gate = HandshakeGate::new(3, 2, 1);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = gate.admit(a).unwrap();
        let _a2 = gate.admit(a).unwrap();
        assert_eq!(gate.admit(a).unwrap_err(), Refusal::PerIp);
        let _b1 = gate.admit(b).unwrap();
        assert_eq!(gate.admit(b).unwrap_err(), Refusal::Total);
        drop(a1);
        assert_eq!(gate.in_progress(), 2);
        assert!(gate.admit(a).is_ok(), "a place came back");
    }

    #[test]
    fn each_shard_admits_its_share_rounded_up() {
        let gate = HandshakeGate::new(5, 3, 2);
        let ip: IpAddr = "::1".parse().unwrap();
        let held: Vec<_> = (0..2).map(|_| gate.admit(ip).unwrap()).collect();
        assert_eq!(gate.admit(ip).unwrap_err(), Refusal::PerIp);
        assert_eq!(held.len(), 2);
    }
}
