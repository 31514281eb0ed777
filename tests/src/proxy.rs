//! A TCP relay on loopback that a test can cut and heal, to partition agents
//! over real connections.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Relays connections to `target` while up; cutting it drops open
/// connections and refuses new ones until healed.
pub struct Link {
    pub addr: SocketAddr,
    up: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    pub async fn start(target: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, _) = watch::channel(true);
        let up = Arc::new(up);
        let relay_up = up.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else { return };
                if !*relay_up.borrow() {
                    continue;
                }
                let mut down = relay_up.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = down.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Link { addr, up, task }
    }

    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn heal(&self) {
        self.up.send_replace(true);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A relay for every ordered pair of `n` agents: agent `i` reaches agent `j`
/// through `relay(i, j)`, so a test can cut any direction between any two.
pub struct Relays {
    links: std::collections::HashMap<(usize, usize), Link>,
}

impl Relays {
    /// Starts the relays towards the agents listening on `addrs`.
    pub async fn start(addrs: &[SocketAddr]) -> Relays {
        let mut links = std::collections::HashMap::new();
        for i in 0..addrs.len() {
            for j in (0..addrs.len()).filter(|&j| j != i) {
                links.insert((i, j), Link::start(addrs[j]).await);
            }
        }
        Relays { links }
    }

    /// The address agent `i` dials to reach agent `j`.
    pub fn addr(&self, i: usize, j: usize) -> SocketAddr {
        self.links[&(i, j)].addr
    }

    /// Cuts the relays both ways between `i` and `j`.
    pub fn cut(&self, i: usize, j: usize) {
        self.cut_one_way(i, j);
        self.cut_one_way(j, i);
    }

    /// Cuts only the relay agent `i` reaches agent `j` through: `j` still
    /// reaches `i`.
    pub fn cut_one_way(&self, i: usize, j: usize) {
        self.links[&(i, j)].cut();
    }

    /// Cuts every relay between agents of different groups.
    pub fn partition(&self, groups: &[&[usize]]) {
        let group_of = |idx: usize| groups.iter().position(|g| g.contains(&idx));
        for (&(i, j), link) in &self.links {
            if group_of(i) != group_of(j) {
                link.cut();
            }
        }
    }

    pub fn heal(&self) {
        for link in self.links.values() {
            link.heal();
        }
    }
}
