//! The bulk-transfer API over TCP, Unix and UDP, with the generated `Blob` service: 1 GiB
//! each way with matching checksums, and every misuse of a descriptor refused with a
//! clear status while the connection stays usable.

use std::time::Duration;

use rpc_core::{client::Channel, server::Server, Code, Status};
use rpc_proto::blob::{
    self, blob_client::BlobClient, blob_server::BlobServer, checksum, pattern, BlobService,
    DownloadRequest, UploadRequest,
};

const GIB: usize = 1 << 30;
const TTL: Duration = Duration::from_secs(300);

fn server() -> Server {
    Server::builder()
        .add_service(BlobServer::new(BlobService))
        .build()
}

async fn tcp_or_unix(uri: &str) -> Channel {
    let listener = rpc_transport_tcp::bind(uri).await.unwrap();
    let uri = listener.local_addr_uri();
    let server = server();
    tokio::spawn(async move { server.serve(listener).await });
    rpc_transport_tcp::connect(&uri).await.unwrap()
}

async fn gigabyte_both_ways(channel: Channel, name: &str) {
    both_ways(channel, name, GIB).await
}

/// `len` bytes up (the server pulls them) and down (the server pushes them), checked.
async fn both_ways(channel: Channel, name: &str, len: usize) {
    // Upload: the server pulls `len` bytes from the client's exposed buffer.
    let data = pattern(1, len);
    let expected = checksum(&data);
    let reply = blob::upload(&channel, data, TTL)
        .await
        .unwrap_or_else(|s| panic!("{name}: upload failed: {s}"));
    assert_eq!(reply.len, len as u64, "{name}");
    assert_eq!(reply.checksum, expected, "{name}: upload checksum");

    // Download: the server pushes `len` bytes into the client's writable buffer.
    let (reply, received) = blob::download(&channel, len, 2, TTL)
        .await
        .unwrap_or_else(|s| panic!("{name}: download failed: {s}"));
    assert_eq!(
        checksum(&received),
        reply.checksum,
        "{name}: download checksum"
    );
    assert_eq!(reply.checksum, checksum(&pattern(2, len)), "{name}");
}

