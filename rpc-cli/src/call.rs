//! `rpc call`: one call of any kind (unary, server, client or bidirectional
//! streaming), JSON in and out; and the raw calls the other subcommands make, as
//! encoded bytes and a method path on the channel's `tower::Service<ClientCall>`.

use std::{io::Read, time::Duration};

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor, ReflectMessage, Value,
};
use rpc_core::{
    client::{ClientCall, ClientReply},
    method::Idempotency,
    retry::{MethodRetry, RetryLayer, RetryPolicy},
    stream::{MessageStream, RawStreaming, TakeOnce},
    ByteStr, Metadata, Payload, Status,
};
use tower::{Layer, Service, ServiceExt};

use crate::{
    cli::{CallArgs, RetryArgs},
    exit::Failure,
    json::{self, PrintOptions},
    metadata,
    schema::Schemas,
    target::{Target, DEFAULT_TIMEOUT},
};

/// A unary call of `method` (`package.Service/Method`) with an encoded request.
pub fn unary_call(
    method: &str,
    idempotency: Idempotency,
    metadata: Metadata,
    timeout: Option<Duration>,
    payload: Bytes,
) -> ClientCall {
    ClientCall {
        method: ByteStr::from(method.to_owned()),
        idempotency,
        metadata,
        timeout,
        call_key: None,
        payload: Payload::from(payload),
        stream: None,
        compress: None,
    }
}

/// Opens a streaming call of `method`: sends `messages` (encoded) as the server's
/// credit allows, and returns the response metadata and the undecoded responses.
pub async fn open_stream(
    target: &mut Target,
    method: &str,
    metadata: Metadata,
    timeout: Option<Duration>,
    messages: MessageStream,
) -> Result<(Metadata, RawStreaming), Status> {
    let call = ClientCall {
        method: ByteStr::from(method.to_owned()),
        idempotency: Idempotency::Unknown,
        metadata,
        timeout,
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(messages)),
        compress: None,
    };
    let reply: ClientReply = target.ready().await?.call(call).await?;
    let stream = reply
        .stream
        .and_then(|s| s.take())
        .ok_or_else(|| Status::internal(format!("{method} answered without a stream")))?;
    Ok((reply.metadata, stream))
}

/// The method's `option idempotency_level`, which lets the channel retransmit safely.
pub fn idempotency(method: &MethodDescriptor) -> Idempotency {
    match method
        .options()
        .get_field_by_name("idempotency_level")
        .as_deref()
    {
        Some(Value::EnumNumber(1)) => Idempotency::NoSideEffects,
        Some(Value::EnumNumber(2)) => Idempotency::Idempotent,
        _ => Idempotency::Unknown,
    }
}

/// Where `-d` reads from.
pub enum Input {
    /// No `-d`.
    None,
    /// Literal JSON text.
    Text(String),
    /// A file (`@FILE`) or standard input (`@-`).
    Reader(Box<dyn Read + Send>),
}

/// `reader` past the byte-order mark some editors write first, which is not JSON:
/// looked for at the first read (standard input is not waited for before that).
/// Whether standard input is a pipe, or a file with something in it: requests a user
/// meant to send (`... | rpc call ... Sum`), not a terminal or `/dev/null`.
fn stdin_is_piped() -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata("/dev/stdin").is_ok_and(|meta| {
        meta.file_type().is_fifo() || (meta.file_type().is_file() && meta.len() > 0)
    })
}

fn without_bom<R: std::io::BufRead + Send + 'static>(reader: R) -> Box<dyn Read + Send> {
    Box::new(SkipBom {
        reader,
        started: false,
    })
}

/// See [`without_bom`].
struct SkipBom<R> {
    reader: R,
    started: bool,
}

impl<R: std::io::BufRead> Read for SkipBom<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.started {
            self.started = true;
            if self.reader.fill_buf()?.starts_with(b"\xef\xbb\xbf") {
                self.reader.consume(3);
            }
        }
        self.reader.read(buf)
    }
}

