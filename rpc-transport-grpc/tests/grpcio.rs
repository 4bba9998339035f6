//! Interop with an independent gRPC implementation, Python's grpcio: its client
//! calls our `Server` over `grpc://`, and our generated `EchoClient` calls its server.
//!
//! The Python stubs are generated at test time from the same `echo.proto` with
//! `grpc_tools.protoc`. Without `python3 -c 'import grpc, grpc_tools'` the tests skip
//! with a line saying how to enable them, except under CI (`CI` set), where
//! `.ci/run` installs grpcio and a missing one is a failure.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use futures::{stream, StreamExt};
use rpc_core::{
    client::Channel,
    codegen::{BoxFuture, NamedService, ServerCall, ServerReply, Service},
    compress::{Algorithm, Compression},
    server::Server,
    Code, Request, Response, Status,
};
use rpc_proto::echo::{
    echo_client::EchoClient, echo_server::EchoServer, CountRequest, EchoService, FailRequest,
    SayReply, SayRequest, SleepRequest, SumRequest,
};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Bounds every step, so that a hang fails the test instead of stalling CI.
const GUARD: Duration = Duration::from_secs(120);

/// The server's message limit in the grpcio client test (its script sends 5 MiB).
const MAX_FRAME_LEN: usize = 4 * 1024 * 1024;

fn python_with_grpcio() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with grpcio and grpcio-tools is required under CI (.ci/run installs them)"
        );
        eprintln!(
            "skipped: the grpcio interop tests need `python3 -m pip install grpcio grpcio-tools`"
        );
    }
    ok
}

/// A fresh directory with the Python stubs of `echo.proto`.
fn python_stubs(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rpc-grpc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let status = std::process::Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&protos)
        .arg(format!("--python_out={}", dir.display()))
        .arg(format!("--grpc_python_out={}", dir.display()))
        .arg("rpc/examples/v1/echo.proto")
        .status()
        .unwrap();
    assert!(status.success(), "grpc_tools.protoc failed");
    dir
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name)
}

/// Answers `SayRequest`s with the request's text metadata as response headers and its
/// binary metadata as trailers: what the custom-metadata case checks. `Echo` is listed
/// as unary, so its calls take the unary fast path (docs/grpc.md); any other method
/// name takes the stream path.
#[derive(Clone, Debug)]
struct MetaEcho;

impl NamedService for MetaEcho {
    const NAME: &'static str = "test.Meta";
    const UNARY_METHODS: &'static [&'static str] = &["Echo"];
}

