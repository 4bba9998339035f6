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
//! 400,000 tiny messages is 9.5 MB on the wire and more than 1 GB once linked), and so
//! is their time: the lookups of one command take at most twice `--timeout` in all.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::{channel::mpsc, StreamExt};
use prost::Message;
use prost_reflect::DescriptorPool;
use prost_types::FileDescriptorProto;
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

/// Most files fetched for one symbol (its transitive dependencies), and taken from
/// one response: bounds what a hostile server can make the CLI fetch.
const MAX_FILES: usize = 10_000;

/// Most services one `list_services` answer may name.
const MAX_SERVICES: usize = 100_000;

/// Most bytes of file descriptors taken from a server in one command; each file
/// counts for at least [`MIN_FILE_COST`].
const MAX_DESCRIPTOR_BYTES: usize = 32 << 20;

/// What a file descriptor counts against [`MAX_DESCRIPTOR_BYTES`] at least: an empty
/// one decodes to a struct of some hundred bytes.
const MIN_FILE_COST: usize = 1024;

/// Most messages, enums and services the descriptors of one command may define (each
/// costs a few KiB once linked); real schemas define a few thousand.
const MAX_TYPES: usize = 20_000;

/// Most elements of repeated fields (fields, values, methods, options, comments,
/// source locations...) the descriptors of one command may hold: each decodes to a
/// struct of up to a few hundred bytes from as little as two bytes on the wire, which
/// is what makes a few MB of descriptor take gigabytes.
const MAX_ELEMENTS: usize = 500_000;

/// Why reflection could not answer.
#[derive(Debug)]
pub enum ReflectionError {
    /// The server serves neither `grpc.reflection.v1` nor `v1alpha`; with the HTTP
    /// answer that said so over `grpc://` when it was not gRPC's own (a proxy with no
    /// route for the service, or a server that is no gRPC server).
    NotServed(Option<String>),
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
    /// The lookups' time, one budget for the command (a stream opened gets what is left
    /// of it, at most `timeout`).
    budget: Budget,
    /// A kept stream that failed was reopened since the last `close`: only once.
    reopened: bool,
    /// What the server's descriptors have cost so far, against the bounds above.
    bytes: usize,
    types: usize,
    elements: usize,
}

/// The time the reflection lookups of one command may take in all: twice `--timeout`,
/// spent in batches (from the first request after a [`close`](Reflection::close) to the
/// next `close`). Made once per command and never renewed: a `close` ends a batch and
/// charges its time, so that a server whose every response names a type to look up
/// (each looked up in a batch of its own) cannot make the lookups run past the budget
/// (from a review: each batch had a fresh twice `--timeout`). The time between batches
/// (a long stream's wait for its next response) is not charged.
#[derive(Debug)]
struct Budget {
    /// What is left of it, the current batch's time not yet charged.
    left: Duration,
    /// When the current batch began (`None` between batches).
    batch: Option<Instant>,
}

impl Budget {
    /// A budget of twice `timeout`.
    fn new(timeout: Duration) -> Budget {
        Budget {
            left: timeout.saturating_mul(2),
            batch: None,
        }
    }

    /// Begins a batch at `now`, unless one is running.
    fn begin(&mut self, now: Instant) {
        if self.batch.is_none() {
            self.batch = Some(now);
        }
    }

    /// The end of the current batch's time: when what was left at its beginning runs
    /// out (`None` between batches, or when it would not fit in an `Instant`).
    fn until(&self) -> Option<Instant> {
        self.batch?.checked_add(self.left)
    }

    /// Ends the current batch at `now`, charging its time.
    fn end(&mut self, now: Instant) {
        if let Some(began) = self.batch.take() {
            self.left = self
                .left
                .saturating_sub(now.saturating_duration_since(began));
        }
    }
}

/// The open reflection stream: each request sent is answered by one response.
struct Open {
    requests: mpsc::UnboundedSender<Payload>,
    responses: RawStreaming,
}

/// How long a closed reflection stream's end is waited for in the background.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

