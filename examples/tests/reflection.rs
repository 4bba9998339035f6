//! Server reflection end to end: our generated reflection clients (`grpc.reflection.v1`
//! and `v1alpha`) against a server over real sockets (`tcp://` and `grpc://` in full,
//! `unix://`, `tls://`, `udp://` and `rdma://` in short), the `echo-server` binary's
//! `--no-reflection`, and Python's `grpcio-reflection` and `grpcio-health-checking` as
//! independent clients over `grpc://`.
//!
//! The Python test needs `python3 -c 'import grpc, grpc_reflection, grpc_health'`;
//! without it it skips with a line saying how to enable it, except under CI (`CI`
//! set), where a missing one is a failure.

use std::{process::Stdio, time::Duration};

use futures::{stream::BoxStream, StreamExt};
use prost::Message;
use prost_types::FileDescriptorProto;
use rpc_connect::{ConnectOptions, ListenOptions};
use rpc_core::{client::Channel, server::Server, Code, Status};
use rpc_examples::interop::server::InteropService;
use rpc_proto::{
    echo::{echo_server::EchoServer, EchoService},
    kv::{key_value_server::KeyValueServer, MemoryStore},
};
use rpc_services::{
    health::HealthReporter,
    reflection::{
        v1::{
            server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
            ServerReflectionRequest, ServerReflectionResponse,
        },
        v1alpha,
    },
    ServerBuilderExt,
};
use rpc_transport_tcp::tls::{ClientTls, ServerTls};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

/// Bounds every test, so that a hang fails it instead of stalling CI.
const GUARD: Duration = Duration::from_secs(120);

/// What `list_services` must answer for [`test_server`], sorted.
const SERVICES: [&str; 6] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.testing.TestService",
    "rpc.examples.v1.Echo",
    "rpc.examples.v1.KeyValue",
];

/// Echo, key-value, health and gRPC's interop service, with reflection, serving `uri`.
/// Returns the bound URI; the server stops when the test's runtime ends.
async fn test_server(uri: &str) -> String {
    test_server_with(uri, &ListenOptions::new()).await
}

/// [`test_server`] with listening options (TLS).
async fn test_server_with(uri: &str, options: &ListenOptions) -> String {
    let health = HealthReporter::new();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .add_service(InteropService::default().into_service())
        .add_service(health.service())
        .add_reflection()
        .build();
    let (bound, serving) = rpc_connect::serve_with(&server, uri, options, std::future::pending())
        .await
        .unwrap();
    tokio::spawn(serving);
    bound
}

/// Which protocol version a [`Session`] speaks.
#[derive(Clone, Copy, Debug)]
enum Version {
    V1,
    V1Alpha,
}

/// One `ServerReflectionInfo` stream, asked one request at a time. Requests and
/// answers are `v1` messages; a `v1alpha` session converts them (the two versions are
/// the same fields).
struct Session {
    requests: mpsc::Sender<ServerReflectionRequest>,
    /// The call, made at the first request.
    pending: Option<(Channel, mpsc::Receiver<ServerReflectionRequest>)>,
    answers: Option<BoxStream<'static, Result<ServerReflectionResponse, Status>>>,
    version: Version,
}

/// `message` as the same fields of another message type.
fn convert<A: Message, B: Message + Default>(message: &A) -> B {
    B::decode(message.encode_to_vec().as_slice()).unwrap()
}

impl Session {
    fn new(channel: Channel, version: Version) -> Session {
        let (requests, receiver) = mpsc::channel(4);
        Session {
            requests,
            pending: Some((channel, receiver)),
            answers: None,
            version,
        }
    }

    /// Sends `request` and returns the answer.
    async fn ask(&mut self, request: MessageRequest) -> MessageResponse {
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        };
        self.requests.send(request.clone()).await.unwrap();
        if let Some((channel, receiver)) = self.pending.take() {
            let requests = futures::stream::unfold(receiver, |mut receiver| async move {
                receiver.recv().await.map(|request| (request, receiver))
            });
            self.answers = Some(match self.version {
                Version::V1 => ServerReflectionClient::new(channel)
                    .server_reflection_info(requests)
                    .await
                    .unwrap()
                    .into_inner()
                    .boxed(),
                Version::V1Alpha => {
                    let requests = requests
                        .map(|request| convert::<_, v1alpha::ServerReflectionRequest>(&request));
                    v1alpha::server_reflection_client::ServerReflectionClient::new(channel)
                        .server_reflection_info(requests)
                        .await
                        .unwrap()
                        .into_inner()
                        .map(|answer| answer.map(|answer| convert(&answer)))
                        .boxed()
                }
            });
        }
        let answer = self
            .answers
            .as_mut()
            .unwrap()
            .next()
            .await
            .expect("the stream ended")
            .expect("the stream failed");
        assert_eq!(answer.original_request, Some(request));
        answer.message_response.expect("an empty answer")
    }

    /// The sorted names `list_services` answers.
    async fn list(&mut self) -> Vec<String> {
        match self.ask(MessageRequest::ListServices(String::new())).await {
            MessageResponse::ListServicesResponse(list) => {
                let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
                names.sort();
                names
            }
            other => panic!("not a list: {other:?}"),
        }
    }

    /// The files answered for `request`, decoded, or the error's code.
    async fn files(&mut self, request: MessageRequest) -> Result<Vec<FileDescriptorProto>, Code> {
        match self.ask(request).await {
            MessageResponse::FileDescriptorResponse(files) => Ok(files
                .file_descriptor_proto
                .iter()
                .map(|bytes| FileDescriptorProto::decode(bytes.as_ref()).unwrap())
                .collect()),
            MessageResponse::ErrorResponse(error) => {
                assert!(!error.error_message.is_empty());
                Err(Code::from_u32(error.error_code as u32))
            }
            other => panic!("not files: {other:?}"),
        }
    }

    /// The names of the files answered for the symbol.
    async fn symbol(&mut self, symbol: &str) -> Result<Vec<String>, Code> {
        let files = self
            .files(MessageRequest::FileContainingSymbol(symbol.into()))
            .await?;
        Ok(files.iter().map(|file| file.name().to_owned()).collect())
    }
}

