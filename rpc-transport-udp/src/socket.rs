//! Sockets: binding with the configured buffer sizes, the server's per-peer connected
//! sockets, and [`Connected`], which moves many datagrams per system call
//! (`recvmmsg`, `sendmmsg`).

use std::{
    cell::RefCell,
    io,
    net::SocketAddr,
    os::fd::AsRawFd,
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use rpc_core::Error;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::{
    io::{unix::AsyncFd, Interest},
    net::UdpSocket,
};

use crate::config::UdpConfig;

/// Datagrams moved per system call at most.
pub(crate) const BATCH: usize = 32;
/// The largest UDP payload, and so the size of each receive buffer.
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
    Connected::new(socket).map_err(|e| Error::io("register a UDP socket", e))
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
    Connected::new(finish(socket, config)?)
}

/// Takes what reached a new per-peer socket before it was connected, with each
/// datagram's source: datagrams of other peers among them belong to the listener.
pub(crate) fn drain_strays(socket: &Connected) -> Vec<(Bytes, SocketAddr)> {
    let mut strays = Vec::new();
    let mut buf = vec![0u8; MAX_PAYLOAD];
    while let Ok((n, from)) = socket.fd.get_ref().recv_from(&mut buf) {
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

/// A connected socket that moves up to [`BATCH`] datagrams per system call.
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
}

impl Connected {
    fn new(socket: std::net::UdpSocket) -> io::Result<Connected> {
        Ok(Connected {
            fd: register(socket, Interest::READABLE)?,
            writable: None,
        })
    }

    /// The peer this socket is connected to.
    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.fd.get_ref().peer_addr()
    }

    /// Receives up to [`BATCH`] datagrams, handing each to `each`: how many were
    /// received and how many of those were dropped as not from `only_from` (see
    /// [`recv_batch`]). `Pending` when none is there.
    pub(crate) fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        only_from: Option<SocketAddr>,
        each: &mut dyn FnMut(Bytes),
    ) -> Poll<io::Result<(usize, usize)>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            match recv_batch(self.fd.get_ref(), only_from, &mut *each) {
                Ok((received, strays)) => {
                    // Fewer than asked for: the queue is empty now. Saying so spares
                    // the `recvmmsg` that would only find that out; a datagram that
                    // arrives meanwhile raises a new readiness event.
                    if received < BATCH {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok((received, strays)));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }

    /// Sends the first of `datagrams`, or as many as one system call takes: how many
    /// went.
    pub(crate) fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        datagrams: &[Bytes],
    ) -> Poll<io::Result<usize>> {
        loop {
            let Some(writable) = &self.writable else {
                match send_batch(self.fd.get_ref(), datagrams) {
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                        let second = self.fd.get_ref().try_clone()?;
                        self.writable = Some(register(second, Interest::WRITABLE)?);
                        continue;
                    }
                    other => return Poll::Ready(other),
                }
            };
            let mut guard = ready!(writable.poll_write_ready(cx))?;
            match send_batch(self.fd.get_ref(), datagrams) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
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

/// The system calls' argument arrays and receive buffers, made once per thread and
/// shared by every link polled on it (a received datagram is copied out at its own
/// size), so an idle link holds no receive buffer and a call fills in only what
/// changes. Boxed: the headers point into the arrays beside them.
struct Batch {
    buffers: Vec<u8>,
    recv_iovecs: [libc::iovec; BATCH],
    recv_headers: [libc::mmsghdr; BATCH],
    sources: [libc::sockaddr_storage; BATCH],
    send_iovecs: [libc::iovec; BATCH],
    send_headers: [libc::mmsghdr; BATCH],
}

impl Batch {
    fn new() -> Box<Batch> {
        // SAFETY: all-zero bytes are a valid `iovec`, `mmsghdr` and `sockaddr_storage`
        // (null pointers, zero lengths, family AF_UNSPEC).
        #[allow(unsafe_code)]
        let mut batch = Box::new(unsafe {
            Batch {
                buffers: vec![0; BATCH * MAX_PAYLOAD],
                recv_iovecs: std::mem::zeroed(),
                recv_headers: std::mem::zeroed(),
                sources: std::mem::zeroed(),
                send_iovecs: std::mem::zeroed(),
                send_headers: std::mem::zeroed(),
            }
        });
        let batch_ref = &mut *batch;
        for ((iovec, chunk), header) in batch_ref
            .recv_iovecs
            .iter_mut()
            .zip(batch_ref.buffers.chunks_exact_mut(MAX_PAYLOAD))
            .zip(batch_ref.recv_headers.iter_mut())
        {
            iovec.iov_base = chunk.as_mut_ptr().cast();
            iovec.iov_len = chunk.len();
            header.msg_hdr.msg_iov = iovec;
            header.msg_hdr.msg_iovlen = 1;
        }
        for (iovec, header) in batch_ref
            .send_iovecs
            .iter_mut()
            .zip(batch_ref.send_headers.iter_mut())
        {
            header.msg_hdr.msg_iov = iovec;
            header.msg_hdr.msg_iovlen = 1;
        }
        batch
    }
}

thread_local! {
    static BATCH_STATE: RefCell<Box<Batch>> = RefCell::new(Batch::new());
}

/// Receives up to [`BATCH`] datagrams from a connected socket in one `recvmmsg`,
/// handing each to `each`; returns how many were received. `WouldBlock` when none is
/// there.
///
/// With `only_from`, datagrams from any other source are dropped (and counted in the
/// second number returned): a server's per-peer socket may hold a few that reached it
/// in the instant between its `bind` and `connect`.
fn recv_batch(
    socket: &std::net::UdpSocket,
    only_from: Option<SocketAddr>,
    mut each: impl FnMut(Bytes),
) -> io::Result<(usize, usize)> {
    BATCH_STATE.with(|batch| {
        let mut batch = batch.borrow_mut();
        let batch = &mut **batch;
        for (header, source) in batch.recv_headers.iter_mut().zip(batch.sources.iter_mut()) {
            // The kernel rewrites the name's length on every call.
            if only_from.is_some() {
                header.msg_hdr.msg_name = std::ptr::from_mut(source).cast();
                header.msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            } else {
                header.msg_hdr.msg_name = std::ptr::null_mut();
                header.msg_hdr.msg_namelen = 0;
            }
        }
        // SAFETY: `recv_headers` holds BATCH headers (set up by `Batch::new`), each
        // pointing at its own iovec covering a distinct MAX_PAYLOAD chunk of `buffers`,
        // and either no name or its own `sockaddr_storage` with that size; all of them
        // live in the boxed `Batch`, which is borrowed for the call.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                batch.recv_headers.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let received = usize::try_from(rc).map_err(|_| io::Error::last_os_error())?;
        let mut strays = 0;
        for ((header, chunk), source) in batch
            .recv_headers
            .iter()
            .zip(batch.buffers.chunks_exact(MAX_PAYLOAD))
            .zip(batch.sources.iter())
            .take(received)
        {
            if let Some(peer) = only_from {
                if !same_address(source, peer) {
                    strays += 1;
                    continue;
                }
            }
            let len = (header.msg_len as usize).min(MAX_PAYLOAD);
            // A copy of exactly the datagram's size.
            each(Bytes::copy_from_slice(&chunk[..len]));
        }
        Ok((received, strays))
    })
}

/// Whether a source address the kernel filled in is `peer` (address and port).
fn same_address(source: &libc::sockaddr_storage, peer: SocketAddr) -> bool {
    match (libc::c_int::from(source.ss_family), peer) {
        (libc::AF_INET, SocketAddr::V4(peer)) => {
            // SAFETY: the family says the storage holds a `sockaddr_in`, which it is
            // large and aligned enough for.
            #[allow(unsafe_code)]
            let v4 = unsafe { &*std::ptr::from_ref(source).cast::<libc::sockaddr_in>() };
            u16::from_be(v4.sin_port) == peer.port()
                && u32::from_be(v4.sin_addr.s_addr) == u32::from(*peer.ip())
        }
        (libc::AF_INET6, SocketAddr::V6(peer)) => {
            // SAFETY: as above, for `sockaddr_in6`.
            #[allow(unsafe_code)]
            let v6 = unsafe { &*std::ptr::from_ref(source).cast::<libc::sockaddr_in6>() };
            u16::from_be(v6.sin6_port) == peer.port() && v6.sin6_addr.s6_addr == peer.ip().octets()
        }
        _ => false,
    }
}

/// Sends up to [`BATCH`] of `datagrams` on a connected socket in one `sendmmsg`;
/// returns how many the kernel took (at least one), or the error of the first.
fn send_batch(socket: &std::net::UdpSocket, datagrams: &[Bytes]) -> io::Result<usize> {
    BATCH_STATE.with(|batch| {
        let mut batch = batch.borrow_mut();
        let batch = &mut **batch;
        let count = datagrams.len().min(BATCH);
        for (iovec, datagram) in batch.send_iovecs.iter_mut().zip(datagrams) {
            // The kernel only reads through this pointer (sendmmsg).
            iovec.iov_base = datagram.as_ptr().cast_mut().cast();
            iovec.iov_len = datagram.len();
        }
        // SAFETY: the first `count` headers (set up by `Batch::new`) each point at
        // their own iovec, now covering one of `datagrams`, which outlive the call; the
        // socket is connected, so no destination is given (null msg_name).
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                batch.send_headers.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(rc).map_err(|_| io::Error::last_os_error())
    })
}
