//! The connection driver: the one task that owns a channel's connection.
//!
//! It takes calls and cancels from the [`Channel`](super::Channel) handles over an
//! unbounded queue (bounded in practice by the channel's in-flight semaphore), writes
//! as many queued frames as the link accepts before one flush (so under load many
//! frames share a system call), reads responses and completes the matching caller.
//!
//! One exception to "the task writes": a unary call made while nothing else is in
//! flight is written by its caller, on the caller's thread, under the driver's lock
//! (`DriverCell`, `Driver::send_inline`), with the task's waker, so that a sequential
//! call costs the task one wake-up (for the answer) instead of two. The state is still
//! owned by one driver; the lock only decides who runs it.
//!
//! States: `Idle` (no connection; the next call connects), `Connecting`, `Connected`,
//! and `Backoff` after a failed attempt (calls fail fast with `UNAVAILABLE` until the
//! delay is over). A connection that received GOAWAY keeps running as `draining` until
//! its calls are answered, while new calls go to a new connection.
//!
//! On a link that may lose frames (UDP, [`Link::is_reliable`] false), each request the
//! link does not deliver itself is kept until its answer arrives and sent again, with
//! the same id and call key, whenever its retransmission timer fires (see
//! `Retransmitter`). A request for a method that is not safe to repeat gets a call key
//! first, so the server's duplicate cache runs it at most once.
//!
//! Ids leave each connection in increasing order, whatever order the callers' threads
//! queued them in: a call whose id is not above the last one written goes out under a
//! fresh id from the channel's counter (`Conn::renamed` maps it back for a cancel).
//! That is what lets GOAWAY's `last_id` name the calls the server never read
//! (`docs/wire.md` §6.4).
//!
//! What a server can make the client hold, and its bound (`docs/architecture.md`,
//! Client): calls in flight (`max_in_flight`, the caller's own); one frame
//! (`max_frame_len`) and its metadata (`max_metadata_len`); per stream, its window plus
//! one frame, every message counted at 64 bytes at least (`stream::message_cost`); queued
//! control answers (PONG, WINDOW, CANCEL, BULK_REPLY: [`MAX_CONTROL_FRAMES`],
//! [`MAX_CONTROL_BYTES`]), past which it stops reading.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
    future::Future,
    hash::{BuildHasher, Hasher},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::BytesMut;
use tokio::{
    sync::{mpsc, oneshot},
    time::{Instant, Sleep},
};

use super::{
    channel::{ChannelConfig, RetransmitConfig},
    pending::PendingTable,
    rto::RttEstimate,
};
use crate::keepalive::{Action, KeepaliveTimer};
use crate::{
    bulk::{self, BulkEnd, BulkOp, OneSidedSlot, Regions},
    bytestr::ByteStr,
    compress,
    frame::{self, DataFrame, Frame, GoAwayCode},
    idmap::IdMap,
    link::{Connector, Link, Received},
    metadata::Metadata,
    method::Idempotency,
    stream::{MessageStream, RawStreaming, StreamFeed, TakeOnce},
    Error, ErrorKind, Payload, Status,
};

/// Requests of a connection that advertise compression support before the server has
/// answered in kind; a server that never does is not asked forever.
const ADVERTISE_REQUESTS: u32 = 8;

/// The largest payload a caller compresses inline (`Driver::send_inline`); larger
/// ones go through the queue and are compressed by the driver task.
const INLINE_COMPRESS_MAX: usize = 64 * 1024;

/// Frames read per wake-up before the driver yields to other tasks.
const READ_BUDGET: usize = 32;

/// Messages one stream sends per round of the driver at most, so that streams whose
/// messages are always ready share the round's budget (`READ_BUDGET * 4`).
const STREAM_SENDS: usize = 16;

/// Most bytes of a server's GOAWAY reason kept in the statuses of the calls it fails
/// (senders write at most 1 KiB, docs/wire.md 2.8; a receiver accepts 64 KiB).
const MAX_REASON_LEN: usize = 1024;

/// Most CANCEL and PONG frames queued for a server that is not reading; past it the
/// driver stops reading (so a PING flood cannot grow the queue without bound).
const MAX_CONTROL_FRAMES: usize = 1024;

/// Most bytes of those frames (a PONG echoes its PING's payload, a BULK_REPLY carries
/// data): past it the driver stops reading too, so the queue holds at most this plus
/// one frame, not [`MAX_CONTROL_FRAMES`] maximum-size frames.
const MAX_CONTROL_BYTES: usize = 1 << 20;

/// Most connections a channel keeps draining after their server's GOAWAY (each until
/// its calls end); past it the oldest is dropped and its calls fail. Room for long
/// streams (watches) left on connections a server closes by age, one after another.
const MAX_DRAINING: usize = 64;

/// The credit a stream message of `len` bytes costs (at least 64 bytes, so that empty
/// messages cost credit too: `docs/wire.md` §6.9).
fn cost(len: usize) -> i64 {
    i64::try_from(crate::stream::message_cost(len)).unwrap_or(i64::MAX)
}

/// What a call's caller gets: a unary response, or a stream's headers and messages.
///
/// Small on purpose (it moves through a oneshot on every call): a failed call's status
/// travels as the `Err` beside it, and a stream's reader is boxed.
pub(crate) enum Answer {
    Unary {
        metadata: Metadata,
        payload: bytes::Bytes,
        /// The payload arrived compressed: the caller decompresses it, to no more
        /// than this many bytes (`max_frame_len`, or the link's lower message limit,
        /// [`Link::max_message_len`]).
        compressed: Option<usize>,
    },
    Stream(Box<(Metadata, RawStreaming)>),
}

type Reply = oneshot::Sender<Result<Answer, Status>>;

/// What a [`Channel`](super::Channel) asks its driver to do.
// Calls are nearly every command: boxing them would cost an allocation per call to
// save queue space on the rare small ones.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    Call(Outgoing),
    Cancel(u64),
    /// The reader of stream `id` consumed `bytes`: give them back to the server.
    Credit {
        id: u64,
        bytes: u32,
    },
    /// A bulk read or write of a buffer the server exposed.
    Bulk(BulkOp),
    /// Connect now if idle, with no call to send: a warm-up
    /// ([`Channel::connect_idle`](super::Channel::connect_idle)).
    Connect,
}

/// A call waiting to be written.
pub(crate) struct Outgoing {
    pub(crate) id: u64,
    pub(crate) method: ByteStr,
    pub(crate) idempotency: Idempotency,
    pub(crate) metadata: Metadata,
    pub(crate) deadline: Option<Instant>,
    pub(crate) call_key: Option<frame::CallKey>,
    pub(crate) payload: Payload,
    /// A streaming call's request messages, as the caller's
    /// [`ClientCall`](crate::client::ClientCall) holds them: taken when the call is
    /// written, so that a call refused before (no connection) leaves them untouched
    /// for the caller to send elsewhere.
    pub(crate) stream: Option<TakeOnce<MessageStream>>,
    /// The caller's compression hint for the payload.
    pub(crate) compress: Option<bool>,
    /// The driver's own command queue, for a stream's reader (credit, cancel).
    pub(crate) commands: Option<mpsc::UnboundedSender<Command>>,
    pub(crate) reply: Reply,
}

impl Outgoing {
    /// Fails a call that was never sent (no connection), as unprocessed.
    fn refuse(self, status: Status) {
        let _ = self.reply.send(Err(status.into_unprocessed()));
    }
}

/// The status of a streaming call whose request messages another sending of it took.
pub(crate) fn already_taken() -> Status {
    Status::internal(
        "the request stream of this call was already taken (streaming calls cannot be sent \
         twice)",
    )
}

type ConnectFuture<L> = Pin<Box<dyn Future<Output = Result<L, Error>> + Send>>;

enum State<L> {
    Idle,
    Connecting(ConnectFuture<L>),
    // Boxed: a connection's state is large and the other states are small.
    Connected(Box<Conn<L>>),
    Backoff {
        sleep: Pin<Box<Sleep>>,
        cause: String,
    },
}

pub(crate) struct Driver<C: Connector> {
    connector: Arc<C>,
    config: Arc<ChannelConfig>,
    commands: mpsc::UnboundedReceiver<Command>,
    commands_closed: bool,
    outbox: VecDeque<Outgoing>,
    state: State<C::Link>,
    /// Connections that received GOAWAY and still answer calls sent before it.
    draining: Vec<Conn<C::Link>>,
    /// A warm-up was asked for ([`Command::Connect`]): connect even with no call.
    warm: bool,
    /// Connects that failed, since the driver started.
    connect_failures: u64,
    /// The failed connects of the current outage were logged at WARN (the first of
    /// them): the others go at DEBUG, until a connection opens.
    outage_logged: bool,
    failed_attempts: u32,
    scratch: BytesMut,
    /// The client id of the call keys this channel gives requests on unreliable links.
    client_id: u128,
    /// The channel's id counter, for a call that must go out under a fresh id.
    next_id: Arc<AtomicU64>,
    /// Buffers this channel exposed for bulk transfer, served to the server.
    regions: Arc<Regions>,
    one_sided: OneSidedSlot,
}

impl<C: Connector> Driver<C> {
    pub(crate) fn new(
        connector: Arc<C>,
        config: Arc<ChannelConfig>,
        commands: mpsc::UnboundedReceiver<Command>,
        link: Option<C::Link>,
        regions: Arc<Regions>,
        one_sided: OneSidedSlot,
        next_id: Arc<AtomicU64>,
    ) -> Self {
        Driver {
            connector,
            commands,
            commands_closed: false,
            outbox: VecDeque::new(),
            state: match link {
                Some(link) => {
                    State::Connected(Box::new(Conn::new(link, &config, &regions, &one_sided)))
                }
                None => State::Idle,
            },
            draining: Vec::new(),
            warm: false,
            connect_failures: 0,
            outage_logged: false,
            failed_attempts: 0,
            scratch: BytesMut::with_capacity(256),
            client_id: frame::random_client_id(),
            next_id,
            config,
            regions,
            one_sided,
        }
    }

    /// Takes every queued command.
    fn poll_commands(&mut self, cx: &mut Context<'_>) {
        while !self.commands_closed {
            match self.commands.poll_recv(cx) {
                Poll::Ready(Some(Command::Call(call))) => {
                    if let State::Backoff { cause, .. } = &self.state {
                        call.refuse(Status::unavailable(format!(
                            "not connected to {}: {cause}",
                            self.connector.target()
                        )));
                    } else {
                        self.outbox.push_back(call);
                    }
                }
                Poll::Ready(Some(Command::Cancel(id))) => {
                    self.cancel(id);
                }
                // Only where it can start a connection: left set while connected, it
                // reconnected at once, with no call, after an idle timeout's GOAWAY.
                Poll::Ready(Some(Command::Connect)) => {
                    self.warm = matches!(self.state, State::Idle | State::Backoff { .. });
                }
                Poll::Ready(Some(Command::Bulk(op))) => match &mut self.state {
                    State::Connected(conn) if !conn.link.carries_bulk() => {
                        let _ = op.reply.send(Err(crate::bulk::not_carried(&conn.peer)));
                    }
                    State::Connected(conn) => conn.bulk_out.push_back(op),
                    _ => {
                        let _ = op.reply.send(Err(Status::unavailable(
                            "not connected: the exposed buffer's connection is gone",
                        )));
                    }
                },
                Poll::Ready(Some(Command::Credit { id, bytes })) => {
                    if let State::Connected(conn) = &mut self.state {
                        if conn.give_credit(id, bytes) {
                            continue;
                        }
                    }
                    for conn in &mut self.draining {
                        if conn.give_credit(id, bytes) {
                            break;
                        }
                    }
                }
                Poll::Ready(None) => self.commands_closed = true,
                Poll::Pending => break,
            }
        }
    }

