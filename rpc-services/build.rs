//! Generates the standard services' code from `proto/` (gRPC's files, unmodified).

fn main() -> std::io::Result<()> {
    rpc_codegen::configure().compile(
        &[
            "proto/grpc/health/v1/health.proto",
            "proto/grpc/reflection/v1/reflection.proto",
            "proto/grpc/reflection/v1alpha/reflection.proto",
        ],
        &["proto"],
    )
}