impl Drop for Reflection {
    fn drop(&mut self) {
        self.close();
    }
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
            budget: Budget::new(timeout),
            reopened: false,
            bytes: 0,
            types: 0,
            elements: 0,
        }
    }

    /// One request, one response; tries v1 then v1alpha the first time.
    async fn ask(&mut self, request: MessageRequest) -> Result<MessageResponse, ReflectionError> {
        let request = ServerReflectionRequest {
            message_request: Some(request),
            ..Default::default()
        };
        self.budget.begin(Instant::now());
        let methods: &[&'static str] = match self.method {
            Some(method) => &[method][..],
            None => &[V1, V1ALPHA],
        };
        let mut http_answer = None;
        for &method in methods {
            let reused = self.open.is_some();
            let mut answer = self.ask_on(method, &request).await;
            let stream_failed = answer.as_ref().is_err_and(|status| {
                matches!(
                    status.code(),
                    Code::UNAVAILABLE | Code::DEADLINE_EXCEEDED | Code::CANCELLED
                )
            });
            if reused && stream_failed && !self.reopened {
                // The stream kept from an earlier request may have run out of its
                // time or been ended by the server: once more on a new one (once: a
                // server answering each request just within the time had every
                // import's request reopen a stream, a lookup of 8 files taking 8
                // times --timeout).
                self.reopened = true;
                self.open = None;
                answer = self.ask_on(method, &request).await;
            }
            match answer {
                Err(status) if status.code() == Code::UNIMPLEMENTED && self.method.is_none() => {
                    self.open = None;
                    // The gRPC transport's words for an HTTP status without gRPC's.
                    if status
                        .message()
                        .starts_with("the server answered with HTTP")
                    {
                        http_answer = Some(status.message().to_owned());
                    }
                }
                Err(status) => {
                    self.open = None;
                    // A stream that reached no server (no replica known, none
                    // connected in time) is no reflection's slowness: its own status
                    // says what happened (a review read "the server's reflection did
                    // not answer in time" for an etcd name with no replica).
                    let status =
                        if status.code() == Code::DEADLINE_EXCEEDED && !status.is_unprocessed() {
                            Status::deadline_exceeded(format!(
                                "the server's reflection did not answer in time (each stream \
                             within --timeout, {:?}, the command's lookups within twice \
                             that in all): {}",
                                self.timeout,
                                status.message()
                            ))
                        } else {
                            status
                        };
                    return Err(ReflectionError::Status(status));
                }
                Ok(response) => {
                    self.method = Some(method);
                    return match response.message_response {
                        Some(MessageResponse::ErrorResponse(error)) => {
                            // An error that says OK (code 0) is still an error: it
                            // printed "OK (0)" and exited 64, which docs/cli.md does
                            // not list (from a review).
                            let code = match Code::from_u32(error.error_code as u32) {
                                Code::OK => Code::INTERNAL,
                                code => code,
                            };
                            Err(ReflectionError::Status(Status::new(
                                code,
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
        Err(ReflectionError::NotServed(http_answer))
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
                let timeout = match self.budget.until() {
                    Some(until) => {
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(Status::deadline_exceeded(
                                "no time left for another stream",
                            ));
                        }
                        left.min(self.timeout)
                    }
                    None => self.timeout,
                };
                let (requests, queued) = mpsc::unbounded();
                let _ = requests.unbounded_send(payload);
                let (_, responses) = call::open_stream(
                    &mut self.target,
                    method,
                    self.metadata.clone(),
                    Some(timeout),
                    Box::pin(queued),
                )
                .await?;
                self.open.insert(Open {
                    requests,
                    responses,
                })
            }
        };
        let message = open.responses.next().await.ok_or_else(|| {
            Status::unavailable("the reflection stream ended without an answer")
        })??;
        // Counted before decoding, as 16 MiB of two-byte entries decode to gigabytes.
        let (files, services) = response_entries(&message)
            .ok_or_else(|| Status::internal("a reflection response does not decode"))?;
        if files > MAX_FILES || services > MAX_SERVICES {
            return Err(Status::resource_exhausted(format!(
                "a reflection response of more than {MAX_FILES} files or {MAX_SERVICES} \
                 services, more than this CLI takes"
            )));
        }
        ServerReflectionResponse::decode(message).map_err(|err| {
            Status::internal(format!("a reflection response does not decode: {err}"))
        })
    }

    /// The server this asks (a clone of the handle).
    pub fn target(&self) -> Target {
        self.target.clone()
    }

    /// Closes the reflection stream (the next request opens another): it holds a
    /// call slot of the channel, which the command's own calls should have. The time
    /// the lookups took since the last `close` is charged to the command's budget.
    pub fn close(&mut self) {
        if let Some(Open {
            requests,
            mut responses,
        }) = self.open.take()
        {
            // Half-closed, and its end read in the background: the server ends the
            // stream OK. Dropped whole, it was cancelled, and every `rpc` command
            // left a CANCELLED reflection call in the server's metrics and status
            // page (from two reviews). The channel's close at the command's end
            // waits for that end, within its grace.
            drop(requests);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let drained = async { while responses.next().await.is_some() {} };
                    let _ = tokio::time::timeout(CLOSE_WAIT, drained).await;
                });
            }
        }
        self.budget.end(Instant::now());
        self.reopened = false;
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

    /// The files asked for by `request` that `known` does not have, decoded, counted
    /// against the bounds first.
    async fn files(
        &mut self,
        request: MessageRequest,
        known: impl Fn(&str) -> bool,
    ) -> Result<Vec<FileDescriptorProto>, ReflectionError> {
        let MessageResponse::FileDescriptorResponse(files) = self.ask(request).await? else {
            return Err(ReflectionError::Status(Status::internal(
                "a file request was answered with something else",
            )));
        };
        let mut decoded = Vec::new();
        let mut names = std::collections::HashSet::new();
        for bytes in files.file_descriptor_proto {
            // Servers may send a file's imports with it, every time: those the pool
            // or this answer already has cost nothing again (up to 10,000 entries an
            // answer: looked up by name, not by a scan of those decoded).
            if let Some(name) = file_name(&bytes) {
                if known(name) || !names.insert(name.to_owned()) {
                    continue;
                }
            }
            self.bytes += bytes.len().max(MIN_FILE_COST);
            if self.bytes > MAX_DESCRIPTOR_BYTES {
                return Err(ReflectionError::BadDescriptor(format!(
                    "the server's file descriptors come to more than {} MiB, more than \
                     this CLI takes from reflection",
                    MAX_DESCRIPTOR_BYTES >> 20
                )));
            }
            // Counted before decoding: a few MB of tiny messages decode to gigabytes.
            let (types, elements) = definitions(&bytes).ok_or_else(|| {
                ReflectionError::BadDescriptor(
                    "a file descriptor from reflection does not decode (malformed, or \
                     nested more than 100 deep)"
                        .to_owned(),
                )
            })?;
            self.types += types;
            self.elements += elements;
            if self.types > MAX_TYPES {
                return Err(ReflectionError::BadDescriptor(format!(
                    "the server's file descriptors define more than {MAX_TYPES} messages, \
                     enums and services, more than this CLI takes from reflection"
                )));
            }
            if self.elements > MAX_ELEMENTS {
                return Err(ReflectionError::BadDescriptor(format!(
                    "the server's file descriptors hold more than {MAX_ELEMENTS} fields, \
                     values, methods, options and other repeated elements, more than this \
                     CLI takes from reflection"
                )));
            }
            let mut file = FileDescriptorProto::decode(bytes.clone()).map_err(|err| {
                ReflectionError::BadDescriptor(format!(
                    "a file descriptor from reflection does not decode: {err}"
                ))
            })?;
            crate::editions::normalize(&mut file, &bytes).map_err(|why| {
                ReflectionError::BadDescriptor(format!("a file descriptor from reflection: {why}"))
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
            .files(
                MessageRequest::FileContainingSymbol(symbol.to_owned()),
                |name| pool.get_file_by_name(name).is_some(),
            )
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
                let known = |n: &str| {
                    files.contains_key(n)
                        || pool.get_file_by_name(n).is_some()
                        || queue.iter().any(|f| f.name() == n)
                };
                let fetched = self
                    .files(MessageRequest::FileByFilename(dependency.clone()), known)
                    .await
                    .map_err(|err| match err {
                        // Not "no such symbol": the symbol's file was found. (A bound
                        // of this CLI's is said as it is.)
                        ReflectionError::Status(status)
                            if !matches!(
                                status.code(),
                                Code::RESOURCE_EXHAUSTED | Code::DEADLINE_EXCEEDED
                            ) =>
                        {
                            ReflectionError::BadDescriptor(format!(
                                "{} (which defines or leads to {symbol}) imports {}, which the \
                             server's reflection does not give: {} ({})",
                                crate::exit::printable(&name),
                                crate::exit::printable(dependency),
                                crate::exit::printable(status.message()),
                                crate::exit::code_name(status.code()),
                            ))
                        }
                        other => other,
                    })?;
                // An answer without the file asked for (an empty one, say) is the same
                // as a refusal: said naming both files, not later as a pool that does
                // not link.
                if !fetched.iter().any(|f| f.name() == dependency.as_str()) {
                    return Err(ReflectionError::BadDescriptor(format!(
                        "{} (which defines or leads to {symbol}) imports {}, which the \
                         server's reflection does not give (its answer left it out)",
                        crate::exit::printable(&name),
                        crate::exit::printable(dependency),
                    )));
                }
                queue.extend(fetched);
            }
            files.insert(name, file);
        }
        let files: Vec<FileDescriptorProto> = files.into_values().collect();
        check_links(&files).map_err(|why| {
            ReflectionError::BadDescriptor(format!(
                "the descriptors of {symbol} from reflection: {why}"
            ))
        })?;
        pool.add_file_descriptor_protos(files).map_err(|err| {
            ReflectionError::BadDescriptor(format!(
                "the descriptors of {symbol} from reflection do not link: {err}"
            ))
        })
    }
}

/// What a length-delimited field of `descriptor.proto` holds, for [`definitions`]: the
/// messages whose repeated fields can hold many elements, and everything else.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    File,
    Message,
    Field,
    Oneof,
    Enum,
    EnumValue,
    Service,
    Method,
    ExtensionRange,
    /// Any `*Options` message but `FieldOptions` and `ExtensionRangeOptions`.
    Options,
    FieldOptions,
    ExtensionRangeOptions,
    UninterpretedOption,
    SourceCodeInfo,
    Location,
    /// A string, bytes, or a message without repeated fields worth counting.
    Leaf,
}

/// Field `tag` of a `kind` message: what it holds, and whether it is repeated.
fn child(kind: Kind, tag: u32) -> (Kind, bool) {
    use Kind::*;
    match (kind, tag) {
        (File, 3) | (Message, 9 | 10) | (Enum, 4 | 5) | (Location, 6) => (Leaf, true),
        (File, 4) | (Message, 3) => (Message, true),
        (File, 5) | (Message, 4) => (Enum, true),
        (File, 6) => (Service, true),
        (File, 7) | (Message, 2 | 6) => (Field, true),
        (File, 8) | (Message, 7) | (Oneof, 2) | (Enum, 3) | (EnumValue, 3) => (Options, false),
        (Service, 3) | (Method, 4) => (Options, false),
        (File, 9) => (SourceCodeInfo, false),
        (Message, 5) => (ExtensionRange, true),
        (Message, 8) => (Oneof, true),
        (Field, 8) => (FieldOptions, false),
        (Enum, 2) => (EnumValue, true),
        (Service, 2) => (Method, true),
        (ExtensionRange, 3) => (ExtensionRangeOptions, false),
        (Options | FieldOptions | ExtensionRangeOptions, 999) => (UninterpretedOption, true),
        (FieldOptions, 20) | (ExtensionRangeOptions, 2) | (UninterpretedOption, 2) => (Leaf, true),
        (SourceCodeInfo, 1) => (Location, true),
        _ => (Leaf, false),
    }
}

/// The messages, enums and services (types), and the elements of repeated fields
/// (fields, values, methods, options, locations, strings...) that an encoded
/// `FileDescriptorProto` holds, nested ones included, read off the protobuf encoding
/// without decoding it (fields `descriptor.proto` does not have, which prost skips,
/// are not counted; a few of its newer ones that this prost-types may skip are,
/// which errs on the safe side). Packed numbers (a location's path and span) are
/// not counted: they decode to 4 bytes a wire byte at most, bounded by the bytes.
/// `None`
/// if it is malformed or nests deeper than prost decodes (100).
fn definitions(file: &[u8]) -> Option<(usize, usize)> {
    fn scan(bytes: &[u8], kind: Kind, depth: u32, counts: &mut (usize, usize)) -> Option<()> {
        if depth > 100 {
            return None;
        }
        length_delimited(bytes, |tag, inner| {
            let (nested, repeated) = child(kind, tag);
            counts.1 += usize::from(repeated);
            if matches!(nested, Kind::Message | Kind::Enum | Kind::Service) {
                counts.0 += 1;
            }
            if nested != Kind::Leaf {
                scan(inner, nested, depth + 1, counts)?;
            }
            Some(())
        })
    }
    let mut counts = (0, 0);
    scan(file, Kind::File, 0, &mut counts)?;
    Some(counts)
}

/// Checks an encoded `FileDescriptorSet` (a `--protoset` file) against the bounds
/// reflection's answers meet, on the encoding, before it is decoded: a few MB of tiny
/// fields decode to gigabytes. The reason, when it does not pass.
pub(crate) fn check_descriptor_set(set: &[u8]) -> Result<(), String> {
    if set.len() > MAX_DESCRIPTOR_BYTES {
        return Err(format!(
            "more than {} MiB of descriptors, more than this CLI takes",
            MAX_DESCRIPTOR_BYTES >> 20
        ));
    }
    let (mut types, mut elements) = (0usize, 0usize);
    length_delimited(set, |tag, file| {
        if tag == 1 {
            let (t, e) = definitions(file)?;
            types += t;
            elements += e + 1;
        }
        Some(())
    })
    .ok_or("not a FileDescriptorSet (malformed, or nested more than 100 deep)")?;
    if types > MAX_TYPES {
        return Err(format!(
            "it defines more than {MAX_TYPES} messages, enums and services, more than this \
             CLI takes"
        ));
    }
    if elements > MAX_ELEMENTS {
        return Err(format!(
            "it holds more than {MAX_ELEMENTS} fields, values, methods, options and other \
             repeated elements, more than this CLI takes"
        ));
    }
    Ok(())
}

/// The name (field 1) of an encoded `FileDescriptorProto`, if it has one that reads.
fn file_name(file: &[u8]) -> Option<&str> {
    let mut name = None;
    length_delimited(file, |tag, value| {
        if tag == 1 {
            // The last one wins, as when decoding.
            name = Some(std::str::from_utf8(value).ok()?);
        }
        Some(())
    })?;
    name
}

/// How many files (a `FileDescriptorResponse`'s entries) and services (a
/// `ListServiceResponse`'s) an encoded `ServerReflectionResponse` holds; `None` if it
/// is malformed at that level.
fn response_entries(response: &[u8]) -> Option<(usize, usize)> {
    let (mut files, mut services) = (0, 0);
    length_delimited(response, |tag, inner| {
        let count = match tag {
            4 => &mut files,    // file_descriptor_response
            6 => &mut services, // list_services_response
            _ => return Some(()),
        };
        length_delimited(inner, |tag, _| {
            *count += usize::from(tag == 1);
            Some(())
        })
    })?;
    Some((files, services))
}

/// Walks the fields of an encoded protobuf message, calling `each` with the number and
/// the bytes of every length-delimited one. `None` if the encoding is malformed, or if
/// `each` returns `None`.
fn length_delimited<'a>(
    bytes: &'a [u8],
    mut each: impl FnMut(u32, &'a [u8]) -> Option<()>,
) -> Option<()> {
    crate::editions::fields_of(bytes, |tag, value| match value {
        crate::editions::Value::Bytes(inner) => each(tag, inner),
        _ => Some(()),
    })
}

/// The encodings of the files of the encoded `FileDescriptorSet` `set`, in order (as
/// many as decode; the set was checked by [`check_descriptor_set`]).
pub(crate) fn set_files(set: &[u8]) -> Vec<&[u8]> {
    let mut files = Vec::new();
    length_delimited(set, |tag, file| {
        if tag == 1 {
            files.push(file);
        }
        Some(())
    });
    files
}

/// What prost-reflect takes from a server (or a file) without checking, and then
/// trips over: imports in a cycle (linking them recursed until the stack overflowed:
/// the process aborted) and map entries that are not `key = 1` and `value = 2` of a
/// key type maps can have (`describe` and the JSON mapping panicked on them). From a
/// review: a hostile or broken reflection service crashed the CLI. `files` are the
/// ones about to be linked; the pool's own are linked already, so a cycle must pass
/// through these.
pub(crate) fn check_links(files: &[FileDescriptorProto]) -> Result<(), String> {
    use prost_types::field_descriptor_proto::{Label, Type};
    use std::collections::HashMap;

    let by_name: HashMap<&str, &FileDescriptorProto> =
        files.iter().map(|f| (f.name(), f)).collect();
    // Depth-first, iteratively: 1 = on the path, 2 = done.
    let mut state: HashMap<&str, u8> = HashMap::new();
    for start in by_name.keys() {
        if state.contains_key(start) {
            continue;
        }
        let mut path: Vec<(&str, usize)> = vec![(start, 0)];
        state.insert(start, 1);
        while let Some((name, next)) = path.last_mut() {
            let deps = &by_name[*name].dependency;
            if *next == deps.len() {
                state.insert(name, 2);
                path.pop();
                continue;
            }
            let dep = deps[*next].as_str();
            *next += 1;
            if !by_name.contains_key(dep) {
                continue; // the pool's, or missing (linking says which)
            }
            match state.get(dep) {
                Some(1) => {
                    let mut cycle: Vec<&str> = path.iter().map(|(n, _)| *n).collect();
                    cycle.push(dep);
                    let from = cycle.iter().position(|n| *n == dep).unwrap_or(0);
                    let shown: Vec<String> = cycle[from..]
                        .iter()
                        .map(|n| crate::exit::printable(n).into_owned())
                        .collect();
                    return Err(format!("imports in a cycle: {}", shown.join(" \u{2192} ")));
                }
                Some(_) => {}
                None => {
                    state.insert(dep, 1);
                    path.push((dep, 0));
                }
            }
        }
    }
    fn map_entries<'a>(
        messages: &'a [prost_types::DescriptorProto],
        scope: &str,
        out: &mut Vec<(String, &'a prost_types::DescriptorProto)>,
    ) {
        for message in messages {
            let name = format!("{scope}.{}", message.name());
            if message.options.as_ref().is_some_and(|o| o.map_entry()) {
                out.push((name.clone(), message));
            }
            map_entries(&message.nested_type, &name, out);
        }
    }
    for file in files {
        check_names(file)?;
    }
    let mut entries = Vec::new();
    for file in files {
        map_entries(&file.message_type, file.package(), &mut entries);
    }
    for (name, entry) in entries {
        let field = |number: i32| entry.field.iter().find(|f| f.number() == number);
        let key_ok = field(1).is_some_and(|key| {
            key.label() != Label::Repeated
                && !matches!(
                    key.r#type(),
                    Type::Message
                        | Type::Group
                        | Type::Enum
                        | Type::Float
                        | Type::Double
                        | Type::Bytes
                )
                && !(key.type_name.is_some() && key.r#type.is_none())
        });
        let value_ok = field(2).is_some_and(|value| value.label() != Label::Repeated);
        if entry.field.len() != 2 || !key_ok || !value_ok {
            return Err(format!(
                "{} is a map entry (option map_entry) without a `key = 1` of a key type and \
                 a `value = 2`",
                crate::exit::printable(name.trim_start_matches('.'))
            ));
        }
    }
    Ok(())
}

/// Whether `name` is a protobuf identifier (`[A-Za-z_][A-Za-z0-9_]*`).
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The names of `file` are identifiers (its package dotted ones; its file name and
/// fields' `json_name`s free of control characters), as protoc makes them: prost-reflect
/// does not check, and a server's name with a newline in it printed a line of the
/// server's choosing in `describe`'s output (from a review).
fn check_names(file: &FileDescriptorProto) -> Result<(), String> {
    let bad = |what: &str, name: &str| {
        Err(format!(
            "{} holds {what} {:?}, which is not a protobuf name",
            crate::exit::printable(file.name()),
            crate::exit::printable(name)
        ))
    };
    if file.name().chars().any(char::is_control) {
        return bad("a file name", file.name());
    }
    if !file.package().is_empty() && !file.package().split('.').all(is_identifier) {
        return bad("the package", file.package());
    }
    fn fields(
        fields: &[prost_types::FieldDescriptorProto],
    ) -> impl Iterator<Item = (&'static str, &str)> {
        fields.iter().flat_map(|f| {
            std::iter::once(("a field", f.name()))
                .chain(f.json_name.as_deref().map(|j| ("a json_name", j)))
        })
    }
    fn enums<'a>(
        enums: &'a [prost_types::EnumDescriptorProto],
        out: &mut Vec<(&'static str, &'a str)>,
    ) {
        for e in enums {
            out.push(("an enum", e.name()));
            out.extend(e.value.iter().map(|v| ("an enum value", v.name())));
            out.extend(
                e.reserved_name
                    .iter()
                    .map(|n| ("a reserved name", n.as_str())),
            );
        }
    }
    fn messages<'a>(
        list: &'a [prost_types::DescriptorProto],
        out: &mut Vec<(&'static str, &'a str)>,
    ) {
        for m in list {
            out.push(("a message", m.name()));
            out.extend(fields(&m.field));
            out.extend(fields(&m.extension));
            out.extend(m.oneof_decl.iter().map(|o| ("a oneof", o.name())));
            out.extend(
                m.reserved_name
                    .iter()
                    .map(|n| ("a reserved name", n.as_str())),
            );
            enums(&m.enum_type, out);
            messages(&m.nested_type, out);
        }
    }
    let mut names = Vec::new();
    messages(&file.message_type, &mut names);
    enums(&file.enum_type, &mut names);
    names.extend(fields(&file.extension));
    for service in &file.service {
        names.push(("a service", service.name()));
        names.extend(service.method.iter().map(|m| ("a method", m.name())));
    }
    for (what, name) in names {
        let ok = if what == "a json_name" {
            !name.chars().any(char::is_control) && !name.contains('"')
        } else {
            is_identifier(name)
        };
        if !ok {
            return bad(what, name);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{
        DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
        MethodDescriptorProto, ServiceDescriptorProto,
    };

    fn file(name: &str, imports: &[&str]) -> FileDescriptorProto {
        FileDescriptorProto {
            name: Some(name.into()),
            dependency: imports.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// The lookups' time is one budget for the command: each batch (a response's
    /// `Any` types, looked up on a stream of its own) gets what the batches before it
    /// left, not a fresh twice `--timeout` (from a review: a server naming a new type
    /// in every response of a stream kept the CLI looking up for ever). The time
    /// between batches is not charged.
    #[test]
    fn the_lookups_of_a_command_share_one_time_budget() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        let mut budget = Budget::new(s(1));
        let t0 = Instant::now();
        assert_eq!(budget.until(), None);
        budget.begin(t0);
        assert_eq!(budget.until(), Some(t0 + s(2)));
        // A later request of the same batch does not move its end.
        budget.begin(t0 + ms(500));
        assert_eq!(budget.until(), Some(t0 + s(2)));
        budget.end(t0 + ms(1500));
        assert_eq!(budget.until(), None);
        // A minute later, the next response's batch: what is left, half a second.
        let t1 = t0 + s(60);
        budget.begin(t1);
        assert_eq!(budget.until(), Some(t1 + ms(500)));
        budget.end(t1 + s(3));
        // All spent: a later batch ends as it begins (its stream is refused).
        budget.begin(t1 + s(4));
        assert_eq!(budget.until(), Some(t1 + s(4)));
    }

    #[test]
    fn imports_in_a_cycle_are_refused_before_linking() {
        let err = check_links(&[file("a.proto", &["a.proto"])]).unwrap_err();
        assert!(err.contains("a.proto \u{2192} a.proto"), "{err}");
        let err = check_links(&[
            file("a.proto", &["b.proto"]),
            file("b.proto", &["c.proto", "google/protobuf/empty.proto"]),
            file("c.proto", &["a.proto"]),
        ])
        .unwrap_err();
        assert!(err.contains("cycle"), "{err}");
        // A diamond is no cycle.
        check_links(&[
            file("a.proto", &["b.proto", "c.proto"]),
            file("b.proto", &["d.proto"]),
            file("c.proto", &["d.proto"]),
            file("d.proto", &[]),
        ])
        .unwrap();
    }

    #[test]
    fn names_that_are_not_protobuf_names_are_refused() {
        let named = |message: &str, json: Option<&str>| {
            let mut f = file("n.proto", &[]);
            f.package = Some("p.q".into());
            f.message_type = vec![DescriptorProto {
                name: Some(message.into()),
                field: vec![FieldDescriptorProto {
                    name: Some("f".into()),
                    number: Some(1),
                    json_name: json.map(str::to_owned),
                    ..Default::default()
                }],
                ..Default::default()
            }];
            check_links(&[f])
        };
        named("Good_1", Some("jsonName")).unwrap();
        for (message, json) in [
            ("Bad\nservice Evil {}", None),
            ("1st", None),
            ("", None),
            ("Good", Some("x\n// injected")),
            ("Good", Some("a\"b")),
        ] {
            let err = named(message, json).unwrap_err();
            assert!(err.contains("not a protobuf name"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let mut f = file("n.proto", &[]);
        f.package = Some("p..q".into());
        assert!(check_links(&[f]).is_err());
    }

    #[test]
    fn map_entries_of_another_shape_are_refused() {
        use prost_types::{field_descriptor_proto::Type, MessageOptions};
        let field = |name: &str, number: i32, ty: Type| FieldDescriptorProto {
            name: Some(name.into()),
            number: Some(number),
            r#type: Some(ty as i32),
            ..Default::default()
        };
        let with_entry = |fields: Vec<FieldDescriptorProto>| {
            let entry = DescriptorProto {
                name: Some("MEntry".into()),
                field: fields,
                options: Some(MessageOptions {
                    map_entry: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let mut f = file("m.proto", &[]);
            f.package = Some("p".into());
            f.message_type = vec![DescriptorProto {
                name: Some("M".into()),
                nested_type: vec![entry],
                ..Default::default()
            }];
            check_links(&[f])
        };
        let key = || field("key", 1, Type::String);
        let value = || field("value", 2, Type::Int32);
        with_entry(vec![key(), value()]).unwrap();
        for bad in [
            vec![],
            vec![key()],
            vec![value()],
            vec![field("key", 1, Type::Double), value()],
            vec![field("key", 1, Type::Bytes), value()],
            vec![key(), value(), field("extra", 3, Type::Int32)],
        ] {
            let err = with_entry(bad).unwrap_err();
            assert!(err.contains("p.M.MEntry"), "{err}");
        }
    }

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
        // Types: 3 messages, 3 enums, 1 service. Elements: 1 + 2×2 fields, 2
        // extensions, 3×3 values, 4 methods, and the 7 types themselves (each an
        // element of a repeated field).
        let encoded = file.encode_to_vec();
        assert_eq!(definitions(&encoded), Some((7, 27)));
        assert_eq!(file_name(&encoded), Some("a.proto"));
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
        // A --protoset file is counted the same way: a few MB of empty fields (two
        // bytes each, 200 decoded) are refused before decoding.
        let set = prost_types::FileDescriptorSet {
            file: vec![file.clone()],
        };
        assert_eq!(check_descriptor_set(&set.encode_to_vec()), Ok(()));
        let mut wide = Vec::new();
        for _ in 0..MAX_ELEMENTS + 1 {
            wide.extend([0x12, 0x00]); // DescriptorProto.field: an empty one
        }
        let mut message = vec![0x22];
        prost::encoding::encode_varint(wide.len() as u64, &mut message);
        message.extend(wide);
        let mut set = vec![0x0a];
        prost::encoding::encode_varint(message.len() as u64, &mut set);
        set.extend(message);
        let refused = check_descriptor_set(&set).unwrap_err();
        assert!(refused.contains("repeated elements"), "{refused}");
        assert!(check_descriptor_set(&[0x0a, 0x05]).is_err(), "truncated");
    }

    /// Cheap elements that decode large are counted too: uninterpreted options, source
    /// locations, reserved names, dependencies; and a response's entries are counted
    /// before it is decoded.
    #[test]
    fn every_repeated_element_and_every_entry_is_counted() {
        use prost_types::{
            source_code_info::Location, MessageOptions, SourceCodeInfo, UninterpretedOption,
        };
        let file = FileDescriptorProto {
            dependency: vec![String::new(); 5],
            message_type: vec![DescriptorProto {
                options: Some(MessageOptions {
                    uninterpreted_option: vec![UninterpretedOption::default(); 7],
                    ..Default::default()
                }),
                reserved_name: vec![String::new(); 3],
                ..Default::default()
            }],
            source_code_info: Some(SourceCodeInfo {
                location: vec![Location::default(); 11],
            }),
            ..Default::default()
        };
        // 5 + 1 message + 7 + 3 + 11.
        assert_eq!(definitions(&file.encode_to_vec()), Some((1, 27)));

        let response = ServerReflectionResponse {
            message_response: Some(MessageResponse::FileDescriptorResponse(
                rpc_services::reflection::v1::FileDescriptorResponse {
                    file_descriptor_proto: vec![Bytes::new(); 12_345],
                },
            )),
            ..Default::default()
        };
        assert_eq!(
            response_entries(&response.encode_to_vec()),
            Some((12_345, 0))
        );
        let list = ServerReflectionResponse {
            message_response: Some(MessageResponse::ListServicesResponse(
                rpc_services::reflection::v1::ListServiceResponse {
                    service: vec![Default::default(); 3],
                },
            )),
            ..Default::default()
        };
        assert_eq!(response_entries(&list.encode_to_vec()), Some((0, 3)));
        assert_eq!(response_entries(&[0x22, 0x09, 0x0a]), None, "truncated");
    }
}
