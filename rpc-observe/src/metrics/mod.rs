//! Call metrics on the [`metrics`] facade, as tower layers for both sides, and the
//! server's own counters.
//!
//! The application picks the exporter by installing a recorder
//! (`metrics-exporter-prometheus`'s `PrometheusBuilder`, as `rpc-server` does); with
//! none installed every record is a no-op. Install it before the first call: each layer
//! registers a method's counters with the recorder of the moment, once, and keeps them.
//! Call [`describe`] after installing it, for the `# HELP` lines and units.
//!
//! | name | kind | unit | labels | what |
//! | --- | --- | --- | --- | --- |
//! | `rpc_client_calls_total` | counter | calls | `method`, `code` | calls (attempts, under a retry layer) ended, by status |
//! | `rpc_client_call_duration_seconds` | histogram | seconds | `method` | from the call to its reply or error (a streaming call: to its response stream's end) |
//! | `rpc_client_calls_in_flight` | gauge | calls | `method` | calls started and not yet ended |
//! | `rpc_client_retries_total` | counter | calls | `method` | attempts after the first (retries and hedges), under a [`RetryLayer`](rpc_core::retry::RetryLayer) |
//! | `rpc_client_ejections_total` | counter | ejections | `replica` | replicas a [`Balanced`] client ejected ([`record_ejections`]) |
//! | `rpc_server_calls_total` | counter | calls | `method`, `code` | calls handled, by status |
//! | `rpc_server_call_duration_seconds` | histogram | seconds | `method` | from the request's arrival on its connection to the handler's reply, or a streaming call's last response message (the wait for a busy service and the layers under this one included) |
//! | `rpc_server_calls_in_flight` | gauge | calls | `method` | handlers running, and response streams not yet ended |
//! | `rpc_server_connections` | gauge | connections | — | open connections ([`record_server_stats`]) |
//! | `rpc_server_connections_opened_total` | counter | connections | — | connections accepted ([`record_server_stats`]) |
//! | `rpc_server_requests_total` | counter | requests | — | requests received, before routing ([`record_server_stats`]) |
//! | `rpc_server_deadline_drops_total` | counter | requests | — | requests whose deadline passed before their handler started ([`record_server_stats`]) |
//! | `rpc_server_budget_refusals_total` | counter | requests | — | requests answered `RESOURCE_EXHAUSTED` without running, the server's budget of large requests having no room for them ([`record_server_stats`]) |
//! | `rpc_server_refused_connections_total` | counter | connections | `reason` | connections turned away at the connection limit (`reason="limit"`) or closed with an error GOAWAY for what their peer sent (`reason="protocol"`; the logs show a few of them, not all) ([`record_server_stats`]) |
//! | `rpc_server_{received,sent}_bytes_total`, `rpc_server_{received,sent}_frames_total` | counter | bytes, frames | — | frames each way, every connection ([`record_server_stats`]; per connection: [`Server::connections`]) |
//! | `rpc_dedupe_*_total`, `rpc_server_retried_requests_total` | counter | requests | — | the duplicate cache ([`record_server_stats`]) |
//!
//! A layer labels at most [`MAX_METHODS`] methods by name; calls of further names
//! (which on a server a peer chooses) count under `method="_other"`, so a peer cannot
//! grow the label sets. A generated service's unknown methods never reach the layer:
//! the server refuses them first ([`NamedService::METHODS`](rpc_core::server::NamedService::METHODS));
//! a service added by name alone sees, and counts, every name under its prefix.
//!
//! `code` is the status name (`OK`, `NOT_FOUND`, ...). A call dropped before it ended
//! counts as `CANCELLED`, or on the server as `DEADLINE_EXCEEDED` when it ran out of
//! its time budget (the server drops the handlers of calls whose deadline passed and
//! of calls the client cancelled).
//!
//! A streaming call ends when its response stream does: it stays in flight, and its
//! duration runs, until the last response message (or the error that ends the
//! stream) is read from it, and its `code` is the one the stream ends with. A
//! response stream dropped before its end counts as a call dropped (on a client, the
//! caller cancelled the call).

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{atomic::Ordering, Arc, OnceLock, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use metrics::{Counter, Gauge, Histogram, SharedString, Unit};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::{
    clock::Stamp,
    dropped_code,
    ending::{end_call, Reply, Watch},
};
use rpc_core::{
    balance::Balanced,
    client::{ClientCall, ClientReply},
    server::{Server, ServerCall, ServerReply},
    stream::StreamEnd,
    ByteStr, Code, Endpoint, Status,
};

/// `rpc_client_calls_total`: client calls ended, by `method` and `code`.
pub const CLIENT_CALLS: &str = "rpc_client_calls_total";
/// `rpc_client_call_duration_seconds`: client call latency, by `method`.
pub const CLIENT_DURATION: &str = "rpc_client_call_duration_seconds";
/// `rpc_client_calls_in_flight`: client calls in flight, by `method`.
pub const CLIENT_IN_FLIGHT: &str = "rpc_client_calls_in_flight";
/// `rpc_client_retries_total`: attempts after the first, by `method`.
pub const CLIENT_RETRIES: &str = "rpc_client_retries_total";
/// `rpc_server_calls_total`: server calls handled, by `method` and `code`.
pub const SERVER_CALLS: &str = "rpc_server_calls_total";
/// `rpc_server_call_duration_seconds`: from the request's arrival on its connection
/// to its answer (a streaming call: to its response stream's end), by `method`.
pub const SERVER_DURATION: &str = "rpc_server_call_duration_seconds";
/// `rpc_server_calls_in_flight`: handlers running and response streams not yet ended,
/// by `method`.
pub const SERVER_IN_FLIGHT: &str = "rpc_server_calls_in_flight";
/// `rpc_server_connections`: open connections.
pub const SERVER_CONNECTIONS: &str = "rpc_server_connections";
/// `rpc_dedupe_hits_total`: duplicates answered from the duplicate cache.
pub const DEDUPE_HITS: &str = "rpc_dedupe_hits_total";
/// `rpc_dedupe_attached_total`: duplicates that waited for the execution in progress.
pub const DEDUPE_ATTACHED: &str = "rpc_dedupe_attached_total";
/// `rpc_dedupe_evictions_total`: finished entries evicted from the duplicate cache.
pub const DEDUPE_EVICTIONS: &str = "rpc_dedupe_evictions_total";
/// `rpc_dedupe_too_old_total`: duplicates refused as older than the cache remembers.
pub const DEDUPE_TOO_OLD: &str = "rpc_dedupe_too_old_total";
/// `rpc_dedupe_too_many_waiting_total`: duplicates refused because too many waited.
pub const DEDUPE_TOO_MANY_WAITING: &str = "rpc_dedupe_too_many_waiting_total";
/// `rpc_server_retried_requests_total`: keyed requests that were a retry.
pub const SERVER_RETRIED: &str = "rpc_server_retried_requests_total";
/// `rpc_server_connections_opened_total`: connections accepted.
pub const SERVER_CONNECTIONS_OPENED: &str = "rpc_server_connections_opened_total";
/// `rpc_server_requests_total`: requests received, before routing and the layers.
pub const SERVER_REQUESTS: &str = "rpc_server_requests_total";
/// `rpc_server_deadline_drops_total`: requests whose deadline passed before their
/// handler started (answered `DEADLINE_EXCEEDED` by the connection).
pub const SERVER_DEADLINE_DROPS: &str = "rpc_server_deadline_drops_total";
/// `rpc_server_budget_refusals_total`: requests answered `RESOURCE_EXHAUSTED` without
/// running because the server's budget of large requests had no room for them.
pub const SERVER_BUDGET_REFUSALS: &str = "rpc_server_budget_refusals_total";
/// `rpc_server_refused_connections_total`: connections refused, by `reason`: `limit`
/// (the connection limit), `protocol` (an error GOAWAY for what the peer sent).
pub const SERVER_REFUSED_CONNECTIONS: &str = "rpc_server_refused_connections_total";
/// `rpc_server_received_bytes_total`: bytes of frames received, every connection.
pub const SERVER_RECEIVED_BYTES: &str = "rpc_server_received_bytes_total";
/// `rpc_server_sent_bytes_total`: bytes of frames sent, every connection.
pub const SERVER_SENT_BYTES: &str = "rpc_server_sent_bytes_total";
/// `rpc_server_received_frames_total`: frames received, every connection.
pub const SERVER_RECEIVED_FRAMES: &str = "rpc_server_received_frames_total";
/// `rpc_server_sent_frames_total`: frames sent, every connection.
pub const SERVER_SENT_FRAMES: &str = "rpc_server_sent_frames_total";
/// `rpc_client_ejections_total`: replicas a [`Balanced`] client ejected, by `replica`.
pub const CLIENT_EJECTIONS: &str = "rpc_client_ejections_total";

/// Describes every metric of this crate to the installed recorder: units and the
/// `# HELP` text. Call it once, after installing the recorder.
///
/// ```
/// // let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
/// rpc_observe::metrics::describe();
/// ```
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        CLIENT_CALLS,
        Unit::Count,
        "Client calls ended (each attempt under a retry layer), by method and status code."
    );
    describe_histogram!(
        CLIENT_DURATION,
        Unit::Seconds,
        "Client call latency: from the call to its reply or error (a streaming call: to its stream's end), by method."
    );
    describe_gauge!(
        CLIENT_IN_FLIGHT,
        Unit::Count,
        "Client calls started and not yet ended, by method."
    );
    describe_counter!(
        CLIENT_RETRIES,
        Unit::Count,
        "Client attempts after the first (retries and hedges), by method."
    );
    describe_counter!(
        SERVER_CALLS,
        Unit::Count,
        "Server calls handled, by method and status code."
    );
    describe_histogram!(
        SERVER_DURATION,
        Unit::Seconds,
        "Server call latency: from the request's arrival on its connection to the handler's reply (a streaming call: to its stream's end), by method."
    );
    describe_gauge!(
        SERVER_IN_FLIGHT,
        Unit::Count,
        "Server calls in flight (handlers running, response streams not yet ended), by method."
    );
    describe_gauge!(
        SERVER_CONNECTIONS,
        Unit::Count,
        "Connections open on the server, across its listeners."
    );
    describe_counter!(
        DEDUPE_HITS,
        Unit::Count,
        "Duplicate requests answered with the outcome recorded in the duplicate cache."
    );
    describe_counter!(
        DEDUPE_ATTACHED,
        Unit::Count,
        "Duplicate requests that waited for the execution still running."
    );
    describe_counter!(
        DEDUPE_EVICTIONS,
        Unit::Count,
        "Finished entries evicted from the duplicate cache."
    );
    describe_counter!(
        DEDUPE_TOO_OLD,
        Unit::Count,
        "Duplicate requests refused as older than the duplicate cache remembers."
    );
    describe_counter!(
        DEDUPE_TOO_MANY_WAITING,
        Unit::Count,
        "Duplicate requests refused because too many already waited for the same call."
    );
    describe_counter!(
        SERVER_CONNECTIONS_OPENED,
        Unit::Count,
        "Connections the server accepted, across its listeners."
    );
    describe_counter!(
        SERVER_REQUESTS,
        Unit::Count,
        "Requests the server received (before routing and the layers; unknown methods included)."
    );
    describe_counter!(
        SERVER_DEADLINE_DROPS,
        Unit::Count,
        "Requests answered DEADLINE_EXCEEDED without running: their deadline passed before their handler started."
    );
    describe_counter!(
        SERVER_BUDGET_REFUSALS,
        Unit::Count,
        "Requests answered RESOURCE_EXHAUSTED without running: the server's budget of large requests had no room for them."
    );
    describe_counter!(
        SERVER_REFUSED_CONNECTIONS,
        Unit::Count,
        "Connections refused: at the connection limit (reason=limit), or closed with an error GOAWAY for what the peer sent (reason=protocol)."
    );
    describe_counter!(
        SERVER_RECEIVED_BYTES,
        Unit::Bytes,
        "Bytes of frames the server received (headers and payloads; on gRPC, messages and metadata), every connection."
    );
    describe_counter!(
        SERVER_SENT_BYTES,
        Unit::Bytes,
        "Bytes of frames the server sent, every connection."
    );
    describe_counter!(
        SERVER_RECEIVED_FRAMES,
        Unit::Count,
        "Frames the server received, every connection."
    );
    describe_counter!(
        SERVER_SENT_FRAMES,
        Unit::Count,
        "Frames the server sent, every connection."
    );
    describe_counter!(
        CLIENT_EJECTIONS,
        Unit::Count,
        "Replicas a balanced client ejected after repeated failures, by replica."
    );
    describe_counter!(
        SERVER_RETRIED,
        Unit::Count,
        "Keyed requests that were a retry (attempt 2 or more)."
    );
}

