//! The board with injected time (counts, percentiles, the window rolling over, the
//! method bound), the pages' escaping and structure, and the layer in a real server
//! over the in-memory transport.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use rpc_core::{
    client::{Channel, Client},
    link::mem,
    method::{Idempotency, MethodDescriptor},
    server::{ConnectionInfo, Server, ServerCall, ServerReply},
    Code, Peer, Request, Status,
};

use super::{render::render_json_at, *};

/// Records a call of `method` that ended `at` seconds after the board's start.
fn record(board: &StatusBoard, method: &str, at: u64, code: Code, handler_us: u64) {
    let entry = board.method(method);
    board.ended(
        &entry,
        board.inner.epoch + Duration::from_millis(at * 1_000 + 500),
        Ended {
            peer: Some(Arc::new(Peer::new("tcp://10.0.0.1:5000"))),
            code,
            message: (code != Code::OK).then(|| "nope".into()),
            started: SystemTime::now(),
            queued: Some(Duration::from_micros(7)),
            handler: Duration::from_micros(handler_us),
            request_bytes: 3,
            response_bytes: (code == Code::OK).then_some(5),
            streamed: false,
        },
    );
}

fn at(board: &StatusBoard, second: u64) -> Instant {
    board.inner.epoch + Duration::from_secs(second)
}

#[test]
fn counts_and_percentiles_per_method() {
    let board = StatusBoard::new();
    for _ in 0..99 {
        record(&board, "a.S/Get", 3, Code::OK, 200);
    }
    record(&board, "a.S/Get", 3, Code::NOT_FOUND, 80_000);
    record(&board, "a.S/Put", 4, Code::OK, 10);

    let methods = board.methods_at(at(&board, 5));
    let names: Vec<&str> = methods.iter().map(|m| &*m.method).collect();
    assert_eq!(names, ["a.S/Get", "a.S/Put"]);
    let get = &methods[0];
    assert_eq!(get.calls()[WINDOW_SECS - 2], 100);
    assert_eq!(get.errors()[WINDOW_SECS - 2], 1);
    assert_eq!(get.totals(), (100, 1));
    let (calls, errors, p50, p99) = get.last_minute();
    assert_eq!((calls, errors), (100, 1));
    let p50 = p50.unwrap().as_micros();
    let p99 = p99.unwrap().as_micros();
    assert!((160..=250).contains(&p50), "p50 {p50} µs");
    assert!(
        (160..=250).contains(&p99),
        "p99 of 99 fast and 1 slow {p99} µs"
    );
    assert_eq!(get.rate(), 10.0, "100 calls in the last ten seconds");
    assert_eq!(
        get.p99().nth(WINDOW_SECS - 2).flatten(),
        get.last_minute().3
    );
    assert_eq!(get.p50().filter(Option::is_some).count(), 1);
}

#[test]
fn the_window_rolls_over() {
    let board = StatusBoard::new();
    record(&board, "a.S/Get", 1, Code::OK, 100);
    let methods = board.methods_at(at(&board, 2));
    assert_eq!(methods[0].calls().iter().sum::<u32>(), 1);
    // Five minutes later the second has left the window; the totals remember it.
    let methods = board.methods_at(at(&board, 2 + WINDOW_SECS as u64));
    assert_eq!(methods[0].calls().iter().sum::<u32>(), 0);
    assert_eq!(methods[0].last_minute().0, 0);
    assert_eq!(methods[0].totals(), (1, 0));
    assert_eq!(methods[0].rate(), 0.0);
}

#[test]
fn methods_past_the_bound_share_one_entry() {
    let board = StatusBoard::new();
    for i in 0..MAX_METHODS + 10 {
        record(&board, &format!("a.S/M{i}"), 1, Code::UNIMPLEMENTED, 1);
    }
    let methods = board.methods_at(at(&board, 2));
    assert_eq!(methods.len(), MAX_METHODS + 1);
    let other = methods
        .iter()
        .find(|m| &*m.method == OTHER_METHODS)
        .unwrap();
    assert_eq!(other.totals(), (10, 10));
    // A method with an entry keeps it.
    record(&board, "a.S/M0", 1, Code::OK, 1);
    let m0 = board.methods_at(at(&board, 2));
    assert_eq!(
        m0.iter()
            .find(|m| &*m.method == "a.S/M0")
            .unwrap()
            .totals()
            .0,
        2
    );
}

