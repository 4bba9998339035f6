//! A `tracing` span per call, client and server, with the trace context carried across
//! processes in the call's metadata.
//!
//! [`ClientTraceLayer`] and [`ServerTraceLayer`] open one INFO span per call, named
//! `rpc.client` and `rpc.server`, with fields that follow OpenTelemetry's semantic
//! conventions for RPC (`tracing-opentelemetry` turns `otel.name`, `otel.kind` and
//! `otel.status_code` into the span's name, kind and status):
//!
//! | field | client | server |
//! | --- | --- | --- |
//! | `otel.name` | `package.Service/Method` | same |
//! | `otel.kind` | `client` | `server` |
//! | `rpc.system` | `rpc` (`grpc` for a `grpc://` or `grpcs://` target) | `rpc` (`grpc` for a gRPC peer) |
//! | `rpc.service`, `rpc.method` | `package.Service`, `Method` | same |
//! | `rpc.transport` | the target's scheme: `tcp`, `tls`, `unix`, `udp`, `rdma`, `grpc`... | the peer description's scheme |
//! | `network.transport` | `tcp`, `udp` or `unix`, when the scheme says | same |
//! | `server.address`, `server.port` | from the target (a Unix socket's path as the address) | — |
//! | `net.peer`, `client.address`, `client.port` | — | the peer's description, IP address and port |
//! | `network.peer.address`, `network.peer.port` | — | the peer's IP address and port (the names of OpenTelemetry's RPC conventions) |
//! | `rpc.attempt` | the attempt number under a [`RetryLayer`](rpc_core::retry::RetryLayer) (1, 2...) | — |
//! | `rpc.call_key` | `{client:032x}:{call}:{attempt}` when the call carries a call key (at-most-once retries) | — |
//! | `rpc.grpc.status_code`, `rpc.status` | the status code as a number and by name (`0`, `OK`) | same |
//! | `otel.status_code` | `ERROR` when the call failed (any code but `OK`) | `ERROR` for the codes that are the server's own fault, as OpenTelemetry's gRPC conventions have it: `UNKNOWN`, `DEADLINE_EXCEEDED`, `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS` (a `NOT_FOUND` or `INVALID_ARGUMENT` answer is the server working) |
//! | `error.message` | the status message, when the call failed | same, for any code but `OK` |
//! | `rpc.duration_us` | the call's total time, from the call to its reply (a streaming call: to its response stream's end), in microseconds | the handler's time (a streaming call: to its response stream's end) |
//! | `rpc.queued_us` | — | from the request's arrival on its connection to this layer: time waiting for a busy service, or for the connection's task |
//! | `trace_id`, `span_id`, `parent_span_id` | W3C ids, hex (with the default [`W3cPropagator`]) | same |
//!
//! A call whose future is dropped before it ends (the caller cancelled it, or on the
//! server the deadline passed or the client cancelled) gets the status `CANCELLED`,
//! or `DEADLINE_EXCEEDED` on a server whose call ran out of its time budget; one
//! dropped while its handler panicked, `INTERNAL`.
//!
//! A streaming call's span stays open until its response stream ends, and records the
//! status the stream ends with; a response stream dropped before its end counts as a
//! call dropped. A server's response stream is polled inside the span.
//!
//! # Placement
//!
//! - Client: under the retry layer, so that each attempt is a span (OpenTelemetry's
//!   rule for retries) with its `rpc.attempt`:
//!   `RetryLayer::new(policy).layer(ClientTraceLayer::for_channel(&channel).layer(channel))`.
//! - Server: the first layer added ([`ServerBuilder::layer`]), so that the span covers
//!   the other layers (authentication, limits) and the handler.
//!
//! # Cost
//!
//! Not installed, nothing. Installed with no subscriber, or with one that does not
//! want INFO spans of this crate, one disabled span per call: no clock read, no
//! allocation, no field formatted; the default propagator still forwards a
//! `traceparent` it received (one metadata lookup per call). `docs/performance.md`
//! has the figures.
//!
//! [`ServerBuilder::layer`]: rpc_core::server::ServerBuilder::layer

