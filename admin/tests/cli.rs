//! `ciphermq-admin` against a real broker over mutual TLS: the reading
//! subcommands print tables and `--json`, the changing ones carry the
//! broker's reply and exit non-zero on a refusal, `reload` re-reads the
//! config file through `POST /api/reload`, and a monitor certificate reads
//! but changes nothing. `--config` finds a broker from its own config file,
//! and a refused connection says how to turn the admin endpoint on. Several
//! addresses are tried in order, and a command is sent to one only.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ciphermq_admin::remote::{Addresses, AdminEndpoint, BrokerPort, Credentials};
use ciphermq_broker::{BrokerHandle, Config};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_testkit::{pki, BrokerConfig, RunningBroker};

/// A broker started from a config file, with its certificates.
struct World {
    // First: the broker stops before its directory is removed.
    broker: RunningBroker,
    _dir: tempfile::TempDir,
    certs: PathBuf,
    config: PathBuf,
}

/// The config text; `receivers` are the receiver CNs.
fn config_text(certs: &Path, data: &Path, receivers: &[&str]) -> String {
    BrokerConfig::new(certs, data)
        .admins(&["admin"])
        .senders(&["sender_1"])
        .receivers(receivers)
        .monitors(&["monitor_1"])
        .extra("\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"")
        .text()
}

impl World {
    fn start() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = pki::generate(
            dir.path(),
            &["admin", "monitor_1", "sender_1", "receiver_1", "receiver_2"],
        )
        .out_dir;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(&config, config_text(&certs, &data, &["receiver_1"])).unwrap();
        World {
            broker: RunningBroker::start_file(&config),
            _dir: dir,
            certs,
            config,
        }
    }

    fn broker(&self) -> &BrokerHandle {
        self.broker.handle()
    }

    /// Runs `ciphermq-admin` as `cn` with `args`.
    fn admin(&self, cn: &str, args: &[&str]) -> Output {
        self.admin_command(cn, args)
            .output()
            .expect("run ciphermq-admin")
    }

    /// `ciphermq-admin` as `cn` with `args`, to be run.
    fn admin_command(&self, cn: &str, args: &[&str]) -> Command {
        let broker = self.broker();
        self.admin_via(
            &broker.admin_addr().unwrap().to_string(),
            &broker.local_addr().to_string(),
            cn,
            args,
        )
    }

    /// `ciphermq-admin` as `cn` with `args`, given `--endpoint endpoint` and
    /// `--broker broker`, to be run.
    fn admin_via(&self, endpoint: &str, broker: &str, cn: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ciphermq-admin"));
        command
            .arg("--endpoint")
            .arg(endpoint)
            .arg("--broker")
            .arg(broker)
            .arg("--server-name")
            .arg("localhost")
            .arg("--ca")
            .arg(self.certs.join("ca.crt"))
            .arg("--cert")
            .arg(self.certs.join(format!("{cn}.crt")))
            .arg("--key")
            .arg(self.certs.join(format!("{cn}.key")))
            .args(args);
        command
    }

    /// One `ciphermq/1` command as `cn`, its reply.
    async fn command(&self, cn: &str, line: &str) -> Result<String, String> {
        let credentials = Credentials::from_files(
            &self.certs.join("ca.crt"),
            &self.certs.join(format!("{cn}.crt")),
            &self.certs.join(format!("{cn}.key")),
        )
        .unwrap();
        BrokerPort::new(
            &self.broker().local_addr().to_string(),
            "localhost",
            credentials,
        )
        .unwrap()
        .command(line)
        .await
        .map_err(|e| e.to_string())
    }
}

