//! The client channel against a scripted server over the in-memory transport: GOAWAY
//! handling, PING, unknown ids, backpressure and reconnect backoff, deterministic under
//! paused time.

use std::{future::poll_fn, task::Poll, time::Duration};

use bytes::{Bytes, BytesMut};
use rpc_core::{
    client::{Channel, ClientCall, ResponseFuture},
    frame::{self, DecodeLimits, Frame, GoAwayCode, RequestFrame},
    link::{mem, Link, LinkConfig, Listener},
    Code, Metadata,
};
use tower::{Service, ServiceExt};

fn call(method: &'static str, payload: &'static [u8]) -> ClientCall {
    ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Bytes::from_static(payload).into(),
        stream: None,
        compress: None,
    }
}

async fn start(channel: &mut Channel, c: ClientCall) -> ResponseFuture {
    channel.ready().await.unwrap().call(c)
}

/// The server end of one in-memory connection, driven by the test.
struct Script<L: Link> {
    link: L,
}

impl<L: Link> Script<L> {
    async fn recv(&mut self) -> Frame {
        let bytes = poll_fn(|cx| self.link.poll_recv(cx))
            .await
            .expect("client closed")
            .expect("link error");
        Frame::decode(bytes, &DecodeLimits::default()).expect("client sent a bad frame")
    }

    async fn recv_request(&mut self) -> RequestFrame {
        match self.recv().await {
            Frame::Request(r) => r,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    async fn send(&mut self, bytes: BytesMut, payload: Bytes) {
        poll_fn(|cx| self.link.poll_ready(cx)).await.unwrap();
        self.link.start_send(&bytes, payload.into()).unwrap();
        poll_fn(|cx| self.link.poll_flush(cx)).await.unwrap();
    }

    async fn respond(&mut self, id: u64, payload: &'static [u8]) {
        let mut buf = BytesMut::new();
        frame::encode_response_header(&mut buf, id, Code::OK, "", &[], &Metadata::new());
        self.send(buf, Bytes::from_static(payload)).await;
    }
}

async fn accept(listener: &mut mem::MemListener) -> Script<mem::MemLink> {
    Script {
        link: listener.accept(&LinkConfig::default()).await.unwrap(),
    }
}

#[tokio::test(start_paused = true)]
async fn goaway_fails_unprocessed_calls_answers_the_rest_and_moves_on() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let first = start(&mut channel, call("t.S/A", b"1")).await;
    let second = start(&mut channel, call("t.S/A", b"2")).await;
    let mut server = accept(&mut listener).await;
    let id1 = server.recv_request().await.id;
    let id2 = server.recv_request().await.id;
    assert!(id1 < id2);

    let mut goaway = BytesMut::new();
    frame::encode_goaway(&mut goaway, id1, GoAwayCode::NO_ERROR, "restarting");
    server.send(goaway, Bytes::new()).await;

    // Above last_id: never processed, failed at once and safe to retry.
    let err = second.await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE);
    assert!(err.message().contains("not processed"), "{err}");

    // New calls go to a new connection while the old one drains.
    let third = start(&mut channel, call("t.S/A", b"3")).await;
    let mut server2 = accept(&mut listener).await;
    let r3 = server2.recv_request().await;
    assert_eq!(r3.payload, "3");
    server2.respond(r3.id, b"three").await;
    assert_eq!(third.await.unwrap().payload, "three");

    // The draining connection still delivers the answer to the call it kept.
    server.respond(id1, b"one").await;
    assert_eq!(first.await.unwrap().payload, "one");
}

#[tokio::test(start_paused = true)]
async fn ping_is_answered_and_unknown_ids_are_ignored() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let pending = start(&mut channel, call("t.S/A", b"x")).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;

    let mut ping = BytesMut::new();
    frame::encode_ping_header(&mut ping, 42, false);
    server.send(ping, Bytes::from_static(b"token")).await;
    match server.recv().await {
        Frame::Pong { id, payload } => {
            assert_eq!(id, 42);
            assert_eq!(payload, "token");
        }
        other => panic!("expected PONG, got {other:?}"),
    }

    server.respond(request.id + 1000, b"stray").await;
    server.respond(request.id, b"mine").await;
    assert_eq!(pending.await.unwrap().payload, "mine");
}

