//! Keepalive over the in-memory transport, under paused time: a silent peer is
//! declared dead within the keepalive interval and timeout (not the call's deadline),
//! on the client and on the server; a peer that answers PINGs keeps its connection;
//! a server with a minimum PING interval closes a client that pings too often.

use std::{future::poll_fn, time::Duration};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    client::{Channel, ClientCall, ResponseFuture},
    frame::{self, DecodeLimits, Frame, GoAwayCode},
    link::{mem, Connector, Link, LinkConfig, Listener},
    server::{Server, ServerCall, ServerReply},
    Code, Metadata, Status,
};
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceExt};

const INTERVAL: Duration = Duration::from_millis(200);
const TIMEOUT: Duration = Duration::from_millis(500);
const DEADLINE: Duration = Duration::from_secs(30);

fn call(payload: &'static [u8]) -> ClientCall {
    ClientCall {
        method: "t.S/A".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: Some(DEADLINE),
        call_key: None,
        payload: Bytes::from_static(payload).into(),
        stream: None,
        compress: None,
    }
}

async fn start(channel: &mut Channel, c: ClientCall) -> ResponseFuture {
    channel.ready().await.unwrap().call(c)
}

async fn recv(link: &mut mem::MemLink) -> Option<Frame> {
    let bytes = poll_fn(|cx| link.poll_recv(cx)).await?.expect("link error");
    Some(Frame::decode(bytes, &DecodeLimits::default()).expect("bad frame"))
}

async fn send(link: &mut mem::MemLink, header: BytesMut, payload: Bytes) {
    poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
    link.start_send(&header, payload.into()).unwrap();
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
}

fn keepalive_channel(connector: mem::MemConnector) -> Channel {
    Channel::builder()
        .keepalive_interval(Some(INTERVAL))
        .keepalive_timeout(TIMEOUT)
        .connect_lazy(connector)
}

/// The server takes the request and goes silent (it reads, answers nothing): the call
/// fails `UNAVAILABLE` because of keepalive, long before its 30 s deadline, and the
/// next call reconnects.
#[tokio::test(start_paused = true)]
async fn a_silent_server_fails_the_call_by_keepalive_not_by_deadline() {
    let (mut listener, connector) = mem::listener();
    let mut channel = keepalive_channel(connector);
    let pending = start(&mut channel, call(b"1")).await;
    let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
    let Some(Frame::Request(_)) = recv(&mut server).await else {
        panic!("expected the request");
    };
    let since = Instant::now();
    let err = pending.await.expect_err("a silent server cannot answer");
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert!(err.message().contains("keepalive"), "{err}");
    assert!(
        !err.is_unprocessed(),
        "the request reached the server: {err}"
    );
    // Virtual time: the documented bound, two intervals of silence and the timeout.
    assert!(
        since.elapsed() <= 2 * INTERVAL + TIMEOUT,
        "{:?}",
        since.elapsed()
    );
    // What the server saw: a PING, then the end of the connection.
    assert!(matches!(recv(&mut server).await, Some(Frame::Ping { .. })));
    assert!(
        recv(&mut server).await.is_none(),
        "the dead connection is closed"
    );

    let next = start(&mut channel, call(b"2")).await;
    let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
    let Some(Frame::Request(request)) = recv(&mut server).await else {
        panic!("expected the request on a new connection");
    };
    let mut buf = BytesMut::new();
    frame::encode_response_header(&mut buf, request.id, Code::OK, "", &[], &Metadata::new());
    send(&mut server, buf, Bytes::from_static(b"ok")).await;
    assert_eq!(next.await.unwrap().payload, "ok");
}

/// A server that answers PINGs keeps the connection, however long its handler takes.
#[tokio::test(start_paused = true)]
async fn pongs_keep_a_slow_call_alive() {
    let (mut listener, connector) = mem::listener();
    let mut channel = keepalive_channel(connector);
    let pending = start(&mut channel, call(b"1")).await;
    let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
    let Some(Frame::Request(request)) = recv(&mut server).await else {
        panic!("expected the request");
    };
    for _ in 0..10 {
        match recv(&mut server).await {
            Some(Frame::Ping { id, payload }) => {
                let mut buf = BytesMut::new();
                frame::encode_ping_header(&mut buf, id, true);
                send(&mut server, buf, payload).await;
            }
            other => panic!("expected a PING, got {other:?}"),
        }
    }
    let mut buf = BytesMut::new();
    frame::encode_response_header(&mut buf, request.id, Code::OK, "", &[], &Metadata::new());
    send(&mut server, buf, Bytes::from_static(b"late")).await;
    assert_eq!(pending.await.unwrap().payload, "late");
}

