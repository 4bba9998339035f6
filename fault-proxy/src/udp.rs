//! [`UdpProxy`]: forwards datagrams and drops, duplicates, reorders and delays them.

use std::{
    collections::{hash_map::Entry, HashMap},
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::{net::UdpSocket, task::JoinHandle};

use crate::Rng;

/// What to do to the datagrams going through a [`UdpProxy`] (both directions).
#[derive(Clone, Debug, Default)]
pub struct UdpFaults {
    /// Probability of dropping a datagram.
    pub drop: f64,
    /// Probability of sending a datagram twice.
    pub duplicate: f64,
    /// Probability of holding a datagram back and sending it after the next one in the
    /// same direction (or after `reorder_hold` if none comes).
    pub reorder: f64,
    /// How long a held-back datagram waits for a successor. Default (zero): 5 ms.
    pub reorder_hold: Duration,
    /// Delay before forwarding each datagram (order is kept).
    pub delay: Duration,
    /// Seed of the random generators (one per direction of each client): the same
    /// seed and traffic give the same faults, however the two directions interleave.
    pub seed: u64,
}

/// What a [`UdpProxy`] did.
#[derive(Debug, Default)]
pub struct UdpCounters {
    /// Datagrams received from either side.
    pub received: AtomicU64,
    /// Datagrams forwarded (duplicates count twice).
    pub forwarded: AtomicU64,
    /// Datagrams dropped.
    pub dropped: AtomicU64,
    /// Bytes of the dropped datagrams.
    pub dropped_bytes: AtomicU64,
    /// Datagrams sent twice.
    pub duplicated: AtomicU64,
    /// Datagrams sent after a later one.
    pub reordered: AtomicU64,
}

/// A UDP proxy on a loopback port. Each client address gets its own upstream socket,
/// so the server sees one peer per client. Dropping the proxy stops it.
pub struct UdpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

struct Shared {
    /// The faults, and how many times they were set: a lane whose generator came from
    /// an earlier setting starts its sequence again from the new seed.
    faults: Mutex<(UdpFaults, u64)>,
    counters: UdpCounters,
}

impl UdpProxy {
    /// Starts a proxy on `127.0.0.1:0` that forwards to `upstream`.
    pub async fn start(upstream: SocketAddr, faults: UdpFaults) -> io::Result<UdpProxy> {
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
        let addr = socket.local_addr()?;
        let shared = Arc::new(Shared {
            faults: Mutex::new((faults, 0)),
            counters: UdpCounters::default(),
        });
        let task = tokio::spawn(client_side(socket, upstream, shared.clone()));
        Ok(UdpProxy { addr, shared, task })
    }

    /// The address clients send to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the faults (the random sequences restart from the new seed).
    pub fn set_faults(&self, faults: UdpFaults) {
        let mut guard = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
        let generation = guard.1 + 1;
        *guard = (faults, generation);
    }

    /// What the proxy did so far.
    pub fn counters(&self) -> &UdpCounters {
        &self.shared.counters
    }
}

impl Drop for UdpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One direction's sender: applies the faults and keeps a held-back datagram.
struct Lane {
    socket: Arc<UdpSocket>,
    to: Option<SocketAddr>,
    shared: Arc<Shared>,
    held: Option<(Vec<u8>, JoinHandle<()>)>,
    /// This lane's own generator, so that its decisions depend on its own traffic
    /// alone (a generator shared by both directions made them depend on how the two
    /// interleaved): from the seed and `salt`, for the faults' `generation`.
    rng: Rng,
    salt: u64,
    generation: u64,
}

impl Lane {
    fn new(socket: Arc<UdpSocket>, to: Option<SocketAddr>, shared: Arc<Shared>, salt: u64) -> Lane {
        let (seed, generation) = {
            let guard = shared.faults.lock().unwrap_or_else(|e| e.into_inner());
            (guard.0.seed, guard.1)
        };
        Lane {
            socket,
            to,
            shared,
            held: None,
            rng: Rng::new(seed ^ salt),
            salt,
            generation,
        }
    }
}

impl Lane {
    async fn send_now(&self, datagram: Vec<u8>, copies: u32) {
        let delay = self
            .shared
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .delay;
        let socket = self.socket.clone();
        let to = self.to;
        let shared = self.shared.clone();
        let send = async move {
            for _ in 0..copies {
                let sent = match to {
                    Some(to) => socket.send_to(&datagram, to).await,
                    None => socket.send(&datagram).await,
                };
                if sent.is_ok() {
                    shared.counters.forwarded.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        if delay.is_zero() {
            send.await;
        } else {
            // Fixed delay for every datagram keeps their order.
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                send.await;
            });
        }
    }

    async fn forward(&mut self, datagram: Vec<u8>) {
        let c = &self.shared.counters;
        c.received.fetch_add(1, Ordering::SeqCst);
        let (drop, duplicate, reorder, hold) = {
            let guard = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
            let (faults, generation) = &*guard;
            if *generation != self.generation {
                self.generation = *generation;
                self.rng = Rng::new(faults.seed ^ self.salt);
            }
            let rng = &mut self.rng;
            let hold = if faults.reorder_hold.is_zero() {
                Duration::from_millis(5)
            } else {
                faults.reorder_hold
            };
            let (p_drop, p_dup, p_reorder) = (faults.drop, faults.duplicate, faults.reorder);
            (
                rng.chance(p_drop),
                rng.chance(p_dup),
                rng.chance(p_reorder),
                hold,
            )
        };
        if drop {
            c.dropped.fetch_add(1, Ordering::SeqCst);
            c.dropped_bytes
                .fetch_add(datagram.len() as u64, Ordering::SeqCst);
            return;
        }
        let copies = if duplicate {
            c.duplicated.fetch_add(1, Ordering::SeqCst);
            2
        } else {
            1
        };
        if reorder && self.held.is_none() {
            // Send it later: after the next datagram, or when the hold time is up.
            c.reordered.fetch_add(1, Ordering::SeqCst);
            let late = datagram.clone();
            let socket = self.socket.clone();
            let to = self.to;
            let shared = self.shared.clone();
            let timer = tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                let sent = match to {
                    Some(to) => socket.send_to(&late, to).await,
                    None => socket.send(&late).await,
                };
                if sent.is_ok() {
                    shared.counters.forwarded.fetch_add(1, Ordering::SeqCst);
                }
            });
            self.held = Some((datagram, timer));
            return;
        }
        self.send_now(datagram, copies).await;
        if let Some((held, timer)) = self.held.take() {
            timer.abort();
            if timer.await.is_err() {
                // Aborted before it sent: send it now, after its successor.
                self.send_now(held, 1).await;
            }
        }
    }
}