#[tokio::test(start_paused = true)]
async fn poll_ready_waits_at_the_in_flight_limit() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().max_in_flight(2).connect_lazy(connector);
    let a = start(&mut channel, call("t.S/A", b"a")).await;
    let _b = start(&mut channel, call("t.S/A", b"b")).await;
    let mut other = channel.clone();
    let ready = poll_fn(|cx| Poll::Ready(other.poll_ready(cx))).await;
    assert!(
        ready.is_pending(),
        "a third call was admitted past the limit"
    );

    let mut server = accept(&mut listener).await;
    let r = server.recv_request().await;
    server.respond(r.id, b"done").await;
    a.await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), poll_fn(|cx| other.poll_ready(cx)))
        .await
        .expect("a finished call did not free its slot")
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn refused_connections_fail_fast_then_retry_after_backoff() {
    let (listener, connector) = mem::listener();
    drop(listener);
    let mut channel = Channel::builder()
        .reconnect_backoff(Duration::from_secs(1), Duration::from_secs(8))
        .connect_lazy(connector);
    let err = start(&mut channel, call("t.S/A", b""))
        .await
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE);
    assert!(err.message().contains("connect"), "{err}");
    // During the backoff, calls fail at once without a new attempt.
    let err = start(&mut channel, call("t.S/A", b""))
        .await
        .await
        .unwrap_err();
    assert!(err.message().contains("not connected"), "{err}");
    // After it, the next call tries again (and fails again: nobody listens).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let err = start(&mut channel, call("t.S/A", b""))
        .await
        .await
        .unwrap_err();
    assert!(err.message().contains("connect to"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_server_that_closes_before_speaking_counts_as_a_failed_attempt() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder()
        .reconnect_backoff(Duration::from_secs(1), Duration::from_secs(8))
        .connect_lazy(connector);
    // The server accepts each connection and closes it without a word. The first
    // such loss reconnects at once (it may be a server that crashed mid-call on a
    // fresh connection); the second in a row counts as a failed attempt.
    for _ in 0..2 {
        let pending = start(&mut channel, call("t.S/A", b"")).await;
        drop(accept(&mut listener).await);
        let err = pending.await.unwrap_err();
        assert_eq!(err.code(), Code::UNAVAILABLE);
        assert!(err.message().contains("lost"), "{err}");
    }
    // Backing off: the next call fails at once and opens no connection.
    let err = start(&mut channel, call("t.S/A", b""))
        .await
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE);
    assert!(err.message().contains("not connected"), "{err}");
    assert!(
        tokio::time::timeout(
            Duration::from_millis(1),
            listener.accept(&LinkConfig::default())
        )
        .await
        .is_err(),
        "a connection was opened during the backoff"
    );
    // After the backoff a call connects again; a server that answers resets it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pending = start(&mut channel, call("t.S/A", b"x")).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    server.respond(request.id, b"y").await;
    assert_eq!(&pending.await.unwrap().payload[..], b"y");
    drop(server);
    // That connection's server spoke: losing it is no failed attempt, and the next
    // call reconnects at once.
    tokio::task::yield_now().await;
    let pending = start(&mut channel, call("t.S/A", b"z")).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    server.respond(request.id, b"w").await;
    assert_eq!(&pending.await.unwrap().payload[..], b"w");
}

