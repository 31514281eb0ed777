//! Refusals: each one fails the caller, is reported with what the client presented, and leaves
//! the listener serving legitimate peers.

use std::time::Duration;

use keysync_proto::v1::{DecisionBatch, FetchRequest, HelloRequest};
use keysync_server::{connect, PeerName, ServeOptions, TlsMaterial, TlsSetup, TransportEvent};
use time::OffsetDateTime;
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::support::{
    bounded, chain, client_config, hello_from, hello_with, Pki, TestServer, CONNECT_TIMEOUT, MAX_MESSAGE,
};

/// Connects as `tls` expecting server `peer_name` and says Hello as `a`; the error as text.
async fn attempt(server: &TestServer, peer_name: &str, tls: &TlsSetup) -> Result<(), String> {
    let mut client =
        connect(&server.address(), peer_name, tls, MAX_MESSAGE, CONNECT_TIMEOUT).await.map_err(|e| chain(&e))?;
    client.hello(hello_from("a")).await.map(drop).map_err(|e| chain(&e))
}

fn refused_handshake(event: &TransportEvent) -> Option<(Vec<String>, String)> {
    match event {
        TransportEvent::HandshakeRefused { presented, reason, .. } => Some((presented.clone(), reason.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a"]).await;
        let config = client_config(&pki, &[&rustls::version::TLS13], None);
        let err = hello_with(config, server.addr, "b").await.unwrap_err();
        assert!(err.contains("CertificateRequired"), "{err}");

        let event = server.event("HandshakeRefused", |e| refused_handshake(e).is_some()).await;
        let (presented, reason) = refused_handshake(&event).unwrap();
        assert!(presented.is_empty(), "{presented:?}");
        assert!(reason.to_lowercase().contains("certificate"), "{reason}");
        server.assert_serves(&pki).await;
    })
    .await;
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a"]).await;
        // (rogue CA name, alert the client gets, reason the server reports): a CA of another
        // name is unknown; one impersonating our CA's name fails the signature check.
        let cases = [
            ("rogue CA", "UnknownCA", "not signed by a trusted CA"),
            ("keysync test CA", "DecryptError", "signature does not verify"),
        ];
        for (rogue_name, alert, server_reason) in cases {
            let rogue = Pki::named(rogue_name);
            // The rogue client trusts our CA too, so only the server's check can stop it.
            let tls = TlsSetup::new(&TlsMaterial {
                ca_pem: [pki.ca.cert_pem(), rogue.ca.cert_pem()].concat().into_bytes(),
                ..rogue.node(&["a"])
            })
            .unwrap();
            let err = attempt(&server, "b", &tls).await.unwrap_err();
            assert!(err.contains(alert), "{rogue_name}: {err}");

            let event = server
                .event(server_reason, |e| {
                    refused_handshake(e).is_some_and(|(_, reason)| reason.contains(server_reason))
                })
                .await;
            let (presented, _) = refused_handshake(&event).unwrap();
            assert_eq!(presented, ["a"], "{rogue_name}");
            server.assert_serves(&pki).await;
        }
    })
    .await;
}

#[tokio::test]
async fn certificate_for_a_name_not_allowed_is_refused() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a"]).await;
        let err = attempt(&server, "b", &pki.setup(&["mallory"])).await.unwrap_err();
        assert!(err.contains("AccessDenied"), "{err}");

        let event = server.event("UnknownPeer", |e| matches!(e, TransportEvent::UnknownPeer { .. })).await;
        let TransportEvent::UnknownPeer { presented, .. } = event else { unreachable!() };
        assert_eq!(presented, ["mallory"]);
        server.assert_serves(&pki).await;
    })
    .await;
}

#[tokio::test]
async fn expired_client_certificate_is_refused() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a"]).await;
        let now = OffsetDateTime::now_utc();
        let expired = pki.node_valid(&["a"], now - time::Duration::days(2), now - time::Duration::days(1));
        let tls = TlsSetup::new(&expired).expect("an expired certificate still loads");
        assert!(tls.own_not_after() < now.unix_timestamp());
        let err = attempt(&server, "b", &tls).await.unwrap_err();
        assert!(err.contains("CertificateExpired"), "{err}");

        let event = server.event("HandshakeRefused", |e| refused_handshake(e).is_some()).await;
        let (presented, reason) = refused_handshake(&event).unwrap();
        assert_eq!(presented, ["a"]);
        assert!(reason.to_lowercase().contains("expired"), "{reason}");
        server.assert_serves(&pki).await;
    })
    .await;
}

#[tokio::test]
async fn server_certificate_for_another_name_fails_the_client() {
    bounded(async {
        let pki = Pki::new();
        // Expecting "b" at an address where "c" answers.
        let server = TestServer::start(&pki, "c", &["a"]).await;
        let err = connect(&server.address(), "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .map(drop)
            .map_err(|e| chain(&e))
            .unwrap_err();
        assert!(err.contains("not valid for name"), "{err}");

        // The server sees the client's alert before any client certificate.
        let event = server.event("HandshakeRefused", |e| refused_handshake(e).is_some()).await;
        let (presented, reason) = refused_handshake(&event).unwrap();
        assert!(presented.is_empty(), "{presented:?}");
        assert_eq!(reason, "received TLS alert bad certificate");
        let mut client = connect(&server.address(), "c", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("right name connects");
        client.hello(hello_from("a")).await.expect("hello");
    })
    .await;
}

#[tokio::test]
async fn hello_naming_another_node_is_permission_denied() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a", "c"]).await;
        let tls = pki.setup(&["a"]);
        let mut client = connect(&server.address(), "b", &tls, MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap();
        let status = client.hello(hello_from("c")).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

        let event = server.event("RequestRefused", |e| matches!(e, TransportEvent::RequestRefused { .. })).await;
        let TransportEvent::RequestRefused { peer, reason } = event else { unreachable!() };
        assert_eq!(peer.as_str(), "a");
        assert!(reason.contains("\"c\""), "{reason}");
        assert!(server.handler.callers.lock().unwrap().is_empty());
        // The same connection still works for an honest Hello.
        client.hello(hello_from("a")).await.expect("honest hello");
    })
    .await;
}

