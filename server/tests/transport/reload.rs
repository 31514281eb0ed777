//! Live reload of a listener: a peer no longer admitted loses its open connection and cannot
//! reconnect, an unchanged peer keeps its connection, and new TLS material is served at once.

use std::sync::{Arc, Mutex};

use keysync_server::{
    connect, connect_once, serve_with, ListenerControl, PeerName, ServeOptions, TlsMaterial, TlsSetup, TransportEvent,
};

use crate::support::{bounded, chain, hello_from, EchoHandler, Pki, CONNECT_TIMEOUT, MAX_MESSAGE};

struct Controlled {
    address: String,
    control: ListenerControl,
    events: Arc<Mutex<Vec<TransportEvent>>>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Controlled {
    async fn start(tls: TlsSetup, allowed: &[&str]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let control = ListenerControl::new(tls, allowed.iter().map(|s| PeerName::new(s).unwrap()).collect());
        let events = Arc::new(Mutex::new(Vec::new()));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let sink = events.clone();
        let on_event = Arc::new(move |e| sink.lock().unwrap().push(e));
        let handler = Arc::new(EchoHandler::default());
        tokio::spawn(serve_with(
            listener,
            control.clone(),
            ServeOptions::default(),
            handler,
            on_event,
            shutdown.clone(),
        ));
        Self { address, control, events, shutdown }
    }

    fn n_connected(&self, peer: &str) -> usize {
        let events = self.events.lock().unwrap();
        events.iter().filter(|e| matches!(e, TransportEvent::Connected { peer: p, .. } if p.as_str() == peer)).count()
    }

    fn saw_unknown(&self, name: &str) -> bool {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .any(|e| matches!(e, TransportEvent::UnknownPeer { presented, .. } if presented.iter().any(|p| p == name)))
    }
}

impl Drop for Controlled {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn hello(
    client: &mut keysync_proto::v1::key_sync_client::KeySyncClient<tonic::transport::Channel>,
    node: &str,
) -> Result<(), String> {
    client.hello(hello_from(node)).await.map(drop).map_err(|e| chain(&e))
}

#[tokio::test]
async fn removed_peer_is_cut_off_and_unchanged_peer_keeps_its_connection() {
    bounded(async {
        let pki = Pki::new();
        let server = Controlled::start(pki.setup(&["b"]), &["a", "c"]).await;
        let tls_a = pki.setup(&["a"]);
        let tls_c = pki.setup(&["c"]);
        let mut client_a = connect(&server.address, "b", &tls_a, MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap();
        let mut client_c = connect(&server.address, "b", &tls_c, MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap();
        hello(&mut client_a, "a").await.unwrap();
        hello(&mut client_c, "c").await.unwrap();
        assert_eq!((server.n_connected("a"), server.n_connected("c")), (1, 1));

        let closed = server.control.reload(pki.setup(&["b"]), vec![PeerName::new("c").unwrap()]);
        assert_eq!(closed.iter().map(|p| p.as_str()).collect::<Vec<_>>(), ["a"]);
        assert_eq!(server.control.allowed_peers(), ["c"]);

        // a's connection is gone; its channel's reconnect is refused as an unknown peer.
        let err = hello(&mut client_a, "a").await.unwrap_err();
        assert!(!err.is_empty());
        let fresh = connect(&server.address, "b", &tls_a, MAX_MESSAGE, CONNECT_TIMEOUT).await;
        if let Ok(mut fresh) = fresh {
            // TLS 1.3: the server's refusal of our certificate shows on the first call.
            assert!(hello(&mut fresh, "a").await.is_err(), "a is no longer admitted");
        }
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while !server.saw_unknown("a") {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a's new handshake is reported as an unknown peer");

        // c's connection was never dropped: the same connection answers, no new handshake.
        hello(&mut client_c, "c").await.unwrap();
        assert_eq!(server.n_connected("c"), 1, "c reconnected: its link was dropped by the reload");
    })
    .await;
}

#[tokio::test]
async fn new_certificate_and_ca_apply_to_the_next_handshake() {
    bounded(async {
        let old = Pki::named("old CA");
        let new = Pki::named("new CA");
        let server = Controlled::start(old.setup(&["b"]), &["a"]).await;
        let trusts_new = new.setup(&["a"]);
        let err = connect(&server.address, "b", &trusts_new, MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap_err();
        assert!(chain(&err).to_lowercase().contains("certificate"), "{}", chain(&err));

        // The node moves to the new CA; both CAs stay trusted during the change.
        let moved = new.node(&["b"]);
        let both = TlsMaterial { ca_pem: [old.ca.cert_pem(), new.ca.cert_pem()].concat().into_bytes(), ..moved };
        server.control.reload(TlsSetup::new(&both).unwrap(), vec![PeerName::new("a").unwrap()]);
        let mut client = connect(&server.address, "b", &trusts_new, MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("the new certificate is served after the reload");
        hello(&mut client, "a").await.unwrap();
        // A peer still on the old CA is admitted too (the bundle trusts it), but it cannot verify
        // the new server certificate: its connect fails on its own side.
        let trusts_old = old.setup(&["a"]);
        assert!(connect(&server.address, "b", &trusts_old, MAX_MESSAGE, CONNECT_TIMEOUT).await.is_err());
        assert_eq!(server.control.close_connections(), 1);
        // The channel notices the close and reconnects with a new handshake.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while !(hello(&mut client, "a").await.is_ok() && server.n_connected("a") == 2) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("closed, then reconnected with a second handshake");
    })
    .await;
}

/// A channel of `connect_once` whose connection is closed is not connected
/// again: its calls fail (an agent's link then starts a session of its own,
/// with the TLS material of then), where `connect`'s makes a new handshake.
/// Its probe reads the connection while it is open, and nothing after.
#[tokio::test]
async fn a_connection_made_once_is_not_made_again() {
    bounded(async {
        let pki = Pki::named("ca");
        let server = Controlled::start(pki.setup(&["b"]), &["a"]).await;
        let tls = pki.setup(&["a"]);
        let (mut once, probe) = connect_once(&server.address, "b", &tls, MAX_MESSAGE, CONNECT_TIMEOUT).await.unwrap();
        hello(&mut once, "a").await.unwrap();
        let sent = probe.sent().expect("the connection is open");
        assert!(sent.segments > 0 && sent.retransmitted == 0, "{sent:?}");
        // The listener's side of it, as the peer's link reads it.
        let a = PeerName::new("a").unwrap();
        let inbound = server.control.probes(&a);
        assert_eq!(inbound.len(), 1, "one connection of master-a's");
        let answered = inbound[0].sent().expect("open on the listener's side too");
        assert!(answered.segments > 0 && !inbound[0].loses_packets(), "{answered:?}");
        assert_eq!(server.control.close_connections(), 1);
        // Until the channel notices the close, a call may still go on the old connection.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while hello(&mut once, "a").await.is_ok() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the call fails once the connection is closed");
        for _ in 0..3 {
            assert!(hello(&mut once, "a").await.is_err(), "no new connection answers");
        }
        assert_eq!(server.n_connected("a"), 1, "no second handshake");
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while probe.sent().is_some() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the closed connection is not read");
        assert!(server.control.probes(&a).is_empty(), "nor is the listener's side");
    })
    .await;
}
