//! `.proto` files the generator was not written against (`tests/protos/unseen`): every
//! one generates, and the code has the names and docs expected. That the code
//! compiles and works over a link is checked by the corpus crate, which builds these
//! files (`corpus/build.rs`, `corpus/tests/unseen.rs`). Bad inputs fail with a
//! positioned error, never a panic.

use std::path::{Path, PathBuf};

use rpc_codegen::ErrorKind;

fn unseen_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/protos/unseen")
}

/// Generates `proto` of `tests/protos/unseen` and returns every file, concatenated.
fn generate_unseen(proto: &str) -> String {
    let dir = unseen_dir();
    let files = rpc_codegen::configure()
        .generate(&[proto], &[&dir])
        .unwrap_or_else(|err| panic!("{proto}: {err}"));
    files.into_iter().map(|(_, code)| code).collect()
}

/// Generates one file written into a fresh directory, for error cases.
fn generate_text(name: &str, text: &str) -> Result<Vec<(String, String)>, rpc_codegen::Error> {
    generate_texts(&[(name, text)])
}

/// Generates the first of `files` (name, text), all written into a fresh directory.
fn generate_texts(files: &[(&str, &str)]) -> Result<Vec<(String, String)>, rpc_codegen::Error> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-unseen")
        .join(files[0].0);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    rpc_codegen::configure().generate(&[files[0].0], &[&dir])
}

#[test]
fn every_unseen_file_generates() {
    for entry in std::fs::read_dir(unseen_dir()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        // Directories hold multi-file projects (`round9/`: see `round9_project`).
        if entry.file_type().unwrap().is_dir() {
            continue;
        }
        if name != "subpackage_clash.proto" {
            generate_unseen(&name);
        }
    }
}

#[test]
fn keyword_and_clashing_names() {
    let code = generate_unseen("keywords.proto");
    for expected in [
        // Keywords become raw identifiers, or get a `_` where they cannot be raw.
        "pub async fn r#type(",
        "pub async fn r#match(",
        "pub async fn r#async(",
        "pub async fn r#gen(",
        "pub async fn self_(",
        "pub async fn super_(",
        "pub async fn crate_(",
        "fn r#type(",
        "fn self_(",
        // The client's inherent methods keep their names, the rpcs get a `_`.
        "pub async fn new_(",
        "pub async fn clone_(",
        "pub async fn get_ref_(",
        "pub async fn into_inner_(",
        "pub async fn with_retries_(",
        "pub async fn call(",
        // The trait keeps the plain names.
        "fn new(\n",
        "fn clone(\n",
        // Descriptors.
        "pub const ALL_METHOD:",
        "pub const SELF:",
        // Services named `Service`, `Client`, `Server`, `type`, `Self`, `async`.
        "pub trait Service:",
        "impl<T: self::Service> ::rpc_core::codegen::Service<::rpc_core::codegen::ServerCall>",
        "pub struct ClientClient<",
        "pub struct ServerServer<",
        "pub mod type_client",
        "pub trait Type:",
        "pub struct SelfClient<",
        "pub trait Self_:",
        "pub mod async_server",
        "path: \"unseen.keywords.type/Get\"",
    ] {
        assert!(code.contains(expected), "missing {expected:?}");
    }
}

#[test]
fn wrapper_types_are_not_paths_of_the_package() {
    let code = generate_unseen("layout.proto");
    assert!(!code.contains("super::bool"), "{code}");
    for expected in [
        "IntoRequest<bool>",
        "Response<f32>",
        "Streaming<u64>",
        "IntoRequest<()>",
        "Response<::rpc_core::codegen::prost_types::Struct>",
        "IntoRequest<super::outer::Inner>",
        "Response<super::outer::inner::Innermost>",
        "super::super::super::r#type::r#match::thing::Self_",
    ] {
        assert!(code.contains(expected), "missing {expected:?}");
    }
}

#[test]
fn code_blocks_of_comments_are_text() {
    for proto in [
        "comments.proto",
        "crlf.proto",
        "round5_doc_fences.proto",
        "round5_lone_cr.proto",
    ] {
        let code = generate_unseen(proto);
        assert!(!code.contains("compile_fail"), "{code}");
        assert!(!code.contains('\r'), "{code}");
        assert!(!code.contains('\t'), "{code}");
        for line in code.lines() {
            let doc = line.trim_start();
            if let Some(text) = doc.strip_prefix("/// ```") {
                // Openers say `text`; closers and code lines are kept.
                assert!(
                    text.is_empty() || text == "text" || text.starts_with('`') || text == "rust",
                    "{line}"
                );
            }
        }
    }
    let code = generate_unseen("comments.proto");
    assert!(
        code.contains("/// ```text\n    /// assert!(true);"),
        "{code}"
    );
    assert!(code.contains("héllo wörld — 日本語"), "{code}");
}

#[test]
fn compile_writes_text_code_blocks_too() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rpc-codegen-unseen/compile");
    let _ = std::fs::remove_dir_all(&out);
    rpc_codegen::configure()
        .out_dir(&out)
        .emit_rerun_if_changed(false)
        .compile(&["comments.proto"], &[unseen_dir()])
        .unwrap();
    let code = std::fs::read_to_string(out.join("unseen.comments.rs")).unwrap();
    assert!(!code.contains("compile_fail"), "{code}");
    assert!(code.contains("/// ```text\n"), "{code}");
}

/// An `extern_path` prost-build would refuse is a generation error before anything is
/// written: `compile` reported it as a failed write to `OUT_DIR` (found by a review).
#[test]
fn bad_extern_paths_are_refused_as_generation_errors() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rpc-codegen-unseen/extern");
    for (proto_path, rust_path, expected) in [
        ("round4.ext", "::ext", "must be fully qualified"),
        (".round4..ext", "::ext", "empty segment"),
        (".round4.ext", " ", "the Rust path is empty"),
        (
            ".google.protobuf",
            "::my_types",
            "prost-build maps this path itself",
        ),
        (
            ".google.protobuf.Empty",
            "()",
            "prost-build maps this path itself",
        ),
        // A package (types below it): prost-build would write `self_::ext::Timestamp`
        // and `super_::...` (found in review: the generated code failed to compile).
        (".round4.ext", "self::ext", "snake case"),
        (".round4.ext", "super::ext", "snake case"),
    ] {
        let _ = std::fs::remove_dir_all(&out);
        let err = rpc_codegen::configure()
            .out_dir(&out)
            .emit_rerun_if_changed(false)
            .extern_path(proto_path, rust_path)
            .compile(&["round4_extern.proto"], &[unseen_dir()])
            .unwrap_err();
        let inner = err
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rpc_codegen::Error>())
            .unwrap_or_else(|| panic!("{proto_path}: {err}"));
        assert_eq!(inner.kind(), ErrorKind::Generate, "{proto_path}: {err}");
        let message = err.to_string();
        assert!(message.contains(expected), "{proto_path}: {message}");
        assert!(message.contains(proto_path), "{proto_path}: {message}");
        assert!(!out.exists(), "{proto_path}: wrote to the output directory");
    }
    let err = rpc_codegen::configure()
        .extern_path(".round4.ext", "::a")
        .extern_path(".round4.ext", "::b")
        .generate(&["round4_extern.proto"], &[unseen_dir()])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate);
    assert!(err.to_string().contains("given twice"), "{err}");
}

