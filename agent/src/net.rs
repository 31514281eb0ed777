//! Everything that crosses the network to peers: outbound links, the set of
//! links, the gRPC handler peers call, and conversion of wire messages.

pub mod cause;
pub mod links;
pub mod peers;
pub mod rpc;
pub mod wire;
