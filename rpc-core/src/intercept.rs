//! Interceptors: code that sees every call's full method name and metadata before the
//! call runs (server) or is sent (client), may change the metadata, and may reject the
//! call with a status. Async, so an interceptor can look a token up in a cache or ask
//! another service.
//!
//! An [`Interceptor`] becomes a tower layer with [`InterceptLayer`], which works on both
//! sides: `Server::builder().layer(InterceptLayer::new(auth))` and
//! `ServiceBuilder::new().layer(InterceptLayer::new(token)).service(channel)`.
//! Streaming calls are intercepted once, when they open. [`for_methods`] applies any
//! tower layer (an interceptor or another) to some methods only.
//!
//! An interceptor sees the method and the metadata. To hand the handler something it
//! learned (a user id from a token, a tenant), use a tower layer over
//! [`ServerCall`] instead, which sees the whole call: insert into
//! [`ServerCall::extensions`], and the handler finds it in
//! [`Request::extensions`](crate::Request::extensions) (see [`crate::extensions`]).
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
    sync::Arc,
    task::{Context, Poll},
};

use tower::{Layer, Service};

use crate::{client::ClientCall, server::ServerCall, Metadata, Status};

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
///
/// ```
/// use rpc_core::{intercept::{interceptor_fn, InterceptLayer}, Code, Metadata, Request, Status};
/// use rpc_core::{client::{Channel, Client}, link::mem, server::Server};
/// use tower::Layer;
/// # use rpc_core::{method::{Idempotency, MethodDescriptor}, server::{ServerCall, ServerReply}};
/// # static SAY: MethodDescriptor = MethodDescriptor { service: "demo.Echo", method: "Say",
/// #     path: "demo.Echo/Say", idempotency: Idempotency::NoSideEffects };
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let echo = tower::service_fn(|call: ServerCall| async move {
/// #     Ok::<_, Status>(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
/// # });
/// // The server rejects calls without the token ...
/// let auth = interceptor_fn(|method: &str, md: &mut Metadata| match md.get_str("x-token") {
///     Some("s3cret") => Ok(()),
///     _ => Err(Status::unauthenticated(format!("{method} needs x-token"))),
/// });
/// let (listener, connector) = mem::listener();
/// let server = Server::builder().layer(InterceptLayer::new(auth)).add_named_service("demo.Echo", echo);
/// tokio::spawn(server.serve(listener));
/// // ... and the client adds it to every call.
/// let token = interceptor_fn(|_method: &str, metadata: &mut Metadata| {
///     metadata.insert("x-token", "s3cret").map_err(|err| Status::internal(err.to_string()))
/// });
/// let channel = Channel::builder().connect(connector).await?;
/// let mut client = Client::new(InterceptLayer::new(token).layer(channel.clone()));
/// client.unary::<_, String>(Request::new("hi".to_string()), &SAY).await?;
/// let refused = Client::new(channel).unary::<String, String>(Request::new("hi".into()), &SAY).await;
/// assert_eq!(refused.unwrap_err().code(), Code::UNAUTHENTICATED); // no token
/// # Ok(()) }
/// ```
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

/// What interceptors and [`for_methods`] see of a call, on either side: implemented
/// by [`ServerCall`] and [`ClientCall`] (and nothing else: the trait is sealed).
pub trait CallHead: Send + 'static + sealed::Sealed {
    /// `package.Service/Method`.
    fn method(&self) -> &str;
    /// The method and the metadata, the latter mutable.
    fn head_mut(&mut self) -> (&str, &mut Metadata);
    /// The call's time budget, which a layer that waits before it forwards the call
    /// spends ([`within_budget`]).
    #[doc(hidden)]
    fn timeout_mut(&mut self) -> &mut Option<std::time::Duration>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::server::ServerCall {}
    impl Sealed for crate::client::ClientCall {}
}

impl CallHead for ServerCall {
    fn method(&self) -> &str {
        &self.method
    }

    fn head_mut(&mut self) -> (&str, &mut Metadata) {
        (&self.method, &mut self.metadata)
    }

    fn timeout_mut(&mut self) -> &mut Option<std::time::Duration> {
        &mut self.timeout
    }
}

impl CallHead for ClientCall {
    fn method(&self) -> &str {
        &self.method
    }

    fn head_mut(&mut self) -> (&str, &mut Metadata) {
        (&self.method, &mut self.metadata)
    }

    fn timeout_mut(&mut self) -> &mut Option<std::time::Duration> {
        &mut self.timeout
    }
}

/// Runs `wait`, work a layer does before it forwards a call (an interceptor, a
/// credential fetched, a wait for the inner service's readiness), within the call's
/// time budget `timeout`, and takes the time it took out of the budget: what is under
/// the layer (the channel, whose deadline starts when it is called) gets what is left,
/// so that the call's timeout bounds the whole call, as `Request::with_timeout`
/// promises (from a review: a token source taking 30 s delayed a call of 500 ms by
/// 30 s, which then had its 500 ms afresh). Past the budget: `DEADLINE_EXCEEDED`,
/// marked unprocessed (the call was not forwarded). Without a budget, `wait` alone;
/// and a `wait` ready at its first poll (a synchronous interceptor, a cached token, a
/// service with room: the common case) reads no clock either.
pub(crate) async fn within_budget<T>(
    timeout: &mut Option<std::time::Duration>,
    what: &str,
    wait: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let Some(budget) = *timeout else {
        return wait.await;
    };
    let mut wait = std::pin::pin!(wait);
    if let Poll::Ready(result) = futures::poll!(wait.as_mut()) {
        return result;
    }
    bounded(timeout, budget, true, what, wait).await
}

/// [`within_budget`] for a wait for a service's readiness (a channel's free in-flight
/// slot, under whatever layers): a call without a timeout of its own waits at most
/// what is left of the default timeout of the channel that makes it wait
/// (`ChannelBuilder::timeout`, which the channel says while this polls:
/// `channel::noting_default_budget`), and is then sent with none, the channel applying
/// its default as it does to any call. Only readiness is polled so: a wait that makes
/// calls of its own (an interceptor fetching a token) would take a default from
/// another channel.
pub(crate) async fn ready_within_budget(
    timeout: &mut Option<std::time::Duration>,
    what: &str,
    wait: impl Future<Output = Result<(), Status>>,
) -> Result<(), Status> {
    if timeout.is_some() {
        return within_budget(timeout, what, wait).await;
    }
    let mut wait = std::pin::pin!(wait);
    let (poll, default) = std::future::poll_fn(|cx| {
        Poll::Ready(crate::client::channel::noting_default_budget(|| {
            wait.as_mut().poll(cx)
        }))
    })
    .await;
    if let Poll::Ready(result) = poll {
        return result;
    }
    match default {
        // (The call keeps no timeout: the default is not its own, which a retry layer
        // below would take for a deadline of the whole call.)
        Some(default) => bounded(&mut None, default, false, what, wait).await,
        None => wait.await,
    }
}

/// The rest of a wait that did not end at its first poll, bounded by `budget` (the
/// call's own, `own`, or what was left of a channel's default); what is left of it
/// goes back in `timeout`. A call with less than the wire's microsecond left fails
/// here, as it would when written (`frame::MIN_WIRE_TIMEOUT`), rather than be
/// forwarded to fail below.
async fn bounded<T>(
    timeout: &mut Option<std::time::Duration>,
    budget: std::time::Duration,
    own: bool,
    what: &str,
    wait: std::pin::Pin<&mut impl Future<Output = Result<T, Status>>>,
) -> Result<T, Status> {
    let out_of_time = || {
        Status::deadline_exceeded(if own {
            format!("deadline exceeded ({budget:?}) while {what}, before the call was sent")
        } else {
            format!(
                "the channel's default timeout ran out ({budget:?} of it left when the wait \
                 began) while {what}, before the call was sent"
            )
        })
        .into_unprocessed()
    };
    let began = tokio::time::Instant::now();
    match tokio::time::timeout(budget, wait).await {
        Ok(result) => {
            let left = budget.saturating_sub(began.elapsed());
            if result.is_ok() && left < crate::frame::MIN_WIRE_TIMEOUT {
                return Err(out_of_time());
            }
            if own {
                *timeout = Some(left);
            }
            result
        }
        Err(_) => Err(out_of_time()),
    }
}

impl<S, I, R> Service<R> for Intercepted<S, I>
where
    R: CallHead,
    S: Service<R, Error = Status> + Clone + Send + 'static,
    S::Response: Send + 'static,
    S::Future: Send + 'static,
    I: Interceptor,
{
    type Response = S::Response;
    type Error = Status;
    type Future = BoxFuture<Result<S::Response, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: R) -> Self::Future {
        // The ready service serves this call; the clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let interceptor = self.interceptor.clone();
        Box::pin(async move {
            let mut timeout = *call.timeout_mut();
            let (method, metadata) = call.head_mut();
            within_budget(
                &mut timeout,
                "an interceptor ran",
                interceptor.intercept(method, metadata),
            )
            .await?;
            *call.timeout_mut() = timeout;
            inner.call(call).await
        })
    }
}

