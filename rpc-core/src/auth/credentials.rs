//! The client side: [`CredentialsLayer`] adds credentials (a bearer token, or any
//! metadata) to every call, fetching and caching them through an async source.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::Instant;
use tower::{Layer, Service};

use crate::{client::ClientCall, codegen::BoxFuture, Metadata, MetadataValue, Status};

/// The metadata key bearer tokens travel under.
pub const AUTHORIZATION: &str = "authorization";

/// What a credential source produced: the metadata to add to every call, and when it
/// stops being good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    metadata: Metadata,
    expires_at: Option<Instant>,
}

impl Credential {
    /// Credentials as metadata (every key it holds replaces the call's values under
    /// that key), good until replaced: they never expire unless
    /// [`expires_in`](Self::expires_in) or [`expires_at`](Self::expires_at) says so.
    pub fn new(metadata: Metadata) -> Credential {
        Credential {
            metadata,
            expires_at: None,
        }
    }

    /// A bearer token: `authorization: Bearer <token>`.
    pub fn bearer(token: impl fmt::Display) -> Credential {
        let mut metadata = Metadata::new();
        metadata
            .insert(
                AUTHORIZATION,
                MetadataValue::from(format!("Bearer {token}")),
            )
            .expect("`authorization` is a valid text key");
        Credential::new(metadata)
    }

    /// Expires `ttl` from now (by Tokio's clock, so paused time moves it).
    pub fn expires_in(self, ttl: Duration) -> Credential {
        self.expires_at(Instant::now() + ttl)
    }

    /// Expires at `deadline`.
    pub fn expires_at(mut self, deadline: Instant) -> Credential {
        self.expires_at = Some(deadline);
        self
    }

    /// The metadata added to each call.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// When the credential expires (`None`: never).
    pub fn expiry(&self) -> Option<Instant> {
        self.expires_at
    }

    fn is_fresh(&self, now: Instant) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }

    /// Puts the credential's entries on `metadata`, replacing values under its keys.
    fn apply(&self, metadata: &mut Metadata) {
        let mut keys: Vec<&str> = self.metadata.iter().map(|(k, _)| k).collect();
        keys.dedup();
        for key in keys {
            metadata.remove(key);
        }
        metadata.extend(self.metadata.clone());
    }
}

type Source = dyn Fn() -> BoxFuture<Result<Credential, Status>> + Send + Sync;

/// The cached credential and the one refresh at a time.
struct Cache {
    source: Box<Source>,
    /// The cached credential, or the outcome of the last refresh. Held across a
    /// refresh, so that concurrent calls wait for it instead of starting their own.
    state: tokio::sync::Mutex<State>,
    /// Refreshes finished, read before waiting for `state`: a caller that waited
    /// through a failed refresh gets its error rather than trying again at once.
    refreshes: AtomicU64,
    /// Whether a call refused `UNAUTHENTICATED` makes the credential it carried
    /// stale ([`CredentialsLayer::refresh_when_rejected`]).
    refresh_when_rejected: AtomicBool,
    /// The credential each recent keyed call's first attempt carried: its retries
    /// carry the same (see [`KEYED_CALLS`]).
    keyed: Mutex<Keyed>,
}

/// How many keyed calls' credentials a [`CredentialsLayer`] remembers for keys an
/// application repeats itself, outside a retry layer (the oldest go first).
/// A server files a keyed call's outcome under its caller's credentials
/// (`docs/wire.md` §6.8): a retry carrying a token refreshed since its first attempt
/// is another caller's call there, and would run again.
pub const KEYED_CALLS: usize = 4096;

/// The credentials of recent keyed calls, by client id and call number.
#[derive(Default)]
struct Keyed {
    by_call: HashMap<(u128, u64), Credential>,
    order: VecDeque<(u128, u64)>,
}

impl Keyed {
    fn get(&self, call: (u128, u64)) -> Option<Credential> {
        self.by_call.get(&call).cloned()
    }

    fn remember(&mut self, call: (u128, u64), credential: Credential) {
        if self.by_call.insert(call, credential).is_some() {
            return;
        }
        self.order.push_back(call);
        if self.order.len() > KEYED_CALLS {
            if let Some(oldest) = self.order.pop_front() {
                self.by_call.remove(&oldest);
            }
        }
    }
}

#[derive(Default)]
struct State {
    current: Option<Credential>,
    last_error: Option<Status>,
}

