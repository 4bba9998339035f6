//! The tasks behind a soft endpoint.
//!
//! - [`Driver`] owns the socket: it writes what the endpoint posts (messages and
//!   requests to the peer's responder), delivers arriving messages into posted
//!   receive buffers, completes the responder path's operations, and is the
//!   **responder**: it serves the peer's read and write requests from this side's
//!   region table, with the application's code nowhere involved. It never stops
//!   reading, so two responders cannot wait on each other; read requests wait (a few
//!   bytes each) while its write buffer is full.
//! - [`cma_worker`] runs one-sided operations by cross-memory attach, one at a time
//!   (one lane in the region table), large ones on the blocking pool.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    io,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, BytesMut};
use rpc_core::{Error, ErrorKind};
use rpc_transport_tcp::Stream;
use tokio::{
    io::AsyncWrite,
    sync::{mpsc, oneshot},
    time::Sleep,
};

use super::{
    failed,
    memory::SoftBuf,
    packet::{self, Packet},
    table::Reject,
    Shared, CHUNK,
};
use crate::provider::{Access, Buffer, Completion, Op, RemoteSlice};

/// Bytes waiting in the write buffer past which the responder defers its answers
/// and the driver takes no new commands until the socket drains.
const WRITE_HIGH_WATER: usize = 4 * CHUNK;

/// Chunk requests in flight per responder-path operation.
const WINDOW: usize = 8;

/// Requests of the peer whose answers are deferred while the write buffer is full;
/// the peer has at most `WINDOW` per operation and a bounded send queue, and each is
/// a few bytes. A peer past it is not reading the answers: the connection ends.
const MAX_DEFERRED: usize = 1 << 16;

/// A request of the peer answered once the write buffer has room, in arrival order.
enum Deferred {
    /// A read, served then.
    Read {
        id: u64,
        key: u64,
        offset: u64,
        len: u32,
    },
    /// A write, done already (unfenced, as a write after a read may be on hardware):
    /// only its answer waits.
    Written { id: u64, status: u8 },
}

/// Operations at most this long run on the worker task itself; longer ones go to
/// the blocking pool so that a large copy never holds up a runtime thread.
const INLINE_COPY: usize = 64 * 1024;

/// Commands from the endpoint to its driver.
pub(crate) enum Cmd {
    PostRecv {
        wr: u64,
        buf: SoftBuf,
    },
    Send {
        wr: u64,
        buf: SoftBuf,
        len: usize,
    },
    Remote {
        wr: u64,
        kind: RemoteKind,
        slice: RemoteSlice,
        reply: Reply,
    },
    Close(oneshot::Sender<Result<(), Error>>),
}

/// The local side of a one-sided operation.
pub(crate) enum RemoteKind {
    Read { dst: SoftBuf, dst_offset: usize },
    Write { src: SoftBuf, src_offset: usize },
}

/// A one-sided operation for the cross-memory-attach worker.
pub(crate) struct CmaOp {
    pub(crate) wr: u64,
    pub(crate) kind: RemoteKind,
    pub(crate) slice: RemoteSlice,
    pub(crate) reply: Reply,
}

/// Where a one-sided operation's completion goes: `None` to the endpoint's
/// completions, `Some` to the caller of a [`SoftHandle`](super::SoftHandle)
/// operation (so that operations of other tasks never pass through the link's
/// queue).
pub(crate) type Reply = Option<oneshot::Sender<Completion<SoftBuf>>>;

/// Hands `completion` to whoever waits for it.
fn deliver(events: &mpsc::UnboundedSender<Event>, reply: Reply, completion: Completion<SoftBuf>) {
    match reply {
        // The caller may have given up (its future was dropped): nothing to do.
        Some(tx) => drop(tx.send(completion)),
        None => drop(events.send(Event::Completion(completion))),
    }
}

