//! The retry layer over the in-memory transport, under paused time.

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use rpc_core::{
    client::{Channel, ClientCall, ClientReply},
    link::mem,
    method::Idempotency,
    retry::{MethodRetry, Pushback, RetryLayer, RetryPolicy},
    server::{Server, ServerCall, ServerReply},
    Code, Metadata, Status,
};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};

fn call(idempotency: Idempotency) -> ClientCall {
    ClientCall {
        method: "t.S/M".into(),
        idempotency,
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: "x".into(),
        stream: None,
        compress: None,
    }
}

/// Sends `call(idempotency)` through `svc` once it is ready.
async fn send<S>(svc: &mut S, idempotency: Idempotency) -> Result<S::Response, S::Error>
where
    S: Service<ClientCall>,
    S::Error: std::fmt::Debug,
{
    svc.ready().await.unwrap().call(call(idempotency)).await
}

/// A server whose handler fails with UNAVAILABLE for the first `failures` calls, and
/// counts every call.
async fn flaky_server(failures: u32) -> (Channel, Arc<AtomicU32>) {
    failing_server(failures, Status::unavailable("not yet")).await
}

/// A server whose handler fails its first `failures` calls with `status` and answers
/// the others `ok`, counting every call.
async fn failing_server(failures: u32, status: Status) -> (Channel, Arc<AtomicU32>) {
    let (listener, connector) = mem::listener();
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let handler = service_fn(move |_call: ServerCall| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        let status = status.clone();
        async move {
            if n < failures {
                return Err(status);
            }
            Ok(ServerReply {
                payload: "ok".into(),
                ..ServerReply::default()
            })
        }
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();
    (channel, runs)
}

/// A server whose handler answers every call with `answer()`, counting the calls it
/// starts; the connector to it.
fn counting_server<F>(answer: fn() -> F) -> (mem::MemConnector, Arc<AtomicU32>)
where
    F: std::future::Future<Output = Result<ServerReply, Status>> + Send + 'static,
{
    let (listener, connector) = mem::listener();
    let started = Arc::new(AtomicU32::new(0));
    let counted = started.clone();
    let handler = service_fn(move |_call: ServerCall| {
        counted.fetch_add(1, Ordering::SeqCst);
        answer()
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    (connector, started)
}

#[tokio::test(start_paused = true)]
async fn idempotent_call_succeeds_on_the_third_attempt_after_backing_off() {
    let (channel, runs) = flaky_server(2).await;
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel);
    let start = Instant::now();
    let reply = send(&mut svc, Idempotency::Idempotent).await.unwrap();
    assert_eq!(reply.payload, "ok");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Two backoffs: at least 25 ms and 50 ms (half of 50 ms and of 100 ms).
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(75), "{waited:?}");
    assert!(waited <= Duration::from_millis(150), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_method_with_side_effects_is_not_retried_after_it_may_have_run() {
    let (channel, runs) = flaky_server(1).await;
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel);
    let err = send(&mut svc, Idempotency::Unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran twice");

    // An override can declare it safe.
    let policy = RetryPolicy::default().with_method(
        "t.S/M",
        MethodRetry {
            safe_to_repeat: Some(true),
            ..MethodRetry::default()
        },
    );
    let (channel, runs) = flaky_server(1).await;
    let mut svc = RetryLayer::new(policy).layer(channel);
    svc.ready()
        .await
        .unwrap()
        .call(call(Idempotency::Unknown))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn requests_that_never_left_are_retried_for_any_method() {
    let (listener, connector) = mem::listener();
    drop(listener); // every connection attempt fails: nothing reaches a server
    let channel = Channel::builder().connect_lazy(connector);
    let attempts = Arc::new(AtomicU32::new(0));
    let counted = attempts.clone();
    let counting = tower::ServiceBuilder::new()
        .map_request(move |c: ClientCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            c
        })
        .service(channel);
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(counting);
    let err = send(&mut svc, Idempotency::Unknown).await.unwrap_err();
    assert!(err.is_unprocessed(), "{err:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn the_budget_bounds_retries_when_everything_fails() {
    let (channel, runs) = flaky_server(u32::MAX).await;
    let policy = RetryPolicy {
        budget_percent: 0.2,
        budget_min_per_sec: 1,
        budget_window: Duration::from_secs(10),
        ..RetryPolicy::default()
    };
    let mut svc = RetryLayer::new(policy).layer(channel);
    const CALLS: u32 = 100;
    for _ in 0..CALLS {
        let err = send(&mut svc, Idempotency::Idempotent).await.unwrap_err();
        assert_eq!(err.code(), Code::UNAVAILABLE);
    }
    // Without a budget: 300 attempts. With it: the calls, 20% of them, and the floor
    // of 1 per second over the 10 s window.
    let total = runs.load(Ordering::SeqCst);
    assert!(total > CALLS, "no retry at all: {total}");
    assert!(
        total <= CALLS + CALLS / 5 + 10 + 1,
        "{total} attempts for {CALLS} calls"
    );
}

#[tokio::test(start_paused = true)]
async fn a_winning_hedge_cancels_the_slow_attempt_on_the_server() {
    let (listener, connector) = mem::listener();
    let started = Arc::new(AtomicU32::new(0));
    let dropped = Arc::new(AtomicU32::new(0));
    let (s, d) = (started.clone(), dropped.clone());
    let handler = service_fn(move |_call: ServerCall| {
        let n = s.fetch_add(1, Ordering::SeqCst);
        let d = d.clone();
        async move {
            // Reports being dropped before it finished.
            struct Guard(Arc<AtomicU32>, bool);
            impl Drop for Guard {
                fn drop(&mut self) {
                    if !self.1 {
                        self.0.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            let mut guard = Guard(d, false);
            // The first attempt is slow, the hedge is fast.
            let wait = if n == 0 { 10_000 } else { 5 };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            guard.1 = true;
            Ok::<_, Status>(ServerReply {
                metadata: Metadata::new(),
                payload: format!("attempt {}", n + 1).into_bytes().into(),
                ..ServerReply::default()
            })
        }
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let policy = RetryPolicy {
        hedge_delay: Some(Duration::from_millis(50)),
        ..RetryPolicy::default()
    };
    let mut svc = RetryLayer::new(policy).layer(channel);
    let start = Instant::now();
    let reply = send(&mut svc, Idempotency::NoSideEffects).await.unwrap();
    assert_eq!(reply.payload, "attempt 2", "the hedge won");
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(started.load(Ordering::SeqCst), 2);
    // The losing first attempt is cancelled on the server.
    for _ in 0..100 {
        if dropped.load(Ordering::SeqCst) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the slow attempt's handler was not dropped");
}

/// `max_attempts: 1` (for a policy, or one method) means one attempt, hedge
/// included (a hedge went out past it: from a review).
#[tokio::test(start_paused = true)]
async fn one_attempt_allowed_means_no_hedge() {
    let (connector, started) = counting_server(|| async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(ServerReply::default())
    });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let policy = RetryPolicy {
        max_attempts: 1,
        hedge_delay: Some(Duration::from_millis(10)),
        ..RetryPolicy::default()
    };
    let mut svc = RetryLayer::new(policy).layer(channel);
    send(&mut svc, Idempotency::NoSideEffects).await.unwrap();
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "hedged past max_attempts"
    );
}

/// Without a per-attempt timeout a `DEADLINE_EXCEEDED` ends the call: a call relying
/// on the channel's default timeout (no deadline of its own for the retry layer to
/// see) was sent again with a fresh default each time, taking three times its
/// timeout (from a review).
#[tokio::test(start_paused = true)]
async fn the_channels_default_timeout_is_not_renewed_per_attempt() {
    let (connector, started) = counting_server(futures::future::pending);
    let channel = Channel::builder()
        .timeout(Duration::from_millis(200))
        .connect(connector)
        .await
        .unwrap();
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel);
    let start = Instant::now();
    let err = send(&mut svc, Idempotency::NoSideEffects)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED);
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(started.load(Ordering::SeqCst), 1);
}

/// The channel's default timeout runs from the call's first attempt: a retry after a
/// slow UNAVAILABLE had a fresh default of its own (three attempts of 150 ms took
/// 450 ms and more of a 200 ms timeout; from a review).
#[tokio::test(start_paused = true)]
async fn the_channels_default_timeout_bounds_the_retries_of_a_call() {
    retries_stay_within_the_default_timeout(|channel| channel).await;
}

/// Under a retry layer over `stack` over a channel whose default timeout is 200 ms, a
/// call to a server that fails each attempt after 150 ms ends within that timeout.
async fn retries_stay_within_the_default_timeout<S>(stack: impl FnOnce(Channel) -> S)
where
    S: Service<ClientCall, Response = ClientReply, Error = Status> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let (connector, started) = counting_server(|| async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Err(Status::unavailable("slow and failing"))
    });
    let channel = Channel::builder()
        .timeout(Duration::from_millis(200))
        .connect(connector)
        .await
        .unwrap();
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(stack(channel));
    let start = Instant::now();
    let err = send(&mut svc, Idempotency::NoSideEffects)
        .await
        .unwrap_err();
    let waited = start.elapsed();
    assert!(waited <= Duration::from_millis(260), "{waited:?}: {err}");
    assert!(started.load(Ordering::SeqCst) <= 2);
}

/// A connector whose connections are never made (a host that drops SYNs).
#[derive(Clone)]
struct NeverConnects;

impl rpc_core::link::Connector for NeverConnects {
    type Link = mem::MemLink;

    async fn connect(
        &self,
        _: &rpc_core::link::LinkConfig,
    ) -> Result<mem::MemLink, rpc_core::Error> {
        futures::future::pending().await
    }

    fn target(&self) -> String {
        "mem://nowhere".into()
    }
}

/// A call still waiting to be written when the channel's default timeout passes
/// fails `DEADLINE_EXCEEDED` marked unprocessed (it never left), which the retry
/// layer must not take for "send it again": the channel's timeout runs from the
/// call's first attempt, so every later attempt was past it, failed at once and was
/// retried, up to `max_attempts`, with backoffs in between (from a review).
#[tokio::test(start_paused = true)]
async fn a_call_that_never_left_by_its_deadline_is_not_retried() {
    let channel = Channel::builder()
        .timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(60))
        .connect_lazy(NeverConnects);
    let policy = RetryPolicy {
        max_attempts: 5,
        ..RetryPolicy::default()
    };
    let mut svc = RetryLayer::new(policy).layer(channel);
    let start = Instant::now();
    let err = send(&mut svc, Idempotency::Unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
    assert!(err.is_unprocessed(), "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(200), "{err}");
}

#[tokio::test(start_paused = true)]
async fn methods_with_side_effects_are_never_hedged() {
    let (channel, runs) = flaky_server(0).await;
    let policy = RetryPolicy {
        hedge_delay: Some(Duration::ZERO),
        ..RetryPolicy::default()
    };
    let mut svc = RetryLayer::new(policy).layer(channel);
    svc.ready()
        .await
        .unwrap()
        .call(call(Idempotency::Unknown))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_when_the_channel_has_no_free_slot() {
    let (listener, connector) = mem::listener();
    let handler = service_fn(|_call: ServerCall| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, Status>(ServerReply {
            metadata: Metadata::new(),
            payload: "slow".into(),
            ..ServerReply::default()
        })
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    // One call in flight at most: the first attempt holds the only slot.
    let channel = Channel::builder()
        .max_in_flight(1)
        .connect(connector)
        .await
        .unwrap();
    let policy = RetryPolicy {
        hedge_delay: Some(Duration::from_millis(10)),
        ..RetryPolicy::default()
    };
    let mut svc = RetryLayer::new(policy).layer(channel);
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        svc.ready()
            .await
            .unwrap()
            .call(call(Idempotency::Idempotent)),
    )
    .await
    .expect("hedging waited for a slot the first attempt holds")
    .unwrap();
    assert_eq!(reply.payload, "slow");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_of_duration_max_means_no_deadline() {
    let (channel, _runs) = flaky_server(0).await;
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel);
    let mut c = call(Idempotency::Idempotent);
    c.timeout = Some(Duration::MAX);
    let reply = svc.ready().await.unwrap().call(c).await.unwrap();
    assert_eq!(reply.payload, "ok");
}

/// A server's pushback (gRPC's `grpc-retry-pushback-ms`, in the status metadata)
/// replaces the backoff: the retry goes after exactly that long.
#[tokio::test(start_paused = true)]
async fn a_pushback_sets_when_the_retry_goes() {
    let pushed = Pushback::RetryAfter(Duration::from_secs(3)).attach(Status::unavailable("busy"));
    let (channel, runs) = failing_server(1, pushed).await;
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel);
    let start = Instant::now();
    let reply = send(&mut svc, Idempotency::Idempotent).await.unwrap();
    assert_eq!(reply.payload, "ok");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let waited = start.elapsed();
    // The policy's backoff would have been at most 50 ms.
    assert!(waited >= Duration::from_secs(3), "{waited:?}");
    assert!(waited < Duration::from_millis(3100), "{waited:?}");
}

/// A pushback that says not to retry ends the call with the status; so does one that
/// would outlive the call's deadline, or is longer than the policy's `max_pushback`
/// (a hostile server could otherwise hold a call without a deadline for ever). A
/// pushback does not make a code retryable.
#[tokio::test(start_paused = true)]
async fn a_pushback_can_forbid_the_retry() {
    let cases = [
        (Pushback::Stop.attach(Status::unavailable("go away")), None),
        (
            Pushback::RetryAfter(Duration::from_secs(5)).attach(Status::unavailable("later")),
            Some(Duration::from_secs(1)),
        ),
        (
            Pushback::RetryAfter(Duration::ZERO).attach(Status::internal("broken")),
            None,
        ),
        // Longer than the policy's max_pushback (60 s): not waited for, deadline or not.
        (
            Pushback::RetryAfter(Duration::from_secs(61)).attach(Status::unavailable("much later")),
            None,
        ),
    ];
    for (status, timeout) in cases {
        let (channel, runs) = failing_server(1, status.clone()).await;
        let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel);
        let mut call = call(Idempotency::Idempotent);
        call.timeout = timeout;
        let start = Instant::now();
        let failed = svc.ready().await.unwrap().call(call).await.unwrap_err();
        assert_eq!(failed.code(), status.code());
        assert_eq!(
            Pushback::of(&failed),
            Pushback::of(&status),
            "the caller sees it"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{status:?}: not retried");
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "returned at once"
        );
    }
}

/// A retry that finds every in-flight slot of its channel taken (by calls a server
/// holds and never answers) waits for one only until the call's deadline, then fails
/// DEADLINE_EXCEEDED. (From a review: the wait had no bound, so a call with a 1 s
/// deadline waited for as long as the other calls hung.)
#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_a_slot_only_until_the_deadline() {
    let (listener, connector) = mem::listener();
    let handler = service_fn(|call: ServerCall| async move {
        if call.method.as_str() == "t.S/Hold" {
            std::future::pending::<()>().await;
        }
        Err::<ServerReply, _>(Status::unavailable("not now"))
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder()
        .max_in_flight(2)
        .connect(connector)
        .await
        .unwrap();
    let hold = |channel: &Channel| {
        let mut channel = channel.clone();
        tokio::spawn(async move {
            let mut held = call(Idempotency::Idempotent);
            held.method = "t.S/Hold".into();
            let _ = channel.ready().await.unwrap().call(held).await;
        })
    };
    let _first = hold(&channel);
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(channel.clone());
    let retried = tokio::spawn(async move {
        let mut c = call(Idempotency::Idempotent);
        c.timeout = Some(Duration::from_secs(1));
        let start = Instant::now();
        let result = svc.ready().await.unwrap().call(c).await;
        (result, start.elapsed())
    });
    // The first attempt failed at once; during its backoff (25 ms at least) another
    // held call takes the slot it freed.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let _second = hold(&channel);
    let (result, waited) = tokio::time::timeout(Duration::from_secs(10), retried)
        .await
        .expect("the retry waited for a slot past its deadline")
        .unwrap();
    let status = result.unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status:?}");
    assert!(waited <= Duration::from_millis(1100), "{waited:?}");
}

/// A keyed call's retry carries its first attempt's credential: the server files a
/// keyed call's outcome under its caller's credentials, and a retry with the token
/// refreshed meanwhile was another caller's call there, and ran again (from a review:
/// `CredentialsLayer` under the retry layer, as its docs suggest).
#[tokio::test(start_paused = true)]
async fn a_keyed_retry_keeps_the_credential_of_its_first_attempt() {
    use std::sync::atomic::AtomicUsize;

    use rpc_core::auth::{Credential, CredentialsLayer};

    let (connector, started) = counting_server(|| async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Err(Status::unavailable("ran, then failed"))
    });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let fetched = Arc::new(AtomicUsize::new(0));
    let credentials = {
        let fetched = fetched.clone();
        CredentialsLayer::new(move || {
            let n = fetched.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Status>(
                    Credential::bearer(format!("token-{n}")).expires_in(Duration::from_millis(100)),
                )
            }
        })
    };
    let mut svc = RetryLayer::new(RetryPolicy::default()).layer(credentials.layer(channel));
    let err = send(&mut svc, Idempotency::Unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert_eq!(started.load(Ordering::SeqCst), 1, "the handler ran again");
    // The layer did not fetch for the retries; the next call gets a fresh token.
    assert_eq!(fetched.load(Ordering::SeqCst), 1);
}

/// The same with more keyed calls made during the first attempt than the credentials
/// layer's table of recent keyed calls holds: under a retry layer each call keeps its
/// own credential (the table, first in first out over every keyed call, had pushed it
/// out, and the retry carried the new token; from a review).
#[tokio::test(start_paused = true)]
async fn a_keyed_retry_keeps_its_credential_past_many_other_keyed_calls() {
    use std::sync::atomic::AtomicUsize;

    use rpc_core::{
        auth::{Credential, CredentialsLayer, KEYED_CALLS},
        server::Server,
    };

    let (listener, connector) = mem::listener();
    let slow_runs = Arc::new(AtomicU32::new(0));
    let counted = slow_runs.clone();
    let handler = service_fn(move |call: ServerCall| {
        let slow = call.method.as_str() == "t.S/Slow";
        if slow {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            if slow {
                tokio::time::sleep(Duration::from_millis(150)).await;
                return Err(Status::unavailable("ran, then failed"));
            }
            Ok(ServerReply::default())
        }
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder()
        .max_in_flight(KEYED_CALLS * 2)
        .connect(connector)
        .await
        .unwrap();
    let fetched = Arc::new(AtomicUsize::new(0));
    let credentials = {
        let fetched = fetched.clone();
        CredentialsLayer::new(move || {
            let n = fetched.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Status>(
                    Credential::bearer(format!("token-{n}")).expires_in(Duration::from_millis(100)),
                )
            }
        })
    };
    let svc = RetryLayer::new(RetryPolicy::default()).layer(credentials.layer(channel));
    let slow = {
        let mut svc = svc.clone();
        tokio::spawn(async move {
            let mut call = call(Idempotency::Unknown);
            call.method = "t.S/Slow".into();
            svc.ready().await.unwrap().call(call).await
        })
    };
    // More keyed calls than the table holds, while the slow one's first attempt runs.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let others: Vec<_> = (0..KEYED_CALLS + 100)
        .map(|_| {
            let mut svc = svc.clone();
            tokio::spawn(async move { send(&mut svc, Idempotency::Unknown).await })
        })
        .collect();
    for other in others {
        other.await.unwrap().unwrap();
    }
    let err = slow.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert_eq!(slow_runs.load(Ordering::SeqCst), 1, "the handler ran again");
}

/// Two retry layers, one over the other (a client that retries, given to code that
/// retries): the inner layer's attempts share the outer call's slot, so every attempt
/// carries the first credential (each outer attempt made the inner layer start a call
/// of its own, which fetched a fresh token: another caller, and the handler ran again;
/// from a review).
#[tokio::test(start_paused = true)]
async fn nested_retry_layers_keep_one_credential_per_call() {
    use std::sync::atomic::AtomicUsize;

    use rpc_core::auth::{Credential, CredentialsLayer};

    let (connector, started) = counting_server(|| async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Err(Status::unavailable("ran, then failed"))
    });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let fetched = Arc::new(AtomicUsize::new(0));
    let credentials = {
        let fetched = fetched.clone();
        CredentialsLayer::new(move || {
            let n = fetched.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Status>(
                    Credential::bearer(format!("token-{n}")).expires_in(Duration::from_millis(100)),
                )
            }
        })
    };
    let inner = RetryLayer::new(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    })
    .layer(credentials.layer(channel));
    let mut outer = RetryLayer::new(RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    })
    .layer(inner);
    let err = send(&mut outer, Idempotency::Unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::UNAVAILABLE, "{err}");
    assert_eq!(started.load(Ordering::SeqCst), 1, "the handler ran again");
    assert_eq!(fetched.load(Ordering::SeqCst), 1);
}

