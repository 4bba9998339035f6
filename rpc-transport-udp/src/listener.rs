//! [`UdpListener`]: one socket serving many peers. A task reads every datagram and
//! routes it by source address to that peer's [`UdpLink`]. An address gets a link only
//! once it has shown that it receives there (docs/wire.md, "Opening an association"):
//! its HELLO is answered with a stateless RETRY carrying a token, and only a HELLO that
//! echoes a valid token creates the link, which [`accept`](Listener::accept) hands to
//! the server. Until then nothing is kept per address: a PING is answered PONG, a
//! REQUEST or fragment with a GOAWAY no larger than it, anything else is dropped. With
//! [`UdpConfig::peer_sockets`] (the default) the new link also gets its own socket
//! connected to the peer, which from then on receives that peer's datagrams in place
//! of the shared one.
//!
//! The table of associations is bounded by [`UdpConfig::max_peers`]; when it is full,
//! a validated HELLO evicts the least recently active association with nothing in
//! flight (first those never answered a call, but none made in the last 2 s, whose
//! first request may be on its way), whose peer is sent a whole GOAWAY at once, so
//! only peers with work in flight (or new ones) can fill it; and one source IP address
//! holds at most
//! [`UdpConfig::max_peers_per_source`] of it, with the same eviction among its own.
//! A scan of the table keeps its best few candidates for the HELLOs that follow, so
//! that a run of HELLOs at a full table (a flood of them, from a host that receives
//! its RETRYs) does not cost the routing task a scan each.

use std::{
    collections::{HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    frame::{self, FrameKind, GoAwayCode},
    link::{LinkConfig, Listener},
    Error, ErrorKind,
};
use tokio::{net::UdpSocket, sync::mpsc, task::JoinHandle, time::Instant};

use crate::{
    config::{SourceShares, UdpConfig, UdpStats},
    datagram::{self, Control, ControlKind, Datagram},
    engine::Engine,
    link::UdpLink,
    socket::SocketPermit,
    validate::Validator,
};

/// New peers waiting for the server to accept them; past it, their first datagrams
/// are dropped (they send again).
const ACCEPT_QUEUE: usize = 256;

/// One peer's queue holds at most this share of the listener's `max_queued_bytes`, so
/// that a few peers sending large datagrams their server does not read cannot fill it
/// for every other (new clients' HELLOs among them).
const PEER_QUEUED_SHARE: usize = 16;

/// One association in the listener's table.
#[derive(Debug)]
struct PeerEntry {
    /// Tells this association from a later one at the same address.
    generation: u64,
    /// The queue to its link; dropping it ends the link.
    tx: mpsc::Sender<Bytes>,
    /// Bytes in `tx` (the link subtracts what it takes).
    queued: Arc<AtomicUsize>,
    activity: Arc<PeerActivity>,
}

type Peers = Arc<Mutex<Table>>;

/// The listener's table of associations, with what choosing one to evict needs kept
/// beside it: the count per source, and the candidates recent scans found.
#[derive(Debug, Default)]
struct Table {
    map: HashMap<SocketAddr, PeerEntry>,
    /// Associations per source ([`SourceShares::source_of`]), kept as `map` changes.
    per_source: HashMap<IpAddr, usize>,
    /// Per scope (`None` for the whole table, or one source), the best candidates
    /// for eviction its last scan found, so that a run of HELLOs at a full table
    /// scans it once per [`CANDIDATES`] evictions, not once each.
    candidates: HashMap<Option<IpAddr>, Candidates>,
    /// Entries looked at by scans, for the tests.
    #[cfg(test)]
    scanned: usize,
}

/// The most candidates one scan keeps.
const CANDIDATES: usize = 32;

/// How long a scan's candidates are used; and how long a scan that found none makes
/// HELLOs in its scope refused without another one (an association that has finished
/// its calls since waits that long to be chosen).
const CANDIDATES_FOR: Duration = Duration::from_secs(1);
const NO_CANDIDATE_FOR: Duration = Duration::from_millis(50);

/// What one scan found, the best candidate last.
#[derive(Debug)]
struct Candidates {
    at: Instant,
    found: Vec<Candidate>,
    /// The scan found none.
    none: bool,
}

/// An association that could be evicted when a scan looked, and what it looked like
/// then: it is evicted later only if it is the same association, unchanged.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    addr: SocketAddr,
    generation: u64,
    answered: bool,
    last_heard: u64,
}

