//! The soft provider: RDMA semantics over a byte stream, on any Linux machine.
//!
//! - **Messages** (two-sided) travel as packets on a Unix socket or a TCP connection
//!   and land in the receive buffers the receiver posted, in order; a message that
//!   finds no posted buffer, or a buffer too short, fails the receiving connection,
//!   as a receiver-not-ready error does on hardware with no retries.
//! - **One-sided reads and writes** between processes on one host copy the peer's
//!   memory directly with cross-memory attach (`process_vm_readv`/`writev`), after
//!   checking the key, bounds and rights in the peer's region table, which the peer
//!   shares as a memfd (see `table`). The peer runs no code for them. Across hosts, or
//!   when the kernel refuses to attach (another user, a ptrace policy), a responder
//!   task inside the peer's transport serves them over the connection, with the same
//!   checks, as software iWARP does.
//! - **Registration** is an entry in the region table: no system call, no pinning.
//!   [`SoftEndpoint::expose`] exposes [`Bytes`] where they are, without a copy.
//! - **No signaling**: every operation completes; there are no unsignaled sends.
//! - **Other tasks' one-sided operations** ([`SoftHandle`], for bulk transfers) carry
//!   their own reply channel to the worker or the driver, so their completions bypass
//!   the endpoint's queue.
//!
//! The packets are in `packet`; [`SoftEndpoint`] implements the
//! [`Endpoint`] interface.

mod driver;
#[cfg(any(fuzzing, test))]
pub(crate) mod fuzzing;
mod memory;
mod packet;
mod sys;
mod table;

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use rpc_core::{Error, ErrorKind};
use rpc_transport_tcp::Stream;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{mpsc, oneshot},
    task::AbortHandle,
};

pub use memory::SoftBuf;

use self::{
    driver::{CmaOp, Cmd, Event, RemoteKind},
    memory::{Mem, OwnedMem},
    packet::{Hello, Packet, PROOF_LEN},
    table::{LocalTable, PeerTable},
};
use crate::{
    address::Address,
    config::{RdmaConfig, MAX_RECV_BUFFERS, MAX_RECV_BUFFER_LEN, MIN_RECV_BUFFER_LEN},
    provider::{
        check_local, Access, Buffer, Caps, Completion, Endpoint, Handle, Op, Region, RegionDesc,
        RemoteSlice,
    },
};

/// One-sided operations served by the responder, and chunks of the remote
/// responder path, are cut into pieces of this size: it bounds a packet, and lets
/// other traffic interleave with a large transfer.
pub(crate) const CHUNK: usize = 256 * 1024;

/// What a soft endpoint did. Counters only grow except the gauges (`recv_posted`,
/// `regions_live`, `quarantined`).
#[derive(Debug, Default)]
pub struct SoftStats {
    /// Messages sent.
    pub sends: AtomicU64,
    /// Messages received into posted buffers.
    pub recvs: AtomicU64,
    /// Receive buffers posted now (gauge).
    pub recv_posted: AtomicUsize,
    /// Fewest receive buffers that were posted when a message arrived: 0 means a
    /// message once took the last one; it never goes below (a message with no
    /// posted buffer is an error, counted in `rnr`).
    pub recv_posted_low: AtomicUsize,
    /// Messages that found no posted receive buffer (each fails the connection).
    pub rnr: AtomicU64,
    /// One-sided reads this side did by cross-memory attach.
    pub cma_reads: AtomicU64,
    /// One-sided writes this side did by cross-memory attach.
    pub cma_writes: AtomicU64,
    /// One-sided reads and writes this side asked the peer's responder for.
    pub remote_ops: AtomicU64,
    /// Read and write requests this side's responder served for the peer.
    pub served: AtomicU64,
    /// Accesses refused (by this side's responder or this side's own checks of the
    /// peer's table).
    pub rejected: AtomicU64,
    /// Bytes moved by one-sided operations this side started.
    pub one_sided_bytes: AtomicU64,
    /// Regions registered now (gauge).
    pub regions_live: AtomicUsize,
    /// Deregistered regions whose memory is kept until the peer's running operation
    /// ends (gauge).
    pub quarantined: AtomicUsize,
}

/// State shared by an endpoint, its regions and its tasks.
pub(crate) struct Shared {
    table: LocalTable,
    peer_table: Option<PeerTable>,
    peer_pid: i32,
    /// A pidfd of the peer process when its table is mapped: a lane that a dead
    /// process left odd is waited on no longer.
    peer_process: Option<std::os::fd::OwnedFd>,
    /// Whether one-sided operations use cross-memory attach (cleared when the kernel
    /// refuses it).
    cma: AtomicBool,
    quarantine: Mutex<Vec<(u64, Arc<Mem>)>>,
    stats: Arc<SoftStats>,
    peer: String,
    /// Why the connection ended, once the driver knows.
    ended: Mutex<Option<String>>,
}

impl Shared {
    fn register(&self, mem: Mem, access: Access) -> Result<RegionDesc, Error> {
        self.prune();
        let mut desc = self.table.register(Arc::new(mem), access)?;
        if self.peer_table.is_none() {
            // A peer that did not map our table (another host, or no cross-memory
            // attach) reaches our regions by key through our responder only: the
            // address would tell it our memory's layout for nothing (from a review).
            desc.addr = 0;
        }
        self.stats
            .regions_live
            .store(self.table.live(), Ordering::Relaxed);
        Ok(desc)
    }

    /// Deregisters `key`; the memory is freed now, or quarantined while the peer's
    /// lane shows a one-sided operation that may have checked the entry before it
    /// went invalid. Returns the memory when nothing can reach it any more.
    fn deregister(&self, key: u64) -> Option<Arc<Mem>> {
        let mem = self.table.deregister(key)?;
        self.stats
            .regions_live
            .store(self.table.live(), Ordering::Relaxed);
        match &self.peer_table {
            Some(peer) => self.unless_busy(peer.lane(), mem),
            None => Some(mem),
        }
    }

