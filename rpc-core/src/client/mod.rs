//! The client side: a [`Channel`] multiplexes calls over one connection, and [`Client`]
//! is the typed layer generated stubs are built on.
//!
//! Layout:
//! - [`channel`]: the cheap-to-clone [`Channel`] handle, its builder and the
//!   `tower::Service` impl; each call's [`ResponseFuture`].
//! - `driver`: the one task that owns the connection: writes queued calls (many per
//!   system call), matches responses to callers by id, reconnects.
//! - `pending`: the pending-call table.
//! - [`pool`]: a channel's connections, one by default or a pool of several
//!   ([`ChannelBuilder::connections`]), and which one a call goes to.
//! - `rto`: the retransmission timeout of requests on links that may lose them.
//! - [`stub`]: [`Client`], which encodes and decodes protobuf messages around any
//!   `tower::Service<ClientCall>`, so users can stack tower layers under generated
//!   stubs.

pub mod channel;
mod driver;
pub mod pending;
pub mod pool;
mod rto;
pub mod stub;

use std::time::Duration;

use bytes::Bytes;

pub use channel::{Channel, ChannelBuilder, ResponseFuture};
pub use stub::Client;

use crate::{
    bytestr::ByteStr,
    frame::CallKey,
    metadata::Metadata,
    method::Idempotency,
    stream::{MessageStream, RawStreaming, TakeOnce},
    Payload,
};

/// One call as the client's tower stack sees it: the method, metadata, time budget and
/// the encoded request message.
#[derive(Clone, Debug)]
pub struct ClientCall {
    /// `package.Service/Method`.
    pub method: ByteStr,
    /// Whether the method is safe to repeat (from the `.proto`).
    pub idempotency: Idempotency,
    /// Request metadata.
    pub metadata: Metadata,
    /// Time budget; `None` means the channel's default applies.
    pub timeout: Option<Duration>,
    /// The call's identity across attempts, for the server's duplicate cache. The retry
    /// layer sets it on calls it may retry although they are not safe to repeat;
    /// `None` otherwise.
    pub call_key: Option<CallKey>,
    /// The encoded request message (unused by a streaming call).
    pub payload: Payload,
    /// A streaming call's request messages; `None` for a unary call. A streaming call
    /// is never retried (its messages cannot be sent twice).
    pub stream: Option<TakeOnce<MessageStream>>,
    /// Compress this request's payload (`Some(true)`), never (`Some(false)`), or as the
    /// channel's size threshold decides (`None`); only toward a server that accepts
    /// compression.
    pub compress: Option<bool>,
}

/// A client made from the channel (or stack of tower layers over one) it calls through.
///
/// Every generated client implements it (`FooClient<T>: FromChannel<T>`, as
/// `FooClient::new`), and so does [`Client`]. Code that makes channels can then hand
/// back any generated client without knowing it: `rpc-connect`'s `Connect` trait
/// (`EchoClient::connect("tcp://…")`, `EchoClient::balanced("dns://…")`) is written
/// against this trait, which is why the generated code needs no dependency on
/// `rpc-connect` (which depends on this crate, not the other way round).
///
/// ```
/// use rpc_core::client::{Client, FromChannel};
///
/// // Any function that makes channels can return any client of them.
/// fn wrap<C: FromChannel<Vec<u8>>>(channel: Vec<u8>) -> C {
///     C::from_channel(channel)
/// }
/// let client: Client<Vec<u8>> = wrap(vec![1, 2, 3]);
/// assert_eq!(client.get_ref(), &[1, 2, 3]);
/// ```
pub trait FromChannel<T>: Sized {
    /// The client calling through `channel`.
    fn from_channel(channel: T) -> Self;
}

impl<T> FromChannel<T> for Client<T> {
    fn from_channel(channel: T) -> Self {
        Client::new(channel)
    }
}

impl ClientCall {
    /// Whether this is a streaming call.
    pub fn is_streaming(&self) -> bool {
        self.stream.is_some()
    }
}

/// A successful call's result: response metadata and the encoded response message.
#[derive(Clone, Debug, Default)]
pub struct ClientReply {
    /// Response metadata.
    pub metadata: Metadata,
    /// The encoded response message (empty for a streaming call).
    pub payload: Bytes,
    /// A streaming call's response messages; `None` for a unary call.
    pub stream: Option<TakeOnce<RawStreaming>>,
    /// Whether the response message arrived compressed.
    pub compressed: bool,
}
