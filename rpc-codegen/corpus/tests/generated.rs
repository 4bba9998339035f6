//! Uses generated clients, server traits and descriptors of the corpus the way an
//! application would: the dispatcher of a generated server is driven with hand-made
//! calls, without a network.
#![cfg(corpus)]

use rpc_codegen_corpus::google::longrunning::{
    CancelOperationRequest, GetOperationRequest, ListOperationsRequest, ListOperationsResponse,
    Operation, WaitOperationRequest,
};
use rpc_codegen_corpus::{
    etcdserverpb::kv_methods,
    google::longrunning::{operations_server, DeleteOperationRequest},
    grpc::{
        health::v1::{
            health_check_response::ServingStatus,
            health_client::HealthClient,
            health_methods,
            health_server::{Health, HealthServer},
            HealthCheckRequest, HealthCheckResponse, HealthListRequest, HealthListResponse,
        },
        testing::test_service_methods,
    },
};
use rpc_core::{
    codegen::{MethodDescriptor, NamedService, ServerCall, Service},
    method::Idempotency,
    ByteStr, Code, Metadata, Request, Response, Status,
};

/// A health service that knows one service name.
struct OneService;

impl Health for OneService {
    type WatchStream =
        futures::stream::Iter<std::vec::IntoIter<Result<HealthCheckResponse, Status>>>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let status = if request.get_ref().service == "known" {
            ServingStatus::Serving
        } else {
            ServingStatus::ServiceUnknown
        };
        Ok(Response::new(futures::stream::iter(vec![Ok(
            HealthCheckResponse {
                status: status.into(),
            },
        )])))
    }

    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if request.get_ref().service == "known" {
            Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving.into(),
            }))
        } else {
            Err(Status::not_found(format!(
                "no service {:?}",
                request.get_ref().service
            )))
        }
    }

    async fn list(
        &self,
        _request: Request<HealthListRequest>,
    ) -> Result<Response<HealthListResponse>, Status> {
        Err(Status::unimplemented("list"))
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

/// Only has to compile: a generated client over the real channel type, called with a
/// bare message and with a `Request`.
#[allow(dead_code)]
async fn health_client_over_channel(mut client: HealthClient) -> Result<ServingStatus, Status> {
    let reply = client
        .check(HealthCheckRequest {
            service: "x".into(),
        })
        .await?;
    let _ = client
        .check(Request::new(HealthCheckRequest::default()))
        .await?;
    Ok(reply.into_inner().status())
}

#[test]
fn descriptors() {
    assert_eq!(
        health_methods::CHECK,
        MethodDescriptor {
            service: "grpc.health.v1.Health",
            method: "Check",
            path: "grpc.health.v1.Health/Check",
            idempotency: Idempotency::Unknown,
        }
    );
    // `Watch` is server-streaming, and generated too.
    let paths: Vec<&str> = health_methods::ALL.iter().map(|m| m.path).collect();
    assert_eq!(
        paths,
        [
            "grpc.health.v1.Health/Check",
            "grpc.health.v1.Health/List",
            "grpc.health.v1.Health/Watch"
        ]
    );
    assert_eq!(kv_methods::RANGE.path, "etcdserverpb.KV/Range");
    assert_eq!(kv_methods::RANGE.idempotency, Idempotency::Unknown);
    assert_eq!(
        kv_methods::ALL.iter().map(|m| m.method).collect::<Vec<_>>(),
        [
            "Range",
            "RangeStream",
            "Put",
            "DeleteRange",
            "Txn",
            "Compact"
        ]
    );
    let testing: Vec<&str> = test_service_methods::ALL.iter().map(|m| m.method).collect();
    assert_eq!(
        testing,
        [
            "EmptyCall",
            "UnaryCall",
            "CacheableUnaryCall",
            "StreamingOutputCall",
            "StreamingInputCall",
            "FullDuplexCall",
            "HalfDuplexCall",
            "UnimplementedCall"
        ]
    );
    assert_eq!(
        <HealthServer<OneService> as NamedService>::NAME,
        "grpc.health.v1.Health"
    );
}

#[tokio::test]
async fn server_dispatches_to_the_trait() {
    let mut server = HealthServer::new(OneService);

    let request = HealthCheckRequest {
        service: "known".into(),
    };
    let reply = server
        .call(call("grpc.health.v1.Health/Check", encode(&request)))
        .await
        .unwrap();
    let response = <HealthCheckResponse as rpc_core::codegen::prost::Message>::decode(
        reply.payload.to_bytes(),
    )
    .unwrap();
    assert_eq!(response.status(), ServingStatus::Serving);

    let request = HealthCheckRequest {
        service: "other".into(),
    };
    let status = server
        .call(call("grpc.health.v1.Health/Check", encode(&request)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NOT_FOUND);

    let status = server
        .call(call("grpc.health.v1.Health/Watch", encode(&request)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNIMPLEMENTED);

    let status = server
        .call(call("grpc.health.v1.Health/Check", vec![0xff, 0xff].into()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::INTERNAL);
}

/// `google.protobuf.Empty` maps to `()`, both as a response and in the trait.
struct NoOperations;

impl operations_server::Operations for NoOperations {
    async fn list_operations(
        &self,
        _request: Request<ListOperationsRequest>,
    ) -> Result<Response<ListOperationsResponse>, Status> {
        Ok(Response::new(ListOperationsResponse::default()))
    }

    async fn get_operation(
        &self,
        _request: Request<GetOperationRequest>,
    ) -> Result<Response<Operation>, Status> {
        Err(Status::not_found("none"))
    }

    async fn delete_operation(
        &self,
        request: Request<DeleteOperationRequest>,
    ) -> Result<Response<()>, Status> {
        if request.get_ref().name.is_empty() {
            Err(Status::invalid_argument("no name"))
        } else {
            Ok(Response::new(()))
        }
    }

    async fn cancel_operation(
        &self,
        _request: Request<CancelOperationRequest>,
    ) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }

    async fn wait_operation(
        &self,
        _request: Request<WaitOperationRequest>,
    ) -> Result<Response<Operation>, Status> {
        Err(Status::not_found("none"))
    }
}

#[tokio::test]
async fn empty_responses() {
    let mut server = operations_server::OperationsServer::new(NoOperations);
    let request = DeleteOperationRequest { name: "op".into() };
    let reply = server
        .call(call(
            "google.longrunning.Operations/DeleteOperation",
            encode(&request),
        ))
        .await
        .unwrap();
    assert!(reply.payload.is_empty());
}

/// A message encoded as one contiguous buffer, as a received request is.
fn encode<M: rpc_core::codegen::prost::Message>(message: &M) -> rpc_core::bytes::Bytes {
    rpc_core::payload::encode(message).to_bytes()
}