/// Records what `server` counts itself: its open connections, the totals of
/// [`Server::stats`] (connections, requests, deadline drops, bytes and frames each
/// way), and its duplicate cache's counters if it has one. The values are read when this is called: call it
/// before each scrape, or every few seconds from a task of the application's.
///
/// ```
/// let server = rpc_core::server::Server::builder().build();
/// rpc_observe::metrics::record_server_stats(&server);
/// ```
pub fn record_server_stats(server: &Server) {
    metrics::gauge!(SERVER_CONNECTIONS).set(server.open_connections() as f64);
    let totals = server.stats();
    for (name, value) in [
        (SERVER_CONNECTIONS_OPENED, totals.connections_opened),
        (SERVER_REQUESTS, totals.requests),
        (SERVER_DEADLINE_DROPS, totals.expired_before_handler),
        (SERVER_BUDGET_REFUSALS, totals.refused_over_budget),
        (SERVER_RECEIVED_BYTES, totals.bytes_received),
        (SERVER_SENT_BYTES, totals.bytes_sent),
        (SERVER_RECEIVED_FRAMES, totals.frames_received),
        (SERVER_SENT_FRAMES, totals.frames_sent),
    ] {
        metrics::counter!(name).absolute(value);
    }
    for (reason, value) in [
        ("limit", totals.refused_at_limit),
        ("protocol", totals.refused_for_errors),
    ] {
        metrics::counter!(SERVER_REFUSED_CONNECTIONS, "reason" => reason).absolute(value);
    }
    if let Some(stats) = server.dedupe_stats() {
        for (name, value) in [
            (DEDUPE_HITS, &stats.hits),
            (DEDUPE_ATTACHED, &stats.attached),
            (DEDUPE_EVICTIONS, &stats.evictions),
            (DEDUPE_TOO_OLD, &stats.too_old),
            (DEDUPE_TOO_MANY_WAITING, &stats.too_many_waiting),
            (SERVER_RETRIED, &stats.retries),
        ] {
            metrics::counter!(name).absolute(value.load(Ordering::Relaxed));
        }
    }
}

