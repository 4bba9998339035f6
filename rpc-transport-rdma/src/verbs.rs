//! The verbs provider: RDMA hardware (or Soft-RoCE) through
//! [async-rdma](https://crates.io/crates/async-rdma) 0.5. Behind the `verbs` cargo
//! feature, off by default: **async-rdma is licensed GPL-3.0**, and enabling the
//! feature links it into your program.
//!
//! - **Setup**: a TCP connection to the same `rdma://host:port` carries a short
//!   handshake (each side's queue pair number, LID and GID), then both queue pairs
//!   are connected (`ibv_connect`), each side posts its receive buffers, and both
//!   confirm over TCP before the endpoint is handed out, so the first message never
//!   meets a receiver that is not ready. The TCP connection stays open: its end is
//!   how a dead peer is noticed.
//! - **Messages** use async-rdma's raw send and receive (its default `send` cuts
//!   messages into 512-byte pieces and waits for a reply after each), with the
//!   message length as immediate data (`receive_raw` does not tell how many bytes
//!   arrived); **one-sided
//!   operations** its `read` and `write`, with the region's address, length and
//!   rkey carried in our own [`RegionDesc`] (async-rdma's `MrToken` is rebuilt from
//!   it).
//! - **Memory**: regions are registered one by one (`MRManageStrategy::Raw`), so an
//!   rkey reaches exactly its region and deregistration (drop) revokes it. async-rdma
//!   cannot register memory it did not allocate, so [`Endpoint::expose`] and
//!   [`Endpoint::register`] copy into newly registered memory, and pool buffers come
//!   from `alloc_local_mr`. Its `receive_raw` allocates (and so registers) a buffer
//!   per message: the posted buffer is handed back unused. Both are limits of
//!   async-rdma 0.5's API.
//! - **Signaling**: async-rdma signals every work request; there is no selective
//!   signaling.
//! - **Other tasks' one-sided operations** ([`VerbsHandle`], for bulk transfers) call
//!   async-rdma's `read`/`write` on the shared connection directly: each completes
//!   to the task that awaits it.
//! - **Errors**: a refused one-sided access puts the queue pair in the error state,
//!   as hardware does: unlike the soft provider, the connection does not survive it.
//!
//! Without an RDMA device (`ibv_get_device_list` finds none; async-rdma then fails
//! with ENOSYS) connecting and accepting fail at once with "no RDMA device".

use std::{
    alloc::Layout,
    collections::{BTreeMap, VecDeque},
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll, Waker},
    time::{Duration, SystemTime},
};

use async_rdma::{
    AccessFlag, ConnectionType, LocalMr, LocalMrReadAccess, LocalMrWriteAccess, MRManageStrategy,
    MrAccess, MrToken, QueuePairEndpoint, QueuePairEndpointBuilder, Rdma, RdmaBuilder, RemoteMr,
};
use bytes::Bytes;
use rpc_core::{
    link::{Connector, LinkConfig, Listener},
    Error, ErrorKind,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::{AbortHandle, JoinSet},
};

use crate::{
    address::Address,
    config::RdmaConfig,
    provider::{
        check_local, Access, Buffer, Caps, Completion, Endpoint, Handle, Op, Region, RegionDesc,
        RemoteSlice,
    },
    RdmaLink,
};

/// Bytes of the setup message: magic, version, QP number, LID, GID.
const SETUP_LEN: usize = 8 + 1 + 4 + 2 + 16;
const SETUP_MAGIC: [u8; 8] = *b"RPCVERB1";
const SETUP_VERSION: u8 = 1;
/// How long a remote token stays valid for async-rdma's own timeout check: our
/// regions live until the owner drops them, so far in the future.
const TOKEN_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Which device and port to use. Default: the first device, port 1, GID index 1
/// (async-rdma's defaults).
#[derive(Clone, Debug, Default)]
pub struct VerbsOptions {
    /// The device name (`mlx5_0`, `rxe0`); `None` takes the first one.
    pub device: Option<String>,
    /// The port number. `None`: 1.
    pub port: Option<u8>,
    /// The GID index (RoCE v2 usually needs 1 or 3). `None`: 1.
    pub gid_index: Option<usize>,
}

fn no_device_or(context: &str, err: std::io::Error) -> Error {
    let raw = err.raw_os_error();
    if raw == Some(libc::ENOSYS) || raw == Some(libc::ENODEV) {
        return Error::new(
            ErrorKind::Io,
            format!(
                "no RDMA device: {context} failed ({err}); the verbs provider needs an RDMA \
                 device or Soft-RoCE (rdma_rxe), use the soft provider (rdma:// without the \
                 verbs feature) otherwise"
            ),
        );
    }
    Error::new(ErrorKind::Io, format!("{context} failed: {err}"))
}

