//! Bulk transfer: large data need not travel inside messages. The client exposes a
//! buffer and sends its descriptor in a small message; the server reads (`Upload`) or
//! writes (`Download`) that buffer directly, in pipelined pieces served by the
//! connection (not the handler) on TCP, Unix and UDP, one-sided on RDMA: the same code
//! on every transport (`rpc_core::bulk`, the `Blob` example service). Descriptors are
//! capabilities, bounded in length and time and revoked when the buffer is dropped.
//!
//! `cargo run -p rpc-examples --bin bulk [-- SCHEME]` (`tcp` by default; `udp`, or
//! `rdma` with the soft provider)

use std::time::{Duration, Instant};

use rpc_core::{client::Channel, server::Server};
use rpc_proto::blob::{
    blob_client::BlobClient, blob_server::BlobServer, checksum, pattern, BlobService,
    DownloadRequest, UploadRequest,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let scheme = std::env::args().nth(1).unwrap_or_else(|| "tcp".into());
    let address = format!("{scheme}://127.0.0.1:0");
    let server = Server::builder().add_service(BlobServer::new(BlobService));
    let (uri, serving) =
        rpc_connect::serve(&server.build(), &address, std::future::pending()).await?;
    tokio::spawn(serving);
    // A deadline for every call: each moves 64 MiB.
    let options = rpc_connect::ConnectOptions::new()
        .channel(Channel::builder().timeout(Duration::from_secs(60)));
    let channel = rpc_connect::connect_with(&uri, &options).await?;
    let mut blob = BlobClient::new(channel.clone());
    let len = 64 << 20;

    // Upload: expose 64 MiB for reading; the server reads it through the descriptor.
    let data = pattern(7, len);
    let exposed = channel
        .bulk()
        .expose_read(data.clone(), Duration::from_secs(60))?;
    let start = Instant::now();
    let request = UploadRequest {
        descriptor: exposed.descriptor().to_bytes(),
    };
    let reply = blob.upload(request).await?.into_inner();
    let rate = len as f64 / start.elapsed().as_secs_f64() / (1 << 20) as f64;
    assert_eq!(reply.checksum, checksum(&data));
    println!(
        "upload over {scheme}: {} bytes, checksum ok, {rate:.0} MiB/s",
        reply.len
    );

    // Download: expose a buffer for writing; the server fills it.
    let exposed = channel.bulk().expose_write(len, Duration::from_secs(60))?;
    let start = Instant::now();
    let request = DownloadRequest {
        descriptor: exposed.descriptor().to_bytes(),
        len: len as u64,
        seed: 9,
    };
    let reply = blob.download(request).await?.into_inner();
    let rate = len as f64 / start.elapsed().as_secs_f64() / (1 << 20) as f64;
    let filled = exposed.into_bytes().await; // revokes the descriptor
    assert_eq!(checksum(&filled), reply.checksum);
    println!(
        "download over {scheme}: {} bytes, checksum ok, {rate:.0} MiB/s",
        filled.len()
    );
    Ok(())
}
