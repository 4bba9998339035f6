//! Property tests of the frame codec: every frame round-trips, and no input makes the
//! decoder panic.

use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use rpc_core::{
    frame::{
        BulkFrame, BulkReplyFrame, CallKey, DataFrame, DecodeLimits, Frame, FrameError, GoAwayCode,
        GoAwayFrame, RequestFrame, ResponseFrame,
    },
    ByteStr, Code, Metadata, MetadataValue,
};

fn key() -> impl Strategy<Value = String> {
    "[a-z0-9_.-]{1,20}"
}

fn metadata() -> impl Strategy<Value = Metadata> {
    prop::collection::vec(
        (
            key(),
            any::<String>(),
            prop::collection::vec(any::<u8>(), 0..20),
        ),
        0..6,
    )
    .prop_map(|entries| {
        let mut md = Metadata::new();
        for (k, text, bin) in entries {
            if k.ends_with("-bin") {
                md.append(k, MetadataValue::Binary(bin.into())).unwrap();
            } else {
                md.append(k, text).unwrap();
            }
        }
        md
    })
}

fn method() -> impl Strategy<Value = String> {
    ("[a-zA-Z0-9_.]{1,30}", "[a-zA-Z0-9_]{1,20}").prop_map(|(s, m)| format!("{s}/{m}"))
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<u64>(),
            method(),
            prop::option::of(0u64..u64::MAX / 2),
            prop::option::of((any::<u128>(), any::<u64>(), any::<u32>())),
            metadata(),
            bytes(64),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |(id, method, micros, key, metadata, payload, streaming, compressed)| {
                    Frame::Request(RequestFrame {
                        id,
                        method: ByteStr::from(method),
                        timeout: micros.map(Duration::from_micros),
                        call_key: key.map(|(client, call, attempt)| CallKey {
                            client,
                            call,
                            attempt,
                        }),
                        metadata,
                        streaming,
                        compressed,
                        // A streaming REQUEST carries no payload.
                        payload: if streaming { Bytes::new() } else { payload },
                    })
                }
            ),
        (
            any::<u64>(),
            any::<u32>(),
            any::<String>(),
            bytes(16),
            metadata(),
            bytes(64),
            any::<bool>()
        )
            .prop_map(
                |(id, code, message, details, metadata, payload, compressed)| {
                    Frame::Response(ResponseFrame {
                        id,
                        code: Code::from_u32(code),
                        message: ByteStr::from(message),
                        details,
                        metadata,
                        compressed,
                        payload,
                    })
                }
            ),
        (
            any::<u64>(),
            any::<bool>(),
            prop::option::of(metadata()),
            prop::option::of(bytes(64)),
            any::<bool>()
        )
            .prop_map(|(id, end_stream, metadata, message, compressed)| {
                Frame::Data(DataFrame {
                    id,
                    end_stream,
                    metadata,
                    message,
                    compressed,
                })
            }),
        (any::<u64>(), 1u32..).prop_map(|(id, increment)| Frame::Window { id, increment }),
        any::<u64>().prop_map(|id| Frame::Cancel { id }),
        (any::<u64>(), any::<u32>(), "\\PC{0,40}").prop_map(|(last_id, code, reason)| {
            Frame::GoAway(GoAwayFrame {
                last_id,
                code: GoAwayCode(code),
                reason: ByteStr::from(reason),
            })
        }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            prop::option::of(bytes(64))
        )
            .prop_map(|(id, token, offset, len, data)| {
                // A write carries exactly `len` bytes; a read none.
                Frame::Bulk(match data {
                    Some(data) => BulkFrame {
                        id,
                        write: true,
                        token,
                        offset,
                        len: data.len() as u32,
                        data,
                    },
                    None => BulkFrame {
                        id,
                        write: false,
                        token,
                        offset,
                        len,
                        data: Bytes::new(),
                    },
                })
            }),
        (any::<u64>(), any::<u32>(), any::<String>(), bytes(64)).prop_map(
            |(id, code, message, data)| {
                Frame::BulkReply(BulkReplyFrame {
                    id,
                    code: Code::from_u32(code),
                    message: ByteStr::from(message),
                    data,
                })
            }
        ),
        (any::<u64>(), bytes(8)).prop_map(|(id, payload)| Frame::Ping { id, payload }),
        (any::<u64>(), bytes(8)).prop_map(|(id, payload)| Frame::Pong { id, payload }),
    ]
}

