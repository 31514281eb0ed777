//! One network namespace per master, each with `lo` up and a TUN device
//! `wan0` holding the master's private address, the device's file held by
//! the benchmark (the delay line reads and writes it). The namespaces are
//! named `ksb-<pid>-<i>` and deleted when [`Namespaces`] is dropped, on an
//! error too; a Ctrl-C or SIGTERM ends the agents and deletes them before
//! the benchmark exits, and a later run deletes those a killed run left.

use std::ffi::OsString;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::{Mutex, Once};

use anyhow::{bail, Context};

/// The masters' subnet: 10.213.0.1, .2, ... inside namespaces of their own,
/// where nothing else can clash with it.
pub const SUBNET: [u8; 3] = [10, 213, 0];
/// The TUN device in each namespace.
pub const DEVICE: &str = "wan0";
const PREFIX: &str = "ksb-";

/// Namespaces alive now, for the signal handler.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The namespaces of one configuration and their TUN devices.
pub struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    /// Creates `n` namespaces (deleting any a killed run left), and returns
    /// them with each one's TUN file, in order.
    pub fn create(n: usize) -> anyhow::Result<(Namespaces, Vec<File>)> {
        if !rustix::process::geteuid().is_root() {
            bail!("the WAN benchmark makes network namespaces and TUN devices: run it as root");
        }
        if n > 250 {
            bail!("at most 250 masters fit the benchmark's /24");
        }
        on_signal_clean_up();
        delete_orphans();
        let me = std::process::id();
        let mut made = Namespaces { names: Vec::new() };
        let mut tuns = Vec::new();
        for i in 0..n {
            let name = format!("{PREFIX}{me}-{i}");
            ip(&["netns", "add", &name])?;
            made.names.push(name.clone());
            LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(name.clone());
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            tuns.push(made.run_in(i, || crate::wan::tun::open(DEVICE))??);
            let address = format!("{}/24", address(i));
            ip(&["-n", &name, "addr", "add", &address, "dev", DEVICE])?;
            ip(&["-n", &name, "link", "set", DEVICE, "up"])?;
        }
        Ok((made, tuns))
    }

    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// `ip netns exec NAME`: what agent `i` is started under.
    pub fn exec_wrapper(&self, i: usize) -> Vec<OsString> {
        ["ip", "netns", "exec", self.name(i)].map(OsString::from).into()
    }

    /// Runs `f` on a thread of its own inside namespace `i` (setns(2) moves
    /// only the calling thread): a TUN device opened there belongs to it, a
    /// connection to 127.0.0.1 reaches that namespace's loopback.
    pub fn run_in<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let path = format!("/var/run/netns/{}", self.name(i));
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let ns = File::open(&path).with_context(|| format!("cannot open {path}"))?;
                    rustix::thread::move_into_link_name_space(
                        ns.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .with_context(|| format!("setns {path}"))?;
                    Ok(f())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("a thread in namespace {path} panicked"))?
        })
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        for name in &self.names {
            let _ = ip(&["netns", "del", name]);
            live.retain(|n| n != name);
        }
    }
}

/// Master `i`'s address.
pub fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], i as u8 + 1)
}

/// The master an address belongs to, if any.
pub fn index_of(address: [u8; 4]) -> Option<usize> {
    (address[..3] == SUBNET && address[3] > 0).then(|| address[3] as usize - 1)
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().context("cannot run ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Deletes `ksb-PID-*` namespaces whose benchmark process is gone (killed
/// with SIGKILL, which no handler sees).
fn delete_orphans() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else { return };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// On SIGINT, SIGTERM or SIGHUP: stop this process's children (the agents,
/// which would otherwise outlive it in namespaces no longer named), delete
/// the live namespaces and exit, as the Drop guards would have.
fn on_signal_clean_up() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => return eprintln!("no signal handler (namespaces are left on Ctrl-C): {e}"),
        };
        let spawned = std::thread::Builder::new().name("wan-signals".into()).spawn(move || {
            runtime.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let kinds = [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()];
                let mut streams: Vec<_> = kinds.into_iter().filter_map(|kind| signal(kind).ok()).collect();
                let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
                futures_select(waits).await;
            });
            stop_children();
            for name in LIVE.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                let _ = ip(&["netns", "del", &name]);
            }
            eprintln!("keysync-bench: interrupted; agents stopped, namespaces deleted");
            std::process::exit(130);
        });
        if let Err(e) = spawned {
            eprintln!("no signal handler (namespaces are left on Ctrl-C): {e}");
        }
    });
}

/// Resolves when the first of `waits` does.
async fn futures_select<F: std::future::Future + Unpin>(waits: impl Iterator<Item = F>) {
    let mut waits: Vec<F> = waits.collect();
    std::future::poll_fn(|cx| {
        for wait in &mut waits {
            if std::pin::Pin::new(wait).poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// SIGTERM to every process whose parent is this one, and a wait for them.
fn stop_children() {
    let me = std::process::id().to_string();
    let children: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().into_owned();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.to_string();
            (ppid == me).then_some(pid)
        })
        .collect();
    for pid in &children {
        let _ = Command::new("kill").args(["-TERM", pid]).status();
    }
    for _ in 0..50 {
        // Gone, or a zombie no one will reap before the exit.
        let ended = |pid: &String| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
        };
        if children.iter().all(ended) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
