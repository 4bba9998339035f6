//! `rpc_connect::Connect` and `ConnectOptions` over real transports on loopback: a
//! generated client connects itself by URI (one server or a service's replicas), the
//! same options reach the channel of every scheme (seen here through a pool's
//! connection count), and wait-for-ready lets a client start before its server.

use std::time::Duration;

use rpc_connect::{Connect, ConnectOptions};
use rpc_core::{client::Channel, server::Server};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};

fn echo_server() -> Server {
    Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build()
}

fn say(message: &str) -> SayRequest {
    SayRequest {
        message: message.into(),
        ..SayRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_options_reach_every_scheme() {
    let server = echo_server();
    let mut uris = Vec::new();
    for address in [
        "tcp://127.0.0.1:0",
        "udp://127.0.0.1:0",
        "rdma://127.0.0.1:0",
        "grpc://127.0.0.1:0",
    ] {
        let (uri, serving) = rpc_connect::serve(&server, address, std::future::pending())
            .await
            .unwrap();
        tokio::spawn(serving);
        uris.push(uri);
    }
    let options = ConnectOptions::new()
        .channel(
            Channel::builder()
                .timeout(Duration::from_secs(30))
                .connections(3),
        )
        .keepalive(Some(Duration::from_secs(60)), Duration::from_secs(20));
    for uri in &uris {
        let mut echo = EchoClient::connect_with(uri, &options).await.unwrap();
        assert_eq!(echo.get_ref().connections(), 3, "{uri}");
        let reply = echo.say(say(uri)).await.unwrap();
        assert_eq!(reply.get_ref().message, *uri);
    }
    // The replicas of a service name, each over its own scheme, with the same options.
    let replicas = format!("static://{}", uris.join(","));
    let mut balanced = EchoClient::balanced_with(&replicas, &options)
        .await
        .unwrap();
    for i in 0..12 {
        balanced.say(say(&format!("call {i}"))).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_line_connect_and_balanced() {
    let (uri, serving) =
        rpc_connect::serve(&echo_server(), "tcp://127.0.0.1:0", std::future::pending())
            .await
            .unwrap();
    tokio::spawn(serving);
    let mut one = EchoClient::connect(&uri).await.unwrap();
    assert_eq!(one.say(say("one")).await.unwrap().get_ref().message, "one");
    let mut many = EchoClient::balanced(&format!("static://{uri}"))
        .await
        .unwrap();
    assert_eq!(
        many.say(say("many")).await.unwrap().get_ref().message,
        "many"
    );
    // A scheme that names a service is refused by `connect`, with the way out.
    let err = EchoClient::connect(&format!("static://{uri}"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("balanced"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_ready_lets_a_client_start_before_its_server() {
    let socket = std::env::temp_dir().join(format!("rpc-wait-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let uri = format!("unix://{}", socket.display());

    // Nothing listens yet: without waiting, connecting fails at once.
    assert!(EchoClient::connect(&uri).await.is_err());

    // With wait-for-ready the client keeps trying while the server comes up.
    let options = ConnectOptions::new().wait_for_ready(Some(Duration::from_secs(60)));
    let client = {
        let uri = uri.clone();
        tokio::spawn(async move { EchoClient::connect_with(&uri, &options).await })
    };
    let (_, serving) = rpc_connect::serve(&echo_server(), &uri, std::future::pending())
        .await
        .unwrap();
    tokio::spawn(serving);
    let mut echo = client
        .await
        .unwrap()
        .expect("connected once the server listened");
    assert_eq!(
        echo.say(say("late")).await.unwrap().get_ref().message,
        "late"
    );
    let _ = std::fs::remove_file(&socket);
}