#[tokio::test(start_paused = true)]
async fn timeout_travels_as_the_remaining_budget() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder()
        .timeout(Duration::from_millis(750))
        .connect_lazy(connector);
    let pending = start(&mut channel, call("t.S/A", b"")).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    let budget = request.timeout.expect("no budget on the wire");
    assert!(
        budget <= Duration::from_millis(750) && budget > Duration::from_millis(700),
        "{budget:?}"
    );
    // Nobody answers: the caller gives up at its deadline and cancels the call.
    let err = pending.await.unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED);
    match server.recv().await {
        Frame::Cancel { id } => assert_eq!(id, request.id),
        other => panic!("expected CANCEL, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_bad_frame_from_the_server_fails_calls_with_the_cause() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let pending = start(&mut channel, call("t.S/A", b"")).await;
    let mut server = accept(&mut listener).await;
    server.recv_request().await;
    let mut garbage = BytesMut::new();
    garbage.extend_from_slice(&[1, 77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    server.send(garbage, Bytes::new()).await;
    let err = pending.await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE);
    assert!(err.message().contains("unknown frame kind 77"), "{err}");
    // The client told the server why before closing.
    match server.recv().await {
        Frame::GoAway(g) => assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR),
        other => panic!("expected GOAWAY, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn several_draining_connections_all_finish_their_calls() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let mut conns = Vec::new();
    let mut calls = Vec::new();
    for round in 0..2u8 {
        let pending = start(&mut channel, call("t.S/A", b"x")).await;
        let mut server = accept(&mut listener).await;
        let id = server.recv_request().await.id;
        let mut goaway = BytesMut::new();
        frame::encode_goaway(&mut goaway, id, GoAwayCode::NO_ERROR, "draining");
        server.send(goaway, Bytes::new()).await;
        // Let the driver see the GOAWAY before the next call needs a new connection.
        tokio::time::sleep(Duration::from_millis(1)).await;
        conns.push((server, id));
        calls.push((round, pending));
    }
    for (server, id) in &mut conns {
        server.respond(*id, b"done").await;
    }
    for (round, pending) in calls {
        let reply = pending
            .await
            .unwrap_or_else(|e| panic!("call {round}: {e}"));
        assert_eq!(reply.payload, "done");
    }
}

/// A mem link that behaves as the test asks: it refuses every REQUEST (as a link
/// that cannot send it), or it says it may lose frames, as UDP's does (the channel
/// then resends unanswered requests).
struct TestLink {
    link: mem::MemLink,
    refuses_requests: bool,
    lossy: bool,
}

impl Link for TestLink {
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Bytes, rpc_core::Error>>> {
        self.link.poll_recv(cx)
    }

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), rpc_core::Error>> {
        self.link.poll_ready(cx)
    }

    fn start_send(
        &mut self,
        header: &[u8],
        payload: rpc_core::Payload,
    ) -> Result<(), rpc_core::Error> {
        if self.refuses_requests && header.get(1) == Some(&1) {
            return Err(rpc_core::Error::new(
                rpc_core::ErrorKind::Closed,
                "the test link refuses requests",
            ));
        }
        self.link.start_send(header, payload)
    }

    fn poll_flush(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), rpc_core::Error>> {
        self.link.poll_flush(cx)
    }

    fn poll_close(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), rpc_core::Error>> {
        self.link.poll_close(cx)
    }

    fn peer(&self) -> String {
        self.link.peer()
    }

    fn is_reliable(&self) -> bool {
        !self.lossy
    }
}

/// Connects [`TestLink`]s with the given behaviours.
struct TestConnector {
    connector: mem::MemConnector,
    refuses_requests: bool,
    lossy: bool,
}

impl rpc_core::link::Connector for TestConnector {
    type Link = TestLink;

    async fn connect(&self, config: &LinkConfig) -> Result<TestLink, rpc_core::Error> {
        Ok(TestLink {
            link: self.connector.connect(config).await?,
            refuses_requests: self.refuses_requests,
            lossy: self.lossy,
        })
    }

    fn target(&self) -> String {
        self.connector.target()
    }
}

/// Issue 19, finding 11: a call the link refused to send was dropped, and its caller
/// saw "channel driver has stopped". It gets the link's error, as a call that never
/// left (safe to retry), and the channel goes on.
#[tokio::test(start_paused = true)]
async fn a_request_the_link_refuses_fails_unprocessed_with_the_links_error() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(TestConnector {
        connector,
        refuses_requests: true,
        lossy: false,
    });
    let pending = start(&mut channel, call("t.S/A", b"1")).await;
    let _server = accept(&mut listener).await;
    let err = pending.await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert!(err.is_unprocessed(), "{err}");
    assert!(err.message().contains("refuses requests"), "{err}");
    // The next call gets the same answer from a new connection, not a stopped driver.
    let again = start(&mut channel, call("t.S/A", b"2")).await;
    let _server = accept(&mut listener).await;
    let err = again.await.unwrap_err();
    assert!(err.is_unprocessed(), "{err}");
}

/// A call's deadline covers its wait for an in-flight slot: with every slot held by
/// calls a server never answers, a call with a budget fails `DEADLINE_EXCEEDED`
/// (unprocessed: it was never sent) when its budget runs out, instead of waiting for a
/// slot first (from a review: it waited for ever, or until another call's deadline).
#[tokio::test(start_paused = true)]
async fn the_deadline_covers_the_wait_for_an_in_flight_slot() {
    use rpc_core::{
        client::Client,
        method::{Idempotency, MethodDescriptor},
        Request,
    };
    static SAY: MethodDescriptor = MethodDescriptor {
        service: "t.S",
        method: "A",
        path: "t.S/A",
        idempotency: Idempotency::NoSideEffects,
    };
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().max_in_flight(1).connect_lazy(connector);
    let _held = start(&mut channel, call("t.S/A", b"held")).await;
    let mut server = accept(&mut listener).await;
    server.recv_request().await; // and never answered

    let mut client = Client::new(channel.clone());
    let started = tokio::time::Instant::now();
    let status = tokio::time::timeout(
        Duration::from_secs(3600),
        client.unary::<_, String>(
            Request::new("late".to_string()).with_timeout(Duration::from_millis(100)),
            &SAY,
        ),
    )
    .await
    .expect("the call ended at its deadline")
    .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status}");
    assert!(status.is_unprocessed(), "never sent: {status}");
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

/// A call that relies on the channel's default timeout is bounded by it from the
/// moment it is made, its wait for an in-flight slot included: with the one slot held
/// by a call of its own long budget that the server never answers, a generated
/// client's call without a timeout fails `DEADLINE_EXCEEDED`, unprocessed, when the
/// default runs out, and so does one under a retry layer and one through `Balanced`
/// (from a review: the default was applied only when the call was sent, so such a
/// call waited for the slot as long as the holder kept it, or for ever).
#[tokio::test(start_paused = true)]
async fn the_default_timeout_covers_the_wait_for_an_in_flight_slot() {
    use rpc_core::{
        balance::{Balanced, Change},
        client::Client,
        method::{Idempotency, MethodDescriptor},
        retry::{RetryLayer, RetryPolicy},
        Endpoint, Request,
    };
    use tower::Layer;
    static SAY: MethodDescriptor = MethodDescriptor {
        service: "t.S",
        method: "A",
        path: "t.S/A",
        idempotency: Idempotency::NoSideEffects,
    };
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder()
        .max_in_flight(1)
        .timeout(Duration::from_millis(100))
        .connect_lazy(connector);
    let mut held = call("t.S/A", b"held");
    held.timeout = Some(Duration::from_secs(3600));
    let _held = start(&mut channel, held).await;
    let mut server = accept(&mut listener).await;
    server.recv_request().await; // and never answered

    let balanced = {
        let channel = channel.clone();
        Balanced::new(move |_: &Endpoint| Ok(channel.clone()))
    };
    balanced
        .apply(Change::Insert("tcp://10.0.0.1:7000".parse().unwrap()))
        .unwrap();
    let retrying = RetryLayer::new(RetryPolicy::default()).layer(channel.clone());
    for (how, mut client) in [
        (
            "a client",
            Client::new(tower::util::BoxCloneService::new(channel.clone())),
        ),
        (
            "under a retry layer",
            Client::new(tower::util::BoxCloneService::new(retrying)),
        ),
        (
            "through Balanced",
            Client::new(tower::util::BoxCloneService::new(balanced)),
        ),
    ] {
        let started = tokio::time::Instant::now();
        let status = tokio::time::timeout(
            Duration::from_secs(3600),
            client.unary::<_, String>(Request::new("late".to_string()), &SAY),
        )
        .await
        .unwrap_or_else(|_| panic!("{how}: the call ended at the channel's default timeout"))
        .unwrap_err();
        assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{how}: {status}");
        assert!(status.is_unprocessed(), "{how}: never sent: {status}");
        assert!(
            status.message().contains("default timeout"),
            "{how}: {status}"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(100), "{how}");
    }
}

/// A retry's wait for a free slot is bounded by the channel's default timeout too,
/// counted from the call's first attempt: the first attempt fails `UNAVAILABLE`, a
/// call of its own long budget takes the one slot before the backoff ends, and the
/// retry, which would wait for the slot for ever, fails `DEADLINE_EXCEEDED` when the
/// default runs out, 100 ms after the call began (from a review).
#[tokio::test(start_paused = true)]
async fn a_retrys_wait_for_a_slot_ends_with_the_channels_default_timeout() {
    use rpc_core::{
        method::Idempotency,
        retry::{RetryLayer, RetryPolicy},
    };
    use tower::Layer;
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder()
        .max_in_flight(1)
        .timeout(Duration::from_millis(100))
        .connect_lazy(connector);
    let mut retrying = RetryLayer::new(RetryPolicy::default()).layer(channel.clone());
    let mut safe = call("t.S/A", b"retried");
    safe.idempotency = Idempotency::Idempotent;
    let started = tokio::time::Instant::now();
    let retried = tokio::spawn(async move { retrying.ready().await?.call(safe).await });
    let mut server = accept(&mut listener).await;
    let first = server.recv_request().await;
    let mut head = BytesMut::new();
    frame::encode_response_header(
        &mut head,
        first.id,
        Code::UNAVAILABLE,
        "try again",
        &[],
        &Metadata::new(),
    );
    server.send(head, Bytes::new()).await;
    // Takes the slot as soon as the first attempt's answer frees it.
    let mut held = call("t.S/A", b"held");
    held.timeout = Some(Duration::from_secs(3600));
    let _held = start(&mut channel, held).await;
    assert_eq!(server.recv_request().await.payload, "held"); // and never answered
    let status = tokio::time::timeout(Duration::from_secs(3600), retried)
        .await
        .expect("the retry's wait ended at the channel's default timeout")
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status}");
    assert!(status.message().contains("default timeout"), "{status}");
    // The first attempt ran: the call's status does not say it never did.
    assert!(!status.is_unprocessed(), "{status}");
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

/// A call with less than a microsecond left when it is written is not sent with a
/// budget of 0 (which the server takes as a deadline already passed, and refuses as
/// one: the caller then did not learn that it never ran); it fails locally, marked
/// never sent (from a review).
#[tokio::test(start_paused = true)]
async fn a_budget_under_a_microsecond_is_not_sent() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    // Connected first, so that the next call is written at once.
    let first = start(&mut channel, call("t.S/A", b"1")).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    server.respond(request.id, b"ok").await;
    first.await.unwrap();
    for nanos in [1, 500, 999] {
        let mut tiny = call("t.S/A", b"2");
        tiny.timeout = Some(Duration::from_nanos(nanos));
        let status = start(&mut channel, tiny).await.await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::DEADLINE_EXCEEDED,
            "{nanos} ns: {status}"
        );
        assert!(status.is_unprocessed(), "{nanos} ns: never sent: {status}");
    }
    // Nothing was written for them: the next request the server reads is the next call.
    let next = start(&mut channel, call("t.S/A", b"3")).await;
    let request = server.recv_request().await;
    assert_eq!(request.payload, "3");
    server.respond(request.id, b"ok").await;
    next.await.unwrap();
}

