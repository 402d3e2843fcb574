//! The configuration's unit tests: loading, every section's checks, legacy
//! keys, error texts and positions, and the repository's example config.

use std::path::{Path, PathBuf};

use super::*;

const B64_32: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse_unchecked(text, Path::new("/etc/ciphermq"))
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("expected an error for {text:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn empty_file_gives_defaults_with_resolved_paths() {
    let c = parse("").unwrap();
    let mut want = Config::default();
    want.tls.cert_path = PathBuf::from("/etc/ciphermq/certs/server.crt");
    want.tls.key_path = PathBuf::from("/etc/ciphermq/certs/server.key");
    want.tls.ca_cert_path = PathBuf::from("/etc/ciphermq/certs/ca.crt");
    want.logging.dir = PathBuf::from("/etc/ciphermq/logs");
    want.storage.data_dir = PathBuf::from("/etc/ciphermq/data");
    assert_eq!(c, want);
}

#[test]
fn default_values() {
    let c = Config::default();
    assert_eq!(c.server.address, "127.0.0.1:5700");
    assert_eq!(c.server.shards, 0);
    assert_eq!(c.server.name, "ciphermq");
    assert_eq!(c.server.shutdown_timeout_secs, 30);
    assert_eq!(c.tls.cert_path, PathBuf::from("certs/server.crt"));
    assert_eq!(c.logging.level, "info");
    assert_eq!(c.logging.rotation, LogRotation::Daily);
    assert_eq!(c.logging.console, Console::Auto);
    assert!(!c.logging.json_files);
    assert_eq!(c.logging.max_log_files, 14);
    assert_eq!(c.database.backend, DatabaseBackend::Embedded);
    assert_eq!(c.database.port, 5432);
    assert_eq!(c.database.batch_size, 1000);
    assert_eq!(c.database.flush_interval_ms, 50);
    assert_eq!(c.encryption.algorithm, "x25519_chacha20_poly1305");
    assert_eq!(c.encryption.aes_key, None);
    assert_eq!(c.performance.max_queue_size, 1_000_000);
    assert_eq!(c.performance.max_message_bytes, 1_048_576);
    assert_eq!(c.performance.max_line_bytes, 1_048_576 + 4096);
    assert_eq!(c.performance.handshake_timeout_secs, 10);
    assert_eq!(c.performance.idle_timeout_sec, 300);
    assert_eq!(c.performance.heartbeat_timeout, 60);
    assert_eq!(c.performance.dedup_window_secs, 120);
    assert_eq!(c.performance.ack_wait_secs, 300);
    assert_eq!(c.performance.max_deliveries, 10);
    assert_eq!(c.performance.default_prefetch, 1000);
    assert_eq!(c.performance.max_pending_replies, 65_536);
    assert_eq!(c.performance.max_handshakes, 1024);
    assert_eq!(c.performance.max_handshakes_per_ip, 64);
    assert_eq!(c.storage.mode, StorageMode::Durable);
    assert_eq!(c.storage.segment_bytes, 67_108_864);
    assert_eq!(c.storage.max_commit_delay_us, 0);
    assert_eq!(c.storage.min_free_mb, 256);
    assert!(!c.admin.enabled);
    assert_eq!(c.admin.address, "127.0.0.1:9091");
    assert_eq!(c.admin.max_connections, 64);
    assert_eq!(c.admin.max_connections_per_ip, 8);
    assert_eq!(c.admin.header_timeout_secs, 5);
    assert_eq!(c.admin.idle_timeout_secs, 10);
    assert_eq!(c.admin.response_timeout_secs, 10);
    assert!(!c.admin.queue_metrics);
    assert_eq!(c.admin.max_queue_series, 100);
    assert!(!c.rate_limit.enabled);
    assert_eq!(c.rate_limit.global_rps, 10_000.0);
    assert_eq!(c.rate_limit.global_burst, 20_000);
    assert_eq!(c.rate_limit.max_connections_per_ip, 1000);
    assert_eq!(c.rate_limit.max_connections_per_cn, 100);
    assert!(c.acl.admin_cns.is_empty());
    c.validate().unwrap();
}

