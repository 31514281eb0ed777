//! Prometheus metrics of one agent, and the small HTTP endpoint that serves
//! them on the opt-in `metrics_listen` address (no listener unless it is set).
//!
//! The metrics always exist (updating an atomic is cheaper than asking
//! whether anyone scrapes); only the listener is optional.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    pub peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabel {
    pub peer: String,
    /// `sent` or `received`.
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReceivedLabel {
    pub peer: String,
    /// `push` (the peer pushed them) or `fetch` (this master fetched them in a round).
    pub how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettingLabel {
    pub peer: String,
    pub setting: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    node: String,
    version: &'static str,
    protocol_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OriginLabel {
    /// The master where the deletes were made.
    pub origin: String,
}

/// A master (this one or a peer) and one of its key-acceptance settings.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AutoAcceptLabel {
    pub master: String,
    pub setting: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SaltLabel {
    pub master: String,
    /// Empty while unknown.
    pub salt_version: String,
}

/// Every metric of the agent, registered under `keysync_`.
pub struct Metrics {
    registry: Registry,
    pub decisions_applied: Counter,
    pub decisions_refused: Counter,
    pub decisions_conflicted: Counter,
    /// Decisions that came from a peer, newer or not, per peer and way.
    pub decisions_received: Family<ReceivedLabel, Counter>,
    /// Live decisions pushed a second time, on the link's other connection,
    /// while the path to the peer loses packets.
    pub decisions_copied: Family<PeerLabel, Counter>,
    pub propagation_latency: Histogram,
    pub peer_up: Family<PeerLabel, Gauge>,
    /// Unix time of the last message from the peer.
    pub peer_last_contact: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    pub anti_entropy_runs: Family<PeerLabel, Counter>,
    pub anti_entropy_bytes: Family<BytesLabel, Counter>,
    pub master_key_mismatch: Family<PeerLabel, Gauge>,
    pub settings_drift: Family<SettingLabel, Gauge>,
    pub master_auto_accept: Family<AutoAcceptLabel, Gauge>,
    pub master_salt_info: Family<SaltLabel, Gauge>,
    /// Failed writes of key files, syncfs, the store or its journal.
    pub write_failures: Counter,
    /// Peers' deletes of accepted keys the blast-radius guard holds here, per origin.
    pub held_deletes: Family<OriginLabel, Gauge>,
    /// Bursts of deletes the guard held here, per origin.
    pub held_bursts: Family<OriginLabel, Counter>,
    /// Mass deletes made on this master that its peers' guards hold.
    pub mass_deletes_here: Counter,
    /// Peers' decisions refused, per peer and cause, for `status` (not exported).
    pub refused: crate::ops::refused::Refused,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Drops every series of a peer removed by a reload, so no gauge of a
    /// peer that is gone stays up (or in mismatch) forever.
    pub fn forget_peer(&self, peer: &str) {
        let origin = OriginLabel { origin: peer.to_string() };
        self.held_deletes.remove(&origin);
        self.held_bursts.remove(&origin);
        let label = PeerLabel { peer: peer.to_string() };
        self.peer_up.remove(&label);
        self.peer_last_contact.remove(&label);
        self.anti_entropy_runs.remove(&label);
        self.decisions_copied.remove(&label);
        for how in ["push", "fetch"] {
            self.decisions_received.remove(&ReceivedLabel { peer: peer.to_string(), how });
        }
        self.master_key_mismatch.remove(&label);
        for direction in ["sent", "received"] {
            self.anti_entropy_bytes.remove(&BytesLabel { peer: peer.to_string(), direction });
        }
        for setting in crate::disk::health::compared_settings() {
            self.settings_drift.remove(&SettingLabel { peer: peer.to_string(), setting: setting.to_string() });
        }
    }

    /// The metrics of the agent of `node`.
    pub fn new(node: &str) -> Metrics {
        let mut registry = Registry::with_prefix("keysync");
        let build_info: Family<BuildLabel, Gauge> = Family::default();
        build_info
            .get_or_create(&BuildLabel {
                node: node.to_string(),
                version: env!("CARGO_PKG_VERSION"),
                protocol_version: keysync_proto::PROTOCOL_VERSION.to_string(),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1: this agent's node name, version and wire protocol version",
            build_info,
        );
        let decisions_applied = Counter::default();
        let decisions_refused = Counter::default();
        let decisions_conflicted = Counter::default();
        let decisions_received = Family::default();
        let decisions_copied = Family::default();
        // 0.5 ms .. ~16 s: the targets are milliseconds, a partition is seconds.
        let propagation_latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let peer_up = Family::default();
        let peer_last_contact = Family::default();
        let anti_entropy_runs = Family::default();
        let anti_entropy_bytes = Family::default();
        let master_key_mismatch = Family::default();
        let settings_drift = Family::default();
        let master_auto_accept = Family::default();
        let master_salt_info = Family::default();
        let write_failures = Counter::default();
        let held_deletes = Family::default();
        let held_bursts = Family::default();
        let mass_deletes_here = Counter::default();
        registry.register(
            "decisions_applied",
            "Decisions from peers that were newer and were written to this master's key folders",
            decisions_applied.clone(),
        );
        registry.register(
            "decisions_refused",
            "Decisions from peers refused (invalid fields, private keys, clock too far ahead)",
            decisions_refused.clone(),
        );
        registry.register(
            "decisions_conflicted",
            "Concurrent decisions for one minion detected here (the later one won)",
            decisions_conflicted.clone(),
        );
        registry.register(
            "decisions_received",
            "Decisions that came from the peer, pushed by it or fetched from it, whether they were newer or not",
            decisions_received.clone(),
        );
        registry.register(
            "decisions_copied",
            "Live decisions pushed to the peer a second time, on the link's other connection, while the path loses packets or has not told yet",
            decisions_copied.clone(),
        );
        registry.register(
            "propagation_latency_seconds",
            "From the decision on its origin master (HLC time) to applied here",
            propagation_latency.clone(),
        );
        registry.register("peer_up", "1 while the link to the peer is up, else 0", peer_up.clone());
        registry.register(
            "peer_last_contact_timestamp_seconds",
            "Unix time of the last message from the peer, on either direction",
            peer_last_contact.clone(),
        );
        registry.register("anti_entropy_runs", "Anti-entropy rounds run with the peer", anti_entropy_runs.clone());
        registry.register(
            "anti_entropy_bytes",
            "Protobuf bytes of anti-entropy messages exchanged with the peer",
            anti_entropy_bytes.clone(),
        );
        registry.register(
            "master_key_mismatch",
            "1 when the peer's master.pub fingerprint differs from this master's",
            master_key_mismatch.clone(),
        );
        registry.register(
            "settings_drift",
            "1 when the peer's value of a must-agree or key-acceptance master setting differs from this master's",
            settings_drift.clone(),
        );
        registry.register(
            "master_auto_accept",
            "1 when the master (this one or a peer, as last reported) accepts keys by itself through that setting",
            master_auto_accept.clone(),
        );
        registry.register(
            "master_salt_info",
            "Always 1, per master known (this one and the peers): its salt-master version",
            master_salt_info.clone(),
        );
        registry.register(
            "write_failures",
            "Failed writes of key files, syncfs, the state store or its journal (each failed retry counts)",
            write_failures.clone(),
        );
        registry.register(
            "held_deletes",
            "Peers' deletes of accepted keys the blast-radius guard holds here until an operator releases or reverts them, per origin master",
            held_deletes.clone(),
        );
        registry.register(
            "held_bursts",
            "Bursts of deletes of accepted keys from one origin that went past the guard's limit here",
            held_bursts.clone(),
        );
        registry.register(
            "mass_deletes_here",
            "Bursts of deletes of accepted keys made on this master past the guard's limit (its peers hold them)",
            mass_deletes_here.clone(),
        );
        Metrics {
            registry,
            decisions_applied,
            decisions_refused,
            decisions_conflicted,
            decisions_received,
            decisions_copied,
            propagation_latency,
            peer_up,
            peer_last_contact,
            anti_entropy_runs,
            anti_entropy_bytes,
            master_key_mismatch,
            settings_drift,
            master_auto_accept,
            master_salt_info,
            write_failures,
            held_deletes,
            held_bursts,
            mass_deletes_here,
            refused: Default::default(),
        }
    }

    /// `n` decisions from `peer` refused for `cause`: counted in all, and
    /// per peer for `status`.
    pub fn count_refused(&self, peer: &str, cause: crate::ops::refused::Cause, n: u64) {
        self.decisions_refused.inc_by(n);
        self.refused.count(peer, cause, n);
    }

    /// Exports 0 held deletes and bursts for each of `peers`, so the series
    /// exist (and an alert on them can be evaluated) before anything is held.
    pub fn know_peers<'a>(&self, peers: impl IntoIterator<Item = &'a str>) {
        for peer in peers {
            let origin = OriginLabel { origin: peer.to_string() };
            self.held_deletes.get_or_create(&origin).set(0);
            self.held_bursts.get_or_create(&origin).inc_by(0);
        }
    }

    /// Exports the audit log's own count of failed writes and flushes.
    pub fn count_audit_failures(&mut self, failures: Counter) {
        self.registry.register(
            "audit_write_failures",
            "Failed writes or flushes of the audit log (records not written are counted in a later lost record)",
            failures,
        );
    }

    /// Counts a peer's decision applied here; `origin_ms`: the wall-clock
    /// part of its HLC version (0 for bootstrap versions: not a latency).
    pub fn applied(&self, origin_ms: u64, now_ms: u64) {
        self.decisions_applied.inc();
        if origin_ms > 0 {
            // A peer's clock slightly ahead would give a negative latency.
            self.propagation_latency.observe(now_ms.saturating_sub(origin_ms) as f64 / 1000.0);
        }
    }

    /// `n` decisions came from `peer`, `how`: `push` or `fetch`.
    pub fn received(&self, peer: &str, how: &'static str, n: usize) {
        self.decisions_received.get_or_create(&ReceivedLabel { peer: peer.into(), how }).inc_by(n as u64);
    }

    /// `n` live decisions went to `peer` a second time (see `net/peers/push.rs`).
    pub fn copied(&self, peer: &str, n: usize) {
        self.decisions_copied.get_or_create(&PeerLabel { peer: peer.into() }).inc_by(n as u64);
    }

    pub fn anti_entropy_bytes(&self, peer: &str, direction: &'static str, n_bytes: usize) {
        self.anti_entropy_bytes.get_or_create(&BytesLabel { peer: peer.into(), direction }).inc_by(n_bytes as u64);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `address` for the metrics endpoint.
pub async fn bind(address: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address).await.with_context(|| format!("metrics_listen: cannot listen on {address}"))
}

/// Serves `GET /metrics` until `shutdown`, to the addresses in `allow`
/// (empty: any).
pub async fn serve(
    listener: TcpListener,
    allow: Vec<std::net::IpAddr>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use super::scrape_listener::{Bounds, ScrapeListener};
    // Bounded in connections, sources and time (see `scrape_listener.rs`).
    serve_on(ScrapeListener::new(listener, Bounds::with_allow(allow)), metrics, shutdown).await
}

/// [`serve`] on a listener already bounded.
pub async fn serve_on(
    listener: super::scrape_listener::ScrapeListener,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], metrics.encode()) }
        }),
    );
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_histogram_and_labelled_gauges() {
        let metrics = Metrics::new("master-a");
        metrics.applied(1_000, 1_003);
        metrics.applied(0, 5_000);
        metrics.peer_up.get_or_create(&PeerLabel { peer: "master-b".into() }).set(1);
        metrics.anti_entropy_bytes("master-b", "sent", 8200);
        metrics.received("master-b", "push", 3);
        metrics.received("master-b", "fetch", 2);
        let text = metrics.encode();
        for want in [
            "keysync_decisions_applied_total 2",
            "keysync_propagation_latency_seconds_count 1",
            "keysync_peer_up{peer=\"master-b\"} 1",
            "keysync_anti_entropy_bytes_total{peer=\"master-b\",direction=\"sent\"} 8200",
            "keysync_decisions_received_total{peer=\"master-b\",how=\"push\"} 3",
            "keysync_decisions_received_total{peer=\"master-b\",how=\"fetch\"} 2",
            format!(
                "keysync_build_info{{node=\"master-a\",version=\"{}\",protocol_version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                keysync_proto::PROTOCOL_VERSION
            )
            .as_str(),
            "keysync_write_failures_total 0",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }
}
