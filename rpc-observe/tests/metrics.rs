//! The metrics layers read back through `metrics-util`'s `DebuggingRecorder`: calls by
//! status, latency histograms and in-flight gauges on both sides, for calls that
//! succeed, fail, are retried, cancelled, or run out of their deadline; and the
//! server's own counters.
//!
//! One test function: the recorder is process-wide, and each scenario uses methods of
//! its own so that their counts do not mix.

use std::{
    cell::RefCell,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::{Future, StreamExt};
use metrics::{SharedString, Unit};
use metrics_util::{
    debugging::{DebugValue, DebuggingRecorder, Snapshotter},
    CompositeKey, MetricKind,
};
use rpc_core::{
    client::{Channel, Client},
    link::mem,
    method::{Idempotency, MethodDescriptor},
    retry::{RetryLayer, RetryPolicy},
    server::{Server, ServerCall, ServerReply},
    stream::{ReplyStream, TakeOnce},
    Code, Payload, Request, Status,
};
use rpc_observe::metrics::{self as m, ClientMetrics, ClientMetricsLayer, ServerMetricsLayer};
use rpc_proto::echo::{echo_server::EchoServer, EchoService};
use tower::Layer;

const fn method(name: &'static str, path: &'static str) -> MethodDescriptor {
    MethodDescriptor {
        service: "demo.M",
        method: name,
        path,
        idempotency: Idempotency::NoSideEffects,
    }
}

static OK: MethodDescriptor = method("Ok", "demo.M/Ok");
static FAIL: MethodDescriptor = method("Fail", "demo.M/Fail");
static FLAKY: MethodDescriptor = method("Flaky", "demo.M/Flaky");
static HANG: MethodDescriptor = method("Hang", "demo.M/Hang");
static SLOW: MethodDescriptor = method("Slow", "demo.M/Slow");
static STREAM: MethodDescriptor = method("Stream", "demo.M/Stream");
static STREAM_FAIL: MethodDescriptor = method("StreamFail", "demo.M/StreamFail");
static STREAM_HANG: MethodDescriptor = method("StreamHang", "demo.M/StreamHang");

/// A response stream: `one`, then what `rest` gives.
fn one_then(rest: impl Future<Output = Result<Payload, Status>> + Send + 'static) -> ServerReply {
    let first = futures::stream::once(async { Ok(rpc_core::payload::encode(&"one".to_string())) });
    let messages: ReplyStream = first.chain(futures::stream::once(rest)).boxed();
    ServerReply {
        stream: Some(TakeOnce::new(messages)),
        ..ServerReply::default()
    }
}

/// `Ok` echoes, `Fail` is NOT_FOUND, `Flaky` is UNAVAILABLE the first time, `Hang`
/// and `Slow` never answer (`Hang` says when it started). The streams send `one`, then
/// `Stream` sends `two` once `gate` opens and ends, `StreamFail` fails `ABORTED`, and
/// `StreamHang` never ends.
fn serve(
    started: tokio::sync::mpsc::UnboundedSender<()>,
    gate: Arc<tokio::sync::Notify>,
) -> (Server, mem::MemConnector) {
    let (listener, connector) = mem::listener();
    let failed_once = Arc::new(AtomicBool::new(false));
    let service = tower::service_fn(move |call: ServerCall| {
        let failed_once = failed_once.clone();
        let started = started.clone();
        let gate = gate.clone();
        async move {
            match call.method.as_str() {
                "demo.M/Stream" => Ok(one_then(async move {
                    gate.notified().await;
                    Ok(rpc_core::payload::encode(&"two".to_string()))
                })),
                "demo.M/StreamFail" => Ok(one_then(async { Err(Status::aborted("midway")) })),
                "demo.M/StreamHang" => Ok(one_then(std::future::pending())),
                "demo.M/Fail" => Err(Status::not_found("no")),
                "demo.M/Flaky" if !failed_once.swap(true, Ordering::Relaxed) => {
                    Err(Status::unavailable("warming up"))
                }
                "demo.M/Hang" | "demo.M/Slow" => {
                    let _ = started.send(());
                    std::future::pending().await
                }
                _ => Ok(ServerReply {
                    payload: call.payload.into(),
                    ..ServerReply::default()
                }),
            }
        }
    });
    let server = Server::builder()
        .layer(ServerMetricsLayer::new())
        .add_named_service("demo.M", service)
        .build();
    let serving = server.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    (server, connector)
}

/// One metric in a snapshot: key, unit, help text, value.
type Entry = (CompositeKey, Option<Unit>, Option<SharedString>, DebugValue);

/// What the recorder holds, accumulated over snapshots: a snapshot resets counters and
/// gauges to zero and drains histograms, so the values seen are added up.
struct Seen {
    snapshotter: Snapshotter,
    values: RefCell<Vec<Entry>>,
}

impl Seen {
    fn refresh(&self) {
        let mut values = self.values.borrow_mut();
        for (key, unit, help, value) in self.snapshotter.snapshot().into_vec() {
            match values.iter_mut().find(|(known, ..)| *known == key) {
                Some(entry) => match (&mut entry.3, value) {
                    (DebugValue::Histogram(old), DebugValue::Histogram(new)) => old.extend(new),
                    (DebugValue::Counter(old), DebugValue::Counter(new)) => *old += new,
                    (DebugValue::Gauge(old), DebugValue::Gauge(new)) => *old += new,
                    (old, new) => *old = new,
                },
                None => values.push((key, unit, help, value)),
            }
        }
    }

    /// The value of one metric with these labels (`None`: never registered).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<DebugValue> {
        self.refresh();
        self.values
            .borrow()
            .iter()
            .find(|(key, ..)| {
                let key = key.key();
                key.name() == name
                    && key.labels().count() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
            })
            .map(|(_, _, _, value)| match value {
                DebugValue::Counter(n) => DebugValue::Counter(*n),
                DebugValue::Gauge(n) => DebugValue::Gauge(*n),
                DebugValue::Histogram(values) => DebugValue::Histogram(values.clone()),
            })
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.value(name, labels) {
            Some(DebugValue::Counter(n)) => n,
            None => 0,
            other => panic!("{name} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.value(name, labels) {
            Some(DebugValue::Gauge(n)) => n.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        }
    }

    fn histogram_count(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        match self.value(name, labels) {
            Some(DebugValue::Histogram(values)) => values.len(),
            None => 0,
            other => panic!("{name} is not a histogram: {other:?}"),
        }
    }
}

/// Waits (yielding to the server's tasks) until `check` holds; the test's own timeout
/// is the limit.
/// Two messages of 700 KiB to a handler that keeps what it reads, on a server whose
/// budget of large requests is 1 MiB: the second is refused, `RESOURCE_EXHAUSTED`.
async fn refused_stream_message_counts_its_status(s: &Seen) {
    static HOARD: MethodDescriptor = method("Hoard", "demo.M/Hoard");
    let hoard = tower::service_fn(|call: ServerCall| async move {
        let mut messages = call
            .stream
            .and_then(|s| s.take())
            .expect("a request stream");
        let mut held = Vec::new();
        while let Some(message) = messages.next().await {
            held.push(message?);
        }
        Ok::<_, Status>(ServerReply::default())
    });
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .max_frame_len(1 << 20)
        .max_large_request_bytes(1 << 20)
        .layer(ServerMetricsLayer::new())
        .add_named_service("demo.M", hoard)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut client = Client::new(Channel::builder().connect(connector).await.unwrap());
    let big = "x".repeat(700 << 10);
    let messages = futures::stream::iter([big.clone(), big]);
    let status = client
        .client_streaming::<_, String, String>(Request::new(messages), &HOARD)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::RESOURCE_EXHAUSTED, "{status:?}");
    let refused = [("method", "demo.M/Hoard"), ("code", "RESOURCE_EXHAUSTED")];
    let cancelled = [("method", "demo.M/Hoard"), ("code", "CANCELLED")];
    let counted =
        || s.counter(m::SERVER_CALLS, &refused) + s.counter(m::SERVER_CALLS, &cancelled) == 1;
    tokio::time::timeout(Duration::from_secs(10), eventually(counted))
        .await
        .expect("the server counts the call");
    assert_eq!(s.counter(m::SERVER_CALLS, &refused), 1);
    assert_eq!(s.counter(m::SERVER_CALLS, &cancelled), 0);
}