/// A stream's deadline ends it even with messages waiting to be read: a server that
/// ignores the budget and sends faster than the reader reads no longer keeps the
/// stream past it (the deadline was looked at only when no message was waiting, so
/// every queued message came first, and a steady sender kept it going for ever).
#[tokio::test(start_paused = true)]
async fn a_stream_past_its_deadline_ends_though_messages_keep_coming() {
    use futures::StreamExt;
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let mut open = call("t.S/Stream", b"");
    open.stream = Some(rpc_core::stream::TakeOnce::new(
        futures::stream::empty::<rpc_core::Payload>().boxed(),
    ));
    open.timeout = Some(Duration::from_millis(100));
    let reply = start(&mut channel, open).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    assert!(request.streaming);
    let mut head = BytesMut::new();
    frame::encode_data_header(
        &mut head,
        request.id,
        frame::FLAG_HAS_METADATA | frame::FLAG_NO_MESSAGE,
        Some(&Metadata::new()),
    );
    server.send(head, Bytes::new()).await;
    let mut messages = reply.await.unwrap().stream.unwrap().take().unwrap();
    // A thousand messages, all there before the reader looks again, which is after the
    // budget.
    for _ in 0..1000 {
        let mut data = BytesMut::new();
        frame::encode_data_header(&mut data, request.id, 0, None);
        server.send(data, Bytes::from_static(b"m")).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut read = 0;
    let status = loop {
        match messages.next().await {
            Some(Ok(_)) => read += 1,
            Some(Err(status)) => break status,
            None => panic!("the stream ended without its deadline"),
        }
    };
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status}");
    assert_eq!(read, 0, "messages read after the deadline");
}

