//! Interceptors on both sides, with the generated Echo client and server over TCP: the
//! server rejects calls without a token (streams too, when they open), an async client
//! interceptor adds the token, and an interceptor sees full method names.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use rpc_core::{
    intercept::{interceptor_fn, InterceptLayer, Interceptor},
    server::Server,
    Code, Metadata, Request, Status,
};
use rpc_proto::echo::{
    echo_client::EchoClient, echo_server::EchoServer, CountRequest, EchoService, SayRequest,
};
use tower::ServiceBuilder;

/// An async interceptor: looks the token up "remotely" (a sleep), records the methods
/// it saw, and adds the token.
#[derive(Clone, Default)]
struct TokenFetcher {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Interceptor for TokenFetcher {
    async fn intercept(&self, method: &str, metadata: &mut Metadata) -> Result<(), Status> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.seen.lock().unwrap().push(method.to_owned());
        metadata
            .insert("x-token", "s3cret")
            .map_err(|e| Status::internal(e.to_string()))
    }
}

async fn server() -> String {
    let auth = interceptor_fn(|method: &str, metadata: &mut Metadata| {
        if metadata.get_str("x-token") == Some("s3cret") {
            Ok(())
        } else {
            Err(Status::unauthenticated(format!("{method} needs x-token")))
        }
    });
    let server = Server::builder()
        .layer(InterceptLayer::new(auth))
        .add_service(EchoServer::new(EchoService))
        .build();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    tokio::spawn(async move { server.serve(listener).await });
    uri
}

fn say(text: &str) -> Request<SayRequest> {
    Request::new(SayRequest {
        message: text.into(),
        ..SayRequest::default()
    })
}

#[tokio::test]
async fn a_server_interceptor_rejects_calls_without_a_token_before_the_handler() {
    let uri = server().await;
    let mut plain = EchoClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    let status = plain.say(say("hi")).await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED);
    assert_eq!(
        status.message(),
        "rpc.examples.v1.Echo/Say needs x-token",
        "the interceptor saw the full method name"
    );
    // Streams are intercepted when they open.
    let status = plain
        .count(CountRequest {
            count: 3,
            interval_ms: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED);

    let mut with_token = say("hi");
    with_token
        .metadata_mut()
        .insert("x-token", "s3cret")
        .unwrap();
    assert_eq!(plain.say(with_token).await.unwrap().get_ref().message, "hi");
}

#[tokio::test]
async fn an_async_client_interceptor_adds_the_token_to_every_call() {
    let uri = server().await;
    let fetcher = TokenFetcher::default();
    let channel = ServiceBuilder::new()
        .layer(InterceptLayer::new(fetcher.clone()))
        .service(rpc_transport_tcp::connect(&uri).await.unwrap());
    let mut echo = EchoClient::new(channel);
    assert_eq!(echo.say(say("one")).await.unwrap().get_ref().message, "one");
    let counts: Vec<u32> = echo
        .count(CountRequest {
            count: 3,
            interval_ms: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .map(|reply| reply.unwrap().n)
        .collect()
        .await;
    assert_eq!(counts, [1, 2, 3]);
    assert_eq!(
        *fetcher.seen.lock().unwrap(),
        ["rpc.examples.v1.Echo/Say", "rpc.examples.v1.Echo/Count"]
    );
}

#[tokio::test]
async fn a_client_interceptor_can_refuse_to_send() {
    let uri = server().await;
    let guard = interceptor_fn(|method: &str, _: &mut Metadata| {
        if method.ends_with("/Fail") {
            Err(Status::permission_denied("not from this client"))
        } else {
            Ok(())
        }
    });
    let channel = ServiceBuilder::new()
        .layer(InterceptLayer::new(guard))
        .service(rpc_transport_tcp::connect(&uri).await.unwrap());
    let mut echo = EchoClient::new(channel);
    let status = echo
        .fail(rpc_proto::echo::FailRequest {
            code: 5,
            message: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED);
}

#[tokio::test]
async fn a_layer_for_some_methods_leaves_the_others_alone() {
    let deny = interceptor_fn(|method: &str, _: &mut Metadata| {
        Err(Status::permission_denied(format!("{method} is closed")))
    });
    let server = Server::builder()
        .layer(rpc_core::intercept::for_methods(
            InterceptLayer::new(deny),
            ["rpc.examples.v1.Echo/Fail", "rpc.examples.v1.KeyValue/"],
        ))
        .add_service(EchoServer::new(EchoService))
        .build();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    tokio::spawn(async move { server.serve(listener).await });
    let mut echo = EchoClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    assert_eq!(
        echo.say(say("open")).await.unwrap().get_ref().message,
        "open"
    );
    let status = echo
        .fail(rpc_proto::echo::FailRequest {
            code: 0,
            message: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED);
    assert_eq!(status.message(), "rpc.examples.v1.Echo/Fail is closed");
}

/// A client interceptor that takes its time spends the call's: one slower than the
/// call's timeout fails the call `DEADLINE_EXCEEDED`, unsent, at its deadline; one that
/// takes part of it leaves the rest to the call (from a review: the call waited for
/// the interceptor, then had its whole timeout afresh).
#[tokio::test]
async fn a_slow_client_interceptor_spends_the_calls_timeout() {
    #[derive(Clone)]
    struct Slow(Duration);
    impl Interceptor for Slow {
        async fn intercept(&self, _: &str, metadata: &mut Metadata) -> Result<(), Status> {
            tokio::time::sleep(self.0).await;
            metadata
                .insert("x-token", "s3cret")
                .map_err(|e| Status::internal(e.to_string()))
        }
    }
    let uri = server().await;
    let tcp = rpc_transport_tcp::connect(&uri).await.unwrap();
    let mut echo = EchoClient::new(
        ServiceBuilder::new()
            .layer(InterceptLayer::new(Slow(Duration::from_secs(30))))
            .service(tcp.clone()),
    );
    let start = std::time::Instant::now();
    let status = echo
        .say(say("late").with_timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status}");
    assert!(status.is_unprocessed(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    // 200 ms of a 5 s budget: the call goes on with the rest.
    let mut echo = EchoClient::new(
        ServiceBuilder::new()
            .layer(InterceptLayer::new(Slow(Duration::from_millis(200))))
            .service(tcp),
    );
    let reply = echo
        .say(say("in time").with_timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(reply.get_ref().message, "in time");
}
