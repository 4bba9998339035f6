//! Authentication and authorization as tower layers, for clients and servers.
//!
//! # The model
//!
//! A server learns **who is calling** from two places:
//!
//! - the **connection**: its [`Peer`](crate::Peer) (`ServerCall::peer`,
//!   [`Request::peer`](crate::Request::peer)), with the names of a client certificate
//!   the TLS transport verified (mTLS: SPIFFE ids, DNS names), or a Unix socket
//!   peer's uid (which [`AuthorizeLayer::from_fn`] can decide by);
//! - the **call**: credentials in its metadata, here a bearer token
//!   (`authorization: Bearer <token>`), which an authentication layer turns into a
//!   [`Principal`] (a name, roles, claims) on the call (`ServerCall::principal`,
//!   [`Request::principal`](crate::Request::principal)).
//!
//! It then decides **what the caller may do**: an authorization layer allows each
//! method by the peer's identity or the principal's name or roles.
//!
//! | layer | side | does |
//! | --- | --- | --- |
//! | [`CredentialsLayer`] | client | adds a token (or any metadata) to every call; an async source, cached until it expires, refreshed once for all waiting calls |
//! | [`BearerLayer`] | server | checks `authorization: Bearer <token>` against a [`TokenSet`] (or a tokens file) or an async validator; sets the principal; `UNAUTHENTICATED` otherwise |
//! | [`AuthorizeLayer`] | server | allows a call by a [`Policy`] of rules (subject, [method patterns](MethodPattern)) or a function; `PERMISSION_DENIED` for a known caller not allowed, `UNAUTHENTICATED` for an unknown one |
//!
//! On a server the authentication layer comes first (outermost: the first layer
//! given to the builder), so that authorization sees its principal. A refused call
//! never reaches its handler; a streaming call is checked once, when it opens. Calls
//! that need no credentials (health checks) are let through with
//! [`BearerLayer::exempt`] and [`Policy::allow_anyone`]. With mTLS alone there is no
//! authentication layer: the [`AuthorizeLayer`] reads the peer's identity.
//!
//! Tokens travel in the clear over `tcp://`, `udp://` and `rdma://`: send them over
//! `tls://` (or a trusted network).
//!
//! # Example
//!
//! ```
//! use rpc_core::{auth::{AuthorizeLayer, BearerLayer, CredentialsLayer, Policy, Principal, TokenSet},
//!                client::{Channel, ClientCall}, server::{Server, ServerCall, ServerReply},
//!                link::mem, Code, Status};
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Tokens usually come from a file: `TokenSet::load("tokens")`.
//! let tokens = TokenSet::parse("s3cret alice reader\n")?;
//! let policy = Policy::new()
//!     .allow_role("reader", ["demo.Store/Get"])
//!     .allow_role("writer", ["demo.Store/*"]);
//! let store = service_fn(|call: ServerCall| async move {
//!     let who = call.principal.as_ref().map(|p| p.name().to_owned()).unwrap_or_default();
//!     Ok::<_, Status>(ServerReply { payload: who.into_bytes().into(), ..ServerReply::default() })
//! });
//! let (listener, connector) = mem::listener();
//! let server = Server::builder()
//!     .layer(BearerLayer::new(tokens))
//!     .layer(AuthorizeLayer::new(policy))
//!     .add_named_service("demo.Store", store)
//!     .build();
//! tokio::spawn(async move { server.serve(listener).await });
//!
//! let mut channel = ServiceBuilder::new()
//!     .layer(CredentialsLayer::bearer("s3cret"))
//!     .service(Channel::builder().connect(connector).await?);
//! let call = |method: &'static str| ClientCall {
//!     method: method.into(),
//!     idempotency: Default::default(),
//!     metadata: Default::default(),
//!     timeout: None,
//!     call_key: None,
//!     payload: Default::default(),
//!     stream: None,
//!     compress: None,
//! };
//! let reply = channel.ready().await?.call(call("demo.Store/Get")).await?;
//! assert_eq!(reply.payload, "alice");
//! let refused = channel.ready().await?.call(call("demo.Store/Put")).await.unwrap_err();
//! assert_eq!(refused.code(), Code::PERMISSION_DENIED);
//! # Ok(()) }
//! ```

mod authorize;
mod bearer;
mod credentials;
mod pattern;
mod principal;
mod tokens;

pub use authorize::{Authorize, AuthorizeLayer, Policy, Subject};
pub use bearer::{Bearer, BearerLayer};
pub use credentials::{Credential, CredentialsLayer, WithCredentials, AUTHORIZATION, KEYED_CALLS};
pub use pattern::{InvalidMethodPattern, MethodPattern};
pub use principal::Principal;
pub use tokens::{SharedTokens, TokenSet, TokensFileError};
