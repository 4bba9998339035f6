//! gRPC's interoperability test service, `grpc.testing.TestService`, from the
//! unmodified `grpc/testing/test.proto` (with `empty.proto` and `messages.proto`).
//!
//! `TestService` has a method of every kind (unary, server, client and bidirectional
//! streaming) and messages whose fields tell the server what to answer: payload sizes,
//! a status to fail with, whether to compress. `UnimplementedService` exists to be
//! served by nobody. The implementation and the interop cases are in `rpc-examples`
//! (`examples/src/interop/`, guide in `docs/interop.md`).
//!
//! The other services of `test.proto` (reconnect, load-balancer stats, xDS hooks) and
//! their messages are generated too, in [`crate::grpc_testing`].
//!
//! ```
//! use rpc_proto::testing::{test_service_client::TestServiceClient, Empty};
//! # fn f(channel: rpc_core::client::Channel) {
//! let client = TestServiceClient::new(channel);
//! # let _ = (client, Empty::default());
//! # }
//! ```

pub use crate::grpc_testing::{
    test_service_client, test_service_methods, test_service_server, unimplemented_service_client,
    unimplemented_service_methods, unimplemented_service_server, BoolValue, EchoStatus, Empty,
    Payload, PayloadType, ResponseParameters, SimpleRequest, SimpleResponse,
    StreamingInputCallRequest, StreamingInputCallResponse, StreamingOutputCallRequest,
    StreamingOutputCallResponse,
};
