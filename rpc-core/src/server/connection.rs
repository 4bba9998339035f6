//! The task that owns one server connection.
//!
//! Each request becomes its own Tokio task (so handlers of one connection run
//! concurrently and a panic is contained); the connection keeps each task's abort
//! handle by call id. A CANCEL frame, an expired deadline, the connection's end or the
//! connection task being dropped all drop the handler's future.
//!
//! Backpressure: a request holds one of `max_concurrent_requests` slots from when it
//! is read until its answer is written or dropped: while its handler runs, while it
//! waits for a service that is not ready, while its answer waits for the link, and,
//! once cancelled, until its handler has ended (an aborted task reports that it ended;
//! a keyed call, which is not aborted, when its outcome arrives). Answers the
//! connection makes itself take slots too, and their bytes count against
//! [`MAX_CONTROL_BYTES`]. At either bound the connection reads nothing more from the
//! peer (at the request limit alone, after a short look-ahead in which CANCELs and
//! PINGs are handled at once: [`LOOKAHEAD_FRAMES`]); the peer's writes then back up in
//! its socket. So whatever a peer makes the
//! server hold is bounded per connection: see the resource table in
//! `docs/architecture.md`.
//!
//! Panics: a panic in a handler, in a service's `call` or in its `poll_ready` is caught
//! and answers that call `INTERNAL`; the connection and its other calls go on. (After a
//! panic in `poll_ready` the next request polls the service again: a service that keeps
//! panicking fails each call, not the connection.)
//!
//! Streaming calls: the handler's task also produces the response messages, each only
//! while the stream's credit ([`Credit`]) is above zero and this connection has written
//! out what it was handed before (so a client that grants credit but does not read
//! cannot make the server queue messages; and all the connection's streams together
//! hold at most `stream::MAX_CONNECTION_UNSENT`, including messages of streams cancelled
//! while their messages waited, which are dropped unwritten), and sends them here as
//! [`StreamOut`] events; request messages are fed to the handler's [`RawStreaming`], which gives
//! credit back (a WINDOW frame) as the handler reads. Streams count against
//! `max_concurrent_streams`, not against the request limit, so their messages keep
//! flowing while unary calls wait.

