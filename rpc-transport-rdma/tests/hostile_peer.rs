//! A raw peer that speaks the soft provider's wire format by hand (docs/rdma.md, "Soft
//! provider packets" and "Link messages") against a real listener on `rdma+unix://`:
//! garbage instead of the handshake, malformed packets and link messages after a
//! valid one, lengths claiming gigabytes. Each connection fails with a clear error,
//! nothing hangs or panics, and the listener keeps serving well-behaved clients.

mod common;

use std::{
    sync::{Mutex, OnceLock},
    time::Duration,
};

use bytes::Bytes;
use common::{flush, recv, send, socket_path, GUARD};
use rpc_core::{
    link::{Connector, LinkConfig, Listener},
    server::Server,
    ErrorKind, Request,
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use rpc_transport_rdma::{Address, RdmaConfig, RdmaConnector, RdmaListener};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

/// The frame limit the listener's links get: small, so that an eager frame in a
/// default receive buffer (8 KiB) can exceed it.
const MAX_FRAME: usize = 4096;

// ---- The soft provider's packets, by hand ----

/// A packet: `len u32` (type and body), `type u8`, body.
fn packet(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = ((body.len() + 1) as u32).to_be_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(body);
    out
}

/// HELLO's 64-byte body: no region table offered (`table_fd` -1), another host's
/// boot id, so the listener neither maps anything nor attaches to this process.
fn soft_hello_with(magic: &[u8; 8], version: u8, recv_count: u32, recv_len: u32) -> Vec<u8> {
    let mut body = magic.to_vec();
    body.extend_from_slice(&[version, 0, 0, 0]);
    body.extend_from_slice(&(std::process::id() as i32).to_be_bytes());
    body.extend_from_slice(&[0xab; 16]); // boot id
    body.extend_from_slice(&0u64.to_be_bytes()); // pid namespace
    body.extend_from_slice(&(-1i32).to_be_bytes()); // table fd
    body.extend_from_slice(&0u32.to_be_bytes()); // table capacity
    body.extend_from_slice(&0u64.to_be_bytes()); // table nonce
    body.extend_from_slice(&recv_count.to_be_bytes());
    body.extend_from_slice(&recv_len.to_be_bytes());
    assert_eq!(body.len(), 64);
    packet(1, &body)
}

fn soft_hello() -> Vec<u8> {
    soft_hello_with(b"RPCSOFT1", 1, 64, 8192)
}

fn table_ack() -> Vec<u8> {
    packet(2, &[0])
}

/// A SEND packet carrying one link message.
fn send_packet(message: &[u8]) -> Vec<u8> {
    packet(3, message)
}

// ---- Link messages, by hand ----

fn link_header(kind: u8, credits: u16, id: u32) -> Vec<u8> {
    let mut out = vec![kind, 0];
    out.extend_from_slice(&credits.to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out
}

fn link_hello_with(version: u8, buffers: u32, buffer_len: u32) -> Vec<u8> {
    let mut out = link_header(1, 0, 0);
    out.extend_from_slice(&[version, 0, 0, 0]);
    out.extend_from_slice(&buffers.to_be_bytes());
    out.extend_from_slice(&buffer_len.to_be_bytes());
    out.extend_from_slice(&(1u32 << 20).to_be_bytes());
    out
}

/// A well-formed link HELLO in a SEND packet.
fn link_hello() -> Vec<u8> {
    send_packet(&link_hello_with(1, 64, 8192))
}

/// A BATCH of entries `len u32` and `len` zero bytes, each announcing `lens[i].0` and
/// carrying `lens[i].1` bytes.
fn batch(entries: &[(u32, usize)]) -> Vec<u8> {
    let mut out = link_header(6, 0, 0);
    for &(announced, carried) in entries {
        out.extend_from_slice(&announced.to_be_bytes());
        out.extend(std::iter::repeat_n(0u8, carried));
    }
    out
}

/// An RTS: `frame_len`, `head_len` inline bytes (zeros), then regions of `lens`.
fn rts(frame_len: u64, head_len: u16, lens: &[u64]) -> Vec<u8> {
    let mut out = link_header(3, 0, 1);
    out.extend_from_slice(&frame_len.to_be_bytes());
    out.extend_from_slice(&head_len.to_be_bytes());
    out.extend_from_slice(&(lens.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend(std::iter::repeat_n(0u8, usize::from(head_len)));
    for len in lens {
        out.extend_from_slice(&1u64.to_be_bytes()); // key
        out.extend_from_slice(&0x1000u64.to_be_bytes()); // address
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]); // read access
    }
    out
}

// ---- What the listener logs ----

/// Every event logged in this test binary, as text.
fn log() -> &'static Mutex<Vec<String>> {
    static LOG: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LOG.get_or_init(|| {
        tracing::subscriber::set_global_default(Capture).expect("no other subscriber");
        Mutex::new(Vec::new())
    })
}

/// A subscriber that keeps each event's fields, so that the test can read the
/// listener's reasons for dropping connections it never hands out.
struct Capture;

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write;
                let _ = write!(self.0, "{}={value:?} ", field.name());
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        log().lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Waits (with a hang guard) until a logged event mentions both `what` and `reason`;
/// `case` names the test case.
async fn logged(case: &str, what: &str, reason: &str) {
    let found = tokio::time::timeout(GUARD, async {
        loop {
            if log()
                .lock()
                .unwrap()
                .iter()
                .any(|line| line.contains(what) && line.contains(reason))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "{case}: nothing logged {what:?} with {reason:?}; the log: {:#?}",
        log().lock().unwrap()
    );
}

// ---- The raw peer ----

/// Reads until the listener closes the connection: the proof that it dropped it
/// rather than waiting for more. A reset is a close too.
async fn until_closed(stream: &mut UnixStream) {
    let mut sink = Vec::new();
    let read = tokio::time::timeout(GUARD, stream.read_to_end(&mut sink))
        .await
        .expect("the listener kept a bad connection open");
    if let Err(err) = read {
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }
}

async fn raw(path: &std::path::Path, bytes: &[u8]) -> UnixStream {
    let mut stream = UnixStream::connect(path).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

async fn echo(uri: &str, message: &str) {
    let channel = rpc_core::client::Channel::builder()
        .connect(RdmaConnector::from_uri(uri).unwrap())
        .await
        .unwrap();
    let reply = tokio::time::timeout(
        GUARD,
        EchoClient::new(channel).say(Request::new(SayRequest {
            message: message.into(),
            payload: Bytes::new(),
        })),
    )
    .await
    .expect("the call hung")
    .unwrap();
    assert_eq!(reply.into_inner().message, message);
}

/// The listener's HELLO packet on `stream`: length, type 1, 72 bytes (version 1's 64,
/// and its proof address).
async fn their_hello<S: AsyncReadExt + Unpin>(stream: &mut S) -> [u8; 77] {
    let mut theirs = [0u8; 77];
    tokio::time::timeout(GUARD, stream.read_exact(&mut theirs))
        .await
        .expect("no HELLO")
        .unwrap();
    assert_eq!(theirs[4], 1, "a HELLO");
    theirs
}

/// Sends `hello` as ours, and reads the listener's TABLE_ACK: whether it mapped the
/// table that HELLO names.
async fn replay<S: AsyncReadExt + AsyncWriteExt + Unpin>(stream: &mut S, hello: &[u8]) -> bool {
    stream.write_all(hello).await.unwrap();
    let mut ack = [0u8; 6];
    tokio::time::timeout(GUARD, stream.read_exact(&mut ack))
        .await
        .expect("no TABLE_ACK")
        .unwrap();
    assert_eq!(ack[4], 2, "a TABLE_ACK");
    ack[5] != 0
}

/// An Echo server on a soft RDMA listener at a fresh socket: the socket's path, its
/// URI and the serving task.
async fn echo_server(
    name: &str,
) -> (
    std::path::PathBuf,
    String,
    tokio::task::JoinHandle<Result<(), rpc_core::Error>>,
) {
    let path = socket_path(name);
    let (uri, task) = echo_server_at(
        &Address::Unix(path.clone()),
        RdmaConfig::default(),
        rpc_core::link::DEFAULT_MAX_FRAME_LEN,
    )
    .await;
    (path, uri, task)
}

/// An Echo server on a soft RDMA listener over TCP (`rdma://`) with `config`: its URI
/// and the serving task.
async fn echo_server_tcp(
    config: RdmaConfig,
) -> (String, tokio::task::JoinHandle<Result<(), rpc_core::Error>>) {
    let address = Address::Tcp("127.0.0.1:0".into());
    echo_server_at(&address, config, rpc_core::link::DEFAULT_MAX_FRAME_LEN).await
}

/// An Echo server on a soft RDMA listener at `address`, with `config` and the
/// server's `max_frame_len`: its URI and the serving task.
async fn echo_server_at(
    address: &Address,
    config: RdmaConfig,
    max_frame_len: usize,
) -> (String, tokio::task::JoinHandle<Result<(), rpc_core::Error>>) {
    let listener = RdmaListener::bind(address, config).await.unwrap();
    let uri = listener.local_addr_uri();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .max_frame_len(max_frame_len)
        .build();
    (
        uri,
        tokio::spawn(async move { server.serve(listener).await }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_the_handshake_is_refused_and_the_listener_keeps_serving() {
    log();
    let (path, uri, task) = echo_server("garbage").await;

    let mut hello_twice = soft_hello();
    hello_twice.extend(soft_hello());
    let mut cut_hello = soft_hello();
    cut_hello[3] = 21; // claims 21 bytes: the type and 20 of HELLO's 64
    cut_hello.truncate(4 + 21);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "an HTTP request",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "exceeds the maximum of 256 bytes",
        ),
        (
            "a length of u32::MAX",
            vec![0xff, 0xff, 0xff, 0xff, 1],
            "packet of 4294967295 bytes exceeds",
        ),
        (
            "an empty packet",
            vec![0, 0, 0, 0],
            "empty soft-RDMA packet",
        ),
        (
            "an unknown type",
            vec![0, 0, 0, 3, 9, 9, 9],
            "unknown soft-RDMA packet type 9",
        ),
        ("a cut HELLO", cut_hello, "expected at least 64"),
        (
            "another protocol's magic",
            soft_hello_with(b"RPCSOFT9", 1, 64, 8192),
            "does not speak the soft RDMA provider's protocol",
        ),
        (
            "another version",
            soft_hello_with(b"RPCSOFT1", 7, 64, 8192),
            "soft RDMA provider version 7",
        ),
        (
            "no receive buffers",
            soft_hello_with(b"RPCSOFT1", 1, 0, 8192),
            "posts 0 receive buffers",
        ),
        (
            "receive buffers of 4 GiB",
            soft_hello_with(b"RPCSOFT1", 1, 64, u32::MAX),
            "receive buffers of 4294967295 bytes",
        ),
        (
            "u32::MAX receive buffers",
            soft_hello_with(b"RPCSOFT1", 1, u32::MAX, 8192),
            "posts 4294967295 receive buffers",
        ),
        (
            "TABLE_ACK first",
            table_ack(),
            "its first packet is TABLE_ACK, not HELLO",
        ),
        ("HELLO twice", hello_twice, "expected TABLE_ACK"),
        (
            "half a HELLO, then the end",
            soft_hello()[..30].to_vec(),
            "closed the connection during setup",
        ),
    ];
    // One at a time, so that each reason logged is the answer to its own garbage.
    for (what, bytes, reason) in &cases {
        let mut stream = raw(&path, bytes).await;
        // Our half ends (the listener would otherwise wait for more of a cut packet,
        // until its handshake timeout); its answer to the bytes comes first.
        stream.shutdown().await.unwrap();
        until_closed(&mut stream).await;
        logged(what, "refused during its setup", reason).await;
    }
    echo(&uri, "still serving").await;
    assert!(!task.is_finished(), "the server keeps serving");
    task.abort();
}

/// Sets up a connection by hand, waits until the listener has sent its link HELLO
/// (so the listener has handed the link out), sends `bad`, and reads until the
/// listener closes.
async fn after_setup(path: std::path::PathBuf, bad: Vec<u8>) {
    let mut stream = set_up(&path).await;
    stream.write_all(&bad).await.unwrap();
    until_closed(&mut stream).await;
}

/// A connection set up by hand, once the listener has sent its link HELLO (and so
/// handed the link out).
async fn set_up(path: &std::path::Path) -> UnixStream {
    let mut setup = soft_hello();
    setup.extend(table_ack());
    let mut stream = raw(path, &setup).await;
    // The listener's HELLO (4 + 73) and TABLE_ACK (4 + 2), and its link's HELLO in a
    // SEND (4 + 1 + 24).
    let mut theirs = [0u8; 77 + 6 + 29];
    tokio::time::timeout(GUARD, stream.read_exact(&mut theirs))
        .await
        .expect("setup hung")
        .unwrap();
    assert_eq!(&theirs[4..13], b"\x01RPCSOFT1");
    assert_eq!(theirs[83 + 4], 3, "a SEND");
    assert_eq!(theirs[83 + 5], 1, "of a link HELLO");
    assert_eq!(theirs[83 + 5 + 9], 1, "that accepts BATCH (feature bit 0)");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_packets_after_setup_fail_only_their_connection() {
    let path = socket_path("malformed");
    let mut listener = RdmaListener::bind(&Address::Unix(path.clone()), RdmaConfig::default())
        .await
        .unwrap();
    let config = LinkConfig {
        max_frame_len: MAX_FRAME,
        ..LinkConfig::default()
    };
    let after_hello = |message: Vec<u8>| [link_hello(), send_packet(&message)].concat();
    let mut read_req = vec![0u8; 28];
    read_req[24..].copy_from_slice(&(256 * 1024 + 1u32).to_be_bytes());
    let cases: Vec<(&str, Vec<u8>, ErrorKind, &str)> = vec![
        // The soft provider's packets.
        (
            "an unknown packet type",
            packet(99, &[]),
            ErrorKind::Protocol,
            "unknown soft-RDMA packet type 99",
        ),
        (
            "a packet of u32::MAX bytes",
            vec![0xff, 0xff, 0xff, 0xff, 3],
            ErrorKind::FrameTooLarge,
            "packet of 4294967295 bytes exceeds the maximum",
        ),
        (
            "a packet just over the limit",
            [(256 * 1024 + 30u32).to_be_bytes().as_slice(), &[3]].concat(),
            ErrorKind::FrameTooLarge,
            "exceeds the maximum",
        ),
        (
            "an empty packet",
            vec![0, 0, 0, 0],
            ErrorKind::Protocol,
            "empty",
        ),
        (
            "a cut READ_REQ",
            packet(4, &[0; 9]),
            ErrorKind::Protocol,
            "expected at least 28",
        ),
        (
            "a read of 256 KiB + 1 in one request",
            packet(4, &read_req),
            ErrorKind::Protocol,
            "in one request",
        ),
        (
            "an answer to no request",
            packet(5, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 2, 3]),
            ErrorKind::Protocol,
            "never made",
        ),
        (
            "a write answer to no request",
            packet(7, &[0, 0, 0, 0, 0, 0, 0, 5, 0]),
            ErrorKind::Protocol,
            "never made",
        ),
        (
            "the handshake again",
            soft_hello(),
            ErrorKind::Protocol,
            "repeated its connection setup",
        ),
        (
            "a message longer than the receive buffer",
            send_packet(&[2; 10_000]),
            ErrorKind::Protocol,
            "does not fit the posted receive buffer",
        ),
        // Link messages in well-formed packets.
        (
            "a message shorter than its header",
            send_packet(&[1, 0, 0]),
            ErrorKind::Protocol,
            "shorter than its 8-byte header",
        ),
        (
            "an unknown message kind",
            send_packet(&link_header(9, 0, 0)),
            ErrorKind::Protocol,
            "unknown RDMA link message kind 9",
        ),
        (
            "a link HELLO with no buffers",
            send_packet(&link_hello_with(1, 0, 8192)),
            ErrorKind::Protocol,
            "outside the limits",
        ),
        (
            "a link HELLO with buffers of 4 GiB",
            send_packet(&link_hello_with(1, 64, u32::MAX)),
            ErrorKind::Protocol,
            "outside the limits",
        ),
        (
            "a link HELLO of another version",
            send_packet(&link_hello_with(2, 64, 8192)),
            ErrorKind::UnsupportedVersion,
            "link version 2",
        ),
        (
            "a cut link HELLO",
            send_packet(&link_hello_with(1, 64, 8192)[..20]),
            ErrorKind::Protocol,
            "expected 16",
        ),
        (
            "a frame before the link HELLO",
            send_packet(&link_header(2, 0, 0)),
            ErrorKind::Protocol,
            "before its HELLO",
        ),
        (
            "the link HELLO twice",
            after_hello(link_hello_with(1, 64, 8192)),
            ErrorKind::Protocol,
            "HELLO twice",
        ),
        (
            "65535 credits returned",
            after_hello(link_header(5, u16::MAX, 0)),
            ErrorKind::Protocol,
            "more credits",
        ),
        (
            "a FIN for nothing",
            after_hello(link_header(4, 0, 3)),
            ErrorKind::Protocol,
            "not outstanding",
        ),
        (
            "an eager frame over the frame limit",
            after_hello([link_header(2, 0, 0), vec![0; MAX_FRAME + 1]].concat()),
            ErrorKind::FrameTooLarge,
            "exceeds the maximum frame length",
        ),
        (
            "a BATCH frame over the frame limit",
            after_hello(batch(&[(10, 10), (MAX_FRAME as u32 + 1, MAX_FRAME + 1)])),
            ErrorKind::FrameTooLarge,
            "exceeds the maximum frame length",
        ),
        (
            "a BATCH entry longer than the message",
            after_hello(batch(&[(10, 10), (100, 50)])),
            ErrorKind::Protocol,
            "announces a frame of 100 bytes",
        ),
        (
            "a BATCH entry of no bytes",
            after_hello(batch(&[(10, 10), (0, 0)])),
            ErrorKind::Protocol,
            "announces a frame of 0 bytes",
        ),
        (
            "a BATCH entry with its length cut",
            after_hello([batch(&[(10, 10)]), vec![0, 0]].concat()),
            ErrorKind::Protocol,
            "too few for its length",
        ),
        (
            "a BATCH of nothing",
            after_hello(batch(&[])),
            ErrorKind::Protocol,
            "BATCH with no frame",
        ),
        (
            "a rendezvous frame of u64::MAX bytes",
            after_hello(rts(u64::MAX, 0, &[u64::MAX])),
            ErrorKind::FrameTooLarge,
            "exceeds the maximum frame length",
        ),
        (
            "a rendezvous frame of 4 GiB",
            after_hello(rts(1 << 32, 0, &[1 << 31, 1 << 31])),
            ErrorKind::FrameTooLarge,
            "exceeds the maximum frame length",
        ),
        (
            "rendezvous parts that overflow",
            after_hello(rts(5, 1, &[u64::MAX, 5])),
            ErrorKind::Protocol,
            "overflow",
        ),
        (
            "rendezvous parts that disagree",
            after_hello(rts(100, 0, &[10])),
            ErrorKind::Protocol,
            "add up to",
        ),
        (
            "five regions",
            after_hello(rts(5, 0, &[1; 5])),
            ErrorKind::Protocol,
            "at most",
        ),
        (
            "an inline head of 300 bytes",
            after_hello(rts(300, 300, &[])),
            ErrorKind::Protocol,
            "at most",
        ),
        (
            "an RTS cut after its fixed part",
            after_hello(rts(64, 0, &[64])[..24].to_vec()),
            ErrorKind::Protocol,
            "announces",
        ),
    ];
    for (what, bad, kind, reason) in cases {
        let peer = tokio::spawn(after_setup(path.clone(), bad));
        let mut link = tokio::time::timeout(GUARD, listener.accept(&config))
            .await
            .unwrap_or_else(|_| panic!("{what}: accept hung"))
            .unwrap_or_else(|err| panic!("{what}: the listener failed: {err}"));
        let err = match recv(&mut link).await {
            Some(Err(err)) => err,
            other => panic!("{what}: expected an error, got {other:?}"),
        };
        assert_eq!(err.kind(), kind, "{what}: {err}");
        assert!(err.to_string().contains(reason), "{what}: {err}");
        drop(link);
        tokio::time::timeout(GUARD, peer)
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection stayed open"))
            .unwrap();
    }

    // A well-behaved client after all that.
    let connector = RdmaConnector::from_uri(&format!("rdma+unix://{}", path.display())).unwrap();
    let (client, server) = tokio::join!(connector.connect(&config), listener.accept(&config));
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    send(&mut client, b"head", Bytes::from_static(b"still serving")).await;
    flush(&mut client).await;
    let frame = recv(&mut server).await.expect("a frame").unwrap();
    assert_eq!(&frame[..], b"headstill serving");
}

/// A peer that sends its bad packet together with the handshake can make its
/// connection fail while the listener is still setting up the link: that is the
/// connection's failure, not the listener's, and the server keeps serving.
#[tokio::test]
async fn a_connection_that_fails_during_link_setup_does_not_stop_the_server() {
    log();
    let (path, uri, task) = echo_server("early").await;
    for bad in [
        vec![0xff, 0xff, 0xff, 0xff, 3],
        packet(99, &[]),
        link_hello(),
        Vec::new(),
    ] {
        if task.is_finished() {
            panic!("the server stopped: {:?}", task.await);
        }
        let mut all = soft_hello();
        all.extend(table_ack());
        all.extend(bad);
        let mut stream = raw(&path, &all).await;
        stream.shutdown().await.unwrap();
        until_closed(&mut stream).await;
    }
    if task.is_finished() {
        panic!("the server stopped: {:?}", task.await);
    }
    echo(&uri, "still serving").await;
    assert!(!task.is_finished(), "the server keeps serving");
    task.abort();
}

/// A peer that sends one-sided write requests and never reads the answers is cut
/// off once 65,536 answers wait (the driver's `MAX_DEFERRED`), as one sending read
/// requests was: each answer is a few bytes, but 3 GB of them piled up in 20 s (a
/// hostile-peer round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_requests_whose_answers_are_never_read_end_the_connection() {
    let (path, uri, _server) = echo_server("wflood").await;
    let mut stream = set_up(&path).await;
    // Write requests of one byte for a key nobody registered, 64 KiB of them a write.
    let mut batch = Vec::new();
    for id in 0..2_000u64 {
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&u64::MAX.to_be_bytes()); // key
        body.extend_from_slice(&0u64.to_be_bytes()); // offset
        body.push(7);
        batch.extend(packet(6, &body));
    }
    let mut sent = 0usize;
    let cut = tokio::time::timeout(GUARD * 4, async {
        // 300,000 requests (9 MB): their answers, never read, are 4 MB.
        while sent < 150 {
            if stream.write_all(&batch).await.is_err() {
                return true;
            }
            sent += 1;
        }
        false
    })
    .await
    .expect("the writes stalled");
    if !cut {
        until_closed(&mut stream).await;
    }
    // Others are served all along.
    echo(&uri, "still here").await;
}

/// A host that opens connections and says nothing delays only itself: a client from
/// elsewhere is set up at once, not when the silent ones time out. (A hostile-peer
/// round: about 6 silent connections a second held all 64 setup slots of the listener,
/// and every new client timed out connecting.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_host_does_not_hold_up_other_clients() {
    let config = RdmaConfig {
        handshake_timeout: Duration::from_secs(60),
        ..RdmaConfig::default()
    };
    let (uri, _serving) = echo_server_tcp(config).await;
    let addr: std::net::SocketAddr = uri.trim_start_matches("rdma://").parse().unwrap();
    // From another loopback address than the client below: another source.
    let mut silent = Vec::new();
    for _ in 0..100 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        silent.push(socket.connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::time::timeout(Duration::from_secs(30), echo(&uri, "served"))
        .await
        .expect("the client waited for the silent host's connections");
    drop(silent);
}

/// A peer that echoes the listener's own HELLO back (its boot id, pid namespace, pid,
/// table descriptor and nonce) does not make the listener map its own table as the
/// peer's (a hostile-peer round did this from another host over TCP, and could from
/// behind a local forwarder). Here the peer is in the listener's process, so even the
/// kernel's SO_PEERCRED agrees with the echoed pid: only the nonce tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_hello_is_not_taken_for_a_peer_on_this_host() {
    let (path, uri, _server) = echo_server("echo-hello").await;
    let mut stream = UnixStream::connect(&path).await.unwrap();
    // The listener's HELLO packet: length, type 1, 64 bytes.
    let theirs = their_hello(&mut stream).await;
    // Its TABLE_ACK says whether it mapped "our" table.
    let mapped = replay(&mut stream, &theirs).await;
    assert!(!mapped, "the listener mapped its own table as the peer's");
    drop(stream);
    echo(&uri, "still serving").await;
}

/// A local TCP peer that replays, on a second connection, the HELLO the listener sent
/// on its first (the listener's own pid, the fd and nonce of the first connection's
/// table) is not taken for a process on this host: the listener would have mapped its
/// own table of the first connection as the second's peer table and served the second
/// connection's one-sided accesses by copying within its own memory, checked against
/// entries that the first connection's revocations do not guard (a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_replayed_from_another_tcp_connection_is_not_taken_for_this_host() {
    let listener = RdmaListener::bind(&Address::Tcp("127.0.0.1:0".into()), RdmaConfig::default())
        .await
        .unwrap();
    let uri = listener.local_addr_uri();
    let at = uri.strip_prefix("rdma://").unwrap().to_owned();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let _server = tokio::spawn(async move { server.serve(listener).await });
    let mut first = tokio::net::TcpStream::connect(&at).await.unwrap();
    let first_hello = their_hello(&mut first).await;
    let mut second = tokio::net::TcpStream::connect(&at).await.unwrap();
    their_hello(&mut second).await;
    let mapped = replay(&mut second, &first_hello).await;
    assert!(
        !mapped,
        "the listener mapped its table of another connection as this one's peer table"
    );
    drop(second);
    echo(&uri, "still serving").await;
}

/// A peer that announces a rendezvous frame and never answers the reads of it: the
/// receiver would keep the frame's buffer for the connection's life; the connection
/// fails once the reads go unanswered for `one_sided_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_rendezvous_frame_left_unanswered_end_the_connection() {
    let path = socket_path("unanswered");
    let config = RdmaConfig {
        one_sided_timeout: Duration::from_secs(1),
        ..RdmaConfig::default()
    };
    let mut listener = RdmaListener::bind(&Address::Unix(path.clone()), config)
        .await
        .unwrap();
    let link_config = LinkConfig {
        max_frame_len: 1 << 20,
        ..LinkConfig::default()
    };
    let peer = tokio::spawn(async move {
        let mut stream = set_up(&path).await;
        let mut out = link_hello();
        out.extend(send_packet(&rts(16 + 65_536, 16, &[65_536])));
        stream.write_all(&out).await.unwrap();
        // Read everything, answer nothing; count the read requests.
        let mut bytes = Vec::new();
        tokio::time::timeout(GUARD, stream.read_to_end(&mut bytes))
            .await
            .expect("the connection stayed open")
            .ok();
        let mut read_requests = 0;
        let mut at = 0;
        while at + 5 <= bytes.len() {
            let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            read_requests += usize::from(bytes[at + 4] == 4);
            at += 4 + len;
        }
        read_requests
    });
    let mut link = tokio::time::timeout(GUARD, listener.accept(&link_config))
        .await
        .expect("accept hung")
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = match tokio::time::timeout(GUARD, recv(&mut link)).await {
        Ok(Some(Err(err))) => err,
        Ok(other) => panic!("expected an error, got {other:?}"),
        Err(_) => panic!("the link waited for the reads for ever"),
    };
    // The pull fails with the connection: its error says why.
    assert!(
        err.to_string()
            .contains("did not answer a one-sided operation for 1s"),
        "{err}"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    drop(link);
    let read_requests = tokio::time::timeout(GUARD, peer).await.unwrap().unwrap();
    assert!(read_requests > 0, "the frame was never read");
}

/// Each one-sided operation has `one_sided_timeout` of its own: a peer that answers
/// the reads of one rendezvous frame, a chunk now and then, and never those of
/// another, kept the second (and its buffer) for ever, as every answer restarted the
/// connection's one clock (from a review). The connection fails at the second's
/// timeout, though the first is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_left_unanswered_times_out_while_another_is_answered() {
    let path = socket_path("starved");
    let config = RdmaConfig {
        one_sided_timeout: Duration::from_secs(1),
        ..RdmaConfig::default()
    };
    let mut listener = RdmaListener::bind(&Address::Unix(path.clone()), config)
        .await
        .unwrap();
    // A frame that takes 256 chunks, answered one every 200 ms: never whole here.
    const SLOW: u64 = 64 << 20;
    let link_config = LinkConfig {
        max_frame_len: 2 * SLOW as usize,
        ..LinkConfig::default()
    };
    let rts_of = |id: u32, key: u64, len: u64| {
        let mut out = link_header(3, 0, id);
        out.extend_from_slice(&(16 + len).to_be_bytes());
        out.extend_from_slice(&16u16.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&[0; 16]);
        out.extend_from_slice(&key.to_be_bytes());
        out.extend_from_slice(&0x1000u64.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        out
    };
    let peer = tokio::spawn(async move {
        let mut stream = set_up(&path).await;
        let mut out = link_hello();
        out.extend(send_packet(&rts_of(1, 1, SLOW)));
        out.extend(send_packet(&rts_of(2, 2, 65_536)));
        stream.write_all(&out).await.unwrap();
        // Answers the reads of key 1, one every 200 ms; never those of key 2.
        let mut pending = std::collections::VecDeque::new();
        let mut buf = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            let mut chunk = [0u8; 65_536];
            tokio::select! {
                read = stream.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                },
                _ = tick.tick() => {
                    if let Some((id, len)) = pending.pop_front() {
                        let mut answer = Vec::new();
                        answer.extend_from_slice(&((9 + len) as u32 + 1).to_be_bytes());
                        answer.push(5);
                        answer.extend_from_slice(&u64::to_be_bytes(id));
                        answer.push(0);
                        answer.resize(answer.len() + len, 0);
                        if stream.write_all(&answer).await.is_err() {
                            return;
                        }
                    }
                }
            }
            while buf.len() >= 5 {
                let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                if buf.len() < 4 + len {
                    break;
                }
                if buf[4] == 4 {
                    let body = &buf[5..4 + len];
                    let id = u64::from_be_bytes(body[..8].try_into().unwrap());
                    let key = u64::from_be_bytes(body[8..16].try_into().unwrap());
                    let asked = u32::from_be_bytes(body[24..28].try_into().unwrap()) as usize;
                    if key == 1 {
                        pending.push_back((id, asked));
                    }
                }
                buf.drain(..4 + len);
            }
        }
    });
    let mut link = tokio::time::timeout(GUARD, listener.accept(&link_config))
        .await
        .expect("accept hung")
        .unwrap();
    let err = match tokio::time::timeout(GUARD, recv(&mut link)).await {
        Ok(Some(Err(err))) => err,
        Ok(other) => panic!(
            "expected an error, got {:?}",
            other.map(|r| r.map(|frame| frame.len()))
        ),
        Err(_) => panic!("the unanswered read was kept alive by the other's answers"),
    };
    assert!(
        err.to_string()
            .contains("did not answer a one-sided operation for 1s"),
        "{err}"
    );
    drop(link);
    peer.abort();
}

