//! The `rpc` binary end to end, over every transport: TCP, Unix sockets, UDP, RDMA
//! (the soft provider), TLS and gRPC's HTTP/2 wire, against a server like the example servers (reflection
//! on): list, describe, a unary call, each streaming kind, metadata both ways, a failing
//! call's exit code, health, and a bench of a few thousand calls checked through its
//! JSON output.

mod common;

use std::sync::atomic::Ordering;

use common::{rpc, rpc_with_stdin, socket, start, start_mtls, tls_file};

const ECHO: &str = "rpc.examples.v1.Echo";

/// Every subcommand over `uri`, with `extra` (TLS options) on each command line.
async fn exercise(uri: &str, extra: &[&str]) {
    let with = |args: &[&str]| -> Vec<String> {
        args.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        rpc(&args).await
    };

    // list: the services, then one service's methods.
    let services = run(with(&["list", uri])).await;
    services.expect_code(0);
    for name in [ECHO, "grpc.testing.TestService", "grpc.health.v1.Health"] {
        assert!(
            services.stdout.lines().any(|l| l == name),
            "{name}: {services:?}"
        );
    }
    let methods = run(with(&["list", uri, ECHO])).await;
    methods.expect_code(0);
    assert!(
        methods.stdout.contains("rpc.examples.v1.Echo/Chat"),
        "{methods:?}"
    );

    // describe: .proto text with the comments of the .proto file.
    let service = run(with(&["describe", uri, ECHO])).await;
    service.expect_code(0);
    assert!(service.stdout.contains("service Echo {"), "{service:?}");
    assert!(
        service.stdout.contains("// Returns the message unchanged."),
        "{service:?}"
    );
    assert!(
        service
            .stdout
            .contains("rpc Sum(stream .rpc.examples.v1.SumRequest)"),
        "{service:?}"
    );
    let message = run(with(&["describe", uri, "rpc.examples.v1.SayRequest"])).await;
    message.expect_code(0);
    assert!(message.stdout.contains("bytes payload = 2;"), "{message:?}");
    let method = run(with(&["describe", uri, "rpc.examples.v1.Echo/Count"])).await;
    assert!(
        method
            .stdout
            .contains("returns (stream .rpc.examples.v1.CountReply)"),
        "{method:?}"
    );

    // A unary call; the request in .proto names, the response in lowerCamelCase.
    let say = run(with(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "hi", "payload": "AAEC"}"#,
    ]))
    .await;
    say.expect_code(0);
    assert_eq!(
        say.json(),
        serde_json::json!({"message": "hi", "payload": "AAEC"})
    );
    let sleep = run(with(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Sleep",
        "-d",
        r#"{"delay_ms": 1}"#,
        "--compact",
    ]))
    .await;
    assert_eq!(sleep.expect_code(0).stdout, "{\"sleptMs\":1}\n");

    // Server streaming: one JSON line per message.
    let count = run(with(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Count",
        "-d",
        r#"{"count": 3}"#,
    ]))
    .await;
    count.expect_code(0);
    assert_eq!(
        count.json_lines(),
        [
            serde_json::json!({"n": 1}),
            serde_json::json!({"n": 2}),
            serde_json::json!({"n": 3})
        ]
    );

    // Client streaming from standard input: JSON lines and concatenated values.
    let args = with(&["call", uri, "rpc.examples.v1.Echo/Sum", "-d", "@-"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let sum = rpc_with_stdin(
        &args,
        "{\"value\": 1}\n{\"value\": \"2\"} {\"value\": 39}\n",
    )
    .await;
    sum.expect_code(0);
    assert_eq!(sum.json(), serde_json::json!({"total": "42", "count": 3}));

    // Bidirectional streaming.
    let args = with(&["call", uri, "rpc.examples.v1.Echo/Chat", "-d", "@-"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let chat = rpc_with_stdin(&args, "{\"message\": \"a\"}\n{\"message\": \"b\"}\n").await;
    chat.expect_code(0);
    assert_eq!(
        chat.json_lines(),
        [
            serde_json::json!({"message": "re: a"}),
            serde_json::json!({"message": "re: b"})
        ]
    );

    // Metadata both ways: the interop service echoes these two keys back, the first
    // in the response headers, the second (binary) in the trailers.
    let echo_metadata = [
        "-v",
        "-H",
        "x-grpc-test-echo-initial: hello there",
        "-H",
        "x-grpc-test-echo-trailing-bin: AAEC/w==",
    ];
    let mut unary = with(&[
        "call",
        uri,
        "grpc.testing.TestService/UnaryCall",
        "-d",
        "{}",
    ]);
    unary.extend(echo_metadata.iter().map(|s| s.to_string()));
    let unary = run(unary).await;
    unary.expect_code(0);
    assert!(
        unary
            .stderr
            .contains("x-grpc-test-echo-initial: hello there"),
        "{unary:?}"
    );
    assert!(
        unary
            .stderr
            .contains("x-grpc-test-echo-trailing-bin: AAEC/w=="),
        "{unary:?}"
    );
    let mut duplex = with(&[
        "call",
        uri,
        "grpc.testing.TestService/FullDuplexCall",
        "-d",
        r#"{"responseParameters": [{"size": 3}]}"#,
    ]);
    duplex.extend(echo_metadata.iter().map(|s| s.to_string()));
    let duplex = run(duplex).await;
    duplex.expect_code(0);
    assert!(
        duplex
            .stderr
            .contains("header: x-grpc-test-echo-initial: hello there"),
        "{duplex:?}"
    );
    assert!(
        duplex
            .stderr
            .contains("trailer: x-grpc-test-echo-trailing-bin: AAEC/w=="),
        "{duplex:?}"
    );
    assert_eq!(duplex.json_lines()[0]["payload"]["body"], "AAAA");

    // A failing call: its status on stderr, 64 + its code as the exit code.
    let fail = run(with(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Fail",
        "-d",
        r#"{"code": 5, "message": "no such key"}"#,
    ]))
    .await;
    fail.expect_code(64 + 5);
    assert!(
        fail.stderr.contains("NOT_FOUND (5): no such key"),
        "{fail:?}"
    );
    // What the server says is text, not terminal controls or lines of the CLI's own.
    let spoof = run(with(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Fail",
        "-d",
        r#"{"code": 5, "message": "\u001b[2J\rgone\nerror: OK (0): fake"}"#,
    ]))
    .await;
    spoof.expect_code(64 + 5);
    assert_eq!(
        spoof.stderr.trim_end(),
        r"error: NOT_FOUND (5): \u{1b}[2J\rgone\nerror: OK (0): fake",
        "{spoof:?}"
    );

    // Health: 0 only when SERVING.
    assert_eq!(
        run(with(&["health", uri])).await.expect_code(0).stdout,
        "SERVING\n"
    );
    assert_eq!(
        run(with(&["health", uri, ECHO]))
            .await
            .expect_code(0)
            .stdout,
        "SERVING\n"
    );
    let down = run(with(&["health", uri, "rpc.examples.v1.Down"])).await;
    assert_eq!(down.expect_code(4).stdout, "NOT_SERVING\n");
    run(with(&["health", uri, "no.Such"]))
        .await
        .expect_code(64 + 5);

    // A bench of a few thousand calls, counted in its JSON output.
    let bench = run(with(&[
        "bench",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "load"}"#,
        "-n",
        "3000",
        "-c",
        "16",
        "--connections",
        "2",
        "--warmup",
        "100",
        "--format",
        "json",
    ]))
    .await;
    let report = bench.expect_code(0).json();
    assert_eq!(report["calls"], 3000, "{report}");
    assert_eq!(report["ok"], 3000, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(
        report["status"],
        serde_json::json!({"OK": 3000}),
        "{report}"
    );
    let binned: u64 = report["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bin| bin["count"].as_u64().unwrap())
        .sum();
    assert_eq!(binned, 3000, "{report}");
    let latency = &report["latency_ms"];
    assert!(
        latency["p50"].as_f64().unwrap() <= latency["p99.9"].as_f64().unwrap(),
        "{report}"
    );
    assert!(
        latency["min"].as_f64().unwrap() <= latency["max"].as_f64().unwrap(),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_over_tcp() {
    let server = start("tcp://127.0.0.1:0", true).await;
    exercise(&server.uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_over_a_unix_socket() {
    let server = start(&format!("unix://{}", socket("e2e")), true).await;
    exercise(&server.uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_over_udp() {
    let server = start("udp://127.0.0.1:0", true).await;
    exercise(&server.uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_over_rdma() {
    let server = start("rdma://127.0.0.1:0", true).await;
    exercise(&server.uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_over_tls() {
    let server = start("tls://127.0.0.1:0", true).await;
    let ca = tls_file("ca.pem");
    exercise(&server.uri, &["--ca", &ca]).await;
    // The server name checked can differ from the URI's host.
    let by_name = server.uri.replace("127.0.0.1", "localhost");
    rpc(&["health", &by_name, "--ca", &ca]).await.expect_code(0);
    // Without the CA, the handshake fails: unreachable, and saying why.
    let untrusted = rpc(&["health", &server.uri]).await;
    untrusted.expect_code(64 + 14);
    assert!(untrusted.stderr.contains("TLS"), "{untrusted:?}");
    // ... naming the URI once and the reason once (both came twice).
    assert_eq!(
        untrusted.stderr.matches(&server.uri).count(),
        1,
        "{untrusted:?}"
    );
    assert_eq!(
        untrusted.stderr.matches("nknown").count(),
        1,
        "{untrusted:?}"
    );
    // --insecure takes the certificate unchecked, under any name; beside --ca, which
    // it would leave unused, it is refused (from a review: it won silently).
    rpc(&["health", &server.uri, "--insecure"])
        .await
        .expect_code(0);
    rpc(&["health", &server.uri, "--insecure", "--ca", "ca.pem"])
        .await
        .expect_code(2);
    rpc(&[
        "health",
        &by_name,
        "--insecure",
        "--server-name",
        "elsewhere.example",
    ])
    .await
    .expect_code(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_name_balances_over_its_replicas() {
    let (a, b) = (
        start("tcp://127.0.0.1:0", true).await,
        start("tcp://127.0.0.1:0", true).await,
    );
    let name = format!("static://{},{}", a.uri, b.uri);
    let say = rpc(&[
        "call",
        &name,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "x"}"#,
    ])
    .await;
    assert_eq!(say.expect_code(0).json()["message"], "x");
    let bench = rpc(&[
        "bench",
        &name,
        "rpc.examples.v1.Echo/Say",
        "-n",
        "500",
        "--format",
        "json",
    ])
    .await;
    assert_eq!(bench.expect_code(0).json()["ok"], 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_over_grpc_http2() {
    let server = start("grpc://127.0.0.1:0", true).await;
    exercise(&server.uri, &[]).await;
}

/// `--authority` is gRPC's `:authority` (the transport's tests check what is sent):
/// calls go through with it, over grpcs:// it is the name the certificate must carry
/// unless `--server-name` says another, and it is refused (exit 1, before connecting)
/// on the framework's own wires and when it is no URI authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authority_of_grpc_calls() {
    let ca = tls_file("ca.pem");
    let say = |uri: &str, extra: &[&str]| {
        let mut args = vec![
            "call".to_owned(),
            uri.to_owned(),
            "rpc.examples.v1.Echo/Say".to_owned(),
            "-d".to_owned(),
            r#"{"message": "a"}"#.to_owned(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            rpc(&args).await
        }
    };
    let plain = start("grpc://127.0.0.1:0", true).await;
    let ok = say(&plain.uri, &["--authority", "api.example.com:443"]).await;
    assert_eq!(ok.expect_code(0).json()["message"], "a");
    // ghz's --insecure (plain text) on a plain-text gRPC URI is taken.
    let insecure = say(&plain.uri, &["--insecure"]).await;
    assert_eq!(insecure.expect_code(0).json()["message"], "a");
    for bad in [
        "user@api.example.com",
        "api.example.com/v1",
        "two words",
        "",
    ] {
        let refused = say(&plain.uri, &["--authority", bad]).await;
        refused.expect_code(1);
        assert!(
            refused.stderr.contains("not a URI authority"),
            "{refused:?}"
        );
    }
    let tcp = start("tcp://127.0.0.1:0", true).await;
    let refused = say(&tcp.uri, &["--authority", "api.example.com"]).await;
    refused.expect_code(1);
    assert!(refused.stderr.contains("not a gRPC URI"), "{refused:?}");

    // The test certificate names localhost and 127.0.0.1, not elsewhere.example.
    let secure = start("grpcs://127.0.0.1:0", true).await;
    let named = say(&secure.uri, &["--ca", &ca, "--authority", "localhost:443"]).await;
    assert_eq!(named.expect_code(0).json()["message"], "a");
    let elsewhere = say(
        &secure.uri,
        &["--ca", &ca, "--authority", "elsewhere.example"],
    )
    .await;
    elsewhere.expect_code(64 + 14);
    assert!(
        elsewhere.stderr.contains("elsewhere.example"),
        "{elsewhere:?}"
    );
    let server_name = [
        "--ca",
        &ca,
        "--authority",
        "elsewhere.example",
        "--server-name",
        "localhost",
    ];
    let overridden = say(&secure.uri, &server_name).await;
    assert_eq!(overridden.expect_code(0).json()["message"], "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_for_mutual_tls() {
    let server = start_mtls().await;
    let (ca, cert, key) = (
        tls_file("ca.pem"),
        tls_file("client.pem"),
        tls_file("client.key"),
    );
    let uri = server.uri.as_str();
    let with_certificate = ["--ca", &ca, "--cert", &cert, "--key", &key];
    let mut args = vec![
        "call",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "m"}"#,
    ];
    args.extend(with_certificate);
    assert_eq!(rpc(&args).await.expect_code(0).json()["message"], "m");
    // Without one, the server refuses the connection.
    let refused = rpc(&["call", uri, "rpc.examples.v1.Echo/Say", "--ca", &ca]).await;
    assert_eq!(refused.code, 64 + 14, "{refused:?}");
    // It says why, and does not blame reflection, whose call met the refusal first.
    assert!(refused.stderr.contains("client certificate"), "{refused:?}");
    assert!(!refused.stderr.contains("reflection"), "{refused:?}");
    // --cert without --key is a usage error.
    rpc(&["health", uri, "--ca", &ca, "--cert", &cert])
        .await
        .expect_code(2);
}

/// `call --retries`: a call of `KeyValue/Increment` (not safe to repeat) whose answer a
/// proxy loses, the connection cut, each time on the first connection through a new
/// proxy. Without `--retries` it fails with `UNAVAILABLE` and may have run (it did);
/// with `--retries` alone it is not repeated either (its outcome is unknown and the
/// method has side effects); with `--at-most-once` it is repeated on a new connection
/// with a call key, and the server answers the repeat from its duplicate cache: it ran
/// once. `-v` tells the failed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_run_a_call_with_side_effects_at_most_once() {
    use fault_proxy::{TcpFaults, TcpProxy};

    let server = start("tcp://127.0.0.1:0", false).await;
    let upstream = server.uri.trim_start_matches("tcp://").parse().unwrap();
    let proto = common::repo()
        .join("proto/proto/rpc/examples/v1/kv.proto")
        .display()
        .to_string();
    let increment = |uri: String, delta: i64, extra: &'static [&'static str]| {
        let proto = proto.clone();
        async move {
            let data = format!(r#"{{"key": "visits", "delta": {delta}}}"#);
            let mut args = vec![
                "call",
                &uri,
                "rpc.examples.v1.KeyValue/Increment",
                "-d",
                &data,
                "--proto",
                &proto,
            ];
            args.extend_from_slice(extra);
            rpc(&args).await
        }
    };
    // What the server holds, asked directly.
    let visits = || async {
        let run = increment(server.uri.clone(), 0, &[]).await;
        run.expect_code(0);
        run.json()["value"].as_str().unwrap_or("0").to_owned()
    };
    let lossy = || async {
        let faults = TcpFaults {
            cut_before_response: true,
            faulty_connections: Some(1),
            ..TcpFaults::default()
        };
        TcpProxy::start(upstream, faults).await.unwrap()
    };

    let proxy = lossy().await;
    let run = increment(format!("tcp://{}", proxy.addr()), 1, &[]).await;
    run.expect_code(78);
    assert!(run.stderr.contains("[the call may have run]"), "{run:?}");
    assert_eq!(visits().await, "1", "the lost call ran");

    let proxy = lossy().await;
    let run = increment(format!("tcp://{}", proxy.addr()), 1, &["--retries", "3"]).await;
    run.expect_code(78);
    assert_eq!(visits().await, "2", "not repeated without --at-most-once");
    assert_eq!(proxy.counters().connections.load(Ordering::Relaxed), 1);

    let proxy = lossy().await;
    let run = increment(
        format!("tcp://{}", proxy.addr()),
        1,
        &["--retries", "3", "--at-most-once", "-v"],
    )
    .await;
    run.expect_code(0);
    assert_eq!(run.json()["value"], "3", "{run:?}");
    assert!(
        run.stderr.contains("attempt 1 failed: UNAVAILABLE"),
        "{run:?}"
    );
    assert_eq!(
        visits().await,
        "3",
        "the repeat was answered, not run again"
    );
    assert_eq!(proxy.counters().connections.load(Ordering::Relaxed), 2);
    let cache = server.handle.dedupe_stats().expect("a duplicate cache");
    assert_eq!(cache.hits.load(Ordering::Relaxed), 1, "{cache:?}");
}

/// `--retries` on a method the `.proto` marks safe to repeat retries it on a
/// `--retry-on` code: `grpc.testing.TestService/UnaryCall` asked to fail with
/// `RESOURCE_EXHAUSTED` fails after 1 + 2 attempts (each told with `-v`), and with
/// `UNAVAILABLE`, not named, after one; `--idempotent` makes any method safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_a_failing_code_follow_retry_on() {
    let server = start("tcp://127.0.0.1:0", true).await;
    // UnaryCall asked to fail with `code`, under --retries 2 -v and `options`.
    let failing = |code: u32, options: &'static [&'static str]| {
        let uri = server.uri.clone();
        async move {
            let data = format!(r#"{{"responseStatus": {{"code": {code}, "message": "no"}}}}"#);
            let mut args = vec![
                "call",
                &uri,
                "grpc.testing.TestService/UnaryCall",
                "-d",
                &data,
                "--retries",
                "2",
                "-v",
            ];
            args.extend_from_slice(options);
            rpc(&args).await
        }
    };
    let run = failing(8, &["--retry-on", "resource_exhausted,14", "--idempotent"]).await;
    run.expect_code(64 + 8);
    for attempt in 1..=3 {
        assert!(
            run.stderr
                .contains(&format!("attempt {attempt} failed: RESOURCE_EXHAUSTED: no")),
            "{run:?}"
        );
    }
    assert!(!run.stderr.contains("attempt 4"), "{run:?}");

    // A code not named: one attempt.
    let run = failing(9, &["--retry-on", "RESOURCE_EXHAUSTED", "--idempotent"]).await;
    run.expect_code(64 + 9);
    assert!(run.stderr.contains("attempt 1 failed"), "{run:?}");
    assert!(!run.stderr.contains("attempt 2"), "{run:?}");

    // Not marked safe in the .proto, and no --idempotent: one attempt.
    let run = failing(8, &["--retry-on", "RESOURCE_EXHAUSTED"]).await;
    run.expect_code(64 + 8);
    assert!(!run.stderr.contains("attempt 2"), "{run:?}");

    // A code that is not one, and options that need --retries.
    let run = rpc(&[
        "call",
        &server.uri,
        "x/y",
        "--retries",
        "1",
        "--retry-on",
        "SOMETIMES",
    ])
    .await;
    run.expect_code(2);
    assert!(run.stderr.contains("is not a status code"), "{run:?}");
    let run = rpc(&["call", &server.uri, "x/y", "--at-most-once"]).await;
    run.expect_code(2);
}