impl Cache {
    async fn get(&self) -> Result<Credential, Status> {
        let seen = self.refreshes.load(Ordering::Acquire);
        let mut state = self.state.lock().await;
        if let Some(current) = &state.current {
            if current.is_fresh(Instant::now()) {
                return Ok(current.clone());
            }
        }
        if self.refreshes.load(Ordering::Acquire) != seen {
            if let Some(err) = &state.last_error {
                return Err(err.clone());
            }
        }
        // If this future is dropped here the refresh is abandoned, the lock released,
        // and the next caller starts over.
        let outcome = (self.source)().await;
        self.refreshes.fetch_add(1, Ordering::Release);
        match outcome {
            Ok(credential) => {
                state.current = Some(credential.clone());
                state.last_error = None;
                Ok(credential)
            }
            Err(status) => {
                state.current = None;
                state.last_error = Some(status.clone());
                Err(status)
            }
        }
    }

    /// A call carrying `credential` was refused `UNAUTHENTICATED`: if it is still the
    /// cached one, the next call refreshes it. (A credential refreshed meanwhile is
    /// kept: the refusal was of its predecessor.) Not waited for: while another call
    /// holds the cache (a refresh under way, which replaces the credential anyway),
    /// the refused call's status is not held behind it; at worst one more call is
    /// refused with the old credential, and drops it.
    fn rejected(&self, credential: &Credential) {
        if let Ok(mut state) = self.state.try_lock() {
            if state.current.as_ref() == Some(credential) {
                state.current = None;
            }
        }
    }
}

/// A tower layer over a client's service (a [`Channel`](crate::client::Channel), or a
/// stack over one) that adds credentials to every call, streaming calls included.
///
/// The credentials come from an async source and are cached until they expire; then
/// the next call refreshes them. One refresh runs at a time: calls that arrive during
/// it wait for its result instead of starting their own. A refresh that fails fails
/// the call (and the calls that waited for it) with the source's status, and nothing
/// is sent; the call after that tries again.
///
/// ```
/// use std::time::Duration;
/// use rpc_core::{auth::{Credential, CredentialsLayer}, Status};
///
/// // A fixed token.
/// let fixed = CredentialsLayer::bearer("s3cret");
///
/// // A token from a token service, good for an hour.
/// let fetched = CredentialsLayer::new(|| async {
///     let token = "fetched-token"; // e.g. an HTTP call to the token service
///     Ok::<_, Status>(Credential::bearer(token).expires_in(Duration::from_secs(3600)))
/// });
/// // let channel = ServiceBuilder::new().layer(fetched).service(channel);
/// // let mut client = KeyValueClient::new(channel);
/// # drop((fixed, fetched));
/// ```
///
/// Place it under a retry layer (nearer the channel) if each attempt should carry
/// current credentials. The attempts of a keyed call (one the retry layer may repeat
/// although it has side effects: it carries a call key) all carry the credential of
/// its first attempt, whatever has been refreshed since: a server recognises a repeat
/// only from the same caller (`docs/wire.md` §6.8), and a retry with a new token would
/// run again there. Such a retry after its token expired fails `UNAUTHENTICATED`
/// rather than run twice. Under a retry layer each keyed call keeps its own; a key
/// the application repeats itself finds it among the last [`KEYED_CALLS`] keyed
/// calls'.
#[derive(Clone)]
pub struct CredentialsLayer {
    cache: Arc<Cache>,
}

impl fmt::Debug for CredentialsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CredentialsLayer(..)")
    }
}

impl CredentialsLayer {
    /// Credentials from `source`, an async function called for the first call and
    /// again whenever the credential it gave has expired. Its `Err` fails the calls
    /// that waited for it with that status (typically `UNAUTHENTICATED`, or
    /// `UNAVAILABLE` if a token service is down).
    pub fn new<F, Fut>(source: F) -> CredentialsLayer
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Credential, Status>> + Send + 'static,
    {
        CredentialsLayer {
            cache: Arc::new(Cache {
                source: Box::new(move || Box::pin(source())),
                state: tokio::sync::Mutex::new(State::default()),
                refreshes: AtomicU64::new(0),
                refresh_when_rejected: AtomicBool::new(false),
                keyed: Mutex::default(),
            }),
        }
    }

    /// Also treats a credential as expired once a call that carried it is refused
    /// `UNAUTHENTICATED`: the next call refreshes it. For credentials a server can
    /// revoke or forget before their expiry (etcd's tokens, lost when etcd restarts;
    /// a session token revoked by its issuer). Only the call's own refusal counts (a
    /// unary call's status, or a streaming call refused before its stream opened),
    /// and only for the credential that call carried: one refresh per rejected
    /// credential, however many calls were refused with it. The refused call itself
    /// is not sent again. The setting belongs to the credentials cache, which clones
    /// of this layer, and the services they made, share: it applies to them too.
    pub fn refresh_when_rejected(self) -> CredentialsLayer {
        self.cache
            .refresh_when_rejected
            .store(true, Ordering::Relaxed);
        self
    }

    /// A fixed credential that never expires.
    pub fn fixed(credential: Credential) -> CredentialsLayer {
        CredentialsLayer::new(move || std::future::ready(Ok(credential.clone())))
    }

