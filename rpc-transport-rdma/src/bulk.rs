//! Bulk transfers ([`rpc_core::bulk`]) as one-sided RDMA: what
//! [`Link::one_sided`](rpc_core::link::Link::one_sided) hands the core for an
//! [`RdmaLink`](crate::RdmaLink).
//!
//! | `rpc_core::bulk` | provider ([`Handle`]) |
//! | --- | --- |
//! | `expose_read(data)` | [`Handle::expose`]: the bytes where they are (soft), or copied into registered memory (verbs) |
//! | `expose_write(len)` | [`Handle::register`] of `alloc(len)` with write access only |
//! | the descriptor's transport part | the region's 32-byte [`RegionDesc`] |
//! | `read` / `write` | [`Handle::read`] / [`Handle::write`] of a [`RemoteSlice`] |
//! | dropping the `Exposed` | dropping the region: deregistered, later accesses refused |
//! | `Exposed::into_bytes` of a written buffer | [`Handle::revoke`]: waits until no operation of the peer can touch it |
//!
//! The operations run on the calling task and complete to it through the endpoint's
//! [`Handle`]: neither the link's task nor the core's connection task takes part, and
//! on the exposing side nothing runs at all (the soft provider's responder serves
//! them when cross-memory attach is not possible).
//!
//! A refused access ([`Refusal`]) becomes the status the core gives for the same
//! misuse over TCP: an unknown or revoked key `NOT_FOUND`, a range outside the region
//! `OUT_OF_RANGE`, a missing right `PERMISSION_DENIED`; a connection that is gone
//! `UNAVAILABLE`.

use std::{
    future::Future,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
};

use bytes::Bytes;
use rpc_core::{
    bulk::{OneSided, WrittenRegion},
    Error, ErrorKind, Status,
};
use tokio::sync::Semaphore;

use crate::{
    link::LinkStats,
    provider::{Access, Buffer, Handle, Refusal, Region, RegionDesc, RemoteSlice, DESC_LEN},
};

/// The [`OneSided`] of one RDMA connection.
pub(crate) struct RdmaBulk<H: Handle> {
    handle: H,
    stats: Arc<LinkStats>,
    /// Slots for operations at once (`RdmaConfig::max_bulk_ops`): each holds a
    /// registered buffer of its piece while it waits and runs.
    slots: Arc<Semaphore>,
}

impl<H: Handle> RdmaBulk<H> {
    pub(crate) fn new(handle: H, stats: Arc<LinkStats>, max_ops: usize) -> Self {
        RdmaBulk {
            handle,
            stats,
            slots: Arc::new(Semaphore::new(max_ops)),
        }
    }

    fn exposed(&self, region: &H::Region) -> Bytes {
        self.stats.bulk_exposed.fetch_add(1, Ordering::Relaxed);
        let mut desc = [0u8; DESC_LEN];
        region.desc().encode(&mut desc);
        Bytes::copy_from_slice(&desc)
    }

    /// The part of the peer's region an operation touches, checked against the
    /// descriptor (the owner checks again against its table).
    fn slice(remote: &[u8], offset: u64, len: usize, what: &str) -> Result<RemoteSlice, Status> {
        if remote.len() != DESC_LEN {
            return Err(Status::invalid_argument(format!(
                "not an RDMA region descriptor ({} bytes, expected {DESC_LEN})",
                remote.len()
            )));
        }
        let desc =
            RegionDesc::decode(remote).map_err(|e| Status::invalid_argument(e.to_string()))?;
        desc.slice(offset, len).map_err(|e| status(&e, what))
    }

    fn what(op: &str, offset: u64, len: usize) -> String {
        format!("bulk {op} of {len} bytes at offset {offset}")
    }
}

impl<H: Handle> OneSided for RdmaBulk<H> {
    fn expose_read(&self, data: Bytes) -> Result<(Bytes, Box<dyn Send + Sync>), Status> {
        let len = data.len();
        let region = self
            .handle
            .expose(data)
            .map_err(|e| status(&e, &format!("exposing {len} bytes for reading")))?;
        Ok((self.exposed(&region), Box::new(region)))
    }

    fn expose_write(&self, len: usize) -> Result<(Bytes, Box<dyn WrittenRegion>), Status> {
        let what = || format!("exposing {len} bytes for writing");
        let buf = self.handle.alloc(len).map_err(|e| status(&e, &what()))?;
        let region = self
            .handle
            .register(buf, Access::WRITE)
            .map_err(|e| status(&e, &what()))?;
        let remote = self.exposed(&region);
        let written = Written {
            handle: self.handle.clone(),
            region,
            len,
        };
        Ok((remote, Box::new(written)))
    }

