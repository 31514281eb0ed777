//! A TCP relay on loopback that a test can cut and heal, to partition agents
//! over real connections, or slow down, to see what waits behind what.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// The most a throttled connection forwards at once: this long's worth.
const TICK: Duration = Duration::from_millis(50);

/// Relays connections to `target` while up; cutting it drops open
/// connections and refuses new ones until healed. Throttled, it forwards
/// what each connection's client sends at most at a given rate, holding
/// the rest (the client's TCP never waits: its bytes wait here, counted).
pub struct Link {
    pub addr: SocketAddr,
    up: Arc<watch::Sender<bool>>,
    /// Bytes per second each connection forwards towards the target (`None`: all at once).
    rate: Arc<watch::Sender<Option<usize>>>,
    /// Per open connection, the bytes its client sent that are not forwarded yet.
    held: Arc<Mutex<Vec<Arc<AtomicUsize>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    pub async fn start(target: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(watch::channel(true).0);
        let rate = Arc::new(watch::channel(None).0);
        let held: Arc<Mutex<Vec<Arc<AtomicUsize>>>> = Arc::default();
        let (relay_up, relay_rate, relay_held) = (up.clone(), rate.clone(), held.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else { return };
                if !*relay_up.borrow() {
                    continue;
                }
                let mut down = relay_up.subscribe();
                let rate = relay_rate.subscribe();
                let waiting = Arc::new(AtomicUsize::new(0));
                relay_held.lock().unwrap().push(waiting.clone());
                let held = relay_held.clone();
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        tokio::select! {
                            () = relay(inbound, outbound, rate, waiting.clone()) => {}
                            _ = down.wait_for(|up| !*up) => {}
                        }
                    }
                    // Closed (or cut): it holds nothing any more.
                    held.lock().unwrap().retain(|other| !Arc::ptr_eq(other, &waiting));
                });
            }
        });
        Link { addr, up, rate, held, task }
    }

    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn heal(&self) {
        self.up.send_replace(true);
    }

    /// From now on each connection forwards at most `bytes_per_sec` (at
    /// least 1) towards the target (`None`: as it comes).
    pub fn throttle(&self, bytes_per_sec: Option<usize>) {
        self.rate.send_replace(bytes_per_sec.map(|rate| rate.max(1)));
    }

    /// The most bytes one connection holds not forwarded yet.
    pub fn most_held(&self) -> usize {
        self.held.lock().unwrap().iter().map(|held| held.load(Ordering::SeqCst)).max().unwrap_or(0)
    }
}

/// One connection, until both sides have closed it: the target's bytes
/// back as they come; the client's forwarded at the rate `rate` says, those
/// not forwarded yet counted in `waiting`.
async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    mut rate: watch::Receiver<Option<usize>>,
    waiting: Arc<AtomicUsize>,
) {
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_target, mut to_target) = outbound.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let counted = waiting.clone();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf).await {
            counted.fetch_add(n, Ordering::SeqCst);
            if tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some(chunk) = rx.recv().await {
            let mut rest = chunk.as_slice();
            while !rest.is_empty() {
                let per_sec = *rate.borrow_and_update();
                // A tick's share at most, then the time it takes at that rate.
                let share = per_sec.map_or(rest.len(), |per_sec| (per_sec * TICK.as_millis() as usize / 1000).max(1));
                let (now, later) = rest.split_at(share.min(rest.len()));
                if to_target.write_all(now).await.is_err() {
                    return;
                }
                waiting.fetch_sub(now.len(), Ordering::SeqCst);
                rest = later;
                if let Some(per_sec) = per_sec {
                    tokio::time::sleep(Duration::from_secs_f64(now.len() as f64 / per_sec as f64)).await;
                }
            }
        }
        let _ = to_target.shutdown().await;
    };
    let back = async move {
        let _ = tokio::io::copy(&mut from_target, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(read, write, back);
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

    /// Throttles the relay agent `i` reaches agent `j` through (see [`Link::throttle`]).
    pub fn throttle(&self, i: usize, j: usize, bytes_per_sec: Option<usize>) {
        self.links[&(i, j)].throttle(bytes_per_sec);
    }

    /// The most bytes one connection from agent `i` to agent `j` holds not
    /// forwarded yet (see [`Link::most_held`]).
    pub fn most_held(&self, i: usize, j: usize) -> usize {
        self.links[&(i, j)].most_held()
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