impl Input {
    /// `-d`'s value: `@-` (or `@` alone, as grpcurl's) for standard input, `@FILE` or
    /// JSON text.
    pub fn open(data: Option<&str>) -> Result<Input, Failure> {
        Ok(match data {
            None => Input::None,
            Some("@-" | "@") => {
                Input::Reader(without_bom(std::io::BufReader::new(std::io::stdin())))
            }
            Some(file) if file.starts_with('@') => {
                let path = &file[1..];
                let file = std::fs::File::open(path)
                    .map_err(|err| Failure::error(format!("-d @{path}: {err}")))?;
                if file.metadata().is_ok_and(|m| m.is_dir()) {
                    return Err(Failure::error(format!(
                        "-d @{path}: a directory; give a file of JSON requests"
                    )));
                }
                Input::Reader(without_bom(std::io::BufReader::new(file)))
            }
            Some(text) => Input::Text(text.to_owned()),
        })
    }

    fn into_reader(self) -> Box<dyn Read + Send> {
        match self {
            Input::None => Box::new(std::io::empty()),
            Input::Text(text) => Box::new(std::io::Cursor::new(text.into_bytes())),
            Input::Reader(reader) => reader,
        }
    }

    /// Exactly one request message (`{}` without `-d`) for `method` (named `name`),
    /// encoded: the types its `Any` values name are looked up first (by reflection),
    /// and `method` is then looked up again, in the pool that now has them.
    pub async fn single(
        self,
        schemas: &mut Schemas,
        name: &str,
        method: &mut MethodDescriptor,
    ) -> Result<Bytes, Failure> {
        let value = self.single_value()?;
        let mut types = Vec::new();
        if let Some(value) = &value {
            json::json_any_types(value, &mut types);
        }
        if schemas.resolve(&types).await {
            *method = schemas.method(name).await?;
        }
        encode_request(&method.input(), value)
    }

    /// Exactly one JSON value, if `-d` was given.
    fn single_value(self) -> Result<Option<serde_json::Value>, Failure> {
        if let Input::None = self {
            return Ok(None);
        }
        let mut values = json::values(self.into_reader());
        let value = match values.next() {
            Some(value) => value.map_err(Failure::error)?,
            // Empty (`-d ''`, an empty file or standard input): the empty request, as
            // without -d (and as grpcurl's).
            None => return Ok(None),
        };
        match values.next() {
            None => {}
            // What follows the value is not JSON: say what is wrong with it.
            Some(Err(err)) => return Err(Failure::error(format!("-d: after the request: {err}"))),
            Some(Ok(_)) => {
                return Err(Failure::error(
                    "-d holds more than one JSON value, and the method takes one request",
                ))
            }
        }
        Ok(Some(value))
    }

    /// Request messages read on a thread and sent as each is complete; a value that is
    /// not JSON or does not fit is reported on `errors`, and the stream of messages
    /// then stays open, neither ending (a half-close would tell the server the input
    /// was whole) nor sending more, until the call is dropped (cancelled).
    fn stream(
        self,
        descriptor: MessageDescriptor,
        limit: Option<usize>,
    ) -> (MessageStream, tokio::sync::oneshot::Receiver<Failure>) {
        // A few messages ahead of the stream, no more: the reader waits while the
        // stream's credit holds the messages back (a slow server), rather than reading
        // the whole input into memory.
        // `None`: the input broke off at a bad request.
        let (tx, rx) = tokio::sync::mpsc::channel::<Option<Payload>>(INPUT_AHEAD);
        let (error_tx, error_rx) = tokio::sync::oneshot::channel();
        let reader = self.into_reader();
        // A JSON array stands for its elements, one request each (as ghz reads one),
        // unless the request's JSON form is an array itself.
        let arrays = !matches!(
            descriptor.full_name(),
            "google.protobuf.ListValue" | "google.protobuf.Value"
        );
        std::thread::spawn(move || {
            let mut error_tx = Some(error_tx);
            let mut i = 0;
            json::each_value(reader, arrays, &mut |value| {
                i += 1;
                let message = value
                    .map_err(|e| Failure::error(format!("request {i}: {e}")))
                    .and_then(|value| {
                        json::from_value(&descriptor, value)
                            .map_err(|e| Failure::error(format!("request {i}: {e}")))
                    })
                    .and_then(|message| {
                        let bytes = Bytes::from(json::encode(&message));
                        within_limit(limit, &format!("request {i}"), bytes.len()).map(|()| bytes)
                    });
                match message {
                    Ok(bytes) => tx.blocking_send(Some(Payload::from(bytes))).is_ok(),
                    Err(failure) => {
                        if let Some(error_tx) = error_tx.take() {
                            let _ = error_tx.send(failure);
                        }
                        let _ = tx.blocking_send(None);
                        false
                    }
                }
            });
        });
        let messages = futures::stream::unfold(rx, |mut rx| async {
            match rx.recv().await? {
                Some(message) => Some((message, rx)),
                // Not the end of the input: the call is cancelled instead.
                None => std::future::pending().await,
            }
        });
        (messages.boxed(), error_rx)
    }
}