/// The same under a credentials layer, which calls the channel from its own future
/// (after it has its token): the channel still sees when the call began, so its
/// default timeout is not renewed per attempt (from a review: the attempt's task-local
/// was set only while the retry layer called the layer under it, and gone when that
/// layer called the channel).
#[tokio::test(start_paused = true)]
async fn the_channels_default_timeout_bounds_the_retries_under_a_credentials_layer() {
    use rpc_core::auth::{Credential, CredentialsLayer};

    let credentials = CredentialsLayer::new(|| async {
        Ok::<_, Status>(Credential::bearer("token").expires_in(Duration::from_secs(3600)))
    });
    retries_stay_within_the_default_timeout(|channel| credentials.layer(channel)).await;
}

/// A call's own timeout bounds the time a credentials layer waits for its token, and
/// what the wait took comes out of the time the channel gets: a token source that
/// takes 30 s made a call of 500 ms wait 30 s and then have its 500 ms afresh (from a
/// review).
#[tokio::test(start_paused = true)]
async fn a_calls_timeout_bounds_the_wait_for_its_credential() {
    use rpc_core::auth::{Credential, CredentialsLayer};

    let (connector, started) = counting_server(|| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(ServerReply::default())
    });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let slow = |delay: u64| {
        CredentialsLayer::new(move || async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            Ok::<_, Status>(Credential::bearer("token").expires_in(Duration::from_secs(3600)))
        })
    };
    let timed = |timeout: u64| {
        let mut c = call(Idempotency::NoSideEffects);
        c.timeout = Some(Duration::from_millis(timeout));
        c
    };
    // A token that comes after the deadline: the call fails then, never sent.
    let mut svc = slow(30_000).layer(channel.clone());
    let start = Instant::now();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(timed(500))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
    assert!(err.is_unprocessed(), "{err}");
    assert!(
        start.elapsed() <= Duration::from_millis(550),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(started.load(Ordering::SeqCst), 0);
    // A token in 300 ms of 500: the server's 300 ms do not fit in what is left.
    let mut svc = slow(300).layer(channel);
    let start = Instant::now();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(timed(500))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}");
    assert!(
        start.elapsed() <= Duration::from_millis(550),
        "{:?}",
        start.elapsed()
    );
}

