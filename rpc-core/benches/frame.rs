//! Micro-benchmarks: frame header encode/decode (the fixed binary layout against the
//! same fields as a protobuf message, which is the measurement behind the header
//! encoding decision in docs/wire.md) and the pending-call table.
//!
//! Run with `cargo bench -p rpc-core --bench frame`.

// criterion_group! generates undocumented functions.
#![allow(missing_docs)]

use std::{hint::black_box, time::Duration};

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion};
use rpc_core::{
    client::pending::PendingTable,
    frame::{self, DecodeLimits, Frame},
    Metadata,
};

/// The REQUEST header fields as a protobuf message: the alternative we measured.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoRequestHeader {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(string, tag = "2")]
    method: String,
    #[prost(uint64, optional, tag = "3")]
    timeout_us: Option<u64>,
    #[prost(message, repeated, tag = "4")]
    metadata: Vec<ProtoEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

const METHOD: &str = "rpc.examples.v1.Echo/Say";

fn metadata(n: usize) -> Metadata {
    let mut md = Metadata::new();
    for i in 0..n {
        md.append(format!("x-key-{i}"), format!("value number {i}"))
            .unwrap();
    }
    md
}

fn proto_header(id: u64, md: &Metadata) -> ProtoRequestHeader {
    ProtoRequestHeader {
        id,
        method: METHOD.into(),
        timeout_us: Some(250_000),
        metadata: md
            .iter()
            .map(|(k, v)| ProtoEntry {
                key: k.to_owned(),
                value: Bytes::copy_from_slice(v.as_bytes()),
            })
            .collect(),
    }
}

fn header_encoding(c: &mut Criterion) {
    for n in [0usize, 4] {
        let md = metadata(n);
        let mut buf = BytesMut::with_capacity(512);
        c.bench_function(&format!("header/encode/fixed/{n}-metadata"), |b| {
            b.iter(|| {
                buf.clear();
                frame::encode_request_header(
                    &mut buf,
                    black_box(7),
                    METHOD,
                    Some(Duration::from_millis(250)),
                    &md,
                );
                black_box(buf.len())
            })
        });
        c.bench_function(&format!("header/encode/protobuf/{n}-metadata"), |b| {
            b.iter(|| {
                buf.clear();
                // The protobuf path needs the owned message built first, as a sender would.
                let header = proto_header(black_box(7), &md);
                prost::Message::encode_length_delimited(&header, &mut buf).unwrap();
                black_box(buf.len())
            })
        });

        let mut fixed = BytesMut::new();
        frame::encode_request_header(&mut fixed, 7, METHOD, Some(Duration::from_millis(250)), &md);
        fixed.extend_from_slice(&[0u8; 32]);
        let fixed = fixed.freeze();
        let limits = DecodeLimits::default();
        c.bench_function(&format!("header/decode/fixed/{n}-metadata"), |b| {
            b.iter(|| black_box(Frame::decode(black_box(fixed.clone()), &limits).unwrap()))
        });
        let mut proto = BytesMut::new();
        prost::Message::encode_length_delimited(&proto_header(7, &md), &mut proto).unwrap();
        proto.extend_from_slice(&[0u8; 32]);
        let proto = proto.freeze();
        c.bench_function(&format!("header/decode/protobuf/{n}-metadata"), |b| {
            b.iter(|| {
                let mut buf = black_box(proto.clone());
                let header: ProtoRequestHeader =
                    prost::Message::decode_length_delimited(&mut buf).unwrap();
                black_box((header, buf))
            })
        });
    }
}

fn pending_table(c: &mut Criterion) {
    // 256 calls in flight, answered in another order than they were sent.
    let mut table = PendingTable::new();
    let mut next = 0u64;
    for _ in 0..256 {
        table.insert(next, next).unwrap();
        next += 1;
    }
    c.bench_function("pending/insert+complete/256-in-flight", |b| {
        b.iter(|| {
            let id = next;
            next += 1;
            table.insert(id, id).unwrap();
            // Complete a call sent 256 calls ago, scrambled within blocks of 64 (37 is
            // odd, so `off * 37 % 64` visits every offset of a block exactly once).
            let old = id - 256;
            let done = (old & !63) | ((old & 63) * 37 % 64);
            black_box(table.complete(done).expect("completed once"))
        })
    });
}

criterion_group!(benches, header_encoding, pending_table);
criterion_main!(benches);
