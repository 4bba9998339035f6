//! The link's messages, as they sit in a receive buffer, without I/O.
//!
//! Every message starts with an 8-byte header; integers are big-endian:
//!
//! ```text
//! 0 kind u8      1 HELLO, 2 EAGER, 3 RTS (ready to send), 4 FIN, 5 CREDIT, 6 BATCH
//! 1 flags u8     0 (receivers ignore unknown flags)
//! 2 credits u16  receive buffers the sender posted again since its previous message
//! 4 id u32       RTS and FIN: the rendezvous id; otherwise 0
//! ```
//!
//! - **HELLO** (first message each way): `version u8 = 1, features u8, 2 zero bytes,
//!   recv_buffers u32, recv_buffer_len u32, max_frame_len u32` (16 bytes). Feature
//!   bit 0: the sender accepts BATCH; other bits are 0 and ignored.
//! - **EAGER**: the whole frame (core header and payload) follows.
//! - **BATCH** (only to a peer whose HELLO set feature bit 0): one or more entries
//!   `len u32, len bytes of a whole frame` back to back, each `len` at least 1, filling
//!   the message exactly.
//! - **RTS**: `frame_len u64, head_len u16, segments u16, 4 zero bytes`, the first
//!   `head_len` bytes of the frame inline, then `segments` region descriptors of 32
//!   bytes each (`key u64, addr u64, len u64, access u8, 7 zero bytes`): the rest of
//!   the frame, in order, in regions the receiver reads with one-sided reads.
//!   `head_len` plus the descriptors' lengths must equal `frame_len`.
//! - **FIN**: the receiver has pulled rendezvous `id`; the sender releases (and
//!   deregisters) its regions.
//! - **CREDIT**: only the credits.

use rpc_core::{Error, ErrorKind};

use crate::provider::{RegionDesc, DESC_LEN};

/// Bytes of the message header.
pub const HEADER_LEN: usize = 8;
/// The link protocol's version (in HELLO).
pub const VERSION: u8 = 1;
/// Bytes of a HELLO's body.
pub(crate) const HELLO_LEN: usize = 16;
/// Bytes of an RTS's fixed part after the header.
pub(crate) const RTS_FIXED: usize = 16;
/// Most frame bytes an RTS carries inline.
pub(crate) const MAX_INLINE_HEAD: usize = 256;
/// Bytes of a BATCH entry's length prefix.
pub(crate) const ENTRY_LEN: usize = 4;
/// HELLO feature bit: the sender accepts BATCH messages.
pub(crate) const FEATURE_BATCH: u8 = 1;
/// Most regions an RTS names: with the inline head it fits the smallest receive
/// buffer (8 + 16 + 256 + 4 × 32 = 408 bytes).
pub(crate) const MAX_SEGMENTS: usize = 4;

pub(crate) const HELLO: u8 = 1;
pub(crate) const EAGER: u8 = 2;
pub(crate) const RTS: u8 = 3;
pub(crate) const FIN: u8 = 4;
pub(crate) const CREDIT: u8 = 5;
pub(crate) const BATCH: u8 = 6;

/// A link's parameters, announced in its HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) recv_buffers: u32,
    pub(crate) recv_buffer_len: u32,
    pub(crate) max_frame_len: u32,
    /// Whether the sender accepts BATCH messages (feature bit 0).
    pub(crate) batches: bool,
}

/// A decoded message, borrowing the receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    Hello(Hello),
    Eager(&'a [u8]),
    Batch(Batch<'a>),
    Rts(Rts<'a>),
    Fin,
    Credit,
}

/// Whole frames packed into one message, checked when decoded: every entry has a
/// length of at least 1 and lies inside the message, and they fill it exactly.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Batch<'a> {
    /// The entries (`len u32`, then the frame).
    pub(crate) body: &'a [u8],
    /// How many frames.
    pub(crate) frames: usize,
    /// The longest frame's length.
    pub(crate) longest: usize,
}

// The link takes a batch's frames one by one from its own copy (`batch_entry`);
// this walk is for the checks of the tests and the fuzz target.
#[cfg(any(fuzzing, test))]
impl<'a> Batch<'a> {
    /// Its frames, in order.
    pub(crate) fn frames(&self) -> impl Iterator<Item = &'a [u8]> {
        let mut body = self.body;
        std::iter::from_fn(move || {
            let (frame, next) = batch_entry(body)?;
            let out = &body[frame];
            body = &body[next..];
            Some(out)
        })
    }
}

