//! Generates the tonic client and server of the `bench.Echo` service with
//! `tonic_build::manual`: no `.proto` file, so no `protoc` binary is needed. The
//! message type is hand-written in `src/tonic_subject.rs` with prost's derive, as
//! `prost-build` would generate it from
//!
//! ```proto
//! syntax = "proto3";
//! package bench;
//! message EchoMessage { bytes payload = 1; }
//! service Echo { rpc Echo(EchoMessage) returns (EchoMessage); }
//! ```
//!
//! (with `bytes` fields as `bytes::Bytes`).

fn main() {
    let echo = tonic_build::manual::Service::builder()
        .name("Echo")
        .package("bench")
        .method(
            tonic_build::manual::Method::builder()
                .name("echo")
                .route_name("Echo")
                .input_type("crate::tonic_subject::EchoMessage")
                .output_type("crate::tonic_subject::EchoMessage")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new().compile(&[echo]);
    println!("cargo:rerun-if-changed=build.rs");
}