#[test]
fn rpcz_lists_slowest_first_and_filters() {
    let board = StatusBoard::new();
    record(&board, "a.S/Get", 1, Code::OK, 100);
    record(&board, "a.S/Get", 1, Code::NOT_FOUND, 3_000);
    record(&board, "a.S/Put", 1, Code::OK, 900);
    let methods = |query: &str| -> Vec<(String, Code)> {
        board
            .calls(&RpczFilter::from_query(query))
            .iter()
            .map(|c| (c.method.to_string(), c.code))
            .collect()
    };
    assert_eq!(
        methods(""),
        [
            ("a.S/Get".into(), Code::NOT_FOUND),
            ("a.S/Put".into(), Code::OK),
            ("a.S/Get".into(), Code::OK)
        ]
    );
    assert_eq!(methods("method=a.S%2FPut"), [("a.S/Put".into(), Code::OK)]);
    assert_eq!(methods("status=NOT_FOUND").len(), 1);
    assert_eq!(
        methods("status=OK&min_ms=0.5"),
        [("a.S/Put".into(), Code::OK)]
    );

    let page = render_rpcz(&board, &RpczFilter::from_query("status=NOT_FOUND"));
    assert!(
        page.contains("data-method=\"a.S/Get\" data-status=\"NOT_FOUND\""),
        "{page}"
    );
    assert!(!page.contains("data-status=\"OK\""), "{page}");
    assert!(
        page.contains("<option value=\"NOT_FOUND\" selected>"),
        "{page}"
    );
    assert!(page.contains("tcp://10.0.0.1:5000"));
    assert!(page.contains(">nope<"), "the status message");
}

#[test]
fn peer_strings_are_escaped_everywhere() {
    let board = StatusBoard::new();
    let evil = "a.S/<script>alert(\"x\")</script>&'";
    let entry = board.method(evil);
    board.ended(
        &entry,
        Instant::now(),
        Ended {
            peer: Some(Arc::new(Peer::new("tcp://<img src=x>"))),
            code: Code::INTERNAL,
            message: Some("<b>boom</b>".into()),
            started: SystemTime::now(),
            queued: None,
            handler: Duration::from_millis(1),
            request_bytes: 0,
            response_bytes: None,
            streamed: false,
        },
    );
    let info = ServerInfo {
        listeners: vec!["tcp://<x>".into()],
        config: vec![("name".into(), "<i>n</i>".into())],
        ..ServerInfo::new("<srv>", "1\"")
    };
    let connection = ConnectionInfo {
        peer: Arc::new(Peer::new("tcp://<img src=y>")),
        opened: SystemTime::now(),
        age: Duration::from_secs(3),
        in_flight: 1,
        requests: 2,
        bytes_received: 30,
        bytes_sent: 40,
        frames_received: 2,
        frames_sent: 2,
    };
    let pages = [
        render_index(&board, &info),
        render_rpcz(
            &board,
            &RpczFilter::from_query("method=%3Cscript%3E&status=%3Cb%3E"),
        ),
        render_connections(&[connection]),
    ];
    for page in &pages {
        for raw in [
            "<script>alert",
            "<img",
            "<b>boom",
            "<i>n",
            "<srv>",
            "<x>",
            "<b>\"",
        ] {
            assert!(!page.contains(raw), "{raw:?} unescaped in\n{page}");
        }
    }
    assert!(pages[0].contains("a.S/&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"));
    assert!(pages[1].contains("&lt;b&gt;boom&lt;/b&gt;"));
    assert!(
        pages[2].contains("data-wire=\"tcp\" data-bytes-received=\"30\" data-bytes-sent=\"40\"")
    );
    // The JSON escapes HTML's characters too.
    let json = render_json(&board, &info);
    assert!(
        !json.contains('<') && json.contains("\\u003cscript\\u003e"),
        "{json}"
    );
}

