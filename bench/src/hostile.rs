//! A compromised master (issue 27): master-b's certificate and key in
//! hostile hands, against master-a's agent alone (holding `keys` decided
//! keys). At once, for `secs`:
//! - stalled answers: six connections (as many as one peer may hold) open 100 Fetch streams each, every
//!   one asking for all of master-a's ids, and read none of them;
//! - oversized answers: a fake master-b at master-b's address, to which
//!   master-a's link connects, answers every Diff with `diff_summaries`
//!   summaries of made-up ids in every bucket, and every Fetch with
//!   `fetch_decisions` decisions nobody asked for.
//!
//! What it measures: master-a's memory (before, at its peak, after) and
//! how much its audit log grew, per minute.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use keysync_proto::v1;
use keysync_server::{Handler, Items, PeerName, ServeOptions};
use salt_keysync::config::Config;
use salt_keysync::net::peers::MAX_MESSAGE_BYTES;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::cluster::{seed_decided, BenchCluster};
use crate::flood::now_hlc;
use crate::{procfs, Settings};

/// Connections the stalling peer opens (the most a master admits from one
/// peer), and Fetch streams on each.
const CONNECTIONS: usize = keysync_server::CONNECTIONS_PER_PEER;
const STREAMS_PER_CONNECTION: usize = 100;
/// The Fetch streams the stalling peer opens in all.
pub const STALLED_STREAMS: usize = CONNECTIONS * STREAMS_PER_CONNECTION;
/// Summaries per Diff chunk and decisions per Fetch batch the fake peer sends.
const SUMMARIES_PER_CHUNK: usize = 20_000;
const DECISIONS_PER_BATCH: usize = 1_000;

#[derive(Debug, Serialize)]
pub struct HostileRow {
    /// Decided keys master-a holds (each stalled Fetch asks for all of them, at most 5,000).
    pub keys: usize,
    pub secs: f64,
    /// Fetch streams the stalling peer got answered (then never read), and refused.
    pub stalled: usize,
    pub refused: usize,
    /// What the fake master-b put in each answer, and how many it was asked for.
    pub diff_summaries: usize,
    pub fetch_decisions: usize,
    pub diffs_served: usize,
    pub fetches_served: usize,
    pub rss_before_mib: f64,
    pub peak_rss_mib: f64,
    pub rss_after_mib: f64,
    pub audit_lines_added: usize,
    pub audit_bytes_added: u64,
    pub audit_bytes_per_minute: f64,
}

pub fn run(settings: &Settings) -> anyhow::Result<HostileRow> {
    let mut cluster = BenchCluster::new(settings, "hostile")?;
    let keys = crate::cluster::key_pool(64);
    seed_decided(cluster.pki(0), "m", settings.n_hostile_keys, &keys)?;
    let a = Config::load(&cluster.files[0].config_path)?;
    let b = Config::load(&cluster.files[1].config_path)?;
    let tls_b = salt_keysync::setup::load_tls(&b)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    // The fake master-b listens where master-a's link looks for it.
    let fake = Arc::new(FakePeer {
        diff_summaries: settings.hostile_diff,
        fetch_decisions: settings.hostile_fetch,
        key: keys[0].clone().into_bytes(),
        diffs: AtomicUsize::new(0),
        fetches: AtomicUsize::new(0),
    });
    let (shutdown, serving) = serve_as_master_b(&runtime, &a, &tls_b, fake.clone())?;

    cluster.start(0)?;
    // master-a's link reads the fake answers first: once the attack fetches
    // from master-a, its link leaves its rounds to that "fetching" peer,
    // so a round not begun before the attack might never come in time.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.diffs.load(Ordering::SeqCst) == 0 || fake.fetches.load(Ordering::SeqCst) == 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "master-a's link asked the fake master-b for no Diff and Fetch in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = cluster.pid(0).context("master-a's agent has no pid")?;
    let audit_before = std::fs::read(&a.audit_log).unwrap_or_default();
    let before = procfs::memory(pid)?;
    let started = Instant::now();
    let ids: Vec<String> = (0..settings.n_hostile_keys.min(5_000)).map(|i| format!("m{i:07}")).collect();
    let listen = a.listen.to_string();
    let (stalled, refused, held) = runtime.block_on(stall(&listen, &tls_b, &ids))?;
    std::thread::sleep(settings.hostile_for.saturating_sub(started.elapsed()));
    let secs = started.elapsed().as_secs_f64();
    let peak = procfs::memory(pid)?;
    drop(held);
    shutdown.cancel();
    let _ = runtime.block_on(serving);
    std::thread::sleep(Duration::from_secs(2));
    let after = procfs::memory(pid)?;
    let audit_after = std::fs::read(&a.audit_log).unwrap_or_default();
    let added = audit_after.get(audit_before.len()..).unwrap_or_default();
    let audit_bytes_added = added.len() as u64;
    let row = HostileRow {
        keys: settings.n_hostile_keys,
        secs,
        stalled,
        refused,
        diff_summaries: settings.hostile_diff,
        fetch_decisions: settings.hostile_fetch,
        diffs_served: fake.diffs.load(Ordering::SeqCst),
        fetches_served: fake.fetches.load(Ordering::SeqCst),
        rss_before_mib: before.rss_mib,
        peak_rss_mib: peak.peak_since(&before),
        rss_after_mib: after.rss_mib,
        audit_lines_added: added.iter().filter(|&&b| b == b'\n').count(),
        audit_bytes_added,
        audit_bytes_per_minute: audit_bytes_added as f64 * 60.0 / secs,
    };
    cluster.stop()?;
    Ok(row)
}

