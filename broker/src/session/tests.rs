//! The command layer without sockets: the ACL (docs/ARCHITECTURE.md,
//! "Identity and access") and the error replies of docs/PROTOCOL.md, one
//! exact reply line per row.
//!
//! Each case runs on a fresh shard built the way start-up builds one (the
//! real config, policy, topology store and key store, [`Storage::open`],
//! [`server::shared_state`]); a [`Session`] per client CN executes request
//! lines and each row reads back what its reply queue renders. The
//! socket-level suites (`tests/acl_matrix.rs`, `protocol_errors.rs`, …)
//! stay the outside contract; these tables pin every reply text down, in
//! milliseconds and without TLS.
//!
//! This file is the harness ([`Broker`], [`Client`], [`Case`], [`Table`])
//! and the shared worlds; the tables are in `matrix` (the permission
//! matrix), `ownership` (own resources, exchange owners, sender ids),
//! `limits` (quotas, rate limits, key and fetch bounds), `protocol` (error
//! replies) and `state` (greeting, quit, close, reload).

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;

use base64::Engine;
use ciphermq_shard::{Mailbox, Mesh, MeshEndpoint, MeshInbound, Shard};

use super::Session;
use crate::config::Config;
use crate::conn::connection::Identity;
use crate::runtime::context::ShardLocal;
use crate::runtime::server;
use crate::storage::Storage;

mod confinement;
mod limits;
mod matrix;
mod ownership;
mod protocol;
mod seeded;
mod state;

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// The receiver CNs of the socket suites' PKI.
const RECEIVERS: &[&str] = &["receiver_1", "receiver_2", "receiver_1_2"];

/// Where the broker under test keeps its topology and public keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Backing {
    /// `storage.mode = "memory"`, as the socket suites run: every change is
    /// answered at once.
    Memory,
    /// A data directory: topology changes are answered by the saver thread
    /// once `topology.json` is written, keys once sealed to their files, so
    /// those replies come back as pending ones that must be awaited. (The
    /// shard keeps its queues in memory: queue logs are not under test.)
    DataDir,
}

/// One shard of a broker, with the services every shard shares (also the
/// stall watch's test shard).
pub(crate) struct Broker {
    /// The shard state sessions run against.
    pub(crate) local: Rc<ShardLocal>,
    /// The shard's end of the mesh, kept open for whatever it sends itself.
    _inbound: MeshInbound,
    /// The data directory (and base of the config's relative paths); last,
    /// so it outlives everything that writes there.
    _data: tempfile::TempDir,
}

/// The config of a test broker: the socket suites' roles, `receivers` as
/// the receiver CNs, `extra` appended (more `[acl]` keys, or whole
/// sections). The TLS files are never read: sessions see no TLS.
fn config_text(backing: Backing, receivers: &[&str], extra: &str) -> String {
    let mode = match backing {
        Backing::Memory => "memory",
        Backing::DataDir => "durable",
    };
    let receivers: Vec<String> = receivers.iter().map(|r| format!("\"{r}\"")).collect();
    format!(
        r#"
[server]
address = "127.0.0.1:0"
shards = 1

[tls]
cert_path = "certs/server.crt"
key_path = "certs/server.key"
ca_cert_path = "certs/ca.crt"

[logging]
console = false
json_files = false

[storage]
data_dir = "data"
mode = "{mode}"

[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1", "sender_2", "sender_3", "sender_4"]
receiver_cns = [{receivers}]
{extra}
"#,
        receivers = receivers.join(", "),
    )
}

/// A server TLS configuration that can serve nothing: [`crate::runtime::context::Shared`]
/// holds one, and sessions never use it.
fn unused_tls() -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::server::ResolvesServerCertUsingSni::new()));
    Arc::new(config)
}