/// Registered memory of the verbs provider.
pub struct VerbsBuf {
    mr: LocalMr,
}

impl fmt::Debug for VerbsBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsBuf")
            .field("len", &self.mr.length())
            .finish()
    }
}

/// A view of a buffer's bytes. async-rdma guards them with a lock that only its own
/// operations take; a `VerbsBuf` is ours alone while no operation is posted on it
/// (posting moves it into the endpoint), so nothing else can hold that lock.
fn mr_bytes(mr: &LocalMr) -> &[u8] {
    #[allow(unsafe_code)]
    // SAFETY: `mr` is registered local memory of `length()` initialized (zeroed at
    // allocation) bytes, owned by the caller's `VerbsBuf`, which no posted operation
    // uses (see above); its access rights are local only, so no peer writes it.
    unsafe {
        mr.as_slice_unchecked()
    }
}

fn mr_bytes_mut(mr: &mut LocalMr) -> &mut [u8] {
    #[allow(unsafe_code)]
    // SAFETY: as in `mr_bytes`, and the exclusive borrow of `mr` rules out any other
    // local view.
    unsafe {
        mr.as_mut_slice_unchecked()
    }
}

impl Buffer for VerbsBuf {
    fn len(&self) -> usize {
        self.mr.length()
    }

    fn as_slice(&self) -> &[u8] {
        mr_bytes(&self.mr)
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        mr_bytes_mut(&mut self.mr)
    }

    fn into_bytes(self, len: usize) -> Bytes {
        // Registered memory goes back to the allocator; the frame is a copy.
        Bytes::copy_from_slice(&self.as_slice()[..len])
    }
}

/// A region of the verbs provider: its own memory registration, deregistered when
/// dropped.
pub struct VerbsRegion {
    mr: LocalMr,
    len: usize,
    access: Access,
}

impl fmt::Debug for VerbsRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsRegion")
            .field("desc", &self.desc())
            .finish()
    }
}

impl Region for VerbsRegion {
    fn desc(&self) -> RegionDesc {
        RegionDesc {
            key: u64::from(self.mr.rkey()),
            addr: self.mr.addr() as u64,
            len: self.len as u64,
            access: self.access,
        }
    }
}

/// Items numbered 0, 1, 2, ... taken in that order, whatever order they come in.
#[derive(Debug)]
struct InOrder<T> {
    next: u64,
    early: BTreeMap<u64, T>,
}

impl<T> Default for InOrder<T> {
    fn default() -> Self {
        InOrder {
            next: 0,
            early: BTreeMap::new(),
        }
    }
}

impl<T> InOrder<T> {
    /// Item `number` came.
    fn put(&mut self, number: u64, item: T) {
        self.early.insert(number, item);
    }

    /// The next item in order, if it came.
    fn take(&mut self) -> Option<T> {
        let item = self.early.remove(&self.next)?;
        self.next += 1;
        Some(item)
    }
}

/// Wakes the endpoint's owner when an operation is posted while none was in flight
/// (an empty `JoinSet` registers no waker).
#[derive(Default)]
struct Wake {
    waker: Mutex<Option<Waker>>,
    peer_gone: AtomicBool,
}

impl Wake {
    fn wake(&self) {
        if let Some(waker) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            waker.wake();
        }
    }
}

/// One connection of the verbs provider.
pub struct VerbsEndpoint {
    rdma: Arc<Rdma>,
    /// Operations posted and not completed, each with its receive's number (`None`
    /// for the others).
    ops: JoinSet<(Option<u64>, Completion<VerbsBuf>)>,
    /// Operations that completed in their first poll (see [`VerbsEndpoint::start`]).
    done: VecDeque<(Option<u64>, Completion<VerbsBuf>)>,
    /// Receives posted so far: the next one's number.
    recvs_posted: u64,
    /// Receive completions, handed out in the order their receives were posted.
    recvs: InOrder<Completion<VerbsBuf>>,
    wake: Arc<Wake>,
    watcher: Option<AbortHandle>,
    recv_buffers: usize,
    recv_buffer_len: usize,
    peer: String,
    failed: Option<(ErrorKind, String)>,
}

impl fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsEndpoint")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Drop for VerbsEndpoint {
    fn drop(&mut self) {
        if let Some(watcher) = &self.watcher {
            watcher.abort();
        }
    }
}

