//! Why a peer could not be reached or refused this master, in one line an
//! operator can act on: who refused whom and what to check there, or the
//! network's own cause ("Connection refused", each cause once:
//! [`crate::text::error_chain`]). Never a library's debug dump: tonic's
//! `Status` prints its source with `{:?}`.

use std::error::Error;

/// One line for `error`, met talking to `peer` as `node`.
pub fn describe(error: &(dyn Error + 'static), peer: &str, node: &str) -> String {
    if let Some(alert) = keysync_server::alert_received(error) {
        return refused_by(peer, node, &alert);
    }
    if let Some(refusal) = keysync_server::tls_refusal(error) {
        return format!(
            "we refused {peer}'s certificate ({refusal}): check that it carries the name {peer} and is signed by \
             our CA (tls.ca)"
        );
    }
    crate::text::error_chain(error)
}

/// The peer's TLS alert, read as what it says about our certificate.
fn refused_by(peer: &str, node: &str, alert: &str) -> String {
    let check = match alert {
        "access denied" => format!("check that its [[peer]] list names {node} and trusts our CA"),
        "unknown CA" | "bad certificate" | "certificate unknown" | "unsupported certificate" => {
            "check that its tls.ca is the CA that signed our certificate (tls.cert)".to_string()
        }
        "certificate expired" => "our certificate (tls.cert) has expired, or its clock is wrong".to_string(),
        "certificate revoked" => "our certificate (tls.cert) was revoked: issue a new one".to_string(),
        _ => return format!("{peer} ended the TLS handshake (TLS alert {alert})"),
    };
    format!("{peer} refused our certificate (TLS alert {alert}): {check}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_told_by_its_message_and_causes_without_debug_output() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stream closed because of a broken pipe");
        let status = tonic::Status::from_error(Box::new(io));
        let text = describe(&status, "master-b", "master-a");
        assert_eq!(text, "stream closed because of a broken pipe");
        let refused = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: AccessDenied",
        )));
        assert_eq!(
            describe(&refused, "master-b", "master-a"),
            "master-b refused our certificate (TLS alert access denied): check that its [[peer]] list names \
             master-a and trusts our CA"
        );
    }
}