    /// `mem` back if the peer's lane has moved on from `lane` (nothing of the peer
    /// can touch it); else it is quarantined, and `None`.
    fn unless_busy(&self, lane: u64, mem: Arc<Mem>) -> Option<Arc<Mem>> {
        match &self.peer_table {
            Some(peer) if self.peer_busy_since(peer, lane) => {
                self.quarantine(lane, mem);
                None
            }
            _ => Some(mem),
        }
    }

    /// Keeps `mem` until the peer's lane moves on from `lane` (see [`prune`](Self::prune)).
    fn quarantine(&self, lane: u64, mem: Arc<Mem>) {
        let mut quarantine = self.quarantine.lock().unwrap_or_else(|e| e.into_inner());
        quarantine.push((lane, mem));
        self.stats
            .quarantined
            .store(quarantine.len(), Ordering::Relaxed);
    }

    /// Whether the peer's lane shows an operation that may still touch `seen`'s
    /// memory: it is the lane value seen at deregistration, still odd and unchanged,
    /// and the peer process is alive (a process killed between its check and its
    /// copy leaves its lane odd for ever).
    fn peer_busy_since(&self, peer: &PeerTable, seen: u64) -> bool {
        seen % 2 == 1 && peer.lane() == seen && !self.peer_exited()
    }

    fn peer_exited(&self) -> bool {
        self.peer_process.as_ref().is_some_and(sys::has_exited)
    }

    /// Frees quarantined memory whose operation has ended.
    pub(crate) fn prune(&self) {
        let Some(peer) = &self.peer_table else {
            return;
        };
        let mut quarantine = self.quarantine.lock().unwrap_or_else(|e| e.into_inner());
        if quarantine.is_empty() {
            return;
        }
        quarantine.retain(|(seen, _)| self.peer_busy_since(peer, *seen));
        self.stats
            .quarantined
            .store(quarantine.len(), Ordering::Relaxed);
    }

    /// The error of an operation that finds the connection's tasks gone.
    pub(crate) fn gone(&self) -> Error {
        if self.peer_exited() {
            return Error::new(
                ErrorKind::Closed,
                format!("the peer process {} ({}) is gone", self.peer_pid, self.peer),
            );
        }
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        let message = match &*ended {
            Some(why) => format!("the connection to {} ended: {why}", self.peer),
            None => format!("connection to {} is closed", self.peer),
        };
        Error::new(ErrorKind::Closed, message)
    }

    pub(crate) fn has_quarantine(&self) -> bool {
        !self
            .quarantine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

/// A region of the soft provider; dropping it deregisters it.
pub struct SoftRegion {
    desc: RegionDesc,
    shared: Arc<Shared>,
    registered: bool,
}

impl fmt::Debug for SoftRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftRegion")
            .field("desc", &self.desc)
            .finish()
    }
}

impl SoftRegion {
    fn new(shared: &Arc<Shared>, mem: Mem, access: Access) -> Result<SoftRegion, Error> {
        let desc = shared.register(mem, access)?;
        Ok(SoftRegion {
            desc,
            shared: shared.clone(),
            registered: true,
        })
    }

    /// Deregisters the region and, once no operation of the peer can still be
    /// running on it, hands back its buffer with whatever the peer wrote (`None` for
    /// regions made by [`expose`](Endpoint::expose)). A peer process that stays
    /// between its check and its copy for [`REVOKE_PATIENCE`] (stopped, by a signal
    /// or a debugger) keeps the memory: it is quarantined, and `None` returned.
    pub async fn revoke(mut self) -> Option<SoftBuf> {
        self.registered = false;
        let mut mem = self.shared.table.deregister(self.desc.key)?;
        self.shared
            .stats
            .regions_live
            .store(self.shared.table.live(), Ordering::Relaxed);
        if let Some(peer) = &self.shared.peer_table {
            let lane = peer.lane();
            // Held by a guard across the waits: a `revoke` dropped there (a caller's
            // timeout, a cancelled handler) quarantines the memory the peer may still
            // be copying into, instead of freeing it.
            let mut waiting = Revoking {
                shared: &self.shared,
                lane,
                mem: Some(mem),
            };
            let patience = tokio::time::Instant::now() + REVOKE_PATIENCE;
            while self.shared.peer_busy_since(peer, lane) {
                if tokio::time::Instant::now() >= patience {
                    return None; // quarantined by the guard
                }
                tokio::time::sleep(Duration::from_micros(50)).await;
            }
            mem = waiting.mem.take().expect("taken only here");
        }
        loop {
            // The responder may hold it for the copy it is doing.
            match Arc::try_unwrap(mem) {
                Ok(Mem::Owned(owned)) => return Some(owned.into_buf()),
                Ok(Mem::Shared(_)) => return None,
                Err(still) => {
                    mem = still;
                    tokio::time::sleep(Duration::from_micros(50)).await;
                }
            }
        }
    }
}

/// Memory being revoked while the peer's lane may show an operation on it: dropped
/// with it still inside, it goes to quarantine if the peer may still touch it.
struct Revoking<'a> {
    shared: &'a Shared,
    lane: u64,
    mem: Option<Arc<Mem>>,
}

impl Drop for Revoking<'_> {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            drop(self.shared.unless_busy(self.lane, mem));
        }
    }
}

impl Region for SoftRegion {
    fn desc(&self) -> RegionDesc {
        self.desc
    }
}

impl Drop for SoftRegion {
    fn drop(&mut self) {
        if self.registered {
            drop(self.shared.deregister(self.desc.key));
        }
    }
}

