//! Who a peer is: what a certificate says about its holder (DNS names, subject CN and expiry,
//! read with x509-parser), and the authenticated name every call of a connection carries.

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::X509Certificate;

/// Parses a DER certificate, or `None` if it is not one.
fn parse<'a>(der: &'a CertificateDer<'_>) -> Option<X509Certificate<'a>> {
    x509_parser::parse_x509_certificate(der).ok().map(|(_, cert)| cert)
}

/// The DNS subject alternative names of `cert`, in certificate order.
fn dns_names_of(cert: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
        .collect()
}

/// The DNS SANs of a DER certificate; empty if it has none or cannot be parsed.
pub(crate) fn dns_names(der: &CertificateDer<'_>) -> Vec<String> {
    parse(der).map(|cert| dns_names_of(&cert)).unwrap_or_default()
}

/// Best-effort identity of a presented certificate, for the audit trail: its DNS SANs, or its
/// subject common names when it has no DNS SAN, or nothing when it cannot be parsed.
pub(crate) fn presented_identity(der: &CertificateDer<'_>) -> Vec<String> {
    let Some(cert) = parse(der) else {
        return Vec::new();
    };
    let names = dns_names_of(&cert);
    if !names.is_empty() {
        return names;
    }
    cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(|cn| format!("CN={cn}")).collect()
}

/// Validity window of a DER certificate as unix seconds `(not_before, not_after)`.
pub(crate) fn validity(der: &CertificateDer<'_>) -> Option<(i64, i64)> {
    let cert = parse(der)?;
    let validity = cert.validity();
    Some((validity.not_before.timestamp(), validity.not_after.timestamp()))
}

/// Name of an authenticated peer: the DNS SAN of its verified client certificate that equals
/// one of the allowed peer names (the allowed name itself, checked where the agent's config
/// made it). The agent's own type, so the name travels as one type up to the audit record.
pub use keysync_machine::PeerName;

/// Per-connection facts, attached by the listener to every request of the connection.
#[derive(Clone, Debug)]
pub(crate) struct PeerInfo {
    pub(crate) peer: PeerName,
}
