//! Rough numbers for the soft provider, one JSON object per line:
//! `cargo run --release -p rpc-transport-rdma --example soft_bench`.
//!
//! Small frames one way and ping-pong over the RDMA link and, for comparison, over
//! the TCP crate's stream link on a Unix socket; large frames by rendezvous;
//! one-sided reads by cross-memory attach and through the responder; and bulk
//! transfers through the `Blob` service (the server reads the client's exposed
//! buffer: one-sided over RDMA, served by the client's connection over a Unix
//! socket), next to the raw reads they are made of. Both ends run in this process
//! (cross-memory attach to oneself is the same system call).

use std::{
    future::poll_fn,
    time::{Duration, Instant},
};

use bytes::Bytes;
use rpc_core::link::Link;
use rpc_transport_rdma::{
    provider::{Access, Endpoint, Region, RemoteSlice},
    soft::{self, SoftEndpoint, SoftListener},
    Address, RdmaConfig, RdmaLink,
};

fn report(bench: &str, value: f64, unit: &str) {
    println!("{{\"bench\":\"{bench}\",\"value\":{value:.3},\"unit\":\"{unit}\"}}");
}

fn socket(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("rdma-bench-{}-{name}.sock", std::process::id()))
}

async fn endpoints(config: &RdmaConfig, name: &str) -> (SoftEndpoint, SoftEndpoint) {
    let mut listener = SoftListener::bind(&Address::Unix(socket(name)), config.clone())
        .await
        .unwrap();
    let address = listener.address().clone();
    let (a, b) = tokio::join!(soft::connect(&address, config), listener.accept());
    (a.unwrap(), b.unwrap())
}

async fn links(config: &RdmaConfig, name: &str) -> (RdmaLink, RdmaLink) {
    let (a, b) = endpoints(config, name).await;
    (
        RdmaLink::new(a, config, 1 << 30).unwrap(),
        RdmaLink::new(b, config, 1 << 30).unwrap(),
    )
}

async fn tcp_links(name: &str) -> (rpc_transport_tcp::TcpLink, rpc_transport_tcp::TcpLink) {
    let address = format!("unix://{}", socket(name).display());
    let mut listener = rpc_transport_tcp::bind(&address).await.unwrap();
    let connector = rpc_transport_tcp::StreamConnector::from_uri(&address).unwrap();
    let config = rpc_core::link::LinkConfig {
        max_frame_len: 1 << 30,
        ..Default::default()
    };
    use rpc_core::link::{Connector, Listener};
    let (a, b) = tokio::join!(connector.connect(&config), listener.accept(&config));
    (a.unwrap(), b.unwrap())
}

/// Sends `n` frames of `size` bytes from `a` to `b`; frames per second.
async fn one_way<L: Link>(mut a: L, mut b: L, n: usize, size: usize) -> f64 {
    let payload = Bytes::from(vec![7u8; size]);
    let start = Instant::now();
    let sender = tokio::spawn(async move {
        for _ in 0..n {
            poll_fn(|cx| a.poll_ready(cx)).await.unwrap();
            a.start_send(b"hdr", payload.clone().into()).unwrap();
        }
        poll_fn(|cx| a.poll_flush(cx)).await.unwrap();
        a
    });
    for _ in 0..n {
        poll_fn(|cx| b.poll_recv(cx)).await.unwrap().unwrap();
    }
    let elapsed = start.elapsed();
    drop(sender.await.unwrap());
    n as f64 / elapsed.as_secs_f64()
}

/// Round trips of one small frame; microseconds per round trip.
async fn ping_pong<L: Link>(mut a: L, mut b: L, n: usize) -> f64 {
    let echo = tokio::spawn(async move {
        for _ in 0..n {
            let frame = poll_fn(|cx| b.poll_recv(cx)).await.unwrap().unwrap();
            poll_fn(|cx| b.poll_ready(cx)).await.unwrap();
            b.start_send(&frame, Bytes::new().into()).unwrap();
            poll_fn(|cx| b.poll_flush(cx)).await.unwrap();
        }
        b
    });
    let start = Instant::now();
    for _ in 0..n {
        poll_fn(|cx| a.poll_ready(cx)).await.unwrap();
        a.start_send(b"ping", Bytes::new().into()).unwrap();
        poll_fn(|cx| a.poll_flush(cx)).await.unwrap();
        poll_fn(|cx| a.poll_recv(cx)).await.unwrap().unwrap();
    }
    let per = start.elapsed() / n as u32;
    drop(echo.await.unwrap());
    per.as_secs_f64() * 1e6
}

/// One-sided reads of `size` bytes, `n` times; GiB/s.
async fn reads(config: &RdmaConfig, name: &str, size: usize, n: usize) -> f64 {
    let (mut a, b) = endpoints(config, name).await;
    let region = b.expose(Bytes::from(vec![1u8; size])).unwrap();
    let mut buf = Some(a.alloc(size).unwrap());
    let start = Instant::now();
    for _ in 0..n {
        let slice = RemoteSlice {
            region: region.desc(),
            offset: 0,
            len: size,
        };
        a.post_read(1, buf.take().unwrap(), 0, slice).unwrap();
        let c = poll_fn(|cx| a.poll_completion(cx)).await.unwrap();
        c.result.unwrap();
        buf = Some(c.buf);
    }
    let bytes = (size * n) as f64;
    bytes / start.elapsed().as_secs_f64() / f64::from(1u32 << 30)
}

