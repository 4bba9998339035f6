//! Round 9: multi-file projects and the builder's options, as build scripts use them.
//! The corpus crate compiles `tests/protos/unseen/round9` with each option
//! (`corpus/build.rs`) and calls the generated code (`corpus/tests/round9.rs`); these
//! tests check the generated text and the files written.

use std::path::{Path, PathBuf};

use prost_types::FileDescriptorSet;
use protox::prost::Message as _;

/// Writes `files` (name, contents) into a fresh directory for `test` and returns it.
fn proto_dir(test: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-projects")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, contents) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

fn round9() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/protos/unseen/round9")
}

/// A chain of `import public` three files long: `svc.proto` imports `top.proto` only.
const CHAIN: &[(&str, &str)] = &[
    (
        "svc.proto",
        "syntax = \"proto3\";\npackage svc;\nimport \"top.proto\";\n\
         service S {\n  rpc Get(leaf.Leaf) returns (deepest.Deepest);\n  \
         rpc Mid(mid.Mid) returns (top.Top);\n}\n",
    ),
    (
        "top.proto",
        "syntax = \"proto3\";\npackage top;\nimport public \"mid.proto\";\n\
         option java_package = \"top.java\";\nmessage Top { mid.Mid mid = 1; }\n",
    ),
    (
        "mid.proto",
        "syntax = \"proto3\";\npackage mid;\nimport public \"leaf.proto\";\n\
         message Mid { leaf.Leaf leaf = 1; }\n",
    ),
    (
        "leaf.proto",
        "syntax = \"proto3\";\npackage leaf;\nimport public \"deepest.proto\";\n\
         message Leaf { deepest.Deepest deepest = 1; }\n",
    ),
    (
        "deepest.proto",
        "syntax = \"proto3\";\npackage deepest;\nmessage Deepest { string name = 1; }\n",
    ),
];

/// Each file's encoding (key, length and message) in an encoded descriptor set.
fn raw_files(mut set: &[u8]) -> Vec<(String, Vec<u8>)> {
    use protox::prost::encoding::decode_varint;
    let mut files = Vec::new();
    while !set.is_empty() {
        assert_eq!(decode_varint(&mut set).unwrap(), (1 << 3) | 2);
        let len = decode_varint(&mut set).unwrap() as usize;
        let file = prost_types::FileDescriptorProto::decode(&set[..len]).unwrap();
        files.push((file.name().to_owned(), set[..len].to_vec()));
        set = &set[len..];
    }
    files
}

/// protoc follows `import public` through any number of files; the name resolution
/// protox uses (prost-reflect 0.16) followed one level, and `svc.proto` failed with
/// "name 'leaf.Leaf' is not defined".
#[test]
fn import_public_chains_resolve_as_protoc_does() {
    let dir = proto_dir("chain", CHAIN);
    let files = rpc_codegen::configure()
        .generate(&["svc.proto"], &[&dir])
        .unwrap_or_else(|err| panic!("{err}"));
    let code = &files.iter().find(|(name, _)| name == "svc.rs").unwrap().1;
    for expected in [
        "IntoRequest<super::super::leaf::Leaf>",
        "Response<super::super::deepest::Deepest>",
        "IntoRequest<super::super::mid::Mid>",
    ] {
        assert!(code.contains(expected), "missing {expected:?}: {code}");
    }
}

/// The imports added to follow a chain of `import public` are not in the descriptor
/// sets: each file is as protox encodes it when compiled alone, options included.
#[test]
fn import_public_chains_leave_the_descriptors_as_written() {
    let dir = proto_dir("chain_descriptors", CHAIN);
    let sets = rpc_codegen::configure()
        .descriptor_sets(&["svc.proto"], &[&dir])
        .unwrap_or_else(|err| panic!("{err}"));
    let (_, svc) = sets.iter().find(|(name, _)| name == "svc.fds.bin").unwrap();
    let embedded = raw_files(svc);
    let names: Vec<&str> = embedded.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "deepest.proto",
            "leaf.proto",
            "mid.proto",
            "top.proto",
            "svc.proto"
        ]
    );
    let decoded = FileDescriptorSet::decode(svc.as_slice()).unwrap();
    for file in &decoded.file {
        assert!(file.dependency.len() <= 1, "{file:?}");
    }
    // Byte for byte as protox encodes the files it resolves unaided.
    for (root, files) in [("top.proto", 4), ("mid.proto", 3), ("leaf.proto", 2)] {
        let mut compiler = protox::Compiler::new([&dir]).unwrap();
        compiler
            .include_imports(true)
            .include_source_info(true)
            .open_file(root)
            .unwrap();
        let alone = raw_files(&compiler.encode_file_descriptor_set());
        assert_eq!(alone.len(), files);
        let (_, bytes) = alone.iter().find(|(name, _)| name == root).unwrap();
        let (_, ours) = embedded.iter().find(|(name, _)| name == root).unwrap();
        assert_eq!(ours, bytes, "{root}");
    }
}

