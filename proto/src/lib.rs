//! The project's own `.proto` services, generated with `rpc-codegen`:
//!
//! - [`echo`]: `Echo` (`Say`, `Sleep`, `Fail`, and the streaming `Count`, `Sum` and
//!   `Chat`), used by the tour, the echo binaries and the tests to show deadlines,
//!   cancellation, errors and every streaming kind;
//! - [`kv`]: `KeyValue`, a small key-value store, with an in-memory implementation in
//!   [`kv::MemoryStore`];
//! - [`blob`]: `Blob`, large transfers through the bulk API (`rpc_core::bulk`);
//! - [`health`]: the standard `grpc.health.v1.Health` service and
//!   [`health::HealthReporter`] (`rpc_services::health`, re-exported: it moved to the
//!   `rpc-services` crate with server reflection);
//! - [`testing`]: gRPC's interop test service `grpc.testing.TestService` (implemented
//!   in `rpc-examples`, see `docs/interop.md`).
//!
//! The first three live in the protobuf package `rpc.examples.v1`; the modules below re-export
//! what belongs to each service.
//!
//! ```
//! use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
//! # fn f(channel: rpc_core::client::Channel) {
//! let client = EchoClient::new(channel);
//! # let _ = (client, SayRequest::default());
//! # }
//! ```

/// Everything generated for the protobuf package `rpc.examples.v1`.
#[allow(missing_docs, unreachable_pub)]
pub mod v1 {
    rpc_core::include_proto!("rpc.examples.v1");
}

/// Everything generated for the protobuf package `grpc.health.v1` (now
/// `rpc_services::health::v1`).
pub use rpc_services::health::v1 as grpc_health_v1;

/// Everything generated for the protobuf package `grpc.testing`.
#[allow(missing_docs, unreachable_pub)]
pub mod grpc_testing {
    rpc_core::include_proto!("grpc.testing");
}

pub mod blob;
pub mod echo;
pub use rpc_services::health;
pub mod kv;
pub mod testing;