#[test]
fn the_index_has_a_chart_per_method_and_metric() {
    let board = StatusBoard::new();
    for second in 1..=10 {
        for _ in 0..second {
            record(&board, "a.S/Get", second, Code::OK, 1_000);
        }
    }
    let info = ServerInfo::new("srv", "0.1.0");
    let page = render_index(&board, &info);
    for metric in ["calls", "errors", "p50", "p99"] {
        assert!(
            page.contains(&format!(
                "<svg data-method=\"a.S/Get\" data-metric=\"{metric}\""
            )),
            "{metric}: {page}"
        );
    }
    // The template for methods seen later, and the script that polls.
    assert!(
        page.contains("<template id=\"method-row\"><section class=\"method\" data-method=\"\">")
    );
    assert!(page.contains("fetch(\"status.json\""));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no external resource"
    );

    // Seconds 1 to 10, read at 11: one point per second of the window, and the
    // calls/s of the last ten seconds.
    let json = render_json_at(&board, &info, at(&board, 11));
    assert!(json.contains("\"method\":\"a.S/Get\""), "{json}");
    assert!(json.contains("\"rate\":5.5,"), "{json}");
    let calls = json
        .split("\"calls\":[")
        .nth(1)
        .unwrap()
        .split(']')
        .next()
        .unwrap();
    let calls: Vec<&str> = calls.split(',').collect();
    assert_eq!(calls.len(), WINDOW_SECS);
    assert_eq!(calls[0], "null", "no point before the board started");
    assert_eq!(calls[WINDOW_SECS - 11], "0", "second 0: started, no call");
    assert_eq!(
        calls[WINDOW_SECS - 10..],
        ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10"]
    );
    assert!(json.contains("\"error_pct\":["));
}

#[test]
fn times_and_durations_read_well() {
    use super::render::{human, utc};
    assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00.000Z");
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_203_752_123);
    assert_eq!(utc(t), "2026-11-20 19:42:32.123Z");
    assert_eq!(
        utc(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400)),
        "2000-02-29 00:00:00.000Z"
    );
    assert_eq!(human(Duration::from_micros(850)), "850 µs");
    assert_eq!(human(Duration::from_micros(1_250)), "1.25 ms");
    assert_eq!(human(Duration::from_secs(200)), "3 min 20 s");
}

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
static HANG: MethodDescriptor = method("Hang", "demo.M/Hang");
static STREAM: MethodDescriptor = method("Stream", "demo.M/Stream");

