//! Bulk transfers (`rpc_core::bulk`) over `rdma://` with the generated `Blob` service:
//! one-sided, and shown to be so.
//!
//! - 1 GiB each way with matching checksums, every byte moved by one-sided
//!   operations of the side holding the descriptor: the links' counters show the
//!   operations, and that no BULK frame crossed either link; the same counters move
//!   the other way when `bulk_one_sided` is off, so the check can fail.
//! - Every misuse of a descriptor gets the code it gets over TCP (`NOT_FOUND`,
//!   `OUT_OF_RANGE`, `PERMISSION_DENIED`), and the connection stays usable.
//! - Two processes: the exposing process runs no code at all while its buffer is
//!   read and written; a peer killed in the middle of a transfer fails it with a
//!   clear error on both sides, and nothing hangs.

mod common;

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use common::{
    no_cma,
    peer::{self, all_switches, say, start_peer},
    socket_path, GUARD,
};
use rpc_core::{
    bulk::{Bulk, BulkDescriptor, MAX_BULK_OP},
    bytes::Bytes,
    client::Channel,
    link::{Connector, LinkConfig, Listener},
    server::Server,
    Code, Error, Request, Response, Status,
};
use rpc_proto::blob::{
    self,
    blob_client::BlobClient,
    blob_server::{Blob, BlobServer},
    checksum, pattern, BlobReply, BlobService, DownloadRequest, UploadRequest,
};
use rpc_transport_rdma::{
    soft::{SoftEndpoint, SoftStats},
    Address, LinkStats, RdmaConfig, RdmaConnector, RdmaLink, RdmaListener,
};
use tokio::sync::{mpsc, Notify};

const GIB: usize = 1 << 30;
const TTL: Duration = Duration::from_secs(300);
/// Transfers of the two-process tests.
const SIZE: usize = 64 << 20;