    fn cancel(&mut self, id: u64) {
        if self.withdraw(id).is_some() {
            return;
        }
        if let State::Connected(conn) = &mut self.state {
            if conn.cancel(id) {
                return;
            }
        }
        for conn in &mut self.draining {
            if conn.cancel(id) {
                return;
            }
        }
    }

    /// Takes call `id` out of the outbox if it is still there (never written): it
    /// will not be sent.
    fn withdraw(&mut self, id: u64) -> Option<Outgoing> {
        let pos = self.outbox.iter().position(|c| c.id == id)?;
        self.outbox.remove(pos)
    }

    /// Takes call `id` back from the connection's link, which was given it but has
    /// not sent it and will not ([`Link::withdraw`]): true if it did (from a review: a
    /// UDP call whose handshake was never answered said it waited for the answer,
    /// not unprocessed). For a call no longer in the outbox ([`withdraw`](Self::withdraw)).
    fn withdraw_from_link(&mut self, id: u64) -> bool {
        match &mut self.state {
            State::Connected(conn) => conn.withdraw(id),
            _ => false,
        }
    }

    /// Advances the connection state machine. Returns whether the state changed.
    fn poll_state(&mut self, cx: &mut Context<'_>) -> bool {
        match &mut self.state {
            State::Idle => {
                if self.outbox.is_empty() && !self.warm {
                    return false;
                }
                self.warm = false;
                let connector = self.connector.clone();
                let config = self.config.clone();
                self.state = State::Connecting(Box::pin(async move {
                    match tokio::time::timeout(
                        config.connect_timeout,
                        connector.connect(&config.link),
                    )
                    .await
                    {
                        Ok(result) => result,
                        Err(_) => Err(Error::new(
                            ErrorKind::TimedOut,
                            format!("connect timed out after {:?}", config.connect_timeout),
                        )),
                    }
                }));
                true
            }
            State::Connecting(fut) => match fut.as_mut().poll(cx) {
                Poll::Pending => false,
                Poll::Ready(Ok(link)) => {
                    // `failed_attempts` is reset when the connection ends, if it proved
                    // itself by then (`Conn::proven`): connections that close, or are
                    // turned away by GOAWAY, before the server served them, one after
                    // another, are failed attempts, not successes to reconnect after
                    // at once.
                    if self.outage_logged {
                        // The end of a row of failures logged at WARN (the first).
                        tracing::info!(peer = %link.peer(), failed_attempts = self.failed_attempts, "connection opened after failed attempts");
                    } else {
                        tracing::debug!(peer = %link.peer(), "connection opened");
                    }
                    self.outage_logged = false;
                    self.warm = false;
                    self.state = State::Connected(Box::new(Conn::new(
                        link,
                        &self.config,
                        &self.regions,
                        &self.one_sided,
                    )));
                    true
                }
                Poll::Ready(Err(err)) => {
                    let cause = format!("connect to {} failed: {err}", self.connector.target());
                    // The first of a row at WARN, the others (one per backoff, for as
                    // long as the peer is away: a replica gone but still registered,
                    // which `Balanced` keeps trying in the background) at DEBUG.
                    self.connect_failures += 1;
                    if !self.outage_logged {
                        self.outage_logged = true;
                        tracing::warn!(%cause, "connect failed: calls fail UNAVAILABLE until the backoff ends");
                    } else {
                        tracing::debug!(%cause, failed_attempts = self.failed_attempts + 1, "connect failed again");
                    }
                    self.back_off(cause);
                    true
                }
            },
            State::Backoff { sleep, .. } => {
                if sleep.as_mut().poll(cx).is_ready() {
                    self.state = State::Idle;
                    true
                } else {
                    false
                }
            }
            State::Connected(conn) => {
                let io = Io {
                    scratch: &mut self.scratch,
                    config: &self.config,
                    client_id: self.client_id,
                    next_id: &self.next_id,
                };
                match conn.poll_io(cx, &mut self.outbox, io) {
                    Ok(ConnState::Open) => false,
                    Ok(ConnState::Draining) => {
                        let proven = conn.proven(&self.config);
                        let cause = format!(
                            "{} sent GOAWAY before serving the connection (draining or \
                             overloaded)",
                            conn.peer
                        );
                        let State::Connected(conn) =
                            std::mem::replace(&mut self.state, State::Idle)
                        else {
                            unreachable!()
                        };
                        self.draining.push(*conn);
                        if self.draining.len() > MAX_DRAINING {
                            // A server that sends GOAWAY on every new connection while
                            // holding a call on each would have this channel keep them
                            // all, each with its buffers: the oldest goes, its calls
                            // failed (they may have run: their ids were taken).
                            let mut oldest = self.draining.remove(0);
                            oldest.fail_all(
                                &format!(
                                    "connection to {} dropped: more than {MAX_DRAINING} \
                                     connections were draining after GOAWAY",
                                    oldest.peer
                                ),
                                false,
                            );
                        }
                        // A GOAWAY on a connection that proved itself (an idle timeout,
                        // a rotation, a shutdown) reconnects at once, and so does the
                        // first of a row on connections that did not; from the second
                        // such in a row it is a failed attempt (a server that accepts
                        // every connection and turns it away at once had every call
                        // open a connection: a reconnect storm at a server that is
                        // draining or overloaded).
                        if proven || self.failed_attempts == 0 {
                            self.failed_attempts = u32::from(!proven);
                        } else {
                            tracing::warn!(%cause, "GOAWAY before the server served the connection: calls fail UNAVAILABLE until the backoff ends");
                            self.back_off(cause);
                        }
                        true
                    }
                    Err(err) => {
                        // Its calls fail UNAVAILABLE.
                        let cause = format!("connection to {} lost: {err}", conn.peer);
                        // Unprocessed too when the server speaks another protocol: it
                        // ran nothing of this wire.
                        let unprocessed =
                            err.kind() == ErrorKind::Refused || err.is_another_protocol();
                        conn.fail_all(&cause, unprocessed);
                        let proven = conn.proven(&self.config);
                        if proven || self.failed_attempts == 0 {
                            // One that worked, or the first lost before the server
                            // served it (a server that crashed during a fresh
                            // connection's first call): the next call reconnects at once.
                            tracing::info!(peer = %conn.peer, cause = %err, "connection lost");
                            self.failed_attempts = u32::from(!proven);
                            self.state = State::Idle;
                        } else {
                            // Lost before the server served it, after a failed attempt
                            // already (a server that accepts and closes, perhaps with a
                            // GOAWAY for an error such as TOO_MANY_CONNECTIONS, or is not
                            // a server of this wire): a failed attempt, or every call
                            // would open a connection.
                            tracing::warn!(%cause, "connection lost before the server served it: calls fail UNAVAILABLE until the backoff ends");
                            self.back_off(cause);
                        }
                        true
                    }
                }
            }
        }
    }

    fn poll_draining(&mut self, cx: &mut Context<'_>) {
        let mut empty = VecDeque::new();
        let (scratch, config, client_id) = (&mut self.scratch, &self.config, self.client_id);
        let next_id = &self.next_id;
        self.draining.retain_mut(|conn| {
            let io = Io {
                scratch: &mut *scratch,
                config,
                client_id,
                next_id,
            };
            match conn.poll_io(cx, &mut empty, io) {
                Err(err) => {
                    conn.fail_all(
                        &format!("draining connection to {} closed: {err}", conn.peer),
                        false,
                    );
                    false
                }
                Ok(_) => !conn.is_idle(),
            }
        });
    }

    /// Writes `call` from the caller's thread, under the driver's lock, when the
    /// connection is otherwise idle: an open connection with nothing in flight or
    /// queued. On a link that may lose it, the request's retransmission timer is armed
    /// here too, with the task's waker. It saves the driver task a wake-up and a round
    /// per sequential call (the task still reads the answer). Under load calls go through the queue
    /// instead, where many share a write. `cx` carries the driver task's waker, so what
    /// the write registers (the link's readiness) wakes the task, not the caller.
    /// Gives the call back when it cannot be sent here.
    // The call comes back by value: boxing it would cost an allocation per call.
    #[allow(clippy::result_large_err)]
    fn send_inline(&mut self, call: Outgoing, cx: &mut Context<'_>) -> Result<(), Outgoing> {
        let State::Connected(conn) = &mut self.state else {
            return Err(call);
        };
        // A large payload to compress is compressed by the task: under the lock it
        // would hold the task (and its runtime thread) for as long.
        let compresses = self.config.compression.is_some() && call.compress != Some(false);
        if call.stream.is_some()
            || (compresses && call.payload.len() > INLINE_COMPRESS_MAX)
            || !self.outbox.is_empty()
            || !conn.is_idle()
            || !conn.control.is_empty()
            || conn.needs_flush
            || conn.goaway
            || conn.failed.is_some()
        {
            return Err(call);
        }
        let mut io = Io {
            scratch: &mut self.scratch,
            config: &self.config,
            client_id: self.client_id,
            next_id: &self.next_id,
        };
        let written = if conn.retransmit.as_ref().is_some_and(|r| r.has_due()) {
            // Requests due again go first, as the task's write orders them.
            self.outbox.push_back(call);
            conn.poll_write(cx, &mut self.outbox, &mut io)
        } else {
            // Straight to the link (through the queue, the call moved twice more and
            // the write looked at every other queue for nothing).
            match conn.link.poll_ready(cx) {
                Poll::Ready(Ok(())) => conn
                    .write_call(call, io.scratch, io.config, io.client_id, io.next_id)
                    .and_then(|()| conn.flush(cx)),
                // The task, woken by the link's readiness, writes it.
                Poll::Pending => {
                    self.outbox.push_back(call);
                    Ok(())
                }
                Poll::Ready(Err(err)) => {
                    self.outbox.push_back(call);
                    Err(err)
                }
            }
        };
        if let Err(err) = written {
            conn.failed = Some(err);
            cx.waker().wake_by_ref();
        }
        if let Some(retransmit) = &mut conn.retransmit {
            // The request's retransmission timer, armed with the task's waker: the task
            // is not woken for the send, only when the answer comes or the timer fires.
            retransmit.poll_timers(cx);
            if retransmit.has_due() {
                cx.waker().wake_by_ref();
            }
        }
        Ok(())
    }

    /// After a failed attempt: fails the queued calls, and refuses new ones until a
    /// backoff that grows with the failures in a row has passed.
    fn back_off(&mut self, cause: String) {
        for call in self.outbox.drain(..) {
            call.refuse(Status::unavailable(cause.clone()));
        }
        let delay = self.backoff_delay();
        self.failed_attempts = self.failed_attempts.saturating_add(1);
        self.state = State::Backoff {
            sleep: Box::pin(tokio::time::sleep(delay)),
            cause,
        };
    }

    fn backoff_delay(&self) -> Duration {
        let min = self.config.backoff_min.as_secs_f64();
        let max = self.config.backoff_max.as_secs_f64();
        let exp = min * 2f64.powi(self.failed_attempts.min(30) as i32);
        // Jitter: a uniform factor in [0.5, 1.0), so clients restarted together spread out.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(self.failed_attempts);
        let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(exp.min(max) * (0.5 + unit / 2.0))
    }

    fn is_finished(&self) -> bool {
        self.commands_closed
            && self.outbox.is_empty()
            && self.draining.is_empty()
            && match &self.state {
                State::Connected(conn) => conn.is_idle(),
                _ => true,
            }
    }
}

