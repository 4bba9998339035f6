//! The two halves of one call's HTTP/2 stream, shared by the client and server links,
//! and how HTTP/2 flow control becomes the core's stream credit.
//!
//! **Receiving** ([`Inbound`]): the core grants credit for a stream's messages with
//! WINDOW frames (docs/wire.md §6.9), starting at `INITIAL_STREAM_WINDOW`. The link
//! releases HTTP/2 window for the bytes it pulls while that credit is above zero; past
//! it, it still pulls DATA out of h2 but holds the window back, releasing it as the
//! core takes those messages (all of it once only part of a message is left). A core
//! that stops reading a stream therefore stops the window, and the peer stops sending: what one stream holds is at most h2's window, the core's
//! credit and one message. Pulling on matters: h2 counts every small DATA frame it
//! buffers against a budget (half the connection window) and closes the connection
//! with `ENHANCE_YOUR_CALM` past it, which a stream of small messages read slower than
//! sent reached.
//!
//! **Sending** ([`Outbound`]): the core may send messages while its credit lasts;
//! the link queues them and hands h2 only as much as h2 has capacity for (the peer's
//! window), and gives the core its credit back, with a WINDOW, for each message h2
//! has taken. A peer that stops reading so stops the core's producer after one
//! window's worth, as over the core's own wire. A peer whose window is huge but
//! that does not read is held back by `crate::meter`: a stream has at most
//! [`MAX_FRAMES_IN_H2`] frames in h2 that h2 has not written, its small messages
//! waiting past that to go together in one frame.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;

use crate::{
    codec::{self, Message, MessageDecoder, MessageError},
    meter::{Meter, Registered, MAX_FRAMES_IN_H2},
};

/// The least a message costs in the core's stream credit, however short
/// (docs/wire.md §6.9, `MIN_MESSAGE_COST`): both halves count credit as the core does.
pub(crate) const MIN_MESSAGE_COST: usize = 64;

/// What one message of `len` bytes costs in stream credit.
pub(crate) fn message_cost(len: usize) -> u32 {
    u32::try_from(len.max(MIN_MESSAGE_COST)).unwrap_or(u32::MAX)
}

/// What the receiving half produced.
#[derive(Debug)]
pub(crate) enum InEvent {
    /// One whole message.
    Message(Message),
    /// The peer ended its side, with these trailers if it sent any.
    End(Option<HeaderMap>),
}

/// Why the receiving half stopped.
#[derive(Debug)]
pub(crate) enum InError {
    /// The message stream is malformed or over the limit.
    Message(MessageError),
    /// The stream was reset or the connection failed.
    H2(h2::Error),
}

/// How many bytes of unfinished messages the receiving halves of one connection hold
/// together, and how many they may. A message's window is released as its bytes come
/// (it may be longer than the window), so without this a peer could leave a message
/// unfinished on every stream: 256 streams of 16 MiB, 4 GiB a connection. A stream
/// whose bytes would take the sum past the bound fails `RESOURCE_EXHAUSTED` (unless it
/// holds at most [`UNFINISHED_SPARED`]): failing is deadlock-free where holding its
/// window back is not, as the streams share the connection's window.
#[derive(Debug)]
pub(crate) struct Unfinished {
    held: AtomicUsize,
    max: usize,
}

/// A connection's bound on unfinished messages, in largest messages.
pub(crate) const UNFINISHED_MESSAGES: usize = 4;

/// A stream whose unfinished message holds at most this much is never refused for
/// the connection's bound (a small message split over two DATA frames, next to large
/// transfers that fill the bound): 256 streams of it are 16 MiB.
const UNFINISHED_SPARED: usize = 64 * 1024;

impl Unfinished {
    /// What the streams hold of unfinished messages now, together.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// A connection's bound: [`UNFINISHED_MESSAGES`] times the largest message.
    pub(crate) fn for_connection(max_message: usize) -> Arc<Unfinished> {
        Arc::new(Unfinished {
            held: AtomicUsize::new(0),
            max: max_message.saturating_mul(UNFINISHED_MESSAGES),
        })
    }
}

/// The receiving half of one call's stream.
pub(crate) struct Inbound {
    body: RecvStream,
    decoder: MessageDecoder,
    /// The core's credit for this stream, in message bytes: may go below zero by one
    /// message, as the core allows.
    credit: i64,
    /// DATA ended; only trailers are left to read.
    data_done: bool,
    /// [`take_single`](Self::take_single) met a stream error (h2 returns it again).
    failed: bool,
    /// Bytes pulled while the core had no credit, whose h2 window is not released yet.
    held: usize,
    /// The connection's count of unfinished messages, and this stream's part of it.
    unfinished: Arc<Unfinished>,
    counted: usize,
    /// [`take_single`](Self::take_single) found the connection's bound passed: the
    /// error [`poll_event`](Self::poll_event) reports.
    over: Option<MessageError>,
}

