//! Sockets: binding with the configured buffer sizes, the server's per-peer connected
//! sockets, and moving many datagrams per system call (`recvmmsg`, `sendmmsg`).

use std::{
    cell::RefCell,
    io,
    net::SocketAddr,
    os::fd::{AsFd, AsRawFd},
};

use bytes::Bytes;
use rpc_core::Error;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::{io::Interest, net::UdpSocket};

use crate::config::UdpConfig;

/// Datagrams moved per system call at most.
pub(crate) const BATCH: usize = 32;
/// The largest UDP payload, and so the size of each receive buffer.
const MAX_PAYLOAD: usize = 65_536;

/// A non-blocking UDP socket bound to `addr`, buffers set as `config` asks.
pub(crate) fn bind(addr: SocketAddr, config: &UdpConfig) -> Result<UdpSocket, Error> {
    let socket =
        std::net::UdpSocket::bind(addr).map_err(|e| Error::io(format!("bind udp://{addr}"), e))?;
    finish(socket.into(), config).map_err(|e| Error::io("set up a UDP socket", e))
}

/// A listener's socket: bound like any other (so a port in use is `EADDRINUSE`), then
/// marked `SO_REUSEPORT` so that [`connected_to`] can open per-peer sockets on the
/// same port. The kernel lets only sockets of the same user share a port this way.
pub(crate) fn bind_listener(addr: SocketAddr, config: &UdpConfig) -> Result<UdpSocket, Error> {
    let socket = bind(addr, config)?;
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
) -> io::Result<UdpSocket> {
    let local = listener.local_addr()?;
    let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
    if local.is_ipv6() {
        // As the listener: a dual-stack listener's peers may be IPv4-mapped addresses.
        socket.set_only_v6(SockRef::from(listener).only_v6()?)?;
    }
    socket.set_reuse_port(true)?;
    socket.bind(&local.into())?;
    socket.connect(&peer.into())?;
    let socket: std::net::UdpSocket = socket.into();
    finish(socket.into(), config)
}

/// Takes what reached a new per-peer socket before it was connected, with each
/// datagram's source: datagrams of other peers among them belong to the listener.
pub(crate) fn drain_strays(socket: &UdpSocket) -> Vec<(Bytes, SocketAddr)> {
    let mut strays = Vec::new();
    let mut buf = [0u8; MAX_PAYLOAD];
    while let Ok((n, from)) = socket.try_recv_from(&mut buf) {
        strays.push((Bytes::copy_from_slice(&buf[..n]), from));
    }
    strays
}

fn finish(socket: Socket, config: &UdpConfig) -> io::Result<UdpSocket> {
    socket.set_nonblocking(true)?;
    // The kernel caps the sizes (`net.core.rmem_max`, `wmem_max`); failing costs
    // throughput, not correctness, so errors are only logged.
    if let Err(err) = socket.set_recv_buffer_size(config.recv_buffer) {
        tracing::debug!(size = config.recv_buffer, error = %err, "SO_RCVBUF not set");
    }
    if let Err(err) = socket.set_send_buffer_size(config.send_buffer) {
        tracing::debug!(size = config.send_buffer, error = %err, "SO_SNDBUF not set");
    }
    UdpSocket::from_std(socket.into())
}

thread_local! {
    /// Receive buffers for [`recv_batch`]: one per datagram of a batch, shared by every
    /// link polled on this thread (each datagram is copied out at its own size), so an
    /// idle link holds no receive buffer at all.
    static RECV_BUFFERS: RefCell<Vec<u8>> = RefCell::new(vec![0; BATCH * MAX_PAYLOAD]);
}

/// Receives up to [`BATCH`] datagrams from a connected socket in one `recvmmsg`,
/// handing each to `each`; returns how many were received. `WouldBlock` when none is
/// there (and the socket's readiness is cleared, so `poll_recv_ready` waits again).
///
/// With `only_from`, datagrams from any other source are dropped (and counted in the
/// second number returned): a server's per-peer socket may hold a few that reached it
/// in the instant between its `bind` and `connect`.
pub(crate) fn recv_batch(
    socket: &UdpSocket,
    only_from: Option<SocketAddr>,
    mut each: impl FnMut(Bytes),
) -> io::Result<(usize, usize)> {
    RECV_BUFFERS.with(|buffers| {
        let mut buffers = buffers.borrow_mut();
        // SAFETY: all-zero bytes are a valid `iovec`, `mmsghdr` and `sockaddr_storage`
        // (null pointers, zero lengths, family AF_UNSPEC).
        #[allow(unsafe_code)]
        let (mut iovecs, mut messages, mut sources): (
            [libc::iovec; BATCH],
            [libc::mmsghdr; BATCH],
            [libc::sockaddr_storage; BATCH],
        ) = unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
        for (((iovec, chunk), message), source) in iovecs
            .iter_mut()
            .zip(buffers.chunks_exact_mut(MAX_PAYLOAD))
            .zip(messages.iter_mut())
            .zip(sources.iter_mut())
        {
            iovec.iov_base = chunk.as_mut_ptr().cast();
            iovec.iov_len = chunk.len();
            message.msg_hdr.msg_iov = iovec;
            message.msg_hdr.msg_iovlen = 1;
            if only_from.is_some() {
                message.msg_hdr.msg_name = std::ptr::from_mut(source).cast();
                message.msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            }
        }
        let fd = socket.as_fd().as_raw_fd();
        let received = socket.try_io(Interest::READABLE, || {
            // SAFETY: `messages` holds BATCH headers, each pointing at one live iovec of
            // `iovecs` covering a distinct MAX_PAYLOAD chunk of `buffers`, and either no
            // name or one live `sockaddr_storage` of `sources` with its size; all of
            // them outlive the call.
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::recvmmsg(
                    fd,
                    messages.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            usize::try_from(rc).map_err(|_| io::Error::last_os_error())
        })?;
        let mut strays = 0;
        for ((message, chunk), source) in messages
            .iter()
            .zip(buffers.chunks_exact(MAX_PAYLOAD))
            .zip(sources.iter())
            .take(received)
        {
            if let Some(peer) = only_from {
                if !same_address(source, peer) {
                    strays += 1;
                    continue;
                }
            }
            let len = (message.msg_len as usize).min(MAX_PAYLOAD);
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
pub(crate) fn send_batch(socket: &UdpSocket, datagrams: &[Bytes]) -> io::Result<usize> {
    let count = datagrams.len().min(BATCH);
    // SAFETY: all-zero bytes are a valid `iovec` and `mmsghdr`.
    #[allow(unsafe_code)]
    let (mut iovecs, mut messages): ([libc::iovec; BATCH], [libc::mmsghdr; BATCH]) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    for (i, (iovec, datagram)) in iovecs.iter_mut().zip(datagrams).enumerate() {
        // The kernel only reads through this pointer (sendmmsg).
        iovec.iov_base = datagram.as_ptr().cast_mut().cast();
        iovec.iov_len = datagram.len();
        messages[i].msg_hdr.msg_iov = iovec;
        messages[i].msg_hdr.msg_iovlen = 1;
    }
    let fd = socket.as_fd().as_raw_fd();
    socket.try_io(Interest::WRITABLE, || {
        // SAFETY: the first `count` headers each point at one live iovec, each covering
        // a live datagram; everything outlives the call; the socket is connected, so
        // no destination address is given (null msg_name).
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sendmmsg(
                fd,
                messages.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(rc).map_err(|_| io::Error::last_os_error())
    })
}
