//! gRPC's own encodings, sans-IO: the 5-byte message prefix, `grpc-timeout`,
//! percent-encoded `grpc-message`, base64 for `-bin` headers, and the status a client
//! reports for an HTTP status or a stream reset. Plain functions and one decoder
//! struct, tested without sockets.

use std::{collections::VecDeque, fmt, time::Duration};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rpc_core::{compress::Algorithm, frame::Frame, link::Received, Code, Payload};

/// Length of the prefix before every gRPC message: a compressed flag (1 byte) and
/// the message length (u32 big-endian).
pub const PREFIX_LEN: usize = 5;

/// Messages up to this size are copied behind their prefix into one buffer, so that
/// each goes out as one HTTP/2 DATA frame; larger ones keep their own buffers (a
/// 5-byte frame in front of a large one costs less than the copy).
const COALESCE_BELOW: usize = 8 * 1024;

/// One message as it came off the wire.
#[derive(Debug, PartialEq)]
pub(crate) struct Message {
    /// The prefix's compressed flag was 1.
    pub(crate) compressed: bool,
    /// The message bytes (without the prefix).
    pub(crate) data: MessageData,
}

/// A message's bytes as HTTP/2 delivered them: the DATA chunks it spans, not copied
/// together here. The links copy them once, into the core's frame (a buffer of the
/// message's own, [`to_bytes`](Self::to_bytes), or behind a DATA frame's header);
/// copying here as well cost a second copy of every message spread over several
/// chunks (a 16 MiB echo: 13% of the samples).
#[derive(Clone, Debug, Default)]
pub(crate) struct MessageData {
    /// The first chunk (the whole message when it came in one).
    first: Bytes,
    /// The chunks after it.
    rest: Vec<Bytes>,
    /// `first` is the whole message in a buffer of its own (assembled as it came, see
    /// [`MessageDecoder`]), not a slice of a read buffer: [`to_bytes`](Self::to_bytes)
    /// hands it over as it is.
    owned: bool,
}

impl MessageData {
    /// Its first bytes, up to `N` (fewer if it is shorter).
    pub(crate) fn head<const N: usize>(&self) -> ([u8; N], usize) {
        let mut out = [0u8; N];
        let mut n = 0;
        for chunk in std::iter::once(&self.first).chain(&self.rest) {
            let take = chunk.len().min(N - n);
            out[n..n + take].copy_from_slice(&chunk[..take]);
            n += take;
            if n == N {
                break;
            }
        }
        (out, n)
    }

    /// The message in one buffer of its own already (assembled as it came): handed
    /// to the core as it is, not copied behind a frame header.
    pub(crate) fn is_owned(&self) -> bool {
        self.owned
    }

    /// The message's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.rest.iter().map(Bytes::len).sum::<usize>()
    }

    /// Whether the message is empty.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the message's bytes to `buf`.
    pub(crate) fn copy_to(&self, buf: &mut BytesMut) {
        buf.reserve(self.len());
        buf.extend_from_slice(&self.first);
        for chunk in &self.rest {
            buf.extend_from_slice(chunk);
        }
    }

    /// A message of these chunks, in order.
    #[cfg(test)]
    pub(crate) fn from_chunks(mut chunks: Vec<Bytes>) -> MessageData {
        let first = if chunks.is_empty() {
            Bytes::new()
        } else {
            chunks.remove(0)
        };
        MessageData {
            first,
            rest: chunks,
            owned: false,
        }
    }

    /// The message in one buffer of its own: the core gets it without the chunks'
    /// read buffers, which a held message would otherwise keep alive.
    pub(crate) fn to_bytes(&self) -> Bytes {
        if self.owned {
            return self.first.clone();
        }
        if self.rest.is_empty() {
            return Bytes::copy_from_slice(&self.first);
        }
        let mut buf = BytesMut::with_capacity(self.len());
        self.copy_to(&mut buf);
        buf.freeze()
    }

    /// The bytes in order.
    fn iter(&self) -> impl Iterator<Item = &u8> {
        self.first
            .iter()
            .chain(self.rest.iter().flat_map(|c| c.iter()))
    }
}

