//! A client of server reflection (`grpc.reflection.v1.ServerReflection`, and the older
//! `grpc.reflection.v1alpha` that some servers still serve): lists services and fetches
//! the file descriptors that define a symbol, with their dependencies.
//!
//! The messages are `rpc_services::reflection::v1`'s (v1alpha's are the same on the
//! wire), sent as raw calls so that one client speaks both versions. One bidirectional
//! stream carries every request of a command, each answered by one message, as
//! grpcurl does: a stream per request would cost a server (and the client's own HTTP/2
//! bounds on streams it resets) one stream per file of a large schema.
//!
//! What a server sends is bounded: files, bytes and definitions (a descriptor of
//! 400,000 tiny messages is 9.5 MB on the wire and more than 1 GB once linked), and the
//! stream's deadline covers every request of the command.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use futures::{channel::mpsc, StreamExt};
use prost::Message;
use prost_reflect::DescriptorPool;
use prost_types::{DescriptorProto, FileDescriptorProto};
use rpc_core::{stream::RawStreaming, Code, Metadata, Payload, Status};
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

/// Most bytes of file descriptors taken from a server in one command.
const MAX_DESCRIPTOR_BYTES: usize = 32 << 20;

/// Most messages, enums and services the descriptors of one command may define (each
/// costs about a KiB decoded and a few more once linked); real schemas define a few
/// thousand. Counted on the encoded bytes, before anything is decoded.
const MAX_TYPES: usize = 20_000;

/// Most fields, enum values and methods they may define.
const MAX_MEMBERS: usize = 200_000;

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
/// speaks, and keeps one stream open for all its requests.
#[derive(Debug)]
pub struct Reflection {
    target: Target,
    metadata: Metadata,
    timeout: Duration,
    method: Option<&'static str>,
    open: Option<Open>,
    /// What the server's descriptors have cost so far, against the bounds above.
    bytes: usize,
    types: usize,
    members: usize,
}

/// The open reflection stream: each request sent is answered by one response.
struct Open {
    requests: mpsc::UnboundedSender<Payload>,
    responses: RawStreaming,
}

impl std::fmt::Debug for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Open")
    }
}

