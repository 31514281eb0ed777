//! Client-certificate verifier of one incoming connection: the CA's verdict, then the peer-name
//! check, with a record of what was presented so that refusals can be audited.

use std::sync::{Arc, Mutex, MutexGuard};

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::identity;
use crate::identity::PeerName;

/// What the client of one connection presented, filled in during its handshake.
#[derive(Debug, Default)]
pub(crate) struct HandshakeRecord {
    // A std Mutex: written once inside a synchronous rustls callback, read after the handshake.
    inner: Mutex<Recorded>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Recorded {
    /// DNS SANs (or subject CN) of the presented end-entity certificate.
    pub(crate) presented: Vec<String>,
    /// Set when the certificate chains to the CA and one of its DNS SANs is an allowed peer.
    pub(crate) peer: Option<PeerName>,
    /// Set when the certificate chains to the CA but names no allowed peer.
    pub(crate) unknown_peer: bool,
}

impl HandshakeRecord {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub(crate) fn snapshot(&self) -> Recorded {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        // Nothing that holds this lock can panic midway; a poisoned record is still usable.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Delegates the chain checks to webpki, then admits only certificates that carry a DNS SAN equal
/// to an allowed peer name; the refusal is an `access_denied` alert the client can read.
#[derive(Debug)]
pub(crate) struct PeerCertVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    allowed_peers: Arc<[PeerName]>,
    record: Arc<HandshakeRecord>,
}

impl PeerCertVerifier {
    pub(crate) fn new(
        inner: Arc<dyn ClientCertVerifier>,
        allowed_peers: Arc<[PeerName]>,
        record: Arc<HandshakeRecord>,
    ) -> Self {
        Self { inner, allowed_peers, record }
    }
}

impl ClientCertVerifier for PeerCertVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.record.lock().presented = identity::presented_identity(end_entity);
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;

        // Certificate order decides when a certificate names more than one allowed peer.
        let peer = identity::dns_names(end_entity)
            .into_iter()
            .find_map(|name| self.allowed_peers.iter().find(|allowed| allowed.as_str() == name).cloned());
        let mut record = self.record.lock();
        match peer {
            Some(name) => {
                record.peer = Some(name);
                Ok(verified)
            }
            None => {
                record.unknown_peer = true;
                Err(rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