impl Inbound {
    /// The receiving half of `body`, with the core's initial credit.
    pub(crate) fn new(
        body: RecvStream,
        max_message: usize,
        credit: i64,
        unfinished: Arc<Unfinished>,
    ) -> Inbound {
        Inbound {
            body,
            decoder: MessageDecoder::new(max_message),
            credit,
            data_done: false,
            failed: false,
            held: 0,
            unfinished,
            counted: 0,
            over: None,
        }
    }

    /// Counts what the decoder holds, part of one message, against the connection's
    /// bound (see [`Unfinished`]).
    fn count_unfinished(&mut self) -> Result<(), MessageError> {
        let now = self.decoder.buffered();
        if now > self.counted {
            let more = now - self.counted;
            let held = self.unfinished.held.fetch_add(more, Ordering::Relaxed) + more;
            self.counted = now;
            if held > self.unfinished.max && now > UNFINISHED_SPARED {
                return Err(MessageError::ConnectionFull {
                    held,
                    max: self.unfinished.max,
                });
            }
        } else {
            self.uncount(self.counted - now);
        }
        Ok(())
    }

    fn uncount(&mut self, n: usize) {
        if n > 0 {
            self.unfinished.held.fetch_sub(n, Ordering::Relaxed);
            self.counted -= n;
        }
    }

    /// Whether [`take_single`](Self::take_single) may still succeed: the request has not
    /// ended, failed or grown past one message.
    pub(crate) fn may_become_single(&self) -> bool {
        !self.failed
            && self.over.is_none()
            && !self.data_done
            && self.decoder.may_hold_one_message()
    }

    /// Whether any byte of the request's body has come.
    pub(crate) fn has_data(&self) -> bool {
        self.data_done || self.decoder.has_partial()
    }

    /// Whether the half waits for the core's credit with nothing left to pull from h2
    /// (and so polls nothing of h2).
    pub(crate) fn is_held(&self) -> bool {
        self.credit <= 0 && self.data_done
    }

    /// Gives h2 back the window of up to `n` of the bytes pulled while the core had no
    /// credit.
    fn release_held(&mut self, n: usize) {
        let n = n.min(self.held);
        if n > 0 {
            let _ = self.body.flow_control().release_capacity(n);
            self.held -= n;
        }
    }

    /// Adds credit from a WINDOW of the core. Returns whether the half had been held
    /// back by credit (and so needs polling again).
    pub(crate) fn grant(&mut self, increment: u32) -> bool {
        let was_blocked = self.credit <= 0;
        self.credit = self.credit.saturating_add(i64::from(increment));
        was_blocked && self.credit > 0
    }

