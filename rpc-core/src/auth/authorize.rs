//! Authorization: [`AuthorizeLayer`] lets a call through if a [`Policy`] (or a
//! function) allows its caller to call its method.

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use tower::{Layer, Service};

use super::{pattern, MethodPattern, Principal};
use crate::{codegen::BoxFuture, server::ServerCall, Peer, Status};

/// Who a rule of a [`Policy`] allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// Every caller, authenticated or not (health checks, say).
    Anyone,
    /// Any authenticated caller: a peer with a verified client certificate, or a call
    /// with a principal.
    Authenticated,
    /// A peer whose verified client certificate names this URI (a SPIFFE id such as
    /// `spiffe://example.org/web`) or DNS name among its subject alternative names
    /// ([`Peer::has_identity`]: a URI exactly, a DNS name without case; a SPIFFE id
    /// only from a certificate with one URI).
    Identity(String),
    /// The principal of this name ([`Principal::name`]).
    Principal(String),
    /// A principal with this role ([`Principal::has_role`]).
    Role(String),
}

impl Subject {
    fn covers(&self, peer: Option<&Peer>, principal: Option<&Principal>) -> bool {
        match self {
            Subject::Anyone => true,
            Subject::Authenticated => is_authenticated(peer, principal),
            Subject::Identity(name) => peer.is_some_and(|p| p.has_identity(name)),
            Subject::Principal(name) => principal.is_some_and(|p| p.name() == name),
            Subject::Role(role) => principal.is_some_and(|p| p.has_role(role)),
        }
    }
}

/// Whether the caller proved who it is somehow: a verified client certificate, or
/// credentials an authentication layer turned into a principal.
fn is_authenticated(peer: Option<&Peer>, principal: Option<&Principal>) -> bool {
    principal.is_some() || verified_name(peer).is_some()
}

/// A name from the peer's verified certificate, for messages.
fn verified_name(peer: Option<&Peer>) -> Option<&str> {
    let tls = peer?.tls()?;
    let name = tls
        .uris
        .first()
        .or(tls.dns_names.first())
        .map(String::as_str);
    match name {
        Some(name) => Some(name),
        None if tls.authenticated() => Some("a client certificate"),
        None => None,
    }
}

#[derive(Clone, Debug)]
struct Rule {
    subject: Subject,
    methods: Vec<MethodPattern>,
}

/// Which callers may call which methods: a list of allow rules; a call no rule allows
/// is refused. Rules are checked in order and the first that allows wins (the order
/// does not change the outcome, only the time).
///
/// ```
/// use rpc_core::auth::{Policy, Subject};
///
/// let policy = Policy::new()
///     .allow_anyone(["grpc.health.v1.Health/*"])
///     .allow_role("reader", ["kv.v1.KeyValue/Get", "kv.v1.KeyValue/List"])
///     .allow_role("writer", ["kv.v1.KeyValue/*"])
///     .allow_identity("spiffe://example.org/backup", ["kv.v1.KeyValue/Get"])
///     .allow_principal("root", ["*"])
///     .allow(Subject::Authenticated, ["kv.v1.Info/Version"]);
/// assert!(policy.allows("grpc.health.v1.Health/Check", None, None));
/// assert!(!policy.allows("kv.v1.KeyValue/Get", None, None));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Policy {
    rules: Vec<Rule>,
}

impl Policy {
    /// A policy that allows nothing yet.
    pub fn new() -> Policy {
        Policy::default()
    }

