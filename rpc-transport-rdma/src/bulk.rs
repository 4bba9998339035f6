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
    /// Regions exposures may hold at once (`LinkStats::bulk_regions` counts them).
    max_regions: usize,
}

/// One region a bulk exposure holds in the connection's table, given back on drop.
struct RegionSlot(Arc<LinkStats>);

impl Drop for RegionSlot {
    fn drop(&mut self) {
        self.0.bulk_regions.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<H: Handle> RdmaBulk<H> {
    pub(crate) fn new(
        handle: H,
        stats: Arc<LinkStats>,
        max_ops: usize,
        max_regions: usize,
    ) -> Self {
        RdmaBulk {
            handle,
            stats,
            slots: Arc::new(Semaphore::new(max_ops)),
            max_regions,
        }
    }

    /// Takes a place in the region table for one exposure, or refuses it: the
    /// regions kept for the link's rendezvous are never given to exposures (a full
    /// table made a large frame fail the whole connection; a review).
    fn region_slot(&self, what: impl FnOnce() -> String) -> Result<RegionSlot, Status> {
        let held = self.stats.bulk_regions.fetch_add(1, Ordering::Relaxed);
        let slot = RegionSlot(self.stats.clone());
        if held >= self.max_regions {
            return Err(Status::resource_exhausted(format!(
                "{}: this connection's bulk exposures hold {held} regions, the most \
                 its region table allows them (RdmaConfig::max_regions, less the room \
                 kept for rendezvous)",
                what()
            )));
        }
        Ok(slot)
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
        let what = || format!("exposing {len} bytes for reading");
        let slot = self.region_slot(what)?;
        let region = self.handle.expose(data).map_err(|e| status(&e, &what()))?;
        Ok((self.exposed(&region), Box::new((region, slot))))
    }

    fn expose_write(&self, len: usize) -> Result<(Bytes, Box<dyn WrittenRegion>), Status> {
        let what = || format!("exposing {len} bytes for writing");
        let slot = self.region_slot(what)?;
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
            _slot: slot,
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
    /// Given back when the region is revoked (with `take`) or dropped.
    _slot: RegionSlot,
}

impl<H: Handle> WrittenRegion for Written<H> {
    fn take(self: Box<Self>) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
        let Written {
            handle,
            region,
            len,
            _slot: slot,
        } = *self;
        Box::pin(async move {
            let _slot = slot; // the table's place is taken until the region is revoked
            match handle.revoke(region).await {
                Some(buf) => buf.into_bytes(len),
                // The peer is stuck between its check and its copy (stopped): the
                // memory stays with the provider, and the written bytes are lost.
                None => {
                    tracing::warn!(
                        len,
                        "a region written by the peer could not be revoked (the peer \
                         process is stopped mid-operation): its bytes are lost"
                    );
                    Bytes::new()
                }
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
    use proptest::prelude::*;
    use rpc_core::Code;

    use super::*;
    use crate::{
        provider::{out_of_bounds, Refused},
        soft::SoftHandle,
    };

    /// The descriptor check every bulk read and write starts with.
    fn slice(remote: &[u8], offset: u64, len: usize) -> Result<RemoteSlice, Status> {
        RdmaBulk::<SoftHandle>::slice(remote, offset, len, "a bulk read")
    }

    fn edge() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(u64::from(u32::MAX)),
            Just(u64::MAX - 1),
            Just(u64::MAX),
            any::<u64>(),
        ]
    }

    fn descriptor(len: u64) -> Vec<u8> {
        let mut bytes = [0u8; DESC_LEN];
        RegionDesc {
            key: 7,
            addr: 0x1000,
            len,
            access: Access::READ,
        }
        .encode(&mut bytes);
        bytes.to_vec()
    }

    proptest! {
        /// The transport part of a descriptor comes from the peer's message: any bytes,
        /// offset and length give a slice inside the descriptor's region or a status.
        #[test]
        fn arbitrary_descriptors_never_panic(
            remote in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..80),
                (edge(), any::<u8>()).prop_map(|(len, access)| {
                    let mut d = descriptor(len);
                    d[24] = access;
                    d
                }),
            ],
            offset in edge(),
            len in prop_oneof![0usize..4096, edge().prop_map(|v| v as usize)],
        ) {
            match slice(&remote, offset, len) {
                Ok(s) => {
                    prop_assert_eq!(remote.len(), DESC_LEN);
                    prop_assert_eq!(s.region, RegionDesc::decode(&remote).unwrap());
                    prop_assert_eq!((s.offset, s.len), (offset, len));
                    let end = offset.checked_add(len as u64);
                    prop_assert!(end.is_some_and(|end| end <= s.region.len));
                }
                Err(status) if remote.len() != DESC_LEN => {
                    prop_assert_eq!(status.code(), Code::INVALID_ARGUMENT);
                }
                Err(status) => prop_assert_eq!(status.code(), Code::OUT_OF_RANGE, "{}", status),
            }
        }

        #[test]
        fn descriptors_round_trip(key in any::<u64>(), addr in any::<u64>(), len in edge(), bits in 0u8..4) {
            let desc = RegionDesc { key, addr, len, access: Access::from_bits(bits) };
            let mut bytes = [0u8; DESC_LEN];
            desc.encode(&mut bytes);
            prop_assert_eq!(RegionDesc::decode(&bytes).unwrap(), desc);
            for cut in 0..DESC_LEN {
                prop_assert!(RegionDesc::decode(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn descriptors_of_the_wrong_length_are_invalid_arguments() {
        for remote in [
            vec![],
            descriptor(10)[..31].to_vec(),
            [descriptor(10), vec![0]].concat(),
        ] {
            let status = slice(&remote, 0, 1).unwrap_err();
            assert_eq!(status.code(), Code::INVALID_ARGUMENT);
            assert!(
                status.message().contains("not an RDMA region descriptor"),
                "{status}"
            );
        }
        assert_eq!(
            slice(&descriptor(u64::MAX), u64::MAX, 1)
                .unwrap_err()
                .code(),
            Code::OUT_OF_RANGE
        );
        assert!(slice(&descriptor(u64::MAX), u64::MAX - 1, 1).is_ok());
    }

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