    /// A unary call's one message, taken if the whole request is already here: its
    /// DATA (exactly one well-formed message), the end of the stream, and trailers if
    /// the client sent any. Otherwise `None`, with nothing lost: what was read waits
    /// in the decoder for [`poll_event`](Self::poll_event), and h2 keeps returning a
    /// stream's error once it has one.
    pub(crate) fn take_single(&mut self, cx: &mut Context<'_>) -> Option<Message> {
        while !self.data_done {
            match self.body.poll_data(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    // As in `poll_event`; h2's window bounds what it buffered.
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    self.decoder.push(chunk);
                }
                Poll::Ready(None) => self.data_done = true,
                Poll::Ready(Some(Err(_))) => {
                    self.failed = true;
                    return None;
                }
                Poll::Pending => {
                    // A request still coming (a keyed one waits for the rest here):
                    // what it holds so far counts against the connection's bound.
                    if let Err(err) = self.count_unfinished() {
                        self.over = Some(err);
                    }
                    return None;
                }
            }
        }
        if !self.decoder.holds_one_message() {
            return None;
        }
        match self.body.poll_trailers(cx) {
            Poll::Ready(Ok(_)) => {
                let single = self.decoder.next().ok().flatten();
                self.uncount(self.counted);
                single
            }
            Poll::Ready(Err(_)) | Poll::Pending => None,
        }
    }

    /// The next event, within the core's credit.
    pub(crate) fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<InEvent, InError>> {
        if let Some(err) = self.over.take() {
            return Poll::Ready(Err(InError::Message(err)));
        }
        loop {
            if self.credit > 0 {
                if let Some(message) = self.decoder.next().map_err(InError::Message)? {
                    // What was unfinished is a message now.
                    self.uncount(self.counted);
                    self.credit -= i64::from(message_cost(message.data.len()));
                    // The window of what leaves the decoder, and no more: the bytes
                    // held stay within h2's window, however much credit the core
                    // gives at once.
                    self.release_held(codec::PREFIX_LEN + message.data.len());
                    return Poll::Ready(Ok(InEvent::Message(message)));
                }
                // No whole message left: what the decoder holds is part of one, which
                // completes only once its window is released (it may be longer than
                // the window), within the connection's bound.
                self.count_unfinished().map_err(InError::Message)?;
                self.release_held(usize::MAX);
            }
            if self.data_done {
                if self.credit <= 0 && self.decoder.has_partial() {
                    return Poll::Pending;
                }
                self.decoder.finish().map_err(InError::Message)?;
                let trailers =
                    std::task::ready!(self.body.poll_trailers(cx)).map_err(InError::H2)?;
                return Poll::Ready(Ok(InEvent::End(trailers)));
            }
            match std::task::ready!(self.body.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    if self.credit > 0 {
                        // Within the core's credit: h2 may refill its window.
                        let _ = self.body.flow_control().release_capacity(chunk.len());
                    } else {
                        // Past it: out of h2's buffer (see the module docs), but the
                        // window stays closed until the core takes messages.
                        self.held += chunk.len();
                    }
                    self.decoder.push(chunk);
                }
                Some(Err(err)) => return Poll::Ready(Err(InError::H2(err))),
                None => self.data_done = true,
            }
        }
    }
}

impl Drop for Inbound {
    fn drop(&mut self) {
        self.uncount(self.counted);
    }
}

/// Most bytes of an ended sending half that go to h2 at once, without waiting for
/// capacity (see `Outbound::poll_send`).
const SMALL_FINAL: usize = 16 * 1024;

/// Queued chunks shorter than this are copied together into one DATA frame of at most
/// [`COALESCE_UP_TO`] bytes (see `Outbound::poll_send`); longer ones go as they are.
const COALESCE_BELOW: usize = 1024;

/// The largest DATA frame made of coalesced chunks: HTTP/2's smallest maximum frame.
const COALESCE_UP_TO: usize = 16 * 1024;

/// What to send once the queued data has gone.
#[derive(Debug)]
enum Closing {
    /// Not yet: more may come.
    Open,
    /// Close the sending side with an empty DATA frame (a client's half-close).
    EndStream,
    /// Close it with trailers.
    Trailers(HeaderMap),
}

/// The sending half of one call's stream.
pub(crate) struct Outbound {
    /// `None` until the stream is open (a client's request waiting for h2).
    send: Option<SendStream<Bytes>>,
    /// Chunks to send, each with the core credit it returns once sent.
    queue: VecDeque<(Bytes, u32)>,
    queued: usize,
    end: Closing,
    /// Credit owed to the core: message bytes h2 has taken.
    owed: u64,
    finished: bool,
    /// The connection's count of written DATA, and this stream's frames in h2 once
    /// it sends more than a last small message.
    meter: Arc<Meter>,
    in_h2: Option<InH2>,
    /// Whether `queued` counts in the connection's [`Meter::queued`]: a unary answer's
    /// bytes do (see [`count_in_connection`](Self::count_in_connection)); a stream's
    /// messages are bounded by the core's credit already.
    metered: bool,
    /// `poll_send` found the stream reset by the peer (h2 reports that as a plain
    /// reason, not as a remote reset): the server counts it against its reset budget.
    reset_by_peer: bool,
}

/// The frames a stream handed h2 that h2 has not written yet (see [`crate::meter`]).
struct InH2 {
    written: Registered,
    /// DATA payload bytes handed to h2, and where each handed frame ends in them.
    handed: u64,
    ends: VecDeque<u64>,
}

impl InH2 {
    fn forget_written(&mut self) {
        let written = self.written.written();
        while self.ends.front().is_some_and(|&end| end <= written) {
            self.ends.pop_front();
        }
    }

    /// Whether [`MAX_FRAMES_IN_H2`] frames are unwritten; if so, `cx` is woken when
    /// h2 writes more of the stream.
    fn is_full(&mut self, cx: &mut Context<'_>) -> bool {
        self.forget_written();
        if self.ends.len() < MAX_FRAMES_IN_H2 {
            return false;
        }
        self.written.register_waker(cx.waker());
        // Written between the first look and the waker's registration?
        self.forget_written();
        self.ends.len() >= MAX_FRAMES_IN_H2
    }

