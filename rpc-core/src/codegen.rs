//! Everything generated code names, re-exported in one place so that a crate using
//! generated code depends on `rpc-core` only (messages derive through the re-exported
//! `prost`, well-known types come from the re-exported `prost_types`).
//!
//! Not a public API for people: its contents follow what the generator emits.

pub use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

pub use bytes::Bytes;
pub use prost;
/// Protobuf's well-known types (`google.protobuf.Timestamp`, `Duration`, `Any`, ...):
/// generated code maps `.google.protobuf` here, so users need no `prost-types` dependency.
pub use prost_types;
pub use tower::Service;

pub use crate::{
    client::{Channel, Client, ClientCall, ClientReply},
    method::{Idempotency, MethodDescriptor},
    payload::encode,
    request::{IntoRequest, Request, Response},
    retry::{Retry, RetryPolicy},
    server::{NamedService, ServerCall, ServerReply},
    Status,
};

/// Wraps a client's service in the retry layer (`FooClient::with_retries`).
pub fn retrying<S>(inner: S, policy: RetryPolicy) -> Retry<S> {
    use tower::Layer;
    crate::retry::RetryLayer::new(policy).layer(inner)
}

/// The boxed future generated servers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Decodes a request for a generated server, mapping failure to `INVALID_ARGUMENT`.
pub fn decode_request<M: prost::Message + Default>(call: ServerCall) -> Result<Request<M>, Status> {
    let message = M::decode(call.payload).map_err(|err| {
        Status::invalid_argument(format!(
            "cannot decode the request of {}: {err}",
            call.method
        ))
    })?;
    Ok(Request::from_parts(call.metadata, call.timeout, message))
}

/// Encodes a handler's response for a generated server.
pub fn encode_response<M: prost::Message>(
    result: Result<Response<M>, Status>,
) -> Result<ServerReply, Status> {
    let (metadata, message) = result?.into_parts();
    Ok(ServerReply {
        metadata,
        payload: encode(&message),
    })
}

/// The answer of a generated server to a method its service does not have.
pub fn unimplemented(call: &ServerCall) -> Status {
    Status::unimplemented(format!("unknown method {}", call.method))
}
