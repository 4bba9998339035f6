//! gRPC server reflection: `grpc.reflection.v1.ServerReflection` and the older
//! `grpc.reflection.v1alpha.ServerReflection` (which many clients still try first),
//! so that `grpcurl`, `grpc_cli`, Postman or Python's `grpcio-reflection` can list a
//! server's services and fetch their `.proto` descriptors (comments included).
//!
//! One line turns it on for every service a [`ServerBuilder`] was given:
//!
//! ```
//! use rpc_core::server::Server;
//! use rpc_services::{health::HealthReporter, ServerBuilderExt};
//!
//! let health = HealthReporter::new();
//! let server = Server::builder()
//!     .add_service(health.service()) // and your own: .add_service(EchoServer::new(..))
//!     .add_reflection() // last: it describes the services added before it
//!     .build();
//! # drop(server);
//! ```
//!
//! Generated services carry their descriptors (`rpc-codegen` embeds each package's
//! `FileDescriptorSet`, see `NamedService::FILE_DESCRIPTOR_SET`); a hand-written service
//! added with `add_named_service` is listed by name only. For those, build the service
//! from descriptor sets with [`Reflection::builder`].
//!
//! # What it answers
//!
//! On one bidirectional stream, each request in turn (the stream reads the next
//! request only after its answer is taken):
//!
//! - `list_services`: the services listed (for [`add_reflection`]: exactly those added
//!   to the builder, and the two reflection services);
//! - `file_by_filename` (`rpc/examples/v1/echo.proto`) and `file_containing_symbol`
//!   (packages, services, methods, messages and nested messages, fields, oneofs,
//!   enums, enum values, extensions, by their full name: `rpc.examples.v1.Echo.Say`);
//!   `file_containing_extension` (the extended message's full name and the field
//!   number): the file, then every file it imports, directly or not, except those
//!   this stream has sent already;
//! - `all_extension_numbers_of_type`: the extension numbers of a message type that
//!   the known files declare;
//! - anything unknown: an `error_response` with `NOT_FOUND` (`INVALID_ARGUMENT` for an
//!   empty request), and the stream goes on.
//!
//! It is a service like any other, so it works over every wire a server serves
//! (`tcp://`, `unix://`, `tls://`, `udp://`, `rdma://`, `grpc://`), and the server's
//! layers (authentication, say) apply to it. Requests are bounded by the server's
//! frame limit like every call's.
//!
//! [`ServerBuilder`]: rpc_core::server::ServerBuilder
//! [`add_reflection`]: ServerBuilderExt::add_reflection

mod index;
mod service;

use std::{collections::HashSet, fmt, sync::Arc};

use bytes::Bytes;
use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use rpc_core::{
    codegen::NamedService,
    server::{ServerBuilder, ServerCall, ServerReply},
    Status,
};
use tower::{Layer, Service};

use index::Index;

/// Everything generated for `grpc.reflection.v1`: the client a tool uses
/// (`v1::server_reflection_client::ServerReflectionClient`), the messages, and the
/// server.
#[allow(missing_docs, unreachable_pub)]
pub mod v1 {
    rpc_core::include_proto!("grpc.reflection.v1");
}

/// Everything generated for `grpc.reflection.v1alpha` (deprecated upstream in favour
/// of [`v1`], with the same messages).
#[allow(missing_docs, unreachable_pub, deprecated)]
pub mod v1alpha {
    rpc_core::include_proto!("grpc.reflection.v1alpha");
}

/// The `grpc.reflection.v1` service, serving a [`Reflection`].
pub type ReflectionV1Server = v1::server_reflection_server::ServerReflectionServer<Reflection>;

/// The `grpc.reflection.v1alpha` service, serving a [`Reflection`].
pub type ReflectionV1AlphaServer =
    v1alpha::server_reflection_server::ServerReflectionServer<Reflection>;

/// The names of the two reflection services, which every [`Reflection`] lists.
pub const SERVICE_NAMES: [&str; 2] = [
    <ReflectionV1Server as NamedService>::NAME,
    <ReflectionV1AlphaServer as NamedService>::NAME,
];

