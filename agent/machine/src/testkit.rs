//! Fixtures for tests here and in the crates that depend on this one
//! (feature `testkit`): keys real enough for every check the agent makes,
//! and the state store's contract (`store_contract`), run against every
//! store.

pub mod store_contract;

/// A real RSA-2048 public key as Salt writes it.
pub const PUB: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo
4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u
+qKhbwKfBstIs+bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyeh
kd3qqGElvW/VDL5AaWTg0nLVkjRo9z+40RQzuVaE8AkAFmxZzow3x+VJYKdjykkJ
0iT9wCS0DRTXu269V264Vf/3jvredZiKRkgwlL9xNAwxXFg0x/XFw005UWVRIkdg
cKWTjpBP2dPwVZ4WWC+9aGVd+Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbc
mwIDAQAB
-----END PUBLIC KEY-----
";

/// A PEM private-key block: never to be accepted anywhere.
pub const PRIVATE: &str =
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";

/// A peer's name for a test; panics if it is not one.
pub fn peer(name: &str) -> crate::PeerName {
    crate::PeerName::new(name).unwrap_or_else(|e| panic!("{name:?} is no peer name: {e}"))
}
