//! Sockets: binding with the configured buffer sizes, the server's per-peer connected
//! sockets, and [`Connected`], which moves many datagrams per system call (see
//! `batch`).

use std::{
    io,
    net::SocketAddr,
    sync::{atomic::Ordering, Arc},
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use rpc_core::Error;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::{
    io::{unix::AsyncFd, Interest},
    net::UdpSocket,
};

use crate::{
    batch::{self, Received},
    config::{UdpConfig, UdpStats},
};

/// The largest UDP payload.
const MAX_PAYLOAD: usize = 65_536;

/// A non-blocking UDP socket bound to `addr`, buffers set as `config` asks.
fn bind_std(addr: SocketAddr, config: &UdpConfig) -> Result<std::net::UdpSocket, Error> {
    let socket =
        std::net::UdpSocket::bind(addr).map_err(|e| Error::io(format!("bind udp://{addr}"), e))?;
    finish(socket.into(), config).map_err(|e| Error::io("set up a UDP socket", e))
}

/// A client's socket: bound to an ephemeral port, connected to `peer`.
pub(crate) fn connect(peer: SocketAddr, config: &UdpConfig) -> Result<Connected, Error> {
    let local: SocketAddr = if peer.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let socket = bind_std(local, config)?;
    socket
        .connect(peer)
        .map_err(|e| Error::io(format!("connect to udp://{peer}"), e))?;
    Connected::new(socket, config).map_err(|e| Error::io("register a UDP socket", e))
}

/// A listener's socket: bound like any other (so a port in use is `EADDRINUSE`), then
/// marked `SO_REUSEPORT` so that [`connected_to`] can open per-peer sockets on the
/// same port. The kernel lets only sockets of the same user share a port this way.
pub(crate) fn bind_listener(addr: SocketAddr, config: &UdpConfig) -> Result<UdpSocket, Error> {
    let socket = UdpSocket::from_std(bind_std(addr, config)?)
        .map_err(|e| Error::io("register a UDP socket", e))?;
    if config.peer_sockets {
        if let Err(err) = SockRef::from(&socket).set_reuse_port(true) {
            tracing::debug!(error = %err, "SO_REUSEPORT refused: peers share the socket");
        }
    }
    Ok(socket)
}

/// A socket on the listener's address connected to `peer`: the kernel hands it
/// that peer's datagrams directly (a connected socket wins the lookup over the
/// listener's), so the server reads them without the listener's routing task.
///
/// Between `bind` and `connect` the new socket belongs to the listener's port group and
/// may receive datagrams of other peers; the caller must take them with
/// [`drain_strays`] and route them.
pub(crate) fn connected_to(
    listener: &UdpSocket,
    peer: SocketAddr,
    config: &UdpConfig,
    permit: SocketPermit,
) -> io::Result<Connected> {
    let local = listener.local_addr()?;
    let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
    if local.is_ipv6() {
        // As the listener: a dual-stack listener's peers may be IPv4-mapped addresses.
        socket.set_only_v6(SockRef::from(listener).only_v6()?)?;
    }
    socket.set_reuse_port(true)?;
    socket.bind(&local.into())?;
    socket.connect(&peer.into())?;
    let mut connected = Connected::new(finish(socket, config)?, config)?;
    connected._permit = Some(permit);
    Ok(connected)
}

/// One of a listener's per-peer sockets, counted in
/// [`UdpStats::peer_sockets_live`] while it lives.
#[derive(Debug)]
pub(crate) struct SocketPermit(Arc<UdpStats>);

impl SocketPermit {
    /// A permit if fewer than `max` per-peer sockets live.
    pub(crate) fn take(stats: &Arc<UdpStats>, max: usize) -> Option<SocketPermit> {
        stats
            .peer_sockets_live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                (live < max).then_some(live + 1)
            })
            .ok()
            .map(|_| SocketPermit(stats.clone()))
    }
}

impl Drop for SocketPermit {
    fn drop(&mut self) {
        self.0.peer_sockets_live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Half the process's open-file limit: the most descriptors a listener's per-peer
/// sockets may take.
pub(crate) fn descriptor_budget() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a live `rlimit` for the call to fill in.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return usize::MAX;
    }
    usize::try_from(limit.rlim_cur / 2).unwrap_or(usize::MAX)
}

/// Takes what reached a new per-peer socket before it was connected, with each
/// datagram's source: datagrams of other peers among them belong to the listener.
/// What arrived before the connection fits in the socket's receive buffer, so the
/// drain stops past that much (in bytes, or in datagrams at the least a datagram
/// costs the kernel): a peer sending without pause kept it reading, and growing the
/// list, for as long as it sent. What it leaves is the connected peer's own.
pub(crate) fn drain_strays(socket: &Connected) -> Vec<(Bytes, SocketAddr)> {
    /// The least buffer space the kernel counts for a datagram, however short (its
    /// `sk_buff` and its data's allocation; several hundred bytes in fact).
    const LEAST_DATAGRAM_COST: usize = 256;
    let fd = socket.fd.get_ref();
    let room = SockRef::from(fd)
        .recv_buffer_size()
        .unwrap_or(crate::DEFAULT_SOCKET_BUFFER)
        .max(MAX_PAYLOAD);
    let mut strays = Vec::new();
    let (mut bytes, mut buf) = (0, vec![0u8; MAX_PAYLOAD]);
    while bytes <= room && strays.len() <= room / LEAST_DATAGRAM_COST {
        let Ok((n, from)) = fd.recv_from(&mut buf) else {
            break;
        };
        bytes += n;
        strays.push((Bytes::copy_from_slice(&buf[..n]), from));
    }
    strays
}