/// Whether [`Table::make_room`] found room.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    /// Under the bound.
    Free,
    /// This association was removed for the new one.
    Evicted(SocketAddr),
    /// At the bound, and none can go.
    Full,
}

impl Table {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, addr: &SocketAddr) -> Option<&PeerEntry> {
        self.map.get(addr)
    }

    fn insert(&mut self, addr: SocketAddr, entry: PeerEntry) {
        // An address replaced (not reached: an address is routed to its entry, or its
        // entry removed, before a HELLO from it makes one) keeps its count.
        if self.map.insert(addr, entry).is_none() {
            *self
                .per_source
                .entry(SourceShares::source_of(addr.ip()))
                .or_insert(0) += 1;
        }
    }

    fn remove(&mut self, addr: &SocketAddr) -> Option<PeerEntry> {
        let entry = self.map.remove(addr)?;
        let source = SourceShares::source_of(addr.ip());
        if let Some(count) = self.per_source.get_mut(&source) {
            *count -= 1;
            if *count == 0 {
                self.per_source.remove(&source);
            }
        }
        Some(entry)
    }

    /// Associations in `scope`: the whole table, or one source's.
    fn count(&self, scope: Option<IpAddr>) -> usize {
        match scope {
            None => self.map.len(),
            Some(source) => self.per_source.get(&source).copied().unwrap_or(0),
        }
    }

    /// Makes room for one more association in `scope`, of which there may be at most
    /// `max`: when full, removes the association in it with nothing in flight (no call
    /// unanswered, nothing owed either way, no datagram queued for its link) that was
    /// never answered a call and was made more than [`FRESH_MS`] ago, else the least
    /// recently heard one with nothing in flight that was answered one. The choice
    /// comes from the candidates of the scope's last scan while they last (each
    /// checked unchanged since), else from a new scan.
    fn make_room(&mut self, scope: Option<IpAddr>, max: usize, now: Instant) -> Room {
        if self.count(scope) < max.max(1) {
            return Room::Free;
        }
        if let Some(candidates) = self.candidates.get_mut(&scope) {
            let age = now.saturating_duration_since(candidates.at);
            if candidates.none && age < NO_CANDIDATE_FOR {
                return Room::Full;
            }
            if !candidates.none && age < CANDIDATES_FOR {
                while let Some(candidate) = candidates.found.pop() {
                    let unchanged = self.map.get(&candidate.addr).is_some_and(|entry| {
                        let activity = &entry.activity;
                        entry.generation == candidate.generation
                            && activity.answered.load(Ordering::Relaxed) == candidate.answered
                            && activity.last_heard.load(Ordering::Relaxed) == candidate.last_heard
                            && evictable(entry, now)
                    });
                    if unchanged {
                        self.remove(&candidate.addr);
                        return Room::Evicted(candidate.addr);
                    }
                }
            }
        }
        let found = self.scan(scope, now);
        let none = found.is_empty();
        if self.candidates.len() >= 64 {
            self.candidates
                .retain(|_, c| now.saturating_duration_since(c.at) < CANDIDATES_FOR);
        }
        let candidates = self.candidates.entry(scope).or_insert(Candidates {
            at: now,
            found: Vec::new(),
            none,
        });
        candidates.at = now;
        candidates.found = found;
        candidates.none = none;
        match candidates.found.pop() {
            Some(best) => {
                self.remove(&best.addr);
                Room::Evicted(best.addr)
            }
            None => Room::Full,
        }
    }

    /// The best [`CANDIDATES`] for eviction in `scope`, the best last.
    fn scan(&mut self, scope: Option<IpAddr>, now: Instant) -> Vec<Candidate> {
        #[cfg(test)]
        {
            self.scanned += self.map.len();
        }
        let mut found: Vec<Candidate> = self
            .map
            .iter()
            .filter(|(addr, _)| scope.is_none_or(|s| SourceShares::source_of(addr.ip()) == s))
            .filter(|(_, entry)| evictable(entry, now))
            .map(|(addr, entry)| Candidate {
                addr: *addr,
                generation: entry.generation,
                answered: entry.activity.answered.load(Ordering::Relaxed),
                last_heard: entry.activity.last_heard.load(Ordering::Relaxed),
            })
            .collect();
        // Never answered first, then the least recently heard.
        let key = |c: &Candidate| (c.answered, c.last_heard);
        if found.len() > CANDIDATES {
            found.select_nth_unstable_by_key(CANDIDATES, key);
            found.truncate(CANDIDATES);
        }
        found.sort_unstable_by_key(|c| std::cmp::Reverse(key(c)));
        found
    }
}

