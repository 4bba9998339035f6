//! Bulk transfer: expose a buffer, put its descriptor in a message, let the peer read
//! or write it directly. The same API on every transport.
//!
//! - [`Bulk::expose_read`] / [`Bulk::expose_write`] make an [`Exposed`] buffer and its
//!   [`BulkDescriptor`] (`descriptor().to_bytes()` goes into any message field).
//! - The peer, holding the descriptor, calls [`Bulk::read`] / [`Bulk::write`] (or
//!   [`Bulk::read_all`], which pipelines chunks) on its own side of the connection.
//! - Who serves those operations is the transport's business: on TCP, Unix sockets
//!   and UDP the **connection driver** answers BULK frames from the exposed buffer (the
//!   application's handler runs no code for them); on RDMA they are one-sided reads and
//!   writes of registered memory ([`OneSided`]).
//!
//! A descriptor is a capability scoped to the connection it was made on (on the client:
//! to the channel), bounded by its buffer's length and by a time to live, and revoked
//! when the [`Exposed`] is dropped: afterwards every operation through it fails with
//! `NOT_FOUND`. Reads of a write-only buffer, writes of a read-only one, and ranges past
//! the end fail with `PERMISSION_DENIED` and `OUT_OF_RANGE`; the connection stays up.
//!
//! A client gets its [`Bulk`] from [`Channel::bulk`](crate::client::Channel::bulk); a
//! server handler from [`Request::bulk`](crate::Request::bulk).

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::{sync::oneshot, time::Instant};

use crate::{Code, Status};

/// Largest piece one bulk operation moves; [`Bulk::read_all`] and
/// [`Bulk::write_all`] cut larger transfers into pieces of this size.
pub const MAX_BULK_OP: usize = 1 << 20;

/// Pieces [`Bulk::read_all`] and [`Bulk::write_all`] keep in flight.
pub const BULK_PIPELINE: usize = 8;

/// Default time an exposed buffer stays reachable.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// Most buffers one connection may have exposed at once.
pub const MAX_EXPOSED: usize = 4096;

/// What the peer may do with an exposed buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The peer may read it.
    Read,
    /// The peer may write it.
    Write,
}

/// Encoded length of a descriptor without transport data.
const DESCRIPTOR_LEN: usize = 2 + 8 + 8;

/// Where a peer finds an exposed buffer: a capability to put inside a message.
#[derive(Clone, PartialEq, Eq)]
pub struct BulkDescriptor {
    access: Access,
    token: u64,
    len: u64,
    /// Transport data for one-sided access (an RDMA region: address, key); empty for
    /// buffers served by the connection.
    remote: Bytes,
}

impl fmt::Debug for BulkDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkDescriptor")
            .field("access", &self.access)
            .field("len", &self.len)
            .field("one_sided", &!self.remote.is_empty())
            .finish_non_exhaustive()
    }
}

impl BulkDescriptor {
    /// The buffer's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the holder may do.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The bytes to put in a message: `[version=1][access][token u64][len u64][remote]`,
    /// big-endian.
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(DESCRIPTOR_LEN + self.remote.len());
        buf.put_u8(1);
        buf.put_u8(match self.access {
            Access::Read => 1,
            Access::Write => 2,
        });
        buf.put_u64(self.token);
        buf.put_u64(self.len);
        buf.put_slice(&self.remote);
        buf.freeze()
    }

    /// Parses the bytes of [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<BulkDescriptor, Status> {
        let bad = || Status::invalid_argument("not a bulk descriptor");
        if bytes.len() < DESCRIPTOR_LEN || bytes[0] != 1 {
            return Err(bad());
        }
        let access = match bytes[1] {
            1 => Access::Read,
            2 => Access::Write,
            _ => return Err(bad()),
        };
        let mut rest = &bytes[2..];
        let token = rest.get_u64();
        let len = rest.get_u64();
        Ok(BulkDescriptor {
            access,
            token,
            len,
            remote: Bytes::copy_from_slice(rest),
        })
    }
}

