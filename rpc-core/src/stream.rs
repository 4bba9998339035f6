//! Streams of messages: what a streaming call sends and receives.
//!
//! A streaming call opens with a REQUEST flagged `STREAMING`; its messages then travel
//! as DATA frames in both directions, and the server's RESPONSE ends it with a status
//! and trailers (`docs/wire.md` §2.10). Each direction has its own credit window in
//! bytes: a sender sends a message only while its credit is above zero, and the
//! receiver gives credit back as the application *reads* messages. So a slow reader
//! makes the writer wait, and neither side buffers more than a window plus one message.
//!
//! - [`Streaming<T>`]: received messages, decoded; what generated code hands to the
//!   application (a response stream on the client, a request stream on the server).
//! - [`RawStreaming`]: the same, undecoded.
//! - [`MessageStream`] and [`ReplyStream`]: what the application sends, encoded.

use std::{
    fmt,
    future::Future,
    marker::PhantomData,
    pin::Pin,
    sync::{
        atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures::{stream::BoxStream, task::AtomicWaker, Stream};
use tokio::{
    sync::{mpsc, OwnedSemaphorePermit},
    time::Sleep,
};

use crate::{ByteStr, Metadata, Payload, Status};

/// Request messages of a streaming call, encoded, as the client sends them.
pub type MessageStream = BoxStream<'static, Payload>;

/// Response messages of a streaming call, encoded, as a server handler produces them.
/// An `Err` ends the call with that status.
pub type ReplyStream = BoxStream<'static, Result<Payload, Status>>;

/// A value that clones share and only the first [`take`](TakeOnce::take) gets: how a
/// stream rides in the `Clone` call and reply types of the tower stacks (a streaming
/// call is never retried, so no second taker exists in practice).
pub struct TakeOnce<T>(Arc<Mutex<Option<T>>>);

impl<T> TakeOnce<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        TakeOnce(Arc::new(Mutex::new(Some(value))))
    }

    /// Takes the value; `None` if a clone took it already.
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Whether the value is there to take.
    pub(crate) fn is_present(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl<T> Clone for TakeOnce<T> {
    fn clone(&self) -> Self {
        TakeOnce(self.0.clone())
    }
}

impl<T> fmt::Debug for TakeOnce<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TakeOnce(..)")
    }
}

/// What a connection feeds a [`RawStreaming`].
pub(crate) enum StreamEvent {
    /// A message as received, and whether it is compressed.
    Message(Bytes, bool),
    /// The end: trailers, or the status that ended the stream. Boxed: every queued
    /// message is an event's size, and the unboxed end made it over 100 bytes, more
    /// than the 64 a message costs in credit, so a connection's streams' bound (64 MiB
    /// of credit) held 93 MiB of empty messages (from a review).
    End(Box<Result<Metadata, Status>>),
}

/// The connection's end of a [`RawStreaming`].
pub(crate) struct StreamFeed {
    tx: mpsc::UnboundedSender<StreamEvent>,
    buffered: Arc<AtomicUsize>,
}

