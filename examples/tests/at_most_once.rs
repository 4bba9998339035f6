//! At-most-once execution of a method that is not safe to repeat, when the network
//! loses the response: through a fault-injecting TCP proxy that lets the request reach
//! the server and cuts the connection before the answer comes back.

use std::{net::SocketAddr, time::Duration};

use fault_proxy::{TcpFaults, TcpProxy};
use rpc_core::{
    retry::{RetryLayer, RetryPolicy},
    server::{DedupeConfig, Server},
    Code,
};
use rpc_proto::kv::{
    key_value_client::KeyValueClient, key_value_server::KeyValueServer, GetRequest,
    IncrementRequest, MemoryStore,
};
use tower::Layer;

/// A key-value server on loopback; returns its address and the server (for stats).
async fn kv_server(cache: Option<DedupeConfig>) -> (SocketAddr, Server, MemoryStore) {
    let store = MemoryStore::default();
    let server = Server::builder()
        .duplicate_cache(cache)
        .add_service(KeyValueServer::new(store.clone()))
        .build();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener
        .local_addr_uri()
        .trim_start_matches("tcp://")
        .parse()
        .unwrap();
    let serving = server.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    (addr, server, store)
}

/// A retrying client whose first connection loses the first response.
async fn client_through_lossy_proxy(
    upstream: SocketAddr,
) -> (
    KeyValueClient<rpc_core::retry::Retry<rpc_core::client::Channel>>,
    TcpProxy,
) {
    let proxy = TcpProxy::start(
        upstream,
        TcpFaults {
            cut_before_response: true,
            faulty_connections: Some(1),
            ..TcpFaults::default()
        },
    )
    .await
    .unwrap();
    let channel = rpc_transport_tcp::connect(&format!("tcp://{}", proxy.addr()))
        .await
        .unwrap();
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    // The generated client's option, same as `RetryLayer::new(policy).layer(channel)`.
    let client = KeyValueClient::new(channel).with_retries(policy);
    (client, proxy)
}

async fn counter(store: &MemoryStore) -> String {
    use rpc_proto::kv::key_value_server::KeyValue;
    let reply = store
        .get(rpc_core::Request::new(GetRequest { key: "n".into() }))
        .await
        .unwrap();
    String::from_utf8(reply.into_inner().value.to_vec()).unwrap()
}

#[tokio::test]
async fn a_lost_response_is_retried_and_answered_from_the_cache_the_handler_ran_once() {
    let (addr, server, store) = kv_server(Some(DedupeConfig::default())).await;
    let (mut client, proxy) = client_through_lossy_proxy(addr).await;

    let reply = client
        .increment(IncrementRequest {
            key: "n".into(),
            delta: 1,
        })
        .await
        .expect("the retry should get the original outcome");
    assert_eq!(reply.get_ref().value, 1, "the original outcome");
    assert_eq!(counter(&store).await, "1", "Increment ran exactly once");
    assert_eq!(
        proxy
            .counters()
            .cut
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let stats = server.dedupe_stats().unwrap();
    assert_eq!(stats.hits.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Later calls are new calls: they run.
    let reply = client
        .increment(IncrementRequest {
            key: "n".into(),
            delta: 1,
        })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().value, 2);
}

#[tokio::test]
async fn without_the_cache_the_retry_gets_a_clear_error_not_a_second_run() {
    let (addr, _server, store) = kv_server(None).await;
    let (mut client, _proxy) = client_through_lossy_proxy(addr).await;

    let err = client
        .increment(IncrementRequest {
            key: "n".into(),
            delta: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FAILED_PRECONDITION, "{err}");
    assert!(err.message().contains("may already have run"), "{err}");
    assert_eq!(counter(&store).await, "1", "Increment ran exactly once");
}

mod common;

#[tokio::test]
async fn a_retry_of_a_call_still_running_waits_for_the_same_execution() {
    use rpc_core::{frame, retry::MethodRetry};
    use rpc_proto::echo::{echo_client::EchoClient, SleepRequest};

    let (echo, probe) = common::TestEcho::new(None);
    let server = common::TestServer::start(Server::builder(), echo).await;
    let upstream: SocketAddr = server.uri.trim_start_matches("tcp://").parse().unwrap();

    // The exact length of the first attempt's frame: the proxy forwards it whole, then
    // cuts the connection while the handler is still sleeping.
    let request = SleepRequest { delay_ms: 300 };
    let mut header = bytes::BytesMut::new();
    frame::encode_request_header_with_key(
        &mut header,
        1,
        "rpc.examples.v1.Echo/Sleep",
        None,
        Some(&frame::CallKey {
            client: 0,
            call: 0,
            attempt: 1,
        }),
        &Default::default(),
    );
    let len = 4 + header.len() + rpc_core::payload::encode(&request).len();
    let proxy = TcpProxy::start(
        upstream,
        TcpFaults {
            cut_after_request_bytes: Some(len as u64),
            faulty_connections: Some(1),
            ..TcpFaults::default()
        },
    )
    .await
    .unwrap();
    let channel = rpc_transport_tcp::connect(&format!("tcp://{}", proxy.addr()))
        .await
        .unwrap();
    // Sleep is IDEMPOTENT in the .proto; treat it as unsafe so that it gets a call key.
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        ..RetryPolicy::default()
    }
    .with_method(
        "rpc.examples.v1.Echo/Sleep",
        MethodRetry {
            safe_to_repeat: Some(false),
            ..MethodRetry::default()
        },
    );
    let mut client = EchoClient::new(RetryLayer::new(policy).layer(channel));
    let reply = client
        .sleep(request)
        .await
        .expect("the retry waits for the first run");
    assert_eq!(reply.get_ref().slept_ms, 300);
    assert_eq!(probe.started(), 1, "the handler ran once");
    assert_eq!(
        proxy
            .counters()
            .cut
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the first connection was cut"
    );
}
