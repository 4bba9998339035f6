//! gzip (the `gzip` feature) both ways over the in-memory link, seen on the wire; a
//! gzip bomb stopped at the receiver's limit; zstd and gzip side by side, each side
//! sending with its own algorithm.
#![cfg(feature = "gzip")]

use std::{
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    client::{Channel, ClientCall, ClientReply},
    compress::{Algorithm, Compression},
    frame::{DecodeLimits, Frame},
    link::{mem, Connector, Link, LinkConfig},
    server::{Server, ServerCall, ServerReply},
    Code, Error, Metadata, Payload, Status,
};
use tower::{service_fn, Service, ServiceExt};

/// Every frame the client's links sent (`true`) and received (`false`), whole.
#[derive(Clone, Default)]
struct Wire(Arc<Mutex<Vec<(bool, Bytes)>>>);

impl Wire {
    /// The compressed messages seen going one way.
    fn compressed(&self, sent: bool) -> Vec<Bytes> {
        let frames = self.0.lock().unwrap();
        frames
            .iter()
            .filter(|(s, _)| *s == sent)
            .filter_map(|(_, frame)| {
                match Frame::decode(frame.clone(), &DecodeLimits::default()).unwrap() {
                    Frame::Request(r) if r.compressed => Some(r.payload),
                    Frame::Response(r) if r.compressed => Some(r.payload),
                    _ => None,
                }
            })
            .collect()
    }
}

/// A client link that records what crosses it.
struct Tap {
    inner: mem::MemLink,
    wire: Wire,
}

impl Link for Tap {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        let polled = self.inner.poll_recv(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            self.wire.0.lock().unwrap().push((false, frame.clone()));
        }
        polled
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        let mut frame = BytesMut::from(header);
        frame.extend_from_slice(&payload.to_bytes());
        self.wire.0.lock().unwrap().push((true, frame.freeze()));
        self.inner.start_send(header, payload)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_flush(cx)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_close(cx)
    }

    fn peer(&self) -> String {
        self.inner.peer()
    }
}

struct TapConnector {
    inner: mem::MemConnector,
    wire: Wire,
}

impl Connector for TapConnector {
    type Link = Tap;

    async fn connect(&self, config: &LinkConfig) -> Result<Tap, Error> {
        Ok(Tap {
            inner: self.inner.connect(config).await?,
            wire: self.wire.clone(),
        })
    }

    fn target(&self) -> String {
        self.inner.target()
    }
}