/// Counts one ejection of `replica` in `rpc_client_ejections_total`: call it from a
/// [`Balanced::on_ejection`] hook of your own, or let [`record_ejections`] install one.
pub fn count_ejection(replica: &Endpoint) {
    metrics::counter!(CLIENT_EJECTIONS, "replica" => replica.to_string()).increment(1);
}

/// Counts `balanced`'s ejections in `rpc_client_ejections_total` (by `replica`), through
/// its [`Balanced::on_ejection`] hook. That hook is one per client and this replaces
/// it: to do more on an ejection (make discovery look again), install your own hook
/// and call [`count_ejection`] from it.
///
/// ```
/// use rpc_core::{balance::Balanced, client::Channel, link::mem, Endpoint};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (_listener, connector) = mem::listener();
/// let make = move |_: &Endpoint| Ok(Channel::builder().connect_lazy(connector.clone()));
/// let balanced = Balanced::from_endpoints(make, ["tcp://10.0.0.5:7000".parse()?])?;
/// rpc_observe::metrics::record_ejections(&balanced);
/// # Ok(()) }
/// ```
pub fn record_ejections(balanced: &Balanced) {
    balanced.on_ejection(count_ejection);
}

/// Which side a layer measures: the metric names.
#[derive(Clone, Copy, Debug)]
enum Side {
    Client,
    Server,
}

