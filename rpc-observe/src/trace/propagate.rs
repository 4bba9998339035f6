//! How a call's trace context crosses processes: the [`Propagator`] hook, and its
//! default, [`W3cPropagator`], which needs nothing but `tracing`.

use std::{fmt, sync::OnceLock};

use tracing::{
    field::{Field, Value},
    Metadata as SpanMetadata, Span,
};

use rpc_core::{Metadata, MetadataValue};

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
/// use rpc_core::{Metadata, MetadataValue};
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
                Some(parent) => parent.child(),
                None => TraceContext::root(),
            };
            record_ids(span, &context, parent.as_ref().map(|parent| parent.span_id));
            context
        };
        insert(metadata, &context);
    }

    fn extract(&self, span: &Span, metadata: &Metadata) -> Option<TraceContext> {
        let remote = metadata
            .get_str(TRACEPARENT)
            .and_then(|parent| TraceContext::parse(parent, tracestate(metadata).as_deref()));
        if span.is_disabled() {
            return remote;
        }
        let parent = remote.as_ref().map(|remote| remote.span_id);
        let context = match remote {
            Some(remote) => remote.child(),
            None => TraceContext::root(),
        };
        record_ids(span, &context, parent);
        Some(context)
    }
}

/// Records `context`'s ids, and its parent's span id if it has one, on `span`: in
/// one call into the subscriber, with the fields looked up once per callsite.
fn record_ids(span: &Span, context: &TraceContext, parent: Option<u64>) {
    let trace_id = tracing::field::display(Hex128(context.trace_id));
    let span_id = tracing::field::display(Hex64(context.span_id));
    let parent = parent.map(|id| tracing::field::display(Hex64(id)));
    let Some(metadata) = span.metadata() else {
        return;
    };
    let Some(fields) = IdFields::of(metadata) else {
        // A callsite without all three fields: each one it has.
        span.record("trace_id", trace_id);
        span.record("span_id", span_id);
        if let Some(parent) = parent {
            span.record("parent_span_id", parent);
        }
        return;
    };
    let values: [(&Field, Option<&dyn Value>); 3] = [
        (&fields.trace_id, Some(&trace_id)),
        (&fields.span_id, Some(&span_id)),
        (
            &fields.parent_span_id,
            parent.as_ref().map(|p| p as &dyn Value),
        ),
    ];
    span.record_all(&metadata.fields().value_set(&values));
}

/// A trace id as W3C writes it: 32 lowercase hex digits.
struct Hex128(u128);

impl fmt::Display for Hex128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A span id as W3C writes it: 16 lowercase hex digits.
struct Hex64(u64);

impl fmt::Display for Hex64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The id fields of one span callsite.
#[derive(Clone)]
struct IdFields {
    trace_id: Field,
    span_id: Field,
    parent_span_id: Field,
}

/// Callsites whose id fields are kept: the trace layers' two, and room for a few
/// spans of an application's own; beyond them fields are looked up by name.
const CACHED_CALLSITES: usize = 4;

impl IdFields {
    /// The id fields of `metadata`'s callsite, `None` if it lacks one: looked up by
    /// name (a comparison with each of the span's fields) once per cached callsite.
    fn of(metadata: &'static SpanMetadata<'static>) -> Option<IdFields> {
        static CACHE: [OnceLock<(usize, Option<IdFields>)>; CACHED_CALLSITES] =
            [const { OnceLock::new() }; CACHED_CALLSITES];
        let key = metadata as *const SpanMetadata<'static> as usize;
        for slot in &CACHE {
            let (site, fields) = slot.get_or_init(|| (key, IdFields::look_up(metadata)));
            if *site == key {
                return fields.clone();
            }
        }
        IdFields::look_up(metadata)
    }

    fn look_up(metadata: &'static SpanMetadata<'static>) -> Option<IdFields> {
        let fields = metadata.fields();
        Some(IdFields {
            trace_id: fields.field("trace_id")?,
            span_id: fields.field("span_id")?,
            parent_span_id: fields.field("parent_span_id")?,
        })
    }
}

/// Puts `context` in `metadata`, replacing any `traceparent` and `tracestate` there.
fn insert(metadata: &mut Metadata, context: &TraceContext) {
    // `Metadata::insert` replaces what the key held.
    let _ = metadata.insert(
        TRACEPARENT,
        MetadataValue::Text(context.traceparent_value()),
    );
    match &context.state {
        Some(state) => {
            let _ = metadata.insert(TRACESTATE, state.clone());
        }
        None => {
            metadata.remove(TRACESTATE);
        }
    }
}

/// The `tracestate` of `metadata`: several headers of it are one list, joined with
/// commas (W3C Trace Context 3.3.1.1; HTTP/2 peers may send them apart). Borrowed when
/// there is one.
fn tracestate(metadata: &Metadata) -> Option<std::borrow::Cow<'_, str>> {
    let mut states = metadata
        .get_all(TRACESTATE)
        .filter_map(rpc_core::metadata::MetadataValue::as_str);
    let first = states.next()?;
    let Some(second) = states.next() else {
        return Some(std::borrow::Cow::Borrowed(first));
    };
    let mut joined = format!("{first},{second}");
    for more in states {
        joined.push(',');
        joined.push_str(more);
    }
    Some(std::borrow::Cow::Owned(joined))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several `tracestate` headers are one list (they were: the first alone).
    #[test]
    fn several_tracestate_headers_are_joined() {
        let mut metadata = Metadata::new();
        assert!(tracestate(&metadata).is_none());
        metadata.append(TRACESTATE, "a=1").unwrap();
        assert_eq!(tracestate(&metadata).as_deref(), Some("a=1"));
        metadata.append(TRACESTATE, "b=2,c=3").unwrap();
        assert_eq!(tracestate(&metadata).as_deref(), Some("a=1,b=2,c=3"));
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::parse(parent, tracestate(&metadata).as_deref()).unwrap();
        assert_eq!(context.state.as_deref(), Some("a=1,b=2,c=3"));
    }
}
