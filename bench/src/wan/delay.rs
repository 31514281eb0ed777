//! The user-space delay line (this kernel has no netem): one thread reads
//! every IPv4 packet the masters' TUN devices send, drops it with the loss
//! probability, and writes it to the TUN device of the master it is
//! addressed to one one-way delay later. Every link has the same delay, so
//! one FIFO of due times keeps each link's packets in order. Per link
//! (source, destination) it counts packets and bytes (IP headers included:
//! what the wire carries) and when its first packet left.
//!
//! The thread sleeps in ppoll(2) until a packet comes or the next one is
//! due (at most 100 ms, to notice the stop), so it costs nothing when idle.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::wan::netns::index_of;

/// Longest sleep between two looks at the stop flag.
const IDLE: Duration = Duration::from_millis(100);

/// What has crossed the links so far.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    n: usize,
    /// Per link `src * n + dst`: packets and bytes sent (lost ones included)
    /// and packets lost.
    pub packets: Vec<u64>,
    pub bytes: Vec<u64>,
    pub lost: Vec<u64>,
    /// Per source: when its first packet other than a TCP reset was read
    /// since [`DelayLine::forget_first`] (a master whose agent is not
    /// running yet answers its peers' connection attempts with resets).
    pub first_from: Vec<Option<Instant>>,
}

impl Counts {
    fn new(n: usize) -> Counts {
        Counts { n, packets: vec![0; n * n], bytes: vec![0; n * n], lost: vec![0; n * n], first_from: vec![None; n] }
    }

    pub fn link_bytes(&self, src: usize, dst: usize) -> u64 {
        self.bytes[src * self.n + dst]
    }

    pub fn link_packets(&self, src: usize, dst: usize) -> u64 {
        self.packets[src * self.n + dst]
    }

    /// Bytes over every link.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// Bytes sent to `dst` by all others.
    pub fn bytes_to(&self, dst: usize) -> u64 {
        (0..self.n).map(|src| self.link_bytes(src, dst)).sum()
    }

    pub fn total_lost(&self) -> u64 {
        self.lost.iter().sum()
    }

    /// What crossed since `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let minus = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(a, b)| a - b).collect();
        Counts {
            n: self.n,
            packets: minus(&self.packets, &earlier.packets),
            bytes: minus(&self.bytes, &earlier.bytes),
            lost: minus(&self.lost, &earlier.lost),
            first_from: self.first_from.clone(),
        }
    }
}

/// The running delay line; stopped (its thread joined) when dropped.
pub struct DelayLine {
    counts: Arc<Mutex<Counts>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DelayLine {
    /// Starts moving packets between `tuns` (master `i`'s device is
    /// `tuns[i]`), each delayed `one_way` and lost with probability `loss`.
    pub fn start(tuns: Vec<File>, one_way: Duration, loss: f64) -> anyhow::Result<DelayLine> {
        let counts = Arc::new(Mutex::new(Counts::new(tuns.len())));
        let stop = Arc::new(AtomicBool::new(false));
        let line = Line { tuns, one_way, loss, counts: counts.clone(), stop: stop.clone(), random: seed() };
        let thread = std::thread::Builder::new().name("wan-delay-line".into()).spawn(move || line.run())?;
        Ok(DelayLine { counts, stop, thread: Some(thread) })
    }

    /// Forgets when each master's first packet left: the next ones count.
    pub fn forget_first(&self) {
        lock(&self.counts).first_from.iter_mut().for_each(|first| *first = None);
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        lock(&self.counts).clone()
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(counts: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    counts.lock().unwrap_or_else(|e| e.into_inner())
}

struct Line {
    tuns: Vec<File>,
    one_way: Duration,
    loss: f64,
    counts: Arc<Mutex<Counts>>,
    stop: Arc<AtomicBool>,
    random: u64,
}

/// A packet in flight: when it is due, and to which master.
struct InFlight {
    due: Instant,
    dst: usize,
    packet: Vec<u8>,
}

impl Line {
    fn run(mut self) {
        let mut queue: VecDeque<InFlight> = VecDeque::new();
        // Larger than any packet a TUN device of MTU 1500 sends.
        let mut buf = vec![0u8; 65536];
        while !self.stop.load(Ordering::Relaxed) {
            let wait = queue.front().map_or(IDLE, |p| p.due.saturating_duration_since(Instant::now())).min(IDLE);
            let ready: Vec<bool> = {
                let mut fds: Vec<PollFd> = self.tuns.iter().map(|t| PollFd::new(t, PollFlags::IN)).collect();
                let timeout = Timespec { tv_sec: wait.as_secs() as _, tv_nsec: wait.subsec_nanos() as _ };
                match poll(&mut fds, Some(&timeout)) {
                    Ok(_) => fds.iter().map(|fd| fd.revents().contains(PollFlags::IN)).collect(),
                    Err(rustix::io::Errno::INTR) => vec![false; self.tuns.len()],
                    Err(e) => {
                        eprintln!("delay line: poll failed, stopping: {e}");
                        return;
                    }
                }
            };
            for src in (0..self.tuns.len()).filter(|&src| ready[src]) {
                // Every packet queued now: one read each, until none is left.
                loop {
                    match (&self.tuns[src]).read(&mut buf) {
                        Ok(0) => break,
                        Ok(len) => self.take(src, &buf[..len], &mut queue),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => {
                            eprintln!("delay line: cannot read master {src}'s device: {e}");
                            break;
                        }
                    }
                }
            }
            let now = Instant::now();
            while queue.front().is_some_and(|p| p.due <= now) {
                let Some(p) = queue.pop_front() else { break };
                // A device gone (its namespace deleted at the end) takes nothing.
                let _ = (&self.tuns[p.dst]).write(&p.packet);
            }
        }
    }

    /// Counts a packet master `src` sent, and queues it unless it is lost
    /// (or addressed to no master: IPv6 and other strays are dropped).
    fn take(&mut self, src: usize, packet: &[u8], queue: &mut VecDeque<InFlight>) {
        let read_at = Instant::now();
        if packet.len() < 20 || packet[0] >> 4 != 4 {
            return;
        }
        let Some(dst) = index_of([packet[16], packet[17], packet[18], packet[19]]) else { return };
        if dst >= self.tuns.len() || dst == src {
            return;
        }
        let lost = self.loss > 0.0 && self.next_unit() < self.loss;
        {
            let mut counts = lock(&self.counts);
            let link = src * self.tuns.len() + dst;
            counts.packets[link] += 1;
            counts.bytes[link] += packet.len() as u64;
            counts.lost[link] += u64::from(lost);
            if !is_tcp_reset(packet) {
                counts.first_from[src].get_or_insert(read_at);
            }
        }
        if !lost {
            queue.push_back(InFlight { due: read_at + self.one_way, dst, packet: packet.to_vec() });
        }
    }

    /// A uniform number in [0, 1) (xorshift64*: loss needs no better).
    fn next_unit(&mut self) -> f64 {
        self.random ^= self.random >> 12;
        self.random ^= self.random << 25;
        self.random ^= self.random >> 27;
        (self.random.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether an IPv4 packet is a TCP segment with RST set.
fn is_tcp_reset(packet: &[u8]) -> bool {
    let header = usize::from(packet[0] & 0x0f) * 4;
    packet[9] == 6 && packet.get(header + 13).is_some_and(|flags| flags & 0x04 != 0)
}

/// A non-zero seed that differs between runs.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id())) | 1
}