impl<C: Connector> Future for Driver<C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            // Takes commands until the queue is empty, which registers this task for
            // the next one: a command queued from here on wakes it again.
            this.poll_commands(cx);
            let state_changed = this.poll_state(cx);
            this.poll_draining(cx);
            if this.is_finished() {
                // Every handle dropped, nothing in flight: the connection is closed as
                // its transport closes, once and without waiting for the socket (TLS
                // sends close_notify; from a review: the CLI's connections ended with a
                // bare FIN).
                if let State::Connected(conn) = &mut this.state {
                    let _ = conn.link.poll_close(cx);
                }
                return Poll::Ready(());
            }
            // Another round only for a new connection state (connecting, connected,
            // failed, draining after GOAWAY, backoff over), which the commands just taken
            // may need: a second round of I/O after the calls were written had been a
            // third of a sequential call's driver work.
            if !state_changed {
                return Poll::Pending;
            }
        }
    }
}

/// A driver shared between its task and the callers that send inline
/// ([`Driver::send_inline`]): the task polls it under the lock and leaves its waker
/// here for the callers' rounds.
pub(crate) struct DriverCell<C: Connector> {
    inner: std::sync::Mutex<Locked<C>>,
    /// Whether the driver's connection, after its last poll, can take a call inline
    /// (open): read before taking the lock, so that the callers of a channel that is
    /// connecting or backing off do not pay for trying.
    inline_ok: std::sync::atomic::AtomicBool,
    /// Whether the driver, after its last poll, has no connection and is not making
    /// one nor backing off: a warm-up ([`Command::Connect`]) would start one.
    idle: std::sync::atomic::AtomicBool,
    /// The driver's failed connects, after its last poll.
    connect_failures: AtomicU64,
    /// Set when the task's future is gone ([`TaskGone`]):
    /// [`Channel::close`](super::Channel::close) waits for it.
    ended: Ended,
}