/// A same-host peer that offers a real region table (sealed, with the right magic,
/// nonce and capacity) whose lane it holds odd for ever, and then answers TABLE_ACK
/// "did not map yours" (or says it did, without the proof that it can read our
/// memory): it makes no cross-memory copy of ours, so its lane guards
/// nothing of ours and must not hold our memory. Kept, its table had every region we
/// deregistered wait in quarantine while it lived, then leak with the connection (a
/// review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The forged table is made with memfd_create, mmap and fcntl, as a peer would.
#[allow(unsafe_code)]
async fn a_peer_that_did_not_map_our_table_cannot_pin_our_memory_with_its_lane() {
    use rpc_transport_rdma::{provider::Endpoint, soft::SoftListener};
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };
    let path = socket_path("odd-lane");
    let mut listener = SoftListener::bind(&Address::Unix(path.clone()), RdmaConfig::default())
        .await
        .unwrap();
    // The forged table: magic, nonce, capacity 4, lane (byte 64) odd, sealed against
    // shrinking, in a memfd of this process (the peer's pid is ours, as SO_PEERCRED
    // will say).
    let nonce = 0x1234_5678u64;
    let fd = unsafe { libc::memfd_create(c"odd-lane".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    let len = 128 + 32 * 4;
    assert_eq!(unsafe { libc::ftruncate(fd, len as i64) }, 0);
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    } as *mut u64;
    assert_ne!(map as *mut libc::c_void, libc::MAP_FAILED);
    unsafe {
        *map = u64::from_be_bytes(*b"RPCRDMA1");
        *map.add(1) = nonce;
        *map.add(2) = 4;
        *map.add(8) = 1;
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
    }
    // TABLE_ACK "did not map yours"; "mapped" without the proof that it read our
    // memory; "mapped" with a wrong proof (from a review: a peer that only said
    // "mapped" made us keep every region we deregistered, past the connection).
    let acks: [Vec<u8>; 3] = [vec![0], vec![1], [vec![1], vec![0xa5; 16]].concat()];
    for ack in acks {
        let peer = tokio::spawn({
            let path = path.clone();
            let ack = ack.clone();
            async move {
                let mut stream = UnixStream::connect(&path).await.unwrap();
                let theirs = their_hello(&mut stream).await;
                // Their HELLO's body, made ours: same host (boot id, pid namespace), our pid,
                // our table.
                let mut body = theirs[5..].to_vec();
                body[12..16].copy_from_slice(&(std::process::id() as i32).to_be_bytes());
                body[40..44].copy_from_slice(&fd.to_be_bytes());
                body[44..48].copy_from_slice(&4u32.to_be_bytes());
                body[48..56].copy_from_slice(&nonce.to_be_bytes());
                let mut out = packet(1, &body);
                out.extend(packet(2, &ack));
                stream.write_all(&out).await.unwrap();
                stream // alive and connected
            }
        });
        let endpoint = tokio::time::timeout(GUARD, listener.accept())
            .await
            .expect("setup hung")
            .unwrap();
        let _peer = peer.await.unwrap();
        assert!(!endpoint.uses_cross_memory_attach());
        struct Owner(Vec<u8>, Arc<AtomicBool>);
        impl AsRef<[u8]> for Owner {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Owner {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst)
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let region = endpoint
            .expose(Bytes::from_owner(Owner(vec![0; 1 << 20], freed.clone())))
            .unwrap();
        drop(region);
        assert_eq!(
            endpoint.stats().quarantined.load(Ordering::Relaxed),
            0,
            "{ack:?}: a peer that did not map our table, or did not prove it, holds our memory \
             with its lane"
        );
        assert!(
            freed.load(Ordering::SeqCst),
            "{ack:?}: the exposed bytes are still held"
        );
    }
    unsafe { libc::munmap(map.cast(), len) };
}

/// A side that did not announce BATCH (`batch_frames: false`) says so in its HELLO
/// and refuses one: a peer may pack frames only for a side that takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_to_a_side_that_did_not_announce_it_is_refused() {
    let path = socket_path("unannounced-batch");
    let unbatched = RdmaConfig {
        batch_frames: false,
        ..RdmaConfig::default()
    };
    let mut listener = RdmaListener::bind(&Address::Unix(path.clone()), unbatched)
        .await
        .unwrap();
    let config = LinkConfig {
        max_frame_len: MAX_FRAME,
        ..LinkConfig::default()
    };
    let peer = tokio::spawn({
        let path = path.clone();
        async move {
            let mut setup = soft_hello();
            setup.extend(table_ack());
            let mut stream = raw(&path, &setup).await;
            let mut theirs = [0u8; 77 + 6 + 29];
            tokio::time::timeout(GUARD, stream.read_exact(&mut theirs))
                .await
                .expect("setup hung")
                .unwrap();
            assert_eq!(theirs[83 + 5], 1, "a link HELLO");
            assert_eq!(theirs[83 + 5 + 9], 0, "that does not accept BATCH");
            let bad = [link_hello(), send_packet(&batch(&[(3, 3), (4, 4)]))].concat();
            stream.write_all(&bad).await.unwrap();
            until_closed(&mut stream).await;
        }
    });
    let mut link = tokio::time::timeout(GUARD, listener.accept(&config))
        .await
        .expect("accept hung")
        .unwrap();
    let err = match recv(&mut link).await {
        Some(Err(err)) => err,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("did not announce"), "{err}");
    drop(link);
    tokio::time::timeout(GUARD, peer).await.unwrap().unwrap();
}

