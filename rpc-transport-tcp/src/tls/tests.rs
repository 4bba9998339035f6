//! The TLS stream over in-memory pipes: both record protections (TLS 1.3 and 1.2, each
//! cipher), key updates either way, close_notify, handshake failures' alerts.

use std::{path::PathBuf, sync::Arc};

use rustls::{
    client::UnbufferedClientConnection, crypto::ring as provider, pki_types::ServerName,
    server::UnbufferedServerConnection, SupportedCipherSuite, SupportedProtocolVersion,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::{rustls_error, stream::handshake, ServerTls, TlsStream};

fn cert(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tls")
        .join(name)
}

fn server_config(alpn: &[u8]) -> Arc<rustls::ServerConfig> {
    let tls = ServerTls::builder()
        .cert_files(cert("server.pem"), cert("server.key"))
        .build()
        .unwrap();
    let mut config = (*tls.config(super::Protocol::Rpc)).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

fn client_config(
    versions: &[&'static SupportedProtocolVersion],
    suites: Option<Vec<SupportedCipherSuite>>,
    alpn: &[u8],
) -> Arc<rustls::ClientConfig> {
    let mut provider = provider::default_provider();
    if let Some(suites) = suites {
        provider.cipher_suites = suites;
    }
    let (roots, _) = super::root_store(&[super::Pem::file(cert("ca.pem"))]).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    config.enable_secret_extraction = true;
    Arc::new(config)
}

async fn pair(
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
) -> (
    std::io::Result<TlsStream<DuplexStream>>,
    std::io::Result<TlsStream<DuplexStream>>,
) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from("localhost").unwrap();
    let client = handshake(
        UnbufferedClientConnection::new(client, name).unwrap(),
        a,
        false,
    );
    let server = handshake(UnbufferedServerConnection::new(server).unwrap(), b, false);
    let (client, server) = tokio::join!(client, server);
    (client.map(|c| c.0), server.map(|s| s.0))
}

/// Sends `len` patterned bytes each way at once and checks what arrives.
async fn exchange(client: &mut TlsStream<DuplexStream>, server: &mut TlsStream<DuplexStream>) {
    let len = 3 * 1024 * 1024 + 17;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    let c_send = async {
        for chunk in data.chunks(100_000) {
            cw.write_all(chunk).await.unwrap();
        }
        cw.flush().await.unwrap();
    };
    let s_send = async {
        // Small writes too: many records of a few bytes.
        for chunk in data.chunks(70_001) {
            sw.write_all(&chunk[..10]).await.unwrap();
            sw.write_all(&chunk[10..]).await.unwrap();
        }
        sw.flush().await.unwrap();
    };
    let c_recv = async {
        let mut got = vec![0; len];
        cr.read_exact(&mut got).await.unwrap();
        assert!(got == data, "client received other bytes");
    };
    let s_recv = async {
        let mut got = vec![0; len];
        sr.read_exact(&mut got).await.unwrap();
        assert!(got == data, "server received other bytes");
    };
    tokio::join!(c_send, s_send, c_recv, s_recv);
}

async fn round_trip(versions: &[&'static SupportedProtocolVersion], suite: SupportedCipherSuite) {
    let (client, server) = pair(
        client_config(versions, Some(vec![suite]), b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    exchange(&mut client, &mut server).await;
    // A clean close: the reader sees the end of the stream.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
    // The other way still works after a half close.
    server.write_all(b"bye").await.unwrap();
    server.shutdown().await.unwrap();
    let mut bye = Vec::new();
    client.read_to_end(&mut bye).await.unwrap();
    assert_eq!(bye, b"bye");
}

#[tokio::test]
async fn tls13_each_cipher() {
    for suite in [
        provider::cipher_suite::TLS13_AES_128_GCM_SHA256,
        provider::cipher_suite::TLS13_AES_256_GCM_SHA384,
        provider::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ] {
        round_trip(&[&rustls::version::TLS13], suite).await;
    }
}

#[tokio::test]
async fn tls12_each_cipher() {
    for suite in [
        provider::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        provider::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        provider::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ] {
        round_trip(&[&rustls::version::TLS12], suite).await;
    }
}

#[tokio::test]
async fn key_updates_either_way() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    // The client updates its key every few records, as it would at the cipher's
    // confidentiality limit; the server asks for an update, which the client answers.
    client.set_tx_limit(5);
    server.request_key_update().unwrap();
    exchange(&mut client, &mut server).await;
    exchange(&mut client, &mut server).await;
}

/// TLS 1.2 cannot update its key: at the cipher's record limit the stream refuses
/// more data, but its last record is a close_notify, so that the peer reads the data
/// and a clean end, and shutdown finishes (at the limit close_notify could not be
/// sealed either: shutdown failed and sent nothing; from a review).
#[tokio::test]
async fn tls12_at_its_record_limit_still_closes_cleanly() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS12], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    client.set_tx_limit(8);
    let reading = tokio::spawn(async move {
        let mut all = Vec::new();
        server.read_to_end(&mut all).await.map(|_| all)
    });
    let mut written = Vec::new();
    for i in 0..100u8 {
        match client.write_all(&[i; 10]).await {
            Ok(()) => written.extend_from_slice(&[i; 10]),
            Err(_) => break,
        }
        client.flush().await.unwrap();
    }
    assert!(written.len() < 1000, "the limit was never reached");
    client
        .shutdown()
        .await
        .expect("shutdown at the record limit");
    let read = reading
        .await
        .unwrap()
        .expect("a clean end, not a truncation");
    assert_eq!(read, written);
}

#[tokio::test]
async fn a_dropped_peer_is_an_unexpected_eof() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (client, mut server) = (client.unwrap(), server.unwrap());
    drop(client);
    let err = server.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
}

/// Every read after a failure reports the same error, not only the first: the second
/// read after a truncation said InvalidData, "failed earlier", where the first said
/// UnexpectedEof (a review). The peer gone between records, in the middle of one, and
/// a record that fails authentication.
#[tokio::test]
async fn every_read_after_a_failure_reports_the_same_error() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (client, mut server) = (client.unwrap(), server.unwrap());
    drop(client);
    for read in 0..3 {
        let err = server.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::UnexpectedEof,
            "{read}: {err}"
        );
    }
    // A header that promises 40 bytes, 10 of them, and the end.
    let (mut peer, ours) = tokio::io::duplex(1024);
    peer.write_all(&[23, 3, 3, 0, 40]).await.unwrap();
    peer.write_all(&[0; 10]).await.unwrap();
    drop(peer);
    let mut stream = super::fuzzing::handed_over(ours, Vec::new(), 0);
    for read in 0..3 {
        let err = stream.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::UnexpectedEof,
            "{read}: {err}"
        );
    }
    // A whole record that does not open (the peer stays to take the alert).
    let (mut peer, ours) = tokio::io::duplex(1024);
    peer.write_all(&[23, 3, 3, 0, 20]).await.unwrap();
    peer.write_all(&[0; 20]).await.unwrap();
    let mut stream = super::fuzzing::handed_over(ours, Vec::new(), 0);
    for read in 0..3 {
        let err = stream.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{read}: {err}");
        assert_eq!(
            rustls_error(&err),
            Some(&rustls::Error::DecryptError),
            "{read}: {err}"
        );
    }
    drop(peer);
}