impl StreamFeed {
    /// Queues a message (compressed or not); returns false if the reader is gone.
    pub(crate) fn message(&self, message: Bytes, compressed: bool) -> bool {
        let len = message_cost(message.len());
        self.buffered.fetch_add(len, Ordering::Relaxed);
        if self
            .tx
            .send(StreamEvent::Message(message, compressed))
            .is_err()
        {
            self.buffered.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Ends the stream.
    pub(crate) fn end(&self, result: Result<Metadata, Status>) {
        let _ = self.tx.send(StreamEvent::End(Box::new(result)));
    }
}

/// Gives credit back to the sender: called with the bytes the reader consumed.
pub(crate) type CreditFn = Box<dyn Fn(u32) + Send + Sync>;

/// Runs when a reader is dropped before the stream ended (the client cancels).
pub(crate) type DropFn = Box<dyn FnOnce() + Send + Sync>;

/// How a [`RawStreaming`] ended, as [`RawStreaming::on_end`] reports it.
#[derive(Clone, Copy, Debug)]
pub enum StreamEnd<'a> {
    /// The sender's last message was read and the call succeeded.
    Ok,
    /// The stream ended with this status (the call failed, its deadline passed, the
    /// connection went away, or a message could not be read).
    Failed(&'a Status),
    /// The stream was dropped before its end; on a client this cancels the call.
    Dropped,
}

/// `message`, decompressed on a server's stream, charged to its large request
/// `budget` ([`RawStreaming::charge_decompressed_to`]) if it has one.
fn charge(
    budget: Option<&std::sync::Arc<crate::server::held::LargeBudget>>,
    message: Bytes,
) -> Result<Bytes, Status> {
    let Some(budget) = budget else {
        return Ok(message);
    };
    let len = message.len();
    budget
        .charge(message)
        .map(|(message, _charge)| message) // held by the bytes alone
        .map_err(|held| {
            Status::resource_exhausted(format!(
                "the server holds {held} bytes of large requests and a stream message that \
                 decompresses to {len} bytes would take it over its limit of {} bytes: not \
                 taken",
                budget.max()
            ))
        })
}

/// A callback of [`RawStreaming::on_end`].
type EndFn = Box<dyn FnOnce(StreamEnd<'_>) + Send + Sync>;

/// The messages of a stream as they arrive, undecoded; ends with `None` after the
/// sender's last message, or with an `Err` carrying the status that ended the call.
/// Reading a message gives its bytes back to the sender as credit.
///
/// Dropped before its end on the client, it cancels the call.
pub struct RawStreaming {
    rx: mpsc::UnboundedReceiver<StreamEvent>,
    credit: CreditFn,
    on_drop: Option<DropFn>,
    /// Bytes read but not yet given back (credit is returned in batches).
    unreturned: u32,
    batch: u32,
    buffered: Arc<AtomicUsize>,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    trailers: Option<Metadata>,
    done: bool,
    _permit: Option<OwnedSemaphorePermit>,
    /// Largest message a compressed one may expand to.
    max_len: usize,
    last_compressed: bool,
    /// Bytes decompressed since the reader last yielded ([`INFLATE_BEFORE_YIELD`]).
    inflated: usize,
    /// Told how the stream ended ([`RawStreaming::on_end`]).
    on_end: Option<EndFn>,
    /// The status a failed stream ended with, for an `on_end` set after its end.
    failed: Option<Status>,
    /// A server's budget of large request bytes, which a decompressed message is
    /// charged to for as long as its bytes live.
    large: Option<std::sync::Arc<crate::server::held::LargeBudget>>,
}

impl fmt::Debug for RawStreaming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawStreaming")
            .field("done", &self.done)
            .field("buffered", &self.buffered_bytes())
            .finish_non_exhaustive()
    }
}

impl RawStreaming {
    /// A stream fed by the returned [`StreamFeed`]; `credit` is called with bytes to
    /// give back, at least every `batch` bytes read.
    pub(crate) fn new(credit: CreditFn, batch: u32) -> (StreamFeed, RawStreaming) {
        let (tx, rx) = mpsc::unbounded_channel();
        let buffered = Arc::new(AtomicUsize::new(0));
        (
            StreamFeed {
                tx,
                buffered: buffered.clone(),
            },
            RawStreaming {
                rx,
                credit,
                on_drop: None,
                unreturned: 0,
                batch: batch.max(1),
                buffered,
                deadline: None,
                trailers: None,
                done: false,
                _permit: None,
                max_len: crate::link::DEFAULT_MAX_FRAME_LEN,
                last_compressed: false,
                inflated: 0,
                on_end: None,
                failed: None,
                large: None,
            },
        )
    }

    /// Calls `f` once when the stream ends: with [`StreamEnd::Ok`] when its end is
    /// read, [`StreamEnd::Failed`] with the status it ends with, or
    /// [`StreamEnd::Dropped`] if it is dropped before either; at once, with how it
    /// ended, on a stream that has already ended. What a layer that measures calls
    /// uses to see a streaming call to its end, rather than to its first reply (the
    /// metrics, trace and status layers of `rpc-observe`). Callbacks set earlier are
    /// called after `f`.
    pub fn on_end(&mut self, f: impl FnOnce(StreamEnd<'_>) + Send + Sync + 'static) {
        if self.done {
            match &self.failed {
                Some(status) => f(StreamEnd::Failed(status)),
                None => f(StreamEnd::Ok),
            }
            return;
        }
        self.on_end = Some(match self.on_end.take() {
            None => Box::new(f),
            Some(earlier) => Box::new(move |end: StreamEnd<'_>| {
                f(end);
                earlier(end);
            }),
        });
    }

    pub(crate) fn set_on_drop(&mut self, on_drop: DropFn) {
        self.on_drop = Some(on_drop);
    }

