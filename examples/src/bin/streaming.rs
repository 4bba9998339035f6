//! Streaming, the three kinds, with the generated `Echo` client and server on loopback
//! TCP: server streaming (`Count`: the replies arrive one by one), client streaming
//! (`Sum`: any `Stream` of requests), and bidirectional (`Chat`: replies while the
//! requests are still being sent). Each stream has a credit window, so neither side
//! buffers without bound. Guide: `docs/streaming.md`.
//!
//! `cargo run -p rpc-examples --bin streaming`

use futures::StreamExt;
use rpc_connect::Connect;
use rpc_core::server::Server;
use rpc_proto::echo::{
    echo_client::EchoClient, echo_server::EchoServer, CountRequest, EchoService, SayRequest,
    SumRequest,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = listener.local_addr_uri();
    tokio::spawn(
        Server::builder()
            .add_service(EchoServer::new(EchoService))
            .serve(listener),
    );
    let mut echo = EchoClient::connect(&uri).await?;

    // Server streaming: read the replies as they come.
    let request = CountRequest {
        count: 3,
        interval_ms: 10,
    };
    let mut counts = echo.count(request).await?.into_inner();
    while let Some(reply) = counts.message().await? {
        println!("count: {}", reply.n);
    }

    // Client streaming: any Stream of requests; one reply at the end.
    let values = futures::stream::iter(1..=100).map(|value| SumRequest { value });
    let sum = echo.sum(values).await?.into_inner();
    println!("sum: {} values add up to {}", sum.count, sum.total);

    // Bidirectional: replies come back while requests are still going out.
    let words = ["hello", "streaming", "world"].map(|word| SayRequest {
        message: word.into(),
        ..SayRequest::default()
    });
    let mut replies = echo.chat(futures::stream::iter(words)).await?.into_inner();
    while let Some(reply) = replies.message().await? {
        println!("chat: {}", reply.message);
    }
    Ok(())
}
