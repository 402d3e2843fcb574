//! Where a receiver's stream (its setup, publishers and consumers) connects.
//!
//! In a cluster each receiver lives on one node, and a publish or a
//! `consume` on another node is answered `moved …`: the bench would measure
//! refusals. So before a CipherMQ run the seeds of `--addr` are asked, in
//! order, `locate <receiver>`; the first that answers names the node (placing
//! the receiver on itself if no node holds it yet), and a broker that is no
//! cluster node is used as it is. The decision is [`choose`] and [`place`],
//! free of any connection, so it is tested without a broker.

use std::fmt;
use std::future::Future;

use ciphermq_clients::client::cluster::Home;
use ciphermq_clients::RequestError;
use serde::Serialize;

/// The start of a broker's refusal of `locate` when it is no cluster node
/// (`Error: this broker is not a cluster node (cluster.enabled = false)`).
const NOT_A_CLUSTER_NODE: &str = "this broker is not a cluster node";
/// A broker built before clusters existed refuses the command itself; it
/// too serves every receiver (paired runs against old builds meet it).
const LOCATE_UNKNOWN: &str = "unknown command locate";

/// What one seed said to `locate <receiver>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `OK locate …`: the node holding the receiver.
    Located(Home),
    /// The broker is no cluster node: it serves every receiver itself.
    Alone,
    /// Nothing that places the receiver: the seed could not be reached,
    /// refused, or answered something else. Why, for the error naming every
    /// seed tried.
    Failed(String),
}

impl Answer {
    /// Sorts the result of [`Client::locate`](ciphermq_clients::Client::locate).
    pub fn of(result: Result<Home, RequestError>) -> Answer {
        match result {
            Ok(home) => Answer::Located(home),
            Err(RequestError::Broker(text))
                if text.starts_with(NOT_A_CLUSTER_NODE) || text == LOCATE_UNKNOWN =>
            {
                Answer::Alone
            }
            Err(e) => Answer::Failed(format!("locate: {e}")),
        }
    }
}

/// Where one receiver's stream goes, as recorded with a CipherMQ run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stream {
    /// The receiver CN.
    pub receiver: String,
    /// The address its setup, publishers and consumers connect to.
    pub address: String,
    /// The node holding it; none on a broker that is no cluster node.
    pub node_id: Option<String>,
    /// The placement's epoch; none on a broker that is no cluster node.
    pub epoch: Option<u64>,
    /// The seed that answered `locate`.
    pub seed: String,
}

impl fmt::Display for Stream {
    /// `receiver_1 → node-2 at 10.0.0.2:5700 (epoch 3, located by 10.0.0.1:5700)`,
    /// or `receiver_1 → 127.0.0.1:5700 (not a cluster node)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.node_id, self.epoch) {
            (Some(node), Some(epoch)) => write!(
                f,
                "{} → node {node} at {} (epoch {epoch}, located by {})",
                self.receiver, self.address, self.seed
            ),
            _ => write!(
                f,
                "{} → {} (not a cluster node)",
                self.receiver, self.address
            ),
        }
    }
}

/// The stream of `receiver` given `seed`'s answer, or why that seed is of
/// no use (the next one is asked then).
pub fn choose(receiver: &str, seed: &str, answer: Answer) -> Result<Stream, String> {
    match answer {
        Answer::Located(home) => Ok(Stream {
            receiver: receiver.to_owned(),
            address: home.address,
            node_id: Some(home.node_id),
            epoch: Some(home.epoch),
            seed: seed.to_owned(),
        }),
        Answer::Alone => Ok(Stream {
            receiver: receiver.to_owned(),
            address: seed.to_owned(),
            node_id: None,
            epoch: None,
            seed: seed.to_owned(),
        }),
        Answer::Failed(why) => Err(why),
    }
}

/// No seed answered `locate <receiver>`: each seed tried, with why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSeedAnswered {
    /// The receiver asked about.
    pub receiver: String,
    /// `(seed, why)`, in the order tried.
    pub tried: Vec<(String, String)>,
}

