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
// Some probes' comments are Markdown malformed on purpose (a fence indented past a
// list item's text, `</pre>` as a lazy continuation of a list): the generator makes
// sure rustdoc runs no doctest from them, and clippy's style lints on docs still see
// the comment's own shape.
#[allow(clippy::doc_overindented_list_items, clippy::doc_lazy_continuation)]
pub mod probes {
    include!(concat!(env!("OUT_DIR"), "/unseen/unseen.rs"));
}

/// `proto/cross`: package `a.v1` using package `b`'s message, included as a nested
/// module tree by the include file `compile` writes (what `rpc_core::include_protos!()`
/// reads from `OUT_DIR`).
pub mod cross {
    include!(concat!(env!("OUT_DIR"), "/cross/_rpc_includes.rs"));

    /// Only has to compile: a message of `a.v1` holding one of `b`, and the
    /// generated client and server names.
    #[allow(dead_code)]
    fn uses_both_packages() -> a::v1::X {
        let _client: Option<a::v1::uses_client::UsesClient> = None;
        a::v1::X {
            y: Some(b::Y { name: "y".into() }),
        }
    }
}

#[cfg(corpus)]
include!(concat!(env!("OUT_DIR"), "/corpus.rs"));