    /// A fixed bearer token: `authorization: Bearer <token>` on every call.
    pub fn bearer(token: impl fmt::Display) -> CredentialsLayer {
        CredentialsLayer::fixed(Credential::bearer(token))
    }
}

impl<S> Layer<S> for CredentialsLayer {
    type Service = WithCredentials<S>;

    fn layer(&self, inner: S) -> WithCredentials<S> {
        WithCredentials {
            inner,
            cache: self.cache.clone(),
        }
    }
}

/// A client service that adds credentials to every call; made by [`CredentialsLayer`].
#[derive(Clone)]
pub struct WithCredentials<S> {
    inner: S,
    cache: Arc<Cache>,
}

/// The credential for a call whose time budget is `timeout`: the wait for a refresh
/// is bounded by it and spends it ([`within_budget`](crate::intercept::within_budget)),
/// but the refresh itself runs to its end in a task of its own when this call stops
/// waiting (the cache's refresh, dropped, was abandoned and started over by the next
/// call: calls whose timeouts were all shorter than the token source never got a token;
/// from a review). A cached credential, or a call without a timeout, costs no task.
async fn fetch(
    cache: &Arc<Cache>,
    timeout: &mut Option<std::time::Duration>,
) -> Result<Credential, Status> {
    let get = {
        let cache = cache.clone();
        async move { cache.get().await }
    };
    if timeout.is_none() {
        return get.await;
    }
    let mut get = Box::pin(get);
    if let std::task::Poll::Ready(got) = futures::poll!(&mut get) {
        return got;
    }
    let refresh = tokio::spawn(get);
    crate::intercept::within_budget(timeout, "its credential was fetched", async {
        refresh.await.unwrap_or_else(|err| {
            Err(Status::internal(format!(
                "the credential source failed: {err}"
            )))
        })
    })
    .await
}

impl<S: fmt::Debug> fmt::Debug for WithCredentials<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithCredentials")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<ClientCall> for WithCredentials<S>
where
    S: Service<ClientCall, Error = Status> + Clone + Send + 'static,
    S::Response: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Status;
    type Future = BoxFuture<Result<S::Response, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ClientCall) -> Self::Future {
        // The ready service serves this call; the clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let cache = self.cache.clone();
        let keyed = call.call_key.map(|key| (key.client, key.call));
        // Under a retry layer, the attempts of a keyed call share a slot for it; else
        // (a key the application repeats itself) the recent keyed calls' table.
        let shared = keyed.and_then(|_| crate::retry::call_shared());
        Box::pin(async move {
            // Every attempt of a keyed call carries its first attempt's credential, so
            // that the server's duplicate cache knows the retry for the same caller's.
            let remembered = match (&shared, keyed) {
                (Some(shared), _) => shared.credential.get().cloned(),
                (None, Some(call)) => cache.keyed.lock().unwrap().get(call),
                (None, None) => None,
            };
            let credential = match remembered {
                Some(credential) => credential,
                None => {
                    let credential = fetch(&cache, &mut call.timeout).await?;
                    match (&shared, keyed) {
                        (Some(shared), _) => {
                            let _ = shared.credential.set(credential.clone());
                        }
                        (None, Some(call)) => cache
                            .keyed
                            .lock()
                            .unwrap()
                            .remember(call, credential.clone()),
                        (None, None) => {}
                    }
                    credential
                }
            };
            credential.apply(&mut call.metadata);
            let outcome = inner.call(call).await;
            if let Err(status) = &outcome {
                if status.code() == crate::Code::UNAUTHENTICATED
                    && cache.refresh_when_rejected.load(Ordering::Relaxed)
                {
                    cache.rejected(&credential);
                }
            }
            outcome
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_replaces_the_calls_values_under_its_keys() {
        let mut metadata = Metadata::new();
        metadata.insert("authorization", "Bearer old").unwrap();
        metadata.insert("x-other", "kept").unwrap();
        let mut extra = Metadata::new();
        extra.append("x-key", "a").unwrap();
        extra.append("x-key", "b").unwrap();
        Credential::bearer("new").apply(&mut metadata);
        Credential::new(extra).apply(&mut metadata);
        assert_eq!(metadata.get_str("authorization"), Some("Bearer new"));
        assert_eq!(metadata.get_all("authorization").count(), 1);
        assert_eq!(metadata.get_str("x-other"), Some("kept"));
        let keys: Vec<_> = metadata
            .get_all("x-key")
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(keys, ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn freshness_follows_tokios_clock() {
        let credential = Credential::bearer("t").expires_in(Duration::from_secs(10));
        assert!(credential.is_fresh(Instant::now()));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!credential.is_fresh(Instant::now()));
        assert!(Credential::bearer("t").is_fresh(Instant::now()));
    }
}
