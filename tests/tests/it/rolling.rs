//! Issue 29 item 1: a rolling upgrade. An agent of the previous release
//! (protocol 1 only) refuses this release's Hello; this release's link then
//! speaks protocol 1 to it, so its decisions reach the old master live, in
//! milliseconds, not only through the old agent's anti-entropy a minute later.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keysync_proto::v1;
use keysync_server::{Handler, Items, PeerName, ServeOptions};
use keysync_tests::cluster::TestCluster;
use keysync_tests::salt_ops::{master_writes_pending, move_key, new_public_key, SaltLine};
use keysync_tests::wait_until;
use salt_keysync::config::Config;
use tonic::Status;

/// master-b as an agent of protocol 1 answers: it refuses any other Hello
/// as 0.1.0 did, and notes the ids pushed to it.
#[derive(Default)]
struct ProtocolOne {
    pushed: Mutex<Vec<String>>,
    hellos: Mutex<Vec<u32>>,
}

#[tonic::async_trait]
impl Handler for ProtocolOne {
    async fn hello(&self, _: &PeerName, req: v1::HelloRequest) -> Result<v1::HelloResponse, Status> {
        self.hellos.lock().unwrap().push(req.protocol_version);
        if req.protocol_version != 1 {
            return Err(Status::failed_precondition(format!(
                "protocol version {} is not supported (this server speaks 1)",
                req.protocol_version
            )));
        }
        Ok(v1::HelloResponse { node: "master-b".into(), protocol_version: 1, ..Default::default() })
    }

    async fn push(&self, _: &PeerName, batch: v1::DecisionBatch) -> Result<v1::PushAck, Status> {
        let n = batch.decisions.len() as u32;
        self.pushed.lock().unwrap().extend(batch.decisions.into_iter().map(|d| d.minion));
        Ok(v1::PushAck { n_received: n, n_applied: n })
    }

    async fn diff(&self, _: &PeerName, _: v1::DiffRequest) -> Result<Items<v1::DiffChunk>, Status> {
        // Nothing differs: only live pushes carry decisions here.
        Ok(Box::new(std::iter::once(v1::DiffChunk::default())))
    }

    async fn fetch(&self, _: &PeerName, _: v1::FetchRequest) -> Result<Items<v1::DecisionBatch>, Status> {
        Ok(Box::new(std::iter::empty()))
    }

    async fn plan(&self, _: &PeerName, _: v1::PlanRequest) -> Result<v1::PlanResponse, Status> {
        Err(Status::unimplemented("protocol 1 has no Plan"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_release_speaks_protocol_one_to_an_agent_of_the_previous_release() {
    let mut cluster = TestCluster::start(2).await;
    // master-b's agent is replaced by one of the previous release, at its address.
    cluster.stop(1).await;
    let b = Config::load(&cluster.agents[1].files.config_path).unwrap();
    let tls = salt_keysync::setup::load_tls(&b).unwrap();
    let listener = tokio::net::TcpListener::bind(cluster.agents[1].addr).await.unwrap();
    let old = Arc::new(ProtocolOne::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let opts = ServeOptions { allowed_peers: vec![PeerName::new("master-a").unwrap()], ..ServeOptions::default() };
    tokio::spawn({
        let (old, shutdown) = (old.clone(), shutdown.clone());
        async move { keysync_server::serve(listener, &tls, opts, old, Arc::new(|_| {}), shutdown).await }
    });
    wait_until(Duration::from_secs(20), "master-a's link says hello in protocol 1", || {
        old.hellos.lock().unwrap().contains(&1)
    })
    .await;
    let key = new_public_key();
    master_writes_pending(cluster.pki(0), "web01", &key);
    let decided = Instant::now();
    move_key(SaltLine::S3008, cluster.pki(0), "web01", "minions");
    wait_until(Duration::from_secs(20), "web01 pushed to the old master", || {
        old.pushed.lock().unwrap().iter().any(|id| id == "web01")
    })
    .await;
    let took = decided.elapsed();
    eprintln!("an accept on this release reached the protocol-1 master in {took:?}");
    // Live, not by the old agent's own anti-entropy a minute later.
    assert!(took < Duration::from_secs(5), "{took:?}");
    let hellos = old.hellos.lock().unwrap().clone();
    assert!(hellos.contains(&keysync_proto::PROTOCOL_VERSION) && hellos.contains(&1), "{hellos:?}");
    shutdown.cancel();
    cluster.shutdown().await;
}