#[tokio::test]
async fn a_refused_handshake_tells_the_peer_why() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"h2"),
    )
    .await;
    let client = client.unwrap_err();
    assert_eq!(
        rustls_error(&client),
        Some(&rustls::Error::AlertReceived(
            rustls::AlertDescription::NoApplicationProtocol
        )),
        "{client}"
    );
    let server = server.unwrap_err();
    assert_eq!(
        rustls_error(&server),
        Some(&rustls::Error::NoApplicationProtocol),
        "{server}"
    );
}

/// A TLS 1.3 pair whose client does `then` right after its handshake, before the
/// server has read the client's Finished (the server starts after the client has
/// written it): what the client sends there arrives with its last handshake flight.
/// The client, and the server's handshake.
async fn client_goes_first(
    then: impl AsyncFnOnce(&mut TlsStream<DuplexStream>),
) -> (
    TlsStream<DuplexStream>,
    std::io::Result<TlsStream<DuplexStream>>,
) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from("localhost").unwrap();
    let client_config = client_config(&[&rustls::version::TLS13], None, b"rpc/1");
    let client = async {
        let conn = UnbufferedClientConnection::new(client_config, name).unwrap();
        let (mut client, _) = handshake(conn, a, false).await.unwrap();
        then(&mut client).await;
        client
    };
    let server = async {
        tokio::task::yield_now().await;
        let conn = UnbufferedServerConnection::new(server_config(b"rpc/1")).unwrap();
        handshake(conn, b, false).await.map(|(server, _)| server)
    };
    tokio::join!(client, server)
}