/// Request messages read from `-d` ahead of a stream's sending.
const INPUT_AHEAD: usize = 4;

/// How long a call whose request stream broke off at a bad request is still read, for
/// the answers to the requests before it, when the method streams answers (a client
/// stream's one answer can only come after the whole input: it is cancelled at once).
const INPUT_ERROR_GRACE: Duration = Duration::from_secs(2);

/// `google.rpc.Status`, the usual content of a status's details.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google/rpc/error_details.proto` (googleapis, Apache-2.0): the detail types servers
/// put in a status (`ErrorInfo`, `BadRequest`, `RetryInfo`, ...), known to `rpc`
/// whatever the server's own schema holds.
const ERROR_DETAILS_PROTO: &str = include_str!("../proto/google/rpc/error_details.proto");

/// The pool of [`ERROR_DETAILS_PROTO`], compiled the first time a detail's type is not
/// in the call's own schema.
fn error_details_pool() -> Option<&'static DescriptorPool> {
    use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

    struct Embedded;
    impl FileResolver for Embedded {
        fn open_file(&self, name: &str) -> Result<File, protox::Error> {
            match name {
                "google/rpc/error_details.proto" => File::from_source(name, ERROR_DETAILS_PROTO),
                _ => Err(protox::Error::file_not_found(name)),
            }
        }
    }

    static POOL: std::sync::OnceLock<Option<DescriptorPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let mut files = ChainFileResolver::new();
        files.add(Embedded);
        files.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(files);
        compiler.include_imports(true);
        compiler.open_file("google/rpc/error_details.proto").ok()?;
        DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set()).ok()
    })
    .as_ref()
}

/// A status's details as JSON: a `google.rpc.Status` with each detail decoded when the
/// pool (or `google.rpc`'s error details, which `rpc` knows) has its type, else the raw
/// bytes in base64.
pub fn decode_details(details: &[u8], pool: &DescriptorPool) -> Option<String> {
    if details.is_empty() {
        return None;
    }
    let base64 = base64::engine::general_purpose::STANDARD;
    let Ok(status) = RpcStatus::decode(details) else {
        return Some(format!("{{\"raw\": \"{}\"}}", base64.encode(details)));
    };
    let items: Vec<serde_json::Value> = status
        .details
        .iter()
        .map(|any| {
            let name = any.type_url.rsplit('/').next().unwrap_or_default();
            let decoded = pool
                .get_message_by_name(name)
                .or_else(|| error_details_pool()?.get_message_by_name(name))
                // No more elements than a response may have (else base64).
                .filter(|d| json::check_elements(d, &any.value, false).is_ok())
                .and_then(|d| DynamicMessage::decode(d, any.value.as_slice()).ok())
                // Nested no deeper than a response may be (Any values included):
                // printing recurses into every Any, and a server's details of Anys in
                // Anys, 45 bytes a level, overflowed the stack. Deeper: base64.
                .filter(|m| json::message_any_types(m, &mut Vec::new()).is_ok())
                .and_then(|m| json::to_json(&m, PrintOptions::default()).ok())
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
            match decoded {
                // `Any`'s JSON mapping: a message's fields beside "@type", but a
                // well-known type's JSON form (an object too for `Struct`, `Empty`,
                // `Any`) under "value".
                Some(serde_json::Value::Object(fields))
                    if !name.starts_with("google.protobuf.") =>
                {
                    // "@type" first, as an `Any` prints.
                    let mut object = serde_json::Map::new();
                    object.insert("@type".into(), any.type_url.clone().into());
                    object.extend(fields);
                    serde_json::Value::Object(object)
                }
                // A well-known type with a JSON form of its own, as `Any` maps it.
                Some(value) => serde_json::json!({"@type": any.type_url, "value": value}),
                None => {
                    serde_json::json!({"@type": any.type_url, "value": base64.encode(&any.value)})
                }
            }
        })
        .collect();
    Some(
        serde_json::json!({"code": status.code, "message": status.message, "details": items})
            .to_string(),
    )
}