/// Whether an association could be evicted now: nothing in flight, no datagram queued
/// for its link, and answered a call or made more than [`FRESH_MS`] ago.
fn evictable(entry: &PeerEntry, now: Instant) -> bool {
    let activity = &entry.activity;
    let answered = activity.answered.load(Ordering::Relaxed);
    let age = now
        .saturating_duration_since(activity.epoch)
        .as_millis()
        .saturating_sub(u128::from(activity.created));
    // Queued bytes first (Acquire), then the busy mark (see `PeerQueue::taken`).
    entry.queued.load(Ordering::Acquire) == 0
        && !activity.busy.load(Ordering::Relaxed)
        && (answered || age >= u128::from(FRESH_MS))
}

/// What a link reports for the listener's choice of an association to evict: plain
/// atomics, written by the link's task as it pumps, read only when the table is full.
#[derive(Debug)]
pub(crate) struct PeerActivity {
    epoch: Instant,
    /// Milliseconds since `epoch` when the association was made (its HELLO accepted).
    created: u64,
    /// Milliseconds since `epoch` when the peer was last heard.
    last_heard: AtomicU64,
    /// Work in flight: a call not answered, or transport messages either way.
    busy: AtomicBool,
    /// A call has been answered.
    answered: AtomicBool,
}

impl PeerActivity {
    fn new(epoch: Instant) -> Self {
        let now = Instant::now().saturating_duration_since(epoch).as_millis() as u64;
        PeerActivity {
            epoch,
            created: now,
            last_heard: AtomicU64::new(now),
            busy: AtomicBool::new(false),
            answered: AtomicBool::new(false),
        }
    }