/// On a link that loses datagrams, a GOAWAY's `last_id` cannot speak for a request
/// the client sent again after an unanswered copy: the first copy may have run in an
/// association the server has since forgotten (UDP's listener answers a stranger with
/// GOAWAY `last_id` 0). Such a call fails as possibly run; one sent once is still
/// unprocessed. (A review: the first kind was moved to another replica and ran
/// twice.)
#[tokio::test(start_paused = true)]
async fn a_goaway_does_not_call_a_resent_request_unprocessed() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder()
        .retransmission(
            Duration::from_millis(100),
            Duration::from_millis(100),
            Duration::from_millis(100),
        )
        .connect_lazy(TestConnector {
            connector,
            refuses_requests: false,
            lossy: true,
        });
    let resent = start(&mut channel, call("t.S/A", b"1")).await;
    let mut server = accept(&mut listener).await;
    // The link's keepalive PINGs come between the requests.
    async fn next_request(server: &mut Script<mem::MemLink>) -> RequestFrame {
        loop {
            if let Frame::Request(request) = server.recv().await {
                return request;
            }
        }
    }
    let first = next_request(&mut server).await;
    let again = next_request(&mut server).await; // the retransmission
    assert_eq!(again.id, first.id);
    let once = start(&mut channel, call("t.S/A", b"2")).await;
    let second = next_request(&mut server).await;
    assert_ne!(second.id, first.id);
    let mut buf = BytesMut::new();
    frame::encode_goaway(&mut buf, 0, GoAwayCode::NO_ERROR, "no UDP association");
    server.send(buf, Bytes::new()).await;
    let err = resent.await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE);
    assert!(!err.is_unprocessed(), "{err}");
    let err = once.await.unwrap_err();
    assert!(err.is_unprocessed(), "{err}");
}

