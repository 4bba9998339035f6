//! tower's own middleware in a server's stack, behind `IntoStatusLayer`: load shedding
//! answers `RESOURCE_EXHAUSTED`, a timeout `DEADLINE_EXCEEDED`, and the handler's own
//! statuses pass through unchanged. The same layer on the client side.

use std::time::Duration;

use rpc_core::{
    client::{Channel, ClientCall},
    into_status::IntoStatusLayer,
    link::mem,
    server::{Server, ServerCall, ServerReply},
    Code, Status,
};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

fn call(method: &'static str, payload: &'static str) -> ClientCall {
    ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Default::default(),
        timeout: None,
        call_key: None,
        payload: payload.into(),
        stream: None,
        compress: None,
    }
}

/// Handlers of `hold` calls add a permit here when they start...
static HELD: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
/// ... and wait for one here before they answer.
static RELEASE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

/// Sleeps as many milliseconds as the payload says, then echoes it; `fail` fails;
/// `hold` waits for the test's word ([`HELD`], [`RELEASE`]).
fn slow_echo(
) -> impl Service<ServerCall, Response = ServerReply, Error = Status, Future = impl Send + 'static>
       + Clone
       + Send
       + 'static {
    service_fn(|call: ServerCall| async move {
        let text = String::from_utf8_lossy(&call.payload).into_owned();
        if text == "fail" {
            return Err(Status::not_found("no such thing"));
        }
        if text == "hold" {
            HELD.add_permits(1);
            RELEASE.acquire().await.unwrap().forget();
        }
        let ms: u64 = text.parse().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    })
}

#[tokio::test]
async fn load_shedding_and_timeouts_answer_with_their_statuses() {
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .layer(
            ServiceBuilder::new()
                .layer(IntoStatusLayer::new())
                .load_shed()
                .concurrency_limit(1)
                .timeout(Duration::from_secs(2)),
        )
        .add_named_service("t.Slow", slow_echo())
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();

    // One call holds the only slot; the next is shed, not queued.
    let mut first = channel.clone();
    let busy =
        tokio::spawn(async move { first.ready().await?.call(call("t.Slow/S", "hold")).await });
    HELD.acquire().await.unwrap().forget();
    let mut second = channel.clone();
    let shed = second
        .ready()
        .await
        .unwrap()
        .call(call("t.Slow/S", "0"))
        .await
        .unwrap_err();
    assert_eq!(shed.code(), Code::RESOURCE_EXHAUSTED, "{shed:?}");
    RELEASE.add_permits(1);
    assert_eq!(busy.await.unwrap().unwrap().payload, "hold");

    // A handler slower than the stack's timeout.
    let mut third = channel.clone();
    let late = third
        .ready()
        .await
        .unwrap()
        .call(call("t.Slow/S", "5000"))
        .await
        .unwrap_err();
    assert_eq!(late.code(), Code::DEADLINE_EXCEEDED, "{late:?}");

    // The handler's own status is unchanged.
    let mut fourth = channel.clone();
    let failed = fourth
        .ready()
        .await
        .unwrap()
        .call(call("t.Slow/S", "fail"))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::NOT_FOUND);
    assert_eq!(failed.message(), "no such thing");
}

#[tokio::test]
async fn a_client_side_timeout_is_deadline_exceeded() {
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .add_named_service("t.Slow", slow_echo())
        .build();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let mut client = ServiceBuilder::new()
        .layer(IntoStatusLayer::new())
        .timeout(Duration::from_millis(50))
        .service(channel);
    let status = client
        .ready()
        .await
        .unwrap()
        .call(call("t.Slow/S", "2000"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status:?}");
}