fn builder(config: &RdmaConfig, options: &VerbsOptions) -> RdmaBuilder {
    let depth = u32::try_from(config.send_queue_depth).unwrap_or(u32::MAX);
    let mut builder = RdmaBuilder::default()
        .set_conn_type(ConnectionType::RCIBV)
        .set_raw(true)
        .set_mr_strategy(MRManageStrategy::Raw)
        .set_mr_access(AccessFlag::LocalWrite.into())
        .set_qp_access(AccessFlag::LocalWrite | AccessFlag::RemoteRead | AccessFlag::RemoteWrite)
        .set_qp_max_send_wr(depth)
        .set_qp_max_recv_wr(config.recv_buffers as u32)
        // Retry for ever when the peer has no receive posted (it always will).
        .set_rnr_retry(7);
    if let Some(device) = &options.device {
        builder = builder.set_dev(device);
    }
    if let Some(port) = options.port {
        builder = builder.set_port_num(port);
    }
    if let Some(gid) = options.gid_index {
        builder = builder.set_gid_index(gid);
    }
    builder
}

fn put_setup(qp: &QueuePairEndpoint) -> [u8; SETUP_LEN] {
    let mut out = [0u8; SETUP_LEN];
    out[..8].copy_from_slice(&SETUP_MAGIC);
    out[8] = SETUP_VERSION;
    out[9..13].copy_from_slice(&qp.qp_num().to_be_bytes());
    out[13..15].copy_from_slice(&qp.lid().to_be_bytes());
    out[15..31].copy_from_slice(qp.gid().as_raw());
    out
}

fn parse_setup(bytes: &[u8; SETUP_LEN], peer: &str) -> Result<QueuePairEndpoint, Error> {
    if bytes[..8] != SETUP_MAGIC || bytes[8] != SETUP_VERSION {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("{peer} does not speak the verbs provider's setup (version {SETUP_VERSION})"),
        ));
    }
    let qp_num = u32::from_be_bytes([bytes[9], bytes[10], bytes[11], bytes[12]]);
    let lid = u16::from_be_bytes([bytes[13], bytes[14]]);
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&bytes[15..31]);
    QueuePairEndpointBuilder::default()
        .qp_num(qp_num)
        .lid(lid)
        .gid(async_rdma::Gid::from_raw(gid))
        .build()
        .map_err(|e| {
            Error::new(
                ErrorKind::Protocol,
                format!("bad queue pair from {peer}: {e}"),
            )
        })
}

async fn establish(
    mut tcp: TcpStream,
    peer: String,
    config: &RdmaConfig,
    options: &VerbsOptions,
) -> Result<VerbsEndpoint, Error> {
    let mut rdma = builder(config, options)
        .build()
        .map_err(|e| no_device_or("opening the RDMA device", e))?;
    let io = |what: &'static str| {
        let peer = peer.clone();
        move |e| Error::io(format!("{what} {peer}"), e)
    };
    tcp.write_all(&put_setup(&rdma.get_qp_endpoint()))
        .await
        .map_err(io("write to"))?;
    let mut theirs = [0u8; SETUP_LEN];
    tcp.read_exact(&mut theirs).await.map_err(io("read from"))?;
    let remote = parse_setup(&theirs, &peer)?;
    rdma.ibv_connect(remote)
        .await
        .map_err(|e| no_device_or("connecting the queue pair", e))?;
    let mut ep = VerbsEndpoint {
        rdma: Arc::new(rdma),
        ops: JoinSet::new(),
        done: VecDeque::new(),
        recvs_posted: 0,
        recvs: InOrder::default(),
        wake: Arc::default(),
        watcher: None,
        recv_buffers: config.recv_buffers,
        recv_buffer_len: config.recv_buffer_len,
        peer: peer.clone(),
        failed: None,
    };
    for wr in 0..config.recv_buffers {
        let buf = ep.alloc(config.recv_buffer_len)?;
        ep.post_recv(wr as u64, buf)?;
    }
    // Both sides have posted their receives: confirm, so that no first message
    // meets an empty receive queue.
    tcp.write_all(&[1]).await.map_err(io("write to"))?;
    let mut ready = [0u8; 1];
    tcp.read_exact(&mut ready).await.map_err(io("read from"))?;
    let wake = ep.wake.clone();
    ep.watcher = Some(
        tokio::spawn(async move {
            // Nothing more is sent on the setup connection: its end is the peer's end.
            let mut byte = [0u8; 1];
            let _ = tcp.read(&mut byte).await;
            wake.peer_gone.store(true, Ordering::Release);
            wake.wake();
        })
        .abort_handle(),
    );
    Ok(ep)
}