/// A failed call as a [`Failure`]: code, message and decoded details; with `verbose`
/// the status's metadata (trailers) is printed first.
pub fn status_failure(status: &Status, pool: &DescriptorPool, verbose: bool) -> Failure {
    if verbose && !status.metadata().is_empty() {
        crate::exit::write_stderr(&metadata::format(status.metadata(), "trailer: "));
    }
    Failure::status(status, decode_details(status.details(), pool))
}

/// Decodes a response, its elements counted first on its encoding (decoding makes a
/// value of each: see [`json::check_elements`]); `emit_defaults` as it will print.
fn decode(
    descriptor: &MessageDescriptor,
    bytes: Bytes,
    emit_defaults: bool,
) -> Result<DynamicMessage, Failure> {
    json::check_elements(descriptor, &bytes, emit_defaults).map_err(Failure::error)?;
    // The server's fault (or a schema that is not the server's): INTERNAL, as gRPC's
    // clients report a response they cannot decode.
    DynamicMessage::decode(descriptor.clone(), bytes).map_err(|err| {
        Failure::status(
            &Status::internal(format!(
                "a response does not decode as {}: {err} (does the schema match the server's?)",
                descriptor.full_name()
            )),
            None,
        )
    })
}

/// `--max-message-size` on each message: the frame limit set from it leaves room for
/// the metadata, so a message a little over the size got through (from a review: 16
/// KB sent and taken under `--max-message-size 1KiB`). `RESOURCE_EXHAUSTED`, as a
/// server's limit is.
pub(crate) fn within_limit(limit: Option<usize>, what: &str, len: usize) -> Result<(), Failure> {
    match over_limit(limit, what, len) {
        Some(status) => Err(Failure::status(&status, None)),
        None => Ok(()),
    }
}

/// The status of [`within_limit`]'s refusal, if `len` is over `limit` (bench counts
/// it among its calls' statuses).
pub(crate) fn over_limit(limit: Option<usize>, what: &str, len: usize) -> Option<Status> {
    let max = limit.filter(|&max| len > max)?;
    Some(Status::resource_exhausted(format!(
        "{what} of {len} bytes is over --max-message-size, {max} bytes"
    )))
}

/// One request message from its JSON value (`{}` for none), encoded.
fn encode_request(
    descriptor: &MessageDescriptor,
    value: Option<serde_json::Value>,
) -> Result<Bytes, Failure> {
    let Some(value) = value else {
        return Ok(Bytes::new());
    };
    let message = json::from_value(descriptor, value).map_err(|e| Failure::error(e.to_string()))?;
    Ok(Bytes::from(json::encode(&message)))
}

/// Decodes a response and prints it as JSON. The types of its `Any` values that the
/// schema lacks are asked of the server's reflection first, as they appear (an `Any`
/// inside an `Any` takes one more round). Each message is decoded against the pool as
/// it is now: types found for an earlier message of a stream count for the next.
async fn show(
    schemas: &mut Schemas,
    descriptor: &MessageDescriptor,
    bytes: Bytes,
    options: PrintOptions,
) -> Result<(), Failure> {
    let current = |schemas: &Schemas| {
        schemas
            .pool()
            .get_message_by_name(descriptor.full_name())
            .unwrap_or_else(|| descriptor.clone())
    };
    let mut message = decode(&current(schemas), bytes.clone(), options.emit_defaults)?;
    let too_deep = |err: String| Failure::error(format!("a response does not print: {err}"));
    for _ in 0..MAX_ANY_ROUNDS {
        let mut types = Vec::new();
        json::message_any_types(&message, &mut types).map_err(too_deep)?;
        let pool = message.descriptor().parent_pool().clone();
        types.retain(|name| pool.get_message_by_name(name).is_none());
        if types.is_empty() || !schemas.resolve(&types).await {
            break;
        }
        message = decode(&current(schemas), bytes.clone(), options.emit_defaults)?;
    }
    // The last round's types may have let more Any values decode.
    json::message_any_types(&message, &mut Vec::new()).map_err(too_deep)?;
    print(&message, options)
}