/// Length of the part of an encoded frame that comes before its payload.
fn fixed_len(frame: &Frame, encoded_len: usize) -> usize {
    encoded_len
        - match frame {
            Frame::Request(r) => r.payload.len(),
            Frame::Response(r) => r.payload.len(),
            Frame::Ping { payload, .. } | Frame::Pong { payload, .. } => payload.len(),
            Frame::Data(d) => d.message.as_ref().map_or(0, |m| m.len()),
            Frame::Bulk(b) => b.data.len(),
            Frame::BulkReply(r) => r.data.len(),
            _ => 0,
        }
}

proptest! {
    #[test]
    fn every_frame_round_trips(frame in frame()) {
        let encoded = frame.encode().freeze();
        let decoded = Frame::decode(encoded, &DecodeLimits::default()).unwrap();
        prop_assert_eq!(decoded, frame);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Frame::decode(Bytes::from(data), &DecodeLimits::default());
    }

    #[test]
    fn mutated_frames_never_panic(
        frame in frame(),
        at in any::<usize>(),
        byte in any::<u8>(),
        cut in any::<usize>(),
    ) {
        let mut encoded = frame.encode().to_vec();
        let i = at % encoded.len();
        encoded[i] = byte;
        encoded.truncate(cut % (encoded.len() + 1));
        let _ = Frame::decode(Bytes::from(encoded), &DecodeLimits::default());
    }

    #[test]
    fn frames_cut_before_their_payload_are_errors(frame in frame(), cut in any::<usize>()) {
        let encoded = frame.encode().freeze();
        // A payload may legally end anywhere, so cut only into the part before it.
        let cut = cut % fixed_len(&frame, encoded.len());
        prop_assert!(Frame::decode(encoded.slice(..cut), &DecodeLimits::default()).is_err());
    }
}

/// The encoding of `frame` with the big-endian `u32` at `at` replaced by `value`.
fn with_u32_at(frame: &Frame, at: usize, value: u32) -> Bytes {
    let mut encoded = frame.encode().to_vec();
    encoded[at..at + 4].copy_from_slice(&value.to_be_bytes());
    Bytes::from(encoded)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A length field claiming more than the frame holds (up to u32::MAX) is an error
    /// naming the limit or the truncation, decided before anything is read for it;
    /// the decoder borrows slices of the frame, so nothing is allocated for a claim.
    #[test]
    fn huge_claimed_lengths_are_refused(value in prop_oneof![
        Just(u32::MAX), Just(u32::MAX - 1), Just(1u32 << 31), 1u32 << 16..u32::MAX,
    ]) {
        // RESPONSE: header 12, code 4, then `message len u32` at 16; the metadata
        // length follows the (empty) message and details: 16 + 4 + 4 = 24.
        let frame = Frame::Response(ResponseFrame {
            id: 1,
            code: Code::from_u32(0),
            message: ByteStr::from_static(""),
            details: Bytes::new(),
            metadata: rpc_core::Metadata::new(),
            compressed: false,
            payload: Bytes::from_static(b"payload"),
        });
        let limits = DecodeLimits::default();
        prop_assert_eq!(
            Frame::decode(with_u32_at(&frame, 16, value), &limits),
            Err(FrameError::Truncated { field: "message" })
        );
        prop_assert_eq!(
            Frame::decode(with_u32_at(&frame, 20, value), &limits),
            Err(FrameError::Truncated { field: "details" })
        );
        let err = Frame::decode(with_u32_at(&frame, 24, value), &limits).unwrap_err();
        if value as usize > limits.max_metadata_len {
            prop_assert_eq!(
                err,
                FrameError::MetadataTooLarge { len: value as usize, max: limits.max_metadata_len }
            );
        } else {
            prop_assert_eq!(err, FrameError::Truncated { field: "metadata" });
        }
    }
}
