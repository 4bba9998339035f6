//! The framework itself: the generated `rpc_proto::echo` client and server over the
//! `rpc-transport-tcp` links (TCP, TLS over TCP, or Unix socket), `rpc-transport-udp`,
//! `rpc-transport-rdma` with its soft provider, and `rpc-transport-grpc` (gRPC over
//! HTTP/2, h2c).
//!
//! TLS uses the test certificates of `testdata/tls` (ECDSA P-256: `server.pem` for
//! `127.0.0.1`, signed by `ca.pem`), built into the binary.

use std::{
    io,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        OnceLock,
    },
};

use bytes::Bytes;
use rpc_core::{client::Channel, link::Listener, server::Server};
use rpc_observe::{
    metrics::{ClientMetrics, ClientMetricsLayer, ServerMetricsLayer},
    trace::{ClientTrace, ClientTraceLayer, ServerTraceLayer},
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use rpc_transport_grpc::{GrpcConfig, GrpcConnector, GrpcListener};
use rpc_transport_rdma::RdmaConnector;
use rpc_transport_tcp::{
    tls::{ClientTls, ServerTls, TlsConnector, TlsListener},
    StreamConnector,
};
use rpc_transport_udp::UdpConnector;
use tower::{util::Either, Layer};

use super::{wrong_length, Caller, ServeFuture};

/// Largest frame either side accepts: the bulk workload sends 16 MiB payloads, which
/// with their envelope exceed the default 16 MiB limit.
pub(crate) const MAX_FRAME_LEN: usize = 64 << 20;

/// Calls in flight per channel and requests per server connection: above the
/// throughput workload's 256, so neither limit is what the benchmark measures.
pub(crate) const MAX_IN_FLIGHT: usize = 1024;

/// Connections per framework channel (`--connections`, `ChannelBuilder::connections`):
/// one, unless the command line asks for a pool.
static CONNECTIONS: AtomicUsize = AtomicUsize::new(1);

/// Makes every framework channel of this process a pool of `n` connections.
pub(crate) fn set_connections(n: usize) {
    CONNECTIONS.store(n, Ordering::Relaxed);
}

/// The gRPC wire's settings on both ends: HTTP/2's concurrent stream limit raised
/// from 256 to [`MAX_IN_FLIGHT`] (like the core's limits above, and tonic's in
/// `rpc-bench-compare`); windows and frame sizes at their defaults.
fn grpc_config() -> GrpcConfig {
    GrpcConfig::default().max_concurrent_streams(MAX_IN_FLIGHT as u32)
}

/// The test CA that signed [`SERVER_CERT`].
const CA_PEM: &[u8] = include_bytes!("../../../testdata/tls/ca.pem");
/// The server's certificate (`DNS:localhost`, `IP:127.0.0.1`, `IP:::1`).
const SERVER_CERT: &[u8] = include_bytes!("../../../testdata/tls/server.pem");
/// The server certificate's key.
const SERVER_KEY: &[u8] = include_bytes!("../../../testdata/tls/server.key");

/// The TLS server's settings: the test certificate, no client certificates asked for.
fn server_tls() -> io::Result<ServerTls> {
    ServerTls::builder()
        .cert_pem(SERVER_CERT, SERVER_KEY)
        .build()
        .map_err(io::Error::other)
}

/// Fresh TLS client settings trusting the test CA only (not the system's roots).
///
/// Each build has its own session cache, so the first connection made with it runs a
/// full handshake (certificate chain verified, no resumption); later connections with
/// the same settings may resume the session.
pub(crate) fn client_tls() -> io::Result<ClientTls> {
    ClientTls::builder()
        .system_roots(false)
        .ca_pem(CA_PEM)
        .build()
        .map_err(io::Error::other)
}

/// The TLS client settings of the latency, throughput and bulk workloads (one
/// connection each), built once.
fn shared_client_tls() -> io::Result<ClientTls> {
    static SHARED: OnceLock<Result<ClientTls, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| client_tls().map_err(|e| e.to_string()))
        .clone()
        .map_err(io::Error::other)
}

/// A fresh socket path in the temporary directory, unique within this process, as a
/// URI of `scheme` (`unix` or `rdma+unix`).
pub(crate) fn socket_uri(scheme: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "rpc-bench-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    format!("{scheme}://{}", path.display())
}

/// Binds `uri` and returns the bound URI and the server future (an
/// `EchoServer<EchoService>`).
pub(crate) async fn serve(uri: &str) -> io::Result<(String, ServeFuture)> {
    let builder = Server::builder()
        .max_frame_len(MAX_FRAME_LEN)
        .max_concurrent_requests(MAX_IN_FLIGHT);
    let server = match observe() {
        Observe::Off => builder.add_service(EchoServer::new(EchoService)).build(),
        Observe::Trace => builder
            .layer(ServerTraceLayer::new())
            .add_service(EchoServer::new(EchoService))
            .build(),
        Observe::Metrics => builder
            .layer(ServerMetricsLayer::new())
            .add_service(EchoServer::new(EchoService))
            .build(),
        Observe::Both => builder
            .layer(ServerTraceLayer::new())
            .layer(ServerMetricsLayer::new())
            .add_service(EchoServer::new(EchoService))
            .build(),
    };
    if uri.starts_with("udp://") {
        serving(server, rpc_transport_udp::bind(uri).await)
    } else if uri.starts_with("rdma") {
        serving(server, rpc_transport_rdma::bind(uri).await)
    } else if uri.starts_with("tls://") {
        serving(server, TlsListener::bind(uri, server_tls()?).await)
    } else if uri.starts_with("grpc://") {
        let address = uri.parse().map_err(io::Error::other)?;
        serving(server, GrpcListener::bind(&address, grpc_config()).await)
    } else {
        serving(server, rpc_transport_tcp::bind(uri).await)
    }
}

