//! The trace layers with a subscriber that records spans: one span per call on each
//! side, each server span the child of its client span through `traceparent` (across
//! two hops), and the status and attempt fields of failed and retried calls.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use futures::StreamExt;
use rpc_core::{
    client::{Channel, Client},
    link::mem,
    method::{Idempotency, MethodDescriptor},
    retry::{RetryLayer, RetryPolicy},
    server::{Server, ServerCall, ServerReply},
    stream::{ReplyStream, TakeOnce},
    Request, Status,
};
use rpc_observe::trace::{ClientTrace, ClientTraceLayer, ServerTraceLayer};
use tower::Layer as _;
use tracing::{
    field::{Field, Visit},
    span::{Attributes, Id, Record},
    Subscriber,
};
use tracing_subscriber::{layer::Context, prelude::*, registry::LookupSpan, Layer};

static SAY: MethodDescriptor = MethodDescriptor {
    service: "demo.Back",
    method: "Say",
    path: "demo.Back/Say",
    idempotency: Idempotency::NoSideEffects,
};
static MISSING: MethodDescriptor = MethodDescriptor {
    service: "demo.Back",
    method: "Missing",
    path: "demo.Back/Missing",
    idempotency: Idempotency::NoSideEffects,
};
static FLAKY: MethodDescriptor = MethodDescriptor {
    service: "demo.Back",
    method: "Flaky",
    path: "demo.Back/Flaky",
    idempotency: Idempotency::NoSideEffects,
};
static COUNT: MethodDescriptor = MethodDescriptor {
    service: "demo.Back",
    method: "Count",
    path: "demo.Back/Count",
    idempotency: Idempotency::NoSideEffects,
};
static FORWARD: MethodDescriptor = MethodDescriptor {
    service: "demo.Front",
    method: "Forward",
    path: "demo.Front/Forward",
    idempotency: Idempotency::NoSideEffects,
};

/// One recorded span: its name and fields (as text), in creation order.
#[derive(Clone, Debug)]
struct SpanRecord {
    name: &'static str,
    fields: HashMap<String, String>,
}

impl SpanRecord {
    fn get(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }
}

/// A `tracing_subscriber` layer that keeps every span and its fields.
#[derive(Clone, Default)]
struct Recorder {
    spans: Arc<Mutex<Vec<(Id, SpanRecord)>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name();
        self.spans
            .lock()
            .unwrap()
            .push((id.clone(), SpanRecord { name, fields }));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.spans.lock().unwrap();
        if let Some((_, span)) = spans.iter_mut().rev().find(|(known, _)| known == id) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
}

impl Recorder {
    fn named(&self, name: &str) -> Vec<SpanRecord> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| s.name == name)
            .map(|(_, s)| s.clone())
            .collect()
    }

    fn clear(&self) {
        self.spans.lock().unwrap().clear();
    }
}

/// A traced client of the server behind `connector`.
async fn client(connector: mem::MemConnector) -> Client<ClientTrace<Channel>> {
    let channel = Channel::builder().connect(connector).await.unwrap();
    Client::new(ClientTraceLayer::for_channel(&channel).layer(channel))
}

/// Opens the response stream of `Count` past its first message.
fn count_gate() -> &'static tokio::sync::Notify {
    static GATE: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();
    GATE.get_or_init(tokio::sync::Notify::new)
}

/// The back server: `Say` echoes, `Missing` is NOT_FOUND, `Flaky` is UNAVAILABLE the
/// first time, `Count` streams `one` and then, once [`count_gate`] opens, fails
/// ABORTED.
fn back() -> mem::MemConnector {
    let (listener, connector) = mem::listener();
    let failed_once = Arc::new(AtomicBool::new(false));
    let service = tower::service_fn(move |call: ServerCall| {
        let failed_once = failed_once.clone();
        async move {
            match call.method.as_str() {
                "demo.Back/Missing" => Err(Status::not_found("no such thing")),
                "demo.Back/Count" => {
                    let one = rpc_core::payload::encode(&"one".to_string());
                    let messages: ReplyStream = futures::stream::iter([Ok(one)])
                        .chain(futures::stream::once(async {
                            count_gate().notified().await;
                            Err(Status::aborted("midway"))
                        }))
                        .boxed();
                    Ok(ServerReply {
                        stream: Some(TakeOnce::new(messages)),
                        ..ServerReply::default()
                    })
                }
                "demo.Back/Flaky" if !failed_once.swap(true, Ordering::Relaxed) => {
                    Err(Status::unavailable("warming up"))
                }
                _ => Ok(ServerReply {
                    payload: call.payload.into(),
                    ..ServerReply::default()
                }),
            }
        }
    });
    let server = Server::builder()
        .layer(ServerTraceLayer::new())
        .add_named_service("demo.Back", service);
    tokio::spawn(server.serve(listener));
    connector
}

