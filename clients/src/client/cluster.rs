//! A client of a cluster: several brokers serving as one, each owner (a
//! receiver with its queues) on one node. [`ClusterClient`] starts from seed
//! addresses, keeps one [`Client`] per node it needs, remembers which node
//! holds which owner (a higher epoch wins), and follows at most
//! [`MAX_REDIRECTS`] redirects (`NACK <id> moved …`) per publish, sending
//! the same message id again: the broker deduplicates, so a redirect never
//! stores a message twice.
//!
//! ```no_run
//! # async fn example(config: ciphermq_clients::ClientConfig) -> Result<(), Box<dyn std::error::Error>> {
//! use ciphermq_clients::client::cluster::ClusterClient;
//!
//! let seeds = vec!["10.0.0.1:5700".to_owned(), "10.0.0.2:5700".to_owned()];
//! let cluster = ClusterClient::connect(config, seeds).await?;
//! // Stored on whichever node holds receiver_1, wherever the seeds point.
//! cluster.publish_to("receiver_1", "ex", "receiver_1", b"hello").await?;
//! // A receiver consumes on its own node.
//! let home = cluster.home_of("receiver_1").await?;
//! home.declare_queue("receiver_1_queue").await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

use ciphermq_proto::{Redirect, Reply};

use super::error::{ConnectError, PublishError, RequestError};
use super::publisher::{Ack, PreparedPublish, Publisher};
use super::{reply, Client, ClientConfig};
use crate::crypto;

/// Redirects one publish (or lookup) follows at most before it fails.
pub const MAX_REDIRECTS: u32 = 3;

/// Where an owner lives, as last heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    /// The node's id.
    pub node_id: String,
    /// Its client address.
    pub address: String,
    /// The placement's epoch.
    pub epoch: u64,
}