#[tokio::test]
async fn the_layer_records_calls_failures_and_deadlines() {
    use futures::StreamExt;

    let (listener, connector) = mem::listener();
    // `Stream` sends one message, then fails once `gate` opens.
    let gate = Arc::new(tokio::sync::Notify::new());
    let opens = gate.clone();
    let service = tower::service_fn(move |call: ServerCall| {
        let opens = opens.clone();
        async move {
            match call.method.as_str() {
                "demo.M/Stream" => {
                    let one = rpc_core::payload::encode(&"one".to_string());
                    let messages: rpc_core::stream::ReplyStream = futures::stream::iter([Ok(one)])
                        .chain(futures::stream::once(async move {
                            opens.notified().await;
                            Err(Status::aborted("midway"))
                        }))
                        .boxed();
                    Ok(ServerReply {
                        stream: Some(rpc_core::stream::TakeOnce::new(messages)),
                        ..ServerReply::default()
                    })
                }
                "demo.M/Fail" => Err(Status::not_found("no such thing")),
                "demo.M/Hang" => std::future::pending().await,
                _ => Ok(ServerReply {
                    payload: call.payload.into(),
                    ..ServerReply::default()
                }),
            }
        }
    });
    let board = StatusBoard::new();
    let server = Server::builder()
        .layer(board.layer())
        .add_named_service("demo.M", service)
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let mut client = Client::new(channel);

    for _ in 0..3 {
        client
            .unary::<_, String>(Request::new("hello".to_string()), &OK)
            .await
            .unwrap();
    }
    let status = client
        .unary::<_, String>(Request::new("x".to_string()), &FAIL)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NOT_FOUND);
    let status = client
        .unary::<_, String>(
            Request::new("x".to_string()).with_timeout(Duration::from_millis(50)),
            &HANG,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED);

    // The server drops the handler at its deadline, maybe after the client gave up.
    let deadline = RpczFilter::from_query("status=DEADLINE_EXCEEDED");
    while board.calls(&deadline).is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ok = board.calls(&RpczFilter::from_query("method=demo.M/Ok"));
    assert_eq!(ok.len(), 3);
    for call in &ok {
        assert_eq!(call.code, Code::OK);
        assert!(call.request_bytes > 0);
        assert_eq!(call.response_bytes, Some(call.request_bytes));
        assert!(call.peer.is_some());
    }
    let failed = board.calls(&RpczFilter::from_query("status=ERROR"));
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0].method.as_ref(), "demo.M/Hang", "slowest first");
    assert_eq!(failed[1].message.as_deref(), Some("no such thing"));
    let names = board.method_names();
    assert_eq!(names.len(), 3);
    let hang = board
        .methods()
        .into_iter()
        .find(|m| &*m.method == "demo.M/Hang")
        .unwrap();
    assert_eq!((hang.totals(), hang.in_flight), ((1, 1), 0));

    // A streaming call is in flight until its stream ends, and ends with the status
    // the stream ends with.
    let stream = |board: &StatusBoard| {
        board
            .methods()
            .into_iter()
            .find(|m| &*m.method == "demo.M/Stream")
            .unwrap()
    };
    let (_, mut messages) = client
        .server_streaming::<_, String>(Request::new("go".to_string()), &STREAM)
        .await
        .unwrap()
        .into_parts();
    assert_eq!(messages.message().await.unwrap().as_deref(), Some("one"));
    assert_eq!(
        (stream(&board).totals(), stream(&board).in_flight),
        ((0, 0), 1)
    );
    let of_stream = RpczFilter::from_query("method=demo.M/Stream");
    assert!(board.calls(&of_stream).is_empty());
    gate.notify_one();
    assert_eq!(messages.message().await.unwrap_err().code(), Code::ABORTED);
    let calls = board.calls(&of_stream);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].code, Code::ABORTED);
    assert_eq!(calls[0].message.as_deref(), Some("midway"));
    assert_eq!(calls[0].response_bytes, None);
    assert_eq!(
        (stream(&board).totals(), stream(&board).in_flight),
        ((1, 1), 0)
    );
}

/// What a query or the connection table makes the pages hold is bounded: at most a few
/// problems of a query (then a count), each cut short, and at most 1,000 connection
/// rows (then a count); `%` and two characters that are not both hex digits stay as
/// they are.
#[test]
fn pages_stay_bounded_whatever_the_query_or_the_connections() {
    let query = "a=1&".repeat(10_000) + &format!("status={}", "x".repeat(60_000));
    let filter = RpczFilter::from_query(&query);
    assert!(
        filter.problems.len() <= 9,
        "{} problems",
        filter.problems.len()
    );
    assert_eq!(filter.problems.last().unwrap(), "and 9993 more");
    assert!(filter.problems.iter().all(|p| p.chars().count() <= 161));
    let connections: Vec<ConnectionInfo> = (0..3000)
        .map(|i| ConnectionInfo {
            peer: Arc::new(Peer::new(format!("tcp://10.0.0.1:{i}"))),
            opened: SystemTime::now(),
            age: Duration::from_secs(3),
            in_flight: 0,
            requests: 0,
            bytes_received: 0,
            bytes_sent: 0,
            frames_received: 0,
            frames_sent: 0,
        })
        .collect();
    let page = render_connections(&connections);
    assert_eq!(page.matches("<tr class=\"connection\"").count(), 1000);
    assert!(page.contains("data-count=\"3000\"") && page.contains("and 2000 more"));
    assert_eq!(super::rpcz::percent_decode("%+A%2x%41"), "% A%2xA");
}