impl Side {
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Side::Client => (CLIENT_CALLS, CLIENT_DURATION, CLIENT_IN_FLIGHT),
            Side::Server => (SERVER_CALLS, SERVER_DURATION, SERVER_IN_FLIGHT),
        }
    }
}

/// Status codes with a counter slot and a `code` label of their own (0 to 16,
/// gRPC's); the others share the slot after them, labelled [`OTHER_CODES`].
const KNOWN_CODES: usize = 17;

/// One method's handles, registered once with the recorder.
#[derive(Debug)]
struct MethodMetrics {
    side: Side,
    method: SharedString,
    duration: Histogram,
    in_flight: Gauge,
    /// By code; the last slot counts every code past gRPC's.
    by_code: [OnceLock<Counter>; KNOWN_CODES + 1],
    retries: OnceLock<Counter>,
}

impl MethodMetrics {
    fn new(side: Side, method: &str) -> MethodMetrics {
        let (_, duration, in_flight) = side.names();
        let method = SharedString::from(method.to_owned());
        MethodMetrics {
            side,
            duration: metrics::histogram!(duration, "method" => method.clone()),
            in_flight: metrics::gauge!(in_flight, "method" => method.clone()),
            method,
            by_code: Default::default(),
            retries: OnceLock::new(),
        }
    }

