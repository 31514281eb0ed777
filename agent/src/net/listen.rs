//! The agent's TCP listen addresses (`listen`, `metrics_listen`): bound by
//! `run` with retries while another program holds them, tried by `check`,
//! and who holds one, where this user can see it.
//!
//! An address in use is a temporary failure, not a set-up mistake: `run`
//! tries again for [`RETRY_FOR`], logging who holds it, and then exits with
//! [`EXIT_TEMPFAIL`], which the unit restarts (it does not restart 78).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// sysexits' EX_TEMPFAIL: `run` could not bind an address another program
/// holds. The unit restarts it (Restart=on-failure; only 78 is not).
pub const EXIT_TEMPFAIL: i32 = 75;

/// The waits between tries of an address in use: about 15 s in all, well
/// within systemd's start timeout.
const RETRY_WAITS: [Duration; 4] =
    [Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(4), Duration::from_secs(8)];

/// How long `run` tries an address in use before it gives up.
pub const RETRY_FOR: Duration = Duration::from_secs(15);

/// An address another program holds, still after [`RETRY_FOR`]: `run`
/// exits with [`EXIT_TEMPFAIL`] for it.
#[derive(Debug, thiserror::Error)]
#[error("{what} {address} is in use{holder}, still after {secs} s of retries; exiting with status {EXIT_TEMPFAIL} (a temporary failure: the unit starts the agent again)", holder = held_by(holder.as_deref()), secs = RETRY_FOR.as_secs())]
pub struct InUse {
    pub what: &'static str,
    pub address: SocketAddr,
    pub holder: Option<String>,
}

/// " by pid N (name)", or nothing when the holder is not known.
fn held_by(holder: Option<&str>) -> String {
    holder.map(|h| format!(" by {h}")).unwrap_or_default()
}

/// Binds `address` (`what`: the config key, for messages). While it is in
/// use, logs who holds it and tries again, for [`RETRY_FOR`] in all, then
/// fails with [`InUse`]; any other error (an address not on this host, a
/// port this user may not bind) fails at once. `None`: `shutdown` came first.
pub async fn bind(
    what: &'static str,
    address: SocketAddr,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<TcpListener>> {
    let mut waits = RETRY_WAITS.iter();
    loop {
        match TcpListener::bind(address).await {
            Ok(listener) => return Ok(Some(listener)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let holder = holder(address);
                let Some(wait) = waits.next() else { return Err(InUse { what, address, holder }.into()) };
                tracing::warn!(
                    "{what} {address} is in use{}; trying again in {} s",
                    held_by(holder.as_deref()),
                    wait.as_secs()
                );
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(*wait) => {}
                }
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("{what}: cannot listen on {address}"))),
        }
    }
}

/// What `check` finds of an address: whether it can be bound now (and is
/// let go at once), else the error and who holds it.
pub enum Tried {
    Free,
    InUse { holder: Option<(u32, String)> },
    Refused(std::io::Error),
}

/// Binds `address` and lets it go (what `run` would do first).
pub fn try_bind(address: SocketAddr) -> Tried {
    match std::net::TcpListener::bind(address) {
        Ok(_) => Tried::Free,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Tried::InUse { holder: holder_pid(address) },
        Err(e) => Tried::Refused(e),
    }
}

/// "pid N (name)" of the process listening on `address`, if this user can
/// see it.
pub fn holder(address: SocketAddr) -> Option<String> {
    holder_pid(address).map(|(pid, name)| describe(pid, &name))
}

/// "pid N (name)".
pub fn describe(pid: u32, name: &str) -> String {
    if name.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid} ({})", crate::text::shown(name))
    }
}

/// The process listening on `address` and its name: the listening socket's
/// inode from /proc/net/tcp (or tcp6), then the process with a descriptor
/// on it among those whose /proc/PID/fd this user may read. `None` when
/// either is not found (another user's process, a hidden /proc).
pub fn holder_pid(address: SocketAddr) -> Option<(u32, String)> {
    let inodes = listening_inodes(address);
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|inode| format!("socket:[{inode}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
        });
        if holds {
            let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            return Some((pid, name.trim().to_string()));
        }
    }
    None
}

/// The inodes of the listening sockets that take `address`'s port on its
/// address (or on every address, or `address` is every address).
fn listening_inodes(address: SocketAddr) -> Vec<u64> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9)) else {
                continue;
            };
            if *state != "0A" {
                continue;
            }
            let Some((ip, port)) = parse_local(local) else { continue };
            if port != address.port() {
                continue;
            }
            let overlaps = ip.is_unspecified() || address.ip().is_unspecified() || same_ip(ip, address.ip());
            if let (true, Ok(inode)) = (overlaps, inode.parse::<u64>()) {
                inodes.push(inode);
            }
        }
    }
    inodes
}

/// Whether two addresses are the same, an IPv4 address and its IPv6-mapped form alike.
fn same_ip(a: std::net::IpAddr, b: std::net::IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// `0100007F:10CB` (IPv4, the address's 32-bit word in host order) or 32
/// hex digits (IPv6, four such words), and the port in hex.
fn parse_local(text: &str) -> Option<(std::net::IpAddr, u16)> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(|w| w.to_ne_bytes());
    let ip = match ip.len() {
        8 => std::net::IpAddr::from(word(ip)?),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(&ip[i * 8..i * 8 + 8])?);
            }
            std::net::IpAddr::from(bytes)
        }
        _ => return None,
    };
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_of_a_listening_socket_is_found() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = held.local_addr().unwrap();
        let (pid, _) = holder_pid(address).expect("this process holds it");
        assert_eq!(pid, std::process::id());
        assert!(matches!(try_bind(address), Tried::InUse { holder: Some((p, _)) } if p == pid));
        // Every address on that port overlaps it.
        let any = SocketAddr::from(([0, 0, 0, 0], address.port()));
        assert_eq!(holder_pid(any).map(|(p, _)| p), Some(pid));
        drop(held);
        assert!(matches!(try_bind(address), Tried::Free));
        assert_eq!(holder_pid(address), None);
    }

    #[test]
    fn proc_net_addresses_are_read_in_host_order() {
        if cfg!(target_endian = "little") {
            assert_eq!(parse_local("0100007F:10CB"), Some(("127.0.0.1".parse().unwrap(), 4299)));
            assert_eq!(parse_local("00000000000000000000000001000000:0050"), Some(("::1".parse().unwrap(), 80)));
        }
        assert_eq!(parse_local("zz:10CB"), None);
    }
}