impl Broker {
    /// A one-shard broker of `config_text(backing, receivers, extra)`.
    pub(crate) fn start(backing: Backing, receivers: &[&str], extra: &str) -> Broker {
        let data = tempfile::tempdir().expect("tempdir");
        let text = config_text(backing, receivers, extra);
        let config = Config::parse_unchecked(&text, data.path()).expect("test config");
        let storage = Storage::open(&config, 1).expect("storage opens");
        let tls = crate::tls::material::TlsMaterial::from_server_config(unused_tls());
        let shared = server::shared_state(&config, 1, &storage, tls);
        let queue_settings = server::queue_settings(&config, &storage, 1);
        let MeshEndpoint { outbound, inbound } = Mesh::build(1).pop().expect("one endpoint");
        let shard = Shard::new(queue_settings, shared.topology.clone(), outbound, None);
        let stats = shared.stats.shard(0).clone();
        Broker {
            local: Rc::new(ShardLocal::new(shard, shared, stats)),
            _inbound: inbound,
            _data: data,
        }
    }

    /// A session of `cn`, with the role the current ACL gives that CN.
    fn client(&self, cn: &str) -> Client {
        let policy = self.local.shared.policy.current();
        let identity = Identity {
            cn: Arc::from(cn),
            role: policy.acl.role_of(cn),
            peer: ([127, 0, 0, 1], 40_000).into(),
            policy,
            cert: None,
            closures_seen: self.local.shared.policy.closures.version(),
        };
        let (session, mailbox) = Session::new(self.local.clone(), identity);
        Client {
            session,
            mailbox,
            awaited: 0,
        }
    }
}

/// One client's session, with the mailbox its connection would drain.
struct Client {
    /// The session under test.
    session: Session,
    /// Where the shard reports completions and push deliveries.
    mailbox: Rc<Mailbox>,
    /// Replies it had to await (decided off the shard), to show that a
    /// table over a data directory exercised that path.
    awaited: usize,
}

impl Client {
    /// Executes one request line (without its newline) and returns every
    /// line then owed: its reply, and push deliveries that followed it.
    fn send(&mut self, line: &[u8]) -> Vec<String> {
        self.session.execute(line);
        self.settle();
        self.take_lines()
    }

    /// Applies what the shard reported and waits for the replies decided
    /// off the shard, as the connection does before it executes the next
    /// command.
    fn settle(&mut self) {
        let mut events = VecDeque::new();
        loop {
            self.mailbox.drain_into(&mut events);
            for event in events.drain(..) {
                self.session.apply(event);
            }
            if self.session.pending_replies.is_empty() {
                break;
            }
            self.awaited += self.session.pending_replies.len();
            let session = &mut self.session;
            futures_lite::future::block_on(std::future::poll_fn(|cx| {
                if session.poll_pending_replies(cx) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }));
        }
        // One shard: nothing can still wait on another.
        assert_eq!(self.session.replies.waiting(), 0, "a reply still waits");
    }

    /// Renders every owed line, as the connection would write them.
    fn take_lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        self.session.replies.render(&mut out, usize::MAX);
        assert!(self.session.replies.is_empty(), "a reply was not rendered");
        let text = String::from_utf8(out).expect("replies are UTF-8");
        text.split_terminator('\n').map(str::to_owned).collect()
    }
}

impl Drop for Client {
    /// Ends the session as a closing connection does.
    fn drop(&mut self) {
        self.session.close();
    }
}

/// One row: as `who`, send `line`, and read back exactly `replies`.
struct Step {
    /// The client CN that sends it.
    who: &'static str,
    /// The request line, without its newline (bytes: some are not UTF-8).
    line: Vec<u8>,
    /// Every line owed right after it, exactly.
    replies: Vec<String>,
}

/// A scenario on a fresh broker: its rows in order, each client keeping
/// its session from row to row.
struct Case {
    /// What it shows, for failure messages.
    name: &'static str,
    /// Its rows, in order.
    steps: Vec<Step>,
}

/// An empty case named `name`; rows are added with [`Case::row`] and kin.
fn case(name: &'static str) -> Case {
    Case {
        name,
        steps: Vec::new(),
    }
}

