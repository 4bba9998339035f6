//! Tests of the generated code as text, on small `.proto` files written for each test
//! and on the gRPC test service of the shared corpus.

use std::path::{Path, PathBuf};

use rpc_codegen::ErrorKind;

/// Writes `files` (name, contents) into a fresh directory for `test` and returns it.
fn proto_dir(test: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("rpc-codegen-tests")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    for (name, contents) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

/// Generates code for one file of `dir` and returns the file of `package`.
fn generate_one(dir: &Path, proto: &str, package_file: &str) -> String {
    let files = rpc_codegen::configure()
        .generate(&[dir.join(proto)], &[dir])
        .unwrap_or_else(|err| panic!("generation failed: {err}"));
    files
        .into_iter()
        .find(|(name, _)| name == package_file)
        .unwrap_or_else(|| panic!("no {package_file} generated"))
        .1
}

const ECHO: &str = r#"
syntax = "proto3";
package demo;

message SayRequest { string text = 1; }
message SayReply { string text = 1; }

service Echo {
  rpc Say(SayRequest) returns (SayReply) { option idempotency_level = IDEMPOTENT; }
}
"#;

#[test]
fn echo() {
    let dir = proto_dir("echo", &[("echo.proto", ECHO)]);
    let code = generate_one(&dir, "echo.proto", "demo.rs");
    println!("{code}");
}

/// The shared corpus of real-world `.proto` files, beside the repository, or
/// `$RPC_PROTO_CORPUS`. `None` (the test is skipped) if it is missing, except under CI.
fn shared_protos() -> Option<PathBuf> {
    let corpus = match std::env::var_os("RPC_PROTO_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata/protos"),
    };
    if corpus.is_dir() {
        return Some(corpus);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "no .proto corpus at {}",
        corpus.display()
    );
    eprintln!("skipped: no .proto corpus at {}", corpus.display());
    None
}

#[test]
fn streaming_methods_are_generated_with_stream_types() {
    let Some(corpus) = shared_protos() else {
        return;
    };
    let files = rpc_codegen::configure()
        .generate(
            &["grpc/testing/test.proto"],
            &[corpus.join("protobuf"), corpus.join("grpc-proto")],
        )
        .unwrap();
    let code: String = files.iter().map(|(_, code)| code.as_str()).collect();
    // Compared without whitespace: the generated code is formatted.
    let squashed: String = code.split_whitespace().collect();
    for expected in [
        // Server streaming: one request, a stream of responses.
        "pub async fn streaming_output_call(&mut self, request: impl ::rpc_core::codegen::IntoRequest<",
        "type StreamingOutputCallStream: ::rpc_core::codegen::Stream<Item = ::core::result::Result<",
        // Client streaming: a stream of requests, one response.
        "pub async fn streaming_input_call(&mut self, request: impl ::rpc_core::codegen::IntoStreamingRequest< Message =",
        "fn streaming_input_call(&self, request: ::rpc_core::codegen::Request<::rpc_core::codegen::Streaming<",
        // Bidirectional: both.
        "type FullDuplexCallStream:",
        "Output = ::core::result::Result<::rpc_core::codegen::Response<Self::FullDuplexCallStream>, ::rpc_core::codegen::Status",
        "let request = ::rpc_core::codegen::streaming_request::< super::StreamingOutputCallRequest, >(call)?; ::rpc_core::codegen::encode_stream_response( <T as self::TestService>::full_duplex_call(",
    ] {
        let expected: String = expected.split_whitespace().collect();
        assert!(squashed.contains(&expected), "missing {expected:?}");
    }
}

#[test]
fn skipped_streaming_methods_are_listed_in_the_docs() {
    let Some(corpus) = shared_protos() else {
        return;
    };
    let files = rpc_codegen::configure()
        .skip_streaming_methods(true)
        .generate(
            &["grpc/testing/test.proto"],
            &[corpus.join("protobuf"), corpus.join("grpc-proto")],
        )
        .unwrap();
    let (_, code) = files
        .iter()
        .find(|(name, _)| name == "grpc.testing.rs")
        .unwrap();
    let listed =
        "/// Not generated: `StreamingOutputCall` (server-streaming), `StreamingInputCall` \
                  (client-streaming), `FullDuplexCall` (bidirectional-streaming), `HalfDuplexCall` \
                  (bidirectional-streaming)";
    // On the descriptor module, the client struct and the server trait.
    assert_eq!(code.matches(listed).count(), 3, "{code}");
    assert!(code.contains("pub async fn unary_call("));
    assert!(!code.contains("fn streaming_output_call("));
    // `grpc.testing.Empty` is a message of its own, not `google.protobuf.Empty`.
    assert!(code.contains("IntoRequest<super::Empty>"));
}