/// What the tasks tell the endpoint.
pub(crate) enum Event {
    Completion(Completion<SoftBuf>),
    /// The connection ended. Completions of one-sided operations may still follow
    /// (the worker's, and those the driver fails as it drains its commands): the
    /// endpoint reports the end once none is in flight.
    Closed(Error),
}

/// A one-sided operation served by the peer's responder, in chunks.
struct RemoteOp {
    wr: u64,
    kind: RemoteKind,
    slice: RemoteSlice,
    /// Next chunk to request, and next chunk whose answer is due (answers come in
    /// order).
    next_request: usize,
    next_answer: usize,
    chunks: usize,
    error: Option<Error>,
    reply: Reply,
    /// When it was made, or last answered: each operation has the one-sided timeout
    /// of its own.
    answered: tokio::time::Instant,
}

impl RemoteOp {
    fn chunk(&self, i: usize) -> (u64, usize) {
        let start = i * CHUNK;
        (start as u64, CHUNK.min(self.slice.len - start))
    }
}

pub(crate) struct Driver {
    io: Stream,
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    events: mpsc::UnboundedSender<Event>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    max_packet: usize,
    recvs: VecDeque<(u64, SoftBuf)>,
    ops: HashMap<u64, RemoteOp>,
    next_op: u64,
    deferred: VecDeque<Deferred>,
    closing: Option<oneshot::Sender<Result<(), Error>>>,
    write_closed: bool,
    read_eof: bool,
    cmds_done: bool,
    /// The connection ended; only draining the commands is left.
    finished: bool,
    /// How long each operation in `ops` may go without an answer (the oldest
    /// unanswered one's time is checked: a peer answering one operation steadily
    /// kept another, never answered, alive for ever while the timer was the
    /// connection's: from a review).
    one_sided_timeout: Duration,
    tick: Pin<Box<Sleep>>,
}

impl Driver {
    pub(crate) fn new(
        io: Stream,
        rbuf: BytesMut,
        shared: Arc<Shared>,
        cmds: mpsc::UnboundedReceiver<Cmd>,
        events: mpsc::UnboundedSender<Event>,
        recvs: VecDeque<(u64, SoftBuf)>,
        config: &crate::RdmaConfig,
    ) -> Driver {
        Driver {
            io,
            shared,
            cmds,
            events,
            rbuf,
            wbuf: BytesMut::new(),
            max_packet: config.recv_buffer_len.max(CHUNK) + packet::MAX_OVERHEAD,
            recvs,
            ops: HashMap::new(),
            next_op: 1,
            deferred: VecDeque::new(),
            closing: None,
            write_closed: false,
            read_eof: false,
            cmds_done: false,
            finished: false,
            one_sided_timeout: config.one_sided_timeout,
            tick: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    fn peer(&self) -> &str {
        &self.shared.peer
    }

    fn complete(&self, completion: Completion<SoftBuf>) {
        let _ = self.events.send(Event::Completion(completion));
    }

    fn handle_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::PostRecv { wr, buf } => {
                self.recvs.push_back((wr, buf));
                self.shared
                    .stats
                    .recv_posted
                    .store(self.recvs.len(), Ordering::Relaxed);
            }
            Cmd::Send { wr, buf, len } => {
                packet::put_send(&mut self.wbuf, &buf.as_slice()[..len]);
                self.shared.stats.sends.fetch_add(1, Ordering::Relaxed);
                // The bytes are in our write buffer: the send buffer is free again.
                self.complete(Completion {
                    wr,
                    op: Op::Send,
                    buf,
                    result: Ok(len),
                });
            }
            Cmd::Remote {
                wr,
                kind,
                slice,
                reply,
            } => self.start_remote(wr, kind, slice, reply),
            Cmd::Close(reply) => self.closing = Some(reply),
        }
    }