    /// The call's deadline keeps running while the stream is read.
    pub(crate) fn set_deadline(&mut self, sleep: Pin<Box<Sleep>>, timeout: Duration) {
        self.deadline = Some((sleep, timeout));
    }

    /// Keeps `guard` until the stream ends or is dropped (e.g. a balancer's in-flight
    /// count).
    pub(crate) fn hold(&mut self, guard: Box<dyn Send + Sync>) {
        self.on_end(move |_| drop(guard));
    }

    /// The largest size a compressed message may expand to.
    pub(crate) fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len;
    }

    /// A server's stream: each message it decompresses is charged to `budget` (the
    /// server's large request bytes) for as long as its bytes live; one that does not
    /// fit ends the stream `RESOURCE_EXHAUSTED`. (A few hundred bytes of zstd stand
    /// for 16 MiB: charged by their size on the wire, 256 streams on a connection
    /// held gigabytes; from a review.)
    pub(crate) fn charge_decompressed_to(
        &mut self,
        budget: std::sync::Arc<crate::server::held::LargeBudget>,
    ) {
        self.large = Some(budget);
    }

    /// Whether the last message read arrived compressed.
    pub fn last_compressed(&self) -> bool {
        self.last_compressed
    }

    /// The channel's in-flight permit, held until the stream ends.
    pub(crate) fn set_permit(&mut self, permit: Option<OwnedSemaphorePermit>) {
        self._permit = permit;
    }

    /// Bytes of messages received and not yet read, as flow control counts them (a
    /// message at least 64 bytes): at most the receive window plus one message.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    /// The trailers the sender ended the stream with, once it has ended successfully.
    pub fn trailers(&self) -> Option<&Metadata> {
        self.trailers.as_ref()
    }

    /// Messages read but not yet credited, and those still queued, will never be
    /// read: gives all their bytes back so the sender is not left without credit (it
    /// may still need to finish, e.g. to half-close). Closed first, so each message is
    /// credited once: those queued before are drained here, and one sent from now on
    /// is refused, which its feeder hears (`StreamFeed::message`) and credits itself.
    /// Counting `buffered` instead also counted a message being sent at that very
    /// moment, which its feeder then credited again.
    fn give_back_unread(&mut self) {
        self.rx.close();
        let mut total = u64::from(std::mem::take(&mut self.unreturned));
        while let Ok(event) = self.rx.try_recv() {
            if let StreamEvent::Message(message, _) = event {
                total += message_cost(message.len()) as u64;
            }
        }
        if total > 0 {
            (self.credit)(u32::try_from(total).unwrap_or(u32::MAX));
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.on_drop = None;
        self.deadline = None;
        self._permit = None;
        // Nothing more to give back: the function (a sender to the connection's task)
        // goes, so that a stream kept after its end (for its trailers) does not keep
        // the connection's task, and the connection, after its channel is dropped.
        // (A closure that captures nothing: no allocation.)
        self.credit = Box::new(|_| {});
    }
}

impl Stream for RawStreaming {
    type Item = Result<Bytes, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let poll = this.poll_message(cx);
        if this.done {
            if let Poll::Ready(Some(Err(status))) = &poll {
                this.failed = Some(status.clone());
            }
            if let Some(on_end) = this.on_end.take() {
                match &this.failed {
                    Some(status) => on_end(StreamEnd::Failed(status)),
                    None => on_end(StreamEnd::Ok),
                }
            }
        }
        poll
    }
}

/// Bytes a stream's reader decompresses before it yields to the runtime once, as a
/// server's connection does for unary requests.
const INFLATE_BEFORE_YIELD: usize = 4 << 20;

