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