use std::{
    collections::VecDeque,
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::BytesMut;
use futures::FutureExt;
use tokio::{
    sync::mpsc,
    task::AbortHandle,
    time::{Instant, Sleep},
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower::Service;

use super::{
    held::{Charge, LargeBudget, Queued, Unsent},
    router::Router,
    stats::{ConnectionCounters, Counts, Entry},
    ServerCall, ServerConfig, ServerReply, SharedCache, Tag,
};
use crate::keepalive::{Action, KeepaliveTimer, PingGuard};
use crate::{
    bulk::{self, Bulk, BulkEnd, BulkOp, Regions},
    frame::{self, CallKey, DataFrame, Frame, FrameError, GoAwayCode, MethodCache, RequestFrame},
    idmap::{IdMap, IdSet},
    link::{LazySleep, Link, Received},
    stream::{message_cost, OutputBudget},
    stream::{Credit, RawStreaming, StreamFeed, TakeOnce},
    Code, Error, ErrorKind, Metadata, Payload, Status,
};

/// Frames read per wake-up before the task yields to others.
const READ_BUDGET: usize = 32;

/// Bytes of compressed requests decompressed per wake-up, past which the task yields
/// to others before it reads on: a few hundred bytes of gzip or zstd stand for 16 MiB,
/// some 10 ms of a CPU, and a batch of [`READ_BUDGET`] of them held a runtime's worker
/// for a large part of a second, whatever else waited on it.
const INFLATE_BUDGET: usize = 4 << 20;

/// Frames a connection at its request limit reads ahead at most, to find CANCELs
/// behind requests that wait (a cancelled call frees its slot at once; without the
/// look-ahead a call with no deadline ran until its handler ended). Bounded also by
/// [`LOOKAHEAD_BYTES`]; past either the connection reads nothing more, as before.
const LOOKAHEAD_FRAMES: usize = 256;
/// Wire bytes of frames read ahead at the request limit past which the connection
/// reads nothing more (the last frame read may take it past, by up to a frame).
const LOOKAHEAD_BYTES: usize = 64 * 1024;
/// Answers waiting to be written below which a PING read ahead at the request limit
/// is answered at once.
const LOOKAHEAD_PONGS: usize = 16;
/// The id of the PING the keepalive sends while reading is stopped at this side's
/// limits (its PONG, if any, is not awaited).
const NUDGE_PING_ID: u64 = u64::MAX;

/// What [`Connection::read_frame`] found.
enum Read {
    /// A frame, decoded or not, with its length on the wire.
    Frame(Result<Frame, FrameError>, usize),
    /// The link refused a frame; the connection is closing.
    Closing,
    /// The peer's clean end of stream.
    End,
    /// Nothing yet.
    Pending,
    /// Something that is not a frame, and nothing more for a server to do
    /// ([`Received::Refused`], or [`Received::Stopped`], handled).
    Nothing,
}

/// The call a frame read ahead belongs to, for a CANCEL to drop it.
fn frame_call(frame: &Frame) -> Option<u64> {
    match frame {
        Frame::Request(request) => Some(request.id),
        Frame::Data(data) => Some(data.id),
        Frame::Window { id, .. } => Some(*id),
        _ => None,
    }
}

/// The longest a closing connection waits for its GOAWAY and the answers queued before
/// it to be written and for the peer to close its side (a protocol error, the idle
/// timeout, or the end of a graceful drain), or the idle timeout if shorter: a peer that
/// does not read, or does not close, in that time is cut off, instead of holding a
/// connection slot for ever.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The GOAWAY reason of a server's shutdown.
const SHUTTING_DOWN: &str = "server is shutting down";

/// The GOAWAY reason of a connection ended to make room at the connection limit
/// ([`ServerBuilder::evict_quiet_after`](super::ServerBuilder::evict_quiet_after)).
const EVICTED: &str =
    "server is at its connection limit and this connection was quiet: closing it to make room";

/// The GOAWAY reason of a connection ended, with its calls, to make room at the
/// connection limit
/// ([`ServerBuilder::evict_stalled_after`](super::ServerBuilder::evict_stalled_after)).
const EVICTED_STALLED: &str = "server is at its connection limit and the calls of this \
     connection made no progress for a long while: closing it, and them, to make room";

/// The closing grace of a connection the server's shutdown (or an eviction at the
/// connection limit) ended, its calls answered, or found closing already (after a
/// GOAWAY for an error, it waits this long from the shutdown at most): the link has
/// taken the GOAWAY (an evicted connection: from when nothing but writing is left),
/// and a peer that neither reads nor closes (an idle UDP association whose client went
/// quiet, an idle client that keeps its socket open) must not hold the server's exit
/// for the whole drain timeout.
const SHUTDOWN_CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Bytes of frames the connection answers by itself (PONGs, WINDOWs, errors, bulk read
/// replies) it holds for the link; past it, it reads nothing more until they are
/// written. A PONG echoes its PING's payload and a bulk read reply carries up to 1 MiB:
/// this lets a few of those wait in a row, and a peer that sends them without reading
/// the answers holds no more than this plus one frame.
const MAX_CONTROL_BYTES: usize = 4 << 20;

/// Requests answered without running that a connection over a link that may deliver a
/// request twice remembers, to answer a later copy the same way (nothing until a
/// refusal; at most some tens of KiB, each holding its status's message).
const REFUSALS_KEPT: usize = 256;

/// A handler's outcome and which request it answers.
type Outcome = (Tag, Result<ServerReply, Status>);

/// What a streaming call's task (or its request reader) tells the connection.
enum StreamOut {
    /// The response headers.
    Head(Metadata),
    /// A response message, and the handler's compression hint for it (a unary reply
    /// to a streaming call keeps its `ServerReply::compress`; stream messages have none).
    Message(Payload, Option<bool>),
    /// The end: trailers, or the status the call ended with.
    End(Result<Metadata, Status>),
    /// The handler read request messages: give back what its stream's `returned`
    /// holds (one event while any is there, however many reads added to it).
    Credit,
}

/// Something to write: a unary outcome, a stream's event, or a handler's bulk
/// operation.
enum Ready {
    Outcome(Outcome),
    Stream(Tag, StreamOut),
    Bulk(BulkOp),
}

/// A streaming call on this connection.
struct ServerStream {
    /// Feeds the handler's request stream; `None` after the client's half-close.
    feed: Option<StreamFeed>,
    /// Request bytes received and not yet given back.
    received: i64,
    /// The client's credit for our response messages.
    credit: std::sync::Arc<Credit>,
    /// Request bytes the handler read and the connection has not given back yet:
    /// added to by the handler's reads, taken at its [`StreamOut::Credit`] event. One
    /// event per batch: an event per read piled up uncounted while the connection's
    /// writes were blocked (a million of them for a peer sending empty messages to
    /// handlers that read them; from a review).
    returned: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Set when the connection ended the stream with an error (an answer it cannot
    /// send: headers or a message over the limits): the next event written for it,
    /// whatever the handler had queued already (its own end among them), is this
    /// error's RESPONSE.
    failed: Option<Status>,
}

/// A request whose service was not ready (or that arrived behind one): it waits, in
/// order, holding its slot; a CANCEL removes it.
struct Parked {
    service: usize,
    tag: Tag,
    call: ServerCall,
    /// The call's deadline, counted from the request's arrival.
    deadline: Option<Instant>,
    /// Set for a keyed call admitted by the duplicate cache: its outcome goes to the
    /// cache, which hands it to everyone waiting for it.
    key: Option<CallKey>,
    /// Set for a streaming call: the client's credit for the response messages.
    stream: Option<std::sync::Arc<Credit>>,
}

/// How many checks an idle timeout takes: a connection quiet for that many in a row
/// (the timeout) is closed, within a check's time past the timeout. One check per
/// timeout, re-armed at each, closed a connection that went quiet just after a check
/// only at twice the timeout, after a UDP association's own idle limit (600 s) had
/// dropped it without the GOAWAY the wire document promises.
const IDLE_CHECKS: u32 = 4;

/// Large unary requests in flight on a connection (as decompressed) may come to this
/// many times `max_frame_len` in all (64 MiB by default) before it stops reading: see
/// [`Connection::large_over`].
const LARGE_FRAMES: usize = 4;

/// A unary request counts as large, against [`LARGE_FRAMES`], from this fraction of
/// `max_frame_len` (64 KiB by default), or when it came compressed: the slots bound
/// what the smaller ones hold together (256 × 64 KiB).
const LARGE_REQUEST_DIVISOR: usize = 256;

/// A large unary request in flight (see [`Connection::large_over`]).
struct Large {
    tag: Tag,
    /// Its size, decompressed.
    bytes: usize,
    /// Cancelled, its outcome not back yet.
    cancelled: bool,
    /// Its share of the server-wide budget, held for the call's life too (with its
    /// payload's clones): dropped with this record.
    _charge: std::sync::Arc<Charge>,
}

/// The open streams of a connection may hold this many windows (or frames, if larger)
/// of request messages in all before it stops reading: see
/// `Connection::stream_bytes_max`.
const STREAM_IN_WINDOWS: usize = 4;

/// Budgets below this are checked against the clock when their handler is about to
/// start: tokio's timers fire on millisecond ticks, so a shorter one could pass unseen
/// before the handler had run.
const SHORT_BUDGET: std::time::Duration = std::time::Duration::from_millis(2);

/// An unbounded channel made on first use. tokio's channels allocate a block of 32
/// slots when made (with these item types, 2 to 5 KiB each); most connections never
/// use some of theirs (no streaming call, no handler that waits), and an idle
/// connection should hold little (`rpc-bench-idle`).
struct LazyChannel<T> {
    pair: Option<(mpsc::UnboundedSender<T>, mpsc::UnboundedReceiver<T>)>,
    /// Made since the receiver was last polled: see [`LazyChannel::take_fresh`].
    fresh: bool,
}

impl<T> Default for LazyChannel<T> {
    fn default() -> Self {
        LazyChannel {
            pair: None,
            fresh: false,
        }
    }
}

impl<T> LazyChannel<T> {
    /// The sender, making the channel if it does not exist yet.
    fn sender(&mut self) -> &mpsc::UnboundedSender<T> {
        if self.pair.is_none() {
            self.fresh = true;
        }
        &self.pair.get_or_insert_with(mpsc::unbounded_channel).0
    }

    /// Whether `tx` sends on this channel.
    fn is_sender(&self, tx: &mpsc::UnboundedSender<T>) -> bool {
        self.pair
            .as_ref()
            .is_some_and(|(own, _)| own.same_channel(tx))
    }

    /// The next item; `Pending` (with nothing to wake on) while the channel does not
    /// exist, as nothing can have been sent.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.fresh = false;
        match &mut self.pair {
            Some((_, rx)) => rx.poll_recv(cx),
            None => Poll::Pending,
        }
    }

    /// Whether the channel was made after its receiver's last poll: its task must
    /// poll it once more before sleeping, or a send would not wake it.
    fn take_fresh(&mut self) -> bool {
        std::mem::take(&mut self.fresh)
    }
}

/// The bulk operations handlers ask the connection to send. They are rare, so a
/// locked queue that allocates when used, rather than a channel that allocates its
/// first block up front.
#[derive(Default)]
struct BulkQueue {
    /// The operations, and whether the connection ended.
    state: std::sync::Mutex<(VecDeque<BulkOp>, bool)>,
    /// Operations queued: the connection looks at this, not the lock, on every round.
    queued: std::sync::atomic::AtomicUsize,
    waker: futures::task::AtomicWaker,
}

impl BulkQueue {
    /// Queues `op`; gives it back if the connection has ended.
    fn send(&self, op: BulkOp) -> Result<(), BulkOp> {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.1 {
                return Err(op);
            }
            state.0.push_back(op);
            self.queued
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        self.waker.wake();
        Ok(())
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<BulkOp>> {
        // Registered before looking, so that a send after the look wakes the task.
        self.waker.register(cx.waker());
        if self.queued.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return Poll::Pending;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.0.pop_front() {
            Some(op) => {
                self.queued
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                Poll::Ready(Some(op))
            }
            None => Poll::Pending,
        }
    }

    /// The connection ended: later sends fail, and what is queued is dropped (its
    /// senders see their operation fail).
    fn close(&self) {
        let queued = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.1 = true;
            self.queued.store(0, std::sync::atomic::Ordering::Relaxed);
            std::mem::take(&mut state.0)
        };
        drop(queued);
    }
}

pub(crate) struct Connection<L: Link> {
    link: L,
    peer: std::sync::Arc<crate::Peer>,
    router: Router,
    config: ServerConfig,
    cache: Option<SharedCache>,
    /// The server-wide budget of large request bytes (`super::held`).
    large_budget: std::sync::Arc<LargeBudget>,
    /// The bytes of finished unary answers waiting while the link takes no more,
    /// counted server-wide (`super::held::Unsent`).
    unsent_answers: Unsent,
    /// The most a compressed request message may expand to: `max_frame_len`, or the
    /// link's lower message limit ([`Link::max_message_len`]).
    max_message_len: usize,
    /// What bounds an answer ([`AnswerLimit`]).
    answer_limit: AnswerLimit,
    /// Calls being handled or answered: the abort handle of the call's task, or `None`
    /// for a handler that finished when first polled and waits in `finished`.
    in_flight: IdMap<(u64, Option<AbortHandle>)>,
    /// Sequence number of the next request read; with the id it makes a [`Tag`], so
    /// that an outcome never answers a later request that reused its id.
    next_seq: u64,
    /// Outcomes of handlers that finished inline, in order.
    finished: VecDeque<Outcome>,
    /// Outcomes of handlers that ran as tasks (and of duplicates that waited).
    done: LazyChannel<Outcome>,
    /// Unary calls cancelled whose outcome has not come back yet (their handler may
    /// still be running): each keeps its slot until then. Every unary call's outcome
    /// comes back exactly once, as an aborted task's reports its end (see [`Sink`]).
    cancelled: usize,
    /// Keyed repeats that attached to a running call (its outcome comes back through
    /// the duplicate cache), by id: a CANCEL of one detaches its waiter from the cache.
    /// Entries of calls that ended are dropped when it grows (see [`Self::attach`]).
    attached: IdMap<(u64, CallKey)>,
    /// The attached repeats that have a deadline, with it: answered
    /// `DEADLINE_EXCEEDED` then, the call running on ([`Self::expire_waiting`]).
    /// Entries of repeats answered since are dropped when the waiting timer looks.
    attached_deadlines: Vec<(Tag, Instant)>,
    /// Requests waiting for their service to be ready, in arrival order.
    parked: VecDeque<Parked>,
    /// Frames read ahead while at the request limit, to be handled in order once
    /// below it (CANCELs and PINGs among what was read are handled at once): see
    /// [`LOOKAHEAD_FRAMES`].
    /// Each with its size and when it was read: a request's deadline counts from then
    /// (wire.md 6.6), not from when it is taken out.
    lookahead: VecDeque<(Frame, usize, Instant)>,
    /// The wire bytes of the frames in `lookahead`.
    lookahead_bytes: usize,
    /// How many frames of each call wait in `lookahead`: a CANCEL looks through it
    /// only for a call it holds (a flood of CANCELs at the limit scanned all 255
    /// frames for each, 4.5 times the CPU of one below it).
    lookahead_calls: IdMap<u32>,
    /// The frame being handled was taken out of `lookahead`: a request waited there
    /// for a slot, so its deadline is checked before it starts.
    from_lookahead: bool,
    /// Large or compressed unary requests in flight (parked or running, until their
    /// answer is written or dropped; a cancelled one until its outcome comes back, as
    /// a keyed call's handler runs on) and their size decompressed: see
    /// [`Connection::large_over`].
    large: Vec<Large>,
    /// The sum of `large`'s sizes.
    large_bytes: usize,
    /// Request-message bytes of all open streams not yet given back as credit (the sum
    /// of their `received`): past `stream_bytes_max` the connection reads nothing more
    /// until handlers read. Counted server-wide too: one that would take the server's
    /// total past its budget is refused ([`Queued`]).
    stream_bytes_in: Queued,
    /// Bytes decompressed in this wake-up's reading ([`INFLATE_BUDGET`]).
    inflated: usize,
    /// What the open streams' request messages may hold in all before the connection
    /// stops reading: [`STREAM_IN_WINDOWS`] times the larger of a stream's window and
    /// a frame (each stream may hold its window plus one message), so that many streams
    /// whose handlers do not read cannot each fill theirs.
    stream_bytes_max: usize,
    /// A finished handler's outcome, or a stream's event, waiting for the link.
    ready: Option<Ready>,
    /// Streaming calls, by id.
    streams: IdMap<ServerStream>,
    streams_out: LazyChannel<(Tag, StreamOut)>,
    /// Bytes of stream messages handed to this connection and not yet written or
    /// dropped, all streams together.
    out_budget: std::sync::Arc<OutputBudget>,
    /// The compression algorithms the client said it accepts (taken only when we
    /// compress; empty otherwise).
    peer_accepts: crate::compress::Accepted,
    /// Calls whose request advertised compression: their answer advertises ours.
    advertise: IdSet,
    /// Buffers the handlers exposed, served to the client; their bulk operations.
    regions: std::sync::Arc<Regions>,
    bulk: BulkEnd,
    bulk_ops: std::sync::Arc<BulkQueue>,
    /// Handed to every call (`Request::bulk`).
    bulk_handle: Bulk,
    /// Frames answered by the connection itself (errors, PONG, GOAWAY).
    control: VecDeque<(BytesMut, Payload)>,
    /// Bytes in `control`: see [`MAX_CONTROL_BYTES`].
    control_bytes: usize,
    scratch: BytesMut,
    needs_flush: bool,
    /// The methods of recent requests, checked once, with the service each routes to.
    methods: MethodCache,
    /// Highest request id received.
    last_id: u64,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    /// The token `shutdown` waits on, whose flag is cheaper to read than polling.
    shutdown_token: CancellationToken,
    /// The waker `shutdown` was last polled with: while the task's waker is the same,
    /// its registration stands (a cancellation wakes the task) and the token's flag
    /// says all; polling took two mutexes, ~170 instructions a round.
    shutdown_waker: Option<std::task::Waker>,
    /// The server's shutdown ended this connection (see [`SHUTDOWN_CLOSE_GRACE`]).
    shutdown_seen: bool,
    /// The `last_id` of the first GOAWAY sent, once one was: over a link that may
    /// deliver a request more than once, a copy of one up to it, arriving after, is
    /// handled as before it.
    goaway_sent: Option<u64>,
    /// Over a link that may deliver a request more than once: the last
    /// [`REFUSALS_KEPT`] requests answered here without running (their id and the
    /// status), so that a later copy of one gets the same answer instead of a run the
    /// client was told never happened (see [`Self::queue_status`]). Empty over
    /// reliable links.
    refused: VecDeque<(u64, Status)>,
    /// What the transport verified of the peer, hashed once for the duplicate cache's
    /// keys ([`super::dedupe::peer_of`]).
    peer_key: u64,
    /// Set when the connection must end once `control` is written (protocol error,
    /// idle timeout); holds the reason for the log.
    closing: Option<String>,
    /// Armed when `closing` is set, and when a drain (or an eviction) has nothing left
    /// but writing: see [`CLOSE_GRACE`] and [`SHUTDOWN_CLOSE_GRACE`].
    close_deadline: Option<Pin<Box<Sleep>>>,
    /// Fires at the earliest deadline of the requests that wait, parked for their
    /// service or read ahead at the request limit ([`Self::poll_waiting`]), with that
    /// deadline.
    waiting_timer: Option<(Instant, Pin<Box<Sleep>>)>,
    /// Checks for idleness every [`IDLE_CHECKS`]th of the idle timeout.
    idle: Option<LazySleep>,
    /// A frame arrived since the idle timer was last armed.
    active: bool,
    /// Idle checks in a row that found the connection quiet.
    quiet: u32,
    /// PINGs after silence (`None`: off, or the link does not carry PINGs).
    keepalive: Option<KeepaliveTimer>,
    /// A frame arrived since the keepalive timer was last armed.
    heard: bool,
    /// Since the keepalive timer was last armed, silence was excused because reading
    /// had stopped at this side's own limits: the timer then sends a PING all the same
    /// (a nudge), whose answer is not awaited.
    excused: bool,
    /// A frame of the control queue went to the link since the keepalive last looked:
    /// while reading is stopped at the control bound, the sign that the client reads.
    control_moved: bool,
    /// Frames handed to the link and its measure of what it has not written
    /// ([`Link::unsent`]), when the keepalive last looked: unchanged while the link
    /// holds unwritten bytes, and on a reliable link, the client is not reading.
    writes_seen: (u64, u64),
    /// The same when they last changed (or had nothing unwritten), as seen at the
    /// keepalive timer's firings, and when (see [`MIN_WRITE_STALL`](crate::keepalive::MIN_WRITE_STALL)).
    write_stall: crate::keepalive::WriteStall<(u64, u64)>,
    /// The tolerance of client PINGs (`None`: any rate).
    ping_guard: Option<PingGuard>,
    /// The link wants a unary answer's trailers apart from its headers
    /// ([`Link::splits_trailers`]).
    splits_trailers: bool,
    /// When the frames of the current read batch were read: one clock read for every
    /// request of a batch (see [`Connection::received`]).
    read_at: Option<Instant>,
    /// A handler was polled here, in this task, since `read_at` (or the clock) was last
    /// read: the time it took is not in `read_at`, so a request with a deadline reads
    /// the clock before it starts (`dispatch`).
    polled_since_clock: bool,
    /// The last read stopped because the link had nothing more (its `poll_recv` left
    /// `Pending`, with this task's waker), not at a bound: writing cannot make it
    /// readable again unless the link reads while writing.
    read_parked: bool,
    /// The clock as `dispatch` last read it in this batch, for the requests after it
    /// while no handler has been polled since.
    checked_at: Option<Instant>,
    /// What this connection carried so far, published into `counters` once per poll.
    counts: Counts,
    counters: std::sync::Arc<ConnectionCounters>,
    /// Its place among the server's open connections, left when the task ends.
    _registered: Entry,
    /// The keyed handlers of its `serve`, which outlive this connection (see
    /// [`until_unattended`]): counted for the drain, stopped when the serve ends.
    keyed: std::sync::Arc<KeyedRuns>,
}

impl<L: Link> Connection<L> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        link: L,
        router: Router,
        config: ServerConfig,
        cache: Option<SharedCache>,
        large_budget: std::sync::Arc<LargeBudget>,
        shutdown: CancellationToken,
        keyed: std::sync::Arc<KeyedRuns>,
        registry: &std::sync::Arc<super::stats::Registry>,
    ) -> Self {
        let bulk_ops = std::sync::Arc::new(BulkQueue::default());
        let bulk_tx = bulk_ops.clone();
        let regions = std::sync::Arc::new(Regions::default());
        let one_sided: bulk::OneSidedSlot =
            std::sync::Arc::new(std::sync::RwLock::new(link.one_sided()));
        let bulk_handle = Bulk::new(
            regions.clone(),
            std::sync::Arc::new(move |op| bulk_tx.send(op)),
            one_sided,
            config.link.max_frame_len,
        );
        let idle = config
            .idle_timeout
            .map(|timeout| LazySleep::new(timeout / IDLE_CHECKS));
        let keepalive = link
            .carries_ping()
            .then(|| KeepaliveTimer::new(config.keepalive, link.is_reliable()))
            .flatten();
        let ping_guard = config.keepalive_min_interval.map(PingGuard::new);
        let splits_trailers = link.splits_trailers();
        let peer = std::sync::Arc::new(link.peer_info());
        let peer_key = super::dedupe::peer_of(&peer);
        // The server's shutdown ends it, and so does its eviction at the connection
        // limit (`Registry::evict_quiet`).
        let shutdown = shutdown.child_token();
        let registered = registry.open(peer.clone(), shutdown.clone(), regions.clone());
        // A compressed message expands to no more than the link accepts (gRPC's
        // message limit), nor than `max_frame_len`.
        let max_message_len = link
            .max_message_len()
            .map_or(config.link.max_frame_len, |max| {
                max.min(config.link.max_frame_len)
            });
        let answer_limit = match link.max_message_len() {
            Some(_) => AnswerLimit::Message(max_message_len),
            None => AnswerLimit::Frame(config.link.max_frame_len),
        };
        let stream_bytes_max = {
            let unit = config.link.max_frame_len.max(config.stream_window as usize);
            STREAM_IN_WINDOWS.saturating_mul(unit)
        };
        Connection {
            counters: registered.counters(),
            _registered: registered,
            read_at: None,
            polled_since_clock: false,
            read_parked: false,
            checked_at: None,
            counts: Counts::default(),
            peer,
            link,
            router,
            config,
            cache,
            stream_bytes_in: Queued::new(large_budget.clone()),
            unsent_answers: Unsent::new(large_budget.clone()),
            large_budget,
            max_message_len,
            answer_limit,
            in_flight: IdMap::default(),
            next_seq: 0,
            finished: VecDeque::new(),
            done: LazyChannel::default(),
            cancelled: 0,
            attached: IdMap::default(),
            attached_deadlines: Vec::new(),
            parked: VecDeque::new(),
            lookahead: VecDeque::new(),
            lookahead_calls: IdMap::default(),
            lookahead_bytes: 0,
            from_lookahead: false,
            large: Vec::new(),
            large_bytes: 0,
            inflated: 0,
            stream_bytes_max,
            ready: None,
            streams: IdMap::default(),
            streams_out: LazyChannel::default(),
            out_budget: std::sync::Arc::default(),
            peer_accepts: crate::compress::Accepted::default(),
            advertise: IdSet::default(),
            regions,
            bulk: BulkEnd::default(),
            bulk_ops,
            bulk_handle,
            control: VecDeque::new(),
            control_bytes: 0,
            scratch: BytesMut::with_capacity(256),
            needs_flush: false,
            methods: MethodCache::default(),
            last_id: 0,
            shutdown: Box::pin(shutdown.clone().cancelled_owned()),
            shutdown_token: shutdown,
            shutdown_waker: None,
            shutdown_seen: false,
            goaway_sent: None,
            keyed,
            refused: VecDeque::new(),
            peer_key,
            closing: None,
            close_deadline: None,
            waiting_timer: None,
            idle,
            active: false,
            quiet: 0,
            keepalive,
            heard: false,
            excused: false,
            control_moved: false,
            writes_seen: (0, 0),
            write_stall: crate::keepalive::WriteStall::new(),
            ping_guard,
            splits_trailers,
        }
    }

    /// Whether an outcome answers the request that is in flight under its id now (and
    /// not an earlier request, cancelled, whose id the client reused).
    fn is_current(&self, tag: Tag) -> bool {
        self.in_flight
            .get(&tag.id)
            .is_some_and(|&(seq, _)| seq == tag.seq)
    }

    /// Ends the request in flight under `tag.id` if it is `tag`'s: whether it was (one
    /// table operation for the check and the removal, on every answer's path).
    /// Forgets the large-request record of call `tag`, if it has one, and with it the
    /// call's charge of the server-wide budget: at every end of a unary call that had
    /// one (answered, refused before it ran, cancelled while parked, its cancelled
    /// outcome back). Records left for `large_over` to tidy kept their charges: a
    /// client sending large requests that are refused unrun (a deadline of a
    /// microsecond) pinned 64 MiB of the budget per connection.
    fn release_large(&mut self, tag: Tag) {
        if !self.large.is_empty() {
            if let Some(at) = self.large.iter().position(|l| l.tag == tag) {
                self.large_bytes -= self.large.swap_remove(at).bytes;
            }
        }
    }

    fn take_current(&mut self, tag: Tag) -> bool {
        match self.in_flight.entry(tag.id) {
            std::collections::hash_map::Entry::Occupied(entry) if entry.get().0 == tag.seq => {
                entry.remove();
                // A large request's record goes as its answer goes to the link, and
                // with it its charge of the server-wide budget.
                self.release_large(tag);
                true
            }
            _ => false,
        }
    }

    /// Whether the large unary requests in flight (those of at least a
    /// [`LARGE_REQUEST_DIVISOR`]th of the largest frame, and every compressed one, as
    /// decompressed) come to at least [`LARGE_FRAMES`] times the largest frame. Their
    /// count alone (the slots) would let a peer that pipelines 16 MiB requests, or a
    /// few kilobytes of gzip that stand for 16 MiB each, and never reads the answers,
    /// make the connection hold gigabytes (an echo's answer is its request's bytes).
    /// The connection then reads nothing more until calls end. Entries of calls that
    /// have ended are dropped here, when the sum is over, not on each way a call can
    /// end.
    fn large_over(&mut self) -> bool {
        let limit = LARGE_FRAMES.saturating_mul(self.config.link.max_frame_len);
        // Also tidied when the list outgrows the calls that can be in flight, so that
        // small compressed requests do not grow it without bound.
        let most = 2 * self.config.max_concurrent_requests + 64;
        if self.large_bytes < limit && self.large.len() <= most {
            return false;
        }
        let (in_flight, parked) = (&self.in_flight, &self.parked);
        let mut released = 0;
        self.large.retain(|large| {
            let tag = large.tag;
            let live = large.cancelled
                || in_flight
                    .get(&tag.id)
                    .is_some_and(|(seq, _)| *seq == tag.seq)
                || parked.iter().any(|p| p.tag == tag);
            if !live {
                released += large.bytes;
            }
            live
        });
        self.large_bytes -= released;
        self.large_bytes >= limit
    }

    /// Forgets stream `id`, and the request-message bytes it held against
    /// `stream_bytes_max`. Whether it was open.
    fn remove_stream(&mut self, id: u64) -> bool {
        match self.streams.remove(&id) {
            Some(stream) => {
                self.stream_bytes_in
                    .sub(usize::try_from(stream.received).unwrap_or(0));
                true
            }
            None => false,
        }
    }

    /// Requests holding a slot of `max_concurrent_requests` (open streams hold none; a
    /// parked stream does).
    fn busy(&self) -> usize {
        self.in_flight.len().saturating_sub(self.streams.len()) + self.parked.len() + self.cancelled
    }

    /// Remembers that `tag` attached to the running call `key`. Entries of repeats that
    /// were answered since are dropped once there are more than calls can be in flight
    /// (an entry is live while `in_flight` holds its id with its sequence number).
    fn attach(&mut self, tag: Tag, key: CallKey, deadline: Option<Instant>) {
        if self.attached.len() > 2 * self.config.max_concurrent_requests + 64 {
            let in_flight = &self.in_flight;
            self.attached
                .retain(|id, (seq, _)| in_flight.get(id).is_some_and(|(s, _)| s == seq));
        }
        self.attached.insert(tag.id, (tag.seq, key));
        if let Some(deadline) = deadline {
            self.attached_deadlines.push((tag, deadline));
        }
    }

    /// Takes a cancelled repeat's waiter off the running call it attached to, so that
    /// a client that repeats a slow call and cancels each repeat holds neither a slot
    /// per repeat nor a place among the call's waiters (which are bounded: at the bound
    /// a genuine retry is refused). Whether it was taken off: if not (it was never
    /// attached, or the call has finished and its outcome is on its way here), the
    /// outcome comes back and is counted as a cancelled call's.
    fn detach(&mut self, tag: Tag) -> bool {
        let Some((seq, key)) = self.attached.remove(&tag.id) else {
            return false;
        };
        if seq != tag.seq {
            return false;
        }
        let (Some(cache), Some(done)) = (&self.cache, self.done.pair.as_ref()) else {
            return false;
        };
        let detached = cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .detach(&key, |(tx, t)| *t == tag && tx.same_channel(&done.0));
        detached > 0
    }

    /// An outcome came back for a call that is no longer in flight: it was cancelled,
    /// and its slot is free now, as are the request bytes its handler held.
    fn forget_cancelled(&mut self, tag: Tag) {
        debug_assert!(self.cancelled > 0, "an outcome nobody counted");
        self.cancelled = self.cancelled.saturating_sub(1);
        self.release_large(tag);
    }

    /// Drops an event of a stream that ended or was cancelled, releasing what its
    /// message held of the connection's budget.
    fn drop_stream_event(&self, event: StreamOut) {
        if let StreamOut::Message(message, _) = event {
            if self.out_budget.release(message_cost(message.len())) {
                self.wake_streams();
            }
        }
    }

    /// The connection's stream budget has room again: wake the producers waiting for it.
    fn wake_streams(&self) {
        for stream in self.streams.values() {
            stream.credit.wake();
        }
    }

    /// Queues a frame the connection answers by itself; none once the GOAWAY that
    /// closes the connection is queued (nothing follows it, docs/wire.md 6.4).
    fn push_control(&mut self, header: BytesMut, payload: Payload) {
        if self.closing.is_some() {
            return;
        }
        self.control_bytes += header.len() + payload.len();
        self.control.push_back((header, payload));
    }

    /// Why the GOAWAY of a drain was sent, for it and for the requests refused after
    /// it: the server's shutdown, or this connection's eviction at the limit.
    fn drain_reason(&self) -> &'static str {
        if self.counters.evicted() {
            EVICTED
        } else {
            SHUTTING_DOWN
        }
    }

    fn queue_goaway(&mut self, code: GoAwayCode, reason: &str) {
        let mut buf = BytesMut::new();
        frame::encode_goaway(&mut buf, self.last_id, code, reason);
        self.push_control(buf, Payload::new());
        self.goaway_sent.get_or_insert(self.last_id);
    }

    fn close_with(&mut self, code: GoAwayCode, reason: String) {
        if self.closing.is_none() {
            if code == GoAwayCode::NO_ERROR {
                tracing::debug!(peer = %self.peer, %code, %reason, "GOAWAY sent: closing the connection");
            } else {
                // The peer broke the protocol (or a limit): what it sent is in `reason`.
                // Counted always; logged within a bound, as peers choose how often.
                self._registered.count_refusal();
                static REFUSALS: crate::logs::LogLimiter = crate::logs::LogLimiter::for_refusals();
                if let Some(suppressed) = REFUSALS.allow() {
                    tracing::info!(peer = %self.peer, %code, %reason, suppressed, "GOAWAY sent: refusing the peer, closing the connection");
                }
            }
            self.queue_goaway(code, &reason);
            self.closing = Some(reason);
            self.close_deadline = Some(Box::pin(tokio::time::sleep(self.close_grace())));
        }
    }

    /// How long a closing connection waits for the peer: [`CLOSE_GRACE`], or the idle
    /// timeout if shorter.
    fn close_grace(&self) -> std::time::Duration {
        let grace = if self.shutdown_seen {
            SHUTDOWN_CLOSE_GRACE
        } else {
            CLOSE_GRACE
        };
        self.config
            .idle_timeout
            .map_or(grace, |idle| idle.min(grace))
    }

    fn queue_status(&mut self, id: u64, status: &Status) {
        if !self.link.is_reliable() {
            // A copy of this request (a retransmission, or the network's) may come
            // after this answer: it gets the same one. A refusal such as "keyed calls
            // at their bound; not run" holds only at this moment, and the copy then
            // ran, after the client had completed the call as not run on the first
            // answer (from a review). Ids are per attempt, so a retry is not affected.
            if self.refused.len() >= REFUSALS_KEPT {
                self.refused.pop_front();
            }
            self.refused.push_back((id, status.clone()));
        }
        self.push_status(id, status);
    }

    /// Whether request `id` is a copy of one answered without running
    /// ([`Self::queue_status`]): then it gets the same answer again, as the first may
    /// have been lost. Out of line: the request path only tests whether there are any.
    #[cold]
    #[inline(never)]
    fn refuse_copy(&mut self, id: u64) -> bool {
        let Some((_, status)) = self.refused.iter().rev().find(|(r, _)| *r == id) else {
            return false;
        };
        let status = status.clone();
        tracing::trace!(peer = %self.peer, id, "copy of a refused request refused again");
        self.push_status(id, &status);
        true
    }

    /// Queues a RESPONSE of `status` for `id` (see [`Self::queue_status`]).
    fn push_status(&mut self, id: u64, status: &Status) {
        let mut buf = BytesMut::new();
        frame::encode_response_header(
            &mut buf,
            id,
            status.code(),
            status.message(),
            status.details(),
            status.metadata(),
        );
        self.push_control(buf, Payload::new());
    }

    /// Writes control frames and finished responses while the link takes them.
    /// Returns whether it freed a read slot (wrote a response or a queued answer).
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Result<bool, Error> {
        let mut freed = false;
        loop {
            if self.closing.is_some() && self.control.is_empty() {
                // The GOAWAY that closes the connection is written: nothing follows it
                // (docs/wire.md 6.4), not even answers that were ready.
                break;
            }
            if self.control.is_empty() && self.ready.is_none() {
                if let Some((tag, outcome)) = self.finished.pop_front() {
                    if self.is_current(tag) {
                        self.ready = Some(Ready::Outcome((tag, outcome)));
                    } else {
                        self.forget_cancelled(tag);
                        freed = true;
                    }
                    continue;
                }
                match self.done.poll_recv(cx) {
                    Poll::Ready(Some((tag, outcome))) => {
                        if self.is_current(tag) {
                            self.ready = Some(Ready::Outcome((tag, outcome)));
                        } else {
                            // Cancelled: the answer is dropped, never written.
                            self.forget_cancelled(tag);
                            freed = true;
                        }
                        continue;
                    }
                    // Its sender lives in `self`, so the channel never closes.
                    Poll::Ready(None) | Poll::Pending => {}
                }
                if let Poll::Ready(Some(op)) = self.bulk_ops.poll_recv(cx) {
                    self.ready = Some(Ready::Bulk(op));
                    continue;
                }
                if self.streams.is_empty() && self.out_budget.unsent() == 0 {
                    // No stream open and no message held: whatever is queued there is a
                    // few stale events of ended streams; skip the poll on this path that
                    // unary calls take.
                    break;
                }
                match self.streams_out.poll_recv(cx) {
                    Poll::Ready(Some((tag, StreamOut::Credit))) => {
                        if self.is_current(tag) {
                            if let Some(stream) = self.streams.get_mut(&tag.id) {
                                let taken =
                                    stream.returned.swap(0, std::sync::atomic::Ordering::AcqRel);
                                if taken == 0 {
                                    continue;
                                }
                                // At most what was received: a window and a message.
                                let bytes = u32::try_from(taken).unwrap_or(u32::MAX);
                                stream.received -= i64::from(bytes);
                                self.stream_bytes_in.sub(bytes as usize);
                                // Room for the connection to read again, if it had
                                // stopped at the streams' bound.
                                freed = true;
                                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
                                frame::encode_window(&mut buf, tag.id, bytes.max(1));
                                self.push_control(buf, Payload::new());
                            }
                        }
                        continue;
                    }
                    Poll::Ready(Some((tag, event))) => {
                        if self.is_current(tag) {
                            self.ready = Some(Ready::Stream(tag, event));
                        } else {
                            self.drop_stream_event(event);
                        }
                        continue;
                    }
                    Poll::Ready(None) | Poll::Pending => break,
                }
            }
            match self.link.poll_ready(cx) {
                Poll::Pending => {
                    freed |= self.hold_answers(cx)?;
                    break;
                }
                Poll::Ready(result) => result?,
            }
            if let Some((header, payload)) = self.control.pop_front() {
                self.control_bytes -= header.len() + payload.len();
                self.control_moved = true;
                self.counts.sent(header.len() + payload.len());
                self.link.start_send(&header, payload)?;
                self.needs_flush = true;
                freed = true; // queued answers count against the read limit too
                continue;
            }
            // Checked again: a CANCEL read while this waited for the link ended the call,
            // and its id may belong to a new request by now.
            let (Tag { id, .. }, outcome) = match self.ready.take() {
                None => continue,
                Some(Ready::Outcome((tag, outcome))) => {
                    if !self.take_current(tag) {
                        // Cancelled while it waited for the link.
                        self.forget_cancelled(tag);
                        freed = true;
                        continue;
                    }
                    (tag, outcome)
                }
                Some(Ready::Stream(tag, event)) => {
                    if self.is_current(tag) {
                        freed |= self.write_stream_event(tag, event)?;
                    } else {
                        self.drop_stream_event(event);
                    }
                    continue;
                }
                Some(Ready::Bulk(op)) if !self.link.carries_bulk() => {
                    let peer = self.link.peer();
                    let _ = op.reply.send(Err(bulk::not_carried(&peer)));
                    continue;
                }
                Some(Ready::Bulk(op)) => {
                    let payload = self.bulk.send(op, &mut self.scratch);
                    self.counts.sent(self.scratch.len() + payload.len());
                    self.link.start_send(&self.scratch, payload)?;
                    self.needs_flush = true;
                    continue;
                }
            };
            freed = true;
            let mut outcome = self.prepare_reply(id, outcome);
            if self.splits_trailers {
                self.send_unary_headers(id, &mut outcome)?;
            }
            let payload = encode_outcome(
                &mut self.scratch,
                id,
                outcome,
                self.answer_limit,
                self.config.decode.max_metadata_len,
            );
            self.counts.sent(self.scratch.len() + payload.len());
            self.link.start_send(&self.scratch, payload)?;
            self.needs_flush = true;
        }
        if self.needs_flush {
            if let Poll::Ready(result) = self.link.poll_flush(cx) {
                result?;
                self.needs_flush = false;
            }
        }
        if self.unsent_answers.get() != 0 {
            // Counted while the link was full: what is left now. (Not checked against
            // the bound here: answers leaving are the client reading.)
            let _ = self.unsent_answers.set(self.unsent_answer_bytes());
        }
        Ok(freed)
    }

    /// The link takes no more: takes the answers that finished in from their channel,
    /// and counts them all against the server's bound on unread answers
    /// ([`Unsent`]); `Err` ends the connection when it holds more than its share of an
    /// exceeded bound. Returns whether it freed a read slot (an answer of a call
    /// cancelled meanwhile, dropped).
    fn hold_answers(&mut self, cx: &mut Context<'_>) -> Result<bool, Error> {
        let mut freed = false;
        while let Poll::Ready(Some((tag, outcome))) = self.done.poll_recv(cx) {
            if self.is_current(tag) {
                self.finished.push_back((tag, outcome));
            } else {
                self.forget_cancelled(tag);
                freed = true;
            }
        }
        let held = self.unsent_answer_bytes();
        self.unsent_answers
            .set(held)
            .map_err(|why| Error::new(ErrorKind::LimitReached, why))?;
        Ok(freed)
    }

    /// The payload bytes of the finished unary answers this connection holds.
    fn unsent_answer_bytes(&self) -> usize {
        let len = |outcome: &super::Outcome| match outcome {
            Ok(reply) => reply.payload.len(),
            Err(status) => status.message().len() + status.details().len(),
        };
        let ready = match &self.ready {
            Some(Ready::Outcome((_, outcome))) => len(outcome),
            _ => 0,
        };
        ready + self.finished.iter().map(|(_, o)| len(o)).sum::<usize>()
    }

    /// Reads frames while below the concurrency limit. Returns `Ok(false)` at a clean
    /// end of stream.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Result<bool, Error> {
        self.read_parked = false;
        self.read_at = None;
        self.polled_since_clock = false;
        self.checked_at = None;
        for _ in 0..READ_BUDGET {
            if self.inflated >= INFLATE_BUDGET {
                break; // yields, below
            }
            // Answers the connection queues itself (errors, PONGs) count against the limit
            // too, so a peer that sends but never reads cannot grow the queue without bound.
            let at_limit = self.busy() + self.control.len() >= self.config.max_concurrent_requests;
            // The streams' request messages at their bound: like the request limit, it
            // waits for handlers, and the WINDOWs read ahead may be what lets them go
            // on (a handler waiting for credit to answer reads no more requests).
            let streams_full = self.stream_bytes_in.get() >= self.stream_bytes_max;
            let other_bound = self.closing.is_some()
                || self.control_bytes >= MAX_CONTROL_BYTES
                || (self.large_bytes > 0 && self.large_over());
            if at_limit || streams_full || other_bound {
                // At the request limit or the streams' bound, a little is read ahead to
                // find CANCELs, WINDOWs (and PINGs) behind the frames that wait: a call
                // cancelled then frees its slot instead of running until its handler
                // ends, and a stream given credit can answer, then read on.
                if !other_bound
                    && self.lookahead.len() < LOOKAHEAD_FRAMES
                    && self.lookahead_bytes < LOOKAHEAD_BYTES
                {
                    match self.read_frame(cx)? {
                        Read::Pending | Read::Closing => return Ok(true),
                        Read::End => return Ok(false),
                        Read::Nothing => continue,
                        Read::Frame(frame, len) => {
                            self.read_ahead(cx, frame, len);
                            continue;
                        }
                    }
                }
                // Not reading, the link's end would go unseen: a client gone while its
                // streams' handlers wait for credit it will never give kept them, and
                // the connection, for ever.
                if let Poll::Ready(err) = self.link.poll_gone(cx) {
                    // Closing already, over a byte stream whose peer only closed its
                    // sending side: the GOAWAY that says why still goes out (a peer
                    // that sent a bad frame and shut down writing may well read on),
                    // then `poll_close` ends the connection, within its grace.
                    if self.closing.is_none() || !self.link.half_closes() {
                        return Err(err);
                    }
                }
                return Ok(true);
            }
            if let Some((frame, len, read_at)) = self.lookahead.pop_front() {
                self.lookahead_bytes -= len;
                if let Some(id) = frame_call(&frame) {
                    if let std::collections::hash_map::Entry::Occupied(mut held) =
                        self.lookahead_calls.entry(id)
                    {
                        *held.get_mut() -= 1;
                        if *held.get() == 0 {
                            held.remove();
                        }
                    }
                }
                // This frame's reading time, for it alone: the next frame of the batch
                // reads the clock again.
                self.read_at = Some(read_at);
                self.from_lookahead = true;
                self.on_frame(cx, Ok(frame));
                self.from_lookahead = false;
                self.read_at = None;
                continue;
            }
            // The hot path: read and decode straight into `on_frame` (going through
            // `read_frame` moved the frame twice more: about 200 instructions a call).
            let received = match self.link.poll_recv_frame(cx) {
                Poll::Pending => {
                    self.read_parked = true;
                    return Ok(true);
                }
                Poll::Ready(None) => return Ok(false),
                Poll::Ready(Some(Err(err))) if err.kind() == ErrorKind::FrameTooLarge => {
                    self.close_with(GoAwayCode::FRAME_TOO_LARGE, err.message().to_owned());
                    return Ok(true);
                }
                Poll::Ready(Some(Err(err))) => return Err(err),
                Poll::Ready(Some(Ok(received))) => received,
            };
            self.active = true;
            self.heard = true;
            let frame = match received {
                Received::Bytes(bytes) => {
                    self.counts.received(bytes.len());
                    Frame::decode_cached(bytes, &self.config.decode, &mut self.methods)
                }
                Received::Frame { frame, len } => {
                    self.counts.received(len);
                    Ok(*frame)
                }
                // A client link's signal; no server link sends it.
                Received::Refused { .. } => continue,
                Received::Stopped { id, code } => {
                    self.on_stopped(id, code);
                    continue;
                }
            };
            self.on_frame(cx, frame);
        }
        cx.waker().wake_by_ref();
        Ok(true)
    }

    /// Reads and decodes the link's next frame (for the look-ahead; `poll_read`'s own
    /// loop does the same inline).
    fn read_frame(&mut self, cx: &mut Context<'_>) -> Result<Read, Error> {
        let received = match self.link.poll_recv_frame(cx) {
            Poll::Pending => return Ok(Read::Pending),
            Poll::Ready(None) => return Ok(Read::End),
            Poll::Ready(Some(Err(err))) if err.kind() == ErrorKind::FrameTooLarge => {
                self.close_with(GoAwayCode::FRAME_TOO_LARGE, err.message().to_owned());
                return Ok(Read::Closing);
            }
            Poll::Ready(Some(Err(err))) => return Err(err),
            Poll::Ready(Some(Ok(received))) => received,
        };
        let (frame, len) = match received {
            Received::Bytes(bytes) => {
                let len = bytes.len();
                let frame = Frame::decode_cached(bytes, &self.config.decode, &mut self.methods);
                (frame, len)
            }
            Received::Frame { frame, len } => (Ok(*frame), len),
            Received::Refused { .. } => return Ok(Read::Nothing),
            // Handled at once, as a CANCEL read ahead is.
            Received::Stopped { id, code } => {
                self.on_stopped(id, code);
                return Ok(Read::Nothing);
            }
        };
        self.counts.received(len);
        self.active = true;
        self.heard = true;
        Ok(Read::Frame(frame, len))
    }

    /// A frame read at the request limit or the streams' bound: a CANCEL (which also
    /// drops what was read ahead of its call), a WINDOW for a stream that is open (not
    /// one whose REQUEST waits in the look-ahead), a BULK_REPLY (which ends a
    /// handler's wait: its handler holds a slot), an undecodable frame, and a PING
    /// while fewer than [`LOOKAHEAD_PONGS`] answers wait are handled at once; anything
    /// else waits in the look-ahead, in order (a PING past that bound too: PONGs
    /// answered at once would otherwise grow the control queue with nothing to stop
    /// the reading).
    fn read_ahead(&mut self, cx: &mut Context<'_>, frame: Result<Frame, FrameError>, len: usize) {
        match frame {
            frame @ Ok(Frame::Window { id, .. }) if self.streams.contains_key(&id) => {
                self.on_frame(cx, frame)
            }
            Ok(Frame::Cancel { id }) => self.on_stopped(id, crate::Code::CANCELLED),
            frame @ (Ok(Frame::BulkReply(_)) | Err(_)) => self.on_frame(cx, frame),
            frame @ Ok(Frame::Ping { .. }) if self.control.len() < LOOKAHEAD_PONGS => {
                self.on_frame(cx, frame)
            }
            Ok(frame) => {
                self.lookahead_bytes += len;
                if let Some(id) = frame_call(&frame) {
                    *self.lookahead_calls.entry(id).or_default() += 1;
                }
                let read_at = self.received();
                self.lookahead.push_back((frame, len, read_at));
            }
        }
    }

    /// A CANCEL, or the link's [`Received::Stopped`] (`code`), read at any time: the
    /// call's frames read ahead go, and the call with them ([`Self::on_cancel`]).
    fn on_stopped(&mut self, id: u64, code: crate::Code) {
        self.forget_read_ahead(id);
        self.on_cancel(id, code);
    }

    /// Drops the frames of call `id` read ahead (at its CANCEL, or its deadline while
    /// its request waited there).
    fn forget_read_ahead(&mut self, id: u64) {
        if self.lookahead_calls.remove(&id).is_some() {
            self.lookahead
                .retain(|(frame, _, _)| frame_call(frame) != Some(id));
            self.lookahead_bytes = self.lookahead.iter().map(|(_, len, _)| len).sum();
        }
    }

    /// Handles one frame the peer sent.
    fn on_frame(&mut self, cx: &mut Context<'_>, frame: Result<Frame, FrameError>) {
        match frame {
            Ok(Frame::Request(request)) => self.on_request(cx, request),
            Ok(Frame::Data(data)) => self.on_stream_data(data),
            Ok(Frame::Bulk(op)) => {
                let (header, payload) =
                    bulk::serve(&self.regions, op, self.config.link.max_frame_len);
                self.push_control(header, payload);
            }
            Ok(Frame::BulkReply(reply)) => self.bulk.on_reply(reply),
            Ok(Frame::Window { id, increment }) => match self.streams.get(&id) {
                Some(stream) => stream.credit.add(increment),
                // For no open stream: no progress of a call (`evict_stalled_after`).
                None => self.counts.keepalive += 1,
            },
            Ok(Frame::Cancel { id }) => self.on_cancel(id, crate::Code::CANCELLED),
            Ok(Frame::Ping { id, .. })
                if self
                    .ping_guard
                    .as_mut()
                    .is_some_and(|guard| !guard.on_ping(id, Instant::now())) =>
            {
                self.close_with(
                    GoAwayCode::TOO_MANY_PINGS,
                    "too many pings: the client pings more often than the server's \
                     keepalive_min_interval allows"
                        .into(),
                );
            }
            Ok(Frame::Ping { id, payload }) => {
                // The PING and its PONG: no progress of the calls (`evict_stalled_after`).
                self.counts.keepalive += 2;
                // The PONG's bytes count against `MAX_CONTROL_BYTES`: a peer that
                // sends PINGs and reads no PONGs is soon not read either.
                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
                frame::encode_ping_header(&mut buf, id, true);
                self.push_control(buf, payload.into());
            }
            Ok(Frame::Pong { .. }) => self.counts.keepalive += 1,
            Ok(Frame::GoAway(goaway)) => {
                // The peer's text, cut to 1 KiB and escaped (`?`): a reason with line
                // ends forged log lines, and 60 KiB ones flooded the log (from a review).
                let reason = frame::clip(&goaway.reason, 1024);
                tracing::debug!(peer = %self.peer, code = %goaway.code, ?reason, "client sent GOAWAY");
            }
            Ok(Frame::Response(_)) => self.close_with(
                GoAwayCode::PROTOCOL_ERROR,
                "client sent a RESPONSE frame".into(),
            ),
            Err(err) => self.close_with(err.goaway_code(), err.to_string()),
        }
    }

    /// A CANCEL: drops a parked request, aborts a running handler. A cancelled unary
    /// call keeps its slot until its outcome comes back (at once for an aborted task;
    /// when the handler ends for a keyed call, which runs on for its retries); the
    /// outcome is then dropped, never written. A cancelled stream's messages still
    /// queued are dropped as they come up.
    fn on_cancel(&mut self, id: u64, code: crate::Code) {
        if !self.in_flight.contains_key(&id) && !self.parked.iter().any(|p| p.tag.id == id) {
            // For no call: no progress of one (`evict_stalled_after`).
            self.counts.keepalive += 1;
        }
        let mut parked = false;
        if let Some(at) = self.parked.iter().position(|p| p.tag.id == id) {
            if let Some(request) = self.parked.remove(at) {
                self.release_large(request.tag);
                self.abandon(
                    request.key.as_ref(),
                    request.tag,
                    "cancelled before it started",
                );
            }
            parked = true;
        }
        // The handler is stopped before its request stream is dropped: dropped first,
        // it woke the handler, which on another worker could run before the abort and
        // end "without being cancelled", its request stream reading as a connection
        // gone (an interop test saw it over soft RDMA under load). A handler that runs
        // on (a keyed call's) reads that the client cancelled.
        let handle = self
            .in_flight
            .get_mut(&id)
            .and_then(|(_, handle)| handle.take());
        if let Some(handle) = &handle {
            self.stop_handler(id, handle, code);
        }
        if let Some(feed) = self.streams.get_mut(&id).and_then(|s| s.feed.take()) {
            feed.end(Err(if code == crate::Code::CANCELLED {
                Status::cancelled("the client cancelled the call")
            } else {
                Status::new(code, "the server's transport ended the call")
            }));
        }
        let stream = self.remove_stream(id);
        if let Some((seq, _)) = self.in_flight.remove(&id) {
            // An attached repeat taken off its call's waiters gets no outcome back, so
            // nothing stays counted for it.
            if !stream && !parked && !self.detach(Tag { id, seq }) {
                self.cancelled += 1;
                // Its request's bytes count until the outcome comes back: a keyed
                // call's handler runs on after a CANCEL (for its retries), holding them.
                let tag = Tag { id, seq };
                if let Some(large) = self.large.iter_mut().find(|l| l.tag == tag) {
                    large.cancelled = true;
                }
            }
        }
    }

    fn on_request(&mut self, cx: &mut Context<'_>, mut request: RequestFrame) {
        self.counts.requests += 1;
        let id = request.id;
        if self.in_flight.contains_key(&id)
            || (!self.parked.is_empty() && self.parked.iter().any(|p| p.tag.id == id))
        {
            if !self.link.is_reliable() {
                // A retransmission or a copy made by the network: the first one is
                // being handled and will be answered.
                tracing::trace!(peer = %self.peer, id, "repeated request dropped");
                return;
            }
            self.close_with(
                GoAwayCode::PROTOCOL_ERROR,
                format!("request id {id} is already in flight"),
            );
            return;
        }
        if !self.refused.is_empty() && self.refuse_copy(id) {
            return;
        }
        self.last_id = self.last_id.max(id);
        let tag = Tag {
            id,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        // Over UDP a request up to the GOAWAY's `last_id` may come again after it (a
        // retransmission for an answer that was lost): it was taken, maybe run, and
        // the client waits for its answer, which "not processed" would contradict
        // (a keyed call is answered from the duplicate cache as before).
        if self
            .goaway_sent
            .is_some_and(|last_id| self.link.is_reliable() || id > last_id)
        {
            let message = format!("{}; request not processed", self.drain_reason());
            self.queue_status(id, &Status::unavailable(message));
            return;
        }
        if request.timeout.is_some_and(|t| t.is_zero()) {
            self.counts.expired += 1;
            self.queue_status(
                id,
                &Status::deadline_exceeded("deadline expired before the request arrived"),
            );
            return;
        }
        let service = match self.methods.tag(&request.method) {
            Some(service) => service,
            None => match self.router.route(&request.method) {
                Ok(service) => {
                    self.methods.set_tag(&request.method, service);
                    service
                }
                Err(status) => {
                    self.queue_status(id, &status);
                    return;
                }
            },
        };
        let accepts = crate::compress::take_accepts(&mut request.metadata);
        if accepts.is_listed()
            && self.config.compression.is_some()
            && crate::compress::Compression::is_available()
        {
            self.peer_accepts.update(accepts);
            // Bounded: entries of calls refused or cancelled before their answer are
            // never taken out; losing some costs only a repeated advertisement.
            if self.advertise.len() >= 4096 {
                self.advertise.clear();
            }
            self.advertise.insert(id);
        }
        // A streaming REQUEST's payload is empty (its messages come in DATA frames,
        // each with its own flag): the flag means nothing there and is ignored.
        if request.compressed && !request.streaming {
            // The work counts whatever comes of it: a bomb refused at the limit, or a
            // corrupt message, cost as much as one that decompressed (from a review:
            // they counted nothing, and one connection held its thread for seconds).
            let mut work = request.payload.len();
            // No further than the budget of large requests has room for (which the
            // result is charged to below).
            let method = &request.method;
            let mut over_budget = false;
            let decompressed = self.large_budget.decompress(
                &request.payload,
                self.max_message_len,
                &mut |reserved| work += reserved,
                |budget| {
                    over_budget = true;
                    format!("{}: {budget}; not run", crate::status::quoted(method))
                },
            );
            self.inflated += work;
            match decompressed {
                Ok(payload) => {
                    request.payload = payload;
                }
                Err(status) => {
                    if over_budget {
                        self._registered.count_over_budget();
                    }
                    self.advertise.remove(&id);
                    self.queue_status(id, &status);
                    return;
                }
            }
        }
        if request.streaming {
            self.open_stream(cx, service, tag, request);
            return;
        }
        let len = request.payload.len();
        let mut large_charge = None;
        let large = len > 0
            && (request.compressed
                || len.saturating_mul(LARGE_REQUEST_DIVISOR) >= self.config.link.max_frame_len);
        if large {
            // Server-wide, before the duplicate cache admits the call: a refused one
            // leaves nothing behind.
            match self
                .large_budget
                .charge(std::mem::take(&mut request.payload))
            {
                Ok((payload, charge)) => {
                    request.payload = payload;
                    large_charge = Some(charge);
                }
                Err(held) => {
                    self._registered.count_over_budget();
                    self.advertise.remove(&id);
                    let status = Status::resource_exhausted(format!(
                        "{}: the server holds {held} bytes of large requests and this one \
                         has {len}, over its limit of {} bytes; not run",
                        crate::status::quoted(&request.method),
                        self.large_budget.max()
                    ));
                    self.queue_status(id, &status);
                    return;
                }
            }
        }
        let key = match request.call_key {
            None => None,
            Some(key) => match self.admit(tag, self.scoped_key(key, &request), request.timeout) {
                Some(key) => Some(key),
                None => return, // answered from the cache, attached, or refused
            },
        };
        if let Some(charge) = large_charge {
            self.large_bytes += len;
            self.large.push(Large {
                tag,
                bytes: len,
                cancelled: false,
                _charge: charge,
            });
        }
        let received = self.received();
        let deadline = request.timeout.map(|t| received + t);
        let call = ServerCall {
            method: request.method,
            metadata: request.metadata,
            timeout: request.timeout,
            payload: request.payload,
            stream: None,
            compressed: request.compressed,
            received: Some(received.into_std()),
            bulk: Some(self.bulk_handle.clone()),
            peer: Some(self.peer.clone()),
            principal: None,
            extensions: crate::Extensions::new(),
        };
        self.start(
            cx,
            Parked {
                service,
                tag,
                call,
                deadline,
                key,
                stream: None,
            },
        );
    }

    /// When the current batch of frames was read: the clock is read once per batch, at
    /// its first request (the batch is read at once, so its requests arrived together).
    fn received(&mut self) -> Instant {
        *self.read_at.get_or_insert_with(Instant::now)
    }

    /// Starts a request now, or parks it behind those already waiting.
    fn start(&mut self, cx: &mut Context<'_>, request: Parked) {
        if !self.parked.is_empty() {
            self.parked.push_back(request);
        } else if let Some(request) = self.dispatch(cx, request, self.from_lookahead) {
            self.parked.push_back(request);
        }
    }

    /// Starts a streaming call: its request stream, its credit, its handler.
    fn open_stream(
        &mut self,
        cx: &mut Context<'_>,
        service: usize,
        tag: Tag,
        request: RequestFrame,
    ) {
        if self.streams.len() >= self.config.max_concurrent_streams {
            self.queue_status(
                tag.id,
                &Status::resource_exhausted(format!(
                    "this connection has {} streams open, the server's limit",
                    self.streams.len()
                )),
            );
            return;
        }
        let window = self.config.stream_window;
        if window > frame::INITIAL_STREAM_WINDOW {
            let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
            frame::encode_window(&mut buf, tag.id, window - frame::INITIAL_STREAM_WINDOW);
            self.push_control(buf, Payload::new());
        }
        let received = self.received();
        let credit_tx = self.streams_out.sender().clone();
        let returned = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let to_return = returned.clone();
        let (feed, body) = RawStreaming::new(
            Box::new(move |bytes| {
                let before =
                    to_return.fetch_add(u64::from(bytes), std::sync::atomic::Ordering::AcqRel);
                if before == 0 {
                    let _ = credit_tx.send((tag, StreamOut::Credit));
                }
            }),
            (window / 4).max(1),
        );
        let mut body = body;
        body.set_max_len(self.max_message_len);
        body.charge_decompressed_to(self.large_budget.clone());
        let credit = Credit::with_budget(frame::INITIAL_STREAM_WINDOW, self.out_budget.clone());
        self.streams.insert(
            tag.id,
            ServerStream {
                feed: Some(feed),
                received: 0,
                credit: credit.clone(),
                returned,
                failed: None,
            },
        );
        let call = ServerCall {
            method: request.method,
            metadata: request.metadata,
            timeout: request.timeout,
            payload: bytes::Bytes::new(),
            stream: Some(TakeOnce::new(body)),
            compressed: false,
            received: Some(received.into_std()),
            bulk: Some(self.bulk_handle.clone()),
            peer: Some(self.peer.clone()),
            principal: None,
            extensions: crate::Extensions::new(),
        };
        let deadline = request.timeout.map(|t| received + t);
        // Counted in `in_flight` from now on, so that a CANCEL or the end finds it.
        self.in_flight.insert(tag.id, (tag.seq, None));
        self.start(
            cx,
            Parked {
                service,
                tag,
                call,
                deadline,
                key: None,
                stream: Some(credit),
            },
        );
    }

    /// A DATA frame from the client: a request message, or its half-close.
    /// Ends stream `id`'s request stream and call with `status`, for a message a
    /// budget refused: a handler still reading (one that handed its stream to a task of
    /// its own, which the abort does not stop) must not read the next message as if
    /// this one had come (from a review).
    fn refuse_stream_message(&mut self, id: u64, status: Status) {
        if let Some(feed) = self
            .streams
            .get_mut(&id)
            .and_then(|stream| stream.feed.take())
        {
            feed.end(Err(status.clone()));
        }
        let seq = self.in_flight.get(&id).map(|(seq, _)| *seq);
        if let Some(seq) = seq {
            self.end_stream_with(Tag { id, seq }, status);
        }
    }

    fn on_stream_data(&mut self, data: DataFrame) {
        let Some(stream) = self.streams.get_mut(&data.id) else {
            // Ended or cancelled: late messages are dropped, and are no progress of a
            // call (`evict_stalled_after`).
            self.counts.keepalive += 1;
            return;
        };
        let mut give_back = None;
        if let Some(message) = data.message {
            let copy_below = match data.metadata {
                Some(_) => self.config.link.max_metadata_len,
                None => 0,
            };
            // A copy if short (or up to the metadata limit, when the frame carried
            // metadata a server ignores: not kept alive by a message of 64 bytes' cost).
            let message = crate::stream::held_message(message, copy_below);
            // Flow control counts each message as at least `MIN_MESSAGE_COST` bytes, so
            // empty messages cannot pile up without bound (docs/wire.md §6.9).
            let len = message_cost(message.len());
            let cost = i64::try_from(len).unwrap_or(i64::MAX);
            // A message may be sent only while credit is above zero (it may take the
            // credit below zero by itself alone): one sent with none left is over.
            // (Allowing the window plus a whole maximum frame instead let a client
            // send 262,144 messages of 64 bytes past its credit on every stream.)
            let window = i64::from(self.config.stream_window.max(frame::INITIAL_STREAM_WINDOW));
            if stream.received >= window {
                self.close_with(
                    GoAwayCode::PROTOCOL_ERROR,
                    format!("stream {} sent messages beyond its credit", data.id),
                );
                return;
            }
            // A large message is charged to the server-wide budget of large requests
            // for as long as its bytes live, as a unary request is: each connection
            // bounds its streams' bytes, but many connections streaming to handlers
            // that read slowly held gigabytes past the budget (from a review). One that
            // does not fit ends its stream.
            let message = if message.len().saturating_mul(LARGE_REQUEST_DIVISOR)
                >= self.config.link.max_frame_len
                && stream.feed.is_some()
            {
                match self.large_budget.charge(message) {
                    Ok((message, _charge)) => message, // held by the bytes alone
                    Err(held) => {
                        let status = Status::resource_exhausted(format!(
                            "the server holds {held} bytes of large requests and a stream \
                             message of {len} bytes would take it over its limit of {} bytes: \
                             not taken",
                            self.large_budget.max(),
                        ));
                        self.refuse_stream_message(data.id, status);
                        return;
                    }
                }
            } else {
                message
            };
            // Every message counts, until its handler reads it, in the server's total of
            // unread stream messages (a large one's charge goes with its bytes here).
            if let Err(held) = self.stream_bytes_in.add(len) {
                let status = Status::resource_exhausted(format!(
                    "the server holds {held} bytes of stream messages its handlers have not \
                     read and a stream message of {len} bytes would take it over its limit of \
                     {} bytes: not taken",
                    self.stream_bytes_in.max()
                ));
                self.refuse_stream_message(data.id, status);
                return;
            }
            stream.received += cost;
            let delivered = stream
                .feed
                .as_ref()
                .is_some_and(|feed| feed.message(message, data.compressed));
            if !delivered {
                // Nobody reads the request stream any more: give the credit straight back
                // so the client is not stuck before the handler's answer.
                stream.received -= cost;
                self.stream_bytes_in.sub(len);
                give_back = Some(u32::try_from(len).unwrap_or(u32::MAX).max(1));
            }
        }
        if data.end_stream {
            if let Some(feed) = stream.feed.take() {
                feed.end(Ok(Metadata::new()));
            }
        }
        if let Some(bytes) = give_back {
            let mut buf = BytesMut::with_capacity(frame::HEADER_LEN + 4);
            frame::encode_window(&mut buf, data.id, bytes);
            self.push_control(buf, Payload::new());
        }
    }

    /// Writes one event of a streaming call. Returns whether it ended the call (a slot
    /// freed).
    fn write_stream_event(&mut self, tag: Tag, mut event: StreamOut) -> Result<bool, Error> {
        let id = tag.id;
        if !matches!(event, StreamOut::Credit) {
            if let Some(status) = self.streams.get_mut(&id).and_then(|s| s.failed.take()) {
                let dropped = std::mem::replace(&mut event, StreamOut::End(Err(status)));
                self.drop_stream_event(dropped);
            }
        }
        self.scratch.clear();
        let (payload, ended) = match event {
            StreamOut::Head(mut metadata) => {
                if self.advertise.remove(&id) {
                    self.advertise_in(&mut metadata);
                }
                if !frame::metadata_fits(&metadata, self.config.decode.max_metadata_len) {
                    self.end_stream_with(
                        tag,
                        Status::resource_exhausted("response headers exceed the metadata limit"),
                    );
                    return Ok(false);
                }
                frame::encode_data_header(
                    &mut self.scratch,
                    id,
                    frame::FLAG_NO_MESSAGE,
                    Some(&metadata),
                );
                (Payload::new(), false)
            }
            StreamOut::Message(message, hint) => {
                if let Some(stream) = self.streams.get(&id) {
                    if stream.credit.sent(message.len()) {
                        self.wake_streams();
                    }
                }
                let len = frame::HEADER_LEN + message.len();
                if len > self.config.link.max_frame_len {
                    self.end_stream_with(
                        tag,
                        Status::resource_exhausted(format!(
                            "a response message of {len} bytes exceeds the maximum frame \
                             length of {} bytes",
                            self.config.link.max_frame_len
                        )),
                    );
                    return Ok(false);
                }
                let original = message.len();
                let (message, flags) = self.compress_payload(message, hint);
                if message.len() < original {
                    // The handler's task took credit for the message as it was; the
                    // client gives back what was sent (docs/wire.md §6.10): the
                    // difference is not spent.
                    let saved = message_cost(original) - message_cost(message.len());
                    if let Some(stream) = self.streams.get(&id) {
                        stream.credit.add(u32::try_from(saved).unwrap_or(u32::MAX));
                    }
                }
                frame::encode_data_header(&mut self.scratch, id, flags, None);
                (message, false)
            }
            StreamOut::End(result) => {
                self.advertise.remove(&id);
                let outcome = result.map(|trailers| {
                    (
                        ServerReply {
                            metadata: trailers,
                            ..ServerReply::default()
                        },
                        0,
                    )
                });
                let payload = encode_outcome(
                    &mut self.scratch,
                    id,
                    outcome,
                    self.answer_limit,
                    self.config.decode.max_metadata_len,
                );
                self.in_flight.remove(&id);
                self.remove_stream(id);
                (payload, true)
            }
            StreamOut::Credit => return Ok(false),
        };
        self.counts.sent(self.scratch.len() + payload.len());
        self.link.start_send(&self.scratch, payload)?;
        self.needs_flush = true;
        Ok(ended)
    }

    /// On a link that [splits trailers](Link::splits_trailers): sends an OK unary
    /// answer's headers ahead of it in a DATA frame without a message, leaving the
    /// trailers alone in the answer's metadata. Answers without trailers, or whose
    /// headers alone exceed the metadata limit (the merged block is then refused as
    /// usual), go as one RESPONSE.
    fn send_unary_headers(
        &mut self,
        id: u64,
        outcome: &mut Result<(ServerReply, u16), Status>,
    ) -> Result<(), Error> {
        let Ok((reply, _)) = outcome else {
            return Ok(());
        };
        if reply.trailers.is_empty()
            || !frame::metadata_fits(&reply.metadata, self.config.decode.max_metadata_len)
        {
            return Ok(());
        }
        let headers = std::mem::replace(&mut reply.metadata, std::mem::take(&mut reply.trailers));
        self.scratch.clear();
        frame::encode_data_header(
            &mut self.scratch,
            id,
            frame::FLAG_NO_MESSAGE,
            Some(&headers),
        );
        self.counts.sent(self.scratch.len());
        self.link.start_send(&self.scratch, Payload::new())
    }

    /// Adds our compression advertisement to an answer whose request carried the
    /// client's, and compresses the payload if settings, client and hint say so.
    fn prepare_reply(
        &mut self,
        id: u64,
        outcome: Result<ServerReply, Status>,
    ) -> Result<(ServerReply, u16), Status> {
        let advertise = !self.advertise.is_empty() && self.advertise.remove(&id);
        let mut reply = outcome?;
        if advertise {
            self.advertise_in(&mut reply.metadata);
        }
        let (payload, flags) =
            self.compress_payload(std::mem::take(&mut reply.payload), reply.compress);
        reply.payload = payload;
        Ok((reply, flags))
    }

    /// The `rpc-accept-encoding` value of this server's answers.
    /// Adds the compression advertisement to an answer's metadata, if it still fits
    /// the metadata limits with it: the handler's own metadata within them must not
    /// fail the call for an entry the server adds (`docs/wire.md` §6.10).
    fn advertise_in(&self, metadata: &mut Metadata) {
        let value = self.advertisement();
        let max = self.config.decode.max_metadata_len;
        if frame::fits_one_more(metadata, crate::compress::ACCEPT_ENCODING, value, max) {
            let _ = metadata.append(crate::compress::ACCEPT_ENCODING, value);
        }
    }

    fn advertisement(&self) -> &'static str {
        self.config
            .compression
            .as_ref()
            .map_or("", crate::compress::advertisement)
    }

    fn compress_payload(&self, payload: Payload, hint: Option<bool>) -> (Payload, u16) {
        let config = self.config.compression.as_ref();
        crate::compress::encode(config, self.peer_accepts, payload, hint)
    }

    /// Ends a stream from the connection's side: stops its task and answers `status`.
    fn end_stream_with(&mut self, tag: Tag, status: Status) {
        if let Some((_, Some(handle))) = self.in_flight.get(&tag.id) {
            self.stop_handler(tag.id, handle, status.code());
        }
        // Events the handler queued before it was stopped (its own end too) are
        // still current: the next one written becomes this error's RESPONSE, and the
        // end queued here makes sure one comes.
        if let Some(stream) = self.streams.get_mut(&tag.id) {
            stream.failed = Some(status.clone());
        }
        let _ = self
            .streams_out
            .sender()
            .send((tag, StreamOut::End(Err(status))));
    }

    /// Stops call `id`'s running handler, whose task is `handle`: a stream's through
    /// its credit, so that its layers see `code` as why ([`super::stop_cause`]); any
    /// other's by aborting its task.
    fn stop_handler(&self, id: u64, handle: &AbortHandle, code: crate::Code) {
        match self.streams.get(&id) {
            Some(stream) => stream.credit.stop(code),
            None => handle.abort(),
        }
    }

    /// Looks a keyed request up in the duplicate cache. Returns the key if the call is
    /// to run (its outcome then goes through the cache); `None` if it was answered,
    /// attached to a running execution, or refused.
    /// The key the duplicate cache files `request` under: its call key with its
    /// method and its caller's credentials folded in (see [`super::dedupe::scoped_key`]).
    fn scoped_key(&self, key: CallKey, request: &RequestFrame) -> CallKey {
        let authorization = request
            .metadata
            .get(crate::auth::AUTHORIZATION)
            .map(|value| value.as_bytes());
        let caller = super::dedupe::caller_of(self.peer_key, authorization);
        super::dedupe::scoped_key(key, &request.method, caller)
    }

    fn admit(
        &mut self,
        tag: Tag,
        key: CallKey,
        timeout: Option<std::time::Duration>,
    ) -> Option<CallKey> {
        let id = tag.id;
        let Some(cache) = &self.cache else {
            if key.attempt <= 1 {
                return Some(key);
            }
            self.queue_status(
                id,
                &Status::failed_precondition(format!(
                    "attempt {} of a call that is not safe to repeat, and this server keeps \
                     no duplicate cache: the call may already have run, so it is not run again",
                    key.attempt
                )),
            );
            return None;
        };
        let waiter = (self.done.sender().clone(), tag);
        let admit = cache.lock().unwrap_or_else(|e| e.into_inner()).admit_from(
            &key,
            waiter,
            Instant::now(),
            !self.link.is_reliable(),
        );
        match admit {
            super::dedupe::Admit::Run => Some(key),
            super::dedupe::Admit::Attached => {
                self.in_flight.insert(id, (tag.seq, None));
                let deadline = timeout.map(|t| self.received() + t);
                self.attach(tag, key, deadline);
                None
            }
            super::dedupe::Admit::Cached(outcome) => {
                self.in_flight.insert(id, (tag.seq, None));
                self.finished.push_back((tag, outcome));
                None
            }
            super::dedupe::Admit::Busy => {
                self.queue_status(
                    id,
                    &Status::resource_exhausted(
                        "too many calls with call keys are running on this server; not run",
                    ),
                );
                None
            }
            super::dedupe::Admit::TooManyWaiting => {
                self.queue_status(
                    id,
                    &Status::resource_exhausted(
                        "too many repeats of this call wait for its running attempt; not run (the call goes on \
                         running)",
                    ),
                );
                None
            }
            super::dedupe::Admit::TooOld => {
                self.queue_status(
                    id,
                    &Status::aborted(
                        "a repeat of a call older than the server's duplicate cache remembers: \
                         it may already have run, so it is not run again",
                    ),
                );
                None
            }
        }
    }

    /// A keyed request admitted by the cache will not run after all: release its cache
    /// entry and tell whoever attached to it (the request itself gets its own answer,
    /// or none if it was cancelled).
    fn abandon(&self, key: Option<&CallKey>, tag: Tag, why: &str) {
        let (Some(key), Some(cache)) = (key, &self.cache) else {
            return;
        };
        let waiters = cache.lock().unwrap_or_else(|e| e.into_inner()).abandon(key);
        for (tx, waiter) in waiters {
            if waiter == tag && self.done.is_sender(&tx) {
                continue;
            }
            let _ = tx.send((
                waiter,
                Err(Status::unavailable(format!(
                    "the first attempt of this call was not run ({why}); try again"
                ))),
            ));
        }
    }

    /// Answers a request that will not run with `status` (a stream through its events,
    /// which end it).
    fn refuse(&mut self, request: Parked, status: Status, why: &str) {
        if request.stream.is_some() {
            let _ = self
                .streams_out
                .sender()
                .send((request.tag, StreamOut::End(Err(status))));
            return;
        }
        self.queue_status(request.tag.id, &status);
        self.release_large(request.tag);
        self.abandon(request.key.as_ref(), request.tag, why);
    }

    /// Starts the handler if its service is ready; else gives the request back, to be
    /// parked. `waited`: the request was parked, so its deadline may have passed.
    fn dispatch(
        &mut self,
        cx: &mut Context<'_>,
        mut parked: Parked,
        waited: bool,
    ) -> Option<Parked> {
        // A budget shorter than the timer's resolution may have run out between the
        // request's arrival and now, which the handler's timer would not see before the
        // handler had run (docs/wire.md §6.6: not run); a longer one is checked only
        // after a wait for the service.
        let short = parked.call.timeout.is_some_and(|t| t < SHORT_BUDGET);
        // Handlers of this batch polled before it took time the batch's one clock read
        // does not know of (a handler doing synchronous work: 32 requests of one read
        // whose handlers took 5 ms each had the last start 155 ms late, its deadline
        // long past, and run; from a review).
        let late =
            parked.deadline.is_some() && (self.polled_since_clock || self.checked_at.is_some());
        if waited || short || late {
            if let Some(deadline) = parked.deadline {
                // The budget counts from the request's arrival, time parked included.
                let now = match self.checked_at {
                    // Read already for an earlier request, and no handler ran since.
                    Some(at) if !self.polled_since_clock && !waited && !short => at,
                    _ => {
                        let now = Instant::now();
                        self.checked_at = Some(now);
                        self.polled_since_clock = false;
                        now
                    }
                };
                if deadline <= now {
                    self.counts.expired += 1;
                    let status = Status::deadline_exceeded(format!(
                        "{}: deadline exceeded {}; not run",
                        parked.call.method,
                        if waited {
                            "while waiting for the service"
                        } else {
                            "before its handler started"
                        }
                    ));
                    self.refuse(parked, status, "its deadline passed before it started");
                    return None;
                }
                parked.call.timeout = Some(deadline - now);
            }
        }
        let svc = self.router.service(parked.service);
        let ready = std::panic::catch_unwind(AssertUnwindSafe(|| svc.poll_ready(cx)));
        match ready {
            Ok(Poll::Pending) => return Some(parked),
            Ok(Poll::Ready(Err(status))) => {
                self.refuse(parked, status, "its service failed before it started");
                return None;
            }
            Err(_) => {
                let status = Status::internal("the service panicked in poll_ready; not run");
                self.refuse(parked, status, "its service panicked before it started");
                return None;
            }
            Ok(Poll::Ready(Ok(()))) => {}
        }
        let Parked {
            service,
            tag,
            call,
            deadline,
            key,
            stream,
        } = parked;
        let method = call.method.clone();
        let svc = self.router.service(service);
        let handler = std::panic::catch_unwind(AssertUnwindSafe(|| svc.call(call)));
        if let Some(credit) = stream {
            let Ok(handler) = handler else {
                let status = Status::internal("the service panicked");
                let _ = self
                    .streams_out
                    .sender()
                    .send((tag, StreamOut::End(Err(status))));
                return None;
            };
            let task = tokio::spawn(run_stream(
                handler,
                credit,
                self.streams_out.sender().clone(),
                tag,
                deadline,
                method,
                self.config.decode.max_metadata_len,
            ));
            self.in_flight
                .insert(tag.id, (tag.seq, Some(task.abort_handle())));
            return None;
        }
        let id = tag.id;
        // A keyed call's outcome goes to the duplicate cache (which passes it to everyone
        // waiting, this connection included), any other straight to this connection.
        let keyed = match (key, &self.cache) {
            (Some(key), Some(cache)) => Some((key, cache.clone())),
            _ => None,
        };
        // Fast path: many handlers finish without ever waiting. Poll once here, and only
        // a handler that has to wait becomes a task of its own; the rest save a spawn,
        // a channel message and two task switches. (A handler that waits registered
        // this task's waker too; the spurious wake-up that may cause is harmless.)
        let (first, handler) = match handler {
            Err(_) => {
                tracing::error!(peer = %self.peer, %method, "the service panicked: answered INTERNAL");
                (Some(Err(Status::internal("the service panicked"))), None)
            }
            Ok(mut handler) => {
                self.polled_since_clock = true;
                match std::panic::catch_unwind(AssertUnwindSafe(|| handler.as_mut().poll(cx))) {
                    Ok(Poll::Ready(outcome)) => (Some(outcome), None),
                    Err(_) => {
                        tracing::error!(peer = %self.peer, %method, "the handler panicked: answered INTERNAL");
                        (Some(Err(Status::internal("the handler panicked"))), None)
                    }
                    Ok(Poll::Pending) => (None, Some(handler)),
                }
            }
        };
        let (Some(handler), None) = (handler, first.as_ref()) else {
            let outcome = first.unwrap_or_else(|| Err(Status::internal("no outcome")));
            self.in_flight.insert(id, (tag.seq, None));
            match keyed {
                Some((key, cache)) => Sink::Cache(key, cache).deliver(outcome),
                None => self.finished.push_back((tag, outcome)),
            }
            return None;
        };
        let is_keyed = keyed.is_some();
        let unattended = match (&keyed, &self.config.dedupe) {
            (Some((key, cache)), Some(dedupe)) => Some((
                *key,
                cache.clone(),
                dedupe.max_unattended,
                KeyedRun::new(&self.keyed),
            )),
            _ => None,
        };
        let sink = match keyed {
            Some((key, cache)) => Sink::Cache(key, cache),
            None => Sink::Connection(Some((self.done.sender().clone(), tag))),
        };
        let task = tokio::spawn(async move {
            let run = async {
                let handler = async {
                    match unattended {
                        None => handler.await,
                        // Boxed: its timer would otherwise grow every handler's task
                        // (and the frame of the function that builds it).
                        Some((key, cache, after, run)) => {
                            let unattended = Unattended {
                                key,
                                cache,
                                after,
                                run,
                            };
                            Box::pin(until_unattended(handler, unattended, method.clone())).await
                        }
                    }
                };
                match deadline {
                    None => handler.await,
                    Some(deadline) => match tokio::time::timeout_at(deadline, handler).await {
                        Ok(result) => result,
                        Err(_) => Err(Status::deadline_exceeded(format!(
                            "{method}: deadline exceeded; the handler was stopped"
                        ))),
                    },
                }
            };
            let result = AssertUnwindSafe(run)
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(%method, "the handler panicked: answered INTERNAL");
                    Err(Status::internal("the handler panicked"))
                });
            sink.deliver(result);
        });
        // A keyed call runs to completion even if this connection goes away or the
        // client cancels: its outcome must be recorded for the retry that will come
        // (until nobody has waited for it for `max_unattended`: `until_unattended`).
        let handle = (!is_keyed).then(|| task.abort_handle());
        self.in_flight.insert(id, (tag.seq, handle));
        None
    }

    /// Closes the connection once [`IDLE_CHECKS`] checks in a row (the idle timer
    /// firing every such fraction of the timeout) found no activity; otherwise re-arms
    /// it. Checking lazily costs a flag per frame instead of a clock read and a timer
    /// update, at the price of closing after between one and 1¼ idle timeouts.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        let (Some(idle), Some(timeout)) = (&mut self.idle, self.config.idle_timeout) else {
            return Ok(());
        };
        if idle.poll(cx).is_pending() {
            return Ok(());
        }
        let busy = self.in_flight.len() + self.parked.len() > 0;
        if std::mem::take(&mut self.active) || busy {
            self.quiet = 0;
        } else {
            self.quiet += 1;
        }
        if self.quiet < IDLE_CHECKS {
            idle.reset(Instant::now() + timeout / IDLE_CHECKS);
            let _ = idle.poll(cx); // registers the new deadline
        } else if self.closing.is_none() {
            self.close_with(GoAwayCode::NO_ERROR, "idle timeout".into());
            self.poll_write(cx)?;
        }
        Ok(())
    }

    /// Sends a keepalive PING after silence while calls are in flight (or always, with
    /// no idle timeout), and ends the connection when nothing answered one in time.
    /// Silence while reading is stopped at this side's limits proves nothing.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        if self.keepalive.is_none() {
            return Ok(());
        }
        // Stopped at this side's own limits, silence proves nothing. Stopped because its
        // answers (PONGs) do not leave, it does only while they leave at all: a client
        // that floods PINGs and reads nothing would otherwise keep its connection, and
        // its calls' handlers, for ever.
        let max = self.config.max_concurrent_requests;
        // At the request limit and the streams' bound the server still reads ahead (a
        // PONG found there counts): stopped only once that look-ahead is full.
        let lookahead_full =
            self.lookahead.len() >= LOOKAHEAD_FRAMES || self.lookahead_bytes >= LOOKAHEAD_BYTES;
        let at_limits = self.closing.is_some()
            || (self.large_bytes > 0 && self.large_over())
            || (lookahead_full
                && (self.busy() >= max || self.stream_bytes_in.get() >= self.stream_bytes_max));
        let at_control =
            self.busy() + self.control.len() >= max || self.control_bytes >= MAX_CONTROL_BYTES;
        let moved = std::mem::take(&mut self.control_moved);
        // At its limits, silence proves nothing of a client only while this side's
        // answers leave: one whose writes wait on a client that does not read (bytes
        // unwritten, nothing moved since the last look) is silence that counts. A
        // client that pipelined answers past the socket buffers and stopped reading
        // held its connection, its 256 answers and their slots for ever: keepalive
        // took the limits for life, the idle timer saw calls, and eviction wants none
        // in flight (found in review). (Over UDP writes never wait on the client.)
        let writes = (self.counts.frames_sent, self.counts.unsent);
        let blocked = writes.1 != 0 && writes == self.writes_seen && self.link.is_reliable();
        self.writes_seen = writes;
        let excused = at_limits && !blocked;
        self.excused |= excused;
        self.heard |= excused || (at_control && moved);
        let wanted =
            self.in_flight.len() + self.parked.len() > 0 || self.config.idle_timeout.is_none();
        let Some(keepalive) = &mut self.keepalive else {
            return Ok(());
        };
        let action = keepalive.poll(cx, &mut self.heard, || wanted);
        let nudge = action.is_some() && std::mem::take(&mut self.excused);
        if action.is_some() {
            // Whatever it reads: a client whose answers have not moved at all for two
            // intervals of the timer, and `MIN_WRITE_STALL`, reads nothing. One that
            // sends a frame now and then (a CANCEL for no call, a WINDOW) is heard,
            // and with only the check above would keep its slots and answers for ever
            // (from a review).
            let waits = writes.1 != 0
                && self.link.is_reliable()
                && !self.link.writes_wait_on_peer_windows();
            let interval = self.config.keepalive.interval.unwrap_or_default();
            if let Some(stalled) = self.write_stall.check(writes, waits, interval) {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "the client read none of its answers for {stalled:?} (the \
                         connection's writes wait on it)"
                    ),
                ));
            }
        }
        // Reading stopped at this side's limits, so the client's silence proves
        // nothing, and a client that left meanwhile is not seen either: its FIN waits
        // behind the bytes not read (a review's client filled the streams' bound and
        // closed: its 92 MiB and 256 calls stayed for good). A PING still goes out (a
        // nudge); a departed client's host answers it with a reset, which the next
        // write (the next nudge, or an answer) fails on. Its PONG, if the client is
        // there, is not awaited: it waits unread.
        let ping = match action {
            Some(Action::Nothing) if nudge => NUDGE_PING_ID,
            None | Some(Action::Nothing) => return Ok(()),
            Some(Action::Ping(id)) => id,
            Some(Action::Dead) => return Err(keepalive.dead()),
        };
        tracing::trace!(peer = %self.peer, id = ping, nudge, "keepalive PING");
        self.counts.keepalive += 1;
        let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
        frame::encode_ping_header(&mut buf, ping, false);
        self.push_control(buf, Payload::new());
        self.poll_write(cx)?;
        Ok(())
    }

    /// Whether the server's shutdown (or this connection's eviction) has come. Polls
    /// the wait only when the task's waker changed since the last poll.
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> bool {
        match &self.shutdown_waker {
            Some(waker) if waker.will_wake(cx.waker()) => self.shutdown_token.is_cancelled(),
            _ => {
                let fired = self.shutdown.as_mut().poll(cx).is_ready();
                self.shutdown_waker = Some(cx.waker().clone());
                fired
            }
        }
    }

    /// One round of work. `Ready` when the connection is finished.
    fn poll_round(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if !self.shutdown_seen && self.poll_shutdown(cx) {
            self.shutdown_seen = true;
            if self.goaway_sent.is_none()
                && self.counters.evicted_stalled()
                && !(self.in_flight.is_empty() && self.parked.is_empty())
            {
                // Chosen at the connection limit for calls that made no progress
                // (`Registry::evict_quiet`): they end with it, as they would never
                // let a drain finish. (One chosen as quiet whose call came in since
                // the look drains: that call had made progress.)
                self.close_with(GoAwayCode::NO_ERROR, EVICTED_STALLED.into());
            } else if self.goaway_sent.is_none() {
                let reason = self.drain_reason();
                tracing::debug!(peer = %self.peer, code = %GoAwayCode::NO_ERROR, reason, "GOAWAY sent: draining the connection");
                self.queue_goaway(GoAwayCode::NO_ERROR, reason);
            } else if let Some(deadline) = &mut self.close_deadline {
                // Closing already (a GOAWAY of its own, for an error): the shutdown
                // waits for this peer no longer than for any other.
                let sooner = tokio::time::Instant::now() + SHUTDOWN_CLOSE_GRACE;
                if deadline.deadline() > sooner {
                    deadline.as_mut().reset(sooner);
                }
            }
        }
        // A connection closing for an error starts no more handlers: their answers
        // could not be written after its GOAWAY. The parked are abandoned with it.
        while let Some(parked) = self
            .closing
            .is_none()
            .then(|| self.parked.pop_front())
            .flatten()
        {
            if let Some(parked) = self.dispatch(cx, parked, true) {
                self.parked.push_front(parked);
                break;
            }
        }
        self.inflated = 0;
        loop {
            if !self.poll_read(cx)? {
                // The client closed its side: nobody will read the answers. A byte
                // stream's close is answered with ours, once and without waiting for
                // the socket (TLS's close_notify, which a client that closed with one
                // may wait for: Python's `unwrap`, from a review).
                if self.link.half_closes() {
                    let _ = self.link.poll_close(cx);
                }
                return Poll::Ready(Ok(()));
            }
            // Writing answers frees handler slots; read again if it did, unless the
            // read stopped at the link's `Pending` rather than at a bound (a read
            // would only find that again; about 350 instructions of a unary call).
            if !self.poll_write(cx)? || (self.read_parked && !self.link.reads_while_writing()) {
                break;
            }
        }
        self.poll_idle(cx)?;
        self.poll_keepalive(cx)?;
        self.poll_waiting(cx);
        // Whether everything was written out is not asked: `Link::poll_close` flushes
        // first, and the closing grace must run while it does (a peer that does not
        // read, or a UDP association that never acknowledges the GOAWAY, would
        // otherwise hold the connection until some other timeout).
        let ending = self.closing.is_some()
            || (self.goaway_sent.is_some() && self.in_flight.is_empty() && self.parked.is_empty());
        // The closing grace runs from when the link has taken everything; for a
        // connection evicted at the connection limit, from when nothing is left but
        // writing: it was chosen with nothing written for a while (a peer that reads
        // nothing), which could otherwise keep its GOAWAY from ever leaving and the
        // connection open until its idle timeout.
        if ending
            && self.close_deadline.is_none()
            && (self.control.is_empty() || self.counters.evicted())
        {
            self.close_deadline = Some(Box::pin(tokio::time::sleep(self.close_grace())));
        }
        if ending && self.control.is_empty() {
            // The link writes what is queued, then waits for the peer to close as well
            // (see `Link::poll_close`), within the closing grace.
            if let Poll::Ready(result) = self.link.poll_close(cx) {
                return Poll::Ready(result);
            }
        }
        // Polled last, so that a deadline armed in this round is registered too.
        if let Some(deadline) = &mut self.close_deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Error::new(
                    ErrorKind::TimedOut,
                    "closing: the peer neither read its GOAWAY nor closed its side in time",
                )));
            }
        }
        Poll::Pending
    }
}

