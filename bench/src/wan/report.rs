//! The WAN benchmark's figures: per configuration, a table row and JSON.

use serde::Serialize;

use crate::report::OpRow;
use crate::wan::{Config, WanSettings};

/// The live accepts of one configuration.
#[derive(Debug, Serialize)]
pub struct LiveFigures {
    /// From the final rename on the accepting master to the key's final
    /// state on each peer (one sample per decision and peer).
    pub latency: OpRow,
    /// Decisions received by push on all agents ÷ decisions made (n−1 if
    /// each decision crosses each link once), second copies not counted.
    pub pushes_per_decision: f64,
    /// Live decisions pushed a second time, on a link's other connection,
    /// while its path lost packets ÷ decisions made.
    pub copies_per_decision: f64,
    /// Decisions fetched in anti-entropy rounds on all agents ÷ decisions made.
    pub fetches_per_decision: f64,
    /// IP bytes over all links while the decisions were made ÷ decisions
    /// (keep-alives and anti-entropy rounds included).
    pub bytes_per_decision: f64,
    /// IP bytes over all links from the links up to their paths probed (the
    /// sessions' first second: probes, their answers, and whatever else
    /// the links sent meanwhile) ÷ links; not in `bytes_per_decision`.
    pub probing_bytes_per_link: f64,
    /// Anti-entropy rounds run on all links meanwhile.
    pub rounds: f64,
    pub packets_lost: u64,
    /// Links that carried no packet (each should carry some).
    pub links_silent: usize,
    pub measured_secs: f64,
    /// The largest agent's peak resident memory (VmHWM), MiB.
    pub peak_rss_mib: f64,
}

/// An empty master joining peers that hold `keys` keys.
#[derive(Debug, Serialize)]
pub struct JoinFigures {
    pub keys: usize,
    /// From the joiner's first packet to its first key file.
    pub first_key_ms: f64,
    pub first_key_rtts: f64,
    /// From the joiner's start until it held every key.
    pub all_keys_secs: f64,
    /// IP bytes the joiner received ÷ the key material (sum of the key files' sizes).
    pub bytes_received_ratio: f64,
    pub key_bytes: usize,
    pub joiner_peak_rss_mib: f64,
}

#[derive(Debug, Serialize)]
pub struct ConfigRow {
    pub config: Config,
    pub live: Option<LiveFigures>,
    pub joins: Vec<JoinFigures>,
    pub secs: f64,
}

#[derive(Debug, Serialize)]
pub struct WanReport {
    pub settings: WanSettings,
    /// The length of each key file (RSA 2048 public keys, as Salt makes them).
    pub key_file_bytes: usize,
    pub rows: Vec<ConfigRow>,
    pub wall_secs: f64,
}

impl WanReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "WAN: accepts as Salt 3008 makes them, dated on the peers by inotify; {} decisions per configuration, {} agreed keys, anti-entropy every {}; key files {} B\n\n",
            self.settings.decisions,
            self.settings.seed,
            self.settings.anti_entropy.map_or("60 s (production)".to_string(), |d| format!("{} s", d.as_secs_f64())),
            self.key_file_bytes,
        );
        out.push_str(&format!(
            "{:>2} {:>5} {:>5} | {:>8} {:>8} {:>8} {:>6} | {:>8} {:>7} {:>8} {:>9} {:>6} {:>9} | {:>8}\n",
            "n",
            "RTT",
            "loss",
            "p50 ms",
            "p99 ms",
            "max ms",
            "missed",
            "push/dec",
            "copy/d",
            "fetch/d",
            "B/dec",
            "rounds",
            "probe B/l",
            "peak MiB"
        ));
        for row in &self.rows {
            let c = &row.config;
            let head = format!("{:>2} {:>5} {:>4}%", c.masters, format!("{}ms", c.rtt.as_millis()), c.loss_pct);
            match &row.live {
                Some(l) => out.push_str(&format!(
                    "{head} | {:>8.1} {:>8.1} {:>8.1} {:>6} | {:>8.2} {:>7.2} {:>8.2} {:>9.0} {:>6.0} {:>9.0} | {:>8.1}\n",
                    l.latency.p50_ms,
                    l.latency.p99_ms,
                    l.latency.max_ms,
                    l.latency.n_missed,
                    l.pushes_per_decision,
                    l.copies_per_decision,
                    l.fetches_per_decision,
                    l.bytes_per_decision,
                    l.rounds,
                    l.probing_bytes_per_link,
                    l.peak_rss_mib
                )),
                None => out.push_str(&format!("{head} | (no live decisions)\n")),
            }
        }
        if self.rows.iter().any(|r| !r.joins.is_empty()) {
            out.push_str(&format!(
                "\nJoin: an empty master joins n−1 peers holding K keys\n{:>2} {:>5} {:>5} | {:>7} {:>11} {:>10} {:>9} {:>11} | {:>8}\n",
                "n", "RTT", "loss", "K", "1st key ms", "1st key RTT", "all keys s", "bytes/keys", "peak MiB"
            ));
            for row in &self.rows {
                let c = &row.config;
                for j in &row.joins {
                    out.push_str(&format!(
                        "{:>2} {:>5} {:>4}% | {:>7} {:>11.0} {:>10.1} {:>9.1} {:>11.2} | {:>8.1}\n",
                        c.masters,
                        format!("{}ms", c.rtt.as_millis()),
                        c.loss_pct,
                        j.keys,
                        j.first_key_ms,
                        j.first_key_rtts,
                        j.all_keys_secs,
                        j.bytes_received_ratio,
                        j.joiner_peak_rss_mib
                    ));
                }
            }
        }
        out.push_str(&format!("\nwall time {:.0} s", self.wall_secs));
        out
    }
}
