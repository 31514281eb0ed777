//! Prometheus metrics of one agent, and the small HTTP endpoint that serves
//! them on the opt-in `metrics_listen` address (no listener unless it is set).
//!
//! The metrics always exist (updating an atomic is cheaper than asking
//! whether anyone scrapes); only the listener is optional.

use std::net::SocketAddr;
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
pub struct SettingLabel {
    pub peer: String,
    pub setting: String,
}

/// Every metric of the agent, registered under `keysync_`.
pub struct Metrics {
    registry: Registry,
    pub decisions_applied: Counter,
    pub decisions_refused: Counter,
    pub decisions_conflicted: Counter,
    pub propagation_latency: Histogram,
    pub peer_up: Family<PeerLabel, Gauge>,
    pub anti_entropy_runs: Family<PeerLabel, Counter>,
    pub anti_entropy_bytes: Family<BytesLabel, Counter>,
    pub master_key_mismatch: Family<PeerLabel, Gauge>,
    pub settings_drift: Family<SettingLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
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
        let label = PeerLabel { peer: peer.to_string() };
        self.peer_up.remove(&label);
        self.anti_entropy_runs.remove(&label);
        self.master_key_mismatch.remove(&label);
        for direction in ["sent", "received"] {
            self.anti_entropy_bytes.remove(&BytesLabel { peer: peer.to_string(), direction });
        }
        for setting in crate::disk::health::SETTINGS {
            self.settings_drift.remove(&SettingLabel { peer: peer.to_string(), setting: setting.to_string() });
        }
    }

    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("keysync");
        let decisions_applied = Counter::default();
        let decisions_refused = Counter::default();
        let decisions_conflicted = Counter::default();
        // 0.5 ms .. ~16 s: the targets are milliseconds, a partition is seconds.
        let propagation_latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let peer_up = Family::default();
        let anti_entropy_runs = Family::default();
        let anti_entropy_bytes = Family::default();
        let master_key_mismatch = Family::default();
        let settings_drift = Family::default();
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
            "propagation_latency_seconds",
            "From the decision on its origin master (HLC time) to applied here",
            propagation_latency.clone(),
        );
        registry.register("peer_up", "1 while the link to the peer is up, else 0", peer_up.clone());
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
            "1 when the peer's value of a must-agree master setting differs from this master's",
            settings_drift.clone(),
        );
        Metrics {
            registry,
            decisions_applied,
            decisions_refused,
            decisions_conflicted,
            propagation_latency,
            peer_up,
            anti_entropy_runs,
            anti_entropy_bytes,
            master_key_mismatch,
            settings_drift,
        }
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

/// Serves `GET /metrics` until `shutdown`.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) -> std::io::Result<()> {
    use super::scrape_listener::{ScrapeListener, CONNECTION_DEADLINE, MAX_CONNECTIONS};
    // Bounded in connections and time (see `scrape_listener.rs`).
    serve_on(ScrapeListener::new(listener, MAX_CONNECTIONS, CONNECTION_DEADLINE), metrics, shutdown).await
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
        let metrics = Metrics::new();
        metrics.applied(1_000, 1_003);
        metrics.applied(0, 5_000);
        metrics.peer_up.get_or_create(&PeerLabel { peer: "master-b".into() }).set(1);
        metrics.anti_entropy_bytes("master-b", "sent", 8200);
        let text = metrics.encode();
        for want in [
            "keysync_decisions_applied_total 2",
            "keysync_propagation_latency_seconds_count 1",
            "keysync_peer_up{peer=\"master-b\"} 1",
            "keysync_anti_entropy_bytes_total{peer=\"master-b\",direction=\"sent\"} 8200",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }
}