fn layout(len: usize) -> Result<Layout, Error> {
    Layout::from_size_align(len.max(1), 8).map_err(|e| {
        Error::new(
            ErrorKind::LimitReached,
            format!("buffer of {len} bytes: {e}"),
        )
    })
}

fn token(slice: &RemoteSlice) -> MrToken {
    let mut access = 0u32;
    if slice.region.access.contains(Access::WRITE) {
        access |= 2; // IBV_ACCESS_REMOTE_WRITE
    }
    if slice.region.access.contains(Access::READ) {
        access |= 4; // IBV_ACCESS_REMOTE_READ
    }
    MrToken {
        addr: slice.region.addr as usize,
        len: slice.region.len as usize,
        rkey: slice.region.key as u32,
        ddl: SystemTime::now() + TOKEN_LIFETIME,
        access,
    }
}

fn op_error(what: &str, peer: &str, err: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("RDMA {what} with {peer} failed: {err}"),
    )
}

async fn read_into(
    rdma: &Rdma,
    dst: &mut VerbsBuf,
    at: usize,
    src: &RemoteSlice,
) -> std::io::Result<()> {
    let remote = RemoteMr::new(token(src));
    let start = src.offset as usize;
    let remote = remote.get(start..start + src.len)?;
    let mut local = dst
        .mr
        .get_mut(at..at + src.len)
        .ok_or_else(|| std::io::Error::other("local range out of the buffer"))?;
    rdma.read(&mut local, &remote).await
}

async fn write_from(
    rdma: &Rdma,
    src: &VerbsBuf,
    at: usize,
    dst: &RemoteSlice,
) -> std::io::Result<()> {
    let mut remote = RemoteMr::new(token(dst));
    let start = dst.offset as usize;
    let mut remote = remote.get_mut(start..start + dst.len)?;
    let local = src
        .mr
        .get(at..at + dst.len)
        .ok_or_else(|| std::io::Error::other("local range out of the buffer"))?;
    rdma.write(&local, &mut remote).await
}

fn alloc(rdma: &Rdma, len: usize) -> Result<VerbsBuf, Error> {
    let mr = rdma.alloc_local_mr(layout(len)?).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("registering {len} bytes failed: {e}"),
        )
    })?;
    Ok(VerbsBuf { mr })
}

fn expose(rdma: &Rdma, bytes: &[u8]) -> Result<VerbsRegion, Error> {
    let mut mr = rdma
        .alloc_local_mr_with_access(
            layout(bytes.len())?,
            AccessFlag::LocalWrite | AccessFlag::RemoteRead,
        )
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("registering {} bytes failed: {e}", bytes.len()),
            )
        })?;
    mr_bytes_mut(&mut mr)[..bytes.len()].copy_from_slice(bytes);
    Ok(VerbsRegion {
        mr,
        len: bytes.len(),
        access: Access::READ,
    })
}

fn register(rdma: &Rdma, buf: &VerbsBuf, access: Access) -> Result<VerbsRegion, Error> {
    let flags = match (
        access.contains(Access::READ),
        access.contains(Access::WRITE),
    ) {
        (true, true) => AccessFlag::LocalWrite | AccessFlag::RemoteRead | AccessFlag::RemoteWrite,
        (false, true) => AccessFlag::LocalWrite | AccessFlag::RemoteWrite,
        (true, false) => AccessFlag::LocalWrite | AccessFlag::RemoteRead,
        // No remote access asked for: none granted.
        (false, false) => AccessFlag::LocalWrite.into(),
    };
    let len = buf.len();
    let mut mr = rdma
        .alloc_local_mr_with_access(layout(len)?, flags)
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("registering {len} bytes failed: {e}"),
            )
        })?;
    mr_bytes_mut(&mut mr)[..len].copy_from_slice(buf.as_slice());
    Ok(VerbsRegion { mr, len, access })
}

/// One-sided operations on a verbs connection from any task: async-rdma's
/// `read`/`write` complete to the task that awaits them, so the handle shares the
/// endpoint's connection (`Arc<Rdma>`) and needs no routing.
#[derive(Clone)]
pub struct VerbsHandle {
    rdma: Arc<Rdma>,
    wake: Arc<Wake>,
    peer: String,
}

impl fmt::Debug for VerbsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsHandle")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl VerbsHandle {
    fn check_open(&self) -> Result<(), Error> {
        if self.wake.peer_gone.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Closed,
                format!("{} closed the connection", self.peer),
            ));
        }
        Ok(())
    }
}

