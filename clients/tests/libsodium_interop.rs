//! Our hybrid encryption against libsodium itself (through PyNaCl, which bundles
//! it): sealed boxes made by either side open on the other, whole messages made by
//! either side decrypt on the other, and tampered or re-labelled messages are
//! refused by both.
//!
//! Needs `python3` with PyNaCl (`python3 -m pip install pynacl`; `scripts/test.sh`
//! installs it). Without `python3` at all the tests print a loud SKIPPED notice; with
//! `python3` but without PyNaCl they fail, so a CI that lost the module notices.
//! `CIPHERMQ_PYTHON` names another interpreter.

use std::io::{ErrorKind, Write};
use std::process::{Command, Stdio};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ciphermq_clients::crypto::{
    self, decrypt, encrypt, generate_secret_key, CryptoError, EncryptedInputData, PublicKey,
    SecretKey,
};
use serde_json::{json, Value};

/// The libsodium side: runs a list of operations, answers one result per operation
/// (`{"ok": …}` or `{"err": "…"}`), so one interpreter start serves a whole test.
const SODIUM_SCRIPT: &str = r#"
import sys, json, base64
try:
    import nacl.bindings as b
    import nacl.utils
except ImportError as e:
    print(json.dumps({"import_error": str(e)}))
    sys.exit(0)
def D(s):
    return base64.b64decode(s, validate=True)
def E(x):
    return base64.b64encode(x).decode()
out = []
for op in json.load(sys.stdin)["ops"]:
    kind = op["op"]
    try:
        if kind == "pk_from_sk":
            r = E(b.crypto_scalarmult_base(D(op["sk"])))
        elif kind == "seal":
            r = E(b.crypto_box_seal(D(op["data"]), D(op["pk"])))
        elif kind == "seal_open":
            r = E(b.crypto_box_seal_open(D(op["sealed"]), D(op["pk"]), D(op["sk"])))
        elif kind == "encrypt":
            key = nacl.utils.random(32)
            nonce = nacl.utils.random(12)
            ct = b.crypto_aead_chacha20poly1305_ietf_encrypt(
                D(op["plaintext"]), op["message_id"].encode(), nonce, key)
            r = {"message_id": op["message_id"], "receiver_client_id": op["receiver"],
                 "enc_session_key": E(b.crypto_box_seal(key, D(op["pk"]))),
                 "nonce": E(nonce), "ciphertext": E(ct)}
        elif kind == "decrypt":
            m = op["msg"]
            key = b.crypto_box_seal_open(D(m["enc_session_key"]), D(op["pk"]), D(op["sk"]))
            r = E(b.crypto_aead_chacha20poly1305_ietf_decrypt(
                D(m["ciphertext"]), m["message_id"].encode(), D(m["nonce"]), key))
        else:
            raise ValueError("unknown op " + kind)
        out.append({"ok": r})
    except Exception as e:
        out.append({"err": type(e).__name__ + ": " + str(e)})
print(json.dumps({"results": out}))
"#;

