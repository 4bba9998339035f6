//! The datagrams of the UDP transport (docs/wire.md, "UDP"): a whole frame, a fragment
//! of a larger frame, an acknowledgement of fragments, or a control datagram of the
//! address validation handshake. Plain data, no I/O; every decoder checks lengths
//! before it reads and never panics.

use bytes::{BufMut, Bytes};

/// First byte of a datagram that is one whole frame: the frame's own version byte.
pub const WHOLE: u8 = rpc_core::frame::VERSION;
/// First byte of a fragment.
pub const FRAGMENT: u8 = 0x81;
/// First byte of an acknowledgement.
pub const ACK: u8 = 0x82;
/// First byte of a control datagram (the handshake: HELLO, RETRY, ACCEPT, REFUSE,
/// CLOSE).
pub const CONTROL: u8 = 0x83;

/// Length of every control datagram: fixed, so that no answer of the server to a
/// datagram from an unvalidated address is larger than that datagram.
pub const CONTROL_LEN: usize = 32;
/// Length of an address validation token.
pub const TOKEN_LEN: usize = 16;

/// Length of a fragment's header.
pub const FRAGMENT_HEADER_LEN: usize = 24;
/// Length of an acknowledgement's fixed part (the bitmap follows).
pub const ACK_HEADER_LEN: usize = 16;
/// Most bitmap bytes in one acknowledgement: it covers the 256 fragments after the
/// cumulative count, so a sender never has a fragment in flight further ahead.
pub const MAX_ACK_BITMAP: usize = 32;
/// Smallest `chunk` of a message of more than one fragment: below it, the per-fragment
/// bookkeeping of a hostile sender's message would outweigh its data.
pub const MIN_CHUNK: u32 = 64;
/// Fragments an acknowledgement's bitmap can describe.
pub const ACK_RANGE: u32 = (MAX_ACK_BITMAP * 8) as u32;

/// Acknowledgement flag: the whole message arrived (and was delivered).
pub const ACK_COMPLETE: u8 = 0x01;
/// Acknowledgement flag: the message is refused for good (it claims a length over the
/// receiver's limit); the sender must stop sending it.
pub const ACK_REFUSED: u8 = 0x02;
/// Acknowledgement flag: the receiver gave the message up (it stayed incomplete past
/// the reassembly timeout); the sender must stop sending it.
pub const ACK_ABORTED: u8 = 0x04;
/// Acknowledgement flag: the acknowledgement ends with the acknowledging side's
/// association tag (2 bytes after the bitmap). Set by [`Ack::encode`] when
/// [`Ack::tag`] is not 0; not kept in [`Ack::flags`] by [`Datagram::decode`].
pub const ACK_TAGGED: u8 = 0x08;

/// A fragment's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentHeader {
    /// The sender's association tag: random, not 0, the same for every datagram of the
    /// sender's side of one association; 0 if the sender uses none. A receiver that
    /// sees its peer's tag change knows the peer started over (a restarted process on
    /// the same address) and that message numbers no longer line up.
    pub tag: u16,
    /// The message's number, per sender and association, increasing from 1.
    pub message: u64,
    /// Length of the whole frame.
    pub total: u32,
    /// Frame bytes in every fragment but possibly the last.
    pub chunk: u32,
    /// This fragment's index: it carries bytes `index * chunk ..` of the frame.
    pub index: u32,
}

impl FragmentHeader {
    /// How many fragments the message has.
    pub fn count(&self) -> u32 {
        fragment_count(self.total as usize, self.chunk as usize)
    }

    /// The frame bytes this fragment must carry: where they start and how many.
    pub fn span(&self) -> (usize, usize) {
        let start = self.index as usize * self.chunk as usize;
        let len = (self.total as usize - start).min(self.chunk as usize);
        (start, len)
    }

    /// Appends the header to `buf`.
    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u8(FRAGMENT);
        buf.put_u8(0);
        buf.put_u16(self.tag);
        buf.put_u64(self.message);
        buf.put_u32(self.total);
        buf.put_u32(self.chunk);
        buf.put_u32(self.index);
    }
}

