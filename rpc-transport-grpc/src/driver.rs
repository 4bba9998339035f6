//! The byte stream a gRPC link runs its HTTP/2 connection over (TCP, or TLS over it),
//! and what both links do with it: read into their input buffer, write what their
//! connection queued.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    task::{Context, Poll},
};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::http2::{conn::Connection, frame::HEADER_LEN};

/// A connection's byte stream, boxed: plain TCP or TLS.
pub(crate) type Io = Box<dyn IoStream>;

/// What a link's byte stream is.
pub(crate) trait IoStream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> IoStream for T {}

/// Bytes read ahead at least; a frame longer than this gets room for all of it once
/// this much of it came (so that a length alone does not make the link reserve the
/// frame's whole size).
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// Room to read into after what `input` holds: [`READ_CHUNK`], or the rest of a long
/// frame once that much of it came.
pub(crate) fn wanted(input: &BytesMut) -> usize {
    if input.len() >= HEADER_LEN {
        let len = usize::from(input[0]) << 16 | usize::from(input[1]) << 8 | usize::from(input[2]);
        let whole = HEADER_LEN + len;
        if input.len() >= READ_CHUNK && whole > input.len() {
            return whole - input.len();
        }
    }
    READ_CHUNK
}

/// Writes what `conn` queued, as far as `io` takes it (registering the task for when
/// it takes more), then flushes: a TLS stream writes its records on flush, and one
/// that could not write them all is flushed again at the next call (`unflushed`).
pub(crate) fn write_out(
    io: &mut Io,
    conn: &mut Connection,
    unflushed: &mut bool,
    cx: &mut Context<'_>,
) -> io::Result<()> {
    let mut wrote = false;
    while !conn.out().is_empty() {
        let mut slices = [IoSlice::new(&[]); 64];
        let n = conn.out().slices(&mut slices);
        match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n]) {
            Poll::Pending => break,
            Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(written)) => {
                conn.out().advance(written);
                wrote = true;
            }
            Poll::Ready(Err(err)) => return Err(err),
        }
    }
    if wrote || *unflushed {
        match Pin::new(&mut *io).poll_flush(cx) {
            Poll::Ready(Ok(())) => *unflushed = false,
            Poll::Ready(Err(err)) => return Err(err),
            Poll::Pending => *unflushed = true,
        }
    }
    Ok(())
}