/// One connection of the soft provider. Its tasks (the connection driver, with the
/// responder, and the cross-memory-attach worker) stop when it is dropped.
pub struct SoftEndpoint {
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedSender<Cmd>,
    cma_ops: mpsc::UnboundedSender<CmaOp>,
    events: mpsc::UnboundedReceiver<Event>,
    tasks: [AbortHandle; 2],
    closing: Option<oneshot::Receiver<Result<(), Error>>>,
    failed: Option<(ErrorKind, String)>,
    /// One-sided operations posted and not completed: the end of the connection is
    /// reported after them, so that each gets its own outcome (a cross-memory-attach
    /// read of a peer that died says so).
    one_sided_in_flight: usize,
    end: Option<Error>,
    recv_buffers: usize,
    recv_buffer_len: usize,
    peer_recv_len: usize,
}

impl fmt::Debug for SoftEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftEndpoint")
            .field("peer", &self.shared.peer)
            .field(
                "cross_memory_attach",
                &self.shared.cma.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Drop for SoftEndpoint {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl SoftEndpoint {
    /// What this endpoint did.
    pub fn stats(&self) -> &Arc<SoftStats> {
        &self.shared.stats
    }

    /// Whether one-sided operations go by cross-memory attach (the peer runs no
    /// code) rather than through the peer's responder.
    pub fn uses_cross_memory_attach(&self) -> bool {
        self.shared.cma.load(Ordering::Relaxed)
    }

    fn gone(&self) -> Error {
        match &self.failed {
            Some((kind, message)) => Error::new(*kind, message.clone()),
            // The driver ended before anyone polled its completions: say why.
            None => self.shared.gone(),
        }
    }

    fn command(&self, cmd: Cmd) -> Result<(), Error> {
        self.cmds.send(cmd).map_err(|_| self.gone())
    }
}

impl Endpoint for SoftEndpoint {
    type Buf = SoftBuf;
    type Region = SoftRegion;
    type Handle = SoftHandle;

    fn caps(&self) -> Caps {
        Caps {
            selective_signaling: false,
            one_sided_without_peer_cpu: self.uses_cross_memory_attach(),
        }
    }

    fn recv_buffers(&self) -> usize {
        self.recv_buffers
    }

    fn recv_buffer_len(&self) -> usize {
        self.recv_buffer_len
    }

    fn alloc(&self, len: usize) -> Result<SoftBuf, Error> {
        Ok(SoftBuf::zeroed(len))
    }

    fn expose(&self, bytes: Bytes) -> Result<SoftRegion, Error> {
        SoftRegion::new(&self.shared, Mem::Shared(bytes), Access::READ)
    }

    fn register(&self, buf: SoftBuf, access: Access) -> Result<SoftRegion, Error> {
        SoftRegion::new(&self.shared, Mem::Owned(OwnedMem::new(buf)), access)
    }

    fn handle(&self) -> SoftHandle {
        SoftHandle {
            shared: self.shared.clone(),
            cmds: self.cmds.clone(),
            cma_ops: self.cma_ops.clone(),
        }
    }

    fn post_recv(&mut self, wr: u64, buf: SoftBuf) -> Result<(), Error> {
        self.command(Cmd::PostRecv { wr, buf })
    }

    fn post_send(
        &mut self,
        wr: u64,
        buf: SoftBuf,
        len: usize,
        _signaled: bool,
    ) -> Result<(), Error> {
        check_local(0, len, buf.len())?;
        if len > self.peer_recv_len {
            return Err(Error::new(
                ErrorKind::FrameTooLarge,
                format!(
                    "message of {len} bytes is longer than the peer's receive buffers of {} bytes",
                    self.peer_recv_len
                ),
            ));
        }
        self.command(Cmd::Send { wr, buf, len })
    }

    fn post_read(
        &mut self,
        wr: u64,
        dst: SoftBuf,
        dst_offset: usize,
        src: RemoteSlice,
    ) -> Result<(), Error> {
        check_local(dst_offset, src.len, dst.len())?;
        let kind = RemoteKind::Read { dst, dst_offset };
        self.one_sided(wr, kind, src)
    }

    fn post_write(
        &mut self,
        wr: u64,
        src: SoftBuf,
        src_offset: usize,
        dst: RemoteSlice,
    ) -> Result<(), Error> {
        check_local(src_offset, dst.len, src.len())?;
        let kind = RemoteKind::Write { src, src_offset };
        self.one_sided(wr, kind, dst)
    }

    fn poll_completion(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Completion<SoftBuf>, Error>> {
        loop {
            if self.failed.is_some() {
                return Poll::Ready(Err(self.gone()));
            }
            if self.one_sided_in_flight == 0 {
                if let Some(err) = self.end.take() {
                    self.failed = Some((err.kind(), err.to_string()));
                    return Poll::Ready(Err(err));
                }
            }
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(Event::Completion(c))) => {
                    if matches!(c.op, Op::Read | Op::Write) {
                        self.one_sided_in_flight -= 1;
                    }
                    return Poll::Ready(Ok(c));
                }
                Poll::Ready(Some(Event::Closed(err))) => self.end = Some(err),
                Poll::Ready(None) => {
                    self.failed = Some((
                        ErrorKind::Closed,
                        format!("connection to {} is closed", self.shared.peer),
                    ));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.closing.is_none() {
            let (tx, rx) = oneshot::channel();
            if self.cmds.send(Cmd::Close(tx)).is_err() {
                return Poll::Ready(Ok(()));
            }
            self.closing = Some(rx);
        }
        let Some(rx) = self.closing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        match std::pin::Pin::new(rx).poll(cx) {
            Poll::Ready(Ok(result)) => Poll::Ready(result),
            // The driver ended: the connection is closed either way.
            Poll::Ready(Err(_)) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn peer(&self) -> String {
        self.shared.peer.clone()
    }
}

use std::future::Future as _;

impl SoftEndpoint {
    fn one_sided(&mut self, wr: u64, kind: RemoteKind, slice: RemoteSlice) -> Result<(), Error> {
        let posted = post_one_sided(
            &self.shared,
            &self.cmds,
            &self.cma_ops,
            wr,
            kind,
            slice,
            None,
        );
        if posted.is_err() {
            return Err(self.gone());
        }
        self.one_sided_in_flight += 1;
        Ok(())
    }
}

/// Hands a one-sided operation to the cross-memory-attach worker or to the driver
/// (for the peer's responder). On failure (the tasks ended) the operation's buffer
/// is dropped.
fn post_one_sided(
    shared: &Shared,
    cmds: &mpsc::UnboundedSender<Cmd>,
    cma_ops: &mpsc::UnboundedSender<CmaOp>,
    wr: u64,
    kind: RemoteKind,
    slice: RemoteSlice,
    reply: driver::Reply,
) -> Result<(), ()> {
    if shared.cma.load(Ordering::Relaxed) {
        let op = CmaOp {
            wr,
            kind,
            slice,
            reply,
        };
        cma_ops.send(op).map_err(drop)
    } else {
        let cmd = Cmd::Remote {
            wr,
            kind,
            slice,
            reply,
        };
        cmds.send(cmd).map_err(drop)
    }
}

/// One-sided operations on a soft endpoint's connection from any task (see
/// [`Handle`]): each operation carries its own reply channel to the
/// cross-memory-attach worker or the driver, so its completion never enters the
/// endpoint's queue, which the link's task owns.
#[derive(Clone)]
pub struct SoftHandle {
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedSender<Cmd>,
    cma_ops: mpsc::UnboundedSender<CmaOp>,
}

impl fmt::Debug for SoftHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftHandle")
            .field("peer", &self.shared.peer)
            .finish_non_exhaustive()
    }
}

impl SoftHandle {
    /// What the endpoint did (shared with it).
    pub fn stats(&self) -> &Arc<SoftStats> {
        &self.shared.stats
    }

    fn gone(&self) -> Error {
        self.shared.gone()
    }

    async fn run(&self, kind: RemoteKind, slice: RemoteSlice) -> Result<SoftBuf, Error> {
        let (tx, rx) = oneshot::channel();
        post_one_sided(
            &self.shared,
            &self.cmds,
            &self.cma_ops,
            0,
            kind,
            slice,
            Some(tx),
        )
        .map_err(|()| self.gone())?;
        let completion = tokio::select! {
            biased;
            // The tasks drop the reply channel only when they are aborted with the
            // endpoint: the connection is gone.
            done = rx => done.map_err(|_| self.gone())?,
            // The endpoint is gone and its tasks with it. An operation sent just as
            // the worker's receiver was dropped can be left in the channel (which
            // this handle keeps alive) with its reply: it will never be answered.
            () = self.cma_ops.closed() => return Err(self.gone()),
        };
        completion.result.map(|_| completion.buf)
    }
}

impl Handle for SoftHandle {
    type Buf = SoftBuf;
    type Region = SoftRegion;

    fn alloc(&self, len: usize) -> Result<SoftBuf, Error> {
        Ok(SoftBuf::zeroed(len))
    }

    fn expose(&self, bytes: Bytes) -> Result<SoftRegion, Error> {
        if self.cmds.is_closed() {
            return Err(self.gone());
        }
        SoftRegion::new(&self.shared, Mem::Shared(bytes), Access::READ)
    }

    fn register(&self, buf: SoftBuf, access: Access) -> Result<SoftRegion, Error> {
        if self.cmds.is_closed() {
            return Err(self.gone());
        }
        SoftRegion::new(&self.shared, Mem::Owned(OwnedMem::new(buf)), access)
    }

    async fn read(
        &self,
        dst: SoftBuf,
        dst_offset: usize,
        src: RemoteSlice,
    ) -> Result<SoftBuf, Error> {
        check_local(dst_offset, src.len, dst.len())?;
        self.run(RemoteKind::Read { dst, dst_offset }, src).await
    }

    async fn write(&self, src: SoftBuf, src_offset: usize, dst: RemoteSlice) -> Result<(), Error> {
        check_local(src_offset, dst.len, src.len())?;
        self.run(RemoteKind::Write { src, src_offset }, dst)
            .await
            .map(drop)
    }

    async fn revoke(&self, region: SoftRegion) -> Option<SoftBuf> {
        region.revoke().await
    }
}

/// How long [`SoftRegion::revoke`] waits for a peer's one-sided operation that may
/// still touch the region (the peer is between its check and its copy) before it
/// gives up and leaves the memory quarantined.
pub const REVOKE_PATIENCE: Duration = Duration::from_secs(10);

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(peer) = &self.peer_table else {
            return;
        };
        let quarantine =
            std::mem::take(self.quarantine.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (lane, mem) in quarantine {
            if self.peer_busy_since(peer, lane) {
                // The peer process is alive and still between its check and its copy
                // (stopped, say): freed, the memory could be reused and the copy land
                // in it when the peer goes on. Leaked instead.
                std::mem::forget(mem);
            }
        }
    }
}

/// Connections being set up at once by one listener from one source (an IPv4
/// address, an IPv6 /64, a Unix-socket peer's user): its further connections
/// wait their turn, within their `handshake_timeout`, so that a host that connects
/// and says nothing delays only itself.
pub(crate) const MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// Connections of one source running or waiting their setup; past it, a new one is
/// closed at once.
pub(crate) const MAX_ADMITTED_PER_SOURCE: usize = 64;

/// Connections a listener holds in setup at most, running or waiting; more wait in
/// the kernel's backlog.
pub(crate) const MAX_HANDSHAKES: usize = 256;

/// Accepts soft-provider connections on a TCP or Unix socket. Connections are set up
/// concurrently (a slow or silent client does not hold up the others); one whose
/// setup fails is logged and dropped, never returned as an error of the listener.
pub struct SoftListener {
    /// The listening socket (the TCP transport's, which also replaces a stale Unix
    /// socket file and removes its own when dropped).
    listener: rpc_transport_tcp::StreamListener,
    local: Address,
    config: RdmaConfig,
    handshakes: tokio::task::JoinSet<Result<SoftEndpoint, Error>>,
    sources: rpc_transport_tcp::SourceSlots,
}

impl fmt::Debug for SoftListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftListener")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl SoftListener {
    /// Binds to `address`. Port 0 picks a free port; a stale Unix socket file is
    /// replaced.
    pub async fn bind(address: &Address, config: RdmaConfig) -> Result<SoftListener, Error> {
        config.validate()?;
        let listener = rpc_transport_tcp::StreamListener::bind(&address.socket())
            .await
            .map_err(|e| Error::new(e.kind(), format!("{address}: {e}")))?;
        let local = Address::from_socket(listener.address());
        Ok(SoftListener {
            listener,
            local,
            config,
            handshakes: tokio::task::JoinSet::new(),
            sources: rpc_transport_tcp::SourceSlots::new(
                MAX_HANDSHAKES_PER_SOURCE,
                MAX_ADMITTED_PER_SOURCE,
            ),
        })
    }

    /// The bound address.
    pub fn address(&self) -> &Address {
        &self.local
    }

    /// The next connection whose setup succeeded. Errors are the listening
    /// socket's own.
    pub async fn accept(&mut self) -> Result<SoftEndpoint, Error> {
        loop {
            tokio::select! {
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    match done {
                        Ok(Ok(ep)) => return Ok(ep),
                        Ok(Err(err)) => crate::setup_refused(None, &err),
                        Err(err) => tracing::debug!(%err, "soft RDMA connection setup task failed"),
                    }
                }
                accepted = self.listener.accept_stream(), if self.handshakes.len() < MAX_HANDSHAKES => {
                    let (stream, peer) = match accepted.map_err(|e| Error::io("accept", e)) {
                        Ok(accepted) => accepted,
                        // A client that gave up before we accepted it.
                        Err(err) if err.kind() == ErrorKind::Closed => continue,
                        Err(err) => return Err(err),
                    };
                    // Over a Unix socket, the peer's user is its source, as for
                    // tls+unix:// (from a review: Unix peers were not counted, and
                    // one user's 300 silent connections held every setup slot).
                    let uid = match (&stream, peer) {
                        (Stream::Unix(unix), None) => {
                            unix.peer_cred().ok().map(|cred| cred.uid())
                        }
                        _ => None,
                    };
                    let admitted = match uid {
                        Some(uid) => self.sources.admit_uid(uid),
                        None => self.sources.admit(peer),
                    };
                    let Some(slot) = admitted else {
                        tracing::debug!(
                            peer = ?peer,
                            "soft RDMA connection closed: its source has \
                             {MAX_ADMITTED_PER_SOURCE} connections in setup"
                        );
                        continue;
                    };
                    let peer = match peer {
                        Some(peer) => format!("rdma://{peer}"),
                        None => format!("{} (client)", self.local),
                    };
                    let config = self.config.clone();
                    self.handshakes.spawn(async move {
                        // Waiting for the source's turn counts against the timeout.
                        let started = tokio::time::Instant::now();
                        let turn = tokio::time::timeout(config.handshake_timeout, slot.turn());
                        let Ok(_turn) = turn.await else {
                            return Err(Error::new(
                                ErrorKind::TimedOut,
                                format!("{peer} waited its setup turn for longer than {:?}",
                                    config.handshake_timeout),
                            ));
                        };
                        let left = config.handshake_timeout.saturating_sub(started.elapsed());
                        establish_within(stream, peer, &config, left).await
                    });
                }
            }
        }
    }
}

/// Connects to a soft-provider listener and sets the connection up.
pub async fn connect(address: &Address, config: &RdmaConfig) -> Result<SoftEndpoint, Error> {
    config.validate()?;
    let stream = Stream::connect(&address.socket())
        .await
        .map_err(|e| Error::io(format!("connect to {address}"), e))?;
    establish(stream, address.to_string(), config)
        .await
        .map_err(|err| {
            // A listener of this framework's other schemes reads our HELLO as another
            // protocol's and closes without a word (from a review: "closed the
            // connection during setup" alone).
            if err.kind() == ErrorKind::Closed && err.message().ends_with("during setup") {
                Error::new(
                    ErrorKind::Closed,
                    format!(
                        "{err}: is it a listener of another scheme, such as tcp:// or \
                         unix:// (or a soft RDMA listener at its limit of setups)?"
                    ),
                )
            } else {
                err
            }
        })
}

async fn establish(
    stream: Stream,
    peer: String,
    config: &RdmaConfig,
) -> Result<SoftEndpoint, Error> {
    establish_within(stream, peer, config, config.handshake_timeout).await
}

/// Sets a connection up within `timeout` (what is left of the handshake timeout).
async fn establish_within(
    stream: Stream,
    peer: String,
    config: &RdmaConfig,
    timeout: std::time::Duration,
) -> Result<SoftEndpoint, Error> {
    match tokio::time::timeout(timeout, handshake(stream, peer.clone(), config)).await {
        Ok(result) => result,
        Err(_) => Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "connection setup with {peer} took longer than {:?}",
                config.handshake_timeout
            ),
        )),
    }
}