/// An echo server compressing with `server`, its maximum frame length `max_frame_len`,
/// and a client compressing with `client`, whose wire is tapped.
async fn setup(server: Algorithm, client: Algorithm, max_frame_len: usize) -> (Channel, Wire) {
    let echo = service_fn(|call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .compression(Some(Compression::new(server)))
        .unwrap()
        .max_frame_len(max_frame_len)
        .add_named_service("t.S", echo)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let wire = Wire::default();
    let channel = Channel::builder()
        .compression(Some(Compression::new(client)))
        .unwrap()
        .connect(TapConnector {
            inner: connector,
            wire: wire.clone(),
        })
        .await
        .unwrap();
    (channel, wire)
}

async fn echo(channel: &mut Channel, payload: Vec<u8>) -> Result<ClientReply, Status> {
    let call = ClientCall {
        method: "t.S/Echo".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: payload.into(),
        stream: None,
        compress: None,
    };
    channel.ready().await.unwrap().call(call).await
}

fn big() -> Vec<u8> {
    b"compressible with gzip ".repeat(1000)
}

fn is_gzip(message: &Bytes) -> bool {
    message.starts_with(&[0x1f, 0x8b])
}

#[cfg(feature = "zstd")]
fn is_zstd(message: &Bytes) -> bool {
    message.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
}

#[tokio::test]
async fn gzip_both_ways() {
    let (mut channel, wire) = setup(Algorithm::Gzip, Algorithm::Gzip, 1 << 20).await;
    // The first answer is compressed (the client advertised); the second request too
    // (the server has answered in kind).
    for _ in 0..2 {
        let reply = echo(&mut channel, big()).await.unwrap();
        assert_eq!(reply.payload, Bytes::from(big()));
        assert!(reply.compressed);
    }
    let sent = wire.compressed(true);
    let received = wire.compressed(false);
    assert_eq!(sent.len(), 1, "client → server");
    assert_eq!(received.len(), 2, "server → client");
    assert!(sent.iter().chain(&received).all(is_gzip));
    assert!(sent[0].len() < big().len() / 10);
}

#[tokio::test]
async fn a_gzip_bomb_stops_at_the_servers_limit() {
    // 4 MiB that gzip packs into a few KiB, toward a server whose frames (and so
    // decompressed messages) stop at 64 KiB.
    let (mut channel, wire) = setup(Algorithm::Gzip, Algorithm::Gzip, 64 * 1024).await;
    echo(
        &mut channel,
        b"warm up: learn that the server takes gzip".to_vec(),
    )
    .await
    .unwrap();
    let status = echo(&mut channel, vec![0u8; 4 << 20]).await.unwrap_err();
    assert_eq!(status.code(), Code::RESOURCE_EXHAUSTED, "{status}");
    assert!(wire.compressed(true).iter().all(is_gzip));
    // Only that call failed: the connection goes on.
    let reply = echo(&mut channel, big()).await.unwrap();
    assert_eq!(reply.payload, Bytes::from(big()));
}

#[cfg(feature = "zstd")]
#[tokio::test]
async fn each_side_sends_with_its_own_algorithm_when_the_peer_has_it() {
    let (mut channel, wire) = setup(Algorithm::Zstd, Algorithm::Gzip, 1 << 20).await;
    for _ in 0..2 {
        let reply = echo(&mut channel, big()).await.unwrap();
        assert_eq!(reply.payload, Bytes::from(big()));
    }
    let sent = wire.compressed(true);
    let received = wire.compressed(false);
    assert!(!sent.is_empty() && sent.iter().all(is_gzip), "client: gzip");
    assert!(
        !received.is_empty() && received.iter().all(is_zstd),
        "server: zstd"
    );
}

#[cfg(not(feature = "zstd"))]
#[tokio::test]
async fn asking_for_zstd_without_its_feature_is_an_error() {
    let zstd = Some(Compression::new(Algorithm::Zstd));
    let err = Channel::builder().compression(zstd).expect_err("refused");
    assert_eq!(err.kind(), rpc_core::ErrorKind::Unsupported);
    assert!(err.to_string().contains("zstd"), "{err}");
    let Err(err) = Server::builder().compression(zstd) else {
        panic!("refused");
    };
    assert_eq!(err.kind(), rpc_core::ErrorKind::Unsupported);
}

/// A few kilobytes of gzip can stand for a frame-sized message: compressed requests in
/// flight on a connection may expand to four frames' worth in all (here 4 × 64 KiB),
/// past which the server reads nothing more from the connection until calls end,
/// however few slots they take. Found by a hostile-peer round: 40 pipelined gzip
/// requests of 15 KB, 15 MiB each expanded, never read, held 655 MiB.
#[tokio::test]
async fn compressed_requests_in_flight_are_bounded_by_their_expanded_size() {
    use std::{
        io::Write,
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    const EXPANDED: usize = 60 * 1024;
    let started = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (counted, gate) = (started.clone(), release.clone());
    let handler = service_fn(move |call: ServerCall| {
        counted.fetch_add(1, Ordering::Relaxed);
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await.unwrap();
            Ok::<_, Status>(ServerReply {
                payload: Payload::from(Bytes::from(call.payload.len().to_string())),
                ..ServerReply::default()
            })
        }
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .max_frame_len(64 * 1024)
        .compression(Some(Compression::new(Algorithm::Gzip)))
        .unwrap()
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut link = connector.connect(&LinkConfig::default()).await.unwrap();
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gzip.write_all(&vec![7u8; EXPANDED]).unwrap();
    let packed = Bytes::from(gzip.finish().unwrap());
    assert!(packed.len() < 1024, "{} bytes", packed.len());
    const CALLS: u64 = 10;
    for id in 1..=CALLS {
        let mut header = BytesMut::new();
        rpc_core::frame::encode_request_header_flags(
            &mut header,
            id,
            "t.S/Hold",
            None,
            None,
            &Metadata::new(),
            rpc_core::frame::FLAG_COMPRESSED,
        );
        std::future::poll_fn(|cx| link.poll_ready(cx))
            .await
            .unwrap();
        link.start_send(&header, packed.clone().into()).unwrap();
    }
    std::future::poll_fn(|cx| link.poll_flush(cx))
        .await
        .unwrap();

    // 5 × 60 KiB reach 256 KiB: the server takes no sixth.
    let admitted = 256usize.div_ceil(60);
    while started.load(Ordering::Relaxed) < admitted {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(started.load(Ordering::Relaxed), admitted);

    // Calls that end make room: the rest are read and answered.
    release.add_permits(CALLS as usize);
    for _ in 1..=CALLS {
        let bytes = std::future::poll_fn(|cx| link.poll_recv(cx))
            .await
            .unwrap()
            .unwrap();
        match Frame::decode(bytes, &DecodeLimits::default()).unwrap() {
            Frame::Response(r) => {
                assert_eq!(r.code, Code::OK, "{r:?}");
                assert_eq!(r.payload, EXPANDED.to_string());
            }
            other => panic!("expected a RESPONSE, got {other:?}"),
        }
    }
    assert_eq!(started.load(Ordering::Relaxed), CALLS as usize);
}
