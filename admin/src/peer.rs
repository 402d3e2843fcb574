//! Who an admin connection's client is: judged at the handshake, and again
//! at the first request after each reload that may change the answer.
//!
//! rustls checks a certificate against the CRLs once, at the handshake,
//! while a kept-alive connection may live for minutes after it. So a
//! connection keeps its client's certificate chain and the
//! [`BrokerView::judgement_version`] it was judged under; each request
//! compares that one number (an atomic load) and only when it moved judges
//! the chain again ([`BrokerView::identity`]: the identity under the
//! `tls.identity` in force, the revocation under the CRLs in force). What a
//! client may read or change is looked up per request anyway (`routes`), so
//! a CN that lost its role is refused at its next request too.

use std::sync::{Arc, Mutex, PoisonError};

use rustls_pki_types::CertificateDer;

use crate::broker_view::BrokerView;

/// A TLS client of the endpoint and what its certificate was last judged to
/// name.
pub(crate) struct Peer {
    /// The chain the client presented at the handshake.
    certs: Vec<CertificateDer<'static>>,
    /// The judgement version last judged under, and the outcome: the
    /// identity, or why the certificate names no client.
    judged: Mutex<(u64, Result<Arc<str>, String>)>,
}

impl Peer {
    /// Judges `certs` under the configuration in force now.
    pub(crate) fn judge(broker: &dyn BrokerView, certs: Vec<CertificateDer<'static>>) -> Peer {
        // Read before judging: a reload in between is judged again next time.
        let version = broker.judgement_version();
        let outcome = broker.identity(&certs).map(Arc::from);
        Peer {
            certs,
            judged: Mutex::new((version, outcome)),
        }
    }

    /// The client's identity under the configuration in force now, or why
    /// its certificate names no client any more (revoked, or no identity
    /// under a reloaded `tls.identity`). Judges the chain again only when a
    /// reload moved the judgement version since the last time.
    pub(crate) fn identity(&self, broker: &dyn BrokerView) -> Result<Arc<str>, String> {
        let version = broker.judgement_version();
        let mut judged = self.judged.lock().unwrap_or_else(PoisonError::into_inner);
        if judged.0 != version {
            *judged = (version, broker.identity(&self.certs).map(Arc::from));
        }
        judged.1.clone()
    }
}
