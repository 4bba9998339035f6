//! [`UdpConfig`]: every limit of the UDP transport, and [`UdpStats`], what it did.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Mutex,
    },
    time::Duration,
};

/// Default largest datagram sent: 1200 bytes of UDP payload, which crosses almost any
/// internet path without IP fragmentation (QUIC's choice; on a narrower path the
/// kernel fragments it). Raise it on loopback or jumbo-frame networks (at most
/// 65,507).
pub const DEFAULT_MAX_DATAGRAM: usize = 1200;

/// Default socket buffer size asked of the kernel, each way. The kernel caps it at
/// `net.core.rmem_max` / `wmem_max`.
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;

/// Settings of UDP links, listeners and connectors. Every field has a default; the
/// limits on what a peer can make us hold are `max_message_len`,
/// `max_reassembly_bytes`, `max_reassembly_bytes_per_source`,
/// `max_total_reassembly_bytes`, `reassembly_timeout`, `max_peers` and `peer_queue`.
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// Largest datagram (UDP payload) this side sends. A frame that fits is sent whole
    /// and best effort; a larger one is fragmented and delivered reliably. At least
    /// 128, at most 65,507. Default: [`DEFAULT_MAX_DATAGRAM`].
    pub max_datagram: usize,
    /// Largest message (frame) accepted from the peer; a fragment claiming more is
    /// refused with an acknowledgement flagged `REFUSED`, before anything is
    /// allocated. `None` (the default) uses the core's `max_frame_len`.
    pub max_message_len: Option<usize>,
    /// Bytes of fragments in flight (sent, not acknowledged) per association: the
    /// sender's window. Keep it below the receiver's socket buffer. Default: 64 KiB.
    pub window: usize,
    /// Reassembly memory one association may hold: incomplete messages, reassembled
    /// frames the connection has not read yet, and whole-datagram frames not read yet
    /// past the first 64 KiB of them. A fragment that would start a message past it is
    /// dropped (the sender repairs later), and so is such a whole frame (as if lost).
    /// Default: 32 MiB.
    pub max_reassembly_bytes: usize,
    /// Reassembly memory all associations of one listener (or connector) may hold
    /// together. Messages may claim seven eighths of it; the last eighth is kept for
    /// whole frames not yet read, so that peers claiming messages they never finish
    /// cannot stop other peers' small calls. Default: 256 MiB.
    pub max_total_reassembly_bytes: usize,
    /// Listener: reassembly memory the associations of one source may hold together
    /// (an IPv4 address, or an IPv6 /64), so that one host opening many associations
    /// (each from its own port) cannot take the whole of `max_total_reassembly_bytes`
    /// from the others; its
    /// fragments past it are dropped, as at the other budgets, and repaired once it
    /// has room. Default: 64 MiB (a quarter of the total: two associations' worth).
    pub max_reassembly_bytes_per_source: usize,
    /// An incomplete message that gets no new fragment for this long is dropped and
    /// its memory released. Default: 10 s.
    pub reassembly_timeout: Duration,
    /// A sender whose fragments get no acknowledgement for this long gives up: the link
    /// fails with an error (calls fail with `UNAVAILABLE`). Default: 10 s.
    pub peer_timeout: Duration,
    /// Longest wait before acknowledging fragments that arrived in order. Default:
    /// 1 ms.
    pub ack_delay: Duration,
    /// `SO_RCVBUF` asked for (the kernel caps it). Default: [`DEFAULT_SOCKET_BUFFER`].
    pub recv_buffer: usize,
    /// `SO_SNDBUF` asked for (the kernel caps it). Default: [`DEFAULT_SOCKET_BUFFER`].
    pub send_buffer: usize,
    /// Listener: most associations at once. A validated HELLO from a new address
    /// while the table is full evicts the least recently active association with
    /// nothing in flight (first those never answered a call, but not one made in the
    /// last 2 s: its first request may be on its way), and tells its peer with a whole
    /// GOAWAY; only when every one has work in flight (or is that new) is the HELLO
    /// answered REFUSE. So this bounds the *active* peers.
    /// Default: 4096.
    pub max_peers: usize,
    /// Listener: most associations from one source at once: an IPv4 address, or an
    /// IPv6 /64 (its ports together). A validated HELLO from a source at its bound
    /// evicts that source's least recently active association with nothing in flight,
    /// else is answered REFUSE, so that one host cannot fill the table and lock every
    /// other out (a hostile peer's round did, with 4,096 sleeping calls from one
    /// address). Clients behind one NAT share it. 0: a quarter of `max_peers` (at
    /// least 1). Default: 0 (1024 with the default `max_peers`).
    pub max_peers_per_source: usize,
    /// Listener: datagrams queued for one peer's connection before more are dropped.
    /// Default: 1024.
    pub peer_queue: usize,
    /// Listener: bytes of datagrams queued for all peers together before more are
    /// dropped; one peer's queue holds at most a sixteenth of it. Default: 64 MiB.
    pub max_queued_bytes: usize,
    /// Listener: a peer that sends nothing for this long (and has nothing in flight at
    /// the transport) is forgotten; its connection ends. Keep it above the server's
    /// idle timeout (300 s by default), which closes idle connections first, with a
    /// GOAWAY, and never while a call is running. Default: 600 s.
    pub peer_idle_timeout: Duration,
    /// Listener: an association that has not yet been answered a single call and has
    /// nothing in flight is forgotten after this long without a datagram: a client
    /// that opened one and went away (or never meant to call) does not keep a slot
    /// and a socket for `peer_idle_timeout`. Default: 10 s.
    pub new_peer_idle_timeout: Duration,
    /// Listener: a peer's own socket ([`peer_sockets`](Self::peer_sockets)) is closed
    /// after this long without a datagram while nothing is in flight; the association
    /// stays, its datagrams arriving through the listener's socket, and the peer gets
    /// a socket of its own again when it next has a call in flight. So a client that
    /// went away without a CLOSE (a killed process) holds no descriptor for long,
    /// whatever `peer_idle_timeout` keeps of its association. Default: 5 s.
    pub peer_socket_idle_timeout: Duration,
    /// Listener: give each peer its own socket, bound to the listener's port
    /// (`SO_REUSEPORT`) and connected to the peer, so the kernel hands the peer's
    /// datagrams straight to its connection (no routing task in between, many per
    /// system call) and reports ICMP errors for it. Costs one file descriptor per peer;
    /// where a socket cannot be made (descriptor limit, a kernel without
    /// `SO_REUSEPORT`), that peer shares the listener's socket. Default: `true`.
    pub peer_sockets: bool,
    /// Listener: most peers with their own socket at once; past it, new peers share
    /// the listener's socket. Further capped at half the process's open-file limit
    /// (`RLIMIT_NOFILE`) when the listener starts, so that peers cannot take the
    /// descriptors the rest of the server needs (accepting TCP connections, files).
    /// Default: 4096.
    pub max_peer_sockets: usize,
    /// Let the kernel cut runs of same-size datagrams apart (`UDP_SEGMENT`, one pass
    /// through the network stack for up to 64 datagrams) and hand over a sender's
    /// datagrams coalesced (`UDP_GRO`), on Linux. The datagrams on the wire are the
    /// same either way; where a path refuses segmentation, the link falls back to one
    /// datagram at a time on its own. Default: `true`.
    pub offload: bool,
}

