//! Integration tests of the mTLS transport: real listeners on 127.0.0.1:0, certificates made at
//! test time.

mod support;

/// A full Hello, Push, Diff and Fetch exchange, and shutdown with a stream still open.
mod roundtrip;

/// Every refusal is reported with the presented identity, and the listener keeps serving.
mod refusals;

/// Live reload: peers removed are cut off, unchanged ones keep their connection, new TLS applies.
mod reload;

/// Budgets: calls per peer and in all, connections per peer.
mod budget;