#[test]
fn editions_are_read_as_proto3() {
    let code = generate_unseen("editions.proto");
    // Explicit presence, edition 2023's default: an `Option`.
    assert!(
        code.contains(
            "pub name: ::core::option::Option<::rpc_core::codegen::prost::alloc::string::String>"
        ),
        "{code}"
    );
    assert!(code.contains("pub struct EditionsClient"), "{code}");
    // What proto3 cannot say fails, naming the file and the feature.
    let err = generate_text(
        "delimited.proto",
        "edition = \"2023\";\nmessage A {\n  A a = 1 [features.message_encoding = DELIMITED];\n}\n",
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proto);
    let message = err.to_string();
    // Positioned, as protox's own errors are (from a review: no line and column).
    assert!(message.contains("delimited.proto:3:3:"), "{message}");
    assert!(message.contains("DELIMITED"), "{message}");
}

/// The compiler's hint is part of the message (it was dropped: protox's errors carry
/// it as a miette `help`, which neither their `Debug` nor `Display` prints), and the
/// error's `Debug` is the message itself (what `unwrap` and `main` print).
#[test]
fn a_type_from_a_file_not_imported_says_where_it_is() {
    let err = rpc_codegen::configure()
        .generate(&["round11/hint_a.proto"], &[unseen_dir()])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proto);
    let message = err.to_string();
    assert!(
        message.starts_with("round11/hint_a.proto:7:11: "),
        "{message}"
    );
    assert!(message.contains("hint_b.proto"), "{message}");
    assert!(message.contains("not imported"), "{message}");
    assert_eq!(format!("{err:?}"), message);
}

