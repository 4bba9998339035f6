//! The [`prost_build::ServiceGenerator`] that writes, per service, a module of method
//! descriptors, a client stub and a server trait with its dispatcher.
//!
//! Everything generated names its dependencies by absolute paths under
//! `::rpc_core::codegen` (no `use`), so a message called `Request` or `Status` in the
//! user's package cannot clash with them. Message types come from prost-build as paths
//! relative to the package module; the generated modules sit one level below it, so
//! relative paths get one more `super::`.

use std::{cell::RefCell, collections::HashSet, fmt::Write as _, rc::Rc};

use heck::{ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use prost_build::{Comments, Method, Service, ServiceGenerator};
use prost_types::method_options::IdempotencyLevel;

use crate::check::streaming_kind;

/// How a method's messages flow.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unary,
    ServerStreaming,
    ClientStreaming,
    Bidirectional,
}

/// The path every generated item goes through.
const CODEGEN: &str = "::rpc_core::codegen";

/// Names of inherent methods of generated clients, which an rpc method must not take;
/// of methods of prelude traits every client implements that method calls would find
/// first (`client.into(request)` is `Into::into`: it takes `self`, where the rpc's
/// method takes `&mut self`); and of the associated functions of `rpc_connect::Connect`,
/// which every client implements and which an inherent method of the same name would
/// hide (`DialerClient::connect(uri)` would be the rpc `Connect`).
const CLIENT_RESERVED: &[&str] = &[
    "connect",
    "connect_with",
    "balanced",
    "balanced_with",
    "new",
    "get_ref",
    "get_mut",
    "into_inner",
    "clone",
    "with_retries",
    "into",
    "try_into",
    "to_owned",
    "clone_into",
];

/// Generates client and server code for each service prost-build hands over, and each
/// package's `FILE_DESCRIPTOR_SET` constant.
#[derive(Debug)]
pub(crate) struct RpcServiceGenerator {
    pub(crate) build_client: bool,
    pub(crate) build_server: bool,
    /// Leave streaming methods out (`Builder::skip_streaming_methods`).
    pub(crate) skip_streaming: bool,
    /// The `.proto` paths of `Builder::extern_path`: a type under one of them is named
    /// as the user wrote its Rust path, not relative to the package's module.
    pub(crate) extern_paths: Vec<String>,
    /// Where each package's descriptor constant goes.
    pub(crate) descriptors: DescriptorConsts,
}

/// Which file of the descriptor set gets its package's `FILE_DESCRIPTOR_SET` constant,
/// and what it includes.
///
/// prost-build calls [`ServiceGenerator::finalize`] once per file, in the order of the
/// descriptor set, after it has added that file's code to its package's module; its
/// `finalize_package` comes only for packages with services. So the constant goes in
/// at the `finalize` of each package's last file, if the module has any code by then
/// (prost-build writes no file for an empty module, such as `google.protobuf`'s, whose
/// types are `prost_types`'). `rpc-codegen`'s tests check the result for packages with
/// and without services.
#[derive(Debug, Default)]
pub(crate) struct DescriptorConsts {
    /// Per file of the descriptor set, in order: the descriptor file of its package
    /// (`pkg.fds.bin`) if it is the package's last file.
    pub(crate) last_of_package: Vec<Option<String>>,
    /// The (absolute) directory the constants name the files in; `None`: the bare
    /// file name, which `include_bytes!` looks up next to the generated file.
    pub(crate) dir: Option<String>,
    /// Files `finalize` has seen.
    pub(crate) seen: usize,
    /// The descriptor files the generated code includes, for the caller to write.
    pub(crate) emitted: Rc<RefCell<Vec<String>>>,
}

impl DescriptorConsts {
    /// The constant for one package, whose descriptor set is in `file`.
    fn push_const(&self, file: &str, buf: &mut String) {
        let path = match &self.dir {
            Some(dir) => format!("{dir}/{file}"),
            None => file.to_owned(),
        };
        let _ = writeln!(
            buf,
            "/// The encoded `google.protobuf.FileDescriptorSet` of this package's `.proto` \
             files and their imports, comments included (source info): what server \
             reflection answers with.\n\
             pub const FILE_DESCRIPTOR_SET: &[u8] = ::core::include_bytes!({path:?});"
        );
    }
}

