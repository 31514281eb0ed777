//! `keysync-bench`: the salt-keysync benchmark (docs/performance.md). Run it
//! through `scripts/bench.sh`, which builds the release binaries first.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use keysync_bench::wan::WanSettings;

#[derive(Parser)]
#[command(
    name = "keysync-bench",
    about = "Benchmark salt-keysync: three real agents, Salt-style key operations, join versus rsync, first contact on agreeing masters",
    after_help = "Examples:\n  scripts/bench.sh                      # full run, a few minutes\n  scripts/bench.sh --quick --json out.json\n  target/release/keysync-bench --ops 200 --bulk 2000 --join 20000 --idle 10\n  target/release/keysync-bench --ops 0 --bulk 10000 --join 0 --adopt 0 --idle 0 --layout unit\n  target/release/keysync-bench --ops 0 --bulk 0 --join 0 --adopt 100000\n  target/release/keysync-bench --ops 0 --bulk 0 --join 0 --adopt 200000 --adopt-cold   # as root\n  target/release/keysync-bench --ops 20 --bulk 0 --join 0 --adopt 0 --idle 0 --guard\n  target/release/keysync-bench --ops 0 --bulk 0 --join 0 --adopt 0 --flood 25000 --flood-pushes 20\n  target/release/keysync-bench --ops 0 --bulk 0 --join 0 --adopt 0 --flood 0 --hostile 5000\n  target/release/keysync-bench --ops 0 --bulk 0 --join 0 --adopt 0 --flood 0 --hostile 0 --serve-join 100000\n  target/release/keysync-bench --wan                # as root: 3/5/7 masters at 10/80/300 ms RTT, 0 and 2 % loss\n  target/release/keysync-bench --wan --wan-masters 3 --wan-rtt 80 --wan-loss 0 --wan-join 1500\n\nThe agent binary is looked up next to this program (SALT_KEYSYNC_BIN overrides)."
)]
struct Args {
    /// Small counts: seconds instead of minutes (what CI runs).
    #[arg(long)]
    quick: bool,
    /// Also write the JSON summary to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Operations of each kind (accept, reject, delete).
    #[arg(long)]
    ops: Option<usize>,
    /// Pending keys accepted in one burst.
    #[arg(long)]
    bulk: Option<usize>,
    /// Decided keys held by the peers when the empty master joins (0: no join, no idle figures).
    #[arg(long)]
    join: Option<usize>,
    /// Decided keys three masters already agree on when their agents first start together (0: skip).
    #[arg(long)]
    adopt: Option<usize>,
    /// Drop the adoption's key files from memory before the agents start,
    /// as after a reboot (root: writes /proc/sys/vm/drop_caches).
    #[arg(long)]
    adopt_cold: bool,
    /// Seconds of idling after the join over which CPU time is measured.
    #[arg(long)]
    idle: Option<u64>,
    /// The agents' log filter (SALT_KEYSYNC_LOG), e.g. "info,salt_keysync::node=debug" for batch timings.
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// Keep the agents' folders and logs under DIR.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// How each agent's folders are mounted: plain; unit (as the packaged
    /// systemd unit mounts them: pki_dir one bind mount). Needs root unless plain.
    #[arg(long, value_enum, default_value = "plain")]
    layout: keysync_bench::cluster::Layout,
    /// Run the agents with the blast-radius guard on (default: off, so the
    /// figures are of replication itself). The latency phase deletes the
    /// keys its reject phase rejected, which the guard never delays; a
    /// delete of an accepted key waits for the guard's quiet second
    /// (`salt-keysync demo` shows one).
    #[arg(long)]
    guard: bool,
    /// Deletes of made-up ids in each push of the flood: one configured peer
    /// pushing at once to a lone agent (0: skip).
    #[arg(long)]
    flood: Option<usize>,
    /// Concurrent pushes in the flood.
    #[arg(long, value_name = "N")]
    flood_pushes: Option<usize>,
    /// Keys of the lone agent a compromised master attacks: stalled Fetch
    /// streams and oversized answers (0: skip).
    #[arg(long, value_name = "KEYS")]
    hostile: Option<usize>,
    /// How long the attack lasts, in seconds.
    #[arg(long, value_name = "SECS")]
    hostile_secs: Option<u64>,
    /// Keys an empty master C joins with while single accepts on A are
    /// timed on B, A and B serving C's Diffs and Fetches (0: skip).
    #[arg(long, value_name = "KEYS")]
    serve_join: Option<usize>,
    /// The WAN benchmark instead of the others (root only): each master in a
    /// network namespace of its own, linked by a user-space delay line.
    #[arg(long)]
    wan: bool,
    /// WAN: masters in the full mesh, a configuration each.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_values_t = WanSettings::full().masters)]
    wan_masters: Vec<usize>,
    /// WAN: round-trip times in milliseconds, a configuration each.
    #[arg(long, value_name = "MS,...", value_delimiter = ',', default_values_t = WanSettings::full().rtts.iter().map(|rtt| rtt.as_millis() as u64))]
    wan_rtt: Vec<u64>,
    /// WAN: packet loss in percent on every link, a configuration each.
    #[arg(long, value_name = "PCT,...", value_delimiter = ',', default_values_t = WanSettings::full().losses_pct)]
    wan_loss: Vec<f64>,
    /// WAN: accepts timed per configuration.
    #[arg(long, value_name = "N", default_value_t = WanSettings::full().decisions)]
    wan_decisions: usize,
    /// WAN: least milliseconds from one accept's start to the next's.
    #[arg(long, value_name = "MS", default_value_t = WanSettings::full().pace.as_millis() as u64)]
    wan_pace: u64,
    /// WAN: agreed keys every master holds while the accepts are timed.
    #[arg(long, value_name = "KEYS", default_value_t = WanSettings::full().seed)]
    wan_seed: usize,
    /// WAN: keys the peers hold when an empty master joins, a join each (0: none).
    #[arg(long, value_name = "KEYS,...", value_delimiter = ',', default_values_t = WanSettings::full().joins)]
    wan_join: Vec<usize>,
    /// WAN: the agents' anti-entropy interval in seconds (60: production),
    /// short so rounds run while the accepts are timed.
    #[arg(long, value_name = "SECS", default_value_t = WanSettings::full().anti_entropy.map_or(60.0, |every| every.as_secs_f64()))]
    wan_anti_entropy: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.wan {
        return wan(args);
    }
    let mut settings = if args.quick { keysync_bench::Settings::quick() } else { keysync_bench::Settings::full() };
    settings.n_ops = args.ops.unwrap_or(settings.n_ops);
    settings.n_bulk = args.bulk.unwrap_or(settings.n_bulk);
    settings.n_join = args.join.unwrap_or(settings.n_join);
    settings.n_adopt = args.adopt.unwrap_or(settings.n_adopt);
    settings.adopt_cold = args.adopt_cold;
    settings.idle = args.idle.map_or(settings.idle, Duration::from_secs);
    settings.keep = args.keep;
    settings.layout = args.layout;
    settings.guard = args.guard;
    settings.n_flood = args.flood.unwrap_or(settings.n_flood);
    settings.flood_pushes = args.flood_pushes.unwrap_or(settings.flood_pushes);
    settings.n_hostile_keys = args.hostile.unwrap_or(settings.n_hostile_keys);
    settings.hostile_for = args.hostile_secs.map_or(settings.hostile_for, Duration::from_secs);
    settings.n_serve_join = args.serve_join.unwrap_or(settings.n_serve_join);
    settings.log_filter = args.log.unwrap_or(settings.log_filter);
    let report = keysync_bench::run(&settings)?;
    print(&report.table(), report.to_json(), args.json)
}

/// `--wan`: the WAN benchmark alone.
fn wan(args: Args) -> anyhow::Result<()> {
    let defaults = WanSettings::full();
    let settings = WanSettings {
        masters: args.wan_masters,
        rtts: args.wan_rtt.into_iter().map(Duration::from_millis).collect(),
        losses_pct: args.wan_loss,
        decisions: args.wan_decisions,
        pace: Duration::from_millis(args.wan_pace),
        seed: args.wan_seed,
        joins: args.wan_join.into_iter().filter(|&k| k > 0).collect(),
        anti_entropy: (args.wan_anti_entropy != 60.0).then(|| Duration::from_secs_f64(args.wan_anti_entropy)),
        log_filter: args.log.unwrap_or(defaults.log_filter),
        keep: args.keep,
    };
    let report = keysync_bench::wan::run(&settings)?;
    print(&report.table(), report.to_json(), args.json)
}

/// Prints the table and the JSON summary, and writes the JSON to `path` if given.
fn print(table: &str, json: String, path: Option<PathBuf>) -> anyhow::Result<()> {
    println!("{table}");
    println!("{json}");
    if let Some(path) = path {
        std::fs::write(&path, json + "\n").map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
