//! The server side of bearer tokens: [`BearerLayer`] checks every call's
//! `authorization: Bearer <token>` and records who the token names.

use std::{
    fmt,
    future::Future,
    sync::Arc,
    task::{Context, Poll},
};

use tower::{Layer, Service};

use super::{pattern, MethodPattern, Principal, SharedTokens, TokenSet, AUTHORIZATION};
use crate::{codegen::BoxFuture, server::ServerCall, Status};

type ValidateFn = dyn Fn(String) -> BoxFuture<Result<Principal, Status>> + Send + Sync;

#[derive(Clone)]
enum Validator {
    Tokens(Arc<TokenSet>),
    Shared(SharedTokens),
    Fn(Arc<ValidateFn>),
}

/// A tower layer for a server that authenticates calls by bearer token.
///
/// Each call must carry one `authorization` metadata value of the form
/// `Bearer <token>` (the scheme in any case). The token is checked against a
/// [`TokenSet`] or by an async validator; the principal it names is put on the call
/// ([`ServerCall::principal`], [`Request::principal`](crate::Request::principal)) for
/// the [`AuthorizeLayer`](super::AuthorizeLayer) and the handler. A call without a
/// token, or with one that is not valid, fails with `UNAUTHENTICATED` and its handler
/// never runs. Streaming calls are checked once, when they open.
///
/// Methods given to [`exempt`](Self::exempt) (health checks, say) are not checked at
/// all, token or not.
///
/// ```
/// use rpc_core::auth::{BearerLayer, Principal, TokenSet};
///
/// let tokens = TokenSet::new().with("s3cret", Principal::new("alice").with_role("admin"));
/// let layer = BearerLayer::new(tokens).exempt(["grpc.health.v1.Health/*"]);
/// // Server::builder().layer(layer).add_service(..)
/// # drop(layer);
/// ```
#[derive(Clone)]
pub struct BearerLayer {
    validator: Validator,
    exempt: Arc<[MethodPattern]>,
}

impl fmt::Debug for BearerLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("BearerLayer");
        match &self.validator {
            Validator::Tokens(tokens) => d.field("tokens", tokens),
            Validator::Shared(tokens) => d.field("tokens", tokens),
            Validator::Fn(_) => d.field("validator", &"Fn(..)"),
        };
        d.field("exempt", &self.exempt).finish()
    }
}

impl BearerLayer {
    /// Accepts the tokens of `tokens` (see [`TokenSet::load`] for a tokens file).
    pub fn new(tokens: TokenSet) -> BearerLayer {
        BearerLayer {
            validator: Validator::Tokens(Arc::new(tokens)),
            exempt: Arc::new([]),
        }
    }

    /// Accepts the tokens of the set `tokens` holds when each call arrives: the set can
    /// be replaced while the server runs (see [`SharedTokens`]).
    pub fn shared(tokens: SharedTokens) -> BearerLayer {
        BearerLayer {
            validator: Validator::Shared(tokens),
            exempt: Arc::new([]),
        }
    }

    /// Accepts the tokens `validate` accepts: it gets the token (what follows
    /// `Bearer `) and returns the principal it stands for, or the status to fail the
    /// call with (`UNAUTHENTICATED` for a bad token; `UNAVAILABLE` if the store it asks
    /// is down, say).
    ///
    /// ```
    /// use rpc_core::{auth::{BearerLayer, Principal}, Status};
    ///
    /// let layer = BearerLayer::from_fn(|token: String| async move {
    ///     match token.strip_prefix("user-") {
    ///         Some(name) => Ok(Principal::new(name)),
    ///         None => Err(Status::unauthenticated("unknown token")),
    ///     }
    /// });
    /// # drop(layer);
    /// ```
    pub fn from_fn<F, Fut>(validate: F) -> BearerLayer
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Principal, Status>> + Send + 'static,
    {
        BearerLayer {
            validator: Validator::Fn(Arc::new(move |token| Box::pin(validate(token)))),
            exempt: Arc::new([]),
        }
    }

    /// Lets calls to these methods through unchecked: each pattern is
    /// `pkg.Service/Method`, `pkg.Service/*` or `*` (see [`MethodPattern`]). Adds to
    /// the exemptions made before. Default: none.
    ///
    /// # Panics
    ///
    /// If a pattern is malformed (check one read from configuration with
    /// [`MethodPattern::parse`] first).
    #[track_caller]
    pub fn exempt(mut self, methods: impl IntoIterator<Item = impl AsRef<str>>) -> BearerLayer {
        let mut exempt = self.exempt.to_vec();
        exempt.extend(pattern::parse_all(methods));
        self.exempt = exempt.into();
        self
    }
}

