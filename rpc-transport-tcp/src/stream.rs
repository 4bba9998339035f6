//! [`Stream`]: a TCP or Unix stream behind one type.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
