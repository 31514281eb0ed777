//! TLS material (PEM bytes in, rustls configurations out): TLS 1.3 only, ring, mutual authentication.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{NoServerSessionStorage, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::identity;
use crate::verifier::{HandshakeRecord, PeerCertVerifier};

/// The protocol gRPC speaks over TLS; offered and required on both sides.
const ALPN_H2: &[u8] = b"h2";

/// PEM contents of the CA certificate(s), this node's certificate chain and its private key.
#[derive(Clone)]
pub struct TlsMaterial {
    /// One or more CA certificates: the trust anchors for peers in both directions.
    pub ca_pem: Vec<u8>,
    /// This node's certificate, optionally followed by intermediates.
    pub cert_pem: Vec<u8>,
    /// This node's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsMaterial {
    // The key stays out of logs even when someone debug-prints the material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Which PEM input an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemInput {
    Ca,
    Cert,
    Key,
}

impl std::fmt::Display for PemInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PemInput::Ca => "CA certificate",
            PemInput::Cert => "node certificate",
            PemInput::Key => "node private key",
        })
    }
}

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{input} PEM is malformed")]
    MalformedPem {
        input: PemInput,
        #[source]
        source: pem::Error,
    },
    #[error("no certificate in {input} PEM")]
    NoCertificate { input: PemInput },
    #[error("no private key in node private key PEM")]
    NoPrivateKey,
    // Causes are in the messages, in words, not `source()`s: rustls's own
    // Display names its enums, and `{:#}` would print them after ours.
    #[error("CA certificate is not a usable trust anchor: {}", crate::tls_error_words(.0))]
    InvalidCa(rustls::Error),
    #[error("building the certificate verifier from the CA certificate")]
    Verifier(#[source] rustls::client::VerifierBuilderError),
    #[error("node certificate cannot be parsed as X.509")]
    UnparsableCert,
    #[error("node certificate has no DNS subject alternative name")]
    NoDnsName,
    #[error("{}", key_mismatch(.0))]
    KeyMismatch(rustls::Error),
    #[error(
        "node certificate is not valid against the CA for both server and client auth: {}",
        crate::tls_error_words(.0)
    )]
    CertNotTrusted(rustls::Error),
    #[error("building the TLS {side} configuration: {}", crate::tls_error_words(cause))]
    Config { side: &'static str, cause: rustls::Error },
}

/// `TlsError::KeyMismatch`'s message: the key and certificate disagree, or
/// the key cannot be used (rustls's reason in words).
fn key_mismatch(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "node private key does not match the node certificate".into()
        }
        other => {
            format!("node private key cannot be used with the node certificate: {}", crate::tls_error_words(other))
        }
    }
}

/// Ready-to-use TLS configuration of one node, shared by its listener and its peer connections.
#[derive(Clone)]
pub struct TlsSetup {
    provider: Arc<CryptoProvider>,
    client_verifier: Arc<dyn ClientCertVerifier>,
    cert_resolver: Arc<dyn ResolvesServerCert>,
    client_config: Arc<ClientConfig>,
    own_dns_names: Vec<String>,
    own_not_after: i64,
}

impl std::fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSetup")
            .field("own_dns_names", &self.own_dns_names)
            .field("own_not_after", &self.own_not_after)
            .finish_non_exhaustive()
    }
}

impl TlsSetup {
    /// Checks the material and builds the configurations: TLS 1.3 only, the ring provider (never
    /// a process-wide default), client certificates required and verified against the CA, server
    /// certificates verified against the CA for the expected peer name.
    pub fn new(material: &TlsMaterial) -> Result<TlsSetup, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(root_store(&material.ca_pem)?);
        let chain = certificates(&material.cert_pem, PemInput::Cert)?;
        let key = PrivateKeyDer::from_pem_slice(&material.key_pem).map_err(|e| match e {
            pem::Error::NoItemsFound => TlsError::NoPrivateKey,
            source => TlsError::MalformedPem { input: PemInput::Key, source },
        })?;

        let (not_before, own_not_after) = identity::validity(&chain[0]).ok_or(TlsError::UnparsableCert)?;
        let own_dns_names = identity::dns_names(&chain[0]);
        // A wildcard SAN names no node: verify as the first name a peer could dial.
        let own_server_name =
            own_dns_names.iter().find_map(|name| ServerName::try_from(name.clone()).ok()).ok_or(TlsError::NoDnsName)?;

        let client_verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(TlsError::Verifier)?;
        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(TlsError::Verifier)?;
        check_own_cert(&chain, &own_server_name, not_before, &*client_verifier, &server_verifier)?;

        let certified =
            CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(TlsError::KeyMismatch)?;
        let cert_resolver: Arc<dyn ResolvesServerCert> = Arc::new(SingleCertAndKey::from(certified));

