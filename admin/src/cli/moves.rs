//! `ciphermq-admin move` and `drain`: what a move's reply says, and which
//! owners a drain moves where, from the admin endpoint's `/api/cluster`.
//!
//! A drain moves the owners placed on one node to the other live nodes,
//! round robin in node-id order, one `move` at a time. `/api/cluster` lists
//! at most `MAX_OWNER_ROWS` owners, so a drain reads it again after each
//! pass, until it lists none of the node's owners left to try.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

/// A move the broker reports done: `OK move <owner> <node_id> <host:port>
/// <epoch>`, read so the tool can say it in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Moved {
    /// The owner moved.
    pub(crate) owner: String,
    /// The node it lives on now.
    pub(crate) node_id: String,
    /// That node's client address.
    pub(crate) address: String,
    /// Its placement's new fencing epoch.
    pub(crate) epoch: u64,
}

impl Moved {
    /// Reads a successful reply; `None` for anything else (an `Error:`
    /// line, or a reply of another shape, which is then shown as is).
    pub(crate) fn parse(reply: &str) -> Option<Moved> {
        let mut words = reply.strip_prefix("OK move ")?.split(' ');
        let moved = Moved {
            owner: words.next()?.to_owned(),
            node_id: words.next()?.to_owned(),
            address: words.next()?.to_owned(),
            epoch: words.next()?.parse().ok()?,
        };
        let whole = words.next().is_none()
            && [&moved.owner, &moved.node_id, &moved.address]
                .iter()
                .all(|w| !w.is_empty());
        whole.then_some(moved)
    }
}

impl fmt::Display for Moved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "moved {} to {} ({}), epoch {}",
            self.owner, self.node_id, self.address, self.epoch
        )
    }
}

/// What `move` prints for the broker's `OK` reply: the move in words, or
/// the reply itself when it is not of the expected shape.
pub(crate) fn moved(reply: &str) -> String {
    Moved::parse(reply).map_or_else(|| reply.to_owned(), |m| m.to_string())
}

/// Why a drain cannot start, or did not empty its node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DrainError {
    /// The broker asked is not in a cluster: there is nowhere to move to.
    #[error(
        "this broker is not a cluster node (cluster.enabled = false): there is nothing to drain"
    )]
    NotACluster,
    /// The node is not among the live nodes (a typo, or a node down: a
    /// dead node's owners cannot be moved off it).
    #[error("node {node} is not a live node of the cluster (live: {})", list(live))]
    NotLive {
        /// The node to drain.
        node: String,
        /// The live nodes.
        live: Vec<String>,
    },
    /// The node is the only live node: its owners have nowhere to go.
    #[error("node {node} is the only live node of the cluster: there is no other node to move its owners to")]
    NowhereElse {
        /// The node to drain.
        node: String,
    },
    /// Owners whose move failed (each reported as it failed) and that the
    /// last read still lists on the node, and how many more the node holds
    /// that `/api/cluster` did not list.
    #[error("node {node} still holds {}", left(owners, *unlisted))]
    Left {
        /// The node drained.
        node: String,
        /// The owners whose move failed, still on the node.
        owners: Vec<String>,
        /// Owners on the node that the capped owner list did not show.
        unlisted: usize,
    },
    /// Moves that got no `OK` (the reply was lost: the connection closed,
    /// as it does when the owner moved is the admin's own CN), although
    /// the last read no longer lists those owners on the node.
    #[error(
        "{} without an OK reply ({}), though /api/cluster no longer lists {} on node {node}; \
         `ciphermq-admin nodes --json` shows where each lives",
        moves(owners.len()),
        owners.join(", "),
        if owners.len() == 1 { "it" } else { "them" }
    )]
    Unconfirmed {
        /// The node drained.
        node: String,
        /// The owners whose move got no `OK`.
        owners: Vec<String>,
    },
}

/// `n move(s)` with the right plural.
fn moves(n: usize) -> String {
    format!("{n} move{}", if n == 1 { "" } else { "s" })
}

/// Names joined with `, `, or `none`.
fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// `n owner(s)` with the right plural.
fn owners(n: usize) -> String {
    format!("{n} owner{}", if n == 1 { "" } else { "s" })
}