#[tokio::test]
async fn data_right_behind_the_clients_finished_is_kept() {
    let (_client, server) = client_goes_first(async |client| {
        client.write_all(b"first words").await.unwrap();
        client.flush().await.unwrap();
    })
    .await;
    let mut got = [0; 11];
    server.unwrap().read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"first words");
}

#[tokio::test]
async fn close_notify_right_behind_the_clients_finished_keeps_the_data() {
    // Data and close_notify behind the Finished: the connection is made, its data
    // read, and its end is clean.
    let (_client, server) = client_goes_first(async |client| {
        client.write_all(b"last words").await.unwrap();
        client.shutdown().await.unwrap();
    })
    .await;
    let mut server = server.expect("a connection whose peer has already closed it");
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"last words");
}

#[tokio::test]
async fn a_key_update_right_behind_the_clients_finished_is_answered() {
    // A key update that asks for one back, and data: the server's record layer, not
    // rustls, must see the key update, or its answer is lost at the handover.
    let (mut client, server) = client_goes_first(async |client| {
        client.request_key_update().unwrap();
        client.write_all(b"ping").await.unwrap();
        client.flush().await.unwrap();
    })
    .await;
    let mut server = server.unwrap();
    let mut got = [0; 4];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    // The server's answer (its key update, then data under its new key) reads back.
    server.write_all(b"pong").await.unwrap();
    server.flush().await.unwrap();
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"pong");
}

/// Copies `from` to `to`, flipping the last byte of the first chunk read after
/// `corrupt` is set (a record's authentication tag, for a record written alone).
async fn relay(
    mut from: tokio::io::ReadHalf<DuplexStream>,
    mut to: tokio::io::WriteHalf<DuplexStream>,
    corrupt: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if corrupt.swap(false, std::sync::atomic::Ordering::SeqCst) {
            buf[n - 1] ^= 1;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[tokio::test]
async fn a_record_that_fails_authentication_is_answered_with_bad_record_mac() {
    // client <-> (a, b) relay (c, d) <-> server; the relay corrupts on demand.
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (c, d) = tokio::io::duplex(64 * 1024);
    let corrupt = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b_read, b_write) = tokio::io::split(b);
    let (c_read, c_write) = tokio::io::split(c);
    tokio::spawn(relay(b_read, c_write, corrupt.clone()));
    tokio::spawn(relay(c_read, b_write, Arc::new(Default::default())));
    let name = ServerName::try_from("localhost").unwrap();
    let client = handshake(
        UnbufferedClientConnection::new(
            client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
            name,
        )
        .unwrap(),
        a,
        false,
    );
    let server = handshake(
        UnbufferedServerConnection::new(server_config(b"rpc/1")).unwrap(),
        d,
        false,
    );
    let (client, server) = tokio::join!(client, server);
    let (mut client, mut server) = (client.unwrap().0, server.unwrap().0);
    // A record that arrives whole goes through.
    client.write_all(b"first").await.unwrap();
    client.flush().await.unwrap();
    let mut got = [0; 5];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"first");

    corrupt.store(true, std::sync::atomic::Ordering::SeqCst);
    client.write_all(b"second").await.unwrap();
    client.flush().await.unwrap();
    let err = server.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::DecryptError),
        "{err}"
    );
    // The server said why before it stopped writing; the client hears it.
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read(&mut [0; 16]),
    )
    .await
    .expect("the client heard nothing from the server")
    .unwrap_err();
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::AlertReceived(
            rustls::AlertDescription::BadRecordMac
        )),
        "{err}"
    );
    assert_eq!(
        server.write_all(b"more").await.unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
    // The client, told by the server's fatal alert, writes nothing more either (RFC
    // 8446 §6.2: it wrote on, and would have sent a close_notify), and its writer is
    // told the alert too, not "broken pipe" alone (a review: the CLI said only that).
    let err = client.write_all(b"more").await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    assert!(err.to_string().to_lowercase().contains("record"), "{err}");
}