/// A file whose imports were extended keeps the positions of its errors.
#[test]
fn errors_in_a_file_that_reexports_a_chain_keep_their_position() {
    let mut files = CHAIN.to_vec();
    files[1] = (
        "top.proto",
        "syntax = \"proto3\";\npackage top;\nimport public \"mid.proto\";\n\
         message Top { mid.Mid mid = 1; nowhere.Thing thing = 2; }\n",
    );
    let dir = proto_dir("chain_error", &files);
    let err = rpc_codegen::configure()
        .generate(&["svc.proto"], &[&dir])
        .unwrap_err();
    assert_eq!(err.kind(), rpc_codegen::ErrorKind::Proto);
    assert!(
        err.to_string().contains("top.proto:4:"),
        "no position: {err}"
    );
}

/// The round 9 project: a service using the types of five other packages, found
/// through two include roots, a chain of `import public`, files of one name in two
/// directories, and a file of messages only.
#[test]
fn the_round9_project_generates_with_two_include_roots() {
    let root = round9();
    let files = rpc_codegen::configure()
        .generate(
            &["r9/svc/service.proto", "r9/svc/multi/extra.proto"],
            &[root.join("inc1"), root.join("inc2")],
        )
        .unwrap_or_else(|err| panic!("{err}"));
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "r9.a.rs",
            "r9.b.rs",
            "r9.both.rs",
            "r9.c.rs",
            "r9.chain.mid.rs",
            "r9.chain.rs",
            "r9.leaf.rs",
            "r9.svc.multi.rs",
            "r9.svc.rs"
        ]
    );
    let code = |name: &str| &files.iter().find(|(n, _)| n == name).unwrap().1;
    let svc = code("r9.svc.rs");
    for expected in [
        // Types of five other packages, nested ones, one message in and out.
        "IntoRequest<super::super::a::Common>",
        "Response<super::super::b::Common>",
        "IntoRequest<super::super::a::Same>",
        "Response<super::super::b::Same>",
        "IntoRequest<super::super::c::C>",
        "Response<super::super::leaf::Leaf>",
        "IntoRequest<super::Req>",
        "Response<super::Req>",
        "IntoRequest<super::super::a::outer::Inner>",
        "Response<super::super::c::outer::inner::Deepest>",
        "Message = super::super::leaf::Leaf",
        "Streaming<super::super::chain::mid::Mid>",
        "Response<super::super::both::FromQ>",
        "Response<::rpc_core::codegen::prost_types::Timestamp>",
        // Types of the file without a service.
        "pub struct SplitRequest",
        "IntoRequest<super::SplitRequest>",
    ] {
        assert!(svc.contains(expected), "missing {expected:?}");
    }
    // One package from two files named `dup.proto`.
    let both = code("r9.both.rs");
    assert!(both.contains("pub struct FromP") && both.contains("pub struct FromQ"));
    // The nested package beside the service's modules, using its parent's types.
    let multi = code("r9.svc.multi.rs");
    assert!(multi.contains("IntoRequest<super::super::Req>"), "{multi}");
    assert!(
        multi.contains("path: \"r9.svc.multi.Multi/Echo\""),
        "{multi}"
    );
}

/// A package named as a module the service of its parent package generates fails,
/// naming both, across files.
#[test]
fn a_package_named_as_a_service_module_of_its_parent_fails() {
    let dir = proto_dir(
        "service_module_package",
        &[
            (
                "svc.proto",
                "syntax = \"proto3\";\npackage p;\nimport \"sub.proto\";\n\
                 service Multi { rpc Get(p.multi_client.M) returns (p.multi_client.M); }\n",
            ),
            (
                "sub.proto",
                "syntax = \"proto3\";\npackage p.multi_client;\nmessage M {}\n",
            ),
        ],
    );
    let err = rpc_codegen::configure()
        .generate(&["svc.proto"], &[&dir])
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("sub.proto:2:") && message.contains("service Multi"),
        "{message}"
    );
}

