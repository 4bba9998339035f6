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
//! - [`endpoint`]: `Endpoint`, parsed from `tcp://`, `tls://`, `unix://`, `tls+unix://`,
//!   `udp://`, `rdma://`, `rdma+unix://`, `grpc://` and `grpcs://` URIs (one server),
//!   and `static://`, `dns://` (with `dns+tcp://`, `dns+tls://`, `dns+grpc://`,
//!   `dns+grpcs://`, `dns+udp://` and `dns+rdma://` for the replicas' transport) and
//!   `etcd://` URIs (a service's replicas).
//! - [`link`]: the `Link`, `Connector` and `Listener` traits, and an in-memory
//!   transport ([`link::mem`]) for tests.
//! - [`client`]: `Channel` (one connection, many calls in flight), its driver task,
//!   the pending-call table, and `Client`, the typed layer under generated stubs.
//! - [`server`]: `Server::builder()`, the router, the per-connection task.
//! - [`balance`]: `Balanced`, power-of-two-choices over replicas by calls in flight,
//!   with ejection of unreachable ones.
//! - [`discover`]: an endpoint as a stream of replica changes (static lists, DNS).
//! - [`retry`]: the retry layer: idempotency-aware, with backoff and a budget.
//! - [`into_status`]: tower's own middleware (load shedding, timeouts, limits) in a
//!   server's or client's stack, its errors mapped to statuses.
//! - [`request`], [`method`]: what generated code and handlers see; [`peer`]: who is
//!   calling (address, Unix credentials, verified TLS identity); [`extensions`]: values
//!   a server layer hands the handler (a user id, a tenant).
//! - [`auth`]: authentication and authorization as tower layers: per-call credentials
//!   on the client, bearer tokens and allow-lists by identity, principal or role on
//!   the server.
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

/// Includes all the code `rpc-codegen` generated in this build script's `OUT_DIR`: one
/// module per protobuf package, nested as the package's name (`a::v1` for `package
/// a.v1;`), which is what lets one package's messages use another's. Reads the file
/// `rpc_codegen::DEFAULT_INCLUDE_FILE` that `compile` writes.
///
/// ```ignore
/// rpc_core::include_protos!();
/// use a::v1::{x_client::XClient, X};
/// ```
///
/// A package whose first segment is the name of a crate (`package rpc_core.v1;`, a
/// vendored `tokio.x`) makes a module of that name where the macro is expanded, and
/// paths that start with it become ambiguous there (rustc's E0659), this macro's own
/// included: name the crate absolutely, `::rpc_core::include_protos!()`, as the
/// generated code does.
#[macro_export]
macro_rules! include_protos {
    () => {
        include!(concat!(env!("OUT_DIR"), "/_rpc_includes.rs"));
    };
}

/// Includes the code `rpc-codegen` generated for one protobuf package, from `OUT_DIR`.
/// Only for a package that uses no other package's messages: generated code names
/// other packages by relative paths, so prefer [`include_protos!`], which nests every
/// package's module as its name says.
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

pub mod auth;
pub mod balance;
pub mod bulk;
mod bytestr;
pub mod client;
pub mod codegen;
pub mod compress;
pub mod discover;
pub mod endpoint;
mod error;
pub mod extensions;
pub mod frame;
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
mod idmap;
pub mod intercept;
pub mod into_status;
mod keepalive;
pub mod link;
pub mod logs;
pub mod metadata;
pub mod method;
pub mod payload;
pub mod peer;
pub mod request;
pub mod retry;
pub mod server;
pub mod status;
pub mod stream;

/// The `bytes` crate, whose [`Bytes`](bytes::Bytes) generated code uses for protobuf
/// `bytes` fields.
pub use auth::Principal;
pub use bytes;
pub use bytestr::ByteStr;
pub use endpoint::Endpoint;
pub use error::{Error, ErrorKind};
pub use extensions::Extensions;
pub use metadata::{Metadata, MetadataValue};
pub use payload::Payload;
pub use peer::Peer;
pub use request::{IntoRequest, Request, Response};
pub use status::{Code, Status};