/// The first entry of a BATCH body that [`decode`] checked: the frame's range in
/// `body` and where the next entry starts; `None` at the end (or, never for a
/// checked body, on an entry that does not fit).
pub(crate) fn batch_entry(body: &[u8]) -> Option<(std::ops::Range<usize>, usize)> {
    let len = body.get(..ENTRY_LEN)?;
    let len = u32_at(len, 0) as usize;
    let end = ENTRY_LEN.checked_add(len)?;
    if end > body.len() {
        return None;
    }
    Some((ENTRY_LEN..end, end))
}

/// A rendezvous announcement.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Rts<'a> {
    pub(crate) frame_len: u64,
    pub(crate) head: &'a [u8],
    descs: &'a [u8],
}

impl Rts<'_> {
    /// The regions, in frame order (checked when decoded).
    pub(crate) fn segments(&self) -> impl Iterator<Item = RegionDesc> + '_ {
        self.descs
            .chunks_exact(DESC_LEN)
            .filter_map(|d| RegionDesc::decode(d).ok())
    }
}

/// The header fields every message has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: u8,
    pub(crate) credits: u16,
    pub(crate) id: u32,
}

fn protocol(message: String) -> Error {
    Error::new(ErrorKind::Protocol, message)
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_be_bytes(w)
}

/// Decodes one message. Checks every length against what the message holds; never
/// allocates.
pub(crate) fn decode(msg: &[u8]) -> Result<(Header, Message<'_>), Error> {
    if msg.len() < HEADER_LEN {
        return Err(protocol(format!(
            "RDMA link message of {} bytes is shorter than its {HEADER_LEN}-byte header",
            msg.len()
        )));
    }
    let header = Header {
        kind: msg[0],
        credits: u16_at(msg, 2),
        id: u32_at(msg, 4),
    };
    let body = &msg[HEADER_LEN..];
    let message = match header.kind {
        HELLO => {
            if body.len() < HELLO_LEN {
                return Err(protocol(format!(
                    "RDMA link HELLO of {} bytes, expected {HELLO_LEN}",
                    body.len()
                )));
            }
            if body[0] != VERSION {
                return Err(Error::new(
                    ErrorKind::UnsupportedVersion,
                    format!(
                        "the peer speaks RDMA link version {}, this side {VERSION}",
                        body[0]
                    ),
                ));
            }
            Message::Hello(Hello {
                recv_buffers: u32_at(body, 4),
                recv_buffer_len: u32_at(body, 8),
                max_frame_len: u32_at(body, 12),
                batches: body[1] & FEATURE_BATCH != 0,
            })
        }
        EAGER => Message::Eager(body),
        BATCH => Message::Batch(check_batch(body)?),
        RTS => {
            if body.len() < RTS_FIXED {
                return Err(protocol(format!(
                    "RTS of {} bytes is shorter than its fixed part",
                    body.len()
                )));
            }
            let frame_len = u64_at(body, 0);
            let head_len = usize::from(u16_at(body, 8));
            let segments = usize::from(u16_at(body, 10));
            if head_len > MAX_INLINE_HEAD || segments > MAX_SEGMENTS {
                return Err(protocol(format!(
                    "RTS with {head_len} inline bytes and {segments} regions (at most \
                     {MAX_INLINE_HEAD} and {MAX_SEGMENTS})"
                )));
            }
            let need = RTS_FIXED + head_len + segments * DESC_LEN;
            if body.len() < need {
                return Err(protocol(format!(
                    "RTS of {} bytes announces {need}",
                    body.len()
                )));
            }
            let head = &body[RTS_FIXED..RTS_FIXED + head_len];
            let descs = &body[RTS_FIXED + head_len..need];
            let mut total = head_len as u64;
            for d in descs.chunks_exact(DESC_LEN) {
                let desc = RegionDesc::decode(d)?;
                total = total
                    .checked_add(desc.len)
                    .ok_or_else(|| protocol("RTS region lengths overflow".into()))?;
            }
            if total != frame_len {
                return Err(protocol(format!(
                    "RTS announces a frame of {frame_len} bytes but its parts add up to {total}"
                )));
            }
            Message::Rts(Rts {
                frame_len,
                head,
                descs,
            })
        }
        FIN => Message::Fin,
        CREDIT => Message::Credit,
        other => return Err(protocol(format!("unknown RDMA link message kind {other}"))),
    };
    Ok((header, message))
}