impl Handle for VerbsHandle {
    type Buf = VerbsBuf;
    type Region = VerbsRegion;

    fn alloc(&self, len: usize) -> Result<VerbsBuf, Error> {
        alloc(&self.rdma, len)
    }

    fn expose(&self, bytes: Bytes) -> Result<VerbsRegion, Error> {
        self.check_open()?;
        expose(&self.rdma, &bytes)
    }

    fn register(&self, buf: VerbsBuf, access: Access) -> Result<VerbsRegion, Error> {
        self.check_open()?;
        register(&self.rdma, &buf, access)
    }

    async fn read(
        &self,
        mut dst: VerbsBuf,
        dst_offset: usize,
        src: RemoteSlice,
    ) -> Result<VerbsBuf, Error> {
        check_local(dst_offset, src.len, dst.len())?;
        self.check_open()?;
        if src.len > 0 {
            read_into(&self.rdma, &mut dst, dst_offset, &src)
                .await
                .map_err(|e| op_error("read", &self.peer, e))?;
        }
        Ok(dst)
    }

    async fn write(&self, src: VerbsBuf, src_offset: usize, dst: RemoteSlice) -> Result<(), Error> {
        check_local(src_offset, dst.len, src.len())?;
        self.check_open()?;
        if dst.len > 0 {
            write_from(&self.rdma, &src, src_offset, &dst)
                .await
                .map_err(|e| op_error("write", &self.peer, e))?;
        }
        Ok(())
    }

    async fn revoke(&self, region: VerbsRegion) -> Option<VerbsBuf> {
        // async-rdma deregisters and frees in one step (dropping the region), so the
        // bytes are copied out first, into memory of the endpoint's.
        let mut buf = alloc(&self.rdma, region.len).ok()?;
        copy_written(&region.mr, &mut buf.as_mut_slice()[..region.len]);
        drop(region);
        Some(buf)
    }
}

/// Copies the first `out.len()` bytes of a region the peer was allowed to write into
/// `out`, through its raw pointer: the peer's NIC may still write the region (a late
/// or hostile peer), so no Rust reference is made over it, which would be undefined
/// behaviour while it changes; a late write only tears the copied bytes.
fn copy_written(mr: &LocalMr, out: &mut [u8]) {
    let len = out.len().min(mr.length());
    #[allow(unsafe_code)]
    // SAFETY: `mr` is registered memory of `length()` initialized (zeroed at
    // allocation) bytes; `len` is within it and within `out`, which is memory of ours
    // that the region does not overlap. The bulk protocol reads it only after the peer
    // answered, which it does once its writes completed (an RDMA write completes at
    // the requester after the data is placed here).
    unsafe {
        std::ptr::copy_nonoverlapping(mr.as_ptr_unchecked(), out.as_mut_ptr(), len);
    }
}

impl VerbsEndpoint {
    /// Starts an operation: `recv` is a receive's number. async-rdma posts the work
    /// request in the future's first poll, before its first await, so the first poll
    /// happens here, in the order the link posts: as a spawned task's first poll, it
    /// came whenever the scheduler got to it (on a multi-thread runtime, a later send
    /// could go first), and the receives of the setup were not posted yet when the
    /// setup confirmed them to the peer (from a review).
    fn start<F>(&mut self, recv: Option<u64>, op: F)
    where
        F: Future<Output = Completion<VerbsBuf>> + Send + 'static,
    {
        let mut op = Box::pin(op);
        match op.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(completion) => self.done.push_back((recv, completion)),
            Poll::Pending => {
                self.ops.spawn(async move { (recv, op.await) });
            }
        }
        self.wake.wake();
    }

    /// Hands out a completion; a failed receive fails the endpoint.
    fn deliver(&mut self, c: Completion<VerbsBuf>) -> Poll<Result<Completion<VerbsBuf>, Error>> {
        if let (Op::Recv, Err(err)) = (c.op, &c.result) {
            // A failed receive means the queue pair is in the error state.
            let message = format!("connection to {} failed: {err}", self.peer);
            self.failed = Some((ErrorKind::Closed, message.clone()));
            return Poll::Ready(Err(Error::new(ErrorKind::Closed, message)));
        }
        Poll::Ready(Ok(c))
    }
}

impl Endpoint for VerbsEndpoint {
    type Buf = VerbsBuf;
    type Region = VerbsRegion;
    type Handle = VerbsHandle;

    fn caps(&self) -> Caps {
        Caps {
            selective_signaling: false,
            one_sided_without_peer_cpu: true,
        }
    }

    fn recv_buffers(&self) -> usize {
        self.recv_buffers
    }