    fn start_remote(&mut self, wr: u64, kind: RemoteKind, slice: RemoteSlice, reply: Reply) {
        self.shared.stats.remote_ops.fetch_add(1, Ordering::Relaxed);
        if self.write_closed {
            // Its requests could never be written.
            let err = Error::new(
                ErrorKind::Closed,
                format!("the connection to {} is closing", self.peer()),
            );
            deliver(&self.events, reply, failed(wr, kind, err));
            return;
        }
        if slice.len == 0 {
            let (op, buf) = kind.into_parts();
            let completion = Completion {
                wr,
                op,
                buf,
                result: Ok(0),
            };
            deliver(&self.events, reply, completion);
            return;
        }
        let id = self.next_op;
        self.next_op += 1;
        let op = RemoteOp {
            wr,
            kind,
            slice,
            next_request: 0,
            next_answer: 0,
            chunks: slice.len.div_ceil(CHUNK),
            error: None,
            reply,
            answered: tokio::time::Instant::now(),
        };
        self.ops.insert(id, op);
        for _ in 0..WINDOW {
            self.request_next(id);
        }
    }

    /// Sends the next chunk request of operation `id`, if any is left.
    fn request_next(&mut self, id: u64) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        if op.next_request == op.chunks {
            return;
        }
        let (start, len) = op.chunk(op.next_request);
        op.next_request += 1;
        let key = op.slice.region.key;
        let offset = op.slice.offset + start;
        match &op.kind {
            RemoteKind::Read { .. } => {
                packet::put_read_req(&mut self.wbuf, id, key, offset, len as u32);
            }
            RemoteKind::Write { src, src_offset } => {
                let from = src_offset + start as usize;
                packet::put_write_req(
                    &mut self.wbuf,
                    id,
                    key,
                    offset,
                    &src.as_slice()[from..from + len],
                );
            }
        }
    }

    /// An answer to a chunk of operation `id`.
    fn answer(&mut self, id: u64, status: u8, data: &[u8], is_read: bool) -> Result<(), Error> {
        let peer = self.shared.peer.clone();
        let Some(op) = self.ops.get_mut(&id) else {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("{peer} answered request {id}, which this side never made"),
            ));
        };
        op.answered = tokio::time::Instant::now();
        if matches!(op.kind, RemoteKind::Read { .. }) != is_read {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("{peer} answered a request with the wrong kind of response"),
            ));
        }
        if op.next_answer >= op.next_request {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("{peer} answered a part of request {id} that this side has not asked for"),
            ));
        }
        let (start, len) = op.chunk(op.next_answer);
        op.next_answer += 1;
        if status != 0 {
            if op.error.is_none() {
                self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                let want = if is_read { Access::READ } else { Access::WRITE };
                op.error = Some(Reject::from_code(status).error(
                    op.slice.region.key,
                    op.slice.offset,
                    op.slice.len,
                    want,
                ));
            }
        } else if let RemoteKind::Read { dst, dst_offset } = &mut op.kind {
            if data.len() != len {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "{peer} answered a read of {len} bytes with {} bytes",
                        data.len()
                    ),
                ));
            }
            let at = *dst_offset + start as usize;
            dst.as_mut_slice()[at..at + len].copy_from_slice(data);
        }
        if op.next_answer == op.chunks {
            let op = self.ops.remove(&id).expect("present above");
            let result = match op.error {
                Some(err) => Err(err),
                None => {
                    self.shared
                        .stats
                        .one_sided_bytes
                        .fetch_add(op.slice.len as u64, Ordering::Relaxed);
                    Ok(op.slice.len)
                }
            };
            let (kind, buf) = op.kind.into_parts();
            let completion = Completion {
                wr: op.wr,
                op: kind,
                buf,
                result,
            };
            deliver(&self.events, op.reply, completion);
        } else {
            self.request_next(id);
        }
        Ok(())
    }

    /// The responder: a read request of the peer.
    fn serve_read(&mut self, id: u64, key: u64, offset: u64, len: u32) {
        let len = len as usize;
        self.shared.stats.served.fetch_add(1, Ordering::Relaxed);
        match self.shared.table.lookup(key, offset, len, Access::READ) {
            Ok(mem) => {
                packet::put_read_resp_header(&mut self.wbuf, id, 0, len);
                let start = self.wbuf.len();
                self.wbuf.resize(start + len, 0);
                mem.read_into(offset as usize, &mut self.wbuf[start..]);
            }
            Err(reject) => {
                self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                packet::put_read_resp_header(&mut self.wbuf, id, reject.code(), 0);
            }
        }
    }

    /// The responder: a write request of the peer; its answer, if it must wait.
    fn serve_write(&mut self, id: u64, key: u64, offset: u64, data: &[u8]) -> Option<Deferred> {
        self.shared.stats.served.fetch_add(1, Ordering::Relaxed);
        let status = match self
            .shared
            .table
            .lookup(key, offset, data.len(), Access::WRITE)
        {
            Ok(mem) => {
                mem.write_from(offset as usize, data);
                0
            }
            Err(reject) => {
                self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                reject.code()
            }
        };
        if self.wbuf.len() >= WRITE_HIGH_WATER || !self.deferred.is_empty() {
            return Some(Deferred::Written { id, status });
        }
        packet::put_write_resp(&mut self.wbuf, id, status);
        None
    }

    /// Queues a request's answer for when the write buffer has room; a peer that has
    /// [`MAX_DEFERRED`] waiting is not reading them.
    fn defer(&mut self, deferred: Deferred) -> Result<(), Error> {
        if self.deferred.len() >= MAX_DEFERRED {
            return Err(Error::new(
                ErrorKind::LimitReached,
                format!(
                    "{} sent too many one-sided requests without reading the answers",
                    self.peer()
                ),
            ));
        }
        self.deferred.push_back(deferred);
        Ok(())
    }

    fn handle_packet(&mut self, packet: Packet) -> Result<(), Error> {
        match packet {
            Packet::Send(message) => {
                let stats = &self.shared.stats;
                let Some((wr, mut buf)) = self.recvs.pop_front() else {
                    stats.rnr.fetch_add(1, Ordering::Relaxed);
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!(
                            "receiver not ready: a message of {} bytes from {} found no posted \
                             receive buffer (the sender ignored flow control)",
                            message.len(),
                            self.peer()
                        ),
                    ));
                };
                if message.len() > buf.len() {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!(
                            "a message of {} bytes from {} does not fit the posted receive \
                             buffer of {} bytes",
                            message.len(),
                            self.peer(),
                            buf.len()
                        ),
                    ));
                }
                stats.recvs.fetch_add(1, Ordering::Relaxed);
                stats.recv_posted.store(self.recvs.len(), Ordering::Relaxed);
                stats
                    .recv_posted_low
                    .fetch_min(self.recvs.len(), Ordering::Relaxed);
                buf.as_mut_slice()[..message.len()].copy_from_slice(&message);
                self.complete(Completion {
                    wr,
                    op: Op::Recv,
                    buf,
                    result: Ok(message.len()),
                });
            }
            Packet::ReadReq {
                id,
                key,
                offset,
                len,
            } => {
                if len as usize > CHUNK {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!(
                            "{} asked for a read of {len} bytes in one request",
                            self.peer()
                        ),
                    ));
                }
                if self.wbuf.len() >= WRITE_HIGH_WATER || !self.deferred.is_empty() {
                    self.defer(Deferred::Read {
                        id,
                        key,
                        offset,
                        len,
                    })?;
                } else {
                    self.serve_read(id, key, offset, len);
                }
            }
            Packet::WriteReq {
                id,
                key,
                offset,
                data,
            } => {
                // Each answer is a few bytes, but a peer that sends requests and never
                // reads would grow the write buffer without end (3 GB in 20 s).
                if let Some(answer) = self.serve_write(id, key, offset, &data) {
                    self.defer(answer)?;
                }
            }
            Packet::ReadResp { id, status, data } => self.answer(id, status, &data, true)?,
            Packet::WriteResp { id, status } => self.answer(id, status, &[], false)?,
            Packet::Hello(_) | Packet::TableAck { .. } => {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("{} repeated its connection setup", self.peer()),
                ))
            }
        }
        Ok(())
    }

    /// Runs until the connection ends: `Ok` when the endpoint is gone or the peer
    /// closed, `Err` when the connection failed.
    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // Work per poll before yielding to other tasks.
        let mut budget = 32;
        loop {
            let mut progress = false;
            // Commands, while the write buffer has room.
            while !self.cmds_done && self.wbuf.len() < WRITE_HIGH_WATER {
                match self.cmds.poll_recv(cx) {
                    Poll::Ready(Some(cmd)) => {
                        self.handle_cmd(cmd);
                        progress = true;
                    }
                    Poll::Ready(None) => {
                        // The endpoint is gone: nobody wants this connection any more.
                        self.cmds_done = true;
                        return Poll::Ready(Ok(()));
                    }
                    Poll::Pending => break,
                }
            }
            // Read whatever arrived; always, so that the peer's answers keep flowing.
            if !self.read_eof {
                if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                    self.rbuf.reserve(64 * 1024);
                }
                match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf) {
                    Poll::Ready(Ok(0)) => {
                        self.read_eof = true;
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => progress = true,
                    Poll::Ready(Err(e)) => {
                        return Poll::Ready(Err(Error::io(format!("read from {}", self.peer()), e)))
                    }
                    Poll::Pending => {}
                }
            }
            while let Some(packet) = packet::decode(&mut self.rbuf, self.max_packet)? {
                self.handle_packet(packet)?;
                progress = true;
            }
            while self.wbuf.len() < WRITE_HIGH_WATER {
                match self.deferred.pop_front() {
                    None => break,
                    Some(Deferred::Read {
                        id,
                        key,
                        offset,
                        len,
                    }) => self.serve_read(id, key, offset, len),
                    Some(Deferred::Written { id, status }) => {
                        packet::put_write_resp(&mut self.wbuf, id, status)
                    }
                }
                progress = true;
            }
            // Write.
            while !self.wbuf.is_empty() && !self.write_closed {
                match Pin::new(&mut self.io).poll_write(cx, &self.wbuf) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(Error::new(
                            ErrorKind::Closed,
                            format!("connection to {} refused further writes", self.peer()),
                        )))
                    }
                    Poll::Ready(Ok(n)) => {
                        self.wbuf.advance(n);
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => {
                        return Poll::Ready(Err(Error::io(format!("write to {}", self.peer()), e)))
                    }
                    Poll::Pending => break,
                }
            }
            if self.wbuf.is_empty() && !self.write_closed && self.closing.is_some() {
                match Pin::new(&mut self.io).poll_shutdown(cx) {
                    Poll::Ready(result) => {
                        self.write_closed = true;
                        let result = result.map_err(|e| {
                            Error::io(format!("shut down the connection to {}", self.peer()), e)
                        });
                        if let Some(reply) = self.closing.take() {
                            let _ = reply.send(result);
                        }
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }
            if self.read_eof {
                if !self.rbuf.is_empty() {
                    return Poll::Ready(Err(Error::new(
                        ErrorKind::Closed,
                        format!(
                            "{} closed the connection in the middle of a packet",
                            self.peer()
                        ),
                    )));
                }
                return Poll::Ready(Ok(()));
            }
            self.shared.prune();
            if !progress {
                let now = tokio::time::Instant::now();
                let mut wake = None;
                if let Some(due) = self.oldest_due() {
                    if now >= due {
                        return Poll::Ready(Err(self.unanswered()));
                    }
                    wake = Some(due);
                }
                if self.shared.has_quarantine() {
                    // Quarantined memory is freed once the peer's operation ends: look
                    // again soon.
                    let soon = now + Duration::from_millis(1);
                    wake = Some(wake.map_or(soon, |due: tokio::time::Instant| due.min(soon)));
                }
                if let Some(wake) = wake {
                    self.tick.as_mut().reset(wake);
                    if self.tick.as_mut().poll(cx).is_ready() {
                        cx.waker().wake_by_ref();
                    }
                }
                return Poll::Pending;
            }
            budget -= 1;
            if budget == 0 {
                // A peer that keeps us busy does not stop the clock.
                if self
                    .oldest_due()
                    .is_some_and(|due| tokio::time::Instant::now() >= due)
                {
                    return Poll::Ready(Err(self.unanswered()));
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }

    /// When the operation unanswered the longest times out (`None`: none is in
    /// flight). A scan of the operations in flight, a few, when the connection has
    /// nothing else to do.
    fn oldest_due(&self) -> Option<tokio::time::Instant> {
        self.ops
            .values()
            .map(|op| op.answered)
            .min()
            .map(|answered| answered + self.one_sided_timeout)
    }

    fn unanswered(&self) -> Error {
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "{} did not answer a one-sided operation for {:?}",
                self.peer(),
                self.one_sided_timeout
            ),
        )
    }

    /// Answers a command that came after the connection ended: a one-sided
    /// operation fails (the endpoint counts its own in flight and reports the end
    /// only once they have completed), a close is done; sends and receive buffers
    /// are dropped (the endpoint has been told the connection ended).
    fn refuse(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Remote {
                wr, kind, reply, ..
            } => deliver(&self.events, reply, failed(wr, kind, self.shared.gone())),
            Cmd::Close(reply) => drop(reply.send(Ok(()))),
            Cmd::Send { .. } | Cmd::PostRecv { .. } => {}
        }
    }

    fn finish(&mut self, outcome: Result<(), Error>) {
        let err = match outcome {
            Ok(()) => Error::new(
                ErrorKind::Closed,
                format!("{} closed the connection", self.peer()),
            ),
            Err(err) => err,
        };
        *self.shared.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(err.to_string());
        for (_, op) in self.ops.drain() {
            let message = format!(
                "the connection to {} ended before a one-sided operation completed: {err}",
                self.shared.peer
            );
            let completion = failed(op.wr, op.kind, Error::new(ErrorKind::Closed, message));
            deliver(&self.events, op.reply, completion);
        }
        if let Some(reply) = self.closing.take() {
            let _ = reply.send(Ok(()));
        }
        let _ = self.events.send(Event::Closed(err));
    }
}