/// Upgrades run one master at a time: a caller announcing the previous or
/// the next protocol version is served (the newer side speaks down); one
/// older than the oldest this build speaks is refused with what to upgrade.
#[tokio::test]
async fn the_previous_and_next_protocol_versions_are_served_older_ones_refused() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a"]).await;
        let mut client =
            connect(&server.address(), "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap();
        for announced in [keysync_proto::PROTOCOL_VERSION - 1, keysync_proto::PROTOCOL_VERSION + 1] {
            let request = HelloRequest { node: "a".into(), protocol_version: announced, ..Default::default() };
            let answer = client.hello(request).await.expect("served").into_inner();
            assert_eq!(answer.protocol_version, keysync_proto::PROTOCOL_VERSION, "the server says what it speaks");
        }
        let request = HelloRequest {
            node: "a".into(),
            protocol_version: keysync_proto::MIN_PROTOCOL_VERSION - 1,
            ..Default::default()
        };
        let status = client.hello(request).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("too old") && status.message().contains("upgrade"), "{status:?}");
        let event = server.event("RequestRefused", |e| matches!(e, TransportEvent::RequestRefused { .. })).await;
        assert!(matches!(event, TransportEvent::RequestRefused { peer, .. } if peer.as_str() == "a"));
        server.assert_serves(&pki).await;
    })
    .await;
}

#[tokio::test]
async fn tls12_only_client_is_refused() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a"]).await;
        let identity = pki.node(&["a"]);
        let config = client_config(&pki, &[&rustls::version::TLS12], Some(&identity));
        let err = hello_with(config, server.addr, "b").await.unwrap_err();
        assert!(err.contains("ProtocolVersion"), "{err}");

        let event = server.event("HandshakeRefused", |e| refused_handshake(e).is_some()).await;
        let (presented, reason) = refused_handshake(&event).unwrap();
        assert!(presented.is_empty(), "{presented:?}");
        assert!(reason.contains("no TLS 1.3"), "{reason}");
        server.assert_serves(&pki).await;
    })
    .await;
}

#[tokio::test]
async fn garbage_and_stalled_handshakes_do_not_block_others() {
    bounded(async {
        let pki = Pki::new();
        let opts = ServeOptions {
            allowed_peers: vec![PeerName::new("a").unwrap()],
            handshake_timeout: Duration::from_millis(500),
            refusal_window: Duration::ZERO,
            ..ServeOptions::default()
        };
        let server = TestServer::start_with(&pki, "b", opts).await;
        // Holds a TCP connection open without a byte of TLS.
        let _stalled = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let mut garbage = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();

        server.assert_serves(&pki).await;
        server
            .event("garbage HandshakeRefused", |e| {
                refused_handshake(e).is_some_and(|(_, reason)| !reason.contains("within"))
            })
            .await;
        let (presented, _) = refused_handshake(
            &server
                .event("timeout HandshakeRefused", |e| {
                    refused_handshake(e).is_some_and(|(_, reason)| reason.contains("within"))
                })
                .await,
        )
        .unwrap();
        assert!(presented.is_empty());
    })
    .await;
}

#[tokio::test]
async fn oversized_messages_are_refused_and_reported() {
    bounded(async {
        let pki = Pki::new();
        let opts = ServeOptions {
            allowed_peers: vec![PeerName::new("a").unwrap()],
            max_message_bytes: 1024,
            ..ServeOptions::default()
        };
        let server = TestServer::start_with(&pki, "b", opts).await;
        let mut client =
            connect(&server.address(), "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap();
        let big = FetchRequest { minions: vec!["m".repeat(100); 50], ..Default::default() };
        let status = client.fetch(big).await.map(drop).unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        server
            .event("RequestRefused for Fetch", |e| {
                matches!(e, TransportEvent::RequestRefused { peer, reason }
                    if peer.as_str() == "a" && reason.contains("Fetch") && reason.contains("too large"))
            })
            .await;

        let big_batch = DecisionBatch { decisions: vec![Default::default(); 1000] };
        let outcome = async {
            let mut acks = client.push(tokio_stream::iter([big_batch])).await?.into_inner();
            while acks.next().await.transpose()?.is_some() {}
            Ok::<_, tonic::Status>(())
        };
        assert!(outcome.await.is_err(), "an oversized batch must fail the push");
        server
            .event("RequestRefused for Push", |e| {
                matches!(e, TransportEvent::RequestRefused { reason, .. }
                    if reason.starts_with("Push") && reason.contains("too large"))
            })
            .await;
        server.assert_serves(&pki).await;
    })
    .await;
}
