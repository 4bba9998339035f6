//! What reflection knows, as plain data: the files by name, every symbol and extension
//! to the file that declares it, and the answer to each request. No IO: the stream
//! handler (`service`) feeds requests through [`Index::answer`] one at a time.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto,
};
use rpc_core::Code;

use super::v1::{
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    ErrorResponse, ExtensionNumberResponse, ExtensionRequest, FileDescriptorResponse,
    ListServiceResponse, ServerReflectionRequest, ServerReflectionResponse, ServiceResponse,
};

/// Longest request answered as the protocol says, echoed in `original_request` with
/// its host again in `valid_host`; a longer one (no file or symbol name is near it) gets
/// `INVALID_ARGUMENT` without the echo, so that the answer stays small and the stream
/// open.
pub(crate) const MAX_ECHOED_REQUEST_LEN: usize = 64 << 10;
/// One `.proto` file as reflection sends it.
#[derive(Debug)]
struct File {
    /// The encoded `FileDescriptorProto`, encoded once.
    encoded: Bytes,
    /// The files it imports that the index has, by position in [`Index::files`].
    dependencies: Vec<usize>,
}

/// The descriptors and names reflection answers from. Immutable once built.
#[derive(Debug, Default)]
pub(crate) struct Index {
    files: Vec<File>,
    /// File name (`rpc/examples/v1/echo.proto`) to position in `files`.
    by_name: HashMap<String, usize>,
    /// Fully qualified symbol (no leading dot) to the file declaring it.
    symbols: HashMap<String, usize>,
    /// `(extended message, field number)` to the file declaring the extension.
    extensions: HashMap<(String, i32), usize>,
    /// Every message type's extension numbers (empty for a message nothing extends).
    extension_numbers: HashMap<String, Vec<i32>>,
    /// What `list_services` answers, in the order given.
    services: Vec<String>,
}

/// Which files one stream has sent, so that none goes twice (the spec allows leaving
/// out files sent before; a requested file itself is always sent). Bounded by the
/// number of files in the index.
#[derive(Debug, Default)]
pub(crate) struct Sent(HashSet<usize>);

impl Index {
    /// An index of `files` (each with its encoding; the first of a name wins) that
    /// lists `services`.
    pub(crate) fn new(files: Vec<(FileDescriptorProto, Bytes)>, services: Vec<String>) -> Index {
        let mut index = Index {
            services,
            ..Index::default()
        };
        let mut kept = Vec::new();
        let mut encodings = Vec::new();
        for (file, encoded) in files {
            if index.by_name.contains_key(file.name()) {
                continue;
            }
            let position = kept.len();
            index.by_name.insert(file.name().to_owned(), position);
            index.add_symbols(&file, position);
            kept.push(file);
            encodings.push(encoded);
        }
        // Packages last, so that a declaration of the same name wins.
        for (position, file) in kept.iter().enumerate() {
            if !file.package().is_empty() {
                index
                    .symbols
                    .entry(file.package().to_owned())
                    .or_insert(position);
            }
        }
        for numbers in index.extension_numbers.values_mut() {
            numbers.sort_unstable();
            numbers.dedup();
        }
        index.files = kept
            .iter()
            .zip(encodings)
            .map(|(file, encoded)| File {
                encoded,
                // An import the index lacks is left out, as grpc-go leaves out
                // placeholder files.
                dependencies: file
                    .dependency
                    .iter()
                    .filter_map(|name| index.by_name.get(name).copied())
                    .collect(),
            })
            .collect();
        index
    }

    /// The names `list_services` answers.
    pub(crate) fn services(&self) -> &[String] {
        &self.services
    }

