//! Retries as a tower layer, driven by whether a method is safe to repeat.
//!
//! [`RetryLayer`] wraps any `tower::Service<ClientCall>` (a [`Channel`], or a stack over
//! one) and tries a failed call again when that cannot do harm:
//!
//! - a call whose request **certainly reached no handler**
//!   ([`Status::is_unprocessed`]: never written, refused by a server going away, or
//!   on the gRPC wire a stream the server refused before answering) is
//!   retried whatever the method;
//! - a method marked `option idempotency_level = IDEMPOTENT` or `NO_SIDE_EFFECTS` in the
//!   `.proto` is also retried when it fails with a retryable code (default:
//!   `UNAVAILABLE`) or when one attempt ran out of its per-attempt timeout;
//! - any other failure of a method that may have side effects is returned as it is:
//!   the request may have run, and running it twice is what this module exists to
//!   prevent.
//!
//! Per-method overrides change the attempts, the codes, or whether a method counts as
//! safe to repeat.
//!
//! # Why a budget, not just a maximum of attempts
//!
//! With "up to 3 attempts" alone, an outage turns every call into three: the load on a
//! struggling server triples exactly when it can least take it, and retries from many
//! clients synchronize into storms. A retry budget caps retries at a fraction of recent
//! calls (default 20%) plus a small floor per second, so a healthy system retries its
//! rare failures freely while a failing one sends at most 1.2× its normal load.
//! Backoff is exponential with jitter (each wait uniform between half and all of the
//! exponential value), so the retries that do happen spread out.
//!
//! The call's own timeout covers all its attempts: a retry is not started if the
//! backoff would outlive it.
//!
//! A server may say when to retry, or not to, in the failed call's status
//! ([`Pushback`], gRPC's `grpc-retry-pushback-ms`): the layer then waits exactly that
//! long instead of its backoff, or returns the failure as it is.
//!
//! [`Channel`]: crate::client::Channel

mod policy;
mod pushback;

use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::Future;
use tokio::time::Instant;
use tower::{retry::budget::Budget, Layer, Service, ServiceExt};

pub use policy::{MethodRetry, RetryPolicy};
pub use pushback::{Pushback, RETRY_PUSHBACK};
pub use tower::retry::budget::TpsBudget;

use crate::{
    client::{ClientCall, ClientReply},
    frame::CallKey,
    Code, Status,
};

tokio::task_local! {
    /// The attempt number of the call the retry layer is making (see
    /// [`current_attempt`]), when the call's first attempt began, and what a keyed
    /// call's attempts share.
    static ATTEMPT: (u32, Instant, Option<Arc<CallShared>>);
}

/// What the attempts of one keyed call share, for the layers under the retry layer.
#[derive(Default)]
pub(crate) struct CallShared {
    /// The credential the call's first attempt carried
    /// ([`CredentialsLayer`](crate::auth::CredentialsLayer)): every attempt carries it,
    /// so that the server's duplicate cache knows them for one caller's.
    pub(crate) credential: std::sync::OnceLock<crate::auth::Credential>,
    /// The replica ([`Balanced`](crate::balance::Balanced)) of the call's last attempt
    /// that failed after it may have run: where its next attempt goes. Kept here, with
    /// the call, rather than among the balancer's recent calls, where other calls'
    /// failures could push it out while this one waits for its retry.
    pub(crate) replica: std::sync::Mutex<Option<crate::Endpoint>>,
}

/// What the attempts of the keyed call the retry layer is making share, from the
/// `call` of a service under a [`Retry`]; `None` elsewhere and for unkeyed calls.
pub(crate) fn call_shared() -> Option<Arc<CallShared>> {
    ATTEMPT
        .try_with(|(_, _, shared)| shared.clone())
        .ok()
        .flatten()
}

/// The attempt number (1 for the first, 2 for the first retry or a hedge...) of the
/// call being made, when called from the `call` of a service under a [`Retry`]: what
/// a tracing or metrics layer placed under the retry layer records. `None` elsewhere.
///
/// It counts every attempt, including those retried because they never reached a
/// handler (whose [`CallKey::attempt`] on the wire does not grow).
pub fn current_attempt() -> Option<u32> {
    ATTEMPT.try_with(|(attempt, _, _)| *attempt).ok()
}