/// Whether a driver task has ended, and a way to wait for it.
#[derive(Default)]
pub(crate) struct Ended {
    done: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Ended {
    fn set(&self) {
        self.done.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Resolves once the task has ended (at once if it has).
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the flag is read: a `set` in between still wakes it.
            notified.as_mut().enable();
            if self.done.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

struct Locked<C: Connector> {
    /// `None` once the task is gone (finished, aborted, panicked, or its runtime shut
    /// down): see [`TaskGone`].
    driver: Option<Driver<C>>,
    /// The driver task's waker, from its last poll (`None` before the first).
    waker: Option<std::task::Waker>,
}

impl<C: Connector> DriverCell<C> {
    pub(crate) fn new(driver: Driver<C>) -> Arc<Self> {
        let idle = matches!(driver.state, State::Idle);
        Arc::new(DriverCell {
            inner: std::sync::Mutex::new(Locked {
                driver: Some(driver),
                waker: None,
            }),
            inline_ok: std::sync::atomic::AtomicBool::new(false),
            idle: std::sync::atomic::AtomicBool::new(idle),
            connect_failures: AtomicU64::new(0),
            ended: Ended::default(),
        })
    }

    /// The driver task's future. However the task ends, the driver goes with it
    /// ([`TaskGone`]), as when the task owned it outright.
    pub(crate) fn run(self: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let gone = TaskGone(self);
        std::future::poll_fn(move |cx| {
            let cell = &gone.0;
            let mut locked = cell.inner.lock().unwrap_or_else(|e| e.into_inner());
            if !locked
                .waker
                .as_ref()
                .is_some_and(|waker| waker.will_wake(cx.waker()))
            {
                locked.waker = Some(cx.waker().clone());
            }
            let Some(driver) = locked.driver.as_mut() else {
                return Poll::Ready(());
            };
            let polled = Pin::new(&mut *driver).poll(cx);
            let inline_ok = matches!(&driver.state, State::Connected(_));
            if cell.inline_ok.load(Ordering::Relaxed) != inline_ok {
                cell.inline_ok.store(inline_ok, Ordering::Relaxed);
            }
            let idle = matches!(&driver.state, State::Idle) && !driver.warm;
            if cell.idle.load(Ordering::Relaxed) != idle {
                cell.idle.store(idle, Ordering::Relaxed);
            }
            if cell.connect_failures.load(Ordering::Relaxed) != driver.connect_failures {
                cell.connect_failures
                    .store(driver.connect_failures, Ordering::Relaxed);
            }
            polled
        })
    }
}

/// Held by the driver task's future: when the future is dropped (the driver finished,
/// the task was aborted or panicked, its runtime shut down) it takes the driver out of
/// the cell and drops it, which drops its command queue and its callers' reply
/// senders: waiting calls fail and new ones are refused ("channel driver has stopped")
/// instead of waiting on a driver nobody polls.
struct TaskGone<C: Connector>(Arc<DriverCell<C>>);

impl<C: Connector> Drop for TaskGone<C> {
    fn drop(&mut self) {
        self.0.inline_ok.store(false, Ordering::Relaxed);
        self.0.idle.store(false, Ordering::Relaxed);
        let driver = {
            let mut locked = self.0.inner.lock().unwrap_or_else(|e| e.into_inner());
            locked.waker = None;
            locked.driver.take()
        };
        // Dropped outside the lock: it runs the links' and the callers' drop code.
        drop(driver);
        self.0.ended.set();
    }
}

/// What a channel's handle sees of its connection's driver: the inline send, and the
/// taking back of a call whose deadline passed before it was written, without the
/// connector's type.
pub(crate) trait InlineSend: Send + Sync {
    /// Sends `call` now if the driver is free and its connection idle; gives it back
    /// otherwise (the caller then queues it).
    // The call comes back by value: boxing it would cost an allocation per call.
    #[allow(clippy::result_large_err)]
    fn try_send(&self, call: Outgoing) -> Result<(), Outgoing>;

    /// Takes call `id` back if it has not been written yet (still in the command queue
    /// or the outbox), so that it never will be; returns whether it did. For a call
    /// whose deadline passed: only the driver knows whether it left. Does not wait for
    /// the driver's lock (`false` when it is busy); not on the path of a call that is
    /// answered in time.
    fn withdraw(&self, id: u64) -> bool;

    /// Whether the connection was open at the driver's last poll.
    fn connected(&self) -> bool;

    /// Whether the driver, at its last poll, had no connection and was neither making
    /// one nor backing off.
    fn idle(&self) -> bool;

    /// The driver's failed connects so far, as of its last poll.
    fn connect_failures(&self) -> u64;

    /// Set when the driver's task has ended.
    fn ended(&self) -> &Ended;
}

impl<C: Connector> InlineSend for DriverCell<C> {
    fn try_send(&self, call: Outgoing) -> Result<(), Outgoing> {
        if !self.inline_ok.load(Ordering::Relaxed) {
            return Err(call);
        }
        // Busy (the task or another caller is in it): queue instead of waiting.
        let mut locked = match self.inner.try_lock() {
            Ok(locked) => locked,
            Err(std::sync::TryLockError::WouldBlock) => return Err(call),
            Err(std::sync::TryLockError::Poisoned(_)) => {
                // A panic under the lock: leave the driver to its task from now on.
                self.inline_ok.store(false, Ordering::Relaxed);
                return Err(call);
            }
        };
        let Locked { driver, waker } = &mut *locked;
        let (Some(driver), Some(waker)) = (driver.as_mut(), waker.as_ref()) else {
            return Err(call);
        };
        driver.send_inline(call, &mut Context::from_waker(waker))
    }

    fn withdraw(&self, id: u64) -> bool {
        let withdrawn = {
            // Busy (the task or another caller is in it): not waited for, as deadlines
            // pass in crowds when a server falls behind, and each would block its
            // thread. The call is then not known unsent (a retry takes it as one that
            // may have run), and the driver does not write it at its turn, its
            // deadline being past.
            let Ok(mut locked) = self.inner.try_lock() else {
                return false;
            };
            let Locked { driver, waker } = &mut *locked;
            let Some(driver) = driver.as_mut() else {
                return false;
            };
            // Commands still queued first, with the task's waker (the queue then wakes
            // the task, as before), so that the call is found wherever it waits. The
            // task is woken too, for what they asked of it (a call to connect for, a
            // cancel to write).
            let waker = waker.as_ref().unwrap_or(std::task::Waker::noop());
            driver.poll_commands(&mut Context::from_waker(waker));
            waker.wake_by_ref();
            match driver.withdraw(id) {
                Some(call) => Some(call),
                None => return driver.withdraw_from_link(id),
            }
        };
        // (The call is dropped here, outside the lock.)
        withdrawn.is_some()
    }

    fn connected(&self) -> bool {
        self.inline_ok.load(Ordering::Relaxed)
    }

    fn ended(&self) -> &Ended {
        &self.ended
    }

    fn idle(&self) -> bool {
        self.idle.load(Ordering::Relaxed)
    }

    fn connect_failures(&self) -> u64 {
        self.connect_failures.load(Ordering::Relaxed)
    }
}

/// Whether a connection can take new calls after a round of I/O.
enum ConnState {
    Open,
    /// The server sent GOAWAY: finish the calls in flight, send nothing new.
    Draining,
}

/// What a connection's I/O round borrows from the driver.
struct Io<'a> {
    scratch: &'a mut BytesMut,
    config: &'a ChannelConfig,
    client_id: u128,
    next_id: &'a AtomicU64,
}

/// One live connection and the calls in flight on it.
struct Conn<L> {
    link: L,
    /// The most a compressed answer may expand to: `max_frame_len`, or the link's
    /// lower message limit ([`Link::max_message_len`]).
    max_message_len: usize,
    peer: String,
    pending: PendingTable<Reply>,
    /// CANCEL, PONG, WINDOW and BULK_REPLY frames waiting for the link to be ready.
    control: VecDeque<(BytesMut, Payload)>,
    /// Bytes of the frames in `control`.
    control_bytes: usize,
    /// Highest request id written on this connection.
    last_sent_id: u64,
    /// Calls written under a fresh id because theirs was not above `last_sent_id`: the
    /// id on the wire → the caller's. Empty unless threads raced; only then searched.
    renamed: IdMap<u64>,
    needs_flush: bool,
    goaway: bool,
    /// Requests to send again, on a link that may lose them (`None` on reliable links).
    retransmit: Option<Box<Retransmitter>>,
    /// Streaming calls in flight.
    streams: IdMap<ClientStream>,
    /// Where the next round of stream sends starts (`poll_stream_sends`).
    send_from: usize,
    /// The compression algorithms the server said it accepts (none yet: empty).
    peer_accepts: compress::Accepted,
    /// Requests that advertised our compression support so far.
    advertised: u32,
    /// The last method name found sendable: a connection's calls mostly name a few
    /// methods, so the check of each name is mostly one comparison.
    sendable_method: Option<ByteStr>,
    /// Bulk operations of the application, to send and in flight.
    bulk_out: VecDeque<BulkOp>,
    bulk: BulkEnd,
    regions: Arc<Regions>,
    /// PINGs after silence (`None`: off, or the link does not carry PINGs).
    keepalive: Option<KeepaliveTimer>,
    /// A frame arrived since the keepalive timer was last armed.
    heard: bool,
    /// [`Link::receiving`] when the keepalive last looked: a change is the server
    /// sending (a frame in pieces, a UDP message's fragments), before any frame is whole.
    receiving_seen: u64,
    /// On a link that may lose frames (UDP), [`Link::unsent`] when the keepalive last
    /// looked: it moves only as the server acknowledges our messages (a keepalive PING
    /// goes as one), which is the server too, even when its PONG was lost (at 30% loss
    /// each way all three PONGs of a round were lost in 3% of rounds, failing the
    /// connection and its calls as possibly run). `None` on a reliable link, where it
    /// moves as the kernel takes bytes, which says nothing of the server.
    unsent_seen: Option<u64>,
    /// On a reliable link: its measure of unwritten bytes when it last changed (or was
    /// 0), as seen at the keepalive timer's firings, and when: a server whose reading
    /// has stopped for [`MIN_WRITE_STALL`](crate::keepalive::MIN_WRITE_STALL) is dead,
    /// whatever it sends.
    write_stall: crate::keepalive::WriteStall<u64>,
    /// A control frame (a PONG, say) went to the link since the keepalive last looked:
    /// while reading is stopped at the control bound, the sign that the server reads.
    control_moved: bool,
    /// The server has served this connection: a frame other than GOAWAY arrived on
    /// it, or a GOAWAY that keeps calls of ours to answer (see `Conn::proven`).
    served: bool,
    /// When the connection was made.
    opened: Instant,
    /// The link failed during a caller's inline send (`Driver::send_inline`): the
    /// driver task's next round fails the connection with it.
    failed: Option<Error>,
}

/// A streaming call in flight.
struct ClientStream {
    /// Until the server's first frame: the caller and the reader it will get.
    head: Option<(Reply, RawStreaming)>,
    feed: StreamFeed,
    /// The request messages still to send; `None` once the half-close went out.
    send: Option<MessageStream>,
    /// A message taken from `send` that waits for credit.
    held: Option<Payload>,
    /// The server's credit for our messages, in bytes.
    send_credit: i64,
    /// Bytes the server sent that the reader has not given back yet.
    received: i64,
}

impl ClientStream {
    /// Hands the caller its reply (headers and the stream) on the server's first frame.
    fn deliver_head(&mut self, metadata: Metadata) {
        if let Some((reply, body)) = self.head.take() {
            // If the caller is gone, the reader is dropped with the answer and cancels.
            let _ = reply.send(Ok(Answer::Stream(Box::new((metadata, body)))));
        }
    }

    fn fail(&mut self, status: Status) {
        match self.head.take() {
            Some((reply, _)) => {
                let _ = reply.send(Err(status));
            }
            None => self.feed.end(Err(status)),
        }
    }
}

impl<L: Link> Conn<L> {
    fn new(
        link: L,
        config: &ChannelConfig,
        regions: &Arc<Regions>,
        one_sided: &OneSidedSlot,
    ) -> Self {
        *one_sided.write().unwrap_or_else(|e| e.into_inner()) = link.one_sided();
        let max_message_len = link
            .max_message_len()
            .map_or(config.link.max_frame_len, |max| {
                max.min(config.link.max_frame_len)
            });
        let unsent_seen = (!link.is_reliable()).then_some(0);
        let keepalive = link
            .carries_ping()
            .then(|| KeepaliveTimer::new(config.keepalive, link.is_reliable()))
            .flatten();
        Conn {
            max_message_len,
            peer: link.peer(),
            retransmit: (!link.is_reliable())
                .then(|| Box::new(Retransmitter::new(config.retransmit))),
            link,
            pending: PendingTable::new(),
            control: VecDeque::new(),
            control_bytes: 0,
            last_sent_id: 0,
            renamed: IdMap::default(),
            needs_flush: false,
            goaway: false,
            streams: IdMap::default(),
            send_from: 0,
            peer_accepts: compress::Accepted::default(),
            advertised: 0,
            sendable_method: None,
            bulk_out: VecDeque::new(),
            bulk: BulkEnd::default(),
            regions: regions.clone(),
            keepalive,
            heard: false,
            receiving_seen: 0,
            unsent_seen,
            write_stall: crate::keepalive::WriteStall::new(),
            control_moved: false,
            served: false,
            opened: Instant::now(),
            failed: None,
        }
    }

    /// Adds the compression advertisement to a request's metadata while the server has
    /// not answered in kind (and only for the first requests).
    fn advertise(&mut self, metadata: &mut Metadata, config: &ChannelConfig) {
        let Some(compression) = config.compression.as_ref() else {
            return;
        };
        if compress::Compression::is_available()
            && self.peer_accepts.is_empty()
            && self.advertised < ADVERTISE_REQUESTS
        {
            let value = compress::advertisement(compression);
            // Only if the request still fits the metadata limits with it: checked
            // before (a call over them fails alone), it must not be pushed over them
            // here, where the server would close the connection for it.
            let max = config.decode.max_metadata_len;
            if !frame::fits_one_more(metadata, compress::ACCEPT_ENCODING, value, max) {
                return;
            }
            self.advertised += 1;
            let _ = metadata.append(compress::ACCEPT_ENCODING, value);
        }
    }

    /// Whether the connection proved that its server serves it, so that its end is
    /// no failed attempt: the server sent a frame other than GOAWAY on it, or a GOAWAY
    /// that keeps calls of ours to answer (`served`), or the connection lasted at
    /// least the longest reconnect delay (an idle one that aged out: reconnecting after
    /// that costs no more connections than backing off would). A server that accepts
    /// every connection and turns it away at once with GOAWAY (draining for good,
    /// overloaded) proves nothing, and is backed off from as a refused connect is.
    fn proven(&self, config: &ChannelConfig) -> bool {
        self.served || self.opened.elapsed() >= config.backoff_max
    }

    fn is_idle(&self) -> bool {
        self.pending.is_empty()
            && self.streams.is_empty()
            && self.bulk.is_idle()
            && self.bulk_out.is_empty()
    }

    /// Queues a control frame (CANCEL, PONG, WINDOW, BULK_REPLY).
    fn push_control(&mut self, frame: BytesMut, payload: Payload) {
        self.control_bytes += frame.len() + payload.len();
        self.control.push_back((frame, payload));
    }

    fn push_cancel(&mut self, id: u64) {
        let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
        frame::encode_cancel(&mut buf, id);
        self.push_control(buf, Payload::new());
    }

    /// The id to write call `id` under: its own if it is above every id written on
    /// this connection, else a fresh one (above every id handed out so far).
    fn wire_id(&self, id: u64, next_id: &AtomicU64) -> u64 {
        if id > self.last_sent_id {
            id
        } else {
            next_id.fetch_add(1, Ordering::Relaxed)
        }
    }

    /// Call `id` was handed to the link as `wire`.
    fn sent_as(&mut self, id: u64, wire: u64) {
        self.last_sent_id = wire;
        if wire != id {
            self.renamed.insert(wire, id);
        }
    }

    /// The id on the wire of the caller's call `id`.
    fn wire_of(&self, id: u64) -> u64 {
        if self.renamed.is_empty() {
            return id;
        }
        self.renamed
            .iter()
            .find(|&(_, &caller)| caller == id)
            .map_or(id, |(&wire, _)| wire)
    }

    /// Call `wire` is over (answered, failed or cancelled).
    fn forget(&mut self, wire: u64) {
        if !self.renamed.is_empty() {
            self.renamed.remove(&wire);
        }
    }

    /// The status of a call whose request the link refused: it never left.
    fn unsent(&self, err: &Error) -> Status {
        Status::unavailable(format!(
            "connection to {} failed before the request was sent: {err}",
            self.peer
        ))
        .into_unprocessed()
    }

    /// Sends WINDOW for bytes the reader of stream `id` consumed. Returns whether the
    /// stream is on this connection.
    fn give_credit(&mut self, id: u64, bytes: u32) -> bool {
        let Some(stream) = self.streams.get_mut(&id) else {
            return false;
        };
        stream.received -= i64::from(bytes);
        let mut buf = BytesMut::new();
        frame::encode_window(&mut buf, id, bytes.max(1));
        self.push_control(buf, Payload::new());
        true
    }

    /// A call the server refused before processing any of it (`Received::Refused`):
    /// it fails as unprocessed, which is safe to retry; the connection goes on.
    fn on_refused(&mut self, id: u64, message: String) {
        let status = Status::unavailable(message).into_refused();
        if let Some(mut stream) = self.streams.remove(&id) {
            self.forget(id);
            stream.fail(status);
        } else if let Some(reply) = self.complete(id) {
            let _ = reply.send(Err(status));
        }
    }

    /// Takes the caller of a finished call (answered, or failed by the driver).
    fn complete(&mut self, id: u64) -> Option<Reply> {
        if let Some(retransmit) = &mut self.retransmit {
            retransmit.answered(id);
        }
        self.forget(id);
        self.pending.complete(id)
    }

    /// Cancels the caller's call `id` (the reader of a stream cancels with the id on
    /// the wire, which is the same unless the call was renamed).
    /// Call `id`, written to the link, taken back from it ([`Link::withdraw`]) if
    /// nothing of it left: forgotten as a cancelled call is, with no CANCEL to write.
    #[cold]
    fn withdraw(&mut self, id: u64) -> bool {
        let wire = self.wire_of(id);
        if !self.link.withdraw(wire) {
            return false;
        }
        if let Some(retransmit) = &mut self.retransmit {
            retransmit.forget(wire);
        }
        self.pending.cancel(wire);
        self.streams.remove(&wire);
        self.forget(wire);
        true
    }

    fn cancel(&mut self, id: u64) -> bool {
        let id = self.wire_of(id);
        if let Some(retransmit) = &mut self.retransmit {
            retransmit.forget(id);
        }
        if !self.pending.cancel(id) && self.streams.remove(&id).is_none() {
            return false;
        }
        self.forget(id);
        self.push_cancel(id);
        true
    }

    /// Fails every call of the connection with `cause`; as unprocessed
    /// (`Status::is_unprocessed`) when the peer refused the connection before taking
    /// anything (`ErrorKind::Refused`).
    fn fail_all(&mut self, cause: &str, unprocessed: bool) {
        // Repeated in every call's status: a cause quoting what a server sent is cut.
        let cause = &*frame::clip(cause, 2 * MAX_REASON_LEN);
        if let Some(retransmit) = &mut self.retransmit {
            retransmit.clear();
        }
        self.renamed.clear();
        let status = || {
            let status = Status::unavailable(cause.to_owned());
            if unprocessed {
                status.into_unprocessed()
            } else {
                status
            }
        };
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(status()));
        }
        for (_, mut stream) in self.streams.drain() {
            stream.fail(status());
        }
        self.bulk.fail_all(cause);
        for op in self.bulk_out.drain(..) {
            let _ = op.reply.send(Err(Status::unavailable(format!(
                "bulk operation not sent: {cause}"
            ))));
        }
    }

    /// Writes what it can, flushes, reads what has arrived.
    fn poll_io(
        &mut self,
        cx: &mut Context<'_>,
        outbox: &mut VecDeque<Outgoing>,
        mut io: Io<'_>,
    ) -> Result<ConnState, Error> {
        if let Some(err) = self.failed.take() {
            return Err(err);
        }
        if let Some(retransmit) = &mut self.retransmit {
            retransmit.poll_timers(cx);
        }
        self.poll_write(cx, outbox, &mut io)?;
        let stopped = self.poll_read(cx, io.config)?;
        let waiting = !outbox.is_empty() || !self.bulk_out.is_empty();
        self.poll_keepalive(cx, stopped, waiting, io.config)?;
        // Reading may have queued PONGs (and keepalive a PING).
        self.poll_write(cx, outbox, &mut io)?;
        if stopped && !self.control_full() {
            // Reading stopped at the control bound without registering for more, and
            // writing has made room since: nothing else would wake this task to read
            // again (the peer may be waiting for our reading to drain its writes).
            cx.waker().wake_by_ref();
        }
        Ok(if self.goaway {
            ConnState::Draining
        } else {
            ConnState::Open
        })
    }

