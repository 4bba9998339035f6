//! gRPC's interoperability suite on `grpc.testing.TestService`: the service
//! ([`server::InteropService`]) and the client cases ([`client::TestCase`]), shared by
//! the `interop-server` and `interop-client` binaries and `tests/interop.rs`.
//!
//! The cases follow gRPC's `doc/interop-test-descriptions.md`: the same requests, sizes
//! and checks, adapted where our protocol differs from gRPC over HTTP/2 (how, case by
//! case: `docs/interop.md`).
//!
//! ```no_run
//! use rpc_core::{compress::Compression, server::Server};
//! use rpc_examples::interop::{client::{Target, TestCase}, server::InteropService};
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
//! let uri = listener.local_addr_uri();
//! let server = Server::builder()
//!     .compression(Some(Compression::default()))? // for the compressed cases
//!     .add_service(InteropService::default().into_service())
//!     .build();
//! tokio::spawn(async move { server.serve(listener).await });
//!
//! let target = Target::connect(&uri).await?;
//! for case in TestCase::ALL {
//!     match case.run(&target).await {
//!         Ok(()) => println!("ok {case}"),
//!         Err(why) => println!("FAILED {case}: {why}"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - this module: what both sides agree on (metadata keys, payloads);
//! - [`server`]: `InteropService`, the `TestService` implementation;
//! - [`client`]: the list of cases, the channels they use, and how to run one;
//! - `cases`, `cancel_cases`, `compression_cases`: the cases themselves, one function
//!   each, and `support`, the checks and streams they share.

use rpc_core::bytes::Bytes;
use rpc_proto::testing::{Payload, PayloadType};

/// Fails the case with a formatted reason unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err(format!($($why)+));
        }
    };
}

mod cancel_cases;
mod cases;
pub mod client;
mod compression_cases;
pub mod server;
mod support;

/// Request metadata the server echoes back in its response headers.
pub const ECHO_INITIAL_KEY: &str = "x-grpc-test-echo-initial";

/// Request metadata (binary) the server echoes back in its trailers. On a unary call
/// our trailers travel with the headers, so a client finds it in the response metadata.
pub const ECHO_TRAILING_KEY: &str = "x-grpc-test-echo-trailing-bin";

/// A `COMPRESSABLE` payload of `len` zero bytes, as every interop message carries.
pub fn zeros(len: usize) -> Payload {
    Payload {
        r#type: PayloadType::Compressable as i32,
        body: Bytes::from(vec![0u8; len]),
    }
}