/// Fragments of `chunk` bytes needed for `total` bytes.
pub fn fragment_count(total: usize, chunk: usize) -> u32 {
    total.div_ceil(chunk.max(1)) as u32
}

/// An acknowledgement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    /// [`ACK_COMPLETE`], [`ACK_REFUSED`], [`ACK_ABORTED`] or none.
    pub flags: u8,
    /// The acknowledging side's association tag (see [`FragmentHeader::tag`]); 0 for
    /// none.
    pub tag: u16,
    /// The message acknowledged.
    pub message: u64,
    /// Every fragment with a lower index has arrived.
    pub cumulative: u32,
    /// Bit `j` (most significant bit of byte 0 first) says fragment
    /// `cumulative + 1 + j` has arrived.
    pub bitmap: Bytes,
}

impl Ack {
    /// Whether fragment `index` is acknowledged by this acknowledgement.
    pub fn covers(&self, index: u32) -> bool {
        if self.flags & ACK_COMPLETE != 0 || index < self.cumulative {
            return true;
        }
        if index == self.cumulative {
            return false; // the first missing one
        }
        let j = index - self.cumulative - 1;
        let (byte, bit) = (j as usize / 8, j % 8);
        self.bitmap
            .get(byte)
            .is_some_and(|b| b & (0x80 >> bit) != 0)
    }

    /// The highest index the bitmap says has arrived, if any.
    pub fn highest(&self) -> Option<u32> {
        let (byte, b) = self
            .bitmap
            .iter()
            .enumerate()
            .rev()
            .find(|(_, b)| **b != 0)?;
        let offset = byte as u32 * 8 + (7 - b.trailing_zeros());
        self.cumulative.checked_add(1 + offset)
    }

    /// Appends the acknowledgement to `buf`.
    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u8(ACK);
        let tagged = if self.tag != 0 { ACK_TAGGED } else { 0 };
        buf.put_u8(self.flags | tagged);
        buf.put_u16(self.bitmap.len() as u16);
        buf.put_u64(self.message);
        buf.put_u32(self.cumulative);
        buf.put_slice(&self.bitmap);
        if self.tag != 0 {
            buf.put_u16(self.tag);
        }
    }

    /// Its length encoded.
    pub fn encoded_len(&self) -> usize {
        ACK_HEADER_LEN + self.bitmap.len() + if self.tag != 0 { 2 } else { 0 }
    }
}

/// What a control datagram says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlKind(pub u8);

impl ControlKind {
    /// Client → server: opens an association, with the token of a RETRY once it has
    /// one (all zeros before).
    pub const HELLO: ControlKind = ControlKind(1);
    /// Server → client: show that you receive at your address; send HELLO again with
    /// this token.
    pub const RETRY: ControlKind = ControlKind(2);
    /// Server → client: the association is open; `tag` is the server's tag.
    pub const ACCEPT: ControlKind = ControlKind(3);
    /// Server → client: no association can be opened now (every slot holds an active
    /// peer).
    pub const REFUSE: ControlKind = ControlKind(4);
    /// Client → server: the client is done with the association; forget it.
    pub const CLOSE: ControlKind = ControlKind(5);
}

/// A control datagram: the address validation handshake (docs/wire.md, "Opening an
/// association").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// HELLO, RETRY, ACCEPT, REFUSE or CLOSE; other values are dropped by receivers.
    pub kind: ControlKind,
    /// HELLO: the client's association tag; ACCEPT: the server's; otherwise 0.
    pub tag: u16,
    /// The association's client id: random, not 0, chosen by the client for each
    /// association and echoed by the server. It tells a new client on a reused address
    /// from its predecessor.
    pub client: u64,
    /// HELLO (after a RETRY) and RETRY: the server's address validation token; zeros
    /// otherwise.
    pub token: [u8; TOKEN_LEN],
}

