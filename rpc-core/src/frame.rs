//! Frames and their codec, sans-IO.
//!
//! A frame is one message of the protocol: a 12-byte common header (version, kind,
//! flags, id) and a kind-specific part. Transports deliver whole frames (TCP rebuilds
//! them with a length prefix, datagram transports get them for free), so this module
//! never sees a partial frame. `docs/wire.md` is the specification; this module is its
//! implementation and the two must agree.
//!
//! Encoding writes every header field into a caller-supplied buffer and leaves the
//! payload as a separate [`Bytes`] so that large payloads are never copied.
//! Decoding takes a whole received frame as [`Bytes`], checks every length against
//! what is there before it touches or allocates anything, and hands out the method,
//! metadata and payload as slices of that buffer (no copies).

use std::{fmt, time::Duration};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::{
    bytestr::ByteStr,
    metadata::{is_binary_key, validate_key, Metadata, MetadataValue},
    status::{Code, Status},
};

/// The protocol version this implementation speaks, carried in every frame's first byte.
pub const VERSION: u8 = 1;

/// Size of the common header that starts every frame.
pub const HEADER_LEN: usize = 12;

/// Default bound on a frame's metadata block: gRPC's servers accept 8 KiB of headers by
/// default; twice that leaves room for tracing and auth headers without inviting floods.
pub const DEFAULT_MAX_METADATA_LEN: usize = 16 * 1024;

/// What one metadata entry counts against the entry limit of a block: a block of at
/// most `max_metadata_len` bytes holds at most `max_metadata_len / 32` entries (512 by
/// default), and never fewer than [`MIN_METADATA_ENTRIES`]. HTTP/2 counts 32 bytes per
/// header the same way. An entry costs the receiver some 80 bytes decoded whatever its
/// size: without the bound, a 16 KiB block of empty one-letter entries (2,730) took
/// 200 KiB.
pub const METADATA_ENTRY_COST: usize = 32;

/// Whether `metadata` fits a block a receiver takes under `max_metadata_len`: its
/// encoded size and its number of entries ([`max_metadata_entries`]). Senders check it,
/// so that a call over the limits fails alone instead of the receiver closing the
/// connection.
pub fn metadata_fits(metadata: &Metadata, max_metadata_len: usize) -> bool {
    metadata.len() <= max_metadata_entries(max_metadata_len)
        && metadata_encoded_len(metadata) <= max_metadata_len
}

/// The fewest entries a metadata block may hold, however small `max_metadata_len` is.
pub const MIN_METADATA_ENTRIES: usize = 64;

/// The most entries a metadata block may hold under `max_metadata_len`
/// ([`METADATA_ENTRY_COST`]).
pub const fn max_metadata_entries(max_metadata_len: usize) -> usize {
    let entries = max_metadata_len / METADATA_ENTRY_COST;
    if entries < MIN_METADATA_ENTRIES {
        MIN_METADATA_ENTRIES
    } else {
        entries
    }
}

/// Longest GOAWAY reason a sender writes; longer reasons are cut (at a char boundary).
pub const MAX_GOAWAY_REASON_LEN: usize = 1024;

/// The least time budget a request goes out with: `timeout_us` counts whole
/// microseconds (`docs/wire.md` §2.3 and §6.6), and 0 means a deadline already passed,
/// so a call with less left is failed before it is sent.
pub(crate) const MIN_WIRE_TIMEOUT: Duration = Duration::from_micros(1);

/// Most payload bytes a PING (and so its PONG) may carry: a PING is answered with its
/// own bytes, and a peer that sends frame-sized PINGs without reading would make the
/// receiver hold a frame-sized answer each. A larger PING or PONG is refused
/// ([`FrameError::PingTooLarge`]).
pub const MAX_PING_PAYLOAD: usize = 1024;

/// Request flag: the frame carries a time budget.
pub const FLAG_HAS_TIMEOUT: u16 = 0x0001;

/// Request flag: the frame carries a [`CallKey`] (28 bytes after the timeout).
pub const FLAG_HAS_CALL_KEY: u16 = 0x0002;

/// Request flag: the call is a stream; its messages follow in DATA frames and the
/// REQUEST's own payload is empty.
pub const FLAG_STREAMING: u16 = 0x0004;

/// REQUEST, RESPONSE and DATA flag: the payload is compressed (zstd).
pub const FLAG_COMPRESSED: u16 = 0x0008;

/// DATA flag: the sender's last frame on this stream (the client's half-close).
pub const FLAG_END_STREAM: u16 = 0x0001;

/// DATA flag: a metadata block comes before the payload (the server's response
/// headers, on its first DATA frame of a stream).
pub const FLAG_HAS_METADATA: u16 = 0x0002;

/// DATA flag: the frame carries no message (its payload is empty and is not a message).
pub const FLAG_NO_MESSAGE: u16 = 0x0004;

/// Credit each side of a stream starts with, per direction, in message bytes: a sender
/// may send a DATA message while its credit for the stream is above zero. Receivers
/// that want larger windows send WINDOW frames as soon as the stream opens.
pub const INITIAL_STREAM_WINDOW: u32 = 64 * 1024;

/// Size of an encoded [`CallKey`].
pub const CALL_KEY_LEN: usize = 16 + 8 + 4;

/// A client id unlikely to collide with any other: hashed from the time, the process
/// id, a process-wide counter and the standard library's random hasher keys.
pub fn random_client_id() -> u128 {
    use std::{
        hash::{BuildHasher, Hasher},
        sync::atomic::{AtomicU64, Ordering},
    };
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        h.finish()
    };
    (u128::from(word()) << 64) | u128::from(word())
}

/// Identifies one logical call across its attempts, for the server's duplicate cache:
/// `client` is fixed for the client's lifetime (it survives reconnects), `call`
/// increases with every new call of that client, `attempt` counts from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    /// The client's id.
    pub client: u128,
    /// The call's number, increasing per client.
    pub call: u64,
    /// 1 for the first attempt, 2 for the first retry, ...
    pub attempt: u32,
}

/// A frame kind (the second byte of every frame).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FrameKind(pub u8);

impl FrameKind {
    /// A call from client to server.
    pub const REQUEST: FrameKind = FrameKind(1);
    /// The outcome of a call, from server to client.
    pub const RESPONSE: FrameKind = FrameKind(2);
    /// The client no longer wants the answer to a call.
    pub const CANCEL: FrameKind = FrameKind(3);
    /// The sender accepts no new calls on this connection.
    pub const GOAWAY: FrameKind = FrameKind(4);
    /// Liveness probe; the receiver answers with PONG.
    pub const PING: FrameKind = FrameKind(5);
    /// Answer to PING.
    pub const PONG: FrameKind = FrameKind(6);
    /// One message of a stream, and the client's half-close.
    pub const DATA: FrameKind = FrameKind(7);
    /// More credit for a stream's sender.
    pub const WINDOW: FrameKind = FrameKind(8);
    /// A read or write of a buffer the receiver exposed (either direction).
    pub const BULK: FrameKind = FrameKind(9);
    /// The answer to a BULK frame.
    pub const BULK_REPLY: FrameKind = FrameKind(10);
}

