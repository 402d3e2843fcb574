//! Failure detection: which nodes a watcher may declare dead.
//!
//! A watcher never trusts another machine's clock or a timestamp's age: it
//! remembers each node's stored heartbeat (a value it only compares) and
//! when, on its own monotonic clock, it first saw that value. A node whose
//! value has not changed for the lease plus a margin is a suspect, but only
//! if the watcher's own link to the coordinator was up the whole time: a
//! watcher whose link failed forgets everything it saw, so a coordinator
//! outage (during which no node can heartbeat) never leads to takeovers
//! when it ends. Every node must first be watched for a full lease after
//! the link comes back.
//!
//! The watch is pure: the caller passes the time and what the coordinator
//! answered, so it is tested without waiting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::coordinator::NodeInfo;

/// A node whose heartbeat stood still for longer than the lease: what a
/// takeover must find unchanged in the coordinator to go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspect {
    /// The node.
    pub node_id: String,
    /// Its incarnation when seen.
    pub incarnation: u64,
    /// Its stored heartbeat when seen ([`NodeInfo::heartbeat_stamp`]).
    pub heartbeat_stamp: i64,
    /// How long the watcher saw it unchanged.
    pub silent_for: Duration,
}

/// What a watcher last saw of one node.
#[derive(Debug, Clone, Copy)]
struct Seen {
    incarnation: u64,
    stamp: i64,
    /// When this value was first seen.
    since: Instant,
}

/// One watcher's view of the other nodes' heartbeats; see the [module
/// documentation](self).
#[derive(Debug)]
pub struct HeartbeatWatch {
    /// The watcher's own node id (never a suspect).
    me: String,
    /// How long a heartbeat must stand still: the lease plus the margin.
    silence: Duration,
    seen: HashMap<String, Seen>,
}

impl HeartbeatWatch {
    /// The margin added to the lease: covers the time between a heartbeat's
    /// commit and the moment a watcher reads it, and the difference between
    /// two machines' clock rates over one lease. At least a second, or a
    /// fifth of the lease.
    pub fn margin(lease: Duration) -> Duration {
        (lease / 5).max(Duration::from_secs(1))
    }

    /// A watcher `me` for a cluster whose lease is `lease`.
    pub fn new(me: &str, lease: Duration) -> HeartbeatWatch {
        HeartbeatWatch {
            me: me.to_owned(),
            silence: lease + Self::margin(lease),
            seen: HashMap::new(),
        }
    }

    /// How long a heartbeat must stand still, on the watcher's clock, before
    /// its node is a suspect.
    pub fn silence(&self) -> Duration {
        self.silence
    }

    /// The watcher's link to the coordinator failed: nothing seen so far
    /// counts any more.
    pub fn link_lost(&mut self) {
        self.seen.clear();
    }

    /// Takes in the live nodes as the coordinator listed them at `now`
    /// (read over a link that has been up since the last call or the last
    /// [`link_lost`](Self::link_lost)) and returns the suspects, by node id.
    /// Nodes no longer listed are forgotten.
    pub fn observe(&mut self, now: Instant, nodes: &[NodeInfo]) -> Vec<Suspect> {
        self.seen
            .retain(|id, _| nodes.iter().any(|n| &n.node_id == id));
        let mut suspects = Vec::new();
        for node in nodes.iter().filter(|n| n.node_id != self.me) {
            let fresh = Seen {
                incarnation: node.incarnation,
                stamp: node.heartbeat_stamp,
                since: now,
            };
            let seen = self.seen.entry(node.node_id.clone()).or_insert(fresh);
            if seen.incarnation != node.incarnation || seen.stamp != node.heartbeat_stamp {
                *seen = fresh;
            }
            let silent_for = now.saturating_duration_since(seen.since);
            if silent_for >= self.silence {
                suspects.push(Suspect {
                    node_id: node.node_id.clone(),
                    incarnation: seen.incarnation,
                    heartbeat_stamp: seen.stamp,
                    silent_for,
                });
            }
        }
        suspects.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        suspects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, incarnation: u64, stamp: i64) -> NodeInfo {
        NodeInfo {
            node_id: id.to_owned(),
            advertise: format!("{id}:5700"),
            incarnation,
            heartbeat_age: Duration::ZERO,
            heartbeat_stamp: stamp,
        }
    }

    const LEASE: Duration = Duration::from_secs(5);

    #[test]
    fn a_heartbeat_standing_still_for_the_lease_and_margin_makes_a_suspect() {
        let t0 = Instant::now();
        let mut watch = HeartbeatWatch::new("a", LEASE);
        assert_eq!(watch.silence(), Duration::from_secs(6));
        let nodes = [node("a", 1, 1), node("b", 1, 7), node("c", 1, 9)];
        assert!(watch.observe(t0, &nodes).is_empty());
        // c keeps beating, b does not; the watcher itself is never a suspect
        // even though its own row stands still here.
        let later = [node("a", 1, 1), node("b", 1, 7), node("c", 1, 10)];
        assert!(watch
            .observe(t0 + Duration::from_millis(5999), &later)
            .is_empty());
        let suspects = watch.observe(t0 + Duration::from_secs(6), &later);
        assert_eq!(
            suspects,
            vec![Suspect {
                node_id: "b".into(),
                incarnation: 1,
                heartbeat_stamp: 7,
                silent_for: Duration::from_secs(6),
            }]
        );
    }

    #[test]
    fn a_lost_link_forgets_everything_so_an_outage_ends_without_takeovers() {
        let t0 = Instant::now();
        let mut watch = HeartbeatWatch::new("a", LEASE);
        let nodes = [node("a", 1, 1), node("b", 1, 7)];
        watch.observe(t0, &nodes);
        // The coordinator is away for a minute: nobody can heartbeat.
        watch.link_lost();
        // Back: b's heartbeat is a minute old, but the watch starts again.
        let t1 = t0 + Duration::from_secs(60);
        assert!(watch.observe(t1, &nodes).is_empty());
        assert!(watch
            .observe(t1 + Duration::from_secs(5), &nodes)
            .is_empty());
        // b beat again meanwhile: nothing, ever.
        let beat = [node("a", 1, 1), node("b", 1, 8)];
        assert!(watch.observe(t1 + Duration::from_secs(7), &beat).is_empty());
        assert!(watch
            .observe(t1 + Duration::from_secs(12), &beat)
            .is_empty());
        assert_eq!(
            watch.observe(t1 + Duration::from_secs(13), &beat).len(),
            1,
            "six seconds after b's last change"
        );
    }

    #[test]
    fn a_new_incarnation_or_a_node_that_left_starts_afresh() {
        let t0 = Instant::now();
        let mut watch = HeartbeatWatch::new("a", LEASE);
        watch.observe(t0, &[node("b", 1, 7)]);
        // b restarted with the same stamp value (another incarnation).
        assert!(watch
            .observe(t0 + Duration::from_secs(6), &[node("b", 2, 7)])
            .is_empty());
        // b left the list (declared dead by someone else), then came back.
        watch.observe(t0 + Duration::from_secs(7), &[]);
        assert!(watch
            .observe(t0 + Duration::from_secs(12), &[node("b", 2, 7)])
            .is_empty());
    }
}
