//! [`RdmaLink`]: whole frames over any [`Endpoint`].
//!
//! - A frame up to the eager threshold is copied, behind an 8-byte header, into a
//!   pooled send buffer and sent into one of the receive buffers the peer posted.
//!   The receiver copies it out when the core takes it and posts the buffer again.
//!   When both sides announced BATCH in their HELLO, the frames queued between two
//!   flushes share a send buffer (each behind its length) and go as one message:
//!   one credit, one send and one completion for a burst of calls. The receiver
//!   copies a BATCH out whole when the core takes its first frame, and hands out the
//!   rest from that copy.
//! - A longer frame goes by **rendezvous**: its payload segments are exposed as
//!   read-only regions (without a copy on the soft provider), an RTS names them, the
//!   receiver pulls them with one-sided reads into one buffer of the frame's size
//!   (checked against `max_frame_len` first) and answers FIN, and the sender drops
//!   the regions, which deregisters them.
//! - **Credits** (see `credit`) make sure no message finds the peer without a
//!   posted buffer. A receive buffer holding a frame goes back to the provider, and
//!   its credit to the peer, only when the core takes the frame (a BATCH's first):
//!   a core that stops reading stops the peer's sends after `recv_buffers`
//!   messages.
//! - Send buffers come from a pool that grows to the send-queue depth: nothing is
//!   registered per frame.
//! - **Bulk transfers** of the core do not pass through the link: its
//!   [`one_sided`](Link::one_sided) hands the core the endpoint's handle (see
//!   `crate::bulk`), and the tasks that ask run the one-sided operations.
//!
//! The link is driven by whichever of its poll methods the core calls: each first
//! handles the completions that arrived, then sends what is queued.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use rpc_core::{link::Link, Error, ErrorKind, Payload};

use crate::{
    config::{RdmaConfig, MAX_RECV_BUFFERS, MAX_RECV_BUFFER_LEN, MIN_RECV_BUFFER_LEN},
    credit::{Class, Credits},
    provider::{Buffer, Completion, Endpoint, Op, RegionDesc},
    soft::SoftEndpoint,
    wire::{self, Message, HEADER_LEN, MAX_INLINE_HEAD, MAX_SEGMENTS},
};

/// Completions handled per call before the link lets other tasks run.
const COMPLETION_BUDGET: usize = 256;

/// Work-request ids: receive buffers use `0..recv_buffers` (the provider's), sends
/// and reads are tagged in the top bits.
const SEND_TAG: u64 = 1 << 62;
const READ_TAG: u64 = 2 << 62;
const TAG_MASK: u64 = 3 << 62;

/// What a link did. Counters only grow, except the gauges.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Frames sent eagerly (copied into a send, alone or in a BATCH).
    pub eager_sent: AtomicU64,
    /// Frames sent by rendezvous.
    pub rendezvous_sent: AtomicU64,
    /// Frames received eagerly (alone or in a BATCH).
    pub eager_received: AtomicU64,
    /// BATCH messages sent: each carried one or more of the frames counted in
    /// `eager_sent`.
    pub batches_sent: AtomicU64,
    /// Frames received by rendezvous (pulled with one-sided reads).
    pub rendezvous_received: AtomicU64,
    /// Bytes pulled with one-sided reads.
    pub pulled_bytes: AtomicU64,
    /// CREDIT messages sent (credits that found no traffic to ride on).
    pub credit_messages: AtomicU64,
    /// Times a frame had to wait for credits, a send buffer or a rendezvous slot.
    pub send_waits: AtomicU64,
    /// Receive buffers holding frames the core has not taken (gauge).
    pub recv_held: AtomicUsize,
    /// Most receive buffers ever held at once: never more than were posted.
    pub recv_held_peak: AtomicUsize,
    /// Frames exposed for the peer to pull and not released yet (gauge).
    pub rendezvous_outstanding: AtomicUsize,
    /// Buffers this side exposed for bulk transfers ([`rpc_core::bulk`]) as
    /// registered regions.
    pub bulk_exposed: AtomicU64,
    /// One-sided reads this side made for bulk transfers (completed).
    pub bulk_reads: AtomicU64,
    /// One-sided writes this side made for bulk transfers (completed).
    pub bulk_writes: AtomicU64,
    /// Bytes moved by them.
    pub bulk_bytes: AtomicU64,
    /// Bulk operations of this side that failed (refused, or the connection ended).
    pub bulk_failed: AtomicU64,
    /// Regions this side's bulk exposures hold now (at most `max_regions` less the
    /// room kept for the link's rendezvous).
    pub bulk_regions: AtomicUsize,
}

