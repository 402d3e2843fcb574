//! `ciphermq-pki list`: what the PKI holds (the CA, the server certificate with its
//! names, each client certificate, which CNs have X25519 keys), with expiry dates
//! and whatever is wrong with a file. Reading never fails on one bad file: the
//! problem is shown on its line.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};
use time::OffsetDateTime;

use super::files::{exists, file_names, read_to_string};
use super::leaf::{common_name, sans_of, signed_by};
use super::secrets::X25519Keys;
use super::{ca, names, PkiError, PkiOptions, SERVER_COMMON_NAME};

/// What exists, as `ciphermq-pki list` shows it (and `--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// The certificate directory.
    pub certs_dir: PathBuf,
    /// The X25519 key directory.
    pub keys_dir: PathBuf,
    /// The CA directory (where a new CA key goes).
    pub ca_dir: PathBuf,
    /// The CA, if `ca.crt` exists.
    pub ca: Option<CaEntry>,
    /// The server certificate, if it exists.
    pub server: Option<CertEntry>,
    /// Every other `*.crt` of the certificate directory, by file name.
    pub clients: Vec<CertEntry>,
    /// `aes.key`, if it exists.
    pub aes_key: Option<PathBuf>,
    /// X25519 key files of CNs without a client certificate here (a sender's
    /// cached public keys of receivers elsewhere, or leftovers).
    pub other_keys: Vec<KeysEntry>,
    /// The CA key in the old place, or two CA keys.
    pub warnings: Vec<String>,
}

/// The CA's certificate and where its key is.
#[derive(Debug, Clone, Serialize)]
pub struct CaEntry {
    /// `ca.crt`.
    pub certificate: PathBuf,
    /// The key in use, if one exists.
    pub key: Option<PathBuf>,
    /// The key sits beside the leaf keys (the old layout).
    pub key_beside_leaf_keys: bool,
    /// Expiry (RFC 3339 in JSON).
    #[serde(serialize_with = "rfc3339")]
    pub not_after: Option<OffsetDateTime>,
    /// What is wrong, if anything.
    pub problem: Option<String>,
}

/// One leaf certificate.
#[derive(Debug, Clone, Serialize)]
pub struct CertEntry {
    /// The CN in the certificate (the file stem if it cannot be read).
    pub cn: String,
    /// The file.
    pub certificate: PathBuf,
    /// Expiry (RFC 3339 in JSON).
    #[serde(serialize_with = "rfc3339")]
    pub not_after: Option<OffsetDateTime>,
    /// Whole days until expiry (negative once expired).
    pub days_left: Option<i64>,
    /// The subject alternative names (the server's).
    pub sans: Vec<String>,
    /// Which X25519 key files exist for this CN.
    pub x25519: X25519Keys,
    /// What is wrong, if anything: expired, key missing, not issued by the CA …
    pub problem: Option<String>,
}

/// X25519 key files of a CN without a certificate.
#[derive(Debug, Clone, Serialize)]
pub struct KeysEntry {
    /// The CN (the file name's stem).
    pub cn: String,
    /// Which files exist.
    pub x25519: X25519Keys,
}