/// A handshake message sent in tiny records is refused once the handshake holds about
/// rustls's own limit, long before its timeout: rustls's unbuffered API keeps every
/// record of a message it is joining, and the handshake held up to 1 MiB of them.
#[tokio::test]
async fn a_handshake_message_in_tiny_records_is_refused_early() {
    let (mut peer, ours) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(handshake(
        UnbufferedServerConnection::new(server_config(b"rpc/1")).unwrap(),
        ours,
        false,
    ));
    // A ClientHello that says it is 65,535 bytes long, then its body a byte a record
    // (6 bytes each: 320 KB of records for 53,000 bytes of message).
    let mut records = vec![0x16, 3, 1, 0, 4, 1, 0, 0xff, 0xff];
    for _ in 0..53_000 {
        records.extend_from_slice(&[0x16, 3, 1, 0, 1, 0]);
    }
    // Written from a task of its own: the server may stop reading at any point.
    tokio::spawn(async move {
        let _ = peer.write_all(&records).await;
        // Held open: the handshake must not end for want of bytes.
        std::future::pending::<()>().await;
        drop(peer);
    });
    let refused = tokio::time::timeout(std::time::Duration::from_secs(5), server)
        .await
        .expect("the handshake kept buffering the records")
        .unwrap();
    let err = refused.map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");
}

/// The record layer does not keep a receive buffer that the handshake grew: it starts
/// at the size of a record, as after a small handshake, with what was read ahead.
#[test]
fn the_handshakes_large_buffer_is_not_kept() {
    let mut grown = vec![0; 102 * 1024];
    grown[..100].fill(7);
    let stream = super::fuzzing::handed_over((), grown, 100);
    assert_eq!(stream.buffered(), (18 * 1024, 0));
    assert_eq!(stream.capacities().0, 18 * 1024, "the memory is kept");
    // Read ahead past a record's size: kept whole, nothing more.
    let stream = super::fuzzing::handed_over((), vec![1; 102 * 1024], 40_000);
    assert_eq!(stream.buffered(), (40_000, 0));
    assert_eq!(stream.capacities().0, 40_000, "the memory is kept");
}

/// Buffers grown for a burst (1 MiB one way) go back to their small sizes once the
/// socket has nothing to read: a connection idle after one large call held 256 KiB
/// each way for as long as it stayed open (a review: 527 KiB per idle connection
/// after a 200 KB call).
#[tokio::test]
async fn buffers_grown_for_a_burst_are_let_go_when_the_socket_is_idle() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    let data = vec![7u8; 1 << 20];
    let send = async {
        client.write_all(&data).await.unwrap();
        client.flush().await.unwrap();
    };
    let receive = async {
        let mut got = vec![0; 1 << 20];
        server.read_exact(&mut got).await.unwrap();
        assert!(got == data);
    };
    tokio::join!(send, receive);
    // Grown: the receiver's to take many records a read, the sender's to seal 256 KiB
    // ahead of the socket.
    assert_eq!(server.capacities().0, super::stream::RX_LARGE);
    assert!(
        client.capacities().1 > 64 * 1024,
        "{:?}",
        client.capacities()
    );
    // A read that finds nothing on either side.
    let mut byte = [0u8; 1];
    for stream in [&mut server, &mut client] {
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), stream.read(&mut byte))
                .await;
        assert!(waited.is_err(), "nothing was sent");
    }
    assert_eq!(server.capacities().0, 18 * 1024);
    assert!(
        client.capacities().1 <= 64 * 1024,
        "{:?}",
        client.capacities()
    );
    // And they serve on: a small exchange, then a large one again.
    client.write_all(b"again").await.unwrap();
    client.flush().await.unwrap();
    let mut again = [0u8; 5];
    server.read_exact(&mut again).await.unwrap();
    assert_eq!(&again, b"again");
    exchange(&mut client, &mut server).await;
}

