//! The provider interface: what the link needs from an RDMA implementation, and
//! nothing more.
//!
//! An [`Endpoint`] is one reliable connection (a queue pair, in verbs terms) with:
//!
//! - **registered memory**: [`Endpoint::alloc`] gives a local [`Buffer`] the endpoint
//!   may use in any operation (verbs cannot register memory it did not allocate, so
//!   buffers come from the endpoint, and callers pool them);
//!   [`Endpoint::expose`] and [`Endpoint::register`] make a [`Region`] the peer may
//!   read (and write) through its [`RegionDesc`]: a remote key, an address, a length
//!   and the access rights. Dropping the region deregisters it: later accesses with
//!   its descriptor are refused.
//! - **two-sided messages**: [`Endpoint::post_send`] sends the first bytes of a
//!   buffer; the peer receives them into one of the buffers it posted with
//!   [`Endpoint::post_recv`]. A message that finds no posted buffer is an error of the
//!   receiving connection (receiver not ready): the user of the interface must give
//!   the sender credits, as the link does.
//! - **one-sided operations**: [`Endpoint::post_read`] copies a part of a remote
//!   region into a local buffer, [`Endpoint::post_write`] copies a local buffer into
//!   a remote region. The remote application runs no code for either.
//! - **completions matched by id**: every `post_*` names a work-request id; the
//!   operation's [`Completion`] carries the id back, with the buffer (ownership of a
//!   buffer passes to the endpoint while it is posted, so nothing can touch memory an
//!   operation is using) and the outcome.
//! - **a [`Handle`]** for one-sided operations from other tasks (bulk transfers,
//!   while the link's task owns the endpoint): each completes to its caller, never
//!   into the endpoint's completions.
//! - **refusals**: a one-sided access the owner refuses fails with an error of kind
//!   `Protocol` whose [`Refusal`] (unknown key, revoked, out of bounds, denied) is
//!   readable with [`Refusal::of`].
//!
//! Receive buffers: an endpoint posts [`Endpoint::recv_buffers`] receive buffers of
//! [`Endpoint::recv_buffer_len`] bytes when the connection is set up, before the peer
//! can send, with work-request ids `0..recv_buffers`; their completions hand them
//! back, and the user posts them again.

use std::{
    fmt,
    future::Future,
    ops::BitOr,
    task::{Context, Poll},
};

use bytes::Bytes;
use rpc_core::{Error, ErrorKind};

/// Rights a region grants the peer. Local access is always allowed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No remote access.
    pub const NONE: Access = Access(0);
    /// The peer may read the region (RDMA READ).
    pub const READ: Access = Access(1);
    /// The peer may write the region (RDMA WRITE).
    pub const WRITE: Access = Access(2);
    /// Both.
    pub const READ_WRITE: Access = Access(3);

    /// Whether every right in `other` is granted.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The rights as bits (read = 1, write = 2), as they go on the wire.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Rights from their bits; unknown bits are dropped.
    pub fn from_bits(bits: u8) -> Access {
        Access(bits & 3)
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            0 => "none",
            1 => "read",
            2 => "write",
            _ => "read+write",
        })
    }
}

/// Bytes of an encoded [`RegionDesc`].
pub const DESC_LEN: usize = 32;

/// What the peer needs to reach a region: put it in a message. The owner checks the
/// key, the bounds and the rights of every access against its own table; a
/// descriptor is not trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionDesc {
    /// The remote key (soft: slot index and generation; verbs: the rkey).
    pub key: u64,
    /// The region's address in the owner's memory.
    pub addr: u64,
    /// The region's length in bytes.
    pub len: u64,
    /// The rights the owner granted.
    pub access: Access,
}

impl RegionDesc {
    /// Writes the descriptor: key, address and length as big-endian u64s, the access
    /// bits in one byte, then seven zero bytes.
    pub fn encode(&self, out: &mut [u8; DESC_LEN]) {
        out[0..8].copy_from_slice(&self.key.to_be_bytes());
        out[8..16].copy_from_slice(&self.addr.to_be_bytes());
        out[16..24].copy_from_slice(&self.len.to_be_bytes());
        out[24] = self.access.bits();
        out[25..].fill(0);
    }

    /// Reads a descriptor written by [`encode`](RegionDesc::encode).
    pub fn decode(bytes: &[u8]) -> Result<RegionDesc, Error> {
        let Some(bytes) = bytes.get(..DESC_LEN) else {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "region descriptor of {} bytes, expected {DESC_LEN}",
                    bytes.len()
                ),
            ));
        };
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_be_bytes(w)
        };
        Ok(RegionDesc {
            key: word(0),
            addr: word(8),
            len: word(16),
            access: Access::from_bits(bytes[24]),
        })
    }

    /// `len` bytes of the region from `offset`, checked against the descriptor (the
    /// owner checks again against its table).
    pub fn slice(&self, offset: u64, len: usize) -> Result<RemoteSlice, Error> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > self.len) {
            return Err(out_of_bounds(offset, len, self.len));
        }
        Ok(RemoteSlice {
            region: *self,
            offset,
            len,
        })
    }
}

