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

/// `rpc-codegen/tests/protos/unseen/round9`: one multi-file project compiled several
/// times with the builder's options (see `build.rs`).
pub mod round9 {
    /// Every option a build script combines: attributes, a mapped well-known type.
    pub mod all {
        include!(concat!(env!("OUT_DIR"), "/round9/all/all.rs"));
    }
    /// Clients only, `bytes` fields as `Vec<u8>`.
    pub mod client {
        include!(concat!(env!("OUT_DIR"), "/round9/client/client.rs"));
    }
    /// Servers only, streaming methods left out.
    pub mod server {
        include!(concat!(env!("OUT_DIR"), "/round9/server/server.rs"));
    }
    /// Neither clients nor servers.
    pub mod none {
        include!(concat!(env!("OUT_DIR"), "/round9/none/none.rs"));
    }
    /// `r9.a` and `r9.c.Outer.Inner.Deepest` mapped to [`all`]'s with `extern_path`.
    pub mod extern_ {
        include!(concat!(env!("OUT_DIR"), "/round9/extern/extern.rs"));
    }
    /// No files compiled: an include file with no module.
    pub mod empty {
        include!(concat!(env!("OUT_DIR"), "/round9/empty/empty.rs"));
    }
    /// The include file in a subdirectory of the output directory.
    pub mod nested {
        include!(concat!(env!("OUT_DIR"), "/round9/nested/deeper/mod.rs"));
    }
    /// `rpc_codegen::compile_protos`, included with `rpc_core::include_protos!()`.
    pub mod defaults {
        rpc_core::include_protos!();
    }
}

#[cfg(corpus)]
include!(concat!(env!("OUT_DIR"), "/corpus.rs"));
