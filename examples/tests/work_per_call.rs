//! The work per call, counted rather than timed: a regression guard for the unary path
//! (issue 17). Not a benchmark: nothing here reads a clock.
//!
//! A counting global allocator records, for each side of a call, the allocations (and
//! the bytes they asked for) made by that side's thread: the client runs on this
//! test's thread, the server on a thread of its own, each on a `current_thread` Tokio
//! runtime, so every allocation is made by exactly one of them. The generated `Echo`
//! client and server (`rpc_proto::echo`, as `rpc-bench` measures them) make sequential
//! calls of 32 bytes over the in-memory link and over TCP on loopback:
//!
//! - `unary`: `Echo/Say`, no deadline;
//! - `unary_deadline`: `Echo/Say` with a 60 s deadline (the client arms a timer);
//! - `stream_message`: one request message and its answer on an open `Echo/Chat`
//!   stream.
//!
//! Each figure is the minimum, over [`BATCHES`] batches of [`CALLS`] calls after
//! [`WARM_UP`] calls, of the batch's average per call; the minimum drops the rare
//! batch in which a queue or table grew. The figures are compared with
//! `work_per_call.baseline` next to this file: a figure more than [`TOLERANCE`] above
//! its baseline (plus [`SLACK_ALLOCS`] allocation or [`SLACK_BYTES`] bytes) fails the
//! test. A change that must add work rewrites the baseline with
//! `RPC_UPDATE_BASELINE=1 cargo test -p rpc-examples --test work_per_call` and says
//! why in its commit message.
//!
//! Debug builds (what `cargo test` runs) and release builds allocate differently
//! (the optimizer removes some allocations), so the baseline keeps each profile's
//! figures under its own prefix. Thread parks per call (how often each side's thread
//! found nothing to do and slept: wake-ups) are printed too, but not checked: they
//! depend on timing; so are the sizes of the structs a call moves around.
//!
//! `RPC_WORK_TRACE=1` prints where each allocation of one call of each kind comes
//! from (a backtrace per allocation, this workspace's frames): the place to start
//! when the test fails. `--nocapture` shows the table.

// A global allocator is an `unsafe impl`; it only counts and forwards to `System`.
#![allow(unsafe_code)]

#[path = "common/baseline.rs"]
mod baseline;

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    collections::BTreeMap,
    fmt::Write as _,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use baseline::profile;
use bytes::Bytes;
use futures::Stream;
use rpc_core::{
    client::Channel,
    link::{mem, Connector, Listener},
    server::Server,
    stream::Streaming,
    Request,
};
use rpc_proto::echo::{
    echo_client::EchoClient, echo_server::EchoServer, EchoService, SayReply, SayRequest,
};

/// Calls before counting: connections, tables and buffers reach their steady size.
const WARM_UP: usize = 500;
/// Calls per batch.
const CALLS: usize = 2_000;
/// Batches per figure (the figure is the smallest batch average).
const BATCHES: usize = 3;
/// A figure may grow by this fraction of its baseline before the test fails...
const TOLERANCE: f64 = 0.05;
/// ... plus this many allocations per call. Half of one: the counts are whole numbers
/// run after run (a queue's block now and then moves them by hundredths), and on a
/// path of two or four allocations one more is exactly what this test is for.
const SLACK_ALLOCS: f64 = 0.5;
/// ... or this many bytes per call.
const SLACK_BYTES: f64 = 64.0;
/// Request payload bytes (`rpc-bench`'s latency workload sends 32).
const PAYLOAD: usize = 32;

const BASELINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/work_per_call.baseline");

/// Which side a thread counts for.
const NOBODY: usize = 0;
const CLIENT: usize = 1;
const SERVER: usize = 2;

thread_local! {
    static SIDE: Cell<usize> = const { Cell::new(NOBODY) };
}

static ALLOCS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static BYTES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static PARKS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Counts allocations (a `realloc` counts as one, of its new size) per side.
struct Counting;

fn count(size: usize) {
    // `try_with`: the allocator runs during thread teardown too, after the slot is gone.
    let side = SIDE.try_with(Cell::get).unwrap_or(NOBODY);
    ALLOCS[side].fetch_add(1, Ordering::Relaxed);
    BYTES[side].fetch_add(size as u64, Ordering::Relaxed);
    if TRACE.load(Ordering::Relaxed) && side != NOBODY {
        trace(side, size);
    }
}