/// One-sided access to the peer's memory, for transports that have it (RDMA). The
/// connection's [`Bulk`] uses it instead of BULK frames when the link offers one.
pub trait OneSided: Send + Sync + 'static {
    /// Registers `data` for the peer to read; returns the transport part of the
    /// descriptor and a guard that deregisters it when dropped.
    fn expose_read(&self, data: Bytes) -> Result<(Bytes, Box<dyn Send + Sync>), Status>;

    /// Registers `len` bytes for the peer to write; returns the transport part of the
    /// descriptor, and a guard that deregisters it and gives the bytes written.
    fn expose_write(&self, len: usize) -> Result<(Bytes, Box<dyn WrittenRegion>), Status>;

    /// Reads `len` bytes at `offset` of the peer's region `remote`.
    fn read(
        &self,
        remote: &[u8],
        offset: u64,
        len: usize,
    ) -> Pin<Box<dyn Future<Output = Result<Bytes, Status>> + Send>>;

    /// Writes `data` at `offset` of the peer's region `remote`.
    fn write(
        &self,
        remote: &[u8],
        offset: u64,
        data: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;
}

/// A region the peer writes, exposed through a [`OneSided`] transport.
pub trait WrittenRegion: Send + Sync {
    /// Deregisters the region (waiting until no operation of the peer can still touch
    /// it) and returns its contents.
    fn take(self: Box<Self>) -> Pin<Box<dyn Future<Output = Bytes> + Send>>;
}

/// The buffers a connection has exposed, which its driver serves.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    next_token: AtomicU64,
    table: Mutex<HashMap<u64, RegionEntry>>,
}

#[derive(Debug)]
struct RegionEntry {
    data: RegionData,
    expires: Instant,
}

#[derive(Debug)]
enum RegionData {
    Read(Bytes),
    Write(BytesMut),
}

impl Regions {
    fn insert(&self, data: RegionData, ttl: Duration) -> Result<u64, Status> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        table.retain(|_, entry| entry.expires > now);
        if table.len() >= MAX_EXPOSED {
            return Err(Status::resource_exhausted(format!(
                "{MAX_EXPOSED} buffers are exposed on this connection already"
            )));
        }
        // Random (hashed from the process's random hasher keys, the time and a
        // counter), so that a peer cannot guess another buffer's token from its own.
        let n = self.next_token.fetch_add(1, Ordering::Relaxed);
        let token = (crate::frame::random_client_id() as u64) ^ n;
        table.insert(
            token,
            RegionEntry {
                data,
                expires: now + ttl,
            },
        );
        Ok(token)
    }

    /// Whether no buffer is exposed (expired ones not yet swept count).
    pub(crate) fn is_empty(&self) -> bool {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    fn remove(&self, token: u64) -> Option<RegionData> {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&token)
            .map(|entry| entry.data)
    }

    fn find<T>(
        &self,
        token: u64,
        f: impl FnOnce(&mut RegionData) -> Result<T, Status>,
    ) -> Result<T, Status> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let entry = table.get_mut(&token).ok_or_else(|| {
            Status::not_found("no such exposed buffer: revoked, expired, or never exposed here")
        })?;
        if entry.expires <= Instant::now() {
            table.remove(&token);
            return Err(Status::not_found("the exposed buffer expired"));
        }
        f(&mut entry.data)
    }

    /// Serves a peer's read of at most `max` bytes: a slice of the buffer, no copy.
    /// Checks in the order of `docs/wire.md` §6.11: the token, the access, the range,
    /// the size.
    pub(crate) fn serve_read(
        &self,
        token: u64,
        offset: u64,
        len: u32,
        max: usize,
    ) -> Result<Bytes, Status> {
        self.find(token, |data| match data {
            RegionData::Read(bytes) => {
                let (start, end) = range(offset, len, bytes.len())?;
                if len as usize > max {
                    return Err(Status::out_of_range(format!(
                        "a bulk read moves at most {max} bytes on this connection"
                    )));
                }
                Ok(bytes.slice(start..end))
            }
            RegionData::Write(_) => Err(Status::permission_denied(
                "the buffer is exposed for writing, not reading",
            )),
        })
    }

    /// Serves a peer's write: copies `data` into the buffer.
    pub(crate) fn serve_write(&self, token: u64, offset: u64, data: &[u8]) -> Result<(), Status> {
        self.find(token, |region| match region {
            RegionData::Write(buf) => {
                let len = u32::try_from(data.len())
                    .map_err(|_| Status::out_of_range("write too large"))?;
                let (start, end) = range(offset, len, buf.len())?;
                buf[start..end].copy_from_slice(data);
                Ok(())
            }
            RegionData::Read(_) => Err(Status::permission_denied(
                "the buffer is exposed for reading, not writing",
            )),
        })
    }
}