/// One generated method: the prost-build view plus the names we derive.
struct RpcMethod<'a> {
    method: &'a Method,
    /// The constant in `foo_methods`.
    constant: String,
    /// The method name in the client (the trait uses `method.name`): prost-build's
    /// snake case name, with `_` appended where it would clash with `new` & co.
    rust_name: String,
    /// The input type as seen from inside the generated modules.
    input: String,
    /// The output type as seen from inside the generated modules.
    output: String,
    kind: Kind,
    /// The server trait's associated type for the response stream (`FooStream`, or
    /// `FooStream_` where an earlier method has that: see [`split_methods`]).
    stream_type: String,
}

/// Names shared by the generated modules of one service.
struct Names {
    /// `package.Service`.
    full_name: String,
    /// `foo_methods`.
    methods_mod: String,
    /// `FooClient`.
    client: String,
    /// `Foo`: the server trait.
    server_trait: String,
    /// `FooServer`.
    server: String,
}

impl ServiceGenerator for RpcServiceGenerator {
    fn generate(&mut self, service: Service, buf: &mut String) {
        let snake = service.proto_name.to_snake_case();
        let camel = service.proto_name.to_upper_camel_case();
        let names = Names {
            full_name: if service.package.is_empty() {
                service.proto_name.clone()
            } else {
                format!("{}.{}", service.package, service.proto_name)
            },
            methods_mod: format!("{snake}_methods"),
            client: format!("{camel}Client"),
            server_trait: service.name.clone(),
            server: format!("{camel}Server"),
        };
        let (methods, skipped) = split_methods(&service, self.skip_streaming, &self.extern_paths);
        let skipped_doc = skipped_doc(&skipped);

        push_methods_mod(buf, &names, &methods, &skipped_doc);
        if self.build_client {
            push_client(buf, &service, &names, &methods, &skipped_doc);
        }
        if self.build_server {
            push_server(buf, &service, &names, &methods, &skipped_doc);
        }
    }

    fn finalize(&mut self, buf: &mut String) {
        let descriptors = &mut self.descriptors;
        let index = descriptors.seen;
        descriptors.seen += 1;
        if let Some(Some(file)) = descriptors.last_of_package.get(index) {
            if !buf.is_empty() {
                descriptors.push_const(file, buf);
                descriptors.emitted.borrow_mut().push(file.clone());
            }
        }
    }
}

/// The name of a method's descriptor constant in the `*_methods` module
/// (`GET_VALUE`; `ALL` is taken by the list of every method, so `All` is `ALL_METHOD`).
pub(crate) fn method_constant(proto_name: &str) -> String {
    let mut constant = proto_name.to_shouty_snake_case();
    if constant.is_empty() || constant == "ALL" {
        constant.push_str("_METHOD");
    }
    constant
}

/// Splits the service's methods into those generated and the streaming ones skipped
/// (`Name (kind)`) when streaming methods are to be left out.
///
/// A method that streams responses whose stream type (`FooStream`) an earlier one has
/// already (`Foo_1` and `Foo1` are `foo_1` and `foo1` in Rust, but both `Foo1` in
/// upper camel case) gets a `_` (`Foo1Stream_`), as many as it takes.
fn split_methods<'a>(
    service: &'a Service,
    skip_streaming: bool,
    extern_paths: &[String],
) -> (Vec<RpcMethod<'a>>, Vec<String>) {
    let mut methods = Vec::new();
    let mut skipped = Vec::new();
    let mut stream_types = HashSet::new();
    for method in &service.methods {
        if let Some(kind) = streaming_kind(method.client_streaming, method.server_streaming) {
            if skip_streaming {
                skipped.push(format!("`{}` ({kind})", method.proto_name));
                continue;
            }
        }
        let kind = match (method.client_streaming, method.server_streaming) {
            (false, false) => Kind::Unary,
            (false, true) => Kind::ServerStreaming,
            (true, false) => Kind::ClientStreaming,
            (true, true) => Kind::Bidirectional,
        };
        let constant = method_constant(&method.proto_name);
        let mut rust_name = method.name.clone();
        if CLIENT_RESERVED.contains(&rust_name.as_str()) {
            rust_name.push('_');
        }
        let mut stream_type = format!("{}Stream", method.proto_name.to_upper_camel_case());
        if matches!(kind, Kind::ServerStreaming | Kind::Bidirectional) {
            while !stream_types.insert(stream_type.clone()) {
                stream_type.push('_');
            }
        }
        methods.push(RpcMethod {
            method,
            constant,
            rust_name,
            input: nested_type_path(&method.input_type, &method.input_proto_type, extern_paths),
            output: nested_type_path(&method.output_type, &method.output_proto_type, extern_paths),
            kind,
            stream_type,
        });
    }
    (methods, skipped)
}