/// A response stream read to its end and kept (for its trailers, say) does not keep
/// the connection: once the channel is dropped, the connection closes (the stream's
/// credit function held a sender to the connection's task, which therefore never
/// ended; from a review).
#[tokio::test(start_paused = true)]
async fn a_finished_stream_kept_after_its_channel_does_not_keep_the_connection() {
    use futures::StreamExt;
    use rpc_core::stream::TakeOnce;

    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let mut c = call("t.S/Stream", b"");
    c.stream = Some(TakeOnce::new(futures::stream::empty().boxed()));
    let pending = start(&mut channel, c).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    let mut head = BytesMut::new();
    frame::encode_data_header(
        &mut head,
        request.id,
        frame::FLAG_NO_MESSAGE,
        Some(&Metadata::new()),
    );
    server.send(head, Bytes::new()).await;
    let reply = pending.await.unwrap();
    let mut answers = reply.stream.unwrap().take().unwrap();
    let mut message = BytesMut::new();
    frame::encode_data_header(&mut message, request.id, 0, None);
    server.send(message, Bytes::from_static(b"one")).await;
    let mut end = BytesMut::new();
    frame::encode_response_header(&mut end, request.id, Code::OK, "", &[], &Metadata::new());
    server.send(end, Bytes::new()).await;
    assert_eq!(answers.next().await.unwrap().unwrap(), "one");
    assert!(answers.next().await.is_none());
    // The finished stream is kept; the channel goes.
    drop(channel);
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match poll_fn(|cx| server.link.poll_recv(cx)).await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => continue, // its half-close, a WINDOW
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection stayed open");
    drop(answers);
}