impl Control {
    /// A control datagram of `kind` with no token.
    pub fn new(kind: ControlKind, tag: u16, client: u64) -> Control {
        Control {
            kind,
            tag,
            client,
            token: [0; TOKEN_LEN],
        }
    }

    /// Appends the datagram ([`CONTROL_LEN`] bytes) to `buf`.
    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u8(CONTROL);
        buf.put_u8(self.kind.0);
        buf.put_u16(self.tag);
        buf.put_u32(0);
        buf.put_u64(self.client);
        buf.put_slice(&self.token);
    }

    /// The datagram encoded.
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = bytes::BytesMut::with_capacity(CONTROL_LEN);
        self.encode(&mut buf);
        buf.freeze()
    }
}

/// One received datagram, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Datagram {
    /// A whole frame (not checked further here: the core decodes it).
    Whole(Bytes),
    /// A fragment and the frame bytes it carries.
    Fragment(FragmentHeader, Bytes),
    /// An acknowledgement.
    Ack(Ack),
    /// A control datagram of the handshake.
    Control(Control),
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Empty, or a first byte that is no datagram type.
    UnknownType,
    /// Shorter than its header, or a length field that disagrees with its size.
    BadLength,
    /// A fragment whose fields contradict each other (zero chunk, index past the
    /// end, ...).
    BadFragment,
}

