//! Our client and our server over `grpc://`: every call kind, flow control on long
//! streams, deadlines, cancellation and errors, with no third party in between.

use std::time::Duration;

use futures::{stream, StreamExt};
use rpc_core::{server::Server, Code, Request};
use rpc_proto::echo::{
    echo_client::EchoClient, echo_server::EchoServer, CountRequest, EchoService, FailRequest,
    SayRequest, SleepRequest, SumRequest,
};

const GUARD: Duration = Duration::from_secs(60);

async fn start() -> (
    EchoClient<rpc_core::client::Channel>,
    tokio::task::JoinHandle<()>,
) {
    let listener = rpc_transport_grpc::bind("grpc://127.0.0.1:0")
        .await
        .unwrap();
    let uri = listener.local_addr_uri();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let serving = tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    let channel = rpc_transport_grpc::connect(&uri).await.unwrap();
    (EchoClient::new(channel), serving)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_kind_over_grpc() {
    let (mut echo, serving) = start().await;
    tokio::time::timeout(GUARD, async {
        let reply = echo
            .say(SayRequest {
                message: "hi".into(),
                ..SayRequest::default()
            })
            .await
            .unwrap();
        assert_eq!(reply.get_ref().message, "hi");

        // Far past the initial credit (64 KiB) and HTTP/2 windows: credit must flow back.
        let mut counts = echo
            .count(CountRequest {
                count: 50_000,
                interval_ms: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let mut n = 0;
        while let Some(reply) = counts.message().await.unwrap() {
            n += 1;
            assert_eq!(reply.n, n);
        }
        assert_eq!(n, 50_000);

        let values = stream::iter(1..=20_000i64).map(|value| SumRequest { value });
        let sum = echo.sum(values).await.unwrap();
        assert_eq!(sum.get_ref().count, 20_000);

        let big = vec![7u8; 3 * 1024 * 1024];
        let requests = stream::iter(0..4).map(move |i| SayRequest {
            message: i.to_string(),
            payload: big.clone().into(),
        });
        let mut replies = echo.chat(requests).await.unwrap().into_inner();
        let mut got = 0;
        while let Some(reply) = replies.message().await.unwrap() {
            assert_eq!(reply.payload.len(), 3 * 1024 * 1024);
            got += 1;
        }
        assert_eq!(got, 4);

        let status = echo
            .fail(FailRequest {
                code: 9,
                message: "nope".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (Code::FAILED_PRECONDITION, "nope")
        );

        let status = echo
            .sleep(
                Request::new(SleepRequest { delay_ms: 10_000 })
                    .with_timeout(Duration::from_millis(200)),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DEADLINE_EXCEEDED);
    })
    .await
    .expect("a call hung");
    serving.abort();
}

/// Compression negotiated through `grpc-accept-encoding` and named by `grpc-encoding`,
/// both ends ours: unary and stream messages compressed each way (zstd, this
/// framework's preferred algorithm, which gRPC peers may also speak), the flags
/// intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_messages_both_ways_over_grpc() {
    use rpc_core::compress::Compression;
    let listener = rpc_transport_grpc::bind("grpc://127.0.0.1:0")
        .await
        .unwrap();
    let uri = listener.local_addr_uri();
    let server = Server::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .add_service(EchoServer::new(EchoService))
        .build();
    let serving = tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    let channel = rpc_core::client::Channel::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .connect(rpc_transport_grpc::GrpcConnector::from_uri(&uri).unwrap())
        .await
        .unwrap();
    let mut echo = EchoClient::new(channel);
    let zeros = bytes::Bytes::from(vec![0u8; 64 * 1024]);
    tokio::time::timeout(GUARD, async {
        for round in 0..3 {
            let reply = echo
                .say(SayRequest {
                    message: format!("{round}"),
                    payload: zeros.clone(),
                })
                .await
                .unwrap();
            assert_eq!(reply.get_ref().payload, zeros);
            assert!(
                reply.compressed(),
                "unary answer {round} arrived uncompressed"
            );
        }
        let chunk = zeros.clone();
        let requests = stream::iter(0..20).map(move |i| SayRequest {
            message: i.to_string(),
            payload: chunk.clone(),
        });
        let mut replies = echo.chat(requests).await.unwrap().into_inner();
        let mut got = 0;
        while let Some(reply) = replies.message().await.unwrap() {
            assert_eq!(reply.payload, zeros);
            got += 1;
        }
        assert_eq!(got, 20);
    })
    .await
    .expect("a compressed call hung");
    serving.abort();
}