/// Stdout of a run that must succeed.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Stderr of a run that must fail.
fn failed(out: Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_and_changes_a_running_broker() {
    let world = World::start();
    for line in [
        "declare_exchange ex direct",
        "declare_queue receiver_1_queue",
        "bind receiver_1_queue ex receiver_1",
    ] {
        let reply = world.command("receiver_1", line).await.unwrap();
        assert!(reply.starts_with("OK "), "{line}: {reply}");
    }
    let body = r#"{"message_id":"m1","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}"#;
    let reply = world
        .command("sender_1", &format!("publish ex receiver_1 {body}"))
        .await
        .unwrap();
    assert_eq!(reply, "ACK m1");

    // Queue counts are the shards' snapshots, refreshed about once a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let json: serde_json::Value =
            serde_json::from_str(&ok(world.admin("monitor_1", &["queues", "--json"]))).unwrap();
        assert_eq!(json["queues"][0]["name"], "receiver_1_queue");
        if json["queues"][0]["ready"] == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never ready: {json}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let status = ok(world.admin("admin", &["status"]));
    assert!(status.contains("health ok (ready)"), "{status}");
    assert!(status.contains("messages: 1 published"), "{status}");
    assert!(status.contains("mirror: off"), "{status}");

    let queues = ok(world.admin("admin", &["queues"]));
    let header = queues.lines().next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("READY"),
        "{queues}"
    );
    let row = queues
        .lines()
        .find(|l| l.starts_with("receiver_1_queue"))
        .unwrap_or_else(|| panic!("{queues}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    // name, owner, shard, ready, unacked, consumers
    assert_eq!(cells[..2], ["receiver_1_queue", "receiver_1"], "{row}");
    assert_eq!(cells[3..6], ["1", "0", "0"], "{row}");

    let exchanges = ok(world.admin("admin", &["exchanges"]));
    assert!(
        exchanges
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["ex", "direct", "1"]),
        "{exchanges}"
    );
    assert!(ok(world.admin("admin", &["connections"])).contains("open"));

    // Changes, through the broker port.
    let unbind = ok(world.admin("admin", &["unbind", "receiver_1_queue", "ex", "receiver_1"]));
    assert_eq!(unbind.trim(), "OK unbind receiver_1_queue ex receiver_1");
    assert!(ok(world.admin("admin", &["exchanges"])).contains("no bindings"));
    let closed = ok(world.admin("admin", &["close", "sender_1", "--json"]));
    let closed: serde_json::Value = serde_json::from_str(&closed).unwrap();
    assert_eq!(closed["reply"], "OK close_connection sender_1 0");
    let purge = ok(world.admin("admin", &["purge", "receiver_1_queue"]));
    assert_eq!(purge.trim(), "OK purge_queue receiver_1_queue 1");
    let deleted = ok(world.admin("admin", &["delete", "queue", "receiver_1_queue"]));
    assert_eq!(deleted.trim(), "OK delete_queue receiver_1_queue");
    let refused = failed(world.admin("admin", &["delete", "queue", "receiver_1_queue"]));
    assert!(
        refused.contains("Error: unknown queue receiver_1_queue"),
        "{refused}"
    );
    // Gone from the list once the shards' snapshots are refreshed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ok(world.admin("admin", &["queues"])).contains("receiver_1_queue") {
        assert!(
            std::time::Instant::now() < deadline,
            "still in the queue list"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deleted = ok(world.admin("admin", &["delete", "exchange", "ex"]));
    assert_eq!(deleted.trim(), "OK delete_exchange ex");

    // A monitor reads, and changes nothing.
    assert!(ok(world.admin("monitor_1", &["status"])).contains("health ok"));
    let denied = failed(world.admin("monitor_1", &["close", "sender_1"]));
    assert!(denied.contains("Access denied"), "{denied}");
    let denied = failed(world.admin("monitor_1", &["reload"]));
    assert!(
        denied.contains("403") && denied.contains("admins only"),
        "{denied}"
    );
    // Nobody else reads.
    let denied = failed(world.admin("sender_1", &["status"]));
    assert!(
        denied.contains("403") && denied.contains("acl.admin_cns"),
        "{denied}"
    );
}

/// `move` and `drain` on a broker that is not a cluster node: the broker's
/// refusal (or the endpoint's `enabled: false`) is printed and the exit
/// status is non-zero; nothing is moved. A monitor may not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_and_drain_outside_a_cluster_say_why_and_fail() {
    let world = World::start();
    let refused = failed(world.admin("admin", &["move", "receiver_1", "node-b"]));
    assert!(
        refused.contains("Error: this broker is not a cluster node (cluster.enabled = false)"),
        "{refused}"
    );
    let json = world.admin("admin", &["move", "receiver_1", "node-b", "--json"]);
    assert!(!json.status.success());
    let reply: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(reply["command"], "move receiver_1 node-b");
    assert_eq!(reply["ok"], false);
    let denied = failed(world.admin("monitor_1", &["move", "receiver_1", "node-b"]));
    assert!(denied.contains("Access denied"), "{denied}");

    let out = world.admin("admin", &["drain", "node-a"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not a cluster node") && stderr.contains("nothing to drain"),
        "{stderr}"
    );
    // Refused before any move: no summary.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_rereads_the_config_file_and_a_bad_file_changes_nothing() {
    let world = World::start();
    let refused = world.command("receiver_2", "heartbeat").await.unwrap_err();
    assert!(refused.contains("unknown client"), "{refused}");

    let text = std::fs::read_to_string(&world.config).unwrap();
    let widened = text.replace(
        r#"receiver_cns = ["receiver_1"]"#,
        r#"receiver_cns = ["receiver_1", "receiver_2"]"#,
    );
    assert_ne!(text, widened);
    std::fs::write(&world.config, &widened).unwrap();
    assert_eq!(ok(world.admin("admin", &["reload"])).trim(), "reloaded");
    let reply = world.command("receiver_2", "heartbeat").await.unwrap();
    assert_eq!(reply, "OK heartbeat");

    std::fs::write(&world.config, widened.replace("[acl]", "[acl\n")).unwrap();
    let refused = failed(world.admin("admin", &["reload"]));
    assert!(
        refused.contains("config.toml") && refused.contains("keeping the running ACL"),
        "{refused}"
    );
    // The reloaded policy is still in force.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        world.command("receiver_2", "heartbeat").await.unwrap(),
        "OK heartbeat"
    );

    // A key that is not the certificate's is named.
    let mismatched = Command::new(env!("CARGO_BIN_EXE_ciphermq-admin"))
        .arg("--cert")
        .arg(world.certs.join("admin.crt"))
        .arg("--key")
        .arg(world.certs.join("sender_1.key"))
        .arg("--ca")
        .arg(world.certs.join("ca.crt"))
        .arg("status")
        .output()
        .unwrap();
    let message = failed(mismatched);
    assert!(
        message.contains("admin.crt") && message.contains("sender_1.key"),
        "{message}"
    );
}

/// Every argument that goes into a protocol line is checked first: one that
/// would end its command and start another (`purge $'x\ndelete_queue q'`)
/// is refused by name, exit status 2, before anything is sent, so the
/// command hidden after the newline never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_that_would_add_a_command_is_refused_and_nothing_is_sent() {
    let world = World::start();
    for line in [
        "declare_exchange ex direct",
        "declare_queue receiver_1_queue",
        "bind receiver_1_queue ex receiver_1",
    ] {
        let reply = world.command("receiver_1", line).await.unwrap();
        assert!(reply.starts_with("OK "), "{line}: {reply}");
    }
    let hidden = "\ndelete_queue receiver_1_queue";
    let cases: [(Vec<String>, &str); 9] = [
        (vec!["purge".into(), format!("x{hidden}")], "invalid queue"),
        (
            vec!["delete".into(), "queue".into(), format!("x{hidden}")],
            "invalid queue",
        ),
        (
            vec!["delete".into(), "exchange".into(), format!("x{hidden}")],
            "invalid exchange",
        ),
        (
            vec![
                "unbind".into(),
                "receiver_1_queue".into(),
                "ex".into(),
                format!("receiver_1{hidden}"),
            ],
            "invalid binding key",
        ),
        (
            vec![
                "unbind".into(),
                "receiver_1_queue".into(),
                "ex receiver_1_queue".into(),
                "receiver_1".into(),
            ],
            "invalid exchange",
        ),
        (
            vec!["close".into(), "sender_1 admin".into()],
            "invalid client id",
        ),
        (
            vec![
                "move".into(),
                format!("receiver_1{hidden}"),
                "node-b".into(),
            ],
            "invalid owner",
        ),
        (
            vec![
                "move".into(),
                "receiver_1".into(),
                format!("node-b{hidden}"),
            ],
            "invalid node id",
        ),
        (
            vec!["drain".into(), format!("node-a{hidden}")],
            "invalid node id",
        ),
    ];
    for (args, named) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = world.admin("admin", &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named) && stderr.contains("nothing was sent"),
            "{args:?}: {stderr}"
        );
        // The argument is quoted with escapes, never echoed raw.
        assert!(!stderr.contains("\ndelete_queue"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // The queue named after the newline is still there, and so is its
    // binding; its messages were never purged.
    let reply = world
        .command("admin", "purge_queue receiver_1_queue")
        .await
        .unwrap();
    assert_eq!(reply, "OK purge_queue receiver_1_queue 0");
    let exchanges = ok(world.admin("admin", &["exchanges"]));
    assert!(
        exchanges.lines().any(|l| l.split_whitespace().eq([
            "ex",
            "receiver_1_queue",
            "receiver_1"
        ])),
        "{exchanges}"
    );
    // The library refuses a line break too, without connecting.
    let refused = world
        .command("admin", "purge_queue x\ndelete_queue receiver_1_queue")
        .await
        .unwrap_err();
    assert!(refused.contains("line break"), "{refused}");
}

/// `ciphermq-admin queues --json | grep -q …`: a reader that stops reading
/// early is not a failure (no panic on the closed pipe, exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_early_is_no_failure() {
    let world = World::start();
    for args in [&["queues", "--json"][..], &["status"], &["exchanges"]] {
        let mut child = world
            .admin_command("admin", args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run ciphermq-admin");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A loopback address nothing listens on: a port the OS just gave out, its
/// listener closed again.
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    drop(listener);
    address
}

/// A loopback address that accepts connections and closes them at once,
/// so a TLS handshake there fails. The thread accepting them lives until
/// the test process ends.
fn hang_up_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    address
}

/// A loopback listener that never accepts, to tell whether anything
/// connected to it: a connection the kernel completed waits to be accepted.
struct Witness(std::net::TcpListener);

impl Witness {
    fn new() -> Witness {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        Witness(listener)
    }

    fn address(&self) -> String {
        self.0.local_addr().expect("address").to_string()
    }

    /// Whether a connection came since it was made.
    fn connected(&self) -> bool {
        match self.0.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// `--endpoint` and `--broker` given several addresses (a cluster's
/// seeds): each request goes to the first that can be reached, past one
/// where nothing listens and one whose TLS handshake fails; a command that
/// reached a broker is never sent to the next address, even when it was
/// refused there; and when none can be reached, the error names each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_addresses_are_tried_in_order_and_a_command_is_sent_once() {
    let world = World::start();
    let endpoint = world.broker().admin_addr().unwrap().to_string();
    let port = world.broker().local_addr().to_string();
    let dead = dead_address();
    let hangs_up = hang_up_address();

    let status = ok(world
        .admin_via(
            &format!("{dead},{hangs_up}, {endpoint}"),
            &dead,
            "admin",
            &["status"],
        )
        .output()
        .unwrap());
    assert!(status.contains("health ok (ready)"), "{status}");
    // The dashboard keeps reading the address that answered at its start.
    let credentials = Credentials::from_files(
        &world.certs.join("ca.crt"),
        &world.certs.join("admin.crt"),
        &world.certs.join("admin.key"),
    )
    .unwrap();
    let seeds = Addresses::parse(&format!("{dead},{hangs_up},{endpoint}")).unwrap();
    let reached = AdminEndpoint::any_of(&seeds, Some("localhost"), credentials)
        .unwrap()
        .reachable("/health")
        .await
        .unwrap();
    assert_eq!(reached.address(), endpoint);

    let reply = world
        .command("receiver_1", "declare_queue receiver_1_queue")
        .await
        .unwrap();
    assert_eq!(reply, "OK declare_queue receiver_1_queue", "{reply}");
    let witness = Witness::new();
    let purged = ok(world
        .admin_via(
            &dead,
            &format!("{dead},{hangs_up},{port},{}", witness.address()),
            "admin",
            &["purge", "receiver_1_queue"],
        )
        .output()
        .unwrap());
    assert_eq!(purged.trim(), "OK purge_queue receiver_1_queue 0");
    assert!(!witness.connected(), "the purge went on past the broker");

    // Refused by the broker: final, the next address is not asked.
    let refused = failed(
        world
            .admin_via(
                &dead,
                &format!("{port},{}", witness.address()),
                "admin",
                &["delete", "queue", "no_such_queue"],
            )
            .output()
            .unwrap(),
    );
    assert!(
        refused.contains("Error: unknown queue no_such_queue"),
        "{refused}"
    );
    assert!(!witness.connected(), "a refused command was sent again");

    // Nothing reachable: each address and why, in the order tried; no hint
    // about a broker not running, since something answered at one.
    let unreached = failed(
        world
            .admin_via(&format!("{dead},{hangs_up}"), &port, "admin", &["status"])
            .output()
            .unwrap(),
    );
    assert!(
        unreached.contains("admin endpoint: none of the 2 addresses could be reached:")
            && unreached.contains(&format!("\n  admin endpoint {dead}: cannot connect"))
            && unreached.contains(&format!(
                "\n  admin endpoint {hangs_up}: TLS handshake failed"
            )),
        "{unreached}"
    );
    assert!(!unreached.contains("hint:"), "{unreached}");
    // Nothing listening anywhere: the hint of a refused connection.
    let dead_too = dead_address();
    let refused = failed(
        world
            .admin_via(
                &endpoint,
                &format!("{dead},{dead_too}"),
                "admin",
                &["close", "sender_1"],
            )
            .output()
            .unwrap(),
    );
    assert!(
        refused.contains(&format!("broker {dead}: cannot connect"))
            && refused.contains(&format!("broker {dead_too}: cannot connect"))
            && refused.contains("is the broker running?"),
        "{refused}"
    );
}

/// `ciphermq-admin` with `args`, run from `cwd`, no other flag.
fn admin_in(cwd: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ciphermq-admin"));
    command
        .current_dir(cwd)
        .env_remove("CIPHERMQ_ADMIN_CONFIG")
        .args(args);
    command
}

/// The issue a new user hit: against a broker run from the shipped config
/// (admin endpoint off), the tool said only "Connection refused".
#[test]
fn a_refused_endpoint_says_how_to_turn_the_admin_endpoint_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = pki::generate(dir.path(), &["admin"]).out_dir;
    let dead = dead_address();
    let mut command = admin_in(dir.path(), &["status"]);
    command
        .arg("--endpoint")
        .arg(&dead)
        .arg("--ca")
        .arg(certs.join("ca.crt"))
        .arg("--cert")
        .arg(certs.join("admin.crt"))
        .arg("--key")
        .arg(certs.join("admin.key"));
    let refused = failed(command.output().unwrap());
    assert!(
        refused.contains(&format!("admin endpoint {dead}: cannot connect"))
            && refused.contains("Connection refused"),
        "{refused}"
    );
    assert!(
        refused.contains("admin endpoint is off by default")
            && refused.contains("`[admin] enabled = true`")
            && refused.contains("restart the broker")
            && refused.contains("--endpoint"),
        "{refused}"
    );

    // A config file saying the endpoint is off: the hint says so, naming it.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\naddress = \"{dead}\"\n\n[admin]\nenabled = false\naddress = \"{dead}\"\n"
        ),
    )
    .unwrap();
    let refused = failed(
        admin_in(dir.path(), &["status", "--config"])
            .arg(&config)
            .output()
            .unwrap(),
    );
    assert!(
        refused.contains(&format!(
            "{} has `[admin] enabled = false`",
            config.display()
        )) && refused.contains("restart the broker"),
        "{refused}"
    );
    // The broker port, refused too, gets its own hint.
    let refused = failed(
        admin_in(dir.path(), &["close", "sender_1", "--config"])
            .arg(&config)
            .output()
            .unwrap(),
    );
    assert!(
        refused.contains(&format!("broker {dead}: cannot connect"))
            && refused.contains("is the broker running?"),
        "{refused}"
    );
}

