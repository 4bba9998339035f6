//! Retries of calls with side effects behind [`Balanced`]: a call's attempts stay on
//! the replica that took its first, whose duplicate cache knows the call.

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use rpc_core::{
    balance::{Balanced, Change},
    client::{Channel, ClientCall},
    link::mem,
    method::Idempotency,
    retry::{RetryLayer, RetryPolicy},
    server::{Server, ServerCall},
    Code, Endpoint, Metadata, Status,
};
use tower::{service_fn, Layer, Service, ServiceExt};

fn call() -> ClientCall {
    ClientCall {
        method: "t.S/M".into(),
        // Side effects: retried only with a call key, which the retry layer adds.
        idempotency: Idempotency::Unknown,
        metadata: Metadata::new(),
        timeout: Some(Duration::from_secs(10)),
        call_key: None,
        payload: "x".into(),
        stream: None,
        compress: None,
    }
}

/// A replica whose handler fails every call with `UNAVAILABLE` (a retryable code),
/// counting the calls it runs.
fn failing_replica() -> (mem::MemConnector, Arc<AtomicU32>) {
    let (listener, connector) = mem::listener();
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let handler = service_fn(move |_: ServerCall| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Err(Status::unavailable("tried, and it did not work out")))
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    (connector, runs)
}

/// Two replicas behind `Balanced`, and how many calls each ran.
fn two_replicas() -> (Balanced, [Endpoint; 2], [Arc<AtomicU32>; 2]) {
    let (a, runs_a) = failing_replica();
    let (b, runs_b) = failing_replica();
    let at: [Endpoint; 2] = [
        "tcp://10.0.0.1:7000".parse().unwrap(),
        "tcp://10.0.0.2:7000".parse().unwrap(),
    ];
    let first = at[0].clone();
    let balanced = Balanced::new(move |endpoint: &Endpoint| {
        let connector = if *endpoint == first { &a } else { &b };
        Ok(Channel::builder().connect_lazy(connector.clone()))
    });
    for endpoint in &at {
        balanced.apply(Change::Insert(endpoint.clone())).unwrap();
    }
    (balanced, at, [runs_a, runs_b])
}

fn runs(counts: &[Arc<AtomicU32>; 2]) -> [u32; 2] {
    counts.each_ref().map(|c| c.load(Ordering::SeqCst))
}

