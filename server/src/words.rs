//! rustls's errors in words an operator reads. Its own `Display` names its
//! enums' variants ("invalid peer certificate: UnknownIssuer", "keys may not
//! be consistent: KeyMismatch", "received fatal alert: AccessDenied"): here
//! each is said in words, and a variant this list does not know yet in the
//! words of its name.

use std::io;

use rustls::CertificateError;

/// What `error` says, in words.
pub fn tls_error_words(error: &rustls::Error) -> String {
    use rustls::Error::*;
    match error {
        InvalidCertificate(error) => certificate_error_words(error),
        AlertReceived(alert) => format!("received TLS alert {}", words(&name_of(alert))),
        InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "the private key does not match the certificate".into()
        }
        InconsistentKeys(_) => "the private key cannot be checked against the certificate".into(),
        NoCertificatesPresented => "no certificate presented".into(),
        DecryptError => "cannot decrypt the peer's message".into(),
        PeerIncompatible(rustls::PeerIncompatible::Tls12NotOfferedOrEnabled) => {
            "the peer offers no TLS 1.3 (only older versions)".into()
        }
        PeerIncompatible(why) => format!("the peer's TLS is incompatible: {}", words(&name_of(why))),
        PeerMisbehaved(why) => format!("the peer broke the TLS protocol: {}", words(&name_of(why))),
        InvalidMessage(why) => format!("received a malformed TLS message: {}", words(&name_of(why))),
        InappropriateMessage { .. } | InappropriateHandshakeMessage { .. } => {
            "received an unexpected TLS message (is it a TLS 1.3 peer?)".into()
        }
        General(text) => text.clone(),
        Other(other) => other.to_string(),
        other => words(&name_of(other)),
    }
}

/// Why a certificate was refused, in words.
pub fn certificate_error_words(error: &CertificateError) -> String {
    use CertificateError::*;
    match error {
        BadEncoding => "not a well-formed certificate".into(),
        Expired | ExpiredContext { .. } => "certificate expired".into(),
        NotValidYet | NotValidYetContext { .. } => "certificate not valid yet (or a clock is wrong)".into(),
        Revoked => "certificate revoked".into(),
        UnknownIssuer => "not signed by a trusted CA".into(),
        BadSignature => "its signature does not verify: signed by another CA of the same name, or altered".into(),
        NotValidForName => "not valid for the name expected".into(),
        NotValidForNameContext { expected, presented } => {
            let named: Vec<String> = presented.iter().map(|name| general_name(name)).collect();
            let named = if named.is_empty() { "no name".to_string() } else { named.join(", ") };
            format!("not valid for the name {}: it names {named}", expected.to_str())
        }
        InvalidPurpose | InvalidPurposeContext { .. } => {
            "its extended key usage does not allow this use (it needs serverAuth and clientAuth)".into()
        }
        UnhandledCriticalExtension => "it has a critical extension that cannot be checked".into(),
        ApplicationVerificationFailure => "its name is no configured peer".into(),
        Other(other) => other.to_string(),
        other => words(&name_of(other)),
    }
}

/// `error`, in words when it carries a rustls error (a handshake's
/// `io::Error` does), else as it says itself.
pub fn io_error_words(error: &io::Error) -> String {
    match error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(tls) => tls_error_words(tls),
        None => error.to_string(),
    }
}

/// `error` alone (not its sources) in words when it is a rustls error or an
/// `io::Error` carrying one; `None` for any other error.
pub fn error_words(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls_error_words(tls));
    }
    let io = error.downcast_ref::<io::Error>()?;
    io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).map(tls_error_words)
}

/// A name a certificate presents, as webpki's debug output gives it
/// (`DnsName("master-b")`, `IpAddress(10.0.0.1)`): the name alone.
fn general_name(debug: &str) -> String {
    let inner = debug.split_once('(').and_then(|(_, rest)| rest.strip_suffix(')'));
    match inner {
        Some(inner) => inner.trim_matches('"').to_string(),
        None => words(debug),
    }
}

/// The variant name `value`'s debug output starts with (`AccessDenied`,
/// `UnknownCA`), without what it carries.
fn name_of(value: &impl std::fmt::Debug) -> String {
    let debug = format!("{value:?}");
    debug.split(['(', ' ', '{']).next().unwrap_or_default().to_string()
}

/// `AccessDenied` → "access denied", `UnknownCA` → "unknown CA".
pub(crate) fn words(camel: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    let chars: Vec<char> = camel.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let starts = i > 0 && c.is_ascii_uppercase() && !chars[i - 1].is_ascii_uppercase();
        if words.is_empty() || starts {
            words.push(String::new());
        }
        words.last_mut().expect("a word was started").push(c);
    }
    let words: Vec<String> =
        words
            .into_iter()
            .map(|word| {
                if word.len() > 1 && word.chars().all(|c| c.is_ascii_uppercase()) {
                    word
                } else {
                    word.to_lowercase()
                }
            })
            .collect();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No word in CamelCase: a variant's name.
    fn camel_case(text: &str) -> Option<&str> {
        text.split(|c: char| !c.is_ascii_alphanumeric()).find(|word| {
            let mut chars = word.chars();
            chars.next().is_some_and(|c| c.is_ascii_uppercase())
                && word.chars().any(|c| c.is_ascii_lowercase())
                && chars.any(|c| c.is_ascii_uppercase())
        })
    }

    #[test]
    fn every_error_is_said_in_words() {
        let name = rustls::pki_types::ServerName::try_from("master-b").unwrap();
        let cases = [
            (rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer), "not signed by a trusted CA"),
            (rustls::Error::InvalidCertificate(CertificateError::BadSignature), "signature does not verify"),
            (rustls::Error::InvalidCertificate(CertificateError::Expired), "certificate expired"),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                    expected: name,
                    presented: vec!["DnsName(\"master-c\")".into(), "IpAddress(10.0.0.1)".into()],
                }),
                "not valid for the name master-b: it names master-c, 10.0.0.1",
            ),
            (rustls::Error::InvalidCertificate(CertificateError::UnknownRevocationStatus), "unknown revocation status"),
            (rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch), "private key does not match"),
            (rustls::Error::AlertReceived(rustls::AlertDescription::AccessDenied), "received TLS alert access denied"),
            (rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA), "received TLS alert unknown CA"),
            (rustls::Error::NoCertificatesPresented, "no certificate presented"),
            (rustls::Error::HandshakeNotComplete, "handshake not complete"),
            (rustls::Error::PeerMisbehaved(rustls::PeerMisbehaved::IllegalMiddleboxChangeCipherSpec), "broke"),
        ];
        for (error, want) in cases {
            let said = tls_error_words(&error);
            assert!(said.contains(want), "{error:?}: {said:?} should contain {want:?}");
            assert_eq!(camel_case(&said), None, "{error:?}: {said:?}");
        }
        let handshake = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert_eq!(io_error_words(&handshake), "not signed by a trusted CA");
        assert_eq!(error_words(&handshake).as_deref(), Some("not signed by a trusted CA"));
        assert_eq!(error_words(&io::Error::from(io::ErrorKind::ConnectionRefused)), None);
        assert_eq!(io_error_words(&io::Error::from(io::ErrorKind::ConnectionRefused)), "connection refused");
        assert_eq!(words("CertificateExpired"), "certificate expired");
    }
}