    fn ended(&self, code: Code, elapsed: Duration) {
        self.duration.record(elapsed.as_secs_f64());
        let calls = self.side.names().0;
        let slot = usize::try_from(code.as_u32()).map_or(KNOWN_CODES, |i| i.min(KNOWN_CODES));
        let register = || {
            let code = if slot == KNOWN_CODES {
                SharedString::const_str(OTHER_CODES)
            } else {
                SharedString::from(code.to_string())
            };
            metrics::counter!(calls, "method" => self.method.clone(), "code" => code)
        };
        self.by_code[slot].get_or_init(register).increment(1);
    }
}

/// The methods a layer has seen, shared by its services.
#[derive(Debug, Default)]
struct Registry {
    methods: RwLock<HashMap<Box<str>, Arc<MethodMetrics>>>,
}

/// A service's way to its methods' handles: the [`Registry`] of its layer, and the
/// last method it served, which most calls repeat (a comparison of the name instead of
/// a lock and a hash).
#[derive(Clone, Debug)]
struct Methods {
    side: Side,
    registry: Arc<Registry>,
    last: Option<(ByteStr, Arc<MethodMetrics>)>,
}

impl Methods {
    fn get(&mut self, name: &ByteStr) -> Arc<MethodMetrics> {
        match &self.last {
            Some((last, metrics)) if same_name(last, name) => metrics.clone(),
            _ => {
                let metrics = self.registry.method(self.side, name);
                self.last = Some((name.clone(), metrics.clone()));
                metrics
            }
        }
    }
}

/// Whether two method names are equal; at once when they are the same bytes (a
/// generated client's names are `'static` strings, the same pointer at every call).
fn same_name(a: &ByteStr, b: &ByteStr) -> bool {
    let (a, b) = (a.as_str(), b.as_str());
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

impl Registry {
    fn method(&self, side: Side, name: &str) -> Arc<MethodMetrics> {
        {
            let methods = self.methods.read().unwrap_or_else(|e| e.into_inner());
            if let Some(found) = methods.get(name) {
                return found.clone();
            }
            // Past the limit, a new name's entry is the shared one: found under the read
            // lock too (every call of such a name took the write lock).
            if methods.len() >= MAX_METHODS {
                if let Some(other) = methods.get(OTHER_METHODS) {
                    return other.clone();
                }
            }
        }
        let mut methods = self.methods.write().unwrap_or_else(|e| e.into_inner());
        // The method name comes from the peer on a server (a service sees every name
        // under its prefix, unknown ones included): past the limit, new names share one
        // entry, so a peer cannot grow the registry, nor the exporter's label sets.
        let name = if methods.len() >= MAX_METHODS && !methods.contains_key(name) {
            OTHER_METHODS
        } else {
            name
        };
        methods
            .entry(name.into())
            .or_insert_with(|| Arc::new(MethodMetrics::new(side, name)))
            .clone()
    }
}

/// The most methods a layer labels by name; past it, calls of new names are counted
/// under [`OTHER_METHODS`].
pub const MAX_METHODS: usize = 1000;

/// The `method` label of the calls past [`MAX_METHODS`].
pub const OTHER_METHODS: &str = "_other";

/// The `code` label of calls that ended with a status code past gRPC's 0 to 16: the
/// wire carries any code, and a peer choosing them (a hostile server, or on a server
/// a method that answers with a code the caller picks) would otherwise make a series
/// per code, kept for good.
pub const OTHER_CODES: &str = "_other";

/// Wraps a client service in [`ClientMetrics`]: calls, statuses, latency and calls in
/// flight per method. Cheap to clone; clones share their registered handles. Under a
/// [`RetryLayer`](rpc_core::retry::RetryLayer) it counts each attempt, and the
/// attempts after the first in `rpc_client_retries_total`; above it, each call once.
///
/// ```
/// use rpc_core::{client::{Channel, Client}, link::mem};
/// use rpc_observe::metrics::ClientMetricsLayer;
/// use tower::Layer;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (_listener, connector) = mem::listener();
/// let channel = Channel::builder().connect_lazy(connector);
/// let client = Client::new(ClientMetricsLayer::new().layer(channel));
/// # drop(client);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClientMetricsLayer {
    registry: Arc<Registry>,
}

