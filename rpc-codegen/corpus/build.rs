//! Runs rpc-codegen over every service-bearing file of the shared `.proto` corpus
//! (the "main set" of `shared/testdata/protos/README.md`) plus the conformance and
//! `google.rpc` files, so that building this crate proves the generated code compiles.
//!
//! The corpus is `$RPC_PROTO_CORPUS` or `shared/testdata/protos` beside the repository.
//! Without it only `proto/edge_cases.proto` (names and types generated code must cope
//! with) is compiled, with a warning, except under CI, where that is an error.

use std::{env, path::PathBuf};

/// Include roots of the main set, in the README's order.
const INCLUDES: &[&str] = &[
    "protobuf",
    "googleapis",
    "grpc-proto",
    "etcd-main",
    "gogoproto",
    "grpc-gateway",
];

/// The files compiled, as import paths.
const PROTOS: &[&str] = &[
    // Service-bearing files of the main set.
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
    "google/bytestream/bytestream.proto",
    "google/iam/v1/iam_policy.proto",
    "google/longrunning/operations.proto",
    "google/pubsub/v1/pubsub.proto",
    "google/pubsub/v1/schema.proto",
    "grpc/health/v1/health.proto",
    "grpc/reflection/v1/reflection.proto",
    "grpc/testing/test.proto",
    // Messages only: proto2 and proto3 feature coverage, status details.
    "google/protobuf/test_messages_proto2.proto",
    "google/protobuf/test_messages_proto3.proto",
    "conformance/conformance.proto",
    "google/rpc/error_details.proto",
    "google/rpc/code.proto",
    "google/rpc/status.proto",
];

/// The files of `../tests/protos/unseen` compiled (the others are imported by these).
const UNSEEN: &[&str] = &[
    "keywords.proto",
    "layout.proto",
    "same_name.proto",
    "streaming.proto",
    "proto2.proto",
    "proto3_optional.proto",
    "comments.proto",
    "crlf.proto",
    "generic_name.proto",
    "doc_links.proto",
    "package_segment.proto",
    "prelude_names.proto",
    "camel_package.proto",
    "deprecated_enums.proto",
    // Round 2: see each file's first comment.
    "round2_stream_types.proto",
    "round2_case_package_a.proto",
    "round2_map_module.proto",
    "round2_names.proto",
    "round2_well_known.proto",
    "round2_import_public_svc.proto",
    "round2_no_package_svc.proto",
    "round2_options.proto",
    "round2_proto2_groups.proto",
    "round2_unicode_comments.proto",
    "round2_doc_blocks.proto",
    "round3_connect.proto",
    "round4_extern.proto",
    "round5_doc_fences.proto",
    "round5_lone_cr.proto",
    "round6_doc_markdown.proto",
    "round7_shapes.proto",
    // Round 8: see each file's first comment.
    "round8_bang_docs.proto",
    "round8_defaults.proto",
    "round8_deprecated_proto2.proto",
    "round8_empty_pkg.proto",
    "round8_keyword_user.proto",
    "round8_member_names.proto",
    "round8_members3.proto",
    "round8_names.proto",
    "round8_nopkg_uses_deep.proto",
    "round8_oneof_group.proto",
    "round8_only_enum.proto",
    "round8_options.proto",
    "round8_streams_wkt.proto",
    // An empty file (zero bytes: proto2, no package, nothing generated).
    "round8_zero_bytes.proto",
    "round8_digit_names.proto",
    "round8_twice.proto",
    "round8_control_chars.proto",
    "round8_message_set.proto",
    "round8_html_docs.proto",
    "round8_recursive.proto",
    "round8_deprecated_first.proto",
    "round8_enum_defaults.proto",
    "round8_google_pkg.proto",
    // Round 10: see each file's first comment.
    "round10_annotations.proto",
    "round10_defaults.proto",
    "round10_maps.proto",
    "round10_names.proto",
    "round10_proto2.proto",
    // Round 12: reference links and links wrapped over two lines.
    "round12_link_refs.proto",
    "round12_editions.proto",
    "round12_editions_2024.proto",
    // Round 13: a field named `len` (clippy's `len_without_is_empty`).
    "round13_len.proto",
];

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("run by cargo"));
    if let Err(err) = rpc_codegen::configure()
        .out_dir(out_dir.join("edge"))
        .compile(&["proto/edge_cases.proto"], &["proto"])
    {
        panic!("rpc-codegen failed on proto/edge_cases.proto: {err}");
    }
    // `.proto` files written to probe the generator (`rpc-codegen/tests/protos/unseen`):
    // keyword and clashing names, odd packages, well-known and nested types, proto2,
    // every streaming kind, comments that break doc comments, editions (round 12).
    // `subpackage_clash.proto` is left out: its package would clash with a module
    // (`rpc-codegen/tests/unseen.rs` checks the error); `editions.proto` is generated
    // by that test, and compiled in `round12_editions.proto`'s richer form.
    if let Err(err) = rpc_codegen::configure()
        .out_dir(out_dir.join("unseen"))
        .include_file("unseen.rs")
        // round4_extern.proto's types: a Rust path that starts with a crate's name.
        .extern_path(".round4.ext", "rpc_core::codegen::prost_types")
        .compile(UNSEEN, &["../tests/protos/unseen"])
    {
        panic!("rpc-codegen failed on tests/protos/unseen: {err}");
    }

    // One package importing another's message, included with the default include file.
    if let Err(err) = rpc_codegen::configure()
        .out_dir(out_dir.join("cross"))
        .compile(&["a.proto"], &["proto/cross"])
    {
        panic!("rpc-codegen failed on proto/cross: {err}");
    }

    round9(&out_dir);

    println!("cargo::rerun-if-env-changed=RPC_PROTO_CORPUS");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rustc-check-cfg=cfg(corpus)");

    let corpus = match env::var_os("RPC_PROTO_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo"))
            .join("../../../shared/testdata/protos"),
    };
    if !corpus.join("README.md").is_file() {
        let message = format!(
            "the .proto corpus is not at {} (set RPC_PROTO_CORPUS to its directory)",
            corpus.display()
        );
        if env::var_os("CI").is_some() {
            panic!("{message}");
        }
        println!("cargo::warning={message}; rpc-codegen-corpus builds without it");
        return;
    }

    let includes: Vec<PathBuf> = INCLUDES.iter().map(|root| corpus.join(root)).collect();
    if let Err(err) = rpc_codegen::configure()
        .include_file("corpus.rs")
        .compile(PROTOS, &includes)
    {
        panic!("rpc-codegen failed on the corpus: {err}");
    }
    println!("cargo::rustc-cfg=corpus");
}