/// When the call the retry layer is making began (its first attempt), from the `call`
/// of a service under a [`Retry`]: a channel's default timeout runs from there, not
/// afresh for each attempt. `None` elsewhere.
pub(crate) fn call_began() -> Option<Instant> {
    ATTEMPT.try_with(|(_, began, _)| *began).ok()
}

/// Wraps services in [`Retry`]. Cheap to clone; clones share the budget and the
/// client identity.
///
/// ```
/// use rpc_core::{client::{Channel, Client}, link::mem, retry::{RetryLayer, RetryPolicy}, Request};
/// use tower::Layer;
/// # use std::sync::{atomic::{AtomicBool, Ordering}, Arc};
/// # use rpc_core::{method::{Idempotency, MethodDescriptor}, server::{Server, ServerCall, ServerReply}, Status};
/// # static SAY: MethodDescriptor = MethodDescriptor { service: "demo.Echo", method: "Say",
/// #     path: "demo.Echo/Say", idempotency: Idempotency::NoSideEffects };
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let failed = Arc::new(AtomicBool::new(false));
/// # let flaky = tower::service_fn(move |call: ServerCall| {
/// #     let fail = !failed.swap(true, Ordering::Relaxed);
/// #     async move {
/// #         if fail { return Err(Status::unavailable("warming up")); }
/// #         Ok(ServerReply { payload: call.payload.into(), ..ServerReply::default() })
/// #     }
/// # });
/// // A server whose first answer is UNAVAILABLE.
/// let (listener, connector) = mem::listener();
/// tokio::spawn(Server::builder().add_named_service("demo.Echo", flaky).serve(listener));
///
/// let channel = Channel::builder().connect(connector).await?;
/// let retrying = RetryLayer::new(RetryPolicy::default()).layer(channel);
/// // Generated clients have a shorthand: `EchoClient::new(channel).with_retries(policy)`.
/// let mut client = Client::new(retrying);
/// // `SAY` (`demo.Echo/Say`) is NO_SIDE_EFFECTS, as the `.proto` says: the failed attempt
/// // is tried again after a backoff, within the retry budget.
/// let reply = client.unary::<_, String>(Request::new("hi".to_string()), &SAY).await?;
/// assert_eq!(reply.into_inner(), "hi");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RetryLayer {
    policy: Arc<RetryPolicy>,
    budget: Arc<TpsBudget>,
    identity: Arc<Identity>,
}

/// The client id and call counter behind call keys; one per layer, so it survives
/// reconnects of the channel underneath.
#[derive(Debug)]
struct Identity {
    client: u128,
    next_call: AtomicU64,
}

impl Identity {
    fn new_key(&self) -> CallKey {
        CallKey {
            client: self.client,
            call: self.next_call.fetch_add(1, Ordering::Relaxed),
            attempt: 1,
        }
    }
}

impl RetryLayer {
    /// A layer with `policy` and its own budget (see [`RetryPolicy::budget_percent`]).
    pub fn new(policy: RetryPolicy) -> RetryLayer {
        let budget = Arc::new(policy.new_budget());
        RetryLayer {
            policy: Arc::new(policy),
            budget,
            identity: Arc::new(Identity {
                client: crate::frame::random_client_id(),
                next_call: AtomicU64::new(1),
            }),
        }
    }

    /// The budget, to observe or share.
    pub fn budget(&self) -> &Arc<TpsBudget> {
        &self.budget
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry {
            inner,
            policy: self.policy.clone(),
            budget: self.budget.clone(),
            identity: self.identity.clone(),
        }
    }
}

/// A service that retries failed calls as its [`RetryPolicy`] allows.
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    policy: Arc<RetryPolicy>,
    budget: Arc<TpsBudget>,
    identity: Arc<Identity>,
}

impl<S> Service<ClientCall> for Retry<S>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = ClientReply;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<ClientReply, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ClientCall) -> Self::Future {
        let safe = self
            .policy
            .method(&call.method)
            .safe_to_repeat
            .unwrap_or(call.idempotency.is_safe_to_repeat());
        // The ready service makes the first attempt; a clone makes the others.
        let clone = self.inner.clone();
        if call.is_streaming() {
            // A stream's messages cannot be sent twice: one attempt, as is (and no
            // call key: a server gives streams no at-most-once protection).
            let mut first = std::mem::replace(&mut self.inner, clone);
            return Box::pin(first.call(call));
        }
        if !safe && self.policy.at_most_once && call.call_key.is_none() {
            call.call_key = Some(self.identity.new_key());
        }
        let first = std::mem::replace(&mut self.inner, clone);
        let policy = self.policy.clone();
        let budget = self.budget.clone();
        // Under another retry layer (read here, in `call`, where its task-local is
        // set): the outer call's start and shared slot are this call's too, so that
        // its default timeout and its first credential hold across the outer attempts.
        let outer = ATTEMPT
            .try_with(|(_, began, shared)| (*began, shared.clone()))
            .ok();
        Box::pin(run(first, call, policy, budget, outer))
    }
}