/// Connections to the nodes of a cluster; see the [module documentation](self).
pub struct ClusterClient {
    config: ClientConfig,
    seeds: Vec<String>,
    /// Connections by node address.
    nodes: Mutex<HashMap<String, Client>>,
    /// Owner → where it lives, as last heard.
    homes: Mutex<HashMap<String, Home>>,
    /// The address of the first node that answered.
    seed: String,
    redirects: AtomicU64,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("seeds", &self.seeds)
            .field("seed", &self.seed)
            .field("redirects", &self.redirects.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl ClusterClient {
    /// Connects to the first of `seeds` that answers (each tried once, in
    /// order), with `config`'s settings for every node. Fails with the last
    /// seed's error when none answers, or [`ConnectError::Config`]-like
    /// errors at once.
    pub async fn connect(
        config: ClientConfig,
        seeds: Vec<String>,
    ) -> Result<ClusterClient, ConnectError> {
        let mut last = None;
        for seed in &seeds {
            match Client::connect(config.for_address(seed.clone())).await {
                Ok(client) => {
                    let nodes = HashMap::from([(seed.clone(), client)]);
                    return Ok(ClusterClient {
                        config,
                        seed: seed.clone(),
                        seeds,
                        nodes: Mutex::new(nodes),
                        homes: Mutex::new(HashMap::new()),
                        redirects: AtomicU64::new(0),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(ConnectError::NoSeeds))
    }

    /// The connection to the first seed that answered.
    pub async fn seed(&self) -> Result<Client, ConnectError> {
        self.node(&self.seed).await
    }

    /// The connection to the node at `address`, opened if needed (or again,
    /// if it was lost).
    pub async fn node(&self, address: &str) -> Result<Client, ConnectError> {
        let open = self
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(address)
            .filter(|c| !c.is_closed())
            .cloned();
        if let Some(client) = open {
            return Ok(client);
        }
        let client = Client::connect(self.config.for_address(address)).await?;
        self.nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(address.to_owned(), client.clone());
        Ok(client)
    }

    /// Where `owner` lives, as last heard (no request).
    pub fn cached_home(&self, owner: &str) -> Option<Home> {
        self.homes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(owner)
            .cloned()
    }

    /// Records a redirect: kept unless a higher epoch is already known for
    /// its owner. True when it changed what is known.
    pub fn learn(&self, redirect: &Redirect<'_>) -> bool {
        let mut homes = self.homes.lock().unwrap_or_else(PoisonError::into_inner);
        if homes
            .get(redirect.owner)
            .is_some_and(|h| h.epoch > redirect.epoch)
        {
            return false;
        }
        let home = Home {
            node_id: redirect.node_id.to_owned(),
            address: redirect.address.to_owned(),
            epoch: redirect.epoch,
        };
        homes.insert(redirect.owner.to_owned(), home.clone()) != Some(home)
    }

    /// Asks a node where `owner` lives (`locate`, which places it on that
    /// node if no node holds it yet) and remembers the answer.
    pub async fn locate(&self, owner: &str) -> Result<Home, RequestError> {
        let client = self.seed().await.map_err(RequestError::from_connect)?;
        let home = client.locate(owner).await?;
        let redirect = Redirect {
            owner,
            node_id: &home.node_id,
            address: &home.address,
            epoch: home.epoch,
        };
        self.learn(&redirect);
        Ok(self.cached_home(owner).unwrap_or(home))
    }

    /// The connection to the node holding `owner` (located first when not
    /// known): where a receiver declares, binds and consumes.
    pub async fn home_of(&self, owner: &str) -> Result<Client, RequestError> {
        let home = match self.cached_home(owner) {
            Some(home) => home,
            None => self.locate(owner).await?,
        };
        self.node(&home.address)
            .await
            .map_err(RequestError::from_connect)
    }

    /// Encrypts `plaintext` for `receiver` (its key pinned on first use, as
    /// [`Publisher::publish_to`]) under a new message id, and publishes it
    /// on the node holding `receiver`.
    pub async fn publish_to(
        &self,
        receiver: &str,
        exchange: &str,
        routing_key: &str,
        plaintext: &[u8],
    ) -> Result<Ack, PublishError> {
        let seed = self.seed().await.map_err(RequestError::from_connect)?;
        let message_id = seed.next_message_id(receiver);
        let key = seed.receiver_key(receiver).await?;
        let mut envelope = crypto::encrypt(&key, &message_id, receiver, plaintext)?;
        envelope.sender_client_id = Some(seed.client_id().to_owned());
        let prepared = Publisher::prepare(exchange, routing_key, &envelope)?;
        self.publish_prepared(receiver, &prepared).await
    }

    /// Publishes a prepared message for `owner` (its envelope's receiver):
    /// on the node last heard to hold it (else the seed), following at most
    /// [`MAX_REDIRECTS`] redirects with the same message id.
    pub async fn publish_prepared(
        &self,
        owner: &str,
        prepared: &PreparedPublish,
    ) -> Result<Ack, PublishError> {
        let mut address = self
            .cached_home(owner)
            .map_or_else(|| self.seed.clone(), |h| h.address);
        let mut hops = 0;
        loop {
            let client = self
                .node(&address)
                .await
                .map_err(RequestError::from_connect)?;
            match client.publisher().publish_prepared(prepared).await {
                Err(PublishError::Moved(moved)) if hops < MAX_REDIRECTS => {
                    hops += 1;
                    self.redirects.fetch_add(1, Relaxed);
                    let redirect = Redirect {
                        owner: &moved.owner,
                        node_id: &moved.node_id,
                        address: &moved.address,
                        epoch: moved.epoch,
                    };
                    self.learn(&redirect);
                    // A lower epoch than one already known is not followed.
                    address = self
                        .cached_home(&moved.owner)
                        .map_or_else(|| moved.address.clone(), |h| h.address);
                }
                other => return other,
            }
        }
    }

    /// Redirects followed so far.
    pub fn redirects(&self) -> u64 {
        self.redirects.load(Relaxed)
    }
}

impl Client {
    /// `locate <owner>`: where a cluster places `owner` (on this node, if no
    /// node holds it yet). A broker on its own answers with an error
    /// ([`RequestError::Broker`], `this broker is not a cluster node …`).
    pub async fn locate(&self, owner: &str) -> Result<Home, RequestError> {
        reply::check_name("client id", owner)?;
        let line = self.request(&format!("locate {owner}")).await?;
        let home = match Reply::parse(&line) {
            Reply::Ok(rest) => rest.strip_prefix("locate ").and_then(|r| {
                let moved = format!("moved {r}");
                Redirect::parse(&moved).map(|r| Home {
                    node_id: r.node_id.to_owned(),
                    address: r.address.to_owned(),
                    epoch: r.epoch,
                })
            }),
            _ => None,
        };
        home.ok_or_else(|| reply::refusal(line))
    }
}