#[test]
fn bad_inputs_give_positioned_errors() {
    for (name, text, kind, expected) in [
        (
            "missing_import.proto",
            "syntax = \"proto3\";\npackage u;\n\nimport \"nothere.proto\";\n",
            ErrorKind::Proto,
            "missing_import.proto:4:1: import 'nothere.proto' not found",
        ),
        (
            "syntax_error.proto",
            "syntax = \"proto3\";\npackage u;\nservice S {\n  rpc Get(M) returns M;\n}\n",
            ErrorKind::Proto,
            "syntax_error.proto:4:",
        ),
        (
            "unknown_type.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {}\nservice S {\n  rpc Get(M) returns (Nope);\n}\n",
            ErrorKind::Proto,
            "unknown_type.proto:5:23: name 'Nope' is not defined",
        ),
        (
            "enum_argument.proto",
            "syntax = \"proto3\";\npackage u;\nenum E { A = 0; }\nservice S {\n  rpc Get(E) returns (E);\n}\n",
            ErrorKind::Proto,
            "enum_argument.proto:5:11: 'u.E' is not a message type",
        ),
        (
            "unknown_syntax.proto",
            "syntax = \"proto4\";\npackage u;\n",
            ErrorKind::Proto,
            "unknown_syntax.proto:1:10: unknown syntax 'proto4'",
        ),
        (
            "case_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {}\nservice S {\n  rpc Self(M) returns (M);\n  rpc self(M) returns (M);\n}\n",
            ErrorKind::Generate,
            "case_clash.proto:6:3: methods u.S/Self and u.S/self would have the same Rust name",
        ),
        (
            "underscore_method.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {}\nservice S {\n  rpc _(M) returns (M);\n}\n",
            ErrorKind::Generate,
            "underscore_method.proto:5:3: method u.S/_ gives no Rust identifier",
        ),
        (
            "underscore_service.proto",
            "syntax = \"proto3\";\npackage u;\nservice _1 {}\n",
            ErrorKind::Generate,
            "underscore_service.proto:3:1: service u._1 gives no Rust identifier",
        ),
        (
            "service_clash.proto",
            "syntax = \"proto3\";\npackage u;\nservice FooBar {}\nservice foo_bar {}\n",
            ErrorKind::Generate,
            "service_clash.proto:4:1: service foo_bar and service FooBar \
             (service_clash.proto:3:1) of package `u` would both generate the Rust module \
             `foo_bar_methods`",
        ),
        (
            "module_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage FooClient { message Inner {} }\nservice Foo {}\n",
            ErrorKind::Generate,
            "module_clash.proto:4:1: service Foo and message FooClient",
        ),
        (
            "enum_overlap.proto",
            "syntax = \"proto3\";\npackage u;\nenum Color {\n  COLOR_UNSPECIFIED = 0;\n  COLOR_RED = 1;\n  RED = 2;\n}\n",
            ErrorKind::Generate,
            "enum_overlap.proto:6:3: values COLOR_RED and RED of enum Color would both be the \
             Rust variant `Red`",
        ),
        (
            "type_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage FooBar {}\nmessage Foo_Bar {}\n",
            ErrorKind::Generate,
            "type_clash.proto:4:1: message Foo_Bar and message FooBar (type_clash.proto:3:1) \
             would both be the Rust type `FooBar`",
        ),
        (
            "self_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage Self {}\nmessage Self_ {}\n",
            ErrorKind::Generate,
            "self_clash.proto:4:1: message Self_ and message Self",
        ),
        (
            "json_clash.proto",
            "syntax = \"proto2\";\npackage u;\nmessage M {\n  optional int32 x1 = 1;\n  optional int32 x_1 = 2;\n}\n",
            ErrorKind::Proto,
            "json_clash.proto:5:18: this field's JSON name is another field's too (two fields \
             of the message have the same JSON name: default names, as `x1` and `x_1`",
        ),
        (
            "import_dotdot.proto",
            "syntax = \"proto3\";\npackage u;\nimport \"../a.proto\";\n",
            ErrorKind::Proto,
            "import_dotdot.proto:3:8: invalid import path (imports may not",
        ),
        (
            "nested_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  enum Kind { K = 0; }\n  message kind {}\n}\n",
            ErrorKind::Generate,
            "nested_clash.proto:4:3: enum Kind and message kind (nested_clash.proto:5:3) would \
             both be the Rust type `Kind`",
        ),
        (
            "alias_default.proto",
            "syntax = \"proto2\";\npackage u;\nenum Level {\n  option allow_alias = true;\n  LEVEL_LOW = 0;\n  LEVEL_MEDIUM = 1;\n  LEVEL_MID = 1;\n}\nmessage M {\n  optional Level l = 1 [default = LEVEL_MID];\n}\n",
            ErrorKind::Generate,
            "alias_default.proto:10:3: the default of field l is LEVEL_MID, an alias of \
             LEVEL_MEDIUM in enum Level",
        ),
        (
            "map_entry_rpc.proto",
            "syntax = \"proto3\";\npackage u;\nmessage Outer { map<string, int32> values = 1; }\nservice S {\n  rpc Get(Outer.ValuesEntry) returns (Outer);\n}\n",
            ErrorKind::Generate,
            "map_entry_rpc.proto:5:3: method S/Get: its input type is u.Outer.ValuesEntry, the \
             entry of a map field",
        ),
        (
            "map_entry_field.proto",
            "syntax = \"proto3\";\npackage u;\nmessage Outer { map<string, int32> values = 1; }\nmessage Other {\n  Outer.ValuesEntry e = 1;\n}\n",
            ErrorKind::Generate,
            "map_entry_field.proto:5:3: the field's type is u.Outer.ValuesEntry, the entry of a \
             map field",
        ),
        (
            "map_entry_own.proto",
            "syntax = \"proto3\";\npackage u;\nmessage Outer {\n  map<string, int32> values = 1;\n  ValuesEntry one = 2;\n}\n",
            ErrorKind::Generate,
            "map_entry_own.proto:5:3: the field's type is u.Outer.ValuesEntry",
        ),
        // From a review with protos of its own: members whose Rust names clash, which
        // rustc refused in the generated code.
        (
            "accessor_clash.proto",
            "syntax = \"proto2\";\npackage u;\nenum Color { C = 0; }\nmessage M {\n  optional Color color = 1;\n  optional int32 set_color = 2;\n}\n",
            ErrorKind::Generate,
            "accessor_clash.proto:6:3: field set_color and field color of message M would both be the Rust method `set_color()`",
        ),
        (
            "field_oneof_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  int32 kind = 1;\n  oneof Kind { string name = 2; }\n}\n",
            ErrorKind::Generate,
            "field_oneof_clash.proto:5:3: oneof Kind and field kind of message M would both be the Rust field `kind`",
        ),
        (
            "field_case_clash.proto",
            "syntax = \"proto2\";\npackage u;\nmessage M {\n  optional int32 Foo = 1;\n  optional int32 foo = 2;\n}\n",
            ErrorKind::Generate,
            "field_case_clash.proto:5:3: field foo and field Foo of message M would both be the Rust field `foo`",
        ),
        (
            "oneof_case_clash.proto",
            "syntax = \"proto2\";\npackage u;\nmessage M {\n  oneof Choice { int32 a = 1; }\n  oneof choice { int32 b = 2; }\n}\n",
            ErrorKind::Generate,
            "oneof_case_clash.proto:5:3: oneof choice and oneof Choice of message M would both be the Rust field `choice`",
        ),
        (
            "variant_clash.proto",
            "syntax = \"proto2\";\npackage u;\nmessage M {\n  oneof pick {\n    int32 Value = 1;\n    int32 value = 2;\n  }\n}\n",
            ErrorKind::Generate,
            "variant_clash.proto:6:5: field value and field Value of message M would both be the Rust variant of oneof pick's enum `Value`",
        ),
        (
            "oneof_suffix_clash.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  message Kind {}\n  message KindOneOf {}\n  oneof kind { Kind k = 1; }\n}\n",
            ErrorKind::Generate,
            "oneof_suffix_clash.proto:6:3: oneof kind and message KindOneOf (oneof_suffix_clash.proto:5:3) would both be the Rust type `KindOneOf`",
        ),
        (
            "newer_descriptor_type.proto",
            "syntax = \"proto3\";\npackage u;\nimport \"google/protobuf/descriptor.proto\";\nmessage H {\n  google.protobuf.FeatureSet f = 1;\n}\n",
            ErrorKind::Generate,
            "newer_descriptor_type.proto:5:3: field H.f has the type google.protobuf.FeatureSet, which prost-types",
        ),
        // Round 7: a map of enum values gets `get_x()` and `insert_x()` from
        // prost-derive (which cannot name them for a keyword field), and a message
        // that sets map_entry itself (protoc refuses it; prost-build panicked).
        (
            "map_enum_keyword.proto",
            "syntax = \"proto3\";\npackage u;\nenum Kind { K = 0; }\nmessage M {\n  map<string, Kind> type = 1;\n}\n",
            ErrorKind::Generate,
            "map_enum_keyword.proto:5:3: map field type of message M has enum values and a name that is a Rust keyword",
        ),
        (
            "map_enum_accessor_clash.proto",
            "syntax = \"proto3\";\npackage u;\nenum Kind { K = 0; }\nmessage N {\n  map<string, Kind> colors = 1;\n  optional string get_colors = 2;\n}\n",
            ErrorKind::Generate,
            "map_enum_accessor_clash.proto:6:3: field get_colors and field colors of message N would both be the Rust method `get_colors()`",
        ),
        (
            "explicit_map_entry.proto",
            "syntax = \"proto3\";\npackage u;\nmessage Outer {\n  message E { option map_entry = true; }\n  repeated E e = 1;\n}\n",
            ErrorKind::Generate,
            "explicit_map_entry.proto:4:3: message E sets option map_entry",
        ),
        (
            "explicit_map_entry_top.proto",
            "syntax = \"proto3\";\npackage u;\nmessage E {\n  option map_entry = true;\n  string key = 1;\n  string value = 2;\n}\n",
            ErrorKind::Generate,
            "explicit_map_entry_top.proto:3:1: message E sets option map_entry",
        ),
        (
            "float_default.proto",
            "syntax = \"proto2\";\npackage u;\nmessage F {\n  optional float f = 1 [default = 1e40];\n}\n",
            ErrorKind::Generate,
            "float_default.proto:4:3: the default of float field f is 10000000000000000000000000000000000000000, past the largest float",
        ),
        // Round 8: names that are only underscores give no Rust name (prost-build
        // panicked), and a message whose name starts with a digit after its
        // underscores has its struct and its module of nested types both `_1`.
        (
            "underscore_message.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  message __ {}\n}\n",
            ErrorKind::Generate,
            "underscore_message.proto:4:3: message __ gives no Rust identifier: its name must have a letter or a digit",
        ),
        (
            "underscore_field.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  int32 _ = 1;\n}\n",
            ErrorKind::Generate,
            "underscore_field.proto:4:3: field _ of message M gives no Rust identifier",
        ),
        (
            "underscore_oneof.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  oneof _ { int32 a = 1; }\n}\n",
            ErrorKind::Generate,
            "underscore_oneof.proto:4:3: oneof _ of message M gives no Rust identifier",
        ),
        (
            "underscore_enum.proto",
            "syntax = \"proto3\";\npackage u;\nenum __ {\n  A = 0;\n}\n",
            ErrorKind::Generate,
            "underscore_enum.proto:3:1: enum __ gives no Rust identifier",
        ),
        (
            "underscore_value.proto",
            "syntax = \"proto3\";\npackage u;\nmessage M {\n  enum E {\n    E_A = 0;\n    _ = 1;\n  }\n}\n",
            ErrorKind::Generate,
            "underscore_value.proto:6:5: value _ of enum E gives no Rust identifier",
        ),
        (
            "digit_message_module.proto",
            "syntax = \"proto3\";\npackage u;\nmessage _1a {\n  oneof pick { int32 a = 1; }\n}\n",
            ErrorKind::Generate,
            "digit_message_module.proto:3:1: message _1a has nested types (or a oneof), and its \
             struct and their module would both be the Rust name `_1a`",
        ),
    ] {
        let err = generate_text(name, text).unwrap_err();
        assert_eq!(err.kind(), kind, "{name}: {err}");
        assert!(err.to_string().starts_with(expected), "{name}: {err}");
    }
    // A package's first segment next to a module of the files without a package.
    let err = generate_texts(&[
        (
            "root_module.proto",
            "syntax = \"proto3\";\nimport \"common.proto\";\nmessage Common { enum Kind { K = 0; } }\n",
        ),
        ("common.proto", "syntax = \"proto3\";\npackage common;\nmessage C {}\n"),
    ])
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate, "{err}");
    assert!(
        err.to_string().starts_with(
            "common.proto:2:1: package common and message Common (root_module.proto:3:1) of \
             the files without a package would both generate the Rust module `common`"
        ),
        "{err}"
    );
}