impl ClientMetricsLayer {
    /// A layer with no method registered yet.
    pub fn new() -> ClientMetricsLayer {
        crate::clock::warm_up();
        ClientMetricsLayer::default()
    }
}

impl<S> Layer<S> for ClientMetricsLayer {
    type Service = ClientMetrics<S>;

    fn layer(&self, inner: S) -> ClientMetrics<S> {
        ClientMetrics {
            inner,
            methods: Methods {
                side: Side::Client,
                registry: self.registry.clone(),
                last: None,
            },
        }
    }
}

/// A client service that records call metrics (see [`ClientMetricsLayer`]).
#[derive(Clone, Debug)]
pub struct ClientMetrics<S> {
    inner: S,
    methods: Methods,
}

impl<S> Service<ClientCall> for ClientMetrics<S>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status>,
{
    type Response = ClientReply;
    type Error = Status;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ClientCall) -> Self::Future {
        let method = self.methods.get(&call.method);
        if rpc_core::retry::current_attempt().is_some_and(|attempt| attempt > 1) {
            method
                .retries
                .get_or_init(
                    || metrics::counter!(CLIENT_RETRIES, "method" => method.method.clone()),
                )
                .increment(1);
        }
        MeteredFuture::new(self.inner.call(call), method, None, Stamp::now())
    }
}

/// Wraps server services in [`ServerMetrics`]: calls, statuses, handler time and
/// handlers running per method. Cheap to clone; clones share their registered
/// handles.
///
/// ```
/// use rpc_core::server::{Server, ServerCall, ServerReply};
/// use rpc_observe::metrics::ServerMetricsLayer;
/// # let echo = tower::service_fn(|_call: ServerCall| async { Ok::<_, rpc_core::Status>(ServerReply::default()) });
/// let server = Server::builder()
///     .layer(ServerMetricsLayer::new())
///     .add_named_service("demo.Echo", echo)
///     .build();
/// // Before each scrape (or every few seconds): connections, duplicate cache.
/// rpc_observe::metrics::record_server_stats(&server);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ServerMetricsLayer {
    registry: Arc<Registry>,
}

impl ServerMetricsLayer {
    /// A layer with no method registered yet.
    pub fn new() -> ServerMetricsLayer {
        ServerMetricsLayer::default()
    }
}

impl<S> Layer<S> for ServerMetricsLayer {
    type Service = ServerMetrics<S>;

    fn layer(&self, inner: S) -> ServerMetrics<S> {
        ServerMetrics {
            inner,
            methods: Methods {
                side: Side::Server,
                registry: self.registry.clone(),
                last: None,
            },
        }
    }
}

/// A server service that records call metrics (see [`ServerMetricsLayer`]).
#[derive(Clone, Debug)]
pub struct ServerMetrics<S> {
    inner: S,
    methods: Methods,
}

