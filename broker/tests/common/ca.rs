//! The files of the shared test PKI ([`super::pki`]) for a broker whose
//! certificates a test replaces; the CA that issues them is
//! `ciphermq_testkit::ca::TestCa`, loaded from `pki().certs`.

use super::pki;

/// A directory holding a copy of the test PKI's `ca.crt`, `server.crt` and
/// `server.key`, for a broker whose `[tls]` files a test replaces.
pub fn tls_dir() -> tempfile::TempDir {
    ciphermq_testkit::pki::tls_dir(&pki().certs)
}
