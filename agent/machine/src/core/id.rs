//! Minion ids: Salt's `valid_id` rules plus what the file system demands.

use std::fmt;

/// Longest file name the agent will build from an id (Linux NAME_MAX).
pub const NAME_MAX: usize = 255;

/// A minion id that is safe to use as a file name inside the key folders.
///
/// Salt's `valid_id` refuses `/`, `\`, NUL, `.` and `..`; on top of that the
/// agent refuses ids longer than NAME_MAX and ids starting with `.`, which Salt
/// 3008 never lists as keys and which would collide with the agent's own
/// staging files.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MinionId(Box<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("minion id is empty")]
    Empty,
    #[error("minion id {0:?} starts with a dot")]
    LeadingDot(String),
    #[error("minion id {0:?} contains a forbidden character ('/', '\\' or NUL)")]
    ForbiddenChar(String),
    #[error("minion id is {0} bytes long, more than {NAME_MAX}")]
    TooLong(usize),
}

impl MinionId {
    pub fn parse(raw: &str) -> Result<MinionId, IdError> {
        if raw.is_empty() {
            return Err(IdError::Empty);
        }
        if raw.len() > NAME_MAX {
            return Err(IdError::TooLong(raw.len()));
        }
        if raw.contains(['/', '\\', '\0']) {
            return Err(IdError::ForbiddenChar(raw.escape_debug().to_string()));
        }
        // Covers "." and ".." too.
        if raw.starts_with('.') {
            return Err(IdError::LeadingDot(raw.to_string()));
        }
        Ok(MinionId(raw.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by id are searched by name: an id hashes and compares as its str.
impl std::borrow::Borrow<str> for MinionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MinionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for MinionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_salt_ids() {
        for ok in ["web01", "web01.example.com", "tmpab12cd34", "a..b", "UPPER_case-1", "ünïcode"] {
            assert_eq!(MinionId::parse(ok).unwrap().as_str(), ok);
        }
        assert!(MinionId::parse(&"x".repeat(NAME_MAX)).is_ok());
    }

    #[test]
    fn refuses_what_salt_or_the_fs_refuses() {
        let cases: &[(&str, IdError)] = &[
            ("", IdError::Empty),
            (".", IdError::LeadingDot(".".into())),
            ("..", IdError::LeadingDot("..".into())),
            (".hidden", IdError::LeadingDot(".hidden".into())),
            ("../master.pem", IdError::ForbiddenChar("../master.pem".into())),
            ("a/b", IdError::ForbiddenChar("a/b".into())),
            ("a\\b", IdError::ForbiddenChar("a\\\\b".into())),
            ("a\0b", IdError::ForbiddenChar("a\\0b".into())),
        ];
        for (raw, want) in cases {
            assert_eq!(MinionId::parse(raw).unwrap_err(), *want, "{raw:?}");
        }
        assert_eq!(MinionId::parse(&"x".repeat(300)).unwrap_err(), IdError::TooLong(300));
    }
}