impl<S> Service<ServerCall> for ServerMetrics<S>
where
    S: Service<ServerCall, Response = ServerReply, Error = Status>,
{
    type Response = ServerReply;
    type Error = Status;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        let method = self.methods.get(&call.method);
        let timeout = call.timeout;
        // From the request's arrival (one clock read fewer per call, and the time
        // waited for a busy service counts, as OpenTelemetry's rpc.server.duration
        // does); a call made without a connection starts now.
        let started = call.received.map_or_else(Stamp::now, Stamp::Os);
        MeteredFuture::new(self.inner.call(call), method, timeout, started)
    }
}

pin_project! {
    /// The future of a measured call: records its status and duration when it ends
    /// (a streaming call when its response stream ends), `CANCELLED` (or
    /// `DEADLINE_EXCEEDED`) if it is dropped before, and keeps the in-flight gauge up
    /// until then.
    pub struct MeteredFuture<F> {
        #[pin]
        inner: F,
        // `None` once the call's end is recorded or handed to its stream.
        end: Option<MeteredEnd>,
    }

    impl<F> PinnedDrop for MeteredFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(end) = this.project().end.take() {
                end.ended(StreamEnd::Dropped);
            }
        }
    }
}

/// What a measured call records when it ends.
#[derive(Debug)]
struct MeteredEnd {
    method: Arc<MethodMetrics>,
    started: Stamp,
    // A server call's time budget, to tell a deadline from a cancellation.
    timeout: Option<Duration>,
}

impl Watch for MeteredEnd {
    fn ended(self, end: StreamEnd<'_>) {
        let elapsed = self.started.elapsed();
        let code = match end {
            StreamEnd::Ok => Code::OK,
            StreamEnd::Failed(status) => status.code(),
            StreamEnd::Dropped => dropped_code(elapsed, self.timeout),
        };
        self.method.in_flight.decrement(1.0);
        self.method.ended(code, elapsed);
    }
}

impl<F> MeteredFuture<F> {
    fn new(
        inner: F,
        method: Arc<MethodMetrics>,
        timeout: Option<Duration>,
        started: Stamp,
    ) -> MeteredFuture<F> {
        method.in_flight.increment(1.0);
        MeteredFuture {
            inner,
            end: Some(MeteredEnd {
                method,
                started,
                timeout,
            }),
        }
    }
}

impl<F, T> Future for MeteredFuture<F>
where
    F: Future<Output = Result<T, Status>>,
    T: Reply,
{
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = std::task::ready!(this.inner.poll(cx));
        if let Some(end) = this.end.take() {
            end_call(&mut result, end);
        }
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes past gRPC's share one series (a series each before: from a review).
    #[test]
    fn codes_past_grpcs_share_one_series() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let method = MethodMetrics::new(Side::Server, "demo.S/M");
            for code in (0..1_000).chain([u32::MAX]) {
                method.ended(Code::from_u32(code), Duration::from_millis(1));
            }
        });
        let mut codes = std::collections::HashMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if key.key().name() != SERVER_CALLS {
                continue;
            }
            let code = key
                .key()
                .labels()
                .find(|l| l.key() == "code")
                .map(|l| l.value().to_owned())
                .unwrap();
            let metrics_util::debugging::DebugValue::Counter(n) = value else {
                panic!("a counter");
            };
            codes.insert(code, n);
        }
        assert_eq!(codes.len(), KNOWN_CODES + 1, "{codes:?}");
        assert_eq!(codes["OK"], 1);
        assert_eq!(codes["UNAUTHENTICATED"], 1);
        assert_eq!(codes[OTHER_CODES], 1_000 - 17 + 1);
    }

    #[test]
    fn names_past_the_limit_share_one_entry() {
        let registry = Registry::default();
        for i in 0..MAX_METHODS {
            registry.method(Side::Server, &format!("demo.S/M{i}"));
        }
        let first = registry.method(Side::Server, "demo.S/M0");
        assert_eq!(&*first.method, "demo.S/M0", "known names keep their entry");
        let a = registry.method(Side::Server, "demo.S/Unknown1");
        let b = registry.method(Side::Server, "demo.S/Unknown2");
        assert_eq!(&*a.method, OTHER_METHODS);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(registry.methods.read().unwrap().len(), MAX_METHODS + 1);
    }
}