/// The most owners a drain's error names one by one (each failure was
/// reported as it happened).
const NAMED_MAX: usize = 20;

/// What a drain left behind, in words.
fn left(names: &[String], unlisted: usize) -> String {
    let mut text = owners(names.len() + unlisted);
    if !names.is_empty() {
        text.push_str(&format!(
            ": {}",
            names[..names.len().min(NAMED_MAX)].join(", ")
        ));
        if names.len() > NAMED_MAX {
            text.push_str(&format!(" and {} more", names.len() - NAMED_MAX));
        }
        text.push_str(" (the move failed, see above)");
    }
    if unlisted > 0 {
        text.push_str(&format!(
            "{}{unlisted} that /api/cluster does not list (it lists a capped number); \
             run the drain again",
            if names.is_empty() { ": " } else { ", and " }
        ));
    }
    text
}

/// One owner to move, and the node it goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    /// The owner.
    pub(crate) owner: String,
    /// Its new node.
    pub(crate) to: String,
}

/// A drain under way: the node, where the round robin stands, and what was
/// tried, moved and failed. Each owner is tried once, so that a list read
/// before the answering node saw a move, or an owner whose move failed,
/// does not move an owner twice or loop.
#[derive(Debug)]
pub(crate) struct Drain {
    /// The node being drained.
    node: String,
    /// The round robin's position, kept across passes so the owners spread
    /// evenly over the other nodes.
    next: usize,
    /// Owners handed out by a pass.
    tried: BTreeSet<String>,
    /// How many moved.
    moved: usize,
    /// Owners whose move failed, in the order tried.
    failed: Vec<String>,
    /// Owners the last `/api/cluster` read listed on the node.
    listed: BTreeSet<String>,
    /// Owners on the node that the last `/api/cluster` read did not list.
    unlisted: usize,
}

/// What one `/api/cluster` read says for a drain: the nodes the owners may
/// go to (node-id order) and the owners listed on the drained node
/// (sorted).
struct Reading {
    /// The other live nodes.
    targets: Vec<String>,
    /// The owners listed on the node.
    here: Vec<String>,
}

impl Drain {
    /// A drain of `node`, nothing tried yet.
    pub(crate) fn new(node: &str) -> Drain {
        Drain {
            node: node.to_owned(),
            next: 0,
            tried: BTreeSet::new(),
            moved: 0,
            failed: Vec::new(),
            listed: BTreeSet::new(),
            unlisted: 0,
        }
    }

    /// The node being drained.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The moves of the next pass, from a fresh `/api/cluster` document:
    /// each owner it lists on the node and not tried yet, to the other live
    /// nodes in turn (node-id order). Empty when none is left to try. `Err`
    /// when the node is not live or no other node is.
    pub(crate) fn pass(&mut self, doc: &Value) -> Result<Vec<Move>, DrainError> {
        let Reading { targets, here } = self.read(doc)?;
        let mut moves = Vec::new();
        for owner in here {
            if self.tried.insert(owner.clone()) {
                let to = targets[self.next % targets.len()].clone();
                self.next = self.next.wrapping_add(1);
                moves.push(Move { owner, to });
            }
        }
        Ok(moves)
    }

    /// Takes a last `/api/cluster` read for [`Drain::outcome`] only,
    /// without planning moves: after a pass that moved none, it tells a
    /// failed move from one whose reply was lost. A read that cannot be
    /// used leaves the previous one.
    pub(crate) fn look(&mut self, doc: &Value) {
        let _ = self.read(doc);
    }