/// BULK flag: the operation writes (its payload is the data); without it, it reads.
pub const FLAG_BULK_WRITE: u16 = 0x0001;

/// Why a connection is closed, carried in GOAWAY. Open like [`Code`]: unknown values
/// round-trip.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GoAwayCode(pub u32);

impl GoAwayCode {
    /// Graceful: shutdown, idle timeout, or a plain close.
    pub const NO_ERROR: GoAwayCode = GoAwayCode(0);
    /// The peer broke the protocol (malformed frame, unexpected kind, bad flags).
    pub const PROTOCOL_ERROR: GoAwayCode = GoAwayCode(1);
    /// The peer sent a frame larger than the receiver's maximum.
    pub const FRAME_TOO_LARGE: GoAwayCode = GoAwayCode(2);
    /// The peer's frames carry a version the receiver does not speak.
    pub const UNSUPPORTED_VERSION: GoAwayCode = GoAwayCode(3);
    /// The receiver failed internally.
    pub const INTERNAL_ERROR: GoAwayCode = GoAwayCode(4);
    /// The server is at its connection limit.
    pub const TOO_MANY_CONNECTIONS: GoAwayCode = GoAwayCode(5);
    /// The peer sent PINGs more often than the receiver tolerates (a server's
    /// `keepalive_min_interval`; gRPC's `ENHANCE_YOUR_CALM` "too_many_pings").
    pub const TOO_MANY_PINGS: GoAwayCode = GoAwayCode(6);

    fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "NO_ERROR",
            1 => "PROTOCOL_ERROR",
            2 => "FRAME_TOO_LARGE",
            3 => "UNSUPPORTED_VERSION",
            4 => "INTERNAL_ERROR",
            5 => "TOO_MANY_CONNECTIONS",
            6 => "TOO_MANY_PINGS",
            _ => return None,
        })
    }
}

impl fmt::Debug for GoAwayCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "GoAwayCode({})", self.0),
        }
    }
}

/// The code's name, or `CODE_<n>` for a code this version does not know (as an
/// unknown status code prints).
impl fmt::Display for GoAwayCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "CODE_{}", self.0),
        }
    }
}

/// A REQUEST frame.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestFrame {
    /// Call id, unique among the calls in flight on the connection.
    pub id: u64,
    /// `package.Service/Method`.
    pub method: ByteStr,
    /// The caller's remaining time budget, if it has a deadline (microsecond precision
    /// on the wire).
    pub timeout: Option<Duration>,
    /// The call's identity across attempts, if the client sends one.
    pub call_key: Option<CallKey>,
    /// Request metadata.
    pub metadata: Metadata,
    /// The call is a stream (`FLAG_STREAMING`): messages come in DATA frames.
    pub streaming: bool,
    /// The payload is compressed (`FLAG_COMPRESSED`).
    pub compressed: bool,
    /// The encoded request message (empty for a stream).
    pub payload: Bytes,
}

/// A DATA frame: one message of a stream, or only headers, or the client's
/// half-close.
#[derive(Clone, Debug, PartialEq)]
pub struct DataFrame {
    /// The stream (the id of the call's REQUEST).
    pub id: u64,
    /// The sender's last frame on the stream (`FLAG_END_STREAM`).
    pub end_stream: bool,
    /// The server's response headers (`FLAG_HAS_METADATA`).
    pub metadata: Option<Metadata>,
    /// The message, unless `FLAG_NO_MESSAGE`.
    pub message: Option<Bytes>,
    /// The message is compressed (`FLAG_COMPRESSED`).
    pub compressed: bool,
}

/// A RESPONSE frame.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseFrame {
    /// The id of the call this answers.
    pub id: u64,
    /// `OK` with a payload, or an error status (the payload is then empty).
    pub code: Code,
    /// Status message (UTF-8, empty on success).
    pub message: ByteStr,
    /// Status details (opaque bytes).
    pub details: Bytes,
    /// Response metadata (for a stream: its trailers).
    pub metadata: Metadata,
    /// The payload is compressed (`FLAG_COMPRESSED`).
    pub compressed: bool,
    /// The encoded response message (empty for a stream and on error).
    pub payload: Bytes,
}

impl RequestFrame {
    /// The length of this frame's encoding, header and payload.
    pub fn encoded_len(&self) -> usize {
        request_header_len(&self.method, self.call_key.is_some(), &self.metadata)
            + self.payload.len()
    }
}

impl ResponseFrame {
    /// The length of this frame's encoding, header and payload.
    pub fn encoded_len(&self) -> usize {
        response_header_len(&self.message, &self.details, &self.metadata) + self.payload.len()
    }

    /// Turns a non-OK response into its [`Status`]; `Ok` carries metadata and payload.
    pub fn into_result(self) -> Result<(Metadata, Bytes), Status> {
        if self.code == Code::OK {
            Ok((self.metadata, self.payload))
        } else {
            Err(Status::new(self.code, self.message.as_str())
                .with_details(self.details)
                .with_metadata(self.metadata))
        }
    }
}

/// A GOAWAY frame.
#[derive(Clone, Debug, PartialEq)]
pub struct GoAwayFrame {
    /// The highest request id the sender has received and will answer (0 if none).
    pub last_id: u64,
    /// Why.
    pub code: GoAwayCode,
    /// Human-readable reason (UTF-8).
    pub reason: ByteStr,
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// A call.
    Request(RequestFrame),
    /// A call's outcome.
    Response(ResponseFrame),
    /// Cancel the call with this id.
    Cancel {
        /// The call id.
        id: u64,
    },
    /// No new calls on this connection.
    GoAway(GoAwayFrame),
    /// Liveness probe.
    Ping {
        /// Opaque token, echoed in the PONG.
        id: u64,
        /// Opaque bytes, echoed in the PONG.
        payload: Bytes,
    },
    /// Answer to a PING.
    Pong {
        /// The PING's token.
        id: u64,
        /// The PING's bytes.
        payload: Bytes,
    },
    /// A stream's message, headers or half-close.
    Data(DataFrame),
    /// More credit for the receiver of this frame, as sender on stream `id`.
    Window {
        /// The stream.
        id: u64,
        /// Bytes of credit added (at least 1).
        increment: u32,
    },
    /// A bulk read or write.
    Bulk(BulkFrame),
    /// The answer to a bulk operation.
    BulkReply(BulkReplyFrame),
}

/// A BULK frame: read or write part of a buffer the receiver exposed.
#[derive(Clone, Debug, PartialEq)]
pub struct BulkFrame {
    /// The operation's id, chosen by its sender; the reply carries it.
    pub id: u64,
    /// A write (`FLAG_BULK_WRITE`) rather than a read.
    pub write: bool,
    /// The exposed buffer's token (from its descriptor).
    pub token: u64,
    /// Where in the buffer.
    pub offset: u64,
    /// How many bytes (for a write: the payload's length).
    pub len: u32,
    /// A write's data.
    pub data: Bytes,
}

