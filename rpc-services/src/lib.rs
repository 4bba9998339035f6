//! gRPC's standard services for `rpc-core` servers:
//!
//! - [`health`]: `grpc.health.v1.Health` (`Check`, `List`, `Watch`) and
//!   [`health::HealthReporter`], which the server updates as its services go up and
//!   down (what `grpc_health_probe` and load balancers ask);
//! - [`reflection`]: server reflection, `grpc.reflection.v1.ServerReflection` and
//!   `grpc.reflection.v1alpha.ServerReflection` (what `grpcurl`, `grpc_cli` and
//!   `grpcio-reflection` ask to list services and fetch their descriptors).
//!
//! Both are ordinary generated services, so they work over every wire a server
//! serves (`tcp://`, `unix://`, `tls://`, `udp://`, `rdma://`, `grpc://`).
//!
//! ```
//! use rpc_core::{client::Channel, link::mem, server::Server};
//! use rpc_services::{
//!     health::HealthReporter,
//!     reflection::v1::{
//!         server_reflection_client::ServerReflectionClient,
//!         server_reflection_request::MessageRequest,
//!         server_reflection_response::MessageResponse, ServerReflectionRequest,
//!     },
//!     ServerBuilderExt,
//! };
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let health = HealthReporter::new();
//! let server = Server::builder()
//!     .add_service(health.service()) // your services: .add_service(EchoServer::new(..))
//!     .add_reflection() // last: it describes the services added before it
//!     .build();
//!
//! // In memory here; any transport does the same.
//! let (listener, connector) = mem::listener();
//! tokio::spawn(async move { server.serve(listener).await });
//! let mut client = ServerReflectionClient::new(Channel::builder().connect(connector).await?);
//! let list = ServerReflectionRequest {
//!     host: String::new(),
//!     message_request: Some(MessageRequest::ListServices(String::new())),
//! };
//! let mut answers = client
//!     .server_reflection_info(futures::stream::iter([list]))
//!     .await?
//!     .into_inner();
//! let answer = answers.message().await?.and_then(|a| a.message_response);
//! let Some(MessageResponse::ListServicesResponse(services)) = answer else {
//!     panic!("not a list: {answer:?}");
//! };
//! let names: Vec<&str> = services.service.iter().map(|s| s.name.as_str()).collect();
//! assert_eq!(
//!     names,
//!     [
//!         "grpc.health.v1.Health",
//!         "grpc.reflection.v1.ServerReflection",
//!         "grpc.reflection.v1alpha.ServerReflection",
//!     ]
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! - `health`: the health service and its reporter;
//! - `reflection`: the public API of reflection ([`reflection::Reflection`], its
//!   builder, [`ServerBuilderExt`]) and the generated code of both versions;
//! - `reflection/index`: the descriptors and symbols, and the answer to each request
//!   (plain data, no IO);
//! - `reflection/service`: the bidirectional stream of each version over that index.
//!
//! The `.proto` files are gRPC's, unmodified (Apache-2.0, `proto/README.md`).

pub mod health;
pub mod reflection;

pub use reflection::ServerBuilderExt;