    fn recv_buffer_len(&self) -> usize {
        self.recv_buffer_len
    }

    fn alloc(&self, len: usize) -> Result<VerbsBuf, Error> {
        alloc(&self.rdma, len)
    }

    fn expose(&self, bytes: Bytes) -> Result<VerbsRegion, Error> {
        expose(&self.rdma, &bytes)
    }

    fn register(&self, buf: VerbsBuf, access: Access) -> Result<VerbsRegion, Error> {
        register(&self.rdma, &buf, access)
    }

    fn handle(&self) -> VerbsHandle {
        VerbsHandle {
            rdma: self.rdma.clone(),
            wake: self.wake.clone(),
            peer: self.peer.clone(),
        }
    }

    fn post_recv(&mut self, wr: u64, buf: VerbsBuf) -> Result<(), Error> {
        let rdma = self.rdma.clone();
        let peer = self.peer.clone();
        let len = self.recv_buffer_len;
        let number = self.recvs_posted;
        self.recvs_posted += 1;
        self.start(Some(number), async move {
            // async-rdma receives into memory it allocates: ours goes back unused. It
            // does not report how many bytes arrived, so the sender puts the length in
            // the immediate data.
            match rdma
                .receive_raw_with_imm(
                    Layout::from_size_align(len, 8).unwrap_or(Layout::new::<u8>()),
                )
                .await
            {
                Ok((mr, imm)) => {
                    let result = match imm {
                        Some(n) if n as usize <= mr.length() => Ok(n as usize),
                        Some(n) => Err(Error::new(
                            ErrorKind::Protocol,
                            format!(
                                "{peer} announced a message of {n} bytes in a buffer of {}",
                                mr.length()
                            ),
                        )),
                        None => Err(Error::new(
                            ErrorKind::Protocol,
                            format!("{peer} sent a message without its length"),
                        )),
                    };
                    Completion {
                        wr,
                        op: Op::Recv,
                        result,
                        buf: VerbsBuf { mr },
                    }
                }
                Err(err) => Completion {
                    wr,
                    op: Op::Recv,
                    buf,
                    result: Err(op_error("receive", &peer, err)),
                },
            }
        });
        Ok(())
    }

    fn post_send(
        &mut self,
        wr: u64,
        buf: VerbsBuf,
        len: usize,
        _signaled: bool,
    ) -> Result<(), Error> {
        check_local(0, len, buf.len())?;
        let rdma = self.rdma.clone();
        let peer = self.peer.clone();
        self.start(None, async move {
            let result = match buf.mr.get(0..len) {
                // The length travels as immediate data (see `post_recv`).
                Some(part) => rdma
                    .send_raw_with_imm(&part, len as u32)
                    .await
                    .map(|()| len),
                None => Err(std::io::Error::other("send length out of the buffer")),
            };
            Completion {
                wr,
                op: Op::Send,
                buf,
                result: result.map_err(|e| op_error("send", &peer, e)),
            }
        });
        Ok(())
    }

    fn post_read(
        &mut self,
        wr: u64,
        mut dst: VerbsBuf,
        dst_offset: usize,
        src: RemoteSlice,
    ) -> Result<(), Error> {
        check_local(dst_offset, src.len, dst.len())?;
        let rdma = self.rdma.clone();
        let peer = self.peer.clone();
        self.start(None, async move {
            let result = if src.len == 0 {
                Ok(())
            } else {
                read_into(&rdma, &mut dst, dst_offset, &src).await
            };
            Completion {
                wr,
                op: Op::Read,
                buf: dst,
                result: result
                    .map(|()| src.len)
                    .map_err(|e| op_error("read", &peer, e)),
            }
        });
        Ok(())
    }

    fn post_write(
        &mut self,
        wr: u64,
        src: VerbsBuf,
        src_offset: usize,
        dst: RemoteSlice,
    ) -> Result<(), Error> {
        check_local(src_offset, dst.len, src.len())?;
        let rdma = self.rdma.clone();
        let peer = self.peer.clone();
        self.start(None, async move {
            let result = if dst.len == 0 {
                Ok(())
            } else {
                write_from(&rdma, &src, src_offset, &dst).await
            };
            Completion {
                wr,
                op: Op::Write,
                buf: src,
                result: result
                    .map(|()| dst.len)
                    .map_err(|e| op_error("write", &peer, e)),
            }
        });
        Ok(())
    }

