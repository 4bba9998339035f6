//! The core of the RPC framework: frames and their codec, status and metadata, the link
//! traits transports implement, the client [`Channel`](client::Channel) and the
//! [`Server`](server::Server).
//!
//! The core sees messages, never bytes: a transport hands it a [`Link`](link::Link)
//! that moves whole frames, and everything above (call ids, response matching,
//! deadlines, cancellation, limits, shutdown) is done here once for every transport.
//!
//! # Layout
//!
//! - [`frame`]: the wire format (see `docs/wire.md`), sans-IO encode and decode.
//! - [`status`], [`metadata`]: call outcomes and headers.
//! - [`endpoint`]: `Endpoint`, parsed from `tcp://`, `unix://`, `udp://`, `rdma://`,
//!   `static://`, `dns://` and `etcd://` URIs.
//! - [`link`]: the `Link`, `Connector` and `Listener` traits, and an in-memory
//!   transport ([`link::mem`]) for tests.
//! - [`client`]: `Channel` (one connection, many calls in flight), its driver task,
//!   the pending-call table, and `Client`, the typed layer under generated stubs.
//! - [`server`]: `Server::builder()`, the router, the per-connection task.
//! - [`balance`]: `Balanced`, power-of-two-choices over replicas by calls in flight,
//!   with ejection of unreachable ones.
//! - [`discover`]: an endpoint as a stream of replica changes (static lists, DNS).
//! - [`retry`]: the retry layer: idempotency-aware, with backoff and a budget.
//! - [`request`], [`method`]: what generated code and handlers see.
//! - [`codegen`]: the one module generated code names.
//!
//! # Example
//!
//! A server and a client over the in-memory transport, with a hand-written service
//! (generated code does the same through `rpc-codegen`):
//!
//! ```
//! use rpc_core::{client::{Channel, ClientCall}, server::{Server, ServerCall, ServerReply},
//!                link::mem, Status};
//! use tower::{service_fn, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (listener, connector) = mem::listener();
//! let echo = service_fn(|call: ServerCall| async move {
//!     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
//! });
//! let server = Server::builder().add_named_service("demo.Echo", echo).build();
//! tokio::spawn(async move { server.serve(listener).await });
//!
//! let mut channel = Channel::builder().connect(connector).await?;
//! let reply = channel.ready().await?.call(ClientCall {
//!     method: "demo.Echo/Say".into(),
//!     idempotency: Default::default(),
//!     metadata: Default::default(),
//!     timeout: None,
//!     call_key: None,
//!     payload: "hi".into(),
//!     stream: None,
//!     compress: None,
//! }).await?;
//! assert_eq!(reply.payload, "hi");
//! # Ok(()) }
//! ```

/// Includes the code `rpc-codegen` generated for a protobuf package, from `OUT_DIR`.
///
/// ```ignore
/// pub mod demo {
///     rpc_core::include_proto!("demo");
/// }
/// ```
///
/// The argument is the package name as prost names the file: `google.r#type` for
/// `google.type`, since `type` is a Rust keyword.
#[macro_export]
macro_rules! include_proto {
    ($package:tt) => {
        include!(concat!(env!("OUT_DIR"), concat!("/", $package, ".rs")));
    };
}

pub mod balance;
pub mod bulk;
mod bytestr;
pub mod client;
pub mod codegen;
pub mod compress;
pub mod discover;
pub mod endpoint;
mod error;
pub mod frame;
mod idmap;
pub mod intercept;
pub mod link;
pub mod metadata;
pub mod method;
pub mod payload;
pub mod request;
pub mod retry;
pub mod server;
pub mod status;
pub mod stream;

/// The `bytes` crate, whose [`Bytes`](bytes::Bytes) generated code uses for protobuf
/// `bytes` fields.
pub use bytes;
pub use bytestr::ByteStr;
pub use endpoint::Endpoint;
pub use error::{Error, ErrorKind};
pub use metadata::{Metadata, MetadataValue};
pub use payload::Payload;
pub use request::{IntoRequest, Request, Response};
pub use status::{Code, Status};