mod context;
mod propagate;

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;
use tower::{Layer, Service};
use tracing::{
    field::{Empty, Field, Value},
    Span,
};

use crate::{
    clock::Stamp,
    dropped_code,
    ending::{end_call, Reply, Watch},
};
use rpc_core::{
    client::{ClientCall, ClientReply},
    server::{ServerCall, ServerReply},
    stream::StreamEnd,
    Code, Status,
};

pub use context::{TraceContext, FLAG_SAMPLED, TRACEPARENT, TRACESTATE};
pub use propagate::{Propagator, W3cPropagator};

/// Wraps a client service (a [`Channel`](rpc_core::client::Channel), or a stack over
/// one) in [`ClientTrace`]: a span per call, and the call's trace context in its
/// metadata. Cheap to clone.
///
/// ```
/// use rpc_core::{client::{Channel, Client}, link::mem, server::{Server, ServerCall, ServerReply}, Status};
/// use rpc_observe::trace::{ClientTraceLayer, ServerTraceLayer};
/// use tower::Layer;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (listener, connector) = mem::listener();
/// let echo = tower::service_fn(|call: ServerCall| async move {
///     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
/// });
/// let server = Server::builder()
///     .layer(ServerTraceLayer::new()) // first: its span covers the rest
///     .add_named_service("demo.Echo", echo);
/// tokio::spawn(server.serve(listener));
///
/// let channel = Channel::builder().connect(connector).await?;
/// let traced = ClientTraceLayer::for_channel(&channel).layer(channel);
/// let client = Client::new(traced); // or a generated one: `EchoClient::new(traced)`
/// # drop(client);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientTraceLayer {
    config: Arc<ClientConfig>,
}

struct ClientConfig {
    system: &'static str,
    transport: Option<Box<str>>,
    network: Option<&'static str>,
    address: Option<Box<str>>,
    port: Option<u16>,
    propagator: Option<Box<dyn Propagator>>,
}

impl std::fmt::Debug for ClientTraceLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTraceLayer")
            .field("transport", &self.config.transport)
            .field("address", &self.config.address)
            .field("port", &self.config.port)
            .field("propagates", &self.config.propagator.is_some())
            .finish()
    }
}

impl Default for ClientTraceLayer {
    fn default() -> Self {
        ClientTraceLayer::new()
    }
}

impl ClientTraceLayer {
    /// A layer with the [`W3cPropagator`] and no target (no `server.*` fields).
    pub fn new() -> ClientTraceLayer {
        crate::clock::warm_up();
        ClientTraceLayer {
            config: Arc::new(ClientConfig {
                system: "rpc",
                transport: None,
                network: None,
                address: None,
                port: None,
                propagator: Some(Box::new(W3cPropagator)),
            }),
        }
    }

    /// A layer whose spans name `channel`'s target ([`Channel::target`]) as the server.
    ///
    /// [`Channel::target`]: rpc_core::client::Channel::target
    pub fn for_channel(channel: &rpc_core::client::Channel) -> ClientTraceLayer {
        ClientTraceLayer::new().target(channel.target())
    }

    /// Names the server: a URI such as `tcp://10.0.0.7:7000` or `unix:///run/kv.sock`,
    /// whose scheme is `rpc.transport` and whose host and port are `server.address`
    /// and `server.port`.
    pub fn target(mut self, uri: &str) -> ClientTraceLayer {
        let config = self.config_mut();
        let uri = rpc_core::endpoint::lowercase_scheme(uri);
        let (scheme, rest) = split_scheme(&uri);
        config.system = system_of(scheme);
        config.network = network_of(scheme);
        config.transport = (!scheme.is_empty()).then(|| scheme.into());
        let (address, port) = split_host_port(rest);
        config.address = (!address.is_empty()).then(|| address.into());
        config.port = port;
        self
    }

    /// Replaces the propagator (default: [`W3cPropagator`]).
    pub fn propagator(mut self, propagator: impl Propagator) -> ClientTraceLayer {
        self.config_mut().propagator = Some(Box::new(propagator));
        self
    }

