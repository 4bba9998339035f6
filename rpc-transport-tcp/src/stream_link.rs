//! [`StreamLink`]: whole frames over a byte stream, each preceded by its length as a
//! 4-byte big-endian integer.
//!
//! Reading checks the announced length against the maximum before it reserves a single
//! byte for the frame, and reserves the whole frame only once its first 64 KiB came; a
//! frame cut short by the end of the stream is an error, never a hang. Writing gathers
//! frames in a buffer and writes them together on flush: small frames are copied into
//! one contiguous buffer (one `write` for many frames), large payloads are queued as
//! their own segments and go out with vectored writes, without being copied.

use std::{
    collections::VecDeque,
    future::Future,
    io::IoSlice,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rpc_core::{link::Link, Error, ErrorKind, Payload};
use tokio::io::{AsyncRead, AsyncWrite};

/// Bytes of the length prefix.
pub const PREFIX_LEN: usize = 4;

/// Read buffer growth step while no frame length is known yet, at first: enough for a
/// few small frames, and what an idle connection keeps after a call
/// (`rpc-bench-idle`).
const INITIAL_READ_CHUNK: usize = 2 * 1024;

/// Bytes of a frame (its length prefix included) that must have arrived before the
/// read buffer is grown to the whole frame its prefix announces; until then, to this.
const TRUSTED_AFTER: usize = 64 * 1024;

/// Largest read buffer growth step: a read that fills the buffer doubles the step up
/// to this, so that a busy connection reads many small frames per `read`.
const MAX_READ_CHUNK: usize = 8 * 1024;

/// Spare room below which a read first grows the buffer by its read chunk. Frames
/// handed to the core keep slices of the buffer, so growing it (to a full chunk of
/// spare room) allocates anew: growing before every read cost two allocations and 8 KiB
/// per small call; with this, one per chunk's worth of frames
/// (`examples/tests/work_per_call.rs`).
const MIN_READ_SPACE: usize = 1024;

/// Past a frame longer than this the link reads into a new buffer, and what may follow
/// such a frame in its buffer and still be copied out of it
/// (`StreamLink::leave_large_buffer`).
const LEFTOVER_COPY: usize = 64 * 1024;

/// How far [`Link::poll_gone`] reads ahead of the frames taken, to see the peer go
/// while the server has stopped reading.
const GONE_READ_AHEAD: usize = 64 * 1024;

/// How often [`Link::poll_gone`] asks the socket whether the peer went, once it has
/// read [`GONE_READ_AHEAD`] ahead and unread data still waits in the kernel: no event
/// wakes the connection for an end behind data it has not read.
const GONE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Payloads at least this long are queued as their own segment instead of copied.
const COPY_THRESHOLD: usize = 8 * 1024;

/// Above this many unsent bytes, `poll_ready` flushes and waits before taking more.
const WRITE_HIGH_WATER: usize = 256 * 1024;

/// Most segments handed to one vectored write (Linux accepts 1024; a few dozen reach
/// the bandwidth already).
const MAX_IOVECS: usize = 64;

/// Reads per poll while a closing link drains what the peer still sends, before it
/// yields (the caller bounds the whole drain in time).
const DRAIN_READS_PER_POLL: usize = 16;

/// A [`Link`] over any byte stream (TCP, Unix sockets, or an in-memory duplex in tests).
pub struct StreamLink<S> {
    io: S,
    peer: String,
    max_frame_len: usize,
    rbuf: BytesMut,
    read_eof: bool,
    /// Small frames, contiguous; written after every segment in `queue`.
    wbuf: BytesMut,
    /// Segments waiting to be written, in order.
    queue: VecDeque<Bytes>,
    /// Bytes in `queue`.
    queued: usize,
    /// What the transport knows of the peer, if more than `peer`.
    info: Option<rpc_core::Peer>,
    /// A whole frame has arrived: from then on a bad length is a broken frame, not a
    /// sign that the peer speaks another protocol.
    framed: bool,
    /// How much the read buffer grows by when it runs low: from [`INITIAL_READ_CHUNK`],
    /// doubled (up to [`MAX_READ_CHUNK`]) by every read that fills it.
    read_chunk: usize,
    /// `poll_close` has shut the sending side: it drains the input from then on.
    write_closed: bool,
    /// Tells whether the peer closed or reset the stream without reading it (set for
    /// the crate's sockets, [`Stream::poll_peer_closed`](crate::Stream)): how
    /// `poll_gone` sees the end behind more than [`GONE_READ_AHEAD`] of unread data.
    close_probe: Option<fn(&S, &mut Context<'_>) -> bool>,
    /// When `poll_gone` asks `close_probe` again, while it cannot read ahead.
    gone_check: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> StreamLink<S> {
    /// Wraps a connected stream. `peer` names the other end in logs and errors;
    /// frames longer than `max_frame_len` are refused.
    pub fn new(io: S, peer: String, max_frame_len: usize) -> Self {
        StreamLink {
            io,
            peer,
            max_frame_len,
            rbuf: BytesMut::new(),
            read_eof: false,
            wbuf: BytesMut::new(),
            queue: VecDeque::new(),
            queued: 0,
            info: None,
            framed: false,
            read_chunk: INITIAL_READ_CHUNK,
            write_closed: false,
            close_probe: None,
            gone_check: None,
        }
    }

    /// Sets how [`Link::poll_gone`] learns, without reading, that the peer closed or
    /// reset the stream once it has read as far ahead as it may.
    pub(crate) fn with_close_probe(mut self, probe: fn(&S, &mut Context<'_>) -> bool) -> Self {
        self.close_probe = Some(probe);
        self
    }

    /// Sets what [`Link::peer_info`] reports: the peer's address, credentials or TLS
    /// identity, as the transport learned them.
    pub fn with_peer_info(mut self, info: rpc_core::Peer) -> Self {
        self.info = Some(info);
        self
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    fn unsent(&self) -> usize {
        self.queued + self.wbuf.len()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> StreamLink<S> {
    /// After a frame larger than 64 KiB ([`LEFTOVER_COPY`]: what a small request may
    /// keep alive, docs/wire.md §8), read into a buffer of the usual size again: what follows the frame (if little) moves to one of its own. Else, once
    /// the large frame was dropped, `BytesMut` reused its allocation for the reads
    /// after it, and every small frame read there shared it: a client alternating
    /// 16 MiB frames the server drops (PONGs) with small requests that wait made each
    /// request hold 16 MiB, where the bounds count 64 KiB (a review's finding). What
    /// follows stays where it is if it is more than [`LEFTOVER_COPY`] (the next large
    /// frame, arriving): the frames in it hold no more than the bytes they came with.
    fn leave_large_buffer(&mut self) {
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
        } else if self.rbuf.len() <= LEFTOVER_COPY {
            let mut fresh = BytesMut::with_capacity(self.read_chunk.max(self.rbuf.len()));
            fresh.extend_from_slice(&self.rbuf);
            self.rbuf = fresh;
        }
    }

    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if self.queue.is_empty() {
                if self.wbuf.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf))
                    .map_err(|e| Error::io(format!("write to {}", self.peer), e))?;
                if n == 0 {
                    return Poll::Ready(Err(self.write_zero()));
                }
                if n == self.wbuf.len() {
                    // All of it (the usual case): the buffer starts over at its
                    // beginning, where `advance` would leave the next `reserve` to
                    // move it back.
                    self.wbuf.clear();
                } else {
                    self.wbuf.advance(n);
                }
                continue;
            }
            if !self.wbuf.is_empty() {
                let tail = self.wbuf.split().freeze();
                self.queued += tail.len();
                self.queue.push_back(tail);
            }
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let mut count = 0;
            for (slot, segment) in slices.iter_mut().zip(self.queue.iter()) {
                *slot = IoSlice::new(segment);
                count += 1;
            }
            let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..count]))
                .map_err(|e| Error::io(format!("write to {}", self.peer), e))?;
            if n == 0 {
                return Poll::Ready(Err(self.write_zero()));
            }
            self.queued -= n;
            let mut left = n;
            while left > 0 {
                let front = self.queue.front_mut().expect("wrote more than was queued");
                if front.len() <= left {
                    left -= front.len();
                    self.queue.pop_front();
                } else {
                    front.advance(left);
                    left = 0;
                }
            }
        }
    }

    /// At the start of a connection, a length that is far too large may be the first
    /// bytes of another protocol: a TLS record (the peer speaks TLS and this side does
    /// not), HTTP/2's client preface (a gRPC client), or HTTP/1. Says so, instead of
    /// reporting a frame too large.
    fn other_protocol(&self) -> Option<Error> {
        if self.framed {
            return None;
        }
        let bytes = &self.rbuf[..];
        // A TLS peer cannot read a GOAWAY: a protocol error, closed without one. An
        // HTTP peer's length is simply too large (GOAWAY `FRAME_TOO_LARGE`, as for any
        // such length), with a reason that says what it is.
        // A TLS record starts with its content type (20-23) and version major 3.
        let (kind, hint) = if matches!(bytes[0], 20..=23) && bytes[1] == 3 {
            (
                ErrorKind::Protocol,
                "speaks TLS on a plain-text connection (a TLS record arrived where a frame \
                 was expected): use tls:// (or tls+unix://) on both sides, or on neither",
            )
        } else if bytes.starts_with(b"PRI ") {
            (
                ErrorKind::FrameTooLarge,
                "speaks HTTP/2 (HTTP/2's preface arrived where a frame was expected: a \
                 gRPC client?): gRPC's own wire is served on grpc:// (or grpcs://) listeners",
            )
        } else if [
            &b"GET "[..],
            b"POST",
            b"PUT ",
            b"HEAD",
            b"DELE",
            b"OPTI",
            b"PATC",
            b"CONN",
            b"HTTP",
        ]
        .iter()
        .any(|start| bytes.starts_with(start))
        {
            (
                ErrorKind::FrameTooLarge,
                "speaks HTTP/1 (an HTTP request or answer arrived where a frame was \
                 expected): this is the framework's own wire, not HTTP",
            )
        } else {
            return None;
        };
        Some(Error::new(kind, format!("{} {hint}", self.peer)).from_another_protocol())
    }

    /// A first frame of `len` bytes that is the soft RDMA provider's HELLO (type 1, magic
    /// `RPCSOFT1`: docs/rdma.md): the peer is an `rdma://` endpoint, whose HELLO read
    /// as a frame of an undefined kind (from a review). Says so.
    fn soft_rdma_hello(&self, len: usize) -> Option<Error> {
        // (Within the frame: `len` bytes are there, behind the prefix.)
        let hello = len >= 9
            && self.rbuf.len() >= PREFIX_LEN + 9
            && self.rbuf[PREFIX_LEN] == 1
            && &self.rbuf[PREFIX_LEN + 1..PREFIX_LEN + 9] == b"RPCSOFT1";
        hello.then(|| {
            Error::new(
                ErrorKind::Protocol,
                format!(
                    "{} speaks the soft RDMA provider's protocol (its HELLO arrived where a \
                     frame was expected): use rdma:// (or rdma+unix://) on both sides",
                    self.peer
                ),
            )
            .from_another_protocol()
        })
    }

    /// At the end of a connection that never carried a whole frame: an HTTP/2 server
    /// (gRPC) answers a client of this wire with its SETTINGS frame and closes, which
    /// reads as a small length and then the end mid-frame. Says so.
    fn other_protocol_at_close(&self) -> Option<Error> {
        let bytes = &self.rbuf[..];
        // HTTP/2 frame header: length (3), type 4 = SETTINGS, flags, stream 0 (4).
        let settings = !self.framed
            && bytes.len() >= 9
            && bytes[3] == 4
            && bytes[4] & !1 == 0
            && bytes[5..9] == [0; 4];
        settings.then(|| {
            Error::new(
                ErrorKind::Closed,
                format!(
                    "{} speaks HTTP/2 (it sent an HTTP/2 SETTINGS frame and closed: a gRPC \
                     server?): call it with a grpc:// (or grpcs://) URI",
                    self.peer
                ),
            )
            .from_another_protocol()
        })
    }

    fn write_zero(&self) -> Error {
        Error::new(
            ErrorKind::Closed,
            format!("connection to {} refused further writes", self.peer),
        )
    }
}

impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> Link for StreamLink<S> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        loop {
            if self.rbuf.len() >= PREFIX_LEN {
                let len =
                    u32::from_be_bytes([self.rbuf[0], self.rbuf[1], self.rbuf[2], self.rbuf[3]])
                        as usize;
                if len > self.max_frame_len {
                    if let Some(err) = self.other_protocol() {
                        return Poll::Ready(Some(Err(err)));
                    }
                    return Poll::Ready(Some(Err(Error::new(
                        ErrorKind::FrameTooLarge,
                        format!(
                            "frame of {len} bytes from {} exceeds the maximum frame length of \
                             {} bytes (raise it with max_frame_len on the receiving side)",
                            self.peer, self.max_frame_len
                        ),
                    ))));
                }
                let total = PREFIX_LEN + len;
                if self.rbuf.len() >= total {
                    if !self.framed {
                        if let Some(err) = self.soft_rdma_hello(len) {
                            return Poll::Ready(Some(Err(err)));
                        }
                    }
                    self.framed = true;
                    self.rbuf.advance(PREFIX_LEN);
                    let frame = self.rbuf.split_to(len).freeze();
                    if len > LEFTOVER_COPY {
                        self.leave_large_buffer();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                // Reserve the whole frame at once, once its first `TRUSTED_AFTER` bytes
                // have come: growing with what arrives would copy the buffer at every
                // step (measured: 16 MiB echoes at half the speed), and reserving it on
                // the length alone let four bytes commit `max_frame_len` of memory (a
                // peer sending length prefixes on thousands of connections committed
                // tens of GB of address space, which the allocator kept after they
                // closed). One copy of at most `TRUSTED_AFTER` bytes per large frame.
                let target = if self.rbuf.len() >= TRUSTED_AFTER {
                    total
                } else {
                    total.min(TRUSTED_AFTER)
                };
                if self.rbuf.capacity() < target {
                    // Exactly that: `reserve` grows a `Vec`-backed buffer to twice its
                    // capacity when that is more, so a 65.5 KB frame kept a 128 KiB
                    // allocation alive, and the bounds, which count the frames'
                    // bytes, held twice what they said (a review: 1 GiB of stream
                    // messages took 1.97 GB). The buffer holds part of this frame
                    // only (its end is not here yet): nothing after it is copied.
                    let mut exact = BytesMut::with_capacity(target);
                    exact.extend_from_slice(&self.rbuf);
                    self.rbuf = exact;
                }
            } else if self.rbuf.capacity() - self.rbuf.len() < MIN_READ_SPACE {
                self.rbuf.reserve(self.read_chunk);
            }
            if self.read_eof {
                if self.rbuf.is_empty() {
                    return Poll::Ready(None);
                }
                if let Some(err) = self.other_protocol_at_close() {
                    return Poll::Ready(Some(Err(err)));
                }
                return Poll::Ready(Some(Err(Error::new(
                    ErrorKind::Closed,
                    format!(
                        "{} closed the connection in the middle of a frame ({} bytes of it received)",
                        self.peer,
                        self.rbuf.len()
                    ),
                ))));
            }
            let room = self.rbuf.capacity() - self.rbuf.len();
            match ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.io),
                cx,
                &mut self.rbuf
            )) {
                Ok(0) => self.read_eof = true,
                Ok(n) => {
                    if n == room && self.read_chunk < MAX_READ_CHUNK {
                        // More was waiting, likely: read more at a time from now on.
                        self.read_chunk *= 2;
                    }
                }
                Err(e) => return Poll::Ready(Some(Err(read_error(&self.peer, e)))),
            }
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.unsent() >= WRITE_HIGH_WATER {
            // Make room; `Pending` here means the peer is not reading fast enough.
            if let Poll::Ready(Err(err)) = self.poll_write_out(cx) {
                return Poll::Ready(Err(err));
            }
            if self.unsent() >= WRITE_HIGH_WATER {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        let len = header.len() + payload.len();
        let prefix = u32::try_from(len).map_err(|_| {
            Error::new(
                ErrorKind::FrameTooLarge,
                format!("frame of {len} bytes does not fit the 4-byte length prefix"),
            )
        })?;
        self.wbuf.reserve(PREFIX_LEN + header.len());
        self.wbuf.put_u32(prefix);
        self.wbuf.put_slice(header);
        for segment in payload.segments() {
            if segment.len() >= COPY_THRESHOLD {
                // Large segments go out as they are, with vectored writes.
                if !self.wbuf.is_empty() {
                    let head = self.wbuf.split().freeze();
                    self.queued += head.len();
                    self.queue.push_back(head);
                }
                self.queued += segment.len();
                self.queue.push_back(segment.clone());
            } else {
                self.wbuf.put_slice(segment);
            }
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        ready!(self.poll_write_out(cx))?;
        Pin::new(&mut self.io)
            .poll_flush(cx)
            .map_err(|e| Error::io(format!("flush to {}", self.peer), e))
    }

    /// Writes what is queued, shuts the sending side (FIN; over TLS, `close_notify`
    /// first), then reads and drops what the peer still sends until it closes too: a
    /// socket closed with unread input is reset, and the reset destroys whatever the
    /// kernel has not delivered yet, the GOAWAY of an error close included
    /// (`docs/wire.md` §6.7). Ready at the peer's end of stream or a read error; the
    /// caller bounds the wait (the server's closing grace).
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if !self.write_closed {
            ready!(self.poll_write_out(cx))?;
            ready!(Pin::new(&mut self.io).poll_shutdown(cx))
                .map_err(|e| Error::io(format!("shut down connection to {}", self.peer), e))?;
            self.write_closed = true;
        }
        for _ in 0..DRAIN_READS_PER_POLL {
            if self.read_eof {
                return Poll::Ready(Ok(()));
            }
            self.rbuf.clear();
            self.rbuf.reserve(MAX_READ_CHUNK);
            match ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.io),
                cx,
                &mut self.rbuf
            )) {
                Ok(0) | Err(_) => self.read_eof = true,
                Ok(_) => {}
            }
        }
        if self.read_eof {
            return Poll::Ready(Ok(()));
        }
        // A peer that keeps sending: let other tasks run, then drain on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    /// Reads ahead, into the buffer frames are taken from, at most 64 KiB
    /// (`GONE_READ_AHEAD`), to see the peer's end of stream or a reset. Past that, a
    /// link over the crate's sockets asks the socket whether the peer closed or reset
    /// the connection (at once, and then once a second while data waits unread); a
    /// link over another stream sees an end behind more than 64 KiB only once reading
    /// resumes.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        while !self.read_eof && self.rbuf.len() < GONE_READ_AHEAD {
            if self.rbuf.capacity() - self.rbuf.len() < MIN_READ_SPACE {
                self.rbuf.reserve(MIN_READ_SPACE);
            }
            match ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.io),
                cx,
                &mut self.rbuf
            )) {
                Ok(0) => self.read_eof = true,
                Ok(_) => {}
                Err(e) => return Poll::Ready(read_error(&self.peer, e)),
            }
        }
        if self.read_eof {
            return Poll::Ready(Error::new(
                ErrorKind::Closed,
                format!("{} closed the connection", self.peer),
            ));
        }
        // Read as far ahead as it may, with more waiting: ask the socket, now and
        // once a second, as nothing wakes this task for an end behind unread data.
        let Some(probe) = self.close_probe else {
            return Poll::Pending;
        };
        loop {
            if probe(&self.io, cx) {
                return Poll::Ready(Error::new(
                    ErrorKind::Closed,
                    format!(
                        "{} closed or reset the connection (seen with frames unread)",
                        self.peer
                    ),
                ));
            }
            let check = self
                .gone_check
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(GONE_CHECK_EVERY)));
            ready!(check.as_mut().poll(cx));
            check
                .as_mut()
                .reset(tokio::time::Instant::now() + GONE_CHECK_EVERY);
        }
    }

    /// Bytes of the next frame that have arrived (its length, or some of its body).
    fn receiving(&self) -> u64 {
        self.rbuf.len() as u64
    }

    /// Frames queued and not yet written to the socket.
    fn unsent(&self) -> u64 {
        (self.queued + self.wbuf.len()) as u64
    }

    /// A byte stream: the peer may close its sending side and read on.
    fn half_closes(&self) -> bool {
        true
    }

    /// A write that succeeds never reads (TLS's key updates included: they are
    /// answered, not read, when writing). A TLS write that fails for a peer gone may
    /// read the peer's alert, but the link then fails. A stream `S` whose writes take
    /// in what arrives without waking its reader would break this: none of this
    /// crate's does.
    fn reads_while_writing(&self) -> bool {
        false
    }

    fn peer_info(&self) -> rpc_core::Peer {
        self.info
            .clone()
            .unwrap_or_else(|| rpc_core::Peer::new(self.peer.clone()))
    }
}