/// A streaming call's task: runs the handler, then sends its headers, its messages as
/// credit allows, and its end to the connection.
async fn run_stream<F>(
    handler: F,
    credit: std::sync::Arc<Credit>,
    out: mpsc::UnboundedSender<(Tag, StreamOut)>,
    tag: Tag,
    deadline: Option<Instant>,
    method: crate::ByteStr,
    max_metadata: usize,
) where
    F: Future<Output = Result<ServerReply, Status>> + Send,
{
    use futures::StreamExt;
    let send = |event| {
        let _ = out.send((tag, event));
    };
    let run = async {
        let ServerReply {
            metadata,
            payload,
            stream,
            trailers,
            compress,
            ..
        } = handler.await?;
        send(StreamOut::Head(metadata));
        match stream.and_then(|s| s.take()) {
            // A unary reply to a streaming call: a stream of that one message.
            None => {
                credit.consume(payload.len());
                send(StreamOut::Message(payload, compress));
            }
            // The next message is made before its credit is awaited, so that a stream's
            // end (or error), which takes no credit (docs/wire.md §6.9), goes out when
            // the client granted exactly what the messages took: waiting for credit
            // first held the RESPONSE until the client granted more, which a client
            // that has all its messages has no reason to do. At most one message per
            // stream so waits here, as the document allows.
            Some(mut messages) => loop {
                match messages.next().await {
                    Some(Ok(message)) => {
                        std::future::poll_fn(|cx| credit.poll_available(cx)).await;
                        credit.consume(message.len());
                        send(StreamOut::Message(message, None));
                    }
                    // The trailers the handler set go with the status it ends with,
                    // as gRPC sends them with any status.
                    Some(Err(status)) => return Err(with_trailers(status, trailers, max_metadata)),
                    None => break,
                }
            },
        }
        Ok(trailers)
    };
    let run = async {
        match deadline {
            None => run.await,
            Some(deadline) => match tokio::time::timeout_at(deadline, run).await {
                Ok(result) => result,
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "{method}: deadline exceeded; the handler was stopped"
                ))),
            },
        }
    };
    // The connection stops a stream's handler through its credit (a CANCEL, a message
    // over a budget, a request its transport could not hand over), not by aborting the
    // task: the handler is dropped here, inside `with_stop_cause`, so that its layers
    // see why (`stop_cause`). The connection has queued the stream's end itself.
    let mut run = std::pin::pin!(Some(AssertUnwindSafe(run).catch_unwind()));
    let outcome = std::future::poll_fn(|cx| {
        if let Poll::Ready(code) = credit.poll_stopped(cx) {
            return Poll::Ready(Err(code));
        }
        // Set to `None` only once this future is done.
        let running = run.as_mut().as_pin_mut().expect("polled while running");
        running.poll(cx).map(Ok)
    })
    .await;
    let result = match outcome {
        Ok(result) => result.unwrap_or_else(|_| {
            tracing::error!(%method, "the handler panicked: answered INTERNAL");
            Err(Status::internal("the handler panicked"))
        }),
        Err(code) => {
            super::with_stop_cause(code, || run.set(None));
            return;
        }
    };
    send(StreamOut::End(result));
}