/// A part of a remote region: what a one-sided operation reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSlice {
    /// The region.
    pub region: RegionDesc,
    /// Offset in the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: usize,
}

pub(crate) fn out_of_bounds(offset: u64, len: usize, region_len: u64) -> Error {
    Refused::error(
        Refusal::OutOfBounds,
        format!(
            "remote access out of bounds: {len} bytes at offset {offset} of a region of \
             {region_len} bytes"
        ),
    )
}

/// Why a one-sided access was refused: by the region's owner (its table, or its
/// responder), or by the requester's own check of the descriptor's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// No region has this key (never registered there, or a forged key).
    UnknownKey,
    /// The region was deregistered.
    Revoked,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the access (a write to a read-only region, a read of
    /// a write-only one).
    Denied,
}

impl Refusal {
    /// Why `err` was refused, if it is a refused one-sided access.
    pub fn of(err: &Error) -> Option<Refusal> {
        std::error::Error::source(err)
            .and_then(|source| source.downcast_ref::<Refused>())
            .map(Refused::reason)
    }
}

/// A refused one-sided access: the source of the operation's [`Error`] (of kind
/// [`Protocol`](ErrorKind::Protocol)), so that callers can tell why without parsing
/// the message ([`Refusal::of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    reason: Refusal,
    detail: String,
}

impl Refused {
    /// The error of an access refused for `reason`; `detail` says which access.
    pub(crate) fn error(reason: Refusal, detail: String) -> Error {
        Error::new(ErrorKind::Protocol, "one-sided access refused")
            .with_source(Refused { reason, detail })
    }

    /// Why.
    pub fn reason(&self) -> Refusal {
        self.reason
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Refused {}

/// Local memory registered with an endpoint.
pub trait Buffer: Send + Unpin + 'static {
    /// Length in bytes.
    fn len(&self) -> usize;

    /// Whether the buffer has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes.
    fn as_slice(&self) -> &[u8];

    /// The bytes, writable.
    fn as_mut_slice(&mut self) -> &mut [u8];

    /// The first `len` bytes as [`Bytes`] (without a copy where the provider can).
    fn into_bytes(self, len: usize) -> Bytes;
}

/// A region the peer may access through its [`desc`](Region::desc). Dropping it
/// deregisters it.
pub trait Region: Send + Sync + Unpin + 'static {
    /// The descriptor to send to the peer.
    fn desc(&self) -> RegionDesc;
}

/// What an operation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A two-sided send.
    Send,
    /// A message received into a posted buffer.
    Recv,
    /// A one-sided read.
    Read,
    /// A one-sided write.
    Write,
}

/// The outcome of one posted operation.
#[derive(Debug)]
pub struct Completion<B> {
    /// The work-request id given when posting.
    pub wr: u64,
    /// The operation.
    pub op: Op,
    /// The buffer given when posting, handed back.
    pub buf: B,
    /// Bytes moved (for a receive: the message length), or why the operation failed.
    /// A failed one-sided operation (a wrong key, an access out of bounds or without
    /// the right) leaves the soft provider's connection usable; on verbs hardware it
    /// breaks the queue pair, and the next operations fail too.
    pub result: Result<usize, Error>,
}

/// What a provider can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Whether an unsignaled send produces no completion (its buffer is free once a
    /// later signaled send completes). Neither provider here supports it: soft has no
    /// notion of signaling, and async-rdma signals every work request.
    pub selective_signaling: bool,
    /// Whether one-sided operations on this connection run without any code of the
    /// peer process (true for hardware and for the soft provider's cross-memory
    /// attach; false when the soft provider's responder serves them).
    pub one_sided_without_peer_cpu: bool,
}