    fn poll_completion(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Completion<VerbsBuf>, Error>> {
        if let Some((kind, message)) = &self.failed {
            return Poll::Ready(Err(Error::new(*kind, message.clone())));
        }
        loop {
            // Messages land in the receives in the order these were posted (a queue
            // pair's receive queue is FIFO): their completions are handed out in that
            // order, whatever order their tasks finished in.
            if let Some(c) = self.recvs.take() {
                return self.deliver(c);
            }
            let (recv, c) = match self.done.pop_front() {
                Some(done) => done,
                None => match self.ops.poll_join_next(cx) {
                    Poll::Ready(Some(Ok(done))) => done,
                    Poll::Ready(Some(Err(join))) => {
                        let message =
                            format!("an RDMA operation with {} failed: {join}", self.peer);
                        self.failed = Some((ErrorKind::Io, message.clone()));
                        return Poll::Ready(Err(Error::new(ErrorKind::Io, message)));
                    }
                    Poll::Ready(None) | Poll::Pending => break,
                },
            };
            match recv {
                // A failed receive ends the connection at once.
                Some(number) if c.result.is_ok() => self.recvs.put(number, c),
                _ => return self.deliver(c),
            }
        }
        *self.wake.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        if self.wake.peer_gone.load(Ordering::Acquire) {
            let message = format!("{} closed the connection", self.peer);
            self.failed = Some((ErrorKind::Closed, message.clone()));
            return Poll::Ready(Err(Error::new(ErrorKind::Closed, message)));
        }
        Poll::Pending
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // Dropping the endpoint tears the queue pair and the setup connection down.
        Poll::Ready(Ok(()))
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }
}

/// Opens verbs links to one `rdma://host:port` address.
#[derive(Clone, Debug)]
pub struct VerbsConnector {
    address: String,
    config: RdmaConfig,
    options: VerbsOptions,
}

impl VerbsConnector {
    /// A connector for an `rdma://host:port` URI.
    pub fn new(uri: &str, config: RdmaConfig, options: VerbsOptions) -> Result<Self, Error> {
        config.validate()?;
        match uri.parse::<Address>()? {
            Address::Tcp(address) => Ok(VerbsConnector {
                address,
                config,
                options,
            }),
            Address::Unix(_) => Err(Error::new(
                ErrorKind::InvalidAddress,
                format!("{uri}: the verbs provider needs rdma://host:port"),
            )),
        }
    }
}

impl Connector for VerbsConnector {
    type Link = RdmaLink<VerbsEndpoint>;

    async fn connect(&self, config: &LinkConfig) -> Result<Self::Link, Error> {
        let peer = format!("rdma://{}", self.address);
        let tcp = TcpStream::connect(self.address.as_str())
            .await
            .map_err(|e| Error::io(format!("connect to {peer}"), e))?;
        let _ = tcp.set_nodelay(true);
        let ep = tokio::time::timeout(
            self.config.handshake_timeout,
            establish(tcp, peer.clone(), &self.config, &self.options),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::TimedOut,
                format!("RDMA setup with {peer} timed out"),
            )
        })??;
        RdmaLink::new(ep, &self.config, config.max_frame_len)
    }

    fn target(&self) -> String {
        format!("rdma://{}", self.address)
    }
}

/// Accepts verbs links.
#[derive(Debug)]
pub struct VerbsListener {
    tcp: TcpListener,
    local: String,
    config: RdmaConfig,
    options: VerbsOptions,
    /// Connections being set up, each in its own task: a peer that stalls its setup
    /// delays only itself (setups ran one after another, each up to the handshake
    /// timeout: from a review).
    handshakes: JoinSet<(String, Result<VerbsEndpoint, Error>)>,
    sources: rpc_transport_tcp::SourceSlots,
}

impl VerbsListener {
    /// Binds the setup listener to an `rdma://host:port` URI (port 0 picks one).
    /// Whether a device is there shows at the first accept.
    pub async fn bind(uri: &str, config: RdmaConfig, options: VerbsOptions) -> Result<Self, Error> {
        config.validate()?;
        let Address::Tcp(address) = uri.parse::<Address>()? else {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                format!("{uri}: the verbs provider needs rdma://host:port"),
            ));
        };
        let tcp = TcpListener::bind(address.as_str())
            .await
            .map_err(|e| Error::io(format!("bind {uri}"), e))?;
        let local = tcp
            .local_addr()
            .map_err(|e| Error::io("local address", e))?
            .to_string();
        Ok(VerbsListener {
            tcp,
            local: format!("rdma://{local}"),
            config,
            options,
            handshakes: JoinSet::new(),
            sources: rpc_transport_tcp::SourceSlots::new(
                crate::soft::MAX_HANDSHAKES_PER_SOURCE,
                crate::soft::MAX_ADMITTED_PER_SOURCE,
            ),
        })
    }
}