/// A status a stream ended with, carrying the trailers its handler set after the
/// status's own metadata, if both fit the metadata limit (`max_metadata`) together
/// (else the status's own metadata alone, which `encode_outcome` would otherwise drop
/// with the trailers).
fn with_trailers(mut status: Status, trailers: crate::Metadata, max_metadata: usize) -> Status {
    let fits = || {
        frame::metadata_encoded_len(status.metadata()) + frame::metadata_encoded_len(&trailers)
            <= max_metadata
    };
    if !trailers.is_empty() && fits() {
        status.metadata_mut().extend(trailers);
    }
    status
}

/// Encodes a handler's outcome as a RESPONSE header into `buf` and returns the payload.
/// A response that would exceed the maximum frame length, or whose metadata would
/// exceed the metadata limit, becomes `RESOURCE_EXHAUSTED` (the client would refuse the
/// frame and lose the whole connection). Limits are per receiver and not exchanged;
/// the client's are assumed to be at least this server's.
/// What bounds an answer: the frame it travels in, or, on a link that carries messages
/// in frames of its own (gRPC's), the message (its `Link::max_message_len`: a
/// RESPONSE frame's header and metadata are not sent there, and a message within the
/// link's limit failed for them; from a review).
#[derive(Clone, Copy, Debug)]
enum AnswerLimit {
    Frame(usize),
    Message(usize),
}

