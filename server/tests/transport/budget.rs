//! Budgets for authenticated peers (`budget.rs`, `control.rs`): one peer's
//! pushed batches are handled two at a time, all peers' three at a time, the
//! rest wait unread (slowed, not buffered); a peer's fifth push stream at
//! once is refused, an idle stream holds no budget, and a peer holds at most
//! six connections. An empty batch, a probe of the path, reaches no
//! handler, and waits for its peer's permits as any batch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keysync_proto::v1::{
    DecisionBatch, DiffChunk, DiffRequest, FetchRequest, HelloRequest, HelloResponse, PlanRequest, PlanResponse,
    PushAck,
};
use keysync_server::{
    serve, Handler, Items, PeerName, ServeOptions, CALLS_IN_ALL, CALLS_PER_PEER, CONNECTIONS_PER_PEER,
    PUSH_STREAMS_PER_PEER,
};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::support::{bounded, hello_from, Pki, CONNECT_TIMEOUT, MAX_MESSAGE};

/// A batch of one decision (what it holds is the handler's business: an
/// empty batch is a probe, which reaches no handler).
fn batch() -> DecisionBatch {
    DecisionBatch { decisions: vec![Default::default()] }
}

/// Counts pushes in progress, in all and per peer, each taking a while.
#[derive(Default)]
struct SlowPushes {
    now: AtomicUsize,
    most: AtomicUsize,
    now_a: AtomicUsize,
    most_a: AtomicUsize,
    done: AtomicUsize,
}

#[tonic::async_trait]
impl Handler for SlowPushes {
    async fn hello(&self, _: &PeerName, _: HelloRequest) -> Result<HelloResponse, Status> {
        Ok(HelloResponse { node: "b".into(), protocol_version: keysync_proto::PROTOCOL_VERSION, ..Default::default() })
    }