    /// Sends no trace context: spans only.
    pub fn without_propagation(mut self) -> ClientTraceLayer {
        self.config_mut().propagator = None;
        self
    }

    fn config_mut(&mut self) -> &mut ClientConfig {
        Arc::get_mut(&mut self.config).expect("configure the layer before cloning it")
    }
}

impl<S> Layer<S> for ClientTraceLayer {
    type Service = ClientTrace<S>;

    fn layer(&self, inner: S) -> ClientTrace<S> {
        ClientTrace {
            inner,
            config: self.config.clone(),
        }
    }
}

/// A client service that opens a span per call (see the [module docs](self)).
#[derive(Clone)]
pub struct ClientTrace<S> {
    inner: S,
    config: Arc<ClientConfig>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for ClientTrace<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTrace")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ClientCall> for ClientTrace<S>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status>,
{
    type Response = ClientReply;
    type Error = Status;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ClientCall) -> Self::Future {
        let config = &*self.config;
        let (service, method) = split_method(&call.method);
        let span = tracing::info_span!(
            "rpc.client",
            otel.name = %call.method,
            otel.kind = "client",
            otel.status_code = Empty,
            rpc.system = config.system,
            rpc.service = service,
            rpc.method = method,
            rpc.transport = config.transport.as_deref(),
            network.transport = config.network,
            server.address = config.address.as_deref(),
            server.port = config.port.map(i64::from),
            rpc.attempt = rpc_core::retry::current_attempt().map(i64::from),
            rpc.call_key = call.call_key.map(|key| tracing::field::display(KeyField(key))),
            rpc.grpc.status_code = Empty,
            rpc.status = Empty,
            error.message = Empty,
            rpc.duration_us = Empty,
            trace_id = Empty,
            span_id = Empty,
            parent_span_id = Empty,
        );
        static CLIENT_END: OnceLock<Option<EndFields>> = OnceLock::new();
        let started = EndFields::start(&span, &CLIENT_END);
        if let Some(propagator) = &config.propagator {
            propagator.inject(&span, &mut call.metadata);
        }
        TracedFuture {
            inner: self.inner.call(call),
            span,
            active: Active::new(None, started, None),
            done: false,
        }
    }
}

/// Wraps server services in [`ServerTrace`]: a span per call, the child of the
/// caller's through the request's trace context. Cheap to clone. Add it first
/// ([`ServerBuilder::layer`](rpc_core::server::ServerBuilder::layer)), so that its span
/// covers the other layers.
///
/// ```
/// use rpc_core::server::{Server, ServerCall, ServerReply};
/// use rpc_observe::trace::ServerTraceLayer;
/// # let echo = tower::service_fn(|_call: ServerCall| async { Ok::<_, rpc_core::Status>(ServerReply::default()) });
/// let server = Server::builder()
///     .layer(ServerTraceLayer::new())
///     .add_named_service("demo.Echo", echo)
///     .build();
/// # drop(server);
/// ```
#[derive(Clone)]
pub struct ServerTraceLayer {
    propagator: Option<Arc<dyn Propagator>>,
}

impl std::fmt::Debug for ServerTraceLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTraceLayer")
            .field("propagates", &self.propagator.is_some())
            .finish()
    }
}

impl Default for ServerTraceLayer {
    fn default() -> Self {
        ServerTraceLayer::new()
    }
}

impl ServerTraceLayer {
    /// A layer with the [`W3cPropagator`].
    pub fn new() -> ServerTraceLayer {
        ServerTraceLayer {
            propagator: Some(Arc::new(W3cPropagator)),
        }
    }

    /// Replaces the propagator (default: [`W3cPropagator`]).
    pub fn propagator(mut self, propagator: impl Propagator) -> ServerTraceLayer {
        self.propagator = Some(Arc::new(propagator));
        self
    }

    /// Reads no trace context: every call's span is a root.
    pub fn without_propagation(mut self) -> ServerTraceLayer {
        self.propagator = None;
        self
    }
}

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> ServerTrace<S> {
        ServerTrace {
            inner,
            propagator: self.propagator.clone(),
        }
    }
}

