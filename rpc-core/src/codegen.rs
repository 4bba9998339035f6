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
pub use futures::Stream;
pub use prost;
/// Protobuf's well-known types (`google.protobuf.Timestamp`, `Duration`, `Any`, ...):
/// generated code maps `.google.protobuf` here, so users need no `prost-types` dependency.
pub use prost_types;
pub use tower::Service;

pub use crate::{
    client::{Channel, Client, ClientCall, ClientReply, FromChannel},
    method::{Idempotency, MethodDescriptor},
    payload::encode,
    request::{IntoRequest, IntoStreamingRequest, Request, Response},
    retry::{Retry, RetryPolicy},
    server::{NamedService, ServerCall, ServerReply},
    stream::{Streaming, TakeOnce},
    Status,
};

/// Wraps a client's service in the retry layer (`FooClient::with_retries`).
pub fn retrying<S>(inner: S, policy: RetryPolicy) -> Retry<S> {
    use tower::Layer;
    crate::retry::RetryLayer::new(policy).layer(inner)
}

/// The boxed future generated servers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Decodes a request for a generated server, mapping failure to `INTERNAL` (what gRPC's
/// implementations answer for a request that does not parse: `INVALID_ARGUMENT` is left
/// to applications, which gRPC's status code table says libraries never generate).
pub fn decode_request<M: prost::Message + Default>(call: ServerCall) -> Result<Request<M>, Status> {
    if call.stream.is_some() {
        return Err(Status::unimplemented(format!(
            "{} is a unary method but was called as a stream",
            call.method
        )));
    }
    let message = M::decode(call.payload).map_err(|err| {
        Status::internal(format!(
            "cannot decode the request of {}: {err}",
            call.method
        ))
    })?;
    let mut request = Request::from_parts(call.metadata, call.timeout, message);
    request.set_compressed(call.compressed);
    request.set_bulk(call.bulk);
    request.set_peer(call.peer);
    request.set_principal(call.principal);
    *request.extensions_mut() = call.extensions;
    Ok(request)
}

/// The request of a unary method, for a generated server: the payload of a unary
/// call, or the one message of a call made as a stream. Wires that cannot tell unary
/// calls from streams (gRPC's: `rpc-transport-grpc` makes every call a stream) so
/// reach unary methods; no message or more than one is `UNIMPLEMENTED` (a cardinality
/// violation, as gRPC's status code table has it).
pub async fn unary_request<M: prost::Message + Default>(
    call: ServerCall,
) -> Result<Request<M>, Status> {
    if call.stream.is_some() {
        // Boxed: reading a one-message stream takes a future several times the size of
        // a request, and every unary handler's future (boxed per call by the generated
        // server) would otherwise reserve and move that space for the rare stream.
        Box::pin(single_request(call)).await
    } else {
        decode_request(call)
    }
}

/// Encodes a handler's response for a generated server.
pub fn encode_response<M: prost::Message>(
    result: Result<Response<M>, Status>,
) -> Result<ServerReply, Status> {
    let mut response = result?;
    let trailers = response.take_trailers();
    let compress = response.compress();
    let (metadata, message) = response.into_parts();
    Ok(ServerReply {
        metadata,
        payload: encode(&message),
        trailers,
        compress,
        ..ServerReply::default()
    })
}

/// The request stream of a streaming call, for a generated server.
pub fn streaming_request<M: prost::Message + Default>(
    call: ServerCall,
) -> Result<Request<Streaming<M>>, Status> {
    let raw = call.stream.and_then(|s| s.take()).ok_or_else(|| {
        Status::unimplemented(format!(
            "{} is a streaming method but was called as a unary one",
            call.method
        ))
    })?;
    let messages = Streaming::requests(raw, call.method);
    let mut request = Request::from_parts(call.metadata, call.timeout, messages);
    request.set_bulk(call.bulk);
    request.set_peer(call.peer);
    request.set_principal(call.principal);
    *request.extensions_mut() = call.extensions;
    Ok(request)
}

/// The one request message of a server-streaming call, for a generated server.
pub async fn single_request<M: prost::Message + Default>(
    call: ServerCall,
) -> Result<Request<M>, Status> {
    let method = call.method.clone();
    let bulk = call.bulk.clone();
    let peer = call.peer.clone();
    let principal = call.principal.clone();
    let mut streaming = streaming_request::<M>(call)?;
    let extensions = std::mem::take(streaming.extensions_mut());
    let (metadata, timeout, mut messages) = streaming.into_parts();
    let message = messages.message().await?.ok_or_else(|| {
        Status::unimplemented(format!("{method}: the stream ended without its request"))
    })?;
    let compressed = messages.last_compressed();
    if messages.message().await?.is_some() {
        return Err(Status::unimplemented(format!(
            "{method} takes one request message, not several"
        )));
    }
    let mut request = Request::from_parts(metadata, timeout, message);
    request.set_compressed(compressed);
    request.set_bulk(bulk);
    request.set_peer(peer);
    request.set_principal(principal);
    *request.extensions_mut() = extensions;
    Ok(request)
}

/// Encodes a handler's response stream for a generated server.
pub fn encode_stream_response<S, M>(
    result: Result<Response<S>, Status>,
) -> Result<ServerReply, Status>
where
    S: Stream<Item = Result<M, Status>> + Send + 'static,
    M: prost::Message,
{
    use futures::StreamExt;
    let mut response = result?;
    let trailers = response.take_trailers();
    let (metadata, messages) = response.into_parts();
    let messages = messages.map(|item| item.map(|message| encode(&message)));
    Ok(ServerReply {
        metadata,
        stream: Some(TakeOnce::new(messages.boxed())),
        trailers,
        ..ServerReply::default()
    })
}

/// The answer of a generated server to a method its service does not have.
pub fn unimplemented(call: &ServerCall) -> Status {
    Status::unimplemented(format!(
        "unknown method {}",
        crate::status::quoted(&call.method)
    ))
}