/// `svc.call(call)` with the attempt's task-local ([`current_attempt`], the call's
/// start, what its attempts share) set while the call is made *and* whenever its future
/// is polled: a layer under the retry layer that calls the service under it from its
/// future, after a wait (a credential fetched, a slot, `Balanced`'s replica of an
/// earlier attempt), still sees it. Set only during `call`, it was gone by then, and
/// the channel's default timeout ran afresh for each attempt, the attempt number
/// missing from traces and metrics (from a review).
fn call_in_scope<S>(
    svc: &mut S,
    call: ClientCall,
    attempt: (u32, Instant, Option<Arc<CallShared>>),
) -> impl std::future::Future<Output = Result<ClientReply, Status>>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status>,
{
    let future = ATTEMPT.sync_scope(attempt.clone(), || svc.call(call));
    ATTEMPT.scope(attempt, future)
}

/// One attempt's copy of the call: its attempt number and its time budget.
fn attempt_call(
    call: &ClientCall,
    attempt: u32,
    policy: &RetryPolicy,
    deadline: Option<Instant>,
) -> ClientCall {
    let mut this = call.clone();
    if let Some(key) = &mut this.call_key {
        // A key made above this layer (the caller's, or an outer retry layer's) may
        // already count attempts: this layer's count adds to it, never restarts it (an
        // outer attempt 2 sent as 1 skips the server's horizon check).
        key.attempt = key.attempt.max(1).saturating_add(attempt - 1);
    }
    this.timeout = match (policy.per_attempt_timeout, deadline) {
        (Some(per), Some(d)) => Some(per.min(d.saturating_duration_since(Instant::now()))),
        (Some(per), None) => Some(per),
        (None, Some(d)) => Some(d.saturating_duration_since(Instant::now())),
        (None, None) => None,
    };
    this
}

/// The first attempt and, if it is slow, a hedge: a second attempt started after
/// `delay`. The first success wins; dropping the other attempt's future cancels it
/// (on the server too). A failure the policy would not retry ends the call at once
/// (gRPC's fatal status of a hedge); another waits for the other attempt. Returns the
/// result, the attempts used (two if the hedge was sent), whether an attempt whose
/// status is not the one returned may have reached a handler, and the pushback of an
/// attempt that failed first (its status is not the one returned, but the server's
/// word on retrying still holds).
async fn hedged<S>(
    svc: &mut S,
    call: &ClientCall,
    policy: &RetryPolicy,
    deadline: Option<Instant>,
    delay: Duration,
    budget: &TpsBudget,
    (began, shared): (Instant, &Option<Arc<CallShared>>),
) -> (Result<ClientReply, Status>, u32, bool, Option<Pushback>)
where
    S: Service<ClientCall, Response = ClientReply, Error = Status> + Clone,
{
    let first = call_in_scope(
        svc,
        attempt_call(call, 1, policy, deadline),
        (1, began, shared.clone()),
    );
    tokio::pin!(first);
    if let Ok(result) = tokio::time::timeout(delay, &mut first).await {
        return (result, 1, false, None); // answered before the hedge delay
    }
    // Hedge only if the service can take a call right now: waiting for readiness
    // while the first attempt holds a slot (an in-flight permit) could wait forever.
    // Readiness first: a hedge that cannot be sent spends no retry budget.
    let mut hedge_svc = svc.clone();
    match futures::FutureExt::now_or_never(hedge_svc.ready()) {
        Some(Ok(_)) => {}
        _ => return (first.await, 1, false, None),
    }
    if !budget.withdraw() {
        // The hedge's slot (an in-flight permit taken by its readiness) goes back.
        drop(hedge_svc);
        return (first.await, 1, false, None);
    }
    tracing::debug!(method = %call.method, ?delay, "hedging");
    let second = call_in_scope(
        &mut hedge_svc,
        attempt_call(call, 2, policy, deadline),
        (2, began, shared.clone()),
    );
    tokio::pin!(second);
    let method = policy.method(&call.method);
    let (failed, other) = match futures::future::select(first, second).await {
        futures::future::Either::Left((Ok(reply), _loser))
        | futures::future::Either::Right((Ok(reply), _loser)) => {
            return (Ok(reply), 2, false, None)
        }
        futures::future::Either::Left((Err(failed), other)) => {
            (failed, futures::future::Either::Left(other))
        }
        futures::future::Either::Right((Err(failed), other)) => {
            (failed, futures::future::Either::Right(other))
        }
    };
    let failed_may_have_run = !failed.is_unprocessed();
    // An attempt that ran out of its own time (a per-attempt timeout) while the call
    // has time left is not fatal: the other goes on, as a retry would.
    let attempt_expired = failed.code() == Code::DEADLINE_EXCEEDED
        && policy.per_attempt_timeout.is_some()
        && deadline.is_none_or(|d| Instant::now() < d);
    // One that never left goes on like a retry would, unless its own deadline kept it
    // (as in `run`).
    let unsent =
        failed.is_unprocessed() && (failed.code() != Code::DEADLINE_EXCEEDED || attempt_expired);
    if !unsent && !attempt_expired && !method.retryable(policy).contains(&failed.code()) {
        // Fatal: the other attempt is cancelled (dropped) and this status is the call's.
        // That attempt was sent and may have reached a handler: the status must not
        // say the call certainly ran nowhere (an attempt refused unprocessed at the
        // call's deadline would).
        return (Err(failed), 2, true, None);
    }
    let pushback = Pushback::of(&failed);
    (other.await, 2, failed_may_have_run, pushback)
}