/// An `rdma://` client at the port of another protocol (a `tcp://` listener answers
/// the soft HELLO with a frame of its own wire, an HTTP server with text) is told
/// the peer does not speak the soft provider's protocol, as an error of another
/// protocol (its calls unprocessed), not "HELLO packet of 57 bytes, expected at
/// least 64" (from a review).
#[tokio::test]
async fn an_rdma_client_at_a_port_of_another_protocol_is_told_so() {
    // A frame of the framework's own wire (a GOAWAY-sized frame of kind 1), and HTTP/1.
    let mut frame = vec![0, 0, 0, 57, 1];
    frame.resize(4 + 57, 0);
    let http = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".to_vec();
    // And one that says nothing and closes, as this framework's tcp:// listener does
    // when it reads the soft HELLO.
    for (answer, says) in [
        (frame, "does not speak the soft RDMA provider's protocol"),
        (http, "does not speak the soft RDMA provider's protocol"),
        (Vec::new(), "is it a listener of another scheme"),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = stream.read(&mut buf).await;
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
        });
        let connector = RdmaConnector::from_uri(&format!("rdma://{addr}")).unwrap();
        let err = tokio::time::timeout(
            GUARD,
            rpc_core::client::Channel::builder().connect(connector),
        )
        .await
        .expect("the connect hung")
        .expect_err("connected to a server of another protocol");
        let text = err.to_string();
        assert!(text.contains(says), "{text}");
        assert!(
            err.is_another_protocol() || answer_was_empty(&text),
            "{text}"
        );
        server.abort();
    }
}

