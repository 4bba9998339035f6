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
/// millisecond ticks; a client ends a call at its own deadline, which the budget it
/// sent may overstate (gRPC's `grpc-timeout` has 8 digits: grpcio rounds a budget of
/// seconds up to 10 ms steps, and its CANCEL came a few ms before the server's
/// deadline: from a review, 5 of 6 such calls counted `CANCELLED`). So a drop within
/// [`DEADLINE_SLACK`] plus a fiftieth of the budget of its end counts as the deadline,
/// a client's CANCEL there included.
pub(crate) fn dropped_code(
    elapsed: std::time::Duration,
    timeout: Option<std::time::Duration>,
) -> rpc_core::Code {
    if std::thread::panicking() {
        return rpc_core::Code::INTERNAL;
    }
    match rpc_core::server::stop_cause() {
        // A client's CANCEL of a stream: the budget decides, as for any drop.
        Some(rpc_core::Code::CANCELLED) | None => {}
        Some(code) => return code,
    }
    match timeout {
        Some(budget) if elapsed + DEADLINE_SLACK + budget / 50 >= budget => {
            rpc_core::Code::DEADLINE_EXCEEDED
        }
        _ => rpc_core::Code::CANCELLED,
    }
}

/// See [`dropped_code`].
const DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rpc_core::Code;

    use super::dropped_code;

    /// A drop near the budget's end is the deadline: a gRPC client whose budget was
    /// rounded up (2.345 s sent as 2.35 s) cancels a few ms before the server's
    /// deadline. Well before it, a cancel; with no budget, a cancel.
    #[test]
    fn a_drop_near_the_budget_is_the_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(
            dropped_code(ms(2_345), Some(ms(2_350))),
            Code::DEADLINE_EXCEEDED
        );
        assert_eq!(
            dropped_code(ms(299), Some(ms(300))),
            Code::DEADLINE_EXCEEDED
        );
        assert_eq!(
            dropped_code(ms(98_100), Some(ms(100_000))),
            Code::DEADLINE_EXCEEDED
        );
        assert_eq!(dropped_code(ms(1_000), Some(ms(2_350))), Code::CANCELLED);
        assert_eq!(dropped_code(ms(290), Some(ms(300))), Code::CANCELLED);
        assert_eq!(dropped_code(ms(1_000), None), Code::CANCELLED);
    }
}
