//! Socket setup: binding with the configured buffer sizes.

use std::net::SocketAddr;

use rpc_core::Error;
use tokio::net::UdpSocket;

use crate::config::UdpConfig;

/// A non-blocking UDP socket bound to `addr`, buffers set as `config` asks.
pub(crate) fn bind(addr: SocketAddr, config: &UdpConfig) -> Result<UdpSocket, Error> {
    let socket =
        std::net::UdpSocket::bind(addr).map_err(|e| Error::io(format!("bind udp://{addr}"), e))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| Error::io("set a UDP socket non-blocking", e))?;
    set_buffer(&socket, libc::SO_RCVBUF, config.recv_buffer);
    set_buffer(&socket, libc::SO_SNDBUF, config.send_buffer);
    UdpSocket::from_std(socket).map_err(|e| Error::io("register a UDP socket", e))
}

/// Asks for a socket buffer size. The kernel caps it (`net.core.rmem_max`,
/// `wmem_max`); failing costs throughput, not correctness, so errors are only logged.
fn set_buffer(socket: &std::net::UdpSocket, option: libc::c_int, size: usize) {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is open for the lifetime of `socket`, and the option value
    // is a live `c_int` whose size is passed along with it.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            option,
            size,
            error = %std::io::Error::last_os_error(),
            "socket buffer size not set"
        );
    }
}
