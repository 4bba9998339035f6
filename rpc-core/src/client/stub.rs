//! [`Client`]: the typed layer under generated stubs.

use std::task::{Context, Poll};

use tower::Service;

use futures::{Stream, StreamExt};

use super::{ClientCall, ClientReply};
use crate::{
    bytestr::ByteStr,
    method::MethodDescriptor,
    request::{Request, Response},
    stream::{MessageStream, Streaming, TakeOnce},
    Metadata, Status,
};

/// Encodes requests and decodes responses around any `tower::Service<ClientCall>`:
/// a [`Channel`](super::Channel), or a channel under tower layers.
///
/// Generated stubs (`FooClient`) wrap one of these; it is also usable directly with a
/// [`MethodDescriptor`] for clients that are not generated.
#[derive(Clone, Debug)]
pub struct Client<T> {
    inner: T,
}

impl<T> Client<T> {
    /// Wraps a service.
    pub fn new(inner: T) -> Client<T> {
        Client { inner }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T> Client<T>
where
    T: Service<ClientCall, Response = ClientReply, Error = Status>,
{
    /// Waits until the service can take a call.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    /// Waits until the service takes a call, within the call's time budget `timeout`,
    /// or for a call without one within what is left of the default timeout of the
    /// channel that makes it wait (if it has one); the budget loses the time waited
    /// (and a call relying on the default then carries what is left of it). A call
    /// whose deadline passes while every in-flight slot is taken (calls to a server
    /// that answers nothing) fails `DEADLINE_EXCEEDED`, unprocessed, instead of
    /// waiting for a slot first. A service ready at once (the common case) costs no
    /// clock read. Its first poll is `intercept::ready_within_budget`'s, written out (through
    /// it, every generated unary call cost about 50 more instructions: the instruction
    /// guard); a wait goes on there.
    async fn ready_within(
        &mut self,
        timeout: &mut Option<std::time::Duration>,
    ) -> Result<(), Status> {
        let inner = &mut self.inner;
        if let Poll::Ready(ready) =
            std::future::poll_fn(|cx| Poll::Ready(inner.poll_ready(cx))).await
        {
            return ready;
        }
        crate::intercept::ready_within_budget(
            timeout,
            "waiting for room to send the call (every in-flight slot taken)",
            std::future::poll_fn(|cx| inner.poll_ready(cx)),
        )
        .await
    }

    /// Makes one unary call of `method`.
    pub async fn unary<M, R>(
        &mut self,
        request: Request<M>,
        method: &'static MethodDescriptor,
    ) -> Result<Response<R>, Status>
    where
        M: prost::Message,
        R: prost::Message + Default,
    {
        let compress = request.compress();
        let (metadata, mut timeout, message) = request.into_parts();
        self.ready_within(&mut timeout).await?;
        let call = ClientCall {
            method: ByteStr::from_static(method.path),
            idempotency: method.idempotency,
            metadata,
            timeout,
            call_key: None,
            payload: crate::payload::encode(&message),
            stream: None,
            compress,
        };
        let reply = self.inner.call(call).await?;
        let message = R::decode(reply.payload).map_err(|err| {
            Status::internal(format!(
                "cannot decode the response of {}: {err}",
                method.path
            ))
        })?;
        let mut response = Response::from_parts(reply.metadata, message);
        response.set_compressed(reply.compressed);
        Ok(response)
    }

    /// Makes a server-streaming call: one request message, a stream of responses.
    pub async fn server_streaming<M, R>(
        &mut self,
        request: Request<M>,
        method: &'static MethodDescriptor,
    ) -> Result<Response<Streaming<R>>, Status>
    where
        M: prost::Message,
        R: prost::Message + Default,
    {
        let (metadata, timeout, message) = request.into_parts();
        let payload = crate::payload::encode(&message);
        let messages: MessageStream = futures::stream::iter([payload]).boxed();
        self.open(metadata, timeout, messages, method).await
    }

    /// Makes a client-streaming call: a stream of request messages, one response.
    pub async fn client_streaming<S, M, R>(
        &mut self,
        request: Request<S>,
        method: &'static MethodDescriptor,
    ) -> Result<Response<R>, Status>
    where
        S: Stream<Item = M> + Send + 'static,
        M: prost::Message + 'static,
        R: prost::Message + Default,
    {
        let (metadata, mut responses) = self.streaming(request, method).await?.into_parts();
        let message = responses.message().await?.ok_or_else(|| {
            // A cardinality violation: UNIMPLEMENTED, as gRPC's status code table has it.
            Status::unimplemented(format!("{} ended without a response message", method.path))
        })?;
        // Read to the end: the call is only over with the server's status.
        if responses.message().await?.is_some() {
            return Err(Status::unimplemented(format!(
                "{} sent more than one response message",
                method.path
            )));
        }
        let trailers = responses.trailers().cloned().unwrap_or_default();
        let mut response = Response::from_parts(metadata, message);
        *response.trailers_mut() = trailers;
        Ok(response)
    }

    /// Makes a bidirectional streaming call: a stream of request messages, a stream of
    /// responses. Requests are sent as the server's credit allows; the call ends when
    /// the server sends its status.
    pub async fn streaming<S, M, R>(
        &mut self,
        request: Request<S>,
        method: &'static MethodDescriptor,
    ) -> Result<Response<Streaming<R>>, Status>
    where
        S: Stream<Item = M> + Send + 'static,
        M: prost::Message + 'static,
        R: prost::Message + Default,
    {
        let (metadata, timeout, messages) = request.into_parts();
        let messages: MessageStream = messages
            .map(|message| crate::payload::encode(&message))
            .boxed();
        self.open(metadata, timeout, messages, method).await
    }

    async fn open<R>(
        &mut self,
        metadata: Metadata,
        mut timeout: Option<std::time::Duration>,
        messages: MessageStream,
        method: &'static MethodDescriptor,
    ) -> Result<Response<Streaming<R>>, Status>
    where
        R: prost::Message + Default,
    {
        self.ready_within(&mut timeout).await?;
        let call = ClientCall {
            method: ByteStr::from_static(method.path),
            idempotency: method.idempotency,
            metadata,
            timeout,
            call_key: None,
            payload: crate::Payload::new(),
            stream: Some(TakeOnce::new(messages)),
            compress: None,
        };
        let reply = self.inner.call(call).await?;
        let raw = reply.stream.and_then(|s| s.take()).ok_or_else(|| {
            Status::internal(format!("{} answered without a stream", method.path))
        })?;
        Ok(Response::from_parts(reply.metadata, Streaming::new(raw)))
    }
}