/// Why a response does not print, with what to do about it: an `Any` of a type
/// nobody has is the user's to supply; anything else is a value the server sent that
/// proto3 JSON cannot write (a `Timestamp` or `Duration` out of its range, a
/// non-finite number in a `google.protobuf.Value`), the server's to mend.
fn unprintable_reason(err: &str) -> String {
    let unknown_type =
        (err.starts_with("message '") && err.ends_with("' not found")) || err.contains("type url");
    if err.contains("has no JSON form") {
        // Says what it is already (a Duration's or Timestamp's fields that disagree).
        err.to_owned()
    } else if unknown_type {
        format!(
            "{err} (an Any holds a type that neither the schema nor the server's reflection \
             has; give its .proto with --proto, with the service's own .proto files: \
             --proto replaces reflection)"
        )
    } else {
        format!(
            "{err} (the server sent a value that proto3 JSON has no form for: a \
             Timestamp or Duration out of its range, or a non-finite number in a \
             google.protobuf.Value)"
        )
    }
}

/// Rounds of looking up `Any` types for one message (nested `Any`s take one each).
const MAX_ANY_ROUNDS: usize = 4;

fn print(message: &DynamicMessage, options: PrintOptions) -> Result<(), Failure> {
    let text = json::to_json(message, options).map_err(|err| {
        Failure::error(format!(
            "a response does not print as JSON: {}",
            unprintable_reason(&err)
        ))
    })?;
    // A server's strings may hold C1 controls and bidirectional overrides, which JSON
    // leaves as they are: written as `\u` escapes (still the same JSON), never as
    // terminal controls, as a status message's are.
    let mut text = crate::exit::printable_json(&text).into_owned();
    text.push('\n');
    crate::exit::write_stdout(text.as_bytes())
}

/// Runs `rpc call`.
pub async fn run(args: CallArgs) -> Result<(), Failure> {
    let request_metadata = metadata::parse_headers(&args.conn.headers, &args.conn.uri)?;
    let timeout = args.conn.deadline(Some(DEFAULT_TIMEOUT));
    // Opened before connecting: a `-d @FILE` that cannot be read is the user's input
    // to fix (exit 1), not a server that cannot be reached (found in review).
    let input = Input::open(args.data.as_deref())?;
    // `--proto` and `--protoset` files too, and the method in them.
    let (mut target, mut schemas, mut method) =
        Schemas::connect_to_method(&args.conn, &args.schema, &args.method, &request_metadata)
            .await?;
    // (`-d ''` as well: from a review, no note was printed for it.)
    let no_data = args
        .data
        .as_deref()
        .is_none_or(|data| data.trim().is_empty());
    if method.is_client_streaming() && no_data && stdin_is_piped() {
        // Requests piped in without `-d @-` would be silently left unread.
        crate::exit::write_stderr(
            "note: standard input is not read without `-d @-`: this stream sends no request\n",
        );
    }
    // One request read whole: the types its `Any` values name are looked up first.
    let single = if method.is_client_streaming() {
        Err(input)
    } else {
        Ok(input
            .single(&mut schemas, &args.method, &mut method)
            .await?)
    };
    schemas.release();
    let result = exchange(
        &args,
        &mut target,
        &mut schemas,
        &method,
        single,
        request_metadata,
        timeout,
    )
    .await;
    // What the call queued (its CANCEL, if it ended at its deadline) goes out before
    // the process exits.
    drop(schemas);
    target.close().await;
    result
}