/// The front server: `Forward` calls the back server's `Say` with a traced client.
fn front(back: Client<ClientTrace<Channel>>) -> mem::MemConnector {
    let (listener, connector) = mem::listener();
    let service = tower::service_fn(move |call: ServerCall| {
        let mut back = back.clone();
        async move {
            let request = rpc_core::codegen::decode_request::<String>(call)?;
            let reply = back.unary::<_, String>(request, &SAY).await?;
            let payload = rpc_core::codegen::prost::Message::encode_to_vec(reply.get_ref());
            Ok::<_, Status>(ServerReply {
                payload: payload.into(),
                ..ServerReply::default()
            })
        }
    });
    let server = Server::builder()
        .layer(ServerTraceLayer::new())
        .add_named_service("demo.Front", service);
    tokio::spawn(server.serve(listener));
    connector
}

fn install() -> (Recorder, tracing::subscriber::DefaultGuard) {
    let recorder = Recorder::default();
    let guard = tracing_subscriber::registry()
        .with(recorder.clone())
        .set_default();
    (recorder, guard)
}

#[tokio::test]
async fn one_trace_spans_a_client_and_two_servers() {
    let (recorder, _guard) = install();
    let back_client = client(back()).await;
    let mut front_client = client(front(back_client)).await;
    recorder.clear();

    let reply = front_client
        .unary::<_, String>(Request::new("hi".to_string()), &FORWARD)
        .await
        .unwrap();
    assert_eq!(reply.get_ref(), "hi");

    let clients = recorder.named("rpc.client");
    let servers = recorder.named("rpc.server");
    assert_eq!(clients.len(), 2, "{clients:#?}");
    assert_eq!(servers.len(), 2, "{servers:#?}");
    let (outer, inner) = (&clients[0], &clients[1]);
    let (front, back) = (&servers[0], &servers[1]);
    assert_eq!(outer.get("otel.name"), Some("demo.Front/Forward"));
    assert_eq!(front.get("rpc.service"), Some("demo.Front"));
    assert_eq!(front.get("rpc.method"), Some("Forward"));
    assert_eq!(inner.get("otel.name"), Some("demo.Back/Say"));
    assert_eq!(back.get("rpc.method"), Some("Say"));

    // One trace; each span the child of the one that caused it.
    let trace = outer.get("trace_id").expect("trace_id");
    for span in [inner, front, back] {
        assert_eq!(span.get("trace_id"), Some(trace), "{span:#?}");
    }
    assert_eq!(outer.get("parent_span_id"), None);
    assert_eq!(front.get("parent_span_id"), outer.get("span_id"));
    assert_eq!(inner.get("parent_span_id"), front.get("span_id"));
    assert_eq!(back.get("parent_span_id"), inner.get("span_id"));

    for span in clients.iter().chain(&servers) {
        assert_eq!(span.get("rpc.system"), Some("rpc"), "{span:#?}");
        assert_eq!(span.get("rpc.status"), Some("OK"), "{span:#?}");
        assert_eq!(span.get("rpc.grpc.status_code"), Some("0"), "{span:#?}");
        assert_eq!(span.get("otel.status_code"), None, "{span:#?}");
        assert!(span.get("rpc.duration_us").is_some(), "{span:#?}");
    }
    assert_eq!(outer.get("otel.kind"), Some("client"));
    assert_eq!(front.get("otel.kind"), Some("server"));
    assert!(front.get("net.peer").is_some(), "{front:#?}");
    // Server spans know when their request arrived; client spans have no such field.
    for span in [front, back] {
        let queued: u64 = span
            .get("rpc.queued_us")
            .expect("rpc.queued_us")
            .parse()
            .unwrap();
        let total: u64 = outer.get("rpc.duration_us").unwrap().parse().unwrap();
        assert!(
            queued <= total,
            "queued {queued} µs within the call's {total} µs"
        );
    }
    assert_eq!(outer.get("rpc.queued_us"), None);
}

