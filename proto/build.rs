//! Generates the example services from `proto/`.

fn main() -> std::io::Result<()> {
    rpc_codegen::configure().compile(
        &[
            "proto/rpc/examples/v1/echo.proto",
            "proto/rpc/examples/v1/kv.proto",
        ],
        &["proto"],
    )?;
    // The standard gRPC health service, unmodified (Apache-2.0, gRPC authors).
    rpc_codegen::configure().compile(&["proto/grpc/health/v1/health.proto"], &["proto"])
}
