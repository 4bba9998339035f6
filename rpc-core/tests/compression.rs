//! Compression negotiated per connection: only toward a peer that advertised it, only
//! above the threshold unless a hint forces it, for unary calls and stream messages.
#![cfg(feature = "zstd")]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{stream, StreamExt};
use rpc_core::{
    client::{Channel, ClientCall, ClientReply},
    compress::Compression,
    link::mem,
    server::{Server, ServerCall, ServerReply},
    stream::{MessageStream, TakeOnce},
    Metadata, Payload, Status,
};
use tower::{service_fn, Service, ServiceExt};

/// Whether each request the server saw arrived compressed.
type Seen = Arc<Mutex<Vec<bool>>>;

/// Echoes a unary payload (answering with the `compress` hint found in the request's
/// first byte: `+` force, `-` never, else the threshold); streams back every stream
/// message, recording their compression too.
async fn setup(server_compresses: bool, client_compresses: bool) -> (Channel, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let handler = service_fn(move |call: ServerCall| {
        let log = log.clone();
        async move {
            if let Some(stream) = call.stream.as_ref().and_then(|s| s.take()) {
                let mut requests = stream;
                let mut all = Vec::new();
                while let Some(message) = requests.next().await {
                    log.lock().unwrap().push(requests.last_compressed());
                    all.push(Ok(Payload::from(message?)));
                }
                return Ok::<_, Status>(ServerReply {
                    stream: Some(TakeOnce::new(stream::iter(all).boxed())),
                    ..ServerReply::default()
                });
            }
            log.lock().unwrap().push(call.compressed);
            let compress = match call.payload.first() {
                Some(b'+') => Some(true),
                Some(b'-') => Some(false),
                _ => None,
            };
            Ok(ServerReply {
                payload: call.payload.into(),
                compress,
                ..ServerReply::default()
            })
        }
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .compression(server_compresses.then(Compression::default))
        .unwrap()
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder()
        .compression(client_compresses.then(Compression::default))
        .unwrap()
        .connect(connector)
        .await
        .unwrap();
    (channel, seen)
}

/// `handler` served as `name` over the in-memory link by a server with compression on,
/// and a channel to it with compression on.
async fn both_compressing<S>(name: &str, handler: S) -> Channel
where
    S: Service<ServerCall, Response = ServerReply, Error = Status> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .add_named_service(name, handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    Channel::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .connect(connector)
        .await
        .unwrap()
}

async fn unary(channel: &mut Channel, payload: Vec<u8>, compress: Option<bool>) -> ClientReply {
    let call = ClientCall {
        method: "t.S/Echo".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: payload.into(),
        stream: None,
        compress,
    };
    channel.ready().await.unwrap().call(call).await.unwrap()
}

fn big() -> Vec<u8> {
    b"compressible ".repeat(1000)
}

#[tokio::test]
async fn negotiated_after_the_first_exchange_and_both_ways_above_the_threshold() {
    let (mut channel, seen) = setup(true, true).await;
    // First call: the client does not know yet that the server accepts compression,
    // so it sends plainly; the server knows the client does, and compresses.
    let first = unary(&mut channel, big(), None).await;
    assert_eq!(first.payload, Bytes::from(big()));
    assert!(first.compressed, "the server compressed its answer");
    assert!(
        first.metadata.is_empty(),
        "the advertisement is consumed, not shown"
    );
    // Now the client knows: large requests go compressed, small ones do not.
    let second = unary(&mut channel, big(), None).await;
    assert!(second.compressed);
    let small = unary(&mut channel, b"tiny".to_vec(), None).await;
    assert!(!small.compressed, "below the threshold");
    assert_eq!(*seen.lock().unwrap(), [false, true, false]);
}

#[tokio::test]
async fn hints_force_or_forbid_one_message() {
    let (mut channel, seen) = setup(true, true).await;
    unary(&mut channel, b"warm up".to_vec(), None).await;
    // `+`: the server forces compression of its small answer; the request asks too.
    let forced = unary(&mut channel, b"+ small".to_vec(), Some(true)).await;
    assert!(forced.compressed);
    assert_eq!(forced.payload, Bytes::from_static(b"+ small"));
    // `-`: neither side compresses a large message.
    let mut never = b"-".to_vec();
    never.extend(big());
    let never = unary(&mut channel, never, Some(false)).await;
    assert!(!never.compressed);
    assert_eq!(*seen.lock().unwrap(), [false, true, false]);
}

#[tokio::test]
async fn a_peer_that_did_not_advertise_is_never_sent_compressed_data() {
    // The server does not compress: the client keeps sending plainly, even when asked.
    let (mut channel, seen) = setup(false, true).await;
    for _ in 0..3 {
        let reply = unary(&mut channel, big(), Some(true)).await;
        assert!(!reply.compressed);
    }
    assert_eq!(*seen.lock().unwrap(), [false, false, false]);

    // The client does not: the server answers plainly, even when its hint says so.
    let (mut channel, seen) = setup(true, false).await;
    let mut forced = b"+".to_vec();
    forced.extend(big());
    for _ in 0..3 {
        let reply = unary(&mut channel, forced.clone(), None).await;
        assert!(!reply.compressed);
    }
    assert_eq!(*seen.lock().unwrap(), [false, false, false]);
}

#[tokio::test]
async fn stream_messages_are_compressed_after_negotiation() {
    let (mut channel, seen) = setup(true, true).await;
    unary(&mut channel, b"warm up".to_vec(), None).await;
    let messages: MessageStream = stream::iter([big(), b"tiny".to_vec(), big()])
        .map(Payload::from)
        .boxed();
    let call = ClientCall {
        method: "t.S/Stream".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(messages)),
        compress: None,
    };
    let reply = channel.ready().await.unwrap().call(call).await.unwrap();
    let mut answers = reply.stream.unwrap().take().unwrap();
    let mut compressed = Vec::new();
    while let Some(message) = answers.next().await {
        let message = message.unwrap();
        assert!(message[..] == big()[..] || message[..] == b"tiny"[..]);
        compressed.push(answers.last_compressed());
    }
    assert_eq!(compressed, [true, false, true], "answers");
    assert_eq!(
        seen.lock().unwrap()[1..],
        [true, false, true],
        "requests (after the unary warm-up)"
    );
}

#[cfg(not(feature = "gzip"))]
#[test]
fn asking_for_gzip_without_its_feature_is_an_error() {
    use rpc_core::{compress::Algorithm, ErrorKind};
    let gzip = Some(Compression::new(Algorithm::Gzip));
    let Err(err) = Channel::builder().compression(gzip) else {
        panic!("gzip without its feature was accepted by the channel builder")
    };
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("`gzip` cargo feature"), "{err}");
    let Err(err) = Server::builder().compression(gzip) else {
        panic!("gzip without its feature was accepted by the server builder")
    };
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    // What is built is accepted, and `None` always is.
    assert!(Channel::builder()
        .compression(Some(Compression::default()))
        .is_ok());
    assert!(Server::builder().compression(None).is_ok());
}