impl Case {
    /// A row whose reply is the one line `reply`.
    fn row(self, who: &'static str, line: impl AsRef<[u8]>, reply: impl Into<String>) -> Case {
        self.rows(who, line, [reply.into()])
    }

    /// A row with several reply lines (a batch, a fetch, a consume and its
    /// deliveries), or none (an empty line).
    fn rows<S: Into<String>>(
        mut self,
        who: &'static str,
        line: impl AsRef<[u8]>,
        replies: impl IntoIterator<Item = S>,
    ) -> Case {
        self.steps.push(Step {
            who,
            line: line.as_ref().to_vec(),
            replies: replies.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// A row expecting `Access denied: <reason> (role=<role of who>)`.
    fn denied(self, who: &'static str, line: impl AsRef<[u8]>, reason: &str) -> Case {
        let role = match who {
            "admin" => "admin",
            w if w.starts_with("sender_") => "sender",
            w if w.starts_with("receiver_") => "receiver",
            _ => "unknown",
        };
        self.row(who, line, format!("Access denied: {reason} (role={role})"))
    }
}

/// A broker configuration, the rows that set up its world, and the cases
/// that run on it (each on a fresh broker).
struct Table {
    /// How topology and keys are kept.
    backing: Backing,
    /// `acl.receiver_cns`.
    receivers: &'static [&'static str],
    /// Appended to the config (see [`config_text`]).
    extra: String,
    /// Rows run before each case, on the same broker.
    world: Vec<Step>,
}

impl Table {
    /// The socket suites' CNs, memory storage, no world.
    fn new() -> Table {
        Table {
            backing: Backing::Memory,
            receivers: RECEIVERS,
            extra: String::new(),
            world: Vec::new(),
        }
    }

    /// Another storage backing.
    fn backing(mut self, backing: Backing) -> Table {
        self.backing = backing;
        self
    }

    /// Other receiver CNs.
    fn receivers(mut self, receivers: &'static [&'static str]) -> Table {
        self.receivers = receivers;
        self
    }

    /// More config (see [`config_text`]).
    fn extra(mut self, extra: &str) -> Table {
        self.extra = extra.to_owned();
        self
    }

    /// The rows that set up each case's broker.
    fn world(mut self, world: Case) -> Table {
        self.world = world.steps;
        self
    }

    /// Runs every case; returns the number of rows checked.
    fn run(&self, cases: Vec<Case>) -> usize {
        let (mut rows, mut awaited) = (0, 0);
        for case in cases {
            let broker = Broker::start(self.backing, self.receivers, &self.extra);
            let mut clients: HashMap<&str, Client> = HashMap::new();
            let world = self.world.iter().map(|s| ("world", s));
            for (name, step) in world.chain(case.steps.iter().map(|s| (case.name, s))) {
                let client = clients
                    .entry(step.who)
                    .or_insert_with(|| broker.client(step.who));
                let got = client.send(&step.line);
                assert_eq!(
                    got,
                    step.replies,
                    "{:?} / {name}: {} sent {:?}",
                    self.backing,
                    step.who,
                    shorten(&String::from_utf8_lossy(&step.line)),
                );
            }
            rows += case.steps.len();
            awaited += clients.values().map(|c| c.awaited).sum::<usize>();
        }
        if matches!(self.backing, Backing::DataDir) {
            assert!(awaited > 0, "no reply was decided off the shard");
        }
        rows
    }
}

/// At most 120 characters of `s`, for assertion messages.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((end, _)) => format!("{}… ({} bytes)", &s[..end], s.len()),
        None => s.to_owned(),
    }
}

/// A valid `EncryptedInputData` body.
fn body(id: &str, receiver: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}}"#
    )
}