fn finish(socket: Socket, config: &UdpConfig) -> io::Result<std::net::UdpSocket> {
    socket.set_nonblocking(true)?;
    // The kernel caps the sizes (`net.core.rmem_max`, `wmem_max`); failing costs
    // throughput, not correctness, so errors are only logged.
    if let Err(err) = socket.set_recv_buffer_size(config.recv_buffer) {
        tracing::debug!(size = config.recv_buffer, error = %err, "SO_RCVBUF not set");
    }
    if let Err(err) = socket.set_send_buffer_size(config.send_buffer) {
        tracing::debug!(size = config.send_buffer, error = %err, "SO_SNDBUF not set");
    }
    Ok(socket.into())
}

/// A connected socket that moves many datagrams per system call (`batch`), with
/// segmentation offload where the kernel offers it and [`UdpConfig::offload`] allows.
///
/// It is registered with the runtime for reading only: a UDP socket becomes writable
/// again after every datagram sent (the kernel frees its buffer), and a write interest
/// would wake the runtime once per datagram for nothing. Only when the kernel refuses a
/// send (a full socket buffer) is a second descriptor of the socket registered for
/// writing, until a send succeeds.
#[derive(Debug)]
pub(crate) struct Connected {
    fd: AsyncFd<std::net::UdpSocket>,
    /// Registered while a send waits for room.
    writable: Option<AsyncFd<std::net::UdpSocket>>,
    /// Runs of datagrams of one size go as one segmented send (`UDP_SEGMENT`); turned
    /// off for good if the kernel refuses one.
    segment: bool,
    /// A listener's per-peer socket: its place in the count.
    _permit: Option<SocketPermit>,
}

impl Connected {
    fn new(socket: std::net::UdpSocket, config: &UdpConfig) -> io::Result<Connected> {
        if config.offload {
            batch::enable_gro(&socket);
        }
        Ok(Connected {
            fd: register(socket, Interest::READABLE)?,
            writable: None,
            segment: config.offload,
            _permit: None,
        })
    }

    /// The peer this socket is connected to.
    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.fd.get_ref().peer_addr()
    }

    /// Sends one datagram now if the socket takes it (no waiting).
    pub(crate) fn try_send(&self, datagram: &[u8]) -> io::Result<usize> {
        self.fd.get_ref().send(datagram)
    }

    /// Receives what is queued, handing each datagram to `each`, dropping (and
    /// counting) those not from `only_from`. `Pending` when nothing is there.
    pub(crate) fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        only_from: Option<SocketAddr>,
        each: &mut dyn FnMut(Bytes),
    ) -> Poll<io::Result<Received>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            match batch::recv(self.fd.get_ref(), only_from, &mut *each) {
                Ok(received) => {
                    // Fewer than asked for: the queue is empty now. Saying so spares
                    // the `recvmmsg` that would only find that out; a datagram that
                    // arrives meanwhile raises a new readiness event.
                    if received.calls < batch::RECV_CALLS {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(received));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }

    /// Whether the socket has nothing to read, by its readiness (no system call; the
    /// readiness stays as it is). `true` registers the task for when it has.
    pub(crate) fn nothing_to_read(&self, cx: &mut Context<'_>) -> bool {
        self.fd.poll_read_ready(cx).is_pending()
    }

    /// Sends the first of `datagrams`, or as many as one system call takes: how many
    /// went.
    pub(crate) fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        datagrams: &[Bytes],
    ) -> Poll<io::Result<usize>> {
        loop {
            let result = match &self.writable {
                None => batch::send(self.fd.get_ref(), datagrams, self.segment),
                Some(writable) => {
                    let mut guard = ready!(writable.poll_write_ready(cx))?;
                    let result = batch::send(self.fd.get_ref(), datagrams, self.segment);
                    if matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                        guard.clear_ready();
                    }
                    result
                }
            };
            match result {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    if self.writable.is_none() {
                        let second = self.fd.get_ref().try_clone()?;
                        self.writable = Some(register(second, Interest::WRITABLE)?);
                    }
                }
                // No segmentation offload on this path (EIO: the device cannot
                // checksum; EINVAL, or EMSGSIZE on newer kernels: a segment over the
                // path's MTU, which the kernel would fragment if it went alone):
                // datagram by datagram from now on. (Without this, each segmented
                // send failed and its first datagram was counted lost.)
                Err(err)
                    if self.segment
                        && matches!(
                            err.raw_os_error(),
                            Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)
                        ) =>
                {
                    tracing::debug!(error = %err, "UDP segmentation offload off");
                    self.segment = false;
                }
                other => {
                    self.writable = None;
                    return Poll::Ready(other);
                }
            }
        }
    }
}

/// Registers `socket` with the runtime for `interest`.
fn register(
    socket: std::net::UdpSocket,
    interest: Interest,
) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    // SAFETY: the socket owns its descriptor, which stays open and the same until the
    // `AsyncFd` (which owns the socket and never hands out `&mut` to it) is dropped.
    #[allow(unsafe_code)]
    let registered = unsafe { AsyncFd::register_with_interest(socket, interest) };
    registered.map_err(|e| e.into_parts().1)
}