async fn client_side(socket: Arc<UdpSocket>, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut peers: HashMap<SocketAddr, (Lane, AbortOnDrop)> = HashMap::new();
    let mut peers_seen: u64 = 0;
    let mut buf = vec![0u8; 65_536];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let lane = match peers.entry(from) {
            Entry::Occupied(entry) => &mut entry.into_mut().0,
            Entry::Vacant(slot) => {
                let Ok(up) = UdpSocket::bind("127.0.0.1:0").await else {
                    continue;
                };
                if up.connect(upstream).await.is_err() {
                    continue;
                }
                let up = Arc::new(up);
                // Each client's two directions draw from generators of their own, in
                // the order the clients came.
                let salt = peers_seen.wrapping_mul(0x9e37_79b9_7f4a_7c15) << 1;
                peers_seen += 1;
                let back = Lane::new(socket.clone(), Some(from), shared.clone(), salt ^ 1);
                let task = AbortOnDrop(tokio::spawn(server_side(up.clone(), back)));
                let lane = Lane::new(up, None, shared.clone(), salt);
                &mut slot.insert((lane, task)).0
            }
        };
        lane.forward(buf[..n].to_vec()).await;
    }
}

/// Stops a peer's return-path task when the proxy (and so its peer table) goes away.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn server_side(up: Arc<UdpSocket>, mut back: Lane) {
    let mut buf = vec![0u8; 65_536];
    loop {
        match up.recv(&mut buf).await {
            Ok(n) => back.forward(buf[..n].to_vec()).await,
            // ICMP port unreachable and the like: keep going, as a network would.
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}