impl RawStreaming {
    /// [`Stream::poll_next`] of a stream that has not ended.
    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Status>>> {
        let this = self;
        // The deadline first: a sender that keeps messages coming (one that ignores the
        // time budget) must not keep the stream past it. A clock read, not a poll of
        // the timer (which costs a coop budget unit and a waker registration), while
        // messages are there; the timer is polled when the reader waits.
        if let Some((sleep, _)) = &this.deadline {
            if sleep.deadline() <= tokio::time::Instant::now() {
                return this.expired();
            }
        }
        if this.inflated >= INFLATE_BEFORE_YIELD {
            // Past its share of decompression: the task lets others run (520 bytes of
            // zstd open to 16 MiB, and a reader of a few thousand held its worker
            // thread for seconds).
            this.inflated = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(StreamEvent::Message(message, compressed))) => {
                // Credit counts message bytes as they were on the wire (each message at
                // least `MIN_MESSAGE_COST`).
                let cost = message_cost(message.len());
                let len = u32::try_from(cost).unwrap_or(u32::MAX);
                this.buffered.fetch_sub(cost, Ordering::Relaxed);
                this.unreturned = this.unreturned.saturating_add(len);
                if this.unreturned >= this.batch {
                    (this.credit)(std::mem::take(&mut this.unreturned));
                }
                this.last_compressed = compressed;
                if !compressed {
                    return Poll::Ready(Some(Ok(message)));
                }
                // The work counts whatever comes of it (a bomb refused at the limit
                // cost as much as a message that decompressed).
                let mut work = message.len();
                // On a server, no further than its budget of large requests has room
                // for (the result is charged to it).
                let decompressed = match &this.large {
                    Some(budget) => budget.decompress(
                        &message,
                        this.max_len,
                        &mut |reserved| work += reserved,
                        |budget| format!("{budget}: a stream message not taken"),
                    ),
                    None => crate::compress::decompress_reserving(
                        &message,
                        this.max_len,
                        &mut |reserved| work += reserved,
                    ),
                };
                this.inflated = this.inflated.saturating_add(work);
                return Poll::Ready(Some(
                    match decompressed.and_then(|message| charge(this.large.as_ref(), message)) {
                        Ok(message) => Ok(message),
                        Err(status) => {
                            // A message that cannot be read ends the stream; those
                            // behind it will not be read either, and their credit goes
                            // back (the server holds them against its streams' bound
                            // for as long as the handler runs on).
                            if let Some(on_drop) = this.on_drop.take() {
                                on_drop();
                            }
                            this.give_back_unread();
                            this.finish();
                            Err(status)
                        }
                    },
                ));
            }
            Poll::Ready(Some(StreamEvent::End(result))) => {
                this.finish();
                return Poll::Ready(match *result {
                    Ok(trailers) => {
                        this.trailers = Some(trailers);
                        None
                    }
                    Err(status) => Some(Err(status)),
                });
            }
            Poll::Ready(None) => {
                this.finish();
                return Poll::Ready(Some(Err(Status::unavailable(
                    "the connection carrying the stream is gone",
                ))));
            }
            // Waiting: the next turn starts a fresh share of decompression.
            Poll::Pending => this.inflated = 0,
        }
        if this.unreturned > 0 {
            // About to wait: give back what was read, so the sender is not left waiting
            // for credit a batch would hold back.
            (this.credit)(std::mem::take(&mut this.unreturned));
        }
        if let Some((sleep, _)) = &mut this.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                return this.expired();
            }
        }
        Poll::Pending
    }

    /// Ends the stream at its deadline, cancelling the call on the server. Messages
    /// still queued are not delivered (as gRPC's deadline cancels the call): the
    /// stream's time is up, even for a server that finished in time and a reader that
    /// came late.
    fn expired(&mut self) -> Poll<Option<Result<Bytes, Status>>> {
        let timeout = self.deadline.as_ref().map_or(Duration::ZERO, |(_, t)| *t);
        if let Some(on_drop) = self.on_drop.take() {
            on_drop(); // cancels the call on the server
        }
        self.finish();
        Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
            "deadline of {timeout:?} exceeded during the stream"
        )))))
    }
}

impl Drop for RawStreaming {
    fn drop(&mut self) {
        if !self.done {
            self.give_back_unread();
        }
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
        if let Some(on_end) = self.on_end.take() {
            on_end(StreamEnd::Dropped);
        }
    }
}

