//! What `ciphermq-admin`'s subcommands print: human summaries and tables
//! built from the admin endpoint's JSON (`--json` prints that JSON as is).

pub(crate) mod broker_file;
pub(crate) mod hints;
pub(crate) mod moves;
pub(crate) mod table;

use serde_json::Value;

use table::{bytes, Table};

/// A JSON number as an integer (0 when absent).
fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A JSON value as display text (`-` when absent).
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// Seconds as `2d 3h`, `4h 5m`, `6m 7s` or `8s`.
fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// `/api/status` as a few lines.
pub(crate) fn status(doc: &Value) -> String {
    let server = &doc["server"];
    let mut out = format!(
        "{} {} · up {} · {} shard(s) · health {}{}\n",
        text(&server["name"]),
        text(&server["version"]),
        duration(n(&server["uptime_secs"])),
        n(&server["shards"]),
        text(&server["health"]),
        if server["ready"] == Value::Bool(true) {
            " (ready)".to_owned()
        } else {
            format!(" (not ready: {})", text(&server["reason"]))
        }
    );
    for warning in server["warnings"].as_array().into_iter().flatten() {
        out.push_str(&format!("warning: {}\n", text(warning)));
    }
    let c = &doc["counters"];
    out.push_str(&format!(
        "messages: {} published, {} delivered, {} acked, {} publish NACKs\n",
        n(&c["publishes"]),
        n(&c["deliveries"]),
        n(&c["acks"]),
        n(&c["publish_nacks"])
    ));
    out.push_str(&format!(
        "queues: {} · exchanges: {} · bindings: {} · connections: {}\n",
        doc["queues"].as_array().map_or(0, Vec::len),
        doc["exchanges"].as_array().map_or(0, Vec::len),
        doc["bindings"].as_array().map_or(0, Vec::len),
        n(&doc["connections"]["total"])
    ));
    let s = &doc["storage"];
    let mut storage = format!("storage: {}", text(&s["mode"]));
    if let Some(dir) = s["data_dir"].as_str() {
        storage.push_str(&format!(" in {dir}"));
    }
    if let Some(free) = s["disk_free_bytes"].as_u64() {
        storage.push_str(&format!(
            " · disk free {} (min {})",
            bytes(free),
            bytes(n(&s["min_free_bytes"]))
        ));
    }
    storage.push_str(&format!(
        " · {} · quarantined {} records\n",
        if s["healthy"] == Value::Bool(false) {
            format!("FAILING: {}", text(&s["last_error"]))
        } else {
            "writing".to_owned()
        },
        n(&s["quarantined_records"])
    ));
    out.push_str(&storage);
    let mirror = &doc["pgbridge"];
    if mirror.is_null() {
        out.push_str("mirror: off\n");
    } else {
        out.push_str(&format!(
            "mirror: {} · lag {} rows, {}, {:.1} s · {} rows written\n",
            if mirror["connected"] == Value::Bool(true) {
                "connected".to_owned()
            } else {
                format!("DISCONNECTED ({})", text(&mirror["last_error"]))
            },
            n(&mirror["lag_rows"]),
            bytes(n(&mirror["lag_bytes"])),
            mirror["lag_seconds"].as_f64().unwrap_or(0.0),
            n(&mirror["rows_written"])
        ));
    }
    out
}

/// `/api/queues` as a table.
pub(crate) fn queues(doc: &Value) -> String {
    let mut t = Table::new(&[
        "name",
        "owner",
        ">shard",
        ">ready",
        ">unacked",
        ">consumers",
        ">bytes",
        ">on disk",
    ]);
    for q in doc["queues"].as_array().into_iter().flatten() {
        t.row(vec![
            text(&q["name"]),
            text(&q["owner"]),
            n(&q["shard"]).to_string(),
            n(&q["ready"]).to_string(),
            n(&q["unacked"]).to_string(),
            n(&q["consumers"]).to_string(),
            bytes(n(&q["bytes"])),
            n(&q["on_disk"]).to_string(),
        ]);
    }
    t.render("no queues")
}