/// A server service that opens a span per call (see the [module docs](self)).
#[derive(Clone)]
pub struct ServerTrace<S> {
    inner: S,
    propagator: Option<Arc<dyn Propagator>>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for ServerTrace<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTrace")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ServerCall> for ServerTrace<S>
where
    S: Service<ServerCall, Response = ServerReply, Error = Status>,
{
    type Response = ServerReply;
    type Error = Status;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        let (service, method) = split_method(&call.method);
        let peer = call.peer.as_deref();
        let scheme = peer.map(|peer| split_scheme(peer.description()).0);
        let addr = peer.and_then(|peer| peer.addr());
        // The queued time reads the OS clock (`received` is the OS clock's), only for an
        // enabled span: the macro evaluates field values only then. The handler's time
        // is the counter's, as the client's is.
        let span = tracing::info_span!(
            "rpc.server",
            otel.name = %call.method,
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system = scheme.map_or("rpc", system_of),
            rpc.service = service,
            rpc.method = method,
            rpc.transport = scheme.filter(|scheme| !scheme.is_empty()),
            network.transport = scheme.and_then(network_of),
            net.peer = peer.map(|peer| peer.description()),
            client.address = addr.map(|addr| tracing::field::display(addr.ip())),
            client.port = addr.map(|addr| i64::from(addr.port())),
            network.peer.address = addr.map(|addr| tracing::field::display(addr.ip())),
            network.peer.port = addr.map(|addr| i64::from(addr.port())),
            rpc.grpc.status_code = Empty,
            rpc.status = Empty,
            error.message = Empty,
            rpc.duration_us = Empty,
            rpc.queued_us = call.received.map(|received| micros(received.elapsed())),
            trace_id = Empty,
            span_id = Empty,
            parent_span_id = Empty,
        );
        static SERVER_END: OnceLock<Option<EndFields>> = OnceLock::new();
        let started = EndFields::start(&span, &SERVER_END);
        let context = match &self.propagator {
            Some(propagator) => propagator.extract(&span, &call.metadata),
            None => None,
        };
        let timeout = call.timeout;
        TracedFuture {
            inner: self.inner.call(call),
            span,
            active: Active::new(context, started, timeout),
            done: false,
        }
    }
}

/// What a traced call that records or forwards anything keeps while it runs.
#[derive(Debug)]
struct Active {
    /// A server call's context: current while the inner future is polled.
    context: Option<TraceContext>,
    /// `None` when the span is disabled: nothing to record. Else when the call
    /// started, and the span's fields that its end records.
    started: Option<(Stamp, &'static EndFields)>,
    /// A server call's time budget, to tell a deadline from a cancellation.
    timeout: Option<Duration>,
}

impl Active {
    /// `None` when there is nothing to record nor forward: the future is then the
    /// inner one and a branch.
    fn new(
        context: Option<TraceContext>,
        started: Option<(Stamp, &'static EndFields)>,
        timeout: Option<Duration>,
    ) -> Option<Box<Active>> {
        (context.is_some() || started.is_some()).then(|| {
            Box::new(Active {
                context,
                started,
                timeout,
            })
        })
    }
}

pin_project! {
    /// The future of a traced call: the inner call's future, polled inside the call's
    /// span (on the server, with the call's [`TraceContext`] current). It records the
    /// status and the duration on the span when the call ends (a streaming call when
    /// its response stream ends: the span stays open until then, and a server's
    /// response stream is polled inside it too), or `CANCELLED` (or
    /// `DEADLINE_EXCEEDED`, or `INTERNAL` for a panic) if it is dropped before.
    pub struct TracedFuture<F> {
        #[pin]
        inner: F,
        span: Span,
        active: Option<Box<Active>>,
        done: bool,
    }

    impl<F> PinnedDrop for TracedFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.done {
                return;
            }
            if let Some(Active { started: Some((started, end)), timeout, .. }) = this.active.as_deref() {
                let elapsed = started.elapsed();
                let code = dropped_code(elapsed, *timeout);
                end.record(this.span, elapsed, code, None);
            }
        }
    }
}

