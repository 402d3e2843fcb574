//! `ciphermq-sender` and `ciphermq-receiver` through the real binaries: run
//! without `--config` where there is no `config.json`, they say to pass one
//! and where the demo's are, instead of a bare "No such file"; a
//! `config.json` in the working directory is still read.

use std::path::Path;
use std::process::{Command, Output};

fn run(tool: &str, dir: &Path, args: &[&str]) -> Output {
    let exe = match tool {
        "sender" => env!("CARGO_BIN_EXE_ciphermq-sender"),
        _ => env!("CARGO_BIN_EXE_ciphermq-receiver"),
    };
    Command::new(exe)
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run the client")
}

#[test]
fn without_config_the_tools_say_to_pass_one_and_name_the_example() {
    let dir = tempfile::tempdir().unwrap();
    for tool in ["sender", "receiver"] {
        let out = run(tool, dir.path(), &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tool}: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "ciphermq-{tool}: no config file: pass --config PATH"
            )),
            "{tool}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("clients/examples/{tool}.json")),
            "{tool}: {stderr}"
        );
        assert!(!stderr.contains("os error"), "{tool}: {stderr}");
    }
}

#[test]
fn a_config_json_in_the_working_directory_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    // An unknown key: the error names the file, so it was the one read.
    std::fs::write(dir.path().join("config.json"), r#"{"no_such_key": 1}"#).unwrap();
    for tool in ["sender", "receiver"] {
        let out = run(tool, dir.path(), &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tool}: {stderr}");
        assert!(
            stderr.contains("config.json") && stderr.contains("no_such_key"),
            "{tool}: {stderr}"
        );
    }
}

#[test]
fn a_missing_config_named_by_the_flag_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    for tool in ["sender", "receiver"] {
        let out = run(tool, dir.path(), &["--config", "nope.json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tool}: {stderr}");
        assert!(
            stderr.contains("cannot read config file nope.json"),
            "{tool}: {stderr}"
        );
    }
}