#[test]
fn malformed_proto_gives_file_line_col() {
    let dir = proto_dir(
        "malformed",
        &[(
            "broken.proto",
            "syntax = \"proto3\";\npackage demo;\n\nmessage Ok { string a = 1; }\nmessage Broken {\n  string a = ;\n}\n",
        )],
    );
    let err = rpc_codegen::configure()
        .generate(&[dir.join("broken.proto")], &[&dir])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proto);
    let message = err.to_string();
    assert!(message.starts_with("broken.proto:6:14: "), "{message}");

    // Errors found after parsing (an unknown type) carry the position too.
    let dir = proto_dir(
        "unknown-type",
        &[(
            "unknown.proto",
            "syntax = \"proto3\";\npackage demo;\n\nmessage M {\n  Missing a = 1;\n}\n",
        )],
    );
    let message = rpc_codegen::configure()
        .generate(&[dir.join("unknown.proto")], &[&dir])
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("unknown.proto:5:3: "), "{message}");

    // And `compile` reports the same text as an io::Error.
    let err = rpc_codegen::configure()
        .out_dir(dir.join("out"))
        .emit_rerun_if_changed(false)
        .compile(&[dir.join("unknown.proto")], &[&dir])
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(err.to_string(), message);
}

#[test]
fn missing_file_is_an_error() {
    let dir = proto_dir("missing", &[]);
    std::fs::create_dir_all(&dir).unwrap();
    let err = rpc_codegen::configure()
        .generate(&["nothere.proto"], &[&dir])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proto);
    assert!(err.to_string().contains("nothere.proto"), "{err}");
}

#[test]
fn a_missing_include_directory_or_root_file_is_named() {
    let dir = proto_dir("missing-paths", &[("here.proto", ECHO)]);
    let gone = dir.join("no-such-dir");
    let err = rpc_codegen::configure()
        .generate(&[dir.join("here.proto")], &[&dir, &gone])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proto);
    assert!(
        err.to_string().contains(&format!(
            "include directory {} does not exist",
            gone.display()
        )),
        "{err}"
    );
    let err = rpc_codegen::configure()
        .generate(&["gone.proto"], &[&dir])
        .unwrap_err();
    assert!(
        err.to_string().starts_with("gone.proto: no such file")
            && err.to_string().contains(&dir.display().to_string()),
        "{err}"
    );
}

#[test]
fn clashing_descriptor_constants_are_an_error_at_the_proto_position() {
    let dir = proto_dir(
        "constant-clash",
        &[(
            "c.proto",
            "syntax = \"proto3\";\npackage c;\nmessage M {}\nservice S {\n  rpc All(M) returns (M);\n  rpc AllMethod(M) returns (M);\n}\n",
        )],
    );
    let err = rpc_codegen::configure()
        .generate(&[dir.join("c.proto")], &[&dir])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate);
    let message = err.to_string();
    assert!(message.starts_with("c.proto:6:"), "{message}");
    assert!(
        message.contains("c.S/All and c.S/AllMethod") && message.contains("ALL_METHOD"),
        "{message}"
    );
}

#[test]
fn idempotency_levels() {
    let dir = proto_dir(
        "idempotency",
        &[(
            "levels.proto",
            r#"
syntax = "proto3";
package levels;
message M {}
service Levels {
  rpc Plain(M) returns (M);
  rpc Explicit(M) returns (M) { option idempotency_level = IDEMPOTENCY_UNKNOWN; }
  rpc Read(M) returns (M) { option idempotency_level = NO_SIDE_EFFECTS; }
  rpc Write(M) returns (M) { option idempotency_level = IDEMPOTENT; }
}
"#,
        )],
    );
    let code = generate_one(&dir, "levels.proto", "levels.rs");
    for (constant, level) in [
        ("PLAIN", "Unknown"),
        ("EXPLICIT", "Unknown"),
        ("READ", "NoSideEffects"),
        ("WRITE", "Idempotent"),
    ] {
        let start = code.find(&format!("pub const {constant}:")).unwrap();
        let end = start + code[start..].find("};").unwrap();
        assert!(
            code[start..end].contains(&format!("::rpc_core::codegen::Idempotency::{level},")),
            "{constant}: {}",
            &code[start..end]
        );
    }
    let flat: String = code.split_whitespace().collect();
    assert!(
        flat.contains(
            "constALL:&[::rpc_core::codegen::MethodDescriptor]=&[PLAIN,EXPLICIT,READ,WRITE,];"
        ),
        "{code}"
    );
}

#[test]
fn comments_become_docs() {
    let dir = proto_dir(
        "comments",
        &[(
            "commented.proto",
            r#"
syntax = "proto3";
package commented;

message M {}

// The greeting service.
// See https://example.com/greet for [details].
service Greeter {
  // Says hello.
  //
  //     indented block, which rustdoc would run as a doctest
  rpc SayHello(M) returns (M);
  rpc Bye(M) returns (M); // Says bye.
}
"#,
        )],
    );
    let code = generate_one(&dir, "commented.proto", "commented.rs");
    assert!(code.contains("/// The greeting service.\n"), "{code}");
    // URLs and brackets are escaped for rustdoc.
    assert!(
        code.contains("/// See <https://example.com/greet> for \\[details\\].\n"),
        "{code}"
    );
    assert!(code.contains("/// Says hello.\n"), "{code}");
    assert!(code.contains("/// Says bye.\n"), "{code}");
    // The indented block is fenced as text, so it is no doctest.
    assert!(
        code.contains("/// ```text\n        /// indented block"),
        "{code}"
    );
    // On the client struct, the server trait, and their methods.
    assert_eq!(
        code.matches("/// The greeting service.\n").count(),
        2,
        "{code}"
    );
    assert_eq!(code.matches("/// Says hello.\n").count(), 3, "{code}");
}