    fn handed(&mut self, len: usize) {
        self.handed += len as u64;
        self.ends.push_back(self.handed);
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        // A stream gone with messages queued: they no longer count.
        self.forget_queued();
    }
}

impl Outbound {
    /// Counts what this stream queues, from now on and already, in the connection's
    /// [`Meter::queued`]: for a unary answer, which nothing else bounds while the
    /// peer's window keeps it from leaving (the server link holds new calls back past a bound).
    pub(crate) fn count_in_connection(&mut self) {
        if !self.metered {
            self.metered = true;
            self.meter.add_queued(self.queued);
        }
    }

    /// A sending half, open (`Some`) or not yet, on the connection of `meter`.
    pub(crate) fn new(send: Option<SendStream<Bytes>>, meter: Arc<Meter>) -> Outbound {
        Outbound {
            send,
            queue: VecDeque::new(),
            queued: 0,
            end: Closing::Open,
            owed: 0,
            finished: false,
            meter,
            in_h2: None,
            metered: false,
            reset_by_peer: false,
        }
    }

    /// The stream is open now.
    pub(crate) fn open(&mut self, send: SendStream<Bytes>) {
        self.send = Some(send);
    }

    /// Queues one message's chunks; `credit` (what the message cost the core, see
    /// [`message_cost`], or 0 for a message outside flow control) goes back to the
    /// core once the last chunk is sent.
    pub(crate) fn push_message(&mut self, chunks: crate::codec::Chunks, credit: u32) {
        let last = chunks.rest.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            self.queued += chunk.len();
            self.meter.add_pushed(chunk.len());
            if self.metered {
                self.meter.add_queued(chunk.len());
            }
            self.queue
                .push_back((chunk, if i == last { credit } else { 0 }));
        }
    }

    /// Ends the sending side with trailers after the queued data.
    pub(crate) fn push_trailers(&mut self, trailers: HeaderMap) {
        self.end = Closing::Trailers(trailers);
    }

    /// Ends the sending side (END_STREAM) after the queued data.
    pub(crate) fn push_end_stream(&mut self) {
        if matches!(self.end, Closing::Open) {
            self.end = Closing::EndStream;
        }
    }

    /// Whether everything, trailers or END_STREAM included, was handed to h2.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether data waits for h2's send capacity on an open stream.
    pub(crate) fn is_sending(&self) -> bool {
        !self.finished && self.send.is_some() && !self.queue.is_empty()
    }

    /// Whether nothing waits to be sent.
    pub(crate) fn is_idle(&self) -> bool {
        self.queue.is_empty() && matches!(self.end, Closing::Open)
    }

    /// Credit to give back to the core (0 if none).
    pub(crate) fn take_owed(&mut self) -> u32 {
        let owed = self.owed.min(u64::from(u32::MAX));
        self.owed -= owed;
        owed as u32
    }

    /// Resets the stream (`CANCEL` from the core, or an error of this side).
    pub(crate) fn reset(&mut self, reason: h2::Reason) {
        if let Some(send) = &mut self.send {
            send.send_reset(reason);
        }
        self.forget_queued();
        self.end = Closing::Open;
        self.finished = true;
        self.in_h2 = None;
    }

    /// Drops what is queued, unsent: it counts in the connection's meter no more.
    fn forget_queued(&mut self) {
        self.queue.clear();
        if self.metered {
            self.meter.sub_queued(self.queued);
        }
        self.meter.sub_pushed(self.queued);
        self.queued = 0;
    }

    /// Whether [`poll_send`](Self::poll_send) failed because the peer reset the
    /// stream (our own resets finish the half first, so they are never seen there).
    pub(crate) fn reset_by_peer(&self) -> bool {
        self.reset_by_peer
    }

    /// Marks the half finished without sending anything more (the call was answered
    /// another way, or the stream is gone).
    pub(crate) fn reset_quietly(&mut self) {
        self.forget_queued();
        self.end = Closing::Open;
        self.finished = true;
        self.in_h2 = None;
    }

    /// Hands h2 what its capacity allows. Errors when the stream is gone (reset by
    /// the peer, connection lost).
    pub(crate) fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        let Some(send) = &mut self.send else {
            return Poll::Pending;
        };
        if self.queued <= SMALL_FINAL && !matches!(self.end, Closing::Open) {
            // A small last message (a unary request or answer), ended: handed to h2
            // whole, with its END_STREAM or trailers, without waiting for capacity. h2
            // sends it as the windows allow, usually in the write that carries the
            // headers, so a server sees a unary request whole (the fast path,
            // `docs/grpc.md`) and the request costs no separate END_STREAM frame.
            let end_stream = matches!(self.end, Closing::EndStream);
            // Several chunks (a stream's last messages) go in one frame, not one each.
            let data = if self.queue.len() > 1 {
                let mut frame = bytes::BytesMut::with_capacity(self.queued);
                for (chunk, credit) in self.queue.drain(..) {
                    frame.extend_from_slice(&chunk);
                    self.owed += u64::from(credit);
                }
                Some(frame.freeze())
            } else {
                self.queue.pop_front().map(|(chunk, credit)| {
                    self.owed += u64::from(credit);
                    chunk
                })
            };
            if self.metered {
                self.meter.sub_queued(self.queued);
            }
            self.queued = 0;
            if let Some(data) = data {
                send.send_data(data, end_stream)?;
                if end_stream {
                    self.end = Closing::Open;
                    self.finished = true;
                    return Poll::Ready(Ok(()));
                }
            }
        }
        if !self.queue.is_empty() && self.in_h2.is_none() {
            self.in_h2 = Some(InH2 {
                written: self.meter.register(send.stream_id().into()),
                handed: 0,
                ends: VecDeque::new(),
            });
        }
        while let Some(front_len) = self.queue.front().map(|(chunk, _)| chunk.len()) {
            let in_h2 = self.in_h2.as_mut().expect("registered above");
            if front_len < COALESCE_BELOW && in_h2.is_full(cx) {
                // h2 holds enough of this stream's frames: small messages wait here,
                // to go together in one frame once h2 has written some (a peer that
                // opens a huge window and never reads would otherwise have h2 keep
                // one frame per message; `crate::meter`). A reset drops those frames
                // unwritten: it must still be seen.
                return match send.poll_reset(cx) {
                    Poll::Ready(Ok(reason)) => {
                        self.reset_by_peer = true;
                        Poll::Ready(Err(reason.into()))
                    }
                    Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
                    Poll::Pending => Poll::Pending,
                };
            }
            let mut capacity = send.capacity();
            if capacity == 0 {
                send.reserve_capacity(self.queued);
                match send.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(n))) => capacity = n,
                    Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                    Poll::Ready(None) => {
                        // The stream can send nothing more: the peer reset it. What
                        // waits here never leaves; reported as gone, so that the
                        // stream is dropped and its bytes stop counting (toward the
                        // server link's hold on new calls, among others).
                        let gone = match send.poll_reset(cx) {
                            Poll::Ready(Ok(reason)) => {
                                self.reset_by_peer = true;
                                reason.into()
                            }
                            Poll::Ready(Err(err)) => err,
                            Poll::Pending => h2::Reason::STREAM_CLOSED.into(),
                        };
                        self.reset_quietly();
                        return Poll::Ready(Err(gone));
                    }
                    Poll::Pending => return Poll::Pending,
                }
                if capacity == 0 {
                    continue;
                }
            }
            if front_len < COALESCE_BELOW && self.queue.len() > 1 {
                // Several small messages waiting (the peer's window had run out, or
                // the core handed over a batch): one DATA frame for as many as fit,
                // not one each. A peer that reads slowly buffers frames, and h2 (the
                // peer's, or ours) counts small ones against a budget and closes the
                // connection past it.
                let room = capacity.min(COALESCE_UP_TO);
                let mut frame = bytes::BytesMut::new();
                while let Some((chunk, _)) = self.queue.front() {
                    if chunk.len() >= COALESCE_BELOW || frame.len() + chunk.len() > room {
                        break;
                    }
                    let (chunk, credit) = self.queue.pop_front().expect("front exists");
                    self.queued -= chunk.len();
                    if self.metered {
                        self.meter.sub_queued(chunk.len());
                    }
                    self.owed += u64::from(credit);
                    frame.extend_from_slice(&chunk);
                }
                if !frame.is_empty() {
                    in_h2.handed(frame.len());
                    send.send_data(frame.freeze(), false)?;
                    continue;
                }
            }
            let Some((chunk, _)) = self.queue.front_mut() else {
                break;
            };
            let n = capacity.min(chunk.len());
            let piece = chunk.split_to(n);
            self.queued -= n;
            if self.metered {
                self.meter.sub_queued(n);
            }
            in_h2.handed(n);
            send.send_data(piece, false)?;
            if chunk.is_empty() {
                let (_, credit) = self.queue.pop_front().expect("front exists");
                self.owed += u64::from(credit);
            }
        }
        match std::mem::replace(&mut self.end, Closing::Open) {
            Closing::Open => {}
            Closing::EndStream => {
                send.send_data(Bytes::new(), true)?;
                self.finished = true;
            }
            Closing::Trailers(trailers) => {
                send.send_trailers(trailers)?;
                self.finished = true;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Ready when the peer reset the stream (for a half whose data is all sent, so
    /// that a reset is still noticed).
    pub(crate) fn poll_reset(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<h2::Reason, h2::Error>> {
        match &mut self.send {
            Some(send) => send.poll_reset(cx),
            // Finished without ever being opened: the response could not be started
            // (h2 refused its headers: the peer had reset the stream). Nothing of h2's
            // would ever wake this for a reset, so it is one now (else the call, its
            // handler and its stream slot in the core, stayed for the connection's
            // life).
            None if self.finished => Poll::Ready(Ok(h2::Reason::CANCEL)),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{future::poll_fn, time::Duration};

    use super::*;

    /// h2's default stream window, which the server below keeps.
    const WINDOW: usize = 65_535;

    /// A half whose response could not be started (h2 refused its headers: the peer
    /// had reset the stream) reports a reset: it waited for one for ever, and the
    /// core never heard its call end (from a review).
    #[test]
    fn a_half_finished_before_it_opened_reports_a_reset() {
        let mut out = Outbound::new(None, Arc::new(Meter::default()));
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(out.poll_reset(&mut cx).is_pending(), "not open yet");
        out.reset_quietly();
        assert!(matches!(out.poll_reset(&mut cx), Poll::Ready(Ok(_))));
    }

    /// A peer streams small messages far faster than the core takes them, and the
    /// core gives credit in batches: the bytes the half holds stay within h2's window
    /// and a message, round after round (giving back the window of every held byte
    /// at each grant let the peer refill it while the decoder still held the last).
    #[tokio::test]
    async fn bytes_held_past_the_credit_stay_within_the_window() {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let (request, _respond) = conn.accept().await.unwrap().unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            (request.into_body(), _respond)
        });
        let (send_request, conn) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(conn);
        let mut send_request = send_request.ready().await.unwrap();
        let request = http::Request::post("http://localhost/t.S/M")
            .body(())
            .unwrap();
        let (_response, mut send) = send_request.send_request(request, false).unwrap();
        // 4 MiB of 64-byte messages (59 payload bytes and the 5-byte prefix), 64 to a
        // DATA frame (as grpc-go and our `Outbound` coalesce them: h2 closes a
        // connection that buffers many small frames).
        let mut message = vec![0u8, 0, 0, 0, 59];
        message.resize(64, 7);
        let frame = Bytes::from(message.repeat(64));
        for _ in 0..(4 << 20) / frame.len() {
            send.send_data(frame.clone(), false).unwrap();
        }
        let (body, _respond) = server.await.unwrap();

        let mut inbound = Inbound::new(body, 1 << 20, 1024, Unfinished::for_connection(1 << 20));
        let mut taken = 0usize;
        for _round in 0..20 {
            // Pull until h2 has nothing more: the peer is held by the window.
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let pending = poll_fn(|cx| Poll::Ready(inbound.poll_event(cx).is_pending()));
                if pending.await && inbound.credit <= 0 {
                    let before = inbound.decoder.buffered();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let again = poll_fn(|cx| Poll::Ready(inbound.poll_event(cx).is_pending()));
                    assert!(again.await);
                    if inbound.decoder.buffered() == before {
                        break;
                    }
                }
            }
            assert!(
                // The window, and the rest of one DATA frame pulled within credit.
                inbound.held <= WINDOW && inbound.decoder.buffered() <= WINDOW + 16_384,
                "held {} bytes, the decoder {}: past the window",
                inbound.held,
                inbound.decoder.buffered()
            );
            // The core takes a batch: 256 messages' worth of credit.
            inbound.grant(256 * 64);
            while inbound.credit > 0 {
                let event = poll_fn(|cx| inbound.poll_event(cx)).await.unwrap();
                assert!(matches!(event, InEvent::Message(_)));
                taken += 1;
            }
        }
        assert!(taken >= 20 * 256, "the core took {taken} messages");
    }
}