impl PartialEq for MessageData {
    fn eq(&self, other: &MessageData) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<[u8]> for MessageData {
    fn eq(&self, other: &[u8]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<&[u8]> for MessageData {
    fn eq(&self, other: &&[u8]) -> bool {
        *self == **other
    }
}

impl PartialEq<Bytes> for MessageData {
    fn eq(&self, other: &Bytes) -> bool {
        *self == other[..]
    }
}

/// Why the message stream of a call cannot be read any further.
#[derive(Debug, PartialEq)]
pub(crate) enum MessageError {
    /// The length prefix announces more than the receiver's limit.
    TooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The compressed-flag byte is neither 0 nor 1.
    BadFlag(u8),
    /// The stream ended inside a message.
    Truncated,
    /// The connection's streams hold more bytes of unfinished messages than they may
    /// (see `flow::UNFINISHED_MESSAGES`).
    ConnectionFull {
        /// What they would hold with this stream's.
        held: usize,
        /// The bound.
        max: usize,
    },
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageError::TooLarge { len, max } => write!(
                f,
                "a message of {len} bytes exceeds the limit of {max} bytes"
            ),
            MessageError::BadFlag(flag) => {
                write!(
                    f,
                    "message prefix with compressed flag {flag} (0 or 1 expected)"
                )
            }
            MessageError::Truncated => f.write_str("the stream ended inside a message"),
            MessageError::ConnectionFull { held, max } => write!(
                f,
                "the connection's streams would hold {held} bytes of unfinished messages, \
                 more than the {max} they may"
            ),
        }
    }
}

impl MessageError {
    /// The status the call ends with.
    pub(crate) fn code(&self) -> Code {
        match self {
            MessageError::TooLarge { .. } | MessageError::ConnectionFull { .. } => {
                Code::RESOURCE_EXHAUSTED
            }
            MessageError::BadFlag(_) | MessageError::Truncated => Code::INTERNAL,
        }
    }
}

/// Rebuilds length-prefixed messages from the DATA chunks of one HTTP/2 stream.
///
/// Chunks are kept as received; a message that lies inside one chunk is sliced out of
/// it without a copy, one that spans chunks comes out as the pieces it spans. Chunks
/// under [`SMALL_CHUNK`] that follow a partly received message are copied together
/// into `tail` instead: each chunk kept holds on to the part of HTTP/2's read buffer
/// it came in, so a peer sending a message a byte per DATA frame (or small frames
/// between large ones) would otherwise make the decoder hold many times
/// the message's length, which the limits count. Past the threshold, what a chunk
/// holds is at most a few times its length.
///
/// A large message (from [`ASSEMBLE_FROM`] bytes) that spans chunks is copied into a
/// buffer of its own as its chunks come, rather than at its end: the copy reads bytes
/// just read (in the cache, not memory), overlaps with the rest of the transfer
/// instead of following it, and the read buffers are free again at once. (The links
/// copied a 16 MiB message out of its chunks once it was whole: about 15% of a bulk
/// transfer's time, all of it after the last byte.)
#[derive(Debug)]
pub(crate) struct MessageDecoder {
    chunks: VecDeque<Bytes>,
    /// Small chunks copied together, after `chunks`; moved there at [`TAIL_LEN`].
    tail: BytesMut,
    /// The large message being assembled, ahead of `chunks` and `tail` (which hold
    /// what comes after it).
    assembly: Option<Assembly>,
    /// [`ASSEMBLE_FROM`] and [`ASSEMBLE_AFTER`] (smaller in tests and fuzzing).
    assemble_from: usize,
    assemble_after: usize,
    buffered: usize,
    max: usize,
}

/// Messages from this long, spread over chunks, are assembled as they come. Shorter
/// ones are copied out of their chunks once whole, as those are still in the cache
/// then (assembled from 256 KiB, 1 MiB echoes were 5% slower; 16 MiB ones were 6%
/// faster, and 14% with the thresholds kept: `docs/performance.md`, "Session 42").
const ASSEMBLE_FROM: usize = 2 * 1024 * 1024;

/// What of such a message must have come before its buffer (its whole length) is
/// reserved: a peer announcing a large message reserves nothing with a few bytes.
/// Not more: a late start copied more out of chunks at once, and (in glibc's
/// allocator) had every 16 MiB buffer mapped afresh, at half the speed.
const ASSEMBLE_AFTER: usize = 256 * 1024;

/// A message [`MessageDecoder`] assembles as it comes.
#[derive(Debug)]
struct Assembly {
    /// Its bytes so far, in a buffer of its length.
    buf: Vec<u8>,
    /// Its length.
    len: usize,
    /// Its prefix's compressed flag.
    compressed: bool,
    /// Its buffer's share of the connection's [`Reservations`], given back when the
    /// assembly ends (the message is whole, or the call is gone).
    _lease: Lease,
}

/// The buffers a connection's decoders may reserve for assembling messages, together:
/// their lengths count from the moment they are reserved (a peer that announces large
/// messages on many streams and sends a little of each holds no more than this,
/// whatever it announced), and past the bound a message is kept in its chunks
/// instead, as a shorter one is. Shared by the decoders of one connection.
#[derive(Clone, Debug)]
pub(crate) struct Reservations {
    reserved: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    max: usize,
}

impl Reservations {
    /// A connection's, of [`flow::UNFINISHED_MESSAGES`](crate::flow::UNFINISHED_MESSAGES)
    /// times its largest message: the bound its unfinished messages' bytes have.
    pub(crate) fn new(max_message: usize) -> Reservations {
        Reservations {
            reserved: Default::default(),
            max: crate::flow::connection_bound(max_message),
        }
    }

