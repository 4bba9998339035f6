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