/// Rust primitives prost-build maps well-known wrapper types to
/// (`google.protobuf.BoolValue` is `bool`, ...).
const PRIMITIVES: &[&str] = &["bool", "f32", "f64", "i32", "i64", "u32", "u64"];

/// The Rust path of the type `proto_type` (`.pkg.Message`), which prost-build gives
/// as `path` relative to the package's module, as seen from a module one level below
/// it. A type of a package mapped with `extern_path` comes as the user wrote its Rust
/// path: one that starts with a crate's name (`other_crate::pkg::T`) resolves from
/// any module as it is, and one that starts with `self::` or `super::` is relative to
/// the package's module, one level up.
fn nested_type_path(path: &str, proto_type: &str, extern_paths: &[String]) -> String {
    let mapped = extern_paths.iter().any(|proto| {
        proto == "."
            || proto_type
                .strip_prefix(proto.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    });
    if let Some(rest) = path.strip_prefix("self::").filter(|_| mapped) {
        format!("super::{rest}")
    } else if mapped && path.starts_with("super::") {
        format!("super::{path}")
    } else if mapped
        || path.starts_with("::")
        || path.starts_with("crate::")
        || path.starts_with('(')
        || PRIMITIVES.contains(&path)
    {
        path.to_owned()
    } else {
        format!("super::{path}")
    }
}

/// The doc paragraph that lists skipped streaming methods, or nothing.
fn skipped_doc(skipped: &[String]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    format!(
        "///\n/// Not generated: {} — streaming methods were left out \
         (`skip_streaming_methods`).\n",
        skipped.join(", ")
    )
}

/// `.proto` comments as `///` lines. prost-build has already turned code blocks into
/// ```` ```text ```` blocks (its `cleanup-markdown` feature) and escapes URLs and
/// brackets here; detached comments (license headers, separators) are left out.
fn proto_docs(comments: &Comments) -> String {
    let comments = Comments {
        leading_detached: Vec::new(),
        leading: comments.leading.clone(),
        trailing: comments.trailing.clone(),
    };
    let mut out = String::new();
    comments.append_with_indent(0, &mut out);
    out
}

/// A header line, then the `.proto` comments as a second paragraph.
fn docs_with_header(header: &str, comments: &Comments) -> String {
    let body = proto_docs(comments);
    if body.is_empty() {
        format!("/// {header}\n")
    } else {
        format!("/// {header}\n///\n{body}")
    }
}

fn idempotency(method: &Method) -> &'static str {
    match method.options.idempotency_level() {
        IdempotencyLevel::IdempotencyUnknown => "Unknown",
        IdempotencyLevel::NoSideEffects => "NoSideEffects",
        IdempotencyLevel::Idempotent => "Idempotent",
    }
}