/// One-sided reads of a `size`-byte region in pieces of `rpc_core::bulk::MAX_BULK_OP`,
/// one at a time (what the bulk API's reads come down to); GiB/s.
async fn piece_reads(config: &RdmaConfig, size: usize, n: usize) -> f64 {
    let piece = rpc_core::bulk::MAX_BULK_OP;
    let (mut a, b) = endpoints(config, "pieces").await;
    let region = b.expose(Bytes::from(vec![1u8; size])).unwrap();
    let mut buf = Some(a.alloc(piece).unwrap());
    let start = Instant::now();
    for _ in 0..n {
        for offset in (0..size).step_by(piece) {
            let slice = region.desc().slice(offset as u64, piece).unwrap();
            a.post_read(1, buf.take().unwrap(), 0, slice).unwrap();
            let c = poll_fn(|cx| a.poll_completion(cx)).await.unwrap();
            c.result.unwrap();
            buf = Some(c.buf);
        }
    }
    (size * n) as f64 / start.elapsed().as_secs_f64() / f64::from(1u32 << 30)
}

/// A `Blob` server on `uri` (`rdma+unix://` or `unix://`) and a channel to it.
async fn blob_channel(uri: &str) -> rpc_core::client::Channel {
    use rpc_proto::blob::{blob_server::BlobServer, BlobService};
    let server = rpc_core::server::Server::builder()
        .add_service(BlobServer::new(BlobService))
        .build();
    if uri.starts_with("rdma") {
        let listener = rpc_transport_rdma::bind(uri).await.unwrap();
        tokio::spawn(async move { server.serve(listener).await });
        rpc_transport_rdma::connect(uri).await.unwrap()
    } else {
        let listener = rpc_transport_tcp::bind(uri).await.unwrap();
        tokio::spawn(async move { server.serve(listener).await });
        rpc_transport_tcp::connect(uri).await.unwrap()
    }
}

/// Uploads `size` bytes `n` times through `Blob`: the server reads the client's
/// exposed buffer with the bulk API (and checksums it); GiB/s.
async fn blob_uploads(channel: rpc_core::client::Channel, size: usize, n: usize) -> f64 {
    use rpc_proto::blob::{blob_client::BlobClient, UploadRequest};
    let bulk = channel.bulk();
    let mut blob = BlobClient::new(channel);
    let data = Bytes::from(vec![3u8; size]);
    let start = Instant::now();
    for _ in 0..n {
        let exposed = bulk
            .expose_read(data.clone(), Duration::from_secs(60))
            .unwrap();
        let descriptor = exposed.descriptor().to_bytes();
        blob.upload(UploadRequest { descriptor }).await.unwrap();
    }
    (size * n) as f64 / start.elapsed().as_secs_f64() / f64::from(1u32 << 30)
}

/// Registering and deregistering a region; nanoseconds per pair.
async fn registration(config: &RdmaConfig) -> f64 {
    let (_a, b) = endpoints(config, "reg").await;
    let n = 100_000;
    let bytes = Bytes::from(vec![0u8; 4096]);
    let start = Instant::now();
    for _ in 0..n {
        drop(b.expose(bytes.clone()).unwrap());
    }
    let _ = Access::READ;
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let recv_buffers = std::env::var("RDMA_BENCH_RECV_BUFFERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rpc_transport_rdma::DEFAULT_RECV_BUFFERS);
    let config = RdmaConfig {
        recv_buffers,
        ..RdmaConfig::default()
    };
    let no_cma = RdmaConfig {
        cross_memory_attach: false,
        ..RdmaConfig::default()
    };
    let (a, b) = links(&config, "small").await;
    report(
        "rdma_soft_small_frames_64B",
        one_way(a, b, 200_000, 64).await,
        "frames/s",
    );
    let (a, b) = tcp_links("tcp-small").await;
    report(
        "tcp_unix_small_frames_64B",
        one_way(a, b, 200_000, 64).await,
        "frames/s",
    );
    let (a, b) = links(&config, "pp").await;
    report(
        "rdma_soft_ping_pong",
        ping_pong(a, b, 20_000).await,
        "us/round-trip",
    );
    let (a, b) = tcp_links("tcp-pp").await;
    report(
        "tcp_unix_ping_pong",
        ping_pong(a, b, 20_000).await,
        "us/round-trip",
    );
    for (size, n) in [(1usize << 20, 500usize), (16 << 20, 40)] {
        let (a, b) = links(&config, "big").await;
        let rate = one_way(a, b, n, size).await * size as f64 / f64::from(1u32 << 30);
        report(
            &format!("rdma_soft_rendezvous_{}MiB", size >> 20),
            rate,
            "GiB/s",
        );
        let (a, b) = tcp_links("tcp-big").await;
        let rate = one_way(a, b, n, size).await * size as f64 / f64::from(1u32 << 30);
        report(&format!("tcp_unix_frames_{}MiB", size >> 20), rate, "GiB/s");
    }
    for (size, n) in [(1usize << 20, 500usize), (64 << 20, 10)] {
        let mib = size >> 20;
        report(
            &format!("soft_read_cma_{mib}MiB"),
            reads(&config, "cma", size, n).await,
            "GiB/s",
        );
        report(
            &format!("soft_read_responder_{mib}MiB"),
            reads(&no_cma, "resp", size, n).await,
            "GiB/s",
        );
    }
    let size = 64 << 20;
    report(
        "soft_read_cma_1MiB_pieces_of_64MiB",
        piece_reads(&config, size, 10).await,
        "GiB/s",
    );
    let rdma = format!("rdma+unix://{}", socket("blob-rdma").display());
    report(
        "rdma_soft_bulk_upload_64MiB",
        blob_uploads(blob_channel(&rdma).await, size, 10).await,
        "GiB/s",
    );
    let unix = format!("unix://{}", socket("blob-unix").display());
    report(
        "unix_bulk_upload_64MiB",
        blob_uploads(blob_channel(&unix).await, size, 10).await,
        "GiB/s",
    );
    report(
        "soft_register_deregister",
        registration(&config).await,
        "ns",
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}