/// An idle connection is not pinged unless asked for.
#[tokio::test(start_paused = true)]
async fn an_idle_channel_does_not_ping_unless_asked() {
    let (mut listener, connector) = mem::listener();
    let mut channel = keepalive_channel(connector.clone());
    let pending = start(&mut channel, call(b"1")).await;
    let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
    let Some(Frame::Request(request)) = recv(&mut server).await else {
        panic!("expected the request");
    };
    let mut buf = BytesMut::new();
    frame::encode_response_header(&mut buf, request.id, Code::OK, "", &[], &Metadata::new());
    send(&mut server, buf, Bytes::new()).await;
    pending.await.unwrap();
    let quiet = tokio::time::timeout(20 * INTERVAL, recv(&mut server)).await;
    assert!(quiet.is_err(), "an idle connection got {quiet:?}");

    let _idle = Channel::builder()
        .keepalive_interval(Some(INTERVAL))
        .keepalive_timeout(TIMEOUT)
        .keepalive_while_idle(true)
        .connect(connector)
        .await
        .unwrap();
    let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
    assert!(matches!(recv(&mut server).await, Some(Frame::Ping { .. })));
}

/// The server side: a client that sent a request and went silent is cut off, and its
/// handler dropped, within the server's keepalive interval and timeout.
#[tokio::test(start_paused = true)]
async fn a_server_drops_a_silent_clients_connection_and_handlers() {
    let (mut client, mut dropped_rx, _connector) = a_call_that_never_ends().await;
    let since = Instant::now();
    // The client reads (so it sees the PING) but never answers.
    assert!(matches!(recv(&mut client).await, Some(Frame::Ping { .. })));
    assert!(
        recv(&mut client).await.is_none(),
        "the server closed the connection"
    );
    dropped_rx.recv().await.expect("the handler was dropped");
    assert!(
        since.elapsed() <= 2 * INTERVAL + TIMEOUT,
        "{:?}",
        since.elapsed()
    );
}

