//! Serves gRPC's interop test service, `grpc.testing.TestService`
//! (`docs/interop.md`).
//!
//! ```text
//! interop-server [--listen URI]... [--no-reflection]
//!                [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
//! ```
//!
//! `--listen` may repeat (default `tcp://127.0.0.1:7001`; `tcp://`, `unix://`,
//! `udp://`, or `rdma://` / `rdma+unix://` with the soft RDMA provider; `tcp://host:0`
//! picks a free port; `tls://` with `--tls-cert` and `--tls-key`, and `--tls-client-ca`
//! for mTLS). Prints `listening on URI` for each
//! listener once it accepts. Compression is on (negotiated with each client) when
//! rpc-core is built with it. Server reflection (`grpc.reflection.v1` and `v1alpha`)
//! describes the service unless `--no-reflection` is given. SIGTERM or Ctrl-C starts a
//! graceful shutdown.

use rpc_core::{compress::Compression, server::Server};
use rpc_examples::{flag_values, interop::server::InteropService, serve_until_signalled};
use rpc_services::ServerBuilderExt;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    rpc_examples::report(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "interop-server [--listen URI]... [--no-reflection] \
             [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]"
        );
        return Ok(());
    }
    let mut values = vec!["--listen"];
    values.extend(rpc_examples::SERVER_TLS_OPTIONS);
    rpc_examples::exit_on_bad_args(&args, &values, &["--no-reflection"]);
    let mut listens = flag_values(&args, "--listen");
    if listens.is_empty() {
        listens.push("tcp://127.0.0.1:7001".into());
    }
    let mut builder = Server::builder()
        .compression(Some(Compression::default()))?
        .add_service(InteropService::default().into_service());
    if !args.iter().any(|a| a == "--no-reflection") {
        builder = builder.add_reflection();
    }
    let server = builder.build();

    let tls = rpc_examples::server_tls(&args)?;
    serve_until_signalled(&server, listens, tls, || {}).await
}