    async fn push(&self, peer: &PeerName, batch: DecisionBatch) -> Result<PushAck, Status> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        if peer.as_str() == "a" {
            let now_a = self.now_a.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_a.fetch_max(now_a, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if peer.as_str() == "a" {
            self.now_a.fetch_sub(1, Ordering::SeqCst);
        }
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
        Ok(PushAck { n_received: batch.decisions.len() as u32, n_applied: 0 })
    }

    async fn diff(&self, _: &PeerName, _: DiffRequest) -> Result<Items<DiffChunk>, Status> {
        Ok(Box::new(std::iter::empty()))
    }

    async fn fetch(&self, _: &PeerName, _: FetchRequest) -> Result<Items<DecisionBatch>, Status> {
        Ok(Box::new(std::iter::empty()))
    }

    async fn plan(&self, _: &PeerName, _: PlanRequest) -> Result<PlanResponse, Status> {
        Ok(PlanResponse::default())
    }
}

/// Master "b" serving `peers` with [`SlowPushes`]: its CA, its address,
/// the handler, and what stops it.
async fn serve_slow_pushes(peers: &[&str]) -> (Pki, String, Arc<SlowPushes>, CancellationToken) {
    let pki = Pki::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handler = Arc::new(SlowPushes::default());
    let shutdown = CancellationToken::new();
    let allowed_peers = peers.iter().map(|p| PeerName::new(p).unwrap()).collect();
    let opts = ServeOptions { allowed_peers, ..ServeOptions::default() };
    let tls = pki.setup(&["b"]);
    tokio::spawn({
        let (handler, shutdown) = (handler.clone(), shutdown.clone());
        async move { serve(listener, &tls, opts, handler, Arc::new(|_| {}), shutdown).await }
    });
    (pki, addr, handler, shutdown)
}

#[tokio::test]
async fn calls_wait_for_their_budget_and_connections_per_peer_are_capped() {
    bounded(async {
        let (pki, addr, handler, shutdown) = serve_slow_pushes(&["a", "c"]).await;
        let mut calls = Vec::new();
        for peer in ["a", "c"] {
            let client = keysync_server::connect(&addr, "b", &pki.setup(&[peer]), MAX_MESSAGE, CONNECT_TIMEOUT)
                .await
                .expect("a peer connects");
            // Eight push streams of one batch each, side by side.
            for _ in 0..8 {
                let mut client = client.clone();
                calls.push(tokio::spawn(async move {
                    let batches = tokio_stream::iter(vec![batch()]);
                    let mut acks = client.push(batches).await?.into_inner();
                    acks.message().await
                }));
            }
        }
        let (mut answered, mut refused) = (0, 0);
        for call in calls {
            match call.await.unwrap() {
                Ok(ack) => {
                    assert!(ack.is_some(), "one ack per batch");
                    answered += 1;
                }
                // A peer's fifth push stream at once.
                Err(status) if status.code() == tonic::Code::ResourceExhausted => refused += 1,
                Err(status) => panic!("a push failed: {status}"),
            }
        }
        assert_eq!(answered + refused, 16);
        assert!(answered >= 2 * CALLS_PER_PEER, "each peer's first pushes are answered: {answered}");
        assert_eq!(handler.done.load(Ordering::SeqCst), answered);
        assert!(handler.most_a.load(Ordering::SeqCst) <= CALLS_PER_PEER, "one peer's calls at once");
        assert!(handler.most.load(Ordering::SeqCst) <= CALLS_IN_ALL, "all peers' calls at once");
        assert!(handler.most.load(Ordering::SeqCst) >= 2, "the budgets still let calls run side by side");

        // A peer's connections: the first CONNECTIONS_PER_PEER serve, the next is closed.
        let mut open = Vec::new();
        for _ in 0..CONNECTIONS_PER_PEER {
            let mut client = keysync_server::connect(&addr, "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT)
                .await
                .expect("a peer connects");
            client.hello(hello_from("a")).await.expect("within the cap");
            open.push(client);
        }
        let refused = match keysync_server::connect(&addr, "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT).await
        {
            Ok(mut client) => client.hello(hello_from("a")).await.is_err(),
            Err(_) => true,
        };
        assert!(refused, "a connection past the cap is closed");
        let mut other = keysync_server::connect(&addr, "b", &pki.setup(&["c"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("another peer still connects");
        other.hello(hello_from("c")).await.expect("and is served");
        shutdown.cancel();
    })
    .await;
}

/// Probes of the path (`copies.rs` in the agent: empty batches on a push
/// stream, hundreds in a second) are answered at once, one ack each, and
/// reach no handler: the peer's core never sees them.
#[tokio::test]
async fn probes_of_the_path_are_answered_without_the_handler() {
    bounded(async {
        let (pki, addr, handler, shutdown) = serve_slow_pushes(&["a"]).await;
        let mut client = keysync_server::connect(&addr, "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("a peer connects");
        let probes = tokio_stream::iter(vec![DecisionBatch::default(); 200]);
        let mut acks = client.push(probes).await.expect("the push stream opens").into_inner();
        let mut n_acks = 0;
        while let Some(ack) = acks.message().await.expect("every probe is answered") {
            assert_eq!(ack, PushAck::default());
            n_acks += 1;
        }
        assert_eq!(n_acks, 200, "one ack per probe");
        assert_eq!(handler.done.load(Ordering::SeqCst), 0, "no probe reached the handler");

        // While two of the peer's pushes hold its two permits, a probe waits.
        let mut slow = Vec::new();
        for _ in 0..CALLS_PER_PEER {
            let mut client = client.clone();
            slow.push(tokio::spawn(async move {
                let mut acks = client.push(tokio_stream::iter([batch()])).await?.into_inner();
                acks.message().await
            }));
        }
        while handler.now_a.load(Ordering::SeqCst) < CALLS_PER_PEER {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut acks = client.push(tokio_stream::iter([DecisionBatch::default()])).await.unwrap().into_inner();
        acks.message().await.expect("the probe is answered").expect("an ack");
        assert!(handler.done.load(Ordering::SeqCst) >= 1, "the probe waited for a permit");
        for push in slow {
            push.await.unwrap().expect("the slow pushes are answered");
        }
        shutdown.cancel();
    })
    .await;
}

/// A master with four peers (five masters): every peer keeps its live push
/// stream open, idle between decisions. An idle stream holds no budget, so
/// the fourth peer's decision is read at once. (The budget was taken before
/// waiting for the next batch: three idle streams held all of it, and the
/// fourth peer's pushes waited until another peer sent something.)
#[tokio::test]
async fn idle_push_streams_hold_no_budget() {
    bounded(async {
        let pki = Pki::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shutdown = CancellationToken::new();
        let peers = ["a", "c", "d", "e"];
        let opts = ServeOptions { allowed_peers: peers.map(|p| PeerName::new(p).unwrap()).to_vec(), ..ServeOptions::default() };
        let tls = pki.setup(&["b"]);
        tokio::spawn({
            let shutdown = shutdown.clone();
            async move { serve(listener, &tls, opts, Arc::new(SlowPushes::default()), Arc::new(|_| {}), shutdown).await }
        });
        let mut idle = Vec::new();
        for peer in &peers[..CALLS_IN_ALL] {
            let mut client = keysync_server::connect(&addr, "b", &pki.setup(&[peer]), MAX_MESSAGE, CONNECT_TIMEOUT)
                .await
                .expect("a peer connects");
            // A live push stream between decisions: open, nothing sent yet.
            let acks = client.push(tokio_stream::pending::<DecisionBatch>()).await.expect("the push stream opens");
            idle.push((client, acks));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut last = keysync_server::connect(&addr, "b", &pki.setup(&["e"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("the fourth peer connects");
        let mut acks = last.push(tokio_stream::iter([batch()])).await.expect("its push stream opens").into_inner();
        let ack = tokio::time::timeout(Duration::from_secs(20), acks.message())
            .await
            .expect("the fourth peer's push is read while the others' streams are idle");
        assert!(ack.expect("an ack").is_some());

        // A peer's push streams: four open at once, the fifth refused.
        assert_eq!(PUSH_STREAMS_PER_PEER, 4);
        let (mut a, _first) = idle.swap_remove(0);
        let mut open = Vec::new();
        for _ in 1..PUSH_STREAMS_PER_PEER {
            open.push(a.push(tokio_stream::pending::<DecisionBatch>()).await.expect("another push stream opens"));
        }
        let fifth = a.push(tokio_stream::iter([DecisionBatch::default()])).await;
        let refused = fifth.expect_err("a fifth push stream at once is refused");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
        assert!(refused.message().contains("push streams open already"), "{refused}");
        drop(idle);
        shutdown.cancel();
    })
    .await;
}

/// Answers big enough to stall a reader that does not read: each Fetch
/// answer is 400 messages of 64 KiB, made one at a time as they are sent.
struct BigAnswers {
    /// Answers whose items were all dropped (sent, or the answer cut off).
    freed: Arc<AtomicUsize>,
}

/// Counts an answer as freed when its items are dropped.
struct Freed(Arc<AtomicUsize>);

impl Drop for Freed {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl Handler for BigAnswers {
    async fn hello(&self, _: &PeerName, _: HelloRequest) -> Result<HelloResponse, Status> {
        Ok(HelloResponse { node: "b".into(), protocol_version: keysync_proto::PROTOCOL_VERSION, ..Default::default() })
    }

    async fn push(&self, _: &PeerName, _: DecisionBatch) -> Result<PushAck, Status> {
        Ok(PushAck::default())
    }

    async fn diff(&self, _: &PeerName, _: DiffRequest) -> Result<Items<DiffChunk>, Status> {
        Ok(Box::new(std::iter::empty()))
    }

    async fn fetch(&self, _: &PeerName, _: FetchRequest) -> Result<Items<DecisionBatch>, Status> {
        let freed = Freed(self.freed.clone());
        let decision = keysync_proto::v1::Decision { public_key: vec![b'k'; 64 * 1024], ..Default::default() };
        Ok(Box::new((0..400).map(move |_| {
            let _ = &freed;
            DecisionBatch { decisions: vec![decision.clone()] }
        })))
    }

    async fn plan(&self, _: &PeerName, _: PlanRequest) -> Result<PlanResponse, Status> {
        Ok(PlanResponse::default())
    }
}

/// Issue 27, item 4: a peer that opens Fetch streams and never reads them
/// (the review held 400 at once with an HTTP/2 window of 0 and grew the
/// agent to 1.2 GiB) has at most two answers in flight (a third is refused),
/// and those are cut off at the answer deadline, their memory given back;
/// then it is answered again, and other peers all along.
#[tokio::test]
async fn stalled_answers_are_capped_per_peer_and_cut_off_at_the_deadline() {
    bounded(async {
        let pki = Pki::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let freed = Arc::new(AtomicUsize::new(0));
        let handler = Arc::new(BigAnswers { freed: freed.clone() });
        let shutdown = CancellationToken::new();
        let opts = ServeOptions {
            allowed_peers: vec![PeerName::new("a").unwrap(), PeerName::new("c").unwrap()],
            answer_deadline: Duration::from_secs(2),
            ..ServeOptions::default()
        };
        let tls = pki.setup(&["b"]);
        tokio::spawn({
            let shutdown = shutdown.clone();
            async move { serve(listener, &tls, opts, handler, Arc::new(|_| {}), shutdown).await }
        });
        let client = keysync_server::connect(&addr, "b", &pki.setup(&["a"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("a peer connects");
        // Opened, never read.
        let mut stalled = Vec::new();
        let mut refused = 0;
        for _ in 0..6 {
            match client.clone().fetch(FetchRequest::default()).await {
                Ok(response) => stalled.push(response.into_inner()),
                Err(status) if status.code() == tonic::Code::ResourceExhausted => refused += 1,
                Err(status) => panic!("a fetch failed: {status}"),
            }
        }
        assert_eq!((stalled.len(), refused), (keysync_server::ANSWERS_PER_PEER, 4), "two in flight, the rest refused");
        // Another peer is answered meanwhile, read whole.
        let mut other = keysync_server::connect(&addr, "b", &pki.setup(&["c"]), MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("another peer connects");
        let mut answer = other.fetch(FetchRequest::default()).await.expect("served").into_inner();
        let mut n = 0;
        while answer.message().await.expect("read whole").is_some() {
            n += 1;
        }
        assert_eq!(n, 400);
        // The stalled ones are cut off at the deadline and their memory freed.
        let t0 = std::time::Instant::now();
        while freed.load(Ordering::SeqCst) < 3 {
            assert!(t0.elapsed() < Duration::from_secs(30), "the stalled answers were never cut off");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Read now: what was buffered, then the cut.
        let mut cut = 0;
        for mut stream in stalled {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => break,
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status}");
                        cut += 1;
                        break;
                    }
                }
            }
        }
        assert_eq!(cut, keysync_server::ANSWERS_PER_PEER, "a reader that comes back learns it was cut off");
        client.clone().fetch(FetchRequest::default()).await.expect("places given back: answered again");
        shutdown.cancel();
    })
    .await;
}
