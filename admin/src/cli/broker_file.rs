//! `--config`: the broker's own `config.toml`, read for what the tool needs
//! to reach that broker, so an operator names the file once instead of
//! repeating its addresses and certificate paths as flags.
//!
//! Only `server.address`, `tls.ca_cert_path` and `[admin]`'s `enabled` and
//! `address` are read; every other key is ignored (the broker checks its
//! own file). A key left out means the broker's default, and relative paths
//! are resolved against the file's directory, as the broker resolves them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The broker's `server.address` when its file does not set it.
pub(crate) const DEFAULT_BROKER: &str = "127.0.0.1:5700";
/// The broker's `admin.address` when its file does not set it.
pub(crate) const DEFAULT_ENDPOINT: &str = "127.0.0.1:9091";
/// The broker's `tls.ca_cert_path` when its file does not set it, and the
/// tool's `--ca` without a file.
pub(crate) const DEFAULT_CA: &str = "certs/ca.crt";
/// Where `ciphermq-pki` writes the admin certificate: the tool's `--cert`.
pub(crate) const DEFAULT_CERT: &str = "certs/admin.crt";
/// Its key: the tool's `--key`.
pub(crate) const DEFAULT_KEY: &str = "certs/admin.key";

/// Why a broker config file cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerFileError {
    /// The file could not be read.
    #[error("--config {}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not TOML, or a key the tool reads has the wrong type.
    #[error("--config {}: not a usable broker config file: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said (with the line and the key).
        message: String,
    },
    /// An address the command needs is not `host:port` with a port to
    /// connect to.
    #[error("--config {}: {key} = {value:?}: {reason}", path.display())]
    Address {
        /// The file.
        path: PathBuf,
        /// The dotted key.
        key: &'static str,
        /// Its value.
        value: String,
        /// What is wrong, and what to do instead.
        reason: String,
    },
}

/// The parts of `config.toml` the tool reads. Unknown keys are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileText {
    server: ServerPart,
    tls: TlsPart,
    admin: AdminPart,
}

/// `[server]`: the client port.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ServerPart {
    address: Option<String>,
}

/// `[tls]`: the CA that signs the broker's certificate as well as the
/// clients' (ciphermq-pki makes one CA for both).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TlsPart {
    ca_cert_path: Option<PathBuf>,
}

/// `[admin]`: whether the endpoint runs, and where.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AdminPart {
    enabled: Option<bool>,
    address: Option<String>,
}

/// What the tool takes from a broker's config file, defaults applied and
/// paths resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerFile {
    /// The file, as named.
    pub(crate) path: PathBuf,
    /// `admin.enabled` as the file sets it (`None`: unset, so off).
    pub(crate) admin_enabled: Option<bool>,
    /// `admin.address`, as written.
    admin_address: String,
    /// `server.address`, as written.
    broker_address: String,
    /// `tls.ca_cert_path`, resolved.
    pub(crate) ca: PathBuf,
    /// The admin certificate `ciphermq-pki` writes beside the file.
    pub(crate) cert: PathBuf,
    /// Its key.
    pub(crate) key: PathBuf,
}

impl BrokerFile {
    /// Reads and parses the broker config file at `path`.
    pub(crate) fn read(path: &Path) -> Result<BrokerFile, BrokerFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| BrokerFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        BrokerFile::parse(path, &text)
    }

    /// Parses `text`, the content of the file at `path` (which relative
    /// paths are resolved against).
    pub(crate) fn parse(path: &Path, text: &str) -> Result<BrokerFile, BrokerFileError> {
        let file: FileText = toml::from_str(text).map_err(|e| BrokerFileError::Parse {
            path: path.to_owned(),
            message: e.message().trim().replace('\n', "; ") + &at_line(text, e.span()),
        })?;
        // As the broker does: against the file's directory; a file named
        // without one keeps paths relative to the working directory.
        let base = path.parent().unwrap_or_else(|| Path::new(""));
        let resolve = |p: &Path| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                base.join(p)
            } else {
                p.to_owned()
            }
        };
        Ok(BrokerFile {
            path: path.to_owned(),
            admin_enabled: file.admin.enabled,
            admin_address: file
                .admin
                .address
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
            broker_address: file
                .server
                .address
                .unwrap_or_else(|| DEFAULT_BROKER.to_owned()),
            ca: resolve(
                file.tls
                    .ca_cert_path
                    .as_deref()
                    .unwrap_or(Path::new(DEFAULT_CA)),
            ),
            cert: resolve(Path::new(DEFAULT_CERT)),
            key: resolve(Path::new(DEFAULT_KEY)),
        })
    }

    /// Where to reach the admin endpoint (`admin.address`).
    pub(crate) fn endpoint(&self) -> Result<String, BrokerFileError> {
        self.reachable("admin.address", &self.admin_address, "--endpoint")
    }

    /// Where to reach the broker's client port (`server.address`).
    pub(crate) fn broker(&self) -> Result<String, BrokerFileError> {
        self.reachable("server.address", &self.broker_address, "--broker")
    }

    /// `admin.address` as written, for messages.
    pub(crate) fn admin_address(&self) -> &str {
        &self.admin_address
    }

    /// `address`, a listen address, as an address to connect to: a
    /// wildcard IP (`0.0.0.0`, `[::]`) listens on loopback too, so the
    /// tool connects there; port 0 names no port and is refused.
    fn reachable(
        &self,
        key: &'static str,
        address: &str,
        flag: &str,
    ) -> Result<String, BrokerFileError> {
        let err = |reason: String| BrokerFileError::Address {
            path: self.path.clone(),
            key,
            value: address.to_owned(),
            reason,
        };
        let Some((host, port)) = address.rsplit_once(':') else {
            return Err(err("not host:port".to_owned()));
        };
        match port.parse::<u16>() {
            Ok(0) => {
                return Err(err(format!(
                    "port 0 makes the broker take any free port, so the file cannot say \
                     which; pass {flag} with the address the broker logged at start"
                )))
            }
            Ok(_) => {}
            Err(_) => return Err(err("not host:port".to_owned())),
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        Ok(match bare.parse::<std::net::IpAddr>() {
            Ok(ip) if ip.is_unspecified() && ip.is_ipv4() => format!("127.0.0.1:{port}"),
            Ok(ip) if ip.is_unspecified() => format!("[::1]:{port}"),
            _ => address.to_owned(),
        })
    }
}