/// Everything the brief asks of reflection, over one channel.
async fn check_reflection(channel: Channel, version: Version) {
    let mut session = Session::new(channel.clone(), version);
    assert_eq!(session.list().await, SERVICES, "{version:?}");

    // A service: its file, then every import.
    let files = session
        .files(MessageRequest::FileContainingSymbol(
            "grpc.testing.TestService".into(),
        ))
        .await
        .unwrap();
    assert_eq!(files[0].name(), "grpc/testing/test.proto");
    assert!(!files[0].dependency.is_empty());
    for dependency in &files[0].dependency {
        assert!(
            files.iter().any(|file| file.name() == dependency),
            "{dependency} missing from {:?}",
            files.iter().map(|f| f.name()).collect::<Vec<_>>()
        );
    }
    // The same stream does not send a file twice, except the one asked for.
    assert_eq!(
        session.symbol("grpc.testing.TestService.UnaryCall").await,
        Ok(vec!["grpc/testing/test.proto".to_owned()]),
        "a method"
    );
    assert_eq!(
        session.symbol("grpc.testing.SimpleRequest").await,
        Ok(vec!["grpc/testing/messages.proto".to_owned()]),
        "a message"
    );
    assert_eq!(
        session
            .symbol("grpc.testing.LoadBalancerStatsResponse.RpcsByPeer")
            .await,
        Ok(vec!["grpc/testing/messages.proto".to_owned()]),
        "a nested message"
    );

    // Unknown: NOT_FOUND, and the stream goes on.
    assert_eq!(session.symbol("no.such.Symbol").await, Err(Code::NOT_FOUND));
    assert_eq!(
        session
            .files(MessageRequest::FileByFilename("no/such.proto".into()))
            .await
            .map(|_| ()),
        Err(Code::NOT_FOUND)
    );

    // Comments travel as source info.
    let echo = session
        .files(MessageRequest::FileByFilename(
            "rpc/examples/v1/echo.proto".into(),
        ))
        .await
        .unwrap();
    assert_eq!(echo.len(), 1);
    let comments: Vec<&str> = echo[0]
        .source_code_info
        .as_ref()
        .expect("source info")
        .location
        .iter()
        .filter_map(|location| location.leading_comments.as_deref())
        .collect();
    assert!(
        comments
            .iter()
            .any(|c| c.contains("Echoes messages back, with knobs")),
        "{comments:?}"
    );
    assert_eq!(echo[0].service[0].name(), "Echo");

    // Every registered service is described, reflection included; on a new stream.
    let mut fresh = Session::new(channel, version);
    for (service, file) in [
        ("rpc.examples.v1.KeyValue", "rpc/examples/v1/kv.proto"),
        ("grpc.health.v1.Health", "grpc/health/v1/health.proto"),
        (
            "grpc.reflection.v1.ServerReflection",
            "grpc/reflection/v1/reflection.proto",
        ),
        (
            "grpc.reflection.v1alpha.ServerReflection",
            "grpc/reflection/v1alpha/reflection.proto",
        ),
    ] {
        assert_eq!(fresh.symbol(service).await, Ok(vec![file.to_owned()]));
    }
}

