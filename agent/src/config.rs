//! Configuration in two phases: the TOML file as written (`RawConfig`, unknown
//! keys refused), then a validated [`Config`] with resolved paths and timings.
//! Every error names the key it is about.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keysync_machine::peer::{BadPeerName, PeerName};
use serde::Deserialize;

pub const DEFAULT_CONFIG: &str = "/etc/salt-keysync/config.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node: String,
    pki_dir: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    listen: Option<String>,
    audit_log: Option<PathBuf>,
    tls: RawTls,
    #[serde(default)]
    peer: Vec<RawPeer>,
    #[serde(default)]
    retired_masters: Vec<String>,
    #[serde(default)]
    salt: RawSalt,
    log_format: Option<String>,
    #[serde(default)]
    timings: RawTimings,
    control_socket: Option<PathBuf>,
    metrics_listen: Option<String>,
    #[serde(default)]
    metrics_allow: Vec<String>,
    mode: Option<String>,
    #[serde(default)]
    guard: RawGuard,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGuard {
    enabled: Option<bool>,
    quiet: Option<String>,
    window: Option<String>,
    max_deletes: Option<i64>,
    max_share: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    name: String,
    address: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSalt {
    master_config: Option<PathBuf>,
    cachedir: Option<PathBuf>,
    master_id: Option<String>,
    user: Option<String>,
    version_command: Option<Vec<String>>,
    key_mode: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimings {
    anti_entropy_interval: Option<String>,
    rescan_interval: Option<String>,
    max_clock_skew: Option<String>,
    absent_grace: Option<String>,
    reconnect_max: Option<String>,
    tombstone_ttl: Option<String>,
}

/// How the agent treats the key folders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Replicates: writes what the peers decided.
    Normal,
    /// Connects, exchanges and reports (`salt-keysync plan`), but writes
    /// nothing to the key folders and keeps no state: the first start in
    /// normal mode afterwards is still a first start (docs/adopting.md).
    Observe,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug)]
pub struct Peer {
    pub name: PeerName,
    pub address: String,
}

#[derive(Clone, Debug)]
pub struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What the agent needs to know about the salt-master beside it.
#[derive(Clone, Debug)]
pub struct Salt {
    /// The master's config file, read by `check` and at start-up to refuse
    /// set-ups where the key folders are not the truth.
    pub master_config: PathBuf,
    /// Whether the config names `master_config` (a named file that does not
    /// exist is refused; the default missing means Salt's defaults).
    pub master_config_named: bool,
    /// Where `.dfn` is dropped to make the master rotate its AES key.
    pub cachedir: PathBuf,
    /// Written into `.dfn` (Salt 3008 does); `None`: this host's name + "_master".
    pub master_id: Option<String>,
    /// Owner of the files the agent writes; `None`: the owner of pki_dir.
    pub user: Option<String>,
    /// Prints the salt-master version (program and arguments).
    pub version_command: Vec<String>,
    /// Mode of the key files the agent writes; `None` ("auto"): as the
    /// master's Salt line does (0600 from 3008 on, 0644 before; 0600 while
    /// its version is unknown).
    pub key_mode: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct Timings {
    pub anti_entropy_interval: Duration,
    pub rescan_interval: Duration,
    pub max_clock_skew: Duration,
    pub absent_grace: Duration,
    pub reconnect_max: Duration,
    /// How long a delete is remembered (docs/operations.md, "Tombstones").
    pub tombstone_ttl: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            anti_entropy_interval: Duration::from_secs(60),
            rescan_interval: Duration::from_secs(300),
            max_clock_skew: Duration::from_secs(300),
            absent_grace: Duration::from_millis(40),
            reconnect_max: Duration::from_secs(30),
            tombstone_ttl: Duration::from_secs(30 * 86_400),
        }
    }
}

/// The safe range of one `[timings]` value, and why each end is there.
struct TimingBound {
    key: &'static str,
    min: Duration,
    below: &'static str,
    max: Duration,
    above: &'static str,
}

impl TimingBound {
    fn check(&self, text: &str, value: Duration) -> Result<Duration, String> {
        let shown = |d: Duration| humantime::format_duration(d).to_string();
        if value < self.min {
            return Err(format!("{text:?} is below the minimum {}: {}", shown(self.min), self.below));
        }
        if value > self.max {
            return Err(format!("{text:?} is above the maximum {}: {}", shown(self.max), self.above));
        }
        Ok(value)
    }
}