impl<F, T> Future for TracedFuture<F>
where
    F: Future<Output = Result<T, Status>>,
    T: Reply,
{
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(active) = this.active.as_deref() else {
            return this.inner.poll(cx);
        };
        let poll = {
            let _entered = this.span.enter();
            match &active.context {
                Some(context) => TraceContext::enter(context, || this.inner.poll(cx)),
                None => this.inner.poll(cx),
            }
        };
        let mut result = std::task::ready!(poll);
        *this.done = true;
        let Some(active) = this.active.take() else {
            return Poll::Ready(result);
        };
        let end = TracedEnd {
            span: this.span.clone(),
            active,
        };
        end_call(&mut result, end);
        Poll::Ready(result)
    }
}

/// A traced call whose response stream is still open: its span, kept open, and what
/// its end records.
struct TracedEnd {
    span: Span,
    active: Box<Active>,
}

impl Watch for TracedEnd {
    fn around<R>(&self, poll: impl FnOnce() -> R) -> R {
        let _entered = self.span.enter();
        match &self.active.context {
            Some(context) => TraceContext::enter(context, poll),
            None => poll(),
        }
    }

    fn ended(self, end: StreamEnd<'_>) {
        let Some((started, fields)) = &self.active.started else {
            return;
        };
        let elapsed = started.elapsed();
        match end {
            StreamEnd::Ok => fields.record(&self.span, elapsed, Code::OK, None),
            StreamEnd::Failed(status) => {
                fields.record(&self.span, elapsed, status.code(), Some(status.message()))
            }
            StreamEnd::Dropped => {
                let code = dropped_code(elapsed, self.active.timeout);
                fields.record(&self.span, elapsed, code, None);
            }
        }
    }
}

/// A duration in whole microseconds, as a signed integer: what OpenTelemetry attributes
/// hold (`tracing-opentelemetry` turns unsigned integers into strings).
fn micros(elapsed: Duration) -> i64 {
    i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX)
}

/// `package.Service` and `Method` of `package.Service/Method`; a path without a `/`
/// is all method.
fn split_method(path: &str) -> (Option<&str>, &str) {
    // A plain loop over the bytes: `split_once('/')` goes through `memchr`, whose
    // setup costs more than the scan of a name this short (twice per call).
    match path.bytes().position(|b| b == b'/') {
        Some(slash) => (Some(&path[..slash]), &path[slash + 1..]),
        None => (None, path),
    }
}

/// A call key as the span shows it: `{client:032x}:{call}:{attempt}`.
struct KeyField(rpc_core::frame::CallKey);

impl std::fmt::Display for KeyField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = &self.0;
        write!(f, "{:032x}:{}:{}", key.client, key.call, key.attempt)
    }
}

/// The fields a call's span records when the call ends, looked up by name once per
/// span callsite (a lookup by name compares the name with each of the span's fields),
/// and recorded together: one call into the subscriber instead of one per field.
#[derive(Debug)]
struct EndFields {
    /// A server span: only the codes that are the server's fault make it an error.
    server: bool,
    duration: Field,
    code: Field,
    status: Field,
    otel_status: Field,
    error: Field,
}

impl EndFields {
    /// For an enabled span: now, and the end fields of its callsite, looked up in
    /// `cache` (one per callsite) the first time. `None` for a disabled span: nothing
    /// to record.
    fn start(
        span: &Span,
        cache: &'static OnceLock<Option<EndFields>>,
    ) -> Option<(Stamp, &'static EndFields)> {
        if span.is_disabled() {
            return None;
        }
        let end = cache.get_or_init(|| EndFields::of(span)).as_ref()?;
        Some((Stamp::now(), end))
    }

    /// The fields of `span`'s callsite; `None` if it lacks one of them.
    fn of(span: &Span) -> Option<EndFields> {
        let metadata = span.metadata()?;
        let fields = metadata.fields();
        Some(EndFields {
            server: metadata.name() == "rpc.server",
            duration: fields.field("rpc.duration_us")?,
            code: fields.field("rpc.grpc.status_code")?,
            status: fields.field("rpc.status")?,
            otel_status: fields.field("otel.status_code")?,
            error: fields.field("error.message")?,
        })
    }