fn encode_outcome(
    buf: &mut BytesMut,
    id: u64,
    outcome: Result<(ServerReply, u16), Status>,
    limit: AnswerLimit,
    max_metadata_len: usize,
) -> Payload {
    buf.clear();
    // A unary call's trailers travel with its headers.
    let outcome = outcome.map(|(mut reply, flags)| {
        if !reply.trailers.is_empty() {
            let trailers = std::mem::take(&mut reply.trailers);
            reply.metadata.extend(trailers);
        }
        (reply, flags)
    });
    let status = match outcome {
        Ok((reply, _)) if !frame::metadata_fits(&reply.metadata, max_metadata_len) => {
            Status::resource_exhausted(format!(
                "response metadata of {} bytes in {} entries exceeds the limit of \
                 {max_metadata_len} bytes and {} entries",
                frame::metadata_encoded_len(&reply.metadata),
                reply.metadata.len(),
                frame::max_metadata_entries(max_metadata_len)
            ))
        }
        Ok((reply, flags)) => {
            frame::encode_response_header_flags(buf, id, Code::OK, "", &[], &reply.metadata, flags);
            match limit {
                AnswerLimit::Frame(max) if buf.len() + reply.payload.len() <= max => {
                    return reply.payload
                }
                AnswerLimit::Message(max) if reply.payload.len() <= max => return reply.payload,
                AnswerLimit::Frame(max) => Status::resource_exhausted(format!(
                    "response of {} bytes exceeds the maximum frame length of {max} bytes",
                    buf.len() + reply.payload.len()
                )),
                AnswerLimit::Message(max) => Status::resource_exhausted(format!(
                    "response message of {} bytes exceeds the largest message of {max} bytes",
                    reply.payload.len()
                )),
            }
        }
        Err(status) => status,
    };
    buf.clear();
    let metadata = if !frame::metadata_fits(status.metadata(), max_metadata_len) {
        &crate::Metadata::new()
    } else {
        status.metadata()
    };
    frame::encode_response_header(
        buf,
        id,
        status.code(),
        status.message(),
        status.details(),
        metadata,
    );
    let (AnswerLimit::Frame(max) | AnswerLimit::Message(max)) = limit;
    if buf.len() > max {
        buf.clear();
        frame::encode_response_header(
            buf,
            id,
            status.code(),
            "status too large to send",
            &[],
            &crate::Metadata::new(),
        );
    }
    Payload::new()
}