/// What server reflection answers from: descriptors and the names of the services to
/// list. Cheap to clone; add it with [`v1`](Self::v1) and [`v1alpha`](Self::v1alpha),
/// or let [`ServerBuilderExt::add_reflection`] do all of it.
#[derive(Clone)]
pub struct Reflection {
    index: Arc<Index>,
}

impl fmt::Debug for Reflection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reflection")
            .field("services", &self.index.services())
            .finish_non_exhaustive()
    }
}

impl Reflection {
    /// A builder for descriptors given by hand (hand-written services, descriptors
    /// from `protoc --descriptor_set_out`).
    ///
    /// ```
    /// use rpc_services::reflection::Reflection;
    /// # fn f(descriptor_set: &[u8]) -> Result<(), rpc_services::reflection::ReflectionError> {
    /// let reflection = Reflection::builder()
    ///     .register_encoded_file_descriptor_set(descriptor_set)?
    ///     .build();
    /// // Server::builder().add_service(reflection.v1()).add_service(reflection.v1alpha())
    /// # drop(reflection); Ok(()) }
    /// ```
    pub fn builder() -> ReflectionBuilder {
        ReflectionBuilder::default()
    }

    /// Reflection over services as a [`ServerBuilder`] recorded them (see
    /// [`ServerBuilder::services`]): each listed by name, described by its descriptor
    /// set. A set that does not decode is left out with a warning (generated ones
    /// always decode); its services are still listed.
    pub fn for_services<'a, 'b>(
        services: impl IntoIterator<Item = (&'a str, &'b [u8])>,
    ) -> Reflection {
        let mut builder = Reflection::builder();
        // Services of one package share one set: decode each once.
        let mut decoded: HashSet<(*const u8, usize)> = HashSet::new();
        for (name, set) in services {
            builder = builder.service_name(name);
            if set.is_empty() || !decoded.insert((set.as_ptr(), set.len())) {
                continue;
            }
            match builder.add_encoded(set) {
                Ok(()) => {}
                Err(err) => {
                    tracing::warn!(
                    service = name,
                    "server reflection: the descriptors of {name} do not decode ({err}): left out"
                    );
                }
            }
        }
        builder.build()
    }

    /// The `grpc.reflection.v1` service.
    pub fn v1(&self) -> ReflectionV1Server {
        v1::server_reflection_server::ServerReflectionServer::new(self.clone())
    }

    /// The `grpc.reflection.v1alpha` service.
    pub fn v1alpha(&self) -> ReflectionV1AlphaServer {
        v1alpha::server_reflection_server::ServerReflectionServer::new(self.clone())
    }

    /// The service names `list_services` answers, in order.
    pub fn services(&self) -> impl Iterator<Item = &str> + '_ {
        self.index.services().iter().map(String::as_str)
    }
}

/// Builds a [`Reflection`] from descriptor sets (see [`Reflection::builder`]).
#[derive(Debug, Default)]
pub struct ReflectionBuilder {
    /// Each file, and its encoding as given (which keeps the extension options, custom
    /// options and `google.api.http` among them, that `prost_types` drops).
    files: Vec<(FileDescriptorProto, Bytes)>,
    services: Vec<String>,
}

impl ReflectionBuilder {
    /// Adds the files of an encoded `google.protobuf.FileDescriptorSet` (what
    /// `NamedService::FILE_DESCRIPTOR_SET` and `protoc --descriptor_set_out` give).
    /// A file already known by name is kept as first added.
    ///
    /// # Errors
    ///
    /// [`ReflectionError`] if `bytes` is not an encoded `FileDescriptorSet`.
    pub fn register_encoded_file_descriptor_set(
        mut self,
        bytes: &[u8],
    ) -> Result<Self, ReflectionError> {
        self.add_encoded(bytes).map_err(ReflectionError)?;
        Ok(self)
    }

    /// Adds the files of a `FileDescriptorSet`. A file already known by name is kept
    /// as first added. (Extension options the set held in its encoding are gone from
    /// a decoded `prost_types` set: register the encoded set to serve them.)
    pub fn register_file_descriptor_set(mut self, set: FileDescriptorSet) -> Self {
        self.add_decoded(set);
        self
    }