    /// `len` bytes, if they fit under the bound.
    fn lease(&self, len: usize) -> Option<Lease> {
        use std::sync::atomic::Ordering::Relaxed;
        self.reserved
            .fetch_update(Relaxed, Relaxed, |now| {
                now.checked_add(len).filter(|&total| total <= self.max)
            })
            .ok()?;
        Some(Lease {
            reserved: std::sync::Arc::clone(&self.reserved),
            len,
        })
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A share of [`Reservations`], given back when dropped.
#[derive(Debug)]
struct Lease {
    reserved: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    len: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.reserved
            .fetch_sub(self.len, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Chunks shorter than this that continue a partly received message are copied into
/// the decoder's tail rather than kept. A peer sending in frames of 256 KiB (the
/// most the server takes) is read without a copy.
const SMALL_CHUNK: usize = 64 * 1024;

/// The tail's length at which it becomes a chunk of its own.
const TAIL_LEN: usize = 256 * 1024;

/// The message length a 5-byte prefix announces (its bytes 1 to 4, big-endian).
pub(crate) fn announced_len(prefix: &[u8]) -> usize {
    u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize
}

/// Whether `bytes` are whole messages, prefixes and all, and nothing more.
fn whole_messages(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Some(prefix) = bytes.get(at..at + PREFIX_LEN) {
        let len = announced_len(prefix);
        at = match (at + PREFIX_LEN).checked_add(len) {
            Some(end) => end,
            None => return false,
        };
    }
    at == bytes.len()
}

impl MessageDecoder {
    /// A decoder refusing messages longer than `max` bytes.
    pub(crate) fn new(max: usize) -> MessageDecoder {
        MessageDecoder {
            chunks: VecDeque::new(),
            tail: BytesMut::new(),
            assembly: None,
            assemble_from: ASSEMBLE_FROM,
            assemble_after: ASSEMBLE_AFTER,
            buffered: 0,
            max,
        }
    }

    /// A decoder that assembles messages from `from` bytes once `after` of one came.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn with_thresholds(max: usize, from: usize, after: usize) -> MessageDecoder {
        MessageDecoder {
            assemble_from: from,
            assemble_after: after,
            ..MessageDecoder::new(max)
        }
    }

    /// Adds the next chunk of the stream; a large message may reserve its buffer from
    /// `reservations` (the connection's).
    pub(crate) fn push(&mut self, mut chunk: Bytes, reservations: &Reservations) {
        if let Some(Assembly { buf, len, .. }) = &mut self.assembly {
            // The message's next bytes go into its buffer; what follows it (the next
            // message) is a chunk as any other.
            let take = (*len - buf.len()).min(chunk.len());
            buf.extend_from_slice(&chunk[..take]);
            self.buffered += take;
            chunk.advance(take);
        }
        if chunk.is_empty() {
            return;
        }
        // Bytes of a message after the assembled one (which is whole here, or the chunk
        // would be all its own).
        let assembled = self.assembly.as_ref().map_or(0, |a| a.buf.len());
        let partial = self.buffered > assembled;
        self.buffered += chunk.len();
        // A small chunk that leaves part of a message is copied, the first one too:
        // kept by reference it would hold its whole read buffer (64 KiB and more) for
        // the few bytes the limits count, on every stream a peer so starts (from a
        // review). One that ends with whole messages is read at once, as it is.
        if chunk.len() < SMALL_CHUNK && (partial || !whole_messages(&chunk)) {
            self.tail.extend_from_slice(&chunk);
            if self.tail.len() >= TAIL_LEN {
                self.chunks.push_back(self.tail.split().freeze());
            }
            self.assemble_if_large(reservations);
            return;
        }
        if !self.tail.is_empty() {
            self.chunks.push_back(self.tail.split().freeze());
        }
        self.chunks.push_back(chunk);
        self.assemble_if_large(reservations);
    }

    /// Starts assembling the first message if it is large ([`ASSEMBLE_FROM`]),
    /// well-formed and not whole, once [`ASSEMBLE_AFTER`] of it is here (the buffer
    /// reserved, its length, is within the limit): what is here is all its own, into
    /// the buffer, and the rest as it comes ([`push`](Self::push)).
    fn assemble_if_large(&mut self, reservations: &Reservations) {
        if self.assembly.is_some() || self.buffered < PREFIX_LEN + self.assemble_after {
            return;
        }
        let mut prefix = [0u8; PREFIX_LEN];
        self.peek(&mut prefix);
        let len = announced_len(&prefix);
        // A bad flag or length is left for `next` to report.
        if prefix[0] > 1 || len > self.max || len < self.assemble_from {
            return;
        }
        if self.buffered - PREFIX_LEN >= len {
            return; // whole: sliced out of its chunks as usual
        }
        // Within the connection's bound, and the memory there is: otherwise kept in
        // its chunks.
        let Some(lease) = reservations.lease(len) else {
            return;
        };
        let mut buf = Vec::new();
        if buf.try_reserve_exact(len).is_err() {
            return;
        }
        self.skip(PREFIX_LEN);
        for chunk in self.chunks.drain(..) {
            buf.extend_from_slice(&chunk);
        }
        buf.extend_from_slice(&self.tail);
        // A new tail: the old one's buffer may be shared with a chunk just dropped,
        // and would stay allocated beside the assembly's.
        self.tail = BytesMut::new();
        self.assembly = Some(Assembly {
            buf,
            len,
            compressed: prefix[0] == 1,
            _lease: lease,
        });
    }

    /// Pieces held (chunks, and the tail if it holds bytes).
    #[cfg(test)]
    pub(crate) fn pieces(&self) -> usize {
        self.chunks.len() + usize::from(!self.tail.is_empty())
    }

    /// Bytes buffered, whole messages and part of one.
    pub(crate) fn buffered(&self) -> usize {
        self.buffered
    }

    /// Whether bytes of an unfinished message are buffered.
    pub(crate) fn has_partial(&self) -> bool {
        self.buffered > 0
    }

    /// The next whole message, `Ok(None)` until one is complete.
    pub(crate) fn next(&mut self) -> Result<Option<Message>, MessageError> {
        if let Some(Assembly {
            buf,
            len,
            compressed,
            ..
        }) = &mut self.assembly
        {
            if buf.len() < *len {
                return Ok(None);
            }
            let compressed = *compressed;
            let data = Bytes::from(std::mem::take(buf));
            // The lease is given back with the assembly.
            self.assembly = None;
            self.buffered -= data.len();
            let data = MessageData {
                first: data,
                rest: Vec::new(),
                owned: true,
            };
            return Ok(Some(Message { compressed, data }));
        }
        if self.buffered < PREFIX_LEN {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        self.peek(&mut prefix);
        let compressed = match prefix[0] {
            0 => false,
            1 => true,
            flag => return Err(MessageError::BadFlag(flag)),
        };
        let len = announced_len(&prefix);
        if len > self.max {
            return Err(MessageError::TooLarge { len, max: self.max });
        }
        if self.buffered - PREFIX_LEN < len {
            return Ok(None);
        }
        self.skip(PREFIX_LEN);
        let data = self.take(len);
        Ok(Some(Message { compressed, data }))
    }

    /// Whether exactly one whole, well-formed message is buffered, and nothing else.
    pub(crate) fn holds_one_message(&self) -> bool {
        if let Some(Assembly { buf, len, .. }) = &self.assembly {
            return buf.len() == *len && self.buffered == buf.len();
        }
        if self.buffered < PREFIX_LEN {
            return false;
        }
        let mut prefix = [0u8; PREFIX_LEN];
        self.peek(&mut prefix);
        let len = announced_len(&prefix);
        prefix[0] <= 1 && len <= self.max && self.buffered - PREFIX_LEN == len
    }

    /// Whether what is buffered can still become exactly one message: nothing yet, part
    /// of a first message within the limit, or that whole message, and no byte after it.
    pub(crate) fn may_hold_one_message(&self) -> bool {
        if let Some(Assembly { buf, .. }) = &self.assembly {
            return self.buffered == buf.len();
        }
        if self.buffered < PREFIX_LEN {
            return true;
        }
        let mut prefix = [0u8; PREFIX_LEN];
        self.peek(&mut prefix);
        let len = announced_len(&prefix);
        prefix[0] <= 1 && len <= self.max && self.buffered - PREFIX_LEN <= len
    }

    /// At the end of the stream: an error if a message was cut off.
    pub(crate) fn finish(&self) -> Result<(), MessageError> {
        if self.has_partial() {
            Err(MessageError::Truncated)
        } else {
            Ok(())
        }
    }

    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for chunk in self.chunks.iter().map(|c| &c[..]).chain([&self.tail[..]]) {
            let n = chunk.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&chunk[..n]);
            filled += n;
            if filled == out.len() {
                break;
            }
        }
    }

    fn skip(&mut self, mut n: usize) {
        self.buffered -= n;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                self.tail.advance(n);
                return;
            };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.chunks.pop_front();
        }
    }

