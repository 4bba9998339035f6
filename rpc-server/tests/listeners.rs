//! `rpc-server` serves every transport it is given (`--listen` repeated), with no etcd
//! needed when it does not register.

use std::{process::Stdio, time::Duration};

use rpc_core::Request;
use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_binary_answers_over_tcp_udp_rdma_and_grpc_at_once() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args([
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
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start rpc-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut uris = Vec::new();
    while uris.len() < 4 {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("rpc-server did not report its listeners")
            .unwrap()
            .expect("rpc-server exited");
        if let Some(uri) = line.strip_prefix("listening on ") {
            uris.push(uri.to_owned());
        }
    }
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
    }
}