impl Future for Driver {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if !this.finished {
            match this.poll_run(cx) {
                Poll::Ready(outcome) => {
                    this.finish(outcome);
                    this.finished = true;
                    // No command is taken from now on. One sent as the channel closed
                    // may still be on its way in: dropping the receiver now could
                    // strand it in the channel, its caller waiting for ever (a handle
                    // keeps the channel alive), so the commands are drained to the end.
                    this.cmds.close();
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        loop {
            match this.cmds.poll_recv(cx) {
                Poll::Ready(Some(cmd)) => this.refuse(cmd),
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Runs one-sided operations by cross-memory attach, one at a time.
pub(crate) async fn cma_worker(
    shared: Arc<Shared>,
    mut ops: mpsc::UnboundedReceiver<CmaOp>,
    events: mpsc::UnboundedSender<Event>,
    fallback: mpsc::UnboundedSender<Cmd>,
) {
    while let Some(op) = ops.recv().await {
        let (op, result) = if op.slice.len <= INLINE_COPY {
            let mut op = op;
            let result = run_cma(&shared, &mut op);
            (op, result)
        } else {
            let shared = shared.clone();
            let mut op = op;
            match tokio::task::spawn_blocking(move || {
                let result = run_cma(&shared, &mut op);
                (op, result)
            })
            .await
            {
                Ok(done) => done,
                // The blocking pool is shutting down: so is the runtime.
                Err(_) => return,
            }
        };
        let result = match result {
            Ok(n) => {
                shared
                    .stats
                    .one_sided_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            Err(CmaError::Refused(err)) => {
                // The kernel will not let us attach: the peer's responder takes over,
                // for this operation and every later one.
                tracing::debug!(peer = %shared.peer, %err, "cross-memory attach refused; using the peer's responder");
                shared.cma.store(false, Ordering::Relaxed);
                let CmaOp {
                    wr,
                    kind,
                    slice,
                    reply,
                } = op;
                if let Err(mpsc::error::SendError(Cmd::Remote {
                    wr, kind, reply, ..
                })) = fallback.send(Cmd::Remote {
                    wr,
                    kind,
                    slice,
                    reply,
                }) {
                    let err = Error::new(
                        ErrorKind::Closed,
                        format!("connection to {} is closed", shared.peer),
                    );
                    deliver(&events, reply, failed(wr, kind, err));
                }
                continue;
            }
            Err(CmaError::Failed(err)) => Err(err),
        };
        let CmaOp {
            wr, kind, reply, ..
        } = op;
        let (op, buf) = kind.into_parts();
        let completion = Completion {
            wr,
            op,
            buf,
            result,
        };
        match reply {
            // A handle's caller that gave up: nothing to do.
            Some(tx) => drop(tx.send(completion)),
            None => {
                if events.send(Event::Completion(completion)).is_err() {
                    // The endpoint is gone.
                    return;
                }
            }
        }
    }
}

#[derive(Debug)]
pub(super) enum CmaError {
    /// Attaching is not allowed (EPERM): fall back to the responder.
    Refused(io::Error),
    Failed(Error),
}

/// Checks the peer's table and copies, inside our lane (see `table`).
pub(super) fn run_cma(shared: &Shared, op: &mut CmaOp) -> Result<usize, CmaError> {
    let Some(peer) = &shared.peer_table else {
        return Err(CmaError::Refused(io::Error::other("no peer table")));
    };
    let (want, is_read) = match op.kind {
        RemoteKind::Read { .. } => (Access::READ, true),
        RemoteKind::Write { .. } => (Access::WRITE, false),
    };
    let slice = op.slice;
    let lane = shared.table.lane();
    lane.fetch_add(1, Ordering::SeqCst);
    let result = match peer.check(slice.region.key, slice.offset, slice.len, want) {
        Err(reject) => {
            shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
            Err(CmaError::Failed(reject.error(
                slice.region.key,
                slice.offset,
                slice.len,
                want,
            )))
        }
        // A peer process that exited (its table still mapped and "valid") is not
        // copied to or from: its pid may name another process by now.
        Ok(_) if shared.peer_exited() => Err(CmaError::Failed(shared.gone())),
        Ok(addr) => {
            let copied = match &mut op.kind {
                RemoteKind::Read { dst, dst_offset } => super::sys::vm_read(
                    shared.peer_pid,
                    &mut dst.as_mut_slice()[*dst_offset..*dst_offset + slice.len],
                    addr,
                ),
                RemoteKind::Write { src, src_offset } => super::sys::vm_write(
                    shared.peer_pid,
                    &src.as_slice()[*src_offset..*src_offset + slice.len],
                    addr,
                ),
            };
            match copied {
                Ok(()) => {
                    if is_read {
                        shared.stats.cma_reads.fetch_add(1, Ordering::Relaxed);
                    } else {
                        shared.stats.cma_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(slice.len)
                }
                Err(err) if err.raw_os_error() == Some(libc::EPERM) => Err(CmaError::Refused(err)),
                Err(err) if err.raw_os_error() == Some(libc::ESRCH) => Err(CmaError::Failed(
                    Error::new(
                        ErrorKind::Closed,
                        format!(
                            "the peer process {} ({}) is gone: one-sided operation failed",
                            shared.peer_pid, shared.peer
                        ),
                    )
                    .with_source(err),
                )),
                Err(err) => Err(CmaError::Failed(Error::io(
                    format!(
                        "cross-memory attach to {} (pid {}) failed",
                        shared.peer, shared.peer_pid
                    ),
                    err,
                ))),
            }
        }
    };
    lane.fetch_add(1, Ordering::SeqCst);
    result
}