fn range(offset: u64, len: u32, size: usize) -> Result<(usize, usize), Status> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    match start.checked_add(len as usize) {
        Some(end) if end <= size => Ok((start, end)),
        _ => Err(Status::out_of_range(format!(
            "bytes {offset}..{} are outside the exposed {size} bytes",
            offset.saturating_add(u64::from(len))
        ))),
    }
}

/// One bulk operation a connection driver sends for the application.
pub(crate) struct BulkOp {
    pub(crate) token: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    /// `Some` for a write.
    pub(crate) data: Option<Bytes>,
    pub(crate) reply: oneshot::Sender<Result<Bytes, Status>>,
}

/// The status of a bulk operation on a connection whose link carries no BULK frames
/// (`Link::carries_bulk`): gRPC's wire.
pub(crate) fn not_carried(peer: &str) -> Status {
    Status::unimplemented(format!(
        "bulk transfer is not carried by the connection to {peer}: its wire (gRPC's \
         HTTP/2) has no such frames; use tcp://, unix://, tls://, udp:// or rdma://"
    ))
}

/// Hands a [`BulkOp`] to the connection's driver.
pub(crate) type OpSender = Arc<dyn Fn(BulkOp) -> Result<(), BulkOp> + Send + Sync>;

/// A connection's bulk endpoint. Cheap to clone (one reference count).
#[derive(Clone)]
pub struct Bulk {
    inner: Arc<BulkInner>,
}

struct BulkInner {
    regions: Arc<Regions>,
    send: OpSender,
    one_sided: OneSidedSlot,
    /// Largest piece one operation moves on this connection.
    max_op: usize,
}

/// Most bytes [`Bulk::read_all`] sets aside before they arrive; past it, its buffer
/// grows as they do.
pub const READ_AHEAD: usize = 64 << 20;

/// The largest piece a connection with frames of at most `max_frame_len` bytes moves
/// in one operation: [`MAX_BULK_OP`], or less so that a piece and its frame header
/// fit one frame.
pub fn max_op(max_frame_len: usize) -> usize {
    MAX_BULK_OP.min(max_frame_len.saturating_sub(64)).max(1)
}

impl fmt::Debug for Bulk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulk")
            .field("one_sided", &self.transport().is_some())
            .finish_non_exhaustive()
    }
}

/// An exposed buffer. Dropping it revokes the descriptor.
pub struct Exposed {
    descriptor: BulkDescriptor,
    regions: Arc<Regions>,
    /// The one-sided registration, if the transport has one: shared with the timer
    /// that revokes it when the time to live runs out.
    guard: Option<Arc<Mutex<Option<Guard>>>>,
    expiry: Option<tokio::task::AbortHandle>,
}

enum Guard {
    Read(#[allow(dead_code)] Box<dyn Send + Sync>),
    Write(Box<dyn WrittenRegion>),
}

impl fmt::Debug for Exposed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exposed")
            .field("descriptor", &self.descriptor)
            .finish_non_exhaustive()
    }
}

impl Exposed {
    /// The descriptor to send to the peer.
    pub fn descriptor(&self) -> &BulkDescriptor {
        &self.descriptor
    }

    /// Revokes the descriptor and returns the buffer's contents: for a buffer exposed
    /// for writing, what the peer wrote (zeros where it wrote nothing).
    /// After the time to live ran out, a one-sided buffer is gone: empty bytes.
    pub async fn into_bytes(mut self) -> Bytes {
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        let guard = self
            .guard
            .take()
            .map(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take());
        match guard {
            Some(Some(Guard::Write(region))) => region.take().await,
            Some(_) => Bytes::new(),
            None => match self.regions.remove(self.descriptor.token) {
                Some(RegionData::Read(bytes)) => bytes,
                Some(RegionData::Write(buf)) => buf.freeze(),
                None => Bytes::new(),
            },
        }
    }
}