/// A package segment that starts with a digit after its underscores is a module named
/// as a type of the parent package can be (`_1` and `__1` are both `_1` in Rust).
#[test]
fn a_package_named_like_a_type_of_its_parent_is_an_error() {
    let err = generate_texts(&[
        (
            "digit_parent.proto",
            "syntax = \"proto3\";\npackage u;\nimport \"digit_child.proto\";\nmessage __1 {}\n",
        ),
        (
            "digit_child.proto",
            "syntax = \"proto3\";\npackage u._1;\nmessage C {}\n",
        ),
    ])
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate, "{err}");
    assert!(
        err.to_string().starts_with(
            "digit_child.proto:2:1: package u._1 and message __1 (digit_parent.proto:4:1) would \
             both be the Rust name `_1` in one module"
        ),
        "{err}"
    );
    // Without the parent's type, and with names that have a letter, all is fine.
    generate_texts(&[
        (
            "digit_parent_fine.proto",
            "syntax = \"proto3\";\npackage u;\nimport \"digit_child_fine.proto\";\nmessage _2 {}\nmessage _1x {}\n",
        ),
        (
            "digit_child_fine.proto",
            "syntax = \"proto3\";\npackage u._1.x1;\nmessage _1_2 { message Inner {} }\n",
        ),
    ])
    .unwrap();
}

/// Services named as another's generated module (`Echo`, `EchoServer`, `EchoClient`,
/// `EchoMethods`), methods named as their service and as items of rpc-core, and
/// messages named as the types generated code uses.
#[test]
fn services_named_like_generated_modules_and_types() {
    let code = generate_unseen("round8_names.proto");
    for expected in [
        "pub mod echo_server {",
        "pub trait Echo: ",
        "pub struct EchoServer<T> {",
        "pub mod echo_server_server {",
        "pub trait EchoServer: ",
        "pub struct EchoServerServer<T> {",
        "pub mod echo_server_server_server {",
        "pub struct EchoServerServerServer<T> {",
        "pub mod echo_methods_methods {",
        "pub const ECHO_SERVER: ",
        "pub async fn echo_server(",
        "pub async fn into_(",
        "pub async fn r#box(",
        "pub async fn from_channel(",
        // Messages named as rpc-core's items stay theirs: paths are absolute.
        "::rpc_core::codegen::IntoRequest<super::Request>",
        "::rpc_core::codegen::Response<super::Response>",
        "::rpc_core::codegen::Streaming<super::Streaming>",
        "::rpc_core::codegen::Streaming<super::Bytes>",
    ] {
        assert!(code.contains(expected), "missing {expected:?}");
    }
}

/// A module of a package whose code is not generated (`google.protobuf`'s types are
/// `prost_types`') does not exist, so a message's module may have its name: the check
/// refused `message Protobuf { enum Kind {} }` in `package google`.
#[test]
fn modules_of_packages_not_generated_do_not_clash() {
    let code = generate_unseen("round8_google_pkg.proto");
    for expected in [
        "pub mod protobuf {",
        "pub struct Timestamp {",
        "IntoRequest<super::protobuf::Timestamp>",
        "Response<::rpc_core::codegen::prost_types::Timestamp>",
    ] {
        assert!(code.contains(expected), "missing {expected:?}: {code}");
    }
    // The same with a package mapped with `extern_path`.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rpc-codegen-unseen/extern_module");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("outer.proto"),
        "syntax = \"proto3\";\npackage outer;\nimport \"inner.proto\";\nmessage Inner {\n  enum Kind { KIND_UNSPECIFIED = 0; }\n  outer.inner.T t = 1;\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("inner.proto"),
        "syntax = \"proto3\";\npackage outer.inner;\nmessage T {}\n",
    )
    .unwrap();
    rpc_codegen::configure()
        .extern_path(".outer.inner", "::other_crate::inner")
        .generate(&["outer.proto"], &[&dir])
        .unwrap();
}