/// A token source slower than every call's timeout: the calls that wait for it fail at
/// their deadlines, but the refresh goes on and the calls after it get the token (from a
/// review: each call's deadline dropped the refresh it was waiting for, the next call
/// started it over, and no call ever got a token).
#[tokio::test(start_paused = true)]
async fn a_refresh_outlives_the_calls_that_stop_waiting_for_it() {
    use std::sync::atomic::AtomicUsize;

    use rpc_core::auth::{Credential, CredentialsLayer};

    let (connector, _) = counting_server(|| async { Ok(ServerReply::default()) });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let fetches = Arc::new(AtomicUsize::new(0));
    let credentials = {
        let fetches = fetches.clone();
        CredentialsLayer::new(move || {
            fetches.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Status>(Credential::bearer("token").expires_in(Duration::from_secs(3600)))
            }
        })
    };
    let mut svc = credentials.layer(channel);
    let timed = || {
        let mut c = call(Idempotency::NoSideEffects);
        c.timeout = Some(Duration::from_millis(100));
        c
    };
    let mut answered = false;
    for _ in 0..10 {
        match svc.ready().await.unwrap().call(timed()).await {
            Ok(_) => {
                answered = true;
                break;
            }
            Err(err) => assert_eq!(err.code(), Code::DEADLINE_EXCEEDED, "{err}"),
        }
    }
    assert!(answered, "no call got a token");
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "the refresh was started over"
    );
}
