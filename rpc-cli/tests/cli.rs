//! The `rpc` binary's schemas from files, its error messages and exit codes, its
//! reports, and its help: against a server with reflection off (the `--proto` path) and
//! one with it on.

mod common;

use common::{closed_port, repo, rpc, rpc_with_stdin, start};

/// A directory of the test's own (`rpc-cli-NAME-PID`) with `typo.proto`, which does not
/// compile (`strin` at 3:3): the directory, and the file's path.
fn typo_proto(name: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("rpc-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let typo = dir.join("typo.proto");
    std::fs::write(
        &typo,
        "syntax = \"proto3\";\nmessage A {\n  strin x = 1;\n}\n",
    )
    .unwrap();
    (dir, typo.display().to_string())
}

fn echo_proto() -> (String, String) {
    let dir = repo().join("proto/proto");
    (
        dir.join("rpc/examples/v1/echo.proto").display().to_string(),
        dir.display().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proto_files_stand_in_for_reflection() {
    let server = start("tcp://127.0.0.1:0", false).await;
    let uri = server.uri.as_str();

    // Without reflection and without --proto, the error says what to do.
    let list = rpc(&["list", uri]).await;
    list.expect_code(1);
    assert!(
        list.stderr.contains("does not serve reflection"),
        "{list:?}"
    );
    assert!(list.stderr.contains("--proto"), "{list:?}");
    let call = rpc(&["call", uri, "rpc.examples.v1.Echo/Say"]).await;
    call.expect_code(1);
    assert!(call.stderr.contains("--proto"), "{call:?}");

    let (proto, include) = echo_proto();
    let files = ["--proto", proto.as_str(), "--import-path", include.as_str()];
    let run = |args: &[&str]| {
        let args: Vec<String> = args
            .iter()
            .chain(files.iter())
            .map(|s| s.to_string())
            .collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            rpc(&args).await
        }
    };
    let list = run(&["list", uri]).await;
    // The services of the files given.
    assert_eq!(list.expect_code(0).stdout, "rpc.examples.v1.Echo\n");
    let describe = run(&["describe", uri, "rpc.examples.v1.Echo.Sleep"]).await;
    assert!(
        describe
            .expect_code(0)
            .stdout
            .contains("// Waits `delay_ms` before answering"),
        "{describe:?}"
    );
    let say = run(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "files"}"#,
    ])
    .await;
    assert_eq!(say.expect_code(0).json()["message"], "files");
    let count = run(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Count",
        "-d",
        r#"{"count": 2}"#,
    ])
    .await;
    assert_eq!(count.expect_code(0).json_lines().len(), 2);

    // The import path defaults to the file's directory.
    let dir = repo().join("proto/proto/rpc/examples/v1");
    let kv = dir.join("kv.proto").display().to_string();
    let get = rpc(&[
        "call",
        uri,
        "rpc.examples.v1.KeyValue/Get",
        "--proto",
        &kv,
        "-d",
        r#"{"key": "absent"}"#,
    ])
    .await;
    get.expect_code(64 + 5);

    // list and describe read the files alone: no server needed (as grpcurl's).
    let nobody = format!("tcp://127.0.0.1:{}", closed_port());
    let offline = run(&["list", &nobody]).await;
    assert_eq!(offline.expect_code(0).stdout, "rpc.examples.v1.Echo\n");
    let offline = run(&["describe", &nobody, "rpc.examples.v1.SayRequest"]).await;
    assert!(
        offline.expect_code(0).stdout.contains("message SayRequest"),
        "{offline:?}"
    );

    // A name the files lack is blamed on the files, not on the server.
    let missing = run(&["call", uri, "rpc.examples.v1.Nope/Say"]).await;
    missing.expect_code(1);
    assert!(missing.stderr.contains("schema files"), "{missing:?}");
    assert!(!missing.stderr.contains(uri), "{missing:?}");

    // A server that cannot be reached: 78, and the call is known not to have run.
    let unreached = run(&["call", &nobody, "rpc.examples.v1.Echo/Say", "-d", "{}"]).await;
    unreached.expect_code(64 + 14);
    assert!(
        unreached.stderr.contains("[not run: safe to try again]"),
        "{unreached:?}"
    );
}

