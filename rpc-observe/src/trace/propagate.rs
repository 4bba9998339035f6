//! How a call's trace context crosses processes: the [`Propagator`] hook, and its
//! default, [`W3cPropagator`], which needs nothing but `tracing`.

use tracing::Span;

use rpc_core::Metadata;

use super::context::{TraceContext, TRACEPARENT, TRACESTATE};

/// Carries a trace context in a call's metadata: the client layer calls
/// [`inject`](Self::inject) with the call's span, the server layer calls
/// [`extract`](Self::extract) with its new span before the handler runs.
///
/// The default, [`W3cPropagator`], writes W3C `traceparent`/`tracestate` from ids it
/// keeps itself and records them as span fields (`trace_id`, `span_id`,
/// `parent_span_id`). An application that exports through OpenTelemetry implements
/// this trait over `tracing-opentelemetry` instead, so that the ids are the exporter's
/// (the `rpc-example-otel` crate, `examples/otel/`, does; about twenty lines).
///
/// ```
/// use rpc_core::Metadata;
/// use rpc_observe::trace::{Propagator, TraceContext};
/// use tracing::Span;
///
/// /// Forwards a request id, and nothing else.
/// struct RequestId;
/// impl Propagator for RequestId {
///     fn inject(&self, _span: &Span, metadata: &mut Metadata) {
///         let _ = metadata.insert("x-request-id", "r-1");
///     }
///     fn extract(&self, span: &Span, metadata: &Metadata) -> Option<TraceContext> {
///         if let Some(id) = metadata.get_str("x-request-id") {
///             span.record("request_id", id);
///         }
///         None
///     }
/// }
/// let layer = rpc_observe::trace::ServerTraceLayer::new().propagator(RequestId);
/// # drop(layer);
/// ```
pub trait Propagator: Send + Sync + 'static {
    /// Writes the context of `span` (the client call's span, possibly disabled) into
    /// the request's `metadata`.
    fn inject(&self, span: &Span, metadata: &mut Metadata);

    /// Reads the caller's context from the request's `metadata` and makes it the
    /// parent of `span` (the server call's span, possibly disabled). The context it
    /// returns becomes [`TraceContext::current`] while the handler runs, which is how
    /// the default propagator continues the trace in the calls the handler makes;
    /// propagators that keep their context elsewhere (OpenTelemetry's, in the span)
    /// return `None`.
    fn extract(&self, span: &Span, metadata: &Metadata) -> Option<TraceContext>;
}

/// The default [`Propagator`]: W3C Trace Context in metadata, with ids kept by this
/// crate ([`TraceContext`]) and recorded on the spans as `trace_id`, `span_id` and
/// `parent_span_id` (hex), so that logs of one request can be joined by `trace_id`
/// without any exporter.
///
/// - Client: the call's context is a child of [`TraceContext::current`] (the server
///   call whose handler makes this call), or a new trace; `traceparent` (and
///   `tracestate`, if the trace has one) go in the request's metadata. With the span
///   disabled, the current context, if any, is forwarded unchanged, so that a trace
///   crosses a process that records nothing.
/// - Server: the call's context is a child of the request's `traceparent`, or a new
///   trace; it is current while the handler runs. With the span disabled, the
///   request's context is passed on unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct W3cPropagator;

impl Propagator for W3cPropagator {
    fn inject(&self, span: &Span, metadata: &mut Metadata) {
        let parent = TraceContext::current();
        let context = if span.is_disabled() {
            match parent {
                Some(parent) => parent,
                None => return,
            }
        } else {
            let context = match &parent {
                Some(parent) => {
                    span.record("parent_span_id", format_args!("{:016x}", parent.span_id));
                    parent.child()
                }
                None => TraceContext::root(),
            };
            record_ids(span, &context);
            context
        };
        insert(metadata, &context);
    }

    fn extract(&self, span: &Span, metadata: &Metadata) -> Option<TraceContext> {
        let remote = metadata
            .get_str(TRACEPARENT)
            .and_then(|parent| TraceContext::parse(parent, metadata.get_str(TRACESTATE)));
        if span.is_disabled() {
            return remote;
        }
        let context = match remote {
            Some(remote) => {
                span.record("parent_span_id", format_args!("{:016x}", remote.span_id));
                remote.child()
            }
            None => TraceContext::root(),
        };
        record_ids(span, &context);
        Some(context)
    }
}

fn record_ids(span: &Span, context: &TraceContext) {
    span.record("trace_id", format_args!("{:032x}", context.trace_id));
    span.record("span_id", format_args!("{:016x}", context.span_id));
}

/// Puts `context` in `metadata`, replacing any `traceparent` and `tracestate` there.
fn insert(metadata: &mut Metadata, context: &TraceContext) {
    // `Metadata::insert` replaces what the key held.
    let _ = metadata.insert(TRACEPARENT, context.traceparent());
    match &context.state {
        Some(state) => {
            let _ = metadata.insert(TRACESTATE, state.clone());
        }
        None => {
            metadata.remove(TRACESTATE);
        }
    }
}