/// Requests that decompress to megabytes (a few KiB each on the wire) are opened a few
/// MiB of output per turn of the server's connection, which then lets the runtime's
/// other tasks run: a batch of 32 of them was opened in one turn, holding the worker
/// (on the one-thread runtime of this test, everything else) for all of it. Counted in
/// turns, not time: a task beside the server notes how many requests arrived between
/// two of its own turns.
#[tokio::test]
async fn decompressing_large_requests_lets_other_tasks_run() {
    const CALLS: usize = 16;
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .add_named_service(
            "t.S",
            service_fn(|_: ServerCall| async { Ok::<_, Status>(ServerReply::default()) }),
        )
        .build();
    tokio::spawn({
        let server = server.clone();
        async move { server.serve(listener).await }
    });
    let mut channel = Channel::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .connect(connector)
        .await
        .unwrap();
    unary(&mut channel, b"warm up".to_vec(), None).await; // learns the server's codecs
    let received = {
        let server = server.clone();
        move || -> u64 { server.connections().iter().map(|c| c.frames_received).sum() }
    };
    let start = received();
    let watcher = tokio::spawn({
        let received = received.clone();
        async move {
            let (mut last, mut most) = (received(), 0);
            while last < start + CALLS as u64 {
                // To the back of the run queue, as the connection goes when it yields
                // (`yield_now` waits for the driver: the connection would run turns
                // meanwhile).
                let mut yielded = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut yielded, true) {
                        return std::task::Poll::Ready(());
                    }
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                })
                .await;
                let now = received();
                most = most.max(now - last);
                last = now;
            }
            most
        }
    });
    // 4 MiB of zeros each, some KiB compressed: all written before the server reads.
    let calls: Vec<_> = (0..CALLS)
        .map(|_| {
            let mut channel = channel.clone();
            tokio::spawn(async move { unary(&mut channel, vec![0; 4 << 20], Some(true)).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    let most = watcher.await.unwrap();
    assert!(
        most <= 2,
        "{most} requests of 4 MiB decompressed in one turn of the connection"
    );
}

/// A request whose metadata fills the limit exactly is sent without the compression
/// advertisement, which would push it over: the server then closed the connection
/// (GOAWAY PROTOCOL_ERROR) and failed every call on it (from a review).
#[tokio::test]
async fn a_request_at_the_metadata_limit_is_not_pushed_over_by_the_advertisement() {
    let (mut channel, _seen) = setup(true, true).await;
    let mut metadata = Metadata::new();
    // 1 + key + 4 + value bytes per entry (docs/wire.md): exactly the 16 KiB default.
    let value = "v".repeat(rpc_core::frame::DEFAULT_MAX_METADATA_LEN - (1 + 5 + 4));
    metadata.insert("x-big", value).unwrap();
    assert!(rpc_core::frame::metadata_fits(
        &metadata,
        rpc_core::frame::DEFAULT_MAX_METADATA_LEN
    ));
    let call = ClientCall {
        method: "t.S/Echo".into(),
        idempotency: Default::default(),
        metadata,
        timeout: None,
        call_key: None,
        payload: Payload::from(Bytes::from_static(b"at the limit")),
        stream: None,
        compress: None,
    };
    let reply = channel.ready().await.unwrap().call(call).await;
    assert_eq!(reply.unwrap().payload, "at the limit");
    // The connection is still there, and compression is still negotiated.
    unary(&mut channel, big(), None).await;
    let reply = unary(&mut channel, big(), None).await;
    assert!(reply.compressed);
}

/// The server's side of the same rule: a handler whose answer's metadata fills the
/// limit exactly gets its answer through, without the advertisement the server adds
/// to the answers of clients that advertised (which made it RESOURCE_EXHAUSTED, the
/// handler's answer lost: from a review of docs/wire.md against the code), for a
/// unary answer and for a stream's headers.
#[tokio::test]
async fn an_answer_at_the_metadata_limit_is_not_pushed_over_by_the_advertisement() {
    let value = "v".repeat(rpc_core::frame::DEFAULT_MAX_METADATA_LEN - (1 + 5 + 4));
    let full = {
        let mut metadata = Metadata::new();
        metadata.insert("x-big", value.clone()).unwrap();
        metadata
    };
    let answer = full.clone();
    let handler = service_fn(move |call: ServerCall| {
        let metadata = answer.clone();
        async move {
            let stream = call.stream.as_ref().and_then(|s| s.take()).map(|_| {
                let messages = stream::iter([Ok(Payload::from(Bytes::from_static(b"m")))]);
                TakeOnce::new(messages.boxed())
            });
            Ok::<_, Status>(ServerReply {
                metadata,
                payload: if stream.is_some() {
                    Payload::default()
                } else {
                    call.payload.into()
                },
                stream,
                ..ServerReply::default()
            })
        }
    });
    let mut channel = both_compressing("t.S", handler).await;
    let reply = unary(&mut channel, b"unary".to_vec(), None).await;
    assert_eq!(reply.payload, "unary");
    assert_eq!(
        reply.metadata.get("x-big").and_then(|v| v.as_str()),
        Some(value.as_str())
    );
    let requests = stream::iter([Payload::from(Bytes::from_static(b"r"))]).boxed();
    let call = ClientCall {
        method: "t.S/Stream".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Payload::default(),
        stream: Some(TakeOnce::new(requests)),
        compress: None,
    };
    let reply = channel.ready().await.unwrap().call(call).await.unwrap();
    assert_eq!(
        reply.metadata.get("x-big").and_then(|v| v.as_str()),
        Some(value.as_str())
    );
    let mut messages = reply.stream.unwrap().take().unwrap();
    assert_eq!(messages.next().await.unwrap().unwrap(), "m");
    assert!(messages.next().await.is_none());
}

/// A stream's reader yields to other tasks after decompressing its share (4 MiB), as
/// a server's connection does for unary requests: compressed messages of 4 MiB of
/// zeros cost a few hundred bytes of credit each, and a handler reading the thousands
/// a window admits held its worker thread for seconds (from a review).
#[tokio::test]
async fn decompressing_stream_messages_lets_other_tasks_run() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const MESSAGES: usize = 24;
    let read = Arc::new(AtomicUsize::new(0));
    let counted = read.clone();
    let handler = service_fn(move |call: ServerCall| {
        let counted = counted.clone();
        async move {
            if let Some(mut requests) = call.stream.as_ref().and_then(|s| s.take()) {
                while let Some(message) = requests.next().await {
                    assert_eq!(message?.len(), 4 << 20);
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok::<_, Status>(ServerReply::default())
        }
    });
    let mut channel = both_compressing("t.S", handler).await;
    unary(&mut channel, b"warm up".to_vec(), None).await;
    let watcher = tokio::spawn({
        let read = read.clone();
        async move {
            let (mut last, mut most) = (read.load(Ordering::SeqCst), 0);
            while last < MESSAGES {
                // To the back of the run queue (see the unary test above).
                let mut yielded = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut yielded, true) {
                        return std::task::Poll::Ready(());
                    }
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                })
                .await;
                let now = read.load(Ordering::SeqCst);
                most = most.max(now - last);
                last = now;
            }
            most
        }
    });
    let messages: MessageStream = stream::iter((0..MESSAGES).map(|_| vec![0u8; 4 << 20]))
        .map(Payload::from)
        .boxed();
    let call = ClientCall {
        method: "t.S/Stream".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(messages)),
        compress: Some(true),
    };
    channel.ready().await.unwrap().call(call).await.unwrap();
    let most = watcher.await.unwrap();
    assert!(
        most <= 2,
        "{most} stream messages of 4 MiB decompressed in one turn of the handler"
    );
}