/// A BULK_REPLY frame.
#[derive(Clone, Debug, PartialEq)]
pub struct BulkReplyFrame {
    /// The operation answered.
    pub id: u64,
    /// `OK`, or why the operation failed.
    pub code: Code,
    /// Status message (empty on success).
    pub message: ByteStr,
    /// A read's data.
    pub data: Bytes,
}

/// Methods a connection decoded recently, checked once each: a run of calls to the
/// same few methods then costs a comparison per request instead of a UTF-8 check, a
/// check of the name's form and the router's lookup (together some 600 instructions
/// of a server's 4,400 per unary call). See [`Frame::decode_cached`].
///
/// It holds the last [`ENTRIES`](MethodCache::ENTRIES) distinct methods that missed
/// (first in, first out), each its own copy rather than a slice of a read buffer (which
/// it would keep alive), and the requests it decodes share that copy. Names longer than
/// [`MAX_LEN`](MethodCache::MAX_LEN) are never kept (a peer could otherwise make every
/// connection hold eight 64 KiB names); they are decoded as [`Frame::decode`] does. A
/// miss that is kept costs two small allocations (the copy, and the shared header of
/// its first clone), so a connection cycling through more than `ENTRIES` methods pays
/// them per request. A method is kept once it is valid, even if the rest of its frame
/// then fails to decode.
#[derive(Debug, Default)]
pub struct MethodCache {
    entries: Vec<(ByteStr, Option<usize>)>,
    next: usize,
}

impl MethodCache {
    /// How many methods it remembers.
    pub const ENTRIES: usize = 8;

    /// The longest method name it keeps, in bytes.
    pub const MAX_LEN: usize = 256;

    /// A number the caller attached to `method` (a server: the index of the service its
    /// router found), if `method` came from this cache and was given one.
    pub(crate) fn tag(&self, method: &ByteStr) -> Option<usize> {
        self.entries[self.entry_of(method)?].1
    }

    /// Attaches `tag` to `method`, if it came from this cache.
    pub(crate) fn set_tag(&mut self, method: &ByteStr, tag: usize) {
        if let Some(at) = self.entry_of(method) {
            self.entries[at].1 = Some(tag);
        }
    }

    /// The entry `method` is a clone of: the same bytes in memory, not merely equal ones.
    fn entry_of(&self, method: &ByteStr) -> Option<usize> {
        let bytes = method.as_bytes();
        self.entries
            .iter()
            .position(|(m, _)| m.as_bytes().as_ptr() == bytes.as_ptr() && m.len() == bytes.len())
    }

    /// The method named by `raw` (at most [`MAX_LEN`](Self::MAX_LEN) bytes), checked:
    /// from the cache, or checked now and kept.
    fn method(&mut self, raw: &[u8]) -> Result<ByteStr, FrameError> {
        if let Some((method, _)) = self.entries.iter().find(|(m, _)| m.as_bytes() == raw) {
            return Ok(method.clone());
        }
        let method =
            std::str::from_utf8(raw).map_err(|_| FrameError::InvalidUtf8 { field: "method" })?;
        check_method(method)?;
        let method = ByteStr::from(method.to_owned());
        if self.entries.len() < Self::ENTRIES {
            self.entries.push((method.clone(), None));
        } else {
            self.entries[self.next] = (method.clone(), None);
            self.next = (self.next + 1) % Self::ENTRIES;
        }
        Ok(method)
    }
}

/// Bounds applied while decoding.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    /// Largest metadata block accepted, in bytes. Default: [`DEFAULT_MAX_METADATA_LEN`].
    pub max_metadata_len: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_metadata_len: DEFAULT_MAX_METADATA_LEN,
        }
    }
}