/// Bulk transfers inside TLS: the connection serves them as over plain TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mebibytes_each_way_over_tls() {
    let certs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tls");
    let tls = rpc_transport_tcp::tls::ServerTls::builder()
        .cert_files(certs.join("server.pem"), certs.join("server.key"))
        .build()
        .unwrap();
    let listener = rpc_transport_tcp::tls::bind("tls://127.0.0.1:0", tls)
        .await
        .unwrap();
    let uri = listener.local_addr_uri();
    let server = server();
    tokio::spawn(async move { server.serve(listener).await });
    let client = rpc_transport_tcp::tls::ClientTls::builder()
        .system_roots(false)
        .ca_file(certs.join("ca.pem"))
        .build()
        .unwrap();
    let channel = rpc_transport_tcp::tls::connect(&uri, &client)
        .await
        .unwrap();
    both_ways(channel, "tls", 64 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_each_way_over_tcp() {
    gigabyte_both_ways(tcp_or_unix("tcp://127.0.0.1:0").await, "tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_each_way_over_unix() {
    let path = std::env::temp_dir().join(format!("rpc-bulk-{}.sock", std::process::id()));
    let uri = format!("unix://{}", path.display());
    gigabyte_both_ways(tcp_or_unix(&uri).await, "unix").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mebibytes_each_way_over_udp() {
    let config = rpc_transport_udp::UdpConfig {
        max_datagram: 60_000,
        window: 1 << 20,
        ..rpc_transport_udp::UdpConfig::default()
    };
    let listener = rpc_transport_udp::bind_with("udp://127.0.0.1:0", config.clone())
        .await
        .unwrap();
    let uri = listener.local_addr_uri();
    let server = server();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder()
        .connect(rpc_transport_udp::UdpConnector::with_config(&uri, config).unwrap())
        .await
        .unwrap();
    let bulk = channel.bulk();
    let mut blob = BlobClient::new(channel);
    let data = pattern(3, 64 << 20);
    let exposed = bulk.expose_read(data.clone(), TTL).unwrap();
    let reply = blob
        .upload(UploadRequest {
            descriptor: exposed.descriptor().to_bytes(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().checksum, checksum(&data));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misused_descriptors_are_refused_and_the_connection_stays_usable() {
    let channel = tcp_or_unix("tcp://127.0.0.1:0").await;
    let bulk = channel.bulk();
    let mut blob = BlobClient::new(channel);
    let upload = |blob: &mut BlobClient, descriptor: rpc_core::bytes::Bytes| {
        let mut blob = blob.clone();
        async move { blob.upload(UploadRequest { descriptor }).await }
    };
    let expect = |result: Result<_, Status>, code: Code, what: &str| {
        let status = result.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status}");
    };

    // Garbage instead of a descriptor.
    expect(
        upload(&mut blob, "junk".into()).await,
        Code::INVALID_ARGUMENT,
        "garbage",
    );
    // Reading a buffer exposed for writing only.
    let write_only = bulk.expose_write(1000, TTL).unwrap();
    expect(
        upload(&mut blob, write_only.descriptor().to_bytes()).await,
        Code::PERMISSION_DENIED,
        "read of a write-only buffer",
    );
    // Writing a buffer exposed for reading only.
    let read_only = bulk.expose_read("secret".into(), TTL).unwrap();
    let status = blob
        .download(DownloadRequest {
            descriptor: read_only.descriptor().to_bytes(),
            len: 6,
            seed: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    // Past the end: the descriptor claims more than was exposed (a forged length).
    let small = bulk.expose_read(vec![1u8; 100].into(), TTL).unwrap();
    let mut forged = small.descriptor().to_bytes().to_vec();
    forged[10..18].copy_from_slice(&1_000_000u64.to_be_bytes());
    expect(
        upload(&mut blob, forged.into()).await,
        Code::OUT_OF_RANGE,
        "read past the end",
    );
    // A download longer than its buffer: refused before anything is made.
    let writable = bulk.expose_write(100, TTL).unwrap();
    let status = blob
        .download(DownloadRequest {
            descriptor: writable.descriptor().to_bytes(),
            len: 101,
            seed: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OUT_OF_RANGE, "{status}");
    // A download of a terabyte into a buffer whose length is forged to match: the
    // server makes and writes it a piece at a time, so the first piece past the real
    // 100 bytes fails it (it had set the whole terabyte aside, and the allocation
    // failure aborted the server's process).
    let mut forged = writable.descriptor().to_bytes().to_vec();
    forged[10..18].copy_from_slice(&(1u64 << 40).to_be_bytes());
    let status = blob
        .download(DownloadRequest {
            descriptor: forged.into(),
            len: 1 << 40,
            seed: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OUT_OF_RANGE, "{status}");
    drop(writable);
    // A wrong token.
    let mut wrong = small.descriptor().to_bytes().to_vec();
    wrong[2] ^= 0xff;
    expect(
        upload(&mut blob, wrong.into()).await,
        Code::NOT_FOUND,
        "a wrong token",
    );
    // Use after revocation: the buffer was dropped.
    let gone = bulk.expose_read(vec![2u8; 100].into(), TTL).unwrap();
    let descriptor = gone.descriptor().to_bytes();
    drop(gone);
    expect(
        upload(&mut blob, descriptor).await,
        Code::NOT_FOUND,
        "use after revoke",
    );
    // A buffer whose time ran out.
    let brief = bulk
        .expose_read(vec![3u8; 100].into(), Duration::from_millis(1))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    expect(
        upload(&mut blob, brief.descriptor().to_bytes()).await,
        Code::NOT_FOUND,
        "expired",
    );
    // And the connection still works.
    let reply = upload(&mut blob, small.descriptor().to_bytes())
        .await
        .unwrap();
    assert_eq!(reply.get_ref().checksum, checksum(&[1u8; 100]));
    drop((write_only, read_only));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_fit_a_small_frame_limit() {
    // Frames of at most 256 KiB on both sides: bulk pieces shrink to fit them.
    const MAX_FRAME: usize = 256 << 10;
    let server = Server::builder()
        .max_frame_len(MAX_FRAME)
        .add_service(BlobServer::new(BlobService))
        .build();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder()
        .max_frame_len(MAX_FRAME)
        .connect(rpc_transport_tcp::StreamConnector::from_uri(&uri).unwrap())
        .await
        .unwrap();
    let bulk = channel.bulk();
    assert!(bulk.max_op() < MAX_FRAME);
    let mut blob = BlobClient::new(channel);
    let data = pattern(4, 3 << 20);
    let exposed = bulk.expose_read(data.clone(), TTL).unwrap();
    let reply = blob
        .upload(UploadRequest {
            descriptor: exposed.descriptor().to_bytes(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().checksum, checksum(&data));
    let exposed = bulk.expose_write(3 << 20, TTL).unwrap();
    let reply = blob
        .download(DownloadRequest {
            descriptor: exposed.descriptor().to_bytes(),
            len: 3 << 20,
            seed: 5,
        })
        .await
        .unwrap();
    assert_eq!(
        checksum(&exposed.into_bytes().await),
        reply.get_ref().checksum
    );
}

/// Over `grpc://`, whose HTTP/2 wire has no BULK frames, a bulk operation fails at once
/// with `UNIMPLEMENTED`, on the server (pulling an upload, pushing a download) as on
/// the client: it waited, unanswered, for its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_over_grpc_fails_at_once_with_unimplemented() {
    let listener = rpc_connect::AnyListener::bind("grpc://127.0.0.1:0")
        .await
        .unwrap();
    let uri = listener.local_addr_uri();
    let serving = tokio::spawn(listener.serve(&server(), std::future::pending()));
    let channel = rpc_connect::connect(&uri).await.unwrap();
    let guard = Duration::from_secs(30);
    let upload = tokio::time::timeout(guard, blob::upload(&channel, pattern(1, 1000), TTL))
        .await
        .expect("the upload waited");
    let status = upload.expect_err("an upload over grpc://");
    assert_eq!(status.code(), Code::UNIMPLEMENTED, "{status}");
    assert!(
        status.message().contains("bulk transfer is not carried"),
        "{status}"
    );
    let download = tokio::time::timeout(guard, blob::download(&channel, 1000, 2, TTL))
        .await
        .expect("the download waited");
    let status = download.expect_err("a download over grpc://");
    assert_eq!(status.code(), Code::UNIMPLEMENTED, "{status}");
    // The client's own operations on a descriptor fail alike.
    let descriptor = channel
        .bulk()
        .expose_read(bytes::Bytes::from_static(b"local"), TTL)
        .unwrap();
    let status = channel
        .bulk()
        .read_all(descriptor.descriptor())
        .await
        .expect_err("a read over grpc://");
    assert_eq!(status.code(), Code::UNIMPLEMENTED, "{status}");
    serving.abort();
}