/// The messages of a stream, decoded: `Stream<Item = Result<T, Status>>`, ending with
/// `None` after the last message or with the `Err` that ended the call.
///
/// ```
/// use futures::StreamExt;
/// use rpc_core::{client::{Channel, Client}, link::mem, payload, stream::{Streaming, TakeOnce}};
/// use rpc_core::{server::{Server, ServerCall, ServerReply}, Request, Status};
/// # use rpc_core::method::{Idempotency, MethodDescriptor};
/// # static COUNT: MethodDescriptor = MethodDescriptor { service: "demo.Counter", method: "Count",
/// #     path: "demo.Counter/Count", idempotency: Idempotency::NoSideEffects };
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A server answering with the numbers 1 to 3 (what a generated server does for a
/// // handler that returns a stream).
/// let count = tower::service_fn(|_call: ServerCall| async {
///     let numbers = futures::stream::iter(1..=3u32).map(|n| Ok(payload::encode(&n)));
///     let stream = Some(TakeOnce::new(numbers.boxed()));
///     Ok::<_, Status>(ServerReply { stream, ..ServerReply::default() })
/// });
/// let (listener, connector) = mem::listener();
/// tokio::spawn(Server::builder().add_named_service("demo.Counter", count).serve(listener));
///
/// // The client reads the messages as they come (`COUNT` describes `demo.Counter/Count`).
/// let mut client = Client::new(Channel::builder().connect(connector).await?);
/// let mut numbers: Streaming<u32> =
///     client.server_streaming(Request::new(()), &COUNT).await?.into_inner();
/// while let Some(n) = numbers.message().await? { // or `numbers.next().await`: a Stream
///     println!("{n}"); // 1, 2, 3
/// }
/// # Ok(()) }
/// ```
pub struct Streaming<T> {
    raw: RawStreaming,
    /// On a server, the method whose request messages these are: named in the
    /// `INTERNAL` status of a message that does not decode.
    requests_of: Option<ByteStr>,
    _message: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.raw.fmt(f)
    }
}

impl<T: prost::Message + Default> Streaming<T> {
    /// Decodes the messages of `raw`.
    pub fn new(raw: RawStreaming) -> Self {
        Streaming {
            raw,
            requests_of: None,
            _message: PhantomData,
        }
    }

    /// Decodes the request messages of a call of `method`, on a server.
    pub(crate) fn requests(raw: RawStreaming, method: ByteStr) -> Self {
        Streaming {
            raw,
            requests_of: Some(method),
            _message: PhantomData,
        }
    }

    /// The next message; `Ok(None)` at the end of the stream.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        use futures::StreamExt;
        self.next().await.transpose()
    }

    /// The trailers, once the stream has ended successfully.
    pub fn trailers(&self) -> Option<&Metadata> {
        self.raw.trailers()
    }

    /// Whether the last message read arrived compressed.
    pub fn last_compressed(&self) -> bool {
        self.raw.last_compressed()
    }

    /// Bytes received and not yet read.
    pub fn buffered_bytes(&self) -> usize {
        self.raw.buffered_bytes()
    }

    /// The undecoded stream.
    pub fn into_raw(self) -> RawStreaming {
        self.raw
    }
}

impl<T: prost::Message + Default> Stream for Streaming<T> {
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match Pin::new(&mut this.raw).poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                Poll::Ready(Some(T::decode(bytes).map_err(
                    |e| match &this.requests_of {
                        Some(method) => Status::internal(format!(
                            "cannot decode a request message of {method}: {e}"
                        )),
                        None => Status::internal(format!("cannot decode a stream message: {e}")),
                    },
                )))
            }
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(status))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Bytes of one stream's messages its producer may have handed to the connection and
/// not yet seen written to the link. Credit is the peer's to grant, memory is not: a
/// client that grants gigabytes and does not read must not make the server queue
/// them. A quarter of a MiB keeps the link busy between two wake-ups of the producer.
pub(crate) const MAX_UNSENT: i64 = 256 * 1024;

/// Bytes of messages all the streams of one connection may have handed to it and it
/// has not yet written or dropped: [`MAX_UNSENT`] is per stream, and a connection has
/// up to `max_concurrent_streams` of them (plus the messages of streams cancelled while
/// their messages waited). Four streams' worth keeps the link as busy as one.
pub(crate) const MAX_CONNECTION_UNSENT: i64 = 4 * MAX_UNSENT;

/// What a flow-control window counts for one message of `len` bytes: its length, but
/// at least [`MIN_MESSAGE_COST`] (`docs/wire.md` §6.9).
pub(crate) fn message_cost(len: usize) -> usize {
    len.max(MIN_MESSAGE_COST)
}

/// Stream messages shorter than this are copied out of the frame they came in before
/// they are queued for their reader. A message is a slice of its frame, and the frames
/// of one read share the read buffer's allocation: a short message kept the whole
/// allocation (about 64 KiB) alive, so a peer sending short messages each followed by
/// a frame the receiver drops pinned some 1,000 times the credit they cost (from a
/// review). A longer message keeps at most about 16 times its size (a read buffer is
/// at most about 64 KiB plus a read unless it holds one larger frame).
pub(crate) const COPY_BELOW: usize = 4 * 1024;

