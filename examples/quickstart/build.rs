fn main() -> std::io::Result<()> {
    rpc_codegen::configure().compile(&["proto/kv.proto"], &["proto"])
}