/// Applies a tower layer to some methods only: [`for_methods`].
#[derive(Clone, Debug)]
pub struct ForMethods<L> {
    layer: L,
    methods: Arc<[String]>,
}

/// A layer that wraps a service in `layer` for the calls whose method matches one of
/// `methods`, and leaves the other calls alone. A pattern is a full method name
/// (`pkg.Service/Method`) or a service prefix ending in `/` (`pkg.Service/`).
///
/// ```
/// use rpc_core::intercept::{for_methods, interceptor_fn, InterceptLayer};
/// let audit = InterceptLayer::new(interceptor_fn(|method: &str, _: &mut rpc_core::Metadata| {
///     println!("write call: {method}");
///     Ok(())
/// }));
/// let layer = for_methods(audit, ["rpc.examples.v1.KeyValue/Put", "rpc.examples.v1.KeyValue/Delete"]);
/// // Server::builder().layer(layer) ...
/// # drop(layer);
/// ```
pub fn for_methods<L>(
    layer: L,
    methods: impl IntoIterator<Item = impl Into<String>>,
) -> ForMethods<L> {
    ForMethods {
        layer,
        methods: methods.into_iter().map(Into::into).collect(),
    }
}

impl<S: Clone, L: Layer<S>> Layer<S> for ForMethods<L> {
    type Service = MethodSplit<L::Service, S>;