/// The include file nests modules as the packages are: `package twice.twice.twice;`
/// gives modules named as the module they are in, which clippy flags
/// (`module_inception`) unless allowed.
#[test]
fn the_include_file_allows_module_inception() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rpc-codegen-unseen/twice");
    let _ = std::fs::remove_dir_all(&out);
    rpc_codegen::configure()
        .out_dir(&out)
        .emit_rerun_if_changed(false)
        .compile(&["round8_twice.proto"], &[unseen_dir()])
        .unwrap();
    let includes = std::fs::read_to_string(out.join(rpc_codegen::DEFAULT_INCLUDE_FILE)).unwrap();
    let allowed = "#[allow(clippy::module_inception)]";
    assert!(
        includes.contains(&format!(
            "pub mod twice {{\n    {allowed}\n    pub mod twice {{\n        {allowed}\n        pub mod twice {{"
        )),
        "{includes}"
    );
    // The outermost module is the includer's to name.
    assert!(includes.contains("\npub mod twice {"), "{includes}");
    let code = std::fs::read_to_string(out.join("twice.twice.twice.rs")).unwrap();
    assert!(
        code.contains(&format!("{allowed}\npub mod twice {{")),
        "{code}"
    );
}

#[test]
fn aliases_and_stripped_prefixes_that_do_not_clash_are_fine() {
    let files = generate_text(
        "enum_fine.proto",
        "syntax = \"proto2\";\npackage u;\nenum Level {\n  option allow_alias = true;\n  LEVEL_LOW = 0;\n  LEVEL_MEDIUM = 1;\n  LEVEL_MID = 1;\n  LEVELLING = 2;\n}\nmessage M {\n  optional Level l = 1 [default = LEVEL_MEDIUM];\n  map<string, int32> foo_bar = 2;\n  message Foo_BarEntry {}\n  optional int32 x = 3;\n}\n",
    )
    .unwrap();
    assert!(!files.is_empty());
    // A default naming an alias whose variant name is also a generated variant's
    // (`MID` and `MODE_MID` are both `Mid`); an enum `Self`, whose variants prost-build
    // strips of `Self_`, not `Self` (`SELF_A` and `A` do not clash).
    let files = generate_text(
        "enum_fine2.proto",
        "syntax = \"proto2\";\npackage u;\nenum Mode {\n  option allow_alias = true;\n  MODE_MID = 0;\n  MID = 0;\n}\nenum Self {\n  SELF_A = 0;\n  A = 1;\n}\nmessage M {\n  optional Mode m = 1 [default = MID];\n}\n",
    )
    .unwrap();
    assert!(!files.is_empty());
}

#[test]
fn packages_generated_elsewhere_are_not_checked() {
    // Names that would clash here, in a package `extern_path` maps to another crate.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-unseen")
        .join("extern_clash");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("ext.proto"),
        "syntax = \"proto3\";\npackage ext;\nmessage FooBar {}\nmessage Foo_Bar {}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("uses.proto"),
        "syntax = \"proto3\";\npackage uses;\nimport \"ext.proto\";\nmessage M { ext.FooBar a = 1; }\n",
    )
    .unwrap();
    rpc_codegen::configure()
        .extern_path(".ext", "::ext_crate")
        .generate(&["uses.proto"], &[&dir])
        .unwrap();
    let err = rpc_codegen::configure()
        .generate(&["uses.proto"], &[&dir])
        .unwrap_err();
    assert!(
        err.to_string().contains("would both be the Rust type"),
        "{err}"
    );
}

#[test]
fn names_that_only_look_alike_are_fine() {
    // A proto3 `optional` field makes no nested module, so `FooClient` does not clash.
    let files = generate_text(
        "no_clash.proto",
        "syntax = \"proto3\";\npackage u;\nmessage FooClient { optional int32 a = 1; }\n\
         service Foo { rpc A1b(FooClient) returns (FooClient); \
         rpc A_1b(FooClient) returns (FooClient); }\n",
    )
    .unwrap();
    let code = &files[0].1;
    assert!(code.contains("pub async fn a1b(") && code.contains("pub async fn a_1b("));
}

#[test]
fn deprecated_methods_are_deprecated_in_the_client() {
    let code = generate_unseen("streaming.proto");
    let deprecated: Vec<&str> = code
        .lines()
        .zip(code.lines().skip(1))
        .filter(|(attr, _)| attr.trim() == "#[deprecated]")
        .map(|(_, item)| item.trim())
        .collect();
    // `Add` says `deprecated = true`; `Echo` says false, the others nothing.
    assert_eq!(deprecated.len(), 1, "{deprecated:?}");
    assert!(
        deprecated[0].starts_with("pub async fn add("),
        "{deprecated:?}"
    );
}

#[test]
fn a_service_named_like_the_type_parameter() {
    let code = generate_unseen("generic_name.proto");
    for expected in [
        "pub trait T:",
        "impl<T: self::T> ::rpc_core::codegen::NamedService for TServer<T>",
        "impl<T: self::T> ::rpc_core::codegen::Service<::rpc_core::codegen::ServerCall>",
        "<T as self::T>::get(&inner, request)",
    ] {
        assert!(code.contains(expected), "missing {expected:?}\n{code}");
    }
}

#[test]
fn client_methods_named_like_prelude_trait_methods_get_an_underscore() {
    let code = generate_unseen("prelude_names.proto");
    for expected in [
        "pub async fn into_(",
        "pub async fn try_into_(",
        "pub async fn to_owned_(",
        "pub async fn clone_into_(",
        // The trait keeps the names.
        "fn into(\n",
        "fn try_into(\n",
        // `default` is an associated function of `Default`, not a method.
        "pub async fn default(",
    ] {
        assert!(code.contains(expected), "missing {expected:?}");
    }
}

#[test]
fn client_methods_named_like_connect_functions_get_an_underscore() {
    let code = generate_unseen("round3_connect.proto");
    for expected in [
        "pub async fn connect_(",
        "pub async fn connect_with_(",
        "pub async fn balanced_(",
        "pub async fn balanced_with_(",
        // The trait keeps the names.
        "fn connect(\n",
        "fn balanced_with(\n",
    ] {
        assert!(code.contains(expected), "missing {expected:?}");
    }
}