/// A read in one task that writes out what a writer in another task left unsent (the
/// stream split in two) does not strand that writer: it took the socket's one write
/// waker, and the writer, parked on a full socket, was never woken again (a review).
#[tokio::test(flavor = "current_thread")]
async fn a_read_that_writes_out_does_not_strand_a_waiting_writer() {
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (mut client, server) = (client.unwrap(), server.unwrap());
    let (mut reader, mut writer) = tokio::io::split(server);
    let len = 1 << 20;
    let writing = tokio::spawn(async move {
        writer.write_all(&vec![7; len]).await.unwrap();
        writer.flush().await.unwrap();
    });
    // The writer fills the 64 KiB pipe and waits for room.
    tokio::task::yield_now().await;
    let reading = tokio::spawn(async move {
        let mut buf = [0; 64];
        reader.read(&mut buf).await.unwrap()
    });
    tokio::task::yield_now().await;
    client.write_all(b"x").await.unwrap();
    client.flush().await.unwrap();
    assert_eq!(reading.await.unwrap(), 1);
    // The reader is gone; the client reads what the writer writes.
    let mut got = vec![0; len];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_exact(&mut got),
    )
    .await
    .expect("the writer was never woken to write the rest")
    .unwrap();
    assert!(got.iter().all(|&b| b == 7));
    writing.await.unwrap();
}

/// With `dangerous_accept_any_certificate` nobody checked the server's certificate: its
/// names are not reported as the server's identity (they were, as verified ones).
#[tokio::test]
async fn an_unchecked_certificate_is_no_identity() {
    let tls = super::ClientTls::builder()
        .system_roots(false)
        .dangerous_accept_any_certificate(true)
        .build()
        .unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let server = handshake(
        UnbufferedServerConnection::new(server_config(b"rpc/1")).unwrap(),
        b,
        false,
    );
    let client = tls.handshake(a, "localhost", super::Protocol::Rpc, "tls://localhost:1");
    let (client, server) = tokio::join!(client, server);
    server.unwrap();
    let (_, identity) = client.unwrap();
    assert!(!identity.authenticated());
    assert!(identity.dns_names.is_empty(), "{:?}", identity.dns_names);
    assert_eq!(identity.alpn.as_deref(), Some("rpc/1"));
}

/// One task that polls both halves (as the framework's connection drivers do: flush,
/// then read, with one waker) is not woken by its own read while the socket is full:
/// the read's wake of the parked writer, meant for another task, rescheduled it at once,
/// for as long as the peer did not read (a review of the change above).
#[tokio::test]
async fn a_task_polling_both_halves_does_not_wake_itself() {
    use std::{
        pin::Pin,
        sync::atomic::{AtomicUsize, Ordering},
        task::{Context, Poll, Wake, Waker},
    };
    use tokio::io::{AsyncRead, AsyncWrite};
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let (client, server) = pair(
        client_config(&[&rustls::version::TLS13], None, b"rpc/1"),
        server_config(b"rpc/1"),
    )
    .await;
    let (_client, mut server) = (client.unwrap(), server.unwrap());
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    // More than the 64 KiB pipe takes, and the client reads nothing.
    let data = vec![7u8; 256 * 1024];
    let mut written = 0;
    while written < data.len() {
        match Pin::new(&mut server).poll_write(&mut cx, &data[written..]) {
            Poll::Ready(Ok(n)) => written += n,
            other => panic!("{other:?}"),
        }
    }
    assert!(Pin::new(&mut server).poll_flush(&mut cx).is_pending());
    let mut buf = [0u8; 16];
    let mut read = tokio::io::ReadBuf::new(&mut buf);
    assert!(Pin::new(&mut server)
        .poll_read(&mut cx, &mut read)
        .is_pending());
    assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task woke itself");
}

