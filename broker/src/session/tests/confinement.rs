//! The confinement invariant (docs/PROTOCOL.md, "Exchange ownership") as a
//! model test: random command sequences from three receivers (two of whose
//! CNs share a prefix, so the longest-CN rule is in play), an admin and a
//! sender, run through the session layer, with the invariant checked after
//! every step:
//!
//! - no queue a receiver owns holds an envelope naming another receiver
//!   (after each publish the admin fetches every queue and reads each
//!   delivery's `receiver_client_id`, then acks it);
//! - a `publish_for <owner>` (a quarter of the sender's publishes, naming
//!   any receiver or the admin, whatever the envelope says) stores only into
//!   queues `<owner>` owns;
//! - no receiver's command removes a binding or a queue of another owner
//!   (the topology before and after each receiver command is compared).
//!
//! Seeded and replayable: a failure names its seed and the steps that led
//! to it; `CIPHERMQ_CONFINEMENT_SEED=<n>` runs that one sequence alone, and
//! `CIPHERMQ_CONFINEMENT_RUNS=<n>` runs more sequences than the default;
//! `CIPHERMQ_CONFINEMENT_COUNT=1` runs them all and counts those that fail
//! (how thoroughly the mix finds a planted bug).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::{body, Backing, Broker, Client, RECEIVERS};

/// Sequences a default run tries.
const RUNS: u64 = 1500;

/// Commands in each sequence.
const STEPS: usize = 40;

/// Exchange names the sequences fight over: one no receiver's rule claims,
/// and one receiver_1 claims by name.
const EXCHANGES: [&str; 3] = ["shared", "ex", "receiver_1_events"];

/// Exchange types.
const KINDS: [&str; 3] = ["direct", "fanout", "topic"];

/// A small deterministic generator (splitmix64): the same seed, the same
/// sequence, on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }
}

/// Queue names: each receiver's own two, an admin's, and names another
/// receiver could try.
fn queues() -> Vec<String> {
    let mut names: Vec<String> = RECEIVERS
        .iter()
        .flat_map(|r| [format!("{r}_queue"), format!("{r}_q2")])
        .collect();
    names.push("orders".to_owned());
    names
}

/// Binding keys: each receiver's own, some patterns, and keys that belong
/// to nobody.
fn keys() -> Vec<String> {
    let mut keys: Vec<String> = RECEIVERS
        .iter()
        .flat_map(|r| {
            [
                r.to_string(),
                format!("{r}.a"),
                format!("{r}.#"),
                format!("{r}_x"),
            ]
        })
        .collect();
    keys.extend(["#", "*", "k", "receiver_1.*"].map(str::to_owned));
    keys
}

/// The receiver that owns `queue` by name (longest CN wins), if any.
fn owner_of(queue: &str) -> Option<&'static str> {
    RECEIVERS
        .iter()
        .filter(|cn| {
            queue
                .strip_prefix(**cn)
                .is_some_and(|rest| rest.starts_with('_'))
        })
        .max_by_key(|cn| cn.len())
        .copied()
}

/// One random request line for `who`. Receivers mostly name their own
/// queues and keys (what they may use, so most commands take effect and
/// the topology gets rich: exchanges of one owner with others' queues on
/// them), and sometimes anyone's (what the ACL must refuse); senders use
/// keys a publish may carry (no wildcards), for any receiver whatever the
/// key: confinement must not depend on a sender matching keys and envelopes.
fn command(rng: &mut Rng, who: &str, queues: &[String], keys: &[String], n: usize) -> String {
    let exchange = rng.pick(&EXCHANGES);
    if who.starts_with("sender_") {
        let publishable: Vec<&String> = keys.iter().filter(|k| !k.contains(['*', '#'])).collect();
        let key = publishable[rng.below(publishable.len())];
        let receiver = rng.pick(RECEIVERS);
        let body = body(&format!("m{n}"), receiver);
        // `publish_for` names an owner whose queues alone may take it:
        // another receiver, an admin, or the envelope's own.
        if rng.below(4) == 0 {
            let owner = if rng.below(5) == 0 {
                "admin"
            } else {
                rng.pick(RECEIVERS)
            };
            return format!("publish_for {owner} {exchange} {key} {body}");
        }
        return format!("publish {exchange} {key} {body}");
    }
    let own = |name: &&String| owner_of(name) == Some(who) || key_owner(name) == Some(who);
    let pick = |rng: &mut Rng, names: &[String]| -> String {
        let mine: Vec<&String> = names.iter().filter(own).collect();
        if !mine.is_empty() && rng.below(10) < 7 {
            mine[rng.below(mine.len())].clone()
        } else {
            names[rng.below(names.len())].clone()
        }
    };
    let queue = pick(rng, queues);
    let key = pick(rng, keys);
    match rng.below(10) {
        0 | 1 => format!("declare_exchange {exchange} {}", rng.pick(&KINDS)),
        2 => format!("delete_exchange {exchange}"),
        3 | 4 => format!("declare_queue {queue}"),
        5 => format!("delete_queue {queue}"),
        6..=8 => format!("bind {queue} {exchange} {key}"),
        _ => format!("unbind {queue} {exchange} {key}"),
    }
}

/// The receiver that owns routing key `key` by name (equal to the CN, or
/// the CN followed by `.` or `_`; longest CN wins), if any.
fn key_owner(key: &str) -> Option<&'static str> {
    RECEIVERS
        .iter()
        .filter(|cn| {
            key.strip_prefix(**cn)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '_']))
        })
        .max_by_key(|cn| cn.len())
        .copied()
}