const TIMING_BOUNDS: &[TimingBound] = &[
    TimingBound {
        key: "absent_grace",
        // tests/salt/FINDINGS.md §3: 0.2–0.5 ms between the remove and the
        // rename on an idle machine; a loaded master stretches it.
        min: Duration::from_millis(10),
        below: "Salt 3008 removes a key from every folder before writing it back (0.2-0.5 ms measured, longer on a \
                loaded master); a shorter grace can take such an accept for a delete and replicate it",
        // The settler holds no disappearance longer than 5 s (settle.rs max_hold).
        max: Duration::from_secs(5),
        above: "a delete waits this long before it replicates, and no disappearance is held longer than 5s anyway",
    },
    TimingBound {
        key: "anti_entropy_interval",
        min: Duration::from_secs(1),
        below: "every round asks each peer for 1,024 bucket digests",
        max: Duration::from_secs(3600),
        above: "a decision a link missed (it was down when the decision was made) waits this long to reach that peer",
    },
    TimingBound {
        key: "rescan_interval",
        min: Duration::from_secs(10),
        below: "every rescan lists and reads all three key folders",
        max: Duration::from_secs(86_400),
        above:
            "the rescan is the safety net for changes inotify did not report; a day is the longest they may go unseen",
    },
    TimingBound {
        key: "max_clock_skew",
        min: Duration::from_secs(1),
        below:
            "masters' clocks differ by more than that after an ordinary NTP step, and their decisions would be refused",
        max: Duration::from_secs(86_400),
        above: "a decision stamped that far in the future outranks every later decision for that long",
    },
    TimingBound {
        key: "reconnect_max",
        min: Duration::from_millis(100),
        below: "a peer that is down would be retried more than ten times a second",
        max: Duration::from_secs(3600),
        above: "a peer back up waits up to this long to be reconnected",
    },
    TimingBound {
        key: "tombstone_ttl",
        min: Duration::from_secs(86_400),
        below: "a master stopped or cut off for longer than this may bring back keys the others deleted",
        max: Duration::from_secs(3650 * 86_400),
        above: "deletes are kept in the state store this long",
    },
];

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub node: String,
    pub pki_dir: PathBuf,
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    pub audit_log: PathBuf,
    pub tls: Tls,
    pub peers: Vec<Peer>,
    /// Masters removed from the site whose decisions still stand: a peer may
    /// forward them, though no link to them is kept.
    pub retired_masters: Vec<String>,
    pub salt: Salt,
    pub log_format: LogFormat,
    pub timings: Timings,
    /// The Unix socket `salt-keysync status` asks (default `<state_dir>/control.sock`).
    pub control_socket: PathBuf,
    /// Where Prometheus metrics are served; `None`: no metrics listener.
    pub metrics_listen: Option<SocketAddr>,
    /// The only addresses `/metrics` serves (empty: any).
    pub metrics_allow: Vec<std::net::IpAddr>,
    pub mode: Mode,
    /// The blast-radius guard (`[guard]`; see `keysync_machine::node::GuardSettings`).
    pub guard: keysync_machine::node::GuardSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cause is in the message, not a `source()`: `{:#}` would print it twice.
    #[error("cannot read config {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {key}: {message}")]
    Invalid { path: PathBuf, key: String, message: String },
}

/// `state_dir` when the config does not set it.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/salt-keysync";