impl Drop for Exposed {
    fn drop(&mut self) {
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        // Revoke now: the expiry timer may still hold the slot until it is cancelled.
        if let Some(slot) = self.guard.take() {
            let guard = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(guard);
        }
        self.regions.remove(self.descriptor.token);
    }
}

impl Bulk {
    pub(crate) fn new(
        regions: Arc<Regions>,
        send: OpSender,
        one_sided: OneSidedSlot,
        max_frame_len: usize,
    ) -> Bulk {
        Bulk {
            inner: Arc::new(BulkInner {
                regions,
                send,
                one_sided,
                max_op: max_op(max_frame_len),
            }),
        }
    }

    /// The largest piece one [`read`](Self::read) or [`write`](Self::write) moves on
    /// this connection: [`MAX_BULK_OP`], or less when the frame limit is smaller.
    pub fn max_op(&self) -> usize {
        self.inner.max_op
    }

    fn transport(&self) -> Option<Arc<dyn OneSided>> {
        self.inner
            .one_sided
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether buffers are read and written one-sided (RDMA) on this connection,
    /// rather than served by the connection's driver.
    pub fn is_one_sided(&self) -> bool {
        self.transport().is_some()
    }

    /// Exposes `data` for the peer to read, for `ttl` at most.
    pub fn expose_read(&self, data: Bytes, ttl: Duration) -> Result<Exposed, Status> {
        let len = data.len() as u64;
        if let Some(one_sided) = self.transport() {
            let (remote, guard) = one_sided.expose_read(data)?;
            return Ok(self.exposed(
                Access::Read,
                0,
                len,
                remote,
                Some((Guard::Read(guard), ttl)),
            ));
        }
        let token = self.inner.regions.insert(RegionData::Read(data), ttl)?;
        Ok(self.exposed(Access::Read, token, len, Bytes::new(), None))
    }

    /// Exposes `len` zeroed bytes for the peer to write, for `ttl` at most; read them
    /// with [`Exposed::into_bytes`].
    pub fn expose_write(&self, len: usize, ttl: Duration) -> Result<Exposed, Status> {
        if let Some(one_sided) = self.transport() {
            let (remote, guard) = one_sided.expose_write(len)?;
            return Ok(self.exposed(
                Access::Write,
                0,
                len as u64,
                remote,
                Some((Guard::Write(guard), ttl)),
            ));
        }
        let token = self
            .inner
            .regions
            .insert(RegionData::Write(BytesMut::zeroed(len)), ttl)?;
        Ok(self.exposed(Access::Write, token, len as u64, Bytes::new(), None))
    }

    fn exposed(
        &self,
        access: Access,
        token: u64,
        len: u64,
        remote: Bytes,
        guard: Option<(Guard, Duration)>,
    ) -> Exposed {
        // A one-sided registration is revoked by a timer when its time runs out (the
        // table of connection-served buffers checks expiry on each access instead).
        let (guard, expiry) = match guard {
            None => (None, None),
            Some((guard, ttl)) => {
                let slot = Arc::new(Mutex::new(Some(guard)));
                let timer = slot.clone();
                let expiry = tokio::runtime::Handle::try_current().ok().map(|runtime| {
                    runtime
                        .spawn(async move {
                            tokio::time::sleep(ttl).await;
                            let expired = timer.lock().unwrap_or_else(|e| e.into_inner()).take();
                            drop(expired);
                        })
                        .abort_handle()
                });
                (Some(slot), expiry)
            }
        };
        Exposed {
            descriptor: BulkDescriptor {
                access,
                token,
                len,
                remote,
            },
            regions: self.inner.regions.clone(),
            guard,
            expiry,
        }
    }

    /// Reads `len` bytes (at most [`MAX_BULK_OP`]) at `offset` of the peer's buffer.
    ///
    /// An operation has no deadline of its own (a peer that never answers it holds it
    /// for as long as the connection lives): wrap it in `tokio::time::timeout` if the
    /// peer may not answer; a dropped operation is forgotten. Writes alike.
    pub async fn read(
        &self,
        descriptor: &BulkDescriptor,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, Status> {
        if len > self.inner.max_op {
            return Err(Status::invalid_argument(format!(
                "one bulk read moves at most {} bytes here; use read_all",
                self.inner.max_op
            )));
        }
        let data = if !descriptor.remote.is_empty() {
            let one_sided = self.one_sided()?;
            one_sided.read(&descriptor.remote, offset, len).await?
        } else {
            self.op(descriptor.token, offset, len as u32, None).await?
        };
        // The peer answers the read: what it sent must be what was asked for.
        if data.len() != len {
            return Err(Status::internal(format!(
                "a bulk read of {len} bytes at offset {offset} was answered with {} bytes",
                data.len()
            )));
        }
        Ok(data)
    }

    /// Writes `data` (at most [`MAX_BULK_OP`] bytes) at `offset` of the peer's buffer.
    pub async fn write(
        &self,
        descriptor: &BulkDescriptor,
        offset: u64,
        data: Bytes,
    ) -> Result<(), Status> {
        if data.len() > self.inner.max_op {
            return Err(Status::invalid_argument(format!(
                "one bulk write moves at most {} bytes here; use write_all",
                self.inner.max_op
            )));
        }
        if !descriptor.remote.is_empty() {
            let one_sided = self.one_sided()?;
            return one_sided.write(&descriptor.remote, offset, data).await;
        }
        let len = data.len() as u32;
        self.op(descriptor.token, offset, len, Some(data))
            .await
            .map(|_| ())
    }

    fn one_sided(&self) -> Result<Arc<dyn OneSided>, Status> {
        self.transport().ok_or_else(|| {
            Status::failed_precondition(
                "the descriptor is for one-sided access, which this connection's transport lacks",
            )
        })
    }

    async fn op(
        &self,
        token: u64,
        offset: u64,
        len: u32,
        data: Option<Bytes>,
    ) -> Result<Bytes, Status> {
        let (reply, rx) = oneshot::channel();
        let op = BulkOp {
            token,
            offset,
            len,
            data,
            reply,
        };
        if (self.inner.send)(op).is_err() {
            return Err(Status::unavailable("the connection is gone"));
        }
        rx.await
            .unwrap_or_else(|_| Err(Status::unavailable("the connection is gone")))
    }

    /// Reads the whole buffer, [`BULK_PIPELINE`] pieces at a time.
    ///
    /// The buffer's length is the one its descriptor gives, which came from the peer:
    /// check [`BulkDescriptor::len`] against what you are willing to hold before
    /// calling this. Memory is taken as the bytes arrive (at most [`READ_AHEAD`] before
    /// any has), so a descriptor claiming more than the peer sends costs nothing.
    pub async fn read_all(&self, descriptor: &BulkDescriptor) -> Result<Bytes, Status> {
        use futures::StreamExt;
        let total = usize::try_from(descriptor.len)
            .map_err(|_| Status::out_of_range("buffer too large for this host"))?;
        let mut out = BytesMut::with_capacity(total.min(READ_AHEAD));
        let piece = self.inner.max_op;
        let mut pieces = futures::stream::iter((0..total).step_by(piece))
            .map(|start| {
                let len = (total - start).min(piece);
                self.read(descriptor, start as u64, len)
            })
            .buffered(BULK_PIPELINE);
        while let Some(piece) = pieces.next().await {
            out.extend_from_slice(&piece?);
        }
        Ok(out.freeze())
    }

    /// Writes `data` from the start of the buffer, [`BULK_PIPELINE`] pieces at a time.
    pub async fn write_all(&self, descriptor: &BulkDescriptor, data: Bytes) -> Result<(), Status> {
        use futures::{StreamExt, TryStreamExt};
        if data.len() as u64 > descriptor.len {
            return Err(Status::out_of_range(format!(
                "{} bytes do not fit the exposed {} bytes",
                data.len(),
                descriptor.len
            )));
        }
        let piece = self.inner.max_op;
        futures::stream::iter((0..data.len()).step_by(piece))
            .map(|start| {
                let end = (start + piece).min(data.len());
                self.write(descriptor, start as u64, data.slice(start..end))
            })
            .buffered(BULK_PIPELINE)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }
}

/// The transport's one-sided access, once the connection has one (set by the driver
/// when its link offers it).
pub(crate) type OneSidedSlot = Arc<std::sync::RwLock<Option<Arc<dyn OneSided>>>>;

/// Operations in flight past which a new one first forgets those their callers
/// dropped.
const FORGET_ABANDONED_PAST: usize = 64;

/// One connection's bulk operations in flight, and the serving of the peer's.
#[derive(Default)]
pub(crate) struct BulkEnd {
    next_id: u64,
    pending: HashMap<u64, oneshot::Sender<Result<Bytes, Status>>>,
    /// Operations in flight at which the next send forgets the abandoned ones.
    forget_at: usize,
}

impl BulkEnd {
    /// Encodes `op`'s BULK frame header into `buf` (cleared) and records the op;
    /// returns the payload to send.
    pub(crate) fn send(&mut self, op: BulkOp, buf: &mut BytesMut) -> crate::Payload {
        if self.pending.len() >= self.forget_at.max(FORGET_ABANDONED_PAST) {
            // Operations their callers dropped (a timeout around one the peer never
            // answers): forgotten, so that they pile up no further. Next when the map
            // has doubled again: a look per operation would be quadratic with many
            // live ones.
            self.pending.retain(|_, tx| !tx.is_closed());
            self.forget_at = self.pending.len() * 2;
        }
        self.next_id += 1;
        let id = self.next_id;
        buf.clear();
        crate::frame::encode_bulk_header(buf, id, op.data.is_some(), op.token, op.offset, op.len);
        self.pending.insert(id, op.reply);
        op.data.map(crate::Payload::from).unwrap_or_default()
    }

    /// Completes the operation a reply answers (an unknown id is ignored).
    pub(crate) fn on_reply(&mut self, reply: crate::frame::BulkReplyFrame) {
        if let Some(tx) = self.pending.remove(&reply.id) {
            let result = if reply.code == Code::OK {
                Ok(reply.data)
            } else {
                Err(Status::new(reply.code, reply.message.as_str()))
            };
            let _ = tx.send(result);
        }
    }

    /// Fails every operation in flight (the connection is gone).
    pub(crate) fn fail_all(&mut self, why: &str) {
        for (_, tx) in self.pending.drain() {
            let _ = tx.send(Err(Status::unavailable(format!(
                "bulk operation lost with its connection: {why}"
            ))));
        }
    }

    /// Whether no operation is in flight that a caller still waits for: one whose
    /// caller gave up (dropped it) does not keep the connection from being idle (and
    /// so pinging its peer, and alive after the last channel is dropped).
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.values().all(oneshot::Sender::is_closed)
    }
}

/// Serves a peer's BULK frame from `regions`: the BULK_REPLY to send, header and
/// payload.
pub(crate) fn serve(
    regions: &Regions,
    frame: crate::frame::BulkFrame,
    max_frame_len: usize,
) -> (BytesMut, crate::Payload) {
    let result = if frame.write {
        regions
            .serve_write(frame.token, frame.offset, &frame.data)
            .map(|()| Bytes::new())
    } else {
        regions.serve_read(frame.token, frame.offset, frame.len, max_op(max_frame_len))
    };
    let mut buf = BytesMut::new();
    match result {
        Ok(data) => {
            crate::frame::encode_bulk_reply_header(&mut buf, frame.id, Code::OK, "");
            (buf, crate::Payload::from(data))
        }
        Err(status) => {
            crate::frame::encode_bulk_reply_header(
                &mut buf,
                frame.id,
                status.code(),
                status.message(),
            );
            (buf, crate::Payload::new())
        }
    }
}

#[cfg(test)]
mod tests {
    /// Operations whose callers gave up (a timeout around one the peer never answers)
    /// neither keep the connection busy nor pile up (they did both, from a review: a
    /// connection whose peer ignored one BULK kept pinging it, and lived on after its
    /// last channel was dropped).
    #[test]
    fn abandoned_operations_are_forgotten() {
        let mut end = BulkEnd::default();
        let mut buf = BytesMut::new();
        let op = |reply| BulkOp {
            token: 1,
            offset: 0,
            len: 10,
            data: None,
            reply,
        };
        let (tx, rx) = oneshot::channel();
        end.send(op(tx), &mut buf);
        assert!(!end.is_idle(), "its caller waits");
        drop(rx);
        assert!(end.is_idle(), "its caller gave up");
        for _ in 0..1000 {
            let (tx, _) = oneshot::channel();
            end.send(op(tx), &mut buf);
        }
        assert!(
            end.pending.len() <= FORGET_ABANDONED_PAST + 1,
            "{}",
            end.pending.len()
        );
    }