/// Why a frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A frame of no bytes (a length prefix of 0 on a stream): every frame has at
    /// least its 12-byte header.
    Empty,
    /// The frame's version byte is not [`VERSION`].
    UnsupportedVersion(u8),
    /// A kind this version does not define.
    UnknownKind(u8),
    /// A flag bit this version does not define, or one not allowed on this kind.
    UnknownFlags {
        /// The frame kind.
        kind: u8,
        /// The offending bits.
        flags: u16,
    },
    /// The frame ends before a field it announces.
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// Bytes after the last field of a frame kind that has no payload.
    TrailingBytes {
        /// The frame kind.
        kind: u8,
    },
    /// A string field is not UTF-8.
    InvalidUtf8 {
        /// The field.
        field: &'static str,
    },
    /// The metadata block is larger than the configured limit.
    MetadataTooLarge {
        /// Its announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The metadata block holds more entries than its limit allows
    /// ([`max_metadata_entries`]).
    TooManyMetadataEntries {
        /// The limit.
        max: usize,
    },
    /// A metadata key breaks the key rules.
    InvalidMetadataKey(String),
    /// The method name is not `package.Service/Method`.
    InvalidMethod(String),
    /// A field's value is not allowed (a zero WINDOW increment, a payload on a
    /// streaming REQUEST, a DATA frame flagged as having no message but carrying
    /// bytes).
    InvalidField {
        /// The field.
        field: &'static str,
    },
    /// A PING or PONG whose payload is longer than [`MAX_PING_PAYLOAD`].
    PingTooLarge {
        /// The payload's length.
        len: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported protocol version {v} (this peer speaks {VERSION})"
                )
            }
            FrameError::Empty => {
                f.write_str("empty frame (a frame has at least its 12-byte header)")
            }
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::UnknownFlags { kind, flags } => {
                write!(f, "undefined flags 0x{flags:04x} on frame kind {kind}")
            }
            FrameError::Truncated { field } => write!(f, "frame truncated in field `{field}`"),
            FrameError::TrailingBytes { kind } => {
                write!(f, "trailing bytes after frame kind {kind}")
            }
            FrameError::InvalidUtf8 { field } => write!(f, "field `{field}` is not UTF-8"),
            FrameError::MetadataTooLarge { len, max } => write!(
                f,
                "metadata block of {len} bytes exceeds the limit of {max} bytes \
                 (raise max_metadata_len on the receiver)"
            ),
            FrameError::TooManyMetadataEntries { max } => write!(
                f,
                "metadata block of more than {max} entries (max_metadata_len / 32 on the \
                 receiver)"
            ),
            FrameError::InvalidMetadataKey(msg) => f.write_str(msg),
            FrameError::InvalidMethod(m) => {
                write!(f, "method {m:?} is not of the form package.Service/Method")
            }
            FrameError::InvalidField { field } => write!(f, "invalid value in field `{field}`"),
            FrameError::PingTooLarge { len } => write!(
                f,
                "PING or PONG payload of {len} bytes exceeds the limit of \
                 {MAX_PING_PAYLOAD} bytes"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameError {
    /// The GOAWAY code a receiver sends before closing for this error.
    pub fn goaway_code(&self) -> GoAwayCode {
        match self {
            FrameError::UnsupportedVersion(_) => GoAwayCode::UNSUPPORTED_VERSION,
            _ => GoAwayCode::PROTOCOL_ERROR,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------

fn put_common(buf: &mut BytesMut, kind: FrameKind, flags: u16, id: u64) {
    buf.put_u8(VERSION);
    buf.put_u8(kind.0);
    buf.put_u16(flags);
    buf.put_u64(id);
}

/// Length of `metadata` as encoded in a metadata block (without the block's own prefix).
pub fn metadata_encoded_len(metadata: &Metadata) -> usize {
    metadata
        .iter()
        .map(|(k, v)| 1 + k.len() + 4 + v.as_bytes().len())
        .sum()
}

/// Whether `metadata` with one more entry, `key: value`, still fits the limits of
/// [`metadata_fits`]: an entry the framework adds itself (the compression
/// advertisement) is left out rather than push a block over them.
pub(crate) fn fits_one_more(
    metadata: &Metadata,
    key: &str,
    value: &str,
    max_metadata_len: usize,
) -> bool {
    metadata.len() < max_metadata_entries(max_metadata_len)
        && metadata_encoded_len(metadata) + 1 + key.len() + 4 + value.len() <= max_metadata_len
}

/// The length of a REQUEST's header part (everything but the payload).
fn request_header_len(method: &str, call_key: bool, metadata: &Metadata) -> usize {
    let key = if call_key { CALL_KEY_LEN } else { 0 };
    HEADER_LEN + 8 + key + 2 + method.len() + 4 + metadata_encoded_len(metadata)
}

/// The length of a RESPONSE's header part (everything but the payload).
fn response_header_len(message: &str, details: &[u8], metadata: &Metadata) -> usize {
    HEADER_LEN + 4 + 4 + message.len() + 4 + details.len() + 4 + metadata_encoded_len(metadata)
}

fn put_metadata(buf: &mut BytesMut, metadata: &Metadata) {
    buf.put_u32(metadata_encoded_len(metadata) as u32);
    for (key, value) in metadata.iter() {
        // Keys are at most 255 bytes: `Metadata` refuses longer ones.
        buf.put_u8(key.len() as u8);
        buf.put_slice(key.as_bytes());
        let value = value.as_bytes();
        buf.put_u32(value.len() as u32);
        buf.put_slice(value);
    }
}

/// Writes the header part of a REQUEST without a call key (everything but the
/// payload) into `buf`.
pub fn encode_request_header(
    buf: &mut BytesMut,
    id: u64,
    method: &str,
    timeout: Option<Duration>,
    metadata: &Metadata,
) {
    encode_request_header_with_key(buf, id, method, timeout, None, metadata);
}

/// Writes the header part of a REQUEST (everything but the payload) into `buf`.
pub fn encode_request_header_with_key(
    buf: &mut BytesMut,
    id: u64,
    method: &str,
    timeout: Option<Duration>,
    call_key: Option<&CallKey>,
    metadata: &Metadata,
) {
    encode_request_header_flags(buf, id, method, timeout, call_key, metadata, 0);
}

/// Writes the header part of a REQUEST with extra flags ([`FLAG_STREAMING`],
/// [`FLAG_COMPRESSED`]); the timeout and call-key flags follow from the arguments.
pub fn encode_request_header_flags(
    buf: &mut BytesMut,
    id: u64,
    method: &str,
    timeout: Option<Duration>,
    call_key: Option<&CallKey>,
    metadata: &Metadata,
    extra_flags: u16,
) {
    buf.reserve(request_header_len(method, call_key.is_some(), metadata));
    let mut flags = extra_flags & (FLAG_STREAMING | FLAG_COMPRESSED);
    if timeout.is_some() {
        flags |= FLAG_HAS_TIMEOUT;
    }
    if call_key.is_some() {
        flags |= FLAG_HAS_CALL_KEY;
    }
    put_common(buf, FrameKind::REQUEST, flags, id);
    let micros = timeout.map_or(0, |t| u64::try_from(t.as_micros()).unwrap_or(u64::MAX));
    buf.put_u64(micros);
    if let Some(key) = call_key {
        buf.put_u128(key.client);
        buf.put_u64(key.call);
        buf.put_u32(key.attempt);
    }
    buf.put_u16(method.len() as u16);
    buf.put_slice(method.as_bytes());
    put_metadata(buf, metadata);
}

/// Writes the header part of a RESPONSE (everything but the payload) into `buf`.
pub fn encode_response_header(
    buf: &mut BytesMut,
    id: u64,
    code: Code,
    message: &str,
    details: &[u8],
    metadata: &Metadata,
) {
    encode_response_header_flags(buf, id, code, message, details, metadata, 0);
}

/// Writes the header part of a RESPONSE with flags ([`FLAG_COMPRESSED`]).
pub fn encode_response_header_flags(
    buf: &mut BytesMut,
    id: u64,
    code: Code,
    message: &str,
    details: &[u8],
    metadata: &Metadata,
    flags: u16,
) {
    buf.reserve(response_header_len(message, details, metadata));
    put_common(buf, FrameKind::RESPONSE, flags & FLAG_COMPRESSED, id);
    buf.put_u32(code.as_u32());
    buf.put_u32(message.len() as u32);
    buf.put_slice(message.as_bytes());
    buf.put_u32(details.len() as u32);
    buf.put_slice(details);
    put_metadata(buf, metadata);
}

/// Writes the header of a DATA frame; the message (if any) follows as the payload.
/// `flags` are [`FLAG_END_STREAM`], [`FLAG_NO_MESSAGE`] and [`FLAG_COMPRESSED`];
/// [`FLAG_HAS_METADATA`] is set when `metadata` is given.
pub fn encode_data_header(buf: &mut BytesMut, id: u64, flags: u16, metadata: Option<&Metadata>) {
    let mut flags = flags & (FLAG_END_STREAM | FLAG_NO_MESSAGE | FLAG_COMPRESSED);
    if metadata.is_some() {
        flags |= FLAG_HAS_METADATA;
    }
    buf.reserve(HEADER_LEN + metadata.map_or(0, |m| 4 + metadata_encoded_len(m)));
    put_common(buf, FrameKind::DATA, flags, id);
    if let Some(metadata) = metadata {
        put_metadata(buf, metadata);
    }
}

/// Writes a whole WINDOW frame.
pub fn encode_window(buf: &mut BytesMut, id: u64, increment: u32) {
    buf.reserve(HEADER_LEN + 4);
    put_common(buf, FrameKind::WINDOW, 0, id);
    buf.put_u32(increment);
}

/// Writes the header of a BULK frame; a write's data follows as the payload.
pub fn encode_bulk_header(
    buf: &mut BytesMut,
    id: u64,
    write: bool,
    token: u64,
    offset: u64,
    len: u32,
) {
    buf.reserve(HEADER_LEN + 20);
    put_common(
        buf,
        FrameKind::BULK,
        if write { FLAG_BULK_WRITE } else { 0 },
        id,
    );
    buf.put_u64(token);
    buf.put_u64(offset);
    buf.put_u32(len);
}

/// Writes the header of a BULK_REPLY frame; a read's data follows as the payload.
pub fn encode_bulk_reply_header(buf: &mut BytesMut, id: u64, code: Code, message: &str) {
    buf.reserve(HEADER_LEN + 8 + message.len());
    put_common(buf, FrameKind::BULK_REPLY, 0, id);
    buf.put_u32(code.as_u32());
    buf.put_u32(message.len() as u32);
    buf.put_slice(message.as_bytes());
}

/// Writes a whole CANCEL frame.
pub fn encode_cancel(buf: &mut BytesMut, id: u64) {
    put_common(buf, FrameKind::CANCEL, 0, id);
}

/// Writes a whole GOAWAY frame (a reason longer than [`MAX_GOAWAY_REASON_LEN`] is cut).
pub fn encode_goaway(buf: &mut BytesMut, last_id: u64, code: GoAwayCode, reason: &str) {
    let mut end = reason.len().min(MAX_GOAWAY_REASON_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason[..end];
    put_common(buf, FrameKind::GOAWAY, 0, last_id);
    buf.put_u32(code.0);
    buf.put_u16(reason.len() as u16);
    buf.put_slice(reason.as_bytes());
}

/// Writes the header of a PING (`pong == false`) or PONG frame; the payload follows.
pub fn encode_ping_header(buf: &mut BytesMut, id: u64, pong: bool) {
    let kind = if pong {
        FrameKind::PONG
    } else {
        FrameKind::PING
    };
    put_common(buf, kind, 0, id);
}

impl Frame {
    /// Encodes the whole frame into one buffer (header and payload). The connection
    /// drivers use the `encode_*` functions instead, which keep payloads separate.
    pub fn encode(&self) -> BytesMut {
        let mut buf = BytesMut::new();
        match self {
            Frame::Request(r) => {
                let mut flags = 0;
                if r.streaming {
                    flags |= FLAG_STREAMING;
                }
                if r.compressed {
                    flags |= FLAG_COMPRESSED;
                }
                encode_request_header_flags(
                    &mut buf,
                    r.id,
                    &r.method,
                    r.timeout,
                    r.call_key.as_ref(),
                    &r.metadata,
                    flags,
                );
                buf.extend_from_slice(&r.payload);
            }
            Frame::Response(r) => {
                let flags = if r.compressed { FLAG_COMPRESSED } else { 0 };
                encode_response_header_flags(
                    &mut buf,
                    r.id,
                    r.code,
                    &r.message,
                    &r.details,
                    &r.metadata,
                    flags,
                );
                buf.extend_from_slice(&r.payload);
            }
            Frame::Data(d) => {
                let mut flags = 0;
                if d.end_stream {
                    flags |= FLAG_END_STREAM;
                }
                if d.message.is_none() {
                    flags |= FLAG_NO_MESSAGE;
                }
                if d.compressed {
                    flags |= FLAG_COMPRESSED;
                }
                encode_data_header(&mut buf, d.id, flags, d.metadata.as_ref());
                if let Some(message) = &d.message {
                    buf.extend_from_slice(message);
                }
            }
            Frame::Window { id, increment } => encode_window(&mut buf, *id, *increment),
            Frame::Bulk(b) => {
                encode_bulk_header(&mut buf, b.id, b.write, b.token, b.offset, b.len);
                buf.extend_from_slice(&b.data);
            }
            Frame::BulkReply(r) => {
                encode_bulk_reply_header(&mut buf, r.id, r.code, &r.message);
                buf.extend_from_slice(&r.data);
            }
            Frame::Cancel { id } => encode_cancel(&mut buf, *id),
            Frame::GoAway(g) => encode_goaway(&mut buf, g.last_id, g.code, &g.reason),
            Frame::Ping { id, payload } | Frame::Pong { id, payload } => {
                encode_ping_header(&mut buf, *id, matches!(self, Frame::Pong { .. }));
                buf.extend_from_slice(payload);
            }
        }
        buf
    }

    /// Decodes one whole frame. Never panics; every length is checked against the
    /// bytes present before anything is read or allocated.
    pub fn decode(buf: Bytes, limits: &DecodeLimits) -> Result<Frame, FrameError> {
        Frame::decode_with(buf, limits, None)
    }

    /// [`decode`](Frame::decode), with the methods of REQUEST frames looked up in (and
    /// added to) `methods`: what a server's connection decodes with. The result is the
    /// same; the work is not.
    pub fn decode_cached(
        buf: Bytes,
        limits: &DecodeLimits,
        methods: &mut MethodCache,
    ) -> Result<Frame, FrameError> {
        Frame::decode_with(buf, limits, Some(methods))
    }

    fn decode_with(
        mut buf: Bytes,
        limits: &DecodeLimits,
        methods: Option<&mut MethodCache>,
    ) -> Result<Frame, FrameError> {
        // Version first, so a peer of another version gets the right answer even if its
        // frame is shorter than ours.
        if buf.is_empty() {
            return Err(FrameError::Empty);
        }
        if buf[0] != VERSION {
            return Err(FrameError::UnsupportedVersion(buf[0]));
        }
        need(&buf, HEADER_LEN, "header")?;
        buf.advance(1);
        let kind = buf.get_u8();
        let flags = buf.get_u16();
        let id = buf.get_u64();
        let allowed = match FrameKind(kind) {
            FrameKind::REQUEST => {
                FLAG_HAS_TIMEOUT | FLAG_HAS_CALL_KEY | FLAG_STREAMING | FLAG_COMPRESSED
            }
            FrameKind::RESPONSE => FLAG_COMPRESSED,
            FrameKind::DATA => {
                FLAG_END_STREAM | FLAG_HAS_METADATA | FLAG_NO_MESSAGE | FLAG_COMPRESSED
            }
            FrameKind::BULK => FLAG_BULK_WRITE,
            _ => 0,
        };
        if flags & !allowed != 0 {
            return Err(FrameError::UnknownFlags {
                kind,
                flags: flags & !allowed,
            });
        }
        match FrameKind(kind) {
            FrameKind::REQUEST => {
                need(&buf, 8, "timeout")?;
                let micros = buf.get_u64();
                let timeout =
                    (flags & FLAG_HAS_TIMEOUT != 0).then(|| Duration::from_micros(micros));
                let call_key = if flags & FLAG_HAS_CALL_KEY != 0 {
                    need(&buf, CALL_KEY_LEN, "call key")?;
                    Some(CallKey {
                        client: buf.get_u128(),
                        call: buf.get_u64(),
                        attempt: buf.get_u32(),
                    })
                } else {
                    None
                };
                let cached = buf.len() >= 2
                    && usize::from(u16::from_be_bytes([buf[0], buf[1]])) <= MethodCache::MAX_LEN;
                let method = match methods {
                    Some(methods) if cached => {
                        let len = buf.get_u16() as usize;
                        need(&buf, len, "method")?;
                        let method = methods.method(&buf[..len])?;
                        buf.advance(len);
                        method
                    }
                    _ => {
                        let method = get_str16(&mut buf, "method")?;
                        check_method(&method)?;
                        method
                    }
                };
                let metadata = get_metadata(&mut buf, limits)?;
                let streaming = flags & FLAG_STREAMING != 0;
                if streaming && !buf.is_empty() {
                    return Err(FrameError::InvalidField { field: "payload" });
                }
                Ok(Frame::Request(RequestFrame {
                    id,
                    method,
                    timeout,
                    call_key,
                    metadata,
                    streaming,
                    compressed: flags & FLAG_COMPRESSED != 0,
                    payload: buf,
                }))
            }
            FrameKind::RESPONSE => {
                need(&buf, 4, "code")?;
                let code = Code::from_u32(buf.get_u32());
                let message = get_str32(&mut buf, "message")?;
                let details = get_bytes32(&mut buf, "details")?;
                let metadata = get_metadata(&mut buf, limits)?;
                Ok(Frame::Response(ResponseFrame {
                    id,
                    code,
                    message,
                    details,
                    metadata,
                    compressed: flags & FLAG_COMPRESSED != 0,
                    payload: buf,
                }))
            }
            FrameKind::DATA => {
                let metadata = if flags & FLAG_HAS_METADATA != 0 {
                    Some(get_metadata(&mut buf, limits)?)
                } else {
                    None
                };
                let message = if flags & FLAG_NO_MESSAGE != 0 {
                    if !buf.is_empty() {
                        return Err(FrameError::InvalidField { field: "payload" });
                    }
                    None
                } else {
                    Some(buf)
                };
                Ok(Frame::Data(DataFrame {
                    id,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    metadata,
                    message,
                    compressed: flags & FLAG_COMPRESSED != 0,
                }))
            }
            FrameKind::BULK => {
                need(&buf, 20, "bulk operation")?;
                let token = buf.get_u64();
                let offset = buf.get_u64();
                let len = buf.get_u32();
                let write = flags & FLAG_BULK_WRITE != 0;
                if write && buf.len() != len as usize || !write && !buf.is_empty() {
                    return Err(FrameError::InvalidField { field: "len" });
                }
                Ok(Frame::Bulk(BulkFrame {
                    id,
                    write,
                    token,
                    offset,
                    len,
                    data: buf,
                }))
            }
            FrameKind::BULK_REPLY => {
                need(&buf, 4, "code")?;
                let code = Code::from_u32(buf.get_u32());
                let message = get_str32(&mut buf, "message")?;
                Ok(Frame::BulkReply(BulkReplyFrame {
                    id,
                    code,
                    message,
                    data: buf,
                }))
            }
            FrameKind::WINDOW => {
                need(&buf, 4, "increment")?;
                let increment = buf.get_u32();
                no_trailing(&buf, kind)?;
                if increment == 0 {
                    return Err(FrameError::InvalidField { field: "increment" });
                }
                Ok(Frame::Window { id, increment })
            }
            FrameKind::CANCEL => {
                no_trailing(&buf, kind)?;
                Ok(Frame::Cancel { id })
            }
            FrameKind::GOAWAY => {
                need(&buf, 4, "goaway code")?;
                let code = GoAwayCode(buf.get_u32());
                let reason = get_str16(&mut buf, "reason")?;
                no_trailing(&buf, kind)?;
                Ok(Frame::GoAway(GoAwayFrame {
                    last_id: id,
                    code,
                    reason,
                }))
            }
            FrameKind::PING | FrameKind::PONG if buf.len() > MAX_PING_PAYLOAD => {
                Err(FrameError::PingTooLarge { len: buf.len() })
            }
            FrameKind::PING => Ok(Frame::Ping { id, payload: buf }),
            FrameKind::PONG => Ok(Frame::Pong { id, payload: buf }),
            FrameKind(other) => Err(FrameError::UnknownKind(other)),
        }
    }
}

fn need(buf: &Bytes, n: usize, field: &'static str) -> Result<(), FrameError> {
    if buf.len() < n {
        Err(FrameError::Truncated { field })
    } else {
        Ok(())
    }
}

fn no_trailing(buf: &Bytes, kind: u8) -> Result<(), FrameError> {
    if buf.is_empty() {
        Ok(())
    } else {
        Err(FrameError::TrailingBytes { kind })
    }
}

fn get_bytes(buf: &mut Bytes, len: usize, field: &'static str) -> Result<Bytes, FrameError> {
    need(buf, len, field)?;
    if len == 0 {
        // Empty fields are common (status message, details, metadata); an empty `Bytes`
        // costs no reference-count update, a zero-length slice of `buf` does.
        return Ok(Bytes::new());
    }
    Ok(buf.split_to(len))
}

fn get_bytes32(buf: &mut Bytes, field: &'static str) -> Result<Bytes, FrameError> {
    need(buf, 4, field)?;
    let len = buf.get_u32() as usize;
    get_bytes(buf, len, field)
}

fn utf8(bytes: Bytes, field: &'static str) -> Result<ByteStr, FrameError> {
    ByteStr::from_utf8(bytes).map_err(|_| FrameError::InvalidUtf8 { field })
}

fn get_str16(buf: &mut Bytes, field: &'static str) -> Result<ByteStr, FrameError> {
    need(buf, 2, field)?;
    let len = buf.get_u16() as usize;
    utf8(get_bytes(buf, len, field)?, field)
}

fn get_str32(buf: &mut Bytes, field: &'static str) -> Result<ByteStr, FrameError> {
    utf8(get_bytes32(buf, field)?, field)
}

/// `package.Service/Method`: exactly one `/`, with something on each side. One pass
/// over the bytes (it runs on every request; names are short, so a plain loop beats
/// searching twice).
/// Whether a sender may write `method` in a REQUEST (`docs/wire.md` §2.5, §3): of the form
/// `package.Service/Method` (one `/`, neither first nor last), and short enough for
/// its 16-bit length. A receiver closes the connection for any other.
pub(crate) fn method_is_sendable(method: &str) -> bool {
    method.len() <= usize::from(u16::MAX) && check_method(method).is_ok()
}

fn check_method(method: &str) -> Result<(), FrameError> {
    // One '/', neither first nor last (a count the compiler vectorizes: the client
    // checks every call's name).
    let bytes = method.as_bytes();
    let slashes = bytes.iter().filter(|&&b| b == b'/').count();
    if slashes == 1 && bytes.first() != Some(&b'/') && bytes.last() != Some(&b'/') {
        Ok(())
    } else {
        Err(FrameError::InvalidMethod(clip(method, 256).into_owned()))
    }
}

/// `text` cut to at most `max` bytes (at a character boundary, marked with `...`): what
/// a peer sent (a bad method name, a GOAWAY reason of up to 64 KiB) and an error
/// repeats in every status it fails, once per call.
pub(crate) fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end]).into()
}

fn get_metadata(buf: &mut Bytes, limits: &DecodeLimits) -> Result<Metadata, FrameError> {
    need(buf, 4, "metadata length")?;
    let len = buf.get_u32() as usize;
    if len > limits.max_metadata_len {
        return Err(FrameError::MetadataTooLarge {
            len,
            max: limits.max_metadata_len,
        });
    }
    let mut block = get_bytes(buf, len, "metadata")?;
    let mut metadata = Metadata::new();
    let max_entries = max_metadata_entries(limits.max_metadata_len);
    while !block.is_empty() {
        if metadata.len() == max_entries {
            return Err(FrameError::TooManyMetadataEntries { max: max_entries });
        }
        let key_len = block.get_u8() as usize;
        let key = utf8(
            get_bytes(&mut block, key_len, "metadata key")?,
            "metadata key",
        )?;
        validate_key(&key).map_err(|e| FrameError::InvalidMetadataKey(e.to_string()))?;
        let value = get_bytes32(&mut block, "metadata value")?;
        let value = if is_binary_key(&key) {
            MetadataValue::Binary(value)
        } else {
            MetadataValue::Text(utf8(value, "metadata value")?)
        };
        metadata.push_unchecked(key, value);
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_at_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        // 'é' is two bytes: a cut at 3 would split the second one.
        assert_eq!(clip("éééé", 3), "é...");
        assert_eq!(clip("abcdef", 4), "abcd...");
    }

    /// Known GOAWAY codes print by name; an unknown one as `CODE_<n>`, as an unknown
    /// status code does (it printed as `GoAwayCode(77)`, Rust's debug form).
    #[test]
    fn goaway_codes_print_by_name_or_number() {
        assert_eq!(GoAwayCode::FRAME_TOO_LARGE.to_string(), "FRAME_TOO_LARGE");
        assert_eq!(GoAwayCode(77).to_string(), "CODE_77");
        assert_eq!(format!("{:?}", GoAwayCode(77)), "GoAwayCode(77)");
    }

    fn round_trip(frame: Frame) {
        let bytes = frame.encode().freeze();
        let decoded = Frame::decode(bytes, &DecodeLimits::default()).expect("decodes");
        assert_eq!(decoded, frame);
    }

    #[test]
    fn request_layout_matches_the_spec() {
        // The example from docs/wire.md, byte for byte.
        let mut md = Metadata::new();
        md.insert("k", "v").unwrap();
        let frame = Frame::Request(RequestFrame {
            id: 7,
            method: ByteStr::from_static("a.B/C"),
            timeout: Some(Duration::from_millis(5)),
            call_key: None,
            metadata: md,
            streaming: false,
            compressed: false,
            payload: Bytes::from_static(b"\x08\x01"),
        });
        let bytes = frame.encode();
        let expected: &[u8] = &[
            1, 1, 0, 1, // version, kind REQUEST, flags HAS_TIMEOUT
            0, 0, 0, 0, 0, 0, 0, 7, // id
            0, 0, 0, 0, 0, 0, 0x13, 0x88, // timeout 5000 us
            0, 5, b'a', b'.', b'B', b'/', b'C', // method
            0, 0, 0, 7, 1, b'k', 0, 0, 0, 1, b'v', // metadata block
            0x08, 0x01, // payload
        ];
        assert_eq!(&bytes[..], expected);
        round_trip(frame);
    }

    /// The frames of docs/wire.md's worked streaming and keyed examples (10.5, 10.6),
    /// in order: each line's bytes there are a length prefix and this frame's
    /// encoding, and decode to it.
    fn documented_exchange() -> Vec<Frame> {
        let data = |end_stream, metadata: Option<Metadata>, message: Option<&'static [u8]>| {
            Frame::Data(DataFrame {
                id: 3,
                end_stream,
                metadata,
                message: message.map(Bytes::from_static),
                compressed: false,
            })
        };
        let request = |streaming, call_key, payload: &'static [u8]| {
            Frame::Request(RequestFrame {
                id: 3,
                method: ByteStr::from_static(if streaming {
                    "rpc.examples.v1.Echo/Count"
                } else {
                    "rpc.examples.v1.Echo/Say"
                }),
                timeout: None,
                call_key,
                metadata: Metadata::new(),
                streaming,
                compressed: false,
                payload: Bytes::from_static(payload),
            })
        };
        vec![
            request(true, None, b""),
            Frame::Window {
                id: 3,
                increment: 983_040,
            },
            data(false, None, Some(b"\x08\x02")),
            data(true, None, None),
            Frame::Window {
                id: 3,
                increment: 983_040,
            },
            data(false, Some(Metadata::new()), None),
            data(false, None, Some(b"\x08\x01")),
            data(false, None, Some(b"\x08\x02")),
            Frame::Response(ResponseFrame {
                id: 3,
                code: Code::OK,
                message: ByteStr::from_static(""),
                details: Bytes::new(),
                metadata: Metadata::new(),
                compressed: false,
                payload: Bytes::new(),
            }),
            request(
                false,
                Some(CallKey {
                    client: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
                    call: 9,
                    attempt: 2,
                }),
                b"\x0a\x02hi",
            ),
        ]
    }

    #[test]
    fn the_documented_streaming_and_keyed_examples_are_what_the_codec_writes() {
        let doc = include_str!("../../docs/wire.md");
        let start = doc.find("### 10.5").expect("section 10.5");
        let end = doc[start..].find("## 11.").expect("section 11") + start;
        // Lines `label: hex...`, continued by indented lines of hex, in fenced blocks.
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let mut fenced = false;
        for line in doc[start..end].lines() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if !fenced || line.trim().is_empty() {
                continue;
            }
            let hex = match line.split_once(": ") {
                Some((label, hex)) if !label.starts_with(' ') => {
                    frames.push(Vec::new());
                    hex
                }
                _ => line,
            };
            let bytes = frames.last_mut().expect("a labelled line first");
            for digits in hex.split_whitespace() {
                bytes.push(u8::from_str_radix(digits, 16).expect("hex bytes"));
            }
        }
        let expected = documented_exchange();
        assert_eq!(frames.len(), expected.len(), "frames in 10.5 and 10.6");
        for (i, (written, frame)) in frames.iter().zip(&expected).enumerate() {
            let encoded = frame.encode();
            let prefix = u32::try_from(encoded.len()).unwrap().to_be_bytes();
            assert_eq!(&written[..4], &prefix, "frame {i}: length prefix");
            assert_eq!(&written[4..], &encoded[..], "frame {i}: {frame:?}");
            round_trip(frame.clone());
        }
    }

    #[test]
    fn every_kind_round_trips() {
        round_trip(Frame::Response(ResponseFrame {
            id: u64::MAX,
            code: Code::from_u32(77),
            message: ByteStr::from("tab\tnewline\n🦀".to_owned()),
            details: Bytes::from_static(&[0, 1, 2]),
            metadata: Metadata::new(),
            compressed: false,
            payload: Bytes::new(),
        }));
        round_trip(Frame::Cancel { id: 3 });
        round_trip(Frame::GoAway(GoAwayFrame {
            last_id: 9,
            code: GoAwayCode::PROTOCOL_ERROR,
            reason: ByteStr::from_static("bad"),
        }));
        round_trip(Frame::Ping {
            id: 1,
            payload: Bytes::from_static(b"12345678"),
        });
        round_trip(Frame::Pong {
            id: 1,
            payload: Bytes::new(),
        });
    }

    #[test]
    fn bad_version_is_reported_first() {
        let err = Frame::decode(Bytes::from_static(&[2, 1]), &DecodeLimits::default());
        assert_eq!(err, Err(FrameError::UnsupportedVersion(2)));
        assert_eq!(
            err.unwrap_err().goaway_code(),
            GoAwayCode::UNSUPPORTED_VERSION
        );
    }

    #[test]
    fn unknown_kind_and_flags_are_errors() {
        let mut f = Frame::Cancel { id: 1 }.encode();
        f[1] = 99;
        assert_eq!(
            Frame::decode(f.freeze(), &DecodeLimits::default()),
            Err(FrameError::UnknownKind(99))
        );
        let mut f = Frame::Cancel { id: 1 }.encode();
        f[3] = 0x01;
        assert!(matches!(
            Frame::decode(f.freeze(), &DecodeLimits::default()),
            Err(FrameError::UnknownFlags { .. })
        ));
    }

    #[test]
    fn metadata_limit_is_checked_before_reading() {
        let mut md = Metadata::new();
        md.insert("key", "x".repeat(100)).unwrap();
        let frame = Frame::Request(RequestFrame {
            id: 1,
            method: ByteStr::from_static("a.B/C"),
            timeout: None,
            call_key: None,
            metadata: md,
            streaming: false,
            compressed: false,
            payload: Bytes::new(),
        });
        let limits = DecodeLimits {
            max_metadata_len: 50,
        };
        assert!(matches!(
            Frame::decode(frame.encode().freeze(), &limits),
            Err(FrameError::MetadataTooLarge { max: 50, .. })
        ));
    }

    /// A block within the byte limit but of many tiny entries is refused past
    /// `max_metadata_len / 32` of them: 2,730 empty one-letter entries fit 16 KiB and
    /// cost ~200 KiB decoded (a hostile peer's round).
    #[test]
    fn metadata_entries_are_bounded() {
        let request = |entries: usize| {
            let mut md = Metadata::new();
            for _ in 0..entries {
                md.append("a", "").unwrap();
            }
            Frame::Request(RequestFrame {
                id: 1,
                method: ByteStr::from_static("a.B/C"),
                timeout: None,
                call_key: None,
                metadata: md,
                streaming: false,
                compressed: false,
                payload: Bytes::new(),
            })
            .encode()
            .freeze()
        };
        let limits = DecodeLimits::default();
        let max = max_metadata_entries(limits.max_metadata_len);
        assert_eq!(max, 512);
        assert!(Frame::decode(request(max), &limits).is_ok());
        assert_eq!(
            Frame::decode(request(max + 1), &limits),
            Err(FrameError::TooManyMetadataEntries { max })
        );
        assert_eq!(max_metadata_entries(50), MIN_METADATA_ENTRIES);
    }

    #[test]
    fn huge_announced_lengths_do_not_allocate_or_panic() {
        // A response announcing a 4 GiB message in a 20-byte frame.
        let mut f = BytesMut::new();
        put_common(&mut f, FrameKind::RESPONSE, 0, 1);
        f.put_u32(0);
        f.put_u32(u32::MAX);
        assert_eq!(
            Frame::decode(f.freeze(), &DecodeLimits::default()),
            Err(FrameError::Truncated { field: "message" })
        );
    }

    #[test]
    fn the_method_cache_decodes_as_decode_does_and_shares_one_checked_copy_per_method() {
        let request = |method: &str| {
            Frame::Request(RequestFrame {
                id: 7,
                method: ByteStr::from(method.to_owned()),
                timeout: None,
                call_key: None,
                metadata: Metadata::new(),
                streaming: false,
                compressed: false,
                payload: Bytes::from_static(b"payload"),
            })
            .encode()
            .freeze()
        };
        let limits = DecodeLimits::default();
        let mut methods = MethodCache::default();
        let method_of = |frame: Frame| match frame {
            Frame::Request(r) => r.method,
            other => panic!("not a request: {other:?}"),
        };
        let first = Frame::decode_cached(request("a.B/C"), &limits, &mut methods).unwrap();
        assert_eq!(first, Frame::decode(request("a.B/C"), &limits).unwrap());
        let first = method_of(first);
        assert_eq!(methods.tag(&first), None);
        methods.set_tag(&first, 3);
        // The same method again: the cache's copy, and the tag attached to it.
        let again =
            method_of(Frame::decode_cached(request("a.B/C"), &limits, &mut methods).unwrap());
        assert_eq!(first.as_bytes().as_ptr(), again.as_bytes().as_ptr());
        assert_eq!(methods.tag(&again), Some(3));
        // An equal string that did not come from the cache has no tag.
        assert_eq!(methods.tag(&ByteStr::from("a.B/C".to_owned())), None);
        // More methods than the cache holds: each still decodes right; the oldest goes.
        for i in 0..MethodCache::ENTRIES {
            let name = format!("a.B/M{i}");
            let method =
                method_of(Frame::decode_cached(request(&name), &limits, &mut methods).unwrap());
            assert_eq!(&*method, name);
        }
        assert_eq!(methods.tag(&first), None);
        // A name over the cache's limit decodes as `decode` does and is not kept.
        let long = format!("a.B/{}", "m".repeat(MethodCache::MAX_LEN));
        let method =
            method_of(Frame::decode_cached(request(&long), &limits, &mut methods).unwrap());
        assert_eq!(&*method, long);
        assert!(methods
            .entries
            .iter()
            .all(|(m, _)| m.len() <= MethodCache::MAX_LEN));
    }

    #[test]
    fn method_must_name_service_and_method() {
        for bad in ["", "/", "//", "a.B/", "/C", "a.B/C/D", "a.B//C", "noslash"] {
            let frame = Frame::Request(RequestFrame {
                id: 1,
                method: ByteStr::from(bad.to_owned()),
                timeout: None,
                call_key: None,
                metadata: Metadata::new(),
                streaming: false,
                compressed: false,
                payload: Bytes::new(),
            });
            let mut methods = MethodCache::default();
            assert!(
                matches!(
                    Frame::decode_cached(
                        frame.encode().freeze(),
                        &DecodeLimits::default(),
                        &mut methods
                    ),
                    Err(FrameError::InvalidMethod(_))
                ),
                "{bad:?} accepted through the method cache"
            );
            assert!(
                matches!(
                    Frame::decode(frame.encode().freeze(), &DecodeLimits::default()),
                    Err(FrameError::InvalidMethod(_))
                ),
                "{bad:?} accepted"
            );
        }
    }
}
