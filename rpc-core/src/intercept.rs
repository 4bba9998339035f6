//! Interceptors: code that sees every call's full method name and metadata before the
//! call runs (server) or is sent (client), may change the metadata, and may reject the
//! call with a status. Async, so an interceptor can look a token up in a cache or ask
//! another service.
//!
//! An [`Interceptor`] becomes a tower layer with [`InterceptLayer`], which works on both
//! sides: `Server::builder().layer(InterceptLayer::new(auth))` and
//! `ServiceBuilder::new().layer(InterceptLayer::new(token)).service(channel)`.
//! Streaming calls are intercepted once, when they open.
//!
//! ```
//! use rpc_core::{intercept::{interceptor_fn, InterceptLayer}, Metadata, Status};
//!
//! // Rejects calls without a token, except the health checks.
//! let auth = interceptor_fn(|method: &str, metadata: &mut Metadata| {
//!     if method.starts_with("grpc.health.v1.Health/") || metadata.get_str("x-token") == Some("s3cret") {
//!         Ok(())
//!     } else {
//!         Err(Status::unauthenticated(format!("{method} needs x-token")))
//!     }
//! });
//! let layer = InterceptLayer::new(auth);
//! // Server::builder().layer(layer).add_service(..)
//! # drop(layer);
//! ```

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tower::{Layer, Service};

use crate::{
    client::{ClientCall, ClientReply},
    server::{ServerCall, ServerReply},
    Metadata, Status,
};

/// Sees a call's method (`package.Service/Method`) and metadata; `Err` rejects the
/// call with that status (on the server the handler does not run; on the client
/// nothing is sent). Implement it with an `async fn`:
///
/// ```
/// use rpc_core::{intercept::Interceptor, Metadata, Status};
///
/// #[derive(Clone)]
/// struct AddToken;
///
/// impl Interceptor for AddToken {
///     async fn intercept(&self, _method: &str, metadata: &mut Metadata) -> Result<(), Status> {
///         // e.g. fetch or refresh a token here
///         metadata.insert("x-token", "s3cret").map_err(|e| Status::internal(e.to_string()))
///     }
/// }
/// ```
pub trait Interceptor: Clone + Send + Sync + 'static {
    /// Inspects (and may change) the metadata of a call to `method`.
    fn intercept<'a>(
        &'a self,
        method: &'a str,
        metadata: &'a mut Metadata,
    ) -> impl Future<Output = Result<(), Status>> + Send + 'a;
}

/// An [`Interceptor`] from a synchronous function: see [`interceptor_fn`].
#[derive(Clone)]
pub struct InterceptorFn<F>(F);

impl<F> fmt::Debug for InterceptorFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InterceptorFn(..)")
    }
}

/// An interceptor from a function of the method and metadata.
pub fn interceptor_fn<F>(f: F) -> InterceptorFn<F>
where
    F: Fn(&str, &mut Metadata) -> Result<(), Status> + Clone + Send + Sync + 'static,
{
    InterceptorFn(f)
}

impl<F> Interceptor for InterceptorFn<F>
where
    F: Fn(&str, &mut Metadata) -> Result<(), Status> + Clone + Send + Sync + 'static,
{
    fn intercept<'a>(
        &'a self,
        method: &'a str,
        metadata: &'a mut Metadata,
    ) -> impl Future<Output = Result<(), Status>> + Send + 'a {
        std::future::ready((self.0)(method, metadata))
    }
}

/// A tower layer that runs an [`Interceptor`] in front of a server's services or a
/// client's channel.
#[derive(Clone, Debug)]
pub struct InterceptLayer<I> {
    interceptor: I,
}

impl<I> InterceptLayer<I> {
    /// A layer running `interceptor`.
    pub fn new(interceptor: I) -> Self {
        InterceptLayer { interceptor }
    }
}

impl<S, I: Clone> Layer<S> for InterceptLayer<I> {
    type Service = Intercepted<S, I>;

    fn layer(&self, inner: S) -> Intercepted<S, I> {
        Intercepted {
            inner,
            interceptor: self.interceptor.clone(),
        }
    }
}

/// A service behind an [`Interceptor`]; made by [`InterceptLayer`].
#[derive(Clone, Debug)]
pub struct Intercepted<S, I> {
    inner: S,
    interceptor: I,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, I> Service<ServerCall> for Intercepted<S, I>
where
    S: Service<ServerCall, Response = ServerReply, Error = Status> + Clone + Send + 'static,
    S::Future: Send + 'static,
    I: Interceptor,
{
    type Response = ServerReply;
    type Error = Status;
    type Future = BoxFuture<Result<ServerReply, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ServerCall) -> Self::Future {
        // The ready service serves this call; the clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let interceptor = self.interceptor.clone();
        Box::pin(async move {
            interceptor
                .intercept(&call.method, &mut call.metadata)
                .await?;
            inner.call(call).await
        })
    }
}

impl<S, I> Service<ClientCall> for Intercepted<S, I>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status> + Clone + Send + 'static,
    S::Future: Send + 'static,
    I: Interceptor,
{
    type Response = ClientReply;
    type Error = Status;
    type Future = BoxFuture<Result<ClientReply, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ClientCall) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let interceptor = self.interceptor.clone();
        Box::pin(async move {
            interceptor
                .intercept(&call.method, &mut call.metadata)
                .await?;
            inner.call(call).await
        })
    }
}