#[test]
fn unknown_key_names_the_dotted_key() {
    let e = err("[server]\nadress = \"127.0.0.1:1\"\n");
    assert!(e.starts_with("unknown key server.adress"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    assert!(e.contains("address"), "{e}");
    let e = err("[servre]\n");
    assert!(e.starts_with("unknown key servre"), "{e}");
    let e = err("[performance]\nmax_line_byte = 5\n");
    assert!(
        e.starts_with("unknown key performance.max_line_byte"),
        "{e}"
    );
}

#[test]
fn wrong_type_names_the_dotted_key() {
    let e = err("[performance]\nmax_queue_size = \"x\"\n");
    assert!(
        e.starts_with(r#"performance.max_queue_size: invalid type: string "x", expected usize"#),
        "{e}"
    );
    let e = err("[database]\nport = 70000\n");
    assert!(e.starts_with("database.port: invalid value"), "{e}");
    let e = err("[logging]\nrotation = \"weekly\"\n");
    assert!(
        e.starts_with("logging.rotation: unknown variant `weekly`"),
        "{e}"
    );
    let e = err("[acl]\nsender_cns = [\"a\", 3]\n");
    assert!(e.starts_with("acl.sender_cns[1]: invalid type"), "{e}");
}

#[test]
fn admin_address_may_not_be_the_server_address() {
    for (server, admin) in [
        ("127.0.0.1:5700", "127.0.0.1:5700"),
        ("localhost:9091", "localhost:9091"),
        ("0.0.0.0:9091", "127.0.0.1:9091"),
        ("127.0.0.1:9091", "0.0.0.0:9091"),
        ("[::1]:9091", "[::]:9091"),
    ] {
        let text = format!(
            "[server]\naddress = \"{server}\"\n[admin]\nenabled = true\naddress = \"{admin}\"\n"
        );
        let e = err(&text);
        assert!(
            e.starts_with("admin.address: ")
                && e.contains("server.address")
                && e.contains(admin)
                && e.contains("a port of their own"),
            "{e}"
        );
    }
    for (server, admin, enabled) in [
        // Off: nothing binds admin.address.
        ("127.0.0.1:9091", "127.0.0.1:9091", false),
        // Port 0 is a different free port each time.
        ("127.0.0.1:0", "127.0.0.1:0", true),
        // Other IPs, other ports, other families.
        ("127.0.0.1:9091", "127.0.0.2:9091", true),
        ("127.0.0.1:5700", "127.0.0.1:9091", true),
        ("0.0.0.0:9091", "[::1]:9091", true),
    ] {
        let text = format!(
            "[server]\naddress = \"{server}\"\n[admin]\nenabled = {enabled}\naddress = \"{admin}\"\n"
        );
        assert!(parse(&text).is_ok(), "{text}");
    }
    // The start checks again after `--address` overrode server.address.
    let mut c = parse("[admin]\nenabled = true\n").unwrap();
    c.server.address = c.admin.address.clone();
    let e = c.validate_admin_address().unwrap_err();
    assert_eq!(e.key(), Some("admin.address"), "{e}");
}

#[test]
fn syntax_error_is_reported_with_position() {
    let e = parse("[server\n").unwrap_err();
    assert!(matches!(e, ConfigError::Syntax { at: Some(_), .. }), "{e}");
    assert!(e.to_string().contains("line 1"), "{e}");
}

#[test]
fn cluster_settings_are_checked_only_when_enabled_and_say_what_to_change() {
    let pg = "[database]\nbackend = \"postgres\"\nsslmode = \"disable\"\n";
    // Off: nothing in [cluster] is looked at beyond its types.
    let c = parse("[cluster]\nnode_id = \"bad id\"").unwrap();
    assert!(!c.cluster.enabled);
    let c = parse(&format!(
        "{pg}[cluster]\nenabled = true\nnode_id = \"node-2\"\nadvertise = \"10.0.0.2:5700\""
    ))
    .unwrap();
    assert_eq!(c.cluster.node_id, "node-2");
    assert_eq!(c.cluster.lease_secs, 5);
    assert_eq!(c.cluster.schema, "ciphermq_cluster");
    let e = err("[cluster]\nenabled = true");
    assert!(
        e.starts_with("cluster.enabled:") && e.contains("backend = \"postgres\""),
        "{e}"
    );
    for (keys, key, why) in [
        ("node_id = \"a b\"", "cluster.node_id:", "is not a node id"),
        ("node_id = \"\"", "cluster.node_id:", "is not a node id"),
        (
            "advertise = \"nowhere\"",
            "cluster.advertise:",
            "is not host:port",
        ),
        ("advertise = \"10.0.0.1:0\"", "cluster.advertise:", "port 0"),
        ("lease_secs = 0", "cluster.lease_secs:", "from 1 to 3600"),
        ("lease_secs = 3601", "cluster.lease_secs:", "from 1 to 3600"),
        ("schema = \"Bad-Name\"", "cluster.schema:", "lowercase"),
        (
            "shared_dir = \"/mnt/x\"",
            "cluster.shared_dir:",
            "does not use it",
        ),
        ("storage = \"shared\"", "cluster.shared_dir:", "empty"),
    ] {
        let e = err(&format!("{pg}[cluster]\nenabled = true\n{keys}"));
        assert!(e.starts_with(key) && e.contains(why), "{keys}: {e}");
    }
    let e = err(&format!(
        "[server]\naddress = \"0.0.0.0:5700\"\n{pg}[cluster]\nenabled = true"
    ));
    assert!(
        e.starts_with("cluster.advertise: required") && e.contains("0.0.0.0:5700"),
        "{e}"
    );
    assert!(parse(&format!(
        "[server]\naddress = \"0.0.0.0:5700\"\n{pg}[cluster]\nenabled = true\nadvertise = \"10.0.0.1:5700\""
    ))
    .is_ok());
    let shared = parse(&format!(
        "{pg}[cluster]\nenabled = true\nstorage = \"shared\"\nshared_dir = \"/mnt/x\""
    ))
    .unwrap();
    assert_eq!(shared.cluster.storage, ClusterStorage::Shared);
    let e = err(&format!(
        "[storage]\nmode = \"memory\"\n{pg}[cluster]\nenabled = true\nstorage = \"shared\"\nshared_dir = \"/mnt/x\""
    ));
    assert!(
        e.starts_with("cluster.storage:") && e.contains("durable"),
        "{e}"
    );
    let e = err("[cluster]\nstorage = \"nfs\"");
    assert!(e.starts_with("cluster.storage:"), "{e}");
    let e =
        err("[database]\nbackend = \"postgres\"\nsslmode = \"require\"\n[cluster]\nenabled = true");
    assert!(
        e.starts_with("database.sslmode:") && e.contains("does not speak TLS"),
        "{e}"
    );
}

#[test]
fn semantic_errors_name_the_key() {
    let e = err("[server]\naddress = \"x\"\n");
    assert!(
        e.starts_with(r#"server.address: "x" is not host:port"#),
        "{e}"
    );
    assert!(parse("[server]\naddress = \"[::1]:0\"").is_ok());
    assert!(parse("[server]\naddress = \"localhost:5700\"").is_ok());
    assert!(parse("[server]\naddress = \"localhost:70000\"").is_err());
    assert!(err("[server]\nshards = 1025").starts_with("server.shards:"));
    assert!(parse("[server]\nshutdown_timeout_secs = 0").is_ok());
    let e = err("[server]\nshutdown_timeout_secs = 999999999999");
    assert!(
        e.starts_with("server.shutdown_timeout_secs: 999999999999 is more than ten years"),
        "{e}"
    );
    let e = err("[server]\nshutdown_timeout_secs = -1");
    assert!(e.starts_with("server.shutdown_timeout_secs: "), "{e}");
    let e = err("[server]\nshutdown_timeout_secs = \"30s\"");
    assert!(e.starts_with("server.shutdown_timeout_secs: "), "{e}");
    assert!(err("[admin]\naddress = \"nope\"").starts_with("admin.address:"));
    for (probe, why) in [
        ("0.0.0.0:9092", "is not a loopback"),
        ("10.0.0.1:9092", "is not a loopback"),
        ("localhost:9092", "is not a loopback"),
        ("127.0.0.1:9091", "is admin.address too"),
    ] {
        let e = err(&format!(
            "[admin]\nenabled = true\nprobe_address = \"{probe}\""
        ));
        assert!(
            e.starts_with("admin.probe_address:") && e.contains(why),
            "{e}"
        );
    }
    let e = err("[admin]\nprobe_address = \"127.0.0.1:9092\"");
    assert!(e.contains("admin.enabled = true"), "{e}");
    let c = parse("[admin]\nenabled = true\nprobe_address = \"[::1]:9092\"").unwrap();
    assert_eq!(c.admin.probe_address.as_deref(), Some("[::1]:9092"));
    for (bad, key) in [
        ("max_connections = 0", "admin.max_connections:"),
        ("max_connections = 4097", "admin.max_connections:"),
        (
            "max_connections_per_ip = 0",
            "admin.max_connections_per_ip:",
        ),
        (
            "max_connections = 4\nmax_connections_per_ip = 5",
            "admin.max_connections_per_ip:",
        ),
        ("header_timeout_secs = 0", "admin.header_timeout_secs:"),
        ("idle_timeout_secs = 3601", "admin.idle_timeout_secs:"),
        ("response_timeout_secs = 0", "admin.response_timeout_secs:"),
        ("max_queue_series = 0", "admin.max_queue_series:"),
        ("max_queue_series = 10001", "admin.max_queue_series:"),
    ] {
        let e = err(&format!("[admin]\n{bad}"));
        assert!(e.starts_with(key), "{bad}: {e}");
    }
    assert!(parse("[admin]\nmax_connections = 4096\nmax_connections_per_ip = 4096").is_ok());
    assert_eq!(
        err("[admin]\nqueue_metrics = true\nmax_queue_series = 0"),
        "admin.max_queue_series: 0 is not between 1 and 10000"
    );
    for max in [1, 10_000] {
        let c = parse(&format!(
            "[admin]\nqueue_metrics = true\nmax_queue_series = {max}"
        ))
        .unwrap();
        assert_eq!(
            c.admin.queue_series(),
            ciphermq_admin::config::QueueSeries { enabled: true, max }
        );
    }
    assert!(err("[admin]\nqueue_metrics = 1").starts_with("admin.queue_metrics: invalid type"));
    assert_eq!(
        err("[rate_limit]\nglobal_burst = 0"),
        "rate_limit.global_burst: must be at least 1"
    );
    assert!(err("[rate_limit]\npublish_rps = 0.0").starts_with("rate_limit.publish_rps:"));
    assert!(err("[performance]\nmax_deliveries = 0").starts_with("performance.max_deliveries:"));
    assert!(err("[performance]\nmax_pending_replies = 0")
        .starts_with("performance.max_pending_replies:"));
    assert!(err("[storage]\nsegment_bytes = 4095").starts_with("storage.segment_bytes:"));
    assert!(err("[storage]\nsegment_bytes = 1073741825").starts_with("storage.segment_bytes:"));
    // Durations a deadline could not hold are refused, not a panic later.
    for key in [
        "[performance]\nack_wait_secs = 9223372036854775807",
        "[performance]\nidle_timeout_sec = 9223372036854775807",
        "[database]\nflush_interval_ms = 9223372036854775807",
    ] {
        assert!(err(key).contains("more than ten years"), "{key}");
    }
    assert!(err("[encryption]\nalgorithm = \"aes\"").starts_with("encryption.algorithm:"));
    assert!(err("[logging]\nlevel = \"loud\"").starts_with("logging.level:"));
    assert!(parse("[logging]\nlevel = \"info,ciphermq_shard=debug\"").is_ok());
    assert!(parse("[logging]\nlevel = \"DEBUG\"").is_ok());
}

#[test]
fn legacy_keys_translate_with_one_warning_each() {
    let c = parse(
        "[server]\nconnection_type = \"tls\"\n\
         [performance]\nidle_timeout_sec = 7\nheartbeat_timeout = 8\ncleanup_interval = 3000\n",
    )
    .unwrap();
    assert_eq!(c.performance.idle_timeout_sec, 7);
    assert_eq!(c.performance.heartbeat_timeout, 8);
    let keys: Vec<&str> = c.warnings().iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "server.connection_type",
            "performance.heartbeat_timeout",
            "performance.idle_timeout_sec",
            "performance.cleanup_interval"
        ]
    );
    assert!(c.warnings()[2]
        .to_string()
        .starts_with("performance.idle_timeout_sec: renamed performance.idle_timeout_secs"));
    // The current names load silently.
    let c = parse("[performance]\nidle_timeout_secs = 7\nheartbeat_timeout_secs = 8\n").unwrap();
    assert!(c.warnings().is_empty());
    assert_eq!(c.performance.idle_timeout_sec, 7);
    // Both names at once is ambiguous.
    let e = err("[performance]\nidle_timeout_sec = 7\nidle_timeout_secs = 8\n");
    assert!(
        e.starts_with(
            "performance.idle_timeout_sec: is the old name of performance.idle_timeout_secs"
        ),
        "{e}"
    );
    // Only "tls" is what the broker does.
    let e = err("[server]\nconnection_type = \"tcp\"\n");
    assert!(
        e.starts_with("server.connection_type: \"tcp\" is not supported"),
        "{e}"
    );
    // A legacy key in another section is just unknown.
    let e = err("[server]\nmax_size_mb = 50\n");
    assert!(e.starts_with("unknown key server.max_size_mb"), "{e}");
}

#[test]
fn errors_after_a_translation_name_the_key_as_written_and_where() {
    // A bad value under an old name is reported under that name.
    let e = err("[performance]\nidle_timeout_sec = \"x\"\n");
    assert!(
        e.starts_with("performance.idle_timeout_sec: invalid type: string \"x\", expected u64 (at line 2, column 20)"),
        "{e}"
    );
    // Positions stay those of the file, legacy keys or not.
    let e = err("[server]\nconnection_type = \"tls\"\n\n[acl]\nsender_cns = [\"a\", 3]\n");
    assert!(e.starts_with("acl.sender_cns[1]: invalid type"), "{e}");
    assert!(e.ends_with("(at line 5, column 20)"), "{e}");
    let e = err("[logging]\nmax_size_mb = 1\nconsole = \"yes\"\n");
    assert!(
        e.starts_with(
            r#"logging.console: invalid value: string "yes", expected true, false or "auto""#
        ),
        "{e}"
    );
    assert!(e.ends_with("(at line 3, column 11)"), "{e}");
    let e = err("[performance]\ncleanup_interval = 1\n max_queue_sise = 1\n");
    assert!(
        e.starts_with("unknown key performance.max_queue_sise (at line 3, column 2)"),
        "{e}"
    );
}

#[test]
fn reference_log_file_paths_become_logging_dir() {
    let text =
        "[logging]\ninfo_file_path = \"var/info.log\"\nerror_file_path = \"var/error.log\"\n";
    let c = parse(text).unwrap();
    assert_eq!(c.logging.dir, PathBuf::from("/etc/ciphermq/var"));
    assert!(c.logging.json_files);
    assert_eq!(c.warnings().len(), 2);
    assert!(c.warnings()[0]
        .message
        .contains("logging.dir = \"var\" is taken from it"));
    // An explicit dir or json_files wins; different directories are not guessed.
    let c = parse("[logging]\ninfo_file_path = \"a/i.log\"\ndir = \"b\"\njson_files = false\n")
        .unwrap();
    assert_eq!(c.logging.dir, PathBuf::from("/etc/ciphermq/b"));
    assert!(!c.logging.json_files);
    let c =
        parse("[logging]\ninfo_file_path = \"a/i.log\"\ndebug_file_path = \"d.log\"\n").unwrap();
    assert_eq!(c.logging.dir, PathBuf::from("/etc/ciphermq/logs"));
    assert!(
        c.warnings()[0]
            .message
            .contains("different directories (a, .)"),
        "{:?}",
        c.warnings()
    );
    let e = err("[logging]\ninfo_file_path = 3\n");
    assert!(
        e.starts_with("logging.info_file_path: 3 is not a file path"),
        "{e}"
    );
}

#[test]
fn console_is_true_false_or_auto() {
    for (text, want) in [
        ("", Console::Auto),
        ("console = \"auto\"", Console::Auto),
        ("console = true", Console::On),
        ("console = false", Console::Off),
    ] {
        assert_eq!(
            parse(&format!("[logging]\n{text}"))
                .unwrap()
                .logging
                .console,
            want
        );
    }
    assert!(err("[logging]\nconsole = 1").starts_with("logging.console: invalid type"));
}

#[test]
fn bursts_take_whole_floats_and_rates_take_fractions() {
    let c = parse("[rate_limit]\nglobal_burst = 200.0\npublish_burst = 7\nglobal_rps = 0.5\npublish_rps = 3\nmax_connections_per_ip = 5e1\n").unwrap();
    assert_eq!(c.rate_limit.global_burst, 200);
    assert_eq!(c.rate_limit.publish_burst, 7);
    assert_eq!(c.rate_limit.global_rps, 0.5);
    assert_eq!(c.rate_limit.publish_rps, 3.0);
    assert_eq!(c.rate_limit.max_connections_per_ip, 50);
    let e = err("[rate_limit]\nglobal_burst = 200.5\n");
    assert!(
        e.starts_with("rate_limit.global_burst: 200.5 is not a whole number"),
        "{e}"
    );
    for bad in ["-1", "-1.0", "4294967296", "4294967296.0", "inf", "nan"] {
        let e = err(&format!("[rate_limit]\nmax_connections_per_cn = {bad}\n"));
        assert!(
            e.starts_with("rate_limit.max_connections_per_cn: invalid value"),
            "{bad}: {e}"
        );
    }
    assert!(err("[rate_limit]\npublish_burst = \"5\"")
        .starts_with("rate_limit.publish_burst: invalid type"));
}

#[test]
fn max_message_bytes_is_capped_by_the_log_record_size() {
    // The arithmetic of the doc comment, spelled out.
    assert_eq!(
        MAX_MESSAGE_BYTES_LIMIT,
        64 * 1024 * 1024 - 16 - 16 - 4 * 257
    );
    let at_limit = format!("[performance]\nmax_message_bytes = {MAX_MESSAGE_BYTES_LIMIT}\n");
    let c = parse(&at_limit).unwrap();
    assert_eq!(c.performance.max_message_bytes, MAX_MESSAGE_BYTES_LIMIT);
    let over = MAX_MESSAGE_BYTES_LIMIT + 1;
    let e = err(&format!("[performance]\nmax_message_bytes = {over}\n"));
    assert!(
        e.starts_with(&format!(
            "performance.max_message_bytes: {over} is more than {MAX_MESSAGE_BYTES_LIMIT}"
        )),
        "{e}"
    );
}

#[test]
fn max_line_bytes_is_derived_and_checked() {
    let c = parse("[performance]\nmax_message_bytes = 1000\n").unwrap();
    assert_eq!(c.performance.max_line_bytes, 1000 + 4096);
    let c = parse("[performance]\nmax_message_bytes = 1000\nmax_line_bytes = 1001\n").unwrap();
    assert_eq!(c.performance.max_line_bytes, 1001);
    let e = err("[performance]\nmax_line_bytes = 1048576\n");
    assert!(
        e.starts_with(
            "performance.max_line_bytes: must be larger than performance.max_message_bytes"
        ),
        "{e}"
    );
}

#[test]
fn postgres_rules() {
    let e = err("[database]\nbackend = \"postgres\"\nhost = \"\"\n");
    assert!(e.starts_with("database.host: must not be empty"), "{e}");
    let e = err("[database]\nbackend = \"postgres\"\npassword = \"a\"\npassword_file = \"p\"\n");
    assert!(e.starts_with("database.password:"), "{e}");
    // Embedded ignores the connection keys.
    assert!(parse("[database]\nhost = \"\"\n").is_ok());
    let c = parse("[database]\nbackend = \"postgres\"\npassword_file = \"pw\"\n").unwrap();
    assert_eq!(
        c.database.password_file,
        Some(PathBuf::from("/etc/ciphermq/pw"))
    );
}

#[test]
fn postgres_tls_rules() {
    assert_eq!(parse("").unwrap().database.sslmode, DatabaseSslMode::Prefer);
    let e = err("[database]\nsslmode = \"verify-ca\"\n");
    assert!(
        e.starts_with("database.sslmode: unknown variant `verify-ca`"),
        "{e}"
    );
    let e = err("[database]\nbackend = \"postgres\"\nsslmode = \"verify-full\"\n");
    assert!(
        e.starts_with("database.ca_cert_path: required with database.sslmode = \"verify-full\""),
        "{e}"
    );
    let e = err("[database]\nbackend = \"postgres\"\nca_cert_path = \"pg-ca.crt\"\n");
    assert!(
        e.starts_with("database.ca_cert_path: set, but database.sslmode = \"prefer\""),
        "{e}"
    );
    let e = err("[database]\nbackend = \"postgres\"\nsslmode = \"require\"\nca_cert_path = \"\"\n");
    assert!(
        e.starts_with("database.ca_cert_path: must not be empty"),
        "{e}"
    );
    let c = parse(
        "[database]\nbackend = \"postgres\"\nsslmode = \"verify-full\"\nca_cert_path = \"pg-ca.crt\"\n",
    )
    .unwrap();
    assert_eq!(c.database.sslmode, DatabaseSslMode::VerifyFull);
    assert_eq!(
        c.database.ca_cert_path,
        Some(PathBuf::from("/etc/ciphermq/pg-ca.crt"))
    );
    // Embedded ignores them, like the other connection keys.
    assert!(parse("[database]\nsslmode = \"verify-full\"\n").is_ok());
}

#[test]
fn secrets_are_not_in_debug_output() {
    let c = parse(&format!(
        "[encryption]\naes_key = \"{B64_32}\"\n[database]\npassword = \"hunter2\"\n"
    ))
    .unwrap();
    let dbg = format!("{c:?}");
    assert!(!dbg.contains(B64_32) && !dbg.contains("hunter2"), "{dbg}");
    assert!(dbg.contains("<redacted>"));
}

#[test]
fn require_sender_id_is_a_boolean_defaulting_to_false() {
    assert!(!parse("").unwrap().acl.require_sender_id);
    assert!(
        parse("[acl]\nrequire_sender_id = true\n")
            .unwrap()
            .acl
            .require_sender_id
    );
    let e = err("[acl]\nrequire_sender_id = \"yes\"\n");
    assert!(e.starts_with("acl.require_sender_id: invalid type"), "{e}");
}

#[test]
fn acl_cns_are_checked() {
    let c = parse("[acl]\nadmin_cns = [\"admin\"]\nsender_cns = [\"sender-1.x:y\"]\n").unwrap();
    assert_eq!(c.acl.admin_cns, vec!["admin".to_owned()]);
    let e = err("[acl]\nreceiver_cns = [\"ok\", \"bad cn\"]\n");
    assert!(
        e.starts_with("acl.receiver_cns[1]: \"bad cn\" is not a valid CN"),
        "{e}"
    );
    assert!(err("[acl]\nadmin_cns = [\"\"]").starts_with("acl.admin_cns[0]:"));
    // The same rule as the wire protocol's names: no CN can be `.` or
    // `..`, which no certificate could then use as a queue's owner.
    for dots in [".", ".."] {
        let e = err(&format!("[acl]\nsender_cns = [\"{dots}\"]\n"));
        assert!(
            e.starts_with(&format!("acl.sender_cns[0]: \"{dots}\" is not a valid CN")),
            "{e}"
        );
    }
    assert!(parse("[acl]\nsender_cns = [\"a..b\"]\n").is_ok());
}

#[test]
fn aes_key_validation() {
    let c = parse(&format!("[encryption]\naes_key = \"{B64_32}\"\n")).unwrap();
    let key = c
        .encryption
        .resolve_aes_key_with_env(None)
        .unwrap()
        .unwrap();
    assert_eq!(key[31], 31);

    let short = "AAECAwQFBgcICQoLDA0ODw=="; // 16 bytes
    let e = err(&format!("[encryption]\naes_key = \"{short}\"\n"));
    assert_eq!(
        e,
        "encryption.aes_key: must be base64 of exactly 32 bytes (it decodes to 16 bytes)"
    );
    let e = err("[encryption]\naes_key = \"not base64!\"\n");
    assert!(
        e.starts_with("encryption.aes_key: must be base64 of exactly 32 bytes"),
        "{e}"
    );
    // Unpadded base64 is refused: standard padded alphabet everywhere.
    let unpadded = B64_32.trim_end_matches('=');
    assert!(parse(&format!("[encryption]\naes_key = \"{unpadded}\"\n")).is_err());
}

#[test]
fn aes_key_sources_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aes.key");
    std::fs::write(&file, format!("{B64_32}\n")).unwrap();
    let other = "//////////////////////////////////////////8="; // 32 x 0xff

    let mut e = EncryptionConfig::default();
    assert_eq!(e.resolve_aes_key_with_env(None).unwrap(), None);
    assert_eq!(e.resolve_aes_key_with_env(Some("  ")).unwrap(), None);
    assert_eq!(
        e.resolve_aes_key_with_env(Some(other)).unwrap(),
        Some([0xff; 32])
    );
    let bad = e.resolve_aes_key_with_env(Some("AAAA")).unwrap_err();
    assert!(bad
        .to_string()
        .starts_with("CIPHERMQ_AES_KEY (environment): must be base64"));

    e.aes_key_file = Some(file.clone());
    let from_file = e.resolve_aes_key_with_env(Some(other)).unwrap().unwrap();
    assert_eq!(from_file[1], 1);

    e.aes_key = Some(other.to_owned());
    assert_eq!(e.resolve_aes_key_with_env(None).unwrap(), Some([0xff; 32]));

    e.aes_key = None;
    std::fs::write(&file, "short").unwrap();
    let bad = e.resolve_aes_key_with_env(None).unwrap_err().to_string();
    assert!(bad.starts_with("encryption.aes_key_file: "), "{bad}");
    assert!(!bad.contains("short"), "{bad}");

    e.aes_key_file = Some(dir.path().join("missing.key"));
    let bad = e.resolve_aes_key_with_env(None).unwrap_err().to_string();
    assert!(
        bad.starts_with("encryption.aes_key_file: cannot read"),
        "{bad}"
    );
}

#[test]
fn relative_paths_resolve_against_base_dir() {
    let text = "[tls]\ncert_path = \"a/b.crt\"\nkey_path = \"/abs/k.key\"\n\
                [storage]\ndata_dir = \"../d\"\n[encryption]\naes_key_file = \"k\"\n";
    let c = Config::parse_unchecked(text, Path::new("/srv/mq")).unwrap();
    assert_eq!(c.tls.cert_path, PathBuf::from("/srv/mq/a/b.crt"));
    assert_eq!(c.tls.key_path, PathBuf::from("/abs/k.key"));
    assert_eq!(c.tls.ca_cert_path, PathBuf::from("/srv/mq/certs/ca.crt"));
    assert_eq!(c.storage.data_dir, PathBuf::from("/srv/mq/../d"));
    assert_eq!(c.encryption.aes_key_file, Some(PathBuf::from("/srv/mq/k")));
    // An empty base (config file named without a directory) keeps paths relative.
    let c = Config::parse_unchecked("", Path::new("")).unwrap();
    assert_eq!(c.tls.cert_path, PathBuf::from("certs/server.crt"));
}

#[test]
fn tls_identity_and_crl_keys() {
    let c = parse("").unwrap();
    assert_eq!(c.tls.identity, TlsIdentity::Cn);
    assert_eq!(c.tls.uri_san_prefix, DEFAULT_URI_SAN_PREFIX);
    assert_eq!(c.tls.crl_path, None);

    let text = "[tls]\nidentity = \"uri_san\"\nuri_san_prefix = \"urn:mq:\"\n\
                crl_path = \"certs/ca.crl\"\n";
    let c = Config::parse_unchecked(text, Path::new("/srv/mq")).unwrap();
    assert_eq!(c.tls.identity, TlsIdentity::UriSan);
    assert_eq!(c.tls.uri_san_prefix, "urn:mq:");
    assert_eq!(c.tls.crl_path, Some(PathBuf::from("/srv/mq/certs/ca.crl")));

    let e = err("[tls]\nidentity = \"san\"\n");
    assert!(e.contains("tls.identity"), "{e}");
    for (prefix, why) in [
        ("", "must be 1 to 1024 bytes"),
        ("spiffe://ciphermq", "must end with '/' or ':'"),
        ("//ciphermq/", "must start with a URI scheme"),
        ("spiffe://cipher mq/", "printable ASCII"),
    ] {
        let e = err(&format!("[tls]\nuri_san_prefix = {prefix:?}\n"));
        assert!(e.starts_with("tls.uri_san_prefix: "), "{e}");
        assert!(e.contains(why), "{prefix:?}: {e}");
    }
    let e = err("[tls]\ncrl_path = \"\"\n");
    assert!(e.starts_with("tls.crl_path: must not be empty"), "{e}");
}

#[test]
fn missing_crl_file_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    for f in ["server.crt", "server.key", "ca.crt"] {
        std::fs::write(certs.join(f), "").unwrap();
    }
    let e = Config::from_toml_str("[tls]\ncrl_path = \"certs/ca.crl\"\n", dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("tls.crl_path: file "), "{e}");
}