impl Config {
    /// The masters a peer's decision may name as its origin besides this
    /// node: the peers, and the retired masters.
    pub fn masters(&self) -> Vec<String> {
        self.peers.iter().map(|p| p.name.to_string()).chain(self.retired_masters.iter().cloned()).collect()
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read { path: path.into(), cause })?;
        Config::parse(&text, path)
    }

    /// Parses and validates `text`; relative paths are resolved against the
    /// folder of `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string().trim_end().to_string() })?;
        let invalid = |key: &str, message: String| ConfigError::Invalid { path: path.into(), key: key.into(), message };
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };

        check_node_name(&raw.node).map_err(|m| invalid("node", m))?;
        let listen_raw = raw.listen.unwrap_or_else(|| "0.0.0.0:4515".into());
        let listen = listen_raw.parse().map_err(|_| invalid("listen", format!("{listen_raw:?} is not ip:port")))?;
        let state_dir = resolve(raw.state_dir.unwrap_or_else(|| DEFAULT_STATE_DIR.into()));
        let audit_log = raw.audit_log.map(resolve).unwrap_or_else(|| state_dir.join("audit.jsonl"));
        let control_socket = raw.control_socket.map(resolve).unwrap_or_else(|| state_dir.join("control.sock"));
        let metrics_listen = match raw.metrics_listen {
            None => None,
            Some(text) => {
                Some(text.parse().map_err(|_| invalid("metrics_listen", format!("{text:?} is not ip:port")))?)
            }
        };

        let mut metrics_allow = Vec::new();
        for (idx, text) in raw.metrics_allow.iter().enumerate() {
            let address = text.parse().map_err(|_| {
                invalid(&format!("metrics_allow[{idx}]"), format!("{text:?} is not an IP address (the scraper's)"))
            })?;
            metrics_allow.push(address);
        }

        let mut peers: Vec<Peer> = Vec::new();
        for (idx, peer) in raw.peer.into_iter().enumerate() {
            let name = node_name(&peer.name).map_err(|m| invalid(&format!("peer[{idx}].name"), m))?;
            if peer.name == raw.node {
                return Err(invalid(&format!("peer[{idx}].name"), format!("{:?} is this node's own name", peer.name)));
            }
            if peers.iter().any(|p| *p.name == *peer.name) {
                return Err(invalid(&format!("peer[{idx}].name"), format!("{:?} is listed twice", peer.name)));
            }
            if !is_host_port(&peer.address) {
                return Err(invalid(
                    &format!("peer[{idx}].address"),
                    format!(
                        "{:?} is not host:port (host: an IPv4 address, an IPv6 address in [brackets] or a DNS name)",
                        peer.address
                    ),
                ));
            }
            peers.push(Peer { name, address: peer.address });
        }
        let mut retired_masters: Vec<String> = Vec::new();
        for (idx, name) in raw.retired_masters.into_iter().enumerate() {
            let key = format!("retired_masters[{idx}]");
            check_node_name(&name).map_err(|m| invalid(&key, m))?;
            if name == raw.node || peers.iter().any(|p| *p.name == *name) {
                return Err(invalid(&key, format!("{name:?} is this node or a [[peer]]: a master still in the site")));
            }
            if retired_masters.contains(&name) {
                return Err(invalid(&key, format!("{name:?} is listed twice")));
            }
            retired_masters.push(name);
        }

        let mode = match raw.mode.as_deref() {
            None | Some("normal") => Mode::Normal,
            Some("observe") => Mode::Observe,
            Some(other) => return Err(invalid("mode", format!("{other:?} is neither \"normal\" nor \"observe\""))),
        };
        let log_format = match raw.log_format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => return Err(invalid("log_format", format!("{other:?} is neither \"text\" nor \"json\""))),
        };

        let defaults = Timings::default();
        let t = raw.timings;
        let duration = |key: &str, raw: Option<String>, default: Duration| match raw {
            None => Ok(default),
            Some(text) => humantime::parse_duration(&text)
                .map_err(|e| invalid(&format!("timings.{key}"), format!("{text:?} is not a duration ({e})"))),
        };
        // Each value within its bounds (`TIMING_BOUNDS`), the reason named.
        let duration = |key: &str, raw: Option<String>, default: Duration| {
            let value = duration(key, raw.clone(), default)?;
            let Some(text) = raw else { return Ok(value) };
            match TIMING_BOUNDS.iter().find(|bound| bound.key == key) {
                Some(bound) => bound.check(&text, value).map_err(|m| invalid(&format!("timings.{key}"), m)),
                None => Ok(value),
            }
        };
        let timings = Timings {
            anti_entropy_interval: duration(
                "anti_entropy_interval",
                t.anti_entropy_interval,
                defaults.anti_entropy_interval,
            )?,
            rescan_interval: duration("rescan_interval", t.rescan_interval, defaults.rescan_interval)?,
            max_clock_skew: duration("max_clock_skew", t.max_clock_skew, defaults.max_clock_skew)?,
            absent_grace: duration("absent_grace", t.absent_grace, defaults.absent_grace)?,
            reconnect_max: duration("reconnect_max", t.reconnect_max, defaults.reconnect_max)?,
            tombstone_ttl: duration("tombstone_ttl", t.tombstone_ttl, defaults.tombstone_ttl)?,
        };

        let version_command =
            raw.salt.version_command.unwrap_or_else(|| vec!["salt-master".into(), "--version".into()]);
        if version_command.first().is_none_or(|program| program.is_empty()) {
            return Err(invalid(
                "salt.version_command",
                "must name a program, e.g. [\"salt-master\", \"--version\"]".into(),
            ));
        }
        let key_mode = match raw.salt.key_mode.as_deref() {
            None | Some("auto") => None,
            Some("0600") => Some(0o600),
            Some("0644") => Some(0o644),
            Some(other) => {
                return Err(invalid("salt.key_mode", format!("{other:?} is none of \"auto\", \"0600\", \"0644\"")))
            }
        };
        let salt = Salt {
            master_config_named: raw.salt.master_config.is_some(),
            master_config: resolve(raw.salt.master_config.unwrap_or_else(|| "/etc/salt/master".into())),
            cachedir: resolve(raw.salt.cachedir.unwrap_or_else(|| "/var/cache/salt/master".into())),
            master_id: raw.salt.master_id,
            user: raw.salt.user,
            version_command,
            key_mode,
        };

        let guard = guard(raw.guard, &invalid)?;
        Ok(Config {
            node: raw.node,
            pki_dir: resolve(raw.pki_dir.unwrap_or_else(|| "/etc/salt/pki/master".into())),
            state_dir,
            listen,
            audit_log,
            tls: Tls { ca: resolve(raw.tls.ca), cert: resolve(raw.tls.cert), key: resolve(raw.tls.key) },
            peers,
            retired_masters,
            salt,
            log_format,
            timings,
            control_socket,
            metrics_listen,
            metrics_allow,
            mode,
            guard,
        })
    }
}

