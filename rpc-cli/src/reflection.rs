//! A client of server reflection (`grpc.reflection.v1.ServerReflection`, and the older
//! `grpc.reflection.v1alpha` that some servers still serve): lists services and fetches
//! the file descriptors that define a symbol, with their dependencies.
//!
//! The messages are `rpc_services::reflection::v1`'s (v1alpha's are the same on the
//! wire), sent as raw calls so that one client speaks both versions: each request is
//! one message on a bidirectional stream, answered by one message.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use prost::Message;
use prost_reflect::DescriptorPool;
use prost_types::FileDescriptorProto;
use rpc_core::{Code, Metadata, Status};
use rpc_services::reflection::v1::{
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    ServerReflectionRequest, ServerReflectionResponse,
};

use crate::{call, target::Target};

/// The method of the current protocol.
pub const V1: &str = "grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
/// The method of the pre-release protocol (same messages).
pub const V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

/// Most files fetched for one symbol (its transitive dependencies): bounds what a
/// hostile server can make the CLI fetch.
const MAX_FILES: usize = 10_000;

/// Why reflection could not answer.
#[derive(Debug)]
pub enum ReflectionError {
    /// The server serves neither `grpc.reflection.v1` nor `v1alpha`.
    NotServed,
    /// The call failed, or the server answered with an error.
    Status(Status),
    /// A descriptor the server sent does not parse or does not link.
    BadDescriptor(String),
}

/// A reflection client on a target: remembers which protocol version the server
/// speaks.
#[derive(Debug)]
pub struct Reflection {
    target: Target,
    metadata: Metadata,
    timeout: Duration,
    method: Option<&'static str>,
}

impl Reflection {
    /// A client that sends `metadata` with each request and gives each `timeout`.
    pub fn new(target: Target, metadata: Metadata, timeout: Duration) -> Reflection {
        Reflection {
            target,
            metadata,
            timeout,
            method: None,
        }
    }

    /// One request, one response; tries v1 then v1alpha the first time.
    async fn ask(&mut self, request: MessageRequest) -> Result<MessageResponse, ReflectionError> {
        let request = ServerReflectionRequest {
            message_request: Some(request),
            ..Default::default()
        };
        let methods: &[&'static str] = match self.method {
            Some(method) => &[method][..],
            None => &[V1, V1ALPHA],
        };
        let mut last = None;
        for &method in methods {
            match self.ask_once(method, &request).await {
                Err(status) if status.code() == Code::UNIMPLEMENTED && self.method.is_none() => {
                    last = Some(status);
                }
                Err(status) => return Err(ReflectionError::Status(status)),
                Ok(response) => {
                    self.method = Some(method);
                    return match response.message_response {
                        Some(MessageResponse::ErrorResponse(error)) => {
                            Err(ReflectionError::Status(Status::new(
                                Code::from_u32(error.error_code as u32),
                                error.error_message,
                            )))
                        }
                        Some(response) => Ok(response),
                        None => Err(ReflectionError::Status(Status::internal(
                            "an empty reflection response",
                        ))),
                    };
                }
            }
        }
        let _ = last;
        Err(ReflectionError::NotServed)
    }

    async fn ask_once(
        &mut self,
        method: &'static str,
        request: &ServerReflectionRequest,
    ) -> Result<ServerReflectionResponse, Status> {
        let payload = Bytes::from(request.encode_to_vec());
        let messages = futures::stream::iter([rpc_core::Payload::from(payload)]);
        let (_, mut responses) = call::open_stream(
            &mut self.target,
            method,
            self.metadata.clone(),
            Some(self.timeout),
            Box::pin(messages),
        )
        .await?;
        use futures::StreamExt;
        let message = responses
            .next()
            .await
            .ok_or_else(|| Status::internal("the reflection stream ended without an answer"))??;
        ServerReflectionResponse::decode(message).map_err(|err| {
            Status::internal(format!("a reflection response does not decode: {err}"))
        })
    }

    /// The services the server serves, by full name.
    pub async fn list_services(&mut self) -> Result<Vec<String>, ReflectionError> {
        match self
            .ask(MessageRequest::ListServices(String::new()))
            .await?
        {
            MessageResponse::ListServicesResponse(list) => {
                let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
                names.sort();
                Ok(names)
            }
            _ => Err(ReflectionError::Status(Status::internal(
                "list_services was answered with something else",
            ))),
        }
    }

    /// The files asked for by `request`, decoded.
    async fn files(
        &mut self,
        request: MessageRequest,
    ) -> Result<Vec<FileDescriptorProto>, ReflectionError> {
        match self.ask(request).await? {
            MessageResponse::FileDescriptorResponse(files) => files
                .file_descriptor_proto
                .into_iter()
                .map(|bytes| {
                    FileDescriptorProto::decode(bytes).map_err(|err| {
                        ReflectionError::BadDescriptor(format!(
                            "a file descriptor from reflection does not decode: {err}"
                        ))
                    })
                })
                .collect(),
            _ => Err(ReflectionError::Status(Status::internal(
                "a file request was answered with something else",
            ))),
        }
    }

    /// Adds to `pool` the file defining `symbol` and every file it depends on that the
    /// pool lacks (fetched by name; the well-known types come with the CLI).
    pub async fn add_symbol(
        &mut self,
        pool: &mut DescriptorPool,
        symbol: &str,
    ) -> Result<(), ReflectionError> {
        let first = self
            .files(MessageRequest::FileContainingSymbol(symbol.to_owned()))
            .await?;
        let mut files: BTreeMap<String, FileDescriptorProto> = BTreeMap::new();
        let mut queue = first;
        while let Some(file) = queue.pop() {
            let name = file.name().to_owned();
            if files.contains_key(&name) || pool.get_file_by_name(&name).is_some() {
                continue;
            }
            for dependency in &file.dependency {
                if files.contains_key(dependency) || pool.get_file_by_name(dependency).is_some() {
                    continue;
                }
                if queue.iter().any(|f| f.name() == dependency) {
                    continue;
                }
                if files.len() + queue.len() > MAX_FILES {
                    return Err(ReflectionError::BadDescriptor(format!(
                        "{symbol} depends on more than {MAX_FILES} files"
                    )));
                }
                queue.extend(
                    self.files(MessageRequest::FileByFilename(dependency.clone()))
                        .await?,
                );
            }
            files.insert(name, file);
        }
        pool.add_file_descriptor_protos(files.into_values())
            .map_err(|err| {
                ReflectionError::BadDescriptor(format!(
                    "the descriptors of {symbol} from reflection do not link: {err}"
                ))
            })
    }
}