        let mut client_config = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|cause| TlsError::Config { side: "client", cause })?
            .with_webpki_verifier(server_verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|cause| TlsError::Config { side: "client", cause })?;
        client_config.alpn_protocols = vec![ALPN_H2.to_vec()];
        // Every connection proves its certificate afresh; peers reconnect rarely.
        client_config.resumption = Resumption::disabled();

        let setup = TlsSetup {
            provider,
            client_verifier,
            cert_resolver,
            client_config: Arc::new(client_config),
            own_dns_names,
            own_not_after,
        };
        // Build one server configuration now so that a problem surfaces here, not per connection.
        setup
            .server_config(Arc::from(Vec::new()), HandshakeRecord::new())
            .map_err(|cause| TlsError::Config { side: "server", cause })?;
        Ok(setup)
    }

    /// DNS SANs of our own certificate.
    pub fn own_dns_names(&self) -> &[String] {
        &self.own_dns_names
    }

    /// `not_after` of our own certificate, as unix seconds.
    pub fn own_not_after(&self) -> i64 {
        self.own_not_after
    }

    /// The configuration for our outgoing connections.
    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        self.client_config.clone()
    }

    /// A server configuration for one incoming connection: its client-certificate verifier admits
    /// only `allowed_peers` and writes what the client presented into `record`, so that even a
    /// refused handshake can be audited with the identity it claimed.
    pub(crate) fn server_config(
        &self,
        allowed_peers: Arc<[identity::PeerName]>,
        record: Arc<HandshakeRecord>,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        let verifier = PeerCertVerifier::new(self.client_verifier.clone(), allowed_peers, record);
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_cert_resolver(self.cert_resolver.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        // No resumption: a resumed session would skip the client certificate checks.
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }
}

/// All certificates in `pem_bytes`; at least one.
fn certificates(pem_bytes: &[u8], input: PemInput) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::MalformedPem { input, source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { input });
    }
    Ok(certs)
}

fn root_store(ca_pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_pem, PemInput::Ca)? {
        roots.add(cert).map_err(TlsError::InvalidCa)?;
    }
    Ok(roots)
}

/// Checks that our certificate chains to the CA and may serve as both server and client.
///
/// The check runs at the certificate's own `not_before`: expiry is not a reason to refuse to
/// start (`check` reports it from `own_not_after`), but a wrong CA or a missing EKU is.
fn check_own_cert(
    chain: &[CertificateDer<'static>],
    name: &ServerName<'static>,
    not_before: i64,
    client_verifier: &dyn ClientCertVerifier,
    server_verifier: &WebPkiServerVerifier,
) -> Result<(), TlsError> {
    let secs = u64::try_from(not_before).unwrap_or(0).saturating_add(1);
    let at = UnixTime::since_unix_epoch(Duration::from_secs(secs));
    server_verifier.verify_server_cert(&chain[0], &chain[1..], name, &[], at).map_err(TlsError::CertNotTrusted)?;
    client_verifier.verify_client_cert(&chain[0], &chain[1..], at).map_err(TlsError::CertNotTrusted)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CertAuthority;
    use time::{Duration, OffsetDateTime};

    fn material(ca: &CertAuthority, names: &[&str]) -> TlsMaterial {
        let now = OffsetDateTime::now_utc();
        let node = ca.issue(names, now - Duration::hours(1), now + Duration::days(1)).unwrap();
        TlsMaterial {
            ca_pem: ca.cert_pem().into_bytes(),
            cert_pem: node.cert_pem.into_bytes(),
            key_pem: node.key_pem.into_bytes(),
        }
    }

    /// Each broken input is refused with an error naming that input.
    #[test]
    fn broken_material_names_the_input() {
        let ca = CertAuthority::new("ca").unwrap();
        let other_ca = CertAuthority::new("other").unwrap();
        let good = material(&ca, &["master-a"]);
        let other = material(&other_ca, &["master-a"]);
        let cases: Vec<(&str, TlsMaterial, &str)> = vec![
            ("empty CA", TlsMaterial { ca_pem: Vec::new(), ..good.clone() }, "no certificate in CA certificate PEM"),
            (
                "key as certificate",
                TlsMaterial { cert_pem: good.key_pem.clone(), ..good.clone() },
                "no certificate in node certificate PEM",
            ),
            (
                "certificate as key",
                TlsMaterial { key_pem: good.cert_pem.clone(), ..good.clone() },
                "no private key in node private key PEM",
            ),
            (
                "key of another certificate",
                TlsMaterial { key_pem: other.key_pem.clone(), ..good.clone() },
                "node private key does not match the node certificate",
            ),
            (
                "certificate of another CA",
                TlsMaterial { ca_pem: good.ca_pem.clone(), ..other.clone() },
                "node certificate is not valid against the CA",
            ),
            (
                "garbage in the CA PEM",
                TlsMaterial {
                    ca_pem: b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".to_vec(),
                    ..good.clone()
                },
                "CA certificate PEM is malformed",
            ),
        ];
        for (what, material, expected) in cases {
            let err = TlsSetup::new(&material).expect_err(what).to_string();
            assert!(err.starts_with(expected), "{what}: {err}");
        }
        assert!(TlsSetup::new(&good).is_ok());
    }

    #[test]
    fn debug_output_hides_the_private_key() {
        let ca = CertAuthority::new("ca").unwrap();
        let good = material(&ca, &["master-a"]);
        let key_body = String::from_utf8(good.key_pem.clone()).unwrap();
        let shown = format!("{good:?}");
        assert!(!shown.contains(key_body.lines().nth(1).unwrap()), "{shown}");
    }
}