/// A failed call has its status on both spans; the client's is an error
/// (`otel.status_code` ERROR) whatever the code, the server's only for the codes that
/// are its own fault (OpenTelemetry's gRPC conventions): a `NOT_FOUND` answer is the
/// server working, an `UNAVAILABLE` one is not.
#[tokio::test]
async fn a_failed_call_has_its_status_on_both_spans() {
    let (recorder, _guard) = install();
    let mut client = client(back()).await;
    for (method, code, number, message, server_error) in [
        (
            &MISSING,
            rpc_core::Code::NOT_FOUND,
            "5",
            "no such thing",
            None,
        ),
        (
            &FLAKY,
            rpc_core::Code::UNAVAILABLE,
            "14",
            "warming up",
            Some("ERROR"),
        ),
    ] {
        recorder.clear();
        let status = client
            .unary::<_, String>(Request::new("x".to_string()), method)
            .await
            .unwrap_err();
        assert_eq!(status.code(), code);

        let client_spans = recorder.named("rpc.client");
        let server_spans = recorder.named("rpc.server");
        assert_eq!((client_spans.len(), server_spans.len()), (1, 1));
        let (outer, inner) = (&client_spans[0], &server_spans[0]);
        for span in [outer, inner] {
            assert_eq!(
                span.get("rpc.status"),
                Some(code.name().unwrap()),
                "{span:#?}"
            );
            assert_eq!(span.get("rpc.grpc.status_code"), Some(number), "{span:#?}");
            assert_eq!(span.get("error.message"), Some(message), "{span:#?}");
        }
        assert_eq!(outer.get("otel.status_code"), Some("ERROR"), "{outer:#?}");
        assert_eq!(inner.get("otel.status_code"), server_error, "{inner:#?}");
        assert_eq!(inner.get("parent_span_id"), outer.get("span_id"));
    }
}

#[tokio::test]
async fn a_retried_call_is_one_span_per_attempt() {
    let (recorder, _guard) = install();
    let channel = Channel::builder().connect(back()).await.unwrap();
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        ..RetryPolicy::default()
    };
    let traced = ClientTraceLayer::for_channel(&channel).layer(channel);
    let mut client = Client::new(RetryLayer::new(policy).layer(traced));
    recorder.clear();

    let reply = client
        .unary::<_, String>(Request::new("again".to_string()), &FLAKY)
        .await
        .unwrap();
    assert_eq!(reply.get_ref(), "again");

    let clients = recorder.named("rpc.client");
    let servers = recorder.named("rpc.server");
    assert_eq!(clients.len(), 2, "{clients:#?}");
    assert_eq!(servers.len(), 2, "{servers:#?}");
    assert_eq!(clients[0].get("rpc.attempt"), Some("1"));
    assert_eq!(clients[0].get("rpc.status"), Some("UNAVAILABLE"));
    assert_eq!(clients[1].get("rpc.attempt"), Some("2"));
    assert_eq!(clients[1].get("rpc.status"), Some("OK"));
    assert_eq!(servers[0].get("rpc.status"), Some("UNAVAILABLE"));
    assert_eq!(servers[1].get("rpc.status"), Some("OK"));
    for (client, server) in clients.iter().zip(&servers) {
        assert_eq!(server.get("parent_span_id"), client.get("span_id"));
        assert_eq!(server.get("trace_id"), client.get("trace_id"));
    }
    // The transport and the server's address come from the channel's target.
    assert!(clients[0].get("rpc.transport").is_some(), "{clients:#?}");
}

#[tokio::test]
async fn a_streaming_call_spans_its_whole_stream() {
    let (recorder, _guard) = install();
    let mut client = client(back()).await;
    recorder.clear();

    let (_, mut messages) = client
        .server_streaming::<_, String>(Request::new("go".to_string()), &COUNT)
        .await
        .unwrap()
        .into_parts();
    assert_eq!(messages.message().await.unwrap().as_deref(), Some("one"));
    // Replied, with a message read, but not ended: no status on either span yet.
    let spans = || -> Vec<SpanRecord> {
        let mut spans = recorder.named("rpc.client");
        spans.extend(recorder.named("rpc.server"));
        spans
    };
    assert_eq!(spans().len(), 2, "{:#?}", spans());
    for span in spans() {
        assert_eq!(span.get("rpc.status"), None, "{span:#?}");
        assert_eq!(span.get("rpc.duration_us"), None, "{span:#?}");
    }

    count_gate().notify_one();
    let status = messages.message().await.unwrap_err();
    assert_eq!(status.code(), rpc_core::Code::ABORTED);
    // The status the stream ended with, on both spans (the server's recorded before
    // its answer left, so it is there once the client has read it).
    for span in spans() {
        assert_eq!(span.get("rpc.status"), Some("ABORTED"), "{span:#?}");
        assert_eq!(span.get("error.message"), Some("midway"), "{span:#?}");
        assert!(span.get("rpc.duration_us").is_some(), "{span:#?}");
    }
}