/// The call itself, once connected and its request read: `single` is the request of
/// a method that is not client streaming, or the input to stream from.
async fn exchange(
    args: &CallArgs,
    target: &mut Target,
    schemas: &mut Schemas,
    method: &MethodDescriptor,
    single: Result<Bytes, Input>,
    request_metadata: Metadata,
    timeout: Option<Duration>,
) -> Result<(), Failure> {
    let path = format!("{}/{}", method.parent_service().full_name(), method.name());
    let verbose = args.verbose;
    let options = PrintOptions {
        emit_defaults: args.emit_defaults,
        proto_names: args.proto_names,
        pretty: !args.compact,
    };
    let stream_options = PrintOptions {
        pretty: false,
        ..options
    };
    let limit = args.conn.max_message_size;
    if let Ok(payload) = &single {
        within_limit(limit, "the request", payload.len())?;
    }

    if !method.is_client_streaming() && !method.is_server_streaming() {
        // Read whole above: a unary method is not client streaming.
        let payload = single.unwrap_or_default();
        let call = unary_call(
            &path,
            idempotency(method),
            request_metadata,
            timeout,
            payload,
        );
        let reply = match unary(target, call, &args.retry, verbose).await {
            Ok(reply) => reply,
            Err(status) => return Err(call_failure(schemas, &status, verbose).await),
        };
        if verbose {
            crate::exit::write_stderr(&metadata::format(&reply.metadata, "header: "));
        }
        within_limit(limit, "the response", reply.payload.len())?;
        return show(schemas, &method.output(), reply.payload, options).await;
    }

    let (messages, mut input_errors) = match single {
        Err(input) => input.stream(method.input(), limit),
        Ok(payload) => {
            let (_tx, rx) = tokio::sync::oneshot::channel();
            let one: MessageStream = futures::stream::iter([Payload::from(payload)]).boxed();
            (one, rx)
        }
    };
    let result = {
        let call = async {
            let (headers, mut responses) =
                open_stream(target, &path, request_metadata, timeout, messages)
                    .await
                    .map_err(Ended::Status)?;
            if verbose {
                crate::exit::write_stderr(&metadata::format(&headers, "header: "));
            }
            let mut count = 0usize;
            // A client stream's one answer, shown once the stream has ended with no
            // second (from a review: the first of two was printed on standard output
            // before the error, a valid-looking answer to a script).
            let mut answer = None;
            while let Some(message) = responses.next().await {
                let message = message.map_err(Ended::Status)?;
                count += 1;
                within_limit(limit, &format!("response {count}"), message.len())?;
                if method.is_server_streaming() {
                    show(schemas, &method.output(), message, stream_options).await?;
                } else if count == 1 {
                    answer = Some(message);
                } else {
                    decode(&method.output(), message, options.emit_defaults)?;
                }
            }
            if let (Some(message), 1) = (answer, count) {
                show(schemas, &method.output(), message, options).await?;
            }
            if !method.is_server_streaming() && count != 1 {
                // A cardinality violation: UNIMPLEMENTED, as gRPC's status code table
                // has it (and the generated stubs report it).
                return Err(Ended::Failure(Failure::status(
                    &Status::unimplemented(format!(
                        "{path} answered with {count} messages instead of one"
                    )),
                    None,
                )));
            }
            if verbose {
                if let Some(trailers) = responses.trailers() {
                    crate::exit::write_stderr(&metadata::format(trailers, "trailer: "));
                }
            }
            Ok(())
        };
        tokio::pin!(call);
        tokio::select! {
            biased;
            Ok(failure) = &mut input_errors => {
                // The input broke off at a bad request: the call is cancelled
                // (dropped), never half-closed, so the server does not take the
                // requests before it for the whole input (a client stream's answer
                // would be the sum of a partial upload). A method that streams answers
                // has those to the requests before it (which the server ran) shown as
                // they come, for a moment, first.
                if method.is_server_streaming() {
                    let _ = tokio::time::timeout(INPUT_ERROR_GRACE, &mut call).await;
                }
                Err(Ended::Failure(failure))
            }
            result = &mut call => result,
        }
    };
    // A bad request value ends the input; report it even if the call then ended.
    if let Ok(failure) = input_errors.try_recv() {
        return Err(failure);
    }
    match result {
        Ok(()) => Ok(()),
        Err(Ended::Failure(failure)) => Err(failure),
        Err(Ended::Status(status)) => Err(call_failure(schemas, &status, verbose).await),
    }
}