/// A leaf certificate given as a CA to trust is refused, on both sides: its key could
/// sign certificates of any identity, and the leaf itself would not be taken (from a
/// review: `--tls-client-ca client.pem`, meant to pin it, let its key mint an admin
/// identity; `--ca server.pem` likewise for servers).
#[test]
fn leaf_certificates_are_refused_as_cas() {
    let server = ServerTls::builder()
        .cert_files(cert("server.pem"), cert("server.key"))
        .client_ca_file(cert("client.pem"))
        .build()
        .unwrap_err();
    assert!(server.to_string().contains("not a CA's"), "{server}");
    let client = super::ClientTls::builder()
        .system_roots(false)
        .ca_file(cert("server.pem"))
        .build()
        .unwrap_err();
    assert!(client.to_string().contains("CA:FALSE"), "{client}");
    // A CA is taken.
    super::ClientTls::builder()
        .system_roots(false)
        .ca_file(cert("ca.pem"))
        .build()
        .unwrap();
}

/// The `Debug` of TLS settings given as PEM bytes shows no byte of the key (they derived
/// `Debug`, which printed the key's bytes as a list of numbers).
#[test]
fn debug_output_shows_no_private_key() {
    let cert_pem = std::fs::read(cert("server.pem")).unwrap();
    let key_pem = std::fs::read(cert("server.key")).unwrap();
    let key_text = String::from_utf8(key_pem.clone()).unwrap();
    // A line of the key's base64 body, and its first bytes as numbers.
    let body_line = key_text.lines().nth(1).unwrap().to_owned();
    let as_numbers = format!(
        "{}, {}, {}, {}",
        key_pem[0], key_pem[1], key_pem[2], key_pem[3]
    );
    let builder = ServerTls::builder().cert_pem(&cert_pem, &key_pem);
    let client = super::ClientTls::builder().identity_pem(&cert_pem, &key_pem);
    let shown = [
        format!("{builder:?}"),
        format!("{:?}", builder.clone().build().unwrap()),
        format!("{client:?}"),
    ];
    for text in &shown {
        assert!(
            !text.contains(&body_line) && !text.contains(&as_numbers),
            "{text}"
        );
    }
}

/// Handshakes a rustls client of `client` with a server of `server` in memory, then
/// lets the client read what the server sent after (its session tickets): how the
/// handshake went, as the client saw it, and the version the server's identity of the
/// client gives.
fn handshake_kind_in_memory(
    client: &Arc<rustls::ClientConfig>,
    server: &Arc<rustls::ServerConfig>,
) -> (rustls::HandshakeKind, String) {
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = rustls::ClientConnection::new(client.clone(), name).unwrap();
    let mut s = rustls::ServerConnection::new(server.clone()).unwrap();
    let mut buf = Vec::new();
    for _ in 0..20 {
        buf.clear();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets().unwrap();
        }
        buf.clear();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            c.read_tls(&mut &buf[..]).unwrap();
            c.process_new_packets().unwrap();
        }
        if !c.is_handshaking() && !s.is_handshaking() && !s.wants_write() && !c.wants_write() {
            break;
        }
    }
    assert!(!c.is_handshaking() && !s.is_handshaking(), "no handshake");
    (c.handshake_kind().unwrap(), super::identity(&s).version)
}