/// A request over the server's frame limit is refused with a GOAWAY
/// (`FRAME_TOO_LARGE`) that reaches the client, whose call then fails unprocessed,
/// eager or by rendezvous, as over TCP (from a review: the link ended at once, the
/// GOAWAY the server logged was never written, and the client was told "closed by
/// the server", its call perhaps run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_servers_limit_gets_its_goaway() {
    let address = Address::Unix(socket_path("too-large"));
    let (uri, task) = echo_server_at(&address, RdmaConfig::default(), MAX_FRAME).await;
    // 6 KiB goes eager (a default receive buffer is 8 KiB), 64 KiB by rendezvous.
    for size in [6 * 1024, 64 * 1024] {
        let channel = rpc_core::client::Channel::builder()
            .connect(RdmaConnector::from_uri(&uri).unwrap())
            .await
            .unwrap();
        let status = tokio::time::timeout(
            GUARD,
            EchoClient::new(channel).say(Request::new(SayRequest {
                message: "big".into(),
                payload: Bytes::from(vec![7u8; size]),
            })),
        )
        .await
        .expect("the call hung")
        .unwrap_err();
        assert!(
            status.message().contains("FRAME_TOO_LARGE"),
            "{size}: {status}"
        );
        assert!(status.is_unprocessed(), "{size}: {status}");
    }
    echo(&uri, "still serving").await;
    task.abort();
}

