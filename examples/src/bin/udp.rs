//! UDP: the same generated client and server over `udp://`, here through a proxy that
//! drops 10% of datagrams and copies 5%. The channel retransmits unanswered requests
//! with the same id and call key, and the server's duplicate cache runs a call that is
//! not safe to repeat at most once: 100 increments give exactly 100. A message larger
//! than a datagram (1 MiB here) is fragmented and repaired by re-sending only the lost
//! fragments. Over UDP, give calls a deadline: a silent host costs the whole of it.
//! Details: README's "UDP's guarantees", `docs/semantics.md`.
//!
//! `cargo run -p rpc-examples --bin udp`

use std::time::Duration;

use fault_proxy::{UdpFaults, UdpProxy};
use rpc_connect::{Connect, ConnectOptions};
use rpc_core::{client::Channel, server::Server};
use rpc_proto::kv::{
    key_value_client::KeyValueClient, key_value_server::KeyValueServer, GetRequest,
    IncrementRequest, MemoryStore, PutRequest,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = rpc_transport_udp::bind("udp://127.0.0.1:0").await?;
    let server_addr = listener.local_addr_uri();
    let server = Server::builder().add_service(KeyValueServer::new(MemoryStore::default()));
    tokio::spawn(server.serve(listener));

    let faults = UdpFaults {
        drop: 0.1,
        duplicate: 0.05,
        seed: 1,
        ..UdpFaults::default()
    };
    let proxy = UdpProxy::start(server_addr.trim_start_matches("udp://").parse()?, faults).await?;
    println!(
        "proxy on {} drops 10% and copies 5% of datagrams",
        proxy.addr()
    );

    let options =
        ConnectOptions::new().channel(Channel::builder().timeout(Duration::from_secs(20)));
    let kv = KeyValueClient::connect_with(&format!("udp://{}", proxy.addr()), &options).await?;

    // 100 non-idempotent calls at once: each runs exactly once.
    let calls = (0..100).map(|_| {
        let mut kv = kv.clone();
        async move {
            let request = IncrementRequest {
                key: "hits".into(),
                delta: 1,
            };
            kv.increment(request).await
        }
    });
    let ok = futures::future::join_all(calls)
        .await
        .iter()
        .filter(|r| r.is_ok())
        .count();
    let hits = kv.clone().get(GetRequest { key: "hits".into() }).await?;
    let hits = String::from_utf8_lossy(&hits.get_ref().value).into_owned();
    println!("increments: {ok}/100 answered, hits = {hits}");

    // A 1 MiB value: fragmented, and repaired by selective re-sends.
    let value = vec![7u8; 1 << 20];
    let put = PutRequest {
        key: "big".into(),
        value: value.clone().into(),
    };
    kv.clone().put(put).await?;
    let got = kv.clone().get(GetRequest { key: "big".into() }).await?;
    let dropped = proxy
        .counters()
        .dropped
        .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "1 MiB value: stored and read back {}, {dropped} datagrams dropped on the way",
        if got.get_ref().value == value {
            "intact"
        } else {
            "DAMAGED"
        }
    );
    assert_eq!((ok, hits.as_str()), (100, "100"));
    Ok(())
}