    use super::*;

    #[test]
    fn descriptors_round_trip_and_garbage_is_refused() {
        let d = BulkDescriptor {
            access: Access::Write,
            token: 42,
            len: 1 << 40,
            remote: Bytes::from_static(b"rkey"),
        };
        assert_eq!(BulkDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
        assert!(BulkDescriptor::from_bytes(b"short").is_err());
        let mut bad = d.to_bytes().to_vec();
        bad[1] = 9;
        assert!(BulkDescriptor::from_bytes(&bad).is_err());
    }

    #[test]
    fn regions_check_access_bounds_and_revocation() {
        let regions = Regions::default();
        let read = regions
            .insert(RegionData::Read(Bytes::from_static(b"hello")), DEFAULT_TTL)
            .unwrap();
        let write = regions
            .insert(RegionData::Write(BytesMut::zeroed(4)), DEFAULT_TTL)
            .unwrap();
        assert_eq!(regions.serve_read(read, 1, 3, MAX_BULK_OP).unwrap(), "ell");
        assert_eq!(
            regions
                .serve_read(read, 3, 3, MAX_BULK_OP)
                .unwrap_err()
                .code(),
            Code::OUT_OF_RANGE
        );
        assert_eq!(
            regions
                .serve_read(read, u64::MAX, 1, MAX_BULK_OP)
                .unwrap_err()
                .code(),
            Code::OUT_OF_RANGE
        );
        assert_eq!(
            regions.serve_write(read, 0, b"x").unwrap_err().code(),
            Code::PERMISSION_DENIED
        );
        assert_eq!(
            regions
                .serve_read(write, 0, 1, MAX_BULK_OP)
                .unwrap_err()
                .code(),
            Code::PERMISSION_DENIED
        );
        regions.serve_write(write, 2, b"ab").unwrap();
        regions.remove(read);
        assert_eq!(
            regions
                .serve_read(read, 0, 1, MAX_BULK_OP)
                .unwrap_err()
                .code(),
            Code::NOT_FOUND
        );
        let Some(RegionData::Write(buf)) = regions.remove(write) else {
            panic!("the write region");
        };
        assert_eq!(&buf[..], b"\0\0ab");
    }

    /// A peer answers each read with `extra` bytes more than were asked for (or fewer,
    /// negative), from a buffer it claims is `len` bytes long.
    fn answering(extra: isize) -> Bulk {
        let send: OpSender = Arc::new(move |op: BulkOp| {
            let n = (op.len as isize + extra).max(0) as usize;
            let _ = op.reply.send(Ok(Bytes::from(vec![7u8; n])));
            Ok(())
        });
        Bulk::new(Arc::default(), send, OneSidedSlot::default(), 16 << 20)
    }

    fn claiming(len: u64) -> BulkDescriptor {
        BulkDescriptor {
            access: Access::Read,
            token: 1,
            len,
            remote: Bytes::new(),
        }
    }

    #[tokio::test]
    async fn a_read_answered_with_the_wrong_length_fails() {
        for extra in [-1, 1, 1000] {
            let status = answering(extra)
                .read_all(&claiming(10_000))
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::INTERNAL, "{status}");
            assert!(status.message().contains("answered with"), "{status}");
        }
        let exact = answering(0).read_all(&claiming(10_000)).await.unwrap();
        assert_eq!(exact.len(), 10_000);
    }

    /// A descriptor from the peer that claims a terabyte takes no terabyte before the
    /// bytes come: the first piece that does not come fails the read.
    #[tokio::test]
    async fn a_huge_claimed_length_is_not_set_aside() {
        let send: OpSender = Arc::new(|op: BulkOp| {
            let answer = if op.offset == 0 {
                Ok(Bytes::from(vec![0u8; op.len as usize]))
            } else {
                Err(Status::out_of_range("past the end"))
            };
            let _ = op.reply.send(answer);
            Ok(())
        });
        let bulk = Bulk::new(Arc::default(), send, OneSidedSlot::default(), 16 << 20);
        let status = bulk.read_all(&claiming(1 << 40)).await.unwrap_err();
        assert_eq!(status.code(), Code::OUT_OF_RANGE, "{status}");
    }
}
