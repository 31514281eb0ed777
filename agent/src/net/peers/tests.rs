//! A link's pieces: the protocol an older peer speaks (what is held back
//! during a round is the link machine's, tested in keysync-machine).

use super::*;
use keysync_machine::node::{Fetch, FIRST_BUCKET_MOST};

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

/// The bucket a Diff answer brings is taken only as the answer to a fetch
/// of a bucket the answer sends whole, and no larger than that fetch may
/// be; decisions naming no bucket are refused.
#[test]
fn a_bucket_brought_with_a_diff_answer_is_one_sent_whole() {
    let whole = [(3, 10), (7, 2)];
    let fetch = answers::brought(Some(7), 2, &whole).unwrap().unwrap();
    assert_eq!((fetch.buckets, fetch.n_in_buckets, fetch.ids.len()), (vec![7], 2, 0));
    assert_eq!(answers::brought(None, 0, &whole), Ok(None));
    assert!(answers::brought(None, 1, &whole).is_err(), "decisions of no bucket");
    assert!(answers::brought(Some(5), 1, &whole).is_err(), "not sent whole");
    let most = Fetch { buckets: vec![7], n_in_buckets: 2, ..Fetch::default() }.most_rows();
    assert!(answers::brought(Some(7), most, &whole).is_ok());
    assert!(answers::brought(Some(7), most + 1, &whole).is_err(), "more than a fetch of it brings");
    let large = [(7, FIRST_BUCKET_MOST + 1)];
    assert_eq!(answers::brought(Some(7), 1, &large), Ok(None), "larger than this release brings: fetched");
}
