//! Health checking with gRPC's standard `grpc.health.v1.Health` service (crate
//! `rpc-services`): the server reports the health of itself (`""`) and of each
//! service through a `HealthReporter`; a client `Check`s once, or `Watch`es and is told
//! of every change, as load balancers and orchestrators do. Here the Echo service goes
//! `NOT_SERVING` (say, while draining) under a watching client.
//!
//! `cargo run -p rpc-examples --bin health`

use rpc_connect::Connect;
use rpc_core::server::{NamedService, Server};
use rpc_proto::echo::{echo_server::EchoServer, EchoService};
use rpc_services::health::{
    health_client::HealthClient, HealthCheckRequest, HealthReporter, ServingStatus,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let echo = <EchoServer<EchoService> as NamedService>::NAME; // "rpc.examples.v1.Echo"
    let health = HealthReporter::new(); // the server as a whole (`""`) is SERVING
    health.set(echo, ServingStatus::Serving);

    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = listener.local_addr_uri();
    let server = Server::builder()
        .add_service(health.service())
        .add_service(EchoServer::new(EchoService));
    tokio::spawn(server.serve(listener));

    let mut client = HealthClient::connect(&uri).await?;
    for service in ["", echo] {
        let request = HealthCheckRequest {
            service: service.into(),
        };
        let status = client.check(request).await?.into_inner().status();
        println!("check {service:?}: {status:?}");
    }

    // Watch: the current status at once, then every change.
    let request = HealthCheckRequest {
        service: echo.into(),
    };
    let mut changes = client.watch(request).await?.into_inner();
    let first = changes.message().await?.ok_or("watch ended")?;
    println!("watch {echo}: {:?}", first.status());
    health.set(echo, ServingStatus::NotServing);
    let next = changes.message().await?.ok_or("watch ended")?;
    println!("watch {echo}: {:?}", next.status());
    Ok(())
}