impl LinkStats {
    /// Adds `self`'s counters into `sum`; with `open`, its gauges too (a closed link
    /// holds nothing). Peaks take the larger.
    fn add_into(&self, sum: &LinkStats, open: bool) {
        let add = |to: &AtomicU64, from: &AtomicU64| {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        };
        add(&sum.eager_sent, &self.eager_sent);
        add(&sum.rendezvous_sent, &self.rendezvous_sent);
        add(&sum.eager_received, &self.eager_received);
        add(&sum.batches_sent, &self.batches_sent);
        add(&sum.rendezvous_received, &self.rendezvous_received);
        add(&sum.pulled_bytes, &self.pulled_bytes);
        add(&sum.credit_messages, &self.credit_messages);
        add(&sum.send_waits, &self.send_waits);
        add(&sum.bulk_exposed, &self.bulk_exposed);
        add(&sum.bulk_reads, &self.bulk_reads);
        add(&sum.bulk_writes, &self.bulk_writes);
        add(&sum.bulk_bytes, &self.bulk_bytes);
        add(&sum.bulk_failed, &self.bulk_failed);
        sum.recv_held_peak.fetch_max(
            self.recv_held_peak.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        if open {
            let add = |to: &AtomicUsize, from: &AtomicUsize| {
                to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
            };
            add(&sum.recv_held, &self.recv_held);
            add(&sum.rendezvous_outstanding, &self.rendezvous_outstanding);
            add(&sum.bulk_regions, &self.bulk_regions);
        }
    }
}

/// What every link a listener accepted did, summed: the counters of closed links
/// included, the gauges of open ones. A handle, cheap to clone, that stays valid after
/// the listener moved into a server ([`RdmaListener::link_stats`](crate::RdmaListener::link_stats)).
#[derive(Clone, Debug, Default)]
pub struct LinkTotals {
    inner: Arc<std::sync::Mutex<LinkSum>>,
}

#[derive(Debug, Default)]
struct LinkSum {
    open: Vec<Arc<LinkStats>>,
    closed: LinkStats,
}

impl LinkTotals {
    /// Tracks one more link.
    pub(crate) fn track(&self, stats: Arc<LinkStats>) {
        let mut sum = self.lock();
        sum.prune();
        sum.open.push(stats);
    }

    /// The sums now, as a [`LinkStats`] of their own.
    pub fn snapshot(&self) -> LinkStats {
        let mut sum = self.lock();
        sum.prune();
        let total = LinkStats::default();
        sum.closed.add_into(&total, false);
        for link in &sum.open {
            link.add_into(&total, true);
        }
        total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkSum> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LinkSum {
    /// Folds the links that ended (only this list still holds their stats) into
    /// `closed`.
    fn prune(&mut self) {
        let closed = &self.closed;
        self.open.retain(|link| {
            let ended = Arc::strong_count(link) == 1;
            if ended {
                link.add_into(closed, false);
            }
            !ended
        });
    }
}

struct Outgoing {
    header: Bytes,
    payload: Payload,
}

/// A frame in arrival order: delivered in that order, so a small frame never
/// overtakes a large one announced before it.
enum Incoming<B> {
    Eager {
        wr: u64,
        buf: B,
        len: usize,
    },
    /// A BATCH of `frames` frames (checked when it arrived).
    Batch {
        wr: u64,
        buf: B,
        len: usize,
        frames: usize,
    },
    Rendezvous(u64),
}

/// A send buffer taking eager frames until the next flush: a BATCH message whose
/// header is written when it is posted.
struct OpenBatch<B> {
    buf: B,
    /// Bytes written, the header's included.
    len: usize,
}

/// A rendezvous frame from its RTS until the core takes it.
struct Pull<B> {
    id: u32,
    rts_wr: u64,
    /// The receive buffer holding the RTS: posted again when the core takes the
    /// frame, so that its credit stands for the frame.
    rts_buf: B,
    rts_len: usize,
    frame_len: usize,
    /// The frame's buffer, while no read is in flight into it.
    dst: Option<B>,
    segments: Vec<RegionDesc>,
    next: usize,
    offset: usize,
    frame: Option<Bytes>,
}

/// Settings a link keeps from [`RdmaConfig`].
#[derive(Clone, Copy, Debug)]
struct Limits {
    eager_threshold: usize,
    max_rendezvous: usize,
    max_pulls: usize,
    max_pending: usize,
    send_queue_depth: usize,
    bulk_one_sided: bool,
    max_bulk_ops: usize,
    /// Regions bulk exposures may hold: the table's, less what rendezvous may need.
    max_bulk_regions: usize,
    batch_frames: bool,
}

/// A [`Link`] over an RDMA [`Endpoint`] (the soft provider by default): frames up
/// to the eager threshold are copied into a send and land in a receive buffer the
/// peer posted, within the credits it gave; longer ones are exposed and pulled by
/// the peer with one-sided reads (rendezvous). See the crate docs and
/// `docs/rdma.md`.
pub struct RdmaLink<E: Endpoint = SoftEndpoint> {
    ep: E,
    peer: String,
    max_frame_len: usize,
    limits: Limits,
    credits: Credits,
    peer_recv_len: usize,
    /// Whether the peer's HELLO announced BATCH.
    peer_batches: bool,
    /// Eager frames packed since the last flush, not posted yet. While it is open
    /// nothing else is posted: each other message seals it first, so that the
    /// credit it was opened on is the one it takes.
    open: Option<OpenBatch<E::Buf>>,
    /// What is left of a BATCH whose first frame the core took: its entries, handed
    /// out before anything that arrived after it.
    batch_rest: Bytes,
    send_pool: Vec<E::Buf>,
    send_bufs: usize,
    in_flight: usize,
    next_wr: u64,
    /// Data frames sent (each on credit the peer returned) and rendezvous released
    /// (FIN): what only the peer's reading moves ([`unsent`](Link::unsent)).
    data_sent: u64,
    fins_received: u64,
    pending: VecDeque<Outgoing>,
    fins: VecDeque<u32>,
    exposed: HashMap<u32, Vec<E::Region>>,
    next_rendezvous: u32,
    ready: VecDeque<Incoming<E::Buf>>,
    held: usize,
    pulls: HashMap<u64, Pull<E::Buf>>,
    /// Pulls announced and not started (beyond `max_pulls`), in order.
    to_start: VecDeque<u64>,
    /// Pulls started and not taken by the core: what `max_pulls` bounds.
    active_pulls: usize,
    next_pull: u64,
    peer_closed: bool,
    dead: Option<(ErrorKind, String)>,
    /// The peer announced a frame over `max_frame_len`: reading ends there (what it
    /// sent after is dropped, reported as this error), while writing goes on, so
    /// that the core's GOAWAY (`FRAME_TOO_LARGE`: the calls not processed) reaches the
    /// peer (from a review: the link ended at once, the GOAWAY was never written, and
    /// the client was told its call may have run).
    too_large: Option<String>,
    stats: Arc<LinkStats>,
}

impl<E: Endpoint> fmt::Debug for RdmaLink<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaLink")
            .field("peer", &self.peer)
            .field("credits", &self.credits.available())
            .finish_non_exhaustive()
    }
}

impl<E: Endpoint> RdmaLink<E> {
    /// A link over a connected endpoint: sends its HELLO at once. Frames from the
    /// peer longer than `max_frame_len` are refused before anything is allocated.
    pub fn new(ep: E, config: &RdmaConfig, max_frame_len: usize) -> Result<Self, Error> {
        config.validate()?;
        let own_window = ep.recv_buffers() as u32;
        let mut link = RdmaLink {
            peer: ep.peer(),
            ep,
            max_frame_len,
            limits: Limits {
                eager_threshold: config.eager_threshold,
                max_rendezvous: config.max_rendezvous,
                max_pulls: config.max_pulls,
                max_pending: config.max_pending_frames,
                send_queue_depth: config.send_queue_depth,
                bulk_one_sided: config.bulk_one_sided,
                max_bulk_ops: config.max_bulk_ops,
                max_bulk_regions: config.max_bulk_regions(),
                batch_frames: config.batch_frames,
            },
            credits: Credits::new(own_window),
            peer_recv_len: 0,
            peer_batches: false,
            open: None,
            batch_rest: Bytes::new(),
            send_pool: Vec::new(),
            send_bufs: 0,
            in_flight: 0,
            next_wr: 0,
            data_sent: 0,
            fins_received: 0,
            pending: VecDeque::new(),
            fins: VecDeque::new(),
            exposed: HashMap::new(),
            next_rendezvous: 0,
            ready: VecDeque::new(),
            held: 0,
            pulls: HashMap::new(),
            to_start: VecDeque::new(),
            active_pulls: 0,
            next_pull: 0,
            peer_closed: false,
            dead: None,
            too_large: None,
            stats: Arc::default(),
        };
        let hello = wire::Hello {
            recv_buffers: own_window,
            recv_buffer_len: link.ep.recv_buffer_len() as u32,
            max_frame_len: u32::try_from(max_frame_len).unwrap_or(u32::MAX),
            batches: config.batch_frames,
        };
        let mut buf = link.ep.alloc(HEADER_LEN + wire::HELLO_LEN)?;
        let credits = link.credits.on_send();
        let len = wire::put_hello(buf.as_mut_slice(), credits, &hello);
        link.post_send(buf, len)?;
        Ok(link)
    }