/// Opens the stalled Fetch streams; returns how many were answered and
/// refused, and the answers (held unread until dropped).
async fn stall(
    listen: &str,
    setup: &keysync_server::TlsSetup,
    ids: &[String],
) -> anyhow::Result<(usize, usize, Vec<tonic::Streaming<v1::DecisionBatch>>)> {
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..CONNECTIONS {
        let client = crate::flood::connect_as_master_b(listen, setup).await?;
        for _ in 0..STREAMS_PER_CONNECTION {
            let request = v1::FetchRequest { minions: ids.to_vec(), ..Default::default() };
            match client.clone().fetch(request).await {
                Ok(answer) => held.push(answer.into_inner()),
                Err(_) => refused += 1,
            }
        }
    }
    Ok((held.len(), refused, held))
}

/// Serves `fake` where master-a's link looks for master-b, with master-b's
/// certificate, until the token returned is cancelled.
pub fn serve_as_master_b<H: Handler>(
    runtime: &tokio::runtime::Runtime,
    a: &Config,
    tls_b: &keysync_server::TlsSetup,
    fake: Arc<H>,
) -> anyhow::Result<(CancellationToken, tokio::task::JoinHandle<Result<(), keysync_server::ServeError>>)> {
    let b_address = a.peers.iter().find(|p| p.name == "master-b").context("master-a lists master-b")?.address.clone();
    let listener = runtime.block_on(tokio::net::TcpListener::bind(&b_address))?;
    let shutdown = CancellationToken::new();
    let opts = ServeOptions {
        allowed_peers: vec![PeerName::new("master-a").expect("a peer name")],
        max_message_bytes: MAX_MESSAGE_BYTES,
        ..ServeOptions::default()
    };
    let serving = runtime.spawn({
        let (shutdown, tls_b) = (shutdown.clone(), tls_b.clone());
        async move { keysync_server::serve(listener, &tls_b, opts, fake, Arc::new(|_| {}), shutdown).await }
    });
    Ok((shutdown, serving))
}

/// The Hello a fake master-b answers with: its name and protocol, nothing held.
pub fn master_b_hello() -> v1::HelloResponse {
    v1::HelloResponse {
        node: "master-b".into(),
        protocol_version: keysync_proto::PROTOCOL_VERSION,
        ..Default::default()
    }
}

/// master-b's agent as a compromised master runs it.
struct FakePeer {
    diff_summaries: usize,
    fetch_decisions: usize,
    key: Vec<u8>,
    diffs: AtomicUsize,
    fetches: AtomicUsize,
}

#[tonic::async_trait]
impl Handler for FakePeer {
    async fn hello(&self, _: &PeerName, _: v1::HelloRequest) -> Result<v1::HelloResponse, Status> {
        Ok(master_b_hello())
    }

    async fn push(&self, _: &PeerName, batch: v1::DecisionBatch) -> Result<v1::PushAck, Status> {
        Ok(v1::PushAck { n_received: batch.decisions.len() as u32, n_applied: 0 })
    }

    /// Every bucket differs, and holds made-up ids, lots of them.
    async fn diff(&self, _: &PeerName, _: v1::DiffRequest) -> Result<Items<v1::DiffChunk>, Status> {
        self.diffs.fetch_add(1, Ordering::SeqCst);
        let (n, hlc) = (self.diff_summaries, now_hlc());
        let n_chunks = n.div_ceil(SUMMARIES_PER_CHUNK).max(1);
        Ok(Box::new((0..n_chunks).map(move |c| {
            let buckets = if c == 0 { (0..1024).collect() } else { Vec::new() };
            let range = c * SUMMARIES_PER_CHUNK..((c + 1) * SUMMARIES_PER_CHUNK).min(n);
            let entries = range
                .map(|i| v1::Summary {
                    minion: format!("hostile{i:08}"),
                    version: Some(v1::Version { hlc, node: "master-b".into() }),
                    verdict: v1::Verdict::Accepted.into(),
                    fingerprint: vec![7; 32],
                })
                .collect();
            v1::DiffChunk { buckets, entries, ..Default::default() }
        })))
    }

    /// Decisions nobody asked for.
    async fn fetch(&self, _: &PeerName, _: v1::FetchRequest) -> Result<Items<v1::DecisionBatch>, Status> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let (n, hlc, key) = (self.fetch_decisions, now_hlc(), self.key.clone());
        let n_batches = n.div_ceil(DECISIONS_PER_BATCH);
        Ok(Box::new((0..n_batches).map(move |b| {
            let decisions = (b * DECISIONS_PER_BATCH..((b + 1) * DECISIONS_PER_BATCH).min(n))
                .map(|i| v1::Decision {
                    minion: format!("unasked{i:08}"),
                    verdict: v1::Verdict::Accepted.into(),
                    public_key: key.clone(),
                    version: Some(v1::Version { hlc, node: "master-b".into() }),
                    ..Default::default()
                })
                .collect();
            v1::DecisionBatch { decisions }
        })))
    }

    async fn plan(&self, _: &PeerName, _: v1::PlanRequest) -> Result<v1::PlanResponse, Status> {
        Ok(v1::PlanResponse::default())
    }
}
