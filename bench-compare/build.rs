//! Generates tonic clients and servers with `tonic_build::manual`: no `.proto` file is
//! compiled, so no `protoc` binary is needed. The message types are hand-written with
//! prost's derive, as `prost-build` would generate them.
//!
//! - `bench.Echo` (the benchmark's tonic subject, `src/tonic_subject.rs`):
//!
//!   ```proto
//!   syntax = "proto3";
//!   package bench;
//!   message EchoMessage { bytes payload = 1; }
//!   service Echo { rpc Echo(EchoMessage) returns (EchoMessage); }
//!   ```
//!
//!   (with `bytes` fields as `bytes::Bytes`).
//! - `rpc.examples.v1.Echo` (the interop tests, `tests/tonic_interop.rs`): the service
//!   of `../proto/proto/rpc/examples/v1/echo.proto`, every method, with its messages
//!   in the test's `pb` module.

use tonic_build::manual::{Builder, Method, Service};

/// The methods of `rpc.examples.v1.Echo`: the name in Rust, the name on the wire,
/// the message types (in the interop test's `pb` module), and whether the client and
/// the server stream.
const EXAMPLE_METHODS: [(&str, &str, &str, &str, bool, bool); 6] = [
    ("say", "Say", "SayRequest", "SayReply", false, false),
    ("sleep", "Sleep", "SleepRequest", "SleepReply", false, false),
    ("fail", "Fail", "FailRequest", "FailReply", false, false),
    ("count", "Count", "CountRequest", "CountReply", false, true),
    ("sum", "Sum", "SumRequest", "SumReply", true, false),
    ("chat", "Chat", "SayRequest", "SayReply", true, true),
];

fn main() {
    let echo = Service::builder()
        .name("Echo")
        .package("bench")
        .method(
            Method::builder()
                .name("echo")
                .route_name("Echo")
                .input_type("crate::tonic_subject::EchoMessage")
                .output_type("crate::tonic_subject::EchoMessage")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .build();
    let mut example = Service::builder().name("Echo").package("rpc.examples.v1");
    for (name, route, input, output, client_streaming, server_streaming) in EXAMPLE_METHODS {
        let mut method = Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::pb::{input}"))
            .output_type(format!("crate::pb::{output}"))
            .codec_path("tonic_prost::ProstCodec");
        if client_streaming {
            method = method.client_streaming();
        }
        if server_streaming {
            method = method.server_streaming();
        }
        example = example.method(method.build());
    }
    let example = example.build();
    Builder::new().compile(&[echo, example]);
    println!("cargo:rerun-if-changed=build.rs");
}