/// With client certificates required a client cannot resume a session: each
/// connection verifies a certificate (a resumed session kept the identity of a
/// certificate that had expired or been replaced since; from a review). Without them,
/// sessions resume as before. The identity's version reads "TLSv1.3".
#[test]
fn with_client_certificates_every_connection_is_a_full_handshake() {
    let client_auth = |with_cert: bool| {
        let (roots, _) = super::root_store(&[super::Pem::file(cert("ca.pem"))]).unwrap();
        let builder =
            rustls::ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        let mut config = if with_cert {
            let chain = super::certificates(&super::Pem::file(cert("client.pem"))).unwrap();
            let key = super::private_key(&super::Pem::file(cert("client.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = vec![b"rpc/1".to_vec()];
        Arc::new(config)
    };
    for (mtls, resumes) in [(false, true), (true, false)] {
        let mut builder = ServerTls::builder().cert_files(cert("server.pem"), cert("server.key"));
        if mtls {
            builder = builder.client_ca_file(cert("ca.pem"));
        }
        let server = builder.build().unwrap().config(super::Protocol::Rpc);
        let client = client_auth(mtls);
        let (first, version) = handshake_kind_in_memory(&client, &server);
        assert_eq!(first, rustls::HandshakeKind::Full);
        assert_eq!(version, "TLSv1.3");
        let (second, _) = handshake_kind_in_memory(&client, &server);
        assert_eq!(
            second == rustls::HandshakeKind::Resumed,
            resumes,
            "mTLS {mtls}: the second handshake was {second:?}"
        );
    }
}

/// A server's refusal of a client that had no certificate to send says so, whichever
/// alert the server chose: Go's servers (etcd's) say bad_certificate, which read as
/// "not signed by a CA the server trusts" (from a review). A client that sent one is
/// told its certificate was refused.
#[test]
fn a_refusal_of_a_client_without_a_certificate_asks_for_one() {
    use rustls::AlertDescription as Alert;
    for alert in [
        Alert::BadCertificate,
        Alert::UnknownCA,
        Alert::CertificateUnknown,
    ] {
        let none = super::PeerAlert::new(alert, "server", true).to_string();
        assert!(
            none.contains("requires a client certificate (mTLS)"),
            "{none}"
        );
        let refused = super::PeerAlert::new(alert, "server", false).to_string();
        assert!(
            !refused.contains("requires a client certificate"),
            "{refused}"
        );
    }
    let required = super::PeerAlert::new(Alert::CertificateRequired, "server", false).to_string();
    assert!(
        required.contains("requires a client certificate (mTLS)"),
        "{required}"
    );
}

/// What a peer's alert after the handshake, and a client that went during it, are
/// called (from a review): an alert not described is named once and is no refusal of
/// a handshake that was over; bad_certificate may mean a name mismatch; a server's
/// log does not ask whether its own port is plain text.
#[test]
fn alerts_and_ends_are_described_for_what_they_are() {
    use rustls::AlertDescription as Alert;
    let late = super::PeerAlert::new(Alert::HandshakeFailure, "client", false).to_string();
    assert_eq!(late.matches("HandshakeFailure").count(), 1, "{late}");
    assert!(late.contains("ended the connection"), "{late}");
    let bad = super::PeerAlert::new(Alert::BadCertificate, "client", false).to_string();
    assert!(bad.contains("not valid for the name"), "{bad}");
    assert_eq!(bad.matches("BadCertificate").count(), 1, "{bad}");
    let gone = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
    let client = super::describe(&gone, "tls://127.0.0.1:1", "client", super::Protocol::Rpc);
    assert!(!client.contains("plain-text"), "{client}");
    let server = super::describe(&gone, "tls://127.0.0.1:1", "server", super::Protocol::Rpc);
    assert!(server.contains("plain-text port"), "{server}");
}

/// A truncated key file and a certificate that is no certificate are named in words
/// (from a review: "missing section end marker: [80, 82, 73, ...]", and "invalid peer
/// certificate" for the server's own file).
#[test]
fn unreadable_files_are_named_in_words() {
    let dir = std::env::temp_dir().join(format!("rpc-tls-words-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = std::fs::read_to_string(cert("server.key")).unwrap();
    let cut = dir.join("cut.key");
    std::fs::write(&cut, &key[..key.find("-----END").unwrap()]).unwrap();
    let err = ServerTls::builder()
        .cert_files(cert("server.pem"), &cut)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no line \"-----END PRIVATE KEY-----\" (is the file cut short?)"),
        "{err}"
    );
    assert!(!err.contains("[45, 45"), "{err}");
    // Base64 of bytes that are no DER certificate, in a certificate's armour.
    let junk = dir.join("junk.pem");
    std::fs::write(
        &junk,
        "-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let err = ServerTls::builder()
        .cert_files(&junk, cert("server.key"))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot be read or used") && !err.contains("peer"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
