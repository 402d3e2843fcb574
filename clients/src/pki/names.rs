//! The names the PKI accepts: client CNs (the protocol's name rule, and file
//! names that never shadow the PKI's own files) and the server's SANs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rcgen::{Ia5String, SanType};

use super::PkiError;

/// File stems that belong to the PKI itself and so cannot be client CNs: a client
/// named `ca` would overwrite `ca.crt`, one named `aes` the AES key.
const RESERVED_STEMS: [&str; 3] = ["ca", "server", "aes"];

/// The longest file name most Linux file systems store (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// What the longest file of a CN adds to it: `{cn}.crt` plus the atomic writer's
/// temporary name `.{name}.XXXXXX`; for a receiver `{cn}_private.key` plus that.
const CLIENT_NAME_EXTRA: usize = ".crt".len() + ".".len() + ".XXXXXX".len();
const RECEIVER_NAME_EXTRA: usize = "_private.key".len() + ".".len() + ".XXXXXX".len();

/// The file names of a CN must fit the file system: the name rule allows 255
/// bytes, the files allow 243 (235 for a receiver). Checked before anything is
/// written, instead of failing on the first file.
pub(super) fn validate_file_names(cn: &str, receiver: bool) -> Result<(), PkiError> {
    let extra = if receiver {
        RECEIVER_NAME_EXTRA
    } else {
        CLIENT_NAME_EXTRA
    };
    if cn.len() + extra > NAME_MAX {
        return Err(PkiError::InvalidName {
            name: cn.to_owned(),
            reason: format!(
                "{} bytes is too long for its files: file names stop at {NAME_MAX} bytes, so a {} CN may have at most {} bytes",
                cn.len(),
                if receiver { "receiver's" } else { "client's" },
                NAME_MAX - extra
            ),
        });
    }
    Ok(())
}

/// A CN becomes a file name and a broker identity: it must follow the protocol's name
/// rule `[A-Za-z0-9_.:-]{1,255}`, must not be `.`/`..`, and must not shadow a file of
/// the PKI itself.
pub(super) fn validate_cn(cn: &str) -> Result<(), PkiError> {
    let invalid = |reason: &str| PkiError::InvalidName {
        name: cn.to_owned(),
        reason: reason.to_owned(),
    };
    if cn.is_empty() || cn.len() > 255 {
        return Err(invalid("a CN must be 1 to 255 bytes long"));
    }
    if !cn
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
    {
        return Err(invalid(
            "a CN may only contain A-Z a-z 0-9 _ . : - (the rule [A-Za-z0-9_.:-]{1,255})",
        ));
    }
    if cn == "." || cn == ".." {
        return Err(invalid("a CN cannot be a directory name"));
    }
    if RESERVED_STEMS.contains(&cn) {
        return Err(invalid(
            "this name is used by the PKI's own files (ca, server, aes)",
        ));
    }
    Ok(())
}

/// One subject alternative name of the server certificate. DNS names are kept in
/// lower case, so comparing names compares what TLS compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum San {
    /// A DNS name (possibly `*.` wildcard).
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl San {
    /// The rcgen form, for signing.
    pub(super) fn to_rcgen(&self) -> Result<SanType, PkiError> {
        Ok(match self {
            San::Dns(name) => {
                SanType::DnsName(Ia5String::try_from(name.as_str()).map_err(|e| {
                    PkiError::InvalidName {
                        name: name.clone(),
                        reason: e.to_string(),
                    }
                })?)
            }
            San::Ip(ip) => SanType::IpAddress(*ip),
        })
    }
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            San::Dns(name) => f.write_str(name),
            San::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// The server certificate's SANs: localhost, 127.0.0.1 and ::1, then the extra names
/// (IPs as IP SANs, the rest as DNS SANs), without repeats.
pub(super) fn server_sans(extra: &[String]) -> Result<Vec<San>, PkiError> {
    let mut sans = vec![
        San::Dns("localhost".into()),
        San::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        San::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ];
    for name in extra {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => San::Ip(ip),
            Err(_) => San::Dns(dns_name(name)?),
        };
        push_new(&mut sans, san);
    }
    Ok(sans)
}

/// `first`, then the names of `second` it lacks: a re-issued server certificate
/// never drops a name it had.
pub(super) fn union(first: &[San], second: &[San]) -> Vec<San> {
    let mut all = first.to_vec();
    for san in second {
        push_new(&mut all, san.clone());
    }
    all
}

/// Appends `san` unless it is there already.
fn push_new(sans: &mut Vec<San>, san: San) {
    if !sans.contains(&san) {
        sans.push(san);
    }
}

/// Checks a DNS SAN: ASCII letters, digits, `-`, `.`, and a leading `*.` wildcard;
/// returns it in lower case.
fn dns_name(name: &str) -> Result<String, PkiError> {
    let invalid = |reason: &str| PkiError::InvalidName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let host = name.strip_prefix("*.").unwrap_or(name);
    if host.is_empty() || name.len() > 253 {
        return Err(invalid("a DNS name must be 1 to 253 bytes long"));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(invalid(
            "not an IP address, and a DNS name may only contain A-Z a-z 0-9 - .",
        ));
    }
    Ok(name.to_ascii_lowercase())
}
