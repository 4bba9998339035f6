//! Hostile peers over real TCP, for the frames of streams, bulk transfers, PING/PONG
//! and GOAWAY. Every frame a hostile peer sends here is encoded by hand from
//! `docs/wire.md` (the framework's encoders are not used for them), and every case
//! checks what the document says the receiver does: ignore the frame, answer it, or
//! send GOAWAY and close. After each attack a well-behaved client on the same server
//! (or a new connection of the same channel, for the client cases) still gets its
//! calls answered.

mod common;

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use common::TestServer;
use futures::{stream, StreamExt};
use rpc_core::{
    bulk::Exposed,
    client::{Channel, ClientCall},
    frame::{DecodeLimits, Frame, GoAwayCode, GoAwayFrame, RequestFrame, ResponseFrame},
    server::{Server, ServerBuilder, ServerCall, ServerReply},
    stream::{RawStreaming, TakeOnce},
    Code, Metadata, Payload, Status,
};
use rpc_proto::echo::{
    echo_client::EchoClient, echo_server::EchoServer, EchoService, SayReply, SayRequest,
    SleepRequest,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tower::{service_fn, Service, ServiceExt};

/// Turns a hang into a failure; never an assertion on speed.
const HANG_GUARD: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// Frames, encoded by hand from docs/wire.md
// ---------------------------------------------------------------------------------------

const REQUEST: u8 = 1;
const RESPONSE: u8 = 2;
const CANCEL: u8 = 3;
const GOAWAY: u8 = 4;
const PING: u8 = 5;
const PONG: u8 = 6;
const DATA: u8 = 7;
const WINDOW: u8 = 8;
const BULK: u8 = 9;
const BULK_REPLY: u8 = 10;

const FLAG_STREAMING: u16 = 0x0004;
const FLAG_COMPRESSED: u16 = 0x0008;
const FLAG_END_STREAM: u16 = 0x0001;
const FLAG_HAS_METADATA: u16 = 0x0002;
const FLAG_NO_MESSAGE: u16 = 0x0004;
const FLAG_BULK_WRITE: u16 = 0x0001;

/// §2.1: version, kind, flags (u16 BE), id (u64 BE).
fn header(kind: u8, flags: u16, id: u64) -> Vec<u8> {
    let mut f = vec![1, kind];
    f.extend_from_slice(&flags.to_be_bytes());
    f.extend_from_slice(&id.to_be_bytes());
    f
}

/// §2.5, without timeout or call key, with empty metadata.
fn request(id: u64, flags: u16, method: &str, payload: &[u8]) -> Vec<u8> {
    let mut f = header(REQUEST, flags, id);
    f.extend_from_slice(&0u64.to_be_bytes());
    f.extend_from_slice(&(method.len() as u16).to_be_bytes());
    f.extend_from_slice(method.as_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn stream_request(id: u64, method: &str) -> Vec<u8> {
    request(id, FLAG_STREAMING, method, &[])
}

/// §2.10, without metadata.
fn data(id: u64, flags: u16, message: &[u8]) -> Vec<u8> {
    let mut f = header(DATA, flags, id);
    f.extend_from_slice(message);
    f
}

/// §2.11.
fn window(id: u64, increment: u32) -> Vec<u8> {
    let mut f = header(WINDOW, 0, id);
    f.extend_from_slice(&increment.to_be_bytes());
    f
}

fn cancel(id: u64) -> Vec<u8> {
    header(CANCEL, 0, id)
}

fn ping(kind: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = header(kind, 0, id);
    f.extend_from_slice(payload);
    f
}

/// §2.8.
fn goaway(last_id: u64, code: u32, reason: &[u8]) -> Vec<u8> {
    let mut f = header(GOAWAY, 0, last_id);
    f.extend_from_slice(&code.to_be_bytes());
    f.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    f.extend_from_slice(reason);
    f
}

/// §2.12: a BULK read (no data) or write.
fn bulk(id: u64, write: bool, token: u64, offset: u64, len: u32, data: &[u8]) -> Vec<u8> {
    let mut f = header(BULK, if write { FLAG_BULK_WRITE } else { 0 }, id);
    f.extend_from_slice(&token.to_be_bytes());
    f.extend_from_slice(&offset.to_be_bytes());
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(data);
    f
}

/// §2.12.
fn bulk_reply(id: u64, code: u32, message: &[u8], data: &[u8]) -> Vec<u8> {
    let mut f = header(BULK_REPLY, 0, id);
    f.extend_from_slice(&code.to_be_bytes());
    f.extend_from_slice(&(message.len() as u32).to_be_bytes());
    f.extend_from_slice(message);
    f.extend_from_slice(data);
    f
}

/// §2.6: an OK RESPONSE with empty metadata.
fn ok_response(id: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = header(RESPONSE, 0, id);
    f.extend_from_slice(&[0; 16]); // code, message_len, details_len, metadata_len
    f.extend_from_slice(payload);
    f
}

/// §1.1: the 4-byte length prefix, then the frame.
fn framed(frame: &[u8]) -> Vec<u8> {
    let mut buf = (frame.len() as u32).to_be_bytes().to_vec();
    buf.extend_from_slice(frame);
    buf
}

async fn send(sock: &mut (impl AsyncWrite + Unpin), frame: &[u8]) {
    sock.write_all(&framed(frame)).await.unwrap();
}

/// Reads one frame (decoded with the framework's codec: the real peer sends only valid
/// frames); `None` at end of stream or on a reset.
async fn recv(sock: &mut (impl AsyncRead + Unpin)) -> Option<Frame> {
    tokio::time::timeout(HANG_GUARD, async {
        let mut len = [0u8; 4];
        sock.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        sock.read_exact(&mut body).await.ok()?;
        Some(
            Frame::decode(body.into(), &DecodeLimits::default())
                .expect("the peer sent a bad frame"),
        )
    })
    .await
    .expect("the peer neither answered nor closed")
}

/// Reads until the peer sends GOAWAY and closes; returns the GOAWAY.
async fn expect_goaway_and_close(sock: &mut (impl AsyncRead + Unpin)) -> GoAwayFrame {
    let mut goaway = None;
    while let Some(frame) = recv(sock).await {
        if let Frame::GoAway(g) = frame {
            assert!(goaway.is_none(), "two GOAWAYs");
            goaway = Some(g);
        }
    }
    goaway.expect("connection closed without GOAWAY")
}

/// Sends PING `token` and returns every frame read before its PONG. Fails on GOAWAY or
/// end of stream: the connection must still be up.
async fn sync(sock: &mut TcpStream, token: u64) -> Vec<Frame> {
    send(sock, &ping(PING, token, b"sync")).await;
    let mut before = Vec::new();
    loop {
        match recv(sock).await {
            Some(Frame::Pong { id, payload }) if id == token => {
                assert_eq!(&payload[..], b"sync", "PONG carries the PING's payload");
                return before;
            }
            Some(Frame::GoAway(g)) => panic!("unexpected GOAWAY: {g:?}"),
            Some(frame) => before.push(frame),
            None => panic!("the connection closed (PING {token} unanswered)"),
        }
    }
}

/// Reads until the RESPONSE for `id` (other frames are skipped: a PONG may overtake a
/// response, the protocol orders neither). Fails on GOAWAY or end of stream.
async fn response(sock: &mut TcpStream, id: u64) -> ResponseFrame {
    loop {
        match recv(sock).await {
            Some(Frame::Response(r)) if r.id == id => return r,
            Some(Frame::GoAway(g)) => panic!("unexpected GOAWAY: {g:?}"),
            Some(_) => {}
            None => panic!("the connection closed (request {id} unanswered)"),
        }
    }
}

fn responses(frames: &[Frame]) -> Vec<&ResponseFrame> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Response(r) => Some(r),
            _ => None,
        })
        .collect()
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    tokio::time::timeout(HANG_GUARD, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never happened: {what}"));
}

/// Waits until `value` stops changing (unchanged over ten looks 50 ms apart), failing
/// as soon as it exceeds `bound`. Returns the settled value.
async fn settles_within(what: &str, value: impl Fn() -> usize, bound: usize) -> usize {
    tokio::time::timeout(HANG_GUARD, async {
        let (mut last, mut same) = (value(), 0);
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = value();
            assert!(
                now <= bound,
                "{what}: {now}, more than the bound of {bound}"
            );
            if now == last {
                same += 1;
                if same == 10 {
                    return now;
                }
            } else {
                (last, same) = (now, 0);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} never settled"))
}

// ---------------------------------------------------------------------------------------
// The server under attack
// ---------------------------------------------------------------------------------------

/// What the test service saw.
#[derive(Default)]
struct Probe {
    /// Response messages the producing handlers made.
    produced: AtomicUsize,
    /// Handlers (or their response streams) dropped.
    dropped: AtomicUsize,
    /// `Hold` handlers started.
    held: AtomicUsize,
    /// Buffers `t.H/Expose` exposed, kept until the test takes them.
    exposed: Mutex<Vec<Exposed>>,
    /// Payloads (answers of `t.H/Answer`, messages of `Produce`) alive: made and not
    /// yet dropped, i.e. held somewhere in the server (or being written).
    alive: Arc<AtomicUsize>,
}

/// A payload that counts itself in `Probe::alive` while it exists.
struct Counted(Vec<u8>, Arc<AtomicUsize>);

impl Counted {
    fn payload(bytes: Vec<u8>, alive: &Arc<AtomicUsize>) -> Payload {
        alive.fetch_add(1, Ordering::SeqCst);
        Payload::from(Bytes::from_owner(Counted(bytes, alive.clone())))
    }
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::SeqCst);
    }
}

struct DropCount(Arc<Probe>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// Size of the bulk buffers `t.H/Expose` exposes.
const EXPOSED_LEN: usize = 4096;

fn exposed_pattern() -> Bytes {
    (0..EXPOSED_LEN).map(|i| (i % 251) as u8).collect()
}

/// `t.H`, a service written against the raw server API:
/// - `Produce` / `ProduceBig`: streams 1000-byte / 64 KiB messages forever, each made
///   only when the stream is polled (counted in `produced`);
/// - `Hold`: a stream whose handler never reads its requests and never ends;
/// - `Drain`: reads the request stream to its end, answers with (messages, bytes) as
///   two u64 BE;
/// - `Expose`: exposes a 4 KiB buffer to read and one to write, and answers with their
///   two descriptors (18 bytes each).
fn hostile_service(
    probe: Arc<Probe>,
) -> impl Service<ServerCall, Response = ServerReply, Error = Status, Future = impl Send + 'static>
       + Clone
       + Send
       + Sync
       + 'static {
    service_fn(move |call: ServerCall| {
        let probe = probe.clone();
        async move {
            match call.method.as_str() {
                "t.H/Produce" | "t.H/ProduceBig" => {
                    let size = if call.method.as_str() == "t.H/Produce" {
                        1000
                    } else {
                        64 << 10
                    };
                    let guard = DropCount(probe.clone());
                    let messages = stream::iter(0u64..)
                        .map(move |i| {
                            let _ = &guard;
                            probe.produced.fetch_add(1, Ordering::SeqCst);
                            Ok(Counted::payload(vec![i as u8; size], &probe.alive))
                        })
                        .boxed();
                    Ok(ServerReply {
                        stream: Some(TakeOnce::new(messages)),
                        ..ServerReply::default()
                    })
                }
                "t.H/Answer" | "t.H/AnswerLater" => {
                    if call.method.as_str() == "t.H/AnswerLater" {
                        tokio::task::yield_now().await;
                    }
                    Ok(ServerReply {
                        payload: Counted::payload(vec![7; 4096], &probe.alive),
                        ..ServerReply::default()
                    })
                }
                "t.H/Wait" => {
                    probe.held.fetch_add(1, Ordering::SeqCst);
                    let _guard = DropCount(probe);
                    std::future::pending().await
                }
                "t.H/Hold" => {
                    probe.held.fetch_add(1, Ordering::SeqCst);
                    let _guard = DropCount(probe);
                    let _requests = call.stream.and_then(|s| s.take());
                    std::future::pending().await
                }
                "t.H/Drain" => {
                    let mut requests = call
                        .stream
                        .and_then(|s| s.take())
                        .ok_or_else(|| Status::invalid_argument("not a stream"))?;
                    let (mut messages, mut bytes) = (0u64, 0u64);
                    while let Some(message) = requests.next().await {
                        messages += 1;
                        bytes += message?.len() as u64;
                    }
                    let mut payload = messages.to_be_bytes().to_vec();
                    payload.extend_from_slice(&bytes.to_be_bytes());
                    Ok(ServerReply {
                        payload: Payload::from(payload),
                        ..ServerReply::default()
                    })
                }
                "t.H/Expose" => {
                    let bulk = call.bulk.expect("the server sets the bulk endpoint");
                    let ttl = Duration::from_secs(300);
                    let read = bulk.expose_read(exposed_pattern(), ttl)?;
                    let write = bulk.expose_write(EXPOSED_LEN, ttl)?;
                    let mut payload = read.descriptor().to_bytes().to_vec();
                    payload.extend_from_slice(&write.descriptor().to_bytes());
                    probe.exposed.lock().unwrap().extend([read, write]);
                    Ok(ServerReply {
                        payload: Payload::from(payload),
                        ..ServerReply::default()
                    })
                }
                other => Err(Status::unimplemented(format!("unknown method {other}"))),
            }
        }
    })
}

struct Target {
    server: TestServer,
    /// The server's handle, for its connections' statistics.
    handle: Server,
    addr: String,
    probe: Arc<Probe>,
    good: EchoClient<Channel>,
}

impl Target {
    async fn start(builder: ServerBuilder) -> Target {
        let probe = Arc::new(Probe::default());
        let server = builder
            .add_service(EchoServer::new(EchoService))
            .add_named_service("t.H", hostile_service(probe.clone()))
            .build();
        let handle = server.clone();
        let server = TestServer::serve(server).await;
        let good = EchoClient::new(rpc_transport_tcp::connect(&server.uri).await.unwrap());
        let mut target = Target {
            addr: server.uri.trim_start_matches("tcp://").to_owned(),
            server,
            handle,
            probe,
            good,
        };
        target.check_good("before").await;
        target
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(&self.addr).await.unwrap()
    }

    /// The well-behaved client still gets its calls answered.
    async fn check_good(&mut self, after: &str) {
        let message = format!("after {after}");
        let reply = tokio::time::timeout(
            HANG_GUARD,
            self.good.say(SayRequest {
                message: message.clone(),
                payload: Default::default(),
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("the good client hangs {after}"))
        .unwrap_or_else(|e| panic!("the good client failed {after}: {e}"));
        assert_eq!(reply.get_ref().message, message);
        let _ = &self.server;
    }

    /// Sends `frames` on a new connection and expects GOAWAY `code` with `last_id` 0
    /// (no request was read), then the close.
    async fn expect_connection_error(&mut self, what: &str, bytes: &[u8], code: GoAwayCode) {
        let mut sock = self.connect().await;
        sock.write_all(bytes).await.unwrap();
        let g = expect_goaway_and_close(&mut sock).await;
        assert_eq!(g.code, code, "{what}: {g:?}");
        assert_eq!(g.last_id, 0, "{what}: no request was read");
        self.check_good(what).await;
    }
}

fn say_payload(message: &str) -> Vec<u8> {
    rpc_core::payload::encode(&SayRequest {
        message: message.into(),
        payload: Default::default(),
    })
    .to_bytes()
    .to_vec()
}

fn say_reply(response: &ResponseFrame) -> String {
    assert_eq!(response.code, Code::OK, "{response:?}");
    <SayReply as rpc_core::codegen::prost::Message>::decode(response.payload.clone())
        .unwrap()
        .message
}

// ---------------------------------------------------------------------------------------
// DATA
// ---------------------------------------------------------------------------------------

/// §2.10: DATA for an id that is not an open stream is ignored; §6.9: after the
/// client's half-close it sends no more DATA (the server ignores any that comes, and
/// gives its credit back); after the RESPONSE late DATA is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_ids_that_are_not_open_streams_is_ignored() {
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;

    // Never opened.
    send(&mut sock, &data(99, 0, b"stray")).await;
    send(
        &mut sock,
        &data(100, FLAG_END_STREAM | FLAG_NO_MESSAGE, b""),
    )
    .await;
    assert!(sync(&mut sock, 1).await.is_empty());

    // A unary call in flight: DATA on its id does not touch it.
    let sleep = rpc_core::payload::encode(&SleepRequest { delay_ms: 100 }).to_bytes();
    send(
        &mut sock,
        &request(1, 0, "rpc.examples.v1.Echo/Sleep", &sleep),
    )
    .await;
    send(&mut sock, &data(1, 0, b"not a stream")).await;
    send(&mut sock, &data(1, FLAG_END_STREAM, b"")).await;
    let mut frames = sync(&mut sock, 2).await;
    while responses(&frames).is_empty() {
        frames.push(recv(&mut sock).await.expect("the unary call is answered"));
    }
    let r = responses(&frames)[0];
    assert_eq!((r.id, r.code), (1, Code::OK), "{r:?}");
    assert!(frames.iter().all(|f| matches!(f, Frame::Response(_))));

    // A stream: two messages, the half-close, then DATA that must not reach the
    // handler.
    send(&mut sock, &stream_request(3, "t.H/Drain")).await;
    send(&mut sock, &data(3, 0, &[7; 10])).await;
    send(&mut sock, &data(3, 0, &[7; 20])).await;
    send(&mut sock, &data(3, FLAG_END_STREAM | FLAG_NO_MESSAGE, b"")).await;
    send(&mut sock, &data(3, 0, &[8; 1000])).await;
    send(&mut sock, &data(3, FLAG_END_STREAM, &[8; 5])).await;
    let mut end = None;
    while end.is_none() {
        match recv(&mut sock).await.expect("the stream is answered") {
            Frame::Response(r) => end = Some(r),
            Frame::Data(_) | Frame::Window { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let end = end.unwrap();
    assert_eq!((end.id, end.code), (3, Code::OK), "{end:?}");
    // Ended: late frames for it are ignored too.
    send(&mut sock, &data(3, 0, b"late")).await;
    send(&mut sock, &window(3, 1000)).await;
    for frame in sync(&mut sock, 4).await {
        assert!(
            matches!(frame, Frame::Window { id: 3, .. } | Frame::Data(_)),
            "{frame:?}"
        );
    }
    t.check_good("stray DATA").await;
}

/// Reads stream 1's answer from `t.H/Drain` to its OK RESPONSE (WINDOWs allowed on
/// the way) and returns its message: (messages, bytes) read, two u64 BE.
async fn drain_answer(sock: &mut TcpStream) -> Bytes {
    let mut message = None;
    loop {
        match recv(sock).await.expect("the stream is answered") {
            Frame::Data(d) => message = d.message.or(message),
            Frame::Response(r) => {
                assert_eq!((r.id, r.code), (1, Code::OK), "{r:?}");
                break;
            }
            Frame::Window { id: 1, .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    message.expect("Drain answers with one message")
}

/// The Drain handler saw exactly the messages sent before the half-close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_after_the_half_close_never_reaches_the_handler() {
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    send(&mut sock, &stream_request(1, "t.H/Drain")).await;
    send(&mut sock, &data(1, 0, &[7; 10])).await;
    send(&mut sock, &data(1, FLAG_END_STREAM, &[7; 20])).await;
    send(&mut sock, &data(1, 0, &[8; 1000])).await;
    send(&mut sock, &data(1, FLAG_END_STREAM, &[8; 5])).await;
    let message = drain_answer(&mut sock).await;
    assert_eq!(&message[..8], &2u64.to_be_bytes(), "two messages read");
    assert_eq!(&message[8..], &30u64.to_be_bytes(), "30 bytes read");
    assert!(sync(&mut sock, 9)
        .await
        .iter()
        .all(|f| matches!(f, Frame::Window { .. })));
    t.check_good("DATA after the half-close").await;
}

/// §2.3: `FLAG_COMPRESSED` on a streaming REQUEST (whose payload is empty; its
/// messages carry their own flags) is ignored: the stream opens and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_flag_on_a_streaming_request_is_ignored() {
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    send(
        &mut sock,
        &request(1, FLAG_STREAMING | FLAG_COMPRESSED, "t.H/Drain", &[]),
    )
    .await;
    send(&mut sock, &data(1, FLAG_END_STREAM, &[7; 20])).await;
    let message = drain_answer(&mut sock).await;
    assert_eq!(&message[..8], &1u64.to_be_bytes(), "one message read");
    t.check_good("a compressed flag on a streaming REQUEST")
        .await;
}

/// §6.9 and §8: a sender may send a message only while its credit is above zero (the
/// message may take it below zero); a receiver MAY treat one sent with no credit left
/// as a protocol error, and the reference server does. Credit granted: the server's
/// `stream_window` (1 MiB). (It allowed the window plus one maximum-size frame, in
/// messages of any size: 262,144 of 64 bytes past the credit, per stream.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_beyond_the_granted_credit_is_a_protocol_error() {
    const MAX_FRAME: usize = 64 << 10;
    const WINDOW: usize = 1 << 20;
    let mut t = Target::start(Server::builder().max_frame_len(MAX_FRAME)).await;
    let mut sock = t.connect().await;
    send(&mut sock, &stream_request(1, "t.H/Hold")).await;
    // One byte of credit left, then a message that takes it far below zero: allowed.
    let mut sent = 0;
    while sent < WINDOW - 1 {
        let n = (WINDOW - 1 - sent).min(60_000);
        send(&mut sock, &data(1, 0, &vec![1; n])).await;
        sent += n;
    }
    send(&mut sock, &data(1, 0, &vec![1; 60_000])).await;
    for frame in sync(&mut sock, 1).await {
        assert!(
            matches!(frame, Frame::Window { id: 1, increment } if increment == (1 << 20) - (64 << 10)),
            "{frame:?}"
        );
    }
    send(&mut sock, &data(1, 0, b"x")).await;
    let g = expect_goaway_and_close(&mut sock).await;
    assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{g:?}");
    assert!(g.reason.contains("credit"), "{}", g.reason);
    assert_eq!(g.last_id, 1);
    let probe = t.probe.clone();
    wait_until("the held handler is dropped with its connection", || {
        probe.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    t.check_good("a flow-control violation").await;
}

// ---------------------------------------------------------------------------------------
// WINDOW
// ---------------------------------------------------------------------------------------

/// §2.11: a WINDOW for an id that is not an open stream is ignored; increments add up
/// (far past what a u32 holds) without breaking the stream; 0 is a protocol error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_frames_add_up_unknown_ids_are_ignored_and_zero_is_an_error() {
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    send(&mut sock, &window(77, 1)).await;
    send(&mut sock, &window(u64::MAX, u32::MAX)).await;
    // A finished unary call.
    send(
        &mut sock,
        &request(5, 0, "rpc.examples.v1.Echo/Say", &say_payload("u")),
    )
    .await;
    assert_eq!(say_reply(&response(&mut sock, 5).await), "u");
    assert!(sync(&mut sock, 1).await.is_empty());
    send(&mut sock, &window(5, 10)).await;
    assert!(sync(&mut sock, 2).await.is_empty());

    // A stream whose client grants 10,000 × 0xFFFF_FFFF bytes (about 2^45): the credit
    // must not wrap around into "no credit" (or panic).
    send(&mut sock, &stream_request(7, "t.H/Produce")).await;
    let flood: Vec<u8> = (0..10_000)
        .flat_map(|_| framed(&window(7, u32::MAX)))
        .collect();
    let (mut r, mut w) = sock.split();
    let read = async {
        let mut messages = 0;
        while messages < 500 {
            match recv(&mut r).await.expect("the stream keeps flowing") {
                Frame::Data(d) if d.message.is_some() => messages += 1,
                Frame::Data(_) | Frame::Window { id: 7, .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    let ((), ()) = tokio::join!(read, async { w.write_all(&flood).await.unwrap() });
    send(&mut sock, &cancel(7)).await;
    let probe = t.probe.clone();
    wait_until("the cancelled stream's handler is dropped", || {
        probe.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    sync(&mut sock, 3).await; // frames on their way before the CANCEL
    let late = sync(&mut sock, 4).await;
    assert!(
        late.is_empty(),
        "frames after the CANCEL and a PING round trip: {late:?}"
    );

    // Zero.
    send(&mut sock, &window(5, 0)).await;
    let g = expect_goaway_and_close(&mut sock).await;
    assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR);
    assert_eq!(g.last_id, 7);
    t.check_good("WINDOW frames").await;
}

// ---------------------------------------------------------------------------------------
// Stream floods and credit
// ---------------------------------------------------------------------------------------

/// §6.9 and §8: a connection holds at most `max_concurrent_streams` (default 256)
/// streams; a new one past it is answered `RESOURCE_EXHAUSTED` at once. Streams do
/// not count against the request limit: unary calls on the same connection go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_streams_are_held_to_the_stream_limit() {
    const OPENED: u64 = 3000;
    const LIMIT: u64 = 256;
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    let flood: Vec<u8> = (1..=OPENED)
        .flat_map(|id| framed(&stream_request(id, "t.H/Hold")))
        .chain(framed(&ping(PING, 1, b"sync")))
        .collect();
    let (mut r, mut w) = sock.split();
    let read = async {
        let mut frames = Vec::new();
        loop {
            match recv(&mut r).await.expect("the connection stays up") {
                Frame::Pong { id: 1, .. } => return frames,
                Frame::GoAway(g) => panic!("unexpected GOAWAY: {g:?}"),
                frame => frames.push(frame),
            }
        }
    };
    let (frames, ()) = tokio::join!(read, async { w.write_all(&flood).await.unwrap() });
    let refused = responses(&frames);
    assert_eq!(refused.len() as u64, OPENED - LIMIT);
    for (r, id) in refused.iter().zip(LIMIT + 1..) {
        assert_eq!((r.id, r.code), (id, Code::RESOURCE_EXHAUSTED), "{r:?}");
    }
    let probe = t.probe.clone();
    wait_until("the streams' handlers start", || {
        probe.held.load(Ordering::SeqCst) == LIMIT as usize
    })
    .await;

    // The same connection still takes unary calls, and another client is served.
    send(
        &mut sock,
        &request(OPENED + 1, 0, "rpc.examples.v1.Echo/Say", &say_payload("u")),
    )
    .await;
    assert_eq!(say_reply(&response(&mut sock, OPENED + 1).await), "u");
    t.check_good("a stream flood").await;

    // Closing the connection drops every held handler.
    drop(sock);
    wait_until("the 256 held handlers are dropped", || {
        probe.dropped.load(Ordering::SeqCst) == LIMIT as usize
    })
    .await;
    t.check_good("the flood's end").await;
}

/// §6.9: a sender sends only while its credit is above zero. A client that never
/// returns credit gets the initial 65,536 bytes (plus at most one message) and
/// nothing more: the handler's stream is not even polled further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_returns_credit_gets_one_window() {
    const INITIAL: usize = 65_536;
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    send(&mut sock, &stream_request(1, "t.H/Produce")).await;
    send(&mut sock, &data(1, FLAG_END_STREAM, b"")).await;
    let probe = t.probe.clone();
    let produced = settles_within(
        "messages produced without credit",
        || probe.produced.load(Ordering::SeqCst),
        INITIAL / 1000 + 2,
    )
    .await;
    assert!(produced >= INITIAL / 1000, "{produced}");
    let mut bytes = 0;
    for frame in sync(&mut sock, 1).await {
        if let Frame::Data(d) = frame {
            bytes += d.message.map_or(0, |m| m.len());
        }
    }
    assert!(
        (INITIAL..INITIAL + 1000).contains(&bytes),
        "{bytes} bytes sent"
    );
    t.check_good("a client that returns no credit").await;

    // Credit returned: more flows.
    send(&mut sock, &window(1, 5000)).await;
    wait_until("more messages after a WINDOW", || {
        probe.produced.load(Ordering::SeqCst) > produced
    })
    .await;
    send(&mut sock, &cancel(1)).await;
    wait_until("the cancelled handler is dropped", || {
        probe.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    sync(&mut sock, 2).await;
    assert!(sync(&mut sock, 3).await.is_empty(), "frames after CANCEL");
    t.check_good("a cancelled stream").await;
}

/// Credit is the client's to grant, but the server's memory is not: a client that
/// grants 16 GiB of credit and never reads its socket must not make the server
/// produce (and queue) messages without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_credit_and_a_client_that_never_reads_keep_server_memory_bounded() {
    const MESSAGE: usize = 64 << 10;
    let mut t = Target::start(Server::builder()).await;
    // What the kernel may hold between the two ends: the server's send buffer (up to
    // tcp_wmem's maximum) and our receive buffer (64 KiB, set before connecting).
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(16 << 20);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let mut sock = socket.connect(t.addr.parse().unwrap()).await.unwrap();
    send(&mut sock, &stream_request(1, "t.H/ProduceBig")).await;
    for _ in 0..4 {
        send(&mut sock, &window(1, u32::MAX)).await;
    }
    // Kernel buffers, plus 16 MiB for what the server itself may keep queued.
    let bound = (wmem_max + (256 << 10) + (16 << 20)) / MESSAGE;
    let probe = t.probe.clone();
    let produced = settles_within(
        "messages produced for a client that does not read",
        || probe.produced.load(Ordering::SeqCst),
        bound,
    )
    .await;
    assert!(produced > 0);
    t.check_good("a client that does not read").await;
    drop(sock);
    wait_until("the producer is dropped with its connection", || {
        probe.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
}

/// A client that pipelines more answers than the kernel's buffers hold and stops
/// reading (its socket kept open, nothing more sent) is dropped within the keepalive's
/// bounds: the server's writes wait on it, so being at its own limits is no sign of
/// the client's life. It was kept for ever, with its answers and request slots: the
/// keepalive took the limits for life, the idle timer saw calls in flight, and
/// eviction wants none (found in review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answers_is_dropped_by_keepalive() {
    let builder = Server::builder()
        .max_concurrent_requests(4)
        .keepalive_interval(Some(Duration::from_millis(200)))
        .keepalive_timeout(Duration::from_millis(200));
    let mut t = Target::start(builder).await;
    let others = t.handle.connections().len();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let sock = socket.connect(t.addr.parse().unwrap()).await.unwrap();
    let (_read, mut write) = sock.into_split();
    let handle = t.handle.clone();
    wait_until("the connection is open", || {
        handle.connections().len() > others
    })
    .await;
    // 60 KiB answers, written until the server stops reading (a write waits a second).
    let message = "x".repeat(60 << 10);
    let frame = framed(&request(
        1,
        0,
        "rpc.examples.v1.Echo/Say",
        &say_payload(&message),
    ));
    // Written by a task of its own until the server stops reading (its writes then
    // wait, and fail once it closes the connection); a timed wait per write would
    // take a starved server for one that stopped.
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let writer = tokio::spawn(async move {
        for id in 1..5_000u64 {
            let mut frame = frame.clone();
            frame[8..16].copy_from_slice(&id.to_be_bytes());
            if write.write_all(&frame).await.is_err() {
                break;
            }
            counted.fetch_add(1, Ordering::Relaxed);
        }
        write
    });
    // Silent from here on, neither reading nor closing.
    wait_until(
        "the connection of a client that stopped reading is closed",
        || handle.connections().len() == others,
    )
    .await;
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent > 10, "{sent} requests sent");
    t.check_good("after a client that stopped reading").await;
    writer.abort();
}

/// Connections that pipeline requests and read none of their answers are ended once
/// the server's unread answers, together, pass `max_unsent_answer_bytes` and each
/// holds more than its share, long before any keepalive (off here) would notice them:
/// each connection held up to its 256 answers, of any size (eight such connections
/// asking for 1 MB answers held 2.1 GB for 140 s; a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_read_no_answers_are_ended_past_the_servers_bound() {
    let builder = Server::builder()
        .max_unsent_answer_bytes(4 << 20)
        .keepalive_interval(None);
    let mut t = Target::start(builder).await;
    let others = t.handle.connections().len();
    let opened = t.handle.stats().connections_opened;
    let message = "x".repeat(60 << 10);
    let frame = framed(&request(
        1,
        0,
        "rpc.examples.v1.Echo/Say",
        &say_payload(&message),
    ));
    let mut writers = Vec::new();
    for _ in 0..3 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(64 << 10).unwrap();
        let sock = socket.connect(t.addr.parse().unwrap()).await.unwrap();
        let (read, mut write) = sock.into_split();
        let frame = frame.clone();
        // Written until the server stops reading or closes; never read.
        writers.push(tokio::spawn(async move {
            for id in 1..2_000u64 {
                let mut frame = frame.clone();
                frame[8..16].copy_from_slice(&id.to_be_bytes());
                if write.write_all(&frame).await.is_err() {
                    break;
                }
            }
            (read, write)
        }));
    }
    let handle = t.handle.clone();
    // Counted as opened, not as open at once: the first may already be ended past the
    // bound when the last is accepted (a CI run waited for all three for ever).
    wait_until("the connections are opened", || {
        handle.stats().connections_opened >= opened + 3
    })
    .await;
    wait_until(
        "the connections holding unread answers past the bound are ended",
        || handle.connections().len() == others,
    )
    .await;
    t.check_good("after connections that read no answers").await;
    for writer in writers {
        writer.abort();
    }
}

/// The same client, sending a CANCEL for no call every 100 ms instead of going silent:
/// each frame it sent counted as life, so it kept its slots and answers for ever
/// (from a review). It is closed once its answers have not moved for two keepalive
/// intervals and at least 30 s, whatever it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_but_sends_now_and_then_is_dropped() {
    let builder = Server::builder()
        .max_concurrent_requests(4)
        .keepalive_interval(Some(Duration::from_millis(200)))
        .keepalive_timeout(Duration::from_millis(200));
    let mut t = Target::start(builder).await;
    let others = t.handle.connections().len();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let sock = socket.connect(t.addr.parse().unwrap()).await.unwrap();
    let (_read, mut write) = sock.into_split();
    let handle = t.handle.clone();
    wait_until("the connection is open", || {
        handle.connections().len() > others
    })
    .await;
    // Eight answers of 1 MiB: more than the socket buffers take (the client's 64 KiB,
    // the server's up to 4 MiB), so bytes stay unwritten in the link; and no more than
    // the server reads at once (none waits in its look-ahead, which would stop its
    // reading: then the CANCELs below would not be read, and silence would count).
    let message = "x".repeat(1 << 20);
    let frame = framed(&request(
        1,
        0,
        "rpc.examples.v1.Echo/Say",
        &say_payload(&message),
    ));
    let mut sent = 0u64;
    for id in 1..=8u64 {
        let mut frame = frame.clone();
        frame[8..16].copy_from_slice(&id.to_be_bytes());
        // Each is taken in time (the server reads them all): a bound for a hang only.
        let wrote = tokio::time::timeout(HANG_GUARD, write.write_all(&frame));
        if wrote.await.is_err() {
            break;
        }
        sent += 1;
    }
    assert_eq!(sent, 8, "{sent} requests sent");
    // A CANCEL for an id never used, every 100 ms, and nothing read.
    let keep_talking = tokio::spawn(async move {
        loop {
            let frame = framed(&cancel(u64::MAX));
            if write.write_all(&frame).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // After 30 s without a byte taken (the least stall, whatever the interval: a slow
    // reader shows none for a while); kept for good without the check (150 s seen).
    tokio::time::timeout(Duration::from_secs(90), async {
        while handle.connections().len() != others {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the connection of a client that reads nothing but sends was kept");
    keep_talking.abort();
    t.check_good("after a client that read nothing").await;
}

/// A client that fills the server's limits (its calls held, its look-ahead full, the
/// server's reading stopped), reads all it was sent and leaves: its FIN waits behind
/// the bytes the server does not read, so the server never saw it go, and keepalive
/// sent nothing (silence at one's own limits proves nothing), so nothing drew a reset
/// from the departed host: its calls and memory stayed for good (from a review:
/// 92 MiB and 256 calls a connection). The keepalive now sends its PING at the limits
/// too, a departed host answers it with a reset, and the connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_the_server_is_at_its_limits_is_seen_gone() {
    let builder = Server::builder()
        .max_concurrent_requests(4)
        .keepalive_interval(Some(Duration::from_millis(200)))
        .keepalive_timeout(Duration::from_millis(200));
    let mut t = Target::start(builder).await;
    let others = t.handle.connections().len();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(64 << 10).unwrap();
    let sock = socket.connect(t.addr.parse().unwrap()).await.unwrap();
    let (mut read, mut write) = sock.into_split();
    let handle = t.handle.clone();
    wait_until("the connection is open", || {
        handle.connections().len() > others
    })
    .await;
    // Everything the server sends is read (its WINDOWs), so that the close below is
    // a FIN, not a reset for unread bytes.
    let reader = tokio::spawn(async move {
        let mut sink = vec![0u8; 64 << 10];
        while matches!(read.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    // The request limit, taken by four calls whose handlers never end.
    for id in 1..=4u64 {
        send(&mut write, &request(id, 0, "t.H/Wait", &[])).await;
    }
    let probe = t.probe.clone();
    wait_until("the four handlers hold", || {
        probe.held.load(Ordering::SeqCst) == 4
    })
    .await;
    // Then requests past the limit, until the server stops reading and the socket
    // buffers fill (a write then waits for good).
    let message = "x".repeat(60 << 10);
    let frame = framed(&request(
        100,
        0,
        "rpc.examples.v1.Echo/Say",
        &say_payload(&message),
    ));
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let writer = tokio::spawn(async move {
        for id in 100..100_000u64 {
            let mut frame = frame.clone();
            frame[8..16].copy_from_slice(&id.to_be_bytes());
            if write.write_all(&frame).await.is_err() {
                break;
            }
            counted.fetch_add(1, Ordering::Relaxed);
        }
        write
    });
    // Stopped: nothing more taken for half a second.
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = sent.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    // Gone: the write half's drop queues the FIN behind the unsent bytes, and the
    // reader's drop closes the socket (nothing unread in it).
    writer.abort();
    let _ = writer.await;
    reader.abort();
    let _ = reader.await;
    wait_until("the connection of a client that left is closed", || {
        handle.connections().len() == others
    })
    .await;
    wait_until("its handlers are dropped", || {
        probe.dropped.load(Ordering::SeqCst) >= 4
    })
    .await;
    t.check_good("after a client that left at the limits").await;
}

// ---------------------------------------------------------------------------------------
// BULK and BULK_REPLY
// ---------------------------------------------------------------------------------------

fn token(descriptor: &[u8]) -> u64 {
    assert_eq!(descriptor[0], 1, "descriptor version");
    u64::from_be_bytes(descriptor[2..10].try_into().unwrap())
}

/// §6.11: BULK operations that cannot be served are answered with a status in their
/// BULK_REPLY and nothing else happens; §2.12: a BULK_REPLY for an unknown id is
/// ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bulk_operations_are_answered_and_the_connection_stays_up() {
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    send(&mut sock, &request(1, 0, "t.H/Expose", b"")).await;
    let r = &response(&mut sock, 1).await;
    assert!(sync(&mut sock, 1).await.is_empty());
    assert_eq!(r.code, Code::OK, "{r:?}");
    assert_eq!(r.payload.len(), 36, "two descriptors");
    let (read, write) = (token(&r.payload[..18]), token(&r.payload[18..]));
    assert_eq!((r.payload[1], r.payload[19]), (1, 2), "access: read, write");
    let unknown = (read ^ write) | 1;
    assert!(unknown != read && unknown != write);
    let pattern = exposed_pattern();
    let len = EXPOSED_LEN as u64;

    // (frame, expected code, expected data)
    let cases: Vec<(Vec<u8>, Code, Bytes)> = vec![
        (
            bulk(1, false, unknown, 0, 1, b""),
            Code::NOT_FOUND,
            Bytes::new(),
        ),
        (
            bulk(2, false, unknown, 0, u32::MAX, b""),
            Code::NOT_FOUND,
            Bytes::new(),
        ),
        (
            bulk(3, true, unknown, 0, 3, b"abc"),
            Code::NOT_FOUND,
            Bytes::new(),
        ),
        (
            bulk(4, false, read, 10, 100, b""),
            Code::OK,
            pattern.slice(10..110),
        ),
        (bulk(5, false, read, len, 0, b""), Code::OK, Bytes::new()),
        (
            bulk(6, false, read, len - 10, 11, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(7, false, read, len + 1, 0, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(8, false, read, u64::MAX, 1, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(9, false, read, u64::MAX - 5, 100, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(10, false, read, 0, u32::MAX, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(11, false, read, 0, (1 << 20) + 1, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(12, true, read, 0, 3, b"abc"),
            Code::PERMISSION_DENIED,
            Bytes::new(),
        ),
        (
            bulk(13, false, write, 0, 1, b""),
            Code::PERMISSION_DENIED,
            Bytes::new(),
        ),
        (
            bulk(14, true, write, len - 2, 3, b"abc"),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(15, true, write, u64::MAX - 1, 3, b"abc"),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(16, true, write, 100, 5, b"hello"),
            Code::OK,
            Bytes::new(),
        ),
        // The same operation id again is the sender's business: answered again.
        (
            bulk(16, false, read, 0, 4, b""),
            Code::OK,
            pattern.slice(0..4),
        ),
    ];
    for (frame, _, _) in &cases {
        send(&mut sock, frame).await;
    }
    send(&mut sock, &bulk_reply(1, 0, b"", b"unasked")).await;
    send(&mut sock, &bulk_reply(12345, 5, b"nobody asked", b"")).await;
    let replies: Vec<_> = sync(&mut sock, 2)
        .await
        .into_iter()
        .map(|f| match f {
            Frame::BulkReply(r) => r,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(replies.len(), cases.len());
    for (reply, (frame, code, data)) in replies.iter().zip(&cases) {
        let id = u64::from_be_bytes(frame[4..12].try_into().unwrap());
        assert_eq!((reply.id, reply.code), (id, *code), "{reply:?}");
        assert_eq!(reply.data, *data, "{reply:?}");
    }
    // A token is valid only on the connection that exposed it (§6.11).
    let mut other = t.connect().await;
    send(&mut other, &bulk(1, false, read, 0, 1, b"")).await;
    send(&mut other, &bulk(2, true, write, 0, 1, b"x")).await;
    let replies = sync(&mut other, 1).await;
    for (reply, id) in replies.iter().zip(1..) {
        match reply {
            Frame::BulkReply(r) => assert_eq!((r.id, r.code), (id, Code::NOT_FOUND)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(replies.len(), 2);
    // The one good write landed, and nothing else did.
    let exposed: Vec<_> = std::mem::take(&mut *t.probe.exposed.lock().unwrap());
    let mut written = None;
    for e in exposed {
        if e.descriptor().access() == rpc_core::bulk::Access::Write {
            written = Some(e.into_bytes().await);
        }
    }
    let written = written.unwrap();
    let mut expected = vec![0u8; EXPOSED_LEN];
    expected[100..105].copy_from_slice(b"hello");
    assert_eq!(&written[..], &expected[..]);

    assert!(sync(&mut sock, 3).await.is_empty());
    t.check_good("bad bulk operations").await;
}

// ---------------------------------------------------------------------------------------
// PING, PONG, GOAWAY, CANCEL
// ---------------------------------------------------------------------------------------

/// §2.9: PING is answered with the same id and payload; an unsolicited PONG is
/// ignored. §6.4 and §6.5: a GOAWAY from a client is only logged. §6.2: a CANCEL for
/// an id not in flight is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_pong_goaway_and_cancel_from_a_client() {
    let mut t = Target::start(Server::builder()).await;
    let mut sock = t.connect().await;
    send(&mut sock, &ping(PING, u64::MAX, b"")).await;
    match recv(&mut sock).await {
        Some(Frame::Pong { id, payload }) => assert_eq!((id, payload.len()), (u64::MAX, 0)),
        other => panic!("expected PONG, got {other:?}"),
    }
    // §2.9: payloads up to 1,024 bytes are echoed.
    let big = vec![0xa5; 1024];
    send(&mut sock, &ping(PING, 0, &big)).await;
    match recv(&mut sock).await {
        Some(Frame::Pong { id, payload }) => {
            assert_eq!(id, 0);
            assert_eq!(&payload[..], &big[..]);
        }
        other => panic!("expected PONG, got {other:?}"),
    }
    send(&mut sock, &ping(PONG, 42, b"unsolicited")).await;
    send(&mut sock, &cancel(1234)).await;
    send(&mut sock, &goaway(0, 0, b"client going away")).await;
    send(&mut sock, &goaway(7, 1, b"client says protocol error")).await;
    send(&mut sock, &goaway(0, 0xdead_beef, &[])).await;
    assert!(sync(&mut sock, 1).await.is_empty());
    // The connection still serves calls after the client's GOAWAYs.
    send(
        &mut sock,
        &request(9, 0, "rpc.examples.v1.Echo/Say", &say_payload("still")),
    )
    .await;
    assert_eq!(say_reply(&response(&mut sock, 9).await), "still");
    t.check_good("PING, PONG, GOAWAY").await;
}

/// §2.9: a PING (or PONG) longer than 1,024 bytes is a protocol error, not answered:
/// a PONG echoes its PING, and frame-sized PINGs from a peer that reads nothing held a
/// frame-sized answer each (16 MiB per connection, over every connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_or_pong_past_the_payload_limit_closes_the_connection() {
    let mut t = Target::start(Server::builder()).await;
    for kind in [PING, PONG] {
        let mut sock = t.connect().await;
        send(&mut sock, &ping(kind, 3, &vec![0x5a; 1025])).await;
        let g = expect_goaway_and_close(&mut sock).await;
        assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{g:?}");
        assert!(
            g.reason
                .contains("payload of 1025 bytes exceeds the limit of 1024"),
            "{g:?}"
        );
    }
    t.check_good("oversized PING and PONG").await;
}

// ---------------------------------------------------------------------------------------
// Reserved flags, unknown kinds, truncated frames
// ---------------------------------------------------------------------------------------

fn with_flags(mut frame: Vec<u8>, flags: u16) -> Vec<u8> {
    frame[2..4].copy_from_slice(&flags.to_be_bytes());
    frame
}

/// §2.3 and §2.4: a flag bit not allowed on the frame's kind, and a kind the version
/// does not define, are protocol errors (GOAWAY `PROTOCOL_ERROR`, close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_flags_and_unknown_kinds_are_protocol_errors() {
    let mut t = Target::start(Server::builder()).await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("DATA 0x0010", with_flags(data(1, 0, b""), 0x0010)),
        ("DATA 0x8000", with_flags(data(1, 0, b""), 0x8000)),
        ("WINDOW 0x0001", with_flags(window(1, 1), 0x0001)),
        ("CANCEL 0x0001", with_flags(cancel(1), 0x0001)),
        (
            "BULK 0x0002",
            with_flags(bulk(1, false, 1, 0, 1, b""), 0x0002),
        ),
        (
            "BULK 0x0003",
            with_flags(bulk(1, true, 1, 0, 1, b"x"), 0x0003),
        ),
        (
            "BULK_REPLY 0x0001",
            with_flags(bulk_reply(1, 0, b"", b""), 0x0001),
        ),
        ("PING 0x0001", with_flags(ping(PING, 1, b""), 0x0001)),
        ("PONG 0x0100", with_flags(ping(PONG, 1, b""), 0x0100)),
        ("GOAWAY 0x0001", with_flags(goaway(0, 0, b""), 0x0001)),
        (
            "REQUEST 0x0010",
            with_flags(stream_request(1, "t.H/Hold"), 0x0010 | FLAG_STREAMING),
        ),
        ("kind 0", header(0, 0, 1)),
        ("kind 11", header(11, 0, 1)),
        ("kind 255 with a payload", ping(255, 1, b"payload")),
        ("kind 11 with flags", header(11, 0xffff, 1)),
        ("RESPONSE from a client", ok_response(1, b"")),
    ];
    for (what, frame) in cases {
        t.expect_connection_error(what, &framed(&frame), GoAwayCode::PROTOCOL_ERROR)
            .await;
    }
}

/// §2.4 step 6 and §7: a field whose length runs past the end of the frame, a frame
/// shorter than its fixed fields, and trailing bytes after the fixed-size kinds
/// (WINDOW, CANCEL, GOAWAY) or after a BULK read are protocol errors. So are values
/// a kind does not allow (a payload on a streaming REQUEST or on DATA flagged
/// NO_MESSAGE, BULK data that does not match its `len`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_overlong_frames_are_protocol_errors() {
    let mut t = Target::start(Server::builder()).await;
    let cut = |mut f: Vec<u8>, n: usize| {
        f.truncate(f.len() - n);
        f
    };
    let plus = |mut f: Vec<u8>, extra: &[u8]| {
        f.extend_from_slice(extra);
        f
    };
    let md_data = |len: u32, rest: &[u8]| {
        let mut f = header(DATA, FLAG_HAS_METADATA, 1);
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(rest);
        f
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty frame", vec![]),
        ("DATA header cut", cut(data(1, 0, b""), 3)),
        ("DATA metadata_len cut", cut(md_data(0, b""), 2)),
        ("DATA metadata past the end", md_data(100, &[1, b'k', 0, 0])),
        (
            "DATA metadata entry past the block",
            md_data(6, &[1, b'k', 0, 0, 0, 9]),
        ),
        ("DATA NO_MESSAGE with bytes", data(1, FLAG_NO_MESSAGE, b"x")),
        ("WINDOW increment cut", cut(window(1, 1), 2)),
        ("WINDOW without increment", header(WINDOW, 0, 1)),
        ("WINDOW trailing bytes", plus(window(1, 1), &[0])),
        (
            "two WINDOWs under one prefix",
            plus(window(1, 1), &window(1, 1)),
        ),
        ("CANCEL trailing bytes", plus(cancel(1), &[0])),
        ("BULK fields cut", cut(bulk(1, false, 1, 0, 1, b""), 1)),
        ("BULK read with data", bulk(1, false, 1, 0, 1, b"x")),
        (
            "BULK write shorter than len",
            bulk(1, true, 1, 0, 10, b"short"),
        ),
        (
            "BULK write longer than len",
            bulk(1, true, 1, 0, 2, b"longer"),
        ),
        (
            "BULK write of u32::MAX bytes",
            bulk(1, true, 1, 0, u32::MAX, b"x"),
        ),
        ("BULK_REPLY code cut", cut(bulk_reply(1, 0, b"", b""), 5)),
        (
            "BULK_REPLY message_len cut",
            cut(bulk_reply(1, 0, b"", b""), 2),
        ),
        (
            "BULK_REPLY message past the end",
            cut(bulk_reply(1, 5, b"hello", b""), 1),
        ),
        (
            "BULK_REPLY message not UTF-8",
            bulk_reply(1, 5, &[0xff, 0xfe], b""),
        ),
        ("GOAWAY code cut", cut(goaway(0, 0, b""), 4)),
        ("GOAWAY reason past the end", cut(goaway(0, 0, b"bye"), 1)),
        ("GOAWAY trailing bytes", plus(goaway(0, 0, b"bye"), b"!")),
        ("GOAWAY reason not UTF-8", goaway(0, 0, &[0xc3])),
        (
            "streaming REQUEST method past the end",
            cut(stream_request(1, "t.H/Hold"), 6),
        ),
        (
            "streaming REQUEST with a payload",
            request(1, FLAG_STREAMING, "t.H/Hold", b"p"),
        ),
        (
            "streaming REQUEST with an invalid method",
            stream_request(1, "/t.H/Hold"),
        ),
    ];
    for (what, frame) in cases {
        t.expect_connection_error(what, &framed(&frame), GoAwayCode::PROTOCOL_ERROR)
            .await;
    }
    // §1.1: a length prefix that promises more than the stream delivers, then the end
    // of the stream: a connection error. The server ends the connection.
    for frame in [
        window(1, 1),
        bulk(1, false, 1, 0, 1, b""),
        ping(PING, 1, b""),
    ] {
        let mut sock = t.connect().await;
        let mut bytes = ((frame.len() + 10) as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&frame);
        sock.write_all(&bytes).await.unwrap();
        sock.shutdown().await.unwrap();
        while let Some(frame) = recv(&mut sock).await {
            assert!(matches!(frame, Frame::GoAway(_)), "{frame:?}");
        }
        t.check_good("a frame cut by the end of the stream").await;
    }
}

// ---------------------------------------------------------------------------------------
// A raw server against a real channel
// ---------------------------------------------------------------------------------------

struct FakeServer {
    listener: TcpListener,
    channel: Channel,
}

impl FakeServer {
    async fn start(builder: rpc_core::client::ChannelBuilder) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("tcp://{}", listener.local_addr().unwrap());
        let channel =
            builder.connect_lazy(rpc_transport_tcp::StreamConnector::from_uri(&uri).unwrap());
        FakeServer { listener, channel }
    }

    /// Accepts the channel's next connection and reads its first REQUEST.
    async fn accept(&self) -> (TcpStream, RequestFrame) {
        let (mut sock, _) = tokio::time::timeout(HANG_GUARD, self.listener.accept())
            .await
            .expect("the channel never connected")
            .unwrap();
        loop {
            match recv(&mut sock).await.expect("the channel sent a request") {
                Frame::Request(r) => return (sock, r),
                Frame::Window { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn say(
        &self,
        message: &str,
        payload: Bytes,
    ) -> tokio::task::JoinHandle<Result<String, Status>> {
        let mut client = EchoClient::new(self.channel.clone());
        let message = message.to_owned();
        tokio::spawn(async move {
            let reply = client.say(SayRequest { message, payload }).await?;
            Ok(reply.into_inner().message)
        })
    }

    /// A call on a new connection is answered normally: the channel recovered.
    async fn check_recovers(&self) {
        let call = self.say("again", Bytes::new());
        let (mut sock, request) = self.accept().await;
        let reply = rpc_core::payload::encode(&SayReply {
            message: "answered".into(),
            payload: Default::default(),
        })
        .to_bytes();
        send(&mut sock, &ok_response(request.id, &reply)).await;
        let answer = tokio::time::timeout(HANG_GUARD, call)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.unwrap(), "answered");
    }
}

/// The client side of §2.10-2.12: stray DATA and WINDOW frames are ignored, a
/// BULK_REPLY for an unknown id is ignored, PING is answered, and BULK operations on
/// the channel's exposed buffers are answered with a status, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_ignores_stray_frames_and_answers_bad_bulk_operations() {
    let fake = FakeServer::start(Channel::builder()).await;
    let data_bytes: Bytes = (0..1000u32).map(|i| i as u8).collect();
    let exposed = fake
        .channel
        .bulk()
        .expose_read(data_bytes.clone(), Duration::from_secs(300))
        .unwrap();
    let call = fake.say("x", exposed.descriptor().to_bytes());
    let (mut sock, request) = fake.accept().await;
    let descriptor =
        <SayRequest as rpc_core::codegen::prost::Message>::decode(request.payload.clone())
            .unwrap()
            .payload;
    let read = token(&descriptor);
    let id = request.id;
    let unknown = read ^ 0x5555;

    for frame in [
        data(id + 100, 0, b"stray"),
        data(id, 0, b"a unary call is no stream"),
        data(id, FLAG_HAS_METADATA | FLAG_NO_MESSAGE, &[0, 0, 0, 0]),
        window(id + 100, u32::MAX),
        window(id, u32::MAX),
        bulk_reply(3, 0, b"", b"unasked"),
        ping(PONG, 5, b"unsolicited"),
    ] {
        send(&mut sock, &frame).await;
    }
    let cases: Vec<(Vec<u8>, Code, Bytes)> = vec![
        (
            bulk(1, false, unknown, 0, 1, b""),
            Code::NOT_FOUND,
            Bytes::new(),
        ),
        (
            bulk(2, false, read, 1, 10, b""),
            Code::OK,
            data_bytes.slice(1..11),
        ),
        (
            bulk(3, false, read, 995, 10, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(4, false, read, u64::MAX, 2, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(5, false, read, 0, u32::MAX, b""),
            Code::OUT_OF_RANGE,
            Bytes::new(),
        ),
        (
            bulk(6, true, read, 0, 1, b"x"),
            Code::PERMISSION_DENIED,
            Bytes::new(),
        ),
        (
            bulk(7, true, unknown, 0, 1, b"x"),
            Code::NOT_FOUND,
            Bytes::new(),
        ),
    ];
    for (frame, _, _) in &cases {
        send(&mut sock, frame).await;
    }
    let frames = sync(&mut sock, 9).await;
    assert_eq!(frames.len(), cases.len(), "{frames:?}");
    for (frame, (sent, code, data)) in frames.iter().zip(&cases) {
        let Frame::BulkReply(reply) = frame else {
            panic!("unexpected {frame:?}");
        };
        let op = u64::from_be_bytes(sent[4..12].try_into().unwrap());
        assert_eq!((reply.id, reply.code), (op, *code), "{reply:?}");
        assert_eq!(reply.data, *data);
    }
    let reply = rpc_core::payload::encode(&SayReply {
        message: "fine".into(),
        payload: Default::default(),
    })
    .to_bytes();
    send(&mut sock, &ok_response(id, &reply)).await;
    let answer = tokio::time::timeout(HANG_GUARD, call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.unwrap(), "fine");
    assert!(sync(&mut sock, 10).await.is_empty());
    drop(exposed);
}

async fn open_stream(channel: &Channel, method: &str) -> tokio::task::JoinHandle<RawStreaming> {
    let mut channel = channel.clone();
    let call = ClientCall {
        method: method.to_owned().into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(stream::pending().boxed())),
        compress: None,
    };
    tokio::spawn(async move {
        let reply = channel.ready().await.unwrap().call(call).await.unwrap();
        reply.stream.unwrap().take().unwrap()
    })
}

/// §6.9 from the client's side: a server that sends a message with no credit left
/// (the channel's window, 1 MiB, spent; the message that spent it may take it below
/// zero) breaks the protocol; the channel sends GOAWAY `PROTOCOL_ERROR`, closes,
/// fails the stream, and its next call opens a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closes_on_a_server_that_ignores_its_credit() {
    const MAX_FRAME: usize = 64 << 10;
    const ALLOWED: usize = (1 << 20) - 1;
    let fake = FakeServer::start(Channel::builder().max_frame_len(MAX_FRAME)).await;
    let opened = open_stream(&fake.channel, "t.H/Flood").await;
    let (mut sock, request) = fake.accept().await;
    assert!(request.streaming);
    let id = request.id;
    send(
        &mut sock,
        &data(id, FLAG_HAS_METADATA | FLAG_NO_MESSAGE, &[0; 4]),
    )
    .await;
    let mut reader = tokio::time::timeout(HANG_GUARD, opened)
        .await
        .unwrap()
        .unwrap();
    let mut sent = 0;
    while sent < ALLOWED {
        let n = (ALLOWED - sent).min(60_000);
        send(&mut sock, &data(id, 0, &vec![1; n])).await;
        sent += n;
    }
    // One byte of credit left: a message of 60,000 is still allowed.
    send(&mut sock, &data(id, 0, &vec![1; 60_000])).await;
    for frame in sync(&mut sock, 1).await {
        assert!(matches!(frame, Frame::Window { .. }), "{frame:?}");
    }
    send(&mut sock, &data(id, 0, b"x")).await;
    let g = expect_goaway_and_close(&mut sock).await;
    assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{g:?}");
    assert_eq!(g.last_id, 0);
    let end = tokio::time::timeout(HANG_GUARD, async {
        loop {
            match reader.next().await {
                Some(Ok(_)) => {}
                Some(Err(status)) => return status,
                None => panic!("the stream ended cleanly"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(end.code(), Code::UNAVAILABLE, "{end}");
    fake.check_recovers().await;
}

/// §6.9 from the client's side, with empty messages (issue 19, finding 3): each costs
/// at least 64 bytes of credit, so a server flooding them at a reader that does not
/// read runs out of credit like any other; one sent with no credit left closes the
/// channel instead of queueing them without bound. (It allowed the window plus one
/// maximum frame: 262,144 empty messages past the credit with 16 MiB frames.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closes_on_a_flood_of_empty_stream_messages() {
    const MAX_FRAME: usize = 4096;
    // The window is the initial 65,536 bytes (a smaller setting does not shrink it).
    const ALLOWED: usize = 64 << 10;
    const MIN_COST: usize = 64;
    let fake =
        FakeServer::start(Channel::builder().max_frame_len(MAX_FRAME).stream_window(1)).await;
    let opened = open_stream(&fake.channel, "t.H/Flood").await;
    let (mut sock, request) = fake.accept().await;
    let id = request.id;
    send(
        &mut sock,
        &data(id, FLAG_HAS_METADATA | FLAG_NO_MESSAGE, &[0; 4]),
    )
    .await;
    let reader = tokio::time::timeout(HANG_GUARD, opened)
        .await
        .unwrap()
        .unwrap();
    let mut batch = Vec::new();
    for _ in 0..ALLOWED / MIN_COST {
        batch.extend_from_slice(&framed(&data(id, 0, b"")));
    }
    sock.write_all(&batch).await.unwrap();
    // Exactly the credit: the connection is up.
    for frame in sync(&mut sock, 1).await {
        assert!(matches!(frame, Frame::Window { .. }), "{frame:?}");
    }
    assert_eq!(reader.buffered_bytes(), ALLOWED / MIN_COST * MIN_COST);
    send(&mut sock, &data(id, 0, b"")).await;
    let g = expect_goaway_and_close(&mut sock).await;
    assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{g:?}");
    drop(reader);
    fake.check_recovers().await;
}

/// §2.11 from the client's side: credit granted by the server adds up without
/// breaking the stream, and WINDOW 0 is a protocol error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_takes_any_sum_of_credit_and_refuses_a_zero_window() {
    let fake = FakeServer::start(Channel::builder()).await;
    let mut channel = fake.channel.clone();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    // 8 MB: far more than the initial window, so it goes out only on the credit the
    // WINDOW frames grant. Finite, so that the channel's writes are not blocked when
    // it has to send its GOAWAY (which it sends only if its link takes it).
    let messages = stream::iter(0..8000)
        .map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Payload::from(vec![3u8; 1000])
        })
        .boxed();
    let call = ClientCall {
        method: "t.H/Up".into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(messages)),
        compress: None,
    };
    let opened = tokio::spawn(async move { channel.ready().await.unwrap().call(call).await });
    let (mut sock, request) = fake.accept().await;
    let id = request.id;
    // 10,000 × 0xFFFF_FFFF: about 2^45 bytes of credit.
    let flood: Vec<u8> = (0..10_000)
        .flat_map(|_| framed(&window(id, u32::MAX)))
        .collect();
    let (mut r, mut w) = sock.split();
    let read = async {
        let mut bytes = 0usize;
        loop {
            match recv(&mut r).await.expect("the channel keeps sending") {
                Frame::Data(d) if d.end_stream => break,
                Frame::Data(d) => bytes += d.message.map_or(0, |m| m.len()),
                Frame::Window { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(bytes, 8_000_000);
        assert_eq!(sent.load(Ordering::SeqCst), 8000);
    };
    let ((), ()) = tokio::join!(read, async { w.write_all(&flood).await.unwrap() });
    send(&mut sock, &window(id, 0)).await;
    let g = expect_goaway_and_close(&mut sock).await;
    assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{g:?}");
    let result = tokio::time::timeout(HANG_GUARD, opened)
        .await
        .unwrap()
        .unwrap();
    let status = match result {
        Ok(_) => panic!("the stream did not fail"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    fake.check_recovers().await;
}

/// §2.3, §2.4 and §6.7 from the client's side: any undecodable frame, and frames of
/// the wrong direction, make the channel send GOAWAY (`last_id` 0) and close; the
/// call in flight fails with `UNAVAILABLE`, and the next call reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closes_on_bad_frames_and_reconnects() {
    let fake = FakeServer::start(Channel::builder()).await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("WINDOW 0", window(1, 0)),
        (
            "WINDOW trailing bytes",
            window(1, 1).into_iter().chain([0]).collect(),
        ),
        ("DATA 0x0010", with_flags(data(1, 0, b""), 0x0010)),
        ("DATA NO_MESSAGE with bytes", data(1, FLAG_NO_MESSAGE, b"x")),
        ("BULK cut", bulk(1, false, 1, 0, 1, b"")[..31].to_vec()),
        ("BULK read with data", bulk(1, false, 1, 0, 1, b"x")),
        (
            "BULK 0x0002",
            with_flags(bulk(1, false, 1, 0, 1, b""), 0x0002),
        ),
        (
            "BULK_REPLY message past the end",
            bulk_reply(1, 5, b"abc", b"")[..22].to_vec(),
        ),
        ("PING 0x0001", with_flags(ping(PING, 1, b""), 0x0001)),
        (
            "GOAWAY trailing bytes",
            goaway(0, 0, b"").into_iter().chain([0]).collect(),
        ),
        ("kind 11", header(11, 0, 1)),
        ("REQUEST from the server", request(1, 0, "a.B/C", b"")),
        ("CANCEL from the server", cancel(1)),
    ];
    for (what, frame) in cases {
        let call = fake.say(what, Bytes::new());
        let (mut sock, _) = fake.accept().await;
        send(&mut sock, &frame).await;
        let g = expect_goaway_and_close(&mut sock).await;
        assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{what}: {g:?}");
        assert_eq!(g.last_id, 0, "{what}");
        let result = tokio::time::timeout(HANG_GUARD, call)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(result.unwrap_err().code(), Code::UNAVAILABLE, "{what}");
    }
    fake.check_recovers().await;
}

/// What a server sends is not repeated at length in every call it fails: a REQUEST
/// with a 64 KiB bad method name (its error quoted the name, escaped, some 390 KB)
/// and a GOAWAY with a 64 KiB reason each ended calls whose statuses carried all of
/// it, one copy per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_long_words_are_cut_in_the_statuses_of_the_calls_they_fail() {
    let fake = FakeServer::start(Channel::builder()).await;
    let long_method = "\x7f".repeat(65_000);
    let long_reason = "r".repeat(65_000);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a REQUEST with a long bad method",
            request(1, 0, &long_method, b""),
        ),
        (
            "a GOAWAY with a long reason",
            goaway(0, 0, long_reason.as_bytes()), // NO_ERROR
        ),
    ];
    for (what, frame) in cases {
        let first = fake.say(what, Bytes::new());
        let (mut sock, _) = fake.accept().await;
        let more: Vec<_> = (0..8).map(|_| fake.say(what, Bytes::new())).collect();
        // Until the other calls are on the connection too.
        let mut seen = 1;
        while seen < 9 {
            if let Some(Frame::Request(_)) = recv(&mut sock).await {
                seen += 1;
            }
        }
        send(&mut sock, &frame).await;
        for call in std::iter::once(first).chain(more) {
            let status = tokio::time::timeout(HANG_GUARD, call)
                .await
                .unwrap()
                .unwrap()
                .unwrap_err();
            assert_eq!(status.code(), Code::UNAVAILABLE, "{what}: {status}");
            assert!(
                status.message().len() <= 4096,
                "{what}: a status of {} bytes",
                status.message().len()
            );
        }
    }
    fake.check_recovers().await;
}

// ---------------------------------------------------------------------------------------
// What a peer makes the server hold (issue 19)
// ---------------------------------------------------------------------------------------

/// A socket whose receive buffer is 64 KiB, so that the server's writes back up soon.
async fn small_reader(t: &Target) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    socket.connect(t.addr.parse().unwrap()).await.unwrap()
}

/// Most bytes the kernel may hold between the two ends of a loopback connection (both
/// send buffers and both receive buffers at their maximum).
fn kernel_buffers() -> usize {
    let max = |file: &str| -> usize {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(16 << 20)
    };
    2 * max("/proc/sys/net/ipv4/tcp_wmem") + 2 * max("/proc/sys/net/ipv4/tcp_rmem")
}

/// Blocks the server's writes on `sock`: a stream that produces 64 KiB messages with
/// unbounded credit to a client that does not read. Returns once production stops.
async fn block_the_link(t: &Target, sock: &mut TcpStream, id: u64) {
    send(sock, &stream_request(id, "t.H/ProduceBig")).await;
    send(sock, &window(id, u32::MAX)).await;
    let probe = t.probe.clone();
    settles_within(
        "messages produced for a client that does not read",
        || probe.produced.load(Ordering::SeqCst),
        usize::MAX,
    )
    .await;
}

/// An answer to a cancelled call is dropped, never written, and a call's slot is free
/// only once its answer is written or dropped: 20,000 REQUEST+CANCEL pairs on a
/// connection limited to 16 calls, whose client reads nothing, leave at most 16
/// answers in the server. Closing the connection releases them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_cancelled_calls_are_dropped_not_queued() {
    const LIMIT: usize = 16;
    let mut t = Target::start(Server::builder().max_concurrent_requests(LIMIT)).await;
    let mut sock = small_reader(&t).await;
    block_the_link(&t, &mut sock, 1).await;
    let probe = t.probe.clone();
    let before = probe.alive.load(Ordering::SeqCst);
    let pairs: Vec<u8> = (2..20_002u64)
        .flat_map(|id| {
            let method = if id % 2 == 0 {
                "t.H/Answer"
            } else {
                "t.H/AnswerLater"
            };
            framed(&request(id, 0, method, b""))
                .into_iter()
                .chain(framed(&cancel(id)))
        })
        .collect();
    let (r, mut w) = sock.into_split();
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&pairs).await;
        std::future::pending::<()>().await; // keeps the socket open until aborted
    });
    let held = settles_within(
        "answers (and stream messages) held",
        || probe.alive.load(Ordering::SeqCst),
        before + LIMIT,
    )
    .await;
    assert!(held >= before, "{held}");
    t.check_good("cancelled calls whose answers are not read")
        .await;
    writer.abort();
    let _ = writer.await;
    drop(r);
    wait_until("everything is released with the connection", || {
        probe.alive.load(Ordering::SeqCst) == 0
    })
    .await;
}

/// The messages of cancelled streams are dropped, and the streams of one connection
/// together hold a bounded number of bytes for the link: 1,000 flooding streams, each
/// cancelled, to a client that reads nothing, leave at most the connection's budget
/// (1 MiB) plus a message per producing stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_streams_leave_no_messages_behind() {
    const MESSAGE: usize = 64 << 10;
    const BATCH: u64 = 50;
    let mut t = Target::start(Server::builder()).await;
    let mut sock = small_reader(&t).await;
    let probe = t.probe.clone();
    let bound = (1 << 20) / MESSAGE + BATCH as usize + 16;
    let mut worst = 0;
    for batch in 0..20 {
        let ids = batch * BATCH + 1..=(batch + 1) * BATCH;
        let open: Vec<u8> = ids
            .clone()
            .flat_map(|id| {
                framed(&stream_request(id, "t.H/ProduceBig"))
                    .into_iter()
                    .chain(framed(&window(id, u32::MAX)))
            })
            .collect();
        sock.write_all(&open).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let cancels: Vec<u8> = ids.flat_map(|id| framed(&cancel(id))).collect();
        sock.write_all(&cancels).await.unwrap();
        worst = worst.max(probe.alive.load(Ordering::SeqCst));
        assert!(worst <= bound, "{worst} messages held after batch {batch}");
    }
    let held = settles_within(
        "messages held",
        || probe.alive.load(Ordering::SeqCst),
        bound,
    )
    .await;
    assert!(held > 0, "the link is blocked: something waits");
    t.check_good("cancelled streams").await;
    drop(sock);
    wait_until("the messages are released with the connection", || {
        probe.alive.load(Ordering::SeqCst) == 0
    })
    .await;
}

/// §6.9: every message costs at least 64 bytes of credit, so empty DATA frames cannot
/// pile up for a handler that does not read: once the credit (1 MiB / 64 = 16,384
/// empty messages) is spent the sender is in violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_stream_messages_cost_credit() {
    const MAX_FRAME: usize = 64 << 10;
    const ALLOWED: usize = (1 << 20) / 64;
    let mut t = Target::start(Server::builder().max_frame_len(MAX_FRAME)).await;
    let mut sock = t.connect().await;
    send(&mut sock, &stream_request(1, "t.H/Hold")).await;
    let empties: Vec<u8> = (0..ALLOWED)
        .flat_map(|_| framed(&data(1, 0, b"")))
        .collect();
    sock.write_all(&empties).await.unwrap();
    for frame in sync(&mut sock, 1).await {
        assert!(matches!(frame, Frame::Window { id: 1, .. }), "{frame:?}");
    }
    send(&mut sock, &data(1, 0, b"")).await;
    let g = expect_goaway_and_close(&mut sock).await;
    assert_eq!(g.code, GoAwayCode::PROTOCOL_ERROR, "{g:?}");
    assert!(g.reason.contains("credit"), "{}", g.reason);
    t.check_good("a flood of empty messages").await;
}

/// §2.5 with a call key.
fn keyed_request(id: u64, method: &str, client: u128, call: u64) -> Vec<u8> {
    keyed_attempt(id, method, client, call, 1)
}

/// §2.5 with a call key, attempt `attempt`.
fn keyed_attempt(id: u64, method: &str, client: u128, call: u64, attempt: u32) -> Vec<u8> {
    let mut f = header(REQUEST, 0x0002, id);
    f.extend_from_slice(&0u64.to_be_bytes());
    f.extend_from_slice(&client.to_be_bytes());
    f.extend_from_slice(&call.to_be_bytes());
    f.extend_from_slice(&attempt.to_be_bytes());
    f.extend_from_slice(&(method.len() as u16).to_be_bytes());
    f.extend_from_slice(method.as_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    f
}

/// A keyed call runs on after a CANCEL (its outcome is recorded for its retries), so
/// it keeps its connection's slot until its handler ends: 1,000 keyed REQUEST+CANCEL
/// pairs on a connection limited to 4 start 4 handlers, not 1,000, and another
/// client's keyed call still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_keyed_calls_keep_their_slot_until_their_handler_ends() {
    const LIMIT: usize = 4;
    let dedupe = rpc_core::server::DedupeConfig {
        max_running: 100,
        ..Default::default()
    };
    let mut t = Target::start(
        Server::builder()
            .max_concurrent_requests(LIMIT)
            .duplicate_cache(Some(dedupe)),
    )
    .await;
    let sock = t.connect().await;
    let pairs: Vec<u8> = (1..=1000u64)
        .flat_map(|id| {
            framed(&keyed_request(id, "t.H/Wait", 1, id))
                .into_iter()
                .chain(framed(&cancel(id)))
        })
        .collect();
    let (r, mut w) = sock.into_split();
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&pairs).await;
        std::future::pending::<()>().await; // keeps the socket open until aborted
    });
    let probe = t.probe.clone();
    let running = settles_within(
        "keyed handlers running",
        || probe.held.load(Ordering::SeqCst),
        LIMIT,
    )
    .await;
    assert_eq!(running, LIMIT);
    let mut other = t.connect().await;
    let mut say = keyed_request(1, "rpc.examples.v1.Echo/Say", 2, 1);
    say.extend_from_slice(&say_payload("keyed"));
    send(&mut other, &say).await;
    assert_eq!(say_reply(&response(&mut other, 1).await), "keyed");
    t.check_good("cancelled keyed calls").await;
    writer.abort();
    let _ = writer.await;
    drop(r);
}

/// A target whose duplicate cache runs 2 keyed calls at most, and stops those nobody
/// waits for after `max_unattended`.
async fn keyed_target(max_unattended: Duration) -> Target {
    let dedupe = rpc_core::server::DedupeConfig {
        max_running: 2,
        max_unattended,
        ..Default::default()
    };
    Target::start(Server::builder().duplicate_cache(Some(dedupe))).await
}

/// Once two keyed handlers run on `t` (its limit), a keyed call on a new connection
/// is refused; returns that connection.
async fn refused_when_full(t: &Target) -> TcpStream {
    let probe = t.probe.clone();
    wait_until("two keyed handlers running", || {
        probe.held.load(Ordering::SeqCst) == 2
    })
    .await;
    let mut other = t.connect().await;
    send(&mut other, &keyed_request(1, "t.H/Wait", 6, 1)).await;
    let r = response(&mut other, 1).await;
    assert_eq!(r.code, Code::RESOURCE_EXHAUSTED, "{r:?}");
    other
}

/// Keyed calls run on when their connection closes, for the retry that will come;
/// with no deadline and a handler that never ends, each held one of the server's
/// `max_running` for ever, so a client that sent them and left refused every keyed
/// call of the server (40 connections of 256). Once nobody has waited for a call for
/// `max_unattended` it is stopped, and a late retry gets `ABORTED`, not a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_calls_whose_callers_all_left_are_stopped() {
    let mut t = keyed_target(Duration::from_millis(300)).await;
    let probe = t.probe.clone();
    let mut leaving = t.connect().await;
    for call in 1..=2 {
        send(&mut leaving, &keyed_request(call, "t.H/Wait", 5, call)).await;
    }
    let mut other = refused_when_full(&t).await;
    // While a connection waits for them, they run on (three checks' worth).
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        probe.dropped.load(Ordering::SeqCst),
        0,
        "stopped while awaited"
    );
    drop(leaving);
    wait_until("the abandoned handlers are stopped", || {
        probe.dropped.load(Ordering::SeqCst) == 2
    })
    .await;
    // Their slots are free: a keyed call runs.
    let mut say = keyed_request(2, "rpc.examples.v1.Echo/Say", 6, 2);
    say.extend_from_slice(&say_payload("keyed"));
    send(&mut other, &say).await;
    assert_eq!(say_reply(&response(&mut other, 2).await), "keyed");
    // A retry of a stopped call gets its recorded outcome; it does not run again.
    send(&mut other, &keyed_attempt(3, "t.H/Wait", 5, 1, 2)).await;
    let r = response(&mut other, 3).await;
    assert_eq!(r.code, Code::ABORTED, "{r:?}");
    assert!(r.message.contains("went away"), "{r:?}");
    assert_eq!(probe.held.load(Ordering::SeqCst), 2, "the retry ran again");
    t.check_good("abandoned keyed calls").await;
}

/// The same client, leaving again and again: the calls it left hold no place once the
/// server runs out of them. At `max_running` the calls nobody waits for any more are
/// stopped at once and their places go to new calls (a call a connection still waits
/// for keeps its place). They held their places until `max_unattended` passed, so a
/// client that sent such calls and left every minute kept every keyed call of the
/// server refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_calls_nobody_waits_for_give_way_to_new_ones_at_the_limit() {
    let mut t = keyed_target(Duration::from_secs(3600)).await;
    let probe = t.probe.clone();
    let mut leaving = t.connect().await;
    let mut staying = t.connect().await;
    send(&mut leaving, &keyed_request(1, "t.H/Wait", 5, 1)).await;
    send(&mut staying, &keyed_request(1, "t.H/Wait", 7, 1)).await;
    let mut other = refused_when_full(&t).await;
    drop(leaving);
    // Once the server has seen the connection close, a new keyed call runs in the
    // place of the call it left (not in the awaited one's).
    let mut id = 1;
    let reply = loop {
        id += 1;
        let mut say = keyed_request(id, "rpc.examples.v1.Echo/Say", 6, id);
        say.extend_from_slice(&say_payload("keyed"));
        send(&mut other, &say).await;
        let r = response(&mut other, id).await;
        if r.code != Code::RESOURCE_EXHAUSTED {
            break r;
        }
        assert!(id < 200, "still refused after {id} tries: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(say_reply(&reply), "keyed");
    wait_until("the left call's handler is stopped", || {
        probe.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    // A retry of the stopped call gets its recorded outcome; it does not run again.
    id += 1;
    send(&mut other, &keyed_attempt(id, "t.H/Wait", 5, 1, 2)).await;
    let r = response(&mut other, id).await;
    assert_eq!(r.code, Code::ABORTED, "{r:?}");
    assert!(r.message.contains("needed its place"), "{r:?}");
    assert_eq!(probe.held.load(Ordering::SeqCst), 2, "the retry ran again");
    // The call a connection waits for was not stopped.
    assert_eq!(
        probe.dropped.load(Ordering::SeqCst),
        1,
        "an awaited call was stopped"
    );
    drop(staying);
    t.check_good("keyed calls left at the limit").await;
}

/// Empty PINGs from a client that reads nothing, to a server with a small request
/// limit: the PONGs waiting take its slots, and at the limit its look-ahead (which
/// looks for CANCELs) answers PINGs at once only while few answers wait, so it soon
/// reads nothing more. Answering every PING read ahead let such a client queue some
/// 350,000 PONGs (about 50 MB) on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_pings_from_a_client_that_does_not_read_are_soon_not_read() {
    let server = Server::builder()
        .max_concurrent_requests(4)
        .add_service(EchoServer::new(EchoService))
        .build();
    let serving = TestServer::serve(server.clone()).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let sock = socket
        .connect(serving.uri.trim_start_matches("tcp://").parse().unwrap())
        .await
        .unwrap();
    let (r, mut w) = sock.into_split();
    let batch = framed(&ping(PING, 7, &[])).repeat(1024);
    let writer = tokio::spawn(async move {
        while w.write_all(&batch).await.is_ok() {}
        std::future::pending::<()>().await; // keeps the socket open until aborted
    });
    // The PONGs the kernel's buffers take from the server, those waiting in its slots
    // and the look-ahead's: far below what the server's 4 MiB of queued answers would
    // hold.
    let read = || -> usize {
        server
            .connections()
            .iter()
            .map(|c| c.frames_received as usize)
            .sum()
    };
    let took = settles_within("PINGs the server read", read, 600_000).await;
    let sent: usize = server
        .connections()
        .iter()
        .map(|c| c.frames_sent as usize)
        .sum();
    assert!(
        took - sent < 4 + 16 + 256 + 64,
        "{took} PINGs read, {sent} PONGs written: {} waiting",
        took - sent
    );
    writer.abort();
    let _ = writer.await;
    drop(r);
}

/// A PONG echoes its PING's payload, and PONGs wait with the other frames the server
/// answers by itself: a client that sends PINGs of the largest payload allowed and
/// reads nothing is soon not read either, instead of making the server queue a PONG
/// for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_from_a_client_that_does_not_read_is_bounded() {
    // The largest PING allowed (§2.9), many times the server's bound in all.
    const PAYLOAD: usize = 1024;
    const PINGS: usize = 150_000;
    let mut t = Target::start(Server::builder()).await;
    let sock = small_reader(&t).await;
    let (r, mut w) = sock.into_split();
    let written = Arc::new(AtomicUsize::new(0));
    let frame = framed(&ping(PING, 7, &vec![0x5a; PAYLOAD]));
    let writer = tokio::spawn({
        let written = written.clone();
        async move {
            for _ in 0..PINGS {
                if w.write_all(&frame).await.is_err() {
                    break;
                }
                written.fetch_add(frame.len(), Ordering::SeqCst);
            }
            std::future::pending::<()>().await; // keeps the socket open until aborted
            drop(w);
        }
    });
    // The kernel's buffers, the server's bound on its own answers (4 MiB) and a frame
    // being read or answered.
    let bound = kernel_buffers() + (4 << 20) + 4 * PAYLOAD;
    let took = settles_within(
        "PING bytes the server took",
        || written.load(Ordering::SeqCst),
        bound,
    )
    .await;
    assert!(took < PINGS * PAYLOAD, "{took}");
    t.check_good("a PING flood").await;
    writer.abort();
    let _ = writer.await;
    drop(r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_goaway_reaches_a_client_that_is_still_sending() {
    // §6.7 and §7 ("send GOAWAY and close"). The server stops reading at the bad frame;
    // had it closed its socket with the client's later bytes unread, the kernel would
    // reset the connection, and a reset destroys what it has not delivered yet: here
    // the PONGs queued behind a client slow to read, and the GOAWAY after them.
    let mut t = Target::start(Server::builder()).await;
    let (mut r, mut w) = t.connect().await.into_split();
    // 2.5 MiB of PONGs to answer, in PINGs of the largest payload allowed (§2.9).
    const PINGS: u64 = 2560;
    let mut bytes = Vec::new();
    for id in 1..=PINGS {
        bytes.extend(framed(&ping(PING, id, &[7; 1024])));
    }
    bytes.extend(framed(&header(11, 0, 0))); // unknown kind: PROTOCOL_ERROR
    for id in PINGS + 1..=PINGS + 3 {
        bytes.extend(framed(&ping(PING, id, &[8; 1000])));
    }
    let writer = tokio::spawn(async move {
        // Fails once the server is gone; the write half stays open until the end.
        let _ = w.write_all(&bytes).await;
        w
    });
    // Not reading for a while: the PONGs back up behind this client.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut pongs = 0;
    let goaway = loop {
        match recv(&mut r).await {
            Some(Frame::Pong { .. }) => pongs += 1,
            Some(Frame::GoAway(g)) => break g,
            Some(other) => panic!("unexpected {other:?}"),
            None => panic!("the connection ended (or was reset) after {pongs} PONGs, no GOAWAY"),
        }
    };
    assert_eq!(pongs, PINGS);
    assert_eq!(goaway.code, GoAwayCode::PROTOCOL_ERROR, "{goaway:?}");
    assert!(recv(&mut r).await.is_none(), "closed after the GOAWAY");
    drop(writer.await.unwrap());
    t.check_good("an error close with input unread").await;
}

// ---------------------------------------------------------------------------------------
// Soak: every pattern at once
// ---------------------------------------------------------------------------------------

/// Resident memory of this process (server and clients alike), from `/proc`.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Growth of resident memory allowed over the soak: the server's per-connection
/// bounds (16 answers, 1 MiB of stream output, 4 MiB of control frames, a 16 MiB frame
/// being read) for the few hostile connections alive at a time, with room for the
/// allocator keeping what it freed. Before the bounds, a few seconds of these patterns
/// took hundreds of MiB.
const SOAK_GROWTH: usize = 160 << 20;

/// A mix of hostile clients against one server for a bounded time: floods of
/// REQUEST+CANCEL pairs and of cancelled flooding streams to a client that reads
/// nothing, keyed calls cancelled at once, empty DATA floods, PING floods with large
/// payloads never read, and a slow reader. Meanwhile a well-behaved client keeps
/// calling: every one of its calls succeeds, and the process's memory stays under
/// [`SOAK_GROWTH`] above where it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_of_hostile_clients_leaves_memory_bounded_and_good_calls_served() {
    const SOAK: Duration = Duration::from_secs(6);
    let t = Target::start(Server::builder().max_concurrent_requests(16)).await;
    let start = resident_bytes();
    let until = tokio::time::Instant::now() + SOAK;
    let mut attackers = tokio::task::JoinSet::new();
    // Each attacker opens a new connection per round and runs `round` on it, until
    // the soak ends; it returns how many rounds it made.
    let mut attack = |round: fn(TcpStream, u64) -> futures::future::BoxFuture<'static, ()>| {
        let addr = t.addr.clone();
        attackers.spawn(async move {
            let mut rounds = 0u64;
            while tokio::time::Instant::now() < until {
                if let Ok(sock) = TcpStream::connect(&addr).await {
                    round(sock, rounds).await;
                    rounds += 1;
                }
            }
            rounds
        });
    };
    /// Writes `bytes`, giving up after `limit` (the server may stop reading).
    async fn write_for(sock: &mut TcpStream, bytes: &[u8], limit: Duration) {
        let _ = tokio::time::timeout(limit, sock.write_all(bytes)).await;
    }

    // REQUEST+CANCEL pairs on a connection that never reads.
    attack(|mut sock, _| {
        Box::pin(async move {
            let pairs: Vec<u8> = (1..5_000u64)
                .flat_map(|id| {
                    framed(&request(id, 0, "t.H/Answer", b""))
                        .into_iter()
                        .chain(framed(&cancel(id)))
                })
                .collect();
            write_for(&mut sock, &pairs, Duration::from_secs(1)).await;
        })
    });
    // Flooding streams with unbounded credit, cancelled, to a client that never reads.
    attack(|mut sock, _| {
        Box::pin(async move {
            for id in 1..=64u64 {
                let mut frames = framed(&stream_request(id, "t.H/ProduceBig"));
                frames.extend(framed(&window(id, u32::MAX)));
                write_for(&mut sock, &frames, Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let cancels: Vec<u8> = (1..=64u64).flat_map(|id| framed(&cancel(id))).collect();
            write_for(&mut sock, &cancels, Duration::from_millis(200)).await;
        })
    });
    // Keyed calls that wait forever, cancelled at once.
    attack(|mut sock, round| {
        Box::pin(async move {
            let pairs: Vec<u8> = (1..1_000u64)
                .flat_map(|id| {
                    framed(&keyed_request(id, "t.H/Wait", 77 + u128::from(round), id))
                        .into_iter()
                        .chain(framed(&cancel(id)))
                })
                .collect();
            write_for(&mut sock, &pairs, Duration::from_millis(500)).await;
        })
    });
    // Empty DATA on a stream whose handler never reads, until the server objects.
    attack(|mut sock, _| {
        Box::pin(async move {
            let mut frames = framed(&stream_request(1, "t.H/Hold"));
            frames.extend((0..40_000).flat_map(|_| framed(&data(1, 0, b""))));
            write_for(&mut sock, &frames, Duration::from_secs(1)).await;
        })
    });
    // PINGs with the largest payloads allowed (§2.9), never reading the PONGs.
    attack(|mut sock, _| {
        Box::pin(async move {
            let payload = vec![0x5a; 1024];
            let pings: Vec<u8> = (1..=16_384u64)
                .flat_map(|id| framed(&ping(PING, id, &payload)))
                .collect();
            write_for(&mut sock, &pings, Duration::from_secs(1)).await;
        })
    });
    // A slow reader of a flooding stream.
    let addr = t.addr.clone();
    attackers.spawn(async move {
        let Ok(mut sock) = TcpStream::connect(&addr).await else {
            return 0;
        };
        send(&mut sock, &stream_request(1, "t.H/ProduceBig")).await;
        send(&mut sock, &window(1, u32::MAX)).await;
        let mut buf = vec![0u8; 1024];
        let mut reads = 0u64;
        while tokio::time::Instant::now() < until {
            let _ = tokio::time::timeout(Duration::from_millis(100), sock.read(&mut buf)).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            reads += 1;
        }
        reads
    });

    // The well-behaved client, all along.
    let mut good = t.good.clone();
    let mut calls = 0;
    let mut peak = start;
    while tokio::time::Instant::now() < until {
        let message = format!("call {calls}");
        let reply = tokio::time::timeout(
            HANG_GUARD,
            good.say(
                rpc_core::Request::new(SayRequest {
                    message: message.clone(),
                    payload: Default::default(),
                })
                .with_timeout(Duration::from_secs(20)),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("the good client hangs at call {calls}"))
        .unwrap_or_else(|e| panic!("the good client's call {calls} failed: {e}"));
        assert_eq!(reply.get_ref().message, message);
        calls += 1;
        peak = peak.max(resident_bytes());
        assert!(
            peak <= start + SOAK_GROWTH,
            "resident memory grew by {} MiB (bound {} MiB) after {calls} good calls",
            (peak - start) >> 20,
            SOAK_GROWTH >> 20
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(rounds) = attackers.join_next().await {
        assert!(rounds.unwrap() > 0, "an attacker never got going");
    }
    assert!(calls > 10, "only {calls} good calls in {SOAK:?}");
    eprintln!(
        "soak: {calls} good calls, resident memory {} MiB at the start, peak {} MiB",
        start >> 20,
        peak >> 20
    );
}

// ---------------------------------------------------------------------------------------
// A server that goes silent (issue 15, item 5: keepalive)
// ---------------------------------------------------------------------------------------

/// A TCP forwarder that can *freeze* the connections it carries: stop moving bytes in
/// both directions without closing anything, as a host that lost power or a cut cable
/// looks from the other end. Connections opened after the freeze flow normally.
struct Freezer {
    addr: std::net::SocketAddr,
    accepted: Arc<std::sync::atomic::AtomicU64>,
    frozen_below: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Freezer {
    async fn start(upstream: std::net::SocketAddr) -> Freezer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let frozen_below = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (count, frozen) = (accepted.clone(), frozen_below.clone());
        let task = tokio::spawn(async move {
            // Owned by this task: aborting it drops every connection.
            let mut pumps = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let index = count.fetch_add(1, Ordering::SeqCst);
                let server = TcpStream::connect(upstream).await.unwrap();
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                pumps.spawn(pump(client_read, server_write, index, frozen.clone()));
                pumps.spawn(pump(server_read, client_write, index, frozen.clone()));
            }
        });
        Freezer {
            addr,
            accepted,
            frozen_below,
            task,
        }
    }

    /// Freezes every connection open now.
    fn freeze(&self) {
        let open = self.accepted.load(Ordering::SeqCst);
        self.frozen_below.store(open, Ordering::SeqCst);
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until connection `index` is frozen; then holds both ends open
/// and moves nothing more.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    index: u64,
    frozen_below: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if index < frozen_below.load(Ordering::SeqCst) {
            // Silent from now on, in this direction; the other pump does the same.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The server's host goes silent under a call with a 30 s deadline: with a 200 ms
/// keepalive interval and a 500 ms timeout, the channel declares the connection dead
/// and fails the call `UNAVAILABLE` (saying so) long before its deadline; the next call
/// reconnects and is answered. (The bound is on the status, not on the clock: the
/// guard only turns a hang into a failure.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_declared_dead_by_keepalive_before_the_deadline() {
    let server = common::TestServer::start(Server::builder(), common::TestEcho::new(None).0).await;
    let upstream = server.uri.trim_start_matches("tcp://").parse().unwrap();
    let freezer = Freezer::start(upstream).await;
    let channel = Channel::builder()
        .keepalive_interval(Some(Duration::from_millis(200)))
        .keepalive_timeout(Duration::from_millis(500))
        .connect(
            rpc_transport_tcp::StreamConnector::from_uri(&format!("tcp://{}", freezer.addr))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut echo = EchoClient::new(channel);
    let hello = |message: &str| SayRequest {
        message: message.into(),
        ..Default::default()
    };
    assert_eq!(
        echo.say(hello("before")).await.unwrap().get_ref().message,
        "before"
    );

    freezer.freeze();
    let call = echo.sleep(
        rpc_core::Request::new(SleepRequest { delay_ms: 10 }).with_timeout(Duration::from_secs(30)),
    );
    let err = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("keepalive, not the 30 s deadline, ends the call")
        .expect_err("a frozen connection cannot answer");
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert!(err.message().contains("keepalive"), "{err}");

    // The channel opened a new connection (through the forwarder, which lets new ones
    // through) for the next call.
    let after = tokio::time::timeout(HANG_GUARD, echo.say(hello("after")))
        .await
        .expect("the channel reconnects");
    assert_eq!(after.unwrap().get_ref().message, "after");
    assert_eq!(freezer.accepted.load(Ordering::SeqCst), 2);
}

/// A service that is never ready: its requests wait, parked, until their deadlines.
#[derive(Clone)]
struct NeverReady;

impl Service<ServerCall> for NeverReady {
    type Response = ServerReply;
    type Error = Status;
    type Future = std::future::Ready<Result<ServerReply, Status>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        std::task::Poll::Pending
    }

    fn call(&mut self, _: ServerCall) -> Self::Future {
        unreachable!("never ready")
    }
}

/// Requests parked behind a busy service when the connection fails are not answered
/// after its GOAWAY (nothing follows it, docs/wire.md 6.4): their deadlines passing
/// while the server waited for the client to close queued `DEADLINE_EXCEEDED` answers
/// behind it, and their handlers could still start (found by a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_requests_are_not_answered_after_a_goaway_for_an_error() {
    let server = Server::builder()
        .add_named_service("t.N", NeverReady)
        .build();
    let server = TestServer::serve(server).await;
    let mut sock = TcpStream::connect(server.uri.trim_start_matches("tcp://"))
        .await
        .unwrap();
    let budget = Duration::from_millis(50);
    let mut parked = bytes::BytesMut::new();
    rpc_core::frame::encode_request_header(&mut parked, 1, "t.N/M", Some(budget), &Metadata::new());
    // PINGs whose 7 MiB of PONGs this side does not read for a while: more than the
    // kernel's buffers take, so the server's GOAWAY waits behind them, and its
    // connection with it (PINGs of the largest payload allowed, §2.9).
    let mut bytes = Vec::new();
    for id in 1..=7000 {
        bytes.extend(framed(&ping(PING, id, &[0; 1024])));
    }
    bytes.extend(framed(&parked));
    // A frame of no kind this version defines.
    bytes.extend(framed(&header(11, 0, 0)));
    sock.write_all(&bytes).await.unwrap();
    // Past the parked request's deadline several times over.
    tokio::time::sleep(budget * 6).await;
    let mut frames = Vec::new();
    while let Some(frame) = recv(&mut sock).await {
        frames.push(frame);
    }
    let kinds: Vec<_> = frames
        .iter()
        .map(|frame| match frame {
            Frame::Pong { .. } => "PONG".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    let pongs = frames
        .iter()
        .take_while(|frame| matches!(frame, Frame::Pong { .. }))
        .count();
    assert!(
        pongs == 7000
            && matches!(&frames[pongs..], [Frame::GoAway(g)] if g.code == GoAwayCode::PROTOCOL_ERROR),
        "the PONGs, then only the GOAWAY: {:?}",
        &kinds[pongs.saturating_sub(2)..]
    );
}

/// A client that fills the server's request limit with calls that never end, sends
/// much more behind them (past what the server reads ahead at its limit, and past what
/// its link reads ahead to watch for the end), and is then reset, as a crashed process
/// with unread data is: the server sees the reset with those frames unread, and the
/// handlers end. They ran on for ever before: only reading on would have shown it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_behind_frames_the_server_did_not_read_ends_its_calls() {
    const LIMIT: usize = 4;
    let mut t = Target::start(Server::builder().max_concurrent_requests(LIMIT)).await;
    let mut sock = t.connect().await;
    for id in 1..=LIMIT as u64 {
        send(&mut sock, &request(id, 0, "t.H/Wait", &[])).await;
    }
    wait_until("the calls to start", || {
        t.probe.held.load(Ordering::SeqCst) == LIMIT
    })
    .await;
    // 256 KiB more: the core's look-ahead and the link's take 64 KiB each.
    for id in LIMIT as u64 + 1..=LIMIT as u64 + 64 {
        send(&mut sock, &request(id, 0, "t.H/Wait", &[0x33; 4096])).await;
    }
    let read = || -> usize {
        t.handle
            .connections()
            .iter()
            .map(|c| c.bytes_received as usize)
            .sum()
    };
    let took = settles_within("bytes the server read", read, 1 << 20).await;
    assert!(
        took < 64 * 4096,
        "the server read all {took} bytes; the test needs some left unread"
    );
    assert_eq!(
        t.probe.dropped.load(Ordering::SeqCst),
        0,
        "no call ended yet"
    );
    sock.set_zero_linger().unwrap();
    drop(sock);
    wait_until("the calls of the reset client to end", || {
        t.probe.dropped.load(Ordering::SeqCst) == LIMIT
    })
    .await;
    assert_eq!(
        t.probe.held.load(Ordering::SeqCst),
        LIMIT,
        "nothing else ran"
    );
    t.check_good("a client reset behind unread frames").await;
}

/// A client sending a frame in pieces (a large upload, slowly) while a call of its
/// waits is not silent: the server's keepalive counts the bytes arriving as life, as
/// it counts whole frames, and does not drop the connection for an unanswered PING
/// meanwhile. (Over UDP, the same for a message's fragments, with a PONG sent as a
/// message numbered behind them: from a review of the UDP wire.)
// On a paused clock (it moves only when every task waits), so that a loaded machine's
// stalls cannot pass for the client's silence.
#[tokio::test(start_paused = true)]
async fn a_frame_arriving_in_pieces_keeps_the_connection_alive() {
    // Silence would be found within 2 × 1 s + 1 s; the trickle below lasts 5 s, with
    // 50 ms between pieces.
    let t = Target::start(
        Server::builder()
            .keepalive_interval(Some(Duration::from_secs(1)))
            .keepalive_timeout(Duration::from_secs(1)),
    )
    .await;
    let mut sock = t.connect().await;
    send(&mut sock, &request(1, 0, "t.H/Wait", b"")).await;
    // A frame of 200,000 bytes, 1 KiB every 50 ms for 5 s: never whole. A write to a
    // connection the server dropped fails, and so does the test.
    sock.write_all(&200_000u32.to_be_bytes()).await.unwrap();
    sock.write_all(&header(REQUEST, 0, 3)).await.unwrap();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        sock.write_all(&[0u8; 1024]).await.unwrap();
    }
    // What the server sent meanwhile: PINGs (unanswered), and no end.
    let ended = tokio::time::timeout(Duration::from_millis(200), async {
        loop {
            match recv(&mut sock).await {
                Some(Frame::Ping { .. }) => {}
                Some(other) => panic!("unexpected {other:?}"),
                None => break,
            }
        }
    })
    .await;
    assert!(
        ended.is_err(),
        "the server dropped a client that was sending"
    );
}

/// The client side of the reads-nothing rule: a server that takes none of the
/// client's bytes but sends a PING now and then (heard, so never silent) was kept,
/// with every call on its connection, for ever (from a review). The client closes the
/// connection once its writes have not moved for two keepalive intervals and 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_reads_nothing_but_pings_is_dropped_by_the_client() {
    use rpc_core::client::Channel;
    use rpc_proto::echo::{echo_client::EchoClient, SayRequest};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (_read, mut write) = socket.into_split();
        // Reads nothing; a PING every 200 ms.
        for id in 1u64.. {
            if write
                .write_all(&framed(&ping(PING, id, b"")))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let connector = rpc_transport_tcp::StreamConnector::from_uri(&format!("tcp://{addr}")).unwrap();
    // Seconds of slack for the server's PINGs on a loaded machine: the 30 s rule
    // sets the time anyway.
    let channel = Channel::builder()
        .keepalive_interval(Some(Duration::from_secs(2)))
        .keepalive_timeout(Duration::from_secs(5))
        .connect(connector)
        .await
        .unwrap();
    // Requests the server never reads: more than the socket buffers take.
    let mut calls = Vec::new();
    for _ in 0..16 {
        let mut echo = EchoClient::new(channel.clone());
        calls.push(tokio::spawn(async move {
            echo.say(SayRequest {
                message: "x".repeat(1 << 20),
                ..SayRequest::default()
            })
            .await
        }));
    }
    let t0 = std::time::Instant::now();
    for call in calls {
        let status = tokio::time::timeout(Duration::from_secs(90), call)
            .await
            .expect("a call waited on a server that reads nothing")
            .unwrap()
            .expect_err("nobody answers");
        assert_eq!(status.code(), rpc_core::Code::UNAVAILABLE, "{status}");
    }
    assert!(
        t0.elapsed() >= Duration::from_secs(25),
        "{:?}",
        t0.elapsed()
    );
    server.abort();
}