async fn read_packet(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    peer: &str,
) -> Result<Packet, Error> {
    loop {
        // Handshake packets are small; the limit is the HELLO's size with room.
        if let Some(packet) = packet::decode(rbuf, 256)? {
            return Ok(packet);
        }
        rbuf.reserve(256);
        let n = stream
            .read_buf(rbuf)
            .await
            .map_err(|e| Error::io(format!("read from {peer}"), e))?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::Closed,
                format!("{peer} closed the connection during setup"),
            ));
        }
    }
}

async fn handshake(
    mut stream: Stream,
    peer: String,
    config: &RdmaConfig,
) -> Result<SoftEndpoint, Error> {
    use std::os::fd::AsRawFd;

    let table = LocalTable::new(config.max_regions)?;
    let (boot_id, pidns) = sys::host_identity();
    // Only a Unix socket's peer can be on this host as far as the setup goes (TCP
    // peers are served through the responder, below): a TCP peer is told nothing of
    // this process, its pid, host identity or table (from a review: they were sent
    // to every peer, used by none over TCP).
    let unix = matches!(stream, Stream::Unix(_));
    let offer_table = config.cross_memory_attach && unix;
    // What a peer that says it mapped our table must read here, by cross-memory
    // attach, and send back: a peer could otherwise only say so, and hold its lane
    // odd (as if between a check and a copy) for ever, making us keep every region
    // we deregister, past the connection's end (from a review: a local user who
    // could not attach to us grew our memory without bound that way). It lives on
    // the heap, in this process's private memory, until the peer's TABLE_ACK is read.
    let mut secret = [0u8; PROOF_LEN];
    secret[..8].copy_from_slice(&sys::random_u64().to_ne_bytes());
    secret[8..].copy_from_slice(&sys::random_u64().to_ne_bytes());
    let proof = Box::new(secret);
    let hello = Hello {
        pid: if unix { sys::pid() } else { 0 },
        boot_id: if unix { boot_id } else { [0; 16] },
        pidns: if unix { pidns } else { 0 },
        table_fd: if offer_table {
            table.file().as_raw_fd()
        } else {
            -1
        },
        table_capacity: table.capacity(),
        table_nonce: if unix { table.nonce() } else { 0 },
        recv_count: config.recv_buffers as u32,
        recv_len: config.recv_buffer_len as u32,
        proof_addr: if offer_table {
            proof.as_ptr() as u64
        } else {
            0
        },
    };
    let mut out = BytesMut::new();
    packet::put_hello(&mut out, &hello);
    stream
        .write_all(&out)
        .await
        .map_err(|e| Error::io(format!("write to {peer}"), e))?;
    let mut rbuf = BytesMut::new();
    // What is not a HELLO, or not one of a size and magic ours has, is another
    // protocol's first bytes (from a review: a tcp:// server's answer read as "HELLO
    // packet of 57 bytes, expected at least 64").
    let not_soft = |what: String| {
        Error::new(
            ErrorKind::Protocol,
            format!(
                "{peer} does not speak the soft RDMA provider's protocol ({what}): is it a \
                 listener of another scheme, such as tcp://, tls:// or grpc://?"
            ),
        )
        .from_another_protocol()
    };
    let their = match read_packet(&mut stream, &mut rbuf, &peer).await {
        Ok(Packet::Hello(hello)) => hello,
        Ok(other) => {
            let kind = other.name();
            return Err(not_soft(format!("its first packet is {kind}, not HELLO")));
        }
        Err(err) if matches!(err.kind(), ErrorKind::Protocol | ErrorKind::FrameTooLarge) => {
            return Err(not_soft(err.message().to_owned()))
        }
        Err(err) => return Err(err),
    };
    let recv_count = their.recv_count as usize;
    let recv_len = their.recv_len as usize;
    if !(1..=MAX_RECV_BUFFERS).contains(&recv_count)
        || !(MIN_RECV_BUFFER_LEN..=MAX_RECV_BUFFER_LEN).contains(&recv_len)
    {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "{peer} posts {recv_count} receive buffers of {recv_len} bytes: outside the \
                 limits (1 to {MAX_RECV_BUFFERS} buffers of {MIN_RECV_BUFFER_LEN} to \
                 {MAX_RECV_BUFFER_LEN} bytes)"
            ),
        ));
    }
    // A HELLO carrying our own table's nonce is ours echoed back (the peer cannot
    // know it otherwise): never the peer's table to map.
    let same_host = their.boot_id == boot_id
        && their.pidns == pidns
        && their.pidns != 0
        && their.table_nonce != table.nonce();
    // On a Unix socket the kernel tells who the peer is; the HELLO must agree. Over
    // TCP nothing does, even on loopback: a peer naming another process (ours, which
    // the HELLO of another connection gives away with its table's fd and nonce) would
    // have us check its accesses against that connection's table and copy to and
    // from that process, outside the lane that guards the table's revocations. So
    // TCP peers are served through the responder, as remote ones are.
    let pid_confirmed = match &stream {
        Stream::Unix(unix) => unix
            .peer_cred()
            .ok()
            .and_then(|cred| cred.pid())
            .is_some_and(|pid| pid == their.pid),
        Stream::Tcp(_) => false,
    };
    let peer_table = if offer_table && same_host && pid_confirmed && their.table_fd >= 0 {
        match PeerTable::open(
            their.pid,
            their.table_fd,
            their.table_capacity,
            their.table_nonce,
        ) {
            Ok(t) => Some(t),
            Err(err) => {
                tracing::debug!(%peer, %err, "cannot map the peer's region table; one-sided operations go through its responder");
                None
            }
        }
    } else {
        None
    };
    // A handle on the peer's process before we tell it we mapped its table: without
    // one we cannot copy safely (below), and a peer told "mapped" would copy from us,
    // its lane left odd if it died mid-copy with nothing to tell us it did (the pidfd
    // is how we see a dead peer's lane as free). (Opened after the table, which
    // proved the pid is the peer's.)
    let peer_process = match &peer_table {
        Some(_) => sys::pidfd_open(their.pid)
            .inspect_err(|err| tracing::debug!(%peer, %err, "no pidfd for the peer process"))
            .ok(),
        None => None,
    };
    let peer_table = peer_table.filter(|_| peer_process.is_some());
    // Our proof that we can attach to the peer: what its HELLO's proof address holds.
    // Without it (no address, or the kernel refuses: another user, a ptrace policy)
    // we copy nothing directly, and say we did not map its table.
    let our_proof = match (&peer_table, their.proof_addr) {
        (Some(_), addr) if addr != 0 => {
            let mut read = [0u8; PROOF_LEN];
            match sys::vm_read(their.pid, &mut read, addr) {
                Ok(()) => Some(read),
                Err(err) => {
                    tracing::debug!(%peer, %err, "cannot attach to the peer process; one-sided operations go through its responder");
                    None
                }
            }
        }
        _ => None,
    };
    let peer_table = peer_table.filter(|_| our_proof.is_some());
    out.clear();
    packet::put_table_ack(&mut out, peer_table.is_some(), our_proof.as_ref());
    stream
        .write_all(&out)
        .await
        .map_err(|e| Error::io(format!("write to {peer}"), e))?;
    // "Mapped" counts only with the proof that the peer read our memory.
    let peer_mapped_ours = match read_packet(&mut stream, &mut rbuf, &peer).await? {
        Packet::TableAck {
            mapped,
            proof: read,
        } => mapped && offer_table && read.as_ref() == Some(&*proof),
        other => {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("expected TABLE_ACK from {peer}, got {other:?}"),
            ))
        }
    };
    // A peer that did not map our table makes no cross-memory copy of our memory, so
    // its lane guards nothing of ours: its table is not kept (a peer could otherwise
    // answer "not mapped" and hold its lane odd for ever, and every region we
    // deregistered would wait in quarantine, then leak with the connection).
    let peer_table = peer_table.filter(|_| peer_mapped_ours);
    let peer_process = peer_process.filter(|_| peer_table.is_some());
    let cma = peer_table.is_some() && peer_mapped_ours && peer_process.is_some();
    let stats = Arc::new(SoftStats::default());
    stats
        .recv_posted
        .store(config.recv_buffers, Ordering::Relaxed);
    stats
        .recv_posted_low
        .store(config.recv_buffers, Ordering::Relaxed);
    let shared = Arc::new(Shared {
        table,
        peer_table,
        peer_pid: their.pid,
        peer_process,
        cma: AtomicBool::new(cma),
        quarantine: Mutex::new(Vec::new()),
        stats,
        peer,
        ended: Mutex::new(None),
    });
    // The receive buffers the HELLO announced, made only now that the setup is done
    // (half a megabyte by default, which a peer that connects and stays silent made
    // every setup hold): what the peer sent meanwhile waits in `rbuf`, and goes into
    // them once the driver runs.
    let recvs = (0..config.recv_buffers)
        .map(|wr| (wr as u64, SoftBuf::zeroed(config.recv_buffer_len)))
        .collect();
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (cma_tx, cma_rx) = mpsc::unbounded_channel();
    let (event_tx, event_rx) = mpsc::unbounded_channel();
    let driver = driver::Driver::new(
        stream,
        rbuf,
        shared.clone(),
        cmd_rx,
        event_tx.clone(),
        recvs,
        config,
    );
    let driver = tokio::spawn(driver).abort_handle();
    let worker = tokio::spawn(driver::cma_worker(
        shared.clone(),
        cma_rx,
        event_tx,
        cmd_tx.clone(),
    ))
    .abort_handle();
    Ok(SoftEndpoint {
        shared,
        cmds: cmd_tx,
        cma_ops: cma_tx,
        events: event_rx,
        tasks: [driver, worker],
        closing: None,
        failed: None,
        one_sided_in_flight: 0,
        end: None,
        recv_buffers: config.recv_buffers,
        recv_buffer_len: config.recv_buffer_len,
        peer_recv_len: recv_len,
    })
}