    fn take(&mut self, n: usize) -> MessageData {
        self.buffered -= n;
        let mut data = MessageData::default();
        let mut left = n;
        while left > 0 {
            let piece = match self.chunks.front_mut() {
                None => self.tail.split_to(left).freeze(),
                Some(front) if front.len() > left => front.split_to(left),
                Some(_) => self.chunks.pop_front().expect("the front chunk"),
            };
            left -= piece.len();
            if data.first.is_empty() {
                data.first = piece;
            } else {
                data.rest.push(piece);
            }
        }
        data
    }
}

/// Why a received `message` cannot be read under its call's `grpc-encoding`
/// (`encoding`): compressed with none named, or in another format; `None` if it can.
pub(crate) fn compression_refusal(
    message: &Message,
    encoding: Option<Algorithm>,
) -> Option<&'static str> {
    match (message.compressed, encoding) {
        (false, _) => None,
        (true, None) => {
            Some("compressed message with no grpc-encoding that compresses (none, or identity)")
        }
        (true, encoding) => encoding_mismatch(message, encoding),
    }
}

/// Why a compressed message cannot be read as its call's `grpc-encoding` says: its
/// bytes are of another format (a gzip message of a call that said zstd was decoded as
/// gzip all the same, by its magic number; `Algorithm::of_message`). `None` without an
/// encoding: that case has its own error on each side.
pub(crate) fn encoding_mismatch(
    message: &Message,
    encoding: Option<Algorithm>,
) -> Option<&'static str> {
    let encoding = encoding?;
    let (head, n) = message.data.head::<4>();
    (Algorithm::of_message(&head[..n]) != Some(encoding))
        .then_some("compressed message not in its grpc-encoding's format")
}

/// The frame the core hands a link to send (its header; the payload travels apart),
/// decoded so the link can map it to HTTP/2. The core's own frames: no limits apply.
pub(crate) fn core_frame(header: &[u8]) -> Result<rpc_core::frame::Frame, rpc_core::Error> {
    let limits = rpc_core::frame::DecodeLimits {
        max_metadata_len: usize::MAX,
    };
    rpc_core::frame::Frame::decode(Bytes::copy_from_slice(header), &limits).map_err(|err| {
        rpc_core::Error::new(
            rpc_core::ErrorKind::Protocol,
            format!("gRPC link: the core sent a frame it cannot map: {err}"),
        )
    })
}

/// A message's chunks to send, in order: `first`, then `rest`.
pub(crate) struct Chunks {
    pub(crate) first: Bytes,
    /// Empty (no allocation) for a small message.
    pub(crate) rest: Vec<Bytes>,
}

impl IntoIterator for Chunks {
    type Item = Bytes;
    type IntoIter = std::iter::Chain<std::iter::Once<Bytes>, std::vec::IntoIter<Bytes>>;

    fn into_iter(self) -> Self::IntoIter {
        std::iter::once(self.first).chain(self.rest)
    }
}

