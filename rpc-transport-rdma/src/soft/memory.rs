//! Memory of the soft provider: [`SoftBuf`], a registered local buffer (plain heap
//! memory: cross-memory attach can reach any memory of the process, so registration
//! pins nothing), and [`Mem`], what a region exposes.

use std::ptr::NonNull;

use bytes::Bytes;

use crate::provider::Buffer;

/// A local buffer of the soft provider.
#[derive(Debug)]
pub struct SoftBuf {
    bytes: Box<[u8]>,
}

impl SoftBuf {
    pub(crate) fn zeroed(len: usize) -> SoftBuf {
        // `vec![0; n]` asks the allocator for zeroed memory: large buffers come from
        // fresh pages and cost nothing until touched.
        SoftBuf {
            bytes: vec![0u8; len].into_boxed_slice(),
        }
    }
}

impl Buffer for SoftBuf {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    fn into_bytes(self, len: usize) -> Bytes {
        let mut v = self.bytes.into_vec();
        v.truncate(len);
        Bytes::from(v)
    }
}

/// What a region exposes: bytes shared read-only without a copy, or a buffer the
/// peer may also write.
pub(crate) enum Mem {
    Shared(Bytes),
    Owned(OwnedMem),
}

impl Mem {
    pub(crate) fn addr(&self) -> u64 {
        match self {
            Mem::Shared(b) => b.as_ptr() as u64,
            Mem::Owned(m) => m.ptr.as_ptr() as u64,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Mem::Shared(b) => b.len(),
            Mem::Owned(m) => m.len,
        }
    }

    /// Copies `out.len()` bytes from `offset` (bounds checked by the caller's table
    /// lookup, and again here).
    pub(crate) fn read_into(&self, offset: usize, out: &mut [u8]) {
        match self {
            Mem::Shared(b) => out.copy_from_slice(&b[offset..][..out.len()]),
            Mem::Owned(m) => m.read_into(offset, out),
        }
    }

    /// Copies `data` to `offset`. Only owned memory is writable; the table never
    /// grants write access to shared bytes.
    pub(crate) fn write_from(&self, offset: usize, data: &[u8]) {
        if let Mem::Owned(m) = self {
            m.write_from(offset, data);
        }
    }
}

/// A heap buffer handed over to a region: the peer may write it (by cross-memory
/// attach, from another process, or through our responder task) while the region
/// is registered, so no Rust reference to its bytes exists meanwhile; it is only
/// touched through raw copies, and given back as a [`SoftBuf`] once revoked.
pub(crate) struct OwnedMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `OwnedMem` owns its allocation (like a `Box<[u8]>`) and is only accessed
// through raw copies, so moving it or sharing it between threads creates no Rust
// references to memory another thread may change.
#[allow(unsafe_code)]
unsafe impl Send for OwnedMem {}
// SAFETY: as above: `&OwnedMem` only allows raw copies. Concurrent copies into the
// same bytes are the data races RDMA allows too (the protocol orders them).
#[allow(unsafe_code)]
unsafe impl Sync for OwnedMem {}

impl OwnedMem {
    pub(crate) fn new(buf: SoftBuf) -> OwnedMem {
        let len = buf.bytes.len();
        let raw = Box::into_raw(buf.bytes);
        OwnedMem {
            // A boxed slice's pointer is never null (dangling but non-null when empty).
            ptr: NonNull::new(raw.cast::<u8>()).unwrap_or(NonNull::dangling()),
            len,
        }
    }

    fn read_into(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|end| end <= self.len),
            "read past the region"
        );
        #[allow(unsafe_code)]
        // SAFETY: the range lies in our allocation (checked above), which lives as long
        // as `self`; `out` is a distinct, exclusively borrowed buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }

    fn write_from(&self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|end| end <= self.len),
            "write past the region"
        );
        #[allow(unsafe_code)]
        // SAFETY: the range lies in our allocation (checked above), which lives as long
        // as `self`; no Rust reference to these bytes exists while they are exposed.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len());
        }
    }

    /// The buffer back, once nobody else can reach it.
    pub(crate) fn into_buf(self) -> SoftBuf {
        let this = std::mem::ManuallyDrop::new(self);
        #[allow(unsafe_code)]
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice in `new`, and
        // `this` is not dropped, so the box is rebuilt exactly once.
        let bytes = unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                this.ptr.as_ptr(),
                this.len,
            ))
        };
        SoftBuf { bytes }
    }
}

impl Drop for OwnedMem {
    fn drop(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: as in `into_buf`: the box made in `new`, freed once.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_memory_round_trips() {
        let mut buf = SoftBuf::zeroed(16);
        buf.as_mut_slice()[0] = 9;
        let mem = OwnedMem::new(buf);
        mem.write_from(4, &[1, 2]);
        let mut out = [0u8; 6];
        mem.read_into(0, &mut out);
        assert_eq!(out, [9, 0, 0, 0, 1, 2]);
        let buf = mem.into_buf();
        assert_eq!(&buf.as_slice()[..6], &[9, 0, 0, 0, 1, 2]);
        assert_eq!(buf.into_bytes(5).len(), 5);
    }
}