/// Reads what exists in the directories of `opts` (only the directories and
/// [`PkiOptions::ca_dir`] are used).
pub fn inventory(opts: &PkiOptions) -> Result<Inventory, PkiError> {
    let now = OffsetDateTime::now_utc();
    let ca_dir = opts.ca_dir();
    let mut warnings = Vec::new();
    let ca_files = match ca::locate(&opts.out_dir, &ca_dir) {
        Ok(files) => files,
        Err(err @ PkiError::TwoCaKeys { .. }) => {
            warnings.push(err.to_string());
            ca::CaFiles {
                crt: opts.out_dir.join("ca.crt"),
                key: ca_dir.join("ca.key"),
                legacy: false,
            }
        }
        Err(err) => return Err(err),
    };
    if ca_files.legacy {
        warnings.push(ca::legacy_warning(&ca_files.key, &ca_dir));
    }

    let mut ca_der = None;
    let ca = if exists(&ca_files.crt)? {
        let key = exists(&ca_files.key)?.then(|| ca_files.key.clone());
        let (not_after, mut problems) = match read_certificate(&ca_files.crt) {
            Ok(der) => {
                let not_after = x509_parser::parse_x509_certificate(&der)
                    .ok()
                    .map(|(_, cert)| cert.validity().not_after.to_datetime());
                ca_der = Some(der);
                (not_after, Vec::new())
            }
            Err(problem) => (None, vec![problem]),
        };
        if key.is_none() {
            problems.push(format!("its key {} is missing", ca_files.key.display()));
        }
        if not_after.is_some_and(|t| t <= now) {
            problems.push("expired".into());
        }
        Some(CaEntry {
            certificate: ca_files.crt.clone(),
            key,
            key_beside_leaf_keys: ca_files.legacy,
            not_after,
            problem: join(problems),
        })
    } else {
        None
    };

    let mut server = None;
    let mut clients = Vec::new();
    for name in file_names(&opts.out_dir)? {
        let Some(stem) = name.strip_suffix(".crt") else {
            continue;
        };
        match stem {
            "ca" => {}
            "server" => {
                server = Some(describe(
                    opts,
                    stem,
                    Some(SERVER_COMMON_NAME),
                    ca_der.as_deref(),
                    now,
                )?)
            }
            _ => clients.push(describe(opts, stem, None, ca_der.as_deref(), now)?),
        }
    }

    let mut other_keys = Vec::new();
    for name in file_names(&opts.keys_dir)? {
        let Some(cn) = name
            .strip_suffix("_private.key")
            .or_else(|| name.strip_suffix("_public.key"))
        else {
            continue;
        };
        let known =
            clients.iter().any(|c| c.cn == cn) || other_keys.iter().any(|k: &KeysEntry| k.cn == cn);
        if !known {
            other_keys.push(KeysEntry {
                cn: cn.to_owned(),
                x25519: X25519Keys::of(&opts.keys_dir, cn)?,
            });
        }
    }
    let aes = opts.out_dir.join("aes.key");
    Ok(Inventory {
        certs_dir: opts.out_dir.clone(),
        keys_dir: opts.keys_dir.clone(),
        ca_dir,
        ca,
        server,
        clients,
        aes_key: exists(&aes)?.then_some(aes),
        other_keys,
        warnings,
    })
}

/// Reads one leaf certificate `{out_dir}/{stem}.crt` and notes what is wrong with
/// it.
fn describe(
    opts: &PkiOptions,
    stem: &str,
    expected_cn: Option<&str>,
    ca_der: Option<&[u8]>,
    now: OffsetDateTime,
) -> Result<CertEntry, PkiError> {
    let path = opts.out_dir.join(format!("{stem}.crt"));
    let key_path = opts.out_dir.join(format!("{stem}.key"));
    let mut entry = CertEntry {
        cn: stem.to_owned(),
        certificate: path.clone(),
        not_after: None,
        days_left: None,
        sans: Vec::new(),
        x25519: X25519Keys::None,
        problem: None,
    };
    let mut problems = Vec::new();
    match read_certificate(&path) {
        Err(problem) => problems.push(problem),
        Ok(der) => match x509_parser::parse_x509_certificate(&der) {
            Err(e) => problems.push(format!("not a readable certificate: {e}")),
            Ok((_, cert)) => {
                let cn = common_name(&cert).unwrap_or_default();
                let expected = expected_cn.unwrap_or(stem);
                if cn != expected {
                    problems.push(format!("its CN is {cn:?}, not {expected:?}"));
                }
                entry.cn = cn;
                let not_after = cert.validity().not_after.to_datetime();
                entry.not_after = Some(not_after);
                entry.days_left = Some((not_after - now).whole_days());
                if not_after <= now {
                    problems.push("expired".into());
                }
                entry.sans = sans_of(&cert).iter().map(ToString::to_string).collect();
                match ca_der {
                    None => problems.push("no CA to check it against".into()),
                    Some(ca) => {
                        if let Err(reason) = signed_by(&cert, ca) {
                            problems.push(reason);
                        }
                    }
                }
            }
        },
    }
    if !exists(&key_path)? {
        problems.push(format!("its key {} is missing", key_path.display()));
    }
    if expected_cn.is_none() && names::validate_cn(&entry.cn).is_ok() {
        entry.x25519 = X25519Keys::of(&opts.keys_dir, &entry.cn)?;
    }
    entry.problem = join(problems);
    Ok(entry)
}