/// Checks a BATCH body: at least one entry, each of at least one byte and inside the
/// body, filling it exactly.
fn check_batch(body: &[u8]) -> Result<Batch<'_>, Error> {
    let mut rest = body;
    let mut frames = 0;
    let mut longest = 0;
    while !rest.is_empty() {
        if rest.len() < ENTRY_LEN {
            return Err(protocol(format!(
                "BATCH entry {} has {} bytes, too few for its length",
                frames + 1,
                rest.len()
            )));
        }
        let len = u32_at(rest, 0) as usize;
        if len == 0 || len > rest.len() - ENTRY_LEN {
            return Err(protocol(format!(
                "BATCH entry {} announces a frame of {len} bytes; {} bytes are left",
                frames + 1,
                rest.len() - ENTRY_LEN
            )));
        }
        frames += 1;
        longest = longest.max(len);
        rest = &rest[ENTRY_LEN + len..];
    }
    if frames == 0 {
        return Err(protocol("BATCH with no frame".into()));
    }
    Ok(Batch {
        body,
        frames,
        longest,
    })
}

/// Writes a header into `out[..HEADER_LEN]`.
pub(crate) fn put_header(out: &mut [u8], kind: u8, credits: u16, id: u32) {
    out[0] = kind;
    out[1] = 0;
    out[2..4].copy_from_slice(&credits.to_be_bytes());
    out[4..8].copy_from_slice(&id.to_be_bytes());
}

/// Writes a HELLO; returns its length.
pub(crate) fn put_hello(out: &mut [u8], credits: u16, hello: &Hello) -> usize {
    put_header(out, HELLO, credits, 0);
    let body = &mut out[HEADER_LEN..HEADER_LEN + HELLO_LEN];
    body[0] = VERSION;
    body[1] = if hello.batches { FEATURE_BATCH } else { 0 };
    body[2..4].fill(0);
    body[4..8].copy_from_slice(&hello.recv_buffers.to_be_bytes());
    body[8..12].copy_from_slice(&hello.recv_buffer_len.to_be_bytes());
    body[12..16].copy_from_slice(&hello.max_frame_len.to_be_bytes());
    HEADER_LEN + HELLO_LEN
}

/// Writes a whole frame, `header` then the segments of `payload`, at `out[at..]`,
/// which the caller checked has room; returns where it ends. The body of an EAGER
/// message, and of each BATCH entry.
pub(crate) fn put_frame(
    out: &mut [u8],
    mut at: usize,
    header: &[u8],
    payload: &rpc_core::Payload,
) -> usize {
    out[at..at + header.len()].copy_from_slice(header);
    at += header.len();
    for segment in payload.segments() {
        out[at..at + segment.len()].copy_from_slice(segment);
        at += segment.len();
    }
    at
}

