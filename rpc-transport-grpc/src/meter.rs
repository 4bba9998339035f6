//! How much of each stream's DATA h2 has written to the connection, so that a stream
//! hands h2 few small frames at a time.
//!
//! h2 bounds what it buffers for a stream in payload bytes (`max_send_buffer_size`,
//! 400 KiB), not in frames. A peer that opens a huge window and never reads its
//! socket had a server hand h2 one frame per small message, every one kept: with
//! messages of a few bytes on 256 streams, 0.4–1.5 GB for one connection. The
//! connection's byte stream is wrapped in [`Metered`], which reads the frame headers
//! h2 writes and credits each DATA frame's payload to its stream's [`StreamMeter`];
//! the sending half ([`Outbound`](crate::flow::Outbound)) compares that with what it
//! handed h2, and once [`MAX_FRAMES_IN_H2`] of its frames are unwritten it keeps
//! further small messages in its own queue, where they are copied together into one
//! frame when h2 has written the earlier ones (see `Outbound::poll_send`).
//!
//! A stream is counted from the first time it hands h2 data before its end (a
//! stream's messages, or an answer over 16 KiB); a small unary answer, handed to h2
//! whole with its trailers, never is. While no stream of the connection is
//! registered the writer only steps over frame headers; while one is, it looks up
//! each DATA frame's stream (a lock and a map lookup per frame).
//!
//! The same wrapper steps over the frame headers it reads, for one bound h2 does not
//! keep: a header block (HEADERS and its CONTINUATION frames) must be whole within
//! the handshake timeout of its first frame, or the connection fails. h2 holds an
//! unfinished block (up to 5 frames of the largest size, 1.3 MiB by default) until
//! it ends or the connection does, which the idle timeout allowed for 300 s. On a
//! server, the client's first SETTINGS frame must be whole within the handshake
//! timeout of the connection's start too (RFC 9113 §3.4: the preface is followed by
//! SETTINGS): h2's handshake ends with the preface, and a client that sent only the
//! preface was kept until the keepalive closed it, 80 s later.
//!
//! And on a server it hands the frame headers it reads to the bound on control frames
//! ([`ControlFrames`], `crate::flood`), with the number of HEADERS and DATA frames
//! the writer wrote; past the bound the connection is closed with GOAWAY
//! `ENHANCE_YOUR_CALM`. A frame header costs a comparison or two more; payload bytes
//! nothing more.

use std::{
    collections::HashMap,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll, Waker},
};