impl UdpConfig {
    /// [`max_peers_per_source`](Self::max_peers_per_source) as it applies: 0 is a
    /// quarter of `max_peers`.
    pub fn peers_per_source(&self) -> usize {
        match self.max_peers_per_source {
            0 => (self.max_peers / 4).max(1),
            n => n,
        }
    }
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            max_datagram: DEFAULT_MAX_DATAGRAM,
            max_message_len: None,
            window: 64 << 10,
            max_reassembly_bytes: 32 << 20,
            max_total_reassembly_bytes: 256 << 20,
            max_reassembly_bytes_per_source: 64 << 20,
            reassembly_timeout: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(10),
            ack_delay: Duration::from_millis(1),
            recv_buffer: DEFAULT_SOCKET_BUFFER,
            send_buffer: DEFAULT_SOCKET_BUFFER,
            max_peers: 4096,
            max_peers_per_source: 0,
            peer_queue: 1024,
            max_queued_bytes: 64 << 20,
            peer_idle_timeout: Duration::from_secs(600),
            new_peer_idle_timeout: Duration::from_secs(10),
            peer_socket_idle_timeout: Duration::from_secs(5),
            peer_sockets: true,
            max_peer_sockets: 4096,
            offload: true,
        }
    }
}

impl UdpConfig {
    pub(crate) fn max_datagram(&self) -> usize {
        self.max_datagram.clamp(128, 65_507)
    }
}