/// Where a handler's outcome goes.
enum Sink {
    /// Straight to the connection that read the request. Dropped without delivering
    /// (its task aborted on a CANCEL), it sends `CANCELLED` instead: the connection
    /// frees the call's slot when that comes back, so an aborted call holds its slot
    /// until its handler is really gone, and every call is counted out exactly once.
    Connection(Option<(mpsc::UnboundedSender<Outcome>, Tag)>),
    /// Through the duplicate cache, to every connection waiting for this call.
    Cache(CallKey, SharedCache),
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Sink::Connection(Some((tx, tag))) = self {
            let _ = tx.send((*tag, Err(Status::cancelled("the call was cancelled"))));
        }
    }
}

impl Sink {
    fn deliver(mut self, outcome: Result<ServerReply, Status>) {
        match &mut self {
            Sink::Connection(to) => {
                if let Some((tx, tag)) = to.take() {
                    let _ = tx.send((tag, outcome));
                }
            }
            Sink::Cache(key, cache) => {
                let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
                let waiters = match &outcome {
                    // Refused by a layer before its handler ran (an auth layer): nothing
                    // to remember, and a peer without credentials must not fill the
                    // cache with its refusals. A retry runs the layers again.
                    Err(status) if status.is_before_handler() => cache.abandon(key),
                    _ => {
                        let bytes = outcome_size(&outcome);
                        if bytes > cache.max_outcome_bytes() {
                            // Kept as a small stand-in: a repeat learns the call ran,
                            // not its answer (those waiting now get the answer).
                            let kept = Err(Status::aborted(format!(
                                "the call ran; its outcome ({bytes} bytes) was too large for \
                                 the server to keep for repeats"
                            )));
                            let size = outcome_size(&kept);
                            cache.complete(key, kept, size, Instant::now())
                        } else {
                            cache.complete(key, outcome.clone(), bytes, Instant::now())
                        }
                    }
                };
                drop(cache);
                for (tx, tag) in waiters {
                    let _ = tx.send((tag, outcome.clone()));
                }
            }
        }
    }
}