/// A received stream message as it is queued for its reader: copied if it is shorter
/// than `copy_below` (at least [`COPY_BELOW`]), else the slice of its frame.
pub(crate) fn held_message(message: bytes::Bytes, copy_below: usize) -> bytes::Bytes {
    if message.len() < copy_below.max(COPY_BELOW) {
        bytes::Bytes::copy_from_slice(&message)
    } else {
        message
    }
}

/// The least a message costs in stream credit, however short: about what a queued
/// message costs its receiver beyond its bytes. Without it, empty messages cost nothing
/// and a sender could queue any number of them.
pub(crate) const MIN_MESSAGE_COST: usize = 64;

/// The bytes of stream messages one connection holds for its link, across its streams
/// (dead ones included): see [`MAX_CONNECTION_UNSENT`].
#[derive(Debug, Default)]
pub(crate) struct OutputBudget {
    unsent: AtomicI64,
}

impl OutputBudget {
    fn has_room(&self) -> bool {
        self.unsent.load(Ordering::Acquire) < MAX_CONNECTION_UNSENT
    }

    /// Bytes held right now.
    pub(crate) fn unsent(&self) -> i64 {
        self.unsent.load(Ordering::Acquire)
    }

    /// The connection wrote or dropped `cost` bytes of messages. Returns whether that
    /// made room where there was none: producers waiting for it must then be woken.
    pub(crate) fn release(&self, cost: usize) -> bool {
        let n = i64::try_from(cost).unwrap_or(i64::MAX);
        let before = self.unsent.fetch_sub(n, Ordering::AcqRel);
        before >= MAX_CONNECTION_UNSENT && before - n < MAX_CONNECTION_UNSENT
    }
}

/// A sender's credit on one stream, shared between the task producing messages and
/// the connection that receives WINDOW frames and writes the messages out.
#[derive(Debug)]
pub(crate) struct Credit {
    available: AtomicI64,
    /// Bytes consumed whose messages the connection has not written yet.
    unsent: AtomicI64,
    /// The connection's budget for all its streams, on the server.
    budget: Option<Arc<OutputBudget>>,
    waker: AtomicWaker,
    /// On a server, why the connection stopped the stream's handler: 0 while it runs,
    /// else the status code it answered the client with, plus one (see
    /// [`Credit::stop`]).
    stop: AtomicU32,
    /// The handler's task, woken when it is stopped.
    stop_waker: AtomicWaker,
}

impl Credit {
    /// Credit whose messages also count against a connection's `budget`.
    pub(crate) fn with_budget(initial: u32, budget: Arc<OutputBudget>) -> Arc<Credit> {
        Self::build(initial, Some(budget))
    }

    fn build(initial: u32, budget: Option<Arc<OutputBudget>>) -> Arc<Credit> {
        Arc::new(Credit {
            available: AtomicI64::new(i64::from(initial)),
            unsent: AtomicI64::new(0),
            budget,
            waker: AtomicWaker::new(),
            stop: AtomicU32::new(0),
            stop_waker: AtomicWaker::new(),
        })
    }

