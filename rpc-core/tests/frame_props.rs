//! Property tests of the frame codec: every frame round-trips, and no input makes the
//! decoder panic.

use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use rpc_core::{
    frame::{
        CallKey, DataFrame, DecodeLimits, Frame, GoAwayCode, GoAwayFrame, RequestFrame,
        ResponseFrame,
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