/// A server that takes every connection and turns it away at once with a graceful
/// GOAWAY (draining for good, or overloaded) is backed off from as one that refuses
/// connections: the first such connection reconnects at once, the second in a row
/// starts the backoff. The GOAWAY reset the backoff, so every call opened a
/// connection, a reconnect storm at a server least able to take one (from a review).
/// A connection the server served first still reconnects at once after its GOAWAY
/// (`goaway_fails_unprocessed_calls_answers_the_rest_and_moves_on`).
#[tokio::test(start_paused = true)]
async fn a_server_that_sends_goaway_on_every_new_connection_is_backed_off_from() {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };
    let (mut listener, connector) = mem::listener();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok(link) = listener.accept(&LinkConfig::default()).await {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut server = Script { link };
            let mut goaway = BytesMut::new();
            frame::encode_goaway(&mut goaway, 0, GoAwayCode::NO_ERROR, "draining");
            server.send(goaway, Bytes::new()).await;
            open.push(server); // and never closed
        }
    });
    let mut channel = Channel::builder()
        .reconnect_backoff(Duration::from_secs(1), Duration::from_secs(8))
        .connect_lazy(connector);
    for _ in 0..10 {
        let err = start(&mut channel, call("t.S/A", b""))
            .await
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
        assert!(err.is_unprocessed(), "{err}");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "connections opened for 10 calls"
    );
    let err = start(&mut channel, call("t.S/A", b""))
        .await
        .await
        .unwrap_err();
    assert!(err.message().contains("not connected"), "{err}");
}