/// The peer processes' entry point; returns at once in a normal test run.
#[test]
fn peer_process() {
    let Some((role, path)) = peer::role() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let uri = format!("rdma+unix://{}", path.display());
    match role.as_str() {
        "blob-client" => rt.block_on(blob_client(&uri, true)),
        "blob-client-download" => rt.block_on(blob_client(&uri, false)),
        "blob-server-forever" => rt.block_on(blob_server_forever(&uri)),
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------
// Seeing the links: a connector and a listener that keep each link's counters.

/// What a test can see of one link.
#[derive(Clone)]
struct Tap {
    link: Arc<LinkStats>,
    soft: Arc<SoftStats>,
    cma: bool,
}

impl Tap {
    /// Frames that crossed the link either way: requests, replies, and any BULK frame.
    fn frames(&self) -> u64 {
        let s = &self.link;
        [
            &s.eager_sent,
            &s.eager_received,
            &s.rendezvous_sent,
            &s.rendezvous_received,
        ]
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .sum()
    }
}

#[derive(Clone, Default)]
struct Taps(Arc<Mutex<Vec<Tap>>>);

impl Taps {
    fn record(&self, link: &RdmaLink<SoftEndpoint>) {
        self.0.lock().unwrap().push(Tap {
            link: link.stats().clone(),
            soft: link.endpoint().stats().clone(),
            cma: link.endpoint().uses_cross_memory_attach(),
        });
    }

    /// The one link made.
    fn only(&self) -> Tap {
        let taps = self.0.lock().unwrap();
        assert_eq!(taps.len(), 1, "one connection");
        taps[0].clone()
    }
}

struct TappedConnector {
    inner: RdmaConnector,
    taps: Taps,
}

impl Connector for TappedConnector {
    type Link = RdmaLink<SoftEndpoint>;

    async fn connect(&self, config: &LinkConfig) -> Result<Self::Link, Error> {
        let link = self.inner.connect(config).await?;
        self.taps.record(&link);
        Ok(link)
    }

    fn target(&self) -> String {
        self.inner.target()
    }
}

struct TappedListener {
    inner: RdmaListener,
    taps: Taps,
}

impl Listener for TappedListener {
    type Link = RdmaLink<SoftEndpoint>;

    async fn accept(&mut self, config: &LinkConfig) -> Result<Self::Link, Error> {
        let link = self.inner.accept(config).await?;
        self.taps.record(&link);
        Ok(link)
    }

    fn local_addr(&self) -> String {
        self.inner.local_addr()
    }
}

/// A `Blob` server over soft RDMA on loopback with `config` on both sides, and a
/// channel to it: (channel, the client's links, the server's links).
async fn blob_over_rdma(config: RdmaConfig) -> (Channel, Taps, Taps) {
    // A Unix socket: only there is the peer's pid confirmed, for cross-memory attach.
    let address = Address::Unix(socket_path("blob-service"));
    let listener = RdmaListener::bind(&address, config.clone()).await.unwrap();
    let uri = listener.local_addr_uri();
    let server_taps = Taps::default();
    let listener = TappedListener {
        inner: listener,
        taps: server_taps.clone(),
    };
    let server = Server::builder()
        .add_service(BlobServer::new(BlobService))
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let client_taps = Taps::default();
    let connector = TappedConnector {
        inner: RdmaConnector::with_config(&uri, config).unwrap(),
        taps: client_taps.clone(),
    };
    let channel = Channel::builder().connect(connector).await.unwrap();
    (channel, client_taps, server_taps)
}

/// Uploads `len` bytes and downloads `len` bytes through `Blob`, checking both
/// checksums.
async fn both_ways(channel: Channel, len: usize) {
    // Upload: the server reads `len` bytes from the client's exposed buffer.
    let data = pattern(1, len);
    let expected = checksum(&data);
    let reply = blob::upload(&channel, data, TTL)
        .await
        .unwrap_or_else(|s| panic!("upload failed: {s}"));
    assert_eq!(reply.len, len as u64);
    assert_eq!(reply.checksum, expected, "upload checksum");

    // Download: the server writes `len` bytes into the client's writable buffer.
    let (reply, received) = blob::download(&channel, len, 2, TTL)
        .await
        .unwrap_or_else(|s| panic!("download failed: {s}"));
    assert_eq!(received.len(), len);
    assert_eq!(checksum(&received), reply.checksum, "download checksum");
    assert_eq!(reply.checksum, checksum(&pattern(2, len)));
}

/// What shows that the transfers of `both_ways(len)` were not one-sided (empty if
/// they were): the server must have read and written every byte with one-sided
/// operations on regions the client exposed, and neither link may have carried more
/// than the calls' own few frames (1 MiB BULK frames would have gone by rendezvous,
/// and their requests eagerly).
fn not_one_sided(client: &Tap, server: &Tap, len: usize) -> Vec<String> {
    let pieces = len.div_ceil(MAX_BULK_OP) as u64;
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let mut wrong = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            wrong.push(what);
        }
    };
    let s = &server.link;
    check(
        load(&s.bulk_reads) == pieces && load(&s.bulk_writes) == pieces,
        format!(
            "the server made {} one-sided reads and {} writes, not {pieces} each",
            load(&s.bulk_reads),
            load(&s.bulk_writes)
        ),
    );
    check(
        load(&s.bulk_bytes) == 2 * len as u64,
        format!("the server moved {} bytes one-sided", load(&s.bulk_bytes)),
    );
    check(
        load(&s.bulk_failed) == 0,
        format!("{} one-sided operations failed", load(&s.bulk_failed)),
    );
    check(
        load(&client.link.bulk_exposed) == 2,
        format!(
            "the client exposed {} regions, not 2",
            load(&client.link.bulk_exposed)
        ),
    );
    for (side, tap) in [("client", client), ("server", server)] {
        check(
            load(&tap.link.pulled_bytes) == 0,
            format!(
                "{side}: {} bytes of frames went by rendezvous",
                load(&tap.link.pulled_bytes)
            ),
        );
        check(
            tap.frames() < 16,
            format!("{side}: {} frames crossed the link", tap.frames()),
        );
    }
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_each_way_through_the_blob_service_is_one_sided() {
    let (channel, client, server) = blob_over_rdma(RdmaConfig::default()).await;
    assert!(channel.bulk().is_one_sided());
    tokio::time::timeout(10 * GUARD, both_ways(channel, GIB))
        .await
        .expect("the transfer hung");
    let (client, server) = (client.only(), server.only());
    assert!(client.cma && server.cma, "one host: cross-memory attach");
    assert_eq!(not_one_sided(&client, &server, GIB), Vec::<String>::new());
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    // By cross-memory attach: the server copied, the client's transport served
    // nothing either.
    assert!(load(&server.soft.cma_reads) >= (GIB / MAX_BULK_OP) as u64);
    assert!(load(&server.soft.cma_writes) >= (GIB / MAX_BULK_OP) as u64);
    assert_eq!(load(&client.soft.served), 0, "the client's responder");
    assert_eq!(load(&client.soft.rejected) + load(&server.soft.rejected), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_responder_bulk_is_still_one_sided_for_the_core() {
    // And one operation at a time: `Blob` keeps 8 in flight, 7 wait for the slot.
    let config = RdmaConfig {
        max_bulk_ops: 1,
        ..no_cma()
    };
    let (channel, client, server) = blob_over_rdma(config).await;
    assert!(channel.bulk().is_one_sided());
    tokio::time::timeout(GUARD, both_ways(channel, 64 << 20))
        .await
        .expect("the transfer hung");
    let (client, server) = (client.only(), server.only());
    assert!(!client.cma && !server.cma);
    assert_eq!(
        not_one_sided(&client, &server, 64 << 20),
        Vec::<String>::new()
    );
    // The client's transport served them (its responder task), not its core: the
    // frames above were only the calls'.
    assert!(client.soft.served.load(Ordering::Relaxed) >= 2 * 64 * 4);
    assert!(server.soft.remote_ops.load(Ordering::Relaxed) >= 2 * 64);
}

/// The checks of `not_one_sided` can fail: with `bulk_one_sided` off, the same
/// transfers are BULK frames served by the client's connection, and the counters
/// say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_bulk_one_sided_off_the_connection_serves_bulk_frames_and_the_counters_show_it() {
    let config = RdmaConfig {
        bulk_one_sided: false,
        ..RdmaConfig::default()
    };
    let (channel, client, server) = blob_over_rdma(config).await;
    assert!(!channel.bulk().is_one_sided());
    let len = 64 << 20;
    tokio::time::timeout(GUARD, both_ways(channel, len))
        .await
        .expect("the transfer hung");
    let (client, server) = (client.only(), server.only());
    let wrong = not_one_sided(&client, &server, len);
    eprintln!("{wrong:#?}");
    assert_eq!(
        wrong.len(),
        7,
        "every check but bulk_failed fails: {wrong:#?}"
    );
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    assert_eq!(
        load(&server.link.bulk_reads) + load(&server.link.bulk_writes),
        0
    );
    // 64 read replies of 1 MiB by rendezvous from the client, 64 write requests of
    // 1 MiB from the server.
    assert!(load(&client.link.rendezvous_sent) >= 64);
    assert!(load(&server.link.rendezvous_sent) >= 64);
    assert!(client.frames() >= 4 * 64);
}

// ---------------------------------------------------------------------------------
// Misuse.

async fn misused_descriptors(config: RdmaConfig) {
    let (channel, client, server) = blob_over_rdma(config).await;
    let bulk = channel.bulk();
    assert!(bulk.is_one_sided());
    let blob = BlobClient::new(channel);
    let upload = |descriptor: Bytes| {
        let mut blob = blob.clone();
        async move { blob.upload(UploadRequest { descriptor }).await }
    };
    let expect = |result: Result<_, Status>, code: Code, words: &str, what: &str| {
        let status = result.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status}");
        assert!(status.message().contains(words), "{what}: {status}");
        eprintln!("{what}: {status}");
    };
    // The descriptor: [1][access][token u64][len u64] and the region descriptor from
    // byte 18: [key u64][addr u64][len u64][access u8][7 zero bytes].
    const LEN: usize = 10;
    const KEY: usize = 18;
    const REGION_LEN: usize = 18 + 16;

    // Garbage, and a region descriptor cut short.
    expect(
        upload("junk".into()).await,
        Code::INVALID_ARGUMENT,
        "not a bulk descriptor",
        "garbage",
    );
    let small = bulk.expose_read(vec![1u8; 100].into(), TTL).unwrap();
    let cut = small.descriptor().to_bytes().slice(..KEY + 20);
    expect(
        upload(cut).await,
        Code::INVALID_ARGUMENT,
        "not an RDMA region descriptor",
        "a region descriptor cut short",
    );
    // Reading a buffer exposed for writing only.
    let write_only = bulk.expose_write(1000, TTL).unwrap();
    expect(
        upload(write_only.descriptor().to_bytes()).await,
        Code::PERMISSION_DENIED,
        "read access denied",
        "read of a write-only buffer",
    );
    // Writing a buffer exposed for reading only.
    let read_only = bulk.expose_read("secret".into(), TTL).unwrap();
    let status = blob
        .clone()
        .download(DownloadRequest {
            descriptor: read_only.descriptor().to_bytes(),
            len: 6,
            seed: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    assert!(status.message().contains("write access denied"), "{status}");
    // Past the end. A forged length in the bulk descriptor only: the requester's
    // own check of the region descriptor refuses it.
    let mut forged = small.descriptor().to_bytes().to_vec();
    forged[LEN..LEN + 8].copy_from_slice(&1_000_000u64.to_be_bytes());
    expect(
        upload(forged.clone().into()).await,
        Code::OUT_OF_RANGE,
        "out of bounds",
        "read past the end (the requester's check)",
    );
    // Forged in the region descriptor too: the owner's table refuses it.
    forged[REGION_LEN..REGION_LEN + 8].copy_from_slice(&1_000_000u64.to_be_bytes());
    expect(
        upload(forged.into()).await,
        Code::OUT_OF_RANGE,
        "do not fit the region",
        "read past the end (the owner's check)",
    );
    // Wrong keys: a later generation, and a slot nothing was registered in.
    let key = |d: &[u8]| u64::from_be_bytes(d[KEY..KEY + 8].try_into().unwrap());
    for (what, wrong) in [("a wrong key", 7u64 << 32), ("a wrong slot", 500)] {
        let mut d = small.descriptor().to_bytes().to_vec();
        let k = key(&d) + wrong;
        d[KEY..KEY + 8].copy_from_slice(&k.to_be_bytes());
        expect(
            upload(d.into()).await,
            Code::NOT_FOUND,
            "unknown remote key",
            what,
        );
    }
    // Use after revocation: the buffer was dropped; then another takes its slot.
    let gone = bulk.expose_read(vec![2u8; 100].into(), TTL).unwrap();
    let descriptor = gone.descriptor().to_bytes();
    drop(gone);
    expect(
        upload(descriptor.clone()).await,
        Code::NOT_FOUND,
        "revoked",
        "use after revoke",
    );
    let again = bulk.expose_read(vec![3u8; 100].into(), TTL).unwrap();
    assert_eq!(
        key(&again.descriptor().to_bytes()) & 0xffff_ffff,
        key(&descriptor) & 0xffff_ffff,
        "the slot is reused"
    );
    expect(
        upload(descriptor).await,
        Code::NOT_FOUND,
        "revoked",
        "use after revoke, slot reused",
    );

    // And the connection still works: the same link, no reconnection.
    let reply = upload(small.descriptor().to_bytes()).await.unwrap();
    assert_eq!(reply.get_ref().checksum, checksum(&[1u8; 100]));
    let reply = upload(again.descriptor().to_bytes()).await.unwrap();
    assert_eq!(reply.get_ref().checksum, checksum(&[3u8; 100]));
    let (client, server) = (client.only(), server.only());
    // Refused by the owner: every case but the requester's own length check (and
    // the two malformed descriptors, which never reached the provider).
    assert_eq!(server.link.bulk_failed.load(Ordering::Relaxed), 7);
    assert_eq!(server.soft.rejected.load(Ordering::Relaxed), 7);
    assert_eq!(client.link.bulk_failed.load(Ordering::Relaxed), 0);
    drop((write_only, read_only));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misused_descriptors_get_the_codes_of_tcp_and_the_connection_stays_usable() {
    misused_descriptors(RdmaConfig::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misused_descriptors_through_the_responder_too() {
    misused_descriptors(no_cma()).await;
}

// ---------------------------------------------------------------------------------
// Two processes.

/// Peer role: a client that uploads `SIZE` bytes, then downloads `SIZE` bytes
/// (`upload` false: only downloads), and says how each went.
async fn blob_client(uri: &str, upload: bool) {
    let channel = rpc_transport_rdma::connect(uri).await.unwrap();
    let bulk = channel.bulk();
    assert!(bulk.is_one_sided());
    let mut blob = BlobClient::new(channel);
    if upload {
        let data = pattern(1, SIZE);
        let exposed = bulk.expose_read(data.clone(), TTL).unwrap();
        say("uploading");
        let reply = blob
            .upload(UploadRequest {
                descriptor: exposed.descriptor().to_bytes(),
            })
            .await;
        match reply {
            Ok(r) if r.get_ref().checksum == checksum(&data) => say("uploaded ok"),
            Ok(_) => say("uploaded bad"),
            Err(status) => say(&format!("upload failed: {status}")),
        }
    }
    let exposed = bulk.expose_write(SIZE, TTL).unwrap();
    say("downloading");
    let reply = blob
        .download(DownloadRequest {
            descriptor: exposed.descriptor().to_bytes(),
            len: SIZE as u64,
            seed: 2,
        })
        .await;
    let data = exposed.into_bytes().await;
    match reply {
        Ok(r) if r.get_ref().checksum == checksum(&data) => say("downloaded ok"),
        Ok(_) => say("downloaded bad"),
        Err(status) => say(&format!("download failed: {status}")),
    }
}

/// Peer role: a `Blob` server that never finishes: it reads (or writes) the client's
/// buffer over and over, saying `reading` (`writing`) once it has moved 8 MiB.
async fn blob_server_forever(uri: &str) {
    #[derive(Clone)]
    struct Forever;

    fn bulk_of<T>(request: &Request<T>) -> Bulk {
        request.bulk().cloned().expect("a bulk endpoint")
    }

    impl Blob for Forever {
        async fn upload(
            &self,
            request: Request<UploadRequest>,
        ) -> Result<Response<BlobReply>, Status> {
            let bulk = bulk_of(&request);
            let d = BulkDescriptor::from_bytes(&request.get_ref().descriptor)?;
            for i in 0.. {
                let offset = (i * MAX_BULK_OP) % d.len() as usize;
                bulk.read(&d, offset as u64, MAX_BULK_OP).await?;
                if i == 8 {
                    say("reading");
                }
            }
            unreachable!()
        }

        async fn download(
            &self,
            request: Request<DownloadRequest>,
        ) -> Result<Response<BlobReply>, Status> {
            let bulk = bulk_of(&request);
            let d = BulkDescriptor::from_bytes(&request.get_ref().descriptor)?;
            let data = pattern(2, d.len() as usize);
            for i in 0.. {
                let offset = (i * MAX_BULK_OP) % d.len() as usize;
                let piece = data.slice(offset..offset + MAX_BULK_OP);
                bulk.write(&d, offset as u64, piece).await?;
                if i == 8 {
                    say("writing");
                }
            }
            unreachable!()
        }
    }

    let listener = rpc_transport_rdma::bind(uri).await.unwrap();
    say("listening");
    Server::builder()
        .add_service(BlobServer::new(Forever))
        .build()
        .serve(listener)
        .await
        .unwrap();
}

/// Waits until every thread of process `pid` is asleep (state `S` in
/// `/proc/<pid>/task/*/stat`).
async fn asleep(pid: u32) {
    let all_asleep = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|task| {
                let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap();
                // `pid (comm) S ...`: the state follows the last parenthesis.
                let state = stat[stat.rfind(')').unwrap() + 1..].trim_start();
                state.starts_with('S')
            })
    };
    tokio::time::timeout(GUARD, async {
        while !all_asleep() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the peer never went to sleep");
}

/// A `Blob` server that checks, around each transfer, that no thread of the client
/// process (`pid`) ran while it read or wrote the client's memory.
#[derive(Clone)]
struct Watching {
    pid: Arc<AtomicU32>,
    quiet: mpsc::UnboundedSender<bool>,
}

impl Blob for Watching {
    async fn upload(&self, request: Request<UploadRequest>) -> Result<Response<BlobReply>, Status> {
        let bulk = request.bulk().cloned().expect("a bulk endpoint");
        let d = BulkDescriptor::from_bytes(&request.get_ref().descriptor)?;
        let pid = self.pid.load(Ordering::SeqCst);
        asleep(pid).await;
        let before = all_switches(pid);
        let data = bulk.read_all(&d).await?;
        let _ = self.quiet.send(all_switches(pid) == before);
        Ok(Response::new(BlobReply {
            len: data.len() as u64,
            checksum: checksum(&data),
        }))
    }

    async fn download(
        &self,
        request: Request<DownloadRequest>,
    ) -> Result<Response<BlobReply>, Status> {
        let bulk = request.bulk().cloned().expect("a bulk endpoint");
        let d = BulkDescriptor::from_bytes(&request.get_ref().descriptor)?;
        let data = pattern(request.get_ref().seed, d.len() as usize);
        let pid = self.pid.load(Ordering::SeqCst);
        asleep(pid).await;
        let before = all_switches(pid);
        bulk.write_all(&d, data.clone()).await?;
        let _ = self.quiet.send(all_switches(pid) == before);
        Ok(Response::new(BlobReply {
            len: data.len() as u64,
            checksum: checksum(&data),
        }))
    }
}

/// Binds an `rdma+unix://` listener and serves `service` on it.
async fn serve_blob<B: Blob>(service: B) -> std::path::PathBuf {
    let path = socket_path("blob");
    let listener = RdmaListener::bind(&Address::Unix(path.clone()), RdmaConfig::default())
        .await
        .unwrap();
    let server = Server::builder()
        .add_service(BlobServer::new(service))
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposing_process_runs_no_code_while_its_buffers_are_read_and_written() {
    let pid = Arc::new(AtomicU32::new(0));
    let (quiet, mut quiet_rx) = mpsc::unbounded_channel();
    let path = serve_blob(Watching {
        pid: pid.clone(),
        quiet,
    })
    .await;
    let mut peer = peer::start_client_peer("blob-client", path).await;
    pid.store(peer.pid(), Ordering::SeqCst);
    peer.wait_for("uploading").await;
    peer.wait_for("uploaded ok").await;
    peer.wait_for("downloading").await;
    peer.wait_for("downloaded ok").await;
    for what in ["upload", "download"] {
        let quiet = tokio::time::timeout(GUARD, quiet_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            quiet,
            "{what}: no thread of the client process ran while the server moved {SIZE} bytes"
        );
    }
    let status = tokio::time::timeout(GUARD, peer.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

/// A `Blob` server whose transfers run in tasks of their own (a handler is dropped
/// with its connection; the transfer's outcome must still be seen): after 8 MiB a
/// transfer says so and waits for `resume`, then goes on to the end and reports.
#[derive(Clone)]
struct Pausing {
    halfway: Arc<Notify>,
    resume: Arc<Notify>,
    outcome: mpsc::UnboundedSender<Result<(), Status>>,
}

impl Pausing {
    async fn transfer(
        &self,
        bulk: Bulk,
        d: BulkDescriptor,
        write: bool,
    ) -> Result<Response<BlobReply>, Status> {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let data = if write {
                pattern(2, d.len() as usize)
            } else {
                Bytes::new()
            };
            let mut result = Ok(());
            for (i, offset) in (0..d.len() as usize).step_by(MAX_BULK_OP).enumerate() {
                if i == 8 {
                    this.halfway.notify_one();
                    this.resume.notified().await;
                }
                let piece = if write {
                    let piece = data.slice(offset..offset + MAX_BULK_OP);
                    bulk.write(&d, offset as u64, piece).await
                } else {
                    bulk.read(&d, offset as u64, MAX_BULK_OP).await.map(drop)
                };
                if let Err(status) = piece {
                    result = Err(status);
                    break;
                }
            }
            let _ = this.outcome.send(result.clone());
            result
        });
        task.await.unwrap()?;
        Ok(Response::new(BlobReply::default()))
    }
}

impl Blob for Pausing {
    async fn upload(&self, request: Request<UploadRequest>) -> Result<Response<BlobReply>, Status> {
        let bulk = request.bulk().cloned().expect("a bulk endpoint");
        let d = BulkDescriptor::from_bytes(&request.get_ref().descriptor)?;
        self.transfer(bulk, d, false).await
    }

    async fn download(
        &self,
        request: Request<DownloadRequest>,
    ) -> Result<Response<BlobReply>, Status> {
        let bulk = request.bulk().cloned().expect("a bulk endpoint");
        let d = BulkDescriptor::from_bytes(&request.get_ref().descriptor)?;
        self.transfer(bulk, d, true).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_transfer_fails_the_servers_reads_and_writes_clearly() {
    let halfway = Arc::new(Notify::new());
    let resume = Arc::new(Notify::new());
    let (outcome, mut outcomes) = mpsc::unbounded_channel();
    let path = serve_blob(Pausing {
        halfway: halfway.clone(),
        resume: resume.clone(),
        outcome,
    })
    .await;
    for (role, what) in [
        ("blob-client", "uploading"),
        ("blob-client-download", "downloading"),
    ] {
        let mut peer = peer::start_client_peer(role, path.clone()).await;
        peer.wait_for(what).await;
        tokio::time::timeout(GUARD, halfway.notified())
            .await
            .expect("the transfer never got halfway");
        // The client process dies with its buffer half read (written).
        peer.kill().await;
        resume.notify_one();
        let result = tokio::time::timeout(GUARD, outcomes.recv())
            .await
            .expect("the transfer hung after the peer died")
            .unwrap();
        let status = result.expect_err("a transfer from a dead process");
        eprintln!("{role}: {status}");
        assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
        let text = status.message();
        assert!(
            text.contains("is gone") || text.contains("is closed") || text.contains("ended"),
            "a clear error: {text}"
        );
        drop(peer);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_transfer_fails_the_call_and_frees_the_buffer() {
    // Upload: the server dies while it reads the client's buffer.
    let mut server = start_peer("blob-server-forever").await;
    server.wait_for("listening").await;
    let uri = format!("rdma+unix://{}", server.path.display());
    let channel = rpc_transport_rdma::connect(&uri).await.unwrap();
    let bulk = channel.bulk();
    let exposed = bulk.expose_read(pattern(1, SIZE), TTL).unwrap();
    let mut blob = BlobClient::new(channel.clone());
    let descriptor = exposed.descriptor().to_bytes();
    let call = tokio::spawn(async move { blob.upload(UploadRequest { descriptor }).await });
    server.wait_for("reading").await;
    server.kill().await;
    let status = tokio::time::timeout(GUARD, call)
        .await
        .expect("the call hung after the server died")
        .unwrap()
        .expect_err("an upload to a dead server");
    eprintln!("upload: {status}");
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    drop(exposed);
    drop(server);

    // Download: the server dies while it writes the client's buffer, most likely in
    // the middle of a copy; taking the buffer back must not wait for it.
    let mut server = start_peer("blob-server-forever").await;
    server.wait_for("listening").await;
    let uri = format!("rdma+unix://{}", server.path.display());
    let channel = rpc_transport_rdma::connect(&uri).await.unwrap();
    let bulk = channel.bulk();
    let exposed = bulk.expose_write(SIZE, TTL).unwrap();
    let mut blob = BlobClient::new(channel.clone());
    let descriptor = exposed.descriptor().to_bytes();
    let call = tokio::spawn(async move {
        blob.download(DownloadRequest {
            descriptor,
            len: SIZE as u64,
            seed: 2,
        })
        .await
    });
    server.wait_for("writing").await;
    server.kill().await;
    let status = tokio::time::timeout(GUARD, call)
        .await
        .expect("the call hung after the server died")
        .unwrap()
        .expect_err("a download from a dead server");
    eprintln!("download: {status}");
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    let data = tokio::time::timeout(GUARD, exposed.into_bytes())
        .await
        .expect("taking the buffer back hung");
    assert_eq!(data.len(), SIZE);
    // What the server wrote before it died is there.
    assert!(data[..8 * MAX_BULK_OP] == pattern(2, SIZE)[..8 * MAX_BULK_OP]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_sided_buffer_is_revoked_when_its_time_to_live_runs_out() {
    let (channel, _, _) = blob_over_rdma(RdmaConfig::default()).await;
    let bulk = channel.bulk();
    assert!(bulk.is_one_sided());
    let mut blob = rpc_proto::blob::blob_client::BlobClient::new(channel);
    let brief = bulk
        .expose_read(vec![5u8; 100].into(), std::time::Duration::from_millis(1))
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let status = blob
        .upload(rpc_proto::blob::UploadRequest {
            descriptor: brief.descriptor().to_bytes(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NOT_FOUND, "{status}");
    // A buffer within its time still works.
    let lasting = bulk.expose_read(vec![6u8; 100].into(), TTL).unwrap();
    let reply = blob
        .upload(rpc_proto::blob::UploadRequest {
            descriptor: lasting.descriptor().to_bytes(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().checksum, checksum(&[6u8; 100]));
}

/// A connection's bulk exposures cannot take the region table's last places: the link
/// keeps what its rendezvous may need. Past their share an exposure is refused
/// `RESOURCE_EXHAUSTED`, and a large frame still goes. (A review: exposures that
/// filled the table made the next frame above the eager limit fail the whole
/// connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_exposures_leave_the_rendezvous_their_regions() {
    // 8 regions, 4 of them kept for one rendezvous of up to 4 segments.
    let config = RdmaConfig {
        max_rendezvous: 1,
        max_regions: 8,
        ..RdmaConfig::default()
    };
    let (channel, _client, _server) = blob_over_rdma(config).await;
    let bulk = channel.bulk();
    let expose = || bulk.expose_read(vec![1u8; 100].into(), TTL);
    let held: Vec<_> = (0..4).map(|_| expose().unwrap()).collect();
    let refused = expose().expect_err("an exposure took a region kept for rendezvous");
    assert_eq!(refused.code(), Code::RESOURCE_EXHAUSTED, "{refused}");
    // A 64 KiB request goes by rendezvous, in the regions kept for it: the server
    // answers it (the descriptor is garbage), and the connection stays.
    let mut blob = BlobClient::new(channel.clone());
    let status = blob
        .upload(UploadRequest {
            descriptor: vec![0u8; 64 << 10].into(),
        })
        .await
        .expect_err("garbage uploaded");
    assert_eq!(status.code(), Code::INVALID_ARGUMENT, "{status}");
    drop(held);
    expose().expect("the regions given back are free again");
}