    /// Adds the files of an encoded set, each with its own bytes as given. Nothing is
    /// added if the set does not decode.
    fn add_encoded(&mut self, set: &[u8]) -> Result<(), prost::DecodeError> {
        match files_of(set) {
            Some(files) => self.files.extend(files),
            // A set from an unusual encoder, or none: read the lossy way, which
            // also says what is wrong.
            None => self.add_decoded(FileDescriptorSet::decode(set)?),
        }
        Ok(())
    }

    /// Adds the files of a decoded set, each encoded again.
    fn add_decoded(&mut self, set: FileDescriptorSet) {
        self.files.extend(set.file.into_iter().map(|file| {
            let encoded = Bytes::from(file.encode_to_vec());
            (file, encoded)
        }));
    }

    /// Lists `name` (`package.Service`). Without any, every service of the registered
    /// files is listed. The reflection services are always listed.
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.services.push(name.into());
        self
    }

    /// Finishes: the index of every symbol is built here, once.
    pub fn build(mut self) -> Reflection {
        // Reflection describes itself too, as grpc-go's does.
        for set in [v1::FILE_DESCRIPTOR_SET, v1alpha::FILE_DESCRIPTOR_SET] {
            let _ = self.add_encoded(set);
        }
        let mut services = self.services;
        if services.is_empty() {
            services = self
                .files
                .iter()
                .flat_map(|(file, _)| {
                    file.service
                        .iter()
                        .map(move |service| qualified(file.package(), service.name()))
                })
                .collect();
        }
        services.extend(SERVICE_NAMES.iter().map(|name| name.to_string()));
        let mut seen = HashSet::new();
        services.retain(|name| seen.insert(name.clone()));
        Reflection {
            index: Arc::new(Index::new(self.files, services)),
        }
    }
}

/// The files of an encoded `FileDescriptorSet`, each with its bytes as they are in
/// the set; `None` unless the set is only `file` fields that decode.
fn files_of(set: &[u8]) -> Option<Vec<(FileDescriptorProto, Bytes)>> {
    let mut files = Vec::new();
    let mut rest = set;
    while !rest.is_empty() {
        // Field 1 (`file`), length-delimited: a set's only field.
        if prost::encoding::decode_varint(&mut rest).ok()? != (1 << 3) | 2 {
            return None;
        }
        let len = usize::try_from(prost::encoding::decode_varint(&mut rest).ok()?).ok()?;
        let body = rest.get(..len)?;
        rest = &rest[len..];
        files.push((
            FileDescriptorProto::decode(body).ok()?,
            Bytes::copy_from_slice(body),
        ));
    }
    Some(files)
}

/// `package.Service`.
fn qualified(package: &str, name: &str) -> String {
    if package.is_empty() {
        name.to_owned()
    } else {
        format!("{package}.{name}")
    }
}

/// Bytes given as a descriptor set that do not decode as one.
#[derive(Debug)]
pub struct ReflectionError(prost::DecodeError);

impl fmt::Display for ReflectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an encoded FileDescriptorSet: {}", self.0)
    }
}

impl std::error::Error for ReflectionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Server reflection in one call on a [`ServerBuilder`].
pub trait ServerBuilderExt: Sized {
    /// Adds `grpc.reflection.v1.ServerReflection` and
    /// `grpc.reflection.v1alpha.ServerReflection`, describing every service added so
    /// far (call it after them): [`Reflection::for_services`] of
    /// [`ServerBuilder::services`]. Both reflection services list themselves too.
    fn add_reflection(self) -> Self;
}

impl<L> ServerBuilderExt for ServerBuilder<L>
where
    L: Layer<ReflectionV1Server> + Layer<ReflectionV1AlphaServer>,
    <L as Layer<ReflectionV1Server>>::Service:
        Service<ServerCall, Response = ServerReply, Error = Status> + Clone + Send + Sync + 'static,
    <<L as Layer<ReflectionV1Server>>::Service as Service<ServerCall>>::Future: Send + 'static,
    <L as Layer<ReflectionV1AlphaServer>>::Service:
        Service<ServerCall, Response = ServerReply, Error = Status> + Clone + Send + Sync + 'static,
    <<L as Layer<ReflectionV1AlphaServer>>::Service as Service<ServerCall>>::Future: Send + 'static,
{
    fn add_reflection(self) -> Self {
        let reflection = Reflection::for_services(self.services());
        self.add_service(reflection.v1())
            .add_service(reflection.v1alpha())
    }
}

