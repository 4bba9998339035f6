//! `rpc-server` serves every transport it is given (`--listen` repeated), with no etcd
//! needed when it does not register.

mod common;

use std::time::Duration;

use rpc_core::{Code, Request};
use rpc_proto::{
    echo::{echo_client::EchoClient, SayRequest},
    kv::{key_value_client::KeyValueClient, GetRequest},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_binary_answers_over_tcp_udp_rdma_and_grpc_at_once() {
    let common::Launched {
        child: _child,
        uris,
        ..
    } = common::launch(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--listen",
        "udp://127.0.0.1:0",
        "--listen",
        "rdma://127.0.0.1:0",
        "--listen",
        "grpc://127.0.0.1:0",
        "--name",
        "both",
    ])
    .await;
    assert!(
        uris[0].starts_with("tcp://")
            && uris[1].starts_with("udp://")
            && uris[2].starts_with("rdma://")
            && uris[3].starts_with("grpc://"),
        "{uris:?}"
    );
    for uri in &uris {
        let channel = rpc_connect::connect(uri).await.unwrap();
        let reply = EchoClient::new(channel)
            .say(
                Request::new(SayRequest {
                    message: format!("via {uri}"),
                    ..SayRequest::default()
                })
                .with_timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap_or_else(|status| panic!("{uri}: {status}"));
        assert_eq!(reply.get_ref().message, format!("via {uri}"));
        assert_eq!(reply.metadata().get_str("x-served-by"), Some("both"));
        // An error from a handler names the replica too.
        let err = KeyValueClient::new(rpc_connect::connect(uri).await.unwrap())
            .get(
                Request::new(GetRequest {
                    key: "absent".into(),
                })
                .with_timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NOT_FOUND, "{uri}: {err}");
        assert_eq!(
            err.metadata().get_str("x-served-by"),
            Some("both"),
            "{uri}: {err:?}"
        );
    }
}

/// The `--max-*` options reach the server: with `--max-frame-len 4096` an answer
/// longer than that is refused (`RESOURCE_EXHAUSTED`), a short one goes through; and
/// `--max-concurrent-requests` and the byte bounds are taken (a review: the binary
/// exposed none of the bounds the docs tell operators to lower).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounds_on_what_peers_make_it_hold_are_options() {
    let common::Launched {
        child: _child,
        uris,
        ..
    } = common::launch(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--max-frame-len",
        "4096",
        "--max-concurrent-requests",
        "8",
        "--max-connections",
        "100",
        "--max-large-request-bytes",
        "1000000",
        "--max-unsent-answer-bytes",
        "1000000",
    ])
    .await;
    let mut echo = EchoClient::new(rpc_connect::connect(&uris[0]).await.unwrap());
    let say = |message: String| {
        Request::new(SayRequest {
            message,
            ..SayRequest::default()
        })
        .with_timeout(Duration::from_secs(10))
    };
    let reply = echo.say(say("short".into())).await.unwrap();
    assert_eq!(reply.get_ref().message, "short");
    // A request over the frame limit never reaches the server (the client's own limit
    // is larger): the server refuses the frame, or its answer, whichever it meets.
    let err = echo
        .say(say("x".repeat(3000) + &"y".repeat(2000)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.code(),
            Code::RESOURCE_EXHAUSTED | Code::UNAVAILABLE | Code::INTERNAL
        ),
        "{err}"
    );
}
