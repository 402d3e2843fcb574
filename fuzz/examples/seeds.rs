//! Writes the committed seed corpus, `fuzz/seeds/<target>/`, from real
//! inputs: request lines as docs/PROTOCOL.md shows them, publish bodies,
//! records made by the log's own encoder, queue directories as the broker
//! leaves them (clean, torn by a crash, with a dedup file, of an earlier
//! version), and the repository's `config.toml`.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --no-default-features --example seeds`
//! from the repository root; it replaces the files it writes and leaves any
//! others alone.

use std::fs;
use std::path::Path;

use ciphermq_fuzz::QueueFiles;
use ciphermq_shard::log::record::{encode, DedupEntries, PackedSeqs, Record};
use ciphermq_shard::log::segment::FILE_HEADER;

const BODY: &str = r#"{"message_id":"sender_1-42-receiver_1","receiver_client_id":"receiver_1","enc_session_key":"AAAA","nonce":"BBBB","ciphertext":"CCCC"}"#;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), bytes).unwrap();
    };

    // request: one line per file, every command.
    let lines = [
        ("declare_queue", "declare_queue orders".to_owned()),
        ("declare_exchange", "declare_exchange events topic".to_owned()),
        ("bind", "bind orders events eu.*.new".to_owned()),
        ("publish", format!("publish events eu.de.new {BODY}")),
        ("publish_batch", format!("publish_batch events eu.de.new [{BODY}, {{\"x\": 1}}]")),
        ("consume", "consume orders 64\r".to_owned()),
        ("fetch", "fetch orders 10".to_owned()),
        ("ack", "ack sender_1-42-receiver_1 orders".to_owned()),
        ("nack", "nack sender_1-42-receiver_1".to_owned()),
        ("keys", "register_public_key AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\nget_public_key receiver_1".to_owned()),
        ("short", "heartbeat\nresend\nquit".to_owned()),
    ];
    for (name, line) in lines {
        write("request", name, line.as_bytes());
    }

    // message: bodies and batches.
    write("message", "complete", BODY.as_bytes());
    write(
        "message",
        "escaped_id_extra_field",
        br#"{"message_id":"m\u0031","receiver_client_id":"r","enc_session_key":"k","nonce":"n","ciphertext":"c","extra":{"x":[1,2.5e3,null,true]}}"#,
    );
    write(
        "message",
        "missing_field",
        br#"{"message_id":"m1","nonce":"x"}"#,
    );
    write(
        "message",
        "batch",
        format!("[{BODY}, {{\"x\": 1}}, []]").as_bytes(),
    );

    // record: mode byte, then bytes (see the target's doc).
    let samples = records();
    let mut file = FILE_HEADER.to_vec();
    for r in &samples {
        encode(r, &mut file);
    }
    write("record", "v2_file", &[&[0u8][..], &file].concat());
    for (i, r) in samples.iter().enumerate() {
        let mut frame = Vec::new();
        encode(r, &mut frame);
        // Sealed mode: the frame body, kind and payload, alone.
        write(
            "record",
            &format!("sealed_{i}"),
            &[&[2u8][..], &frame[12..]].concat(),
        );
    }
    let v1 = v1_frames(&samples[..3]);
    write("record", "v1_frames", &[&[1u8][..], &v1].concat());
    let mut torn = file.clone();
    torn.truncate(file.len() - 5);
    torn.extend_from_slice(&[0u8; 32]);
    write("record", "v2_torn", &[&[0u8][..], &torn].concat());

    // recovery: queue directories.
    let segment = |records: &[Record<'_>]| {
        let mut out = FILE_HEADER.to_vec();
        for r in records {
            encode(r, &mut out);
        }
        out
    };
    let clean = QueueFiles {
        dedup: None,
        segments: vec![(0, segment(&samples[..4])), (2, segment(&samples[4..]))],
    };
    write("recovery", "two_segments", &clean.encode().unwrap());
    let mut cut = segment(&samples);
    cut.truncate(cut.len() - 3);
    let torn = QueueFiles {
        dedup: None,
        segments: vec![(0, cut)],
    };
    write("recovery", "torn_tail", &torn.encode().unwrap());
    let mut keys = Vec::new();
    DedupEntries::pack(&[(1, 1_700_000_000_000), (u128::MAX, 5)], &mut keys);
    let dedup = segment(&[Record::Dedup(DedupEntries::new(&keys).unwrap())]);
    let with_dedup = QueueFiles {
        dedup: Some((1, dedup)),
        segments: vec![(3, segment(&samples[..2]))],
    };
    write("recovery", "with_dedup_file", &with_dedup.encode().unwrap());
    let old = QueueFiles {
        dedup: None,
        segments: vec![(0, v1_frames(&samples[..3]))],
    };
    write("recovery", "earlier_version", &old.encode().unwrap());

    // The same records as frame bodies that the target seals itself
    // (flags: file header, sealed frames; one segment at base 0).
    let mut sealed = vec![0b1_1000u8, 0];
    for r in &samples {
        let mut frame = Vec::new();
        encode(r, &mut frame);
        let body = &frame[12..];
        sealed.push(u8::try_from(body.len()).unwrap());
        sealed.extend_from_slice(body);
    }
    write("recovery", "sealed_frames", &sealed);

    // config: the repository's example, and a few sections set.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.toml");
    write("config", "example", &fs::read(example).unwrap());
    write(
        "config",
        "small",
        b"[server]\naddress = \"[::1]:5700\"\nshards = 2\n\n[storage]\nmode = \"memory\"\n\n[encryption]\naes_key = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n",
    );
    write(
        "config",
        "errors",
        b"[server]\nshards = \"many\"\n[nope]\nx = 1\n[logging]\nlevel = \"info,ciphermq_shard=debug\"\n",
    );
}

/// One record of every kind this version writes.
fn records() -> Vec<Record<'static>> {
    static KEYS: [u8; 24] = [9; 24];
    // Sequence number 0, still owed when the queue was purged.
    static KEPT: [u8; 8] = [0; 8];
    vec![
        Record::Message {
            seq: 0,
            sender: "sender_1",
            message_id: "sender_1-42-receiver_1",
            exchange: "events",
            routing_key: "eu.de.new",
            sent_at_ms: 1_700_000_000_000,
            body: BODY,
        },
        Record::Message {
            seq: 1,
            sender: "sender_1",
            message_id: "m-1",
            exchange: "",
            routing_key: "",
            sent_at_ms: 1_700_000_000_001,
            body: "{}",
        },
        Record::Delivered {
            seq: 0,
            count: 2,
            delivered_at_ms: 1_700_000_000_100,
        },
        Record::Ack {
            seq: 1,
            acked_at_ms: 1_700_000_000_200,
            key: None,
        },
        Record::Message {
            seq: 2,
            sender: "s2",
            message_id: "m-2",
            exchange: "x",
            routing_key: "k",
            sent_at_ms: 1_700_000_000_300,
            body: "{\"a\": \"b c\"}",
        },
        Record::Dedup(DedupEntries::new(&KEYS).unwrap()),
        Record::Purge {
            upto: 3,
            kept: PackedSeqs::new(&KEPT).unwrap(),
        },
        Record::Padding,
    ]
}

/// `records` in the framing of earlier versions: length, CRC over kind and
/// payload, kind, payload.
fn v1_frames(records: &[Record<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        let mut v2 = Vec::new();
        encode(r, &mut v2);
        let body = &v2[12..];
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        out.extend_from_slice(body);
    }
    out
}