/// Over `rdma+unix://` the peer's user is its source, as an address is over TCP:
/// past 64 connections in setup from one user, a new one is closed at once, so one
/// local user cannot hold every setup slot of the listener (from a review: Unix
/// peers were not counted, and 300 silent connections kept other users' clients
/// out until their timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_user_has_its_share_of_setups() {
    let (path, _uri, task) = echo_server("per-user").await;
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(UnixStream::connect(&path).await.unwrap());
    }
    // The first 8 run their setup (the listener's HELLO comes); the rest wait their
    // turn.
    let first = &mut silent[0];
    tokio::time::timeout(GUARD, their_hello(first))
        .await
        .expect("the first connection was not set up");
    // One more from the same user is closed at once, well within the setups'
    // timeout (10 s): its setup never starts, no HELLO, the end.
    let mut over = UnixStream::connect(&path).await.unwrap();
    let mut buf = [0u8; 128];
    let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut buf))
        .await
        .expect("the connection over the share was kept waiting");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    drop(silent);
    task.abort();
}

/// Over TCP the listener's HELLO tells nothing of its process: no pid, host
/// identity, table or nonce (from a review: every TCP peer was told them, and none
/// over TCP uses them: such peers are served through the responder).
#[tokio::test]
async fn a_tcp_peer_is_told_nothing_of_the_listeners_process() {
    let (uri, task) = echo_server_tcp(RdmaConfig::default()).await;
    let mut stream = tokio::net::TcpStream::connect(uri.trim_start_matches("rdma://"))
        .await
        .unwrap();
    let hello = tokio::time::timeout(GUARD, their_hello(&mut stream))
        .await
        .expect("no HELLO");
    // length 4, type 1, magic 8, version 1, zeros 3: then pid 4, boot id 16, pid
    // namespace 8, table fd 4, capacity 4, nonce 8.
    let body = &hello[5..];
    assert_eq!(&body[12..16], &[0; 4], "pid");
    assert_eq!(&body[16..32], &[0; 16], "boot id");
    assert_eq!(&body[32..40], &[0; 8], "pid namespace");
    assert_eq!(&body[40..44], &(-1i32).to_be_bytes(), "table fd");
    assert_eq!(&body[48..56], &[0; 8], "table nonce");
    // And TCP clients are served.
    echo(&uri, "served over tcp").await;
    task.abort();
}

/// Whether `text` is the error of a listener that closed without a word (a close is
/// no other protocol's mark: its calls are unprocessed as a failed connect's).
fn answer_was_empty(text: &str) -> bool {
    text.contains("during setup")
}
