//! Retries and at-most-once: a client with a retry policy calls a method that is not
//! safe to repeat (`KeyValue/Increment`) through a fault-injecting proxy that cuts the
//! connection after the request reached the server, so the first response is lost.
//! The retry layer sends the call again with the same call key, and the server's
//! duplicate cache (on by default) answers it with the first run's outcome: the counter
//! went up once, not twice. Methods the `.proto` marks safe to repeat
//! (`option idempotency_level`) are simply retried. See `docs/semantics.md`.
//!
//! `cargo run -p rpc-examples --bin retries`

use std::{sync::atomic::Ordering, time::Duration};

use fault_proxy::{TcpFaults, TcpProxy};
use rpc_connect::Connect;
use rpc_core::{retry::RetryPolicy, server::Server};
use rpc_proto::kv::{
    key_value_client::KeyValueClient, key_value_server::KeyValueServer, GetRequest,
    IncrementRequest, MemoryStore,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let server_addr = listener.local_addr_uri();
    let server = Server::builder()
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .build();
    let serving = server.clone();
    tokio::spawn(async move { serving.serve(listener).await });

    // A proxy that loses the response of the first connection's first call.
    let faults = TcpFaults {
        cut_before_response: true,
        faulty_connections: Some(1),
        ..TcpFaults::default()
    };
    let proxy = TcpProxy::start(server_addr.trim_start_matches("tcp://").parse()?, faults).await?;
    println!("proxy on {} loses the first response", proxy.addr());

    // The retry policy: jittered exponential backoff within a retry budget.
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let mut kv = KeyValueClient::connect(&format!("tcp://{}", proxy.addr()))
        .await?
        .with_retries(policy);

    let request = IncrementRequest {
        key: "visits".into(),
        delta: 1,
    };
    let reply = kv.increment(request).await?;
    println!("increment answered: visits = {}", reply.get_ref().value);

    // Straight to the server: the handler ran once, the retry was a cache hit.
    let mut direct = KeyValueClient::connect(&server_addr).await?;
    let stored = direct
        .get(GetRequest {
            key: "visits".into(),
        })
        .await?;
    let hits = server
        .dedupe_stats()
        .map_or(0, |s| s.hits.load(Ordering::Relaxed));
    println!(
        "stored: visits = {} (ran once; {hits} answer from the duplicate cache)",
        String::from_utf8_lossy(&stored.get_ref().value)
    );
    assert_eq!(stored.get_ref().value.as_ref(), b"1");
    Ok(())
}