async fn eventually(mut check: impl FnMut() -> bool) {
    while !check() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn counters_histograms_and_gauges_move_with_the_calls() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    m::describe();

    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Notify::new());
    let (server, connector) = serve(started_tx, gate.clone());
    let channel = Channel::builder().connect(connector).await.unwrap();
    let mut client: Client<ClientMetrics<Channel>> =
        Client::new(ClientMetricsLayer::new().layer(channel.clone()));
    let s = &Seen {
        snapshotter,
        values: RefCell::default(),
    };

    // OK, three times.
    for _ in 0..3 {
        client
            .unary::<_, String>(Request::new("hi".to_string()), &OK)
            .await
            .unwrap();
    }
    let ok = [("method", "demo.M/Ok"), ("code", "OK")];
    eventually(|| s.counter(m::SERVER_CALLS, &ok) == 3).await;
    assert_eq!(s.counter(m::CLIENT_CALLS, &ok), 3);
    let by_method = [("method", "demo.M/Ok")];
    assert_eq!(s.histogram_count(m::CLIENT_DURATION, &by_method), 3);
    assert_eq!(s.histogram_count(m::SERVER_DURATION, &by_method), 3);
    assert_eq!(s.gauge(m::CLIENT_IN_FLIGHT, &by_method), 0.0);
    assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &by_method), 0.0);

    // Failed.
    let status = client
        .unary::<_, String>(Request::new("x".to_string()), &FAIL)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NOT_FOUND);
    let not_found = [("method", "demo.M/Fail"), ("code", "NOT_FOUND")];
    eventually(|| s.counter(m::SERVER_CALLS, &not_found) == 1).await;
    assert_eq!(s.counter(m::CLIENT_CALLS, &not_found), 1);
    assert_eq!(
        s.counter(
            m::CLIENT_CALLS,
            &[("method", "demo.M/Fail"), ("code", "OK")]
        ),
        0
    );

    // Retried: under the retry layer, each attempt counts, and the second is a retry.
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        ..RetryPolicy::default()
    };
    let mut retrying = Client::new(
        RetryLayer::new(policy).layer(ClientMetricsLayer::new().layer(channel.clone())),
    );
    retrying
        .unary::<_, String>(Request::new("again".to_string()), &FLAKY)
        .await
        .unwrap();
    let flaky = |code| [("method", "demo.M/Flaky"), ("code", code)];
    eventually(|| s.counter(m::SERVER_CALLS, &flaky("OK")) == 1).await;
    assert_eq!(s.counter(m::SERVER_CALLS, &flaky("UNAVAILABLE")), 1);
    assert_eq!(s.counter(m::CLIENT_CALLS, &flaky("UNAVAILABLE")), 1);
    assert_eq!(s.counter(m::CLIENT_CALLS, &flaky("OK")), 1);
    assert_eq!(
        s.counter(m::CLIENT_RETRIES, &[("method", "demo.M/Flaky")]),
        1
    );

    // Cancelled: the caller drops the call while the handler runs; the server drops
    // the handler when the CANCEL arrives.
    let hang = [("method", "demo.M/Hang")];
    {
        let mut call_client = client.clone();
        let call = tokio::spawn(async move {
            call_client
                .unary::<_, String>(Request::new("x".to_string()), &HANG)
                .await
        });
        started.recv().await.unwrap();
        assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &hang), 1.0);
        assert_eq!(s.gauge(m::CLIENT_IN_FLIGHT, &hang), 1.0);
        call.abort();
        let _ = call.await;
    }
    let cancelled = [("method", "demo.M/Hang"), ("code", "CANCELLED")];
    assert_eq!(s.counter(m::CLIENT_CALLS, &cancelled), 1);
    eventually(|| s.counter(m::SERVER_CALLS, &cancelled) == 1).await;
    assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &hang), 0.0);
    assert_eq!(s.gauge(m::CLIENT_IN_FLIGHT, &hang), 0.0);

    // Deadline exceeded: the client gives up, and the server drops the handler at the
    // same deadline.
    let status = client
        .unary::<_, String>(
            Request::new("x".to_string()).with_timeout(Duration::from_millis(50)),
            &SLOW,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED);
    let expired = [("method", "demo.M/Slow"), ("code", "DEADLINE_EXCEEDED")];
    assert_eq!(s.counter(m::CLIENT_CALLS, &expired), 1);
    eventually(|| s.counter(m::SERVER_CALLS, &expired) == 1).await;
    assert_eq!(
        s.counter(
            m::SERVER_CALLS,
            &[("method", "demo.M/Slow"), ("code", "CANCELLED")]
        ),
        0
    );

    // A streaming call ends with its response stream, not with its first reply: in
    // flight, and not counted, until its last message has been read.
    let stream = [("method", "demo.M/Stream")];
    let (_, mut messages) = client
        .server_streaming::<_, String>(Request::new("go".to_string()), &STREAM)
        .await
        .unwrap()
        .into_parts();
    assert_eq!(messages.message().await.unwrap().as_deref(), Some("one"));
    assert_eq!(s.gauge(m::CLIENT_IN_FLIGHT, &stream), 1.0);
    assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &stream), 1.0);
    assert_eq!(s.histogram_count(m::SERVER_DURATION, &stream), 0);
    gate.notify_one();
    assert_eq!(messages.message().await.unwrap().as_deref(), Some("two"));
    assert_eq!(messages.message().await.unwrap(), None);
    let stream_ok = [("method", "demo.M/Stream"), ("code", "OK")];
    assert_eq!(s.counter(m::CLIENT_CALLS, &stream_ok), 1);
    assert_eq!(s.gauge(m::CLIENT_IN_FLIGHT, &stream), 0.0);
    eventually(|| s.counter(m::SERVER_CALLS, &stream_ok) == 1).await;
    assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &stream), 0.0);
    assert_eq!(s.histogram_count(m::CLIENT_DURATION, &stream), 1);
    assert_eq!(s.histogram_count(m::SERVER_DURATION, &stream), 1);

    // A stream that fails midway counts with the status it ends with.
    let (_, mut messages) = client
        .server_streaming::<_, String>(Request::new("go".to_string()), &STREAM_FAIL)
        .await
        .unwrap()
        .into_parts();
    assert_eq!(messages.message().await.unwrap().as_deref(), Some("one"));
    assert_eq!(messages.message().await.unwrap_err().code(), Code::ABORTED);
    let aborted = [("method", "demo.M/StreamFail"), ("code", "ABORTED")];
    assert_eq!(s.counter(m::CLIENT_CALLS, &aborted), 1);
    eventually(|| s.counter(m::SERVER_CALLS, &aborted) == 1).await;
    for side in [m::CLIENT_CALLS, m::SERVER_CALLS] {
        assert_eq!(
            s.counter(side, &[("method", "demo.M/StreamFail"), ("code", "OK")]),
            0,
            "{side}"
        );
    }

    // A stream the caller drops before its end is cancelled, on both sides.
    let hang = [("method", "demo.M/StreamHang")];
    let (_, mut messages) = client
        .server_streaming::<_, String>(Request::new("go".to_string()), &STREAM_HANG)
        .await
        .unwrap()
        .into_parts();
    assert_eq!(messages.message().await.unwrap().as_deref(), Some("one"));
    assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &hang), 1.0);
    drop(messages);
    let stream_cancelled = [("method", "demo.M/StreamHang"), ("code", "CANCELLED")];
    assert_eq!(s.counter(m::CLIENT_CALLS, &stream_cancelled), 1);
    assert_eq!(s.gauge(m::CLIENT_IN_FLIGHT, &hang), 0.0);
    eventually(|| s.counter(m::SERVER_CALLS, &stream_cancelled) == 1).await;
    assert_eq!(s.gauge(m::SERVER_IN_FLIGHT, &hang), 0.0);

    // A request stream whose message the server refuses (over its budget of large
    // requests) counts with the status the client got, not as CANCELLED: the server
    // stops the handler with that cause (`rpc_core::server::stop_cause`).
    refused_stream_message_counts_its_status(s).await;

    // The server's own counters.
    m::record_server_stats(&server);
    assert_eq!(s.gauge(m::SERVER_CONNECTIONS, &[]), 1.0);
    assert_eq!(s.counter(m::SERVER_CONNECTIONS_OPENED, &[]), 1);
    let totals = server.stats();
    assert!(totals.requests >= 3, "{totals:?}");
    assert_eq!(s.counter(m::SERVER_REQUESTS, &[]), totals.requests);
    for (name, value) in [
        (m::SERVER_RECEIVED_BYTES, totals.bytes_received),
        (m::SERVER_SENT_BYTES, totals.bytes_sent),
        (m::SERVER_RECEIVED_FRAMES, totals.frames_received),
        (m::SERVER_SENT_FRAMES, totals.frames_sent),
    ] {
        assert!(value > 0, "{name}: {totals:?}");
        assert_eq!(s.counter(name, &[]), value, "{name}");
    }
    for (reason, value) in [
        ("limit", totals.refused_at_limit),
        ("protocol", totals.refused_for_errors),
    ] {
        let by_reason = [("reason", reason)];
        assert_eq!(s.counter(m::SERVER_REFUSED_CONNECTIONS, &by_reason), value);
    }

    // Ejections, as a `Balanced` client's hook reports them.
    let replica: rpc_core::Endpoint = "tcp://10.0.0.5:7000".parse().unwrap();
    m::count_ejection(&replica);
    m::count_ejection(&replica);
    let by_replica = [("replica", "tcp://10.0.0.5:7000")];
    assert_eq!(s.counter(m::CLIENT_EJECTIONS, &by_replica), 2);

    // A generated service lists its methods: the server refuses a name it does not
    // have before the layer, so a peer's made-up names never become labels.
    static SAY: MethodDescriptor = MethodDescriptor {
        service: "rpc.examples.v1.Echo",
        method: "Say",
        path: "rpc.examples.v1.Echo/Say",
        idempotency: Idempotency::NoSideEffects,
    };
    static MADE_UP: MethodDescriptor = MethodDescriptor {
        service: "rpc.examples.v1.Echo",
        method: "MadeUp",
        path: "rpc.examples.v1.Echo/MadeUp",
        idempotency: Idempotency::NoSideEffects,
    };
    let (listener, connector) = mem::listener();
    let echo_server = Server::builder()
        .layer(ServerMetricsLayer::new())
        .add_service(EchoServer::new(EchoService))
        .build();
    tokio::spawn(async move { echo_server.serve(listener).await });
    let mut echo = Client::new(Channel::builder().connect(connector).await.unwrap());
    for _ in 0..3 {
        let status = echo
            .unary::<_, String>(Request::new("hi".to_string()), &MADE_UP)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::UNIMPLEMENTED);
        assert_eq!(
            status.message(),
            "unknown method rpc.examples.v1.Echo/MadeUp"
        );
    }
    let reply = echo
        .unary::<_, String>(Request::new("hi".to_string()), &SAY)
        .await
        .unwrap();
    assert_eq!(reply.into_inner(), "hi");
    let say = [("method", "rpc.examples.v1.Echo/Say"), ("code", "OK")];
    eventually(|| s.counter(m::SERVER_CALLS, &say) == 1).await;
    s.refresh();
    let made_up: Vec<_> = s
        .values
        .borrow()
        .iter()
        .filter(|(key, ..)| key.key().labels().any(|l| l.value().contains("MadeUp")))
        .map(|(key, ..)| format!("{key:?}"))
        .collect();
    assert_eq!(made_up, Vec::<String>::new());

    // Every metric has its help text.
    s.refresh();
    let described = s.values.borrow();
    for (key, unit, help, _) in described.iter() {
        if key.key().name().starts_with("rpc_") {
            assert!(help.is_some(), "{key:?} has no description");
            assert!(unit.is_some(), "{key:?} has no unit");
        }
    }
    assert!(described
        .iter()
        .any(|(key, _, _, _)| key.kind() == MetricKind::Histogram));
}