/// Every binding in the topology: (exchange, key, queue).
fn bindings(broker: &Broker) -> BTreeSet<(String, String, String)> {
    let topology = broker.local.shared.topology.snapshot();
    topology
        .exchanges()
        .flat_map(|(name, ex)| {
            ex.bindings()
                .map(|(key, target)| (name.to_owned(), key.to_owned(), target.queue.to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every queue in the topology, with its recorded owner.
fn queue_owners(broker: &Broker) -> BTreeSet<(String, String)> {
    let topology = broker.local.shared.topology.snapshot();
    topology
        .queues()
        .map(|q| (q.name.to_string(), q.owner.to_string()))
        .collect()
}

/// Drains every queue as the admin: `Err` names a queue a receiver owns
/// that held another receiver's envelope, or, after `publish_for
/// <for_owner>`, a queue of another owner that took the message.
fn drain_and_check(
    broker: &Broker,
    admin: &mut Client,
    for_owner: Option<&str>,
) -> Result<(), String> {
    for (queue, recorded_owner) in queue_owners(broker) {
        let lines = admin.send(format!("fetch {queue} 1000").as_bytes());
        for line in lines.iter().filter(|l| l.starts_with("Message: ")) {
            // `Message: <id> <queue> <count> <body>`
            let mut parts = line.splitn(5, ' ');
            let (id, body) = (parts.nth(1).unwrap_or(""), parts.nth(2).unwrap_or(""));
            let envelope: serde_json::Value =
                serde_json::from_str(body).map_err(|e| format!("delivery {line}: {e}"))?;
            let receiver = envelope["receiver_client_id"].as_str().unwrap_or("");
            if let Some(owner) = owner_of(&queue) {
                if owner != receiver {
                    return Err(format!(
                        "{owner}'s queue {queue} holds {id}, an envelope for {receiver}"
                    ));
                }
            }
            if for_owner.is_some_and(|o| o != recorded_owner) {
                return Err(format!(
                    "publish_for {for_owner:?} stored {id} in {recorded_owner}'s queue {queue}"
                ));
            }
            admin.send(format!("ack {id} {queue}").as_bytes());
        }
    }
    Ok(())
}

/// Runs sequence `seed`: `Err` is the violation and the steps before it.
fn run(seed: u64) -> Result<(), String> {
    let broker = Broker::start(Backing::Memory, RECEIVERS, "");
    let (queues, keys) = (queues(), keys());
    let actors: Vec<&str> = RECEIVERS
        .iter()
        .copied()
        .chain(["admin", "sender_1"])
        .collect();
    let mut clients: Vec<Client> = actors.iter().map(|cn| broker.client(cn)).collect();
    let mut checker = broker.client("admin");
    let mut rng = Rng(seed);
    let mut history = String::new();
    for n in 0..STEPS {
        let who = rng.below(actors.len());
        let line = command(&mut rng, actors[who], &queues, &keys, n);
        let (bindings_before, queues_before) = (bindings(&broker), queue_owners(&broker));
        let replies = clients[who].send(line.as_bytes());
        let _ = writeln!(
            history,
            "  {} > {}\n    {}",
            actors[who],
            shorten(&line),
            replies.join(" | ")
        );
        let fail = |what: String| format!("seed {seed}, step {n}: {what}\n{history}");
        if actors[who].starts_with("receiver_") {
            let cn = actors[who];
            for (exchange, key, queue) in bindings_before.difference(&bindings(&broker)) {
                let owner = queues_before
                    .iter()
                    .find(|(q, _)| q == queue)
                    .map(|(_, o)| o.as_str());
                if owner != Some(cn) {
                    return Err(fail(format!(
                        "{cn} removed the binding {queue} {exchange} {key} of {owner:?}"
                    )));
                }
            }
            for (queue, owner) in queues_before.difference(&queue_owners(&broker)) {
                if owner != cn {
                    return Err(fail(format!("{cn} removed {owner}'s queue {queue}")));
                }
            }
        }
        if line.starts_with("publish ") {
            drain_and_check(&broker, &mut checker, None).map_err(fail)?;
        } else if let Some(rest) = line.strip_prefix("publish_for ") {
            let owner = rest.split(' ').next();
            drain_and_check(&broker, &mut checker, owner).map_err(fail)?;
        }
    }
    Ok(())
}

/// A request line cut short for the history.
fn shorten(line: &str) -> String {
    match line.find(" {") {
        Some(at) => {
            let receiver = line[at..]
                .split("\"receiver_client_id\":\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("?");
            format!("{} {{… for {receiver}}}", &line[..at])
        }
        None => line.to_owned(),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

#[test]
fn no_command_sequence_breaks_confinement() {
    if let Some(seed) = env_u64("CIPHERMQ_CONFINEMENT_SEED") {
        if let Err(e) = run(seed) {
            panic!("{e}");
        }
        return;
    }
    let runs = env_u64("CIPHERMQ_CONFINEMENT_RUNS").unwrap_or(RUNS);
    if std::env::var_os("CIPHERMQ_CONFINEMENT_COUNT").is_some() {
        // How many sequences a planted bug breaks, to judge the mix.
        let failing: Vec<u64> = (0..runs).filter(|&seed| run(seed).is_err()).collect();
        assert!(
            failing.is_empty(),
            "{} of {runs} sequences fail: {failing:?}",
            failing.len()
        );
        return;
    }
    for seed in 0..runs {
        if let Err(e) = run(seed) {
            panic!(
                "{e}\nreplay: CIPHERMQ_CONFINEMENT_SEED={seed} cargo test -p ciphermq-broker --lib no_command_sequence_breaks_confinement"
            );
        }
    }
}