    /// Records the call's duration and status on `span`; the failure and its message
    /// when the code is not `OK`.
    fn record(&self, span: &Span, elapsed: Duration, code: Code, message: Option<&str>) {
        let Some(metadata) = span.metadata() else {
            return;
        };
        let failed = code != Code::OK;
        let error = if self.server {
            matches!(
                code,
                Code::UNKNOWN
                    | Code::DEADLINE_EXCEEDED
                    | Code::UNIMPLEMENTED
                    | Code::INTERNAL
                    | Code::UNAVAILABLE
                    | Code::DATA_LOSS
            )
        } else {
            failed
        };
        let duration = micros(elapsed);
        let number = i64::from(code.as_u32());
        let name = tracing::field::display(code);
        let message = message.filter(|_| failed);
        let values: [(&Field, Option<&dyn Value>); 5] = [
            (&self.duration, Some(&duration)),
            (&self.code, Some(&number)),
            (&self.status, Some(&name)),
            (&self.otel_status, error.then_some(&"ERROR" as &dyn Value)),
            (&self.error, message.as_ref().map(|m| m as &dyn Value)),
        ];
        span.record_all(&metadata.fields().value_set(&values));
    }
}

/// `tcp` and `127.0.0.1:7000` from `tcp://127.0.0.1:7000`; no scheme: `""` and all.
/// (A scheme has no `:`, so the first one decides: `split_once("://")` sets up a
/// substring search on every server call, and `find(':')` a `memchr` longer than the
/// few bytes of a scheme.)
fn split_scheme(uri: &str) -> (&str, &str) {
    match uri.bytes().position(|b| b == b':') {
        Some(colon) if uri[colon..].starts_with("://") => (&uri[..colon], &uri[colon + 3..]),
        _ => ("", uri),
    }
}

/// Host (brackets of an IPv6 literal removed) and port of `host:port`; a path (Unix
/// socket) is all host.
fn split_host_port(rest: &str) -> (&str, Option<u16>) {
    let rest = rest
        .split(['/', '?'])
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(rest);
    if rest.starts_with('/') {
        return (rest, None);
    }
    match rest.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() && !host.ends_with(':') => (
            host.trim_start_matches('[').trim_end_matches(']'),
            port.parse().ok(),
        ),
        _ => (rest, None),
    }
}

fn system_of(scheme: &str) -> &'static str {
    if scheme.starts_with("grpc") {
        "grpc"
    } else {
        "rpc"
    }
}

fn network_of(scheme: &str) -> Option<&'static str> {
    match scheme {
        "tcp" | "tls" | "grpc" | "grpcs" | "rdma" => Some("tcp"),
        "udp" => Some("udp"),
        "unix" | "tls+unix" | "rdma+unix" => Some("unix"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split_into_address_and_port() {
        assert_eq!(
            split_scheme("tcp://127.0.0.1:7000"),
            ("tcp", "127.0.0.1:7000")
        );
        assert_eq!(split_host_port("127.0.0.1:7000"), ("127.0.0.1", Some(7000)));
        assert_eq!(split_host_port("[::1]:7000"), ("::1", Some(7000)));
        assert_eq!(split_host_port("kv.internal:80"), ("kv.internal", Some(80)));
        assert_eq!(split_host_port("/run/kv.sock"), ("/run/kv.sock", None));
        assert_eq!(split_host_port("kv"), ("kv", None));
        assert_eq!(
            split_scheme("unix:///run/kv.sock"),
            ("unix", "/run/kv.sock")
        );
        assert_eq!(split_scheme("127.0.0.1:7000"), ("", "127.0.0.1:7000"));
        assert_eq!(split_scheme("[::1]:7000"), ("", "[::1]:7000"));
        assert_eq!(split_scheme("tcp://[::1]:7000"), ("tcp", "[::1]:7000"));
        assert_eq!(split_scheme("peer"), ("", "peer"));
        assert_eq!(network_of("tls+unix"), Some("unix"));
        assert_eq!(system_of("grpcs"), "grpc");
    }
}
