//! tonic: a unary `bench.Echo/Echo` call carrying `bytes payload`, protobuf-encoded
//! with prost, over HTTP/2 on one TCP loopback connection (`TCP_NODELAY` on both
//! ends).
//!
//! - Server: `tonic::transport::Server` on the harness's server thread (its
//!   `current_thread` runtime runs every connection and request task).
//! - Client: one `tonic::transport::Channel` (one HTTP/2 connection); clones of the
//!   generated client share it, so the throughput workload's 256 calls in flight are
//!   256 concurrent HTTP/2 streams on that connection.
//!
//! Settings changed from tonic's defaults, so that limits are not what is measured:
//! message size limits raised to 64 MiB (the default 4 MiB decoding limit rejects the
//! bulk workload's 16 MiB payloads), and the server's concurrent stream limit raised
//! to 1024 (above the 256 in flight). HTTP/2 window sizes are left at their defaults.

use std::io;

use bytes::Bytes;
use rpc_bench::{subjects::wrong_length, Caller, ServeFuture};
use tokio::net::TcpListener;
use tonic::{
    transport::{server::TcpIncoming, Channel, Endpoint, Server},
    Request, Response, Status,
};

/// The generated client and server (`tonic_build::manual`, see `build.rs`).
#[allow(missing_docs, unreachable_pub, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/bench.Echo.rs"));
}

use generated::{
    echo_client::EchoClient,
    echo_server::{Echo, EchoServer},
};

/// Largest encoded or decoded message either end accepts.
const MAX_MESSAGE_LEN: usize = 64 << 20;

/// Concurrent HTTP/2 streams the server allows per connection.
const MAX_STREAMS: u32 = 1024;

/// The request and the response: `message EchoMessage { bytes payload = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EchoMessage {
    /// The bytes to echo.
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) payload: Bytes,
}

/// The service: answers with the request's message.
#[derive(Clone, Copy, Debug)]
struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(&self, request: Request<EchoMessage>) -> Result<Response<EchoMessage>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

/// Binds `127.0.0.1:0` and returns the bound `host:port` and the server future.
pub(crate) async fn serve() -> io::Result<(String, ServeFuture)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    // `serve_with_incoming` ignores the builder's nodelay setting: the incoming
    // stream sets it on each accepted socket.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = EchoServer::new(EchoService)
        .max_decoding_message_size(MAX_MESSAGE_LEN)
        .max_encoding_message_size(MAX_MESSAGE_LEN);
    let router = Server::builder()
        .max_concurrent_streams(MAX_STREAMS)
        .add_service(service);
    let serve = async move {
        router
            .serve_with_incoming(incoming)
            .await
            .map_err(io::Error::other)
    };
    Ok((addr, Box::pin(serve)))
}

/// The generated client on one [`Channel`]; clones share the HTTP/2 connection.
#[derive(Clone, Debug)]
pub(crate) struct TonicCaller {
    client: EchoClient<Channel>,
}

/// Connects one channel to `addr` (`host:port`).
pub(crate) async fn connect(addr: &str) -> io::Result<TonicCaller> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(io::Error::other)?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(io::Error::other)?;
    let client = EchoClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_LEN)
        .max_encoding_message_size(MAX_MESSAGE_LEN);
    Ok(TonicCaller { client })
}

impl Caller for TonicCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        // `Bytes` fields: the request shares the payload's buffer, no copy.
        let request = EchoMessage {
            payload: payload.clone(),
        };
        let reply = self
            .client
            .echo(request)
            .await
            .map_err(|status| io::Error::other(status.to_string()))?;
        let got = reply.get_ref().payload.len();
        if got != payload.len() {
            return Err(wrong_length(payload.len(), got));
        }
        Ok(())
    }
}
