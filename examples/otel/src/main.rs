//! One trace across a client, a server, and a second server that the first one calls,
//! exported to OpenTelemetry through `tracing-opentelemetry`, printed on stdout by
//! OpenTelemetry's stdout exporter (no collector needed).
//!
//! ```text
//! cargo run -p rpc-example-otel
//! ```
//!
//! `rpc-observe`'s layers open the spans (`rpc.client`, `rpc.server`, with
//! OpenTelemetry's RPC fields); [`OtelPropagator`] carries the context between them as
//! W3C `traceparent` in each call's metadata, with OpenTelemetry's own ids. The two
//! servers listen on TCP ports of this process: the spans would be the same from three
//! processes, each exporting its own (the trace id ties them together).
//!
//! The output is the exporter's: four spans of one trace id, the front server's span
//! the child of the client's, the back call's the child of the front server's, and the
//! back server's the child of that. The last lines sum it up.

use std::sync::{Arc, Mutex};

use opentelemetry::{
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::TracerProvider as _,
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{SdkTracerProvider, SpanData, SpanExporter},
};
use rpc_core::{
    client::{Channel, Client},
    method::{Idempotency, MethodDescriptor},
    server::{Server, ServerCall, ServerReply},
    Metadata, Request, Status,
};
use rpc_observe::trace::{
    ClientTrace, ClientTraceLayer, Propagator, ServerTraceLayer, TraceContext,
};
use tower::Layer;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::prelude::*;

/// The front server's method: it calls the back server's `Say`.
static FORWARD: MethodDescriptor = MethodDescriptor {
    service: "demo.Front",
    method: "Forward",
    path: "demo.Front/Forward",
    idempotency: Idempotency::NoSideEffects,
};

/// The back server's method: an echo.
static SAY: MethodDescriptor = MethodDescriptor {
    service: "demo.Back",
    method: "Say",
    path: "demo.Back/Say",
    idempotency: Idempotency::NoSideEffects,
};

/// `rpc-observe`'s propagation hook over OpenTelemetry: the context of a span is the
/// one `tracing-opentelemetry` keeps for it, written and read as W3C trace context.
struct OtelPropagator(TraceContextPropagator);

impl Propagator for OtelPropagator {
    fn inject(&self, span: &Span, metadata: &mut Metadata) {
        self.0
            .inject_context(&span.context(), &mut MetadataCarrier(metadata));
    }

    fn extract(&self, span: &Span, metadata: &Metadata) -> Option<TraceContext> {
        let parent = self.0.extract(&MetadataReader(metadata));
        let _ = span.set_parent(parent);
        // The context lives in the span: nothing for `TraceContext::current`.
        None
    }
}

struct MetadataCarrier<'a>(&'a mut Metadata);

impl Injector for MetadataCarrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        let _ = self.0.insert(key.to_owned(), value);
    }
}

struct MetadataReader<'a>(&'a Metadata);

impl Extractor for MetadataReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get_str(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(key, _)| key).collect()
    }
}

/// The stdout exporter, and a copy of each span for the summary at the end.
#[derive(Debug)]
struct Exporter {
    stdout: opentelemetry_stdout::SpanExporter,
    seen: Arc<Mutex<Vec<SpanData>>>,
}

impl SpanExporter for Exporter {
    async fn export(&self, batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        self.seen.lock().unwrap().extend(batch.iter().cloned());
        self.stdout.export(batch).await
    }
}

/// A traced client of `uri`.
async fn connect(uri: &str) -> Result<Client<ClientTrace<Channel>>, Box<dyn std::error::Error>> {
    let channel = rpc_transport_tcp::connect(uri).await?;
    let layer = ClientTraceLayer::for_channel(&channel)
        .propagator(OtelPropagator(TraceContextPropagator::new()));
    Ok(Client::new(layer.layer(channel)))
}

/// Serves `service` as `name` on a free TCP port; returns its URI.
async fn serve<S>(name: &str, service: S) -> Result<String, Box<dyn std::error::Error>>
where
    S: tower::Service<ServerCall, Response = ServerReply, Error = Status>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = rpc_core::link::Listener::local_addr(&listener);
    let server = Server::builder()
        .layer(ServerTraceLayer::new().propagator(OtelPropagator(TraceContextPropagator::new())))
        .add_named_service(name, service);
    tokio::spawn(server.serve(listener));
    Ok(uri)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(Exporter {
            stdout: opentelemetry_stdout::SpanExporter::default(),
            seen: seen.clone(),
        })
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("rpc-example-otel")))
        .init();

    // The back server: an echo.
    let back = serve(
        "demo.Back",
        tower::service_fn(|call: ServerCall| async move {
            Ok::<_, Status>(ServerReply {
                payload: call.payload.into(),
                ..ServerReply::default()
            })
        }),
    )
    .await?;
    // The front server: forwards to the back server, inside its own call's span.
    let back_client = connect(&back).await?;
    let front = serve(
        "demo.Front",
        tower::service_fn(move |call: ServerCall| {
            let mut back = back_client.clone();
            async move {
                let request = rpc_core::codegen::decode_request::<String>(call)?;
                let reply = back.unary::<_, String>(request, &SAY).await?;
                let payload = rpc_core::codegen::prost::Message::encode_to_vec(reply.get_ref());
                Ok::<_, Status>(ServerReply {
                    payload: payload.into(),
                    ..ServerReply::default()
                })
            }
        }),
    )
    .await?;

    let mut client = connect(&front).await?;
    let reply = client
        .unary::<_, String>(Request::new("hello".to_string()), &FORWARD)
        .await?;
    println!("reply: {}", reply.get_ref());

    provider.shutdown()?;
    let spans = seen.lock().unwrap();
    let mut traces: Vec<String> = spans
        .iter()
        .map(|span| span.span_context.trace_id().to_string())
        .collect();
    traces.dedup();
    println!("\n{} spans, trace ids: {traces:?}", spans.len());
    for span in spans.iter() {
        println!(
            "  {:?} {:<20} span {} parent {}",
            span.span_kind,
            span.name,
            span.span_context.span_id(),
            span.parent_span_id
        );
    }
    Ok(())
}
