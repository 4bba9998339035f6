//! Serves the example `Echo` and `KeyValue` services, the standard
//! `grpc.health.v1.Health` service and server reflection (`grpc.reflection.v1` and
//! `v1alpha`: with `--listen grpc://127.0.0.1:50051`, `grpcurl -plaintext
//! 127.0.0.1:50051 list` works; `--no-reflection` leaves it out).
//!
//! ```text
//! echo-server [--listen URI]... [--max-concurrent-requests N] [--drain-timeout-ms N]
//!             [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--no-reflection]
//! ```
//!
//! `tls://` and `tls+unix://` listeners use `--tls-cert` and `--tls-key`;
//! `--tls-client-ca` requires client certificates of its CAs (mTLS). SIGHUP reloads
//! them.
//!
//! `--listen` may repeat (default `tcp://127.0.0.1:7000`; `tcp://`, `tls://`, `unix://`, `tls+unix://`,
//! `udp://`, or `rdma://` / `rdma+unix://` with the soft RDMA provider); `tcp://host:0`
//! picks a free port. Prints `listening on URI` for each listener once it accepts. SIGTERM or
//! Ctrl-C starts a graceful shutdown: GOAWAY, then in-flight calls finish.

use std::time::Duration;

use rpc_core::server::Server;
use rpc_examples::{flag, flag_values, serve_until_signalled};
use rpc_proto::{
    echo::{echo_server::EchoServer, EchoService},
    health::{HealthReporter, ServingStatus},
    kv::{key_value_server::KeyValueServer, MemoryStore},
};
use rpc_services::ServerBuilderExt;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rpc_examples::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "echo-server [--listen URI]... [--max-concurrent-requests N] [--drain-timeout-ms N] \
             [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--no-reflection]"
        );
        return Ok(());
    }
    let mut values = vec![
        "--listen",
        "--max-concurrent-requests",
        "--drain-timeout-ms",
    ];
    values.extend(rpc_examples::SERVER_TLS_OPTIONS);
    rpc_examples::exit_on_bad_args(&args, &values, &["--no-reflection"]);
    let mut listens = flag_values(&args, "--listen");
    if listens.is_empty() {
        listens.push("tcp://127.0.0.1:7000".into());
    }
    let mut builder = Server::builder();
    if let Some(n) = flag(&args, "--max-concurrent-requests") {
        builder = builder.max_concurrent_requests(n.parse()?);
    }
    if let Some(ms) = flag(&args, "--drain-timeout-ms") {
        builder = builder.drain_timeout(Duration::from_millis(ms.parse()?));
    }
    let health = HealthReporter::new();
    health.set("rpc.examples.v1.Echo", ServingStatus::Serving);
    health.set("rpc.examples.v1.KeyValue", ServingStatus::Serving);
    let mut builder = builder
        .add_service(EchoServer::new(EchoService))
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .add_service(health.service());
    if !args.iter().any(|a| a == "--no-reflection") {
        builder = builder.add_reflection();
    }
    let server = builder.build();

    let tls = rpc_examples::server_tls(&args)?;
    serve_until_signalled(&server, listens, tls, || {
        // NOT_SERVING first, so health-checking clients stop choosing this server;
        // their Watch streams end, so they do not hold the drain.
        health.shutdown();
        eprintln!("shutting down: GOAWAY sent, draining calls in flight");
    })
    .await?;
    eprintln!("stopped");
    Ok(())
}
