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

fn method_streaming_kind(method: &MethodDescriptorProto) -> Option<&'static str> {
    streaming_kind(method.client_streaming(), method.server_streaming())
}

/// Fails on the first streaming method (unless they are to be skipped) and on two
/// methods of one service whose Rust names would be the same.
pub(crate) fn check(fds: &FileDescriptorSet, skip_streaming_methods: bool) -> Result<(), Error> {
    let mut streaming = Vec::new();
    for file in &fds.file {
        for service in &file.service {
            let full_name = if file.package().is_empty() {
                service.name().to_owned()
            } else {
                format!("{}.{}", file.package(), service.name())
            };
            let mut rust_names = HashMap::new();
            for method in &service.method {
                if let Some(kind) = method_streaming_kind(method) {
                    if !skip_streaming_methods {
                        streaming.push((
                            file.name(),
                            format!("{full_name}/{}", method.name()),
                            kind,
                        ));
                    }
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
    if let Some((file, method, kind)) = streaming.first() {
        let mut message = format!(
            "{file}: method {method} is {kind}, which rpc-codegen does not support yet (or call \
             .skip_streaming_methods(true) to generate the unary methods only)"
        );
        if streaming.len() > 1 {
            let others: Vec<String> = streaming[1..]
                .iter()
                .map(|(file, method, kind)| format!("{method} ({kind}, {file})"))
                .collect();
            message.push_str("; other streaming methods: ");
            message.push_str(&others.join(", "));
        }
        return Err(Error::new(ErrorKind::UnsupportedStreaming, message));
    }
    Ok(())
}