/// Runs the call `pending` until a replica has run it once more than `before` says:
/// which replica (0 or 1).
async fn first_run<F>(pending: &mut F, counts: &[Arc<AtomicU32>; 2], before: [u32; 2]) -> usize
where
    F: std::future::Future + Unpin,
    F::Output: std::fmt::Debug,
{
    loop {
        tokio::select! {
            biased;
            outcome = &mut *pending => panic!("ended before a replica ran it: {outcome:?}"),
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
        let now = runs(counts);
        if now != before {
            return usize::from(now[1] != before[1]);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_retries_of_a_keyed_call_go_to_the_replica_of_its_first_attempt() {
    let (balanced, _, counts) = two_replicas();
    let mut client = RetryLayer::new(RetryPolicy::default()).layer(balanced);
    for n in 1..=8 {
        let status = client
            .ready()
            .await
            .unwrap()
            .call(call())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
        // Each retry reached the replica that ran the call, whose duplicate cache
        // answered it with the outcome of that one run; the other replica, which
        // does not know the call, would have run it again (half of the retries,
        // by power of two choices between two idle replicas).
        assert_eq!(runs(&counts).iter().sum::<u32>(), n, "{:?}", runs(&counts));
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_call_whose_replica_left_is_retried_on_another() {
    let (balanced, at, counts) = two_replicas();
    let mut client = RetryLayer::new(RetryPolicy::default()).layer(balanced.clone());
    let mut pending = Box::pin(client.ready().await.unwrap().call(call()));
    // Run until the first attempt has run on one of the replicas, then take that
    // replica out of the set: the retry goes to the other (the only one left).
    let first = first_run(&mut pending, &counts, [0, 0]).await;
    balanced.apply(Change::Remove(at[first].clone())).unwrap();
    let status = pending.await.unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    let [a, b] = runs(&counts);
    assert_eq!(
        if first == 0 { (a, b) } else { (b, a) },
        (1, 1),
        "the retry ran once on the replica left, whose duplicate cache answered the last"
    );
}

/// A replica that leaves the set and comes back at the same address (discovery
/// reporting a re-registration as a removal and an insertion) is still the one a
/// retry goes to: the same server, whose duplicate cache knows the call.
#[tokio::test(start_paused = true)]
async fn a_replica_back_at_the_same_address_keeps_the_retries() {
    let (balanced, at, counts) = two_replicas();
    let mut client = RetryLayer::new(RetryPolicy::default()).layer(balanced.clone());
    for n in 1..=6 {
        let mut pending = Box::pin(client.ready().await.unwrap().call(call()));
        let before = runs(&counts);
        let first = first_run(&mut pending, &counts, before).await;
        balanced.apply(Change::Remove(at[first].clone())).unwrap();
        balanced.apply(Change::Insert(at[first].clone())).unwrap();
        let status = pending.await.unwrap_err();
        assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
        assert_eq!(runs(&counts).iter().sum::<u32>(), n, "{:?}", runs(&counts));
    }
}

/// A replica that runs one call (failing it with the retryable `UNAVAILABLE`) and then
/// shuts down: its connection goes, and no new one can be made.
fn replica_that_stops_after_one_call() -> (mem::MemConnector, Arc<AtomicU32>) {
    let (listener, connector) = mem::listener();
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stop = Arc::new(std::sync::Mutex::new(Some(stop)));
    let handler = service_fn(move |_: ServerCall| {
        counted.fetch_add(1, Ordering::SeqCst);
        if let Some(stop) = stop.lock().unwrap().take() {
            let _ = stop.send(());
        }
        std::future::ready(Err(Status::unavailable("tried, and it did not work out")))
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move {
        server
            .serve_with_shutdown(listener, async move {
                let _ = stopped.await;
            })
            .await
    });
    (connector, runs)
}

/// `Balanced` with a replica that stops after one call ([`replica_that_stops_after_one_call`])
/// in its set, and `other` at a second address not yet in it; and how many calls the
/// first ran.
fn stopping_then(other: mem::MemConnector) -> (Balanced, [Endpoint; 2], Arc<AtomicU32>) {
    let (stopping, runs_stopping) = replica_that_stops_after_one_call();
    let at: [Endpoint; 2] = [
        "tcp://10.0.0.1:7000".parse().unwrap(),
        "tcp://10.0.0.2:7000".parse().unwrap(),
    ];
    let first = at[0].clone();
    let balanced = Balanced::new(move |endpoint: &Endpoint| {
        let connector = if *endpoint == first {
            &stopping
        } else {
            &other
        };
        Ok(Channel::builder().connect_lazy(connector.clone()))
    });
    balanced.apply(Change::Insert(at[0].clone())).unwrap();
    (balanced, at, runs_stopping)
}

/// The retry of a keyed call whose replica is still in the set but turns it away
/// unprocessed (it shut down: no connection can be made) is not sent on to another
/// replica, as a first attempt would be: the first attempt ran there, and the other
/// replica's duplicate cache does not know the call. It ran twice before. Nor is its
/// final status unprocessed (it was, from the last attempt's refusal).
#[tokio::test(start_paused = true)]
async fn a_keyed_retry_turned_away_by_its_replica_does_not_run_elsewhere() {
    let (other, runs_other) = failing_replica();
    // Only the replica that stops is known when the call starts: its first attempt
    // runs there. The other joins before the retry.
    let (balanced, at, runs_stopping) = stopping_then(other);
    let counts = [runs_stopping, runs_other];
    let mut client = RetryLayer::new(RetryPolicy::default()).layer(balanced.clone());
    let mut pending = Box::pin(client.ready().await.unwrap().call(call()));
    assert_eq!(first_run(&mut pending, &counts, [0, 0]).await, 0);
    balanced.apply(Change::Insert(at[1].clone())).unwrap();
    let status = pending.await.unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    assert_eq!(
        runs(&counts),
        [1, 0],
        "the call ran once, on the replica of its first attempt"
    );
    // Its last attempt was turned away unprocessed, but the first may have run: the
    // call's status must not say it certainly did not (a caller trusting the mark
    // would run it again).
    assert!(!status.is_unprocessed(), "{status}");
}

/// A replica serving `t.S` with `handler`.
fn replica<H, F>(handler: H) -> mem::MemConnector
where
    H: FnMut(ServerCall) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Result<rpc_core::server::ServerReply, Status>> + Send + 'static,
{
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .add_named_service("t.S", service_fn(handler))
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    connector
}

/// A replica whose handler never answers (a host gone silent, as far as a call can
/// tell), and one that answers every call (counted).
fn silent_and_answering() -> (Balanced, Arc<AtomicU32>) {
    let silent = replica(|_: ServerCall| std::future::pending());
    let answered = Arc::new(AtomicU32::new(0));
    let counted = answered.clone();
    let answering = replica(move |call: ServerCall| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(rpc_core::server::ServerReply {
            payload: call.payload.into(),
            ..Default::default()
        }))
    });
    let first: Endpoint = "tcp://10.0.0.1:7000".parse().unwrap();
    let second: Endpoint = "tcp://10.0.0.2:7000".parse().unwrap();
    let is_first = first.clone();
    let balanced = Balanced::new(move |endpoint: &Endpoint| {
        let connector = if *endpoint == is_first {
            &silent
        } else {
            &answering
        };
        Ok(Channel::builder().connect_lazy(connector.clone()))
    });
    balanced.apply(Change::Insert(first)).unwrap();
    balanced.apply(Change::Insert(second)).unwrap();
    (balanced, answered)
}

/// A safe call's retry after a per-attempt timeout on a silent replica goes to the
/// other replica, not back to the silent one (power of two choices between two idle
/// replicas took it half the time: a quarter of the calls failed; from a review).
#[tokio::test(start_paused = true)]
async fn a_safe_calls_retry_after_a_timeout_goes_to_the_other_replica() {
    for n in 0..40 {
        // A fresh set each time: the first attempt goes to either replica.
        let (balanced, answered) = silent_and_answering();
        let policy = RetryPolicy {
            max_attempts: 2,
            per_attempt_timeout: Some(Duration::from_millis(100)),
            ..RetryPolicy::default()
        };
        let mut client = RetryLayer::new(policy).layer(balanced);
        let mut safe = call();
        safe.idempotency = Idempotency::Idempotent;
        let result = client.ready().await.unwrap().call(safe).await;
        assert!(result.is_ok(), "call {n}: {:?}", result.err());
        assert_eq!(answered.load(Ordering::SeqCst), 1);
    }
}

/// Between a retry layer and `Balanced`: holds each call's second attempt until
/// `open` has a permit, after telling `reached`.
#[derive(Clone)]
struct HoldSecondAttempt {
    inner: Balanced,
    reached: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<tokio::sync::Semaphore>,
}

impl Service<ClientCall> for HoldSecondAttempt {
    type Response = rpc_core::client::ClientReply;
    type Error = Status;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Status>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ClientCall) -> Self::Future {
        if rpc_core::retry::current_attempt() != Some(2) {
            return Box::pin(self.inner.call(call));
        }
        self.reached.store(true, Ordering::SeqCst);
        let mut inner = self.inner.clone();
        let open = self.open.clone();
        Box::pin(async move {
            let _permit = open.acquire().await;
            inner.ready().await?.call(call).await
        })
    }
}

/// The replica of a call waiting for its retry is kept with the call: more than
/// `AFFINITY_CALLS` other keyed calls failing meanwhile on the same `Balanced` (through
/// a retry layer that does not retry them) do not push it out, and the retry still
/// goes to the replica of the first attempt, which turns it away (it shut down), not
/// to the other one. From a review: one table of the last 4,096 keyed calls whose
/// attempt failed held every call's replica; such a flood emptied it of this one, and
/// the retry ran the call a second time on the other replica.
#[tokio::test(start_paused = true)]
async fn other_calls_failures_do_not_push_a_waiting_calls_replica_out() {
    // The other replica fails every call too, counting only this test's call (its
    // payload "x"), not the flood's.
    let runs_other = Arc::new(AtomicU32::new(0));
    let counted = runs_other.clone();
    let other = replica(move |call: ServerCall| {
        if call.payload == "x" {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        std::future::ready(Err(Status::unavailable("tried, and it did not work out")))
    });
    let (balanced, at, runs_stopping) = stopping_then(other);
    let counts = [runs_stopping, runs_other];
    let hold = HoldSecondAttempt {
        inner: balanced.clone(),
        reached: Arc::default(),
        open: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let mut client = RetryLayer::new(RetryPolicy::default()).layer(hold.clone());
    let mut waiting = call();
    // No deadline: the flood below must not outlast it.
    waiting.timeout = None;
    let mut pending = Box::pin(client.ready().await.unwrap().call(waiting));
    assert_eq!(first_run(&mut pending, &counts, [0, 0]).await, 0);
    // Until the retry layer sends the second attempt: the first one's failure has
    // been taken in (and its replica noted) by then.
    while !hold.reached.load(Ordering::SeqCst) {
        tokio::select! {
            biased;
            outcome = &mut pending => panic!("ended before its retry: {outcome:?}"),
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    balanced.apply(Change::Insert(at[1].clone())).unwrap();
    let mut flood = RetryLayer::new(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    })
    .layer(balanced.clone());
    for _ in 0..rpc_core::balance::AFFINITY_CALLS + 8 {
        let mut other_call = call();
        other_call.payload = "flood".into();
        let status = flood
            .ready()
            .await
            .unwrap()
            .call(other_call)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    }
    hold.open.add_permits(10);
    let status = pending.await.unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    assert_eq!(
        runs(&counts),
        [1, 0],
        "the call ran once, on the replica of its first attempt"
    );
}

/// A key the application repeats itself, in a later call through a retry layer, still
/// finds the replica of the attempt that may have run: the repeat is answered from that
/// replica's duplicate cache and runs nowhere (from a review: with the replica kept
/// only in the slot a call's attempts share, empty in the later call, the repeat went
/// to either replica, and ran again on the other).
#[tokio::test(start_paused = true)]
async fn a_key_the_application_repeats_through_a_retry_layer_keeps_its_replica() {
    use rpc_core::frame::CallKey;
    let (balanced, _, counts) = two_replicas();
    let mut client = RetryLayer::new(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    })
    .layer(balanced);
    for n in 0..8 {
        let key = CallKey {
            client: 42,
            call: n,
            attempt: 1,
        };
        let mut first = call();
        first.call_key = Some(key);
        let status = client.ready().await.unwrap().call(first).await.unwrap_err();
        assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
        let before = runs(&counts);
        let mut again = call();
        again.call_key = Some(CallKey { attempt: 2, ..key });
        let status = client.ready().await.unwrap().call(again).await.unwrap_err();
        assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
        assert_eq!(runs(&counts), before, "call {n} ran again");
    }
}