#[test]
fn missing_tls_file_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let e = Config::from_toml_str("", dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("tls.cert_path: file "), "{e}");
    assert!(e.contains("certs/server.crt does not exist"), "{e}");

    std::fs::create_dir(dir.path().join("certs")).unwrap();
    for f in ["server.crt", "server.key"] {
        std::fs::write(dir.path().join("certs").join(f), "x").unwrap();
    }
    let e = Config::from_toml_str("", dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("tls.ca_cert_path: file "), "{e}");

    std::fs::write(dir.path().join("certs/ca.crt"), "x").unwrap();
    let key = format!("[encryption]\naes_key = \"{B64_32}\"\n");
    Config::from_toml_str(&key, dir.path()).unwrap();
}

#[test]
fn load_reads_the_file_and_resolves_against_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    for f in ["server.crt", "server.key", "ca.crt"] {
        std::fs::write(dir.path().join("certs").join(f), "x").unwrap();
    }
    let path = dir.path().join("broker.toml");
    std::fs::write(&path, format!("[encryption]\naes_key = \"{B64_32}\"\n")).unwrap();
    let c = Config::load(&path).unwrap();
    assert_eq!(c.tls.ca_cert_path, dir.path().join("certs/ca.crt"));

    let e = Config::load(&dir.path().join("nope.toml")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(e.to_string().starts_with("cannot read config file "), "{e}");
}