/// The include roots of the round 9 project (`../tests/protos/unseen/round9`).
const ROUND9_INCLUDES: &[&str] = &[
    "../tests/protos/unseen/round9/inc1",
    "../tests/protos/unseen/round9/inc2",
];

/// The round 9 project's root files, as import paths.
const ROUND9_PROTOS: &[&str] = &["r9/svc/service.proto", "r9/svc/multi/extra.proto"];

/// Round 9: a multi-file project with two include roots, compiled several times in one
/// build with the builder's options, the way build scripts combine them. Each call
/// writes to its own directory under `$OUT_DIR/round9` and `src/lib.rs` includes each.
fn round9(out_dir: &std::path::Path) {
    let out = out_dir.join("round9");
    let run = |what: &str, result: std::io::Result<()>| {
        if let Err(err) = result {
            panic!("rpc-codegen failed on round 9 ({what}): {err}");
        }
    };
    // Everything, with attributes on a message, a oneof and a field (prost-build derives
    // `Eq` and `Hash` itself where it can, so those are not added), and a well-known
    // type mapped to a message of the same build.
    run(
        "all",
        rpc_codegen::configure()
            .out_dir(out.join("all"))
            .include_file("all.rs")
            .type_attribute(".r9.a.Common", "#[derive(PartialOrd, Ord)]")
            .type_attribute(".r9.a.Outer.Inner.choice", "#[derive(PartialOrd, Ord)]")
            .type_attribute(".r9.svc", "#[allow(clippy::derive_partial_eq_without_eq)]")
            .field_attribute(".r9.b.Common.b", "#[doc(alias = \"bee\")]")
            .extern_path(
                ".google.protobuf.Timestamp",
                "crate::round9::all::r9::a::Stamp",
            )
            .compile(ROUND9_PROTOS, ROUND9_INCLUDES),
    );
    // The same files again: clients only, `bytes` as `Vec<u8>`, an attribute on every
    // type, no `rerun-if-changed` lines.
    run(
        "client",
        rpc_codegen::configure()
            .build_server(false)
            .bytes_as_vec(true)
            .type_attribute(".", "#[allow(clippy::pedantic)]")
            .emit_rerun_if_changed(false)
            .out_dir(out.join("client"))
            .include_file("client.rs")
            .compile(ROUND9_PROTOS, ROUND9_INCLUDES),
    );
    // Servers only, streaming methods left out.
    run(
        "server",
        rpc_codegen::configure()
            .build_client(false)
            .skip_streaming_methods(true)
            .out_dir(out.join("server"))
            .include_file("server.rs")
            .compile(ROUND9_PROTOS, ROUND9_INCLUDES),
    );
    // Neither: messages and method descriptors.
    run(
        "none",
        rpc_codegen::configure()
            .build_client(false)
            .build_server(false)
            .out_dir(out.join("none"))
            .include_file("none.rs")
            .compile(ROUND9_PROTOS, ROUND9_INCLUDES),
    );
    // `r9.a` and one nested type of `r9.c` are those the "all" call generated.
    run(
        "extern",
        rpc_codegen::configure()
            .extern_path(".r9.a", "crate::round9::all::r9::a")
            .extern_path(
                ".r9.c.Outer.Inner.Deepest",
                "crate::round9::all::r9::c::outer::inner::Deepest",
            )
            .out_dir(out.join("extern"))
            .include_file("extern.rs")
            .compile(&["r9/svc/service.proto"], ROUND9_INCLUDES),
    );
    // No files at all.
    run(
        "empty",
        rpc_codegen::configure()
            .out_dir(out.join("empty"))
            .include_file("empty.rs")
            .compile(&[] as &[&str], ROUND9_INCLUDES),
    );
    // The include file in a subdirectory of the output directory.
    run(
        "nested include file",
        rpc_codegen::configure()
            .out_dir(out.join("nested"))
            .include_file("deeper/mod.rs")
            .compile(&["r9/svc/multi/extra.proto"], ROUND9_INCLUDES),
    );
    // `compile_protos`: `$OUT_DIR` and the default include file
    // (`rpc_core::include_protos!()`), a file given by its path with its directory as
    // the include root.
    run(
        "compile_protos",
        rpc_codegen::compile_protos("../tests/protos/unseen/round9/inc2/r9/c/types.proto"),
    );
}