use std::{future::Future, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

use crate::{
    driver::{Command, Control, Io},
    flood::ControlFrames,
};

/// Frames of one stream handed to h2 and not yet written to the connection, past
/// which the stream's small messages wait in its own queue.
pub(crate) const MAX_FRAMES_IN_H2: usize = 16;

/// The server link's task is woken each time the writer gets through another this
/// many bytes of DATA (see `Meter::link_task`): a wake-up per 64 KiB written is
/// nothing next to the writes themselves.
const PROGRESS_STEP: u64 = 64 * 1024;

/// The client's connection preface, written before the first frame.
const CLIENT_PREFACE_LEN: usize = 24;

const FRAME_HEADER_LEN: usize = 9;
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PUSH_PROMISE: u8 = 5;
const CONTINUATION: u8 = 9;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// The streams of one connection whose written DATA is counted.
#[derive(Default)]
pub(crate) struct Meter {
    streams: Mutex<HashMap<u32, Arc<StreamMeter>>>,
    /// How many are registered: while none is, the writer looks nothing up.
    registered: AtomicUsize,
    /// DATA payload bytes the connection's writer has written, all streams' (counted
    /// as each DATA frame's header passes).
    data_written: AtomicU64,
    /// Bytes read from the peer: the keepalive PINGs only after an interval that read
    /// nothing (`crate::driver`).
    read: AtomicU64,
    /// Whether `link_task` holds a waker (so that the writer takes no lock otherwise).
    has_link_task: AtomicBool,
    /// The server link's task (the core's connection task), woken each time the
    /// writer gets through another [`PROGRESS_STEP`] bytes of DATA: once a stream has
    /// handed h2 its last bytes nothing else wakes it while h2 writes them, and it
    /// publishes [`unsent`](Self::unsent) only when polled.
    link_task: Mutex<Option<Waker>>,
    /// What only the link's task touches, while the connection's writer reads the
    /// fields above on every write: on a cache line of its own.
    link: LinkOnly,
}

/// Counters on a cache line of their own (128 bytes: adjacent-line prefetching pairs
/// lines on x86).
#[derive(Default)]
#[repr(align(128))]
struct LinkOnly {
    /// The bytes of unary answers that the connection's streams queue and have not
    /// handed h2 yet (the [`Outbound`](crate::flow::Outbound)s counted in it).
    queued: AtomicUsize,
    /// DATA payload bytes the connection's streams were given to send, less what
    /// they dropped unsent (a stream reset, or gone, with messages queued).
    pushed: AtomicU64,
}

impl Meter {
    /// Bytes read from the peer so far.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Unary answers' bytes queued on the connection's streams, not yet handed to h2.
    pub(crate) fn queued(&self) -> usize {
        self.link.queued.load(Ordering::Relaxed)
    }

    pub(crate) fn add_queued(&self, n: usize) {
        self.link.queued.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub_queued(&self, n: usize) {
        self.link.queued.fetch_sub(n, Ordering::Relaxed);
    }

    /// A stream was given `n` bytes of DATA payload to send.
    pub(crate) fn add_pushed(&self, n: usize) {
        self.link.pushed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A stream dropped `n` bytes it had been given, unsent.
    pub(crate) fn sub_pushed(&self, n: usize) {
        self.link.pushed.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Wakes `waker` as the writer gets through more DATA (see `link_task`).
    pub(crate) fn set_link_task(&self, waker: &Waker) {
        let mut slot = self.link_task.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(waker.clone());
        self.has_link_task.store(true, Ordering::Release);
    }

    /// Counts a DATA frame of `len` payload bytes the writer is writing.
    fn data_written(&self, len: u64) {
        let before = self.data_written.fetch_add(len, Ordering::Relaxed);
        if before / PROGRESS_STEP != (before + len) / PROGRESS_STEP
            && self.has_link_task.load(Ordering::Acquire)
        {
            let slot = self.link_task.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(waker) = slot.as_ref() {
                waker.wake_by_ref();
            }
        }
    }

    /// DATA payload bytes the connection's streams were given and the writer has not
    /// written yet: queued on the streams, or handed to h2. An estimate that moves as
    /// the peer takes data (what the server's eviction at its connection limit asks,
    /// `Link::unsent`): bytes h2 drops unwritten, those of a stream reset while h2 held
    /// them, stay counted.
    pub(crate) fn unsent(&self) -> u64 {
        let pushed = self.link.pushed.load(Ordering::Relaxed);
        pushed.saturating_sub(self.data_written.load(Ordering::Relaxed))
    }

    /// Counts stream `id`'s written DATA from now on, until the returned meter is
    /// dropped.
    pub(crate) fn register(self: &Arc<Meter>, id: u32) -> Registered {
        let stream = Arc::new(StreamMeter::default());
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if streams.insert(id, stream.clone()).is_none() {
            self.registered.fetch_add(1, Ordering::Relaxed);
        }
        Registered {
            meter: self.clone(),
            id,
            stream,
        }
    }

    fn lookup(&self, id: u32) -> Option<Arc<StreamMeter>> {
        if self.registered.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.get(&id).cloned()
    }
}

/// What h2 has written of one stream's DATA payload.
#[derive(Default)]
pub(crate) struct StreamMeter {
    written: AtomicU64,
    /// Whether `waker` waits (so that the writer takes no lock otherwise).
    waiting: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl StreamMeter {
    fn wake(&self) {
        if self.waiting.swap(false, Ordering::SeqCst) {
            let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// A stream's registration with its connection's [`Meter`]; dropping it ends it.
pub(crate) struct Registered {
    meter: Arc<Meter>,
    id: u32,
    stream: Arc<StreamMeter>,
}

impl Registered {
    /// DATA payload bytes of the stream written to the connection so far.
    pub(crate) fn written(&self) -> u64 {
        self.stream.written.load(Ordering::SeqCst)
    }

    /// Wakes `waker` when more of the stream is written.
    pub(crate) fn register_waker(&self, waker: &Waker) {
        let mut slot = self.stream.waker.lock().unwrap_or_else(|e| e.into_inner());
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
        // SeqCst here and in the writer: either it sees the waker or the caller's
        // second look sees what it wrote.
        self.stream.waiting.store(true, Ordering::SeqCst);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut streams = self.meter.streams.lock().unwrap_or_else(|e| e.into_inner());
        if streams
            .get(&self.id)
            .is_some_and(|s| Arc::ptr_eq(s, &self.stream))
        {
            streams.remove(&self.id);
            self.meter.registered.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Steps over the HTTP/2 frames of a byte stream: the frame headers, whole, and the
/// payload bytes of each frame as they pass.
struct Frames {
    /// Preface bytes still to skip.
    preface: usize,
    header: [u8; FRAME_HEADER_LEN],
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
}

/// What [`Frames::step`] met.
enum Step {
    /// A whole frame header.
    Header([u8; FRAME_HEADER_LEN]),
    /// This many payload bytes of the current frame.
    Payload(usize),
}

impl Frames {
    fn new(preface: usize) -> Frames {
        Frames {
            preface,
            header: [0; FRAME_HEADER_LEN],
            have: 0,
            left: 0,
        }
    }

    /// Takes what comes next from the front of `bytes`.
    fn step(&mut self, bytes: &mut &[u8]) -> Option<Step> {
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                *bytes = &bytes[n..];
                continue;
            }
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                self.left -= n;
                *bytes = &bytes[n..];
                return Some(Step::Payload(n));
            }
            let n = (FRAME_HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            *bytes = &bytes[n..];
            if self.have == FRAME_HEADER_LEN {
                self.have = 0;
                let h = self.header;
                self.left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                return Some(Step::Header(h));
            }
        }
        None
    }
}

/// Credits the DATA of registered streams in a written byte stream.
struct Scan {
    frames: Frames,
    /// The current frame's stream, when it is DATA of a registered stream.
    data: Option<Arc<StreamMeter>>,
    /// HEADERS and DATA frames written: signs of calls, for [`ControlFrames`].
    calls: u64,
}

impl Scan {
    fn feed(&mut self, meter: &Meter, mut bytes: &[u8]) {
        while let Some(step) = self.frames.step(&mut bytes) {
            match step {
                Step::Header(h) => {
                    if h[3] <= HEADERS {
                        self.calls = self.calls.wrapping_add(1);
                    }
                    let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    self.data = if h[3] == DATA && self.frames.left > 0 {
                        meter.data_written(self.frames.left as u64);
                        meter.lookup(id)
                    } else {
                        None
                    };
                }
                Step::Payload(n) => {
                    if let Some(stream) = &self.data {
                        stream.written.fetch_add(n as u64, Ordering::SeqCst);
                        if self.frames.left == 0 {
                            stream.wake();
                        }
                    }
                }
            }
        }
    }
}

/// Watches the header blocks of a read byte stream; on a server, the client's first
/// SETTINGS frame and its control frames too.
struct Blocks {
    frames: Frames,
    /// How long a header block may take.
    timeout: Duration,
    /// When the open header block must be whole.
    due: Option<Instant>,
    /// The frame being read carries END_HEADERS: the block is whole with its last
    /// byte (a peer could otherwise send that frame's header and trickle the rest).
    ending: bool,
    /// Server side, until the client's first SETTINGS frame is whole: when it must be.
    settings_due: Option<Instant>,
    /// The frame being read is that SETTINGS frame.
    settings_ending: bool,
    /// Server side: the bound on control frames.
    control: Option<ControlFrames>,
    /// The peer went past that bound.
    flooded: bool,
    /// The timer, made once a deadline is pending when the socket has nothing more.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Blocks {
    fn new(preface: usize, timeout: Duration) -> Blocks {
        Blocks {
            frames: Frames::new(preface),
            timeout,
            due: None,
            ending: false,
            settings_due: None,
            settings_ending: false,
            control: None,
            flooded: false,
            timer: None,
        }
    }

    /// A server's: the client's first SETTINGS must be whole within the timeout from
    /// now, and its control frames are counted by `control`.
    fn server(timeout: Duration, control: ControlFrames) -> Blocks {
        Blocks {
            // A timeout too large to add to now is no timeout.
            settings_due: Instant::now().checked_add(timeout),
            control: Some(control),
            ..Blocks::new(CLIENT_PREFACE_LEN, timeout)
        }
    }

    /// Steps over read `bytes`; `calls_written` is the writer's count of HEADERS and
    /// DATA frames written so far (for [`ControlFrames`]).
    fn feed(&mut self, mut bytes: &[u8], calls_written: u64) {
        while let Some(step) = self.frames.step(&mut bytes) {
            if let Step::Header(h) = step {
                let starts = matches!(h[3], HEADERS | PUSH_PROMISE);
                if starts && self.due.is_none() {
                    // A timeout too large to add to now is no timeout.
                    self.due = Instant::now().checked_add(self.timeout);
                }
                // A CONTINUATION outside a block, or anything else inside one, is
                // h2's protocol error to find.
                let in_block = starts || (h[3] == CONTINUATION && self.due.is_some());
                self.ending = in_block && h[4] & END_HEADERS != 0;
                if self.settings_due.is_some() {
                    self.settings_ending = h[3] == SETTINGS && h[4] & ACK == 0;
                }
                if let Some(control) = &mut self.control {
                    if !self.flooded
                        && !control.read(h[3], h[4], self.frames.left, calls_written, Instant::now)
                    {
                        self.flooded = true;
                    }
                }
            }
            if self.frames.left == 0 {
                if self.ending {
                    self.due = None;
                    self.ending = false;
                }
                if self.settings_ending {
                    self.settings_due = None;
                    self.settings_ending = false;
                }
            }
        }
    }

    /// An error once the open header block, or the client's first SETTINGS frame, is
    /// past its deadline.
    #[inline]
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        // The common case, on every read that finds the socket empty: nothing due.
        if self.due.is_none() && self.settings_due.is_none() {
            return Poll::Pending;
        }
        self.poll_deadline(cx)
    }

    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let (due, settings) = match (self.due, self.settings_due) {
            (None, None) => return Poll::Pending,
            (Some(block), Some(settings)) if settings < block => (settings, true),
            (Some(block), _) => (block, false),
            (None, Some(settings)) => (settings, true),
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        std::task::ready!(timer.as_mut().poll(cx));
        let message = if settings {
            format!(
                "the peer did not send its SETTINGS within {:?} of connecting",
                self.timeout
            )
        } else {
            format!(
                "the peer left a header block unfinished for {:?}",
                self.timeout
            )
        };
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, message))
    }
}

/// Whether a header block is open after a server's read bytes came in `pieces` (for
/// the fuzz target).
#[cfg(any(fuzzing, test))]
pub(crate) fn block_open_after(pieces: &[&[u8]]) -> bool {
    let mut blocks = Blocks::new(CLIENT_PREFACE_LEN, Duration::from_secs(10));
    for piece in pieces {
        blocks.feed(piece, 0);
    }
    blocks.due.is_some()
}

/// A connection's byte stream that credits each written DATA frame to its stream.
pub(crate) struct Metered {
    inner: Io,
    meter: Arc<Meter>,
    scan: Scan,
    blocks: Blocks,
    /// Server side: told to close the connection with GOAWAY `ENHANCE_YOUR_CALM` when
    /// the peer goes past the bound on control frames, with the peer for the log; taken
    /// when it is told.
    on_flood: Option<(Arc<Control>, String)>,
}

impl Metered {
    /// Wraps a client's byte stream (its writes begin with the connection preface); a
    /// header block the server sends must be whole within `header_timeout`.
    pub(crate) fn client(inner: Io, meter: Arc<Meter>, header_timeout: Duration) -> Metered {
        Metered {
            inner,
            meter,
            scan: Scan {
                frames: Frames::new(CLIENT_PREFACE_LEN),
                data: None,
                calls: 0,
            },
            blocks: Blocks::new(0, header_timeout),
            on_flood: None,
        }
    }

    /// Wraps a server's byte stream (its reads begin with the preface): the client's
    /// first SETTINGS frame, and each header block it sends, must be whole within
    /// `header_timeout`; past the bound `control` sets on its control frames,
    /// `driver` is told to close the connection (GOAWAY `ENHANCE_YOUR_CALM`).
    pub(crate) fn server(
        inner: Io,
        meter: Arc<Meter>,
        header_timeout: Duration,
        control: ControlFrames,
        driver: Arc<Control>,
        peer: String,
    ) -> Metered {
        Metered {
            inner,
            meter,
            scan: Scan {
                frames: Frames::new(0),
                data: None,
                calls: 0,
            },
            blocks: Blocks::server(header_timeout, control),
            on_flood: Some((driver, peer)),
        }
    }
}

impl Metered {
    /// A write (or flush) that, while the socket takes nothing, also watches the open
    /// header block's deadline: h2 does not read while it cannot flush (a PONG or a
    /// SETTINGS ack waiting), so a peer that stops reading would otherwise keep an
    /// unfinished block past it.
    fn poll_write_checked<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(&mut Io, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let written = write(&mut self.inner, cx);
        if written.is_pending() {
            if let Poll::Ready(err) = self.blocks.poll_expired(cx) {
                return Poll::Ready(Err(err));
            }
        }
        written
    }
}

impl AsyncRead for Metered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.blocks.flooded {
            // Nothing more is read from a flooding peer: the driver, woken when it
            // was told, sends the GOAWAY and closes the connection.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        match read {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                this.meter
                    .read
                    .fetch_add(read.len() as u64, Ordering::Relaxed);
                this.blocks.feed(read, this.scan.calls);
                if this.blocks.flooded {
                    if let Some((driver, peer)) = this.on_flood.take() {
                        tracing::warn!(
                            %peer,
                            "gRPC client sent too many control frames (PING, SETTINGS, \
                             PRIORITY, WINDOW_UPDATE, unknown types) without a call: GOAWAY \
                             ENHANCE_YOUR_CALM"
                        );
                        driver.send(Command::Abrupt(h2::Reason::ENHANCE_YOUR_CALM));
                    }
                }
            }
            // Only once the socket has nothing more: a block whose end waits unread
            // here (h2 reading slowly) is not the peer's delay.
            Poll::Pending => {
                if let Poll::Ready(err) = this.blocks.poll_expired(cx) {
                    return Poll::Ready(Err(err));
                }
            }
            Poll::Ready(Err(_)) => {}
        }
        read
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = std::task::ready!(
            this.poll_write_checked(cx, |inner, cx| { Pin::new(inner).poll_write(cx, buf) })
        )?;
        this.scan.feed(&this.meter, &buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = std::task::ready!(this.poll_write_checked(cx, |inner, cx| {
            Pin::new(inner).poll_write_vectored(cx, bufs)
        }))?;
        let mut left = n;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(buf.len());
            this.scan.feed(&this.meter, &buf[..take]);
            left -= take;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_write_checked(cx, |inner, cx| Pin::new(inner).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, id: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.push(kind);
        out.push(0);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn scan(client: bool) -> Scan {
        Scan {
            frames: Frames::new(if client { CLIENT_PREFACE_LEN } else { 0 }),
            data: None,
            calls: 0,
        }
    }

    #[test]
    fn data_of_registered_streams_is_credited_however_the_writes_split_it() {
        let meter = Arc::new(Meter::default());
        let one = meter.register(1);
        let three = meter.register(3);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(4, 0, &[0; 6])); // SETTINGS
        bytes.extend(frame(1, 1, &[0; 20])); // HEADERS
        bytes.extend(frame(DATA, 1, &[7; 100]));
        bytes.extend(frame(DATA, 5, &[7; 50])); // not registered
        bytes.extend(frame(DATA, 3, &[7; 10]));
        bytes.extend(frame(8, 3, &[0; 4])); // WINDOW_UPDATE
        bytes.extend(frame(DATA, 1, &[7; 1]));
        for split in [1, 2, 7, 9, 10, 64, bytes.len()] {
            let before = (one.written(), three.written());
            let mut s = scan(true);
            for piece in bytes.chunks(split) {
                s.feed(&meter, piece);
            }
            assert_eq!(one.written() - before.0, 101, "split {split}");
            assert_eq!(three.written() - before.1, 10, "split {split}");
        }
        // A registration that ends is no longer looked up.
        drop(three);
        assert_eq!(meter.registered.load(Ordering::Relaxed), 1);
        assert!(meter.lookup(3).is_none());
    }

    /// The server's connection task publishes `unsent` only when polled: the writer
    /// wakes it every 64 KiB of DATA written (a stream done handing h2 its answer is
    /// woken by nothing else while h2 writes it), and `unsent` follows the writes.
    #[test]
    fn the_link_task_is_woken_every_64_kib_of_data_written() {
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let meter = Meter::default();
        let mut s = scan(false);
        meter.add_pushed(200 << 10);
        // Not woken before it asks to be.
        s.feed(&meter, &frame(DATA, 1, &[0; 16 << 10]));
        meter.set_link_task(&Waker::from(count.clone()));
        for _ in 0..7 {
            s.feed(&meter, &frame(DATA, 1, &[0; 16 << 10]));
        }
        // 128 KiB written in all: the 64 KiB mark and the 128 KiB one.
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(meter.unsent(), (200 - 128) << 10);
    }

    #[test]
    fn with_nothing_registered_a_server_stream_is_only_stepped_over() {
        let meter = Meter::default();
        let mut s = scan(false);
        let mut bytes = frame(DATA, 1, &[1; 300]);
        bytes.extend(frame(0, 3, &[]));
        bytes.extend(frame(DATA, 3, &[1; 3]));
        s.feed(&meter, &bytes);
        assert_eq!((s.frames.have, s.frames.left), (0, 0));
        assert!(s.data.is_none());
    }

    #[tokio::test]
    async fn a_header_block_left_open_fails_the_read_at_its_deadline() {
        let timeout = Duration::from_millis(50);
        let mut blocks = Blocks::new(CLIENT_PREFACE_LEN, timeout);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(4, 0, &[])); // SETTINGS
        bytes.extend(frame(HEADERS, 1, &[0; 5])); // no END_HEADERS
        bytes.extend(frame(CONTINUATION, 1, &[0; 5]));
        let started = Instant::now();
        blocks.feed(&bytes, 0);
        let err = std::future::poll_fn(|cx| blocks.poll_expired(cx)).await;
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= timeout);

        // A block is whole with the last byte of its END_HEADERS frame, however the
        // reads split it; a whole HEADERS frame opens and closes it at once.
        let mut blocks = Blocks::new(0, timeout);
        let mut end = frame(CONTINUATION, 3, &[0; 5]);
        end[4] = END_HEADERS;
        let mut block = frame(HEADERS, 3, &[0; 5]);
        block.extend(&end);
        let last = block.len() - 1;
        blocks.feed(&block[..FRAME_HEADER_LEN], 0);
        for piece in block[FRAME_HEADER_LEN..last].chunks(3) {
            assert!(blocks.due.is_some());
            blocks.feed(piece, 0);
        }
        assert!(
            blocks.due.is_some(),
            "END_HEADERS seen, its payload not all read"
        );
        blocks.feed(&block[last..], 0);
        assert!(blocks.due.is_none());
        let mut whole = frame(HEADERS, 5, &[0; 5]);
        whole[4] = END_HEADERS;
        blocks.feed(&whole, 0);
        assert!(blocks.due.is_none());
        assert!(
            blocks.timer.is_none(),
            "no timer for blocks that came whole"
        );
    }

    /// h2 reads nothing while it cannot flush: with the peer not reading, a write that
    /// waits fails at the open header block's deadline, as a read would.
    #[tokio::test]
    async fn a_header_block_left_open_fails_a_waiting_write_at_its_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let timeout = Duration::from_millis(50);
        let (ours, mut peer) = tokio::io::duplex(256);
        let mut metered = Metered::server(
            Box::new(ours),
            Arc::new(Meter::default()),
            timeout,
            ControlFrames::new(1_000, Duration::from_secs(10)),
            Arc::new(Control::default()),
            "test".into(),
        );
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(4, 0, &[])); // SETTINGS
        bytes.extend(frame(HEADERS, 1, &[0; 5])); // no END_HEADERS
        let started = Instant::now();
        peer.write_all(&bytes).await.unwrap();
        let mut read = vec![0; 1024];
        let mut got = 0;
        while got < bytes.len() {
            got += metered.read(&mut read).await.unwrap();
        }
        let written = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                // Empty DATA frames on stream 0: only stepped over.
                if let Err(err) = metered.write(&frame(DATA, 0, &[])).await {
                    return err;
                }
            }
        })
        .await
        .expect("the write waited past the header block's deadline");
        assert_eq!(written.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= timeout);
        drop(peer);
    }
}