    pub(crate) fn heard(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        self.last_heard.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn set_busy(&self, busy: bool) {
        if self.busy.load(Ordering::Relaxed) != busy {
            self.busy.store(busy, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_answered(&self) {
        if !self.answered.load(Ordering::Relaxed) {
            self.answered.store(true, Ordering::Relaxed);
        }
    }
}

/// The datagrams routed to one peer's link, counted against the listener's
/// `max_queued_bytes` until the link takes them.
pub(crate) struct PeerQueue {
    rx: mpsc::Receiver<Bytes>,
    /// Bytes queued for this peer alone.
    queued: Arc<AtomicUsize>,
    stats: Arc<UdpStats>,
    /// Marked busy as a datagram is taken, before it leaves the count of queued
    /// bytes: the listener, which looks at both, never sees a request in neither
    /// (the link's next report says what it holds).
    activity: Arc<PeerActivity>,
}

impl PeerQueue {
    /// Nothing queued, and the listener still routes to this peer (a forgotten peer's
    /// queue is closed: not idle, its end is to be received).
    pub(crate) fn is_idle(&self) -> bool {
        self.rx.is_empty() && !self.rx.is_closed()
    }

    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(datagram)) = &polled {
            self.activity.set_busy(true);
            self.taken(datagram.len());
        }
        polled
    }
}

impl PeerQueue {
    fn taken(&self, n: usize) {
        // Release: `make_room`, reading this count (Acquire) and then `busy`, sees
        // the mark made before.
        self.queued.fetch_sub(n, Ordering::Release);
        self.stats.queued_bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for PeerQueue {
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(datagram) = self.rx.try_recv() {
            self.taken(datagram.len());
        }
    }
}

/// Removes a peer from the listener's table when its link is dropped.
pub(crate) struct PeerGuard {
    peers: Peers,
    stats: Arc<UdpStats>,
    addr: SocketAddr,
    generation: u64,
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers
            .get(&self.addr)
            .is_some_and(|entry| entry.generation == self.generation)
        {
            peers.remove(&self.addr);
            self.stats.peers_live.store(peers.len(), Ordering::Relaxed);
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

    /// New associations are refused from now on (REFUSE: their clients fail at once,
    /// unprocessed), and those waiting to be accepted are dropped (their clients, not
    /// yet answered ACCEPT, are refused at their next HELLO); the routing task goes on
    /// for the associations already accepted.
    fn stop_accepting(&mut self) {
        self.accepted.close();
        while self.accepted.try_recv().is_ok() {}
    }

    fn links_need_listener(&self) -> bool {
        true
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
    let validator = Arc::new(Validator::new());
    let shares = Arc::new(SourceShares::new(config.max_reassembly_bytes_per_source));
    let epoch = Instant::now();
    let peer_queued_limit = config.max_queued_bytes / PEER_QUEUED_SHARE;
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
                Some(entry) => {
                    // A datagram to an empty queue is always taken: the share may be
                    // smaller than the largest datagram.
                    let queued = entry.queued.load(Ordering::Relaxed);
                    if queued > 0 && queued + n > peer_queued_limit {
                        UdpStats::add(&stats.queue_full, 1);
                        continue;
                    }
                    // Counted before the link can take it (and subtract it).
                    entry.queued.fetch_add(n, Ordering::Relaxed);
                    stats.queued_bytes.fetch_add(n, Ordering::Relaxed);
                    match entry.tx.try_send(datagram) {
                        Ok(()) => continue,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            entry.queued.fetch_sub(n, Ordering::Relaxed);
                            stats.queued_bytes.fetch_sub(n, Ordering::Relaxed);
                            UdpStats::add(&stats.queue_full, 1);
                            continue;
                        }
                        // The link is gone but its guard has not run yet: a new peer.
                        Err(mpsc::error::TrySendError::Closed(datagram)) => {
                            entry.queued.fetch_sub(n, Ordering::Relaxed);
                            stats.queued_bytes.fetch_sub(n, Ordering::Relaxed);
                            table.remove(&from);
                            stats.peers_live.store(table.len(), Ordering::Relaxed);
                            datagram
                        }
                    }
                }
                None => datagram,
            }
        };
        // An address without an association: nothing is kept for it until a HELLO
        // shows it receives there.
        UdpStats::add(&stats.unvalidated, 1);
        let hello = match Datagram::decode(datagram.clone()) {
            Ok(Datagram::Control(c)) if c.kind == ControlKind::HELLO && c.client != 0 => c,
            Ok(Datagram::Whole(_) | Datagram::Fragment(..)) => {
                answer_stateless(&socket, &datagram, from);
                continue;
            }
            Err(_) => {
                UdpStats::add(&stats.malformed, 1);
                continue;
            }
            _ => continue,
        };
        let now = Instant::now();
        if !validator.check(&hello.token, from, hello.client, now) {
            let retry = Control {
                kind: ControlKind::RETRY,
                tag: 0,
                client: hello.client,
                token: validator.token(from, hello.client, now),
            };
            UdpStats::add(&stats.retries_sent, 1);
            let _ = socket.try_send_to(&retry.to_bytes(), from);
            continue;
        }
        if accepted.is_closed()
            || accepted.capacity() == 0
            // One source's share first: a source at it evicts one of its own (which
            // frees a place in the table too) or is refused, never evicting others.
            || !make_room(
                &peers,
                Some(SourceShares::source_of(from.ip())),
                config.peers_per_source(),
                &stats,
                &socket,
            )
            || !make_room(&peers, None, config.max_peers, &stats, &socket)
        {
            UdpStats::add(&stats.peers_refused, 1);
            let refuse = Control::new(ControlKind::REFUSE, 0, hello.client);
            let _ = socket.try_send_to(&refuse.to_bytes(), from);
            continue;
        }
        generation += 1;
        let (tx, rx) = mpsc::channel(config.peer_queue.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let activity = Arc::new(PeerActivity::new(epoch));
        let rx = PeerQueue {
            rx,
            queued: queued.clone(),
            stats: stats.clone(),
            activity: activity.clone(),
        };
        {
            let mut table = peers.lock().unwrap_or_else(|e| e.into_inner());
            table.insert(
                from,
                PeerEntry {
                    generation,
                    tx,
                    queued,
                    activity: activity.clone(),
                },
            );
            stats.peers_live.store(table.len(), Ordering::Relaxed);
        }
        let guard = PeerGuard {
            peers: peers.clone(),
            stats: stats.clone(),
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
        // It answers ACCEPT first.
        let engine = Engine::server(
            config.clone(),
            stats.clone(),
            rpc_core::link::DEFAULT_MAX_FRAME_LEN,
            validator.clone(),
            shares.clone(),
            from,
            &hello,
        );
        let link = UdpLink::peer_of(
            engine,
            socket.clone(),
            own,
            from,
            rx,
            guard,
            activity,
            stats.clone(),
            (config.peer_idle_timeout, config.new_peer_idle_timeout),
        )
        .with_own_socket_renewal(config.clone(), max_peer_sockets);
        tracing::debug!(peer = %from, "new UDP peer");
        if accepted.try_send(link).is_err() {
            UdpStats::add(&stats.peers_refused, 1); // the guard removes the entry
        }
    }
}

/// How long an association that has not been answered a call yet is kept from
/// eviction after its HELLO is accepted: its client's first request may be on its way
/// (the ACCEPT's round trip). Evicted then, the request met an address the server no
/// longer knew, and the call failed as one that may have run, though it never did
/// (from a review: with the table full of idle answered associations, 44% of new
/// clients' first calls, the fresh ones being the first evicted).
const FRESH_MS: u64 = 2_000;

/// What a whole GOAWAY tells an association's peer when it is evicted.
const EVICTED: &str =
    "association evicted for room (the server's table is full): open a new one with HELLO";

/// Makes room for one more association in `scope` (the whole table, or one source's
/// part), of which there may be at most `max` ([`Table::make_room`]), and tells the
/// peer of the association it evicts at once (a whole GOAWAY `NO_ERROR`, as to an
/// address without an association), so that a client with no call in flight opens a
/// new one before its next call instead of losing that call to the eviction. `false`
/// when no association in the scope can go. Runs only for a validated HELLO (which
/// costs its sender a round trip).
fn make_room(
    peers: &Peers,
    scope: Option<IpAddr>,
    max: usize,
    stats: &UdpStats,
    socket: &UdpSocket,
) -> bool {
    let mut table = peers.lock().unwrap_or_else(|e| e.into_inner());
    match table.make_room(scope, max, Instant::now()) {
        Room::Free => true,
        Room::Evicted(addr) => {
            // Dropping its queue ends the link, which drops its socket.
            stats.peers_live.store(table.len(), Ordering::Relaxed);
            drop(table);
            UdpStats::add(&stats.peers_evicted, 1);
            let mut goaway = BytesMut::new();
            frame::encode_goaway(&mut goaway, 0, GoAwayCode::NO_ERROR, EVICTED);
            let _ = socket.try_send_to(&goaway, addr);
            true
        }
        Room::Full => false,
    }
}

/// Whether a datagram is worth routing: a known type and at least a header.
fn plausible(datagram: &[u8]) -> bool {
    match datagram.first() {
        Some(&datagram::WHOLE) => datagram.len() >= frame::HEADER_LEN,
        Some(&datagram::FRAGMENT) => datagram.len() >= datagram::FRAGMENT_HEADER_LEN,
        Some(&datagram::ACK) => datagram.len() >= datagram::ACK_HEADER_LEN,
        Some(&datagram::CONTROL) => datagram.len() == datagram::CONTROL_LEN,
        _ => false,
    }
}

/// What GOAWAY says to a REQUEST or fragment from an address without an association.
const NO_ASSOCIATION: &str = "no UDP association: open one with HELLO";

/// Answers a datagram from an address without an association, keeping nothing: a PING
/// with its PONG (the same bytes, kind changed; none past
/// [`MAX_PING_PAYLOAD`](frame::MAX_PING_PAYLOAD)), a whole REQUEST or a fragment with
/// GOAWAY `NO_ERROR`, `last_id` 0 (the association is unknown: a client whose server
/// forgot it, or restarted, opens a new one). Never larger than the datagram answered,
/// so it amplifies nothing.
fn answer_stateless(socket: &UdpSocket, datagram: &[u8], to: SocketAddr) {
    let kind = datagram.get(1).copied().map(FrameKind);
    let answer: Bytes = match (datagram[0], kind) {
        // A PING past the payload limit gets no PONG, as over an association (where
        // it is a protocol error).
        (datagram::WHOLE, Some(FrameKind::PING))
            if datagram.len().saturating_sub(frame::HEADER_LEN) <= frame::MAX_PING_PAYLOAD =>
        {
            let mut pong = BytesMut::from(datagram);
            pong[1] = FrameKind::PONG.0;
            pong.freeze()
        }
        (datagram::WHOLE, Some(FrameKind::REQUEST)) | (datagram::FRAGMENT, _) => {
            let mut buf = BytesMut::new();
            frame::encode_goaway(&mut buf, 0, GoAwayCode::NO_ERROR, NO_ASSOCIATION);
            if buf.len() > datagram.len() {
                buf.clear();
                frame::encode_goaway(&mut buf, 0, GoAwayCode::NO_ERROR, "");
            }
            buf.freeze()
        }
        _ => return,
    };
    if answer.len() <= datagram.len() {
        let _ = socket.try_send_to(&answer, to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of `n` answered, idle associations from `sources` source addresses,
    /// the one at index `i` last heard at millisecond `i`.
    fn table(n: usize, sources: u8) -> (Table, Instant, Vec<mpsc::Receiver<Bytes>>) {
        let epoch = Instant::now();
        let mut table = Table::default();
        let mut receivers = Vec::new();
        for i in 0..n {
            let source = 1 + (i % usize::from(sources)) as u8;
            let addr = SocketAddr::from(([127, 0, 0, source], 1000 + i as u16));
            let (tx, rx) = mpsc::channel(1);
            receivers.push(rx);
            let activity = PeerActivity::new(epoch);
            activity.set_answered();
            activity.last_heard.store(i as u64, Ordering::Relaxed);
            table.insert(
                addr,
                PeerEntry {
                    generation: i as u64,
                    tx,
                    queued: Arc::default(),
                    activity: Arc::new(activity),
                },
            );
        }
        (table, epoch, receivers)
    }

    fn heard_at(table: &Table, addr: &SocketAddr) -> u64 {
        table.map[addr].activity.last_heard.load(Ordering::Relaxed)
    }

    /// A run of HELLOs at a full table evicts the least recently heard associations
    /// in order, scanning the table once per `CANDIDATES` evictions (each scanned it
    /// whole: ~35 µs per HELLO at 4,096, from a review).
    #[test]
    fn a_run_of_evictions_takes_the_least_recently_heard_and_scans_rarely() {
        let (mut table, epoch, _rx) = table(4096, 4);
        let now = epoch + Duration::from_secs(10);
        let mut evicted = Vec::new();
        for _ in 0..100 {
            // Full at its size (a new association would take the place).
            let max = table.len();
            match table.make_room(None, max, now) {
                Room::Evicted(addr) => evicted.push(addr.port() - 1000),
                other => panic!("expected an eviction, got {other:?}"),
            }
        }
        assert_eq!(evicted, (0..100).collect::<Vec<u16>>());
        assert_eq!(table.len(), 4096 - 100);
        assert_eq!(table.count(Some("127.0.0.1".parse().unwrap())), 1024 - 25);
        // 100 evictions: four scans of the whole table (as it shrinks by 32 between
        // them), not 100.
        assert_eq!(table.scanned, 4096 + 4064 + 4032 + 4000);
        assert_eq!(table.make_room(None, 4096, now), Room::Free);
    }

    /// A candidate heard from, or given work, after the scan that found it is not
    /// evicted: the next unchanged one is.
    #[test]
    fn a_candidate_that_changed_since_the_scan_keeps_its_place() {
        let (mut table, epoch, _rx) = table(64, 1);
        let now = epoch + Duration::from_secs(10);
        let port = |i: u16| SocketAddr::from(([127, 0, 0, 1], 1000 + i));
        assert_eq!(table.make_room(None, 64, now), Room::Evicted(port(0)));
        table.map[&port(1)].activity.heard(now);
        table.map[&port(2)].activity.set_busy(true);
        table.map[&port(3)].queued.store(10, Ordering::Relaxed);
        assert_eq!(table.make_room(None, 63, now), Room::Evicted(port(4)));
        assert!(heard_at(&table, &port(1)) > 4);
        assert_eq!(table.scanned, 64, "the candidates of the first scan served");
    }

    /// One source's bound evicts among its own associations only, and the counts per
    /// source follow every insert and removal.
    #[test]
    fn a_sources_bound_evicts_among_its_own() {
        let (mut table, epoch, _rx) = table(8, 2);
        let now = epoch + Duration::from_secs(10);
        let two: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(table.count(Some(two)), 4);
        // 127.0.0.1 holds the least recently heard (index 0), yet 127.0.0.2's own
        // least recently heard goes.
        let Room::Evicted(addr) = table.make_room(Some(two), 4, now) else {
            panic!("expected an eviction");
        };
        assert_eq!(addr, SocketAddr::from(([127, 0, 0, 2], 1001)));
        assert_eq!(table.count(Some(two)), 3);
        assert_eq!(table.make_room(Some(two), 4, now), Room::Free);
        table.remove(&SocketAddr::from(([127, 0, 0, 2], 1003)));
        assert_eq!(table.count(Some(two)), 2);
        assert_eq!(table.count(None), 6);
    }

    /// When nothing can go, HELLOs are refused without a scan each for a moment, and
    /// scanned again after it; an association made less than `FRESH_MS` ago and never
    /// answered is not a candidate.
    #[test]
    fn a_table_with_nothing_to_evict_is_scanned_again_only_after_a_moment() {
        let (mut table, epoch, _rx) = table(16, 1);
        for entry in table.map.values() {
            entry.activity.set_busy(true);
        }
        let now = epoch + Duration::from_secs(10);
        assert_eq!(table.make_room(None, 16, now), Room::Full);
        assert_eq!(
            table.make_room(None, 16, now + NO_CANDIDATE_FOR / 2),
            Room::Full
        );
        assert_eq!(table.scanned, 16);
        let free = SocketAddr::from(([127, 0, 0, 1], 1005));
        table.map[&free].activity.set_busy(false);
        assert_eq!(
            table.make_room(None, 16, now + NO_CANDIDATE_FOR),
            Room::Evicted(free)
        );
        assert_eq!(table.scanned, 32);
        // A new association, never answered, made now: not evictable for FRESH_MS.
        let (tx, _rx2) = mpsc::channel(1);
        let fresh = SocketAddr::from(([127, 0, 0, 9], 9));
        let later = now + Duration::from_secs(1);
        let activity = PeerActivity::new(epoch);
        activity.last_heard.store(
            later.duration_since(epoch).as_millis() as u64,
            Ordering::Relaxed,
        );
        let created = later.duration_since(epoch).as_millis() as u64;
        table.insert(
            fresh,
            PeerEntry {
                generation: 99,
                tx,
                queued: Arc::default(),
                activity: Arc::new(PeerActivity {
                    created,
                    ..activity
                }),
            },
        );
        assert_eq!(table.make_room(None, 16, later), Room::Full);
        let after = later + Duration::from_millis(FRESH_MS);
        assert_eq!(table.make_room(None, 16, after), Room::Evicted(fresh));
    }
}
