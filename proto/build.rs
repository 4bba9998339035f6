//! Generates the example services from `proto/`.

fn main() -> std::io::Result<()> {
    rpc_codegen::configure().compile(
        &[
            "proto/rpc/examples/v1/echo.proto",
            "proto/rpc/examples/v1/kv.proto",
            "proto/rpc/examples/v1/blob.proto",
        ],
        &["proto"],
    )?;
    // gRPC's interop test service (and the messages and Empty it imports), unmodified
    // (Apache-2.0, gRPC authors; see proto/grpc/testing/README.md).
    rpc_codegen::configure().compile(&["proto/grpc/testing/test.proto"], &["proto"])
}