/// `include_file` with directories: created, and naming the package files by absolute
/// path (prost-build names them relative to the output directory, which `include!`
/// looked up beside the include file; and the directory was not created: "No such file
/// or directory").
#[test]
fn an_include_file_in_a_subdirectory_finds_the_package_files() {
    let dir = proto_dir("include_subdir", CHAIN);
    let out = dir.join("out");
    rpc_codegen::configure()
        .out_dir(&out)
        .include_file("gen/protos/mod.rs")
        .emit_rerun_if_changed(false)
        .compile(&["svc.proto"], &[&dir])
        .unwrap_or_else(|err| panic!("{err}"));
    let include = std::fs::read_to_string(out.join("gen/protos/mod.rs")).unwrap();
    // Clippy's lints of Markdown list layout are allowed on the generated modules:
    // the docs are the .proto files' comments.
    assert!(
        include.contains("clippy::doc_lazy_continuation"),
        "{include}"
    );
    let absolute = std::path::absolute(&out).unwrap();
    let svc = absolute.join("svc.rs");
    assert!(
        include.contains(&format!("include!({:?});", svc.to_str().unwrap())),
        "{include}"
    );
    assert!(svc.is_file());
    // Every `include!` names a file that exists.
    for line in include.lines() {
        if let Some(path) = line
            .trim()
            .strip_prefix("include!(\"")
            .and_then(|rest| rest.strip_suffix("\");"))
        {
            assert!(Path::new(path).is_file(), "{path}");
        }
    }
    // Beside the code, it stays relative.
    rpc_codegen::configure()
        .out_dir(&out)
        .include_file("./beside.rs")
        .emit_rerun_if_changed(false)
        .compile(&["svc.proto"], &[&dir])
        .unwrap();
    let beside = std::fs::read_to_string(out.join("beside.rs")).unwrap();
    assert!(beside.contains("include!(\"svc.rs\");"), "{beside}");
}

/// An include file named as a package's code file is refused, naming both (from a
/// review: `include_file("api.rs")` with `package api;` wrote an include file that
/// included itself, and the generated code was gone).
#[test]
fn an_include_file_named_as_a_packages_code_is_refused() {
    let dir = proto_dir(
        "include_clash",
        &[(
            "api.proto",
            "syntax = \"proto3\";\npackage api;\nmessage M {}\n",
        )],
    );
    let out = dir.join("out");
    for name in ["api.rs", "./api.rs", "sub/../api.rs", "api.fds.bin"] {
        let err = rpc_codegen::configure()
            .out_dir(&out)
            .include_file(name)
            .emit_rerun_if_changed(false)
            .compile(&["api.proto"], &[&dir])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a file of package api's code"),
            "{name}: {err}"
        );
    }
}

/// No files: nothing generated but an include file with no module.
#[test]
fn an_empty_list_of_files_writes_an_empty_include_file() {
    let dir = proto_dir("empty_list", &[]);
    let out = dir.join("out");
    rpc_codegen::configure()
        .out_dir(&out)
        .emit_rerun_if_changed(false)
        .compile(&[] as &[&str], &[&dir])
        .unwrap();
    let include = std::fs::read_to_string(out.join(rpc_codegen::DEFAULT_INCLUDE_FILE)).unwrap();
    assert!(!include.contains("pub mod"), "{include}");
    assert!(rpc_codegen::configure()
        .generate(&[] as &[&str], &[&dir])
        .unwrap()
        .is_empty());
}