/// Writes a BATCH entry of `header` and `payload` at `out[at..]`, which the caller
/// checked has room ([`ENTRY_LEN`] more than the frame); returns where the next
/// starts.
pub(crate) fn put_batch_entry(
    out: &mut [u8],
    at: usize,
    header: &[u8],
    payload: &rpc_core::Payload,
) -> usize {
    let len = header.len() + payload.len();
    out[at..at + ENTRY_LEN].copy_from_slice(&(len as u32).to_be_bytes());
    put_frame(out, at + ENTRY_LEN, header, payload)
}

/// Writes an RTS; returns its length. The caller checked that it fits.
pub(crate) fn put_rts(
    out: &mut [u8],
    credits: u16,
    id: u32,
    frame_len: u64,
    head: &[u8],
    segments: &[RegionDesc],
) -> usize {
    put_header(out, RTS, credits, id);
    let body = &mut out[HEADER_LEN..];
    body[0..8].copy_from_slice(&frame_len.to_be_bytes());
    body[8..10].copy_from_slice(&(head.len() as u16).to_be_bytes());
    body[10..12].copy_from_slice(&(segments.len() as u16).to_be_bytes());
    body[12..16].fill(0);
    let mut at = RTS_FIXED;
    body[at..at + head.len()].copy_from_slice(head);
    at += head.len();
    for desc in segments {
        let mut d = [0u8; DESC_LEN];
        desc.encode(&mut d);
        body[at..at + DESC_LEN].copy_from_slice(&d);
        at += DESC_LEN;
    }
    HEADER_LEN + at
}

