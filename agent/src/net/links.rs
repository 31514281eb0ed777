//! The set of outbound peer links, changed live by a config reload: a link is
//! started for each added peer, stopped for each removed one, restarted when
//! its address changes (or when trust changed), and left alone otherwise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keysync_machine::PeerName;
use keysync_server::{ListenerControl, TlsSetup};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Peer;
use crate::disk::audit::AuditLog;
use crate::net::peers::PeerLink;
use crate::node::CoreHandle;

/// What every link shares.
pub struct LinkContext {
    pub node: String,
    pub tls: watch::Receiver<Arc<TlsSetup>>,
    pub core: CoreHandle,
    pub audit: Arc<AuditLog>,
    pub anti_entropy_interval: Duration,
    pub reconnect_max: Duration,
    pub board: Arc<crate::ops::board::Board>,
    /// The listener, whose connections of each peer tell its link too
    /// whether the path loses packets.
    pub listener: ListenerControl,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
}

/// The running links by peer name.
pub struct PeerLinks {
    ctx: LinkContext,
    running: BTreeMap<PeerName, Running>,
    /// What says each link a reload removed has ended: a link added again
    /// for that peer waits for it (the newest per name; a link it replaced
    /// ended before it).
    removed: BTreeMap<PeerName, CancellationToken>,
}

/// A running link: its peer, what stops it, and what says it ended.
struct Running {
    peer: Peer,
    stop: CancellationToken,
    ended: CancellationToken,
}

/// What [`PeerLinks::update`] changed, by peer name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinkChanges {
    pub added: Vec<PeerName>,
    pub removed: Vec<PeerName>,
    /// Restarted because the address changed.
    pub readdressed: Vec<PeerName>,
    /// Restarted because `restart_all` was asked (new trust anchors).
    pub restarted: Vec<PeerName>,
}

impl LinkChanges {
    pub fn is_empty(&self) -> bool {
        *self == LinkChanges::default()
    }
}

impl std::fmt::Display for LinkChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (sign, names) in [("+", &self.added), ("-", &self.removed), ("~", &self.readdressed)] {
            parts.extend(names.iter().map(|name| format!("{sign}{name}")));
        }
        if !self.restarted.is_empty() {
            parts.push(format!("reconnected {}", self.restarted.join(",")));
        }
        if parts.is_empty() {
            return f.write_str("peers unchanged");
        }
        write!(f, "peers {}", parts.join(" "))
    }
}

impl PeerLinks {
    /// Starts one link per peer.
    pub fn start(ctx: LinkContext, peers: &[Peer]) -> PeerLinks {
        let mut links = PeerLinks { ctx, running: BTreeMap::new(), removed: BTreeMap::new() };
        links.update(peers, false);
        links
    }

    /// Tells the core the site's masters (a reload changed them): the
    /// origins a peer's decision may name.
    pub fn set_masters(&self, names: Vec<String>) {
        let core = self.ctx.core.clone();
        self.ctx.tasks.spawn(async move {
            let _ = core.tell(crate::node::Request::Masters { names }).await;
        });
    }

    /// Makes the running links match `peers`. `restart_all`: restart the
    /// links that stay too, so each connection proves itself under new trust.
    pub fn update(&mut self, peers: &[Peer], restart_all: bool) -> LinkChanges {
        let mut changes = LinkChanges::default();
        self.ctx.board.set_peers(peers);
        let wanted: BTreeMap<&str, &Peer> = peers.iter().map(|p| (p.name.as_str(), p)).collect();
        let removed = &mut self.removed;
        self.running.retain(|name, running| {
            let keep = wanted.contains_key(name.as_str());
            if !keep {
                running.stop.cancel();
                removed.insert(name.clone(), running.ended.clone());
                changes.removed.push(name.clone());
            }
            keep
        });
        // Links long ended need no waiting for.
        self.removed.retain(|_, ended| !ended.is_cancelled());
        for peer in peers {
            match self.running.get(&peer.name) {
                None => changes.added.push(peer.name.clone()),
                Some(running) if running.peer.address != peer.address => changes.readdressed.push(peer.name.clone()),
                Some(_) if restart_all => changes.restarted.push(peer.name.clone()),
                Some(_) => continue,
            }
            let after = match self.running.remove(&peer.name) {
                Some(old) => {
                    old.stop.cancel();
                    Some(old.ended)
                }
                None => self.removed.remove(&peer.name),
            };
            self.spawn(peer.clone(), after);
        }
        changes
    }

    /// Starts `peer`'s link, once the link it replaces (`after`) ended.
    fn spawn(&mut self, peer: Peer, after: Option<CancellationToken>) {
        let stop = self.ctx.shutdown.child_token();
        let link = PeerLink {
            peer: peer.clone(),
            node: self.ctx.node.clone(),
            tls: self.ctx.tls.clone(),
            core: self.ctx.core.clone(),
            audit: self.ctx.audit.clone(),
            anti_entropy_interval: self.ctx.anti_entropy_interval,
            reconnect_max: self.ctx.reconnect_max,
            board: self.ctx.board.clone(),
            listener: self.ctx.listener.clone(),
            lossy_until: Default::default(),
            after,
            ended: CancellationToken::new(),
        };
        let ended = link.ended.clone();
        self.ctx.tasks.spawn(link.run(stop.clone()));
        self.running.insert(peer.name.clone(), Running { peer, stop, ended });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keysync_machine::testkit::peer;

    #[test]
    fn changes_read_as_a_diff() {
        let changes = LinkChanges {
            added: vec![peer("master-d")],
            removed: vec![peer("master-b")],
            readdressed: vec![peer("master-c")],
            restarted: vec![],
        };
        assert_eq!(changes.to_string(), "peers +master-d -master-b ~master-c");
        assert_eq!(LinkChanges::default().to_string(), "peers unchanged");
    }
}