fn push_methods_mod(buf: &mut String, names: &Names, methods: &[RpcMethod<'_>], skipped_doc: &str) {
    let Names {
        full_name,
        methods_mod,
        ..
    } = names;
    let _ = writeln!(buf, "/// Method descriptors of `{full_name}`.");
    buf.push_str(skipped_doc);
    let _ = writeln!(buf, "pub mod {methods_mod} {{");
    for m in methods {
        let proto_name = &m.method.proto_name;
        buf.push_str(&docs_with_header(
            &format!("`{full_name}/{proto_name}`"),
            &m.method.comments,
        ));
        let _ = writeln!(
            buf,
            "pub const {}: {CODEGEN}::MethodDescriptor = {CODEGEN}::MethodDescriptor {{ \
             service: \"{full_name}\", method: \"{proto_name}\", path: \"{full_name}/{proto_name}\", \
             idempotency: {CODEGEN}::Idempotency::{} }};",
            m.constant,
            idempotency(m.method)
        );
    }
    let all: Vec<&str> = methods.iter().map(|m| m.constant.as_str()).collect();
    let _ = writeln!(
        buf,
        "/// Every generated method of the service.\n\
         pub const ALL: &[{CODEGEN}::MethodDescriptor] = &[{}];\n}}",
        all.join(", ")
    );
}

fn push_client(
    buf: &mut String,
    service: &Service,
    names: &Names,
    methods: &[RpcMethod<'_>],
    skipped_doc: &str,
) {
    let Names {
        full_name,
        methods_mod,
        client,
        ..
    } = names;
    let module = format!("{}_client", service.proto_name.to_snake_case());
    let _ = writeln!(buf, "/// Client for `{full_name}`.\npub mod {module} {{");
    buf.push_str(&docs_with_header(
        &format!("Client for `{full_name}`: one `async` method per rpc."),
        &service.comments,
    ));
    buf.push_str(skipped_doc);
    let _ = writeln!(
        buf,
        "#[derive(Debug, Clone)]\n\
         pub struct {client}<T = {CODEGEN}::Channel> {{ inner: {CODEGEN}::Client<T> }}\n\
         impl<T> {client}<T> {{\n\
             /// Wraps a channel (or any service stack over one).\n\
             pub fn new(inner: T) -> Self {{ Self {{ inner: {CODEGEN}::Client::new(inner) }} }}\n\
             /// The wrapped channel.\n\
             pub fn get_ref(&self) -> &T {{ self.inner.get_ref() }}\n\
             /// The wrapped channel, mutably.\n\
             pub fn get_mut(&mut self) -> &mut T {{ self.inner.get_mut() }}\n\
             /// Unwraps the channel.\n\
             pub fn into_inner(self) -> T {{ self.inner.into_inner() }}\n\
             /// Retries failed calls as `policy` allows: methods the `.proto` marks \
             safe to repeat on retryable codes, any method when the request certainly \
             reached no handler, and others through the server's duplicate cache \
             (see `rpc_core::retry`).\n\
             pub fn with_retries(self, policy: {CODEGEN}::RetryPolicy) -> {client}<{CODEGEN}::Retry<T>> {{\n\
                 {client}::new({CODEGEN}::retrying(self.inner.into_inner(), policy))\n\
             }}\n\
         }}\n\
         /// As [`{client}::new`]: lets code that makes channels return this client \
         (`rpc_connect::Connect`: `{client}::connect(uri)`).\n\
         impl<T> {CODEGEN}::FromChannel<T> for {client}<T> {{\n\
             fn from_channel(channel: T) -> Self {{ Self::new(channel) }}\n\
         }}"
    );
    if !methods.is_empty() {
        // Rpc names such as `FromParts` or `IntoStream` read as conversions to clippy.
        let _ = writeln!(
            buf,
            "#[allow(clippy::wrong_self_convention)]\n\
             impl<T> {client}<T> where T: {CODEGEN}::Service<{CODEGEN}::ClientCall, \
             Response = {CODEGEN}::ClientReply, Error = {CODEGEN}::Status> {{"
        );
        for m in methods {
            buf.push_str(&docs_with_header(
                &format!("Calls `{full_name}/{}`.", m.method.proto_name),
                &m.method.comments,
            ));
            // `option deprecated = true;` on the rpc, as tonic does.
            if m.method.options.deprecated() {
                buf.push_str("#[deprecated]\n");
            }
            let (name, input, output, constant) = (&m.rust_name, &m.input, &m.output, &m.constant);
            let descriptor = format!("&super::{methods_mod}::{constant}");
            let _ = match m.kind {
                Kind::Unary => writeln!(
                    buf,
                    "pub async fn {name}(&mut self, request: impl {CODEGEN}::IntoRequest<{input}>) \
                     -> ::core::result::Result<{CODEGEN}::Response<{output}>, {CODEGEN}::Status> {{\n\
                     self.inner.unary({CODEGEN}::IntoRequest::into_request(request), {descriptor}).await\n}}"
                ),
                Kind::ServerStreaming => writeln!(
                    buf,
                    "pub async fn {name}(&mut self, request: impl {CODEGEN}::IntoRequest<{input}>) \
                     -> ::core::result::Result<{CODEGEN}::Response<{CODEGEN}::Streaming<{output}>>, \
                     {CODEGEN}::Status> {{\n\
                     self.inner.server_streaming({CODEGEN}::IntoRequest::into_request(request), \
                     {descriptor}).await\n}}"
                ),
                Kind::ClientStreaming => writeln!(
                    buf,
                    "pub async fn {name}(&mut self, request: impl {CODEGEN}::IntoStreamingRequest<\
                     Message = {input}>) \
                     -> ::core::result::Result<{CODEGEN}::Response<{output}>, {CODEGEN}::Status> {{\n\
                     self.inner.client_streaming({CODEGEN}::IntoStreamingRequest::\
                     into_streaming_request(request), {descriptor}).await\n}}"
                ),
                Kind::Bidirectional => writeln!(
                    buf,
                    "pub async fn {name}(&mut self, request: impl {CODEGEN}::IntoStreamingRequest<\
                     Message = {input}>) \
                     -> ::core::result::Result<{CODEGEN}::Response<{CODEGEN}::Streaming<{output}>>, \
                     {CODEGEN}::Status> {{\n\
                     self.inner.streaming({CODEGEN}::IntoStreamingRequest::\
                     into_streaming_request(request), {descriptor}).await\n}}"
                ),
            };
        }
        buf.push_str("}\n");
    }
    buf.push_str("}\n");
}

fn push_server(
    buf: &mut String,
    service: &Service,
    names: &Names,
    methods: &[RpcMethod<'_>],
    skipped_doc: &str,
) {
    let Names {
        full_name,
        server_trait,
        server,
        ..
    } = names;
    let module = format!("{}_server", service.proto_name.to_snake_case());
    let _ = writeln!(buf, "/// Server for `{full_name}`.\npub mod {module} {{");

    // The trait.
    buf.push_str(&docs_with_header(
        &format!(
            "The `{full_name}` service: implement it and serve it with [`{server}`]. \
             Methods can be written as `async fn`."
        ),
        &service.comments,
    ));
    buf.push_str(skipped_doc);
    // Rpc names such as `New` or `FromParts` read as constructors to clippy.
    let _ = writeln!(
        buf,
        "#[allow(clippy::wrong_self_convention)]\n\
         pub trait {server_trait}: ::core::marker::Send + ::core::marker::Sync + 'static {{"
    );
    for m in methods {
        let (input, output, stream_type) = (&m.input, &m.output, &m.stream_type);
        let streams_out = matches!(m.kind, Kind::ServerStreaming | Kind::Bidirectional);
        let streams_in = matches!(m.kind, Kind::ClientStreaming | Kind::Bidirectional);
        if streams_out {
            let _ = writeln!(
                buf,
                "/// The response messages of `{full_name}/{}`: any stream of results; an \
                 `Err` ends the call with that status.\n\
                 type {stream_type}: {CODEGEN}::Stream<Item = ::core::result::Result<{output}, \
                 {CODEGEN}::Status>> + ::core::marker::Send + 'static;",
                m.method.proto_name
            );
        }
        buf.push_str(&docs_with_header(
            &format!("Handles `{full_name}/{}`.", m.method.proto_name),
            &m.method.comments,
        ));
        let request = if streams_in {
            format!("{CODEGEN}::Request<{CODEGEN}::Streaming<{input}>>")
        } else {
            format!("{CODEGEN}::Request<{input}>")
        };
        let response = if streams_out {
            format!("Self::{stream_type}")
        } else {
            output.clone()
        };
        let _ = writeln!(
            buf,
            "fn {name}(&self, request: {request}) -> impl {CODEGEN}::Future<\
             Output = ::core::result::Result<{CODEGEN}::Response<{response}>, {CODEGEN}::Status>> \
             + ::core::marker::Send;",
            name = m.method.name,
        );
    }
    buf.push_str("}\n");

    // The server type. Bounds name the trait as `self::Foo`: a service `T` has a trait
    // `T`, which the type parameter `T` would shadow.
    let unary_methods: Vec<String> = methods
        .iter()
        .filter(|m| matches!(m.kind, Kind::Unary))
        .map(|m| format!("{:?}", m.method.proto_name))
        .collect();
    let unary_methods = unary_methods.join(", ");
    let all_methods: Vec<String> = methods
        .iter()
        .map(|m| format!("{:?}", m.method.proto_name))
        .collect();
    let all_methods = all_methods.join(", ");
    let _ = writeln!(
        buf,
        "/// Serves an implementation of [`{server_trait}`]; add it with `Server::builder().add_service(..)`.\n\
         pub struct {server}<T> {{ inner: {CODEGEN}::Arc<T> }}\n\
         impl<T> {server}<T> {{\n\
             /// Serves `inner`.\n\
             pub fn new(inner: T) -> Self {{ Self::from_arc({CODEGEN}::Arc::new(inner)) }}\n\
             /// Serves an implementation that is shared already.\n\
             pub fn from_arc(inner: {CODEGEN}::Arc<T>) -> Self {{ Self {{ inner }} }}\n\
         }}\n\
         impl<T> ::core::clone::Clone for {server}<T> {{\n\
             fn clone(&self) -> Self {{ Self {{ inner: {CODEGEN}::Arc::clone(&self.inner) }} }}\n\
         }}\n\
         impl<T> ::core::fmt::Debug for {server}<T> {{\n\
             fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{ \
             f.write_str(\"{server}\") }}\n\
         }}\n\
         impl<T: self::{server_trait}> {CODEGEN}::NamedService for {server}<T> {{\n\
             const NAME: &'static str = \"{full_name}\";\n\
             const FILE_DESCRIPTOR_SET: &'static [u8] = super::FILE_DESCRIPTOR_SET;\n\
             const METHODS: &'static [&'static str] = &[{all_methods}];\n\
             const UNARY_METHODS: &'static [&'static str] = &[{unary_methods}];\n\
         }}"
    );

    // The dispatcher.
    let _ = writeln!(
        buf,
        "impl<T: self::{server_trait}> {CODEGEN}::Service<{CODEGEN}::ServerCall> for {server}<T> {{\n\
             type Response = {CODEGEN}::ServerReply;\n\
             type Error = {CODEGEN}::Status;\n\
             type Future = {CODEGEN}::BoxFuture<::core::result::Result<Self::Response, Self::Error>>;\n\
             fn poll_ready(&mut self, _cx: &mut {CODEGEN}::Context<'_>) \
             -> {CODEGEN}::Poll<::core::result::Result<(), Self::Error>> {{\n\
                 {CODEGEN}::Poll::Ready(::core::result::Result::Ok(()))\n\
             }}\n\
             fn call(&mut self, call: {CODEGEN}::ServerCall) -> Self::Future {{"
    );
    let unimplemented = format!(
        "let status = {CODEGEN}::unimplemented(&call);\n\
         ::std::boxed::Box::pin(async move {{ ::core::result::Result::Err(status) }})"
    );
    if methods.is_empty() {
        buf.push_str(&unimplemented);
    } else {
        let _ = writeln!(
            buf,
            "let inner = {CODEGEN}::Arc::clone(&self.inner);\nmatch call.method.as_str() {{"
        );
        for m in methods {
            let decode = match m.kind {
                Kind::Unary => format!("{CODEGEN}::unary_request::<{}>(call).await?", m.input),
                Kind::ServerStreaming => {
                    format!("{CODEGEN}::single_request::<{}>(call).await?", m.input)
                }
                Kind::ClientStreaming | Kind::Bidirectional => {
                    format!("{CODEGEN}::streaming_request::<{}>(call)?", m.input)
                }
            };
            let encode = match m.kind {
                Kind::Unary | Kind::ClientStreaming => "encode_response",
                Kind::ServerStreaming | Kind::Bidirectional => "encode_stream_response",
            };
            let _ = writeln!(
                buf,
                "\"{full_name}/{proto_name}\" => ::std::boxed::Box::pin(async move {{\n\
                     let request = {decode};\n\
                     {CODEGEN}::{encode}(<T as self::{server_trait}>::{name}(&inner, request).await)\n\
                 }}),",
                proto_name = m.method.proto_name,
                name = m.method.name,
            );
        }
        let _ = writeln!(buf, "_ => {{ {unimplemented} }}\n}}");
    }
    buf.push_str("}\n}\n}\n");
}

#[cfg(test)]
mod tests {
    use super::nested_type_path;

    /// Paths as seen from a service's client and server modules, one level below the
    /// package's: prost-build's own paths and `extern_path` ones relative to the
    /// package's module get a `super::`, absolute ones are kept.
    #[test]
    fn type_paths_are_seen_from_one_module_down() {
        let mapped = [".ext".to_owned()];
        for (path, proto, expected) in [
            ("Note", ".pkg.Note", "super::Note"),
            (
                "super::other::Note",
                ".other.Note",
                "super::super::other::Note",
            ),
            (
                "::prost_types::Timestamp",
                ".google.protobuf.Timestamp",
                "::prost_types::Timestamp",
            ),
            ("()", ".google.protobuf.Empty", "()"),
            ("self::types::T", ".ext.T", "super::types::T"),
            ("super::types::T", ".ext.T", "super::super::types::T"),
            ("crate::types::T", ".ext.T", "crate::types::T"),
            ("other_crate::T", ".ext.T", "other_crate::T"),
        ] {
            assert_eq!(nested_type_path(path, proto, &mapped), expected, "{path}");
        }
    }
}