/// The encoded descriptor set `rpc-codegen` makes of package `set` (`pkg.fds.bin`)
/// from `files` (name, text), the first being the root: what generated code embeds.
#[cfg(test)]
fn descriptor_set(files: &[(&str, &str)], set: &str) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "rpc-services-{}-{}",
        files[0].0,
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let sets = rpc_codegen::configure()
        .descriptor_sets(&[files[0].0], &[&dir])
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    sets.into_iter()
        .find(|(name, _)| name == set)
        .map(|(_, bytes)| bytes)
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::{Reflection, SERVICE_NAMES};
    use crate::{
        health::v1 as health,
        reflection::{
            index::Sent,
            v1::{
                server_reflection_request::MessageRequest,
                server_reflection_response::MessageResponse, ServerReflectionRequest,
            },
        },
    };

    /// A file is served as it was registered encoded: with its custom options
    /// (extension options, `google.api.http` among them), which decoding into
    /// `prost_types` would drop.
    #[test]
    fn files_are_served_with_their_custom_options() {
        let set = super::descriptor_set(
            &[(
                "opts.proto",
                "syntax = \"proto3\";\npackage opts;\nimport \"google/protobuf/descriptor.proto\";\n\
                 extend google.protobuf.MethodOptions { string owner = 50001; }\n\
                 message M {}\nservice S { rpc Get(M) returns (M) { option (owner) = \"owner-of-get\"; } }\n",
            )],
            "opts.fds.bin",
        );
        let reflection = Reflection::builder()
            .register_encoded_file_descriptor_set(&set)
            .unwrap()
            .build();
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol("opts.S.Get".into())),
        };
        let answer = reflection.index.answer(request, &mut Sent::default());
        let Some(MessageResponse::FileDescriptorResponse(files)) = answer.message_response else {
            panic!("{answer:?}");
        };
        let value = b"owner-of-get";
        assert!(
            files
                .file_descriptor_proto
                .iter()
                .any(|file| file.windows(value.len()).any(|w| w == value)),
            "the option's value is missing"
        );
    }

    #[test]
    fn builder_lists_the_services_of_its_files_unless_told() {
        let reflection = Reflection::builder()
            .register_encoded_file_descriptor_set(health::FILE_DESCRIPTOR_SET)
            .unwrap()
            .build();
        let names: Vec<&str> = reflection.services().collect();
        assert_eq!(
            names,
            ["grpc.health.v1.Health", SERVICE_NAMES[0], SERVICE_NAMES[1]]
        );

        let reflection = Reflection::builder()
            .register_encoded_file_descriptor_set(health::FILE_DESCRIPTOR_SET)
            .unwrap()
            .service_name("hand.Written")
            .service_name("hand.Written")
            .build();
        let names: Vec<&str> = reflection.services().collect();
        assert_eq!(names, ["hand.Written", SERVICE_NAMES[0], SERVICE_NAMES[1]]);
    }

    #[test]
    fn bytes_that_are_no_descriptor_set_are_an_error_or_left_out() {
        let garbage: &[u8] = &[0xff, 0xff, 0xff];
        let err = Reflection::builder()
            .register_encoded_file_descriptor_set(garbage)
            .unwrap_err();
        assert!(err.to_string().contains("FileDescriptorSet"), "{err}");

        // From a server builder's record: listed, not described, no panic.
        let reflection = Reflection::for_services([
            ("grpc.health.v1.Health", health::FILE_DESCRIPTOR_SET),
            ("bad.Service", garbage),
            ("hand.Written", &[][..]),
        ]);
        let names: Vec<&str> = reflection.services().collect();
        assert_eq!(
            names,
            [
                "grpc.health.v1.Health",
                "bad.Service",
                "hand.Written",
                SERVICE_NAMES[0],
                SERVICE_NAMES[1]
            ]
        );
        assert!(reflection.index.has_file("grpc/health/v1/health.proto"));
        assert!(reflection
            .index
            .has_file("grpc/reflection/v1/reflection.proto"));
        assert!(reflection
            .index
            .has_file("grpc/reflection/v1alpha/reflection.proto"));
    }
}