/// The unary call `call` on `target`, through the framework's retry layer when
/// `--retries` asks for it (see [`RetryArgs`]).
async fn unary(
    target: &mut Target,
    call: ClientCall,
    retry: &RetryArgs,
    verbose: bool,
) -> Result<ClientReply, Status> {
    let Some(retries) = retry.retries.filter(|&retries| retries > 0) else {
        return target.ready().await?.call(call).await;
    };
    let mut policy = RetryPolicy {
        max_attempts: retries + 1,
        at_most_once: retry.at_most_once,
        ..RetryPolicy::default()
    };
    if !retry.retry_on.is_empty() {
        policy.retryable_codes = retry.retry_on.clone();
    }
    if retry.idempotent {
        let safe = MethodRetry {
            safe_to_repeat: Some(true),
            ..MethodRetry::default()
        };
        policy = policy.with_method(call.method.as_str(), safe);
    }
    let attempts = Attempts {
        inner: target.clone(),
        verbose,
    };
    RetryLayer::new(policy).layer(attempts).oneshot(call).await
}

/// The target under the retry layer: with `-v`, each failed attempt is told on
/// stderr (the last one's status is then the command's error too).
#[derive(Clone)]
struct Attempts {
    inner: Target,
    verbose: bool,
}

impl Service<ClientCall> for Attempts {
    type Response = ClientReply;
    type Error = Status;
    type Future = futures::future::BoxFuture<'static, Result<ClientReply, Status>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ClientCall) -> Self::Future {
        // Read here, in `call`, where the retry layer sets it.
        let attempt = rpc_core::retry::current_attempt().unwrap_or(1);
        let reply = self.inner.call(call);
        let verbose = self.verbose;
        Box::pin(async move {
            let result = reply.await;
            if let (Err(status), true) = (&result, verbose) {
                crate::exit::write_stderr(&format!("attempt {attempt} failed: {status}\n"));
            }
            result
        })
    }
}

/// How a call ended when it did not succeed: a failure of the CLI's own, or the
/// call's status (whose details may name types to look up before it is printed).
enum Ended {
    Failure(Failure),
    Status(Status),
}

impl From<Failure> for Ended {
    fn from(failure: Failure) -> Ended {
        Ended::Failure(failure)
    }
}

/// A failed call as a [`Failure`] ([`status_failure`]), the types of its details that
/// neither the schema nor `google.rpc`'s error details have asked of the server's
/// reflection first (as a response's `Any` types are): a detail of a type from a file
/// the method's own do not import printed as base64, though the server described it.
async fn call_failure(schemas: &mut Schemas, status: &Status, verbose: bool) -> Failure {
    let missing: Vec<String> = detail_types(status.details())
        .into_iter()
        .filter(|name| {
            schemas.pool().get_message_by_name(name).is_none()
                && error_details_pool()
                    .and_then(|pool| pool.get_message_by_name(name))
                    .is_none()
        })
        .collect();
    if !missing.is_empty() && schemas.is_reflection() {
        schemas.resolve(&missing).await;
    }
    status_failure(status, schemas.pool(), verbose)
}

/// The message types (full names) of the `Any` values of a status's details, if they
/// are a `google.rpc.Status`; at most [`MAX_DETAIL_TYPES`] of them.
fn detail_types(details: &[u8]) -> Vec<String> {
    let Ok(status) = RpcStatus::decode(details) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    for any in &status.details {
        let name = any.type_url.rsplit('/').next().unwrap_or_default();
        if !name.is_empty() && !names.iter().any(|known| known == name) {
            names.push(name.to_owned());
        }
        if names.len() == MAX_DETAIL_TYPES {
            break;
        }
    }
    names
}

