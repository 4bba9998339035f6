//! A server of another protocol at a `tcp://` address (an HTTP port, a gRPC one): the
//! calls sent to it fail as unprocessed, since it ran none of them, so a balancer or a
//! retry layer sends them elsewhere (from a review: they failed as "connection lost",
//! which also says they may have run).

use std::time::Duration;

use rpc_core::{
    client::Client,
    method::{Idempotency, MethodDescriptor},
    Code, Request,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

static SAY: MethodDescriptor = MethodDescriptor {
    service: "demo.Echo",
    method: "Say",
    path: "demo.Echo/Say",
    idempotency: Idempotency::Unknown,
};

/// A server that answers whatever it reads with `answer`, then closes.
async fn foreign_server(answer: &'static [u8]) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn calls_to_a_server_of_another_protocol_fail_unprocessed() {
    // The soft RDMA provider's HELLO (docs/rdma.md), as an rdma:// listener sends it
    // first: it read as a frame of an undefined kind (from a review).
    let mut soft_hello = vec![0, 0, 0, 65, 1];
    soft_hello.extend_from_slice(b"RPCSOFT1");
    soft_hello.resize(4 + 65, 0);
    let soft_hello: &'static [u8] = soft_hello.leak();
    for (what, answer, expected) in [
        (
            "HTTP/1",
            &b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"[..],
            "speaks HTTP",
        ),
        // An HTTP/2 server's SETTINGS frame (MAX_CONCURRENT_STREAMS 100), then its
        // close.
        (
            "HTTP/2",
            &[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100][..],
            "speaks HTTP",
        ),
        ("soft RDMA", soft_hello, "use rdma://"),
    ] {
        let addr = foreign_server(answer).await;
        let channel = rpc_transport_tcp::connect(&format!("tcp://{addr}"))
            .await
            .unwrap();
        let mut client = Client::new(channel);
        let request = Request::new("hi".to_string()).with_timeout(Duration::from_secs(10));
        let status = client.unary::<_, String>(request, &SAY).await.unwrap_err();
        assert_eq!(status.code(), Code::UNAVAILABLE, "{what}: {status}");
        assert!(status.is_unprocessed(), "{what}: not unprocessed: {status}");
        assert!(status.message().contains(expected), "{what}: {status}");
    }
}