/// What the links of one listener or connector did. Counters only grow; the
/// `reassembly_*` fields are a gauge and its peak.
#[derive(Debug, Default)]
pub struct UdpStats {
    /// Datagrams sent.
    pub datagrams_sent: AtomicU64,
    /// Bytes of the datagrams sent.
    pub bytes_sent: AtomicU64,
    /// Datagrams received (before any check) by a connector's association, or by a
    /// listener's associations, and those a listener dropped as malformed. A
    /// listener's datagrams from addresses without an association are counted in
    /// [`unvalidated`](Self::unvalidated) instead, and those dropped for full queues
    /// in [`queue_full`](Self::queue_full) only.
    pub datagrams_received: AtomicU64,
    /// Fragments sent again (lost, or probing for a lost acknowledgement).
    pub fragments_resent: AtomicU64,
    /// Bytes of the fragments sent again, headers included.
    pub bytes_resent: AtomicU64,
    /// Acknowledgements sent.
    pub acks_sent: AtomicU64,
    /// Datagrams dropped as malformed: unknown type, bad lengths, contradictory
    /// fragment fields.
    pub malformed: AtomicU64,
    /// Fragments that were already received (the network or a retransmission copied
    /// them).
    pub duplicate_fragments: AtomicU64,
    /// Messages refused because they claim a length over the limit, or more than the
    /// reassembly budgets could hold.
    pub refused: AtomicU64,
    /// Fragments dropped because reassembly memory was at its limit, and whole frames
    /// dropped because those waiting for the core were past their allowance and the
    /// budgets had no room.
    pub over_budget: AtomicU64,
    /// Incomplete messages dropped at the reassembly timeout.
    pub expired: AtomicU64,
    /// Datagrams dropped because a peer's queue was full, or frames because the
    /// connection was not reading.
    pub queue_full: AtomicU64,
    /// HELLOs from new peers refused because `max_peers` associations all had work in
    /// flight (or the server was not accepting).
    pub peers_refused: AtomicU64,
    /// Listener: associations forgotten to make room for a new validated peer (least
    /// recently active first, never one with work in flight).
    pub peers_evicted: AtomicU64,
    /// Listener: associations in its table now (gauge; at most
    /// [`UdpConfig::max_peers`]).
    pub peers_live: AtomicUsize,
    /// Listener: associations the client ended with CLOSE.
    pub peers_closed: AtomicU64,
    /// Listener: datagrams from addresses without an association (answered without
    /// state, or dropped).
    pub unvalidated: AtomicU64,
    /// Listener: RETRYs sent (HELLOs without a valid token).
    pub retries_sent: AtomicU64,
    /// Associations ended because the peer's association tag changed: it started over
    /// (a restarted process on the same address), so message numbers no longer line
    /// up and a new association is needed.
    pub peer_restarts: AtomicU64,
    /// Listener: peers given their own connected socket
    /// ([`UdpConfig::peer_sockets`]).
    pub peer_sockets: AtomicU64,
    /// Listener: peers' own sockets closed while the peer was idle
    /// ([`UdpConfig::peer_socket_idle_timeout`]).
    pub peer_sockets_released: AtomicU64,
    /// Listener: peers with their own socket now (gauge; at most
    /// [`UdpConfig::max_peer_sockets`]).
    pub peer_sockets_live: AtomicUsize,
    /// Listener: datagrams of other peers found on a peer's own socket, which they
    /// reached in the instant between its `bind` and `connect`: routed on when found as
    /// the socket is made, dropped (their senders repeat them) after.
    pub strays: AtomicU64,
    /// Listener: bytes of datagrams queued for peers' connections now.
    pub queued_bytes: AtomicUsize,
    /// Bytes held now for incomplete messages, reassembled frames not yet read, and
    /// whole frames not yet read past an association's first 64 KiB of them.
    pub reassembly_bytes: AtomicUsize,
    /// Most bytes ever held at once for incomplete messages and frames not yet read.
    pub reassembly_peak: AtomicUsize,
    /// The smoothed round-trip time, in microseconds, of the association that last
    /// measured one (gauge; 0 before the first measurement): on a client's link its
    /// own estimate, on a listener the latest of its peers'.
    pub srtt_us: AtomicU64,
}

impl UdpStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reserves `n` bytes of reassembly memory if that stays within `limit`.
    pub(crate) fn reserve(&self, n: usize, limit: usize) -> bool {
        let mut current = self.reassembly_bytes.load(Ordering::Relaxed);
        loop {
            let Some(next) = current.checked_add(n).filter(|&next| next <= limit) else {
                return false;
            };
            match self.reassembly_bytes.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.reassembly_peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Gives back reassembly memory taken with [`reserve`](Self::reserve).
    pub(crate) fn release(&self, n: usize) {
        self.reassembly_bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A listener's reassembly memory per source IP address
/// ([`UdpConfig::max_reassembly_bytes_per_source`]): an entry per address holding
/// any, removed when it holds none again, so at most one per association.
#[derive(Debug)]
pub(crate) struct SourceShares {
    limit: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl SourceShares {
    /// The most one source may hold.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    pub(crate) fn new(limit: usize) -> SourceShares {
        SourceShares {
            limit,
            held: Mutex::default(),
        }
    }

    /// The source whose share a peer at `ip` draws on: its IPv4 address (an
    /// IPv4-mapped IPv6 one counts as IPv4), or the /64 an IPv6 address is in, since a
    /// host normally holds a whole /64 and could otherwise open associations from as
    /// many addresses as it likes.
    pub(crate) fn source_of(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    IpAddr::V6(std::net::Ipv6Addr::from(prefix))
                }
            },
        }
    }

    /// Reserves `n` bytes for `source` if its share stays within the limit.
    pub(crate) fn reserve(&self, source: IpAddr, n: usize) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let entry = held.entry(source).or_insert(0);
        match entry.checked_add(n).filter(|&next| next <= self.limit) {
            Some(next) => {
                *entry = next;
                true
            }
            None => {
                if *entry == 0 {
                    held.remove(&source);
                }
                false
            }
        }
    }

    /// Gives back `n` bytes reserved for `source`.
    pub(crate) fn release(&self, source: IpAddr, n: usize) {
        if n == 0 {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = held.get_mut(&source) {
            *entry = entry.saturating_sub(n);
            if *entry == 0 {
                held.remove(&source);
            }
        }
    }

    /// Bytes held for `source` now.
    #[cfg(test)]
    pub(crate) fn held(&self, source: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&source).copied().unwrap_or(0)
    }
}