    /// Sends a keepalive PING after silence, and fails the connection when nothing
    /// answered one in time (see `crate::keepalive`). `stopped`: reading stopped at the
    /// control bound, so silence proves nothing, as long as the answers queued there
    /// leave: a server that floods PINGs and then reads nothing keeps that queue full
    /// for ever, and counting its stall as life kept the connection, and every call on
    /// it, waiting until the server closed it (from a review).
    fn poll_keepalive(
        &mut self,
        cx: &mut Context<'_>,
        stopped: bool,
        waiting: bool,
        config: &ChannelConfig,
    ) -> Result<(), Error> {
        let Some(keepalive) = &mut self.keepalive else {
            return Ok(());
        };
        let moved = std::mem::take(&mut self.control_moved);
        self.heard |= stopped && moved;
        // Pieces of a frame arriving are the server too (a long answer in fragments
        // with a PONG numbered behind it): not silence.
        let receiving = self.link.receiving();
        if receiving != self.receiving_seen {
            self.receiving_seen = receiving;
            self.heard = true;
        }
        if let Some(seen) = &mut self.unsent_seen {
            // On UDP a count of fragments the server acknowledged (plus one), which
            // stays once all is taken: any change but the first message queued (0 to
            // 1) is the server.
            let unsent = self.link.unsent();
            if unsent != *seen {
                self.heard |= unsent > 1;
                *seen = unsent;
            }
        }
        let (pending, streams, bulk) = (&self.pending, &self.streams, &self.bulk);
        // Calls waiting to be written count: a server that stopped reading (stuck,
        // with its kernel still taking the connection's bytes) left calls in the
        // outbox, none pending once their deadlines passed, and was never probed.
        let wanted = || {
            config.keepalive_while_idle
                || waiting
                || !pending.is_empty()
                || !streams.is_empty()
                || !bulk.is_idle()
        };
        let action = keepalive.poll(cx, &mut self.heard, wanted);
        if action.is_some() && self.link.is_reliable() && !self.link.writes_wait_on_peer_windows() {
            // Whatever it sends: a server that has taken not a byte of ours for two
            // intervals and MIN_WRITE_STALL reads nothing (one sending a PING now and
            // then was heard, and kept the connection and its calls for ever).
            let unsent = self.link.unsent();
            let interval = config.keepalive.interval.unwrap_or_default();
            if let Some(stalled) = self.write_stall.check(unsent, unsent != 0, interval) {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{} read nothing of ours for {stalled:?} (our writes wait on it)",
                        self.peer
                    ),
                ));
            }
        }
        match action {
            None | Some(Action::Nothing) => Ok(()),
            Some(Action::Ping(id)) => {
                tracing::trace!(peer = %self.peer, id, "keepalive PING");
                let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
                frame::encode_ping_header(&mut buf, id, false);
                self.push_control(buf, Payload::new());
                Ok(())
            }
            Some(Action::Dead) => Err(keepalive.dead()),
        }
    }

    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        outbox: &mut VecDeque<Outgoing>,
        io: &mut Io<'_>,
    ) -> Result<(), Error> {
        let scratch: &mut BytesMut = &mut *io.scratch;
        let (config, client_id, next_id) = (io.config, io.client_id, io.next_id);
        while !self.control.is_empty()
            || !self.bulk_out.is_empty()
            || self.retransmit.as_ref().is_some_and(|r| r.has_due())
            || (!self.goaway && !outbox.is_empty())
        {
            match self.link.poll_ready(cx) {
                Poll::Pending => break,
                Poll::Ready(Err(err)) => return Err(err),
                Poll::Ready(Ok(())) => {}
            }
            if let Some((frame, payload)) = self.control.pop_front() {
                self.control_bytes -= frame.len() + payload.len();
                self.control_moved = true;
                self.link.start_send(&frame, payload)?;
                self.needs_flush = true;
                continue;
            }
            if let Some(op) = self.bulk_out.pop_front() {
                let payload = self.bulk.send(op, scratch);
                self.link.start_send(scratch, payload)?;
                self.needs_flush = true;
                continue;
            }
            if let Some(retransmit) = &mut self.retransmit {
                if retransmit.send_due(&mut self.link, scratch)? {
                    self.needs_flush = true;
                    continue;
                }
            }
            if self.goaway {
                break;
            }
            let Some(call) = outbox.pop_front() else {
                break;
            };
            self.write_call(call, scratch, config, client_id, next_id)?;
        }
        if !self.streams.is_empty() {
            self.poll_stream_sends(cx, scratch, config)?;
        }
        self.flush(cx)
    }

    /// Flushes what was written, if anything was.
    fn flush(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        if self.needs_flush {
            match self.link.poll_flush(cx) {
                Poll::Ready(Ok(())) => self.needs_flush = false,
                Poll::Ready(Err(err)) => return Err(err),
                Poll::Pending => {}
            }
        }
        Ok(())
    }

    /// Writes one call's REQUEST (or opens its stream), once the link is ready for a
    /// frame: the call's checks (caller gone, deadline passed, method, metadata and
    /// frame limits), its wire id and the frame. A call refused by a check is answered
    /// here and nothing is written; `Err` is the link's failure.
    fn write_call(
        &mut self,
        mut call: Outgoing,
        scratch: &mut BytesMut,
        config: &ChannelConfig,
        client_id: u128,
        next_id: &AtomicU64,
    ) -> Result<(), Error> {
        let max_frame_len = config.link.max_frame_len;
        let max_metadata_len = config.decode.max_metadata_len;
        if call.reply.is_closed() {
            return Ok(()); // the caller is gone; its cancel found nothing to cancel
        }
        let timeout = match call.deadline {
            None => None,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                // Under the wire's microsecond it would go out as 0, a deadline the
                // server takes as already passed: it would refuse the call, and the
                // caller would not learn that it never ran (from a review).
                if left < frame::MIN_WIRE_TIMEOUT {
                    // Never written: unprocessed, as every call that never left.
                    call.refuse(Status::deadline_exceeded(
                        "deadline exceeded before the request was sent",
                    ));
                    return Ok(());
                }
                Some(left)
            }
        };
        // Limits are per receiver and not exchanged; the peer's are assumed to be at
        // least ours. A call over them fails alone: sent, the server would close the
        // connection and fail every other call on it.
        if self.sendable_method.as_ref() != Some(&call.method) {
            if !frame::method_is_sendable(&call.method) {
                // Never written: the server would close the connection for it.
                let status = Status::invalid_argument(format!(
                    "method name {:?} is not of the form package.Service/Method (one '/', \
                     at most 65,535 bytes)",
                    frame::clip(&call.method, 256)
                ));
                call.refuse(status);
                return Ok(());
            }
            self.sendable_method = Some(call.method.clone());
        }
        if !frame::metadata_fits(&call.metadata, max_metadata_len) {
            let metadata_len = frame::metadata_encoded_len(&call.metadata);
            let _ = call.reply.send(Err(Status::resource_exhausted(format!(
                "request metadata of {metadata_len} bytes in {} entries exceeds the limit \
                 of {max_metadata_len} bytes and {} entries (raise max_metadata_len on both \
                 sides)",
                call.metadata.len(),
                frame::max_metadata_entries(max_metadata_len)
            ))));
            return Ok(());
        }
        // Ids leave in increasing order (see the module docs).
        let caller_id = call.id;
        call.id = self.wire_id(caller_id, next_id);
        if let Some(slot) = call.stream.take() {
            let Some(messages) = slot.take() else {
                let _ = call.reply.send(Err(already_taken()));
                return Ok(());
            };
            self.open_stream(call, caller_id, messages, timeout, scratch, config)?;
            return Ok(());
        }
        if self.retransmit.is_some()
            && call.call_key.is_none()
            && !call.idempotency.is_safe_to_repeat()
        {
            // The request may arrive twice: the duplicate cache must see it as one.
            call.call_key = Some(frame::CallKey {
                client: client_id,
                call: call.id,
                attempt: 1,
            });
        }
        self.advertise(&mut call.metadata, config);
        let (payload, flags) = compress::encode(
            config.compression.as_ref(),
            self.peer_accepts,
            std::mem::take(&mut call.payload),
            call.compress,
        );
        call.payload = payload;
        scratch.clear();
        frame::encode_request_header_flags(
            scratch,
            call.id,
            &call.method,
            timeout,
            call.call_key.as_ref(),
            &call.metadata,
            flags,
        );
        let len = scratch.len() + call.payload.len();
        if len > max_frame_len {
            let _ = call.reply.send(Err(Status::resource_exhausted(format!(
                "request of {len} bytes exceeds the maximum frame length of \
                 {max_frame_len} bytes (raise max_frame_len on both sides)"
            ))));
            return Ok(());
        }
        // A link that refuses a frame did not send it: the caller gets the link's
        // error, as a call that never left (the connection fails after it).
        match &mut self.retransmit {
            Some(retransmit) if !self.link.delivers(len) => {
                if let Err(err) = self.link.start_send(scratch, call.payload.clone()) {
                    let _ = call.reply.send(Err(self.unsent(&err)));
                    return Err(err);
                }
                retransmit.sent(Unanswered {
                    id: call.id,
                    method: call.method,
                    metadata: call.metadata,
                    deadline: call.deadline,
                    call_key: call.call_key,
                    payload: call.payload,
                    flags,
                });
            }
            _ => {
                if let Err(err) = self.link.start_send(scratch, call.payload) {
                    let _ = call.reply.send(Err(self.unsent(&err)));
                    return Err(err);
                }
            }
        }
        self.sent_as(caller_id, call.id);
        if let Err(reply) = self.pending.insert(call.id, call.reply) {
            let _ = reply.send(Err(Status::internal("duplicate call id")));
        }
        self.needs_flush = true;
        Ok(())
    }

    /// Whether the queue of control frames is at its bound, where reading stops.
    fn control_full(&self) -> bool {
        self.control.len() >= MAX_CONTROL_FRAMES || self.control_bytes >= MAX_CONTROL_BYTES
    }

    /// Reads and handles frames. Returns whether it stopped at the control bound
    /// (without registering for the link's next frame).
    fn poll_read(&mut self, cx: &mut Context<'_>, config: &ChannelConfig) -> Result<bool, Error> {
        for _ in 0..READ_BUDGET {
            if self.control_full() {
                return Ok(true);
            }
            let received = match self.link.poll_recv_frame(cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(None) => {
                    return Err(Error::new(ErrorKind::Closed, "closed by the server"))
                }
                Poll::Ready(Some(Err(err))) => {
                    if err.kind() == ErrorKind::FrameTooLarge {
                        self.send_goaway(GoAwayCode::FRAME_TOO_LARGE, err.message());
                    }
                    return Err(err);
                }
                Poll::Ready(Some(Ok(received))) => received,
            };
            self.heard = true;
            // `served` is set by every frame but GOAWAY, arm by arm (the one store a
            // RESPONSE costs): a GOAWAY may be all a server that turns every
            // connection away ever sends.
            let frame = match received {
                Received::Bytes(bytes) => Frame::decode(bytes, &config.decode),
                Received::Frame { frame, .. } => Ok(*frame),
                Received::Refused { id, message } => {
                    self.served = true;
                    self.on_refused(id, message);
                    continue;
                }
                // A server link's signal; no client link sends it.
                Received::Stopped { .. } => continue,
            };
            match frame {
                Ok(Frame::Response(mut response)) => {
                    self.served = true;
                    self.peer_accepts
                        .update(compress::take_accepts(&mut response.metadata));
                    // (Checked for emptiness first: no hashing on the unary hot path.)
                    let stream = if self.streams.is_empty() {
                        None
                    } else {
                        self.streams.remove(&response.id)
                    };
                    if let Some(mut stream) = stream {
                        self.forget(response.id);
                        match response.into_result() {
                            Ok((trailers, _)) => {
                                stream.feed.end(Ok(trailers));
                                stream.deliver_head(Metadata::new());
                            }
                            Err(status) => stream.fail(status),
                        }
                    } else if let Some(reply) = self.complete(response.id) {
                        let compressed = response.compressed.then_some(self.max_message_len);
                        let _ = reply.send(response.into_result().map(|(metadata, payload)| {
                            Answer::Unary {
                                metadata,
                                payload,
                                compressed,
                            }
                        }));
                    }
                }
                Ok(Frame::Data(data)) => {
                    self.served = true;
                    self.on_data(data, config)?;
                }
                Ok(Frame::Window { id, increment }) => {
                    self.served = true;
                    if let Some(stream) = self.streams.get_mut(&id) {
                        // Saturating: the server may grant any total.
                        stream.send_credit =
                            stream.send_credit.saturating_add(i64::from(increment));
                    }
                }
                Ok(Frame::Bulk(op)) => {
                    self.served = true;
                    let (frame, payload) =
                        bulk::serve(&self.regions, op, config.link.max_frame_len);
                    self.push_control(frame, payload);
                }
                Ok(Frame::BulkReply(reply)) => {
                    self.served = true;
                    self.bulk.on_reply(reply);
                }
                Ok(Frame::GoAway(goaway)) => self.on_goaway(goaway, config)?,
                Ok(Frame::Ping { id, payload }) => {
                    self.served = true;
                    // The payload goes back as it came, not copied into the header's
                    // buffer (as the server answers: a 16 MiB PING cost three copies).
                    let mut buf = BytesMut::with_capacity(frame::HEADER_LEN);
                    frame::encode_ping_header(&mut buf, id, true);
                    self.push_control(buf, payload.into());
                }
                Ok(Frame::Pong { .. }) => self.served = true,
                Ok(Frame::Request(_) | Frame::Cancel { .. }) => {
                    self.served = true;
                    let msg = "server sent a client-to-server frame";
                    self.send_goaway(GoAwayCode::PROTOCOL_ERROR, msg);
                    return Err(Error::new(ErrorKind::Protocol, msg));
                }
                Err(err) => {
                    self.served = true;
                    self.send_goaway(err.goaway_code(), &err.to_string());
                    return Err(
                        Error::new(ErrorKind::Protocol, "bad frame from server").with_source(err)
                    );
                }
            }
        }
        // Budget spent with frames possibly left: come back after other tasks ran.
        cx.waker().wake_by_ref();
        Ok(false)
    }

    /// Writes a streaming call's REQUEST (`timeout`: the budget left, checked by the
    /// caller) and starts tracking the stream.
    fn open_stream(
        &mut self,
        call: Outgoing,
        caller_id: u64,
        messages: MessageStream,
        timeout: Option<Duration>,
        scratch: &mut BytesMut,
        config: &ChannelConfig,
    ) -> Result<(), Error> {
        let Some(commands) = call.commands else {
            let _ = call
                .reply
                .send(Err(Status::internal("stream without a command queue")));
            return Ok(());
        };
        let id = call.id;
        let mut metadata = call.metadata;
        self.advertise(&mut metadata, config);
        scratch.clear();
        frame::encode_request_header_flags(
            scratch,
            id,
            &call.method,
            timeout,
            call.call_key.as_ref(),
            &metadata,
            frame::FLAG_STREAMING,
        );
        if let Err(err) = self.link.start_send(scratch, Payload::new()) {
            let _ = call.reply.send(Err(self.unsent(&err)));
            return Err(err);
        }
        self.sent_as(caller_id, id);
        self.needs_flush = true;
        let window = config.stream_window;
        if window > frame::INITIAL_STREAM_WINDOW {
            let mut buf = BytesMut::new();
            frame::encode_window(&mut buf, id, window - frame::INITIAL_STREAM_WINDOW);
            self.push_control(buf, Payload::new());
        }
        let credit_tx = commands.clone();
        let (feed, mut body) = RawStreaming::new(
            Box::new(move |bytes| {
                let _ = credit_tx.send(Command::Credit { id, bytes });
            }),
            (window / 4).max(1),
        );
        body.set_on_drop(Box::new(move || {
            let _ = commands.send(Command::Cancel(id));
        }));
        body.set_max_len(self.max_message_len);
        self.streams.insert(
            id,
            ClientStream {
                head: Some((call.reply, body)),
                feed,
                send: Some(messages),
                held: None,
                send_credit: i64::from(frame::INITIAL_STREAM_WINDOW),
                received: 0,
            },
        );
        Ok(())
    }

    /// Sends the request messages of every stream that has credit and a message ready.
    fn poll_stream_sends(
        &mut self,
        cx: &mut Context<'_>,
        scratch: &mut BytesMut,
        config: &ChannelConfig,
    ) -> Result<(), Error> {
        let max_frame_len = config.link.max_frame_len;
        let peer_accepts = self.peer_accepts;
        use futures::StreamExt;
        let mut budget = READ_BUDGET * 4;
        let mut failed = Vec::new();
        // Fair between streams: each sends at most `STREAM_SENDS` messages a round,
        // and each round starts one stream further on (a stream whose messages are
        // always ready, first in the map's order, took the whole budget every round
        // and starved the uploads behind it).
        let first = match self.streams.len() {
            0 => 0,
            n => self.send_from % n,
        };
        self.send_from = self.send_from.wrapping_add(1);
        let mut capped = false;
        'streams: for (skip, take) in [(first, usize::MAX), (0, first)] {
            for (&id, stream) in self.streams.iter_mut().skip(skip).take(take) {
                let mut sends = 0;
                while budget > 0 && sends < STREAM_SENDS {
                    let Some(messages) = &mut stream.send else {
                        break;
                    };
                    if stream.held.is_some() && stream.send_credit <= 0 {
                        break; // a message waits for credit
                    }
                    match self.link.poll_ready(cx) {
                        Poll::Pending => break 'streams,
                        Poll::Ready(Err(err)) => return Err(err),
                        Poll::Ready(Ok(())) => {}
                    }
                    scratch.clear();
                    // The next item: one held back for credit, or a fresh one. Polling
                    // without credit is what lets the half-close go out without credit
                    // (it needs none); a message found then waits in `held`.
                    let item = match stream.held.take() {
                        Some(message) => Some(message),
                        None => match messages.poll_next_unpin(cx) {
                            Poll::Pending => break,
                            Poll::Ready(item) => item,
                        },
                    };
                    match item {
                        Some(message) if stream.send_credit <= 0 => {
                            stream.held = Some(message);
                            break;
                        }
                        Some(message) => {
                            let len = frame::HEADER_LEN + message.len();
                            if len > max_frame_len {
                                failed.push((
                                    id,
                                    Status::resource_exhausted(format!(
                                    "a stream message of {len} bytes exceeds the maximum frame \
                                     length of {max_frame_len} bytes"
                                )),
                                ));
                                break;
                            }
                            let (message, flags) = compress::encode(
                                config.compression.as_ref(),
                                peer_accepts,
                                message,
                                None,
                            );
                            stream.send_credit -= cost(message.len());
                            frame::encode_data_header(scratch, id, flags, None);
                            self.link.start_send(scratch, message)?;
                        }
                        None => {
                            frame::encode_data_header(
                                scratch,
                                id,
                                frame::FLAG_END_STREAM | frame::FLAG_NO_MESSAGE,
                                None,
                            );
                            self.link.start_send(scratch, Payload::new())?;
                            stream.send = None;
                        }
                    }
                    budget -= 1;
                    sends += 1;
                    self.needs_flush = true;
                }
                // Stopped by its share, not by its messages: nothing wakes it for more.
                capped |= sends == STREAM_SENDS;
            }
        }
        for (id, status) in failed {
            if let Some(mut stream) = self.streams.remove(&id) {
                stream.fail(status);
                self.forget(id);
                self.push_cancel(id);
            }
        }
        if budget == 0 || capped {
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    /// A DATA frame from the server: headers, a message, or both.
    fn on_data(&mut self, data: DataFrame, config: &ChannelConfig) -> Result<(), Error> {
        let Some(stream) = self.streams.get_mut(&data.id) else {
            return Ok(()); // cancelled, or already ended
        };
        let copy_below = match &data.metadata {
            Some(_) => config.decode.max_metadata_len,
            None => 0,
        };
        if let Some(mut metadata) = data.metadata {
            self.peer_accepts
                .update(compress::take_accepts(&mut metadata));
            stream.deliver_head(metadata);
        }
        let Some(message) = data.message else {
            return Ok(());
        };
        stream.deliver_head(Metadata::new());
        // A message may be sent only while credit is above zero (docs/wire.md 6.9): one
        // that comes with none left is over, as the server holds it. (The window plus
        // a whole maximum frame let a server queue 262,144 empty messages past its
        // credit on every stream; from a review.) At least a fixed cost per message:
        // empty ones still take a queue slot each.
        let window = i64::from(config.stream_window.max(frame::INITIAL_STREAM_WINDOW));
        let over = stream.received >= window;
        stream.received += cost(message.len());
        if over {
            let msg = "server sent stream messages beyond its credit";
            self.send_goaway(GoAwayCode::PROTOCOL_ERROR, msg);
            return Err(Error::new(ErrorKind::Protocol, msg));
        }
        // Not a slice of the read buffer if short: see `stream::COPY_BELOW` (up to the
        // metadata limit when the frame carried metadata, as the server copies: a short
        // message would otherwise keep its frame's metadata alive).
        let message = crate::stream::held_message(message, copy_below);
        if !stream.feed.message(message, data.compressed) {
            // The reader is gone. Its drop queued a Cancel command too, which will find
            // nothing once the stream is removed here: send the CANCEL now.
            self.streams.remove(&data.id);
            self.forget(data.id);
            self.push_cancel(data.id);
        }
        Ok(())
    }

    fn on_goaway(
        &mut self,
        goaway: frame::GoAwayFrame,
        config: &ChannelConfig,
    ) -> Result<(), Error> {
        // Senders write at most 1 KiB of reason (docs/wire.md 2.8); more is cut here,
        // as it goes into the log and every failed call's status.
        let reason = frame::clip(&goaway.reason, MAX_REASON_LEN);
        // Logged escaped (`?`): a server's reason with line ends forged log lines.
        if goaway.code == GoAwayCode::NO_ERROR {
            tracing::debug!(peer = %self.peer, code = %goaway.code, ?reason, "GOAWAY received: draining the connection");
        } else {
            tracing::info!(peer = %self.peer, code = %goaway.code, ?reason, "GOAWAY received: the server refused this connection");
        }
        self.goaway = true;
        // A GOAWAY that keeps calls of ours to answer is the server serving this
        // connection (it read them and will answer), as any other frame is.
        if self.pending.ids().any(|id| id <= goaway.last_id)
            || self.streams.keys().any(|&id| id <= goaway.last_id)
        {
            self.served = true;
        }
        let proven = self.proven(config);
        // Calls the server never read will never be answered: fail them now. They were
        // not processed, so they are safe to send again. Except where `last_id` cannot
        // speak for them: a request sent again on a link that loses datagrams may have
        // run from its first copy in an association the server has since forgotten (a
        // review found such a call, which had run, moved to another replica; UDP's own
        // link ends the association as lost on its listener's GOAWAY to a stranger, so
        // this guards other servers), and a stream whose server already answered runs.
        let unprocessed: Vec<u64> = self
            .pending
            .ids()
            .filter(|&id| id > goaway.last_id)
            .collect();
        let peer = self.peer.clone();
        // One failure of the replica per connection turned away, however many calls
        // it had taken: three calls on it were three failures in a row, an ejection
        // at once (from a review).
        let mut refusal_counted = false;
        let mut going_away = |what: &str, processed: bool| {
            let status = Status::unavailable(format!(
                "server {peer} is going away ({}: {reason}); {what}",
                goaway.code
            ));
            if processed {
                status
            } else if goaway.code == GoAwayCode::NO_ERROR && proven {
                // A graceful GOAWAY is also a server's idle timeout or connection
                // rotation: the replica is neither gone nor failing (a balancer that
                // ejected it for this ejected every healthy replica when their
                // connections aged out together). A replica that is going away
                // refuses the next connection, which ejects it.
                status.into_drained()
            } else if goaway.code == GoAwayCode::NO_ERROR {
                // On a connection the server never served (`Conn::proven`): no idle
                // timeout or rotation, but a server that turns connections away as
                // they come (draining for good, overloaded), which may accept every
                // one and never refuse: for a balancer a failure of the replica, as an
                // `UNAVAILABLE` is (weighed down, ejected after failures in a row),
                // not a drain to ignore.
                if std::mem::replace(&mut refusal_counted, true) {
                    status.into_drained()
                } else {
                    status.into_refused()
                }
            } else {
                status.into_unprocessed()
            }
        };
        for id in unprocessed {
            let resent = self.retransmit.as_ref().is_some_and(|r| r.was_resent(id));
            if let Some(reply) = self.complete(id) {
                let _ = reply.send(Err(if resent {
                    going_away(
                        "the request was sent again after an unanswered copy, which may have run",
                        true,
                    )
                } else {
                    going_away("the request was not processed", false)
                }));
            }
        }
        let unprocessed: Vec<u64> = self
            .streams
            .keys()
            .copied()
            .filter(|&id| id > goaway.last_id)
            .collect();
        for id in unprocessed {
            if let Some(mut stream) = self.streams.remove(&id) {
                self.forget(id);
                stream.fail(if stream.head.is_none() {
                    going_away("the stream had started", true)
                } else {
                    going_away("the stream was not processed", false)
                });
            }
        }
        if goaway.code != GoAwayCode::NO_ERROR {
            return Err(Error::new(
                if goaway.code == GoAwayCode::UNSUPPORTED_VERSION {
                    ErrorKind::UnsupportedVersion
                } else {
                    ErrorKind::GoAway
                },
                format!("server closed the connection: {}: {reason}", goaway.code),
            ));
        }
        Ok(())
    }

    /// Queues a GOAWAY and tries once to get it out; the connection is closed next.
    fn send_goaway(&mut self, code: GoAwayCode, reason: &str) {
        // The server broke the protocol: what it sent is in `reason`.
        tracing::info!(peer = %self.peer, %code, reason, "GOAWAY sent: refusing the server, closing the connection");
        let mut buf = BytesMut::new();
        frame::encode_goaway(&mut buf, 0, code, reason);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        if let Poll::Ready(Ok(())) = self.link.poll_ready(&mut cx) {
            if self.link.start_send(&buf, Payload::new()).is_ok() {
                let _ = self.link.poll_flush(&mut cx);
            }
        }
    }
}

