//! The byte stream a gRPC link runs its HTTP/2 connection over: TCP, or TLS over it.

use tokio::io::{AsyncRead, AsyncWrite};

/// A connection's byte stream, boxed: plain TCP or TLS.
pub(crate) type Io = Box<dyn IoStream>;

/// What a link's byte stream is.
pub(crate) trait IoStream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> IoStream for T {}