    fn layer(&self, inner: S) -> Self::Service {
        MethodSplit {
            with: self.layer.layer(inner.clone()),
            without: inner,
            methods: self.methods.clone(),
        }
    }
}

/// Routes each call to the layered service or the plain one by method; made by
/// [`for_methods`].
#[derive(Clone, Debug)]
pub struct MethodSplit<A, B> {
    with: A,
    without: B,
    methods: Arc<[String]>,
}

impl<A, B> MethodSplit<A, B> {
    fn matches(&self, method: &str) -> bool {
        self.methods.iter().any(|pattern| {
            if pattern.ends_with('/') {
                method.starts_with(pattern.as_str())
            } else {
                method == pattern
            }
        })
    }
}

impl<A, B, R> Service<R> for MethodSplit<A, B>
where
    R: CallHead,
    A: Service<R, Error = Status> + Clone + Send + 'static,
    B: Service<R, Response = A::Response, Error = Status> + Clone + Send + 'static,
    A::Response: Send + 'static,
    A::Future: Send + 'static,
    B::Future: Send + 'static,
{
    type Response = A::Response;
    type Error = Status;
    type Future = BoxFuture<Result<A::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        // Which branch a call needs is not known yet: `call` waits for that one only
        // (readying both would hold, say, two in-flight permits of a channel).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: R) -> Self::Future {
        if self.matches(call.method()) {
            Box::pin(ready_then_call(self.with.clone(), call))
        } else {
            Box::pin(ready_then_call(self.without.clone(), call))
        }
    }
}

/// `svc.oneshot(call)`, its wait for readiness (a channel's free slot) within the
/// call's time budget ([`ready_within_budget`]): [`MethodSplit`] is always ready itself, so
/// a wait for a slot happens here, where `Client::ready_within` does not see it.
async fn ready_then_call<S, R>(mut svc: S, mut call: R) -> Result<S::Response, Status>
where
    R: CallHead,
    S: Service<R, Error = Status>,
{
    use tower::ServiceExt;
    let mut timeout = *call.timeout_mut();
    ready_within_budget(&mut timeout, "waiting for a free slot", async {
        svc.ready().await.map(|_| ())
    })
    .await?;
    *call.timeout_mut() = timeout;
    svc.call(call).await
}