/// Runs `ops` through libsodium; `None` (after a loud notice) only when there is no
/// Python interpreter at all.
fn sodium(ops: Vec<Value>) -> Option<Vec<Value>> {
    let python = std::env::var("CIPHERMQ_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let child = Command::new(&python)
        .arg("-c")
        .arg(SODIUM_SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            eprintln!(
                "\n\n*** SKIPPED: libsodium interop test: `{python}` not found. Install python3 and \
                 `python3 -m pip install pynacl` (scripts/test.sh does) to run it. ***\n"
            );
            return None;
        }
        Err(e) => panic!("cannot start {python}: {e}"),
    };
    let input = serde_json::to_vec(&json!({ "ops": ops })).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{python} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{python} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    if let Some(err) = reply.get("import_error") {
        panic!(
            "PyNaCl (libsodium for Python) is missing for {python}: {err}. \
             Install it with `{python} -m pip install pynacl` (scripts/test.sh does)."
        );
    }
    let results = reply["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), ops.len());
    Some(results)
}

fn ok(result: &Value) -> &Value {
    match result.get("ok") {
        Some(v) => v,
        None => panic!("libsodium failed: {result}"),
    }
}

fn ok_bytes(result: &Value) -> Vec<u8> {
    B64.decode(ok(result).as_str().unwrap()).unwrap()
}

fn is_err(result: &Value) -> bool {
    result.get("err").is_some()
}

fn keys() -> (SecretKey, PublicKey, String, String) {
    let sk = generate_secret_key();
    let pk = sk.public_key();
    let sk_b64 = B64.encode(sk.to_bytes());
    let pk_b64 = crypto::public_key_to_base64(&pk);
    (sk, pk, sk_b64, pk_b64)
}

/// Plaintexts of interesting sizes: empty, one byte, a key, a 1 KiB body, 64 KiB.
fn plaintexts() -> Vec<Vec<u8>> {
    vec![
        Vec::new(),
        vec![0x42],
        (0..32).collect(),
        "é".repeat(512).into_bytes(),
        (0..65536u32).map(|i| (i * 7) as u8).collect(),
    ]
}

#[test]
fn libsodium_derives_the_same_public_keys() {
    let pairs: Vec<_> = (0..4).map(|_| keys()).collect();
    let ops = pairs
        .iter()
        .map(|(_, _, sk, _)| json!({"op": "pk_from_sk", "sk": sk}))
        .collect();
    let Some(results) = sodium(ops) else { return };
    for ((_, _, _, pk), r) in pairs.iter().zip(&results) {
        assert_eq!(ok(r).as_str().unwrap(), pk);
    }
}

#[test]
fn our_sealed_boxes_open_with_libsodium() {
    let (_, pk, sk_b64, pk_b64) = keys();
    let data = plaintexts();
    let ops = data
        .iter()
        .map(|d| {
            let sealed = pk.seal(&mut rand::rngs::OsRng, d).unwrap();
            assert_eq!(sealed.len(), d.len() + crypto::SEAL_OVERHEAD);
            json!({"op": "seal_open", "sealed": B64.encode(sealed), "pk": pk_b64, "sk": sk_b64})
        })
        .collect();
    let Some(results) = sodium(ops) else { return };
    for (d, r) in data.iter().zip(&results) {
        assert_eq!(&ok_bytes(r), d);
    }
}

#[test]
fn libsodium_sealed_boxes_open_with_ours() {
    let (sk, _, _, pk_b64) = keys();
    let (other, _, _, _) = keys();
    let data = plaintexts();
    let ops = data
        .iter()
        .map(|d| json!({"op": "seal", "data": B64.encode(d), "pk": pk_b64}))
        .collect();
    let Some(results) = sodium(ops) else { return };
    for (d, r) in data.iter().zip(&results) {
        let sealed = ok_bytes(r);
        assert_eq!(&sk.unseal(&sealed).unwrap(), d);
        assert!(other.unseal(&sealed).is_err(), "opened with the wrong key");
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(sk.unseal(&tampered).is_err(), "tampered box opened");
    }
}

#[test]
fn our_messages_decrypt_with_libsodium_and_tampering_is_refused() {
    let (_, pk, sk_b64, pk_b64) = keys();
    let (_, _, other_sk_b64, other_pk_b64) = keys();
    let mut ops = Vec::new();
    let data = plaintexts();
    for (i, d) in data.iter().enumerate() {
        let id = format!("sender_1-run.{i}-receiver_1");
        let msg = encrypt(&pk, &id, "receiver_1", d).unwrap();
        ops.push(json!({"op": "decrypt", "msg": msg, "pk": pk_b64, "sk": sk_b64}));
    }
    let base = encrypt(
        &pk,
        "sender_1-run.1-receiver_1",
        "receiver_1",
        b"top secret",
    )
    .unwrap();
    let mut ct = B64.decode(&base.ciphertext).unwrap();
    ct[3] ^= 0x10;
    let tampered = EncryptedInputData {
        ciphertext: B64.encode(&ct),
        ..base.clone()
    };
    let relabelled = EncryptedInputData {
        message_id: "sender_1-run.2-receiver_1".into(),
        ..base.clone()
    };
    let mut nonce = B64.decode(&base.nonce).unwrap();
    nonce[0] ^= 1;
    let renonced = EncryptedInputData {
        nonce: B64.encode(&nonce),
        ..base.clone()
    };
    for bad in [&tampered, &relabelled, &renonced] {
        ops.push(json!({"op": "decrypt", "msg": bad, "pk": pk_b64, "sk": sk_b64}));
    }
    ops.push(json!({"op": "decrypt", "msg": base, "pk": other_pk_b64, "sk": other_sk_b64}));
    ops.push(json!({"op": "decrypt", "msg": base, "pk": pk_b64, "sk": sk_b64}));

    let Some(results) = sodium(ops) else { return };
    for (d, r) in data.iter().zip(&results) {
        assert_eq!(&ok_bytes(r), d);
    }
    let rest = &results[data.len()..];
    assert!(
        is_err(&rest[0]),
        "tampered ciphertext accepted: {}",
        rest[0]
    );
    assert!(
        is_err(&rest[1]),
        "ciphertext accepted under another message id: {}",
        rest[1]
    );
    assert!(is_err(&rest[2]), "altered nonce accepted: {}", rest[2]);
    assert!(is_err(&rest[3]), "opened by another receiver: {}", rest[3]);
    assert_eq!(ok_bytes(&rest[4]), b"top secret");
}

#[test]
fn libsodium_messages_decrypt_with_ours_and_tampering_is_refused() {
    let (sk, _, _, pk_b64) = keys();
    let (other_sk, _, _, _) = keys();
    let data = plaintexts();
    let ops = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            json!({"op": "encrypt", "plaintext": B64.encode(d), "pk": pk_b64,
                   "message_id": format!("sender_1-py.{i}-receiver_1"), "receiver": "receiver_1"})
        })
        .collect();
    let Some(results) = sodium(ops) else { return };
    for (d, r) in data.iter().zip(&results) {
        let msg: EncryptedInputData = serde_json::from_value(ok(r).clone()).unwrap();
        assert_eq!(&decrypt(&sk, &msg).unwrap(), d);
        assert_eq!(decrypt(&other_sk, &msg), Err(CryptoError::SessionKey));

        let relabelled = EncryptedInputData {
            message_id: format!("{}x", msg.message_id),
            ..msg.clone()
        };
        assert_eq!(decrypt(&sk, &relabelled), Err(CryptoError::Ciphertext));

        let mut ct = B64.decode(&msg.ciphertext).unwrap();
        ct[0] ^= 0x80;
        let tampered = EncryptedInputData {
            ciphertext: B64.encode(&ct),
            ..msg.clone()
        };
        assert_eq!(decrypt(&sk, &tampered), Err(CryptoError::Ciphertext));

        let mut sealed = B64.decode(&msg.enc_session_key).unwrap();
        sealed[50] ^= 4;
        let tampered_key = EncryptedInputData {
            enc_session_key: B64.encode(&sealed),
            ..msg
        };
        assert_eq!(decrypt(&sk, &tampered_key), Err(CryptoError::SessionKey));
    }
}
