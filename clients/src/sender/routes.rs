//! Where each receiver's copies go: the sender keeps one connection per node
//! holding some of its receivers, learns each receiver's node with `locate`
//! at the start and from `NACK <id> moved …` later (a move while it runs),
//! and ignores a redirect older than what it already knows (a lower epoch).
//! A broker on its own answers `locate` with an error: everything then goes
//! through the one connection.

use std::fmt;

use crate::backoff::Backoff;
use crate::client::error::Moved;
use crate::client::{Client, ClientConfig, Publisher};
use crate::reconnect::{dial_client, DialedClient};
use crate::shutdown::Shutdown;

use super::SenderError;

/// One node: its address and, while connected, the connection.
struct Node {
    address: String,
    /// The connection and a publisher on it; `None` until connected.
    link: Option<(Client, Publisher)>,
}

impl Node {
    /// The publisher, when the connection is open.
    fn publisher(&self) -> Option<&Publisher> {
        self.link
            .as_ref()
            .filter(|(client, _)| !client.is_closed())
            .map(|(_, publisher)| publisher)
    }
}

/// The nodes of a run and which receiver lives on which; indexed by target
/// (the receiver's place in the encryption stage's list), so a message's
/// route is two vector reads.
pub(super) struct Routes {
    /// Settings of every connection; only the address differs.
    config: ClientConfig,
    /// The first connection, which locates the receivers at the start.
    seed: Client,
    /// Every node heard of; the first is the seed that answered.
    nodes: Vec<Node>,
    /// Target → index into `nodes`.
    route: Vec<usize>,
    /// Target → the epoch of its placement as last heard (0: not a cluster,
    /// or not located).
    epochs: Vec<u64>,
}

/// A node a message must go to is not connected: the pump stops and the
/// run connects it.
#[derive(Debug)]
pub(super) struct Unconnected {
    /// The node's address.
    pub address: String,
}

impl fmt::Display for Unconnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not connected to {}", self.address)
    }
}

impl Routes {
    /// Every one of `receivers` goes through `seed` (connected with `config`)
    /// until located.
    pub(super) fn new(seed: Client, config: ClientConfig, receivers: usize) -> Routes {
        let publisher = seed.publisher();
        Routes {
            nodes: vec![Node {
                address: config.address().to_owned(),
                link: Some((seed.clone(), publisher)),
            }],
            seed,
            config,
            route: vec![0; receivers],
            epochs: vec![0; receivers],
        }
    }

    /// The connection to the seed, open or not.
    pub(super) fn seed(&self) -> &Client {
        &self.seed
    }

    /// Asks the seed where each receiver lives (`locate`, which places one no
    /// node holds yet on the seed). The first refusal (a broker on its own,
    /// or a cluster that cannot answer now) leaves the rest on the seed: a
    /// publish there is redirected if it must be.
    pub(super) async fn locate(&mut self, receivers: &[&str]) {
        for (target, receiver) in receivers.iter().enumerate() {
            let home = match self.seed().locate(receiver).await {
                Ok(home) => home,
                Err(error) => {
                    if target > 0 {
                        tracing::warn!(%receiver, %error, "cannot locate this receiver; publishing through the seed");
                    }
                    return;
                }
            };
            let node = self.node_index(&home.address);
            if node != 0 {
                tracing::info!(%receiver, node_id = %home.node_id, address = %home.address, epoch = home.epoch,
                    "this receiver lives on another node of the cluster");
            }
            self.route[target] = node;
            self.epochs[target] = home.epoch;
        }
    }

    /// The publisher for `target`'s copies, or the node to connect first.
    pub(super) fn publisher(&self, target: usize) -> Result<&Publisher, Unconnected> {
        let node = &self.nodes[self.route[target]];
        node.publisher().ok_or_else(|| Unconnected {
            address: node.address.clone(),
        })
    }

    /// Follows a redirect for `target`, unless an equal or higher epoch
    /// already pointed elsewhere (a stale answer from a node that lost the
    /// owner long ago).
    pub(super) fn learn(&mut self, target: usize, moved: &Moved) {
        if moved.epoch < self.epochs[target] {
            return;
        }
        let node = self.node_index(&moved.address);
        if node != self.route[target] {
            tracing::info!(receiver = %moved.owner, node_id = %moved.node_id, address = %moved.address,
                epoch = moved.epoch, "this receiver moved; publishing to its new node");
        }
        self.route[target] = node;
        self.epochs[target] = moved.epoch;
    }

    /// Connects every node some receiver lives on and that has no open
    /// connection, retrying transient failures with `backoff` up to
    /// `attempts` in a row. `Ok(false)` when the shutdown signal fired first.
    pub(super) async fn connect(
        &mut self,
        sender_id: &str,
        backoff: Backoff,
        attempts: u32,
        shutdown: &mut Shutdown<'_>,
    ) -> Result<bool, SenderError> {
        for index in 0..self.nodes.len() {
            let node = &self.nodes[index];
            if node.publisher().is_some() || !self.route.contains(&index) {
                continue;
            }
            let config = self.config.for_address(node.address.clone());
            let client = match dial_client(&config, backoff, attempts, shutdown).await? {
                DialedClient::Connected(client) => client,
                DialedClient::Stopped => return Ok(false),
            };
            if client.client_id() != sender_id {
                return Err(SenderError::Protocol(format!(
                    "connected to {} as {} instead of {sender_id}",
                    self.nodes[index].address,
                    client.client_id()
                )));
            }
            let publisher = client.publisher();
            self.nodes[index].link = Some((client, publisher));
        }
        Ok(true)
    }

    /// Every open connection (to close them at the end).
    pub(super) fn clients(&self) -> impl Iterator<Item = &Client> {
        self.nodes
            .iter()
            .filter_map(|n| n.link.as_ref().map(|(client, _)| client))
    }

    /// The index of the node at `address`, added (unconnected) if new.
    fn node_index(&mut self, address: &str) -> usize {
        match self.nodes.iter().position(|n| n.address == address) {
            Some(index) => index,
            None => {
                self.nodes.push(Node {
                    address: address.to_owned(),
                    link: None,
                });
                self.nodes.len() - 1
            }
        }
    }
}