/// A server with keepalive on and a handler that never ends, and a raw client that
/// made one call of it; the receiver hears when the handler is dropped. (The
/// connector is returned to be kept: dropped, it ends the server's listener.)
async fn a_call_that_never_ends() -> (
    mem::MemLink,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    mem::MemConnector,
) {
    let (listener, connector) = mem::listener();
    let (dropped_tx, dropped_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let handler = service_fn(move |_call: ServerCall| {
        let guard = Guard(dropped_tx.clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok::<_, Status>(ServerReply::default())
        }
    });
    let server = Server::builder()
        .keepalive_interval(Some(INTERVAL))
        .keepalive_timeout(TIMEOUT)
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut client = connector.connect(&LinkConfig::default()).await.unwrap();
    let mut buf = BytesMut::new();
    frame::encode_request_header(&mut buf, 1, "t.S/A", None, &Metadata::new());
    send(&mut client, buf, Bytes::new()).await;
    (client, dropped_rx, connector)
}

/// Sends PINGs on `link` until the peer stops taking them (a send waits a second),
/// then keeps the link, never reading it; the task hands it back.
fn flood_pings(mut link: mem::MemLink) -> tokio::task::JoinHandle<mem::MemLink> {
    tokio::spawn(async move {
        for id in 0..100_000u64 {
            let mut buf = BytesMut::new();
            frame::encode_ping_header(&mut buf, id, false);
            let sent =
                tokio::time::timeout(Duration::from_secs(1), send(&mut link, buf, Bytes::new()));
            if sent.await.is_err() {
                break;
            }
        }
        link
    })
}

struct Guard(tokio::sync::mpsc::UnboundedSender<()>);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// `keepalive_min_interval`: PINGs on time are answered; three too soon in a row close
/// the connection with GOAWAY `TOO_MANY_PINGS`. Copies of one PING do not count.
#[tokio::test(start_paused = true)]
async fn a_server_closes_a_client_that_pings_too_often() {
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .keepalive_min_interval(Some(Duration::from_secs(10)))
        .add_named_service(
            "t.S",
            service_fn(|_: ServerCall| async { Ok::<_, Status>(ServerReply::default()) }),
        )
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut client = connector.connect(&LinkConfig::default()).await.unwrap();
    let ping = |id| {
        let mut buf = BytesMut::new();
        frame::encode_ping_header(&mut buf, id, false);
        buf
    };
    // The first PING, two copies of it, then two strikes: all answered.
    for id in [1, 1, 1, 2, 3] {
        send(&mut client, ping(id), Bytes::new()).await;
        assert!(
            matches!(recv(&mut client).await, Some(Frame::Pong { id: got, .. }) if got == id),
            "PING {id} answered"
        );
    }
    // On time: forgiven.
    tokio::time::sleep(Duration::from_secs(10)).await;
    send(&mut client, ping(4), Bytes::new()).await;
    assert!(matches!(
        recv(&mut client).await,
        Some(Frame::Pong { id: 4, .. })
    ));
    for id in [5, 6] {
        send(&mut client, ping(id), Bytes::new()).await;
        assert!(matches!(recv(&mut client).await, Some(Frame::Pong { .. })));
    }
    send(&mut client, ping(7), Bytes::new()).await;
    match recv(&mut client).await {
        Some(Frame::GoAway(goaway)) => assert_eq!(goaway.code, GoAwayCode::TOO_MANY_PINGS),
        other => panic!("expected GOAWAY, got {other:?}"),
    }
    assert!(recv(&mut client).await.is_none(), "closed after the GOAWAY");
}

/// A server that floods PINGs and then reads nothing: the client's PONGs cannot leave,
/// its queue of answers stays full and it stops reading. That stall is no sign of
/// life: keepalive ends the connection, and the call fails `UNAVAILABLE` long before
/// its deadline. (It counted as life: the connection and its calls waited until the
/// server closed it; from a review.)
#[tokio::test(start_paused = true)]
async fn a_server_that_floods_pings_and_reads_nothing_is_declared_dead() {
    let (mut listener, connector) = mem::listener();
    let mut channel = keepalive_channel(connector);
    let pending = start(&mut channel, call(b"1")).await;
    let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
    let Some(Frame::Request(_)) = recv(&mut server).await else {
        panic!("expected the request");
    };
    let since = Instant::now();
    // PINGs until the client stops taking them; then the link is kept, never read.
    let flood = flood_pings(server);
    let err = tokio::time::timeout(DEADLINE / 2, pending)
        .await
        .expect("the stalled connection was never declared dead")
        .expect_err("nothing answered the call");
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert!(err.message().contains("keepalive"), "{err}");
    assert!(since.elapsed() < DEADLINE / 2, "{:?}", since.elapsed());
    drop(flood);
}

/// The server side of the same: a client that sent a request, floods PINGs and reads
/// nothing more fills the server's queue of answers, which stops its reading; that
/// stall is no sign of life, and the connection and its handler go within the
/// keepalive's bounds, as for a silent client.
#[tokio::test(start_paused = true)]
async fn a_server_drops_a_client_that_floods_pings_and_reads_nothing() {
    let (client, mut dropped_rx, _connector) = a_call_that_never_ends().await;
    let flood = flood_pings(client);
    tokio::time::timeout(DEADLINE, dropped_rx.recv())
        .await
        .expect("the handler of a client that reads nothing was kept")
        .expect("the handler was dropped");
    drop(flood);
}

/// A server that sends GOAWAY on every new connection while holding the call it took
/// there: the channel keeps at most 64 such connections draining, and fails the calls
/// of the oldest past that (possibly run: the server took them), instead of keeping
/// every one with its buffers.
#[tokio::test(start_paused = true)]
async fn a_channel_keeps_64_draining_connections_at_most() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let mut calls = Vec::new();
    let mut servers = Vec::new();
    for n in 0..65u64 {
        let pending = start(&mut channel, call(b"x")).await;
        let mut server = listener.accept(&LinkConfig::default()).await.unwrap();
        let Some(Frame::Request(request)) = recv(&mut server).await else {
            panic!("expected the request of call {n}");
        };
        let mut buf = BytesMut::new();
        frame::encode_goaway(&mut buf, request.id, GoAwayCode::NO_ERROR, "going away");
        send(&mut server, buf, Bytes::new()).await;
        calls.push(tokio::spawn(pending));
        servers.push(server);
        // Time for the channel to read the GOAWAY before the next call.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = tokio::time::timeout(DEADLINE / 2, calls.remove(0))
        .await
        .expect("the oldest draining connection was kept")
        .unwrap()
        .expect_err("nothing answered it");
    assert_eq!(first.code(), Code::UNAVAILABLE, "{first}");
    assert!(first.message().contains("draining"), "{first}");
    assert!(!first.is_unprocessed(), "the server took it: {first}");
    // The others wait on.
    assert!(calls.iter().all(|c| !c.is_finished()));
}

/// At the streams' bound the server reads ahead (a PONG found there counts), so its
/// keepalive still finds a client that went silent there: its streams' handlers, which
/// wait for answer credit, are dropped within the keepalive's bounds, not kept for
/// ever. (From a review: the bound counted as a stop, which made every poll a sign of
/// life.)
#[tokio::test(start_paused = true)]
async fn a_silent_client_at_the_streams_bound_is_dropped() {
    use futures::StreamExt;
    let (listener, connector) = mem::listener();
    let (dropped_tx, mut dropped_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    // Four answers of 30 KiB per request: the fourth waits for credit, before the
    // next request is read.
    let handler = service_fn(move |call: ServerCall| {
        let guard = Guard(dropped_tx.clone());
        async move {
            let requests = call.stream.as_ref().and_then(|s| s.take()).unwrap();
            let replies = requests
                .flat_map(|message| {
                    let answers = if message.is_ok() { 4 } else { 0 };
                    futures::stream::iter(
                        (0..answers).map(|_| Ok(rpc_core::Payload::from(vec![7u8; 30 * 1024]))),
                    )
                })
                .map(move |m| {
                    let _ = &guard;
                    m
                });
            Ok::<_, Status>(ServerReply {
                stream: Some(rpc_core::stream::TakeOnce::new(replies.boxed())),
                ..ServerReply::default()
            })
        }
    });
    let server = Server::builder()
        .stream_window(64 * 1024)
        .max_frame_len(64 * 1024)
        .keepalive_interval(Some(INTERVAL))
        .keepalive_timeout(TIMEOUT)
        .add_named_service("t.S", handler)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut client = connector.connect(&LinkConfig::default()).await.unwrap();
    // Five streams, two requests of 60 KiB each: 300 KiB unread past a bound of 256.
    for id in 1..=5u64 {
        let mut header = BytesMut::new();
        frame::encode_request_header_flags(
            &mut header,
            id,
            "t.S/Echo",
            None,
            None,
            &Metadata::new(),
            frame::FLAG_STREAMING,
        );
        send(&mut client, header, Bytes::new()).await;
        for flags in [0, frame::FLAG_END_STREAM] {
            let mut data = BytesMut::new();
            frame::encode_data_header(&mut data, id, flags, None);
            send(&mut client, data, Bytes::from(vec![1u8; 60 * 1024])).await;
        }
    }
    // Silent from here on: nothing read, nothing sent.
    tokio::time::timeout(DEADLINE, dropped_rx.recv())
        .await
        .expect("the handlers of a silent client at the streams' bound were kept")
        .expect("a handler was dropped");
    drop(client);
}

/// A server that stops reading (stuck, its end of the connection still open): the
/// calls that filled the connection expire, the next ones wait to be written, and
/// none is pending. The keepalive probed only for pending calls, so the connection
/// was never found dead and every later call waited for its deadline, or for ever
/// (from a review). Calls waiting to be written count now.
#[tokio::test(start_paused = true)]
async fn a_server_that_stopped_reading_is_found_dead_with_calls_waiting_to_be_written() {
    let (mut listener, connector) = mem::listener();
    let mut channel = keepalive_channel(connector);
    let mut short = call(b"x");
    short.timeout = Some(Duration::from_millis(100));
    let mut expiring = Vec::new();
    for _ in 0..200 {
        expiring.push(start(&mut channel, short.clone()).await);
    }
    // Accepted, and never read.
    let _server = listener.accept(&LinkConfig::default()).await.unwrap();
    for call in expiring {
        let err = call.await.expect_err("nobody answers");
        assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
    }
    let mut no_deadline = call(b"y");
    no_deadline.timeout = None;
    let waiting = start(&mut channel, no_deadline).await;
    let err = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the call waited for a server that reads nothing")
        .expect_err("nobody answers");
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
}
