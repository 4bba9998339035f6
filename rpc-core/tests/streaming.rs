//! Streaming calls over the in-memory transport, with hand-written services: echo in
//! both directions, flow control against a slow reader, errors and cancellation
//! mid-stream, half-close, deadlines over the whole stream.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use futures::{stream, StreamExt};
use rpc_core::{
    client::{Channel, ClientCall, ClientReply},
    link::mem,
    server::{Server, ServerCall, ServerReply},
    stream::{MessageStream, RawStreaming, ReplyStream, TakeOnce},
    Code, Metadata, Payload, Status,
};
use tower::{service_fn, Service, ServiceExt};

/// Messages produced by `t.S/Produce`, and handlers of `t.S/Hold` dropped.
#[derive(Default)]
struct Counters {
    produced: AtomicUsize,
    dropped: AtomicUsize,
}

struct DropCount(Arc<Counters>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

fn body(call: &ServerCall) -> RawStreaming {
    call.stream
        .as_ref()
        .and_then(|s| s.take())
        .expect("a streaming call")
}

fn reply(messages: ReplyStream) -> ServerReply {
    ServerReply {
        stream: Some(TakeOnce::new(messages)),
        ..ServerReply::default()
    }
}

/// A server with the test methods, and a channel to it.
async fn setup(
    client_window: u32,
    server_window: u32,
) -> (Channel, Arc<Counters>, tokio::task::JoinHandle<()>) {
    let (channel, counters, task, _) = setup_with_server(client_window, server_window).await;
    (channel, counters, task)
}

/// [`setup`], and the server, for its statistics.
async fn setup_with_server(
    client_window: u32,
    server_window: u32,
) -> (Channel, Arc<Counters>, tokio::task::JoinHandle<()>, Server) {
    let counters = Arc::new(Counters::default());
    let seen = counters.clone();
    let handler = service_fn(move |call: ServerCall| {
        let counters = seen.clone();
        async move {
            match call.method.as_str() {
                // Bidirectional: every request message back, then trailers.
                "t.S/Echo" => {
                    let requests = body(&call);
                    let mut reply = reply(requests.map(|m| m.map(Payload::from)).boxed());
                    reply.metadata.insert("x-head", "h").unwrap();
                    reply.trailers.insert("x-tail", "t").unwrap();
                    Ok(reply)
                }
                // Server streaming: `n` messages of `size` bytes, made only when pulled.
                "t.S/Produce" => {
                    let (n, size) = (1024usize, 1usize << 20);
                    let messages = stream::iter(0..n).map(move |i| {
                        counters.produced.fetch_add(1, Ordering::SeqCst);
                        Ok(Payload::from(vec![i as u8; size]))
                    });
                    Ok(reply(messages.boxed()))
                }
                // Three messages, then an error status; trailers set by the handler.
                "t.S/FailAfter" => {
                    let messages = stream::iter(0..4u8).map(|i| {
                        if i < 3 {
                            Ok(Payload::from(vec![i]))
                        } else {
                            Err(Status::aborted("gave up after three"))
                        }
                    });
                    let mut reply = reply(messages.boxed());
                    reply.trailers.insert("x-tail", "t").unwrap();
                    Ok(reply)
                }
                // Client streaming: the total length of the request messages, once the
                // client half-closes.
                "t.S/Sum" => {
                    let mut requests = body(&call);
                    let mut total = 0usize;
                    while let Some(message) = requests.next().await {
                        total += message?.len();
                    }
                    Ok(ServerReply {
                        payload: Payload::from(total.to_string().into_bytes()),
                        ..ServerReply::default()
                    })
                }
                // Echoes one message, then holds until dropped.
                "t.S/Hold" => {
                    let guard = DropCount(counters);
                    let mut requests = body(&call);
                    let first = requests.next().await;
                    let messages = stream::once(async move { first.unwrap().map(Payload::from) })
                        .chain(stream::pending())
                        .map(move |m| {
                            let _ = &guard;
                            m
                        });
                    Ok(reply(messages.boxed()))
                }
                _ => Err(Status::unimplemented("no such method")),
            }
        }
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .stream_window(server_window)
        .max_frame_len(4 << 20)
        .add_named_service("t.S", handler)
        .build();
    let serving = server.clone();
    let task = tokio::spawn(async move {
        let _ = serving.serve(listener).await;
    });
    let channel = Channel::builder()
        .stream_window(client_window)
        .max_frame_len(4 << 20)
        .connect(connector)
        .await
        .unwrap();
    (channel, counters, task, server)
}

async fn open(
    channel: &mut Channel,
    method: &'static str,
    messages: MessageStream,
    timeout: Option<Duration>,
) -> Result<ClientReply, Status> {
    let call = ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(messages)),
        compress: None,
    };
    channel.ready().await?.call(call).await
}

fn responses(reply: ClientReply) -> RawStreaming {
    reply
        .stream
        .and_then(|s| s.take())
        .expect("a response stream")
}

#[tokio::test]
async fn bidirectional_echo_with_headers_and_trailers() {
    let (mut channel, _, _server) = setup(1 << 20, 1 << 20).await;
    let requests = stream::iter(0..200u32)
        .map(|i| Payload::from(i.to_be_bytes().to_vec()))
        .boxed();
    let reply = open(&mut channel, "t.S/Echo", requests, None)
        .await
        .unwrap();
    assert_eq!(reply.metadata.get_str("x-head"), Some("h"));
    let mut answers = responses(reply);
    let mut got = Vec::new();
    while let Some(message) = answers.next().await {
        let message = message.unwrap();
        got.push(u32::from_be_bytes(message[..].try_into().unwrap()));
    }
    assert_eq!(got, (0..200).collect::<Vec<_>>(), "every message, in order");
    assert_eq!(answers.trailers().unwrap().get_str("x-tail"), Some("t"));
}

/// An open stream is a call in flight on its connection's statistics (the status
/// page's /connections): it was left out, as it holds no slot of the request limit.
#[tokio::test]
async fn an_open_stream_counts_as_a_call_in_flight() {
    let (mut channel, _, _task, server) = setup_with_server(1 << 20, 1 << 20).await;
    let requests = stream::iter([Payload::from(vec![1u8])])
        .chain(stream::pending())
        .boxed();
    let reply = open(&mut channel, "t.S/Hold", requests, None)
        .await
        .unwrap();
    let mut answers = responses(reply);
    assert!(answers.next().await.unwrap().is_ok());
    let mut in_flight = 0;
    for _ in 0..200 {
        in_flight = server.connections().first().map_or(0, |c| c.in_flight);
        if in_flight == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(in_flight, 1, "{:?}", server.connections());
    drop(answers);
}

#[tokio::test]
async fn client_streaming_ends_with_the_half_close() {
    let (mut channel, _, _server) = setup(1 << 20, 1 << 20).await;
    let requests = stream::iter(0..100)
        .map(|_| Payload::from(vec![0u8; 1000]))
        .boxed();
    let reply = open(&mut channel, "t.S/Sum", requests, None).await.unwrap();
    let mut answers = responses(reply);
    let total = answers.next().await.unwrap().unwrap();
    assert_eq!(total, Bytes::from("100000"));
    assert!(answers.next().await.is_none());
}

#[tokio::test]
async fn a_slow_reader_bounds_what_both_sides_hold() {
    // 1 GiB in 1 MiB messages, read one at a time with a pause: the producer may only
    // run ahead of the reader by the window plus a message (plus the one in hand).
    const WINDOW: u32 = 2 << 20;
    const MESSAGE: usize = 1 << 20;
    let (mut channel, counters, _server) = setup(WINDOW, 1 << 20).await;
    let reply = open(&mut channel, "t.S/Produce", stream::empty().boxed(), None)
        .await
        .unwrap();
    let mut answers = responses(reply);
    let bound_messages = WINDOW as usize / MESSAGE + 2;
    let mut read = 0usize;
    let mut worst_ahead = 0usize;
    let mut worst_buffered = 0usize;
    while let Some(message) = answers.next().await {
        assert_eq!(message.unwrap().len(), MESSAGE);
        read += 1;
        if read % 64 == 0 {
            // Let the producer run as far as it can.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let produced = counters.produced.load(Ordering::SeqCst);
        worst_ahead = worst_ahead.max(produced - read);
        worst_buffered = worst_buffered.max(answers.buffered_bytes());
        assert!(
            produced - read <= bound_messages,
            "the server produced {produced} messages when {read} were read"
        );
        assert!(
            answers.buffered_bytes() <= WINDOW as usize + MESSAGE,
            "the client holds {} bytes unread",
            answers.buffered_bytes()
        );
    }
    assert_eq!(read, 1024, "the whole GiB arrived");
    assert!(worst_ahead >= 1, "the producer did run ahead a little");
    eprintln!("producer ahead by at most {worst_ahead} messages, {worst_buffered} bytes buffered");
}

#[tokio::test]
async fn an_error_mid_stream_reaches_the_reader_after_the_messages() {
    let (mut channel, _, _server) = setup(1 << 20, 1 << 20).await;
    let reply = open(&mut channel, "t.S/FailAfter", stream::empty().boxed(), None)
        .await
        .unwrap();
    let mut answers = responses(reply);
    for i in 0..3u8 {
        assert_eq!(answers.next().await.unwrap().unwrap(), Bytes::from(vec![i]));
    }
    let status = answers.next().await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::ABORTED);
    assert_eq!(status.message(), "gave up after three");
    // The handler's trailers come with the status, as on a stream that ends OK.
    assert_eq!(status.metadata().get_str("x-tail"), Some("t"), "{status:?}");
    assert!(answers.next().await.is_none());
}

#[tokio::test]
async fn dropping_a_bidirectional_stream_drops_the_server_handler() {
    let (mut channel, counters, _server) = setup(1 << 20, 1 << 20).await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Payload>();
    tx.unbounded_send(Payload::from("first")).unwrap();
    let reply = open(&mut channel, "t.S/Hold", rx.boxed(), None)
        .await
        .unwrap();
    let mut answers = responses(reply);
    assert_eq!(answers.next().await.unwrap().unwrap(), Bytes::from("first"));
    assert_eq!(counters.dropped.load(Ordering::SeqCst), 0);
    drop(answers); // cancels: a CANCEL frame makes the server drop the handler
    tokio::time::timeout(Duration::from_secs(10), async {
        while counters.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the handler was dropped");
    // The connection is still good.
    let reply = open(
        &mut channel,
        "t.S/Sum",
        stream::iter([Payload::from("abc")]).boxed(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        responses(reply).next().await.unwrap().unwrap(),
        Bytes::from("3")
    );
    drop(tx);
}

#[tokio::test]
async fn the_deadline_covers_the_whole_stream() {
    let (mut channel, counters, _server) = setup(1 << 20, 1 << 20).await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Payload>();
    tx.unbounded_send(Payload::from("first")).unwrap();
    let reply = open(
        &mut channel,
        "t.S/Hold",
        rx.boxed(),
        Some(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let mut answers = responses(reply);
    assert_eq!(answers.next().await.unwrap().unwrap(), Bytes::from("first"));
    let status = answers.next().await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status}");
    tokio::time::timeout(Duration::from_secs(10), async {
        while counters.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the server stopped the handler at the deadline");
    drop(tx);
}

#[tokio::test]
async fn an_unknown_streaming_method_fails_the_call() {
    let (mut channel, _, _server) = setup(1 << 20, 1 << 20).await;
    let status = open(&mut channel, "t.S/Nope", stream::empty().boxed(), None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNIMPLEMENTED);
}

/// The open streams of a connection may hold four windows (or frames, if larger) of
/// request messages in all; past that the server reads nothing more from the
/// connection until handlers read theirs. Found by a hostile-peer round: 100 streams,
/// each sent one 16 MiB message within its credit and never read, held 1.6 GiB.
#[tokio::test]
async fn unread_stream_messages_are_bounded_per_connection() {
    use bytes::BytesMut;
    use rpc_core::{
        frame::{self, DecodeLimits, Frame},
        link::{Connector, Link, LinkConfig},
    };
    use std::{future::poll_fn, time::Duration};

    const MESSAGE: usize = 60 * 1024;
    let started = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (counted, gate) = (started.clone(), release.clone());
    // Reads nothing until released, then sums its messages.
    let handler = service_fn(move |call: ServerCall| {
        counted.fetch_add(1, Ordering::SeqCst);
        let gate = gate.clone();
        async move {
            let mut requests = body(&call);
            let _permit = gate.acquire().await.unwrap();
            let mut total = 0usize;
            while let Some(message) = requests.next().await {
                total += message?.len();
            }
            Ok::<_, Status>(ServerReply {
                payload: Payload::from(total.to_string().into_bytes()),
                ..ServerReply::default()
            })
        }
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .stream_window(64 * 1024)
        .max_frame_len(64 * 1024)
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut link = connector.connect(&LinkConfig::default()).await.unwrap();
    const STREAMS: u64 = 10;
    for id in 1..=STREAMS {
        open_raw(&mut link, id, "t.S/Sum").await;
        let mut data = BytesMut::new();
        frame::encode_data_header(&mut data, id, frame::FLAG_END_STREAM, None);
        poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
        link.start_send(&data, Payload::from(vec![1u8; MESSAGE]))
            .unwrap();
    }
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();

    // 5 × 60 KiB reach 4 × 64 KiB: the sixth stream is not even opened.
    let admitted = 256usize.div_ceil(60);
    while started.load(Ordering::SeqCst) < admitted {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(started.load(Ordering::SeqCst), admitted);

    // Handlers that read make room: every stream is served.
    release.add_permits(STREAMS as usize);
    let mut answered = 0;
    while answered < STREAMS {
        let bytes = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
        match Frame::decode(bytes, &DecodeLimits::default()).unwrap() {
            Frame::Response(r) => {
                assert_eq!(r.code, Code::OK, "{r:?}");
                answered += 1;
            }
            Frame::Data(_) | Frame::Window { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(started.load(Ordering::SeqCst), STREAMS as usize);
}

/// At the bound of the streams' unread request messages, the server reads ahead for
/// WINDOWs: handlers that wait for answer credit before reading their next request
/// hold that bound, and the client's WINDOWs, sent once it reads the answers, are
/// what lets them go on. (From a review: the server read nothing at the bound, the
/// WINDOWs stayed unread, and every stream waited for ever.)
#[tokio::test]
async fn windows_are_read_at_the_streams_bound() {
    use bytes::BytesMut;
    use rpc_core::{
        frame::{self, DecodeLimits, Frame},
        link::{Connector, Link, LinkConfig},
    };
    use std::future::poll_fn;

    const REQUEST: usize = 60 * 1024;
    // Four answers of 30 KiB per request: the fourth waits for credit (64 KiB at
    // first), before the handler reads its next request.
    let handler = service_fn(|call: ServerCall| async move {
        let replies = body(&call).flat_map(|message| {
            let answers = if message.is_ok() { 4 } else { 0 };
            stream::iter((0..answers).map(|_| Ok(Payload::from(vec![7u8; 30 * 1024]))))
        });
        Ok::<_, Status>(reply(replies.boxed()))
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .stream_window(64 * 1024)
        .max_frame_len(64 * 1024)
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut link = connector.connect(&LinkConfig::default()).await.unwrap();
    // Two requests on each stream, within its credit (65,536 bytes: the second goes
    // while 4 KiB are left), then the half-close: 5 × 60 KiB unread at the end.
    const STREAMS: u64 = 5;
    for id in 1..=STREAMS {
        open_raw(&mut link, id, "t.S/Echo").await;
        for flags in [0, frame::FLAG_END_STREAM] {
            let mut data = BytesMut::new();
            frame::encode_data_header(&mut data, id, flags, None);
            poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
            link.start_send(&data, Payload::from(vec![1u8; REQUEST]))
                .unwrap();
        }
    }
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();

    // Reads the answers as they come and gives their credit back.
    let mut answers = 0;
    let mut ended = 0;
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while ended < STREAMS {
            let bytes = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
            match Frame::decode(bytes, &DecodeLimits::default()).unwrap() {
                Frame::Data(data) => {
                    if let Some(message) = data.message {
                        answers += 1;
                        let mut window = BytesMut::new();
                        frame::encode_window(&mut window, data.id, message.len() as u32);
                        poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
                        link.start_send(&window, Payload::new()).unwrap();
                        poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
                    }
                }
                Frame::Response(r) => {
                    assert_eq!(r.code, Code::OK, "{r:?}");
                    ended += 1;
                }
                Frame::Window { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .expect("the streams waited for WINDOWs the server did not read");
    assert_eq!(answers, 8 * STREAMS);
}

/// An answer the connection cannot send (a message over the frame limit) ends its
/// stream with `RESOURCE_EXHAUSTED`, even when the handler had queued its own end
/// already: a unary handler answering a streaming call queues its headers, message
/// and end at once, and the client got the headers and an OK end, the message lost
/// unseen (from a review).
#[tokio::test]
async fn a_stream_whose_message_cannot_be_sent_does_not_end_ok() {
    use bytes::BytesMut;
    use rpc_core::{
        frame::{self, DecodeLimits, Frame},
        link::{Connector, Link, LinkConfig},
    };
    use std::future::poll_fn;

    let handler = service_fn(|_call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: Payload::from(vec![7u8; 100 * 1024]),
            ..ServerReply::default()
        })
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .max_frame_len(64 * 1024)
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut link = connector.connect(&LinkConfig::default()).await.unwrap();
    open_raw(&mut link, 1, "t.S/Big").await;
    let mut data = BytesMut::new();
    frame::encode_data_header(&mut data, 1, frame::FLAG_END_STREAM, None);
    poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
    link.start_send(&data, Payload::from(vec![1u8; 10]))
        .unwrap();
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let bytes = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
            match Frame::decode(bytes, &DecodeLimits::default()).unwrap() {
                Frame::Response(r) => break r,
                Frame::Data(data) => assert!(data.message.is_none(), "{data:?}"),
                _ => {}
            }
        }
    })
    .await
    .expect("no RESPONSE");
    assert_eq!(response.code, Code::RESOURCE_EXHAUSTED, "{response:?}");
}

/// A stream's end takes no credit (docs/wire.md §6.9): a client that granted exactly
/// what the server's messages take (here nothing beyond the initial 65,536 bytes: 1,024
/// messages at the minimum cost of 64) gets the RESPONSE after the last message. (A
/// client written from the document found the server waiting for credit before it
/// looked for the stream's end, so the RESPONSE waited for a WINDOW the client had no
/// reason to send.)
#[tokio::test]
async fn a_stream_ends_without_credit_left() {
    use bytes::BytesMut;
    use rpc_core::{
        frame::{self, DecodeLimits, Frame},
        link::{Connector, Link, LinkConfig},
    };
    use std::future::poll_fn;

    const MESSAGES: usize = 65_536 / 64;
    let handler = service_fn(|_call: ServerCall| async {
        let messages = stream::iter(0..MESSAGES).map(|_| Ok(Payload::from(vec![1u8])));
        Ok::<_, Status>(reply(messages.boxed()))
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut link = connector.connect(&LinkConfig::default()).await.unwrap();
    open_raw(&mut link, 1, "t.S/Many").await;
    let mut half_close = BytesMut::new();
    frame::encode_data_header(
        &mut half_close,
        1,
        frame::FLAG_END_STREAM | frame::FLAG_NO_MESSAGE,
        None,
    );
    poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
    link.start_send(&half_close, Payload::new()).unwrap();
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
    let mut messages = 0;
    loop {
        let bytes = tokio::time::timeout(Duration::from_secs(10), poll_fn(|cx| link.poll_recv(cx)))
            .await
            .unwrap_or_else(|_| panic!("no RESPONSE after {messages} messages"))
            .unwrap()
            .unwrap();
        match Frame::decode(bytes, &DecodeLimits::default()).unwrap() {
            Frame::Data(data) if data.message.is_some() => messages += 1,
            Frame::Data(_) | Frame::Window { .. } => {}
            Frame::Response(r) => {
                assert_eq!(r.code, Code::OK, "{r:?}");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(messages, MESSAGES);
}

/// Sends the REQUEST that opens stream `id` of `method` on a raw link.
async fn open_raw(link: &mut rpc_core::link::mem::MemLink, id: u64, method: &str) {
    use rpc_core::{frame, link::Link};
    let mut header = bytes::BytesMut::new();
    frame::encode_request_header_flags(
        &mut header,
        id,
        method,
        None,
        None,
        &Metadata::new(),
        frame::FLAG_STREAMING,
    );
    std::future::poll_fn(|cx| link.poll_ready(cx))
        .await
        .unwrap();
    link.start_send(&header, Payload::new()).unwrap();
}

/// Two uploads on one channel, one of them with messages always ready (an endless
/// stream to a server that reads all it gets): the other still goes out and finishes.
/// The driver sent from its streams in a fixed order with one budget a round, so a
/// stream first in that order whose messages never ran out took every round.
#[tokio::test]
async fn an_upload_that_never_pauses_does_not_starve_another() {
    let (channel, _, _server) = setup(1 << 20, 1 << 20).await;
    let endless = stream::repeat_with(|| Payload::from(vec![1u8; 100])).boxed();
    let mut first = channel.clone();
    let _endless = tokio::spawn(async move { open(&mut first, "t.S/Sum", endless, None).await });
    tokio::task::yield_now().await;
    let finite = stream::iter(0..100)
        .map(|_| Payload::from(vec![0u8; 1000]))
        .boxed();
    let mut second = channel.clone();
    let reply = tokio::time::timeout(
        Duration::from_secs(60),
        open(&mut second, "t.S/Sum", finite, None),
    )
    .await
    .expect("the second upload never finished")
    .unwrap();
    let total = responses(reply).next().await.unwrap().unwrap();
    assert_eq!(total, Bytes::from("100000"));
}