/// `/api/connections` as a count and two tables (by CN, by IP); with
/// nothing open, one line saying so rather than two empty tables.
pub(crate) fn connections(doc: &Value) -> String {
    let c = &doc["connections"];
    let total = n(&c["total"]);
    let sections = [
        ("by_cn", "cn", "no connections by CN"),
        ("by_ip", "ip", "no connections by IP"),
    ];
    let listed = |key: &str| c[key].as_object().is_some_and(|m| !m.is_empty());
    if total == 0 && !sections.iter().any(|(key, _, _)| listed(key)) {
        return "no client connections open\n".to_owned();
    }
    let mut out = format!(
        "{total} client connection{} open\n",
        if total == 1 { "" } else { "s" }
    );
    for (key, column, empty) in sections {
        let mut t = Table::new(&[column, ">connections"]);
        for (name, count) in c[key].as_object().into_iter().flatten() {
            t.row(vec![name.clone(), n(count).to_string()]);
        }
        out.push('\n');
        out.push_str(&t.render(empty));
    }
    out
}

/// `/api/cluster` as a line about the answering node and a table of the
/// live nodes; a broker on its own says so.
pub(crate) fn nodes(doc: &Value) -> String {
    if doc["enabled"] != Value::Bool(true) {
        return "this broker is not a cluster node (cluster.enabled = false)\n".to_owned();
    }
    let c = &doc["cluster"];
    let mut out = format!(
        "asked node {} at {}: coordinator {}{}, {} owners placed\n\n",
        text(&c["node_id"]),
        text(&c["advertise"]),
        if c["coordinator_connected"] == Value::Bool(true) {
            "connected"
        } else {
            "UNREACHABLE"
        },
        if c["fenced"] == Value::Bool(true) {
            ", FENCED (another process registered this node id)"
        } else {
            ""
        },
        n(&c["owners_total"])
    );
    let mut t = Table::new(&["node", "address", "state", ">owners", ">heartbeat age"]);
    for node in c["nodes"].as_array().into_iter().flatten() {
        let age = n(&node["heartbeat_age_ms"]);
        t.row(vec![
            text(&node["node_id"]),
            text(&node["advertise"]),
            if node["this_node"] == Value::Bool(true) {
                "alive (this node)".to_owned()
            } else {
                "alive".to_owned()
            },
            n(&node["owners"]).to_string(),
            format!("{}.{:01}s", age / 1000, (age % 1000) / 100),
        ]);
    }
    out.push_str(&t.render("no live nodes"));
    let takeovers = c["recent_takeovers"].as_array().into_iter().flatten();
    let mut d = Table::new(&["declared dead", "by", ">ago", ">owners moved", "why"]);
    let mut any = false;
    for t in takeovers {
        any = true;
        let age = n(&t["age_ms"]);
        d.row(vec![
            text(&t["node_id"]),
            text(&t["by_node"]),
            format!("{}.{:01}s", age / 1000, (age % 1000) / 100),
            n(&t["owners"]).to_string(),
            text(&t["reason"]),
        ]);
    }
    if any {
        out.push_str("\nrecent takeovers (their owners went to live nodes):\n");
        out.push_str(&d.render(""));
    }
    out
}

