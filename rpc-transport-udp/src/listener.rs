//! [`UdpListener`]: one socket serving many peers. A task reads every datagram and
//! routes it by source address to that peer's [`UdpLink`]; the first datagram from a
//! new address creates the link, which [`accept`](Listener::accept) hands to the
//! server. With [`UdpConfig::peer_sockets`] (the default) the new link also gets its
//! own socket connected to the peer, which from then on receives that peer's
//! datagrams in place of the shared one.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    sync::{atomic::Ordering, Arc, Mutex},
};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    frame::{self, FrameKind, GoAwayCode},
    link::{LinkConfig, Listener},
    Error, ErrorKind,
};
use tokio::{net::UdpSocket, sync::mpsc, task::JoinHandle};

use crate::{
    config::{UdpConfig, UdpStats},
    datagram,
    engine::Engine,
    link::UdpLink,
    socket::SocketPermit,
};

/// New peers waiting for the server to accept them; past it, their first datagrams
/// are dropped (they send again).
const ACCEPT_QUEUE: usize = 256;

type Peers = Arc<Mutex<HashMap<SocketAddr, (u64, mpsc::Sender<Bytes>)>>>;

/// The datagrams routed to one peer's link, counted against the listener's
/// `max_queued_bytes` until the link takes them.
pub(crate) struct PeerQueue {
    rx: mpsc::Receiver<Bytes>,
    stats: Arc<UdpStats>,
}

impl PeerQueue {
    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(datagram)) = &polled {
            self.stats
                .queued_bytes
                .fetch_sub(datagram.len(), Ordering::Relaxed);
        }
        polled
    }
}

impl Drop for PeerQueue {
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(datagram) = self.rx.try_recv() {
            self.stats
                .queued_bytes
                .fetch_sub(datagram.len(), Ordering::Relaxed);
        }
    }
}

/// Removes a peer from the listener's table when its link is dropped.
pub(crate) struct PeerGuard {
    peers: Peers,
    addr: SocketAddr,
    generation: u64,
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers
            .get(&self.addr)
            .is_some_and(|(generation, _)| *generation == self.generation)
        {
            peers.remove(&self.addr);
        }
    }
}

/// Accepts UDP peers on one socket. Dropping it stops the routing task; the links
/// already accepted then see the end of their stream.
#[derive(Debug)]
pub struct UdpListener {
    local: SocketAddr,
    accepted: mpsc::Receiver<UdpLink>,
    stats: Arc<UdpStats>,
    peers: Peers,
    task: JoinHandle<()>,
}

impl Drop for UdpListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UdpListener {
    /// Binds `addr` with `config`.
    pub async fn bind(addr: SocketAddr, config: UdpConfig) -> Result<UdpListener, Error> {
        let socket = crate::socket::bind_listener(addr, &config)?;
        let local = socket
            .local_addr()
            .map_err(|e| Error::io("local address of a UDP socket", e))?;
        let stats = Arc::new(UdpStats::default());
        let peers: Peers = Arc::default();
        let (tx, accepted) = mpsc::channel(ACCEPT_QUEUE);
        let task = tokio::spawn(route(
            Arc::new(socket),
            Arc::new(config),
            stats.clone(),
            peers.clone(),
            tx,
        ));
        Ok(UdpListener {
            local,
            accepted,
            stats,
            peers,
            task,
        })
    }

    /// The bound address.
    pub fn local_socket_addr(&self) -> SocketAddr {
        self.local
    }

    /// The bound address as a URI (`udp://127.0.0.1:4000`).
    pub fn local_addr_uri(&self) -> String {
        format!("udp://{}", self.local)
    }

    /// What this listener's links did.
    pub fn stats(&self) -> &Arc<UdpStats> {
        &self.stats
    }