impl Listener for VerbsListener {
    type Link = RdmaLink<VerbsEndpoint>;

    /// The next connection set up. Connections are set up concurrently, each
    /// within the handshake timeout, at most 8 at once per source (as the soft
    /// provider's listener). A client whose setup fails (it closed, timed out, spoke
    /// another protocol) is logged and skipped: the server's accept loop takes an
    /// error of kind `Closed` for the end of the listener. Errors of kind `Io` (this
    /// side's: no device, registration) are returned.
    async fn accept(&mut self, config: &LinkConfig) -> Result<Self::Link, Error> {
        loop {
            tokio::select! {
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    match done {
                        Ok((_, Ok(ep))) => {
                            return RdmaLink::new(ep, &self.config, config.max_frame_len)
                        }
                        Ok((_, Err(err))) if err.kind() == ErrorKind::Io => return Err(err),
                        Ok((peer, Err(err))) => crate::setup_refused(Some(&peer), &err),
                        Err(err) => tracing::debug!(%err, "RDMA connection setup task failed"),
                    }
                }
                accepted = self.tcp.accept(), if self.handshakes.len() < crate::soft::MAX_HANDSHAKES => {
                    let (tcp, addr) = match accepted {
                        Ok(accepted) => accepted,
                        Err(err) => {
                            let err = Error::io("accept", err);
                            if err.kind() == ErrorKind::Closed {
                                continue;
                            }
                            return Err(err);
                        }
                    };
                    let Some(slot) = self.sources.admit(Some(addr)) else {
                        tracing::debug!(peer = %addr, "RDMA connection closed: its source has too many connections in setup");
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let peer = format!("rdma://{addr}");
                    let (setup, options) = (self.config.clone(), self.options.clone());
                    self.handshakes.spawn(async move {
                        // Waiting for the source's turn counts against the timeout.
                        let result = tokio::time::timeout(setup.handshake_timeout, async {
                            let _turn = slot.turn().await;
                            establish(tcp, peer.clone(), &setup, &options).await
                        })
                        .await
                        .unwrap_or_else(|_| {
                            Err(Error::new(
                                ErrorKind::TimedOut,
                                format!("{peer}: connection setup took longer than {:?}", setup.handshake_timeout),
                            ))
                        });
                        (peer, result)
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_messages_round_trip() {
        let qp = QueuePairEndpointBuilder::default()
            .qp_num(0x12_3456)
            .lid(7)
            .gid(async_rdma::Gid::from_raw([9; 16]))
            .build()
            .unwrap();
        let bytes = put_setup(&qp);
        assert_eq!(parse_setup(&bytes, "peer").unwrap(), qp);
        let mut bad = bytes;
        bad[8] = 2;
        assert!(parse_setup(&bad, "peer").is_err());
    }

    /// Receive completions whose tasks finish out of order are handed out in the
    /// order their receives were posted, which is the order the messages came in.
    #[test]
    fn receive_completions_are_taken_in_posting_order() {
        let mut order = InOrder::default();
        assert_eq!(order.take(), None);
        order.put(1, "second");
        order.put(2, "third");
        assert_eq!(order.take(), None, "the first has not come");
        order.put(0, "first");
        assert_eq!(order.take(), Some("first"));
        assert_eq!(order.take(), Some("second"));
        assert_eq!(order.take(), Some("third"));
        assert_eq!(order.take(), None);
        order.put(3, "fourth");
        assert_eq!(order.take(), Some("fourth"));
    }

    #[tokio::test]
    async fn without_a_device_connecting_says_so() {
        let listener = VerbsListener::bind(
            "rdma://127.0.0.1:0",
            RdmaConfig::default(),
            VerbsOptions::default(),
        )
        .await
        .unwrap();
        let uri = listener.local_addr();
        let connector =
            VerbsConnector::new(&uri, RdmaConfig::default(), VerbsOptions::default()).unwrap();
        let accept = tokio::spawn(async move {
            let mut listener = listener;
            listener.accept(&LinkConfig::default()).await.map(|_| ())
        });
        let result = connector.connect(&LinkConfig::default()).await;
        let has_device = std::fs::read_dir("/sys/class/infiniband")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if !has_device {
            let err = result.expect_err("no device, no connection");
            assert!(err.to_string().contains("no RDMA device"), "{err}");
            let err = accept.await.unwrap().expect_err("no device, no connection");
            assert!(err.to_string().contains("no RDMA device"), "{err}");
        } else {
            accept.abort();
        }
    }
}
