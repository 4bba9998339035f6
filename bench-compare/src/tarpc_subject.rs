//! tarpc: `#[tarpc::service] trait Echo { async fn echo(payload: Vec<u8>) -> Vec<u8>; }`
//! over `tarpc::serde_transport` with the `Bincode` codec on length-delimited frames,
//! on one TCP loopback connection (`TCP_NODELAY` on both ends).
//!
//! - Server: a `BaseChannel` per connection on the harness's server thread; each
//!   request's handler is a task on its `current_thread` runtime (tarpc's documented
//!   way to handle requests concurrently).
//! - Client: one `EchoClient` (one connection, its dispatch task on the client
//!   thread's runtime); clones share it, so the throughput workload's 256 calls in
//!   flight are multiplexed on that connection.
//!
//! Settings changed from tarpc's defaults, so that limits are not what is measured:
//! the frame length limit raised from tokio-util's 8 MiB to 64 MiB (the bulk workload
//! sends 16 MiB payloads), the client's `pending_request_buffer` and the server's
//! `pending_response_buffer` raised from 100 to 1024 (above the 256 in flight). Each
//! call uses `context::current()` (a 10 s deadline). `Vec<u8>` goes through serde as a
//! sequence of bytes, as the service definition asks (`serde_bytes` would be faster).

use std::io;

use bytes::Bytes;
use futures::StreamExt as _;
use rpc_bench::{subjects::wrong_length, Caller, ServeFuture};
use tarpc::{
    client, context, serde_transport,
    server::{self, BaseChannel, Channel as _},
    tokio_serde::formats::Bincode,
    tokio_util::codec::length_delimited::{self, LengthDelimitedCodec},
};
use tokio::net::{TcpListener, TcpStream};

/// The service definition, and the client and server glue tarpc generates for it.
#[allow(missing_docs, unreachable_pub, clippy::all)]
mod service {
    /// An echo.
    #[tarpc::service]
    pub(crate) trait Echo {
        /// Returns `payload`.
        async fn echo(payload: Vec<u8>) -> Vec<u8>;
    }
}

use service::{Echo, EchoClient};

/// Largest frame either end accepts.
const MAX_FRAME_LEN: usize = 64 << 20;

/// Requests (client) and responses (server) queued between the API and the
/// connection: above the throughput workload's 256 in flight.
const QUEUE_LEN: usize = 1024;

/// The length-delimited framing both ends use.
fn framing() -> length_delimited::Builder {
    let mut builder = LengthDelimitedCodec::builder();
    builder.max_frame_length(MAX_FRAME_LEN);
    builder
}

/// The service: answers with the request's payload.
#[derive(Clone, Copy, Debug)]
struct EchoService;

impl Echo for EchoService {
    async fn echo(self, _: context::Context, payload: Vec<u8>) -> Vec<u8> {
        payload
    }
}

/// Binds `127.0.0.1:0` and returns the bound `host:port` and the accept loop.
pub(crate) async fn serve() -> io::Result<(String, ServeFuture)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let serve = async move {
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let transport = serde_transport::new(framing().new_framed(stream), Bincode::default());
            let config = server::Config {
                pending_response_buffer: QUEUE_LEN,
            };
            let requests = BaseChannel::new(config, transport)
                .execute(EchoService.serve())
                .for_each(|response| async move {
                    tokio::spawn(response);
                });
            tokio::spawn(requests);
        }
    };
    Ok((addr, Box::pin(serve)))
}

/// The generated client; clones share the connection.
#[derive(Clone, Debug)]
pub(crate) struct TarpcCaller {
    client: EchoClient,
}

/// Connects one client to `addr` (`host:port`) and spawns its dispatch task on the
/// current runtime.
pub(crate) async fn connect(addr: &str) -> io::Result<TarpcCaller> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let transport = serde_transport::new(framing().new_framed(stream), Bincode::default());
    let mut config = client::Config::default();
    config.pending_request_buffer = QUEUE_LEN;
    Ok(TarpcCaller {
        client: EchoClient::new(config, transport).spawn(),
    })
}

impl Caller for TarpcCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        // The service takes a Vec<u8>, so each call copies the payload once.
        let echo = self
            .client
            .echo(context::current(), payload.to_vec())
            .await
            .map_err(io::Error::other)?;
        if echo.len() != payload.len() {
            return Err(wrong_length(payload.len(), echo.len()));
        }
        Ok(())
    }
}
