//! Everything that crosses the network to peers: outbound links, the set of
//! links, the gRPC handler peers call, conversion of wire messages, and the
//! listen addresses.

pub mod cause;
pub mod links;
pub mod listen;
pub mod peers;
pub mod rpc;
pub mod wire;