/// Mistakes found by using the tool as a new user would (a review): each gets an error
/// that says what is wrong, with the exit code the docs give (2 for a bad command line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_mistakes_get_clear_errors() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let uri = server.uri.as_str();
    let say = "rpc.examples.v1.Echo/Say";
    // Bench settings that cannot run: refused by the command line (--threads 5000
    // panicked in the runtime, then hung; the others printed reports of zeros or
    // exited 1).
    for (flag, value) in [
        ("--threads", "5000"),
        ("--rps", "0"),
        ("--rps", "NaN"),
        ("-n", "0"),
        ("-z", "0s"),
        // Past what an end instant can hold (it panicked, exit 101).
        ("-z", "3000000000000000h"),
    ] {
        let bench = rpc(&["bench", uri, say, flag, value]).await;
        bench.expect_code(2);
        assert!(bench.stderr.contains(value), "{flag} {value}: {bench:?}");
    }
    // Trailing junk after the request is not "more than one value".
    let junk = rpc(&["call", uri, say, "-d", r#"{"message":"hi"},"#]).await;
    junk.expect_code(1);
    assert!(junk.stderr.contains("after the request"), "{junk:?}");
    assert!(!junk.stderr.contains("more than one"), "{junk:?}");
    // A directory, named; a file that starts with a byte-order mark is read.
    let dir = std::env::temp_dir().join(format!("rpc-cli-mistakes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = format!("@{}", dir.display());
    let directory = rpc(&["call", uri, say, "-d", &data]).await;
    directory.expect_code(1);
    assert!(
        directory.stderr.contains("directory") && directory.stderr.contains(&data),
        "{directory:?}"
    );
    let bom = dir.join("bom.json");
    std::fs::write(&bom, b"\xef\xbb\xbf{\"message\": \"marked\"}").unwrap();
    let data = format!("@{}", bom.display());
    let marked = rpc(&["call", uri, say, "-d", &data]).await;
    assert_eq!(marked.expect_code(0).json()["message"], "marked");
    // A response's C1 control and bidirectional override print as JSON escapes, never
    // as terminal controls, pretty or compact (they were written raw).
    for compact in [false, true] {
        let mut args = vec!["call", uri, say, "-d", r#"{"message":"a\u009b2Jb\u202ec"}"#];
        if compact {
            args.push("--compact");
        }
        let echoed = rpc(&args).await;
        let out = echoed.expect_code(0);
        assert!(
            !out.stdout.contains('\u{9b}') && !out.stdout.contains('\u{202e}'),
            "{out:?}"
        );
        assert!(
            out.stdout.contains("\\u009b") && out.stdout.contains("\\u202e"),
            "{out:?}"
        );
        assert_eq!(out.json()["message"], "a\u{9b}2Jb\u{202e}c");
    }
    // A stream whose input holds a bad request after good ones: the answers to the
    // good ones (which the server ran) are shown, then the bad one reported (the
    // error cut them off when the input was read at once).
    let chat = rpc_with_stdin(
        &["call", uri, "rpc.examples.v1.Echo/Chat", "-d", "@-"],
        "{\"message\":\"one\"}\r\n{\"message\":\"two\"}\r\n{\"value\":1}\r\n",
    )
    .await;
    chat.expect_code(1);
    assert!(chat.stderr.contains("request 3"), "{chat:?}");
    let replies: Vec<_> = chat
        .json_lines()
        .into_iter()
        .map(|reply| reply["message"].clone())
        .collect();
    assert_eq!(replies, ["re: one", "re: two"], "{chat:?}");
    // A TLS server that never answers the handshake: the connect takes the whole
    // --timeout and ends DEADLINE_EXCEEDED (a fixed 5 s ended it UNAVAILABLE, exit
    // 78, whatever --timeout said).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_at = format!("tls://{}", silent.local_addr().unwrap());
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let slow = rpc(&["call", &silent_at, say, "--insecure", "--timeout", "6s"]).await;
    slow.expect_code(64 + 4);
    // etcd's options for a URI that is no etcd:// name: refused, saying so.
    let etcd = rpc(&["list", uri, "--etcd-ca", "ca.pem"]).await;
    etcd.expect_code(1);
    assert!(
        etcd.stderr.contains("not an etcd:// service name"),
        "{etcd:?}"
    );
    // etcd itself out of reach: the message names etcd, not the replicas' transport.
    let no_etcd = rpc(&["list", "etcd://127.0.0.1:1/kv", "--timeout", "5s"]).await;
    no_etcd.expect_code(64 + 14);
    assert!(
        no_etcd
            .stderr
            .contains("cannot list the replicas of etcd://127.0.0.1:1/kv in etcd"),
        "{no_etcd:?}"
    );
    // etcd reached but answering nothing (stopped): the time went to etcd, and the
    // message says so, not the replicas' transport.
    let stalled = format!("etcd://{}/kv", silent_at.trim_start_matches("tls://"));
    let stalled_etcd = rpc(&["list", &stalled, "--timeout", "2s"]).await;
    stalled_etcd.expect_code(64 + 4);
    assert!(
        stalled_etcd.stderr.contains("in etcd within the --timeout")
            && !stalled_etcd.stderr.contains("registered"),
        "{stalled_etcd:?}"
    );
    // A message named without its package: the server's own is suggested (the
    // well-known types were, as reflection had not fetched the services' files).
    let describe = rpc(&["describe", uri, "SayRequest"]).await;
    describe.expect_code(1);
    assert!(
        describe.stderr.contains("rpc.examples.v1.SayRequest"),
        "{describe:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_to_do() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let uri = server.uri.as_str();

    // A DNS name that does not resolve: said at once, naming it (not a wait for
    // replicas that cannot come); UNAVAILABLE, not run, as tcp:// with the name.
    let unresolved = rpc(&["list", "dns://nonexistent.invalid:7000"]).await;
    unresolved.expect_code(78);
    assert!(
        unresolved
            .stderr
            .contains("the name \"nonexistent.invalid\" does not resolve")
            && unresolved.stderr.contains("[not run"),
        "{unresolved:?}"
    );

    // A .proto that does not compile: file, line and column; a missing one: said so.
    let (dir, typo) = typo_proto("typo");
    let bad_proto = rpc(&["describe", uri, "A", "--proto", &typo]).await;
    bad_proto.expect_code(1);
    assert!(
        bad_proto
            .stderr
            .contains("typo.proto:3:3: name 'strin' is not defined"),
        "{bad_proto:?}"
    );
    let missing = dir.join("missing.proto").display().to_string();
    let no_file = rpc(&["describe", uri, "A", "--proto", &missing]).await;
    no_file.expect_code(1);
    assert!(no_file.stderr.contains("no such file"), "{no_file:?}");
    let _ = std::fs::remove_dir_all(&dir);

    // TLS options on a plain-text URI: refused, not ignored.
    let plain = rpc(&["list", uri, "--server-name", "app.example"]).await;
    plain.expect_code(1);
    assert!(
        plain.stderr.contains("plain text") && plain.stderr.contains("tls://"),
        "{plain:?}"
    );
    let insecure = rpc(&["list", uri, "--insecure"]).await;
    insecure.expect_code(1);
    assert!(insecure.stderr.contains("plain"), "{insecure:?}");

    // An unknown method: the closest names.
    let typo = rpc(&["call", uri, "rpc.examples.v1.Echo/Sai"]).await;
    typo.expect_code(1);
    assert!(
        typo.stderr
            .contains("did you mean rpc.examples.v1.Echo/Say"),
        "{typo:?}"
    );
    let no_package = rpc(&["call", uri, "Echo/Count"]).await;
    no_package.expect_code(1);
    assert!(
        no_package
            .stderr
            .contains("did you mean rpc.examples.v1.Echo/Count"),
        "{no_package:?}"
    );
    // A service named without a method: said so, with its methods (it was read as a
    // method `Echo` of a service `rpc.examples.v1`, which does not exist).
    let service_only = rpc(&["call", uri, "rpc.examples.v1.Echo"]).await;
    service_only.expect_code(1);
    assert!(
        service_only
            .stderr
            .contains("rpc.examples.v1.Echo is a service, not a method")
            && service_only.stderr.contains("rpc.examples.v1.Echo/Say"),
        "{service_only:?}"
    );
    let no_symbol = rpc(&["describe", uri, "rpc.examples.v1.SayRequets"]).await;
    no_symbol.expect_code(1);
    assert!(
        no_symbol.stderr.contains("rpc.examples.v1.SayRequest"),
        "{no_symbol:?}"
    );

    // JSON that does not fit: the field path and the type expected.
    let wrong_type = rpc(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": 5}"#,
    ])
    .await;
    wrong_type.expect_code(1);
    assert!(
        wrong_type
            .stderr
            .contains("at `message` (a field of type string)"),
        "{wrong_type:?}"
    );
    let nested = rpc(&[
        "call",
        uri,
        "grpc.testing.TestService/UnaryCall",
        "-d",
        r#"{"payload": {"body": 7}}"#,
    ])
    .await;
    nested.expect_code(1);
    assert!(
        nested
            .stderr
            .contains("at `payload.body` (a field of type bytes)"),
        "{nested:?}"
    );
    let unknown = rpc(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"mesage": "x"}"#,
    ])
    .await;
    unknown.expect_code(1);
    assert!(unknown.stderr.contains("mesage"), "{unknown:?}");
    let not_json = rpc(&["call", uri, "rpc.examples.v1.Echo/Say", "-d", "{message"]).await;
    not_json.expect_code(1);
    assert!(not_json.stderr.contains("not JSON"), "{not_json:?}");
    let two = rpc(&["call", uri, "rpc.examples.v1.Echo/Say", "-d", "{} {}"]).await;
    two.expect_code(1);
    assert!(two.stderr.contains("more than one"), "{two:?}");

    // A bad value in a client stream cancels the call, naming which request it was:
    // the server does not answer for the requests before it as if they were the whole
    // input (the stream was half-closed, and the sum of the first value printed).
    let stream = rpc_with_stdin(
        &["call", uri, "rpc.examples.v1.Echo/Sum", "-d", "@-"],
        "{\"value\": 1}\n{\"value\": \"many\"}\n",
    )
    .await;
    stream.expect_code(1);
    assert!(stream.stderr.contains("request 2"), "{stream:?}");
    assert!(stream.stdout.trim().is_empty(), "an answer: {stream:?}");
    assert!(
        stream.stderr.contains("at `value` (a field of type int64)"),
        "{stream:?}"
    );

    // Unreachable addresses: which transport, what failed, exit 64 + UNAVAILABLE.
    let closed = format!("tcp://127.0.0.1:{}", closed_port());
    let refused = rpc(&["health", &closed]).await;
    refused.expect_code(64 + 14);
    assert!(refused.stderr.contains("over TCP"), "{refused:?}");
    assert!(refused.stderr.contains("refused"), "{refused:?}");
    let missing = rpc(&["list", "unix:///nonexistent/rpc-cli.sock"]).await;
    missing.expect_code(64 + 14);
    assert!(missing.stderr.contains("over a Unix socket"), "{missing:?}");
    let bad_scheme = rpc(&["list", "carrier-pigeon://coop"]).await;
    bad_scheme.expect_code(1);
    assert!(
        bad_scheme.stderr.contains("unknown scheme"),
        "{bad_scheme:?}"
    );

    // A peer that takes the connection and never answers (a TLS handshake that never
    // ends): connecting counts against --timeout, DEADLINE_EXCEEDED (68), not the
    // transport's own handshake timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_uri = format!("tls://{}", silent.local_addr().unwrap());
    let stalled = rpc(&["health", &silent_uri, "--timeout", "300ms"]).await;
    stalled.expect_code(64 + 4);
    assert!(
        stalled.stderr.contains("within the --timeout"),
        "{stalled:?}"
    );
    drop(silent);
    // `--timeout none`: no deadline at all.
    let unbounded = rpc(&[
        "call",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "x"}"#,
        "--timeout",
        "none",
    ])
    .await;
    unbounded.expect_code(0);

    // Bad metadata and a bad command line.
    let bad_header = rpc(&["health", uri, "-H", "x-bin: not base64!"]).await;
    bad_header.expect_code(1);
    assert!(bad_header.stderr.contains("base64"), "{bad_header:?}");
    rpc(&["call", uri]).await.expect_code(2);
}

/// `--proto` files, and the method named in them, are read before connecting, and so
/// is a `-d @FILE`: a file that does not compile, a method it does not have, or a
/// request file that cannot be read is exit 1 (the user's to fix) even when the server
/// cannot be reached, for `call` and `bench` alike. (They were
/// read after connecting: an unreachable server hid the typo behind exit 78.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proto_files_are_read_before_connecting() {
    let nobody = format!("tcp://127.0.0.1:{}", closed_port());
    let (proto, include) = echo_proto();
    let (dir, typo) = typo_proto("early");
    for command in ["call", "bench"] {
        let bad = rpc(&[command, &nobody, "p.S/M", "--proto", &typo]).await;
        bad.expect_code(1);
        assert!(bad.stderr.contains("typo.proto:3:3"), "{command}: {bad:?}");
        let unknown = rpc(&[
            command,
            &nobody,
            "rpc.examples.v1.Echo/Shout",
            "--proto",
            &proto,
            "--import-path",
            &include,
        ])
        .await;
        unknown.expect_code(1);
        assert!(unknown.stderr.contains("Shout"), "{command}: {unknown:?}");
        // A request file that cannot be read: the user's to fix too.
        let unreadable = rpc(&[
            command,
            &nobody,
            "rpc.examples.v1.Echo/Say",
            "-d",
            "@/nonexistent/request.json",
        ])
        .await;
        unreadable.expect_code(1);
        assert!(
            unreadable.stderr.contains("request.json"),
            "{command}: {unreadable:?}"
        );
        // A method the files have: on to connecting, which fails as it should.
        let known = rpc(&[
            command,
            &nobody,
            "rpc.examples.v1.Echo/Say",
            "--proto",
            &proto,
            "--import-path",
            &include,
        ])
        .await;
        known.expect_code(64 + 14);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bench call has a deadline when `--timeout` gives none (20 s): a server that
/// never answers ends a `-n` run, with its calls counted as `DEADLINE_EXCEEDED`,
/// instead of holding it for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_calls_have_a_deadline_by_default() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let bench = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        rpc(&[
            "bench",
            &server.uri,
            "rpc.examples.v1.Echo/Sleep",
            "-d",
            r#"{"delay_ms": 3600000}"#,
            "-n",
            "2",
            "-c",
            "2",
            "--format",
            "json",
        ]),
    )
    .await
    .expect("the bench run hung on calls that are never answered");
    let report = bench.expect_code(0).json();
    assert_eq!(report["calls"], 2, "{report}");
    assert_eq!(
        report["status"],
        serde_json::json!({"DEADLINE_EXCEEDED": 2}),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_counts_every_status_and_writes_reports() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let uri = server.uri.as_str();
    let dir = std::env::temp_dir().join(format!("rpc-cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let request = dir.join("fail.json");
    std::fs::write(&request, r#"{"code": 9, "message": "busy"}"#).unwrap();
    let html = dir.join("report.html");
    let data = format!("@{}", request.display());
    let bench = rpc(&[
        "bench",
        uri,
        "rpc.examples.v1.Echo/Fail",
        "-d",
        &data,
        "-n",
        "1000",
        "-c",
        "8",
        "--format",
        "json",
        "--html",
        &html.display().to_string(),
    ])
    .await;
    let report = bench.expect_code(0).json();
    assert_eq!(report["calls"], 1000);
    assert_eq!(report["ok"], 0);
    assert_eq!(report["errors"], 1000);
    assert_eq!(
        report["status"],
        serde_json::json!({"FAILED_PRECONDITION": 1000})
    );
    assert_eq!(report["error_messages"]["FAILED_PRECONDITION: busy"], 1000);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("FAILED_PRECONDITION"),
        "{page}"
    );
    assert!(
        !page.contains("<script") && !page.contains("<link"),
        "not self-contained"
    );

    // A timed run against calls that never end in time (a 60 s Sleep, no --timeout)
    // ends 5 s after its time with them counted DEADLINE_EXCEEDED: it waited for them
    // for ever (from a review).
    let started = std::time::Instant::now();
    let stalled = rpc(&[
        "bench",
        uri,
        "rpc.examples.v1.Echo/Sleep",
        "-d",
        r#"{"delay_ms": 60000}"#,
        "-z",
        "300ms",
        "-c",
        "2",
        "--format",
        "json",
    ])
    .await;
    let report = stalled.expect_code(0).json();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the run waited for its calls: {:?}",
        started.elapsed()
    );
    assert_eq!(
        report["status"],
        serde_json::json!({"DEADLINE_EXCEEDED": 2})
    );

    // Rate-limited, by duration, on one thread: the text report names the statuses.
    let text = rpc(&[
        "bench",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-z",
        "300ms",
        "--rps",
        "500",
        "-c",
        "4",
        "--threads",
        "1",
    ])
    .await;
    text.expect_code(0);
    // At most 500 calls/s for 0.3 s (give or take the last scheduled call).
    let calls: u64 = text
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("calls:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no call count: {text:?}"));
    assert!((1..=151).contains(&calls), "{calls} calls: {text:?}");
    assert!(text.stdout.contains("Latency distribution:"), "{text:?}");
    assert!(text.stdout.contains("p99.9"), "{text:?}");
    assert!(text.stdout.contains("OK"), "{text:?}");

    // A report path that cannot be written fails before the run (these calls would
    // take ten minutes; the test's guard would end a run that went ahead), and more
    // workers than calls are not made (a huge -c with a small -n had run out of
    // memory).
    let unwritable = rpc(&[
        "bench",
        uri,
        "rpc.examples.v1.Echo/Sleep",
        "-d",
        r#"{"delay_ms": 600000}"#,
        "-n",
        "2",
        "--timeout",
        "none",
        "--html",
        "/nonexistent-dir/report.html",
    ])
    .await;
    unwritable.expect_code(1);
    assert!(unwritable.stderr.contains("--html"), "{unwritable:?}");
    let few = rpc(&[
        "bench",
        uri,
        "rpc.examples.v1.Echo/Say",
        "-n",
        "3",
        "-c",
        "10000",
        "--connections",
        "10000",
        "--format",
        "json",
    ])
    .await;
    let report = few.expect_code(0).json();
    assert_eq!(report["calls"], 3);
    assert_eq!(report["concurrency"], 3, "{report}");
    assert_eq!(report["connections"], 3, "{report}");

    // Streaming methods are refused.
    let streaming = rpc(&["bench", uri, "rpc.examples.v1.Echo/Count"]).await;
    streaming.expect_code(1);
    assert!(streaming.stderr.contains("streaming"), "{streaming:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn every_subcommand_has_examples_and_completions_exist() {
    for subcommand in ["call", "list", "describe", "health", "bench", "completions"] {
        let help = rpc(&[subcommand, "--help"]).await;
        help.expect_code(0);
        assert!(help.stdout.contains("Examples:"), "{subcommand}: {help:?}");
        assert!(help.stdout.contains("rpc "), "{subcommand}: {help:?}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = rpc(&["completions", shell]).await;
        assert!(script.expect_code(0).stdout.contains("bench"), "{shell}");
    }
}

/// Serves `server` on a fresh TCP port of loopback: its URI, and the serving task.
async fn serve_on_tcp(
    server: &rpc_core::server::Server,
) -> (String, tokio::task::JoinHandle<Result<(), rpc_core::Error>>) {
    let (uri, serving) =
        rpc_connect::serve(server, "tcp://127.0.0.1:0", futures::future::pending())
            .await
            .unwrap();
    (uri, tokio::spawn(serving))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1alpha_alone_is_enough() {
    use rpc_core::server::{NamedService, Server};
    use rpc_proto::echo::{echo_server::EchoServer, EchoService};
    let reflection = rpc_services::reflection::Reflection::builder()
        .register_encoded_file_descriptor_set(
            <EchoServer<EchoService> as NamedService>::FILE_DESCRIPTOR_SET,
        )
        .unwrap()
        .service_name("rpc.examples.v1.Echo")
        .build();
    // An older server: only the pre-release version of reflection.
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(reflection.v1alpha())
        .build();
    let (uri, serving) = serve_on_tcp(&server).await;
    let list = rpc(&["list", &uri]).await;
    assert!(
        list.expect_code(0)
            .stdout
            .contains("rpc.examples.v1.Echo\n"),
        "{list:?}"
    );
    let say = rpc(&[
        "call",
        &uri,
        "rpc.examples.v1.Echo/Say",
        "-d",
        r#"{"message": "old"}"#,
    ])
    .await;
    assert_eq!(say.expect_code(0).json()["message"], "old");
    serving.abort();
}

/// A mistyped name is answered with the closest names even when another service the
/// server lists cannot be described (its file imports one the server does not give):
/// that service is left out of the search (the error was about it, not the typo).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typo_is_suggested_past_a_service_whose_descriptors_are_broken() {
    use prost_types::{FileDescriptorProto, FileDescriptorSet, ServiceDescriptorProto};
    use rpc_core::server::{NamedService, Server};
    use rpc_proto::echo::{echo_server::EchoServer, EchoService};
    let broken = FileDescriptorProto {
        name: Some("aaa_other.proto".into()),
        package: Some("aaa".into()),
        dependency: vec!["gone.proto".into()],
        service: vec![ServiceDescriptorProto {
            name: Some("Svc".into()),
            ..Default::default()
        }],
        syntax: Some("proto3".into()),
        ..Default::default()
    };
    let reflection = rpc_services::reflection::Reflection::builder()
        .register_encoded_file_descriptor_set(
            <EchoServer<EchoService> as NamedService>::FILE_DESCRIPTOR_SET,
        )
        .unwrap()
        .register_file_descriptor_set(FileDescriptorSet { file: vec![broken] })
        .service_name("aaa.Svc")
        .service_name("rpc.examples.v1.Echo")
        .build();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(reflection.v1())
        .build();
    let (uri, serving) = serve_on_tcp(&server).await;
    for name in ["rpc.examples.v1.Echo/Sai", "Echo/Say"] {
        let typo = rpc(&["call", &uri, name]).await;
        typo.expect_code(1);
        assert!(
            typo.stderr
                .contains("did you mean rpc.examples.v1.Echo/Say")
                && !typo.stderr.contains("gone.proto"),
            "{name}: {typo:?}"
        );
    }
    serving.abort();
}

/// A reflection server for a chain of files `c0.proto` → `c1.proto` → ... →
/// `c5.proto` (each importing the next, each with a service `Svc`) whose answers come
/// `delay` late, and hold the file asked for only (a server may leave out its
/// imports, for the client to ask for each); answers after the first hold nothing
/// when `empty_after_first`. Returns its URI and task.
async fn chain_reflection(
    delay: std::time::Duration,
    empty_after_first: bool,
) -> (String, tokio::task::JoinHandle<Result<(), rpc_core::Error>>) {
    use futures::StreamExt;
    use prost::Message;
    use prost_types::{FileDescriptorProto, FileDescriptorSet, ServiceDescriptorProto};
    use rpc_core::{
        server::{Server, ServerCall, ServerReply},
        stream::{ReplyStream, TakeOnce},
        Payload, Status,
    };
    use rpc_services::reflection::v1::{
        server_reflection_response::MessageResponse, ServerReflectionResponse,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Service, ServiceExt};
    let files = (0..6)
        .map(|i| FileDescriptorProto {
            name: Some(format!("c{i}.proto")),
            package: Some(format!("c{i}")),
            dependency: if i < 5 {
                vec![format!("c{}.proto", i + 1)]
            } else {
                Vec::new()
            },
            service: vec![ServiceDescriptorProto {
                name: Some("Svc".into()),
                ..Default::default()
            }],
            syntax: Some("proto3".into()),
            ..Default::default()
        })
        .collect();
    let reflection = rpc_services::reflection::Reflection::builder()
        .register_file_descriptor_set(FileDescriptorSet { file: files })
        .service_name("c0.Svc")
        .build()
        .v1();
    let answered = std::sync::Arc::new(AtomicUsize::new(0));
    let edited = tower::service_fn(move |call: ServerCall| {
        let mut reflection = reflection.clone();
        let answered = answered.clone();
        async move {
            let mut reply: ServerReply = reflection.ready().await?.call(call).await?;
            if let Some(answers) = reply.stream.as_ref().and_then(|s| s.take()) {
                let edited: ReplyStream = answers
                    .then(move |answer| {
                        let answered = answered.clone();
                        async move {
                            tokio::time::sleep(delay).await;
                            let mut response =
                                ServerReflectionResponse::decode(answer?.to_bytes()).unwrap();
                            if let Some(MessageResponse::FileDescriptorResponse(files)) =
                                &mut response.message_response
                            {
                                let first = answered.fetch_add(1, Ordering::Relaxed) == 0;
                                let keep = usize::from(first || !empty_after_first);
                                files.file_descriptor_proto.truncate(keep);
                            }
                            Ok::<_, Status>(Payload::from(bytes::Bytes::from(
                                response.encode_to_vec(),
                            )))
                        }
                    })
                    .boxed();
                reply.stream = Some(TakeOnce::new(edited));
            }
            Ok::<_, Status>(reply)
        }
    });
    let server = Server::builder()
        .add_named_service("grpc.reflection.v1.ServerReflection", edited)
        .build();
    serve_on_tcp(&server).await
}

/// A reflection server that answers each request just within `--timeout` (a chain of
/// imports, each answered 0.8 s after it is asked, with `--timeout 1s`): the lookups
/// end at twice the timeout, failing, not after every import's request reopened a
/// stream with a fresh timeout (8 files took 8 times the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lookups_end_at_twice_the_timeout() {
    let (uri, serving) = chain_reflection(std::time::Duration::from_millis(800), false).await;
    let describe = rpc(&["describe", &uri, "c0.Svc", "--timeout", "1s"]).await;
    assert_ne!(describe.code, 0, "{describe:?}");
    assert!(
        describe.stderr.contains("twice that") && describe.stderr.contains("DEADLINE_EXCEEDED"),
        "{describe:?}"
    );
    serving.abort();
}

/// An answer to a request for an import that leaves the file out (an empty answer) is
/// reported as the server not giving it, naming both files (it surfaced later as
/// descriptors that do not link).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_left_out_of_its_answer_is_named() {
    let (uri, serving) = chain_reflection(std::time::Duration::ZERO, true).await;
    let describe = rpc(&["describe", &uri, "c0.Svc"]).await;
    describe.expect_code(1);
    assert!(
        describe
            .stderr
            .contains("c0.proto (which defines or leads to c0.Svc) imports c1.proto"),
        "{describe:?}"
    );
    serving.abort();
}