/// A compressed stream message is charged to the server's large request budget at
/// its decompressed size, for as long as the handler holds it: 4 KiB of zstd stand
/// for 4 MiB, and charged by their size on the wire (or not at all, under 64 KiB),
/// 256 streams on one connection held gigabytes (from a review). Here a budget of
/// four such messages: the handler holds four, and its stream ends
/// RESOURCE_EXHAUSTED at the fifth.
#[tokio::test]
async fn decompressed_stream_messages_count_in_the_large_request_budget() {
    const LEN: usize = 4 << 20;
    let report: Arc<Mutex<Option<String>>> = Arc::default();
    let told = report.clone();
    let handler = service_fn(move |call: ServerCall| {
        let told = told.clone();
        async move {
            let Some(mut requests) = call.stream.as_ref().and_then(|s| s.take()) else {
                return Ok(ServerReply::default()); // the warm-up
            };
            let mut held = Vec::new();
            let mut ended = String::from("end");
            while let Some(message) = requests.next().await {
                match message {
                    Ok(message) => held.push(message),
                    Err(status) => {
                        ended = format!("{:?} {}", status.code(), status.message());
                        break;
                    }
                }
            }
            *told.lock().unwrap() = Some(format!("{} {ended}", held.len()));
            Ok::<_, Status>(ServerReply::default())
        }
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .max_large_request_bytes(4 * LEN)
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut channel = Channel::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .connect(connector)
        .await
        .unwrap();
    // Compression is used once the server's advertisement came.
    unary(&mut channel, b"warm up".to_vec(), None).await;
    let messages: MessageStream = stream::iter((0..6).map(|_| vec![0u8; LEN]))
        .map(Payload::from)
        .boxed();
    let call = ClientCall {
        method: "t.S/Upload".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(messages)),
        compress: Some(true),
    };
    let _ = channel.ready().await.unwrap().call(call).await;
    let seen = report.lock().unwrap().take().expect("the handler reported");
    assert!(seen.starts_with("4 RESOURCE_EXHAUSTED"), "{seen}");
    assert!(seen.contains("large requests"), "{seen}");
    // With the budget spent, the fifth was not inflated whole before its refusal.
    assert!(
        seen.contains("decompressed no further than the 0 bytes left"),
        "{seen}"
    );
}

/// With the server-wide budget of large requests spent, a compressed unary request is
/// decompressed no further than the room left, not whole and then refused: a bomb
/// of a few kilobytes standing for 16 MiB cost 16 MiB of inflating each, and clients
/// pipelining them kept both cores busy (from a review). Here the budget holds three
/// requests of 6 MiB; the fourth is refused, its message saying how far it was read,
/// and the connection goes on.
#[tokio::test]
async fn a_compressed_request_past_the_large_budget_is_not_inflated_whole() {
    // The budget is at least the largest frame (16 MiB): three of 6 MiB fill 18.
    const LEN: usize = 6 << 20;
    let release = Arc::new(tokio::sync::Notify::new());
    let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (wait, count) = (release.clone(), holding.clone());
    let handler = service_fn(move |call: ServerCall| {
        let (wait, count) = (wait.clone(), count.clone());
        async move {
            if call.method.as_str() == "t.S/Hold" {
                // Holds its payload (charged to the budget) until released.
                let notified = wait.notified();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                notified.await;
            }
            Ok::<_, Status>(ServerReply {
                payload: Payload::from(call.payload.len().to_be_bytes().to_vec()),
                ..ServerReply::default()
            })
        }
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .max_large_request_bytes(3 * LEN)
        .add_named_service("t.S", handler)
        .build();
    let served = server.clone();
    tokio::spawn(async move { served.serve(listener).await });
    let channel = Channel::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .connect(connector)
        .await
        .unwrap();
    // Compression is used once the server's advertisement came.
    unary(&mut channel.clone(), b"warm up".to_vec(), None).await;
    let call = |method: &'static str| ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: vec![0u8; LEN].into(),
        stream: None,
        compress: Some(true),
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut channel = channel.clone();
        let call = call("t.S/Hold");
        held.push(tokio::spawn(async move {
            channel.ready().await.unwrap().call(call).await
        }));
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while holding.load(std::sync::atomic::Ordering::SeqCst) < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the three calls are held");
    let mut fourth = channel.clone();
    let refused = fourth
        .ready()
        .await
        .unwrap()
        .call(call("t.S/Echo"))
        .await
        .expect_err("no room left");
    assert_eq!(
        refused.code(),
        rpc_core::Code::RESOURCE_EXHAUSTED,
        "{refused}"
    );
    assert!(
        refused
            .message()
            .contains("decompressed no further than the 0 bytes left"),
        "{refused}"
    );
    // Counted: it never reached a layer that would (from a review, it showed nowhere).
    assert_eq!(server.stats().refused_over_budget, 1);
    release.notify_waiters();
    for call in held {
        let reply = call.await.unwrap().expect("a held call");
        assert_eq!(reply.payload[..], (LEN as u64).to_be_bytes());
    }
    // The budget is free again: the same request runs.
    let reply = fourth.ready().await.unwrap().call(call("t.S/Echo")).await;
    assert_eq!(
        reply.expect("after the release").payload[..],
        (LEN as u64).to_be_bytes()
    );
}
