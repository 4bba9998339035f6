//! `proto/edge_cases.proto`: message names that shadow `rpc_core`'s, keyword and
//! clashing method names, `google.protobuf.Empty`, a service without methods.

use rpc_codegen_corpus::edge::cases::{
    nothing_methods, nothing_server::NothingServer, type_client::TypeClient, type_methods,
    type_server::TypeServer, Request, Response, Status,
};
use rpc_core::{
    codegen::{prost::Message, ServerCall, Service},
    method::Idempotency,
    ByteStr, Code, Metadata,
};

/// Implements the generated trait with the generated `Request`, `Status` and `Response`
/// messages next to `rpc_core`'s types of the same names.
struct Impl;

impl rpc_codegen_corpus::edge::cases::type_server::Type for Impl {
    // A generated `Response` message next to rpc_core's `Response`, in a stream type.
    type WatchStream = futures::stream::BoxStream<'static, Result<Response, rpc_core::Status>>;

    async fn watch(
        &self,
        request: rpc_core::Request<rpc_core::codegen::Streaming<Request>>,
    ) -> Result<rpc_core::Response<Self::WatchStream>, rpc_core::Status> {
        use futures::StreamExt;
        let answers = request
            .into_inner()
            .map(|item| item.map(|_request: Request| Response::default()));
        Ok(rpc_core::Response::new(answers.boxed()))
    }

    async fn r#type(
        &self,
        request: rpc_core::Request<Request>,
    ) -> Result<rpc_core::Response<Status>, rpc_core::Status> {
        Ok(rpc_core::Response::new(Status {
            code: request.into_inner().name.len() as i32,
            at: Some(rpc_core::codegen::prost_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
        }))
    }

    async fn self_(
        &self,
        _request: rpc_core::Request<()>,
    ) -> Result<rpc_core::Response<()>, rpc_core::Status> {
        Ok(rpc_core::Response::new(()))
    }

    async fn new(
        &self,
        _request: rpc_core::Request<Request>,
    ) -> Result<rpc_core::Response<Response>, rpc_core::Status> {
        Err(rpc_core::Status::unimplemented("new"))
    }

    async fn clone(
        &self,
        _request: rpc_core::Request<Request>,
    ) -> Result<rpc_core::Response<Response>, rpc_core::Status> {
        Err(rpc_core::Status::unimplemented("clone"))
    }

    async fn all(
        &self,
        _request: rpc_core::Request<Request>,
    ) -> Result<rpc_core::Response<Response>, rpc_core::Status> {
        Err(rpc_core::Status::unimplemented("all"))
    }
}

fn call(method: &'static str, payload: rpc_core::codegen::Bytes) -> ServerCall {
    ServerCall {
        method: ByteStr::from(method),
        metadata: Metadata::new(),
        timeout: None,
        payload,
        stream: None,
        compressed: false,
        received: None,
        bulk: None,
        peer: None,
        principal: None,
        extensions: Default::default(),
    }
}

/// Only has to compile: the renamed client methods.
#[allow(dead_code)]
async fn client_methods(mut client: TypeClient) -> Result<(), rpc_core::Status> {
    let copy = client.clone();
    client.r#type(Request::default()).await?;
    client.self_(()).await?;
    client.new_(Request::default()).await?;
    client.clone_(Request::default()).await?;
    client.all(Request::default()).await?;
    drop(copy);
    Ok(())
}

#[test]
fn descriptors() {
    assert_eq!(type_methods::TYPE.path, "edge.cases.Type/type");
    assert_eq!(type_methods::TYPE.idempotency, Idempotency::NoSideEffects);
    assert_eq!(type_methods::SELF.path, "edge.cases.Type/Self");
    assert_eq!(type_methods::SELF.idempotency, Idempotency::Idempotent);
    assert_eq!(type_methods::NEW.idempotency, Idempotency::Unknown);
    assert_eq!(type_methods::ALL_METHOD.method, "All");
    assert_eq!(
        type_methods::ALL
            .iter()
            .map(|m| m.method)
            .collect::<Vec<_>>(),
        ["type", "Self", "New", "Clone", "All", "Watch"]
    );
    assert!(nothing_methods::ALL.is_empty());
}

#[tokio::test]
async fn dispatch() {
    let mut server = TypeServer::new(Impl);
    let reply = server
        .call(call(
            "edge.cases.Type/type",
            encode(&Request {
                name: "four".into(),
            }),
        ))
        .await
        .unwrap();
    let status = Status::decode(reply.payload.to_bytes()).unwrap();
    assert_eq!(status.code, 4);
    assert_eq!(status.at.unwrap().seconds, 1);

    let reply = server
        .call(call("edge.cases.Type/Self", encode(&())))
        .await
        .unwrap();
    assert!(reply.payload.is_empty());

    let status = server
        .call(call("edge.cases.Type/Watch", encode(&())))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNIMPLEMENTED);

    let mut nothing = NothingServer::new(Impl);
    let status = nothing
        .call(call("edge.cases.Nothing/Any", encode(&())))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNIMPLEMENTED);
}

impl rpc_codegen_corpus::edge::cases::nothing_server::Nothing for Impl {}

/// A message encoded as one contiguous buffer, as a received request is.
fn encode<M: rpc_core::codegen::prost::Message>(message: &M) -> rpc_core::bytes::Bytes {
    rpc_core::payload::encode(message).to_bytes()
}
