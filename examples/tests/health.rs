//! The standard health service over TCP.

use rpc_core::{server::Server, Code};
use rpc_proto::health::{
    health_client::HealthClient, HealthCheckRequest, HealthListRequest, HealthReporter,
    ServingStatus,
};

#[tokio::test]
async fn check_and_list_report_what_the_server_set() {
    let health = HealthReporter::new();
    health.set("rpc.examples.v1.Echo", ServingStatus::Serving);
    health.set("rpc.examples.v1.KeyValue", ServingStatus::NotServing);
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    let server = Server::builder().add_service(health.service()).build();
    tokio::spawn(async move { server.serve(listener).await });

    let mut client = HealthClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let overall = client.check(check("")).await.unwrap().into_inner();
    assert_eq!(overall.status(), ServingStatus::Serving);
    let kv = client
        .check(check("rpc.examples.v1.KeyValue"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kv.status(), ServingStatus::NotServing);
    let err = client.check(check("no.Such")).await.unwrap_err();
    assert_eq!(err.code(), Code::NOT_FOUND);

    let list = client
        .list(HealthListRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.statuses.len(), 3);
    assert_eq!(
        list.statuses["rpc.examples.v1.Echo"].status(),
        ServingStatus::Serving
    );

    // Draining: everything reports NOT_SERVING.
    health.set_all_not_serving();
    let overall = client.check(check("")).await.unwrap().into_inner();
    assert_eq!(overall.status(), ServingStatus::NotServing);
}

/// `shutdown` ends every `Watch` stream after its `NOT_SERVING`, so that a server
/// with health watchers connected drains as soon as its calls end, not at its drain
/// timeout (a `Watch` never ends on its own; they held every shutdown for the whole
/// timeout and were then cut off with their connections).
#[tokio::test]
async fn shutdown_ends_watch_streams_so_they_do_not_hold_the_drain() {
    use std::time::Duration;
    let health = HealthReporter::new();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .drain_timeout(Duration::from_secs(600))
        .add_service(health.service())
        .build();
    let serving = tokio::spawn(async move {
        server
            .serve_with_shutdown(listener, async {
                let _ = stop_rx.await;
            })
            .await
    });

    let mut client = HealthClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    let watch = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let mut watching = client.watch(watch("")).await.unwrap().into_inner();
    let first = watching.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);

    health.shutdown();
    // Later changes are ignored, and a Watch made now gets the status and ends.
    health.set("", ServingStatus::Serving);
    assert_eq!(health.get(""), Some(ServingStatus::NotServing));
    let mut late = client.watch(watch("")).await.unwrap().into_inner();
    assert_eq!(
        late.message().await.unwrap().unwrap().status(),
        ServingStatus::NotServing
    );
    let end = tokio::time::timeout(Duration::from_secs(30), late.message()).await;
    assert!(
        end.expect("a Watch made after shutdown ends")
            .unwrap()
            .is_none(),
        "it ends with OK"
    );

    // The first Watch, still unread, does not hold the drain: it ends at once, far
    // inside its 600 s (the guard fails the test long before that).
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .expect("the server drained without waiting for its drain timeout")
        .unwrap()
        .unwrap();
    let last = watching.message().await.unwrap().unwrap();
    assert_eq!(last.status(), ServingStatus::NotServing);
    assert!(
        watching.message().await.unwrap().is_none(),
        "the stream ended with OK after NOT_SERVING"
    );
}

/// A `Watch` keeps its service name while it is open: an unknown name longer than
/// `MAX_SERVICE_NAME_LEN` is refused rather than kept (a peer could have a server keep
/// a whole message's worth per stream); `Check` does not echo a long name whole.
#[tokio::test]
async fn long_unknown_service_names_are_refused_not_kept() {
    use rpc_proto::health::MAX_SERVICE_NAME_LEN;
    let health = HealthReporter::new();
    let long_known = "k".repeat(MAX_SERVICE_NAME_LEN + 1);
    health.set(&long_known, ServingStatus::Serving);
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let uri = listener.local_addr_uri();
    let server = Server::builder().add_service(health.service()).build();
    tokio::spawn(async move { server.serve(listener).await });

    let mut client = HealthClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    let long = "x".repeat(1 << 20);
    let err = client
        .watch(HealthCheckRequest {
            service: long.clone(),
        })
        .await
        .expect_err("a megabyte of unknown name is refused");
    assert_eq!(err.code(), Code::INVALID_ARGUMENT, "{err}");
    let err = client
        .check(HealthCheckRequest { service: long })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NOT_FOUND);
    assert!(err.message().len() < 300, "{} bytes", err.message().len());
    // A name the server itself registered is watched whatever its length.
    let mut known = client
        .watch(HealthCheckRequest {
            service: long_known,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        known.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );
}