/// The `[guard]` table, validated; defaults from `GuardSettings::default()`.
fn guard(
    raw: RawGuard,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<keysync_machine::node::GuardSettings, ConfigError> {
    let defaults = keysync_machine::node::GuardSettings::default();
    let duration = |key: &str, text: Option<String>, default: Duration| match text {
        None => Ok(default),
        Some(text) => humantime::parse_duration(&text)
            .map_err(|e| invalid(&format!("guard.{key}"), format!("{text:?} is not a duration ({e})"))),
    };
    let quiet = duration("quiet", raw.quiet, defaults.quiet)?;
    let window = duration("window", raw.window, defaults.window)?;
    // Every peer's delete of an accepted key waits `quiet`: a minute is
    // already far past any salt-key run's pauses.
    if quiet.is_zero() || quiet > Duration::from_secs(60) {
        return Err(invalid("guard.quiet", format!("{quiet:?} is not between 1ms and 60s")));
    }
    if window < quiet || window > Duration::from_secs(24 * 3600) {
        return Err(invalid("guard.window", format!("{window:?} is not between guard.quiet ({quiet:?}) and 24h")));
    }
    let max_deletes = match raw.max_deletes {
        None => defaults.max_deletes,
        Some(n) if n >= 1 => n as usize,
        Some(n) => return Err(invalid("guard.max_deletes", format!("{n} is not a count of at least 1"))),
    };
    let max_share = match raw.max_share {
        None => defaults.max_share,
        Some(share) if share > 0.0 && share <= 1.0 => share,
        Some(share) => return Err(invalid("guard.max_share", format!("{share} is not a share above 0 and at most 1"))),
    };
    Ok(keysync_machine::node::GuardSettings {
        enabled: raw.enabled.unwrap_or(defaults.enabled),
        quiet,
        window,
        max_deletes,
        max_share,
    })
}

/// Names the agent gives its own sources of decisions (the audit log's
/// `via`), which no master may have.
pub const RESERVED_NAMES: [&str; 3] = PeerName::RESERVED;

/// A node's name: a DNS name of its certificate, written in lowercase, the
/// one form TLS compares and decisions carry (`master-A` passed `check`,
/// then no certificate matched it at run time; a peer's decision naming
/// `MASTER-A` is another origin than `master-a`). What the node machine
/// calls decisions finished from its journal, and the audit log this
/// node's own changes, is never a master's name.
pub fn node_name(name: &str) -> Result<PeerName, String> {
    PeerName::new(name).map_err(|bad| match bad {
        BadPeerName::NotDnsName => format!("{name:?} is not a DNS name"),
        BadPeerName::Reserved => format!(
            "{name:?} is a name the agent uses itself (the audit log's `via` for decisions finished from its journal, \
             for this master's own changes and for connections before a peer proved who it is): choose another"
        ),
        BadPeerName::Uppercase => {
            format!("{name:?} has capital letters: write node names in lowercase ({:?})", name.to_lowercase())
        }
    })
}

/// Whether `name` may be a node's name ([`node_name`]).
pub fn check_node_name(name: &str) -> Result<(), String> {
    node_name(name).map(drop)
}

/// Node names are DNS names of certificates.
pub fn check_name(name: &str) -> Result<(), String> {
    if keysync_machine::peer::is_dns_name(name) {
        Ok(())
    } else {
        Err(format!("{name:?} is not a DNS name"))
    }
}

/// `host:port` where host is an IPv4 address, `[IPv6]` or a DNS name:
/// strictly, so that `10.0.0.300` is a typo found here, not a name looked
/// up at every reconnect.
fn is_host_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else { return false };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        // All-numeric labels can only be an IPv4 address.
        None if host.split('.').all(|label| label.bytes().all(|b| b.is_ascii_digit())) => {
            host.parse::<std::net::Ipv4Addr>().is_ok()
        }
        None => check_name(host).is_ok(),
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

#[cfg(test)]
mod tests;