    /// What this link did.
    pub fn stats(&self) -> &Arc<LinkStats> {
        &self.stats
    }

    /// The endpoint underneath.
    pub fn endpoint(&self) -> &E {
        &self.ep
    }

    fn dead_error(&self) -> Option<Error> {
        self.dead
            .as_ref()
            .map(|(kind, message)| Error::new(*kind, message.clone()))
    }

    fn protocol(&self, what: impl fmt::Display) -> Error {
        Error::new(ErrorKind::Protocol, format!("{}: {what}", self.peer))
    }

    /// Handles what completed and sends what can go. `Ok(true)` if anything changed.
    fn progress(&mut self, cx: &mut Context<'_>) -> Result<bool, Error> {
        if let Some(err) = self.dead_error() {
            return Err(err);
        }
        match self.progress_inner(cx) {
            Ok(changed) => {
                if changed {
                    // Another poll method of this task may be waiting for what changed.
                    cx.waker().wake_by_ref();
                }
                Ok(changed)
            }
            // Reported by `poll_recv`, after the frames that came before it.
            Err(err) if err.kind() == ErrorKind::FrameTooLarge => {
                self.too_large = Some(err.message().to_owned());
                cx.waker().wake_by_ref();
                Ok(true)
            }
            Err(err) => {
                self.dead = Some((err.kind(), err.to_string()));
                Err(err)
            }
        }
    }

    fn progress_inner(&mut self, cx: &mut Context<'_>) -> Result<bool, Error> {
        let mut changed = false;
        let mut budget = COMPLETION_BUDGET;
        while !self.peer_closed {
            if budget == 0 {
                cx.waker().wake_by_ref();
                break;
            }
            budget -= 1;
            match self.ep.poll_completion(cx) {
                Poll::Ready(Ok(completion)) => {
                    self.on_completion(completion)?;
                    changed = true;
                }
                Poll::Ready(Err(err)) if err.kind() == ErrorKind::Closed => {
                    self.peer_closed = true;
                    changed = true;
                    tracing::debug!(peer = %self.peer, %err, "RDMA connection closed");
                }
                Poll::Ready(Err(err)) => return Err(err),
                Poll::Pending => break,
            }
        }
        if !self.peer_closed {
            let sent = self.start_pulls().and_then(|()| self.send_queued());
            closed_is_not_fatal(sent)?;
        }
        Ok(changed)
    }