/// The stricter of two pushbacks: not retrying over any delay, the longer delay
/// over the shorter, either over none.
fn stricter(a: Option<Pushback>, b: Option<Pushback>) -> Option<Pushback> {
    match (a, b) {
        (Some(Pushback::Stop), _) | (_, Some(Pushback::Stop)) => Some(Pushback::Stop),
        (Some(Pushback::RetryAfter(x)), Some(Pushback::RetryAfter(y))) => {
            Some(Pushback::RetryAfter(x.max(y)))
        }
        (a, b) => a.or(b),
    }
}

async fn run<S>(
    mut svc: S,
    call: ClientCall,
    policy: Arc<RetryPolicy>,
    budget: Arc<TpsBudget>,
    outer: Option<(Instant, Option<Arc<CallShared>>)>,
) -> Result<ClientReply, Status>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status> + Clone,
{
    budget.deposit();
    let (began, outer_shared) = match outer {
        Some((began, shared)) => (began, shared),
        None => (Instant::now(), None),
    };
    // Only keyed calls share anything between attempts (an allocation per such call).
    let shared = outer_shared.or_else(|| {
        call.call_key
            .is_some()
            .then(|| Arc::new(CallShared::default()))
    });
    // A timeout too large to add to now (`Duration::MAX` as "no limit") is no deadline.
    let deadline = call.timeout.and_then(|t| Instant::now().checked_add(t));
    let method = policy.method(&call.method);
    let safe = method
        .safe_to_repeat
        .unwrap_or(call.idempotency.is_safe_to_repeat());
    let max_attempts = method.max_attempts.unwrap_or(policy.max_attempts);
    let mut attempt: u32 = 1;
    // The attempt number on the wire counts only attempts that may have reached a
    // handler: after an unprocessed failure the next one is, for the server, a first.
    let mut wire_attempt: u32 = 1;
    // The first attempt's service was made ready by the caller.
    let mut ready = true;
    // The attempt of the last pushback: the backoff steps count from it.
    let mut pushed_at: u32 = 0;
    // Whether an attempt that failed may have reached a handler: the call's final
    // status is then never unprocessed, whatever its last attempt's (a retry turned
    // away by the replica of its first attempt, a killed one, is unprocessed itself,
    // but the first may have run: a caller trusting the mark would run it again).
    let mut may_have_run = false;
    let end = |status: Status, may_have_run: bool| {
        if may_have_run {
            status.into_possibly_run()
        } else {
            status
        }
    };
    loop {
        // The pushback of a hedged attempt that failed before the other ended.
        let mut hedge_pushback = None;
        let result = match policy.hedge_delay {
            // Hedging sends a second copy while the first may be running: only for
            // methods that are safe to repeat, only once per call, and only when two
            // attempts are allowed.
            Some(delay) if attempt == 1 && safe && max_attempts >= 2 => {
                let (result, used, other_may_have_run, pushback) = hedged(
                    &mut svc,
                    &call,
                    &policy,
                    deadline,
                    delay,
                    &budget,
                    (began, &shared),
                )
                .await;
                attempt = used;
                wire_attempt = used;
                may_have_run |= other_may_have_run;
                hedge_pushback = pushback;
                result
            }
            _ => {
                if !ready {
                    ready_by(&mut svc, deadline, (attempt, began, shared.clone()))
                        .await
                        .map_err(|status| end(status, may_have_run))?;
                }
                call_in_scope(
                    &mut svc,
                    attempt_call(&call, wire_attempt, &policy, deadline),
                    (attempt, began, shared.clone()),
                )
                .await
            }
        };
        ready = false;
        let status = match result {
            Ok(reply) => return Ok(reply),
            Err(status) => status,
        };
        may_have_run |= !status.is_unprocessed();
        let overall_expired = deadline.is_some_and(|d| Instant::now() >= d);
        // Only a per-attempt timeout can run out before the call's deadline; without
        // one (a call relying on the channel's default timeout, which each attempt would
        // get afresh) DEADLINE_EXCEEDED ends the call.
        let attempt_expired = status.code() == Code::DEADLINE_EXCEEDED
            && policy.per_attempt_timeout.is_some()
            && !overall_expired;
        // A call with a key may be repeated: the server runs it at most once. (The
        // client cannot tell a handler's own retryable status from its transport's:
        // links and servers answer transport failures with RESPONSEs too.)
        let repeatable = safe || call.call_key.is_some();
        // An attempt that never left the client is sent again whatever the method,
        // unless what kept it was the call's own deadline (it was still waiting to
        // be written when that passed): a next attempt would be past it as well.
        let unsent = status.is_unprocessed()
            && (status.code() != Code::DEADLINE_EXCEEDED || attempt_expired);
        let retryable = unsent
            || (repeatable && method.retryable(&policy).contains(&status.code()))
            || (safe && attempt_expired);
        if !retryable || attempt >= max_attempts {
            return Err(end(status, may_have_run));
        }
        let backoff = match stricter(Pushback::of(&status), hedge_pushback) {
            Some(Pushback::Stop) => {
                tracing::debug!(method = %call.method, %status, "not retried: the server's pushback says so");
                return Err(end(status, may_have_run));
            }
            Some(Pushback::RetryAfter(delay)) if delay > policy.max_pushback => {
                tracing::debug!(method = %call.method, %status, ?delay, "not retried: the server's pushback is longer than the policy's max_pushback");
                return Err(end(status, may_have_run));
            }
            Some(Pushback::RetryAfter(delay)) => {
                pushed_at = attempt;
                delay
            }
            None => policy.backoff(attempt - pushed_at),
        };
        if deadline.is_some_and(|d| Instant::now().checked_add(backoff).is_none_or(|t| t >= d)) {
            return Err(end(status, may_have_run));
        }
        if !budget.withdraw() {
            tracing::debug!(method = %call.method, "retry budget exhausted");
            return Err(end(status, may_have_run));
        }
        tracing::debug!(method = %call.method, attempt, ?backoff, %status, "retrying");
        tokio::time::sleep(backoff).await;
        attempt += 1;
        if !status.is_unprocessed() {
            wire_attempt += 1;
        }
    }
}

