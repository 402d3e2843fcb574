//! Value checks several sections share: `host:port` addresses, paths that
//! must not be empty, files that must exist.

use std::io;
use std::net::SocketAddr;
use std::path::Path;

use super::ConfigError;

/// Accepts `ip:port`, `[ipv6]:port` and `hostname:port` (port 0 allowed).
pub(super) fn check_host_port(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let ok = value.rsplit_once(':').is_some_and(|(host, port)| {
        port.parse::<u16>().is_ok()
            && !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            format!("{value:?} is not host:port (e.g. \"127.0.0.1:5700\" or \"[::1]:5700\")"),
        ))
    }
}

pub(super) fn check_non_empty_path(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        Err(ConfigError::invalid(key, "must not be empty"))
    } else {
        Ok(())
    }
}

/// Checks that `path` is an existing regular file; `hint` (e.g. how to create
/// it) is appended when it does not exist.
pub(super) fn check_file(key: &str, path: &Path, hint: &str) -> Result<(), ConfigError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(ConfigError::invalid(
            key,
            format!("{} is not a regular file", path.display()),
        )),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(ConfigError::invalid(
            key,
            format!("file {} does not exist{hint}", path.display()),
        )),
        Err(err) => Err(ConfigError::invalid(
            key,
            format!("cannot access {}: {err}", path.display()),
        )),
    }
}