    /// Allows `subject` to call `methods`: each `pkg.Service/Method`, `pkg.Service/*`
    /// or `*` (see [`MethodPattern`]).
    ///
    /// # Panics
    ///
    /// If a pattern is malformed (check one read from configuration with
    /// [`MethodPattern::parse`] first, then use
    /// [`allow_patterns`](Self::allow_patterns)).
    #[track_caller]
    pub fn allow(
        self,
        subject: Subject,
        methods: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Policy {
        self.allow_patterns(subject, pattern::parse_all(methods))
    }

    /// Allows `subject` to call the methods of `patterns`.
    pub fn allow_patterns(
        mut self,
        subject: Subject,
        patterns: impl IntoIterator<Item = MethodPattern>,
    ) -> Policy {
        self.rules.push(Rule {
            subject,
            methods: patterns.into_iter().collect(),
        });
        self
    }

    /// [`allow`](Self::allow) for [`Subject::Anyone`].
    #[track_caller]
    pub fn allow_anyone(self, methods: impl IntoIterator<Item = impl AsRef<str>>) -> Policy {
        self.allow(Subject::Anyone, methods)
    }

    /// [`allow`](Self::allow) for [`Subject::Identity`].
    #[track_caller]
    pub fn allow_identity(
        self,
        identity: impl Into<String>,
        methods: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Policy {
        self.allow(Subject::Identity(identity.into()), methods)
    }

    /// [`allow`](Self::allow) for [`Subject::Principal`].
    #[track_caller]
    pub fn allow_principal(
        self,
        name: impl Into<String>,
        methods: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Policy {
        self.allow(Subject::Principal(name.into()), methods)
    }

    /// [`allow`](Self::allow) for [`Subject::Role`].
    #[track_caller]
    pub fn allow_role(
        self,
        role: impl Into<String>,
        methods: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Policy {
        self.allow(Subject::Role(role.into()), methods)
    }

    /// Whether a caller (its connection's peer, its principal) may call `method`.
    pub fn allows(&self, method: &str, peer: Option<&Peer>, principal: Option<&Principal>) -> bool {
        self.rules.iter().any(|rule| {
            rule.methods.iter().any(|p| p.matches(method)) && rule.subject.covers(peer, principal)
        })
    }
}

type DecideFn = dyn Fn(&ServerCall) -> bool + Send + Sync;

#[derive(Clone)]
enum Decider {
    Policy(Arc<Policy>),
    Fn(Arc<DecideFn>),
}

impl Decider {
    fn allows(&self, call: &ServerCall) -> bool {
        match self {
            Decider::Policy(policy) => policy.allows(
                &call.method,
                call.peer.as_deref(),
                call.principal.as_deref(),
            ),
            Decider::Fn(decide) => decide(call),
        }
    }
}

/// A tower layer for a server that lets a call reach its handler only if a [`Policy`]
/// or a function allows it. A refused call fails with `PERMISSION_DENIED` if its
/// caller is authenticated (a verified client certificate, or a principal) and with
/// `UNAUTHENTICATED` if not; its handler never runs. Streaming calls are checked once,
/// when they open.
///
/// It reads the principal an authentication layer put on the call, so it goes inside
/// that layer: add it to the server builder after the [`BearerLayer`](super::BearerLayer)
/// (the first layer added is the outermost).
///
/// ```
/// use rpc_core::auth::{AuthorizeLayer, Policy};
///
/// let layer = AuthorizeLayer::new(Policy::new().allow_role("admin", ["*"]));
///
/// // The same with a function of the call.
/// let by_hand = AuthorizeLayer::from_fn(|call| {
///     call.principal.as_ref().is_some_and(|p| p.has_role("admin"))
/// });
/// # drop((layer, by_hand));
/// ```
#[derive(Clone)]
pub struct AuthorizeLayer {
    decider: Decider,
}

impl fmt::Debug for AuthorizeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.decider {
            Decider::Policy(policy) => f.debug_tuple("AuthorizeLayer").field(policy).finish(),
            Decider::Fn(_) => f.write_str("AuthorizeLayer(Fn(..))"),
        }
    }
}

impl AuthorizeLayer {
    /// Allows what `policy` allows.
    pub fn new(policy: Policy) -> AuthorizeLayer {
        AuthorizeLayer {
            decider: Decider::Policy(Arc::new(policy)),
        }
    }

    /// Allows the calls for which `allow` returns `true`. It sees the whole call:
    /// method, metadata, [`peer`](ServerCall::peer) and
    /// [`principal`](ServerCall::principal).
    pub fn from_fn<F>(allow: F) -> AuthorizeLayer
    where
        F: Fn(&ServerCall) -> bool + Send + Sync + 'static,
    {
        AuthorizeLayer {
            decider: Decider::Fn(Arc::new(allow)),
        }
    }
}

impl<S> Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize {
            inner,
            decider: self.decider.clone(),
        }
    }
}

/// A server service behind authorization; made by [`AuthorizeLayer`].
#[derive(Clone)]
pub struct Authorize<S> {
    inner: S,
    decider: Decider,
}

impl<S: fmt::Debug> fmt::Debug for Authorize<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorize")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The status a refused call fails with.
fn refusal(call: &ServerCall) -> Status {
    let peer = call.peer.as_deref();
    let method = &call.method;
    if let Some(principal) = &call.principal {
        Status::permission_denied(format!("{:?} may not call {method}", principal.name()))
    } else if let Some(name) = verified_name(peer) {
        Status::permission_denied(format!("{name:?} may not call {method}"))
    } else {
        Status::unauthenticated(format!(
            "{method} needs an authenticated caller (a client certificate or a bearer token)"
        ))
    }
}

