//! The data behind a live status page: per-method rates, error rates and latency
//! percentiles over the last five minutes, a bounded sample of recent calls (`/rpcz`),
//! and the pages themselves rendered as strings. No HTTP here: `rpc-server` serves
//! them on its admin address (`docs/observability.md`, "Status page").
//!
//! - [`StatusLayer`] goes first in the server's stack and records every call into a
//!   [`StatusBoard`] (cheap to clone; clones share the board).
//! - Per method, the board keeps [`WINDOW_SECS`] one-second buckets: calls, errors
//!   (any status but `OK`), and a 56-bucket log-scale latency histogram (two buckets
//!   per power of two) for p50 and p99. A method's entry is made on its first call;
//!   after that a call costs a lock of its method's entry and of the sample, and no
//!   allocation (but for the status message of a failed call). At most
//!   [`MAX_METHODS`] methods have an entry of their own; the methods after that share
//!   one, named [`OTHER_METHODS`], so that a client naming random methods cannot grow
//!   the board (a generated service's unknown names are refused before the layer, see
//!   `NamedService::METHODS`, so they never take an entry).
//! - The sample keeps the last [`RECENT_CALLS`] calls and the [`SLOWEST_CALLS`]
//!   slowest of the last [`SLOWEST_FOR`], each with its method, peer, status, start
//!   time, time queued before the handler, handler time and message sizes.
//! - [`render_index`], [`render_json`], [`render_connections`] and [`render_rpcz`]
//!   produce the pages: HTML with inline CSS and script (no external resource), the
//!   charts as SVG that the index page's script redraws every second from
//!   [`render_json`]'s output. Every string a peer chose (method names, peer
//!   descriptions, status messages) is escaped.
//!
//! ```
//! use rpc_core::server::{Server, ServerCall, ServerReply};
//! use rpc_observe::status::{render_index, ServerInfo, StatusBoard, StatusLayer};
//! # let echo = tower::service_fn(|_call: ServerCall| async { Ok::<_, rpc_core::Status>(ServerReply::default()) });
//! let board = StatusBoard::new();
//! let server = Server::builder()
//!     .layer(StatusLayer::new(board.clone()))
//!     .add_named_service("demo.Echo", echo)
//!     .build();
//! let info = ServerInfo::new("demo", "0.1.0");
//! let html: String = render_index(&board, &info);
//! assert!(html.starts_with("<!DOCTYPE html>"));
//! ```

mod layer;
mod render;
mod rpcz;
mod window;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock, RwLock,
    },
    time::{Duration, Instant, SystemTime},
};

use rpc_core::Code;

pub use layer::{StatusFuture, StatusLayer, StatusService};
pub use render::{render_connections, render_index, render_json, render_rpcz};
pub use rpcz::{
    CallSample, RpczFilter, StatusFilter, DEFAULT_ROWS, RECENT_CALLS, SLOWEST_CALLS, SLOWEST_FOR,
};
pub use window::WINDOW_SECS;

use rpcz::Rpcz;
use window::{Series, Window};

/// Methods with an entry of their own on a board; calls to methods beyond these are
/// counted under [`OTHER_METHODS`]. Each entry holds [`WINDOW_SECS`] seconds of
/// buckets (about 70 KB), so this bounds a board near 4.5 MB.
pub const MAX_METHODS: usize = 64;

/// The entry that counts the calls of methods beyond [`MAX_METHODS`].
pub const OTHER_METHODS: &str = "(other methods)";

/// What the status page records, shared by the [`StatusLayer`]'s services and the
/// code that renders the pages. Cheap to clone: clones share one board.
#[derive(Clone, Debug)]
pub struct StatusBoard {
    inner: Arc<Board>,
}

impl Default for StatusBoard {
    fn default() -> StatusBoard {
        StatusBoard::new()
    }
}

