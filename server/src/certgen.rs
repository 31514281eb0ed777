//! A small certificate authority for sites without a PKI (and for tests): a self-signed CA that
//! issues node certificates for both server and client auth. PEM strings in and out, no files.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::DnsName;
use time::{Duration, OffsetDateTime};

/// How long a CA made by [`CertAuthority::new`] is valid.
const CA_LIFETIME: Duration = Duration::days(3653);
/// A new CA is valid from a little in the past, so that masters with a slow clock accept it.
const CA_BACKDATE: Duration = Duration::hours(1);

/// Why a certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a key pair")]
    KeyGeneration(#[source] rcgen::Error),
    #[error("CA common name {0:?} is empty or invalid")]
    InvalidCommonName(String),
    #[error("a node certificate needs at least one DNS name")]
    NoNames,
    #[error("{0:?} is not a valid DNS name")]
    InvalidName(String),
    #[error("not_before {not_before} is not before not_after {not_after}")]
    InvalidValidity { not_before: OffsetDateTime, not_after: OffsetDateTime },
    #[error("signing the certificate")]
    Signing(#[source] rcgen::Error),
    #[error("CA certificate PEM cannot be parsed")]
    CaCertPem,
    #[error("CA private key PEM cannot be parsed")]
    CaKeyPem(#[source] rcgen::Error),
    #[error("CA certificate is not a CA (no basicConstraints CA:TRUE)")]
    NotACa,
    #[error("CA private key does not match the CA certificate")]
    CaKeyMismatch,
}

/// A CA certificate with its private key, able to issue node certificates.
pub struct CertAuthority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority").finish_non_exhaustive()
    }
}

/// A node certificate and its private key, both PEM.
#[derive(Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

impl CertAuthority {
    /// A new self-signed CA named `common_name`, valid for ten years.
    pub fn new(common_name: &str) -> Result<Self, CertError> {
        if common_name.trim().is_empty() {
            return Err(CertError::InvalidCommonName(common_name.to_owned()));
        }
        let key = KeyPair::generate().map_err(CertError::KeyGeneration)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = now - CA_BACKDATE;
        params.not_after = now + CA_LIFETIME;
        let cert = params.self_signed(&key).map_err(CertError::Signing)?;
        Ok(Self { cert_pem: cert.pem(), key_pem: key.serialize_pem(), issuer: Issuer::new(params, key) })
    }

    /// Loads an existing CA; the key must be the certificate's and the certificate a CA.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(key_pem).map_err(CertError::CaKeyPem)?;
        let der =
            rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes()).map_err(|_| CertError::CaCertPem)?;
        check_ca(&der, &key)?;
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|_| CertError::CaCertPem)?;
        Ok(Self { cert_pem: cert_pem.to_owned(), key_pem: key_pem.to_owned(), issuer })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> String {
        self.key_pem.clone()
    }

    /// A node certificate usable for both server and client auth (EKU serverAuth + clientAuth),
    /// with DNS SANs `names` (the first is also the subject CN) and a fresh ECDSA P-256 key.
    pub fn issue(
        &self,
        names: &[&str],
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<IssuedCert, CertError> {
        if names.is_empty() {
            return Err(CertError::NoNames);
        }
        if not_before >= not_after {
            return Err(CertError::InvalidValidity { not_before, not_after });
        }
        let mut params = CertificateParams::default();
        for name in names {
            DnsName::try_from(*name).map_err(|_| CertError::InvalidName((*name).to_owned()))?;
            let ia5 = (*name).try_into().map_err(|_| CertError::InvalidName((*name).to_owned()))?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params.distinguished_name = common_name_dn(names[0]);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before;
        params.not_after = not_after;

        let key = KeyPair::generate().map_err(CertError::KeyGeneration)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(CertError::Signing)?;
        Ok(IssuedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

fn common_name_dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Refuses a certificate that is not a CA or whose public key is not `key`'s.
fn check_ca(der: &rustls::pki_types::CertificateDer<'_>, key: &KeyPair) -> Result<(), CertError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| CertError::CaCertPem)?;
    let is_ca = matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
    if !is_ca {
        return Err(CertError::NotACa);
    }
    if cert.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(CertError::CaKeyMismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validity() -> (OffsetDateTime, OffsetDateTime) {
        let now = OffsetDateTime::now_utc();
        (now - Duration::hours(1), now + Duration::days(1))
    }

    #[test]
    fn reloaded_ca_issues_certificates_that_chain_to_it() {
        let ca = CertAuthority::new("keysync test CA").unwrap();
        let reloaded = CertAuthority::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
        let (not_before, not_after) = validity();
        let node = reloaded.issue(&["master-a", "master-a.example"], not_before, not_after).unwrap();
        let setup = crate::TlsSetup::new(&crate::TlsMaterial {
            ca_pem: ca.cert_pem().into_bytes(),
            cert_pem: node.cert_pem.into_bytes(),
            key_pem: node.key_pem.into_bytes(),
        })
        .unwrap();
        assert_eq!(setup.own_dns_names(), ["master-a", "master-a.example"]);
        assert!((setup.own_not_after() - not_after.unix_timestamp()).abs() <= 1);
    }

    #[test]
    fn from_pem_refuses_a_key_of_another_ca() {
        let ca = CertAuthority::new("one").unwrap();
        let other = CertAuthority::new("two").unwrap();
        let err = CertAuthority::from_pem(&ca.cert_pem(), &other.key_pem()).unwrap_err();
        assert!(matches!(err, CertError::CaKeyMismatch), "{err}");
    }

    #[test]
    fn from_pem_refuses_a_node_certificate() {
        let ca = CertAuthority::new("ca").unwrap();
        let (not_before, not_after) = validity();
        let node = ca.issue(&["master-a"], not_before, not_after).unwrap();
        let err = CertAuthority::from_pem(&node.cert_pem, &node.key_pem).unwrap_err();
        assert!(matches!(err, CertError::NotACa), "{err}");
    }

    #[test]
    fn issue_refuses_bad_input() {
        let ca = CertAuthority::new("ca").unwrap();
        let (not_before, not_after) = validity();
        assert!(matches!(ca.issue(&[], not_before, not_after), Err(CertError::NoNames)));
        assert!(matches!(ca.issue(&["not a name"], not_before, not_after), Err(CertError::InvalidName(_))));
        assert!(matches!(ca.issue(&["master-a"], not_after, not_before), Err(CertError::InvalidValidity { .. })));
        assert!(matches!(CertAuthority::new(" "), Err(CertError::InvalidCommonName(_))));
    }
}
