//! Generates the example services from `proto/`.

fn main() -> std::io::Result<()> {
    rpc_codegen::configure().compile(
        &[
            "proto/rpc/examples/v1/echo.proto",
            "proto/rpc/examples/v1/kv.proto",
        ],
        &["proto"],
    )
}
