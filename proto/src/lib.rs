//! Generated types and gRPC stubs of the `keysync.v1` replication API.
//!
//! Generated code stays at the transport edge: the agent converts these
//! messages into its own core types before anything else looks at them.

/// The highest protocol version this build speaks; sent in `Hello`.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest protocol version this build still speaks with (see the
/// `Hello` messages in keysync.proto for what each version adds).
pub const MIN_PROTOCOL_VERSION: u32 = 1;

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("keysync.v1");
}
