//! What the end-to-end tests share: a server like the example servers (`echo-server`'s
//! services and `interop-server`'s `grpc.testing.TestService`, health, and reflection
//! unless turned off) serving in-process on a loopback address of any transport, and the
//! built `rpc` binary run as a process against it.

#![allow(dead_code, unreachable_pub)]

use std::{path::PathBuf, process::Stdio, time::Duration};

use rpc_core::server::Server;
use rpc_examples::interop::server::InteropService;
use rpc_proto::{
    echo::{echo_server::EchoServer, EchoService},
    health::{HealthReporter, ServingStatus},
    kv::{key_value_server::KeyValueServer, MemoryStore},
};
use rpc_services::ServerBuilderExt;
use tokio::io::AsyncWriteExt;

/// Hang guard for one `rpc` run; never a measure of speed.
const GUARD: Duration = Duration::from_secs(120);

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The test certificates (`testdata/tls`).
pub fn tls_file(name: &str) -> String {
    repo().join("testdata/tls").join(name).display().to_string()
}

/// The example servers' services in one server: `Echo`, `KeyValue`, the interop
/// `TestService`, health (`rpc.examples.v1.Echo` SERVING, `rpc.examples.v1.Down`
/// NOT_SERVING), and reflection when `reflection` is set.
pub fn server(reflection: bool) -> Server {
    let health = HealthReporter::new();
    health.set("rpc.examples.v1.Echo", ServingStatus::Serving);
    health.set("rpc.examples.v1.Down", ServingStatus::NotServing);
    let builder = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .add_service(InteropService::default().into_service())
        .add_service(health.service());
    let builder = if reflection {
        builder.add_reflection()
    } else {
        builder
    };
    builder.build()
}

/// A server serving on a loopback address until dropped.
pub struct TestServer {
    /// The bound URI.
    pub uri: String,
    /// The server, to read its connections from.
    pub handle: rpc_core::server::Server,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves [`server`] on `uri` (`tcp://127.0.0.1:0`, `unix://...`, `udp://...`,
/// `rdma://...`, `grpc://...`, `tls://...` and `grpcs://...` with the test
/// certificate).
pub async fn start(uri: &str, reflection: bool) -> TestServer {
    serve(uri, reflection, false).await
}

/// Serves [`server`] with reflection on `tls://127.0.0.1:0`, requiring client
/// certificates signed by the test CA (mTLS).
pub async fn start_mtls() -> TestServer {
    serve("tls://127.0.0.1:0", true, true).await
}

async fn serve(uri: &str, reflection: bool, client_certificates: bool) -> TestServer {
    let server = server(reflection);
    let mut options = rpc_connect::ListenOptions::new();
    if uri.starts_with("tls") || uri.starts_with("grpcs") {
        let mut tls = rpc_transport_tcp::tls::ServerTls::builder()
            .cert_files(tls_file("server.pem"), tls_file("server.key"));
        if client_certificates {
            tls = tls.client_ca_file(tls_file("ca.pem"));
        }
        options = options.tls(tls.build().expect("the test certificate"));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound, serving) = rpc_connect::serve_with(&server, uri, &options, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap_or_else(|err| panic!("serve {uri}: {err}"));
    tokio::spawn(serving);
    TestServer {
        uri: bound,
        handle: server,
        _stop: stop,
    }
}

/// A Unix socket path unique to this test process and `name`.
pub fn socket(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("rpc-cli-{name}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path.display().to_string()
}

/// What one run of `rpc` did.
#[derive(Debug)]
pub struct Run {
    /// The exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Panics with the output unless the exit code is `code`.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code, code,
            "exit code; stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Standard output as JSON lines.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
            .collect()
    }

    /// Standard output as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: stdout {:?} stderr {:?}", self.stdout, self.stderr))
    }
}

/// Runs the built `rpc` with `args`, `stdin` on its standard input.
pub async fn rpc_with_stdin(args: &[&str], stdin: &str) -> Run {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rpc"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run rpc");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("rpc {args:?} hung"))
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs the built `rpc` with `args` and nothing on its standard input.
pub async fn rpc(args: &[&str]) -> Run {
    rpc_with_stdin(args, "").await
}

/// A port no server listens on, that stays so while the test process lives.
pub fn closed_port() -> u16 {
    // Bound and never listening: a connection to it is refused, and no other socket
    // takes the port while the test process lives (a port merely found free could
    // go to another test's connection meanwhile, which would answer).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    std::mem::forget(socket);
    port
}
