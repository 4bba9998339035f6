//! Compression on long streams, over TCP and over gRPC's wire (`docs/wire.md` §6.10, `docs/grpc.md`).

use std::time::Duration;

use futures::{stream, StreamExt};
use rpc_core::server::Server;
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};

const GUARD: Duration = Duration::from_secs(60);

/// Streams of messages that compress well run past the stream window: credit counts
/// message bytes as sent, compressed (docs/wire.md §6.10), and the server's handler
/// takes credit before its connection compresses, so the connection gives back the
/// difference (a stream of 64 KiB messages used to stall after 16 of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_streams_run_past_the_stream_window() {
    compressed_messages_both_ways("tcp://127.0.0.1:0").await;
}

/// The same through gRPC's wire, where the links name the core's algorithm in
/// `grpc-encoding` and the flags must arrive intact (docs/grpc.md, Compression).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_messages_both_ways_over_grpc() {
    compressed_messages_both_ways("grpc://127.0.0.1:0").await;
}

/// Unary answers compressed (checked by their flag) and a 40-message bidirectional
/// stream of 64 KiB messages that compress well, both sides compressing, on `uri`.
async fn compressed_messages_both_ways(uri: &str) {
    use rpc_core::compress::Compression;
    let server = Server::builder()
        .compression(Some(Compression::default()))
        .unwrap()
        .add_service(EchoServer::new(EchoService))
        .build();
    let listener = rpc_connect::AnyListener::bind(uri).await.unwrap();
    let uri = listener.local_addr_uri();
    let serving = tokio::spawn(listener.serve(&server, std::future::pending()));
    let builder = rpc_core::client::Channel::builder()
        .compression(Some(Compression::default()))
        .unwrap();
    let options = rpc_connect::ConnectOptions::new().channel(builder);
    let channel = rpc_connect::connect_with(&uri, &options).await.unwrap();
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
        let requests = stream::iter(0..40).map(move |i| SayRequest {
            message: i.to_string(),
            payload: chunk.clone(),
        });
        let mut replies = echo.chat(requests).await.unwrap().into_inner();
        let mut got = 0;
        while let Some(reply) = replies.message().await.unwrap() {
            assert_eq!(reply.payload, zeros);
            got += 1;
        }
        assert_eq!(got, 40);
    })
    .await
    .expect("a compressed call hung");
    serving.abort();
}
