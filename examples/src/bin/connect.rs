//! One line to connect, one set of settings for every scheme: `FooClient::connect(uri)`
//! (`rpc_connect::Connect`), and `connect_with(uri, &options)` where
//! `ConnectOptions` carries the channel's settings (default deadline, limits,
//! compression, keepalive, a pool of connections), TLS and wait-for-ready, the same for
//! `tcp://`, `unix://`, `udp://`, `rdma://`, `grpc://` and service names
//! (`balanced_with("static://…")`, `dns://…`). The server here listens on three
//! schemes; the client calls each with the same options.
//!
//! `cargo run -p rpc-examples --bin connect`

use std::time::Duration;

use rpc_connect::{Connect, ConnectOptions};
use rpc_core::{client::Channel, server::Server};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let mut uris = Vec::new();
    for address in [
        "tcp://127.0.0.1:0",
        "udp://127.0.0.1:0",
        "grpc://127.0.0.1:0",
    ] {
        let (uri, serving) = rpc_connect::serve(&server, address, std::future::pending()).await?;
        tokio::spawn(serving);
        uris.push(uri);
    }

    // Defaults: one line.
    let mut echo = EchoClient::connect(&uris[0]).await?;
    echo.say(SayRequest::default()).await?;
    println!("connect {}: ok", uris[0]);

    // Settings once, for every scheme.
    let options = ConnectOptions::new()
        .channel(
            Channel::builder()
                .timeout(Duration::from_secs(5)) // every call's default deadline
                .max_in_flight(512)
                .connections(2), // a pool: two connections per server
        )
        .keepalive(Some(Duration::from_secs(60)), Duration::from_secs(10))
        .wait_for_ready(Some(Duration::from_secs(5)));
    for uri in &uris {
        let mut echo = EchoClient::connect_with(uri, &options).await?;
        let request = SayRequest {
            message: format!("hello over {uri}"),
            ..SayRequest::default()
        };
        let reply = echo.say(request).await?;
        let connections = echo.get_ref().connections();
        println!(
            "connect_with {uri}: {:?} ({connections} connections)",
            reply.get_ref().message
        );
    }

    // A service's replicas (here one per scheme), with the same options: each call
    // goes to the less loaded of two.
    let replicas = format!("static://{}", uris.join(","));
    let mut balanced = EchoClient::balanced_with(&replicas, &options).await?;
    for _ in 0..6 {
        balanced.say(SayRequest::default()).await?;
    }
    println!("balanced_with {replicas}: 6 calls ok");
    Ok(())
}