impl Reflection {
    /// A client that sends `metadata` with its stream and gives it `timeout` (every
    /// request of the command goes on that one stream, within that time).
    pub fn new(target: Target, metadata: Metadata, timeout: Duration) -> Reflection {
        Reflection {
            target,
            metadata,
            timeout,
            method: None,
            open: None,
            bytes: 0,
            types: 0,
            members: 0,
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
        for &method in methods {
            match self.ask_on(method, &request).await {
                Err(status) if status.code() == Code::UNIMPLEMENTED && self.method.is_none() => {
                    self.open = None;
                }
                Err(status) => {
                    self.open = None;
                    return Err(ReflectionError::Status(status));
                }
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
        Err(ReflectionError::NotServed)
    }

    /// Sends `request` on the stream of `method` (opened with it as its first
    /// message, so that a server that answers headers only with its first response
    /// is not waited for) and reads its response.
    async fn ask_on(
        &mut self,
        method: &'static str,
        request: &ServerReflectionRequest,
    ) -> Result<ServerReflectionResponse, Status> {
        let payload = Payload::from(Bytes::from(request.encode_to_vec()));
        let open = match &mut self.open {
            Some(open) => {
                open.requests.unbounded_send(payload).map_err(|_| {
                    Status::unavailable("the reflection stream ended before this request")
                })?;
                open
            }
            None => {
                let (requests, queued) = mpsc::unbounded();
                let _ = requests.unbounded_send(payload);
                let (_, responses) = call::open_stream(
                    &mut self.target,
                    method,
                    self.metadata.clone(),
                    Some(self.timeout),
                    Box::pin(queued),
                )
                .await?;
                self.open.insert(Open {
                    requests,
                    responses,
                })
            }
        };
        let message =
            open.responses.next().await.ok_or_else(|| {
                Status::internal("the reflection stream ended without an answer")
            })??;
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

    /// The files asked for by `request`, decoded, counted against the bounds.
    async fn files(
        &mut self,
        request: MessageRequest,
    ) -> Result<Vec<FileDescriptorProto>, ReflectionError> {
        let MessageResponse::FileDescriptorResponse(files) = self.ask(request).await? else {
            return Err(ReflectionError::Status(Status::internal(
                "a file request was answered with something else",
            )));
        };
        let mut decoded = Vec::with_capacity(files.file_descriptor_proto.len());
        for bytes in files.file_descriptor_proto {
            self.bytes += bytes.len();
            if self.bytes > MAX_DESCRIPTOR_BYTES {
                return Err(ReflectionError::BadDescriptor(format!(
                    "the server's file descriptors come to more than {} MiB, more than \
                     this CLI takes from reflection",
                    MAX_DESCRIPTOR_BYTES >> 20
                )));
            }
            // Counted before decoding: a few MB of tiny messages decode to gigabytes.
            let (types, members) = definitions(&bytes).ok_or_else(|| {
                ReflectionError::BadDescriptor(
                    "a file descriptor from reflection does not decode (malformed, or \
                     nested more than 100 deep)"
                        .to_owned(),
                )
            })?;
            self.types += types;
            self.members += members;
            if self.types > MAX_TYPES || self.members > MAX_MEMBERS {
                return Err(ReflectionError::BadDescriptor(format!(
                    "the server's file descriptors define more than {MAX_TYPES} messages, \
                     enums and services or {MAX_MEMBERS} fields, values and methods, more \
                     than this CLI takes from reflection"
                )));
            }
            let file = FileDescriptorProto::decode(bytes).map_err(|err| {
                ReflectionError::BadDescriptor(format!(
                    "a file descriptor from reflection does not decode: {err}"
                ))
            })?;
            decoded.push(file);
        }
        Ok(decoded)
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
                let fetched = self
                    .files(MessageRequest::FileByFilename(dependency.clone()))
                    .await
                    .map_err(|err| match err {
                        // Not "no such symbol": the symbol's file was found.
                        ReflectionError::Status(status) => ReflectionError::BadDescriptor(format!(
                            "{name} (which defines or leads to {symbol}) imports {dependency}, \
                             which the server's reflection does not give: {} ({})",
                            crate::exit::printable(status.message()),
                            crate::exit::code_name(status.code()),
                        )),
                        other => other,
                    })?;
                queue.extend(fetched);
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

/// The messages, enums and services (types), and the fields, enum values and methods
/// (members) that an encoded `FileDescriptorProto` defines, nested ones included, read
/// off the protobuf encoding without decoding it. `None` if it is malformed or nests
/// deeper than prost decodes (100).
fn definitions(file: &[u8]) -> Option<(usize, usize)> {
    /// What a length-delimited field of a message holds.
    #[derive(Clone, Copy)]
    enum Kind {
        File,
        Message,
        Enum,
        Service,
    }
    fn scan(mut bytes: &[u8], kind: Kind, depth: u32, counts: &mut (usize, usize)) -> Option<()> {
        use prost::encoding::{decode_key, decode_varint, WireType};
        if depth > 100 {
            return None;
        }
        while !bytes.is_empty() {
            let (tag, wire_type) = decode_key(&mut bytes).ok()?;
            match wire_type {
                WireType::Varint => {
                    decode_varint(&mut bytes).ok()?;
                }
                WireType::SixtyFourBit => bytes = bytes.get(8..)?,
                WireType::ThirtyTwoBit => bytes = bytes.get(4..)?,
                WireType::LengthDelimited => {
                    let len = usize::try_from(decode_varint(&mut bytes).ok()?).ok()?;
                    let (inner, rest) = (bytes.get(..len)?, bytes.get(len..)?);
                    bytes = rest;
                    let nested = match (kind, tag) {
                        (Kind::File, 4) | (Kind::Message, 3) => Some(Kind::Message),
                        (Kind::File, 5) | (Kind::Message, 4) => Some(Kind::Enum),
                        (Kind::File, 6) => Some(Kind::Service),
                        // Fields, extensions, enum values, methods.
                        (Kind::File, 7)
                        | (Kind::Message, 2 | 6)
                        | (Kind::Enum, 2)
                        | (Kind::Service, 2) => {
                            counts.1 += 1;
                            None
                        }
                        _ => None,
                    };
                    if let Some(nested) = nested {
                        counts.0 += 1;
                        scan(inner, nested, depth + 1, counts)?;
                    }
                }
                WireType::StartGroup | WireType::EndGroup => return None,
            }
        }
        Some(())
    }
    let mut counts = (0, 0);
    scan(file, Kind::File, 0, &mut counts)?;
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{
        EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto, MethodDescriptorProto,
        ServiceDescriptorProto,
    };

    #[test]
    fn definitions_are_counted_on_the_encoding() {
        let field = FieldDescriptorProto::default;
        let enum_ = EnumDescriptorProto {
            value: vec![EnumValueDescriptorProto::default(); 3],
            ..Default::default()
        };
        let inner = DescriptorProto {
            field: vec![field(); 2],
            enum_type: vec![enum_.clone()],
            ..Default::default()
        };
        let file = FileDescriptorProto {
            name: Some("a.proto".into()),
            message_type: vec![DescriptorProto {
                field: vec![field()],
                nested_type: vec![inner.clone(), inner],
                extension: vec![field()],
                ..Default::default()
            }],
            enum_type: vec![enum_],
            service: vec![ServiceDescriptorProto {
                method: vec![MethodDescriptorProto::default(); 4],
                ..Default::default()
            }],
            extension: vec![field()],
            ..Default::default()
        };
        // Types: 3 messages, 3 enums, 1 service. Members: 1 + 2×2 fields, 2 extensions,
        // 3×3 values, 4 methods.
        assert_eq!(definitions(&file.encode_to_vec()), Some((7, 20)));
        assert_eq!(definitions(&[0x22, 0x05, 0x00]), None, "truncated");
        // Nested past 100: refused, as prost would refuse to decode it.
        let mut deep = DescriptorProto::default();
        for _ in 0..101 {
            deep = DescriptorProto {
                nested_type: vec![deep],
                ..Default::default()
            };
        }
        let deep = FileDescriptorProto {
            message_type: vec![deep],
            ..Default::default()
        };
        assert_eq!(definitions(&deep.encode_to_vec()), None);
    }
}