/// `RPC_WORK_TRACE=1`: where the allocations of one call of each kind come from.
static TRACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TRACES: Mutex<Vec<(usize, usize, String)>> = Mutex::new(Vec::new());

thread_local! {
    /// Set while this thread records a trace (which allocates: not traced itself).
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

fn trace(side: usize, size: usize) {
    if IN_TRACE.try_with(|t| t.replace(true)).unwrap_or(true) {
        return;
    }
    let backtrace = std::backtrace::Backtrace::force_capture().to_string();
    TRACES.lock().unwrap().push((side, size, backtrace));
    IN_TRACE.with(|t| t.set(false));
}

/// Prints the traces recorded: for each allocation its side, size and the frames of
/// this workspace's crates (and of the few dependencies that allocate for them).
fn print_traces(name: &str) {
    let traces = std::mem::take(&mut *TRACES.lock().unwrap());
    println!("allocations of one {name} call:");
    for (side, size, backtrace) in traces {
        let side = if side == CLIENT { "client" } else { "server" };
        println!("  {side} {size} bytes");
        let mut shown = 0;
        for line in backtrace.lines() {
            // Frames read `N: function`; their `at file:line` follows on the next line.
            let Some((_, function)) = line.trim().split_once(": ") else {
                continue;
            };
            if line.trim().starts_with("at ") {
                continue;
            }
            let ours = [
                "rpc_", "tokio::", "bytes::", "futures_", "prost::", "tower::",
            ]
            .iter()
            .any(|krate| function.contains(krate));
            if ours && shown < 6 {
                println!("    {function}");
                shown += 1;
            }
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees are ours; counting touches only atomics and a `const`
// thread-local `Cell` (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (every allocation goes through it).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: as for `dealloc`, and the caller's contract is `System.realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One side's counters at one moment.
#[derive(Clone, Copy)]
struct Snapshot {
    allocs: u64,
    bytes: u64,
    parks: u64,
}

fn snapshot(side: usize) -> Snapshot {
    Snapshot {
        allocs: ALLOCS[side].load(Ordering::SeqCst),
        bytes: BYTES[side].load(Ordering::SeqCst),
        parks: PARKS[side].load(Ordering::SeqCst),
    }
}

/// Per-call averages of one side over one batch.
#[derive(Clone, Copy, Debug)]
struct PerCall {
    allocs: f64,
    bytes: f64,
    parks: f64,
}

impl PerCall {
    fn between(before: Snapshot, after: Snapshot, calls: usize) -> PerCall {
        let n = calls as f64;
        PerCall {
            allocs: (after.allocs - before.allocs) as f64 / n,
            bytes: (after.bytes - before.bytes) as f64 / n,
            parks: (after.parks - before.parks) as f64 / n,
        }
    }

    fn min(self, other: PerCall) -> PerCall {
        PerCall {
            allocs: self.allocs.min(other.allocs),
            bytes: self.bytes.min(other.bytes),
            parks: self.parks.min(other.parks),
        }
    }
}

/// A `current_thread` runtime whose thread counts for `side`.
fn runtime(side: usize) -> tokio::runtime::Runtime {
    SIDE.with(|s| s.set(side));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || {
            PARKS[side].fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .expect("runtime")
}

/// The server's end of a transport.
enum Listen {
    Mem(mem::MemListener),
    /// Bound on the server's thread (a socket belongs to the runtime that made it).
    Tcp,
}

/// Serves `Echo` from a thread of its own until `stop` is dropped; returns the address
/// it listens on.
fn serve(
    listen: Listen,
) -> (
    String,
    std::thread::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound, address) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = runtime(SERVER);
        rt.block_on(async move {
            let server = Server::builder()
                .add_service(EchoServer::new(EchoService))
                .build();
            let stopped = async move {
                let _ = stopped.await;
            };
            let _ = match listen {
                Listen::Mem(listener) => {
                    bound.send(listener.local_addr()).unwrap();
                    server.serve_with_shutdown(listener, stopped).await
                }
                Listen::Tcp => {
                    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0")
                        .await
                        .expect("bind");
                    bound.send(listener.local_addr()).unwrap();
                    server.serve_with_shutdown(listener, stopped).await
                }
            };
        });
        SIDE.with(|s| s.set(NOBODY));
    });
    (address.recv().expect("server thread"), thread, stop)
}

/// The request messages of an open `Chat` stream, handed over one at a time without
/// allocating (a channel would allocate per message and blur the count).
#[derive(Clone, Default)]
struct Slot(Arc<Mutex<SlotState>>);

#[derive(Default)]
struct SlotState {
    message: Option<SayRequest>,
    waker: Option<Waker>,
    closed: bool,
}

impl Slot {
    fn put(&self, message: SayRequest) {
        let mut slot = self.0.lock().unwrap();
        slot.message = Some(message);
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
    }

    fn close(&self) {
        let mut slot = self.0.lock().unwrap();
        slot.closed = true;
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
    }
}

impl Stream for Slot {
    type Item = SayRequest;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SayRequest>> {
        let mut slot = self.0.lock().unwrap();
        if let Some(message) = slot.message.take() {
            return Poll::Ready(Some(message));
        }
        if slot.closed {
            return Poll::Ready(None);
        }
        if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            slot.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// What one measurement does per call.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Unary,
    UnaryDeadline,
    StreamMessage,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Unary, Kind::UnaryDeadline, Kind::StreamMessage];

    fn name(self) -> &'static str {
        match self {
            Kind::Unary => "unary",
            Kind::UnaryDeadline => "unary_deadline",
            Kind::StreamMessage => "stream_message",
        }
    }
}

/// One `Echo/Say` call.
async fn say(client: &mut EchoClient<Channel>, payload: &Bytes, kind: Kind) {
    let mut request = Request::new(SayRequest {
        message: String::new(),
        payload: payload.clone(),
    });
    if matches!(kind, Kind::UnaryDeadline) {
        request.set_timeout(Duration::from_secs(60));
    }
    let reply = client.say(request).await.expect("Say");
    assert_eq!(reply.get_ref().payload.len(), PAYLOAD);
}

/// One message and its answer on an open `Echo/Chat` stream.
async fn exchange(slot: &Slot, replies: &mut Streaming<SayReply>, payload: &Bytes) {
    slot.put(SayRequest {
        message: String::new(),
        payload: payload.clone(),
    });
    let reply = replies
        .message()
        .await
        .expect("Chat message")
        .expect("a reply");
    assert_eq!(reply.payload.len(), PAYLOAD);
}

/// Client and server figures of each kind of call over one connector.
async fn measure<C: Connector>(connector: C) -> Vec<(Kind, PerCall, PerCall)> {
    let channel = Channel::builder()
        .connect(connector)
        .await
        .expect("connect");
    let mut client = EchoClient::new(channel);
    let payload = Bytes::from(vec![7u8; PAYLOAD]);
    let mut results = Vec::new();
    for kind in Kind::ALL {
        let mut stream = match kind {
            Kind::StreamMessage => {
                let slot = Slot::default();
                let replies = client.chat(slot.clone()).await.expect("Chat").into_inner();
                Some((slot, replies))
            }
            _ => None,
        };
        let mut one = async |client: &mut EchoClient<Channel>| match &mut stream {
            Some((slot, replies)) => exchange(slot, replies, &payload).await,
            None => say(client, &payload, kind).await,
        };
        for _ in 0..WARM_UP {
            one(&mut client).await;
        }
        if std::env::var_os("RPC_WORK_TRACE").is_some_and(|v| v == "1") {
            TRACE.store(true, Ordering::SeqCst);
            one(&mut client).await;
            // The server may still be finishing the call: give it a moment.
            tokio::time::sleep(Duration::from_millis(50)).await;
            TRACE.store(false, Ordering::SeqCst);
            print_traces(kind.name());
        }
        let mut best: Option<(PerCall, PerCall)> = None;
        for _ in 0..BATCHES {
            let (c0, s0) = (snapshot(CLIENT), snapshot(SERVER));
            for _ in 0..CALLS {
                one(&mut client).await;
            }
            let (c1, s1) = (snapshot(CLIENT), snapshot(SERVER));
            let (c, s) = (
                PerCall::between(c0, c1, CALLS),
                PerCall::between(s0, s1, CALLS),
            );
            best = Some(best.map_or((c, s), |(bc, bs)| (bc.min(c), bs.min(s))));
        }
        if let Some((slot, mut replies)) = stream.take() {
            slot.close();
            while replies.message().await.expect("Chat end").is_some() {}
        }
        let (c, s) = best.expect("at least one batch");
        results.push((kind, c, s));
    }
    results
}

/// Runs the measurements over one transport: the server listens as `listen` says,
/// the client connects with what `connector` makes of the server's address.
fn transport<C: Connector>(
    listen: Listen,
    connector: impl FnOnce(&str) -> C,
) -> Vec<(Kind, PerCall, PerCall)> {
    let (address, server, stop) = serve(listen);
    let connector = connector(&address);
    let rt = runtime(CLIENT);
    let results = rt.block_on(measure(connector));
    drop(rt);
    SIDE.with(|s| s.set(NOBODY));
    drop(stop);
    server.join().expect("server thread");
    results
}

/// The comment lines at the top of the baseline file.
const HEADER: &str = "# Work per call: allocations and allocated bytes per call, each side (see\n\
     # tests/work_per_call.rs). Written by\n\
     #   RPC_UPDATE_BASELINE=1 cargo test -p rpc-examples --test work_per_call\n\
     # (add --release for the release figures). A commit that raises a figure says why.\n";

#[test]
fn work_per_call_stays_within_its_baseline() {
    let mut figures: Vec<(String, PerCall, PerCall)> = Vec::new();

    let (listener, connector) = mem::listener();
    for (kind, client, server) in transport(Listen::Mem(listener), |_| connector) {
        figures.push((format!("mem.{}", kind.name()), client, server));
    }
    let tcp =
        |address: &str| rpc_transport_tcp::StreamConnector::from_uri(address).expect("connector");
    for (kind, client, server) in transport(Listen::Tcp, tcp) {
        figures.push((format!("tcp.{}", kind.name()), client, server));
    }

    let mut report = format!(
        "work per call ({} build; minimum of {BATCHES} batches of {CALLS} calls)\n\
         {:<22} {:>13} {:>13} {:>11} {:>13} {:>13} {:>11}\n",
        profile(),
        "",
        "client allocs",
        "client bytes",
        "client parks",
        "server allocs",
        "server bytes",
        "server parks",
    );
    let mut measured = BTreeMap::new();
    for (name, client, server) in &figures {
        let _ = writeln!(
            report,
            "{name:<22} {:>13.2} {:>13.1} {:>11.2} {:>13.2} {:>13.1} {:>11.2}",
            client.allocs, client.bytes, client.parks, server.allocs, server.bytes, server.parks
        );
        for (side, per_call) in [("client", client), ("server", server)] {
            let prefix = format!("{}.{name}.{side}", profile());
            measured.insert(format!("{prefix}.allocs"), per_call.allocs);
            measured.insert(format!("{prefix}.bytes"), per_call.bytes);
        }
    }
    // Structs a call moves through queues and futures (not checked: informative).
    let _ = writeln!(
        report,
        "bytes moved per struct: ClientCall {}, ClientReply {}, ResponseFrame {}, \
         ServerCall {}, ServerReply {}, Status {}",
        std::mem::size_of::<rpc_core::client::ClientCall>(),
        std::mem::size_of::<rpc_core::client::ClientReply>(),
        std::mem::size_of::<rpc_core::frame::ResponseFrame>(),
        std::mem::size_of::<rpc_core::server::ServerCall>(),
        std::mem::size_of::<rpc_core::server::ServerReply>(),
        std::mem::size_of::<rpc_core::Status>(),
    );
    println!("{report}");

    if baseline::updating() {
        baseline::write(BASELINE, HEADER, &measured, 2);
        return;
    }
    let baseline = baseline::read(BASELINE);

    let mut grown = Vec::new();
    for (key, &value) in &measured {
        let Some(&base) = baseline.get(key) else {
            println!("{key}: no baseline yet ({value:.2})");
            continue;
        };
        let slack = if key.ends_with(".allocs") {
            SLACK_ALLOCS
        } else {
            SLACK_BYTES
        };
        if value > base * (1.0 + TOLERANCE) + slack {
            grown.push(format!("  {key}: {value:.2} per call, baseline {base:.2}"));
        } else if value < base * (1.0 - TOLERANCE) - slack {
            println!("{key}: {value:.2} per call, below its baseline {base:.2}: update it");
        }
    }
    assert!(
        grown.is_empty(),
        "the work per call grew past its baseline ({}, +{:.0}% + slack):\n{}\n\
         If the change must cost this, rewrite the baseline with\n  \
         RPC_UPDATE_BASELINE=1 cargo test -p rpc-examples --test work_per_call{}\n\
         and say in the commit message why the call got heavier.",
        BASELINE,
        TOLERANCE * 100.0,
        grown.join("\n"),
        if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        },
    );
}