/// `body(id, receiver)` naming its sender (`sender_client_id`).
fn signed(id: &str, receiver: &str, sender: &str) -> String {
    let plain = body(id, receiver);
    let open = plain.strip_suffix('}').expect("a JSON object");
    format!(r#"{open},"sender_client_id":"{sender}"}}"#)
}

/// A valid body of exactly `len` bytes (padding the ciphertext).
fn body_of_len(id: &str, len: usize) -> String {
    let head = format!(
        r#"{{"message_id":"{id}","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":""#
    );
    let tail = r#""}"#;
    let pad = len - head.len() - tail.len();
    format!("{head}{}{tail}", "A".repeat(pad))
}

/// `publish <exchange> <key> body(id, receiver_1)`: only receiver_1's queues
/// and queues no receiver owns take it.
fn publish(exchange: &str, key: &str, id: &str) -> String {
    publish_for(exchange, key, "receiver_1", id)
}

/// `publish <exchange> <key> body(id, receiver)`: an envelope sealed for
/// `receiver`, which a queue of another receiver never stores.
fn publish_for(exchange: &str, key: &str, receiver: &str, id: &str) -> String {
    format!("publish {exchange} {key} {}", body(id, receiver))
}

/// The delivery line of `body` as the `count`-th delivery from `queue`.
fn delivery(queue: &str, count: u32, body: &str) -> String {
    let id = ciphermq_proto::message::inspect_message(body)
        .expect("a body with an id")
        .message_id
        .to_string();
    format!("Message: {id} {queue} {count} {body}")
}

/// A 32-byte key filled with `byte`, in standard padded base64.
fn key(byte: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([byte; 32])
}

/// `Error: quota exceeded: …` of `receiver_1` at `limit` `what`.
fn quota(what: &str, limit: usize, key: &str) -> String {
    format!(
        "Error: quota exceeded: receiver_1 already has {limit} {what}, the most one client may \
         have (performance.{key})"
    )
}

const DENY_SENDER_DECLARE_QUEUE: &str = "senders may not declare queues";
const DENY_SENDER_DECLARE_EXCHANGE: &str = "senders may not declare exchanges";
const DENY_SENDER_BIND: &str = "senders may not bind queues";
const DENY_SENDER_CONSUME: &str = "senders may not consume";
const DENY_SENDER_FETCH: &str = "senders may not fetch";
const DENY_SENDER_NACK: &str = "senders may not nack";
const DENY_SENDER_REGISTER: &str = "senders may not register public keys";
const DENY_RECEIVER_GET_KEY: &str = "receivers may not get public keys";
const DENY_OWN_QUEUES: &str = "receivers may only use their own queues";
const DENY_OWN_KEYS: &str = "receivers may only bind routing keys they own";
const DENY_OWN_PATTERNS: &str =
    "receivers may only bind patterns that match only routing keys they own";
const DENY_FANOUT: &str = "receivers may only bind queues to fanout exchanges they own";
const DENY_EXCHANGE_NAME: &str = "receivers may not declare exchanges named for another receiver";

/// The socket suite's `world()`: direct exchange `ex` and each receiver's
/// `{cn}_queue`, bound with its owner's CN as key, all by the admin.
fn acl_world() -> Case {
    let mut world = case("world").row(
        "admin",
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    );
    for cn in RECEIVERS {
        world = world
            .row(
                "admin",
                format!("declare_queue {cn}_queue"),
                format!("OK declare_queue {cn}_queue"),
            )
            .row(
                "admin",
                format!("bind {cn}_queue ex {cn}"),
                format!("OK bind {cn}_queue ex {cn}"),
            );
    }
    world
}

/// `ex` routes key `receiver_1` to `receiver_1_queue` (the protocol suite's
/// `routed()`).
fn routed_world() -> Case {
    case("world")
        .row(
            "admin",
            "declare_exchange ex direct",
            "OK declare_exchange ex",
        )
        .row(
            "admin",
            "declare_queue receiver_1_queue",
            "OK declare_queue receiver_1_queue",
        )
        .row(
            "admin",
            "bind receiver_1_queue ex receiver_1",
            "OK bind receiver_1_queue ex receiver_1",
        )
}