    fn read(
        &self,
        remote: &[u8],
        offset: u64,
        len: usize,
    ) -> Pin<Box<dyn Future<Output = Result<Bytes, Status>> + Send>> {
        let what = Self::what("read", offset, len);
        let slice = Self::slice(remote, offset, len, &what);
        let handle = self.handle.clone();
        let stats = self.stats.clone();
        let slots = self.slots.clone();
        Box::pin(async move {
            let slice = slice?;
            let _slot = slots.acquire_owned().await.map_err(|_| closed(&what))?;
            let dst = handle.alloc(len).map_err(|e| status(&e, &what))?;
            match handle.read(dst, 0, slice).await {
                Ok(buf) => {
                    stats.bulk_reads.fetch_add(1, Ordering::Relaxed);
                    stats.bulk_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    Ok(buf.into_bytes(len))
                }
                Err(err) => {
                    stats.bulk_failed.fetch_add(1, Ordering::Relaxed);
                    Err(status(&err, &what))
                }
            }
        })
    }

    fn write(
        &self,
        remote: &[u8],
        offset: u64,
        data: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<(), Status>> + Send>> {
        let len = data.len();
        let what = Self::what("write", offset, len);
        let slice = Self::slice(remote, offset, len, &what);
        let handle = self.handle.clone();
        let stats = self.stats.clone();
        let slots = self.slots.clone();
        Box::pin(async move {
            let slice = slice?;
            let _slot = slots.acquire_owned().await.map_err(|_| closed(&what))?;
            // Registered memory comes from the endpoint: the data is copied in once.
            let mut src = handle.alloc(len).map_err(|e| status(&e, &what))?;
            src.as_mut_slice().copy_from_slice(&data);
            drop(data);
            match handle.write(src, 0, slice).await {
                Ok(()) => {
                    stats.bulk_writes.fetch_add(1, Ordering::Relaxed);
                    stats.bulk_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    Ok(())
                }
                Err(err) => {
                    stats.bulk_failed.fetch_add(1, Ordering::Relaxed);
                    Err(status(&err, &what))
                }
            }
        })
    }
}

/// A region exposed for the peer to write; dropping it deregisters it.
struct Written<H: Handle> {
    handle: H,
    region: H::Region,
    len: usize,
}

impl<H: Handle> WrittenRegion for Written<H> {
    fn take(self: Box<Self>) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
        let Written {
            handle,
            region,
            len,
        } = *self;
        Box::pin(async move {
            match handle.revoke(region).await {
                Some(buf) => buf.into_bytes(len),
                // Not owned memory: cannot happen for a registered buffer.
                None => Bytes::new(),
            }
        })
    }
}

/// The semaphore is never closed; should it be, the connection is as good as gone.
fn closed(what: &str) -> Status {
    Status::unavailable(format!("{what}: the connection is closing"))
}

/// The status a failed one-sided operation (or registration) gives the caller:
/// the codes the core gives for the same misuse of a descriptor served over TCP.
pub(crate) fn status(err: &Error, what: &str) -> Status {
    let message = format!("{what}: {err}");
    match Refusal::of(err) {
        Some(Refusal::UnknownKey | Refusal::Revoked) => Status::not_found(message),
        Some(Refusal::OutOfBounds) => Status::out_of_range(message),
        Some(Refusal::Denied) => Status::permission_denied(message),
        None => match err.kind() {
            ErrorKind::LimitReached => Status::resource_exhausted(message),
            _ => Status::unavailable(message),
        },
    }
}

#[cfg(test)]
mod tests {
    use rpc_core::Code;

    use super::*;
    use crate::provider::{out_of_bounds, Refused};

    #[test]
    fn refusals_map_to_the_codes_of_the_core() {
        for (reason, code) in [
            (Refusal::UnknownKey, Code::NOT_FOUND),
            (Refusal::Revoked, Code::NOT_FOUND),
            (Refusal::OutOfBounds, Code::OUT_OF_RANGE),
            (Refusal::Denied, Code::PERMISSION_DENIED),
        ] {
            let err = Refused::error(reason, "the detail".into());
            assert_eq!(Refusal::of(&err), Some(reason));
            let status = status(&err, "a read");
            assert_eq!(status.code(), code, "{reason:?}");
            assert!(status.message().contains("the detail"), "{status}");
        }
        assert_eq!(
            status(&out_of_bounds(10, 5, 12), "x").code(),
            Code::OUT_OF_RANGE
        );
        let closed = Error::new(ErrorKind::Closed, "the peer process 7 is gone");
        assert_eq!(Refusal::of(&closed), None);
        let status = status(&closed, "a read");
        assert_eq!(status.code(), Code::UNAVAILABLE);
        assert!(status.message().contains("is gone"), "{status}");
        let full = Error::new(ErrorKind::LimitReached, "region table full");
        assert_eq!(super::status(&full, "x").code(), Code::RESOURCE_EXHAUSTED);
    }
}
