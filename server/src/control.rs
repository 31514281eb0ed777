//! Live changes to a running listener: new TLS material and a new set of admitted peers apply to
//! the next handshake, and open connections of peers no longer admitted are closed. This is what
//! lets the agent reload its config without a restart and without dropping unchanged links.

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio_util::sync::CancellationToken;

/// Connections one peer may hold open at once: its link uses two (one for
/// its rounds, one for its live pushes), a reload or a reconnect briefly
/// four (a lost connection the server has not noticed yet stays counted
/// until its keep-alive ends it), and its `check`, `recover --from-peers`
/// or upgrade plan one more.
pub const CONNECTIONS_PER_PEER: usize = 6;

use crate::identity::PeerName;
use crate::tcp_probe::TcpProbe;
use crate::tls::TlsSetup;

/// A cloneable handle on what a listener admits. Give it to [`serve_with`](crate::serve_with),
/// keep a clone, and call [`reload`](Self::reload) to change it while the listener runs.
#[derive(Clone)]
pub struct ListenerControl {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ListenerControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerControl").field("allowed_peers", &self.current().allowed_peers).finish()
    }
}

struct Shared {
    // std locks: held only to copy or swap a few Arcs, never across an await.
    current: RwLock<Current>,
    connections: Mutex<Vec<Connection>>,
    /// The configured peers' addresses: their handshakes have a share of
    /// their own (see `limits.rs`).
    peer_sources: RwLock<Arc<[std::net::IpAddr]>>,
}

/// The TLS setup and peer names one handshake uses, taken together at its start.
#[derive(Clone)]
pub(crate) struct Current {
    pub(crate) tls: TlsSetup,
    pub(crate) allowed_peers: Arc<[PeerName]>,
}

/// An open, identified connection: closing it is cancelling its token.
struct Connection {
    peer: PeerName,
    close: CancellationToken,
    probe: TcpProbe,
}

impl ListenerControl {
    /// A control admitting `allowed_peers` with `tls`.
    pub fn new(tls: TlsSetup, allowed_peers: Vec<PeerName>) -> Self {
        Self {
            shared: Arc::new(Shared {
                current: RwLock::new(Current { tls, allowed_peers: allowed_peers.into() }),
                connections: Mutex::new(Vec::new()),
                peer_sources: RwLock::new(Arc::from(Vec::new())),
            }),
        }
    }

    /// From now on handshakes use `tls` and admit only `allowed_peers`. Open connections of peers
    /// that are no longer admitted are closed; the others keep running. Returns the names whose
    /// connections were closed (one entry per connection).
    pub fn reload(&self, tls: TlsSetup, allowed_peers: Vec<PeerName>) -> Vec<PeerName> {
        *self.shared.current.write().unwrap_or_else(|p| p.into_inner()) =
            Current { tls, allowed_peers: allowed_peers.clone().into() };
        self.close_where(|peer| !allowed_peers.contains(peer))
    }

    /// Closes every open connection, so that each peer proves itself again under the current
    /// TLS material (after the CA changed, say). Returns how many were closed.
    pub fn close_connections(&self) -> usize {
        self.close_where(|_| true).len()
    }

    /// The addresses the configured peers connect from (their handshakes
    /// keep a share strangers cannot use).
    pub fn set_peer_sources(&self, sources: Vec<std::net::IpAddr>) {
        *self.shared.peer_sources.write().unwrap_or_else(|p| p.into_inner()) = sources.into();
    }

    pub(crate) fn is_peer_source(&self, source: std::net::IpAddr) -> bool {
        self.shared.peer_sources.read().unwrap_or_else(|p| p.into_inner()).contains(&source)
    }

    /// Peers admitted now.
    pub fn allowed_peers(&self) -> Vec<PeerName> {
        self.current().allowed_peers.to_vec()
    }

    pub(crate) fn current(&self) -> Current {
        self.shared.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes a new connection of `peer`, closed when `close` is cancelled;
    /// `false` (not noted) when the peer
    /// has [`CONNECTIONS_PER_PEER`] open already: a peer's link needs two, and each
    /// holds up to an HTTP/2 window of request data (see `budget.rs`).
    pub(crate) fn register(&self, peer: PeerName, close: CancellationToken, probe: TcpProbe) -> bool {
        let mut connections = self.connections();
        // Finished connections cancel their own token (see listener's PeerIo), so this prunes them.
        connections.retain(|c| !c.close.is_cancelled());
        if connections.iter().filter(|c| c.peer == peer).count() >= CONNECTIONS_PER_PEER {
            return false;
        }
        connections.push(Connection { peer, close, probe });
        true
    }

    /// Probes of `peer`'s open connections to this listener: what they
    /// carry from here (answers, acknowledgements) goes the way of this
    /// master's pushes to it, so they tell too whether that path loses
    /// packets.
    pub fn probes(&self, peer: &PeerName) -> Vec<TcpProbe> {
        let connections = self.connections();
        let open = connections.iter().filter(|c| &c.peer == peer && !c.close.is_cancelled() && c.probe.is_open());
        open.map(|c| c.probe.clone()).collect()
    }

    fn close_where(&self, close: impl Fn(&PeerName) -> bool) -> Vec<PeerName> {
        let mut closed = Vec::new();
        self.connections().retain(|c| {
            if c.close.is_cancelled() {
                return false;
            }
            if close(&c.peer) {
                c.close.cancel();
                closed.push(c.peer.clone());
                return false;
            }
            true
        });
        closed
    }

    fn connections(&self) -> MutexGuard<'_, Vec<Connection>> {
        self.shared.connections.lock().unwrap_or_else(|p| p.into_inner())
    }
}
