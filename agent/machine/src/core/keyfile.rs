//! Content checks for minion key files, run on every byte read from a folder
//! or received from a peer before it is shipped or written.

/// Largest key file accepted. An RSA-4096 public key PEM is about 800 bytes.
pub const MAX_KEY_BYTES: usize = 16 * 1024;

const PUBLIC_LABELS: [&str; 2] = ["PUBLIC KEY", "RSA PUBLIC KEY"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("key file is empty")]
    Empty,
    #[error("key file is {0} bytes, more than the {MAX_KEY_BYTES} byte limit")]
    TooLarge(u64),
    #[error("key file contains a private key block")]
    PrivateKey,
    #[error("key file is not text")]
    NotText,
    #[error("key file is not a single PEM public key: {0}")]
    NotPublicKey(&'static str),
}

/// Accepts exactly one PEM `PUBLIC KEY` or `RSA PUBLIC KEY` block, optionally
/// surrounded by whitespace, and nothing else.
pub fn check_public_key(bytes: &[u8]) -> Result<(), KeyError> {
    if bytes.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLarge(bytes.len() as u64));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(KeyError::Empty);
    }
    // Checked on raw bytes first, so a private key hidden behind a non-UTF-8
    // byte is still reported as what it is.
    if contains(bytes, b"PRIVATE KEY") {
        return Err(KeyError::PrivateKey);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| KeyError::NotText)?;
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let begin = lines.next().ok_or(KeyError::Empty)?;
    let label = begin
        .strip_prefix("-----BEGIN ")
        .and_then(|rest| rest.strip_suffix("-----"))
        .ok_or(KeyError::NotPublicKey("does not start with a BEGIN line"))?;
    if !PUBLIC_LABELS.contains(&label) {
        return Err(KeyError::NotPublicKey("the PEM block is not a public key"));
    }
    let is_end = |line: &str| {
        line.strip_prefix("-----END ").and_then(|rest| rest.strip_suffix("-----")).is_some_and(|l| l == label)
    };
    let mut body_len = 0usize;
    let mut ended = false;
    for line in lines.by_ref() {
        if is_end(line) {
            ended = true;
            break;
        }
        if !line.bytes().all(|b| BASE64[usize::from(b)]) {
            return Err(KeyError::NotPublicKey("the PEM body is not base64"));
        }
        body_len += line.len();
    }
    if !ended {
        return Err(KeyError::NotPublicKey("no END line (truncated?)"));
    }
    if body_len < 64 || !body_len.is_multiple_of(4) {
        return Err(KeyError::NotPublicKey("the PEM body has an impossible length"));
    }
    if lines.next().is_some() {
        return Err(KeyError::NotPublicKey("data after the END line"));
    }
    Ok(())
}

/// Whether `needle` occurs in `haystack`: its first byte looked for first
/// (comparing every window whole was 3 % of a first start's CPU).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else { return true };
    haystack.iter().enumerate().any(|(i, &b)| b == first && haystack[i + 1..].starts_with(rest))
}

/// The bytes of a PEM body's lines: base64's alphabet and its padding.
const BASE64: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'+' || c == b'/' || c == b'=';
        b += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::PUB;

    #[test]
    fn contains_finds_a_needle_wherever_it_is() {
        for (haystack, needle, want) in [
            (&b"PRIVATE KEY"[..], &b"PRIVATE KEY"[..], true),
            (b"xxPRIVATE KEY", b"PRIVATE KEY", true),
            (b"PRIVATE KEYxx", b"PRIVATE KEY", true),
            (b"PPRIVATE KEY", b"PRIVATE KEY", true),
            (b"PRIVATE KE", b"PRIVATE KEY", false),
            (b"PRIVATE_KEY", b"PRIVATE KEY", false),
            (b"", b"P", false),
            (b"abc", b"", true),
        ] {
            assert_eq!(contains(haystack, needle), want, "{haystack:?} {needle:?}");
            let windows = needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle);
            assert_eq!(windows, want);
        }
        for b in 0..=255u8 {
            let base64 = b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=';
            assert_eq!(BASE64[usize::from(b)], base64, "{b}");
        }
    }

    #[test]
    fn accepts_public_keys_as_found() {
        assert_eq!(check_public_key(PUB.as_bytes()), Ok(()));
        assert_eq!(check_public_key(PUB.trim_end().as_bytes()), Ok(()));
        let rsa = PUB.replace("PUBLIC KEY", "RSA PUBLIC KEY");
        assert_eq!(check_public_key(rsa.as_bytes()), Ok(()));
    }

    #[test]
    fn refuses_everything_else() {
        let private = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n";
        let both = format!("{PUB}{private}");
        let two = format!("{PUB}{PUB}");
        let truncated = &PUB[..PUB.len() / 2];
        let cert = PUB.replace("PUBLIC KEY", "CERTIFICATE");
        let garbage_body = PUB.replace("mwIDAQAB", "mwID*QAB");
        let cases: Vec<(&[u8], KeyError)> = vec![
            (b"", KeyError::Empty),
            (b" \n\n", KeyError::Empty),
            (private.as_bytes(), KeyError::PrivateKey),
            (both.as_bytes(), KeyError::PrivateKey),
            (b"\xff\xfe-----BEGIN PRIVATE KEY-----", KeyError::PrivateKey),
            (b"\xff\xfe", KeyError::NotText),
            (two.as_bytes(), KeyError::NotPublicKey("data after the END line")),
            (truncated.as_bytes(), KeyError::NotPublicKey("no END line (truncated?)")),
            (cert.as_bytes(), KeyError::NotPublicKey("the PEM block is not a public key")),
            (garbage_body.as_bytes(), KeyError::NotPublicKey("the PEM body is not base64")),
            (b"hello", KeyError::NotPublicKey("does not start with a BEGIN line")),
        ];
        for (bytes, want) in cases {
            assert_eq!(check_public_key(bytes), Err(want), "{:?}", String::from_utf8_lossy(bytes));
        }
        let big = vec![b'A'; MAX_KEY_BYTES + 1];
        assert_eq!(check_public_key(&big), Err(KeyError::TooLarge(MAX_KEY_BYTES as u64 + 1)));
    }
}