/// `--config` with the broker's own file: relative paths as the broker
/// reads them, whatever the working directory. A file with port 0 cannot
/// say where the broker listens, so the test starts the broker from one,
/// learns the ports it took, and writes them into the file, as an operator
/// who moved the broker to other ports would have them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brokers_config_file_is_all_the_tool_needs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    pki::generate(dir.path(), &["admin", "sender_1"]);
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let text = |server: &str, admin: &str| {
        format!(
            r#"
[server]
address = "{server}"
shards = 2

[tls]
cert_path = "certs/server.crt"
key_path = "certs/server.key"
ca_cert_path = "certs/ca.crt"

[logging]
console = false

[storage]
data_dir = "data"
mode = "memory"
min_free_mb = 16

[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1"]

[admin]
enabled = true
address = "{admin}"
"#
        )
    };
    let config = dir.path().join("config.toml");
    std::fs::write(&config, text("127.0.0.1:0", "127.0.0.1:0")).unwrap();
    let mut broker = RunningBroker::start(&Config::load(&config).expect("config"));
    let endpoint = broker.admin_addr().expect("admin endpoint").to_string();
    let port = broker.addr.clone();

    // Port 0 names no port: said, with the flag that does.
    let zero = failed(
        admin_in(elsewhere.path(), &["status", "--config"])
            .arg(&config)
            .output()
            .unwrap(),
    );
    assert!(
        zero.contains(&format!("--config {}", config.display()))
            && zero.contains("admin.address = \"127.0.0.1:0\"")
            && zero.contains("--endpoint"),
        "{zero}"
    );
    // The flags win over the file; its CA and certificate paths still serve.
    let status = ok(admin_in(elsewhere.path(), &["status", "--config"])
        .arg(&config)
        .args(["--endpoint", &endpoint])
        .output()
        .unwrap());
    assert!(status.contains("health ok (ready)"), "{status}");

    // With the ports written in, the file alone reaches both sides.
    std::fs::write(&config, text(&port, &endpoint)).unwrap();
    let status = ok(admin_in(elsewhere.path(), &["status", "--config"])
        .arg(&config)
        .output()
        .unwrap());
    assert!(status.contains("health ok (ready)"), "{status}");
    let closed = ok(
        admin_in(elsewhere.path(), &["close", "sender_1", "--config"])
            .arg(&config)
            .output()
            .unwrap(),
    );
    assert_eq!(closed.trim(), "OK close_connection sender_1 0");
    // From the environment too.
    let status = ok(admin_in(elsewhere.path(), &["status"])
        .env("CIPHERMQ_ADMIN_CONFIG", &config)
        .output()
        .unwrap());
    assert!(status.contains("health ok (ready)"), "{status}");
    // An explicit --endpoint beats the file: nothing listens there, and the
    // hint is not about the file.
    let dead = dead_address();
    let refused = failed(
        admin_in(elsewhere.path(), &["status", "--config"])
            .arg(&config)
            .args(["--endpoint", &dead])
            .output()
            .unwrap(),
    );
    assert!(
        refused.contains(&format!("admin endpoint {dead}: cannot connect"))
            && refused.contains("off by default"),
        "{refused}"
    );

    // A connection open, then none: the counts agree, the text says which.
    let connections = |args: &[&str]| {
        ok(admin_in(elsewhere.path(), args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap())
    };
    let tls = TlsClientOptions::for_cn(&dir.path().join("certs"), "sender_1");
    let held = Connection::connect(&port, &tls).await.expect("connect");
    let doc: serde_json::Value =
        serde_json::from_str(&connections(&["connections", "--json"])).unwrap();
    let c = &doc["connections"];
    assert_eq!(c["total"], 1, "{c}");
    assert_eq!(c["by_cn"]["sender_1"], 1, "{c}");
    let by_shard: Vec<u64> = c["by_shard"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(by_shard.len(), 2, "{c}");
    assert_eq!(by_shard.iter().sum::<u64>(), 1, "{c}");
    let text = connections(&["connections"]);
    assert!(text.starts_with("1 client connection open\n"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().eq(["sender_1", "1"])),
        "{text}"
    );
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = connections(&["connections"]);
        if text == "no client connections open\n" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still open: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.stop();
}