impl Datagram {
    /// Decodes a datagram. The frame length limit is not checked here (the receiver
    /// answers an oversized fragment with [`ACK_REFUSED`]).
    pub fn decode(datagram: Bytes) -> Result<Datagram, Malformed> {
        match datagram.first() {
            Some(&WHOLE) => {
                if datagram.len() < rpc_core::frame::HEADER_LEN {
                    return Err(Malformed::BadLength);
                }
                Ok(Datagram::Whole(datagram))
            }
            Some(&FRAGMENT) => {
                if datagram.len() < FRAGMENT_HEADER_LEN {
                    return Err(Malformed::BadLength);
                }
                let d = &datagram[..];
                let header = FragmentHeader {
                    tag: u16::from_be_bytes([d[2], d[3]]),
                    message: u64::from_be_bytes(d[4..12].try_into().unwrap_or_default()),
                    total: u32::from_be_bytes(d[12..16].try_into().unwrap_or_default()),
                    chunk: u32::from_be_bytes(d[16..20].try_into().unwrap_or_default()),
                    index: u32::from_be_bytes(d[20..24].try_into().unwrap_or_default()),
                };
                if header.total == 0
                    || header.chunk == 0
                    || (header.chunk < MIN_CHUNK && header.total > header.chunk)
                    || header.index >= header.count()
                {
                    return Err(Malformed::BadFragment);
                }
                let (_, len) = header.span();
                if datagram.len() - FRAGMENT_HEADER_LEN != len {
                    return Err(Malformed::BadLength);
                }
                Ok(Datagram::Fragment(
                    header,
                    datagram.slice(FRAGMENT_HEADER_LEN..),
                ))
            }
            Some(&ACK) => {
                if datagram.len() < ACK_HEADER_LEN {
                    return Err(Malformed::BadLength);
                }
                let d = &datagram[..];
                let bitmap_len = usize::from(u16::from_be_bytes([d[2], d[3]]));
                let tagged = d[1] & ACK_TAGGED != 0;
                let tag_len = if tagged { 2 } else { 0 };
                if bitmap_len > MAX_ACK_BITMAP
                    || datagram.len() != ACK_HEADER_LEN + bitmap_len + tag_len
                {
                    return Err(Malformed::BadLength);
                }
                let bitmap_end = ACK_HEADER_LEN + bitmap_len;
                let tag = if tagged {
                    u16::from_be_bytes([d[bitmap_end], d[bitmap_end + 1]])
                } else {
                    0
                };
                Ok(Datagram::Ack(Ack {
                    // Bits other than these are ignored (docs/wire.md §1.2): a peer
                    // that sets one is read as if it had not.
                    flags: d[1] & (ACK_COMPLETE | ACK_REFUSED | ACK_ABORTED),
                    tag,
                    message: u64::from_be_bytes(d[4..12].try_into().unwrap_or_default()),
                    cumulative: u32::from_be_bytes(d[12..16].try_into().unwrap_or_default()),
                    bitmap: datagram.slice(ACK_HEADER_LEN..bitmap_end),
                }))
            }
            Some(&CONTROL) => {
                if datagram.len() != CONTROL_LEN {
                    return Err(Malformed::BadLength);
                }
                let d = &datagram[..];
                let mut token = [0; TOKEN_LEN];
                token.copy_from_slice(&d[16..CONTROL_LEN]);
                Ok(Datagram::Control(Control {
                    kind: ControlKind(d[1]),
                    tag: u16::from_be_bytes([d[2], d[3]]),
                    client: u64::from_be_bytes(d[8..16].try_into().unwrap_or_default()),
                    token,
                }))
            }
            _ => Err(Malformed::UnknownType),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use proptest::prelude::*;

    fn fragment(h: FragmentHeader, data: &[u8]) -> Bytes {
        let mut buf = BytesMut::new();
        h.encode(&mut buf);
        buf.extend_from_slice(data);
        buf.freeze()
    }

    #[test]
    fn fragments_round_trip_and_are_checked() {
        let h = FragmentHeader {
            tag: 0xbeef,
            message: 7,
            total: 150,
            chunk: 64,
            index: 2,
        };
        assert_eq!(h.count(), 3);
        assert_eq!(h.span(), (128, 22));
        let data = [9u8; 22];
        let d = Datagram::decode(fragment(h, &data)).unwrap();
        assert_eq!(d, Datagram::Fragment(h, Bytes::copy_from_slice(&data)));
        // The last fragment must carry exactly the rest.
        assert_eq!(
            Datagram::decode(fragment(h, &[9u8; 23])),
            Err(Malformed::BadLength)
        );
        let past = FragmentHeader { index: 3, ..h };
        assert_eq!(
            Datagram::decode(fragment(past, b"")),
            Err(Malformed::BadFragment)
        );
        let zero = FragmentHeader { chunk: 0, ..h };
        assert_eq!(
            Datagram::decode(fragment(zero, b"")),
            Err(Malformed::BadFragment)
        );
        let tiny = FragmentHeader {
            chunk: 4,
            total: 100,
            index: 0,
            ..h
        };
        assert_eq!(
            Datagram::decode(fragment(tiny, b"abcd")),
            Err(Malformed::BadFragment)
        );
        let whole = FragmentHeader {
            chunk: 4,
            total: 3,
            index: 0,
            ..h
        };
        assert!(Datagram::decode(fragment(whole, b"abc")).is_ok());
    }

    #[test]
    fn acks_at_the_end_of_the_index_range_do_not_overflow() {
        let ack = Ack {
            flags: 0,
            tag: 0,
            message: 1,
            cumulative: u32::MAX,
            bitmap: Bytes::from_static(&[0xff; 4]),
        };
        assert!(!ack.covers(u32::MAX));
        assert_eq!(ack.highest(), None);
    }

    #[test]
    fn acks_carry_the_tag_after_the_bitmap_when_flagged() {
        for tag in [0u16, 0x1234] {
            let ack = Ack {
                flags: ACK_COMPLETE,
                tag,
                message: 9,
                cumulative: 2,
                bitmap: Bytes::from_static(&[0b1000_0000]),
            };
            let mut buf = BytesMut::new();
            ack.encode(&mut buf);
            assert_eq!(buf.len(), ack.encoded_len());
            assert_eq!(buf[1] & ACK_TAGGED != 0, tag != 0);
            assert_eq!(Datagram::decode(buf.freeze()), Ok(Datagram::Ack(ack)));
        }
        // Flagged as tagged but without the two bytes: a length error, no panic.
        let mut short = vec![ACK, ACK_TAGGED, 0, 0];
        short.resize(ACK_HEADER_LEN + 1, 0);
        assert_eq!(
            Datagram::decode(Bytes::from(short)),
            Err(Malformed::BadLength)
        );
    }

    /// Reserved flag bits of an acknowledgement are ignored (docs/wire.md §1.2): an
    /// acknowledgement of nothing with one set is still one (it once was not, and a
    /// sender whose receiver was out of room could time the association out).
    #[test]
    fn reserved_ack_flags_are_ignored() {
        let nothing = Ack {
            flags: 0,
            tag: 0,
            message: 7,
            cumulative: 0,
            bitmap: Bytes::new(),
        };
        let mut buf = BytesMut::new();
        nothing.encode(&mut buf);
        buf[1] |= 0xf0;
        assert_eq!(Datagram::decode(buf.freeze()), Ok(Datagram::Ack(nothing)));
    }

    #[test]
    fn acks_round_trip_and_say_what_they_cover() {
        let ack = Ack {
            flags: 0,
            tag: 0,
            message: 1,
            cumulative: 3,
            bitmap: Bytes::from_static(&[0b0100_0000, 0b0000_0001]),
        };
        let mut buf = BytesMut::new();
        ack.encode(&mut buf);
        assert_eq!(
            Datagram::decode(buf.freeze()),
            Ok(Datagram::Ack(ack.clone()))
        );
        assert!(ack.covers(0) && ack.covers(2));
        assert!(!ack.covers(3) && !ack.covers(4));
        assert!(ack.covers(5)); // bit 1
        assert!(ack.covers(19)); // bit 15
        assert!(!ack.covers(20));
        assert_eq!(ack.highest(), Some(19));
    }

    #[test]
    fn control_datagrams_round_trip_at_their_fixed_length() {
        let hello = Control {
            kind: ControlKind::HELLO,
            tag: 0x1234,
            client: 0x0102_0304_0506_0708,
            token: [7; TOKEN_LEN],
        };
        let bytes = hello.to_bytes();
        assert_eq!(bytes.len(), CONTROL_LEN);
        assert_eq!(
            Datagram::decode(bytes.clone()),
            Ok(Datagram::Control(hello))
        );
        assert_eq!(
            Datagram::decode(bytes.slice(..CONTROL_LEN - 1)),
            Err(Malformed::BadLength)
        );
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(
            Datagram::decode(Bytes::from(long)),
            Err(Malformed::BadLength)
        );
    }

    #[test]
    fn unknown_and_short_datagrams_are_refused() {
        assert_eq!(Datagram::decode(Bytes::new()), Err(Malformed::UnknownType));
        assert_eq!(
            Datagram::decode(Bytes::from_static(b"\x00abc")),
            Err(Malformed::UnknownType)
        );
        assert_eq!(
            Datagram::decode(Bytes::from_static(b"\x01abc")),
            Err(Malformed::BadLength)
        );
        assert_eq!(
            Datagram::decode(Bytes::from_static(b"\x81abc")),
            Err(Malformed::BadLength)
        );
        let mut long_bitmap = vec![ACK, 0, 0, 40];
        long_bitmap.resize(ACK_HEADER_LEN + 40, 0);
        assert_eq!(
            Datagram::decode(Bytes::from(long_bitmap)),
            Err(Malformed::BadLength)
        );
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Datagram::decode(Bytes::from(bytes));
        }

        #[test]
        fn fragment_spans_tile_the_frame(total in 1u32..100_000, chunk in 1u32..5_000) {
            let h = FragmentHeader { tag: 0, message: 1, total, chunk, index: 0 };
            let mut next = 0;
            for index in 0..h.count() {
                let (start, len) = FragmentHeader { index, ..h }.span();
                prop_assert_eq!(start, next);
                prop_assert!(len >= 1 && len <= chunk as usize);
                next = start + len;
            }
            prop_assert_eq!(next, total as usize);
        }
    }
}