/// Waits for `svc` to take another attempt, within the call's `deadline` (or, without
/// one, within what is left of the default timeout of the channel that makes it wait,
/// counted from the call's first attempt: the attempt's task-local is set while it
/// polls): a channel whose in-flight slots are all taken (a server that holds calls and
/// never answers) would otherwise keep a retry waiting past it. The failure is marked
/// never sent, which `run`'s `end` turns into "may have run" if an earlier attempt may
/// have.
async fn ready_by<S>(
    svc: &mut S,
    deadline: Option<Instant>,
    attempt: (u32, Instant, Option<Arc<CallShared>>),
) -> Result<(), Status>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status>,
{
    let mut budget = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let wait = crate::intercept::ready_within_budget(
        &mut budget,
        "waiting for room to send a retry (every in-flight slot taken)",
        async { svc.ready().await.map(|_| ()) },
    );
    ATTEMPT.scope(attempt, wait).await
}

/// The jittered backoff before retry number `attempt` (1-based): with
/// `e = min(max, initial * multiplier^(attempt-1))`, uniform in `[e/2, e]` for `unit` in
/// `[0, 1)` ("equal jitter": spread out, yet never close to no wait at all).
pub(crate) fn jittered(
    initial: Duration,
    max: Duration,
    multiplier: f64,
    attempt: u32,
    unit: f64,
) -> Duration {
    let exp = initial.as_secs_f64() * multiplier.powi(attempt.saturating_sub(1).min(60) as i32);
    Duration::from_secs_f64(exp.min(max.as_secs_f64()) * (0.5 + unit / 2.0))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tower::service_fn;

    use super::*;
    use crate::method::Idempotency;

    fn call(idempotency: Idempotency, key: Option<CallKey>) -> ClientCall {
        ClientCall {
            method: "t.S/M".into(),
            idempotency,
            metadata: Default::default(),
            timeout: None,
            call_key: key,
            payload: Default::default(),
            stream: None,
            compress: None,
        }
    }

    fn hedging(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            hedge_delay: Some(Duration::from_millis(10)),
            max_attempts,
            ..RetryPolicy::default()
        }
    }

    /// The first attempt runs and fails; the hedge is turned away unprocessed: the
    /// call may have run, so its status must not say it certainly did not (the loser's
    /// status was dropped with its mark).
    #[tokio::test(start_paused = true)]
    async fn a_hedged_call_keeps_the_mark_of_an_attempt_that_may_have_run() {
        // The attempt is read in `call` (the task-local is set around it only).
        let svc = service_fn(|_call: ClientCall| {
            let attempt = current_attempt();
            async move {
                match attempt {
                    Some(1) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Err::<ClientReply, _>(Status::unavailable("ran and failed"))
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(40)).await;
                        Err(Status::unavailable("turned away").into_unprocessed())
                    }
                }
            }
        });
        let mut retry = RetryLayer::new(hedging(2)).layer(svc);
        let err = retry
            .ready()
            .await
            .unwrap()
            .call(call(Idempotency::NoSideEffects, None))
            .await
            .unwrap_err();
        assert_eq!(err.message(), "turned away");
        assert!(!err.is_unprocessed(), "{err:?}");
    }

    /// A status the policy does not retry, from either attempt, ends a hedged call at
    /// once (it waited for the other attempt, here for ever, and then returned that
    /// one's status instead).
    #[tokio::test(start_paused = true)]
    async fn a_fatal_status_of_a_hedged_attempt_ends_the_call() {
        // The attempt is read in `call` (the task-local is set around it only).
        let svc = service_fn(|_call: ClientCall| {
            let attempt = current_attempt();
            async move {
                match attempt {
                    Some(1) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Err::<ClientReply, _>(Status::not_found("no such key"))
                    }
                    _ => futures::future::pending().await,
                }
            }
        });
        let mut retry = RetryLayer::new(hedging(3)).layer(svc);
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            retry
                .ready()
                .await
                .unwrap()
                .call(call(Idempotency::NoSideEffects, None)),
        )
        .await
        .expect("the fatal status did not end the call");
        assert_eq!(result.unwrap_err().code(), Code::NOT_FOUND);
    }

    /// The server's pushback on the hedged attempt that failed first still holds
    /// when the other then fails too: `Stop` ends the call (it was dropped with that
    /// attempt's status, and the call was retried after the backoff; from a review),
    /// and of two delays the longer is waited.
    #[tokio::test(start_paused = true)]
    async fn the_pushback_of_a_hedged_attempt_that_failed_first_holds() {
        for (first_says, then_runs) in [
            (Some(Pushback::Stop), 2),
            (Some(Pushback::RetryAfter(Duration::from_secs(5))), 3),
            (None, 3),
        ] {
            let runs = Arc::new(Mutex::new(Vec::new()));
            let svc = {
                let runs = runs.clone();
                service_fn(move |_call: ClientCall| {
                    let attempt = current_attempt().unwrap();
                    runs.lock().unwrap().push((attempt, Instant::now()));
                    async move {
                        let status = Status::unavailable(format!("attempt {attempt}"));
                        match (attempt, first_says) {
                            (1, Some(pushback)) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Err::<ClientReply, _>(pushback.attach(status))
                            }
                            (1, None) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Err(status)
                            }
                            (2, _) => {
                                tokio::time::sleep(Duration::from_millis(40)).await;
                                Err(Pushback::RetryAfter(Duration::from_millis(100)).attach(status))
                            }
                            _ => Ok(ClientReply::default()),
                        }
                    }
                })
            };
            let mut retry = RetryLayer::new(hedging(3)).layer(svc);
            let result = retry
                .ready()
                .await
                .unwrap()
                .call(call(Idempotency::NoSideEffects, None))
                .await;
            let runs = runs.lock().unwrap().clone();
            assert_eq!(runs.len(), then_runs, "{first_says:?}: {runs:?}");
            match then_runs {
                2 => assert_eq!(result.unwrap_err().message(), "attempt 2"),
                _ => {
                    assert!(result.is_ok(), "{first_says:?}: {result:?}");
                    // The retry waited the longer of the two delays asked for after
                    // the second attempt failed (40 ms after the hedge was sent).
                    let waited = runs[2].1 - runs[1].1;
                    let asked = match first_says {
                        Some(Pushback::RetryAfter(delay)) => delay,
                        _ => Duration::from_millis(100),
                    };
                    assert!(
                        waited >= asked + Duration::from_millis(40),
                        "{first_says:?}: {waited:?}"
                    );
                }
            }
        }
    }

    /// A hedged attempt that fails fatally while the other was sent ends the call
    /// with a status that does not say the call certainly ran nowhere, even when its
    /// own attempt was turned away unprocessed (at the call's deadline): the other
    /// attempt, cancelled, may have reached a handler (from a review).
    #[tokio::test(start_paused = true)]
    async fn a_fatal_unprocessed_status_of_a_hedged_attempt_is_not_marked_unprocessed() {
        let svc = service_fn(|_call: ClientCall| {
            let attempt = current_attempt();
            async move {
                match attempt {
                    Some(1) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Err::<ClientReply, _>(
                            Status::deadline_exceeded("not sent in time").into_unprocessed(),
                        )
                    }
                    _ => futures::future::pending().await,
                }
            }
        });
        let mut retry = RetryLayer::new(hedging(3)).layer(svc);
        let mut safe = call(Idempotency::NoSideEffects, None);
        safe.timeout = Some(Duration::from_millis(20));
        let err = retry.ready().await.unwrap().call(safe).await.unwrap_err();
        assert_eq!(err.code(), Code::DEADLINE_EXCEEDED);
        assert!(!err.is_unprocessed(), "{err:?}");
    }

    /// An attempt that ran out of its own time (a per-attempt timeout) is not a fatal
    /// status for a hedged call: the hedge goes on (it was dropped, and the call failed
    /// DEADLINE_EXCEEDED with time left; from a review).
    #[tokio::test(start_paused = true)]
    async fn a_hedged_attempt_past_its_own_timeout_leaves_the_other_running() {
        let svc = service_fn(|_call: ClientCall| {
            let attempt = current_attempt();
            async move {
                match attempt {
                    Some(1) => {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        Err::<ClientReply, _>(Status::deadline_exceeded("attempt's own time"))
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(40)).await;
                        Ok(ClientReply::default())
                    }
                }
            }
        });
        let policy = RetryPolicy {
            per_attempt_timeout: Some(Duration::from_millis(30)),
            ..hedging(2)
        };
        let mut retry = RetryLayer::new(policy).layer(svc);
        let result = retry
            .ready()
            .await
            .unwrap()
            .call(call(Idempotency::NoSideEffects, None))
            .await;
        assert!(result.is_ok(), "{result:?}");
    }

    /// A key made above the layer keeps counting: an outer attempt 2 is not sent as 1
    /// (which the server does not check against its horizon).
    #[tokio::test(start_paused = true)]
    async fn a_key_made_above_the_layer_keeps_its_attempt_count() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = {
            let seen = seen.clone();
            service_fn(move |call: ClientCall| {
                seen.lock().unwrap().push(call.call_key.unwrap().attempt);
                async move { Err::<ClientReply, _>(Status::unavailable("ran and failed")) }
            })
        };
        let policy = RetryPolicy {
            max_attempts: 2,
            ..RetryPolicy::default()
        };
        let mut retry = RetryLayer::new(policy).layer(svc);
        let key = CallKey {
            client: 7,
            call: 1,
            attempt: 2,
        };
        let _ = retry
            .ready()
            .await
            .unwrap()
            .call(call(Idempotency::Unknown, Some(key)))
            .await;
        assert_eq!(*seen.lock().unwrap(), [2, 3]);
    }
}
