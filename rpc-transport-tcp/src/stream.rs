//! [`Stream`]: a TCP or Unix stream behind one type, and [`TcpKeepalive`], the
//! kernel's keepalive probes on it.

use std::{
    future::Future,
    io,
    pin::{pin, Pin},
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use crate::Address;

/// A connected TCP or Unix-domain stream.
#[derive(Debug)]
pub enum Stream {
    /// TCP.
    Tcp(tokio::net::TcpStream),
    /// Unix domain socket.
    Unix(tokio::net::UnixStream),
}

impl Stream {
    /// Connects to `address`; over TCP with `TCP_NODELAY` (the link batches frames
    /// itself, so Nagle's delay would only add latency). Also the socket under other
    /// protocols that run over these streams, such as the soft RDMA provider's.
    pub async fn connect(address: &Address) -> io::Result<Stream> {
        Ok(match address {
            Address::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr.as_str()).await?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
            Address::Unix(path) => Stream::Unix(tokio::net::UnixStream::connect(path).await?),
        })
    }
}

impl Stream {
    /// Whether the peer closed its side or reset the connection, as the socket's
    /// readiness tells it, without reading: what arrived before the end stays to be
    /// read. When the socket has nothing to read, `cx` is woken by what comes next
    /// (data, the end or a reset); when unread data waits, nothing wakes it for an end
    /// behind that data, so the caller looks again later
    /// ([`StreamLink`](crate::StreamLink)'s `poll_gone`, once a second).
    pub(crate) fn poll_peer_closed(&self, cx: &mut Context<'_>) -> bool {
        let ready = match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
        };
        match ready {
            Poll::Pending => false,
            Poll::Ready(Err(_)) => true,
            Poll::Ready(Ok(())) => {
                // Readable: ask which readiness, once, without waiting. The end or a
                // reset (epoll's `RDHUP` or `HUP`) is kept by tokio once seen, whether
                // or not a task waited for it.
                let mut look = Context::from_waker(Waker::noop());
                let flags = match self {
                    Stream::Tcp(s) => pin!(s.ready(Interest::READABLE)).poll(&mut look),
                    Stream::Unix(s) => pin!(s.ready(Interest::READABLE)).poll(&mut look),
                };
                match flags {
                    Poll::Ready(Ok(ready)) => ready.is_read_closed() || ready.is_error(),
                    Poll::Ready(Err(_)) => true,
                    Poll::Pending => false,
                }
            }
        }
    }
}

/// TCP keepalive (`SO_KEEPALIVE`): the kernel probes a connection that has been idle
/// for `idle`, every `interval`, and resets it after `retries` unanswered probes, so a
/// peer host that vanished is noticed even on a connection with no calls (where the
/// core's keepalive PINGs do not run unless asked to). It cannot see a peer process
/// that hangs while its kernel answers; the core's keepalive can. Off by default; set
/// it with [`StreamConnector::tcp_keepalive`](crate::StreamConnector::tcp_keepalive)
/// and [`StreamListener::tcp_keepalive`](crate::StreamListener::tcp_keepalive). Unix
/// sockets ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`). Default: 60 s.
    pub idle: Duration,
    /// Time between probes (`TCP_KEEPINTVL`). Default: 10 s.
    pub interval: Duration,
    /// Unanswered probes before the connection is reset (`TCP_KEEPCNT`). Default: 3.
    pub retries: u32,
}

impl Default for TcpKeepalive {
    /// 60 s idle, then a probe every 10 s, 3 of them: a dead peer is found about 90 s
    /// after the connection went quiet (Linux's own default is two hours).
    fn default() -> Self {
        TcpKeepalive {
            idle: Duration::from_secs(60),
            interval: Duration::from_secs(10),
            retries: 3,
        }
    }
}

impl Stream {
    /// Turns on TCP keepalive with `keepalive`'s timing; a no-op on a Unix socket.
    pub fn set_tcp_keepalive(&self, keepalive: &TcpKeepalive) -> io::Result<()> {
        let Stream::Tcp(stream) = self else {
            return Ok(());
        };
        let params = socket2::TcpKeepalive::new()
            .with_time(keepalive.idle)
            .with_interval(keepalive.interval);
        #[cfg(not(any(target_os = "openbsd", target_os = "redox", target_os = "solaris")))]
        let params = params.with_retries(keepalive.retries);
        socket2::SockRef::from(stream).set_tcp_keepalive(&params)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
