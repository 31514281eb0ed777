//! A link's pieces: the protocol an older peer speaks (what is held back
//! during a round is the link machine's, tested in keysync-machine).

use super::*;

/// An agent of 0.1.0 (protocol 1) refuses protocol 2's Hello naming what
/// it speaks: the link speaks it (issue 29 item 1); other refusals, and
/// protocols this agent does not speak, are not taken for one.
#[test]
fn an_older_servers_refusal_names_the_protocol_to_speak() {
    let old = tonic::Status::failed_precondition("protocol version 2 is not supported (this server speaks 1)");
    assert_eq!(older_server(&old), Some(1));
    let unknown = tonic::Status::failed_precondition("protocol version 2 is not supported (this server speaks 0)");
    assert_eq!(older_server(&unknown), None, "older than this agent speaks");
    let newer = tonic::Status::failed_precondition("protocol version 2 is not supported (this server speaks 9)");
    assert_eq!(older_server(&newer), None);
    let other = tonic::Status::permission_denied("Hello names node \"x\" but the client certificate is for \"y\"");
    assert_eq!(older_server(&other), None);
}
