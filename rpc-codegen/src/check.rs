//! Checks on the descriptor set that must fail the build before prost-build runs
//! (a `ServiceGenerator` cannot return errors).

use std::collections::HashMap;

use heck::ToSnakeCase;
use prost_types::{FileDescriptorSet, MethodDescriptorProto};

use crate::error::{Error, ErrorKind};

/// Which streaming kind a method is, as error messages and docs name it; `None` for
/// a unary method.
pub(crate) fn streaming_kind(
    client_streaming: bool,
    server_streaming: bool,
) -> Option<&'static str> {
    match (client_streaming, server_streaming) {
        (false, false) => None,
        (true, false) => Some("client-streaming"),
        (false, true) => Some("server-streaming"),
        (true, true) => Some("bidirectional-streaming"),
    }
}

fn is_streaming(method: &MethodDescriptorProto) -> bool {
    streaming_kind(method.client_streaming(), method.server_streaming()).is_some()
}

/// Fails on two methods of one service whose Rust names would be the same (among
/// those generated: streaming methods do not count when they are skipped).
pub(crate) fn check(fds: &FileDescriptorSet, skip_streaming_methods: bool) -> Result<(), Error> {
    for file in &fds.file {
        for service in &file.service {
            let full_name = if file.package().is_empty() {
                service.name().to_owned()
            } else {
                format!("{}.{}", file.package(), service.name())
            };
            let mut rust_names = HashMap::new();
            for method in &service.method {
                if skip_streaming_methods && is_streaming(method) {
                    continue;
                }
                if let Some(other) = rust_names.insert(method.name().to_snake_case(), method.name())
                {
                    return Err(Error::new(
                        ErrorKind::Generate,
                        format!(
                            "{}: methods {full_name}/{other} and {full_name}/{} would both be \
                             named `{}` in Rust",
                            file.name(),
                            method.name(),
                            method.name().to_snake_case()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