/// The bound URI of `listener` and `server` serving it.
fn serving<L: Listener + 'static>(
    server: Server,
    listener: Result<L, rpc_core::Error>,
) -> io::Result<(String, ServeFuture)> {
    let listener = listener.map_err(io::Error::other)?;
    let addr = listener.local_addr();
    let serve = async move { server.serve(listener).await.map_err(io::Error::other) };
    Ok((addr, Box::pin(serve)))
}

/// Which of `rpc-observe`'s layers both sides of the framework's subjects get, from
/// `RPC_BENCH_OBSERVE`: `trace`, `metrics`, or `1` for both (no subscriber nor recorder
/// is installed: what an application that has them in its stack pays when nothing
/// listens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Observe {
    Off,
    Trace,
    Metrics,
    Both,
}

fn observe() -> Observe {
    static OBSERVE: OnceLock<Observe> = OnceLock::new();
    *OBSERVE.get_or_init(|| match std::env::var("RPC_BENCH_OBSERVE").as_deref() {
        Ok("1") => Observe::Both,
        Ok("trace") => Observe::Trace,
        Ok("metrics") => Observe::Metrics,
        _ => Observe::Off,
    })
}

/// The channel, or the channel under the observability layers (`RPC_BENCH_OBSERVE`).
type Stack = Either<
    Channel,
    Either<
        ClientTrace<Channel>,
        Either<ClientMetrics<Channel>, ClientTrace<ClientMetrics<Channel>>>,
    >,
>;

/// A generated `EchoClient` on one [`Channel`]; clones share the connection.
#[derive(Clone, Debug)]
pub(crate) struct FrameworkCaller {
    client: EchoClient<Stack>,
}

/// Connects a channel to `uri` (a `tcp://`, `tls://`, `unix://`, `udp://`,
/// `rdma+unix://` or `grpc://` URI); over TLS with settings shared by every such
/// connection of the process.
pub(crate) async fn connect(uri: &str) -> io::Result<FrameworkCaller> {
    let tls = if uri.starts_with("tls://") {
        Some(shared_client_tls()?)
    } else {
        None
    };
    connect_with(uri, tls).await
}

/// Connects a channel to `uri`; a `tls://` URI with `tls` as the client's settings
/// (which must then be given).
pub(crate) async fn connect_with(uri: &str, tls: Option<ClientTls>) -> io::Result<FrameworkCaller> {
    let builder = Channel::builder()
        .max_in_flight(MAX_IN_FLIGHT)
        .max_frame_len(MAX_FRAME_LEN)
        .connections(CONNECTIONS.load(Ordering::Relaxed));
    let channel = if uri.starts_with("udp://") {
        let connector = UdpConnector::from_uri(uri).map_err(io::Error::other)?;
        builder.connect(connector).await
    } else if uri.starts_with("rdma") {
        let connector = RdmaConnector::from_uri(uri).map_err(io::Error::other)?;
        builder.connect(connector).await
    } else if uri.starts_with("tls://") {
        let tls = tls.ok_or_else(|| io::Error::other("a tls:// URI needs TLS settings"))?;
        let connector = TlsConnector::new(uri, tls).map_err(io::Error::other)?;
        builder.connect(connector).await
    } else if uri.starts_with("grpc://") {
        let address = uri.parse().map_err(io::Error::other)?;
        builder
            .connect(GrpcConnector::new(address, grpc_config()))
            .await
    } else {
        let connector = StreamConnector::from_uri(uri).map_err(io::Error::other)?;
        builder.connect(connector).await
    }
    .map_err(io::Error::other)?;
    let traced = ClientTraceLayer::for_channel(&channel);
    let stack = match observe() {
        Observe::Off => Either::Left(channel),
        Observe::Trace => Either::Right(Either::Left(traced.layer(channel))),
        Observe::Metrics => Either::Right(Either::Right(Either::Left(
            ClientMetricsLayer::new().layer(channel),
        ))),
        Observe::Both => Either::Right(Either::Right(Either::Right(
            traced.layer(ClientMetricsLayer::new().layer(channel)),
        ))),
    };
    Ok(FrameworkCaller {
        client: EchoClient::new(stack),
    })
}

impl Caller for FrameworkCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        // `bytes` fields are `Bytes`: the request shares the payload, no copy here.
        let request = SayRequest {
            message: String::new(),
            payload: payload.clone(),
        };
        let reply = self
            .client
            .say(request)
            .await
            .map_err(|status| io::Error::other(status.to_string()))?;
        let got = reply.get_ref().payload.len();
        if got != payload.len() {
            return Err(wrong_length(payload.len(), got));
        }
        Ok(())
    }
}
