//! [`Client`]: the typed layer under generated stubs.

use std::task::{Context, Poll};

use tower::{Service, ServiceExt};

use super::{ClientCall, ClientReply};
use crate::{
    bytestr::ByteStr,
    method::MethodDescriptor,
    request::{Request, Response},
    Status,
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
        let (metadata, timeout, message) = request.into_parts();
        let call = ClientCall {
            method: ByteStr::from_static(method.path),
            idempotency: method.idempotency,
            metadata,
            timeout,
            call_key: None,
            payload: crate::payload::encode(&message),
        };
        let reply = self.inner.ready().await?.call(call).await?;
        let message = R::decode(reply.payload).map_err(|err| {
            Status::internal(format!(
                "cannot decode the response of {}: {err}",
                method.path
            ))
        })?;
        Ok(Response::from_parts(reply.metadata, message))
    }
}