impl<S> Service<ServerCall> for Authorize<S>
where
    S: Service<ServerCall, Error = Status>,
    S::Response: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Status;
    type Future = BoxFuture<Result<S::Response, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        if self.decider.allows(&call) {
            Box::pin(self.inner.call(call))
        } else {
            tracing::debug!(method = %call.method, "call refused by the authorization policy");
            Box::pin(std::future::ready(
                Err(refusal(&call).into_before_handler()),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::TlsIdentity;

    fn mtls(uris: &[&str], dns: &[&str]) -> Peer {
        Peer::new("tls://10.0.0.1:5000").with_tls(TlsIdentity {
            uris: uris.iter().map(|s| s.to_string()).collect(),
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            certificate: vec![0x30],
            ..TlsIdentity::default()
        })
    }

    fn policy() -> Policy {
        Policy::new()
            .allow_anyone(["grpc.health.v1.Health/Check"])
            .allow_role("reader", ["kv.KeyValue/Get"])
            .allow_role("writer", ["kv.KeyValue/*"])
            .allow_principal("root", ["*"])
            .allow_identity("spiffe://example.org/web", ["kv.KeyValue/Get"])
            .allow_identity("backup.example.org", ["kv.Backup/"])
            .allow(Subject::Authenticated, ["kv.Info/Version"])
    }

    #[test]
    fn rules_match_by_role_principal_and_identity() {
        let policy = policy();
        let reader = Principal::new("ann").with_role("reader");
        let writer = Principal::new("bob").with_role("writer");
        let root = Principal::new("root");
        let web = mtls(&["spiffe://example.org/web"], &[]);
        let backup = mtls(&[], &["backup.example.org"]);
        let plain = Peer::new("tcp://10.0.0.2:6000");

        assert!(policy.allows("grpc.health.v1.Health/Check", None, None));
        assert!(!policy.allows("grpc.health.v1.Health/Watch", None, None));

        assert!(policy.allows("kv.KeyValue/Get", None, Some(&reader)));
        assert!(!policy.allows("kv.KeyValue/Put", None, Some(&reader)));
        assert!(policy.allows("kv.KeyValue/Put", None, Some(&writer)));
        assert!(!policy.allows("kv.Backup/Run", None, Some(&writer)));
        assert!(policy.allows("anything.At/All", None, Some(&root)));
        assert!(
            !policy.allows("kv.KeyValue/Get", None, Some(&Principal::new("reader"))),
            "a name is not a role"
        );

        assert!(policy.allows("kv.KeyValue/Get", Some(&web), None));
        assert!(!policy.allows("kv.KeyValue/Put", Some(&web), None));
        assert!(policy.allows("kv.Backup/Run", Some(&backup), None));
        assert!(!policy.allows("kv.KeyValue/Get", Some(&plain), None));

        assert!(policy.allows("kv.Info/Version", Some(&web), None));
        assert!(policy.allows("kv.Info/Version", None, Some(&reader)));
        assert!(!policy.allows("kv.Info/Version", Some(&plain), None));
        assert!(
            !Policy::new().allows("a.B/C", Some(&web), Some(&root)),
            "empty denies"
        );

        // A certificate of two SPIFFE ids is no SVID: it holds neither. DNS names
        // compare without case; a DNS name spelled as the URI names nothing.
        let two = mtls(
            &["spiffe://example.org/web", "spiffe://example.org/admin"],
            &[],
        );
        assert!(!policy.allows("kv.KeyValue/Get", Some(&two), None));
        let upper = mtls(&[], &["Backup.Example.ORG"]);
        assert!(policy.allows("kv.Backup/Run", Some(&upper), None));
        let dns_as_uri = mtls(&[], &["spiffe://example.org/web"]);
        assert!(!policy.allows("kv.KeyValue/Get", Some(&dns_as_uri), None));
        let uri_as_dns = mtls(&["backup.example.org"], &[]);
        assert!(!policy.allows("kv.Backup/Run", Some(&uri_as_dns), None));
        // A URI without `//` (a URN) is a URI all the same.
        let urn = mtls(&["urn:example:backup"], &[]);
        let by_urn = Policy::new().allow_identity("urn:example:backup", ["kv.Backup/"]);
        assert!(by_urn.allows("kv.Backup/Run", Some(&urn), None));
    }

    fn call(peer: Option<Peer>, principal: Option<Principal>) -> ServerCall {
        ServerCall {
            method: "kv.KeyValue/Put".into(),
            metadata: Default::default(),
            timeout: None,
            payload: Default::default(),
            stream: None,
            compressed: false,
            received: None,
            bulk: None,
            peer: peer.map(Arc::new),
            principal: principal.map(Arc::new),
            extensions: crate::Extensions::new(),
        }
    }

    #[test]
    fn refusal_is_permission_denied_only_for_authenticated_callers() {
        let status = refusal(&call(None, Some(Principal::new("ann"))));
        assert_eq!(status.code(), crate::Code::PERMISSION_DENIED);
        assert_eq!(status.message(), "\"ann\" may not call kv.KeyValue/Put");

        let status = refusal(&call(Some(mtls(&["spiffe://x/web"], &[])), None));
        assert_eq!(status.code(), crate::Code::PERMISSION_DENIED);
        assert!(status.message().contains("spiffe://x/web"), "{status}");

        let status = refusal(&call(Some(mtls(&[], &[])), None));
        assert_eq!(status.code(), crate::Code::PERMISSION_DENIED, "{status}");

        let tls_without_certificate = Peer::new("tls://h:1").with_tls(TlsIdentity::default());
        for peer in [
            None,
            Some(Peer::new("tcp://h:1")),
            Some(tls_without_certificate),
        ] {
            let status = refusal(&call(peer, None));
            assert_eq!(status.code(), crate::Code::UNAUTHENTICATED, "{status}");
        }
    }
}