/// ` (line N: its text)` for the start of `span` in `text`, or nothing.
fn at_line(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(start) = span.map(|s| s.start.min(text.len())) else {
        return String::new();
    };
    let Some(before) = text.get(..start) else {
        return String::new();
    };
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let number = before.matches('\n').count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("").trim();
    format!(" (line {number}: `{line}`)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_is_read_with_paths_beside_it() {
        let shipped = include_str!("../../../config.toml");
        let file = BrokerFile::parse(Path::new("/etc/ciphermq/config.toml"), shipped).unwrap();
        assert_eq!(file.admin_enabled, Some(false));
        assert_eq!(file.endpoint().unwrap(), "127.0.0.1:9091");
        assert_eq!(file.broker().unwrap(), "127.0.0.1:5700");
        assert_eq!(file.ca, Path::new("/etc/ciphermq/certs/ca.crt"));
        assert_eq!(file.cert, Path::new("/etc/ciphermq/certs/admin.crt"));
        assert_eq!(file.key, Path::new("/etc/ciphermq/certs/admin.key"));
    }

    #[test]
    fn unset_keys_are_the_brokers_defaults_and_unknown_ones_are_ignored() {
        let file = BrokerFile::parse(
            Path::new("config.toml"),
            "[admin]\nenabled = true\nmax_connections = 9\n[futures]\nx = 1\n",
        )
        .unwrap();
        assert_eq!(file.admin_enabled, Some(true));
        assert_eq!(file.endpoint().unwrap(), DEFAULT_ENDPOINT);
        assert_eq!(file.broker().unwrap(), DEFAULT_BROKER);
        // Named without a directory: relative to the working directory, as
        // for the broker.
        assert_eq!(file.ca, Path::new("certs/ca.crt"));
        let empty = BrokerFile::parse(Path::new("c.toml"), "").unwrap();
        assert_eq!(empty.admin_enabled, None);
    }

    #[test]
    fn wildcard_listen_addresses_are_reached_on_loopback() {
        let text = "[server]\naddress = \"0.0.0.0:5800\"\n[admin]\naddress = \"[::]:9191\"\n\
                    [tls]\nca_cert_path = \"/pki/ca.pem\"\n";
        let file = BrokerFile::parse(Path::new("/srv/b/config.toml"), text).unwrap();
        assert_eq!(file.broker().unwrap(), "127.0.0.1:5800");
        assert_eq!(file.endpoint().unwrap(), "[::1]:9191");
        assert_eq!(file.ca, Path::new("/pki/ca.pem"));
    }

    #[test]
    fn a_bad_file_is_named_with_its_problem() {
        let path = Path::new("/etc/ciphermq/config.toml");
        let e = BrokerFile::parse(path, "[server]\nshards = 2\n[admin\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--config /etc/ciphermq/config.toml: not a usable broker config file")
                && e.contains("line 3"),
            "{e}"
        );
        let e = BrokerFile::parse(path, "[admin]\naddress = 9091\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.toml") && e.contains("string"), "{e}");
        let zero = BrokerFile::parse(path, "[admin]\naddress = \"127.0.0.1:0\"\n").unwrap();
        let e = zero.endpoint().unwrap_err().to_string();
        assert!(
            e.contains("admin.address = \"127.0.0.1:0\"") && e.contains("--endpoint"),
            "{e}"
        );
        let e = BrokerFile::parse(path, "[server]\naddress = \"nowhere\"\n")
            .unwrap()
            .broker()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server.address") && e.contains("host:port"),
            "{e}"
        );
        let e = BrokerFile::read(Path::new("/nonexistent/config.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--config /nonexistent/config.toml: cannot read"),
            "{e}"
        );
    }
}