    /// Whether a file of this name is known.
    #[cfg(test)]
    pub(crate) fn has_file(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Indexes everything `file` declares.
    fn add_symbols(&mut self, file: &FileDescriptorProto, position: usize) {
        let scope = file.package();
        for message in &file.message_type {
            self.add_message(scope, message, position);
        }
        for enumeration in &file.enum_type {
            self.add_enum(scope, enumeration, position);
        }
        for extension in &file.extension {
            self.add_extension(scope, extension, position);
        }
        for service in &file.service {
            let name = qualify(scope, service.name());
            for method in &service.method {
                self.add_symbol(qualify(&name, method.name()), position);
            }
            self.add_symbol(name, position);
        }
    }

    fn add_message(&mut self, scope: &str, message: &DescriptorProto, position: usize) {
        let name = qualify(scope, message.name());
        for field in &message.field {
            self.add_symbol(qualify(&name, field.name()), position);
        }
        for oneof in &message.oneof_decl {
            self.add_symbol(qualify(&name, oneof.name()), position);
        }
        for nested in &message.nested_type {
            self.add_message(&name, nested, position);
        }
        for enumeration in &message.enum_type {
            self.add_enum(&name, enumeration, position);
        }
        for extension in &message.extension {
            self.add_extension(&name, extension, position);
        }
        self.extension_numbers.entry(name.clone()).or_default();
        self.add_symbol(name, position);
    }

    /// An enum and its values, which protobuf scopes beside the enum, not inside it
    /// (`pkg.RED` for `enum Color { RED = 0; }` in `package pkg`).
    fn add_enum(&mut self, scope: &str, enumeration: &EnumDescriptorProto, position: usize) {
        for value in &enumeration.value {
            self.add_symbol(qualify(scope, value.name()), position);
        }
        self.add_symbol(qualify(scope, enumeration.name()), position);
    }

    fn add_extension(&mut self, scope: &str, extension: &FieldDescriptorProto, position: usize) {
        self.add_symbol(qualify(scope, extension.name()), position);
        let extendee = extension.extendee().trim_start_matches('.').to_owned();
        let number = extension.number();
        self.extension_numbers
            .entry(extendee.clone())
            .or_default()
            .push(number);
        self.extensions
            .entry((extendee, number))
            .or_insert(position);
    }

    /// The first declaration of a name wins.
    fn add_symbol(&mut self, name: String, position: usize) {
        self.symbols.entry(name).or_insert(position);
    }

    /// The answer to one request of a stream that has sent `sent` so far.
    pub(crate) fn answer(
        &self,
        request: ServerReflectionRequest,
        sent: &mut Sent,
    ) -> ServerReflectionResponse {
        let len = prost::Message::encoded_len(&request);
        if len > MAX_ECHOED_REQUEST_LEN {
            // Echoed (the host twice), it could make an answer over the message limit,
            // which would end the whole stream: an error answer without the echo.
            return ServerReflectionResponse {
                valid_host: String::new(),
                original_request: None,
                message_response: Some(error(
                    Code::INVALID_ARGUMENT,
                    &format!(
                        "a reflection request of {len} bytes, over the \
                         {MAX_ECHOED_REQUEST_LEN} this server answers (names are short)"
                    ),
                )),
            };
        }
        let message_response = match &request.message_request {
            None => error(Code::INVALID_ARGUMENT, "the request asks nothing"),
            Some(MessageRequest::ListServices(_)) => {
                MessageResponse::ListServicesResponse(ListServiceResponse {
                    service: self
                        .services
                        .iter()
                        .map(|name| ServiceResponse { name: name.clone() })
                        .collect(),
                })
            }
            Some(MessageRequest::FileByFilename(name)) => match self.by_name.get(name) {
                Some(&file) => self.files_from(file, sent),
                None => error(Code::NOT_FOUND, &format!("unknown file {:?}", shown(name))),
            },
            Some(MessageRequest::FileContainingSymbol(symbol)) => {
                match self.symbols.get(symbol.trim_start_matches('.')) {
                    Some(&file) => self.files_from(file, sent),
                    None => error(
                        Code::NOT_FOUND,
                        &format!("unknown symbol {:?}", shown(symbol)),
                    ),
                }
            }
            Some(MessageRequest::FileContainingExtension(ExtensionRequest {
                containing_type,
                extension_number,
            })) => {
                let key = (
                    containing_type.trim_start_matches('.').to_owned(),
                    *extension_number,
                );
                match self.extensions.get(&key) {
                    Some(&file) => self.files_from(file, sent),
                    None => error(
                        Code::NOT_FOUND,
                        &format!(
                            "no known extension {extension_number} of {:?}",
                            shown(containing_type)
                        ),
                    ),
                }
            }
            Some(MessageRequest::AllExtensionNumbersOfType(name)) => {
                let name = name.trim_start_matches('.');
                match self.extension_numbers.get(name) {
                    Some(numbers) => {
                        MessageResponse::AllExtensionNumbersResponse(ExtensionNumberResponse {
                            base_type_name: name.to_owned(),
                            extension_number: numbers.clone(),
                        })
                    }
                    None => error(
                        Code::NOT_FOUND,
                        &format!("unknown message type {:?}", shown(name)),
                    ),
                }
            }
        };
        ServerReflectionResponse {
            valid_host: request.host.clone(),
            original_request: Some(request),
            message_response: Some(message_response),
        }
    }

    /// `file` and every file it imports, directly or not, that this stream has not
    /// sent yet: the requested file first, then its imports breadth first (as
    /// grpc-go answers).
    fn files_from(&self, file: usize, sent: &mut Sent) -> MessageResponse {
        let mut out = Vec::new();
        let mut seen = HashSet::from([file]);
        let mut queue = std::collections::VecDeque::from([file]);
        while let Some(current) = queue.pop_front() {
            if sent.0.insert(current) || current == file {
                out.push(self.files[current].encoded.clone());
            }
            for &dependency in &self.files[current].dependencies {
                if seen.insert(dependency) {
                    queue.push_back(dependency);
                }
            }
        }
        MessageResponse::FileDescriptorResponse(FileDescriptorResponse {
            file_descriptor_proto: out,
        })
    }
}

/// `scope.name`, or `name` at the top level.
fn qualify(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_owned()
    } else {
        format!("{scope}.{name}")
    }
}