/// The length of an RTS with `head_len` inline bytes and `segments` regions.
pub(crate) fn rts_len(head_len: usize, segments: usize) -> usize {
    HEADER_LEN + RTS_FIXED + head_len + segments * DESC_LEN
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::provider::Access;

    #[test]
    fn messages_round_trip() {
        let mut buf = [0u8; 512];
        let hello = Hello {
            recv_buffers: 64,
            recv_buffer_len: 8192,
            max_frame_len: 1 << 24,
            batches: true,
        };
        let n = put_hello(&mut buf, 0, &hello);
        assert_eq!(decode(&buf[..n]).unwrap().1, Message::Hello(hello));

        let segs = [
            RegionDesc {
                key: 1,
                addr: 2,
                len: 1000,
                access: Access::READ,
            },
            RegionDesc {
                key: 3,
                addr: 4,
                len: 24,
                access: Access::READ,
            },
        ];
        let n = put_rts(&mut buf, 7, 9, 1030, b"header", &segs);
        assert_eq!(n, rts_len(6, 2));
        let (header, message) = decode(&buf[..n]).unwrap();
        assert_eq!(
            header,
            Header {
                kind: RTS,
                credits: 7,
                id: 9
            }
        );
        let Message::Rts(rts) = message else {
            panic!("not an RTS")
        };
        assert_eq!(rts.frame_len, 1030);
        assert_eq!(rts.head, b"header");
        assert_eq!(rts.segments().collect::<Vec<_>>(), segs);

        put_header(&mut buf, EAGER, 3, 0);
        buf[8..11].copy_from_slice(b"abc");
        assert_eq!(decode(&buf[..11]).unwrap().1, Message::Eager(b"abc"));
        put_header(&mut buf, FIN, 0, 5);
        assert_eq!(
            decode(&buf[..8]).unwrap(),
            (
                Header {
                    kind: FIN,
                    credits: 0,
                    id: 5
                },
                Message::Fin
            )
        );
    }

    #[test]
    fn malformed_batches_are_refused() {
        let mut buf = [0u8; 64];
        put_header(&mut buf, BATCH, 0, 0);
        assert!(decode(&buf[..8]).is_err(), "no frame");
        buf[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert!(decode(&buf[..12]).is_err(), "an empty frame");
        buf[8..12].copy_from_slice(&3u32.to_be_bytes());
        assert!(decode(&buf[..14]).is_err(), "a frame past the end");
        let (_, message) = decode(&buf[..15]).unwrap();
        let Message::Batch(batch) = message else {
            panic!("not a batch: {message:?}")
        };
        assert_eq!((batch.frames, batch.longest), (1, 3));
        assert!(decode(&buf[..17]).is_err(), "a length cut short");
        buf[15..19].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&buf[..20]).is_err(), "a huge length");
    }

    #[test]
    fn inconsistent_rendezvous_announcements_are_refused() {
        let mut buf = [0u8; 512];
        let segs = [RegionDesc {
            key: 1,
            addr: 2,
            len: 1000,
            access: Access::READ,
        }];
        let n = put_rts(&mut buf, 0, 1, 999, b"", &segs);
        assert!(decode(&buf[..n]).is_err(), "lengths disagree");
        let n = put_rts(&mut buf, 0, 1, 1000, b"", &segs);
        assert!(decode(&buf[..n - 1]).is_err(), "truncated");
        let segs = [RegionDesc {
            key: 1,
            addr: 2,
            len: u64::MAX,
            access: Access::READ,
        }; 2];
        let n = put_rts(&mut buf, 0, 1, 0, b"", &segs);
        assert!(decode(&buf[..n]).is_err(), "overflow");
    }

    /// A message to encode: header fields and what follows.
    #[derive(Clone, Debug)]
    enum Sample {
        Hello(Hello),
        Eager(Vec<u8>),
        Batch(Vec<Vec<u8>>),
        Rts(Vec<u8>, Vec<RegionDesc>),
        Fin,
        Credit,
    }

    fn desc() -> impl Strategy<Value = RegionDesc> {
        (any::<u64>(), any::<u64>(), 0u64..1 << 40, 0u8..4).prop_map(|(key, addr, len, a)| {
            RegionDesc {
                key,
                addr,
                len,
                access: Access::from_bits(a),
            }
        })
    }

    fn sample() -> impl Strategy<Value = Sample> {
        prop_oneof![
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<bool>()).prop_map(
                |(n, len, max, batches)| {
                    Sample::Hello(Hello {
                        recv_buffers: n,
                        recv_buffer_len: len,
                        max_frame_len: max,
                        batches,
                    })
                }
            ),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Sample::Eager),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..100), 1..6)
                .prop_map(Sample::Batch),
            (
                proptest::collection::vec(any::<u8>(), 0..=MAX_INLINE_HEAD),
                proptest::collection::vec(desc(), 0..=MAX_SEGMENTS)
            )
                .prop_map(|(head, segs)| Sample::Rts(head, segs)),
            Just(Sample::Fin),
            Just(Sample::Credit),
        ]
    }

    /// Encodes `sample` as its sender does; the message and its header.
    fn encode(sample: &Sample, credits: u16, id: u32) -> (Vec<u8>, Header) {
        let mut buf = vec![0u8; 1024];
        let (kind, n) = match sample {
            Sample::Hello(hello) => (HELLO, put_hello(&mut buf, credits, hello)),
            Sample::Eager(frame) => {
                put_header(&mut buf, EAGER, credits, id);
                buf[HEADER_LEN..HEADER_LEN + frame.len()].copy_from_slice(frame);
                (EAGER, HEADER_LEN + frame.len())
            }
            Sample::Batch(frames) => {
                put_header(&mut buf, BATCH, credits, id);
                let mut at = HEADER_LEN;
                for frame in frames {
                    let payload = rpc_core::Payload::from(bytes::Bytes::copy_from_slice(frame));
                    at = put_batch_entry(&mut buf, at, &[], &payload);
                }
                (BATCH, at)
            }
            Sample::Rts(head, segs) => {
                let frame_len = head.len() as u64 + segs.iter().map(|s| s.len).sum::<u64>();
                (RTS, put_rts(&mut buf, credits, id, frame_len, head, segs))
            }
            Sample::Fin => {
                put_header(&mut buf, FIN, credits, id);
                (FIN, HEADER_LEN)
            }
            Sample::Credit => {
                put_header(&mut buf, CREDIT, credits, id);
                (CREDIT, HEADER_LEN)
            }
        };
        buf.truncate(n);
        // HELLO's header carries no id.
        let id = if kind == HELLO { 0 } else { id };
        (buf, Header { kind, credits, id })
    }

    /// What every successful decode promises the link, whatever the input: the RTS
    /// limits hold and its parts add up to its frame length without overflow.
    fn check_promises(msg: &[u8]) -> Result<(), TestCaseError> {
        if let Ok((_, Message::Batch(batch))) = decode(msg) {
            let frames: Vec<&[u8]> = batch.frames().collect();
            prop_assert_eq!(frames.len(), batch.frames);
            prop_assert!(frames
                .iter()
                .all(|f| !f.is_empty() && f.len() <= batch.longest));
            let total: usize = frames.iter().map(|f| f.len() + ENTRY_LEN).sum();
            prop_assert_eq!(total, batch.body.len(), "the entries fill the message");
        }
        if let Ok((_, Message::Rts(rts))) = decode(msg) {
            prop_assert!(rts.head.len() <= MAX_INLINE_HEAD);
            let segs: Vec<_> = rts.segments().collect();
            prop_assert!(segs.len() <= MAX_SEGMENTS);
            prop_assert_eq!(
                segs.len() * DESC_LEN,
                rts.descs.len(),
                "every descriptor decodes"
            );
            let total = segs
                .iter()
                .try_fold(rts.head.len() as u64, |sum, s| sum.checked_add(s.len));
            prop_assert_eq!(total, Some(rts.frame_len));
            prop_assert!(rts_len(rts.head.len(), segs.len()) <= msg.len());
        }
        Ok(())
    }

    /// Values that break length arithmetic: zero, one, the edges of each width.
    fn edge() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(u64::from(u16::MAX)),
            Just(u64::from(u32::MAX)),
            Just(u64::from(u32::MAX) + 1),
            Just(u64::MAX - 1),
            Just(u64::MAX),
            Just(MAX_INLINE_HEAD as u64 + 1),
            Just(MAX_SEGMENTS as u64 + 1),
            any::<u64>(),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            check_promises(&bytes)?;
        }

        #[test]
        fn valid_messages_round_trip(sample in sample(), credits in any::<u16>(), id in any::<u32>()) {
            let (msg, header) = encode(&sample, credits, id);
            let (got_header, message) = decode(&msg).unwrap();
            prop_assert_eq!(got_header, header);
            match (&sample, message) {
                (Sample::Hello(want), Message::Hello(got)) => prop_assert_eq!(&got, want),
                (Sample::Eager(want), Message::Eager(got)) => prop_assert_eq!(got, &want[..]),
                (Sample::Batch(want), Message::Batch(got)) => {
                    prop_assert_eq!(got.frames, want.len());
                    let body = got.body.len();
                    let got: Vec<&[u8]> = got.frames().collect();
                    let total: usize = got.iter().map(|f| f.len() + ENTRY_LEN).sum();
                    prop_assert_eq!(total, body, "a checked body ends with a whole entry");
                    prop_assert_eq!(got, want.iter().map(|f| &f[..]).collect::<Vec<_>>());
                }
                (Sample::Rts(head, segs), Message::Rts(rts)) => {
                    prop_assert_eq!(rts.head, &head[..]);
                    prop_assert_eq!(&rts.segments().collect::<Vec<_>>(), segs);
                }
                (Sample::Fin, Message::Fin) | (Sample::Credit, Message::Credit) => {}
                (want, got) => prop_assert!(false, "{:?} decoded as {:?}", want, got),
            }
        }

        /// Cut anywhere: an error, or (for messages whose body may end anywhere) a
        /// shorter message; never a panic, never a read past the end.
        #[test]
        fn truncations_are_errors(sample in sample()) {
            let (msg, _) = encode(&sample, 1, 2);
            for cut in 0..msg.len() {
                let short = &msg[..cut];
                check_promises(short)?;
                let fixed = match &sample {
                    Sample::Eager(_) | Sample::Fin | Sample::Credit => HEADER_LEN,
                    Sample::Hello(_) => HEADER_LEN + HELLO_LEN,
                    Sample::Rts(..) => msg.len(),
                    // A batch cut after one of its entries (not the first) is a
                    // shorter batch.
                    Sample::Batch(frames) => {
                        let mut end = HEADER_LEN;
                        let ends: Vec<usize> = frames
                            .iter()
                            .map(|f| {
                                end += ENTRY_LEN + f.len();
                                end
                            })
                            .collect();
                        if ends.contains(&cut) { 0 } else { msg.len() }
                    }
                };
                if cut < fixed {
                    prop_assert!(decode(short).is_err(), "cut at {} of {}", cut, msg.len());
                }
            }
        }

        /// One field (any 1, 2, 4 or 8 bytes at any place) set to an edge value.
        #[test]
        fn mutated_fields_never_panic(
            sample in sample(),
            at in any::<prop::sample::Index>(),
            width in prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
            value in edge(),
        ) {
            let (mut msg, _) = encode(&sample, 1, 2);
            let at = at.index(msg.len());
            let width = width.min(msg.len() - at);
            msg[at..at + width].copy_from_slice(&value.to_be_bytes()[8 - width..]);
            check_promises(&msg)?;
        }

        /// An RTS whose lengths disagree (frame length, inline length, region count or a
        /// region's length set to an edge value) is a protocol error, not a panic or a
        /// huge claim passed on.
        #[test]
        fn inconsistent_rts_lengths_are_protocol_errors(
            head in proptest::collection::vec(any::<u8>(), 0..64),
            segs in proptest::collection::vec(desc(), 1..=MAX_SEGMENTS),
            field in 0usize..4,
            value in edge(),
        ) {
            let sample = Sample::Rts(head.clone(), segs.clone());
            let (mut msg, _) = encode(&sample, 0, 1);
            let body = HEADER_LEN;
            match field {
                0 => msg[body..body + 8].copy_from_slice(&value.to_be_bytes()),
                1 => msg[body + 8..body + 10].copy_from_slice(&(value as u16).to_be_bytes()),
                2 => msg[body + 10..body + 12].copy_from_slice(&(value as u16).to_be_bytes()),
                _ => {
                    let len_at = body + RTS_FIXED + head.len() + 16;
                    msg[len_at..len_at + 8].copy_from_slice(&value.to_be_bytes());
                }
            }
            match decode(&msg) {
                // Only a value that happens to keep the message consistent decodes.
                Ok((_, Message::Rts(_))) => check_promises(&msg)?,
                Ok((_, other)) => prop_assert!(false, "decoded as {:?}", other),
                Err(err) => prop_assert_eq!(err.kind(), ErrorKind::Protocol, "{}", err),
            }
        }
    }

    #[test]
    fn a_huge_rendezvous_frame_is_announced_consistently_and_left_to_the_limit() {
        // The decoder allocates nothing: an RTS for a frame of u64::MAX bytes decodes
        // (the link refuses it against max_frame_len before it allocates), while parts
        // that add up past u64::MAX are refused here.
        let mut buf = [0u8; 512];
        let seg = |len| RegionDesc {
            key: 1,
            addr: 0,
            len,
            access: Access::READ,
        };
        let n = put_rts(&mut buf, 0, 1, u64::MAX, b"", &[seg(u64::MAX)]);
        let Ok((_, Message::Rts(rts))) = decode(&buf[..n]) else {
            panic!("a consistent RTS decodes")
        };
        assert_eq!(rts.frame_len, u64::MAX);
        let n = put_rts(&mut buf, 0, 1, u64::MAX, b"x", &[seg(u64::MAX)]);
        let err = decode(&buf[..n]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
        assert!(err.to_string().contains("overflow"), "{err}");
    }
}