impl Service<ServerCall> for MetaEcho {
    type Response = ServerReply;
    type Error = Status;
    type Future = BoxFuture<Result<ServerReply, Status>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        Box::pin(async move {
            let (metadata, _, request) = rpc_core::codegen::unary_request::<SayRequest>(call)
                .await?
                .into_parts();
            let mut response = Response::new(SayReply {
                message: request.message,
                payload: request.payload,
            });
            for (key, value) in metadata.iter() {
                let to = if key.ends_with("-bin") {
                    response.trailers_mut()
                } else {
                    response.metadata_mut()
                };
                to.append(key.to_owned(), value.clone()).unwrap();
            }
            rpc_core::codegen::encode_response(Ok(response))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_client_calls_our_server() {
    if !python_with_grpcio() {
        return;
    }
    let listener = rpc_transport_grpc::bind("grpc://127.0.0.1:0")
        .await
        .unwrap();
    grpcio_client_calls(listener, "client", &[]).await;
}

/// The same over `grpcs://` with mutual TLS: grpcio's client presents the test
/// client certificate, and checks ours against the test CA.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_client_calls_our_server_over_mutual_tls() {
    if !python_with_grpcio() {
        return;
    }
    let tls = rpc_transport_tcp::tls::ServerTls::builder()
        .cert_files(test_cert("server.pem"), test_cert("server.key"))
        .client_ca_file(test_cert("ca.pem"))
        .build()
        .unwrap();
    let listener = rpc_transport_grpc::GrpcListener::bind_tls(
        &"grpcs://127.0.0.1:0".parse().unwrap(),
        Default::default(),
        tls.clone(),
    )
    .await
    .unwrap();
    assert!(listener.local_addr_uri().starts_with("grpcs://"));
    let client_tls = [
        test_cert("ca.pem"),
        test_cert("client.pem"),
        test_cert("client.key"),
    ];
    grpcio_client_calls(listener, "client-tls", &client_tls).await;
    assert!(
        tls.stats()
            .handshakes
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}

/// A certificate of `testdata/tls`.
#[cfg(feature = "tls")]
fn test_cert(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tls")
        .join(name)
}

/// Runs `echo_client.py` (with `tls` files: CA, certificate, key) against our server
/// on `listener`, then shuts the server down gracefully.
async fn grpcio_client_calls(
    listener: rpc_transport_grpc::GrpcListener,
    name: &str,
    tls: &[PathBuf],
) {
    let stubs = python_stubs(name);
    let uri = listener.local_addr_uri();
    let target = uri.split_once("://").unwrap().1.to_owned();
    let server = Server::builder()
        .max_frame_len(MAX_FRAME_LEN)
        .compression(Some(Compression::new(Algorithm::Gzip)))
        .unwrap()
        .add_service(EchoServer::new(EchoService))
        .add_service(MetaEcho)
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        server
            .serve_with_shutdown(listener, async {
                let _ = stopped.await;
            })
            .await
    });

    let output = tokio::time::timeout(
        GUARD,
        tokio::process::Command::new("python3")
            .arg(script("echo_client.py"))
            .arg(&target)
            .arg(&stubs)
            .args(tls)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the grpcio client hung")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "grpcio client failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");

    // Graceful shutdown: GOAWAY, then the server's serve future ends.
    stop.send(()).unwrap();
    tokio::time::timeout(GUARD, serving)
        .await
        .expect("shutdown hung")
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_dir_all(stubs);
}

/// A grpcio client that PINGs every 200 ms, with calls and without, keeps its
/// connection for 8 s of idle spells, unary calls, streams and an idle open stream:
/// the server's bound on control frames (`GrpcConfig::control_frame_budget`) never
/// closes it, even at a tenth of the default bound (100 in 10 s without a call).
/// (grpcio spaces its PINGs itself: with `GRPC_TRACE=http`, 16 in 8 s, 7 of them
/// keepalive and the rest BDP probes; a bound of 5 was not reached.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_client_with_a_200_ms_keepalive_keeps_its_connection() {
    if !python_with_grpcio() {
        return;
    }
    let config = rpc_transport_grpc::GrpcConfig::default().control_frame_budget(
        rpc_transport_grpc::DEFAULT_MAX_CONTROL_FRAMES / 10,
        rpc_transport_grpc::DEFAULT_CONTROL_FRAME_PERIOD,
    );
    let listener =
        rpc_transport_grpc::GrpcListener::bind(&"grpc://127.0.0.1:0".parse().unwrap(), config)
            .await
            .unwrap();
    let stubs = python_stubs("keepalive");
    let uri = listener.local_addr_uri();
    let target = uri.split_once("://").unwrap().1.to_owned();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let serving = tokio::spawn(async move { server.serve(listener).await });
    let output = tokio::time::timeout(
        GUARD,
        tokio::process::Command::new("python3")
            .arg(script("keepalive_client.py"))
            .arg(&target)
            .arg(&stubs)
            .args(["200", "8"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the grpcio client hung")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "grpcio client failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    serving.abort();
    let _ = std::fs::remove_dir_all(stubs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_calls_a_grpcio_server() {
    if !python_with_grpcio() {
        return;
    }
    our_client_calls(
        "server",
        &[],
        |port| format!("grpc://127.0.0.1:{port}"),
        rpc_transport_grpc::GrpcConnector::from_uri,
    )
    .await;
}

/// The same over TLS: grpcio's server requires our client certificate; we check its
/// certificate against the test CA.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_calls_a_grpcio_server_over_mutual_tls() {
    if !python_with_grpcio() {
        return;
    }
    let server_tls = [
        test_cert("server.pem"),
        test_cert("server.key"),
        test_cert("ca.pem"),
    ];
    our_client_calls(
        "server-tls",
        &server_tls,
        |port| format!("grpcs://localhost:{port}"),
        |uri| {
            let tls = rpc_transport_tcp::tls::ClientTls::builder()
                .system_roots(false)
                .ca_file(test_cert("ca.pem"))
                .identity_files(test_cert("client.pem"), test_cert("client.key"))
                .build()?;
            Ok(rpc_transport_grpc::GrpcConnector::from_uri(uri)?.tls(tls))
        },
    )
    .await;
}

/// Starts `echo_server.py` (with `tls` files: certificate, key, client CA) and calls
/// it with our generated client through connectors made by `connector` for the URI
/// `uri_of(port)`.
async fn our_client_calls(
    name: &str,
    tls: &[PathBuf],
    uri_of: impl Fn(&str) -> String,
    connector: impl Fn(&str) -> Result<rpc_transport_grpc::GrpcConnector, rpc_core::Error>,
) {
    let stubs = python_stubs(name);
    let mut python = tokio::process::Command::new("python3")
        .arg(script("echo_server.py"))
        .arg(&stubs)
        .args(tls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(python.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("the grpcio server did not start")
        .unwrap()
        .expect("the grpcio server exited");
    let port = first.strip_prefix("PORT ").expect("PORT line").trim();
    let uri = uri_of(port);
    let channel = Channel::builder()
        .connect(connector(&uri).unwrap())
        .await
        .unwrap();
    let mut echo = EchoClient::new(channel);

    tokio::time::timeout(GUARD, async {
        // Unary, with metadata both ways (headers and trailers join the response's).
        let mut request = Request::new(SayRequest {
            message: "hi".into(),
            payload: vec![0, 1, 2].into(),
        });
        request.metadata_mut().append("x-user", "alice").unwrap();
        request
            .metadata_mut()
            .append("x-trace-bin", bytes::Bytes::from_static(&[0, 0xff]))
            .unwrap();
        let reply = echo.say(request).await.unwrap();
        assert_eq!(reply.get_ref().message, "hi");
        assert_eq!(&reply.get_ref().payload[..], &[0, 1, 2]);
        assert_eq!(reply.metadata().get_str("x-user"), Some("alice"));
        assert_eq!(
            reply.metadata().get("x-trace-bin").unwrap().as_bytes(),
            &[0, 0xff]
        );

        // Large unary: many HTTP/2 frames each way.
        let big: Vec<u8> = (0..2 * 1024 * 1024).map(|i| i as u8).collect();
        let reply = echo
            .say(SayRequest {
                message: "big".into(),
                payload: big.clone().into(),
            })
            .await
            .unwrap();
        assert_eq!(reply.get_ref().payload[..], big[..]);

        // Server streaming.
        let mut counts = echo
            .count(CountRequest {
                count: 5,
                interval_ms: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(reply) = counts.message().await.unwrap() {
            got.push(reply.n);
        }
        assert_eq!(got, [1, 2, 3, 4, 5]);

        // A stream's response headers over the metadata limit: that call fails, the
        // connection goes on (the link checks them before handing them to the core).
        let mut request = Request::new(CountRequest {
            count: 5,
            interval_ms: 0,
        });
        request
            .metadata_mut()
            .append("x-big-headers", "20000")
            .unwrap();
        let status = match echo.count(request).await {
            Ok(response) => {
                let mut counts = response.into_inner();
                loop {
                    match counts.message().await {
                        Ok(Some(_)) => continue,
                        Ok(None) => panic!("20 KB of response headers were accepted"),
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        assert_eq!(status.code(), Code::RESOURCE_EXHAUSTED, "{status}");
        assert!(status.message().contains("metadata limit"), "{status}");

        // Client streaming.
        let values = stream::iter(1..=100i64).map(|value| SumRequest { value });
        let sum = echo.sum(values).await.unwrap();
        assert_eq!((sum.get_ref().total, sum.get_ref().count), (5050, 100));

        // Bidirectional.
        let requests = stream::iter(0..50).map(|i| SayRequest {
            message: i.to_string(),
            ..SayRequest::default()
        });
        let mut replies = echo.chat(requests).await.unwrap().into_inner();
        let mut got = Vec::new();
        while let Some(reply) = replies.message().await.unwrap() {
            got.push(reply.message);
        }
        let expected: Vec<String> = (0..50).map(|i| format!("re: {i}")).collect();
        assert_eq!(got, expected);

        // A status from the server, message intact.
        let status = echo
            .fail(FailRequest {
                code: 5,
                message: "no such user: ünïcode\n100%".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NOT_FOUND);
        assert_eq!(status.message(), "no such user: ünïcode\n100%");

        // A deadline: sent as grpc-timeout, and enforced here.
        let status = echo
            .sleep(
                Request::new(SleepRequest { delay_ms: 10_000 })
                    .with_timeout(Duration::from_millis(300)),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DEADLINE_EXCEEDED);

        // gzip, negotiated with grpcio through grpc-accept-encoding: the server (which
        // compresses with gzip) answers compressed at once; our requests go
        // compressed once its first response said it accepts gzip.
        let gzip = Channel::builder()
            .compression(Some(Compression::new(Algorithm::Gzip)))
            .unwrap()
            .connect(connector(&uri).unwrap())
            .await
            .unwrap();
        let mut zipped = EchoClient::new(gzip);
        let zeros = bytes::Bytes::from(vec![0u8; 256 * 1024]);
        for round in 0..3 {
            let reply = zipped
                .say(SayRequest {
                    message: format!("gz {round}"),
                    payload: zeros.clone(),
                })
                .await
                .unwrap();
            assert_eq!(reply.get_ref().payload, zeros);
            assert!(
                reply.compressed(),
                "grpcio's answer {round} arrived uncompressed"
            );
        }
        let chunk = zeros.slice(..8192);
        let requests = stream::iter(0..3).map(move |i| SayRequest {
            message: i.to_string(),
            payload: chunk.clone(),
        });
        let mut replies = zipped.chat(requests).await.unwrap().into_inner();
        let mut got = 0;
        while let Some(reply) = replies.message().await.unwrap() {
            assert_eq!(reply.payload.len(), 8192);
            got += 1;
        }
        assert_eq!(got, 3);

        // The connection is still good.
        let reply = echo
            .say(SayRequest {
                message: "after".into(),
                ..SayRequest::default()
            })
            .await
            .unwrap();
        assert_eq!(reply.get_ref().message, "after");
    })
    .await
    .expect("a call hung");

    drop(python.stdin.take());
    let _ = tokio::time::timeout(GUARD, python.wait()).await;
    let _ = std::fs::remove_dir_all(stubs);
}
