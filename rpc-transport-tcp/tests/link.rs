//! The length-prefixed link under partial reads and writes, coalesced frames, oversized
//! lengths and a peer that disappears mid-frame. Real TCP sockets on loopback where the
//! kernel matters; an in-memory duplex where a tiny pipe forces partial writes.

use std::{future::poll_fn, time::Duration};

use bytes::{BufMut, Bytes, BytesMut};
use rpc_core::{link::Link, ErrorKind};
use rpc_transport_tcp::StreamLink;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const MAX: usize = 1 << 20;

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let a = a.unwrap();
    a.set_nodelay(true).unwrap();
    (a, b.unwrap().0)
}

fn prefixed(frame: &[u8]) -> Vec<u8> {
    let mut v = (frame.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(frame);
    v
}

async fn recv<L: Link>(link: &mut L) -> Option<Result<Bytes, rpc_core::Error>> {
    tokio::time::timeout(Duration::from_secs(10), poll_fn(|cx| link.poll_recv(cx)))
        .await
        .expect("recv hung")
}

async fn send<L: Link>(link: &mut L, header: &[u8], payload: Bytes) {
    poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
    link.start_send(header, payload.into()).unwrap();
}

async fn flush<L: Link>(link: &mut L) {
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
}

#[tokio::test]
async fn frames_dribbled_one_byte_at_a_time_arrive_whole() {
    let (mut raw, server) = tcp_pair().await;
    let mut link = StreamLink::new(server, "test".into(), MAX);
    let frames: Vec<Vec<u8>> = vec![b"hello".to_vec(), vec![], vec![7u8; 3000], b"x".to_vec()];
    let writer = tokio::spawn({
        let frames = frames.clone();
        async move {
            for frame in &frames {
                for byte in prefixed(frame) {
                    raw.write_all(&[byte]).await.unwrap();
                    raw.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
            raw
        }
    });
    for frame in &frames {
        let got = recv(&mut link).await.expect("frame").expect("ok");
        assert_eq!(&got[..], &frame[..]);
    }
    drop(writer.await.unwrap());
    assert!(recv(&mut link).await.is_none(), "clean EOF between frames");
}

#[tokio::test]
async fn many_frames_coalesced_into_one_write() {
    let (mut raw, server) = tcp_pair().await;
    let mut link = StreamLink::new(server, "test".into(), MAX);
    let mut all = Vec::new();
    for i in 0..500u32 {
        all.extend_from_slice(&prefixed(&i.to_be_bytes()));
    }
    raw.write_all(&all).await.unwrap();
    for i in 0..500u32 {
        let got = recv(&mut link).await.unwrap().unwrap();
        assert_eq!(&got[..], &i.to_be_bytes());
    }
}

#[tokio::test]
async fn writes_through_a_tiny_pipe_survive_partial_writes() {
    // A 7-byte pipe: every write the link makes is partial.
    let (a, b) = tokio::io::duplex(7);
    let mut tx = StreamLink::new(a, "a".into(), MAX);
    let mut rx = StreamLink::new(b, "b".into(), MAX);
    let big = Bytes::from((0..100_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let sender = tokio::spawn(async move {
        for i in 0..20u8 {
            send(&mut tx, &[i; 3], Bytes::from(vec![i; i as usize])).await;
        }
        send(&mut tx, b"big", big.clone()).await;
        send(&mut tx, b"after", Bytes::new()).await;
        flush(&mut tx).await;
        (tx, big)
    });
    for i in 0..20u8 {
        let got = recv(&mut rx).await.unwrap().unwrap();
        let mut want = vec![i; 3];
        want.extend(vec![i; i as usize]);
        assert_eq!(&got[..], &want[..]);
    }
    let got = recv(&mut rx).await.unwrap().unwrap();
    let after = recv(&mut rx).await.unwrap().unwrap();
    let (_tx, big) = sender.await.unwrap();
    assert_eq!(&got[..3], b"big");
    assert_eq!(
        &got[3..],
        &big[..],
        "large payload, sent without a copy, arrives intact"
    );
    assert_eq!(&after[..], b"after");
}

#[tokio::test]
async fn oversized_length_is_refused_before_the_body_arrives() {
    let (mut raw, server) = tcp_pair().await;
    let mut link = StreamLink::new(server, "test".into(), 1024);
    // Only the 4-byte prefix is sent: the link must not wait for (or allocate) the body.
    raw.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let err = recv(&mut link).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FrameTooLarge);
    let text = err.to_string();
    assert!(
        text.contains("4294967295") && text.contains("1024"),
        "{text}"
    );
    assert!(
        text.contains("max_frame_len"),
        "says how to raise it: {text}"
    );
}

#[tokio::test]
async fn eof_in_the_middle_of_a_frame_is_an_error_not_a_hang() {
    let (mut raw, server) = tcp_pair().await;
    let mut link = StreamLink::new(server, "test".into(), MAX);
    let mut partial = BytesMut::new();
    partial.put_u32(100);
    partial.put_slice(&[1; 10]);
    raw.write_all(&partial).await.unwrap();
    drop(raw);
    let err = recv(&mut link).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert!(err.to_string().contains("middle of a frame"), "{err}");
}

#[tokio::test]
async fn eof_inside_the_length_prefix_is_an_error_too() {
    let (mut raw, server) = tcp_pair().await;
    let mut link = StreamLink::new(server, "test".into(), MAX);
    raw.write_all(&[0, 0]).await.unwrap();
    drop(raw);
    assert_eq!(
        recv(&mut link).await.unwrap().unwrap_err().kind(),
        ErrorKind::Closed
    );
}

#[tokio::test]
async fn sent_frames_carry_a_big_endian_length_prefix() {
    let (client, mut raw) = tcp_pair().await;
    let mut link = StreamLink::new(client, "test".into(), MAX);
    send(&mut link, b"ab", Bytes::from_static(b"cd")).await;
    send(&mut link, b"", Bytes::new()).await;
    flush(&mut link).await;
    let mut buf = [0u8; 12];
    raw.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf, [0, 0, 0, 4, b'a', b'b', b'c', b'd', 0, 0, 0, 0]);
}

#[tokio::test]
async fn segmented_payloads_arrive_as_one_frame() {
    let (a, b) = tokio::io::duplex(1024);
    let mut tx = StreamLink::new(a, "a".into(), MAX);
    let mut rx = StreamLink::new(b, "b".into(), MAX);
    let big = Bytes::from(vec![3u8; 100_000]);
    let mut payload = rpc_core::Payload::from(Bytes::from_static(b"head"));
    payload.push(big.clone());
    payload.push(Bytes::from_static(b"tail"));
    let sender = tokio::spawn(async move {
        poll_fn(|cx| tx.poll_ready(cx)).await.unwrap();
        tx.start_send(b"hdr", payload).unwrap();
        flush(&mut tx).await;
        tx
    });
    let got = recv(&mut rx).await.unwrap().unwrap();
    let _tx = sender.await.unwrap();
    assert_eq!(got.len(), 3 + 4 + big.len() + 4);
    assert_eq!(&got[..7], b"hdrhead");
    assert_eq!(&got[7..7 + big.len()], &big[..]);
    assert_eq!(&got[7 + big.len()..], b"tail");
}

/// Another protocol at the start of a connection is named, with what to do, instead of
/// a frame too large or a close mid-frame.
#[tokio::test]
async fn other_protocols_are_named() {
    // Lengths too large keep their kind, so a server still answers them with GOAWAY
    // FRAME_TOO_LARGE, whose reason says what the peer is.
    let cases: [(&[u8], bool, &str, ErrorKind); 4] = [
        // A gRPC client (HTTP/2's preface) at a tcp:// server.
        (
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            false,
            "grpc://",
            ErrorKind::FrameTooLarge,
        ),
        // curl at a tcp:// server.
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            false,
            "HTTP/1",
            ErrorKind::FrameTooLarge,
        ),
        // An HTTP/1 server answering a tcp:// client.
        (
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
            true,
            "HTTP/1",
            ErrorKind::FrameTooLarge,
        ),
        // A gRPC server answering a tcp:// client: its SETTINGS frame, then it closes.
        (
            &[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100],
            true,
            "grpc://",
            ErrorKind::Closed,
        ),
    ];
    for (bytes, close, hint, kind) in cases {
        let (mut raw, server) = tcp_pair().await;
        let mut link = StreamLink::new(server, "peer".into(), MAX);
        raw.write_all(bytes).await.unwrap();
        if close {
            drop(raw);
        }
        let err = recv(&mut link).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        assert!(err.to_string().contains(hint), "{hint}: {err}");
    }
}

/// The server's connection asks a link it stopped reading whether its peer went: a
/// live peer is not, a closed one is, and the frames read ahead to see it are still
/// there to take.
#[tokio::test]
async fn a_peer_gone_is_seen_without_taking_its_frames() {
    let (mut raw, server) = tcp_pair().await;
    let mut link = StreamLink::new(server, "test".into(), MAX);
    raw.write_all(&prefixed(b"one")).await.unwrap();
    raw.write_all(&prefixed(b"two")).await.unwrap();
    let alive =
        tokio::time::timeout(Duration::from_millis(200), poll_fn(|cx| link.poll_gone(cx))).await;
    assert!(alive.is_err(), "a live peer is not gone");
    drop(raw);
    let gone = tokio::time::timeout(Duration::from_secs(60), poll_fn(|cx| link.poll_gone(cx)))
        .await
        .expect("the end went unseen");
    assert_eq!(gone.kind(), ErrorKind::Closed, "{gone}");
    assert_eq!(&recv(&mut link).await.unwrap().unwrap()[..], b"one");
    assert_eq!(&recv(&mut link).await.unwrap().unwrap()[..], b"two");
    assert!(recv(&mut link).await.is_none());
}

/// Past the 64 KiB it reads ahead, a server link still sees its peer close or reset the
/// connection, with the rest of the peer's frames unread in the kernel: it asks the
/// socket (a server stopped at its limits otherwise kept a vanished client's calls
/// until their handlers ended). Over TCP (end of stream, and reset) and a Unix socket;
/// the frames read ahead are still there to take.
#[tokio::test]
async fn a_peer_gone_behind_more_than_is_read_ahead_is_seen() {
    use rpc_core::link::{LinkConfig, Listener};
    use rpc_transport_tcp::{Address, StreamListener};
    use tokio::io::AsyncWrite;

    let body = [7u8; 4096];
    let frame = prefixed(&body);
    // 96 KiB: more than the link reads ahead, and little enough that the rest fits in
    // the kernel's receive buffer (an end sent behind data the receiver has no room
    // for would not arrive at all).
    let frames = 24;
    let config = LinkConfig::default();
    for case in ["tcp end", "tcp reset", "unix end"] {
        let path = std::env::temp_dir().join(format!("rpc-tcp-gone-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let address = match case {
            "unix end" => Address::Unix(path.clone()),
            _ => Address::Tcp("127.0.0.1:0".into()),
        };
        let mut listener = StreamListener::bind(&address).await.unwrap();
        let (mut raw, mut link): (Box<dyn AsyncWrite + Unpin + Send>, _) =
            match listener.address().clone() {
                Address::Tcp(addr) => {
                    let (raw, link) =
                        tokio::join!(TcpStream::connect(addr), listener.accept(&config));
                    let raw = raw.unwrap();
                    if case == "tcp reset" {
                        raw.set_zero_linger().unwrap();
                    }
                    (Box::new(raw), link.unwrap())
                }
                Address::Unix(path) => {
                    let (raw, link) = tokio::join!(
                        tokio::net::UnixStream::connect(path),
                        listener.accept(&config)
                    );
                    (Box::new(raw.unwrap()), link.unwrap())
                }
            };
        let (_, alive) = tokio::join!(
            async {
                for _ in 0..frames {
                    raw.write_all(&frame).await.unwrap();
                }
                raw.flush().await.unwrap();
            },
            tokio::time::timeout(
                Duration::from_millis(1500),
                poll_fn(|cx| link.poll_gone(cx))
            ),
        );
        assert!(alive.is_err(), "{case}: a live peer is not gone");
        let read_ahead = link.receiving();
        assert!(
            read_ahead < (frames * frame.len()) as u64,
            "{case}: the link read all {read_ahead} bytes; the test needs some left unread"
        );
        match case {
            "tcp end" => raw.shutdown().await.unwrap(),
            _ => drop(raw), // a reset (linger 0), or a Unix socket's end
        }
        let gone = tokio::time::timeout(Duration::from_secs(30), poll_fn(|cx| link.poll_gone(cx)))
            .await
            .unwrap_or_else(|_| panic!("{case}: the end went unseen"));
        assert_eq!(gone.kind(), ErrorKind::Closed, "{case}: {gone}");
        assert_eq!(
            &recv(&mut link).await.unwrap().unwrap()[..],
            &body[..],
            "{case}"
        );
        drop(listener);
    }
}

/// A second listener on the path of a live one is refused (address in use), as on a busy
/// TCP port: it took the socket over, and the first server, left with no socket file,
/// served nobody (an operator's round: a second instance, or one that then failed to
/// start and removed the path). A socket file nobody listens on is replaced.
#[tokio::test]
async fn a_unix_socket_a_server_listens_on_is_not_taken_over() {
    use rpc_transport_tcp::{Address, StreamListener};
    let path = std::env::temp_dir().join(format!("rpc-tcp-taken-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let address = Address::Unix(path.clone());
    let first = StreamListener::bind(&address).await.unwrap();
    let err = StreamListener::bind(&address).await.unwrap_err();
    assert!(err.to_string().contains("another server listens"), "{err}");
    // The first still has its socket.
    let client = tokio::net::UnixStream::connect(&path);
    let (client, accepted) = tokio::join!(client, first.accept_stream());
    client.unwrap();
    accepted.unwrap();
    // Left behind by a server that is gone: replaced.
    drop(first);
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale);
    assert!(path.exists(), "a stale socket file for the test");
    let again = StreamListener::bind(&address).await.unwrap();
    drop(again);
    assert!(!path.exists(), "the listener removes its own file");
    // A file that is not a socket: left alone, and the error says what is in the way
    // ("address in use" read as another server running there).
    std::fs::write(&path, "not a socket").unwrap();
    let err = StreamListener::bind(&address).await.unwrap_err();
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    let _ = std::fs::remove_file(&path);
}

/// The same over TLS: past what the server link reads ahead (and what its TLS stream
/// holds of records), a client's reset is seen with its frames unread.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_tls_peer_reset_behind_more_than_is_read_ahead_is_seen() {
    use rpc_core::link::{Connector, LinkConfig, Listener};
    use rpc_transport_tcp::{
        tls::{ClientTls, ServerTls, TlsConnector, TlsListener},
        Stream,
    };

    let cert = |name: &str| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/tls")
            .join(name)
    };
    let server_tls = ServerTls::builder()
        .cert_files(cert("server.pem"), cert("server.key"))
        .build()
        .unwrap();
    let client_tls = ClientTls::builder()
        .system_roots(false)
        .ca_file(cert("ca.pem"))
        .build()
        .unwrap();
    let config = LinkConfig::default();
    let mut listener = TlsListener::bind("tls://127.0.0.1:0", server_tls)
        .await
        .unwrap();
    let connector = TlsConnector::new(&listener.local_addr_uri(), client_tls).unwrap();
    let (client, server) = tokio::join!(connector.connect(&config), listener.accept(&config));
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    // 128 KiB of frames: more than the server's link reads ahead (64 KiB), its TLS
    // stream holding what it read of the records beyond that.
    let frames = 32;
    let body = Bytes::from(vec![7u8; 4096]);
    let (_, alive) = tokio::join!(
        async {
            for _ in 0..frames {
                send(&mut client, b"", body.clone()).await;
            }
            flush(&mut client).await;
        },
        tokio::time::timeout(
            Duration::from_millis(1500),
            poll_fn(|cx| server.poll_gone(cx))
        ),
    );
    assert!(alive.is_err(), "a live peer is not gone");
    assert!(
        server.receiving() < (frames * (4 + 4096)) as u64,
        "the link read everything; the test needs some left unread"
    );
    let Stream::Tcp(tcp) = client.get_ref().get_ref() else {
        unreachable!("a tls:// link is over TCP")
    };
    tcp.set_zero_linger().unwrap();
    drop(client);
    let gone = tokio::time::timeout(Duration::from_secs(30), poll_fn(|cx| server.poll_gone(cx)))
        .await
        .expect("the reset went unseen");
    assert_eq!(gone.kind(), ErrorKind::Closed, "{gone}");
}