    /// Peers served now.
    pub fn peers(&self) -> usize {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Listener for UdpListener {
    type Link = UdpLink;

    async fn accept(&mut self, config: &LinkConfig) -> Result<UdpLink, Error> {
        let mut link = self
            .accepted
            .recv()
            .await
            .ok_or_else(|| Error::new(ErrorKind::Closed, "UDP listener stopped"))?;
        link.engine_mut().set_max_message_len(config.max_frame_len);
        Ok(link)
    }

    fn local_addr(&self) -> String {
        self.local_addr_uri()
    }
}

/// The routing task: reads every datagram of the shared socket.
async fn route(
    socket: Arc<UdpSocket>,
    config: Arc<UdpConfig>,
    stats: Arc<UdpStats>,
    peers: Peers,
    accepted: mpsc::Sender<UdpLink>,
) {
    let mut buf = vec![0u8; 65_536];
    let mut generation = 0u64;
    let max_peer_sockets = config
        .max_peer_sockets
        .min(crate::socket::descriptor_budget());
    // Datagrams that reached a new peer's own socket before it was connected.
    let mut strays: VecDeque<(Bytes, SocketAddr)> = VecDeque::new();
    loop {
        let (datagram, from) = match strays.pop_front() {
            Some(stray) => stray,
            None => match socket.recv_from(&mut buf).await {
                // A copy of exactly the datagram's size (not a slice of a 64 KiB buffer).
                Ok((n, from)) => (Bytes::copy_from_slice(&buf[..n]), from),
                Err(err) => {
                    // Unconnected sockets see no ICMP errors; anything else is transient.
                    tracing::debug!(error = %err, "UDP receive failed");
                    continue;
                }
            },
        };
        let n = datagram.len();
        if !plausible(&datagram) {
            UdpStats::add(&stats.datagrams_received, 1);
            UdpStats::add(&stats.malformed, 1);
            continue;
        }
        if stats.queued_bytes.load(Ordering::Relaxed) + n > config.max_queued_bytes {
            UdpStats::add(&stats.queue_full, 1);
            continue;
        }
        let datagram = {
            let mut table = peers.lock().unwrap_or_else(|e| e.into_inner());
            match table.get(&from) {
                Some((_, tx)) => {
                    // Counted before the link can take it (and subtract it).
                    stats.queued_bytes.fetch_add(n, Ordering::Relaxed);
                    match tx.try_send(datagram) {
                        Ok(()) => continue,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            stats.queued_bytes.fetch_sub(n, Ordering::Relaxed);
                            UdpStats::add(&stats.queue_full, 1);
                            continue;
                        }
                        // The link is gone but its guard has not run yet: a new peer.
                        Err(mpsc::error::TrySendError::Closed(datagram)) => {
                            stats.queued_bytes.fetch_sub(n, Ordering::Relaxed);
                            table.remove(&from);
                            datagram
                        }
                    }
                }
                None => datagram,
            }
        };
        // A datagram from a new peer. Acknowledgements open nothing.
        if datagram.first() == Some(&datagram::ACK) {
            continue;
        }
        let full = peers.lock().unwrap_or_else(|e| e.into_inner()).len() >= config.max_peers;
        if full || accepted.capacity() == 0 {
            UdpStats::add(&stats.peers_refused, 1);
            refuse(&socket, &datagram, from);
            continue;
        }
        generation += 1;
        let (tx, rx) = mpsc::channel(config.peer_queue.max(1));
        stats.queued_bytes.fetch_add(n, Ordering::Relaxed);
        if tx.try_send(datagram).is_err() {
            stats.queued_bytes.fetch_sub(n, Ordering::Relaxed);
        }
        let rx = PeerQueue {
            rx,
            stats: stats.clone(),
        };
        peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(from, (generation, tx));
        let guard = PeerGuard {
            peers: peers.clone(),
            addr: from,
            generation,
        };
        let permit = config
            .peer_sockets
            .then(|| SocketPermit::take(&stats, max_peer_sockets))
            .flatten();
        let own = if let Some(permit) = permit {
            match crate::socket::connected_to(&socket, from, &config, permit) {
                Ok(own) => {
                    UdpStats::add(&stats.peer_sockets, 1);
                    for (datagram, source) in crate::socket::drain_strays(&own) {
                        if source != from {
                            UdpStats::add(&stats.strays, 1);
                        }
                        strays.push_back((datagram, source));
                    }
                    Some(own)
                }
                Err(err) => {
                    tracing::debug!(peer = %from, error = %err, "peer shares the listener's socket");
                    None
                }
            }
        } else {
            None
        };
        let engine = Engine::new(
            config.clone(),
            stats.clone(),
            rpc_core::link::DEFAULT_MAX_FRAME_LEN,
        );
        let link = UdpLink::peer_of(
            engine,
            socket.clone(),
            own,
            from,
            rx,
            guard,
            stats.clone(),
            config.peer_idle_timeout,
        );
        tracing::debug!(peer = %from, "new UDP peer");
        if accepted.try_send(link).is_err() {
            UdpStats::add(&stats.peers_refused, 1); // the guard removes the entry
        }
    }
}

/// Whether a datagram is worth routing: a known type and at least a header.
fn plausible(datagram: &[u8]) -> bool {
    match datagram.first() {
        Some(&datagram::WHOLE) => datagram.len() >= frame::HEADER_LEN,
        Some(&datagram::FRAGMENT) => datagram.len() >= datagram::FRAGMENT_HEADER_LEN,
        Some(&datagram::ACK) => datagram.len() >= datagram::ACK_HEADER_LEN,
        _ => false,
    }
}

/// Answers a whole REQUEST from a peer the listener cannot take with GOAWAY
/// `TOO_MANY_CONNECTIONS` (never larger than the request, so it amplifies nothing).
fn refuse(socket: &UdpSocket, datagram: &[u8], to: SocketAddr) {
    if datagram.first() != Some(&datagram::WHOLE) || datagram.get(1) != Some(&FrameKind::REQUEST.0)
    {
        return;
    }
    let mut buf = BytesMut::new();
    frame::encode_goaway(
        &mut buf,
        0,
        GoAwayCode::TOO_MANY_CONNECTIONS,
        "too many UDP peers",
    );
    if buf.len() <= datagram.len() {
        let _ = socket.try_send_to(&buf, to);
    }
}