impl<S> Layer<S> for BearerLayer {
    type Service = Bearer<S>;

    fn layer(&self, inner: S) -> Bearer<S> {
        Bearer {
            inner,
            validator: self.validator.clone(),
            exempt: self.exempt.clone(),
        }
    }
}

/// A server service behind bearer-token authentication; made by [`BearerLayer`].
#[derive(Clone)]
pub struct Bearer<S> {
    inner: S,
    validator: Validator,
    exempt: Arc<[MethodPattern]>,
}

impl<S: fmt::Debug> fmt::Debug for Bearer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bearer")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The token of a call's `authorization` metadata, or why there is none.
fn bearer_token(call: &ServerCall) -> Result<String, Status> {
    let mut values = call.metadata.get_all(AUTHORIZATION);
    let value = match (values.next(), values.next()) {
        (None, _) => {
            return Err(Status::unauthenticated(format!(
                "{} needs a bearer token (`authorization: Bearer <token>` metadata)",
                call.method
            )))
        }
        (Some(_), Some(_)) => {
            return Err(Status::unauthenticated(
                "more than one `authorization` metadata value",
            ))
        }
        (Some(value), None) => value,
    };
    let value = value
        .as_str()
        .ok_or_else(|| Status::unauthenticated("the `authorization` metadata is not text"))?;
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Status::unauthenticated(
            "the `authorization` metadata is not `Bearer <token>`",
        ));
    }
    let token = token.trim_matches(' ');
    if token.is_empty() {
        return Err(Status::unauthenticated("the bearer token is empty"));
    }
    Ok(token.to_owned())
}

impl<S> Service<ServerCall> for Bearer<S>
where
    S: Service<ServerCall, Error = Status> + Clone + Send + 'static,
    S::Response: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Status;
    type Future = BoxFuture<Result<S::Response, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ServerCall) -> Self::Future {
        if self.exempt.iter().any(|p| p.matches(&call.method)) {
            return Box::pin(self.inner.call(call));
        }
        // Refusals are marked as coming before the handler: the duplicate cache keeps
        // nothing for them.
        let token = match bearer_token(&call) {
            Ok(token) => token,
            Err(status) => return Box::pin(std::future::ready(Err(status.into_before_handler()))),
        };
        let principal = match &self.validator {
            Validator::Tokens(tokens) => tokens.lookup(&token),
            Validator::Shared(tokens) => tokens.lookup(&token),
            Validator::Fn(validate) => {
                let validated = validate(token);
                // The ready service serves this call; the clone waits for the next one.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                return Box::pin(async move {
                    let principal = validated.await.map_err(Status::into_before_handler)?;
                    call.principal = Some(Arc::new(principal));
                    inner.call(call).await
                });
            }
        };
        match principal {
            Some(principal) => {
                call.principal = Some(principal);
                Box::pin(self.inner.call(call))
            }
            None => Box::pin(std::future::ready(Err(
                invalid_token(&call).into_before_handler()
            ))),
        }
    }
}

fn invalid_token(call: &ServerCall) -> Status {
    Status::unauthenticated(format!("invalid bearer token for {}", call.method))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metadata;

    fn call(authorization: &[&'static str]) -> ServerCall {
        let mut metadata = Metadata::new();
        for value in authorization {
            metadata.append("authorization", *value).unwrap();
        }
        ServerCall {
            method: "t.S/M".into(),
            metadata,
            timeout: None,
            payload: Default::default(),
            stream: None,
            compressed: false,
            received: None,
            bulk: None,
            peer: None,
            principal: None,
            extensions: crate::Extensions::new(),
        }
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_spaces_are_trimmed() {
        for value in ["Bearer tok", "bearer tok", "BEARER   tok ", "BeArEr tok"] {
            assert_eq!(bearer_token(&call(&[value])).unwrap(), "tok", "{value:?}");
        }
    }

    #[test]
    fn malformed_authorization_is_unauthenticated() {
        for values in [
            &[][..],
            &["Basic dXNlcjpwYXNz"],
            &["Bearer"],
            &["Bearer   "],
            &["Bearertok"],
            &["tok"],
            &["Bearer a", "Bearer b"],
        ] {
            let status = bearer_token(&call(values)).unwrap_err();
            assert_eq!(status.code(), crate::Code::UNAUTHENTICATED, "{values:?}");
        }
    }
}