    /// Reads `doc` and keeps what it lists on the node.
    fn read(&mut self, doc: &Value) -> Result<Reading, DrainError> {
        if doc["enabled"] != Value::Bool(true) {
            return Err(DrainError::NotACluster);
        }
        let cluster = &doc["cluster"];
        let mut live: Vec<(String, usize)> = cluster["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| {
                let id = n["node_id"].as_str()?;
                let owners = n["owners"].as_u64().unwrap_or(0);
                Some((id.to_owned(), usize::try_from(owners).unwrap_or(usize::MAX)))
            })
            .collect();
        live.sort();
        live.dedup_by(|a, b| a.0 == b.0);
        let Some(&(_, placed)) = live.iter().find(|(id, _)| *id == self.node) else {
            return Err(DrainError::NotLive {
                node: self.node.clone(),
                live: live.into_iter().map(|(id, _)| id).collect(),
            });
        };
        let targets: Vec<String> = live
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| *id != self.node)
            .collect();
        if targets.is_empty() {
            return Err(DrainError::NowhereElse {
                node: self.node.clone(),
            });
        }
        let rows = cluster["owners"].as_array().map_or(&[][..], Vec::as_slice);
        let here: BTreeSet<String> = rows
            .iter()
            .filter(|row| row["node_id"].as_str() == Some(self.node.as_str()))
            .filter_map(|row| row["owner"].as_str())
            .map(str::to_owned)
            .collect();
        // Only a capped list leaves owners out; the counts come from the
        // same snapshot as the list.
        let total = cluster["owners_total"].as_u64().unwrap_or(0);
        let capped = (rows.len() as u64) < total;
        self.unlisted = if capped {
            placed.saturating_sub(here.len())
        } else {
            0
        };
        self.listed = here.clone();
        Ok(Reading {
            targets,
            here: here.into_iter().collect(),
        })
    }

    /// Records a move the broker reported done.
    pub(crate) fn moved(&mut self) {
        self.moved += 1;
    }

    /// Records a move that failed (reported when it failed).
    pub(crate) fn failed(&mut self, owner: &str) {
        self.failed.push(owner.to_owned());
    }

    /// Whether any move was tried.
    pub(crate) fn started(&self) -> bool {
        !self.tried.is_empty()
    }

    /// How many moved.
    pub(crate) fn moved_count(&self) -> usize {
        self.moved
    }

    /// The owners whose move failed.
    pub(crate) fn failures(&self) -> &[String] {
        &self.failed
    }

    /// The last line: how many moved, and how many failed.
    pub(crate) fn summary(&self) -> String {
        let mut line = format!("drained {}: {} moved", self.node, owners(self.moved));
        if !self.failed.is_empty() {
            line.push_str(&format!(", {} failed", self.failed.len()));
        }
        line
    }

    /// `Ok` when every owner the drain found moved; else what the last
    /// read still shows on the node, or the moves that got no `OK`.
    pub(crate) fn outcome(&self) -> Result<(), DrainError> {
        let left: Vec<String> = self
            .failed
            .iter()
            .filter(|owner| self.listed.contains(*owner))
            .cloned()
            .collect();
        if !left.is_empty() || self.unlisted > 0 {
            return Err(DrainError::Left {
                node: self.node.clone(),
                owners: left,
                unlisted: self.unlisted,
            });
        }
        if !self.failed.is_empty() {
            return Err(DrainError::Unconfirmed {
                node: self.node.clone(),
                owners: self.failed.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An `/api/cluster` document: `nodes` as (id, owners placed), `owners`
    /// as (owner, node), `total` owners placed in all.
    fn cluster(nodes: &[(&str, u64)], owners: &[(&str, &str)], total: usize) -> Value {
        json!({"enabled": true, "cluster": {
            "node_id": "node-a", "advertise": "127.0.0.1:5700",
            "nodes": nodes.iter().map(|(id, n)| json!({
                "node_id": id, "advertise": "127.0.0.1:5700", "heartbeat_age_ms": 100,
                "owners": n, "this_node": *id == "node-a"})).collect::<Vec<_>>(),
            "owners": owners.iter().map(|(o, n)| json!({
                "owner": o, "node_id": n, "epoch": 1})).collect::<Vec<_>>(),
            "owners_total": total,
        }})
    }

    fn mv(owner: &str, to: &str) -> Move {
        Move {
            owner: owner.to_owned(),
            to: to.to_owned(),
        }
    }

    #[test]
    fn a_successful_move_is_said_in_words() {
        let reply = "OK move receiver_1 node-b 127.0.0.1:5701 2";
        assert_eq!(
            Moved::parse(reply),
            Some(Moved {
                owner: "receiver_1".to_owned(),
                node_id: "node-b".to_owned(),
                address: "127.0.0.1:5701".to_owned(),
                epoch: 2,
            })
        );
        assert_eq!(
            moved(reply),
            "moved receiver_1 to node-b (127.0.0.1:5701), epoch 2"
        );
        assert_eq!(
            moved("OK move r node-c [::1]:5702 17"),
            "moved r to node-c ([::1]:5702), epoch 17"
        );
        // Anything else is not read as a move, and is shown as it came.
        for other in [
            "Error: cluster: owner \"receiver_1\" already lives on node \"node-b\"",
            "OK move receiver_1 node-b 127.0.0.1:5701",
            "OK move receiver_1 node-b 127.0.0.1:5701 two",
            "OK move receiver_1 node-b 127.0.0.1:5701 2 extra",
            "OK move receiver_1  127.0.0.1:5701 2",
            "OK moved receiver_1 node-b 127.0.0.1:5701 2",
            "",
        ] {
            assert_eq!(Moved::parse(other), None, "{other:?}");
        }
        assert_eq!(moved("OK move later"), "OK move later");
    }

    #[test]
    fn owners_go_round_robin_to_the_other_nodes_in_node_id_order() {
        // Nodes listed out of order; node-b is drained.
        let doc = cluster(
            &[("node-c", 1), ("node-b", 5), ("node-a", 0), ("node-d", 0)],
            &[
                ("r5", "node-b"),
                ("r1", "node-b"),
                ("other", "node-c"),
                ("r2", "node-b"),
                ("r3", "node-b"),
                ("r4", "node-b"),
            ],
            6,
        );
        let mut drain = Drain::new("node-b");
        assert_eq!(
            drain.pass(&doc).unwrap(),
            [
                mv("r1", "node-a"),
                mv("r2", "node-c"),
                mv("r3", "node-d"),
                mv("r4", "node-a"),
                mv("r5", "node-c"),
            ]
        );
        // The same list read again (the answering node not caught up yet)
        // moves nobody twice.
        assert_eq!(drain.pass(&doc).unwrap(), []);
        for _ in 0..5 {
            drain.moved();
        }
        assert_eq!(drain.summary(), "drained node-b: 5 owners moved");
        assert_eq!(drain.outcome(), Ok(()));
    }

    #[test]
    fn a_capped_list_is_read_again_and_the_round_robin_goes_on() {
        let mut drain = Drain::new("node-a");
        // 3 owners on node-a, only 2 of them listed.
        let first = cluster(
            &[("node-a", 3), ("node-b", 0), ("node-c", 0)],
            &[("r1", "node-a"), ("r2", "node-a")],
            3,
        );
        assert_eq!(
            drain.pass(&first).unwrap(),
            [mv("r1", "node-b"), mv("r2", "node-c")]
        );
        drain.moved();
        drain.moved();
        let second = cluster(
            &[("node-a", 1), ("node-b", 1), ("node-c", 1)],
            &[("r1", "node-b"), ("r3", "node-a")],
            3,
        );
        assert_eq!(drain.pass(&second).unwrap(), [mv("r3", "node-b")]);
        drain.moved();
        let done = cluster(
            &[("node-a", 0), ("node-b", 2), ("node-c", 1)],
            &[("r1", "node-b"), ("r2", "node-c"), ("r3", "node-b")],
            3,
        );
        assert_eq!(drain.pass(&done).unwrap(), []);
        assert_eq!(drain.summary(), "drained node-a: 3 owners moved");
        assert_eq!(drain.outcome(), Ok(()));
    }

    #[test]
    fn a_drain_with_no_other_live_node_or_a_dead_node_is_refused() {
        let alone = cluster(&[("node-a", 2)], &[("r1", "node-a")], 1);
        assert_eq!(
            Drain::new("node-a").pass(&alone),
            Err(DrainError::NowhereElse {
                node: "node-a".to_owned()
            })
        );
        let e = Drain::new("node-a").pass(&alone).unwrap_err().to_string();
        assert!(e.contains("node node-a is the only live node"), "{e}");

        let two = cluster(&[("node-b", 0), ("node-a", 1)], &[("r1", "node-a")], 1);
        let e = Drain::new("node-x").pass(&two).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node node-x is not a live node of the cluster (live: node-a, node-b)"
        );
        let e = Drain::new("node-a")
            .pass(&cluster(&[], &[], 0))
            .unwrap_err();
        assert!(e.to_string().ends_with("(live: none)"), "{e}");

        assert_eq!(
            Drain::new("node-a").pass(&json!({"enabled": false})),
            Err(DrainError::NotACluster)
        );
        assert_eq!(
            Drain::new("node-a").pass(&json!({})),
            Err(DrainError::NotACluster)
        );
    }

    #[test]
    fn failed_moves_are_counted_named_and_not_tried_again() {
        let doc = cluster(
            &[("node-a", 3), ("node-b", 0)],
            &[("r1", "node-a"), ("r2", "node-a"), ("r3", "node-a")],
            3,
        );
        let mut drain = Drain::new("node-a");
        assert_eq!(drain.pass(&doc).unwrap().len(), 3);
        assert!(drain.started());
        drain.moved();
        drain.failed("r2");
        drain.moved();
        assert_eq!(drain.pass(&doc).unwrap(), []);
        assert_eq!(drain.moved_count(), 2);
        assert_eq!(drain.failures(), ["r2"]);
        assert_eq!(drain.summary(), "drained node-a: 2 owners moved, 1 failed");
        let e = drain.outcome().unwrap_err();
        assert_eq!(
            e.to_string(),
            "node node-a still holds 1 owner: r2 (the move failed, see above)"
        );
        let many: Vec<String> = (0..25).map(|i| format!("r{i:02}")).collect();
        let e = DrainError::Left {
            node: "node-a".to_owned(),
            owners: many,
            unlisted: 3,
        }
        .to_string();
        assert!(
            e.starts_with("node node-a still holds 28 owners: r00, r01,")
                && e.contains(", r19 and 5 more (the move failed, see above), and 3 that")
                && !e.contains("r20"),
            "{e}"
        );

        // A move whose reply was lost, but which the next read shows done,
        // still fails the drain, saying so.
        let mut drain = Drain::new("node-a");
        let doc = cluster(&[("node-a", 1), ("node-b", 0)], &[("admin", "node-a")], 1);
        assert_eq!(drain.pass(&doc).unwrap(), [mv("admin", "node-b")]);
        drain.failed("admin");
        drain.look(&cluster(
            &[("node-a", 0), ("node-b", 1)],
            &[("admin", "node-b")],
            1,
        ));
        let e = drain.outcome().unwrap_err();
        assert_eq!(
            e,
            DrainError::Unconfirmed {
                node: "node-a".to_owned(),
                owners: vec!["admin".to_owned()]
            }
        );
        assert!(
            e.to_string().starts_with(
                "1 move without an OK reply (admin), though /api/cluster no longer lists it \
                 on node node-a;"
            ),
            "{e}"
        );
        // A useless last read changes nothing.
        drain.look(&json!({"enabled": false}));
        assert_eq!(drain.outcome().unwrap_err(), e);

        let mut one = Drain::new("node-a");
        assert!(!one.started());
        one.moved();
        assert_eq!(one.summary(), "drained node-a: 1 owner moved");
        let empty = Drain::new("node-a");
        assert_eq!(empty.summary(), "drained node-a: 0 owners moved");
    }

    #[test]
    fn owners_a_capped_list_never_shows_are_not_called_moved() {
        // node-a holds 2 owners but the list (capped: 2 of 5) shows none.
        let doc = cluster(
            &[("node-a", 2), ("node-b", 3)],
            &[("x1", "node-b"), ("x2", "node-b")],
            5,
        );
        let mut drain = Drain::new("node-a");
        assert_eq!(drain.pass(&doc).unwrap(), []);
        let e = drain.outcome().unwrap_err();
        assert_eq!(
            e,
            DrainError::Left {
                node: "node-a".to_owned(),
                owners: vec![],
                unlisted: 2
            }
        );
        assert!(
            e.to_string()
                .starts_with("node node-a still holds 2 owners: 2 that /api/cluster does not list"),
            "{e}"
        );
        // An uncapped list is complete: its count is not second-guessed.
        let whole = cluster(&[("node-a", 1), ("node-b", 0)], &[], 0);
        let mut drain = Drain::new("node-a");
        assert_eq!(drain.pass(&whole).unwrap(), []);
        assert_eq!(drain.outcome(), Ok(()));
    }
}
