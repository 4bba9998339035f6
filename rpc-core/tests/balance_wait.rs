//! A balanced client that knows no replica yet waits for the first one (up to its
//! wait-for-ready time) instead of failing at once: what a client that has just started
//! following discovery needs for its first call.

use std::time::Duration;

use rpc_core::{
    balance::{Balanced, Change},
    client::{Channel, ClientCall},
    link::mem,
    server::{Server, ServerCall, ServerReply},
    Code, Endpoint, Status,
};
use tower::{service_fn, Service, ServiceExt};

fn call() -> ClientCall {
    ClientCall {
        method: "t.Echo/Say".into(),
        idempotency: Default::default(),
        metadata: Default::default(),
        timeout: None,
        call_key: None,
        payload: "hi".into(),
        stream: None,
        compress: None,
    }
}

/// A balanced client whose every replica is one in-memory echo server.
fn balanced() -> Balanced {
    let (listener, connector) = mem::listener();
    let echo = service_fn(|call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let server = Server::builder().add_named_service("t.Echo", echo).build();
    tokio::spawn(async move { server.serve(listener).await });
    Balanced::new(move |_: &Endpoint| Ok(Channel::builder().connect_lazy(connector.clone())))
}

fn replica() -> Endpoint {
    "tcp://10.0.0.1:7000".parse().unwrap()
}

#[tokio::test]
async fn the_first_call_waits_for_the_first_replica() {
    let balanced = balanced();
    let mut client = balanced.clone();
    let waiting = tokio::spawn(async move { client.ready().await?.call(call()).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the call did not wait");
    balanced.apply(Change::Insert(replica())).unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting call was not woken")
        .unwrap()
        .unwrap();
    assert_eq!(reply.payload, "hi");
}

#[tokio::test(start_paused = true)]
async fn without_a_replica_the_wait_ends_unavailable() {
    let mut client = balanced().wait_for_ready(Some(Duration::from_secs(2)));
    let status = client
        .ready()
        .await
        .unwrap()
        .call(call())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE);
    assert!(status.is_unprocessed());
    assert!(status.message().contains("after waiting 2s"), "{status:?}");
}

/// The wait ends at the call's deadline if that comes first: a call with a 500 ms
/// budget does not wait the 5 s of wait-for-ready. (Found by a discovery round:
/// `rpc call etcd://.../no-such-service --timeout 500ms` took 5 s, and failed
/// UNAVAILABLE.)
#[tokio::test(start_paused = true)]
async fn the_wait_ends_at_the_calls_deadline() {
    let mut client = balanced().wait_for_ready(Some(Duration::from_secs(5)));
    let start = tokio::time::Instant::now();
    let status = client
        .ready()
        .await
        .unwrap()
        .call(ClientCall {
            timeout: Some(Duration::from_millis(500)),
            ..call()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status:?}");
    assert!(status.is_unprocessed());
    assert_eq!(start.elapsed(), Duration::from_millis(500));

    // A replica that comes within the budget takes the call, with what is left of it.
    let mut waiting = client.clone();
    let call = tokio::spawn(async move {
        waiting
            .ready()
            .await
            .unwrap()
            .call(ClientCall {
                timeout: Some(Duration::from_secs(2)),
                ..call()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.apply(Change::Insert(replica())).unwrap();
    let reply = call.await.unwrap().unwrap();
    assert_eq!(reply.payload, "hi");
}

#[tokio::test]
async fn fail_fast_fails_at_once() {
    let mut client = balanced().wait_for_ready(None);
    let status = client.ready().await.unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE);
    assert!(status.message().contains("no replicas known yet"));
}

/// A call that found its replica but then waited for room on the replica's channel
/// until its deadline ran out fails `DEADLINE_EXCEEDED` (it ran nowhere), not
/// UNAVAILABLE "no replicas known", which said something untrue, when its budget (8 s)
/// is longer than the wait for a replica (5 s). (From a review.)
#[tokio::test(start_paused = true)]
async fn a_wait_for_room_that_uses_up_the_budget_is_a_deadline() {
    let (listener, connector) = mem::listener();
    let hang = service_fn(|_: ServerCall| std::future::pending::<Result<ServerReply, Status>>());
    let server = Server::builder().add_named_service("t.Echo", hang).build();
    tokio::spawn(async move { server.serve(listener).await });
    // One call at a time, and that one is taken by a call that never ends.
    let full = Channel::builder().max_in_flight(1).connect_lazy(connector);
    let mut first = full.clone();
    let _hung = tokio::spawn(async move { first.ready().await?.call(call()).await });
    tokio::time::sleep(Duration::from_millis(10)).await;

    let client = Balanced::new(move |_: &Endpoint| Ok(full.clone()))
        .wait_for_ready(Some(Duration::from_secs(5)));
    let mut waiting = client.clone();
    let start = tokio::time::Instant::now();
    let call = tokio::spawn(async move {
        waiting
            .ready()
            .await
            .unwrap()
            .call(ClientCall {
                timeout: Some(Duration::from_secs(8)),
                ..call()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.apply(Change::Insert(replica())).unwrap();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status:?}");
    assert!(status.is_unprocessed());
    assert!(status.message().contains("room"), "{status:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(8));
}

/// Under a retry layer, a call with no deadline waits for a replica once, not once per
/// attempt: the wait's failure says not to retry (a pushback), as a retry would only
/// wait again (from a review: it waited max_attempts times wait-for-ready).
#[tokio::test(start_paused = true)]
async fn a_retried_call_waits_for_a_replica_once() {
    use rpc_core::retry::{Pushback, RetryLayer, RetryPolicy};
    use tower::Layer;

    let balanced = balanced().wait_for_ready(Some(Duration::from_secs(2)));
    let mut client = RetryLayer::new(RetryPolicy::default()).layer(balanced);
    let start = tokio::time::Instant::now();
    let status = client
        .ready()
        .await
        .unwrap()
        .call(ClientCall {
            idempotency: rpc_core::method::Idempotency::Idempotent,
            ..call()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status:?}");
    assert_eq!(Pushback::of(&status), Some(Pushback::Stop));
    assert_eq!(start.elapsed(), Duration::from_secs(2), "one wait");
}