/// A read's error as the link reports it. Bytes of the peer's that broke TLS (a record
/// that fails authentication, too long or malformed) are a protocol error, which the
/// server counts and logs as every peer that breaks its transport's protocol (from a
/// review: a tampered record left a line at DEBUG only).
fn read_error(peer: &str, err: std::io::Error) -> Error {
    #[cfg(feature = "tls")]
    return crate::tls::read_error(format!("read from {peer}"), err);
    #[cfg(not(feature = "tls"))]
    Error::io(format!("read from {peer}"), err)
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use rpc_core::link::Link;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A frame of `len` bytes, with its length prefix.
    fn framed(len: usize) -> Vec<u8> {
        let mut frame = (len as u32).to_be_bytes().to_vec();
        frame.resize(PREFIX_LEN + len, 7);
        frame
    }

    /// A small frame read after a large one (dropped by then) goes into a buffer of the
    /// usual size, not into the large one's allocation, which the small frame would
    /// keep alive for as long as the core held it.
    #[tokio::test]
    async fn a_small_frame_after_a_large_one_does_not_share_its_buffer() {
        let (mut peer, io) = tokio::io::duplex(4 << 20);
        let mut link = StreamLink::new(io, "test".into(), 16 << 20);
        peer.write_all(&framed(1 << 20)).await.unwrap();
        let large = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
        assert_eq!(large.len(), 1 << 20);
        drop(large);
        peer.write_all(&framed(40)).await.unwrap();
        let small = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
        assert_eq!(small.len(), 40);
        let room = link.rbuf.capacity();
        assert!(
            room < 64 << 10,
            "the small frame was read into {room} bytes of room"
        );
    }

    /// A length prefix alone reserves no more than `TRUSTED_AFTER` bytes: thousands of
    /// connections each sending a 16 MiB prefix and a byte committed tens of GB (a
    /// hostile-peer review). Once that much of the frame came, the rest is reserved at
    /// once, and the frame arrives whole.
    #[tokio::test]
    async fn a_length_prefix_alone_does_not_reserve_the_whole_frame() {
        const LEN: usize = 16 << 20;
        let (mut peer, io) = tokio::io::duplex(1 << 20);
        let mut link = StreamLink::new(io, "test".into(), LEN);
        let frame = framed(LEN);
        peer.write_all(&frame[..PREFIX_LEN + 1]).await.unwrap();
        let pending = poll_fn(|cx| Poll::Ready(link.poll_recv(cx).is_pending())).await;
        assert!(pending);
        let room = link.rbuf.capacity();
        assert!(room <= 2 * TRUSTED_AFTER, "a prefix reserved {room} bytes");
        let reader = tokio::spawn(async move { poll_fn(|cx| link.poll_recv(cx)).await });
        peer.write_all(&frame[PREFIX_LEN + 1..]).await.unwrap();
        let got = reader.await.unwrap().unwrap().unwrap();
        assert_eq!(got.len(), LEN);
        assert!(got.iter().all(|&b| b == 7));
    }

    /// A frame a little over `TRUSTED_AFTER` is read into an allocation of its own
    /// size, not twice it: the bounds count the frames' bytes, and `reserve`'s doubling
    /// made 1 GiB of 65.5 KB stream messages hold 1.97 GB (a review).
    #[tokio::test]
    async fn a_large_frame_is_read_into_room_of_its_own_size() {
        const LEN: usize = TRUSTED_AFTER + 1_500;
        let (mut peer, io) = tokio::io::duplex(1 << 20);
        let mut link = StreamLink::new(io, "test".into(), 16 << 20);
        let frame = framed(LEN);
        // All but the last bytes: the whole frame is reserved, not yet read.
        peer.write_all(&frame[..frame.len() - 10]).await.unwrap();
        while poll_fn(|cx| Poll::Ready(link.poll_recv(cx).is_pending())).await {
            if link.rbuf.capacity() >= PREFIX_LEN + LEN {
                break;
            }
            tokio::task::yield_now().await;
        }
        let room = link.rbuf.capacity();
        assert!(
            (PREFIX_LEN + LEN..PREFIX_LEN + LEN + 1024).contains(&room),
            "a frame of {LEN} bytes was read into {room} bytes of room"
        );
        peer.write_all(&frame[frame.len() - 10..]).await.unwrap();
        let got = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
        assert_eq!(got.len(), LEN);
    }
}
