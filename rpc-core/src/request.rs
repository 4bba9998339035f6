//! [`Request`] and [`Response`]: a message with its metadata, as generated stubs and
//! service traits see it.

use std::time::Duration;

use crate::metadata::Metadata;

/// A request message with metadata and an optional time budget.
///
/// ```
/// use std::time::Duration;
/// use rpc_core::Request;
///
/// // On the client: any message (a generated one; a `String` here), with a deadline
/// // (sent to the server, which stops the handler when it runs out) and metadata.
/// let mut request = Request::new("hello".to_string()).with_timeout(Duration::from_millis(500));
/// request.metadata_mut().insert("x-token", "s3cret")?;
///
/// // On the server, a handler reads the same: the message, the metadata, the budget
/// // left, and who is calling (`peer()`, `principal()`, `extensions()`).
/// assert_eq!(request.get_ref(), "hello");
/// assert_eq!(request.metadata().get_str("x-token"), Some("s3cret"));
/// assert_eq!(request.timeout(), Some(Duration::from_millis(500)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Request<T> {
    metadata: Metadata,
    timeout: Option<Duration>,
    message: T,
    compress: Option<bool>,
    compressed: bool,
    bulk: Option<crate::bulk::Bulk>,
    peer: Option<std::sync::Arc<crate::Peer>>,
    principal: Option<std::sync::Arc<crate::auth::Principal>>,
    extensions: crate::Extensions,
}

impl<T> Request<T> {
    /// Wraps a message with no metadata and no timeout of its own (the channel's
    /// default timeout applies, if any).
    pub fn new(message: T) -> Request<T> {
        Request {
            metadata: Metadata::new(),
            timeout: None,
            message,
            compress: None,
            compressed: false,
            bulk: None,
            peer: None,
            principal: None,
            extensions: crate::Extensions::new(),
        }
    }

    /// On the server: who is calling: the remote address, a Unix socket's peer
    /// credentials, the verified TLS identity (see [`crate::peer`]). `None` on the
    /// client.
    pub fn peer(&self) -> Option<&crate::Peer> {
        self.peer.as_deref()
    }

    pub(crate) fn set_peer(&mut self, peer: Option<std::sync::Arc<crate::Peer>>) {
        self.peer = peer;
    }

    /// On the server: who the call's credentials say is calling, as an authentication
    /// layer ([`BearerLayer`](crate::auth::BearerLayer)) found (see [`crate::auth`]).
    /// `None` without such a layer, for a method it exempts, and on the client.
    pub fn principal(&self) -> Option<&crate::auth::Principal> {
        self.principal.as_deref()
    }

    pub(crate) fn set_principal(
        &mut self,
        principal: Option<std::sync::Arc<crate::auth::Principal>>,
    ) {
        self.principal = principal;
    }

    /// Values of any type, one per type, that a server layer handed the handler (see
    /// [`crate::extensions`]): a user id found in a token, a tenant. Local to this
    /// process: never sent on the wire.
    ///
    /// ```
    /// # use rpc_core::Request;
    /// #[derive(Clone)]
    /// struct UserId(u64);
    ///
    /// let mut request = Request::new(());
    /// request.extensions_mut().insert(UserId(7));
    /// assert_eq!(request.extensions().get::<UserId>().map(|u| u.0), Some(7));
    /// ```
    pub fn extensions(&self) -> &crate::Extensions {
        &self.extensions
    }

    /// The extensions, mutably.
    pub fn extensions_mut(&mut self) -> &mut crate::Extensions {
        &mut self.extensions
    }

    /// On the server: the connection's bulk endpoint, to read or write buffers whose
    /// descriptors the client sent, or to expose buffers to it (see [`crate::bulk`]).
    pub fn bulk(&self) -> Option<&crate::bulk::Bulk> {
        self.bulk.as_ref()
    }

    pub(crate) fn set_bulk(&mut self, bulk: Option<crate::bulk::Bulk>) {
        self.bulk = bulk;
    }

    /// Asks to compress this (unary) request's message (`Some(true)`), or not to
    /// (`Some(false)`); `None`, the default, leaves it to the channel's size threshold.
    /// Only toward a server that accepts compression (see [`crate::compress`]).
    pub fn set_compress(&mut self, compress: Option<bool>) {
        self.compress = compress;
    }

    /// The compression asked for with [`set_compress`](Self::set_compress).
    pub fn compress(&self) -> Option<bool> {
        self.compress
    }

    /// On the server: whether the request message arrived compressed.
    pub fn compressed(&self) -> bool {
        self.compressed
    }

    pub(crate) fn set_compressed(&mut self, compressed: bool) {
        self.compressed = compressed;
    }

    /// Sets the call's time budget. The remaining budget travels to the server, which
    /// drops the handler when it runs out; the caller stops waiting at the same time
    /// and gets `DEADLINE_EXCEEDED`.
    pub fn with_timeout(mut self, timeout: Duration) -> Request<T> {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the time budget in place.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = Some(timeout);
    }

