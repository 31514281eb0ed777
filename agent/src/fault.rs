//! Test-only fault injection, compiled in only with the `fault-injection`
//! cargo feature (which only the test crate enables, as a dev-dependency, so
//! `cargo build --release` never has it). Without the feature every knob is a
//! constant "no fault" and the environment is never read.
//!
//! Two faults cannot be produced from outside a process on a shared machine:
//! - a clock hours off: changing the system clock would skew every other
//!   process; `SALT_KEYSYNC_FAULT_CLOCK_OFFSET_MS` (signed) shifts this
//!   agent's wall clock instead;
//! - an inotify queue overflow: `fs.inotify.max_queued_events` is global, so
//!   lowering it would overflow every other agent on the machine too;
//!   `SALT_KEYSYNC_FAULT_INOTIFY_OVERFLOW=SKIP:DROP` makes the watcher drop
//!   events number SKIP..SKIP+DROP and then report an overflow, exactly what
//!   the kernel does when its queue is full.
//!
//! And one that would take a million keys to produce: a start that takes
//! tens of seconds. `SALT_KEYSYNC_FAULT_START_DELAY_MS` makes the core's
//! start (the store read, the folders reconciled) last that much longer.
//! And a peer that never answers a fetch: `SALT_KEYSYNC_FAULT_FETCH_DELAY_MS`
//! holds each Fetch this agent answers that long first, and
//! `SALT_KEYSYNC_FAULT_ANSWER_DEADLINE_MS` shortens how long this agent
//! waits for a peer's whole answer (300 s) so a test need not wait that long.
//! And a path that loses packets, which loopback never does:
//! `SALT_KEYSYNC_FAULT_LOSSY=master-b` makes this agent's link to master-b
//! find its path lossy (a comma-separated list names several), so it pushes
//! each live decision twice. And a link that has not told its path yet,
//! which loopback tells within seconds: `SALT_KEYSYNC_FAULT_NO_PROBES` set
//! (to anything) makes this agent's links send no probes of their paths.

/// Milliseconds added to the wall clock (negative: behind).
#[cfg(feature = "fault-injection")]
pub fn clock_offset_ms() -> i64 {
    use std::sync::OnceLock;
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var("SALT_KEYSYNC_FAULT_CLOCK_OFFSET_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    })
}

#[cfg(not(feature = "fault-injection"))]
pub fn clock_offset_ms() -> i64 {
    0
}

/// Events to let through, then events to drop before reporting an overflow.
#[cfg(feature = "fault-injection")]
pub fn inotify_overflow() -> Option<(u64, u64)> {
    let value = std::env::var("SALT_KEYSYNC_FAULT_INOTIFY_OVERFLOW").ok()?;
    let (skip, drop) = value.split_once(':')?;
    Some((skip.parse().ok()?, drop.parse().ok()?))
}

#[cfg(not(feature = "fault-injection"))]
pub fn inotify_overflow() -> Option<(u64, u64)> {
    None
}

/// How much longer the core's start takes.
#[cfg(feature = "fault-injection")]
pub fn start_delay() -> std::time::Duration {
    env_millis("SALT_KEYSYNC_FAULT_START_DELAY_MS")
}

#[cfg(not(feature = "fault-injection"))]
pub fn start_delay() -> std::time::Duration {
    std::time::Duration::ZERO
}

/// How long each Fetch this agent answers waits before it is served: a
/// peer that takes a fetch and never answers it (the link that asked holds
/// its claims meanwhile).
#[cfg(feature = "fault-injection")]
pub fn fetch_delay() -> std::time::Duration {
    env_millis("SALT_KEYSYNC_FAULT_FETCH_DELAY_MS")
}

/// How long this agent waits for a peer's whole answer to a round's call,
/// if a test set it (see `net::peers::ANSWER_DEADLINE`).
#[cfg(feature = "fault-injection")]
pub fn answer_deadline() -> Option<std::time::Duration> {
    Some(env_millis("SALT_KEYSYNC_FAULT_ANSWER_DEADLINE_MS")).filter(|d| !d.is_zero())
}

#[cfg(not(feature = "fault-injection"))]
pub fn answer_deadline() -> Option<std::time::Duration> {
    None
}

/// The peers whose links find their path lossy.
#[cfg(feature = "fault-injection")]
pub fn lossy() -> &'static [String] {
    static LOSSY: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LOSSY.get_or_init(|| {
        let names = std::env::var("SALT_KEYSYNC_FAULT_LOSSY").unwrap_or_default();
        names.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect()
    })
}

#[cfg(not(feature = "fault-injection"))]
pub fn lossy() -> &'static [String] {
    &[]
}

/// Whether the links probe their paths (`net/peers/copies.rs`).
#[cfg(feature = "fault-injection")]
pub fn probes() -> bool {
    std::env::var_os("SALT_KEYSYNC_FAULT_NO_PROBES").is_none()
}

#[cfg(not(feature = "fault-injection"))]
pub fn probes() -> bool {
    true
}

/// The milliseconds the variable `name` says (none, or not a number: 0).
#[cfg(feature = "fault-injection")]
fn env_millis(name: &str) -> std::time::Duration {
    let ms = std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    std::time::Duration::from_millis(ms)
}

#[cfg(not(feature = "fault-injection"))]
pub fn fetch_delay() -> std::time::Duration {
    std::time::Duration::ZERO
}

/// Logs the fault knobs in effect, so a test can tell that the binary it
/// runs was built with them (and an operator that one slipped into a build).
pub fn announce() {
    let offset = clock_offset_ms();
    let overflow = inotify_overflow();
    let start_delay = start_delay();
    let fetch_delay = fetch_delay();
    let answer_deadline = answer_deadline();
    let lossy = lossy();
    let probes = probes();
    if offset != 0
        || overflow.is_some()
        || !start_delay.is_zero()
        || !fetch_delay.is_zero()
        || answer_deadline.is_some()
        || !lossy.is_empty()
        || !probes
    {
        tracing::warn!(
            clock_offset_ms = offset,
            inotify_overflow = ?overflow,
            ?start_delay,
            ?fetch_delay,
            ?answer_deadline,
            ?lossy,
            probes,
            "test-only fault injection active"
        );
    }
}