/// The completion of a one-sided operation that could not run.
pub(crate) fn failed(wr: u64, kind: RemoteKind, err: Error) -> Completion<SoftBuf> {
    let (op, buf) = kind.into_parts();
    Completion {
        wr,
        op,
        buf,
        result: Err(err),
    }
}

impl RemoteKind {
    pub(crate) fn into_parts(self) -> (Op, SoftBuf) {
        match self {
            RemoteKind::Read { dst, .. } => (Op::Read, dst),
            RemoteKind::Write { src, .. } => (Op::Write, src),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// A connection's shared state for tests, with cross-memory attach on.
    fn shared(
        table: LocalTable,
        peer_table: Option<PeerTable>,
        peer_pid: i32,
        peer_process: Option<std::os::fd::OwnedFd>,
    ) -> Shared {
        Shared {
            table,
            peer_table,
            peer_pid,
            peer_process,
            cma: AtomicBool::new(true),
            quarantine: Mutex::new(Vec::new()),
            stats: Arc::default(),
            peer: "test".into(),
            ended: Mutex::new(None),
        }
    }

    #[test]
    fn memory_deregistered_during_a_peer_operation_waits_for_its_end() {
        let table = LocalTable::new(4).unwrap();
        // The "peer" is this process: its lane is our own table's.
        let peer_table =
            PeerTable::open(sys::pid(), table.file().as_raw_fd(), 4, table.nonce()).unwrap();
        let shared = shared(table, Some(peer_table), sys::pid(), None);
        let quarantined = || shared.stats.quarantined.load(Ordering::Relaxed);
        let desc = shared
            .register(Mem::Shared(Bytes::from_static(b"region")), Access::READ)
            .unwrap();
        // The peer is between its check and its copy...
        shared.table.lane().fetch_add(1, Ordering::SeqCst);
        assert!(
            shared.deregister(desc.key).is_none(),
            "the memory is kept, not handed back"
        );
        assert_eq!(quarantined(), 1);
        shared.prune();
        assert_eq!(quarantined(), 1, "still in use");
        // ... and done.
        shared.table.lane().fetch_add(1, Ordering::SeqCst);
        shared.prune();
        assert_eq!(quarantined(), 0);
        // With no operation running, deregistration hands the memory back at once.
        let desc = shared
            .register(Mem::Shared(Bytes::from_static(b"again")), Access::READ)
            .unwrap();
        assert!(shared.deregister(desc.key).is_some());
        assert_eq!(shared.stats.regions_live.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn an_operation_left_unanswered_fails_once_the_worker_is_gone() {
        let table = LocalTable::new(4).unwrap();
        let shared = Arc::new(shared(table, None, sys::pid(), None));
        let (cmds, _cmds_rx) = mpsc::unbounded_channel();
        let (cma_ops, mut ops) = mpsc::unbounded_channel::<CmaOp>();
        let handle = SoftHandle {
            shared,
            cmds,
            cma_ops,
        };
        // A worker that takes the operation and goes without answering or dropping
        // it: what a receiver dropped as the operation was being sent leaves.
        let stranded = Arc::new(Mutex::new(Vec::new()));
        let keep = stranded.clone();
        tokio::spawn(async move {
            let op = ops.recv().await.unwrap();
            keep.lock().unwrap().push(op);
        });
        let slice = RemoteSlice {
            region: RegionDesc {
                key: 1,
                addr: 0,
                len: 8,
                access: Access::WRITE,
            },
            offset: 0,
            len: 8,
        };
        let write = handle.write(SoftBuf::zeroed(8), 0, slice);
        let err = tokio::time::timeout(Duration::from_secs(60), write)
            .await
            .expect("the operation waited for an answer that cannot come")
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
        assert_eq!(
            stranded.lock().unwrap().len(),
            1,
            "the reply was never dropped"
        );
    }

    #[tokio::test]
    async fn a_lane_left_odd_by_a_dead_peer_holds_nothing() {
        let table = LocalTable::new(4).unwrap();
        let peer_table =
            PeerTable::open(sys::pid(), table.file().as_raw_fd(), 4, table.nonce()).unwrap();
        // The "peer" died between its check and its copy: its lane stays odd.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = sys::pidfd_open(child.id() as i32).unwrap();
        child.wait().unwrap();
        table.lane().fetch_add(1, Ordering::SeqCst);
        let shared = Arc::new(shared(
            table,
            Some(peer_table),
            child.id() as i32,
            Some(pidfd),
        ));
        // Revoking a written region hands its buffer back at once...
        let region = SoftRegion::new(
            &shared,
            Mem::Owned(OwnedMem::new(SoftBuf::zeroed(8))),
            Access::WRITE,
        )
        .unwrap();
        let revoked = tokio::time::timeout(Duration::from_secs(60), region.revoke()).await;
        assert_eq!(revoked.expect("revoke waited").unwrap().len(), 8);
        // ... and dropping a region quarantines nothing.
        let region =
            SoftRegion::new(&shared, Mem::Shared(Bytes::from_static(b"x")), Access::READ).unwrap();
        drop(region);
        assert_eq!(shared.stats.quarantined.load(Ordering::Relaxed), 0);
        assert!(shared.gone().to_string().contains("is gone"));
    }

    /// A connection whose "peer" is this process (its pid; our own table as the peer's,
    /// its lane odd if `busy`), the process behind it `peer_process`, and a writable
    /// region of 8 bytes.
    fn self_as_peer(peer_process: std::os::fd::OwnedFd, busy: bool) -> (Arc<Shared>, SoftRegion) {
        let table = LocalTable::new(4).unwrap();
        let peer_table =
            PeerTable::open(sys::pid(), table.file().as_raw_fd(), 4, table.nonce()).unwrap();
        if busy {
            table.lane().fetch_add(1, Ordering::SeqCst);
        }
        let shared = Arc::new(shared(
            table,
            Some(peer_table),
            sys::pid(),
            Some(peer_process),
        ));
        let region = SoftRegion::new(
            &shared,
            Mem::Owned(OwnedMem::new(SoftBuf::zeroed(8))),
            Access::WRITE,
        )
        .unwrap();
        (shared, region)
    }

    /// A peer process stopped between its check and its copy (alive, its lane odd) does
    /// not hold `revoke` for ever: after `REVOKE_PATIENCE` the memory stays in
    /// quarantine and `revoke` gives up (it waited, polling, for as long as the peer
    /// was stopped; a review). The endpoint's end does not free it either.
    #[tokio::test(start_paused = true)]
    async fn revoke_gives_up_on_a_peer_stopped_mid_operation() {
        // The "peer" is this process, alive, with its lane odd for good.
        let me = sys::pidfd_open(sys::pid()).unwrap();
        let (shared, region) = self_as_peer(me, true);
        let start = tokio::time::Instant::now();
        let revoked = tokio::time::timeout(REVOKE_PATIENCE * 2, region.revoke())
            .await
            .expect("revoke waited for ever");
        assert!(revoked.is_none(), "the buffer was handed back");
        assert!(start.elapsed() >= REVOKE_PATIENCE);
        assert_eq!(shared.stats.quarantined.load(Ordering::Relaxed), 1);
    }

    /// A `revoke` cancelled while the peer may still be copying into the region (its
    /// lane odd: between its check and its copy) leaves the memory in quarantine. (A
    /// review found it freed: the peer's copy could land in freed memory.)
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_revoke_quarantines_what_the_peer_may_touch() {
        let me = sys::pidfd_open(sys::pid()).unwrap();
        let (shared, region) = self_as_peer(me, true);
        let cut = tokio::time::timeout(Duration::from_millis(1), region.revoke()).await;
        assert!(cut.is_err(), "revoke ended while the peer was busy");
        assert_eq!(shared.stats.quarantined.load(Ordering::Relaxed), 1);
    }

    /// A peer process that exited is not copied to or from, though its table is still
    /// mapped and says its regions are valid: its pid may name another process by now
    /// (here, standing for such a reused pid, this process; a review found the copy
    /// went ahead).
    #[test]
    fn an_exited_peer_is_not_copied_to() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = sys::pidfd_open(child.id() as i32).unwrap();
        child.wait().unwrap();
        let (shared, region) = self_as_peer(pidfd, false);
        let mut src = SoftBuf::zeroed(8);
        src.as_mut_slice().fill(0xee);
        let mut op = driver::CmaOp {
            wr: 1,
            kind: driver::RemoteKind::Write { src, src_offset: 0 },
            slice: crate::provider::RemoteSlice {
                region: region.desc(),
                offset: 0,
                len: 8,
            },
            reply: None,
        };
        let result = driver::run_cma(&shared, &mut op);
        assert!(result.is_err(), "copied to an exited peer: {result:?}");
        let written = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(region.revoke())
            .unwrap();
        assert_eq!(written.as_slice(), &[0; 8], "the region was written");
    }
}
