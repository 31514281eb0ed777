//! The happy path: an admitted peer calls every method, and the handler sees its name.

use std::time::Duration;

use keysync_proto::v1::{Decision, DecisionBatch, DiffRequest, FetchRequest};
use keysync_server::{connect, PeerName, TransportEvent};
use tokio_stream::StreamExt;

use crate::support::{bounded, hello_from, Pki, TestServer, CONNECT_TIMEOUT, MAX_MESSAGE};

fn batch(n: usize) -> DecisionBatch {
    DecisionBatch {
        decisions: (0..n).map(|i| Decision { minion: format!("minion-{i}"), ..Decision::default() }).collect(),
    }
}

#[tokio::test]
async fn hello_push_diff_fetch_over_mutual_tls() {
    bounded(async {
        let pki = Pki::new();
        let server = TestServer::start(&pki, "b", &["a", "c"]).await;
        let tls = pki.setup(&["a"]);
        let mut client = connect(&server.address(), "b", &tls, MAX_MESSAGE, CONNECT_TIMEOUT).await.expect("connect");

        let hello = client.hello(hello_from("a")).await.expect("hello").into_inner();
        assert_eq!((hello.node.as_str(), hello.n_decisions), ("b", 42));
        let connected = server.event("Connected", |e| matches!(e, TransportEvent::Connected { .. })).await;
        assert!(matches!(&connected, TransportEvent::Connected { peer, .. } if peer.as_str() == "a"), "{connected:?}");

        let batches = vec![batch(1), batch(4), batch(10)];
        let mut acks = client.push(tokio_stream::iter(batches)).await.expect("push").into_inner();
        let mut received = Vec::new();
        while let Some(ack) = acks.next().await {
            let ack = ack.expect("ack");
            received.push((ack.n_received, ack.n_applied));
        }
        assert_eq!(received, [(1, 0), (4, 2), (10, 5)]);

        let chunks: Vec<_> = client
            .diff(DiffRequest { n_buckets: 3, digests: vec![0; 3], ..Default::default() })
            .await
            .expect("diff")
            .into_inner()
            .collect::<Result<_, _>>()
            .await
            .expect("diff chunks");
        let buckets: Vec<_> = chunks.iter().flat_map(|c| c.buckets.clone()).collect();
        assert_eq!(buckets, [0, 1, 2]);

        let fetched: Vec<_> = client
            .fetch(FetchRequest { minions: vec!["x".into(), "y".into()], ..Default::default() })
            .await
            .expect("fetch")
            .into_inner()
            .collect::<Result<_, _>>()
            .await
            .expect("fetched batches");
        assert_eq!(fetched.len(), 2);

        let callers = server.handler.callers.lock().unwrap().clone();
        let calls: Vec<_> = callers.iter().map(|(call, _)| call.as_str()).collect();
        assert_eq!(calls, ["hello", "push", "push", "push", "diff", "fetch"]);
        assert!(callers.iter().all(|(_, peer)| *peer == PeerName::new("a").unwrap()));
    })
    .await;
}

#[tokio::test]
async fn shutdown_returns_while_a_push_stream_is_open() {
    bounded(async {
        let pki = Pki::new();
        let mut server = TestServer::start(&pki, "b", &["a"]).await;
        let tls = pki.setup(&["a"]);
        let mut client = connect(&server.address(), "b", &tls, MAX_MESSAGE, CONNECT_TIMEOUT).await.expect("connect");
        // A Push whose request stream never ends, as a live peer's does.
        let (tx, rx) = tokio::sync::mpsc::channel::<DecisionBatch>(1);
        tx.send(batch(1)).await.unwrap();
        let mut acks = client.push(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("push").into_inner();
        assert_eq!(acks.next().await.unwrap().unwrap().n_received, 1);

        server.shutdown.cancel();
        let served = tokio::time::timeout(Duration::from_secs(10), &mut server.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task");
        assert!(served.is_ok(), "{served:?}");
        drop(tx);
    })
    .await;
}