/// The same with a server of this crate at its connection limit, which answers each
/// new connection with GOAWAY `TOO_MANY_CONNECTIONS` and closes it: that GOAWAY counted
/// as the server speaking on the connection, and every call reconnected at once.
#[tokio::test(start_paused = true)]
async fn a_server_at_its_connection_limit_is_backed_off_from() {
    use rpc_core::{
        server::{Server, ServerCall, ServerReply},
        Status,
    };
    let (listener, connector) = mem::listener();
    let echo = tower::service_fn(|call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let server = Server::builder()
        .max_connections(1)
        .evict_quiet_after(None)
        .add_named_service("t.S", echo)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    // Another client holds the one connection the server takes.
    let mut holder = Channel::builder().connect_lazy(connector.clone());
    let reply = start(&mut holder, call("t.S/A", b"hi"))
        .await
        .await
        .unwrap();
    assert_eq!(reply.payload, "hi");

    let mut channel = Channel::builder()
        .reconnect_backoff(Duration::from_secs(1), Duration::from_secs(8))
        .connect_lazy(connector);
    let mut turned_away = 0;
    for _ in 0..10 {
        let err = start(&mut channel, call("t.S/A", b""))
            .await
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
        assert!(err.is_unprocessed(), "{err}");
        if !err.message().contains("not connected") {
            turned_away += 1; // by the server, on a connection of its own
        }
    }
    assert_eq!(turned_away, 2, "connections opened for 10 calls");
}

/// A call still waiting to be written when its deadline passes (here: behind calls
/// that filled a link the server does not read) never left the client: it fails
/// `DEADLINE_EXCEEDED` marked unprocessed, as other calls that never left are, so that
/// a retry may send it again whatever the method; and it is not written later. A call
/// that was written and timed out is not marked (the server may be running it). The
/// mark was missing on both (from a review).
#[tokio::test(start_paused = true)]
async fn a_call_still_queued_at_its_deadline_fails_unprocessed_and_is_never_sent() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let timed = |payload: &'static [u8]| {
        let mut c = call("t.S/A", payload);
        c.timeout = Some(Duration::from_millis(100));
        c
    };
    let written = start(&mut channel, timed(b"written")).await;
    // The in-memory link holds 65 frames: these fill it.
    let mut fillers = Vec::new();
    for _ in 0..100 {
        fillers.push(start(&mut channel, call("t.S/A", b"filler")).await);
    }
    let queued = start(&mut channel, timed(b"queued")).await;

    let err = queued.await.unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
    assert!(err.is_unprocessed(), "a call that never left: {err}");
    let err = written.await.unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
    assert!(!err.is_unprocessed(), "a call the server may run: {err}");

    // The server reads now: every call but the expired queued one, and the CANCEL of
    // the written one.
    let mut server = accept(&mut listener).await;
    let (mut requests, mut cancelled) = (0, false);
    while requests < 101 || !cancelled {
        match server.recv().await {
            Frame::Request(r) => {
                assert_ne!(r.payload, "queued", "the expired call was sent");
                requests += 1;
            }
            Frame::Cancel { .. } => cancelled = true,
            other => panic!("unexpected {other:?}"),
        }
    }
    let more = tokio::time::timeout(Duration::from_millis(10), server.recv()).await;
    assert!(more.is_err(), "{:?}", more.unwrap());
    drop(fillers);
}

/// A method name the wire does not allow (no `/`, a leading `/`, two of them, or one
/// too long for its 16-bit length) fails its call alone with INVALID_ARGUMENT and is
/// never written: sent, the server would close the connection and fail every other
/// call on it (as `rpc call` passing a user's typo through once could).
#[tokio::test(start_paused = true)]
async fn a_method_the_wire_does_not_allow_fails_alone_and_is_not_sent() {
    let (mut listener, connector) = mem::listener();
    let mut channel = Channel::builder().connect_lazy(connector);
    let long: &'static str = Box::leak(format!("t.S/{}", "m".repeat(70_000)).into_boxed_str());
    for bad in ["noslash", "/t.S/M", "t.S/", "/M", long] {
        let status = start(&mut channel, call(bad, b"x"))
            .await
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::INVALID_ARGUMENT,
            "{bad:.20}: {status:?}"
        );
        assert!(status.is_unprocessed(), "{bad:.20}: never left the client");
    }
    let good = start(&mut channel, call("t.S/A", b"ok")).await;
    let mut server = accept(&mut listener).await;
    let request = server.recv_request().await;
    assert_eq!(
        &*request.method, "t.S/A",
        "the first request the server sees"
    );
    server.respond(request.id, b"fine").await;
    assert_eq!(&good.await.unwrap().payload[..], b"fine");
}
