//! `keysync-bench --wan` (issue 31): masters across a WAN. Each master's
//! agent runs in a network namespace of its own, on a private address of a
//! TUN device; a user-space delay line (`delay.rs`; this kernel has no
//! netem) carries every packet between them after half the round-trip
//! time, losing some if asked, and counts what each link carries. For each
//! configuration (masters × RTT × loss): accepts made as Salt 3008 makes
//! them, timed on the peers by inotify; pushes and bytes per decision; and
//! an empty master joining peers that hold K keys. Root only.
//!
//! `netns.rs` makes and deletes the namespaces, `tun.rs` opens the TUN
//! devices, `mesh.rs` runs the agents in them, `measure.rs` measures,
//! `report.rs` prints.

pub mod delay;
pub mod measure;
pub mod mesh;
pub mod netns;
pub mod report;
pub mod tun;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::wan::report::{ConfigRow, WanReport};

/// What the WAN benchmark runs.
#[derive(Clone, Debug, Serialize)]
pub struct WanSettings {
    /// Masters in the full mesh, each a configuration.
    pub masters: Vec<usize>,
    /// Round-trip times between any two masters.
    pub rtts: Vec<Duration>,
    /// Packet loss, in percent, on every link and in each direction.
    pub losses_pct: Vec<f64>,
    /// Accepts timed per configuration (0: none).
    pub decisions: usize,
    /// Least time from one accept's start to the next's, so the decisions
    /// span anti-entropy rounds.
    pub pace: Duration,
    /// Agreed keys every master holds in the live phase (the rounds' work).
    pub seed: usize,
    /// Keys held by the peers an empty master joins, one join each (empty: no join).
    pub joins: Vec<usize>,
    /// The agents' anti-entropy interval (`None`: the production 60 s).
    pub anti_entropy: Option<Duration>,
    pub log_filter: String,
    pub keep: Option<PathBuf>,
}

impl WanSettings {
    /// Every configuration of issue 31.
    pub fn full() -> WanSettings {
        WanSettings {
            masters: vec![3, 5, 7],
            rtts: [10, 80, 300].map(Duration::from_millis).into(),
            losses_pct: vec![0.0, 2.0],
            decisions: 60,
            pace: Duration::from_millis(200),
            seed: 2000,
            joins: vec![1500, 20_000],
            anti_entropy: Some(Duration::from_secs(5)),
            log_filter: "warn,salt_keysync=info".into(),
            keep: None,
        }
    }
}

/// One configuration: masters, RTT and loss.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub masters: usize,
    pub rtt: Duration,
    pub loss_pct: f64,
}

impl Config {
    /// A name for the configuration's folders.
    pub fn label(&self) -> String {
        format!("n{}-rtt{}-loss{}", self.masters, self.rtt.as_millis(), self.loss_pct)
    }
}

/// Every configuration `settings` names, loss outermost: all lossless
/// figures first.
pub fn configs(settings: &WanSettings) -> Vec<Config> {
    let mut configs = Vec::new();
    for &loss_pct in &settings.losses_pct {
        for &masters in &settings.masters {
            for &rtt in &settings.rtts {
                configs.push(Config { masters, rtt, loss_pct });
            }
        }
    }
    configs
}

/// Runs every configuration, printing each row as it is measured.
pub fn run(settings: &WanSettings) -> anyhow::Result<WanReport> {
    let started = Instant::now();
    if settings.masters.iter().any(|&n| !(2..=26).contains(&n)) {
        anyhow::bail!("--wan-masters: 2 to 26 masters (named master-a to master-z)");
    }
    let most = settings.joins.iter().copied().chain([settings.seed + settings.decisions]).max().unwrap_or(0);
    let keys = crate::cluster::rsa_keys(most.max(1));
    let mut rows = Vec::new();
    for config in configs(settings) {
        let row = run_config(settings, &config, &keys)?;
        eprintln!("{}", serde_json::to_string(&row).unwrap_or_default());
        rows.push(row);
    }
    Ok(WanReport {
        settings: settings.clone(),
        key_file_bytes: keys[0].len(),
        rows,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

/// One configuration in namespaces of its own, deleted at its end.
pub fn run_config(settings: &WanSettings, config: &Config, keys: &[String]) -> anyhow::Result<ConfigRow> {
    let started = Instant::now();
    let (ns, tuns) = netns::Namespaces::create(config.masters)?;
    let line = delay::DelayLine::start(tuns, config.rtt / 2, config.loss_pct / 100.0)?;
    let live = if settings.decisions > 0 { Some(measure::live(settings, config, &ns, &line, keys)?) } else { None };
    let mut joins = Vec::new();
    for &n_keys in &settings.joins {
        joins.push(measure::join(settings, config, &ns, &line, keys, n_keys)?);
    }
    Ok(ConfigRow { config: config.clone(), live, joins, secs: started.elapsed().as_secs_f64() })
}
