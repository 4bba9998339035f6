//! A pooled channel (`ChannelBuilder::connections`) over TCP on loopback: it opens its
//! connections, the server sees them all, and calls are spread over them, counted on
//! the server by the peer address each call came from.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::future::join_all;
use rpc_core::{
    client::Channel,
    server::{NamedService, Server, ServerCall},
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use tower::Service;

/// Calls per peer address, as the server saw them.
type Seen = Arc<Mutex<HashMap<String, usize>>>;

/// An Echo server that counts the calls of each connection (by its peer address).
async fn counting_server() -> (Server, String, Seen) {
    let seen = Seen::default();
    let echo = EchoServer::new(EchoService);
    let counted = {
        let seen = seen.clone();
        tower::service_fn(move |call: ServerCall| {
            let peer = call.peer.as_ref().map_or("?".into(), |p| p.to_string());
            *seen.lock().unwrap().entry(peer).or_default() += 1;
            let mut echo = echo.clone();
            async move { echo.call(call).await }
        })
    };
    let server = Server::builder()
        .add_named_service(<EchoServer<EchoService> as NamedService>::NAME, counted)
        .build();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    let serving = server.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    (server, uri, seen)
}

/// `calls` concurrent Say calls over clones of `channel`.
async fn say_many(channel: &Channel, calls: usize) {
    let replies = join_all((0..calls).map(|i| {
        let mut echo = EchoClient::new(channel.clone());
        async move {
            let request = SayRequest {
                message: format!("call {i}"),
                ..SayRequest::default()
            };
            echo.say(request).await
        }
    }))
    .await;
    for reply in replies {
        reply.expect("every call is answered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_spreads_calls_over_its_connections() {
    let (server, uri, seen) = counting_server().await;
    let connector = rpc_transport_tcp::StreamConnector::from_uri(&uri).unwrap();
    let channel = Channel::builder()
        .connections(4)
        .connect(connector)
        .await
        .unwrap();
    assert_eq!(channel.connections(), 4);

    say_many(&channel, 400).await;

    // Every connection carried its turn: 4 peers, 100 calls each (round-robin).
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "calls per connection: {seen:?}");
    assert!(seen.values().all(|&n| n == 100), "{seen:?}");
    assert_eq!(server.open_connections(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_by_default() {
    let (server, uri, seen) = counting_server().await;
    let channel = rpc_transport_tcp::connect(&uri).await.unwrap();
    assert_eq!(channel.connections(), 1);

    say_many(&channel, 100).await;

    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(server.open_connections(), 1);
}