/// The DER of a certificate file, or why it cannot be read.
fn read_certificate(path: &Path) -> Result<Vec<u8>, String> {
    let pem = read_to_string(path).map_err(|e| format!("unreadable: {e}"))?;
    ca::first_certificate(&pem)
}

/// Problems as one line, or none.
fn join(problems: Vec<String>) -> Option<String> {
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// `YYYY-MM-DD HH:MM UTC`, for people.
pub(super) fn human_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SSZ`) for JSON, `null` when unknown.
fn rfc3339<S: Serializer>(t: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        None => s.serialize_none(),
        Some(t) => {
            let t = t.to_offset(time::UtcOffset::UTC);
            s.serialize_str(&format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            ))
        }
    }
}

impl fmt::Display for Inventory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = |t: Option<OffsetDateTime>| t.map(human_time).unwrap_or_else(|| "?".into());
        match &self.ca {
            None => writeln!(
                f,
                "CA      none in {} (run `ciphermq-pki init`)",
                self.certs_dir.display()
            )?,
            Some(ca) => {
                writeln!(
                    f,
                    "CA      {}  valid until {}",
                    ca.certificate.display(),
                    when(ca.not_after)
                )?;
                match &ca.key {
                    Some(key) => writeln!(f, "        key {}", key.display())?,
                    None => writeln!(f, "        key missing")?,
                }
                if let Some(problem) = &ca.problem {
                    writeln!(f, "        problem: {problem}")?;
                }
            }
        }
        match &self.server {
            None => writeln!(f, "server  none")?,
            Some(server) => {
                writeln!(
                    f,
                    "server  {}  valid until {}{}",
                    server.certificate.display(),
                    when(server.not_after),
                    days(server.days_left)
                )?;
                writeln!(f, "        names: {}", server.sans.join(", "))?;
                if let Some(problem) = &server.problem {
                    writeln!(f, "        problem: {problem}")?;
                }
            }
        }
        match &self.aes_key {
            Some(path) => writeln!(f, "AES key {}", path.display())?,
            None => writeln!(f, "AES key none")?,
        }
        writeln!(f)?;
        if self.clients.is_empty() {
            writeln!(f, "no client certificates")?;
        } else {
            let rows: Vec<[String; 5]> = self
                .clients
                .iter()
                .map(|c| {
                    [
                        c.cn.clone(),
                        when(c.not_after),
                        c.days_left.map(|d| d.to_string()).unwrap_or_default(),
                        c.x25519.as_str().to_owned(),
                        c.problem.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            table(f, ["CN", "VALID UNTIL", "DAYS", "X25519", "PROBLEM"], &rows)?;
        }
        if !self.other_keys.is_empty() {
            writeln!(
                f,
                "\nX25519 keys in {} without a client certificate:",
                self.keys_dir.display()
            )?;
            for keys in &self.other_keys {
                writeln!(f, "  {}  {}", keys.cn, keys.x25519.as_str())?;
            }
        }
        Ok(())
    }
}

/// ` (N days)` or nothing.
fn days(left: Option<i64>) -> String {
    left.map(|d| format!(" ({d} days)")).unwrap_or_default()
}

/// Left-aligned columns, two spaces apart, no trailing blanks.
fn table<const N: usize>(
    f: &mut fmt::Formatter<'_>,
    header: [&str; N],
    rows: &[[String; N]],
) -> fmt::Result {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: [&str; N]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < N {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(f, "{}", out.trim_end())
    };
    line(header)?;
    for row in rows {
        line(row.each_ref().map(String::as_str))?;
    }
    Ok(())
}