/// A service's types mapped with `extern_path` to a package the same build generates
/// elsewhere (`crate::`), one nested type alone, and a well-known type mapped to a
/// message of the project.
#[test]
fn extern_paths_to_code_of_the_same_build() {
    let root = round9();
    let files = rpc_codegen::configure()
        .extern_path(".r9.a", "crate::all::r9::a")
        .extern_path(
            ".r9.c.Outer.Inner.Deepest",
            "crate::all::r9::c::outer::inner::Deepest",
        )
        .extern_path(".google.protobuf.Timestamp", "crate::all::r9::a::Stamp")
        .generate(
            &["r9/svc/service.proto"],
            &[root.join("inc1"), root.join("inc2")],
        )
        .unwrap_or_else(|err| panic!("{err}"));
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    assert!(!names.contains(&"r9.a.rs"), "{names:?}");
    let svc = &files.iter().find(|(n, _)| n == "r9.svc.rs").unwrap().1;
    for expected in [
        "IntoRequest<crate::all::r9::a::Common>",
        "Response<crate::all::r9::c::outer::inner::Deepest>",
        "IntoRequest<crate::all::r9::a::Stamp>",
        // The other types of `r9.c` are generated here.
        "IntoRequest<super::super::c::C>",
        // Messages of the package name them as written too.
        "::core::option::Option<crate::all::r9::a::Common>",
    ] {
        assert!(svc.contains(expected), "missing {expected:?}");
    }
    assert!(!svc.contains("super::crate"), "{svc}");
}

/// A chain that passes through a file's own plain import: `b.proto` imports `d.proto`
/// and, publicly, `c.proto`, which publicly imports `d.proto`; `a.proto` imports
/// `b.proto` and names `d.proto`'s type, which protoc accepts. The plain import is made
/// public for the compiler (not added twice), and the descriptors keep it as written
/// (from a review: the chain was left unfollowed, 'name d.D is not defined').
#[test]
fn a_chain_through_a_plain_import_of_the_same_file_resolves() {
    let dir = proto_dir(
        "chain_through_plain",
        &[
            (
                "a.proto",
                "syntax = \"proto3\";\npackage a;\nimport \"b.proto\";\n\
                 service S {\n  rpc Get(d.D) returns (d.D);\n}\n",
            ),
            (
                "b.proto",
                "syntax = \"proto3\";\npackage b;\nimport \"d.proto\";\n\
                 import public \"c.proto\";\nmessage B { d.D d = 1; }\n",
            ),
            (
                "c.proto",
                "syntax = \"proto3\";\npackage c;\nimport public \"d.proto\";\n",
            ),
            (
                "d.proto",
                "syntax = \"proto3\";\npackage d;\nmessage D { string name = 1; }\n",
            ),
        ],
    );
    let files = rpc_codegen::configure()
        .generate(&["a.proto"], &[&dir])
        .unwrap_or_else(|err| panic!("{err}"));
    let code = &files.iter().find(|(name, _)| name == "a.rs").unwrap().1;
    assert!(code.contains("super::super::d::D"), "{code}");
    let sets = rpc_codegen::configure()
        .descriptor_sets(&["a.proto"], &[&dir])
        .unwrap_or_else(|err| panic!("{err}"));
    let (_, set) = sets.iter().find(|(name, _)| name == "a.fds.bin").unwrap();
    let decoded = FileDescriptorSet::decode(set.as_slice()).unwrap();
    let b = decoded.file.iter().find(|f| f.name() == "b.proto").unwrap();
    assert_eq!(b.dependency, ["d.proto", "c.proto"]);
    assert_eq!(b.public_dependency, [1], "as written");
}

/// Files for the lookup of a compound name whose first part is a package only a file
/// imported indirectly declares (envoy's `clusters/dynamic_forward_proxy/v3/cluster.proto`
/// in small): `common.dfp.Cfg` in package `p.clusters.dfp` is `.p.common.dfp.Cfg` for
/// protoc, which does not look in the package `p.clusters.common` that `dns.proto`
/// declares, seen only through `mid.proto`'s plain import.
const HIDDEN_SCOPE: &[(&str, &str)] = &[
    (
        "user.proto",
        "syntax = \"proto3\";\npackage p.clusters.dfp;\nimport \"common.proto\";\n\
         import \"mid.proto\";\nmessage Cluster { common.dfp.Cfg cfg = 1; }\n\
         service Clusters { rpc Get(common.dfp.Cfg) returns (Cluster); }\n",
    ),
    (
        "common.proto",
        "syntax = \"proto3\";\npackage p.common.dfp;\nmessage Cfg { string name = 1; }\n",
    ),
    (
        "mid.proto",
        "syntax = \"proto3\";\npackage p.clusters.mid;\nimport \"dns.proto\";\n\
         message Mid { p.clusters.common.dns.Dns d = 1; }\n",
    ),
    (
        "dns.proto",
        "syntax = \"proto3\";\npackage p.clusters.common.dns;\nmessage Dns {}\n",
    ),
    // Nothing imports this one; a root given before `user.proto`, its package
    // captured the name too.
    (
        "other.proto",
        "syntax = \"proto3\";\npackage p.clusters.common.other;\nmessage Other {}\n",
    ),
];

