//! [`IntoStatusLayer`]: lets tower's own middleware (load shedding, timeouts, buffers,
//! concurrency and rate limits) sit in a server's or a client's stack.
//!
//! Server and client stacks speak [`Status`]: a handler's error is a status, and the
//! server answers with it. tower's middleware fails with a boxed error instead
//! (`LoadShed` with `Overloaded`, `Timeout` with `Elapsed`), so it does not fit on its
//! own (`expected Status, found Box<dyn Error>`). Put `IntoStatusLayer` outside it and
//! every error becomes the status a caller expects:
//!
//! | error | status |
//! | --- | --- |
//! | a [`Status`] (from the services inside) | itself, unchanged |
//! | `tower::load_shed::error::Overloaded` | `RESOURCE_EXHAUSTED` |
//! | `tower::timeout::error::Elapsed` | `DEADLINE_EXCEEDED` |
//! | a transport [`Error`](crate::Error) | `UNAVAILABLE` |
//! | anything else (a closed `Buffer`, say) | `UNAVAILABLE`, with the error's text |
//!
//! `ConcurrencyLimit` and `RateLimit` fail nothing: they hold calls back through
//! `poll_ready`, which the server turns into not reading further requests from that
//! connection (and a client into waiting).
//!
//! ```
//! use std::time::Duration;
//! use rpc_core::{into_status::IntoStatusLayer, server::Server};
//! use tower::ServiceBuilder;
//!
//! let server = Server::builder()
//!     .layer(
//!         ServiceBuilder::new()
//!             .layer(IntoStatusLayer::new())
//!             .load_shed()
//!             .concurrency_limit(64)
//!             .timeout(Duration::from_secs(5)),
//!     )
//!     // .add_service(..)
//!     .build();
//! # drop(server);
//! ```

use std::{
    error::Error as StdError,
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
};

use tower::{Layer, Service};

use crate::Status;

/// A boxed error, as tower's middleware returns.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The status for an error of tower's middleware (see the [module docs](self)).
pub fn status_from_error(err: BoxError) -> Status {
    let err = match err.downcast::<Status>() {
        Ok(status) => return *status,
        Err(err) => err,
    };
    if err.is::<tower::load_shed::error::Overloaded>() {
        return Status::resource_exhausted("the server is overloaded: call shed, not run");
    }
    if err.is::<tower::timeout::error::Elapsed>() {
        return Status::deadline_exceeded("the call took longer than the stack's timeout");
    }
    if let Some(err) = err.downcast_ref::<crate::Error>() {
        return Status::unavailable(err.to_string());
    }
    Status::unavailable(err.to_string())
}

/// Maps the errors of the services inside it to [`Status`] (see the
/// [module docs](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct IntoStatusLayer {
    _private: (),
}

impl IntoStatusLayer {
    /// The layer.
    pub fn new() -> IntoStatusLayer {
        IntoStatusLayer::default()
    }
}

impl<S> Layer<S> for IntoStatusLayer {
    type Service = IntoStatus<S>;

    fn layer(&self, inner: S) -> IntoStatus<S> {
        IntoStatus { inner }
    }
}

/// A service whose errors are [`Status`]es; made by [`IntoStatusLayer`].
#[derive(Clone, Debug)]
pub struct IntoStatus<S> {
    inner: S,
}

impl<S, R> Service<R> for IntoStatus<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = Status;
    type Future = IntoStatusFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner
            .poll_ready(cx)
            .map_err(|err| status_from_error(err.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        IntoStatusFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`IntoStatus`].
    #[derive(Debug)]
    pub struct IntoStatusFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, T, E> Future for IntoStatusFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(self.project().inner.poll(cx));
        Poll::Ready(result.map_err(|err| status_from_error(err.into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn each_error_gets_its_status() {
        let code = |err: BoxError| status_from_error(err).code();
        assert_eq!(
            code(Box::new(tower::load_shed::error::Overloaded::new())),
            Code::RESOURCE_EXHAUSTED
        );
        assert_eq!(
            code(Box::new(tower::timeout::error::Elapsed::new())),
            Code::DEADLINE_EXCEEDED
        );
        assert_eq!(code(Box::new(Status::not_found("x"))), Code::NOT_FOUND);
        assert_eq!(code("closed".into()), Code::UNAVAILABLE);
    }
}