async fn full_check(uri: &str) {
    let bound = test_server(uri).await;
    for version in [Version::V1, Version::V1Alpha] {
        let channel = rpc_examples::connect(&bound).await.unwrap();
        check_reflection(channel, version).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_over_tcp() {
    tokio::time::timeout(GUARD, full_check("tcp://127.0.0.1:0"))
        .await
        .expect("hung");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_over_grpc() {
    tokio::time::timeout(GUARD, full_check("grpc://127.0.0.1:0"))
        .await
        .expect("hung");
}

/// A file of `testdata/tls`.
fn cert(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tls")
        .join(name)
}

/// The other wires: a list and one symbol each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_over_unix_tls_udp_and_rdma() {
    let dir = std::env::temp_dir().join(format!("rpc-reflection-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unix = format!("unix://{}", dir.join("reflection.sock").display());
    // The repository's test certificate, for `localhost` and 127.0.0.1.
    let server_tls = ServerTls::builder()
        .cert_files(cert("server.pem"), cert("server.key"))
        .build()
        .unwrap();
    let client_tls = ClientTls::builder()
        .system_roots(false)
        .ca_file(cert("ca.pem"))
        .build()
        .unwrap();
    let listen = ListenOptions::new().tls(server_tls);
    let connect = ConnectOptions::new().tls(client_tls);
    tokio::time::timeout(GUARD, async {
        for uri in [
            unix.as_str(),
            "tls://127.0.0.1:0",
            "udp://127.0.0.1:0",
            "rdma://127.0.0.1:0",
        ] {
            let bound = test_server_with(uri, &listen).await;
            let channel = rpc_connect::connect_with(&bound, &connect).await.unwrap();
            let mut session = Session::new(channel, Version::V1);
            assert_eq!(session.list().await, SERVICES, "{uri}");
            assert_eq!(
                session.symbol("rpc.examples.v1.Echo.Say").await,
                Ok(vec!["rpc/examples/v1/echo.proto".to_owned()]),
                "{uri}"
            );
        }
    })
    .await
    .expect("hung");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the `echo-server` binary on `uri` with `args` and waits for its `listening
/// on` line.
async fn start_echo_server(uri: &str, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_echo-server"))
        .args(["--listen", uri])
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start echo-server");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("echo-server did not start")
        .unwrap()
        .expect("echo-server exited");
    let bound = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, bound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_server_has_reflection_unless_told_not_to() {
    tokio::time::timeout(GUARD, async {
        let (_server, uri) = start_echo_server("tcp://127.0.0.1:0", &[]).await;
        let mut session = Session::new(rpc_examples::connect(&uri).await.unwrap(), Version::V1);
        assert_eq!(
            session.list().await,
            [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
                "rpc.examples.v1.Echo",
                "rpc.examples.v1.KeyValue",
            ]
        );

        let (_server, uri) = start_echo_server("tcp://127.0.0.1:0", &["--no-reflection"]).await;
        let channel = rpc_examples::connect(&uri).await.unwrap();
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let outcome = async {
            let mut answers = ServerReflectionClient::new(channel)
                .server_reflection_info(futures::stream::iter([request]))
                .await?
                .into_inner();
            answers.message().await
        }
        .await;
        assert_eq!(outcome.unwrap_err().code(), Code::UNIMPLEMENTED);
    })
    .await
    .expect("hung");
}

/// Whether Python's grpcio with the reflection and health clients is there.
fn python_with_grpcio_reflection() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_reflection, grpc_health"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with grpcio-reflection and grpcio-health-checking is required under CI \
             (.ci/run installs them)"
        );
        eprintln!(
            "skipped: the grpcio reflection test needs \
             `python3 -m pip install grpcio-reflection grpcio-health-checking`"
        );
    }
    ok
}

/// grpcio's reflection client as grpcurl-like tools use it: list the services, then
/// build a descriptor pool from the server (files fetched by symbol, their imports by
/// name); and a health check.
const PYTHON_CLIENT: &str = r#"
import sys
import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

with grpc.insecure_channel(sys.argv[1]) as channel:
    database = ProtoReflectionDescriptorDatabase(channel)
    print("services=" + ",".join(sorted(database.get_services())))
    pool = DescriptorPool(database)
    echo = pool.FindServiceByName("rpc.examples.v1.Echo")
    print("methods=" + ",".join(method.name for method in echo.methods))
    say = pool.FindMessageTypeByName("rpc.examples.v1.SayRequest")
    print("file=" + say.file.name)
    print("fields=" + ",".join(field.name for field in say.fields))
    try:
        pool.FindServiceByName("no.such.Service")
        print("unknown=found")
    except KeyError:
        print("unknown=missing")
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=10
    )
    print("health=" + health_pb2.HealthCheckResponse.ServingStatus.Name(health.status))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_reflection_lists_and_describes_the_echo_server() {
    if !python_with_grpcio_reflection() {
        return;
    }
    let (_server, uri) = start_echo_server("grpc://127.0.0.1:0", &[]).await;
    let target = uri.strip_prefix("grpc://").unwrap().to_owned();
    let output = tokio::time::timeout(
        GUARD,
        Command::new("python3")
            .args(["-c", PYTHON_CLIENT, &target])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client hung")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "services=grpc.health.v1.Health,grpc.reflection.v1.ServerReflection,\
             grpc.reflection.v1alpha.ServerReflection,rpc.examples.v1.Echo,\
             rpc.examples.v1.KeyValue",
            "methods=Say,Sleep,Fail,Count,Sum,Chat",
            "file=rpc/examples/v1/echo.proto",
            "fields=message,payload",
            "unknown=missing",
            "health=SERVING",
        ],
        "{stdout}"
    );
}