#[test]
fn a_module_named_like_its_package_allows_module_inception() {
    let code = generate_unseen("package_segment.proto");
    assert!(
        code.contains("#[allow(clippy::module_inception)]\npub mod b {\n"),
        "{code}"
    );
    assert_eq!(code.matches("module_inception").count(), 1, "{code}");
    // Only there: other files' nested modules are left alone.
    assert!(!generate_unseen("layout.proto").contains("module_inception"));
    // A message nested in one of its own name: `foo::foo`, at any depth.
    let files = generate_text(
        "inception.proto",
        "syntax = \"proto3\";\npackage p;\nmessage Foo {\n  message Foo {\n    enum E { X = 0; }\n  }\n}\n",
    )
    .unwrap();
    let code: String = files.into_iter().map(|(_, code)| code).collect();
    assert!(
        code.contains("    #[allow(clippy::module_inception)]\n    pub mod foo {\n"),
        "{code}"
    );
    assert_eq!(code.matches("module_inception").count(), 1, "{code}");
}

#[test]
fn links_rustdoc_would_resolve_are_escaped() {
    let code = generate_unseen("doc_links.proto");
    // Inline links to names, and wiki links, which prost-build makes `[Note](Note)`.
    for line in code
        .lines()
        .filter(|line| line.trim_start().starts_with("///"))
    {
        for link in [
            "[Note](Note)",
            "[note](Note)",
            "[nested](nested)",
            "[x](x)",
            "[link](link)",
        ] {
            if let Some(at) = line.find(link) {
                assert!(line[..at].ends_with('\\'), "{line}");
            }
        }
        assert!(!line.contains("<https://api.example/v1/<"), "{line}");
    }
    assert!(
        code.contains("`https://api.example/v1/<name>/items`"),
        "{code}"
    );
    // Links to URLs and anchors stay links.
    assert!(code.contains("[Get](#get)"), "{code}");
    assert!(
        code.contains("[RFC 3339](<https://www.rfc-editor.org/rfc/rfc3339>)"),
        "{code}"
    );
}

#[test]
fn a_package_named_like_a_module_of_its_parent_is_an_error() {
    let err = rpc_codegen::configure()
        .generate(&["subpackage_clash.proto"], &[unseen_dir()])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate);
    assert_eq!(
        err.to_string(),
        "subpackage_clash.proto:5:1: package unseen.seg.sub and message Sub \
         (subpackage_parent.proto:7:1) of package `unseen.seg` would both generate the Rust \
         module `unseen::seg::sub`"
    );
}

/// Generates `root` of `files` (name, contents) written into a fresh directory.
fn generate_files(
    test: &str,
    files: &[(&str, &str)],
    root: &str,
) -> Result<Vec<(String, String)>, rpc_codegen::Error> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-unseen")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    rpc_codegen::configure().generate(&[root], &[&dir])
}

#[test]
fn stream_types_that_would_clash_get_an_underscore() {
    let code = generate_unseen("round2_stream_types.proto");
    for expected in [
        // `Tick_1` first, then `Tick1`: both `Tick1` in upper camel case.
        "type Tick1Stream:",
        "type Tick1Stream_:",
        "Response<Self::Tick1Stream_>",
        "type Tick1StreamStream:",
        "type ABStream:",
        "type AbStream:",
        "pub async fn tick_1(",
        "pub async fn tick1(",
        "pub async fn leading(",
        "path: \"round2.streams.Ticker/_Leading\"",
    ] {
        assert!(code.contains(expected), "missing {expected:?}\n{code}");
    }
    assert_eq!(code.matches("type Tick1Stream:").count(), 1);
}

#[test]
fn map_entries_make_no_module() {
    // `message RegistryClient { map<..> labels = 1; }` beside `service Registry`.
    let code = generate_unseen("round2_map_module.proto");
    assert_eq!(
        code.matches("pub mod registry_client {").count(),
        1,
        "{code}"
    );
}

#[test]
fn packages_that_differ_in_case_are_one_module() {
    let files = rpc_codegen::configure()
        .generate(&["round2_case_package_a.proto"], &[unseen_dir()])
        .unwrap();
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["round2.case_pkg.rs"]);
    let code = &files[0].1;
    assert_eq!(code.matches("pub const FILE_DESCRIPTOR_SET").count(), 1);
    assert!(code.contains("NAME: &'static str = \"round2.CasePkg.UpperSvc\""));
    assert!(code.contains("NAME: &'static str = \"round2.case_pkg.LowerSvc\""));

    // So their modules clash as those of one package would.
    let err = generate_files(
        "case_package_clash",
        &[
            (
                "upper.proto",
                "syntax = \"proto3\";\npackage u.FooBar;\nimport \"lower.proto\";\n\
                 service Svc {}\n",
            ),
            (
                "lower.proto",
                "syntax = \"proto3\";\npackage u.foo_bar;\nservice Svc {}\n",
            ),
        ],
        "upper.proto",
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate);
    assert_eq!(
        err.to_string(),
        "upper.proto:4:1: service Svc of package `u.FooBar` and service Svc (lower.proto:3:1) \
         of package `u.foo_bar` would both generate the Rust module `svc_methods` (packages \
         that differ only in case are one Rust module)"
    );
    let err = generate_files(
        "case_package_module_clash",
        &[
            (
                "parent.proto",
                "syntax = \"proto3\";\npackage u.A;\nimport \"child.proto\";\n\
                 message Sub { enum Kind { KIND_UNSPECIFIED = 0; } }\n",
            ),
            (
                "child.proto",
                "syntax = \"proto3\";\npackage u.a.sub;\nmessage M {}\n",
            ),
        ],
        "parent.proto",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("child.proto:2:1: package u.a.sub and message Sub (parent.proto:4:1)"),
        "{err}"
    );
}

#[test]
fn a_package_segment_without_a_rust_name_is_an_error() {
    let err = generate_text(
        "underscore_package.proto",
        "syntax = \"proto3\";\npackage u._;\nmessage M {}\n",
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate);
    assert!(
        err.to_string().starts_with(
            "underscore_package.proto:2:1: package u._ gives no Rust module for its segment `_`"
        ),
        "{err}"
    );
}