impl fmt::Display for NoSeedAnswered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no CipherMQ seed answered `locate {}` (tried {})",
            self.receiver,
            self.tried.len()
        )?;
        for (seed, why) in &self.tried {
            write!(f, "; {seed}: {why}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NoSeedAnswered {}

/// Asks `seeds` in order (through `ask`, which connects and sends
/// `locate <receiver>`) until one answers; later seeds are not asked, so a
/// receiver no node holds yet is placed on the first seed that is up.
pub async fn place<F, Fut>(
    receiver: &str,
    seeds: &[String],
    mut ask: F,
) -> Result<Stream, NoSeedAnswered>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Answer>,
{
    let mut tried = Vec::with_capacity(seeds.len());
    for seed in seeds {
        match choose(receiver, seed, ask(seed.clone()).await) {
            Ok(stream) => return Ok(stream),
            Err(why) => tried.push((seed.clone(), why)),
        }
    }
    Err(NoSeedAnswered {
        receiver: receiver.to_owned(),
        tried,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home(node: &str, address: &str, epoch: u64) -> Home {
        Home {
            node_id: node.to_owned(),
            address: address.to_owned(),
            epoch,
        }
    }

    fn seeds(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Answers from a table, recording which seeds were asked.
    async fn place_with(
        list: &[&str],
        answers: &[(&str, Answer)],
    ) -> (Result<Stream, NoSeedAnswered>, Vec<String>) {
        let mut asked = Vec::new();
        let result = place("receiver_1", &seeds(list), |seed| {
            asked.push(seed.clone());
            let answer = answers
                .iter()
                .find(|(s, _)| *s == seed)
                .map_or(Answer::Failed("no answer in the table".into()), |(_, a)| {
                    a.clone()
                });
            async move { answer }
        })
        .await;
        (result, asked)
    }

    #[test]
    fn locate_results_are_sorted() {
        let h = home("node-2", "127.0.0.1:5701", 3);
        assert_eq!(Answer::of(Ok(h.clone())), Answer::Located(h));
        let alone = RequestError::Broker(
            "this broker is not a cluster node (cluster.enabled = false)".into(),
        );
        assert_eq!(Answer::of(Err(alone)), Answer::Alone);
        // Any other refusal is a seed of no use, with the broker's words.
        let fenced = RequestError::Broker("cluster: node n1 was registered again".into());
        assert!(matches!(
            Answer::of(Err(fenced)),
            Answer::Failed(why) if why.contains("registered again")
        ));
        let denied = RequestError::Denied("not allowed (role=sender)".into());
        assert!(matches!(Answer::of(Err(denied)), Answer::Failed(why) if why.contains("denied")));
        // A broker from before clusters: alone too.
        let unknown = RequestError::Broker("unknown command locate".into());
        assert_eq!(Answer::of(Err(unknown)), Answer::Alone);
        let other = RequestError::Broker("unknown command locate_all".into());
        assert!(matches!(Answer::of(Err(other)), Answer::Failed(_)));
    }

    #[test]
    fn a_located_receiver_goes_to_its_node_a_lone_broker_to_the_seed() {
        let located = choose(
            "receiver_1",
            "127.0.0.1:5700",
            Answer::Located(home("node-2", "127.0.0.1:5701", 3)),
        )
        .unwrap();
        assert_eq!(located.address, "127.0.0.1:5701");
        assert_eq!(located.node_id.as_deref(), Some("node-2"));
        assert_eq!(located.epoch, Some(3));
        assert_eq!(located.seed, "127.0.0.1:5700");
        assert_eq!(
            located.to_string(),
            "receiver_1 → node node-2 at 127.0.0.1:5701 (epoch 3, located by 127.0.0.1:5700)"
        );

        let alone = choose("receiver_1", "127.0.0.1:5700", Answer::Alone).unwrap();
        assert_eq!(alone.address, "127.0.0.1:5700");
        assert_eq!((alone.node_id.as_deref(), alone.epoch), (None, None));
        assert_eq!(
            alone.to_string(),
            "receiver_1 → 127.0.0.1:5700 (not a cluster node)"
        );

        assert_eq!(
            choose("receiver_1", "a:1", Answer::Failed("refused".into())),
            Err("refused".to_owned())
        );
    }

    #[tokio::test]
    async fn the_first_seed_that_answers_decides_and_later_ones_are_not_asked() {
        let (stream, asked) = place_with(
            &["a:1", "b:2", "c:3"],
            &[
                (
                    "a:1",
                    Answer::Failed("connecting: connection refused".into()),
                ),
                ("b:2", Answer::Located(home("node-3", "c:3", 7))),
                ("c:3", Answer::Located(home("node-1", "a:1", 1))),
            ],
        )
        .await;
        let stream = stream.unwrap();
        assert_eq!(
            (stream.address.as_str(), stream.seed.as_str()),
            ("c:3", "b:2")
        );
        assert_eq!(asked, ["a:1", "b:2"]);

        // A single address that is a broker on its own: used as today.
        let (stream, asked) =
            place_with(&["127.0.0.1:5700"], &[("127.0.0.1:5700", Answer::Alone)]).await;
        assert_eq!(stream.unwrap().address, "127.0.0.1:5700");
        assert_eq!(asked, ["127.0.0.1:5700"]);
    }

    #[tokio::test]
    async fn no_seed_answering_names_every_seed_and_why() {
        let (result, asked) = place_with(
            &["a:1", "b:2"],
            &[
                (
                    "a:1",
                    Answer::Failed("connecting: connection refused".into()),
                ),
                ("b:2", Answer::Failed("locate: access denied: no".into())),
            ],
        )
        .await;
        let err = result.unwrap_err();
        assert_eq!(asked, ["a:1", "b:2"]);
        assert_eq!(
            err.to_string(),
            "no CipherMQ seed answered `locate receiver_1` (tried 2); \
             a:1: connecting: connection refused; b:2: locate: access denied: no"
        );
        let (result, _) = place_with(&[], &[]).await;
        assert!(result.unwrap_err().tried.is_empty());
    }
}