#[derive(Debug)]
struct Board {
    /// Second 0 of the buckets.
    epoch: Instant,
    methods: RwLock<HashMap<Box<str>, Arc<MethodEntry>>>,
    other: OnceLock<Arc<MethodEntry>>,
    rpcz: Mutex<Rpcz>,
    next_id: AtomicU64,
}

/// One method's window and the handlers of it running.
#[derive(Debug)]
pub(crate) struct MethodEntry {
    name: Arc<str>,
    window: Mutex<Window>,
    in_flight: AtomicUsize,
}

impl MethodEntry {
    fn new(name: &str) -> MethodEntry {
        MethodEntry {
            name: name.into(),
            window: Mutex::new(Window::new()),
            in_flight: AtomicUsize::new(0),
        }
    }
}

/// One method's numbers at the moment the board was read.
#[derive(Clone, Debug)]
pub struct MethodStats {
    /// `package.Service/Method`, or [`OTHER_METHODS`].
    pub method: Arc<str>,
    /// Handlers running now.
    pub in_flight: usize,
    series: Series,
}

impl MethodStats {
    /// Calls per complete second over the last [`WINDOW_SECS`] seconds, oldest first;
    /// seconds before the board started count 0.
    pub fn calls(&self) -> &[u32] {
        &self.series.calls
    }

    /// Failed calls (status not `OK`) per second, as [`calls`](Self::calls).
    pub fn errors(&self) -> &[u32] {
        &self.series.errors
    }

    /// Median handler time per second; `None` for a second without calls.
    pub fn p50(&self) -> impl Iterator<Item = Option<Duration>> + '_ {
        self.series.p50_us.iter().map(|v| v.map(micros))
    }

    /// 99th percentile handler time per second; `None` for a second without calls.
    pub fn p99(&self) -> impl Iterator<Item = Option<Duration>> + '_ {
        self.series.p99_us.iter().map(|v| v.map(micros))
    }

    /// Calls per second over the last ten complete seconds.
    pub fn rate(&self) -> f64 {
        self.series.recent.calls as f64 / f64::from(self.series.recent.seconds.max(1))
    }

    /// Calls, failed calls, p50 and p99 over the last minute.
    pub fn last_minute(&self) -> (u64, u64, Option<Duration>, Option<Duration>) {
        let m = &self.series.minute;
        (
            m.calls,
            m.errors,
            m.p50_us.map(micros),
            m.p99_us.map(micros),
        )
    }

    /// Calls and failed calls since the method was first called.
    pub fn totals(&self) -> (u64, u64) {
        (self.series.total_calls, self.series.total_errors)
    }
}

fn micros(us: f64) -> Duration {
    Duration::from_secs_f64(us / 1e6)
}

/// How a call ended, as the layer hands it to the board.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) peer: Option<Arc<rpc_core::Peer>>,
    pub(crate) code: Code,
    pub(crate) message: Option<Box<str>>,
    pub(crate) started: SystemTime,
    pub(crate) queued: Option<Duration>,
    pub(crate) handler: Duration,
    pub(crate) request_bytes: usize,
    pub(crate) response_bytes: Option<usize>,
    /// The answer was a stream (kept out of `/rpcz`'s slowest calls).
    pub(crate) streamed: bool,
}

