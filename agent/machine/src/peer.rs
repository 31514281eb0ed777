//! The name of a master of the site as its peers know it: the DNS name its
//! certificate proves, the name the config lists it by, the `from` of what
//! it sends and the `via` of the audit records that tell it. One type from
//! the TLS identity to the audit record, so a peer's name is never mixed up
//! with another string (an origin, a minion id, an address).
//!
//! Cheap to clone (an `Arc<str>`): every batch, event and link carries one.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// A master's name, checked where it enters (the config, a certificate
/// matched against the config's names), or the machine's name for its
/// journal ([`PeerName::journal`]), which no master may have.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerName(Arc<str>);

/// Why a name cannot be a master's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadPeerName {
    #[error("not a DNS name")]
    NotDnsName,
    /// One of [`PeerName::RESERVED`].
    #[error("a name the agent uses itself")]
    Reserved,
    #[error("has capital letters")]
    Uppercase,
}

impl PeerName {
    /// Names the agent gives its own sources of decisions (the audit log's
    /// `via`), which no master may have.
    pub const RESERVED: [&'static str; 3] = ["journal", "local", "network"];

    /// A master's name: a DNS name of its certificate, in lowercase (the
    /// one form TLS compares and decisions carry), and none of
    /// [`PeerName::RESERVED`].
    pub fn new(name: &str) -> Result<PeerName, BadPeerName> {
        if !is_dns_name(name) {
            return Err(BadPeerName::NotDnsName);
        }
        if PeerName::RESERVED.contains(&name) {
            return Err(BadPeerName::Reserved);
        }
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(BadPeerName::Uppercase);
        }
        Ok(PeerName(Arc::from(name)))
    }

    /// A name this agent checked before it kept it (read back from its own
    /// state store, this node's own name from its settings): not checked
    /// again, so a store written by an older agent still loads.
    pub fn trusted(name: impl Into<Arc<str>>) -> PeerName {
        PeerName(name.into())
    }

    /// The source of decisions finished from the journal a stop left (the
    /// audit log's `via` "journal").
    pub fn journal() -> PeerName {
        PeerName(Arc::from(PeerName::RESERVED[0]))
    }

    /// Whether it names the journal, not a master.
    pub fn is_journal(&self) -> bool {
        *self.0 == *PeerName::RESERVED[0]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared string, for what compares peers with origins (a master's
    /// name is also the origin of the decisions it makes).
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }
}

/// Node names are DNS names of certificates.
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl fmt::Display for PeerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PeerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for PeerName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

// Read as the string it is wherever a `&str` is wanted (a log field, a
// comparison with an origin); only made through the constructors above.
impl std::ops::Deref for PeerName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

// Maps keyed by peer are looked up by `&str` too (a name from the wire or
// the CLI): the same `Eq`, `Ord` and `Hash` as the string's.
impl Borrow<str> for PeerName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for PeerName {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for PeerName {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl From<PeerName> for Arc<str> {
    fn from(name: PeerName) -> Arc<str> {
        name.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lowercase_dns_names_no_reserved_one() {
        assert_eq!(PeerName::new("master-b.example").unwrap().as_str(), "master-b.example");
        assert_eq!(PeerName::new(""), Err(BadPeerName::NotDnsName));
        assert_eq!(PeerName::new("a b"), Err(BadPeerName::NotDnsName));
        assert_eq!(PeerName::new("-a"), Err(BadPeerName::NotDnsName));
        assert_eq!(PeerName::new("Master-B"), Err(BadPeerName::Uppercase));
        for name in PeerName::RESERVED {
            assert_eq!(PeerName::new(name), Err(BadPeerName::Reserved));
        }
    }

    #[test]
    fn the_journal_is_no_master() {
        assert!(PeerName::journal().is_journal());
        assert_eq!(PeerName::journal().as_str(), "journal");
        assert!(!PeerName::new("master-b").unwrap().is_journal());
    }

    #[test]
    fn compares_hashes_and_orders_as_its_string() {
        let mut names = std::collections::BTreeSet::new();
        names.insert(PeerName::new("b").unwrap());
        names.insert(PeerName::new("a").unwrap());
        assert!(names.contains("b"));
        assert_eq!(names.iter().map(PeerName::as_str).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(format!("{} {:?}", names.first().unwrap(), names.first().unwrap()), "a \"a\"");
    }
}