/// One connection of a provider. See the [module docs](self).
pub trait Endpoint: Send + Unpin + 'static {
    /// Registered local memory.
    type Buf: Buffer;
    /// Memory exposed to the peer.
    type Region: Region;
    /// One-sided operations from other tasks: see [`handle`](Endpoint::handle).
    type Handle: Handle<Buf = Self::Buf, Region = Self::Region>;

    /// What this provider can do on this connection.
    fn caps(&self) -> Caps;

    /// How many receive buffers the endpoint posted at setup (ids `0..n`).
    fn recv_buffers(&self) -> usize;

    /// The length of each receive buffer: the longest message the peer may send us.
    fn recv_buffer_len(&self) -> usize;

    /// New registered local memory of `len` bytes, zeroed. Registration may be slow:
    /// pool buffers rather than allocate per operation.
    fn alloc(&self, len: usize) -> Result<Self::Buf, Error>;

    /// Exposes `bytes` to the peer for reading. The soft provider exposes the bytes
    /// where they are; verbs copies them into registered memory.
    fn expose(&self, bytes: Bytes) -> Result<Self::Region, Error>;

    /// Exposes a buffer with `access` rights.
    fn register(&self, buf: Self::Buf, access: Access) -> Result<Self::Region, Error>;

    /// Posts a receive buffer.
    fn post_recv(&mut self, wr: u64, buf: Self::Buf) -> Result<(), Error>;

    /// Sends `buf[..len]` to the peer. `signaled` asks for a completion; see
    /// [`Caps::selective_signaling`].
    fn post_send(
        &mut self,
        wr: u64,
        buf: Self::Buf,
        len: usize,
        signaled: bool,
    ) -> Result<(), Error>;

    /// Reads `src` into `dst[dst_offset..dst_offset + src.len]`.
    fn post_read(
        &mut self,
        wr: u64,
        dst: Self::Buf,
        dst_offset: usize,
        src: RemoteSlice,
    ) -> Result<(), Error>;

    /// Writes `src[src_offset..src_offset + dst.len]` into `dst`.
    fn post_write(
        &mut self,
        wr: u64,
        src: Self::Buf,
        src_offset: usize,
        dst: RemoteSlice,
    ) -> Result<(), Error>;

    /// The next completion. An error means the connection is gone (of kind
    /// [`Closed`](ErrorKind::Closed) when the peer closed it); every operation still
    /// posted has completed with an error before.
    fn poll_completion(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Completion<Self::Buf>, Error>>;

    /// Sends everything posted and closes the sending side.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>;

    /// The peer, for logs and errors.
    fn peer(&self) -> String;

    /// A handle for one-sided operations on this connection from any task, each
    /// completing to its caller rather than into this endpoint's completions (what
    /// bulk transfers use while the link's task owns the endpoint).
    fn handle(&self) -> Self::Handle;
}

/// One-sided operations on an endpoint's connection, from any task: registered
/// memory, regions, and reads and writes of the peer's regions whose completions go
/// to the caller (the endpoint's own completion queue never sees them). Cheap to
/// clone. Operations fail once the connection is gone.
pub trait Handle: Clone + Send + Sync + 'static {
    /// Registered local memory (the endpoint's).
    type Buf: Buffer;
    /// Memory exposed to the peer (the endpoint's).
    type Region: Region;

    /// As [`Endpoint::alloc`].
    fn alloc(&self, len: usize) -> Result<Self::Buf, Error>;

    /// As [`Endpoint::expose`].
    fn expose(&self, bytes: Bytes) -> Result<Self::Region, Error>;

    /// As [`Endpoint::register`].
    fn register(&self, buf: Self::Buf, access: Access) -> Result<Self::Region, Error>;

    /// Reads `src` into `dst[dst_offset..dst_offset + src.len]`; gives `dst` back.
    fn read(
        &self,
        dst: Self::Buf,
        dst_offset: usize,
        src: RemoteSlice,
    ) -> impl Future<Output = Result<Self::Buf, Error>> + Send;

    /// Writes `src[src_offset..src_offset + dst.len]` into `dst`.
    fn write(
        &self,
        src: Self::Buf,
        src_offset: usize,
        dst: RemoteSlice,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deregisters `region` and, once no operation of the peer can still touch it,
    /// gives back its memory with what the peer wrote (`None` for exposed bytes, and
    /// when a peer stopped mid-operation keeps it: the soft provider's
    /// `REVOKE_PATIENCE`).
    fn revoke(&self, region: Self::Region) -> impl Future<Output = Option<Self::Buf>> + Send;
}

/// Checks that `[offset, offset + len)` lies in a buffer of `buf_len` bytes.
pub(crate) fn check_local(offset: usize, len: usize, buf_len: usize) -> Result<(), Error> {
    if offset.checked_add(len).is_none_or(|end| end > buf_len) {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "local buffer too small: {len} bytes at offset {offset} of a buffer of \
                 {buf_len} bytes"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_short_input_is_an_error() {
        let desc = RegionDesc {
            key: 0x1122_3344_5566_7788,
            addr: 0xdead_beef,
            len: 4096,
            access: Access::READ_WRITE,
        };
        let mut buf = [0u8; DESC_LEN];
        desc.encode(&mut buf);
        assert_eq!(RegionDesc::decode(&buf).unwrap(), desc);
        assert!(RegionDesc::decode(&buf[..31]).is_err());
    }

    #[test]
    fn slices_are_checked_against_the_descriptor() {
        let desc = RegionDesc {
            key: 1,
            addr: 0,
            len: 100,
            access: Access::READ,
        };
        assert!(desc.slice(0, 100).is_ok());
        assert!(desc.slice(100, 0).is_ok());
        assert!(desc.slice(1, 100).is_err());
        assert!(desc.slice(u64::MAX, 2).is_err());
        assert!(Access::READ_WRITE.contains(Access::WRITE));
        assert!(!Access::READ.contains(Access::WRITE));
    }
}
