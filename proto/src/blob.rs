//! The `Blob` service: moves large blobs through the bulk-transfer API
//! ([`rpc_core::bulk`]); [`upload`] and [`download`] are its client halves, and
//! [`checksum`] and [`pattern`] check what moved.
//!
//! ```no_run
//! # async fn f(channel: rpc_core::client::Channel) -> Result<(), rpc_core::Status> {
//! use rpc_proto::blob::{blob_client::BlobClient, checksum, UploadRequest};
//! let data = rpc_core::bytes::Bytes::from(vec![7u8; 64 << 20]);
//! // Expose the data; the server pulls it (one-sided on RDMA).
//! let exposed = channel.bulk().expose_read(data.clone(), std::time::Duration::from_secs(60))?;
//! let reply = BlobClient::new(channel)
//!     .upload(UploadRequest { descriptor: exposed.descriptor().to_bytes() })
//!     .await?;
//! assert_eq!(reply.get_ref().checksum, checksum(&data));
//! # Ok(()) }
//! ```

use futures::StreamExt;
use rpc_core::{
    bulk::{BulkDescriptor, BULK_PIPELINE},
    bytes::Bytes,
    Request, Response, Status,
};

pub use crate::v1::{
    blob_client, blob_methods, blob_server, BlobReply, DownloadRequest, UploadRequest,
};

/// A 64-bit checksum of `data`, fast enough for gigabytes in a debug build: a
/// multiply-xor over 8-byte words, then the tail, mixed with the length.
pub fn checksum(data: &[u8]) -> u64 {
    let mut sum = Checksum::default();
    sum.update(data);
    sum.finish()
}

/// [`checksum`] over data that arrives in pieces (whose lengths are multiples of 8,
/// except the last).
#[derive(Clone, Copy, Debug, Default)]
pub struct Checksum {
    state: u64,
    len: u64,
}

impl Checksum {
    /// Adds the next piece.
    pub fn update(&mut self, data: &[u8]) {
        let mut words = data.chunks_exact(8);
        for word in &mut words {
            let w = u64::from_le_bytes(word.try_into().unwrap_or_default());
            self.state = (self.state ^ w)
                .wrapping_mul(0x0100_0000_01b3)
                .rotate_left(29);
        }
        for &b in words.remainder() {
            self.state = (self.state ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.len += data.len() as u64;
    }

    /// The checksum of everything added.
    pub fn finish(&self) -> u64 {
        self.state ^ self.len.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

/// `len` bytes made from `seed`, cheaply: what `Download` writes.
pub fn pattern(seed: u64, len: usize) -> Bytes {
    Pattern::new(seed).next_piece(len)
}

/// [`pattern`] made piece by piece: the pieces, in order, are `pattern(seed, len)`
/// as long as every piece but the last is a multiple of 8 bytes long.
#[derive(Debug, Clone)]
pub struct Pattern {
    x: u64,
}

impl Pattern {
    /// The pattern of `seed`, from its start.
    pub fn new(seed: u64) -> Pattern {
        Pattern { x: seed | 1 }
    }

    /// The next `len` bytes.
    pub fn next_piece(&mut self, len: usize) -> Bytes {
        let mut out = Vec::with_capacity(len.saturating_add(8));
        while out.len() < len {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            out.extend_from_slice(&self.x.to_le_bytes());
        }
        out.truncate(len);
        Bytes::from(out)
    }
}

/// The client half of an upload: exposes `data` for reading (for `ttl`) and asks the
/// server to read it. The server's reply says how many bytes it read and their
/// [`checksum`]. The same code on every transport (one-sided on RDMA).
pub async fn upload(
    channel: &rpc_core::client::Channel,
    data: Bytes,
    ttl: std::time::Duration,
) -> Result<BlobReply, Status> {
    let exposed = channel.bulk().expose_read(data, ttl)?;
    let reply = blob_client::BlobClient::new(channel.clone())
        .upload(UploadRequest {
            descriptor: exposed.descriptor().to_bytes(),
        })
        .await?;
    Ok(reply.into_inner())
}

/// The client half of a download: exposes `len` writable bytes (for `ttl`) and asks
/// the server to write [`pattern`]`(seed, len)` into them: the server's reply and the
/// bytes that arrived.
pub async fn download(
    channel: &rpc_core::client::Channel,
    len: usize,
    seed: u64,
    ttl: std::time::Duration,
) -> Result<(BlobReply, Bytes), Status> {
    let exposed = channel.bulk().expose_write(len, ttl)?;
    let reply = blob_client::BlobClient::new(channel.clone())
        .download(DownloadRequest {
            descriptor: exposed.descriptor().to_bytes(),
            len: len as u64,
            seed,
        })
        .await?;
    Ok((reply.into_inner(), exposed.into_bytes().await))
}

/// The reference `Blob` implementation.
#[derive(Debug, Default, Clone)]
pub struct BlobService;

fn descriptor(bytes: &[u8]) -> Result<BulkDescriptor, Status> {
    BulkDescriptor::from_bytes(bytes)
}

impl blob_server::Blob for BlobService {
    async fn upload(&self, request: Request<UploadRequest>) -> Result<Response<BlobReply>, Status> {
        let bulk = request
            .bulk()
            .cloned()
            .ok_or_else(|| Status::failed_precondition("no bulk endpoint on this connection"))?;
        let descriptor = descriptor(&request.get_ref().descriptor)?;
        let total = descriptor.len() as usize;
        // Pull the pieces, a few in flight, and checksum them in order: the whole blob is
        // never held.
        let mut sum = Checksum::default();
        let piece = bulk.max_op();
        let mut pieces = futures::stream::iter((0..total).step_by(piece))
            .map(|start| {
                let len = (total - start).min(piece);
                let bulk = bulk.clone();
                let descriptor = descriptor.clone();
                async move { bulk.read(&descriptor, start as u64, len).await }
            })
            .buffered(BULK_PIPELINE);
        while let Some(piece) = pieces.next().await {
            sum.update(&piece?);
        }
        Ok(Response::new(BlobReply {
            len: total as u64,
            checksum: sum.finish(),
        }))
    }

    async fn download(
        &self,
        request: Request<DownloadRequest>,
    ) -> Result<Response<BlobReply>, Status> {
        let bulk = request
            .bulk()
            .cloned()
            .ok_or_else(|| Status::failed_precondition("no bulk endpoint on this connection"))?;
        let DownloadRequest {
            descriptor: d,
            len,
            seed,
        } = request.into_inner();
        let descriptor = descriptor(&d)?;
        if len > descriptor.len() {
            return Err(Status::out_of_range(format!(
                "{len} bytes do not fit the exposed {} bytes",
                descriptor.len()
            )));
        }
        let total = usize::try_from(len).map_err(|_| Status::out_of_range("len"))?;
        // Made and written a piece at a time, a few in flight: the whole blob is never
        // held, whatever length the request names.
        let piece = bulk.max_op() / 8 * 8;
        let mut made = Pattern::new(seed);
        let mut sum = Checksum::default();
        let mut writes = futures::stream::iter((0..total).step_by(piece.max(8)))
            .map(|start| {
                let data = made.next_piece((total - start).min(piece.max(8)));
                sum.update(&data);
                let bulk = bulk.clone();
                let descriptor = descriptor.clone();
                async move { bulk.write(&descriptor, start as u64, data).await }
            })
            .buffered(BULK_PIPELINE);
        while let Some(written) = writes.next().await {
            written?;
        }
        drop(writes);
        Ok(Response::new(BlobReply {
            len,
            checksum: sum.finish(),
        }))
    }
}