    /// The call's time budget: set by the caller on the client; on the server, the
    /// budget that remained when the request arrived.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Mutable metadata.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// The message, dropping the metadata.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// Splits into metadata, timeout and message.
    pub fn into_parts(self) -> (Metadata, Option<Duration>, T) {
        (self.metadata, self.timeout, self.message)
    }

    /// Builds a request from its parts.
    pub fn from_parts(metadata: Metadata, timeout: Option<Duration>, message: T) -> Request<T> {
        Request {
            metadata,
            timeout,
            message,
            compress: None,
            compressed: false,
            bulk: None,
            peer: None,
            principal: None,
            extensions: crate::Extensions::new(),
        }
    }
}

/// Conversion into a [`Request`], so stubs accept either a bare message or a request.
pub trait IntoRequest<T> {
    /// Wraps the value in a [`Request`] (or returns it, if it is one).
    fn into_request(self) -> Request<T>;
}

impl<T> IntoRequest<T> for Request<T> {
    fn into_request(self) -> Request<T> {
        self
    }
}

impl<T: prost::Message> IntoRequest<T> for T {
    fn into_request(self) -> Request<T> {
        Request::new(self)
    }
}

/// A response message with its metadata, and the trailers a server sends when the call
/// ends.
///
/// ```
/// use rpc_core::{Request, Response, Status};
///
/// // What a handler returns (a method of a generated server trait looks the same) ...
/// async fn say(request: Request<String>) -> Result<Response<String>, Status> {
///     let mut response = Response::new(format!("re: {}", request.get_ref()));
///     let served_by = response.metadata_mut().insert("x-served-by", "replica-1");
///     served_by.map_err(|err| Status::internal(err.to_string()))?;
///     Ok(response)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Status> {
/// // ... and what the caller gets: the message and the metadata.
/// let response = say(Request::new("hi".to_string())).await?;
/// assert_eq!(response.metadata().get_str("x-served-by"), Some("replica-1"));
/// assert_eq!(response.into_inner(), "re: hi");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Response<T> {
    metadata: Metadata,
    message: T,
    trailers: Metadata,
    compress: Option<bool>,
    compressed: bool,
}

impl<T> Response<T> {
    /// Wraps a message with no metadata.
    pub fn new(message: T) -> Response<T> {
        Response {
            metadata: Metadata::new(),
            message,
            trailers: Metadata::new(),
            compress: None,
            compressed: false,
        }
    }

    /// Asks to compress this (unary) response's message (`Some(true)`), or not to
    /// (`Some(false)`); `None`, the default, leaves it to the server's size threshold.
    /// Only toward a client that accepts compression (see [`crate::compress`]).
    pub fn set_compress(&mut self, compress: Option<bool>) {
        self.compress = compress;
    }

    /// The compression asked for with [`set_compress`](Self::set_compress).
    pub fn compress(&self) -> Option<bool> {
        self.compress
    }

    /// On the client: whether the response message arrived compressed.
    pub fn compressed(&self) -> bool {
        self.compressed
    }

    pub(crate) fn set_compressed(&mut self, compressed: bool) {
        self.compressed = compressed;
    }

    /// Trailers: metadata a server handler sends when the call ends (after a stream's
    /// last message). On a unary call they are sent with the headers, and a client
    /// sees them in [`metadata`](Self::metadata).
    pub fn trailers(&self) -> &Metadata {
        &self.trailers
    }

    /// Mutable trailers.
    pub fn trailers_mut(&mut self) -> &mut Metadata {
        &mut self.trailers
    }

    /// Takes the trailers out.
    pub fn take_trailers(&mut self) -> Metadata {
        std::mem::take(&mut self.trailers)
    }

    /// The message, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// Applies `f` to the message, keeping metadata and trailers.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Response<U> {
        Response {
            metadata: self.metadata,
            message: f(self.message),
            trailers: self.trailers,
            compress: self.compress,
            compressed: self.compressed,
        }
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Mutable metadata.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, dropping the metadata.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// Splits into metadata and message.
    pub fn into_parts(self) -> (Metadata, T) {
        (self.metadata, self.message)
    }

    /// Builds a response from its parts.
    pub fn from_parts(metadata: Metadata, message: T) -> Response<T> {
        Response {
            metadata,
            message,
            trailers: Metadata::new(),
            compress: None,
            compressed: false,
        }
    }
}

/// Conversion into a streaming request: a [`Request`] whose message is a stream of
/// request messages, so streaming stubs accept a bare stream or a request around one.
pub trait IntoStreamingRequest {
    /// The request messages.
    type Stream: futures::Stream<Item = Self::Message> + Send + 'static;
    /// One request message.
    type Message;

    /// Wraps the stream in a [`Request`] (or returns it, if it is one).
    fn into_streaming_request(self) -> Request<Self::Stream>;
}

impl<S> IntoStreamingRequest for S
where
    S: futures::Stream + Send + 'static,
{
    type Stream = S;
    type Message = S::Item;

    fn into_streaming_request(self) -> Request<S> {
        Request::new(self)
    }
}

impl<S> IntoStreamingRequest for Request<S>
where
    S: futures::Stream + Send + 'static,
{
    type Stream = S;
    type Message = S::Item;

    fn into_streaming_request(self) -> Request<S> {
        self
    }
}
