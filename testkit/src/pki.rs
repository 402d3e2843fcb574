//! Certificates for tests, made by the same code as `ciphermq-pki`: a CA,
//! a `localhost` server certificate and a client certificate per CN. Every
//! test crate used to make its own; they differ only in the CNs.

use std::path::{Path, PathBuf};

use ciphermq_clients::pki::{self, PkiOptions};

/// Makes a PKI in `dir/certs` (certificates and keys of the server and of
/// `clients`) and `dir/keys` (receivers' X25519 pairs), its CA's key in
/// `dir/ca`; returns the options it was made with.
pub fn generate(dir: &Path, clients: &[&str]) -> PkiOptions {
    generate_with_receivers(dir, clients, &[])
}

/// [`generate`], with an X25519 pair in `dir/keys` for each of `receivers`
/// too (for tests that encrypt end to end).
pub fn generate_with_receivers(dir: &Path, clients: &[&str], receivers: &[&str]) -> PkiOptions {
    let mut opts = PkiOptions::new(dir.join("certs"), dir.join("keys"));
    opts.client_cns = clients.iter().map(|s| s.to_string()).collect();
    opts.receiver_cns = receivers.iter().map(|s| s.to_string()).collect();
    pki::generate(&opts).expect("generate the test PKI");
    opts
}

/// A PKI in a temporary directory of its own, removed when dropped: for a
/// PKI shared by the tests of one binary (certificates are slow to make).
pub struct TempPki {
    dir: tempfile::TempDir,
    /// The certificates and their keys (`ca.crt`, `server.crt`, `{cn}.crt`).
    pub certs: PathBuf,
    /// Receivers' X25519 key pairs.
    pub keys: PathBuf,
}

impl TempPki {
    /// Makes a PKI with a certificate for each of `clients`.
    pub fn new(clients: &[&str]) -> TempPki {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = generate(dir.path(), clients);
        TempPki {
            certs: opts.out_dir,
            keys: opts.keys_dir,
            dir,
        }
    }

    /// The temporary directory holding it, for more files that should go
    /// with it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A directory holding a copy of `ca.crt`, `server.crt` and `server.key`
/// from `certs`, for a broker whose `[tls]` files a test replaces.
pub fn tls_dir(certs: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["ca.crt", "server.crt", "server.key"] {
        std::fs::copy(certs.join(name), dir.path().join(name)).expect("copy");
    }
    dir
}
