//! The descriptor sets `compile` writes beside the generated code (`pkg.fds.bin`) and
//! the `FILE_DESCRIPTOR_SET` constants that include them, for server reflection.

use std::path::{Path, PathBuf};

use prost_types::{FileDescriptorProto, FileDescriptorSet};
use protox::prost::Message as _;

/// Writes `files` (name, contents) into a fresh directory for `test` and returns it.
fn proto_dir(test: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-descriptors")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    for (name, contents) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

const A: &str = r#"
syntax = "proto3";
package demo;
import "b.proto";
import "google/protobuf/empty.proto";

// Greets people.
service Greeter {
  // Says hello.
  rpc Hello(lib.b.B) returns (google.protobuf.Empty);
}
"#;

const B: &str = r#"
syntax = "proto3";
package lib.b;
import "c.proto";
message B { C c = 1; }
"#;

const C: &str = r#"
syntax = "proto3";
message C {}
"#;

fn decode(path: &Path) -> Vec<FileDescriptorProto> {
    let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    FileDescriptorSet::decode(bytes.as_slice()).unwrap().file
}

fn names(files: &[FileDescriptorProto]) -> Vec<&str> {
    files.iter().map(|file| file.name()).collect()
}

fn compile(dir: &Path, out: &Path, protos: &[&str], include_file: &str) {
    rpc_codegen::configure()
        .out_dir(out)
        .include_file(include_file)
        .emit_rerun_if_changed(false)
        .compile(
            &protos.iter().map(|p| dir.join(p)).collect::<Vec<_>>(),
            &[dir],
        )
        .unwrap();
}

#[test]
fn compile_embeds_each_package_descriptor_set() {
    let dir = proto_dir("embed", &[("a.proto", A), ("b.proto", B), ("c.proto", C)]);
    let out = dir.join("out");
    compile(&dir, &out, &["a.proto"], "all.rs");

    // Each package's files and everything they import, imports first.
    let demo = decode(&out.join("demo.fds.bin"));
    assert_eq!(
        names(&demo),
        [
            "c.proto",
            "b.proto",
            "google/protobuf/empty.proto",
            "a.proto"
        ]
    );
    assert_eq!(
        names(&decode(&out.join("lib.b.fds.bin"))),
        ["c.proto", "b.proto"]
    );
    assert_eq!(names(&decode(&out.join("_.fds.bin"))), ["c.proto"]);
    // No code for the well-known types, so no descriptor file either.
    assert!(!out.join("google.protobuf.rs").exists());
    assert!(!out.join("google.protobuf.fds.bin").exists());

    // Comments are kept.
    let a = demo.iter().find(|file| file.name() == "a.proto").unwrap();
    let comments: Vec<&str> = a
        .source_code_info
        .as_ref()
        .unwrap()
        .location
        .iter()
        .filter_map(|location| location.leading_comments.as_deref())
        .collect();
    assert!(comments.contains(&" Greets people.\n"), "{comments:?}");
    assert!(comments.contains(&" Says hello.\n"), "{comments:?}");

    // The constants include them by absolute path; servers name their package's.
    let code = std::fs::read_to_string(out.join("demo.rs")).unwrap();
    let absolute = std::path::absolute(out.join("demo.fds.bin")).unwrap();
    assert!(
        code.contains(&format!("{:?}", absolute.to_str().unwrap())),
        "{code}"
    );
    assert!(
        code.contains("pub const FILE_DESCRIPTOR_SET: &[u8]"),
        "{code}"
    );
    assert_eq!(code.matches("pub const FILE_DESCRIPTOR_SET").count(), 1);
    assert!(
        code.contains("const FILE_DESCRIPTOR_SET: &'static [u8] = super::FILE_DESCRIPTOR_SET;"),
        "{code}"
    );
    // Packages of messages only get theirs too.
    for file in ["lib.b.rs", "_.rs"] {
        let code = std::fs::read_to_string(out.join(file)).unwrap();
        assert_eq!(
            code.matches("pub const FILE_DESCRIPTOR_SET").count(),
            1,
            "{file}: {code}"
        );
    }
}

#[test]
fn compiles_into_one_directory_do_not_clash_and_are_deterministic() {
    let x = "syntax = \"proto3\";\npackage x;\nservice X { rpc A(M) returns (M); }\nmessage M {}\n";
    let y = "syntax = \"proto3\";\npackage y;\nservice Y { rpc A(M) returns (M); }\nmessage M {}\n";
    let dir = proto_dir("shared", &[("x.proto", x), ("y.proto", y)]);
    let out = dir.join("out");
    compile(&dir, &out, &["x.proto"], "x_includes.rs");
    compile(&dir, &out, &["y.proto"], "y_includes.rs");
    assert_eq!(names(&decode(&out.join("x.fds.bin"))), ["x.proto"]);
    assert_eq!(names(&decode(&out.join("y.fds.bin"))), ["y.proto"]);
    let x_code = std::fs::read_to_string(out.join("x.rs")).unwrap();
    assert!(x_code.contains("x.fds.bin"), "{x_code}");
    assert!(!x_code.contains("y.fds.bin"), "{x_code}");

    // The same input gives the same bytes.
    let before = (
        std::fs::read(out.join("x.fds.bin")).unwrap(),
        std::fs::read(out.join("x.rs")).unwrap(),
    );
    compile(&dir, &out, &["x.proto"], "x_includes.rs");
    let after = (
        std::fs::read(out.join("x.fds.bin")).unwrap(),
        std::fs::read(out.join("x.rs")).unwrap(),
    );
    assert!(before == after, "a second compile changed its output");
}

#[test]
fn generate_names_the_files_descriptor_sets_gives() {
    let dir = proto_dir(
        "generate",
        &[("a.proto", A), ("b.proto", B), ("c.proto", C)],
    );
    let files = rpc_codegen::configure()
        .generate(&[dir.join("a.proto")], &[&dir])
        .unwrap();
    let (_, demo) = files.iter().find(|(name, _)| name == "demo.rs").unwrap();
    assert!(demo.contains("include_bytes!(\"demo.fds.bin\")"), "{demo}");

    let sets = rpc_codegen::configure()
        .descriptor_sets(&[dir.join("a.proto")], &[&dir])
        .unwrap();
    let set_names: Vec<&str> = sets.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        set_names,
        [
            "_.fds.bin",
            "demo.fds.bin",
            "google.protobuf.fds.bin",
            "lib.b.fds.bin"
        ]
    );
    // The same bytes `compile` writes.
    let out = dir.join("out");
    compile(&dir, &out, &["a.proto"], "all.rs");
    for (name, bytes) in &sets {
        if name != "google.protobuf.fds.bin" {
            assert_eq!(&std::fs::read(out.join(name)).unwrap(), bytes, "{name}");
        }
    }
}

