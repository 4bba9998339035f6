//! [`Payload`]: an outgoing encoded message as one or more byte segments, and
//! [`encode`], which builds one from a protobuf message without copying its large
//! `bytes` fields.
//!
//! A received message is always one contiguous [`Bytes`] (a slice of the frame). An
//! outgoing one may be several segments: prost writes a `Bytes` field with
//! `BufMut::put(bytes.clone())`, and [`encode`]'s writer keeps such a field, when it is
//! large, as its own segment instead of copying it. The stream transport then sends
//! the segments with vectored writes, so a 16 MiB `bytes` field goes from the caller's
//! buffer to the socket without a copy in user space.

use bytes::{buf::UninitSlice, Buf, BufMut, Bytes, BytesMut};

/// `Bytes` fields at least this long are kept as their own segment; shorter ones are
/// copied (cheaper than managing a segment).
pub const SEGMENT_THRESHOLD: usize = 32 * 1024;

/// An encoded outgoing message: segments sent back to back. A single-segment payload
/// (the common case) allocates nothing beyond its bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    first: Bytes,
    rest: Vec<Bytes>,
}

impl Payload {
    /// An empty payload.
    pub const fn new() -> Payload {
        Payload {
            first: Bytes::new(),
            rest: Vec::new(),
        }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.first.len() + self.rest.iter().map(Bytes::len).sum::<usize>()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments, in order (empty segments may appear).
    pub fn segments(&self) -> impl Iterator<Item = &Bytes> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }

    /// Appends a segment.
    pub fn push(&mut self, segment: Bytes) {
        if self.first.is_empty() && self.rest.is_empty() {
            self.first = segment;
        } else if !segment.is_empty() {
            self.rest.push(segment);
        }
    }

    /// The payload as one contiguous buffer (copies only if it has several segments).
    pub fn to_bytes(&self) -> Bytes {
        if self.rest.is_empty() {
            return self.first.clone();
        }
        let mut buf = BytesMut::with_capacity(self.len());
        for segment in self.segments() {
            buf.extend_from_slice(segment);
        }
        buf.freeze()
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Payload {
        Payload {
            first: bytes,
            rest: Vec::new(),
        }
    }
}

impl From<&'static str> for Payload {
    fn from(s: &'static str) -> Payload {
        Payload::from(Bytes::from_static(s.as_bytes()))
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::from(Bytes::from(v))
    }
}

/// Encodes a message; large `Bytes` fields become their own segments (no copy).
pub fn encode<M: prost::Message>(message: &M) -> Payload {
    let len = message.encoded_len();
    if len < SEGMENT_THRESHOLD {
        // No field can be long enough to be a segment of its own: one buffer, written
        // through `BytesMut`'s own `BufMut` (a varint byte is a store, not a
        // `put_slice`).
        let mut buf = BytesMut::with_capacity(len);
        // Cannot fail: the buffer grows as needed.
        let _ = message.encode(&mut buf);
        return Payload::from(buf.freeze());
    }
    let mut writer = SegmentWriter {
        // Sized for the whole message when it is small; when it is large, most of it is
        // probably a `Bytes` field that will not be copied, so start small and grow.
        buf: BytesMut::with_capacity(if len <= 2 * SEGMENT_THRESHOLD {
            len
        } else {
            1024
        }),
        payload: Payload::new(),
    };
    // Cannot fail: the writer grows as needed.
    let _ = message.encode(&mut writer);
    writer.finish()
}

/// A `BufMut` that collects small writes into one buffer and keeps large `Buf`s
/// (prost's `Bytes` fields) as separate segments.
struct SegmentWriter {
    buf: BytesMut,
    payload: Payload,
}

impl SegmentWriter {
    fn finish(mut self) -> Payload {
        if !self.buf.is_empty() {
            self.payload.push(self.buf.freeze());
        }
        self.payload
    }
}

// SAFETY: every method delegates to `BytesMut`, whose `BufMut` implementation upholds
// the trait's contract; `put` only adds whole segments and never hands out memory.
#[allow(unsafe_code)]
unsafe impl BufMut for SegmentWriter {
    fn remaining_mut(&self) -> usize {
        self.buf.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialized `cnt` bytes of the chunk returned by
        // `chunk_mut`, which is `self.buf`'s, as `BytesMut::advance_mut` requires.
        unsafe { self.buf.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.buf.chunk_mut()
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        if src.remaining() < SEGMENT_THRESHOLD {
            while src.has_remaining() {
                let chunk = src.chunk();
                self.buf.extend_from_slice(chunk);
                let n = chunk.len();
                src.advance(n);
            }
            return;
        }
        // Close the current small-writes segment, then take `src` whole: for `Bytes`
        // (what prost passes for `Bytes` fields) `copy_to_bytes` is a zero-copy slice.
        if !self.buf.is_empty() {
            let head = self.buf.split().freeze();
            self.payload.push(head);
        }
        let len = src.remaining();
        self.payload.push(src.copy_to_bytes(len));
    }

    fn put_slice(&mut self, src: &[u8]) {
        self.buf.extend_from_slice(src);
    }

    fn put_u8(&mut self, n: u8) {
        self.buf.put_u8(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Blob {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(bytes = "bytes", tag = "2")]
        data: Bytes,
        #[prost(uint32, tag = "3")]
        tail: u32,
    }

    #[test]
    fn large_bytes_fields_are_not_copied() {
        let data = Bytes::from(vec![9u8; 1 << 20]);
        let blob = Blob {
            name: "x".into(),
            data: data.clone(),
            tail: 7,
        };
        let payload = encode(&blob);
        let segments: Vec<&Bytes> = payload.segments().collect();
        assert_eq!(segments.len(), 3, "head, data, tail");
        assert_eq!(
            segments[1].as_ptr(),
            data.as_ptr(),
            "the field's own memory"
        );
        assert_eq!(payload.len(), prost::Message::encoded_len(&blob));
        let decoded: Blob = prost::Message::decode(payload.to_bytes()).unwrap();
        assert_eq!(decoded, blob);
    }

    #[test]
    fn small_messages_are_one_segment() {
        let blob = Blob {
            name: "small".into(),
            data: Bytes::from_static(b"abc"),
            tail: 1,
        };
        let payload = encode(&blob);
        assert_eq!(payload.segments().count(), 1);
        let decoded: Blob = prost::Message::decode(payload.to_bytes()).unwrap();
        assert_eq!(decoded, blob);
    }
}
