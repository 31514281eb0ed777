//! A burst of single accepts reaches a slow peer in a few push batches, not
//! one batch per key. Salt 3008's `salt-key -A` moves one key at a time, and
//! the peer makes each batch it receives durable (a syncfs, a store commit):
//! pushed one decision a batch, 10,000 accepts took the peer 0.9–3.3 s
//! instead of milliseconds. A link has at most two batches unacknowledged;
//! what the node decides meanwhile goes out as one batch at the next
//! acknowledgement.
//!
//! A fake master-b holds its first acknowledgement until master-a's agent
//! has audited every accept, then counts the batches it was pushed. The
//! same holds while a round runs (the fake holds its Diff answer too): the
//! link pushes during rounds, to the same window.
//! An earlier build pushed each decision of a round as its own batch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keysync_bench::cluster::{key_pool, write_key, BenchCluster};
use keysync_proto::v1;
use keysync_server::{Handler, Items, PeerName};
use salt_keysync::config::Config;
use tokio::sync::watch;
use tonic::Status;

/// Keys accepted on master-a while master-b holds its first acknowledgement.
const N_KEYS: usize = 300;

#[test]
fn a_burst_of_accepts_reaches_a_slow_peer_in_a_few_batches() {
    burst_to_a_slow_peer(false);
}

#[test]
fn a_burst_during_a_round_reaches_a_slow_peer_in_a_few_batches() {
    burst_to_a_slow_peer(true);
}

/// `in_round`: master-b holds its Diff answer as well, so the burst comes
/// while master-a's link waits in its first round.
fn burst_to_a_slow_peer(in_round: bool) {
    let settings = keysync_bench::Settings::quick();
    let mut cluster = BenchCluster::new(&settings, "push-flow").expect("the agents' files");
    let a = Config::load(&cluster.files[0].config_path).expect("master-a's config");
    let b = Config::load(&cluster.files[1].config_path).expect("master-b's config");
    let tls_b = salt_keysync::setup::load_tls(&b).expect("master-b's TLS");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (release, released) = watch::channel(false);
    let slow = Arc::new(SlowPeer { released, in_round, diffs: AtomicUsize::new(0), batches: Mutex::new(Vec::new()) });
    let (shutdown, serving) =
        keysync_bench::hostile::serve_as_master_b(&runtime, &a, &tls_b, slow.clone()).expect("a fake master-b");

    cluster.start(0).expect("master-a starts");
    wait(Duration::from_secs(60), "master-a's link began its first round with master-b", || {
        slow.diffs.load(Ordering::SeqCst) > 0
    });
    if !in_round {
        // The round is over before the burst: no round compares meanwhile
        // (the next comes 30 s or more later), so every accept is pushed
        // live. (A round that overlaps pushes what it finds master-b
        // lacking and was not pushed yet: one batch more.)
        wait(Duration::from_secs(60), "master-a's link to master-b is up", || {
            let log = std::fs::read_to_string(cluster.log(0)).unwrap_or_default();
            log.lines().any(|line| line.contains("peer=master-b") && line.contains(": connected n_decisions="))
        });
    }
    // Accepts as salt-key makes them: each key renamed into minions/.
    let pki = cluster.pki(0).to_path_buf();
    let staging = cluster.files[0].dir.join("keys-to-accept");
    std::fs::create_dir_all(&staging).unwrap();
    let keys = key_pool(8);
    for i in 0..N_KEYS {
        let name = format!("burst{i:04}");
        write_key(&staging.join(&name), &keys[i % keys.len()]).unwrap();
        std::fs::rename(staging.join(&name), pki.join("minions").join(&name)).unwrap();
        // One at a time, as Salt 3008 accepts: each its own decision batch.
        std::thread::sleep(Duration::from_millis(3));
    }
    wait(Duration::from_secs(60), "master-a audited every accept", || {
        let audit = std::fs::read_to_string(&a.audit_log).unwrap_or_default();
        audit.lines().filter(|l| l.contains(r#""action":"accept""#) && l.contains(r#""minion":"burst"#)).count()
            == N_KEYS
    });
    // What the link can take meanwhile, it has taken.
    std::thread::sleep(Duration::from_millis(500));
    release.send(true).unwrap();
    wait(Duration::from_secs(60), "master-b was pushed every accept", || {
        let batches = slow.batches.lock().unwrap();
        let mut ids: Vec<&String> = batches.iter().flatten().collect();
        ids.sort();
        ids.dedup();
        ids.len() == N_KEYS
    });
    let sizes: Vec<usize> = slow.batches.lock().unwrap().iter().map(Vec::len).collect();
    shutdown.cancel();
    let _ = runtime.block_on(serving);
    cluster.stop().expect("master-a stops");
    // Two batches before the first acknowledgement, then everything else in one.
    assert!(sizes.len() <= 3, "{} push batches for {N_KEYS} accepts: {sizes:?}", sizes.len());
    // Each accept once.
    assert_eq!(sizes.iter().sum::<usize>(), N_KEYS, "accepts pushed twice: {sizes:?}");
}

fn wait(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// master-b's agent, slow to make its first push durable.
struct SlowPeer {
    released: watch::Receiver<bool>,
    /// Its Diff answer waits for the release too.
    in_round: bool,
    diffs: AtomicUsize,
    /// The ids of each batch pushed, in order.
    batches: Mutex<Vec<Vec<String>>>,
}

#[tonic::async_trait]
impl Handler for SlowPeer {
    async fn hello(&self, _: &PeerName, _: v1::HelloRequest) -> Result<v1::HelloResponse, Status> {
        Ok(keysync_bench::hostile::master_b_hello())
    }

    async fn push(&self, _: &PeerName, batch: v1::DecisionBatch) -> Result<v1::PushAck, Status> {
        let ids: Vec<String> = batch.decisions.iter().map(|d| d.minion.clone()).collect();
        let n_received = ids.len() as u32;
        self.batches.lock().unwrap().push(ids);
        let mut released = self.released.clone();
        let _ = released.wait_for(|r| *r).await;
        Ok(v1::PushAck { n_received, n_applied: n_received })
    }

    /// Holds nothing: every bucket differs, with no entries (in a round
    /// held until the release: nothing differs).
    async fn diff(&self, _: &PeerName, _: v1::DiffRequest) -> Result<Items<v1::DiffChunk>, Status> {
        self.diffs.fetch_add(1, Ordering::SeqCst);
        if self.in_round {
            // Then nothing differs: the round pushes nothing of its own.
            let _ = self.released.clone().wait_for(|r| *r).await;
            return Ok(Box::new(std::iter::once(v1::DiffChunk::default())));
        }
        let all = v1::DiffChunk { buckets: (0..1024).collect(), ..Default::default() };
        Ok(Box::new(std::iter::once(all)))
    }

    async fn fetch(&self, _: &PeerName, _: v1::FetchRequest) -> Result<Items<v1::DecisionBatch>, Status> {
        Ok(Box::new(std::iter::empty()))
    }

    async fn plan(&self, _: &PeerName, _: v1::PlanRequest) -> Result<v1::PlanResponse, Status> {
        Ok(v1::PlanResponse::default())
    }
}