#[test]
fn bidi_controls_and_quoted_rust_blocks_do_not_reach_rustc() {
    let code = generate_unseen("round2_unicode_comments.proto");
    for line in code
        .lines()
        .filter(|line| line.trim_start().starts_with("//"))
    {
        assert!(
            !line.contains(['\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}']),
            "{line}"
        );
    }
    assert!(code.contains("override: \\u{202E}abc\\u{202C}"), "{code}");
    // Not a control: left alone.
    assert!(code.contains('\u{200F}'), "{code}");

    let code = generate_unseen("round2_doc_blocks.proto");
    assert!(!code.contains("compile_fail"), "{code}");
    assert!(code.contains("/// > ```text\n"), "{code}");
    assert!(
        code.contains("/// `Quoted` starts with code: then \\<T>, \\[the text](Text) and \\<b>."),
        "{code}"
    );
}

/// A type is named as `extern_path` wrote it only if its `.proto` package is the one
/// mapped: a local message's nested module named like the extern crate stays relative
/// (found by a review: `common::Item` of `message Common { message Item {} }` was taken
/// for the crate `common`'s).
#[test]
fn only_mapped_packages_keep_their_extern_rust_path() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-unseen")
        .join("extern_like_local");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("common.proto"),
        "syntax = \"proto3\";\npackage common;\nmessage Shared {}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("svc.proto"),
        "syntax = \"proto3\";\npackage svc;\nimport \"common.proto\";\n\
         message Common { message Item {} }\n\
         service S { rpc Get(Common.Item) returns (common.Shared); }\n",
    )
    .unwrap();
    let files = rpc_codegen::configure()
        .extern_path(".common", "common")
        .generate(&["svc.proto"], &[&dir])
        .unwrap();
    let code = &files.iter().find(|(name, _)| name == "svc.rs").unwrap().1;
    assert!(
        code.contains("super::common::Item"),
        "the local type, relative"
    );
    assert!(
        code.contains("common::Shared") && !code.contains("super::common::Shared"),
        "the mapped one as written"
    );
}

/// Round 10: protox reports some errors without a line and column: a file that ends
/// inside a definition (a missing `}`, the most common syntax error), a file that is
/// not UTF-8 (a Latin-1 comment), an import cycle and a second `package`. Each gets
/// the position protoc would give: the end of the file's last token, the first byte
/// that is not UTF-8, the import that closes the cycle and the second `package`.
#[test]
fn protox_errors_without_a_position_get_one() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-unseen")
        .join("round10_positions");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let files: &[(&str, &[u8])] = &[
        (
            "eof.proto",
            b"syntax = \"proto3\";\npackage u;\n\nmessage M {\n  int32 x = 1;\n\n",
        ),
        (
            "eof_comment.proto",
            b"syntax = \"proto3\";\npackage u;\n/* never closed\nmessage M {}\n",
        ),
        (
            "latin1.proto",
            b"syntax = \"proto3\";\npackage u;\n// caf\xe9 cr\xe8me\nmessage M {}\n",
        ),
        (
            "cycle_a.proto",
            b"syntax = \"proto3\";\npackage u;\n\nimport \"cycle_b.proto\";\n",
        ),
        (
            "cycle_b.proto",
            b"syntax = \"proto3\";\npackage u;\nimport \"google/protobuf/empty.proto\";\n  import \"cycle_a.proto\";\n",
        ),
        (
            "two_packages.proto",
            b"syntax = \"proto3\";\npackage u;\n// package x;\n  package v;\n",
        ),
        // A root outside the cycle it imports: the position is the cycle's own
        // import, not the root's (from a review: the root's import was named).
        (
            "into_cycle.proto",
            b"syntax = \"proto3\";\npackage u;\nimport \"cycle_a.proto\";\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    for (root, expected) in [
        ("eof.proto", "eof.proto:5:15: expected a message field"),
        (
            "eof_comment.proto",
            "eof_comment.proto:4:13: expected comment terminator, but reached end of file",
        ),
        (
            "latin1.proto",
            "latin1.proto:3:7: file 'latin1.proto' is not valid utf-8",
        ),
        (
            "cycle_a.proto",
            "cycle_a.proto:4:1: import cycle detected: cycle_a.proto -> cycle_b.proto -> \
             cycle_a.proto",
        ),
        ("cycle_b.proto", "cycle_b.proto:4:3: import cycle detected"),
        (
            "into_cycle.proto",
            "cycle_a.proto:4:1: import cycle detected",
        ),
        (
            "two_packages.proto",
            "two_packages.proto:4:3: multiple package names specified",
        ),
    ] {
        let err = rpc_codegen::configure()
            .generate(&[root], &[&dir])
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Proto, "{err}");
        assert!(err.to_string().starts_with(expected), "{root}: {err}");
    }
}

/// Round 10: an option value nested a few hundred levels deep overflowed the stack
/// (prost-reflect parses aggregate values recursively, for protox): the process
/// aborted, with no error and no position. It is refused, where it goes too deep.
#[test]
fn deeply_nested_option_values_are_refused() {
    let depth = 2000;
    let text = format!(
        "syntax = \"proto2\";\npackage u;\nimport \"google/protobuf/descriptor.proto\";\n\
         message R {{ optional R r = 1; optional int32 v = 2; }}\n\
         extend google.protobuf.MessageOptions {{ optional R deep = 50000; }}\n\
         message X {{\n  option (deep) = {}{{ v: 1 }}{};\n}}\n",
        "{ r ".repeat(depth),
        " }".repeat(depth),
    );
    let err = generate_text("deep_option.proto", &text).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proto, "{err}");
    // `{` number 64 of the value opens level 65 (the message's own `{` is the first).
    let column = "  option (deep) = ".len() + 63 * "{ r ".len() + 1;
    let expected = format!("deep_option.proto:7:{column}: ");
    assert!(err.to_string().starts_with(&expected), "{err}");

    // As deep as real files go (and deeper) is fine.
    let text = text.replace(&"{ r ".repeat(depth), &"{ r ".repeat(40));
    let text = text.replace(&" }".repeat(depth), &" }".repeat(40));
    generate_text("deep_option.proto", &text).unwrap();
}