/// Which of `rpc`'s outputs goes to a reader that has gone.
enum Closed {
    Stdout,
    Stderr,
}

/// Runs `rpc args` with `closed` going to a socket whose other end is gone (writes
/// fail with EPIPE), the other output captured.
async fn rpc_with_closed(args: &[&str], closed: Closed) -> std::process::Output {
    let (write, read) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(read);
    let gone = std::process::Stdio::from(std::os::fd::OwnedFd::from(write));
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rpc"));
    command.args(args).kill_on_drop(true);
    match closed {
        Closed::Stdout => command.stdout(gone).stderr(std::process::Stdio::piped()),
        Closed::Stderr => command.stderr(gone).stdout(std::process::Stdio::piped()),
    };
    command.spawn().unwrap().wait_with_output().await.unwrap()
}

/// `rpc list … | head -1`: a reader that closes standard output early ends the command
/// quietly (exit 0, nothing on stderr), for every subcommand that prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_the_command_quietly() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let uri = server.uri.as_str();
    for args in [
        vec!["list", uri],
        vec!["describe", uri, "rpc.examples.v1.Echo"],
        vec!["call", uri, "rpc.examples.v1.Echo/Say", "-d", "{}"],
        vec!["completions", "bash"],
    ] {
        let output = rpc_with_closed(&args, Closed::Stdout).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// `rpc … 2>&1 | grep -q …` whose reader has gone: a closed standard error does not
/// turn the command's exit code into a panic's (101): a call to a port nobody listens
/// on still exits 78. And `bench --rps` refuses a rate too slow to schedule (its
/// interval overflowed the workers' clocks: each panicked, and the run reported 0
/// calls and exited 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_keeps_the_exit_code_and_a_rate_too_slow_is_refused() {
    let nobody = format!("tcp://127.0.0.1:{}", closed_port());
    let call = ["call", &nobody, "rpc.examples.v1.Echo/Say", "-d", "{}"];
    let output = rpc_with_closed(&call, Closed::Stderr).await;
    assert_eq!(output.status.code(), Some(78), "{output:?}");

    let slow = rpc(&[
        "bench",
        &nobody,
        "rpc.examples.v1.Echo/Say",
        "-n",
        "1",
        "--rps",
        "1e-20",
    ])
    .await;
    slow.expect_code(2);
    assert!(slow.stderr.contains("at least 0.001"), "{slow:?}");
}