impl StatusBoard {
    /// An empty board.
    pub fn new() -> StatusBoard {
        StatusBoard {
            inner: Arc::new(Board {
                epoch: Instant::now(),
                methods: RwLock::new(HashMap::new()),
                other: OnceLock::new(),
                rpcz: Mutex::new(Rpcz::new()),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// A [`StatusLayer`] recording into this board.
    pub fn layer(&self) -> StatusLayer {
        StatusLayer::new(self.clone())
    }

    /// The second `now` falls in, counted from the board's start.
    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.inner.epoch).as_secs()
    }

    /// The entry of `name`, made on its first call (or the shared one past
    /// [`MAX_METHODS`]).
    pub(crate) fn method(&self, name: &str) -> Arc<MethodEntry> {
        let read = |methods: &HashMap<Box<str>, Arc<MethodEntry>>| methods.get(name).cloned();
        {
            let methods = self.inner.methods.read().unwrap_or_else(|e| e.into_inner());
            if let Some(found) = read(&methods) {
                return found;
            }
            // Past the limit every new name shares one entry: found without the write
            // lock, which every call of such a name took (a server of more methods than
            // the board shows contended on it).
            if methods.len() >= MAX_METHODS {
                if let Some(other) = self.inner.other.get() {
                    return other.clone();
                }
            }
        }
        let mut methods = self
            .inner
            .methods
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(found) = read(&methods) {
            return found;
        }
        if methods.len() >= MAX_METHODS {
            return self
                .inner
                .other
                .get_or_init(|| Arc::new(MethodEntry::new(OTHER_METHODS)))
                .clone();
        }
        let entry = Arc::new(MethodEntry::new(name));
        methods.insert(name.into(), entry.clone());
        entry
    }

    /// Records a call of `method` that ended at `now`.
    pub(crate) fn ended(&self, method: &MethodEntry, now: Instant, call: Ended) {
        let second = self.second(now);
        method
            .window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(second, call.code != Code::OK, call.handler);
        let sample = CallSample {
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            method: method.name.clone(),
            peer: call.peer,
            code: call.code,
            message: call.message,
            started: call.started,
            queued: call.queued,
            handler: call.handler,
            request_bytes: call.request_bytes,
            response_bytes: call.response_bytes,
        };
        self.inner
            .rpcz
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(second, sample, !call.streamed);
    }

    /// Every method called so far, by name, with its numbers now.
    pub fn methods(&self) -> Vec<MethodStats> {
        self.methods_at(Instant::now())
    }

    fn methods_at(&self, now: Instant) -> Vec<MethodStats> {
        let second = self.second(now);
        let mut entries: Vec<Arc<MethodEntry>> = self
            .inner
            .methods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        entries.extend(self.inner.other.get().cloned());
        let mut stats: Vec<MethodStats> = entries
            .iter()
            .map(|entry| MethodStats {
                method: entry.name.clone(),
                in_flight: entry.in_flight.load(Ordering::Relaxed),
                series: entry
                    .window
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .series(second),
            })
            .collect();
        stats.sort_by(|a, b| a.method.cmp(&b.method));
        stats
    }

    /// The sampled calls `filter` lets through, slowest first (queued plus handler
    /// time), at most its limit.
    pub fn calls(&self, filter: &RpczFilter) -> Vec<CallSample> {
        self.inner
            .rpcz
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .select(filter)
    }

    /// The names of the methods with an entry, sorted.
    pub fn method_names(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .inner
            .methods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|e| e.name.clone())
            .collect();
        names.extend(self.inner.other.get().map(|e| e.name.clone()));
        names.sort();
        names
    }
}

/// What the index page says about the server besides its calls.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    /// The server's name (the page's title).
    pub name: String,
    /// Its version.
    pub version: String,
    /// When it started (wall clock, shown).
    pub started: SystemTime,
    /// When it started (monotonic, for the uptime).
    pub started_at: Instant,
    /// The addresses it serves, as URIs.
    pub listeners: Vec<String>,
    /// Its configuration, one `name`, `value` pair a line, in order.
    pub config: Vec<(String, String)>,
}

impl ServerInfo {
    /// A server named `name` at `version`, started now, with no listener nor
    /// configuration listed yet.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> ServerInfo {
        ServerInfo {
            name: name.into(),
            version: version.into(),
            started: SystemTime::now(),
            started_at: Instant::now(),
            listeners: Vec::new(),
            config: Vec::new(),
        }
    }

    /// How long the server has run.
    pub fn uptime(&self) -> Duration {
        self.started_at.elapsed()
    }
}

#[cfg(test)]
mod tests;