/// The exchanges and bindings of `/api/status` as two tables.
pub(crate) fn exchanges(doc: &Value) -> String {
    let mut t = Table::new(&["exchange", "type", ">bindings"]);
    for e in doc["exchanges"].as_array().into_iter().flatten() {
        t.row(vec![
            text(&e["name"]),
            text(&e["type"]),
            n(&e["bindings"]).to_string(),
        ]);
    }
    let mut out = t.render("no exchanges");
    let mut b = Table::new(&["exchange", "queue", "routing key"]);
    for binding in doc["bindings"].as_array().into_iter().flatten() {
        b.row(vec![
            text(&binding["exchange"]),
            text(&binding["queue"]),
            text(&binding["routing_key"]),
        ]);
    }
    out.push('\n');
    out.push_str(&b.render("no bindings"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summaries_read_what_is_there_and_survive_what_is_not() {
        let doc = json!({
            "server": {"name": "b", "version": "0.1.0", "uptime_secs": 3725, "shards": 2,
                        "health": "degraded", "ready": true, "warnings": ["disk space low"]},
            "counters": {"publishes": 5},
            "queues": [{"name": "q", "owner": "r", "shard": 1, "ready": 3, "unacked": 1,
                        "consumers": 0, "bytes": 2048, "on_disk": 0}],
            "storage": {"mode": "memory", "healthy": true},
            "pgbridge": null
        });
        let s = status(&doc);
        assert!(
            s.starts_with("b 0.1.0 · up 1h 2m · 2 shard(s) · health degraded (ready)\n"),
            "{s}"
        );
        assert!(s.contains("warning: disk space low\n"), "{s}");
        assert!(s.contains("mirror: off"), "{s}");
        let q = queues(&doc);
        assert!(q.lines().nth(1).unwrap().starts_with("q     r"), "{q}");
        assert!(status(&json!({})).contains("health -"));
        assert_eq!(queues(&json!({})), "no queues\n");
    }

    #[test]
    fn connections_say_what_they_count_and_when_nothing_is_open() {
        let none =
            json!({"connections": {"total": 0, "by_cn": {}, "by_ip": {}, "by_shard": [0, 0]}});
        assert_eq!(connections(&none), "no client connections open\n");
        assert_eq!(connections(&json!({})), "no client connections open\n");

        let some = json!({"connections": {"total": 3,
            "by_cn": {"receiver_1": 1, "sender_1": 2}, "by_ip": {"127.0.0.1": 3},
            "by_shard": [2, 1]}});
        assert_eq!(
            connections(&some),
            "3 client connections open\n\n\
             CN          CONNECTIONS\n\
             receiver_1            1\n\
             sender_1              2\n\n\
             IP         CONNECTIONS\n\
             127.0.0.1            3\n"
        );
        let one = json!({"connections": {"total": 1, "by_cn": {"admin": 1}, "by_ip": {}}});
        let text = connections(&one);
        assert!(text.starts_with("1 client connection open\n"), "{text}");
        // A section with nothing in it is named, never a bare "none".
        assert!(text.ends_with("\nno connections by IP\n"), "{text}");
        assert!(!text.lines().any(|l| l.trim() == "none"), "{text}");
    }

    #[test]
    fn nodes_show_each_live_node_and_the_asked_nodes_link() {
        assert_eq!(
            nodes(&json!({"enabled": false})),
            "this broker is not a cluster node (cluster.enabled = false)\n"
        );
        let doc = json!({"enabled": true, "cluster": {
        "node_id": "node-b", "advertise": "10.0.0.2:5700", "coordinator_connected": true,
        "fenced": false, "owners_total": 3,
        "nodes": [
            {"node_id": "node-a", "advertise": "10.0.0.1:5700", "heartbeat_age_ms": 1234,
             "owners": 2, "this_node": false},
            {"node_id": "node-b", "advertise": "10.0.0.2:5700", "heartbeat_age_ms": 56,
             "owners": 1, "this_node": true}
        ]}});
        assert_eq!(
            nodes(&doc),
            "asked node node-b at 10.0.0.2:5700: coordinator connected, 3 owners placed\n\n\
             NODE    ADDRESS        STATE              OWNERS  HEARTBEAT AGE\n\
             node-a  10.0.0.1:5700  alive                   2           1.2s\n\
             node-b  10.0.0.2:5700  alive (this node)       1           0.0s\n"
        );
    }

    #[test]
    fn nodes_list_the_recent_takeovers_after_the_live_nodes() {
        let doc = json!({"enabled": true, "cluster": {
        "node_id": "node-b", "advertise": "10.0.0.2:5700", "coordinator_connected": true,
        "fenced": false, "owners_total": 2,
        "nodes": [
            {"node_id": "node-b", "advertise": "10.0.0.2:5700", "heartbeat_age_ms": 56,
             "owners": 2, "this_node": true}
        ],
        "recent_takeovers": [
            {"node_id": "node-a", "by_node": "node-b", "age_ms": 12345, "owners": 2,
             "reason": "heartbeat unchanged for 6100 ms as seen by node-b (lease 5 s)"}
        ]}});
        let text = nodes(&doc);
        assert!(
            text.ends_with(
                "\nrecent takeovers (their owners went to live nodes):\n\
                 DECLARED DEAD  BY        AGO  OWNERS MOVED  WHY\n\
                 node-a         node-b  12.3s             2  heartbeat unchanged for 6100 ms as seen by node-b (lease 5 s)\n"
            ),
            "{text}"
        );
    }
}