#[test]
fn method_names_are_valid_identifiers() {
    let dir = proto_dir(
        "names",
        &[(
            "names.proto",
            r#"
syntax = "proto3";
package names;
message M {}
service Names {
  rpc type(M) returns (M);
  rpc Self(M) returns (M);
  rpc Get(M) returns (M);
  rpc New(M) returns (M);
  rpc All(M) returns (M);
  rpc StreamingOutputCall(M) returns (M);
}
"#,
        )],
    );
    let code = generate_one(&dir, "names.proto", "names.rs");
    for expected in [
        "pub async fn r#type(",
        "fn r#type(",
        "pub const TYPE:",
        "pub async fn self_(",
        "pub async fn get(",
        // `new` is the client's constructor; the trait keeps the plain name.
        "pub async fn new_(",
        "fn new(\n",
        "pub const ALL_METHOD:",
        "pub async fn streaming_output_call(",
        "pub const STREAMING_OUTPUT_CALL:",
        "\"names.Names/type\" =>",
        "<T as self::Names>::r#type(&inner, request)",
    ] {
        assert!(code.contains(expected), "missing {expected:?} in\n{code}");
    }
}

#[test]
fn clashing_method_names_are_an_error() {
    let dir = proto_dir(
        "clash",
        &[(
            "clash.proto",
            "syntax = \"proto3\";\npackage clash;\nmessage M {}\nservice S {\n  rpc GetX(M) returns (M);\n  rpc get_x(M) returns (M);\n}\n",
        )],
    );
    let err = rpc_codegen::configure()
        .generate(&[dir.join("clash.proto")], &[&dir])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Generate);
    assert!(
        err.to_string().contains("clash.S/GetX and clash.S/get_x"),
        "{err}"
    );
}

#[test]
fn client_or_server_only() {
    let dir = proto_dir("only", &[("echo.proto", ECHO)]);
    let files = rpc_codegen::configure()
        .build_server(false)
        .generate(&[dir.join("echo.proto")], &[&dir])
        .unwrap();
    assert!(files[0].1.contains("pub mod echo_client"));
    assert!(!files[0].1.contains("pub mod echo_server"));
    let files = rpc_codegen::configure()
        .build_client(false)
        .generate(&[dir.join("echo.proto")], &[&dir])
        .unwrap();
    assert!(!files[0].1.contains("pub mod echo_client"));
    assert!(files[0].1.contains("pub mod echo_server"));
    assert!(files[0].1.contains("pub mod echo_methods"));
}

#[test]
fn compile_writes_package_files() {
    let dir = proto_dir("compile", &[("echo.proto", ECHO)]);
    rpc_codegen::configure()
        .out_dir(dir.join("out"))
        .include_file("all.rs")
        .emit_rerun_if_changed(false)
        .compile(&[dir.join("echo.proto")], &[&dir])
        .unwrap();
    let code = std::fs::read_to_string(dir.join("out/demo.rs")).unwrap();
    assert!(code.contains("pub struct EchoClient"));
    let all = std::fs::read_to_string(dir.join("out/all.rs")).unwrap();
    assert!(all.contains("pub mod demo {"), "{all}");
}

#[test]
fn a_descriptor_set_that_cannot_be_written_is_named() {
    // A directory where the package's descriptor set goes: `demo.rs` can be written,
    // `demo.fds.bin` cannot.
    let dir = proto_dir("unwritable-set", &[("echo.proto", ECHO)]);
    std::fs::create_dir_all(dir.join("out/demo.fds.bin")).unwrap();
    let err = rpc_codegen::configure()
        .out_dir(dir.join("out"))
        .emit_rerun_if_changed(false)
        .compile(&[dir.join("echo.proto")], &[&dir])
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("cannot write the descriptor set") && message.contains("demo.fds.bin"),
        "{message}"
    );
}

/// A package too long for its files' names (255 bytes on the usual file systems) is
/// named with its position before anything is written; the file system's error named
/// neither.
#[test]
fn a_package_too_long_for_a_file_name_is_named() {
    // `<package>.rs` fits in a file name, `<package>.fds.bin` does not.
    let package = format!("p{}", "a".repeat(249));
    let proto = format!(
        "syntax = \"proto3\";\npackage {package};\nmessage M {{}}\nservice S {{ rpc Get(M) returns (M); }}\n"
    );
    let dir = proto_dir("long-package", &[("long.proto", &proto)]);
    let err = rpc_codegen::configure()
        .out_dir(dir.join("out"))
        .emit_rerun_if_changed(false)
        .compile(&[dir.join("long.proto")], &[&dir])
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("long.proto:2:1: package paaa") && message.contains("too long"),
        "{message}"
    );
    assert!(
        !dir.join("out").join(format!("{package}.rs")).exists(),
        "nothing written"
    );
}