/// `message` behind its 5-byte prefix, as the chunks to send: one buffer for a small
/// message, the prefix and the message's own segments otherwise.
pub(crate) fn encode_message(message: &Payload, compressed: bool) -> Chunks {
    let len = message.len();
    let coalesce = len < COALESCE_BELOW;
    let mut prefix = BytesMut::with_capacity(PREFIX_LEN + if coalesce { len } else { 0 });
    prefix.put_u8(u8::from(compressed));
    prefix.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    if coalesce {
        for segment in message.segments() {
            prefix.put_slice(segment);
        }
        return Chunks {
            first: prefix.freeze(),
            rest: Vec::new(),
        };
    }
    Chunks {
        first: prefix.freeze(),
        rest: message
            .segments()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect(),
    }
}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`,
/// `m`, `u`, `n`).
pub(crate) fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Formats a `grpc-timeout` value: the finest unit whose count fits in 8 digits,
/// rounded up so the server never sees less time than the caller has. A budget over
/// 99,999,999 hours is sent as that.
pub(crate) fn format_timeout(timeout: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = timeout.as_nanos();
    for (unit, per) in [
        ('n', 1u128),
        ('u', 1_000),
        ('m', 1_000_000),
        ('S', 1_000_000_000),
        ('M', 60_000_000_000),
        ('H', 3_600_000_000_000),
    ] {
        let count = nanos.div_ceil(per);
        if count <= MAX {
            return format!("{count}{unit}");
        }
    }
    format!("{MAX}H")
}

/// Percent-encodes a status message for `grpc-message`: bytes outside printable
/// ASCII, and `%` itself, become `%XX`; so does a space at either end, which RFC 9113
/// §8.2.1 makes a malformed field value for strict peers (nghttp2's, and so proxies
/// built on it). gRPC's decoders take any `%XX`.
pub(crate) fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let last = message.len().wrapping_sub(1);
    for (i, &b) in message.as_bytes().iter().enumerate() {
        let edge = b == b' ' && (i == 0 || i == last);
        if (0x20..=0x7e).contains(&b) && b != b'%' && !edge {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// [`percent_encode`] of `message`, or, if that is longer than `max` bytes, of as much
/// of it as fits (cut at a character) with `…` after it.
pub(crate) fn percent_encode_within(message: &str, max: usize) -> String {
    let encoded = percent_encode(message);
    if encoded.len() <= max {
        return encoded;
    }
    const ELLIPSIS: &str = "\u{2026}";
    // Three bytes of `%XX` for each byte of the ellipsis.
    let room = max.saturating_sub(3 * ELLIPSIS.len());
    let mut used = 0;
    let mut end = 0;
    for (i, c) in message.char_indices() {
        let cost = if c.is_ascii() && (' '..='~').contains(&c) && c != '%' && !(i == 0 && c == ' ')
        {
            1
        } else {
            3 * c.len_utf8()
        };
        if used + cost > room {
            break;
        }
        used += cost;
        end = i + c.len_utf8();
    }
    let mut cut = message[..end].to_owned();
    cut.push_str(ELLIPSIS);
    percent_encode(&cut)
}

/// Decodes a `grpc-message` value. A `%` not followed by two hex digits is kept as
/// it is (as the gRPC specification asks); bytes that are not UTF-8 afterwards are
/// replaced.
pub(crate) fn percent_decode(value: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%' && i + 2 < value.len() {
            if let (Some(hi), Some(lo)) = (hex(value[i + 1]), hex(value[i + 2])) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(value[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 without padding, as gRPC asks senders to write `-bin` values.
pub(crate) fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(BASE64[(n >> (18 - 6 * i) & 0x3f) as usize]));
        }
    }
    out
}

/// Standard base64, padded or not (gRPC receivers must take both). `None` for any
/// other byte or an impossible length.
pub(crate) fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let text = text
        .strip_suffix(b"==")
        .or_else(|| text.strip_suffix(b"="))
        .unwrap_or(text);
    if text.len() % 4 == 1 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// The status a gRPC client reports for a response without `grpc-status` whose HTTP
/// status is not 200 (the mapping of gRPC's `http-grpc-status-mapping.md`).
pub(crate) fn code_for_http_status(status: u16) -> Code {
    match status {
        400 => Code::INTERNAL,
        401 => Code::UNAUTHENTICATED,
        403 => Code::PERMISSION_DENIED,
        404 => Code::UNIMPLEMENTED,
        429 | 502 | 503 | 504 => Code::UNAVAILABLE,
        _ => Code::UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reservations without a practical bound.
    fn room() -> Reservations {
        Reservations::new(1 << 40)
    }

    fn framed(flag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn messages_are_rebuilt_across_any_chunking() {
        let mut wire = framed(0, b"hello");
        wire.extend(framed(1, b""));
        wire.extend(framed(0, &[7; 300]));
        for split in 1..wire.len() {
            let mut decoder = MessageDecoder::new(1024);
            let mut got = Vec::new();
            for chunk in wire.chunks(split) {
                decoder.push(Bytes::copy_from_slice(chunk), &room());
                while let Some(m) = decoder.next().unwrap() {
                    got.push(m);
                }
            }
            assert!(decoder.finish().is_ok());
            assert_eq!(got.len(), 3, "split {split}");
            assert_eq!(got[0].data, &b"hello"[..]);
            assert!(got[1].compressed && got[1].data.is_empty());
            assert_eq!(got[2].data, &[7u8; 300][..]);
        }
    }

    /// Chunks of every size, small ones coalesced and large ones kept, come out in
    /// order.
    #[test]
    fn small_and_large_chunks_mixed_keep_their_order() {
        let body: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut wire = framed(0, &body[..5_000]);
        wire.extend(framed(0, b"x"));
        wire.extend(framed(0, &body));
        for seed in 1..50u32 {
            let mut decoder = MessageDecoder::new(1 << 20);
            let mut got = Vec::new();
            let (mut at, mut x) = (0, seed);
            while at < wire.len() {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let len = match x % 3 {
                    0 => 1 + (x >> 8) as usize % 8,
                    1 => 1 + (x >> 8) as usize % 1_500,
                    _ => 1_000 + (x >> 8) as usize % 4_000,
                }
                .min(wire.len() - at);
                decoder.push(Bytes::copy_from_slice(&wire[at..at + len]), &room());
                at += len;
                while let Some(m) = decoder.next().unwrap() {
                    let mut data = m.data.first.to_vec();
                    for piece in &m.data.rest {
                        data.extend_from_slice(piece);
                    }
                    got.push(data);
                }
            }
            assert!(decoder.finish().is_ok());
            assert_eq!(got, [&body[..5_000], b"x", &body[..]], "seed {seed}");
        }
    }

    /// Large messages (from ASSEMBLE_FROM) spread over chunks of every size come out
    /// whole, in a buffer of their own, in order with the small ones around them,
    /// whether or not `next` is called between chunks; the one-message checks see them
    /// as they grow.
    #[test]
    fn large_messages_are_assembled_as_they_come() {
        let large: Vec<u8> = (0..(ASSEMBLE_FROM as u32 * 2 + 17))
            .map(|i| (i * 31 + i / 257) as u8)
            .collect();
        let mut wire = framed(0, b"before");
        wire.extend(framed(1, &large));
        wire.extend(framed(0, b"after"));
        wire.extend(framed(0, &large[..ASSEMBLE_FROM]));
        for seed in 1..8u32 {
            let mut decoder = MessageDecoder::new(8 << 20);
            let mut got = Vec::new();
            let (mut at, mut x) = (0, seed);
            let lazy = seed % 2 == 0; // `next` only at the end
            while at < wire.len() {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let len = match x % 3 {
                    0 => 1 + (x >> 8) as usize % 300,
                    1 => 1 + (x >> 8) as usize % 20_000,
                    _ => 60_000 + (x >> 8) as usize % 600_000,
                }
                .min(wire.len() - at);
                decoder.push(Bytes::copy_from_slice(&wire[at..at + len]), &room());
                at += len;
                if !lazy {
                    while let Some(m) = decoder.next().unwrap() {
                        got.push(m);
                    }
                }
            }
            while let Some(m) = decoder.next().unwrap() {
                got.push(m);
            }
            assert!(decoder.finish().is_ok());
            assert_eq!(got.len(), 4, "seed {seed}");
            assert_eq!(got[0].data, &b"before"[..]);
            assert!(got[1].compressed, "seed {seed}");
            assert_eq!(got[1].data, &large[..], "seed {seed}");
            assert_eq!(got[2].data, &b"after"[..]);
            assert_eq!(got[3].data, &large[..ASSEMBLE_FROM], "seed {seed}");
        }
        // One large message alone: held in its own buffer as it comes (no chunks kept),
        // one message throughout, whole at the end, handed over without a copy.
        let wire = framed(0, &large);
        let mut decoder = MessageDecoder::new(8 << 20);
        for chunk in wire.chunks(16 * 1024) {
            assert!(!decoder.holds_one_message());
            decoder.push(Bytes::copy_from_slice(chunk), &room());
            assert!(decoder.may_hold_one_message());
            if decoder.buffered() > ASSEMBLE_AFTER + PREFIX_LEN {
                assert_eq!(decoder.pieces(), 0, "chunks copied as they come");
            }
        }
        assert!(decoder.holds_one_message());
        assert_eq!(decoder.buffered(), large.len());
        let message = decoder.next().unwrap().unwrap();
        let bytes = message.data.to_bytes();
        assert_eq!(
            bytes.as_ptr(),
            message.data.first.as_ptr(),
            "no second copy"
        );
        assert_eq!(&bytes[..], &large[..]);
        assert!(!decoder.has_partial());
        // Bytes past the message make it no longer one message.
        let mut decoder = MessageDecoder::new(8 << 20);
        let mut wire = framed(0, &large);
        wire.extend(framed(0, b"x"));
        for chunk in wire.chunks(100_000) {
            decoder.push(Bytes::copy_from_slice(chunk), &room());
        }
        assert!(!decoder.may_hold_one_message());
        assert!(!decoder.holds_one_message());
    }

    /// The buffers a connection's decoders reserve are bounded together (a peer that
    /// announces large messages on many streams and sends a little of each reserves
    /// no more than the bound, whatever it announced): past it, a message stays in
    /// its chunks and still comes out whole; a call dropped mid-message gives its
    /// reservation back.
    #[test]
    fn reservations_are_bounded_per_connection_and_given_back() {
        // Messages of 1,000 bytes, assembled once 100 came; room for two at once.
        let reservations = Reservations::new(500);
        assert_eq!(reservations.max, 2_000);
        let body: Vec<u8> = (0..1_000u32).map(|i| i as u8).collect();
        let wire = framed(0, &body);
        let mut decoders: Vec<MessageDecoder> = (0..5)
            .map(|_| MessageDecoder::with_thresholds(1_000, 1_000, 100))
            .collect();
        for decoder in &mut decoders {
            decoder.push(Bytes::copy_from_slice(&wire[..300]), &reservations);
        }
        assert_eq!(reservations.reserved(), 2_000, "two assemblies, no more");
        assert_eq!(decoders.iter().filter(|d| d.pieces() == 0).count(), 2);
        // A call gone mid-message: its share back; the next large message takes it.
        decoders.remove(0);
        assert_eq!(reservations.reserved(), 1_000);
        let mut late = MessageDecoder::with_thresholds(1_000, 1_000, 100);
        late.push(Bytes::copy_from_slice(&wire[..300]), &reservations);
        assert_eq!(reservations.reserved(), 2_000);
        decoders.push(late);
        // Every one completes, assembled or in chunks; the reservations end with them.
        for decoder in &mut decoders {
            decoder.push(Bytes::copy_from_slice(&wire[300..]), &reservations);
            let message = decoder.next().unwrap().expect("whole");
            assert_eq!(message.data, &body[..]);
            assert!(!decoder.has_partial());
        }
        assert_eq!(reservations.reserved(), 0);
    }

    /// A message sent a byte per DATA frame is held in a few pieces, not a handle per
    /// byte. (From a review: a 16 MiB message in 1-byte frames made the decoder keep
    /// 16 million handles, each holding part of HTTP/2's read buffer.)
    #[test]
    fn a_message_in_one_byte_chunks_is_held_in_few_pieces() {
        let body = vec![5u8; 1 << 20];
        let wire = framed(0, &body);
        let mut decoder = MessageDecoder::new(2 << 20);
        let mut most = 0;
        let mut got = None;
        for byte in &wire {
            decoder.push(Bytes::copy_from_slice(std::slice::from_ref(byte)), &room());
            most = most.max(decoder.pieces());
            if let Some(m) = decoder.next().unwrap() {
                got = Some(m);
            }
        }
        assert!(most <= 2 + (1 << 20) / TAIL_LEN, "{most} pieces held");
        let m = got.expect("the message");
        assert_eq!(
            m.data.first.len() + m.data.rest.iter().map(Bytes::len).sum::<usize>(),
            1 << 20
        );
    }

    /// The chunk that ends an assembled message and holds whole messages after it
    /// is kept by reference, as such a chunk is anywhere else: the assembled bytes
    /// are not a message begun and left partial.
    #[test]
    fn whole_messages_after_an_assembled_one_are_not_copied() {
        let mut decoder = MessageDecoder::with_thresholds(1 << 20, 64, 16);
        let mut first = vec![0, 0, 0, 0, 100];
        first.extend_from_slice(&[1; 30]);
        decoder.push(Bytes::from(first), &room());
        assert!(
            decoder.assembly.is_some(),
            "assembling the 100-byte message"
        );
        let mut rest = vec![2; 70];
        rest.extend_from_slice(&[0, 0, 0, 0, 2, 7, 7]);
        let rest = Bytes::from(rest);
        decoder.push(rest.clone(), &room());
        assert!(!rest.is_unique(), "the whole message after it was copied");
        assert_eq!(decoder.next().unwrap().unwrap().data.len(), 100);
        assert_eq!(decoder.next().unwrap().unwrap().data.len(), 2);
        assert!(decoder.next().unwrap().is_none());
        assert!(!decoder.has_partial());
    }

    /// A small chunk that starts a message without ending it is copied: it does not
    /// keep its read buffer alive. Whole messages in a chunk are taken as they are
    /// (read at once), and a large chunk is kept, not copied.
    #[test]
    fn a_small_partial_chunk_does_not_hold_its_read_buffer() {
        let read_buffer = Bytes::from(vec![0u8; 64 * 1024]);
        let mut decoder = MessageDecoder::new(1 << 20);
        // A prefix announcing 10 bytes, and one of them.
        let head = {
            let mut b = BytesMut::from(&read_buffer[..]);
            b[..6].copy_from_slice(&[0, 0, 0, 0, 10, 1]);
            b.freeze()
        };
        decoder.push(head.slice(0..6), &room());
        assert!(
            head.is_unique(),
            "a 6-byte partial chunk holds its read buffer"
        );
        decoder.push(Bytes::from_static(&[2; 9]), &room());
        let message = decoder.next().unwrap().expect("the message");
        assert_eq!(message.data.len(), 10);
        // Whole messages: kept by reference until read.
        let whole = Bytes::from(vec![0, 0, 0, 0, 2, 7, 7, 0, 0, 0, 0, 1, 9]);
        assert!(whole_messages(&whole));
        assert!(!whole_messages(&whole[..12]));
        assert!(!whole_messages(&[0, 0xff, 0xff, 0xff]));
        decoder.push(whole.slice(..), &room());
        assert!(!whole.is_unique());
        assert_eq!(decoder.next().unwrap().unwrap().data.len(), 2);
        assert_eq!(decoder.next().unwrap().unwrap().data.len(), 1);
        assert!(decoder.next().unwrap().is_none());
    }

    #[test]
    fn a_length_over_the_limit_is_refused_from_the_prefix_alone() {
        let mut decoder = MessageDecoder::new(10);
        decoder.push(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]), &room());
        assert_eq!(
            decoder.next(),
            Err(MessageError::TooLarge {
                len: u32::MAX as usize,
                max: 10
            })
        );
        let mut decoder = MessageDecoder::new(10);
        decoder.push(Bytes::from_static(&[2, 0, 0, 0, 0]), &room());
        assert_eq!(decoder.next(), Err(MessageError::BadFlag(2)));
        let mut decoder = MessageDecoder::new(10);
        decoder.push(Bytes::from_static(&[0, 0, 0, 0, 3, 1]), &room());
        assert_eq!(decoder.next(), Ok(None));
        assert_eq!(decoder.finish(), Err(MessageError::Truncated));
    }

    #[test]
    fn encoded_messages_decode_back() {
        let big = Bytes::from(vec![1u8; COALESCE_BELOW + 1]);
        for body in [Bytes::from_static(b"abc"), big] {
            let chunks = encode_message(&Payload::from(body.clone()), false);
            let mut decoder = MessageDecoder::new(usize::MAX);
            chunks.into_iter().for_each(|c| decoder.push(c, &room()));
            assert_eq!(decoder.next().unwrap().unwrap().data, body);
        }
    }

    #[test]
    fn timeouts_round_trip_without_losing_time() {
        for (text, d) in [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("3S", Duration::from_secs(3)),
            ("250m", Duration::from_millis(250)),
            ("7u", Duration::from_micros(7)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ] {
            assert_eq!(parse_timeout(text.as_bytes()), Some(d), "{text}");
        }
        for bad in ["", "S", "123456789S", "12x", "-1S", "1.5S"] {
            assert_eq!(parse_timeout(bad.as_bytes()), None, "{bad}");
        }
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(250),
            Duration::from_secs(5),
            Duration::from_secs(86_400 * 365),
            Duration::from_nanos(123_456_789_123),
        ] {
            let text = format_timeout(d);
            let back = parse_timeout(text.as_bytes()).unwrap();
            assert!(back >= d, "{d:?} -> {text}");
        }
        assert_eq!(format_timeout(Duration::from_millis(250)), "250000u");
        assert_eq!(format_timeout(Duration::MAX), "99999999H");
    }

    #[test]
    fn status_messages_are_percent_encoded() {
        let message = "héllo 100%\n\u{1F600}";
        let encoded = percent_encode(message);
        assert!(encoded.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        assert_eq!(encoded, "h%C3%A9llo 100%25%0A%F0%9F%98%80");
        assert_eq!(percent_decode(encoded.as_bytes()), message);
        // A space at either end is escaped (RFC 9113 §8.2.1), one inside is not.
        assert_eq!(percent_encode(" a b "), "%20a b%20");
        assert_eq!(percent_encode(" "), "%20");
        assert_eq!(percent_decode(b"%20a b%20"), " a b ");
        // Malformed escapes stay as they are.
        assert_eq!(percent_decode(b"50% off %4"), "50% off %4");
        assert_eq!(percent_decode(b"%zz%"), "%zz%");
    }

    #[test]
    fn base64_round_trips_padded_or_not() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0, 255, 128],
        ] {
            let text = base64_encode(data);
            assert!(!text.contains('='));
            assert_eq!(base64_decode(text.as_bytes()).as_deref(), Some(data));
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_decode(b"Zm8=").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64_decode(b"Zg==").as_deref(), Some(&b"f"[..]));
        assert_eq!(base64_decode(b"Z"), None);
        assert_eq!(base64_decode(b"Zm9v!"), None);
    }
}

/// The frames a link has for the core, in order: encoded ones, and the REQUESTs and
/// RESPONSEs it builds itself, which the core takes unencoded
/// ([`Received::Frame`]), and the memory they hold.
#[derive(Default)]
pub(crate) struct ForCore {
    /// Each frame with what it counts for in `bytes`.
    frames: VecDeque<(Received, usize)>,
    /// The frames' encoded length, and for a frame held decoded
    /// [`METADATA_ENTRY_COST`](rpc_core::frame::METADATA_ENTRY_COST) per metadata entry
    /// more (an entry's key and value held apart, where its encoding is a few bytes):
    /// what the server link's hold on new calls bounds.
    pub(crate) bytes: usize,
}

impl ForCore {
    fn push(&mut self, frame: Received, counts: usize, front: bool) {
        self.bytes += counts;
        if front {
            self.frames.push_front((frame, counts));
        } else {
            self.frames.push_back((frame, counts));
        }
    }

    /// Queues an encoded frame.
    pub(crate) fn push_back(&mut self, frame: Bytes) {
        let counts = frame.len();
        self.push(Received::Bytes(frame), counts, false);
    }

    /// Queues an encoded frame ahead of the others.
    pub(crate) fn push_front(&mut self, frame: Bytes) {
        let counts = frame.len();
        self.push(Received::Bytes(frame), counts, true);
    }

    /// Queues a frame built here, held decoded (a REQUEST, a RESPONSE, the DATA of an
    /// assembled message).
    pub(crate) fn push_frame(&mut self, frame: Frame) {
        let (len, entries) = match &frame {
            Frame::Request(request) => (request.encoded_len(), request.metadata.len()),
            Frame::Response(response) => (response.encoded_len(), response.metadata.len()),
            // A message without headers: its header and its bytes.
            Frame::Data(data) if data.metadata.is_none() => {
                let message = data.message.as_ref().map_or(0, Bytes::len);
                (rpc_core::frame::HEADER_LEN + message, 0)
            }
            other => (other.encode().len(), 0),
        };
        let counts = len + entries * rpc_core::frame::METADATA_ENTRY_COST;
        let frame = Received::Frame {
            frame: Box::new(frame),
            len,
        };
        self.push(frame, counts, false);
    }

    /// Queues a message of stream `id` as the core's DATA frame: one assembled in a
    /// buffer of its own goes as it is (decoded), any other is copied once behind an
    /// encoded frame header.
    pub(crate) fn push_message(&mut self, id: u64, message: Message) {
        if message.data.is_owned() {
            self.push_frame(Frame::Data(rpc_core::frame::DataFrame {
                id,
                end_stream: false,
                metadata: None,
                message: Some(message.data.to_bytes()),
                compressed: message.compressed,
            }));
            return;
        }
        let flags = if message.compressed {
            rpc_core::frame::FLAG_COMPRESSED
        } else {
            0
        };
        let mut buf = BytesMut::with_capacity(rpc_core::frame::HEADER_LEN + message.data.len());
        rpc_core::frame::encode_data_header(&mut buf, id, flags, None);
        message.data.copy_to(&mut buf);
        self.push_back(buf.freeze());
    }

    /// Queues the news that the peer refused call `id` unprocessed.
    pub(crate) fn push_refused(&mut self, id: u64, message: String) {
        let counts = refused_response(id, message.clone()).encoded_len();
        self.push(Received::Refused { id, message }, counts, false);
    }

    /// Queues the news that the link ended call `id` with a status of `code` (a
    /// request it could not hand over): the core stops its handler as for a CANCEL.
    pub(crate) fn push_stopped(&mut self, id: u64, code: rpc_core::Code) {
        self.push(
            Received::Stopped { id, code },
            rpc_core::frame::HEADER_LEN,
            false,
        );
    }

    /// The next frame.
    pub(crate) fn pop_front(&mut self) -> Option<Received> {
        let (frame, counts) = self.frames.pop_front()?;
        self.bytes -= counts;
        Some(frame)
    }

    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// The RESPONSE a [`Received::Refused`] stands for in bytes (a rare path).
fn refused_response(id: u64, message: String) -> rpc_core::frame::ResponseFrame {
    rpc_core::frame::ResponseFrame {
        id,
        code: Code::UNAVAILABLE,
        message: message.into(),
        details: Bytes::new(),
        metadata: rpc_core::Metadata::new(),
        compressed: false,
        payload: Bytes::new(),
    }
}

/// A frame for [`Link::poll_recv`](rpc_core::link::Link::poll_recv), which hands out
/// bytes: a frame built here is encoded, and a refused call becomes its RESPONSE
/// (`UNAVAILABLE`; bytes cannot say that it was not processed).
pub(crate) fn encoded(received: Received) -> Bytes {
    match received {
        Received::Bytes(bytes) => bytes,
        Received::Frame { frame, .. } => frame.encode().freeze(),
        Received::Refused { id, message } => Frame::Response(refused_response(id, message))
            .encode()
            .freeze(),
        // Bytes cannot carry the code: a CANCEL.
        Received::Stopped { id, .. } => {
            let mut buf = BytesMut::with_capacity(rpc_core::frame::HEADER_LEN);
            rpc_core::frame::encode_cancel(&mut buf, id);
            buf.freeze()
        }
    }
}