/// A request on an unreliable link, kept until it is answered.
struct Unanswered {
    id: u64,
    method: ByteStr,
    metadata: Metadata,
    deadline: Option<Instant>,
    call_key: Option<frame::CallKey>,
    payload: Payload,
    /// Extra frame flags (compression) to send it again with.
    flags: u16,
}

struct Tracked {
    request: Unanswered,
    first_sent: Instant,
    /// When the timer of this request fires next; older heap entries are stale.
    due: Instant,
    rto: Duration,
    resent: bool,
    /// In `Retransmitter::due`, not sent again yet: a timer firing again meanwhile
    /// (the link not ready) does not queue a second copy.
    queued: bool,
}

/// Retransmission of requests on a link that may lose them.
///
/// The timeout follows RFC 6298: a smoothed round trip and its variation, measured on
/// requests answered without a retransmission (Karn's rule), `rto = srtt + 4·rttvar`
/// clamped to the configured bounds, and doubled for each retransmission of one
/// request up to a ceiling from the round trip and the call's time budget (see the
/// `rto` module). The round trip includes the handler's time, so
/// slow methods are resent a few times; the server drops a repeat of a request that is
/// still running.
struct Retransmitter {
    config: RetransmitConfig,
    tracked: IdMap<Tracked>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Set for the earliest of `timers`. Made with the connection, on the driver's
    /// runtime, and only reset after: a caller writing inline (on its own thread and
    /// perhaps another runtime) arms it too, and the timer must stay the driver's.
    sleep: Pin<Box<Sleep>>,
    /// Requests whose timer fired, to be sent again when the link is ready.
    due: VecDeque<u64>,
    rtt: RttEstimate,
}