#[test]
fn repo_example_config_parses_with_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let base = Path::new("/repo");
    let c = Config::parse_unchecked(&text, base).unwrap();

    // The example documents the defaults: apart from the demo ACL and
    // the AES key ciphermq-pki writes, it must parse to exactly what an
    // empty file gives.
    let mut want = Config::parse_unchecked("", base).unwrap();
    want.encryption.aes_key_file = Some(base.join("certs/aes.key"));
    want.acl.admin_cns = vec!["admin".to_owned()];
    want.acl.sender_cns = vec!["sender_1".to_owned(), "sender_2".to_owned()];
    want.acl.receiver_cns = vec!["receiver_1".to_owned(), "receiver_2".to_owned()];
    assert_eq!(c, want);

    // And it spells out every key (the derived max_line_bytes included).
    let table: toml::Table = text.parse().unwrap();
    for (section, keys) in [
        ("server", 4),
        ("tls", 5),
        ("logging", 6),
        ("database", 10),
        ("encryption", 2),
        ("performance", 25),
        ("storage", 6),
        ("admin", 9),
        ("rate_limit", 7),
        ("acl", 5),
        ("cluster", 7),
    ] {
        let t = table.get(section).and_then(|v| v.as_table());
        assert_eq!(t.map(|t| t.len()), Some(keys), "section [{section}]");
    }
}