/// The type of `user.proto`'s field and method, in the descriptor set of `roots`.
fn resolved_names(dir: &Path, roots: &[&str]) -> Vec<String> {
    let sets = rpc_codegen::configure()
        .descriptor_sets(roots, &[dir])
        .unwrap_or_else(|err| panic!("{roots:?}: {err}"));
    let (_, set) = sets
        .iter()
        .find(|(name, _)| name == "p.clusters.dfp.fds.bin")
        .unwrap();
    let decoded = FileDescriptorSet::decode(set.as_slice()).unwrap();
    let user = decoded
        .file
        .iter()
        .find(|f| f.name() == "user.proto")
        .unwrap();
    vec![
        user.message_type[0].field[0].type_name().to_owned(),
        user.service[0].method[0].input_type().to_owned(),
    ]
}

/// protoc looks a compound name's first part up only in scopes the file can see
/// (protox, through prost-reflect, in every package it knows): from a review, envoy's
/// `cluster.proto` was refused ("'common.dfp.Cfg' resolves to
/// 'p.clusters.common.dfp.Cfg', which is not defined"), and a set of roots generated
/// or not depending on their order.
#[test]
fn compound_names_are_looked_up_in_the_scopes_the_file_sees() {
    let dir = proto_dir("hidden_scope", HIDDEN_SCOPE);
    let expected = [".p.common.dfp.Cfg", ".p.common.dfp.Cfg"];
    assert_eq!(resolved_names(&dir, &["user.proto"]), expected);
    assert_eq!(
        resolved_names(&dir, &["other.proto", "user.proto"]),
        expected
    );
    assert_eq!(
        resolved_names(&dir, &["user.proto", "other.proto"]),
        expected
    );
    let files = rpc_codegen::configure()
        .generate(&["other.proto", "user.proto"], &[&dir])
        .unwrap_or_else(|err| panic!("{err}"));
    let code = &files
        .iter()
        .find(|(name, _)| name == "p.clusters.dfp.rs")
        .unwrap()
        .1;
    assert!(
        code.contains("super::super::super::common::dfp::Cfg"),
        "{code}"
    );
}

/// The generator's error for [`HIDDEN_SCOPE`] with `user.proto`'s lines after its
/// import of `common.proto` replaced by `rest` (line 4 on).
fn refused_user(test: &str, rest: &str) -> String {
    let user =
        format!("syntax = \"proto3\";\npackage p.clusters.dfp;\nimport \"common.proto\";\n{rest}");
    let mut files = HIDDEN_SCOPE.to_vec();
    files[0].1 = &user;
    let dir = proto_dir(test, &files);
    rpc_codegen::configure()
        .generate(&["user.proto"], &[&dir])
        .unwrap_err()
        .to_string()
}

/// Where the file does see the capturing package (it imports `dns.proto` itself),
/// protoc refuses the name, and so does the generator, with protoc's explanation.
#[test]
fn a_compound_name_captured_by_a_visible_package_is_refused() {
    let err = refused_user(
        "visible_scope",
        "import \"dns.proto\";\nmessage Cluster { common.dfp.Cfg cfg = 1; }\n",
    );
    assert!(
        err.contains("user.proto:5:")
            && err.contains("'common.dfp.Cfg' resolves to 'p.clusters.common.dfp.Cfg'"),
        "{err}"
    );
}

/// A compound name that protoc does not find either is refused saying where protoc
/// looked (`p.common.nope.X`), not in a package the file cannot see.
#[test]
fn a_compound_name_protoc_does_not_find_is_refused_where_protoc_looked() {
    let err = refused_user(
        "nowhere",
        "import \"mid.proto\";\nmessage Cluster { common.nope.X x = 1; }\n",
    );
    assert!(
        err.contains("user.proto:5:")
            && err.contains("p.common.nope.X")
            && !err.contains("clusters.common"),
        "{err}"
    );
}
