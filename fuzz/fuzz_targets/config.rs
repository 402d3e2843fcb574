//! `config`: the text of a `config.toml`, as `Config::from_toml_str` gets it.
//!
//! The input is the file's bytes (made UTF-8 lossily, as `Config::load`
//! refuses a file that is not UTF-8). Relative paths resolve against a
//! scratch directory that holds the TLS files the defaults name, so a valid
//! configuration gets through the file checks too. Checked: no panic, and an
//! accepted configuration passes `validate` again.

#![no_main]

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use ciphermq_broker::Config;
use libfuzzer_sys::fuzz_target;

/// The base directory, made once per process: (its guard, its path).
static BASE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (_, base) = BASE.get_or_init(base_dir);
    if let Ok(config) = Config::from_toml_str(&text, base) {
        if let Err(e) = config.validate() {
            panic!("an accepted configuration fails validation: {e}");
        }
    }
});

/// A temp dir with the files the default configuration names.
fn base_dir() -> (tempfile::TempDir, PathBuf) {
    // Reading the AES key from the environment would make runs differ.
    std::env::remove_var(ciphermq_broker::config::ENV_AES_KEY);
    let root = tempfile::Builder::new()
        .prefix("ciphermq-fuzz-config-")
        .tempdir()
        .expect("a temp dir");
    let base = root.path().to_path_buf();
    for file in ["certs/server.crt", "certs/server.key", "certs/ca.crt"] {
        let path = base.join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"").unwrap();
    }
    (root, base)
}