/// A deadline no timer of a connection reaches: the retransmission timer's before it
/// is first armed.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

impl Retransmitter {
    fn new(config: RetransmitConfig) -> Self {
        Retransmitter {
            config,
            tracked: IdMap::default(),
            timers: BinaryHeap::new(),
            sleep: Box::pin(tokio::time::sleep_until(far_future())),
            due: VecDeque::new(),
            rtt: RttEstimate::default(),
        }
    }

    /// Starts the timer of a request just handed to the link.
    fn sent(&mut self, request: Unanswered) {
        let now = Instant::now();
        let rto = self.rtt.first(&self.config);
        let due = now + rto;
        self.timers.push(Reverse((due, request.id)));
        self.tracked.insert(
            request.id,
            Tracked {
                request,
                first_sent: now,
                due,
                rto,
                resent: false,
                queued: false,
            },
        );
    }

    /// The request was answered: stop its timer and learn from its round trip.
    fn answered(&mut self, id: u64) {
        let Some(tracked) = self.tracked.remove(&id) else {
            return;
        };
        if tracked.resent {
            return; // which copy was answered is unknown (Karn)
        }
        self.rtt.sample(tracked.first_sent.elapsed());
    }

    fn forget(&mut self, id: u64) {
        self.tracked.remove(&id);
    }

    /// Whether request `id`, still unanswered, went more than once.
    fn was_resent(&self, id: u64) -> bool {
        self.tracked.get(&id).is_some_and(|t| t.resent)
    }

    fn clear(&mut self) {
        self.tracked.clear();
        self.timers.clear();
        self.due.clear();
        self.sleep.as_mut().reset(far_future());
    }

    fn has_due(&self) -> bool {
        !self.due.is_empty()
    }

    /// Moves the requests whose timer fired to `due` and arms the next timer.
    fn poll_timers(&mut self, cx: &mut Context<'_>) {
        loop {
            let now = Instant::now();
            while let Some(&Reverse((at, id))) = self.timers.peek() {
                if at > now {
                    break;
                }
                self.timers.pop();
                let Some(tracked) = self.tracked.get_mut(&id) else {
                    continue; // answered or cancelled
                };
                if tracked.due != at {
                    continue; // stale entry
                }
                let budget = match tracked.request.deadline {
                    Some(deadline) if deadline <= now => continue, // the caller's timer ends it
                    Some(deadline) => Some(deadline.saturating_duration_since(tracked.first_sent)),
                    None => None,
                };
                tracked.resent = true;
                tracked.rto = self.rtt.backoff(&self.config, tracked.rto, budget);
                tracked.due = now + tracked.rto;
                self.timers.push(Reverse((tracked.due, id)));
                if !tracked.queued {
                    tracked.queued = true;
                    self.due.push_back(id);
                }
            }
            let Some(&Reverse((next, _))) = self.timers.peek() else {
                return;
            };
            if self.sleep.deadline() != next {
                self.sleep.as_mut().reset(next);
            }
            if self.sleep.as_mut().poll(cx).is_pending() {
                return;
            }
        }
    }