/// What [`until_unattended`] watches besides the handler.
struct Unattended {
    key: CallKey,
    cache: SharedCache,
    /// [`DedupeConfig::max_unattended`](super::DedupeConfig).
    after: std::time::Duration,
    /// Counts the call among its `serve`'s keyed handlers while it runs; its token is
    /// cancelled when that serve ends.
    run: KeyedRun,
}

/// The keyed handlers one `serve` started (see [`until_unattended`]): they outlive
/// their connection, so that a retry finds their outcome, but not the serve. Its drain
/// waits for them (within the drain timeout); its end stops those left.
#[derive(Default)]
pub(crate) struct KeyedRuns {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
    /// Cancelled when the serve ends.
    pub(crate) stop: CancellationToken,
}

impl KeyedRuns {
    /// Ready once none is running.
    pub(crate) async fn idle(&self) {
        use std::sync::atomic::Ordering;
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One running keyed handler of a [`KeyedRuns`], counted from its spawn (so that a
/// drain cannot miss one not yet polled) until it is dropped.
pub(crate) struct KeyedRun(std::sync::Arc<KeyedRuns>);

impl KeyedRun {
    fn new(runs: &std::sync::Arc<KeyedRuns>) -> KeyedRun {
        runs.running
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        KeyedRun(runs.clone())
    }
}

impl Drop for KeyedRun {
    fn drop(&mut self) {
        if self
            .0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

/// Runs a keyed call's handler until it ends, or until nobody has waited for its
/// outcome for `after` (see [`DedupeConfig::max_unattended`](super::DedupeConfig)):
/// every connection that sent it or a retry closed, and no retry came. Checked every
/// quarter of `after`; the handler is then dropped and the call's outcome is
/// `ABORTED`, which the cache keeps for retries that come later. Stopped at once,
/// likewise, when the cache gives its place to a new call (`max_running` reached,
/// nobody waiting for it: [`Attention::Stop`]), and when the `serve` that started it
/// has ended (`serve_with_shutdown` aborts what is left after its drain: a keyed
/// handler outlives its connection, not its server).
async fn until_unattended<F>(
    handler: F,
    unattended: Unattended,
    method: crate::bytestr::ByteStr,
) -> Result<ServerReply, Status>
where
    F: Future<Output = Result<ServerReply, Status>>,
{
    use super::dedupe::Attention;
    let Unattended {
        key,
        cache,
        after,
        run,
    } = unattended;
    let stopped = run.0.stop.clone();
    let mut handler = std::pin::pin!(handler);
    // Not more often than every 100 ms, however short `after` is: each check takes
    // the cache's lock.
    let check = (after / 4).max(std::time::Duration::from_millis(100));
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut watch = Some(&stop);
    let mut alone_since: Option<Instant> = None;
    loop {
        let attention = cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attention(&key, watch.take());
        let now = Instant::now();
        match (attention, alone_since) {
            (Attention::Stop, _) => {
                tracing::info!(
                    %method,
                    "a keyed call nobody waited for was stopped to make room for new ones (max_running)"
                );
                return Err(Status::aborted(format!(
                    "{method}: every caller of this call went away, and the server needed its place \
                     for new calls (max_running); its handler was stopped, maybe part way, and the \
                     call is not run again"
                )));
            }
            (Attention::Awaited, _) => alone_since = None,
            (Attention::Unattended, None) => alone_since = Some(now),
            (Attention::Unattended, Some(since))
                if now.saturating_duration_since(since) >= after =>
            {
                tracing::info!(
                    %method,
                    ?after,
                    "a keyed call's callers all went away and no retry came: its handler was stopped"
                );
                return Err(Status::aborted(format!(
                    "{method}: every caller of this call went away and no retry came within {after:?}; \
                     its handler was stopped, maybe part way, and the call is not run again"
                )));
            }
            (Attention::Unattended, Some(_)) => {}
        }
        tokio::select! {
            biased;
            outcome = &mut handler => return outcome,
            () = stop.notified() => {}
            () = stopped.cancelled() => {
                tracing::info!(%method, "the server stopped serving: a keyed call's handler was stopped");
                return Err(Status::aborted(format!(
                    "{method}: the server stopped serving before the call ended; its handler \
                     was stopped, maybe part way, and the call is not run again"
                )));
            }
            () = tokio::time::sleep(check) => {}
        }
    }
}

/// Approximate memory an outcome holds, for the cache's byte bound.
fn outcome_size(outcome: &Result<ServerReply, Status>) -> usize {
    64 + match outcome {
        // Trailers too: a unary reply may carry them (they were held uncounted).
        Ok(reply) => {
            reply.payload.len()
                + frame::metadata_encoded_len(&reply.metadata)
                + frame::metadata_encoded_len(&reply.trailers)
        }
        Err(status) => {
            status.message().len()
                + status.details().len()
                + frame::metadata_encoded_len(status.metadata())
        }
    }
}

impl<L: Link> Connection<L> {
    /// Answers the requests that wait, parked for a busy service or read ahead while
    /// the connection is at its request limit, at their deadlines: `DEADLINE_EXCEEDED`,
    /// not run (docs/wire.md §6.6). They were answered only when they got their turn,
    /// which, with handlers that do not end, was never (from a review: a 300 ms budget
    /// answered after 5 s, when a slot freed). Nothing to do, and no clock read, while
    /// nothing waits.
    fn poll_waiting(&mut self, cx: &mut Context<'_>) {
        // Repeats answered since they attached wait for nothing.
        if !self.attached_deadlines.is_empty() {
            let in_flight = &self.in_flight;
            self.attached_deadlines
                .retain(|(tag, _)| in_flight.get(&tag.id).is_some_and(|(s, _)| *s == tag.seq));
        }
        if self.parked.is_empty() && self.lookahead.is_empty() && self.attached_deadlines.is_empty()
        {
            self.waiting_timer = None;
            return;
        }
        loop {
            let Some(next) = self.earliest_waiting() else {
                self.waiting_timer = None;
                return;
            };
            let timer = match &mut self.waiting_timer {
                Some((at, timer)) if *at == next => timer,
                slot => {
                    &mut slot
                        .insert((next, Box::pin(tokio::time::sleep_until(next))))
                        .1
                }
            };
            if timer.as_mut().poll(cx).is_pending() {
                return;
            }
            self.waiting_timer = None;
            if !self.expire_waiting(Instant::now()) {
                return;
            }
            // Answers queued: the next round writes them.
            cx.waker().wake_by_ref();
        }
    }

    /// The earliest deadline of the requests that wait.
    fn earliest_waiting(&self) -> Option<Instant> {
        let parked = self.parked.iter().filter_map(|p| p.deadline);
        let read_ahead = self
            .lookahead
            .iter()
            .filter_map(|(frame, _, read_at)| self.read_ahead_deadline(frame, *read_at));
        let attached = self
            .attached_deadlines
            .iter()
            .map(|&(_, deadline)| deadline);
        parked.chain(read_ahead).chain(attached).min()
    }

    /// The deadline of a request waiting in the look-ahead, if it has one. Not of a
    /// copy of a request being handled (over UDP): that one is dropped as a copy at
    /// its turn, and the first is answered.
    fn read_ahead_deadline(&self, frame: &Frame, read_at: Instant) -> Option<Instant> {
        match frame {
            Frame::Request(request)
                if !self.in_flight.contains_key(&request.id)
                    && !self.parked.iter().any(|p| p.tag.id == request.id) =>
            {
                request.timeout.map(|t| read_at + t)
            }
            _ => None,
        }
    }

    /// Answers the waiting requests whose deadlines are at or before `now`; whether
    /// there were any.
    fn expire_waiting(&mut self, now: Instant) -> bool {
        let mut expired = false;
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked[i].deadline.is_none_or(|d| d > now) {
                i += 1;
                continue;
            }
            let Some(parked) = self.parked.remove(i) else {
                break;
            };
            expired = true;
            self.counts.expired += 1;
            let status = Status::deadline_exceeded(format!(
                "{}: deadline exceeded while waiting for the service; not run",
                parked.call.method
            ));
            self.refuse(parked, status, "its deadline passed before it started");
        }
        let late: Vec<(u64, String, bool)> = self
            .lookahead
            .iter()
            .filter(|(frame, _, read_at)| {
                self.read_ahead_deadline(frame, *read_at)
                    .is_some_and(|deadline| deadline <= now)
            })
            .filter_map(|(frame, _, _)| match frame {
                Frame::Request(request) => {
                    Some((request.id, request.method.to_string(), request.streaming))
                }
                _ => None,
            })
            .collect();
        // A stream needs no request slot (6.9), and a unary request waited for one only
        // at the request limit: otherwise both waited for the connection to read on,
        // at the streams' bound (from reviews: they blamed a slot).
        let at_request_limit = self.busy() >= self.config.max_concurrent_requests;
        for (id, method, streaming) in late {
            expired = true;
            // The call's frames read behind its request go with it, as at a CANCEL.
            self.forget_read_ahead(id);
            self.last_id = self.last_id.max(id);
            self.counts.expired += 1;
            let status = Status::deadline_exceeded(if streaming || !at_request_limit {
                format!(
                    "{method}: deadline exceeded while the connection was not reading (at \
                     its limit of requests in flight or of unread stream messages); not run"
                )
            } else {
                format!("{method}: deadline exceeded while waiting for a request slot; not run")
            });
            self.queue_status(id, &status);
        }
        // Repeats waiting for their call's outcome (docs/wire.md §6.6: DEADLINE_EXCEEDED
        // also while the server waits): answered, taken off the call's waiters; the
        // call runs on, and a later retry gets its outcome (from a review: a repeat
        // with 0.5 s left was answered OK after the call's 3 s).
        let mut late = Vec::new();
        self.attached_deadlines.retain(|&(tag, deadline)| {
            let due = deadline <= now;
            if due {
                late.push(tag);
            }
            !due
        });
        // (Each still waits: `poll_waiting`, the one caller, pruned the answered.)
        for tag in late {
            expired = true;
            self.in_flight.remove(&tag.id);
            if !self.detach(tag) {
                // Its outcome is on its way: dropped when it comes, as a cancelled
                // call's, and its slot held until then.
                self.cancelled += 1;
            }
            self.counts.expired += 1;
            let status = Status::deadline_exceeded(
                "deadline exceeded while waiting for the outcome of an earlier attempt of \
                 this call, which goes on running: a retry with its call key gets the outcome",
            );
            self.queue_status(tag.id, &status);
        }
        expired
    }
}

impl<L: Link> Future for Connection<L> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let polled = this.poll_round(cx);
        if this.done.take_fresh() | this.streams_out.take_fresh() {
            // A channel made in this round after its receiver's last poll: have it
            // polled (so that its sends wake this task) before the task sleeps.
            cx.waker().wake_by_ref();
        }
        // Every call being handled or answered, open streams included (`busy` leaves
        // them out: they hold no slot of the request limit). A parked stream is in
        // `in_flight` already; a parked unary call is not.
        let in_flight = &this.in_flight;
        this.counts.in_flight = in_flight.len()
            + this
                .parked
                .iter()
                .filter(|p| !in_flight.contains_key(&p.tag.id))
                .count()
            + this.cancelled;
        // Pieces of a frame arriving since the last poll are the peer too, for the
        // keepalive: a long upload (a UDP message's fragments, a large frame over TCP)
        // with a PONG behind it, as a message numbered after it, is not silence.
        let receiving = this.link.receiving();
        if receiving != this.counts.receiving {
            this.heard = true;
        }
        this.counts.receiving = receiving;
        this.counts.unsent = this.link.unsent();
        this.counters.publish(&this.counts);
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => {
                let cause = this.closing.as_deref().unwrap_or("the client closed it");
                tracing::debug!(peer = %this.peer, cause, "connection closed");
                Poll::Ready(())
            }
            // A peer that broke its transport's own protocol (a link's message or
            // packet, a TLS record where a frame was expected): said at INFO, within
            // the bound of refusals, as the core's own refusals are (from a review:
            // the soft RDMA link's refusals were at DEBUG only).
            Poll::Ready(Err(err))
                if matches!(
                    err.kind(),
                    ErrorKind::Protocol | ErrorKind::UnsupportedVersion
                ) =>
            {
                // Counted as every refusal (from a review: the gRPC link's, the soft
                // RDMA provider's and a TLS record on a plain port were logged only).
                this._registered.count_refusal();
                static REFUSALS: crate::logs::LogLimiter = crate::logs::LogLimiter::for_refusals();
                if let Some(suppressed) = REFUSALS.allow() {
                    tracing::info!(peer = %this.peer, cause = %err, suppressed, "connection closed: the peer broke the transport's protocol");
                }
                Poll::Ready(())
            }
            // Ended for holding more than its share of unread answers (`held::Unsent`):
            // an operator's sign of clients that do not read, or of a bound set too
            // low, said at INFO within the refusals' bound (peers choose how often).
            Poll::Ready(Err(err)) if err.kind() == ErrorKind::LimitReached => {
                static ENDED: crate::logs::LogLimiter = crate::logs::LogLimiter::for_refusals();
                if let Some(suppressed) = ENDED.allow() {
                    tracing::info!(peer = %this.peer, cause = %err, suppressed, "connection closed: over the server's bound");
                }
                Poll::Ready(())
            }
            Poll::Ready(Err(err)) => {
                tracing::debug!(peer = %this.peer, cause = %err, "connection closed");
                Poll::Ready(())
            }
        }
    }
}

impl<L: Link> Drop for Connection<L> {
    fn drop(&mut self) {
        self.bulk_ops.close();
        self.bulk.fail_all("the connection closed");
        for parked in std::mem::take(&mut self.parked) {
            self.abandon(
                parked.key.as_ref(),
                parked.tag,
                "its connection closed before it started",
            );
        }
        for handle in self.in_flight.drain().filter_map(|(_, (_, h))| h) {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::stream::{held_message, COPY_BELOW};

    #[test]
    fn a_stream_message_after_ignored_metadata_does_not_keep_it_alive() {
        let frame = Bytes::from(vec![7u8; 16 << 10]);
        let after_metadata = held_message(frame.slice(8_000..8_000 + COPY_BELOW), 16 << 10);
        assert!(
            after_metadata.is_unique(),
            "the message keeps its frame alive"
        );
        let plain = held_message(frame.slice(8_000..8_000 + COPY_BELOW), 0);
        assert!(
            !plain.is_unique(),
            "a message without metadata, not short, is copied for nothing"
        );
        // A short one is copied whatever came with it (it kept the read buffer alive).
        let short = held_message(frame.slice(16_000..16_001), 0);
        assert!(short.is_unique());
        assert_eq!(&short[..], &[7]);
    }
}
