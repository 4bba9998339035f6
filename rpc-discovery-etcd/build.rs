//! Generates etcd's gRPC clients (`etcdserverpb`: KV, Watch, Lease and the others, with
//! the `mvccpb` and `authpb` messages they use) from etcd's own `.proto` files, vendored
//! unmodified in `proto/` (see `proto/README.md`). Clients only: nothing here serves
//! etcd's API.

fn main() -> std::io::Result<()> {
    rpc_codegen::configure()
        .build_server(false)
        .compile(&["etcd/api/etcdserverpb/rpc.proto"], &["proto"])
}