/// An HTTP/2 server that is no gRPC server (or a proxy with no route for reflection)
/// answers `404 Not Found`: `rpc` says reflection is not served and that the answer
/// was HTTP's, not gRPC's, rather than only that reflection is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_404_over_grpc_is_told_apart_from_a_missing_reflection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("grpc://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(answer_404(socket));
        }
    });
    let list = rpc(&["list", &uri]).await;
    list.expect_code(1);
    assert!(
        list.stderr.contains("does not serve reflection"),
        "{list:?}"
    );
    assert!(list.stderr.contains("HTTP status 404"), "{list:?}");
    assert!(list.stderr.contains("not gRPC's"), "{list:?}");
}

/// A bare HTTP/2 server on `socket`: its SETTINGS, an acknowledgement of the client's,
/// and `:status: 404` ending every stream the client opens.
async fn answer_404(mut socket: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SETTINGS: u8 = 4;
    const HEADERS: u8 = 1;
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    };
    let mut preface = [0u8; 24];
    if socket.read_exact(&mut preface).await.is_err() {
        return;
    }
    if socket.write_all(&frame(SETTINGS, 0, 0, &[])).await.is_err() {
        return;
    }
    loop {
        let mut header = [0u8; 9];
        if socket.read_exact(&mut header).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        if socket.read_exact(&mut payload).await.is_err() {
            return;
        }
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff;
        let answer = match kind {
            SETTINGS if flags & 1 == 0 => frame(SETTINGS, 1, 0, &[]),
            // END_STREAM | END_HEADERS; `:status: 404` is HPACK's static entry 13.
            HEADERS => frame(HEADERS, 0x5, stream, &[0x80 | 13]),
            _ => continue,
        };
        if socket.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// What grpcurl's and ghz's users type: `-d @` for standard input, an empty `-d` for
/// the empty request, a JSON array of a client stream's requests, `-O html` and
/// `--total` for a bench, and Ctrl-C (exit 130, as an exit code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_and_ghz_habits() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let uri = server.uri.as_str();
    let say = "rpc.examples.v1.Echo/Say";
    let stdin = rpc_with_stdin(&["call", uri, say, "-d", "@"], "{\"message\": \"in\"}").await;
    assert_eq!(stdin.expect_code(0).json()["message"], "in");
    // With a byte-order mark in front, as some editors write.
    let bom = rpc_with_stdin(
        &["call", uri, say, "-d", "@-"],
        "\u{feff}{\"message\": \"b\"}",
    )
    .await;
    assert_eq!(bom.expect_code(0).json()["message"], "b");
    for empty in ["", "  \n"] {
        let run = rpc(&["call", uri, say, "-d", empty]).await;
        assert_eq!(
            run.expect_code(0).json(),
            serde_json::json!({}),
            "{empty:?}"
        );
    }
    let sum = "rpc.examples.v1.Echo/Sum";
    let array = r#"[{"value": 1}, {"value": 2}] {"value": 39}"#;
    let summed = rpc(&["call", uri, sum, "-d", array]).await;
    assert_eq!(
        summed.expect_code(0).json(),
        serde_json::json!({"total": "42", "count": 3})
    );
    // Requests piped in without `-d @-` are not read, and the user is told so.
    let unread = rpc_with_stdin(&["call", uri, sum], r#"{"value": 1}"#).await;
    assert!(
        unread.stderr.contains("not read without `-d @-`"),
        "{unread:?}"
    );
    assert_eq!(unread.expect_code(0).json(), serde_json::json!({}));
    // With an empty `-d` too (from a review: no note).
    let unread = rpc_with_stdin(&["call", uri, sum, "-d", ""], r#"{"value": 1}"#).await;
    assert!(
        unread.stderr.contains("not read without `-d @-`"),
        "{unread:?}"
    );

    let html = rpc(&[
        "bench",
        uri,
        say,
        "--total",
        "20",
        "-O",
        "html",
        "--no-progress",
    ])
    .await;
    let page = html.expect_code(0).stdout.clone();
    assert!(
        page.starts_with("<!DOCTYPE html>") && page.contains("<svg"),
        "{html:?}"
    );

    // Interrupted while it waits for more of a stream's requests on standard input.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rpc"))
        .args([
            "call",
            uri,
            "rpc.examples.v1.Echo/Chat",
            "-d",
            "@-",
            "--timeout",
            "none",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut input, b"{\"message\": \"a\"}\n")
        .await
        .unwrap();
    // Once the first answer is out, the stream is open and waiting for more input.
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line)
        .await
        .unwrap();
    assert!(line.contains("re: a"), "{line:?}");
    let output = interrupt(child).await;
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("interrupted"));
    drop(input);
}

/// `--proto` reads editions files as the code generator does (as the proto3 file that
/// means the same): listed and described without a server (with files, nothing is
/// asked of it), explicit presence shown as `optional`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editions_files_are_read_as_the_generator_reads_them() {
    let dir = std::env::temp_dir().join(format!("rpc-cli-editions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let proto = dir.join("ed.proto");
    std::fs::write(
        &proto,
        "edition = \"2023\";\npackage ed;\nmessage Item {\n  string name = 1;\n  \
         int32 n = 2 [features.field_presence = IMPLICIT];\n}\n\
         service Items {\n  rpc Get(Item) returns (Item);\n}\n",
    )
    .unwrap();
    let proto = proto.display().to_string();
    let nobody = "tcp://127.0.0.1:9";
    let list = rpc(&["list", nobody, "--proto", &proto]).await;
    assert_eq!(list.expect_code(0).stdout, "ed.Items\n");
    let item = rpc(&["describe", nobody, "ed.Item", "--proto", &proto]).await;
    let text = &item.expect_code(0).stdout;
    assert!(text.contains("optional string name = 1;"), "{text}");
    assert!(text.contains("int32 n = 2;"), "{text}");
    assert!(
        !text.contains("optional int32 n"),
        "implicit presence: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C during `bench` stops the run and reports what was measured (as ghz does),
/// then exits 130; the calls in flight are left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_bench_reports_what_it_measured() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let child = spawn_rpc(&[
        "bench",
        &server.uri,
        "rpc.examples.v1.Echo/Say",
        "-z",
        "10m",
        "--format",
        "json",
    ]);
    // Once it is connected, its handler is in place (made first) and calls run.
    tokio::time::timeout(std::time::Duration::from_secs(120), async {
        while server.handle.connections().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the bench never connected");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let output = interrupt(child).await;
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["interrupted"], true, "{report}");
    assert!(report["calls"].as_u64().is_some(), "{report}");
    assert_eq!(report["calls"], report["ok"], "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("interrupted"), "{stderr}");

    // Interrupted in its warm-up: a report of no calls, `interrupted` in it (from a
    // review: nothing on standard output, where a script expected the JSON).
    let child = spawn_rpc(&[
        "bench",
        &server.uri,
        "rpc.examples.v1.Echo/Sleep",
        "-d",
        r#"{"delayMs": 60000}"#,
        "-n",
        "10",
        "--warmup",
        "4",
        "--format",
        "json",
    ]);
    // Its warm-up's calls (sleeping a minute) in flight.
    tokio::time::timeout(std::time::Duration::from_secs(120), async {
        while !server.handle.connections().iter().any(|c| c.in_flight > 0) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the bench's warm-up never started");
    let output = interrupt(child).await;
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|err| panic!("{err}: {output:?}"));
    assert_eq!(report["interrupted"], true, "{report}");
    assert_eq!(report["calls"], 0, "{report}");
}

/// `rpc` with `args` started, its output piped, killed if dropped.
fn spawn_rpc(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_rpc"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Sends `child` (an `rpc`) SIGINT, as Ctrl-C does, and waits for its end.
async fn interrupt(child: tokio::process::Child) -> std::process::Output {
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("rpc went on after Ctrl-C")
        .unwrap()
}

/// A call past its deadline is cancelled on the wire before the process exits
/// (`docs/wire.md` §6.6): the CLI waits for its connection to write what it queued
/// (from a review: the process exited before the connection's task wrote the
/// `CANCEL`, in 1 run of 6; the transport's own test, `rpc-transport-tcp`'s
/// `tests/close.rs`, shows it without the race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_cancelled_on_the_wire_before_the_cli_exits() {
    use tokio::io::AsyncReadExt;
    let (proto, include) = echo_proto();
    // A server that reads and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("tcp://{}", silent.local_addr().unwrap());
    let reader = tokio::spawn(async move {
        let (mut stream, _) = silent.accept().await.unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        all
    });
    let say = "rpc.examples.v1.Echo/Say";
    let files = ["--proto", proto.as_str(), "--import-path", include.as_str()];
    let mut args = vec!["call", uri.as_str(), say, "-d", "{}", "--timeout", "200ms"];
    args.extend(files);
    let late = rpc(&args).await;
    late.expect_code(64 + 4);
    let all = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
        .await
        .expect("the connection stayed open after the CLI exited")
        .unwrap();
    let mut bytes = bytes::Bytes::from(all);
    let mut frames = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        let frame = bytes.slice(4..4 + len);
        bytes = bytes.slice(4 + len..);
        let limits = rpc_core::frame::DecodeLimits::default();
        frames.push(rpc_core::frame::Frame::decode(frame, &limits).unwrap());
    }
    let id = match frames.first() {
        Some(rpc_core::frame::Frame::Request(request)) => request.id,
        other => panic!("expected the REQUEST first, got {other:?}"),
    };
    assert!(
        frames.iter().any(
            |frame| matches!(frame, rpc_core::frame::Frame::Cancel { id: cancelled } if *cancelled == id)
        ),
        "no CANCEL of call {id}: {frames:?}"
    );
}

/// `--max-message-size` bounds each message itself, requests and stream messages
/// alike (from a review: the frame limit made from it left room for metadata, and a
/// 16 KB message went through under `1KiB`); a message at the size goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_message_size_bounds_the_message() {
    let server = start("tcp://127.0.0.1:0", true).await;
    let uri = server.uri.as_str();
    // A SayRequest of `n` bytes of message: 3 bytes of tag and length more.
    let say = |n: usize| format!("{{\"message\": \"{}\"}}", "m".repeat(n));
    // `rpc COMMAND` of Echo/Say with a message of `n` bytes, under 1 KiB.
    let under_1kib = |command: &'static str, n: usize, extra: &'static [&'static str]| {
        let data = say(n);
        async move {
            let mut args = vec![
                command,
                uri,
                "rpc.examples.v1.Echo/Say",
                "-d",
                &data,
                "--max-message-size",
                "1KiB",
            ];
            args.extend_from_slice(extra);
            rpc(&args).await
        }
    };
    let fits = under_1kib("call", 1021, &[]).await;
    fits.expect_code(0);
    let over = under_1kib("call", 1022, &[]).await;
    over.expect_code(64 + 8);
    assert!(
        over.stderr
            .contains("the request of 1025 bytes is over --max-message-size"),
        "{over:?}"
    );
    // bench too (from a review: it was not checked there).
    let over = under_1kib("bench", 1022, &["-n", "2"]).await;
    over.expect_code(64 + 8);
    let stream = format!("{} {}", say(10), say(2000));
    let over = rpc_with_stdin(
        &[
            "call",
            uri,
            "rpc.examples.v1.Echo/Chat",
            "-d",
            "@-",
            "--max-message-size",
            "1KiB",
        ],
        &stream,
    )
    .await;
    assert!(
        over.stderr
            .contains("request 2 of 2003 bytes is over --max-message-size"),
        "{over:?}"
    );
}

/// A service name etcd lists no replica of: the call fails saying no replica is
/// known, not that a server's reflection was slow (no server was reached: a review
/// read "the server's reflection did not answer in time"). Needs etcd
/// (`RPC_ETCD_ENDPOINTS`, default 127.0.0.1:2379); skipped without it, outside CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_no_replica_is_not_blamed_on_reflection() {
    let etcd = std::env::var("RPC_ETCD_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:2379".into());
    let first = etcd.split(',').next().unwrap_or_default().to_owned();
    let reachable = std::net::TcpStream::connect_timeout(
        &first.parse().expect("RPC_ETCD_ENDPOINTS: host:port"),
        std::time::Duration::from_secs(1),
    )
    .is_ok();
    if !reachable {
        assert!(
            std::env::var_os("CI").is_none(),
            "etcd is not reachable at {first}; .ci/run should have started it"
        );
        eprintln!("skipped: no etcd at {first} (set RPC_ETCD_ENDPOINTS)");
        return;
    }
    let uri = format!("etcd://{first}/rpc-cli-nobody-{}", std::process::id());
    let out = rpc(&["call", &uri, "rpc.examples.v1.Echo/Say", "--timeout", "2s"]).await;
    out.expect_code(64 + 4);
    assert!(
        out.stderr.contains("none is known") && !out.stderr.contains("reflection"),
        "{out:?}"
    );
}