/// A file that starts with a UTF-8 byte-order mark (some Windows editors write one) is
/// read, editions files too, as protoc reads them (from a review: refused).
#[test]
fn a_byte_order_mark_is_skipped() {
    for (name, text) in [
        (
            "bom3.proto",
            "\u{feff}syntax = \"proto3\";\npackage u;\nmessage M { int32 n = 1; }\n",
        ),
        (
            "bom_ed.proto",
            "\u{feff}edition = \"2023\";\npackage u;\nmessage M { int32 n = 1; }\n",
        ),
    ] {
        let files = generate_text(name, text).unwrap_or_else(|err| panic!("{name}: {err}"));
        let code: String = files.into_iter().map(|(_, code)| code).collect();
        assert!(code.contains("pub struct M"), "{name}: {code}");
    }
    // What follows the mark is read as usual: its errors are positioned as usual.
    let err = generate_text("bom_bad.proto", "\u{feff}syntax = \"proto3\";\nmessage {\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("bom_bad.proto:2:"), "{err}");
}

/// Javadoc-style comments (`/** ... */`): protox keeps the second star of `/**`, which
/// Markdown read as a bullet (`/** Frobs. */`) or an empty bullet (`/**` on its own
/// line). The star goes; a `//` comment of bullets stays a list.
#[test]
fn javadoc_comments_lose_their_leading_star() {
    let text = "syntax = \"proto3\";\npackage p;\n\
        /**\n * Hello world.\n * Second line.\n */\n\
        message M {\n\
          /** One line. */\n  int32 a = 1;\n\
          /**\n   *\n   *     indented code\n   */\n  int32 b = 2;\n\
          // * first\n  // * second\n  int32 c = 3;\n\
          /** * item\n   * * other item\n   */\n  int32 d = 4;\n\
          /**\n   */\n  int32 e = 5;\n\
          /**Frobs. */\n  int32 f = 6;\n\
          //* one\n  //* two\n  int32 g = 7;\n\
          /*** Banner. */\n  int32 h = 8;\n\
        }\n";
    let code: String = generate_text("javadoc.proto", text)
        .unwrap()
        .into_iter()
        .map(|(_, code)| code)
        .collect();
    assert!(
        code.contains("/// Hello world.\n/// Second line.\npub struct M")
            || code.contains("/// Hello world.\n/// Second line.\n#[derive"),
        "{code}"
    );
    assert!(code.contains("    /// One line.\n"), "{code}");
    assert!(
        !code.contains("/// *\n"),
        "an empty bullet is left:\n{code}"
    );
    assert!(
        code.contains("///     indented code") || code.contains("indented code\n    /// ```"),
        "{code}"
    );
    assert!(
        code.contains("    /// * first\n    /// * second\n"),
        "{code}"
    );
    assert!(
        code.contains("    /// * item\n    /// * other item\n"),
        "{code}"
    );
    // No space after the star: a Javadoc comment still (from a review).
    assert!(code.contains("    /// Frobs.\n"), "{code}");
    // `//*` lines each start with the star: a list, kept whole.
    assert!(code.contains("    /// * one\n    /// * two\n"), "{code}");
    // A `/***` banner is left as it is.
    assert!(code.contains("    /// \\** Banner."), "{code}");
}

/// A method's request or response type written as a relative name whose first part
/// names a method of the same service (`rpc Get(Get)`) is refused, as protoc refuses
/// it ("Get" is not a message type): protoc finds the method before the message.
/// Written in full, or named after no method, it generates. (From a review: protox
/// took the message, so a file that broke every protoc-based build generated Rust.)
#[test]
fn a_type_named_like_a_method_of_its_service_is_refused_as_protoc_does() {
    let refused = [
        "syntax = \"proto3\";\npackage demo;\nmessage Get { string key = 1; }\nservice Store {\n  rpc Get(Get) returns (Get);\n}\n",
        "syntax = \"proto3\";\npackage demo;\nmessage Put { }\nmessage Ok { }\nservice Store {\n  rpc Put(Ok) returns (Ok);\n  rpc Ok(Put) returns (Ok);\n}\n",
        "syntax = \"proto3\";\nmessage Ping { }\nservice S {\n  rpc Ping(Ping) returns (Ping);\n}\n",
    ];
    for (i, text) in refused.iter().enumerate() {
        let name = format!("shadow{i}.proto");
        let err = generate_text(&name, text).expect_err(text);
        let message = err.to_string();
        assert!(message.contains("is not a message type"), "{message}");
        assert!(
            message.contains(&format!("{name}:")),
            "positioned: {message}"
        );
    }
    let err = generate_text("shadow_at.proto", refused[0])
        .unwrap_err()
        .to_string();
    assert!(err.contains("shadow_at.proto:5:11"), "{err}");
    assert!(err.contains(".demo.Get"), "the fix is named: {err}");
    let accepted = [
        "syntax = \"proto3\";\npackage demo;\nmessage Get { string key = 1; }\nservice Store {\n  rpc Get(.demo.Get) returns (demo.Get);\n}\n",
        "syntax = \"proto3\";\npackage demo;\nmessage GetRequest { }\nservice Store {\n  rpc Get(GetRequest) returns (GetRequest);\n}\n",
    ];
    for (i, text) in accepted.iter().enumerate() {
        generate_text(&format!("unshadowed{i}.proto"), text).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A reserved name in use is refused, as protoc refuses it ("Field name "x" is
/// reserved."): names are reserved so that a deleted field's JSON and text names are
/// not reused. protox took them (from a review). Nested messages and enums too.
#[test]
fn reserved_names_in_use_are_refused() {
    for (name, text, expected) in [
        (
            "reserved_field.proto",
            "syntax = \"proto3\";\npackage r;\nmessage M {\n  reserved \"x\";\n  int32 x = 1;\n}\n",
            "reserved_field.proto:5:3: field x of message M: the name is reserved",
        ),
        (
            "reserved_value.proto",
            "syntax = \"proto3\";\npackage r;\nenum E {\n  reserved \"B\";\n  A = 0;\n  B = 1;\n}\n",
            "reserved_value.proto:6:3: value B of enum E: the name is reserved",
        ),
        (
            "reserved_nested.proto",
            "syntax = \"proto2\";\npackage r;\nmessage O {\n  message I {\n    reserved 'y';\n    optional int32 y = 1;\n  }\n  enum F {\n    reserved 'Z';\n    Z = 0;\n  }\n}\n",
            "reserved_nested.proto:6:5: field y of message I: the name is reserved",
        ),
    ] {
        let err = generate_text(name, text).expect_err(name);
        assert_eq!(err.kind(), ErrorKind::Proto, "{err}");
        assert!(err.to_string().starts_with(expected), "{err}");
    }
    // Reserved names nothing uses, and reserved numbers beside, generate.
    generate_text(
        "reserved_unused.proto",
        "syntax = \"proto3\";\npackage r;\nmessage M {\n  reserved 2, 15 to 20;\n  reserved \"old\";\n  int32 x = 1;\n}\nenum E {\n  reserved \"GONE\";\n  A = 0;\n}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}
