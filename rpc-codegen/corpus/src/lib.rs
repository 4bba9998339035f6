//! The code rpc-codegen generates for a corpus of real-world `.proto` files (etcd,
//! googleapis, gRPC, protobuf's conformance messages); see `build.rs`. Building this
//! crate, and running its doctests, checks the generator; it has no API of its own.
//!
//! The modules follow the `.proto` packages: `grpc::health::v1`, `etcdserverpb`, ...;
//! [`edge::cases`] is `proto/edge_cases.proto` and [`probes`] is
//! `rpc-codegen/tests/protos/unseen`, which are always compiled.

// Generated messages carry the `.proto` comments, and many fields have none.
#![allow(missing_docs)]

/// `proto/edge_cases.proto`.
pub mod edge {
    /// Package `edge.cases`.
    pub mod cases {
        include!(concat!(env!("OUT_DIR"), "/edge/edge.cases.rs"));
    }
}

/// `rpc-codegen/tests/protos/unseen`: one module per `.proto` package, and the
/// package-less file's items at the top.
pub mod probes {
    include!(concat!(env!("OUT_DIR"), "/unseen/unseen.rs"));
}

#[cfg(corpus)]
include!(concat!(env!("OUT_DIR"), "/corpus.rs"));