/// Most types of a status's details looked up by reflection.
const MAX_DETAIL_TYPES: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// A response that does not print gets the advice that fits: `--proto` for an
    /// `Any` of an unknown type, not for a `Timestamp` out of range (from a review:
    /// the Any advice was given for both).
    #[test]
    fn unprintable_responses_get_the_advice_that_fits() {
        let pool = DescriptorPool::global();
        let timestamp = pool
            .get_message_by_name("google.protobuf.Timestamp")
            .unwrap();
        let mut late = DynamicMessage::new(timestamp);
        late.set_field_by_name("seconds", prost_reflect::Value::I64(i64::MAX));
        let err = json::to_json(&late, PrintOptions::default()).unwrap_err();
        let reason = unprintable_reason(&err);
        assert!(reason.contains("out of its range"), "{reason}");
        assert!(!reason.contains("--proto"), "{reason}");

        let any = pool.get_message_by_name("google.protobuf.Any").unwrap();
        let mut unknown = DynamicMessage::new(any);
        unknown.set_field_by_name(
            "type_url",
            prost_reflect::Value::String("type.googleapis.com/nobody.Knows".into()),
        );
        let err = json::to_json(&unknown, PrintOptions::default()).unwrap_err();
        let reason = unprintable_reason(&err);
        assert!(reason.contains("--proto"), "{reason}");
    }

    #[test]
    fn details_decode_as_google_rpc_status() {
        let pool = DescriptorPool::global();
        let status = RpcStatus {
            code: 5,
            message: "gone".into(),
            details: vec![
                prost_types::Any {
                    type_url: "type.googleapis.com/google.protobuf.Duration".into(),
                    value: prost_types::Duration {
                        seconds: 2,
                        nanos: 0,
                    }
                    .encode_to_vec(),
                },
                prost_types::Any {
                    type_url: "type.googleapis.com/acme.Unknown".into(),
                    value: vec![1, 2],
                },
                // A well-known type whose JSON is an object: under "value", as Any's
                // mapping has it (its keys were put beside "@type").
                prost_types::Any {
                    type_url: "type.googleapis.com/google.protobuf.Struct".into(),
                    value: prost_types::Struct {
                        fields: [(
                            "@type".to_owned(),
                            prost_types::Value {
                                kind: Some(prost_types::value::Kind::StringValue("x".into())),
                            },
                        )]
                        .into(),
                    }
                    .encode_to_vec(),
                },
                // google.rpc.ErrorInfo { reason: "QUOTA", domain: "d" }: not in the
                // pool given, known to `rpc` itself.
                prost_types::Any {
                    type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
                    value: vec![10, 5, b'Q', b'U', b'O', b'T', b'A', 18, 1, b'd'],
                },
            ],
        };
        let text = decode_details(&status.encode_to_vec(), &pool).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["code"], 5);
        assert_eq!(json["message"], "gone");
        assert_eq!(json["details"][0]["value"], "2s");
        assert_eq!(
            json["details"][1]["@type"],
            "type.googleapis.com/acme.Unknown"
        );
        assert_eq!(json["details"][1]["value"], "AQI=");
        assert_eq!(
            json["details"][2],
            serde_json::json!({
                "@type": "type.googleapis.com/google.protobuf.Struct",
                "value": {"@type": "x"}
            })
        );
        assert_eq!(json["details"][3]["reason"], "QUOTA", "{json}");
        assert_eq!(json["details"][3]["domain"], "d", "{json}");
        assert_eq!(decode_details(&[], &pool), None);
        assert_eq!(
            decode_details(&[0xff, 0xff], &pool).as_deref(),
            Some("{\"raw\": \"//8=\"}")
        );
    }

    /// A server's details of Anys nested in Anys, deeper than a response may nest, are
    /// shown as base64 rather than printed: printing recursed into each (45 bytes a
    /// level, with no limit of prost's to stop it) and overflowed the stack.
    #[test]
    fn details_of_anys_nested_too_deep_are_base64() {
        let any_url = "type.googleapis.com/google.protobuf.Any".to_string();
        let mut value = prost_types::Any::default().encode_to_vec();
        for _ in 0..5_000 {
            value = prost_types::Any {
                type_url: any_url.clone(),
                value,
            }
            .encode_to_vec();
        }
        let status = RpcStatus {
            code: 3,
            message: "deep".into(),
            details: vec![prost_types::Any {
                type_url: any_url,
                value,
            }],
        };
        // On a thread with a small stack: no overflow even there.
        let text = std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(move || decode_details(&status.encode_to_vec(), &DescriptorPool::global()))
            .unwrap()
            .join()
            .expect("printing the details overflowed the stack")
            .unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(json["details"][0]["value"].is_string(), "{text:.200}");
    }
}