    /// Stops the stream's handler (server): its task drops the handler at its next
    /// poll, woken now, with [`stop_cause`](crate::server::stop_cause) telling what
    /// observes the handler (its layers) that `code` is why, as `std::thread::panicking`
    /// tells a panic. The first stop's code stays.
    pub(crate) fn stop(&self, code: crate::Code) {
        let _ = self.stop.compare_exchange(
            0,
            code.as_u32().saturating_add(1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.stop_waker.wake();
    }

    /// `Ready` with the code once [`stop`](Self::stop) was called; otherwise the
    /// task of `cx` is woken when it is.
    pub(crate) fn poll_stopped(&self, cx: &mut Context<'_>) -> Poll<crate::Code> {
        let stopped = |n: u32| (n != 0).then(|| crate::Code::from_u32(n - 1));
        if let Some(code) = stopped(self.stop.load(Ordering::Acquire)) {
            return Poll::Ready(code);
        }
        self.stop_waker.register(cx.waker());
        match stopped(self.stop.load(Ordering::Acquire)) {
            Some(code) => Poll::Ready(code),
            None => Poll::Pending,
        }
    }

    fn has_room(&self) -> bool {
        self.available.load(Ordering::Acquire) > 0
            && self.unsent.load(Ordering::Acquire) < MAX_UNSENT
            && self.budget.as_ref().is_none_or(|b| b.has_room())
    }

    /// Wakes the producer if it waits (for the connection's budget, say).
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Ready while there is credit left and the connection keeps up with the messages
    /// already handed to it.
    pub(crate) fn poll_available(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_room() {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if self.has_room() {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// A message of `len` bytes is handed to the connection.
    pub(crate) fn consume(&self, len: usize) {
        let n = i64::try_from(message_cost(len)).unwrap_or(i64::MAX);
        self.available.fetch_sub(n, Ordering::AcqRel);
        self.unsent.fetch_add(n, Ordering::AcqRel);
        if let Some(budget) = &self.budget {
            budget.unsent.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// The connection wrote (or dropped) a message of `len` bytes. Returns whether the
    /// connection's budget had no room before and has now: see
    /// [`OutputBudget::release`].
    pub(crate) fn sent(&self, len: usize) -> bool {
        let cost = message_cost(len);
        let n = i64::try_from(cost).unwrap_or(i64::MAX);
        self.unsent.fetch_sub(n, Ordering::AcqRel);
        self.waker.wake();
        self.budget.as_ref().is_some_and(|b| b.release(cost))
    }

    /// A WINDOW frame's increment. Saturates: a peer may grant any total (each
    /// increment is at most 2^32 - 1), and the sum must not wrap into "no credit".
    pub(crate) fn add(&self, n: u32) {
        let _ = self
            .available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                Some(a.saturating_add(i64::from(n)))
            });
        self.waker.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued message costs its receiver an event's size beside its bytes: no more
    /// than the least credit a message costs, so the bound a connection puts on its
    /// streams' unread messages (in credit) bounds their memory too.
    #[test]
    fn a_queued_event_is_smaller_than_a_messages_least_cost() {
        assert!(
            std::mem::size_of::<StreamEvent>() <= MIN_MESSAGE_COST / 2 + 8,
            "{} bytes",
            std::mem::size_of::<StreamEvent>()
        );
    }

    /// `on_end` reports each way a stream ends once: its end read (OK, or the status
    /// it failed with), dropped before it; and at once on a stream already ended.
    #[tokio::test]
    async fn on_end_reports_how_the_stream_ended_once() {
        use futures::StreamExt;
        use std::sync::Mutex;

        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let record = |seen: &Arc<Mutex<Vec<String>>>| {
            let seen = seen.clone();
            move |end: StreamEnd<'_>| {
                let what = match end {
                    StreamEnd::Ok => "ok".to_owned(),
                    StreamEnd::Failed(status) => format!("failed {}", status.code()),
                    StreamEnd::Dropped => "dropped".to_owned(),
                };
                seen.lock().unwrap().push(what);
            }
        };
        let stream = || RawStreaming::new(Box::new(|_| {}), 1024);

        let (feed, mut ok) = stream();
        ok.on_end(record(&seen));
        feed.message(Bytes::from_static(b"x"), false);
        feed.end(Ok(Metadata::new()));
        assert!(ok.next().await.unwrap().is_ok());
        assert!(ok.next().await.is_none());
        ok.on_end(record(&seen)); // set after the end: told at once
        drop(ok);

        let (feed, mut failed) = stream();
        failed.on_end(record(&seen));
        feed.end(Err(Status::aborted("midway")));
        assert!(failed.next().await.unwrap().is_err());
        failed.on_end(record(&seen));
        drop(failed);

        let (_feed, mut dropped) = stream();
        dropped.on_end(record(&seen));
        drop(dropped);

        assert_eq!(
            *seen.lock().unwrap(),
            ["ok", "ok", "failed ABORTED", "failed ABORTED", "dropped"]
        );
    }

    /// A short message is copied out of its frame's buffer (it would keep the whole
    /// read buffer alive for 64 bytes of credit), a longer one is the slice itself;
    /// the caller's threshold (the metadata limit, for a frame with metadata) counts
    /// when higher.
    #[test]
    fn short_messages_are_copied_out_of_the_read_buffer() {
        let buffer = Bytes::from(vec![5u8; 64 * 1024]);
        let short = held_message(buffer.slice(100..110), 0);
        assert!(short.is_unique() && short.len() == 10);
        let long = held_message(buffer.slice(0..COPY_BELOW), 0);
        assert!(!long.is_unique());
        let metadata = held_message(buffer.slice(0..COPY_BELOW), 16 * 1024);
        assert!(metadata.is_unique());
    }

    /// A compressed message that does not decompress ends the stream with its error;
    /// the messages queued behind it are credited back at once, not when the reader
    /// is dropped (a handler that goes on after the error held them against the
    /// server's bound of unread stream bytes), and are not read.
    #[tokio::test]
    async fn a_message_that_does_not_decompress_gives_back_the_rest() {
        use futures::StreamExt;
        let credited = Arc::new(AtomicUsize::new(0));
        let (feed, mut reader) = RawStreaming::new(
            Box::new({
                let credited = credited.clone();
                move |n| {
                    credited.fetch_add(n as usize, Ordering::SeqCst);
                }
            }),
            1024,
        );
        feed.message(Bytes::from_static(b"not compressed at all"), true);
        for _ in 0..3 {
            feed.message(Bytes::from(vec![0u8; 100]), false);
        }
        assert!(reader.next().await.unwrap().is_err());
        assert_eq!(
            credited.load(Ordering::SeqCst),
            message_cost(21) + 3 * message_cost(100)
        );
        assert!(reader.next().await.is_none());
        drop(reader);
        assert_eq!(
            credited.load(Ordering::SeqCst),
            message_cost(21) + 3 * message_cost(100),
            "credited once"
        );
    }

    /// A reader dropped while its feeder is sending a message: the queued messages are
    /// credited by the drop, and the message being sent by its feeder, which hears the
    /// send refused (the connection gives that credit back itself). The drop counted
    /// the message in flight too, so its bytes went back to the sender twice.
    #[test]
    fn a_reader_dropped_during_a_send_credits_each_message_once() {
        let credited = Arc::new(AtomicUsize::new(0));
        let (feed, reader) = RawStreaming::new(
            Box::new({
                let credited = credited.clone();
                move |bytes| {
                    credited.fetch_add(bytes as usize, Ordering::SeqCst);
                }
            }),
            1 << 20,
        );
        assert!(feed.message(Bytes::from(vec![1; 1000]), false));
        assert!(feed.message(Bytes::from(vec![2; 3000]), false));
        // The feeder, part way through `message`: counted, not yet sent.
        let cost = message_cost(500);
        feed.buffered.fetch_add(cost, Ordering::Relaxed);
        drop(reader);
        assert_eq!(credited.load(Ordering::SeqCst), 4000, "the queued messages");
        // ... and its send is refused: the feeder credits this one.
        let refused = feed
            .tx
            .send(StreamEvent::Message(Bytes::from(vec![3; 500]), false))
            .is_err();
        assert!(refused, "a closed stream takes no message");
        assert!(!feed.message(Bytes::from(vec![4; 10]), false));
    }

    #[test]
    fn credit_saturates_and_waits_for_the_connection() {
        let credit = Credit::build(10, None);
        credit.available.store(i64::MAX - 1, Ordering::Release);
        credit.add(u32::MAX);
        credit.add(u32::MAX);
        assert_eq!(credit.available.load(Ordering::Acquire), i64::MAX);
        assert!(credit.has_room());
        // Plenty of credit, but the connection has not written what it was handed.
        credit.consume(MAX_UNSENT as usize);
        assert!(!credit.has_room());
        credit.sent(MIN_MESSAGE_COST);
        assert!(credit.has_room());
    }

    #[test]
    fn empty_messages_cost_credit_and_streams_share_the_connection_budget() {
        let budget = Arc::new(OutputBudget::default());
        let a = Credit::with_budget(1000, budget.clone());
        let b = Credit::with_budget(u32::MAX, budget.clone());
        for _ in 0..16 {
            a.consume(0);
        }
        assert!(
            !a.has_room(),
            "16 empty messages use up 1000 bytes of credit"
        );
        b.consume(MAX_CONNECTION_UNSENT as usize);
        assert!(!b.has_room(), "the connection holds its budget");
        let c = Credit::with_budget(u32::MAX, budget.clone());
        assert!(!c.has_room(), "a new stream waits for the connection too");
        assert!(
            b.sent(MAX_CONNECTION_UNSENT as usize),
            "room again: wake the others"
        );
        assert!(c.has_room());
        assert_eq!(budget.unsent(), 16 * MIN_MESSAGE_COST as i64);
    }
}
