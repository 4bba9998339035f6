//! Observability for `rpc-core` services, as tower layers: a `tracing` span per call
//! with the trace context carried across processes ([`trace`]), and call metrics on
//! the [`metrics`](::metrics) facade ([`metrics`]).
//!
//! Every layer is opt-in: a stack without them pays nothing. The spans follow
//! OpenTelemetry's RPC semantic conventions and carry W3C trace context in metadata
//! without depending on OpenTelemetry (`examples/otel/` exports them to OpenTelemetry
//! through `tracing-opentelemetry`); the metrics go to whatever recorder the
//! application installs (`metrics-exporter-prometheus`, as `rpc-server` does, or any
//! other). `docs/observability.md` lists every span field and metric with its unit.
//!
//! # Layout
//!
//! - [`trace`][]: [`ClientTraceLayer`](trace::ClientTraceLayer),
//!   [`ServerTraceLayer`](trace::ServerTraceLayer), the [`Propagator`](trace::Propagator)
//!   hook and its W3C default, [`TraceContext`](trace::TraceContext).
//! - [`metrics`][]: [`ClientMetricsLayer`](metrics::ClientMetricsLayer),
//!   [`ServerMetricsLayer`](metrics::ServerMetricsLayer), [`describe`](metrics::describe)
//!   (the `# HELP` texts and units), [`record_server_stats`](metrics::record_server_stats)
//!   (connections and duplicate-cache counters of a [`Server`](rpc_core::server::Server)),
//!   [`record_ejections`](metrics::record_ejections) (replicas a
//!   [`Balanced`](rpc_core::balance::Balanced) client ejected).
//! - [`status`][]: the data of a live status page: [`StatusLayer`](status::StatusLayer)
//!   records calls into a [`StatusBoard`](status::StatusBoard) (per-method rates, error
//!   rates, p50/p99 over five minutes; a bounded sample of recent calls), and
//!   `render_*` functions make the pages (HTML, JSON) that `rpc-server` serves on its
//!   admin address.
//!
//! # Example
//!
//! Both sides, each with both layers:
//!
//! ```
//! use rpc_core::{client::{Channel, Client}, link::mem, server::{Server, ServerCall, ServerReply}, Status};
//! use rpc_observe::{metrics::{ClientMetricsLayer, ServerMetricsLayer}, trace::{ClientTraceLayer, ServerTraceLayer}};
//! use tower::ServiceBuilder;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let echo = tower::service_fn(|call: ServerCall| async move {
//!     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
//! });
//! let (listener, connector) = mem::listener();
//! let server = Server::builder()
//!     .layer(ServerTraceLayer::new())
//!     .layer(ServerMetricsLayer::new())
//!     .add_named_service("demo.Echo", echo);
//! tokio::spawn(server.serve(listener));
//!
//! let channel = Channel::builder().connect(connector).await?;
//! let stack = ServiceBuilder::new()
//!     .layer(ClientTraceLayer::for_channel(&channel))
//!     .layer(ClientMetricsLayer::new())
//!     .service(channel);
//! let client = Client::new(stack); // or `EchoClient::new(stack)`
//! # drop(client);
//! # Ok(()) }
//! ```

mod clock;
mod ending;
pub mod metrics;
pub mod status;
pub mod trace;

/// The status of a call whose future was dropped before it ended, `elapsed` after it
/// started, with `timeout` as its time budget (a server call's): `INTERNAL` if the
/// handler panicked (the server drops it while unwinding), the code the server answered
/// with if it stopped the handler itself ([`rpc_core::server::stop_cause`]: a stream
/// message over its budgets, a gRPC request its link refused, a client's CANCEL),
/// `DEADLINE_EXCEEDED` if the budget ran out, `CANCELLED` otherwise. The server sets
/// the deadline just before the layers see the call, and its timer fires on
/// millisecond ticks: a drop within [`DEADLINE_SLACK`] of the budget counts as the
/// deadline.
pub(crate) fn dropped_code(
    elapsed: std::time::Duration,
    timeout: Option<std::time::Duration>,
) -> rpc_core::Code {
    if std::thread::panicking() {
        return rpc_core::Code::INTERNAL;
    }
    if let Some(code) = rpc_core::server::stop_cause() {
        return code;
    }
    match timeout {
        Some(budget) if elapsed + DEADLINE_SLACK >= budget => rpc_core::Code::DEADLINE_EXCEEDED,
        _ => rpc_core::Code::CANCELLED,
    }
}

/// See [`dropped_code`].
const DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_millis(1);