/// Longest name an error message repeats: a client's name can be as long as the
/// frame limit, and the answer carries the whole request already.
const MAX_SHOWN_NAME: usize = 256;

/// `name`, cut to [`MAX_SHOWN_NAME`] bytes (at a character boundary).
fn shown(name: &str) -> &str {
    if name.len() <= MAX_SHOWN_NAME {
        return name;
    }
    let mut end = MAX_SHOWN_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// An `error_response` with a gRPC code.
fn error(code: Code, message: &str) -> MessageResponse {
    MessageResponse::ErrorResponse(ErrorResponse {
        // The codes used here (3, 5) fit an i32.
        error_code: code.as_u32() as i32,
        error_message: message.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message as _;
    use prost_types::{FileDescriptorProto, FileDescriptorSet};

    use super::{Index, Sent};
    use crate::reflection::v1::{
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ExtensionRequest, ServerReflectionRequest,
    };

    const A: &str = r#"
syntax = "proto2";
package demo.a;
import "b.proto";
import "c.proto";

// The greeter.
service Greeter {
  // Says hello.
  rpc Hello(Outer) returns (demo.b.B);
}

message Outer {
  optional string name = 1;
  message Inner { optional int32 x = 1; }
  enum Mood { HAPPY = 0; SAD = 1; }
  oneof choice { int32 n = 2; string s = 3; }
  optional demo.c.C c = 4;
  extensions 100 to 200;
  extend Outer { optional int32 nested_ext = 120; }
}

extend Outer { optional int32 ext_a = 150; }

enum Color { RED = 0; }
"#;
    const B: &str = r#"
syntax = "proto2";
package demo.b;
import "c.proto";
message B { optional demo.c.C c = 1; }
"#;
    const C: &str = r#"
syntax = "proto2";
package demo.c;
message C {}
"#;

    /// The descriptor set of `a.proto` and its imports, as `rpc-codegen` embeds it
    /// (made once: the tests run in parallel).
    fn files() -> Vec<FileDescriptorProto> {
        static FILES: std::sync::OnceLock<Vec<FileDescriptorProto>> = std::sync::OnceLock::new();
        FILES.get_or_init(make_files).clone()
    }

    fn make_files() -> Vec<FileDescriptorProto> {
        let set = crate::reflection::descriptor_set(
            &[("a.proto", A), ("b.proto", B), ("c.proto", C)],
            "demo.a.fds.bin",
        );
        FileDescriptorSet::decode(set.as_slice()).unwrap().file
    }

    /// `files`, each with its encoding.
    fn encoded(files: Vec<FileDescriptorProto>) -> Vec<(FileDescriptorProto, Bytes)> {
        files
            .into_iter()
            .map(|file| {
                let bytes = Bytes::from(file.encode_to_vec());
                (file, bytes)
            })
            .collect()
    }

    /// A request whose echo could take the answer past the message limit (and end the
    /// stream) is refused without the echo (from a review).
    #[test]
    fn an_oversized_request_is_refused_without_its_echo() {
        let index = index();
        let request = ServerReflectionRequest {
            host: "h".repeat(super::MAX_ECHOED_REQUEST_LEN),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let response = index.answer(request, &mut Sent::default());
        assert_eq!(response.original_request, None);
        assert!(response.valid_host.is_empty());
        match response.message_response {
            Some(MessageResponse::ErrorResponse(e)) => {
                assert_eq!(
                    e.error_code,
                    rpc_core::Code::INVALID_ARGUMENT.as_u32() as i32
                )
            }
            other => panic!("{other:?}"),
        }
    }

    fn index() -> Index {
        Index::new(encoded(files()), vec!["demo.a.Greeter".into()])
    }

    fn ask(index: &Index, sent: &mut Sent, request: MessageRequest) -> MessageResponse {
        let request = ServerReflectionRequest {
            host: "h".into(),
            message_request: Some(request),
        };
        let response = index.answer(request.clone(), sent);
        assert_eq!(response.valid_host, "h");
        assert_eq!(response.original_request, Some(request));
        response.message_response.unwrap()
    }

    /// The names of the files answered, or the error code.
    fn file_names(response: MessageResponse) -> Result<Vec<String>, i32> {
        match response {
            MessageResponse::FileDescriptorResponse(files) => Ok(files
                .file_descriptor_proto
                .iter()
                .map(|bytes| {
                    FileDescriptorProto::decode(bytes.clone())
                        .unwrap()
                        .name()
                        .to_owned()
                })
                .collect()),
            MessageResponse::ErrorResponse(error) => Err(error.error_code),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn symbol(index: &Index, name: &str) -> Result<Vec<String>, i32> {
        file_names(ask(
            index,
            &mut Sent::default(),
            MessageRequest::FileContainingSymbol(name.into()),
        ))
    }

    #[test]
    fn every_kind_of_symbol_finds_its_file() {
        let index = index();
        for name in [
            "demo.a",
            "demo.a.Greeter",
            "demo.a.Greeter.Hello",
            "demo.a.Outer",
            ".demo.a.Outer",
            "demo.a.Outer.Inner",
            "demo.a.Outer.Inner.x",
            "demo.a.Outer.name",
            "demo.a.Outer.choice",
            "demo.a.Outer.Mood",
            "demo.a.Outer.HAPPY",
            "demo.a.Outer.nested_ext",
            "demo.a.ext_a",
            "demo.a.Color",
            "demo.a.RED",
        ] {
            let files = symbol(&index, name).unwrap_or_else(|code| panic!("{name}: code {code}"));
            assert_eq!(files[0], "a.proto", "{name}");
        }
        assert_eq!(symbol(&index, "demo.c.C").unwrap(), ["c.proto"]);
        assert_eq!(symbol(&index, "demo.b.B").unwrap(), ["b.proto", "c.proto"]);
        for unknown in ["demo.a.Nope", "demo", "demo.a.Outer.Mood.HAPPY", "", "."] {
            assert_eq!(symbol(&index, unknown), Err(5), "{unknown:?}: NOT_FOUND");
        }
    }

    #[test]
    fn files_come_with_their_imports_once_per_stream() {
        let index = index();
        let mut sent = Sent::default();
        let by_name = |sent: &mut Sent, name: &str| {
            file_names(ask(
                &index,
                sent,
                MessageRequest::FileByFilename(name.into()),
            ))
        };
        // The file first, then its imports breadth first, each once.
        assert_eq!(
            by_name(&mut sent, "a.proto").unwrap(),
            ["a.proto", "b.proto", "c.proto"]
        );
        // Sent already: only the file asked for.
        assert_eq!(by_name(&mut sent, "b.proto").unwrap(), ["b.proto"]);
        assert_eq!(by_name(&mut sent, "a.proto").unwrap(), ["a.proto"]);
        // Another stream starts afresh.
        assert_eq!(
            by_name(&mut Sent::default(), "b.proto").unwrap(),
            ["b.proto", "c.proto"]
        );
        assert_eq!(by_name(&mut sent, "z.proto"), Err(5));
    }

    #[test]
    fn extensions_are_found_by_type_and_number() {
        let index = index();
        let extension = |containing_type: &str, extension_number| {
            file_names(ask(
                &index,
                &mut Sent::default(),
                MessageRequest::FileContainingExtension(ExtensionRequest {
                    containing_type: containing_type.into(),
                    extension_number,
                }),
            ))
        };
        assert_eq!(extension("demo.a.Outer", 150).unwrap()[0], "a.proto");
        assert_eq!(extension(".demo.a.Outer", 120).unwrap()[0], "a.proto");
        assert_eq!(extension("demo.a.Outer", 151), Err(5));
        assert_eq!(extension("demo.b.B", 150), Err(5));

        let numbers = |name: &str| match ask(
            &index,
            &mut Sent::default(),
            MessageRequest::AllExtensionNumbersOfType(name.into()),
        ) {
            MessageResponse::AllExtensionNumbersResponse(numbers) => {
                assert_eq!(numbers.base_type_name, name.trim_start_matches('.'));
                Ok(numbers.extension_number)
            }
            MessageResponse::ErrorResponse(error) => Err(error.error_code),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(numbers("demo.a.Outer"), Ok(vec![120, 150]));
        assert_eq!(numbers(".demo.a.Outer"), Ok(vec![120, 150]));
        assert_eq!(numbers("demo.c.C"), Ok(vec![]));
        assert_eq!(
            numbers("demo.a.Greeter"),
            Err(5),
            "a service, not a message"
        );
        assert_eq!(numbers("demo.Nope"), Err(5));
    }

    #[test]
    fn error_messages_cut_long_names() {
        let index = index();
        let long = "é".repeat(10_000);
        match ask(
            &index,
            &mut Sent::default(),
            MessageRequest::FileContainingSymbol(long),
        ) {
            MessageResponse::ErrorResponse(error) => {
                assert_eq!(error.error_code, 5);
                assert!(
                    error.error_message.len() < 300,
                    "{}",
                    error.error_message.len()
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn list_and_empty_requests() {
        let index = index();
        match ask(
            &index,
            &mut Sent::default(),
            MessageRequest::ListServices("*".into()),
        ) {
            MessageResponse::ListServicesResponse(list) => {
                let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
                assert_eq!(names, ["demo.a.Greeter"]);
            }
            other => panic!("unexpected {other:?}"),
        }
        let response = index.answer(ServerReflectionRequest::default(), &mut Sent::default());
        match response.message_response {
            Some(MessageResponse::ErrorResponse(error)) => assert_eq!(error.error_code, 3),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_first_file_of_a_name_wins_and_missing_imports_are_skipped() {
        let mut files = files();
        // `a.proto` alone, without the files it imports, then a second `a.proto`.
        let a = files.remove(files.iter().position(|f| f.name() == "a.proto").unwrap());
        let mut other = a.clone();
        other.package = Some("other".into());
        let index = Index::new(encoded(vec![a, other]), Vec::new());
        assert!(index.has_file("a.proto"));
        assert!(!index.has_file("b.proto"));
        assert_eq!(symbol(&index, "demo.a.Outer").unwrap(), ["a.proto"]);
        assert_eq!(symbol(&index, "other.Outer"), Err(5));
    }
}