    fn on_completion(&mut self, c: Completion<E::Buf>) -> Result<(), Error> {
        match c.op {
            Op::Send => {
                self.in_flight -= 1;
                c.result?;
                // The HELLO's buffer is smaller than the pool's: let it go.
                if self.peer_recv_len > 0 && c.buf.len() == self.send_buf_len() {
                    self.send_pool.push(c.buf);
                }
            }
            Op::Recv => {
                let len = c.result?;
                if self.too_large.is_some() {
                    // Reading has ended: the connection closes once the GOAWAY is out.
                    return Ok(());
                }
                self.on_message(c.wr, c.buf, len)?;
            }
            Op::Read => {
                self.in_flight -= 1;
                self.on_pulled(c.wr & !TAG_MASK, c.buf, c.result)?;
            }
            Op::Write => {
                self.in_flight -= 1;
                c.result?;
            }
        }
        Ok(())
    }

    fn repost(&mut self, wr: u64, buf: E::Buf, held: Class) -> Result<(), Error> {
        if self.peer_closed {
            // Nobody will send into it any more.
            return Ok(());
        }
        match self.ep.post_recv(wr, buf) {
            Ok(()) => {
                self.credits.on_repost(held);
                Ok(())
            }
            Err(err) if err.kind() == ErrorKind::Closed => {
                // The peer closed; its end of stream is in the completions still to
                // be handled, after the frames it sent before.
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    fn hold(&mut self) {
        self.held += 1;
        self.stats.recv_held.store(self.held, Ordering::Relaxed);
        self.stats
            .recv_held_peak
            .fetch_max(self.held, Ordering::Relaxed);
    }

    fn on_message(&mut self, wr: u64, buf: E::Buf, len: usize) -> Result<(), Error> {
        let (header, message) = wire::decode(&buf.as_slice()[..len])?;
        self.credits.on_receive(header.credits)?;
        if !self.credits.started() && !matches!(message, Message::Hello(_)) {
            return Err(self.protocol("sent a message before its HELLO"));
        }
        match message {
            Message::Hello(hello) => {
                let count = hello.recv_buffers as usize;
                let blen = hello.recv_buffer_len as usize;
                if !(4..=MAX_RECV_BUFFERS).contains(&count)
                    || !(MIN_RECV_BUFFER_LEN..=MAX_RECV_BUFFER_LEN).contains(&blen)
                {
                    return Err(self.protocol(format_args!(
                        "announces {count} receive buffers of {blen} bytes, outside the limits \
                         (4 to {MAX_RECV_BUFFERS} of {MIN_RECV_BUFFER_LEN} to \
                         {MAX_RECV_BUFFER_LEN} bytes)"
                    )));
                }
                self.credits.on_peer_hello(hello.recv_buffers)?;
                self.peer_recv_len = blen;
                self.peer_batches = hello.batches;
                self.repost(wr, buf, Class::Control)?;
            }
            Message::Eager(frame) => {
                if frame.len() > self.max_frame_len {
                    return Err(self.too_large(frame.len()));
                }
                self.stats.eager_received.fetch_add(1, Ordering::Relaxed);
                self.ready.push_back(Incoming::Eager { wr, buf, len });
                self.hold();
            }
            Message::Batch(batch) => {
                if !self.limits.batch_frames {
                    return Err(self.protocol("sent a BATCH, which this side did not announce"));
                }
                if batch.longest > self.max_frame_len {
                    return Err(self.too_large(batch.longest));
                }
                self.stats
                    .eager_received
                    .fetch_add(batch.frames as u64, Ordering::Relaxed);
                let frames = batch.frames;
                self.ready.push_back(Incoming::Batch {
                    wr,
                    buf,
                    len,
                    frames,
                });
                self.hold();
            }
            Message::Rts(rts) => {
                if rts.frame_len > self.max_frame_len as u64 {
                    return Err(self.too_large(rts.frame_len as usize));
                }
                let frame_len = rts.frame_len as usize;
                let key = self.next_pull;
                self.next_pull += 1;
                self.pulls.insert(
                    key,
                    Pull {
                        id: header.id,
                        rts_wr: wr,
                        rts_buf: buf,
                        rts_len: len,
                        frame_len,
                        dst: None,
                        segments: Vec::new(),
                        next: 0,
                        offset: 0,
                        frame: None,
                    },
                );
                self.to_start.push_back(key);
                self.ready.push_back(Incoming::Rendezvous(key));
                self.hold();
            }
            Message::Fin => {
                let Some(regions) = self.exposed.remove(&header.id) else {
                    return Err(self.protocol(format_args!(
                        "released rendezvous {} that is not outstanding",
                        header.id
                    )));
                };
                // Dropping the regions deregisters them.
                drop(regions);
                self.fins_received += 1;
                self.stats
                    .rendezvous_outstanding
                    .store(self.exposed.len(), Ordering::Relaxed);
                self.repost(wr, buf, Class::Control)?;
            }
            Message::Credit => self.repost(wr, buf, Class::Control)?,
        }
        Ok(())
    }

    fn too_large(&self, len: usize) -> Error {
        Error::new(
            ErrorKind::FrameTooLarge,
            format!(
                "frame of {len} bytes from {} exceeds the maximum frame length of {} bytes \
                 (raise it with max_frame_len on the receiving side)",
                self.peer, self.max_frame_len
            ),
        )
    }

    /// Starts pulling announced rendezvous frames, in order, within `max_pulls`.
    fn start_pulls(&mut self) -> Result<(), Error> {
        while self.active_pulls < self.limits.max_pulls
            && self.in_flight < self.limits.send_queue_depth
        {
            let Some(key) = self.to_start.pop_front() else {
                break;
            };
            let Some(pull) = self.pulls.get_mut(&key) else {
                continue;
            };
            let (_, message) = wire::decode(&pull.rts_buf.as_slice()[..pull.rts_len])?;
            let Message::Rts(rts) = message else {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    "internal: a queued RTS is not an RTS",
                ));
            };
            // `frame_len` was checked against `max_frame_len` when the RTS arrived.
            let mut dst = self.ep.alloc(pull.frame_len)?;
            dst.as_mut_slice()[..rts.head.len()].copy_from_slice(rts.head);
            pull.offset = rts.head.len();
            pull.segments = rts.segments().collect();
            pull.dst = Some(dst);
            self.active_pulls += 1;
            self.pull_next(key)?;
        }
        Ok(())
    }

    /// Reads the next segment of pull `key`, or finishes it.
    fn pull_next(&mut self, key: u64) -> Result<(), Error> {
        let Some(pull) = self.pulls.get_mut(&key) else {
            return Ok(());
        };
        let Some(&segment) = pull.segments.get(pull.next) else {
            let dst = pull.dst.take().expect("no read in flight");
            pull.frame = Some(dst.into_bytes(pull.frame_len));
            let pulled: u64 = pull.segments.iter().map(|s| s.len).sum();
            self.stats.pulled_bytes.fetch_add(pulled, Ordering::Relaxed);
            self.stats
                .rendezvous_received
                .fetch_add(1, Ordering::Relaxed);
            self.fins.push_back(pull.id);
            return Ok(());
        };
        pull.next += 1;
        let slice = segment.slice(0, segment.len as usize)?;
        let offset = pull.offset;
        pull.offset += segment.len as usize;
        let dst = pull.dst.take().expect("one read at a time per pull");
        self.ep.post_read(READ_TAG | key, dst, offset, slice)?;
        self.in_flight += 1;
        Ok(())
    }

    fn on_pulled(
        &mut self,
        key: u64,
        buf: E::Buf,
        result: Result<usize, Error>,
    ) -> Result<(), Error> {
        let Some(pull) = self.pulls.get_mut(&key) else {
            return Err(self.protocol("internal: a read completed for no pull"));
        };
        if let Err(err) = result {
            return Err(Error::new(
                err.kind(),
                format!(
                    "pulling a frame of {} bytes from {} failed: {err}",
                    pull.frame_len, self.peer
                ),
            ));
        }
        pull.dst = Some(buf);
        self.pull_next(key)
    }

    fn take_send_buf(&mut self) -> Result<Option<E::Buf>, Error> {
        if self.in_flight >= self.limits.send_queue_depth {
            return Ok(None);
        }
        if let Some(buf) = self.send_pool.pop() {
            return Ok(Some(buf));
        }
        if self.send_bufs < self.limits.send_queue_depth {
            self.send_bufs += 1;
            return Ok(Some(self.ep.alloc(self.send_buf_len())?));
        }
        Ok(None)
    }

    fn post_send(&mut self, buf: E::Buf, len: usize) -> Result<(), Error> {
        self.post_counted_send(buf, len)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Posts a send already counted in `in_flight` (a BATCH, counted when it
    /// opened).
    fn post_counted_send(&mut self, buf: E::Buf, len: usize) -> Result<(), Error> {
        let wr = SEND_TAG | self.next_wr;
        self.next_wr = (self.next_wr + 1) & !TAG_MASK;
        // Every send is signaled: neither provider here can skip completions (see
        // `Caps::selective_signaling`), and the pool gets each buffer back from its
        // own completion.
        self.ep.post_send(wr, buf, len, true)
    }

    fn eager_limit(&self) -> usize {
        eager_limit(self.limits.eager_threshold, self.peer_recv_len)
    }

    /// The length of this link's send buffers (see [`send_buf_len`]).
    fn send_buf_len(&self) -> usize {
        send_buf_len(self.limits.eager_threshold, self.peer_recv_len)
    }

    /// Sends one frame if credits, a send buffer and (for rendezvous) a slot allow:
    /// into the open BATCH if the peer takes batches and it fits.
    fn try_send_frame(&mut self, header: &[u8], payload: &Payload) -> Result<bool, Error> {
        let len = header.len() + payload.len();
        let eager = len <= self.eager_limit();
        if eager
            && len > 0
            && self.batching()
            && HEADER_LEN + wire::ENTRY_LEN + len <= self.send_buf_len()
        {
            return self.batch_frame(header, payload, len);
        }
        self.seal_batch()?;
        if !self.credits.can_send(Class::Data) || !self.credits.started() {
            return Ok(false);
        }
        if !eager && self.exposed.len() >= self.limits.max_rendezvous {
            return Ok(false);
        }
        let Some(mut buf) = self.take_send_buf()? else {
            return Ok(false);
        };
        if eager {
            let out = buf.as_mut_slice();
            let at = wire::put_frame(out, HEADER_LEN, header, payload);
            let credits = self.credits.on_send();
            wire::put_header(out, wire::EAGER, credits, 0);
            self.post_send(buf, at)?;
            self.data_sent += 1;
            self.stats.eager_sent.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        // Rendezvous: the payload's segments are exposed as they are.
        let inline = header.len() <= MAX_INLINE_HEAD;
        let mut parts: Vec<Bytes> = Vec::with_capacity(MAX_SEGMENTS + 1);
        if !inline {
            parts.push(Bytes::copy_from_slice(header));
        }
        parts.extend(payload.segments().filter(|s| !s.is_empty()).cloned());
        if parts.len() > MAX_SEGMENTS {
            let mut rest = BytesMut::new();
            for part in parts.drain(MAX_SEGMENTS - 1..) {
                rest.extend_from_slice(&part);
            }
            parts.push(rest.freeze());
        }
        let head: &[u8] = if inline { header } else { &[] };
        let mut descs = [RegionDesc {
            key: 0,
            addr: 0,
            len: 0,
            access: crate::provider::Access::NONE,
        }; MAX_SEGMENTS];
        let mut regions = Vec::with_capacity(parts.len());
        for (i, part) in parts.into_iter().enumerate() {
            match self.ep.expose(part) {
                Ok(region) => {
                    descs[i] = crate::provider::Region::desc(&region);
                    regions.push(region);
                }
                Err(err) => {
                    self.send_pool.push(buf);
                    return Err(err);
                }
            }
        }
        debug_assert!(wire::rts_len(head.len(), regions.len()) <= self.peer_recv_len);
        let id = self.next_rendezvous;
        self.next_rendezvous = self.next_rendezvous.wrapping_add(1);
        let credits = self.credits.on_send();
        let n = wire::put_rts(
            buf.as_mut_slice(),
            credits,
            id,
            len as u64,
            head,
            &descs[..regions.len()],
        );
        self.exposed.insert(id, regions);
        self.stats
            .rendezvous_outstanding
            .store(self.exposed.len(), Ordering::Relaxed);
        self.post_send(buf, n)?;
        self.data_sent += 1;
        self.stats.rendezvous_sent.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Whether eager frames go in BATCH messages.
    fn batching(&self) -> bool {
        self.limits.batch_frames && self.peer_batches
    }

    /// Adds an eager frame to the open BATCH; seals that first if the frame does not
    /// fit, and opens one if credits and a send buffer allow. The caller checked that
    /// the frame fits an empty one.
    fn batch_frame(&mut self, header: &[u8], payload: &Payload, len: usize) -> Result<bool, Error> {
        if let Some(open) = &mut self.open {
            if open.len + wire::ENTRY_LEN + len <= open.buf.len() {
                open.len =
                    wire::put_batch_entry(open.buf.as_mut_slice(), open.len, header, payload);
                self.stats.eager_sent.fetch_add(1, Ordering::Relaxed);
                return Ok(true);
            }
            self.seal_batch()?;
        }
        if !self.credits.can_send(Class::Data) || !self.credits.started() {
            return Ok(false);
        }
        let Some(mut buf) = self.take_send_buf()? else {
            return Ok(false);
        };
        let len = wire::put_batch_entry(buf.as_mut_slice(), HEADER_LEN, header, payload);
        self.open = Some(OpenBatch { buf, len });
        // Counted from now: a read or send posted before the batch is sealed must
        // leave it room in the send queue (from a review).
        self.in_flight += 1;
        self.stats.eager_sent.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Posts the open BATCH, on the credit it was opened with (nothing was posted
    /// since).
    fn seal_batch(&mut self) -> Result<(), Error> {
        let Some(OpenBatch { mut buf, len }) = self.open.take() else {
            return Ok(());
        };
        let credits = self.credits.on_send();
        wire::put_header(buf.as_mut_slice(), wire::BATCH, credits, 0);
        if let Err(err) = self.post_counted_send(buf, len) {
            self.in_flight -= 1;
            return Err(err);
        }
        self.data_sent += 1;
        self.stats.batches_sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn send_control(&mut self, kind: u8, id: u32) -> Result<bool, Error> {
        self.seal_batch()?;
        if !self.credits.can_send(Class::Control) {
            return Ok(false);
        }
        let Some(mut buf) = self.take_send_buf()? else {
            return Ok(false);
        };
        let credits = self.credits.on_send();
        wire::put_header(buf.as_mut_slice(), kind, credits, id);
        self.post_send(buf, HEADER_LEN)?;
        Ok(true)
    }

    /// Sends queued frames, then FINs, then credits if no message carried them.
    fn send_queued(&mut self) -> Result<(), Error> {
        while let Some(out) = self.pending.pop_front() {
            if !self.try_send_frame(&out.header, &out.payload)? {
                self.pending.push_front(out);
                break;
            }
        }
        while let Some(&id) = self.fins.front() {
            if !self.send_control(wire::FIN, id)? {
                break;
            }
            self.fins.pop_front();
        }
        if self.credits.credit_due() {
            // An open batch carries the credits when it is sealed: a CREDIT goes only
            // if they are still due after it (an empty one had followed it: from a
            // review).
            self.seal_batch()?;
            if self.credits.credit_due() && self.send_control(wire::CREDIT, 0)? {
                self.stats.credit_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn take_frame(&mut self) -> Result<Option<Bytes>, Error> {
        if !self.batch_rest.is_empty() {
            // Its buffer went back when its first frame was taken.
            return self.next_batched().map(Some);
        }
        let frame = match self.ready.front() {
            None => return Ok(None),
            Some(Incoming::Rendezvous(key)) => {
                let key = *key;
                if self.pulls.get(&key).is_none_or(|p| p.frame.is_none()) {
                    // Still being pulled: later frames wait behind it.
                    return Ok(None);
                }
                self.ready.pop_front();
                let pull = self.pulls.remove(&key).expect("checked above");
                self.active_pulls -= 1;
                self.repost(pull.rts_wr, pull.rts_buf, Class::Data)?;
                pull.frame.expect("checked above")
            }
            Some(Incoming::Eager { .. }) => {
                let Some(Incoming::Eager { wr, buf, len }) = self.ready.pop_front() else {
                    unreachable!("matched above");
                };
                let frame = Bytes::copy_from_slice(&buf.as_slice()[HEADER_LEN..len]);
                self.repost(wr, buf, Class::Data)?;
                frame
            }
            Some(Incoming::Batch { .. }) => {
                let Some(Incoming::Batch {
                    wr,
                    buf,
                    len,
                    frames,
                }) = self.ready.pop_front()
                else {
                    unreachable!("matched above");
                };
                let body = &buf.as_slice()[HEADER_LEN..len];
                let frame = if frames == 1 {
                    let Some((frame, _)) = wire::batch_entry(body) else {
                        return Err(self.protocol("internal: a checked BATCH entry does not fit"));
                    };
                    Bytes::copy_from_slice(&body[frame])
                } else {
                    // One copy and one allocation for the whole batch; the buffer
                    // goes back now, and the rest is held here (at most one
                    // buffer's worth) until the core takes it.
                    self.batch_rest = Bytes::copy_from_slice(body);
                    self.next_batched()?
                };
                self.repost(wr, buf, Class::Data)?;
                frame
            }
        };
        self.held -= 1;
        self.stats.recv_held.store(self.held, Ordering::Relaxed);
        Ok(Some(frame))
    }
}

impl<E: Endpoint> RdmaLink<E> {
    /// Posts the open BATCH at a flush; a failure other than the connection's end
    /// ends the link.
    fn flush_batch(&mut self) -> Result<(), Error> {
        if let Err(err) = closed_is_not_fatal(self.seal_batch()) {
            self.dead = Some((err.kind(), err.to_string()));
            return Err(err);
        }
        Ok(())
    }

    /// The next frame of [`batch_rest`](Self::batch_rest), which is not empty.
    fn next_batched(&mut self) -> Result<Bytes, Error> {
        let Some((frame, next)) = wire::batch_entry(&self.batch_rest) else {
            self.batch_rest = Bytes::new();
            return Err(self.protocol("internal: a checked BATCH entry does not fit"));
        };
        let out = self.batch_rest.slice(frame);
        bytes::Buf::advance(&mut self.batch_rest, next);
        Ok(out)
    }
}

impl<E: Endpoint> Link for RdmaLink<E> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        if let Err(err) = self.progress(cx) {
            return Poll::Ready(Some(Err(err)));
        }
        match self.take_frame() {
            Ok(Some(frame)) => {
                // The buffer went back: give its credit back if no traffic will, and
                // start the next pull.
                if !self.peer_closed {
                    let sent = self.start_pulls().and_then(|()| self.send_queued());
                    if let Err(err) = closed_is_not_fatal(sent) {
                        // Reported by the next call; this frame is good.
                        self.dead = Some((err.kind(), err.to_string()));
                    }
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Ok(None) => {}
            Err(err) => {
                self.dead = Some((err.kind(), err.to_string()));
                return Poll::Ready(Some(Err(err)));
            }
        }
        if let Some(message) = &self.too_large {
            return Poll::Ready(Some(Err(Error::new(
                ErrorKind::FrameTooLarge,
                message.clone(),
            ))));
        }
        if self.peer_closed {
            if !self.pulls.is_empty() {
                return Poll::Ready(Some(Err(Error::new(
                    ErrorKind::Closed,
                    format!(
                        "{} closed the connection in the middle of a rendezvous frame",
                        self.peer
                    ),
                ))));
            }
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.progress(cx)?;
        if self.peer_closed {
            return Poll::Ready(Err(Error::new(
                ErrorKind::Closed,
                format!("{} closed the connection", self.peer),
            )));
        }
        if self.pending.len() < self.limits.max_pending {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        if let Some(err) = self.dead_error() {
            return Err(err);
        }
        if self.pending.is_empty() && self.try_send_frame(header, &payload)? {
            return Ok(());
        }
        self.stats.send_waits.fetch_add(1, Ordering::Relaxed);
        self.pending.push_back(Outgoing {
            header: Bytes::copy_from_slice(header),
            payload,
        });
        Ok(())
    }

    /// Frames announced and being pulled: 0 when none; it changes as pulls are
    /// announced and complete.
    fn receiving(&self) -> u64 {
        if self.pulls.is_empty() {
            0
        } else {
            self.next_pull + self.pulls.len() as u64
        }
    }

    /// While frames wait for credit or a send buffer (or in an open BATCH, until the
    /// flush), or large ones for the peer to pull them, a count of what only the
    /// peer's reading moves (one more than those so far); 0 when nothing waits. While
    /// a large frame waits for its pull, the rendezvous the peer released (FINs);
    /// otherwise those and the data messages sent, each on credit the peer returned.
    /// Not this side's own sends: it sends CREDIT whenever it reposts what the peer
    /// sent it, so a peer that sent a few frames now and then, and never pulled our
    /// answers, kept the measure moving and its answers, call slots and exposed
    /// memory held for good (from a review). A pull is one read, quick at RDMA's
    /// speeds: a peer that takes other frames but leaves one unpulled is not
    /// reading.
    fn unsent(&self) -> u64 {
        if self.pending.is_empty() && self.exposed.is_empty() && self.open.is_none() {
            0
        } else if !self.exposed.is_empty() {
            self.fins_received + 1
        } else {
            self.data_sent + self.fins_received + 1
        }
    }

    /// Handles completions as [`poll_recv`](Link::poll_recv) does (what arrives is
    /// held within the receive buffers and pulls the peer was given, as when frames
    /// are read slowly) and reports the peer's close or the connection's failure.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        if let Err(err) = self.progress(cx) {
            return Poll::Ready(err);
        }
        if self.peer_closed {
            return Poll::Ready(Error::new(
                ErrorKind::Closed,
                format!("{} closed the connection", self.peer),
            ));
        }
        Poll::Pending
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.progress(cx)?;
        self.flush_batch()?;
        if self.pending.is_empty() && self.fins.is_empty() {
            return Poll::Ready(Ok(()));
        }
        if self.peer_closed {
            return Poll::Ready(Err(Error::new(
                ErrorKind::Closed,
                format!(
                    "{} closed the connection with {} frames unsent",
                    self.peer,
                    self.pending.len()
                ),
            )));
        }
        Poll::Pending
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.progress(cx)?;
        self.flush_batch()?;
        if !self.peer_closed
            && (!self.pending.is_empty() || !self.fins.is_empty() || !self.exposed.is_empty())
        {
            // Wait until the peer has pulled every frame we exposed.
            return Poll::Pending;
        }
        if !self.peer_closed && self.in_flight > 0 {
            // Sends (and pulls) posted and not completed: a verbs queue pair torn
            // down now would drop them, the last frames with them (the soft
            // provider's driver writes what it took either way).
            return Poll::Pending;
        }
        self.exposed.clear();
        self.ep.poll_close(cx)
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn peer_info(&self) -> rpc_core::Peer {
        let peer = rpc_core::Peer::new(self.peer.clone());
        // The provider names TCP-carried peers `rdma://ip:port`.
        match self
            .peer
            .split_once("://")
            .and_then(|(_, addr)| addr.parse::<std::net::SocketAddr>().ok())
        {
            Some(addr) => peer.with_addr(addr),
            None => peer,
        }
    }

    /// Bulk transfers on this link are one-sided reads and writes of registered
    /// memory, run through the endpoint's [`Handle`](crate::provider::Handle) by the
    /// task that asks (see `crate::bulk`); `None` when `bulk_one_sided` is off, and
    /// the core serves them with BULK frames.
    fn one_sided(&self) -> Option<Arc<dyn rpc_core::bulk::OneSided>> {
        if !self.limits.bulk_one_sided {
            return None;
        }
        Some(Arc::new(crate::bulk::RdmaBulk::new(
            self.ep.handle(),
            self.stats.clone(),
            self.limits.max_bulk_ops,
            self.limits.max_bulk_regions,
        )))
    }
}

/// A post that fails because the connection closed is not an error of its own: the
/// end of the stream comes through the completions, after the frames that arrived
/// before it.
fn closed_is_not_fatal(result: Result<(), Error>) -> Result<(), Error> {
    match result {
        Err(err) if err.kind() == ErrorKind::Closed => Ok(()),
        other => other,
    }
}

/// The largest frame sent eagerly to a peer whose receive buffers are `peer_recv_len`
/// bytes long.
fn eager_limit(eager_threshold: usize, peer_recv_len: usize) -> usize {
    eager_threshold.min(peer_recv_len.saturating_sub(HEADER_LEN))
}

/// The length of a send buffer: what the largest message this side sends takes (an
/// eager frame, or an RTS with the largest inline head), never the peer's receive
/// buffer length as such, which the peer chooses (up to 1 MiB: with
/// `send_queue_depth` buffers, 256 MiB a connection).
fn send_buf_len(eager_threshold: usize, peer_recv_len: usize) -> usize {
    let largest = (eager_limit(eager_threshold, peer_recv_len) + HEADER_LEN)
        .max(wire::rts_len(MAX_INLINE_HEAD, MAX_SEGMENTS));
    largest.min(peer_recv_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer announcing the largest receive buffers does not make every send buffer
    /// that large (from a review: 256 × 1 MiB a connection).
    #[test]
    fn send_buffers_fit_what_is_sent_not_what_the_peer_announces() {
        let threshold = RdmaConfig::default().eager_threshold;
        assert_eq!(send_buf_len(threshold, 1 << 20), threshold + HEADER_LEN);
        assert_eq!(send_buf_len(threshold, 8192), 8192);
        let rts = wire::rts_len(MAX_INLINE_HEAD, MAX_SEGMENTS);
        assert_eq!(send_buf_len(0, 1 << 20), rts, "an RTS always fits");
        assert!(
            rts <= MIN_RECV_BUFFER_LEN,
            "and fits the smallest peer buffer"
        );
        assert_eq!(send_buf_len(threshold, 512), 512);
    }

    #[test]
    fn link_totals_keep_the_counts_of_closed_links_and_the_gauges_of_open_ones() {
        let totals = LinkTotals::default();
        let a = Arc::new(LinkStats::default());
        let b = Arc::new(LinkStats::default());
        totals.track(a.clone());
        totals.track(b.clone());
        a.eager_sent.store(3, Ordering::Relaxed);
        a.recv_held.store(2, Ordering::Relaxed);
        a.recv_held_peak.store(5, Ordering::Relaxed);
        b.send_waits.store(7, Ordering::Relaxed);
        b.recv_held.store(1, Ordering::Relaxed);
        let now = totals.snapshot();
        assert_eq!(now.eager_sent.load(Ordering::Relaxed), 3);
        assert_eq!(now.send_waits.load(Ordering::Relaxed), 7);
        assert_eq!(now.recv_held.load(Ordering::Relaxed), 3);
        drop(a); // the link ended
        let later = totals.snapshot();
        assert_eq!(later.eager_sent.load(Ordering::Relaxed), 3, "kept");
        assert_eq!(
            later.recv_held.load(Ordering::Relaxed),
            1,
            "a closed link holds nothing"
        );
        assert_eq!(later.recv_held_peak.load(Ordering::Relaxed), 5);
        assert_eq!(totals.lock().open.len(), 1);
    }
}