/// Custom options (extensions of `google.protobuf.*Options`, `google.api.http` among
/// them) stay in the sets: reflection clients read them. prost-types drops them, so the
/// sets were once stripped of every one.
#[test]
fn custom_options_are_kept() {
    let dir = proto_dir(
        "custom-options",
        &[(
            "opts.proto",
            r#"
syntax = "proto3";
package opts;
import "google/protobuf/descriptor.proto";
extend google.protobuf.MethodOptions { string owner = 50001; }
extend google.protobuf.FileOptions { string file_tag = 50002; }
option (file_tag) = "tag-of-the-file";
message M {}
service S {
  rpc Get(M) returns (M) { option (owner) = "owner-of-get"; }
}
"#,
        )],
    );
    let sets = rpc_codegen::configure()
        .descriptor_sets(&["opts.proto"], &[&dir])
        .unwrap();
    let (_, bytes) = sets
        .iter()
        .find(|(name, _)| name == "opts.fds.bin")
        .expect("the package's set");
    for value in [&b"owner-of-get"[..], b"tag-of-the-file"] {
        assert!(
            bytes.windows(value.len()).any(|w| w == value),
            "{:?} missing",
            String::from_utf8_lossy(value)
        );
    }
    // Still a set of the package's file and its imports.
    let set = FileDescriptorSet::decode(&bytes[..]).unwrap();
    let names: Vec<&str> = set.file.iter().map(FileDescriptorProto::name).collect();
    assert_eq!(names, ["google/protobuf/descriptor.proto", "opts.proto"]);
}