    /// Sends one due request again, if any is still waiting. Returns whether it sent.
    fn send_due<L: Link>(&mut self, link: &mut L, scratch: &mut BytesMut) -> Result<bool, Error> {
        while let Some(id) = self.due.pop_front() {
            let Some(tracked) = self.tracked.get_mut(&id) else {
                continue;
            };
            tracked.queued = false;
            let request = &tracked.request;
            let now = Instant::now();
            let timeout = match request.deadline {
                // (Under a microsecond it would go out as 0, already passed.)
                Some(deadline)
                    if deadline.saturating_duration_since(now) < frame::MIN_WIRE_TIMEOUT =>
                {
                    continue
                }
                Some(deadline) => Some(deadline - now),
                None => None,
            };
            scratch.clear();
            frame::encode_request_header_flags(
                scratch,
                id,
                &request.method,
                timeout,
                request.call_key.as_ref(),
                &request.metadata,
                request.flags,
            );
            link.start_send(scratch, request.payload.clone())?;
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;
    use crate::{
        frame::DecodeLimits,
        link::{mem, LinkConfig, Listener},
        Code,
    };

    fn config() -> ChannelConfig {
        ChannelConfig {
            link: LinkConfig::default(),
            decode: DecodeLimits::default(),
            default_timeout: None,
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 16,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            retransmit: RetransmitConfig {
                initial: Duration::from_millis(100),
                min: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
            stream_window: frame::INITIAL_STREAM_WINDOW,
            compression: None,
            keepalive: crate::keepalive::KeepaliveConfig {
                interval: None,
                timeout: Duration::from_secs(20),
            },
            keepalive_while_idle: false,
            connections: 1,
        }
    }

    fn outgoing(id: u64) -> (Outgoing, oneshot::Receiver<Result<Answer, Status>>) {
        let (reply, rx) = oneshot::channel();
        let call = Outgoing {
            id,
            method: "t.S/M".into(),
            idempotency: Idempotency::default(),
            metadata: Metadata::new(),
            deadline: None,
            call_key: None,
            payload: Payload::new(),
            stream: None,
            compress: None,
            commands: None,
            reply,
        };
        (call, rx)
    }

    async fn recv(link: &mut mem::MemLink) -> Frame {
        let bytes = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
        Frame::decode(bytes, &DecodeLimits::default()).unwrap()
    }

    async fn send(link: &mut mem::MemLink, buf: BytesMut) {
        poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
        link.start_send(&buf, Payload::new()).unwrap();
        poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
    }

    /// A request whose timer fires again and again while the link cannot take it is
    /// queued to go again once, not once per firing (a review: the queue grew for as
    /// long as the link stayed full, then sent as many identical copies back to back).
    #[tokio::test(start_paused = true)]
    async fn a_request_due_again_is_queued_once() {
        let mut retransmit = Retransmitter::new(config().retransmit);
        retransmit.sent(Unanswered {
            id: 1,
            method: "t.S/M".into(),
            metadata: Metadata::new(),
            deadline: None,
            call_key: None,
            payload: Payload::new(),
            flags: 0,
        });
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(10)).await;
            retransmit.poll_timers(&mut cx);
        }
        assert_eq!(retransmit.due.len(), 1);
        // Sent again, it is queued again at its next firing.
        let (mut link, _server) = mem::pair(&LinkConfig::default());
        let mut scratch = BytesMut::new();
        assert!(retransmit.send_due(&mut link, &mut scratch).unwrap());
        assert!(retransmit.due.is_empty());
        tokio::time::advance(Duration::from_secs(10)).await;
        retransmit.poll_timers(&mut cx);
        assert_eq!(retransmit.due.len(), 1);
    }

    /// Issue 19, finding 11: two threads took ids 5 and 6 and queued 6 first. Call 5
    /// must not go out after 6 under its own id: GOAWAY `last_id = 6` would then say
    /// it was read when it was not. It goes out under a fresh id, so the GOAWAY marks
    /// it unprocessed, and a cancel by its caller's id still finds it.
    #[tokio::test]
    async fn ids_leave_in_order_whatever_order_they_were_queued_in() {
        let (_listener, connector) = mem::listener();
        let (client, mut server) = mem::pair(&LinkConfig::default());
        let (tx, rx) = mpsc::unbounded_channel();
        // Ids 5 and 6 were handed out; the counter is at 7.
        let next_id = Arc::new(AtomicU64::new(7));
        let (six, six_rx) = outgoing(6);
        let (five, five_rx) = outgoing(5);
        let (four, _four_rx) = outgoing(4);
        tx.send(Command::Call(six)).unwrap();
        tx.send(Command::Call(five)).unwrap();
        tx.send(Command::Call(four)).unwrap();
        let driver = Driver::new(
            Arc::new(connector),
            Arc::new(config()),
            rx,
            Some(client),
            Arc::default(),
            Arc::default(),
            next_id,
        );
        let task = tokio::spawn(driver);
        let mut ids = Vec::new();
        for _ in 0..3 {
            match recv(&mut server).await {
                Frame::Request(r) => ids.push(r.id),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(ids, vec![6, 7, 8], "ids leave in increasing order");
        // Call 4 (sent as 8) is cancelled by its caller's id: CANCEL names id 8.
        tx.send(Command::Cancel(4)).unwrap();
        match recv(&mut server).await {
            Frame::Cancel { id } => assert_eq!(id, 8),
            other => panic!("unexpected {other:?}"),
        }
        // The server read 6 and goes away; 5 (sent as 7) was not read.
        let mut buf = BytesMut::new();
        frame::encode_goaway(&mut buf, 6, GoAwayCode::NO_ERROR, "shutting down");
        send(&mut server, buf).await;
        let err = match five_rx.await.unwrap() {
            Err(status) => status,
            Ok(_) => panic!("call 5 was answered"),
        };
        assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
        assert!(err.is_unprocessed(), "{err}");
        let mut buf = BytesMut::new();
        frame::encode_response_header(&mut buf, 6, Code::OK, "", &[], &Metadata::new());
        send(&mut server, buf).await;
        assert!(matches!(six_rx.await.unwrap(), Ok(Answer::Unary { .. })));
        drop(tx);
        task.await.unwrap();
    }

    /// A driver in its cell (its task not started), connected over an in-memory link:
    /// the cell, its command queue, the server's end of the link, and the listener
    /// its connector reaches for the next connection.
    fn connected_cell() -> (
        Arc<DriverCell<mem::MemConnector>>,
        mpsc::UnboundedSender<Command>,
        mem::MemLink,
        mem::MemListener,
    ) {
        let (listener, connector) = mem::listener();
        let (client, server) = mem::pair(&LinkConfig::default());
        let (cell, tx) = cell_over(connector, client);
        (cell, tx, server, listener)
    }

    /// A driver in its cell (its task not started) on `link`, reconnecting with
    /// `connector`; and its command queue.
    fn cell_over<C: Connector>(
        connector: C,
        link: C::Link,
    ) -> (Arc<DriverCell<C>>, mpsc::UnboundedSender<Command>) {
        let (tx, rx) = mpsc::unbounded_channel::<Command>();
        let driver = Driver::new(
            Arc::new(connector),
            Arc::new(config()),
            rx,
            Some(link),
            Arc::default(),
            Arc::default(),
            Arc::new(AtomicU64::new(1)),
        );
        (DriverCell::new(driver), tx)
    }

    /// Counts the wake-ups of the driver task's waker.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A unary call on an idle connection is written by its caller (`try_send`), with
    /// the driver task left asleep; with another call in flight, or the driver busy,
    /// it is given back to be queued; a link found closed by the caller's write wakes
    /// the task, which sends the call on a new connection.
    #[tokio::test]
    async fn a_call_on_an_idle_connection_is_written_by_its_caller() {
        let (cell, tx, mut server, mut listener) = connected_cell();
        let (first, first_rx) = outgoing(1);
        // Before the task's first poll there is no waker to write with.
        let first = cell.try_send(first).expect_err("no waker yet: queued");
        let wakes = Arc::new(Wakes::default());
        let waker = futures::task::waker(wakes.clone());
        let mut task = Box::pin(cell.clone().run());
        let mut cx = Context::from_waker(&waker);
        assert!(task.as_mut().poll(&mut cx).is_pending());

        assert!(cell.try_send(first).is_ok(), "idle: written by the caller");
        match recv(&mut server).await {
            Frame::Request(r) => assert_eq!(r.id, 1),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "the task was not woken");

        // Call 1 is in flight: call 2 goes through the queue.
        let (second, _second_rx) = outgoing(2);
        let second = cell.try_send(second).expect_err("busy connection: queued");
        // The answer wakes the task, which completes call 1.
        let mut buf = BytesMut::new();
        frame::encode_response_header(&mut buf, 1, Code::OK, "", &[], &Metadata::new());
        send(&mut server, buf).await;
        assert!(
            wakes.0.load(Ordering::SeqCst) > 0,
            "the answer woke the task"
        );
        assert!(task.as_mut().poll(&mut cx).is_pending());
        assert!(matches!(first_rx.await.unwrap(), Ok(Answer::Unary { .. })));

        // The task (or another caller) holds the driver: queued.
        let held = cell.inner.lock().unwrap();
        let second = cell.try_send(second).expect_err("driver busy: queued");
        drop(held);

        // The connection is gone: the caller's write finds the link closed before
        // the call left, and wakes the task, which drops the connection and sends the
        // call on a new one.
        drop(server);
        let before = wakes.0.load(Ordering::SeqCst);
        let (third, third_rx) = outgoing(3);
        assert!(cell.try_send(third).is_ok());
        assert!(
            wakes.0.load(Ordering::SeqCst) > before,
            "the task was woken"
        );
        let task = tokio::spawn(task);
        let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
        match recv(&mut server).await {
            Frame::Request(r) => assert_eq!(r.id, 3),
            other => panic!("unexpected {other:?}"),
        }
        let mut buf = BytesMut::new();
        frame::encode_response_header(&mut buf, 3, Code::OK, "", &[], &Metadata::new());
        send(&mut server, buf).await;
        assert!(matches!(third_rx.await.unwrap(), Ok(Answer::Unary { .. })));
        task.abort();
        drop((tx, second));
    }

    /// The in-memory link, told to say it may lose frames (as UDP's does): the driver
    /// keeps each request until answered and resends it when its timer fires.
    struct Unreliable(mem::MemLink);

    impl Link for Unreliable {
        fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<bytes::Bytes, Error>>> {
            self.0.poll_recv(cx)
        }
        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
            self.0.poll_ready(cx)
        }
        fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
            self.0.start_send(header, payload)
        }
        fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
            self.0.poll_flush(cx)
        }
        fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
            self.0.poll_close(cx)
        }
        fn peer(&self) -> String {
            self.0.peer()
        }
        fn is_reliable(&self) -> bool {
            false
        }
    }

    struct UnreliableConnector(mem::MemConnector);

    impl Connector for UnreliableConnector {
        type Link = Unreliable;
        async fn connect(&self, config: &LinkConfig) -> Result<Unreliable, Error> {
            self.0.connect(config).await.map(Unreliable)
        }
        fn target(&self) -> String {
            self.0.target()
        }
    }

    /// On a link that may lose frames, a call written by its caller has its
    /// retransmission timer armed there, with the task's waker, on the driver's
    /// runtime whatever thread the caller is on: the request lost, the timer wakes the
    /// task, which sends it again under the same id, though nothing else woke it.
    #[tokio::test(start_paused = true)]
    async fn a_call_written_by_its_caller_on_a_lossy_link_is_resent_by_its_timer() {
        let (_listener, connector) = mem::listener();
        let (client, mut server) = mem::pair(&LinkConfig::default());
        let (cell, _tx) = cell_over(UnreliableConnector(connector), Unreliable(client));
        let wakes = Arc::new(Wakes::default());
        let waker = futures::task::waker(wakes.clone());
        let mut task = Box::pin(cell.clone().run());
        let mut cx = Context::from_waker(&waker);
        assert!(task.as_mut().poll(&mut cx).is_pending());
        assert!(
            cell.inline_ok.load(Ordering::Relaxed),
            "open: inline allowed"
        );

        // The caller on a thread of its own with no runtime: the timer it arms is
        // still the driver's.
        let (call, _call_rx) = outgoing(1);
        let sent = std::thread::scope(|scope| scope.spawn(|| cell.try_send(call).is_ok()).join());
        assert!(sent.unwrap(), "idle: written by the caller");
        let first = match recv(&mut server).await {
            Frame::Request(r) => r.id,
            other => panic!("unexpected {other:?}"),
        };
        // The request is "lost": no answer. Only its timer can wake the task.
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            wakes.0.load(Ordering::SeqCst) > 0,
            "the timer woke the task"
        );
        assert!(task.as_mut().poll(&mut cx).is_pending());
        match recv(&mut server).await {
            Frame::Request(r) => assert_eq!(r.id, first, "resent under its id"),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A call whose deadline has passed when its turn to be written comes (before its
    /// caller's timer is seen) is not written, and fails as a call that never left:
    /// `DEADLINE_EXCEEDED`, unprocessed (it was not marked, though nothing was sent;
    /// from a review).
    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_at_its_turn_is_not_sent_and_fails_unprocessed() {
        let (cell, tx, mut server, _listener) = connected_cell();
        let (mut late, late_rx) = outgoing(1);
        late.deadline = Some(Instant::now());
        let (next, next_rx) = outgoing(2);
        tx.send(Command::Call(late)).unwrap();
        tx.send(Command::Call(next)).unwrap();
        let task = tokio::spawn(cell.run());
        let err = match late_rx.await.unwrap() {
            Err(status) => status,
            Ok(_) => panic!("the late call was answered"),
        };
        assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
        assert!(err.is_unprocessed(), "{err}");
        // Only the next call went out.
        match recv(&mut server).await {
            Frame::Request(r) => assert_eq!(r.id, 2),
            other => panic!("unexpected {other:?}"),
        }
        task.abort();
        drop(next_rx);
    }

    /// However the driver task ends (here: aborted, as when its runtime shuts down),
    /// the driver goes with it: a call waiting for its answer fails, the next call is
    /// not written inline, and the command queue refuses it, instead of calls waiting
    /// on a driver nobody polls.
    #[tokio::test]
    async fn a_driver_whose_task_is_gone_fails_its_calls() {
        let (cell, tx, mut server, _listener) = connected_cell();
        let task = tokio::spawn(cell.clone().run());
        while !cell.inline_ok.load(Ordering::Relaxed) {
            tokio::task::yield_now().await;
        }
        let (first, first_rx) = outgoing(1);
        assert!(cell.try_send(first).is_ok());
        assert!(matches!(recv(&mut server).await, Frame::Request(_)));

        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let answered = tokio::time::timeout(Duration::from_secs(30), first_rx)
            .await
            .expect("the waiting call still waits on a driver nobody polls");
        assert!(answered.is_err(), "the waiting call's reply was dropped");
        let (second, _second_rx) = outgoing(2);
        let second = cell.try_send(second).expect_err("no driver: not inline");
        assert!(
            tx.send(Command::Call(second)).is_err(),
            "the queue refuses the call"
        );
    }
}
