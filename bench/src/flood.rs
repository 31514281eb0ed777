//! A configured peer, mistaken or hostile, pushing deletes of ids the master
//! never held (issue 17): `pushes` concurrent Push streams of `n_ids`
//! deletes each, with master-b's certificate, to master-a's agent (alone:
//! b and c are not started); a push refused because two are open already
//! comes back 100 ms later, so all of them get through. What it measures: how long the agent took,
//! its memory (peak and after), and how much its state store and audit log
//! grew.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use keysync_proto::v1;
use keysync_server::TlsSetup;
use salt_keysync::config::Config;
use salt_keysync::net::peers::MAX_MESSAGE_BYTES;
use serde::Serialize;

use crate::cluster::BenchCluster;
use crate::{procfs, Settings};

/// Deletes per pushed batch.
const BATCH: usize = 5_000;
/// Connections the pushing peer opens: the most a master admits from one
/// peer; the pushes share them (HTTP/2 streams).
const CONNECTIONS: usize = keysync_server::CONNECTIONS_PER_PEER;

#[derive(Debug, Serialize)]
pub struct FloodRow {
    pub pushes: usize,
    /// Deletes of distinct made-up ids in each push.
    pub ids_per_push: usize,
    /// From the first connection until every push was acknowledged.
    pub secs: f64,
    /// What the agent acknowledged: decisions received, and applied.
    pub received: u64,
    pub applied: u64,
    /// Times a push was refused because the peer had as many open as it
    /// takes (`PUSH_STREAMS_PER_PEER`), and tried again 100 ms later (every
    /// push gets through in the end).
    pub refused: u64,
    /// The agent's resident memory (VmHWM, VmRSS) before, at its peak, and after.
    pub rss_before_mib: f64,
    pub peak_rss_mib: f64,
    pub rss_after_mib: f64,
    pub store_before_bytes: u64,
    pub store_after_bytes: u64,
    pub audit_lines_added: usize,
}

pub fn run(settings: &Settings) -> anyhow::Result<FloodRow> {
    let mut cluster = BenchCluster::new(settings, "flood")?;
    cluster.start(0)?;
    let pid = cluster.pid(0).context("master-a's agent has no pid")?;
    // master-a's address and files, and master-b's TLS identity, as their
    // agents read them from their configs.
    let a = Config::load(&cluster.files[0].config_path)?;
    let store = a.state_dir.join("state.redb");
    let listen = a.listen.to_string();
    let tls = salt_keysync::setup::load_tls(&Config::load(&cluster.files[1].config_path)?)?;
    let audit_log = a.audit_log.clone();
    let before = procfs::memory(pid)?;
    let store_before_bytes = size(&store);
    let audit_before = lines(&audit_log);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = Instant::now();
    let pushed = runtime.block_on(push_all(&listen, &tls, settings.flood_pushes, settings.n_flood))?;
    let secs = started.elapsed().as_secs_f64();
    let peak = procfs::memory(pid)?;
    // What stays once the pushes are over.
    std::thread::sleep(Duration::from_secs(2));
    let after = procfs::memory(pid)?;
    let row = FloodRow {
        pushes: settings.flood_pushes,
        ids_per_push: settings.n_flood,
        secs,
        received: pushed.received,
        applied: pushed.applied,
        refused: pushed.refused,
        rss_before_mib: before.rss_mib,
        peak_rss_mib: peak.peak_since(&before),
        rss_after_mib: after.rss_mib,
        store_before_bytes,
        store_after_bytes: size(&store),
        audit_lines_added: lines(&audit_log).saturating_sub(audit_before),
    };
    cluster.stop()?;
    Ok(row)
}

/// Opens the connections, says hello on each, runs every push at once and
/// adds up their acknowledgements.
async fn push_all(listen: &str, setup: &TlsSetup, pushes: usize, n_ids: usize) -> anyhow::Result<Pushed> {
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS.min(pushes.max(1)) {
        clients.push(connect_as_master_b(listen, setup).await?);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for push in 0..pushes {
        let mut client = clients[push % clients.len()].clone();
        tasks.spawn(async move {
            let mut refused = 0u64;
            loop {
                // Batches made as the stream is read: the pusher holds one at a time.
                let batches =
                    (0..n_ids.div_ceil(BATCH)).map(move |b| batch(push, b * BATCH..((b + 1) * BATCH).min(n_ids)));
                let mut acks = match client.push(tokio_stream::iter(batches)).await {
                    Ok(acks) => acks.into_inner(),
                    // The master takes a few pushes of one peer at a time:
                    // this one comes back later, as an agent's link would.
                    Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Err(status) => return Err(status),
                };
                let (mut received, mut applied) = (0u64, 0u64);
                while let Some(ack) = acks.message().await? {
                    received += u64::from(ack.n_received);
                    applied += u64::from(ack.n_applied);
                }
                return Ok::<_, tonic::Status>(Pushed { received, applied, refused });
            }
        });
    }
    let mut all = Pushed::default();
    while let Some(done) = tasks.join_next().await {
        let one = done.context("a push task")?.context("a push")?;
        all.received += one.received;
        all.applied += one.applied;
        all.refused += one.refused;
    }
    Ok(all)
}

/// A connection to master-a at `listen` as master-b (with its TLS `setup`),
/// after Hello.
pub(crate) async fn connect_as_master_b(
    listen: &str,
    setup: &TlsSetup,
) -> anyhow::Result<v1::key_sync_client::KeySyncClient<tonic::transport::Channel>> {
    let mut client = keysync_server::connect(listen, "master-a", setup, MAX_MESSAGE_BYTES, Duration::from_secs(10))
        .await
        .with_context(|| format!("connecting to master-a at {listen}"))?;
    let hello = v1::HelloRequest {
        node: "master-b".into(),
        protocol_version: keysync_proto::PROTOCOL_VERSION,
        ..Default::default()
    };
    client.hello(hello).await.context("hello to master-a")?;
    Ok(client)
}

/// Now as a version's clock: wall-clock milliseconds, shifted.
pub(crate) fn now_hlc() -> u64 {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    (ms as u64) << 16
}

/// What the pushes were told.
#[derive(Debug, Default)]
struct Pushed {
    received: u64,
    applied: u64,
    /// Times a push was refused (the peer had as many open as it takes) and tried again.
    refused: u64,
}

/// Deletes of the made-up ids `range` of push `push`, versioned now by master-b.
fn batch(push: usize, range: std::ops::Range<usize>) -> v1::DecisionBatch {
    let hlc = now_hlc();
    let decisions = range
        .map(|i| v1::Decision {
            minion: format!("flood{push:02}-{i:07}"),
            verdict: v1::Verdict::Deleted.into(),
            version: Some(v1::Version { hlc, node: "master-b".into() }),
            ..Default::default()
        })
        .collect();
    v1::DecisionBatch { decisions }
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |bytes| bytes.iter().filter(|&&b| b == b'\n').count())
}
